"""The conformance kit's errors: :class:`ConformanceError` (a plugin broke a rule of the
contract), :class:`CheckSkipped` (a check could not run for a plugin), :class:`ConformanceWarning`
(a skipped check, as :func:`selbench.testing.check_plugin` reports it) and :class:`Broken`, a
check's failure before :class:`selbench.testing.Check` labels it with the plugin and the check.
"""

from __future__ import annotations

from collections.abc import Sequence


class ConformanceError(AssertionError):
    """A plugin broke a rule of the plugin contract.

    The message is ``<plugin>: <check>: <what was expected and what happened>``, e.g.
    ``recalibrator 'shrink': check_confidence_output: confidence(outputs) returned values
    outside [0, 1] (min -0.2 at index 3)``. When :func:`~selbench.testing.check_plugin` finds
    several broken rules, one error lists them all, one per line, and :attr:`errors` holds
    each.

    Attributes:
        plugin: the plugin, as in messages (``recalibrator 'shrink'``).
        check: the check's name (None for a summary of several).
        detail: what was expected and what happened.
        errors: every failure this error reports (itself when it is a single one).
    """

    def __init__(self, plugin: str, check: str | None, detail: str,
                 errors: Sequence[ConformanceError] = ()):
        self.plugin, self.check, self.detail = plugin, check, detail
        self.errors: tuple[ConformanceError, ...] = tuple(errors) or (self,)
        text = f"{plugin}: {check}: {detail}" if check else f"{plugin}: {detail}"
        super().__init__(text)


class CheckSkipped(Exception):
    """A check could not run for this plugin (e.g. a dataset's files are absent); the
    message says why. :func:`~selbench.testing.check_plugin` turns it into a
    :class:`ConformanceWarning`, :func:`~selbench.testing.parametrize_with_checks` into a
    pytest skip."""


class ConformanceWarning(UserWarning):
    """A check that :func:`~selbench.testing.check_plugin` skipped, and why."""


class Broken(Exception):
    """A check's failure, before it is labelled with the plugin and the check."""

