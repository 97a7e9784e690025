"""``mlp``: an MLP on the feature embedding that predicts the top-label confidence."""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field
from selbench.api import FitContext, Params, Recalibrator
from selbench.data import ModelOutputs

from ._common import (
    NotFittedError,
    build_mlp,
    check_outputs,
    cpu_threads,
    run_module,
    seeded_init,
    to_tensor,
)


class MLPRecalibratorParams(Params):
    hidden: list[int] = Field(
        default_factory=lambda: [128, 128],
        description="hidden layer widths (ReLU); the paper's comparison uses [128, 128]",
    )
    epochs: int = Field(1000, ge=0, description="passes over the fitting data")
    lr: float = Field(5e-4, gt=0, description="Adam learning rate")
    batch_size: int = Field(100, ge=1, description="mini-batch size")
    weight_decay: float = Field(0.0, ge=0, description="Adam weight decay")


class MLPRecalibratorNet(torch.nn.Module):
    """``forward(logits, features) -> (sigmoid(MLP(features)), None)``: the confidence is
    a function of the features only; no log-probability vector is defined."""

    def __init__(self, d_in: int, hidden: list[int]):
        super().__init__()
        self.net = build_mlp(d_in, hidden)

    def logit(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features).squeeze(-1)

    def forward(self, logits: torch.Tensor | None, features: torch.Tensor):
        return torch.sigmoid(self.logit(features)), None


class MLPRecalibrator(Recalibrator):
    """MLP recalibrator: confidence = sigmoid(MLP(features)), fitted by BCE on correctness.

    The paper's control for the selector's extra parameters: a recalibrator with the
    selector's architecture (2x128, ReLU) on the feature embedding. Trained with Adam on
    the binary cross entropy between its output and the prediction's correctness, mini-
    batches shuffled and weights initialised from ``context.seed``, on ``context.device``;
    the module is returned to the CPU afterwards. Learned state: ``module_``.
    """

    differentiable = True

    def __init__(
        self,
        hidden: list[int] | None = None,
        epochs: int = 1000,
        lr: float = 5e-4,
        batch_size: int = 100,
        weight_decay: float = 0.0,
    ) -> None:
        hidden = [128, 128] if hidden is None else list(hidden)
        MLPRecalibratorParams(
            hidden=hidden, epochs=epochs, lr=lr, batch_size=batch_size, weight_decay=weight_decay
        )
        self.hidden = hidden
        self.epochs = epochs
        self.lr = lr
        self.batch_size = batch_size
        self.weight_decay = weight_decay

    def fit(self, outputs: ModelOutputs, context: FitContext) -> MLPRecalibrator:
        check_outputs(outputs, "recalibrator 'mlp'", min_rows=1)
        device = context.torch_device()
        d = outputs.feature_dim
        module = seeded_init(context.seed, lambda: MLPRecalibratorNet(d, self.hidden)).to(device)
        x = to_tensor(outputs.features, device, torch.float32)
        y = to_tensor(outputs.correct(), device, torch.float32)
        opt = torch.optim.Adam(
            module.parameters(), lr=self.lr, weight_decay=self.weight_decay, foreach=True
        )
        gen = torch.Generator().manual_seed(int(context.seed))
        n, bs = len(outputs), int(self.batch_size)
        bce = torch.nn.functional.binary_cross_entropy_with_logits
        module.train()
        with cpu_threads(device):
            for _ in range(self.epochs):
                perm = torch.randperm(n, generator=gen).to(device)
                for idx in perm.split(bs):
                    loss = bce(module.logit(x[idx]), y[idx])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
        module.eval()
        self.feature_dim_ = d
        self.module_ = module.to("cpu")
        return self

    def _check(self, outputs: ModelOutputs) -> None:
        check_outputs(outputs, "recalibrator 'mlp'")
        if getattr(self, "module_", None) is None:
            raise NotFittedError("recalibrator 'mlp' is not fitted; call fit first")
        if outputs.feature_dim != self.feature_dim_:
            raise ValueError(
                f"features: recalibrator 'mlp' was fitted on d={self.feature_dim_} features, "
                f"got d={outputs.feature_dim}"
            )

    def confidence(self, outputs: ModelOutputs) -> np.ndarray:
        self._check(outputs)
        return np.clip(run_module(self.module_, outputs.logits, outputs.features), 0.0, 1.0)

    def module(self, outputs: ModelOutputs, context: FitContext) -> torch.nn.Module:
        self._check(outputs)
        return self.module_
