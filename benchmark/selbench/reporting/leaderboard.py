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

The Markdown holds no dates or timings, so an interrupted-and-resumed run renders it byte for
byte like an uninterrupted one; the JSON carries the full provenance (dates, versions, device,
timings).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tabulate import tabulate

from selbench.measure import stats as S
from selbench.measure.metrics import DEFAULT_COLUMNS, auc, metric_info
from selbench.store.results import ResultsDir, ResultsError
from selbench.util.files import atomic_write_json, atomic_write_text

__all__ = [
    "Column",
    "LeaderboardError",
    "ResultSet",
    "build_tables",
    "columns_for",
    "headline",
    "load_results",
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
            ["guaranteed_coverage"] if exp.get("coverage_guarantee") else [])
    return tuple(Column.of(k) for k in keys)


def headline(columns: Sequence[Column]) -> Column | None:
    """The column whose p-values the Markdown shows: the first one marked best."""
    return next((c for c in columns if c.lower_is_better is not None), None)


class LeaderboardError(RuntimeError):
    """The results directory is incomplete or inconsistent."""


# --------------------------------------------------------------------------- loading
@dataclass
class ResultSet:
    """Cells of one or more results directories, checked and merged.

    ``cells`` are the cell records (as in the JSON files) with one extra key, ``_file``: the
    :class:`~pathlib.Path` of the cell file (its per-example ``.npz``, when the runner wrote
    one, sits next to it).
    """

    sources: list[dict[str, Any]]
    experiments: list[dict[str, Any]]
    cells: list[dict[str, Any]]
    seeds: list[int]
    mixed: list[str] = field(default_factory=list)  # spec hashes mixed in, when allowed
    left_out: int = 0  # cells of the specs that are missing (or foreign) and left out
    planned: int = 0  # cells the specs call for

    @property
    def spec_hashes(self) -> list[str]:
        hashes = [s["spec_hash"] for s in self.sources] + self.mixed
        return list(dict.fromkeys(hashes))


def _short(h: str | None) -> str:
    return (h or "unknown")[:12]


def _load_dir(
    out_dir: Path, allow_partial: bool, allow_mixed: bool
) -> tuple[dict, list[dict], list[str], int]:
    """run.json, the usable cells, the spec hashes of foreign cells taken in, cells left out.

    Cells are read through :class:`selbench.store.results.ResultsDir`, which verifies each
    record's checksum (and its arrays'): a damaged cell counts as missing, never as data.
    """
    store = ResultsDir(out_dir)
    try:
        run = store.read_run().model_dump(mode="json")
    except ResultsError as exc:
        raise LeaderboardError(str(exc)) from None
    current = run["provenance"].get("spec_hash")
    cells: list[dict] = []
    missing: list[str] = []
    damaged: list[str] = []
    foreign: list[tuple[str, dict]] = []
    for rel, key in zip(run["cells"], run["cell_keys"]):
        path = store.resolve(rel)
        check = store.check_cell(path, key)
        if check.record is not None:
            cells.append({**check.record.model_dump(mode="json"), "_file": path})
        elif check.previous is not None:
            foreign.append((rel, check.previous.model_dump(mode="json")))
        else:
            missing.append(rel)
            if check.problem != "missing":
                damaged.append(f"{rel} ({check.problem})")
    if foreign and not allow_mixed and not allow_partial:
        hashes = sorted({_short(r.get("spec_hash")) for _, r in foreign})
        raise LeaderboardError(
            f"{out_dir}: {len(foreign)} of {len(run['cells'])} cells under cells/ were written for "
            f"a different spec (spec hash {', '.join(hashes)}) than run.json's (spec hash "
            f"{_short(current)}), first: {foreign[0][0]}. Rerun `selbench run` with the spec to "
            "recompute them, pass --allow-mixed to tabulate them anyway (the outputs will say "
            "so), or --allow-partial to leave them out"
        )
    mixed_in: list[str] = []
    if foreign and allow_mixed:
        for rel, record in foreign:
            cells.append({**record, "_file": store.resolve(rel)})
            mixed_in.append(record.get("spec_hash") or "unknown")
    elif foreign:  # allow_partial: foreign cells are left out like missing ones
        missing.extend(rel for rel, _ in foreign)
    if missing and not allow_partial:
        detail = f"; damaged: {damaged[0]}" if damaged else ""
        raise LeaderboardError(
            f"{out_dir}: {len(missing)} of {len(run['cells'])} cells are missing or damaged "
            f"(first: {missing[0]}{detail}); run `selbench run` again to recompute them, or pass "
            "--allow-partial to tabulate the intact ones"
        )
    return run, cells, sorted(set(mixed_in)), len(missing)


def _cell_id(rec: dict) -> tuple:
    return (rec["experiment"], rec["method"], int(rec["seed"]), float(rec["train_beta"]))


def load_results(
    results_dirs: str | Path | Sequence[str | Path],
    *,
    allow_partial: bool = False,
    allow_mixed: bool = False,
) -> ResultSet:
    """Load and check the cells of one or more results directories.

    Raises :class:`LeaderboardError` when cells are missing (unless ``allow_partial``), when
    cells or directories of different spec hashes would be combined (unless
    ``allow_mixed``), and when two directories hold different results for the same
    experiment, method, seed and training β (always: which one to show is ambiguous).
    """
    dirs = [Path(results_dirs)] if isinstance(results_dirs, (str, Path)) else [Path(d) for d in results_dirs]
    if not dirs:
        raise LeaderboardError("no results directory given")
    loaded = [(d, *_load_dir(d, allow_partial, allow_mixed)) for d in dirs]
    hashes = {run["provenance"]["spec_hash"] for _, run, _, _, _ in loaded}
    if len(hashes) > 1 and not allow_mixed:
        listing = ", ".join(f"{d} (spec hash {_short(run['provenance']['spec_hash'])})"
                            for d, run, _, _, _ in loaded)
        raise LeaderboardError(
            f"the results directories were run with different specs: {listing}. Pass "
            "--allow-mixed to combine them in one table anyway (the outputs will say so)"
        )
    sources, experiments, cells, seeds, mixed = [], [], [], [], []
    by_name: dict[str, dict] = {}
    seen: dict[tuple, tuple[str, Path]] = {}
    left_out = sum(n for *_, n in loaded)
    planned = sum(len(run["cells"]) for _, run, *_ in loaded)
    for d, run, dir_cells, mixed_in, _ in loaded:
        prov = run["provenance"]
        sources.append({"dir": str(d), "spec_name": prov["spec_name"],
                        "spec_hash": prov["spec_hash"], "provenance": prov, "spec": run["spec"]})
        mixed.extend(mixed_in)
        for s in prov["seeds"]:
            if s not in seeds:
                seeds.append(s)
        for exp in run["spec"]["experiments"]:
            if exp["name"] not in by_name:
                exp = json.loads(json.dumps(exp))  # a copy we may extend
                by_name[exp["name"]] = exp
                experiments.append(exp)
            else:
                known = {m["label"] for m in by_name[exp["name"]]["methods"]}
                by_name[exp["name"]]["methods"] += [m for m in exp["methods"] if m["label"] not in known]
        for rec in dir_cells:
            ident = _cell_id(rec)
            if ident in seen:
                if seen[ident][0] == rec.get("key"):
                    continue  # the very same computation, found twice
                raise LeaderboardError(
                    f"{seen[ident][1]} and {rec['_file']} hold different results for experiment "
                    f"{ident[0]!r}, method {ident[1]!r}, seed {ident[2]}, training β {ident[3]:g} "
                    "(their content keys differ); leave one of the directories out"
                )
            seen[ident] = (rec.get("key"), rec["_file"])
            cells.append(rec)
    for rec in cells:
        if rec["seed"] not in seeds:
            seeds.append(rec["seed"])
    mixed = sorted(set(mixed))
    return ResultSet(sources, experiments, cells, seeds, mixed, left_out, planned)


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
    fit, ev, devices = [], [], set()
    for rec in results.cells:
        if rec["experiment"] == experiment and rec["method"] == method:
            t = rec.get("timing") or {}
            fit.append(float(t.get("fit_s", float("nan"))))
            ev.append(float(t.get("eval_s", float("nan"))))
            if rec.get("device"):
                devices.add(rec["device"])
    return {
        "cells": len(fit),
        # cells record seconds to 1e-4; 6 decimals keep the means free of float noise
        "fit_s_mean": round(float(np.mean(fit)), 6) if fit else None,
        "fit_s_total": round(float(np.sum(fit)), 6) if fit else None,
        "eval_s_mean": round(float(np.mean(ev)), 6) if ev else None,
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


def tables_from(results: ResultSet) -> dict[str, Any]:
    """Aggregate a :class:`ResultSet` into per-experiment tables (JSON-ready).

    A ``ranking`` metric (one value per cell, e.g. AURC) is summarised by that value in an
    ``auc`` table (by the AUC of its per-β values for ``per_beta`` experiments, where each
    β has a cell of its own). Each entry carries, under ``bootstrap``, the cells' bootstrap
    intervals over the evaluation examples (per seed, and the mean of their bounds)."""
    experiments = []
    for exp in results.experiments:
        betas = [float(b) for b in exp["betas"]]
        report = exp["report"]
        level = _boot_level(results, exp["name"])
        cols = columns_for(exp)
        rows = []
        for method in exp["methods"]:
            label = method["label"]
            curves = method_curves(results, exp["name"], label)
            boots = method_intervals(results, exp["name"], label)
            complete = {s: c for s, c in curves.items() if all(b in c for b in betas)}
            metrics: dict[str, dict[str, Any]] = {}
            for col in cols:
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
                metrics[col.key] = entry
            extra_keys = sorted(
                {k for c in curves.values() for p in c.values() for k in p}
                - {c.key for c in cols}
            )
            rows.append({
                "method": label,
                "metrics": metrics,
                "curves": _curve_summary(curves, betas, [c.key for c in cols]),
                "extra_metrics": extra_keys,
                "seeds": sorted(curves),
                "timing": _timing(results, exp["name"], label),
            })
        _mark_best(rows)
        experiments.append({
            "name": exp["name"],
            "report": report,
            "betas": betas,
            "train_beta": exp["train_beta"],
            "dataset": exp["dataset"]["name"],
            "backbone": exp["backbone"]["name"],
            "fit_split": exp["fit_split"],
            "eval_split": exp["eval_split"],
            "n_fit": exp["n_fit"],
            "coverage_guarantee": exp.get("coverage_guarantee"),
            "metrics": [c.key for c in cols],
            "bootstrap_level": level,
            "rows": rows,
        })
    specs = [s["spec"] for s in results.sources]
    return {
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


def build_tables(
    results_dirs: str | Path | Sequence[str | Path],
    *,
    allow_partial: bool = False,
    allow_mixed: bool = False,
) -> dict[str, Any]:
    """Aggregate the cells of one or more results directories into tables (JSON-ready)."""
    return tables_from(load_results(results_dirs, allow_partial=allow_partial, allow_mixed=allow_mixed))


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


def _mark_best(rows: list[dict]) -> None:
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


def render_markdown(tables: dict) -> str:
    prov = tables["provenance"]
    seeds = prov["seeds"]
    hash_text = ("spec hashes " + ", ".join(f"`{_short(h)}`" for h in prov["mixed_spec_hashes"])
                 if prov["mixed_spec_hashes"] else f"spec hash `{_short(prov['spec_hash'])}`")
    lines = [
        f"# Leaderboard: {_md(prov['spec_name'])}",
        "",
        (f"selbench {prov['selbench']} · {hash_text} · seeds "
        f"{', '.join(map(str, seeds))} · values are mean ± std over seeds · "
        "↓ lower is better, ↑ higher is better"),
        "",
        _stats_note(len(seeds), _headline_label(tables)),
        "",
    ]
    if prov["mixed_spec_hashes"]:
        lines += [("**Mixed results**: this table combines cells computed for different specs "
                  f"({', '.join(_short(h) for h in prov['mixed_spec_hashes'])}), as asked with "
                  "--allow-mixed; see leaderboard.json for their provenance."), ""]
    if prov.get("cells", {}).get("left_out"):
        c = prov["cells"]
        lines += [(f"**Partial results**: {c['left_out']} of {c['planned']} cells are missing (or "
                  "were written for another spec) and left out (--allow-partial)."), ""]
    show_p = len(seeds) > 1
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
        if exp["coverage_guarantee"]:
            lines += [(f"Coverage guaranteed with probability ≥ 1 − δ, δ = "
                      f"{exp['coverage_guarantee']['delta']:g} (Hoeffding)."), ""]
        if exp["report"] == "auc":
            lo, hi = min(exp["betas"]), max(exp["betas"])
            lines += [(f"Area under each metric's curve over β ∈ [{lo:g}, {hi:g}] "
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
            lines += [tabulate(body, headers, tablefmt="github", disable_numparse=True), ""]
        else:
            headers = ["Method"] + [f"β={b:g}" for b in exp["betas"]]
            for c in cols:
                lines += [f"### {c.header} at coverage β", ""]
                body = [[_md(r["method"])] + [_fmt(r["metrics"][c.key][f"{b:g}"]) for b in exp["betas"]]
                        for r in exp["rows"]]
                lines += [tabulate(body, headers, tablefmt="github", disable_numparse=True), ""]
                if exp_p and c.key == head.key:
                    lines += [f"### p-value against the best mean, {c.label}", ""]
                    body = [[_md(r["method"])] + [_fmt_p(r["metrics"][c.key][f"{b:g}"])
                                             for b in exp["betas"]] for r in exp["rows"]]
                    lines += [tabulate(body, headers, tablefmt="github", disable_numparse=True), ""]
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
    return buf.getvalue()


def write_leaderboard(
    results_dirs: str | Path | Sequence[str | Path],
    *,
    out: str | Path | None = None,
    allow_partial: bool = False,
    allow_mixed: bool = False,
) -> list[Path]:
    """(Re)write ``leaderboard.md``, ``.csv`` and ``.json`` from the cells of results directories.

    Args:
        results_dirs: one results directory, or several to combine in one table.
        out: where to write; default the results directory (required for several).
        allow_partial: tabulate the finished cells when some are missing.
        allow_mixed: combine cells / directories of different spec hashes.
    """
    dirs = [Path(results_dirs)] if isinstance(results_dirs, (str, Path)) else [Path(d) for d in results_dirs]
    if out is None:
        if len(dirs) != 1:
            raise LeaderboardError("several results directories are combined: say where to "
                                   "write the leaderboard with --out DIR")
        out = dirs[0]
    out = Path(out)
    tables = build_tables(dirs, allow_partial=allow_partial, allow_mixed=allow_mixed)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "leaderboard.md", out / "leaderboard.csv", out / "leaderboard.json"]
    atomic_write_text(paths[0], render_markdown(tables))
    atomic_write_text(paths[1], render_csv(tables))
    atomic_write_json(paths[2], tables)
    return paths
