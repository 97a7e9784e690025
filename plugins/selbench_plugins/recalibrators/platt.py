"""``platt``: Platt scaling (Platt, 1999) of the binary or the top-label probability."""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field
from selbench.contract.data import ModelOutputs

from ._common import (
    BatchedBinaryOrTopLabel,
    BinaryOrTopLabelModule,
    BinaryOrTopLabelRecalibrator,
    one_torch_thread,
)

#: the logit of a probability clipped to [1e-12, 1 - 1e-12], as in Kumar et al.'s code
LOGIT_CLIP = math.log((1 - 1e-12) / 1e-12)

Mode = Literal["auto", "binary", "top-label"]

#: the ``mode`` parameter of ``platt``
PlattMode = Annotated[Mode, Field(
    description="binary: regress the label on logit p(class 1) (K=2 only); top-label: "
    "regress correctness on logit(max prob); auto: binary when K=2, else top-label",
)]


#: Elements per block of :func:`probability_logit` (a float64 block of 2 MB). The
#: top-label input block by block with torch on one thread: 63 ms at N = 1,000,000,
#: K = 10 and 151 ms at 50,000 x 1,000, against 190 / 315 ms for the float64 NumPy
#: version it replaced (whose row-wise argmax, max and fancy indexing over short rows
#: dominated); the best of block sizes 2^15 .. 2^20 (within 10 %).
_INPUT_BLOCK = 1 << 18


def probability_logit(logits: np.ndarray, mode: str, clip: float) -> np.ndarray:
    """The logit of the probability that ``mode`` recalibrates, per example, float64,
    computed stably from the logits and clipped to ``±clip``: binary, ``z_1 - z_0`` (the
    logit of p(class 1)); top-label, ``-log sum_{j != top} exp(z_j - z_top)`` (the logit
    of the max prob; ``top`` the first maximal class, which of tied maxima is left out
    does not change the value), in float64, block by block on one torch thread
    (:func:`~._common.one_torch_thread`). The input of Platt scaling
    (:func:`platt_inputs`) and of beta calibration (:func:`~.beta.beta_logits`)."""
    z = np.asarray(logits)
    if not np.issubdtype(z.dtype, np.floating):
        z = z.astype(np.float64)
    if mode == "binary":
        s = z[:, 1].astype(np.float64) - z[:, 0].astype(np.float64)
        return np.clip(s, -clip, clip, out=s)
    zt = torch.from_numpy(np.ascontiguousarray(z))
    n, k = zt.shape
    out = torch.empty(n, dtype=torch.float64)
    rows = max(1, _INPUT_BLOCK // max(k, 1))
    with one_torch_thread():
        for start in range(0, n, rows):
            block = zt[start:start + rows]
            top, idx = block.max(dim=1, keepdim=True)
            e = block.to(torch.float64, copy=True).sub_(top.to(torch.float64)).exp_()
            e.scatter_(1, idx, 0.0)  # every class but the top one
            torch.log(e.sum(dim=1), out=out[start:start + rows]).neg_()
    return out.clamp_(-clip, clip).numpy()


def platt_inputs(logits: np.ndarray, mode: str) -> np.ndarray:
    """The scalar Platt input per example, float64: logit p(class 1) (binary) or
    logit(max prob) (top-label), computed stably from the logits and clipped to
    ±log((1-1e-12)/1e-12) (:func:`probability_logit`).

    Top-label: ``-log sum_{j != top} exp(z_j - z_top)`` (``top`` the first maximal class;
    which of tied maxima is left out does not change the value), in float64, block by
    block on one torch thread (:func:`~._common.one_torch_thread`).
    """
    return probability_logit(logits, mode, LOGIT_CLIP)


def platt_probability(s: np.ndarray, weight: float, bias: float) -> np.ndarray:
    """``sigmoid(weight * s + bias)`` in float64, written as Kumar et al.'s
    ``get_platt_scaler`` writes it (``1 / (1 + exp(-x))``): the Platt-scaled probability of
    the Platt inputs ``s`` (:func:`platt_inputs`) — of class 1 (binary) or of the predicted
    class being right (top-label)."""
    x = np.asarray(s, dtype=np.float64) * float(weight)
    x += float(bias)  # the same operations as 1 / (1 + exp(-(s * w + b))), in place
    np.negative(x, out=x)
    with np.errstate(over="ignore"):
        np.exp(x, out=x)
    x += 1.0
    return np.divide(1.0, x, out=x)


def platt_targets(outputs: ModelOutputs, mode: str) -> np.ndarray:
    if mode == "binary":
        return (outputs.labels == 1).astype(np.float64)
    return outputs.correct()


#: Examples per block of :class:`_LogisticPass`, whose ten float64 buffers then stay in
#: cache. One pass over N = 1,000,000 on one thread: 9.3 ms with blocks of 2^16 (10.1 ms
#: with 2^15, 9.6 ms with 2^17, 13.1 ms with 2^20).
_PASS_BLOCK = 1 << 16
#: From this many examples on, :func:`fit_logistic` starts from a fit on an evenly strided
#: subsample of about this many (3-4 passes over all the data instead of 7-8).
_FIT_SUBSAMPLE = 1 << 16


class _LogisticPass:
    """Mean log-loss of ``sigmoid(a s + b)`` against ``y`` and its gradient and Hessian in
    ``(a, b)``, in one pass of float64 elementwise torch operations over the data.

    The loss is ``mean(softplus(t) - y t)`` with ``softplus(t) = max(t, 0) +
    log1p(exp(-|t|))`` (no overflow), the gradient ``mean((p - y) [s, 1])`` with
    ``p = sigmoid(t)`` and the Hessian ``mean(w [s^2, s, 1])`` with ``w = p (1 - p) =
    e / (1 + e)^2``, ``e = exp(-|t|)``. Block by block (:data:`_PASS_BLOCK`), the seven
    per-example terms are written into one buffer and summed at once; the block sums are
    then added in block order. One pass over 1,000,000 examples: 9.3 ms on one thread;
    the float64 NumPy Newton this replaced took 22 ms for the gradient and Hessian, plus
    a loss pass for each trial step.
    """

    def __init__(self, s: torch.Tensor, y: torch.Tensor):
        self.s, self.y, self.n = s, y, s.shape[0]
        m = min(_PASS_BLOCK, max(self.n, 1))
        self.q = torch.empty((7, m), dtype=torch.float64)
        self.t = torch.empty(m, dtype=torch.float64)
        self.e = torch.empty(m, dtype=torch.float64)
        self.d = torch.empty(m, dtype=torch.float64)
        self.sums = torch.empty((-(-self.n // _PASS_BLOCK), 7), dtype=torch.float64)
        for i, start in enumerate(range(0, self.n, _PASS_BLOCK)):
            yb = y[start:start + _PASS_BLOCK]
            q = self.q[:2, :yb.shape[0]]
            torch.mul(s[start:start + _PASS_BLOCK], yb, out=q[0])
            q[1].copy_(yb)
            torch.sum(q, dim=1, out=self.sums[i, :2])
        self.sy, self.sum_y = self.sums[:, :2].sum(dim=0).tolist()

    def __call__(self, a: float, b: float):
        """``(loss, its rounding scale, gradient, (H_aa, H_ab, H_bb))`` at ``(a, b)``."""
        for i, start in enumerate(range(0, self.n, _PASS_BLOCK)):
            s, y = self.s[start:start + _PASS_BLOCK], self.y[start:start + _PASS_BLOCK]
            m = s.shape[0]
            q, t, e, d = self.q[:, :m], self.t[:m], self.e[:m], self.d[:m]
            torch.mul(s, a, out=t).add_(b)
            torch.abs(t, out=e).neg_().exp_()  # e = exp(-|t|)
            torch.log1p(e, out=q[0])
            torch.clamp(t, min=0.0, out=q[1])
            torch.sigmoid(t, out=q[3]).sub_(y)  # r = p - y
            torch.mul(q[3], s, out=q[2])
            torch.add(e, 1.0, out=d)
            torch.div(e, d.mul_(d), out=q[6])  # w = p (1 - p)
            torch.mul(q[6], s, out=q[5])
            torch.mul(q[5], s, out=q[4])
            torch.sum(q, dim=1, out=self.sums[i])
        sp, relu, rs, r, wss, ws, w = self.sums.sum(dim=0).tolist()
        n = self.n
        f = (sp + relu - a * self.sy - b * self.sum_y) / n
        # the size of the terms of f, for what float64 rounding can change in it
        scale = (sp + relu + abs(a * self.sy) + abs(b * self.sum_y)) / n
        return f, scale, (rs / n, r / n), (wss / n, ws / n, w / n)


def _newton(derivatives: _LogisticPass, a: float, b: float, max_iter: int,
            first=None) -> tuple[float, float]:
    """Damped Newton on the mean log-loss from ``(a, b)`` (``first``: the pass there, if
    done) to a gradient below 1e-12.

    Each trial point is one pass (loss, gradient and Hessian together). A step is taken
    when it decreases the loss enough (Armijo, 1e-4), or when the loss does not grow beyond
    float64 rounding (near the optimum it no longer resolves the decrease) and the largest
    gradient component at least halves; otherwise the step is halved (down to 1e-10, then
    the iteration stops, as it does when a step no longer moves ``(a, b)``)."""
    f, _, g, h = first if first is not None else derivatives(a, b)
    for _ in range(max_iter):
        gmax = max(abs(g[0]), abs(g[1]))
        if not gmax >= 1e-12:
            break
        h00, h01, h11 = h[0] + 1e-14, h[1], h[2] + 1e-14
        det = h00 * h11 - h01 * h01
        d0 = (h11 * g[0] - h01 * g[1]) / det if det > 0 else math.nan
        d1 = (h00 * g[1] - h01 * g[0]) / det if det > 0 else math.nan
        gd = g[0] * d0 + g[1] * d1
        if not (math.isfinite(d0) and math.isfinite(d1) and gd > 0):
            d0, d1 = g  # not a descent direction: a gradient step
            gd = g[0] * d0 + g[1] * d1
        step = 1.0
        while step > 1e-10:
            a_new, b_new = a - step * d0, b - step * d1
            f_new, scale, g_new, h_new = derivatives(a_new, b_new)
            if f_new <= f - 1e-4 * step * gd or (
                f_new <= f + 1e-12 * scale and max(abs(g_new[0]), abs(g_new[1])) <= 0.5 * gmax
            ):
                break
            step *= 0.5
        else:
            break
        small = max(abs(a_new - a), abs(b_new - b)) <= 1e-13 * (1 + max(abs(a), abs(b)))
        a, b, f, g, h = a_new, b_new, f_new, g_new, h_new
        if small:
            break
    return a, b


def fit_logistic(s: np.ndarray, y: np.ndarray, max_iter: int = 100) -> tuple[float, float]:
    """Unregularised 1-D logistic regression ``P(y=1) = sigmoid(a*s + b)`` by damped
    Newton iterations in float64, to a gradient below 1e-12 (the exact optimum). When the
    data are separable the optimum is at infinity; the iteration then stops once the
    gradient vanishes numerically, with large |a| or |b|.

    Each Newton trial is one pass of float64 torch operations on one thread
    (:class:`_LogisticPass`); from ``2**18`` examples on, the iteration starts from the
    fit on an evenly strided subsample of ``~2**16`` examples (kept only when its loss on
    all the data is below the loss at ``(0, 0)``, else the fit starts from zero), so that
    4 passes over all the data are left instead of 7-8. Measured: 1,000,000 examples,
    44 ms against 160-450 ms for the NumPy Newton this replaced; 50,000, 2.5 ms against
    7-24 ms; 2,000, 0.4 ms against 0.9-1.9 ms.
    """
    s_t = torch.from_numpy(np.ascontiguousarray(s, dtype=np.float64))
    y_t = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float64))
    n = s_t.shape[0]
    if n == 0:
        return 0.0, 0.0
    with one_torch_thread():
        full = _LogisticPass(s_t, y_t)
        a = b = 0.0
        first = None
        if n // _FIT_SUBSAMPLE >= 4:
            stride = n // _FIT_SUBSAMPLE
            sub = _LogisticPass(s_t[::stride].contiguous(), y_t[::stride].contiguous())
            a, b = _newton(sub, 0.0, 0.0, max_iter)
            first = full(a, b) if math.isfinite(a) and math.isfinite(b) else None
            if first is None or not first[0] < math.log(2.0):  # the loss at (0, 0) is log 2
                a = b = 0.0
                first = None
        a, b = _newton(full, a, b, max_iter, first)
    return float(a), float(b)


class PlattModule(BinaryOrTopLabelModule):
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
        super().__init__(binary, weight=weight, bias=bias)

    def _t(self, u: torch.Tensor) -> torch.Tensor:
        """``t = weight * s + bias``, ``s`` the logit ``u`` clipped to ``±LOGIT_CLIP``."""
        return self.weight * u.clamp(-LOGIT_CLIP, LOGIT_CLIP) + self.bias

    @classmethod
    def stacked(cls, modules: list[PlattModule]) -> BatchedPlatt:
        """The replicas ``modules`` as one hand-stacked module (see :class:`BatchedPlatt`)."""
        return BatchedPlatt(modules)


class BatchedPlatt(BatchedBinaryOrTopLabel):
    """R :class:`PlattModule` replicas trained as one (hand-stacked for the training engine,
    :mod:`selbench.training.engine`; elementwise work on the precomputed Platt inputs, where
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

    _params = ("weight", "bias")
    _modules_name = _method_name = "Platt"

    def _inputs(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"s": u.clamp(-LOGIT_CLIP, LOGIT_CLIP)}

    def _t(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.weight[:, None] * batch["s"] + self.bias[:, None]


class PlattScaling(BinaryOrTopLabelRecalibrator):
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

    #: the method's canonical citation (shown by ``selbench plugins``)
    reference: ClassVar[str] = "Platt, Probabilistic Outputs for Support Vector Machines, 1999"

    _name = "platt"

    def __init__(self, mode: PlattMode = "auto") -> None:
        self.mode = mode

    def _fit_module(self, outputs: ModelOutputs, mode: str) -> PlattModule:
        s = platt_inputs(outputs.logits, mode)
        a, b = fit_logistic(s, platt_targets(outputs, mode))
        self.weight_fit_, self.bias_fit_ = a, b  # float64; the module holds float32 copies
        return PlattModule(a, b, binary=(mode == "binary"))

    @property
    def weight_(self) -> float:
        return float(self.module_.weight.detach().cpu())

    @property
    def bias_(self) -> float:
        return float(self.module_.bias.detach().cpu())
