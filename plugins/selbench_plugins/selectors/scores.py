"""Confidence scores computed from the backbone's logits: ``entropy``, ``margin``,
``max-logit`` and ``maxlogit-pnorm``.

These selectors read ``outputs.logits``, the **backbone's** logits, not the recalibrated
confidence the scheme passes them (which is checked, then ignored): a recalibrator changes
the selective risk of the accepted examples only through its predictions, never the order
these scores give. They are post-hoc scores of the literature on selective classification
and misclassification detection, computed in float64 from the float32 logits, one example
at a time (no statistic of the scored batch), so an example's score does not depend on the
other rows scored with it.
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar

import numpy as np
from pydantic import Field, NonNegativeFloat
from selbench.contract.api import FitContext, Selector
from selbench.contract.checks import NotFittedError, check_confidence, check_outputs
from selbench.contract.data import ModelOutputs
from selbench.measure.riskcoverage import aurc

#: Smallest norm a centred logit vector is divided by (as ``torch.nn.functional.normalize``).
_NORM_EPS = 1e-12


def _log_softmax(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(log p, p)`` of ``softmax(logits)``, float64, stable for any finite logits."""
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    z -= np.log(np.exp(z).sum(axis=1, keepdims=True))
    return z, np.exp(z)


class _LogitScore(Selector):
    """A score of the logits alone: nothing to fit but the input checks."""

    _name: ClassVar[str] = ""

    def fit(self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext):
        who = f"selector '{self._name}'"
        check_outputs(outputs, who, min_rows=1)
        check_confidence(outputs, confidence, who)
        self.n_fit_ = len(outputs)
        return self

    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        who = f"selector '{self._name}'"
        check_outputs(outputs, who)
        check_confidence(outputs, confidence, who)
        if getattr(self, "n_fit_", None) is None:
            raise NotFittedError(f"{who} is not fitted; call fit first")
        return self._score(outputs.logits)

    def _score(self, logits: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError


class EntropySelector(_LogitScore):
    """Predictive entropy (as in Jaeger et al., ICLR 2023): score = −H(softmax(z)) of the logits.

    ``score = sum_k p_k log p_k`` with ``log p = z - logsumexp(z)`` computed after
    subtracting the row maximum, so it is exact for logits of any size (a class whose
    probability underflows to 0 contributes 0). Reads the backbone's logits, not the
    recalibrated confidence. Nothing is learned from the fitting data.
    """

    _name = "entropy"
    reference: ClassVar[str] = (
        "predictive entropy, as evaluated by Jaeger et al., A Call to Reflect on Evaluation "
        "Practices for Failure Detection in Image Classification, ICLR 2023"
    )

    def _score(self, logits: np.ndarray) -> np.ndarray:
        log_p, p = _log_softmax(logits)
        return np.einsum("ij,ij->i", p, log_p)


class MarginSelector(_LogitScore):
    """Softmax margin (Scheffer et al., IDA 2001): top-1 minus top-2 probability of the logits.

    ``score = p_(1) - p_(2)`` of ``softmax(z)`` (float64), in [0, 1]; 0 when the two
    largest logits tie. Reads the backbone's logits, not the recalibrated confidence.
    Nothing is learned from the fitting data.
    """

    _name = "margin"
    reference: ClassVar[str] = (
        "Scheffer, Decomain & Wrobel, Active Hidden Markov Models for Information Extraction, "
        "IDA 2001 (the margin of the two most probable classes)"
    )

    def _score(self, logits: np.ndarray) -> np.ndarray:
        _, p = _log_softmax(logits)
        top2 = np.partition(p, p.shape[1] - 2, axis=1)[:, -2:]
        return np.abs(top2[:, 1] - top2[:, 0])


class MaxLogitSelector(_LogitScore):
    """MaxLogit: the largest logit max_k z_k of the backbone (Hendrycks et al., ICML 2022).

    Unlike the softmax probability it keeps the logits' scale. Reads the backbone's logits,
    not the recalibrated confidence. Nothing is learned from the fitting data.
    """

    _name = "max-logit"
    reference: ClassVar[str] = (
        "Hendrycks et al., Scaling Out-of-Distribution Detection for Real-World Settings, "
        "ICML 2022"
    )

    def _score(self, logits: np.ndarray) -> np.ndarray:
        return logits.max(axis=1).astype(np.float64)


def pnorm_scores(logits: np.ndarray, p: float | None, centralize: bool = True) -> np.ndarray:
    """MaxLogit-pNorm of every row of ``logits``: ``max_k z'_k / ||z'||_p`` with ``z'`` the
    logits minus their mean (``centralize``), float64 ``[N]``.

    ``p = 0``: no normalisation (``max_k z'_k``); ``p = inf``: the largest ``|z'_k|``;
    ``p = None``: the maximum softmax probability of the (uncentred) logits, the method's
    fallback. The norm is computed as ``m * (sum_k (|z'_k| / m)^p)^(1/p)`` with ``m`` the
    largest ``|z'_k|`` (no overflow for any finite logits) and clamped below at 1e-12.
    """
    if p is None:
        return _log_softmax(logits)[1].max(axis=1)
    z = logits.astype(np.float64)
    if centralize:
        z -= z.mean(axis=1, keepdims=True)
    top = z.max(axis=1)
    if p == 0:
        return top
    a = np.abs(z)
    m = a.max(axis=1)
    if math.isinf(p):
        norm = m
    else:
        safe = np.where(m > 0, m, 1.0)
        norm = m * np.power(np.power(a / safe[:, None], p).sum(axis=1), 1.0 / p)
    return top / np.maximum(norm, _NORM_EPS)


#: p values the authors' code searches (``optimize.p_range = torch.arange(10)``)
_P_GRID = tuple(float(p) for p in range(10))


class MaxLogitPNormSelector(Selector):
    """MaxLogit-pNorm (Cattelan & Silva, UAI 2024): max of the centred logits over their p-norm.

    ``score = max_k (z_k - mean(z)) / ||z - mean(z)||_p`` of the backbone's logits ``z``
    (it reads the backbone's logits, not the recalibrated confidence). As in the paper and
    the authors' code (lfpc/FixSelectiveClassification, ``post_hoc.py``, commit ``edc274e``:
    ``MaxLogit_pNorm`` and ``optimize.p``):

    * the logits are centred (``centralize``, the code's default) before the norm;
    * ``p = 0`` means no normalisation (the code's ``p_norm`` of the first version returns
      the logits unchanged; its current ``normalize`` divides by torch's "0-norm", the count
      of non-zero entries, which is K for every row without a zero centred logit, so the
      order is the same);
    * ``p`` is chosen on the fitting data by a grid search minimising the AURC
      (``selbench.measure.riskcoverage.aurc``) of the correctness of the backbone's prediction
      ``argmax z`` (a recalibrator that changes predictions is not seen); the grid is the code's
      ``torch.arange(10)``, p = 0..9 (``p_grid``), and the first p reaching the lowest
      AURC wins;
    * with ``msp_fallback`` (the default of the code's ``optimize.p``) the maximum softmax
      probability competes first: unless some p has a strictly lower AURC on the fitting
      data, the selector scores by the MSP of the logits (``p_ = None``).

    A fixed ``p`` skips the search (and the fallback). Learned state: ``p_`` (the p used,
    or None for the MSP fallback) and ``aurc_`` (the fitting AURC of every candidate,
    ``{"msp": ..., 0.0: ..., ...}``; empty for a fixed p).
    """

    reference: ClassVar[str] = (
        "Cattelan & Silva, How to Fix a Broken Confidence Estimator: Evaluating Post-hoc "
        "Methods for Selective Classification with Deep Neural Networks, UAI 2024"
    )

    def __init__(
        self,
        p: Annotated[NonNegativeFloat | None, Field(
            description="a fixed p (0: no normalisation; inf allowed); None: chosen on the "
                        "fitting data from p_grid")] = None,
        p_grid: Annotated[tuple[NonNegativeFloat, ...], Field(
            min_length=1, description="the p values searched when p is None "
                                      "(the authors' code: 0..9)")] = _P_GRID,
        msp_fallback: Annotated[bool, Field(
            description="when searching, keep the maximum softmax probability unless some p "
                        "has a strictly lower fitting AURC")] = True,
        centralize: Annotated[bool, Field(
            description="subtract each row's mean logit before the norm")] = True,
    ) -> None:
        self.p = p
        self.p_grid = p_grid
        self.msp_fallback = msp_fallback
        self.centralize = centralize

    def fit(self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext):
        who = "selector 'maxlogit-pnorm'"
        check_outputs(outputs, who, min_rows=1)
        check_confidence(outputs, confidence, who)
        self.aurc_: dict = {}
        if self.p is not None:
            self.p_ = float(self.p)
            return self
        correct = outputs.correct()
        best, best_p = math.inf, None
        if self.msp_fallback:
            best = self.aurc_["msp"] = aurc(pnorm_scores(outputs.logits, None), correct)
        for p in self.p_grid:
            value = aurc(pnorm_scores(outputs.logits, float(p), self.centralize), correct)
            self.aurc_[float(p)] = value
            if value < best:
                best, best_p = value, float(p)
        self.p_ = best_p
        return self

    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        who = "selector 'maxlogit-pnorm'"
        check_outputs(outputs, who)
        check_confidence(outputs, confidence, who)
        if not hasattr(self, "p_"):
            raise NotFittedError(f"{who} is not fitted; call fit first")
        return pnorm_scores(outputs.logits, self.p_, self.centralize)
