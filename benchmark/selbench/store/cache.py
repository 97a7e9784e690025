"""The on-disk cache of backbone outputs (written atomically through :mod:`selbench.util.files`)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from selbench.contract.data import ModelOutputs
from selbench.util.files import atomic_path, atomic_write_json

__all__ = ["CacheError", "OutputCache", "default_cache_dir"]

CACHE_ENV = "SELBENCH_CACHE_DIR"
CACHE_FORMAT = 2


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
