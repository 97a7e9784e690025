"""What :func:`selbench.run` returns, readable from Python: :class:`RunReport` (alias
:data:`RunResults`: the counts of computed and reused cells, why cells were recomputed, the
files written, and the results themselves as typed cell records or a pandas frame) and
:class:`Leaderboard` (the aggregated tables of a results directory, as Markdown, CSV or a
pandas frame). pandas is an optional dependency, imported only by ``to_frame()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selbench.store.results import CellRecord, ResultsDir, ResultsError

__all__ = ["Leaderboard", "RunReport", "RunResults"]


@dataclass
class RunReport:
    """What :func:`~selbench.execution.runner.run` did, and the results it produced, readable
    from Python.

    ``computed``/``reused`` count cells, ``reasons`` says why finished cells were recomputed,
    ``files`` lists the leaderboard and figure files written. The results themselves:
    :meth:`cells` (the typed cell records), :meth:`leaderboard` (the aggregated tables, as
    ``selbench leaderboard`` renders them) and :meth:`to_frame` (one row per cell × β ×
    metric, as a pandas DataFrame).
    """

    out_dir: Path
    computed: int = 0
    reused: int = 0
    files: list[Path] = field(default_factory=list)
    #: why finished cells were recomputed: reason -> number of cells
    reasons: dict[str, int] = field(default_factory=dict)
    #: (experiment name, why) of the optional experiments left out of this run
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def cells(self) -> list[CellRecord]:
        """The verified cell records of this run, in the spec's order."""
        store = ResultsDir(self.out_dir)
        run_record = store.read_run()
        out = []
        for rel, key in zip(run_record.cells, run_record.cell_keys):
            check = store.check_cell(store.resolve(rel), key)
            if check.record is None:
                raise ResultsError(f"{store.resolve(rel)}: {check.problem}")
            out.append(check.record)
        return out

    def leaderboard(self) -> Leaderboard:
        """The leaderboard of this run (tables with statistics over seeds)."""
        from selbench.reporting.leaderboard import build_tables

        return Leaderboard(build_tables(self.out_dir))

    def to_frame(self):
        """Every cell's metrics as a long pandas DataFrame: columns ``experiment``,
        ``method``, ``seed``, ``train_beta``, ``beta``, ``metric``, ``value`` (pandas is an
        optional dependency: ``pip install 'selbench[pandas]'``)."""
        pd = _pandas()
        rows = [
            (c.experiment, c.method, c.seed, c.train_beta, beta, metric, values[b_i])
            for c in self.cells()
            for metric, values in c.metrics.items()
            for b_i, beta in enumerate(c.betas)
        ]
        return pd.DataFrame(rows, columns=["experiment", "method", "seed", "train_beta", "beta",
                                           "metric", "value"])


#: the name the Python API documents for what :func:`run` returns
RunResults = RunReport


@dataclass(frozen=True)
class Leaderboard:
    """Aggregated tables of a results directory (see :mod:`selbench.reporting.leaderboard`)."""

    tables: dict[str, Any]

    def markdown(self) -> str:
        from selbench.reporting.leaderboard import render_markdown

        return render_markdown(self.tables)

    def csv(self) -> str:
        from selbench.reporting.leaderboard import render_csv

        return render_csv(self.tables)

    def to_frame(self):
        """One row per experiment × method × metric × point (a β, or ``auc``): mean, std,
        95% interval, seeds, p-value against the best, best marks (pandas required)."""
        import io

        # a method may be labelled "None" or "NA": only empty cells are missing values
        return _pandas().read_csv(io.StringIO(self.csv()), keep_default_na=False,
                                  na_values=[""])

    def __str__(self) -> str:
        return self.markdown()


def _pandas():
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("to_frame() needs pandas: pip install 'selbench[pandas]'") from None
    return pd
