"""Deprecated: moved to :mod:`selbench.execution.executors` (this re-export is removed in the next release)."""

from selbench.util.moved import reexport

__getattr__, __dir__ = reexport(__name__)
