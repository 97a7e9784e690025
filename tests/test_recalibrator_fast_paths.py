"""The fast fitting paths of the built-in recalibrators against the code they replaced.

``platt_inputs``, ``fit_logistic`` and ``platt_probability`` (platt.py), the binning
helpers ``equal_mass_edges``, ``lookup_bins`` and ``bin_means`` (_common.py) and the
top-label confidence of ``HistogramBinning`` (binning.py) were rewritten for speed (issue 12,
perf/bench_peers.py). The reference implementations below are the previous code, copied
verbatim. The binning results must be the same bit for bit (the contract with Kumar et al.'s
``calibration`` package), the Platt inputs equal to float64 rounding, and the Platt fit the
same optimum (gradient below 1e-12); none may depend on torch's number of threads.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from selbench import FitContext, ModelOutputs
from selbench_plugins.recalibrators import _common, binning, platt
from selbench_plugins.recalibrators._common import bin_means, equal_mass_edges, lookup_bins
from selbench_plugins.recalibrators.binning import HistogramBinning, PlattBinning
from selbench_plugins.recalibrators.platt import (
    LOGIT_CLIP,
    fit_logistic,
    platt_inputs,
    platt_probability,
)

CTX = FitContext(seed=0)


# ---------------------------------------------------------------- the code replaced
def ref_platt_inputs(logits, mode):
    z = np.asarray(logits, dtype=np.float64)
    if mode == "binary":
        s = z[:, 1] - z[:, 0]
    else:
        top = z.argmax(axis=1)
        zt = z[np.arange(z.shape[0]), top]
        rest = z.copy()
        rest[np.arange(z.shape[0]), top] = -np.inf
        m = rest.max(axis=1)
        lse = m + np.log(np.exp(rest - m[:, None]).sum(axis=1))
        s = zt - lse
    return np.clip(s, -LOGIT_CLIP, LOGIT_CLIP)


def ref_platt_probability(s, weight, bias):
    x = np.asarray(s, dtype=np.float64) * float(weight) + float(bias)
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def ref_fit_logistic(s, y, max_iter=100):
    s = np.asarray(s, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    X = np.stack([s, np.ones_like(s)], axis=1)
    n = s.shape[0]

    def loss(w):
        t = X @ w
        return float(np.mean(np.logaddexp(0.0, t) - y * t))

    w = np.zeros(2)
    f = loss(w)
    for _ in range(max_iter):
        t = X @ w
        p = 0.5 * (1.0 + np.tanh(0.5 * t))
        g = X.T @ (p - y) / n
        if np.max(np.abs(g)) < 1e-12:
            break
        H = (X * (p * (1 - p))[:, None]).T @ X / n
        try:
            d = np.linalg.solve(H + 1e-14 * np.eye(2), g)
            if not np.all(np.isfinite(d)) or g @ d <= 0:
                raise np.linalg.LinAlgError
        except np.linalg.LinAlgError:
            d = g
        step = 1.0
        while step > 1e-10:
            w_new = w - step * d
            f_new = loss(w_new)
            if f_new <= f - 1e-4 * step * (g @ d):
                break
            step *= 0.5
        else:
            break
        if np.max(np.abs(w_new - w)) <= 1e-13 * (1 + np.max(np.abs(w))):
            w, f = w_new, f_new
            break
        w, f = w_new, f_new
    return float(w[0]), float(w[1])


def ref_equal_mass_edges(values, n_bins):
    v = np.sort(np.asarray(values, dtype=np.float64))
    n = v.shape[0]
    k = max(1, min(int(n_bins), n))
    sizes = np.full(k, n // k)
    sizes[: n % k] += 1
    ends = np.cumsum(sizes)
    inner = (v[ends[:-1] - 1] + v[ends[:-1]]) / 2.0
    return np.unique(np.concatenate([inner, [1.0]]))


def ref_lookup_bins(edges, values):
    idx = np.searchsorted(edges, np.asarray(values, dtype=np.float64), side="left")
    return np.minimum(idx, len(edges) - 1)


def ref_bin_means(edges, values, targets):
    """Per bin, one at a time: the mean of its targets, or its midpoint when empty."""
    idx = ref_lookup_bins(edges, values)
    targets = np.asarray(targets, dtype=np.float64)
    means = np.empty(len(edges))
    for b in range(len(edges)):
        inside = targets[idx == b]
        lower = edges[b - 1] if b else 0.0
        means[b] = inside.sum() / inside.size if inside.size else (lower + edges[b]) / 2.0
    return means


def bits(a):
    """The float64 array's bit patterns (an exact comparison that also sees -0.0)."""
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64)


def gradient(s, y, a, b):
    """Largest |component| of the mean log-loss's gradient, float64 NumPy."""
    r = 0.5 * (1.0 + np.tanh(0.5 * (a * s + b))) - y
    return max(abs(np.mean(r * s)), abs(np.mean(r)))


@pytest.fixture
def threads():
    """Runs a function with 1 and with 2 torch threads; restores the setting."""
    before = torch.get_num_threads()

    def run(fn, n):
        torch.set_num_threads(n)
        try:
            return fn()
        finally:
            torch.set_num_threads(before)

    return run


def logits(n, k, scale, seed, ties=False):
    z = np.random.default_rng([seed, n, k]).normal(size=(n, k)) * scale
    return (np.round(z) if ties else z).astype(np.float32)


# ---------------------------------------------------------------- platt_inputs
@pytest.mark.parametrize("k", [2, 3, 10, 17, 100])
@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0, 300.0])
def test_platt_inputs_equal_the_reference(k, scale):
    for n, ties in ((1, False), (7, False), (500, False), (500, True)):
        z = logits(n, k, scale, seed=1, ties=ties)
        got = platt_inputs(z, "top-label")
        ref = ref_platt_inputs(z, "top-label")
        assert got.dtype == np.float64 and got.shape == (n,)
        # float64 rounding of the logits' size (the reference subtracts two log-sum-exps
        # of that size; the rewrite subtracts the top logit first, which is exact)
        tol = 8 * np.finfo(np.float64).eps * (1 + np.abs(z.astype(np.float64)).max(axis=1))
        assert np.all(np.abs(got - ref) <= tol)
        if k == 2:
            assert np.array_equal(bits(platt_inputs(z, "binary")), bits(ref_platt_inputs(z, "binary")))


def test_platt_inputs_on_ties_clips_and_block_edges():
    z = np.zeros((4, 5), np.float32)  # every class tied: logit(1/5) = -log 4
    np.testing.assert_allclose(platt_inputs(z, "top-label"), -math.log(4), rtol=0, atol=1e-15)
    z[1, 2] = 1e4  # certain: clipped at +LOGIT_CLIP
    z[2, :2] = 50.0  # two tied maxima far above the rest: logit(1/2) = 0 up to exp(-50)
    s = platt_inputs(z, "top-label")
    assert s[1] == LOGIT_CLIP and abs(s[2]) < 1e-20
    # a block boundary (the blocks hold 2^19 // K rows) and float64 logits left untouched
    k = 10
    n = platt._INPUT_BLOCK // k + 3
    z64 = logits(n, k, 2.0, seed=2).astype(np.float64)
    before = z64.copy()
    np.testing.assert_allclose(platt_inputs(z64, "top-label"), ref_platt_inputs(z64, "top-label"),
                               rtol=0, atol=1e-14)
    assert np.array_equal(z64, before)


def test_platt_inputs_do_not_depend_on_threads(threads):
    z = logits(60_000, 10, 2.0, seed=3)
    one = threads(lambda: platt_inputs(z, "top-label"), 1)
    two = threads(lambda: platt_inputs(z, "top-label"), 2)
    assert np.array_equal(bits(one), bits(two))


def test_platt_probability_is_the_same_expression():
    s = np.concatenate([np.linspace(-LOGIT_CLIP, LOGIT_CLIP, 1001), [-800.0, 800.0, 0.0]])
    for w, b in ((0.7, -0.3), (-2.5, 1.0), (1e3, 0.0)):
        assert np.array_equal(bits(platt_probability(s, w, b)), bits(ref_platt_probability(s, w, b)))


# ---------------------------------------------------------------- fit_logistic
def logistic_data(n, seed, a=0.7, b=-0.4, scale=3.0):
    rng = np.random.default_rng([seed, n])
    s = rng.normal(size=n) * scale
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(a * s + b)))).astype(np.float64)
    return s, y


@pytest.mark.parametrize("n", [3, 50, 2_000, 300_000])
def test_fit_logistic_reaches_the_reference_optimum(n):
    # 300,000 examples start from a strided subsample (n // 2^16 >= 4)
    s, y = logistic_data(n, seed=4)
    if n == 3:
        y = np.array([1.0, 0.0, 1.0])[np.argsort(np.argsort(s))]  # 1, 0, 1 along s: not separable
    a, b = fit_logistic(s, y)
    assert gradient(s, y, a, b) < 1e-12
    a0, b0 = ref_fit_logistic(s, y)
    assert abs(a - a0) <= 1e-9 * (1 + abs(a0)) and abs(b - b0) <= 1e-9 * (1 + abs(b0))


def test_fit_logistic_edge_inputs():
    # no examples: the reference's (0, 0)
    assert fit_logistic(np.zeros(0), np.zeros(0)) == (0.0, 0.0)
    # one constant input: a s + b fits the mean label
    s = np.full(400, 1.7)
    y = (np.arange(400) % 4 == 0).astype(float)
    a, b = fit_logistic(s, y)
    assert 1 / (1 + math.exp(-(a * 1.7 + b))) == pytest.approx(0.25, abs=1e-12)
    # all labels equal: the optimum is at infinity; stops once the gradient vanishes
    for label in (0.0, 1.0):
        s, _ = logistic_data(1_000, seed=5)
        a, b = fit_logistic(s, np.full(1_000, label))
        assert gradient(s, np.full(1_000, label), a, b) < 1e-12
        p = 1 / (1 + np.exp(-(a * s + b)))
        assert np.all(p < 1e-6) if label == 0 else np.all(p > 1 - 1e-6)
    # separable data: large |a|, every example on its side
    s, _ = logistic_data(1_000, seed=6)
    y = (s > 0.3).astype(float)
    a, b = fit_logistic(s, y)
    assert gradient(s, y, a, b) < 1e-12 and a > 10
    assert np.array_equal(a * s + b > 0, y == 1)


def test_fit_logistic_falls_back_to_zero_when_the_subsample_start_is_bad():
    # the strided subsample (every 4th example) is separable, the whole data is not: the
    # subsample's fit runs off to a huge slope that is worse than (0, 0) on all the data
    n = 1 << 18
    rng = np.random.default_rng(7)
    s = rng.normal(size=n)
    y = (rng.random(n) < 0.5).astype(float)
    y[::4] = (s[::4] > 0).astype(float)
    sub = platt._LogisticPass(torch.from_numpy(s[::4].copy()), torch.from_numpy(y[::4].copy()))
    a_sub, b_sub = platt._newton(sub, 0.0, 0.0, 100)
    full = platt._LogisticPass(torch.from_numpy(s), torch.from_numpy(y))
    assert full(a_sub, b_sub)[0] > math.log(2)
    a, b = fit_logistic(s, y)
    assert gradient(s, y, a, b) < 1e-12
    a0, b0 = ref_fit_logistic(s, y)
    assert abs(a - a0) <= 1e-9 and abs(b - b0) <= 1e-9


def test_fit_logistic_does_not_depend_on_threads(threads):
    s, y = logistic_data(300_000, seed=8)
    assert threads(lambda: fit_logistic(s, y), 1) == threads(lambda: fit_logistic(s, y), 2)


# ---------------------------------------------------------------- binning helpers
def values(kind, n, rng):
    buckets = 1 << 16
    return {
        "uniform": lambda: rng.random(n),
        "skewed": lambda: rng.random(n) ** 0.05,  # concentrated near 1
        "near-one": lambda: 1 - rng.random(n) * 3e-5 * (rng.random(n) < 0.7),  # many 1.0
        "ties": lambda: rng.integers(0, 7, n) / 6.0,
        "bucket-ends": lambda: rng.integers(0, buckets + 1, n) / buckets,
        "tiny": lambda: rng.random(n) * 1e-9,
        "zeros": lambda: np.zeros(n),
        "outside": lambda: rng.random(n) * 1.2 - 0.1,  # the fallback path
    }[kind]()


KINDS = ["uniform", "skewed", "near-one", "ties", "bucket-ends", "tiny", "zeros", "outside"]


@pytest.mark.parametrize("kind", KINDS)
def test_binning_helpers_equal_the_reference_bit_for_bit(kind):
    rng = np.random.default_rng([9, KINDS.index(kind)])
    # around the fast paths' thresholds (2^14 values for the edges, 2^15 for the lookup)
    for n in (0, 1, 16, _common._SELECT_MIN_N - 1, _common._SELECT_MIN_N,
              _common._TABLE_MIN_N, 70_001):
        v = values(kind, n, rng)
        for n_bins in (1, 2, 15, 1000):
            edges = equal_mass_edges(v, n_bins)
            ref = ref_equal_mass_edges(v, n_bins)
            assert edges.shape == ref.shape and np.array_equal(bits(edges), bits(ref))
            probes = [v, ref, np.nextafter(ref, 0.0), np.nextafter(ref, 2.0),
                      values(kind, 40_000, rng), rng.random(40_000)]
            for p in probes:
                got = lookup_bins(ref, p)
                assert got.dtype == np.intp and np.array_equal(got, ref_lookup_bins(ref, p))
            if n:
                t = (rng.random(n) < 0.5).astype(float)
                assert np.array_equal(bits(bin_means(ref, v, t)), bits(ref_bin_means(ref, v, t)))


def test_binning_helpers_with_nan_take_the_old_path():
    rng = np.random.default_rng(10)
    v = rng.random(40_000)
    v[::7] = np.nan
    assert np.array_equal(equal_mass_edges(v, 15), ref_equal_mass_edges(v, 15), equal_nan=True)
    edges = ref_equal_mass_edges(rng.random(100), 15)
    assert np.array_equal(lookup_bins(edges, v), ref_lookup_bins(edges, v))


# ---------------------------------------------------------------- histogram binning
@pytest.mark.parametrize("k", [2, 3, 9, 10, 129, 1000])
def test_top_label_equals_confidence_and_correct(k):
    for n, ties in ((1, False), (binning._TOP_BLOCK // k + 5, False), (3_000, True)):
        z = logits(n, k, 3.0, seed=11, ties=ties)
        labels = np.random.default_rng(12).integers(0, k, n)
        out = ModelOutputs(features=np.zeros((n, 1), np.float32), logits=z, labels=labels)
        conf, correct = binning.top_label(out)
        assert np.array_equal(bits(conf), bits(out.probabilities().max(axis=1)))
        assert np.array_equal(bits(correct), bits(out.correct()))


def test_histogram_and_platt_binning_fit_and_apply_as_before():
    n, k = 70_000, 10  # over the fast paths' thresholds
    z = logits(n, k, 2.0, seed=13)
    labels = np.random.default_rng(14).integers(0, k, n)
    out = ModelOutputs(features=np.zeros((n, 1), np.float32), logits=z, labels=labels)
    rec = HistogramBinning(n_bins=15).fit(out, CTX)
    conf = out.confidence()
    edges = ref_equal_mass_edges(conf, 15)
    assert np.array_equal(bits(rec.edges_), bits(edges))
    assert np.array_equal(bits(rec.values_), bits(ref_bin_means(edges, conf, out.correct())))
    assert np.array_equal(bits(rec.confidence(out)),
                          bits(rec.values_[ref_lookup_bins(edges, conf)]))
    pb = PlattBinning(n_bins=15).fit(out, CTX)
    scaled = ref_platt_probability(ref_platt_inputs(z, "top-label"), pb.platt_.weight_fit_,
                                   pb.platt_.bias_fit_)
    # the Platt inputs agree to float64 rounding, so the edges to a few ulps
    np.testing.assert_allclose(pb.edges_, ref_equal_mass_edges(scaled, 15), rtol=0, atol=1e-15)
