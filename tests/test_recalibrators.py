"""Built-in recalibrators: known optima, hand-computed binning, the module protocol."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import minimize, minimize_scalar
from scipy.special import log_softmax
from selbench import FitContext, ModelOutputs
from selbench.contract.api import SelectionLoss
from selbench.contract.checks import NotFittedError
from selbench.contract.registry import get_registry
from selbench_plugins.recalibrators._common import equal_mass_edges
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


def _nll64(logits, labels, t):
    z = np.asarray(logits, dtype=np.float64) / t
    return -log_softmax(z, axis=1)[np.arange(len(labels)), labels].mean()


def _reference_temperature(logits, labels):
    """A high-precision float64 reference optimum: bounded Brent on log T, tight xatol."""
    res = minimize_scalar(lambda u: _nll64(logits, labels, np.exp(u)), bounds=(-4, 4),
                          method="bounded", options={"xatol": 1e-12})
    return float(np.exp(res.x))


def _overconfident(n, k, seed, temperature=2.0):
    rng = np.random.default_rng(seed)
    z = (rng.normal(size=(n, k)) * 3.0).astype(np.float32)
    s = z.astype(np.float64) / temperature
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return z, (p.cumsum(1) < rng.random((n, 1))).sum(1).clip(0, k - 1)


@pytest.mark.parametrize("n,k,temperature", [(2_000, 100, 2.0), (2_000, 100, 0.5),
                                             (20_000, 200, 1.5), (500, 2, 3.0)])
def test_temperature_reaches_the_float64_nll_optimum(n, k, temperature):
    # 20,000 x 200 is large enough for the subsampled start
    logits, labels = _overconfident(n, k, seed=n + k, temperature=temperature)
    t = fit_temperature(logits, labels)
    t_ref = _reference_temperature(logits, labels)
    ref = _nll64(logits, labels, t_ref)
    assert _nll64(logits, labels, t) <= ref * (1 + 1e-6)
    assert t == pytest.approx(t_ref, rel=1e-5)
    # float64 logits give the same optimum
    assert fit_temperature(logits.astype(np.float64), labels) == pytest.approx(t, rel=1e-6)


@pytest.mark.parametrize("name", ["netcal_cifar100_densenet-bc-100.npz",
                                  "netcal_cifar100_wideresnet-16-4.npz",
                                  "netcal_cifar10_wideresnet-16-4.npz"])
def test_temperature_reaches_the_nll_optimum_on_real_outputs(name):
    path = Path(__file__).resolve().parents[1].parent / "shared" / "data" / name
    if not path.exists():
        pytest.skip(f"real model outputs absent: {path}")
    data = np.load(path)
    logits = np.log(data["predictions"].astype(np.float64)).astype(np.float32)
    labels = data["ground_truth"]
    t = fit_temperature(logits, labels)
    t_ref = _reference_temperature(logits, labels)
    assert _nll64(logits, labels, t) <= _nll64(logits, labels, t_ref) * (1 + 1e-6)
    assert t == pytest.approx(t_ref, rel=1e-5)


def test_temperature_bounds_on_either_side():
    logits, labels = _overconfident(1_000, 10, seed=3, temperature=4.0)
    assert fit_temperature(logits, labels, 1e-3, 2.0) == 2.0
    assert fit_temperature(logits, labels, 8.0, 1e3) == 8.0
    t = fit_temperature(logits, labels, 1e-3, 1e3)
    assert 2.0 < t < 8.0
    assert fit_temperature(logits, labels, t * 0.999, t * 1.001) == pytest.approx(t, rel=1e-6)


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
    # scored as the recalibrated vector [1 - p1', p1']: its top label and that label's
    # probability (never below 0.5), whatever the backbone predicted
    probs = np.stack([1 - p1_new, p1_new], axis=1)
    np.testing.assert_array_equal(rec.predict(out), probs.argmax(1))
    np.testing.assert_allclose(rec.confidence(out), probs.max(1), atol=1e-5)
    assert rec.confidence(out).min() >= 0.5
    # binary log-probabilities are exactly [log(1 - p1'), log p1']
    module = rec.module(out, CTX)
    conf, lp = module(torch.tensor(out.logits), torch.tensor(out.features))
    np.testing.assert_allclose(lp.exp().detach().numpy()[:, 1], p1_new, atol=1e-5)
    np.testing.assert_allclose(conf.detach().numpy(), rec.confidence(out), atol=1e-7)
    np.testing.assert_array_equal(module.predict(torch.tensor(out.logits)).numpy(),
                                  rec.predict(out))


def test_platt_binary_changes_the_prediction_where_p1_crosses_one_half():
    """A backbone biased towards class 0: binary Platt moves the boundary, so the rows between
    the two boundaries change class, with the confidence of the new class (> 0.5); a tie
    p1' = 0.5 predicts class 0, as argmax does."""
    rng = np.random.default_rng(11)
    n = 2000
    score = rng.normal(size=n)
    labels = (rng.random(n) < 1 / (1 + np.exp(-(2 * score + 0.7)))).astype(np.int64)
    logits = np.stack([np.zeros(n), 2 * score - 0.7], axis=1).astype(np.float32)
    out = ModelOutputs(features=np.zeros((n, 1), np.float32), logits=logits, labels=labels)
    rec = build("platt").fit(out, CTX)
    pred = rec.predict(out)
    changed = pred != out.predictions()
    assert 0.2 < changed.mean() < 0.35, changed.mean()
    assert np.all(pred[changed] == 1)
    conf = rec.confidence(out)
    assert conf.min() >= 0.5
    # the confidence of the old prediction would be below 0.5 exactly on the changed rows
    lp = rec.module(out, CTX)(torch.tensor(logits))[1].detach().numpy()
    old_conf = np.exp(lp[np.arange(n), out.predictions()])
    np.testing.assert_array_equal(old_conf < 0.5, changed)
    np.testing.assert_allclose(conf, np.where(changed, 1 - old_conf, old_conf), atol=1e-6)
    # the accuracy of the recalibrated prediction is higher
    assert (pred == labels).mean() > out.correct().mean() + 0.03
    # tie: t = 0 exactly gives [0.5, 0.5] -> class 0
    with torch.no_grad():
        rec.module_.weight.fill_(0.0)
        rec.module_.bias.fill_(0.0)
    np.testing.assert_array_equal(rec.predict(out), np.zeros(n))
    np.testing.assert_array_equal(rec.confidence(out), np.full(n, 0.5))


def test_platt_top_label_keeps_the_prediction():
    out = synthetic(n=300, k=4, seed=12)
    rec = build("platt").fit(out, CTX)
    np.testing.assert_array_equal(rec.predict(out), out.predictions())
    k2 = synthetic(n=300, k=2, seed=12)
    rec2 = build("platt", {"mode": "top-label"}).fit(k2, CTX)
    np.testing.assert_array_equal(rec2.predict(k2), k2.predictions())


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


@pytest.mark.parametrize("split", [False, True])
def test_platt_binning_takes_at_most_n_bins_values(split):
    out = synthetic(n=400, k=4, seed=8)
    test = synthetic(n=300, k=4, seed=9)
    params = {"n_bins": 7, "split": split}
    rec = build("platt-binning", params).fit(out, CTX)
    c = rec.confidence(test)
    assert 2 <= len(np.unique(c)) <= 7
    assert np.all((c >= 0) & (c <= 1))
    # each output is a bin's mean Platt-scaled value, so it lies in the scaled range
    scaled = rec.platt_.confidence(test)
    assert c.min() >= scaled.min() - 0.2 and c.max() <= scaled.max() + 0.2
    np.testing.assert_array_equal(rec.predict(test), test.predictions())
    again = build("platt-binning", params).fit(out, CTX).confidence(test)
    np.testing.assert_array_equal(c, again)
    other = build("platt-binning", params).fit(out, FitContext(seed=1)).confidence(test)
    # only the split variant draws its halves from the seed
    assert np.array_equal(c, other) != split


def test_platt_binning_default_fits_platt_and_bins_on_all_data():
    out = synthetic(n=400, k=4, seed=8)
    rec = build("platt-binning", {"n_bins": 5}).fit(out, CTX)
    whole = build("platt").fit(out, CTX)
    assert rec.platt_.weight_fit_ == whole.weight_fit_
    assert rec.platt_.bias_fit_ == whole.bias_fit_
    # the bins: equal-mass groups of all 400 scaled fitting values, each outputs its mean
    scaled = 1 / (1 + np.exp(-(whole.weight_fit_ * platt_inputs(out.logits, "top-label")
                              + whole.bias_fit_)))
    order = np.sort(scaled)
    np.testing.assert_allclose(rec.edges_[:-1], (order[79:399:80] + order[80:400:80]) / 2,
                               rtol=0, atol=1e-15)
    np.testing.assert_allclose(rec.values_, order.reshape(5, 80).mean(1), rtol=0, atol=1e-15)
    split = build("platt-binning", {"n_bins": 5, "split": True}).fit(out, CTX)
    assert split.platt_.weight_fit_ != whole.weight_fit_
    assert np.abs(split.confidence(out) - rec.confidence(out)).max() > 1e-3


def test_platt_binning_binary_bins_p1_and_scores_its_top_label():
    """Binary mode bins the Platt probability q of class 1 (Kumar et al.'s
    PlattBinnerCalibrator) and is scored by the top label of [1 - q, q]."""
    out = synthetic(n=600, k=2, seed=13, scale=0.5)
    logits = out.logits.copy()
    logits[:, 1] -= 1.0  # a biased backbone: binary Platt moves its boundary
    out = ModelOutputs(features=out.features, logits=logits, labels=out.labels)
    rec = build("platt-binning", {"n_bins": 6}).fit(out, CTX)
    assert rec.platt_.mode_ == "binary"
    platt = build("platt").fit(out, CTX)
    s = platt_inputs(out.logits, "binary")
    q1 = 1 / (1 + np.exp(-(platt.weight_fit_ * s + platt.bias_fit_)))
    np.testing.assert_allclose(rec.edges_, equal_mass_edges(q1, 6), rtol=0, atol=1e-15)
    q = rec.values_[np.searchsorted(rec.edges_, q1)]
    probs = np.stack([1 - q, q], axis=1)
    np.testing.assert_array_equal(rec.predict(out), probs.argmax(1))
    np.testing.assert_allclose(rec.confidence(out), probs.max(1), rtol=0, atol=1e-15)
    assert np.any(rec.predict(out) != out.predictions())


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


# ------------------------------------------- training sees the recalibrated prediction
def _biased_binary(n=300, seed=0):
    """Binary outputs whose class-1 logit is 1.4 too low: Platt changes ~27% of predictions."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=n)
    labels = (rng.random(n) < 1 / (1 + np.exp(-(2 * u + 0.7)))).astype(np.int64)
    logits = np.stack([np.zeros(n), 2 * u - 0.7], axis=1).astype(np.float32)
    feats = np.stack([u, rng.normal(size=n)], axis=1).astype(np.float32)
    return ModelOutputs(features=feats, logits=logits, labels=labels)


def _check_top_label_pairs(conf, correct, label_lp):
    """conf and correct must be those of the top label of [1 - p1', p1'], whose label
    log-probability is ``label_lp``: correct iff p'(y) > 1/2, conf = max(p'(y), 1 - p'(y))."""
    p_y = np.exp(label_lp.astype(np.float64))
    clear = np.abs(p_y - 0.5) > 1e-6
    np.testing.assert_array_equal(correct[clear], (p_y > 0.5)[clear])
    np.testing.assert_allclose(conf, np.maximum(p_y, 1 - p_y), atol=1e-5)
    assert conf.min() >= 0.5 - 1e-6


class _RecordingLoss(SelectionLoss):
    """S-MCE-like loss (binary: equal to S-TLBCE) that records, row by row, what the scheme
    passes it (the training engine calls it on [R, B] tensors, one row per replica)."""

    needs_log_probs = True

    def __init__(self):
        self.seen = []

    def __call__(self, g, confidence, correct, label_log_prob=None):
        rows = confidence.reshape(-1, confidence.shape[-1])
        for r in range(rows.shape[0]):
            self.seen.append((rows[r].detach().numpy(),
                              correct.reshape(rows.shape)[r].numpy(),
                              label_log_prob.reshape(rows.shape)[r].detach().numpy()))
        return -(g * label_log_prob).mean(-1)


@pytest.mark.parametrize("scheme", ["sequential", "joint"])
@pytest.mark.parametrize("batched", [False, True])
def test_training_sees_the_binary_platt_prediction_and_its_correctness(scheme, batched):
    from selbench.contract.api import FitJob

    reg = get_registry()
    out = _biased_binary()
    jobs = [FitJob(out, reg.get("selector", "mlp").build({"hidden": [8]}), build("platt"),
                   _RecordingLoss(), reg.get("loss", "quadratic").build(None),
                   FitContext(seed=0, beta=beta)) for beta in (0.6, 0.8)]
    sch = reg.get("scheme", scheme).build({"epochs": 3, "batch_size": 64, "lr": 0.05})
    if batched:
        sch.fit_many(jobs)
    else:
        for j in jobs:
            sch.fit(j.outputs, selector=j.selector, recalibrator=j.recalibrator, loss=j.loss,
                    coverage=j.coverage, context=j.context)
    seen = [row for job in jobs for row in job.loss.seen]
    # replicas (each with the spare twin trained beside it, issue 34) x epochs x batches
    assert len(seen) == 2 * 2 * 3 * 5
    for conf, correct, label_lp in seen:
        _check_top_label_pairs(conf, correct, label_lp)
    for job in jobs:
        rec = job.recalibrator
        assert np.mean(rec.predict(out) != out.predictions()) > 0.15
        if scheme == "joint":  # h was trained, and evaluates as it was trained
            fitted = build("platt").fit(out, CTX)
            assert abs(rec.weight_ - fitted.weight_) + abs(rec.bias_ - fitted.bias_) > 1e-3


@pytest.mark.parametrize("scheme", ["sequential", "joint"])
def test_binary_platt_solo_and_batched_training_agree_where_predictions_change(scheme):
    """S-MMCE (whose kernel reads the confidence, so the top-label scoring matters) on data
    where Platt changes ~27% of the predictions: each replica of fit_many ends where its
    solo fit does."""
    from selbench.contract.api import FitJob

    reg = get_registry()
    outs = {s: _biased_binary(seed=s) for s in (0, 1)}
    cells = ((0, 0.6), (0, 0.8), (1, 0.7))
    results = []
    for batched in (False, True):
        jobs = [FitJob(outs[s], reg.get("selector", "mlp").build({"hidden": [8]}),
                       build("platt"), reg.get("loss", "s-mmce").build(None),
                       reg.get("loss", "quadratic").build(None), FitContext(seed=s, beta=b))
                for s, b in cells]
        sch = reg.get("scheme", scheme).build({"epochs": 5, "batch_size": 64, "lr": 0.05})
        if batched:
            sch.fit_many(jobs)
        else:
            for j in jobs:
                sch.fit(j.outputs, selector=j.selector, recalibrator=j.recalibrator,
                        loss=j.loss, coverage=j.coverage, context=j.context)
        results.append([(j.recalibrator.predict(j.outputs), j.recalibrator.confidence(j.outputs),
                         j.selector.score(j.outputs, j.recalibrator.confidence(j.outputs)))
                        for j in jobs])
    for (p1, c1, s1), (p2, c2, s2) in zip(*results):
        np.testing.assert_array_equal(p1, p2)
        np.testing.assert_allclose(c2, c1, atol=1e-5, rtol=0)
        np.testing.assert_allclose(s2, s1, atol=1e-5, rtol=0)
