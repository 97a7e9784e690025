"""Training schemes: what each one fits, trains or freezes, and a behavioural check."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import sampled_linear_task
from pydantic import ValidationError
from selbench import FitContext, ModelOutputs
from selbench.contract.registry import get_registry
from selbench_plugins.recalibrators.temperature import fit_temperature

FAST = {"epochs": 30, "lr": 5e-3}


def synthetic(n=600, d=8, k=3, seed=0, bad_frac=0.3):
    """Over-confident logits (2z for labels drawn from softmax(z)); the first ``bad_frac``
    of the examples form a feature cluster (x0 shifted by +4, domain 1) whose labels are
    random, so the model is badly over-confident there."""
    rng = np.random.default_rng(seed)
    x, z, labels = sampled_linear_task(rng, n, d, k)
    bad = np.arange(n) < int(bad_frac * n)
    x[bad, 0] += 4.0
    labels[bad] = rng.integers(0, k, bad.sum())
    return ModelOutputs(
        features=x.astype(np.float32),
        logits=(2 * z).astype(np.float32),
        labels=labels,
        domain=bad.astype(np.int64),
    )


def reg(kind, name, params=None):
    return get_registry().get(kind, name).build(params)


def run(scheme, out, *, selector="mlp", recalibrator="temperature", loss="s-tlbce",
        coverage="quadratic", params=None, sel_params=None, rec_params=None, seed=0, beta=0.7,
        progress=False):
    sel = reg("selector", selector, sel_params if sel_params is not None else {"hidden": [32]})
    rec = reg("recalibrator", recalibrator, rec_params)
    sch = reg("scheme", scheme, params if params is not None else FAST)
    ctx = FitContext(seed=seed, beta=beta, progress=progress)
    returned = sch.fit(
        out,
        selector=sel,
        recalibrator=rec,
        loss=None if loss is None else reg("loss", loss),
        coverage=None if coverage is None else reg("loss", coverage),
        context=ctx,
    )
    assert returned is sch
    return sel, rec, sch


def test_sequential_freezes_h_and_joint_moves_it():
    out = synthetic(n=300)
    _, seq, _ = run("sequential", out)
    assert seq.T_fit_ == pytest.approx(fit_temperature(out.logits, out.labels))
    assert seq.T_ == pytest.approx(seq.T_fit_, rel=1e-6)
    _, joint, _ = run("joint", out)
    assert joint.T_fit_ == pytest.approx(seq.T_fit_)
    assert abs(joint.T_ - joint.T_fit_) > 1e-3


def test_joint_trains_platt_and_mlp_recalibrators_in_place():
    out = synthetic(n=300)
    _, platt, _ = run("joint", out, recalibrator="platt", loss="s-mce")
    fitted = reg("recalibrator", "platt").fit(out, FitContext())
    assert abs(platt.weight_ - fitted.weight_) + abs(platt.bias_ - fitted.bias_) > 1e-3
    # confidence() reads the trained module
    live = platt.module(out, FitContext())(torch.tensor(out.logits), torch.tensor(out.features))
    np.testing.assert_allclose(platt.confidence(out), live[0].detach().numpy(), atol=1e-6)
    assert not np.allclose(platt.confidence(out), fitted.confidence(out), atol=1e-3)
    mlp_params = {"hidden": [16], "epochs": 20, "lr": 1e-2}
    _, mlp, _ = run("joint", out, recalibrator="mlp", rec_params=mlp_params)
    pretrained = reg("recalibrator", "mlp", mlp_params).fit(out, FitContext())
    assert np.abs(mlp.confidence(out) - pretrained.confidence(out)).max() > 1e-3
    _, mlp_seq, _ = run("sequential", out, recalibrator="mlp", rec_params=mlp_params)
    np.testing.assert_array_equal(mlp_seq.confidence(out), pretrained.confidence(out))


def test_selection_scheme_uses_h_as_given():
    out = synthetic(n=300)
    sel, rec, _ = run("selection", out, recalibrator="none", loss="s-mce")
    np.testing.assert_allclose(rec.confidence(out), out.confidence())
    score = sel.score(out, rec.confidence(out))
    assert score.shape == (len(out),) and np.all((score > 0) & (score < 1))
    with pytest.raises(ValueError, match="unfitted|sequential"):
        run("selection", out, recalibrator="temperature")


def test_recalibration_scheme_with_confidence_selector():
    out = synthetic(n=300)
    sel, rec, _ = run("recalibration", out, selector="confidence", sel_params={}, params={},
                      loss=None, coverage=None)
    test = synthetic(n=200, seed=1)
    conf = rec.confidence(test)
    np.testing.assert_array_equal(sel.score(test, conf), conf)
    assert rec.T_ == pytest.approx(fit_temperature(out.logits, out.labels), rel=1e-6)


def test_recalibration_scheme_fit_on_accepted():
    out = synthetic(n=300)
    _, rec, sch = run("recalibration", out, selector="confidence", sel_params={},
                      params={"fit_on": "accepted"}, beta=0.6)
    conf = out.confidence()
    keep = np.flatnonzero(conf >= np.quantile(conf, 0.4))
    np.testing.assert_array_equal(sch.kept_, keep)
    expected = fit_temperature(out.logits[keep], out.labels[keep])
    assert rec.T_ == pytest.approx(expected, rel=1e-6)
    assert rec.T_ != pytest.approx(fit_temperature(out.logits, out.labels), rel=1e-3)


def test_recalibration_scheme_rejects_a_trainable_selector():
    with pytest.raises(ValueError, match="'selection', 'sequential', 'joint'"):
        run("recalibration", synthetic(n=50), params={})


@pytest.mark.parametrize("scheme", ["selection", "sequential", "joint"])
def test_training_schemes_check_their_arguments(scheme):
    out = synthetic(n=50)
    rec = "none" if scheme == "selection" else "temperature"
    with pytest.raises(ValueError, match="selection loss"):
        run(scheme, out, recalibrator=rec, loss=None)
    with pytest.raises(ValueError, match="coverage loss"):
        run(scheme, out, recalibrator=rec, coverage=None)
    with pytest.raises(ValueError, match="recalibration"):
        run(scheme, out, recalibrator=rec, selector="confidence", sel_params={})


def test_training_params_are_validated():
    plugin = get_registry().get("scheme", "joint")
    for bad in ({"epochs": -1}, {"lr": 0}, {"optimizer": "sgd"}, {"learning_rate": 1e-3}):
        with pytest.raises(ValidationError):
            plugin.build(bad)
    with pytest.raises(ValidationError):
        get_registry().get("scheme", "recalibration").build({"fit_on": "some"})


def test_swapped_losses_are_a_type_error():
    out = synthetic(n=50)
    with pytest.raises(TypeError, match="SelectionLoss"):
        run("sequential", out, loss="quadratic")
    with pytest.raises(TypeError, match="CoverageLoss"):
        run("sequential", out, coverage="s-tlbce")


def test_non_differentiable_recalibrators():
    out = synthetic(n=100)
    with pytest.raises(ValueError, match="differentiable"):
        run("joint", out, recalibrator="histogram-binning")
    with pytest.raises(ValueError, match="log-probabilities"):
        run("sequential", out, recalibrator="histogram-binning", loss="s-mce")
    with pytest.raises(ValueError, match="log-probabilities"):
        run("joint", out, recalibrator="mlp", loss="s-mce", rec_params={"epochs": 1})
    sel, rec, _ = run("sequential", out, recalibrator="histogram-binning")
    assert np.isfinite(sel.score(out, rec.confidence(out))).all()


def test_training_is_seeded_and_noise_changes_it():
    out = synthetic(n=200)
    a = run("sequential", out, seed=1)[0].score(out, out.confidence())
    b = run("sequential", out, seed=1)[0].score(out, out.confidence())
    c = run("sequential", out, seed=2)[0].score(out, out.confidence())
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    noisy = dict(FAST, noise_std=1.0)
    d = run("sequential", out, seed=1, params=noisy)[0].score(out, out.confidence())
    e = run("sequential", out, seed=1, params=noisy)[0].score(out, out.confidence())
    np.testing.assert_array_equal(d, e)
    assert not np.allclose(a, d)


def test_quadratic_coverage_reaches_the_target_and_progress_bar_runs():
    out = synthetic(n=300)
    sel, rec, _ = run("sequential", out, beta=0.5, progress=True)
    assert sel.score(out, rec.confidence(out)).mean() == pytest.approx(0.5, abs=0.05)


def test_s_tlbce_selector_rejects_the_badly_calibrated_cluster():
    out = synthetic()
    bad = out.domain == 1
    # the cluster is as confident as the rest but far less accurate
    assert abs(out.confidence()[bad].mean() - out.confidence()[~bad].mean()) < 0.05
    assert out.correct()[bad].mean() < out.correct()[~bad].mean() - 0.3
    sel, rec, _ = run("sequential", out, params={"epochs": 60, "lr": 5e-3})
    score = sel.score(out, rec.confidence(out))
    assert score[bad].mean() < score[~bad].mean() - 0.1
    rejected = score <= np.quantile(score, 0.3)
    assert bad[rejected].mean() > 0.6  # 0.3 by chance
