"""``selbench rank DIR...``: rank the methods over every experiment of any set of results
folders, without writing a leaderboard.

The folders are loaded as ``selbench leaderboard DIR... --allow-mixed`` loads them
(:func:`selbench.reporting.loading.load_results`: folders of different specs combine, a
same-named experiment or same-labelled method whose configuration differs is kept apart
under a suffixed name, with a warning), their tables are built by
:func:`selbench.reporting.leaderboard.tables_from`, and the summary across experiments is
:func:`selbench.reporting.ranking.summarize`'s: average ranks, the Friedman test, Nemenyi's
critical difference and win rates, for every metric with a direction that every experiment
shows (or the ``metrics`` asked for). It is the "Across experiments" section a combined
leaderboard would show, and the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from selbench.reporting import ranking
from selbench.reporting.leaderboard import tables_from
from selbench.reporting.loading import load_results
from selbench.util.files import atomic_write_json, atomic_write_text

__all__ = ["RankingInputError", "rank_folders", "render_ranking", "write_ranking"]


class RankingInputError(ValueError):
    """The folders or metrics given cannot be ranked (bad input: exit 2)."""


def rank_folders(results_dirs: Sequence[str | Path], *, allow_partial: bool = False,
                 metrics: Sequence[str] | None = None) -> dict[str, Any]:
    """The summary across every experiment of ``results_dirs`` (JSON-ready, as a
    leaderboard's ``summary``), restricted to ``metrics`` when given."""
    dirs = [Path(d) for d in results_dirs]
    tables = tables_from(load_results(dirs, allow_partial=allow_partial, allow_mixed=True))
    names = [e["name"] for e in tables["experiments"]]
    if len(names) < 2:
        raise RankingInputError(
            f"{', '.join(map(str, dirs))}: {len(names)} experiment ({', '.join(names)}); "
            "ranking needs two or more experiments")
    summary = tables["summary"]
    if metrics:
        ranked = list(summary["metrics"])
        unknown = [k for k in metrics if k not in ranked]
        if unknown:
            raise RankingInputError(
                f"--metric {', '.join(unknown)}: not ranked over these experiments; ranked "
                f"metrics (a direction, shown in every experiment): {', '.join(ranked)}")
        summary = {**summary, "metrics": {k: summary["metrics"][k] for k in metrics}}
    return summary


def render_ranking(summary: dict[str, Any]) -> str:
    """The summary as Markdown: the "Across experiments" section of a leaderboard."""
    return "\n".join(ranking.markdown_section(summary)).rstrip() + "\n"


def write_ranking(summary: dict[str, Any], out: str | Path) -> list[Path]:
    """Write ``ranking.md`` and ``ranking.json`` into ``out`` (atomically)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "ranking.md", out / "ranking.json"]
    atomic_write_text(paths[0], render_ranking(summary))
    atomic_write_json(paths[1], summary)
    return paths
