"""Shared machinery of the image backbones: input preparation and batched extraction.

The image datasets hand backbones :class:`selbench.contract.vision.ImageItems` (uint8 ``[3, H, W]``
items, the ``image-items`` input kind); every model-specific step — conversion to float,
resizing to the model's input size, normalisation — is done here, by the backbone, on
``context.device``, so that one dataset serves every backbone and the GPU does the
arithmetic.

:func:`extract_outputs` runs a model over a split: a batched ``DataLoader`` (pinned memory
on CUDA, ``num_workers`` loader processes), inference mode, mixed precision
(``torch.autocast`` in float16) on CUDA, a tqdm bar when ``context.progress``, and float32
:class:`~selbench.contract.data.ModelOutputs` at the end. The first item is loaded in the calling
process before any worker starts, so missing files fail at once with the dataset's own
message (which says where to get the data) instead of inside a worker.

The parameters every image backbone shares (:data:`BatchSize`, :data:`NumWorkers`,
:data:`Amp`) are declared here once, as annotated types for the backbones' signatures.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import Field
from selbench.contract.api import Dataset, FitContext, SplitData
from selbench.contract.data import DataError, ModelOutputs

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Amp",
    "BatchSize",
    "NumWorkers",
    "extract_outputs",
    "normalize",
    "to_float_images",
]

#: Parameters shared by the image backbones, declared last in each (they set how the
#: extraction runs, not what it computes; ``amp`` changes the numbers slightly on CUDA).
BatchSize = Annotated[int, Field(ge=1, description="images per forward pass")]
NumWorkers = Annotated[int, Field(ge=0, description="DataLoader worker processes (0: in-process)")]
Amp = Annotated[bool, Field(description="float16 autocast on CUDA (ignored on CPU)")]

#: the channel statistics torchvision's ImageNet models (and WILDS' Camelyon17 model) expect
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# --------------------------------------------------------------------------- model side
def to_float_images(x: torch.Tensor) -> torch.Tensor:
    """uint8 images (0–255) -> float32 in [0, 1]; float images are returned as float32."""
    if x.dtype == torch.uint8:
        return x.float().div_(255.0)
    return x.float()


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """Per-channel ``(x - mean) / std`` of a float batch ``[B, 3, H, W]``."""
    m = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x - m) / s


def standardize_per_image(x: torch.Tensor) -> torch.Tensor:
    """Each image and channel to zero mean and unit (unbiased) std — WILDS' RxRx1 input."""
    mean = x.mean(dim=(2, 3), keepdim=True)
    std = x.std(dim=(2, 3), keepdim=True)
    std = torch.where(std == 0, torch.ones_like(std), std)
    return (x - mean) / std


def preprocess(x: torch.Tensor, normalization: str) -> torch.Tensor:
    """uint8/float batch -> model input with ``imagenet``, ``per-image`` or ``none`` scaling."""
    x = to_float_images(x)
    if normalization == "imagenet":
        return normalize(x, IMAGENET_MEAN, IMAGENET_STD)
    if normalization == "per-image":
        return standardize_per_image(x)
    if normalization == "none":
        return x
    raise ValueError(f"normalization: expected imagenet, per-image or none, got {normalization!r}")


def full_precision(x: torch.Tensor):
    """A context that turns autocast off on ``x``'s device: the final layers (classifier
    head, cosine logits) run in float32 even when the trunk runs in float16, so that the
    logits — what calibration is measured on — carry no half-precision rounding."""
    return torch.autocast(device_type=x.device.type, enabled=False)


def split_head(model: torch.nn.Module, attr: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Detach a torchvision classifier's last layer: returns ``(body, head)`` where
    ``body(x)`` is the pooled penultimate embedding and ``head(body(x))`` the logits."""
    head = getattr(model, attr)
    setattr(model, attr, torch.nn.Identity())
    return model, head


def _check_items(items: Any, where: str) -> None:
    if not (hasattr(items, "__getitem__") and hasattr(items, "__len__")):
        raise TypeError(
            f"{where}: expected the split's inputs to be a torch Dataset of (image, label) "
            f"items, got {type(items).__name__}; pair this backbone with an image dataset "
            "(camelyon17, rxrx1, imagenet, cifar100, cifar100-c)"
        )


def extract_outputs(
    dataset: Dataset,
    split: str,
    context: FitContext,
    step: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    *,
    batch_size: int,
    num_workers: int,
    amp: bool,
    name: str,
    meta: dict | None = None,
) -> ModelOutputs:
    """Run ``step(images) -> (features, logits)`` over ``dataset.split(split)``.

    ``step`` receives the raw batch already on ``context.device`` (uint8 ``[B, 3, H, W]``),
    runs under ``torch.inference_mode`` and, on CUDA with ``amp``, under float16 autocast.
    Returns float32 features and logits, the split's labels and domain — of the rows
    ``context.rows`` only when it is set (the backbones using this declare ``shardable``):
    each row is computed as in the whole split (an inference pass, row by row), and ``meta``
    describes the whole split.
    """
    data = dataset.split(split)
    items, labels, domain, where = _rows_of(data, context, f"{name}: split {split!r}")
    n = len(data.inputs)
    items[0]  # fail here, in this process, if the files are missing (FileNotFoundError)

    device = torch.device(context.device)
    cuda = device.type == "cuda"
    feats, logits, got = _run(items, step, device, batch_size=batch_size,
                              num_workers=num_workers, amp=amp,
                              desc=f"{name} [{split}]", progress=context.progress)
    if not np.array_equal(got, labels):
        raise ValueError(f"{where}: the labels yielded by the items differ from split.labels")
    info = {"backbone": name, "split": split, "n": n}
    info.update(meta or {})
    if "domains" in data.meta:
        info["domains"] = list(data.meta["domains"])
    try:
        return ModelOutputs(
            features=np.concatenate(feats).astype(np.float32, copy=False),
            logits=np.concatenate(logits).astype(np.float32, copy=False),
            labels=labels,
            domain=domain,
            meta=info,
        )
    except DataError as exc:
        hint = " (float16 overflow? set the backbone's amp: false)" if cuda and amp else ""
        raise DataError(f"{where}: {exc}{hint}") from exc


def _rows_of(data: SplitData, context: FitContext, where: str
             ) -> tuple[Any, np.ndarray, np.ndarray | None, str]:
    """The checked items, labels and domain of the split (of the rows ``context.rows`` when
    it is set) and the place to name in messages."""
    items = data.inputs
    _check_items(items, where)
    n = len(items)
    labels = np.asarray(data.labels, dtype=np.int64)
    if labels.shape != (n,):
        raise ValueError(f"{where}: labels have shape {labels.shape} but the split has {n} items")
    if n == 0:
        raise ValueError(f"{where}: the split is empty")
    domain = data.domain
    if context.rows is not None:  # one shard of a distributed extraction
        start, stop = (int(r) for r in context.rows)
        if not 0 <= start < stop <= n:
            raise ValueError(f"{where}: rows [{start}, {stop}) are not inside the split's "
                             f"{n} items")
        items = torch.utils.data.Subset(items, range(start, stop))
        labels = labels[start:stop]
        domain = None if domain is None else np.asarray(domain)[start:stop]
        where = f"{where}, rows [{start}, {stop})"
    return items, labels, domain, where


def _run(items: Any, step: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
         device: torch.device, *, batch_size: int, num_workers: int, amp: bool, desc: str,
         progress: bool) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """The batched inference pass: the float32 features and logits per batch, and the
    labels the items yielded."""
    cuda = device.type == "cuda"
    loader = torch.utils.data.DataLoader(
        items,
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
        pin_memory=cuda,
        persistent_workers=False,
    )
    from selbench.util.progress import progress_bar  # plain lines off a terminal

    feats: list[np.ndarray] = []
    logits: list[np.ndarray] = []
    seen: list[np.ndarray] = []
    autocast = (
        torch.autocast("cuda", dtype=torch.float16) if cuda and amp else contextlib.nullcontext()
    )
    with torch.inference_mode(), autocast:
        for xb, yb in progress_bar(loader, desc=desc, unit="batch", disable=not progress):
            f, z = step(xb.to(device, non_blocking=cuda))
            feats.append(f.float().cpu().numpy())
            logits.append(z.float().cpu().numpy())
            seen.append(np.asarray(yb, dtype=np.int64))
    return feats, logits, np.concatenate(seen)
