"""Equal-budget tuning of one cell (an experiment's ``tuning:`` block): the cell's fitting rows
are split into an inner part and a held-out part (seeded by the cell's seed, the same split
for every method), ``trials`` Optuna trials each fit the method with sampled parameters on the
inner part and score the objective on the held-out part at the cell's training β, and the
best parameters are returned for the refit on all fitting rows (:mod:`selbench.execution.cells`).
Only the fitting rows are passed here: the evaluation split is never seen while tuning.

Trials live in an Optuna journal file per (experiment, method, seed) under the results folder
(``tuning/<experiment>/<method>/seed<s>.journal``), one study per cell named by the digest of
everything that decides its trials except their number (:func:`study_name`): a rerun after a
kill continues the study, a larger ``trials`` extends it, and an edited plugin, spec or
search space starts a new one. Each trial's sampler is seeded from the cell's seed, the
method's key and the number of trials completed so far (trials left running by a killed run
are ignored), so a resumed study samples what an uninterrupted one would have.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from selbench.contract.data import ModelOutputs
from selbench.contract.search import Tune
from selbench.execution.codeid import code_digest
from selbench.measure.metrics import METRICS
from selbench.spec import ExperimentSpec, MethodSpec, ResolvedSpec, content_hash
from selbench.spec.model import TuningSpec
from selbench.spec.search import method_space

__all__ = ["TuningError", "inner_split", "study_name", "tune_cell", "tuning_components",
           "with_params"]

#: Trials that ended without a finite objective (a failed fit scores this, the worst value).
WORST = float("inf")


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
    return {"block": exp.tuning.model_dump(mode="json"),
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


def inner_split(n: int, inner: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(inner rows, held-out rows) of ``n`` fitting rows, ``round(inner * n)`` held out."""
    n_held = int(round(inner * n))
    if n_held < 1 or n_held > n - 1:
        raise TuningError(f"tuning.inner={inner:g} of {n} fitting rows leaves "
                          f"{n - n_held} to fit and {n_held} to score; both need at least one")
    perm = np.random.default_rng([seed, 0x7E57]).permutation(n)
    return np.sort(perm[n_held:]), np.sort(perm[:n_held])


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")


def _sampler(kind: str, seed: int):
    import optuna

    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # no constant liar: trials a killed run left RUNNING must not steer the next ones
    return optuna.samplers.TPESampler(seed=seed, constant_liar=False)


def _storage(journal: Path):
    import optuna

    journal.parent.mkdir(parents=True, exist_ok=True)
    try:
        from optuna.storages.journal import JournalFileBackend
    except ImportError:  # Optuna 3.x
        return optuna.storages.JournalStorage(optuna.storages.JournalFileStorage(str(journal)))
    return optuna.storages.JournalStorage(JournalFileBackend(str(journal)))


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


class _Objective:
    """One trial: fit on the inner rows, score the objective on the held-out rows."""

    def __init__(self, make: Callable[[dict[str, Any]], Any], space: dict[str, Tune],
                 inner: ModelOutputs, held: ModelOutputs, objective: str, beta: float,
                 run: Callable[[str, Callable[[], Any]], Any]):
        self.make, self.space, self.inner, self.held = make, space, inner, held
        self.objective, self.beta, self.run = objective, beta, run
        self.sign = 1.0 if METRICS[objective].lower_is_better else -1.0

    def __call__(self, trial: Any) -> float:
        chosen = {path: _suggest(trial, path, tune) for path, tune in self.space.items()}
        est = self.make(chosen)
        self.run("tuning (fitting a trial on the inner rows)", lambda: est.fit(self.inner))
        metrics = self.run("tuning (scoring a trial on the held-out rows)",
                           lambda: est.evaluate(self.held, betas=[self.beta]))
        value = float(metrics[self.objective][0])
        return value if math.isfinite(value) else self.sign * WORST


def _run_trials(study: Any, objective: _Objective, trials: int, sampler: str, seed: int,
                configured: dict[str, Any]) -> list[Any]:
    """Complete ``trials`` trials of ``study`` (those already complete count); the first
    ``trials`` complete ones."""
    import optuna

    complete = optuna.trial.TrialState.COMPLETE
    while True:
        done = study.get_trials(deepcopy=False, states=(complete,))
        if len(done) >= trials:
            return sorted(done, key=lambda t: t.number)[:trials]
        study.sampler = _sampler(sampler, _seed(seed, len(done)))
        waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        if not done and not waiting and configured:
            study.enqueue_trial(configured)
        study.optimize(objective, n_trials=1)


# kept whole: the procedure reads top to bottom (split, study, trials, best)
def tune_cell(*, params: dict[str, Any], space: dict[str, Tune], tuning: TuningSpec,
              fitting: ModelOutputs, make: Callable[[dict[str, Any]], Any], seed: int,
              method_key: str, beta: float, journal: Path, study: str,
              run: Callable[[str, Callable[[], Any]], Any] = lambda stage, fn: fn(),
              ) -> dict[str, Any]:
    """Tune one cell on its fitting rows ``fitting``; the record of :attr:`CellRecord.tuning`
    (``chosen``: the best ``"<field>.<param>"`` values, ``history``: each trial's params and
    objective value, in order).

    ``make(chosen)`` builds the cell's unfitted estimator with ``chosen`` set; ``run(stage,
    fn)`` calls ``fn`` (the runner's names the plugin that fails).
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    inner_idx, held_idx = inner_split(len(fitting), tuning.inner, seed)
    objective = _Objective(make, space, fitting.subset(inner_idx), fitting.subset(held_idx),
                           tuning.objective, beta, run)
    lower = METRICS[tuning.objective].lower_is_better
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        st = optuna.create_study(study_name=study, storage=_storage(journal),
                                 direction="minimize" if lower else "maximize",
                                 load_if_exists=True)
        done = _run_trials(st, objective, tuning.trials, tuning.sampler,
                           _seed(seed, method_key), _configured(params, space))
    history = [{"params": _decoded(t.params, space), "value": float(t.value)} for t in done]
    values = [h["value"] for h in history]
    best = int(np.argmin(values) if lower else np.argmax(values))  # first of equal values
    return {
        "objective": tuning.objective,
        "direction": "minimize" if lower else "maximize",
        "beta": float(beta),
        "sampler": tuning.sampler,
        "trials": tuning.trials,
        "inner": tuning.inner,
        "n_inner": int(len(inner_idx)),
        "n_heldout": int(len(held_idx)),
        "space": {path: t.to_json() for path, t in space.items()},
        "chosen": history[best]["params"],
        "best_value": history[best]["value"],
        "best_trial": best,
        "history": history,
        "study": study,
    }
