"""``ensemble-temperature``: Mix-n-Match ensemble temperature scaling (Zhang, Kailkhura &
Han, 2020)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Annotated, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field
from selbench.contract.api import FitContext
from selbench.contract.checks import check_outputs
from selbench.contract.data import ModelOutputs
from selbench.training.torchutils import EVAL_CHUNK, device_of

from ._common import one_torch_thread
from .beta import non_negative
from .temperature import (
    MaxTemperature,
    MinTemperature,
    TemperatureBase,
    fit_temperature,
    newton_root,
    subsample_stride,
)

Loss = Literal["mse", "ce"]

#: Logit elements per block of the passes below (float32 blocks of 256 kB stay in cache).
#: A pass of the MSE derivatives over 50,000 x 1,000 logits: 120 ms with NumPy on one
#: thread, 133 ms with torch (its float64 row sums were slower still).
_BLOCK = 1 << 16


class _Blocks:
    """Float32 logits ``[n, k]`` with their row maxima and ``d_y = z_y - max z``, read in
    row blocks of ``d = z - max z`` (every row <= 0 with a zero), formed in a reused
    buffer."""

    def __init__(self, logits: np.ndarray, labels: np.ndarray):
        z = np.ascontiguousarray(logits, dtype=np.float32)
        self.z = z
        self.n, self.k = z.shape
        zt = torch.from_numpy(z)
        self.top = np.empty(self.n, dtype=np.float32)
        rows = max(1, (1 << 18) // self.k)
        with one_torch_thread():
            for s in range(0, self.n, rows):
                self.top[s:s + rows] = zt[s:s + rows].max(dim=1).values.numpy()
        labels = np.asarray(labels, dtype=np.int64)
        self.dy = (z[np.arange(self.n), labels] - self.top).astype(np.float64)
        self.rows = max(1, _BLOCK // self.k)
        self._d = np.empty((self.rows, self.k), dtype=np.float32)
        self._e = np.empty((self.rows, self.k), dtype=np.float32)
        self._w = np.empty((self.rows, self.k), dtype=np.float32)

    def subsample(self, stride: int) -> _Blocks:
        """Every ``stride``-th row, as new blocks."""
        sub = object.__new__(_Blocks)
        sub.z = np.ascontiguousarray(self.z[::stride])
        sub.n, sub.k = sub.z.shape
        sub.top = np.ascontiguousarray(self.top[::stride])
        sub.dy = np.ascontiguousarray(self.dy[::stride])
        sub.rows, sub._d, sub._e, sub._w = self.rows, self._d, self._e, self._w
        return sub

    def __iter__(self) -> Iterator[tuple[slice, np.ndarray, np.ndarray, np.ndarray]]:
        """``(rows, d, e, w)``: the slice of rows, their ``d`` and two scratch buffers."""
        for s in range(0, self.n, self.rows):
            m = min(self.rows, self.n - s)
            d = self._d[:m]
            np.subtract(self.z[s:s + m], self.top[s:s + m, None], out=d)
            yield slice(s, s + m), d, self._e[:m], self._w[:m]


def _mse_derivatives(blocks: _Blocks, beta: float) -> tuple[float, float, float]:
    """The MSE of ``p = softmax(beta * z)`` against the one-hot labels (the mean over all
    ``n * K`` entries, as the authors' ``mse_t``) and its first two derivatives in
    ``beta``, in one pass.

    Per row, with ``p_k' = p_k (d_k - m1)``, ``m1 = E_p[d]``, ``v = Var_p[d]``:
    ``sum_k (p_k - y_k)^2 = Q - 2 p_y + 1`` with ``Q = sum_k p_k^2``;
    ``Q' = 2 (A1 - m1 Q)``, ``Q'' = 4 (A2 - 2 m1 A1 + m1^2 Q) - 2 v Q`` (``A_j = sum_k
    p_k^2 d_k^j``); ``p_y' = p_y (d_y - m1)``, ``p_y'' = p_y ((d_y - m1)^2 - v)``. The
    row sums of ``e^i d^j`` (``e = exp(beta d)``) are float32 over a float32 block,
    combined in float64.
    """
    n, k = blocks.n, blocks.k
    sums = np.empty((6, n))
    b32 = np.float32(beta)
    for rows, d, e, w in blocks:
        np.multiply(d, b32, out=e)
        np.exp(e, out=e)
        s = sums[:, rows]
        s[0] = e.sum(axis=1)
        np.multiply(e, d, out=w)
        s[1] = w.sum(axis=1)
        s[2] = np.einsum("ij,ij->i", w, d)
        np.multiply(e, e, out=e)
        s[3] = e.sum(axis=1)
        np.multiply(e, d, out=w)
        s[4] = w.sum(axis=1)
        s[5] = np.einsum("ij,ij->i", w, d)
    s0, s1, s2, t0, t1, t2 = sums
    m1 = s1 / s0
    v = np.maximum(s2 / s0 - m1 * m1, 0.0)
    s0sq = s0 * s0
    q, a1, a2 = t0 / s0sq, t1 / s0sq, t2 / s0sq
    dy = blocks.dy
    py = np.exp(beta * dy) / s0
    loss = float(np.mean(q - 2.0 * py + 1.0)) / k
    grad = float(np.mean(2.0 * (a1 - m1 * q) - 2.0 * py * (dy - m1))) / k
    hess = float(np.mean(4.0 * (a2 - 2.0 * m1 * a1 + m1 * m1 * q) - 2.0 * v * q
                         - 2.0 * py * ((dy - m1) ** 2 - v))) / k
    return loss, grad, hess


def fit_mse_temperature(blocks: _Blocks, t_min: float, t_max: float) -> float:
    """The temperature minimising the MSE of ``softmax(z / T)`` (the authors' ``mse_t``)
    over ``[t_min, t_max]``, from T = 1 (their start).

    Safeguarded Newton in the inverse temperature (:func:`~.temperature.newton_root`, one
    pass of :func:`_mse_derivatives` per step), whose steps towards an unexplored side are
    of a factor 2 (the MSE is concave around T = 1 for over-confident logits: a larger
    factor overshot to the bound and took 7 passes instead of 4 on a 50,000 x 100 test);
    on large inputs a fit on an evenly strided subsample of the rows gives the start, so
    the full data need two or three passes. The MSE need not be convex in ``1 / T``: like
    the authors' L-BFGS-B, this finds a local minimum (the one a descent from T = 1
    reaches when the function is unimodal)."""
    lo, hi = 1.0 / t_max, 1.0 / t_min
    b = 1.0
    stride = subsample_stride(blocks.n, blocks.k)
    if stride:
        sub = blocks.subsample(stride)
        b = newton_root(lambda x: _mse_derivatives(sub, x), b, lo, hi, 1e-3, 2.0)
    b = newton_root(lambda x: _mse_derivatives(blocks, x), b, lo, hi, 1e-6, 2.0)
    return float(min(max(1.0 / b, t_min), t_max))


def _component_stats(blocks: _Blocks, beta: float, gram: bool) -> dict[str, np.ndarray]:
    """Per row, the label's probability under ``softmax(beta z)`` and ``softmax(z)``
    (``p0y``, ``p1y``) and, with ``gram``, the row sums ``sum_k p0_k^2``,
    ``sum_k p0_k p1_k``, ``sum_k p1_k^2`` (``g00``, ``g01``, ``g11``), in one pass."""
    n = blocks.n
    sums = np.empty((5 if gram else 2, n))
    b32 = np.float32(beta)
    for rows, d, e, w in blocks:
        s = sums[:, rows]
        np.multiply(d, b32, out=e)
        np.exp(e, out=e)
        np.exp(d, out=w)
        s[0] = e.sum(axis=1)
        s[1] = w.sum(axis=1)
        if gram:
            s[3] = np.einsum("ij,ij->i", e, w)
            s[2] = np.einsum("ij,ij->i", e, e)
            s[4] = np.einsum("ij,ij->i", w, w)
    out = {"p0y": np.exp(beta * blocks.dy) / sums[0], "p1y": np.exp(blocks.dy) / sums[1]}
    if gram:
        out["g00"] = sums[2] / (sums[0] * sums[0])
        out["g01"] = sums[3] / (sums[0] * sums[1])
        out["g11"] = sums[4] / (sums[1] * sums[1])
    return out


def _weight_objective(stats: dict[str, np.ndarray], k: int, loss: str):
    """``f(w) -> (value, gradient [3], Hessian [3, 3])`` of the weights' loss, the
    authors' ``mse_w`` / ``ll_w``: the mean over the ``n * K`` entries of
    ``(sum_j w_j P_j - onehot)^2`` (a quadratic in ``w``: ``(w'Gw - 2 g'w + 1) / K`` with
    ``G`` the mean Gram matrix of the three components and ``g`` their mean probability
    of the label) or the mean of ``-log sum_j w_j P_j(y)`` (each ``P_j(y) >= 1e-20``).
    Component 2 is the uniform distribution ``1 / K``."""
    if loss == "mse":
        u = 1.0 / k
        gmat = np.array([
            [stats["g00"].mean(), stats["g01"].mean(), u],
            [stats["g01"].mean(), stats["g11"].mean(), u],
            [u, u, u],
        ])
        gvec = np.array([stats["p0y"].mean(), stats["p1y"].mean(), u])

        def mse(w: np.ndarray):
            gw = gmat @ w
            return float(w @ gw - 2.0 * gvec @ w + 1.0) / k, 2.0 * (gw - gvec) / k, 2.0 * gmat / k

        return mse
    # a component's probability of the label floored at 1e-20 (probmetrics floors the
    # mixture there): where it underflows, the loss, its gradient and Hessian stay finite
    cols = np.stack([np.maximum(stats["p0y"], 1e-20), np.maximum(stats["p1y"], 1e-20),
                     np.full(len(stats["p0y"]), 1.0 / k)], axis=1)

    def ce(w: np.ndarray):
        p = cols @ w
        r = cols / p[:, None]
        return float(-np.log(p).mean()), -r.mean(axis=0), r.T @ r / len(p)

    return ce


def minimize_on_simplex(f: Callable[[np.ndarray], tuple[float, np.ndarray, np.ndarray]]
                        ) -> np.ndarray:
    """The minimiser of a convex ``f(w) -> (value, gradient, Hessian)`` over the
    probability simplex of 3 weights, exactly (to rounding).

    Each edge (which includes its vertices) is minimised as a 1-D convex problem
    (safeguarded Newton on the monotone derivative, bisection where a step leaves the
    bracket). The best edge point is the optimum if it satisfies the optimality
    conditions on the simplex (no weight it leaves at 0 has a lower partial derivative
    than the ones it uses, within rounding); otherwise the optimum is inside and a damped
    Newton iteration over the plane ``sum w = 1``, kept inside the simplex, finds it."""
    best, best_f = None, math.inf
    for i, j in ((0, 1), (0, 2), (1, 2)):
        w = _edge_minimum(f, i, j)
        value = f(w)[0]
        if value < best_f:
            best, best_f = w, value
    _, g, _ = f(best)
    used = best > 0
    lam = float(g[used].max())
    scale = float(np.abs(g).max()) + 1e-300
    if (g[~used] >= lam - 1e-9 * scale).all():
        return best
    return _interior_minimum(f)


def _edge_minimum(f: Callable[[np.ndarray], tuple[float, np.ndarray, np.ndarray]], i: int,
                  j: int) -> np.ndarray:
    """The minimiser of ``f`` on the edge from vertex ``i`` to vertex ``j`` of the simplex
    (both included): safeguarded Newton on the monotone derivative along the edge."""
    eye = np.eye(3)
    direction = eye[j] - eye[i]

    def slope(s: float):
        _, g, h = f(eye[i] + s * direction)
        return float(g @ direction), float(direction @ h @ direction)

    g0, _ = slope(0.0)
    g1, _ = slope(1.0)
    if g0 >= 0:
        s = 0.0
    elif g1 <= 0:
        s = 1.0
    else:
        lo, hi, s = 0.0, 1.0, 0.5
        for _ in range(200):
            g, h = slope(s)
            if g == 0.0:
                break
            if g < 0:
                lo = s
            else:
                hi = s
            new = s - g / h if h > 0 else math.nan
            if not lo < new < hi:
                new = 0.5 * (lo + hi)
            if abs(new - s) <= 1e-15 or hi - lo <= 1e-15:
                s = new
                break
            s = new
    return eye[i] + s * direction


def _interior_minimum(f: Callable[[np.ndarray], tuple[float, np.ndarray, np.ndarray]]
                      ) -> np.ndarray:
    """The minimiser of ``f`` inside the simplex: damped Newton in ``(w0, w1)``, ``w2 = 1 -
    w0 - w1``, from the centre, each step at most 0.99 of the way to an edge."""
    m = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    w = np.full(3, 1.0 / 3.0)
    value, g, h = f(w)
    for _ in range(200):
        ga, ha = m.T @ g, m.T @ h @ m
        try:
            step = -np.linalg.solve(ha, ga)
        except np.linalg.LinAlgError:
            step = -ga
        if not (np.isfinite(step).all() and ga @ step < 0):
            step = -ga
        dw = m @ step
        t = 1.0
        neg = dw < 0
        if neg.any():  # stay strictly inside: at most 0.99 of the way to an edge
            t = min(1.0, 0.99 * float((w[neg] / -dw[neg]).min()))
        while t > 1e-16:
            w_new = w + t * dw
            v_new, g_new, h_new = f(w_new)
            if v_new <= value + 1e-4 * t * float(ga @ step) or (
                    v_new <= value + 1e-15 * abs(value)):
                break
            t *= 0.5
        else:
            break  # no decrease left: at the optimum to rounding
        done = float(np.abs(t * dw).max()) <= 1e-13
        w, value, g, h = w_new, v_new, g_new, h_new
        if done:
            break
    return np.maximum(w, 0.0) / np.maximum(w, 0.0).sum()


def fit_ensemble_temperature(logits: np.ndarray, labels: np.ndarray, loss: str = "mse",
                             t_min: float = 0.05, t_max: float = 5.0
                             ) -> tuple[float, np.ndarray]:
    """Mix-n-Match ensemble temperature scaling: ``(T, w)`` for
    ``p = w0 softmax(z / T) + w1 softmax(z) + w2 / K``.

    As the authors' ``ets_calibrate`` (and probmetrics' ``ETSCalibrator``): T minimises
    ``loss`` of temperature scaling alone within ``[t_min, t_max]`` (MSE:
    :func:`fit_mse_temperature`; CE: the NLL, :func:`~.temperature.fit_temperature`),
    then the weights minimise ``loss`` of the mixture over the simplex
    (:func:`minimize_on_simplex`, exact where the authors run SLSQP). The logits are
    read as float32."""
    blocks = _Blocks(logits, labels)
    if loss == "mse":
        t = fit_mse_temperature(blocks, t_min, t_max)
    else:
        # one torch thread: measured on 2 shared cores, fit_temperature at 10,000 x 100
        # took 0.26-5.6 s with two threads and 0.11-0.15 s with one
        with one_torch_thread():
            t = fit_temperature(blocks.z, labels, t_min, t_max)
    stats = _component_stats(blocks, 1.0 / t, gram=(loss == "mse"))
    w = minimize_on_simplex(_weight_objective(stats, blocks.k, loss))
    return t, w


class EnsembleTemperatureModule(torch.nn.Module):
    """``forward(logits, features) -> (confidence, log_probs)`` of ensemble temperature
    scaling: ``p = w0 softmax(z / T) + w1 softmax(z) + w2 / K``, whose top label is
    ``argmax(z)``; the confidence is ``p`` there and log_probs is ``log p``.

    Learnable: ``log_t = log T`` and ``raw_weights``; the weights are ``max(raw, 0)``
    normalised to sum 1 (:func:`~.beta.non_negative`, so a weight the fit set to 0 can
    become positive in joint training). ``log p`` is computed as
    ``L + log sum_j w_j exp(l_j - L)`` with ``l_j`` the components' log-probabilities and
    ``L = log p`` evaluated without gradient: the value is ``log p`` without underflow and
    the gradient in ``w_j`` is ``P_j / p`` also where ``w_j = 0`` (a ratio above ``e^80`` is
    capped there).
    """

    uses_features = False

    def __init__(self, temperature: float = 1.0, weights=(1.0, 0.0, 0.0)):
        super().__init__()
        self.log_t = torch.nn.Parameter(torch.tensor(math.log(temperature), dtype=torch.float32))
        self.raw_weights = torch.nn.Parameter(torch.tensor(
            [float(x) for x in weights], dtype=torch.float32))

    def weights(self) -> torch.Tensor:
        w = non_negative(self.raw_weights)
        return w / w.sum().clamp(min=1e-30)

    def forward(self, logits: torch.Tensor, features: torch.Tensor | None = None):
        k = logits.shape[-1]
        comps = torch.stack([
            torch.log_softmax(logits / self.log_t.exp(), dim=-1),
            torch.log_softmax(logits, dim=-1),
            torch.full_like(logits, -math.log(k)),
        ])  # [3, B, K]
        w = self.weights()
        with torch.no_grad():
            level = torch.logsumexp(w.log()[:, None, None] + comps, dim=0)
        ratio = torch.exp((comps - level).clamp(max=80.0))
        log_probs = level + torch.log((w[:, None, None] * ratio).sum(dim=0))
        idx = logits.argmax(dim=-1, keepdim=True)
        return log_probs.gather(-1, idx).squeeze(-1).exp(), log_probs

    @torch.no_grad()
    def top_confidence(self, logits: torch.Tensor) -> torch.Tensor:
        """The confidence ``forward`` returns (to float32 rounding), without the
        log-probability vector: ``w0 max softmax(z / T) + w1 max softmax(z) + w2 / K``."""
        w = self.weights()
        t = self.log_t.exp()
        top = logits.max(dim=-1).values
        p0 = torch.exp(top / t - torch.logsumexp(logits / t, dim=-1))
        p1 = torch.exp(top - torch.logsumexp(logits, dim=-1))
        return w[0] * p0 + w[1] * p1 + w[2] / logits.shape[-1]


class EnsembleTemperatureScaling(TemperatureBase):
    """Mix-n-Match ensemble temperature scaling (Zhang, Kailkhura & Han, ICML 2020).

    The recalibrated distribution is ``w0 softmax(z / T) + w1 softmax(z) + w2 / K`` with
    weights on the simplex, fitted as the authors' ``ets_calibrate``
    (zhang64-llnl/Mix-n-Match-Calibration) and probmetrics' ``ETSCalibrator``: first T of
    temperature scaling alone within the authors' bounds [0.05, 5], then the weights,
    both minimising ``loss`` (the authors' default, the mean squared error against the
    one-hot label; or the cross entropy), each to the exact optimum
    (:func:`fit_ensemble_temperature`). The mixture keeps the top label ``argmax(z)``; the
    confidence is its mixture probability.

    The fitted values are kept in ``T_fit_`` and ``weights_fit_``; ``T_`` and ``weights_``
    are read live from the (float32) module, which a joint scheme trains in place (see
    :class:`EnsembleTemperatureModule`).
    """

    reference: ClassVar[str] = (
        "Zhang, Kailkhura & Han, Mix-n-Match: Ensemble and Compositional Methods for Uncertainty "
        "Calibration in Deep Learning, ICML 2020")
    _name = "ensemble-temperature"

    def __init__(
        self,
        loss: Annotated[Loss, Field(
            description="what T and the weights minimise: mse (the authors' default, the "
            "squared error against the one-hot label) or ce (cross entropy)")] = "mse",
        min_temperature: MinTemperature = 0.05,
        max_temperature: MaxTemperature = 5.0,
    ) -> None:
        self.loss = loss
        self.min_temperature = min_temperature
        self.max_temperature = max_temperature

    def fit(self, outputs: ModelOutputs, context: FitContext) -> EnsembleTemperatureScaling:
        check_outputs(outputs, "recalibrator 'ensemble-temperature'", min_rows=1)
        t, w = fit_ensemble_temperature(outputs.logits, outputs.labels, self.loss,
                                        self.min_temperature, self.max_temperature)
        self.T_fit_ = t
        self.weights_fit_ = w
        self.module_ = EnsembleTemperatureModule(t, w)
        return self

    @property
    def weights_(self) -> np.ndarray:
        """The current weights (of ``softmax(z / T)``, ``softmax(z)``, uniform)."""
        self._check_fitted()
        with torch.no_grad():
            return self.module_.weights().cpu().double().numpy()

    def confidence(self, outputs: ModelOutputs) -> np.ndarray:
        """The live module's confidence (:meth:`EnsembleTemperatureModule.top_confidence`,
        chunked on the module's device): the ``[3, B, K]`` mixture of ``forward`` is not
        formed."""
        self._check(outputs)
        module = self.module_
        device = device_of(module)
        parts = [np.zeros(0)]
        for start in range(0, len(outputs), EVAL_CHUNK):
            chunk = torch.tensor(outputs.logits[start:start + EVAL_CHUNK]).to(device)
            parts.append(module.top_confidence(chunk).to("cpu", torch.float64).numpy())
        return np.clip(np.concatenate(parts), 0.0, 1.0)
