"""``isotonic``: isotonic regression of correctness on the top-label confidence (Zadrozny &
Elkan, 2002)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from selbench.contract.api import FitContext, Recalibrator
from selbench.contract.checks import NotFittedError, check_outputs
from selbench.contract.data import ModelOutputs
from sklearn.isotonic import IsotonicRegression

from ._common import fit_once_per_data
from .binning import top_label


class IsotonicCalibration(Recalibrator):
    """Isotonic regression of correctness on the top-label confidence (Zadrozny & Elkan, KDD 2002).

    ``fit`` regresses whether the prediction ``argmax(logits)`` is right on its confidence
    ``max softmax(logits)`` with the best non-decreasing fit in squared error (pool adjacent
    violators): scikit-learn's ``IsotonicRegression(out_of_bounds="clip", y_min=0,
    y_max=1)`` does the fit and the prediction, which interpolates linearly between the
    fitted points and is constant beyond the fitted range. Learned state: ``isotonic_``,
    the fitted scikit-learn estimator (its ``X_thresholds_`` / ``y_thresholds_`` are the
    fitted points). Not differentiable: the prediction never changes.
    """

    reference: ClassVar[str] = (
        "Zadrozny & Elkan, Transforming Classifier Scores into Accurate Multiclass Probability "
        "Estimates, KDD 2002")
    usable_unfitted = False

    @classmethod
    def fit_many(cls, recalibrators, outputs, contexts) -> None:
        """Fit each of ``recalibrators`` on its ``outputs`` as :meth:`fit` would; the fit
        depends on the logits and labels only, so equal data are fitted once and copied."""
        fit_once_per_data(recalibrators, outputs, contexts)

    def fit(self, outputs: ModelOutputs, context: FitContext) -> IsotonicCalibration:
        check_outputs(outputs, "recalibrator 'isotonic'", min_rows=1)
        conf, correct = top_label(outputs)
        self.isotonic_ = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0)
        self.isotonic_.fit(conf, correct)
        return self

    def confidence(self, outputs: ModelOutputs) -> np.ndarray:
        check_outputs(outputs, "recalibrator 'isotonic'")
        if getattr(self, "isotonic_", None) is None:
            raise NotFittedError("recalibrator 'isotonic' is not fitted; call fit first")
        if len(outputs) == 0:  # scikit-learn's predict rejects an empty array
            return np.zeros(0)
        conf, _ = top_label(outputs)
        return np.clip(self.isotonic_.predict(conf).astype(np.float64), 0.0, 1.0)
