"""Equal-budget tuning of one cell (an experiment's ``tuning:`` block): the cell's fitting rows
are split into an inner part and a held-out part (seeded by the cell's seed, the same split
for every method), ``trials`` Optuna trials each fit the method with sampled parameters on the
inner part and score the objective on the held-out part at the cell's training β, and the
best parameters are returned for the refit on all fitting rows (:mod:`selbench.execution.cells`).
Only the fitting rows are passed here: the evaluation split is never seen while tuning.

With ``folds: k`` the fitting rows are cut into k seeded folds (:func:`fold_splits`) and a
trial is fitted on k − 1 of them and scored on the held-out one, k times; its value is the
mean. With ``over: betas`` a score is the objective's AUC over the experiment's β instead of
its value at the training β. An oracle (``oracle: true``) is the exception to the rule above:
its trials are fitted on all fitting rows and scored on ``target``, a seeded share of the
cell's evaluation rows with their labels (:func:`oracle_rows`), which the cell then leaves
out of its evaluation; its label says "(oracle)".

Trials live in an Optuna journal file per (experiment, method, seed) under the results folder
(``tuning/<experiment>/<method>/seed<s>.journal``), one study per cell named by the digest of
everything that decides its trials except their number (:func:`study_name`): a rerun after a
kill continues the study, a larger ``trials`` extends it, and an edited plugin, spec or
search space starts a new one. Each trial's sampler is seeded from the cell's seed, the
method's key and the trial's index (0, 1, ...), as in a study run one trial at a time.

Trials run in batches (:func:`trial_batches`, fixed edges: 0, 10, 15, 20, ... with TPE):
a batch's trials are asked (Optuna's ask and tell, of an in-memory study holding the
journal's trials before the batch), their estimators fitted on the inner rows together —
one :meth:`~selbench.contract.api.Scheme.fit_configurations` call, which the training
schemes run as one model, each trial a replica with its own learning rate, epochs and
noise — then each scored and written to the journal, complete or failed. Random-search
trials and TPE's random start (its first :data:`STARTUP`) are therefore exactly those of
the one-at-a-time study; a later TPE trial learns from the batches before its own only.
Whatever the journal holds of a batch, its other trials are asked from the trials before
it, so a study resumed after a kill, or extended to more trials, asks what the
uninterrupted study asked. A batch that fails to fit is fitted again one trial at a time,
as before, so a failing trial fails (with the error the one-at-a-time study raised) after
the trials before it are written. With folds, the batch is fitted once per fold (one
:meth:`~selbench.contract.api.Scheme.fit_configurations` call each), fold after fold.

With ``pruner`` (multi-fidelity tuning, one held-out part) a batch's trials report the
objective on the held-out rows at Optuna's successive-halving rungs (:func:`rungs`, in
epochs) while they train, through a judge on their fit contexts
(:class:`~selbench.execution.studies.BatchJudge`, :mod:`selbench.contract.judge`), and
Optuna's successive-halving rule stops the losing ones, each judged against every trial
that reached the rung (the batch's replicas reach it together; exact ties ranked by index,
so that no more go on than the rule promotes; never at a trial's own last epoch: see the
judge): a training scheme drops them from the batch's model. A pruned trial is written
``PRUNED`` with its reported values and rungs (what a resumed study judges the rest of its
batch against) and is never chosen.

A batch that is not the study's last stops at its first rung: the trials it keeps there
are deferred (:mod:`selbench.execution.studies`), written ``PRUNED`` with ``DEFERRED`` (the
epoch) and ``END``, and the later batches are asked from them as from complete trials worth
their value there. The last batch trains them from the start beside its own trials and
judges them with its own at the rungs above, then writes the record that completes each
(its value, the values it reported) or the one that ends it pruned at a rung
(``DROPPED``). So the batches before the last cost one first rung each, and a trial that
searches 400 epochs is paid for once, beside the others, and only when it wins at every
rung: measured on the tuned digits experiment's S-MMCE joint (20 TPE trials, one thread,
seed 0, 2026-12-02), 8.1x one untuned fit without deferral, 4.7-5.3x when a batch ran on
past its first rung until its kept trials would not be judged again, 4.2x now
(``perf/README.md``). A resumed study repeats it: the deferred trials the journal has not
completed are the last batch's, whatever else it holds, and those it completed count at the
rungs they reached; a study extended to more trials continues from its journal, its former
last batch's trials complete (not deferred), so its later asks are not those of a study run
straight to the larger number.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from selbench.contract.data import ModelOutputs
from selbench.contract.search import Tune
from selbench.execution import studies
from selbench.execution.codeid import code_digest
from selbench.execution.guard import fit_guarded
from selbench.execution.journal import journal_storage
from selbench.execution.studies import rungs
from selbench.measure.evaluate import score
from selbench.measure.metrics import METRICS, auc, selective_metrics
from selbench.spec import ExperimentSpec, MethodSpec, ResolvedSpec, content_hash
from selbench.spec.model import TuningSpec, is_oracle
from selbench.spec.search import method_space

__all__ = ["TuningError", "TuningRequest", "fold_splits", "inner_split", "oracle_rows", "rungs",
           "study_name", "trial_batches", "tune_cell", "tuning_components", "with_params"]

#: Trials that ended without a finite objective score this, the worst value.
WORST = float("inf")
#: TPE's random start (``TPESampler(n_startup_trials=...)``, Optuna's default pinned): its
#: first trials are sampled at random whatever came before them, so they are one batch.
STARTUP = 10
#: TPE trials fitted together after the random start: a batch is sampled from the trials of
#: the batches before it only. Measured on the tuned digits experiment, 20 trials, 5 seeds,
#: best held-out ECE₁ (mean) and CPU seconds of the tuning for batches of 1 (the sequential
#: study) / 2 / 5 / 10, and random search: S-TLBCE joint .0046 / .0054 / .0050 / .0058 /
#: .0061 in 5.4 / 3.2 / 2.2 / 1.9 / 1.8 s; S-MMCE seq. .0114 / .0139 / .0114 / .0135 / .0128
#: in 4.6 / 4.1 / 2.9 / 2.4 / 3.1 s: batches of 5 keep TPE's gain over random search, 10 lose it.
BATCH = 5
#: random-search trials fitted together (independent of each other: only memory bounds it)
RANDOM_BATCH = 20
#: the seed salt of an oracle's rows of the evaluation split (:func:`oracle_rows`)
ORACLE_SALT = 0x0AC1E
def _direct(stage: str, fn: Callable[[], Any]) -> Any:
    return fn()


@dataclass(frozen=True)
class TuningRequest:
    """What :func:`tune_cell` tunes: one cell's method, rows and study (made by the runner's
    cells, :mod:`selbench.execution.cells`, the Python search,
    :mod:`selbench.execution.pysearch`, and ``perf/bench_tuning.py``; consumed by
    :func:`tune_cell` and the trials' :class:`_Objective`).

    ``params`` are the estimator's method parameters (``"<field>"`` -> ``{"name",
    "params"}``, :func:`~selbench.execution.keys.method_params`), ``space`` the tuned ones
    (:func:`~selbench.spec.search.method_space`), ``tuning`` the experiment's block,
    ``fitting`` the cell's fitting rows, ``make(chosen)`` builds the cell's unfitted
    estimator with ``chosen`` set, ``seed`` draws the splits and seeds the sampler with
    ``method_key`` (any string naming the method), ``beta`` is the cell's training β and
    ``betas`` the coverage levels of ``over: betas``. ``journal``: the Optuna journal file
    the study ``study`` lives in (resumable; None: in memory). ``target``: labelled rows of
    the evaluation split to score trials on, fitted on all of ``fitting`` (an oracle; None:
    the fitting rows only). ``run(stage, fn)`` calls ``fn`` (the runner's names the plugin
    that fails)."""

    params: dict[str, Any]
    space: dict[str, Tune]
    tuning: TuningSpec
    fitting: ModelOutputs
    make: Callable[[dict[str, Any]], Any]
    seed: int
    method_key: str
    beta: float
    betas: Sequence[float] | None = None
    journal: Path | None = None
    study: str = "selbench"
    target: ModelOutputs | None = None
    run: Callable[[str, Callable[[], Any]], Any] = field(default=_direct)


class TuningError(ValueError):
    """The fitting rows cannot be split as the tuning block asks."""


def tuning_components(resolved: ResolvedSpec, exp: ExperimentSpec,
                      method: MethodSpec) -> dict[str, Any] | None:
    """What tuning adds to a cell's key (the block, the method's space and this procedure's
    code), or None when the method is fitted with its parameters (no tuning block, or no
    parameter to tune)."""
    if exp.tuning is None:
        return None
    space = method_space(resolved.registry, method)
    if not space:
        return None
    oracle = {"oracle": True} if is_oracle(exp, method) and not exp.tuning.oracle else {}
    return {"block": {**exp.tuning.canonical(), **oracle},
            "space": {path: tune.to_json() for path, tune in space.items()},
            "code": code_digest(sys.modules[__name__])}


def study_name(components: dict[str, Any]) -> str:
    """A cell's study: the digest of its key's material without the number of trials."""
    material = {k: v for k, v in components.items() if k != "names"}
    material["tuning"] = {**material["tuning"],
                          "block": {k: v for k, v in material["tuning"]["block"].items()
                                    if k != "trials"}}
    return "selbench-" + content_hash(material)[:32]


def with_params(params: dict[str, Any], chosen: dict[str, Any]) -> dict[str, Any]:
    """The estimator's method parameters (:func:`~selbench.execution.keys.method_params`) with
    the ``"<field>.<param>"`` values of ``chosen`` set."""
    out = copy.deepcopy(params)
    for path, value in chosen.items():
        attr, _, name = path.partition(".")
        out[attr]["params"][name] = value
    return out


def inner_split(n: int, inner: float, seed: int, salt: int = 0x7E57,
                what: str = "fitting rows") -> tuple[np.ndarray, np.ndarray]:
    """(inner rows, held-out rows) of ``n`` fitting rows, ``round(inner * n)`` held out
    (``salt``: another seeded draw, such as the oracle's rows of the evaluation split)."""
    n_held = int(round(inner * n))
    if n_held < 1 or n_held > n - 1:
        raise TuningError(f"tuning.inner={inner:g} of {n} {what} leaves "
                          f"{n - n_held} to keep and {n_held} to score; both need at least one")
    perm = np.random.default_rng([seed, salt]).permutation(n)
    return np.sort(perm[n_held:]), np.sort(perm[:n_held])


def oracle_rows(rows: np.ndarray, inner: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows left to evaluate, rows an oracle scores its trials on) of a cell's evaluation
    rows ``rows``: a seeded ``round(inner * n)`` of them (drawn apart from the fitting
    split's inner part) are the oracle's, and are never evaluated."""
    keep, scored = inner_split(len(rows), inner, seed, ORACLE_SALT, "evaluation rows")
    return rows[keep], rows[scored]


def fold_splits(fitting: ModelOutputs, folds: int, seed: int
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(fitted rows, held-out rows) of each of ``folds`` folds of the fitting rows
    (scikit-learn's ``StratifiedKFold`` on the backbone's top-label correctness, shuffled with
    a seed drawn from the cell's seed, or ``KFold`` when right or wrong predictions are fewer
    than ``folds``): every row is held out once."""
    from sklearn.model_selection import KFold, StratifiedKFold

    n = len(fitting)
    if folds > n:
        raise TuningError(f"tuning.folds={folds} of {n} fitting rows: each fold needs a row")
    correct = fitting.correct()
    state = _seed(seed, "folds")
    if min(int(correct.sum()), int(n - correct.sum())) >= folds:
        kf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=state)
        return [(a, b) for a, b in kf.split(np.zeros(n), correct)]
    kf = KFold(n_splits=folds, shuffle=True, random_state=state)
    return [(a, b) for a, b in kf.split(np.zeros(n))]


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")


def _sampler(kind: str, seed: int):
    import optuna

    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # no constant liar: the running trials of the batch being asked never steer each other
    # (a batch is sampled from the batches before it, resumed or not)
    return optuna.samplers.TPESampler(seed=seed, constant_liar=False,
                                      n_startup_trials=STARTUP)


def _storage(journal: Path | None):
    """The journal's Optuna storage (:func:`~selbench.execution.journal.journal_storage`),
    or an in-memory one without a journal (a Python caller tuning arrays)."""
    import optuna

    if journal is None:
        return optuna.storages.InMemoryStorage()
    return journal_storage(journal)


def _suggest(trial: Any, path: str, tune: Tune) -> Any:
    if tune.dist == "choice":  # Optuna's choices are scalars: JSON strings stand for values
        return json.loads(trial.suggest_categorical(
            path, [json.dumps(c, sort_keys=True) for c in tune.choices]))
    if tune.dist == "int":
        return trial.suggest_int(path, int(tune.low), int(tune.high))
    return trial.suggest_float(path, tune.low, tune.high, log=tune.dist == "log_uniform")


def _decoded(params: dict[str, Any], space: dict[str, Tune]) -> dict[str, Any]:
    return {p: json.loads(v) if space[p].dist == "choice" else v for p, v in params.items()}


def _configured(params: dict[str, Any], space: dict[str, Tune]) -> dict[str, Any]:
    """The method's own values of the tuned parameters that lie in the space (Optuna's form):
    the first trial, so tuning never ends worse than the configuration on the held-out part."""
    out = {}
    for path, tune in space.items():
        attr, _, name = path.partition(".")
        value = params[attr]["params"].get(name)
        if tune.contains(value):
            out[path] = json.dumps(value, sort_keys=True) if tune.dist == "choice" else value
    return out


def trial_batches(trials: int, sampler: str) -> list[range]:
    """The trials fitted together, by index: with ``tpe`` its random start (the first
    :data:`STARTUP`, sampled whatever came before them) is one batch, then batches of
    :data:`BATCH`, each sampled from every trial of the batches before it; with ``random``
    (no trial depends on another) batches of :data:`RANDOM_BATCH`. The last is cut at
    ``trials``."""
    if sampler == "random":
        edges = list(range(0, trials, RANDOM_BATCH))
    else:
        edges = [0, *range(STARTUP, trials, BATCH)][: 1 if trials <= STARTUP else None]
    return [range(a, b) for a, b in zip(edges, [*edges[1:], trials]) if a < trials]


def _fit_together(estimators: list[Any], outputs: ModelOutputs,
                  judge: studies.BatchJudge | None = None) -> None:
    """Fit unfitted estimators on ``outputs`` as :meth:`SelectiveRecalibrator.fit` would,
    their schemes' jobs fitted by one
    :meth:`~selbench.contract.api.Scheme.fit_configurations` call per scheme class (the
    training schemes train every trial of one architecture as one model); ``judge`` (a
    pruned study) set on every job's context."""
    builts = [est._build() for est in estimators]
    if judge is not None:
        for position, (est, built) in enumerate(zip(estimators, builts)):
            judge.bind(position, est, built, outputs)
    by_class: dict[type, list[int]] = {}
    for i, built in enumerate(builts):
        by_class.setdefault(type(built.scheme), []).append(i)
    names = (builts[0].names.get("recalibrator", "the recalibrator"),
             builts[0].names.get("selector", "the selector"))
    for cls, members in by_class.items():
        pairs = [(builts[i].scheme, builts[i].job(outputs)) for i in members]
        fit_guarded(lambda cls=cls, pairs=pairs: cls.fit_configurations(pairs),
                    [(job.recalibrator, job.selector) for _, job in pairs], names)
    for est, built in zip(estimators, builts):
        est._adopt(built, outputs)


class _Objective:
    """The trials of one cell: fit a batch of them on each split's fitted rows, score each on
    its held-out rows; a trial's objective is the mean of its scores over the splits."""

    def __init__(self, request: TuningRequest,
                 splits: list[tuple[ModelOutputs, ModelOutputs]]):
        tuning = request.tuning
        self.make, self.space, self.splits = request.make, request.space, splits
        self.objective, self.run = tuning.objective, request.run
        self.over_betas = tuning.over == "betas"
        self.betas = ([float(b) for b in request.betas] if self.over_betas
                      else [float(request.beta)])
        self.sign = 1.0 if METRICS[tuning.objective].lower_is_better else -1.0
        self.pruner = tuning.pruner

    def fit(self, chosen: list[dict[str, Any]], rows: ModelOutputs,
            judge: studies.BatchJudge | None = None) -> tuple[list[Any], BaseException | None]:
        """The fitted estimators of the trials ``chosen`` on ``rows``, fitted together; when
        that fails, fitted one by one as the sequential procedure did, up to the first that
        fails (returned with its error, which the caller raises after telling the others).
        ``judge``: a pruned study's, which stops losing trials while the batch trains."""
        if len(chosen) > 1 or judge is not None:
            estimators = [self.make(c) for c in chosen]
            try:
                self.run("tuning (fitting a batch of trials on the inner rows)",
                         lambda: _fit_together(estimators, rows, judge))
                return estimators, None
            except (KeyboardInterrupt, GeneratorExit):
                raise
            except BaseException:  # some trial fails: fitted one by one below, to tell which
                if judge is not None:  # the trials below train to their end
                    judge.pruned.clear()
                    judge.deferred.clear()
        fitted = []
        for c in chosen:
            est = self.make(c)
            try:
                self.run("tuning (fitting a trial on the inner rows)",
                         lambda est=est: est.fit(rows))
            except (KeyboardInterrupt, GeneratorExit):
                raise
            except BaseException as exc:
                return fitted, exc
            fitted.append(est)
        return fitted, None

    def values(self, chosen: list[dict[str, Any]], judge: studies.BatchJudge | None = None
               ) -> tuple[list[float | None], BaseException | None]:
        """The objective of each of the trials ``chosen`` (one split after the other, each a
        batch), up to the first trial that fails to fit or to score on some split, with that
        error: the trials before it are complete on every split, as in the sequential study.
        A trial ``judge`` pruned (one split only) has None."""
        sums = [0.0] * len(chosen)
        n_ok, error = len(chosen), None
        for fitted_rows, held in self.splits:
            fitted, exc = self.fit(chosen[:n_ok], fitted_rows, judge)
            if exc is not None:
                n_ok, error = len(fitted), exc
            for i, est in enumerate(fitted[:n_ok]):
                if judge is not None and (i in judge.pruned or i in judge.deferred):
                    continue
                try:
                    sums[i] += self.score(est, held)
                except (KeyboardInterrupt, GeneratorExit):
                    raise
                except BaseException as exc:
                    n_ok, error = i, exc
                    break
        stopped = {**judge.pruned, **judge.deferred} if judge is not None else {}
        return [None if i in stopped else total / len(self.splits)
                for i, total in enumerate(sums[:n_ok])], error

    def score(self, est: Any, held: ModelOutputs) -> float:
        """The objective of a fitted trial on the held-out rows ``held``: at the cell's β, or
        its AUC over the experiment's β (``over: betas``); from the selective metrics alone (a
        fraction of a millisecond) when it is one of them, else from
        :meth:`~selbench.SelectiveRecalibrator.evaluate` (every metric). The value
        :meth:`evaluate` gives either way."""
        def value() -> float:
            names = (est.names_["recalibrator"], est.names_["selector"])
            arrays = score(held, est.recalibrator_, est.selector_, names)
            selects = bool(getattr(est.selector_, "selects", True))
            metrics = selective_metrics(arrays["score"], arrays["confidence"],
                                        arrays["correct"], self.betas if selects else [1.0],
                                        seed=int(est.seed))
            if self.objective not in metrics:
                metrics = est.evaluate(held, betas=self.betas)
            values = np.asarray(metrics[self.objective], dtype=float)
            if self.over_betas and selects:
                return auc(self.betas, values)
            return float(values[0])

        v = self.run("tuning (scoring a trial on the held-out rows)", value)
        return v if math.isfinite(v) else self.sign * WORST


def _ask(asking: Any, objective: _Objective, sampler: str, seed: int, index: int,
         fixed: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Trial ``index`` asked of the in-memory study ``asking``: its sampler seeded by the
    cell's seed and the index (``fixed`` values set), its parameters suggested at once."""
    import optuna

    base = _sampler(sampler, _seed(seed, index))
    asking.sampler = optuna.samplers.PartialFixedSampler(fixed, base) if fixed else base
    trial = asking.ask()
    chosen = {path: _suggest(trial, path, tune) for path, tune in objective.space.items()}
    return trial, chosen


def _run_batch(study: Any, objective: _Objective, batch: range, todo: range, sampler: str,
               seed: int, configured: dict[str, Any], last: bool = True) -> None:
    """Run the trials ``todo`` of ``batch`` (all of it, or its end after a kill): ask them
    of an in-memory study holding the journal's trials before the batch (what each of the
    batch's trials is sampled from, however much of the batch the journal has), fit them
    together, score each and write it to the journal. A trial that fails is written failed
    (and those after it, which the one-at-a-time study never reached), its error raised.
    In a pruned study the in-memory study also holds the batch's trials the journal has
    (added once the others are asked: what the pruner compares them with), and a trial the
    pruner stops is written pruned. A batch that is not the study's ``last`` defers the
    trials it keeps at its first rung (:class:`~selbench.execution.studies.BatchJudge`):
    written deferred, asked from as complete with their value there, and trained from the
    start with the last batch's trials (the deferred trials before ``batch.stop`` that the
    journal has not completed; those it completed count at the rungs they reached), judged
    with them at the rungs above, each then written complete, or pruned where the last
    batch stopped it."""
    import optuna

    pruner = studies.optuna_pruner(objective.pruner)
    asking = optuna.create_study(direction=study.direction,
                                 **({"pruner": pruner} if pruner is not None else {}))
    records = studies.finished_records(study)
    asking.add_trials([studies.as_asked(first) for first, _ in records
                       if first.user_attrs[studies.INDEX] < batch.start])
    asked = [_ask(asking, objective, sampler, seed, k, configured if k == 0 else {})
             for k in todo]
    judge, carried = None, []
    if pruner is not None:
        asking.add_trials([first for first, _ in records
                           if batch.start <= first.user_attrs[studies.INDEX] < todo.start])
        completed = []
        if last:
            carried = [first for first, done in records
                       if studies.is_deferred(first) and done is None
                       and first.user_attrs[studies.INDEX] < batch.stop]
            completed = [done for first, done in records
                         if studies.DEFERRED in first.user_attrs and done is not None]
        judge = studies.BatchJudge(objective, [trial for trial, _ in asked],
                                   objective.splits[0][1], defer=not last, carried=carried,
                                   study=asking, first=todo.start, completed=completed)
    values, error = objective.values([chosen for _, chosen in asked] +
                                     [_decoded(t.params, objective.space) for t in carried],
                                     judge)
    for position, (k, (trial, _)) in enumerate(zip(todo, asked)):
        value = values[position] if position < len(values) else None
        if judge is not None and position in judge.pruned:
            asking.tell(trial, state=optuna.trial.TrialState.PRUNED)
        studies.record_trial(study, trial, k, value, asking if judge is not None else None,
                             judge.deferred.get(position) if judge is not None else None)
    for position, first in enumerate(carried, start=len(asked)):
        if position < len(values):
            studies.record_completion(study, first, values[position], judge.rungs,
                                      judge.pruned.get(position), judge.reported.get(position))
    if error is not None:
        raise error


def _run_trials(study: Any, objective: _Objective, trials: int, sampler: str, seed: int,
                configured: dict[str, Any]) -> list[Any]:
    """Complete ``trials`` trials of ``study`` (those already complete count), batch by
    batch (:func:`trial_batches`), and the deferred ones among them; the first ``trials``
    finished ones, by index (a deferred trial by the record that completes it)."""
    batches = trial_batches(trials, sampler)
    while True:
        records = studies.finished_records(study)
        if len(records) >= trials:
            if not any(studies.is_deferred(first) and done is None
                       for first, done in records[:trials]):
                return [first if done is None else done for first, done in records[:trials]]
            # written up to the last batch's trials, not the completions: those alone
            last = batches[-1]
            _run_batch(study, objective, last, range(last.stop, last.stop), sampler, seed,
                       configured)
            continue
        batch = next(b for b in batches if len(records) in b)
        _run_batch(study, objective, batch, range(len(records), batch.stop), sampler, seed,
                   configured, last=batch == batches[-1])


def _splits(tuning: TuningSpec, fitting: ModelOutputs, seed: int,
            target: ModelOutputs | None) -> tuple[list[tuple[ModelOutputs, ModelOutputs]],
                                                  dict[str, Any]]:
    """The (fitted, held-out) outputs a trial is fitted and scored on, and their sizes for
    the record: an oracle fits on all fitting rows and scores on ``target``; one held-out
    part (``folds: 1``, ``inner``) or ``folds`` folds otherwise."""
    if target is not None:
        return [(fitting, target)], {"n_inner": len(fitting), "n_heldout": len(target)}
    if tuning.folds == 1:
        inner_idx, held_idx = inner_split(len(fitting), tuning.inner, seed)
        return ([(fitting.subset(inner_idx), fitting.subset(held_idx))],
                {"n_inner": int(len(inner_idx)), "n_heldout": int(len(held_idx))})
    folds = fold_splits(fitting, tuning.folds, seed)
    return ([(fitting.subset(a), fitting.subset(b)) for a, b in folds],
            {"n_inner": [int(len(a)) for a, _ in folds],
             "n_heldout": [int(len(b)) for _, b in folds]})


def _history(done: list[Any], space: dict[str, Tune]) -> list[dict[str, Any]]:
    """Each trial's params and objective value, in order; in a pruned study its reported
    values (``reported``: epoch -> value) and, for a pruned trial, ``pruned_at`` (the
    epoch) and no value."""
    import optuna

    out = []
    for t in done:
        entry: dict[str, Any] = {"params": _decoded(t.params, space)}
        if t.state == optuna.trial.TrialState.PRUNED:
            entry.update(value=None, pruned_at=int(t.last_step))
        else:
            entry["value"] = float(t.value)
        if studies.DEFERRED in t.user_attrs:
            entry["deferred_at"] = int(t.user_attrs[studies.DEFERRED])
        if t.intermediate_values:
            entry["reported"] = {str(k): float(v) for k, v in
                                 sorted(t.intermediate_values.items())}
        out.append(entry)
    return out


def tune_cell(request: TuningRequest) -> dict[str, Any]:
    """Tune one cell on its fitting rows (:class:`TuningRequest`); the record of
    :attr:`CellRecord.tuning` (``chosen``: the best ``"<field>.<param>"`` values,
    ``history``: each trial's params and objective value, in order; a pruned study's
    pruned trials have no value and are never chosen). No results folder is needed."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tuning, betas, target = request.tuning, request.betas, request.target
    over_betas = tuning.over == "betas"
    if over_betas and (betas is None or len(betas) < 2):
        raise TuningError("tuning.over: betas needs at least two coverage levels (betas)")
    splits, sizes = _splits(tuning, request.fitting, request.seed, target)
    objective = _Objective(request, splits)
    lower = METRICS[tuning.objective].lower_is_better
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        st = optuna.create_study(study_name=request.study, storage=_storage(request.journal),
                                 direction="minimize" if lower else "maximize",
                                 load_if_exists=True)
        done = _run_trials(st, objective, tuning.trials, tuning.sampler,
                           _seed(request.seed, request.method_key),
                           _configured(request.params, request.space))
    history = _history(done, request.space)
    values = [h["value"] if h["value"] is not None else math.nan for h in history]
    if all(math.isnan(v) for v in values):
        raise TuningError("tuning.pruner pruned every trial: no trial to choose")
    best = int(np.nanargmin(values) if lower else np.nanargmax(values))  # first of equals
    pruned = sum(h["value"] is None for h in history)
    return {
        "objective": tuning.objective,
        "direction": "minimize" if lower else "maximize",
        "beta": float(request.beta),
        **({"over": "betas", "betas": [float(b) for b in betas]} if over_betas else {}),
        "sampler": tuning.sampler,
        "trials": tuning.trials,
        **({"folds": tuning.folds} if tuning.folds > 1 and target is None else
           {"inner": tuning.inner}),
        **({"oracle": True} if target is not None else {}),
        **({"pruner": tuning.pruner.model_dump(mode="json"), "pruned": pruned}
           if tuning.pruner is not None else {}),
        **sizes,
        "space": {path: t.to_json() for path, t in request.space.items()},
        "chosen": history[best]["params"],
        "best_value": history[best]["value"],
        "best_trial": best,
        "history": history,
        "study": request.study,
    }
