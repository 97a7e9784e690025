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

:func:`ece` weights bins by their share of the data and takes an absolute difference, where
the formula printed in the paper's Appendix A weights bins by ``1/|B|`` and assumes exactly
equal-mass bins. Inputs are converted to float64; the library computes float32 inputs in
float32, which differs from :func:`ece` by float32 rounding (about 1e-7).

**Debiased estimators** (``ece(..., debias=True)``, the library's; in
:mod:`selbench.measure.binning`). For ``p == 2``, ``unbiased_l2_ce`` (deterministic): the
squared bin error minus the binomial variance ``acc(1 - acc)/(|B_b| - 1)`` of each bin's
accuracy (bins with fewer than 2 examples count 0), weighted, clipped at 0, square-rooted.
For other ``p``, ``normal_debiased_ce``, which is *random*: twice the plug-in minus the mean
of 1000 plug-ins whose bin accuracies are redrawn from
``Normal(acc_b, sqrt(acc_b (1 - acc_b) / |B_b|))``; it needs every bin to hold at least 2
examples (ValueError otherwise).

**Selection (exact coverage).** One rule, used by every part of selbench that turns selector
scores into decisions (:func:`accept_mask`, :func:`selective_metrics`, the plots, the
``recalibration`` scheme's ``fit_on: accepted``): at coverage ``beta`` over ``n`` scores exactly
``k`` examples are accepted, the ``k`` highest scores, where

* ``k = ceil(beta * n)`` with ``beta`` read to a precision of ``1e-12``: ``k`` is the smallest
  integer with ``k >= n * (beta - 1e-12)``, clipped to ``[1, n]`` (:func:`accepted_counts`).
  Floating-point noise in ``beta`` (``0.55 * 100 == 55.00000000000001``) therefore cannot add
  an example: ``beta = 0.55, n = 100`` gives 55, ``beta = 0.8, n = 10`` gives 8, ``beta = 1``
  gives ``n``. With a Hoeffding guarantee (``delta``) ``k`` is instead the smallest count with
  ``k / n - eps >= beta`` (see :func:`accepted_counts`).
* ties among equal scores are broken by a seeded random permutation (:func:`selection_order`):
  ``pi = np.random.default_rng([seed, 0x71E5]).permutation(n)``, and among examples with equal
  scores the one that comes first in ``pi`` is accepted first. The order of all ``n`` examples
  is fixed once, so for a given seed the acceptance sets are deterministic and nested across
  ``beta`` (a larger ``beta`` accepts a superset), and the achieved coverage is exactly
  ``k / n`` even for binary or otherwise tied scores.

This replaces the paper's threshold rule ``scores >= np.quantile(scores, 1 - beta)`` (Sec. 4.4),
which accepts every example tied at the threshold: a selector with discrete scores (an oracle
scoring 0/1, Isolation Forest's tied scores) then over-covers, up to accepting everything.
:func:`thresholds` still reports the score ``tau`` of the ``k``-th accepted example.

**Selective metrics.** :func:`selective_metrics` computes every metric on the accepted examples
for every ``beta`` at once, and :func:`auc` summarises a metric-vs-beta curve as in the paper's
Sec. 5.2 (AUC over ``beta = 0.5, 0.55, ..., 1.0``, :data:`DEFAULT_BETAS`).
"""

from __future__ import annotations

import difflib
import math
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from selbench.measure.binning import (
    BUCKETED_MIN_N,
    bin_stats,
    bin_stats_bucketed,
    ece_from_stats,
    plugin_ce,
)
from selbench.measure.classic import CLASSIC_METRICS
from selbench.measure.guarantee import GUARANTEE_METRICS
from selbench.measure.rcstats import RC_METRICS
from selbench.measure.reliability import RELIABILITY_METRICS
from selbench.measure.riskcoverage import (
    augrc,
    aurc,
    coverage_at_risk,
    eaurc,
    risk_at_coverage,
    risk_coverage_curve,
)
from selbench.measure.smooth import SmoothReliability, classwise_ece, smece, smooth_reliability
from selbench.measure.validation import (
    as_float_1d,
    check_betas,
    check_confidence,
    check_correct,
    check_delta,
    check_n,
    check_n_bins,
    check_p,
    check_scores,
    check_seed,
)

__all__ = [
    "DEFAULT_BETAS",
    "SmoothReliability",
    "DEFAULT_COLUMNS",
    "METRICS",
    "MetricInfo",
    "accept_mask",
    "accepted_counts",
    "accuracy",
    "auc",
    "aurc",
    "augrc",
    "brier",
    "classwise_ece",
    "coverage_at_risk",
    "eaurc",
    "ece",
    "ece_sorted",
    "metric_info",
    "risk_at_coverage",
    "risk_coverage_curve",
    "selection_order",
    "selective_metrics",
    "smece",
    "smooth_reliability",
    "thresholds",
    "top_label",
]

#: Coverage levels at which the paper reports selective metrics and over which it computes
#: the AUC: 0.5, 0.55, ..., 1.0 (11 values, rounded to 2 decimals). Read-only.
DEFAULT_BETAS: np.ndarray = np.round(np.linspace(0.5, 1.0, 11), 2)
DEFAULT_BETAS.flags.writeable = False


class MetricInfo(NamedTuple):
    """One entry of the metric registry :data:`METRICS`: how the core computes, orders and shows
    a metric. Nothing else in selbench lists metrics, their labels or their directions: the
    leaderboard, the plots, the statistics and the JSON read them here."""

    #: column header (Markdown, plots)
    label: str
    #: the direction: True when a lower value is better
    lower_is_better: bool
    #: whether the leaderboard marks the best method in this column (coverage: no, it is set
    #: by the spec, not won)
    marked: bool
    #: ``"selective"``: measured on the accepted examples at each coverage β (and summarised by
    #: its AUC over β); ``"ranking"``: measured once per cell over all evaluation examples from
    #: the selector's scores (a whole risk-coverage curve), the same value at every β
    kind: str
    #: one line: what it is and the function that computes it
    summary: str
    #: a spec setting the metric needs (``"coverage_guarantee"``), ``"log_probs"`` (the
    #: recalibrated distribution: computed only where an experiment shows the column), or None
    needs: str | None = None


#: The metric registry, in leaderboard column order. Every cell holds every metric here but
#: those that ``need`` something the cell was not asked for (a
#: spec's ``metrics:`` list only chooses the columns shown); the keys are those of
#: :func:`cell_metrics`.
METRICS: Mapping[str, MetricInfo] = types.MappingProxyType(
    {
        "ece1": MetricInfo("ECE₁", True, True, "selective",
                           "top-label ECE, p = 1, 15 equal-mass bins (ece)"),
        "ece2": MetricInfo("ECE₂", True, True, "selective",
                           "top-label ECE, p = 2, 15 equal-mass bins (ece)"),
        "smece": MetricInfo("smECE", True, True, "selective",
                            "smooth ECE of Błasiok & Nakkiran 2024, as relplot.smECE (smece)"),
        "brier": MetricInfo("Brier", True, True, "selective",
                            "top-label Brier score (brier)"),
        "accuracy": MetricInfo("Acc.", False, True, "selective",
                               "accuracy of the accepted examples (accuracy)"),
        "coverage": MetricInfo("Coverage", False, False, "selective",
                               "achieved coverage k/n (exactly ⌈β·n⌉ accepted)"),
        "guaranteed_coverage": MetricInfo(
            "Guaranteed cov.", False, False, "selective",
            "achieved coverage − Hoeffding ε (accepted_counts with delta)",
            needs="coverage_guarantee"),
        "aurc": MetricInfo("AURC", True, True, "ranking",
                           "area under the risk-coverage curve, ties merged (aurc)"),
        "eaurc": MetricInfo("E-AURC", True, True, "ranking",
                            "AURC minus the AURC of an oracle of equal accuracy (eaurc)"),
        "augrc": MetricInfo("AUGRC", True, True, "ranking",
                            "area under the generalized risk-coverage curve (augrc)"),
        # NLL, MCE, equal-width and debiased ECE, the selector's AUROC and FPR@95TPR, and
        # the full-distribution NLL and class-wise ECE: entries and functions in measure/classic.py
        **{key: MetricInfo(*entry) for key, entry in CLASSIC_METRICS.items()},
        # fd-shifts' statistics, the signed calibration error, a risk guarantee's results
        # (issue 27): entries in measure/rcstats.py, measure/reliability.py, measure/guarantee.py
        **{key: MetricInfo(*entry) for key, entry in {
            **RC_METRICS, **RELIABILITY_METRICS, **GUARANTEE_METRICS}.items()},
    }
)

#: The paper's leaderboard columns: a spec without a ``metrics:`` list shows these (and the
#: guaranteed coverage when it asks for a coverage guarantee).
DEFAULT_COLUMNS: tuple[str, ...] = ("ece1", "ece2", "brier", "accuracy", "coverage")


def metric_info(key: str) -> MetricInfo:
    """The registry entry of ``key``; a ValueError with the closest registered names if none."""
    try:
        return METRICS[key]
    except KeyError:
        raise ValueError(unknown_metric(key)) from None


def unknown_metric(key: Any) -> str:
    """The message for a name that is not a registered metric ("did you mean ...")."""
    close = difflib.get_close_matches(str(key).lower(), list(METRICS), n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown metric {key!r}{hint} (registered: {', '.join(METRICS)})"


# --------------------------------------------------------------------------- public metrics
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
    return ece_from_stats(*bin_stats(sorted_conf, sorted_correct, n_bins), p, debias, rng)


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

    Where the formula printed in the paper's Appendix A differs we follow the library, which
    produced the paper's numbers; inputs are converted to float64 (see the module docstring).

    Args:
        confidence: top-label confidence ``[N]`` in [0, 1].
        correct: whether the top-label prediction is right, 0/1 or boolean ``[N]``.
        p: the exponent, >= 1 (1 for ECE_1, 2 for ECE_2).
        n_bins: number of equal-mass bins before tie merging (the paper: 15).
        debias: use the library's debiased estimators instead of the plug-in:
            ``unbiased_l2_ce`` for ``p == 2``, otherwise the *random* ``normal_debiased_ce``,
            which needs at least 2 examples in every bin (see the module docstring).
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
    p = check_p(p)
    n_bins = check_n_bins(n_bins)
    conf = check_confidence(confidence)
    corr = check_correct(correct, conf.shape[0])
    if conf.shape[0] == 0:
        return float("nan")
    if conf.shape[0] >= BUCKETED_MIN_N:  # linear time, no sort (same bins, same value)
        return ece_from_stats(*bin_stats_bucketed(conf, corr, n_bins), p, bool(debias), rng)
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
    p = check_p(p)
    n_bins = check_n_bins(n_bins)
    conf = check_confidence(sorted_confidence, "sorted_confidence")
    corr = check_correct(correct, conf.shape[0])
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
    conf = check_confidence(confidence)
    corr = check_correct(correct, conf.shape[0])
    return _brier(conf, corr)


def _brier(conf: np.ndarray, corr: np.ndarray) -> float:
    if conf.shape[0] == 0:
        return float("nan")
    return float(np.mean(np.square(conf - corr)))


def accuracy(correct: Any) -> float:
    """Fraction of correct predictions, ``mean(correct)`` for 0/1 ``correct``; ``nan`` when empty."""
    corr = as_float_1d(correct, "correct")
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
#: Second entry of the seed of the tie-breaking permutation of :func:`selection_order`,
#: ``np.random.default_rng([seed, TIE_BREAK_STREAM])`` (a stream of its own: it does not
#: coincide with the runner's or a plugin's use of the same seed).
TIE_BREAK_STREAM = 0x71E5
#: Precision to which a coverage level ``beta`` is read by :func:`accepted_counts`: ``k`` is
#: the smallest integer with ``k >= n * (beta - _BETA_TOL)``, so floating-point noise in
#: ``beta`` (about 1e-16) never adds an example.
_BETA_TOL = 1e-12


def _order(sc: np.ndarray, seed: int) -> np.ndarray:
    """:func:`selection_order` on validated scores."""
    pi = np.random.default_rng([seed, TIE_BREAK_STREAM]).permutation(sc.shape[0])
    # a stable sort of the scores in the order pi: equal scores keep their order in pi
    return pi[np.argsort(-sc[pi], kind="stable")].astype(np.int64, copy=False)


def count_accepted(
    n: int, b: np.ndarray, delta: Any, stacklevel: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`accepted_counts` on a validated ``n`` and ``betas``; an infeasible guarantee's
    warning points ``stacklevel`` frames above the caller."""
    if delta is None:
        k = np.ceil(n * (b - _BETA_TOL)).astype(np.int64)
        return np.clip(k, 1, n), None
    delta = check_delta(delta)
    eps = math.sqrt(math.log(2.0 / delta) / (2.0 * n))
    # k = smallest number of accepted examples with k/n - eps >= beta (exact integer search
    # around the float estimate, so floating-point rounding cannot pick the wrong k).
    k = np.ceil((b + eps) * n).astype(np.int64)
    k = np.where((k - 1) / n - eps >= b, k - 1, k)
    k = np.where(k / n - eps < b, k + 1, k)
    infeasible = k > n
    k = np.clip(k, 1, n)
    if infeasible.any():
        warnings.warn(
            f"coverage cannot be guaranteed at beta = {b[infeasible].tolist()} with "
            f"n = {n} scores and delta = {delta} (eps = {eps:.4g}): accepting everything, "
            f"guaranteed coverage {1.0 - eps:.4g}",
            RuntimeWarning,
            stacklevel=stacklevel + 1,
        )
    return k, k / n - eps


def selection_order(scores: Any, *, seed: int = 0) -> np.ndarray:
    """The order in which examples are accepted: best (highest score) first.

    Ties among equal scores are broken by a seeded random permutation
    ``pi = np.random.default_rng([seed, 0x71E5]).permutation(n)``: among examples with equal
    scores, the one that comes first in ``pi`` comes first (equivalently, the position in
    ``pi`` is the secondary sort key). At coverage ``beta`` the core accepts the first
    ``k`` examples of this order (:func:`accepted_counts`), so acceptance sets are
    deterministic for a given seed and nested across ``beta``; other seeds break ties
    differently (scores without ties give the same order for every seed).

    Args:
        scores: selector scores ``[n]``, finite, higher = accept first (``n`` may be 0).
        seed: non-negative integer seed of the tie-break (the runner passes the cell's seed).

    Returns:
        int64 permutation of ``range(n)``.
    """
    return _order(check_scores(scores), check_seed(seed))


def accepted_counts(
    n: int, betas: Any = DEFAULT_BETAS, *, delta: float | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """How many of ``n`` examples are accepted at each coverage level ``beta``.

    Without ``delta``: ``k = ceil(beta * n)``, with ``beta`` read to a precision of
    ``1e-12``, i.e. ``k`` is the smallest integer with ``k >= n * (beta - 1e-12)``, clipped
    to ``[1, n]``. Floating-point noise in ``beta`` therefore cannot add an example
    (``0.55 * 100`` is ``55.00000000000001`` in floating point, yet ``beta = 0.55, n = 100``
    gives 55; ``beta = 0.8, n = 10`` gives 8; ``beta = 1`` gives ``n``), and the achieved
    coverage ``k / n`` is the smallest multiple of ``1 / n`` that is at least ``beta``: it
    exceeds ``beta`` by less than ``1 / n``.

    With ``delta`` (Hoeffding bound, paper Sec. 4.4): the true coverage on the distribution
    the ``n`` scores were drawn from lies within ``eps = sqrt(log(2 / delta) / (2 n))`` of the
    empirical coverage ``k / n`` with probability at least ``1 - delta``, so ``k`` is the
    smallest count with ``k / n - eps >= beta``. If ``beta + eps > 1`` no count meets the
    guarantee: ``k = n`` (everything is accepted), its guaranteed coverage ``1 - eps`` is below
    ``beta``, and a ``RuntimeWarning`` names those betas.

    Args:
        n: number of scores, ``n >= 1``.
        betas: target coverages in (0, 1] (default :data:`DEFAULT_BETAS`).
        delta: failure probability in (0, 1] for the high-probability version, or ``None``.

    Returns:
        ``(k, guaranteed)``: int64 counts over ``betas``, and with ``delta`` the float64
        guaranteed coverage ``k / n - eps`` (else ``None``).
    """
    return count_accepted(check_n(n), check_betas(betas), delta, stacklevel=2)


def accept_mask(
    scores: Any, beta: float, *, delta: float | None = None, seed: int = 0
) -> np.ndarray:
    """Boolean mask of the accepted examples at coverage ``beta``: exactly ``k`` are True.

    ``k`` is :func:`accepted_counts` (``ceil(beta * n)``, or the Hoeffding count with
    ``delta``); the accepted examples are the first ``k`` of :func:`selection_order` (the
    ``k`` highest scores, ties broken by the permutation seeded with ``seed``). This is the
    rule :func:`selective_metrics` measures and the ``recalibration`` scheme fits on.

    Args:
        scores: selector scores ``[n]``, finite, ``n >= 1``.
        beta: target coverage in (0, 1].
        delta: Hoeffding failure probability in (0, 1], or ``None``.
        seed: non-negative integer seed of the tie-break.
    """
    sc = check_scores(scores)
    if np.ndim(beta) != 0:
        raise ValueError(f"beta must be a single coverage level; got {beta!r}")
    b = check_betas([beta])
    seed = check_seed(seed)
    n = check_n(sc.shape[0])
    k, _ = count_accepted(n, b, delta, stacklevel=2)
    mask = np.zeros(n, dtype=bool)
    mask[_order(sc, seed)[: int(k[0])]] = True
    return mask


def thresholds(
    scores: Any, betas: Any = DEFAULT_BETAS, *, delta: float | None = None, seed: int = 0
) -> tuple[np.ndarray, np.ndarray | None]:
    """Score ``tau`` of the last accepted example at each coverage ``beta``.

    The core accepts exactly ``k`` examples (:func:`accepted_counts`; with ``delta`` the
    Hoeffding count), the first ``k`` of :func:`selection_order`; ``tau`` is the ``k``-th
    highest score, i.e. the lowest accepted score. It is bookkeeping only: the core selects by
    the order, not by ``tau``. Where scores tie at ``tau``, ``scores >= tau`` accepts more than
    ``k`` examples (all those tied at ``tau``), while the core accepts only as many of them
    as are needed to reach ``k``, chosen by the seeded tie-break. ``tau`` itself does not
    depend on ``seed`` (accepted, and validated, for a uniform signature).

    Args:
        scores: selector scores ``[n]``, finite, higher = accept first; ``n >= 1``.
        betas: target coverages in (0, 1] (default :data:`DEFAULT_BETAS`).
        delta: failure probability in (0, 1] for the high-probability version, or ``None``.
        seed: non-negative integer seed of the tie-break.

    Returns:
        ``(tau, guaranteed)``: float64 arrays over ``betas``. ``guaranteed`` is ``k / n - eps``
        (the coverage guaranteed with probability ``1 - delta``, see :func:`accepted_counts`),
        or ``None`` when ``delta`` is ``None``. One sort of the scores serves every ``beta``.
    """
    sc = check_scores(scores)
    b = check_betas(betas)
    check_seed(seed)
    n = check_n(sc.shape[0])
    k, guaranteed = count_accepted(n, b, delta, stacklevel=2)
    return np.sort(sc)[n - k], guaranteed


def selective_metrics(
    scores: Any,
    confidence: Any,
    correct: Any,
    betas: Any = DEFAULT_BETAS,
    *,
    n_bins: int = 15,
    delta: float | None = None,
    seed: int = 0,
    extra: Mapping[str, Callable[[np.ndarray, np.ndarray], float]] | None = None,
) -> dict[str, np.ndarray]:
    """Every metric on the accepted examples, for each coverage level ``beta``.

    For each ``beta`` exactly ``k`` examples are accepted (:func:`accepted_counts`, ``delta``
    passed on): the first ``k`` of :func:`selection_order` with ``seed``, i.e. the mask
    :func:`accept_mask` gives. On them we compute :func:`ece` with ``p=1`` and ``p=2``
    (plug-in, ``n_bins`` bins), :func:`brier` and :func:`accuracy`, identical to the last bit
    to masking with :func:`accept_mask` and calling those once per ``beta``, but with one
    selection order and one sort of the confidences for all betas.

    Args:
        scores: selector scores ``[N]`` (higher = accept first), finite.
        confidence: (recalibrated) top-label confidence ``[N]`` in [0, 1].
        correct: 0/1 correctness ``[N]``.
        betas: target coverages in (0, 1] (default :data:`DEFAULT_BETAS`).
        n_bins: equal-mass bins for the ECE (the paper: 15).
        delta: Hoeffding failure probability, or ``None`` (see :func:`accepted_counts`).
        seed: non-negative integer seed of the tie-break (see :func:`selection_order`).

    Returns:
        float64 arrays over ``betas`` under the keys ``ece1``, ``ece2``, ``brier``,
        ``accuracy``, ``coverage`` (achieved: exactly ``k / N``), ``threshold`` (``tau``, the
        lowest accepted score, see :func:`thresholds`) and, when ``delta`` is given,
        ``guaranteed_coverage`` (``k / N - eps``), and one array per key of ``extra``:
        ``extra[key](confidence, correct)`` of the accepted examples in ascending confidence
        order (a canonical order: the value does not depend on the tie-break seed even in its
        last bit; how the runner adds the smooth ECE).
    """
    n_bins = check_n_bins(n_bins)
    conf = check_confidence(confidence)
    corr = check_correct(correct, conf.shape[0])
    sc = check_scores(scores, conf.shape[0])
    b = check_betas(betas)
    seed = check_seed(seed)
    n = check_n(conf.shape[0])
    k, guaranteed = count_accepted(n, b, delta, stacklevel=2)
    order = _order(sc, seed)
    out = _metrics_at_counts(conf, corr, order, k, n_bins, extra)
    out["threshold"] = sc[order[k - 1]]
    if guaranteed is not None:
        out["guaranteed_coverage"] = guaranteed
    return out


def _metrics_at_counts(
    conf: np.ndarray, corr: np.ndarray, order: np.ndarray, k: np.ndarray, n_bins: int,
    extra: Mapping[str, Callable[[np.ndarray, np.ndarray], float]] | None,
) -> dict[str, np.ndarray]:
    """The metrics of :func:`selective_metrics` (all but ``threshold`` and
    ``guaranteed_coverage``) on the first ``k[j]`` examples of ``order``, for each ``j``.

    The result is identical, to the last bit, to masking with :func:`accept_mask` and
    calling :func:`ece`, :func:`brier` and :func:`accuracy` once per ``beta``, but sorts the
    confidences once for all betas: the accepted examples in confidence order are a boolean
    mask over the pre-sorted confidences.
    """
    n = conf.shape[0]
    rank = np.empty(n, dtype=np.int64)  # rank[i]: position of example i in the order
    rank[order] = np.arange(n)
    by_conf = np.argsort(conf, kind="stable")
    conf_sorted, corr_sorted = conf[by_conf], corr[by_conf]
    rank_sorted = rank[by_conf]  # ranks in confidence order: masks come out sorted
    out = {key: np.empty(k.shape[0]) for key in ("ece1", "ece2", "brier", "accuracy", "coverage")}
    for j, kj in enumerate(k):
        accept = rank < kj
        accept_sorted = rank_sorted < kj
        counts, conf_mean, acc_mean = bin_stats(
            conf_sorted[accept_sorted], corr_sorted[accept_sorted], n_bins
        )  # kj >= 1: never empty
        out["ece1"][j] = plugin_ce(counts, conf_mean, acc_mean, 1.0)
        out["ece2"][j] = plugin_ce(counts, conf_mean, acc_mean, 2.0)
        out["brier"][j] = _brier(conf[accept], corr[accept])
        out["accuracy"][j] = _accuracy(corr[accept])
        out["coverage"][j] = kj / n
        if extra:
            c_acc, y_acc = conf_sorted[accept_sorted], corr_sorted[accept_sorted]
            for key, fn in extra.items():
                out.setdefault(key, np.empty(k.shape[0]))[j] = fn(c_acc, y_acc)
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
    b = as_float_1d(betas, "betas")
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
