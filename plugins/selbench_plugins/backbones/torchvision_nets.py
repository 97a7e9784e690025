"""``resnet34``: torchvision's ImageNet ResNet-34, as in the paper's ImageNet experiment.

Features are the 512-d globally pooled penultimate layer, logits the final ``fc`` layer.
Inputs are the image datasets' uint8 items, normalised on the device with the ImageNet
channel statistics (for ``imagenet`` the dataset has already resized to 256 and centre
cropped 224: together that is torchvision's standard evaluation transform).

Weights: ``weights: IMAGENET1K_V1`` (default, the weights the paper used) are read from the
torch hub cache (``$TORCH_HOME/hub/checkpoints``, default ``~/.cache/torch/hub/checkpoints``)
and **never downloaded**: a missing file is a ``FileNotFoundError`` naming the file and the
URL. ``weights_file`` instead loads a state-dict file (a declared input: relative to the
spec's folder, content-hashed into the cache keys); ``weights: null`` without a file is a
random initialisation (seeded by ``init_seed``; the classifier then has one output per class
of the dataset — for tests and smoke runs only). For older specs, a ``weights`` value that is
not a name (it has a ``/``, a ``.`` or a ``~``) is read as ``weights_file``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import Field, model_validator
from selbench.contract.api import Backbone, Dataset, FitContext, Params, Plugin
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

__all__ = ["PLUGIN", "ResNet34", "TorchvisionClassifier", "hub_weights_path"]


#: a weights *name* (torchvision's weights enum members, open_clip's pretrained tags); any
#: other value (with a '/', a '.', a '~' ...) is a file path
_NAME = re.compile(r"[A-Za-z0-9_-]+")


def is_weights_name(value: str) -> bool:
    """True for a name such as ``IMAGENET1K_V1`` or ``laion2b_s34b_b79k``, False for what
    can only be a file path (``ckpt/model.pth``, ``~/w.pt``)."""
    return _NAME.fullmatch(value) is not None


def name_or_file(data: Any, name: str, file: str) -> Any:
    """Before validation: a path given in the ``name`` parameter (older specs) moves to the
    declared input parameter ``file``; a ``file`` replaces the default ``name``; both given
    is an error."""
    if not isinstance(data, dict):
        return data
    value = data.get(name)
    if isinstance(value, str) and not is_weights_name(value):
        if data.get(file) is not None:
            raise ValueError(
                f"{name}: {value!r} is a file path, and {file} is given too; give the file once, "
                f"as {file}"
            )
        return {**data, name: None, file: value}
    if data.get(file) is not None:
        if value is not None:
            raise ValueError(
                f"give either {name} ({value!r}) or {file} ({data[file]!r}), not both"
            )
        return {**data, name: None}
    return data


class _WeightsOrFile(Params):
    """``weights`` names the weights, ``weights_file`` is a file: a path given as
    ``weights`` (older specs) moves to ``weights_file``; giving both is an error."""

    @model_validator(mode="before")
    @classmethod
    def _weights_file(cls, data: Any) -> Any:
        return name_or_file(data, "weights", "weights_file")


def hub_weights_path(weights: Any) -> Path:
    """Where torchvision keeps a weights enum's file once downloaded."""
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(weights.url)


def torch_load_weights(path: Path, what: str) -> Any:
    """``torch.load`` in weights-only mode (tensors and containers, never arbitrary objects);
    a file it cannot read is a ``ValueError`` naming it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(
            f"{what}: {path} cannot be read as a weights-only torch file "
            f"({type(exc).__name__}: {first}); selbench does not unpickle arbitrary objects"
        ) from exc


def load_state_dict_file(path: Path, what: str) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{what}: weights file {path} does not exist")
    state = torch_load_weights(path, what)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"{what}: {path} holds a {type(state).__name__}, not a state dict")
    return state


class TorchvisionClassifier(Backbone):
    """A torchvision ImageNet classifier: pooled penultimate features + logits."""

    input_kinds = frozenset({"image-items"})
    #: an inference pass, row by row: a distributed run may extract a large split in shards
    shardable = True
    params_base = _WeightsOrFile

    arch = "resnet34"
    head = "fc"
    display = "ResNet-34"

    def __init__(
        self,
        weights: Annotated[str | None, Field(
            description="torchvision weights name (read from the torch hub cache, never "
            "downloaded), or null for random init (unless weights_file is given)",
        )] = "IMAGENET1K_V1",
        weights_file: Annotated[InputFile | None, Field(
            description="a state-dict file to load instead of named weights")] = None,
        init_seed: Annotated[int, Field(
            ge=0, description="seed of the random init (weights: null)")] = 0,
        batch_size: BatchSize = 256,
        num_workers: NumWorkers = 4,
        amp: Amp = True,
    ):
        self.weights = weights
        self.weights_file = weights_file
        self.init_seed = init_seed
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.amp = amp

    def _source(self) -> tuple[str | None, str | None]:
        """``(weights name, weights file)`` to load: a path given as ``weights`` (Python
        callers of older versions) is the file, and a file wins over a name."""
        weights, file = self.weights, self.weights_file
        if file is None and weights is not None and not is_weights_name(weights):
            weights, file = None, weights
        return (None if file is not None else weights), file

    def build(self, num_classes: int) -> torch.nn.Module:
        """The network with its weights loaded (no download ever)."""
        models = require("torchvision.models", f"the {self.arch} backbone")
        ctor = getattr(models, self.arch)
        weights, weights_file = self._source()
        if weights_file is not None:
            path = Path(weights_file)
            state = load_state_dict_file(path, self.arch)
        elif weights is None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.init_seed)
                return ctor(weights=None, num_classes=num_classes)
        else:
            try:
                enum = models.get_model_weights(self.arch)[weights]
            except KeyError:
                known = ", ".join(w.name for w in models.get_model_weights(self.arch))
                raise ValueError(
                    f"{self.arch}: unknown weights {weights!r}; torchvision has {known} "
                    "(or give a state-dict file as weights_file, or null for random init)"
                ) from None
            path = hub_weights_path(enum)
            if not path.is_file():
                raise FileNotFoundError(
                    f"{self.display} weights {weights} are not in the torch hub cache: "
                    f"{path} does not exist. selbench never downloads weights. Fetch them once "
                    f"where there is internet access (download {enum.url} into {path.parent}, "
                    f"or run python -c \"import torchvision; torchvision.models.{self.arch}"
                    f"(weights='{weights}')\"), set TORCH_HOME to the cache folder that "
                    "holds them, or give the file's path as weights_file."
                )
            state = load_state_dict_file(path, self.arch)
        k = state[f"{self.head}.weight"].shape[0] if f"{self.head}.weight" in state else 1000
        model = ctor(weights=None, num_classes=k)
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:  # missing / unexpected keys, other shapes
            raise ValueError(f"{path}: does not fit torchvision's {self.arch}: {exc}") from None
        return model

    def extract(self, dataset: Dataset, split: str, context: FitContext) -> ModelOutputs:
        device = torch.device(context.device)
        model = self.build(int(getattr(dataset, "num_classes", 1000)))
        body, head = split_head(model, self.head)
        body.eval().to(device)
        head.eval().to(device)
        if device.type == "cuda":
            body.to(memory_format=torch.channels_last)

        def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = preprocess(x, "imagenet")
            if device.type == "cuda":
                x = x.contiguous(memory_format=torch.channels_last)
            f = body(x).float()
            with full_precision(f):
                return f, head(f)

        return extract_outputs(
            dataset, split, context, step,
            batch_size=self.batch_size, num_workers=self.num_workers, amp=self.amp,
            name=self.arch,
            meta=dict(zip(("weights", "weights_file"), self._source())),
        )  # fmt: skip


class ResNet34(TorchvisionClassifier):
    """torchvision ResNet-34 (ImageNet weights by default); features = 512-d pooled layer,
    logits = fc."""

    arch = "resnet34"
    head = "fc"
    display = "ResNet-34"


PLUGIN = Plugin(
    "resnet34",
    ResNet34,
    summary="torchvision ResNet-34 (IMAGENET1K_V1 from the local torch cache); 512-d features",
)
