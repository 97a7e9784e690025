"""``oracle-domain``: a selector that knows each example's domain.

Not a method one can deploy (the domain of a test input is unknown), but the reference
point of the paper's theory: Theorem 1's ``g0`` rejects exactly the outlier component J2
(domain 1 of ``theory-mixture``), after which a single temperature reaches zero selective
calibration error.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import Field
from selbench.contract.api import FitContext, Plugin, Selector
from selbench.contract.data import ModelOutputs

__all__ = ["PLUGIN", "OracleDomain"]


class OracleDomain(Selector):
    """Oracle selector: score 1 unless the example's domain is in ``reject_domains`` (then 0).

    Needs ``outputs.domain``; the confidence is ignored (it may be ``None``). ``fit`` only
    records ``accepted_fraction_``, the share of the fitting data it accepts. Scores are binary
    (ties everywhere): the core accepts exactly ``ceil(β n)`` examples
    (:func:`selbench.measure.metrics.accept_mask`), so at a coverage below the fraction of accepted
    domains it accepts a seeded random subset of the non-rejected domains, and above it all
    of them plus a seeded random subset of the rejected ones.
    """

    def __init__(
        self,
        reject_domains: Annotated[list[int], Field(
            description="domain ids to reject (score 0); every other domain scores 1",
        )] = [1],  # noqa: B006 - parameters are never mutated
    ):
        self.reject_domains = reject_domains

    def _domain(self, outputs: ModelOutputs, confidence: np.ndarray | None) -> np.ndarray:
        if not isinstance(outputs, ModelOutputs):
            raise ValueError(
                f"outputs: oracle-domain expects selbench.ModelOutputs, got {type(outputs).__name__}"
            )
        if confidence is not None and np.shape(confidence) != (len(outputs),):
            raise ValueError(
                f"confidence: oracle-domain expects shape ({len(outputs)},), got "
                f"{np.shape(confidence)}"
            )
        if outputs.domain is None:
            raise ValueError(
                "oracle-domain: outputs.domain is None; this selector needs a dataset whose "
                "splits carry domain ids (e.g. theory-mixture, digits 'shifted')"
            )
        return np.asarray(outputs.domain)

    def fit(
        self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext
    ) -> OracleDomain:
        domain = self._domain(outputs, confidence)
        if len(domain) == 0:
            raise ValueError("outputs: oracle-domain cannot be fitted on zero examples")
        self.accepted_fraction_ = float(np.mean(~np.isin(domain, self.reject_domains)))
        return self

    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        domain = self._domain(outputs, confidence)
        return (~np.isin(domain, self.reject_domains)).astype(np.float64)


PLUGIN = Plugin(
    "oracle-domain",
    OracleDomain,
    summary="Oracle: accept every example whose domain id is not in reject_domains",
)
