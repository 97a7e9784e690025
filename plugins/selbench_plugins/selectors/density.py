"""Selectors on the feature embedding (``outputs.features``): ``knn-distance``,
``mahalanobis``, ``lof`` and ``kde``. Higher scores mean more typical of the fitting data, so
typical examples are accepted first.

Each is fitted on the fitting features only and scores every example on its own (no
statistic of the scored batch): an example's score does not depend on the other rows scored
with it.

The float32 path of :func:`kth_neighbour_distance` (``precision="float32"``; a float32
matrix product takes half the time of a float64 one on an AVX2 CPU) computes the products in
float32 and then proves, row by row, which fitting row is the ``k``-th, so that the result
is the float64 one. For rows of norm <= 1, every float32 product is within ``delta = gamma_d
(1 + u)^2 + 2u + u^2`` of the exact one (``u = 2^-24``, ``gamma_d = d u / (1 - d u)``: the
worst-case error of a length-d dot product in any summation order, Higham 2002, section 3.1,
plus the rounding of both inputs; about ``(d + 2) u``, 1.2e-4 at d = 2,048). With ``t`` the
``k``-th largest float32 value, the rows above ``t + 2 delta`` are then truly nearer than the
``k``-th neighbour and those below ``t - 2 delta`` truly farther, so the ``k``-th neighbour is
the row of rank ``k - a`` among the rows in between (the window, often the float32 ``k``-th
alone), ``a`` the number of rows above. The window's distances are computed exactly in
float64 (``||x - b||``) and ranked. A window that may reach beyond the ``k + extra`` largest
float32 values sends its row to the float64 product. On the 2,048-d clustered features of
``perf/bench_selectors.py`` about half of the rows have a window of two or more rows (their
distances cost a few gathers) and none goes to float64.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, PositiveFloat
from selbench.contract.api import FitContext, Selector
from selbench.contract.checks import NotFittedError, check_confidence, check_features, check_outputs
from selbench.contract.data import ModelOutputs
from selbench.contract.search import Tune
from sklearn.covariance import EmpiricalCovariance
from sklearn.decomposition import PCA
from sklearn.neighbors import KernelDensity, LocalOutlierFactor
from sklearn.preprocessing import StandardScaler

__all__ = [
    "KDESelector",
    "KNNDistanceSelector",
    "LOFSelector",
    "MahalanobisSelector",
    "kth_neighbour_distance",
    "l2_normalize",
    "mahalanobis_min",
]

#: Added to the L2 norm before dividing, as the authors' code of Sun et al. does.
KNN_NORM_EPS = 1e-10
#: Unit roundoff of float32.
_U32 = 2.0**-24


def _checked(selector: Selector, outputs: ModelOutputs, confidence: np.ndarray, who: str,
             fitted: str) -> np.ndarray:
    """The input checks of ``score`` (outputs, confidence, fitted, feature width); returns
    the (float32) features."""
    check_outputs(outputs, who)
    check_confidence(outputs, confidence, who)
    if getattr(selector, fitted, None) is None:
        raise NotFittedError(f"{who} is not fitted; call fit first")
    check_features(outputs, selector.feature_dim_, who)
    return outputs.features


# ---------------------------------------------------------------------------- knn-distance
def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` divided by their L2 norm plus 1e-10, float64 (a zero row stays zero)."""
    x = np.asarray(x, dtype=np.float64)
    return x / (np.linalg.norm(x, axis=1, keepdims=True) + KNN_NORM_EPS)


def kth_neighbour_distance(x: np.ndarray, bank: np.ndarray, k: int, *,
                           precision: Literal["float32", "float64"] = "float32",
                           normalize: bool = False, block: int | None = None,
                           extra: int = 16, stats: dict | None = None) -> np.ndarray:
    """Euclidean distance from every row of ``x`` to its ``k``-th nearest row of ``bank``,
    float64 ``[m]``, for rows of L2 norm at most 1 (the normalised features; with
    ``normalize``, ``x`` is normalised here, one block at a time, by :func:`l2_normalize`).

    The nearest rows are those of largest ``s_j = x . b_j - ||b_j||^2 / 2`` (``||x - b_j||^2
    = ||x||^2 - 2 s_j``); ``||b_j||^2`` is 1 but for zero rows. The products are computed
    one block of rows at a time with one NumPy (BLAS) matrix product (IEEE float32 or
    float64 whatever torch's matmul precision setting), the ``k``-th largest is found with
    ``torch.topk`` (``np.argpartition`` took 3.9 s where it takes 0.16 s at 35,000 x 2,000),
    and the distance to that row is computed in float64 as ``||x - b||`` (no cancellation).

    ``precision="float32"`` (the fast path) computes the products in float32 and then
    proves, row by row, which fitting row is the ``k``-th, so that the result is the float64
    one (the proof, and the role of ``extra``: the module docstring). ``"float64"``: every
    product in float64.

    ``stats``, when given, receives ``"window"`` (rows whose window held several rows) and
    ``"float64"`` (rows recomputed in float64).
    """
    x = np.asarray(x)
    bank = np.ascontiguousarray(bank, dtype=np.float64)
    m, n, d = x.shape[0], bank.shape[0], x.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"k must lie in [1, {n}] (the rows of the bank), got {k}")
    out = np.empty(m, dtype=np.float64)
    counts = {"window": 0, "float64": 0}
    half = 0.5 * np.einsum("ij,ij->i", bank, bank)
    half_sq = torch.from_numpy(half)
    block = block or max(1, min(4096, (1 << 24) // n))
    du = d * _U32
    fast = precision == "float32" and du < 0.5  # no useful bound past d = 8 million
    if fast:
        ranking = _Float32Ranking(bank, half, half_sq, k, du, extra)
    for start in range(0, m, block):
        xb = x[start : start + block]
        xb = l2_normalize(xb) if normalize else np.ascontiguousarray(xb, dtype=np.float64)
        if not fast:
            out[start : start + len(xb)] = _exact_rows(xb, bank, half_sq, k)
            counts["float64"] += len(xb)
            continue
        out[start : start + len(xb)] = ranking.distances(xb, counts)
    if stats is not None:
        stats.update(counts)
    return out


class _Float32Ranking:
    """The float32 path of :func:`kth_neighbour_distance` for one bank (see the module
    docstring): the bound on the float32 products' error and how many of the largest float32
    values each row's window may use."""

    def __init__(self, bank: np.ndarray, half: np.ndarray, half_sq: torch.Tensor, k: int,
                 du: float, extra: int):
        n = bank.shape[0]
        self.bank, self.half_sq, self.k, self.n = bank, half_sq, k, n
        self.bank32 = bank.astype(np.float32)
        delta = (du / (1 - du) * (1 + _U32) ** 2 + 2 * _U32 + _U32**2) * (1 + 1e-6)
        # ranking by the float32 x . b alone (no [rows, n] float64 array) is exact enough
        # when the bank's norms agree (every row normalised: 1/2 to 1e-16), their spread
        # then counting as error; else (zero rows) ||b||^2 / 2 is subtracted in float64
        spread = float(half.max() - half.min()) if n else 0.0
        self.shift = spread > delta
        self.two_delta = 2.0 * (delta + (0.0 if self.shift else spread))
        self.top_m = min(n, k + max(0, extra))

    def distances(self, xb: np.ndarray, counts: dict[str, int]) -> np.ndarray:
        """The ``k``-th neighbour distances of the float64 rows ``xb``; ``counts`` gets the
        rows that needed a window or the float64 product."""
        bank, k, n, top_m, two_delta = self.bank, self.k, self.n, self.top_m, self.two_delta
        s = torch.from_numpy(xb.astype(np.float32) @ self.bank32.T)
        if self.shift:
            s = s.double() - self.half_sq
        vals, pos = torch.topk(s, top_m, dim=1)
        vals, pos = vals.numpy().astype(np.float64), pos.numpy()
        kth = vals[:, k - 1 : k]
        above = (vals > kth + two_delta).sum(axis=1)  # a prefix: the values are sorted
        end = (vals >= kth - two_delta).sum(axis=1)
        overflow = (end == top_m) & (top_m < n)
        window = ~overflow & ((above < k - 1) | (end > k))
        dist = np.empty(len(xb), dtype=np.float64)
        rows = np.flatnonzero(~overflow & ~window)  # the float32 k-th is certain
        dist[rows] = _distances(xb, bank, rows, pos[rows, k - 1])
        rows = np.flatnonzero(window)
        if len(rows):
            dist[rows] = _window_kth(xb, bank, rows, pos, above, end, k)
            counts["window"] += len(rows)
        rows = np.flatnonzero(overflow)
        if len(rows):
            dist[rows] = _exact_rows(xb[rows], bank, self.half_sq, k)
            counts["float64"] += len(rows)
        return dist


def _distances(x: np.ndarray, bank: np.ndarray, rows: np.ndarray, cols: np.ndarray,
               chunk: int = 256) -> np.ndarray:
    """``||x[rows[i]] - bank[cols[i]]||`` in float64, ``chunk`` pairs at a time."""
    out = np.empty(len(rows), dtype=np.float64)
    for a in range(0, len(rows), chunk):
        diff = x[rows[a : a + chunk]] - bank[cols[a : a + chunk]]
        out[a : a + chunk] = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    return out


def _window_kth(x: np.ndarray, bank: np.ndarray, rows: np.ndarray, pos: np.ndarray,
                above: np.ndarray, end: np.ndarray, k: int) -> np.ndarray:
    """For each row of ``rows``: the ``(k - above)``-th smallest exact distance among the
    fitting rows ``pos[row, above:end]`` (its window)."""
    width = pos.shape[1]
    cols = np.arange(width)
    inside = (cols >= above[rows, None]) & (cols < end[rows, None])  # [r, width]
    r_idx, c_idx = np.nonzero(inside)
    table = np.full((len(rows), width), np.inf)
    table[r_idx, c_idx] = _distances(x, bank, rows[r_idx], pos[rows[r_idx], c_idx])
    table.sort(axis=1)
    return table[np.arange(len(rows)), k - 1 - above[rows]]


def _exact_rows(x: np.ndarray, bank: np.ndarray, half_sq: torch.Tensor, k: int) -> np.ndarray:
    """The float64 path: every product in float64, then the distance to the ``k``-th."""
    s = torch.from_numpy(x @ bank.T)
    s -= half_sq
    idx = torch.topk(s, k, dim=1).indices[:, k - 1].numpy()
    return _distances(x, bank, np.arange(len(x)), idx)


class KNNDistanceSelector(Selector):
    """Deep nearest neighbours (Sun et al., ICML 2022): −distance to the k-th nearest fit feature.

    Features and fitting features are L2-normalised.

    ``score(x) = -|| x/||x|| - z_(k) ||`` with ``z_(k)`` the ``k``-th nearest of the
    normalised fitting features (normalised as the authors' code does, ``x / (||x|| +
    1e-10)``; their code ranks by the squared distance faiss returns, the same order). The
    values equal scikit-learn's ``NearestNeighbors(n_neighbors=k).kneighbors`` on the
    normalised features (tests/test_selectors_beyond.py).

    ``k``: the paper uses k = 50 for CIFAR-10's 50,000 training points and k = 1000 for
    ImageNet's 1.28 million (about 0.1% of the points); at the 500-2,000 fitting rows of a
    selective-recalibration split that rule gives k = 1-2, whose distance rests on a single
    fitting point. The default k = 5 (0.25-1% of those rows) stays in the small-k regime the
    paper found best while averaging over a few neighbours; ``fit`` raises a ValueError when
    k exceeds the number of fitting rows.

    Scoring is hand-written: a blocked matrix product with a float32 fast path proven, row by
    row, to give the float64 result (:func:`kth_neighbour_distance`), because scikit-learn's
    search computes every distance in float64. At the paper's sizes (2,000 fitting x 35,000
    scored rows x 2,048 features, ``perf/bench_selectors.py``, 2 shared CPU cores) it takes
    4.1-4.3 CPU seconds against scikit-learn's 7.0-7.4 (brute force or default), 1.7x less,
    with equal values (1.3e-15). Deterministic. Learned state: ``bank_`` (the normalised
    fitting features, float64).
    """

    reference: ClassVar[str] = (
        "Sun, Ming, Zhu & Li, Out-of-Distribution Detection with Deep Nearest Neighbors, "
        "ICML 2022"
    )

    def __init__(
        self,
        k: Annotated[int, Field(ge=1, description="which nearest fitting feature "
                                                  "(at most the number of fitting rows)"),
                     Tune.int(1, 50)] = 5,
        precision: Annotated[Literal["float32", "float64"], Field(
            description="inner products in float32 with an exactness check (near-ties "
                        "ranked by exact float64 distances) or all in float64; the scores "
                        "are the same")
        ] = "float32",
    ) -> None:
        self.k = k
        self.precision = precision

    def fit(self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext):
        who = "selector 'knn-distance'"
        check_outputs(outputs, who, min_rows=1)
        check_confidence(outputs, confidence, who)
        if self.k > len(outputs):
            raise ValueError(
                f"k: {who} needs k <= the number of fitting rows ({len(outputs)}), got "
                f"k={self.k}; lower k or fit on more rows"
            )
        self.bank_ = l2_normalize(outputs.features)
        self.feature_dim_ = outputs.feature_dim
        return self

    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        x = _checked(self, outputs, confidence, "selector 'knn-distance'", "bank_")
        return -kth_neighbour_distance(x, self.bank_, self.k, precision=self.precision,
                                       normalize=True)


# ---------------------------------------------------------------------------- mahalanobis
class MahalanobisSelector(Selector):
    """Mahalanobis (Lee et al., NeurIPS 2018): −min over classes of the tied-covariance distance.

    Class means and one shared covariance are fitted on the fitting features and labels.

    ``score(x) = -min_c (x - mu_c)^T P (x - mu_c)`` over the classes ``c`` present in the
    fitting labels (classes absent from the fitting data are skipped), ``mu_c`` the class
    means of the fitting features and ``P`` the precision of the tied covariance, fitted as
    the authors' ``sample_estimator`` (pokaxpoka/deep_Mahalanobis_detector,
    ``lib_generation.py``) does: each fitting feature minus its class mean, pooled, given to
    ``sklearn.covariance.EmpiricalCovariance(assume_centered=False)``, whose ``precision_``
    is the pseudo-inverse (``scipy.linalg.pinvh``) of the maximum-likelihood covariance, so
    a singular covariance (more features than fitting rows) is handled as there. The score
    is the paper's confidence score ``M(x)`` (the code's ``-0.5`` factor, which does not
    change the order, is dropped). Only the penultimate features are used: no input
    preprocessing (the paper's small input perturbation needs the network) and no ensemble
    of layers (its logistic-regression weights need out-of-distribution data).

    Computed in float64: ``x^T P x - 2 mu_c^T P x + mu_c^T P mu_c`` for every class (one
    matrix product per block of rows), then, for the nearest class, the distance again as
    ``(x - mu_c) . (P x - P mu_c)`` (no cancellation between large terms). Deterministic.
    Learned state: ``classes_``, ``means_`` ``[C, d]``, ``precision_`` ``[d, d]``.
    """

    reference: ClassVar[str] = (
        "Lee, Lee, Lee & Shin, A Simple Unified Framework for Detecting Out-of-Distribution "
        "Samples and Adversarial Attacks, NeurIPS 2018"
    )

    #: Rows scored per matrix product.
    _block_rows = 4096

    def fit(self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext):
        who = "selector 'mahalanobis'"
        check_outputs(outputs, who, min_rows=1)
        check_confidence(outputs, confidence, who)
        x = outputs.features.astype(np.float64)
        classes, inverse = np.unique(outputs.labels, return_inverse=True)
        onehot = np.zeros((len(classes), len(x)))
        onehot[inverse, np.arange(len(x))] = 1.0
        means = (onehot @ x) / onehot.sum(axis=1, keepdims=True)
        cov = EmpiricalCovariance(assume_centered=False).fit(x - means[inverse])
        self.classes_ = classes
        self.means_ = means
        self.precision_ = cov.precision_
        self.feature_dim_ = outputs.feature_dim
        return self

    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        x = _checked(self, outputs, confidence, "selector 'mahalanobis'", "precision_")
        return -mahalanobis_min(x, self.means_, self.precision_, self._block_rows)


def mahalanobis_min(x: np.ndarray, means: np.ndarray, precision: np.ndarray,
                    block: int = 4096) -> np.ndarray:
    """``min_c (x - mu_c)^T P (x - mu_c)`` for every row of ``x``, float64 ``[m]``."""
    out = np.empty(x.shape[0], dtype=np.float64)
    mp = means @ precision  # [C, d]
    mpm = np.einsum("cd,cd->c", mp, means)
    for start in range(0, x.shape[0], block):
        xb = x[start : start + block].astype(np.float64)
        xp = xb @ precision
        d2 = xp @ means.T
        d2 *= -2.0
        d2 += np.einsum("id,id->i", xp, xb)[:, None]
        d2 += mpm[None, :]
        c = np.argmin(d2, axis=1)
        out[start : start + len(xb)] = np.einsum("id,id->i", xb - means[c], xp - mp[c])
    return out


# ---------------------------------------------------------------------------- lof
class LOFSelector(Selector):
    """Local Outlier Factor (Breunig et al., SIGMOD 2000) of the embedding: score = −LOF.

    The score is scikit-learn's ``LocalOutlierFactor(novelty=True).score_samples``, minus
    the LOF of each example relative to the fitting features (about -1 inside a cluster,
    lower for outliers). ``n_neighbors`` is clamped to the number of fitting rows minus one
    (as scikit-learn does, with a warning); the learned ``n_neighbors_`` says which was
    used. ``standardize`` first scales each feature by the fitting mean and standard
    deviation (off by default: LOF compares local densities, and standardising a 2,048-d
    embedding inflates its nearly constant features). Deterministic. Learned state:
    ``lof_``, ``scaler_`` (or None).
    """

    reference: ClassVar[str] = (
        "Breunig, Kriegel, Ng & Sander, LOF: Identifying Density-Based Local Outliers, "
        "SIGMOD 2000"
    )

    def __init__(
        self,
        n_neighbors: Annotated[int, Field(
            ge=1, description="neighbours of the local density (clamped to fitting rows - 1)"
        ), Tune.int(5, 50)] = 20,
        metric: Annotated[Literal["euclidean", "manhattan", "cosine"], Field(
            description="distance between feature vectors")] = "euclidean",
        standardize: Annotated[bool, Field(
            description="standardise each feature (fitting mean and std) first")] = False,
    ) -> None:
        self.n_neighbors = n_neighbors
        self.metric = metric
        self.standardize = standardize

    def fit(self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext):
        who = "selector 'lof'"
        check_outputs(outputs, who, min_rows=2)
        check_confidence(outputs, confidence, who)
        x = outputs.features.astype(np.float64)
        self.scaler_ = StandardScaler().fit(x) if self.standardize else None
        if self.scaler_ is not None:
            x = self.scaler_.transform(x)
        self.n_neighbors_ = min(self.n_neighbors, len(x) - 1)
        self.lof_ = LocalOutlierFactor(
            n_neighbors=self.n_neighbors_, metric=self.metric, novelty=True
        ).fit(x)
        self.feature_dim_ = outputs.feature_dim
        return self

    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        x = _checked(self, outputs, confidence, "selector 'lof'", "lof_").astype(np.float64)
        if self.scaler_ is not None:
            x = self.scaler_.transform(x)
        return self.lof_.score_samples(x).astype(np.float64)


# ---------------------------------------------------------------------------- kde
class KDESelector(Selector):
    """Kernel density estimate (Parzen, 1962): log density of the standardised, PCA-reduced input.

    The features are standardised (fitting mean and standard deviation); with
    ``n_components`` they are then projected on their first principal components and each
    component is scaled to unit variance (whitened), because a kernel density in a 2,048-d
    embedding is degenerate: with a few thousand fitting points every example is far from
    all of them, the density is dominated by its single nearest point and the bandwidth
    rules break down (Silverman, 1986, Table 4.2: a 10% relative error at the mode of a
    normal density needs about 800 points in 5 dimensions and 44,000 in 8). The default, 5
    components, suits the 500-2,000 fitting rows of a selective-recalibration split.
    ``n_components`` is clamped to the fitting rows minus one and the feature width (the
    learned ``n_components_``); None keeps every standardised feature.

    The density is scikit-learn's ``KernelDensity(kernel, bandwidth).score_samples`` (exact:
    ``atol = rtol = 0``); ``bandwidth`` is a positive number or scikit-learn's rule,
    ``"scott"`` (``n^(-1/(d+4))``) or ``"silverman"``, of the (whitened, unit-variance) data.
    The PCA's randomised solver (used for large inputs) is seeded by ``context.seed``.
    Learned state: ``scaler_``, ``pca_`` and ``whiten_`` (or None), ``kde_``.
    """

    reference: ClassVar[str] = (
        "Parzen, On Estimation of a Probability Density Function and Mode, Annals of "
        "Mathematical Statistics 1962"
    )

    def __init__(
        self,
        bandwidth: Annotated[Literal["scott", "silverman"] | PositiveFloat, Field(
            description="kernel bandwidth: a positive number, 'scott' or 'silverman'")
        ] = "scott",
        kernel: Annotated[Literal["gaussian", "exponential"], Field(
            description="kernel of scikit-learn's KernelDensity (those of unbounded support, "
                        "so that every example gets a finite log density)")] = "gaussian",
        n_components: Annotated[int | None, Field(
            ge=1, description="principal components kept (whitened) before the density; "
                              "None: all standardised features")] = 5,
    ) -> None:
        self.bandwidth = bandwidth
        self.kernel = kernel
        self.n_components = n_components

    def fit(self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext):
        who = "selector 'kde'"
        check_outputs(outputs, who, min_rows=2)
        check_confidence(outputs, confidence, who)
        x = outputs.features.astype(np.float64)
        self.scaler_ = StandardScaler().fit(x)
        x = self.scaler_.transform(x)
        self.pca_ = self.whiten_ = None
        self.n_components_ = x.shape[1]
        if self.n_components is not None:
            self.n_components_ = max(1, min(self.n_components, len(x) - 1, x.shape[1]))
            self.pca_ = PCA(n_components=self.n_components_,
                            random_state=int(context.seed) % (2**32)).fit(x)
            x = self.pca_.transform(x)
            self.whiten_ = StandardScaler().fit(x)  # unit variance; a constant one stays
            x = self.whiten_.transform(x)
        self.kde_ = KernelDensity(kernel=self.kernel, bandwidth=self.bandwidth).fit(x)
        self.feature_dim_ = outputs.feature_dim
        return self

    def _transform(self, x: np.ndarray) -> np.ndarray:
        x = self.scaler_.transform(x)
        if self.pca_ is not None:
            x = self.whiten_.transform(self.pca_.transform(x))
        return x

    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        x = _checked(self, outputs, confidence, "selector 'kde'", "kde_").astype(np.float64)
        return self.kde_.score_samples(self._transform(x)).astype(np.float64)


