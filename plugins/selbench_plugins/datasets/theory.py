"""The paper's theoretical model (Section 5, Appendix C) as a benchmark dataset.

``theory-mixture`` samples the *(θ*, σ, α, r1, r2)-perturbed truncated Gaussian mixture* of
Definition 1 (formal version in Appendix C) on which the paper proves that neither
temperature scaling alone nor selection alone can reach zero calibration error, while
rejecting the outlier component and fitting a temperature on the rest can (Theorem 1).

For a label ``y ∈ {−1, +1}`` (uniform) and a component indicator ``z ~ Bernoulli(mix)``:

* ``z = 1`` (main component J1): ``x ~ N(y·θ*, σ²I)`` truncated to ``A = B(θ*, r1) ∪ B(−θ*, r1)``;
* ``z = 0`` (outlier component J2): ``x ~ N(−y·α·θ*, σ²I)`` truncated to
  ``B = B(αθ*, r2) ∪ B(−αθ*, r2)``.

As in the paper's formal definition, each component is truncated to the *union* of the two
balls of its support, for both labels: a ``y = +1`` point of J1 may land in the ball
around ``−θ*``. Because the truncation region does not depend on ``y``, the Bayes posterior is
exactly logistic in ``θ*ᵀx`` on each component (Appendix C, "ECE calculation"):

* on A: ``P(y = 1 | x) = sigmoid(2 θ*ᵀx / σ²)``,
* on B: ``P(y = 1 | x) = sigmoid(−2 α θ*ᵀx / σ²)`` (the outliers' labels point the other way),

which :meth:`TheoryMixture.posterior` returns. The pretraining split ``train`` is the
*unperturbed* mixture ``x | y ~ N(y·θ*, σ²I)`` (no truncation, no outliers), from which the
``theory-linear`` backbone estimates ``θ̂ = mean(x·y)``.

Default parameters and why (figures from ``θ̂`` fitted on ``m = 10 000`` pretraining points,
temperatures fitted by NLL on ``val``, ECE1 with 15 equal-mass bins on ``test``):

* ``dim = 2``, ``theta_norm = 2``, ``alpha = 0.45``, ``r1 = r2 = 0.5``: the four balls are
  disjoint (``(1 − α)‖θ*‖ = 1.1 > r1 + r2``, ``α‖θ*‖ = 0.9 > r2``) and rejection sampling
  accepts about 3% of proposals (milliseconds). Equal radii give the paper's
  simplification ``ρ1 = ρ2`` (equal truncation mass of the two components).
* ``sigma = 2`` (= ``theta_norm``): the classes overlap, so the Bayes posterior on J1,
  ``sigmoid(θ*ᵀx/2)``, is far from 0/1 (accuracy ≈ 0.87 on J1) and temperature has something
  to calibrate. The pretrained score ``sigmoid(2θ̂ᵀx)`` is calibrated only when ``σ = 1``;
  with ``σ = 2`` it is *over*-confident by a factor ``T0 = σ²‖θ̂‖²/θ̂ᵀθ* ≈ 4`` on J1
  (confidence ≈ 1.0 for accuracy ≈ 0.87). The paper's proofs take σ small instead (an
  under-confident model); both regimes satisfy what Theorem 1 needs, ``T0 ≠ 1`` and outliers
  whose labels point the other way. Everything but the model's confidence is invariant
  to scaling ``theta_norm``, ``sigma``, ``r1``, ``r2`` together.
* ``alpha = 0.45`` (the paper asks ``α < 1/2``): outliers sit at ``−y·0.45·θ*``; they are
  correct ≈ 40% of the time while the model gives them ≈ 0.96 confidence (confidently wrong),
  and their ideal "temperature" is negative, so no single temperature serves both components.
* ``mix = 0.8``: 20% outliers, so ``β = 0.8`` is the coverage at which the oracle selector
  rejects exactly the outlier component (Theorem 2 also asks ``β > 2(1 − β)``).
* ``test_size = 10 000``: keeps the binned-ECE noise floor near 0.01.

With these defaults (checked in ``tests/test_theory.py``) ECE1 on ``test`` is ≈ 0.21 raw,
≈ 0.08 with a temperature fitted on all of ``val`` (no temperature does better than ≈ 0.06),
≈ 0.13 with oracle selection only (reject J2, no recalibration), and ≈ 0.01 with oracle
selection plus a temperature fitted on the accepted part of ``val`` (``T ≈ T0``): Theorem 1.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator
from selbench.contract.api import Dataset, Params, Plugin, SplitData

__all__ = ["PLUGIN", "TheoryMixture"]

_SPLIT_OFFSETS = {"train": 0, "val": 1, "test": 2}
#: proposals per accepted sample above which rejection sampling is refused
_MAX_PROPOSALS_PER_SAMPLE = 2_000


class _DisjointSupports(Params):
    """The four balls of Definition 1 must be disjoint."""

    @model_validator(mode="after")
    def _disjoint_supports(self) -> _DisjointSupports:
        n, a = self.theta_norm, self.alpha
        if 2 * n <= 2 * self.r1:
            raise ValueError(
                f"r1={self.r1} must be below theta_norm={n} so that B(θ*, r1) and "
                "B(−θ*, r1) are disjoint"
            )
        if 2 * a * n <= 2 * self.r2:
            raise ValueError(
                f"r2={self.r2} must be below alpha·theta_norm={a * n:g} so that B(αθ*, r2) and "
                "B(−αθ*, r2) are disjoint"
            )
        if abs(1 - a) * n <= self.r1 + self.r2:
            raise ValueError(
                f"r1 + r2 = {self.r1 + self.r2:g} must be below |1 − alpha|·theta_norm = "
                f"{abs(1 - a) * n:g} so that the supports of J1 and J2 are disjoint"
            )
        return self


class TheoryMixture(Dataset):
    """The perturbed truncated Gaussian mixture of the paper's theory (Definition 1).

    Splits: ``train`` (the unperturbed pretraining mixture, ``train_size`` points, no domain),
    ``val`` (fitting) and ``test`` (evaluation), both from the perturbed target mixture with
    ``domain`` = 0 for the main component J1 and 1 for the outlier component J2. Labels are
    classes ``{0, 1}`` with 0 ↔ y = −1 and 1 ↔ y = +1; inputs are float32 ``[N, dim]``.
    Every split is sampled from its own seeded stream, so it does not depend on the sizes of
    the others.
    """

    num_classes = 2
    input_kind = "vectors"  # float32 [N, dim]
    params_base = _DisjointSupports

    def __init__(
        self,
        dim: Annotated[int, Field(ge=1, description="dimension p of x")] = 2,
        theta_norm: Annotated[float, Field(
            gt=0, description="‖θ*‖, the norm of the class-mean vector")] = 2.0,
        theta_direction: Annotated[Literal["e1", "random"], Field(
            description="θ* = theta_norm·e1, or theta_norm times a seeded random unit vector",
        )] = "e1",
        sigma: Annotated[float, Field(
            gt=0, description="standard deviation σ of both components")] = 2.0,
        alpha: Annotated[float, Field(
            gt=0, description="outlier scale α: J2 is centred at −y·α·θ* (the paper uses α<1/2)",
        )] = 0.45,
        r1: Annotated[float, Field(
            gt=0, description="radius of the balls ±θ* truncating J1")] = 0.5,
        r2: Annotated[float, Field(
            gt=0, description="radius of the balls ±αθ* truncating J2")] = 0.5,
        mix: Annotated[float, Field(
            ge=0, le=1, description="β: probability of the main component J1 (z = 1)")] = 0.8,
        train_size: Annotated[int, Field(
            ge=2, description="m: size of the unperturbed pretraining split 'train'")] = 10_000,
        val_size: Annotated[int, Field(
            ge=1, description="size of the 'val' (fitting) split")] = 2_000,
        test_size: Annotated[int, Field(
            ge=1, description="size of the 'test' (evaluation) split")] = 10_000,
        seed: Annotated[int, Field(
            ge=0, description="seed of θ*'s direction and of every split")] = 0,
    ):
        self.dim = dim
        self.theta_norm = theta_norm
        self.theta_direction = theta_direction
        self.sigma = sigma
        self.alpha = alpha
        self.r1 = r1
        self.r2 = r2
        self.mix = mix
        self.train_size = train_size
        self.val_size = val_size
        self.test_size = test_size
        self.seed = seed
        self._cache: dict[str, SplitData] = {}

    # ------------------------------------------------------------------ model
    @property
    def theta_star(self) -> np.ndarray:
        """θ*, the class-mean vector: ``theta_norm`` times e1 or a seeded random direction."""
        return self._theta_star()

    def _theta_star(self) -> np.ndarray:
        if self.theta_direction == "e1":
            u = np.zeros(self.dim)
            u[0] = 1.0
        else:
            u = np.random.default_rng([self.seed, 99]).standard_normal(self.dim)
            u /= np.linalg.norm(u)
        return self.theta_norm * u

    def posterior(self, x: np.ndarray) -> np.ndarray:
        """Bayes probability ``P(y = +1 | x)`` under the target mixture, float64 ``[N]``.

        ``sigmoid(2θ*ᵀx/σ²)`` on the main support A, ``sigmoid(−2αθ*ᵀx/σ²)`` on the outlier
        support B; ``nan`` outside both (probability zero under the target).
        """
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x: expected shape [N, {self.dim}], got {x.shape}")
        s = x @ self.theta_star / self.sigma**2
        in_a = self._in_balls(x, self.theta_star, self.r1)
        in_b = self._in_balls(x, self.alpha * self.theta_star, self.r2)
        out = np.full(len(x), np.nan)
        out[in_a] = _sigmoid(2 * s[in_a])
        out[in_b] = _sigmoid(-2 * self.alpha * s[in_b])
        return out

    def optimal_temperature(self, theta_hat: np.ndarray) -> float:
        """``T0 = σ²‖θ̂‖² / θ̂ᵀθ*``: the temperature that calibrates ``sigmoid(2θ̂ᵀx/T)`` on J1
        (Appendix C, "Selective Re-calibration")."""
        theta_hat = np.asarray(theta_hat, dtype=np.float64)
        return float(self.sigma**2 * theta_hat @ theta_hat / (theta_hat @ self.theta_star))

    @staticmethod
    def _in_balls(x: np.ndarray, centre: np.ndarray, radius: float) -> np.ndarray:
        d_plus = np.linalg.norm(x - centre, axis=1)
        d_minus = np.linalg.norm(x + centre, axis=1)
        return np.minimum(d_plus, d_minus) <= radius

    def _truncated(
        self, rng: np.random.Generator, means: np.ndarray, centre: np.ndarray, radius: float
    ) -> np.ndarray:
        """One draw of ``N(means[i], σ²I)`` truncated to ``B(centre, r) ∪ B(−centre, r)`` per
        row, by vectorised rejection sampling."""
        n = len(means)
        out = np.empty((n, self.dim))
        todo = np.arange(n)
        proposals = 0
        while todo.size:
            if proposals > _MAX_PROPOSALS_PER_SAMPLE * n:
                raise ValueError(
                    f"rejection sampling accepts too few proposals (radius {radius:g} vs "
                    f"sigma·sqrt(dim) = {self.sigma * np.sqrt(self.dim):.3g}); increase r1/r2 or "
                    "sigma, or lower dim"
                )
            # propose a few times per pending row so that few loops are needed
            reps = 8
            idx = np.repeat(todo, reps)
            prop = means[idx] + self.sigma * rng.standard_normal((idx.size, self.dim))
            proposals += idx.size
            ok = self._in_balls(prop, centre, radius)
            # first accepted proposal of each pending row
            acc_rows, first = np.unique(idx[ok], return_index=True)
            out[acc_rows] = prop[ok][first]
            todo = np.setdiff1d(todo, acc_rows, assume_unique=True)
        return out

    def _sample_target(self, n: int, rng: np.random.Generator):
        y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
        z = rng.random(n) < self.mix
        x = np.empty((n, self.dim))
        main = np.flatnonzero(z)
        out = np.flatnonzero(~z)
        if main.size:
            means = y[main, None] * self.theta_star
            x[main] = self._truncated(rng, means, self.theta_star, self.r1)
        if out.size:
            means = -self.alpha * y[out, None] * self.theta_star
            x[out] = self._truncated(rng, means, self.alpha * self.theta_star, self.r2)
        return x, y, z

    # ------------------------------------------------------------------ Dataset API
    def splits(self) -> list[str]:
        return ["train", "val", "test"]

    def split_sizes(self) -> dict[str, int]:
        return {"train": self.train_size, "val": self.val_size, "test": self.test_size}

    def split(self, name: str) -> SplitData:
        if name not in _SPLIT_OFFSETS:
            raise ValueError(
                f"unknown split {name!r} of theory-mixture; available: {self.splits()}"
            )
        if name not in self._cache:
            self._cache[name] = self._make(name)
        return self._cache[name]

    def _make(self, name: str) -> SplitData:
        rng = np.random.default_rng([self.seed, _SPLIT_OFFSETS[name]])
        meta = {
            "theta_star": self.theta_star.tolist(),
            "sigma": self.sigma,
            "alpha": self.alpha,
        }
        if name == "train":
            n = self.train_size
            y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
            x = y[:, None] * self.theta_star + self.sigma * rng.standard_normal((n, self.dim))
            labels = (y > 0).astype(np.int64)
            return SplitData(
                inputs=x.astype(np.float32), labels=labels, class_names=["-1", "+1"], meta=meta
            )
        n = self.val_size if name == "val" else self.test_size
        x, y, z = self._sample_target(n, rng)
        meta["domains"] = ["J1 (main)", "J2 (outlier)"]
        return SplitData(
            inputs=x.astype(np.float32),
            labels=(y > 0).astype(np.int64),
            domain=np.where(z, 0, 1).astype(np.int64),
            class_names=["-1", "+1"],
            meta=meta,
        )


def _sigmoid(t: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * t))


PLUGIN = Plugin(
    "theory-mixture",
    TheoryMixture,
    summary="The paper's perturbed truncated Gaussian mixture (Section 5): J1 main + J2 outliers",
)
