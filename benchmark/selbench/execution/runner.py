"""The runner: spec -> cached backbone outputs -> fitted methods -> metrics -> leaderboard.

For each experiment the backbone outputs of the fitting and evaluation splits come from the
on-disk cache (computed once per dataset + backbone configuration + split). Then each
*cell* — one method × seed (× training β when ``train_beta: per_beta``) — is fitted on a
seeded sample of ``n_fit`` fitting examples, scored on the evaluation data, thresholded at
each coverage β, and measured. Every finished cell is written atomically to
``OUT/cells/...``, keyed by a hash of everything that determines it, so an interrupted run
picks up where it stopped and a changed method recomputes only its own cells.

The unfinished cells of a method — its seeds × training β — are always fitted by one
:meth:`~selbench.contract.api.Scheme.fit_many` call (the training schemes train them as one model
with :mod:`selbench.training.engine`; a scheme that does not override it fits them one by one), then
evaluated and written one by one as above.

Where the cells are computed is the executor's choice (:mod:`selbench.execution.executors`): in this
process (``inline``, the default), or as jobs — one per method with unfinished cells, after
one job per experiment whose backbone outputs are missing from the cache — on a local
process pool or on Slurm through submitit (:func:`run_unit` is what a job runs). Every
executor writes the same cells, so the leaderboard is the same byte for byte.

Each cell is a :class:`~selbench.library.estimator.SelectiveRecalibrator` whose parameters are the
method's YAML fields (``scheme``, ``selector``, ``recalibrator``, ``loss``, ``coverage``, with
their validated params) and the cell's training β, seed and device: the estimator builds the
plugins from the registry, fits them (its components as one job of ``fit_many``) and scores and measures the evaluation data, so a Python user fitting the same
estimator on the same rows gets the cell's numbers. The runner knows nothing about individual
plugins: it drives them through the interfaces in :mod:`selbench.contract.api`.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from selbench.contract.api import FitContext
from selbench.contract.data import DataError, ModelOutputs
from selbench.contract.inputs import DigestCache, InputError, digest_input
from selbench.execution.codeid import code_digest, core_digest
from selbench.measure.evaluate import EvaluationError, check_vector, eval_rows, fit_indices
from selbench.measure.evaluate import intervals as evaluate_intervals
from selbench.spec import (
    METHOD_FIELDS,
    Component,
    ExperimentSpec,
    MethodSpec,
    ResolvedSpec,
    SpecError,
    content_hash,
    load_spec,
)
from selbench.store.cache import OutputCache
from selbench.store.results import (
    CELL_SCHEMA,
    LEGACY,
    CellCheck,
    CellRecord,
    ResultsDir,
    ResultsError,
    RunRecord,
    slug,
)
from selbench.training.devices import resolve_device, seed_everything
from selbench.util.version import __version__

if TYPE_CHECKING:  # pragma: no cover - imported when a method is built (scikit-learn is slow)
    from selbench.library.estimator import SelectiveRecalibrator

__all__ = ["Leaderboard", "RunError", "RunReport", "RunResults", "fit_indices", "resolve_device",
           "run", "slug"]


class RunError(RuntimeError):
    """A plugin misbehaved or data does not fit the spec; the message says which and where."""


@dataclass
class RunReport:
    """What :func:`run` did, and the results it produced, readable from Python.

    ``computed``/``reused`` count cells, ``reasons`` says why finished cells were recomputed,
    ``files`` lists the leaderboard and figure files written. The results themselves:
    :meth:`cells` (the typed cell records), :meth:`leaderboard` (the aggregated tables, as
    ``selbench leaderboard`` renders them) and :meth:`to_frame` (one row per cell × β ×
    metric, as a pandas DataFrame).
    """

    out_dir: Path
    computed: int = 0
    reused: int = 0
    files: list[Path] = field(default_factory=list)
    #: why finished cells were recomputed: reason -> number of cells
    reasons: dict[str, int] = field(default_factory=dict)
    #: (experiment name, why) of the optional experiments left out of this run
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def cells(self) -> list[CellRecord]:
        """The verified cell records of this run, in the spec's order."""
        store = ResultsDir(self.out_dir)
        run_record = store.read_run()
        out = []
        for rel, key in zip(run_record.cells, run_record.cell_keys):
            check = store.check_cell(store.resolve(rel), key)
            if check.record is None:
                raise ResultsError(f"{store.resolve(rel)}: {check.problem}")
            out.append(check.record)
        return out

    def leaderboard(self) -> Leaderboard:
        """The leaderboard of this run (tables with statistics over seeds)."""
        from selbench.reporting.leaderboard import build_tables

        return Leaderboard(build_tables(self.out_dir))

    def to_frame(self):
        """Every cell's metrics as a long pandas DataFrame: columns ``experiment``,
        ``method``, ``seed``, ``train_beta``, ``beta``, ``metric``, ``value`` (pandas is an
        optional dependency: ``pip install 'selbench[pandas]'``)."""
        pd = _pandas()
        rows = [
            (c.experiment, c.method, c.seed, c.train_beta, beta, metric, values[b_i])
            for c in self.cells()
            for metric, values in c.metrics.items()
            for b_i, beta in enumerate(c.betas)
        ]
        return pd.DataFrame(rows, columns=["experiment", "method", "seed", "train_beta", "beta",
                                           "metric", "value"])


#: the name the Python API documents for what :func:`run` returns
RunResults = RunReport


@dataclass(frozen=True)
class Leaderboard:
    """Aggregated tables of a results directory (see :mod:`selbench.reporting.leaderboard`)."""

    tables: dict[str, Any]

    def markdown(self) -> str:
        from selbench.reporting.leaderboard import render_markdown

        return render_markdown(self.tables)

    def csv(self) -> str:
        from selbench.reporting.leaderboard import render_csv

        return render_csv(self.tables)

    def to_frame(self):
        """One row per experiment × method × metric × point (a β, or ``auc``): mean, std,
        95% interval, seeds, p-value against the best, best marks (pandas required)."""
        import io

        # a method may be labelled "None" or "NA": only empty cells are missing values
        return _pandas().read_csv(io.StringIO(self.csv()), keep_default_na=False,
                                  na_values=[""])

    def __str__(self) -> str:
        return self.markdown()


def _pandas():
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("to_frame() needs pandas: pip install 'selbench[pandas]'") from None
    return pd


def provenance(resolved: ResolvedSpec, device: str) -> dict[str, Any]:
    """Versions, configuration and machine: what a reader needs to trust a number."""
    import torch

    return {
        "selbench": __version__,
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


# --------------------------------------------------------------------------- keys
@dataclass
class Identity:
    """The content that keys a run's cached outputs and cells: input digests and code
    digests of every plugin the spec uses, and the core's digest."""

    inputs: dict[str, dict[str, str | None]]  # "experiments[0].dataset.params.path" -> {path, digest}
    code: dict[str, str]  # "kind/name" -> code digest
    core: str

    def component_params(self, resolved: ResolvedSpec, kind: str, comp: Component,
                         where: str) -> dict:
        """The component's canonical params with each input path replaced by its digest:
        what a key hashes (moving a file keeps its results; rewriting it does not)."""
        params = resolved.params(kind, comp)
        for pname in resolved.inputs(kind, comp):
            params[pname] = {"input": self.inputs[f"{where}.params.{pname}"]["digest"]}
        return {"name": comp.name, "params": params}


def _components_of(exp: ExperimentSpec, e_i: int):
    """(kind, field, component, yaml path) of everything an experiment uses."""
    yield "dataset", "dataset", exp.dataset, f"experiments[{e_i}].dataset"
    yield "backbone", "backbone", exp.backbone, f"experiments[{e_i}].backbone"
    for m_i, m in enumerate(exp.methods):
        for kind, attr in METHOD_FIELDS:
            comp = getattr(m, attr)
            if comp is not None:
                yield kind, attr, comp, f"experiments[{e_i}].methods[{m_i}].{attr}"


def _method_fields(method: MethodSpec):
    for kind, attr in METHOD_FIELDS:
        comp = getattr(method, attr)
        if comp is not None:
            yield kind, attr, comp


def identify(resolved: ResolvedSpec, cache: OutputCache) -> Identity:
    """Digest every declared input and the code of every plugin the spec uses."""
    digests = DigestCache(cache.root)
    inputs: dict[str, dict[str, str | None]] = {}
    code: dict[str, str] = {}
    for e_i, exp in enumerate(resolved.spec.experiments):
        for kind, _, comp, where in _components_of(exp, e_i):
            for pname, (path, ispec) in resolved.inputs(kind, comp).items():
                try:
                    digest = digest_input(path, ispec, digests)
                except InputError as exc:
                    raise SpecError([f"{where}.params.{pname}: {exc}"], resolved.source) from None
                inputs[f"{where}.params.{pname}"] = {"path": path, "digest": digest}
            reg = resolved.registry.get(kind, comp.name)
            code[f"{kind}/{comp.name}"] = code_digest(reg.plugin.factory)
    return Identity(dict(sorted(inputs.items())), dict(sorted(code.items())), core_digest())


def output_keys(resolved: ResolvedSpec, ident: Identity, e_i: int) -> dict[str, tuple[str, dict]]:
    """split -> (cache key, key material) of an experiment's backbone outputs."""
    exp = resolved.spec.experiments[e_i]
    base = f"experiments[{e_i}]"
    dataset = ident.component_params(resolved, "dataset", exp.dataset, f"{base}.dataset")
    backbone = ident.component_params(resolved, "backbone", exp.backbone, f"{base}.backbone")
    code = {"dataset": ident.code[f"dataset/{exp.dataset.name}"],
            "backbone": ident.code[f"backbone/{exp.backbone.name}"]}
    out = {}
    for split in dict.fromkeys([exp.fit_split, exp.eval_split]):
        material = OutputCache.key_material(dataset, backbone, split, code)
        out[split] = (content_hash(material), material)
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
    components: dict[str, Any]
    needs_arrays: bool


def plan_cells(resolved: ResolvedSpec, results: ResultsDir, ident: Identity) -> list[Cell]:
    """Every cell of the spec, each with the content key that decides whether it is reused.

    The key hashes the experiment's settings, the keys of its backbone outputs (which hold
    the input digests), the method's configuration, the code digest of each plugin the
    method uses, the core's digest, the seed and the β's.
    """
    cells: list[Cell] = []
    first_seed = resolved.spec.seeds[0]
    for e_i, exp in enumerate(resolved.spec.experiments):
        base = f"experiments[{e_i}]"
        # the leaderboard columns (metrics) are a view: every cell holds every registered metric
        settings = exp.model_dump(mode="json", exclude={"methods", "report", "metrics", "dataset",
                                                        "backbone"})
        outputs = {split: key for split, (key, _) in output_keys(resolved, ident, e_i).items()}
        exp_part = {"settings": content_hash(settings), "outputs": outputs}
        for m_i, method in enumerate(exp.methods):
            mwhere = f"{base}.methods[{m_i}]"
            config = {attr: ident.component_params(resolved, kind, comp, f"{mwhere}.{attr}")
                      for kind, attr, comp in _method_fields(method)}
            code = {attr: ident.code[f"{kind}/{comp.name}"]
                    for kind, attr, comp in _method_fields(method)}
            per_beta = exp.train_beta == "per_beta"
            train_betas = list(exp.betas) if per_beta else [float(exp.train_beta)]
            for seed in resolved.spec.seeds:
                for tb in train_betas:
                    eval_betas = [tb] if per_beta else list(exp.betas)
                    components = {
                        "schema": CELL_SCHEMA,
                        "experiment": exp_part,
                        "method": content_hash(config),
                        "code": code,
                        "core": ident.core,
                        "seed": seed,
                        "train_beta": tb,
                        "eval_betas": eval_betas,
                        "names": {attr: f"{kind} {comp.name!r}"
                                  for kind, attr, comp in _method_fields(method)},
                    }
                    key = content_hash({k: v for k, v in components.items() if k != "names"})
                    path = results.cell_path(exp.name, method.label, seed,
                                             tb if per_beta else None)
                    cells.append(Cell(e_i, m_i, seed, tb, eval_betas, key, path, components,
                                      seed == first_seed))
    return cells


def why_recomputed(cell: Cell, check: CellCheck) -> str:
    """One short reason a finished cell is not reused."""
    prev = check.previous
    if check.problem == LEGACY:
        return LEGACY
    if prev is None:
        return f"cell file {check.problem}"
    old, new = prev.components, cell.components
    if not old:
        return LEGACY
    if old.get("core") != new["core"]:
        return "selbench's metric definitions changed"
    changed = [new["names"][attr] for attr in new["code"]
               if (old.get("code") or {}).get(attr) != new["code"][attr]]
    if changed:
        return ", ".join(changed) + " changed"
    if old.get("experiment", {}).get("outputs") != new["experiment"]["outputs"]:
        return "the backbone outputs changed (dataset, backbone, their code or input files)"
    if old.get("experiment") != new["experiment"]:
        return "the experiment's settings changed"
    if old.get("method") != new["method"]:
        return "the method's parameters changed"
    return "its configuration changed"


# --------------------------------------------------------------------------- blame
def _describe(resolved: ResolvedSpec, kind: str, comp: Component) -> str:
    reg = resolved.registry.get(kind, comp.name)
    describe = getattr(reg, "describe", None)
    return describe() if callable(describe) else f"{kind} {comp.name!r}"


def _blame(exc: BaseException, candidates: list[tuple[str, Any]]) -> str | None:
    """The component whose code raised ``exc``: the innermost traceback frame that runs a
    method of one of the candidates' classes (the object's own methods first, then any code
    of the module defining the factory)."""
    codes: dict[Any, str] = {}
    modules: dict[str, str] = {}
    for desc, factory in candidates:
        modules.setdefault(getattr(factory, "__module__", ""), desc)
        for klass in getattr(factory, "__mro__", (factory,)):
            if klass is object or getattr(klass, "__module__", "") == "selbench.contract.api":
                continue
            members = vars(klass).values() if isinstance(klass, type) else (klass,)
            for member in members:
                fn = getattr(member, "__func__", getattr(member, "fget", member))
                code = getattr(fn, "__code__", None)
                if code is not None:
                    codes.setdefault(code, desc)
    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    for frame in reversed(frames):
        if frame.f_code in codes:
            return codes[frame.f_code]
    for frame in reversed(frames):
        desc = modules.get(frame.f_globals.get("__name__", ""))
        if desc is not None:
            return desc
    return None


def _failure(where: str, stage: str, exc: BaseException, blame: str | None) -> RunError:
    if isinstance(exc, (EvaluationError, SpecError)):
        return RunError(f"{where}: {exc}")
    if isinstance(exc, SystemExit):
        what = f"called sys.exit({exc.code!r})"
    else:
        what = f"raised {type(exc).__name__}: {exc}" if str(exc) else f"raised {type(exc).__name__}"
    who = blame or "a plugin"
    return RunError(f"{where}: {who} {what} while {stage}")


class _Guard:
    """During fitting, checks what a recalibrator's ``confidence``/``predict`` and a
    selector's ``score`` return, so that a bad value is blamed on the plugin that produced
    it, not on the plugin that received it.

    The checking wrappers are set on the plugin's class for the duration of the fit (every
    job of a ``fit_many`` call is one method, so one class per role) and the class is
    restored afterwards: instances keep their own ``vars()`` and ``type()``, which schemes
    may compare (e.g. to fit equal recalibrators once).
    """

    def __init__(self):
        self._saved: list[tuple[type, str, Any]] = []
        self._missing = object()

    def watch(self, obj: Any, name: str, what: str, lo=None, hi=None, integer=False,
              classes=False) -> None:
        klass = type(obj)
        if any(k is klass and n == name for k, n, _ in self._saved):
            return
        original = getattr(klass, name, None)
        if original is None or not callable(original):
            return

        def checked(self_, outputs, *args, **kwargs):
            values = original(self_, outputs, *args, **kwargs)
            try:
                n = len(outputs)
                high = outputs.num_classes - 1 if classes else hi
            except Exception:
                return values
            check_vector(values, n, f"{what}.{name}", lo, high, integer)
            return values

        previous = klass.__dict__.get(name, self._missing)
        try:
            setattr(klass, name, checked)
        except (AttributeError, TypeError):  # a class that cannot be patched is not checked
            return
        self._saved.append((klass, name, previous))

    def remove(self) -> None:
        for klass, name, previous in reversed(self._saved):
            if previous is self._missing:
                delattr(klass, name)
            else:
                setattr(klass, name, previous)
        self._saved.clear()


def _fit_guarded(fit, objects: list[tuple[Any, Any]], names: tuple[str, str]) -> None:
    guard = _Guard()
    recal_name, sel_name = names
    for recalibrator, selector in objects:
        guard.watch(recalibrator, "confidence", recal_name, 0.0, 1.0)
        guard.watch(recalibrator, "predict", recal_name, 0, None, integer=True, classes=True)
        guard.watch(selector, "score", sel_name)
    try:
        fit()
    finally:
        guard.remove()


# --------------------------------------------------------------------------- fitting
def _json_ready(obj: Any) -> Any:
    """Nested dicts of numpy arrays and scalars as plain lists and floats."""
    if isinstance(obj, dict):
        return {str(k): _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [_json_ready(v) for v in obj]
    return float(obj)


def _plain(domain: np.ndarray | None) -> np.ndarray:
    """Domain ids as an array numpy can store without pickling."""
    if domain is None:
        return np.zeros(0)
    return domain.astype(str) if domain.dtype == object else domain


@dataclass
class FittedCell:
    """A cell's estimator, fitted by a group's ``fit_many`` call."""

    estimator: SelectiveRecalibrator
    fit_s: float  # the group's fitting time divided by its number of cells
    batch: int  # number of cells fitted together

    @property
    def selector(self) -> Any:
        return self.estimator.selector_

    @property
    def recalibrator(self) -> Any:
        return self.estimator.recalibrator_


def method_groups(cells: list[Cell]) -> list[list[Cell]]:
    """Consecutive cells of one method (its seeds × training β), in plan order."""
    groups: list[list[Cell]] = []
    for cell in cells:
        if groups and (groups[-1][0].e_i, groups[-1][0].m_i) == (cell.e_i, cell.m_i):
            groups[-1].append(cell)
        else:
            groups.append([cell])
    return groups


def method_params(resolved: ResolvedSpec, method: MethodSpec) -> dict[str, Any]:
    """A spec's method as :class:`~selbench.library.estimator.SelectiveRecalibrator` parameters: each
    component ``{name, params}`` with its validated params (defaults filled in, input paths
    resolved against the spec's folder), absent losses None."""
    params: dict[str, Any] = {attr: None for _, attr in METHOD_FIELDS}
    for kind, attr, comp in _method_fields(method):
        params[attr] = {"name": comp.name, "params": resolved.params(kind, comp)}
    return params


class _Method:
    """A method's cells as :class:`~selbench.library.estimator.SelectiveRecalibrator` estimators
    (its YAML fields are the estimator's parameters), naming the plugin that fails."""

    def __init__(self, resolved: ResolvedSpec, e_i: int, m_i: int, spec_hash: str = ""):
        from selbench.library.estimator import ParamsError, SelectiveRecalibrator

        self.resolved = resolved
        self.spec_hash = spec_hash
        self.exp: ExperimentSpec = resolved.spec.experiments[e_i]
        self.method: MethodSpec = self.exp.methods[m_i]
        self.where = f"experiments[{e_i}].methods[{m_i}] ({self.method.label!r})"
        self.names = {attr: _describe(resolved, kind, comp)
                      for kind, attr, comp in _method_fields(self.method)}
        self.factories = [(self.names[attr], resolved.registry.get(kind, comp.name).plugin.factory)
                          for kind, attr, comp in _method_fields(self.method)]
        self.params = method_params(resolved, self.method)
        self._estimator = SelectiveRecalibrator
        try:  # validated with the spec already: the same rules, so this never fails
            self.plan = SelectiveRecalibrator(**self.params)._plan()
        except ParamsError as exc:  # pragma: no cover
            raise SpecError([f"experiments[{e_i}].methods[{m_i}].{e}" for e in exc.errors],
                            resolved.source) from None

    def estimator(self, seed: int, beta: float, device: str) -> SelectiveRecalibrator:
        """The (unfitted) estimator of one cell."""
        return self._estimator(**self.params, beta=float(beta), seed=seed, device=device)

    def building(self, attr: str, make):
        """``make()`` (build the component ``attr``), naming the plugin if it raises."""
        try:
            return make()
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as exc:
            comp = getattr(self.method, attr)
            raise _failure(self.where, f"building it from params {comp.params}", exc,
                           self.names[attr]) from exc

    def build(self, attr: str) -> Any:
        """A new component ``attr`` (None for an absent loss), as the estimator builds it."""
        return self.building(attr, lambda: self.plan.build(attr))

    def pair_names(self) -> tuple[str, str]:
        return self.names["recalibrator"], self.names["selector"]

    def run(self, stage: str, fn):
        try:
            return fn()
        except (KeyboardInterrupt, GeneratorExit, RunError):
            raise
        except BaseException as exc:
            raise _failure(self.where, stage, exc, _blame(exc, self.factories)) from exc


def fit_group(
    resolved: ResolvedSpec,
    cells: list[Cell],
    outputs: dict[str, ModelOutputs],
    device: str,
    scheme: Any,
    m: _Method,
) -> dict[str, FittedCell]:
    """Fit the cells of one method with one ``scheme.fit_many`` call; cell key -> result."""
    exp = m.exp
    fit_all = outputs[exp.fit_split]
    estimators, builts, jobs = [], [], []
    for cell in cells:
        idx = fit_indices(len(fit_all), exp.n_fit, cell.seed, f"experiments[{cell.e_i}].n_fit")
        est = m.estimator(cell.seed, cell.train_beta, device)
        built = est._build(wrap=m.building, plan=m.plan)
        built.scheme = scheme  # one scheme fits the group
        estimators.append(est)
        builts.append(built)
        jobs.append(built.job(fit_all.subset(idx)))
    seed_everything(cells[0].seed)
    t0 = time.perf_counter()
    m.run("fitting", lambda: _fit_guarded(lambda: scheme.fit_many(jobs),
                                          [(j.recalibrator, j.selector) for j in jobs],
                                          m.pair_names()))
    share = (time.perf_counter() - t0) / len(cells)
    return {
        cell.key: FittedCell(est._adopt(built, job.outputs), share, len(cells))
        for cell, est, built, job in zip(cells, estimators, builts, jobs)
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
    m: _Method,
    fitted: FittedCell,
    memo: dict | None = None,
) -> tuple[CellRecord, dict[str, np.ndarray] | None]:
    """Score, threshold and measure one cell fitted by :func:`fit_group`.

    ``memo`` (one dict per method) keeps the scores of each distinct fitted state on each
    evaluation set: cells whose fitted selector and recalibrator are identical (e.g. a
    baseline fitted on one seed's data for every training β of ``per_beta``) score the
    evaluation data once. Identity is the SHA-256 of the pickled fitted objects, so the
    reuse is exact; objects that cannot be pickled are always scored. It also keeps the
    last evaluation subset, which consecutive cells of one seed share.
    """
    exp = m.exp
    where = f"experiments[{cell.e_i}]"
    fit_all = outputs[exp.fit_split]
    idx = fit_indices(len(fit_all), exp.n_fit, cell.seed, f"{where}.n_fit")
    eval_all = outputs[exp.eval_split]
    rows = eval_rows(len(eval_all), idx, exp.fit_split == exp.eval_split, exp.n_eval, cell.e_i)
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

    timing: dict[str, float] = {}
    est = fitted.estimator
    timing["fit_s"] = round(fitted.fit_s, 4)
    timing["fit_batch"] = fitted.batch
    selector, recalibrator = est.selector_, est.recalibrator_
    t1 = time.perf_counter()
    key = None
    if memo is not None:
        state = _fingerprint(recalibrator, selector)
        if state is not None:
            key = (state, rows_key)
    if key is not None and key in memo:
        arrays = memo[key]
    else:
        arrays = m.run("scoring the evaluation data", lambda: est._score(eval_out))
        if key is not None:
            memo[key] = arrays
    delta = exp.coverage_guarantee.delta if exp.coverage_guarantee else None
    selects = est._selects()
    metrics = est._measure(arrays, cell.eval_betas, delta)  # as est.evaluate(eval_out, ...)
    boot = exp.bootstrap
    intervals = boot_info = None
    if boot.resamples > 0:
        intervals = m.run("bootstrapping the evaluation examples", lambda: evaluate_intervals(
            arrays, cell.eval_betas, delta=delta, seed=cell.seed, selects=selects,
            resamples=boot.resamples, level=boot.level))
        boot_info = {"resamples": boot.resamples, "level": boot.level, "method": "percentile",
                     "unit": "evaluation example"}
    t2 = time.perf_counter()
    stored = None
    if cell.needs_arrays:
        # per-example arrays of the first seed, for reliability diagrams and histograms
        stored = {
            "confidence": arrays["confidence"],
            "raw_confidence": eval_out.confidence(),
            "prediction": arrays["prediction"],
            "score": arrays["score"],
            "correct": arrays["correct"].astype(np.uint8),
            "domain": _plain(eval_out.domain),
        }
    record = CellRecord(
        key=cell.key,
        components=cell.components,
        experiment=exp.name,
        method=m.method.label,
        seed=cell.seed,
        train_beta=cell.train_beta,
        betas=cell.eval_betas,
        metrics={k: np.asarray(v, dtype=float).tolist() for k, v in metrics.items()},
        intervals=_json_ready(intervals) if intervals is not None else None,
        bootstrap=boot_info,
        n_fit=len(idx),
        n_eval=len(eval_out),
        device=device,
        spec_hash=m.spec_hash,
        selects=selects,
        timing={**timing, "eval_s": round(t2 - t1, 4)},
    )
    return record, stored


# --------------------------------------------------------------------------- outputs
class Extraction:
    """The backbone outputs of one experiment: built lazily (the dataset and the backbone
    only when some split is not cached), each split extracted whole or — for a backbone
    declaring :attr:`selbench.contract.api.Backbone.shardable`, in a distributed run — one row range
    at a time; every failure is one line naming the experiment and the plugin."""

    def __init__(self, resolved: ResolvedSpec, e_i: int, ident: Identity, cache: OutputCache,
                 device: str, progress: bool):
        self.resolved, self.e_i, self.cache = resolved, e_i, cache
        self.device, self.progress = device, progress
        self.exp = exp = resolved.spec.experiments[e_i]
        self.where = f"experiments[{e_i}] ({exp.name})"
        self.keys = output_keys(resolved, ident, e_i)
        self.names = {"dataset": _describe(resolved, "dataset", exp.dataset),
                      "backbone": _describe(resolved, "backbone", exp.backbone)}
        self._factories = [(self.names[k], resolved.registry.get(k, getattr(exp, k).name)
                            .plugin.factory) for k in ("dataset", "backbone")]
        self._dataset: Any = None
        self._backbone: Any = None
        self._labels: dict[str, np.ndarray] = {}

    @property
    def shardable(self) -> bool:
        """Whether the backbone declares that ``extract`` honours ``FitContext.rows``."""
        factory = self._factories[1][1]
        return isinstance(factory, type) and getattr(factory, "shardable", False) is True

    def warn(self, msg: str) -> None:
        print(f"selbench: warning: {msg}", file=sys.stderr)

    def guarded(self, stage: str, fn):
        try:
            return fn()
        except (KeyboardInterrupt, GeneratorExit, RunError):
            raise
        except BaseException as exc:
            blame = _blame(exc, self._factories)
            if isinstance(exc, (DataError, ValueError, FileNotFoundError)):
                raise RunError(f"{self.where}: {blame or 'dataset/backbone'}, "
                               f"{stage}: {exc}") from exc
            raise _failure(self.where, stage, exc, blame) from exc

    def dataset(self) -> Any:
        """The dataset (built once), the spec's splits checked against it."""
        if self._dataset is None:
            exp = self.exp
            dataset = self.guarded("building the dataset",
                                   lambda: self.resolved.build("dataset", exp.dataset))
            available = list(self.guarded("listing the splits", dataset.splits))
            for which, name in (("fit_split", exp.fit_split), ("eval_split", exp.eval_split)):
                if name not in available:
                    raise SpecError([
                        f"experiments[{self.e_i}].{which}: dataset {exp.dataset.name!r} has "
                        f"no split {name!r}; available: {', '.join(map(str, available))}"
                    ], self.resolved.source)
            self._dataset = dataset
        return self._dataset

    def backbone(self) -> Any:
        """The backbone (built once)."""
        if self._backbone is None:
            self.dataset()  # a missing split is reported before the backbone is built
            self._backbone = self.guarded("building the backbone",
                                          lambda: self.resolved.build("backbone", self.exp.backbone))
        return self._backbone

    def labels(self, split: str) -> np.ndarray:
        """The split's labels (the dataset's own, not the backbone's), to size and check
        shards."""
        if split not in self._labels:
            dataset = self.dataset()
            data = self.guarded(f"loading split {split!r}", lambda: dataset.split(split))
            self._labels[split] = np.asarray(data.labels)
        return self._labels[split]

    def extract(self, split: str, rows: tuple[int, int] | None = None) -> ModelOutputs:
        """Run the backbone on ``split`` (only ``rows`` when given), checked."""
        dataset, backbone = self.dataset(), self.backbone()
        key, _ = self.keys[split]
        ctx = FitContext(seed=0, device=self.device, beta=1.0, progress=self.progress,
                         cache_dir=self.cache.workdir(key), rows=rows)
        what = f"split {split!r}" + (f" rows [{rows[0]}, {rows[1]})" if rows else "")
        if self.progress:
            print(f"[{self.exp.name}] extracting {self.exp.backbone.name} outputs on {what}",
                  file=sys.stderr)
        outputs = self.guarded(f"extracting {what}", lambda: backbone.extract(dataset, split, ctx))
        if not isinstance(outputs, ModelOutputs):
            raise RunError(f"{self.where}: {self.names['backbone']}.extract returned "
                           f"{type(outputs).__name__}, expected selbench.ModelOutputs")
        if rows is not None:
            expected = self.labels(split)[rows[0]:rows[1]]
            if len(outputs) != len(expected) or not np.array_equal(outputs.labels, expected):
                raise RunError(
                    f"{self.where}: {self.names['backbone']} declares shardable, but "
                    f"extract with FitContext.rows=({rows[0]}, {rows[1]}) returned "
                    f"{len(outputs)} rows that are not rows {rows[0]}..{rows[1] - 1} of split "
                    f"{split!r}; honour context.rows or remove `shardable = True`")
        return outputs

    def split(self, split: str) -> ModelOutputs:
        """The whole split's outputs: from the cache, else extracted and cached."""
        key, material = self.keys[split]
        cached = self.cache.get(key, warn=self.warn)
        if cached is None:
            cached = self.extract(split)
            self.cache.put(key, cached, material)
        return cached

    def shard(self, split: str, rows: tuple[int, int]) -> bool:
        """Extract and store one row range of ``split`` unless it is stored already (or the
        whole split is cached); returns whether it computed anything."""
        key, material = self.keys[split]
        if self.cache.path(key).is_file() or \
                self.cache.get_shard(key, rows, warn=self.warn) is not None:
            return False
        self.cache.put_shard(key, rows, self.extract(split, rows), material)
        return True

    def merge(self, split: str, shards: list[tuple[int, int]]) -> None:
        """Concatenate the stored shards of ``split`` into its cached outputs (written once,
        atomically), then delete the shards."""
        key, material = self.keys[split]
        if self.cache.get(key) is not None:
            self.cache.drop_shards(key)
            return
        parts = []
        for rows in shards:
            part = self.cache.get_shard(key, rows, warn=self.warn)
            if part is None:
                raise RunError(f"{self.where}: the outputs of split {split!r} rows "
                               f"[{rows[0]}, {rows[1]}) are missing from the cache "
                               f"{self.cache.root} after their job finished (is it on a "
                               "filesystem every job shares?); rerun to extract them again")
            if parts and part.meta != parts[0].meta:
                raise RunError(f"{self.where}: {self.names['backbone']} declares shardable, "
                               f"but its outputs' meta differ between row ranges of split "
                               f"{split!r} ({parts[0].meta} vs {part.meta})")
            parts.append(part)
        domains = [p.domain for p in parts]
        merged = ModelOutputs(
            features=np.concatenate([p.features for p in parts]),
            logits=np.concatenate([p.logits for p in parts]),
            labels=np.concatenate([p.labels for p in parts]),
            domain=None if any(d is None for d in domains) else np.concatenate(domains),
            meta=parts[0].meta,
        )
        self.cache.put(key, merged, material)
        self.cache.drop_shards(key)


def experiment_outputs(
    resolved: ResolvedSpec,
    e_i: int,
    ident: Identity,
    cache: OutputCache,
    device: str,
    progress: bool,
) -> dict[str, ModelOutputs]:
    """Backbone outputs of the experiment's fitting and evaluation splits, via the cache."""
    ex = Extraction(resolved, e_i, ident, cache, device, progress)
    return {split: ex.split(split) for split in ex.keys}


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
    force: bool = False,
    only: list[str] | tuple[str, ...] = (),
    optional: bool = True,
    executor: str | None = None,
    workers: int | None = None,
    retries: int | None = None,
) -> RunReport:
    """Run every cell of ``spec`` not already finished in ``out_dir``; write the leaderboard.

    A finished cell is reused only when its record is intact (checksums verified) and its key
    — the spec's settings, the content of every input file, the code of every plugin it uses
    and the core's metric definitions — is unchanged; every other cell is recomputed and the
    report says why (:attr:`RunReport.reasons`).

    Args:
        spec: a spec path, a raw dict, or an already resolved spec.
        out_dir: results directory (default ``results/<spec name>``).
        device: ``auto`` / ``cpu`` / ``cuda``; default the spec's ``device``.
        overrides: ``key.path=value`` strings applied before validation.
        cache_dir: where backbone outputs are cached (default :func:`default_cache_dir`).
        progress: show progress bars on stderr.
        plots: also draw the figures into ``out_dir/plots/`` (see :mod:`selbench.reporting.plots`).
        force: recompute every cell (or, with ``only``, every cell of those methods).
        only: method labels whose cells ``force`` recomputes.
        optional: run the experiments marked ``optional: true`` whose inputs are present
            (False: leave every optional experiment out); each one left out is printed and
            listed in :attr:`RunReport.skipped`.
        executor: ``inline`` / ``local`` / ``submitit`` (see :mod:`selbench.execution.executors`);
            default the spec's ``executor:`` block, else inline. Every executor gives the
            same cells and leaderboard.
        workers: worker processes of the ``local`` executor.
        retries: resubmit a failed job up to this many times (distributed executors).
    """
    from tqdm.auto import tqdm

    from selbench.reporting.leaderboard import write_leaderboard

    resolved = spec if isinstance(spec, ResolvedSpec) else load_spec(
        spec, overrides=overrides, optional=optional)
    for name, why in resolved.skipped:
        print(f"selbench: experiment {name!r} {why}", file=sys.stderr)
    labels = {m.label for e in resolved.spec.experiments for m in e.methods}
    unknown = [lab for lab in only if lab not in labels]
    if unknown:
        raise SpecError([f"--only: no method labelled {lab!r}; the spec has "
                         f"{', '.join(repr(x) for x in sorted(labels))}" for lab in unknown],
                        resolved.source)
    from selbench.execution.executors import check_environment, choose_options, require_submitit

    check_environment()  # the SELBENCH_* switches read deep inside the run
    options = choose_options(resolved.spec.executor, executor, workers, retries)
    if options.name == "submitit":
        require_submitit()  # one clear line before anything is written
    dev = resolve_device(device or resolved.spec.device)
    results = ResultsDir(out_dir if out_dir is not None else Path("results") / resolved.spec.name)
    results.prepare()
    other = results.existing_spec_name()
    if other is not None and other != resolved.spec.name:
        raise ResultsError(
            f"{results.root} holds the results of spec {other!r}, not {resolved.spec.name!r}; "
            "use another --out (two specs never share a results directory)"
        )
    cache = OutputCache(cache_dir)
    cache.prepare()
    with results.lock():
        report = _run_locked(resolved, results, cache, dev, progress, plots, force, set(only),
                             tqdm, write_leaderboard, options, device or resolved.spec.device)
    report.skipped = list(resolved.skipped)
    return report


def _run_locked(resolved, results, cache, dev, progress, plots, force, only, tqdm,
                write_leaderboard, options=None, requested_device="auto") -> RunReport:
    ident = identify(resolved, cache)
    cells = plan_cells(resolved, results, ident)
    canonical = resolved.canonical()
    results.write_spec(yaml.safe_dump(canonical, sort_keys=False, allow_unicode=True))
    prov = provenance(resolved, dev)
    prov["inputs"] = ident.inputs
    prov["code"] = {"core": ident.core, **ident.code}
    results.write_run(RunRecord(
        provenance=prov,
        spec=canonical,
        cells=[c.path.relative_to(results.root).as_posix() for c in cells],
        cell_keys=[c.key for c in cells],
    ))

    report = RunReport(results.root)
    todo: list[Cell] = []
    for c in cells:
        label = resolved.spec.experiments[c.e_i].methods[c.m_i].label
        if force and (not only or label in only):
            todo.append(c)
            report.reasons["--force"] = report.reasons.get("--force", 0) + 1
            continue
        check = results.check_cell(c.path, c.key, c.needs_arrays)
        if check.record is not None:
            continue
        todo.append(c)
        if check.problem != "missing":
            reason = why_recomputed(c, check)
            report.reasons[reason] = report.reasons.get(reason, 0) + 1
            if check.previous is None and check.problem != LEGACY:
                print(f"selbench: warning: {c.path}: {check.problem}; recomputing it",
                      file=sys.stderr)
    report.reused = len(cells) - len(todo)
    for reason, n in report.reasons.items():
        print(f"{n} cell(s) recomputed: {reason}", file=sys.stderr)
    if options is not None and options.name != "inline":
        _run_distributed(resolved, results, cache, ident, cells, todo, force, only, dev,
                         requested_device, options, progress, report)
    else:
        _run_inline(resolved, results, cache, ident, todo, dev, progress, prov["spec_hash"],
                    report, tqdm)
    report.files = write_leaderboard(results.root)
    if plots:
        from selbench.reporting.plots import write_plots

        report.files += write_plots(results.root)
    return report


def _run_inline(resolved, results, cache, ident, todo, dev, progress, spec_hash, report,
                tqdm) -> None:
    """Every unfinished cell in this process, one method (one ``fit_many``) at a time."""
    by_exp: dict[int, list[Cell]] = {}
    for c in todo:
        by_exp.setdefault(c.e_i, []).append(c)
    bar = tqdm(total=len(todo), desc="methods", unit="cell", disable=not progress or not todo)
    try:
        for e_i, exp_cells in by_exp.items():
            outputs = experiment_outputs(resolved, e_i, ident, cache, dev, progress)
            for group in method_groups(exp_cells):
                def written(cell: Cell) -> None:
                    report.computed += 1
                    bar.update(1)

                fit_cells(resolved, group, outputs, dev, results, spec_hash, written, bar)
    finally:
        bar.close()


def fit_cells(resolved: ResolvedSpec, group: list[Cell], outputs: dict[str, ModelOutputs],
              dev: str, results: ResultsDir, spec_hash: str, written=None, bar=None) -> None:
    """Fit one method's cells with one ``fit_many`` call, then score, measure and write each
    cell (atomically) as it is done; ``written(cell)`` is called after each write."""
    exp = resolved.spec.experiments[group[0].e_i]
    m = _Method(resolved, group[0].e_i, group[0].m_i, spec_hash)
    memo: dict = {}
    scheme = m.build("scheme")
    try:
        if bar is not None:
            bar.set_postfix_str(f"{exp.name}: {m.method.label} ({len(group)} replicas)")
        fitted = fit_group(resolved, group, outputs, dev, scheme, m)
        for cell in group:
            if bar is not None:
                bar.set_postfix_str(f"{exp.name}: {m.method.label} seed {cell.seed}")
            record, arrays = run_cell(resolved, cell, outputs, dev, m, fitted[cell.key], memo)
            fitted.pop(cell.key, None)  # free the fitted modules as we go
            results.write_cell(cell.path, record, arrays)
            if written is not None:
                written(cell)
    except EvaluationError as exc:  # sizes that do not fit the data
        raise RunError(str(exc)) from None


# --------------------------------------------------------------------------- distributed
@dataclass(frozen=True)
class Unit:
    """One job of a distributed run: the unfinished cells (``keys``) of one method on one
    experiment, which its scheme fits together (``stage="fit"``), or the backbone outputs of
    one split of an experiment — all its rows, or one row range (``rows``) of a large split
    for a shardable backbone (``stage="extract"``, made before any method job is
    submitted)."""

    stage: str
    e_i: int
    experiment: str
    m_i: int | None = None
    method: str | None = None
    keys: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()
    #: recompute the cells even when finished (--force); else finished ones are skipped
    force: bool = False
    #: extraction: the split, and the row range ``[start, stop)`` (None: the whole split)
    split: str | None = None
    rows: tuple[int, int] | None = None

    def describe(self) -> str:
        if self.stage == "extract":
            rows = f" rows [{self.rows[0]}, {self.rows[1]})" if self.rows else ""
            return f"experiment {self.experiment!r}: backbone outputs of split {self.split!r}{rows}"
        seeds = ", ".join(str(s) for s in dict.fromkeys(self.seeds))
        return (f"experiment {self.experiment!r}, method {self.method!r} "
                f"(experiments[{self.e_i}].methods[{self.m_i}]), seed(s) {seeds}")

    def log_name(self) -> str:
        if self.stage == "extract":
            rows = f"-rows-{self.rows[0]}-{self.rows[1]}" if self.rows else ""
            return f"{self.experiment}-extract-{slug(str(self.split))}{rows}"
        return f"{self.experiment}-{slug(self.method or '')}"


@dataclass(frozen=True)
class WorkContext:
    """What a job needs to redo the parent's plan: the validated spec (plugins resolve from
    the job's own registry), the directories and the requested device."""

    spec: Any  # selbench.spec.Spec
    raw: dict
    source: str | None
    base_dir: str
    spec_hash: str
    out_dir: str
    cache_dir: str
    device: str


_WORKER: dict[str, Any] = {}


def _worker_state(ctx: WorkContext) -> dict[str, Any]:
    """The resolved spec, identity and cell plan of ``ctx``, computed once per process."""
    from selbench.contract.registry import get_registry

    token = (ctx.spec_hash, ctx.out_dir, ctx.cache_dir, ctx.device)
    if _WORKER.get("token") == token:
        return _WORKER
    resolved = ResolvedSpec(ctx.spec, get_registry(), ctx.raw, ctx.source, base_dir=ctx.base_dir)
    if resolved.hash() != ctx.spec_hash:
        raise RunError("this job resolves the spec differently from the run that submitted it "
                       "(plugins or their versions differ on this machine?)")
    cache = OutputCache(ctx.cache_dir)
    results = ResultsDir(ctx.out_dir)
    ident = identify(resolved, cache)
    _WORKER.clear()
    _WORKER.update(token=token, resolved=resolved, cache=cache, results=results, ident=ident,
                   cells={c.key: c for c in plan_cells(resolved, results, ident)},
                   device=resolve_device(ctx.device), outputs=None)
    return _WORKER


def run_unit(ctx: WorkContext, unit: Unit) -> dict[str, int]:
    """Do one job (in a worker process or a cluster job): extract a split's outputs (or one
    row range of them), or fit, measure and write a method's cells, skipping those finished
    meanwhile (a job
    resubmitted after preemption). Returns ``{"computed": n, "reused": k}``."""
    state = _worker_state(ctx)
    resolved, ident, cache, dev = state["resolved"], state["ident"], state["cache"], state["device"]

    def outputs_of(e_i: int) -> dict[str, ModelOutputs]:
        if state["outputs"] is None or state["outputs"][0] != e_i:
            state["outputs"] = None  # free the previous experiment's outputs first
            state["outputs"] = (e_i, experiment_outputs(resolved, e_i, ident, cache, dev, False))
        return state["outputs"][1]

    if unit.stage == "extract":
        ex = Extraction(resolved, unit.e_i, ident, cache, dev, False)
        if unit.rows is None:
            ex.split(str(unit.split))
        else:
            ex.shard(str(unit.split), unit.rows)
        return {"computed": 0, "reused": 0}
    cells = [state["cells"].get(k) for k in unit.keys]
    if any(c is None for c in cells):
        raise RunError(f"experiments[{unit.e_i}].methods[{unit.m_i}] ({unit.method!r}): the "
                       "spec, an input file or plugin code changed after the run was "
                       "submitted; rerun `selbench run`")
    results: ResultsDir = state["results"]
    with results.method_lock(unit.experiment, unit.method):
        todo = [c for c in cells if unit.force or
                results.check_cell(c.path, c.key, c.needs_arrays).record is None]
        if todo:
            fit_cells(resolved, todo, outputs_of(unit.e_i), dev, results, ctx.spec_hash)
    return {"computed": len(todo), "reused": len(cells) - len(todo)}


@dataclass
class JobFailure:
    """A job that failed after every retry: what it served, its error and its log."""

    unit: Unit
    error: str
    log: str | None

    def line(self) -> str:
        log = f"\n      log: {self.log}" if self.log else ""
        return f"  - {self.unit.describe()}: {self.error}{log}"


class JobsFailed(RunError):
    """Some jobs of a distributed run failed; finished cells are kept (rerun to resume)."""

    def __init__(self, failures: list[JobFailure], total: int):
        self.failures = failures
        lines = [f"{len(failures)} of {total} job(s) failed; the cells that finished are "
                 "saved, rerun the same command (or add --retries N) to compute the rest:"]
        lines += [f.line() for f in failures]
        super().__init__("\n".join(lines))


def _submit(backend, task, units: list[Unit], retries: int, progress: bool,
            report: RunReport, what: str) -> list[JobFailure]:
    """Run ``units`` on ``backend``, resubmitting failed ones up to ``retries`` times;
    the failures left."""
    from selbench.execution.executors import Outcome

    pending = list(units)
    failed: list[tuple[Unit, Outcome]] = []
    if not pending:
        return []
    for attempt in range(retries + 1):
        if progress:
            print(f"selbench: {what}: {len(pending)} job(s) on {backend.name}"
                  + (f" (retry {attempt} of {retries})" if attempt else ""), file=sys.stderr)

        def done(unit: Unit, outcome) -> None:
            if outcome.ok and unit.stage == "fit":
                report.computed += outcome.value["computed"]
                report.reused += outcome.value["reused"]
            if progress:
                state = "done" if outcome.ok else f"FAILED: {outcome.error}"
                print(f"selbench:   {unit.describe()}: {state}", file=sys.stderr)

        outcomes = backend.run(task, pending, progress, done)
        failed = [(u, o) for u, o in zip(pending, outcomes) if not o.ok]
        if not failed:
            return []
        pending = [u for u, _ in failed]
    return [JobFailure(u, o.error or "failed", o.log) for u, o in failed]


def _extraction_units(resolved, ident, cache, todo, dev, shard_size):
    """The extraction jobs of the outputs missing from the cache — one per key (a key that
    several experiments share is extracted once), or one per row range of a split of more
    than ``shard_size`` rows when the backbone is shardable — and the shards to merge."""
    units: list[Unit] = []
    merges: list[tuple[Extraction, str, list[tuple[int, int]]]] = []
    seen: set[str] = set()
    for e_i in dict.fromkeys(c.e_i for c in todo):
        ex = Extraction(resolved, e_i, ident, cache, dev, False)
        for split, (key, _) in ex.keys.items():
            if key in seen or cache.path(key).is_file():
                continue
            seen.add(key)
            if shard_size and ex.shardable:
                n = len(ex.labels(split))
                if n > shard_size:
                    shards = [(a, min(a + shard_size, n)) for a in range(0, n, shard_size)]
                    units += [Unit("extract", e_i, ex.exp.name, split=split, rows=r)
                              for r in shards]
                    merges.append((ex, split, shards))
                    continue
            units.append(Unit("extract", e_i, ex.exp.name, split=split))
    return units, merges


def _run_distributed(resolved, results, cache, ident, cells, todo, force, only, dev,
                     requested_device, options, progress, report) -> None:
    """The unfinished cells as jobs on a local pool or a cluster (see
    :mod:`selbench.execution.executors`): first the missing backbone outputs (one job per cache key —
    split of an experiment —, or per row range of a split larger than the executor's
    ``shard_size`` for a shardable backbone, merged here once all are in), then one job per
    method; the leaderboard is written by the caller."""
    from selbench.execution.executors import UnitTask, make_backend

    backend = make_backend(options, results.root,
                           dev if options.name == "local" else requested_device)
    ctx = WorkContext(
        spec=resolved.spec, raw=resolved.raw, source=resolved.source,
        base_dir=str(resolved.base_dir), spec_hash=resolved.hash(),
        out_dir=str(results.root.resolve()), cache_dir=str(cache.root.resolve()),
        device=dev if options.name == "local" else requested_device)
    task = UnitTask(ctx, log_dir=backend.log_dir())
    extract, merges = _extraction_units(resolved, ident, cache, todo, dev,
                                        getattr(options, "shard_size", None))
    failures = _submit(backend, task, extract, options.retries, progress, report,
                       "backbone outputs")
    if failures:
        raise JobsFailed(failures, len(extract))
    for ex, split, shards in merges:
        if progress:
            print(f"selbench: [{ex.exp.name}] merging {len(shards)} row ranges of split "
                  f"{split!r}", file=sys.stderr)
        ex.merge(split, shards)
    units = []
    for group in method_groups(todo):
        method = resolved.spec.experiments[group[0].e_i].methods[group[0].m_i]
        units.append(Unit(
            "fit", group[0].e_i, resolved.spec.experiments[group[0].e_i].name, group[0].m_i,
            method.label, tuple(c.key for c in group), tuple(c.seed for c in group),
            force=bool(force and (not only or method.label in only))))
    failures = _submit(backend, task, units, options.retries, progress, report, "methods")
    if failures:
        raise JobsFailed(failures, len(units))
