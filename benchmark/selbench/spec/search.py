"""A method's search space under an experiment's ``tuning``: :func:`method_space` reads the
spaces its plugins declare (:meth:`~selbench.contract.registry.Registered.search_space`) or the
method's own ``search:`` (which replaces them; ``default`` keeps a declared one), and
:func:`check_search` validates a ``search:`` against the plugins (each path names a parameter,
each bound or choice is a value the parameter accepts), with the spec path in every message.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import ValidationError

from selbench.contract.registry import Registry
from selbench.contract.search import Tune
from selbench.spec.model import METHOD_FIELDS, MethodSpec

__all__ = ["check_search", "method_space"]


def _kinds() -> dict[str, str]:
    return {attr: kind for kind, attr in METHOD_FIELDS}


def method_space(registry: Registry, method: MethodSpec) -> dict[str, Tune]:
    """``"<field>.<param>"`` -> :class:`Tune` of every parameter the method tunes, sorted:
    the method's ``search:`` when it has one, else every space its plugins declare."""
    kinds = _kinds()
    declared: dict[str, Tune] = {}
    for attr, kind in kinds.items():
        comp = getattr(method, attr)
        if comp is not None:
            for param, tune in registry.get(kind, comp.name).search_space().items():
                declared[f"{attr}.{param}"] = tune
    if method.search is None:
        return dict(sorted(declared.items()))
    space = {path: declared[path] if value == "default" else Tune.parse(value)
             for path, value in method.search.items()}
    return dict(sorted(space.items()))


def _check_path(registry: Registry, method: MethodSpec, path: str, value: Any,
                where: str) -> str | None:
    """The problem with one ``search:`` entry (``where`` is its spec path), or None."""
    attr, _, param = path.partition(".")
    comp = getattr(method, attr)
    if comp is None:
        return f"{where}: the method has no {attr}"
    reg = registry.get(_kinds()[attr], comp.name)
    fields = reg.plugin.params.model_fields
    if param not in fields:
        close = difflib.get_close_matches(param, list(fields), n=2, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        return (f"{where}: {reg.describe()} has no parameter {param!r}{hint} (its parameters: "
                f"{', '.join(fields) or 'none'})")
    if value == "default":
        if param not in reg.search_space():
            return f"{where}: {reg.describe()} declares no search space for {param!r}; give one"
        return None
    for corner in Tune.parse(value).corners():
        try:
            reg.validate_params({**comp.params, param: corner})
        except ValidationError as exc:
            msg = "; ".join(e["msg"] for e in exc.errors())
            return f"{where}: {corner!r} is not a valid {param} of {reg.describe()}: {msg}"
    return None


def check_search(registry: Registry, method: MethodSpec, mbase: str, errors: list[str]) -> None:
    """Append one line per problem of the method's ``search:`` (found plugins only)."""
    if not method.search:
        return
    for path, value in method.search.items():
        attr = path.partition(".")[0]
        comp = getattr(method, attr)
        if comp is not None:
            try:
                registry.get(_kinds()[attr], comp.name)
            except LookupError:
                continue  # reported as the component's own error
        problem = _check_path(registry, method, path, value, f"{mbase}.search.{path}")
        if problem:
            errors.append(problem)
