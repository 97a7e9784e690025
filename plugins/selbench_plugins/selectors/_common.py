"""Input checks shared by the built-in selectors (private)."""

from __future__ import annotations

from typing import Any

import numpy as np
from selbench.data import ModelOutputs

from selbench_plugins.recalibrators._common import check_outputs

__all__ = ["check_confidence", "check_features", "check_outputs"]


def check_confidence(outputs: ModelOutputs, confidence: Any, who: str) -> np.ndarray:
    """``confidence`` must be a finite real array of shape ``(len(outputs),)``; returns a
    float64 copy."""
    try:
        conf = np.array(confidence, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"confidence: {who} expects a real array of shape (N,) ({exc})") from exc
    if conf.shape != (len(outputs),):
        raise ValueError(
            f"confidence: {who} expects shape ({len(outputs)},), one value per example of "
            f"outputs, got shape {conf.shape}"
        )
    if not np.all(np.isfinite(conf)):
        raise ValueError(f"confidence: {who} got NaN or infinite values")
    return conf


def check_features(outputs: ModelOutputs, expected: int, who: str) -> None:
    if outputs.feature_dim != expected:
        raise ValueError(
            f"features: {who} was fitted on d={expected} features, got d={outputs.feature_dim}"
        )
