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
    fp = e / n_wrong  # ROC: wrong accepted over all wrong (fpr), correct over all correct (tpr)
    tp = (k - e) / (n - n_wrong)
    pts = np.column_stack((np.concatenate(([0.0], fp, [2.0])), np.concatenate(([0.0], tp, [-1.0]))))
    vertices = ConvexHull(pts).vertices
    vertices = vertices[(vertices != 0) & (vertices != d + 1)]
    mask[vertices - 1] = True
    return mask


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
    k, e = rc_counts(sc, corr)
    keep = _dominant(k, e)
    return _nonlinear_area(k[keep], e[keep], int(k[-1]), 0.0, 1.0)


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


def _ba_inputs(scores: Any, correct: Any, labels: Any) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray]:
    sc, corr = _checked(scores, correct)
    lab = np.asarray(labels)
    if lab.ndim != 1 or lab.shape[0] != sc.shape[0]:
        raise ValueError(f"labels must be a 1-D array of length {sc.shape[0]} like scores; "
                         f"got shape {lab.shape}")
    _, cls = np.unique(lab, return_inverse=True)
    return sc, corr, cls.reshape(-1)


def _class_groups(sc: np.ndarray, corr: np.ndarray, cls: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct score, descending: ``k`` accepted ``[D]``, and per class (columns, the
    classes present) the accepted ``[D, C]`` and wrong ``[D, C]`` counts."""
    values, inv = np.unique(-sc, return_inverse=True)  # ascending -score: descending score
    d, c = values.shape[0], int(cls.max()) + 1
    acc = np.zeros((d, c), dtype=np.int64)
    wrong = np.zeros((d, c), dtype=np.int64)
    np.add.at(acc, (inv, cls), 1)
    np.add.at(wrong, (inv, cls), (corr == 0.0).astype(np.int64))
    acc, wrong = np.cumsum(acc, axis=0), np.cumsum(wrong, axis=0)
    return acc.sum(axis=1), acc, wrong


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
    k, acc, wrong = _class_groups(sc, corr, cls)
    r = np.mean(np.divide(wrong, acc, out=np.zeros(acc.shape), where=acc != 0), axis=1)
    return float((k[0] * r[0] + np.dot(np.diff(k), r[1:] + r[:-1]) / 2.0) / n)


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
    k, acc, wrong = _class_groups(sc, corr, cls)
    n_c = acc[-1]
    weight = n / (n_c.shape[0] * n_c)
    g = wrong @ weight / n  # generalized risk at each point
    dk = np.diff(k, prepend=0)
    return float(np.dot(dk, g + np.concatenate(([0.0], g[:-1]))) / (2.0 * n))


def _checked(scores: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    sc = check_scores(scores)
    corr = as_float_1d(correct, "correct")
    if corr.shape[0] != sc.shape[0]:
        raise ValueError(f"correct must have the same length as scores ({sc.shape[0]}); "
                         f"got {corr.shape[0]}")
    return sc, check_correct(corr, sc.shape[0])
