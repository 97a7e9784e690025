"""Risk–coverage metrics of selective classification: the risk–coverage curve, AURC,
E-AURC, AUGRC, coverage at a risk level and risk at a coverage level.

Every function takes plain arrays and returns floats (or float64 arrays):

* ``scores`` ``[N]``: selector scores, higher = accepted first (the model's confidence, a
  learned selector's score, ...), compared as float64 (float32 input converts exactly). Only
  their order matters, so any finite values, however large, are fine; NaN and +-inf are
  rejected, as by every selbench metric (:mod:`selbench.measure.validation`).
* ``correct`` ``[N]``: 0/1 (or boolean) correctness of the prediction.

**All rows at once.** :func:`aurc`, :func:`eaurc` and :func:`augrc` carry a vectorised form,
``fn.batched(scores, correct) -> [R]`` over ``[R, m]`` arrays (one evaluation set per row,
e.g. bootstrap resamples: the hook of :func:`selbench.measure.bootstrap.selective_intervals`), equal
to ``fn`` row by row to float64 rounding (tested to 1e-12), ties merged per row. The three
share one computation: one sort of every row gives all three areas, and the last result is
remembered (per thread, keyed by the content of the input, see ``_rc_rows``), so the three
hooks called on the same rows sort them once. At ``R = 200``, ``m = 3000`` the three together
take about 20 ms on one core (the sort about 11 ms of it), against about 100 ms for 600 calls
of the scalar functions.

A threshold ``t`` accepts the examples with ``scores >= t``. With ``k`` accepted examples of
which ``e`` are wrong, the *coverage* is ``k / N``, the *selective risk* ``e / k`` (the error
rate, 1 - accuracy, of the accepted examples) and the *generalized risk* ``e / N`` (Traub et
al. 2024). All values are in raw units, fractions in ``[0, 1]`` (fd-shifts reports its areas
multiplied by its ``AUC_DISPLAY_SCALE = 1000``; these functions do not).

**Ties are merged.** The thresholds are the distinct score values: examples with equal scores
are accepted together or not at all, so the curve has one point per distinct score,
``(k_j / N, e_j / k_j)`` for ``j = 1..D`` with ``k_j`` the number of examples whose score is at
least the ``j``-th largest distinct score and ``e_j`` the errors among them. The result
therefore depends only on the multiset of ``(score, correct)`` pairs, never on the order of
the examples. This is the rule of fd-shifts' ``RiskCoverageStats`` (IML-DKFZ/fd-shifts,
``fd_shifts/analysis/rc_stats.py`` and ``rc_stats_utils.py``, read at commit ``c4467ae``
(2024-10-19); those files last changed in ``a0fe0bc``, 2024-06-18): ``selective_risk_stats``
and ``generalized_risk_stats`` walk the examples by ascending confidence and add a point only
where the confidence changes. It differs on purpose from selbench's *exact-coverage*
selection (:func:`selbench.measure.metrics.accept_mask`), which breaks ties by a seeded permutation
to meet a coverage level exactly: the ranking metrics here follow the literature.

**Integration rule** (fd-shifts' ``evaluate_auc`` with its default ``interpolation="linear"``,
i.e. ``-np.trapz(risks, coverages)``): the trapezoidal rule over the merged-tie points plus
fd-shifts' anchor point at coverage 0, whose selective risk is that of the first point (the
curve is extended flat to coverage 0) and whose generalized risk is 0. Over a tied group of
``n_g`` examples between consecutive points the area is ``(n_g / N) * (r_prev + r_next) / 2``:
the risk is interpolated linearly across the group. For the generalized risk this equals the
average over all orders inside the group (the expected errors grow linearly through it); for
the selective risk ``e / k`` it does not quite, but it is what fd-shifts computes, and it
keeps the AURC a function of the scores alone. fd-shifts' "non-linear" interpolation
(exact integration of ``e / k`` between points) serves only its ``aurc_achievable`` and is
not used here.

**Conventions differing from torch-uncertainty 0.13.0**
(``torch_uncertainty/metrics/classification/risk_coverage.py``): it scores by the maximum
probability of ``[N, K]`` probabilities, orders the examples by
``scores.argsort(descending=True)`` (``stable=False``: **ties are broken**, in an order the
library leaves unspecified; one point per example), omits the coverage-0 anchor and divides the trapezoidal area over
``[1/N, 1]`` by ``1 - 1/N`` (``nan`` for ``N < 2``); its coverages ``k / N`` are float32
unless torch's default dtype is float64. On tie-free data, with ``r_1`` the error (0 or 1) of
the top-scored example, ``e_1 = r_1``:

* ``AURC_tu = (aurc - r_1 / N) / (1 - 1/N)``,
* ``AUGRC_tu = (augrc - e_1 / (2 N^2)) / (1 - 1/N)``,

differences of order ``1/N`` (tests/test_metrics_riskcov.py checks both to 1e-12 with torch's
default dtype at float64). ``CovAtxRisk`` and ``RiskAtxCov``: see :func:`coverage_at_risk`
and :func:`risk_at_coverage`.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from selbench.measure.validation import as_float_1d, check_correct, check_scores

__all__ = [
    "augrc",
    "aurc",
    "coverage_at_risk",
    "eaurc",
    "rc_counts",
    "risk_at_coverage",
    "risk_coverage_curve",
]


# --------------------------------------------------------------------------- internals
def _inputs(scores: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validated float64 ``scores`` (finite) and 0/1 ``correct`` of the same length."""
    sc = check_scores(scores)
    n = sc.shape[0]
    corr = as_float_1d(correct, "correct")
    if corr.shape[0] != n:
        raise ValueError(f"correct must have the same length as scores ({n}); got {corr.shape[0]}")
    return sc, check_correct(corr, n)


def _groups(sc: np.ndarray, corr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(k, e)``, int64 ``[D]``: accepted and wrong counts at each distinct score, from the
    largest score (smallest coverage) down to the smallest (``k[-1] == N``). ``N >= 1``.

    One sort of the scores gives the distinct values and ``k``; the errors per distinct value
    come from a sort of the scores of the minority class (wrong or correct examples), located
    among the distinct values by a binary search of the sorted queries. No argsort and no
    gathers through a random permutation. Measured at N = 1e6 against ``argsort`` plus the
    gathers: about a third less time at a 10% error rate, 5-10% less at 40-60%, half with
    many ties. The order inside a tie is never looked at."""
    n = sc.shape[0]
    s = np.sort(sc)
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(s[1:], s[:-1], out=new[1:])  # -0.0 == 0.0: one tie
    starts = np.flatnonzero(new)  # first index of every distinct value, ascending
    values = s[starts]
    k = n - starts[::-1]  # examples with a score >= each distinct value, descending values
    wrong = corr == 0.0
    n_wrong = int(np.count_nonzero(wrong))
    minority = wrong if 2 * n_wrong <= n else ~wrong
    group = np.searchsorted(values, np.sort(sc[minority]))  # exact matches: the value's index
    e = np.cumsum(np.bincount(group, minlength=values.shape[0])[::-1], dtype=np.int64)
    return k, (e if minority is wrong else k - e)


def _level(x: Any, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number in [0, 1]; got {x!r}")
    if not (0.0 <= x <= 1.0):  # also rejects nan
        raise ValueError(f"{name} must lie in [0, 1]; got {x!r}")
    return float(x)


def _aurc(k: np.ndarray, e: np.ndarray, n: int) -> float:
    r = e / k
    # anchor (0, r_1) to (k_1/N, r_1): k_1 r_1 / N = e_1 / N; then trapezoids between points
    # float64 dot (BLAS): an int64 x float64 dot takes the generic loop, ~20x slower
    return float((2.0 * e[0] + np.dot(np.diff(k).astype(np.float64), r[1:] + r[:-1])) / (2.0 * n))


def _augrc(k: np.ndarray, e: np.ndarray, n: int) -> float:
    # trapezoids from (0, 0) over (k_j/N, e_j/N): sum (k_j - k_{j-1}) (e_j + e_{j-1}) / (2 N^2),
    # summed exactly in integers (the total, 2 N^2 AUGRC <= N^2, fits int64 up to N ~ 3e9)
    dk = np.diff(k, prepend=0)
    esum = e + np.concatenate(([0], e[:-1]))
    return float(int(np.dot(dk, esum)) / (2.0 * n * n))


def _oracle_aurc(err: float) -> float:
    """Geifman et al. (2019)'s AURC of a perfect ranking at error rate ``err``:
    ``err + (1 - err) ln(1 - err)``, with ``(1 - err) ln(1 - err) = 0`` at ``err = 1``."""
    if err >= 1.0:
        return 1.0
    return err + (1.0 - err) * math.log1p(-err)


# --------------------------------------------------------------------------- public
def risk_coverage_curve(
    scores: Any, correct: Any, *, generalized: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The risk–coverage curve, ties merged: one point per distinct score.

    Definition: for each distinct score ``t_j`` (``t_1 > t_2 > ... > t_D``) the threshold
    accepts the ``k_j`` examples with ``scores >= t_j``, ``e_j`` of them wrong; the point is
    ``(k_j / N, e_j / k_j)`` — coverage and selective risk (Geifman & El-Yaniv, "Selective
    classification for deep neural networks", NeurIPS 2017) — or, with ``generalized=True``,
    ``(k_j / N, e_j / N)``, the generalized risk of Traub et al., "Overcoming common flaws in
    the evaluation of selective classification systems", NeurIPS 2024.

    Ties: examples with equal scores are accepted together (merged), as fd-shifts'
    ``RiskCoverageStats`` (``selective_risk_stats`` / ``generalized_risk_stats`` in
    ``fd_shifts/analysis/rc_stats_utils.py``, commit ``c4467ae``) does; see the module notes.
    fd-shifts lists the points by *descending* coverage and appends an anchor at coverage 0
    (selective risk: that of the lowest-coverage point; generalized risk: 0), which the areas
    (:func:`aurc`, :func:`augrc`) include; this function returns the ``D`` points only, by
    ascending coverage.

    Args:
        scores: selector scores ``[N]``, finite, higher = accepted first.
        correct: 0/1 (or boolean) correctness ``[N]``.
        generalized: return the generalized risk ``e / N`` instead of the selective risk.

    Returns:
        ``(coverage, risk)``, float64 ``[D]``, coverage strictly increasing to 1.0.
        All scores tied: one point ``(1.0, error rate)``. ``N = 0``: two empty arrays.
    """
    sc, corr = _inputs(scores, correct)
    n = sc.shape[0]
    if n == 0:
        return np.empty(0), np.empty(0)
    k, e = _groups(sc, corr)
    return k / n, e / (n if generalized else k)


def rc_counts(scores: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    """The merged-tie points of :func:`risk_coverage_curve` as counts: ``(k, e)``, int64
    ``[D]`` by ascending coverage, ``k_j`` the examples with a score at least the ``j``-th
    largest distinct score and ``e_j`` the wrong ones among them (``k[-1] == N``). Both
    empty for ``N = 0``. What :mod:`selbench.measure.rcstats` builds fd-shifts' statistics on."""
    sc, corr = _inputs(scores, correct)
    if sc.shape[0] == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return _groups(sc, corr)


def aurc(scores: Any, correct: Any) -> float:
    """Area under the (selective) risk–coverage curve, ties merged, raw units (not x1000).

    Definition (Geifman & El-Yaniv, NeurIPS 2017; Geifman, Uziel & El-Yaniv, ICLR 2019):
    the integral over coverage in ``[0, 1]`` of the selective risk, evaluated as fd-shifts'
    ``RiskCoverageStats.aurc`` (commit ``c4467ae``; ``evaluate_auc`` with its default linear
    interpolation, ``-np.trapz(risks, coverages)``): the trapezoidal rule over the merged-tie
    points of :func:`risk_coverage_curve` plus the anchor ``(0, r_1)``::

        AURC = k_1 r_1 / N + sum_{j>=2} (k_j - k_{j-1}) / N * (r_j + r_{j-1}) / 2

    with ``r_j = e_j / k_j``. Over a tied group the risk is interpolated linearly between the
    points before and after it; no ordering inside the group is assumed.

    No closed form in AUROC: unlike :func:`augrc`, this AURC is not a function of the error
    rate and the AUROC alone, because the selective risk weights an error ranked at position
    ``k`` by ``~1/k`` (e.g. the tie-free orders correct, wrong, wrong, correct and wrong,
    correct, correct, wrong have the same error rate and AUROC, 0.5, but AURCs 0.354 and
    0.646).

    Differences from torch-uncertainty 0.13.0's ``AURC``: ties broken instead of merged, no
    coverage-0 anchor and a ``1 / (1 - 1/N)`` rescaling (module notes); ``nan`` for ``N < 2``.

    ``aurc.batched(scores, correct)``: the same for every row of ``[R, m]`` arrays,
    float64 ``[R]`` (module notes).

    Returns:
        AURC in ``[0, 1]``. All correct: 0.0; all wrong: 1.0; all scores tied: the error
        rate; ``N = 1``: the example's error; ``N = 0``: ``nan``.
    """
    sc, corr = _inputs(scores, correct)
    n = sc.shape[0]
    if n == 0:
        return float("nan")
    return _aurc(*_groups(sc, corr), n)


def eaurc(scores: Any, correct: Any) -> float:
    """Excess AURC: :func:`aurc` minus the AURC of an oracle of the same accuracy.

    Definition (Geifman, Uziel & El-Yaniv, "Bias-reduced uncertainty estimation for deep
    neural classifiers", ICLR 2019): ``E-AURC = AURC - AURC*`` with the oracle's
    ``AURC* = pi + (1 - pi) ln(1 - pi)``, ``pi`` the error rate — the analytic formula (the
    continuous limit of a perfect ranking), as fd-shifts' ``RiskCoverageStats.eaurc`` /
    ``aurc_optimal`` for binary residuals (commit ``c4467ae``; it evaluates
    ``ln(1 - pi + eps)`` with float64 ``eps``, which changes the result by at most ~2e-16;
    here ``(1 - pi) ln(1 - pi)`` is taken as 0 at ``pi = 1``). Raw units (fd-shifts: x1000).

    Ties: merged in the AURC (see :func:`aurc`); the oracle term depends on ``pi`` only.
    Because it is the continuous limit while the AURC is a finite-N trapezoidal sum, a
    perfect ranking has a slightly negative E-AURC at small ``N`` (``-0.028`` for one correct
    and one wrong example; fd-shifts computes the same), tending to 0 as ``N`` grows.

    ``eaurc.batched(scores, correct)``: the same for every row of ``[R, m]`` arrays,
    float64 ``[R]`` (module notes).

    Returns:
        E-AURC. All correct or all wrong: 0.0; all scores tied: ``-(1 - pi) ln(1 - pi)``;
        ``N = 0``: ``nan``.
    """
    sc, corr = _inputs(scores, correct)
    n = sc.shape[0]
    if n == 0:
        return float("nan")
    k, e = _groups(sc, corr)
    return _aurc(k, e, n) - _oracle_aurc(int(e[-1]) / n)


def augrc(scores: Any, correct: Any) -> float:
    """Area under the generalized risk–coverage curve, ties merged, raw units (not x1000).

    Definition (Traub, Bungert, Lüth, Baumgartner, Maier-Hein, Maier-Hein & Jaeger,
    "Overcoming common flaws in the evaluation of selective classification systems",
    NeurIPS 2024): the integral over coverage of the generalized risk ``e / N`` (errors among
    the accepted over all examples), evaluated as fd-shifts' ``RiskCoverageStats.augrc``
    (commit ``c4467ae``): the trapezoidal rule over the merged-tie points of
    ``risk_coverage_curve(..., generalized=True)`` plus the anchor ``(0, 0)``::

        AUGRC = sum_j (k_j - k_{j-1}) (e_j + e_{j-1}) / (2 N^2),   k_0 = e_0 = 0,

    summed exactly in integers (one rounding). Across a tied group the generalized risk is
    interpolated linearly, which is exactly the average over all orderings of the group.

    Closed form: with ``pi`` the error rate and ``AUROC_f`` the AUROC of the scores for
    separating correct from wrong predictions with ties counted one half
    (``sklearn.metrics.roc_auc_score(correct, scores)``),
    ``AUGRC = pi^2 / 2 + pi (1 - pi) (1 - AUROC_f)`` holds exactly for this rule: a tied group
    with ``c_g`` correct and ``w_g`` wrong examples contributes
    ``(c_g + w_g)(2 E + w_g) / (2 N^2)`` (``E`` errors ranked above it), and summing ``w_g``'s
    share gives ``pi^2 / 2`` and ``c_g``'s the count of (correct, wrong) pairs with the wrong
    one ranked higher plus half the tied pairs. (The AURC has no such form; see :func:`aurc`.)

    Differences from torch-uncertainty 0.13.0's ``AUGRC``: ties broken, no ``(0, 0)`` anchor
    and a ``1 / (1 - 1/N)`` rescaling (module notes); ``nan`` for ``N < 2``.

    ``augrc.batched(scores, correct)``: the same for every row of ``[R, m]`` arrays,
    float64 ``[R]`` (module notes).

    Returns:
        AUGRC in ``[0, 1/2]``. All correct: 0.0; all wrong: 0.5; all scores tied: ``pi / 2``;
        ``N = 1``: half the example's error; ``N = 0``: ``nan``.
    """
    sc, corr = _inputs(scores, correct)
    n = sc.shape[0]
    if n == 0:
        return float("nan")
    return _augrc(*_groups(sc, corr), n)


def coverage_at_risk(scores: Any, correct: Any, risk: float) -> float:
    """The largest coverage whose selective risk is at most ``risk``, ties merged.

    Definition: ``max {k_j / N : e_j / k_j <= risk}`` over the points of
    :func:`risk_coverage_curve` (one per distinct score; the selective risk need not be
    monotone, so this is the largest qualifying coverage, not the first crossing). The risk
    ``e_j / k_j`` is the correctly rounded float64 quotient, compared with ``risk`` as given.
    This is the working point fd-shifts' ``RiskCoverageStats.get_working_point(
    risk="selective-risk", target_risk=risk)`` returns (commit ``c4467ae``; the largest
    qualifying coverage is always one of its "working points") where one qualifies; fd-shifts
    raises when none does.

    When no threshold qualifies (every point's risk exceeds ``risk``) the result is 0.0:
    rejecting everything is the only selection meeting the risk. torch-uncertainty 0.13.0's
    ``CovAtxRisk`` returns ``nan`` there; it also breaks ties (one point per example, so it
    may report a coverage that splits a tie), and returns ``(k / N)`` in float32 unless
    torch's default dtype is float64. On tie-free data the two agree otherwise.

    Args:
        scores, correct: as :func:`risk_coverage_curve`.
        risk: the risk level, a number in ``[0, 1]``.

    Returns:
        A coverage in ``[0, 1]``: 1.0 when the overall error rate is at most ``risk``
        (all correct: 1.0 for every level); all wrong: 0.0 below ``risk = 1``; all scores
        tied: 1.0 or 0.0; ``N = 0``: ``nan``.
    """
    level = _level(risk, "risk")
    sc, corr = _inputs(scores, correct)
    n = sc.shape[0]
    if n == 0:
        return float("nan")
    k, e = _groups(sc, corr)
    ok = np.flatnonzero(e / k <= level)
    return float(k[ok[-1]] / n) if ok.size else 0.0


def risk_at_coverage(scores: Any, correct: Any, coverage: float) -> float:
    """The selective risk at the smallest merged-tie point with coverage at least ``coverage``.

    Definition: ``e_j / k_j`` for the smallest ``j`` with ``k_j / N >= coverage`` (``k_j / N``
    the correctly rounded float64 quotient, so ``coverage = 0.55`` with ``N = 100`` selects
    ``k = 55``), over the points of :func:`risk_coverage_curve`. With ties the point may cover
    more than ``coverage`` (the whole tied group at the threshold is accepted), never less;
    ``coverage = 0`` gives the risk of the top-scored tied group.

    Conventions of the peers: torch-uncertainty 0.13.0's ``RiskAtxCov`` returns
    ``error_rates[ceil(N * coverage) - 1]`` over a tie-broken order: it splits ties, its
    ``ceil`` of the floating-point product can overshoot by one (``N = 100``,
    ``coverage = 0.55``: ``100 * 0.55 = 55.00000000000001``, so ``k = 56``), and at
    ``coverage = 0`` the index ``-1`` wraps around to the full-coverage risk. On tie-free
    data, where ``N * coverage`` is computed exactly and ``coverage > 0``, the two agree.
    fd-shifts' ``get_working_point(target_cov=...)`` instead returns the *lowest* risk over
    all points with coverage at least ``coverage`` (its working points are the running
    minima), which differs from this wherever the curve is not monotone.

    Args:
        scores, correct: as :func:`risk_coverage_curve`.
        coverage: the coverage level, a number in ``[0, 1]``.

    Returns:
        A selective risk in ``[0, 1]``. All correct: 0.0; all wrong: 1.0; all scores tied:
        the error rate; ``N = 0``: ``nan``.
    """
    level = _level(coverage, "coverage")
    sc, corr = _inputs(scores, correct)
    n = sc.shape[0]
    if n == 0:
        return float("nan")
    k, e = _groups(sc, corr)
    j = int(np.searchsorted(k / n, level, side="left"))  # k[-1] / n == 1.0 >= level
    return float(e[j] / k[j])


# --------------------------------------------------------------------------- all rows at once
# ``aurc.batched``, ``eaurc.batched`` and ``augrc.batched``: the three areas of every row of
# ``[R, m]`` arrays (the hook of selbench.measure.bootstrap.selective_intervals, which calls them one
# after the other on the same resampled rows). They share one computation, _rc_rows, which
# sorts every row once and remembers its last input and result.

_BLOCK_ENTRIES = 1 << 16  # entries per block of rows: the working arrays stay in the CPU cache
_MEMO_ENTRIES = 1 << 21  # largest input remembered (two copies of it are kept, see _rc_rows)
_memo = threading.local()  # per thread: (scores copy, correct copy, result [3, R])
_MAG = np.int64(0x7FFF_FFFF_FFFF_FFFF)  # the bits of a float64 but its sign


def _as_rows(x: Any, name: str) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a 2-D numeric array [R, m]; got {type(x).__name__}"
                         ) from exc
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array [R, m] (one row per resample); "
                         f"got shape {arr.shape}")
    return arr


def _check_rows(sc: np.ndarray, corr: np.ndarray) -> None:
    """The checks of :func:`_inputs`, for every row of ``[R, m]`` arrays."""
    bad = ~np.isfinite(sc)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        if np.isnan(sc[at]):
            raise ValueError(f"scores contains NaN at index {list(at)}")
        raise ValueError(f"scores must be finite; scores{list(at)} = {float(sc[at])!r}")
    bad = (corr != 0.0) & (corr != 1.0)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"correct must be 0/1 (or boolean); correct{list(at)} = "
                         f"{float(corr[at])!r}")


def _int_keys(sc: np.ndarray) -> tuple[np.ndarray, int, int] | None:
    """int64 keys ``[r, m]`` of the scores, in their order and equal exactly where they are
    (``-0.0 == 0.0``), with the least and the greatest key; ``None`` if the keys would span
    ``2**63`` or more (so that they could not be packed with a flag bit into 64 bits).

    Non-negative floats: their bits, which are in order. With negative scores the magnitude
    bits of the negative ones are flipped (``-1 - magnitude``); that spans less than ``2**63``
    unless the magnitudes reach about 2 on both sides of 0 (``2 = 2**62`` as bits). Then the
    magnitudes are counted from just below the smallest non-zero one, ``d``, with the sign
    put back (``±(magnitude - d + 1)``, 0 for 0), which spans less than ``2**63`` unless the
    non-zero magnitudes span some 1000 binades (``1e-300`` and ``1e10``); only then ``None``."""
    lo, hi = float(sc.min()), float(sc.max())
    bits = np.add(sc, 0.0).view(np.int64)  # + 0.0: -0.0 becomes 0.0 (one tie)
    ext = (np.array([lo, hi]) + 0.0).view(np.int64)  # the same for the extremes
    if lo >= 0.0:
        return bits, int(ext[0]), int(ext[1])
    lo_key, hi_key = (int(x) for x in _flip_negative(ext.copy()))
    if hi_key - lo_key < 1 << 63:
        return _flip_negative(bits), lo_key, hi_key
    mag = bits & _MAG
    d = int(np.min(mag, where=mag != 0, initial=_MAG))  # lo < 0 < hi: there is one
    lo_key, hi_key = (int(x) for x in _from_smallest(ext, ext & _MAG, d))
    if hi_key - lo_key < 1 << 63:
        return _from_smallest(bits, mag, d), lo_key, hi_key
    return None


def _flip_negative(bits: np.ndarray) -> np.ndarray:
    bits ^= (bits >> 63) & _MAG  # negative: -1 - magnitude; non-negative: unchanged
    return bits


def _from_smallest(bits: np.ndarray, mag: np.ndarray, d: int) -> np.ndarray:
    mag -= d - 1  # non-zero: >= 1; zero: <= 0, clipped to 0
    np.maximum(mag, 0, out=mag)
    np.negative(mag, out=mag, where=bits < 0)
    return mag


def _sorted_rows(sc: np.ndarray, wrong: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(new, w)`` ``[r, m]`` of every row sorted by ascending score: ``new`` marks the first
    example of each group of equal scores (``-0.0 == 0.0``; always the row's first), ``w``
    the 0/1 wrong flags in that order (signed integers). The order inside a tie does not
    matter.

    One sort of one integer per example: the key of :func:`_int_keys` minus the least one,
    shifted left by one with the wrong flag in the freed bit (``uint64``, or ``uint32``, a
    sort twice as fast, when the keys span less than ``2**31``, e.g. all scores tied); a
    group starts where a packed key exceeds its predecessor with the flag set (``p | 1``).
    Where the keys cannot be packed: an argsort of the scores and two gathers (about 1.5
    times the time)."""
    r, m = sc.shape
    new = np.empty((r, m), dtype=bool)
    new[:, 0] = True
    found = _int_keys(sc)
    if found is None:
        order = np.argsort(sc, axis=1)
        ordered = np.take_along_axis(sc, order, axis=1)
        np.not_equal(ordered[:, 1:], ordered[:, :-1], out=new[:, 1:])
        return new, np.take_along_axis(wrong, order, axis=1)
    keys, lo_key, hi_key = found
    packed = keys.view(np.uint64)
    packed -= np.uint64(lo_key % (1 << 64))  # wraps around: the exact offset in [0, span]
    if hi_key - lo_key < 1 << 31:
        packed, one, signed = packed.astype(np.uint32), np.uint32(1), np.int32
    else:
        one, signed = np.uint64(1), np.int64
    packed <<= one
    packed |= wrong
    packed.sort(axis=1)
    np.greater(packed[:, 1:], packed[:, :-1] | one, out=new[:, 1:])
    packed &= one
    return new, packed.view(signed)  # (a cumsum of uint64 into int64 is slow)


def _rc_block(sc: np.ndarray, wrong: np.ndarray, out: np.ndarray) -> None:
    """AURC, E-AURC and AUGRC (``out[:, r]``) of every row of ``sc``, ``wrong`` ``[r, m]``.

    The groups of equal scores of every row, in ascending score order, are found in the
    flattened sorted rows: ``F`` the flat index of each group's first example, ``k`` the
    examples at or above it in its row (accepted at its threshold), ``e`` the wrong ones among
    them. With ``u_g = size_g + size_{g-1}`` (``size_{-1} = 0``: nothing below a row's lowest
    group) and ``N = m``, the two sums of :func:`_aurc` and :func:`_augrc` regroup per
    point::

        2 N AURC = e_top + sum_g u_g e_g / k_g,    2 N^2 AUGRC = sum_g u_g e_g,

    (each point's risk is weighted by the widths of the two trapezoids it bounds, the
    coverage-0 anchor adding ``k_top`` to the top point's width; ``k_top e_top / k_top`` is
    written ``e_top``), the second summed exactly in integers."""
    r, m = sc.shape
    new, w = _sorted_rows(sc, wrong)
    below = np.empty(r * m + 1, dtype=np.int64)  # wrong examples before each flat position
    below[0] = 0
    np.cumsum(w, out=below[1:])  # (row-major: w is C-contiguous)
    F = np.flatnonzero(new)
    starts = np.arange(r + 1) * m  # flat start of every row, and the end of the last
    first = np.searchsorted(F, starts[:-1])  # every row's lowest group (each row starts one)
    nd = np.diff(first, append=F.shape[0])  # groups per row, >= 1
    top = first + (nd - 1)  # every row's highest group
    k = np.repeat(starts[1:], nd) - F
    e = np.repeat(below[starts[1:]], nd) - below[F]
    Fx = np.empty(F.shape[0] + 2, dtype=F.dtype)  # F with the neighbours of its ends
    Fx[0], Fx[1:-1], Fx[-1] = 0, F, r * m
    u = Fx[2:] - Fx[:-2]  # F_{g+1} - F_{g-1}; F_{g+1} of a row's top group: the row's end
    u[first] = Fx[first + 2] - F[first]  # nothing below a row's lowest group
    n_wrong = e[first]
    u *= e
    augrc2 = np.add.reduceat(u, first)
    aurc2 = np.add.reduceat(u / k, first) + e[top]
    out[0] = aurc2 / (2.0 * m)
    out[2] = augrc2 / (2.0 * m * m)
    err = n_wrong / m
    safe = np.where(err >= 1.0, 0.0, err)
    out[1] = out[0] - np.where(err >= 1.0, 1.0, safe + (1.0 - safe) * np.log1p(-safe))


def _rc_rows(scores: Any, correct: Any) -> np.ndarray:
    """``[3, R]``: AURC, E-AURC and AUGRC of every row of ``scores``, ``correct`` ``[R, m]``
    (validated as the scalar functions validate one row), computed together with one sort of
    every row (:func:`_rc_block`, in blocks of about 2**16 entries).

    The last result is remembered, per thread, with copies of its input: a call whose arrays
    are equal in content (``==``, element by element) to the last ones returns it without
    sorting again. The three ``batched`` hooks therefore share one sort when they are called
    on the same rows, one after the other (as :func:`selbench.measure.bootstrap.selective_intervals`
    does). The key is the content, not the identity: an array changed in place since, or
    another array at the same address, is never mistaken for the last one, and equal content
    means an equal (already validated) input, hence an equal result. Comparing costs two
    passes over the input (a few percent of the computation). Inputs of more than 2**21
    entries are neither remembered nor copied (each call computes); the copies (9 bytes per
    entry: float64 scores, boolean correctness) are reused for the next input of the same
    shape and kept until one of another shape, so at most about 19 MB per thread. Callers
    get copies of the rows of the result, never the remembered array."""
    sc = _as_rows(scores, "scores")
    corr = _as_rows(correct, "correct")
    if corr.shape != sc.shape:
        raise ValueError(f"correct must have the same shape as scores {sc.shape}; "
                         f"got {corr.shape}")
    last = getattr(_memo, "last", None)
    if (last is not None and last[0].shape == sc.shape and np.array_equal(last[0], sc)
            and np.array_equal(last[1], corr)):
        return last[2]  # equal content: equal (valid) input, equal result
    _check_rows(sc, corr)
    R, m = sc.shape
    out = np.full((3, R), np.nan)  # m = 0: nan, as the scalar functions
    wrong = corr == 0.0
    step = max(1, _BLOCK_ENTRIES // max(m, 1))
    for a in range(0, R if m else 0, step):
        _rc_block(sc[a:a + step], wrong[a:a + step], out[:, a:a + step])
    _remember(sc, wrong, out)
    return out


def _remember(sc: np.ndarray, wrong: np.ndarray, out: np.ndarray) -> None:
    """Keep copies of the input of ``out`` (the caller may change its arrays), in the
    buffers of the last input when it had the same shape (no fresh pages to fault in)."""
    last, _memo.last = getattr(_memo, "last", None), None
    if sc.size > _MEMO_ENTRIES:
        return
    if last is not None and last[0].shape == sc.shape:
        sc_buf, corr_buf = last[0], last[1]
        np.copyto(sc_buf, sc)
        np.logical_not(wrong, out=corr_buf)
    else:
        sc_buf, corr_buf = sc.copy(), ~wrong  # the correctness as booleans
    _memo.last = (sc_buf, corr_buf, out)


def _aurc_rows(scores: Any, correct: Any) -> np.ndarray:
    """:func:`aurc` of every row of ``[R, m]`` arrays, float64 ``[R]`` (``aurc.batched``)."""
    return _rc_rows(scores, correct)[0].copy()


def _eaurc_rows(scores: Any, correct: Any) -> np.ndarray:
    """:func:`eaurc` of every row of ``[R, m]`` arrays, float64 ``[R]`` (``eaurc.batched``)."""
    return _rc_rows(scores, correct)[1].copy()


def _augrc_rows(scores: Any, correct: Any) -> np.ndarray:
    """:func:`augrc` of every row of ``[R, m]`` arrays, float64 ``[R]`` (``augrc.batched``)."""
    return _rc_rows(scores, correct)[2].copy()


aurc.batched = _aurc_rows  # type: ignore[attr-defined]
eaurc.batched = _eaurc_rows  # type: ignore[attr-defined]
augrc.batched = _augrc_rows  # type: ignore[attr-defined]


# ``fn.from_counts(k, e)``: the metric from the merged-tie points of :func:`rc_counts`
# (``k`` accepted and ``e`` wrong at each distinct score, ascending coverage, ``k[-1] = N``
# >= 1), what :func:`selbench.measure.evaluate.measure` and the bootstrap share: one curve
# per evaluation set (a resample's from counts of the examples, no sort) for every ranking
# metric, instead of a sort per metric (measured: 200 resamples of a 12,000-example cell,
# the eight ranking metrics 3.4 s with a sort each, see perf/README.md, issue 28)
def _aurc_counts(k: np.ndarray, e: np.ndarray) -> float:
    return _aurc(k, e, int(k[-1]))


def _eaurc_counts(k: np.ndarray, e: np.ndarray) -> float:
    n = int(k[-1])
    return _aurc(k, e, n) - _oracle_aurc(int(e[-1]) / n)


def _augrc_counts(k: np.ndarray, e: np.ndarray) -> float:
    return _augrc(k, e, int(k[-1]))


aurc.from_counts = _aurc_counts  # type: ignore[attr-defined]
eaurc.from_counts = _eaurc_counts  # type: ignore[attr-defined]
augrc.from_counts = _augrc_counts  # type: ignore[attr-defined]


# ``fn.from_count_rows(drawn, wrong)``: the metric of many evaluation sets at once, from their
# per-group counts ``[R, G]`` (int64: each set's examples, and wrong ones, in each group of
# equal scores of a common pool, groups by descending score; 0 for a group a set does not
# draw: the bootstrap's resamples). A group not drawn repeats the previous point, which the
# areas below weigh by zero, so every row is the metric of its own merged-tie curve (tested
# against ``from_counts`` of each row; measured: see ``from_counts`` above).
def count_rows(drawn: np.ndarray, wrong: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray]:
    """``(k, e, n)``: cumulative accepted and wrong counts ``[R, G]`` and the sizes ``[R]``."""
    k, e = np.cumsum(drawn, axis=1), np.cumsum(wrong, axis=1)
    return k, e, k[:, -1]


def _aurc_count_rows(drawn: np.ndarray, wrong: np.ndarray) -> np.ndarray:
    k, e, n = count_rows(drawn, wrong)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = e / k
    first = np.argmax(drawn > 0, axis=1)  # groups before a row's first drawn one: its risk
    r = np.where(k > 0, r, r[np.arange(r.shape[0]), first][:, None])
    prev = np.concatenate((r[:, :1], r[:, :-1]), axis=1)  # the first term is the anchor 2 e_1
    return np.einsum("ij,ij->i", drawn.astype(np.float64), r + prev) / (2.0 * n)


def _oracle_rows(err: np.ndarray) -> np.ndarray:
    safe = np.where(err >= 1.0, 0.0, err)
    return np.where(err >= 1.0, 1.0, safe + (1.0 - safe) * np.log1p(-safe))


def _eaurc_count_rows(drawn: np.ndarray, wrong: np.ndarray) -> np.ndarray:
    n = drawn.sum(axis=1)
    return _aurc_count_rows(drawn, wrong) - _oracle_rows(wrong.sum(axis=1) / n)


def _augrc_count_rows(drawn: np.ndarray, wrong: np.ndarray) -> np.ndarray:
    k, e, n = count_rows(drawn, wrong)
    prev = np.concatenate((np.zeros((e.shape[0], 1), dtype=e.dtype), e[:, :-1]), axis=1)
    twice = np.einsum("ij,ij->i", drawn, e + prev)  # int64: exact
    return twice / (2.0 * n * n)


aurc.from_count_rows = _aurc_count_rows  # type: ignore[attr-defined]
eaurc.from_count_rows = _eaurc_count_rows  # type: ignore[attr-defined]
augrc.from_count_rows = _augrc_count_rows  # type: ignore[attr-defined]
