"""``imagenet``: the ILSVRC2012 validation images, in torchvision's ImageFolder layout.

The paper extracts features, logits and labels of all 50,000 ImageNet validation images
with torchvision's pretrained ResNet-34, then fits every method on 2,000 of them and
evaluates on the rest. This dataset therefore has one split, ``val``; a spec uses it as both
``fit_split`` and ``eval_split`` and the runner keeps the fitted examples out of the
evaluation data.

Layout: ``root/<wnid>/<image>`` — one folder per class, named by WordNet id
(``n01440764``, ...), as produced by the usual ``valprep.sh`` rearrangement of
``ILSVRC2012_img_val.tar``. Labels index the sorted class folders, which is torchvision's
class order when all 1,000 folders are present. Items are the standard evaluation geometry
(resize the short side to 256, centre-crop 224) as uint8 tensors; the backbone normalises.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import Field, model_validator
from selbench.contract.api import Dataset, Params, Plugin, SplitData
from selbench.contract.inputs import InputDir
from selbench.contract.vision import ImageItems, require

__all__ = ["PLUGIN", "ImageNetVal"]

_IMAGE_EXT = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

WHERE_TO_GET = (
    "selbench never downloads ImageNet. Get ILSVRC2012_img_val.tar (6.4 GB, registration "
    "required) from https://image-net.org/download-images.php, extract it and sort the "
    "50,000 images into one folder per class (e.g. with valprep.sh from "
    "https://github.com/soumith/imagenetloader.torch), then set the dataset's root param "
    "to that folder."
)


class _CropWithinResize(Params):
    """The centre crop must fit in the resized image."""

    @model_validator(mode="after")
    def _crop(self) -> Any:
        if self.crop > self.resize:
            raise ValueError(f"crop={self.crop} must not exceed resize={self.resize}")
        return self


class _FolderInput:
    """``get_image`` for an ImageFolder's samples (picklable for loader workers)."""

    def __init__(self, samples: list[tuple[str, int]], loader):
        self.paths = [p for p, _ in samples]
        self.loader = loader

    def __call__(self, i: int):
        return self.loader(self.paths[i])


class ImageNetVal(Dataset):
    """ILSVRC2012 validation images (ImageFolder layout), one split ``val``; standard ResNet
    evaluation geometry (resize 256, centre crop 224)."""

    input_kind = "image-items"
    params_base = _CropWithinResize

    def __init__(
        self,
        # the labels are the class folders' names, which the folder digest holds: no index
        root: Annotated[InputDir(), Field(
            description="ILSVRC2012 validation folder with one sub-folder of images per class",
        )] = "data/imagenet/val",
        resize: Annotated[int, Field(
            ge=1, description="short side after resizing (bilinear)")] = 256,
        crop: Annotated[int, Field(
            ge=1, description="side of the centre crop fed to the model")] = 224,
    ):
        self.root = root
        self.resize = resize
        self.crop = crop
        self._split: SplitData | None = None

    def _classes(self) -> list[str]:
        root = Path(self.root)
        if not root.is_dir():
            raise FileNotFoundError(
                f"ImageNet validation folder {root} does not exist. {WHERE_TO_GET}"
            )
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        if not classes:
            raise FileNotFoundError(
                f"ImageNet validation folder {root} has no class sub-folders (expected "
                f"root/<wnid>/<image>.JPEG; a flat folder of 50,000 images must first be "
                f"sorted into classes). {WHERE_TO_GET}"
            )
        return classes

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        return len(self._classes())

    def splits(self) -> list[str]:
        return ["val"]

    def split(self, name: str) -> SplitData:
        if name != "val":
            raise KeyError(f"imagenet: no split {name!r}; the only split is 'val'")
        if self._split is not None:
            return self._split
        classes = self._classes()
        datasets = require("torchvision.datasets", "the imagenet dataset")
        T = require("torchvision.transforms", "the imagenet dataset")
        try:
            folder = datasets.ImageFolder(self.root)
        except FileNotFoundError as exc:  # a class folder without images
            raise FileNotFoundError(
                f"ImageNet validation folder {self.root} ({len(classes)} class folders): "
                f"{exc}. {WHERE_TO_GET}"
            ) from exc
        labels = np.asarray(folder.targets, dtype=np.int64)
        geometry = T.Compose([
            T.Resize(self.resize, interpolation=T.InterpolationMode.BILINEAR),
            T.CenterCrop(self.crop),
        ])  # fmt: skip
        items = ImageItems(_FolderInput(folder.samples, folder.loader), labels, geometry=geometry)
        self._split = SplitData(
            inputs=items,
            labels=labels,
            domain=None,
            class_names=_class_names(folder.classes),
            meta={"dataset": "imagenet", "root": str(self.root), "wnids": list(folder.classes)},
        )
        return self._split


def _class_names(wnids: list[str]) -> list[str]:
    """Human-readable names (torchvision's ImageNet categories) when the folders are the
    1,000 ILSVRC2012 synsets, else the folder names."""
    if len(wnids) == 1000:
        models = require("torchvision.models", "ImageNet class names")
        return list(models.ResNet34_Weights.IMAGENET1K_V1.meta["categories"])
    return [w.replace("_", " ") for w in wnids]


PLUGIN = Plugin(
    "imagenet",
    ImageNetVal,
    summary="ILSVRC2012 validation images in ImageFolder layout (split 'val'); resize 256 / "
    "crop 224",
)
