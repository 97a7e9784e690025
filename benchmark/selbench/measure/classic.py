"""The classic metrics users of scikit-learn, netcal and torch-uncertainty reach for, on plain
arrays: negative log-likelihood (top-label and of the full distribution), the maximum
calibration error, the equal-width ECE, and how well the selector's scores separate correct
from wrong predictions (AUROC, FPR at 95 % TPR).

Each is checked in ``tests/test_library_face.py`` against its reference to 1e-12: scikit-learn's
``log_loss``, ``roc_auc_score`` and ``roc_curve``, and the ``uncertainty-calibration`` package
(``lower_bound_scaling_ce`` with ``get_equal_prob_bins``; its equal-mass bins for the MCE).
The registry (:data:`selbench.measure.metrics.METRICS`) makes them leaderboard columns:
``nll``, ``mce``, ``ece1_ew`` and ``ece2_debiased`` on the accepted examples at each β,
``auroc`` and ``fpr95`` once per cell from all the selector's scores, and ``nll_full`` and
``classwise_ece`` (which need the recalibrated distribution) on the accepted examples.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from selbench.measure.binning import bin_stats, plugin_ce
from selbench.measure.validation import (
    as_float_1d,
    check_confidence,
    check_correct,
    check_n_bins,
    check_p,
    check_scores,
)

__all__ = ["ece_equal_width", "fpr_at_tpr", "mce", "nll", "nll_full", "selector_auroc"]

#: The clipping of probabilities in the log-likelihoods, scikit-learn's ``log_loss`` rule:
#: ``[eps, 1 - eps]`` with float64's machine epsilon (so a confident mistake costs at most
#: ``-log(eps)``, about 36.04, not infinity).
EPS = float(np.finfo(np.float64).eps)


def nll(confidence: Any, correct: Any) -> float:
    """Top-label negative log-likelihood: the binary cross-entropy of the top-label
    confidence ``q`` against 0/1 correctness ``c``,
    ``-mean(c log q + (1 - c) log(1 - q))``, with ``q`` clipped to ``[eps, 1 - eps]`` (float64
    epsilon); exactly ``sklearn.metrics.log_loss(correct, confidence, labels=[0, 1])``.
    It is what a recalibrator of the top label is asked to predict (the probability that
    the prediction is right), so it is defined for every recalibrator; ``nan`` when empty."""
    conf = check_confidence(confidence)
    corr = check_correct(correct, conf.shape[0])
    if conf.shape[0] == 0:
        return float("nan")
    q = np.clip(conf, EPS, 1.0 - EPS)
    return float(-np.mean(np.where(corr > 0, np.log(q), np.log1p(-q))))


def nll_full(log_probs: Any, labels: Any) -> float:
    """Negative log-likelihood of the full recalibrated distribution (multi-class log loss):
    ``-mean_i log p_i[y_i]`` with ``p = exp(log_probs)`` clipped to ``[eps, 1 - eps]``;
    exactly ``sklearn.metrics.log_loss(labels, exp(log_probs), labels=range(K))`` for rows
    that sum to 1. ``log_probs`` ``[N, K]`` (entries may be ``-inf``), ``labels`` ints in
    ``[0, K)``; ``nan`` when empty."""
    lp = np.asarray(log_probs, dtype=np.float64)
    if lp.ndim != 2 or lp.shape[1] == 0:
        raise ValueError(f"log_probs must have shape [N, K] with K >= 1; got {lp.shape}")
    lab = np.asarray(labels)
    if lab.shape != (lp.shape[0],) or (lab.size and not np.issubdtype(lab.dtype, np.integer)):
        raise ValueError(f"labels must be integers of shape [{lp.shape[0]}]; got {lab.shape} "
                         f"{lab.dtype}")
    if lab.size and (lab.min() < 0 or lab.max() >= lp.shape[1]):
        raise ValueError(f"labels must lie in [0, {lp.shape[1]})")
    if lp.shape[0] == 0:
        return float("nan")
    picked = lp[np.arange(lp.shape[0]), lab]
    if np.isnan(picked).any() or (picked > 1e-6).any():
        raise ValueError("log_probs must be log-probabilities (<= 0, not NaN)")
    return float(-np.mean(np.log(np.clip(np.exp(picked), EPS, 1.0 - EPS))))


def mce(confidence: Any, correct: Any, *, n_bins: int = 15) -> float:
    """Maximum calibration error: ``max_b |mean confidence in B_b - accuracy in B_b|`` over
    the non-empty bins of the equal-mass binning of :func:`selbench.measure.metrics.ece`
    (15 bins, ties merged, the ``uncertainty-calibration`` package's ``get_equal_bins``);
    the worst bin where the ECE is their weighted average. ``nan`` when empty."""
    n_bins = check_n_bins(n_bins)
    conf = check_confidence(confidence)
    corr = check_correct(correct, conf.shape[0])
    if conf.shape[0] == 0:
        return float("nan")
    order = np.argsort(conf, kind="stable")
    counts, conf_mean, acc_mean = bin_stats(conf[order], corr[order], n_bins)
    return float(np.max(np.abs(conf_mean - acc_mean)[counts > 0]))


def ece_equal_width(confidence: Any, correct: Any, *, p: float = 1, n_bins: int = 15) -> float:
    """Top-label ECE_p with ``n_bins`` bins of equal width on [0, 1] (Guo et al.'s ECE):
    bin ``b`` holds ``b/m < confidence <= (b + 1)/m`` (0 in the first bin), each weighted by
    its share of the examples; exactly ``calibration.lower_bound_scaling_ce(..., p=p,
    debias=False, num_bins=n_bins, binning_scheme=calibration.get_equal_prob_bins,
    mode="top-label")``. ``nan`` when empty."""
    p = check_p(p)
    n_bins = check_n_bins(n_bins)
    conf = check_confidence(confidence)
    corr = check_correct(correct, conf.shape[0])
    if conf.shape[0] == 0:
        return float("nan")
    edges = np.arange(1, n_bins + 1, dtype=np.float64) / n_bins
    idx = np.searchsorted(edges, conf, side="left")
    counts = np.bincount(idx, minlength=n_bins).astype(np.float64)
    safe = np.maximum(counts, 1.0)
    conf_mean = np.bincount(idx, weights=conf, minlength=n_bins) / safe
    acc_mean = np.bincount(idx, weights=corr, minlength=n_bins) / safe
    return plugin_ce(counts, conf_mean, acc_mean, p)


def _auroc_counts(k: np.ndarray, e: np.ndarray) -> float:
    """:func:`selector_auroc` from the merged-tie points of
    :func:`selbench.measure.riskcoverage.rc_counts`: a tied group of ``c`` correct and ``w``
    wrong examples ranks its correct ones above the ``E`` wrong ones scored lower and level
    with its own ``w`` (one half each), summed in integers (one rounding)."""
    n, n_neg = int(k[-1]), int(e[-1])
    n_pos = n - n_neg
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    w = np.diff(e, prepend=0)
    c = np.diff(k, prepend=0) - w
    twice = int(np.dot(c, 2 * (n_neg - e) + w))
    return float(twice / (2.0 * n_pos * n_neg))


def _fpr_counts(k: np.ndarray, e: np.ndarray, tpr: float = 0.95) -> float:
    """:func:`fpr_at_tpr` from the merged-tie points (the same tie ends, the same counts)."""
    n, n_neg = int(k[-1]), int(e[-1])
    n_pos = n - n_neg
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    rates = (k - e) / n_pos
    j = int(np.searchsorted(rates, tpr, side="left"))
    return float(e[min(j, e.shape[0] - 1)] / n_neg)


def _positives(scores: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    sc = check_scores(scores)
    corr = check_correct(correct, sc.shape[0])
    return sc, corr > 0


def selector_auroc(scores: Any, correct: Any) -> float:
    """AUROC of the selector's scores for telling correct predictions (positives) from
    wrong ones: the probability that a random correct example scores above a random wrong
    one, ties counting one half; exactly ``sklearn.metrics.roc_auc_score(correct,
    scores)``. ``nan`` when every prediction is right or every one wrong (no curve)."""
    sc, pos = _positives(scores, correct)
    n_pos = int(pos.sum())
    n_neg = pos.shape[0] - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    from scipy.stats import rankdata

    ranks = rankdata(sc)  # average ranks of ties
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def fpr_at_tpr(scores: Any, correct: Any, *, tpr: float = 0.95) -> float:
    """False-positive rate at the first threshold whose true-positive rate reaches ``tpr``,
    correct predictions being the positives (accepting every example scoring at least the
    threshold): the fraction of wrong predictions still accepted when 95 % of the right
    ones are. Exactly ``fpr[np.searchsorted(tpr_curve, tpr)]`` of
    ``sklearn.metrics.roc_curve(correct, scores)`` (ties enter together). ``nan`` when every
    prediction is right or every one wrong."""
    t = as_float_1d([tpr], "tpr")[0]
    if not 0.0 < t <= 1.0:
        raise ValueError(f"tpr must lie in (0, 1]; got {tpr!r}")
    sc, pos = _positives(scores, correct)
    n_pos = int(pos.sum())
    n_neg = pos.shape[0] - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(-sc, kind="stable")
    sc_sorted, pos_sorted = sc[order], pos[order]
    last = np.r_[np.flatnonzero(np.diff(sc_sorted)), sc_sorted.shape[0] - 1]  # end of each tie
    tps = np.cumsum(pos_sorted)[last]
    fps = (last + 1) - tps
    rates = tps / n_pos
    j = int(np.searchsorted(rates, t, side="left"))
    return float(fps[min(j, fps.shape[0] - 1)] / n_neg)


#: The registry entries of these metrics (:class:`selbench.measure.metrics.MetricInfo`
#: fields: label, lower is better, marked, kind, summary, needs), merged into
#: :data:`selbench.measure.metrics.METRICS` as one block. ``needs="log_probs"``: computed
#: only for an experiment that shows the column, from the recalibrated distribution, which
#: every method's recalibrator must define (``provides_log_probs``; checked by ``selbench
#: validate``).
CLASSIC_METRICS: dict[str, tuple] = {
    "nll": ("NLL", True, True, "selective",
            "top-label NLL: binary cross-entropy of the confidence vs correctness (nll)"),
    "mce": ("MCE", True, True, "selective",
            "max calibration error over the 15 equal-mass bins of ECE (mce)"),
    "ece1_ew": ("ECE₁ (eq. width)", True, True, "selective",
                "top-label ECE, p = 1, 15 equal-width bins (ece_equal_width)"),
    "ece2_debiased": ("ECE₂ (debiased)", True, True, "selective",
                      "debiased top-label ECE₂, 15 equal-mass bins (ece, debias=True)"),
    "auroc": ("AUROC", False, True, "ranking",
              "selector's AUROC, correct vs wrong predictions (selector_auroc)"),
    "fpr95": ("FPR@95TPR", True, True, "ranking",
              "share of wrong predictions accepted at 95% of the right ones (fpr_at_tpr)"),
    "nll_full": ("NLL (full)", True, True, "selective",
                 "NLL of the full recalibrated distribution (nll_full)", "log_probs"),
    "classwise_ece": ("cw-ECE", True, True, "selective",
                      "class-wise ECE of the recalibrated distribution (classwise_ece)",
                      "log_probs"),
}


# the metrics from a merged-tie curve (``fn.from_counts``, see selbench.measure.riskcoverage)
selector_auroc.from_counts = _auroc_counts  # type: ignore[attr-defined]
fpr_at_tpr.from_counts = _fpr_counts  # type: ignore[attr-defined]


def _auroc_count_rows(drawn: np.ndarray, wrong: np.ndarray) -> np.ndarray:
    """:func:`_auroc_counts` of every row of per-group counts ``[R, G]`` (``from_count_rows``,
    :mod:`selbench.measure.riskcoverage`): a group not drawn adds nothing."""
    e = np.cumsum(wrong, axis=1)
    n_neg = e[:, -1]
    n_pos = drawn.sum(axis=1) - n_neg
    twice = np.einsum("ij,ij->i", drawn - wrong, 2 * (n_neg[:, None] - e) + wrong)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = twice / (2.0 * n_pos * n_neg)
    return np.where((n_pos == 0) | (n_neg == 0), np.nan, out)


def _fpr_count_rows(drawn: np.ndarray, wrong: np.ndarray, tpr: float = 0.95) -> np.ndarray:
    """:func:`_fpr_counts` of every row of per-group counts: a group not drawn repeats the
    previous point, so the first point reaching ``tpr`` is a drawn one's."""
    k, e = np.cumsum(drawn, axis=1), np.cumsum(wrong, axis=1)
    n_neg = e[:, -1]
    n_pos = k[:, -1] - n_neg
    with np.errstate(invalid="ignore", divide="ignore"):
        j = np.argmax((k - e) / n_pos[:, None] >= tpr, axis=1)
        out = e[np.arange(e.shape[0]), j] / n_neg
    return np.where((n_pos == 0) | (n_neg == 0), np.nan, out)


selector_auroc.from_count_rows = _auroc_count_rows  # type: ignore[attr-defined]
fpr_at_tpr.from_count_rows = _fpr_count_rows  # type: ignore[attr-defined]


def _nll_rows(confidence: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """:func:`nll` of every row of ``[R, k]`` arrays (``nll.batched``, the bootstrap's form)."""
    q = np.clip(confidence, EPS, 1.0 - EPS)
    return -np.mean(np.where(correct > 0, np.log(q), np.log1p(-q)), axis=1)


def _ece_equal_width_rows(confidence: np.ndarray, correct: np.ndarray, *, p: float = 1,
                          n_bins: int = 15) -> np.ndarray:
    """:func:`ece_equal_width` of every row of ``[R, k]`` arrays (``ece_equal_width.batched``):
    the same bins, their sums per row by one ``bincount`` over all rows."""
    R, k = confidence.shape
    if k == 0:
        return np.full(R, np.nan)
    edges = np.arange(1, n_bins + 1, dtype=np.float64) / n_bins
    idx = (np.searchsorted(edges, confidence, side="left")
           + np.arange(R)[:, None] * n_bins).ravel()
    size = R * n_bins
    counts = np.bincount(idx, minlength=size).reshape(R, n_bins).astype(np.float64)
    safe = np.maximum(counts, 1.0)
    conf_mean = np.bincount(idx, weights=confidence.ravel(), minlength=size).reshape(R, -1) / safe
    acc_mean = np.bincount(idx, weights=correct.ravel(), minlength=size).reshape(R, -1) / safe
    errors = np.where(counts > 0, np.abs(conf_mean - acc_mean) ** p, 0.0)
    return np.sum(counts / k * errors, axis=1) ** (1.0 / p)


def _ece_equal_width_prefixes(confidence: np.ndarray, correct: np.ndarray, counts: np.ndarray,
                              *, p: float = 1, n_bins: int = 15) -> np.ndarray:
    """``[R, len(counts)]``: :func:`ece_equal_width` of the leading ``counts[j]`` columns of
    every row (``ece_equal_width.prefixes``): an example's bin does not depend on the others,
    so the bins of nested prefixes are accumulated stretch by stretch."""
    R = confidence.shape[0]
    edges = np.arange(1, n_bins + 1, dtype=np.float64) / n_bins
    idx = np.searchsorted(edges, confidence, side="left") + np.arange(R)[:, None] * n_bins
    size = R * n_bins
    totals = np.zeros((3, size))
    out = np.full((R, len(counts)), np.nan)
    done = 0
    for j in np.argsort(counts, kind="stable").tolist():
        k = int(counts[j])
        if k > done:
            flat = idx[:, done:k].ravel()
            totals[0] += np.bincount(flat, minlength=size)
            totals[1] += np.bincount(flat, weights=confidence[:, done:k].ravel(), minlength=size)
            totals[2] += np.bincount(flat, weights=correct[:, done:k].ravel(), minlength=size)
            done = k
        if k == 0:
            continue
        n_b, conf_s, corr_s = (t.reshape(R, n_bins) for t in totals)
        safe = np.maximum(n_b, 1.0)
        errors = np.where(n_b > 0, np.abs(conf_s / safe - corr_s / safe) ** p, 0.0)
        out[:, j] = np.sum(n_b / k * errors, axis=1) ** (1.0 / p)
    return out


def _mce_bins(counts: np.ndarray, conf_mean: np.ndarray, acc_mean: np.ndarray) -> np.ndarray:
    """:func:`mce` of every row of equal-mass bin statistics ``[R, bins]`` (``mce.from_bins``:
    the bins the bootstrap of ECE₁ has already formed; empty bins are left out)."""
    return np.max(np.where(counts > 0, np.abs(conf_mean - acc_mean), -np.inf), axis=1)


nll.batched = _nll_rows  # type: ignore[attr-defined]
ece_equal_width.batched = _ece_equal_width_rows  # type: ignore[attr-defined]
ece_equal_width.prefixes = _ece_equal_width_prefixes  # type: ignore[attr-defined]
mce.from_bins = _mce_bins  # type: ignore[attr-defined]
