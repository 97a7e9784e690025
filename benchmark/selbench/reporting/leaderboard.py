"""Leaderboards: per-experiment tables over seeds, as Markdown, CSV and JSON.

The tables are built only from the cell files of a results directory (``cells/``) and its
``run.json`` manifest, so ``selbench leaderboard DIR`` re-renders them without recomputing
anything. The core owns the columns: the metrics of the registry
:data:`selbench.measure.metrics.METRICS` that the experiment's ``metrics:`` list chooses (by default
the paper's ECE₁, ECE₂, Brier, accuracy and achieved coverage), with their labels and
directions from the registry, best marked where the registry says so; either at each
coverage level β (``report: betas``) or as the area under the metric-vs-β curve
(``report: auc``, see :func:`selbench.measure.metrics.auc`). A ranking metric (AURC, E-AURC,
AUGRC: one value per cell, from the selector's scores over all evaluation examples) shows
that value in an ``auc`` table.

Bootstrap intervals over the evaluation examples (each cell's, see
:func:`selbench.measure.evaluate.intervals`) are in the JSON (per seed, and the mean of their
bounds) and the CSV (``boot_*``); the Markdown stays readable without them.

Each value is summarised over seeds by :mod:`selbench.measure.stats`: mean ± sample std, a 95%
Student-t interval, and a one-sided Wilcoxon signed-rank test (paired by seed) against the
method with the best mean; **best** marks that method and every method not significantly
worse than it (see :func:`selbench.measure.stats.compare_to_best` for the exact rule).

**One spec per table.** A table only combines results computed for the same spec, unless
asked: cells under ``cells/`` written for another configuration than ``run.json``'s (their
content key differs, e.g. the spec changed and the run was not finished), or several results
directories run with different specs, are refused with an error naming the spec hashes;
``allow_mixed=True`` (``--allow-mixed``) tabulates them together and says so in every output.
A cell *reused* by a later run is not "mixed": its content key proves it is exactly the
computation the current spec asks for, whichever spec first computed it.

**The page.** ``leaderboard.html`` (:mod:`selbench.reporting.html`) shows the same tables,
sortable and filterable, with the figures; it opens offline from ``file://``.

**Across experiments.** With two or more experiments the JSON gets a ``summary`` (average
ranks, Friedman and Nemenyi tests, win rates with bootstrap intervals) and the Markdown an
"Across experiments" section, both from :mod:`selbench.reporting.ranking`; a single
experiment's outputs have neither. A spec with a ``questions:`` block gets its answers in
``summary.questions`` and a "Pre-registered questions" part of that section
(:mod:`selbench.reporting.questions`); a spec with ``cost: true`` a "Cost" section and
``fit_seconds`` CSV rows (:mod:`selbench.reporting.cost`).

The Markdown holds no dates or timings (unless the spec sets ``cost: true``), so an
interrupted-and-resumed run renders it byte for byte like an uninterrupted one; the JSON
carries the full provenance (dates, versions, device, timings).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tabulate import tabulate

from selbench.measure import stats as S
from selbench.measure.guarantee import RISK_GUARANTEE_COLUMNS
from selbench.measure.metrics import DEFAULT_COLUMNS, auc, metric_info
from selbench.reporting import cost, questions, ranking
from selbench.reporting.html import write_page
from selbench.reporting.loading import LeaderboardError, ResultSet, load_results, short_hash
from selbench.reporting.tuned import tuning_entry, tuning_line
from selbench.util.files import atomic_write_json, atomic_write_text

__all__ = [
    "Column",
    "build_tables",
    "columns_for",
    "headline",
    "render_csv",
    "render_markdown",
    "write_leaderboard",
]


@dataclass(frozen=True)
class Column:
    """A leaderboard column: one metric of the registry (:data:`selbench.measure.metrics.METRICS`)."""

    key: str
    label: str
    lower_is_better: bool | None  # None: shown, never marked best
    kind: str = "selective"

    @property
    def header(self) -> str:
        arrow = "" if self.lower_is_better is None else (" ↓" if self.lower_is_better else " ↑")
        return self.label + arrow

    @classmethod
    def of(cls, key: str) -> Column:
        info = metric_info(key)
        return cls(key, info.label, info.lower_is_better if info.marked else None, info.kind)


def columns_for(exp: dict) -> tuple[Column, ...]:
    """The columns of one experiment's table: its ``metrics`` list (the spec fills it in:
    the spec's list, or the paper's set plus the guaranteed coverage where the experiment
    asks for a coverage guarantee). A run.json written before metrics lists existed gets
    that default."""
    keys = exp.get("metrics")
    if not keys:
        keys = list(DEFAULT_COLUMNS) + (
            ["guaranteed_coverage"] if exp.get("coverage_guarantee") else []) + (
            list(RISK_GUARANTEE_COLUMNS) if exp.get("risk_guarantee") else [])
    return tuple(Column.of(k) for k in keys)


def headline(columns: Sequence[Column]) -> Column | None:
    """The column whose p-values the Markdown shows: the first one marked best."""
    return next((c for c in columns if c.lower_is_better is not None), None)


# --------------------------------------------------------------------------- tables
def method_curves(results: ResultSet, experiment: str, method: str) -> dict[int, dict[float, dict[str, float]]]:
    """``curves[seed][beta] = {metric: value}`` of one method, from its cells."""
    curves: dict[int, dict[float, dict[str, float]]] = {}
    for rec in results.cells:
        if rec["experiment"] != experiment or rec["method"] != method:
            continue
        for b_i, b in enumerate(rec["betas"]):
            point = {k: v[b_i] for k, v in rec["metrics"].items()}
            curves.setdefault(int(rec["seed"]), {})[float(b)] = point
    return curves


def _as_float(v: Any) -> float:
    return float("nan") if v is None else float(v)


def _curve_summary(curves: dict, betas: list[float], keys: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"betas": betas}
    for key in keys:
        means, stds, ns = [], [], []
        for b in betas:
            vals = {s: _as_float(c[b].get(key)) for s, c in curves.items() if b in c}
            st = S.summarize(vals)
            means.append(st["mean"])
            stds.append(st["std"])
            ns.append(st["n"])
        out[key] = {"mean": means, "std": stds, "n": ns}
    return out


def _timing(results: ResultSet, experiment: str, method: str) -> dict[str, Any]:
    fit, ev, tune, devices = [], [], [], set()
    for rec in results.cells:
        if rec["experiment"] == experiment and rec["method"] == method:
            t = rec.get("timing") or {}
            fit.append(float(t.get("fit_s", float("nan"))))
            if rec.get("tuning"):  # the trials before the refit (tuned cells only)
                tune.append(float(rec["tuning"].get("tune_s", float("nan"))))
            ev.append(float(t.get("eval_s", float("nan"))))
            if rec.get("device"):
                devices.add(rec["device"])
    return {
        "cells": len(fit),
        # cells record seconds to 1e-4; 6 decimals keep the means free of float noise
        "fit_s_mean": round(float(np.mean(fit)), 6) if fit else None,
        "fit_s_total": round(float(np.sum(fit)), 6) if fit else None,
        "eval_s_mean": round(float(np.mean(ev)), 6) if ev else None,
        **({"tune_s_mean": round(float(np.mean(tune)), 6)} if tune else {}),
        "devices": sorted(devices),
    }


def method_intervals(results: ResultSet, experiment: str, method: str
                     ) -> dict[int, dict[float | str, dict[str, list[float]]]]:
    """``intervals[seed][point][metric] = [low, high]``: the bootstrap intervals over the
    evaluation examples of one method's cells (``point`` a β, or ``"auc"`` for the interval
    of the AUC over β; a ranking metric's interval is at every β and at ``"auc"``)."""
    out: dict[int, dict[float | str, dict[str, list[float]]]] = {}
    for rec in results.cells:
        if rec["experiment"] != experiment or rec["method"] != method:
            continue
        per = out.setdefault(int(rec["seed"]), {})
        for key, iv in (rec.get("intervals") or {}).items():
            if metric_info(key).kind == "selective":
                for b_i, b in enumerate(rec["betas"]):
                    per.setdefault(float(b), {})[key] = [iv["low"][b_i], iv["high"][b_i]]
                if iv.get("auc") is not None:
                    per.setdefault("auc", {})[key] = list(iv["auc"])
            else:  # ranking: one interval for the cell
                for b in rec["betas"]:
                    per.setdefault(float(b), {})[key] = [iv["low"], iv["high"]]
                per.setdefault("auc", {})[key] = [iv["low"], iv["high"]]
    return out


def _bootstrap_entry(intervals: dict, point: float | str, key: str, level: float | None
                     ) -> dict[str, Any] | None:
    per_seed = {s: iv[point][key] for s, iv in intervals.items()
                if point in iv and key in iv[point]}
    if not per_seed:
        return None
    lows = [_as_float(v[0]) for v in per_seed.values()]
    highs = [_as_float(v[1]) for v in per_seed.values()]
    return {
        "level": level,
        "per_seed": {str(s): [_as_float(v[0]), _as_float(v[1])] for s, v in per_seed.items()},
        "low_mean": float(np.mean(lows)),
        "high_mean": float(np.mean(highs)),
    }


def _boot_level(results: ResultSet, experiment: str) -> float | None:
    for rec in results.cells:
        if rec["experiment"] == experiment and rec.get("bootstrap"):
            return float(rec["bootstrap"]["level"])
    return None


def _metric_entry(col: Column, report: str, betas: list[float], curves: dict, complete: dict,
                  boots: dict, level: float | None) -> dict[str, Any]:
    """One method's summary of one column: at ``auc`` (the AUC over β of each complete seed,
    or a ranking metric's constant value) or at each β, with the bootstrap intervals."""
    entry: dict[str, Any] = {}
    if report == "auc":
        per_seed = {}
        for s in complete:
            vals = [_as_float(complete[s][b].get(col.key)) for b in betas]
            constant = col.kind == "ranking" and len(set(vals)) == 1
            per_seed[s] = vals[0] if constant else auc(betas, vals)
        entry["auc"] = S.summarize(per_seed)
        boot = _bootstrap_entry(boots, "auc", col.key, level)
        if boot is not None:
            entry["auc"]["bootstrap"] = boot
    else:
        for b in betas:
            vals = {s: _as_float(c[b].get(col.key)) for s, c in curves.items()
                    if b in c}
            entry[f"{b:g}"] = S.summarize(vals)
            boot = _bootstrap_entry(boots, b, col.key, level)
            if boot is not None:
                entry[f"{b:g}"]["bootstrap"] = boot
    return entry


def _method_row(results: ResultSet, exp: dict, label: str, cols: Sequence[Column],
                betas: list[float], level: float | None) -> dict[str, Any]:
    """One method's row of an experiment's table: its metrics, curves, seeds and timing."""
    curves = method_curves(results, exp["name"], label)
    boots = method_intervals(results, exp["name"], label)
    complete = {s: c for s, c in curves.items() if all(b in c for b in betas)}
    metrics: dict[str, dict[str, Any]] = {}
    for col in cols:
        metrics[col.key] = _metric_entry(col, exp["report"], betas, curves, complete, boots,
                                         level)
    extra_keys = sorted(
        {k for c in curves.values() for p in c.values() for k in p}
        - {c.key for c in cols}
    )
    return {
        "method": label,
        "metrics": metrics,
        "curves": _curve_summary(curves, betas, [c.key for c in cols]),
        "extra_metrics": extra_keys,
        "seeds": sorted(curves),
        "timing": _timing(results, exp["name"], label),
    }


def _experiment_table(results: ResultSet, exp: dict) -> dict[str, Any]:
    """One experiment's table: its rows (best marked) and what the renderers show of it."""
    betas = [float(b) for b in exp["betas"]]
    level = _boot_level(results, exp["name"])
    cols = columns_for(exp)
    rows = [_method_row(results, exp, method["label"], cols, betas, level)
            for method in exp["methods"]]
    shared = any(c.get("shared_fit_rows") for c in results.cells
                 if c.get("experiment") == exp["name"])
    _mark_best(rows, test=not shared)
    return {
        "name": exp["name"],
        "report": exp["report"],
        "betas": betas,
        "train_beta": exp["train_beta"],
        "dataset": exp["dataset"]["name"],
        "backbone": exp["backbone"]["name"],
        "fit_split": exp["fit_split"],
        "eval_split": exp["eval_split"],
        "n_fit": exp["n_fit"],
        "coverage_guarantee": exp.get("coverage_guarantee"),
        **({"risk_guarantee": exp["risk_guarantee"]} if exp.get("risk_guarantee") else {}),
        **tuning_entry(results, exp),  # tuned experiments only
        **({"shared_fit_rows": True} if shared else {}),
        "metrics": [c.key for c in cols],
        "bootstrap_level": level,
        "rows": rows,
    }


def tables_from(results: ResultSet) -> dict[str, Any]:
    """Aggregate a :class:`~selbench.reporting.loading.ResultSet` into per-experiment tables
    (JSON-ready).

    A ``ranking`` metric (one value per cell, e.g. AURC) is summarised by that value in an
    ``auc`` table (by the AUC of its per-β values for ``per_beta`` experiments, where each
    β has a cell of its own). Each entry carries, under ``bootstrap``, the cells' bootstrap
    intervals over the evaluation examples (per seed, and the mean of their bounds)."""
    experiments = [_experiment_table(results, exp) for exp in results.experiments]
    specs = [s["spec"] for s in results.sources]
    tables = {
        "provenance": _provenance(results),
        "spec": specs[0] if len(specs) == 1 else specs,
        "statistics": {
            "summary": "mean and sample standard deviation (ddof=1) over seeds",
            "interval": S.INTERVAL_NAME,
            "test": S.TEST_NAME,
            "alpha": S.ALPHA,
            "min_seeds_for_test": S.MIN_SEEDS_FOR_TEST,
            "best": "best mean, or compared on >= min_seeds_for_test seeds with p_vs_best >= alpha",
            "bootstrap": "per cell: percentile bootstrap interval over the evaluation examples "
                         "(selbench.measure.bootstrap.selective_intervals); per method: each seed's "
                         "interval and the mean of their bounds",
        },
        "metrics": {key: metric_info(key)._asdict() for key in dict.fromkeys(
            k for e in experiments for k in e["metrics"])},
        "experiments": experiments,
    }
    summary = ranking.summarize(experiments)  # across experiments: None with fewer than two
    if summary is not None:
        asked, why_not = questions.questions_of(tables["spec"])  # the spec's pre-registered
        if asked is not None:
            summary["questions"] = questions.answer(experiments, asked)
        elif why_not is not None:
            summary["questions_note"] = why_not
        tables["summary"] = summary
    return tables


def build_tables(
    results_dirs: str | Path | Sequence[str | Path],
    *,
    allow_partial: bool = False,
    allow_mixed: bool = False,
    known: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Aggregate the cells of one or more results directories into tables (JSON-ready);
    ``known``: cell records the caller holds already (:func:`~selbench.reporting.loading.
    load_results`)."""
    return tables_from(load_results(results_dirs, allow_partial=allow_partial,
                                    allow_mixed=allow_mixed, known=known))


def _provenance(results: ResultSet) -> dict[str, Any]:
    cell_hashes = sorted({rec.get("spec_hash") or "unknown" for rec in results.cells})
    if len(results.sources) == 1:
        prov = dict(results.sources[0]["provenance"])
    else:
        first = results.sources[0]["provenance"]
        same = len({s["spec_hash"] for s in results.sources}) == 1
        prov = {
            "selbench": first["selbench"],
            "spec_name": " + ".join(dict.fromkeys(s["spec_name"] for s in results.sources)),
            "spec_hash": first["spec_hash"] if same else "mixed",
            "sources": [{"dir": s["dir"], "provenance": s["provenance"]} for s in results.sources],
        }
    prov["seeds"] = list(results.seeds)
    prov["cell_spec_hashes"] = cell_hashes
    mixed = bool(results.mixed) or len({s["spec_hash"] for s in results.sources}) > 1
    prov["mixed_spec_hashes"] = results.spec_hashes if mixed else []
    prov["cells"] = {"planned": results.planned, "left_out": results.left_out,
                     "tabulated": len(results.cells)}
    return prov


def _points(rows: list[dict], key: str) -> list[str]:
    return list(rows[0]["metrics"][key]) if rows else []


def _mark_best(rows: list[dict], test: bool = True) -> None:
    """Mark the best row(s) of every column; ``test=False`` (every seed fitted the same rows:
    no data variation to test over seeds) marks the best mean only, with no p-value."""
    for col in (Column.of(k) for k in (rows[0]["metrics"] if rows else ())):
        for point in _points(rows, col.key):
            stats = [r["metrics"][col.key][point] for r in rows]
            if col.lower_is_better is None:
                for st in stats:
                    st.update(best=False, best_mean=False, p_vs_best=None, n_pairs=None)
                continue
            per_method = {
                str(i): dict(zip(st["seeds"], st["values"])) for i, st in enumerate(stats)
            }
            verdict = S.compare_to_best(per_method, lower_is_better=col.lower_is_better)
            for i, st in enumerate(stats):
                st.update(verdict[str(i)])
                if not test:
                    st.update(best=st["best_mean"], p_vs_best=None, n_pairs=None)


# --------------------------------------------------------------------------- rendering
_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\|*_`<>[]"})


def _md(text: str) -> str:
    """``text`` safe inside a Markdown table cell: special characters escaped, one line."""
    return " ".join(str(text).split()).translate(_MD_SPECIAL)


def _fmt(stat: dict, bold: bool = True) -> str:
    if not math.isfinite(stat["mean"]):
        return "–"
    text = f"{stat['mean']:.3f}"
    if stat["n"] > 1:
        text += f" ± {stat['std']:.3f}"
    return f"**{text}**" if bold and stat.get("best") else text


def _fmt_p(stat: dict) -> str:
    if stat.get("best_mean"):
        return "best"
    p = stat.get("p_vs_best")
    if p is None:
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _stats_note(n_seeds: int, metric: str) -> str:
    if n_seeds <= 1:
        return ("One seed: no spread, interval or test is available; **bold** = best mean. "
                "Run more seeds for a paired comparison.")
    test = "one-sided Wilcoxon signed-rank test against the best mean, paired by seed"
    if n_seeds < S.MIN_SEEDS_FOR_TEST:
        return (f"**bold** = best mean. *p ({metric})*: {test}, shown for information only: "
                f"with {n_seeds} seeds it cannot reach p < {S.ALPHA:g} (smallest possible p = "
                f"2^-{n_seeds} = {2.0 ** -n_seeds:.3g}; {S.MIN_SEEDS_FOR_TEST} seeds are needed), "
                "so no other method is marked as tied with the best. "
                "95% t-intervals over seeds and bootstrap intervals over evaluation examples are "
            "in leaderboard.json and .csv.")
    return (f"**bold** = best mean, and every method not significantly worse than it: "
            f"p ≥ {S.ALPHA:g} in a {test} (*p ({metric})* shows it for {metric}). "
            "95% t-intervals over seeds and bootstrap intervals over evaluation examples are "
            "in leaderboard.json and .csv.")


def _part_seeds(prov: dict) -> str:
    """`` (dir a: seeds 0, 1, 2; dir b: seeds 0, 1, 2, 3, 4)`` when combined results
    directories were run with different seeds; else nothing."""
    parts = prov.get("sources") or []
    if len({tuple(s["provenance"]["seeds"]) for s in parts}) <= 1:
        return ""
    return " (" + "; ".join(f"{_md(s['dir'])}: seeds {', '.join(map(str, s['provenance']['seeds']))}"
                            for s in parts) + ")"


def _markdown_preamble(tables: dict) -> list[str]:
    """The Markdown's title, provenance line and statistics note, and the notes on mixed or
    partial results."""
    prov = tables["provenance"]
    seeds = prov["seeds"]
    hash_text = ("spec hashes " + ", ".join(f"`{short_hash(h)}`" for h in prov["mixed_spec_hashes"])
                 if prov["mixed_spec_hashes"] else f"spec hash `{short_hash(prov['spec_hash'])}`")
    lines = [
        f"# Leaderboard: {_md(prov['spec_name'])}",
        "",
        (f"selbench {prov['selbench']} · {hash_text} · seeds "
        f"{', '.join(map(str, seeds))}{_part_seeds(prov)} · values are mean ± std over seeds · "
        "↓ lower is better, ↑ higher is better"),
        "",
        _stats_note(len(seeds), _headline_label(tables)),
        "",
    ]
    if prov["mixed_spec_hashes"]:
        lines += [("**Mixed results**: this table combines cells computed for different specs "
                  f"({', '.join(short_hash(h) for h in prov['mixed_spec_hashes'])}), as asked with "
                  "--allow-mixed; see leaderboard.json for their provenance."), ""]
    if prov.get("cells", {}).get("left_out"):
        c = prov["cells"]
        lines += [(f"**Partial results**: {c['left_out']} of {c['planned']} cells are missing (or "
                  "were written for another spec) and left out (--allow-partial)."), ""]
    return lines


def _markdown_auc(exp: dict, cols: Sequence[Column], head: Column | None, exp_p: bool) -> list[str]:
    """An ``auc`` experiment's Markdown: what the areas are, and one table of them."""
    lo, hi = min(exp["betas"]), max(exp["betas"])
    lines = [(f"Area under each metric's curve over β ∈ [{lo:g}, {hi:g}] "
              f"({len(exp['betas'])} levels), normalised by the range."), ""]
    if any(c.kind == "ranking" for c in cols):
        names = ", ".join(c.label for c in cols if c.kind == "ranking")
        lines += [(f"{names}: once per cell over all evaluation examples, from the "
                   "selector's scores."), ""]
    headers = ["Method"] + [c.header for c in cols]
    if exp_p:
        headers.append(f"p ({head.label})")
    body = []
    for r in exp["rows"]:
        line = [_md(r["method"])] + [_fmt(r["metrics"][c.key]["auc"]) for c in cols]
        if exp_p:
            line.append(_fmt_p(r["metrics"][head.key]["auc"]))
        body.append(line)
    return lines + [tabulate(body, headers, tablefmt="github", disable_numparse=True), ""]


def _markdown_per_beta(exp: dict, cols: Sequence[Column], head: Column | None,
                       exp_p: bool) -> list[str]:
    """A ``per_beta`` experiment's Markdown: one table per metric over β, and the headline
    metric's p-values; the β-free (ranking) metrics once, in a table of their own
    (:func:`_markdown_beta_free`), unless each β has its own cells (``train_beta: per_beta``)."""
    lines: list[str] = []
    headers = ["Method"] + [f"β={b:g}" for b in exp["betas"]]
    once = [c for c in cols if c.kind == "ranking"] if exp["train_beta"] != "per_beta" else []
    for c in cols:
        if c in once:
            continue
        lines += [f"### {c.header} at coverage β", ""]
        body = [[_md(r["method"])] + [_fmt(r["metrics"][c.key][f"{b:g}"]) for b in exp["betas"]]
                for r in exp["rows"]]
        lines += [tabulate(body, headers, tablefmt="github", disable_numparse=True), ""]
        if exp_p and c.key == head.key:
            lines += [f"### p-value against the best mean, {c.label}", ""]
            body = [[_md(r["method"])] + [_fmt_p(r["metrics"][c.key][f"{b:g}"])
                                     for b in exp["betas"]] for r in exp["rows"]]
            lines += [tabulate(body, headers, tablefmt="github", disable_numparse=True), ""]
    return lines + (_markdown_beta_free(exp, once, head, exp_p) if once else [])


def _markdown_beta_free(exp: dict, once: Sequence[Column], head: Column | None,
                        exp_p: bool) -> list[str]:
    """The ranking metrics of a ``report: betas`` table, shown once: one value per cell from
    the selector's scores over all evaluation examples, the same at every β."""
    point = f"{exp['betas'][0]:g}"
    with_p = exp_p and head in once
    headers = ["Method"] + [c.header for c in once] + ([f"p ({head.label})"] if with_p else [])
    body = [[_md(r["method"])] + [_fmt(r["metrics"][c.key][point]) for c in once]
            + ([_fmt_p(r["metrics"][head.key][point])] if with_p else []) for r in exp["rows"]]
    names = ", ".join(c.label for c in once)
    return [f"### {names}: the same at every coverage β", "",
            (f"{names}: once per cell over all evaluation examples, from the selector's "
             "scores (not a function of β)."), "",
            tabulate(body, headers, tablefmt="github", disable_numparse=True), ""]


def render_markdown(tables: dict) -> str:
    lines = _markdown_preamble(tables)
    show_p = len(tables["provenance"]["seeds"]) > 1
    for exp in tables["experiments"]:
        cols = columns_for(exp)
        head = headline(cols)
        exp_p = show_p and head is not None
        tb = exp["train_beta"]
        trained = "one model per β" if tb == "per_beta" else f"selectors trained for β = {tb:g}"
        lines += [
            f"## {_md(exp['name'])}",
            "",
            f"{_md(exp['dataset'])} / {_md(exp['backbone'])}: fitted on `{exp['fit_split']}`"
            + (f" ({exp['n_fit']} examples per seed)" if exp["n_fit"] else "")
            + f", evaluated on `{exp['eval_split']}`; {trained}.",
            "",
        ]
        if exp.get("tuning"):
            lines += [tuning_line(exp["tuning"], tb), ""]
        if exp.get("shared_fit_rows"):
            lines += [("**Every seed fits the same rows** (n_fit unset or the whole fitting "
                       "split): the seeds vary only the methods' own randomness, so no "
                       "significance test is shown and bold marks the best mean only."), ""]
        if exp["coverage_guarantee"]:
            lines += [(f"Coverage guaranteed with probability ≥ 1 − δ, δ = "
                      f"{exp['coverage_guarantee']['delta']:g} (Hoeffding)."), ""]
        if exp.get("risk_guarantee"):
            rg = exp["risk_guarantee"]
            lines += [(f"Selective risk guaranteed ≤ r = {rg['risk']:g} with probability ≥ 1 − δ, "
                       f"δ = {rg['delta']:g}: SGR's threshold (binomial tail, union bound) from "
                       "each seed's fitting rows, measured on the evaluation data."), ""]
        if exp["report"] == "auc":
            lines += _markdown_auc(exp, cols, head, exp_p)
        else:
            lines += _markdown_per_beta(exp, cols, head, exp_p)
    lines += cost.markdown(tables)  # only where the spec asks (cost: true)
    if tables.get("summary") is not None:
        lines += ranking.markdown_section(tables["summary"])
        lines += questions.markdown(tables["summary"].get("questions"),
                                    tables["summary"].get("questions_note"))
    return "\n".join(lines).rstrip() + "\n"


CSV_HEADER = ["experiment", "method", "metric", "point", "mean", "std", "ci95_low", "ci95_high",
              "n_seeds", "p_vs_best", "best", "best_mean", "boot_level", "boot_low_mean",
              "boot_high_mean"]


def _headline_label(tables: dict) -> str:
    for exp in tables["experiments"]:
        head = headline(columns_for(exp))
        if head is not None:
            return head.label
    return "–"


def render_csv(tables: dict) -> str:
    """One row per experiment × method × metric × point (a β, or ``auc``). ``ci95_*``: the
    t-interval over seeds; ``boot_*``: the mean over seeds of each cell's bootstrap interval
    over the evaluation examples at ``boot_level`` (empty when the run drew none)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for exp in tables["experiments"]:
        for r in exp["rows"]:
            for c in columns_for(exp):
                for point, stat in r["metrics"][c.key].items():
                    ci = stat.get("ci95") or ["", ""]
                    p = stat.get("p_vs_best")
                    boot = stat.get("bootstrap")
                    boot_cols = ([repr(boot["level"]), repr(boot["low_mean"]),
                                  repr(boot["high_mean"])] if boot else ["", "", ""])
                    writer.writerow([exp["name"], r["method"], c.key, point,
                                     repr(stat["mean"]), repr(stat["std"]),
                                     repr(ci[0]) if ci[0] != "" else "",
                                     repr(ci[1]) if ci[1] != "" else "",
                                     stat["n"], "" if p is None else repr(p),
                                     int(bool(stat.get("best"))), int(bool(stat.get("best_mean"))),
                                     *boot_cols])
    writer.writerows(cost.csv_rows(tables))  # only where the spec asks (cost: true)
    return buf.getvalue()


def write_leaderboard(
    results_dirs: str | Path | Sequence[str | Path],
    *,
    out: str | Path | None = None,
    allow_partial: bool = False,
    allow_mixed: bool = False,
    known: Mapping[str, Any] | None = None,
    html: bool = True,
) -> list[Path]:
    """(Re)write ``leaderboard.md``, ``.csv``, ``.json`` and ``.html`` from the cells of results
    directories.

    Args:
        results_dirs: one results directory, or several to combine in one table.
        out: where to write; default the results directory (required for several).
        allow_partial: tabulate the finished cells when some are missing.
        allow_mixed: combine cells / directories of different spec hashes.
        known: the cell records (by absolute path) the caller has just written or verified:
            taken as they are instead of being read and verified again (the runner's).
        html: also write the page (:mod:`selbench.reporting.html`), with the figures found
            under ``out/plots`` (the runner writes it after drawing them).
    """
    dirs = [Path(results_dirs)] if isinstance(results_dirs, (str, Path)) else [Path(d) for d in results_dirs]
    if out is None:
        if len(dirs) != 1:
            raise LeaderboardError("several results directories are combined: say where to "
                                   "write the leaderboard with --out DIR")
        out = dirs[0]
    out = Path(out)
    tables = build_tables(dirs, allow_partial=allow_partial, allow_mixed=allow_mixed,
                          known=known)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "leaderboard.md", out / "leaderboard.csv", out / "leaderboard.json"]
    atomic_write_text(paths[0], render_markdown(tables))
    atomic_write_text(paths[1], render_csv(tables))
    atomic_write_json(paths[2], tables)
    if html:
        paths.append(write_page(out, tables))
    return paths
