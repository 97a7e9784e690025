"""Statistics over seeds: mean ± std, a 95% interval, and paired tests against the best method.

Every number a leaderboard shows is a summary of one value per seed. For a metric at one
coverage level (or its AUC over β) and one method, :func:`summarize` gives

* the mean and the sample standard deviation (``ddof=1``) over seeds;
* a two-sided 95% **Student-t interval** for the mean, ``mean ± t_{0.975, n-1} · std / √n``
  (``None`` with a single seed). It assumes the per-seed values are roughly normal; with 3-5
  seeds it is wide, as it should be.

:func:`compare_to_best` then finds the method with the best mean and tests every other method
against it, **paired by seed**. Pairing is valid because the runner draws the fitting sample
from the seed alone (``selbench.execution.runner.fit_indices``), so seed ``s`` fits every method on the
same examples and evaluates it on the same evaluation set. The test is the **one-sided
Wilcoxon signed-rank test** (:func:`scipy.stats.wilcoxon`, ``alternative="greater"``) on the
per-seed differences ``method − best`` (``best − method`` when higher is better): its p-value
is the probability, if the method were as good as the best one, of differences at least this
consistently in the best one's favour. scipy computes it exactly when there are no tied
differences (and by a normal approximation otherwise); zero differences are dropped
(``zero_method="wilcox"``), and a method identical to the best on every seed gets p = 1.

The signed-rank test makes no normality assumption, which is why we use it, but with ``n``
nonzero differences its smallest possible one-sided p-value is ``2⁻ⁿ``: below 0.05 only from
``n = 5`` seeds on. A method is marked **best** when it has the best mean, or when it was
compared on at least :data:`MIN_SEEDS_FOR_TEST` seeds and ``p ≥ alpha`` (not significantly
worse). With fewer seeds no comparison can be significant, so only the best mean is marked
(the p-values are still reported, for information).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "ALPHA",
    "CONFIDENCE",
    "INTERVAL_NAME",
    "MIN_SEEDS_FOR_TEST",
    "TEST_NAME",
    "compare_to_best",
    "min_attainable_p",
    "paired_p_value",
    "summarize",
    "t_interval",
]

#: Significance level of the paired test.
ALPHA = 0.05
#: Coverage of the interval for the mean.
CONFIDENCE = 0.95
#: Fewest paired seeds from which the one-sided signed-rank test can give p < ALPHA (2⁻⁵ = 0.031).
MIN_SEEDS_FOR_TEST = 5
#: Differences at most this far from 0 count as ties with the best method (floating-point noise).
ZERO_TOL = 1e-12

TEST_NAME = "one-sided Wilcoxon signed-rank test, paired by seed, against the best mean"
INTERVAL_NAME = "95% Student-t interval for the mean over seeds"


def t_interval(values: Any, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Two-sided Student-t interval ``mean ± t_{(1+c)/2, n-1} · s / √n`` for the mean.

    ``s`` is the sample standard deviation (``ddof=1``). Returns ``None`` for fewer than two
    values, and ``(mean, mean)`` when all values are equal.
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"values must be a 1-D array; got shape {arr.shape}")
    if not (0.0 < confidence < 1.0):
        raise ValueError(f"confidence must lie in (0, 1); got {confidence!r}")
    n = arr.shape[0]
    if n < 2 or not np.isfinite(arr).all():
        return None
    mean = float(arr.mean())
    half = float(_t_quantile((1.0 + confidence) / 2.0, n - 1) * arr.std(ddof=1) / math.sqrt(n))
    return mean - half, mean + half


@functools.lru_cache(maxsize=256)
def _t_quantile(q: float, df: int) -> np.float64:
    """Student-t quantile (the same value each time: a leaderboard asks for a few (q, df) pairs
    thousands of times, at ~0.3 ms a scipy call; 0.75 s of the paper stage's leaderboard)."""
    from scipy import stats

    return stats.t.ppf(q, df)


def summarize(per_seed: Mapping[int, float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Mean, sample std, t-interval and the raw values of one metric over seeds.

    Args:
        per_seed: seed -> value. Non-finite values are kept in ``values`` but make the
            summary NaN (a metric that could not be computed on some seed has no mean).

    Returns:
        ``{"mean", "std", "n", "ci95", "seeds", "values"}``; ``std`` is 0.0 and ``ci95`` is
        ``None`` with one seed; ``mean`` is NaN with none.
    """
    seeds = sorted(per_seed)
    arr = np.asarray([per_seed[s] for s in seeds], dtype=np.float64)
    n = int(arr.size)
    finite = bool(n) and bool(np.isfinite(arr).all())
    ci = t_interval(arr, confidence) if finite else None
    return {
        "mean": float(arr.mean()) if finite else float("nan"),
        "std": float(arr.std(ddof=1)) if finite and n > 1 else (0.0 if finite else float("nan")),
        "n": n,
        "ci95": [ci[0], ci[1]] if ci is not None else None,
        "seeds": [int(s) for s in seeds],
        "values": [float(v) for v in arr],
    }


def min_attainable_p(n: int) -> float:
    """Smallest one-sided exact signed-rank p-value with ``n`` nonzero differences: ``2⁻ⁿ``."""
    return 2.0 ** -n if n > 0 else 1.0


def paired_p_value(values: Any, reference: Any, *, lower_is_better: bool) -> float:
    """One-sided Wilcoxon signed-rank p-value that ``values`` are worse than ``reference``.

    The two arrays are paired element by element (same seed). The differences
    ``values - reference`` (``reference - values`` when higher is better) are tested for a
    positive location with :func:`scipy.stats.wilcoxon` (``alternative="greater"``,
    ``zero_method="wilcox"``: differences within :data:`ZERO_TOL` of 0 are dropped). All
    differences zero gives 1.0. Raises ValueError for no pairs, unequal lengths or NaN.
    """
    x = np.asarray(values, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if x.ndim != 1 or x.shape != ref.shape:
        raise ValueError(
            f"values and reference must be 1-D arrays of equal length; got {x.shape} and {ref.shape}"
        )
    if x.size == 0:
        raise ValueError("paired_p_value needs at least one pair")
    if not (np.isfinite(x).all() and np.isfinite(ref).all()):
        raise ValueError("paired_p_value needs finite values")
    diff = x - ref if lower_is_better else ref - x
    diff = diff[np.abs(diff) > ZERO_TOL]
    if diff.size == 0:
        return 1.0
    from scipy import stats

    return float(stats.wilcoxon(diff, alternative="greater", zero_method="wilcox").pvalue)


def compare_to_best(
    per_method: Mapping[str, Mapping[int, float]],
    *,
    lower_is_better: bool,
    alpha: float = ALPHA,
) -> dict[str, dict[str, Any]]:
    """Mark the best mean and test every method against it, paired over common seeds.

    Args:
        per_method: method -> (seed -> value). Methods whose mean is not finite are never best.
        lower_is_better: direction of the metric.
        alpha: significance level.

    Returns:
        method -> ``{"best_mean": bool, "p_vs_best": float | None, "n_pairs": int | None,
        "best": bool}`` (``n_pairs``: seeds shared with the best method; None for the best). ``p_vs_best`` is ``None`` for the best-mean method(s), for methods
        sharing fewer than 2 seeds with it, and for methods without a finite mean.
        ``best`` is True for the best mean(s), and for methods with ``n_pairs >=``
        :data:`MIN_SEEDS_FOR_TEST` and ``p_vs_best >= alpha``.
    """
    means = {}
    for m, vals in per_method.items():
        arr = np.asarray(list(vals.values()), dtype=np.float64)
        means[m] = float(arr.mean()) if arr.size and np.isfinite(arr).all() else float("nan")
    finite = [m for m in per_method if math.isfinite(means[m])]
    out: dict[str, dict[str, Any]] = {
        m: {"best_mean": False, "p_vs_best": None, "n_pairs": 0, "best": False} for m in per_method
    }
    if not finite:
        return out
    target = min(means[m] for m in finite) if lower_is_better else max(means[m] for m in finite)
    leaders = [m for m in finite if abs(means[m] - target) <= ZERO_TOL]
    ref = leaders[0]
    for m in finite:
        entry = out[m]
        if m in leaders:
            entry.update(best_mean=True, best=True, n_pairs=None)
            continue
        common = sorted(set(per_method[m]) & set(per_method[ref]))
        entry["n_pairs"] = len(common)
        if len(common) < 2:
            continue
        p = paired_p_value(
            [per_method[m][s] for s in common],
            [per_method[ref][s] for s in common],
            lower_is_better=lower_is_better,
        )
        entry["p_vs_best"] = p
        entry["best"] = len(common) >= MIN_SEEDS_FOR_TEST and p >= alpha
    return out
