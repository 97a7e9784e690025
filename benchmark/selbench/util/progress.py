"""Progress on stderr: a tqdm bar on a terminal, plain lines everywhere else.

A bar redraws itself with carriage returns and cursor codes, which a pipe, a CI log or a
Slurm output file keeps as garbage. :func:`progress_bar` gives a tqdm bar when its stream is
a terminal and otherwise a :class:`PlainProgress`: one line when it starts, one each time
another tenth of the total is done, and one when it ends, each a complete line. Both take
the same calls (iteration, ``update``, ``set_postfix`` / ``set_postfix_str``, ``close``, a
``with`` block), so the code that reports progress does not care which it got. Plugins may
use it for their own loops (``selbench.util.progress.progress_bar``), with
``disable=not context.progress``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

__all__ = ["PlainProgress", "is_terminal", "progress_bar"]


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is an interactive terminal (False for pipes, files, captured
    output and anything without ``isatty``)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


class PlainProgress:
    """Progress as complete lines: ``desc: n/total unit (p%) [postfix]``, printed when it
    starts, whenever another ``step`` of the total (a tenth by default) is done, and when it
    closes (with the elapsed time). Without a total, every ``every`` items."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None,
                 desc: str | None = None, unit: str = "it", file: TextIO | None = None,
                 step: float = 0.1, every: int = 10):
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total, self.desc, self.unit = total, desc or "progress", unit
        self.file = file
        self.step, self.every = step, every
        self.n, self.postfix = 0, ""
        self._shown = 0  # the last step (or count) a line was printed for
        self._start = time.monotonic()
        self._closed = False
        self._line("started" if total is None else f"0/{total} {_plural(unit)}")

    def _line(self, text: str) -> None:
        stream = self.file if self.file is not None else sys.stderr
        tail = f" [{self.postfix}]" if self.postfix else ""
        print(f"{self.desc}: {text}{tail}", file=stream, flush=True)

    def _count(self) -> str:
        unit = _plural(self.unit)
        if not self.total:
            return f"{self.n} {unit}"
        return f"{self.n}/{self.total} {unit} ({100 * self.n // self.total}%)"

    def update(self, n: int = 1) -> None:
        self.n += n
        mark = int(self.n / self.total / self.step + 1e-9) if self.total else self.n // self.every
        if mark > self._shown and (not self.total or self.n < self.total):
            self._shown = mark
            self._line(self._count())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = str(s)

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.postfix = ""
        self._line(f"{self._count()}, done in {time.monotonic() - self._start:.1f} s")

    def __iter__(self) -> Iterator:
        try:
            for item in self.iterable or ():
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _plural(unit: str) -> str:
    """``cell`` -> ``cells``, ``batch`` -> ``batches`` (tqdm's default ``it`` stays)."""
    if unit == "it" or unit.endswith("s"):
        return unit
    return {"batch": "batches"}.get(unit, unit + "s")


class _Silent:
    """What a disabled bar is: iterates, counts nothing, prints nothing."""

    def __init__(self, iterable: Iterable | None):
        self.iterable = iterable

    def __iter__(self) -> Iterator:
        return iter(self.iterable or ())

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def progress_bar(iterable: Iterable | None = None, *, total: int | None = None,
                 desc: str | None = None, unit: str = "it", disable: bool = False,
                 leave: bool = True, file: TextIO | None = None) -> Any:
    """A tqdm bar on ``file`` (default stderr) when it is a terminal, else a
    :class:`PlainProgress` of complete lines; nothing at all with ``disable``. ``leave``:
    whether a terminal bar stays once it is done (plain lines always stay)."""
    if disable:
        return _Silent(iterable)
    stream = file if file is not None else sys.stderr
    if not is_terminal(stream):
        return PlainProgress(iterable, total=total, desc=desc, unit=unit, file=file)
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, file=file)
