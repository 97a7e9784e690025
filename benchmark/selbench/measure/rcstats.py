"""fd-shifts' risk–coverage statistics beyond AURC, E-AURC and AUGRC: the achievable AURC,
the excess AUGRC, the balanced-accuracy AURC and AUGRC, and the AURC over a partial coverage
range.

The reference is fd-shifts' ``RiskCoverageStats`` (IML-DKFZ/fd-shifts,
``fd_shifts/analysis/rc_stats.py`` and ``rc_stats_utils.py``, read at commit ``56276af``):
``aurc_achievable``, ``eaugrc``, ``aurc_ba``, ``augrc_ba`` and ``evaluate_auc(cov_min=...,
cov_max=...)``. Conventions shared with :mod:`selbench.measure.riskcoverage`: the inputs are
finite ``scores`` (higher = accepted first) and 0/1 ``correct``, fd-shifts' binary
residuals are ``1 - correct``, ties are merged (one point per distinct score,
:func:`selbench.measure.riskcoverage.rc_counts`), and the results are in raw units (fd-shifts
multiplies its areas by ``AUC_DISPLAY_SCALE = 1000``; these functions do not).

**Two interpolations.** Between two points of the curve fd-shifts interpolates either the
risk linearly (``-np.trapz``, its default: :func:`~selbench.measure.riskcoverage.aurc`,
:func:`~selbench.measure.riskcoverage.augrc`, and here the balanced-accuracy areas) or, for
the selective risk only, the *error count* linearly (``"non-linear"``): between points
``(k_lo, e_lo)`` and ``(k_hi, e_hi)`` (accepted and wrong counts) the errors grow as
``E(k) = e_lo + s (k - k_lo)``, ``s = (e_hi - e_lo) / (k_hi - k_lo)``, and the risk
``E(k) / k`` is integrated exactly::

    (1/N) int E(k)/k dk = (1/N) [s (b - a) + (e_lo - s k_lo) ln(b / a)]   over [a, b],

and below the lowest point the risk is constant (``E(k) = e_1 k / k_1``). This is the
expected selective risk of a random order inside each tied group, and it is what
:func:`aurc_achievable` and :func:`partial_aurc` integrate.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.spatial import ConvexHull

from selbench.measure.riskcoverage import augrc, rc_counts
from selbench.measure.validation import as_float_1d, check_correct, check_scores

__all__ = [
    "PAURC_RANGE",
    "RC_METRICS",
    "aurc_achievable",
    "aurc_ba",
    "augrc_ba",
    "eaugrc",
    "eaurc_achievable",
    "partial_aurc",
    "paurc",
]

#: Coverage range of the registry's partial AURC ``paurc``: the paper's β range.
PAURC_RANGE = (0.5, 1.0)
#: Registry entries (:class:`selbench.measure.metrics.MetricInfo` fields), all measured once
#: per cell over the evaluation examples (kind ``ranking``).
RC_METRICS: dict[str, tuple] = {
    "aurc_achievable": ("AURC (achievable)", True, True, "ranking",
                        "risk area through the ROC-hull points, fd-shifts (aurc_achievable)"),
    "eaugrc": ("E-AUGRC", True, True, "ranking",
               "AUGRC minus that of a perfect ranking, π²/2 (eaugrc)"),
    "paurc": ("AURC₀.₅–₁", True, True, "ranking",
              "selective-risk area over coverage [0.5, 1], fd-shifts (partial_aurc)"),
    "aurc_ba": ("AURC-BA", True, True, "ranking",
                "AURC of the class-balanced selective risk, fd-shifts (aurc_ba)"),
    "augrc_ba": ("AUGRC-BA", True, True, "ranking",
                 "AUGRC of balanced-accuracy residuals, fd-shifts (augrc_ba)"),
}


def _level(x: Any, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number in [0, 1]; got {x!r}")
    if not (0.0 <= x <= 1.0):
        raise ValueError(f"{name} must lie in [0, 1]; got {x!r}")
    return float(x)


def _nonlinear_area(k: np.ndarray, e: np.ndarray, n: int, lo: float, hi: float) -> float:
    """fd-shifts' non-linear selective-risk area over coverage ``[lo, hi]`` through the points
    ``(k, e)`` (ascending coverage), raw units: each segment ``[k_{j-1}, k_j]`` clipped to
    ``[lo N, hi N]`` and integrated exactly (module notes); below the lowest point
    (``k_0 = 0``) the risk is flat."""
    if hi <= lo:
        return 0.0
    kf, ef = k.astype(np.float64), e.astype(np.float64)
    k_lo = np.concatenate(([0.0], kf[:-1]))
    e_lo = np.concatenate(([0.0], ef[:-1]))
    a = np.maximum(k_lo, lo * n)
    b = np.minimum(kf, hi * n)
    j = np.flatnonzero(b > a)
    flat = j[j == 0]  # the stretch below the lowest point: E(k) = e_0 k / k_0
    total = float(np.sum(ef[flat] / kf[flat] * (b[flat] - a[flat])))
    j = j[j > 0]
    s = (ef[j] - e_lo[j]) / (kf[j] - k_lo[j])
    total += float(np.sum(s * (b[j] - a[j]) + (e_lo[j] - s * k_lo[j]) * np.log(b[j] / a[j])))
    return total / n


def _dominant(k: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Mask over the points ``(k, e)`` (ascending coverage) of fd-shifts' "dominant" points
    (``RiskCoverageStats.dominant_point_mask``): the vertices of the ROC convex hull of the
    scores separating correct from wrong predictions, found as fd-shifts does, with
    ``scipy.spatial.ConvexHull`` over the ROC points and ``(2, -1)``; the full-coverage point
    always, ``(0, 0)`` never."""
    d = k.shape[0]
    n, n_wrong = int(k[-1]), int(e[-1])
    mask = np.zeros(d, dtype=bool)
    if n_wrong in (0, n) or d == 1:
        mask[-1] = True
        return mask
    cand = _hull_candidates(k, e)
    fp = e[cand] / n_wrong  # ROC: wrong accepted over all wrong (fpr), correct over all correct (tpr)
    tp = (k[cand] - e[cand]) / (n - n_wrong)
    pts = np.column_stack((np.concatenate(([0.0], fp, [2.0])), np.concatenate(([0.0], tp, [-1.0]))))
    vertices = ConvexHull(pts).vertices
    vertices = vertices[(vertices != 0) & (vertices != cand.shape[0] + 1)]
    mask[cand[vertices - 1]] = True
    return mask


def _hull_candidates(k: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Indices of the ROC points that can be hull vertices, for ``ConvexHull`` to decide:
    all but those where the curve turns left (exact, in integer counts: wrong ``e`` and
    correct ``k - e`` accepted, from ``(0, 0)``). Such a point lies inside the triangle of its
    two neighbours and the point below the later one on the hull's lower edge, so it is never a
    vertex; dropping it leaves the hull and its vertices unchanged. (Measured: 200 bootstrap
    resamples of a 12,000-example cell, Qhull over every point 0.58 s; see perf/README.md.)"""
    keep = np.arange(k.shape[0])
    x = np.zeros(k.shape[0] + 1, dtype=np.int64)
    y = np.zeros(k.shape[0] + 1, dtype=np.int64)
    for _ in range(_HULL_PASSES):  # the same test on what is left: each pass drops points
        m = keep.shape[0]
        x[1:m + 1], y[1:m + 1] = e[keep], k[keep] - e[keep]
        dx, dy = x[1:m + 1] - x[:m], y[1:m + 1] - y[:m]
        left = dx[:-1] * dy[1:] > dy[:-1] * dx[1:]  # a left turn at keep[0 .. -2]
        if not left.any():
            break
        left = np.append(left, False)  # the full-coverage point stays
        keep = keep[~left]
    return keep


#: passes of :func:`_hull_candidates` (a pass drops the left turns of what is left; at the
#: fixed point only the hull's chain remains): measured fastest with Qhull on the rest,
#: 2,000-50,000 points (4,000: 0.26 ms a call with 1 pass, 0.22 with 4, 0.33 with 16)
_HULL_PASSES = 4


def aurc_achievable(scores: Any, correct: Any) -> float:
    """Achievable AURC: the selective-risk area through the dominant points only.

    Definition (fd-shifts' ``RiskCoverageStats.aurc_achievable``, Traub et al., NeurIPS
    2024): keep the points of the risk–coverage curve that are vertices of the convex hull
    of the ROC curve (the working points a threshold can reach optimally; the others are
    dominated by mixing two hull points), and integrate the selective risk through them with
    the non-linear interpolation of the module notes over coverage ``[0, 1]``. All correct,
    all wrong or all scores tied: the full-coverage point alone, i.e. the error rate.
    ``N = 0``: ``nan``. Raw units (fd-shifts: x1000).
    """
    sc, corr = _checked(scores, correct)
    if sc.shape[0] == 0:
        return float("nan")
    return _aurc_achievable_counts(*rc_counts(sc, corr))


def _aurc_achievable_counts(k: np.ndarray, e: np.ndarray) -> float:
    keep = _dominant(k, e)
    return _nonlinear_area(k[keep], e[keep], int(k[-1]), 0.0, 1.0)


aurc_achievable.from_counts = _aurc_achievable_counts  # type: ignore[attr-defined]


def _oracle_aurc(err: float) -> float:
    if err >= 1.0:
        return 1.0
    return err + (1.0 - err) * math.log1p(-err)


def eaurc_achievable(scores: Any, correct: Any) -> float:
    """:func:`aurc_achievable` minus the oracle AURC ``pi + (1 - pi) ln(1 - pi)`` (fd-shifts'
    ``eaurc_achievable``; the oracle as in :func:`selbench.measure.riskcoverage.eaurc`)."""
    sc, corr = _checked(scores, correct)
    if sc.shape[0] == 0:
        return float("nan")
    return aurc_achievable(sc, corr) - _oracle_aurc(float(np.mean(1.0 - corr)))


def eaugrc(scores: Any, correct: Any) -> float:
    """Excess AUGRC: :func:`~selbench.measure.riskcoverage.augrc` minus ``pi^2 / 2``, the AUGRC
    of a perfect ranking at error rate ``pi`` (fd-shifts' ``eaugrc`` / ``augrc_optimal`` for
    binary residuals). By the closed form of the AUGRC this is ``pi (1 - pi) (1 - AUROC_f)``:
    0 for a perfect ranking, ``pi (1 - pi) / 2`` for a random or constant one. ``N = 0``:
    ``nan``. ``eaugrc.batched(scores, correct)``: every row of ``[R, m]`` arrays at once."""
    sc, corr = _checked(scores, correct)
    if sc.shape[0] == 0:
        return float("nan")
    err = float(np.mean(1.0 - corr))
    return augrc(sc, corr) - 0.5 * err * err


def _eaugrc_rows(scores: Any, correct: Any) -> np.ndarray:
    area = augrc.batched(scores, correct)  # validates the rows
    err = 1.0 - np.asarray(correct, dtype=np.float64).mean(axis=1)
    return area - 0.5 * err * err


eaugrc.batched = _eaugrc_rows  # type: ignore[attr-defined]


def _eaugrc_counts(k: np.ndarray, e: np.ndarray) -> float:
    err = int(e[-1]) / int(k[-1])  # = mean(1 - correct): a sum of 0/1 values is exact
    return augrc.from_counts(k, e) - 0.5 * err * err


eaugrc.from_counts = _eaugrc_counts  # type: ignore[attr-defined]


def _eaugrc_count_rows(drawn: np.ndarray, wrong: np.ndarray) -> np.ndarray:
    err = wrong.sum(axis=1) / drawn.sum(axis=1)
    return augrc.from_count_rows(drawn, wrong) - 0.5 * err * err


eaugrc.from_count_rows = _eaugrc_count_rows  # type: ignore[attr-defined]


def partial_aurc(scores: Any, correct: Any, cov_min: float = 0.0, cov_max: float = 1.0) -> float:
    """AURC over the coverage range ``[cov_min, cov_max]`` (not normalised by its width).

    Definition: fd-shifts' ``evaluate_auc(risk="selective-risk", cov_min=..., cov_max=...,
    interpolation="non-linear")``, the only form in which fd-shifts integrates a partial
    range (its linear interpolation and the generalized risk raise ``NotImplementedError``
    there): the exact integral of the non-linearly interpolated selective risk (module
    notes) through every point of the curve, from ``cov_min`` to ``cov_max``. Over ``[0, 1]``
    it differs from :func:`~selbench.measure.riskcoverage.aurc` (linear interpolation) by
    the interpolation only.

    Two departures from fd-shifts' code, where it departs from its own definition: when the
    range lies inside one segment of the curve fd-shifts returns that area without its
    ``x1000`` display scale, and when that segment does not start at coverage 0 it takes
    ``cov_max / c_hi`` instead of ``(cov_max - c_lo) / (c_hi - c_lo)`` as the fraction of
    the segment covered; here the integral is exact in every case. ``cov_max <= cov_min``:
    0.0 (as fd-shifts). ``N = 0``: ``nan``.
    """
    lo, hi = _level(cov_min, "cov_min"), _level(cov_max, "cov_max")
    sc, corr = _checked(scores, correct)
    if sc.shape[0] == 0:
        return float("nan")
    k, e = rc_counts(sc, corr)
    return _nonlinear_area(k, e, int(k[-1]), lo, hi)


def paurc(scores: Any, correct: Any) -> float:
    """:func:`partial_aurc` over :data:`PAURC_RANGE` (coverage 0.5 to 1), the registry's
    ``paurc``."""
    return partial_aurc(scores, correct, *PAURC_RANGE)


def _paurc_counts(k: np.ndarray, e: np.ndarray) -> float:
    return _nonlinear_area(k, e, int(k[-1]), *PAURC_RANGE)


paurc.from_counts = _paurc_counts  # type: ignore[attr-defined]


def _nonlinear_area_rows(drawn: np.ndarray, wrong: np.ndarray, lo: float, hi: float
                         ) -> np.ndarray:
    """:func:`_nonlinear_area` of every row of per-group counts (``from_count_rows``, see
    :mod:`selbench.measure.riskcoverage`): a group a row does not draw is a segment of no
    width, which adds nothing."""
    k, e = np.cumsum(drawn, axis=1).astype(np.float64), np.cumsum(wrong, axis=1).astype(np.float64)
    n = k[:, -1:]
    if hi <= lo:
        return np.zeros(k.shape[0])
    k_lo = np.concatenate((np.zeros((k.shape[0], 1)), k[:, :-1]), axis=1)
    e_lo = np.concatenate((np.zeros((e.shape[0], 1)), e[:, :-1]), axis=1)
    a, b = np.maximum(k_lo, lo * n), np.minimum(k, hi * n)
    used = b > a  # implies k > k_lo: a drawn group
    flat = used & (k_lo == 0)  # below a row's lowest point: E(k) = e_0 k / k_0
    seg = used & (k_lo > 0)
    one = np.where(used, k - k_lo, 1.0)
    s = (e - e_lo) / one
    with np.errstate(invalid="ignore", divide="ignore"):
        curve = s * (b - a) + (e_lo - s * k_lo) * np.log(np.where(seg, b / np.where(seg, a, 1.0), 1.0))
        flat_part = e / np.where(flat, k, 1.0) * (b - a)
    total = np.where(flat, flat_part, 0.0).sum(axis=1) + np.where(seg, curve, 0.0).sum(axis=1)
    return total / n[:, 0]


def _paurc_count_rows(drawn: np.ndarray, wrong: np.ndarray) -> np.ndarray:
    return _nonlinear_area_rows(drawn, wrong, *PAURC_RANGE)


paurc.from_count_rows = _paurc_count_rows  # type: ignore[attr-defined]


def _ba_inputs(scores: Any, correct: Any, labels: Any) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray]:
    sc, corr = _checked(scores, correct)
    lab = np.asarray(labels)
    if lab.ndim != 1 or lab.shape[0] != sc.shape[0]:
        raise ValueError(f"labels must be a 1-D array of length {sc.shape[0]} like scores; "
                         f"got shape {lab.shape}")
    _, cls = np.unique(lab, return_inverse=True)
    return sc, corr, cls.reshape(-1)


def _class_points(sc: np.ndarray, corr: np.ndarray, cls: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct score, descending: ``k`` accepted ``[D]``, the balanced selective risk
    ``[D]`` (the mean over the ``C`` classes of each class's error rate among its accepted
    examples, 0 for a class with none) and the balanced generalized risk ``[D]`` (the wrong
    accepted, each weighing ``N / (C n_c)``, over ``N``).

    Walking the examples in score order, an example changes only its own class's error
    rate, from ``w / a`` to ``w' / a'`` (its class's wrong and accepted counts before and
    after it); the mean over classes is the cumulative sum of those changes over ``C``, read
    at the end of each tied group. O(N log N) instead of cumulative ``[D, C]`` tables
    (measured, 12,000 examples of 1,000 classes: 0.29 s a call, most of the point metrics of
    an ImageNet cell; see perf/README.md, issue 28). Equal to the tables' result to float
    rounding of the summation order (tests/test_rcstats.py)."""
    n = sc.shape[0]
    order = np.argsort(-sc, kind="stable")  # descending score
    s, c, w = sc[order], cls[order], (corr[order] == 0.0).astype(np.float64)
    ends = np.flatnonzero(np.r_[s[1:] != s[:-1], True])  # the last example of each group
    n_c = np.bincount(c)
    n_classes = n_c.shape[0]
    by_class = np.argsort(c, kind="stable")  # score order inside each class
    c_sorted, w_sorted = c[by_class], w[by_class]
    first = np.flatnonzero(np.r_[True, c_sorted[1:] != c_sorted[:-1]])
    seg = np.repeat(first, np.diff(np.r_[first, n]))
    cum = np.cumsum(w_sorted)
    acc_run, wrong_run = np.empty(n), np.empty(n)
    acc_run[by_class] = np.arange(n) - seg + 1.0  # the class's accepted, this one included
    wrong_run[by_class] = cum - (cum[seg] - w_sorted[seg])
    before = np.divide(wrong_run - w, acc_run - 1.0, out=np.zeros(n), where=acc_run > 1.0)
    risk = np.cumsum(wrong_run / acc_run - before)[ends] / n_classes
    general = np.cumsum(w * (n / (n_classes * n_c[c])))[ends] / n
    return ends + 1, risk, general


def aurc_ba(scores: Any, correct: Any, labels: Any) -> float:
    """AURC with the balanced selective risk (fd-shifts' ``aurc_ba``, ``selective_risk_ba_stats``).

    At each threshold (distinct score, ties merged) the risk is the mean over the ``C``
    classes present in ``labels`` (true classes) of the error rate of the accepted examples
    of that class, a class with none accepted counting 0 (fd-shifts' default
    ``drop_empty_classes=False``); the area is the trapezoidal rule over the points plus the
    anchor at coverage 0 carrying the lowest point's risk, as
    :func:`~selbench.measure.riskcoverage.aurc`. ``N = 0``: ``nan``.
    """
    sc, corr, cls = _ba_inputs(scores, correct, labels)
    n = sc.shape[0]
    if n == 0:
        return float("nan")
    k, r, _ = _class_points(sc, corr, cls)
    return float((k[0] * r[0] + np.dot(np.diff(k).astype(np.float64), r[1:] + r[:-1]) / 2.0) / n)


def augrc_ba(scores: Any, correct: Any, labels: Any) -> float:
    """AUGRC with balanced-accuracy residuals (fd-shifts' ``augrc_ba``,
    ``generalized_risk_ba_stats``): each wrong example of class ``c`` weighs
    ``N / (C n_c)`` (``n_c`` its class's examples in ``labels``, ``C`` the classes present),
    so every class carries the same total weight; then the AUGRC of
    :func:`~selbench.measure.riskcoverage.augrc` (trapezoids from ``(0, 0)``, ties merged)
    with those weighted errors. At full coverage the generalized risk is the balanced error
    rate. ``N = 0``: ``nan``.
    """
    sc, corr, cls = _ba_inputs(scores, correct, labels)
    n = sc.shape[0]
    if n == 0:
        return float("nan")
    k, _, g = _class_points(sc, corr, cls)
    dk = np.diff(k, prepend=0)
    return float(np.dot(dk.astype(np.float64), g + np.concatenate(([0.0], g[:-1]))) / (2.0 * n))


def _checked(scores: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    sc = check_scores(scores)
    corr = as_float_1d(correct, "correct")
    if corr.shape[0] != sc.shape[0]:
        raise ValueError(f"correct must have the same length as scores ({sc.shape[0]}); "
                         f"got {corr.shape[0]}")
    return sc, check_correct(corr, sc.shape[0])
