"""Bootstrap confidence intervals over the evaluation examples (``scipy.stats.bootstrap``).

**What is resampled.** The unit is one *evaluation example*: everything the core knows about
it travels together (its selector score, its recalibrated confidence, its correctness; in
:func:`bootstrap_ci` the same row of every array passed). A resample draws ``n`` examples
with replacement from the ``n`` evaluation examples and re-measures the statistic on them.
The fitted recalibrator and selector are held fixed: nothing is refitted, so the interval
describes the uncertainty that comes from having measured *one fitted model* on a finite
evaluation set (how much the number would move on another evaluation set of the same size
from the same distribution). It says nothing about the variability of the fit itself (the
fitting sample, training randomness): that is what the leaderboard's interval over seeds
(:mod:`selbench.measure.stats`) measures, and the two are reported side by side.

**Seeding.** Every draw comes from ``np.random.default_rng([seed, 0xB007])`` (a stream of its
own: it does not coincide with the tie-break permutation ``[seed, 0x71E5]`` of
:func:`selbench.measure.metrics.selection_order`, the fitting sample's ``[seed, 0x5E1EC7]`` or a
plugin's use of the same seed), handed to ``scipy.stats.bootstrap`` as its ``rng``: the draws
are scipy's (``n_resamples`` rows of ``n`` indices, ``rng.integers(0, n, (batch, n))`` per
batch), so an interval is reproducible for a given seed, changes with the seed, and does not
depend on ``batch`` (the integers are drawn as one stream however it is cut into batches).

**Method.** :func:`bootstrap_ci` is a thin wrapper of ``scipy.stats.bootstrap`` for any
statistic of the examples, with scipy's three methods (default BCa, the bias-corrected and
accelerated percentile interval). :func:`selective_intervals` gives percentile intervals of
all the metrics of one leaderboard cell at once, re-measuring the cell on each resample exactly
as :func:`selbench.measure.evaluate.measure` does (exact coverage ``k = ceil(beta * n)`` of the
resample, ties broken by the cell's seed, equal-mass ECE bins with tied confidences merged),
through a vectorised implementation checked against the plain one to 1e-12.

**bootstrap_ci in scipy's terms.** ``bootstrap_ci(statistic, *data, ...)`` equals
``scipy.stats.bootstrap(data, statistic, paired=True, confidence_level=level,
n_resamples=n_resamples, method=method, rng=np.random.default_rng([seed, 0xB007]))``
(scipy resamples an index array in paired mode; so does this function, then hands
``statistic`` the rows of the original arrays, so their dtypes are kept and ``data``
may hold arrays of any shape with the examples along the first axis, e.g. class
probabilities ``[N, K]``).

Vectorised statistics: with ``vectorized=True`` (or ``None`` and a statistic with an
``axis`` parameter, as scipy detects it) the statistic is called once per batch with 1-D
``data`` resampled into ``[batch, N]`` arrays and ``axis=-1``; otherwise it is called once
per resample on 1-D (or ``[N, ...]``) arrays, as selbench's metrics expect. BCa also
evaluates the statistic on the ``N`` leave-one-out jackknife samples (``N`` more calls).

Degenerate cases of :func:`bootstrap_ci`, handled deliberately rather than by scipy's NaN:

* ``N == 1``: every resample is the one example, the bootstrap distribution is a point
  mass, and ``low == high == statistic(*data)`` (scipy itself refuses fewer than 2).
* A constant bootstrap distribution (e.g. accuracy when every example is correct): BCa is
  undefined (scipy warns ``DegenerateDataWarning`` and returns NaN); that warning is
  suppressed and ``low == high ==`` the constant, which is what the percentile and basic
  intervals give too.
* BCa undefined for a non-constant distribution (the statistic's value lies outside its
  bootstrap distribution, or the jackknife values are all equal): the percentile interval
  of the same bootstrap distribution, with a ``RuntimeWarning`` saying so. This is common
  for the plug-in ECE: a resample repeats examples, which makes its binned estimate more
  miscalibrated, so on small samples every resample's ECE can exceed the sample's.
* The statistic returned NaN on some resample: that output's interval is NaN, with a
  ``RuntimeWarning`` giving the count (never a silent NaN).

**Why selective_intervals is percentile, not BCa.** BCa's acceleration needs the jackknife,
the whole cell re-measured on each of the ``n`` leave-one-out sets, i.e. ``n`` more
evaluations where the interval itself needs ``n_resamples`` (200). Measured at ``n = 3000`` with 11 betas
(one core of a shared, busy machine): the jackknife of the four binned metrics alone takes
about 0.6 s per cell where the 200 resamples take 0.035 s, 17 times more, and it would
call every ``extra`` and ``ranking`` callable 15 times as often; too much for a
leaderboard of many cells. Moreover BCa is often undefined for the plug-in ECE of a
well-calibrated model: a resample repeats examples, which adds binning noise, so most or
all resamples are more miscalibrated than the sample (all 200 in a test at ``n = 3000``
with ECE₁ = 0.02), and the bias correction is extreme or infinite (see the degenerate
cases above). The percentile interval needs only the resamples and is what the
leaderboard reports. The same upward bias means that for a well-calibrated model the
ECE's percentile interval can lie above the measured value: it shows how much the
estimate varies over evaluation sets, not a bias-corrected range for the true ECE.

**Vectorised extra and ranking metrics.** A callable of :func:`selective_intervals`'s
``extra`` or ``ranking`` is called once per resample (and ``beta``), which can dominate the
cost: the four binned metrics take about 0.03 s per cell of 3000
examples, 11 betas and 200 resamples, while ``extra`` costs 2200 calls of the callable and
``ranking`` 200 (about 5 microseconds each of overhead; a 7 ms smooth ECE costs 15 s).
A callable may therefore carry an optional vectorised form as its attribute ``batched``:
``fn.batched(confidence, correct) -> [R]`` (or ``fn.batched(scores, correct)`` for
``ranking``) taking ``[R, m]`` arrays, row ``r`` being what ``fn`` would get for resample
``r`` (the accepted examples in selection order, or all examples in resample order); it
must equal ``fn`` row by row (the plain loop, used by the tests, calls ``fn`` itself).
The ``batched`` forms of the ``ranking`` callables all get the same two arrays (gathered
once per batch of resamples: at ``n = 3000`` each ``[200, 3000]`` gather costs about 1 ms),
read-only; :func:`selbench.measure.riskcoverage.aurc`, ``eaurc`` and ``augrc`` also share
one sort of them.

A ``ranking`` callable that is a function of the merged-tie risk–coverage curve alone may
instead carry ``fn.from_count_rows(drawn, wrong) -> [R]`` and/or ``fn.from_counts(k, e)``
(see :mod:`selbench.measure.riskcoverage`): the resamples then need no sort at all. A
resample draws examples of the evaluation set, so its curve is the cumulative counts, per
group of equal scores of the evaluation set, of the examples (and wrong ones) it drew — two
``bincount`` s per block of resamples — and every such metric is computed from those
``[R, G]`` tables at once (``from_count_rows``) or from each row's curve (``from_counts``).
All the registry's ranking metrics have them (the achievable AURC per row: its hull);
measured (issue 28) on a cell of 4,000 examples, 200 resamples, the shortened paper stage's
intervals 350 -> 159 s of profiled time (one thread), with the vectorised signed CE.

**Reading an interval.** ``(low, high)`` at ``level`` 0.95 is a 95% bootstrap confidence
interval of the metric's value on the *population* of evaluation examples, for this fitted
model: for the percentile method the 2.5% and 97.5% quantiles (scipy's ``stats.quantile``,
linear interpolation) of the metric over the resamples.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from selbench.measure.resampled import BINNED, IntervalRequest, ResampledCell
from selbench.measure.validation import (
    check_betas,
    check_confidence,
    check_correct,
    check_delta,
    check_n,
    check_scores,
    check_seed,
)

__all__ = ["METHODS", "Interval", "IntervalRequest", "bootstrap_ci", "selective_intervals"]

#: Second entry of the seed of every bootstrap draw, ``np.random.default_rng([seed, 0xB007])``.
_BOOTSTRAP_STREAM = 0xB007
#: The methods of ``scipy.stats.bootstrap`` (case does not matter).
METHODS: tuple[str, ...] = ("percentile", "basic", "BCa")
#: Most index entries (resamples x examples) handed to a statistic in one call: bounds the
#: memory of a batch (and of BCa's jackknife, ``n`` rows of ``n - 1``) to some tens of MB.
_BATCH_ENTRIES = 1 << 21
#: index entries per thread below which a statistic call is not split among threads
_THREAD_ENTRIES = 1 << 17


def bootstrap_threads() -> int:
    """Threads that measure the resamples of a bootstrap statistic call: the CPUs this
    process may use, at most 8, or ``SELBENCH_BOOTSTRAP_THREADS``. The intervals do not
    depend on it (rows are measured independently)."""
    env = os.environ.get("SELBENCH_BOOTSTRAP_THREADS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError as exc:
            raise ValueError(
                f"SELBENCH_BOOTSTRAP_THREADS must be a positive integer, got {env!r}") from exc
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


class Interval(NamedTuple):
    """A confidence interval: floats, or arrays shaped like the statistic's value."""

    low: Any
    high: Any


# --------------------------------------------------------------------------- validation
def _check_level(level: Any) -> float:
    if isinstance(level, bool) or not isinstance(level, (int, float, np.integer, np.floating)):
        raise ValueError(f"level must be a number in (0, 1); got {level!r}")
    if not (0.0 < float(level) < 1.0):
        raise ValueError(f"level must lie strictly between 0 and 1; got {level!r}")
    return float(level)


def _check_resamples(n_resamples: Any) -> int:
    if (isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer))
            or n_resamples < 1):
        raise ValueError(f"n_resamples must be an integer >= 1; got {n_resamples!r}")
    return int(n_resamples)


def _check_batch(batch: Any) -> int | None:
    if batch is None:
        return None
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch must be a positive integer or None; got {batch!r}")
    return int(batch)


def _check_method(method: Any) -> str:
    """The canonical spelling of a scipy bootstrap method; did-you-mean otherwise."""
    lower = {m.lower(): m for m in METHODS}
    if isinstance(method, str) and method.lower() in lower:
        return lower[method.lower()]
    close = difflib.get_close_matches(str(method).lower(), list(lower), n=1, cutoff=0.4)
    hint = f"; did you mean {lower[close[0]]!r}?" if close else ""
    valid = ", ".join(repr(m) for m in METHODS)
    raise ValueError(f"unknown bootstrap method {method!r}{hint} (valid: {valid})")


def _default_batch(n: int) -> int:
    return max(1, _BATCH_ENTRIES // max(n, 1))


def _takes_axis(statistic: Callable[..., Any]) -> bool:
    try:
        return "axis" in inspect.signature(statistic).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False


# --------------------------------------------------------------------------- bootstrap_ci
def bootstrap_ci(
    statistic: Callable[..., Any],
    *data: Any,
    level: float = 0.95,
    n_resamples: int = 1000,
    method: str = "BCa",
    seed: int = 0,
    batch: int | None = None,
    vectorized: bool | None = None,
) -> Interval:
    """Bootstrap confidence interval of ``statistic(*data)`` over the examples.

    A thin wrapper of ``scipy.stats.bootstrap(data, statistic, paired=True, ...)``: the
    examples (row ``i`` of every array in ``data``) are resampled together, with
    replacement, ``n_resamples`` times, and the interval is computed from the statistic's
    values on the resamples. Works for any metric of selbench, e.g.
    ``bootstrap_ci(selbench.measure.metrics.ece, conf, correct)`` or
    ``bootstrap_ci(lambda c, y: ece(c, y, p=2), conf, correct)``. What it equals in scipy's
    terms, vectorised statistics, and the degenerate cases (one example, a constant
    bootstrap distribution, BCa undefined, NaN values), handled deliberately rather than by
    scipy's NaN: see the module docstring.

    Args:
        statistic: ``statistic(*arrays) -> float`` (or a fixed-shape array: one interval per
            entry); with ``vectorized``, ``statistic(*arrays, axis=-1)`` over ``[batch, N]``.
        *data: one or more arrays with the same number ``N >= 1`` of examples along axis 0.
        level: confidence level in (0, 1).
        n_resamples: number of resamples, an integer >= 1.
        method: ``"percentile"``, ``"basic"`` or ``"BCa"`` (any case).
        seed: non-negative integer; the draws come from
            ``np.random.default_rng([seed, 0xB007])``.
        batch: resamples per statistic call (memory ``O(batch * N)``); ``None``: as many as
            keep a batch under about 2 million index entries. Does not change the result.
        vectorized: whether the statistic takes ``axis`` and ``[batch, N]`` arrays (see the
            module docstring); ``None`` detects an ``axis`` parameter.

    Returns:
        :class:`Interval` ``(low, high)``: floats for a scalar statistic, else float64 arrays
        of the statistic's shape.
    """
    if not callable(statistic):
        raise TypeError(f"statistic must be callable; got {type(statistic).__name__}")
    level = _check_level(level)
    n_resamples = _check_resamples(n_resamples)
    method = _check_method(method)
    seed = check_seed(seed)
    batch = _check_batch(batch)
    if vectorized not in (None, True, False):
        raise ValueError(f"vectorized must be True, False or None; got {vectorized!r}")
    arrays, vectorized = _check_data(statistic, data, vectorized)
    stat = _index_statistic(statistic, arrays, vectorized)
    n = arrays[0].shape[0]
    if n == 1:  # every resample is the one example: a point mass
        value = stat(np.zeros(1, dtype=np.intp))
        return _interval(value, value.copy())
    return _interval(*_scipy_interval(stat, n, level, n_resamples, method, seed, batch))


def _check_data(
    statistic: Callable[..., Any], data: tuple[Any, ...], vectorized: bool | None
) -> tuple[list[np.ndarray], bool]:
    """The data arrays of :func:`bootstrap_ci` (checked: paired, at least one example) and
    whether the statistic is vectorised."""
    if not data:
        raise ValueError("bootstrap_ci needs at least one data array")
    arrays = [np.asarray(d) for d in data]
    for j, a in enumerate(arrays):
        if a.ndim == 0:
            raise ValueError(f"data[{j}] must be an array of examples; got a scalar")
    n = arrays[0].shape[0]
    for j, a in enumerate(arrays[1:], 1):
        if a.shape[0] != n:
            raise ValueError(
                f"all data arrays must hold the same number of examples (paired); "
                f"data[0] has {n}, data[{j}] has {a.shape[0]}"
            )
    if n == 0:
        raise ValueError("bootstrap_ci needs at least one example")
    if vectorized is None:
        vectorized = _takes_axis(statistic)
    if vectorized and any(a.ndim != 1 for a in arrays):
        raise ValueError("a vectorized statistic needs 1-D data arrays (one entry per example)")
    return arrays, vectorized


def _index_statistic(
    statistic: Callable[..., Any], arrays: list[np.ndarray], vectorized: bool
) -> Callable[..., np.ndarray]:
    """The statistic of resampled indices that scipy is given: ``statistic`` of the rows
    ``i`` of the original arrays (their dtypes kept), the resamples along the last axis."""

    def stat(i: np.ndarray, axis: int = -1) -> np.ndarray:
        i = np.asarray(i)
        if vectorized:
            return np.asarray(statistic(*(a[i] for a in arrays), axis=-1), dtype=np.float64)
        if i.ndim == 1:
            return np.asarray(statistic(*(a[i] for a in arrays)), dtype=np.float64)
        rows = i.reshape(-1, i.shape[-1])
        vals = np.stack(
            [np.asarray(statistic(*(a[r] for a in arrays)), dtype=np.float64) for r in rows],
            axis=-1,
        )  # [*value shape, rows]: scipy wants the resamples last
        return vals.reshape(vals.shape[:-1] + i.shape[:-1])

    return stat


def _scipy_interval(
    stat: Callable[..., np.ndarray], n: int, level: float, n_resamples: int, method: str,
    seed: int, batch: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` of ``scipy.stats.bootstrap`` over the indices of ``n >= 2`` examples,
    its NaN intervals repaired by :func:`_repair_nan` (warnings point at the caller of
    :func:`bootstrap_ci`)."""
    from scipy.stats import DegenerateDataWarning, bootstrap

    rng = np.random.default_rng([seed, _BOOTSTRAP_STREAM])
    kwargs = dict(vectorized=True, paired=False, axis=0, confidence_level=level,
                  batch=batch if batch is not None else _default_batch(n))
    with warnings.catch_warnings():  # NaN intervals are inspected below
        warnings.simplefilter("ignore", DegenerateDataWarning)
        # BCa's own 0/0 and inf/inf on the way to a NaN interval (not the statistic's warnings)
        warnings.filterwarnings("ignore", category=RuntimeWarning,
                                module=r"scipy\.stats\._resampling")
        res = bootstrap((np.arange(n),), stat, n_resamples=n_resamples, method=method,
                        rng=rng, **kwargs)
    low = np.array(res.confidence_interval.low, dtype=np.float64)
    high = np.array(res.confidence_interval.high, dtype=np.float64)
    if (np.isnan(low) | np.isnan(high)).any():
        low, high = _repair_nan(res, method, stat, n, rng, kwargs)
    return low, high


def _repair_nan(
    res: Any, method: str, stat: Callable[..., np.ndarray], n: int, rng: np.random.Generator,
    kwargs: dict[str, Any],
) -> tuple[np.ndarray, np.ndarray]:
    """scipy's interval ``res`` where it is NaN repaired, as the module docstring says: the
    constant of a constant bootstrap distribution, else the percentile interval of the same
    resamples with a warning, or NaN with a warning when the statistic was NaN. The warnings
    point at the caller of :func:`bootstrap_ci`."""
    from scipy.stats import DegenerateDataWarning, bootstrap

    low = np.array(res.confidence_interval.low, dtype=np.float64)
    high = np.array(res.confidence_interval.high, dtype=np.float64)
    bad = np.isnan(low) | np.isnan(high)
    dist = np.asarray(res.bootstrap_distribution, dtype=np.float64)
    has_nan = np.isnan(dist).any(axis=-1)
    constant = ~has_nan & (dist.max(axis=-1) == dist.min(axis=-1))
    fix = bad & constant
    low = np.where(fix, dist[..., 0], low)
    high = np.where(fix, dist[..., 0], high)
    fallback = bad & ~constant & ~has_nan
    if fallback.any():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateDataWarning)
            pct = bootstrap((np.arange(n),), stat, n_resamples=0, method="percentile",
                            bootstrap_result=res, rng=rng, **kwargs).confidence_interval
        low = np.where(fallback, pct.low, low)
        high = np.where(fallback, pct.high, high)
        why = ("its value lies outside the bootstrap distribution, or the jackknife "
               "values are all equal" if method == "BCa" else "its value is NaN")
        warnings.warn(
            f"the {method} interval is undefined for {int(fallback.sum())} of "
            f"{fallback.size} output(s) of the statistic ({why}): the percentile "
            "interval of the same resamples is returned instead",
            RuntimeWarning, stacklevel=4,
        )
    if (bad & has_nan).any():
        count = int(np.isnan(dist).any(axis=tuple(range(dist.ndim - 1))).sum())
        warnings.warn(
            f"the statistic returned NaN on {count} of {dist.shape[-1]} resamples: "
            "its interval is NaN",
            RuntimeWarning, stacklevel=4,
        )
    return low, high


def _interval(low: np.ndarray, high: np.ndarray) -> Interval:
    if np.ndim(low) == 0:
        return Interval(float(low), float(high))
    return Interval(np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64))


def _check_callables(mapping: Any, what: str) -> dict[str, Callable[..., Any]]:
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping):
        raise ValueError(f"{what} must be a mapping name -> callable; got {type(mapping).__name__}")
    for key, fn in mapping.items():
        if not isinstance(key, str) or not callable(fn):
            raise ValueError(f"{what} must map names to callables; got {key!r}: {fn!r}")
        if key in BINNED:
            raise ValueError(f"{what} name {key!r} clashes with a metric computed here")
    return dict(mapping)


def selective_intervals(
    scores: Any, confidence: Any, correct: Any, betas: Any, **options: Any,
) -> dict[str, dict[str, Any]]:
    """Percentile bootstrap intervals of every metric of one leaderboard cell.

    What is asked is an :class:`IntervalRequest`: pass one as ``betas`` (and no options),
    or the coverage levels and the request's other fields as keyword options
    (``n_resamples``, ``level``, ``seed``, ``delta``, ``selects``, ``extra``, ``ranking``;
    an unknown option is a ``TypeError`` naming it).

    One resample draws ``n`` of the ``n`` evaluation examples with replacement (score,
    confidence and correctness together; ``scipy.stats.bootstrap`` with
    ``rng=np.random.default_rng([seed, 0xB007])`` draws the index rows) and re-measures the
    cell on it exactly as :func:`selbench.measure.evaluate.measure` would: at each ``beta`` exactly
    ``k`` of the resample's ``n`` examples are accepted (``k = ceil(beta * n)``, or the
    Hoeffding count with ``delta``: :func:`selbench.measure.metrics.accepted_counts`), the highest
    scores first, ties (duplicated examples always tie) broken by the permutation of the
    resample's positions seeded by ``seed`` (:func:`selbench.measure.metrics.selection_order`); ECE₁
    and ECE₂ with 15 equal-mass bins and tied confidences merged, Brier score and accuracy on
    them. With ``selects=False`` (a selector that does not select) every example is accepted
    at every ``beta``, as in ``measure``. The four binned metrics are computed for all
    resamples at once (:meth:`selbench.measure.resampled.ResampledCell.rows_fast`), and equal,
    to float64 rounding (tested to 1e-12), a loop calling
    :func:`selbench.measure.metrics.selective_metrics` on each resample. Why percentile and
    not BCa: see the module docstring.

    Args:
        scores: selector scores ``[n]``, finite (higher = accepted first).
        confidence: recalibrated top-label confidence ``[n]`` in [0, 1].
        correct: 0/1 correctness ``[n]``.
        betas: coverage levels in (0, 1], or the whole IntervalRequest.
        n_resamples: number of resamples, >= 1.
        level: confidence level in (0, 1).
        seed: the cell's seed: seeds both the draws (``[seed, 0xB007]``) and the tie-break.
        delta: Hoeffding failure probability, or ``None`` (as the cell).
        selects: False for a selector that does not select (everything accepted).
        extra: further selective metrics, name -> ``fn(confidence, correct) -> float``,
            called on the accepted examples of every resample and ``beta`` (in selection
            order, as ``measure`` does; with ``selects=False`` once per resample on all of
            them, in resample order).
        ranking: metrics of the whole ranking, name -> ``fn(scores, correct) -> float``,
            called once per resample on all of its examples (e.g. AURC).

    A callable of ``extra`` or ``ranking`` may carry a vectorised form ``fn.batched`` that
    measures all resamples at once (see the module docstring); one of ``extra`` may instead
    carry ``fn.prefixes(confidence, correct, counts)``, all resamples at every count at once
    (``[R, len(counts)]``, from each row's examples in selection order), or
    ``fn.from_bins(counts, conf_mean, acc_mean)``, from the equal-mass bins of ECE₁.

    Returns:
        ``{name: {"low": [per beta], "high": [per beta], "auc": [low, high]}}`` for ``ece1``,
        ``ece2``, ``brier``, ``accuracy`` and every ``extra`` key (``"auc"``: the percentile
        interval of :func:`selbench.measure.metrics.auc` of the resample's curve, present when
        ``betas`` holds at least two values, all distinct), and ``{name: {"low": x, "high":
        y}}`` for every ``ranking`` key. With ``n == 1`` every resample is the example
        itself and ``low == high`` (scipy needs 2 examples; this is its point-mass limit).
        A metric that is NaN on some resample has a NaN interval and a ``RuntimeWarning``.
    """
    return _selective_intervals(scores, confidence, correct, _request_of(betas, options))[0]


def _request_of(betas: Any, options: dict[str, Any]) -> IntervalRequest:
    """The :class:`IntervalRequest` of :func:`selective_intervals`' arguments."""
    if isinstance(betas, IntervalRequest):
        if options:
            raise TypeError("selective_intervals: pass an IntervalRequest or keyword "
                            f"options, not both (got {', '.join(sorted(options))})")
        return betas
    unknown = sorted(set(options) - _REQUEST_OPTIONS)
    if unknown:
        raise TypeError(f"selective_intervals: unknown option(s) {', '.join(unknown)}; "
                        f"expected {', '.join(sorted(_REQUEST_OPTIONS))}")
    return IntervalRequest(betas, **options)


#: the keyword options of :func:`selective_intervals`: the request's fields but ``betas``
_REQUEST_OPTIONS = frozenset(f.name for f in dataclasses.fields(IntervalRequest)) - {"betas"}


def _checked(request: IntervalRequest) -> IntervalRequest:
    """``request`` with every field checked (betas as an array, the callables as dicts)."""
    checked = dict(betas=check_betas(request.betas),
                   n_resamples=_check_resamples(request.n_resamples),
                   level=_check_level(request.level), seed=check_seed(request.seed),
                   delta=None if request.delta is None else check_delta(request.delta))
    extra = _check_callables(request.extra, "extra")
    ranking = _check_callables(request.ranking, "ranking")
    overlap = set(extra) & set(ranking)
    if overlap:
        raise ValueError(f"extra and ranking both name {sorted(overlap)}")
    return dataclasses.replace(request, **checked, selects=bool(request.selects), extra=extra,
                               ranking=ranking)


def _selective_intervals(
    scores: Any, confidence: Any, correct: Any, request: IntervalRequest, *,
    slow: bool = False, batch: int | None = None,
) -> tuple[dict[str, dict[str, Any]], np.ndarray]:
    """:func:`selective_intervals` as ``request`` asks, and the bootstrap distribution
    ``[outputs, resamples]``; ``slow`` measures every resample with ``selective_metrics``
    instead (for the tests)."""
    conf = check_confidence(confidence)
    corr = check_correct(correct, conf.shape[0])
    sc = check_scores(scores, conf.shape[0])
    check_betas(request.betas)  # in the order the arguments come
    n = check_n(conf.shape[0])
    request = _checked(request)
    n_resamples, seed = request.n_resamples, request.seed
    cell = ResampledCell(sc, conf, corr, request)

    def measure(idx: np.ndarray) -> np.ndarray:
        return cell.rows_slow(idx) if slow else _rows_threaded(cell, idx)

    def statistic(i: np.ndarray, axis: int = -1) -> np.ndarray:
        return measure(np.atleast_2d(i))

    if n == 1:  # every resample is the one example
        dist = np.repeat(measure(np.zeros((1, 1), dtype=np.intp)), n_resamples, axis=1)
        low = high = dist[:, 0]
    else:
        from scipy.stats import DegenerateDataWarning, bootstrap

        with warnings.catch_warnings():  # NaN is reported below, per metric
            warnings.simplefilter("ignore", DegenerateDataWarning)
            res = bootstrap((np.arange(n),), statistic, n_resamples=n_resamples,
                            batch=batch if batch is not None else _default_batch(n),
                            vectorized=True, paired=False, axis=0,
                            confidence_level=request.level,
                            method="percentile",
                            rng=np.random.default_rng([seed, _BOOTSTRAP_STREAM]))
        low = np.asarray(res.confidence_interval.low, dtype=np.float64)
        high = np.asarray(res.confidence_interval.high, dtype=np.float64)
        dist = np.asarray(res.bootstrap_distribution, dtype=np.float64)
    nan_rows = np.isnan(dist).any(axis=1)
    if nan_rows.any():
        names = sorted({name for name, (lo, hi) in _flat_names(cell) if nan_rows[lo:hi].any()})
        warnings.warn(
            f"metric(s) {names} returned NaN on some resamples: their intervals are NaN",
            RuntimeWarning, stacklevel=3,
        )
    return cell.unpack(low, high), dist


def _flat_names(cell: ResampledCell) -> list[tuple[str, tuple[int, int]]]:
    """(name, (first row, end row)) of each metric in the output vector of a cell."""
    out = []
    at = 0
    per = cell.betas.shape[0] + int(cell.has_auc)
    for key in cell.keys:
        out.append((key, (at, at + per)))
        at += per
    for key in cell.ranking:
        out.append((key, (at, at + 1)))
        at += 1
    return out


def _rows_threaded(cell: ResampledCell, idx: np.ndarray) -> np.ndarray:
    """:meth:`ResampledCell.rows_fast` of the rows ``idx``, split among threads.

    Every row is measured on its own (the ``batched`` callables are row by row too), so
    the rows are split among :func:`bootstrap_threads` threads (NumPy's sorts, gathers
    and reductions release the GIL), with the same result as one thread, bit for bit.
    """
    R, n = idx.shape
    threads = min(bootstrap_threads(), R, max(1, R * n // _THREAD_ENTRIES))
    if threads <= 1:
        return cell.rows_fast(idx)
    from concurrent.futures import ThreadPoolExecutor

    bounds = np.linspace(0, R, threads + 1).round().astype(int)
    with ThreadPoolExecutor(threads) as pool:
        parts = list(pool.map(cell.rows_fast, [idx[a:b] for a, b in
                                               zip(bounds[:-1], bounds[1:])]))
    return np.concatenate(parts, axis=1)
