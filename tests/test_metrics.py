"""Tests of selbench.measure.metrics against the reference library, hand computations and naive loops."""

from __future__ import annotations

import math
from pathlib import Path

import calibration
import numpy as np
import pytest
from calibration import utils as cal_utils
from selbench.measure import binning as B
from selbench.measure import metrics as M

DATA_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
REAL_FILES = {
    # file -> accuracy stated in ../shared/data/README.md (3 decimals)
    "netcal_cifar100_densenet-bc-100.npz": 0.754,
    "netcal_cifar100_wideresnet-16-4.npz": 0.754,
    "netcal_cifar10_wideresnet-16-4.npz": 0.911,
}


def lib_ece(probs, labels, p, debias=False, num_bins=15):
    """The paper's call to the uncertainty-calibration package."""
    return calibration.lower_bound_scaling_ce(
        probs,
        labels,
        p=p,
        debias=debias,
        num_bins=num_bins,
        binning_scheme=calibration.get_equal_bins,
        mode="top-label",
    )


def make_probs(rng, n, k, *, concentration=0.3, p_right=0.7):
    """Dirichlet class probabilities; the label is the argmax with prob. p_right, else uniform."""
    probs = rng.dirichlet(np.full(k, concentration), size=n)
    labels = np.where(rng.random(n) < p_right, probs.argmax(1), rng.integers(0, k, n))
    return probs, labels.astype(np.int64)


def check_against_library(probs, labels):
    conf, correct = M.top_label(probs, labels)
    for p in (1, 2):
        expected = lib_ece(probs, labels, p)
        assert M.ece(conf, correct, p=p) == pytest.approx(expected, abs=1e-12, rel=0)


# --------------------------------------------------------------------------- vs the library
@pytest.mark.parametrize("n", [16, 29, 100, 1003, 4000])
@pytest.mark.parametrize("k", [2, 10])
def test_ece_matches_library_dirichlet(n, k):
    rng = np.random.default_rng(1000 * n + k)
    probs, labels = make_probs(rng, n, k)
    check_against_library(probs, labels)


@pytest.mark.parametrize("n, decimals", [(30, 1), (150, 2), (1001, 2), (3000, 2)])
def test_ece_matches_library_heavy_ties(n, decimals):
    # Probabilities rounded to 1 or 2 decimals: few distinct confidences, so runs of ties
    # straddle the array_split boundaries and bins merge; argmax ties occur too.
    rng = np.random.default_rng(n)
    probs, labels = make_probs(rng, n, 5, concentration=0.5)
    probs = np.round(probs, decimals)
    conf, _ = M.top_label(probs, labels)
    assert np.unique(conf).size < n / 2
    check_against_library(probs, labels)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 14, 15])
def test_ece_matches_library_small_n(n):
    # N <= 15: the library uses min(15, N) bins.
    rng = np.random.default_rng(7 + n)
    probs, labels = make_probs(rng, n, 4)
    check_against_library(probs, labels)


def test_ece_matches_library_all_correct_all_wrong_single():
    rng = np.random.default_rng(3)
    probs, _ = make_probs(rng, 500, 6)
    right = probs.argmax(1)
    check_against_library(probs, right)  # all correct
    check_against_library(probs, (right + 1) % 6)  # all wrong
    check_against_library(probs[:1], right[:1])  # a single example
    # all correct: ECE_1 = sum_b |B_b|/N (1 - mean conf_b) = 1 - mean confidence
    conf, correct = M.top_label(probs, right)
    assert M.ece(conf, correct) == pytest.approx(1.0 - conf.mean(), abs=1e-12)
    # all wrong: ECE_1 = mean confidence
    conf, correct = M.top_label(probs, (right + 1) % 6)
    assert M.ece(conf, correct) == pytest.approx(conf.mean(), abs=1e-12)


def test_ece_matches_library_1d_edge_values():
    # The library's 1-D (binary) path bins the given values directly: check confidences at
    # 0 and 1, long runs of ties, and adjacent floats whose midpoint rounds up to the upper
    # value (so a value equal to a part's first element lands in the previous bin).
    rng = np.random.default_rng(11)
    a = np.nextafter(0.5, 1.0)
    b = np.nextafter(a, 1.0)
    assert (a + b) / 2.0 == b  # round-half-to-even picks b
    cases = [
        np.array([0.0, 0.0, 1.0, 1.0, 1.0, 0.3, 0.3]),
        np.repeat([0.2, 0.5, 0.9], [13, 20, 7]),
        np.array([a, a, b, b, b, b, 0.7, 0.7] * 4),
        rng.random(47),
    ]
    for conf in cases:
        labels = (rng.random(conf.size) < conf).astype(np.int64)
        for p in (1, 2):
            expected = lib_ece(conf, labels, p)
            got = M.ece(conf, labels, p=p)
            assert got == pytest.approx(expected, abs=1e-12, rel=0)


@pytest.mark.parametrize("n", [5, 40, 1003])
def test_debiased_l2_matches_library(n):
    rng = np.random.default_rng(100 + n)
    probs, labels = make_probs(rng, n, 3)
    conf, correct = M.top_label(probs, labels)
    expected = lib_ece(probs, labels, 2, debias=True)
    assert M.ece(conf, correct, p=2, debias=True) == pytest.approx(expected, abs=1e-12, rel=0)
    # It is deterministic and (for this data) below the plug-in estimate.
    assert M.ece(conf, correct, p=2, debias=True) <= M.ece(conf, correct, p=2)


def test_debiased_l1_is_random_and_reproduces_library_draws():
    rng = np.random.default_rng(5)
    probs, labels = make_probs(rng, 600, 4)
    conf, correct = M.top_label(probs, labels)
    # The library draws from np.random; a RandomState with the same seed gives the same draws.
    np.random.seed(42)
    expected = lib_ece(probs, labels, 1, debias=True)
    got = M.ece(conf, correct, p=1, debias=True, rng=np.random.RandomState(42))
    assert got == pytest.approx(expected, abs=1e-12, rel=0)
    # Same seed -> same value; different seeds -> different values near the same estimate.
    v1 = M.ece(conf, correct, p=1, debias=True, rng=1)
    assert M.ece(conf, correct, p=1, debias=True, rng=1) == v1
    v2 = M.ece(conf, correct, p=1, debias=True, rng=2)
    assert v1 != v2 and abs(v1 - v2) < 0.01
    assert v1 < M.ece(conf, correct, p=1)


def test_debiased_l1_needs_two_per_bin():
    with pytest.raises(ValueError, match="at least 2 examples in every bin"):
        M.ece([0.6, 0.7, 0.8], [1, 0, 1], p=1, debias=True, rng=0)


def test_float32_inputs_are_computed_in_float64():
    rng = np.random.default_rng(8)
    probs, labels = make_probs(rng, 2000, 10)
    p32 = probs.astype(np.float32)
    conf, correct = M.top_label(p32, labels)
    assert conf.dtype == np.float64
    expected64 = lib_ece(p32.astype(np.float64), labels, 1)
    assert M.ece(conf, correct) == pytest.approx(expected64, abs=1e-12, rel=0)
    # The library itself accumulates float32 inputs in float32: close, not identical.
    assert M.ece(conf, correct) == pytest.approx(lib_ece(p32, labels, 1), abs=1e-5)


# --------------------------------------------------------------------------- real outputs
@pytest.fixture(scope="module", params=sorted(REAL_FILES))
def real_outputs(request):
    path = DATA_DIR / request.param
    if not path.is_file():
        pytest.skip(f"real model outputs not available: {path} is absent")
    with np.load(path) as z:
        return request.param, z["predictions"], z["ground_truth"]


def test_real_outputs_ece_and_accuracy(real_outputs):
    name, probs32, labels = real_outputs
    probs = probs32.astype(np.float64)
    conf, correct = M.top_label(probs, labels)
    assert round(M.accuracy(correct), 3) == REAL_FILES[name]
    assert M.accuracy(correct) == pytest.approx(np.mean(probs.argmax(1) == labels), abs=0)
    for p in (1, 2):
        expected = lib_ece(probs, labels, p)
        assert M.ece(conf, correct, p=p) == pytest.approx(expected, abs=1e-12, rel=0)
    assert M.brier(conf, correct) == pytest.approx(
        cal_utils.eval_top_mse(conf, probs, labels), abs=1e-15
    )
    # These networks are over-confident: mean confidence above accuracy, ECE_1 > 0.
    assert conf.mean() > M.accuracy(correct)
    assert 0.01 < M.ece(conf, correct) <= M.ece(conf, correct, p=2) < 0.5


def test_real_outputs_selective_metrics_match_library(real_outputs):
    _, probs32, labels = real_outputs
    probs = probs32.astype(np.float64)
    conf, correct = M.top_label(probs, labels)
    scores = conf  # confidence-based rejection
    res = M.selective_metrics(scores, conf, correct)
    for j, beta in enumerate(M.DEFAULT_BETAS[::5]):  # 0.5, 0.75, 1.0
        keep = M.accept_mask(scores, beta)
        assert keep.sum() == math.ceil(round(beta * len(scores), 9))
        assert res["ece1"][5 * j] == pytest.approx(
            lib_ece(probs[keep], labels[keep], 1), abs=1e-12, rel=0
        )
        assert res["ece2"][5 * j] == pytest.approx(
            lib_ece(probs[keep], labels[keep], 2), abs=1e-12, rel=0
        )
    # Rejecting the least confident half raises accuracy.
    assert res["accuracy"][0] > res["accuracy"][-1] == M.accuracy(correct)


# --------------------------------------------------------------------------- by hand
def test_ece_by_hand_four_examples_two_bins():
    conf = np.array([0.9, 0.6, 0.8, 0.7])
    correct = np.array([1, 0, 0, 1])
    # sorted: 0.6(0) 0.7(1) | 0.8(0) 0.9(1); edge (0.7 + 0.8)/2 = 0.75, then 1.0
    # bin 0: mean conf 0.65, acc 0.5 -> |0.15|; bin 1: mean conf 0.85, acc 0.5 -> |0.35|
    # ECE_1 = 2/4 * 0.15 + 2/4 * 0.35 = 0.25
    # ECE_2 = sqrt(0.5 * 0.0225 + 0.5 * 0.1225) = sqrt(0.0725)
    assert M.ece(conf, correct, n_bins=2) == pytest.approx(0.25, abs=1e-15)
    assert M.ece(conf, correct, p=2, n_bins=2) == pytest.approx(math.sqrt(0.0725), abs=1e-15)
    # One bin: |mean conf 0.75 - acc 0.5| = 0.25 for every p.
    assert M.ece(conf, correct, n_bins=1) == pytest.approx(0.25, abs=1e-15)
    assert M.ece(conf, correct, p=2, n_bins=1) == pytest.approx(0.25, abs=1e-15)


def test_ece_by_hand_tied_bins_merge_and_weights():
    conf = np.array([0.6, 0.6, 0.9, 0.6, 0.6])
    correct = np.array([1, 1, 0, 0, 1])
    # sorted: 0.6 0.6 0.6 | 0.6 0.9 (array_split 5 -> 3 + 2); edge (0.6 + 0.6)/2 = 0.6
    # bins: (.., 0.6] holds all four 0.6s (acc 3/4), (0.6, 1.0] holds 0.9 (acc 0)
    # ECE_1 = 4/5 * |0.6 - 0.75| + 1/5 * |0.9 - 0| = 0.12 + 0.18 = 0.30
    # ECE_2 = sqrt(4/5 * 0.0225 + 1/5 * 0.81) = sqrt(0.18)
    # (The paper's printed formula, 1/|B| weights, would give (0.15 + 0.9)/2 = 0.525.)
    assert M.ece(conf, correct, n_bins=2) == pytest.approx(0.30, abs=1e-15)
    assert M.ece(conf, correct, p=2, n_bins=2) == pytest.approx(math.sqrt(0.18), abs=1e-15)


def test_ece_by_hand_uneven_split():
    conf = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    correct = np.array([0, 0, 1, 0, 1, 1, 1])
    # array_split 7 into 3: sizes 3, 2, 2 -> [.1 .2 .3] [.4 .5] [.6 .7]
    # bin 0: conf 0.2, acc 1/3 -> 2/15; bin 1: conf 0.45, acc 0.5 -> 0.05;
    # bin 2: conf 0.65, acc 1 -> 0.35
    # ECE_1 = 3/7 * 2/15 + 2/7 * 0.05 + 2/7 * 0.35 = (0.4 + 0.1 + 0.7) / 7 = 1.2 / 7
    assert M.ece(conf, correct, n_bins=3) == pytest.approx(1.2 / 7, abs=1e-15)


def test_ece_sorted_is_the_same_and_checks_order():
    rng = np.random.default_rng(4)
    conf = np.round(rng.random(301), 2)
    correct = (rng.random(301) < conf).astype(float)
    order = np.argsort(conf, kind="stable")
    for p in (1, 2):
        # ece() selects the bin boundaries without sorting: same bins, sums in another order
        assert M.ece_sorted(conf[order], correct[order], p=p) == pytest.approx(
            M.ece(conf, correct, p=p), rel=1e-13, abs=1e-15
        )
    with pytest.raises(ValueError, match="ascending"):
        M.ece_sorted([0.5, 0.4], [1, 0])


def test_ece_validation_and_empty():
    assert math.isnan(M.ece([], []))
    assert math.isnan(M.ece_sorted([], []))
    with pytest.raises(ValueError, match="confidence contains NaN"):
        M.ece([0.5, np.nan], [1, 0])
    with pytest.raises(ValueError, match=r"confidence must lie in \[0, 1\]"):
        M.ece([0.5, 1.2], [1, 0])
    with pytest.raises(ValueError, match="correct must be 0/1"):
        M.ece([0.5, 0.7], [1, 2])
    with pytest.raises(ValueError, match="correct contains NaN"):
        M.ece([0.5, 0.7], [1, np.nan])
    with pytest.raises(ValueError, match="same length"):
        M.ece([0.5, 0.7], [1])
    with pytest.raises(ValueError, match="confidence must be a 1-D"):
        M.ece([[0.5, 0.7]], [[1, 0]])
    with pytest.raises(ValueError, match="p must"):
        M.ece([0.5], [1], p=0.5)
    with pytest.raises(ValueError, match="n_bins"):
        M.ece([0.5], [1], n_bins=0)
    # booleans are accepted as correctness
    assert M.ece([0.8, 0.4], [True, False], n_bins=1) == pytest.approx(0.1, abs=1e-15)


def test_top_label_ties_and_validation():
    probs = np.array([[0.4, 0.4, 0.2], [0.1, 0.3, 0.6], [0.5, 0.25, 0.25]])
    conf, correct = M.top_label(probs, np.array([1, 2, 0]))
    np.testing.assert_array_equal(conf, [0.4, 0.6, 0.5])
    np.testing.assert_array_equal(correct, [0.0, 1.0, 1.0])  # row 0: argmax picks index 0
    assert conf.dtype == correct.dtype == np.float64
    with pytest.raises(ValueError, match="labels must lie"):
        M.top_label(probs, np.array([0, 3, 0]))
    with pytest.raises(ValueError, match="probs must have shape"):
        M.top_label(np.ones(3), np.array([0, 0, 0]))


def test_top_label_first_index_and_nan_on_large_inputs():
    # torch.max's reduction across threads must still pick the first of tied maxima
    rng = np.random.default_rng(3)
    for n, k in ((200_000, 3), (4, 50_000)):
        probs = rng.integers(0, 3, size=(n, k)).astype(np.float64)  # many ties per row
        labels = rng.integers(0, k, n)
        conf, correct = M.top_label(probs, labels)
        np.testing.assert_array_equal(conf, probs.max(1))
        np.testing.assert_array_equal(correct, (probs.argmax(1) == labels).astype(np.float64))
    probs = rng.random((1000, 4))
    probs.flags.writeable = False  # e.g. a memory map: read without a warning
    conf, _ = M.top_label(probs, np.zeros(1000, dtype=np.int64))
    np.testing.assert_array_equal(conf, probs.max(1))
    bad = probs.copy()
    bad[500, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        M.top_label(bad, np.zeros(1000, dtype=np.int64))
    conf, correct = M.top_label(np.empty((0, 3)), np.empty(0, dtype=np.int64))
    assert conf.shape == correct.shape == (0,)


def _bucketed_cases():
    rng = np.random.default_rng(17)
    b = B._BUCKETS
    yield "uniform", rng.random(5000), rng.random(5000) < 0.6
    # concentrated in a handful of buckets near 1, with many exact 1.0
    conf = np.concatenate([1 - rng.random(4000) * 3e-5, np.ones(3000), rng.random(300)])
    yield "near one", conf, rng.random(conf.size) < 0.9
    # values exactly on bucket boundaries j / 2**16, heavily tied
    conf = rng.integers(b // 2, b + 1, 6000) / b
    yield "bucket boundaries", conf, rng.random(6000) < 0.5
    # a tied run straddling every part boundary, and midpoints that land in empty buckets
    conf = np.repeat([0.1, 0.1 + 3 / b, 0.5, 0.75, 1.0], [1000, 1, 2000, 7, 1500])
    yield "runs", conf, rng.random(conf.size) < 0.3
    yield "all one", np.ones(100), rng.random(100) < 0.5
    yield "single", np.array([0.3]), np.array([1.0])
    yield "fewer than bins", np.array([0.2, 0.9, 0.2, 0.6]), np.array([0.0, 1.0, 1.0, 0.0])


@pytest.mark.parametrize("case", [c[0] for c in _bucketed_cases()])
@pytest.mark.parametrize("n_bins", [1, 15, 40])
def test_bucketed_bins_equal_sorted_bins(case, n_bins):
    _, conf, correct = next(c for c in _bucketed_cases() if c[0] == case)
    correct = correct.astype(np.float64)
    order = np.argsort(conf, kind="stable")
    expected = B.bin_stats(conf[order], correct[order], n_bins)
    got = B.bin_stats_bucketed(conf, correct, n_bins)
    np.testing.assert_array_equal(got[0], expected[0])
    for g, e in zip(got[1:], expected[1:]):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-13)


def test_ece_of_a_large_array_takes_the_bucketed_path_and_matches_library():
    rng = np.random.default_rng(23)
    n = B.BUCKETED_MIN_N + 1001
    probs, labels = make_probs(rng, n, 10)
    probs = np.round(probs, 4)  # ties across part boundaries
    probs[: n // 4] = np.eye(10)[labels[: n // 4]]  # a quarter exactly 1.0
    check_against_library(probs, labels)


def test_brier_and_accuracy():
    rng = np.random.default_rng(9)
    probs, labels = make_probs(rng, 777, 5)
    conf, correct = M.top_label(probs, labels)
    assert M.brier(conf, correct) == pytest.approx(
        cal_utils.eval_top_mse(conf, probs, labels), abs=1e-15
    )
    # by hand: ((0.9-1)^2 + (0.6-0)^2) / 2 = (0.01 + 0.36) / 2 = 0.185
    assert M.brier([0.9, 0.6], [1, 0]) == pytest.approx(0.185, abs=1e-15)
    assert M.accuracy([1, 0, 1, 1]) == 0.75
    assert M.accuracy(np.array([True, False])) == 0.5
    assert math.isnan(M.accuracy([])) and math.isnan(M.brier([], []))
    with pytest.raises(ValueError, match="correct must be 0/1"):
        M.accuracy([0.5])


def test_default_betas_and_metrics_table():
    np.testing.assert_array_equal(
        M.DEFAULT_BETAS, [0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0]
    )
    assert not M.DEFAULT_BETAS.flags.writeable
    assert M.DEFAULT_COLUMNS == ("ece1", "ece2", "brier", "accuracy", "coverage")
    paper = [M.METRICS[k] for k in M.DEFAULT_COLUMNS]
    assert [m.label for m in paper] == ["ECE₁", "ECE₂", "Brier", "Acc.", "Coverage"]
    assert [m.lower_is_better for m in paper] == [True, True, True, False, False]
    assert [m.marked for m in paper] == [True, True, True, True, False]


# --------------------------------------------------------------------------- thresholds
def test_thresholds_exact_counts_and_ties():
    scores = np.array([0.2, 0.5, 0.1, 0.2, 0.2])
    tau, guaranteed = M.thresholds(scores, [0.5, 1.0, 0.2])
    assert guaranteed is None
    # sorted 0.1 0.2 0.2 0.2 0.5, n = 5, k = ceil(beta n):
    # beta 0.5 -> k 3 -> tau 0.2 (two of the three 0.2s are accepted: coverage 0.6, not 0.8)
    # beta 1.0 -> k 5 -> 0.1;  beta 0.2 -> k 1 -> 0.5
    np.testing.assert_array_equal(tau, [0.2, 0.1, 0.5])
    res = M.selective_metrics(scores, np.full(5, 0.5), np.ones(5), [0.5, 1.0, 0.2])
    np.testing.assert_array_equal(res["coverage"], [0.6, 1.0, 0.2])
    mask = M.accept_mask(scores, 0.5)
    assert mask.sum() == 3 and mask[1] and (scores[mask] >= 0.2).all()
    assert (scores >= tau[0]).sum() == 4  # scores >= tau over-covers where scores tie
    np.testing.assert_array_equal(res["threshold"], tau)
    assert "guaranteed_coverage" not in res
    with pytest.raises(ValueError, match=r"betas must lie in \(0, 1\]"):
        M.thresholds(scores, [0.0])
    with pytest.raises(ValueError, match="scores must be finite"):
        M.thresholds([0.1, np.inf], [0.5])
    with pytest.raises(ValueError, match="at least one value"):
        M.thresholds([], [0.5])


def test_thresholds_hoeffding_margin():
    scores = np.random.default_rng(0).permutation(100).astype(float)  # 0, 1, ..., 99
    # eps = sqrt(log(2 / 0.1) / (2 * 100)) = sqrt(2.995732 / 200) = sqrt(0.0149787) = 0.1223874
    eps = 0.12238737
    with pytest.warns(RuntimeWarning, match=r"cannot be guaranteed at beta = \[0.9\]"):
        tau, guaranteed = M.thresholds(scores, [0.5, 0.8, 0.9], delta=0.1)
    # beta 0.5: need coverage >= 0.6224 -> 63 accepted -> tau = score 37, 0.63 - eps
    # beta 0.8: need >= 0.9224 -> 93 accepted -> tau = 7, 0.93 - eps
    # beta 0.9: need >= 1.0224 > 1 -> accept all, tau = 0, guaranteed 1 - eps < 0.9
    np.testing.assert_array_equal(tau, [37.0, 7.0, 0.0])
    np.testing.assert_allclose(guaranteed, [0.63 - eps, 0.93 - eps, 1.0 - eps], atol=1e-8)
    # Ties at the threshold no longer raise the achieved (and guaranteed) coverage.
    tied = np.repeat([0.0, 1.0, 2.0], [30, 40, 30])
    tau, guaranteed = M.thresholds(tied, [0.5], delta=0.1)
    # need >= 0.6224, i.e. 63 accepted: the 30 at score 2 and 33 of the 40 at score 1 ->
    # tau = 1, achieved coverage 0.63 (not 0.70), guaranteed 0.63 - eps
    np.testing.assert_array_equal(tau, [1.0])
    np.testing.assert_allclose(guaranteed, [0.63 - eps], atol=1e-8)
    assert M.accept_mask(tied, 0.5, delta=0.1).sum() == 63
    res = M.selective_metrics(scores, np.full(100, 0.7), np.ones(100), [0.5, 0.8], delta=0.1)
    np.testing.assert_allclose(res["guaranteed_coverage"], [0.63 - eps, 0.93 - eps], atol=1e-8)
    np.testing.assert_array_equal(res["coverage"], [0.63, 0.93])
    with pytest.raises(ValueError, match="delta"):
        M.thresholds(scores, [0.5], delta=0.0)


# --------------------------------------------------------------------------- selective
def naive_selective(scores, conf, correct, betas, n_bins=15, delta=None, seed=0):
    out = {k: [] for k in ("ece1", "ece2", "brier", "accuracy", "coverage", "threshold")}
    for beta in betas:
        keep = M.accept_mask(scores, beta, delta=delta, seed=seed)
        tau = scores[keep].min()
        out["ece1"].append(M.ece(conf[keep], correct[keep], p=1, n_bins=n_bins))
        out["ece2"].append(M.ece(conf[keep], correct[keep], p=2, n_bins=n_bins))
        out["brier"].append(M.brier(conf[keep], correct[keep]))
        out["accuracy"].append(M.accuracy(correct[keep]))
        out["coverage"].append(keep.mean())
        out["threshold"].append(tau)
    return {k: np.array(v) for k, v in out.items()}


@pytest.mark.parametrize(
    "n, n_bins, delta, seed",
    [(3, 15, None, 0), (40, 15, None, 1), (1003, 15, None, 0), (2500, 10, 0.05, 7)],
)
def test_selective_metrics_equal_naive_loop(n, n_bins, delta, seed):
    rng = np.random.default_rng(n)
    conf = np.round(rng.uniform(0.3, 1.0, n), 2)  # ties in the confidences
    correct = (rng.random(n) < conf).astype(np.float64)
    scores = np.round(rng.normal(size=n), 1)  # ties in the scores
    betas = M.DEFAULT_BETAS if delta is None else np.array([0.5, 0.7, 0.85])
    got = M.selective_metrics(scores, conf, correct, betas, n_bins=n_bins, delta=delta, seed=seed)
    want = naive_selective(scores, conf, correct, betas, n_bins, delta, seed)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)  # to the last bit
    np.testing.assert_array_equal(got["threshold"], M.thresholds(scores, betas, delta=delta)[0])
    k = M.accepted_counts(n, betas, delta=delta)[0]
    np.testing.assert_array_equal(got["coverage"], k / n)
    if delta is not None:
        assert (got["guaranteed_coverage"] >= betas).all()
    else:
        np.testing.assert_array_equal(k, np.ceil(np.round(betas * n, 9)))
    # and the library agrees on every subset
    for beta, e1 in zip(betas, got["ece1"]):
        keep = M.accept_mask(scores, beta, delta=delta, seed=seed)
        assert e1 == pytest.approx(
            lib_ece(conf[keep], correct[keep].astype(np.int64), 1, num_bins=n_bins),
            abs=1e-12,
            rel=0,
        )


def test_selective_metrics_validation():
    with pytest.raises(ValueError, match="scores must have the same length"):
        M.selective_metrics([0.1, 0.2], [0.5, 0.6, 0.7], [1, 0, 1])


# --------------------------------------------------------------------------- auc
def test_auc_constant_linear_and_hand():
    betas = M.DEFAULT_BETAS
    assert M.auc(betas, np.full(11, 0.3)) == pytest.approx(0.3, abs=1e-15)
    # linear 2 beta - 1 goes 0 -> 1 over [0.5, 1]: mean height 0.5 (trapezoid is exact)
    assert M.auc(betas, 2 * betas - 1) == pytest.approx(0.5, abs=1e-15)
    # hand: points (0, 0), (0.5, 1), (1, 0): a triangle of area 0.5 over a range of 1;
    # order of the points does not matter
    assert M.auc([1.0, 0.0, 0.5], [0.0, 0.0, 1.0]) == pytest.approx(0.5, abs=1e-15)
    # (0.5, 0.2), (0.75, 0.1), (1.0, 0.4): (0.25 * 0.15 + 0.25 * 0.25) / 0.5 = 0.2
    assert M.auc([0.5, 0.75, 1.0], [0.2, 0.1, 0.4]) == pytest.approx(0.2, abs=1e-15)
    assert math.isnan(M.auc([0.5, 1.0], [0.1, np.nan]))
    with pytest.raises(ValueError, match="distinct"):
        M.auc([0.5, 0.5], [0.1, 0.2])
    with pytest.raises(ValueError, match="at least two"):
        M.auc([0.5], [0.1])
