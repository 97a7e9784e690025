"""``platt``: Platt scaling (Platt, 1999) of the binary or the top-label probability."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from pydantic import Field
from selbench.api import FitContext, Params, Recalibrator
from selbench.data import ModelOutputs

from ._common import NotFittedError, check_outputs, fit_once_per_data, run_module

#: the logit of a probability clipped to [1e-12, 1 - 1e-12], as in Kumar et al.'s code
LOGIT_CLIP = math.log((1 - 1e-12) / 1e-12)

Mode = Literal["auto", "binary", "top-label"]


class PlattParams(Params):
    mode: Mode = Field(
        "auto",
        description="binary: regress the label on logit p(class 1) (K=2 only); top-label: "
        "regress correctness on logit(max prob); auto: binary when K=2, else top-label",
    )


def platt_inputs(logits: np.ndarray, mode: str) -> np.ndarray:
    """The scalar Platt input per example, float64: logit p(class 1) (binary) or
    logit(max prob) (top-label), computed stably from the logits and clipped to
    ±log((1-1e-12)/1e-12)."""
    z = np.asarray(logits, dtype=np.float64)
    if mode == "binary":
        s = z[:, 1] - z[:, 0]
    else:
        top = z.argmax(axis=1)
        zt = z[np.arange(z.shape[0]), top]
        rest = z.copy()
        rest[np.arange(z.shape[0]), top] = -np.inf
        m = rest.max(axis=1)
        lse = m + np.log(np.exp(rest - m[:, None]).sum(axis=1))
        s = zt - lse
    return np.clip(s, -LOGIT_CLIP, LOGIT_CLIP)


def platt_targets(outputs: ModelOutputs, mode: str) -> np.ndarray:
    if mode == "binary":
        return (outputs.labels == 1).astype(np.float64)
    return outputs.correct()


def fit_logistic(s: np.ndarray, y: np.ndarray, max_iter: int = 100) -> tuple[float, float]:
    """Unregularised 1-D logistic regression ``P(y=1) = sigmoid(a*s + b)`` by damped
    Newton iterations in float64, to a gradient below 1e-12 (the exact optimum). When the
    data are separable the optimum is at infinity; the iteration then stops once the
    gradient vanishes numerically, with large |a| or |b|."""
    s = np.asarray(s, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    X = np.stack([s, np.ones_like(s)], axis=1)
    n = s.shape[0]

    def loss(w: np.ndarray) -> float:
        t = X @ w
        return float(np.mean(np.logaddexp(0.0, t) - y * t))

    w = np.zeros(2)
    f = loss(w)
    for _ in range(max_iter):
        t = X @ w
        p = 0.5 * (1.0 + np.tanh(0.5 * t))  # sigmoid, overflow-free
        g = X.T @ (p - y) / n
        if np.max(np.abs(g)) < 1e-12:
            break
        H = (X * (p * (1 - p))[:, None]).T @ X / n
        try:
            d = np.linalg.solve(H + 1e-14 * np.eye(2), g)
            if not np.all(np.isfinite(d)) or g @ d <= 0:
                raise np.linalg.LinAlgError
        except np.linalg.LinAlgError:
            d = g
        step = 1.0
        while step > 1e-10:
            w_new = w - step * d
            f_new = loss(w_new)
            if f_new <= f - 1e-4 * step * (g @ d):
                break
            step *= 0.5
        else:
            break
        if np.max(np.abs(w_new - w)) <= 1e-13 * (1 + np.max(np.abs(w))):
            w, f = w_new, f_new
            break
        w, f = w_new, f_new
    return float(w[0]), float(w[1])


class PlattModule(torch.nn.Module):
    """``forward(logits, features) -> (confidence, log_probs)`` of Platt scaling.

    ``t = weight * s + bias`` where ``s`` is the Platt input (see :func:`platt_inputs`).

    * binary: ``p1' = sigmoid(t)``; log_probs = ``[log(1-p1'), log p1']``; the confidence
      is ``p1'`` when the prediction is class 1, else ``1 - p1'``.
    * top-label: confidence ``c = sigmoid(t)``; log_probs puts ``log c`` on the predicted
      class and shares ``1 - c`` among the other classes in proportion to their original
      probabilities: ``log p_k' = log(1-c) + z_k - logsumexp_{j != top} z_j``.
    """

    def __init__(self, weight: float, bias: float, binary: bool):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(float(weight), dtype=torch.float32))
        self.bias = torch.nn.Parameter(torch.tensor(float(bias), dtype=torch.float32))
        self.binary = bool(binary)

    def forward(self, logits: torch.Tensor, features: torch.Tensor | None = None):
        if self.binary:
            s = (logits[:, 1] - logits[:, 0]).clamp(-LOGIT_CLIP, LOGIT_CLIP)
            t = self.weight * s + self.bias
            lp1 = torch.nn.functional.logsigmoid(t)
            lp0 = torch.nn.functional.logsigmoid(-t)
            log_probs = torch.stack([lp0, lp1], dim=-1)
            pred1 = logits[:, 1] > logits[:, 0]  # argmax, first index on ties
            conf = torch.where(pred1, lp1, lp0).exp()
            return conf, log_probs
        top, idx = logits.max(dim=-1)
        rest = logits.scatter(-1, idx[:, None], float("-inf"))
        lse_rest = torch.logsumexp(rest, dim=-1)
        s = (top - lse_rest).clamp(-LOGIT_CLIP, LOGIT_CLIP)
        t = self.weight * s + self.bias
        log_c = torch.nn.functional.logsigmoid(t)
        log_rest = (rest - lse_rest[:, None]) + torch.nn.functional.logsigmoid(-t)[:, None]
        log_probs = log_rest.scatter(-1, idx[:, None], log_c[:, None])
        return log_c.exp(), log_probs

    @classmethod
    def stacked(cls, modules: list[PlattModule], streams: int = 1, split: int = 1) -> BatchedPlatt:
        """The replicas ``modules`` as one batched module (see :class:`BatchedPlatt`)."""
        return BatchedPlatt(modules, streams)


class BatchedPlatt(torch.nn.Module):
    """R :class:`PlattModule` replicas trained as one (the batched training protocol).

    Parameters ``weight``, ``bias`` of shape ``[streams, m]``; all replicas must share the
    mode (binary or top-label). :meth:`prepare` computes the Platt input ``s`` once per
    example, with what the label's log-probability needs: binary, the signs selecting
    ``log p1'`` or ``log(1 - p1')``; top-label, whether the label is the predicted class and
    else ``z_y - logsumexp_{j != top} z_j``. A step is then elementwise in ``t = w s + b``,
    giving the values :class:`PlattModule` computes (to float rounding).
    """

    uses_features = False

    def __init__(self, modules: list[PlattModule], streams: int = 1):
        super().__init__()
        modes = {m.binary for m in modules}
        if len(modes) != 1:
            raise ValueError("binary and top-label Platt modules cannot be stacked")
        self.binary = modes.pop()
        r = len(modules)
        self.replicas, self.streams = r, int(streams)
        shape = (self.streams, r // self.streams)
        self.weight = torch.nn.Parameter(
            torch.stack([m.weight.detach().clone() for m in modules]).view(shape).clone()
        )
        self.bias = torch.nn.Parameter(
            torch.stack([m.bias.detach().clone() for m in modules]).view(shape).clone()
        )

    @torch.no_grad()
    def prepare(
        self, logits: torch.Tensor, features: torch.Tensor | None, labels: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        if self.binary:
            s = (logits[..., 1] - logits[..., 0]).clamp(-LOGIT_CLIP, LOGIT_CLIP)
            one = torch.ones_like(s)
            out = {"s": s, "sign": torch.where(logits[..., 1] > logits[..., 0], one, -one)}
            if labels is not None:
                out["label_sign"] = torch.where(labels == 1, one, -one)
            return out
        top, idx = logits.max(dim=-1)
        rest = logits.scatter(-1, idx.unsqueeze(-1), float("-inf"))
        lse_rest = torch.logsumexp(rest, dim=-1)
        out = {"s": (top - lse_rest).clamp(-LOGIT_CLIP, LOGIT_CLIP)}
        if labels is not None:
            is_top = labels == idx
            z_y = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
            out["is_top"] = is_top
            out["rest_y"] = torch.where(is_top, torch.zeros_like(z_y), z_y - lse_rest)
        return out

    def forward(self, batch: dict[str, torch.Tensor], features: torch.Tensor | None,
                need_log_prob: bool):
        t = self.weight[:, :, None] * batch["s"][:, None, :] + self.bias[:, :, None]
        logsig = torch.nn.functional.logsigmoid
        if self.binary:
            conf = logsig(batch["sign"][:, None, :] * t).exp().reshape(self.replicas, -1)
            if not need_log_prob:
                return conf, None
            return conf, logsig(batch["label_sign"][:, None, :] * t).reshape(self.replicas, -1)
        log_c = logsig(t)
        conf = log_c.exp().reshape(self.replicas, -1)
        if not need_log_prob:
            return conf, None
        other = batch["rest_y"][:, None, :] + logsig(-t)
        label_lp = torch.where(batch["is_top"][:, None, :], log_c, other)
        return conf, label_lp.reshape(self.replicas, -1)

    @torch.no_grad()
    def write_back(self, modules: list[PlattModule]) -> None:
        for module, w, b in zip(modules, self.weight.reshape(-1), self.bias.reshape(-1)):
            module.weight.copy_(w)
            module.bias.copy_(b)


class PlattScaling(Recalibrator):
    """Platt scaling: a 1-D logistic regression on the logit of a probability.

    Binary mode (K=2) regresses the label on logit p(class 1) and reports p1' for a
    predicted class 1, else 1 - p1'. Top-label mode regresses correctness on
    logit(max prob) and reports the fitted probability as the top-label confidence (as
    Kumar et al.'s ``PlattTopCalibrator``). Fitted unregularised to the exact optimum
    (:func:`fit_logistic`); ``weight_`` / ``bias_`` are read live from the module, which a
    joint scheme trains in place. See :class:`PlattModule` for the log-probability vector.
    """

    differentiable = True

    def __init__(self, mode: Mode = "auto") -> None:
        PlattParams(mode=mode)
        self.mode = mode

    def _resolve_mode(self, k: int) -> str:
        if self.mode == "auto":
            return "binary" if k == 2 else "top-label"
        if self.mode == "binary" and k != 2:
            raise ValueError(
                f"logits: platt mode 'binary' needs K=2 classes, got K={k}; "
                "use mode 'top-label' or 'auto'"
            )
        return self.mode

    @classmethod
    def fit_many(cls, recalibrators, outputs, contexts) -> None:
        """Fit each of ``recalibrators`` on its ``outputs`` as :meth:`fit` would; the fit
        depends on the logits and labels only, so equal data are fitted once and copied."""
        fit_once_per_data(recalibrators, outputs, contexts)

    def fit(self, outputs: ModelOutputs, context: FitContext) -> PlattScaling:
        check_outputs(outputs, "recalibrator 'platt'", min_rows=1)
        mode = self._resolve_mode(outputs.num_classes)
        s = platt_inputs(outputs.logits, mode)
        a, b = fit_logistic(s, platt_targets(outputs, mode))
        self.mode_ = mode
        self.num_classes_ = outputs.num_classes
        self.module_ = PlattModule(a, b, binary=(mode == "binary"))
        return self

    def _check(self, outputs: ModelOutputs) -> None:
        check_outputs(outputs, "recalibrator 'platt'")
        if getattr(self, "module_", None) is None:
            raise NotFittedError("recalibrator 'platt' is not fitted; call fit first")
        if self.mode_ == "binary" and outputs.num_classes != 2:
            raise ValueError(
                f"logits: platt was fitted in binary mode (K=2), got K={outputs.num_classes}"
            )

    @property
    def weight_(self) -> float:
        return float(self.module_.weight.detach().cpu())

    @property
    def bias_(self) -> float:
        return float(self.module_.bias.detach().cpu())

    def confidence(self, outputs: ModelOutputs) -> np.ndarray:
        self._check(outputs)
        return np.clip(run_module(self.module_, outputs.logits), 0.0, 1.0)

    def module(self, outputs: ModelOutputs, context: FitContext) -> torch.nn.Module:
        self._check(outputs)
        return self.module_
