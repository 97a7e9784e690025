"""How Python warnings look on selbench's command line: one ``selbench: warning: MESSAGE``
line each, printed once per message (no file path, no source line), by the command line
(:func:`warning_lines`) and by the worker processes of a local pool."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator

__all__ = ["install", "warning_lines"]

_SEEN: set[str] = set()


def _show(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).strip()
    if text in _SEEN:
        return
    _SEEN.add(text)
    print(f"selbench: warning: {text}", file=sys.stderr if file is None else file, flush=True)


def install() -> None:
    """Show every warning of this process as a ``selbench: warning:`` line, once each."""
    warnings.showwarning = _show


@contextlib.contextmanager
def warning_lines() -> Iterator[None]:
    """While the block runs, warnings are ``selbench: warning:`` lines, once each; the
    previous way of showing them is restored afterwards."""
    with warnings.catch_warnings():
        install()
        _SEEN.clear()
        yield
