"""Multi-fidelity tuning (``tuning.pruner``, issue 37): the trials of a batch report the
held-out objective at successive-halving rungs (Optuna's ``SuccessiveHalvingPruner``), the
losing ones are pruned and dropped from the batch's model; the study is deterministic,
resumable after a kill and records its pruned trials."""

from __future__ import annotations

import numpy as np
import optuna
import pytest
from conftest import sampled_linear_task
from selbench import ModelOutputs, SelectiveRecalibrator
from selbench.contract.search import Tune
from selbench.execution import studies
from selbench.execution import tuning as tuning_mod
from selbench.execution.tuning import TuningRequest, inner_split, rungs, tune_cell, with_params
from selbench.spec.model import PrunerSpec, TuningSpec
from test_tuning_replicas import PARAMS  # the same joint S-TLBCE method

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPACE = {"scheme.lr": Tune.log_uniform(1e-4, 1e-1), "scheme.epochs": Tune.choice(3, 6, 12),
         "scheme.noise_std": Tune.uniform(0.0, 0.5), "coverage.lam": Tune.log_uniform(1, 64)}
SPACE_SPEC = {"scheme.lr": {"log_uniform": [1e-4, 1e-1]}, "scheme.epochs": {"choice": [3, 6, 12]},
              "scheme.noise_std": {"uniform": [0.0, 0.5]}, "coverage.lam": {"log_uniform": [1, 64]}}
PRUNER = PrunerSpec(name="successive-halving", min_epochs=1, reduction_factor=3)
TOL = 1e-5  # a replica continued after restacking: the per-replica Adam, float rounding


def outputs(n=200, seed=3) -> ModelOutputs:
    rng = np.random.default_rng(seed)
    x, z, labels = sampled_linear_task(rng, n, 6, 3)
    x[: n // 3, 0] += 3.0  # a cluster the selector can learn to reject
    labels[: n // 3] = rng.integers(0, 3, n // 3)
    return ModelOutputs(features=x.astype(np.float32), logits=(2 * z).astype(np.float32),
                        labels=labels)


def make(chosen):
    return SelectiveRecalibrator(**with_params(PARAMS, chosen), beta=0.7, seed=0, device="cpu")


def tune(tmp_path, name, trials=10, pruner=PRUNER, sampler="random"):
    block = TuningSpec(trials=trials, objective="ece1", sampler=sampler, inner=0.3,
                       pruner=pruner)
    return tune_cell(TuningRequest(
        params=PARAMS, space=SPACE, tuning=block, fitting=outputs(), make=make, seed=0,
        method_key="m", beta=0.7, journal=tmp_path / f"{name}.journal", study="s"))


def rule_stops(history, sampler, factor=3):
    """Trial k -> the epoch the judge's rule stops it at (None: it trains to its end),
    recomputed from the values the trials reported: at a rung a trial is judged against
    every trial that reached it by the end of the batch that judges it (its own batch at
    the first rung; the study's last batch, where the deferred trials train, above it).
    The best ``max(n // factor, 1)`` of the n go on, equal values ranked by index; a trial
    is never stopped at its own last epoch."""
    batches = tuning_mod.trial_batches(len(history), sampler)
    first_rung = min(int(r) for h in history for r in h.get("reported", {}))
    reached: dict[str, list[tuple[float, int]]] = {}
    for k, h in enumerate(history):
        for rung, v in h.get("reported", {}).items():
            reached.setdefault(rung, []).append((v, k))
    stops = {}
    for k, h in enumerate(history):
        stops[k] = None
        horizon = next(b.stop for b in batches if k in b)
        for rung, v in h.get("reported", {}).items():
            if int(rung) == h["params"]["scheme.epochs"]:
                continue
            field = [(w, j) for w, j in reached[rung] if int(rung) > first_rung or j < horizon]
            rank = sum(w < v or (w == v and j < k) for w, j in field)
            if rank >= max(len(field) // factor, 1):
                stops[k] = int(rung)
                break
    return stops


def test_rungs_are_optunas_successive_halving_steps():
    assert rungs(PRUNER)[:4] == (1, 3, 9, 27)
    assert rungs(PrunerSpec(name="successive-halving", min_epochs=25, reduction_factor=3,
                            min_early_stopping_rate=1))[:3] == (75, 225, 675)


def test_a_reported_value_is_the_objective_of_the_trial_trained_that_long(tmp_path):
    """At a rung a trial reports the study's objective (ECE₁ at β on the held-out rows, the
    core's metric code) of its selector and recalibrator as they stand: the value of the
    same configuration trained alone for that many epochs, also after the batch's model was
    restacked without the pruned replicas (its Adam moments and generators carried on)."""
    info = tune(tmp_path, "r")
    fitting = outputs()
    inner, held = inner_split(len(fitting), 0.3, 0)
    checked = set()
    for h in info["history"]:
        for epoch, value in h["reported"].items():
            chosen = {**h["params"], "scheme.epochs": int(epoch)}
            alone = make(chosen).fit(fitting.subset(inner))
            ref = alone.evaluate(fitting.subset(held), betas=[0.7])["ece1"][0]
            assert value == pytest.approx(ref, rel=TOL, abs=1e-7)
            checked.add(int(epoch))
        if h["value"] is not None and str(h["params"]["scheme.epochs"]) in h["reported"]:
            assert h["value"] == h["reported"][str(h["params"]["scheme.epochs"])]
    assert checked >= {1, 3}  # trials continued past a restack are among them


def test_a_pruned_study_is_deterministic_and_records_its_pruned_trials(tmp_path):
    a, b = tune(tmp_path, "a"), tune(tmp_path, "b")
    assert a["history"] == b["history"] and a["chosen"] == b["chosen"]
    pruned = [h for h in a["history"] if h["value"] is None]
    assert a["pruned"] == len(pruned) >= 3 and a["pruner"]["min_epochs"] == 1
    for h in pruned:  # stopped at a rung below its own epochs, where it lost
        assert h["pruned_at"] in (1, 3, 9) and h["pruned_at"] < h["params"]["scheme.epochs"]
        assert list(h["reported"])[-1] == str(h["pruned_at"])
    assert {k: h.get("pruned_at") for k, h in enumerate(a["history"])} == \
        rule_stops(a["history"], "random")
    complete = [h["value"] for h in a["history"] if h["value"] is not None]
    assert a["best_value"] == min(complete) and a["history"][a["best_trial"]]["value"] is not None
    storage = tuning_mod.journal_storage(tmp_path / "a.journal")
    trials = optuna.load_study(study_name="s", storage=storage).trials
    states = [t.state for t in sorted(trials, key=lambda t: t.user_attrs["selbench_index"])]
    assert states == [optuna.trial.TrialState.PRUNED if h["value"] is None
                      else optuna.trial.TrialState.COMPLETE for h in a["history"]]
    for t, h in zip(sorted(trials, key=lambda t: t.user_attrs["selbench_index"]),
                    a["history"]):
        assert {str(k): v for k, v in t.intermediate_values.items()} == h["reported"]
        assert all(k.startswith("completed_rung_") for k in t.system_attrs)


def test_promoted_ranks_earlier_equal_values_first():
    """Among exactly equal values the trials before this one rank first: at most the best
    ``n // reduction_factor`` go on, where Optuna's rule passes every tied one."""
    values = [0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.1]
    assert studies.promoted(0.2, values, 3, True)  # Optuna's rule: every 0.2 passes
    assert studies.promoted(0.2, values, 3, True, earlier_ties=0)
    assert not studies.promoted(0.2, values, 3, True, earlier_ties=1)  # 0.1 and one 0.2
    assert not studies.promoted(0.2, values, 3, False, earlier_ties=2)
    assert studies.promoted(0.2, values, 3, False, earlier_ties=1)


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_tied_trials_go_on_no_more_than_the_pruner_promotes(tmp_path, monkeypatch, sampler):
    """Trials whose selectors collapse score exactly the same at every rung (seen in the
    S-MMCE studies of perf/bench_tuning.py: a dozen trials at one held-out ECE₁ trained to
    400 epochs side by side). Optuna's rule would let every tied trial go on; the judge
    ranks equal values by index, so no more go on than the rule promotes: here every score
    is equal, each rung passes only the first trials (by index) among those it judges
    against (:func:`rule_stops`), a kill and a rerun give the same study, and the first
    trial is chosen (the first of equals)."""
    monkeypatch.setattr(tuning_mod._Objective, "score", lambda self, est, held: 0.25)
    trials = 13 if sampler == "tpe" else 10
    info = tune(tmp_path, "tied", trials=trials, sampler=sampler)
    history = info["history"]
    assert info["best_trial"] == 0 and history[0]["value"] == 0.25
    assert {k: h.get("pruned_at") for k, h in enumerate(history)} == rule_stops(history, sampler)
    assert info["pruned"] >= trials - 4
    if sampler == "tpe":
        assert killed_then_resumed(tmp_path, monkeypatch)["history"] == history


def killed_then_resumed(tmp_path, monkeypatch, trials=13):
    """A TPE study killed while writing its 12th trial (the second batch: trials 10-12),
    then rerun from its journal."""
    real, calls = studies.record_trial, {"n": 0}

    def killed(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 12:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(studies, "record_trial", killed)
    with pytest.raises(KeyboardInterrupt):
        tune(tmp_path, "cut", trials=trials, sampler="tpe")
    monkeypatch.setattr(studies, "record_trial", real)
    return tune(tmp_path, "cut", trials=trials, sampler="tpe")


def test_a_pruned_study_resumes_after_a_kill(tmp_path, monkeypatch):
    """Killed while writing the second batch (TPE: trials 10-12), then rerun: the batch's
    other trials are judged against the rung values of those the journal holds, and the
    study is the uninterrupted one."""
    straight = tune(tmp_path, "straight", trials=13, sampler="tpe")
    resumed = killed_then_resumed(tmp_path, monkeypatch)
    assert resumed["history"] == straight["history"]
    assert resumed["chosen"] == straight["chosen"]


def test_pruning_drops_replicas_from_the_model(tmp_path, monkeypatch):
    """The pruned trials leave the batch's model: each later engine call trains fewer
    replicas, and the replica-epochs trained are fewer than the unpruned study's."""
    calls = []
    from selbench.training import engine

    real = engine.train_replicas

    def recording(job, resume=None):
        epochs = job.hyper.epochs
        calls.append((len(job.data.seeds), epochs if isinstance(epochs, int) else max(epochs)))
        return real(job, resume)

    monkeypatch.setattr("selbench_plugins.schemes.training.train_replicas", recording)
    pruned = tune(tmp_path, "p")
    pruned_calls, calls[:] = list(calls), []
    tune(tmp_path, "u", pruner=None)
    unpruned_calls = list(calls)
    assert len(unpruned_calls) == 1 and unpruned_calls[0] == (20, 12)  # 10 trials, 10 spares
    replicas = [r for r, _ in pruned_calls]
    assert replicas[0] == 11 and replicas == sorted(replicas, reverse=True)  # one spare
    assert replicas[-1] < replicas[0]
    assert sum(r * e for r, e in pruned_calls) < 0.5 * sum(r * e for r, e in unpruned_calls)
    assert pruned["pruned"] > 0


def test_a_bad_pruner_is_one_line_and_exit_2(write_spec, capsys):
    from conftest import tiny_spec
    from selbench.cli import main

    hb = {"label": "HB", "scheme": {"name": "recalibration"},
          "recalibrator": {"name": "histogram-binning"}}
    for pruner, message in [
        ({"name": "hyperband", "min_epochs": 5}, "successive-halving"),
        ({"name": "successive-halving", "min_epochs": 5, "reduction_factor": 1},
         "reduction_factor"),
        ({"name": "successive-halving"}, "min_epochs"),
    ]:
        spec = tiny_spec(methods=[hb], tuning={"trials": 2, "objective": "ece1",
                                               "pruner": pruner})
        assert main(["validate", str(write_spec(spec))]) == 2
        err = capsys.readouterr().err.strip()
        assert "pruner" in err and message in err and "Traceback" not in err
    spec = tiny_spec(methods=[hb], tuning={"trials": 2, "objective": "ece1", "folds": 3,
                                           "pruner": {"name": "successive-halving",
                                                      "min_epochs": 5}})
    assert main(["validate", str(write_spec(spec))]) == 2
    assert "pruner needs one held-out part (folds: 1)" in capsys.readouterr().err


def test_a_pruned_spec_runs_the_same_inline_and_on_a_pool(tmp_path):
    """A spec's pruned study (``tuning.pruner``) through the runner: its record says so,
    and the local pool's workers compute the inline run's trials and leaderboard."""
    from conftest import tiny_spec
    from selbench.execution.runner import run
    from test_tuning import _records, _tuning

    trained = {"label": "Trained", "scheme": {"name": "sequential",
                                              "params": {"epochs": 4, "batch_size": 50}},
               "selector": {"name": "mlp", "params": {"hidden": [8]}},
               "recalibrator": {"name": "temperature"},
               "loss": {"name": "s-tlbce"}, "coverage": {"name": "quadratic"},
               "search": {"scheme.lr": {"log_uniform": [1e-4, 1e-1]},
                          "scheme.epochs": {"choice": [2, 6]}}}
    spec = tiny_spec(name="pruned", seeds=(0, 1), methods=[trained], bootstrap={"resamples": 0},
                     tuning={"trials": 6, "objective": "ece1", "sampler": "random",
                             "pruner": {"name": "successive-halving", "min_epochs": 1,
                                        "reduction_factor": 2}})
    run(spec, out_dir=tmp_path / "inline", progress=False, plots=False, device="cpu")
    run(spec, out_dir=tmp_path / "local", progress=False, plots=False, device="cpu",
        executor="local", workers=2)
    assert _tuning(tmp_path / "inline") == _tuning(tmp_path / "local")
    for name in ("leaderboard.csv", "leaderboard.md"):
        assert ((tmp_path / "local" / name).read_text()
                == (tmp_path / "inline" / name).read_text())
    rec = _records(tmp_path / "inline")[("Trained", 0)]["tuning"]
    assert rec["pruner"] == {"name": "successive-halving", "min_epochs": 1,
                             "reduction_factor": 2, "min_early_stopping_rate": 0}
    assert rec["pruned"] == sum(h["value"] is None for h in rec["history"]) > 0
    md = (tmp_path / "inline" / "leaderboard.md").read_text()
    assert ("the losing trials stopped early by successive halving (Optuna's rule, each "
            "batch's trials together: judged at epoch 1, then at 2× as many epochs each time, "
            "1 in 2 going on)") in md


def test_the_python_search_takes_a_pruner():
    import selbench

    data = outputs()
    search = selbench.tune(make({}), data.logits, data.labels, data.features, trials=6,
                           sampler="random", search=dict(SPACE_SPEC), progress=False,
                           pruner={"name": "successive-halving", "min_epochs": 1,
                                   "reduction_factor": 3})
    values = search.cv_results_["value"]
    pruned = np.isnan(values)
    assert search.tuning_["pruned"] == int(pruned.sum()) > 0
    assert (search.cv_results_["rank"][pruned] == len(values) - pruned.sum() + 1).all()
    assert search.best_score_ == np.nanmin(values)


LONG = {**SPACE, "scheme.epochs": Tune.choice(2, 4, 20)}
# rungs 3, 9, 27: a 20-epoch trial kept at 3 has 17 epochs ahead (deferred), judged again at 9
PRUNER_LONG = PrunerSpec(name="successive-halving", min_epochs=3, reduction_factor=3)
SEED_LONG = 0


def tune_long(tmp_path, name, trials=13, seed=0):
    block = TuningSpec(trials=trials, objective="ece1", sampler="tpe", inner=0.3,
                       pruner=PRUNER_LONG)
    return tune_cell(TuningRequest(
        params=PARAMS, space=LONG, tuning=block, fitting=outputs(), make=make, seed=seed,
        method_key="m", beta=0.7, journal=tmp_path / f"{name}.journal", study="s"))


def test_first_rung_survivors_are_deferred_to_the_last_batch(tmp_path, monkeypatch):
    """A batch that is not the study's last stops at its first rung: the trials it keeps
    there (one has more epochs ahead than behind) are deferred, to train from the start
    with the study's last batch, which judges them at the rungs above beside its own trials
    (together: :func:`rule_stops`); each that completes ends as the same configuration
    trained alone; the batches' models train fewer epochs one after the other than without
    deferral; the journal holds a deferred trial's deferred record and the one that
    completes it, or stops it where the last batch dropped it; the study is
    deterministic."""
    stretches: list[int] = []
    from selbench.training import engine

    real = engine.train_replicas

    def recording(job, resume=None):
        epochs = job.hyper.epochs
        stretches.append(epochs if isinstance(epochs, int) else max(epochs))
        return real(job, resume)

    monkeypatch.setattr("selbench_plugins.schemes.training.train_replicas", recording)
    a = tune_long(tmp_path, "a", seed=SEED_LONG)
    deferred_epochs, stretches[:] = sum(stretches), []
    history = a["history"]
    deferred = [h for h in history if "deferred_at" in h]
    assert deferred and all(h["deferred_at"] == 3 for h in deferred)
    assert all(i < 10 for i, h in enumerate(history) if "deferred_at" in h)
    long = [h for h in deferred if h["params"]["scheme.epochs"] == 20]
    # judged again above the first rung: one goes on to its end, another is dropped at 9
    assert [h.get("pruned_at") for h in long if "9" in h["reported"]] == [None, 9]
    assert {k: h.get("pruned_at") for k, h in enumerate(history)} == rule_stops(history, "tpe")
    assert a == tune_long(tmp_path, "b", seed=SEED_LONG)
    fitting = outputs()
    inner, held = inner_split(len(fitting), 0.3, 0)
    for h in deferred:
        if h["value"] is None:
            continue
        alone = make(h["params"]).fit(fitting.subset(inner))
        ref = alone.evaluate(fitting.subset(held), betas=[0.7])["ece1"][0]
        assert h["value"] == pytest.approx(ref, rel=TOL, abs=1e-7)
    storage = tuning_mod.journal_storage(tmp_path / "a.journal")
    trials = optuna.load_study(study_name="s", storage=storage).trials
    states = optuna.trial.TrialState
    for i, h in enumerate(history):
        mine = [t for t in trials if t.user_attrs["selbench_index"] == i]
        if "deferred_at" in h:
            assert mine[0].state == states.PRUNED and mine[0].user_attrs[studies.DEFERRED] == 3
            assert list(mine[0].intermediate_values) == [3]
            if h["value"] is None:
                assert mine[1].state == states.PRUNED
                assert mine[1].user_attrs[studies.DROPPED] == h["pruned_at"]
            else:
                assert mine[1].state == states.COMPLETE and mine[1].value == h["value"]
            assert {str(k): v for k, v in mine[1].intermediate_values.items()} == h["reported"]
            assert len(mine) == 2
        else:
            assert len(mine) == 1
    monkeypatch.setattr(studies.BatchJudge, "_defer", lambda self, *args: None)
    undeferred = tune_long(tmp_path, "c", seed=SEED_LONG)
    assert not any("deferred_at" in h for h in undeferred["history"])
    assert deferred_epochs < sum(stretches)


@pytest.mark.parametrize("where,at", [("record_completion", 1), ("record_completion", 2),
                                      ("record_trial", 12)])
def test_a_deferring_study_resumes_after_a_kill(tmp_path, monkeypatch, where, at):
    """Killed while the last batch is written (its own trials, or the deferred trials it
    completes: the trials the rerun judges then compete with those the journal holds as
    the uninterrupted study's did), then rerun: the study is the uninterrupted one."""
    straight = tune_long(tmp_path, "straight", seed=SEED_LONG)
    assert sum("deferred_at" in h for h in straight["history"]) == 2
    real, calls = getattr(studies, where), {"n": 0}

    def killed(*args, **kw):
        calls["n"] += 1
        if calls["n"] == at:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(studies, where, killed)
    with pytest.raises(KeyboardInterrupt):
        tune_long(tmp_path, "cut", seed=SEED_LONG)
    monkeypatch.setattr(studies, where, real)
    resumed = tune_long(tmp_path, "cut", seed=SEED_LONG)
    assert resumed["history"] == straight["history"]
    assert resumed["chosen"] == straight["chosen"]


def test_promoted_is_optunas_successive_halving_rule():
    """The rule the judge applies is the one Optuna's pruner applies
    (its private helper, read here only to hold the copy to it), ties and both directions
    included."""
    from optuna.pruners._successive_halving import _is_trial_promotable_to_next_rung
    from optuna.study import StudyDirection

    rng = np.random.default_rng(0)
    checked = {True: 0, False: 0}
    for _ in range(400):
        pool = rng.random(5)
        values = [float(v) for v in rng.choice(pool, int(rng.integers(1, 14)))]
        value, factor = values[int(rng.integers(len(values)))], int(rng.integers(2, 5))
        for minimize, direction in ((True, StudyDirection.MINIMIZE),
                                    (False, StudyDirection.MAXIMIZE)):
            mine = studies.promoted(value, values, factor, minimize)
            assert mine == _is_trial_promotable_to_next_rung(value, list(values), factor,
                                                             direction)
            checked[mine] += 1
    assert min(checked.values()) > 100


def test_the_leaderboard_says_how_many_trials_were_deferred(tmp_path):
    """The tuning note of a pruned TPE study counts the trials it deferred (over the
    experiment's methods and seeds); a study that deferred none reads as before."""
    from types import SimpleNamespace

    from selbench.reporting.tuned import tuning_line, tuning_summary

    info = tune_long(tmp_path, "a", seed=SEED_LONG)
    n = sum("deferred_at" in h for h in info["history"])
    dropped = sum("deferred_at" in h and h["value"] is None for h in info["history"])
    assert n > dropped > 0
    block = {"trials": 13, "objective": "ece1", "inner": 0.3, "sampler": "tpe",
             "pruner": PRUNER_LONG.model_dump(mode="json")}
    exp = {"name": "e", "tuning": block, "methods": [{"label": "m"}]}

    def line(history):
        cell = {"experiment": "e", "method": "m", "seed": 0,
                "tuning": {**info, "history": history}}
        return tuning_line(tuning_summary(SimpleNamespace(cells=[cell, {**cell, "seed": 1}]),
                                          exp), 0.7)

    assert (f"; {2 * n} trials (over its methods and seeds) kept at the first judgement of "
            f"a batch before the last were deferred to the study's last batch, {2 * dropped} "
            "of them stopped there when judged again beside its trials)") in line(info["history"])
    plain = line([{k: v for k, v in h.items() if k != "deferred_at"} for h in info["history"]])
    assert "deferred" not in plain and "1 in 3 going on)" in plain
