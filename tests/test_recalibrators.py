"""Built-in recalibrators: known optima, hand-computed binning, the module protocol."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize, minimize_scalar
from scipy.special import log_softmax
from selbench import FitContext, ModelOutputs
from selbench.plugins import get_registry
from selbench_plugins.recalibrators._common import NotFittedError, equal_mass_edges
from selbench_plugins.recalibrators.platt import LOGIT_CLIP, platt_inputs
from selbench_plugins.recalibrators.temperature import fit_temperature
from sklearn.linear_model import LogisticRegression

CTX = FitContext(seed=0)


def synthetic(n=400, d=16, k=4, seed=0, scale=2.0):
    """Outputs whose labels follow softmax(z) while the logits are ``scale * z``
    (over-confident for scale > 1, so the optimal temperature is near ``scale``)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    z = x @ rng.normal(size=(d, k)) * 0.7
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    labels = (p.cumsum(1) < rng.random((n, 1))).sum(1)
    return ModelOutputs(
        features=x.astype(np.float32), logits=(scale * z).astype(np.float32), labels=labels
    )


def build(name, params=None):
    return get_registry().get("recalibrator", name).build(params)


# ---------------------------------------------------------------- temperature
def _scipy_temperature(logits, labels):
    z = logits.astype(np.float64)

    def nll(log_t):
        lp = log_softmax(z / np.exp(log_t), axis=1)
        return -lp[np.arange(len(labels)), labels].mean()

    res = minimize_scalar(nll, bounds=(-5, 5), method="bounded", options={"xatol": 1e-10})
    return float(np.exp(res.x))


@pytest.mark.parametrize("scale,k", [(2.0, 4), (0.5, 10), (3.0, 2)])
def test_temperature_matches_scipy_optimum(scale, k):
    out = synthetic(n=500, k=k, scale=scale, seed=k)
    rec = build("temperature").fit(out, CTX)
    t_ref = _scipy_temperature(out.logits, out.labels)
    assert rec.T_fit_ == pytest.approx(t_ref, rel=1e-4)
    assert rec.T_ == pytest.approx(t_ref, rel=1e-4)
    # over-confident logits need T > 1, under-confident ones T < 1
    assert (rec.T_ > 1) == (scale > 1)
    # the confidence is max softmax(z / T) computed independently
    expected = np.exp(log_softmax(out.logits.astype(np.float64) / rec.T_, axis=1)).max(1)
    np.testing.assert_allclose(rec.confidence(out), expected, atol=1e-6)


def test_temperature_clips_at_bound_for_anti_informative_logits():
    out = synthetic(n=200, k=3, seed=1)
    anti = ModelOutputs(features=out.features, logits=out.logits, labels=out.logits.argmin(1))
    assert fit_temperature(anti.logits, anti.labels, 1e-3, 50.0) == 50.0
    rec = build("temperature", {"max_temperature": 50.0}).fit(anti, CTX)
    assert rec.T_ == pytest.approx(50.0, rel=1e-6)


def test_temperature_module_is_live():
    out = synthetic(n=100)
    rec = build("temperature").fit(out, CTX)
    module = rec.module(out, CTX)
    assert module is rec.module(out, CTX)
    with torch.no_grad():
        module.log_t.fill_(np.log(7.0))
    assert rec.T_ == pytest.approx(7.0, rel=1e-6)
    expected = np.exp(log_softmax(out.logits.astype(np.float64) / 7.0, axis=1)).max(1)
    np.testing.assert_allclose(rec.confidence(out), expected, atol=1e-6)
    conf, log_probs = module(torch.tensor(out.logits), torch.tensor(out.features))
    np.testing.assert_allclose(log_probs.exp().sum(1).detach().numpy(), 1.0, atol=1e-5)
    np.testing.assert_allclose(conf.detach().numpy(), expected, atol=1e-6)


def test_unfitted_recalibrators_raise_not_fitted():
    out = synthetic(n=20)
    for name in ["temperature", "platt", "histogram-binning", "platt-binning", "mlp"]:
        with pytest.raises(NotFittedError, match="not fitted"):
            build(name).confidence(out)
    # the identity needs no fitting
    np.testing.assert_allclose(build("none").confidence(out), out.confidence())


# ---------------------------------------------------------------- platt
def _sklearn_platt(s, y):
    clf = LogisticRegression(C=1e12, tol=1e-12, max_iter=100000).fit(s[:, None], y)
    return float(clf.coef_[0, 0]), float(clf.intercept_[0])


def _scipy_platt(s, y):
    def f(w):
        t = w[0] * s + w[1]
        return np.mean(np.logaddexp(0, t) - y * t)

    res = minimize(f, x0=np.zeros(2), method="BFGS", options={"gtol": 1e-12})
    return res.x


def test_platt_top_label_matches_sklearn_and_scipy():
    out = synthetic(n=600, k=5, scale=2.5, seed=3)
    rec = build("platt").fit(out, CTX)
    assert rec.mode_ == "top-label"
    conf = out.confidence()
    s = np.log(conf / (1 - conf))  # logit(max prob), computed the naive way
    np.testing.assert_allclose(platt_inputs(out.logits, "top-label"), s, atol=1e-6)
    a, b = _sklearn_platt(s, out.correct())
    assert rec.weight_ == pytest.approx(a, rel=1e-4, abs=1e-5)
    assert rec.bias_ == pytest.approx(b, rel=1e-4, abs=1e-5)
    np.testing.assert_allclose([rec.weight_, rec.bias_], _scipy_platt(s, out.correct()), rtol=1e-4)
    np.testing.assert_allclose(rec.confidence(out), 1 / (1 + np.exp(-(a * s + b))), atol=1e-5)


def test_platt_binary_matches_sklearn():
    out = synthetic(n=500, k=2, scale=3.0, seed=4)
    rec = build("platt").fit(out, CTX)
    assert rec.mode_ == "binary"
    z = out.logits.astype(np.float64)
    s = z[:, 1] - z[:, 0]  # = logit p(class 1), clipped as probabilities in [1e-12, 1-1e-12]
    s = np.clip(s, -LOGIT_CLIP, LOGIT_CLIP)
    assert LOGIT_CLIP == pytest.approx(np.log(1e12 - 1))
    assert np.any(np.abs(z[:, 1] - z[:, 0]) > 28)  # the clipping matters for this data
    a, b = _sklearn_platt(s, (out.labels == 1).astype(float))
    assert rec.weight_ == pytest.approx(a, rel=1e-4, abs=1e-5)
    assert rec.bias_ == pytest.approx(b, rel=1e-4, abs=1e-5)
    p1_new = 1 / (1 + np.exp(-(a * s + b)))
    expected = np.where(out.predictions() == 1, p1_new, 1 - p1_new)
    np.testing.assert_allclose(rec.confidence(out), expected, atol=1e-5)
    # binary log-probabilities are exactly [log(1 - p1'), log p1']
    _, lp = rec.module(out, CTX)(torch.tensor(out.logits), torch.tensor(out.features))
    np.testing.assert_allclose(lp.exp().detach().numpy()[:, 1], p1_new, atol=1e-5)


def test_platt_top_label_log_probs_share_the_rest_proportionally():
    out = synthetic(n=50, k=4, seed=5)
    rec = build("platt", {"mode": "top-label"}).fit(out, CTX)
    conf, lp = rec.module(out, CTX)(torch.tensor(out.logits), torch.tensor(out.features))
    q = lp.exp().detach().numpy().astype(np.float64)
    p = out.probabilities()
    top = out.predictions()
    rows = np.arange(len(out))
    np.testing.assert_allclose(q.sum(1), 1.0, atol=1e-5)
    np.testing.assert_allclose(q[rows, top], conf.detach().numpy(), atol=1e-6)
    other = np.ones_like(p, dtype=bool)
    other[rows, top] = False
    ratio = (q / p)[other].reshape(len(out), -1)  # constant per row: (1-c)/(1-p_top)
    expected = (1 - q[rows, top]) / (1 - p[rows, top])
    np.testing.assert_allclose(ratio, np.repeat(expected[:, None], 3, 1), rtol=1e-4)


def test_platt_binary_mode_needs_two_classes():
    with pytest.raises(ValueError, match="K=2"):
        build("platt", {"mode": "binary"}).fit(synthetic(n=30, k=3), CTX)


# ---------------------------------------------------------------- binning
def _outputs_with_confidence(conf, correct):
    """Three-class outputs whose max softmax is ``conf`` and whose correctness is given."""
    conf = np.asarray(conf, dtype=np.float64)
    rest = (1 - conf) / 2
    probs = np.stack([conf, rest, rest], axis=1)
    labels = np.where(np.asarray(correct) == 1, 0, 1)
    return ModelOutputs.from_probabilities(probs, labels, features=np.zeros((len(conf), 2)))


def test_histogram_binning_hand_computed():
    conf = [0.40, 0.45, 0.50, 0.60, 0.70, 0.80, 0.90]
    correct = [0, 1, 0, 1, 1, 1, 1]
    out = _outputs_with_confidence(conf, correct)
    rec = build("histogram-binning", {"n_bins": 3}).fit(out, CTX)
    # 7 values in 3 equal-mass groups of sizes 3, 2, 2: {.40,.45,.50} {.60,.70} {.80,.90}
    np.testing.assert_allclose(rec.edges_, [0.55, 0.75, 1.0], atol=1e-6)
    np.testing.assert_allclose(rec.values_, [1 / 3, 1.0, 1.0])
    test = _outputs_with_confidence([0.42, 0.54, 0.56, 0.95, 0.76], [1, 1, 1, 1, 1])
    np.testing.assert_allclose(rec.confidence(test), [1 / 3, 1 / 3, 1.0, 1.0, 1.0])


def test_histogram_binning_empty_bin_outputs_midpoint():
    out = _outputs_with_confidence([0.5, 0.5, 0.5, 0.5], [1, 0, 0, 0])
    rec = build("histogram-binning", {"n_bins": 2}).fit(out, CTX)
    c = out.confidence()[0]
    np.testing.assert_allclose(rec.edges_, [c, 1.0])
    test = _outputs_with_confidence([0.3, 0.9], [1, 1])
    np.testing.assert_allclose(rec.confidence(test), [0.25, (c + 1) / 2])


def test_histogram_binning_agrees_with_calibration_package():
    calibration = pytest.importorskip("calibration")
    out = synthetic(n=300, k=5, seed=6)
    test = synthetic(n=200, k=5, seed=7)
    ref = calibration.HistogramTopCalibrator(num_calibration=300, num_bins=15)
    ref.train_calibration(out.probabilities(), out.labels)
    rec = build("histogram-binning").fit(out, CTX)
    np.testing.assert_allclose(rec.confidence(test), ref.calibrate(test.probabilities()), atol=1e-12)
    assert len(np.unique(rec.confidence(test))) <= 15


def test_equal_mass_edges_merge_ties():
    edges = equal_mass_edges(np.array([0.2, 0.2, 0.2, 0.2, 0.9, 0.9]), 3)
    np.testing.assert_allclose(edges, [0.2, 0.55, 1.0])


def test_platt_binning_takes_at_most_n_bins_values_and_is_seeded():
    out = synthetic(n=400, k=4, seed=8)
    test = synthetic(n=300, k=4, seed=9)
    rec = build("platt-binning", {"n_bins": 7}).fit(out, CTX)
    c = rec.confidence(test)
    assert 2 <= len(np.unique(c)) <= 7
    assert np.all((c >= 0) & (c <= 1))
    # each output is a bin's mean Platt-scaled value, so it lies in the scaled range
    scaled = rec.platt_.confidence(test)
    assert c.min() >= scaled.min() - 0.2 and c.max() <= scaled.max() + 0.2
    again = build("platt-binning", {"n_bins": 7}).fit(out, CTX).confidence(test)
    np.testing.assert_array_equal(c, again)
    other = build("platt-binning", {"n_bins": 7}).fit(out, FitContext(seed=1)).confidence(test)
    assert not np.array_equal(c, other)


# ---------------------------------------------------------------- mlp
def test_mlp_recalibrator_learns_feature_dependent_accuracy():
    rng = np.random.default_rng(0)
    n = 400
    x = rng.normal(size=(n, 4)).astype(np.float32)
    logits = np.tile(np.array([[2.0, 0.0, 0.0]], dtype=np.float32), (n, 1))
    # predictions are always class 0; correct 90% of the time when x0 > 0, 20% otherwise
    p_correct = np.where(x[:, 0] > 0, 0.9, 0.2)
    labels = np.where(rng.random(n) < p_correct, 0, 1)
    out = ModelOutputs(features=x, logits=logits, labels=labels)
    rec = build("mlp", {"hidden": [16], "epochs": 60, "lr": 1e-2}).fit(out, CTX)
    c = rec.confidence(out)
    assert c[x[:, 0] > 0.5].mean() > 0.75
    assert c[x[:, 0] < -0.5].mean() < 0.35
    module = rec.module(out, CTX)
    assert module is rec.module_
    conf, lp = module(torch.tensor(logits), torch.tensor(x))
    assert lp is None
    np.testing.assert_allclose(conf.detach().numpy(), c, atol=1e-6)
    with pytest.raises(ValueError, match="features"):
        rec.confidence(synthetic(n=10, d=5))


@pytest.mark.parametrize(
    "name", ["none", "temperature", "platt", "histogram-binning", "platt-binning", "mlp"]
)
def test_builtin_recalibrators_reject_other_objects(name):
    out = synthetic(n=20)
    with pytest.raises(TypeError, match="ModelOutputs"):
        build(name).fit(out.logits, CTX)
    with pytest.raises(TypeError, match="ModelOutputs"):
        build(name).confidence(out.probabilities())
