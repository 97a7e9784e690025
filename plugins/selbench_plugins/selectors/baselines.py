"""The paper's selection baselines: ``confidence``, ``isolation-forest``, ``one-class-svm``,
and ``none`` (accept everything)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field
from selbench.contract.api import FitContext, Selector
from selbench.contract.checks import NotFittedError, check_confidence, check_features, check_outputs
from selbench.contract.data import ModelOutputs
from selbench.contract.search import Tune
from selbench.training.torchutils import equal_groups, fit_once_per_group
from sklearn.ensemble import IsolationForest
from sklearn.preprocessing import StandardScaler
from sklearn.svm import OneClassSVM


def fit_once_per_features(selectors: Sequence[Selector], outputs: Sequence[ModelOutputs],
                          confidences: Sequence[np.ndarray], contexts: Sequence[FitContext],
                          name: str) -> None:
    """``selectors[i].fit(outputs[i], confidences[i], contexts[i])`` for selectors whose fit
    is a deterministic function of their parameters and the features alone (not of the
    seed, the confidence, the labels or β): equal ones (the training β's of one seed, in a
    leaderboard) are fitted once and the learned attributes deep-copied. Every confidence
    is still checked, as its own fit would (``name`` in the messages).

    Used by the One-class SVM, whose libsvm fit is costly (``perf/bench_paper.py``,
    shortened, 2 CPU cores: Camelyon17 4.1 -> 2.4 s, ImageNet 6.4 -> 2.6 s for the method's
    20 cells). Not by the Isolation Forest: its fit (100 trees of 256 samples) was measured
    cheaper than deep-copying the fitted forest (ImageNet 3.4 -> 4.3 s with it)."""
    groups = equal_groups(
        [0] * len(selectors),
        lambda a, b: type(selectors[a]) is type(selectors[b])
        and selectors[a].get_params(deep=False) == selectors[b].get_params(deep=False)
        and np.array_equal(outputs[a].features, outputs[b].features),
    )
    fit_once_per_group(selectors, groups,
                       lambda i: selectors[i].fit(outputs[i], confidences[i], contexts[i]))
    for out, conf in zip(outputs, confidences):
        check_confidence(out, conf, name)


class ConfidenceSelector(Selector):
    """Confidence-based rejection: score = the (recalibrated) top-label confidence.

    Ranks examples by ĥ(f(x)) (or f̂(x) with recalibrator ``none``), rejecting the least
    confident first — the paper's "Confidence" baseline. Nothing to fit.
    """

    #: the method's canonical citation (shown by ``selbench plugins``)
    reference: ClassVar[str] = "Geifman & El-Yaniv, Selective Classification for Deep Neural Networks, NeurIPS 2017"

    def fit(self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext):
        check_outputs(outputs, "selector 'confidence'", min_rows=1)
        check_confidence(outputs, confidence, "selector 'confidence'")
        self.n_fit_ = len(outputs)
        return self

    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        check_outputs(outputs, "selector 'confidence'")
        return check_confidence(outputs, confidence, "selector 'confidence'")


class NoSelector(Selector):
    """No selection: every example gets the same score, so everything is accepted (β = 1)."""

    selects = False  # the core accepts every example at every β

    def fit(self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext):
        check_outputs(outputs, "selector 'none'", min_rows=1)
        check_confidence(outputs, confidence, "selector 'none'")
        self.n_fit_ = len(outputs)
        return self

    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        check_outputs(outputs, "selector 'none'")
        check_confidence(outputs, confidence, "selector 'none'")
        return np.zeros(len(outputs), dtype=np.float64)


class IsolationForestSelector(Selector):
    """Isolation Forest (Liu et al., 2008) on the feature embedding; higher = more typical.

    The score is scikit-learn's ``score_samples`` (the negated anomaly score), so typical
    examples are accepted first and outliers rejected. Seeded by ``context.seed``.
    ``contamination`` does not affect ``score_samples`` and is not exposed. Learned state:
    ``forest_``.
    """

    #: the method's canonical citation (shown by ``selbench plugins``)
    reference: ClassVar[str] = "Liu, Ting & Zhou, Isolation Forest, ICDM 2008"

    def __init__(
        self,
        n_estimators: Annotated[int, Field(ge=1, description="number of trees")] = 100,
        max_samples: Annotated[Literal["auto"] | int | float, Field(
            description="samples per tree: 'auto' (min(256, N)), a count, or a fraction",
        )] = "auto",
    ) -> None:
        self.n_estimators = n_estimators
        self.max_samples = max_samples

    def fit(self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext):
        check_outputs(outputs, "selector 'isolation-forest'", min_rows=2)
        check_confidence(outputs, confidence, "selector 'isolation-forest'")
        self.forest_ = IsolationForest(
            n_estimators=self.n_estimators,
            max_samples=self.max_samples,
            random_state=int(context.seed) % (2**32),
        ).fit(outputs.features)
        self.feature_dim_ = outputs.feature_dim
        return self

    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        check_outputs(outputs, "selector 'isolation-forest'")
        check_confidence(outputs, confidence, "selector 'isolation-forest'")
        if getattr(self, "forest_", None) is None:
            raise NotFittedError("selector 'isolation-forest' is not fitted; call fit first")
        check_features(outputs, self.feature_dim_, "selector 'isolation-forest'")
        return self.forest_.score_samples(outputs.features).astype(np.float64)


class OneClassSVMSelector(Selector):
    """One-class SVM (RBF) on the standardised embedding; higher = more typical.

    Schölkopf et al. (2001); the score is scikit-learn's ``decision_function``,
    ``sum_i alpha_i exp(-gamma ||x - sv_i||^2) - rho``. The fit is scikit-learn's (libsvm);
    the scoring is computed here from the fitted support vectors with one matrix product per
    block of rows (``||x||^2 + ||sv||^2 - 2 x·sv``, float64), which gives libsvm's values to
    about 1e-12 but runs at BLAS speed instead of libsvm's kernel loop (the paper's
    evaluation splits have up to 85,000 rows; this was the slowest baseline).

    The features are standardised with the fitting data's mean and standard deviation
    (``standardize``). ``gamma="scale"`` is ``1 / (d * var(x))`` of the (standardised)
    fitting features, as in scikit-learn. Deterministic. Learned state: ``scaler_`` (or
    None), ``svm_``, ``gamma_`` (the kernel coefficient used).
    """

    #: the method's canonical citation (shown by ``selbench plugins``)
    reference: ClassVar[str] = "Schölkopf et al., Estimating the Support of a High-Dimensional Distribution, Neural Computation 2001"

    #: Rows scored per matrix product (bounds the kernel block to rows x support vectors).
    _block_rows = 4096

    def __init__(
        self,
        nu: Annotated[float, Field(
            gt=0, le=1, description="upper bound on the fraction of training outliers"),
            Tune.uniform(0.01, 0.99)] = 0.5,  # nu = 1 leaves libsvm non-finite coefficients
        gamma: Annotated[Literal["scale", "auto"] | float, Field(
            description="RBF kernel coefficient ('scale', 'auto' or a positive float)")] = "scale",
        standardize: Annotated[bool, Field(
            description="standardise each feature (fitting mean and std) before the SVM")] = True,
    ) -> None:
        self.nu = nu
        self.gamma = gamma
        self.standardize = standardize

    def fit(self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext):
        check_outputs(outputs, "selector 'one-class-svm'", min_rows=2)
        check_confidence(outputs, confidence, "selector 'one-class-svm'")
        x = outputs.features.astype(np.float64)
        self.scaler_ = StandardScaler().fit(x) if self.standardize else None
        if self.scaler_ is not None:
            x = self.scaler_.transform(x)
        self.gamma_ = _rbf_gamma(self.gamma, x)
        self.svm_ = OneClassSVM(kernel="rbf", nu=self.nu, gamma=self.gamma_).fit(x)
        self.feature_dim_ = outputs.feature_dim
        return self

    @classmethod
    def fit_many(cls, selectors, outputs, confidences, contexts) -> None:
        """As many :meth:`fit` calls; equal features are fitted once (the fit is
        deterministic and reads neither the seed, the confidence nor β)."""
        fit_once_per_features(selectors, outputs, confidences, contexts,
                              name="selector 'one-class-svm'")

    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        check_outputs(outputs, "selector 'one-class-svm'")
        check_confidence(outputs, confidence, "selector 'one-class-svm'")
        if getattr(self, "svm_", None) is None:
            raise NotFittedError("selector 'one-class-svm' is not fitted; call fit first")
        check_features(outputs, self.feature_dim_, "selector 'one-class-svm'")
        x = outputs.features.astype(np.float64)
        if self.scaler_ is not None:
            x = self.scaler_.transform(x)
        return _rbf_decision(
            x, self.svm_.support_vectors_, self.svm_.dual_coef_[0], float(self.svm_.intercept_[0]),
            self.gamma_, self._block_rows,
        )


def _rbf_gamma(gamma: str | float, x: np.ndarray) -> float:
    """scikit-learn's RBF coefficient for ``gamma`` ('scale', 'auto' or a number) on ``x``."""
    if gamma == "scale":
        var = float(x.var())
        return 1.0 / (x.shape[1] * var) if var != 0 else 1.0
    if gamma == "auto":
        return 1.0 / x.shape[1]
    return float(gamma)


def _rbf_decision(
    x: np.ndarray, sv: np.ndarray, coef: np.ndarray, intercept: float, gamma: float, block: int
) -> np.ndarray:
    """``sum_i coef_i exp(-gamma ||x - sv_i||^2) + intercept`` for every row of ``x``."""
    out = np.empty(x.shape[0], dtype=np.float64)
    sv_sq = np.einsum("ij,ij->i", sv, sv)
    for start in range(0, x.shape[0], block):
        xb = x[start : start + block]
        d2 = xb @ sv.T
        d2 *= -2.0
        d2 += np.einsum("ij,ij->i", xb, xb)[:, None]
        d2 += sv_sq[None, :]
        np.maximum(d2, 0.0, out=d2)
        d2 *= -gamma
        np.exp(d2, out=d2)
        out[start : start + block] = d2 @ coef + intercept
    return out
