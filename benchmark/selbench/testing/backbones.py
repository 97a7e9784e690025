"""Checks of backbones, run on a tiny synthetic dataset of an input kind they declare:
``extract`` returns matching ``ModelOutputs``, deterministically, and a ``shardable`` backbone
honours ``FitContext.rows``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from selbench.contract.api import Dataset, FitContext, SplitData
from selbench.contract.data import ModelOutputs

from .errors import Broken, CheckSkipped
from .support import (
    Snapshot,
    Subject,
    brief,
    call,
    diff,
    equal,
    fit_context,
    fmt_exc,
    register_check,
)

_THINGS = ("food", "phone", "film", "service", "battery", "plot")
_WORDS = (("awful", "dreadful", "broken", "a waste of money"),
          ("wonderful", "excellent", "superb", "a delight"))


class _SyntheticDataset(Dataset):
    """A tiny dataset of one input kind, for backbone checks (splits train / val / test):
    ``vectors`` and ``text`` are binary, ``image-array`` has three classes."""

    def __init__(self, input_kind: str, seed: int = 0):
        self.input_kind_ = input_kind
        rng = np.random.default_rng(seed)
        self._splits: dict[str, SplitData] = {}
        for name, n in (("train", 60), ("val", 30), ("test", 30)):
            if input_kind == "vectors":  # binary, like the paper's theory mixture
                self.num_classes = 2
                x = rng.normal(size=(n, 4))
                labels = (x[:, 0] + 0.5 * rng.normal(size=n) > 0).astype(np.int64)
            elif input_kind == "text":  # binary: short reviews, negative or positive
                self.num_classes = 2
                labels = rng.integers(0, 2, n).astype(np.int64)
                x = np.array([f"The {_THINGS[i % len(_THINGS)]} was "
                              f"{rng.choice(_WORDS[y])}." for i, y in enumerate(labels)])
            else:  # image-array: 8x8 grey images, three classes
                self.num_classes = 3
                labels = rng.integers(0, 3, n).astype(np.int64)
                x = rng.random((n, 1, 8, 8)).astype(np.float32)
                x[np.arange(n), 0, labels * 2, :] += 2.0
            domain = (np.arange(n) % 2).astype(np.int64)
            self._splits[name] = SplitData(inputs=x, labels=labels, domain=domain)

    def splits(self) -> list[str]:
        return list(self._splits)

    def split(self, name: str) -> SplitData:
        if name not in self._splits:
            raise KeyError(f"no split {name!r}")
        return self._splits[name]


#: the input kinds the kit can synthesise for backbone checks
SYNTHETIC_INPUT_KINDS = ("vectors", "image-array", "text")


def _backbone_dataset(s: Subject) -> _SyntheticDataset:
    kinds = getattr(s.cls, "input_kinds", None)
    for kind in SYNTHETIC_INPUT_KINDS:
        if kinds is not None and kind in kinds:
            return _SyntheticDataset(kind)
    raise CheckSkipped(
        f"the kit synthesises inputs of kinds {', '.join(SYNTHETIC_INPUT_KINDS)} only; it "
        f"declares input_kinds {sorted(kinds) if kinds is not None else None}")


def _extract(s: Subject, backbone: Any, ds: Dataset, split: str) -> ModelOutputs:
    what = f"extract(dataset, {split!r}, context)"
    try:
        out = call(what, backbone.extract, ds, split, fit_context())
    except Broken as exc:  # an optional dependency that is not installed: cannot run here
        if isinstance(exc.__cause__, ImportError):
            raise CheckSkipped(f"{what} needs what is not installed: "
                               f"{fmt_exc(exc.__cause__)}") from exc
        raise
    if not isinstance(out, ModelOutputs):
        raise Broken(f"extract(dataset, {split!r}, context) returned {brief(out)}, expected "
                     "selbench.ModelOutputs")
    return out


@register_check("backbone")
def check_backbone_extract(s: Subject) -> None:
    """``extract(dataset, split, context)`` returns ``ModelOutputs`` with one row per example
    of the split, the split's labels and K = ``dataset.num_classes`` logits, and leaves the
    split's arrays unchanged (checked on a tiny synthetic dataset of a declared input kind)."""
    ds = _backbone_dataset(s)
    backbone = s.make()
    for name in ("train", "test"):
        data = ds.split(name)
        snap = Snapshot(lambda data=data: {"inputs": data.inputs, "labels": data.labels})
        out = _extract(s, backbone, ds, name)
        snap.unchanged(f"extract(dataset, {name!r}, context)")
        where = f"extract(dataset, {name!r}, context)"
        if len(out) != len(data.labels):
            raise Broken(f"{where} returned {len(out)} rows for a split of "
                         f"{len(data.labels)} examples")
        if not equal(out.labels, data.labels):
            raise Broken(f"{where}.labels differ from the split's labels "
                         f"({diff(out.labels, data.labels)})")
        if out.num_classes != ds.num_classes:
            raise Broken(f"{where} returned K={out.num_classes} logits for a dataset of "
                         f"num_classes={ds.num_classes}")


@register_check("backbone")
def check_backbone_is_deterministic(s: Subject) -> None:
    """Two backbones built with the same params extract identical features and logits with
    the same ``FitContext(seed=...)``."""
    ds = _backbone_dataset(s)
    a = _extract(s, s.make(), ds, "test")
    b = _extract(s, s.make(), _backbone_dataset(s), "test")
    for name in ("features", "logits"):
        if not equal(getattr(a, name), getattr(b, name)):
            raise Broken(f"two backbones with the same params extracted different {name} "
                         f"({diff(getattr(a, name), getattr(b, name))})")


@register_check("backbone")
def check_backbone_rows(s: Subject) -> None:
    """A backbone declaring ``shardable`` honours ``FitContext.rows``: the row ranges of a
    split, extracted one by one and concatenated, are the whole split's outputs bit for bit
    (same ``meta``). Skipped for a backbone that does not declare it."""
    if getattr(s.cls, "shardable", False) is not True:
        raise CheckSkipped("it does not declare shardable")
    ds = _backbone_dataset(s)
    backbone = s.make()
    whole = _extract(s, backbone, ds, "test")
    n = len(whole)
    for bounds in ((0, n // 3, n), (0, n - 1, n)):
        parts = []
        for rows in zip(bounds[:-1], bounds[1:]):
            what = f"extract(dataset, 'test', context) with FitContext.rows={rows}"
            out = call(what, backbone.extract, ds, "test", FitContext(seed=0, rows=rows))
            if not isinstance(out, ModelOutputs):
                raise Broken(f"{what} returned {brief(out)}, expected selbench.ModelOutputs")
            if len(out) != rows[1] - rows[0]:
                raise Broken(f"it declares shardable, but {what} returned {len(out)} rows, "
                             f"expected {rows[1] - rows[0]}")
            if out.meta != whole.meta:
                raise Broken(f"{what}.meta differ from the whole split's meta (a shard's "
                             "meta must describe the whole split)")
            parts.append(out)
        for name in ("features", "logits", "labels", "domain"):
            want = getattr(whole, name)
            got = [getattr(p, name) for p in parts]
            if want is None or any(g is None for g in got):
                if not (want is None and all(g is None for g in got)):
                    raise Broken(f"row ranges of split 'test' give {name} "
                                 f"{'None' if want is not None else 'arrays'} where the "
                                 "whole split does not")
                continue
            joined = np.concatenate(got)
            if not equal(joined, want):
                raise Broken(f"row ranges {bounds} of split 'test', concatenated, differ from "
                             f"the whole split's {name} ({diff(joined, want)})")


