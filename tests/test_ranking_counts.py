"""The ranking metrics from one merged-tie curve (``fn.from_counts``), issue 28: the point
metrics of a cell and every bootstrap resample share one curve instead of a sort per metric,
and the achievable AURC's hull runs on the candidate points only. Each is checked against
the plain computation it replaces."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial import ConvexHull
from selbench.measure.evaluate import RANKING, measure
from selbench.measure.rcstats import _dominant
from selbench.measure.resampled import IntervalRequest, ResampledCell
from selbench.measure.riskcoverage import rc_counts


def _cases(count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for t in range(count):
        n = int(rng.integers(1, 300))
        sc = rng.random(n)
        if t % 3 == 0:  # heavy ties
            sc = np.round(sc * rng.integers(1, 12))
        corr = (rng.random(n) < rng.random()).astype(float)
        if t % 5 == 0:  # informative scores
            corr = (sc + rng.normal(0, 0.3, n) > 0.5).astype(float)
        yield sc, corr


def _plain_dominant(k: np.ndarray, e: np.ndarray) -> np.ndarray:
    """fd-shifts' dominant points: Qhull over every ROC point (the code before issue 28)."""
    d = k.shape[0]
    n, n_wrong = int(k[-1]), int(e[-1])
    mask = np.zeros(d, dtype=bool)
    if n_wrong in (0, n) or d == 1:
        mask[-1] = True
        return mask
    fp, tp = e / n_wrong, (k - e) / (n - n_wrong)
    pts = np.column_stack((np.r_[0.0, fp, 2.0], np.r_[0.0, tp, -1.0]))
    v = ConvexHull(pts).vertices
    mask[v[(v != 0) & (v != d + 1)] - 1] = True
    return mask


@pytest.mark.parametrize("key", sorted(RANKING))
def test_from_counts_equals_the_metric(key):
    fn = RANKING[key]
    assert callable(getattr(fn, "from_counts", None))
    for sc, corr in _cases(400):
        want, got = fn(sc, corr), fn.from_counts(*rc_counts(sc, corr))
        if np.isnan(want):
            assert np.isnan(got)
        else:
            assert got == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_auroc_from_counts_matches_sklearn():
    from sklearn.metrics import roc_auc_score

    for sc, corr in _cases(200, seed=3):
        if 0 < corr.sum() < corr.shape[0]:
            got = RANKING["auroc"].from_counts(*rc_counts(sc, corr))
            assert got == pytest.approx(roc_auc_score(corr, sc), rel=1e-12)


def test_hull_candidates_keep_the_dominant_points():
    for sc, corr in _cases(1500, seed=1):
        k, e = rc_counts(sc, corr)
        np.testing.assert_array_equal(_dominant(k, e), _plain_dominant(k, e))


def test_resample_curves_equal_a_sort_of_each_row():
    rng = np.random.default_rng(5)
    n = 500
    sc = np.round(rng.random(n) * 40)  # ties
    corr = (rng.random(n) < 0.7).astype(float)
    cell = ResampledCell(sc, rng.random(n), corr, IntervalRequest(
        np.array([0.5, 1.0]), seed=0, delta=None, selects=True, extra={}, ranking=RANKING))
    idx = rng.integers(0, n, (37, n))
    blocks = list(cell._count_tables(idx))
    drawn = np.concatenate([b[1] for b in blocks])
    wrong = np.concatenate([b[2] for b in blocks])
    for r, rows in enumerate(idx):
        k_ref, e_ref = rc_counts(sc[rows], corr[rows])
        present = drawn[r] > 0
        np.testing.assert_array_equal(np.cumsum(drawn[r])[present], k_ref)
        np.testing.assert_array_equal(np.cumsum(wrong[r])[present], e_ref)
    for key, fn in RANKING.items():  # every row at once == each row's own curve
        rows_fn = getattr(fn, "from_count_rows", None)
        if rows_fn is None:
            continue
        got = rows_fn(drawn, wrong)
        for r, rows in enumerate(idx):
            want = fn(sc[rows], corr[rows])
            assert got[r] == pytest.approx(want, rel=1e-12, abs=1e-15), (key, r)


@pytest.mark.parametrize("key", sorted(RANKING))
def test_count_rows_on_small_and_degenerate_sets(key):
    """Rows drawing few groups, all correct or all wrong (nan where the metric is), tiny n."""
    rows_fn = getattr(RANKING[key], "from_count_rows", None)
    if rows_fn is None:
        pytest.skip("per row only")
    rng = np.random.default_rng(11)
    for sc, corr in _cases(150, seed=4):
        n = sc.shape[0]
        uniq = np.unique(sc)
        srank = (uniq.shape[0] - 1) - np.searchsorted(uniq, sc)
        idx = rng.integers(0, n, (5, n))
        drawn = np.stack([np.bincount(srank[r], minlength=uniq.shape[0]) for r in idx])
        wrong = np.stack([np.bincount(srank[r][corr[r] == 0], minlength=uniq.shape[0])
                          for r in idx])
        got = rows_fn(drawn, wrong)
        for i, r in enumerate(idx):
            want = RANKING[key](sc[r], corr[r])
            if np.isnan(want):
                assert np.isnan(got[i])
            else:
                assert got[i] == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_measure_ranking_columns_equal_the_metrics():
    rng = np.random.default_rng(2)
    n = 800
    arrays = {"score": np.round(rng.random(n) * 50), "confidence": rng.uniform(0.2, 1, n),
              "correct": (rng.random(n) < 0.6).astype(float)}
    out = measure(arrays, [0.5, 0.8, 1.0], delta=None, seed=0)
    for key, fn in RANKING.items():
        assert out[key][0] == pytest.approx(fn(arrays["score"], arrays["correct"]), rel=1e-12)


def _dense_ba(sc: np.ndarray, corr: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """AURC-BA and AUGRC-BA through cumulative [D, C] tables (the code before issue 28)."""
    _, cls = np.unique(labels, return_inverse=True)
    values, inv = np.unique(-sc, return_inverse=True)
    d, c = values.shape[0], int(cls.max()) + 1
    acc = np.zeros((d, c), dtype=np.int64)
    wrong = np.zeros((d, c), dtype=np.int64)
    np.add.at(acc, (inv, cls), 1)
    np.add.at(wrong, (inv, cls), (corr == 0.0).astype(np.int64))
    acc, wrong = np.cumsum(acc, axis=0), np.cumsum(wrong, axis=0)
    k, n = acc.sum(axis=1), sc.shape[0]
    r = np.mean(np.divide(wrong, acc, out=np.zeros(acc.shape), where=acc != 0), axis=1)
    aurc_ba = (k[0] * r[0] + np.dot(np.diff(k), r[1:] + r[:-1]) / 2.0) / n
    n_c = acc[-1]
    g = wrong @ (n / (n_c.shape[0] * n_c)) / n
    augrc_ba = np.dot(np.diff(k, prepend=0), g + np.r_[0.0, g[:-1]]) / (2.0 * n)
    return float(aurc_ba), float(augrc_ba)


def test_balanced_areas_equal_the_dense_tables():
    from selbench.measure.rcstats import augrc_ba, aurc_ba

    rng = np.random.default_rng(7)
    for t in range(300):
        n, classes = int(rng.integers(1, 400)), int(rng.integers(1, 40))
        sc = rng.random(n)
        if t % 3 == 0:
            sc = np.round(sc * rng.integers(1, 15))
        corr = (rng.random(n) < rng.random()).astype(float)
        labels = rng.integers(0, classes, n)
        want = _dense_ba(sc, corr, labels)
        assert aurc_ba(sc, corr, labels) == pytest.approx(want[0], rel=1e-12, abs=1e-15)
        assert augrc_ba(sc, corr, labels) == pytest.approx(want[1], rel=1e-12, abs=1e-15)


def test_signed_ce_rows_equal_each_row():
    from selbench.measure.reliability import signed_ce

    rng = np.random.default_rng(3)
    conf, corr = rng.random((40, 301)), (rng.random((40, 301)) < 0.6).astype(float)
    got = signed_ce.batched(conf, corr)
    assert got.shape == (40,)
    for r in range(40):
        assert got[r] == pytest.approx(signed_ce(conf[r], corr[r]), rel=1e-13, abs=1e-16)
    assert np.isnan(signed_ce.batched(conf[:, :0], corr[:, :0])).all()
