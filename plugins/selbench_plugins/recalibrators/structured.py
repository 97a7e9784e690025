"""``sms``, ``svs``: structured matrix / vector scaling (Berta, Holzmüller, Jordan & Bach,
AISTATS 2026), defined, regularised and fitted to the optimum of the objective of probmetrics
1.3's ``SMSCalibrator`` / ``SVSCalibrator`` (their defaults: ridge penalty, ``opt="bfgs"``).

Both first temperature-scale the logits and mix the result with the uniform distribution,
as probmetrics' ``"ts-mix"`` calibrator does: with ``a`` the inverse temperature minimising
the NLL of ``softmax(a log p)`` (``p = softmax(z)``; ``a`` searched in ``[e^-16, e^16]``, as
probmetrics' bisection), ``N`` the number of fitting rows and ``eps = 1 / (N + 1)``,

    ``x = log((1 - eps) softmax(a z) + eps / K)``,

and then map ``x`` to calibrated probabilities:

====  =====================================================  ===============================
sms   ``softmax((I + D + M) x + b)``, ``D`` diagonal, ``M``  ``W = I + D + M`` in R^{KxK},
      zero on the diagonal                                   ``b`` in R^K (K^2 + K)
svs   ``softmax((1 + v) * x + b)``                           ``v``, ``b`` in R^K (2K)
====  =====================================================  ===============================

fitted to the minimum of the mean NLL plus the ridge penalty ``r_b |b|^2 + r_d |diag(D)|^2
(+ r_o |M|^2)`` with ``r_b = lambda_intercept K^rho / N^tau``, ``r_d = lambda_diagonal
K^rho / N^tau`` and ``r_o = lambda_off_diagonal (K (K-1))^rho / N^tau`` (all lambdas, rho
and tau 1 by default, as in probmetrics). The penalty pulls the map towards the identity
(temperature scaling); the off-diagonal part, ``K - 1`` times stronger, keeps the K^2
parameters of SMS from overfitting. probmetrics' SAGA solver and its lasso / MCP /
group-lasso penalties are not implemented.

The objective is strictly convex; it is minimised in float64 by L-BFGS (scipy's L-BFGS-B, 20
corrections, on one thread) from the identity, in coordinates whitened per class by an
approximation of that class's Hessian block (a weighted Gram matrix of ``[x | 1]`` plus the
penalty: ``(K+1) x (K+1)`` for SMS up to 128 classes, its diagonal above; ``2 x 2`` for SVS),
to a largest gradient component of ~1e-9. probmetrics fits in float32 with torchmin's BFGS
(L-BFGS above 1,000 parameters) and stops at its default tolerances; on the CIFAR outputs in
``../shared/data`` (seeded halves) its SMS objective ends ~2e-5 above this optimum and its
probabilities differ from ours by at most 1.1e-3 (CIFAR-100) / 3.2e-3 (CIFAR-10), 1.6e-6 /
3.1e-5 on average; its SVS by at most 6.7e-5 / 2.7e-4 (tests/test_recalibrators_calarena.py
states the tolerances).

The calibrated prediction is ``argmax`` of the calibrated probabilities (probmetrics'
``predict``), which may differ from ``argmax(logits)``; the confidence is its probability.
Both are differentiable: the joint scheme trains ``W`` (``w = 1 + v``) and ``b`` of the
module (the inverse temperature and the mixture stay as fitted; the training loss replaces
the ridge penalty).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any, ClassVar

import numpy as np
import scipy.optimize
import torch
from pydantic import Field
from selbench.contract.api import FitContext, Params
from selbench.contract.checks import check_outputs
from selbench.contract.data import ModelOutputs
from threadpoolctl import threadpool_limits

from ._common import one_torch_thread
from .matrix import AffineScalingModule, MatrixScaling, VectorScaling, VectorScalingModule
from .temperature import fit_temperature

__all__ = [
    "StructuredMatrixModule",
    "StructuredMatrixScaling",
    "StructuredVectorModule",
    "StructuredVectorScaling",
    "fit_sms",
    "fit_svs",
    "mixture_log_inputs",
    "structured_penalties",
]

#: probmetrics' bisection searches ``log a`` in ``[-16, 16]``
_LOG_A_BOUND = 16.0
#: Up to this many classes :func:`fit_sms` whitens each row of parameters by its own
#: ``(K+1) x (K+1)`` Cholesky factor (8 MB at K = 100); above, by the diagonals.
BLOCK_PRECONDITIONER_MAX_K = 128
#: L-BFGS-B's stopping tolerance on the largest preconditioned gradient component (with
#: ``ftol = 0``): it stops there or when a line search can no longer decrease the objective
_GTOL = 1e-9


# --------------------------------------------------------------------------- definition
def mixture_log_inputs(logits: torch.Tensor, inv_temperature: torch.Tensor | float,
                       log_keep: torch.Tensor | float,
                       log_floor: torch.Tensor | float) -> torch.Tensor:
    """``x = log((1 - eps) softmax(a z) + eps / K)`` of the logits ``z [..., K]``, with
    ``log_keep = log(1 - eps)`` and ``log_floor = log(eps / K)`` (any float dtype,
    differentiable)."""
    lp = torch.log_softmax(logits * inv_temperature, dim=-1)
    floor = torch.as_tensor(log_floor, dtype=lp.dtype, device=lp.device)
    return torch.logaddexp(lp + log_keep, floor)


def _mixture_constants(n_fit: int, k: int) -> tuple[float, float]:
    """``(log(1 - eps), log(eps / K))`` for ``eps = 1 / (n_fit + 1)``."""
    eps = 1.0 / (n_fit + 1)
    return math.log1p(-eps), math.log(eps / k)


def structured_penalties(k: int, n: int, lambda_intercept: float, lambda_diagonal: float,
                         lambda_off_diagonal: float, rho: float, tau: float
                         ) -> tuple[float, float, float]:
    """``(r_b, r_d, r_o)``: probmetrics' ridge strengths of the intercepts, the diagonal and
    the off-diagonal part for K classes and N fitting rows."""
    scale = float(n) ** tau
    return (lambda_intercept * k ** rho / scale, lambda_diagonal * k ** rho / scale,
            lambda_off_diagonal * float(k * (k - 1)) ** rho / scale)


def _inverse_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """probmetrics' ``ts-mix`` inverse temperature, the NLL optimum of ``softmax(a z)`` in
    ``[e^-16, e^16]``."""
    bound = math.exp(_LOG_A_BOUND)
    return 1.0 / fit_temperature(np.asarray(logits), np.asarray(labels), t_min=1.0 / bound,
                                 t_max=bound)


def _prepare(logits: np.ndarray, labels: np.ndarray) -> tuple[float, torch.Tensor,
                                                              torch.Tensor]:
    """``(a, x, y)``: the inverse temperature, the float64 inputs ``x [N, K]`` of the map and
    the labels ``[N, 1]``."""
    n, k = logits.shape
    a = _inverse_temperature(logits, labels)
    z = torch.from_numpy(np.array(logits, dtype=np.float64))
    x = mixture_log_inputs(z, a, *_mixture_constants(n, k))
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64)).view(-1, 1)
    return a, x, y


def _nll_residual(s: torch.Tensor, y: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Mean NLL of ``softmax(s)`` at ``y [N, 1]`` and ``(softmax(s) - onehot) / N``
    (``s`` is overwritten)."""
    n = s.shape[0]
    lse = torch.logsumexp(s, dim=1, keepdim=True)
    nll = float(lse.sum() - s.gather(1, y).sum()) / n
    r = s.sub_(lse).exp_()
    r.scatter_add_(1, y, torch.full(y.shape, -1.0, dtype=r.dtype))
    return nll, r.div_(n)


# --------------------------------------------------------------------------- the solver
def _minimise(evaluate: Callable[[torch.Tensor], tuple[float, torch.Tensor]],
              shape: tuple[int, ...], to_theta: Callable[[torch.Tensor], torch.Tensor],
              to_v_grad: Callable[[torch.Tensor], torch.Tensor], max_iter: int
              ) -> tuple[torch.Tensor, dict]:
    """L-BFGS-B from ``theta = 0`` in the coordinates ``v`` with ``theta = to_theta(v)``
    (linear); ``to_v_grad`` maps a gradient in ``theta`` to one in ``v``. Returns the
    parameters and what the run did."""
    evals = [0]

    def fun(v_flat: np.ndarray):
        evals[0] += 1
        f, g = evaluate(to_theta(torch.from_numpy(v_flat).view(shape)))
        return f, to_v_grad(g).reshape(-1).numpy()

    # one BLAS thread for L-BFGS-B's own updates (see matrix.py's _lbfgs)
    with threadpool_limits(limits=1):
        res = scipy.optimize.minimize(
            fun, np.zeros(int(np.prod(shape))), jac=True, method="L-BFGS-B",
            options={"maxiter": max_iter, "maxfun": 2 * max_iter, "ftol": 0.0,
                     "gtol": _GTOL, "maxcor": 20})
    theta = to_theta(torch.from_numpy(res.x).view(shape))
    f, g = evaluate(theta)
    info = {"objective": f, "grad_max": float(g.abs().max()), "iterations": int(res.nit),
            "evaluations": evals[0], "message": str(res.message)}
    return theta, info


def _sms_preconditioner(x1: torch.Tensor, x: torch.Tensor, r: torch.Tensor):
    """``(to_theta, to_v_grad)`` whitening row ``k`` of ``theta = [D + M | b]`` by ``G_k =
    [x | 1]^T diag(w) [x | 1] / N + 2 diag(r_k)``, an approximation of that row's Hessian
    block (``w_n`` the mean of ``p_nk (1 - p_nk)`` at the start, shared by the rows):
    ``theta_k = U_k^{-1} v_k`` with ``G_k = U_k^T U_k``. Above
    :data:`BLOCK_PRECONDITIONER_MAX_K` classes, or with more columns than rows, only the
    diagonals of the ``G_k``."""
    n, m = x1.shape
    k = r.shape[0]
    p = torch.softmax(x, dim=1)
    w = (p * (1.0 - p)).mean(dim=1, keepdim=True)
    if m > n or k > BLOCK_PRECONDITIONER_MAX_K:
        d = ((x1.square() * w).sum(0) / n + 2.0 * r).sqrt_()  # [K, K+1]
        return (lambda v: v / d), (lambda g: g / d)
    gram = x1.T @ (x1 * w) / n
    gram.diagonal().add_(1e-10 * float(gram.diagonal().mean()))
    blocks = gram.expand(k, m, m).clone()
    blocks.diagonal(dim1=1, dim2=2).add_(2.0 * r)
    upper = torch.linalg.cholesky(blocks).transpose(1, 2).contiguous()  # G_k = U_k^T U_k

    def to_theta(v: torch.Tensor) -> torch.Tensor:  # theta_k = U_k^{-1} v_k
        return torch.linalg.solve_triangular(upper, v.unsqueeze(2), upper=True).squeeze(2)

    def to_v_grad(g: torch.Tensor) -> torch.Tensor:  # U_k^{-T} g_k
        return torch.linalg.solve_triangular(upper.transpose(1, 2), g.unsqueeze(2),
                                             upper=False).squeeze(2)

    return to_theta, to_v_grad


def fit_sms(logits: np.ndarray, labels: np.ndarray, *, lambda_intercept: float = 1.0,
            lambda_diagonal: float = 1.0, lambda_off_diagonal: float = 1.0, rho: float = 1.0,
            tau: float = 1.0, max_iter: int = 5000) -> dict[str, Any]:
    """Structured matrix scaling, float64: ``{"inv_temperature": a, "weight": W [K, K],
    "bias": b [K], "n_fit": N, "info": ...}`` minimising the mean NLL of ``softmax(W x + b)``
    plus ``r_b |b|^2 + r_d sum_k (W_kk - 1)^2 + r_o sum_{k != j} W_kj^2`` (see the module
    docstring for ``x`` and the ``r``)."""
    n, k = logits.shape
    r_b, r_d, r_o = structured_penalties(k, n, lambda_intercept, lambda_diagonal,
                                         lambda_off_diagonal, rho, tau)
    with one_torch_thread():
        a, x, y = _prepare(logits, labels)
        x1 = torch.cat([x, torch.ones((n, 1), dtype=torch.float64)], dim=1)
        r = torch.full((k, k + 1), r_o, dtype=torch.float64)
        r.diagonal().fill_(r_d)
        r[:, k] = r_b

        def evaluate(theta: torch.Tensor) -> tuple[float, torch.Tensor]:
            nll, res = _nll_residual(torch.addmm(x, x1, theta.T), y)
            rt = r * theta
            return nll + float((rt * theta).sum()), torch.addmm(rt, res.T, x1, alpha=1.0,
                                                                beta=2.0)

        to_theta, to_v_grad = _sms_preconditioner(x1, x, r)
        theta, info = _minimise(evaluate, (k, k + 1), to_theta, to_v_grad, max_iter)
    weight = theta[:, :k].numpy().copy()
    weight[np.diag_indices(k)] += 1.0
    return {"inv_temperature": a, "weight": weight, "bias": theta[:, k].numpy().copy(),
            "n_fit": n, "info": info}


def fit_svs(logits: np.ndarray, labels: np.ndarray, *, lambda_intercept: float = 1.0,
            lambda_diagonal: float = 1.0, rho: float = 1.0, tau: float = 1.0,
            max_iter: int = 5000) -> dict[str, Any]:
    """Structured vector scaling, float64: ``{"inv_temperature": a, "weight": w [K],
    "bias": b [K], "n_fit": N, "info": ...}`` minimising the mean NLL of ``softmax(w * x +
    b)`` plus ``r_b |b|^2 + r_d |w - 1|^2``. Preconditioned by the 2 x 2 blocks ``(v_k,
    b_k)`` of a Gram matrix as :func:`fit_sms`'s."""
    n, k = logits.shape
    r_b, r_d, _ = structured_penalties(k, n, lambda_intercept, lambda_diagonal, 0.0, rho, tau)
    with one_torch_thread():
        a, x, y = _prepare(logits, labels)
        r = torch.tensor([[r_d], [r_b]], dtype=torch.float64)  # rows of theta = [v; b]

        def evaluate(theta: torch.Tensor) -> tuple[float, torch.Tensor]:
            nll, res = _nll_residual(torch.addcmul(theta[1], x, theta[0] + 1.0), y)
            rt = r * theta
            g = torch.stack([(res * x).sum(0), res.sum(0)]) + 2.0 * rt
            return nll + float((rt * theta).sum()), g

        p = torch.softmax(x, dim=1)
        w = p * (1.0 - p) / n
        h11 = (w * x.square()).sum(0) + 2.0 * r_d  # per class: [[h11, h12], [h12, h22]]
        h12 = (w * x).sum(0)
        h22 = w.sum(0) + 2.0 * r_b
        l11 = h11.sqrt()  # Cholesky L = [[l11, 0], [l21, l22]] of each block
        l21 = h12 / l11
        l22 = (h22 - l21.square()).clamp_min(1e-12 * h22).sqrt()

        def to_theta(v: torch.Tensor) -> torch.Tensor:  # theta_k = L_k^{-T} v_k
            t1 = v[1] / l22
            return torch.stack([(v[0] - l21 * t1) / l11, t1])

        def to_v_grad(g: torch.Tensor) -> torch.Tensor:  # L_k^{-1} g_k
            u0 = g[0] / l11
            return torch.stack([u0, (g[1] - l21 * u0) / l22])

        theta, info = _minimise(evaluate, (2, k), to_theta, to_v_grad, max_iter)
    return {"inv_temperature": a, "weight": theta[0].numpy() + 1.0,
            "bias": theta[1].numpy().copy(), "n_fit": n, "info": info}


# --------------------------------------------------------------------------- modules
class _MixtureInputs(torch.nn.Module):
    """The fixed temperature and mixture of the structured maps, as buffers (float32):
    ``inv_temperature``, ``log_keep = log(1 - eps)``, ``log_floor = log(eps / K)``."""

    def _register_inputs(self, inv_temperature: float, n_fit: int, k: int) -> None:
        log_keep, log_floor = _mixture_constants(n_fit, k)
        self.register_buffer("inv_temperature", torch.tensor(float(inv_temperature)))
        self.register_buffer("log_keep", torch.tensor(log_keep))
        self.register_buffer("log_floor", torch.tensor(log_floor))

    def _inputs(self, logits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return mixture_log_inputs(logits.to(dtype), self.inv_temperature, self.log_keep,
                                  self.log_floor)


class StructuredMatrixModule(AffineScalingModule, _MixtureInputs):
    """``forward(logits, features) -> (max p', log p')`` with ``p' = softmax(W x + b)`` and
    ``x`` the tempered, mixed log-probabilities (module docstring). A
    :class:`~selbench.contract.api.PredictingModule`; parameters ``weight [K, K]``, ``bias
    [K]`` (float32), buffers of :class:`_MixtureInputs`."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray, inv_temperature: float,
                 n_fit: int):
        super().__init__(weight, bias, dirichlet=False)
        self._register_inputs(inv_temperature, n_fit, self.weight.shape[0])

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        x = self._inputs(logits, self.weight.dtype)
        return torch.log_softmax(torch.nn.functional.linear(x, self.weight, self.bias), dim=-1)


class StructuredVectorModule(VectorScalingModule, _MixtureInputs):
    """``forward(logits, features) -> (max p', log p')`` with ``p' = softmax(w * x + b)``, as
    :class:`StructuredMatrixModule`; parameters ``weight [K]``, ``bias [K]``."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray, inv_temperature: float,
                 n_fit: int):
        super().__init__(weight, bias)
        self._register_inputs(inv_temperature, n_fit, self.weight.shape[0])

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        x = self._inputs(logits, self.weight.dtype)
        return torch.log_softmax(x * self.weight + self.bias, dim=-1)


# --------------------------------------------------------------------------- recalibrators
def _lambda(what: str, factor: str = "K^rho") -> Any:
    """The annotation of a ridge strength ``lambda_*`` (of ``what``)."""
    return Annotated[float, Field(
        ge=0, allow_inf_nan=False,
        description=f"ridge strength of the {what}: the penalty weight is lambda {factor} / "
                    "N^tau (probmetrics' default 1)")]


_LambdaB = _lambda("intercepts b")
_LambdaD = _lambda("diagonal D (svs: the scales v)")
_LambdaM = _lambda("off-diagonal M", "(K (K-1))^rho")


_Rho = Annotated[float, Field(ge=0, allow_inf_nan=False, description=(
    "exponent of the number of classes in the ridge strengths (K^rho; (K (K-1))^rho off the "
    "diagonal)"))]
_Tau = Annotated[float, Field(ge=0, allow_inf_nan=False, description=(
    "exponent of the number of fitting rows N in the ridge strengths (divided by N^tau)"))]
def _keep_fit(rec: MatrixScaling | VectorScaling, fit: dict, k: int) -> None:
    """Store a :func:`fit_sms` / :func:`fit_svs` result's learned state on ``rec``."""
    rec.num_classes_ = k
    rec.inv_temperature_, rec.n_fit_ = fit["inv_temperature"], fit["n_fit"]
    rec.weight_fit_, rec.bias_fit_, rec.fit_info_ = fit["weight"], fit["bias"], fit["info"]


_REFERENCE = ("Berta, Holzmüller, Jordan & Bach, Structured Matrix Scaling for Multi-Class "
              "Calibration, AISTATS 2026 (probmetrics 1.3)")


class StructuredMatrixScaling(MatrixScaling):
    """Structured matrix scaling, SMS (Berta et al., AISTATS 2026): softmax((I + D + M) x + b) on tempered, mixed log-probabilities, ridge-regularised towards the identity.

    As probmetrics 1.3's ``SMSCalibrator`` (ridge, its defaults): ``x`` is temperature
    scaling mixed with ``1/(N+1)`` of the uniform distribution, and ``fit`` minimises the
    mean NLL plus ``r_b |b|^2 + r_d |diag D|^2 + r_o |M|^2`` (``r`` from the lambdas, ``K``,
    ``N``, ``rho``, ``tau``; see :mod:`.structured`) in float64 to its optimum. The
    calibrated prediction ``argmax p'`` may differ from ``argmax(logits)``; the confidence
    is its probability. Learned state: ``inv_temperature_``, ``n_fit_``, ``weight_fit_``
    (``W``), ``bias_fit_``, ``fit_info_``; ``weight_`` / ``bias_`` read the live module,
    which the joint scheme trains.
    """

    reference: ClassVar[str] = _REFERENCE
    _name: ClassVar[str] = "sms"
    params_base = Params

    def __init__(self, lambda_intercept: _LambdaB = 1.0, lambda_diagonal: _LambdaD = 1.0,
                 lambda_off_diagonal: _LambdaM = 1.0, rho: _Rho = 1.0,
                 tau: _Tau = 1.0) -> None:
        self.lambda_intercept = lambda_intercept
        self.lambda_diagonal = lambda_diagonal
        self.lambda_off_diagonal = lambda_off_diagonal
        self.rho = rho
        self.tau = tau

    def fit(self, outputs: ModelOutputs, context: FitContext) -> StructuredMatrixScaling:
        check_outputs(outputs, self._who(), min_rows=1)
        fit = fit_sms(outputs.logits, outputs.labels, lambda_intercept=self.lambda_intercept,
                      lambda_diagonal=self.lambda_diagonal,
                      lambda_off_diagonal=self.lambda_off_diagonal, rho=self.rho, tau=self.tau)
        _keep_fit(self, fit, outputs.num_classes)
        self.module_ = StructuredMatrixModule(fit["weight"], fit["bias"],
                                              fit["inv_temperature"], fit["n_fit"])
        return self


class StructuredVectorScaling(VectorScaling):
    """Structured vector scaling, SVS (Berta et al., AISTATS 2026): softmax((1 + v) * x + b) on tempered, mixed log-probabilities, ridge-regularised towards the identity.

    As probmetrics 1.3's ``SVSCalibrator`` (ridge, its defaults): ``x`` as for ``sms``, and
    ``fit`` minimises the mean NLL plus ``r_b |b|^2 + r_d |v|^2`` in float64 to its optimum.
    Prediction and confidence as ``sms``. Learned state: ``inv_temperature_``, ``n_fit_``,
    ``weight_fit_`` (``w = 1 + v``), ``bias_fit_``, ``fit_info_``.
    """

    reference: ClassVar[str] = _REFERENCE
    _name: ClassVar[str] = "svs"
    params_base = Params

    def __init__(self, lambda_intercept: _LambdaB = 1.0, lambda_diagonal: _LambdaD = 1.0,
                 rho: _Rho = 1.0, tau: _Tau = 1.0) -> None:
        self.lambda_intercept = lambda_intercept
        self.lambda_diagonal = lambda_diagonal
        self.rho = rho
        self.tau = tau

    def fit(self, outputs: ModelOutputs, context: FitContext) -> StructuredVectorScaling:
        check_outputs(outputs, self._who(), min_rows=1)
        fit = fit_svs(outputs.logits, outputs.labels, lambda_intercept=self.lambda_intercept,
                      lambda_diagonal=self.lambda_diagonal, rho=self.rho, tau=self.tau)
        _keep_fit(self, fit, outputs.num_classes)
        self.module_ = StructuredVectorModule(fit["weight"], fit["bias"],
                                              fit["inv_temperature"], fit["n_fit"])
        return self
