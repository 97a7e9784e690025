"""fd-shifts' risk–coverage statistics (selbench.measure.rcstats) against fd-shifts' own
definitions, re-derived here as direct loops over the examples (fd-shifts itself is not on
PyPI: its ``rc_stats_utils`` point loops and ``evaluate_auc`` are transcribed into slow
reference functions, and the partial areas are also checked by numerical quadrature)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.spatial import ConvexHull
from selbench.measure.metrics import METRICS
from selbench.measure.rcstats import (
    augrc_ba,
    aurc_achievable,
    aurc_ba,
    eaugrc,
    eaurc_achievable,
    partial_aurc,
    paurc,
)
from selbench.measure.riskcoverage import augrc
from sklearn.metrics import roc_auc_score, roc_curve


# --------------------------------------------------------------------------- slow references
def ref_points(confids, residuals, weights=None, labels=None, balanced=False):
    """fd-shifts' RC points (descending coverage, then the coverage-0 point): a walk by
    ascending confidence that adds a point where the confidence changes."""
    n = len(residuals)
    idx = np.argsort(confids, kind="stable")
    res, conf = residuals[idx].astype(float), confids[idx]
    if weights is not None:
        res = res * weights[idx]
    lab = labels[idx] if labels is not None else None
    classes = np.unique(labels) if labels is not None else None

    def risk_at(i):  # examples i..n-1 accepted
        if balanced:
            rates = []
            for c in classes:
                sel = lab[i:] == c
                rates.append(res[i:][sel].sum() / sel.sum() if sel.sum() else 0.0)
            return float(np.mean(rates))
        return float(res[i:].sum())

    covs, errs = [1.0], [risk_at(0)]
    for i in range(n - 1):
        if conf[i] != conf[i + 1]:
            covs.append((n - i - 1) / n)
            errs.append(risk_at(i + 1))
    return np.array(covs), np.array(errs)


def ref_nonlinear(covs, errsum, n, cov_min=0.0, cov_max=1.0):
    """fd-shifts' non-linear area, as a sum over segments between consecutive points of
    ``int E(k)/k dk`` (E linear in k), clipped to the range, by quadrature."""
    ks = np.concatenate(([0.0], (covs * n)[::-1]))  # ascending counts with 0
    es = np.concatenate(([0.0], errsum[::-1]))
    total = 0.0
    for j in range(1, len(ks)):
        lo, hi = max(ks[j - 1], cov_min * n), min(ks[j], cov_max * n)
        if hi <= lo:
            continue
        if j == 1:
            f = lambda k, j=j: es[j] / ks[j]
        else:
            f = lambda k, j=j: (es[j - 1] + (es[j] - es[j - 1]) * (k - ks[j - 1])
                                / (ks[j] - ks[j - 1])) / k
        total += quad(f, lo, hi, epsabs=1e-14, epsrel=1e-13)[0]
    return total / n


def ref_dominant(confids, residuals, n_points):
    """fd-shifts' dominant_point_mask for binary residuals (sklearn roc_curve + ConvexHull),
    in descending-coverage order over ``n_points`` RC points (the coverage-0 one included)."""
    if residuals.sum() in (0, len(residuals)):
        mask = np.zeros(n_points, dtype=bool)
        mask[0] = True
        return mask
    fpr, tpr, _ = roc_curve(1 - residuals, confids, drop_intermediate=False)
    if n_points == 2:
        return np.array([True, False])
    fpr, tpr = np.concatenate((fpr, [2.0])), np.concatenate((tpr, [-1.0]))
    v = ConvexHull(np.c_[fpr, tpr]).vertices
    v = v[(v != 0) & (v != n_points)]
    mask = np.zeros(n_points, dtype=bool)
    mask[v] = True
    return mask[::-1]


def draw(seed, n=400, tie_decimals=None, classes=5):
    rng = np.random.default_rng(seed)
    sc = rng.random(n)
    correct = (rng.random(n) < 0.35 + 0.6 * sc).astype(float)
    if tie_decimals is not None:
        sc = np.round(sc, tie_decimals)
    labels = rng.integers(0, classes, n)
    return sc, correct, labels


CASES = [(0, None), (1, 1), (2, 2), (3, None), (4, 1)]


# --------------------------------------------------------------------------- tests
@pytest.mark.parametrize("seed,ties", CASES)
def test_eaugrc_is_augrc_minus_the_perfect_ranking(seed, ties):
    sc, corr, _ = draw(seed, tie_decimals=ties)
    res = 1 - corr
    covs, errs = ref_points(sc, res)
    ref_augrc = -np.trapezoid(np.r_[errs / len(sc), 0.0], np.r_[covs, 0.0])
    pi = res.mean()
    assert eaugrc(sc, corr) == pytest.approx(ref_augrc - 0.5 * pi**2, abs=1e-12)
    # its closed form: pi (1 - pi) (1 - AUROC), ties counted one half
    closed = pi * (1 - pi) * (1 - roc_auc_score(corr, sc))
    assert eaugrc(sc, corr) == pytest.approx(closed, abs=1e-12)
    rows_sc, rows_c = np.stack([sc, sc[::-1]]), np.stack([corr, corr])
    np.testing.assert_allclose(eaugrc.batched(rows_sc, rows_c),
                               [eaugrc(sc, corr), eaugrc(sc[::-1], corr)], atol=1e-12)


@pytest.mark.parametrize("seed,ties", CASES)
def test_achievable_aurc_matches_fd_shifts(seed, ties):
    sc, corr, _ = draw(seed, tie_decimals=ties)
    res = 1 - corr
    covs, errs = ref_points(sc, res)
    covs0, errs0 = np.r_[covs, 0.0], np.r_[errs, errs[-1]]
    mask = ref_dominant(sc, res, len(covs0))
    n = len(sc)
    keep = mask[:-1]  # the coverage-0 point is never dominant
    want = ref_nonlinear(covs[keep], errs[keep], n)
    got = aurc_achievable(sc, corr)
    assert got == pytest.approx(want, abs=1e-12)
    # never above the AURC through every point with the same interpolation
    assert got <= ref_nonlinear(covs, errs, n) + 1e-12
    pi = res.mean()
    assert eaurc_achievable(sc, corr) == pytest.approx(
        want - (pi + (1 - pi) * math.log(1 - pi)), abs=1e-12)
    del covs0, errs0


def test_achievable_aurc_drops_dominated_points():
    # ROC points of correct, wrong, correct, wrong, ...: the middle ones lie under the hull
    sc = np.arange(8, 0, -1).astype(float)
    corr = np.array([1, 0, 1, 1, 0, 1, 0, 0], dtype=float)
    covs, errs = ref_points(sc, 1 - corr)
    full = ref_nonlinear(covs, errs, 8)
    got = aurc_achievable(sc, corr)
    assert got < full - 1e-3  # a variant keeping every point would give `full`
    mask = ref_dominant(sc, 1 - corr, len(covs) + 1)[:-1]
    assert got == pytest.approx(ref_nonlinear(covs[mask], errs[mask], 8), abs=1e-12)


def test_edge_cases_of_achievable_aurc():
    assert aurc_achievable([0.3, 0.2, 0.1], [1, 1, 1]) == 0.0
    assert aurc_achievable([0.3, 0.2, 0.1], [0, 0, 0]) == pytest.approx(1.0)
    assert aurc_achievable([0.5, 0.5, 0.5, 0.5], [1, 0, 1, 1]) == pytest.approx(0.25)
    assert math.isnan(aurc_achievable([], []))


@pytest.mark.parametrize("seed,ties", CASES)
@pytest.mark.parametrize("lo,hi", [(0.5, 1.0), (0.0, 1.0), (0.2, 0.7), (0.0, 0.3)])
def test_partial_aurc_is_the_integral_over_the_range(seed, ties, lo, hi):
    sc, corr, _ = draw(seed, tie_decimals=ties)
    covs, errs = ref_points(sc, 1 - corr)
    want = ref_nonlinear(covs, errs, len(sc), lo, hi)
    assert partial_aurc(sc, corr, lo, hi) == pytest.approx(want, abs=1e-12)
    if (lo, hi) == (0.5, 1.0):
        assert paurc(sc, corr) == pytest.approx(want, abs=1e-12)


def test_partial_aurc_inside_one_segment_and_additivity():
    # scores tied in two groups: the range [0.6, 0.9] lies inside the segment (0.5, 1.0],
    # where fd-shifts' code takes cov_max / c_hi as the fraction covered; the exact integral
    sc = np.array([1.0] * 5 + [0.0] * 5)
    corr = np.array([1, 1, 1, 1, 0, 1, 0, 0, 1, 0], dtype=float)
    f = lambda k: (1 + 3 * (k - 5) / 5) / k
    want = quad(f, 6, 9)[0] / 10
    assert partial_aurc(sc, corr, 0.6, 0.9) == pytest.approx(want, abs=1e-12)
    total = partial_aurc(sc, corr, 0.0, 1.0)
    parts = sum(partial_aurc(sc, corr, a, b) for a, b in ((0, 0.3), (0.3, 0.55), (0.55, 1)))
    assert parts == pytest.approx(total, abs=1e-12)
    assert partial_aurc(sc, corr, 0.7, 0.7) == 0.0
    with pytest.raises(ValueError, match="cov_max"):
        partial_aurc(sc, corr, 0.1, 1.5)


@pytest.mark.parametrize("seed,ties", CASES)
def test_balanced_areas_match_fd_shifts(seed, ties):
    sc, corr, labels = draw(seed, tie_decimals=ties)
    res = 1 - corr
    n = len(sc)
    covs, risks = ref_points(sc, res, labels=labels, balanced=True)
    want = -np.trapezoid(np.r_[risks, risks[-1]], np.r_[covs, 0.0])
    assert aurc_ba(sc, corr, labels) == pytest.approx(want, abs=1e-12)
    classes, counts = np.unique(labels, return_counts=True)
    w = np.array([n / (len(classes) * counts[np.searchsorted(classes, c)]) for c in labels])
    covs, errs = ref_points(sc, res, weights=w)
    want = -np.trapezoid(np.r_[errs / n, 0.0], np.r_[covs, 0.0])
    assert augrc_ba(sc, corr, labels) == pytest.approx(want, abs=1e-12)


def test_balanced_areas_equal_plain_ones_for_balanced_errors_and_differ_otherwise():
    sc, corr, _ = draw(7, n=300)
    one_class = np.zeros(300, dtype=int)
    assert augrc_ba(sc, corr, one_class) == pytest.approx(augrc(sc, corr), abs=1e-12)
    # a rare class with many errors weighs more in the balanced risk
    labels = (np.arange(300) < 30).astype(int)
    corr2 = corr.copy()
    corr2[:30] = 0.0
    assert augrc_ba(sc, corr2, labels) > augrc(sc, corr2) + 0.05
    with pytest.raises(ValueError, match="labels"):
        aurc_ba(sc, corr, labels[:10])


def test_registry_entries():
    for key in ("aurc_achievable", "eaugrc", "paurc", "aurc_ba", "augrc_ba"):
        info = METRICS[key]
        assert info.kind == "ranking" and info.lower_is_better and info.marked
    assert METRICS["signed_ce"].kind == "selective" and not METRICS["signed_ce"].marked
    for key in ("rg_coverage", "rg_risk", "rg_held", "rg_bound"):
        assert METRICS[key].needs == "risk_guarantee"
