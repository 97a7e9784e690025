"""A leaderboard cell re-measured on bootstrap resamples: :class:`ResampledCell`.

Everything :func:`selbench.measure.bootstrap.selective_intervals` needs to re-measure one cell
on rows of resampled evaluation examples: what the intervals are asked for
(:class:`IntervalRequest`: the coverage levels, the resamples, the confidence level, the seed,
the guarantee, whether the selector selects, the further metrics), the cell's arrays prepared
once, the plain
measurement of each row by :func:`selbench.measure.metrics.selective_metrics`
(:meth:`ResampledCell.rows_slow`, obviously correct) and the vectorised one of all rows at
once (:meth:`ResampledCell.rows_fast`, equal to it to float64 rounding, tested to 1e-12).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from selbench.measure.metrics import (
    TIE_BREAK_STREAM,
    accepted_counts,
    auc,
    count_accepted,
    selection_order,
    selective_metrics,
)

__all__ = ["BINNED", "IntervalRequest", "ResampledCell"]

#: Equal-mass bins of the ECE in a leaderboard cell (as :func:`selbench.measure.metrics.selective_metrics`).
_N_BINS = 15
#: The metrics :class:`ResampledCell` computes itself (the binned ones), in output order.
BINNED = ("ece1", "ece2", "brier", "accuracy")
#: Index entries :meth:`ResampledCell.rows_fast` works on at a time (a few rows: cache-sized arrays).
_CHUNK_ENTRIES = 1 << 16


@dataclass(frozen=True)
class IntervalRequest:
    """What the bootstrap intervals of one leaderboard cell are asked for (the arguments of
    :func:`selbench.measure.bootstrap.selective_intervals` but the cell's arrays): decided once
    and passed forward, checked by the bootstrap before any draw."""

    #: coverage levels in (0, 1] (an array once checked)
    betas: Any
    n_resamples: int = 200
    #: confidence level in (0, 1)
    level: float = 0.95
    #: the cell's seed: seeds both the draws and the tie-break
    seed: int = 0
    #: Hoeffding failure probability, or None (as the cell)
    delta: float | None = None
    #: False for a selector that does not select (everything accepted)
    selects: bool = True
    #: further selective metrics, name -> ``fn(confidence, correct)``
    extra: Mapping[str, Callable[..., Any]] | None = None
    #: metrics of the whole ranking, name -> ``fn(scores, correct)``
    ranking: Mapping[str, Callable[..., Any]] | None = None


class ResampledCell:
    """Everything about one leaderboard cell that does not depend on the resample rows, for
    rows of as many examples as the cell has (the evaluation set), measured as ``request``
    (checked) asks."""

    def __init__(self, sc: np.ndarray, conf: np.ndarray, corr: np.ndarray,
                 request: IntervalRequest) -> None:
        n, betas = sc.shape[0], np.asarray(request.betas, dtype=np.float64)
        seed, delta, selects = request.seed, request.delta, bool(request.selects)
        self.sc, self.conf, self.corr, self.betas = sc, conf, corr, betas
        self.n, self.seed, self.delta, self.selects = n, seed, delta, selects
        self.extra, self.ranking = dict(request.extra or {}), dict(request.ranking or {})
        self.has_auc = betas.shape[0] >= 2 and np.unique(betas).shape[0] == betas.shape[0]
        if selects:
            self.k, _ = count_accepted(n, betas, delta, stacklevel=4)
        else:  # every example accepted at every beta (measure(selects=False))
            self.k = np.array([n], dtype=np.int64)
        # the tie-break permutation of the resample's positions (selection_order on n rows)
        self.pi = np.random.default_rng([seed, TIE_BREAK_STREAM]).permutation(n)
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
        self.keys = [*BINNED, *self.extra]
        # extra metrics of the equal-mass bins of ECE (``fn.from_bins``): computed with them
        self.from_bins = {key: fn.from_bins for key, fn in self.extra.items()
                          if callable(getattr(fn, "from_bins", None))}
        per = betas.shape[0] + int(self.has_auc)
        self.size = per * len(self.keys) + len(self.ranking)

    # ----------------------------------------------------------------- obviously correct
    def rows_slow(self, idx: np.ndarray) -> np.ndarray:
        """``[size, R]``: the cell re-measured on each resample row by
        :func:`selbench.measure.metrics.selective_metrics`, as :func:`selbench.measure.evaluate.measure` does."""
        b = self.betas
        out = np.empty((self.size, idx.shape[0]))
        for r, rows in enumerate(idx):
            sc, conf, corr = self.sc[rows], self.conf[rows], self.corr[rows]
            with warnings.catch_warnings():  # an infeasible delta warned once already
                warnings.simplefilter("ignore", RuntimeWarning)
                if self.selects:
                    m = selective_metrics(sc, conf, corr, b, delta=self.delta, seed=self.seed)
                    order = selection_order(sc, seed=self.seed)
                    k, _ = accepted_counts(len(sc), b, delta=self.delta)
                else:
                    full = selective_metrics(sc, conf, corr, [1.0], seed=self.seed)
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
                    col.append(auc(b, m[key]))
            col.extend(_scalar(fn(sc, corr), key) for key, fn in self.ranking.items())
            out[:, r] = col
        return out

    # ----------------------------------------------------------------- vectorised
    def rows_fast(self, idx: np.ndarray) -> np.ndarray:
        """:meth:`rows_slow` for all rows at once (equal to it to float64 rounding), in the
        calling thread (:func:`selbench.measure.bootstrap.selective_intervals` splits the rows
        among threads).

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
        """
        R, n = idx.shape
        b = self.betas
        step = max(1, _CHUNK_ENTRIES // n)  # rows at a time: the working set stays in cache
        parts = [self._binned(idx[r:r + step]) for r in range(0, R, step)]
        ex = parts[0][0] if len(parts) == 1 else np.concatenate([p[0] for p in parts])
        res = {key: np.concatenate([p[1][key] for p in parts])
               for key in (*BINNED, *self.from_bins)}
        shared: tuple[np.ndarray, np.ndarray] | None = None  # [R, n] in selection order
        for key, fn in self.extra.items():
            if key in self.from_bins:
                continue
            if shared is None and (_batched(fn) is not None or _prefixes(fn) is not None):
                shared = (self.conf[ex], self.corr[ex])  # gathered once for every batched one
                for arr in shared:
                    arr.flags.writeable = False
            res[key] = self._extra_rows(key, fn, ex, shared)
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
        self._ranking_rows(idx, out, at)
        return out

    def _extra_rows(self, key: str, fn: Callable[..., Any], ex: np.ndarray,
                    shared: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
        """The ``extra`` metric ``key`` ``[R, len(k)]`` of the rows whose selection order is
        ``ex``: through ``fn.batched`` when it has one (on the read-only ``[R, k]`` leading
        columns of ``shared``, the rows' confidence and correctness in selection order), else
        ``fn`` per row and count."""
        R = ex.shape[0]
        rows_fn = _batched(fn)
        if _prefixes(fn) is not None and shared is not None:  # every count at once
            got = np.asarray(_prefixes(fn)(*shared, self.k), dtype=np.float64)
            if got.shape != (R, self.k.shape[0]):
                raise ValueError(f"{key}.prefixes returned shape {got.shape}, expected "
                                 f"({R}, {self.k.shape[0]})")
            return got
        if rows_fn is None or shared is None:
            return np.array([[_scalar(fn(self.conf[e[:kj]], self.corr[e[:kj]]), key)
                              for kj in self.k.tolist()] for e in ex])
        conf, corr = shared  # all resamples at once per beta
        return np.stack([_column(rows_fn(conf[:, :kj], corr[:, :kj]), R, key)
                         for kj in self.k.tolist()], axis=1)

    def _ranking_rows(self, idx: np.ndarray, out: np.ndarray, at: int) -> None:
        """The ``ranking`` metrics of the rows ``idx`` into ``out[at:]``, one output row each:
        from the rows' per-group counts (:meth:`_count_tables`) through ``from_count_rows``
        (all rows at once) or ``from_counts`` (each row's merged-tie curve), the others
        through ``batched`` or row by row."""
        R = idx.shape[0]
        shared: tuple[np.ndarray, np.ndarray] | None = None  # [R, n] rows, gathered once
        fns = list(self.ranking.values())
        tables = [(at + i, fn.from_count_rows) for i, fn in enumerate(fns)
                  if callable(getattr(fn, "from_count_rows", None))]
        curves = [(at + i, fn.from_counts) for i, fn in enumerate(fns)
                  if callable(getattr(fn, "from_counts", None))
                  and not callable(getattr(fn, "from_count_rows", None))]
        if tables or curves:
            for a, drawn, wrong in self._count_tables(idx):
                for row, rows_fn in tables:
                    out[row, a:a + drawn.shape[0]] = _column(rows_fn(drawn, wrong),
                                                             drawn.shape[0], "from_count_rows")
                if curves:
                    k_all, e_all = np.cumsum(drawn, axis=1), np.cumsum(wrong, axis=1)
                    for r in range(drawn.shape[0]):
                        present = drawn[r] > 0
                        k, e = k_all[r, present], e_all[r, present]
                        for row, from_counts in curves:
                            out[row, a + r] = from_counts(k, e)
        for key, fn in self.ranking.items():
            if callable(getattr(fn, "from_counts", None)) or \
                    callable(getattr(fn, "from_count_rows", None)):
                at += 1
                continue
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

    def _count_tables(self, idx: np.ndarray):
        """Blocks ``(first row, drawn, wrong)`` of the rows' per-group counts ``[r, G]``: how
        many of each row's examples (and of its wrong ones) fall in each group of equal
        scores of the evaluation set (``srank``, 0 = highest), two ``bincount`` s a block and
        no sort of any row. A row's merged-tie curve (as
        :func:`selbench.measure.riskcoverage.rc_counts` of its scores and correctness) is the
        cumulative sums at the groups it draws: exactly the integers a sort would give."""
        n_groups = int(self.srank.max()) + 1 if self.srank.size else 0
        wrong = self.corr == 0.0
        step = max(1, _CHUNK_ENTRIES * 16 // max(n_groups, 1))  # [step, groups] int64 tables
        for a in range(0, idx.shape[0], step):
            block = idx[a:a + step]
            rows = np.arange(block.shape[0], dtype=np.intp)[:, None]
            flat = self.srank[block].astype(np.intp) + rows * n_groups
            size = block.shape[0] * n_groups
            drawn = np.bincount(flat.ravel(), minlength=size).reshape(-1, n_groups)
            wrong_drawn = np.bincount(flat[wrong[block]], minlength=size).reshape(-1, n_groups)
            yield a, drawn, wrong_drawn

    def _binned(self, idx: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Selection order ``[R, n]`` (example at each rank) and the four binned metrics
        ``[R, len(k)]`` of the rows ``idx`` (see :meth:`rows_fast`)."""
        R, n = idx.shape
        rows = np.arange(R, dtype=np.intp)[:, None]
        ex = self._selection(idx, rows)
        ci = self.crank[ex]
        t_by_conf = np.argsort(ci, axis=1, kind="stable")  # t of the u-th lowest confidence
        ci_sorted = np.take(ci, t_by_conf + rows * n).astype(np.intp)
        # confidence (real part) and correctness (imaginary part) in confidence order: one
        # gather and one reduceat sum both
        both_flat = self.both_sorted[ci_sorted].ravel()
        conf_flat = both_flat.real
        below_rank = self._below_rank(ci_sorted, rows, n)
        t_flat = t_by_conf.ravel()
        nk = self.k.shape[0]
        res = {key: np.empty((R, nk)) for key in (*BINNED, *self.from_bins)}
        ks = np.unique(self.k)
        self._prefix_means(ex, ks, res)
        for kj in ks.tolist():  # each count once (with delta, several betas may share one)
            self._ece_at(kj, t_flat, both_flat, conf_flat, below_rank, rows, res)
        return ex, res

    def _selection(self, idx: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Step 1 of :meth:`rows_fast`: ``ex[r, t]``, the ``t``-th accepted example of row ``r``."""
        n = idx.shape[1]
        # (np.take of flat positions: about 2.5 times faster than np.take_along_axis)
        if self.selects:
            in_pi = np.take(idx, self.pi, axis=1)  # the examples at positions pi[0], pi[1], ..
            rank_t = np.argsort(self.srank[in_pi], axis=1, kind="stable")
            ex = np.take(in_pi, rank_t + rows * n)  # ex[r, t]: the t-th accepted example
        else:
            ex = idx  # all accepted: the order does not matter
        return ex

    def _below_rank(self, ci_sorted: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
        """``below_rank[r, c]``: flat position of the first entry of row ``r`` with confidence
        rank >= ``c``, i.e. ``r * n`` + (how many of the row's examples have a rank < ``c``)."""
        R = rows.shape[0]
        N = self.sc.shape[0]  # ranks are over the whole evaluation set
        below_rank = np.zeros((R, N + 1), dtype=np.intp)
        np.cumsum(np.bincount((ci_sorted + rows * N).ravel(), minlength=R * N).reshape(R, N),
                  axis=1, out=below_rank[:, 1:])
        below_rank += rows * n
        return below_rank

    def _prefix_means(self, ex: np.ndarray, ks: np.ndarray, res: dict[str, np.ndarray]) -> None:
        """Step 4 of :meth:`rows_fast` into ``res``: Brier score and accuracy, sums over nested
        prefixes of the selection order, one (pairwise) sum per stretch between consecutive
        counts ``ks``."""
        sq_ord, corr_ord = self.sq[ex], self.corr[ex]
        lo_k = np.concatenate([[0], ks[:-1]])
        sq_sum = np.cumsum([sq_ord[:, a:z].sum(axis=1) for a, z in zip(lo_k, ks)], axis=0)
        corr_sum = np.cumsum([corr_ord[:, a:z].sum(axis=1) for a, z in zip(lo_k, ks)], axis=0)
        where = np.searchsorted(ks, self.k)
        res["brier"][:] = (sq_sum[where] / self.k[:, None]).T
        res["accuracy"][:] = (corr_sum[where] / self.k[:, None]).T

    def _ece_at(self, kj: int, t_flat: np.ndarray, both_flat: np.ndarray,
                conf_flat: np.ndarray, below_rank: np.ndarray, rows: np.ndarray,
                res: dict[str, np.ndarray]) -> None:
        """Step 3 of :meth:`rows_fast` into ``res``: ECE₁ and ECE₂ of every row with ``kj``
        accepted examples (the columns of every beta with that count)."""
        R = rows.shape[0]
        N = self.sc.shape[0]
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
        for key, from_bins in self.from_bins.items():
            res[key][:, cols] = _column(from_bins(counts, conf_mean, acc_mean), R,
                                        f"{key}.from_bins")[:, None]

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


def _prefixes(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """The optional nested-prefix form ``fn.prefixes(confidence, correct, counts)`` of an
    ``extra`` metric: ``[R, len(counts)]``, the metric of each row's leading ``counts[j]``
    examples (in selection order), for all counts at once."""
    rows_fn = getattr(fn, "prefixes", None)
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

