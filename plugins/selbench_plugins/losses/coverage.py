"""Coverage losses λ·L_cov(β): ``quadratic`` (the paper's) and ``log-coverage`` (Fisch et
al., 2022), written for any leading (replica) dimensions: ``g [..., B]`` and β (a float
or a tensor ``[...]``) give ``[...]``."""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field
from selbench.contract.api import CoverageLoss
from selbench.contract.search import Tune


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
        ), Tune.log_uniform(1.0, 128.0)] = 32.0,
    ) -> None:
        self.lam = lam

    #: λ may be a tensor [R] (one per replica): the same products, one call for all
    replica_params = ("lam",)

    def __call__(self, g: torch.Tensor, beta: float | torch.Tensor) -> torch.Tensor:
        return self.lam * (beta - g.mean(-1)) ** 2


class LogCoverage(CoverageLoss):
    """Logarithmic regulariser of Fisch et al. (2022): ``λ · mean_i(-log ĝ_i)``.

    The cross entropy between ĝ and a target of all ones, which pushes every ĝ_i towards
    1 without a specific target; β is ignored. The paper found it less stable than
    ``quadratic`` and sensitive to λ. ĝ is clamped at 1e-8 inside the log.
    """

    def __init__(
        self,
        lam: Annotated[float, Field(
            ge=0, description="weight λ; 1e-2 is the default of Fisch et al.'s code"),
            Tune.log_uniform(1e-3, 1.0)] = 1e-2,
    ) -> None:
        self.lam = lam

    #: λ may be a tensor [R] (one per replica): the same products, one call for all
    replica_params = ("lam",)

    def __call__(self, g: torch.Tensor, beta: float | torch.Tensor) -> torch.Tensor:
        return self.lam * (-torch.log(g.clamp(1e-8, 1.0))).mean(-1)
