"""Pre-registered questions: the pairs of methods a spec's ``questions:`` block names before
any number exists, answered across the experiments of a leaderboard.

A question asks whether method ``a`` is better than ``b`` on the block's ``metric`` (by what
each experiment's table reports: its AUC over β for ``report: auc``, the area under a per-β
table's levels otherwise; :func:`selbench.reporting.ranking.experiment_values`). ``b`` is a
label, or ``{best_of: [labels]}``: then the member with the best average rank *within the
group* (ranked in each experiment by its mean over seeds, ties sharing ranks, the first
listed on a tie of averages) over the experiments the question enters is chosen, once. That
choice looks at the same data the question is then answered on, so it favours ``b``: the
comparison is conservative for "a better" and liberal for "b better", as the leaderboard says.

A question enters every experiment whose table has ``a`` and every label of ``b`` with a
finite value; the others are listed with the reason. Each experiment gives a pair: a's and
b's means over the seeds both have. On these pairs (:mod:`selbench.measure.paired`):

* the two-sided Wilcoxon signed-rank test, its p-value Holm-adjusted across the questions
  answered (family-wise level ``alpha``);
* the Bayesian signed-rank test with the block's ROPE: P(a better), P(practically equal),
  P(b better), seeded with :data:`SEED`.

The answers go into ``leaderboard.json`` under ``summary.questions`` (:func:`answer`) and the
Markdown's "Across experiments" section (:func:`markdown`). ``summary.questions`` holds
``metric``, ``label``, ``lower_is_better``, ``rope``, ``alpha``, ``statistics`` (what each
number is, in words) and ``pairs``: per question ``name``, ``a``, ``b`` (the label compared:
for ``best_of`` the member chosen), ``best_of`` (the group, or null) and
``best_of_average_rank``, ``experiments`` (those entering) and ``left_out`` (experiment ->
why not), ``n``, ``a_means`` / ``b_means`` (experiment -> mean over the common seeds),
``median_difference`` (of a − b), ``wilcoxon`` (``p_value``, ``statistic``, ``n_nonzero``,
``min_p``, ...), ``p_holm``, ``bayesian`` (``p_a_better``, ``p_equal``, ``p_b_better``,
``rope``, ``nsamples``, ``seed``) and ``verdict`` (one line in words). Where the combined
results folders' specs ask different questions, ``summary.questions_note`` says so instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from selbench.measure import paired
from selbench.measure.metrics import metric_info
from selbench.reporting.ranking import experiment_values, rank_within

__all__ = ["DECISIVE", "SEED", "answer", "markdown", "questions_of"]

#: seed of the Bayesian test's posterior samples
SEED = 0
#: a Bayesian probability at least this high is reported as the test's answer
DECISIVE = 0.95

BEST_OF_NOTE = ("best_of: the member of the group with the best average rank within the group "
                "over the experiments the question enters (a tie: the first listed), chosen "
                "once on the same data; this "
                "favours b, so the comparison is conservative for 'a better' and liberal for "
                "'b better'")


def questions_of(spec: Any) -> tuple[dict | None, str | None]:
    """The ``questions`` block of a leaderboard's spec (``tables["spec"]``: one spec, or a
    list when results folders are combined), and why none is answered when the combined
    specs ask different ones."""
    specs = spec if isinstance(spec, list) else [spec]
    blocks = [s["questions"] for s in specs if isinstance(s, Mapping) and s.get("questions")]
    distinct = [b for i, b in enumerate(blocks) if b not in blocks[:i]]
    if len(distinct) > 1:
        return None, "the combined specs ask different questions; none is answered"
    return (distinct[0] if distinct else None), None


def _mean(per_seed: Mapping[int, float], seeds: Sequence[int] | None = None) -> float:
    vals = np.array([per_seed[s] for s in (seeds if seeds is not None else per_seed)],
                    dtype=np.float64)
    return float(vals.mean()) if vals.size and np.isfinite(vals).all() else float("nan")


def _entering(names: Sequence[str], values: Sequence[Mapping], labels: Sequence[str]
              ) -> tuple[list[int], dict[str, str]]:
    """Indices of the experiments holding every label with a finite value, and why each
    other experiment does not enter."""
    keep, left = [], {}
    for i, (name, v) in enumerate(zip(names, values)):
        missing = [m for m in labels if m not in v]
        bad = [m for m in labels if m in v and not np.isfinite(_mean(v[m]))]
        if missing:
            left[name] = "no " + ", ".join(missing)
        elif bad:
            left[name] = "no value for " + ", ".join(bad)
        else:
            keep.append(i)
    return keep, left


def _best_of(group: Sequence[str], values: Sequence[Mapping], keep: Sequence[int],
             lower_is_better: bool) -> tuple[str, dict[str, float]]:
    """The group member with the best average rank within the group, and every member's."""
    ranks = np.stack([rank_within([_mean(values[i][m]) for m in group], lower_is_better)
                      for i in keep])
    average = dict(zip(group, map(float, ranks.mean(0))))
    best = min(group, key=lambda m: (average[m], group.index(m)))
    return best, average


def _pair(question: Mapping, names: Sequence[str], values: Sequence[Mapping], q: Mapping,
          lower_is_better: bool) -> dict[str, Any]:
    """One question's pairs of means and its tests (the Holm adjustment comes later)."""
    b_spec = question["b"]
    group = list(b_spec["best_of"]) if isinstance(b_spec, Mapping) else None
    labels = [question["a"]] + (group if group is not None else [b_spec])
    keep, left = _entering(names, values, labels)
    out: dict[str, Any] = {"name": question["name"], "a": question["a"], "b": None,
                           "best_of": group, "best_of_average_rank": None, "experiments": [],
                           "left_out": left, "n": 0, "a_means": {}, "b_means": {},
                           "median_difference": None, "wilcoxon": None, "p_holm": None,
                           "bayesian": None}
    if not keep:
        return out
    b = labels[1]
    if group is not None:
        b, out["best_of_average_rank"] = _best_of(group, values, keep, lower_is_better)
    out["b"] = b
    for i in keep:
        common = sorted(set(values[i][question["a"]]) & set(values[i][b]))
        if not common:
            left[names[i]] = "no seed common to a and b"
            continue
        out["a_means"][names[i]] = _mean(values[i][question["a"]], common)
        out["b_means"][names[i]] = _mean(values[i][b], common)
    out["experiments"] = list(out["a_means"])
    out["n"] = len(out["experiments"])
    if out["n"]:
        x, y = list(out["a_means"].values()), list(out["b_means"].values())
        out["wilcoxon"] = paired.signed_rank(x, y)
        out["median_difference"] = out["wilcoxon"]["median_difference"]
        out["bayesian"] = paired.bayesian_signed_rank(x, y, float(q["rope"]),
                                                      lower_is_better=lower_is_better, seed=SEED)
    return out


def _verdict(p: dict, alpha: float, rope: float, lower_is_better: bool) -> str:
    """One line in words, saying no more than the tests do."""
    if p["n"] < 2:
        return f"not answered: {p['n']} experiment(s) hold both methods"
    w, bay = p["wilcoxon"], p["bayesian"]
    a, b = p["a"], p["b"]
    if p["p_holm"] < alpha:
        # the direction: the median difference, or the mean where the median is 0
        diff = p["median_difference"] or float(np.mean(
            np.subtract(list(p["a_means"].values()), list(p["b_means"].values()))))
        a_better = (diff < 0) == lower_is_better
        test = (f"{a if a_better else b} better than {b if a_better else a} "
                f"(Holm p = {_p(p['p_holm'])}, below α = {alpha:g})")
    elif w["min_p"] >= alpha:
        test = (f"no significant difference: with {w['n_nonzero']} nonzero differences the "
                f"test cannot reach p below {alpha:g}")
    else:
        test = f"no significant difference (Holm p = {_p(p['p_holm'])} ≥ α = {alpha:g})"
    probs = {"a better": bay["p_a_better"], "practically equal": bay["p_equal"],
             "b better": bay["p_b_better"]}
    region, top = max(probs.items(), key=lambda kv: kv[1])
    words = {"a better": f"{a} better", "b better": f"{b} better",
             "practically equal": f"practically equal (within ±{rope:g})"}
    bayes = (f"Bayesian: {words[region]} with P = {top:.3f}" if top >= DECISIVE else
             f"Bayesian: undecided (largest P = {top:.3f}, {words[region]})")
    return f"{test}; {bayes}."


def answer(experiments: Sequence[Mapping[str, Any]], q: Mapping[str, Any]) -> dict[str, Any]:
    """The answers to the questions block ``q`` (the spec's ``questions``, JSON form) on the
    experiments' tables (``tables["experiments"]``): JSON-ready."""
    key = q["metric"]
    info = metric_info(key)
    names = [e["name"] for e in experiments]
    values = [experiment_values(e, key) if key in e["metrics"] else {} for e in experiments]
    pairs = [_pair(question, names, values, q, info.lower_is_better) for question in q["pairs"]]
    adjusted = paired.holm([p["wilcoxon"]["p_value"] if p["n"] >= 2 else None for p in pairs])
    for p, adj in zip(pairs, adjusted):
        p["p_holm"] = adj
        p["verdict"] = _verdict(p, float(q["alpha"]), float(q["rope"]), info.lower_is_better)
    return {"metric": key, "label": info.label, "lower_is_better": info.lower_is_better,
            "rope": float(q["rope"]), "alpha": float(q["alpha"]),
            "statistics": {"wilcoxon": paired.WILCOXON_NAME, "bayesian": paired.BAYES_NAME,
                           "hierarchical": paired.HIERARCHICAL_NOTE, "best_of": BEST_OF_NOTE,
                           "decisive": DECISIVE},
            "pairs": pairs}


# --------------------------------------------------------------------------- rendering
_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\|*_`<>[]"})


def _md(text: str) -> str:
    return " ".join(str(text).split()).translate(_MD_SPECIAL)


def _p(p: float | None) -> str:
    if p is None:
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _row(p: dict) -> list[str]:
    if p["n"] == 0:
        return [_md(p["name"]), _md(p["a"]), "–", "0"] + ["–"] * 6
    b = _md(p["b"]) + (" (best of group)" if p["best_of"] else "")
    bay = p["bayesian"]
    return [_md(p["name"]), _md(p["a"]), b, str(p["n"]), f"{p['median_difference']:+.4f}",
            _p(p["wilcoxon"]["p_value"]), _p(p["p_holm"]), f"{bay['p_a_better']:.3f}",
            f"{bay['p_equal']:.3f}", f"{bay['p_b_better']:.3f}"]


def markdown(answers: Mapping[str, Any] | None, note: str | None = None) -> list[str]:
    """The "Pre-registered questions" part of the "Across experiments" section."""
    if answers is None:
        return ["### Pre-registered questions", "", note + ".", ""] if note else []
    from tabulate import tabulate

    arrow = "lower" if answers["lower_is_better"] else "higher"
    lines = ["### Pre-registered questions", "",
             (f"Written in the spec before the run. Metric: {_md(answers['label'])} ({arrow} is "
              "better; what each experiment's table reports). Each experiment gives one pair: "
              "the means over the seeds both methods have. *Wilcoxon p*: two-sided signed-rank "
              "test over experiments (zero differences dropped); *Holm p*: adjusted across the "
              f"{len(answers['pairs'])} questions, family-wise α = {answers['alpha']:g}. "
              "*P(a better)*, *P(equal)*, *P(b better)*: Bayesian signed-rank test (baycomp, "
              f"Benavoli et al. 2014) with ROPE ±{answers['rope']:g}, seeded; the hierarchical "
              "model that would also use the seeds inside each experiment is not run here (it "
              "needs PyStan). *median a − b* in the metric's units."), ""]
    headers = ["Question", "a", "b", "n", "median a − b", "Wilcoxon p", "Holm p",
               "P(a better)", "P(equal)", "P(b better)"]
    lines += [tabulate([_row(p) for p in answers["pairs"]], headers, tablefmt="github",
                       disable_numparse=True), ""]
    for p in answers["pairs"]:
        lines.append(f"- {_md(p['name'])}: {_md(p['verdict'])}" if p["n"] else
                     f"- {_md(p['name'])}: no experiment holds both methods.")
        if p["best_of"] and p["best_of_average_rank"]:
            ranks = ", ".join(f"{_md(m)} {r:.2f}" for m, r in p["best_of_average_rank"].items())
            lines.append(f"  b = {_md(p['b'])}, the best average rank within the group ({ranks}; "
                         "a tie: the first listed), chosen on the same data: this favours b, so "
                         "the comparison is conservative for 'a better'.")
        if p["left_out"]:
            lines.append("  Not entering: " + "; ".join(
                f"{_md(n)} ({_md(w)})" for n, w in p["left_out"].items()) + ".")
    return lines + [""]
