"""The runner: spec -> cached backbone outputs -> fitted methods -> metrics -> leaderboard.

For each experiment the backbone outputs of the fitting and evaluation splits come from the
on-disk cache (computed once per dataset + backbone configuration + split). Then each
*cell* — one method × seed (× training β when ``train_beta: per_beta``) — is fitted on a
seeded sample of ``n_fit`` fitting examples, scored on the evaluation data, thresholded at
each coverage β, and measured. Every finished cell is written atomically to
``OUT/cells/...``, keyed by a hash of everything that determines it, so an interrupted run
picks up where it stopped and a changed method recomputes only its own cells.

When a method's scheme overrides :meth:`~selbench.api.Scheme.fit_many` (the training
schemes do, to train all replicas as one batched model), the unfinished cells of that
method — its seeds × training β — are fitted by one ``fit_many`` call, then evaluated and
written one by one as above; otherwise each cell is fitted on its own.

The runner knows nothing about individual plugins: it builds them from the registry and
drives them through the interfaces in :mod:`selbench.api`.
"""

from __future__ import annotations

import hashlib
import io
import pickle
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
from selbench.api import FitContext, FitJob, Scheme
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
    for kind, attr in (("scheme", "scheme"), ("selector", "selector"),
                       ("recalibrator", "recalibrator"), ("loss", "loss"), ("loss", "coverage")):
        comp = getattr(method, attr)
        if comp is not None:
            yield kind, attr, comp


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


@dataclass
class FittedCell:
    """A cell's selector and recalibrator, fitted by a group's ``fit_many`` call."""

    selector: Any
    recalibrator: Any
    fit_s: float  # the group's fitting time divided by its number of cells
    batch: int  # number of cells fitted together


def batches(scheme: Any) -> bool:
    """Whether a scheme fits many replicas together (overrides ``Scheme.fit_many``)."""
    return getattr(type(scheme), "fit_many", Scheme.fit_many) is not Scheme.fit_many


def method_groups(cells: list[Cell]) -> list[list[Cell]]:
    """Consecutive cells of one method (its seeds × training β), in plan order."""
    groups: list[list[Cell]] = []
    for cell in cells:
        if groups and (groups[-1][0].e_i, groups[-1][0].m_i) == (cell.e_i, cell.m_i):
            groups[-1].append(cell)
        else:
            groups.append([cell])
    return groups


def _build_method(resolved: ResolvedSpec, method: MethodSpec) -> tuple[Any, ...]:
    build = resolved.build
    return (
        build("selector", method.selector),
        build("recalibrator", method.recalibrator),
        build("loss", method.loss) if method.loss is not None else None,
        build("loss", method.coverage) if method.coverage is not None else None,
    )


def fit_group(
    resolved: ResolvedSpec,
    cells: list[Cell],
    outputs: dict[str, ModelOutputs],
    device: str,
    scheme: Any,
) -> dict[str, FittedCell]:
    """Fit the cells of one method with one ``scheme.fit_many`` call; cell key -> result."""
    exp: ExperimentSpec = resolved.spec.experiments[cells[0].e_i]
    method: MethodSpec = exp.methods[cells[0].m_i]
    fit_all = outputs[exp.fit_split]
    jobs = []
    for cell in cells:
        idx = fit_indices(len(fit_all), exp.n_fit, cell.seed, f"experiments[{cell.e_i}].n_fit")
        selector, recalibrator, loss, coverage = _build_method(resolved, method)
        ctx = FitContext(seed=cell.seed, device=device, beta=cell.train_beta, progress=False)
        jobs.append(FitJob(fit_all.subset(idx), selector, recalibrator, loss, coverage, ctx))
    _seed_everything(cells[0].seed)
    t0 = time.perf_counter()
    scheme.fit_many(jobs)
    share = (time.perf_counter() - t0) / len(cells)
    return {
        cell.key: FittedCell(job.selector, job.recalibrator, share, len(cells))
        for cell, job in zip(cells, jobs)
    }


def _tensor_state(dtype: str, shape: tuple, data: bytes) -> Any:  # pragma: no cover
    """Stands for a tensor in :func:`_fingerprint` pickles (never called)."""
    raise NotImplementedError


class _StatePickler(pickle.Pickler):
    """Pickles torch tensors by value (dtype, shape, bytes): torch's own pickles embed
    storage addresses, so equal modules would never pickle equal."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            t = obj.detach().to("cpu").contiguous()
            data = t.reshape(-1).view(torch.uint8).numpy().tobytes()
            return _tensor_state, (str(t.dtype), tuple(t.shape), data)
        return NotImplemented


def _fingerprint(*objs: Any) -> str | None:
    """SHA-256 of the pickled objects, or None when they cannot be pickled."""
    buf = io.BytesIO()
    try:
        _StatePickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(objs)
    except Exception:  # any object that does not pickle is simply scored every time
        return None
    return hashlib.sha256(buf.getvalue()).hexdigest()


def run_cell(
    resolved: ResolvedSpec,
    cell: Cell,
    outputs: dict[str, ModelOutputs],
    device: str,
    fitted: FittedCell | None = None,
    memo: dict | None = None,
) -> dict[str, Any]:
    """Fit (unless ``fitted`` is given), score, threshold and measure one cell.

    ``memo`` (one dict per method) keeps the confidence and scores of each distinct fitted
    state on each evaluation set: cells whose fitted selector and recalibrator are identical
    (e.g. a baseline fitted on one seed's data for every training β of ``per_beta``) score
    the evaluation data once. Identity is the SHA-256 of the pickled fitted objects, so the
    reuse is exact; objects that cannot be pickled are always scored. It also keeps the
    last evaluation subset, which consecutive cells of one seed share.
    """
    exp: ExperimentSpec = resolved.spec.experiments[cell.e_i]
    method: MethodSpec = exp.methods[cell.m_i]
    where = f"experiments[{cell.e_i}]"
    fit_all = outputs[exp.fit_split]
    idx = fit_indices(len(fit_all), exp.n_fit, cell.seed, f"{where}.n_fit")
    eval_all = outputs[exp.eval_split]
    rows = np.arange(len(eval_all))
    if exp.fit_split == exp.eval_split:  # never evaluate on the examples used for fitting
        mask = np.ones(len(eval_all), dtype=bool)
        mask[idx] = False
        rows = np.flatnonzero(mask)
    if exp.n_eval is not None and exp.n_eval < len(rows):
        rng = np.random.default_rng([0xE7A1, cell.e_i])
        rows = rows[np.sort(rng.choice(len(rows), exp.n_eval, replace=False))]
    if len(rows) == 0:
        raise RunError(f"{where}: no evaluation examples left")
    rows_key = (exp.eval_split, hashlib.sha256(rows.tobytes()).hexdigest())
    if len(rows) == len(eval_all):
        eval_out = eval_all
    elif memo is not None and memo.get("eval_rows") == rows_key:
        eval_out = memo["eval_out"]  # the previous cell's (same seed): no new copy
    else:
        eval_out = eval_all.subset(rows)
        if memo is not None:
            memo["eval_rows"], memo["eval_out"] = rows_key, eval_out

    timing: dict[str, Any] = {}
    if fitted is None:
        _seed_everything(cell.seed)
        scheme = resolved.build("scheme", method.scheme)
        selector, recalibrator, loss, coverage = _build_method(resolved, method)
        ctx = FitContext(seed=cell.seed, device=device, beta=cell.train_beta, progress=False)
        t0 = time.perf_counter()
        scheme.fit(
            fit_all.subset(idx), selector=selector, recalibrator=recalibrator, loss=loss,
            coverage=coverage, context=ctx,
        )
        timing["fit_s"] = round(time.perf_counter() - t0, 4)
    else:
        selector, recalibrator = fitted.selector, fitted.recalibrator
        timing["fit_s"] = round(fitted.fit_s, 4)
        timing["fit_batch"] = fitted.batch
    t1 = time.perf_counter()
    label = f"{where}.methods[{cell.m_i}] ({method.label!r})"
    key = None
    if memo is not None:
        state = _fingerprint(recalibrator, selector)
        if state is not None:
            key = (state, rows_key)
    if key is not None and key in memo:
        conf, score = memo[key]
    else:
        conf = _check_vector(
            recalibrator.confidence(eval_out), len(eval_out),
            f"{label}: recalibrator {method.recalibrator.name!r}.confidence", 0.0, 1.0,
        )
        score = _check_vector(
            selector.score(eval_out, conf), len(eval_out),
            f"{label}: selector {method.selector.name!r}.score", None, None,
        )
        if key is not None:
            memo[key] = (conf, score)
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
        "n_fit": len(idx),
        "n_eval": len(eval_out),
        "device": device,
        "timing": {**timing, "eval_s": round(t2 - t1, 4)},
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
            exp = resolved.spec.experiments[e_i]
            for group in method_groups(exp_cells):
                m_i = group[0].m_i
                label = f"experiments[{e_i}].methods[{m_i}] ({exp.methods[m_i].label!r})"
                fitted: dict[str, FittedCell] = {}
                memo: dict = {}
                try:
                    scheme = resolved.build("scheme", exp.methods[m_i].scheme)
                    if batches(scheme):
                        bar.set_postfix_str(
                            f"{exp.name}: {exp.methods[m_i].label} ({len(group)} replicas)"
                        )
                        fitted = fit_group(resolved, group, outputs, dev, scheme)
                except (DataError, ValueError) as exc:
                    raise RunError(f"{label}: {exc}") from exc
                for cell in group:
                    bar.set_postfix_str(f"{exp.name}: {exp.methods[m_i].label} seed {cell.seed}")
                    try:
                        record = run_cell(resolved, cell, outputs, dev, fitted.get(cell.key),
                                          memo)
                    except (DataError, ValueError) as exc:
                        raise RunError(f"{label}: {exc}") from exc
                    fitted.pop(cell.key, None)  # free the fitted modules as we go
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
