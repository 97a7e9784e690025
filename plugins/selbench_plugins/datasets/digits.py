"""``digits``: real handwritten digits with CIFAR-10-C-style corruptions, nothing to download.

The images are scikit-learn's bundled copy of the UCI optical recognition of handwritten
digits test set (``sklearn.datasets.load_digits``): 1797 grey-level 8x8 images of the digits
0-9 written by 43 people, about 180 per class. They are split (seeded, stratified by class)
into

* ``train``: what an in-process backbone (``digits-net``) is trained on;
* ``val``: clean held-out data, the usual fitting split for selectors and recalibrators;
* ``test``: clean held-out data (in-distribution evaluation);
* ``shifted``: the ``test`` images under corruptions at graded severities, in the spirit of
  CIFAR-100-C (Hendrycks & Dietterich, 2019), the target of the paper's out-of-distribution
  experiments (Section 4.2: fit on clean validation data, evaluate on corrupted test data);
* ``shifted_val``: the ``val`` images under the same corruptions, for experiments that fit on
  shifted data.

In the shifted splits every (corruption, severity) pair is a *domain*: ``shifted_per_domain``
source images are drawn (seeded, without replacement) for each pair and corrupted, so each
domain has the same number of examples (``None`` uses every source image for every pair,
e.g. 539 x 6 x 5 = 16 170 examples for ``shifted``). Domain ids are the same in every split
and do not depend on which corruptions are enabled: 0 is ``clean`` and
``1 + 5·c + (s − 1)`` is corruption ``c`` of :data:`CORRUPTIONS` at severity ``s``;
``SplitData.meta["domains"]`` names every id.

Inputs are float32 ``[N, 1, 8, 8]`` in ``[0, 1]`` (the original 0-16 grey levels divided by
16); labels are the digits. Corruptions (see :func:`corrupt`), with their five severities:

==================  ==========================================================================
``gaussian_noise``  add N(0, s²) per pixel, s = 0.08, 0.16, 0.24, 0.32, 0.40; clip to [0, 1]
``shot_noise``      Poisson photon noise: Poisson(λ·x)/λ, λ = 30, 15, 8, 4, 2 photons at full
                    intensity (fewer photons = noisier); clip to [0, 1]
``gaussian_blur``   Gaussian filter with σ = 0.5, 0.7, 0.9, 1.1, 1.4 pixels (zero padding)
``rotation``        rotate about the centre by ±10, 20, 30, 40, 55 degrees (sign drawn per
                    image), bilinear, zero fill
``contrast``        pull each pixel towards the image mean: m + c·(x − m),
                    c = 0.55, 0.4, 0.3, 0.2, 0.12
``impulse_noise``   salt-and-pepper: each pixel is set to 0 or 1 (equal odds) with probability
                    a = 0.03, 0.06, 0.10, 0.15, 0.22
``occlusion``       a square patch of side 2, 3, 4, 5, 6 pixels set to 0 (cutout, DeVries &
                    Taylor 2017), its position drawn uniformly per image inside the 8x8 image
                    (about 6, 14, 25, 39, 56 % of the pixels); **not in the default set**
==================  ==========================================================================

``occlusion`` was added after the first six and is last in :data:`CORRUPTIONS`, so the domain
ids of the others did not move (occlusion at severity ``s`` is domain ``30 + s``), and it is
enabled only when named (``corruptions: [occlusion]``): the default ``corruptions`` are
:data:`DEFAULT_CORRUPTIONS`, the first six, and the default splits are byte for byte those
of the releases before it (``tests/test_digits.py`` pins their digests).

One experiment per corruption family and severity group is the ``shifted`` split restricted
with these parameters, e.g. ``params: {seed: 0, corruptions: [rotation], severities: [3, 4],
shifted_per_domain: null}`` (every ``test`` image, rotated, at severities 3 and 4).

Every random corruption draws from its own stream seeded by (``seed``, split, corruption,
severity), so a domain's images do not change when other corruptions are switched off.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import AfterValidator, Field
from selbench.contract.api import Dataset, Plugin, SplitData

__all__ = ["CORRUPTIONS", "DEFAULT_CORRUPTIONS", "PLUGIN", "SEVERITY_LEVELS", "Digits", "corrupt"]

#: every corruption, in the order that defines the domain ids (new ones are appended)
CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise",
    "shot_noise",
    "gaussian_blur",
    "rotation",
    "contrast",
    "impulse_noise",
    "occlusion",
)
#: the corruptions of the shifted splits unless ``corruptions`` names others: the first six
#: (``occlusion`` came later and is enabled only when named, so default outputs stay the same)
DEFAULT_CORRUPTIONS: tuple[str, ...] = CORRUPTIONS[:6]
#: the parameter of each corruption at severities 1..5
SEVERITY_LEVELS: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.08, 0.16, 0.24, 0.32, 0.40),  # noise std
    "shot_noise": (30, 15, 8, 4, 2),  # photons at full intensity
    "gaussian_blur": (0.5, 0.7, 0.9, 1.1, 1.4),  # filter std in pixels
    "rotation": (10, 20, 30, 40, 55),  # degrees
    "contrast": (0.55, 0.4, 0.3, 0.2, 0.12),  # kept fraction of the deviation from the mean
    "impulse_noise": (0.03, 0.06, 0.10, 0.15, 0.22),  # fraction of pixels replaced
    "occlusion": (2, 3, 4, 5, 6),  # side of the zeroed square patch in pixels
}
_SPLIT_CODES = {"train": 0, "val": 1, "test": 2, "shifted": 3, "shifted_val": 4}


def domain_id(corruption: str, severity: int) -> int:
    """The domain id of ``corruption`` at ``severity`` (0 is reserved for clean images)."""
    return 1 + 5 * CORRUPTIONS.index(corruption) + (severity - 1)


def domain_names() -> list[str]:
    """Names of every domain id: ``["clean", "gaussian_noise-1", ...]``."""
    return ["clean"] + [f"{c}-{s}" for c in CORRUPTIONS for s in range(1, 6)]


# ---------------------------------------------------------------------------- corruptions
def corrupt(
    images: np.ndarray, corruption: str, severity: int, rng: np.random.Generator
) -> np.ndarray:
    """Apply ``corruption`` at ``severity`` (1-5) to float images ``[N, H, W]`` in [0, 1].

    Returns a new float32 array in [0, 1]; ``images`` is not modified. ``rng`` drives the
    random corruptions (noise, rotation sign); see the module docstring for each level.
    """
    if corruption not in SEVERITY_LEVELS:
        raise ValueError(f"unknown corruption {corruption!r}; available: {list(CORRUPTIONS)}")
    if severity not in range(1, 6):
        raise ValueError(f"severity must be an integer in 1..5, got {severity!r}")
    x = np.asarray(images, dtype=np.float64)
    if x.ndim != 3:
        raise ValueError(f"images: expected shape [N, H, W], got {x.shape}")
    level = SEVERITY_LEVELS[corruption][severity - 1]
    if corruption == "gaussian_noise":
        out = x + level * rng.standard_normal(x.shape)
    elif corruption == "shot_noise":
        out = rng.poisson(np.clip(x, 0, 1) * level) / level
    elif corruption == "gaussian_blur":
        from scipy.ndimage import gaussian_filter

        out = gaussian_filter(x, sigma=(0, level, level), mode="constant", cval=0.0)
    elif corruption == "rotation":
        signs = np.where(rng.random(len(x)) < 0.5, -1.0, 1.0)
        out = _rotate(x, np.deg2rad(level) * signs)
    elif corruption == "contrast":
        mean = x.mean(axis=(1, 2), keepdims=True)
        out = mean + level * (x - mean)
    elif corruption == "impulse_noise":
        hit = rng.random(x.shape) < level
        salt = rng.random(x.shape) < 0.5
        out = np.where(hit, salt.astype(np.float64), x)
    else:  # occlusion
        out = np.where(_patch_mask(x.shape, int(level), rng), 0.0, x)
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def _patch_mask(shape: tuple[int, ...], side: int, rng: np.random.Generator) -> np.ndarray:
    """Boolean ``[N, H, W]``: one ``side`` x ``side`` square per image, placed uniformly
    (every position keeping the square inside the image equally likely)."""
    n, h, w = shape
    top = rng.integers(0, h - side + 1, size=n)[:, None]
    left = rng.integers(0, w - side + 1, size=n)[:, None]
    rows = (np.arange(h) >= top) & (np.arange(h) < top + side)  # [N, H]
    cols = (np.arange(w) >= left) & (np.arange(w) < left + side)  # [N, W]
    return rows[:, :, None] & cols[:, None, :]


def _rotate(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Rotate each image ``x[i]`` by ``angles[i]`` radians about its centre (bilinear)."""
    from scipy.ndimage import map_coordinates

    n, h, w = x.shape
    rr, cc = np.meshgrid(np.arange(h) - (h - 1) / 2, np.arange(w) - (w - 1) / 2, indexing="ij")
    cos, sin = np.cos(angles)[:, None, None], np.sin(angles)[:, None, None]
    # output pixel (r, c) samples the input at the inversely rotated position
    src_r = cos * rr + sin * cc + (h - 1) / 2
    src_c = -sin * rr + cos * cc + (w - 1) / 2
    src_n = np.broadcast_to(np.arange(n)[:, None, None], src_r.shape)
    coords = np.stack([src_n, src_r, src_c])
    return map_coordinates(x, coords, order=1, mode="constant", cval=0.0)


# ---------------------------------------------------------------------------- dataset
def _fractions(v: tuple[float, float, float]) -> tuple[float, float, float]:
    if any(f <= 0 for f in v) or abs(sum(v) - 1.0) > 1e-6:
        raise ValueError(f"split_fractions must be three positive numbers summing to 1, got {v}")
    return v


def _corruptions(v: list[str]) -> list[str]:
    bad = [c for c in v if c not in CORRUPTIONS]
    if bad:
        raise ValueError(f"unknown corruption(s) {bad}; available: {', '.join(CORRUPTIONS)}")
    if not v or len(set(v)) != len(v):
        raise ValueError("corruptions must be a non-empty list without repeats, a subset of "
                         f"{', '.join(CORRUPTIONS)}")
    return v


def _severities(v: list[int]) -> list[int]:
    if not v or any(s not in range(1, 6) for s in v) or len(set(v)) != len(v):
        raise ValueError(f"severities must be distinct integers among 1, 2, 3, 4, 5, got {v}")
    return v


class Digits(Dataset):
    """Handwritten 8x8 digits (scikit-learn's bundled copy) with graded corruptions.

    Splits ``train``, ``val``, ``test`` (clean, domain 0) and ``shifted`` / ``shifted_val``
    (corrupted ``test`` / ``val`` images, one domain per corruption and severity). Inputs are
    float32 ``[N, 1, 8, 8]`` in [0, 1]. See the module docstring for the corruptions.
    """

    num_classes = 10
    input_kind = "image-array"  # float images [N, 1, 8, 8]

    def __init__(
        self,
        split_fractions: Annotated[tuple[float, float, float], AfterValidator(_fractions), Field(
            description="fractions of the 1797 images in train / val / test (stratified, "
            "seeded)",
        )] = (0.4, 0.3, 0.3),
        seed: Annotated[int, Field(
            ge=0, description="seed of the split and of every corruption")] = 0,
        corruptions: Annotated[list[str], AfterValidator(_corruptions), Field(
            description=f"corruptions in the shifted splits, a subset of {list(CORRUPTIONS)} "
            "(default: all but occlusion)",
        )] = list(DEFAULT_CORRUPTIONS),  # noqa: B006 - parameters are never mutated
        severities: Annotated[list[int], AfterValidator(_severities), Field(
            description="severities (1-5) in the shifted splits",
        )] = [1, 2, 3, 4, 5],  # noqa: B006 - parameters are never mutated
        shifted_per_domain: Annotated[int | None, Field(
            ge=1, description="source images drawn per (corruption, severity) in the shifted "
            "splits (capped at the source split's size); null uses every image for every pair",
        )] = 100,
    ):
        self.split_fractions = split_fractions
        self.seed = seed
        self.corruptions = corruptions
        self.severities = severities
        self.shifted_per_domain = shifted_per_domain
        self._cache: dict[str, SplitData] = {}
        self._base: dict[str, tuple[np.ndarray, np.ndarray]] | None = None

    def splits(self) -> list[str]:
        return ["train", "val", "test", "shifted", "shifted_val"]

    def split(self, name: str) -> SplitData:
        if name not in _SPLIT_CODES:
            raise ValueError(f"unknown split {name!r} of digits; available: {self.splits()}")
        if name not in self._cache:
            self._cache[name] = self._make(name)
        return self._cache[name]

    def split_sizes(self) -> dict[str, int]:
        """From the class counts alone (the cuts of :meth:`_clean_splits`), no image read."""
        from sklearn.datasets import load_digits

        counts = np.bincount(load_digits().target, minlength=self.num_classes)
        cum = np.cumsum(self.split_fractions)
        sizes = dict.fromkeys(("train", "val", "test"), 0)
        for n in counts:
            cuts = np.round(cum[:2] * n).astype(int)
            for name, size in zip(sizes, np.diff([0, *cuts, n])):
                sizes[name] += int(size)
        pairs = len(self.corruptions) * len(self.severities)  # as _make iterates them
        for name, src in (("shifted", "test"), ("shifted_val", "val")):
            per = sizes[src] if self.shifted_per_domain is None else min(
                self.shifted_per_domain, sizes[src])
            sizes[name] = per * pairs
        return sizes

    # ------------------------------------------------------------------ internals
    def _clean_splits(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        if self._base is None:
            from sklearn.datasets import load_digits

            bunch = load_digits()
            images = (bunch.images / 16.0).astype(np.float32)
            labels = bunch.target.astype(np.int64)
            rng = np.random.default_rng([self.seed, 1000])
            parts: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
            cum = np.cumsum(self.split_fractions)
            for k in range(self.num_classes):
                idx = rng.permutation(np.flatnonzero(labels == k))
                cuts = np.round(cum[:2] * len(idx)).astype(int)
                for name, chunk in zip(parts, np.split(idx, cuts)):
                    parts[name].append(chunk)
            self._base = {}
            for name, chunks in parts.items():
                idx = np.sort(np.concatenate(chunks))
                self._base[name] = (images[idx], labels[idx])
        return self._base

    def _meta(self) -> dict:
        names = domain_names()
        return {
            "domains": names,
            "domain_corruption": ["clean"] + [c for c in CORRUPTIONS for _ in range(5)],
            "domain_severity": [0] + [s for _ in CORRUPTIONS for s in range(1, 6)],
            "image_shape": [1, 8, 8],
        }

    def _make(self, name: str) -> SplitData:
        base = self._clean_splits()
        class_names = [str(k) for k in range(self.num_classes)]
        if name in base:
            images, labels = base[name]
            return SplitData(
                inputs=images[:, None].copy(),
                labels=labels.copy(),
                domain=np.zeros(len(labels), dtype=np.int64),
                class_names=class_names,
                meta=self._meta(),
            )
        src_images, src_labels = base["test" if name == "shifted" else "val"]
        n_src = len(src_labels)
        per = n_src if self.shifted_per_domain is None else min(self.shifted_per_domain, n_src)
        xs, ys, ds = [], [], []
        for corruption in self.corruptions:
            for severity in sorted(self.severities):
                d = domain_id(corruption, severity)
                rng = np.random.default_rng([self.seed, _SPLIT_CODES[name], d])
                idx = np.sort(rng.choice(n_src, size=per, replace=False))
                xs.append(corrupt(src_images[idx], corruption, severity, rng))
                ys.append(src_labels[idx])
                ds.append(np.full(per, d, dtype=np.int64))
        return SplitData(
            inputs=np.concatenate(xs)[:, None],
            labels=np.concatenate(ys),
            domain=np.concatenate(ds),
            class_names=class_names,
            meta=self._meta(),
        )


PLUGIN = Plugin(
    "digits",
    Digits,
    summary="scikit-learn's 8x8 handwritten digits, clean splits + CIFAR-C-style corrupted splits",
)
