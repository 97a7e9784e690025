"""``platt``: Platt scaling (Platt, 1999) of the binary or the top-label probability."""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import Field
from selbench.api import DifferentiableRecalibrator, FitContext
from selbench.checks import NotFittedError, check_outputs
from selbench.data import ModelOutputs
from selbench.torchutils import EVAL_CHUNK, device_of, run_module

from ._common import fit_once_per_data

#: the logit of a probability clipped to [1e-12, 1 - 1e-12], as in Kumar et al.'s code
LOGIT_CLIP = math.log((1 - 1e-12) / 1e-12)

Mode = Literal["auto", "binary", "top-label"]

#: the ``mode`` parameter of ``platt``
PlattMode = Annotated[Mode, Field(
    description="binary: regress the label on logit p(class 1) (K=2 only); top-label: "
    "regress correctness on logit(max prob); auto: binary when K=2, else top-label",
)]


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


def platt_probability(s: np.ndarray, weight: float, bias: float) -> np.ndarray:
    """``sigmoid(weight * s + bias)`` in float64, written as Kumar et al.'s
    ``get_platt_scaler`` writes it (``1 / (1 + exp(-x))``): the Platt-scaled probability of
    the Platt inputs ``s`` (:func:`platt_inputs`) — of class 1 (binary) or of the predicted
    class being right (top-label)."""
    x = np.asarray(s, dtype=np.float64) * float(weight) + float(bias)
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


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

    * binary: ``p1' = sigmoid(t)``; the recalibrated probability vector is ``[1-p1', p1']``
      and log_probs = ``[log(1-p1'), log p1']``. Its top label is the prediction
      (:meth:`predict`: class 1 when ``t > 0``, else class 0 — ``argmax`` picks the first
      index on the tie ``p1' = 0.5``), which may differ from ``argmax(logits)``; the
      confidence is that label's probability ``max(p1', 1-p1') = sigmoid(|t|)``, never
      below 0.5. This is how Kumar et al.'s ``calibration`` package scores a binary Platt
      output in top-label mode (``get_calibration_error([1-p1', p1'], labels,
      mode='top-label')``).
    * top-label: confidence ``c = sigmoid(t)``; log_probs puts ``log c`` on the predicted
      class and shares ``1 - c`` among the other classes in proportion to their original
      probabilities: ``log p_k' = log(1-c) + z_k - logsumexp_{j != top} z_j``.
    """

    def __init__(self, weight: float, bias: float, binary: bool):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(float(weight), dtype=torch.float32))
        self.bias = torch.nn.Parameter(torch.tensor(float(bias), dtype=torch.float32))
        self.binary = bool(binary)

    @property
    def changes_prediction(self) -> bool:
        """Binary Platt can change the predicted class (see :meth:`predict`)."""
        return self.binary

    def _binary_t(self, logits: torch.Tensor) -> torch.Tensor:
        s = (logits[:, 1] - logits[:, 0]).clamp(-LOGIT_CLIP, LOGIT_CLIP)
        return self.weight * s + self.bias

    def forward(self, logits: torch.Tensor, features: torch.Tensor | None = None):
        if self.binary:
            t = self._binary_t(logits)
            lp1 = torch.nn.functional.logsigmoid(t)
            lp0 = torch.nn.functional.logsigmoid(-t)
            log_probs = torch.stack([lp0, lp1], dim=-1)
            conf = torch.nn.functional.logsigmoid(t.abs()).exp()  # max(p1', 1 - p1')
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

    @torch.no_grad()
    def predict(self, logits: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """The recalibrated prediction, int64 ``[B]``: binary, the top label of
        ``[1-p1', p1']`` (1 when ``t > 0``, else 0); top-label, ``argmax(logits)``."""
        if self.binary:
            return (self._binary_t(logits) > 0).long()
        return logits.argmax(dim=-1)

    @classmethod
    def stacked(cls, modules: list[PlattModule]) -> BatchedPlatt:
        """The replicas ``modules`` as one hand-stacked module (see :class:`BatchedPlatt`)."""
        return BatchedPlatt(modules)


class BatchedPlatt(torch.nn.Module):
    """R :class:`PlattModule` replicas trained as one (hand-stacked for the training engine,
    :mod:`selbench.engine`; elementwise work on the precomputed Platt inputs, where
    ``torch.func`` would recompute the log-sum-exp of the logits at every step).

    Parameters ``weight``, ``bias`` of shape ``[R]``; all replicas must share the
    mode (binary or top-label). :meth:`prepare` computes the Platt input ``s`` once per
    example, with what the label's log-probability needs: binary, the signs selecting
    ``log p1'`` or ``log(1 - p1')``; top-label, whether the label is the predicted class and
    else ``z_y - logsumexp_{j != top} z_j``. A step is then elementwise in ``t = w s + b``,
    giving the values :class:`PlattModule` computes (to float rounding).

    Binary Platt can change the prediction (``changes_prediction``): :meth:`correct` gives
    each replica's correctness of its recalibrated prediction ``[R, B]`` (``prepare`` must
    have had the labels), as :meth:`PlattModule.predict` compared with the labels.
    """

    uses_features = False

    def __init__(self, modules: list[PlattModule]):
        super().__init__()
        modes = {m.binary for m in modules}
        if len(modes) != 1:
            raise ValueError("binary and top-label Platt modules cannot be stacked")
        self.binary = modes.pop()
        self.changes_prediction = self.binary
        self.replicas = len(modules)
        self.weight = torch.nn.Parameter(torch.stack([m.weight.detach().clone() for m in modules]))
        self.bias = torch.nn.Parameter(torch.stack([m.bias.detach().clone() for m in modules]))

    @torch.no_grad()
    def prepare(
        self, logits: torch.Tensor, features: torch.Tensor | None, labels: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        if self.binary:
            s = (logits[..., 1] - logits[..., 0]).clamp(-LOGIT_CLIP, LOGIT_CLIP)
            one = torch.ones_like(s)
            out = {"s": s}
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

    def _t(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.weight[:, None] * batch["s"] + self.bias[:, None]

    def forward(self, batch: dict[str, torch.Tensor], features: torch.Tensor | None,
                need_log_prob: bool):
        t = self._t(batch)
        logsig = torch.nn.functional.logsigmoid
        if self.binary:
            conf = logsig(t.abs()).exp()
            if not need_log_prob:
                return conf, None
            return conf, logsig(batch["label_sign"] * t)
        log_c = logsig(t)
        conf = log_c.exp()
        if not need_log_prob:
            return conf, None
        other = batch["rest_y"] + logsig(-t)
        return conf, torch.where(batch["is_top"], log_c, other)

    @torch.no_grad()
    def correct(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Binary: 1.0 where replica ``r``'s prediction (class 1 iff ``t > 0``) is the label,
        float32 ``[R, B]``; needs ``batch["label_sign"]`` (``prepare`` with labels)."""
        if not self.binary:
            raise ValueError("top-label Platt keeps the prediction; use the data's correctness")
        pred1 = self._t(batch) > 0
        return (pred1 == (batch["label_sign"] > 0)).to(batch["s"].dtype)

    @torch.no_grad()
    def write_back(self, modules: list[PlattModule]) -> None:
        for module, w, b in zip(modules, self.weight, self.bias):
            module.weight.copy_(w)
            module.bias.copy_(b)


class PlattScaling(DifferentiableRecalibrator):
    """Platt scaling: a 1-D logistic regression on the logit of a probability.

    Binary mode (K=2) regresses the label on logit p(class 1) (Kumar et al.'s
    ``PlattCalibrator``) and is scored as that package scores it in top-label mode: the
    recalibrated probabilities are ``[1-p1', p1']``, :meth:`predict` returns their argmax
    (class 1 iff p1' > 0.5; the prediction may differ from ``argmax(logits)``) and
    :meth:`confidence` its probability ``max(p1', 1-p1')``. Top-label mode regresses
    correctness on logit(max prob) and reports the fitted probability as the top-label
    confidence of the unchanged prediction (as Kumar et al.'s ``PlattTopCalibrator``).

    Fitted unregularised to the exact optimum (:func:`fit_logistic`; the package stops
    scikit-learn's L-BFGS at its default tolerance, ~1e-4 off in the coefficients). The
    fitted float64 coefficients are kept in ``weight_fit_`` / ``bias_fit_``; ``weight_`` /
    ``bias_`` are read live from the (float32) module, which a joint scheme trains in
    place. See :class:`PlattModule` for the log-probability vector.
    """

    provides_log_probs = True
    usable_unfitted = False

    def __init__(self, mode: PlattMode = "auto") -> None:
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
        self.weight_fit_, self.bias_fit_ = a, b  # float64; the module holds float32 copies
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

    def predict(self, outputs: ModelOutputs) -> np.ndarray:
        """Binary mode: the top label of ``[1-p1', p1']`` (see the class docstring), computed
        by the live module; top-label mode: ``argmax(logits)``."""
        self._check(outputs)
        if self.mode_ != "binary":
            return outputs.predictions()
        module = self.module_
        device = device_of(module)
        parts = []
        for start in range(0, len(outputs), EVAL_CHUNK):
            chunk = torch.tensor(outputs.logits[start : start + EVAL_CHUNK]).to(device)
            parts.append(module.predict(chunk).cpu().numpy())
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def module(self, outputs: ModelOutputs, context: FitContext) -> torch.nn.Module:
        self._check(outputs)
        return self.module_
