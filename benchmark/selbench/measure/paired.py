"""Paired comparisons of two methods across experiments: the statistics that answer a spec's
pre-registered questions (:mod:`selbench.reporting.questions`).

Each experiment gives one pair of numbers: method a's and method b's value of a metric, the
mean over the seeds both have. Orientation: ``lower_is_better`` is the metric's direction
(from the registry), and "a better" means a's value is lower (higher) than b's.

* :func:`signed_rank` — the two-sided **Wilcoxon signed-rank test** of no difference
  (:func:`scipy.stats.wilcoxon`, ``alternative="two-sided"``) on the differences
  ``a − b``; differences within :data:`selbench.measure.stats.ZERO_TOL` of 0 are zero and
  dropped (``zero_method="wilcox"``, as the per-experiment tests of
  :mod:`selbench.measure.stats`); every difference zero gives p = 1. scipy computes p
  exactly when there are no ties among the nonzero differences and at most 50 of them, by
  the normal approximation otherwise. With ``n`` nonzero differences the smallest two-sided
  p is ``2 · 2⁻ⁿ`` (below 0.05 from ``n = 6`` experiments on), reported as ``min_p``.
* :func:`holm` — Holm's step-down adjustment of several p-values (family-wise error rate;
  scipy has only the false-discovery-rate procedures).
* :func:`bayesian_signed_rank` — the **Bayesian signed-rank test** of Benavoli, Mangili,
  Corani, Zaffalon & Ruggeri (ICML 2014) as ``baycomp.SignedRankTest`` computes it, with a
  region of practical equivalence (ROPE): a Dirichlet-process posterior over the
  distribution of the per-experiment differences (prior strength 0.5 at 0), sampled
  ``nsamples`` times from a seeded generator; P(a better), P(practically equal), P(b better)
  are the fractions of posterior samples in which each region is the most probable one
  (baycomp's ``Posterior.probs``).

The hierarchical model of Benavoli, Corani, Demšar & Zaffalon (JMLR 2017), which would also
use the seeds inside each experiment (``baycomp.HierarchicalTest``), needs PyStan (a C++
toolchain and httpstan), writes ``last-sample.pickle`` into the working directory and does
not pass its seed to Stan: it is not run here (:data:`HIERARCHICAL_NOTE`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from selbench.measure.stats import ZERO_TOL

__all__ = [
    "BAYES_NAME",
    "HIERARCHICAL_NOTE",
    "NSAMPLES",
    "PRIOR",
    "WILCOXON_NAME",
    "bayesian_signed_rank",
    "holm",
    "signed_rank",
]

#: posterior samples of the Bayesian signed-rank test, and the strength of its prior at 0
NSAMPLES = 20_000
PRIOR = 0.5

WILCOXON_NAME = ("two-sided Wilcoxon signed-rank test over experiments (scipy.stats.wilcoxon), "
                 "paired by experiment on the means over seeds; zero differences dropped "
                 "(zero_method='wilcox'), all zero: p = 1; Holm-adjusted across the questions")
BAYES_NAME = ("Bayesian signed-rank test over experiments with a ROPE (baycomp.SignedRankTest; "
              "Benavoli et al., ICML 2014), on the means over seeds; prior strength 0.5; "
              "probabilities: the share of posterior samples in which each region is the most "
              "probable")
HIERARCHICAL_NOTE = ("the hierarchical model that also uses the seeds (baycomp.HierarchicalTest, "
                     "Benavoli et al., JMLR 2017) is not run: it needs PyStan, writes "
                     "last-sample.pickle into the working directory and does not seed Stan")


def _pairs(a: Sequence[float], b: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or x.size == 0:
        raise ValueError(f"a and b must be non-empty 1-D arrays of equal length; got {x.shape} "
                         f"and {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("a and b must be finite")
    return x, y


def signed_rank(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """The two-sided Wilcoxon signed-rank test of ``a − b`` (one pair per experiment):
    ``{"p_value", "statistic", "n", "n_nonzero", "min_p", "median_difference"}``
    (``statistic`` None when every difference is zero)."""
    x, y = _pairs(a, b)
    d = x - y
    nonzero = d[np.abs(d) > ZERO_TOL]
    out: dict[str, Any] = {"n": int(d.size), "n_nonzero": int(nonzero.size),
                           "median_difference": float(np.median(d)),
                           "min_p": float(min(1.0, 2.0 ** (1 - nonzero.size))),
                           "statistic": None, "p_value": 1.0}
    if nonzero.size:
        from scipy import stats

        res = stats.wilcoxon(nonzero, zero_method="wilcox", alternative="two-sided")
        out.update(statistic=float(res.statistic), p_value=float(res.pvalue))
    return out


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None and does not count): the i-th
    smallest of m p-values becomes ``max_{j ≤ i} min(1, (m − j + 1) · p_(j))``."""
    idx = [i for i, p in enumerate(p_values) if p is not None]
    m = len(idx)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: (p_values[i], i))):
        running = max(running, min(1.0, (m - rank) * float(p_values[i])))
        out[i] = running
    return out


def bayesian_signed_rank(a: Sequence[float], b: Sequence[float], rope: float, *,
                         lower_is_better: bool, seed: int = 0,
                         nsamples: int = NSAMPLES) -> dict[str, Any]:
    """P(a better), P(practically equal: |difference| ≤ ``rope``), P(b better) from
    ``baycomp.SignedRankTest`` on the per-experiment values ``a`` and ``b`` (seeded
    ``seed``): ``{"p_a_better", "p_equal", "p_b_better", "rope", "nsamples", "seed"}``."""
    import baycomp

    x, y = _pairs(a, b)
    sign = -1.0 if lower_is_better else 1.0  # baycomp: higher scores are better
    # left (its first probability) is where y - x < -rope: the first argument, a, better
    post = baycomp.SignedRankTest(sign * x, sign * y, float(rope), prior=PRIOR,
                                  nsamples=int(nsamples), random_state=int(seed))
    left, equal, right = (float(v) for v in post.probs(with_rope=True))
    return {"p_a_better": left, "p_equal": equal, "p_b_better": right, "rope": float(rope),
            "nsamples": int(nsamples), "seed": int(seed)}
