"""Atomic file writes and the on-disk cache of backbone outputs.

Nothing selbench writes is ever half-written: every file goes to a temporary name in the
same directory and is moved into place with :func:`os.replace`, which is atomic on POSIX
and Windows. A run killed at any moment leaves either the old file or the new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from selbench.data import ModelOutputs

__all__ = ["CacheError", "OutputCache", "WriteError", "atomic_path", "atomic_write_json", "atomic_write_text", "default_cache_dir"]

CACHE_ENV = "SELBENCH_CACHE_DIR"
CACHE_FORMAT = 2


class WriteError(OSError):
    """Writing a file failed (full or read-only disk ...); ``filename`` is the file that
    could not be written."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def _file_mode() -> int:
    """Permissions of a new file under the user's umask (``0o666 & ~umask``), as ``open``
    would give; ``mkstemp`` alone would give 0600 whatever the umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success move it onto ``path``.

    The file gets the permissions the user's umask gives. On any error (a full or read-only
    disk included) the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, _file_mode())
        os.replace(tmp_path, path)
    except OSError as exc:
        if isinstance(exc, WriteError):
            raise
        # name the file being written, not the temporary one (gone) or nothing (ENOSPC)
        raise WriteError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def default_cache_dir() -> Path:
    """``$SELBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/selbench``, else ``~/.cache/selbench``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "selbench"


class CacheError(ValueError):
    """The cache folder cannot be used; the message names it."""


class OutputCache:
    """Backbone outputs on disk: ``outputs/<key>.npz`` and its sidecar ``<key>.json``.

    The sidecar holds the key, what the key was made of, the number of rows and the SHA-256
    of the ``.npz`` bytes. :meth:`get` verifies all of it: a file that is missing its sidecar,
    truncated, altered, swapped for another (even a valid one of the same shape), or
    unreadable is reported on stderr with its path and treated as absent, so the runner
    recomputes and rewrites it; it is never used.
    """

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()

    def prepare(self) -> None:
        """Create the cache folder, or say clearly why it cannot be used."""
        if self.root.exists() and not self.root.is_dir():
            raise CacheError(f"cache directory {self.root} is a file, not a folder "
                             f"(set {CACHE_ENV} or --cache-dir to a folder)")
        try:
            (self.root / "outputs").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot create cache directory {self.root}: "
                             f"{exc.strerror or exc}") from None

    @staticmethod
    def key_material(dataset: dict, backbone: dict, split: str, code: dict) -> dict:
        """What the key hashes: dataset and backbone ``{name, params}`` (params with their
        defaults filled in, input paths replaced by their content digests), the split, the
        digests of the dataset's and backbone's code and the cache format."""
        return {
            "format": CACHE_FORMAT,
            "dataset": dataset,
            "backbone": backbone,
            "split": split,
            "code": code,
        }

    def path(self, key: str) -> Path:
        return self.root / "outputs" / f"{key}.npz"

    def get(self, key: str, warn=None) -> ModelOutputs | None:
        """The verified outputs of ``key``, or None (absent or unusable; ``warn`` is called
        with a message naming the file when a file was there but cannot be used)."""
        return self._read(self.path(key), key, warn)

    def _read(self, path: Path, key: str, warn=None) -> ModelOutputs | None:
        side = path.with_suffix(".json")
        if not path.is_file() and not side.is_file():
            return None

        def bad(why: str) -> None:
            if warn is not None:
                warn(f"cached outputs {path} {why}; recomputing them")
            return None

        try:
            meta = json.loads(side.read_bytes().decode("utf-8"))
            if not isinstance(meta, dict):
                raise ValueError("not a JSON object")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return bad(f"have no readable sidecar {side.name} ({exc})")
        if meta.get("key") != key or not isinstance(meta.get("sha256"), str):
            return bad(f"do not match their sidecar {side.name}")
        try:
            h = hashlib.sha256()
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
        except OSError as exc:
            return bad(f"are unreadable ({exc.strerror or exc})")
        if h.hexdigest() != meta["sha256"]:
            return bad("fail their checksum (changed or damaged since they were written)")
        try:
            outputs = ModelOutputs.from_npz(path)
        except Exception as exc:  # a damaged archive raises many kinds of errors
            return bad(f"are unreadable ({type(exc).__name__}: {exc})")
        if len(outputs) != meta.get("n"):
            return bad(f"hold {len(outputs)} rows, their sidecar says {meta.get('n')}")
        return outputs

    def put(self, key: str, outputs: ModelOutputs, material: dict) -> Path:
        """Write the outputs of ``key`` (atomically, with their sidecar)."""
        return self._write(self.path(key), key, outputs, material)

    # a large split extracted in several jobs (a backbone declaring ``shardable``): each job
    # writes its rows as a verified shard file; the run concatenates them into the key's
    # outputs once every shard is in, then deletes the shards
    def shard_path(self, key: str, rows: tuple[int, int]) -> Path:
        return self.root / "shards" / key / f"rows-{rows[0]}-{rows[1]}.npz"

    def get_shard(self, key: str, rows: tuple[int, int], warn=None) -> ModelOutputs | None:
        """The verified rows ``[start, stop)`` of ``key``'s outputs, or None."""
        out = self._read(self.shard_path(key, rows), key, warn)
        if out is not None and len(out) != rows[1] - rows[0]:
            return None
        return out

    def put_shard(self, key: str, rows: tuple[int, int], outputs: ModelOutputs,
                  material: dict) -> Path:
        return self._write(self.shard_path(key, rows), key, outputs,
                           {**material, "rows": list(rows)})

    def drop_shards(self, key: str) -> None:
        import shutil

        shutil.rmtree(self.root / "shards" / key, ignore_errors=True)

    def _write(self, path: Path, key: str, outputs: ModelOutputs, material: dict) -> Path:
        with atomic_path(path, suffix=".npz") as tmp:
            with open(tmp, "wb") as fh:
                outputs.to_npz(fh)
            digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
            # the sidecar lands first: a crash between the two leaves a sidecar whose
            # checksum the old (or absent) .npz fails, so it is recomputed, never trusted
            atomic_write_json(path.with_suffix(".json"),
                              {"key": key, **material, "n": len(outputs), "sha256": digest})
        return path

    def workdir(self, key: str) -> Path:
        """A directory a backbone may keep artefacts in (e.g. trained weights)."""
        path = self.root / "work" / key
        path.mkdir(parents=True, exist_ok=True)
        return path
