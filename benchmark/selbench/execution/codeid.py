"""The identity of the code behind a result: digests of source modules.

A cell's key holds the digest of the code that produced it, so editing a plugin recomputes
exactly the cells that use it, and editing the core's metric definitions recomputes every
cell. Hand-written version strings play no part in reuse.

:func:`code_digest` of a plugin's factory is the SHA-256 of the source of the module that
defines it together with every module of the same top-level package that module imports,
directly or through others, found by reading the ``import`` statements of the source (also
those inside functions, which a look at ``sys.modules`` would miss), and every module of
selbench's plugin toolkit (:data:`SUPPORT_MODULES`, :data:`SUPPORT_PACKAGES`: the training
engine and its modules, the torch, vision and input-check helpers plugins build on) it
imports. A module without Python source (a compiled extension) enters by the bytes of its
file. Modules of other packages (numpy, torch, the rest of selbench) are not included: they
are identified by their versions in the run's provenance.
``selbench_plugins.recalibrators.temperature`` thus covers ``recalibrators/_common.py``,
:mod:`selbench.training.torchutils` and whatever else of ``selbench_plugins`` it imports, but not the
dataset plugins.

:func:`core_digest` covers the core modules that decide a cell's numbers: the metric
definitions (:mod:`selbench.measure.metrics`), the data contract (:mod:`selbench.contract.data`) and the cell
evaluation (:mod:`selbench.measure.evaluate`), with every selbench module they import.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from selbench.util.moved import MOVED

__all__ = ["CORE_MODULES", "SUPPORT_MODULES", "SUPPORT_PACKAGES", "code_digest", "core_digest",
           "module_closure"]

#: The core modules whose source decides the numbers of a cell.
CORE_MODULES: tuple[str, ...] = (
    "selbench.measure.metrics",
    "selbench.contract.data",
    "selbench.measure.evaluate",
)

#: selbench's modules that plugins build on (their code decides the numbers of the plugins
#: that import them): part of the digest of every plugin module that imports them.
SUPPORT_MODULES: frozenset[str] = frozenset(
    {"selbench.contract.checks", "selbench.training.engine", "selbench.training.torchutils",
     "selbench.contract.vision"}
)
#: packages whose every module is a support module: the training engine's (the engine
#: imports its per-replica Adam, noise and CUDA-graph modules, which decide a trained
#: plugin's numbers as much as the engine does; they were missing from the digest until
#: 2026-12-02, so an edit of the per-replica Adam reused trained cells)
SUPPORT_PACKAGES: tuple[str, ...] = ("selbench.training.",)


def _support(name: str) -> bool:
    return name in SUPPORT_MODULES or name.startswith(SUPPORT_PACKAGES)


def _origin(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return None
    return Path(spec.origin)


def _is_package(name: str) -> bool:
    origin = _origin(name)
    return origin is not None and origin.name == "__init__.py"


@cache
def _imports(name: str, source: bytes) -> frozenset[str]:
    """Absolute names of the modules ``name``'s source imports (``from x import y`` gives
    ``x`` and, when it is a module, ``x.y``)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return frozenset()
    package = name if _is_package(name) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 > len(parts):
                    continue
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            if not mod:
                continue
            found.add(mod)
            found.update(f"{mod}.{alias.name}" for alias in node.names if alias.name != "*")
    return frozenset(found)


@cache
def _source(name: str) -> bytes | None:
    origin = _origin(name)
    if origin is None or not origin.is_file():
        return None
    try:
        return origin.read_bytes()
    except OSError:
        return None


@cache
def _closure(name: str) -> tuple[str, ...]:
    return tuple(module_closure_uncached(name))


def module_closure(name: str) -> list[str]:
    """``name`` and every module of its top-level package it imports, transitively; sorted
    (remembered per process: the code a process runs does not change under it)."""
    return list(_closure(name))


def module_closure_uncached(name: str) -> list[str]:
    """``name`` and every module of its top-level package (or of :data:`SUPPORT_MODULES`) it
    imports, transitively; sorted."""
    top = name.split(".")[0]
    seen: set[str] = set()
    stack = [name]
    while stack:
        mod = stack.pop()
        if mod in seen:
            continue
        source = _source(mod)
        if source is None:
            continue
        seen.add(mod)
        if not str(_origin(mod)).endswith(".py"):
            continue  # compiled: no import statements to read
        for dep in _imports(mod, source):
            # an old, moved path of a support module stands for the module it re-exports
            for real in MOVED.get(dep, (dep,)):
                if (real.split(".")[0] == top or _support(real)) and real not in seen:
                    stack.append(real)
    return sorted(seen)


def _digest_modules(names: list[str]) -> str:
    h = hashlib.sha256()
    for mod in names:
        source = _source(mod) or b""
        h.update(mod.encode() + b"\0" + hashlib.sha256(source).digest())
    return h.hexdigest()


def code_digest(obj: Any) -> str:
    """Digest of the source behind ``obj`` (a class or function): see the module docstring.

    An object whose module has no readable source (defined interactively, say) is identified
    by its qualified name only, which the digest then says (``name:...``): such a plugin's
    edits cannot be detected, so results computed with it are recomputed only when asked
    (``--force``).
    """
    module = getattr(obj, "__module__", None) or getattr(inspect.getmodule(obj), "__name__", None)
    if module is None or _source(module) is None:
        qual = f"{module}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"
        return "name:" + hashlib.sha256(qual.encode()).hexdigest()
    return "src:" + _digest_modules(module_closure(module))


@lru_cache(maxsize=1)
def core_digest() -> str:
    """Digest of :data:`CORE_MODULES` and every selbench module they import (the metric
    modules :mod:`selbench.measure.metrics` re-exports, its input checks)."""
    modules = set().union(*(module_closure(m) for m in CORE_MODULES))
    return "src:" + _digest_modules(sorted(modules))


def clear_caches() -> None:
    """Forget the sources read so far (tests that edit a module between runs in one process)."""
    _source.cache_clear()
    _imports.cache_clear()
    _closure.cache_clear()
    core_digest.cache_clear()
