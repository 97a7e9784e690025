"""Smooth ECE, the smooth reliability curve, and class-wise ECE.

Plain numpy arrays in, floats (or a small record of float64 arrays) out, inputs checked as in
:mod:`selbench.measure.metrics`, which re-exports :func:`smece`, :func:`smooth_reliability` and
:func:`classwise_ece`.

**Smooth ECE** (Błasiok & Nakkiran, "Smooth ECE: Principled Reliability Diagrams via Kernel
Smoothing", ICLR 2024). For predictions ``f_i`` in [0, 1] and outcomes ``y_i`` in {0, 1}, with a
Gaussian kernel ``K_s`` of bandwidth ``s`` reflected at 0 and 1, the smoothed residual and the
smoothed density are

    ``R_s(t) = sum_i K_s(t, f_i) (f_i - y_i)``,   ``D_s(t) = sum_i K_s(t, f_i)``,

and ``smECE_s = integral |R_s(t)| dt / integral D_s(t) dt`` (the mean, under the kernel density
of the predictions, of the absolute kernel-smoothed residual). The paper's smECE uses the
bandwidth ``s*`` at which ``smECE_s = s`` (the smoothing scale equals the error it measures).
:func:`smece` computes exactly what the reference implementation ``relplot`` 1.0.3
(``relplot.smECE`` / ``relplot.smECE_sigma``) computes, which is a particular discretisation
of that definition; its steps are spelled out in :func:`smece` and below. Some of them change
the value (a guard constant 1e-4 in the denominator, confidences exactly 0 or 1 counted at half
weight, the bandwidth rounded up to a multiple of 1/1024): they are reproduced, not idealised.

Points of relplot's discretisation that one would not guess from the paper: the constant
``1e-4``, relplot's guard against division by zero, is not scaled with ``N``, so it
lowers smECE by a relative ``1e-4 / mean_t D(t)`` (``mean D`` is about ``N`` for
moderate ``s``): about 5e-4 relative at N = 1 (``smece([0.], [1])`` is 0.99948, not 1).
The kernel is truncated at +-1/2 and reflected only once at each end, so for large ``s``
(the search starts at ``s = 1``) much of its mass is simply lost; the sampled kernel is
not normalised on the grid (that cancels in the ratio, except against the ``1e-4``).

Ties need no special handling (tied examples add their weights to the same grid
points). Confidence exactly 0 puts all its weight on the first grid point, exactly 1 on
the last. The reflection does not repeat the end grid points, so an example *exactly* at
0 or 1 gets no mirror image: its kernel mass inside [0, 1] is 1/2, where an interior
example's (reflected) kernel has mass 1, and an example within one grid step (1/1000 for
``s >= 0.01``) of 0 or 1 gets between 1/2 and 1. So relplot's smECE counts saturated
confidences at about half weight, in the residual and in the density alike (a continuous
reflected kernel would count them fully). This is not a corner case for float32 softmax
outputs: 2,469 of the 10,000 top-label confidences of the CIFAR-10 WideResNet in
``../shared/data`` are exactly 1.0. :func:`smece` reproduces relplot here too.
Inputs are converted to float64 (relplot computes float32 inputs partly in float32, which
differs by about 1e-7).

Speed of :func:`smece`: the grid masses are computed once per grid size and reused across
the bandwidth search, the convolutions are done by FFT, and each bandwidth is evaluated once
(relplot evaluates the chosen one twice): about 10 times faster than relplot at N = 1e6
(51 ms vs 505 ms) and 5 to 10 times at N = 3,000 (about 1.5 ms a call), on 2 busy CPU cores
(``perf/peers_smooth.py``).

**Class-wise ECE** (Kull et al., "Beyond temperature scaling: Obtaining well-calibrated
multi-class probabilities with Dirichlet calibration", NeurIPS 2019): the calibration error of
each class's probability ``p_k`` against ``1[y = k]``, averaged over the classes; with
equal-mass bins it is the ``mode="marginal"`` calibration error of the ``uncertainty-calibration``
package (Kumar et al. 2019), see :func:`classwise_ece`. Its ``binning="equal-mass"`` value
is also what ``calibration.get_calibration_error(probabilities, labels, p=p, debias=debias,
mode="marginal")`` returns for continuous outputs — but note that ``get_calibration_error``
switches to ``get_binning_ce`` (one bin per distinct value) when *every* class column has
fewer than ``N/4`` distinct values (outputs of a binning method), and that its defaults are
``p=2, debias=True``.

``binning="equal-width"``: ``n_bins`` bins of width ``1/n_bins`` on [0, 1] per class, as
Kull et al. describe; bin ``b`` holds ``b/n_bins < p_k <= (b+1)/n_bins`` (0 in the first
bin), the library's ``get_equal_prob_bins`` convention, so this equals
``lower_bound_scaling_ce(..., binning_scheme=calibration.get_equal_prob_bins,
mode="marginal")``. torchmetrics-style implementations (torch-uncertainty's
``ClasswiseCalibrationError``) close bins on the left, ``[b/n, (b+1)/n)`` with 1.0 in a
bin of its own, which differs only for probabilities exactly on an edge; for
``norm="l2"`` they also average the per-class ECE_2 instead of taking the root of the
mean square.

``debias=True``: the library's debiased per-class estimators (see
:func:`selbench.measure.metrics.ece`): for ``p = 2`` ``unbiased_l2_ce`` (each class's squared
error clipped at 0 before averaging), otherwise ``normal_debiased_ce``, random, needing
at least 2 examples in every bin of every class (with equal-width bins, empty bins make
it fail).

Speed of :func:`classwise_ece`: one batched sort of the ``K`` columns (or, from
``N = 2**16``, the sort-free binning of :func:`selbench.measure.metrics.ece`) and the
library's estimators vectorised: at ``K = 100`` about 30 times the library at ``N = 10,000``
(57 ms vs 1.6 s) and 50 times at ``N = 100,000`` (0.4 s vs 21 s) (``perf/peers_smooth.py``).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np
import scipy.fft

from selbench.measure.binning import BUCKETED_MIN_N, bin_stats, bin_stats_bucketed, ece_from_stats
from selbench.measure.validation import check_confidence, check_correct, check_n_bins, check_p

__all__ = ["SmoothReliability", "classwise_ece", "smece", "smece_bandwidth", "smece_prefix_rows",
           "smece_rows", "smooth_reliability"]

#: relplot's constants (relplot 1.0.3: ``config.smECE_mesh_pts``, ``config.plot_mesh_pts``,
#: the ``eps`` of ``BaseKernelMixin.smooth`` and of ``metrics.smECE``, the bisection's steps).
_MESH_MIN = 200
_PLOT_MESH = 200
_DENSITY_EPS = 1e-4
_SEARCH_EPS = 1e-3
_SEARCH_STEPS = 10
#: classwise_ece: rows of ``probabilities`` must sum to 1 within this
_ROW_SUM_TOL = 1e-6


# --------------------------------------------------------------------------- smooth ECE core
def _fine_points(sigma: float) -> int:
    """Points of the fine grid on which the kernel smoothing is computed (relplot's
    ``GaussianKernel.apply``: ``max(2000, round(20 / sigma)) // 2 + 1``; Python's ``round``,
    half to even)."""
    return max(2000, round(20.0 / sigma)) // 2 + 1


def _eval_points(sigma: float) -> int:
    """Points of the grid on which smECE averages (relplot's ``smooth_ece``:
    ``max(round(10 / sigma), 200)``)."""
    return max(round(10.0 / sigma), _MESH_MIN)


class _Smoother:
    """Kernel smoothing of one data set with relplot's discretised reflected Gaussian kernel.

    ``series`` are per-example weights, ``None`` standing for weight 1. For a fine grid of
    ``m`` points ``g_j = j/(m-1)``:

    1. every example's weight is split linearly between the two grid points around ``f_i``
       (``(1 - frac)`` to the left one, ``frac`` to the right one; ``f = 1`` lands on the last
       point) and summed per grid point: the grid masses ``v`` (cached per ``m``);
    2. ``v`` is reflected at both ends without repeating the end points
       (``v[m-1], ..., v[1], v[0], ..., v[m-1], v[m-2], ..., v[0]``) and convolved with the
       Gaussian density ``exp(-(g_q - 1/2)^2 / (2 s^2)) / (sqrt(2 pi) s)`` sampled at the ``m``
       grid points ``q`` (so truncated at +-1/2, and for even ``m`` off centre by half a grid
       step, as relplot's ``ReflectedGaussianKernel.convolve``); the ``m`` outputs aligned with
       the grid are the smoothed values;
    3. values at other points ``t`` are linear interpolations of the grid values.
    """

    def __init__(self, f: np.ndarray, series: list[np.ndarray | None]) -> None:
        self.f = f
        self.series = series
        self._masses: dict[tuple[int, int], np.ndarray] = {}
        self._work: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._work_m = 0

    def masses(self, m: int, rows: list[int]) -> np.ndarray:
        """Grid masses ``[len(rows), m]`` of the given rows: per grid point ``j``, the sum of
        ``(1 - frac) w`` over the examples whose left grid point is ``j`` plus the sum of
        ``frac w`` over those whose left grid point is ``j - 1``. The first sums are taken as
        ``sum w - sum frac w`` (one weighted ``bincount`` fewer per row; for the ones row
        ``count - sum frac``), which differs from relplot's summation by rounding only (about
        1e-16 of a grid point's total weight). Cached per grid size and row."""
        missing = [r for r in rows if (m, r) not in self._masses]
        if missing:
            frac, tmp, left = self._split(m)
            for row in missing:
                w = self.series[row]
                if w is None:
                    total = np.bincount(left, minlength=m).astype(np.float64)
                    right = np.bincount(left, weights=frac, minlength=m)
                else:
                    total = np.bincount(left, weights=w, minlength=m)
                    right = np.bincount(left, weights=np.multiply(frac, w, out=tmp),
                                        minlength=m)
                got = total - right
                got[1:] += right[: m - 1]
                self._masses[(m, row)] = got
        return np.stack([self._masses[(m, r)] for r in rows])

    def _split(self, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(frac, a scratch array, left grid point) of every example for grid size ``m``, in
        buffers reused for every grid (fresh large arrays are slow)."""
        if self._work is None:
            n = self.f.shape[0]
            self._work = (np.empty(n), np.empty(n), np.empty(n, dtype=np.intp))
        frac, tmp, left = self._work
        if self._work_m != m:
            np.multiply(self.f, m - 1, out=frac)
            np.floor(frac, out=tmp)
            np.minimum(tmp, m - 2, out=tmp)  # f = 1: left point m - 2, frac 1
            np.copyto(left, tmp, casting="unsafe")
            np.subtract(frac, tmp, out=frac)
            self._work_m = m
        return frac, tmp, left

    @staticmethod
    def _kernel(sigma: float, m: int) -> np.ndarray:
        g = np.linspace(0.0, 1.0, m)
        return np.exp(-(g - 0.5) * (g - 0.5) / (2.0 * sigma * sigma)) / (
            math.sqrt(2.0 * math.pi) * sigma
        )

    @staticmethod
    def _reflect(v: np.ndarray) -> np.ndarray:
        return np.concatenate([v[:, :0:-1], v, v[:, -2::-1]], axis=1)

    def grid_fft(self, sigma: float, rows: list[int]) -> np.ndarray:
        """Smoothed values on the fine grid ``[S, m]``, by FFT (fast; rounding errors of about
        1e-16 of the largest value, harmless for smECE's integrals)."""
        m = _fine_points(sigma)
        # grid value j = sum_q ext[j + m//2 + m - 1 - q] ker[q]: only ext[m//2 : m//2 + 2m - 1]
        # is used, and the m 'valid' outputs of its convolution with ker are the grid values;
        # a circular convolution of length >= 2m - 1 leaves them unaliased
        part = self._reflect(self.masses(m, rows))[:, m // 2 : m // 2 + 2 * m - 1]
        ker = self._kernel(sigma, m)
        nfft = scipy.fft.next_fast_len(2 * m - 1, real=True)
        spec = scipy.fft.rfft(part, nfft, axis=1)
        spec *= scipy.fft.rfft(ker, nfft)
        return scipy.fft.irfft(spec, nfft, axis=1)[:, m - 1 : 2 * m - 1]

    def at_direct(self, sigma: float, t: np.ndarray, rows: list[int]) -> np.ndarray:
        """Smoothed values interpolated at ``t`` ``[S, len(t)]``, each needed grid value by a
        direct sum (exact up to rounding even where the values are tiny, which matters for
        the ratio of two smoothed curves far from the data); only the given ``rows``."""
        m = _fine_points(sigma)
        ext = self._reflect(self.masses(m, rows))
        ker_rev = self._kernel(sigma, m)[::-1]
        left, w = _interp_index(t, m)
        need = np.unique(np.concatenate([left, left + 1]))
        # grid value j = sum_q ext[j + m//2 + m - 1 - q] ker[q]: the window of ext starting
        # at j + m//2 against the reversed kernel
        windows = np.lib.stride_tricks.sliding_window_view(ext, m, axis=1)
        vals = np.zeros((ext.shape[0], m))
        chunk = max(1, (1 << 21) // m)  # windows copied at a time: about 16 MB
        for row in range(ext.shape[0]):
            for lo in range(0, need.shape[0], chunk):
                j = need[lo : lo + chunk]
                vals[row, j] = windows[row, j + m // 2] @ ker_rev
        return vals[:, left] * (1.0 - w) + vals[:, left + 1] * w

    def at(self, sigma: float, t: np.ndarray) -> np.ndarray:
        """The first two rows (residuals and ones) at ``t``, through :meth:`grid_fft`."""
        m = _fine_points(sigma)
        left, w = _interp_index(t, m)
        vals = self.grid_fft(sigma, [0, 1])
        return vals[:, left] * (1.0 - w) + vals[:, left + 1] * w


def _interp_index(t: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Left grid index and weight of the right one for linear interpolation at ``t`` on the
    grid ``j/(m-1)`` (relplot's ``kernels.interpolate``)."""
    pos = t * (m - 1)
    left = np.clip(pos.astype(np.intp), 0, m - 2)
    return left, pos - left


def _smece_at(smoother: _Smoother, sigma: float) -> float:
    """relplot's ``smooth_ece(f, y, sigma)``; the smoother's rows are ``f - y`` and ones."""
    t = np.linspace(0.0, 1.0, _eval_points(sigma))
    resid, dens = smoother.at(sigma, t)
    dens = dens + _DENSITY_EPS
    smoothed = resid / dens
    return float(np.sum(np.abs(smoothed) * dens) / np.sum(dens))


def _search_sigma(value_at: Any) -> float:
    """relplot's bandwidth search (``metrics.search_param``): 1 if ``below(1)``, else the
    final upper end of a 10-step bisection of [0, 1] that moves its lower end to midpoints
    where ``below`` holds and its upper end to those where it does not, with
    ``below(s) = s < 1e-3 or s < smECE_s`` (not evaluated below 1e-3)."""

    def below(s: float) -> bool:
        return s < _SEARCH_EPS or s < value_at(s)

    if below(1.0):
        return 1.0
    hi, lo = 1.0, 0.0
    for _ in range(_SEARCH_STEPS):
        mid = (hi + lo) / 2.0
        if below(mid):
            lo = mid
        else:
            hi = mid
    return hi


def _check_sigma(sigma: Any) -> float | None:
    if sigma is None:
        return None
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float, np.integer, np.floating)):
        raise ValueError(f"sigma must be a positive number or None; got {sigma!r}")
    if not (math.isfinite(sigma) and sigma > 0.0):
        raise ValueError(f"sigma must be a finite number > 0; got {sigma!r}")
    return float(sigma)


def _smece_fit(
    conf: np.ndarray, corr: np.ndarray, sigma: float | None, with_outcomes: bool = False
) -> tuple[float, float, _Smoother]:
    """(smECE, its bandwidth, the smoother: rows ``f - y``, ones and, ``with_outcomes``, ``y``)."""
    smoother = _Smoother(conf, [conf - corr, None] + ([corr] if with_outcomes else []))
    cache: dict[float, float] = {}

    def value_at(s: float) -> float:
        if s not in cache:
            cache[s] = _smece_at(smoother, s)
        return cache[s]

    s = _search_sigma(value_at) if sigma is None else sigma
    return value_at(s), s, smoother


# --------------------------------------------------------------------------- public: smECE
def smece(confidence: Any, correct: Any, *, sigma: float | None = None) -> float:
    """Smooth ECE (smECE) of Błasiok & Nakkiran (ICLR 2024), as ``relplot`` 1.0.3 computes it.

    ``smece(f, y)`` equals ``relplot.smECE(f, y)`` and ``smece(f, y, sigma=s)`` equals
    ``relplot.smECE_sigma(f, y, s)`` (to about 1e-15; tested to 1e-6 on random, tied, edge and
    real data). relplot's default kernel is the reflected Gaussian
    (``relplot.config.use_logit_scaling = False``); its logit-Gaussian kernel, which
    torch-uncertainty's ``SmoothCalibrationError`` uses by default, is not implemented here.

    Definition, as discretised by relplot. With residuals ``r_i = f_i - y_i``, for a
    bandwidth ``s``:

    1. Fine grid of ``m = max(2000, round(20 / s)) // 2 + 1`` points ``j/(m-1)`` on [0, 1]
       (1001 points for ``s >= 0.01``). Each example's ``r_i`` and its weight 1 are split
       linearly between the two grid points around ``f_i``.
    2. The grid masses are reflected at 0 and 1 (mirror images without repeating the end
       points) and convolved with the Gaussian density of standard deviation ``s`` sampled on
       the grid and truncated at +-1/2 (for even ``m`` its sampled centre is half a grid step
       off, as in relplot). This gives ``R(t)`` (from ``r``) and ``D(t)`` (from the ones) on
       the grid, linearly interpolated in between.
    3. On ``T = max(round(10 / s), 200)`` equally spaced points ``t`` of [0, 1]:
       ``smECE_s = sum_t |R(t)| / sum_t (D(t) + 1e-4)`` (relplot writes the numerator as
       ``|R / (D + 1e-4)| * (D + 1e-4)``).

    Bandwidth (``sigma=None``): relplot's search for the fixed point ``s = smECE_s``. With
    ``below(s) = (s < 1e-3 or s < smECE_s)``: ``s = 1`` if ``below(1)``; otherwise a 10-step
    bisection of [0, 1] that keeps ``below`` true at its lower end and false at its upper
    end, returning the *upper* end, a multiple of 1/1024 (the midpoint 1/1024 < 1e-3 counts
    as below without evaluation, so the result is at least 2/1024; if every midpoint is
    below, it stays 1). smECE is ``smECE_s`` at that ``s``; where ``smECE_s`` decreases in
    ``s`` this brackets the fixed point from above within 1/1024.

    What relplot's discretisation does that one would not guess from the paper (the unscaled
    constant ``1e-4``, the truncated kernel, confidences exactly 0 or 1 counted at half
    weight), ties, float32 inputs and the speed: see the module docstring.

    Args:
        confidence: predictions ``f`` ``[N]`` in [0, 1] (for top-label calibration: the
            top-label confidence).
        correct: outcomes ``y`` ``[N]``, 0/1 or boolean (top-label: whether it is right).
        sigma: a fixed bandwidth ``s > 0`` (relplot's ``smECE_sigma``); ``None`` (default):
            the fixed point above.

    Returns:
        smECE as a float; ``nan`` when ``N == 0``.

    Raises:
        ValueError: arrays not 1-D or of different lengths, NaN, confidence outside [0, 1],
            correct not 0/1, sigma not a finite positive number.
    """
    sigma = _check_sigma(sigma)
    conf = check_confidence(confidence)
    corr = check_correct(correct, conf.shape[0])
    if conf.shape[0] == 0:
        return float("nan")
    return _smece_fit(conf, corr, sigma)[0]


def smece_bandwidth(confidence: Any, correct: Any) -> float:
    """The bandwidth ``s*`` :func:`smece` chooses: ``smece(f, y, sigma=s*) == smece(f, y)``."""
    conf = check_confidence(confidence)
    corr = check_correct(correct, conf.shape[0])
    if conf.shape[0] == 0:
        return float("nan")
    return _smece_fit(conf, corr, None)[1]


def _row_masses(conf: np.ndarray, corr: np.ndarray, m: int) -> np.ndarray:
    """Grid masses ``[2, R, m]`` (residuals ``f - y``, then ones) of every row of ``[R, k]``
    arrays, as :meth:`_Smoother.masses` (one weighted ``bincount`` per sum over all rows)."""
    R = conf.shape[0]
    pos = conf * (m - 1)
    left = np.minimum(np.floor(pos), m - 2)
    frac = pos - left
    flat = (left.astype(np.intp) + np.arange(R, dtype=np.intp)[:, None] * m).ravel()
    w = (conf - corr).ravel()
    frac = frac.ravel()
    masses = np.empty((2, R, m))
    for i, (total, right) in enumerate((
            (np.bincount(flat, weights=w, minlength=R * m),
             np.bincount(flat, weights=frac * w, minlength=R * m)),
            (np.bincount(flat, minlength=R * m).astype(np.float64),
             np.bincount(flat, weights=frac, minlength=R * m)))):
        got = (total - right).reshape(R, m)
        got[:, 1:] += right.reshape(R, m)[:, : m - 1]
        masses[i] = got
    return masses


@functools.lru_cache(maxsize=64)
def _kernel_spectrum(sigma: float, m: int, nfft: int) -> np.ndarray:  # the same at one β
    out = scipy.fft.rfft(_Smoother._kernel(sigma, m), nfft)
    out.flags.writeable = False
    return out


def _smece_of_masses(masses: np.ndarray, sigma: float) -> np.ndarray:
    """smECE ``[R]`` at bandwidth ``sigma`` of rows given by their grid masses ``[2, R, m]``
    (:func:`_smece_at`, all rows by one batched FFT)."""
    _, R, m = masses.shape
    part = _Smoother._reflect(masses.reshape(2 * R, m))[:, m // 2: m // 2 + 2 * m - 1]
    nfft = scipy.fft.next_fast_len(2 * m - 1, real=True)
    spec = scipy.fft.rfft(part, nfft, axis=1)
    spec *= _kernel_spectrum(sigma, m, nfft)
    grid = scipy.fft.irfft(spec, nfft, axis=1)[:, m - 1: 2 * m - 1]
    t = np.linspace(0.0, 1.0, _eval_points(sigma))
    at, w = _interp_index(t, m)
    vals = (grid[:, at] * (1.0 - w) + grid[:, at + 1] * w).reshape(2, R, -1)
    dens = vals[1] + _DENSITY_EPS
    return np.sum(np.abs(vals[0] / dens) * dens, axis=1) / np.sum(dens, axis=1)


def _rows_pair(confidence: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    conf = np.asarray(confidence, dtype=np.float64)
    corr = np.asarray(correct, dtype=np.float64)
    if conf.ndim != 2 or conf.shape != corr.shape:
        raise ValueError(f"confidence and correct must be [R, k] arrays of one shape; got "
                         f"{conf.shape} and {corr.shape}")
    return conf, corr


def smece_rows(confidence: Any, correct: Any, sigma: float) -> np.ndarray:
    """``smece(confidence[r], correct[r], sigma=sigma)`` of every row ``r`` of ``[R, k]``
    arrays at once (to FFT rounding, tested to 1e-9; 1e-13 on continuous data): the grid
    masses of all rows by one weighted ``bincount`` per sum, the smoothing by one batched
    FFT: about one evaluation of :func:`smece`'s bandwidth search (of about eleven) a row."""
    sigma = _check_sigma(sigma)
    if sigma is None:
        raise ValueError("smece_rows needs a fixed bandwidth sigma > 0")
    conf, corr = _rows_pair(confidence, correct)
    if conf.shape[1] == 0:
        return np.full(conf.shape[0], np.nan)
    return _smece_of_masses(_row_masses(conf, corr, _fine_points(sigma)), sigma)


def smece_prefix_rows(confidence: Any, correct: Any, counts: Any, sigmas: Any) -> np.ndarray:
    """``[R, len(counts)]``: :func:`smece_rows` of the leading ``counts[j]`` columns of every
    row at bandwidth ``sigmas[j]``, for nested prefixes at the cost of one: the grid masses
    of the longest prefix are accumulated stretch by stretch, each stretch's added once."""
    conf, corr = _rows_pair(confidence, correct)
    counts = [int(k) for k in counts]
    sigmas = [_check_sigma(s) for s in sigmas]
    if len(sigmas) != len(counts) or any(s is None for s in sigmas):
        raise ValueError("smece_prefix_rows needs one bandwidth sigma > 0 per count")
    out = np.full((conf.shape[0], len(counts)), np.nan)
    for m in sorted({_fine_points(s) for s in sigmas}):
        masses, done = np.zeros((2, conf.shape[0], m)), 0
        for j in sorted(range(len(counts)), key=counts.__getitem__):
            if _fine_points(sigmas[j]) != m or counts[j] == 0:
                continue
            if counts[j] > done:
                masses += _row_masses(conf[:, done:counts[j]], corr[:, done:counts[j]], m)
                done = counts[j]
            out[:, j] = _smece_of_masses(masses, sigmas[j])
    return out


class SmoothReliability(NamedTuple):
    """A smooth reliability diagram (:func:`smooth_reliability`): draw ``y`` against ``x``
    (with the diagonal for reference), optionally with line width or shading from
    ``density``."""

    #: the grid, ``n_grid`` equally spaced points of [0, 1]
    x: np.ndarray
    #: the kernel-smoothed accuracy ``E[y | f = x]`` at each grid point
    y: np.ndarray
    #: the kernel density of the confidences at each grid point (integrates to about 1; less
    #: where confidences lie exactly at 0 or 1, see :func:`smece`)
    density: np.ndarray
    #: the bandwidth used
    sigma: float
    #: smECE at that bandwidth
    smece: float


def smooth_reliability(
    confidence: Any, correct: Any, *, sigma: float | None = None, n_grid: int = _PLOT_MESH
) -> SmoothReliability:
    """The data of a smooth reliability diagram, as relplot's ``rel_diagram`` draws it.

    Equals the ``mesh``, ``mu``, ``density``, ``sigma`` and ``ce`` of
    ``relplot.prepare_rel_diagram(f, y, plot_confidence_band=False, report_CE_std=False)``
    (relplot 1.0.3, whose default is without bootstrap), for ``n_grid = 200``
    (``relplot.config.plot_mesh_pts``):

    * ``x``: ``n_grid`` equally spaced points of [0, 1];
    * ``y``: the kernel-smoothed accuracy ``Y(x) / (D(x) + 1e-4)``, where ``Y`` and ``D`` are
      the outcomes and ones smoothed with the reflected Gaussian kernel as in :func:`smece`
      (the same discretisation; the ``1e-4`` is relplot's guard, negligible unless the
      density of the data near ``x`` is tiny, where ``y`` then falls towards 0);
    * ``density``: ``D(x) / N``, the kernel density of the confidences (it integrates to
      1 less half the share of examples exactly at 0 or 1, which relplot's reflection counts
      at half weight, see :func:`smece`);
    * ``sigma``: the bandwidth, by default smECE's fixed point (see :func:`smece`);
    * ``smece``: :func:`smece` at that bandwidth.

    With ``sigma`` given, the curve, the density *and* ``smece`` use it (relplot's
    ``kde_bandwidth`` changes the curve and the density only, its ``ce`` keeps the automatic
    bandwidth). The curve's grid values are computed by direct sums, not by FFT, so ``y``
    stays exact even where ``D`` is tiny.

    Args:
        confidence, correct: as for :func:`smece`.
        sigma: a fixed bandwidth ``> 0``, or ``None`` for smECE's fixed point.
        n_grid: number of grid points (>= 2; default 200).

    Returns:
        :class:`SmoothReliability`; for ``N == 0`` its ``y``, ``density``, ``sigma`` and
        ``smece`` are ``nan``.
    """
    sigma = _check_sigma(sigma)
    if isinstance(n_grid, bool) or not isinstance(n_grid, (int, np.integer)) or n_grid < 2:
        raise ValueError(f"n_grid must be an integer >= 2; got {n_grid!r}")
    conf = check_confidence(confidence)
    corr = check_correct(correct, conf.shape[0])
    x = np.linspace(0.0, 1.0, int(n_grid))
    n = conf.shape[0]
    if n == 0:
        nan = np.full(x.shape, np.nan)
        return SmoothReliability(x, nan, nan.copy(), float("nan"), float("nan"))
    value, s, smoother = _smece_fit(conf, corr, sigma, with_outcomes=True)
    ys, dens = smoother.at_direct(s, x, [2, 1])
    return SmoothReliability(x, ys / (dens + _DENSITY_EPS), dens / n, float(s), value)


# --------------------------------------------------------------------------- class-wise ECE
def _check_probabilities(probabilities: Any) -> np.ndarray:
    try:
        pr = np.asarray(probabilities, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"probabilities must be a numeric [N, K] array; got {type(probabilities).__name__}"
        ) from exc
    if pr.ndim != 2 or pr.shape[1] == 0:
        raise ValueError(f"probabilities must have shape [N, K] with K >= 1; got {pr.shape}")
    bad = ~np.isfinite(pr) | (pr < 0.0) | (pr > 1.0)
    if bad.any():
        i, k = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(
            f"probabilities must be finite and lie in [0, 1]; "
            f"probabilities[{i}, {k}] = {float(pr[i, k])!r} (row {i})"
        )
    off = np.abs(pr.sum(axis=1) - 1.0) > _ROW_SUM_TOL
    if off.any():
        i = int(np.flatnonzero(off)[0])
        raise ValueError(
            f"each row of probabilities must sum to 1 (within {_ROW_SUM_TOL:g}); "
            f"row {i} sums to {float(pr[i].sum())!r}"
        )
    return pr


def _check_labels(labels: Any, n: int, k: int) -> np.ndarray:
    lab = np.asarray(labels)
    if lab.ndim != 1 or lab.shape[0] != n:
        raise ValueError(f"labels must have shape [{n}]; got {lab.shape}")
    if lab.size and not np.issubdtype(lab.dtype, np.integer):
        raise ValueError(f"labels must be integers; got dtype {lab.dtype}")
    if lab.size:
        bad = (lab < 0) | (lab >= k)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"labels must lie in [0, {k}); labels[{i}] = {int(lab[i])}")
    return lab.astype(np.intp, copy=False)


def _equal_width_stats(
    pr: np.ndarray, lab: np.ndarray, n_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts, mean probability and frequency of the class per equal-width bin and class,
    each ``[K, n_bins]``; bin ``b`` holds ``b/n_bins < p <= (b+1)/n_bins`` (0 in bin 0), with
    the edges ``i * 1.0 / n_bins`` of ``calibration.get_equal_prob_bins``."""
    n, k = pr.shape
    edges = np.arange(1, n_bins + 1) * 1.0 / n_bins
    flat = np.searchsorted(edges, pr.ravel(), side="left").reshape(n, k)
    flat += np.arange(k) * n_bins  # bin index within class k's block
    size = k * n_bins
    counts = np.bincount(flat.ravel(), minlength=size)
    sums = np.bincount(flat.ravel(), weights=pr.ravel(), minlength=size)
    hits = np.bincount(flat[np.arange(n), lab], minlength=size)  # examples of class k
    nonempty = counts > 0
    conf_mean = np.zeros(size)
    acc_mean = np.zeros(size)
    conf_mean[nonempty] = sums[nonempty] / counts[nonempty]
    acc_mean[nonempty] = hits[nonempty] / counts[nonempty]
    shape = (k, n_bins)
    return counts.reshape(shape), conf_mean.reshape(shape), acc_mean.reshape(shape)


def classwise_ece(
    probabilities: Any, labels: Any, *, p: float = 1, n_bins: int = 15,
    binning: str = "equal-mass", debias: bool = False, rng: Any = None,
) -> float:
    """Class-wise (marginal) expected calibration error of Kull et al. (NeurIPS 2019).

    For each class ``k`` the probabilities ``p_k = probabilities[:, k]`` are binned and
    compared with the indicators ``1[labels == k]``:
    ``CE_k = (sum_b |B_kb|/N * |mean p_k in B_kb - frequency of class k in B_kb|^p)^(1/p)``;
    the result is ``(mean_k CE_k^p)^(1/p)`` — for ``p = 1`` the plain average of the per-class
    ECEs, Kull et al.'s classwise-ECE; for ``p = 2`` the root of the mean squared per-class
    ECE_2, *not* the mean of the per-class ECE_2 (this is how the library aggregates).

    ``binning="equal-mass"`` (default): exactly
    ``calibration.lower_bound_scaling_ce(probabilities, labels, p=p, debias=debias,
    num_bins=n_bins, binning_scheme=calibration.get_equal_bins, mode="marginal")`` of the
    ``uncertainty-calibration`` package 0.1.4 (tested to 1e-12 on float64 inputs): every
    class has its own equal-mass bins, made from its ``N`` probabilities exactly as
    :func:`selbench.measure.metrics.ece` makes them from the confidences (parts as
    ``np.array_split``, edges at midpoints, ties merged, ``min(n_bins, N)`` parts).
    ``binning="equal-width"``: ``n_bins`` bins of width ``1/n_bins`` on [0, 1] per class, as
    Kull et al. describe; bin ``b`` holds ``b/n_bins < p_k <= (b+1)/n_bins`` (0 in the first
    bin), the library's ``get_equal_prob_bins`` convention. How both relate to the library's
    ``get_calibration_error`` and to torchmetrics-style implementations, ``debias``, and the
    speed: see the module docstring.

    Args:
        probabilities: ``[N, K]``, finite, in [0, 1], rows summing to 1 within 1e-6.
        labels: ``[N]`` integers in ``[0, K)``.
        p: exponent >= 1.
        n_bins: bins per class (equal-mass: before tie merging; at most ``N``).
        binning: ``"equal-mass"`` or ``"equal-width"``.
        debias: use the library's debiased estimators.
        rng: for ``debias=True`` and ``p != 2`` only: a ``numpy.random.Generator``, a seed or
            ``None``, drawn from class after class; a legacy ``numpy.random.RandomState(s)``
            reproduces the library after ``np.random.seed(s)``.

    Returns:
        The class-wise ECE as a float; ``nan`` when ``N == 0``.

    Raises:
        ValueError: bad shapes, probabilities not finite / outside [0, 1] / rows not summing
            to 1 (the first bad row is named), labels not integers in ``[0, K)``, ``p < 1``,
            ``n_bins < 1``, unknown ``binning``; with ``debias`` and ``p != 2``, a bin with
            fewer than 2 examples.
    """
    p = check_p(p)
    n_bins = check_n_bins(n_bins)
    if binning not in ("equal-mass", "equal-width"):
        raise ValueError(f"binning must be 'equal-mass' or 'equal-width'; got {binning!r}")
    pr = _check_probabilities(probabilities)
    n, k = pr.shape
    lab = _check_labels(labels, n, k)
    if n == 0:
        return float("nan")
    debias = bool(debias)
    gen = _class_generator(rng, debias, p)
    per_class = _equal_width_ces if binning == "equal-width" else _equal_mass_ces
    ces = per_class(pr, lab, p, n_bins, debias, gen)
    return float(np.mean(ces**p) ** (1.0 / p))


def _class_generator(rng: Any, debias: bool, p: float) -> Any:
    """The randomness of :func:`classwise_ece`: a legacy ``RandomState`` as is, a fresh
    generator from ``rng`` when the debiased ECE draws (``p != 2``), else ``None``."""
    # one generator for all classes (a seed would otherwise restart it for every class)
    gen = rng if isinstance(rng, np.random.RandomState) else None
    if debias and p != 2 and gen is None:
        gen = np.random.default_rng(rng)
    return gen


def _equal_width_ces(
    pr: np.ndarray, lab: np.ndarray, p: float, n_bins: int, debias: bool, gen: Any
) -> np.ndarray:
    """The calibration error of every class ``[K]`` with equal-width bins."""
    k = pr.shape[1]
    ces = np.empty(k)
    counts, conf_mean, acc_mean = _equal_width_stats(pr, lab, n_bins)
    for c in range(k):
        ces[c] = ece_from_stats(counts[c], conf_mean[c], acc_mean[c], p, debias, gen)
    return ces


def _equal_mass_ces(
    pr: np.ndarray, lab: np.ndarray, p: float, n_bins: int, debias: bool, gen: Any
) -> np.ndarray:
    """The calibration error of every class ``[K]`` with its own equal-mass bins: one
    batched sort of the columns or, from ``BUCKETED_MIN_N`` examples, the sort-free binning."""
    n, k = pr.shape
    ces = np.empty(k)
    cols = np.ascontiguousarray(pr.T)
    if n >= BUCKETED_MIN_N:  # linear time per class, as selbench.measure.metrics.ece
        for c in range(k):
            hit = (lab == c).astype(np.float64)
            ces[c] = ece_from_stats(*bin_stats_bucketed(cols[c], hit, n_bins), p,
                                     debias, gen)
    else:
        order = np.argsort(cols, axis=1)
        sorted_cols = np.take_along_axis(cols, order, axis=1)
        sorted_hits = (lab[order] == np.arange(k)[:, None]).astype(np.float64)
        for c in range(k):
            ces[c] = ece_from_stats(*bin_stats(sorted_cols[c], sorted_hits[c], n_bins),
                                     p, debias, gen)
    return ces
