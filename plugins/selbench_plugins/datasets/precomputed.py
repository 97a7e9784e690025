"""``precomputed``: your own model's outputs from an ``.npz`` file, with the ``precomputed``
pass-through backbone.

The file holds one row per example:

* ``labels`` — int ``[N]`` classes (required);
* ``logits`` ``[N, K]`` **or** ``probabilities`` ``[N, K]`` (softmax output; turned into
  log-probabilities, see :meth:`selbench.data.ModelOutputs.from_probabilities`). If both
  are present the logits are used;
* ``features`` ``[N, d]`` — optional embedding for the learned selector; without it the
  selector's "features" are the probability vector;
* ``domain`` ``[N]`` — optional domain ids (or strings);
* ``split`` ``[N]`` — optional split tags (strings or ints), e.g. ``"val"`` / ``"test"``;
* ``class_names`` ``[K]`` — optional strings.

Arrays may be stored under other names: ``keys`` maps a role to the name in the file, e.g.
``keys: {labels: ground_truth, probabilities: predictions}``.

Splits: with a ``split`` array, ``splits`` maps each selbench split to the tags it takes,
e.g. ``{val: [val], test: [test, test_ood]}`` (default: one split per distinct tag, named by
it). Without one, the rows are partitioned at random (seeded by ``seed``) with the given
``fractions``, e.g. ``{val: 0.5, test: 0.5}``.

Pair the dataset with the ``precomputed`` backbone, which returns the split's outputs as
they are. Save string arrays as fixed-width strings (``np.array(["val", ...])``), not as
Python objects: the file is read with ``allow_pickle=False``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, field_validator, model_validator
from selbench.api import Backbone, Dataset, FitContext, NoParams, Params, Plugin, SplitData
from selbench.data import DataError, ModelOutputs

__all__ = [
    "BACKBONE_PLUGIN",
    "PLUGIN",
    "PrecomputedBackbone",
    "PrecomputedDataset",
    "PrecomputedParams",
]

ROLES = ("labels", "logits", "probabilities", "features", "domain", "split", "class_names")


class PrecomputedParams(Params):
    path: str = Field(description="the .npz file of model outputs")
    keys: dict[str, str] = Field(
        default_factory=dict,
        description="role -> array name in the file, for names other than the roles "
        f"({', '.join(ROLES)})",
    )
    splits: dict[str, list[str]] | None = Field(
        None,
        description="selbench split -> values of the file's 'split' array it takes (default: "
        "one split per distinct value)",
    )
    fractions: dict[str, float] = Field(
        default_factory=lambda: {"val": 0.5, "test": 0.5},
        description="without a 'split' array: seeded random partition, split -> fraction",
    )
    seed: int = Field(0, ge=0, description="seed of the random partition")

    @field_validator("keys")
    @classmethod
    def _keys(cls, v: dict[str, str]) -> dict[str, str]:
        bad = sorted(set(v) - set(ROLES))
        if bad:
            raise ValueError(f"unknown role(s) {bad}; roles are {', '.join(ROLES)}")
        return v

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("at least one split is needed")
        if any(not (0.0 < f <= 1.0) for f in v.values()):
            raise ValueError("every fraction must lie in (0, 1]")
        if sum(v.values()) > 1.0 + 1e-9:
            raise ValueError(f"fractions sum to {sum(v.values()):g} > 1")
        return v

    @model_validator(mode="after")
    def _splits(self) -> PrecomputedParams:
        if self.splits is not None:
            if not self.splits or any(not tags for tags in self.splits.values()):
                raise ValueError("splits: every split needs at least one tag")
            seen: dict[str, str] = {}
            for name, tags in self.splits.items():
                for t in tags:
                    if t in seen:
                        raise ValueError(
                            f"splits: tag {t!r} is given to both {seen[t]!r} and {name!r}"
                        )
                    seen[t] = name
        return self


class PrecomputedDataset(Dataset):
    """Model outputs from an ``.npz`` (labels + logits or probabilities, optional features,
    domain, split tags); each split's inputs are ready :class:`ModelOutputs`."""

    input_kind = "model-outputs"

    def __init__(
        self,
        path: str,
        keys: dict[str, str] | None = None,
        splits: dict[str, list[str]] | None = None,
        fractions: dict[str, float] | None = None,
        seed: int = 0,
    ):
        params = PrecomputedParams(
            path=path, keys=keys or {}, splits=splits,
            fractions=fractions if fractions is not None else {"val": 0.5, "test": 0.5},
            seed=seed,
        )  # fmt: skip
        self.path = params.path
        self.keys = dict(params.keys)
        self.splits_map = None if params.splits is None else dict(params.splits)
        self.fractions = dict(params.fractions)
        self.seed = params.seed
        self._loaded: dict[str, Any] | None = None

    # ------------------------------------------------------------------ reading
    def _name(self, role: str) -> str:
        return self.keys.get(role, role)

    def _load(self) -> dict[str, Any]:
        if self._loaded is not None:
            return self._loaded
        path = Path(self.path)
        if not path.is_file():
            raise FileNotFoundError(
                f"precomputed: model-output file {path} does not exist; write it with "
                "np.savez(path, labels=..., logits=... or probabilities=..., [features=..., "
                "domain=..., split=...])"
            )
        try:
            z = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"precomputed: {path} is not a readable .npz file ({exc})") from exc
        if not hasattr(z, "files"):
            raise ValueError(f"precomputed: {path} holds a single array, not an .npz archive")
        arrays: dict[str, Any] = {}
        with z:
            for role in ROLES:
                name = self._name(role)
                if name in z.files:
                    try:
                        arrays[role] = z[name]
                    except ValueError as exc:  # object arrays need pickle
                        raise ValueError(
                            f"precomputed: {path}: array {name!r} ({role}) cannot be read "
                            f"without pickle ({exc}); save strings as a fixed-width string "
                            "array, e.g. np.array(['val', 'test']), not dtype=object"
                        ) from exc
                elif role in self.keys:
                    raise ValueError(
                        f"precomputed: {path}: keys.{role} names array {name!r}, which is not "
                        f"in the file; it holds {', '.join(z.files)}"
                    )
            files = list(z.files)
        if "labels" not in arrays:
            raise ValueError(
                f"precomputed: {path}: no {self._name('labels')!r} array (the labels); the "
                f"file holds {', '.join(files)}; map names with keys: {{labels: <name>}}"
            )
        if "logits" not in arrays and "probabilities" not in arrays:
            raise ValueError(
                f"precomputed: {path}: needs a {self._name('logits')!r} or a "
                f"{self._name('probabilities')!r} array; the file holds {', '.join(files)}; map "
                "names with keys: {logits: <name>} or {probabilities: <name>}"
            )
        n_labels = np.shape(arrays["labels"])[0] if np.ndim(arrays["labels"]) else 0
        for role in ("logits", "probabilities", "features", "domain", "split"):
            if role in arrays and np.ndim(arrays[role]) and len(arrays[role]) != n_labels:
                raise DataError(
                    f"precomputed: {path}: array {self._name(role)!r} ({role}) has "
                    f"{len(arrays[role])} rows but {self._name('labels')!r} (labels) has "
                    f"{n_labels}; every array must describe the same examples"
                )
        outputs = self._outputs(arrays, path)
        n = len(outputs)
        tags = None
        if "split" in arrays:
            tags = np.asarray(arrays["split"])
            if tags.shape != (n,):
                raise ValueError(
                    f"precomputed: {path}: array {self._name('split')!r} (split) has shape "
                    f"{tags.shape}, expected ({n},)"
                )
            tags = tags.astype(str)
        class_names = None
        if "class_names" in arrays:
            class_names = [str(c) for c in np.asarray(arrays["class_names"]).ravel()]
            if len(class_names) != outputs.num_classes:
                raise ValueError(
                    f"precomputed: {path}: array {self._name('class_names')!r} has "
                    f"{len(class_names)} names for K={outputs.num_classes} classes"
                )
        self._loaded = {
            "outputs": outputs,
            "index": self._partition(tags, n, path),
            "class_names": class_names,
        }
        return self._loaded

    def _outputs(self, arrays: dict[str, Any], path: Path) -> ModelOutputs:
        meta = {"source": str(path)}
        try:
            if "logits" in arrays:
                features = arrays.get("features")
                if features is None:  # no embedding: use the probability vector
                    z = np.asarray(arrays["logits"], dtype=np.float64)
                    if z.ndim == 2 and z.shape[0]:
                        z = z - z.max(axis=1, keepdims=True)
                        e = np.exp(z)
                        features = e / e.sum(axis=1, keepdims=True)
                    else:
                        features = z
                return ModelOutputs(
                    features=features, logits=arrays["logits"], labels=arrays["labels"],
                    domain=arrays.get("domain"), meta=meta,
                )  # fmt: skip
            return ModelOutputs.from_probabilities(
                arrays["probabilities"], arrays["labels"], features=arrays.get("features"),
                domain=arrays.get("domain"), meta=meta,
            )  # fmt: skip
        except DataError as exc:
            raise DataError(f"precomputed: {path}: {_role_message(exc, self.keys)}") from exc

    def _partition(self, tags: np.ndarray | None, n: int, path: Path) -> dict[str, np.ndarray]:
        if tags is not None:
            values = sorted(set(tags.tolist()))
            mapping = self.splits_map or {v: [v] for v in values}
            index = {}
            for name, wanted in mapping.items():
                missing = [t for t in wanted if t not in values]
                if missing:
                    raise ValueError(
                        f"precomputed: {path}: splits.{name} asks for tag(s) {missing} but the "
                        f"{self._name('split')!r} array holds {values}"
                    )
                index[name] = np.flatnonzero(np.isin(tags, wanted))
            return index
        if self.splits_map is not None:
            raise ValueError(
                f"precomputed: {path}: splits maps split tags, but the file has no "
                f"{self._name('split')!r} array; give fractions instead, or add the array"
            )
        rng = np.random.default_rng([self.seed, 0x5B17])
        perm = rng.permutation(n)
        index, start = {}, 0
        for name, frac in self.fractions.items():
            size = round(frac * n)
            index[name] = np.sort(perm[start:start + size])
            start += size
        empty = [k for k, v in index.items() if v.size == 0]
        if empty:
            raise ValueError(
                f"precomputed: {path}: split(s) {empty} would be empty with {n} rows and "
                f"fractions {self.fractions}"
            )
        return index

    # ------------------------------------------------------------------ API
    @property
    def num_classes(self) -> int:  # type: ignore[override]
        return self._load()["outputs"].num_classes

    def splits(self) -> list[str]:
        if self.splits_map is not None:
            return list(self.splits_map)
        if self._loaded is None and not Path(self.path).is_file():
            return list(self.fractions)  # split() then says the file is missing
        return list(self._load()["index"])

    def split(self, name: str) -> SplitData:
        loaded = self._load()
        if name not in loaded["index"]:
            raise KeyError(
                f"precomputed: no split {name!r}; available: {', '.join(loaded['index'])}"
            )
        out = loaded["outputs"].subset(loaded["index"][name])
        return SplitData(
            inputs=out, labels=out.labels, domain=out.domain,
            class_names=loaded["class_names"], meta={"source": self.path, "split": name},
        )  # fmt: skip


def _role_message(exc: Exception, keys: dict[str, str]) -> str:
    msg = str(exc)
    for role, name in keys.items():
        if msg.startswith(f"{role}:"):
            return f"array {name!r} ({role}){msg[len(role):]}"
    return msg


class PrecomputedBackbone(Backbone):
    """Pass-through: returns the dataset's ready-made outputs (use with ``precomputed``)."""

    input_kinds = frozenset({"model-outputs"})

    def extract(self, dataset: Dataset, split: str, context: FitContext) -> ModelOutputs:
        data = dataset.split(split)
        if not isinstance(data.inputs, ModelOutputs):
            raise TypeError(
                f"precomputed backbone: split {split!r} of {type(dataset).__name__} holds "
                f"{type(data.inputs).__name__}, not model outputs; pair it with the "
                "'precomputed' dataset (or use an image backbone)"
            )
        return data.inputs


PLUGIN = Plugin(
    "precomputed",
    PrecomputedDataset,
    PrecomputedParams,
    summary="your own model outputs from an .npz (labels + logits or probabilities, optional "
    "features / domain / split tags)",
)

BACKBONE_PLUGIN = Plugin(
    "precomputed",
    PrecomputedBackbone,
    NoParams,
    summary="pass-through for the 'precomputed' dataset: returns its outputs unchanged",
)
