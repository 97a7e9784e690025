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

**Reading an interval.** ``(low, high)`` at ``level`` 0.95 is a 95% bootstrap confidence
interval of the metric's value on the *population* of evaluation examples, for this fitted
model: for the percentile method the 2.5% and 97.5% quantiles (scipy's ``stats.quantile``,
linear interpolation) of the metric over the resamples.
"""

from __future__ import annotations

import difflib
import inspect
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from selbench.measure.validation import (
    check_betas,
    check_confidence,
    check_correct,
    check_delta,
    check_n,
    check_scores,
    check_seed,
)

__all__ = ["METHODS", "Interval", "bootstrap_ci", "selective_intervals"]

#: Second entry of the seed of every bootstrap draw, ``np.random.default_rng([seed, 0xB007])``.
_BOOTSTRAP_STREAM = 0xB007
#: The methods of ``scipy.stats.bootstrap`` (case does not matter).
METHODS: tuple[str, ...] = ("percentile", "basic", "BCa")
#: Equal-mass bins of the ECE in a leaderboard cell (as :func:`selbench.measure.metrics.selective_metrics`).
_N_BINS = 15
#: The metrics :func:`selective_intervals` computes itself, in output order.
_BINNED = ("ece1", "ece2", "brier", "accuracy")
#: Most index entries (resamples x examples) handed to a statistic in one call: bounds the
#: memory of a batch (and of BCa's jackknife, ``n`` rows of ``n - 1``) to some tens of MB.
_BATCH_ENTRIES = 1 << 21
#: Index entries :meth:`_Cell.rows_fast` works on at a time (a few rows: cache-sized arrays).
_CHUNK_ENTRIES = 1 << 16
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
    ``bootstrap_ci(lambda c, y: ece(c, y, p=2), conf, correct)``. The result equals
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

    Degenerate cases, handled deliberately rather than by scipy's NaN:

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
        vectorized: see above; ``None`` detects an ``axis`` parameter.

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

    if n == 1:  # every resample is the one example: a point mass
        value = stat(np.zeros(1, dtype=np.intp))
        return _interval(value, value.copy())

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
    dist = np.asarray(res.bootstrap_distribution, dtype=np.float64)
    bad = np.isnan(low) | np.isnan(high)
    if bad.any():
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
                RuntimeWarning, stacklevel=2,
            )
        if (bad & has_nan).any():
            count = int(np.isnan(dist).any(axis=tuple(range(dist.ndim - 1))).sum())
            warnings.warn(
                f"the statistic returned NaN on {count} of {dist.shape[-1]} resamples: "
                "its interval is NaN",
                RuntimeWarning, stacklevel=2,
            )
    return _interval(low, high)


def _interval(low: np.ndarray, high: np.ndarray) -> Interval:
    if np.ndim(low) == 0:
        return Interval(float(low), float(high))
    return Interval(np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64))


# --------------------------------------------------------------------------- a cell's metrics
class _Cell:
    """Everything about one leaderboard cell that does not depend on the resample rows, for
    rows of ``n`` examples (``n`` = the evaluation set; BCa's jackknife would need ``n - 1``)."""

    def __init__(self, sc: np.ndarray, conf: np.ndarray, corr: np.ndarray, betas: np.ndarray,
                 n: int, *, seed: int, delta: float | None, selects: bool,
                 extra: Mapping[str, Callable[..., Any]],
                 ranking: Mapping[str, Callable[..., Any]]) -> None:
        from selbench.measure import metrics as M

        self.sc, self.conf, self.corr, self.betas = sc, conf, corr, betas
        self.n, self.seed, self.delta, self.selects = n, seed, delta, selects
        self.extra, self.ranking = dict(extra), dict(ranking)
        self.has_auc = betas.shape[0] >= 2 and np.unique(betas).shape[0] == betas.shape[0]
        if selects:
            self.k, _ = M._counts(n, betas, delta, stacklevel=4)
        else:  # every example accepted at every beta (measure(selects=False))
            self.k = np.array([n], dtype=np.int64)
        # the tie-break permutation of the resample's positions (selection_order on n rows)
        self.pi = np.random.default_rng([seed, M._TIE_BREAK_STREAM]).permutation(n)
        small = sc.shape[0] <= 1 << 16  # ranks fit uint16: numpy's radix argsort
        rank_dtype = np.uint16 if small else np.int64
        # dense rank of the score, 0 = highest: sorting by it = sorting by -score
        uniq = np.unique(sc)
        self.srank = ((uniq.shape[0] - 1) - np.searchsorted(uniq, sc)).astype(rank_dtype)
        # rank of each example in the (stable) confidence order of the whole evaluation set
        by_conf = np.argsort(conf, kind="stable")
        self.crank = np.empty(sc.shape[0], dtype=rank_dtype)
        self.crank[by_conf] = np.arange(sc.shape[0])
        self.conf_sorted = conf[by_conf]
        self.both_sorted = np.empty(sc.shape[0], dtype=np.complex128)
        self.both_sorted.real, self.both_sorted.imag = conf[by_conf], corr[by_conf]
        self.sq = np.square(conf - corr)
        self.keys = [*_BINNED, *self.extra]
        per = betas.shape[0] + int(self.has_auc)
        self.size = per * len(self.keys) + len(self.ranking)

    # ----------------------------------------------------------------- obviously correct
    def rows_slow(self, idx: np.ndarray) -> np.ndarray:
        """``[size, R]``: the cell re-measured on each resample row by
        :func:`selbench.measure.metrics.selective_metrics`, as :func:`selbench.measure.evaluate.measure` does."""
        from selbench.measure import metrics as M

        b = self.betas
        out = np.empty((self.size, idx.shape[0]))
        for r, rows in enumerate(idx):
            sc, conf, corr = self.sc[rows], self.conf[rows], self.corr[rows]
            with warnings.catch_warnings():  # an infeasible delta warned once already
                warnings.simplefilter("ignore", RuntimeWarning)
                if self.selects:
                    m = M.selective_metrics(sc, conf, corr, b, delta=self.delta, seed=self.seed)
                    order = M.selection_order(sc, seed=self.seed)
                    k, _ = M.accepted_counts(len(sc), b, delta=self.delta)
                else:
                    full = M.selective_metrics(sc, conf, corr, [1.0], seed=self.seed)
                    m = {key: np.repeat(v, b.shape[0]) for key, v in full.items()}
            for key, fn in self.extra.items():
                if self.selects:
                    m[key] = np.array([_scalar(fn(conf[order[:kj]], corr[order[:kj]]), key)
                                       for kj in k])
                else:
                    m[key] = np.full(b.shape[0], _scalar(fn(conf, corr), key))
            col = []
            for key in self.keys:
                col.extend(m[key])
                if self.has_auc:
                    col.append(M.auc(b, m[key]))
            col.extend(_scalar(fn(sc, corr), key) for key, fn in self.ranking.items())
            out[:, r] = col
        return out

    # ----------------------------------------------------------------- vectorised
    def rows_fast(self, idx: np.ndarray) -> np.ndarray:
        """:meth:`rows_slow` for all rows at once (equal to it to float64 rounding).

        Rows are processed a few at a time (about 2**16 index entries: the working arrays stay
        in the CPU cache, which makes this about 1.5 times faster than all rows at once).

        1. Selection order of every row: the positions in the order of the tie-break
           permutation ``pi``, stably sorted by the dense score rank (highest first), are
           exactly ``selection_order`` of the row (one radix argsort of ``[R, n]`` uint16).
        2. The examples of every row sorted by confidence (a second radix argsort of their
           ranks in the confidence order of the evaluation set), each tagged with its
           selection rank ``t``; at coverage ``beta`` the accepted examples are those with
           ``t < k``: exactly ``k`` per row, already in confidence order, so the flat
           positions of the mask form an ``[R, k]`` table of sorted accepted confidences.
        3. Equal-mass bins of every row at once: the order statistics at the part boundaries
           are gathered from that table, the edges are their midpoints (and 1.0), as in the
           library; equal edges leave empty bins (weight 0, as the library's merged ones).
           The accepted examples at or below an edge are counted through a per-row
           cumulative histogram of confidence ranks and one ``searchsorted`` over all rows;
           the per-bin sums of confidence and correctness are one ``np.add.reduceat`` over
           all rows (of complex numbers ``confidence + 1j * correct``: both sums at once;
           complex addition adds the two parts separately, in float64).
        4. Brier score and accuracy: sums over nested prefixes of the selection order.

        Every row is measured on its own (the ``batched`` callables are row by row too), so
        the rows are split among :func:`bootstrap_threads` threads (NumPy's sorts, gathers
        and reductions release the GIL), with the same result as one thread, bit for bit.
        """
        R, n = idx.shape
        threads = min(bootstrap_threads(), R, max(1, R * n // _THREAD_ENTRIES))
        if threads <= 1:
            return self._rows_fast(idx)
        from concurrent.futures import ThreadPoolExecutor

        bounds = np.linspace(0, R, threads + 1).round().astype(int)
        with ThreadPoolExecutor(threads) as pool:
            parts = list(pool.map(self._rows_fast, [idx[a:b] for a, b in
                                                    zip(bounds[:-1], bounds[1:])]))
        return np.concatenate(parts, axis=1)

    def _rows_fast(self, idx: np.ndarray) -> np.ndarray:
        """:meth:`rows_fast` of the rows ``idx`` in this thread."""
        R, n = idx.shape
        b = self.betas
        step = max(1, _CHUNK_ENTRIES // n)  # rows at a time: the working set stays in cache
        parts = [self._binned(idx[r:r + step]) for r in range(0, R, step)]
        ex = parts[0][0] if len(parts) == 1 else np.concatenate([p[0] for p in parts])
        res = {key: np.concatenate([p[1][key] for p in parts]) for key in _BINNED}
        for key, fn in self.extra.items():
            rows_fn = _batched(fn)
            if rows_fn is None:
                res[key] = np.array([[_scalar(fn(self.conf[e[:kj]], self.corr[e[:kj]]), key)
                                      for kj in self.k.tolist()] for e in ex])
            else:  # all resamples at once per beta: [R, k] arrays in selection order
                res[key] = np.stack([_column(rows_fn(self.conf[ex[:, :kj]],
                                                     self.corr[ex[:, :kj]]), R, key)
                                     for kj in self.k.tolist()], axis=1)
        if not self.selects:
            res = {key: np.repeat(v, b.shape[0], axis=1) for key, v in res.items()}
        out = np.empty((self.size, R))
        at = 0
        for key in self.keys:
            out[at:at + b.shape[0]] = res[key].T
            at += b.shape[0]
            if self.has_auc:
                out[at] = _auc_rows(b, res[key])
                at += 1
        shared: tuple[np.ndarray, np.ndarray] | None = None  # [R, n] rows, gathered once
        for key, fn in self.ranking.items():
            rows_fn = _batched(fn)
            if rows_fn is None:
                out[at] = [_scalar(fn(self.sc[r], self.corr[r]), key) for r in idx]
            else:
                if shared is None:  # read-only: no callable can change what the next one gets
                    shared = (self.sc[idx], self.corr[idx])
                    for arr in shared:
                        arr.flags.writeable = False
                out[at] = _column(rows_fn(*shared), R, key)
            at += 1
        return out

    def _binned(self, idx: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Selection order ``[R, n]`` (example at each rank) and the four binned metrics
        ``[R, len(k)]`` of the rows ``idx`` (see :meth:`rows_fast`)."""
        R, n = idx.shape
        rows = np.arange(R, dtype=np.intp)[:, None]
        # (np.take of flat positions: about 2.5 times faster than np.take_along_axis)
        if self.selects:
            in_pi = np.take(idx, self.pi, axis=1)  # the examples at positions pi[0], pi[1], ..
            rank_t = np.argsort(self.srank[in_pi], axis=1, kind="stable")
            ex = np.take(in_pi, rank_t + rows * n)  # ex[r, t]: the t-th accepted example
        else:
            ex = idx  # all accepted: the order does not matter
        ci = self.crank[ex]
        t_by_conf = np.argsort(ci, axis=1, kind="stable")  # t of the u-th lowest confidence
        ci_sorted = np.take(ci, t_by_conf + rows * n).astype(np.intp)
        # confidence (real part) and correctness (imaginary part) in confidence order: one
        # gather and one reduceat sum both
        both_flat = self.both_sorted[ci_sorted].ravel()
        conf_flat = both_flat.real
        # below_rank[r, c]: flat position of the first entry of row r with confidence rank
        # >= c, i.e. r * n + (how many of the row's examples have a rank < c)
        N = self.sc.shape[0]  # ranks are over the whole evaluation set
        below_rank = np.zeros((R, N + 1), dtype=np.intp)
        np.cumsum(np.bincount((ci_sorted + rows * N).ravel(), minlength=R * N).reshape(R, N),
                  axis=1, out=below_rank[:, 1:])
        below_rank += rows * n
        t_flat = t_by_conf.ravel()
        nk = self.k.shape[0]
        res = {key: np.empty((R, nk)) for key in _BINNED}
        # Brier score and accuracy: sums over nested prefixes of the selection order, one
        # (pairwise) sum per stretch between consecutive counts
        ks = np.unique(self.k)
        sq_ord, corr_ord = self.sq[ex], self.corr[ex]
        lo_k = np.concatenate([[0], ks[:-1]])
        sq_sum = np.cumsum([sq_ord[:, a:z].sum(axis=1) for a, z in zip(lo_k, ks)], axis=0)
        corr_sum = np.cumsum([corr_ord[:, a:z].sum(axis=1) for a, z in zip(lo_k, ks)], axis=0)
        where = np.searchsorted(ks, self.k)
        res["brier"][:] = (sq_sum[where] / self.k[:, None]).T
        res["accuracy"][:] = (corr_sum[where] / self.k[:, None]).T
        for kj in ks.tolist():  # each count once (with delta, several betas may share one)
            acc = np.flatnonzero(t_flat < kj)  # R * kj flat positions, row by row
            base = rows * kj
            parts = min(_N_BINS, kj)
            size, extra = divmod(kj, parts)
            starts = np.arange(1, parts) * size + np.minimum(np.arange(1, parts), extra)
            if starts.size:
                lo = conf_flat[acc[base + (starts - 1)]]
                hi = conf_flat[acc[base + starts]]
                edges = np.concatenate([(lo + hi) / 2.0, np.ones((R, 1))], axis=1)
            else:
                edges = np.ones((R, 1))
            below = np.searchsorted(self.conf_sorted, edges, side="right")  # conf <= edge
            first = np.take(below_rank, below + rows * (N + 1))  # flat end of conf <= edge
            ends = np.searchsorted(acc, first, side="left") - base  # accepted with conf <= edge
            counts = np.diff(ends, axis=1, prepend=0)
            nonempty = counts > 0
            seg = (base + ends - counts)[nonempty]
            sums = np.add.reduceat(both_flat[acc], seg)
            conf_mean = np.zeros(counts.shape)
            acc_mean = np.zeros(counts.shape)
            conf_mean[nonempty] = sums.real / counts[nonempty]
            acc_mean[nonempty] = sums.imag / counts[nonempty]
            weights = counts / kj
            gap = np.where(nonempty, np.abs(conf_mean - acc_mean), 0.0)
            cols = self.k == kj
            res["ece1"][:, cols] = np.sum(weights * gap, axis=1)[:, None]
            res["ece2"][:, cols] = (np.sum(weights * gap**2, axis=1) ** 0.5)[:, None]
        return ex, res

    def unpack(self, low: np.ndarray, high: np.ndarray) -> dict[str, dict[str, Any]]:
        nb = self.betas.shape[0]
        out: dict[str, dict[str, Any]] = {}
        at = 0
        for key in self.keys:
            entry: dict[str, Any] = {"low": low[at:at + nb].tolist(),
                                     "high": high[at:at + nb].tolist()}
            at += nb
            if self.has_auc:
                entry["auc"] = [float(low[at]), float(high[at])]
                at += 1
            out[key] = entry
        for key in self.ranking:
            out[key] = {"low": float(low[at]), "high": float(high[at])}
            at += 1
        return out


def _scalar(value: Any, key: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"metric {key!r} returned {type(value).__name__}, not a number") from None


def _batched(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """The optional all-resamples form ``fn.batched`` of a metric callable, if it has one."""
    rows_fn = getattr(fn, "batched", None)
    return rows_fn if callable(rows_fn) else None


def _column(values: Any, rows: int, key: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{key}.batched returned {type(values).__name__}, not numbers") from None
    if arr.shape != (rows,):
        raise ValueError(f"{key}.batched returned shape {arr.shape}, expected ({rows},)")
    return arr


def _auc_rows(betas: np.ndarray, values: np.ndarray) -> np.ndarray:
    """:func:`selbench.measure.metrics.auc` of every row of ``values`` ``[R, M]``."""
    order = np.argsort(betas, kind="stable")
    b, v = betas[order], values[:, order]
    area = np.sum(np.diff(b) * (v[:, 1:] + v[:, :-1]) / 2.0, axis=1)
    return area / float(b[-1] - b[0])


def _check_callables(mapping: Any, what: str) -> dict[str, Callable[..., Any]]:
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping):
        raise ValueError(f"{what} must be a mapping name -> callable; got {type(mapping).__name__}")
    for key, fn in mapping.items():
        if not isinstance(key, str) or not callable(fn):
            raise ValueError(f"{what} must map names to callables; got {key!r}: {fn!r}")
        if key in _BINNED:
            raise ValueError(f"{what} name {key!r} clashes with a metric computed here")
    return dict(mapping)


def selective_intervals(
    scores: Any,
    confidence: Any,
    correct: Any,
    betas: Any,
    *,
    n_resamples: int = 200,
    level: float = 0.95,
    seed: int = 0,
    delta: float | None = None,
    selects: bool = True,
    extra: Mapping[str, Callable[[np.ndarray, np.ndarray], float]] | None = None,
    ranking: Mapping[str, Callable[[np.ndarray, np.ndarray], float]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Percentile bootstrap intervals of every metric of one leaderboard cell.

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
    resamples at once (:meth:`_Cell.rows_fast`), and equal, to float64 rounding (tested to
    1e-12), a loop calling :func:`selbench.measure.metrics.selective_metrics` on each resample.

    Why percentile and not BCa: BCa's acceleration needs the jackknife, the whole cell
    re-measured on each of the ``n`` leave-one-out sets, i.e. ``n`` more evaluations where
    the interval itself needs ``n_resamples`` (200). Measured at ``n = 3000`` with 11 betas
    (one core of a shared, busy machine): the jackknife of the four binned metrics alone takes
    about 0.6 s per cell where the 200 resamples take 0.035 s, 17 times more, and it would
    call every ``extra`` and ``ranking`` callable 15 times as often; too much for a
    leaderboard of many cells. Moreover BCa is often undefined for the plug-in ECE of a
    well-calibrated model: a resample repeats examples, which adds binning noise, so most or
    all resamples are more miscalibrated than the sample (all 200 in a test at ``n = 3000``
    with ECE₁ = 0.02), and the bias correction is extreme or infinite (see
    :func:`bootstrap_ci`). The percentile interval needs only the resamples and is what the
    leaderboard reports. The same upward bias means that for a well-calibrated model the
    ECE's percentile interval can lie above the measured value: it shows how much the
    estimate varies over evaluation sets, not a bias-corrected range for the true ECE.

    Args:
        scores: selector scores ``[n]``, finite (higher = accepted first).
        confidence: recalibrated top-label confidence ``[n]`` in [0, 1].
        correct: 0/1 correctness ``[n]``.
        betas: coverage levels in (0, 1].
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

    A callable of ``extra`` or ``ranking`` is called once per resample (and ``beta``), which
    can dominate the cost: the four binned metrics take about 0.03 s per cell of 3000
    examples, 11 betas and 200 resamples, while ``extra`` costs 2200 calls of the callable and
    ``ranking`` 200 (about 5 microseconds each of overhead; a 7 ms smooth ECE costs 15 s).
    A callable may therefore carry an optional vectorised form as its attribute ``batched``:
    ``fn.batched(confidence, correct) -> [R]`` (or ``fn.batched(scores, correct)`` for
    ``ranking``) taking ``[R, m]`` arrays, row ``r`` being what ``fn`` would get for resample
    ``r`` (the accepted examples in selection order, or all examples in resample order); it
    must equal ``fn`` row by row (the plain loop, used by the tests, calls ``fn`` itself).
    The ``batched`` forms of the ``ranking`` callables all get the same two arrays (gathered
    once per batch of resamples: at ``n = 3000`` each ``[200, 3000]`` gather costs about 1 ms),
    read-only; :func:`selbench.measure.riskcoverage.aurc`, ``eaurc`` and ``augrc`` also share one sort
    of them.

    Returns:
        ``{name: {"low": [per beta], "high": [per beta], "auc": [low, high]}}`` for ``ece1``,
        ``ece2``, ``brier``, ``accuracy`` and every ``extra`` key (``"auc"``: the percentile
        interval of :func:`selbench.measure.metrics.auc` of the resample's curve, present when
        ``betas`` holds at least two values, all distinct), and ``{name: {"low": x, "high":
        y}}`` for every ``ranking`` key. With ``n == 1`` every resample is the example
        itself and ``low == high`` (scipy needs 2 examples; this is its point-mass limit).
        A metric that is NaN on some resample has a NaN interval and a ``RuntimeWarning``.
    """
    return _selective_intervals(scores, confidence, correct, betas, n_resamples=n_resamples,
                                level=level, seed=seed, delta=delta, selects=selects,
                                extra=extra, ranking=ranking)[0]


def _selective_intervals(
    scores: Any, confidence: Any, correct: Any, betas: Any, *, n_resamples: int, level: float,
    seed: int, delta: float | None, selects: bool, extra: Any, ranking: Any,
    slow: bool = False, batch: int | None = None,
) -> tuple[dict[str, dict[str, Any]], np.ndarray]:
    """:func:`selective_intervals` and the bootstrap distribution ``[outputs, resamples]``;
    ``slow`` measures every resample with ``selective_metrics`` instead (for the tests)."""
    conf = check_confidence(confidence)
    corr = check_correct(correct, conf.shape[0])
    sc = check_scores(scores, conf.shape[0])
    b = check_betas(betas)
    n = check_n(conf.shape[0])
    n_resamples = _check_resamples(n_resamples)
    level = _check_level(level)
    seed = check_seed(seed)
    if delta is not None:
        delta = check_delta(delta)
    extra = _check_callables(extra, "extra")
    ranking = _check_callables(ranking, "ranking")
    overlap = set(extra) & set(ranking)
    if overlap:
        raise ValueError(f"extra and ranking both name {sorted(overlap)}")
    cell = _Cell(sc, conf, corr, b, n, seed=seed, delta=delta, selects=bool(selects),
                 extra=extra, ranking=ranking)
    measure = cell.rows_slow if slow else cell.rows_fast

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
                            vectorized=True, paired=False, axis=0, confidence_level=level,
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


def _flat_names(cell: _Cell) -> list[tuple[str, tuple[int, int]]]:
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

