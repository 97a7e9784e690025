"""Elo ratings of methods from pairwise outcomes: the Bradley–Terry model, on the Elo scale.

CalArena (probkit/CalArena, ``utils.compute_elo_scores``) rates calibrators this way: every
experiment is a match between every pair of methods, won by the lower metric value (a tie
when equal), and the ratings are the maximum-likelihood Bradley–Terry strengths of LMArena's
``arena_rank`` (``BradleyTerry``: P(a beats b) = σ(θ_a − θ_b), a tie counting as half a win
each, reported as ``1000 + 400 / ln 10 · θ``), with percentile intervals from refitting on
resampled datasets. :func:`bradley_terry` fits the same likelihood with scipy's L-BFGS, plus
a small ridge (:data:`RIDGE`) that keeps the strength of a method that wins (or loses) every
match finite — arena_rank leaves it unpenalised and stops where its optimiser stops; the
ratings are centred on :data:`INIT`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["BASE", "INIT", "RIDGE", "SCALE", "bradley_terry", "elo"]

#: the Elo scale: 400 points for a factor of 10 in the odds of winning, centred on 1000
SCALE = 400.0
BASE = 10.0
INIT = 1000.0
#: ridge on the strengths, against the mean loss per match (keeps a clean sweep finite)
RIDGE = 1e-4


def bradley_terry(wins: Any, ridge: float = RIDGE) -> np.ndarray:
    """The Bradley–Terry strengths (natural log-odds, mean 0) maximising
    ``Σ_{a≠b} wins[a, b] · log σ(θ_a − θ_b) / Σ wins − ridge · Σ θ²``.

    ``wins[a, b]``: the (weighted) number of matches a won against b, a tie counting ½ to
    each side."""
    from scipy.optimize import minimize

    w = np.asarray(wins, dtype=np.float64)
    k = w.shape[0]
    if w.ndim != 2 or w.shape != (k, k) or (w < 0).any() or not np.isfinite(w).all():
        raise ValueError("wins must be a square matrix of non-negative counts")
    total = w.sum()
    if k < 2 or total <= 0:
        return np.zeros(k)
    w = w / total

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        d = theta[:, None] - theta[None, :]
        value = float((w * np.logaddexp(0.0, -d)).sum() + ridge * (theta ** 2).sum())
        g = -w / (1.0 + np.exp(d))  # d/dd of -log σ(d), per match
        return value, g.sum(1) - g.sum(0) + 2.0 * ridge * theta

    def hess(theta: np.ndarray) -> np.ndarray:
        d = theta[:, None] - theta[None, :]
        c = w * (0.5 / (1.0 + np.cosh(d)))  # σ(d) σ(-d) per match
        c = c + c.T
        return np.diag(c.sum(1) + 2.0 * ridge) - c

    # convex: scipy's exact trust-region Newton method converges in a few steps
    res = minimize(loss, np.zeros(k), jac=True, hess=hess, method="trust-exact",
                   options={"gtol": 1e-10})
    return res.x - res.x.mean()


def elo(wins: Any, ridge: float = RIDGE) -> np.ndarray:
    """The Bradley–Terry strengths of ``wins`` on the Elo scale:
    ``INIT + SCALE / ln(BASE) · θ``."""
    return INIT + SCALE / math.log(BASE) * bradley_terry(wins, ridge)
