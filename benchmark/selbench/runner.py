"""The runner: spec -> cached backbone outputs -> fitted methods -> metrics -> leaderboard.

For each experiment the backbone outputs of the fitting and evaluation splits come from the
on-disk cache (computed once per dataset + backbone configuration + split). Then each
*cell* — one method × seed (× training β when ``train_beta: per_beta``) — is fitted on a
seeded sample of ``n_fit`` fitting examples, scored on the evaluation data, thresholded at
each coverage β, and measured. Every finished cell is written atomically to
``OUT/cells/...``, keyed by a hash of everything that determines it, so an interrupted run
picks up where it stopped and a changed method recomputes only its own cells.

The runner knows nothing about individual plugins: it builds them from the registry and
drives them through the interfaces in :mod:`selbench.api`.
"""

from __future__ import annotations

import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import yaml

import selbench
from selbench.api import FitContext
from selbench.data import DataError, ModelOutputs
from selbench.metrics import selective_metrics
from selbench.spec import ExperimentSpec, MethodSpec, ResolvedSpec, content_hash, load_spec
from selbench.store import OutputCache, atomic_path, atomic_write_json, atomic_write_text

__all__ = ["CELL_FORMAT", "RunReport", "resolve_device", "run"]

CELL_FORMAT = 1


class RunError(RuntimeError):
    """A plugin misbehaved or data does not fit the spec; the message says which and where."""


@dataclass
class RunReport:
    out_dir: Path
    computed: int = 0
    reused: int = 0
    files: list[Path] = field(default_factory=list)


def resolve_device(requested: str = "auto") -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; ``cuda`` without one is an error."""
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RunError("--device cuda was requested but torch sees no CUDA device")
    if requested not in ("cpu", "cuda"):
        raise RunError(f"unknown device {requested!r}; expected auto, cpu or cuda")
    return requested


def slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower() or "method"
    return f"{s[:48]}-{content_hash(text)[:6]}"


def provenance(resolved: ResolvedSpec, device: str) -> dict[str, Any]:
    """Versions, configuration and machine: what a reader needs to trust a number."""
    import torch

    return {
        "selbench": selbench.__version__,
        "plugins": resolved.registry.providers(),
        "plugin_versions": _plugin_versions(resolved),
        "spec_name": resolved.spec.name,
        "spec_hash": resolved.hash(),
        "spec_source": resolved.source,
        "seeds": list(resolved.spec.seeds),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "device_name": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor()
        or platform.machine(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "git_commit": _git_commit(),
    }


def _plugin_versions(resolved: ResolvedSpec) -> dict[str, dict[str, str | None]]:
    """``kind/name`` -> provider and version, for every plugin the spec uses."""
    used: dict[str, dict[str, str | None]] = {}
    for exp in resolved.spec.experiments:
        comps = [("dataset", exp.dataset), ("backbone", exp.backbone)]
        for m in exp.methods:
            comps += [("scheme", m.scheme), ("selector", m.selector), ("recalibrator", m.recalibrator)]
            comps += [("loss", c) for c in (m.loss, m.coverage) if c is not None]
        for kind, comp in comps:
            reg = resolved.registry.get(kind, comp.name)
            used[f"{kind}/{comp.name}"] = {"provider": reg.provider, "version": reg.plugin.version}
    return dict(sorted(used.items()))


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    if out.returncode != 0 or not commit:
        return None
    dirty = subprocess.run(
        ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, timeout=5, check=False,
    ).stdout.strip()
    return commit + ("-dirty" if dirty else "")


# --------------------------------------------------------------------------- outputs
def experiment_outputs(
    resolved: ResolvedSpec,
    e_i: int,
    cache: OutputCache,
    device: str,
    progress: bool,
) -> dict[str, ModelOutputs]:
    """Backbone outputs of the experiment's fitting and evaluation splits, via the cache."""
    exp = resolved.spec.experiments[e_i]
    canon = resolved.canonical()["experiments"][e_i]
    reg = resolved.registry
    versions = {
        "dataset": reg.get("dataset", exp.dataset.name).plugin.version,
        "backbone": reg.get("backbone", exp.backbone.name).plugin.version,
    }
    dataset = backbone = None
    out: dict[str, ModelOutputs] = {}
    for split in dict.fromkeys([exp.fit_split, exp.eval_split]):
        material = OutputCache.key_material(canon["dataset"], canon["backbone"], split, versions)
        key = content_hash(material)
        cached = cache.get(key)
        if cached is None:
            if dataset is None:
                dataset = resolved.build("dataset", exp.dataset)
                backbone = resolved.build("backbone", exp.backbone)
                available = list(dataset.splits())
                for which, name in (("fit_split", exp.fit_split), ("eval_split", exp.eval_split)):
                    if name not in available:
                        raise RunError(
                            f"experiments[{e_i}].{which}: dataset {exp.dataset.name!r} has no split "
                            f"{name!r}; available: {', '.join(available)}"
                        )
            ctx = FitContext(
                seed=0, device=device, beta=1.0, progress=progress, cache_dir=cache.workdir(key)
            )
            if progress:
                print(f"[{exp.name}] extracting {exp.backbone.name} outputs on split {split!r}",
                      file=sys.stderr)
            try:
                outputs = backbone.extract(dataset, split, ctx)
            except (DataError, ValueError) as exc:
                raise RunError(
                    f"experiments[{e_i}] ({exp.name}): backbone {exp.backbone.name!r} on dataset "
                    f"{exp.dataset.name!r}, split {split!r}: {exc}"
                ) from exc
            if not isinstance(outputs, ModelOutputs):
                raise RunError(
                    f"backbone {exp.backbone.name!r}.extract returned "
                    f"{type(outputs).__name__}, expected selbench.ModelOutputs"
                )
            cache.put(key, outputs, material)
            cached = outputs
        out[split] = cached
    return out


# --------------------------------------------------------------------------- cells
@dataclass
class Cell:
    e_i: int
    m_i: int
    seed: int
    train_beta: float
    eval_betas: list[float]
    key: str
    path: Path


def plan_cells(resolved: ResolvedSpec, out_dir: Path) -> list[Cell]:
    """Every cell of the spec, each with the content key that decides whether it is reused."""
    canon = resolved.canonical()
    cells: list[Cell] = []
    for e_i, exp in enumerate(resolved.spec.experiments):
        ce = canon["experiments"][e_i]
        shared = {k: v for k, v in ce.items() if k not in ("methods", "report")}
        # a new release of any plugin the cell uses recomputes the cell
        versions = [
            {
                field: resolved.registry.get(kind, comp.name).plugin.version
                for kind, field, comp in _components(exp, m)
            }
            for m in exp.methods
        ]
        for m_i, method in enumerate(exp.methods):
            per_beta = exp.train_beta == "per_beta"
            train_betas = list(exp.betas) if per_beta else [float(exp.train_beta)]
            for seed in resolved.spec.seeds:
                for tb in train_betas:
                    eval_betas = [tb] if per_beta else list(exp.betas)
                    material = {
                        "format": CELL_FORMAT,
                        "experiment": shared,
                        "method": ce["methods"][m_i],
                        "versions": versions[m_i],
                        "seed": seed,
                        "train_beta": tb,
                        "eval_betas": eval_betas,
                    }
                    name = f"seed{seed}" + (f"-beta{tb:g}" if per_beta else "")
                    path = out_dir / "cells" / exp.name / slug(method.label) / f"{name}.json"
                    cells.append(Cell(e_i, m_i, seed, tb, eval_betas, content_hash(material), path))
    return cells


def _components(exp: ExperimentSpec, method: MethodSpec):
    """(kind, field, component) of everything a cell depends on."""
    yield "dataset", "dataset", exp.dataset
    yield "backbone", "backbone", exp.backbone
    for kind, field in (("scheme", "scheme"), ("selector", "selector"),
                        ("recalibrator", "recalibrator"), ("loss", "loss"), ("loss", "coverage")):
        comp = getattr(method, field)
        if comp is not None:
            yield kind, field, comp


def cell_done(cell: Cell) -> bool:
    if not cell.path.is_file():
        return False
    try:
        import json

        return json.loads(cell.path.read_text()).get("key") == cell.key
    except (OSError, ValueError):
        return False


def fit_indices(n_total: int, n_fit: int | None, seed: int, where: str) -> np.ndarray:
    if n_fit is None:
        return np.arange(n_total)
    if n_fit > n_total:
        raise RunError(f"{where}: n_fit={n_fit} but the fitting split has only {n_total} examples")
    rng = np.random.default_rng([seed, 0x5E1EC7])
    return np.sort(rng.choice(n_total, size=n_fit, replace=False))


def _seed_everything(seed: int) -> None:
    import random

    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _plain(domain: np.ndarray | None) -> np.ndarray:
    """Domain ids as an array numpy can store without pickling."""
    if domain is None:
        return np.zeros(0)
    return domain.astype(str) if domain.dtype == object else domain


def _check_vector(values: Any, n: int, what: str, lo: float | None, hi: float | None) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise RunError(f"{what} returned shape {arr.shape}, expected ({n},)")
    if not np.all(np.isfinite(arr)):
        raise RunError(f"{what} returned NaN or infinite values")
    if lo is not None and (arr.min() < lo - 1e-9 or arr.max() > hi + 1e-9):
        raise RunError(f"{what} returned values outside [{lo}, {hi}]")
    return arr


def run_cell(
    resolved: ResolvedSpec,
    cell: Cell,
    outputs: dict[str, ModelOutputs],
    device: str,
) -> dict[str, Any]:
    exp: ExperimentSpec = resolved.spec.experiments[cell.e_i]
    method: MethodSpec = exp.methods[cell.m_i]
    where = f"experiments[{cell.e_i}]"
    fit_all = outputs[exp.fit_split]
    idx = fit_indices(len(fit_all), exp.n_fit, cell.seed, f"{where}.n_fit")
    fit_out = fit_all.subset(idx)
    eval_out = outputs[exp.eval_split]
    if exp.fit_split == exp.eval_split:  # never evaluate on the examples used for fitting
        mask = np.ones(len(eval_out), dtype=bool)
        mask[idx] = False
        eval_out = eval_out.subset(np.flatnonzero(mask))
    if exp.n_eval is not None and exp.n_eval < len(eval_out):
        rng = np.random.default_rng([0xE7A1, cell.e_i])
        eval_out = eval_out.subset(np.sort(rng.choice(len(eval_out), exp.n_eval, replace=False)))
    if len(eval_out) == 0:
        raise RunError(f"{where}: no evaluation examples left")

    _seed_everything(cell.seed)
    build = resolved.build
    scheme = build("scheme", method.scheme)
    selector = build("selector", method.selector)
    recalibrator = build("recalibrator", method.recalibrator)
    loss = build("loss", method.loss) if method.loss is not None else None
    coverage = build("loss", method.coverage) if method.coverage is not None else None
    ctx = FitContext(seed=cell.seed, device=device, beta=cell.train_beta, progress=False)
    t0 = time.perf_counter()
    scheme.fit(
        fit_out, selector=selector, recalibrator=recalibrator, loss=loss, coverage=coverage,
        context=ctx,
    )
    t1 = time.perf_counter()
    label = f"{where}.methods[{cell.m_i}] ({method.label!r})"
    conf = _check_vector(
        recalibrator.confidence(eval_out), len(eval_out),
        f"{label}: recalibrator {method.recalibrator.name!r}.confidence", 0.0, 1.0,
    )
    score = _check_vector(
        selector.score(eval_out, conf), len(eval_out),
        f"{label}: selector {method.selector.name!r}.score", None, None,
    )
    delta = exp.coverage_guarantee.delta if exp.coverage_guarantee else None
    correct = eval_out.correct()
    metrics = selective_metrics(score, conf, correct, cell.eval_betas, delta=delta)
    t2 = time.perf_counter()
    if cell.seed == resolved.spec.seeds[0]:
        # per-example arrays of the first seed, for reliability diagrams and histograms
        arrays_path = cell.path.with_suffix(".npz")
        with atomic_path(arrays_path, suffix=".npz") as tmp, open(tmp, "wb") as fh:
            np.savez_compressed(
                fh,
                key=np.array(cell.key),
                confidence=conf,
                raw_confidence=eval_out.confidence(),
                score=score,
                correct=correct.astype(np.uint8),
                domain=_plain(eval_out.domain),
            )
    return {
        "format": CELL_FORMAT,
        "key": cell.key,
        "experiment": exp.name,
        "method": method.label,
        "seed": cell.seed,
        "train_beta": cell.train_beta,
        "betas": cell.eval_betas,
        "metrics": {k: np.asarray(v, dtype=float).tolist() for k, v in metrics.items()},
        "n_fit": len(fit_out),
        "n_eval": len(eval_out),
        "device": device,
        "timing": {"fit_s": round(t1 - t0, 4), "eval_s": round(t2 - t1, 4)},
    }


# --------------------------------------------------------------------------- entry point
def run(
    spec: str | Path | dict | ResolvedSpec,
    *,
    out_dir: str | Path | None = None,
    device: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    cache_dir: str | Path | None = None,
    progress: bool = True,
    plots: bool = True,
) -> RunReport:
    """Run every cell of ``spec`` not already finished in ``out_dir``; write the leaderboard.

    Args:
        spec: a spec path, a raw dict, or an already resolved spec.
        out_dir: results directory (default ``results/<spec name>``).
        device: ``auto`` / ``cpu`` / ``cuda``; default the spec's ``device``.
        overrides: ``key.path=value`` strings applied before validation.
        cache_dir: where backbone outputs are cached (default :func:`default_cache_dir`).
        progress: show progress bars on stderr.
        plots: also draw the figures into ``out_dir/plots/`` (see :mod:`selbench.plots`).
    """
    from tqdm.auto import tqdm

    from selbench.leaderboard import write_leaderboard

    resolved = spec if isinstance(spec, ResolvedSpec) else load_spec(spec, overrides=overrides)
    dev = resolve_device(device or resolved.spec.device)
    out = Path(out_dir) if out_dir is not None else Path("results") / resolved.spec.name
    out.mkdir(parents=True, exist_ok=True)
    cache = OutputCache(cache_dir)
    cells = plan_cells(resolved, out)

    canonical = resolved.canonical()
    atomic_write_text(out / "spec.yaml", yaml.safe_dump(canonical, sort_keys=False, allow_unicode=True))
    prov = provenance(resolved, dev)
    atomic_write_json(
        out / "run.json",
        {
            "provenance": prov,
            "spec": canonical,
            "cells": [str(c.path.relative_to(out)) for c in cells],
            "cell_keys": [c.key for c in cells],
        },
    )

    report = RunReport(out)
    todo = [c for c in cells if not cell_done(c)]
    report.reused = len(cells) - len(todo)
    by_exp: dict[int, list[Cell]] = {}
    for c in todo:
        by_exp.setdefault(c.e_i, []).append(c)
    bar = tqdm(total=len(todo), desc="methods", unit="cell", disable=not progress or not todo)
    try:
        for e_i, exp_cells in by_exp.items():
            outputs = experiment_outputs(resolved, e_i, cache, dev, progress)
            for cell in exp_cells:
                exp = resolved.spec.experiments[e_i]
                bar.set_postfix_str(f"{exp.name}: {exp.methods[cell.m_i].label} seed {cell.seed}")
                try:
                    record = run_cell(resolved, cell, outputs, dev)
                except (DataError, ValueError) as exc:
                    raise RunError(
                        f"experiments[{e_i}].methods[{cell.m_i}] ({exp.methods[cell.m_i].label!r}): {exc}"
                    ) from exc
                record["spec_hash"] = prov["spec_hash"]
                atomic_write_json(cell.path, record)
                report.computed += 1
                bar.update(1)
    finally:
        bar.close()
    report.files = write_leaderboard(out)
    if plots:
        from selbench.plots import write_plots

        report.files += write_plots(out)
    return report
