"""``meta-features``: the calibrated selective classification selector of Fisch, Jaakkola &
Barzilay (TMLR 2022) — a learned soft selector on standardised meta-features of each example
(the model's confidence and out-of-distribution scores of its embedding).

See :class:`MetaFeatureSelector` for the meta-features, how the detectors are fitted, and
where this follows or departs from the authors' code.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import AfterValidator, Field
from selbench.contract.api import FitContext, TrainableSelector
from selbench.contract.checks import NotFittedError, check_confidence, check_features, check_outputs
from selbench.contract.data import ModelOutputs
from selbench.training.torchutils import run_module, seeded_init
from sklearn.ensemble import IsolationForest
from sklearn.svm import OneClassSVM

from .mlp import TRAINING_SCHEMES, MLPSelectorNet

WHO = "selector 'meta-features'"

MetaFeature = Literal[
    "confidence", "knn-distance", "kde", "one-class-svm", "isolation-forest", "lof", "entropy"
]

#: the default meta-features (issue 14): every one but ``entropy``
DEFAULT_FEATURES: tuple[str, ...] = (
    "confidence", "knn-distance", "kde", "one-class-svm", "isolation-forest", "lof"
)

#: the meta-features computed from the embedding (the rest come from the logits)
EMBEDDING_FEATURES = ("knn-distance", "kde", "one-class-svm", "isolation-forest", "lof")

#: fixed detector settings (Fisch et al.'s code: scikit-learn defaults, OCSVM max_iter=10000)
OCSVM_NU = 0.5
OCSVM_MAX_ITER = 10_000
IFOREST_TREES = 100

#: evaluation rows per block of the distance computation (bounds memory to block x n_fit)
_BLOCK_ROWS = 2048
#: ``context.generator`` stream of the fold assignment and the Isolation Forests' seeds
_STREAM = 0x4D45_5441
#: fitted detectors kept for replicas on the same data and seed (the training β's of a
#: seed), and evaluation meta-features kept per fitted state
_FIT_CACHE_SIZE = 4
_EVAL_MEMO_SIZE = 4


def _distinct_features(v: list[str]) -> list[str]:
    if not v or len(set(v)) != len(v):
        raise ValueError(f"features must be a non-empty list without repeats, got {v}")
    return v


class MetaFeatureSelector(TrainableSelector):
    """Fisch et al.'s calibrated selective classification (TMLR 2022): an MLP on meta-features.

    Fisch, Jaakkola & Barzilay, "Calibrated Selective Classification" (TMLR 2022): a learned
    soft selector on standardised meta-features, trained through a selective loss.

    ĝ(x) = sigmoid(MLP(m(x))), where m(x) are *meta-features* of the example, each
    standardised with the mean and standard deviation over the fitting rows. The network is
    the ``mlp`` selector's (:class:`MLPSelectorNet`, hand-stacked for the training engine);
    ``hidden`` defaults to ``[64, 64]``, the authors' ``SelectiveNet(hidden_dim=64,
    num_layers=1)`` (Linear-ReLU, Linear-ReLU, Linear). The paper's method trains it with
    S-MMCE: ``scheme: selection``, ``loss: s-mmce``.

    Meta-features (``features``, in this order; the first six by default):

    * ``confidence``: the backbone's max softmax probability (of f's logits, not of the
      recalibrated confidence);
    * ``knn-distance``: mean Euclidean distance to the ``knn_neighbors`` (8) nearest fitting
      rows in the standardised embedding;
    * ``kde``: Gaussian kernel density log-density (bandwidth ``kde_bandwidth`` = 1.0) of the
      standardised embedding (scikit-learn's ``KernelDensity.score_samples``, computed
      exactly);
    * ``one-class-svm``: RBF one-class SVM (ν = 0.5, γ = "scale", max_iter 10,000)
      ``score_samples`` divided by the sum of its dual coefficients (see deviations);
    * ``isolation-forest``: Isolation Forest (100 trees, ``max_samples="auto"``, seeded by
      ``context.seed``) ``score_samples``;
    * ``lof``: Local Outlier Factor (``novelty=True``, ``lof_neighbors`` = 20)
      ``score_samples``;
    * ``entropy`` (optional, not a default): entropy of the softmax probabilities.

    Detectors are fitted on the standardised fitting embedding (each feature's fitting mean
    and standard deviation; a constant feature is left unscaled). Each column keeps its
    detector's orientation; the network learns the sign.

    **Fitting rows are scored out of sample** (:meth:`fit_inputs`). The network is trained on
    the fitting rows, whose in-sample detector scores (a row's distance to itself is 0, its
    own kernel term in the density ...) would not look like the evaluation rows' scores. So:

    * ``knn-distance`` and ``kde`` of a fitting row are exact *leave-one-out* values (its
      neighbours / kernel sum among the other ``n - 1`` fitting rows);
    * ``one-class-svm``, ``isolation-forest`` and ``lof`` are *cross-fitted*: the fitting
      rows are split into ``folds`` (5) random folds (seeded by ``context.seed``), and each
      fold is scored by detectors fitted on the other folds;
    * evaluation rows are scored by detectors fitted on all fitting rows. Outputs whose
      features are the fitting data's (same rows in the same order, compared by content)
      get the out-of-sample values above (also from :meth:`score`).

    The meta-features are standardised with the mean/std of these out-of-sample fitting-row
    values (a constant column is left unscaled).

    Deviations from the authors' code (``ajfisch/calibrated-selective-classification``,
    ``src/data/features.py``), each for selbench's data, which has only the fitting split's
    outputs:

    * the authors fit the detectors (and the embedding's standardisation) on the backbone's
      training set and train the selector on separate perturbed calibration data, so no
      leakage arises; here both use the fitting split, hence the leave-one-out and
      cross-fitting above. The embedding's standardisation is fitted once on all fitting
      rows and shared by the folds (label-free; one row moves it by O(1/n)). Columns with
      two distinct values are standardised too (the authors leave them unscaled; with
      embeddings that only matters for binary features);
    * the one-class SVM's ``score_samples`` (Σ α_i K(x, sv_i)) grows with the number of
      training rows (Σ α_i = ν·n), so a fold's detector and the full one would be on
      different scales; it is divided by Σ α_i (a kernel-weighted average);
    * the KDE is exact (the authors pass ``atol=rtol=0.01`` to scikit-learn's tree for
      speed); the Isolation Forests are seeded from ``context.seed`` (the authors: numpy's
      global seed 1);
    * feature set: the authors also feed the full probability vector, the one-hot predicted
      class and the entropy; the default here is the six meta-features above (issue 14),
      ``entropy`` can be added, the class-based ones are not offered;
    * training: the authors train on batches of perturbed calibration sets with κ-worst
      DRO, a log coverage regulariser, Adam (lr 1e-3, weight decay 1e-5) for 5 epochs; here
      the scheme's loss, coverage loss and training parameters apply.

    Implementation: the distance-based scores (kNN, KDE, LOF, and the SVM's kernel) of a
    block of rows are all computed from one float64 squared-distance matrix to the fitting
    rows (BLAS), and the SVM is solved by libsvm on the precomputed RBF Gram matrix; the
    values equal scikit-learn's ``NearestNeighbors``, ``KernelDensity(atol=rtol=0)``,
    ``OneClassSVM`` and ``LocalOutlierFactor(novelty=True)`` to float rounding (checked by
    ``tests/test_metafeatures.py``). No dimension reduction (the authors use none).
    Replicas on the same fitting data and seed (the training β's of a seed) share the
    fitted detectors, and their evaluation meta-features for the same outputs object,
    through a small in-process cache (results are identical either way; the shared state
    is never modified after :meth:`fit_inputs`). Cost at the paper's largest sizes (2,000
    fitting rows, 2,048-d, 85,000 evaluation rows): ``fit_inputs`` about 2 CPU-seconds,
    the evaluation meta-features about 24 (two thirds of it the distance products).

    Learned state: ``fitted_`` (detectors and the fitting rows' out-of-sample embedding
    meta-features), ``meta_mean_`` / ``meta_scale_`` (the meta-features' standardisation),
    ``module_`` (the network).
    """

    reference: ClassVar[str] = "Fisch et al., TMLR 2022"

    def __init__(
        self,
        hidden: Annotated[list[int], Field(
            description="hidden layer widths (ReLU) of the MLP on the meta-features; the "
            "authors' SelectiveNet(hidden_dim=64, num_layers=1) is [64, 64]",
        )] = [64, 64],  # noqa: B006 - parameters are never mutated
        features: Annotated[list[MetaFeature], AfterValidator(_distinct_features), Field(
            description="the meta-features g reads, in this order: confidence, knn-distance, "
            "kde, one-class-svm, isolation-forest, lof (default: these six), entropy",
        )] = list(DEFAULT_FEATURES),  # noqa: B006 - parameters are never mutated
        folds: Annotated[int, Field(
            ge=2, description="cross-fitting folds for the fitting rows' one-class SVM, "
            "Isolation Forest and LOF scores (capped at half the fitting rows)",
        )] = 5,
        knn_neighbors: Annotated[int, Field(
            ge=1, description="neighbours averaged by knn-distance (capped at n_fit - 1)",
        )] = 8,
        lof_neighbors: Annotated[int, Field(
            ge=1, description="LOF's n_neighbors (capped at the detector's rows - 1)",
        )] = 20,
        kde_bandwidth: Annotated[float, Field(
            gt=0, description="Gaussian KDE bandwidth on the standardised embedding",
        )] = 1.0,
    ) -> None:
        self.hidden = hidden
        self.features = features
        self.folds = folds
        self.knn_neighbors = knn_neighbors
        self.lof_neighbors = lof_neighbors
        self.kde_bandwidth = kde_bandwidth

    # ------------------------------------------------------------------ the protocol
    def fit_inputs(self, outputs: ModelOutputs, context: FitContext) -> None:
        """Fit the detectors on the fitting data, score the fitting rows out of sample
        (leave-one-out / cross-fitting, seeded by ``context.seed``) and fit the
        meta-features' standardisation on them."""
        check_outputs(outputs, WHO, min_rows=4)
        emb = tuple(f for f in self.features if f in EMBEDDING_FEATURES)
        params = (emb, int(self.folds), int(self.knn_neighbors), int(self.lof_neighbors),
                  float(self.kde_bandwidth))
        digest = _digest(outputs.features)
        self.fitted_ = _cached_fit(digest, int(context.seed), params,
                                   lambda: _Fitted.fit(outputs.features, context, *params))
        self.fit_digest_ = digest
        self.feature_dim_ = outputs.feature_dim
        raw = self._raw(outputs, self.fitted_.fit_columns)
        self.meta_mean_ = raw.mean(axis=0)
        scale = raw.std(axis=0)
        scale[scale == 0] = 1.0
        self.meta_scale_ = scale

    def inputs(self, outputs: ModelOutputs) -> np.ndarray:
        """The standardised meta-features, float32 ``[N, len(features)]`` (a new array);
        out-of-sample values for the fitting data, the full detectors' otherwise."""
        check_outputs(outputs, WHO)
        if getattr(self, "fitted_", None) is None:
            raise NotFittedError(
                f"{WHO}: its detectors are not fitted; call fit_inputs(outputs, context) on "
                "the fitting data first (the " + ", ".join(repr(s) for s in TRAINING_SCHEMES)
                + " schemes do)"
            )
        check_features(outputs, self.feature_dim_, WHO)
        if len(outputs) == self.fitted_.n and _digest(outputs.features) == self.fit_digest_:
            cols = self.fitted_.fit_columns
        else:
            cols = self.fitted_.columns(outputs)
        raw = self._raw(outputs, cols)
        return ((raw - self.meta_mean_) / self.meta_scale_).astype(np.float32)

    def init_module(self, outputs: ModelOutputs, context: FitContext) -> torch.nn.Module:
        """Create, store as ``module_`` and return a freshly initialised selector network."""
        check_outputs(outputs, WHO, min_rows=1)
        d_in = len(self.features)
        self.input_dim_ = d_in
        self.module_ = seeded_init(context.seed, lambda: MLPSelectorNet(d_in, self.hidden))
        return self.module_

    def fit(self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext):
        raise ValueError(
            f"{WHO} is trained through a selection loss by the "
            + ", ".join(repr(s) for s in TRAINING_SCHEMES)
            + " schemes, not by fit(); the paper's method is scheme 'selection' with loss "
            "'s-mmce'"
        )

    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        check_outputs(outputs, WHO)
        check_confidence(outputs, confidence, WHO)
        if getattr(self, "module_", None) is None or getattr(self, "fitted_", None) is None:
            raise NotFittedError(
                f"{WHO} is not trained; train it with the "
                + ", ".join(repr(s) for s in TRAINING_SCHEMES) + " scheme"
            )
        return run_module(self.module_, self.inputs(outputs), index=None, borrow=True)

    # ------------------------------------------------------------------ helpers
    def _raw(self, outputs: ModelOutputs, emb_cols: dict[str, np.ndarray]) -> np.ndarray:
        """The unstandardised meta-features ``[N, F]`` (float64) in ``features`` order."""
        cols = []
        probs = None
        for name in self.features:
            if name in ("confidence", "entropy"):
                if probs is None:
                    probs = outputs.probabilities()
                if name == "confidence":
                    cols.append(probs.max(axis=1))
                else:
                    p = np.clip(probs, 1e-8, 1.0)  # as the authors' entropy
                    cols.append(-(p * np.log(p)).sum(axis=1))
            else:
                cols.append(emb_cols[name])
        return np.stack(cols, axis=1).astype(np.float64) if cols else np.zeros((len(outputs), 0))


# ---------------------------------------------------------------------- fitted detectors
@dataclass
class _Fitted:
    """Detectors fitted on all fitting rows, and the fitting rows' out-of-sample columns.

    ``x``: the standardised fitting embedding (float32, as every distance is computed from
    it); ``fit_columns``: name -> ``[n]`` leave-one-out / cross-fitted values.
    """

    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    x: np.ndarray
    k_knn: int
    k_lof: int
    bandwidth: float
    fit_columns: dict[str, np.ndarray]
    lof_kdist: np.ndarray | None = None
    lof_lrd: np.ndarray | None = None
    svm_index: np.ndarray | None = None
    svm_coef: np.ndarray | None = None
    svm_gamma: float = 1.0
    forest: IsolationForest | None = None
    _memo: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _lock: Any = field(default_factory=threading.Lock, repr=False)

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_memo"], state["_lock"] = OrderedDict(), None  # per process, not state
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @classmethod
    def fit(cls, features: np.ndarray, context: FitContext, emb: tuple[str, ...], folds: int,
            knn_neighbors: int, lof_neighbors: int, bandwidth: float) -> _Fitted:
        f64 = features.astype(np.float64)
        mean = f64.mean(axis=0)
        scale = f64.std(axis=0)
        scale[scale == 0] = 1.0
        x = ((f64 - mean) / scale).astype(np.float32)
        n, d = x.shape
        fitted = cls(features=emb, mean=mean, scale=scale, x=x,
                     k_knn=min(knn_neighbors, n - 1), k_lof=min(lof_neighbors, n - 1),
                     bandwidth=float(bandwidth), fit_columns={})
        if not emb:
            return fitted
        x64 = x.astype(np.float64)
        sq = np.einsum("ij,ij->i", x64, x64)
        d2 = _sq_dists(x64, sq, x64, sq)
        np.fill_diagonal(d2, 0.0)
        d2_loo = d2.copy()
        np.fill_diagonal(d2_loo, np.inf)  # a row is never its own neighbour
        cols = fitted.fit_columns

        # exact leave-one-out: kNN distance and KDE log-density among the other n - 1 rows
        if "knn-distance" in emb:
            cols["knn-distance"] = _knn_mean(d2_loo, fitted.k_knn)
        if "kde" in emb:
            cols["kde"] = _kde(d2_loo, n - 1, d, bandwidth)

        # cross-fitting: each fold scored by detectors fitted on the other folds
        rng = context.generator(_STREAM)
        perm = rng.permutation(n)
        n_folds = max(2, min(int(folds), n // 2))
        parts = np.array_split(perm, n_folds)
        forest_seeds = rng.integers(0, 2**31 - 1, size=n_folds + 1)
        _cross_fit(cols, emb, x, x64, d2, parts, forest_seeds, lof_neighbors)

        # the detectors that score evaluation rows: fitted on all fitting rows
        if "one-class-svm" in emb:
            fitted.svm_index, fitted.svm_coef, fitted.svm_gamma = _fit_svm(d2, x64)
        if "isolation-forest" in emb:
            fitted.forest = _fit_forest(x, int(forest_seeds[-1]))
        if "lof" in emb:
            fitted.lof_kdist, fitted.lof_lrd = _lof_reference(d2_loo, fitted.k_lof)
        return fitted

    def columns(self, outputs: ModelOutputs) -> dict[str, np.ndarray]:
        """The embedding meta-features of (evaluation) ``outputs`` by the full detectors;
        kept per outputs object (by identity) for the replicas sharing this state."""
        key = id(outputs)
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None and hit[0]() is outputs:
                self._memo.move_to_end(key)
                return hit[1]
        cols = self._compute(outputs.features)
        try:
            ref = weakref.ref(outputs)
        except TypeError:  # not weak-referenceable: nothing kept
            return cols
        with self._lock:
            self._memo[key] = (ref, cols)
            while len(self._memo) > _EVAL_MEMO_SIZE:
                self._memo.popitem(last=False)
        return cols

    def _compute(self, features: np.ndarray) -> dict[str, np.ndarray]:
        emb, m = self.features, features.shape[0]
        out: dict[str, np.ndarray] = {f: np.empty(m, dtype=np.float64) for f in emb}
        if not emb:
            return out
        x64 = self.x.astype(np.float64)
        sq = np.einsum("ij,ij->i", x64, x64)
        n, d = x64.shape
        need_d2 = bool(set(emb) & {"knn-distance", "kde", "one-class-svm", "lof"})
        k_near = max(self.k_knn if "knn-distance" in emb else 0,
                     self.k_lof if "lof" in emb else 0)
        for start in range(0, m, _BLOCK_ROWS):
            rows = slice(start, start + _BLOCK_ROWS)
            # standardised as the fitting rows were (rounded to float32)
            z = ((features[rows].astype(np.float64) - self.mean) / self.scale).astype(np.float32)
            if "isolation-forest" in emb:
                out["isolation-forest"][rows] = self.forest.score_samples(z)
            if not need_d2:
                continue
            zb = z.astype(np.float64)
            d2 = _sq_dists(zb, np.einsum("ij,ij->i", zb, zb), x64, sq)
            near = None  # the nearest fitting rows, sorted, shared by kNN and LOF
            if k_near:
                near = _k_smallest(d2, k_near, ordered=True)
            if "knn-distance" in emb:
                out["knn-distance"][rows] = near[1][:, :self.k_knn].mean(axis=1)
            if "kde" in emb:
                out["kde"][rows] = _kde(d2, n, d, self.bandwidth)
            if "lof" in emb:
                out["lof"][rows] = _lof_query(near, self.lof_kdist, self.lof_lrd, self.k_lof)
            if "one-class-svm" in emb:
                out["one-class-svm"][rows] = np.exp(
                    -self.svm_gamma * d2[:, self.svm_index]) @ self.svm_coef
        return out


def _cross_fit(cols: dict[str, np.ndarray], emb: tuple[str, ...], x: np.ndarray,
               x64: np.ndarray, d2: np.ndarray, parts: list[np.ndarray],
               forest_seeds: np.ndarray, lof_neighbors: int) -> None:
    """The cross-fitted columns of ``emb`` (one-class SVM, Isolation Forest, LOF) into
    ``cols``: each fold of ``parts`` scored by detectors fitted on the other folds (the
    standardised fitting embedding ``x``, its float64 copy ``x64`` and their squared
    distances ``d2``)."""
    n = x.shape[0]
    crossed = [f for f in ("one-class-svm", "isolation-forest", "lof") if f in emb]
    for f in crossed:
        cols[f] = np.empty(n, dtype=np.float64)
    for i, held in enumerate(parts):
        train = np.setdiff1d(np.arange(n), held)  # sorted: as fitting on those rows
        d2_tt = d2[np.ix_(train, train)]
        d2_ht = d2[np.ix_(held, train)]
        if "one-class-svm" in emb:
            idx, coef, gamma = _fit_svm(d2_tt, x64[train])
            cols["one-class-svm"][held] = np.exp(-gamma * d2_ht[:, idx]) @ coef
        if "isolation-forest" in emb:
            forest = _fit_forest(x[train], int(forest_seeds[i]))
            cols["isolation-forest"][held] = forest.score_samples(x[held])
        if "lof" in emb:
            np.fill_diagonal(d2_tt, np.inf)
            k = min(lof_neighbors, len(train) - 1)
            kdist, lrd = _lof_reference(d2_tt, k)
            cols["lof"][held] = _lof_query(_k_smallest(d2_ht, k, ordered=True), kdist,
                                           lrd, k)


# ---------------------------------------------------------------------- detector maths
def _sq_dists(a: np.ndarray, a_sq: np.ndarray, b: np.ndarray, b_sq: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances ``[len(a), len(b)]`` (float64, clipped at 0)."""
    d2 = a @ b.T
    d2 *= -2.0
    d2 += a_sq[:, None]
    d2 += b_sq[None, :]
    np.maximum(d2, 0.0, out=d2)
    return d2


def _k_smallest(d2: np.ndarray, k: int, ordered: bool = False
                ) -> tuple[np.ndarray, np.ndarray]:
    """Indices and distances (not squared) of each row's ``k`` smallest entries (nearest
    first when ``ordered``)."""
    idx = np.argpartition(d2, k - 1, axis=1)[:, :k]
    dist = np.take_along_axis(d2, idx, axis=1)
    if ordered:
        order = np.argsort(dist, axis=1, kind="stable")
        idx = np.take_along_axis(idx, order, axis=1)
        dist = np.take_along_axis(dist, order, axis=1)
    return idx, np.sqrt(dist)


def _knn_mean(d2: np.ndarray, k: int) -> np.ndarray:
    """Mean distance to the ``k`` nearest columns (the authors' ``KNNDistance``)."""
    return _k_smallest(d2, k)[1].mean(axis=1)


def _kde(d2: np.ndarray, n_ref: int, d: int, h: float) -> np.ndarray:
    """Gaussian KDE log-density over ``n_ref`` reference rows (``inf`` entries excluded), as
    scikit-learn's ``KernelDensity(kernel="gaussian", bandwidth=h).score_samples``."""
    c = 0.5 / (h * h)
    low = d2.min(axis=1, keepdims=True)  # log-sum-exp shifted by the nearest row
    terms = np.subtract(d2, low)
    terms *= -c
    np.exp(terms, out=terms)
    lse = np.log(terms.sum(axis=1)) - c * low[:, 0]
    return lse - np.log(n_ref) - 0.5 * d * np.log(2.0 * np.pi * h * h)


def _lof_reference(d2_ref: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """k-distance and local reachability density of each reference row, its neighbours
    taken among the other reference rows (``d2_ref`` has ``inf`` on the diagonal)."""
    idx, dist = _k_smallest(d2_ref, k)
    kdist = dist.max(axis=1)
    reach = np.maximum(dist, kdist[idx])
    return kdist, 1.0 / (reach.mean(axis=1) + 1e-10)


def _lof_query(near: tuple[np.ndarray, np.ndarray], kdist: np.ndarray, lrd: np.ndarray,
               k: int) -> np.ndarray:
    """``LocalOutlierFactor(novelty=True).score_samples``: minus the mean ratio of the
    neighbours' local reachability density to the row's own; ``near``: the indices and
    distances of each row's nearest reference rows, nearest first (at least ``k``)."""
    idx, dist = near[0][:, :k], near[1][:, :k]
    own = 1.0 / (np.maximum(dist, kdist[idx]).mean(axis=1) + 1e-10)
    return -(lrd[idx] / own[:, None]).mean(axis=1)


def _fit_svm(d2: np.ndarray, x64: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """One-class SVM (RBF, γ = "scale" of ``x64``) on the rows of ``d2``; returns the
    support vectors' row indices, their dual coefficients divided by their sum, and γ."""
    var = float(x64.var())
    gamma = 1.0 / (x64.shape[1] * var) if var > 0 else 1.0
    svm = OneClassSVM(kernel="precomputed", nu=OCSVM_NU, max_iter=OCSVM_MAX_ITER)
    svm.fit(np.exp(-gamma * d2))
    coef = svm.dual_coef_[0].astype(np.float64)
    return svm.support_.astype(np.int64), coef / coef.sum(), gamma


def _fit_forest(x: np.ndarray, seed: int) -> IsolationForest:
    return IsolationForest(n_estimators=IFOREST_TREES, random_state=seed).fit(x)


# ---------------------------------------------------------------------- sharing
def _digest(a: np.ndarray) -> str:
    """Content digest of an array (shape, dtype and bytes)."""
    h = hashlib.blake2b(digest_size=20)
    h.update(repr((a.shape, str(a.dtype))).encode())
    h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


_FIT_CACHE: OrderedDict[tuple, _Fitted] = OrderedDict()
_FIT_LOCK = threading.Lock()


def _cached_fit(digest: str, seed: int, params: tuple, build) -> _Fitted:
    """The fitted detectors for (data, seed, parameters), shared by the replicas that ask
    for the same (deterministic, so sharing changes no value)."""
    key = (digest, seed, params)
    with _FIT_LOCK:
        hit = _FIT_CACHE.get(key)
        if hit is not None:
            _FIT_CACHE.move_to_end(key)
            return hit
    fitted = build()
    with _FIT_LOCK:
        _FIT_CACHE[key] = fitted
        while len(_FIT_CACHE) > _FIT_CACHE_SIZE:
            _FIT_CACHE.popitem(last=False)
    return fitted
