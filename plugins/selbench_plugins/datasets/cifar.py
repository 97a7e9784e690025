"""``cifar100`` and ``cifar100-c``: the paper's CIFAR-100 → CIFAR-100-C shift experiment.

* ``cifar100`` — CIFAR-100 (Krizhevsky, 2009) from the official python release
  (``root/cifar-100-python/{train,test,meta}``), splits ``train`` (50,000) and ``test``
  (10,000).
* ``cifar100-c`` — the paper's setting in one dataset: split ``val`` is clean CIFAR-100
  (the fitting data; by default a seeded 10,000 of the *training* images, so that no
  fitted image reappears, corrupted, in the evaluation data), and split ``test`` is a
  seeded sample of ``n`` images (50,000 by default, as in the paper) from the 750,000 of
  CIFAR-100-C (Hendrycks & Dietterich, 2019): 15 corruptions × 5 severities × the 10,000
  test images. The domain of a test image is its (corruption, severity) pair, with id
  ``5·corruption_index + severity − 1`` and names ``"<corruption>-<severity>"`` in
  ``meta["domains"]``.

CIFAR-100-C release layout (``root``): ``<corruption>.npy`` uint8 ``[50000, 32, 32, 3]``
— severities 1..5 stacked, 10,000 images each — and ``labels.npy`` ``[50000]``. The files
are memory-mapped and only the sampled rows are read.

AugMix (Hendrycks et al., 2020; the paper augments the CIFAR-100 fitting data with severity
3, mixture width 3) is applied to the splits listed in ``augmix_splits``; each image gets one
augmented view, deterministic given ``augmix_seed`` and its index.

Items are uint8 ``[3, 32, 32]`` tensors; the backbone resizes and normalises on the device.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, Field, model_validator
from selbench.contract.api import Dataset, Params, Plugin, SplitData
from selbench.contract.inputs import InputDir
from selbench.contract.vision import ArrayImages, ImageItems, augmix_transform, require

__all__ = [
    "CIFAR100",
    "CIFAR100C",
    "CIFAR100_CLASSES",
    "CIFAR100_C_CORRUPTIONS",
    "PLUGINS",
]

CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
CIFAR100_C_URL = "https://zenodo.org/records/3555552 (CIFAR-100-C.tar)"

#: the 15 corruptions of the CIFAR-100-C benchmark (the release adds 4 "extra" ones:
#: speckle_noise, gaussian_blur, spatter, saturate — name them in ``corruptions`` to use them)
CIFAR100_C_CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur",
    "motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast",
    "elastic_transform", "pixelate", "jpeg_compression",
)  # fmt: skip

#: CIFAR-100's fine labels in label order (as in the release's ``meta`` file)
CIFAR100_CLASSES: tuple[str, ...] = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle",
    "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle",
    "caterpillar", "cattle", "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch",
    "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish", "forest", "fox",
    "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion",
    "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain", "mouse", "mushroom",
    "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree",
    "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road",
    "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake",
    "spider", "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank",
    "telephone", "television", "tiger", "tractor", "train", "trout", "tulip", "turtle",
    "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
)  # fmt: skip


#: The AugMix parameters of both datasets (declared last in each).
AugmixSplits = Annotated[list[str], Field(
    description="splits whose images are AugMix-augmented (paper: the fitting split)",
)]
AugmixSeverity = Annotated[int, Field(ge=1, le=10, description="AugMix severity (paper: 3)")]
AugmixWidth = Annotated[int, Field(ge=1, description="AugMix mixture width (paper: 3)")]
AugmixSeed = Annotated[int, Field(ge=0, description="seed of the augmentation")]


#: the official release's files, hashed by content in the input digest (the labels live in
#: the pickles); other files (e.g. the downloaded .tar.gz) enter it by name and size
CIFAR100_FILES = ("cifar-100-python/train", "cifar-100-python/test", "cifar-100-python/meta")

#: a CIFAR-100 python-release folder; ``download: true`` may create it, so it need not exist
CIFAR100Root = InputDir(metadata=CIFAR100_FILES, must_exist=False)



# --------------------------------------------------------------------------- reading
def _cifar_dir(root: str | Path) -> Path:
    return Path(root) / "cifar-100-python"


def _ensure_cifar(root: str | Path, download: bool, files=("train", "test", "meta")) -> Path:
    d = _cifar_dir(root)
    missing = [f for f in files if not (d / f).is_file()]
    if missing and download:
        datasets = require("torchvision.datasets", "downloading CIFAR-100")
        datasets.CIFAR100(str(root), train=True, download=True)
        missing = [f for f in files if not (d / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"CIFAR-100 not found: {d / missing[0]} does not exist. selbench never downloads "
            f"on its own: download {CIFAR100_URL} (161 MB) and extract it into {root} (it "
            f"creates cifar-100-python/), or set the dataset's param download: true."
        )
    return d


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for ``bytes`` (latin-1 only)."""
    if not isinstance(text, str) or encoding.replace("-", "").lower() != "latin1":
        raise pickle.UnpicklingError(f"_codecs.encode({type(text).__name__}, {encoding!r})")
    return text.encode("latin1")


def _numpy_reconstructors() -> dict[tuple[str, str], object]:
    """numpy's array reconstruction functions under their numpy 1 and numpy 2 paths."""
    core = getattr(np, "_core", None) or np.core
    allowed: dict[tuple[str, str], object] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1_encode,
    }
    for mod in ("numpy.core", "numpy._core"):
        allowed[(f"{mod}.multiarray", "_reconstruct")] = core.multiarray._reconstruct
        frombuffer = getattr(core.numeric, "_frombuffer", None)
        if frombuffer is not None:
            allowed[(f"{mod}.numeric", "_frombuffer")] = frombuffer
    return allowed


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles only what the official CIFAR-100 python files hold: dicts, lists, strings,
    bytes, numbers, and numpy arrays rebuilt by numpy's reconstruction functions. Any other
    global (a class, ``os.system``, ``builtins.eval`` ...) is refused before it is called."""

    allowed = _numpy_reconstructors()

    def find_class(self, module: str, name: str):
        try:
            return self.allowed[(module, name)]
        except KeyError:
            raise UnsafePickleError(f"{module}.{name}") from None


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle referenced a global outside :class:`_CifarUnpickler`'s allow-list."""


def _read_pickle(path: Path) -> dict:
    """A CIFAR-100 python file as a dict with ``str`` keys, through the restricted unpickler
    (``ValueError`` naming the file for anything else)."""
    try:
        with open(path, "rb") as fh:
            obj = _CifarUnpickler(fh, encoding="latin1").load()
    except UnsafePickleError as exc:
        raise ValueError(
            f"{path}: refused to unpickle: the file references {exc}, which a CIFAR-100 python "
            "file never holds (only dicts, lists, strings, numbers and numpy arrays); it is "
            "not the official release, or it was tampered with. selbench does not run code "
            f"from data files: re-download {CIFAR100_URL}"
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, MemoryError, OverflowError, UnicodeError) as exc:
        raise ValueError(
            f"{path}: not a readable CIFAR-100 python file ({type(exc).__name__}: {exc}); is it "
            "truncated? re-extract the release"
        ) from exc
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the file ({exc.strerror or exc})") from exc
    if not isinstance(obj, dict):
        raise ValueError(
            f"{path}: not a CIFAR-100 python file (it holds a {type(obj).__name__}, expected "
            "a dict)"
        )
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _load_npy(path: Path, mmap_mode: str | None = None) -> np.ndarray:
    """A CIFAR-100-C ``.npy`` without pickle; ``ValueError`` naming the file if unreadable."""
    try:
        arr = np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        what = "holds pickled Python objects" if "allow_pickle" in str(exc) else "is unreadable"
        raise ValueError(
            f"{path}: {what} ({type(exc).__name__}: {exc}); expected a numpy .npy array of "
            "the CIFAR-100-C release"
        ) from exc
    if not isinstance(arr, np.ndarray):
        arr.close()
        raise ValueError(f"{path}: expected a single .npy array, found an .npz archive")
    return arr


def read_cifar100(root: str | Path, part: str, download: bool = False):
    """Images uint8 ``[N, 32, 32, 3]`` and fine labels int64 ``[N]`` of ``part``
    (``train`` / ``test``) from the official python release."""
    d = _ensure_cifar(root, download, files=(part,))
    batch = _read_pickle(d / part)
    try:
        data = np.asarray(batch["data"], dtype=np.uint8)
        labels = np.asarray(batch["fine_labels"], dtype=np.int64)
    except KeyError as exc:
        raise ValueError(f"{d / part}: not a CIFAR-100 batch (missing {exc})") from None
    if data.ndim != 2 or data.shape[1] != 3072 or data.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{d / part}: expected data [N, 3072] and N fine_labels, got {data.shape} and "
            f"{labels.shape}"
        )
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def cifar100_class_names(root: str | Path) -> list[str]:
    """Fine label names from the release's ``meta`` file, or the standard list if absent."""
    path = _cifar_dir(root) / "meta"
    if path.is_file():
        return [str(c) for c in _read_pickle(path)["fine_label_names"]]
    return list(CIFAR100_CLASSES)


def _items(images, labels, augment: bool, dataset: CIFAR100 | CIFAR100C) -> ImageItems:
    aug = augmix_transform(dataset.augmix_severity, dataset.augmix_width) if augment else None
    return ImageItems(ArrayImages(images), labels, augment=aug, seed=dataset.augmix_seed)


def _augmix_splits_of(splits: tuple[str, ...]) -> type[Params]:
    """Validators of a dataset with these splits: ``augmix_splits`` must name some of them."""

    class _AugmixSplitsKnown(Params):
        @model_validator(mode="after")
        def _known(self):
            bad = sorted(set(self.augmix_splits) - set(splits))
            if bad:
                raise ValueError(
                    f"augmix_splits: unknown split(s) {bad}; splits are {', '.join(splits)}"
                )
            return self

    return _AugmixSplitsKnown


# --------------------------------------------------------------------------- cifar100
class CIFAR100(Dataset):
    """CIFAR-100 from the official python release; splits ``train`` and ``test``."""

    num_classes = 100
    input_kind = "image-items"
    params_base = _augmix_splits_of(("train", "test"))

    def __init__(
        self,
        root: Annotated[CIFAR100Root, Field(
            description="folder holding cifar-100-python/")] = "data/cifar100",
        download: Annotated[bool, Field(
            description="download CIFAR-100 (161 MB) with torchvision if missing; off by "
            "default",
        )] = False,
        augmix_splits: AugmixSplits = [],  # noqa: B006 - parameters are never mutated
        augmix_severity: AugmixSeverity = 3,
        augmix_width: AugmixWidth = 3,
        augmix_seed: AugmixSeed = 0,
    ):
        self.root = root
        self.download = download
        self.augmix_splits = augmix_splits
        self.augmix_severity = augmix_severity
        self.augmix_width = augmix_width
        self.augmix_seed = augmix_seed
        self._cache: dict[str, SplitData] = {}

    def splits(self) -> list[str]:
        return ["train", "test"]

    def split(self, name: str) -> SplitData:
        if name not in self.splits():
            raise KeyError(f"cifar100: no split {name!r}; splits are train, test")
        if name not in self._cache:
            images, labels = read_cifar100(self.root, name, self.download)
            self._cache[name] = SplitData(
                inputs=_items(images, labels, name in self.augmix_splits, self),
                labels=labels,
                class_names=cifar100_class_names(self.root),
                meta={"dataset": "cifar100", "augmix": name in self.augmix_splits},
            )
        return self._cache[name]


# --------------------------------------------------------------------------- cifar100-c
def _severities(v: list[int]) -> list[int]:
    if not v or any(s not in (1, 2, 3, 4, 5) for s in v) or len(set(v)) != len(v):
        raise ValueError("severities must be distinct values in 1..5")
    return sorted(v)


def _corruptions(v: list[str]) -> list[str]:
    if not v or len(set(v)) != len(v):
        raise ValueError("corruptions must be a non-empty list of distinct names")
    return v


class CIFAR100C(Dataset):
    """Clean CIFAR-100 ``val`` → a seeded sample of CIFAR-100-C ``test`` (the paper's
    shift experiment); test domain = corruption × severity."""

    num_classes = 100
    input_kind = "image-items"
    params_base = _augmix_splits_of(("val", "test"))

    def __init__(
        self,
        root: Annotated[InputDir(metadata=("labels.npy",)), Field(
            description="folder with <corruption>.npy and labels.npy")] = "data/CIFAR-100-C",
        cifar_root: Annotated[CIFAR100Root, Field(
            description="folder holding cifar-100-python/ (the clean 'val' split)",
        )] = "data/cifar100",
        download: Annotated[bool, Field(
            description="download clean CIFAR-100 with torchvision if missing (never "
            "CIFAR-100-C); off by default",
        )] = False,
        corruptions: Annotated[list[str], AfterValidator(_corruptions), Field(
            description="corruptions sampled for 'test' (default: the 15 benchmark ones)",
        )] = list(CIFAR100_C_CORRUPTIONS),  # noqa: B006 - parameters are never mutated
        severities: Annotated[list[int], AfterValidator(_severities), Field(
            description="severities sampled for 'test'",
        )] = [1, 2, 3, 4, 5],  # noqa: B006 - parameters are never mutated
        n: Annotated[int, Field(ge=1, description="size of the 'test' sample (paper: 50,000)")]
        = 50_000,
        seed: Annotated[int, Field(ge=0, description="seed of the 'test' and 'val' samples")] = 0,
        fit_source: Annotated[Literal["train", "test"], Field(
            description="clean CIFAR-100 part the 'val' split is drawn from")] = "train",
        val_size: Annotated[int | None, Field(
            ge=1, description="size of the seeded 'val' sample (null: the whole part)",
        )] = 10_000,
        augmix_splits: AugmixSplits = [],  # noqa: B006 - parameters are never mutated
        augmix_severity: AugmixSeverity = 3,
        augmix_width: AugmixWidth = 3,
        augmix_seed: AugmixSeed = 0,
    ):
        self.root = root
        self.cifar_root = cifar_root
        self.download = download
        self.corruptions = corruptions
        self.severities = severities
        self.n = n
        self.seed = seed
        self.fit_source = fit_source
        self.val_size = val_size
        self.augmix_splits = augmix_splits
        self.augmix_severity = augmix_severity
        self.augmix_width = augmix_width
        self.augmix_seed = augmix_seed
        self._cache: dict[str, SplitData] = {}

    def splits(self) -> list[str]:
        return ["val", "test"]

    def domain_names(self) -> list[str]:
        return [f"{c}-{s}" for c in self.corruptions for s in (1, 2, 3, 4, 5)]

    def _class_names(self) -> list[str]:
        return cifar100_class_names(self.cifar_root)

    def split(self, name: str) -> SplitData:
        if name not in self.splits():
            raise KeyError(f"cifar100-c: no split {name!r}; splits are val, test")
        if name not in self._cache:
            self._cache[name] = self._val() if name == "val" else self._test()
        return self._cache[name]

    def _val(self) -> SplitData:
        images, labels = read_cifar100(self.cifar_root, self.fit_source, self.download)
        if self.val_size is not None:
            if self.val_size > len(labels):
                raise ValueError(
                    f"val_size={self.val_size} exceeds the {len(labels)} images of CIFAR-100 "
                    f"{self.fit_source!r}"
                )
            rng = np.random.default_rng([self.seed, 0x7A1])
            idx = np.sort(rng.choice(len(labels), size=self.val_size, replace=False))
            images, labels = images[idx], labels[idx]
        augment = "val" in self.augmix_splits
        return SplitData(
            inputs=_items(images, labels, augment, self),
            labels=labels,
            class_names=self._class_names(),
            meta={"dataset": "cifar100-c", "source": f"cifar100 {self.fit_source}",
                  "augmix": augment},
        )  # fmt: skip

    def _test(self) -> SplitData:
        root = Path(self.root)
        paths = [root / f"{c}.npy" for c in self.corruptions] + [root / "labels.npy"]
        for p in paths:
            if not p.is_file():
                raise FileNotFoundError(
                    f"CIFAR-100-C not found: {p} does not exist. selbench never downloads "
                    f"data: get CIFAR-100-C.tar (about 3 GB) from {CIFAR100_C_URL}, extract "
                    f"it and set the dataset's root param to the folder holding the .npy "
                    f"files."
                )
        all_labels = _load_npy(root / "labels.npy")
        rows = all_labels.shape[0]
        if all_labels.ndim != 1 or rows % 5:
            raise ValueError(
                f"{root / 'labels.npy'}: expected shape [5·m] (5 severities × m images), got "
                f"{all_labels.shape}"
            )
        m = rows // 5
        arrays = {}
        for c, p in zip(self.corruptions, paths):
            arr = _load_npy(p, mmap_mode="r")
            if arr.shape != (rows, 32, 32, 3) or arr.dtype != np.uint8:
                raise ValueError(
                    f"{p}: expected uint8 images of shape ({rows}, 32, 32, 3) to match "
                    f"labels.npy, got {arr.dtype} {arr.shape}"
                )
            arrays[c] = arr
        severities = sorted(self.severities)
        n_sev = len(severities)
        pool = len(self.corruptions) * n_sev * m
        if self.n > pool:
            raise ValueError(
                f"n={self.n} exceeds the {pool} CIFAR-100-C images available "
                f"({len(self.corruptions)} corruptions × {n_sev} severities × {m})"
            )
        rng = np.random.default_rng([self.seed, 0xC1FA])
        flat = np.sort(rng.choice(pool, size=self.n, replace=False))
        ci, rest = np.divmod(flat, n_sev * m)
        si, j = np.divmod(rest, m)
        sev = np.asarray(severities)[si]
        file_rows = (sev - 1) * m + j
        images = np.empty((self.n, 32, 32, 3), dtype=np.uint8)
        for k, c in enumerate(self.corruptions):
            sel = np.flatnonzero(ci == k)
            if sel.size:
                images[sel] = arrays[c][file_rows[sel]]
        labels = np.asarray(all_labels[file_rows], dtype=np.int64)
        domain = (ci * 5 + sev - 1).astype(np.int64)
        augment = "test" in self.augmix_splits
        return SplitData(
            inputs=_items(images, labels, augment, self),
            labels=labels,
            domain=domain,
            class_names=self._class_names(),
            meta={"dataset": "cifar100-c", "domains": self.domain_names(), "augmix": augment},
        )


PLUGINS = [
    Plugin(
        "cifar100",
        CIFAR100,
        summary="CIFAR-100 (official python release), splits train/test; optional AugMix",
    ),
    Plugin(
        "cifar100-c",
        CIFAR100C,
        summary="clean CIFAR-100 'val' -> seeded CIFAR-100-C sample 'test' (domain = "
        "corruption × severity)",
    ),
]
