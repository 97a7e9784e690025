"""``histogram-binning`` and ``platt-binning`` (Kumar et al., 2019): non-differentiable
recalibrators whose output takes at most ``n_bins`` values."""

from __future__ import annotations

import numpy as np
from pydantic import Field
from selbench.api import FitContext, Params, Recalibrator
from selbench.data import ModelOutputs

from ._common import NotFittedError, bin_means, check_outputs, equal_mass_edges, lookup_bins
from .platt import Mode, PlattScaling


class HistogramBinningParams(Params):
    n_bins: int = Field(15, ge=1, description="number of equal-mass bins")


class PlattBinningParams(Params):
    n_bins: int = Field(15, ge=1, description="number of equal-mass bins")
    mode: Mode = Field("auto", description="Platt mode of the scaling step (see platt)")


class HistogramBinning(Recalibrator):
    """Histogram binning of the top-label confidence with equal-mass bins.

    ``fit`` cuts the fitting examples' top-label confidences into ``n_bins`` bins holding
    (nearly) equal numbers of examples; the recalibrated confidence of an example is the
    fitting accuracy of its bin. Bin boundaries lie midway between neighbouring groups and
    ties are merged, following Kumar et al.'s ``HistogramTopCalibrator`` (``calibration``
    package); an empty bin outputs its midpoint. Learned state: ``edges_`` (upper bin
    boundaries, the last is 1.0) and ``values_`` (the output of each bin).
    """

    def __init__(self, n_bins: int = 15) -> None:
        HistogramBinningParams(n_bins=n_bins)
        self.n_bins = n_bins

    def fit(self, outputs: ModelOutputs, context: FitContext) -> HistogramBinning:
        check_outputs(outputs, "recalibrator 'histogram-binning'", min_rows=1)
        conf = outputs.confidence()
        self.edges_ = equal_mass_edges(conf, self.n_bins)
        self.values_ = bin_means(self.edges_, conf, outputs.correct())
        return self

    def confidence(self, outputs: ModelOutputs) -> np.ndarray:
        check_outputs(outputs, "recalibrator 'histogram-binning'")
        if getattr(self, "edges_", None) is None:
            raise NotFittedError("recalibrator 'histogram-binning' is not fitted; call fit first")
        return self.values_[lookup_bins(self.edges_, outputs.confidence())].astype(np.float64)


class PlattBinning(Recalibrator):
    """Scaling-binning (Kumar et al., 2019): Platt scaling, then equal-mass binning.

    The fitting examples are split at random (seeded by ``context.seed``) into two halves.
    Platt scaling (see ``platt``, ``mode``) is fitted on the first; the second half's
    Platt-scaled top-label confidences define ``n_bins`` equal-mass bins, and each bin
    outputs the mean scaled confidence of the second-half examples in it (an empty bin its
    midpoint). The output therefore takes at most ``n_bins`` distinct values. Learned
    state: ``platt_`` (the fitted :class:`PlattScaling`), ``edges_``, ``values_``.
    """

    def __init__(self, n_bins: int = 15, mode: Mode = "auto") -> None:
        PlattBinningParams(n_bins=n_bins, mode=mode)
        self.n_bins = n_bins
        self.mode = mode

    def fit(self, outputs: ModelOutputs, context: FitContext) -> PlattBinning:
        check_outputs(outputs, "recalibrator 'platt-binning'", min_rows=2)
        n = len(outputs)
        perm = context.generator(offset=1).permutation(n)
        first, second = np.sort(perm[: n // 2]), np.sort(perm[n // 2 :])
        self.platt_ = PlattScaling(mode=self.mode).fit(outputs.subset(first), context)
        scaled = self.platt_.confidence(outputs.subset(second))
        self.edges_ = equal_mass_edges(scaled, self.n_bins)
        self.values_ = bin_means(self.edges_, scaled, scaled)
        return self

    def confidence(self, outputs: ModelOutputs) -> np.ndarray:
        check_outputs(outputs, "recalibrator 'platt-binning'")
        if getattr(self, "edges_", None) is None:
            raise NotFittedError("recalibrator 'platt-binning' is not fitted; call fit first")
        scaled = self.platt_.confidence(outputs)
        return self.values_[lookup_bins(self.edges_, scaled)].astype(np.float64)
