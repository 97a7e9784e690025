"""``temperature``: temperature scaling (Guo et al., 2017) fitted to the exact NLL optimum."""

from __future__ import annotations

import math
from typing import Annotated

import numpy as np
import torch
from pydantic import Field, model_validator
from selbench.api import DifferentiableRecalibrator, FitContext, Params
from selbench.checks import NotFittedError, check_outputs
from selbench.data import ModelOutputs
from selbench.torchutils import run_module

from ._common import fit_once_per_data


class _TemperatureBounds(Params):
    """``min_temperature < max_temperature``."""

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_temperature >= self.max_temperature:
            raise ValueError("min_temperature must be smaller than max_temperature")
        return self


class TemperatureModule(torch.nn.Module):
    """``forward(logits, features) -> (max softmax(z/T), log_softmax(z/T))``.

    The learnable parameter is ``log_t = log T`` (so T stays positive in joint training).
    """

    def __init__(self, temperature: float = 1.0):
        super().__init__()
        self.log_t = torch.nn.Parameter(torch.tensor(math.log(temperature), dtype=torch.float32))

    def forward(self, logits: torch.Tensor, features: torch.Tensor | None = None):
        log_probs = torch.log_softmax(logits / self.log_t.exp(), dim=-1)
        return log_probs.max(dim=-1).values.exp(), log_probs

    @classmethod
    def stacked(
        cls, modules: list[TemperatureModule], streams: int = 1, split: int = 1
    ) -> BatchedTemperature:
        """The replicas ``modules`` as one batched module (see :class:`BatchedTemperature`)."""
        return BatchedTemperature(modules, streams)


class _ScaledLogSumExp(torch.autograd.Function):
    """``lse[u, j, b] = log sum_k exp(a[u, j] * d[u, b, k])`` for ``d <= 0`` with a zero in
    every row (logits minus their maximum), so every exponent is <= 0 and the sum >= 1.

    Differentiable in ``a`` only: ``d lse / d a = sum_k softmax(a d)_k d_k``, saved in the
    forward pass, so the backward pass costs nothing over the ``[U, m, B, K]`` block.
    """

    @staticmethod
    def forward(ctx, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        block = d.unsqueeze(1) * a[:, :, None, None]  # [U, m, B, K]
        block.exp_()
        total = block.sum(-1)
        block.mul_(d.unsqueeze(1))
        ctx.save_for_backward(block.sum(-1) / total)
        return total.log()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mean_d,) = ctx.saved_tensors
        return (grad * mean_d).sum(-1), None


class BatchedTemperature(torch.nn.Module):
    """R :class:`TemperatureModule` replicas trained as one (the batched training protocol).

    Parameters ``log_t [streams, m]``. :meth:`prepare` keeps, per example, the logits minus
    their maximum ``d = z - max z`` (and ``d_y`` at the label); a step then needs one
    ``log sum_k exp(d_k / T)`` per example and replica: the confidence is
    ``exp(-lse)`` and the label's log-probability ``d_y / T - lse``, the values
    :class:`TemperatureModule` computes (to float rounding) without forming the
    ``[R, B, K]`` log-probability block.
    """

    uses_features = False

    def __init__(self, modules: list[TemperatureModule], streams: int = 1):
        super().__init__()
        r = len(modules)
        self.replicas, self.streams = r, int(streams)
        log_t = torch.stack([m.log_t.detach().clone() for m in modules])
        self.log_t = torch.nn.Parameter(log_t.view(self.streams, r // self.streams).clone())

    @torch.no_grad()
    def prepare(
        self, logits: torch.Tensor, features: torch.Tensor | None, labels: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        d = logits - logits.max(dim=-1, keepdim=True).values
        out = {"d": d}
        if labels is not None:
            out["d_y"] = d.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return out

    def forward(self, batch: dict[str, torch.Tensor], features: torch.Tensor | None,
                need_log_prob: bool):
        a = torch.exp(-self.log_t)  # 1 / T, [U, m]
        lse = _ScaledLogSumExp.apply(a, batch["d"])  # [U, m, B]
        conf = torch.exp(-lse).reshape(self.replicas, -1)
        if not need_log_prob:
            return conf, None
        label_lp = a[:, :, None] * batch["d_y"][:, None, :] - lse
        return conf, label_lp.reshape(self.replicas, -1)

    @torch.no_grad()
    def write_back(self, modules: list[TemperatureModule]) -> None:
        for module, value in zip(modules, self.log_t.reshape(-1)):
            module.log_t.copy_(value)


def _nll_derivatives(z: np.ndarray, zy: np.ndarray, beta: float) -> tuple[float, float, float]:
    """Mean NLL of softmax(beta*z) and its first two derivatives in beta (float64)."""
    s = beta * z
    m = s.max(axis=1, keepdims=True)
    e = np.exp(s - m)
    tot = e.sum(axis=1, keepdims=True)
    p = e / tot
    lse = (m + np.log(tot))[:, 0]
    ez = (p * z).sum(axis=1)
    ez2 = (p * z * z).sum(axis=1)
    nll = float(np.mean(lse - beta * zy))
    grad = float(np.mean(ez - zy))
    hess = float(np.mean(np.maximum(ez2 - ez * ez, 0.0)))
    return nll, grad, hess


def fit_temperature(
    logits: np.ndarray, labels: np.ndarray, t_min: float = 1e-3, t_max: float = 1e3
) -> float:
    """The temperature minimising the mean multi-class NLL of ``softmax(logits / T)``.

    The NLL is convex in the inverse temperature b = 1/T (a log-sum-exp minus a linear
    term), so it is unimodal in log T; we find the root of its derivative in b with a
    safeguarded Newton iteration (Newton steps inside a shrinking bracket, bisection in
    log b otherwise), in float64, to machine precision. The result is clipped to
    ``[t_min, t_max]``: when the derivative has no root in that range the optimum lies on
    the boundary (e.g. T -> infinity for logits that carry no information about the labels).
    """
    z = np.asarray(logits, dtype=np.float64)
    zy = z[np.arange(z.shape[0]), np.asarray(labels)]
    lo, hi = 1.0 / t_max, 1.0 / t_min
    _, g_lo, _ = _nll_derivatives(z, zy, lo)
    if g_lo >= 0:
        return float(t_max)
    _, g_hi, _ = _nll_derivatives(z, zy, hi)
    if g_hi <= 0:
        return float(t_min)
    b = min(max(1.0, lo), hi)
    for _ in range(200):
        _, g, h = _nll_derivatives(z, zy, b)
        if g == 0.0:
            break
        if g < 0:
            lo = b
        else:
            hi = b
        step = g / h if h > 0 else np.inf
        new = b - step
        if not (lo < new < hi):
            new = math.sqrt(lo * hi)  # bisection in log b
        if abs(new - b) <= 1e-13 * b or hi - lo <= 1e-13 * hi:
            b = new
            break
        b = new
    return float(1.0 / b)


class TemperatureScaling(DifferentiableRecalibrator):
    """Temperature scaling: softmax(z / T) with T at the exact optimum of the NLL.

    ``fit`` minimises the mean multi-class cross entropy (negative log-likelihood) of the
    labels under ``softmax(logits / T)`` over T, as in Guo et al. (2017), but to
    convergence in float64 (see :func:`fit_temperature`) rather than with a few LBFGS
    steps. The fitted value is kept in ``T_fit_``; the live value ``T_`` is read from the
    module, which joint training updates in place. The prediction never changes.
    """

    provides_log_probs = True
    usable_unfitted = False
    params_base = _TemperatureBounds

    def __init__(
        self,
        min_temperature: Annotated[float, Field(
            gt=0, description="lower bound of the fitted temperature T")] = 1e-3,
        max_temperature: Annotated[float, Field(
            gt=0, description="upper bound of the fitted temperature T")] = 1e3,
    ) -> None:
        self.min_temperature = min_temperature
        self.max_temperature = max_temperature

    @classmethod
    def fit_many(cls, recalibrators, outputs, contexts) -> None:
        """Fit each of ``recalibrators`` on its ``outputs`` as :meth:`fit` would; the fit
        depends on the logits and labels only, so equal data are fitted once and copied."""
        fit_once_per_data(recalibrators, outputs, contexts)

    def fit(self, outputs: ModelOutputs, context: FitContext) -> TemperatureScaling:
        check_outputs(outputs, "recalibrator 'temperature'", min_rows=1)
        t = fit_temperature(
            outputs.logits, outputs.labels, self.min_temperature, self.max_temperature
        )
        self.T_fit_ = t
        self.module_ = TemperatureModule(t)
        return self

    @property
    def T_(self) -> float:
        """The current temperature (changes when a joint scheme trains the module)."""
        self._check_fitted()
        return float(self.module_.log_t.detach().exp().cpu())

    def _check_fitted(self) -> None:
        if getattr(self, "module_", None) is None:
            raise NotFittedError("recalibrator 'temperature' is not fitted; call fit first")

    def confidence(self, outputs: ModelOutputs) -> np.ndarray:
        check_outputs(outputs, "recalibrator 'temperature'")
        self._check_fitted()
        return np.clip(run_module(self.module_, outputs.logits), 0.0, 1.0)

    def module(self, outputs: ModelOutputs, context: FitContext) -> torch.nn.Module:
        self._check_fitted()
        return self.module_
