"""Files and folders a plugin reads: declared by the plugin, resolved and hashed by the core.

A plugin declares which of its parameters name input files or folders by annotating them in
its :class:`~selbench.contract.api.Params` model::

    from selbench import InputDir, InputFile, Params

    class MyParams(Params):
        path: InputFile = Field(description="the .npz of model outputs")
        root: InputDir(metadata=("*.csv",)) = Field("data/x", description="the dataset folder")
        weights: InputFile | None = None

The core then, for every such parameter:

* resolves a relative path against the folder of the spec file (not the current directory),
  ``~`` expanded, before the plugin is built: the plugin receives an absolute path;
* checks at validation time that it exists (``selbench validate`` and ``run`` before any
  computation), unless the declaration says ``must_exist=False``;
* puts the input's **content digest** into the key of everything derived from it (the cached
  backbone outputs and every cell), so rewriting a file in place, or pointing two projects at
  files that share a name, can never reuse a stale result;
* records the resolved path and digest in the run's provenance.

A file's digest is the SHA-256 of its bytes. Reading a large file each run would be slow, so
the digest is remembered in the cache, keyed by the resolved path, size, modification time
(ns) and inode; any change to those re-reads the file. A folder's digest is the SHA-256 of its
*manifest*: every file's relative path and size, plus the SHA-256 of the files matching the
declaration's ``metadata`` patterns (the small index files: ``metadata.csv``, labels, class
lists), so a dataset of a million images is not re-read while any added, removed or resized
image, or any edited index file, changes the key.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

__all__ = [
    "InputDir",
    "InputError",
    "InputFile",
    "InputSpec",
    "declared_inputs",
    "digest_input",
    "resolve_path",
]


class InputError(ValueError):
    """A declared input file or folder is missing or unreadable; the message names it."""


@dataclass(frozen=True)
class InputSpec:
    """How a parameter names an input: a ``file`` or a ``dir``.

    Attributes:
        kind: ``"file"`` or ``"dir"``.
        metadata: for folders, glob patterns (matched against paths relative to the folder,
            e.g. ``"*.csv"``, ``"*/metadata.csv"``) of files hashed by content; every other
            file enters the digest by name and size only.
        must_exist: when False, a missing path is not a validation error (the plugin reports
            it itself, e.g. when it can create the data); it then has no digest.
    """

    kind: Literal["file", "dir"]
    metadata: tuple[str, ...] = ()
    must_exist: bool = True


#: A parameter holding the path of an input file.
InputFile = Annotated[str, InputSpec("file")]


def InputDir(metadata: tuple[str, ...] | list[str] = (), must_exist: bool = True) -> Any:
    """A parameter type holding the path of an input folder (see :class:`InputSpec`)."""
    return Annotated[str, InputSpec("dir", tuple(metadata), must_exist)]


def _find_spec(annotation: Any) -> InputSpec | None:
    if get_origin(annotation) is Annotated:
        for meta in get_args(annotation)[1:]:
            if isinstance(meta, InputSpec):
                return meta
        return _find_spec(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        for arg in get_args(annotation):
            found = _find_spec(arg)
            if found is not None:
                return found
    return None


def declared_inputs(model: type[BaseModel]) -> dict[str, InputSpec]:
    """Parameter name -> :class:`InputSpec` for every input a parameter model declares."""
    out: dict[str, InputSpec] = {}
    for name, info in model.model_fields.items():
        spec = next((m for m in info.metadata if isinstance(m, InputSpec)), None)
        if spec is None:
            spec = _find_spec(info.annotation)
        if spec is not None:
            out[name] = spec
    return out


def resolve_path(value: str, base_dir: str | Path | None) -> str:
    """``value`` with ``~`` expanded, made absolute against ``base_dir`` (default: cwd)."""
    p = Path(os.path.expanduser(value))
    if not p.is_absolute():
        p = Path(base_dir or Path.cwd()) / p
    return os.path.normpath(str(p.absolute()))


def check_exists(path: str, spec: InputSpec) -> str | None:
    """An error message when ``path`` does not exist as the declared kind, else None."""
    p = Path(path)
    if spec.kind == "file":
        if p.is_dir():
            return f"{path} is a folder, expected a file"
        if not p.is_file():
            return f"no such file: {path}"
        if not os.access(p, os.R_OK):
            return f"{path} is not readable"
    else:
        if p.is_file():
            return f"{path} is a file, expected a folder"
        if not p.is_dir():
            return f"no such folder: {path}"
    return None


# --------------------------------------------------------------------------- digests
_CHUNK = 1 << 20


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _stat_key(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


class DigestCache:
    """File digests remembered by (path, size, mtime, inode), one small JSON per file."""

    def __init__(self, root: str | Path | None):
        self.root = Path(root) / "digests" if root is not None else None

    def _entry(self, path: Path) -> Path | None:
        if self.root is None:
            return None
        return self.root / (hashlib.sha256(str(path).encode()).hexdigest()[:32] + ".json")

    def file(self, path: str | Path) -> str:
        path = Path(path)
        try:
            stat = _stat_key(path)
        except OSError as exc:
            raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
        entry = self._entry(path)
        if entry is not None and entry.is_file():
            try:
                rec = json.loads(entry.read_text())
                if rec.get("path") == str(path) and rec.get("stat") == stat:
                    return str(rec["sha256"])
            except (OSError, ValueError, KeyError, TypeError):
                pass  # a damaged entry is recomputed below
        try:
            digest = _file_sha256(path)
        except OSError as exc:
            raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
        if entry is not None:
            try:
                from selbench.util.files import atomic_write_json

                atomic_write_json(entry, {"path": str(path), "stat": stat, "sha256": digest})
            except OSError:
                pass  # the digest cache is an optimisation; a read-only cache still works
        return digest


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            yield Path(dirpath) / name


def dir_manifest(root: str | Path, metadata: tuple[str, ...], cache: DigestCache) -> dict:
    """Every file's relative path and size; the SHA-256 of files matching ``metadata``."""
    root = Path(root)
    files = []
    for path in _walk(root):
        rel = path.relative_to(root).as_posix()
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
        entry: dict[str, Any] = {"path": rel, "size": size}
        if any(fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(path.name, pat) for pat in metadata):
            entry["sha256"] = cache.file(path)
        files.append(entry)
    return {"files": files}


def digest_input(path: str, spec: InputSpec, cache: DigestCache) -> str | None:
    """The content digest of a declared input (``sha256:...``), or None when it is absent
    and allowed to be."""
    problem = check_exists(path, spec)
    if problem is not None:
        if not spec.must_exist and not Path(path).exists():
            return None
        raise InputError(problem)
    if spec.kind == "file":
        return "sha256:" + cache.file(path)
    manifest = dir_manifest(path, spec.metadata, cache)
    blob = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return "manifest-sha256:" + hashlib.sha256(blob).hexdigest()
