"""Equal-mass binning and the binned calibration errors computed from it.

The bins of the ``uncertainty-calibration`` package's ``get_equal_bins`` (Kumar et al. 2019)
and its three estimators of the binned calibration error (the plug-in ``plugin_ce``, the
debiased ``unbiased_l2_ce`` and ``normal_debiased_ce``), on plain float64 arrays and without
input checks: the primitives that :func:`selbench.measure.metrics.ece`, the selective metrics,
:func:`selbench.measure.smooth.classwise_ece` and the reliability diagrams share. How the bins
are made, and where the library and the paper differ, is described in
:mod:`selbench.measure.metrics`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "BUCKETED_MIN_N",
    "bin_stats",
    "bin_stats_bucketed",
    "ece_from_stats",
    "plugin_ce",
]

#: Number of normal resamples used by the debiased ECE for p != 2 (the library's default).
_RESAMPLES = 1000


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


def bin_stats(
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


#: Value buckets of :func:`bin_stats_bucketed`: ``floor(confidence * 2**16)``, exact in binary
#: floating point, so bucket ``j`` holds exactly the values in ``[j / 2**16, (j + 1) / 2**16)``
#: (and bucket ``2**16`` the values equal to 1.0).
_BUCKETS = 1 << 16
#: From this many examples on, :func:`selbench.measure.metrics.ece` bins through value buckets instead of sorting
#: (same bins; the buckets cost a fixed ~4 ms, a sort of 2**16 values about as much).
BUCKETED_MIN_N = 1 << 16


def bin_stats_bucketed(
    conf: np.ndarray, corr: np.ndarray, n_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`bin_stats` without sorting, through a histogram of value buckets (same bins).

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
    selected, cand_conf, cand_corr, mids = _boundary_candidates(conf, corr, bucket, count_b,
                                                                starts)
    edges = np.unique(np.append(mids, 1.0))
    return _bucketed_bins(edges, selected, count_b, conf_b, corr_b, cand_conf, cand_corr)


def _boundary_candidates(
    conf: np.ndarray, corr: np.ndarray, bucket: np.ndarray, count_b: np.ndarray,
    starts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Step 2 of :func:`bin_stats_bucketed`: the buckets holding the order statistics at the
    part boundaries (a boolean mask over the buckets), the confidences and correctness of
    the examples in them (the candidates), and the midpoints between the order statistics
    (the bin edges before 1.0 and merging)."""
    selected = np.zeros(count_b.shape[0], dtype=bool)
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
    return selected, cand_conf, cand_corr, mids


def _bucketed_bins(
    edges: np.ndarray, selected: np.ndarray, count_b: np.ndarray, conf_b: np.ndarray,
    corr_b: np.ndarray, cand_conf: np.ndarray, cand_corr: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 3 of :func:`bin_stats_bucketed`: bin sizes, mean confidence and accuracy per bin,
    from the totals of the unselected buckets (each inside one bin) and the candidates
    placed one by one."""
    nb = count_b.shape[0]
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


def plugin_ce(counts: np.ndarray, conf_mean: np.ndarray, acc_mean: np.ndarray, p: float) -> float:
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
    plugin = plugin_ce(counts, conf_mean, acc_mean, p)
    samples = gen.normal(loc=acc_mean, scale=std, size=(_RESAMPLES, counts.shape[0]))
    resampled = np.power(np.abs(samples - conf_mean) ** p @ weights, 1.0 / p)
    return float(2.0 * plugin - np.mean(resampled))



def ece_from_stats(
    counts: np.ndarray, conf_mean: np.ndarray, acc_mean: np.ndarray, p: float, debias: bool,
    rng: Any,
) -> float:
    """The calibration error of binned statistics (:func:`bin_stats`): the plug-in, or with
    ``debias`` the library's debiased estimator (``unbiased_l2_ce`` for ``p == 2``, else the
    random ``normal_debiased_ce`` drawing from ``rng``)."""
    if not debias:
        return plugin_ce(counts, conf_mean, acc_mean, p)
    if p == 2:
        return _unbiased_l2_ce(counts, conf_mean, acc_mean)
    return _normal_debiased_ce(counts, conf_mean, acc_mean, p, rng)

