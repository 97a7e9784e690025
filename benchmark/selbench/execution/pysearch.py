"""Equal-budget tuning from Python: :class:`TuneSearch` (and :func:`tune`) tune a
:class:`~selbench.SelectiveRecalibrator` on your own arrays with the spec route's protocol, in
the spirit of scikit-learn's ``*SearchCV`` (``best_params_``, ``best_score_``,
``cv_results_``, ``best_estimator_``).

It is a thin adapter over :func:`selbench.execution.tuning.tune_cell`, the function that tunes
one cell of a spec with a ``tuning:`` block: the same inner/held-out split of the fitting rows
(seeded by the estimator's ``seed``), the same Optuna trials (samplers seeded by the seed and
the method's configuration, batches fitted together), the same objective at the estimator's
``beta`` (a spec's training β), then a refit of the best parameters on every row. So the
arrays a spec's cell fits on (its ``n_fit`` rows), with the method's components as the
estimator's parameters, the cell's seed and training β, give that cell's chosen parameters
(tests/test_pysearch.py checks it against a spec on a ``precomputed`` ``.npz``).

The search space is the spec's: the spaces the plugins declare, or ``search=`` (the form of a
method's ``search:`` block, which replaces them; ``"default"`` keeps a declared one). Every
component must be a registered plugin (a name or ``{name, params}``): a plugin object is
not tuned (:class:`TuneSearch` says so).
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, clone
from sklearn.utils.validation import check_is_fitted

from selbench.contract.registry import get_registry
from selbench.execution import tuning as _tuning_module
from selbench.execution.codeid import code_digest
from selbench.execution.tuning import TuningRequest, study_name, tune_cell, with_params
from selbench.library.estimator import ParamsError, SelectiveRecalibrator
from selbench.measure.metrics import DEFAULT_BETAS
from selbench.spec.model import MethodSpec, TuningSpec, content_hash
from selbench.spec.search import check_search, method_space
from selbench.util.progress import progress_bar

__all__ = ["TuneSearch", "tune"]

_FIELDS = ("scheme", "selector", "recalibrator", "loss", "coverage")


def _method(est: SelectiveRecalibrator, search: Mapping[str, Any] | None
            ) -> tuple[dict[str, Any], MethodSpec]:
    """The estimator's components as a spec's method parameters
    (:func:`~selbench.execution.keys.method_params`' form: ``{name, params}`` with every
    validated param, absent losses None) and as a :class:`MethodSpec` with ``search``."""
    from pydantic import ValidationError

    parts = est._plan().parts
    objects = [f for f in _FIELDS if parts.get(f) is not None and parts[f].params is None]
    if objects:
        raise ParamsError([f"{f}: a plugin object; tuning sets the params of registered "
                           "plugins (give a name or {name, params}; CONTRIBUTING.md says how "
                           "to register your own)" for f in objects])
    params = {f: None if parts.get(f) is None else
              {"name": parts[f].name, "params": parts[f].params.model_dump(mode="json")}
              for f in _FIELDS}
    try:
        method = MethodSpec(label="TuneSearch", search=None if search is None else dict(search),
                            **{f: v for f, v in params.items() if v is not None})
    except ValidationError as exc:
        raise ParamsError([f"search: {e['msg']}" for e in exc.errors()]) from None
    return params, method


def _data_digest(outputs: Any) -> str:
    h = hashlib.sha256()
    for arr in (outputs.features, outputs.logits, outputs.labels):
        a = np.ascontiguousarray(arr)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


class TuneSearch(BaseEstimator):
    """Tune a :class:`~selbench.SelectiveRecalibrator` with the equal-budget protocol of a
    spec's ``tuning:`` block, on your own arrays.

    Args:
        estimator: the method to tune (default ``SelectiveRecalibrator()``, the paper's); its
            ``beta`` is the β the objective is scored at and its ``seed`` seeds the split
            and the samplers, as a cell's training β and seed do.
        trials: Optuna trials (fits on the inner rows), as ``tuning.trials``.
        objective: a registry metric scored on the held-out rows (``selbench metrics``).
        inner: the fraction of the rows held out to score trials, as ``tuning.inner``
            (with ``folds=1``).
        folds: ``tuning.folds``: k >= 2 fits each trial on k - 1 of k seeded folds and
            scores the mean over the held-out folds (less noise, k times the fits).
        over: ``"train_beta"`` (the objective at the estimator's ``beta``) or ``"betas"``
            (its AUC over ``betas``), as ``tuning.over``.
        betas: the coverage levels of ``over="betas"`` (default 0.5, 0.55, ..., 1.0).
        sampler: ``"tpe"`` or ``"random"``.
        search: ``{"<field>.<param>": {log_uniform|uniform|int: [low, high]} |
            {choice: [...]} | "default"}``, as a method's ``search:``; default: every space
            the estimator's plugins declare.
        journal: an Optuna journal file to keep the trials in: a later fit with the same
            data, method and settings continues it (more ``trials`` extend it). Default: a
            temporary file, removed after the fit.
        progress: one line per tenth of the trials on stderr (a bar on a terminal).
        pruner: ``tuning.pruner`` (``{"name": "successive-halving", "min_epochs": ...,
            "reduction_factor": ...}``): a trained method's losing trials stop early; a
            pruned trial's ``value`` in ``cv_results_`` is NaN, ranked last.

    Attributes (after :meth:`fit`):
        best_params_: the chosen ``{"<field>.<param>": value}`` (a tuned cell's ``chosen``).
        best_score_: the objective's value of the best trial on the held-out rows (as the
            metric is: lower is better for ``ece1``; see ``direction_``).
        best_index_: the best trial's index in ``cv_results_`` (the first of equal values).
        cv_results_: ``params`` (each trial's values), ``param_<field>.<param>``,
            ``value`` (the objective) and ``rank`` (1 = best), one entry per trial.
        best_estimator_: the estimator with ``best_params_`` set, refitted on every row.
        tuning_: the whole record, as a tuned cell's JSON holds it (``tuning``).
        direction_: ``"minimize"`` or ``"maximize"``.

    :meth:`predict`, :meth:`predict_confidence`, :meth:`predict_proba`,
    :meth:`decision_function`, :meth:`accept`, :meth:`evaluate` and :meth:`score` are those
    of ``best_estimator_``.
    """

    def __init__(self, estimator: Any = None, *, trials: int = 20, objective: str = "ece1",
                 inner: float = 0.3, sampler: str = "tpe",
                 search: Mapping[str, Any] | None = None, journal: str | Path | None = None,
                 progress: bool = True, folds: int = 1, over: str = "train_beta",
                 betas: Any = None, pruner: Mapping[str, Any] | None = None):
        self.estimator = estimator
        self.trials = trials
        self.objective = objective
        self.inner = inner
        self.sampler = sampler
        self.search = search
        self.journal = journal
        self.progress = progress
        self.folds = folds
        self.over = over
        self.betas = betas
        self.pruner = pruner

    def _base(self) -> SelectiveRecalibrator:
        est = SelectiveRecalibrator() if self.estimator is None else clone(self.estimator)
        if not isinstance(est, SelectiveRecalibrator):
            raise TypeError(f"estimator: expected a SelectiveRecalibrator, got "
                            f"{type(est).__name__}")
        return est

    def _tuning(self) -> TuningSpec:
        from pydantic import ValidationError

        try:
            inner = {"inner": self.inner} if self.folds == 1 else {}
            pruner = {"pruner": dict(self.pruner)} if self.pruner is not None else {}
            return TuningSpec(trials=self.trials, objective=self.objective, **inner,
                              sampler=self.sampler, folds=self.folds, over=self.over, **pruner)
        except ValidationError as exc:
            raise ParamsError([f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                               for e in exc.errors()]) from None

    def fit(self, logits: Any, labels: Any = None, features: Any = None, *,
            classes: Any = None) -> TuneSearch:
        """Tune on these labelled rows (a spec cell's fitting rows), then refit the best
        parameters on all of them; the arguments are :meth:`SelectiveRecalibrator.fit`'s."""
        est = self._base()
        tuning = self._tuning()
        params, method = _method(est, self.search)
        registry = get_registry()
        errors: list[str] = []
        check_search(registry, method, "TuneSearch", errors)
        if errors:
            raise ParamsError(errors)
        space = method_space(registry, method)
        if not space:
            raise ParamsError(["search: nothing to tune: the estimator's plugins declare no "
                               "search space; give search={'<field>.<param>': ...}"])
        fitting, _ = est._fitting_outputs(logits, labels, features, classes)
        config = {f: v for f, v in params.items() if v is not None}
        method_key = content_hash(config)  # a spec cell's components["method"]
        components = {"method": method_key, "seed": int(est.seed), "beta": float(est.beta),
                      "data": _data_digest(fitting),
                      "tuning": {"block": tuning.canonical(),
                                 "space": {p: t.to_json() for p, t in space.items()},
                                 "code": code_digest(_tuning_module)}}
        betas = [float(b) for b in (DEFAULT_BETAS if self.betas is None else self.betas)]
        if tuning.over == "betas":
            components["betas"] = betas

        def make(chosen: dict[str, Any]) -> SelectiveRecalibrator:
            return est.set_params(**with_params(params, chosen)).__sklearn_clone__()

        with tempfile.TemporaryDirectory(prefix="selbench-tune-") as tmp, progress_bar(
                total=tuning.trials, desc="tuning", unit="trial",
                disable=not self.progress) as bar:
            journal = Path(self.journal) if self.journal is not None else Path(tmp) / "journal"
            record = tune_cell(TuningRequest(
                params=params, space=space, tuning=tuning, fitting=fitting, make=make,
                seed=int(est.seed), method_key=method_key, beta=float(est.beta), betas=betas,
                journal=journal, study=study_name(components), run=_counting(bar)))
        self._adopt(record, make(record["chosen"]), logits, labels, features, classes)
        return self

    def _adopt(self, record: dict[str, Any], best: SelectiveRecalibrator, logits: Any,
               labels: Any, features: Any, classes: Any) -> None:
        from scipy.stats import rankdata

        history = record["history"]
        values = np.array([h["value"] for h in history], dtype=float)  # pruned: NaN
        order = values if record["direction"] == "minimize" else -values
        order = np.where(np.isnan(order), np.inf, order)  # pruned trials rank last
        ranks = rankdata(order, method="min").astype(int)  # 1 = best; ties share a rank
        self.cv_results_ = {"params": [h["params"] for h in history], "value": values,
                            "rank": ranks}
        for path in record["space"]:
            self.cv_results_[f"param_{path}"] = [h["params"].get(path) for h in history]
        self.tuning_ = record
        self.best_params_ = dict(record["chosen"])
        self.best_score_ = float(record["best_value"])
        self.best_index_ = int(record["best_trial"])
        self.direction_ = record["direction"]
        self.best_estimator_ = best.fit(logits, labels, features, classes=classes)

    # ------------------------------------------------------------------ delegation
    def _best(self) -> SelectiveRecalibrator:
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_

    def predict(self, logits: Any, features: Any = None) -> np.ndarray:
        return self._best().predict(logits, features)

    def predict_confidence(self, logits: Any, features: Any = None) -> np.ndarray:
        return self._best().predict_confidence(logits, features)

    def predict_proba(self, logits: Any, features: Any = None) -> np.ndarray:
        return self._best().predict_proba(logits, features)

    def decision_function(self, logits: Any, features: Any = None) -> np.ndarray:
        return self._best().decision_function(logits, features)

    def accept(self, logits: Any, features: Any = None, beta: float | None = None,
               **kwargs: Any) -> np.ndarray:
        return self._best().accept(logits, features, beta, **kwargs)

    def evaluate(self, logits: Any, labels: Any = None, features: Any = None,
                 **kwargs: Any) -> dict[str, np.ndarray]:
        return self._best().evaluate(logits, labels, features, **kwargs)

    def score(self, logits: Any, labels: Any = None, features: Any = None) -> float:
        return self._best().score(logits, labels, features)


def _counting(bar: Any) -> Callable[[str, Callable[[], Any]], Any]:
    """tune_cell's ``run(stage, fn)``: calls ``fn`` and counts a trial on the progress bar
    each time one has been scored (the stage that ends a trial)."""
    def run(stage: str, fn: Callable[[], Any]) -> Any:
        out = fn()
        if "scoring" in stage:
            bar.update(1)
        return out

    return run


def tune(estimator: Any, logits: Any, labels: Any = None, features: Any = None, *,
         classes: Any = None, **settings: Any) -> TuneSearch:
    """``TuneSearch(estimator, **settings).fit(logits, labels, features, classes=classes)``:
    the fitted search (``best_params_``, ``cv_results_``, ``best_estimator_``); ``estimator``
    None tunes the paper's method."""
    return TuneSearch(estimator, **settings).fit(logits, labels, features, classes=classes)

