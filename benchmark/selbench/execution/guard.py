"""Blame: when a plugin fails during a run, the one-line
:class:`~selbench.execution.errors.RunError` names the plugin whose code failed, not the one
that received its bad value: :func:`describe_plugin` is how a message names a plugin,
:func:`blame_plugin` finds the plugin whose code raised an exception (from its traceback),
:func:`failure` words the error, and :func:`fit_guarded` (from :mod:`selbench.library.watch`,
which the estimator uses too) runs a fit with the outputs of the recalibrators and selectors
checked as they are produced.
"""

from __future__ import annotations

import traceback
from typing import Any

from selbench.execution.errors import RunError
from selbench.library.watch import fit_guarded
from selbench.measure.evaluate import EvaluationError
from selbench.spec import Component, ResolvedSpec, SpecError

__all__ = ["blame_plugin", "describe_plugin", "failure", "fit_guarded"]


def describe_plugin(resolved: ResolvedSpec, kind: str, comp: Component) -> str:
    """How a message names the plugin of ``comp`` (its registration's own ``describe()``,
    else ``kind 'name'``)."""
    reg = resolved.registry.get(kind, comp.name)
    describe = getattr(reg, "describe", None)
    return describe() if callable(describe) else f"{kind} {comp.name!r}"


def blame_plugin(exc: BaseException, candidates: list[tuple[str, Any]]) -> str | None:
    """The component whose code raised ``exc``: the innermost traceback frame that runs a
    method of one of the candidates' classes (the object's own methods first, then any code
    of the module defining the factory)."""
    codes: dict[Any, str] = {}
    modules: dict[str, str] = {}
    for desc, factory in candidates:
        modules.setdefault(getattr(factory, "__module__", ""), desc)
        for klass in getattr(factory, "__mro__", (factory,)):
            if klass is object or getattr(klass, "__module__", "") == "selbench.contract.api":
                continue
            members = vars(klass).values() if isinstance(klass, type) else (klass,)
            for member in members:
                fn = getattr(member, "__func__", getattr(member, "fget", member))
                code = getattr(fn, "__code__", None)
                if code is not None:
                    codes.setdefault(code, desc)
    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    for frame in reversed(frames):
        if frame.f_code in codes:
            return codes[frame.f_code]
    for frame in reversed(frames):
        desc = modules.get(frame.f_globals.get("__name__", ""))
        if desc is not None:
            return desc
    return None


def failure(where: str, stage: str, exc: BaseException, blame: str | None) -> RunError:
    """The :class:`RunError` reporting ``exc``, raised at ``where`` while ``stage``, blamed
    on ``blame`` (else on "a plugin"); an evaluation or spec error keeps its own message."""
    if isinstance(exc, (EvaluationError, SpecError)):
        return RunError(f"{where}: {exc}")
    if isinstance(exc, SystemExit):
        what = f"called sys.exit({exc.code!r})"
    else:
        what = f"raised {type(exc).__name__}: {exc}" if str(exc) else f"raised {type(exc).__name__}"
    who = blame or "a plugin"
    return RunError(f"{where}: {who} {what} while {stage}")
