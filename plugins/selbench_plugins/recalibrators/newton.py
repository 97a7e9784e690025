"""The linear solves of the Newton steps of vector scaling's fit
(:func:`~.matrix.fit_vector_scaling`): its exact ``2K x 2K`` Hessian (the Gram matrix of
``[p z | p]``, formed by row blocks) solved by Cholesky with a growing diagonal shift, or,
above :data:`~.matrix.VECTOR_DENSE_MAX_K` classes, truncated conjugate gradients on its exact
Hessian-vector products, preconditioned by its diagonal; all in float64.
"""

from __future__ import annotations

import torch

__all__ = ["conjugate_gradients", "newton_direction", "vector_direction"]

#: Elements per row block of the ``[N, 2K]`` Gram matrix of :func:`vector_direction`'s
#: dense Hessian.
_GRAM_BLOCK = 1 << 22


def vector_direction(z: torch.Tensor, p: torch.Tensor, g: torch.Tensor, *, reg: float,
                     gauge: float, intercept: bool, dense: bool) -> torch.Tensor:
    """The Newton direction ``H^{-1} g`` of vector scaling's objective at the softmax
    probabilities ``p / N`` (``z`` the float64 logits ``[N, K]``, ``reg = 2 reg_mu / K``,
    ``gauge`` the weight of the term ``(sum_j b_j)^2 / 2``): with the dense Hessian when
    ``dense``, else by truncated conjugate gradients."""
    pz = p * z
    if dense:
        return newton_direction(_vector_hessian(z, p, pz, reg, gauge, intercept), g)
    return _truncated_newton(z, p, pz, g, reg, gauge, intercept)


def _vector_hessian(z: torch.Tensor, p: torch.Tensor, pz: torch.Tensor, reg: float,
                    gauge: float, intercept: bool) -> torch.Tensor:
    """The exact Hessian in ``(w, b)`` (``(w)`` without ``intercept``)."""
    n, k = z.shape
    m = 2 * k if intercept else k
    h = torch.zeros((m, m), dtype=torch.float64)
    rows = max(1, _GRAM_BLOCK // m)
    for start in range(0, n, rows):  # the Gram matrix of [p z | p], by row blocks
        q = pz[start:start + rows]
        if intercept:
            q = torch.cat([q, p[start:start + rows]], dim=1)
        h.addmm_(q.T, q, alpha=-n)
    h.diagonal()[:k] += (pz * z).sum(0)
    if intercept:
        h.diagonal()[k:] += p.sum(0) + reg
        cross = pz.sum(0)
        h.diagonal(k)[:] += cross
        h.diagonal(-k)[:] += cross
        h[k:, k:] += gauge
    return h


def _truncated_newton(z: torch.Tensor, p: torch.Tensor, pz: torch.Tensor, g: torch.Tensor,
                      reg: float, gauge: float, intercept: bool) -> torch.Tensor:
    """``H^{-1} g`` by conjugate gradients on exact Hessian-vector products (``O(NK)``
    each), preconditioned by the Hessian's diagonal."""
    n, k = z.shape

    def hess(v):
        e = z * v[:k] + v[k:] if intercept else z * v
        e -= (p * e).sum(dim=1, keepdim=True) * n
        pe = p * e
        hw = (pe * z).sum(0)
        if not intercept:
            return hw
        return torch.cat([hw, pe.sum(0) + reg * v[k:] + gauge * v[k:].sum()])

    diag = (pz * z).sum(0) - (pz * pz).sum(0) * n
    if intercept:
        diag = torch.cat([diag, p.sum(0) - (p * p).sum(0) * n + reg + gauge])
    # truncated Newton: a residual min(0.1, sqrt(max|g|)) of g, quadratic at the end
    rtol = min(0.1, float(g.abs().max()) ** 0.5)
    return conjugate_gradients(hess, g, diag.clamp(min=1e-12 * float(diag.max())), rtol)


def conjugate_gradients(hess, g: torch.Tensor, diag: torch.Tensor, rtol: float,
                        max_iter: int = 1000) -> torch.Tensor:
    """``H^{-1} g`` by conjugate gradients on the products ``hess(v) = H v``,
    preconditioned by ``diag`` (H's diagonal), to a residual ``rtol * max|g|``."""
    x = torch.zeros_like(g)
    res = g.clone()
    zres = res / diag
    direction = zres
    rz = float(res @ zres)
    target = rtol * float(g.abs().max())
    for _ in range(max_iter):
        hd = hess(direction)
        curv = float(direction @ hd)
        if not curv > 0:
            break
        alpha = rz / curv
        x += alpha * direction
        res -= alpha * hd
        if float(res.abs().max()) <= target:
            break
        zres = res / diag
        rz, rz_old = float(res @ zres), rz
        direction = zres + (rz / rz_old) * direction
    return x


def newton_direction(h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``h^{-1} g`` by Cholesky, with a growing diagonal shift where ``h`` is not
    numerically positive definite."""
    scale = float(h.diagonal().abs().max()) or 1.0
    shift = 0.0
    eye = torch.eye(h.shape[0], dtype=h.dtype)
    for _ in range(20):
        factor, info = torch.linalg.cholesky_ex(h + shift * eye if shift else h)
        if int(info) == 0:
            return torch.cholesky_solve(g.view(-1, 1), factor).view(-1)
        shift = max(shift * 10.0, 1e-14 * scale)
    return g / scale
