"""The records of a tuning study and the judge of a pruned batch (multi-fidelity tuning).

:mod:`selbench.execution.tuning` runs a cell's study batch by batch; this module holds what
its journal records look like and how a pruned batch is judged while it trains:

* :func:`rungs` and :func:`optuna_pruner`: Optuna's successive-halving rungs (in epochs)
  and pruner of a spec's ``tuning.pruner``;
* :class:`BatchJudge`: the :class:`~selbench.contract.judge.EpochJudge` on every trial of a
  batch, which reports each trial's objective at a rung, lets Optuna decide, defers the
  long survivors of a batch that is not the study's last (:meth:`BatchJudge._defer`) and,
  in the last batch, judges a deferred trial again where it was deferred
  (:meth:`BatchJudge._resumes`);
* :func:`record_trial`, :func:`record_completion`: a trial written to the journal (complete,
  failed, pruned or deferred; a deferred trial completed, or dropped, later);
* :func:`finished_records`, :func:`is_deferred`, :func:`as_asked`: the journal read back,
  each trial by index as its first record and the record that completes it, and a trial as
  the later batches are asked from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from selbench.contract.data import ModelOutputs
from selbench.contract.judge import EpochJudge
from selbench.spec.model import PrunerSpec

__all__ = ["DEFERRED", "DROPPED", "END", "INDEX", "MAX_RUNG", "RUNG_ATTR", "BatchJudge",
           "as_asked", "finished_records", "is_deferred", "optuna_pruner", "promoted",
           "record_completion", "record_trial", "rungs"]

#: the user attribute holding a trial's index (0, 1, ...: the order of the sequential study)
INDEX = "selbench_index"
#: rungs are listed up to this many epochs (a replica is judged only below its own epochs)
MAX_RUNG = 10_000_000
#: the system attributes Optuna's successive-halving pruner keeps on a trial (its rungs)
RUNG_ATTR = "completed_rung_"
#: the user attribute of a deferred trial (the epoch its batch stopped it at), on its first
#: record (journaled ``PRUNED``) and on the record that completes it (``COMPLETE``)
DEFERRED = "selbench_deferred"
#: the user attribute of a deferred trial's own number of epochs (its end)
END = "selbench_end"
#: the user attribute of the record that ends a deferred trial the last batch dropped where
#: it had been deferred (``PRUNED``; the epoch)
DROPPED = "selbench_dropped"


def rungs(pruner: PrunerSpec) -> tuple[int, ...]:
    """The epochs at which a pruned study judges its trials: Optuna's successive-halving
    rungs ``min_epochs · reduction_factor^(min_early_stopping_rate + k)``, k = 0, 1, ..."""
    out, k = [], pruner.min_early_stopping_rate
    while (epoch := pruner.min_epochs * pruner.reduction_factor ** k) <= MAX_RUNG:
        out.append(epoch)
        k += 1
    return tuple(out)


def optuna_pruner(p: PrunerSpec | None) -> Any:
    """Optuna's pruner of a pruned study (None: the study is not pruned)."""
    import optuna

    if p is None:
        return None
    return optuna.pruners.SuccessiveHalvingPruner(
        min_resource=p.min_epochs, reduction_factor=p.reduction_factor,
        min_early_stopping_rate=p.min_early_stopping_rate)


def promoted(value: float, competing: Sequence[float], reduction_factor: int,
             minimize: bool, earlier_ties: int = 0) -> bool:
    """Optuna's successive-halving rule (``optuna.pruners.SuccessiveHalvingPruner``, no
    bootstrap count): a trial goes on past a rung when ``value`` is among the best
    ``len(competing) // reduction_factor`` (at least the best one) of ``competing``, the
    values of every trial that reached the rung, its own included. Optuna keeps the rule
    inside its pruner; ``tests/test_tuning_pruning.py`` checks this copy against it.

    ``earlier_ties``: how many of ``competing`` equal ``value`` exactly and belong to trials
    before this one (by index); they rank before it. Optuna's rule (``earlier_ties=0``)
    promotes every trial tied at the boundary, so a study whose trials collapse to one value
    promotes them all: see :class:`BatchJudge`."""
    k = max(len(competing) // reduction_factor, 1)
    better = sum(v < value if minimize else v > value for v in competing)
    return better + earlier_ties < k


class BatchJudge(EpochJudge):
    """A pruned study's judge of one batch of trials (:mod:`selbench.contract.judge`): at a
    rung, each trial's objective on the held-out rows (the tuner's objective's ``score``, the value
    the study scores, from the trial's selector and recalibrator as they stand) is reported
    to its Optuna trial, and Optuna's successive-halving pruner decides
    (``trial.should_prune``), the trials of the batch one after the other in index order.

    Optuna's pruner is asynchronous (ASHA): a trial goes on when it is in the best
    1/reduction_factor of the trials that reached the rung before it. The replicas of a
    batch reach a rung in lockstep, so the order in which they are judged is ours to set:
    the index order, as if they had reached it one after the other, which a study resumed
    after a kill repeats (the batch's trials already in the journal are the first ones,
    and their rung values are in the pruner's study). Judging a batch's replicas together
    instead (successive halving within the batch, Optuna's rule against all their values
    at once) was measured no cheaper (S-TLBCE joint on the tuned digits experiment, 20 TPE
    trials, CPU time over one untuned fit: 3.7x against 3.3x in index order with
    min_epochs 25 and reduction factor 4, 9.6x against 7.5x with factor 3; the same
    chosen trial; one run each, load about 8 on 2 cores), so Optuna's own
    ``trial.should_prune`` decides.

    One departure from Optuna's rule: trials whose values at a rung are exactly equal rank
    by index (the earlier first, :func:`promoted`'s ``earlier_ties``), so no more go on than
    the rule promotes. Optuna's rule passes every trial tied at the boundary, and exact ties
    are not rare here: a selector that collapses scores the same held-out ECE₁ whatever its
    other parameters, and TPE then asks more of them. Measured (the S-MMCE seq. study of
    ``perf/bench_tuning.py``, seed 1, 2026-12-02): twelve trials tied at every rung trained
    to 400 epochs side by side, 17,775 replica-steps and 8.9x one untuned fit; with the
    tie-break 6,075 and 5.4x, the same best value. Values that differ are judged exactly as
    Optuna judges them."""

    def __init__(self, objective: Any, trials: list[Any], held: ModelOutputs,
                 defer: bool = False, carried: Sequence[Any] = (), study: Any = None,
                 first: int = 0):
        self.rungs = rungs(objective.pruner)
        self.objective, self.trials, self.held = objective, trials, held
        #: the index of ``trials[0]`` (the batch's trials are the next indices, in order)
        self.first = first
        self.members: dict[int, tuple[int, Any, Any, ModelOutputs]] = {}
        self.pruned: dict[int, int] = {}
        #: position -> (epoch, its end): trials stopped past their last judgement, trained
        #: to their end with the study's last batch
        self.deferred: dict[int, tuple[int, int]] = {}
        self.defer = defer
        #: the last batch's deferred trials of earlier batches (their first records), at
        #: the positions after its own trials, and the in-memory study they compete in
        self.carried, self.study = list(carried), study

    def bind(self, position: int, est: Any, built: Any, rows: ModelOutputs) -> None:
        """The estimator of the batch's trial ``position`` (its built components)."""
        built.context.judge = self
        self.members[id(built.context)] = (position, est, built, rows)

    def judge(self, epoch: int, jobs: Sequence[Any],
              ends: Sequence[int] | None = None) -> list[bool]:
        keep, positions = [], []
        for job in jobs:
            position, est, built, rows = self.members[id(job.context)]
            positions.append(position)
            if position >= len(self.trials):  # a deferred trial: after the batch's own
                keep.append(True)
                continue
            est._adopt(built, rows)
            trial = self.trials[position]
            value = self.objective.score(est, self.held)
            trial.report(value, epoch)
            pruned = bool(trial.should_prune())  # Optuna's rule; records the rung's value
            if not pruned and self.study is not None:
                pruned = not self._promoted(epoch, value, self.first + position)
            if pruned:
                self.pruned[position] = epoch
            keep.append(not pruned)
        self._resumes(epoch, keep, positions)
        if self.defer and ends is not None:
            self._defer(epoch, keep, positions, ends)
        return keep

    def _resumes(self, epoch: int, keep: list[bool], positions: list[int]) -> None:
        """Judge the deferred trials of earlier batches again at the rung they were deferred
        at, once the last batch's own trials have reported there, unless it is the first
        rung: a deferred trial goes on only when its value there (as its batch recorded it)
        is still among the best 1/reduction_factor of every trial that reached the rung by
        then (Optuna's rule, :func:`promoted`), as ASHA promotes a trial when a worker is
        free to train it. Its batch promoted it against the trials before it; a later
        batch's better trials can outrank it, and then it stops where it was, instead of
        training to its end beside them (the S-MMCE joint study of
        ``perf/bench_tuning.py``: one such trial kept a third replica in the last batch's
        300-epoch tail, 900 steps). Not at the first rung: there a trial has trained
        ``min_epochs`` only and the first trials of a study pass by Optuna's rule alone
        (fewer than reduction_factor to compete with), the exploration the judgement
        would take back, while a trial deferred there ends before the next rung (it costs
        the last batch few epochs). Measured on 10 seeds of the tuned digits experiment's
        S-MMCE joint (20 TPE trials, against deferred trials trained unjudged): judged
        again at every rung, the chosen configurations' held-out ECE₁ rose by +0.0026 ±
        0.0014 (SE) and their evaluation ECE₁ by +0.0063 ± 0.0056; above the first rung
        only, by +0.0006 ± 0.0006 and −0.0002 ± 0.0002 (``perf/README.md``)."""
        for i, position in enumerate(positions):
            if position < len(self.trials) or epoch == self.rungs[0]:
                continue
            first = self.carried[position - len(self.trials)]
            if int(first.user_attrs[DEFERRED]) != epoch:
                continue
            key = f"{RUNG_ATTR}{self.rungs.index(epoch)}"
            if not self._promoted(epoch, first.system_attrs[key], int(first.user_attrs[INDEX])):
                self.pruned[position] = epoch
                keep[i] = False

    def _promoted(self, epoch: int, value: float, index: int) -> bool:
        """Whether trial ``index``, worth ``value`` at the rung ``epoch``, goes on
        (:func:`promoted`) against every trial of the in-memory study that reached the rung,
        the trials before it (by index) ranking first among equal values."""
        key = f"{RUNG_ATTR}{self.rungs.index(epoch)}"
        asked = {t.number: self.first + p for p, t in enumerate(self.trials)}
        competing, ties = [], 0
        for t in self.study.get_trials(deepcopy=False):
            if key not in t.system_attrs:
                continue
            competing.append(t.system_attrs[key])
            other = t.user_attrs.get(INDEX, asked.get(t.number))
            ties += t.system_attrs[key] == value and other is not None and other < index
        return promoted(value, competing, self.objective.pruner.reduction_factor,
                        self.study.direction.name == "MINIMIZE", ties)

    def _defer(self, epoch: int, keep: list[bool], positions: list[int],
               ends: Sequence[int]) -> None:
        """When every replica the batch keeps training is past its last judgement (no rung
        between ``epoch`` and its own end) and one of them has more epochs ahead than
        behind, stop them all: they are deferred, to train from the start with the study's
        last batch (:mod:`selbench.execution.tuning`), instead of holding up the next batch
        while the model trains a few long trials alone. The epochs a deferred trial trains again are
        fewer than those its batch would have trained alone; a batch whose longest trial is
        nearly done finishes it (its values then steer the next batch's asks)."""
        going = [i for i, k in enumerate(keep) if k and ends[i] > epoch]
        if not going or any(epoch < r < ends[i] for i in going for r in self.rungs):
            return
        if max(ends[i] for i in going) - epoch <= epoch:
            return
        for i in going:
            self.deferred[positions[i]] = (epoch, int(ends[i]))
            keep[i] = False


def finished_records(study: Any) -> list[tuple[Any, Any]]:
    """The study's finished trials 0, 1, ..., up to the first index it lacks (a trial
    without a valid index is not one of ours), each as (its first record, the record that
    completes it): complete ones, the pruned ones of a pruned study and its deferred ones
    (:data:`DEFERRED`; their completion, once their batch is trained, or None). A trial
    written twice otherwise counts by its first record."""
    import optuna

    states = optuna.trial.TrialState
    done = study.get_trials(deepcopy=False, states=(states.COMPLETE, states.PRUNED))
    first: dict[int, Any] = {}
    completes: dict[int, Any] = {}
    for t in done:
        index = t.user_attrs.get(INDEX)
        if not isinstance(index, int) or isinstance(index, bool):
            continue
        if t.value is None and t.state != states.PRUNED:
            continue
        if index in first and is_deferred(first[index]) and (
                t.state == states.COMPLETE or DROPPED in t.user_attrs):
            completes.setdefault(index, t)
        first.setdefault(index, t)
    out = []
    while len(out) in first:
        out.append((first[len(out)], completes.get(len(out))))
    return out


def is_deferred(t: Any) -> bool:
    import optuna

    return (t.state == optuna.trial.TrialState.PRUNED and DEFERRED in t.user_attrs
            and DROPPED not in t.user_attrs)


def as_asked(t: Any) -> Any:
    """A trial as the later batches are asked from it: a deferred one as complete with its
    value at its last rung (what its batch knew of it when it stopped), any other as
    written."""
    import optuna

    if not is_deferred(t):
        return t
    last = max(t.intermediate_values)
    return optuna.trial.create_trial(
        params=t.params, distributions=t.distributions, value=t.intermediate_values[last],
        state=optuna.trial.TrialState.COMPLETE, intermediate_values=t.intermediate_values,
        system_attrs=t.system_attrs, user_attrs=t.user_attrs)


def record_trial(study: Any, trial: Any, index: int, value: float | None,
                 asking: Any = None, deferred: tuple[int, int] | None = None) -> None:
    """Write one trial to the journal's study: complete with ``value``, or failed (None);
    in a pruned study (``asking``: the in-memory study it was judged in) with its reported
    values and rungs, pruned when it was, and ``PRUNED`` with :data:`DEFERRED` set to the
    epoch it stopped at when its batch ``deferred`` it."""
    import optuna

    states = optuna.trial.TrialState
    state = states.COMPLETE if value is not None else states.FAIL
    extra: dict[str, Any] = {}
    user = {INDEX: index}
    if asking is not None:
        frozen = asking.get_trials(deepcopy=False)[trial.number]
        extra = {"intermediate_values": dict(frozen.intermediate_values),
                 "system_attrs": {k: v for k, v in frozen.system_attrs.items()
                                  if k.startswith(RUNG_ATTR)}}
        if frozen.state == states.PRUNED:
            state = states.PRUNED
    if deferred is not None:
        state, user[DEFERRED], user[END] = states.PRUNED, int(deferred[0]), int(deferred[1])
    study.add_trial(optuna.trial.create_trial(
        params=trial.params, distributions=trial.distributions, value=value, state=state,
        user_attrs=user, **extra))


def record_completion(study: Any, first: Any, value: float | None,
                      rungs_: tuple[int, ...], dropped: int | None = None) -> None:
    """Write a deferred trial (its ``first`` record) trained to its end: complete with
    ``value`` and the values it reported before it was deferred (with ``value`` at its own
    last epoch when that is a rung, as a trial trained through reports there), or failed
    (None); or, ``dropped`` (the epoch), pruned where it was deferred, the last batch
    having judged it again there (:meth:`BatchJudge._resumes`)."""
    import optuna

    states = optuna.trial.TrialState
    reported = dict(first.intermediate_values)
    end = first.user_attrs[END]
    user = dict(first.user_attrs)
    if dropped is not None:
        state, value, user[DROPPED] = states.PRUNED, None, int(dropped)
    else:
        state = states.COMPLETE if value is not None else states.FAIL
        if value is not None and end in rungs_:
            reported[end] = value
    study.add_trial(optuna.trial.create_trial(
        params=first.params, distributions=first.distributions, value=value, state=state,
        intermediate_values=reported, system_attrs=dict(first.system_attrs),
        user_attrs=user))
