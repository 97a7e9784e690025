"""The paper's theory as a benchmark: ``theory-mixture``, ``theory-linear``, ``oracle-domain``."""

from __future__ import annotations

import numpy as np
import pytest
from selbench.contract.api import FitContext
from selbench.contract.data import ModelOutputs
from selbench.contract.registry import get_registry
from selbench.measure.metrics import ece
from selbench_plugins.backbones.linear import TheoryLinear
from selbench_plugins.datasets.theory import TheoryMixture
from selbench_plugins.selectors.oracle import OracleDomain

CTX = FitContext(seed=0)


@pytest.fixture(scope="module")
def mixture() -> TheoryMixture:
    return TheoryMixture()


def _dist_to_pair(x: np.ndarray, centre: np.ndarray) -> np.ndarray:
    return np.minimum(np.linalg.norm(x - centre, axis=1), np.linalg.norm(x + centre, axis=1))


# ---------------------------------------------------------------------------- sampler
@pytest.mark.parametrize(
    "params",
    [
        {},
        {
            "dim": 3,
            "theta_direction": "random",
            "seed": 5,
            "sigma": 0.5,
            "r1": 0.6,
            "r2": 0.4,
            "test_size": 3000,
        },
    ],
)
def test_points_lie_in_their_balls(params):
    ds = TheoryMixture(**params)
    theta = ds.theta_star
    assert np.isclose(np.linalg.norm(theta), ds.theta_norm)
    for name in ("val", "test"):
        s = ds.split(name)
        x = s.inputs.astype(np.float64)
        assert s.inputs.dtype == np.float32 and x.shape == (len(s.labels), ds.dim)
        j1, j2 = s.domain == 0, s.domain == 1
        assert set(np.unique(s.domain)) == {0, 1}
        tol = 1e-5  # float32 rounding
        assert _dist_to_pair(x[j1], theta).max() <= ds.r1 + tol
        assert _dist_to_pair(x[j2], ds.alpha * theta).max() <= ds.r2 + tol
        # and each support is far from the other one
        assert _dist_to_pair(x[j1], ds.alpha * theta).min() > ds.r2
        assert _dist_to_pair(x[j2], theta).min() > ds.r1


def test_component_and_label_proportions(mixture):
    s = mixture.split("test")  # 10 000 points: 3 standard errors ≈ 0.012 for mix, 0.015 for y
    assert abs(np.mean(s.domain == 0) - mixture.mix) < 0.02
    assert abs(np.mean(s.labels) - 0.5) < 0.02
    assert s.labels.dtype == np.int64 and set(np.unique(s.labels)) == {0, 1}
    # the main component is centred at y·θ*, the outliers at −y·α·θ* (projection on θ*)
    y = 2.0 * s.labels - 1.0
    u = mixture.theta_star / np.linalg.norm(mixture.theta_star)
    proj = (s.inputs @ u) * y
    assert proj[s.domain == 0].mean() > 0.5 * mixture.theta_norm
    assert proj[s.domain == 1].mean() < -0.05  # wrong side on average (classes overlap)
    other = TheoryMixture(mix=0.5, test_size=4000).split("test")
    assert abs(np.mean(other.domain == 0) - 0.5) < 0.03


def test_sampled_labels_follow_the_analytic_posterior(mixture):
    """Binned label frequencies match P(y=1|x) of Appendix C on each component."""
    s = mixture.split("test")
    post = mixture.posterior(s.inputs)
    assert np.all(np.isfinite(post))  # every sample lies in the support
    for comp in (0, 1):
        m = s.domain == comp
        p, y = post[m], s.labels[m]
        order = np.argsort(p)
        bins = np.array_split(order, 10)
        gaps = [abs(y[b].mean() - p[b].mean()) for b in bins]
        assert max(gaps) < 0.07, gaps
    # outliers are labelled against the direction of θ*: mostly misclassified by sign(θ*ᵀx)
    pred = (s.inputs @ mixture.theta_star > 0).astype(int)
    assert np.mean(pred[s.domain == 1] == s.labels[s.domain == 1]) < 0.45
    assert np.mean(pred[s.domain == 0] == s.labels[s.domain == 0]) > 0.8


def test_train_split_is_the_unperturbed_mixture(mixture):
    s = mixture.split("train")
    assert s.domain is None and s.inputs.shape == (10_000, 2)
    y = 2.0 * s.labels - 1.0
    resid = s.inputs - y[:, None] * mixture.theta_star
    assert np.allclose(resid.mean(axis=0), 0.0, atol=0.1)
    np.testing.assert_allclose(np.cov(resid.T), mixture.sigma**2 * np.eye(2), atol=0.25)
    # not truncated: some points are far outside the ball B(θ*, r1)
    assert _dist_to_pair(s.inputs.astype(float), mixture.theta_star).max() > 3 * mixture.r1


def test_splits_are_seeded_and_independent_of_each_other():
    a, b = TheoryMixture(test_size=500), TheoryMixture(test_size=800)
    np.testing.assert_array_equal(a.split("val").inputs, b.split("val").inputs)
    np.testing.assert_array_equal(
        a.split("test").inputs, TheoryMixture(test_size=500).split("test").inputs
    )
    c = TheoryMixture(test_size=500, seed=1)
    assert not np.array_equal(a.split("test").inputs, c.split("test").inputs)


def test_invalid_geometry_and_infeasible_sampling_are_clear_errors():
    plugin = get_registry().get("dataset", "theory-mixture")  # validates, then builds
    with pytest.raises(ValueError, match="supports of J1 and J2 are disjoint"):
        plugin.validate_params({"r1": 0.7, "r2": 0.5})
    with pytest.raises(ValueError, match="B\\(αθ\\*, r2\\)"):
        plugin.build({"alpha": 0.1, "r2": 0.5, "r1": 0.1})
    with pytest.raises(ValueError, match="rejection sampling"):
        TheoryMixture(dim=40, sigma=2.0, r1=0.3, r2=0.3, val_size=50).split("val")
    with pytest.raises(ValueError, match="unknown split"):
        TheoryMixture().split("shifted")


# ---------------------------------------------------------------------------- backbone
def test_theta_hat_estimates_theta_star():
    ds = TheoryMixture(train_size=200_000, val_size=10, test_size=10)
    bb = TheoryLinear()
    bb.extract(ds, "val", CTX)
    # θ̂ − θ* ~ N(0, σ²/m I): norm ≈ σ·sqrt(p/m) ≈ 0.006
    assert np.linalg.norm(bb.theta_hat_ - ds.theta_star) < 0.03
    small = TheoryLinear()
    small.extract(TheoryMixture(train_size=50, val_size=10, test_size=10), "val", CTX)
    assert np.linalg.norm(small.theta_hat_ - ds.theta_star) > np.linalg.norm(
        bb.theta_hat_ - ds.theta_star
    )


def test_logits_follow_the_papers_score(mixture):
    bb = TheoryLinear()
    out = bb.extract(mixture, "test", CTX)
    x = mixture.split("test").inputs.astype(np.float64)
    s = mixture.split("train")
    y = 2.0 * s.labels - 1.0
    theta_hat = (s.inputs.astype(np.float64) * y[:, None]).mean(axis=0)
    np.testing.assert_allclose(bb.theta_hat_, theta_hat, rtol=1e-6)
    v = x @ theta_hat
    np.testing.assert_allclose(out.logits, np.stack([-v, v], 1), rtol=1e-5, atol=1e-5)
    # softmax gives f_1(x) = sigmoid(2 θ̂ᵀx), eq. (score)
    np.testing.assert_allclose(out.probabilities()[:, 1], 1 / (1 + np.exp(-2 * v)), atol=1e-6)
    np.testing.assert_array_equal(out.features, mixture.split("test").inputs)
    np.testing.assert_array_equal(out.domain, mixture.split("test").domain)
    np.testing.assert_array_equal(out.labels, mixture.split("test").labels)


def test_linear_backbone_rejects_multiclass_data():
    from selbench_plugins.datasets.digits import Digits

    with pytest.raises(ValueError, match="binary"):
        TheoryLinear().extract(Digits(), "test", CTX)


# ---------------------------------------------------------------------------- oracle selector
def _outputs(domain) -> ModelOutputs:
    n = len(domain) if domain is not None else 4
    z = np.linspace(-1, 1, n)
    return ModelOutputs(
        features=z[:, None], logits=np.stack([-z, z], 1), labels=np.zeros(n, int), domain=domain
    )


def test_oracle_selector_scores():
    out = _outputs(np.array([0, 1, 2, 1, 0]))
    sel = OracleDomain().fit(out, out.confidence(), CTX)
    assert sel.accepted_fraction_ == pytest.approx(0.6)
    np.testing.assert_array_equal(sel.score(out, out.confidence()), [1, 0, 1, 0, 1])
    assert sel.score(out, out.confidence()).dtype == np.float64
    other = get_registry().get("selector", "oracle-domain").build({"reject_domains": [0, 2]})
    np.testing.assert_array_equal(other.score(out, None), [0, 1, 0, 1, 0])
    assert not OracleDomain.trainable


def test_oracle_selector_needs_domains():
    out = _outputs(None)
    with pytest.raises(ValueError, match="outputs.domain is None"):
        OracleDomain().fit(out, out.confidence(), CTX)
    with pytest.raises(ValueError, match="confidence"):
        OracleDomain().score(_outputs(np.zeros(3, int)), np.zeros(5))
    with pytest.raises(ValueError, match="Extra inputs"):
        get_registry().get("selector", "oracle-domain").validate_params({"reject": [1]})


# ---------------------------------------------------------------------------- Theorem 1
def test_theorem_1_is_visible_with_the_default_parameters(mixture):
    """Raw and temperature-only and selection-only stay miscalibrated; rejecting the outliers
    and fitting T on the rest reaches the binning noise floor, with T ≈ T0 (Appendix C)."""
    reg = get_registry()
    bb = reg.get("backbone", "theory-linear").build({})
    val, test = bb.extract(mixture, "val", CTX), bb.extract(mixture, "test", CTX)
    oracle = reg.get("selector", "oracle-domain").build({}).fit(val, val.confidence(), CTX)
    keep_val = oracle.score(val, val.confidence()) > 0.5
    keep = oracle.score(test, test.confidence()) > 0.5
    t_all = reg.get("recalibrator", "temperature").build({}).fit(val, CTX)
    t_sel = reg.get("recalibrator", "temperature").build({}).fit(val.subset(keep_val), CTX)
    correct = test.correct()
    raw = ece(test.confidence(), correct)
    temp_only = ece(t_all.confidence(test), correct)
    select_only = ece(test.confidence()[keep], correct[keep])
    both = ece(t_sel.confidence(test)[keep], correct[keep])
    assert raw > 0.15
    assert select_only > 0.08
    assert temp_only > 0.05
    assert both < 0.02
    assert temp_only > 4 * both and select_only > 4 * both
    assert t_sel.T_ == pytest.approx(mixture.optimal_temperature(bb.theta_hat_), rel=0.1)
    # no temperature at all fixes the full target distribution (recalibration alone)
    v = np.abs(test.logits[:, 1].astype(np.float64))
    best = min(ece(1 / (1 + np.exp(-2 * v / t)), correct) for t in np.geomspace(0.5, 50, 60))
    assert best > 0.04
