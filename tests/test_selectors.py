"""Built-in selectors: the baselines' orientation, the learned selector's protocol."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from selbench import FitContext, ModelOutputs
from selbench.contract.checks import NotFittedError
from selbench.contract.registry import get_registry

CTX = FitContext(seed=0)


def synthetic(n=300, d=16, k=4, seed=0, n_outliers=0):
    """Gaussian features (the last ``n_outliers`` rows shifted far away) and random logits."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    x[n - n_outliers :] += 8.0
    logits = rng.normal(size=(n, k)) * 2
    labels = rng.integers(0, k, n)
    return ModelOutputs(features=x.astype(np.float32), logits=logits.astype(np.float32), labels=labels)


def build(name, params=None):
    return get_registry().get("selector", name).build(params)


def test_confidence_selector_scores_by_confidence():
    out = synthetic()
    conf = np.random.default_rng(1).random(len(out))
    sel = build("confidence").fit(out, conf, CTX)
    score = sel.score(out, conf)
    np.testing.assert_array_equal(score, conf)
    assert score.dtype == np.float64 and score is not conf


def test_none_selector_is_constant():
    out = synthetic()
    conf = out.confidence()
    score = build("none").fit(out, conf, CTX).score(out, conf)
    assert score.shape == (len(out),) and np.all(score == score[0])


@pytest.mark.parametrize("name", ["isolation-forest", "one-class-svm"])
def test_ood_selectors_score_outliers_lower(name):
    fit = synthetic(n=300, seed=0)
    test = synthetic(n=100, seed=1, n_outliers=10)
    sel = build(name).fit(fit, fit.confidence(), CTX)
    score = sel.score(test, test.confidence())
    inlier, outlier = score[:90], score[90:]
    assert outlier.max() < inlier.min()
    with pytest.raises(ValueError, match="features"):
        sel.score(synthetic(n=10, d=5), np.zeros(10))


def test_isolation_forest_is_seeded():
    out = synthetic()
    conf = out.confidence()
    a = build("isolation-forest").fit(out, conf, FitContext(seed=3)).score(out, conf)
    b = build("isolation-forest").fit(out, conf, FitContext(seed=3)).score(out, conf)
    c = build("isolation-forest").fit(out, conf, FitContext(seed=4)).score(out, conf)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)



@pytest.mark.parametrize("name, fits", [("isolation-forest", 5), ("one-class-svm", 2)])
def test_baselines_fit_many_equals_fit(monkeypatch, name, fits):
    """Selector.fit_many (called by the recalibration scheme with a method's seeds x
    training beta): the One-class SVM fits equal features once (its fit reads neither the
    seed nor beta), the Isolation Forest fits every selector (the default); either way every
    selector ends as its own fit would, with its own learned state; every confidence is
    checked."""
    a, b = synthetic(seed=0), synthetic(seed=1)
    # seed, data: three distinct (seed, data) pairs, two distinct data
    plan = [(0, a), (0, a), (1, a), (2, b), (2, b)]
    cls = type(build(name))
    calls = []
    real_fit = cls.fit
    monkeypatch.setattr(cls, "fit", lambda self, *args: calls.append(1) or real_fit(self, *args))
    many = [build(name) for _ in plan]
    cls.fit_many(many, [out for _, out in plan], [out.confidence() for _, out in plan],
                 [FitContext(seed=s, beta=0.5 + 0.1 * i) for i, (s, _) in enumerate(plan)])
    assert len(calls) == fits
    ev = synthetic(n=50, seed=5)
    for sel, (seed, out) in zip(many, plan):
        alone = real_fit(build(name), out, out.confidence(), FitContext(seed=seed))
        np.testing.assert_array_equal(sel.score(ev, ev.confidence()),
                                      alone.score(ev, ev.confidence()))
    learned = "forest_" if name == "isolation-forest" else "svm_"
    assert getattr(many[0], learned) is not getattr(many[1], learned)
    bad = a.confidence()
    bad[3] = np.nan
    with pytest.raises(ValueError, match=f"^confidence: selector '{name}' got NaN"):
        cls.fit_many([build(name), build(name)], [a, a], [a.confidence(), bad],
                     [FitContext(seed=0), FitContext(seed=0)])

def test_one_class_svm_standardises_the_features():
    out = synthetic()
    scaled = ModelOutputs(features=out.features * 100 + 5, logits=out.logits, labels=out.labels)
    conf = out.confidence()
    a = build("one-class-svm").fit(out, conf, CTX).score(out, conf)
    b = build("one-class-svm").fit(scaled, conf, CTX).score(scaled, conf)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- the learned selector
def test_mlp_selector_fit_names_the_training_schemes():
    out = synthetic()
    with pytest.raises(ValueError, match="'selection', 'sequential', 'joint'"):
        build("mlp").fit(out, out.confidence(), CTX)
    with pytest.raises(NotFittedError, match="sequential"):
        build("mlp").score(out, out.confidence())


@pytest.mark.parametrize("kind,dim", [("features", 16), ("logits", 4), ("probabilities", 4)])
def test_mlp_selector_inputs_and_module(kind, dim):
    out = synthetic()
    sel = build("mlp", {"input": kind, "hidden": [8, 8]})
    x = sel.inputs(out)
    assert x.dtype == np.float32 and x.shape == (len(out), dim)
    if kind == "probabilities":
        np.testing.assert_allclose(x.sum(1), 1.0, atol=1e-5)
    module = sel.init_module(out, CTX)
    assert module is sel.module_
    g = module(torch.tensor(x))
    assert g.shape == (len(out),) and bool(((g > 0) & (g < 1)).all())
    score = sel.score(out, out.confidence())
    np.testing.assert_allclose(score, g.detach().numpy(), atol=1e-6)
    linears = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    assert [m.out_features for m in linears] == [8, 8, 1]


def test_mlp_selector_init_is_seeded_by_the_context():
    out = synthetic()
    x = torch.tensor(build("mlp").inputs(out))

    def init(seed):
        return build("mlp").init_module(out, FitContext(seed=seed))(x).detach()

    torch.manual_seed(123)  # the global RNG must not matter
    a = init(5)
    torch.manual_seed(456)
    b = init(5)
    assert torch.equal(a, b)
    assert not torch.equal(a, init(6))


def test_mlp_selector_rejects_inputs_of_another_dimension():
    out = synthetic()
    sel = build("mlp")
    sel.init_module(out, CTX)
    with pytest.raises(ValueError, match="dimension"):
        sel.score(synthetic(n=10, d=5), np.zeros(10))


@pytest.mark.parametrize("gamma", ["scale", "auto", 0.05])
@pytest.mark.parametrize("standardize", [True, False])
def test_one_class_svm_scores_equal_scikit_learns_decision_function(gamma, standardize):
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import OneClassSVM

    fit = synthetic(n=300, seed=0)
    test = synthetic(n=5000, seed=1, n_outliers=50)  # > one scoring block of 4096 rows
    sel = build("one-class-svm", {"gamma": gamma, "standardize": standardize})
    ours = sel.fit(fit, fit.confidence(), CTX).score(test, test.confidence())
    x_fit, x_test = fit.features.astype(np.float64), test.features.astype(np.float64)
    if standardize:
        scaler = StandardScaler().fit(x_fit)
        x_fit, x_test = scaler.transform(x_fit), scaler.transform(x_test)
    ref = OneClassSVM(kernel="rbf", nu=0.5, gamma=gamma).fit(x_fit).decision_function(x_test)
    assert sel.svm_.support_vectors_.shape[0] >= 150  # nu = 0.5: at least half the rows
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-10)
    assert np.abs(ref).max() > 1e-3  # the comparison is not between two near-zero vectors
