"""The selectors of issue 14 against independent computations: scikit-learn, SciPy, torch,
direct NumPy formulas, and cases with known answers.

Confidence-derived (backbone logits): ``entropy``, ``margin``, ``max-logit``,
``maxlogit-pnorm``. Embedding-space (features): ``knn-distance``, ``mahalanobis``, ``lof``,
``kde``. Tolerances are stated per test; the measured differences are about 1e-15 unless
noted.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from scipy.spatial.distance import mahalanobis as scipy_mahalanobis
from scipy.special import logsumexp, softmax
from scipy.stats import entropy as scipy_entropy
from selbench import FitContext, ModelOutputs
from selbench.contract.registry import get_registry
from selbench.measure.riskcoverage import aurc
from selbench_plugins.selectors.density import (
    KDESelector,
    KNNDistanceSelector,
    LOFSelector,
    MahalanobisSelector,
    kth_neighbour_distance,
    l2_normalize,
)
from selbench_plugins.selectors.scores import (
    EntropySelector,
    MarginSelector,
    MaxLogitPNormSelector,
    MaxLogitSelector,
    pnorm_scores,
)
from sklearn.exceptions import NotFittedError
from sklearn.neighbors import LocalOutlierFactor, NearestNeighbors

CTX = FitContext(seed=0)
NAMES = ("entropy", "margin", "max-logit", "maxlogit-pnorm", "knn-distance", "mahalanobis",
         "lof", "kde")


def outputs(logits=None, features=None, labels=None, *, n=None, k=3, d=4, seed=0):
    """ModelOutputs from the given arrays; the missing ones seeded random."""
    rng = np.random.default_rng(seed)
    n = n if n is not None else len(logits if logits is not None else features)
    if logits is None:
        logits = rng.normal(size=(n, k)) * 2
    if features is None:
        features = rng.normal(size=(n, d))
    if labels is None:
        labels = rng.integers(0, np.shape(logits)[1], n)
    return ModelOutputs(features=np.asarray(features, np.float32),
                        logits=np.asarray(logits, np.float32), labels=labels)


def fit_score(selector, fit, ev):
    selector.fit(fit, fit.confidence(), CTX)
    return selector.score(ev, ev.confidence())


def test_registered_with_reference_and_summary():
    registry = get_registry()
    for name in NAMES:
        plugin = registry.get("selector", name).plugin
        assert plugin.reference(), name
        summary = plugin.describe()
        assert "(" in summary and summary.endswith("."), (name, summary)


@pytest.mark.parametrize("cls", [EntropySelector, MarginSelector, MaxLogitSelector,
                                 MaxLogitPNormSelector, KNNDistanceSelector,
                                 MahalanobisSelector, LOFSelector, KDESelector])
def test_confidence_is_checked_but_not_used(cls):
    fit, ev = outputs(n=60, seed=1), outputs(n=30, seed=2)
    sel = cls().fit(fit, fit.confidence(), CTX)
    a = sel.score(ev, ev.confidence())
    b = sel.score(ev, np.linspace(0, 1, len(ev)))
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="confidence"):
        sel.score(ev, np.ones(len(ev) + 1))
    with pytest.raises(NotFittedError):
        cls().score(ev, ev.confidence())


# ------------------------------------------------------------------------- logit scores
def test_entropy_matches_scipy_and_known_answers():
    """-H(softmax(z)) against scipy.stats.entropy of scipy.special.softmax (float64), 1e-12."""
    ev = outputs(n=200, k=7, seed=3)
    got = fit_score(EntropySelector(), ev, ev)
    want = -scipy_entropy(softmax(ev.logits.astype(np.float64), axis=1), axis=1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # uniform logits: -log K; one dominant logit of any size: 0 (no NaN from 0 log 0)
    known = outputs(logits=[[2.0, 2.0, 2.0, 2.0], [1e4, 0.0, 0.0, 0.0], [-3e4, 3e4, 0, 0]])
    got = EntropySelector().fit(known, known.confidence(), CTX).score(known,
                                                                      known.confidence())
    np.testing.assert_allclose(got, [-math.log(4), 0.0, 0.0], rtol=0, atol=1e-15)


def test_margin_matches_sorted_softmax_and_known_answers():
    """p_(1) - p_(2) against a full sort of scipy's softmax, 1e-15."""
    ev = outputs(n=200, k=6, seed=4)
    got = fit_score(MarginSelector(), ev, ev)
    p = np.sort(softmax(ev.logits.astype(np.float64), axis=1), axis=1)
    np.testing.assert_allclose(got, p[:, -1] - p[:, -2], rtol=0, atol=1e-15)
    # softmax([log 3, 0]) = [0.75, 0.25]; tied top two: 0; a huge logit: 1
    known = outputs(logits=[[math.log(3.0), 0.0, -800.0],
                            [1.0, 1.0, 0.0], [500.0, 0.0, 0.0]])
    got = MarginSelector().fit(known, known.confidence(), CTX).score(known, known.confidence())
    np.testing.assert_allclose(got, [0.5, 0.0, 1.0], rtol=0, atol=1e-7)  # log 3 in float32


def test_max_logit_is_the_largest_logit():
    ev = outputs(n=100, k=5, seed=5)
    got = fit_score(MaxLogitSelector(), ev, ev)
    np.testing.assert_array_equal(got, ev.logits.max(axis=1).astype(np.float64))
    assert got.dtype == np.float64


def test_pnorm_scores_match_numpy_norms_and_torch_normalize():
    """max_k z'_k / ||z'||_p with z' the centred logits, against np.linalg.norm (1e-13
    relative) and against the authors' formula ``F.normalize(z', p).max()`` (torch, float64)
    for p >= 1; p = 0 is no normalisation (torch's "0-norm" divides by K: same order)."""
    z = np.random.default_rng(6).normal(size=(300, 10)) * 4
    zc = z - z.mean(axis=1, keepdims=True)
    for p in (1.0, 2.0, 3.0, 7.5, 9.0, math.inf):
        want = zc.max(axis=1) / np.linalg.norm(zc, ord=p, axis=1)
        np.testing.assert_allclose(pnorm_scores(z, p), want, rtol=1e-13, atol=0)
        ref = torch.nn.functional.normalize(torch.from_numpy(zc), p=p, dim=-1).max(-1).values
        np.testing.assert_allclose(pnorm_scores(z, p), ref.numpy(), rtol=1e-13, atol=0)
    np.testing.assert_allclose(pnorm_scores(z, 0.0), zc.max(axis=1), rtol=0, atol=0)
    t0 = torch.nn.functional.normalize(torch.from_numpy(zc), p=0, dim=-1).max(-1).values
    np.testing.assert_allclose(pnorm_scores(z, 0.0) / z.shape[1], t0.numpy(), rtol=1e-15)
    np.testing.assert_allclose(pnorm_scores(z, None), softmax(z, axis=1).max(axis=1),
                               rtol=1e-14)
    # known: z = [3, 0, 0] -> z' = [2, -1, -1]; p = 1: 2/4, p = 2: 2/sqrt(6), inf: 1
    k = np.array([[3.0, 0.0, 0.0]])
    assert pnorm_scores(k, 1.0)[0] == pytest.approx(0.5, abs=1e-15)
    assert pnorm_scores(k, 2.0)[0] == pytest.approx(2 / math.sqrt(6), abs=1e-15)
    assert pnorm_scores(k, math.inf)[0] == 1.0
    # no overflow for huge logits, 0 (not NaN) for equal logits
    big = np.array([[1e300, -1e300, 0.0], [5.0, 5.0, 5.0]])
    np.testing.assert_allclose(pnorm_scores(big, 9.0), [2 ** (-1 / 9), 0.0], rtol=1e-14)
    # without centring: the raw logits' norm
    np.testing.assert_allclose(pnorm_scores(z, 2.0, centralize=False),
                               z.max(axis=1) / np.linalg.norm(z, axis=1), rtol=1e-13)


@pytest.mark.parametrize("seed", range(4))
def test_pnorm_p_is_the_grid_search_of_the_authors_code(seed):
    """p_ is the first p of the grid with the lowest fitting AURC (scores computed here
    with NumPy norms), the MSP competing first unless some p is strictly lower."""
    rng = np.random.default_rng(seed)
    n, k = 400, 10
    z = rng.normal(size=(n, k)) * rng.uniform(0.5, 4.0, size=(n, 1))  # varying scales
    labels = np.where(rng.random(n) < 0.7, z.argmax(1), rng.integers(0, k, n))
    fit = outputs(logits=z, labels=labels)
    correct = fit.correct()
    z64 = fit.logits.astype(np.float64)
    zc = z64 - z64.mean(axis=1, keepdims=True)
    grid = {0.0: aurc(zc.max(1), correct)}
    for p in range(1, 10):
        grid[float(p)] = aurc(zc.max(1) / np.linalg.norm(zc, ord=p, axis=1), correct)
    msp = aurc(softmax(z64, axis=1).max(1), correct)
    best = min(grid, key=lambda p: (grid[p], p))
    sel = MaxLogitPNormSelector().fit(fit, fit.confidence(), CTX)
    assert sel.p_ == (best if grid[best] < msp else None)
    assert sel.aurc_["msp"] == pytest.approx(msp, abs=1e-12)
    for p, value in grid.items():
        assert sel.aurc_[p] == pytest.approx(value, abs=1e-12)
    no_fallback = MaxLogitPNormSelector(msp_fallback=False).fit(fit, fit.confidence(), CTX)
    assert no_fallback.p_ == best and "msp" not in no_fallback.aurc_
    ev = outputs(n=50, k=k, seed=seed + 10)
    np.testing.assert_allclose(no_fallback.score(ev, ev.confidence()),
                               pnorm_scores(ev.logits, best), rtol=0, atol=0)


def test_pnorm_fixed_p_and_msp_fallback():
    fit = outputs(n=100, k=4, seed=7)
    sel = MaxLogitPNormSelector(p=2.0).fit(fit, fit.confidence(), CTX)
    assert sel.p_ == 2.0 and sel.aurc_ == {}
    # every candidate tied with the MSP (all correct: AURC 0): the MSP is kept
    z = np.random.default_rng(8).normal(size=(50, 3))
    fit = outputs(logits=z, labels=z.argmax(1))
    sel = MaxLogitPNormSelector().fit(fit, fit.confidence(), CTX)
    assert sel.p_ is None
    np.testing.assert_allclose(sel.score(fit, fit.confidence()), fit.confidence(), rtol=1e-14)


# ------------------------------------------------------------------------- knn-distance
def _sklearn_kth(x, bank, k):
    """-(distance to the k-th nearest) by scikit-learn on the normalised features."""
    nn = NearestNeighbors(n_neighbors=k).fit(l2_normalize(bank))
    return -nn.kneighbors(l2_normalize(x))[0][:, k - 1]


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_knn_matches_sklearn_nearest_neighbors(precision):
    """The score is minus scikit-learn's k-th neighbour distance on the normalised
    features, to 1e-9 (measured: 1e-15), for k from 1 to the fitting size."""
    rng = np.random.default_rng(9)
    centres = np.abs(rng.normal(size=(4, 64)))
    fx = np.maximum(centres[rng.integers(0, 4, 300)] + rng.normal(size=(300, 64)), 0)
    ex = np.maximum(centres[rng.integers(0, 4, 500)] + rng.normal(size=(500, 64)), 0)
    fit, ev = outputs(features=fx, seed=1), outputs(features=ex, seed=2)
    for k in (1, 5, 37, 300):
        got = fit_score(KNNDistanceSelector(k=k, precision=precision), fit, ev)
        np.testing.assert_allclose(got, _sklearn_kth(ev.features, fit.features, k),
                                   rtol=0, atol=1e-9)


@pytest.mark.parametrize("zero_rows", [False, True])
def test_knn_exactness_check_on_ties(zero_rows):
    """Features on a coarse grid (many exact ties, duplicated fitting rows; with zero rows,
    whose normalised norm is 0): the float32 path with its exactness check, whatever the
    block size and the candidates kept, equals scikit-learn to 1e-9."""
    rng = np.random.default_rng(10)
    bank = rng.integers(0, 3, size=(200, 12)).astype(np.float64)
    bank[10:20] = bank[20:30]
    x = rng.integers(0, 3, size=(300, 12)).astype(np.float64)
    if zero_rows:
        bank[:4], x[:3] = 0.0, 0.0
    else:
        bank[(bank == 0).all(1)] = 1.0
        x[(x == 0).all(1)] = 1.0
    bn, xn = l2_normalize(bank), l2_normalize(x)
    for k in (1, 4, 40, 200):
        want = _sklearn_kth(x, bank, k)
        for extra, block in ((16, None), (0, 7), (3, 64)):
            stats: dict = {}
            got = -kth_neighbour_distance(xn, bn, k, extra=extra, block=block, stats=stats)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
        assert stats["window"] + stats["float64"] > 0  # the check had work to do


def test_knn_known_answer_and_k_validation():
    """2-D: fitting directions (1,0), (0,1), (-1,0); the query (2,0) normalises to (1,0), at
    distances 0, sqrt 2, 2."""
    fit = outputs(features=[[3.0, 0.0], [0.0, 0.5], [-1.0, 0.0]])
    ev = outputs(features=[[2.0, 0.0]])
    for k, want in ((1, 0.0), (2, math.sqrt(2)), (3, 2.0)):
        got = fit_score(KNNDistanceSelector(k=k), fit, ev)
        assert got[0] == pytest.approx(-want, abs=1e-9)  # 1e-10 added to the norm
    with pytest.raises(ValueError, match=r"k: .*k <= the number of fitting rows \(3\)"):
        KNNDistanceSelector(k=4).fit(fit, fit.confidence(), CTX)


def test_knn_scores_do_not_depend_on_the_batch():
    fit, ev = outputs(n=150, d=300, seed=11), outputs(n=400, d=300, seed=12)
    sel = KNNDistanceSelector().fit(fit, fit.confidence(), CTX)
    full = sel.score(ev, ev.confidence())
    rows = np.random.default_rng(0).permutation(len(ev))[:123]
    part = sel.score(ev.subset(rows), ev.confidence()[rows])
    np.testing.assert_allclose(part, full[rows], rtol=1e-14, atol=0)


# ------------------------------------------------------------------------- mahalanobis
def test_mahalanobis_matches_scipy_with_a_pooled_pseudo_inverse():
    """-min_c d_M(x, mu_c)^2 against scipy.spatial.distance.mahalanobis with VI the
    pseudo-inverse (np.linalg.pinv) of the pooled within-class covariance (bias=True),
    computed here: relative 1e-9. Also with more features than fitting rows (singular)."""
    for n, d in ((120, 5), (30, 40)):
        rng = np.random.default_rng(n)
        labels = rng.integers(0, 3, n)
        fx = rng.normal(size=(n, d)) + 2.0 * labels[:, None]
        fit = outputs(features=fx, labels=labels, k=3)
        ev = outputs(n=40, d=d, k=3, seed=n + 1)
        got = fit_score(MahalanobisSelector(), fit, ev)
        x = fit.features.astype(np.float64)
        means = np.stack([x[labels == c].mean(0) for c in range(3)])
        centred = x - means[labels]
        vi = np.linalg.pinv(centred.T @ centred / n, hermitian=True)
        want = [-min(scipy_mahalanobis(e, m, vi) ** 2 for m in means)
                for e in ev.features.astype(np.float64)]
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_mahalanobis_known_answers_and_absent_classes():
    """1-D: class 0 at -1, 1 (mean 0), class 2 at 9, 11 (mean 10), pooled variance 1 (class
    1 absent: skipped). x = 3: min(9, 49) = 9; x = 5: 25; x = 10: 0. 2-D: one class, pooled
    covariance diag(4, 1): (2, 1) from the mean (0, 0) is 4/4 + 1/1 = 2."""
    fit = outputs(features=[[-1.0], [1.0], [9.0], [11.0]], labels=[0, 0, 2, 2], k=3)
    ev = outputs(features=[[3.0], [5.0], [10.0]], k=3)
    sel = MahalanobisSelector().fit(fit, fit.confidence(), CTX)
    np.testing.assert_array_equal(sel.classes_, [0, 2])
    np.testing.assert_allclose(sel.score(ev, ev.confidence()), [-9.0, -25.0, 0.0],
                               rtol=1e-12, atol=1e-12)
    fit = outputs(features=[[2.0, 1.0], [-2.0, 1.0], [2.0, -1.0], [-2.0, -1.0]],
                  labels=[1, 1, 1, 1])
    ev = outputs(features=[[2.0, 1.0], [0.0, 0.0]])
    got = fit_score(MahalanobisSelector(), fit, ev)
    np.testing.assert_allclose(got, [-2.0, 0.0], rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------- lof
@pytest.mark.parametrize("standardize", [False, True])
def test_lof_is_sklearn_score_samples(standardize):
    """Exactly scikit-learn's LocalOutlierFactor(novelty=True).score_samples (on the
    standardised features with ``standardize``)."""
    fit, ev = outputs(n=150, d=6, seed=13), outputs(n=60, d=6, seed=14)
    got = fit_score(LOFSelector(n_neighbors=15, standardize=standardize), fit, ev)
    fx, ex = fit.features.astype(np.float64), ev.features.astype(np.float64)
    if standardize:
        mu, sd = fx.mean(0), fx.std(0)
        fx, ex = (fx - mu) / sd, (ex - mu) / sd
    want = LocalOutlierFactor(n_neighbors=15, novelty=True).fit(fx).score_samples(ex)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    # an outlier scores lower than a typical point
    probe = outputs(features=[[0.0] * 6, [25.0] * 6])
    s = LOFSelector(n_neighbors=15).fit(fit, fit.confidence(), CTX).score(
        probe, probe.confidence())
    assert s[0] > s[1]


def test_lof_clamps_n_neighbors_without_warning():
    fit = outputs(n=8, d=3, seed=15)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sel = LOFSelector().fit(fit, fit.confidence(), CTX)
    assert sel.n_neighbors_ == 7
    assert np.all(np.isfinite(sel.score(fit, fit.confidence())))


# ------------------------------------------------------------------------- kde
def _gaussian_kde_log_density(z_fit, z_eval, h):
    """log (1/n) sum_i N(z; z_i, h^2 I), directly."""
    n, q = z_fit.shape
    sq = ((z_eval[:, None, :] - z_fit[None, :, :]) ** 2).sum(-1)
    return logsumexp(-sq / (2 * h * h), axis=1) - math.log(n) - q / 2 * math.log(2 * math.pi
                                                                             * h * h)


def test_kde_without_pca_is_a_gaussian_kde_of_standardised_features():
    """n_components=None: the log density of the standardised features (fitting mean and
    std, ddof 0) under a Gaussian kernel, computed directly: 1e-10. Known 1-D answer: the
    fitting points -5, 5 standardise to -1, 1; at 0 with h = 1 the density is
    N(0; 1, 1) = exp(-1/2) / sqrt(2 pi)."""
    fit, ev = outputs(n=80, d=3, seed=16), outputs(n=40, d=3, seed=17)
    got = fit_score(KDESelector(n_components=None, bandwidth=0.7), fit, ev)
    fx, ex = fit.features.astype(np.float64), ev.features.astype(np.float64)
    mu, sd = fx.mean(0), fx.std(0)
    want = _gaussian_kde_log_density((fx - mu) / sd, (ex - mu) / sd, 0.7)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)
    fit = outputs(features=[[-5.0], [5.0]])
    ev = outputs(features=[[0.0]])
    got = fit_score(KDESelector(n_components=None, bandwidth=1.0), fit, ev)
    assert got[0] == pytest.approx(-0.5 - 0.5 * math.log(2 * math.pi), abs=1e-12)


@pytest.mark.parametrize("bandwidth", ["scott", "silverman"])
def test_kde_with_pca_whitens_the_leading_components(bandwidth):
    """Standardise, project on the first q principal axes (NumPy SVD here; a Gaussian KDE is
    unchanged by the axes' signs), scale each to unit variance, Gaussian KDE with Scott's
    ``n^(-1/(q+4))`` or Silverman's ``(n (q+2) / 4)^(-1/(q+4))``: 1e-8."""
    rng = np.random.default_rng(18)
    mix = rng.normal(size=(10, 10))
    fx = rng.normal(size=(300, 10)) @ mix
    ex = rng.normal(size=(50, 10)) @ mix
    fit, ev = outputs(features=fx), outputs(features=ex)
    sel = KDESelector(n_components=3, bandwidth=bandwidth)
    got = fit_score(sel, fit, ev)
    f64, e64 = fit.features.astype(np.float64), ev.features.astype(np.float64)
    mu, sd = f64.mean(0), f64.std(0)
    fs, es = (f64 - mu) / sd, (e64 - mu) / sd
    centre = fs.mean(0)
    axes = np.linalg.svd(fs - centre, full_matrices=False)[2][:3].T
    zf, ze = (fs - centre) @ axes, (es - centre) @ axes
    m, s = zf.mean(0), zf.std(0)
    zf, ze = (zf - m) / s, (ze - m) / s
    n, q = zf.shape
    h = n ** (-1 / (q + 4)) if bandwidth == "scott" else (n * (q + 2) / 4) ** (-1 / (q + 4))
    assert sel.kde_.bandwidth_ == pytest.approx(h, rel=1e-12)
    np.testing.assert_allclose(got, _gaussian_kde_log_density(zf, ze, h), rtol=0, atol=1e-8)


def test_kde_clamps_components_and_is_seeded():
    fit = outputs(n=5, d=8, seed=19)
    sel = KDESelector(n_components=16).fit(fit, fit.confidence(), CTX)
    assert sel.n_components_ == 4  # fitting rows - 1
    wide, ev = outputs(n=600, d=700, seed=20), outputs(n=30, d=700, seed=21)
    a = fit_score(KDESelector(), wide, ev)  # randomised PCA (large input), seeded
    b = fit_score(KDESelector(), wide, ev)
    np.testing.assert_array_equal(a, b)
    assert np.all(np.isfinite(a))
