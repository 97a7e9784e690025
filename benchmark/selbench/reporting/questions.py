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
  P(b better), seeded with :data:`SEED`;
* the hierarchical Bayesian model that also uses the seeds inside each experiment
  (:mod:`selbench.measure.hierarchical`: baycomp's Stan program through PyStan, seeded with
  :data:`SEED`, sampled as the block's ``hierarchical`` says): on the per-seed values of a
  and b over the seeds both have in every entering experiment (the model needs the same
  number in each: the first ``k`` in seed order, ``k`` the smallest count). Where PyStan is
  not installed, Stan cannot build, or the block's ``hierarchical`` is null, one line says so
  and nothing else changes. Stan's compiled model is cached under ``<cache>/stan``
  (:func:`selbench.store.default_cache_dir`); the first build takes minutes.

The answers go into ``leaderboard.json`` under ``summary.questions`` (:func:`answer`) and the
Markdown's "Across experiments" section (:func:`markdown`). ``summary.questions`` holds
``metric``, ``label``, ``lower_is_better``, ``rope``, ``alpha``, ``statistics`` (what each
number is, in words), ``hierarchical_note`` (why the hierarchical model was not run, or null)
and ``pairs``: per question ``name``, ``a``, ``b`` (the label compared:
for ``best_of`` the member chosen), ``best_of`` (the group, or null) and
``best_of_average_rank``, ``experiments`` (those entering) and ``left_out`` (experiment ->
why not), ``n``, ``a_means`` / ``b_means`` (experiment -> mean over the common seeds),
``median_difference`` (of a − b), ``wilcoxon`` (``p_value``, ``statistic``, ``n_nonzero``,
``min_p``, ...), ``p_holm``, ``bayesian`` (``p_a_better``, ``p_equal``, ``p_b_better``,
``rope``, ``nsamples``, ``seed``), ``hierarchical`` (null when not run, else
``p_a_better``, ``p_equal``, ``p_b_better``, ``rope``, ``seed``, ``chains``, ``nsamples``
(draws per chain), ``warmup``, ``experiments``, ``seeds`` (per experiment), ``rho``,
``delta0_mean``: the posterior mean of the higher-level difference a − b in the metric's
units), ``hierarchical_note`` (why this question's was not run, or null) and ``verdict`` (one
line in words). Where the combined
results folders' specs ask different questions, ``summary.questions_note`` says so instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from selbench.measure import hierarchical, paired
from selbench.measure.metrics import metric_info
from selbench.reporting.ranking import experiment_values, md_text, p_text, rank_within
from selbench.store import default_cache_dir

__all__ = ["DECISIVE", "SEED", "answer", "markdown", "questions_of"]

#: seed of the Bayesian test's posterior samples
SEED = 0
#: a Bayesian probability at least this high is reported as the test's answer
DECISIVE = 0.95

#: the spec's default sampling of the hierarchical model (when its block does not say)
HIERARCHICAL_DEFAULT = {"chains": hierarchical.CHAINS, "samples": hierarchical.NSAMPLES,
                        "warmup": hierarchical.WARMUP}

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
          lower_is_better: bool) -> tuple[dict[str, Any], list[tuple[list, list]]]:
    """One question's pairs of means and its tests (the Holm adjustment and the hierarchical
    model come later), and per entering experiment a's and b's values on the common seeds."""
    b_spec = question["b"]
    group = list(b_spec["best_of"]) if isinstance(b_spec, Mapping) else None
    labels = [question["a"]] + (group if group is not None else [b_spec])
    keep, left = _entering(names, values, labels)
    out: dict[str, Any] = {"name": question["name"], "a": question["a"], "b": None,
                           "best_of": group, "best_of_average_rank": None, "experiments": [],
                           "left_out": left, "n": 0, "a_means": {}, "b_means": {},
                           "median_difference": None, "wilcoxon": None, "p_holm": None,
                           "bayesian": None, "hierarchical": None, "hierarchical_note": None}
    per_seed: list[tuple[list, list]] = []
    if not keep:
        return out, per_seed
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
        per_seed.append(([values[i][question["a"]][s] for s in common],
                         [values[i][b][s] for s in common]))
    out["experiments"] = list(out["a_means"])
    out["n"] = len(out["experiments"])
    if out["n"]:
        x, y = list(out["a_means"].values()), list(out["b_means"].values())
        out["wilcoxon"] = paired.signed_rank(x, y)
        out["median_difference"] = out["wilcoxon"]["median_difference"]
        out["bayesian"] = paired.bayesian_signed_rank(x, y, float(q["rope"]),
                                                      lower_is_better=lower_is_better, seed=SEED)
    return out, per_seed


def _hierarchical(p: dict, per_seed: Sequence[tuple[list, list]], q: Mapping,
                  lower_is_better: bool, cache_dir: Any) -> None:
    """The hierarchical model's answer to one question (into ``p``); raises
    :class:`~selbench.measure.hierarchical.HierarchicalUnavailable` when Stan cannot run."""
    k = min((len(x) for x, _ in per_seed), default=0)
    if k < 2:
        p["hierarchical_note"] = (f"not run: {k} seed(s) common to a and b in some entering "
                                  "experiment; the model needs at least 2 in each")
        return
    cfg = q["hierarchical"]
    a = [x[:k] for x, _ in per_seed]
    b = [y[:k] for _, y in per_seed]
    try:
        p["hierarchical"] = hierarchical.hierarchical(
            a, b, float(q["rope"]), lower_is_better=lower_is_better, cache_dir=cache_dir,
            sampling=hierarchical.Sampling(SEED, cfg["chains"], cfg["samples"], cfg["warmup"]))
    except ValueError as e:  # e.g. a and b equal on every seed of every experiment
        p["hierarchical_note"] = f"not run: {e}"
        return
    dropped = max(len(x) for x, _ in per_seed) - k
    if dropped:
        p["hierarchical_note"] = (f"the first {k} common seeds of each experiment (the model "
                                  "needs the same number in each)")


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
                f"(Holm p = {p_text(p['p_holm'])}, below α = {alpha:g})")
    elif w["min_p"] >= alpha:
        test = (f"no significant difference: with {w['n_nonzero']} nonzero differences the "
                f"test cannot reach p below {alpha:g}")
    else:
        test = f"no significant difference (Holm p = {p_text(p['p_holm'])} ≥ α = {alpha:g})"
    bayes = _bayes_words("Bayesian", bay, a, b, rope)
    if p["hierarchical"]:
        bayes += "; " + _bayes_words("hierarchical", p["hierarchical"], a, b, rope)
    return f"{test}; {bayes}."


def _bayes_words(what: str, bay: Mapping, a: str, b: str, rope: float) -> str:
    probs = {"a better": bay["p_a_better"], "practically equal": bay["p_equal"],
             "b better": bay["p_b_better"]}
    region, top = max(probs.items(), key=lambda kv: kv[1])
    words = {"a better": f"{a} better", "b better": f"{b} better",
             "practically equal": f"practically equal (within ±{rope:g})"}
    return (f"{what}: {words[region]} with P = {top:.3f}" if top >= DECISIVE else
            f"{what}: undecided (largest P = {top:.3f}, {words[region]})")


def answer(experiments: Sequence[Mapping[str, Any]], q: Mapping[str, Any], *,
           cache_dir: Any = None) -> dict[str, Any]:
    """The answers to the questions block ``q`` (the spec's ``questions``, JSON form) on the
    experiments' tables (``tables["experiments"]``): JSON-ready. The hierarchical model's
    Stan build is cached under ``cache_dir`` (default ``default_cache_dir() / "stan"``)."""
    key = q["metric"]
    info = metric_info(key)
    names = [e["name"] for e in experiments]
    values = [experiment_values(e, key) if key in e["metrics"] else {} for e in experiments]
    asked = [_pair(question, names, values, q, info.lower_is_better) for question in q["pairs"]]
    pairs = [p for p, _ in asked]
    q = {**q, "hierarchical": q.get("hierarchical", HIERARCHICAL_DEFAULT)}
    why = ("the spec's questions.hierarchical is null" if q["hierarchical"] is None
           else hierarchical.unavailable())
    for p, per_seed in asked:
        if why is None and p["n"] >= 2:
            try:
                _hierarchical(p, per_seed, q, info.lower_is_better,
                              cache_dir if cache_dir is not None else default_cache_dir() / "stan")
            except hierarchical.HierarchicalUnavailable as e:
                why = str(e)
    adjusted = paired.holm([p["wilcoxon"]["p_value"] if p["n"] >= 2 else None for p in pairs])
    for p, adj in zip(pairs, adjusted):
        p["p_holm"] = adj
        p["verdict"] = _verdict(p, float(q["alpha"]), float(q["rope"]), info.lower_is_better)
    return {"metric": key, "label": info.label, "lower_is_better": info.lower_is_better,
            "rope": float(q["rope"]), "alpha": float(q["alpha"]),
            "statistics": {"wilcoxon": paired.WILCOXON_NAME, "bayesian": paired.BAYES_NAME,
                           "hierarchical": hierarchical.HIERARCHICAL_NAME,
                           "best_of": BEST_OF_NOTE, "decisive": DECISIVE},
            "hierarchical_note": f"not run: {why}" if why else None, "pairs": pairs}


# --------------------------------------------------------------------------- rendering
def _row(p: dict) -> list[str]:
    if p["n"] == 0:
        return [md_text(p["name"]), md_text(p["a"]), "–", "0"] + ["–"] * 6
    b = md_text(p["b"]) + (" (best of group)" if p["best_of"] else "")
    bay = p["bayesian"]
    return [md_text(p["name"]), md_text(p["a"]), b, str(p["n"]), f"{p['median_difference']:+.4f}",
            p_text(p["wilcoxon"]["p_value"]), p_text(p["p_holm"]), f"{bay['p_a_better']:.3f}",
            f"{bay['p_equal']:.3f}", f"{bay['p_b_better']:.3f}"]


def _hierarchical_md(answers: Mapping[str, Any]) -> list[str]:
    """The hierarchical model's table, or the line saying why it was not run."""
    note = answers.get("hierarchical_note")
    done = [p for p in answers["pairs"] if p.get("hierarchical")]
    lines = []
    if done:
        h0 = done[0]["hierarchical"]
        lines += [("The same questions by the hierarchical Bayesian model that also uses the "
                   "seeds inside each experiment (Benavoli, Corani, Demšar & Zaffalon, JMLR "
                   f"2017; baycomp's Stan model through PyStan, ROPE ±{answers['rope']:g}, "
                   f"{h0['chains']} chains × {h0['nsamples']} draws, seeded): each P is the share "
                   "of posterior draws in which that region is the most probable one for the "
                   "next experiment's difference. *δ₀*: the posterior mean of the mean "
                   "difference a − b, in the metric's units."), ""]
        rows = [[md_text(p["name"]), f"{h['experiments']} × {h['seeds']}", f"{h['p_a_better']:.3f}",
                 f"{h['p_equal']:.3f}", f"{h['p_b_better']:.3f}", f"{h['delta0_mean']:+.4f}"]
                for p in done for h in [p["hierarchical"]]]
        from tabulate import tabulate

        lines += [tabulate(rows, ["Question", "experiments × seeds", "P(a better)", "P(equal)",
                                  "P(b better)", "δ₀"], tablefmt="github",
                           disable_numparse=True), ""]
    if note:
        lines += [f"Hierarchical model (seeds inside experiments): {md_text(note)}.", ""]
    return lines


def markdown(answers: Mapping[str, Any] | None, note: str | None = None) -> list[str]:
    """The "Pre-registered questions" part of the "Across experiments" section."""
    if answers is None:
        return ["### Pre-registered questions", "", note + ".", ""] if note else []
    from tabulate import tabulate

    arrow = "lower" if answers["lower_is_better"] else "higher"
    lines = ["### Pre-registered questions", "",
             (f"Written in the spec before the run. Metric: {md_text(answers['label'])} ({arrow} is "
              "better; what each experiment's table reports). Each experiment gives one pair: "
              "the means over the seeds both methods have. *Wilcoxon p*: two-sided signed-rank "
              "test over experiments (zero differences dropped); *Holm p*: adjusted across the "
              f"{len(answers['pairs'])} questions, family-wise α = {answers['alpha']:g}. "
              "*P(a better)*, *P(equal)*, *P(b better)*: Bayesian signed-rank test (baycomp, "
              f"Benavoli et al. 2014) with ROPE ±{answers['rope']:g}, seeded. "
              "*median a − b* in the metric's units."), ""]
    headers = ["Question", "a", "b", "n", "median a − b", "Wilcoxon p", "Holm p",
               "P(a better)", "P(equal)", "P(b better)"]
    lines += [tabulate([_row(p) for p in answers["pairs"]], headers, tablefmt="github",
                       disable_numparse=True), ""]
    lines += _hierarchical_md(answers)
    for p in answers["pairs"]:
        lines.append(f"- {md_text(p['name'])}: {md_text(p['verdict'])}" if p["n"] else
                     f"- {md_text(p['name'])}: no experiment holds both methods.")
        if p["best_of"] and p["best_of_average_rank"]:
            ranks = ", ".join(f"{md_text(m)} {r:.2f}" for m, r in p["best_of_average_rank"].items())
            lines.append(f"  b = {md_text(p['b'])}, the best average rank within the group ({ranks}; "
                         "a tie: the first listed), chosen on the same data: this favours b, so "
                         "the comparison is conservative for 'a better'.")
        if p.get("hierarchical_note"):
            lines.append(f"  Hierarchical model: {md_text(p['hierarchical_note'])}.")
        if p["left_out"]:
            lines.append("  Not entering: " + "; ".join(
                f"{md_text(n)} ({md_text(w)})" for n, w in p["left_out"].items()) + ".")
    return lines + [""]
