"""Reliability with its uncertainty and its direction: the equal-mass bins of a reliability
diagram with a Clopper–Pearson interval on each bin's accuracy, and the signed calibration
error (over- vs under-confidence).

The bins are those of :func:`selbench.measure.metrics.ece` (the ``uncertainty-calibration``
package's equal-mass bins, ties merged, :func:`selbench.measure.binning.bin_stats`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from scipy.stats import beta as beta_dist

from selbench.measure.binning import bin_stats
from selbench.measure.validation import check_confidence, check_correct, check_n_bins

__all__ = ["RELIABILITY_METRICS", "BinnedReliability", "binned_reliability", "clopper_pearson",
           "signed_ce"]

#: Registry entry (:class:`selbench.measure.metrics.MetricInfo` fields) of the signed error:
#: lower is not better (0 is), so no best is marked.
RELIABILITY_METRICS: dict[str, tuple] = {
    "signed_ce": ("Signed CE", True, False, "selective",
                  "mean confidence − accuracy: > 0 over-, < 0 under-confident (signed_ce)"),
}


def _check_level(level: Any) -> float:
    if isinstance(level, bool) or not isinstance(level, (int, float, np.floating)) or not (
            0.0 < float(level) < 1.0):
        raise ValueError(f"level must be a number in (0, 1); got {level!r}")
    return float(level)


def clopper_pearson(successes: Any, trials: Any, level: float = 0.95
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Exact (Clopper–Pearson) two-sided interval of a binomial proportion, element-wise.

    With ``x`` successes in ``n`` trials and ``a = 1 - level``: the lower end is the
    ``a/2`` quantile of ``Beta(x, n - x + 1)`` (0 when ``x = 0``), the upper end the
    ``1 - a/2`` quantile of ``Beta(x + 1, n - x)`` (1 when ``x = n``). ``n = 0``: ``(0, 1)``.

    Args:
        successes: integer counts ``x``, ``0 <= x <= n``.
        trials: integer counts ``n`` (same shape, or broadcastable).
        level: the confidence level in (0, 1).

    Returns:
        ``(low, high)``, float64 arrays of the broadcast shape.
    """
    level = _check_level(level)
    x = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    x, n = np.broadcast_arrays(x, n)
    if (x < 0).any() or (x > n).any() or (x != np.round(x)).any() or (n != np.round(n)).any():
        raise ValueError("successes and trials must be integers with 0 <= successes <= trials")
    a = 1.0 - level
    with np.errstate(invalid="ignore"):
        low = np.where(x > 0, beta_dist.ppf(a / 2, np.maximum(x, 1), n - x + 1), 0.0)
        high = np.where(x < n, beta_dist.ppf(1 - a / 2, x + 1, np.maximum(n - x, 1)), 1.0)
    return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)


class BinnedReliability(NamedTuple):
    """The non-empty equal-mass bins of a reliability diagram: ``counts`` examples with mean
    confidence ``confidence`` and accuracy ``accuracy`` (``correct`` of them right), and the
    Clopper–Pearson interval ``[low, high]`` of each bin's accuracy at ``level``."""

    counts: np.ndarray
    confidence: np.ndarray
    accuracy: np.ndarray
    low: np.ndarray
    high: np.ndarray
    level: float


def binned_reliability(confidence: Any, correct: Any, n_bins: int = 15,
                       level: float = 0.95) -> BinnedReliability:
    """The bins of :func:`selbench.measure.metrics.ece` (``n_bins`` equal-mass bins, ties
    merged; empty bins dropped) with a Clopper–Pearson interval (:func:`clopper_pearson`) on
    each bin's accuracy: the number of correct predictions in a bin is treated as binomial
    given its size. No examples: empty arrays."""
    level = _check_level(level)
    n_bins = check_n_bins(n_bins)
    conf = check_confidence(confidence)
    corr = check_correct(correct, conf.shape[0])
    if conf.shape[0] == 0:
        e = np.zeros(0)
        return BinnedReliability(e.astype(np.int64), e, e, e, e, level)
    order = np.argsort(conf, kind="stable")
    counts, conf_mean, acc_mean = bin_stats(conf[order], corr[order], n_bins)
    keep = counts > 0
    counts, conf_mean, acc_mean = counts[keep], conf_mean[keep], acc_mean[keep]
    hits = np.round(acc_mean * counts)  # exact: accuracy = hits / count
    low, high = clopper_pearson(hits, counts, level)
    return BinnedReliability(counts.astype(np.int64), conf_mean, acc_mean, low, high, level)


def signed_ce(confidence: Any, correct: Any) -> float:
    """Signed calibration error: ``mean(confidence - correct)``; positive = over-confident
    (the confidence exceeds the accuracy), negative = under-confident. ``nan`` when empty.

    This is the ECE's binned gap with its sign kept: for any binning, weighting each bin's
    ``mean confidence - accuracy`` by its share of the examples (as :func:`selbench.measure.
    metrics.ece` weights its bins) sums to exactly this mean, so no bins are needed; unlike
    the ECE it lets over- and under-confident bins cancel, and says which way the
    miscalibration goes rather than how large it is (read it next to ECE₁, which bounds its
    absolute value: ``|signed_ce| <= ECE₁`` for the same bins). Measured on the accepted
    examples at each β as the other selective metrics.
    """
    conf = check_confidence(confidence)
    corr = check_correct(correct, conf.shape[0])
    if conf.shape[0] == 0:
        return float("nan")
    return float(np.mean(conf - corr))


def _signed_ce_rows(confidence: Any, correct: Any) -> np.ndarray:
    """:func:`signed_ce` of every row of ``[R, k]`` arrays (``signed_ce.batched``, what the
    bootstrap calls once per β instead of once per resample and β: 2,200 calls a cell)."""
    conf = np.asarray(confidence, dtype=np.float64)
    corr = np.asarray(correct, dtype=np.float64)
    if conf.shape[1] == 0:
        return np.full(conf.shape[0], np.nan)
    return np.mean(conf - corr, axis=1)


signed_ce.batched = _signed_ce_rows  # type: ignore[attr-defined]
