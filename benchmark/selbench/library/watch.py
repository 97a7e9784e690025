"""Watching a fit: while a scheme fits, what each recalibrator's ``confidence`` /
``predict`` and each selector's ``score`` return is checked as it is produced, so that a
bad value (NaN, out of range) is blamed on the plugin that produced it, not on the plugin
that received it (:func:`fit_guarded`). The runner (:mod:`selbench.execution.guard`) and
:class:`~selbench.library.estimator.SelectiveRecalibrator` fit through it.
"""

from __future__ import annotations

from typing import Any

from selbench.measure.evaluate import check_vector

__all__ = ["fit_guarded"]


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
