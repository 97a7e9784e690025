"""How a cell is evaluated: the fitting sample, the evaluation rows, and the measurement.

This module and :mod:`selbench.metrics` decide every number of a cell, so their source is part
of every cell's key (:func:`selbench.codeid.core_digest`): editing either recomputes the cells.

* The fitting sample of seed ``s`` is ``n_fit`` rows of the fitting split drawn without
  replacement by ``np.random.default_rng([s, 0x5E1EC7])`` (all rows when ``n_fit`` is unset).
* The evaluation rows are the evaluation split, less the fitting sample when both splits are
  the same, then a fixed seeded subsample of ``n_eval`` rows when set.
* The recalibrator gives the confidence and prediction of every evaluation example, the
  selector its score; at each β the accepted examples are chosen by
  :func:`selbench.metrics.selective_metrics` (exactly ⌈β·n⌉ of them, ties broken by the
  cell's seed) and measured.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from selbench.data import ModelOutputs
from selbench.metrics import selective_metrics

__all__ = ["EvaluationError", "check_vector", "eval_rows", "fit_indices", "measure", "score"]


class EvaluationError(ValueError):
    """A plugin returned something the core cannot measure; the message names the plugin."""


def fit_indices(n_total: int, n_fit: int | None, seed: int, where: str) -> np.ndarray:
    """The rows of the fitting split that seed ``seed`` fits on (sorted)."""
    if n_fit is None:
        return np.arange(n_total)
    if n_fit > n_total:
        raise EvaluationError(
            f"{where}: n_fit={n_fit} but the fitting split has only {n_total} examples"
        )
    rng = np.random.default_rng([seed, 0x5E1EC7])
    return np.sort(rng.choice(n_total, size=n_fit, replace=False))


def eval_rows(n_total: int, fit_idx: np.ndarray, same_split: bool, n_eval: int | None,
              e_i: int) -> np.ndarray:
    """Rows of the evaluation split a cell is measured on."""
    rows = np.arange(n_total)
    if same_split:  # never evaluate on the examples used for fitting
        mask = np.ones(n_total, dtype=bool)
        mask[fit_idx] = False
        rows = np.flatnonzero(mask)
    if n_eval is not None and n_eval < len(rows):
        rng = np.random.default_rng([0xE7A1, e_i])
        rows = rows[np.sort(rng.choice(len(rows), n_eval, replace=False))]
    return rows


def check_vector(values: Any, n: int, what: str, lo: float | None = None,
                 hi: float | None = None, integer: bool = False) -> np.ndarray:
    """``values`` as a float64 (or int64) ``[n]`` array; :class:`EvaluationError` naming
    ``what`` when it is not one, holds NaN/inf, or leaves ``[lo, hi]``."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise EvaluationError(f"{what} returned {type(values).__name__}, not a numeric "
                              f"array ({exc})") from None
    if arr.shape != (n,):
        raise EvaluationError(f"{what} returned shape {arr.shape}, expected ({n},)")
    if not np.all(np.isfinite(arr)):
        raise EvaluationError(f"{what} returned NaN or infinite values")
    if lo is not None and n and (arr.min() < lo - 1e-9 or arr.max() > hi + 1e-9):
        raise EvaluationError(f"{what} returned values outside [{lo:g}, {hi:g}]")
    if integer:
        if n and not np.all(arr == np.round(arr)):
            raise EvaluationError(f"{what} returned non-integer labels")
        return arr.astype(np.int64)
    return np.clip(arr, lo, hi) if lo is not None else arr


def score(
    outputs: ModelOutputs, recalibrator: Any, selector: Any, names: tuple[str, str]
) -> dict[str, np.ndarray]:
    """Per-example ``confidence``, ``prediction``, ``score`` and ``correct`` of a fitted
    recalibrator and selector on ``outputs``, each checked (``names``: the recalibrator's and
    the selector's descriptions, for error messages)."""
    n = len(outputs)
    recal_name, sel_name = names
    conf = check_vector(recalibrator.confidence(outputs), n, f"{recal_name}.confidence", 0.0, 1.0)
    pred = check_vector(recalibrator.predict(outputs), n, f"{recal_name}.predict", 0,
                        outputs.num_classes - 1, integer=True)
    sc = check_vector(selector.score(outputs, conf), n, f"{sel_name}.score")
    correct = (pred == outputs.labels).astype(np.float64)
    return {"confidence": conf, "prediction": pred, "score": sc, "correct": correct}


def measure(arrays: dict[str, np.ndarray], betas: list[float], *, delta: float | None,
            seed: int, selects: bool = True) -> dict[str, np.ndarray]:
    """The metrics of :func:`selective_metrics` at each β, ties broken by ``seed``.

    For a selector that does not select (``Selector.selects`` is False) every example is
    accepted at every β: the metrics of β = 1 are repeated, coverage (and, with ``delta``,
    the guaranteed coverage: nothing is rejected) is 1.
    """
    if selects:
        return selective_metrics(arrays["score"], arrays["confidence"], arrays["correct"],
                                 betas, delta=delta, seed=seed)
    full = selective_metrics(arrays["score"], arrays["confidence"], arrays["correct"], [1.0],
                             seed=seed)
    out = {k: np.repeat(v, len(betas)) for k, v in full.items()}
    if delta is not None:
        out["guaranteed_coverage"] = np.ones(len(betas))
    return out
