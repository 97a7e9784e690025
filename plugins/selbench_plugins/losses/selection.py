"""Selective calibration losses l(ĝ, h): ``s-tlbce``, ``s-mce``, ``s-mmce``.

Each is the paper's per-batch ``l`` (Section 3.1), written once for any number of leading
(replica) dimensions: ``[B]`` tensors give a scalar, ``[R, B]`` tensors the R replicas'
losses ``[R]`` (what the training engine, :mod:`selbench.training.engine`, passes). The paper's
``L_sel`` divides ``l`` by the batch's mean ĝ; Appendix A (following Fisch et al., 2022)
drops that denominator in training because the coverage loss already keeps ĝ away from 0.
``normalize=False`` (the default) drops it, ``normalize=True`` keeps it.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import torch
from pydantic import Field
from selbench.contract.api import SelectionLoss

#: smallest mean ĝ used as the denominator when ``normalize`` is on
MIN_COVERAGE = 1e-8

#: the ``normalize`` parameter every selection loss takes
Normalize = Annotated[bool, Field(
    description="divide by the batch's mean ĝ (the paper's L_sel); Appendix A drops it "
    "in training, which is the default",
)]


def _check(g: torch.Tensor, confidence: torch.Tensor, correct: torch.Tensor,
           label_log_prob: torch.Tensor | None = None) -> None:
    if g.dim() < 1:
        raise ValueError("g: expected a tensor [..., B] of soft selections, got a scalar")
    for name, t in (("confidence", confidence), ("correct", correct),
                    ("label_log_prob", label_log_prob)):
        if t is not None and t.shape != g.shape:
            raise ValueError(
                f"{name}: expected shape {tuple(g.shape)} like g, got {tuple(t.shape)}"
            )


class _Base(SelectionLoss):
    def __init__(self, normalize: Normalize = False) -> None:
        self.normalize = normalize

    def _finish(self, loss: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
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

    #: the method's canonical citation (shown by ``selbench plugins``)
    reference: ClassVar[str] = "Zollo et al., Improving Predictor Reliability with Selective Recalibration, TMLR 2024"

    def __call__(self, g, confidence, correct, label_log_prob=None):
        _check(g, confidence, correct)
        bce = torch.nn.functional.binary_cross_entropy(
            confidence, correct.to(confidence.dtype), reduction="none"
        )
        return self._finish((g * bce).mean(-1), g)


class SMCE(_Base):
    """Selective multi-class cross entropy (l_S-MCE): ``-1/n Σ_i ĝ_i log h(f(x_i))_{y_i}``.

    Needs the recalibrated log-probability of each example's label (``needs_log_probs``:
    the scheme takes it from h's log-probability vector), clamped at -100. For K = 2 it
    equals S-TLBCE.
    """

    #: the method's canonical citation (shown by ``selbench plugins``)
    reference: ClassVar[str] = "Zollo et al., Improving Predictor Reliability with Selective Recalibration, TMLR 2024"

    needs_log_probs = True

    def __call__(self, g, confidence, correct, label_log_prob=None):
        _check(g, confidence, correct, label_log_prob)
        if label_log_prob is None:
            raise ValueError(
                "label_log_prob: loss 's-mce' needs the recalibrated log-probability of each "
                "example's label; use a recalibrator that defines log-probabilities (none, "
                "temperature, platt)"
            )
        return self._finish(-(g * label_log_prob.clamp_min(-100.0)).mean(-1), g)


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

    #: the method's canonical citation (shown by ``selbench plugins``)
    reference: ClassVar[str] = "Fisch, Jaakkola & Barzilay, Calibrated Selective Classification, TMLR 2022"

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

    def __call__(self, g, confidence, correct, label_log_prob=None):
        _check(g, confidence, correct)
        lead = g.shape[:-1]
        g2, c2 = g.reshape(-1, g.shape[-1]), confidence.reshape(-1, g.shape[-1])
        err = (correct.reshape(c2.shape).to(c2.dtype) - c2).abs().pow(self.q) * g2  # [R, B]
        inner = _KernelQuadraticForm.apply(err, c2, float(self.width))
        return self._finish(inner.clamp_min(1e-12).pow(1.0 / self.q).reshape(lead), g)


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
