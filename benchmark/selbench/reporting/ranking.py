"""Rankings across experiments: which method is best over several experiments, and how sure.

A leaderboard with two or more experiments (one spec with several, or ``selbench
leaderboard DIR1 DIR2 ...``) gets a summary across them, built here from the experiments'
tables (:func:`selbench.reporting.leaderboard.tables_from`) and nothing else. Every metric
the registry (:data:`selbench.measure.metrics.METRICS`) marks with a direction and that
every experiment's table shows is summarised; each experiment enters by the value its table
reports: the AUC over β of a ``report: auc`` table, and for a per-β table the area under
its reported β levels (:func:`selbench.measure.metrics.auc`; its value when it has a single
β). Only methods with a value in every experiment are ranked; the others are listed as left
out.

For each metric (:func:`summarize_metric`):

* **ranks**: within each experiment, the methods ordered by their mean over seeds in the
  metric's direction, 1 = best, tied means (within :data:`selbench.measure.stats.ZERO_TOL`)
  sharing the average of their ranks (:func:`rank_within`); then each method's **average
  rank** over the experiments;
* the **Friedman test** that all methods have the same expected rank
  (:func:`scipy.stats.friedmanchisquare` on the ranks, χ² approximation with the tie
  correction; :func:`friedman`), defined from :data:`MIN_EXPERIMENTS` experiments and
  :data:`MIN_METHODS` methods on (below that, and when every method ties in every
  experiment, the summary says it is not defined instead of giving a number);
* the **Nemenyi post-hoc test** (Demšar 2006, ``scikit_posthocs.posthoc_nemenyi_friedman``;
  :func:`nemenyi`): a p-value for every pair of methods, and the **critical difference**
  ``CD = q_α / √2 · √(k (k + 1) / (6 N))`` (``q_α`` the studentized range quantile with
  infinite degrees of freedom): two methods differ significantly when their average ranks
  differ by more than CD. The leaderboard lists the pairs that differ only when the
  Friedman test rejects (the usual protocol); the JSON has every p-value;
* the **win-rate matrix** (:func:`win_rates`, as CalArena reports them): for methods A and
  B, the fraction of (experiment, seed) pairs on which A's value is better than B's (ties
  count ½), over the seeds every ranked method has in that experiment; with a percentile
  bootstrap interval (:data:`RESAMPLES` resamples, level :data:`LEVEL`, seeded with
  :data:`SEED`) that resamples the experiments, then the seeds within each drawn experiment;
  beside them each method's **Elo rating** (CalArena's: the Bradley–Terry fit of the same
  pairwise outcomes on the Elo scale, :mod:`selbench.measure.elo`), with a percentile
  interval from refitting on the first :data:`ELO_RESAMPLES` of those resamples.

The summary is a JSON-ready dict (``leaderboard.json``'s ``summary``); :func:`markdown_section`
renders the leaderboard's "Across experiments" section, and :func:`diagram` gives what a
critical-difference diagram (:func:`selbench.reporting.figures.critical_difference_figure`)
draws.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from selbench.measure import elo as E
from selbench.measure import stats as S
from selbench.measure.metrics import auc, metric_info

__all__ = [
    "ALPHA",
    "ELO_RESAMPLES",
    "LEVEL",
    "MAX_MATRIX_METHODS",
    "MIN_EXPERIMENTS",
    "MIN_METHODS",
    "RESAMPLES",
    "SEED",
    "critical_difference",
    "diagram",
    "experiment_values",
    "friedman",
    "groups_not_different",
    "markdown_section",
    "nemenyi",
    "rank_within",
    "summarize",
    "summarize_metric",
    "win_rates",
]

#: significance level of the Friedman and post-hoc tests
ALPHA = S.ALPHA
#: fewest experiments (blocks) for the Friedman test and the post-hoc test
MIN_EXPERIMENTS = 2
#: fewest ranked methods for the Friedman test (and so for the post-hoc test)
MIN_METHODS = 3
#: bootstrap resamples of the win rates, their interval's level, and the generator's seed
RESAMPLES = 1000
#: of those resamples, how many the Elo ratings are refitted on (each a Bradley-Terry fit;
#: CalArena refits on 100)
ELO_RESAMPLES = 100
LEVEL = 0.95
SEED = 0
#: the leaderboard shows the whole win-rate matrix up to this many methods, else its compact form
MAX_MATRIX_METHODS = 10

FRIEDMAN_NAME = ("Friedman test of equal expected ranks over experiments "
                 "(scipy.stats.friedmanchisquare, chi-square approximation, tie-corrected)")
POSTHOC_NAME = ("Nemenyi test (scikit_posthocs.posthoc_nemenyi_friedman); critical difference "
                "q_alpha / sqrt(2) * sqrt(k (k + 1) / (6 N)), Demsar 2006")
WIN_RATE_NAME = ("fraction of (experiment, seed) pairs on which the row method is better than "
                 "the column method (ties count 1/2); percentile bootstrap interval resampling "
                 "experiments, then seeds within each")
ELO_NAME = ("Bradley-Terry ratings on the Elo scale (1000 + 400 / ln 10 * strength) from the "
            "same pairwise outcomes (ties half a win each; selbench.measure.elo, as CalArena's "
            "compute_elo_scores), refitted on the first elo_resamples bootstrap resamples")


# --------------------------------------------------------------------------- values
def _per_beta_values(row_metric: dict, betas: Sequence[float], ranking: bool) -> dict[int, float]:
    """seed -> the area under a per-β table's values (its seeds with every β)."""
    points = [row_metric.get(f"{b:g}") or {"seeds": [], "values": []} for b in betas]
    per_point = [dict(zip(p["seeds"], p["values"])) for p in points]
    seeds = sorted(set.intersection(*(set(p) for p in per_point))) if per_point else []
    out: dict[int, float] = {}
    for s in seeds:
        vals = [float(p[s]) for p in per_point]
        if len(vals) == 1 or (ranking and len(set(vals)) == 1):
            out[int(s)] = vals[0]
        else:
            out[int(s)] = auc(list(betas), vals)
    return out


def experiment_values(exp: Mapping[str, Any], key: str) -> dict[str, dict[int, float]]:
    """``method -> {seed: value}`` of metric ``key`` in one experiment's table (an entry of
    ``tables["experiments"]``): the AUC over β each seed's row reports (``report: auc``), or
    the area under a per-β table's β levels. Methods without the metric are absent."""
    out: dict[str, dict[int, float]] = {}
    ranking = metric_info(key).kind == "ranking"
    for row in exp["rows"]:
        entry = row["metrics"].get(key)
        if entry is None:
            continue
        if exp["report"] == "auc":
            stat = entry["auc"]
            out[row["method"]] = {int(s): float(v) for s, v in zip(stat["seeds"], stat["values"])}
        else:
            out[row["method"]] = _per_beta_values(entry, exp["betas"], ranking)
    return out


def _mean(per_seed: Mapping[int, float]) -> float:
    arr = np.asarray(list(per_seed.values()), dtype=np.float64)
    return float(arr.mean()) if arr.size and np.isfinite(arr).all() else float("nan")


# --------------------------------------------------------------------------- ranks and tests
def rank_within(values: Sequence[float], lower_is_better: bool = True) -> np.ndarray:
    """Ranks of ``values`` (1 = best in the metric's direction); values within
    :data:`selbench.measure.stats.ZERO_TOL` of their neighbour in the order tie and share
    the average of their ranks."""
    x = np.asarray(values, dtype=np.float64) * (1.0 if lower_is_better else -1.0)
    if not np.isfinite(x).all():
        raise ValueError("rank_within needs finite values")
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.shape[0], dtype=np.float64)
    i = 0
    while i < x.shape[0]:
        j = i
        while j + 1 < x.shape[0] and x[order[j + 1]] - x[order[j]] <= S.ZERO_TOL:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def _undefined(ranks: np.ndarray) -> str | None:
    """Why the Friedman and post-hoc tests are not defined on ``ranks`` [N, k], or None."""
    n, k = ranks.shape
    if k < MIN_METHODS:
        return f"not defined: needs at least {MIN_METHODS} ranked methods (has {k})"
    if n < MIN_EXPERIMENTS:
        return f"not defined: needs at least {MIN_EXPERIMENTS} experiments (has {n})"
    if all(np.ptp(r) == 0 for r in ranks):
        return "not defined: every method ties in every experiment"
    return None


def friedman(ranks: Any) -> dict[str, Any]:
    """The Friedman test on ``ranks`` [N experiments, k methods] (or any values: scipy ranks
    each row): ``{"statistic", "p_value", "n_experiments", "n_methods", "reason"}``, the
    statistic and p-value None (and ``reason`` saying why) where the test is not defined."""
    r = np.asarray(ranks, dtype=np.float64)
    n, k = r.shape
    reason = _undefined(r)
    out: dict[str, Any] = {"statistic": None, "p_value": None, "n_experiments": n,
                           "n_methods": k, "reason": reason}
    if reason is None:
        from scipy import stats

        res = stats.friedmanchisquare(*r.T)
        out.update(statistic=float(res.statistic), p_value=float(res.pvalue))
    return out


def critical_difference(k: int, n: int, alpha: float = ALPHA) -> float:
    """Nemenyi's critical difference of average ranks for ``k`` methods over ``n``
    experiments: ``q_α / √2 · √(k (k + 1) / (6 n))``, ``q_α`` the upper-α quantile of the
    studentized range with ``k`` groups and infinite degrees of freedom (Demšar 2006)."""
    from scipy import stats

    q = float(stats.studentized_range.ppf(1.0 - alpha, k, np.inf)) / math.sqrt(2.0)
    return q * math.sqrt(k * (k + 1) / (6.0 * n))


def nemenyi(ranks: Any, methods: Sequence[str], alpha: float = ALPHA) -> dict[str, Any]:
    """The Nemenyi post-hoc test on ``ranks`` [N, k] (columns in the order of ``methods``):
    ``{"p_values": {a: {b: p}}, "critical_difference", "alpha", "reason"}`` (p-values and CD
    None, with ``reason``, where the Friedman test is not defined)."""
    r = np.asarray(ranks, dtype=np.float64)
    reason = _undefined(r)
    out: dict[str, Any] = {"p_values": None, "critical_difference": None, "alpha": alpha,
                           "reason": reason}
    if reason is None:
        import scikit_posthocs

        p = np.asarray(scikit_posthocs.posthoc_nemenyi_friedman(r), dtype=np.float64)
        out["p_values"] = {a: {b: float(p[i, j]) for j, b in enumerate(methods)}
                           for i, a in enumerate(methods)}
        out["critical_difference"] = critical_difference(r.shape[1], r.shape[0], alpha)
    return out


def groups_not_different(average: Mapping[str, float], p_values: Mapping[str, Mapping[str, float]],
                         alpha: float = ALPHA) -> list[list[str]]:
    """The maximal runs of methods, in order of average rank, of which no two differ
    significantly (every pairwise p ≥ ``alpha``): the bars of a critical-difference diagram.
    Runs of one method are left out."""
    order = sorted(average, key=lambda m: (average[m], m))
    groups: list[list[str]] = []
    last = 0
    for i in range(len(order)):
        j = i
        while j + 1 < len(order) and all(p_values[order[a]][order[j + 1]] >= alpha
                                         for a in range(i, j + 1)):
            j += 1
        if j > i and j > last:
            groups.append(order[i:j + 1])
            last = j
    return groups


# --------------------------------------------------------------------------- win rates
def _beats(v: np.ndarray) -> np.ndarray:
    """``W[a, b]`` = 1 when method a is better (lower) than b, ½ on a tie, 0 else."""
    d = v[:, None] - v[None, :]
    return np.where(np.abs(d) <= S.ZERO_TOL, 0.5, (d < 0).astype(np.float64))


def _bootstrap_weights(sizes: Sequence[int], resamples: int, seed: int) -> np.ndarray:
    """[resamples, Σ sizes]: how often each (experiment, seed) pair is drawn when the
    experiments are resampled, then the seeds within each drawn experiment."""
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    weights = np.zeros((resamples, int(offsets[-1])), dtype=np.float64)
    for b in range(resamples):
        for e in rng.integers(0, len(sizes), size=len(sizes)):
            np.add.at(weights[b], offsets[e] + rng.integers(0, sizes[e], size=sizes[e]), 1.0)
    return weights


def _matrix(methods: Sequence[str], m: np.ndarray) -> dict[str, dict[str, float | None]]:
    return {a: {b: (None if i == j else float(m[i, j])) for j, b in enumerate(methods)}
            for i, a in enumerate(methods)}


def win_rates(per_experiment: Sequence[Mapping[str, Mapping[int, float]]], methods: Sequence[str],
              lower_is_better: bool, *, resamples: int = RESAMPLES, level: float = LEVEL,
              seed: int = SEED) -> dict[str, Any]:
    """Pairwise win rates of ``methods`` over (experiment, seed) pairs.

    Args:
        per_experiment: per experiment, ``method -> {seed: value}``; each experiment
            contributes the seeds every method has.
        lower_is_better: the metric's direction.

    Returns:
        ``{"rate", "low", "high"}`` (``a -> b -> fraction``, None on the diagonal),
        ``"overall"`` (``a -> {"rate", "low", "high"}``: a's mean win rate against the
        others), ``"elo"`` (``a -> {"rating", "low", "high"}``: the Bradley-Terry rating of
        the same outcomes on the Elo scale, :func:`selbench.measure.elo.elo`, its interval
        from the first ``elo_resamples`` resamples), ``"pairs"`` (the number of (experiment, seed) pairs), ``"seeds"`` (per
        experiment), ``resamples``, ``level`` and ``seed``; the rates None when no
        experiment has a seed common to all methods.
    """
    sign = 1.0 if lower_is_better else -1.0
    blocks, seeds = [], []
    for values in per_experiment:
        common = sorted(set.intersection(*(set(values[m]) for m in methods)))
        seeds.append(common)
        if common:
            v = sign * np.array([[values[m][s] for m in methods] for s in common], dtype=np.float64)
            blocks.append(np.stack([_beats(row) for row in v]))
    elo_resamples = min(ELO_RESAMPLES, resamples)
    out: dict[str, Any] = {"pairs": sum(len(s) for s in seeds), "seeds": seeds,
                           "resamples": resamples, "level": level, "seed": seed,
                           "elo_resamples": elo_resamples,
                           "rate": None, "low": None, "high": None, "overall": None,
                           "elo": None}
    if not blocks:
        return out
    k = len(methods)
    wins = np.concatenate(blocks)  # [pairs, k, k]
    weights = _bootstrap_weights([len(b) for b in blocks], resamples, seed)
    boot = (weights @ wins.reshape(len(wins), k * k) / weights.sum(1, keepdims=True)).reshape(
        resamples, k, k)
    point = wins.mean(0)
    tails = [(1.0 - level) / 2.0, (1.0 + level) / 2.0]
    low, high = np.quantile(boot, tails, axis=0)
    off = ~np.eye(k, dtype=bool)
    overall_boot = (boot * off).sum(2) / max(k - 1, 1)
    o_low, o_high = np.quantile(overall_boot, tails, axis=0)
    overall = (point * off).sum(1) / max(k - 1, 1)
    out.update(rate=_matrix(methods, point), low=_matrix(methods, low), high=_matrix(methods, high),
               overall={m: {"rate": float(overall[i]), "low": float(o_low[i]),
                            "high": float(o_high[i])} for i, m in enumerate(methods)},
               elo=_elo(wins, weights[:elo_resamples], methods, tails))
    return out


def _elo(wins: np.ndarray, weights: np.ndarray, methods: Sequence[str],
         tails: Sequence[float]) -> dict[str, dict[str, float]]:
    """Each method's Elo rating from the outcomes ``wins`` [pairs, k, k], and its percentile
    interval over the bootstrap ``weights`` [resamples, pairs] (refitted on each)."""
    k = len(methods)
    flat = (wins * ~np.eye(k, dtype=bool)).reshape(len(wins), k * k)  # no match with itself
    point = E.elo(flat.sum(0).reshape(k, k))
    if not len(weights):
        return {m: {"rating": float(point[i]), "low": None, "high": None}
                for i, m in enumerate(methods)}
    boot = np.stack([E.elo((w @ flat).reshape(k, k)) for w in weights])
    low, high = np.quantile(boot, tails, axis=0)
    return {m: {"rating": float(point[i]), "low": float(low[i]), "high": float(high[i])}
            for i, m in enumerate(methods)}


# --------------------------------------------------------------------------- summary
def _eligible(values: Sequence[Mapping[str, Mapping[int, float]]], names: Sequence[str],
              order: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The methods with a finite mean in every experiment, and why each other one is not."""
    methods, left_out = [], {}
    for m in order:
        missing = [n for n, v in zip(names, values) if m not in v]
        no_value = [n for n, v in zip(names, values)
                    if m in v and not math.isfinite(_mean(v[m]))]
        if missing:
            left_out[m] = "not in " + ", ".join(missing)
        elif no_value:
            left_out[m] = "no value in " + ", ".join(no_value)
        else:
            methods.append(m)
    return methods, left_out


def summarize_metric(experiments: Sequence[Mapping[str, Any]], key: str, *,
                     resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, Any]:
    """The summary of metric ``key`` across ``experiments`` (entries of
    ``tables["experiments"]``): ranks, average ranks, Friedman, Nemenyi and win rates."""
    info = metric_info(key)
    if not info.marked:
        raise ValueError(f"metric {key!r} has no direction to rank by (the registry does not "
                         "mark a best)")
    names = [e["name"] for e in experiments]
    values = [experiment_values(e, key) for e in experiments]
    order = list(dict.fromkeys(r["method"] for e in experiments for r in e["rows"]))
    methods, left_out = _eligible(values, names, order)
    means = np.array([[_mean(v[m]) for m in methods] for v in values], dtype=np.float64)
    ranks = (np.stack([rank_within(row, info.lower_is_better) for row in means])
             if methods else np.zeros((len(names), 0)))
    average = ranks.mean(0) if methods else np.zeros(0)
    return {
        "label": info.label,
        "lower_is_better": info.lower_is_better,
        "point": {e["name"]: ("auc" if e["report"] == "auc" else "auc over the reported betas"
                              if len(e["betas"]) > 1 else f"{e['betas'][0]:g}")
                  for e in experiments},
        "methods": methods,
        "left_out": left_out,
        "means": {n: dict(zip(methods, map(float, row))) for n, row in zip(names, means)},
        "ranks": {n: dict(zip(methods, map(float, row))) for n, row in zip(names, ranks)},
        "average_rank": dict(zip(methods, map(float, average))),
        "friedman": friedman(ranks),
        "posthoc": nemenyi(ranks, methods),
        "win_rate": win_rates(values, methods, info.lower_is_better, resamples=resamples,
                              seed=seed) if methods else None,
    }


def summarize(experiments: Sequence[Mapping[str, Any]], *, resamples: int = RESAMPLES,
              seed: int = SEED) -> dict[str, Any] | None:
    """The summary across ``experiments`` (``tables["experiments"]``), or None with fewer
    than two: every metric with a direction that every experiment's table shows."""
    if len(experiments) < 2:
        return None
    shown = [list(e["metrics"]) for e in experiments]
    keys = [k for k in shown[0] if metric_info(k).marked and all(k in s for s in shown)]
    others = [k for k in dict.fromkeys(k for s in shown for k in s)
              if metric_info(k).marked and k not in keys]
    return {
        "experiments": [e["name"] for e in experiments],
        "alpha": ALPHA,
        "statistics": {"rank": "within each experiment by the mean over seeds, 1 = best, ties "
                               "share the average rank", "test": FRIEDMAN_NAME,
                       "posthoc": POSTHOC_NAME, "win_rate": WIN_RATE_NAME, "elo": ELO_NAME},
        "metrics": {k: summarize_metric(experiments, k, resamples=resamples, seed=seed)
                    for k in keys},
        "left_out_metrics": {k: "not shown in every experiment" for k in others},
    }


# --------------------------------------------------------------------------- rendering
_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\|*_`<>[]"})


def md_text(text: str) -> str:
    """``text`` on one line, with Markdown's special characters escaped (table cells)."""
    return " ".join(str(text).split()).translate(_MD_SPECIAL)


def p_text(p: float | None) -> str:
    """A p-value as the tables print it (``<0.001``, three decimals, ``–`` for none)."""
    if p is None:
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _table(body: list[list[str]], headers: list[str]) -> list[str]:
    from tabulate import tabulate

    return [tabulate(body, headers, tablefmt="github", disable_numparse=True), ""]


def _rank_table(summary: dict) -> list[str]:
    entries = summary["metrics"]
    keys = list(entries)
    methods = list(dict.fromkeys(m for k in keys for m in entries[k]["methods"]))
    headers = ["Method"] + [entries[k]["label"] + (" ↓" if entries[k]["lower_is_better"] else " ↑")
                            for k in keys]
    body = []
    for m in methods:
        line = [md_text(m)]
        for k in keys:
            avg = entries[k]["average_rank"]
            cell = f"{avg[m]:.2f}" if m in avg else "–"
            line.append(f"**{cell}**" if m in avg and avg[m] == min(avg.values()) else cell)
        body.append(line)
    for name, fn in (("Friedman χ²", lambda e: "–" if e["friedman"]["statistic"] is None
                      else f"{e['friedman']['statistic']:.2f}"),
                     ("Friedman p", lambda e: p_text(e["friedman"]["p_value"])),
                     (f"Nemenyi CD (α = {ALPHA:g})", lambda e: "–"
                      if e["posthoc"]["critical_difference"] is None
                      else f"{e['posthoc']['critical_difference']:.2f}")):
        body.append([f"*{name}*"] + [fn(entries[k]) for k in keys])
    return _table(body, headers)


def _significant_pairs(entry: dict) -> list[tuple[str, str, float]]:
    """(better, worse, p) for the pairs the Nemenyi test separates, when Friedman rejects."""
    p_f, post = entry["friedman"]["p_value"], entry["posthoc"]
    if p_f is None or p_f >= ALPHA or post["p_values"] is None:
        return []
    avg, out = entry["average_rank"], []
    methods = sorted(entry["methods"], key=lambda m: (avg[m], m))
    for i, a in enumerate(methods):
        for b in methods[i + 1:]:
            if post["p_values"][a][b] < ALPHA:
                out.append((a, b, post["p_values"][a][b]))
    return out


def _tests_text(summary: dict) -> list[str]:
    lines = []
    for entry in summary["metrics"].values():
        reason = entry["friedman"]["reason"]
        if reason is not None:
            lines.append(f"- {entry['label']}: Friedman and Nemenyi tests {reason}.")
            continue
        pairs = _significant_pairs(entry)
        if entry["friedman"]["p_value"] >= ALPHA:
            lines.append(f"- {entry['label']}: the Friedman test does not reject equal ranks "
                         f"(p ≥ {ALPHA:g}); no pair is declared different.")
        elif not pairs:
            lines.append(f"- {entry['label']}: no pair differs by more than the critical "
                         "difference.")
        else:
            text = "; ".join(f"{md_text(a)} better than {md_text(b)} (p = {p_text(p)})" for a, b, p in pairs)
            lines.append(f"- {entry['label']}: {text}.")
    return lines + [""]


def _win_table(entry: dict) -> list[str]:
    """The win-rate matrix of one metric; with more than :data:`MAX_MATRIX_METHODS` methods
    its compact form: each method's mean win rate and how many methods it beats (or loses
    to) with an interval clear of ½."""
    win, methods = entry["win_rate"], entry["methods"]
    pct = f"{win['level']:.0%}"
    full = len(methods) <= MAX_MATRIX_METHODS
    pairs = f"the {win['pairs']} (experiment, seed) pairs (ties count ½)"
    interval = f"{pct} bootstrap interval (over experiments, then seeds) lies above ½"
    what = (f"Row beats column on this fraction of {pairs}; **bold**: its {interval}." if full
            else f"*Beats* / *Loses to*: how many methods it beats / that beat it on more than "
                 f"half of {pairs}, counting the win rates whose {interval}.")
    lines = [f"### Win rates, {md_text(entry['label'])}", "",
             (f"{what} *All*: the mean win rate against the others, with its interval. *Elo*: "
              "the Bradley–Terry rating of the same outcomes on the Elo scale (mean 1000; as "
              f"CalArena), with its {pct} interval over {win['elo_resamples']} of the resamples. "
              "Every rate and interval is in leaderboard.json."), ""]
    headers = ["Method", "All", "Elo"] + ([md_text(m) for m in methods] if full
                                          else ["Beats", "Loses to"])
    body = []
    for a in methods:
        o, r = win["overall"][a], win["elo"][a]
        line = [md_text(a), f"{o['rate']:.2f} [{o['low']:.2f}, {o['high']:.2f}]",
                f"{r['rating']:.0f}" + ("" if r["low"] is None
                                        else f" [{r['low']:.0f}, {r['high']:.0f}]")]
        if not full:
            line += [str(sum(win["low"][a][b] > 0.5 for b in methods if b != a)),
                     str(sum(win["low"][b][a] > 0.5 for b in methods if b != a))]
        for b in methods if full else ():
            cell = "–" if a == b else f"{win['rate'][a][b]:.2f}"
            line.append(f"**{cell}**" if a != b and win["low"][a][b] > 0.5 else cell)
        body.append(line)
    return lines + _table(body, headers)


def markdown_section(summary: dict) -> list[str]:
    """The leaderboard's "Across experiments" section (Markdown lines)."""
    names = ", ".join(md_text(n) for n in summary["experiments"])
    lines = ["## Across experiments", "",
             (f"Average rank over the {len(summary['experiments'])} experiments ({names}): within "
              "each experiment the methods are ranked by their mean over seeds, 1 = best, ties "
              "sharing the average rank; an experiment enters by what its table reports (the "
              "AUC over β, or a per-β table's area under its β levels). Friedman test of equal "
              f"ranks, and Nemenyi's critical difference: two methods differ at α = {ALPHA:g} "
              "when their average ranks differ by more than CD."), ""]
    if not summary["metrics"]:
        return lines + ["No metric with a direction is shown in every experiment.", ""]
    lines += _rank_table(summary)
    left = {m: why for e in summary["metrics"].values() for m, why in e["left_out"].items()}
    if left:
        lines += ["Left out (ranked only where a method has a value in every experiment): "
                  + "; ".join(f"{md_text(m)} ({md_text(w)})" for m, w in left.items()) + ".", ""]
    if summary["left_out_metrics"]:
        lines += ["Not ranked (not shown in every experiment): " + ", ".join(
            metric_info(k).label for k in summary["left_out_metrics"]) + ".", ""]
    lines += _tests_text(summary)
    first = next(iter(summary["metrics"].values()))
    if first["win_rate"] is not None and first["win_rate"]["rate"] is not None:
        lines += _win_table(first)
    return lines


def diagram(entry: Mapping[str, Any], n_experiments: int) -> tuple[list[tuple[str, float]],
                                                                    list[tuple[float, float]],
                                                                    float | None, str]:
    """What the critical-difference diagram of one metric's summary draws: (method, average
    rank) in rank order, the (lowest, highest) average rank of each group of methods not
    significantly different, the critical difference (None where the test is not defined)
    and the title."""
    avg = entry["average_rank"]
    ranks = sorted(avg.items(), key=lambda kv: (kv[1], kv[0]))
    post = entry["posthoc"]
    groups = ([(avg[g[0]], avg[g[-1]]) for g in groups_not_different(avg, post["p_values"])]
              if post["p_values"] is not None else [])
    f = entry["friedman"]
    friedman_p = ("p < 0.001" if (f["p_value"] or 1.0) < 0.001
                  else f"p = {p_text(f['p_value'])}")
    test = (f"Friedman {friedman_p}, Nemenyi CD = {post['critical_difference']:.2f} "
            f"(α = {ALPHA:g}); bars join methods not significantly different"
            if f["reason"] is None else f"Friedman and Nemenyi tests {f['reason']}")
    title = (f"{entry['label']}: average rank over {n_experiments} experiments "
             f"(1 = best)\n{test}")
    return ranks, groups, post["critical_difference"], title
