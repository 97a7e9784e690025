"""Atomic file writes and the on-disk cache of backbone outputs.

Nothing selbench writes is ever half-written: every file goes to a temporary name in the
same directory and is moved into place with :func:`os.replace`, which is atomic on POSIX
and Windows. A run killed at any moment leaves either the old file or the new one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from selbench.data import ModelOutputs

__all__ = ["OutputCache", "atomic_path", "atomic_write_json", "atomic_write_text", "default_cache_dir"]

CACHE_ENV = "SELBENCH_CACHE_DIR"
CACHE_FORMAT = 1


@contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success move it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
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


class OutputCache:
    """Backbone outputs on disk, one ``.npz`` per content key (see :meth:`key`)."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()

    @staticmethod
    def key_material(dataset: dict, backbone: dict, split: str, versions: dict) -> dict:
        """What the key hashes: dataset and backbone ``{name, params}`` (params with their
        defaults filled in), the split, the providers' versions and the cache format."""
        return {
            "format": CACHE_FORMAT,
            "dataset": dataset,
            "backbone": backbone,
            "split": split,
            "versions": versions,
        }

    def path(self, key: str) -> Path:
        return self.root / "outputs" / f"{key}.npz"

    def get(self, key: str) -> ModelOutputs | None:
        path = self.path(key)
        if not path.is_file():
            return None
        return ModelOutputs.from_npz(path)

    def put(self, key: str, outputs: ModelOutputs, material: dict) -> Path:
        path = self.path(key)
        with atomic_path(path, suffix=".npz") as tmp, open(tmp, "wb") as fh:
            outputs.to_npz(fh)
        atomic_write_json(path.with_suffix(".json"), {"key": key, **material, "n": len(outputs)})
        return path

    def workdir(self, key: str) -> Path:
        """A directory a backbone may keep artefacts in (e.g. trained weights)."""
        path = self.root / "work" / key
        path.mkdir(parents=True, exist_ok=True)
        return path
