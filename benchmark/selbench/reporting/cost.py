"""Cost on the board: what fitting each method costs, beside what it achieves.

Every cell records the seconds its fit took (``timing.fit_s`` of the cell record: the
fitting time of the cells fitted together as replicas, divided by their number) and, for a
tuned cell, the seconds of its tuning trials (``tuning.tune_s``); each leaderboard row
carries their means over the method's cells (``timing.fit_s_mean``, ``timing.tune_s_mean``
in ``leaderboard.json``). The cost of a cell here is the two together: what it took to
arrive at the fitted method. A spec that sets ``cost: true`` also gets

* a **"Cost" section** in the Markdown (:func:`markdown`): the mean fit seconds per cell of
  each method in each experiment (tuning included), and the mean over the experiments;
* **CSV rows** with ``metric = fit_seconds``, ``point = cell`` (:func:`csv_rows`): the mean
  over the method's cells in ``mean``, their number in ``n_seeds``;
* a **cost-versus-quality figure** ``plots/summary/cost-quality.png``
  (:func:`figure_args`, drawn by :func:`selbench.reporting.figures.cost_quality_figure`): x
  the fit seconds per cell on a log scale, y the first ranked metric of the first
  experiment's table (what each table reports: the AUC over β, or the area under a per-β
  table's levels), one small point per method and experiment and one large point per method
  at its mean over the experiments, as CalArena reports runtime beside its rankings.

Timings depend on the machine and its load: a spec asking for them gives up the rule that
the Markdown holds no timings (a rerun on another machine renders other seconds); specs
without ``cost`` render as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from selbench.measure.metrics import metric_info
from selbench.reporting.ranking import experiment_values

__all__ = ["cost_asked", "csv_rows", "figure_args", "markdown"]


def cost_asked(tables: Mapping[str, Any]) -> bool:
    """Whether the leaderboard's spec (any of the combined specs) sets ``cost: true``."""
    spec = tables.get("spec")
    specs = spec if isinstance(spec, list) else [spec]
    return any(isinstance(s, Mapping) and s.get("cost") for s in specs)


def _fit_s(row: Mapping[str, Any]) -> float | None:
    """A row's mean seconds per cell: its fit, plus its tuning trials where it was tuned."""
    timing = row.get("timing") or {}
    value = timing.get("fit_s_mean")
    if value is None or not math.isfinite(value):
        return None
    return float(value) + float(timing.get("tune_s_mean") or 0.0)


def _seconds(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def markdown(tables: Mapping[str, Any]) -> list[str]:
    """The "Cost" section (nothing unless the spec asks with ``cost: true``)."""
    if not cost_asked(tables):
        return []
    from tabulate import tabulate

    exps = tables["experiments"]
    methods = list(dict.fromkeys(r["method"] for e in exps for r in e["rows"]))
    per = {(e["name"], r["method"]): _fit_s(r) for e in exps for r in e["rows"]}
    body = []
    for m in methods:
        vals = [per.get((e["name"], m)) for e in exps]
        known = [v for v in vals if v is not None]
        line = [m.replace("|", "\\|")] + [_seconds(v) for v in vals]
        if len(exps) > 1:
            line.append(_seconds(sum(known) / len(known)) if known else "–")
        body.append(line)
    headers = (["Method"] + [e["name"].replace("|", "\\|") for e in exps]
               + (["Mean"] if len(exps) > 1 else []))
    return ["## Cost", "",
            ("Mean seconds per cell (one method, one seed) to fit it, its tuning trials "
             "included where the experiment tunes, as the cells recorded them on the machine "
             "that ran them (they depend on its load; replicas fitted together share their "
             "time). Figure: plots/summary/cost-quality."), "",
            tabulate(body, headers, tablefmt="github", disable_numparse=True), ""]


def csv_rows(tables: Mapping[str, Any]) -> list[list[Any]]:
    """The CSV rows of the seconds per cell (none unless the spec asks), in the CSV's
    columns: experiment, method, ``fit_seconds``, ``cell``, the mean (fit plus tuning), then
    the number of cells in ``n_seeds``; the other columns empty."""
    if not cost_asked(tables):
        return []
    rows = []
    for e in tables["experiments"]:
        for r in e["rows"]:
            v = _fit_s(r)
            if v is not None:
                rows.append([e["name"], r["method"], "fit_seconds", "cell", repr(v), "", "", "",
                             (r.get("timing") or {}).get("cells", ""), "", "", "", "", "", ""])
    return rows


def _quality_key(exps: Sequence[Mapping[str, Any]]) -> str | None:
    for key in exps[0]["metrics"] if exps else ():
        if metric_info(key).marked:
            return key
    return None


def figure_args(tables: Mapping[str, Any]) -> tuple | None:
    """What :func:`selbench.reporting.figures.cost_quality_figure` draws, or None (not
    asked, or no ranked metric): ``(points, x_label, y_label, title)``, ``points`` one
    ``(method, [(seconds, value) per experiment], (mean seconds, mean value))`` per method
    with a value and a time in at least one experiment."""
    exps = tables["experiments"]
    key = _quality_key(exps) if cost_asked(tables) else None
    if key is None:
        return None
    info = metric_info(key)
    points = []
    for m in dict.fromkeys(r["method"] for e in exps for r in e["rows"]):
        pts = []
        for e in exps:
            row = next((r for r in e["rows"] if r["method"] == m), None)
            per_seed = experiment_values(e, key).get(m) if key in e["metrics"] else None
            vals = [v for v in (per_seed or {}).values() if math.isfinite(v)]
            if row is not None and _fit_s(row) is not None and vals:
                pts.append((_fit_s(row), sum(vals) / len(vals)))
        if pts:
            mean = (sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts))
            points.append((m, pts, mean))
    if not points:
        return None
    arrow = "lower is better" if info.lower_is_better else "higher is better"
    title = (f"Cost and quality over {len(exps)} experiment(s): small points per experiment, "
             "large at the mean")
    return points, "seconds per cell: fit, and tuning where tuned (log scale)", f"{info.label} ({arrow})", title
