"""``digits-net``: a small CNN trained in-process on a dataset's training split.

The default backbone of the embedded benchmark: trained on ``digits``' clean ``train`` split
in a few seconds on a CPU, it is accurate on clean digits and, never having seen a corrupted
image, less accurate and worse calibrated on the ``shifted`` split, which is the situation
selective recalibration addresses.

Architecture (``w`` = ``width``, ``d`` = ``feature_dim``)::

    conv3x3(C→w) ReLU → conv3x3(w→2w) ReLU → maxpool 2 → adaptive avg-pool to 4x4
    → flatten (32w) → linear(→d) ReLU  [features]  → linear(→K)  [logits]

trained with Adam on the cross-entropy, no augmentation. Training is seeded by the ``seed``
*parameter* (the core shares one backbone across the seeds of an experiment, so the seed is
part of the backbone's configuration, hence of its cache key). On CPU, training and
inference run on a single torch thread (the previous setting is restored afterwards): the
network is too small to gain from more, one thread avoids oversubscription on busy
machines, and results do not depend on the machine's core count, so the same parameters
give bit-identical outputs. The trained weights are kept in memory for the other splits and,
when the core provides ``context.cache_dir``, saved there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import warnings
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import Field
from selbench.contract.api import Backbone, Dataset, FitContext, Plugin
from selbench.contract.data import ModelOutputs

__all__ = ["PLUGIN", "DigitsNet"]


def _as_images(inputs: object, where: str) -> np.ndarray:
    if not isinstance(inputs, np.ndarray):
        raise ValueError(
            f"digits-net: {where} inputs: expected a numpy array of images [N, C, H, W] or "
            f"[N, H, W], got {type(inputs).__name__}"
        )
    x = inputs
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4:
        raise ValueError(
            f"digits-net: {where} inputs: expected images [N, C, H, W] or [N, H, W], "
            f"got shape {inputs.shape}"
        )
    if not np.issubdtype(x.dtype, np.number):
        raise ValueError(f"digits-net: {where} inputs: expected numbers, got dtype {x.dtype}")
    if min(x.shape[2:]) < 2:
        raise ValueError(f"digits-net: {where} inputs: images must be at least 2x2, got {x.shape}")
    return np.ascontiguousarray(x, dtype=np.float32)


@contextlib.contextmanager
def _cpu_single_thread(device):
    """Run torch CPU ops on one thread inside the block (no-op for accelerators)."""
    import torch

    if torch.device(device).type != "cpu":
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _build(channels: int, num_classes: int, width: int, feature_dim: int):
    from torch import nn

    class _Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(channels, width, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(width, 2 * width, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.AdaptiveAvgPool2d((4, 4)),
                nn.Flatten(),
                nn.Linear(2 * width * 16, feature_dim),
                nn.ReLU(),
            )
            self.head = nn.Linear(feature_dim, num_classes)

        def forward(self, x):
            features = self.body(x)
            return features, self.head(features)

    return _Net()


class DigitsNet(Backbone):
    """Small seeded CNN trained in-process on ``train_split``; features = penultimate layer.

    Learned state (after the first :meth:`extract`): ``model_`` (the trained torch module)
    and ``train_accuracy_``.
    """

    input_kinds = frozenset({"image-array"})

    def __init__(
        self,
        train_split: Annotated[str, Field(
            description="split of the dataset the network is trained on")] = "train",
        epochs: Annotated[int, Field(ge=1, description="training epochs")] = 30,
        lr: Annotated[float, Field(gt=0, description="Adam learning rate")] = 3e-3,
        weight_decay: Annotated[float, Field(ge=0, description="Adam weight decay (L2)")] = 1e-4,
        batch_size: Annotated[int, Field(ge=1, description="training batch size")] = 64,
        width: Annotated[int, Field(
            ge=1, description="channels of the first conv layer (second: 2x)")] = 16,
        feature_dim: Annotated[int, Field(
            ge=1, description="size of the penultimate layer (the features)")] = 64,
        seed: Annotated[int, Field(
            ge=0, description="seed of the initialisation and of the batch order")] = 0,
    ):
        self.train_split = train_split
        self.epochs = epochs
        self.lr = lr
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.width = width
        self.feature_dim = feature_dim
        self.seed = seed

    # ------------------------------------------------------------------ training
    def _fingerprint(self, x: np.ndarray, y: np.ndarray, num_classes: int) -> str:
        h = hashlib.sha256()
        h.update(json.dumps(self.get_params(deep=False), sort_keys=True).encode())
        h.update(str((x.shape, num_classes)).encode())
        h.update(x.tobytes())
        h.update(y.astype(np.int64).tobytes())
        return h.hexdigest()[:20]

    def fit(self, dataset: Dataset, context: FitContext) -> DigitsNet:
        """Train on ``dataset.split(train_split)`` (or load the cached weights); return self."""
        import torch

        data = dataset.split(self.train_split)
        x = _as_images(data.inputs, f"split {self.train_split!r}")
        y = np.asarray(data.labels, dtype=np.int64)
        k = int(dataset.num_classes)
        if y.shape != (len(x),):
            raise ValueError(
                f"digits-net: split {self.train_split!r} labels: expected shape ({len(x)},), "
                f"got {y.shape}"
            )
        if len(y) == 0:
            raise ValueError(f"digits-net: split {self.train_split!r} is empty")
        if y.min() < 0 or y.max() >= k:
            raise ValueError(
                f"digits-net: split {self.train_split!r} labels: values must lie in [0, {k})"
            )
        key = self._fingerprint(x, y, k)
        if getattr(self, "_key", None) == key:
            return self
        device = context.torch_device()

        def fresh():
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                return _build(x.shape[1], k, self.width, self.feature_dim)

        model = fresh()
        path = None
        if context.cache_dir is not None:
            path = Path(context.cache_dir) / f"digits-net-{key}.pt"
        if path is not None and path.is_file():
            try:
                model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
                self.model_ = model.to(device).eval()
                self._key = key
                self.train_accuracy_ = float(np.mean(self._predict(x, device)[1].argmax(1) == y))
                return self
            except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError) as exc:
                warnings.warn(
                    f"digits-net: cached weights {path} are unreadable ({exc}); retraining",
                    stacklevel=2,
                )
                model = fresh()  # the failed load may have modified some weights
        model = model.to(device)
        with _cpu_single_thread(device):
            self._train(model, x, y, device, context.progress)
        self.model_ = model.eval()
        self._key = key
        self.train_accuracy_ = float(np.mean(self._predict(x, device)[1].argmax(1) == y))
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            torch.save({n: t.detach().cpu() for n, t in model.state_dict().items()}, tmp)
            os.replace(tmp, path)
        return self

    def _train(self, model, x: np.ndarray, y: np.ndarray, device, progress: bool) -> None:
        import torch
        from selbench.util.progress import progress_bar  # plain lines off a terminal

        gen = torch.Generator().manual_seed(self.seed)
        xt = torch.from_numpy(x).to(device)
        yt = torch.from_numpy(y).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        loss_fn = torch.nn.CrossEntropyLoss()
        cudnn = torch.backends.cudnn
        saved = (cudnn.deterministic, cudnn.benchmark)
        cudnn.deterministic, cudnn.benchmark = True, False
        try:
            model.train()
            bar = progress_bar(range(self.epochs), desc="digits-net", unit="epoch",
                               disable=not progress, leave=False)
            for _ in bar:
                order = torch.randperm(len(x), generator=gen).to(device)
                total = 0.0
                for start in range(0, len(x), self.batch_size):
                    idx = order[start : start + self.batch_size]
                    opt.zero_grad(set_to_none=True)
                    loss = loss_fn(model(xt[idx])[1], yt[idx])
                    loss.backward()
                    opt.step()
                    total += float(loss.detach()) * len(idx)
                bar.set_postfix(loss=f"{total / len(x):.4f}")
        finally:
            cudnn.deterministic, cudnn.benchmark = saved
            model.eval()

    def _predict(self, x: np.ndarray, device, batch: int = 2048) -> tuple[np.ndarray, np.ndarray]:
        import torch

        feats, logits = [], []
        with torch.no_grad(), _cpu_single_thread(device):
            for start in range(0, len(x), batch):
                xb = torch.from_numpy(x[start : start + batch]).to(device)
                f, z = self.model_(xb)
                feats.append(f.float().cpu().numpy())
                logits.append(z.float().cpu().numpy())
        if not feats:
            return (
                np.zeros((0, self.feature_dim), np.float32),
                np.zeros((0, self.model_.head.out_features), np.float32),
            )
        return np.concatenate(feats), np.concatenate(logits)

    # ------------------------------------------------------------------ Backbone API
    def extract(self, dataset: Dataset, split: str, context: FitContext) -> ModelOutputs:
        self.fit(dataset, context)
        data = dataset.split(split)
        x = _as_images(data.inputs, f"split {split!r}")
        expected = tuple(self.model_.body[0].weight.shape[1:2])
        if x.shape[1:2] != expected:
            raise ValueError(
                f"digits-net: split {split!r} has {x.shape[1]} channels but the network was "
                f"trained on {expected[0]}"
            )
        features, logits = self._predict(x, context.torch_device())
        meta = {"train_accuracy": self.train_accuracy_}
        if "domains" in data.meta:
            meta["domains"] = list(data.meta["domains"])
        return ModelOutputs(
            features=features,
            logits=logits,
            labels=np.asarray(data.labels, dtype=np.int64),
            domain=data.domain,
            meta=meta,
        )


PLUGIN = Plugin(
    "digits-net",
    DigitsNet,
    summary="Small seeded CNN trained in-process on the dataset's train split (seconds on CPU)",
)
