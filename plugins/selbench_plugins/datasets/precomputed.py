"""``precomputed``: your own model's outputs from an ``.npz`` file, with the ``precomputed``
pass-through backbone.

The file holds one row per example:

* ``labels`` — int ``[N]`` classes (required);
* ``logits`` ``[N, K]`` **or** ``probabilities`` ``[N, K]`` (softmax output; turned into
  log-probabilities, see :meth:`selbench.contract.data.ModelOutputs.from_probabilities`). If both
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

``sha256`` (optional) names the file's SHA-256, in full or its first 16 or more hex digits
(as published beside a file, e.g. ``../shared/data/README.md``): a copy whose digest differs
is refused at ``selbench validate`` and before any computation, in one line naming the file,
both digests and the parameter.

Pair the dataset with the ``precomputed`` backbone
(:mod:`selbench_plugins.backbones.precomputed`), which returns the split's outputs as they
are. Save string arrays as fixed-width strings (``np.array(["val", ...])``), not as
Python objects: the file is read with ``allow_pickle=False``.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
import zlib
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, Field
from selbench.contract.api import Dataset, Plugin, SplitData
from selbench.contract.data import DataError, ModelOutputs
from selbench.contract.inputs import InputFile

__all__ = [
    "PLUGIN",
    "MissingOutputsFile",
    "PrecomputedDataset",
]

ROLES = ("labels", "logits", "probabilities", "features", "domain", "split", "class_names")


class MissingOutputsFile(DataError, FileNotFoundError):
    """The ``.npz`` does not exist (a :class:`DataError`, and a ``FileNotFoundError``)."""


_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a member first, or an empty archive


def _listing(files: list[str]) -> str:
    return ", ".join(repr(f) for f in files) if files else "no arrays"


def _read_npz(path: Path, keys: dict[str, str]) -> tuple[dict[str, np.ndarray], list[str]]:
    """The role arrays of an ``.npz`` and the names it holds, read without pickle.

    Every way the file can be broken is a :class:`DataError` naming the file and what is
    wrong, never a traceback from numpy or zipfile.
    """
    where = f"precomputed: {path}"
    _check_header(path, where)
    try:
        z = np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, EOFError, ValueError, KeyError) as exc:
        raise DataError(
            f"{where} is a truncated or damaged .npz archive: it starts like a zip file but "
            f"its table of contents cannot be read ({type(exc).__name__}: {exc}); was it "
            "copied or written completely?"
        ) from exc
    except OSError as exc:
        raise DataError(f"{where}: cannot read the file ({exc.strerror or exc})") from exc
    arrays: dict[str, np.ndarray] = {}
    with z:
        files = list(z.files)
        for role in ROLES:
            name = keys.get(role, role)
            if name not in files:
                if role in keys:
                    raise DataError(
                        f"{where}: keys.{role} names array {name!r}, which is not in the file; "
                        f"it holds {_listing(files)}"
                    )
                continue
            arrays[role] = _read_member(z, name, role, where)
    return arrays, files


def _check_header(path: Path, where: str) -> None:
    """That ``path`` is a file which starts as a zip archive does (a DataError, or a
    :class:`MissingOutputsFile`, saying what it is instead)."""
    if path.is_dir():
        raise DataError(f"{where} is a folder, not an .npz file")
    if not path.is_file():
        raise MissingOutputsFile(
            f"{where}: model-output file does not exist; write it with np.savez(path, "
            "labels=..., logits=... or probabilities=..., [features=..., domain=..., split=...])"
        )
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise DataError(f"{where}: cannot read the file ({exc.strerror or exc})") from exc
    if not head:
        raise DataError(
            f"{where} is empty (0 bytes): it was not written completely; write it again with "
            "np.savez"
        )
    if head.startswith(_NPY_MAGIC):
        raise DataError(
            f"{where} holds a single array (.npy format), not an .npz archive of named arrays; "
            "write it with np.savez(path, labels=..., logits=...)"
        )
    if not head.startswith(_ZIP_MAGIC):
        raise DataError(
            f"{where} is not an .npz archive (not a zip file; it starts with {head[:8]!r}); "
            "write it with np.savez(path, labels=..., logits=...)"
        )


def _read_member(z: Any, name: str, role: str, where: str) -> np.ndarray:
    """The array ``name`` (read for ``role``) of the open archive ``z``."""
    try:
        value = z[name]
    except ValueError as exc:
        if "allow_pickle" in str(exc) or "Object arrays" in str(exc):
            raise DataError(
                f"{where}: array {name!r} ({role}) is stored as pickled Python objects "
                "(dtype=object), which selbench does not unpickle; save numbers as a "
                "numeric array and strings as a fixed-width string array, e.g. "
                "np.array(['val', 'test']), not dtype=object"
            ) from exc
        raise DataError(
            f"{where}: array {name!r} ({role}) is not a readable .npy member ({exc})"
        ) from exc
    except (zipfile.BadZipFile, EOFError, KeyError, OSError, zlib.error) as exc:
        raise DataError(
            f"{where}: array {name!r} ({role}) is truncated or damaged "
            f"({type(exc).__name__}: {exc}); was the file copied or written completely?"
        ) from exc
    if not isinstance(value, np.ndarray):  # numpy returns a non-.npy member as bytes
        raise DataError(
            f"{where}: member {name!r} ({role}) is not a numpy array (.npy) but "
            f"{len(value)} bytes of something else; write the file with np.savez"
        )
    return value


def _member_header(zf: zipfile.ZipFile, name: str, role: str,
                   where: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of the archive's array ``name`` from its ``.npy`` header alone
    (the data are not read); a :class:`DataError` like :func:`_read_member`'s otherwise."""
    try:
        with zf.open(name + ".npy") as fh:
            version = np.lib.format.read_magic(fh)
            read = {(1, 0): np.lib.format.read_array_header_1_0,
                    (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read is None:  # a rarer header version: read the array itself
                with np.load(fh, allow_pickle=False) as arr:  # pragma: no cover
                    return arr.shape, arr.dtype
            shape, _, dtype = read(fh)
    except (ValueError, EOFError, zipfile.BadZipFile, OSError, zlib.error) as exc:
        raise DataError(
            f"{where}: array {name!r} ({role}) is not a readable .npy member "
            f"({type(exc).__name__}: {exc}); write the file with np.savez"
        ) from exc
    if dtype.hasobject:
        raise DataError(
            f"{where}: array {name!r} ({role}) is stored as pickled Python objects "
            "(dtype=object), which selbench does not unpickle; save numbers as a numeric "
            "array and strings as a fixed-width string array, e.g. np.array(['val', 'test'])"
        )
    return shape, dtype


class _Header:
    """An array's shape and dtype, read from its ``.npy`` header, standing in for the array
    in :meth:`PrecomputedDataset._check_arrays` (``values=False``)."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype):
        self.shape, self.dtype, self.ndim = tuple(shape), dtype, len(shape)

    def __len__(self) -> int:
        return self.shape[0]


def _npz_headers(path: Path, keys: dict[str, str]) -> tuple[dict[str, tuple], list[str]]:
    """``role -> (shape, dtype)`` of the role arrays of an ``.npz`` from its table of
    contents and the arrays' headers (no data read), and the names it holds."""
    where = f"precomputed: {path}"
    _check_header(path, where)
    try:
        with zipfile.ZipFile(path) as zf:
            files = [n[:-4] for n in zf.namelist() if n.endswith(".npy")]
            headers = {}
            for role in ROLES:
                name = keys.get(role, role)
                if name in files:
                    headers[role] = _member_header(zf, name, role, where)
                elif role in keys:
                    raise DataError(
                        f"{where}: keys.{role} names array {name!r}, which is not in the "
                        f"file; it holds {_listing(files)}"
                    )
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise DataError(
            f"{where} is a truncated or damaged .npz archive: it starts like a zip file but "
            f"its table of contents cannot be read ({type(exc).__name__}: {exc}); was it "
            "copied or written completely?"
        ) from exc
    return headers, files


def _hex_digest(v: str | None) -> str | None:
    if v is not None and not re.fullmatch(r"[0-9a-fA-F]{16,64}", v):
        raise ValueError(f"sha256 must be 16 to 64 hexadecimal digits (the file's SHA-256 or "
                         f"its first digits), got {v!r}")
    return None if v is None else v.lower()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _known_roles(v: dict[str, str]) -> dict[str, str]:
    bad = sorted(set(v) - set(ROLES))
    if bad:
        raise ValueError(f"unknown role(s) {bad}; roles are {', '.join(ROLES)}")
    return v


def _partition(v: dict[str, float]) -> dict[str, float]:
    if not v:
        raise ValueError("at least one split is needed")
    if any(not (0.0 < f <= 1.0) for f in v.values()):
        raise ValueError("every fraction must lie in (0, 1]")
    if sum(v.values()) > 1.0 + 1e-9:
        raise ValueError(f"fractions sum to {sum(v.values()):g} > 1")
    return v


def _distinct_tags(v: dict[str, list[str]] | None) -> dict[str, list[str]] | None:
    if v is not None:
        if not v or any(not tags for tags in v.values()):
            raise ValueError("splits: every split needs at least one tag")
        seen: dict[str, str] = {}
        for name, tags in v.items():
            for t in tags:
                if t in seen:
                    raise ValueError(f"splits: tag {t!r} is given to both {seen[t]!r} and {name!r}")
                seen[t] = name
    return v


class PrecomputedDataset(Dataset):
    """Model outputs from an ``.npz`` (labels + logits or probabilities, optional features,
    domain, split tags); each split's inputs are ready :class:`ModelOutputs`."""

    input_kind = "model-outputs"
    #: the ``splits`` parameter is kept as ``splits_map`` (``splits()`` lists the splits)
    param_attributes = {"splits": "splits_map"}

    def __init__(
        self,
        path: Annotated[InputFile, Field(description="the .npz file of model outputs")],
        keys: Annotated[dict[str, str], AfterValidator(_known_roles), Field(
            description="role -> array name in the file, for names other than the roles "
            f"({', '.join(ROLES)})",
        )] = {},  # noqa: B006 - never mutated; pydantic copies it for every spec
        splits: Annotated[dict[str, list[str]] | None, AfterValidator(_distinct_tags), Field(
            description="selbench split -> values of the file's 'split' array it takes "
            "(default: one split per distinct value)",
        )] = None,
        fractions: Annotated[dict[str, float], AfterValidator(_partition), Field(
            description="without a 'split' array: seeded random partition, split -> fraction",
        )] = {"val": 0.5, "test": 0.5},  # noqa: B006 - never mutated, as keys
        seed: Annotated[int, Field(ge=0, description="seed of the random partition")] = 0,
        sha256: Annotated[str | None, AfterValidator(_hex_digest), Field(
            description="the file's expected SHA-256 (64 hex digits, or its first 16 or "
            "more); a copy with another digest is refused, naming the file",
        )] = None,
    ):
        self.path = path
        self.keys = keys
        self.splits_map = splits
        self.fractions = fractions
        self.seed = seed
        self.sha256 = sha256
        self._loaded: dict[str, Any] | None = None
        self._verified = False

    # ------------------------------------------------------------------ reading
    def _name(self, role: str) -> str:
        return self.keys.get(role, role)

    def _verify(self, path: Path) -> None:
        """The file's SHA-256 starts with ``sha256`` (when given), else a :class:`DataError`
        naming the file, both digests and the parameter."""
        if self.sha256 is None or self._verified:
            return
        _check_header(path, f"precomputed: {path}")
        try:
            got = _file_sha256(path)
        except OSError as exc:
            raise DataError(f"precomputed: {path}: cannot read the file "
                            f"({exc.strerror or exc})") from exc
        if not got.startswith(self.sha256):
            raise DataError(
                f"precomputed: {path}: SHA-256 {got[:len(self.sha256)]} does not match the "
                f"expected {self.sha256} (parameter sha256): another or a damaged copy of the "
                "file; fetch the original, or update sha256 if the file changed on purpose"
            )
        self._verified = True

    def _load(self) -> dict[str, Any]:
        if self._loaded is not None:
            return self._loaded
        path = Path(self.path)
        self._verify(path)
        arrays, files = _read_npz(path, self.keys)
        self._required(set(arrays), files, path)
        self._check_arrays(arrays, path)
        outputs = self._outputs(arrays, path)
        n = len(outputs)
        tags = None
        if "split" in arrays:
            tags = np.asarray(arrays["split"])
            if tags.shape != (n,):
                raise DataError(
                    f"precomputed: {path}: array {self._name('split')!r} (split) has shape "
                    f"{tags.shape}, expected ({n},)"
                )
            tags = tags.astype(str)
        class_names = None
        if "class_names" in arrays:
            class_names = [str(c) for c in np.asarray(arrays["class_names"]).ravel()]
            if len(class_names) != outputs.num_classes:
                raise DataError(
                    f"precomputed: {path}: array {self._name('class_names')!r} has "
                    f"{len(class_names)} names for K={outputs.num_classes} classes"
                )
        self._loaded = {
            "outputs": outputs,
            "index": self._partition(tags, n, path),
            "class_names": class_names,
        }
        return self._loaded

    def _required(self, present: set[str], files: list[str], path: Path) -> None:
        """The labels and the logits or probabilities are among the ``present`` roles."""
        if "labels" not in present:
            raise DataError(
                f"precomputed: {path}: no {self._name('labels')!r} array (the labels); the "
                f"file holds {_listing(files)}; map names with keys: {{labels: <name>}}"
            )
        if "logits" not in present and "probabilities" not in present:
            raise DataError(
                f"precomputed: {path}: needs a {self._name('logits')!r} or a "
                f"{self._name('probabilities')!r} array; the file holds {_listing(files)}; map "
                "names with keys: {logits: <name>} or {probabilities: <name>}"
            )

    def check_inputs(self) -> None:
        """The ``.npz``'s table of contents and the headers of the arrays it is read for:
        present, not pickled, of the right dimensions and row counts (the data are read,
        and their values checked, when a run loads the file)."""
        self._headers()

    def _headers(self) -> tuple[dict[str, tuple], list[str], int]:
        path = Path(self.path)
        self._verify(path)
        headers, files = _npz_headers(path, self.keys)
        self._required(set(headers), files, path)
        n = headers["labels"][0][0] if len(headers["labels"][0]) == 1 else -1
        self._check_arrays({role: _Header(*h) for role, h in headers.items()}, path,
                           values=False)
        return headers, files, n

    def split_sizes(self) -> dict[str, int]:
        """From the headers (and the ``split`` array, when the file has one): the rows each
        split takes, exactly as :meth:`split` partitions them."""
        headers, _, n = self._headers()
        tags = None
        if "split" in headers:
            with np.load(self.path, allow_pickle=False) as z:
                tags = np.asarray(_read_member(z, self._name("split"), "split",
                                               f"precomputed: {self.path}")).astype(str)
        index = self._partition(tags, n, Path(self.path))
        return {name: int(len(rows)) for name, rows in index.items()}

    def _check_arrays(self, arrays: dict[str, np.ndarray], path: Path,
                      values: bool = True) -> None:
        """Shapes, row counts, dtypes and (with ``values``) finiteness, each message naming
        the file's array."""

        def where(role: str) -> str:
            return f"precomputed: {path}: array {self._name(role)!r} ({role})"

        labels = arrays["labels"]
        if labels.ndim != 1:
            raise DataError(
                f"{where('labels')} has shape {labels.shape}, expected one class index per "
                "row, shape [N]"
            )
        n = labels.shape[0]
        if n == 0:
            raise DataError(
                f"precomputed: {path}: the file holds zero rows (array "
                f"{self._name('labels')!r} is empty); it needs at least one example per split"
            )
        for role in ("logits", "probabilities", "features"):
            if role not in arrays:
                continue
            arr = arrays[role]
            if arr.ndim != 2:
                shape = "[N, d]" if role == "features" else "[N, K]"
                raise DataError(f"{where(role)} has shape {arr.shape}, expected 2-D {shape}")
            if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
                raise DataError(f"{where(role)} holds {arr.dtype} values, expected real numbers")
        for role in ("logits", "probabilities", "features", "domain", "split"):
            if role in arrays and arrays[role].ndim and len(arrays[role]) != n:
                raise DataError(
                    f"{where(role)} has {len(arrays[role])} rows but {self._name('labels')!r} "
                    f"(labels) has {n}; every array must describe the same examples"
                )
            if role in arrays and arrays[role].ndim == 0:
                raise DataError(f"{where(role)} is a single value (shape ()), expected one per row")
        for role in ("logits", "probabilities", "features") if values else ():
            if role in arrays and np.issubdtype(arrays[role].dtype, np.floating):
                finite = np.isfinite(arrays[role])
                if not finite.all():
                    row, col = (int(i) for i in np.argwhere(~finite)[0])
                    raise DataError(
                        f"{where(role)} contains NaN or infinite values (first at row {row}, "
                        f"column {col})"
                    )

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
            names = {role: self._name(role) for role in arrays}
            raise DataError(f"precomputed: {path}: {_role_message(exc, names)}") from exc

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


def _role_message(exc: Exception, names: dict[str, str]) -> str:
    """``"logits: ..."`` from :class:`ModelOutputs` as ``"array 'z' (logits): ..."``."""
    msg = str(exc)
    for role, name in names.items():
        if msg.startswith(f"{role}:"):
            return f"array {name!r} ({role}){msg[len(role):]}"
    return msg


PLUGIN = Plugin(
    "precomputed",
    PrecomputedDataset,
    summary="your own model outputs from an .npz (labels + logits or probabilities, optional "
    "features / domain / split tags)",
)
