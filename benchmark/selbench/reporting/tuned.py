"""How an experiment's methods were tuned, for the leaderboard: :func:`tuning_summary` reads
the experiment's ``tuning`` block and its cells' tuning records (which methods were tuned,
the parameters each seed chose and their spread over the seeds, which rows are oracles),
:func:`tuning_line` says it in Markdown: one paragraph (what the trials were fitted and
scored on: the fitting split's rows only, the source domain, unless a row is an oracle)
and a table of each tuned method's chosen parameters per seed with their median and range.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from selbench.measure.metrics import metric_info
from selbench.reporting.loading import ResultSet

__all__ = ["chosen_spread", "tuning_entry", "tuning_line", "tuning_summary"]

_SAMPLERS = {"tpe": "TPE", "random": "random search"}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def chosen_spread(per_seed: dict[str, Any], log: bool = False) -> dict[str, Any]:
    """The spread over seeds of one parameter's chosen values (seed -> value): ``median``,
    ``min``, ``max`` (and, ``log`` for a log-uniform space, ``ratio`` max/min) of numbers,
    else the ``counts`` of each value (its JSON form)."""
    values = list(per_seed.values())
    if values and all(_number(v) for v in values):
        lo, hi = min(values), max(values)
        out = {"median": statistics.median(values), "min": lo, "max": hi}
        if log and lo > 0:
            out["ratio"] = hi / lo
        return out
    counts: dict[str, int] = {}
    for v in values:
        key = json.dumps(v, sort_keys=True)
        counts[key] = counts.get(key, 0) + 1
    return {"counts": counts}


def tuning_summary(results: ResultSet, exp: dict[str, Any]) -> dict[str, Any] | None:
    """The experiment's ``tuning`` block with ``tuned`` (method -> its cells' chosen
    parameters, by seed), ``chosen`` (method -> parameter -> its values by seed and their
    spread, :func:`chosen_spread`), ``oracle`` (the methods tuned on evaluation labels),
    ``untuned`` (methods fitted at their parameters: no search space), and the splits and
    β the trials saw; None for an untuned experiment."""
    block = exp.get("tuning")
    if not block:
        return None
    tuned: dict[str, dict[str, Any]] = {}
    oracle: set[str] = set()
    log: set[tuple[str, str]] = set()  # (method, parameter) tuned over a log-uniform space
    deferred = dropped = 0  # trials a pruned TPE study deferred to its last batch; dropped
    for rec in results.cells:
        if rec["experiment"] == exp["name"] and rec.get("tuning"):
            tuned.setdefault(rec["method"], {})[str(rec["seed"])] = rec["tuning"]["chosen"]
            history = rec["tuning"].get("history", [])
            deferred += sum("deferred_at" in h for h in history)
            dropped += sum("deferred_at" in h and h.get("value") is None for h in history)
            log.update((rec["method"], p) for p, space in rec["tuning"].get("space", {}).items()
                       if "log_uniform" in space)
            if rec["tuning"].get("oracle"):
                oracle.add(rec["method"])
    labels = [m["label"] for m in exp["methods"]]
    chosen = {}
    for m in labels:
        by_seed = {seed: tuned[m][seed] for seed in sorted(tuned.get(m, {}), key=int)}
        params = sorted({p for c in by_seed.values() for p in c})
        chosen[m] = {p: {"per_seed": {s: c[p] for s, c in by_seed.items() if p in c}}
                     for p in params}
        for p, entry in chosen[m].items():
            entry.update(chosen_spread(entry["per_seed"], (m, p) in log))
    return {**block, "tuned": {m: tuned[m] for m in labels if m in tuned},
            "chosen": {m: chosen[m] for m in labels if m in tuned},
            "oracle": [m for m in labels if m in oracle],
            "untuned": [m for m in labels if m not in tuned],
            "fit_split": exp.get("fit_split"), "eval_split": exp.get("eval_split"),
            "betas": exp.get("betas"),
            **({"deferred": deferred, "dropped": dropped} if deferred else {})}


def tuning_entry(results: ResultSet, exp: dict[str, Any]) -> dict[str, Any]:
    """``{"tuning": summary}`` for a tuned experiment's table, else ``{}`` (untuned tables
    are as they were)."""
    summary = tuning_summary(results, exp)
    return {"tuning": summary} if summary else {}


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v) if _number(v) else json.dumps(v)


def _scored(summary: dict[str, Any], train_beta: Any) -> str:
    """How a trial is fitted and scored: ``each fitted on 70 % of ... on the other 30 %``."""
    label = metric_info(summary["objective"]).label
    if summary.get("over") == "betas":
        betas = summary.get("betas") or []
        what = (f"the AUC of {label} over β ∈ [{min(betas):g}, {max(betas):g}]" if betas
                else f"the AUC of {label} over the experiment's β")
    else:
        beta = "each β" if train_beta == "per_beta" else f"β = {float(train_beta):g}"
        what = f"{label} at {beta}"
    folds = summary.get("folds", 1)
    pruner = summary.get("pruner")
    if pruner:  # one held-out part (the spec refuses folds with a pruner)
        held = round(100 * summary.get("inner", 0.3))
        first = pruner["min_epochs"] * pruner["reduction_factor"] ** pruner.get(
            "min_early_stopping_rate", 0)
        return (f"each fitted on {100 - held} % of the fitting rows and scored by {what} on "
                f"the other {held} %, the losing trials stopped early by successive halving "
                f"(Optuna's rule, each batch's trials together: judged at epoch {first}, then at "
                f"{pruner['reduction_factor']}× as many epochs each time, 1 in "
                f"{pruner['reduction_factor']} going on"
                + (f"; {summary['deferred']} trials (over its methods and seeds) kept at "
                   "the first judgement of a batch before the last were deferred to the "
                   f"study's last batch, {summary.get('dropped', 0)} of them stopped there "
                   "when judged again beside its trials" if summary.get("deferred") else "")
                + ")")
    if folds > 1:
        return (f"each fitted on {folds - 1} of {folds} folds of the fitting rows (seeded, "
                f"stratified by the backbone's correctness) and scored by {what} on the "
                f"held-out fold, the mean over the {folds} folds its score")
    held = round(100 * summary.get("inner", 0.3))
    return (f"each fitted on {100 - held} % of the fitting rows and scored by {what} on the "
            f"other {held} %")


def _chosen_table(summary: dict[str, Any]) -> list[str]:
    """The Markdown table of each tuned method's chosen parameters: per seed, then the median
    and range over the seeds (and max/min for a log-uniform space), or the counts of each
    choice."""
    rows = []
    for method, params in summary.get("chosen", {}).items():
        for path, entry in params.items():
            seeds = entry["per_seed"]
            per_seed = ", ".join(f"{_value(v)}" for v in seeds.values())
            if "median" in entry:
                spread = (f"{_value(entry['median'])} [{_value(entry['min'])}, "
                          f"{_value(entry['max'])}]")
                if "ratio" in entry:
                    spread += f" (×{entry['ratio']:.3g})"
            else:
                spread = ", ".join(f"{k} ({n} of {len(seeds)})"
                                   for k, n in entry["counts"].items())
            rows.append(f"| {method} | `{path}` | {per_seed} | {spread} |")
    if not rows:
        return []
    seeds = sorted({s for params in summary["chosen"].values() for e in params.values()
                    for s in e["per_seed"]}, key=int)
    return ["", f"| Tuned method | Parameter | Chosen (seeds {', '.join(seeds)}) | "
                "Median [min, max] over seeds |", "| --- | --- | --- | --- |", *rows]


def tuning_line(summary: dict[str, Any], train_beta: Any) -> str:
    """``Tuned: 20 trials of TPE per method and seed, ...``: the paragraph saying how the
    methods were tuned and on which rows, then the table of the parameters they chose."""
    fit = f" `{summary['fit_split']}`" if summary.get("fit_split") else ""
    line = (f"Tuned: {summary['trials']} trials of {_SAMPLERS.get(summary['sampler'])} per "
            f"method and seed, {_scored(summary, train_beta)}; the best refitted on all of "
            f"them. Tuning sees the rows of the fitting split{fit} only (the source domain: "
            "the evaluation labels are never read)")
    oracle = summary.get("oracle") or []
    if oracle:
        held = round(100 * summary.get("inner", 0.3))
        line += (f", except the oracle rows ({', '.join(oracle)}): each trial fitted on all "
                 f"fitting rows and scored on {held} % of the seed's evaluation rows with their "
                 "labels, rows then left out of its evaluation — an upper bound no deployed "
                 "method can reach, not a result")
    if summary["untuned"]:
        line += ("; at their parameters (no search space): "
                 + ", ".join(summary["untuned"]))
    return "\n".join([line + ".", *_chosen_table(summary)])
