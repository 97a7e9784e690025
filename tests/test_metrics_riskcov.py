"""selbench.measure.riskcoverage: the risk–coverage curve, AURC, E-AURC, AUGRC, coverage at risk,
risk at coverage.

References:

* fd-shifts' ``RiskCoverageStats`` (IML-DKFZ/fd-shifts, commit c4467ae) is not installable
  here: the reference below is an independent, deliberately slow implementation of its
  definition (one boolean mask per distinct score, trapezoids with its coverage-0 anchor),
  checked to 1e-12;
* the AUGRC identity ``pi^2/2 + pi(1-pi)(1 - AUROC)`` with sklearn's mid-rank AUROC, 1e-12;
* torch-uncertainty 0.13.0 (only in the perf extra; skipped without it), which breaks ties and
  normalises differently: compared on tie-free data through the exact conversion.

Real data: the CIFAR softmax outputs of ``../shared/data`` (max-prob scores, which hold many
ties), skipped where absent.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
from selbench.measure import riskcoverage as RC
from selbench.measure.riskcoverage import (
    augrc,
    aurc,
    coverage_at_risk,
    eaurc,
    risk_at_coverage,
    risk_coverage_curve,
)
from sklearn.metrics import roc_auc_score

TOL = 1e-12
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
REAL = [
    "netcal_cifar10_wideresnet-16-4.npz",
    "netcal_cifar100_wideresnet-16-4.npz",
    "netcal_cifar100_densenet-bc-100.npz",
]


# --------------------------------------------------------------------------- reference
def ref_curve(scores, correct, generalized=False):
    """One point per distinct score t: accept ``scores >= t`` (ties together)."""
    scores = np.asarray(scores, dtype=np.float64)
    wrong = 1.0 - np.asarray(correct, dtype=np.float64)
    n = len(scores)
    cov, risk = [], []
    for t in sorted(set(scores.tolist()), reverse=True):
        acc = scores >= t
        k, e = int(acc.sum()), float(wrong[acc].sum())
        cov.append(k / n)
        risk.append(e / (n if generalized else k))
    return np.array(cov), np.array(risk)


@functools.cache
def ref_curve_of(name: str, generalized: bool = False):
    """:func:`ref_curve` of a named data set, computed once (the real sets take ~0.2 s)."""
    return ref_curve(*dataset(name), generalized)


def trapezoid(points):
    return math.fsum((c1 - c0) * (r1 + r0) / 2 for (c0, r0), (c1, r1) in zip(points, points[1:]))


def ref_aurc(scores, correct, curve=None):
    cov, risk = ref_curve(scores, correct) if curve is None else curve
    return trapezoid([(0.0, risk[0]), *zip(cov, risk)])  # fd-shifts' anchor (0, r_1)


def ref_augrc(scores, correct, curve=None):
    cov, risk = ref_curve(scores, correct, generalized=True) if curve is None else curve
    return trapezoid([(0.0, 0.0), *zip(cov, risk)])  # anchor (0, 0)


def ref_eaurc(scores, correct, curve=None):
    err = 1.0 - float(np.mean(correct))  # fd-shifts' aurc_optimal for binary residuals
    return ref_aurc(scores, correct, curve) - (
        err + (1 - err) * np.log(1 - err + np.finfo(float).eps))


def broken_aurc(wrong_in_order):
    """AURC with ties broken: one point per example, in the given order (anchor kept)."""
    w = np.asarray(wrong_in_order, dtype=np.float64)
    k = np.arange(1, len(w) + 1)
    r = np.cumsum(w) / k
    return trapezoid([(0.0, r[0]), *zip(k / len(w), r)])


def broken_augrc(wrong_in_order):
    w = np.asarray(wrong_in_order, dtype=np.float64)
    n = len(w)
    return trapezoid([(0.0, 0.0), *zip(np.arange(1, n + 1) / n, np.cumsum(w) / n)])


# --------------------------------------------------------------------------- data
def synthetic(kind: str, n: int = 1500, seed: int = 0):
    rng = np.random.default_rng([seed, n, len(kind)])
    z = rng.normal(size=n)
    if kind == "tied":  # 7 levels: every level mixes correct and wrong
        z = rng.integers(0, 7, size=n).astype(np.float64)
    elif kind == "mixed":  # half continuous, half rounded to one decimal
        z[: n // 2] = np.round(z[: n // 2], 1)
    elif kind == "binary":
        z = (z > 0).astype(np.float64)
    correct = (rng.random(n) < 1 / (1 + np.exp(-1.5 * z / max(1.0, z.std())))).astype(np.float64)
    return z, correct


def real(name: str):
    path = DATA / name
    if not path.exists():
        pytest.skip(f"real model outputs not found at {path} (shared data folder absent)")
    with np.load(path) as d:
        probs, labels = d["predictions"], d["ground_truth"]
    return probs.max(1), (probs.argmax(1) == labels).astype(np.float64), probs, labels


DATASETS = ["tie-free", "tied", "mixed", "binary", *REAL]


def dataset(name: str):
    if name.endswith(".npz"):
        return real(name)[:2]
    return synthetic(name)


# --------------------------------------------------------------------------- vs the reference
@pytest.mark.parametrize("name", DATASETS)
def test_curve_matches_reference(name):
    s, c = dataset(name)
    for generalized in (False, True):
        cov, risk = risk_coverage_curve(s, c, generalized=generalized)
        rcov, rrisk = ref_curve_of(name, generalized)
        assert cov.dtype == risk.dtype == np.float64
        np.testing.assert_array_equal(cov, rcov)
        np.testing.assert_allclose(risk, rrisk, rtol=0, atol=TOL)
        assert np.all(np.diff(cov) > 0) and cov[-1] == 1.0
        assert len(cov) == len(np.unique(s))  # one point per distinct score


@pytest.mark.parametrize("name", DATASETS)
def test_areas_match_reference(name):
    s, c = dataset(name)
    curve, gcurve = ref_curve_of(name), ref_curve_of(name, True)
    assert abs(aurc(s, c) - ref_aurc(s, c, curve)) <= TOL
    assert abs(augrc(s, c) - ref_augrc(s, c, gcurve)) <= TOL
    assert abs(eaurc(s, c) - ref_eaurc(s, c, curve)) <= TOL
    # the areas are fd-shifts' trapezoids of the returned curve with its coverage-0 anchor
    cov, risk = risk_coverage_curve(s, c)
    assert abs(aurc(s, c) - (cov[0] * risk[0] + np.trapezoid(risk, cov))) <= TOL
    gcov, grisk = risk_coverage_curve(s, c, generalized=True)
    assert abs(augrc(s, c) - np.trapezoid(np.r_[0.0, grisk], np.r_[0.0, gcov])) <= TOL


@pytest.mark.parametrize("name", DATASETS)
def test_augrc_auroc_identity(name):
    s, c = dataset(name)
    pi = 1.0 - float(np.mean(c))
    auroc = roc_auc_score(c, s)  # mid-rank ties
    assert abs(augrc(s, c) - (pi**2 / 2 + pi * (1 - pi) * (1 - auroc))) <= TOL


def test_augrc_identity_many_small_tied_draws():
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(2, 30))
        s = rng.integers(0, int(rng.integers(1, 6)), size=n).astype(np.float64)
        c = (rng.random(n) < rng.random()).astype(np.float64)
        pi = 1.0 - c.mean()
        if 0 < pi < 1:
            expected = pi**2 / 2 + pi * (1 - pi) * (1 - roc_auc_score(c, s))
        else:
            expected = pi**2 / 2
        assert abs(augrc(s, c) - expected) <= TOL
        assert abs(aurc(s, c) - ref_aurc(s, c)) <= TOL
        assert abs(augrc(s, c) - ref_augrc(s, c)) <= TOL


def test_aurc_has_no_auroc_closed_form():
    # same error rate (1/2) and AUROC (1/2), different AURC: C W W C vs W C C W
    s = np.array([4.0, 3.0, 2.0, 1.0])
    a, b = np.array([1, 0, 0, 1.0]), np.array([0, 1, 1, 0.0])
    assert roc_auc_score(a, s) == roc_auc_score(b, s) == 0.5
    assert aurc(s, a) == pytest.approx(17 / 48, abs=TOL)
    assert aurc(s, b) == pytest.approx(31 / 48, abs=TOL)
    assert augrc(s, a) == augrc(s, b) == 0.25


# --------------------------------------------------------------------------- ties are merged
@pytest.mark.parametrize("name", ["tied", "binary", REAL[0]])
def test_ties_merged_not_broken(name):
    """A tie-breaking implementation would fail these: the optimistic (correct first) and
    pessimistic (wrong first) orders inside the tied groups give other areas."""
    s, c = dataset(name)
    assert len(np.unique(s)) < len(s)
    wrong = 1.0 - c
    optimistic = np.lexsort((wrong, -s))  # by score desc, correct first inside a tie
    pessimistic = np.lexsort((-wrong, -s))
    a, g = aurc(s, c), augrc(s, c)
    for order in (optimistic, pessimistic):
        assert abs(a - broken_aurc(wrong[order])) > 1e-4
        assert abs(g - broken_augrc(wrong[order])) > 1e-5
    # merged lies between the two extremes (for the AUGRC: exactly halfway, the average
    # over the orders inside every tie), and equals the reference
    assert broken_aurc(wrong[optimistic]) < a < broken_aurc(wrong[pessimistic])
    assert abs(g - (broken_augrc(wrong[optimistic]) + broken_augrc(wrong[pessimistic])) / 2) <= TOL
    assert abs(a - ref_aurc(s, c, ref_curve_of(name))) <= TOL


def test_ties_result_independent_of_input_order():
    s, c = synthetic("tied")
    perm = np.random.default_rng(3).permutation(len(s))
    for f in (aurc, augrc, eaurc):
        assert f(s[perm], c[perm]) == f(s, c)
    for x in (0.1, 0.3, 0.5):
        assert coverage_at_risk(s[perm], c[perm], x) == coverage_at_risk(s, c, x)
        assert risk_at_coverage(s[perm], c[perm], x) == risk_at_coverage(s, c, x)


def test_tied_small_example_by_hand():
    # scores 2, 1, 1, 1, 0: the top one correct, the three tied at 1 hold two errors, the
    # last one wrong
    s = [2.0, 1.0, 1.0, 1.0, 0.0]
    c = [1, 1, 0, 0, 0]
    cov, risk = risk_coverage_curve(s, c)
    np.testing.assert_allclose(cov, [0.2, 0.8, 1.0], rtol=0, atol=TOL)
    np.testing.assert_allclose(risk, [0.0, 0.5, 0.6], rtol=0, atol=TOL)
    # 0.2 * 0 + 0.6 * (0 + 0.5) / 2 + 0.2 * (0.5 + 0.6) / 2
    assert aurc(s, c) == pytest.approx(0.26, abs=TOL)
    # generalized risks 0, 0.4, 0.6; = 0.6^2 / 2 + 0.6 * 0.4 * (1 - 5/6)
    assert augrc(s, c) == pytest.approx(0.22, abs=TOL)
    # never splits the tie (a tie-broken order, correct first, would reach 0.4 at risk 0)
    assert coverage_at_risk(s, c, 0.4) == 0.2
    assert coverage_at_risk(s, c, 0.5) == 0.8
    assert risk_at_coverage(s, c, 0.4) == 0.5  # the point at 0.8 covers 0.4
    assert risk_at_coverage(s, c, 0.0) == 0.0  # the top tied group


def test_signed_zero_is_one_tie():
    s = np.array([0.0, -0.0, 1.0])
    cov, _ = risk_coverage_curve(s, [1, 0, 1])
    np.testing.assert_array_equal(cov, [1 / 3, 1.0])


# --------------------------------------------------------------------------- working points
@pytest.mark.parametrize("name", ["tie-free", "tied", "mixed", REAL[1]])
def test_coverage_at_risk_and_risk_at_coverage_match_reference(name):
    s, c = dataset(name)
    cov, risk = ref_curve_of(name)
    for x in [0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.9, 1.0, float(risk[len(risk) // 2])]:
        ok = risk <= x
        assert coverage_at_risk(s, c, x) == (cov[ok].max() if ok.any() else 0.0)
    for x in [0.0, 0.05, 0.5, 0.7, 0.8, 0.95, 1.0, float(cov[len(cov) // 3])]:
        j = int(np.flatnonzero(cov >= x)[0])
        assert risk_at_coverage(s, c, x) == risk[j]


def test_coverage_at_risk_is_largest_not_first_crossing():
    # risks by coverage: 0 (1/4), 1/2, 2/3, 1/2 (4/4): <= 0.5 at 1/4, 2/4 and 4/4
    s, c = [4, 3, 2, 1], [1, 0, 0, 1]
    assert coverage_at_risk(s, c, 0.5) == 1.0
    assert coverage_at_risk(s, c, 0.49) == 0.25
    assert coverage_at_risk([1, 2], [0, 0], 0.5) == 0.0  # nothing qualifies


def test_risk_at_coverage_smallest_point_not_lowest_risk():
    # fd-shifts' get_working_point(target_cov=0.5) would return the running minimum 0.5 at
    # coverage 1; this convention returns the risk at the smallest qualifying point (2/4)
    s, c = [4, 3, 2, 1], [0, 0, 1, 1]
    assert risk_at_coverage(s, c, 0.5) == 1.0
    assert risk_at_coverage(s, c, 0.7) == pytest.approx(2 / 3)
    # 55 / 100 == 0.55 exactly as floats: k = 55, although 100 * 0.55 = 55.00000000000001
    s100, c100 = np.arange(100.0)[::-1], np.r_[np.ones(55), np.zeros(45)]
    assert risk_at_coverage(s100, c100, 0.55) == 0.0


# --------------------------------------------------------------------------- edge cases
def test_all_correct_all_wrong():
    s = np.random.default_rng(1).normal(size=50)
    one, zero = np.ones(50), np.zeros(50)
    assert aurc(s, one) == augrc(s, one) == eaurc(s, one) == 0.0
    assert aurc(s, zero) == 1.0 and augrc(s, zero) == 0.5 and eaurc(s, zero) == 0.0
    assert coverage_at_risk(s, one, 0.0) == 1.0 and coverage_at_risk(s, zero, 0.99) == 0.0
    assert coverage_at_risk(s, zero, 1.0) == 1.0
    assert risk_at_coverage(s, one, 0.3) == 0.0 and risk_at_coverage(s, zero, 0.3) == 1.0


def test_all_scores_tied():
    c = np.array([1, 0, 1, 1, 0, 1, 1, 1.0])
    s = np.full(8, 0.7)
    pi = 0.25
    cov, risk = risk_coverage_curve(s, c)
    assert cov.tolist() == [1.0] and risk.tolist() == [pi]
    assert risk_coverage_curve(s, c, generalized=True)[1].tolist() == [pi]
    assert aurc(s, c) == pi
    assert augrc(s, c) == pi / 2
    assert eaurc(s, c) == pytest.approx(-(1 - pi) * math.log(1 - pi), abs=TOL)
    assert coverage_at_risk(s, c, 0.25) == 1.0 and coverage_at_risk(s, c, 0.2) == 0.0
    assert risk_at_coverage(s, c, 0.1) == pi


def test_n_one_and_n_zero():
    assert aurc([0.3], [1]) == 0.0 and aurc([0.3], [0]) == 1.0
    assert augrc([0.3], [1]) == 0.0 and augrc([0.3], [0]) == 0.5
    assert eaurc([0.3], [0]) == 0.0 and eaurc([0.3], [1]) == 0.0
    assert risk_coverage_curve([0.3], [0])[1].tolist() == [1.0]
    for f in (aurc, augrc, eaurc):
        assert math.isnan(f([], []))
    assert math.isnan(coverage_at_risk([], [], 0.1))
    assert math.isnan(risk_at_coverage([], [], 0.1))
    cov, risk = risk_coverage_curve([], [])
    assert cov.shape == risk.shape == (0,) and cov.dtype == np.float64


def test_eaurc_perfect_ranking_small_n_is_slightly_negative():
    # finite-N trapezoid (1/8) minus the continuous oracle 1/2 + 1/2 ln(1/2)
    assert eaurc([2.0, 1.0], [1, 0]) == pytest.approx(0.125 - (0.5 + 0.5 * math.log(0.5)), abs=TOL)
    s, c = synthetic("tie-free", n=4000)
    perfect = c + 1e-3 * s  # every correct above every wrong
    assert abs(eaurc(perfect, c)) < 2e-3


def test_large_scores_and_input_types():
    s = np.array([1e308, -1e308, 5e-324, -5e-324, 1e300, -1e300])
    c = np.array([True, False, True, False, True, False])
    ranks = np.argsort(np.argsort(s)).astype(np.float64)  # the same order, small values
    assert abs(aurc(s, c) - ref_aurc(s, c)) <= TOL
    assert aurc(s, c) == aurc(ranks, c) and eaurc(s, c) == eaurc(ranks, c)
    assert augrc(s, c) == 0.125  # perfect ranking: pi^2 / 2
    assert aurc(s, c.astype(int)) == aurc(s.tolist(), c.tolist())


def test_validation():
    with pytest.raises(ValueError, match="scores contains NaN"):
        aurc([0.1, float("nan")], [1, 0])
    with pytest.raises(ValueError, match="scores must be finite"):
        augrc([0.1, float("inf")], [1, 0])
    with pytest.raises(ValueError, match="same length as scores"):
        eaurc([0.1, 0.2], [1])
    with pytest.raises(ValueError, match="0/1"):
        risk_coverage_curve([0.1, 0.2], [1, 0.5])
    with pytest.raises(ValueError, match="1-D"):
        aurc([[0.1]], [[1]])
    for bad in (-0.1, 1.5, float("nan"), True, "0.1", None):
        with pytest.raises(ValueError, match="risk"):
            coverage_at_risk([0.1], [1], bad)
        with pytest.raises(ValueError, match="coverage"):
            risk_at_coverage([0.1], [1], bad)
    assert coverage_at_risk([0.1], [1], np.float32(0.5)) == 1.0
    assert risk_at_coverage([0.1], [1], 1) == 0.0


# --------------------------------------------------------------------------- all rows at once
AREAS = {"aurc": aurc, "eaurc": eaurc, "augrc": augrc}


def row_cases():
    """``[R, m]`` scores and correctness: one resample (or evaluation set) per row."""
    g = np.random.default_rng(2024)

    def coins(shape, p=0.7):
        return (g.random(shape) < p).astype(np.float64)

    n = 500
    base, right = g.normal(size=n), coins(n)
    idx = g.integers(0, n, (40, n))  # bootstrap resamples: duplicates always tie
    cases = {
        "resampled": (base[idx], right[idx]),
        "random": (g.random((30, 64)), coins((30, 64))),
        "few distinct": (g.integers(0, 3, (40, 80)).astype(np.float64), coins((40, 80))),
        "two distinct": (g.integers(0, 2, (40, 9)) * 0.25 + 0.5, coins((40, 9))),
        "constant rows": (np.repeat(g.random((25, 1)), 30, axis=1), coins((25, 30))),
        "all tied": (np.full((12, 40), 0.7), coins((12, 40))),
        "all correct": (g.random((10, 50)), np.ones((10, 50))),
        "all wrong": (g.random((10, 50)), np.zeros((10, 50))),
        "rows all right, all wrong, mixed": (
            g.random((3, 20)), np.stack([np.ones(20), np.zeros(20), coins(20)])),
        "m = 1": (g.integers(0, 3, (30, 1)).astype(np.float64), coins((30, 1), 0.5)),
        "m = 2": (g.integers(0, 2, (60, 2)).astype(np.float64), coins((60, 2), 0.5)),
        "signed zeros": (g.choice([-0.0, 0.0, 1e-300, -1e-300, 0.5], (30, 12)), coins((30, 12))),
        "negative": (-g.random((20, 70)), coins((20, 70))),
        "mixed signs, narrow": (g.random((20, 70)) - 0.5, coins((20, 70))),
        # magnitudes above 2 on both sides: the sign-flipped bits do not pack
        "mixed signs, wide": (g.normal(size=(20, 70)) * 100, coins((20, 70))),
        # magnitudes across 1000+ binades and both signs: the argsort fallback
        "mixed signs, extreme": (g.choice([-1e300, -3.0, -1e-300, 0.0, 1e-300, 2.5, 1e300],
                                          (20, 30)), coins((20, 30))),
        # neighbouring floats: keys spanning < 2**31, packed into uint32
        "adjacent floats": (0.5 + g.integers(0, 7, (30, 40)) * 2.0**-53, coins((30, 40))),
        "large": (g.random((3, 70_000)).round(3), coins((3, 70_000))),  # several blocks
    }
    return cases


ROW_CASES = row_cases()


@pytest.fixture
def fresh_memo():
    """No remembered result before or after the test."""
    RC._memo.last = None
    yield
    RC._memo.last = None


@pytest.mark.parametrize("name", list(ROW_CASES))
def test_batched_equals_the_scalar_functions_row_by_row(name, fresh_memo):
    s, c = ROW_CASES[name]
    for key, f in AREAS.items():
        RC._memo.last = None  # each computed afresh here (the memo is tested below)
        got = f.batched(s, c)
        assert got.dtype == np.float64 and got.shape == (s.shape[0],)
        want = np.array([f(s[r], c[r]) for r in range(s.shape[0])])
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL, err_msg=key)


def test_batched_cases_take_every_path_of_the_keys():
    def span(name):
        found = RC._int_keys(ROW_CASES[name][0])
        return None if found is None else found[2] - found[1]

    assert span("all tied") == 0 and span("adjacent floats") < 2**31  # uint32
    assert 2**31 <= span("random") < 2**63 and 2**31 <= span("negative") < 2**63
    s = ROW_CASES["mixed signs, wide"][0]
    assert s.min() < -2 and s.max() > 2 and span("mixed signs, wide") < 2**63  # from d
    assert span("mixed signs, extreme") is None  # argsort


@pytest.mark.parametrize("name", ["signed zeros", "mixed signs, wide", "mixed signs, extreme",
                                  "negative", "adjacent floats", "few distinct"])
def test_int_keys_are_in_the_order_of_the_scores(name):
    s = ROW_CASES[name][0][:4]
    found = RC._int_keys(s)
    if found is None:
        return
    keys, lo, hi = found
    assert keys.min() == lo and keys.max() == hi
    for row, krow in zip(s, keys):
        a, b = np.meshgrid(row, row)
        ka, kb = np.meshgrid(krow, krow)
        np.testing.assert_array_equal(ka < kb, a < b)
        np.testing.assert_array_equal(ka == kb, a == b)  # -0.0 == 0.0


def test_batched_edge_shapes(fresh_memo):
    for f in AREAS.values():
        assert f.batched(np.empty((0, 5)), np.empty((0, 5))).shape == (0,)
        assert np.isnan(f.batched(np.empty((3, 0)), np.empty((3, 0)))).all()
        # lists, float32 scores and boolean correctness convert as in the scalar functions
        s32 = np.array([[0.3, 0.1, 0.3], [0.2, 0.2, 0.9]], dtype=np.float32)
        c = np.array([[True, False, False], [False, True, True]])
        want = [f(s32[r], c[r]) for r in range(2)]
        np.testing.assert_allclose(f.batched(s32, c), want, rtol=0, atol=TOL)
        np.testing.assert_allclose(f.batched(s32.tolist(), c.tolist()), want, rtol=0, atol=TOL)


def test_batched_validation(fresh_memo):
    s, c = np.array([[0.1, 0.2], [0.3, 0.4]]), np.array([[1.0, 0.0], [0.0, 1.0]])
    for f in AREAS.values():
        bad = s.copy()
        bad[1, 0] = np.nan
        with pytest.raises(ValueError, match=r"scores contains NaN at index \[1, 0\]"):
            f.batched(bad, c)
        bad[1, 0] = -np.inf
        with pytest.raises(ValueError, match=r"scores must be finite; scores\[1, 0\]"):
            f.batched(bad, c)
        bad = c.copy()
        bad[0, 1] = 0.5
        with pytest.raises(ValueError, match=r"0/1.*correct\[0, 1\] = 0.5"):
            f.batched(s, bad)
        with pytest.raises(ValueError, match="same shape"):
            f.batched(s, c[:, :1])
        with pytest.raises(ValueError, match="2-D"):
            f.batched(s[0], c[0])
        with pytest.raises(ValueError, match="2-D"):
            f.batched(s, "x")


def test_the_three_areas_share_one_sort(fresh_memo, monkeypatch):
    calls = []
    sort = RC._sorted_rows
    monkeypatch.setattr(RC, "_sorted_rows", lambda *a: calls.append(1) or sort(*a))
    s, c = ROW_CASES["resampled"]
    blocks = -(-s.shape[0] // (RC._BLOCK_ENTRIES // s.shape[1]))
    got = {key: f.batched(s.copy(), c.copy()) for key, f in AREAS.items()}  # fresh arrays
    assert len(calls) == blocks  # one computation for the three
    for key, f in AREAS.items():
        np.testing.assert_allclose(got[key], [f(a, b) for a, b in zip(s, c)], rtol=0, atol=TOL)
    # the result rows are copies: changing one changes nothing remembered
    got["aurc"][:] = -1.0
    assert (aurc.batched(s, c) >= 0).all() and len(calls) == blocks


def test_memo_is_keyed_by_content_not_identity(fresh_memo, monkeypatch):
    calls = []
    sort = RC._sorted_rows
    monkeypatch.setattr(RC, "_sorted_rows", lambda *a: calls.append(1) or sort(*a))
    s, c = (x.copy() for x in ROW_CASES["few distinct"])
    first = augrc.batched(s, c)
    assert len(calls) == 1
    s[0, :] = np.arange(s.shape[1])  # the same array, changed in place
    changed = augrc.batched(s, c)
    assert len(calls) == 2
    assert changed[0] != first[0] and np.array_equal(changed[1:], first[1:])
    assert changed[0] == pytest.approx(augrc(s[0], c[0]), abs=TOL)
    c[1, :] = 1.0 - c[1, :]  # correctness alone changed
    assert eaurc.batched(s, c)[1] == pytest.approx(eaurc(s[1], c[1]), abs=TOL)
    assert len(calls) == 3
    assert aurc.batched(s.copy(), c.astype(bool))[1] == pytest.approx(aurc(s[1], c[1]), abs=TOL)
    assert len(calls) == 3  # equal content (booleans == 0/1): remembered
    # equal content but a different shape is another input
    aurc.batched(s.reshape(2, -1), c.reshape(2, -1))
    assert len(calls) == 4
    # inputs too large to remember are computed each time
    monkeypatch.setattr(RC, "_MEMO_ENTRIES", s.size - 1)
    aurc.batched(s, c)
    aurc.batched(s, c)
    assert len(calls) == 6 and RC._memo.last is None


def test_memo_is_per_thread(fresh_memo):
    from concurrent.futures import ThreadPoolExecutor

    names = ["resampled", "few distinct", "mixed signs, wide", "all tied"]
    want = {n: {k: [f(a, b) for a, b in zip(*ROW_CASES[n])] for k, f in AREAS.items()}
            for n in names}

    def work(i):
        name = names[i % len(names)]
        s, c = ROW_CASES[name]
        for key, f in AREAS.items():
            np.testing.assert_allclose(f.batched(s, c), want[name][key], rtol=0, atol=TOL)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(32)))


def test_batched_on_real_resamples():
    s, c = dataset(REAL[1])
    idx = np.random.default_rng(5).integers(0, len(s), (4, len(s)))
    for f in AREAS.values():
        RC._memo.last = None
        want = [f(s[r], c[r]) for r in idx]
        np.testing.assert_allclose(f.batched(s[idx], c[idx]), want, rtol=0, atol=TOL)


def _plain(f):
    return lambda s, y: f(s, y)  # the scalar function, without its batched form


@pytest.mark.parametrize("kind", ["random", "tied_scores", "all_wrong", "constant"])
@pytest.mark.parametrize("selects", [True, False])
def test_selective_intervals_with_batched_areas_equal_plain_callables(kind, selects):
    """selective_intervals with aurc/eaurc/augrc (their ``batched`` forms, one shared sort)
    equals it with plain per-resample callables, and with its per-resample loop."""
    from selbench.measure import bootstrap as BS

    g = np.random.default_rng([len(kind), 3])
    n = 240
    conf = g.uniform(0.3, 1.0, n)
    scores = {"random": conf + g.normal(0.0, 0.1, n), "tied_scores": g.integers(0, 3, n) * 1.0,
              "all_wrong": g.normal(size=n) * 50, "constant": np.full(n, 2.0)}[kind]
    correct = np.zeros(n) if kind == "all_wrong" else (g.random(n) < conf).astype(np.float64)
    plain = {key: _plain(f) for key, f in AREAS.items()}
    assert all(not hasattr(fn, "batched") for fn in plain.values())
    kw = dict(n_resamples=25, level=0.9, seed=3, delta=None, selects=selects, extra={})
    areas = BS.IntervalRequest([0.5, 0.8, 1.0], ranking=AREAS, **kw)
    runs = [BS._selective_intervals(scores, conf, correct, areas),
            BS._selective_intervals(scores, conf, correct, areas,
                                    batch=7),  # several batches: several inputs
            BS._selective_intervals(scores, conf, correct,
                                    BS.IntervalRequest([0.5, 0.8, 1.0], ranking=plain, **kw)),
            BS._selective_intervals(scores, conf, correct, areas,
                                    slow=True)]  # calls aurc, ... on every resample
    (fast, dist), others = runs[0], runs[1:]
    for out, d in others:
        np.testing.assert_allclose(dist, d, rtol=0, atol=TOL)
        for key in AREAS:
            assert out[key]["low"] == pytest.approx(fast[key]["low"], abs=TOL)
            assert out[key]["high"] == pytest.approx(fast[key]["high"], abs=TOL)


def test_selective_intervals_with_batched_areas_one_example():
    from selbench.measure.bootstrap import selective_intervals

    out = selective_intervals([0.3], [0.9], [0.0], [0.5, 1.0], n_resamples=10, ranking=AREAS)
    assert out["aurc"] == {"low": 1.0, "high": 1.0}
    assert out["augrc"] == {"low": 0.5, "high": 0.5}
    assert out["eaurc"] == {"low": 0.0, "high": 0.0}


# --------------------------------------------------------------------------- torch-uncertainty
@pytest.fixture
def tu():
    """torch-uncertainty's metrics, torch's default dtype at float64 (its coverages
    ``arange(1, N + 1) / N`` and 0/1 errors take the default dtype: float32 otherwise)."""
    pytest.importorskip("torch_uncertainty")
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch_uncertainty.metrics.classification import AUGRC, AURC, CovAtxRisk, RiskAtxCov
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield {"AURC": AURC, "AUGRC": AUGRC, "CovAtxRisk": CovAtxRisk, "RiskAtxCov": RiskAtxCov}
    finally:
        torch.set_default_dtype(old)


def tu_inputs(scores, correct):
    """Binary probabilities whose max is the score (scores in (0.5, 1)) and whose argmax,
    class 1, is right exactly where ``correct``."""
    import torch

    p1 = np.asarray(scores, dtype=np.float64)
    assert np.all((p1 > 0.5) & (p1 < 1.0))
    probs = torch.from_numpy(np.stack([1.0 - p1, p1], axis=1))
    return probs, torch.from_numpy(np.asarray(correct).astype(np.int64))


def tu_value(metric, scores, correct):
    m = metric
    m.update(*tu_inputs(scores, correct))
    return float(m.compute())


def tie_free(n, seed):
    rng = np.random.default_rng([seed, n])
    s = 0.5 + 0.5 * rng.permutation(np.arange(1, n + 1)) / (n + 1)  # distinct, in (0.5, 1)
    c = (rng.random(n) < 2 * s - 0.6).astype(np.float64)
    return s, c


@pytest.mark.parametrize("n", [2, 3, 10, 1000])
def test_torch_uncertainty_areas_on_tie_free_data(tu, n):
    for seed in range(3):
        s, c = tie_free(n, seed)
        top_err = 1.0 - c[np.argmax(s)]  # r_1 = e_1 of the top example
        ours_a = (aurc(s, c) - top_err / n) / (1 - 1 / n)
        ours_g = (augrc(s, c) - top_err / (2 * n * n)) / (1 - 1 / n)
        assert abs(tu_value(tu["AURC"](), s, c) - ours_a) <= TOL
        assert abs(tu_value(tu["AUGRC"](), s, c) - ours_g) <= TOL


def test_torch_uncertainty_working_points_on_tie_free_data(tu):
    s, c = tie_free(1000, 5)
    _, risk = ref_curve(s, c)
    levels = [0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, float(risk[200]), float(risk[-1])]
    for x in levels:
        theirs = tu_value(tu["CovAtxRisk"](x), s, c)
        ours = coverage_at_risk(s, c, x)
        assert ours == (0.0 if math.isnan(theirs) else theirs)
    for x in [0.05, 0.25, 0.5, 0.8, 0.95, 1.0, 0.123]:
        assert math.ceil(1000 * x) / 1000 >= x  # N * x rounds to the same k here
        assert tu_value(tu["RiskAtxCov"](x), s, c) == risk_at_coverage(s, c, x)


def test_torch_uncertainty_conventions_differ(tu):
    # nothing qualifies: nan there, 0.0 here
    s, c = np.array([0.9, 0.8]), np.array([0, 0])
    assert math.isnan(tu_value(tu["CovAtxRisk"](0.5), s, c))
    assert coverage_at_risk(s, c, 0.5) == 0.0
    # ceil(100 * 0.55) = ceil(55.00000000000001) = 56 there; the point at coverage 55/100 here
    s = 0.5 + np.arange(100, 0, -1) / 202
    c = np.r_[np.ones(55), np.zeros(45)]
    assert tu_value(tu["RiskAtxCov"](0.55), s, c) == pytest.approx(1 / 56, abs=TOL)
    assert risk_at_coverage(s, c, 0.55) == 0.0
    # coverage 0: index -1 wraps to the full-coverage risk there; the top example here
    assert tu_value(tu["RiskAtxCov"](0.0), s, c) == pytest.approx(0.45, abs=TOL)
    assert risk_at_coverage(s, c, 0.0) == 0.0


def test_torch_uncertainty_breaks_ties(tu):
    rng = np.random.default_rng(11)
    s = 0.5 + rng.integers(1, 6, size=400) / 12  # 5 tied levels in (0.5, 1)
    c = (rng.random(400) < 0.7).astype(np.float64)
    probs, _ = tu_inputs(s, c)
    order = probs.max(-1).values.argsort(descending=True).numpy()  # its own order
    w = (1.0 - c)[order]
    n = len(s)
    theirs = tu_value(tu["AURC"](), s, c)
    assert abs(theirs - (broken_aurc(w) - w[0] / n) / (1 - 1 / n)) <= TOL  # one point per example
    ours = (aurc(s, c) - (1.0 - c[order[0]]) / n) / (1 - 1 / n)
    assert abs(theirs - ours) > 1e-4  # so on tied data the values differ
    theirs_g = tu_value(tu["AUGRC"](), s, c)
    assert abs(theirs_g - (broken_augrc(w) - w[0] / (2 * n * n)) / (1 - 1 / n)) <= TOL


def test_torch_uncertainty_real_probabilities_between_tie_orders(tu):
    """On real outputs (max-prob ties, e.g. at 1.0), torch-uncertainty's AUGRC is that of
    one tie-broken order: between the optimistic and pessimistic orders, while the merged
    AUGRC is exactly their midpoint (the average over the orders inside every tie)."""
    import torch

    s, c, probs, labels = real(REAL[0])
    m = tu["AUGRC"]()
    m.update(torch.from_numpy(probs.astype(np.float64)), torch.from_numpy(labels))
    n = len(s)
    unnormalised = float(m.compute()) * (1 - 1 / n)  # = broken - e_1 / (2 N^2)
    wrong = 1.0 - c
    lo = broken_augrc(wrong[np.lexsort((wrong, -s))])
    hi = broken_augrc(wrong[np.lexsort((-wrong, -s))])
    assert lo - 1 / (2 * n * n) <= unnormalised <= hi
    assert abs(augrc(s, c) - (lo + hi) / 2) <= TOL
