"""The ``meta-features`` selector (Fisch et al., TMLR 2022): each meta-feature against the
scikit-learn detector it stands for, out-of-sample fitting rows (leave-one-out and
cross-fitting, no self-leakage), the fitting-only standardisation, and training it."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from selbench import FitContext, ModelOutputs
from selbench.contract.api import FitJob
from selbench.contract.checks import NotFittedError
from selbench.contract.registry import get_registry
from selbench_plugins.selectors import metafeatures as mf
from sklearn.ensemble import IsolationForest
from sklearn.neighbors import KernelDensity, LocalOutlierFactor, NearestNeighbors
from sklearn.svm import OneClassSVM

FAST = {"epochs": 5, "batch_size": 32, "lr": 1e-2}
SIX = ["confidence", "knn-distance", "kde", "one-class-svm", "isolation-forest", "lof"]


def outputs(n, d=5, k=3, seed=0, shift=0.0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * np.arange(1, d + 1) + 2.0 + shift  # unequal scales
    logits = rng.normal(size=(n, k)) * 2
    return ModelOutputs(features=x.astype(np.float32), logits=logits.astype(np.float32),
                        labels=rng.integers(0, k, n))


def build(params=None):
    return get_registry().get("selector", "meta-features").build(params)


def fitted(params=None, fit=None, seed=0):
    sel = build(params)
    sel.fit_inputs(outputs(80) if fit is None else fit, FitContext(seed=seed))
    return sel


def standardised(sel, out):
    """The embedding as the detectors see it (fitting mean/std, rounded to float32)."""
    f = sel.fitted_
    return ((out.features.astype(np.float64) - f.mean) / f.scale).astype(np.float32).astype(
        np.float64)


def folds(n, seed, n_folds=5):
    """The cross-fitting folds and Isolation Forest seeds, drawn as the selector draws them."""
    rng = FitContext(seed=seed).generator(mf._STREAM)
    perm = rng.permutation(n)
    return np.array_split(perm, n_folds), rng.integers(0, 2**31 - 1, size=n_folds + 1)


def test_defaults_and_registration():
    sel = build()
    assert sel.features == SIX and sel.hidden == [64, 64] and sel.folds == 5
    assert type(sel).reference == "Fisch et al., TMLR 2022"
    assert type(sel).trainable
    for bad in ([], ["kde", "kde"], ["mahalanobis"]):
        with pytest.raises(ValueError):
            build({"features": bad})


def test_evaluation_meta_features_are_the_full_detectors_scores():
    fit, ev = outputs(80), outputs(50, seed=1, shift=0.5)
    sel = fitted(fit=fit)
    x, z = standardised(sel, fit), standardised(sel, ev)
    cols = sel.fitted_.columns(ev)
    knn = NearestNeighbors(n_neighbors=8).fit(x).kneighbors(z)[0].mean(axis=1)
    np.testing.assert_allclose(cols["knn-distance"], knn, rtol=1e-9, atol=1e-9)
    kde = KernelDensity(kernel="gaussian", bandwidth=1.0).fit(x).score_samples(z)
    np.testing.assert_allclose(cols["kde"], kde, rtol=1e-9, atol=1e-9)
    svm = OneClassSVM(nu=0.5, gamma=1.0 / (x.shape[1] * x.var())).fit(x)
    np.testing.assert_allclose(cols["one-class-svm"],
                               svm.score_samples(z) / svm.dual_coef_.sum(), rtol=1e-7, atol=1e-9)
    lof = LocalOutlierFactor(n_neighbors=20, novelty=True).fit(x)
    np.testing.assert_allclose(cols["lof"], lof.score_samples(z), rtol=1e-9, atol=1e-9)
    forest = IsolationForest(n_estimators=100, random_state=int(folds(80, 0)[1][-1])).fit(
        x.astype(np.float32))
    np.testing.assert_allclose(cols["isolation-forest"],
                               forest.score_samples(z.astype(np.float32)), atol=1e-12)
    # inputs: standardised with the fitting rows' (out-of-sample) statistics only
    raw_ev = np.stack([ev.confidence()] + [cols[f] for f in SIX[1:]], axis=1)
    expected = (raw_ev - sel.meta_mean_) / sel.meta_scale_
    np.testing.assert_allclose(sel.inputs(ev), expected, rtol=1e-5, atol=1e-5)
    assert sel.inputs(ev).dtype == np.float32 and sel.inputs(ev).shape == (50, 6)


def test_fitting_rows_are_scored_out_of_sample():
    fit = outputs(80)
    sel = fitted(fit=fit, seed=3)
    x, cols = standardised(sel, fit), sel.fitted_.fit_columns
    # leave-one-out kNN (each row's neighbours among the others) and KDE
    loo = NearestNeighbors(n_neighbors=8).fit(x).kneighbors()[0].mean(axis=1)
    np.testing.assert_allclose(cols["knn-distance"], loo, rtol=1e-9, atol=1e-9)
    for i in (0, 17, 79):
        others = np.delete(x, i, axis=0)
        kde = KernelDensity(bandwidth=1.0).fit(others).score_samples(x[i : i + 1])[0]
        assert cols["kde"][i] == pytest.approx(kde, rel=1e-9)
    # cross-fitting: each fold by detectors fitted on the other folds (seeded by the seed)
    parts, seeds = folds(80, 3)
    for i, held in enumerate(parts):
        train = np.setdiff1d(np.arange(80), held)
        xt = x[train]
        svm = OneClassSVM(gamma=1.0 / (xt.shape[1] * xt.var())).fit(xt)
        np.testing.assert_allclose(cols["one-class-svm"][held],
                                   svm.score_samples(x[held]) / svm.dual_coef_.sum(),
                                   rtol=1e-7, atol=1e-9)
        lof = LocalOutlierFactor(n_neighbors=20, novelty=True).fit(xt)
        np.testing.assert_allclose(cols["lof"][held], lof.score_samples(x[held]), rtol=1e-9)
        forest = IsolationForest(random_state=int(seeds[i])).fit(xt.astype(np.float32))
        np.testing.assert_allclose(cols["isolation-forest"][held],
                                   forest.score_samples(x[held].astype(np.float32)), atol=1e-12)
    # the fitting rows' inputs are these values, standardised with their own mean/std
    got = sel.inputs(fit)
    np.testing.assert_allclose(got.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(got.std(axis=0), 1.0, atol=1e-4)


def test_no_self_leakage():
    """With one neighbour, a fitting row's kNN distance is to another row (never 0), while
    the same row given as evaluation data is at distance 0 from itself."""
    fit = outputs(60)
    sel = fitted({"features": ["knn-distance", "lof"], "knn_neighbors": 1}, fit=fit)
    assert np.all(sel.fitted_.fit_columns["knn-distance"] > 0.05)
    copy = fit.subset(np.arange(10))  # fitting rows, scored as evaluation rows
    assert np.all(sel.fitted_.columns(copy)["knn-distance"] < 1e-6)
    # an exact copy of the fitting data (another object) gets the out-of-sample values
    same = fit.subset(np.arange(60))
    np.testing.assert_array_equal(sel.inputs(same), sel.inputs(fit))
    assert not np.allclose(sel.inputs(copy), sel.inputs(fit)[:10])
    # a duplicated fitting row is a genuine neighbour of its twin, but not of itself
    dup = ModelOutputs(features=np.concatenate([fit.features, fit.features[:1]]),
                       logits=np.concatenate([fit.logits, fit.logits[:1]]),
                       labels=np.concatenate([fit.labels, fit.labels[:1]]))
    sel2 = fitted({"features": ["knn-distance"], "knn_neighbors": 2}, fit=dup)
    knn = sel2.fitted_.fit_columns["knn-distance"]
    assert knn[0] > 0 and knn[0] == pytest.approx(knn[60])


def test_inputs_needs_fit_inputs_and_matching_features():
    sel = build()
    with pytest.raises(NotFittedError, match="fit_inputs"):
        sel.inputs(outputs(10))
    sel = fitted()
    with pytest.raises(ValueError, match="features"):
        sel.inputs(outputs(10, d=4))
    with pytest.raises(ValueError, match="outputs"):
        build().fit_inputs(outputs(2), FitContext())
    with pytest.raises(ValueError, match="s-mmce"):
        build().fit(outputs(10), np.zeros(10), FitContext())
    with pytest.raises(NotFittedError):
        sel.score(outputs(10), np.zeros(10))


def test_feature_subset_and_entropy():
    fit, ev = outputs(60), outputs(20, seed=1)
    sel = fitted({"features": ["entropy", "confidence"]}, fit=fit)
    assert sel.fitted_.features == () and sel.fitted_.fit_columns == {}
    p = ev.probabilities()
    raw = np.stack([-(p * np.log(p)).sum(axis=1), p.max(axis=1)], axis=1)
    np.testing.assert_allclose(sel.inputs(ev), (raw - sel.meta_mean_) / sel.meta_scale_,
                               rtol=1e-5, atol=1e-5)
    assert sel.init_module(fit, FitContext()).net[0].in_features == 2


def _train(seed=0, beta=0.8, fit=None, params=None):
    sel = build({"hidden": [16]} if params is None else params)
    scheme = get_registry().get("scheme", "selection").build(FAST)
    reg = get_registry()
    scheme.fit(outputs(150, seed=5) if fit is None else fit, selector=sel,
               recalibrator=reg.get("recalibrator", "none").build(None),
               loss=reg.get("loss", "s-mmce").build(None),
               coverage=reg.get("loss", "quadratic").build(None),
               context=FitContext(seed=seed, beta=beta))
    return sel


def test_trains_with_s_mmce_and_is_deterministic():
    ev = outputs(40, seed=9, shift=0.3)
    mf._FIT_CACHE.clear()
    a = _train()
    mf._FIT_CACHE.clear()  # refitted from scratch: the same values
    b = _train()
    sa, sb = a.score(ev, ev.confidence()), b.score(ev, ev.confidence())
    assert sa.dtype == np.float64 and sa.shape == (40,)
    assert np.all((sa > 0) & (sa < 1))
    np.testing.assert_array_equal(sa, sb)
    np.testing.assert_array_equal(a.inputs(ev), b.inputs(ev))
    c = _train(seed=1)
    assert not np.allclose(c.inputs(ev), a.inputs(ev))  # other folds, other forest
    # pickles without the per-process memo; the copy scores the same
    twin = pickle.loads(pickle.dumps(a))
    assert len(twin.fitted_._memo) == 0
    np.testing.assert_array_equal(twin.score(ev, ev.confidence()), sa)


def test_replicas_of_one_seed_share_the_detectors():
    fit, ev = outputs(120, seed=4), outputs(30, seed=8)
    reg = get_registry()
    jobs = [FitJob(fit, build({"hidden": [8]}), reg.get("recalibrator", "none").build(None),
                   reg.get("loss", "s-mmce").build(None),
                   reg.get("loss", "quadratic").build(None), FitContext(seed=s, beta=b))
            for s, b in ((0, 0.7), (0, 0.9), (1, 0.7))]
    reg.get("scheme", "selection").build(FAST).fit_many(jobs)
    s0, s0b, s1 = (j.selector for j in jobs)
    assert s0.fitted_ is s0b.fitted_ and s1.fitted_ is not s0.fitted_
    solo = _train(seed=0, beta=0.9, fit=fit, params={"hidden": [8]})
    np.testing.assert_allclose(s0b.score(ev, ev.confidence()), solo.score(ev, ev.confidence()),
                               atol=1e-5)
