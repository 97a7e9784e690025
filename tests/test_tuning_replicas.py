"""Tuning at the cost of training (issue 28, item 3): a batch of trials is fitted with one
``Scheme.fit_configurations`` call (the training schemes: one model, a replica per trial with
its own learning rate, epochs, noise and λ), and the study is the one-at-a-time study:
same parameters where no trial learns from another, values to float rounding, resumed and
extended studies equal to the straight one, a failing trial failing as before."""

from __future__ import annotations

import numpy as np
import optuna
import pytest
from conftest import sampled_linear_task
from selbench import ModelOutputs, SelectiveRecalibrator
from selbench.contract.api import FitContext, FitJob, Scheme
from selbench.contract.registry import get_registry
from selbench.contract.search import Tune
from selbench.execution import studies
from selbench.execution import tuning as tuning_mod
from selbench.execution.tuning import STARTUP, TuningRequest, tune_cell, with_params
from selbench.spec.model import TuningSpec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PARAMS = {
    "scheme": {"name": "joint", "params": {"epochs": 6, "batch_size": 50, "lr": 1e-3,
                                           "noise_std": 0.1}},
    "selector": {"name": "mlp", "params": {"hidden": [8]}},
    "recalibrator": {"name": "temperature", "params": {}},
    "loss": {"name": "s-tlbce", "params": {}},
    "coverage": {"name": "quadratic", "params": {"lam": 8.0}},
}
SPACE = {"scheme.lr": Tune.log_uniform(1e-4, 1e-1), "scheme.epochs": Tune.choice(2, 4, 8),
         "scheme.noise_std": Tune.uniform(0.0, 0.5), "coverage.lam": Tune.log_uniform(1, 64)}
TOL = 1e-6  # held-out ECE₁ of a trial fitted alone or as a replica: float rounding apart


def outputs(n=200, seed=3) -> ModelOutputs:
    rng = np.random.default_rng(seed)
    x, z, labels = sampled_linear_task(rng, n, 6, 3)
    x[: n // 3, 0] += 3.0  # a cluster the selector can learn to reject
    labels[: n // 3] = rng.integers(0, 3, n // 3)
    return ModelOutputs(features=x.astype(np.float32), logits=(2 * z).astype(np.float32),
                        labels=labels)


def tune(tmp_path, trials, sampler="random", name="j", make=None, **kw):
    def default_make(chosen):
        return SelectiveRecalibrator(**with_params(PARAMS, chosen), beta=0.7, seed=0,
                                     device="cpu")

    block = TuningSpec(trials=trials, objective="ece1", sampler=sampler, inner=0.3)
    return tune_cell(TuningRequest(
        params=PARAMS, space=SPACE, tuning=block, fitting=outputs(), make=make or default_make,
        seed=0, method_key="m", beta=0.7, journal=tmp_path / f"{name}.journal", study="s", **kw))


def one_at_a_time(monkeypatch):
    """Every trial its own batch: the sequential procedure (each trial fitted alone)."""
    monkeypatch.setattr(tuning_mod, "trial_batches",
                        lambda trials, sampler: [range(k, k + 1) for k in range(trials)])


def assert_same_study(batched, sequential, params_upto=None):
    n = len(sequential["history"]) if params_upto is None else params_upto
    assert [h["params"] for h in batched["history"][:n]] == \
        [h["params"] for h in sequential["history"][:n]]
    np.testing.assert_allclose([h["value"] for h in batched["history"][:n]],
                               [h["value"] for h in sequential["history"][:n]],
                               rtol=0, atol=TOL)


def test_trial_batches_have_fixed_edges():
    batches = tuning_mod.trial_batches
    assert batches(4, "tpe") == [range(0, 4)]
    assert batches(12, "tpe") == [range(0, STARTUP), range(STARTUP, 12)]
    assert batches(22, "tpe") == [range(0, 10), range(10, 15), range(15, 20), range(20, 22)]
    assert batches(25, "random") == [range(0, 20), range(20, 25)]


def test_batched_random_search_is_the_sequential_one(tmp_path, monkeypatch):
    """One batch of 6 trials (one model, 6 replicas, each with its own lr, epochs, noise
    and λ) against the trials fitted one by one: same parameters, same values."""
    batched = tune(tmp_path, 6, name="batched")
    one_at_a_time(monkeypatch)
    sequential = tune(tmp_path, 6, name="sequential")
    assert_same_study(batched, sequential)
    values = [h["value"] for h in sequential["history"]]
    assert len(set(values)) > 3  # the trials differ
    first = batched["history"][0]["params"]  # the configured values that lie in the space
    assert {k: v for k, v in first.items() if k != "scheme.epochs"} == {
        "scheme.lr": 1e-3, "scheme.noise_std": 0.1, "coverage.lam": 8.0}


def test_tpe_start_is_the_sequential_one_and_extends_exactly(tmp_path, monkeypatch):
    """TPE's random start (the first STARTUP trials) is one batch with the sequential
    study's parameters; an 11-trial study extended to 13 equals a straight 13-trial one."""
    straight = tune(tmp_path, 13, sampler="tpe", name="straight")
    tune(tmp_path, 11, sampler="tpe", name="ext")
    extended = tune(tmp_path, 13, sampler="tpe", name="ext")
    assert_same_study(extended, straight)
    one_at_a_time(monkeypatch)
    sequential = tune(tmp_path, 11, sampler="tpe", name="sequential")
    assert_same_study(straight, sequential, params_upto=STARTUP)


def test_a_study_killed_between_two_journal_writes_resumes_exactly(tmp_path, monkeypatch):
    """A kill after the 12th trial of a 13-trial TPE study was written (its batch [10, 13)
    half written): the rerun asks trial 12 from the trials before the batch, as the
    straight study did."""
    straight = tune(tmp_path, 13, sampler="tpe", name="straight")
    real = studies.record_trial
    calls = {"n": 0}

    def killed(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 12:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(studies, "record_trial", killed)
    with pytest.raises(KeyboardInterrupt):
        tune(tmp_path, 13, sampler="tpe", name="cut")
    monkeypatch.setattr(studies, "record_trial", real)
    resumed = tune(tmp_path, 13, sampler="tpe", name="cut")
    assert_same_study(resumed, straight)


def test_a_failing_trial_fails_as_in_the_sequential_study(tmp_path, monkeypatch):
    """Trial 3 cannot be built (its temperature's bounds reversed): the batch falls back to
    one trial at a time, trials 0-2 are written with their values, trial 3 fails with the
    error the sequential study raised, and trials 4-5 (never reached before) fail."""
    bad_lr = tune(tmp_path, 6, name="clean")["history"][3]["params"]["scheme.lr"]

    def make(chosen):
        params = with_params(PARAMS, chosen)
        if chosen["scheme.lr"] == bad_lr:
            params["recalibrator"] = {"name": "temperature", "params": {
                "min_temperature": 5.0, "max_temperature": 1.0}}
        return SelectiveRecalibrator(**params, beta=0.7, seed=0, device="cpu")

    def run_until_failure(name):
        with pytest.raises(Exception) as err:
            tune(tmp_path, 6, name=name, make=make)
        storage = tuning_mod._storage(tmp_path / f"{name}.journal")
        trials = optuna.load_study(study_name="s", storage=storage).get_trials()
        states = {t.user_attrs[studies.INDEX]: (t.state.name, t.value) for t in trials}
        return str(err.value), states

    batched_error, batched = run_until_failure("batched")
    one_at_a_time(monkeypatch)
    sequential_error, sequential = run_until_failure("sequential")
    assert batched_error == sequential_error and "min_temperature" in batched_error
    assert [batched[k][0] for k in range(6)] == ["COMPLETE"] * 3 + ["FAIL"] * 3
    assert [sequential[k][0] for k in sorted(sequential)] == ["COMPLETE"] * 3 + ["FAIL"]
    for k in range(3):
        assert batched[k][1] == pytest.approx(sequential[k][1], abs=TOL)


@pytest.mark.parametrize("objective", ["ece1", "aurc"])
def test_a_trial_is_scored_as_evaluate_scores_it(objective):
    """The objective from the selective metrics alone (ECE₁), or from evaluate (AURC, a
    ranking metric), is the value evaluate gives."""
    data = outputs()
    est = SelectiveRecalibrator(**PARAMS, beta=0.7, seed=0, device="cpu").fit(data)
    held = outputs(n=120, seed=4)
    request = TuningRequest(params=PARAMS, space=SPACE,
                            tuning=TuningSpec(trials=1, objective=objective), fitting=data,
                            make=lambda c: est, seed=0, method_key="m", beta=0.7)
    obj = tuning_mod._Objective(request, [(data, held)])
    assert obj.score(est, held) == est.evaluate(held, betas=[0.7])[objective][0]


class Shifted(Scheme):
    """A third-party scheme that overrides nothing but ``fit``: h is none, g is fitted on
    the confidence plus ``shift``; ``fits_`` counts the jobs its instance fitted."""

    def __init__(self, shift: float = 0.0):
        self.shift = shift

    def fit(self, outputs, *, selector, recalibrator, loss, coverage, context):
        recalibrator.fit(outputs, context)
        selector.fit(outputs, recalibrator.confidence(outputs) + self.shift, context)
        self.fits_ = getattr(self, "fits_", 0) + 1
        return self


def test_default_fit_configurations_fits_each_job_with_its_own_scheme():
    reg = get_registry()
    data = outputs()

    def job(seed):
        return FitJob(data, reg.get("selector", "confidence").build(),
                      reg.get("recalibrator", "none").build(), None, None,
                      FitContext(seed=seed, beta=0.7))

    pairs = [(Shifted(0.0), job(0)), (Shifted(0.5), job(1)), (Shifted(0.0), job(2))]
    Shifted.fit_configurations(pairs)
    assert [s.fits_ for s, _ in pairs] == [2, 1, 2]  # equal params: one fit_many, state copied
    for scheme, j in pairs:
        alone = job(j.context.seed)
        Shifted(scheme.shift).fit_many([alone])
        conf = data.confidence()
        assert np.array_equal(j.selector.score(data, conf), alone.selector.score(data, conf))
