"""Selective calibration losses l(ĝ, h): ``s-tlbce``, ``s-mce``, ``s-mmce``.

Each is the paper's per-batch ``l`` (Section 3.1). Besides the per-batch call, each loss class
offers ``batched(losses)``: the same loss for R replicas at once (see
:meth:`_Base.batched`), used by the schemes' batched training. The paper's ``L_sel`` divides ``l`` by
the batch's mean ĝ; Appendix A (following Fisch et al., 2022) drops that denominator in
training because the coverage loss already keeps ĝ away from 0. ``normalize=False`` (the
default) drops it, ``normalize=True`` keeps it.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import Field
from selbench.api import SelectionLoss

#: smallest mean ĝ used as the denominator when ``normalize`` is on
MIN_COVERAGE = 1e-8

#: the ``normalize`` parameter every selection loss takes
Normalize = Annotated[bool, Field(
    description="divide by the batch's mean ĝ (the paper's L_sel); Appendix A drops it "
    "in training, which is the default",
)]


def _check(g: torch.Tensor, confidence: torch.Tensor, correct: torch.Tensor) -> None:
    if g.dim() != 1:
        raise ValueError(f"g: expected a 1-D tensor [B] of soft selections, got shape {tuple(g.shape)}")
    if confidence.shape != g.shape:
        raise ValueError(
            f"confidence: expected shape {tuple(g.shape)} like g, got {tuple(confidence.shape)}"
        )
    if correct.shape != g.shape:
        raise ValueError(
            f"correct: expected shape {tuple(g.shape)} like g, got {tuple(correct.shape)}"
        )


class _Base(SelectionLoss):
    def __init__(self, normalize: Normalize = False) -> None:
        self.normalize = normalize

    def _finish(self, loss: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if self.normalize:
            loss = loss / g.mean().clamp_min(MIN_COVERAGE)
        return loss

    @classmethod
    def batched(cls, losses):
        """The loss of R replicas at once (see :meth:`selbench.api.SelectionLoss.batched`),
        or ``None`` unless the replicas are all of this class with equal parameters."""
        if any(type(loss) is not cls for loss in losses):
            return None
        params = {tuple(sorted(loss.get_params(deep=False).items())) for loss in losses}
        if len(params) != 1:
            return None
        return losses[0]._batched

    def _finish_batched(self, loss: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if self.normalize:
            loss = loss / g.mean(-1).clamp_min(MIN_COVERAGE)
        return loss


class STLBCE(_Base):
    """Selective top-label binary cross entropy (the paper's proposed loss, l_S-TLBCE).

    ``-1/n Σ_i ĝ_i [y^c_i log ĥ_i + (1 - y^c_i) log(1 - ĥ_i)]`` where ĥ_i is the
    recalibrated top-label confidence and y^c_i the correctness of the prediction. Logs
    are clamped at -100 (as ``torch.nn.functional.binary_cross_entropy``), so confidences
    of exactly 0 or 1 give finite values and gradients.
    """

    def __call__(self, g, confidence, correct, log_probs=None, labels=None):
        _check(g, confidence, correct)
        bce = torch.nn.functional.binary_cross_entropy(
            confidence, correct.to(confidence.dtype), reduction="none"
        )
        return self._finish((g * bce).mean(), g)

    def _batched(self, g, confidence, correct, label_log_prob=None):
        bce = torch.nn.functional.binary_cross_entropy(
            confidence, correct.to(confidence.dtype), reduction="none"
        )
        return self._finish_batched((g * bce).mean(-1), g)


class SMCE(_Base):
    """Selective multi-class cross entropy (l_S-MCE): ``-1/n Σ_i ĝ_i log h(f(x_i))_{y_i}``.

    Needs the full recalibrated log-probability vector (``needs_log_probs``) and the
    labels; log-probabilities are clamped at -100. For K = 2 it equals S-TLBCE.
    """

    needs_log_probs = True

    def __call__(self, g, confidence, correct, log_probs=None, labels=None):
        _check(g, confidence, correct)
        if log_probs is None or labels is None:
            raise ValueError(
                "log_probs: loss 's-mce' needs the recalibrated log-probabilities [B, K] and "
                "the labels [B]; use a recalibrator that defines them (none, temperature, platt)"
            )
        if log_probs.dim() != 2 or log_probs.shape[0] != g.shape[0]:
            raise ValueError(
                f"log_probs: expected shape [{g.shape[0]}, K], got {tuple(log_probs.shape)}"
            )
        if labels.shape != g.shape:
            raise ValueError(f"labels: expected shape {tuple(g.shape)}, got {tuple(labels.shape)}")
        lp = log_probs.gather(1, labels.long().view(-1, 1)).squeeze(1).clamp_min(-100.0)
        return self._finish(-(g * lp).mean(), g)

    def _batched(self, g, confidence, correct, label_log_prob=None):
        if label_log_prob is None:
            raise ValueError("label_log_prob: loss 's-mce' needs the label's log-probability")
        return self._finish_batched(-(g * label_log_prob.clamp_min(-100.0)).mean(-1), g)


class SMMCE(_Base):
    """Selective maximum mean calibration error, l_S-MMCE (Fisch et al., 2022).

    ``[1/n² Σ_ij |y^c_i - ĥ_i|^q |y^c_j - ĥ_j|^q ĝ_i ĝ_j φ(ĥ_i, ĥ_j)]^(1/q)``

    with the Laplacian kernel ``φ(a, b) = exp(-|a - b| / width)``. The default width 0.2
    is the value in Fisch et al.'s released code (``laplacian_kernel``); Kumar et al.
    (2018), whose MMCE it extends, use 0.4. The normalisation is the paper's 1/n² inside
    the power (Fisch et al.'s code scales the q=2 case by 1/√n outside instead, which for
    a fixed batch size differs by a constant factor). The inner sum is clamped at 1e-12
    before the 1/q power, so the gradient stays finite when every term vanishes.
    """

    def __init__(
        self,
        normalize: Normalize = False,
        q: Annotated[Literal[1, 2], Field(description="the power q of S-MMCE (1 or 2)")] = 2,
        width: Annotated[float, Field(
            gt=0, description="Laplacian kernel width: 0.2 as in Fisch et al.'s S-MMCE code "
            "(Kumar et al. 2018's MMCE uses 0.4)",
        )] = 0.2,
    ) -> None:
        super().__init__(normalize)
        self.q = q
        self.width = width

    def __call__(self, g, confidence, correct, log_probs=None, labels=None):
        _check(g, confidence, correct)
        err = (correct.to(confidence.dtype) - confidence).abs().pow(self.q) * g
        kernel = torch.exp(-(confidence[:, None] - confidence[None, :]).abs() / self.width)
        n = g.shape[0]
        inner = (err[:, None] * kernel * err[None, :]).sum() / (n * n)
        return self._finish(inner.clamp_min(1e-12).pow(1.0 / self.q), g)

    def _batched(self, g, confidence, correct, label_log_prob=None):
        err = (correct.to(confidence.dtype) - confidence).abs().pow(self.q) * g  # [R, B]
        inner = _KernelQuadraticForm.apply(err, confidence, float(self.width))
        return self._finish_batched(inner.clamp_min(1e-12).pow(1.0 / self.q), g)


class _KernelQuadraticForm(torch.autograd.Function):
    """``inner[r] = 1/n² Σ_ij e_ri e_rj exp(-|c_ri - c_rj| / width)`` for ``e, c [R, n]``,
    with a hand-written backward pass: the ``[R, n, n]`` kernel is built once and reused,
    where autograd would keep and revisit several such blocks. The kernel is symmetric, so
    ``∂/∂e_i = 2/n² (K e)_i`` and ``∂/∂c_i = -2/(n² width) e_i Σ_j sign(c_i - c_j) K_ij e_j``
    (``sign(0) = 0``, as autograd's derivative of ``|x|`` at 0)."""

    @staticmethod
    def forward(ctx, err: torch.Tensor, conf: torch.Tensor, width: float) -> torch.Tensor:
        diff = conf[:, :, None] - conf[:, None, :]
        kernel = torch.exp(diff.abs().mul_(-1.0 / width))
        # K e as e^T K (K is symmetric): a row vector times a matrix is about ten times
        # faster than a matrix times a column vector in the CPU BLAS
        k_err = torch.bmm(err.unsqueeze(1), kernel).squeeze(1)
        n = err.shape[-1]
        ctx.width, ctx.scale = width, 1.0 / (n * n)
        if ctx.needs_input_grad[1]:
            ctx.save_for_backward(err, k_err, kernel, diff)
        else:
            ctx.save_for_backward(err, k_err)
        return (err * k_err).sum(-1) * ctx.scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        saved = ctx.saved_tensors
        err, k_err = saved[0], saved[1]
        g = grad[:, None] * (2.0 * ctx.scale)
        grad_err = g * k_err if ctx.needs_input_grad[0] else None
        grad_conf = None
        if ctx.needs_input_grad[1]:
            kernel, diff = saved[2], saved[3]
            signed = torch.sign(diff).mul_(kernel)  # antisymmetric: S e = -(e^T S)
            pull = torch.bmm(err.unsqueeze(1), signed).squeeze(1)
            grad_conf = (g / ctx.width) * err * pull
        return grad_err, grad_conf, None
