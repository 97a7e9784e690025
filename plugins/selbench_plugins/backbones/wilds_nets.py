"""``wilds-densenet121`` (Camelyon17) and ``wilds-resnet50`` (RxRx1): WILDS-trained models.

The paper uses the WILDS baselines: a DenseNet-121 trained from scratch with ERM on the
Camelyon17 training hospitals, and a ResNet-50 trained with ERM on RxRx1. Their checkpoints
are published by the WILDS authors (see ``docs/paper-data.md``): one ``best_model.pth`` per
run, e.g. ``camelyon17_seed:0_epoch:best_model.pth``.

Checkpoint format (``examples/utils.py:save_model`` in the WILDS repository)::

    {"algorithm": algorithm.state_dict(), "epoch": ..., "best_val_metric": ...}

where the algorithm (ERM) holds the torchvision network as ``algorithm.model``, so every key
carries a ``model.`` prefix (``model.features.conv0.weight``, ``model.classifier.weight``);
runs on several GPUs add ``module.``, and algorithms that keep a featurizer/classifier pair
store them as ``model.0.`` / ``model.1.``. This loader accepts all of these (and a bare
state dict), rebuilds the torchvision architecture with the checkpoint's number of classes,
and loads it strictly: a mismatch is an error listing the offending keys.

Inputs follow WILDS' evaluation transforms: Camelyon17 96×96 patches normalised with the
ImageNet statistics; RxRx1 images standardised per image and channel. Features are the
pooled penultimate layer (1024-d DenseNet-121, 2048-d ResNet-50), logits the last layer.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import Field
from selbench.contract.api import Backbone, Dataset, FitContext, Plugin
from selbench.contract.data import ModelOutputs
from selbench.contract.inputs import InputFile
from selbench.contract.vision import require

from .extract import (
    Amp,
    BatchSize,
    NumWorkers,
    extract_outputs,
    full_precision,
    preprocess,
    split_head,
)

__all__ = [
    "PLUGINS",
    "WildsDenseNet121",
    "WildsNet",
    "WildsResNet50",
    "wilds_state_dict",
]

CHECKPOINTS_URL = "https://worksheets.codalab.org/worksheets/0x52cea64d1d3f4fa89de326b4e31aa50a"


_DENSE_OLD = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var))$"
)


def wilds_state_dict(obj: object, head: str) -> dict[str, torch.Tensor]:
    """The network's state dict from a WILDS checkpoint (or a bare state dict), with the
    algorithm's ``model.`` / ``module.`` prefixes removed and a ``(featurizer, classifier)``
    pair mapped onto the torchvision names (``0.x`` → ``x``, ``1.w`` → ``<head>.w``)."""
    if not isinstance(obj, dict):
        raise TypeError(f"expected a checkpoint dict, got {type(obj).__name__}")
    for key in ("algorithm", "state_dict", "model_state_dict"):
        if key in obj and isinstance(obj[key], dict):
            obj = obj[key]
            break
    state = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if any(k.startswith("model.") for k in state):
        state = {k: v for k, v in state.items() if k.startswith("model.")}
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        k = key
        while k.startswith(("model.", "module.")):
            k = k.split(".", 1)[1]
        if k.startswith("0."):
            k = k[2:]
        elif k.startswith("1."):
            k = f"{head}.{k[2:]}"
        m = _DENSE_OLD.match(k)  # pre-0.4 torchvision DenseNet names ("norm.1")
        if m:
            k = m.group(1) + m.group(2)
        out[k] = value
    return out


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _numpy_safe_globals() -> list:
    """The numpy objects a checkpoint's scalar metadata (``best_val_metric`` saved as a numpy
    float) pickles to, under both their numpy 1 and numpy 2 module paths."""
    core = getattr(np, "_core", None)
    if core is None:  # numpy < 2
        core = np.core
    scalar = core.multiarray.scalar
    entries: list = [np.dtype]
    for path in ("numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar"):
        entries.append((scalar, path))
    for t in (np.float64, np.float32, np.float16, np.int64, np.int32, np.bool_):
        entries.append(type(np.dtype(t)))
    return entries


def _load_checkpoint(path: Path) -> object:
    """``torch.load`` in weights-only mode (no arbitrary code), numpy scalars allowed."""
    try:
        allow = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5
        with allow(_numpy_safe_globals()) if allow else contextlib.nullcontext():
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        first = _ANSI.sub("", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise ValueError(
            f"{path}: cannot be read as a weights-only torch checkpoint ({first} ...). "
            "selbench does not unpickle arbitrary objects; "
            "if you trust the file, re-save its weights with "
            "torch.save({'algorithm': torch.load(path, weights_only=False)['algorithm']}, new_path)"
        ) from exc


class WildsNet(Backbone):
    """A torchvision network trained by the WILDS code, loaded from its checkpoint."""

    input_kinds = frozenset({"image-items"})
    #: an inference pass, row by row: a distributed run may extract a large split in shards
    shardable = True

    arch = ""
    head = ""
    default_normalization = "imagenet"
    display = ""
    dataset_name = ""

    def __init__(
        self,
        checkpoint: Annotated[InputFile, Field(
            description="path of the WILDS best_model.pth checkpoint")],
        normalization: Annotated[Literal["imagenet", "per-image", "none"] | None, Field(
            description="input scaling (default: WILDS' own — imagenet for Camelyon17, "
            "per-image for RxRx1)",
        )] = None,
        batch_size: BatchSize = 256,
        num_workers: NumWorkers = 4,
        amp: Amp = True,
    ):
        self.checkpoint = checkpoint
        self.normalization = normalization
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.amp = amp

    def build(self) -> torch.nn.Module:
        path = Path(self.checkpoint).expanduser()  # absolute when built from a spec
        if not path.is_file():
            raise FileNotFoundError(
                f"{self.display} checkpoint {path} does not exist. selbench never downloads "
                f"weights. The WILDS authors publish their trained {self.dataset_name} ERM "
                f"models ({self.arch}) on CodaLab: {CHECKPOINTS_URL} (also linked from "
                f"https://wilds.stanford.edu) — open the {self.dataset_name} ERM run of a seed, "
                "download its best_model.pth, and set the backbone's checkpoint param to it "
                "(see docs/paper-data.md)."
            )
        try:
            state = wilds_state_dict(_load_checkpoint(path), self.head)
        except TypeError as exc:  # not a dict
            raise ValueError(f"{path}: {exc}") from None
        key = f"{self.head}.weight"
        if key not in state:
            sample = ", ".join(list(state)[:5])
            raise ValueError(
                f"{path}: no {key!r} in the checkpoint after removing the WILDS prefixes (first "
                f"keys: {sample}); is it a {self.arch} checkpoint?"
            )
        models = require("torchvision.models", f"the {self.display} backbone")
        model = getattr(models, self.arch)(weights=None, num_classes=state[key].shape[0])
        try:
            missing, unexpected = model.load_state_dict(state, strict=False)
        except RuntimeError as exc:  # shapes differ
            first = str(exc).splitlines()[1].strip() if "\n" in str(exc) else str(exc)
            raise ValueError(
                f"{path}: does not fit torchvision's {self.arch}: {first}"
            ) from None
        if missing or unexpected:
            raise ValueError(
                f"{path}: does not fit torchvision's {self.arch}: missing "
                f"{missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected "
                f"{unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
            )
        return model

    def extract(self, dataset: Dataset, split: str, context: FitContext) -> ModelOutputs:
        device = torch.device(context.device)
        body, head = split_head(self.build(), self.head)
        body.eval().to(device)
        head.eval().to(device)
        norm = self.normalization or self.default_normalization

        def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            f = body(preprocess(x, norm)).float()
            with full_precision(f):
                return f, head(f)

        return extract_outputs(
            dataset, split, context, step,
            batch_size=self.batch_size, num_workers=self.num_workers, amp=self.amp,
            name=f"wilds-{self.arch}", meta={"checkpoint": str(self.checkpoint)},
        )  # fmt: skip


class WildsDenseNet121(WildsNet):
    """WILDS-trained DenseNet-121 (Camelyon17 ERM) from its best_model.pth; 1024-d features."""

    arch = "densenet121"
    head = "classifier"
    default_normalization = "imagenet"
    display = "WILDS DenseNet-121"
    dataset_name = "Camelyon17"


class WildsResNet50(WildsNet):
    """WILDS-trained ResNet-50 (RxRx1 ERM) from its best_model.pth; 2048-d features."""

    arch = "resnet50"
    head = "fc"
    default_normalization = "per-image"
    display = "WILDS ResNet-50"
    dataset_name = "RxRx1"


PLUGINS = [
    Plugin(
        "wilds-densenet121",
        WildsDenseNet121,
        summary="WILDS-trained DenseNet-121 (Camelyon17) from a best_model.pth checkpoint",
    ),
    Plugin(
        "wilds-resnet50",
        WildsResNet50,
        summary="WILDS-trained ResNet-50 (RxRx1) from a best_model.pth checkpoint",
    ),
]
