"""Issue 33 item 4 and issue 34: a tuning objective with less variance (``folds: k``, ``over:
betas``), objectives validated against the methods they tune, oracle rows tuned on evaluation
labels and marked so, and the chosen parameters on the leaderboard."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import sampled_linear_task, tiny_spec
from selbench import ModelOutputs, SelectiveRecalibrator
from selbench.cli import main
from selbench.execution import tuning as tuning_mod
from selbench.execution.runner import run
from selbench.execution.tuning import TuningRequest, fold_splits, tune_cell, with_params
from selbench.measure.metrics import auc
from selbench.spec import SpecError, load_spec
from selbench.spec.model import TuningSpec
from test_tuning import HB, POOR, _npz, _records, _tuning

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: a trained method, short enough for a test
SHORT = {**POOR, "scheme": {"name": "sequential", "params": {"epochs": 5, "batch_size": 50}}}
HB_CONF = {**HB, "label": "HB conf", "selector": {"name": "confidence"}}


def _outputs(n: int = 400, seed: int = 3) -> ModelOutputs:
    x, z, y = sampled_linear_task(np.random.default_rng(seed), n, 4, 3)
    return ModelOutputs(features=x.astype(np.float32), logits=(1.8 * z).astype(np.float32),
                        labels=y)


PARAMS = {"scheme": {"name": "recalibration", "params": {"fit_on": "all"}},
          "selector": {"name": "confidence", "params": {}},
          "recalibrator": {"name": "histogram-binning", "params": {"n_bins": 15}},
          "loss": None, "coverage": None}


def _make(chosen):
    return SelectiveRecalibrator(**with_params(PARAMS, chosen), beta=0.6, seed=0, device="cpu")


# --------------------------------------------------------------------------- the objective
def test_folds_partition_the_rows_stratified_by_correctness():
    out = _outputs(203)
    folds = fold_splits(out, 5, seed=4)
    held = np.concatenate([b for _, b in folds])
    assert sorted(held.tolist()) == list(range(203))  # each row held out exactly once
    for a, b in folds:
        assert set(a.tolist()).isdisjoint(b.tolist()) and len(a) + len(b) == 203
        assert abs(out.correct()[b].mean() - out.correct().mean()) < 0.02  # stratified
    again = fold_splits(out, 5, seed=4)
    assert all((a == c).all() and (b == d).all() for (a, b), (c, d) in zip(folds, again))
    assert not all((b == d).all() for (_, b), (_, d) in zip(folds, fold_splits(out, 5, 5)))


@pytest.mark.parametrize("over", ["train_beta", "betas"])
def test_tuning_arrays_with_folds_scores_the_mean_held_out_objective(over):
    """``tune_cell`` on arrays, without a results folder: each trial's value is the mean over
    the folds of the objective of the estimator fitted on the other folds (at β, or its AUC
    over ``betas``), computed here independently with the estimator's own ``evaluate``."""
    out = _outputs()
    betas = [0.5, 0.6, 0.8, 1.0]
    spec = TuningSpec(trials=4, objective="ece1", folds=3, over=over, sampler="random")
    info = tune_cell(TuningRequest(
        params=PARAMS, space={"recalibrator.n_bins": tuning_mod.Tune.int(5, 30)}, tuning=spec,
        fitting=out, make=_make, seed=7, method_key="hb", beta=0.6, betas=betas))
    assert info["folds"] == 3 and sum(info["n_heldout"]) == len(out) and "inner" not in info
    folds = fold_splits(out, 3, 7)
    for trial in info["history"]:
        scores = []
        for a, b in folds:
            est = _make(trial["params"]).fit(out.subset(a))
            m = est.evaluate(out.subset(b).logits, out.subset(b).labels,
                             out.subset(b).features, betas=betas if over == "betas" else [0.6])
            scores.append(auc(betas, m["ece1"]) if over == "betas" else m["ece1"][0])
        assert trial["value"] == pytest.approx(np.mean(scores), rel=1e-12, abs=1e-15)
    assert info["history"][0]["params"] == {"recalibrator.n_bins": 15}  # its own value first
    assert info["best_value"] == min(h["value"] for h in info["history"])


def test_the_default_block_keeps_its_canonical_form_and_new_fields_are_keyed():
    old = {"trials": 3, "objective": "ece1", "inner": 0.3, "sampler": "tpe"}
    resolved = load_spec(tiny_spec(methods=[HB], tuning=dict(old)))
    assert resolved.canonical()["experiments"][0]["tuning"] == old  # spec hash unchanged
    five = load_spec(tiny_spec(methods=[HB], tuning={"trials": 3, "objective": "ece1",
                                                     "folds": 5}))
    assert five.canonical()["experiments"][0]["tuning"] == {
        "trials": 3, "objective": "ece1", "folds": 5, "sampler": "tpe"}
    with pytest.raises(SpecError, match="inner and folds exclude each other"):
        load_spec(tiny_spec(methods=[HB], tuning={**old, "folds": 5}))
    with pytest.raises(SpecError, match="over: betas takes the AUC .* needs at least two"):
        load_spec(tiny_spec(methods=[HB], betas=[0.5], tuning={**old, "over": "betas"}))


def test_folds_and_auc_resume_and_agree_inline_and_on_a_pool(tmp_path, monkeypatch):
    block = {"trials": 3, "objective": "ece1", "folds": 3, "over": "betas",
             "sampler": "random"}
    spec = tiny_spec(name="tuned", seeds=(0, 1), methods=[HB, SHORT], tuning=block,
                     bootstrap={"resamples": 0})
    run(spec, out_dir=tmp_path / "inline", progress=False, plots=False, device="cpu")
    run(spec, out_dir=tmp_path / "local", progress=False, plots=False, device="cpu",
        executor="local", workers=2)
    assert _tuning(tmp_path / "inline") == _tuning(tmp_path / "local")
    rec = _records(tmp_path / "inline")[("Poor", 0)]["tuning"]
    assert rec["folds"] == 3 and rec["over"] == "betas" and len(rec["history"]) == 3
    # killed while scoring the second fold of the batch, then rerun: the same study
    real = tuning_mod._Objective.score
    calls = {"n": 0}

    def flaky(self, *args):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(self, *args)

    monkeypatch.setattr(tuning_mod._Objective, "score", flaky)
    with pytest.raises(KeyboardInterrupt):
        run(spec, out_dir=tmp_path / "cut", progress=False, plots=False, device="cpu")
    monkeypatch.setattr(tuning_mod._Objective, "score", real)
    run(spec, out_dir=tmp_path / "cut", progress=False, plots=False, device="cpu")
    assert _tuning(tmp_path / "cut") == _tuning(tmp_path / "inline")
    for name in ("leaderboard.csv", "leaderboard.md"):
        assert ((tmp_path / "cut" / name).read_text()
                == (tmp_path / "inline" / name).read_text())
    md = (tmp_path / "inline" / "leaderboard.md").read_text()
    assert ("each fitted on 2 of 3 folds of the fitting rows (seeded, stratified by the "
            "backbone's correctness) and scored by the AUC of ECE₁ over β ∈ [0.5, 1] on the "
            "held-out fold") in md
    assert "Tuning sees the rows of the fitting split `val` only" in md


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("objective, extra, message", [
    ("nll_full", {}, "'nll_full' needs the recalibrated distribution, which recalibrator "
                     "'histogram-binning' of experiments[0].methods[0] (HB) does not define"),
    ("classwise_ece", {}, "'classwise_ece' needs the recalibrated distribution"),
    ("rg_coverage", {"risk_guarantee": {"risk": 0.1, "delta": 0.1}},
     "'rg_coverage' needs the experiment's risk_guarantee, measured on the evaluation data "
     "only"),
])
def test_objectives_that_cannot_run_are_refused_at_load(tmp_path, write_spec, capsys,
                                                        objective, extra, message):
    spec = tiny_spec(methods=[HB], tuning={"trials": 2, "objective": objective}, **extra)
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    text = str(err.value)
    assert message in text
    listed = text.split("tune it: " if "tune it" in text else "choose one of ")[1]
    listed = [name.strip() for name in listed.split("(")[0].split(",")]
    assert "ece1" in listed and objective not in listed and "rg_coverage" not in listed
    if objective == "nll_full":  # the distribution's objectives cannot tune HB: not listed
        assert "classwise_ece" not in listed
    assert main(["validate", str(write_spec(spec))]) == 2
    assert "a plugin" not in capsys.readouterr().err


def test_an_objective_of_the_distribution_tunes_a_method_that_defines_it(tmp_path):
    spec = tiny_spec(name="t", seeds=(0,), methods=[SHORT], bootstrap={"resamples": 0},
                     tuning={"trials": 2, "objective": "nll_full", "sampler": "random"})
    run(spec, out_dir=tmp_path / "o", progress=False, plots=False, device="cpu")
    info = _records(tmp_path / "o")[("Poor", 0)]["tuning"]
    assert info["objective"] == "nll_full" and all(np.isfinite(h["value"])
                                                   for h in info["history"])


# --------------------------------------------------------------------------- oracle
def test_an_oracle_row_tunes_on_evaluation_labels_and_says_so(tmp_path):
    both = load_spec(tiny_spec(methods=[HB, {**HB, "tuning": {"oracle": True}}],
                               tuning={"trials": 2, "objective": "ece1"}))
    assert [m.label for m in both.spec.experiments[0].methods] == ["HB", "HB (oracle)"]
    with pytest.raises(SpecError, match="methods.0..label: 'HB .oracle.' says oracle, but the "
                                        "method is not tuned on evaluation labels"):
        load_spec(tiny_spec(methods=[{**HB, "label": "HB (oracle)"}],
                            tuning={"trials": 2, "objective": "ece1"}))
    oracle = {**SHORT, "tuning": {"oracle": True}}
    chosen, n_eval, labels = {}, {}, None
    for poison in (False, True):
        npz = tmp_path / f"outputs{int(poison)}.npz"
        _npz(npz, poison)
        spec = tiny_spec(name="t", seeds=(0,), methods=[HB, oracle], n_fit=300,
                         bootstrap={"resamples": 0},
                         tuning={"trials": 3, "objective": "ece1", "sampler": "random"})
        spec["experiments"][0].update(
            dataset={"name": "precomputed", "params": {"path": str(npz)}},
            backbone={"name": "precomputed"})
        out = tmp_path / f"run{int(poison)}"
        run(spec, out_dir=out, progress=False, plots=False, device="cpu")
        recs = _records(out)
        labels = sorted(m for m, _ in recs)
        chosen[poison] = {m: r["tuning"]["history"] for (m, _), r in recs.items()}
        n_eval = {m: r["n_eval"] for (m, _), r in recs.items()}
    assert labels == ["HB", "Poor (oracle)"]
    assert chosen[False]["HB"] == chosen[True]["HB"]  # the source-only row never reads them
    assert chosen[False]["Poor (oracle)"] != chosen[True]["Poor (oracle)"]  # the oracle does
    assert n_eval == {"HB": 300, "Poor (oracle)": 210}  # its 90 tuning rows left out
    rec = _records(tmp_path / "run0")[("Poor (oracle)", 0)]["tuning"]
    assert rec["oracle"] is True and rec["n_heldout"] == 90 and rec["n_inner"] == 300
    md = (tmp_path / "run0" / "leaderboard.md").read_text()
    csv = (tmp_path / "run0" / "leaderboard.csv").read_text()
    assert "| Poor (oracle)" in md and "Poor (oracle)" in csv
    assert ("except the oracle rows (Poor (oracle)): each trial fitted on all fitting rows and "
            "scored on 30 % of the seed's evaluation rows with their labels") in md
    data = json.loads((tmp_path / "run0" / "leaderboard.json").read_text())
    assert data["experiments"][0]["tuning"]["oracle"] == ["Poor (oracle)"]


@pytest.mark.parametrize("edit, message", [
    ({"tuning": {"trials": 2, "objective": "ece1", "folds": 3},
      "methods": [{**SHORT, "tuning": {"oracle": True}}]},
     "methods[0]: an oracle scores its trials on one seeded share"),
    ({"tuning": {"trials": 2, "objective": "ece1"},
      "methods": [{**HB, "search": {}, "tuning": {"oracle": True}}]},
     "experiments[0].methods[0].tuning.oracle: 'HB (oracle)' has no search space"),
    ({"methods": [{**HB, "tuning": {"oracle": True}}]},
     "methods[0].tuning: has no effect without the experiment's tuning block"),
])
def test_bad_oracles_are_named(edit, message):
    with pytest.raises(SpecError) as err:
        load_spec(tiny_spec(**edit))
    assert message in str(err.value)


# --------------------------------------------------------------------------- leaderboard
def test_the_leaderboard_tables_the_chosen_parameters_per_seed(tmp_path):
    spec = tiny_spec(name="t", seeds=(0, 1, 2), methods=[HB_CONF], bootstrap={"resamples": 0},
                     tuning={"trials": 4, "objective": "ece1", "sampler": "random"})
    run(spec, out_dir=tmp_path / "o", progress=False, plots=False, device="cpu")
    per_seed = [_records(tmp_path / "o")[("HB conf", s)]["tuning"]["chosen"]
                ["recalibrator.n_bins"] for s in (0, 1, 2)]
    md = (tmp_path / "o" / "leaderboard.md").read_text()
    assert "| Tuned method | Parameter | Chosen (seeds 0, 1, 2) | Median [min, max] over seeds |" \
        in md
    med = sorted(per_seed)[1]
    assert (f"| HB conf | `recalibrator.n_bins` | {', '.join(map(str, per_seed))} | {med} "
            f"[{min(per_seed)}, {max(per_seed)}] |") in md
    data = json.loads((tmp_path / "o" / "leaderboard.json").read_text())
    entry = data["experiments"][0]["tuning"]["chosen"]["HB conf"]["recalibrator.n_bins"]
    assert entry["per_seed"] == {"0": per_seed[0], "1": per_seed[1], "2": per_seed[2]}
    assert (entry["median"], entry["min"], entry["max"]) == (med, min(per_seed), max(per_seed))
