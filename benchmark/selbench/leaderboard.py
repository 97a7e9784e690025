"""Leaderboards: per-experiment tables of mean ± std over seeds, as Markdown, CSV and JSON.

The tables are built only from the cell files of a results directory (``cells/``) and its
``run.json`` manifest, so ``selbench leaderboard DIR`` re-renders them without recomputing
anything. The core owns the columns: ECE₁, ECE₂, Brier and accuracy (best marked) plus the
achieved coverage, either at each coverage level β (``report: betas``) or as the area
under the metric-vs-β curve (``report: auc``, see :func:`selbench.metrics.auc`).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tabulate import tabulate

from selbench.metrics import auc
from selbench.store import atomic_write_json, atomic_write_text

__all__ = ["COLUMNS", "LeaderboardError", "build_tables", "write_leaderboard"]


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    lower_is_better: bool | None  # None: shown, never marked best

    @property
    def header(self) -> str:
        arrow = "" if self.lower_is_better is None else (" ↓" if self.lower_is_better else " ↑")
        return self.label + arrow


COLUMNS: tuple[Column, ...] = (
    Column("ece1", "ECE₁", True),
    Column("ece2", "ECE₂", True),
    Column("brier", "Brier", True),
    Column("accuracy", "Acc.", False),
    Column("coverage", "Coverage", None),
)


class LeaderboardError(RuntimeError):
    """The results directory is incomplete or inconsistent."""


def _load_run(out_dir: Path) -> dict:
    path = out_dir / "run.json"
    if not path.is_file():
        raise LeaderboardError(f"{out_dir}: no run.json; is this a selbench results directory?")
    return json.loads(path.read_text())


def _load_cells(out_dir: Path, run: dict, allow_partial: bool) -> list[dict]:
    cells, missing = [], []
    for rel, key in zip(run["cells"], run["cell_keys"]):
        path = out_dir / rel
        record = json.loads(path.read_text()) if path.is_file() else None
        if record is None or record.get("key") != key:
            missing.append(rel)
            continue
        cells.append(record)
    if missing and not allow_partial:
        raise LeaderboardError(
            f"{out_dir}: {len(missing)} of {len(run['cells'])} cells are missing or stale "
            f"(first: {missing[0]}); run `selbench run` again to finish them"
        )
    return cells


def _stats(values: list[float]) -> dict[str, Any]:
    arr = np.asarray(values, dtype=float)
    return {
        "mean": float(arr.mean()) if arr.size else float("nan"),
        "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
        "n": int(arr.size),
        "values": [float(v) for v in arr],
    }


def build_tables(out_dir: str | Path, *, allow_partial: bool = False) -> dict[str, Any]:
    """Aggregate the cells of ``out_dir`` into per-experiment tables (JSON-ready)."""
    out_dir = Path(out_dir)
    run = _load_run(out_dir)
    cells = _load_cells(out_dir, run, allow_partial)
    spec = run["spec"]
    experiments = []
    for exp in spec["experiments"]:
        betas = [float(b) for b in exp["betas"]]
        report = exp["report"]
        rows = []
        for method in exp["methods"]:
            label = method["label"]
            # curves[seed][beta] = {metric: value}
            curves: dict[int, dict[float, dict[str, float]]] = {}
            for rec in cells:
                if rec["experiment"] != exp["name"] or rec["method"] != label:
                    continue
                for b_i, b in enumerate(rec["betas"]):
                    point = {k: v[b_i] for k, v in rec["metrics"].items()}
                    curves.setdefault(rec["seed"], {})[float(b)] = point
            metrics: dict[str, dict[str, Any]] = {}
            for col in COLUMNS:
                entry: dict[str, Any] = {}
                complete = {s: c for s, c in curves.items() if all(b in c for b in betas)}
                if report == "auc":
                    per_seed = [
                        auc(betas, [complete[s][b][col.key] for b in betas]) for s in sorted(complete)
                    ]
                    entry["auc"] = _stats(per_seed)
                else:
                    for b in betas:
                        vals = [curves[s][b][col.key] for s in sorted(curves) if b in curves[s]]
                        entry[f"{b:g}"] = _stats(vals)
                metrics[col.key] = entry
            extra_keys = sorted(
                {k for c in curves.values() for p in c.values() for k in p}
                - {c.key for c in COLUMNS}
            )
            rows.append({"method": label, "metrics": metrics, "extra_metrics": extra_keys,
                         "seeds": sorted(curves)})
        _mark_best(rows)
        experiments.append(
            {
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
                "rows": rows,
            }
        )
    return {"provenance": run["provenance"], "experiments": experiments}


def _mark_best(rows: list[dict]) -> None:
    for col in COLUMNS:
        if not rows:
            continue
        for point in rows[0]["metrics"][col.key]:
            means = np.array([r["metrics"][col.key][point]["mean"] for r in rows], dtype=float)
            finite = np.isfinite(means)
            for r_i, r in enumerate(rows):
                best = False
                if col.lower_is_better is not None and finite.any() and finite[r_i]:
                    target = means[finite].min() if col.lower_is_better else means[finite].max()
                    best = bool(np.isclose(means[r_i], target, rtol=0, atol=1e-12))
                r["metrics"][col.key][point]["best"] = best


def _fmt(stat: dict, bold: bool) -> str:
    if not np.isfinite(stat["mean"]):
        return "–"
    text = f"{stat['mean']:.3f}"
    if stat["n"] > 1:
        text += f" ± {stat['std']:.3f}"
    return f"**{text}**" if bold and stat.get("best") else text


def render_markdown(tables: dict) -> str:
    prov = tables["provenance"]
    lines = [
        f"# Leaderboard: {prov['spec_name']}",
        "",
        f"selbench {prov['selbench']} · spec hash `{prov['spec_hash'][:12]}` · seeds "
        f"{', '.join(map(str, prov['seeds']))} · values are mean ± std over seeds · "
        "**bold** = best mean · ↓ lower is better, ↑ higher is better",
        "",
    ]
    for exp in tables["experiments"]:
        tb = exp["train_beta"]
        trained = "one model per β" if tb == "per_beta" else f"selectors trained for β = {tb:g}"
        lines += [
            f"## {exp['name']}",
            "",
            f"{exp['dataset']} / {exp['backbone']}: fitted on `{exp['fit_split']}`"
            + (f" ({exp['n_fit']} examples per seed)" if exp["n_fit"] else "")
            + f", evaluated on `{exp['eval_split']}`; {trained}.",
            "",
        ]
        if exp["coverage_guarantee"]:
            lines += [f"Coverage guaranteed with probability ≥ 1 − δ, δ = "
                      f"{exp['coverage_guarantee']['delta']:g} (Hoeffding).", ""]
        if exp["report"] == "auc":
            lo, hi = min(exp["betas"]), max(exp["betas"])
            lines += [f"Area under each metric's curve over β ∈ [{lo:g}, {hi:g}] "
                      f"({len(exp['betas'])} levels), normalised by the range.", ""]
            headers = ["Method"] + [c.header for c in COLUMNS]
            body = [[r["method"]] + [_fmt(r["metrics"][c.key]["auc"], True) for c in COLUMNS]
                    for r in exp["rows"]]
            lines += [tabulate(body, headers, tablefmt="github", disable_numparse=True), ""]
        else:
            for c in COLUMNS:
                lines += [f"### {c.header} at coverage β", ""]
                headers = ["Method"] + [f"β={b:g}" for b in exp["betas"]]
                body = [[r["method"]] + [_fmt(r["metrics"][c.key][f"{b:g}"], True)
                                         for b in exp["betas"]] for r in exp["rows"]]
                lines += [tabulate(body, headers, tablefmt="github", disable_numparse=True), ""]
    return "\n".join(lines).rstrip() + "\n"


def render_csv(tables: dict) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["experiment", "method", "metric", "point", "mean", "std", "n_seeds", "best"])
    for exp in tables["experiments"]:
        for r in exp["rows"]:
            for c in COLUMNS:
                for point, stat in r["metrics"][c.key].items():
                    writer.writerow([exp["name"], r["method"], c.key, point,
                                     repr(stat["mean"]), repr(stat["std"]), stat["n"],
                                     int(bool(stat.get("best")))])
    return buf.getvalue()


def write_leaderboard(out_dir: str | Path, *, allow_partial: bool = False) -> list[Path]:
    """(Re)write ``leaderboard.md``, ``.csv`` and ``.json`` in ``out_dir`` from its cells."""
    out_dir = Path(out_dir)
    tables = build_tables(out_dir, allow_partial=allow_partial)
    paths = [out_dir / "leaderboard.md", out_dir / "leaderboard.csv", out_dir / "leaderboard.json"]
    atomic_write_text(paths[0], render_markdown(tables))
    atomic_write_text(paths[1], render_csv(tables))
    atomic_write_json(paths[2], tables)
    return paths
