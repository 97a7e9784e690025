"""Tests of selbench.measure.smooth (smooth ECE, smooth reliability curve, class-wise ECE) and of the
debiased ECE of selbench.measure.metrics, against the reference implementations (relplot 1.0.3,
uncertainty-calibration 0.1.4, torch-uncertainty), direct computations from the definitions,
and the real CIFAR outputs of ../shared/data."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from selbench.measure import metrics as M
from selbench.measure.smooth import SmoothReliability, classwise_ece, smece, smooth_reliability

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SMECE_ATOL = 1e-6  # the contract; the values agree to about 1e-14
LIB_ATOL = 1e-12


@pytest.fixture(scope="module")
def relplot():
    return pytest.importorskip("relplot")


@pytest.fixture(scope="module")
def calibration():
    return pytest.importorskip("calibration")


def real(name: str) -> tuple[np.ndarray, np.ndarray]:
    """float64 probabilities [10000, K] and int64 labels of a file of ../shared/data."""
    path = DATA / name
    if not path.exists():
        pytest.skip(f"real model outputs not found at {path} (shared data folder absent)")
    with np.load(path) as d:
        return d["predictions"].astype(np.float64), d["ground_truth"].astype(np.int64)


def real_top(name: str) -> tuple[np.ndarray, np.ndarray]:
    probs, labels = real(name)
    return probs.max(1), (probs.argmax(1) == labels).astype(np.float64)


def softmax_data(rng, n, k, scale=2.0):
    z = rng.normal(size=(n, k)) * scale
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    labels = (p.cumsum(1) < rng.random((n, 1))).sum(1).clip(0, k - 1)
    return p, labels.astype(np.int64)


def binary_cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(confidence, correct) pairs: random, tied, edge."""
    rng = np.random.default_rng(20240)
    cases = {}
    for n in (1, 2, 5, 14, 100, 3000):
        f = rng.random(n)
        cases[f"random N={n}"] = f, (rng.random(n) < f**1.5).astype(float)
    f = np.round(rng.random(500), 1)
    cases["tied (1 decimal)"] = f, (rng.random(500) < f).astype(float)
    f = rng.random(300)
    cases["all correct"] = f, np.ones(300)
    cases["all wrong"] = f, np.zeros(300)
    f = rng.choice([0.0, 0.5, 1.0], 200)
    cases["confidence exactly 0, 1/2, 1"] = f, (rng.random(200) < 0.6).astype(float)
    cases["all 1, all correct"] = np.ones(50), np.ones(50)
    cases["all 0, all wrong"] = np.zeros(50), np.zeros(50)
    cases["N=1 at 0, correct"] = np.array([0.0]), np.array([1.0])
    cases["N=1 at 1, wrong"] = np.array([1.0]), np.array([0.0])
    f = 0.9 + 0.1 * rng.random(4000)
    cases["concentrated near 1"] = f, (rng.random(4000) < 0.93).astype(float)
    return cases


BINARY = binary_cases()


# =========================================================================== smooth ECE
@pytest.mark.parametrize("case", list(BINARY))
def test_smece_matches_relplot(relplot, case):
    f, y = BINARY[case]
    ref, width = relplot.smECE(f, y, return_width=True)
    assert smece(f, y) == pytest.approx(ref, abs=SMECE_ATOL)
    assert abs(smece(f, y) - ref) < 1e-12  # in fact to rounding
    assert smooth_reliability(f, y).sigma == width  # the same bandwidth, exactly


# 0.00999: round(20 / s) = 2002, an even fine grid (kernel centre half a step off);
# 0.004: a finer grid than 1001 points; 0.8: round(10 / s) = 12.5 -> 12 (half to even)
@pytest.mark.parametrize("sigma", [0.8, 0.3, 0.05, 0.013, 0.00999, 0.004])
@pytest.mark.parametrize("case", ["random N=100", "tied (1 decimal)",
                                  "confidence exactly 0, 1/2, 1", "N=1 at 0, correct",
                                  "concentrated near 1"])
def test_smece_fixed_sigma_matches_relplot(relplot, case, sigma):
    f, y = BINARY[case]
    assert smece(f, y, sigma=sigma) == pytest.approx(relplot.smECE_sigma(f, y, sigma),
                                                     abs=1e-12)


@pytest.mark.parametrize("name", ["netcal_cifar100_densenet-bc-100.npz",
                                  "netcal_cifar10_wideresnet-16-4.npz"])
def test_smece_real_data_matches_relplot(relplot, name):
    conf, correct = real_top(name)
    ref = relplot.smECE(conf, correct)
    assert smece(conf, correct) == pytest.approx(ref, abs=SMECE_ATOL)
    # float32 inputs are computed in float64 here (relplot keeps float32 in places)
    assert smece(conf.astype(np.float32), correct) == smece(conf, correct)
    assert ref > 0.01  # not a degenerate case: the CIFAR models are miscalibrated


@pytest.mark.parametrize("case", ["random N=3000", "concentrated near 1", "tied (1 decimal)"])
def test_smece_bandwidth_is_relplots_fixed_point(case):
    """The bandwidth is the upper end of relplot's bisection: s >= smECE_s, and one grid step
    (1/1024) lower the predicate flips. smECE is flat in s near the fixed point for smooth
    data (one step changes it by ~1e-6 for "random N=3000"), not for concentrated or tied
    data, where a bandwidth one step off misses relplot's value by > 5e-5."""
    f, y = BINARY[case]
    s = smooth_reliability(f, y).sigma
    assert s * 1024 == round(s * 1024)
    assert s >= smece(f, y, sigma=s)
    assert s - 1 / 1024 < smece(f, y, sigma=s - 1 / 1024)
    assert smece(f, y) == smece(f, y, sigma=s)
    steps = (s - 1 / 1024, s + 1 / 1024) if case != "random N=3000" else (s / 2, 2 * s)
    for wrong in steps:
        assert abs(smece(f, y, sigma=wrong) - smece(f, y)) > 4e-5


def test_smece_kernel_is_relplots_reflected_gaussian(relplot):
    """Data piled up near 1: the reflected kernel, the plain (non-reflected) Gaussian and the
    logit-Gaussian kernel of relplot give clearly different values; smece is the first."""
    from relplot import kernels

    f, y = BINARY["concentrated near 1"]
    s = 0.05
    t = np.linspace(0, 1, max(round(10 / s), 200))

    def with_kernel(kernel):
        rs, dens = kernel(s).smooth(f, f - y, t)
        return float(np.sum(np.abs(rs) * dens) / np.sum(dens))

    reflected = with_kernel(kernels.ReflectedGaussianKernel)
    assert smece(f, y, sigma=s) == pytest.approx(reflected, abs=1e-12)
    for other in (kernels.GaussianKernel, kernels.LogitGaussianKernel):
        assert abs(with_kernel(other) - reflected) > 1e-3


@pytest.mark.parametrize("n, s", [(400, 0.07), (400, 0.03), (2000, 0.15)])
def test_smece_from_the_definition(n, s):
    """Independent of relplot: with no confidence within a grid step of 0 or 1, smECE_s is
    sum_t |sum_i K(t, f_i) r_i| / sum_t sum_i K(t, f_i) over relplot's T points t, with the
    exact Gaussian kernel reflected once at 0 and at 1 (up to the linear binning onto the
    1001-point grid, the truncation at +-1/2 and the 1e-4 guard: < 1e-5 relative)."""
    rng = np.random.default_rng(5)
    f = 0.005 + 0.99 * rng.random(n) ** 0.5
    y = (rng.random(n) < f**2).astype(float)
    t = np.linspace(0, 1, max(round(10 / s), 200))

    def k(d):
        return np.exp(-0.5 * (d / s) ** 2)

    kern = k(t[:, None] - f) + k(t[:, None] + f) + k(t[:, None] - (2 - f))
    direct = np.abs(kern @ (f - y)).sum() / kern.sum()
    assert smece(f, y, sigma=s) == pytest.approx(direct, rel=1e-5)
    # relplot's 1e-4 guard is visible for one example: smECE of a sure mistake is not 1
    assert 0.999 < smece([0.0], [1]) < 1.0


def test_smece_counts_confidence_0_and_1_at_half_weight():
    """relplot's reflection does not mirror the end grid points: an example exactly at 0 or 1
    keeps half its kernel mass in [0, 1], one within a grid step between half and all of it."""
    def mass(f0):
        r = smooth_reliability([f0], [1], sigma=0.05, n_grid=2001)
        return float(np.sum((r.density[1:] + r.density[:-1]) / 2 * np.diff(r.x)))

    assert mass(0.5) == pytest.approx(1.0, abs=1e-9)
    assert mass(0.9) == pytest.approx(1.0, abs=1e-9)
    assert mass(1.0) == pytest.approx(0.5, abs=1e-9)
    assert mass(0.0) == pytest.approx(0.5, abs=1e-9)
    assert mass(0.9995) == pytest.approx(0.75, abs=1e-9)  # half a grid step from 1
    # so in smECE two examples at 1 weigh as much as one inside (0, 1): 1 wrong at 1.0 and
    # 1 right at 0.5 differ from 2 wrong at 1.0 and 1 right at 0.5 (same bandwidth)
    one = smece([1.0, 0.5], [0, 1], sigma=0.05)
    two = smece([1.0, 1.0, 0.5], [0, 0, 1], sigma=0.05)
    assert abs(one - two) > 0.05


def test_smece_ties_and_order():
    rng = np.random.default_rng(9)
    f = np.round(rng.random(300), 1)
    y = (rng.random(300) < f).astype(float)
    perm = rng.permutation(300)
    assert smece(f[perm], y[perm]) == pytest.approx(smece(f, y), abs=1e-14)
    assert smece(f, y.astype(bool)) == smece(f, y)


def test_smece_edge_cases_and_validation():
    assert math.isnan(smece([], []))
    assert smece(np.ones(10), np.ones(10)) == 0.0
    with pytest.raises(ValueError, match=r"confidence\[1\] = .*1\.5"):
        smece([0.5, 1.5], [1, 0])
    with pytest.raises(ValueError, match=r"correct\[0\] = .*0\.5"):
        smece([0.5], [0.5])
    with pytest.raises(ValueError, match="same length"):
        smece([0.5, 0.2], [1])
    with pytest.raises(ValueError, match="NaN"):
        smece([np.nan], [1])
    for bad in (0, -0.1, np.inf, np.nan, "0.1", True):
        with pytest.raises(ValueError, match="sigma"):
            smece([0.5], [1], sigma=bad)


# =========================================================================== smooth curve
def _relplot_diagram(relplot, f, y, **kw):
    return relplot.prepare_rel_diagram(f, y, plot_confidence_band=False, report_CE_std=False,
                                       **kw)


@pytest.mark.parametrize("case", ["random N=1", "random N=5", "random N=3000",
                                  "confidence exactly 0, 1/2, 1", "concentrated near 1"])
def test_smooth_reliability_matches_relplot(relplot, case):
    f, y = BINARY[case]
    d = _relplot_diagram(relplot, f, y)
    r = smooth_reliability(f, y)
    assert isinstance(r, SmoothReliability)
    np.testing.assert_array_equal(r.x, d["mesh"])
    np.testing.assert_allclose(r.y, d["mu"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(r.density, d["density"], rtol=0, atol=1e-12)
    assert r.sigma == d["sigma"]
    assert r.smece == pytest.approx(d["ce"], abs=1e-12)
    assert r.x.dtype == r.y.dtype == r.density.dtype == np.float64


def test_smooth_reliability_real_data(relplot):
    conf, correct = real_top("netcal_cifar100_wideresnet-16-4.npz")
    d = _relplot_diagram(relplot, conf, correct)
    r = smooth_reliability(conf, correct)
    np.testing.assert_allclose(r.y, d["mu"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(r.density, d["density"], rtol=0, atol=1e-12)
    assert (r.sigma, r.smece) == (d["sigma"], pytest.approx(d["ce"], abs=SMECE_ATOL))
    # over-confident: the smoothed accuracy lies below the diagonal where the data are
    dense = r.density > 1.0
    assert (r.y[dense] < r.x[dense]).all()


def test_smooth_reliability_fixed_sigma_and_grid(relplot):
    f, y = BINARY["concentrated near 1"]
    d = _relplot_diagram(relplot, f, y, kde_bandwidth=0.03)
    r = smooth_reliability(f, y, sigma=0.03)
    np.testing.assert_allclose(r.y, d["mu"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(r.density, d["density"], rtol=0, atol=1e-12)
    # relplot's ce keeps the automatic bandwidth; ours is smECE at the given one
    assert r.smece == smece(f, y, sigma=0.03) != pytest.approx(d["ce"], abs=1e-4)
    fine = smooth_reliability(f, y, sigma=0.03, n_grid=399)  # every other point is the 200 grid
    np.testing.assert_allclose(fine.y[::2], r.y, rtol=0, atol=1e-12)
    np.testing.assert_allclose(fine.x[::2], r.x, rtol=0, atol=1e-15)
    # the density integrates to about 1 (trapezoid rule)
    dx = np.diff(fine.x)
    assert float(np.sum((fine.density[1:] + fine.density[:-1]) / 2 * dx)) == pytest.approx(
        1, abs=0.02)


def test_smooth_reliability_edge_cases():
    r = smooth_reliability([], [])
    assert r.x.shape == r.y.shape == r.density.shape == (200,)
    assert np.isnan(r.y).all() and np.isnan(r.density).all()
    assert math.isnan(r.sigma) and math.isnan(r.smece)
    for bad in (1, 0, 2.0, True):
        with pytest.raises(ValueError, match="n_grid"):
            smooth_reliability([0.5], [1], n_grid=bad)
    r = smooth_reliability(np.ones(20), np.ones(20), n_grid=11)
    assert r.smece == 0.0 and r.x.shape == (11,)


# =========================================================================== class-wise ECE
def classwise_cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(77)
    cases = {"N=500, K=5": softmax_data(rng, 500, 5), "N=2000, K=10": softmax_data(rng, 2000, 10),
             "N=9 < bins, K=3": softmax_data(rng, 9, 3), "N=1, K=4": softmax_data(rng, 1, 4)}
    p, lab = softmax_data(rng, 300, 4)
    p = np.round(p, 1) + 1e-9  # heavily tied columns (rows renormalised)
    cases["tied"] = p / p.sum(1, keepdims=True), lab
    lab = rng.integers(0, 4, 200)
    pred = np.where(rng.random(200) < 0.7, lab, rng.integers(0, 4, 200))
    cases["one-hot (exactly 0 and 1)"] = np.eye(4)[pred], lab
    p, lab = softmax_data(rng, 400, 6)
    cases["a class never occurs"] = p, np.where(lab == 5, 0, lab)
    return cases


CLASSWISE = classwise_cases()


def lib_marginal(calibration, probs, labels, p, debias=False, scheme=None, n_bins=15):
    return calibration.lower_bound_scaling_ce(
        probs, labels, p=p, debias=debias, num_bins=n_bins,
        binning_scheme=scheme or calibration.get_equal_bins, mode="marginal")


@pytest.mark.parametrize("p, debias", [(1, False), (2, False), (3, False), (2, True)])
@pytest.mark.parametrize("binning", ["equal-mass", "equal-width"])
@pytest.mark.parametrize("case", list(CLASSWISE))
def test_classwise_matches_library(calibration, case, binning, p, debias):
    probs, labels = CLASSWISE[case]
    scheme = (calibration.get_equal_bins if binning == "equal-mass"
              else calibration.get_equal_prob_bins)
    ref = lib_marginal(calibration, probs, labels, p, debias, scheme)
    got = classwise_ece(probs, labels, p=p, binning=binning, debias=debias)
    assert got == pytest.approx(ref, abs=LIB_ATOL)


@pytest.mark.parametrize("case", ["N=500, K=5", "N=2000, K=10"])
def test_classwise_debiased_p1_reproduces_library_draws(calibration, case):
    probs, labels = CLASSWISE[case]
    np.random.seed(3)
    ref = lib_marginal(calibration, probs, labels, 1, debias=True)
    got = classwise_ece(probs, labels, debias=True, rng=np.random.RandomState(3))
    assert got == pytest.approx(ref, abs=LIB_ATOL)
    # one stream through all classes: a seed and a Generator from it agree, seeds differ
    a = classwise_ece(probs, labels, debias=True, rng=5)
    assert a == classwise_ece(probs, labels, debias=True, rng=np.random.default_rng(5))
    assert a != classwise_ece(probs, labels, debias=True, rng=6)


@pytest.mark.parametrize("case", ["N=9 < bins, K=3", "tied"])
def test_classwise_debiased_p1_needs_two_per_bin(calibration, case):
    probs, labels = CLASSWISE[case]
    with pytest.raises(ValueError, match="at least 2 points"):
        lib_marginal(calibration, probs, labels, 1, debias=True)
    with pytest.raises(ValueError, match="at least 2 examples"):
        classwise_ece(probs, labels, debias=True, rng=0)


@pytest.mark.parametrize("name, n", [("netcal_cifar100_densenet-bc-100.npz", 2000),
                                     ("netcal_cifar10_wideresnet-16-4.npz", 10000)])
def test_classwise_real_data(calibration, name, n):
    probs, labels = real(name)
    probs, labels = probs[:n], labels[:n]
    for p, debias in [(1, False), (2, True)]:
        ref = lib_marginal(calibration, probs, labels, p, debias)
        assert classwise_ece(probs, labels, p=p, debias=debias) == pytest.approx(ref,
                                                                                 abs=LIB_ATOL)
    # the library's user-facing call on these continuous outputs
    ref = calibration.get_calibration_error(probs, labels, p=1, debias=False, mode="marginal")
    assert classwise_ece(probs, labels) == pytest.approx(ref, abs=LIB_ATOL)
    # float32 rows (as stored) pass the row-sum check
    assert classwise_ece(probs.astype(np.float32), labels) == pytest.approx(
        classwise_ece(probs, labels), abs=1e-6)


def test_classwise_large_n_bucketed_path(calibration):
    """N >= 2**16 takes selbench.measure.metrics' sort-free binning, per class."""
    rng = np.random.default_rng(11)
    probs, labels = softmax_data(rng, 70_000, 3)
    probs = np.round(probs, 3)  # ties across bin boundaries too
    probs[:, 2] = 1.0 - probs[:, 0] - probs[:, 1]
    probs = np.clip(probs, 0, 1)
    ref = lib_marginal(calibration, probs, labels, 2, debias=True)
    assert classwise_ece(probs, labels, p=2, debias=True) == pytest.approx(ref, abs=LIB_ATOL)


def test_classwise_binning_and_aggregation_are_the_librarys(calibration):
    """Equal-mass (the default) and equal-width bins give different values, and the p-th
    root comes after the mean over classes: a wrong estimator fails here."""
    probs, labels = CLASSWISE["N=2000, K=10"]
    em = classwise_ece(probs, labels)
    ew = classwise_ece(probs, labels, binning="equal-width")
    assert em == pytest.approx(lib_marginal(calibration, probs, labels, 1), abs=LIB_ATOL)
    assert abs(em - ew) > 1e-4
    # per-class CE with the same equal-mass bins: selbench.measure.metrics.ece on p_k vs 1[y = k]
    per_class = np.array([M.ece(probs[:, k], labels == k, p=2) for k in range(10)])
    got = classwise_ece(probs, labels, p=2)
    assert got == pytest.approx(np.sqrt(np.mean(per_class**2)), abs=LIB_ATOL)
    assert abs(got - per_class.mean()) > 1e-5
    per_class1 = np.array([M.ece(probs[:, k], labels == k) for k in range(10)])
    assert em == pytest.approx(per_class1.mean(), abs=LIB_ATOL)


def direct_equal_width(probs, labels, n_bins, p=1, left_closed=False, aggregate="lp"):
    """Class-wise ECE with equal-width bins by loops over classes and bins: bins
    (b/M, (b+1)/M] with 0 in the first (left_closed=False) or [b/M, (b+1)/M) with 1.0 in its
    own last bin (torchmetrics); per-class CE_p aggregated as (mean CE^p)^(1/p) ("lp") or as
    the plain mean of the per-class CE_p ("mean")."""
    n, k = probs.shape
    ces = []
    for c in range(k):
        pc, hit = probs[:, c], (labels == c).astype(float)
        total = 0.0
        for b in range(n_bins + (1 if left_closed else 0)):
            lo, hi = b / n_bins, (b + 1) / n_bins
            if left_closed:
                inside = (pc >= lo) & (pc < hi) if b < n_bins else pc >= 1.0
            else:
                inside = ((pc > lo) | (b == 0)) & (pc <= hi)
            if inside.any():
                total += inside.sum() / n * abs(pc[inside].mean() - hit[inside].mean()) ** p
        ces.append(total ** (1 / p))
    ces = np.array(ces)
    return float(np.mean(ces**p) ** (1 / p)) if aggregate == "lp" else float(ces.mean())


@pytest.mark.parametrize("p", [1, 2])
def test_classwise_equal_width_direct(p):
    probs, labels = CLASSWISE["N=2000, K=10"]
    assert classwise_ece(probs, labels, p=p, binning="equal-width", n_bins=10) == \
        pytest.approx(direct_equal_width(probs, labels, 10, p), abs=1e-12)
    # probabilities exactly on bin edges: (a, b] here, [a, b) in torchmetrics-style code
    # (0.2 joins 0.1 in the first bin here, 0.3 in the second there)
    p0 = np.array([0.1, 0.2, 0.3, 0.4, 0.6, 0.0, 1.0, 0.5] * 3)
    edge = np.stack([p0, 1.0 - p0], axis=1)
    lab = np.array([1, 1, 0, 0, 1, 0, 1, 0] * 3)
    ours = classwise_ece(edge, lab, p=p, binning="equal-width", n_bins=5)
    assert ours == pytest.approx(direct_equal_width(edge, lab, 5, p), abs=1e-12)
    assert abs(ours - direct_equal_width(edge, lab, 5, p, left_closed=True)) > 1e-3


def test_classwise_equal_width_vs_torch_uncertainty():
    """torch-uncertainty's ClasswiseCalibrationError (Kull et al.): the same value for
    norm='l1' on data without probabilities on bin edges; for norm='l2' it averages the
    per-class ECE_2 where the library (and we) take the root of the mean square."""
    torch = pytest.importorskip("torch")
    tu = pytest.importorskip(
        "torch_uncertainty.metrics.classification.calibration.classwise_calibration_error")
    probs, labels = CLASSWISE["N=2000, K=10"]
    for norm, p in (("l1", 1), ("l2", 2)):
        metric = tu.ClasswiseCalibrationError(num_classes=10, num_bins=15, norm=norm)
        metric.update(torch.from_numpy(probs), torch.from_numpy(labels))
        value = float(metric.compute())
        assert value == pytest.approx(direct_equal_width(probs, labels, 15, p, aggregate="mean"),
                                      abs=1e-12)
        ours = classwise_ece(probs, labels, p=p, binning="equal-width")
        if p == 1:
            assert ours == pytest.approx(value, abs=1e-12)
        else:
            assert abs(ours - value) > 1e-5


def test_classwise_get_calibration_error_switches_on_discrete_outputs(calibration):
    """Surprise of the library: get_calibration_error uses one bin per distinct value when every
    class column has fewer than N/4 distinct values; classwise_ece is lower_bound_scaling_ce."""
    probs, labels = CLASSWISE["one-hot (exactly 0 and 1)"]
    ref = lib_marginal(calibration, probs, labels, 1)
    assert classwise_ece(probs, labels) == pytest.approx(ref, abs=LIB_ATOL)
    binned = calibration.get_calibration_error(probs, labels, p=1, debias=False,
                                               mode="marginal")
    assert binned == pytest.approx(calibration.get_binning_ce(probs, labels, p=1, debias=False,
                                                              mode="marginal"), abs=LIB_ATOL)


def test_classwise_validation():
    good = np.array([[0.2, 0.8], [0.5, 0.5]])
    assert math.isnan(classwise_ece(np.empty((0, 3)), np.empty(0, dtype=int)))
    with pytest.raises(ValueError, match=r"row 1 sums to 0\.9"):
        classwise_ece([[0.2, 0.8], [0.5, 0.4]], [0, 1])
    with pytest.raises(ValueError, match=r"probabilities\[0, 0\] = 1\.2 \(row 0\)"):
        classwise_ece([[1.2, -0.2]], [0])
    with pytest.raises(ValueError, match=r"probabilities\[1, 0\] = nan"):
        classwise_ece([[0.5, 0.5], [np.nan, 0.5]], [0, 1])
    with pytest.raises(ValueError, match="shape"):
        classwise_ece([0.5, 0.5], [0, 1])
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\); labels\[1\] = 2"):
        classwise_ece(good, [0, 2])
    with pytest.raises(ValueError, match="integers"):
        classwise_ece(good, [0.0, 1.0])
    with pytest.raises(ValueError, match="shape"):
        classwise_ece(good, [0])
    with pytest.raises(ValueError, match="binning"):
        classwise_ece(good, [0, 1], binning="uniform")
    with pytest.raises(ValueError, match="n_bins"):
        classwise_ece(good, [0, 1], n_bins=0)
    with pytest.raises(ValueError, match="p must"):
        classwise_ece(good, [0, 1], p=0.5)
    # within 1e-6 of 1 is accepted
    assert classwise_ece([[0.2, 0.8 + 5e-7], [0.5, 0.5]], [0, 1]) >= 0


# =========================================================================== debiased ECE
def debias_cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(4242)
    cases = {}
    c = np.round(rng.random(400), 2)
    cases["tied (2 decimals)"] = c, (rng.random(400) < c).astype(float)
    c = np.round(rng.random(400), 1)
    cases["tied (1 decimal)"] = c, (rng.random(400) < c).astype(float)
    c = rng.random(200)
    cases["all correct"] = c, np.ones(200)
    cases["all wrong"] = c, np.zeros(200)
    c = rng.choice([0.0, 1.0], 100)
    cases["confidence only 0 and 1"] = c, (rng.random(100) < 0.5).astype(float)
    c = np.concatenate([np.zeros(40), np.ones(40), rng.random(100)])
    cases["many exact 0 and 1"] = c, (rng.random(180) < 0.5).astype(float)
    cases["all 1, correct"] = np.ones(50), np.ones(50)
    cases["all 1, mixed"] = np.ones(50), (rng.random(50) < 0.5).astype(float)
    cases["all 0, wrong"] = np.zeros(50), np.zeros(50)
    for n in (1, 2, 7, 14, 16, 29, 30, 31, 45):
        c = rng.random(n)
        cases[f"N={n}"] = c, (rng.random(n) < c).astype(float)
    return cases


DEBIAS = debias_cases()


def lib_top(calibration, conf, correct, p, seed=None):
    if seed is not None:
        np.random.seed(seed)
    return calibration.lower_bound_scaling_ce(
        conf, correct.astype(np.int64), p=p, debias=True, num_bins=15,
        binning_scheme=calibration.get_equal_bins, mode="top-label")


def check_debiased(calibration, conf, correct):
    """p = 2 (deterministic) and p = 1, 3 (normal resampling, RandomState(s) after
    np.random.seed(s)): equal to 1e-12, or both refuse (a bin with fewer than 2 examples)."""
    ref = lib_top(calibration, conf, correct, 2)
    assert M.ece(conf, correct, p=2, debias=True) == pytest.approx(ref, abs=LIB_ATOL)
    for p in (1, 3):
        try:
            ref = lib_top(calibration, conf, correct, p, seed=17)
        except ValueError:
            with pytest.raises(ValueError, match="at least 2 examples"):
                M.ece(conf, correct, p=p, debias=True, rng=np.random.RandomState(17))
            continue
        got = M.ece(conf, correct, p=p, debias=True, rng=np.random.RandomState(17))
        assert got == pytest.approx(ref, abs=LIB_ATOL)


@pytest.mark.parametrize("case", list(DEBIAS))
def test_debiased_ece_matches_library_edge_cases(calibration, case):
    check_debiased(calibration, *DEBIAS[case])


def test_debiased_ece_refusals_are_the_librarys(calibration):
    """The cases where the resampling estimator refuses, in both implementations."""
    for case in ("all 0, wrong", "N=1", "N=2", "N=7", "N=14", "N=16", "N=29"):
        conf, correct = DEBIAS[case]
        with pytest.raises(ValueError):
            lib_top(calibration, conf, correct, 1, seed=0)
        with pytest.raises(ValueError):
            M.ece(conf, correct, p=1, debias=True, rng=0)


@pytest.mark.parametrize("name", ["netcal_cifar100_densenet-bc-100.npz",
                                  "netcal_cifar100_wideresnet-16-4.npz",
                                  "netcal_cifar10_wideresnet-16-4.npz"])
def test_debiased_ece_real_data(calibration, name):
    check_debiased(calibration, *real_top(name))


def test_debiased_ece_large_n(calibration):
    """N >= 2**16: selbench.measure.metrics bins without sorting; ties and exact 0/1 included."""
    rng = np.random.default_rng(12)
    conf = np.concatenate([np.zeros(10_000), np.ones(15_000), np.round(rng.random(45_000), 3)])
    correct = (rng.random(conf.size) < conf**1.1).astype(float)
    check_debiased(calibration, conf, correct)


@pytest.mark.parametrize("k", [1, 5, 300, 3000])
@pytest.mark.parametrize("sigma", [0.003, 0.05, 0.3])
def test_smece_rows_equal_smece_at_a_fixed_bandwidth(k, sigma):
    """The bootstrap's batched smECE (all rows by one FFT) and its nested-prefix form equal
    relplot's smECE_sigma as :func:`smece` computes it, row by row."""
    from selbench.measure.smooth import smece_prefix_rows, smece_rows

    g = np.random.default_rng([k, 11])
    conf = g.uniform(0.1, 1.0, (6, k))
    conf[0, 0] = 1.0  # an example exactly at 1: half weight
    corr = (g.uniform(size=(6, k)) < conf).astype(float)
    ref = np.array([smece(c, y, sigma=sigma) for c, y in zip(conf, corr)])
    np.testing.assert_allclose(smece_rows(conf, corr, sigma), ref, rtol=0, atol=1e-12)
    ks = [k, max(1, k // 3), max(1, k // 2)]
    got = smece_prefix_rows(conf, corr, ks, [sigma, 2 * sigma, sigma])
    for j, (kj, s) in enumerate(zip(ks, [sigma, 2 * sigma, sigma])):
        ref = [smece(c[:kj], y[:kj], sigma=s) for c, y in zip(conf, corr)]
        np.testing.assert_allclose(got[:, j], ref, rtol=0, atol=1e-12)
