"""Input validation shared by the metric modules (:mod:`selbench.measure.metrics` and the modules it
re-exports): each check names the argument and the offending entry."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def as_float_1d(x: Any, name: str) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a 1-D numeric array; got {type(x).__name__}") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array; got shape {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN at index {int(np.flatnonzero(np.isnan(arr))[0])}")
    return arr


def check_confidence(x: Any, name: str = "confidence") -> np.ndarray:
    arr = as_float_1d(x, name)
    bad = (arr < 0.0) | (arr > 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must lie in [0, 1]; {name}[{i}] = {arr[i]!r}")
    return arr


def check_correct(x: Any, n: int, name: str = "correct") -> np.ndarray:
    arr = as_float_1d(x, name)
    if arr.shape[0] != n:
        raise ValueError(
            f"{name} must have the same length as confidence ({n}); got {arr.shape[0]}"
        )
    bad = (arr != 0.0) & (arr != 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must be 0/1 (or boolean); {name}[{i}] = {arr[i]!r}")
    return arr


def check_p(p: Any) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise ValueError(f"p must be a number >= 1; got {p!r}")
    if not (math.isfinite(p) and p >= 1):
        raise ValueError(f"p must be a finite number >= 1; got {p!r}")
    return float(p)


def check_n_bins(n_bins: Any) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer; got {n_bins!r}")
    return int(n_bins)


def check_betas(betas: Any) -> np.ndarray:
    try:
        arr = np.atleast_1d(np.asarray(betas, dtype=np.float64))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"betas must be a 1-D array of coverage levels; got {betas!r}") from exc
    arr = as_float_1d(arr, "betas")
    if arr.size == 0:
        raise ValueError("betas must hold at least one coverage level")
    bad = ~((arr > 0.0) & (arr <= 1.0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"betas must lie in (0, 1]; betas[{i}] = {arr[i]!r}")
    return arr


def check_scores(scores: Any, n: int | None = None) -> np.ndarray:
    arr = as_float_1d(scores, "scores")
    if not np.isfinite(arr).all():
        i = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise ValueError(f"scores must be finite; scores[{i}] = {arr[i]!r}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(
            f"scores must have the same length as confidence ({n}); got {arr.shape[0]}"
        )
    return arr


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer; got {seed!r}")
    return int(seed)


def check_delta(delta: Any) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.integer, np.floating)):
        raise ValueError(f"delta must be a number in (0, 1]; got {delta!r}")
    if not (0.0 < delta <= 1.0):
        raise ValueError(f"delta must lie in (0, 1]; got {delta!r}")
    return float(delta)


def check_n(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ValueError(f"n must be an integer; got {n!r}")
    if n < 1:
        raise ValueError(
            f"scores must hold at least one value to choose a threshold (n = {n})"
        )
    return int(n)
