"""Fitting and evaluating cells: one method's unfinished cells (its seeds × training β) are
fitted by one :meth:`~selbench.contract.api.Scheme.fit_many` call (:func:`fit_group`: the
training schemes train them as one model with :mod:`selbench.training.engine`; a scheme that
does not override it fits them one by one), then each is scored, thresholded at each
coverage β, measured (:func:`run_cell`) and written atomically (:func:`fit_cells`). Each cell
is a :class:`~selbench.library.estimator.SelectiveRecalibrator` whose parameters are the
method's YAML fields and the cell's training β, seed and device (so a Python user fitting
the same estimator on the same rows gets the cell's numbers); a failure names the plugin to
blame (:mod:`selbench.execution.guard`).
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import sys
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from selbench.contract.data import ModelOutputs
from selbench.execution.errors import RunError
from selbench.execution.guard import blame_plugin, describe_plugin, failure, fit_guarded
from selbench.execution.tuning import (
    TuningError,
    TuningRequest,
    oracle_rows,
    study_name,
    tune_cell,
    with_params,
)
from selbench.measure.evaluate import (
    EvaluationError,
    eval_rows,
    fit_indices,
    guaranteed_risk,
    guaranteed_risk_intervals,
)
from selbench.measure.evaluate import intervals as evaluate_intervals
from selbench.spec import ExperimentSpec, MethodSpec, ResolvedSpec, SpecError
from selbench.spec.model import is_oracle
from selbench.spec.search import method_space
from selbench.store.results import CellRecord, ResultsDir
from selbench.training.devices import seed_everything

if TYPE_CHECKING:  # pragma: no cover - imported when a method is built (scikit-learn is slow)
    from selbench.execution.keys import Cell
    from selbench.execution.plan import RunPlan
    from selbench.library.estimator import SelectiveRecalibrator

__all__ = ["FittedCell", "fit_cells", "fit_group", "method_groups", "run_cell", "tune_and_fit"]


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


class _Method:
    """A method's cells as :class:`~selbench.library.estimator.SelectiveRecalibrator` estimators
    (its YAML fields are the estimator's parameters), naming the plugin that fails."""

    def __init__(self, resolved: ResolvedSpec, e_i: int, m_i: int, spec_hash: str = ""):
        from selbench.library.estimator import ParamsError, SelectiveRecalibrator

        self.resolved = resolved
        self.spec_hash = spec_hash
        self.exp: ExperimentSpec = resolved.spec.experiments[e_i]
        self.method: MethodSpec = self.exp.methods[m_i]
        self.place = f"experiments[{e_i}].methods[{m_i}] ({self.method.label!r})"
        #: the seeds of the cells being fitted or evaluated, which a failure names
        self.seeds: tuple[int, ...] = ()
        self.names = {attr: describe_plugin(resolved, kind, comp)
                      for kind, attr, comp in self.method.components()}
        self.factories = [(self.names[attr], resolved.registry.get(kind, comp.name).plugin.factory)
                          for kind, attr, comp in self.method.components()]
        self.params = resolved.method_params(self.method)
        self._estimator = SelectiveRecalibrator
        try:  # validated with the spec already: the same rules, so this never fails
            self.plan = SelectiveRecalibrator(**self.params)._plan()
        except ParamsError as exc:  # pragma: no cover
            raise SpecError([f"experiments[{e_i}].methods[{m_i}].{e}" for e in exc.errors],
                            resolved.source) from None

    @property
    def where(self) -> str:
        """Where a failure happened: the method, the seeds at work and the parameters the
        spec gives its plugins (``recalibrator 'x' {"n_bins": 20}``)."""
        parts = [self.place]
        if self.seeds:
            parts.append("seed(s) " + ", ".join(str(s) for s in dict.fromkeys(self.seeds)))
        parts += [f"{attr} {comp.name!r} {json.dumps(comp.params, sort_keys=True)}"
                  for _, attr, comp in self.method.components() if comp.params]
        return ", ".join(parts)

    def estimator(self, seed: int, beta: float, device: str,
                  chosen: dict | None = None) -> SelectiveRecalibrator:
        """The (unfitted) estimator of one cell (with the tuned ``"<field>.<param>"`` values
        of ``chosen`` set)."""
        params = with_params(self.params, chosen) if chosen else self.params
        return self._estimator(**params, beta=float(beta), seed=seed, device=device)

    def building(self, attr: str, make):
        """``make()`` (build the component ``attr``), naming the plugin if it raises."""
        try:
            return make()
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as exc:
            comp = getattr(self.method, attr)
            raise failure(self.where, f"building it from params {comp.params}", exc,
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
            raise failure(self.where, stage, exc, blame_plugin(exc, self.factories)) from exc


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
        jobs.append(built.job(_fitting_rows(fit_all, idx)))
    seed_everything(cells[0].seed)
    t0 = time.perf_counter()
    m.run("fitting", lambda: fit_guarded(lambda: scheme.fit_many(jobs),
                                         [(j.recalibrator, j.selector) for j in jobs],
                                         m.pair_names()))
    share = (time.perf_counter() - t0) / len(cells)
    return {
        cell.key: FittedCell(est._adopt(built, job.outputs), share, len(cells))
        for cell, est, built, job in zip(cells, estimators, builts, jobs)
    }


#: each seed's fitting rows of a cached split, shared by the cells of every method of the
#: experiment (one copy of n_fit rows per seed instead of one per cell: measured 2.1 s of
#: the shortened method stage's time outside the cells, perf/README.md); plugins must not
#: write into them (:class:`~selbench.contract.api.FitJob`), as the core and built-ins never do
_FITTING_ROWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _fitting_rows(fit_all: ModelOutputs, idx: np.ndarray) -> ModelOutputs:
    if len(idx) == len(fit_all):
        return fit_all
    per_split = _FITTING_ROWS.setdefault(fit_all, {})
    key = hashlib.sha256(idx.tobytes()).hexdigest()
    if key not in per_split:
        per_split[key] = fit_all.subset(idx)
    return per_split[key]


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


def _cell_eval_rows(exp: ExperimentSpec, cell: Cell, outputs: dict[str, ModelOutputs],
                    method: MethodSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The cell's fitting rows, its evaluation rows and, for an oracle, the rows of the
    evaluation split it tunes on (:func:`~selbench.execution.tuning.oracle_rows`: left out of
    its evaluation)."""
    where = f"experiments[{cell.e_i}]"
    idx = fit_indices(len(outputs[exp.fit_split]), exp.n_fit, cell.seed, f"{where}.n_fit")
    rows = eval_rows(len(outputs[exp.eval_split]), idx, exp.fit_split == exp.eval_split,
                     exp.n_eval, cell.e_i)
    if cell.components.get("tuning") is None or not is_oracle(exp, method):
        return idx, rows, None
    try:
        kept, scored = oracle_rows(rows, exp.tuning.inner, cell.seed)
    except TuningError as exc:
        raise RunError(f"{where}: the oracle's {exc}") from None
    return idx, kept, scored


def _evaluation_data(
    exp: ExperimentSpec, cell: Cell, outputs: dict[str, ModelOutputs], memo: dict | None,
    method: MethodSpec,
) -> tuple[np.ndarray, ModelOutputs, tuple[str, str]]:
    """The cell's fitting rows, its evaluation outputs and their memo key (the evaluation
    split and the SHA-256 of its rows); the previous cell's subset when it is the same."""
    where = f"experiments[{cell.e_i}]"
    eval_all = outputs[exp.eval_split]
    idx, rows, _ = _cell_eval_rows(exp, cell, outputs, method)
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
    return idx, eval_out, rows_key


def _scores(m: _Method, est: SelectiveRecalibrator, eval_out: ModelOutputs,
            rows_key: tuple[str, str], memo: dict | None) -> dict[str, np.ndarray]:
    """The fitted estimator's per-example arrays on ``eval_out``, from ``memo`` when an
    identical fitted state has scored the same rows."""
    selector, recalibrator = est.selector_, est.recalibrator_
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
    return arrays


def _with_distribution(m: _Method, est: SelectiveRecalibrator, eval_out: ModelOutputs,
                       arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` with the recalibrated log-probabilities and the labels where the
    experiment shows a metric of the distribution (registry ``needs="log_probs"``)."""
    from selbench.library.adapters import log_probabilities
    from selbench.measure.metrics import METRICS

    if not any(METRICS[k].needs == "log_probs" for k in m.exp.metrics or ()):
        return arrays
    log_probs = m.run("computing the recalibrated distribution", lambda: log_probabilities(
        est.recalibrator_, eval_out, est.names_["recalibrator"], est.device_))
    return {**arrays, "log_probs": log_probs, "labels": eval_out.labels}


def _measured(m: _Method, cell: Cell, est: SelectiveRecalibrator,
              arrays: dict[str, np.ndarray]) -> tuple[dict, Any, dict | None, Any]:
    """The cell's metrics at each evaluation β, their bootstrap intervals and settings (None
    without resamples) and the estimator's selection rule."""
    exp = m.exp
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
    return metrics, intervals, boot_info, selects


def _risk_guarantee(m: _Method, est: SelectiveRecalibrator, fit_all: ModelOutputs,
                    idx: np.ndarray, arrays: dict[str, np.ndarray],
                    cell: Cell) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The experiment's risk guarantee: SGR's threshold from the fitted estimator's scores on
    the cell's own fitting rows ``idx``, measured on the evaluation ``arrays``, and the
    bootstrap intervals of those measurements (empty without resamples)."""
    rg, boot = m.exp.risk_guarantee, m.exp.bootstrap
    fit_out = fit_all if len(idx) == len(fit_all) else fit_all.subset(idx)
    fit_arrays = m.run("scoring the fitting data for the risk guarantee",
                       lambda: est._score(fit_out))
    got = guaranteed_risk(fit_arrays, arrays, cell.eval_betas, risk=rg.risk, delta=rg.delta)
    ivs: dict[str, Any] = {}
    if boot.resamples > 0:
        ivs = guaranteed_risk_intervals(fit_arrays, arrays, risk=rg.risk, delta=rg.delta,
                                        resamples=boot.resamples, level=boot.level,
                                        seed=cell.seed)
    return got, ivs


#: the backbone's raw confidence of each evaluation row set, per cached split: an
#: experiment's methods share their first seed's rows, so it is one pass over the logits per
#: experiment instead of one per method (measured 2.4 s of a profiled shortened paper stage)
_RAW_CONFIDENCE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _raw_confidence(eval_all: ModelOutputs, rows_key: tuple[str, str],
                    eval_out: ModelOutputs) -> np.ndarray:
    per_split = _RAW_CONFIDENCE.setdefault(eval_all, {})
    if rows_key not in per_split:
        per_split[rows_key] = eval_out.confidence()
    return per_split[rows_key]


def _stored_arrays(cell: Cell, arrays: dict[str, np.ndarray], eval_out: ModelOutputs,
                   eval_all: ModelOutputs, rows_key: tuple[str, str]
                   ) -> dict[str, np.ndarray] | None:
    """The per-example arrays a cell file keeps (the first seed's only)."""
    stored = None
    if cell.needs_arrays:
        # per-example arrays of the first seed, for reliability diagrams and histograms
        stored = {
            "confidence": arrays["confidence"],
            "raw_confidence": _raw_confidence(eval_all, rows_key, eval_out),
            "prediction": arrays["prediction"],
            "score": arrays["score"],
            "correct": arrays["correct"].astype(np.uint8),
            "domain": _plain(eval_out.domain),
        }
    return stored


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
    idx, eval_out, rows_key = _evaluation_data(exp, cell, outputs, memo, m.method)
    timing: dict[str, float] = {}
    est = fitted.estimator
    timing["fit_s"] = round(fitted.fit_s, 4)
    timing["fit_batch"] = fitted.batch
    t1 = time.perf_counter()
    arrays = _scores(m, est, eval_out, rows_key, memo)
    arrays = _with_distribution(m, est, eval_out, arrays)
    metrics, intervals, boot_info, selects = _measured(m, cell, est, arrays)
    if exp.risk_guarantee is not None:
        rg_metrics, rg_intervals = _risk_guarantee(m, est, outputs[exp.fit_split], idx, arrays,
                                                   cell)
        metrics.update(rg_metrics)
        if intervals is not None:
            intervals.update(rg_intervals)
    t2 = time.perf_counter()
    stored = _stored_arrays(cell, arrays, eval_out, outputs[exp.eval_split], rows_key)
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
        shared_fit_rows=shared_fit_rows(exp, len(idx), len(outputs[exp.fit_split])),
    )
    return record, stored


def shared_fit_rows(exp: Any, n_rows: int, n_split: int) -> bool | None:
    """True (with a warning, once per experiment) when every seed fits the same rows: ``n_fit``
    unset or the whole fitting split, so the seeds vary only the methods' own randomness, a
    deterministic method's std over seeds is 0 and a paired test over seeds has no data
    variation to test (the leaderboard then shows no significance marks). None otherwise."""
    if n_rows < n_split:
        return None
    warnings.warn(
        f"experiment {exp.name!r}: every seed fits the same {n_rows} rows of '{exp.fit_split}' "
        "(n_fit unset or equal to the split's size), so seeds do not resample the fitting data "
        "and the leaderboard shows no significance test; set n_fit below the split's size",
        UserWarning, stacklevel=2)
    return True


def tune_and_fit(resolved: ResolvedSpec, cell: Cell, outputs: dict[str, ModelOutputs],
                 device: str, m: _Method, results: ResultsDir) -> tuple[FittedCell, dict]:
    """Tune one cell on its fitting rows (:func:`selbench.execution.tuning.tune_cell`; the
    evaluation split is never passed), then refit the best parameters on all of them."""
    exp = m.exp
    fit_all = outputs[exp.fit_split]
    fitting = fit_all.subset(fit_indices(len(fit_all), exp.n_fit, cell.seed,
                                         f"experiments[{cell.e_i}].n_fit"))

    def make(chosen: dict) -> SelectiveRecalibrator:
        return m.estimator(cell.seed, cell.train_beta, device, chosen)

    journal = results.journal_path(exp.name, m.method.label, cell.seed)
    _, _, scored = _cell_eval_rows(exp, cell, outputs, m.method)
    target = None if scored is None else outputs[exp.eval_split].subset(scored)
    t0 = time.perf_counter()
    info = tune_cell(TuningRequest(
        params=m.params, space=method_space(resolved.registry, m.method), tuning=exp.tuning,
        fitting=fitting, make=make, seed=cell.seed, method_key=cell.components["method"],
        beta=float(cell.train_beta), betas=exp.betas, journal=journal,
        study=study_name(cell.components), target=target, run=m.run))
    t1 = time.perf_counter()
    est = make(info["chosen"])
    m.run("fitting (the tuned parameters, on all fitting rows)", lambda: est.fit(fitting))
    info["tune_s"] = round(t1 - t0, 4)
    return FittedCell(est, time.perf_counter() - t1, 1), info


def fit_cells(plan: RunPlan, group: list[Cell], outputs: dict[str, ModelOutputs], dev: str,
              written=None, bar=None) -> None:
    """Fit one method's cells of ``plan`` with one ``fit_many`` call (tuned cells: each tuned
    and fitted by :func:`tune_and_fit`), then score, measure and write each cell (atomically)
    as it is done; ``written(cell, record)`` is called after each write, with the record
    written."""
    resolved, results = plan.resolved, plan.results
    exp = resolved.spec.experiments[group[0].e_i]
    m = _Method(resolved, group[0].e_i, group[0].m_i, plan.spec_hash)
    memo: dict = {}
    tuned = group[0].components.get("tuning") is not None
    try:
        if bar is not None:
            bar.set_postfix_str(f"{exp.name}: {m.method.label} ({len(group)} replicas)")
        m.seeds = tuple(c.seed for c in group)
        fitted = {} if tuned else fit_group(resolved, group, outputs, dev, m.build("scheme"), m)
        for cell in group:
            m.seeds = (cell.seed,)
            if bar is not None:
                bar.set_postfix_str(f"{exp.name}: {m.method.label} seed {cell.seed}")
            info = None
            if tuned:
                fitted[cell.key], info = tune_and_fit(resolved, cell, outputs, dev, m, results)
            record, arrays = run_cell(resolved, cell, outputs, dev, m, fitted[cell.key], memo)
            if info is not None:
                record = record.model_copy(update={"tuning": info})
            fitted.pop(cell.key, None)  # free the fitted modules as we go
            sealed = results.write_cell(cell.path, record, arrays)
            if written is not None:
                written(cell, sealed)
    except (EvaluationError, TuningError) as exc:  # sizes that do not fit the data
        raise RunError(str(exc)) from None
