"""The failed methods of a leaderboard: a run that could not finish some methods (a plugin
failed for one of them) still writes the leaderboard of the others, and lists each failed
method under its experiment's ``failed`` in the JSON (``{"method", "seeds", "error"}``,
never in ``rows``, so it is not ranked or marked best). This module renders them: a row of
"failed" in each Markdown table with the reason under the tables, and CSV rows with empty
numbers and the reason in the last column, ``error``, which the CSV has only then.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["failed_body", "failed_csv_rows", "failed_lines", "failed_note"]


def failed_note(tables: dict) -> list[str]:
    """The Markdown preamble's note when methods failed (nothing otherwise)."""
    n = sum(len(e.get("failed", ())) for e in tables["experiments"])
    if not n:
        return []
    return [(f"**Failed**: {n} method(s) could not be computed and are marked failed below, "
             "with the reason; the other methods' numbers are complete. Rerunning "
             "`selbench run` retries the failed ones."), ""]


def failed_body(exp: dict, width: int, md: Callable[[str], str]) -> list[list[str]]:
    """The Markdown table rows of the experiment's failed methods: "failed" in each of the
    ``width`` columns after the label (``md`` escapes the label)."""
    return [[md(f["method"])] + ["failed"] * width for f in exp.get("failed", ())]


def failed_lines(exp: dict, md: Callable[[str], str]) -> list[str]:
    """Under an experiment's tables: each failed method, its seeds and why it failed."""
    lines = []
    for f in exp.get("failed", ()):
        seeds = ", ".join(str(s) for s in f["seeds"])
        lines += [f"**{md(f['method'])} failed** (seeds {seeds}): {md(f['error'])}", ""]
    return lines


def failed_csv_rows(exp: dict, metrics: Sequence[str]) -> list[list[Any]]:
    """The CSV rows of the experiment's failed methods, one per metric and point (``auc``,
    or each β), as :func:`selbench.reporting.leaderboard.render_csv` lays them out: empty
    numbers, 0 seeds, not best, and the reason in the ``error`` column."""
    points = ["auc"] if exp["report"] == "auc" else [f"{float(b):g}" for b in exp["betas"]]
    return [[exp["name"], f["method"], key, point, "", "", "", "", 0, "", 0, 0, "", "", "",
             f["error"]]
            for f in exp.get("failed", ()) for key in metrics for point in points]
