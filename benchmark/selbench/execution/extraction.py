"""Backbone outputs: the outputs of an experiment's fitting and evaluation splits come from
the on-disk cache (:mod:`selbench.store.cache`), computed once per dataset + backbone
configuration + split. :class:`Extraction` builds the dataset and the backbone only when some
split is missing, extracts a split whole or — for a shardable backbone, in a distributed
run — one row range at a time, and merges the ranges; :func:`experiment_outputs` is what a
run reads.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from selbench.contract.api import FitContext
from selbench.contract.data import DataError, ModelOutputs
from selbench.execution.errors import RunError
from selbench.execution.guard import blame_plugin, describe_plugin, failure
from selbench.spec import ResolvedSpec, SpecError
from selbench.store.cache import OutputCache

__all__ = ["Extraction", "experiment_outputs"]


class Extraction:
    """The backbone outputs of one experiment: built lazily (the dataset and the backbone
    only when some split is not cached), each split extracted whole or — for a backbone
    declaring :attr:`selbench.contract.api.Backbone.shardable`, in a distributed run — one row range
    at a time; every failure is one line naming the experiment and the plugin."""

    def __init__(self, resolved: ResolvedSpec, e_i: int,
                 keys: Mapping[str, tuple[str, dict]], cache: OutputCache, device: str,
                 progress: bool):
        self.resolved, self.e_i, self.cache = resolved, e_i, cache
        self.device, self.progress = device, progress
        self.exp = exp = resolved.spec.experiments[e_i]
        self.where = f"experiments[{e_i}] ({exp.name})"
        self.keys = dict(keys)  # split -> (cache key, key material): the run plan's
        self.names = {"dataset": describe_plugin(resolved, "dataset", exp.dataset),
                      "backbone": describe_plugin(resolved, "backbone", exp.backbone)}
        self._factories = [(self.names[k], resolved.registry.get(k, getattr(exp, k).name)
                            .plugin.factory) for k in ("dataset", "backbone")]
        self._dataset: Any = None
        self._backbone: Any = None
        self._labels: dict[str, np.ndarray] = {}

    @property
    def shardable(self) -> bool:
        """Whether the backbone declares that ``extract`` honours ``FitContext.rows``."""
        factory = self._factories[1][1]
        return isinstance(factory, type) and getattr(factory, "shardable", False) is True

    def warn(self, msg: str) -> None:
        print(f"selbench: warning: {msg}", file=sys.stderr)

    def guarded(self, stage: str, fn):
        try:
            return fn()
        except (KeyboardInterrupt, GeneratorExit, RunError):
            raise
        except BaseException as exc:
            blame = blame_plugin(exc, self._factories)
            if isinstance(exc, (DataError, ValueError, FileNotFoundError)):
                raise RunError(f"{self.where}: {blame or 'dataset/backbone'}, "
                               f"{stage}: {exc}") from exc
            raise failure(self.where, stage, exc, blame) from exc

    def dataset(self) -> Any:
        """The dataset (built once), the spec's splits checked against it."""
        if self._dataset is None:
            exp = self.exp
            dataset = self.guarded("building the dataset",
                                   lambda: self.resolved.build("dataset", exp.dataset))
            available = list(self.guarded("listing the splits", dataset.splits))
            for which, name in (("fit_split", exp.fit_split), ("eval_split", exp.eval_split)):
                if name not in available:
                    raise SpecError([
                        f"experiments[{self.e_i}].{which}: dataset {exp.dataset.name!r} has "
                        f"no split {name!r}; available: {', '.join(map(str, available))}"
                    ], self.resolved.source)
            self._dataset = dataset
        return self._dataset

    def backbone(self) -> Any:
        """The backbone (built once)."""
        if self._backbone is None:
            self.dataset()  # a missing split is reported before the backbone is built
            self._backbone = self.guarded("building the backbone",
                                          lambda: self.resolved.build("backbone", self.exp.backbone))
        return self._backbone

    def labels(self, split: str) -> np.ndarray:
        """The split's labels (the dataset's own, not the backbone's), to size and check
        shards."""
        if split not in self._labels:
            dataset = self.dataset()
            data = self.guarded(f"loading split {split!r}", lambda: dataset.split(split))
            self._labels[split] = np.asarray(data.labels)
        return self._labels[split]

    def extract(self, split: str, rows: tuple[int, int] | None = None) -> ModelOutputs:
        """Run the backbone on ``split`` (only ``rows`` when given), checked."""
        dataset, backbone = self.dataset(), self.backbone()
        key, _ = self.keys[split]
        ctx = FitContext(seed=0, device=self.device, beta=1.0, progress=self.progress,
                         cache_dir=self.cache.workdir(key), rows=rows)
        what = f"split {split!r}" + (f" rows [{rows[0]}, {rows[1]})" if rows else "")
        if self.progress:
            print(f"[{self.exp.name}] extracting {self.exp.backbone.name} outputs on {what}",
                  file=sys.stderr)
        outputs = self.guarded(f"extracting {what}", lambda: backbone.extract(dataset, split, ctx))
        if not isinstance(outputs, ModelOutputs):
            raise RunError(f"{self.where}: {self.names['backbone']}.extract returned "
                           f"{type(outputs).__name__}, expected selbench.ModelOutputs")
        if rows is not None:
            expected = self.labels(split)[rows[0]:rows[1]]
            if len(outputs) != len(expected) or not np.array_equal(outputs.labels, expected):
                raise RunError(
                    f"{self.where}: {self.names['backbone']} declares shardable, but "
                    f"extract with FitContext.rows=({rows[0]}, {rows[1]}) returned "
                    f"{len(outputs)} rows that are not rows {rows[0]}..{rows[1] - 1} of split "
                    f"{split!r}; honour context.rows or remove `shardable = True`")
        return outputs

    def split(self, split: str) -> ModelOutputs:
        """The whole split's outputs: from the cache, else extracted and cached."""
        key, material = self.keys[split]
        cached = self.cache.get(key, warn=self.warn)
        if cached is None:
            cached = self.extract(split)
            self.cache.put(key, cached, material)
        return cached

    def shard(self, split: str, rows: tuple[int, int]) -> bool:
        """Extract and store one row range of ``split`` unless it is stored already (or the
        whole split is cached); returns whether it computed anything."""
        key, material = self.keys[split]
        if self.cache.path(key).is_file() or \
                self.cache.get_shard(key, rows, warn=self.warn) is not None:
            return False
        self.cache.put_shard(key, rows, self.extract(split, rows), material)
        return True

    def merge(self, split: str, shards: list[tuple[int, int]]) -> None:
        """Concatenate the stored shards of ``split`` into its cached outputs (written once,
        atomically), then delete the shards."""
        key, material = self.keys[split]
        if self.cache.get(key) is not None:
            self.cache.drop_shards(key)
            return
        parts = []
        for rows in shards:
            part = self.cache.get_shard(key, rows, warn=self.warn)
            if part is None:
                raise RunError(f"{self.where}: the outputs of split {split!r} rows "
                               f"[{rows[0]}, {rows[1]}) are missing from the cache "
                               f"{self.cache.root} after their job finished (is it on a "
                               "filesystem every job shares?); rerun to extract them again")
            if parts and part.meta != parts[0].meta:
                raise RunError(f"{self.where}: {self.names['backbone']} declares shardable, "
                               f"but its outputs' meta differ between row ranges of split "
                               f"{split!r} ({parts[0].meta} vs {part.meta})")
            parts.append(part)
        domains = [p.domain for p in parts]
        merged = ModelOutputs(
            features=np.concatenate([p.features for p in parts]),
            logits=np.concatenate([p.logits for p in parts]),
            labels=np.concatenate([p.labels for p in parts]),
            domain=None if any(d is None for d in domains) else np.concatenate(domains),
            meta=parts[0].meta,
        )
        self.cache.put(key, merged, material)
        self.cache.drop_shards(key)


def experiment_outputs(
    resolved: ResolvedSpec,
    e_i: int,
    keys: Mapping[str, tuple[str, dict]],
    cache: OutputCache,
    device: str,
    progress: bool,
) -> dict[str, ModelOutputs]:
    """Backbone outputs of the experiment's fitting and evaluation splits, via the cache;
    ``keys``: split -> (cache key, key material), the run plan's
    (:attr:`selbench.execution.plan.RunPlan.output_keys`, or
    :func:`selbench.execution.keys.output_keys` outside a run)."""
    ex = Extraction(resolved, e_i, keys, cache, device, progress)
    return {split: ex.split(split) for split in ex.keys}
