"""Metrics of selective recalibration: calibration error, Brier score, accuracy, coverage.

Everything here takes plain numpy arrays and returns floats or float64 arrays. The
definitions are the project's contract: every result selbench reports is computed by these
functions, and the tests check them against the reference implementation to 1e-12.

**Calibration error.** The paper (Appendix A) computes ECE_1 and ECE_2 with the
``uncertainty-calibration`` package of Kumar et al. (2019), i.e.
``calibration.lower_bound_scaling_ce(probs, labels, p=p, debias=False, num_bins=15,
binning_scheme=calibration.get_equal_bins, mode="top-label")``. :func:`ece` reproduces that
call exactly (same bins, same weights, same estimator; only the floating-point summation
order inside a bin differs), vectorised: one sort, or for large N no sort at all (the bin
edges need only the order statistics at the part boundaries, found through a histogram of
value buckets, and every example is then binned in one pass; about 100 times faster than the
library on a million examples, ``perf/bench_ece.py``). Where the library
and the formula printed in the paper's Appendix A disagree we follow the library, because it
produced the paper's numbers:

* the paper weights every bin by ``1/|B|`` (a plain average over bins); the library weights bin
  ``b`` by ``|B_b| / N``, the fraction of examples it holds;
* the paper speaks of ``m`` equal-mass bins; the library splits the sorted confidences into
  ``m`` parts the way :func:`numpy.array_split` does (sizes differ by at most one when ``N`` is
  not a multiple of ``m``), then merges parts whose boundary falls inside a run of tied
  confidences, so with ties there are fewer, unequal bins;
* the paper's formula has no absolute value (its sign would matter for odd ``q``); the library
  takes ``|mean confidence - accuracy|``;
* with fewer than ``m`` examples the library uses ``N`` bins.

**Selective metrics.** For a coverage level ``beta`` the accepted examples are those whose
selector score is at least ``tau = np.quantile(scores, 1 - beta)`` (paper Sec. 4.4);
:func:`selective_metrics` computes every metric on the accepted examples for every ``beta`` at
once, and :func:`auc` summarises a metric-vs-beta curve as in the paper's Sec. 5.2 (AUC over
``beta = 0.5, 0.55, ..., 1.0``, :data:`DEFAULT_BETAS`).
"""

from __future__ import annotations

import math
import types
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "DEFAULT_BETAS",
    "METRICS",
    "MetricInfo",
    "accuracy",
    "auc",
    "brier",
    "ece",
    "ece_sorted",
    "selective_metrics",
    "thresholds",
    "top_label",
]

#: Coverage levels at which the paper reports selective metrics and over which it computes
#: the AUC: 0.5, 0.55, ..., 1.0 (11 values, rounded to 2 decimals). Read-only.
DEFAULT_BETAS: np.ndarray = np.round(np.linspace(0.5, 1.0, 11), 2)
DEFAULT_BETAS.flags.writeable = False

#: Number of normal resamples used by the debiased ECE for p != 2 (the library's default).
_RESAMPLES = 1000


class MetricInfo(NamedTuple):
    """How a metric is shown on the leaderboard."""

    label: str
    lower_is_better: bool


#: Metric key -> :class:`MetricInfo`, in leaderboard column order. The keys are those of
#: :func:`selective_metrics` (which also returns ``threshold`` and, with ``delta``,
#: ``guaranteed_coverage``: bookkeeping, not leaderboard metrics).
METRICS: Mapping[str, MetricInfo] = types.MappingProxyType(
    {
        "ece1": MetricInfo("ECE₁", True),
        "ece2": MetricInfo("ECE₂", True),
        "brier": MetricInfo("Brier", True),
        "accuracy": MetricInfo("Acc.", False),
        "coverage": MetricInfo("Coverage", False),
    }
)


# --------------------------------------------------------------------------- validation
def _as_float_1d(x: Any, name: str) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a 1-D numeric array; got {type(x).__name__}") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array; got shape {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN at index {int(np.flatnonzero(np.isnan(arr))[0])}")
    return arr


def _check_confidence(x: Any, name: str = "confidence") -> np.ndarray:
    arr = _as_float_1d(x, name)
    bad = (arr < 0.0) | (arr > 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must lie in [0, 1]; {name}[{i}] = {arr[i]!r}")
    return arr


def _check_correct(x: Any, n: int, name: str = "correct") -> np.ndarray:
    arr = _as_float_1d(x, name)
    if arr.shape[0] != n:
        raise ValueError(
            f"{name} must have the same length as confidence ({n}); got {arr.shape[0]}"
        )
    bad = (arr != 0.0) & (arr != 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must be 0/1 (or boolean); {name}[{i}] = {arr[i]!r}")
    return arr


def _check_p(p: Any) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise ValueError(f"p must be a number >= 1; got {p!r}")
    if not (math.isfinite(p) and p >= 1):
        raise ValueError(f"p must be a finite number >= 1; got {p!r}")
    return float(p)


def _check_n_bins(n_bins: Any) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer; got {n_bins!r}")
    return int(n_bins)


def _check_betas(betas: Any) -> np.ndarray:
    try:
        arr = np.atleast_1d(np.asarray(betas, dtype=np.float64))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"betas must be a 1-D array of coverage levels; got {betas!r}") from exc
    arr = _as_float_1d(arr, "betas")
    if arr.size == 0:
        raise ValueError("betas must hold at least one coverage level")
    bad = ~((arr > 0.0) & (arr <= 1.0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"betas must lie in (0, 1]; betas[{i}] = {arr[i]!r}")
    return arr


def _check_scores(scores: Any, n: int | None = None) -> np.ndarray:
    arr = _as_float_1d(scores, "scores")
    if not np.isfinite(arr).all():
        i = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise ValueError(f"scores must be finite; scores[{i}] = {arr[i]!r}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(
            f"scores must have the same length as confidence ({n}); got {arr.shape[0]}"
        )
    return arr


# --------------------------------------------------------------------------- binning
def _part_starts(n: int, n_bins: int) -> np.ndarray:
    """Index of the first value of parts ``1 .. m-1`` when ``n >= 1`` sorted values are split
    into ``m = min(n_bins, n)`` parts as ``np.array_split`` does (the first ``n mod m`` parts
    hold one value more)."""
    parts = min(n_bins, n)
    size, extra = divmod(n, parts)
    return np.arange(1, parts) * size + np.minimum(np.arange(1, parts), extra)


def _equal_mass_edges(sorted_conf: np.ndarray, n_bins: int) -> np.ndarray:
    """Upper bin edges of ``calibration.get_equal_bins`` for ascending confidences (N >= 1).

    The sorted values are split like ``np.array_split`` into ``min(n_bins, N)`` parts (the
    first ``N % parts`` parts hold one extra value); each edge is the midpoint between the
    last value of a part and the first value of the next; 1.0 closes the last bin; equal
    edges (from ties across a part boundary) are merged.
    """
    starts = _part_starts(sorted_conf.shape[0], n_bins)
    mids = (sorted_conf[starts - 1] + sorted_conf[starts]) / 2.0
    return np.unique(np.append(mids, 1.0))


def _bin_stats(
    sorted_conf: np.ndarray, sorted_correct: np.ndarray, n_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bin sizes, mean confidence and accuracy per equal-mass bin (N >= 1, conf ascending).

    A value ``v`` goes to bin ``searchsorted(edges, v, side="left")``, i.e. bin ``b`` holds
    ``edges[b-1] < v <= edges[b]``; as the values are sorted, each bin is a contiguous run.
    Empty bins have mean 0 (they get weight 0).
    """
    edges = _equal_mass_edges(sorted_conf, n_bins)
    ends = np.searchsorted(sorted_conf, edges, side="right")
    counts = np.diff(ends, prepend=0)
    nonempty = counts > 0
    starts = (ends - counts)[nonempty]
    conf_mean = np.zeros(counts.shape[0])
    acc_mean = np.zeros(counts.shape[0])
    conf_mean[nonempty] = np.add.reduceat(sorted_conf, starts) / counts[nonempty]
    acc_mean[nonempty] = np.add.reduceat(sorted_correct, starts) / counts[nonempty]
    return counts, conf_mean, acc_mean


#: Value buckets of :func:`_bin_stats_bucketed`: ``floor(confidence * 2**16)``, exact in binary
#: floating point, so bucket ``j`` holds exactly the values in ``[j / 2**16, (j + 1) / 2**16)``
#: (and bucket ``2**16`` the values equal to 1.0).
_BUCKETS = 1 << 16
#: From this many examples on, :func:`ece` bins through value buckets instead of sorting
#: (same bins; the buckets cost a fixed ~4 ms, a sort of 2**16 values about as much).
_BUCKETED_MIN_N = 1 << 16


def _bin_stats_bucketed(
    conf: np.ndarray, corr: np.ndarray, n_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_bin_stats` without sorting, through a histogram of value buckets (same bins).

    1. Bucket every confidence by ``floor(confidence * 2**16)`` and accumulate count, sum of
       confidences and sum of correctness per bucket (three ``bincount``s).
    2. The order statistics that define the bin edges (ranks ``starts - 1`` and ``starts``)
       lie in buckets found from the cumulative counts; only the values in those few
       buckets are gathered and partitioned to get the exact order statistics.
    3. An edge lies between two consecutive order statistics, so it falls in one of those
       selected buckets or in an empty one: every other bucket lies inside a single bin and
       contributes its totals at once; the values of the selected buckets are placed one by
       one with ``searchsorted``.

    Exact for any input (heavily tied or concentrated confidences only make the gathered
    set larger); the per-bin sums are added in a different order than the library's, which
    changes the result by float64 rounding only.
    """
    starts = _part_starts(conf.shape[0], n_bins)
    nb = _BUCKETS + 1
    bucket = (conf * _BUCKETS).astype(np.intp)  # conf >= 0: truncation is floor
    count_b = np.bincount(bucket, minlength=nb)
    conf_b = np.bincount(bucket, weights=conf, minlength=nb)
    corr_b = np.bincount(bucket, weights=corr, minlength=nb)
    selected = np.zeros(nb, dtype=bool)
    if starts.size:
        ranks = np.unique(np.concatenate([starts - 1, starts]))
        cum = np.cumsum(count_b)
        rank_bucket = np.searchsorted(cum, ranks, side="right")
        selected[rank_bucket] = True
        sel_counts = np.where(selected, count_b, 0)
        # rank within the gathered values = rank - values in unselected buckets below
        unselected_below = (cum - count_b) - (np.cumsum(sel_counts) - sel_counts)
        local = ranks - unselected_below[rank_bucket]
        take = selected[bucket]
        cand_conf, cand_corr = conf[take], corr[take]
        stats = np.partition(cand_conf, local)[local]
        lo = stats[np.searchsorted(ranks, starts - 1)]
        hi = stats[np.searchsorted(ranks, starts)]
        mids = (lo + hi) / 2.0
    else:
        cand_conf = cand_corr = np.empty(0)
        mids = np.empty(0)
    edges = np.unique(np.append(mids, 1.0))
    m = edges.shape[0]
    unselected = ~selected
    bucket_bin = np.searchsorted(edges, np.arange(nb)[unselected] / _BUCKETS, side="left")
    cand_bin = np.searchsorted(edges, cand_conf, side="left")
    counts = np.bincount(bucket_bin, weights=count_b[unselected], minlength=m).astype(np.int64)
    counts += np.bincount(cand_bin, minlength=m)
    conf_sum = np.bincount(bucket_bin, weights=conf_b[unselected], minlength=m)
    conf_sum += np.bincount(cand_bin, weights=cand_conf, minlength=m)
    corr_sum = np.bincount(bucket_bin, weights=corr_b[unselected], minlength=m)
    corr_sum += np.bincount(cand_bin, weights=cand_corr, minlength=m)
    nonempty = counts > 0
    conf_mean = np.zeros(m)
    acc_mean = np.zeros(m)
    conf_mean[nonempty] = conf_sum[nonempty] / counts[nonempty]
    acc_mean[nonempty] = corr_sum[nonempty] / counts[nonempty]
    return counts, conf_mean, acc_mean


def _plugin_ce(counts: np.ndarray, conf_mean: np.ndarray, acc_mean: np.ndarray, p: float) -> float:
    """``calibration.plugin_ce``: (sum_b |B_b|/N * |conf_b - acc_b|^p)^(1/p)."""
    weights = counts / counts.sum()
    errors = np.where(counts > 0, np.abs(conf_mean - acc_mean) ** p, 0.0)
    return float(np.dot(weights, errors) ** (1.0 / p))


def _unbiased_l2_ce(counts: np.ndarray, conf_mean: np.ndarray, acc_mean: np.ndarray) -> float:
    """``calibration.unbiased_l2_ce``: the plug-in squared error per bin minus the variance of
    its accuracy, ``acc_b (1 - acc_b) / (|B_b| - 1)`` (bins with fewer than 2 examples count
    0), weighted by ``|B_b|/N``, clipped at 0, square-rooted."""
    weights = counts / counts.sum()
    big = counts >= 2
    denom = np.where(big, counts - 1.0, 1.0)
    errors = np.where(
        big, np.abs(conf_mean - acc_mean) ** 2 - acc_mean * (1.0 - acc_mean) / denom, 0.0
    )
    return float(max(float(np.dot(weights, errors)), 0.0) ** 0.5)


def _normal_debiased_ce(
    counts: np.ndarray, conf_mean: np.ndarray, acc_mean: np.ndarray, p: float, rng: Any
) -> float:
    """``calibration.normal_debiased_ce``: 2 * plug-in - mean over resamples of the plug-in
    with each bin's accuracy redrawn from Normal(acc_b, sqrt(acc_b (1 - acc_b) / |B_b|))."""
    if counts.min() <= 1:
        raise ValueError(
            "the debiased ECE for p != 2 needs at least 2 examples in every bin "
            f"(smallest bin: {int(counts.min())}); use fewer bins, more data or debias=False"
        )
    gen = rng if isinstance(rng, np.random.RandomState) else np.random.default_rng(rng)
    weights = counts / counts.sum()
    std = np.sqrt(acc_mean * (1.0 - acc_mean) / counts)
    plugin = _plugin_ce(counts, conf_mean, acc_mean, p)
    samples = gen.normal(loc=acc_mean, scale=std, size=(_RESAMPLES, counts.shape[0]))
    resampled = np.power(np.abs(samples - conf_mean) ** p @ weights, 1.0 / p)
    return float(2.0 * plugin - np.mean(resampled))


def _ece_from_sorted(
    sorted_conf: np.ndarray,
    sorted_correct: np.ndarray,
    p: float,
    n_bins: int,
    debias: bool,
    rng: Any,
) -> float:
    if sorted_conf.shape[0] == 0:
        return float("nan")
    return _ece_from_stats(*_bin_stats(sorted_conf, sorted_correct, n_bins), p, debias, rng)


def _ece_from_stats(
    counts: np.ndarray, conf_mean: np.ndarray, acc_mean: np.ndarray, p: float, debias: bool,
    rng: Any,
) -> float:
    if not debias:
        return _plugin_ce(counts, conf_mean, acc_mean, p)
    if p == 2:
        return _unbiased_l2_ce(counts, conf_mean, acc_mean)
    return _normal_debiased_ce(counts, conf_mean, acc_mean, p, rng)


# --------------------------------------------------------------------------- public metrics
def ece(
    confidence: Any,
    correct: Any,
    *,
    p: float = 1,
    n_bins: int = 15,
    debias: bool = False,
    rng: Any = None,
) -> float:
    """Top-label expected calibration error ECE_p with equal-mass bins (the paper's ECE_1/ECE_2).

    Exactly ``calibration.lower_bound_scaling_ce(probs, labels, p=p, debias=debias,
    num_bins=n_bins, binning_scheme=calibration.get_equal_bins, mode="top-label")`` of the
    ``uncertainty-calibration`` package, which the paper used, given the top-label
    ``confidence`` and 0/1 ``correct`` that the library derives from ``probs`` and ``labels``
    (see :func:`top_label`):

    1. Sort the confidences. Split them into ``m = min(n_bins, N)`` consecutive parts as
       ``np.array_split`` does (the first ``N mod m`` parts hold one value more).
    2. Bin edges: the midpoint between the last value of each part and the first value of the
       next, then 1.0; equal edges are merged, so a run of tied confidences that straddles a
       part boundary ends up in one bin (ties never split; there may be fewer than ``m`` bins).
    3. Each example goes to bin ``b = searchsorted(edges, confidence, side="left")``, i.e.
       ``edges[b-1] < confidence <= edges[b]``.
    4. ``ECE_p = (sum_b |B_b|/N * |mean confidence in B_b - accuracy in B_b|^p)^(1/p)``,
       empty bins contributing 0.

    This weights bins by their share of the data and takes an absolute difference, where the
    formula printed in the paper's Appendix A weights bins by ``1/|B|`` and assumes exactly
    equal-mass bins; we follow the library, which produced the paper's numbers (see the module
    docstring). Inputs are converted to float64; the library computes float32 inputs in
    float32, which differs from this function by float32 rounding (about 1e-7).

    Args:
        confidence: top-label confidence ``[N]`` in [0, 1].
        correct: whether the top-label prediction is right, 0/1 or boolean ``[N]``.
        p: the exponent, >= 1 (1 for ECE_1, 2 for ECE_2).
        n_bins: number of equal-mass bins before tie merging (the paper: 15).
        debias: use the library's debiased estimators instead of the plug-in. For ``p == 2``
            that is ``unbiased_l2_ce`` (deterministic): the squared bin error minus the
            binomial variance ``acc(1 - acc)/(|B_b| - 1)`` of each bin's accuracy (bins with
            fewer than 2 examples count 0), weighted, clipped at 0, square-rooted. For other
            ``p`` it is ``normal_debiased_ce``, which is *random*: twice the plug-in minus the
            mean of 1000 plug-ins whose bin accuracies are redrawn from
            ``Normal(acc_b, sqrt(acc_b (1 - acc_b) / |B_b|))``; it needs every bin to hold at
            least 2 examples (ValueError otherwise).
        rng: randomness for ``debias=True`` with ``p != 2`` only: a ``numpy.random.Generator``,
            a seed, or ``None`` (fresh entropy: results then vary between calls). A legacy
            ``numpy.random.RandomState`` is used as is, which reproduces the library's draws
            from ``np.random`` after ``np.random.seed(s)`` when given ``RandomState(s)``.

    Returns:
        ECE_p as a float; ``nan`` when ``N == 0``.

    Raises:
        ValueError: arrays not 1-D or of different lengths, NaN, confidence outside [0, 1],
            correct not 0/1, ``p < 1``, ``n_bins < 1``.
    """
    p = _check_p(p)
    n_bins = _check_n_bins(n_bins)
    conf = _check_confidence(confidence)
    corr = _check_correct(correct, conf.shape[0])
    if conf.shape[0] == 0:
        return float("nan")
    if conf.shape[0] >= _BUCKETED_MIN_N:  # linear time, no sort (same bins, same value)
        return _ece_from_stats(*_bin_stats_bucketed(conf, corr, n_bins), p, bool(debias), rng)
    order = np.argsort(conf, kind="stable")
    return _ece_from_sorted(conf[order], corr[order], p, n_bins, bool(debias), rng)


def ece_sorted(
    sorted_confidence: Any,
    correct: Any,
    *,
    p: float = 1,
    n_bins: int = 15,
    debias: bool = False,
    rng: Any = None,
) -> float:
    """:func:`ece` for confidences already sorted in ascending order (no sort is done).

    ``correct[i]`` must belong to ``sorted_confidence[i]``. Gives exactly the same value as
    ``ece(sorted_confidence, correct, ...)``; use it to compute many ECEs on subsets of one
    sorted array (a boolean mask over a sorted array stays sorted), as
    :func:`selective_metrics` does. Raises ValueError if the confidences are not ascending.
    """
    p = _check_p(p)
    n_bins = _check_n_bins(n_bins)
    conf = _check_confidence(sorted_confidence, "sorted_confidence")
    corr = _check_correct(correct, conf.shape[0])
    if conf.shape[0] > 1 and (np.diff(conf) < 0).any():
        i = int(np.flatnonzero(np.diff(conf) < 0)[0])
        raise ValueError(
            f"sorted_confidence must be in ascending order; "
            f"sorted_confidence[{i}] = {conf[i]!r} > sorted_confidence[{i + 1}] = {conf[i + 1]!r}"
        )
    return _ece_from_sorted(conf, corr, p, n_bins, bool(debias), rng)


def top_label(probs: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Top-label confidence and correctness from class probabilities.

    Args:
        probs: class probabilities ``[N, K]``.
        labels: true classes ``[N]``, integers in ``[0, K)``.

    Returns:
        ``(confidence, correct)``, both float64 ``[N]``: ``max_k probs[:, k]`` and 1.0 where
        ``argmax_k probs[:, k] == labels`` (the first index among tied maxima, as
        ``np.argmax`` and the ``calibration`` library choose), else 0.0.
    """
    try:
        pr = np.asarray(probs, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError("probs must be a numeric [N, K] array") from exc
    if pr.ndim != 2 or pr.shape[1] == 0:
        raise ValueError(f"probs must have shape [N, K] with K >= 1; got {pr.shape}")
    lab = np.asarray(labels)
    if lab.ndim != 1 or lab.shape[0] != pr.shape[0]:
        raise ValueError(f"labels must have shape [{pr.shape[0]}]; got {lab.shape}")
    if lab.size and not np.issubdtype(lab.dtype, np.integer):
        raise ValueError(f"labels must be integers; got dtype {lab.dtype}")
    if lab.size and (lab.min() < 0 or lab.max() >= pr.shape[1]):
        raise ValueError(f"labels must lie in [0, {pr.shape[1]}); got [{lab.min()}, {lab.max()}]")
    if pr.shape[0] == 0:
        return np.empty(0), np.empty(0)
    import torch  # one pass for max and argmax (numpy needs two, and is slow along rows)

    with warnings.catch_warnings():  # read-only arrays (memory maps) are only read here
        warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
        values, index = torch.max(torch.from_numpy(np.ascontiguousarray(pr)), dim=1)
    conf, pred = values.numpy(), index.numpy()  # first index among tied maxima, as np.argmax
    if np.isnan(conf).any():  # a NaN anywhere in a row makes its max NaN
        raise ValueError("probs contains NaN")
    return conf, (pred == lab).astype(np.float64)


def brier(confidence: Any, correct: Any) -> float:
    """Top-label Brier score ``mean((confidence - correct)^2)``; ``nan`` when empty.

    The squared error of the top-label confidence against 0/1 correctness, as the
    ``calibration`` library's ``eval_top_mse`` (not the multi-class Brier score over all K
    probabilities).
    """
    conf = _check_confidence(confidence)
    corr = _check_correct(correct, conf.shape[0])
    return _brier(conf, corr)


def _brier(conf: np.ndarray, corr: np.ndarray) -> float:
    if conf.shape[0] == 0:
        return float("nan")
    return float(np.mean(np.square(conf - corr)))


def accuracy(correct: Any) -> float:
    """Fraction of correct predictions, ``mean(correct)`` for 0/1 ``correct``; ``nan`` when empty."""
    corr = _as_float_1d(correct, "correct")
    bad = (corr != 0.0) & (corr != 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"correct must be 0/1 (or boolean); correct[{i}] = {corr[i]!r}")
    return _accuracy(corr)


def _accuracy(corr: np.ndarray) -> float:
    if corr.shape[0] == 0:
        return float("nan")
    return float(np.mean(corr))


# --------------------------------------------------------------------------- selection
def thresholds(
    scores: Any, betas: Any = DEFAULT_BETAS, *, delta: float | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Selection threshold ``tau`` for each target coverage ``beta``; accept ``scores >= tau``.

    Without ``delta``: ``tau = np.quantile(scores, 1 - beta)`` (numpy's default, linearly
    interpolated quantile), as in the paper's Sec. 4.4. All scores tied at ``tau`` are
    accepted, so the achieved coverage ``mean(scores >= tau)`` can exceed ``beta`` where scores
    tie; where ``tau`` falls between two distinct scores it can also fall short of ``beta``,
    by less than ``1/n``. :func:`selective_metrics` reports the achieved coverage.

    With ``delta`` (Hoeffding bound, paper Sec. 4.4): the true coverage on the distribution the
    ``n`` scores were drawn from lies within ``eps = sqrt(log(2 / delta) / (2 n))`` of the
    empirical coverage with probability at least ``1 - delta``. ``tau`` is lowered until
    ``empirical coverage - eps >= beta``: it is the largest score whose acceptance fraction
    ``mean(scores >= tau)`` is at least ``beta + eps``. If ``beta + eps > 1`` the guarantee
    cannot be met with ``n`` examples: everything is accepted (``tau = min(scores)``), the
    returned guaranteed coverage ``1 - eps`` is below ``beta``, and a ``RuntimeWarning`` names
    those betas.

    Args:
        scores: selector scores ``[n]``, finite, higher = accept first; ``n >= 1``.
        betas: target coverages in (0, 1] (default :data:`DEFAULT_BETAS`).
        delta: failure probability in (0, 1] for the high-probability version, or ``None``.

    Returns:
        ``(tau, guaranteed)``: float64 arrays over ``betas``. ``guaranteed`` is the achieved
        empirical coverage minus ``eps`` (the coverage guaranteed with probability
        ``1 - delta``), or ``None`` when ``delta`` is ``None``. One sort of the scores serves
        every ``beta``.
    """
    s = np.sort(_check_scores(scores))
    b = _check_betas(betas)
    n = s.shape[0]
    if n == 0:
        raise ValueError("scores must hold at least one value to choose a threshold")
    if delta is None:
        return np.quantile(s, 1.0 - b), None
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.integer, np.floating)):
        raise ValueError(f"delta must be a number in (0, 1]; got {delta!r}")
    if not (0.0 < delta <= 1.0):
        raise ValueError(f"delta must lie in (0, 1]; got {delta!r}")
    eps = math.sqrt(math.log(2.0 / delta) / (2.0 * n))
    # k = smallest number of accepted examples with k/n - eps >= beta (exact integer search
    # around the float estimate, so floating-point rounding cannot pick the wrong k).
    k = np.ceil((b + eps) * n).astype(np.int64)
    k = np.where((k - 1) / n - eps >= b, k - 1, k)
    k = np.where(k / n - eps < b, k + 1, k)
    infeasible = k > n
    k = np.clip(k, 1, n)
    tau = s[n - k]
    accepted = n - np.searchsorted(s, tau, side="left")
    guaranteed = accepted / n - eps
    if infeasible.any():
        warnings.warn(
            f"coverage cannot be guaranteed at beta = {b[infeasible].tolist()} with "
            f"n = {n} scores and delta = {delta} (eps = {eps:.4g}): accepting everything, "
            f"guaranteed coverage {1.0 - eps:.4g}",
            RuntimeWarning,
            stacklevel=2,
        )
    return tau, guaranteed


def selective_metrics(
    scores: Any,
    confidence: Any,
    correct: Any,
    betas: Any = DEFAULT_BETAS,
    *,
    n_bins: int = 15,
    delta: float | None = None,
) -> dict[str, np.ndarray]:
    """Every metric on the accepted examples, for each coverage level ``beta``.

    For each ``beta``, ``tau`` comes from :func:`thresholds` (``delta`` is passed on), the
    accepted examples are ``scores >= tau``, and on them we compute :func:`ece` with ``p=1``
    and ``p=2`` (plug-in, ``n_bins`` bins), :func:`brier` and :func:`accuracy`. The result is
    identical, to the last bit, to masking and calling those functions once per ``beta``, but
    sorts the scores once and the confidences once for all betas: the accepted examples in
    confidence order are a boolean mask over the pre-sorted confidences.

    Args:
        scores: selector scores ``[N]`` (higher = accept first), finite.
        confidence: (recalibrated) top-label confidence ``[N]`` in [0, 1].
        correct: 0/1 correctness ``[N]``.
        betas: target coverages in (0, 1] (default :data:`DEFAULT_BETAS`).
        n_bins: equal-mass bins for the ECE (the paper: 15).
        delta: Hoeffding failure probability, or ``None`` (see :func:`thresholds`).

    Returns:
        float64 arrays over ``betas`` under the keys ``ece1``, ``ece2``, ``brier``,
        ``accuracy``, ``coverage`` (achieved: fraction accepted), ``threshold`` (``tau``) and,
        when ``delta`` is given, ``guaranteed_coverage``.
    """
    n_bins = _check_n_bins(n_bins)
    conf = _check_confidence(confidence)
    corr = _check_correct(correct, conf.shape[0])
    sc = _check_scores(scores, conf.shape[0])
    tau, guaranteed = thresholds(sc, betas, delta=delta)
    n = conf.shape[0]
    order = np.argsort(conf, kind="stable")
    conf_sorted, corr_sorted = conf[order], corr[order]
    accept_sorted_scores = sc[order]  # scores in confidence order: masks come out sorted
    out = {key: np.empty(tau.shape[0]) for key in ("ece1", "ece2", "brier", "accuracy", "coverage")}
    for j, t in enumerate(tau):
        accept = sc >= t
        accept_sorted = accept_sorted_scores >= t
        sub_conf, sub_corr = conf_sorted[accept_sorted], corr_sorted[accept_sorted]
        if sub_conf.shape[0]:
            counts, conf_mean, acc_mean = _bin_stats(sub_conf, sub_corr, n_bins)
            out["ece1"][j] = _plugin_ce(counts, conf_mean, acc_mean, 1.0)
            out["ece2"][j] = _plugin_ce(counts, conf_mean, acc_mean, 2.0)
        else:  # pragma: no cover - tau never exceeds max(scores)
            out["ece1"][j] = out["ece2"][j] = np.nan
        out["brier"][j] = _brier(conf[accept], corr[accept])
        out["accuracy"][j] = _accuracy(corr[accept])
        out["coverage"][j] = accept.sum() / n
    out["threshold"] = np.asarray(tau, dtype=np.float64)
    if guaranteed is not None:
        out["guaranteed_coverage"] = guaranteed
    return out


def auc(betas: Any, values: Any) -> float:
    """Area under a metric-vs-coverage curve, normalised by the coverage range.

    ``trapezoid(values, betas) / (max(betas) - min(betas))``: the average height of the
    piecewise-linear curve through the points ``(beta, value)``, in the metric's own units (a
    constant curve has AUC equal to that constant). The paper reports this over
    ``beta in [0.5, 1.0]`` at steps of 0.05 (:data:`DEFAULT_BETAS`). The points are sorted by
    ``beta`` first; a NaN value gives NaN.

    Args:
        betas: at least two distinct, finite coverage levels ``[M]``.
        values: the metric at each level ``[M]``.
    """
    b = _as_float_1d(betas, "betas")
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.shape[0] != b.shape[0]:
        raise ValueError(f"values must have shape [{b.shape[0]}] like betas; got {v.shape}")
    if b.shape[0] < 2:
        raise ValueError("auc needs at least two coverage levels")
    if not np.isfinite(b).all():
        raise ValueError("betas must be finite")
    order = np.argsort(b, kind="stable")
    b, v = b[order], v[order]
    if (np.diff(b) == 0).any():
        raise ValueError("betas must be distinct")
    area = float(np.sum(np.diff(b) * (v[1:] + v[:-1]) / 2.0))
    return area / float(b[-1] - b[0])
