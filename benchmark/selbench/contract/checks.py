"""Input checks for plugins: the messages every built-in selector, recalibrator and scheme
gives for bad input, each naming the argument and the plugin (``who``).

:class:`NotFittedError` is scikit-learn's (a ``ValueError`` and an ``AttributeError``):
raise it when a plugin is used before it is fitted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.exceptions import NotFittedError

from selbench.contract.data import ModelOutputs

__all__ = ["NotFittedError", "check_confidence", "check_features", "check_outputs"]


def check_outputs(outputs: Any, who: str, *, min_rows: int = 0) -> ModelOutputs:
    """``outputs`` must be :class:`ModelOutputs` with at least ``min_rows`` examples."""
    if not isinstance(outputs, ModelOutputs):
        raise TypeError(
            f"outputs: {who} expects selbench.ModelOutputs, got {type(outputs).__name__}"
        )
    if len(outputs) < min_rows:
        raise ValueError(
            f"outputs: {who} needs at least {min_rows} example(s) to fit, got {len(outputs)}"
        )
    return outputs


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
    """The features must have the dimension ``expected`` the plugin was fitted on."""
    if outputs.feature_dim != expected:
        raise ValueError(
            f"features: {who} was fitted on d={expected} features, got d={outputs.feature_dim}"
        )
