"""Which figures are up to date: a figure is redrawn only when its inputs changed.

Each figure of :mod:`selbench.reporting.plots` is a job: a figure function of
:mod:`selbench.reporting.figures` and the plain data it is drawn from. Its *key*, like a
cell's, is a digest of everything that determines the files: the function's name and
arguments (hashed by value: numbers, strings, arrays by dtype, shape and bytes), the file
formats, and the *drawing code's digest* (the source of :mod:`selbench.reporting.figures`,
matplotlib's version and the matplotlib settings in force). The keys of the figures drawn
are kept next to them, in ``plots/.keys.json`` (figure path without suffix -> key); a
figure whose key is unchanged and whose files are all there is not drawn again, so a rerun
with nothing to compute does not spend its time redrawing identical figures. Deleting
``plots/`` (or the keys file) redraws everything.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from selbench.util.files import atomic_write_json

__all__ = ["KEYS_FILE", "FigureKeys", "code_digest", "value_digest"]

#: where the keys of a results folder's figures are kept, under its ``plots/``
KEYS_FILE = ".keys.json"


def _feed(h: Any, obj: Any) -> None:
    """Hash ``obj`` by value into ``h``, each value tagged with its type (so that ``1``,
    ``1.0``, ``"1"`` and ``[1]`` differ)."""
    if obj is None or isinstance(obj, bool):
        h.update(f"<{obj!r}>".encode())
    elif isinstance(obj, (int, np.integer)):
        h.update(f"i{int(obj)};".encode())
    elif isinstance(obj, (float, np.floating)):
        value = float(obj)
        h.update(f"f{value.hex() if math.isfinite(value) else repr(value)};".encode())
    elif isinstance(obj, str):
        h.update(f"s{len(obj)}:".encode() + obj.encode("utf-8", "surrogatepass"))
    elif isinstance(obj, (bytes, bytearray)):
        h.update(f"b{len(obj)}:".encode() + bytes(obj))
    elif isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        h.update(f"a{arr.dtype.str}{arr.shape}:".encode())
        h.update(arr.tobytes())
    elif isinstance(obj, Path):
        _feed(h, ("path", obj.as_posix()))
    elif isinstance(obj, dict):
        h.update(f"d{len(obj)}:".encode())
        for key in sorted(obj, key=repr):
            _feed(h, key)
            _feed(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        h.update(f"{'l' if isinstance(obj, list) else 't'}{len(obj)}:".encode())
        for item in obj:
            _feed(h, item)
    else:  # anything else by its representation (not expected in a figure's data)
        _feed(h, ("repr", type(obj).__qualname__, repr(obj)))


def value_digest(*parts: Any) -> str:
    """The SHA-256 of ``parts`` hashed by value (:func:`_feed`)."""
    h = hashlib.sha256()
    for part in parts:
        _feed(h, part)
    return h.hexdigest()


def code_digest(figures_module: Any) -> str:
    """The drawing code's digest: the figure module's source, matplotlib's version and the
    matplotlib settings now in force (call it where the figures are drawn, inside their
    ``rc_context``); the backend aside, which does not change the files."""
    import matplotlib

    rc = sorted((k, repr(v)) for k, v in matplotlib.rcParams.items() if k != "backend")
    return value_digest(Path(figures_module.__file__).read_bytes(), matplotlib.__version__, rc)


class FigureKeys:
    """The keys of the figures under one ``plots/`` folder (:data:`KEYS_FILE`)."""

    def __init__(self, plots_root: Path):
        self.root = Path(plots_root)
        self.path = self.root / KEYS_FILE
        try:
            data = json.loads(self.path.read_text())
            self.keys: dict[str, str] = {str(k): str(v) for k, v in data["figures"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.keys = {}  # absent or damaged: every figure is drawn

    def _name(self, stem: Path) -> str:
        try:
            return Path(stem).relative_to(self.root).as_posix()
        except ValueError:
            return Path(stem).as_posix()

    def up_to_date(self, stem: Path, key: str, files: Iterable[Path]) -> bool:
        """Whether the figure ``stem`` was drawn with ``key`` and all its ``files`` exist."""
        return self.keys.get(self._name(stem)) == key and all(Path(f).is_file() for f in files)

    def save(self, drawn: Sequence[tuple[Path, str]]) -> None:
        """Record the keys of the figures just drawn (the others keep theirs)."""
        if not drawn:
            return
        for stem, key in drawn:
            self.keys[self._name(stem)] = key
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, {"figures": dict(sorted(self.keys.items()))})
