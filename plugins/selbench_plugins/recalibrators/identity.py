"""``none``: the identity recalibrator (the model's own maximum softmax probability)."""

from __future__ import annotations

import numpy as np
import torch
from selbench.contract.api import DifferentiableRecalibrator, FitContext
from selbench.contract.checks import check_outputs
from selbench.contract.data import ModelOutputs


class IdentityModule(torch.nn.Module):
    """``forward(logits, features) -> (max softmax, log_softmax)``; no parameters."""

    def forward(self, logits: torch.Tensor, features: torch.Tensor | None = None):
        log_probs = torch.log_softmax(logits, dim=-1)
        return log_probs.max(dim=-1).values.exp(), log_probs


class IdentityRecalibrator(DifferentiableRecalibrator):
    """No recalibration: the confidence is the model's maximum softmax probability.

    Differentiable with no parameters, so the selection-only scheme can train a selector
    through its module; ``fit`` only checks its input. Usable without fitting.
    """

    provides_log_probs = True
    usable_unfitted = True

    def fit(self, outputs: ModelOutputs, context: FitContext) -> IdentityRecalibrator:
        check_outputs(outputs, "recalibrator 'none'", min_rows=1)
        self.num_classes_ = outputs.num_classes
        return self

    def confidence(self, outputs: ModelOutputs) -> np.ndarray:
        check_outputs(outputs, "recalibrator 'none'")
        return outputs.confidence()

    def module(self, outputs: ModelOutputs, context: FitContext) -> torch.nn.Module:
        if getattr(self, "module_", None) is None:
            self.module_ = IdentityModule()
        return self.module_
