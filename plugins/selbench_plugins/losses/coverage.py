"""Coverage losses λ·L_cov(β): ``quadratic`` (the paper's) and ``log-coverage`` (Fisch et
al., 2022)."""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field
from selbench.api import CoverageLoss


def _with_lam(lams: list[float], body):
    """``fn(g, beta) = body(lam, g, beta)`` with ``lam`` the per-replica weights as a tensor,
    made once per device and dtype (no allocation per step)."""
    made: dict = {}

    def fn(g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        key = (g.device, g.dtype)
        if key not in made:
            made[key] = torch.tensor(lams, dtype=g.dtype, device=g.device)
        return body(made[key], g, beta)

    return fn


class QuadraticCoverage(CoverageLoss):
    """The paper's coverage loss ``λ (β - mean_i ĝ_i)²`` (Section 3.2).

    Targets coverage β exactly (rejecting more or less than 1-β is penalised alike); β is
    the training coverage the scheme passes (``FitContext.beta``).
    """

    def __init__(
        self,
        lam: Annotated[float, Field(
            ge=0, description="weight λ; the paper uses 32 in-distribution (after Geifman & "
            "El-Yaniv 2019) and 8 under distribution shift",
        )] = 32.0,
    ) -> None:
        self.lam = lam

    def __call__(self, g: torch.Tensor, beta: float) -> torch.Tensor:
        return self.lam * (float(beta) - g.mean()) ** 2

    @classmethod
    def batched(cls, losses):
        """The coverage loss of R replicas at once: ``fn(g [R, B], beta [R]) -> [R]``, where
        replica ``r`` has its own λ (``losses[r].lam``) and β; ``None`` if any of
        ``losses`` is not of this class."""
        if any(type(loss) is not cls for loss in losses):
            return None
        lams = [float(loss.lam) for loss in losses]

        return _with_lam(lams, lambda lam, g, beta: lam * (beta - g.mean(-1)) ** 2)


class LogCoverage(CoverageLoss):
    """Logarithmic regulariser of Fisch et al. (2022): ``λ · mean_i(-log ĝ_i)``.

    The cross entropy between ĝ and a target of all ones, which pushes every ĝ_i towards
    1 without a specific target; β is ignored. The paper found it less stable than
    ``quadratic`` and sensitive to λ. ĝ is clamped at 1e-8 inside the log.
    """

    def __init__(
        self,
        lam: Annotated[float, Field(
            ge=0, description="weight λ; 1e-2 is the default of Fisch et al.'s code")] = 1e-2,
    ) -> None:
        self.lam = lam

    def __call__(self, g: torch.Tensor, beta: float) -> torch.Tensor:
        return self.lam * (-torch.log(g.clamp(1e-8, 1.0))).mean()

    @classmethod
    def batched(cls, losses):
        """The loss of R replicas at once: ``fn(g [R, B], beta [R]) -> [R]`` (β unused),
        replica ``r`` with its own λ; ``None`` if any of ``losses`` is not of this class."""
        if any(type(loss) is not cls for loss in losses):
            return None
        lams = [float(loss.lam) for loss in losses]

        return _with_lam(lams, lambda lam, g, beta: lam * (-torch.log(g.clamp(1e-8, 1.0))).mean(-1))
