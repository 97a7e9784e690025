"""Risk–coverage metrics of selective classification: the risk–coverage curve, AURC,
E-AURC, AUGRC, coverage at a risk level and risk at a coverage level.

Every function takes plain arrays and returns floats (or float64 arrays):

* ``scores`` ``[N]``: selector scores, higher = accepted first (the model's confidence, a
  learned selector's score, ...), compared as float64 (float32 input converts exactly). Only
  their order matters, so any finite values, however large, are fine; NaN and +-inf are
  rejected, as by every selbench metric (:mod:`selbench._validate`).
* ``correct`` ``[N]``: 0/1 (or boolean) correctness of the prediction.

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
selection (:func:`selbench.metrics.accept_mask`), which breaks ties by a seeded permutation
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
from typing import Any

import numpy as np

from selbench._validate import _as_float_1d, _check_correct, _check_scores

__all__ = [
    "augrc",
    "aurc",
    "coverage_at_risk",
    "eaurc",
    "risk_at_coverage",
    "risk_coverage_curve",
]


# --------------------------------------------------------------------------- internals
def _inputs(scores: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validated float64 ``scores`` (finite) and 0/1 ``correct`` of the same length."""
    sc = _check_scores(scores)
    n = sc.shape[0]
    corr = _as_float_1d(correct, "correct")
    if corr.shape[0] != n:
        raise ValueError(f"correct must have the same length as scores ({n}); got {corr.shape[0]}")
    return sc, _check_correct(corr, n)


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
    return float((2.0 * e[0] + np.dot(np.diff(k), r[1:] + r[:-1])) / (2.0 * n))


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
