"""Images for the vision plugins: optional imports and the image items datasets hand to
backbones.

The image datasets (``camelyon17``, ``rxrx1``, ``imagenet``, ``cifar100``, ``cifar100-c``)
return, as :attr:`selbench.contract.api.SplitData.inputs`, an :class:`ImageItems` dataset whose items
are ``(image, label)`` with ``image`` a **uint8** ``[3, H, W]`` tensor (0–255, RGB): the
``image-items`` input kind. Only the geometry that makes a split batchable (ImageNet's
resize 256 / centre crop 224) and optional data augmentation (AugMix,
:func:`augmix_transform`) happen on the dataset side; every model-specific step is done by
the backbone on the device.

torchvision, wilds and open_clip are optional (``pip install 'selbench[vision]'``) and are
imported only when a vision plugin is used, through :func:`require`.

The code digest of a plugin that imports this module covers it (:mod:`selbench.execution.codeid`).
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["ArrayImages", "ImageItems", "augmix_transform", "require"]

_EXTRA_FOR = {"torchvision": "torchvision", "wilds": "wilds", "open_clip": "open-clip-torch"}


def require(module: str, what: str) -> Any:
    """Import an optional dependency, or fail with the command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pkg = _EXTRA_FOR.get(module.split(".")[0], module.split(".")[0])
        raise ImportError(
            f"{what} needs the optional package {pkg!r}, which is not importable ({exc}); "
            "install selbench[vision]: pip install 'selbench[vision]'"
        ) from exc


def augmix_transform(severity: int = 3, width: int = 3) -> Callable:
    """torchvision's AugMix (Hendrycks et al., 2020) on PIL images; the paper's CIFAR-100
    setting is severity 3, mixture width 3."""
    T = require("torchvision.transforms", "AugMix")
    return T.AugMix(severity=severity, mixture_width=width)


def _item_seed(seed: int, index: int) -> int:
    return zlib.crc32(np.asarray([seed, index], dtype=np.int64).tobytes())


class ImageItems(torch.utils.data.Dataset):
    """A split of images as ``(uint8 [3, H, W] tensor, int label)`` items.

    Args:
        get_image: ``get_image(i)`` returns example ``i`` as a PIL image (any mode; it is
            converted to RGB). Must be picklable when loader workers use ``spawn``
            (a bound method or a top-level callable object, not a lambda).
        labels: int64 ``[N]`` classes.
        geometry: optional PIL -> PIL transform applied first (resize / crop).
        augment: optional PIL -> PIL random augmentation (AugMix). It is made
            deterministic per example: item ``i`` draws from a torch generator seeded with
            ``(seed, i)``, whatever the loader's worker count or order.
        seed: seed of the augmentation.
    """

    def __init__(
        self,
        get_image: Callable[[int], Any],
        labels: np.ndarray,
        geometry: Callable | None = None,
        augment: Callable | None = None,
        seed: int = 0,
    ):
        self.get_image = get_image
        self.labels = np.asarray(labels, dtype=np.int64)
        self.geometry = geometry
        self.augment = augment
        self.seed = seed

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        img = self.get_image(index)
        if img.mode != "RGB":
            img = img.convert("RGB")
        if self.geometry is not None:
            img = self.geometry(img)
        if self.augment is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(_item_seed(self.seed, index))
                img = self.augment(img)
        arr = np.array(img, dtype=np.uint8, copy=True)  # [H, W, 3]
        return torch.from_numpy(arr).permute(2, 0, 1).contiguous(), int(self.labels[index])


class ArrayImages:
    """``get_image`` for images held in a uint8 array ``[N, H, W, 3]`` (CIFAR)."""

    def __init__(self, images: np.ndarray):
        self.images = images

    def __call__(self, index: int):
        from PIL import Image

        return Image.fromarray(np.asarray(self.images[index]))
