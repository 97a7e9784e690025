"""Guaranteed selective risk: selection with guaranteed risk (SGR, Geifman & El-Yaniv,
"Selective classification for deep neural networks", NeurIPS 2017, Algorithm 1), and what
a risk guarantee achieves on evaluation data.

A threshold ``theta`` on the selector's scores accepts the examples with ``score >= theta``
(ties at ``theta`` all accepted: the rule of the paper, not the exact-coverage rule of
:func:`selbench.measure.metrics.accept_mask`). SGR picks ``theta`` on labelled data so that
the *selective risk* (the top-label error rate of the accepted examples, on the
distribution the data were drawn from) is at most ``r`` with probability at least
``1 - delta``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from scipy.stats import beta as beta_dist

from selbench.measure.validation import as_float_1d, check_correct, check_scores

__all__ = ["GUARANTEE_METRICS", "RISK_GUARANTEE_COLUMNS", "SGRResult", "binomial_upper_bound",
           "risk_guarantee_intervals", "risk_guarantee_metrics", "sgr"]

#: Registry entries (:class:`selbench.measure.metrics.MetricInfo` fields) of a risk guarantee's
#: results: measured once per cell (kind ``ranking``) where the experiment sets one.
GUARANTEE_METRICS: dict[str, tuple] = {
    "rg_coverage": ("Cov. at risk ≤ r", False, True, "ranking",
                    "evaluation coverage at SGR's threshold (risk_guarantee_metrics)",
                    "risk_guarantee"),
    "rg_risk": ("Risk at SGR θ", True, False, "ranking",
                "evaluation selective risk at SGR's threshold", "risk_guarantee"),
    "rg_held": ("Risk ≤ r held", False, False, "ranking",
                "1 where that risk is at most r (over seeds: the rate)", "risk_guarantee"),
    "rg_bound": ("SGR bound", True, False, "ranking",
                 "SGR's certified risk bound on the fitting data", "risk_guarantee"),
}
#: The columns an experiment with a risk guarantee shows by default, after the paper's.
RISK_GUARANTEE_COLUMNS: tuple[str, ...] = ("rg_coverage", "rg_risk", "rg_held")


def _unit(x: Any, name: str, *, closed: bool = False) -> float:
    ok = isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
    if not ok or not (0.0 < x < 1.0 or (closed and x == 1.0)):
        raise ValueError(f"{name} must be a number in (0, 1{']' if closed else ')'}; got {x!r}")
    return float(x)


def binomial_upper_bound(errors: int, n: int, delta: float) -> float:
    """SGR's ``B*(r_hat, delta, S)``: the ``b`` solving ``P(Bin(n, b) <= errors) = delta``.

    With ``errors`` wrong among ``n`` accepted examples, the true selective risk exceeds
    ``b`` with probability at most ``delta`` (the one-sided binomial tail inversion of
    Gascuel & Caraux 1992 the paper uses, Lemma 3.1). Solved exactly: ``b`` is the
    ``1 - delta`` quantile of ``Beta(errors + 1, n - errors)`` (the identity
    ``P(Bin(n, b) <= e) = 1 - I_b(e + 1, n - e)``), 1.0 when ``errors == n``. The paper's code
    solves the same equation by bisection to ``1e-7`` and reads the error count back as
    ``int(n * r_hat)``, which can lose one error to rounding; here the count is exact.
    """
    if n <= 0:
        raise ValueError(f"n must be at least 1; got {n}")
    if not 0 <= errors <= n:
        raise ValueError(f"errors must lie in [0, n = {n}]; got {errors}")
    if errors == n:
        return 1.0
    return float(beta_dist.ppf(1.0 - delta, errors + 1, n - errors))


class SGRResult(NamedTuple):
    """What :func:`sgr` chose: the threshold (``inf``: reject everything), the certified
    bound on its selective risk (``nan`` when nothing is accepted), its coverage and
    empirical selective risk on the fitting data, and the thresholds it visited."""

    threshold: float
    bound: float
    coverage: float
    risk: float
    visited: int


def sgr(scores: Any, correct: Any, risk: float, delta: float) -> SGRResult:
    """Selection with guaranteed risk (Geifman & El-Yaniv 2017, Algorithm 1).

    Sort the ``m`` scores ascending (``s_1 <= ... <= s_m``); with ``z_min = 0, z_max = m``,
    repeat ``ceil(log2 m)`` times: ``z = ceil((z_min + z_max) / 2)``, ``theta = s_z``;
    accept ``score >= theta`` (``k`` examples, ``e`` wrong), bound its risk by
    ``b* = B*(e / k, delta / ceil(log2 m), S)`` (:func:`binomial_upper_bound`, Bonferroni
    over the visited thresholds); if ``b* < risk`` set ``z_max = z`` (try more coverage),
    else ``z_min = z``.

    The paper outputs the last visited threshold with its bound ``b*``, which may exceed
    ``risk`` when the last step failed. To guarantee ``risk`` itself, this returns the
    visited threshold of largest coverage whose bound is below ``risk`` (the final
    ``z_max``; same visits, same union bound), and rejects everything (``threshold = inf``)
    when none is. ``m = 1``: one candidate, checked at ``delta``.

    Args:
        scores: selector scores ``[m]`` of labelled data (higher = accepted first), finite.
        correct: 0/1 correctness of the predictions ``[m]``.
        risk: the target selective risk ``r*`` in (0, 1).
        delta: the failure probability in (0, 1).
    """
    risk, delta = _unit(risk, "risk"), _unit(delta, "delta")
    sc = check_scores(scores)
    corr = check_correct(as_float_1d(correct, "correct"), sc.shape[0])
    m = sc.shape[0]
    if m == 0:
        raise ValueError("sgr needs at least one labelled example")
    order = np.argsort(sc, kind="stable")
    s = sc[order]
    wrong_desc = np.cumsum((1.0 - corr[order])[::-1])  # errors among the top i + 1
    steps = max(1, math.ceil(math.log2(m)))
    z_min, z_max, best = 0, m, None
    for _ in range(steps):
        z = math.ceil((z_min + z_max) / 2)
        theta = s[z - 1]  # 1-based z, as the paper
        k = m - int(np.searchsorted(s, theta, side="left"))  # ties at theta accepted
        e = int(round(wrong_desc[k - 1]))
        b = binomial_upper_bound(e, k, delta / steps)
        if b < risk:
            z_max, best = z, (float(theta), b, k / m, e / k)
        else:
            z_min = z
    if best is None:
        return SGRResult(math.inf, math.nan, 0.0, math.nan, steps)
    return SGRResult(*best, steps)


def risk_guarantee_metrics(fit_scores: Any, fit_correct: Any, scores: Any, correct: Any,
                           risk: float, delta: float) -> dict[str, float]:
    """A risk guarantee's threshold from labelled fitting data (:func:`sgr`) and what it
    achieves on evaluation data: ``rg_coverage`` (fraction with ``score >= threshold``),
    ``rg_risk`` (their error rate; ``nan`` when none is accepted), ``rg_held`` (1.0 when
    ``rg_risk <= risk`` or nothing is accepted, else 0.0: averaged over seeds, the rate at
    which the bound held) and ``rg_bound`` (the certified bound from the fitting data;
    ``nan`` when SGR rejects everything)."""
    chosen = sgr(fit_scores, fit_correct, risk, delta)
    sc = check_scores(scores)
    corr = check_correct(as_float_1d(correct, "correct"), sc.shape[0])
    accept = sc >= chosen.threshold
    k = int(np.count_nonzero(accept))
    achieved = float(np.mean(1.0 - corr[accept])) if k else math.nan
    return {
        "rg_coverage": k / sc.shape[0] if sc.shape[0] else math.nan,
        "rg_risk": achieved,
        "rg_held": 1.0 if (k == 0 or achieved <= risk) else 0.0,
        "rg_bound": chosen.bound,
    }


def risk_guarantee_intervals(threshold: float, scores: Any, correct: Any, risk: float,
                             bound: float, *, resamples: int, level: float,
                             seed: int) -> dict[str, dict[str, float]]:
    """Percentile bootstrap intervals over the evaluation examples of what
    :func:`risk_guarantee_metrics` measures there at SGR's ``threshold`` (fitted on other
    data, so fixed): ``rg_coverage``, ``rg_risk`` (NaN where a resample accepts none) and
    ``rg_held``; ``rg_bound`` depends on the fitting data only: ``[bound, bound]``.
    ``resamples`` rows of ``n`` indices drawn with replacement by
    ``np.random.default_rng([seed, 0xB007])``, as the cell's other intervals."""
    sc = check_scores(scores)
    corr = check_correct(as_float_1d(correct, "correct"), sc.shape[0])
    n = sc.shape[0]
    accept = (sc >= threshold).astype(np.float64)
    wrong = accept * (1.0 - corr)
    idx = np.random.default_rng([seed, 0xB007]).integers(0, max(n, 1), size=(resamples, n))
    k = accept[idx].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        achieved = wrong[idx].sum(axis=1) / k
    dist = {"rg_coverage": k / n if n else np.full(resamples, np.nan),
            "rg_risk": np.where(k > 0, achieved, np.nan),
            "rg_held": np.where((k == 0) | (achieved <= risk), 1.0, 0.0)}
    q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
    out = {}
    for key, values in dist.items():
        low, high = np.percentile(values, q) if n else (math.nan, math.nan)
        out[key] = {"low": float(low), "high": float(high)}
    out["rg_bound"] = {"low": float(bound), "high": float(bound)}
    return out
