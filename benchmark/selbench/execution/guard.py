"""Blame: when a plugin fails during a run, the one-line
:class:`~selbench.execution.errors.RunError` names the plugin whose code failed, not the one
that received its bad value: :func:`describe_plugin` is how a message names a plugin,
:func:`blame_plugin` finds the plugin whose code raised an exception (from its traceback),
:func:`failure` words the error, and :func:`fit_guarded` runs a fit with the outputs of the
recalibrators and selectors checked as they are produced (:class:`_Guard`).
"""

from __future__ import annotations

import traceback
from typing import Any

from selbench.execution.errors import RunError
from selbench.measure.evaluate import EvaluationError, check_vector
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


class _Guard:
    """During fitting, checks what a recalibrator's ``confidence``/``predict`` and a
    selector's ``score`` return, so that a bad value is blamed on the plugin that produced
    it, not on the plugin that received it.

    The checking wrappers are set on the plugin's class for the duration of the fit (every
    job of a ``fit_many`` call is one method, so one class per role) and the class is
    restored afterwards: instances keep their own ``vars()`` and ``type()``, which schemes
    may compare (e.g. to fit equal recalibrators once).
    """

    def __init__(self):
        self._saved: list[tuple[type, str, Any]] = []
        self._missing = object()

    def watch(self, obj: Any, name: str, what: str, lo=None, hi=None, integer=False,
              classes=False) -> None:
        klass = type(obj)
        if any(k is klass and n == name for k, n, _ in self._saved):
            return
        original = getattr(klass, name, None)
        if original is None or not callable(original):
            return

        def checked(self_, outputs, *args, **kwargs):
            values = original(self_, outputs, *args, **kwargs)
            try:
                n = len(outputs)
                high = outputs.num_classes - 1 if classes else hi
            except Exception:
                return values
            check_vector(values, n, f"{what}.{name}", lo, high, integer)
            return values

        previous = klass.__dict__.get(name, self._missing)
        try:
            setattr(klass, name, checked)
        except (AttributeError, TypeError):  # a class that cannot be patched is not checked
            return
        self._saved.append((klass, name, previous))

    def remove(self) -> None:
        for klass, name, previous in reversed(self._saved):
            if previous is self._missing:
                delattr(klass, name)
            else:
                setattr(klass, name, previous)
        self._saved.clear()


def fit_guarded(fit, objects: list[tuple[Any, Any]], names: tuple[str, str]) -> None:
    """``fit()`` with each (recalibrator, selector) of ``objects`` watched by a
    :class:`_Guard`; ``names`` are theirs in messages."""
    guard = _Guard()
    recal_name, sel_name = names
    for recalibrator, selector in objects:
        guard.watch(recalibrator, "confidence", recal_name, 0.0, 1.0)
        guard.watch(recalibrator, "predict", recal_name, 0, None, integer=True, classes=True)
        guard.watch(selector, "score", sel_name)
    try:
        fit()
    finally:
        guard.remove()
