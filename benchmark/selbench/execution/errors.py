"""The error of a run: :class:`RunError`, raised when a plugin misbehaves or the data does
not fit the spec, with a message that says which and where. Its own module so that every
step of the run (guards, cells, extraction, jobs) and the executors raise and catch it
without importing one another."""

from __future__ import annotations

__all__ = ["RunError"]


class RunError(RuntimeError):
    """A plugin misbehaved or data does not fit the spec; the message says which and where."""
