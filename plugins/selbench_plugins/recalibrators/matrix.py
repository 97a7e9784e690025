"""``vector-scaling``, ``matrix-scaling``, ``dirichlet``: an affine map of the logits (Guo et
al., 2017) or of the log-probabilities (Kull et al., 2019) followed by a softmax, fitted in
float64 to the optimum of the mean NLL plus, optionally, Kull et al.'s ODIR regulariser.

=================  =================================  ================================
plugin             calibrated probabilities           parameters
=================  =================================  ================================
vector-scaling     ``softmax(w * z + b)``             ``w``, ``b`` in R^K (2K)
matrix-scaling     ``softmax(W z + b)``               ``W`` in R^{KxK}, ``b`` (K^2 + K)
dirichlet          ``softmax(W log softmax(z) + b)``  ``W``, ``b`` (K^2 + K)
=================  =================================  ================================

The fitted objective is the mean multi-class NLL of the labels plus

* ``matrix-scaling`` / ``dirichlet``: ODIR, Off-Diagonal and Intercept Regularisation
  (Kull et al., NeurIPS 2019, Sec. 3.2), ``reg_lambda / (K (K - 1)) * sum_{i != j} W_ij^2
  + reg_mu / K * sum_j b_j^2``: the normalisation of the paper, of ``dirichletcal``'s
  ``reg_norm=True`` and of torch-uncertainty's ``DirichletScaler``;
* ``vector-scaling``: ``reg_mu / K * sum_j b_j^2`` (intercept only).

The objective is convex. Softmax ignores a constant added to every class's logit, so
without regularisation the optimum is a set; the fit returns its representative whose
intercepts sum to zero and whose off-diagonal column sums ``sum_{i != j} W_ij`` are zero,
which the regularised optimum satisfies anyway. The prediction is the calibrated argmax,
which can differ from ``argmax(logits)``: the modules are
:class:`~selbench.contract.api.PredictingModule` s and the confidence is the probability of that
label.

Fitting (float64, full batch, deterministic, on one torch thread): vector scaling by
damped Newton iterations with the exact Hessian (``2K x 2K``) to a gradient at rounding
level; matrix scaling and Dirichlet by L-BFGS (scipy's L-BFGS-B, 20 corrections) run until
it can no longer decrease the objective, preconditioned by the per-class diagonal blocks of
the NLL Hessian at the temperature-scaled start (``sum_n p_nk (1 - p_nk) x_n x_n^T / N`` plus
the regulariser, for K <= 128; their diagonals above), then polished by Newton steps
(conjugate gradients with that preconditioner). The start is temperature scaling
(``W = I / T``); the references start at the identity: the objective being convex, the
optimum is the same.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import numpy as np
import scipy.optimize
import torch
from pydantic import Field, model_validator
from selbench.contract.api import FitContext, Params
from selbench.contract.checks import NotFittedError, check_outputs
from selbench.contract.data import ModelOutputs
from selbench.contract.search import Tune
from selbench.training.torchutils import EVAL_CHUNK, device_of
from threadpoolctl import threadpool_limits

from ._common import FittedModuleRecalibrator, one_torch_thread
from .newton import vector_direction
from .temperature import fit_temperature

__all__ = [
    "AffineScalingModule",
    "DirichletCalibration",
    "MatrixScaling",
    "VectorScaling",
    "VectorScalingModule",
    "affine_objective",
    "fit_affine",
    "fit_vector_scaling",
    "vector_objective",
]

#: Up to this many classes the L-BFGS of :func:`fit_affine` is preconditioned by the
#: per-class Hessian blocks ((K+1)^2 each: 8 MB at K = 100); above, by their diagonals.
BLOCK_PRECONDITIONER_MAX_K = 128
#: Up to this many classes :func:`fit_vector_scaling` solves each Newton step with the dense
#: ``2K x 2K`` Hessian (an ``[N, 2K]`` Gram matrix, ``O(N K^2)``, formed by row blocks of
#: ``2^22`` elements, :mod:`.newton`); above, by conjugate gradients on Hessian-vector products
#: (``O(N K)`` each, but many on ill-conditioned problems).
VECTOR_DENSE_MAX_K = 2048
#: Default ``reg_lambda`` and ``reg_mu`` of ``matrix-scaling`` and ``dirichlet`` (our choice:
#: the references default to no regularisation, under which these K^2 + K parameter maps
#: overfit, or diverge on separable data). Chosen on outputs that no committed leaderboard
#: reports (the WideResNet-16-4 records of ``../shared/data``; ``leaderboards/beyond`` reports
#: the DenseNet-BC-100 ones): Dirichlet fitted on 2,000 or 5,000 seeded rows, held-out NLL of
#: the last 5,000, lambda = mu in 1e1 .. 1e5 (matrix scaling gives the same NLL to 4 digits):
#:   CIFAR-100, 5,000 rows: 1.087 / 0.9185 / 0.9246 / 0.9348 / 0.9400 (uncalibrated 0.9576)
#:   CIFAR-100, 2,000 rows: 1.458 / 1.0722 / 1.0096 / 1.0012 / 1.0112
#:   CIFAR-10,  5,000 rows: 0.2273 / 0.2284 / 0.2365 / 0.2439 / 0.2453 (uncalibrated 0.3571)
#:   CIFAR-10,  2,000 rows: 0.2439 / 0.2377 / 0.2442 / 0.2528 / 0.2546
#: 1e3 has the lowest mean over the four (0.604; 1e2: 0.614, 1e4: 0.608). (The previous
#: default, 1e4, had been chosen on the DenseNet outputs the beyond leaderboard reports.) With
#: K = 100 and a few thousand rows no value beats temperature scaling reliably: experiments
#: that want the best value for their data tune it (``tuning:``).
DEFAULT_REG = 1e3
#: Examples whose weight ``p_nk (1 - p_nk)`` is below this do not enter the preconditioner
#: block of class k (measured on CIFAR-100, N = 5,000: 69,049 of 500,000 pairs, the same
#: number of L-BFGS iterations as with all pairs, in a seventh of the time).
_PRECONDITIONER_MIN_WEIGHT = 1e-3
#: Each Newton step of :func:`_newton_polish` solves to this residual (relative to the
#: gradient): two steps take the gradient from ~1e-8 to ~1e-13 on CIFAR-100 (38 Hessian
#: products; 1e-4 took 126 products for the same result).
_CG_RTOL = 1e-2


# ----------------------------------------------------------------------------- objectives
def _design(logits: np.ndarray, log_softmax: bool) -> torch.Tensor:
    """The float64 input of the affine map: the logits, or their log-softmax (Dirichlet)."""
    x = torch.from_numpy(np.array(logits, dtype=np.float64))
    return torch.log_softmax(x, dim=1) if log_softmax else x


def _labels(labels: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(labels, dtype=np.int64)).view(-1, 1)


def _nll_and_residual(a: torch.Tensor, y: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Mean NLL of ``softmax(a)`` at the labels ``y [N, 1]`` and ``(softmax(a) - onehot)
    / N``; ``a`` is overwritten."""
    n = a.shape[0]
    lse = torch.logsumexp(a, dim=1, keepdim=True)
    nll = float(lse.sum() - a.gather(1, y).sum()) / n
    r = a.sub_(lse).exp_()
    r.scatter_add_(1, y, torch.full(y.shape, -1.0, dtype=r.dtype))
    return nll, r.div_(n)


def _odir_weights(k: int, reg_lambda: float, reg_mu: float) -> torch.Tensor:
    """``R [K, K+1]``: the ODIR penalty is ``1/2 sum R * [W | b]^2`` (``2 reg_lambda /
    (K (K-1))`` off the diagonal, 0 on it, ``2 reg_mu / K`` on the intercepts)."""
    r = torch.full((k, k + 1), 2.0 * reg_lambda / (k * (k - 1)), dtype=torch.float64)
    r[:, k] = 2.0 * reg_mu / k
    r.diagonal().zero_()
    return r


def affine_objective(features: np.ndarray, labels: np.ndarray, weight: np.ndarray,
                     bias: np.ndarray, reg_lambda: float = 0.0, reg_mu: float = 0.0,
                     log_softmax: bool = False) -> tuple[float, np.ndarray, np.ndarray]:
    """``(objective, d/dW, d/db)`` in float64 of ``softmax(W x + b)`` with ODIR: the mean
    NLL plus ``reg_lambda / (K (K-1)) sum_{i != j} W_ij^2 + reg_mu / K sum_j b_j^2``;
    ``x`` are ``features`` (matrix scaling) or their log-softmax (``log_softmax=True``,
    Dirichlet calibration)."""
    x = _design(features, log_softmax)
    k = x.shape[1]
    wt = torch.cat([torch.as_tensor(np.asarray(weight, dtype=np.float64)),
                    torch.as_tensor(np.asarray(bias, dtype=np.float64)).view(k, 1)], dim=1)
    x1 = torch.cat([x, torch.ones((x.shape[0], 1), dtype=torch.float64)], dim=1)
    with one_torch_thread():
        f, g = _affine_pass(x1, _labels(labels), wt, _odir_weights(k, reg_lambda, reg_mu))
    g = g.numpy()
    return f, g[:, :k].copy(), g[:, k].copy()


def _affine_pass(x1: torch.Tensor, y: torch.Tensor, wt: torch.Tensor,
                 r: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Objective and gradient in ``[W | b]`` (``x1 = [x | 1]``, ``r`` from
    :func:`_odir_weights`): two ``[N, K+1] x [K+1, K]`` products and one pass of exponentials."""
    nll, res = _nll_and_residual(x1 @ wt.T, y)
    rw = r * wt
    return nll + 0.5 * float((rw * wt).sum()), torch.addmm(rw, res.T, x1)


def vector_objective(logits: np.ndarray, labels: np.ndarray, weight: np.ndarray,
                     bias: np.ndarray | None, reg_mu: float = 0.0
                     ) -> tuple[float, np.ndarray, np.ndarray | None]:
    """``(objective, d/dw, d/db)`` in float64 of ``softmax(w * z + b)``: the mean NLL plus
    ``reg_mu / K sum_j b_j^2`` (``bias=None``: no intercept)."""
    z = _design(logits, False)
    k = z.shape[1]
    w = torch.as_tensor(np.asarray(weight, dtype=np.float64))
    b = None if bias is None else torch.as_tensor(np.asarray(bias, dtype=np.float64))
    with one_torch_thread():
        a = z * w if b is None else z * w + b
        nll, res = _nll_and_residual(a, _labels(labels))
        gw = (res * z).sum(0)
        if b is None:
            return nll, gw.numpy(), None
        f = nll + reg_mu / k * float((b * b).sum())
        return f, gw.numpy(), (res.sum(0) + 2.0 * reg_mu / k * b).numpy()


# ----------------------------------------------------------------------- vector scaling
def fit_vector_scaling(logits: np.ndarray, labels: np.ndarray, *, intercept: bool = True,
                       reg_mu: float = 0.0, max_iter: int = 100
                       ) -> tuple[np.ndarray, np.ndarray]:
    """``(w, b)`` minimising the mean NLL of ``softmax(w * z + b)`` plus ``reg_mu / K
    sum_j b_j^2`` (``intercept=False``: ``b = 0``), float64.

    Damped Newton iterations from temperature scaling ``w = 1/T``, until the Newton
    decrement or the largest gradient component is at rounding level or a step no longer
    decreases the objective. Up to :data:`VECTOR_DENSE_MAX_K` classes each step solves with
    the exact ``2K x 2K`` Hessian (one ``[N, 2K]`` Gram matrix: CIFAR-100, N = 5,000,
    0.2 s in all; at K = 1,000 a step costs ~1 s per 5,000 rows); above, by truncated
    conjugate gradients on exact Hessian-vector products (``O(NK)`` each), preconditioned by
    the Hessian's diagonal (:func:`~.newton.vector_direction`). The softmax's invariance
    ``b -> b + c`` is removed by the term ``(sum_j b_j)^2 / (2K)``, which is zero at the
    returned optimum (its intercepts sum to zero; with ``reg_mu > 0`` the optimum has that
    property anyway).
    """
    z = _design(logits, False)
    y = _labels(labels)
    k = z.shape[1]
    gauge = 1.0 / k
    reg = 2.0 * reg_mu / k
    dense = k <= VECTOR_DENSE_MAX_K
    with one_torch_thread():
        t = fit_temperature(np.asarray(logits), np.asarray(labels))
        w = torch.full((k,), 1.0 / t, dtype=torch.float64)
        b = torch.zeros(k, dtype=torch.float64)

        def evaluate(w, b):
            return _vector_pass(z, y, w, b, reg, gauge, intercept)

        f, g, p = evaluate(w, b)
        for _ in range(max_iter):
            gmax = float(g.abs().max())
            if not gmax > 1e-15:
                break
            d = vector_direction(z, p, g, reg=reg, gauge=gauge, intercept=intercept,
                                 dense=dense)
            dec = float(g @ d)
            if not dec > 1e-28:
                break
            step = 1.0
            while step > 1e-10:
                w_new = w - d[:k] * step
                b_new = b - d[k:] * step if intercept else b
                f_new, g_new, p_new = evaluate(w_new, b_new)
                if f_new <= f - 1e-4 * step * dec or (
                        f_new <= f + 1e-13 * abs(f) and float(g_new.abs().max()) < gmax):
                    break
                step *= 0.5
            else:
                break
            w, b, f, g, p = w_new, b_new, f_new, g_new, p_new
            if dec < 1e-24:  # quadratic convergence: the step taken was at rounding level
                break
    if intercept:
        b = b - b.mean()
    return w.numpy().copy(), b.numpy().copy()


def _vector_pass(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                 reg: float, gauge: float, intercept: bool
                 ) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Objective, gradient and softmax probabilities / N at ``(w, b)`` of
    :func:`fit_vector_scaling` (``reg = 2 reg_mu / K``, ``gauge = 1 / K``)."""
    n = z.shape[0]
    nll, res = _nll_and_residual(z * w + b, y)  # res = (p - onehot) / N
    f = nll + 0.5 * reg * float((b * b).sum()) + 0.5 * gauge * float(b.sum()) ** 2
    gw = (res * z).sum(0)
    g = torch.cat([gw, res.sum(0) + reg * b + gauge * b.sum()]) if intercept else gw
    return f, g, res.scatter_add_(1, y, torch.full(y.shape, 1.0 / n, dtype=res.dtype))


# ----------------------------------------------------------------- matrix scaling, ODIR
def fit_affine(features: np.ndarray, labels: np.ndarray, *, reg_lambda: float = 0.0,
               reg_mu: float = 0.0, log_softmax: bool = False, max_iter: int = 10000,
               start_temperature: float | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(W, b, info)`` minimising the mean NLL of ``softmax(W x + b)`` plus ODIR
    (:func:`affine_objective`), float64; ``x`` the logits (matrix scaling) or their
    log-softmax (``log_softmax=True``, Dirichlet calibration).

    L-BFGS-B (20 corrections, no gradient tolerance, ``ftol = 0``: it runs until a line
    search can no longer decrease the objective, which in float64 leaves the gradient at
    ~1e-8), then Newton steps by preconditioned conjugate gradients
    (:func:`_newton_polish`) to a gradient at rounding level. Both work in preconditioned
    coordinates: the row ``[W | b]_k`` of class k is ``v_k L_k^{-1}`` with ``L_k L_k^T`` the
    Hessian block of that row at the start (``sum_n p_nk (1 - p_nk) x_n x_n^T / N`` over the examples with weight
    >= 1e-3, plus the ODIR weights and a 1e-6 relative ridge); only its diagonal for
    K > :data:`BLOCK_PRECONDITIONER_MAX_K`. The start is temperature scaling, ``W = I/T``,
    ``b = 0`` (``T`` from :func:`~.temperature.fit_temperature`, or ``start_temperature``).
    The optimum is then moved along the softmax's invariance (``[W | b] -> [W | b] + 1 v^T``,
    which changes no probability) to the representative with zero off-diagonal column sums
    and intercepts summing to zero (a no-op for ``reg_lambda, reg_mu > 0``, whose optimum
    has them). ``info``: objective, largest gradient component, L-BFGS iterations and
    evaluations, Newton steps and Hessian-vector products.

    Measured on CIFAR-100 (K = 100, DenseNet-BC-100 / WRN-16-4 outputs, lambda = mu = 1e4,
    one thread, 2 busy cores): N = 5,000, 1.2-1.8 s (48-77 evaluations and 28-40 Hessian
    products, final gradient <= 1.4e-13); N = 10,000, 2.0-3.1 s. Without the block
    preconditioner, 300 evaluations left the gradient at 2e-3.
    """
    x = _design(features, log_softmax)
    y = _labels(labels)
    n, k = x.shape
    x1 = torch.cat([x, torch.ones((n, 1), dtype=torch.float64)], dim=1)
    r = _odir_weights(k, reg_lambda, reg_mu)
    with one_torch_thread():
        t = start_temperature
        if t is None:
            t = fit_temperature(np.asarray(features), np.asarray(labels))
        w0 = torch.zeros((k, k + 1), dtype=torch.float64)
        w0[:, :k].diagonal().fill_(1.0 / t)
        to_w, to_v, grad_v = _preconditioner(x1, w0, r)
        wt, result, evals = _lbfgs(x1, y, r, w0, (to_w, to_v, grad_v), max_iter)
        wt, polish = _newton_polish(x1, y, wt, r, lambda g: to_w(grad_v(g)))
        wt = _canonical(wt)
        f, g = _affine_pass(x1, y, wt, r)
    info = {"objective": f, "grad_max": float(g.abs().max()), "iterations": int(result.nit),
            "evaluations": evals, "newton_steps": polish[0], "hessian_products": polish[1],
            "message": str(result.message)}
    wt = wt.numpy()
    return wt[:, :k].copy(), wt[:, k].copy(), info


def _lbfgs(x1: torch.Tensor, y: torch.Tensor, r: torch.Tensor, w0: torch.Tensor,
           preconditioner, max_iter: int) -> tuple[torch.Tensor, Any, int]:
    """L-BFGS-B of :func:`fit_affine` from ``w0`` in the coordinates of ``preconditioner``
    (``(to_w, to_v, grad_v)`` of :func:`_preconditioner`): the parameters ``[W | b]`` it
    ends at, scipy's result and the number of evaluations."""
    to_w, to_v, grad_v = preconditioner
    k = w0.shape[0]
    evals = [0]

    def fun(theta: np.ndarray):
        evals[0] += 1
        wt = to_w(torch.from_numpy(theta).view(k, k + 1))
        f, g = _affine_pass(x1, y, wt, r)
        return f, grad_v(g).reshape(-1).numpy()

    # L-BFGS-B's own BLAS on one thread: on 2 busy cores, its threads made each of its
    # iterations (n = 10,100, 20 corrections) take 45 ms instead of under 1 ms
    with threadpool_limits(limits=1):
        result = scipy.optimize.minimize(
            fun, to_v(w0).reshape(-1).numpy(), jac=True, method="L-BFGS-B",
            options={"maxiter": max_iter, "maxfun": 2 * max_iter, "ftol": 0.0,
                     "gtol": 0.0, "maxcor": 20})
    return to_w(torch.from_numpy(result.x).view(k, k + 1)), result, evals[0]


def _newton_polish(x1: torch.Tensor, y: torch.Tensor, wt: torch.Tensor, r: torch.Tensor,
                   precondition, max_steps: int = 2) -> tuple[torch.Tensor, tuple[int, int]]:
    """Newton steps from the L-BFGS result ``wt`` (whose objective float64 no longer
    resolves: its gradient is left at ~1e-8): each solves ``H d = g`` by conjugate
    gradients preconditioned as the L-BFGS (exact Hessian-vector products, two
    ``[N, K+1] x [K+1, K]`` products each, to a residual 1e-2 of ``g``) and is kept when the
    largest gradient component at least halves. Returns the parameters and (Newton steps
    kept, Hessian-vector products)."""
    f, g = _affine_pass(x1, y, wt, r)
    gmax = float(g.abs().max())
    kept = products = 0
    for _ in range(max_steps):
        if not gmax > 0:
            break
        probs = torch.softmax(x1 @ wt.T, dim=1)
        step = torch.zeros_like(wt)
        res = g.clone()
        z = precondition(res)
        direction = z
        rz = float((res * z).sum())
        for _ in range(200):
            hd = _hessian_product(x1, probs, r, direction)
            products += 1
            curv = float((direction * hd).sum())
            if not curv > 0:
                break
            alpha = rz / curv
            step += alpha * direction
            res -= alpha * hd
            if float(res.abs().max()) <= _CG_RTOL * gmax:
                break
            z = precondition(res)
            rz, rz_old = float((res * z).sum()), rz
            direction = z + (rz / rz_old) * direction
        candidate = wt - step
        f_new, g_new = _affine_pass(x1, y, candidate, r)
        gmax_new = float(g_new.abs().max())
        if not (gmax_new <= 0.5 * gmax and f_new <= f + 1e-12 * max(abs(f), 1.0)):
            break
        wt, f, g, gmax = candidate, f_new, g_new, gmax_new
        kept += 1
    return wt, (kept, products)


def _hessian_product(x1: torch.Tensor, probs: torch.Tensor, r: torch.Tensor,
                     d: torch.Tensor) -> torch.Tensor:
    """The objective's Hessian at the softmax probabilities ``probs [N, K]`` times the
    direction ``d [K, K+1]``: with ``e = [x | 1] d^T``, ``sum_n (p_n * (e_n - p_n . e_n))
    [x_n | 1]^T / N + R * d``."""
    e = x1 @ d.T
    e -= (probs * e).sum(dim=1, keepdim=True)
    return torch.addmm(r * d, (probs * e).T, x1, alpha=1.0 / x1.shape[0])


def _canonical(wt: torch.Tensor) -> torch.Tensor:
    """``[W | b] - 1 v^T`` with zero off-diagonal column sums of W and ``sum_j b_j = 0``
    (every class's logit moves by the same ``v . [x | 1]``: no probability changes)."""
    k = wt.shape[0]
    off = wt.sum(0)
    off[:k] -= wt[:, :k].diagonal()
    v = off / (k - 1)
    v[k] = off[k] / k
    return wt - v


def _preconditioner(x1: torch.Tensor, w0: torch.Tensor, r: torch.Tensor):
    """``(to_w, to_v, grad_v)`` of the coordinates ``v_k = [W | b]_k L_k`` (rows), where
    ``L_k L_k^T`` is class k's Hessian block at ``w0`` (see :func:`fit_affine`)."""
    n, m = x1.shape
    k = w0.shape[0]
    a = x1 @ w0.T
    p = torch.softmax(a, dim=1)
    wgt = p.mul_(1.0 - p)  # [N, K]: p_nk (1 - p_nk)
    if k > BLOCK_PRECONDITIONER_MAX_K:
        diag = (wgt.T @ x1.square()) / n + r  # [K, K+1]
        diag += 1e-6 * diag.mean(dim=1, keepdim=True) + 1e-300
        s = diag.sqrt()
        return (lambda v: v / s), (lambda w: w * s), (lambda g: g / s)
    blocks = torch.empty((k, m, m), dtype=torch.float64)
    for c in range(k):
        sel = torch.nonzero(wgt[:, c] >= _PRECONDITIONER_MIN_WEIGHT).view(-1)
        xs = x1.index_select(0, sel)
        torch.mm((xs * wgt.index_select(0, sel)[:, c:c + 1]).T, xs, out=blocks[c])
    blocks /= n
    blocks.diagonal(dim1=1, dim2=2).add_(r)
    ridge = 1e-6 * blocks.diagonal(dim1=1, dim2=2).mean(dim=1)
    ridge = torch.where(ridge > 0, ridge, torch.full_like(ridge, 1e-6 * float(x1.square().mean())))
    blocks.diagonal(dim1=1, dim2=2).add_(ridge.view(-1, 1))
    lower = torch.linalg.cholesky(blocks)  # blocks[c] = L L^T
    upper = lower.transpose(1, 2)

    def to_w(v: torch.Tensor) -> torch.Tensor:  # w_k^T = L_k^{-T} v_k^T
        return torch.linalg.solve_triangular(upper, v.unsqueeze(2), upper=True).squeeze(2)

    def to_v(w: torch.Tensor) -> torch.Tensor:
        return (upper @ w.unsqueeze(2)).squeeze(2)

    def grad_v(g: torch.Tensor) -> torch.Tensor:  # d/dv_k = L_k^{-1} g_k
        return torch.linalg.solve_triangular(lower, g.unsqueeze(2), upper=False).squeeze(2)

    return to_w, to_v, grad_v


# ------------------------------------------------------------------------- torch modules
class VectorScalingModule(torch.nn.Module):
    """``forward(logits, features) -> (max p', log p')`` with ``p' = softmax(w * z + b)``.

    A :class:`~selbench.contract.api.PredictingModule`: :meth:`predict` is ``argmax p'`` (the first
    maximal class), which may differ from ``argmax(logits)``; the confidence is its
    probability. Parameters ``weight [K]``, ``bias [K]`` (float32; without an intercept,
    ``bias`` is a zero buffer).
    """

    changes_prediction = True
    uses_features = False

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(np.asarray(weight), dtype=torch.float32))
        if bias is None:  # no intercept: a zero buffer, which training leaves alone
            self.register_buffer("bias", torch.zeros(self.weight.shape[0]))
        else:
            self.bias = torch.nn.Parameter(torch.tensor(np.asarray(bias), dtype=torch.float32))

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits.to(self.weight.dtype) * self.weight + self.bias, dim=-1)

    def forward(self, logits: torch.Tensor, features: torch.Tensor | None = None):
        log_probs = self.log_probs(logits)
        return log_probs.max(dim=-1).values.exp(), log_probs

    def predict(self, logits: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """The calibrated prediction ``argmax p'``, int64 ``[B]``."""
        return self.log_probs(logits).argmax(dim=-1)


class AffineScalingModule(VectorScalingModule):
    """``forward(logits, features) -> (max p', log p')`` with ``p' = softmax(W x + b)``,
    ``x`` the logits (matrix scaling) or ``log_softmax(logits)`` (Dirichlet calibration,
    ``dirichlet=True``).

    A :class:`~selbench.contract.api.PredictingModule` as :class:`VectorScalingModule`. Parameters
    ``weight [K, K]``, ``bias [K]`` (float32).
    """

    def __init__(self, weight: np.ndarray, bias: np.ndarray, dirichlet: bool):
        super().__init__(weight, bias)
        self.dirichlet = bool(dirichlet)

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        x = logits.to(self.weight.dtype)
        if self.dirichlet:
            x = torch.log_softmax(x, dim=-1)
        return torch.log_softmax(torch.nn.functional.linear(x, self.weight, self.bias), dim=-1)


# ------------------------------------------------------------------------- recalibrators
RegMu = Annotated[float, Field(
    ge=0, allow_inf_nan=False,
    description="intercept regularisation mu: adds mu / K * sum_j b_j^2 to the mean NLL "
    "(ODIR normalisation of Kull et al. 2019)")]
RegLambda = Annotated[float, Field(
    ge=0, allow_inf_nan=False,
    description="off-diagonal regularisation lambda: adds lambda / (K (K-1)) * "
    "sum_{i != j} W_ij^2 to the mean NLL (ODIR, Kull et al. 2019); 0 with reg_mu 0: "
    "unregularised, as the references default (the default 1e3 is our choice, by held-out "
    "NLL on CIFAR outputs no leaderboard reports)")]


class _AffineBase(FittedModuleRecalibrator):
    """Shared checks and prediction of the three affine recalibrators (``fit_many``, and
    ``confidence`` — the calibrated probability of the calibrated prediction, computed by the
    live module — come from :class:`FittedModuleRecalibrator`)."""

    _name: ClassVar[str] = ""

    def _who(self) -> str:
        return f"recalibrator {self._name!r}"

    def _check(self, outputs: ModelOutputs) -> None:
        super()._check(outputs)
        if outputs.num_classes != self.num_classes_:
            raise ValueError(
                f"logits: {self._who()} was fitted on K={self.num_classes_} classes, got "
                f"K={outputs.num_classes}")

    def predict(self, outputs: ModelOutputs) -> np.ndarray:
        """The calibrated prediction ``argmax p'`` (may differ from ``argmax(logits)``),
        computed by the live module."""
        self._check(outputs)
        module = self.module_
        was_training = module.training
        module.eval()
        device = device_of(module)
        parts = []
        try:
            with torch.no_grad():
                for start in range(0, len(outputs), EVAL_CHUNK):
                    chunk = torch.tensor(outputs.logits[start:start + EVAL_CHUNK]).to(device)
                    parts.append(module.predict(chunk).cpu().numpy())
        finally:
            module.train(was_training)
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def module(self, outputs: ModelOutputs, context: FitContext) -> torch.nn.Module:
        self._check(outputs)
        return self.module_

    @property
    def weight_(self) -> np.ndarray:
        """The current weights (float64 copy of the live module's, which a joint scheme
        trains in place)."""
        self._check_fitted()
        return self.module_.weight.detach().cpu().double().numpy()

    @property
    def bias_(self) -> np.ndarray:
        """The current intercepts (float64 copy of the live module's)."""
        self._check_fitted()
        return self.module_.bias.detach().cpu().double().numpy()

    def _check_fitted(self) -> None:
        if getattr(self, "module_", None) is None:
            raise NotFittedError(f"{self._who()} is not fitted; call fit first")


class _VectorParams(Params):
    """``reg_mu`` needs an intercept."""

    @model_validator(mode="after")
    def _intercept(self):
        if not self.intercept and self.reg_mu > 0:
            raise ValueError("reg_mu regularises the intercept: it needs intercept: true")
        return self


class VectorScaling(_AffineBase):
    """Vector scaling (Guo et al., ICML 2017): softmax(w * z + b), a weight and an intercept per class, at the exact NLL optimum.

    ``fit`` minimises the mean NLL of the labels under ``softmax(w * z + b)`` over ``w`` and
    ``b`` (``2K`` parameters; ``intercept: false`` fixes ``b = 0``, torch-uncertainty's
    ``VectorScaler``), plus ``reg_mu / K * sum_j b_j^2``, by Newton iterations to the
    optimum (:func:`fit_vector_scaling`). The calibrated prediction ``argmax p'`` may
    differ from ``argmax(logits)``; the confidence is its probability. The fitted float64
    parameters are kept in ``weight_fit_`` / ``bias_fit_``; ``weight_`` / ``bias_`` read
    the live (float32) module, which a joint scheme trains in place.
    """

    reference: ClassVar[str] = "Guo et al., On Calibration of Modern Neural Networks, ICML 2017"
    _name: ClassVar[str] = "vector-scaling"
    params_base = _VectorParams

    def __init__(
        self,
        intercept: Annotated[bool, Field(
            description="fit an intercept b per class (false: softmax(w * z))")] = True,
        reg_mu: RegMu = 0.0,
    ) -> None:
        self.intercept = intercept
        self.reg_mu = reg_mu

    def fit(self, outputs: ModelOutputs, context: FitContext) -> VectorScaling:
        check_outputs(outputs, self._who(), min_rows=1)
        w, b = fit_vector_scaling(outputs.logits, outputs.labels, intercept=self.intercept,
                                  reg_mu=self.reg_mu)
        self.num_classes_ = outputs.num_classes
        self.weight_fit_, self.bias_fit_ = w, b
        self.module_ = VectorScalingModule(w, b if self.intercept else None)
        return self


class MatrixScaling(_AffineBase):
    """Matrix scaling (Guo et al., ICML 2017) with ODIR (Kull et al., NeurIPS 2019): softmax(W z + b), at the optimum of the regularised NLL.

    ``fit`` minimises the mean NLL of the labels under ``softmax(W z + b)`` (``K^2 + K``
    parameters) plus ``reg_lambda / (K (K-1)) sum_{i != j} W_ij^2 + reg_mu / K sum_j
    b_j^2`` (:func:`fit_affine`), by default with ``reg_lambda = reg_mu = 1e3``
    (:data:`DEFAULT_REG`, our choice). ``reg_lambda = reg_mu = 0`` is Guo et al.'s unregularised
    matrix scaling (torch-uncertainty's ``MatrixScaler``, probmetrics'
    ``MatrixScalingCalibrator``); with K^2 + K parameters it can overfit badly, and when the
    fitting data are separable (CIFAR-100 with 5,000 examples is) its optimum lies at
    infinity (NLL -> 0). The calibrated prediction ``argmax p'`` may differ from
    ``argmax(logits)``; the confidence is its probability. The fitted float64 parameters
    are kept in ``weight_fit_`` / ``bias_fit_`` (and ``fit_info_``); ``weight_`` /
    ``bias_`` read the live (float32) module, which a joint scheme trains in place.
    """

    reference: ClassVar[str] = (
        "Guo et al., On Calibration of Modern Neural Networks, ICML 2017; ODIR: Kull et al., "
        "Beyond temperature scaling: Obtaining well-calibrated multiclass probabilities with "
        "Dirichlet calibration, NeurIPS 2019")
    _name: ClassVar[str] = "matrix-scaling"
    dirichlet: ClassVar[bool] = False

    def __init__(self, reg_lambda: Annotated[RegLambda, Tune.log_uniform(1.0, 1e5)] = DEFAULT_REG,
                 reg_mu: Annotated[RegMu, Tune.log_uniform(1.0, 1e5)] = DEFAULT_REG) -> None:
        self.reg_lambda = reg_lambda
        self.reg_mu = reg_mu

    def fit(self, outputs: ModelOutputs, context: FitContext):
        check_outputs(outputs, self._who(), min_rows=1)
        w, b, info = fit_affine(outputs.logits, outputs.labels, reg_lambda=self.reg_lambda,
                                reg_mu=self.reg_mu, log_softmax=self.dirichlet)
        self.num_classes_ = outputs.num_classes
        self.weight_fit_, self.bias_fit_, self.fit_info_ = w, b, info
        self.module_ = AffineScalingModule(w, b, dirichlet=self.dirichlet)
        return self


class DirichletCalibration(MatrixScaling):
    """Dirichlet calibration (Kull et al., NeurIPS 2019): softmax(W log p + b) with ODIR, at the optimum of the regularised NLL.

    As ``matrix-scaling`` on the log-probabilities ``log p = log_softmax(z)`` instead of
    the logits: ``fit`` minimises the mean NLL of ``softmax(W log p + b)`` plus ODIR,
    ``reg_lambda / (K (K-1)) sum_{i != j} W_ij^2 + reg_mu / K sum_j b_j^2`` (Kull et al.'s
    Sec. 3.2; torch-uncertainty's ``DirichletScaler`` with ``lambda_reg``, ``mu_reg``;
    ``dirichletcal``'s ``FullDirichletCalibrator(reg_norm=True)`` up to its reference-row
    parametrisation); by default ``reg_lambda = reg_mu = 1e3`` (:data:`DEFAULT_REG`).
    ``reg_lambda = reg_mu = 0`` is unregularised Dirichlet calibration (``dirichletcal``'s
    default), which overfits like unregularised matrix scaling.
    """

    reference: ClassVar[str] = (
        "Kull et al., Beyond temperature scaling: Obtaining well-calibrated multiclass "
        "probabilities with Dirichlet calibration, NeurIPS 2019")
    _name: ClassVar[str] = "dirichlet"
    dirichlet: ClassVar[bool] = True
