"""What the training schemes (:mod:`selbench_plugins.schemes.training`) check and declare:
their arguments' checks, the correctness their losses read, and their hyper-parameters'
types and warnings."""

from __future__ import annotations

import warnings
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field
from selbench.contract.api import (
    CoverageLoss,
    PredictingModule,
    Recalibrator,
    SelectionLoss,
    Selector,
    TrainableSelector,
)
from selbench.contract.data import DataError, ModelOutputs


def check_args(
    name: str,
    selector: Selector,
    recalibrator: Recalibrator,
    loss: Any,
    coverage: Any,
) -> None:
    if not isinstance(selector, TrainableSelector):
        raise ValueError(
            f"scheme {name!r} trains a learned selector (trainable = True, e.g. 'mlp'), but "
            f"{type(selector).__name__} is fitted by its own fit(); use the 'recalibration' "
            "scheme for it"
        )
    if loss is None:
        raise ValueError(
            f"scheme {name!r} needs a selection loss (loss: s-tlbce, s-mce or s-mmce), got none"
        )
    if not isinstance(loss, SelectionLoss):
        raise TypeError(
            f"loss: scheme {name!r} expects a SelectionLoss (s-tlbce, s-mce, s-mmce), "
            f"got {type(loss).__name__}"
        )
    if coverage is None:
        raise ValueError(
            f"scheme {name!r} needs a coverage loss (coverage: quadratic or log-coverage), "
            "got none"
        )
    if not isinstance(coverage, CoverageLoss):
        raise TypeError(
            f"coverage: scheme {name!r} expects a CoverageLoss (quadratic, log-coverage), "
            f"got {type(coverage).__name__}"
        )


def recalibrated_correct(recalibrator: Recalibrator, outputs: ModelOutputs) -> np.ndarray:
    """0/1 float64 correctness of the recalibrator's prediction (``recalibrator.predict``,
    which for most recalibrators is ``argmax(logits)``; binary Platt may change it)."""
    pred = np.asarray(recalibrator.predict(outputs))
    return (pred == outputs.labels).astype(np.float64)


def changes_prediction(module: Any) -> bool:
    """Whether a trained h module is a :class:`~selbench.contract.api.PredictingModule` whose
    prediction can differ from ``argmax(logits)``: the selective loss must then see the
    correctness of that prediction, recomputed at every step as h trains."""
    return isinstance(module, PredictingModule) and bool(module.changes_prediction)


#: the training hyperparameters of the three training schemes (Appendix A of the paper)
Epochs = Annotated[int, Field(ge=0, description="passes over the fitting data (paper: 1000)")]
BatchSize = Annotated[int, Field(ge=1, description="mini-batch size (paper: 100)")]
LearningRate = Annotated[float, Field(gt=0, description="Adam learning rate (paper: 5e-4)")]
WeightDecay = Annotated[float, Field(ge=0, description="Adam weight decay")]
NoiseStd = Annotated[float, Field(
    ge=0, description="std of Gaussian noise added to the selector's (and an MLP "
    "recalibrator's) input at every step, for robustness under shift (paper, RxRx1: 1); "
    "absolute, in the input's units: a warning says when it exceeds "
    "the input's typical per-dimension std 5-fold",
)]

#: noise_std above this multiple of the selector input's median per-dimension std drowns it
NOISE_DROWNS = 5.0


def warn_if_noise_drowns(noise_std: float, x: Any, name: str) -> None:
    """Warn when the absolute ``noise_std`` is large against the scale of the selector's
    input ``x`` [N, d] (the median over dimensions of the per-dimension std): the paper's
    noise_std = 1 on unit-norm sentence embeddings (per-dimension std about 0.045) turns the
    learned selector into an untrained one. The noise stays absolute, as the paper defines it."""
    if noise_std <= 0:
        return
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 2:
        return
    scale = float(np.median(arr.std(axis=0)))
    if scale > 0 and noise_std > NOISE_DROWNS * scale:
        warnings.warn(
            f"{name}: noise_std {noise_std:g} is {noise_std / scale:.0f}x the selector input's "
            f"typical per-dimension std ({scale:.3g}): the input is mostly noise (noise_std is "
            "absolute, in the input's units)", UserWarning, stacklevel=2)
Optimizer = Annotated[Literal["adam"], Field(description="optimiser (Adam only)")]


def check_logit_range(outputs: ModelOutputs, name: str) -> None:
    """The training schemes compute softmax(z - max z) in float32: a row whose logits span
    more than float32's largest value (about 3.4e38) overflows there (the loss then fails
    deep inside training), so it is refused up front, naming the array and the row."""
    z = np.asarray(outputs.logits, dtype=np.float64)
    span = z.max(axis=1) - z.min(axis=1) if z.size else z
    limit = float(np.finfo(np.float32).max)
    if span.size and not span.max() <= limit:
        i = int(np.argmax(span))
        raise DataError(
            f"logits: row {i} spans {z[i].min():.3g} to {z[i].max():.3g}, more than float32 "
            f"can hold ({limit:.3g}); scheme {name!r} trains in float32, where the softmax of "
            "such logits overflows: scale the logits down")
