"""Atomic file writes: nothing selbench writes is ever half-written.

Every file goes to a temporary name in the same directory and is moved into place with
:func:`os.replace`, which is atomic on POSIX and Windows: a run killed at any moment leaves
either the old file or the new one.

This module is the foundation layer (:mod:`selbench.util`): it imports nothing of selbench.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["WriteError", "atomic_path", "atomic_write_json", "atomic_write_text", "json_default"]


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
    disk included) the temporary file is removed and ``path`` is left as it was. A ``path``
    that is a symbolic link is replaced by the new file, never written through: the temporary
    file is created anew (``O_EXCL``, which follows no link) and :func:`os.replace` renames it
    onto the link itself. (Whether ``path``'s folders may be links is the caller's rule: the
    results store refuses those that lead out of a results directory.)
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


def atomic_write_text(path: str | Path, text: str, durable: bool = True) -> None:
    """Write ``text`` atomically; ``durable``: also ``fsync`` it before the rename (about 4 ms
    a file on this project's machines), so that even a power loss leaves the old file or the
    new one. Files whose readers verify a checksum (cell records) may skip it: a file torn by
    a power loss fails its checksum and is recomputed, never trusted."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())


def atomic_write_json(path: str | Path, obj: Any, durable: bool = True) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=json_default)
                      + "\n", durable)


def json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
