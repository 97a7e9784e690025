"""How an experiment's methods were tuned, for the leaderboard: :func:`tuning_summary` reads
the experiment's ``tuning`` block and its cells' tuning records (which methods were tuned,
the parameters each seed chose), :func:`tuning_line` says it in one Markdown line.
"""

from __future__ import annotations

from typing import Any

from selbench.measure.metrics import metric_info
from selbench.reporting.loading import ResultSet

__all__ = ["tuning_entry", "tuning_line", "tuning_summary"]

_SAMPLERS = {"tpe": "TPE", "random": "random search"}


def tuning_summary(results: ResultSet, exp: dict[str, Any]) -> dict[str, Any] | None:
    """The experiment's ``tuning`` block with ``tuned`` (method -> its cells' chosen
    parameters, by seed) and ``untuned`` (methods fitted at their parameters: no search
    space), or None for an untuned experiment."""
    block = exp.get("tuning")
    if not block:
        return None
    tuned: dict[str, dict[str, Any]] = {}
    for rec in results.cells:
        if rec["experiment"] == exp["name"] and rec.get("tuning"):
            tuned.setdefault(rec["method"], {})[str(rec["seed"])] = rec["tuning"]["chosen"]
    labels = [m["label"] for m in exp["methods"]]
    return {**block, "tuned": {m: tuned[m] for m in labels if m in tuned},
            "untuned": [m for m in labels if m not in tuned]}


def tuning_entry(results: ResultSet, exp: dict[str, Any]) -> dict[str, Any]:
    """``{"tuning": summary}`` for a tuned experiment's table, else ``{}`` (untuned tables
    are as they were)."""
    summary = tuning_summary(results, exp)
    return {"tuning": summary} if summary else {}


def tuning_line(summary: dict[str, Any], train_beta: Any) -> str:
    """``Tuned: 20 trials of TPE per method and seed on ECE₁ at β = 0.5 ...``: one line."""
    beta = "each β" if train_beta == "per_beta" else f"β = {float(train_beta):g}"
    held = round(100 * summary["inner"])
    line = (f"Tuned: {summary['trials']} trials of {_SAMPLERS.get(summary['sampler'])} per "
            f"method and seed, each fitted on {100 - held} % of the fitting rows and scored by "
            f"{metric_info(summary['objective']).label} at {beta} on the other {held} %; the best "
            "refitted on all of them (the evaluation labels are never read)")
    if summary["untuned"]:
        line += ("; at their parameters (no search space): "
                 + ", ".join(summary["untuned"]))
    return line + "."
