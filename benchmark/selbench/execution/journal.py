"""Tuning journals: the Optuna journal file of a tuned cell's studies
(``OUT/tuning/<experiment>/<method>/seed<s>.journal``, one JSON record a line, the format of
Optuna's ``JournalFileBackend``), opened so that nothing is written outside the results
folder and a damaged file never blocks a resume.

* **No link is followed.** The journal's folder is refused when a link on its way leads out
  of the results folder, and the journal itself when it is a symbolic link, a hard link (more
  than one name) or not a plain file (:meth:`selbench.store.ResultsDir.journal_path`, checked
  when the run plans its cells and again here); records are appended through a descriptor
  opened with ``O_NOFOLLOW`` and checked again (:class:`JournalBackend`), and a repaired
  journal replaces the file (:func:`os.replace`), never what it might point to.
* **A journal is a cache of trials.** Optuna's own reader raises on a line cut short (what a
  full disk or a kill leaves, once a later record follows it), on bytes that are not UTF-8
  JSON, and on JSON lines that are not its records (an ``AssertionError`` or ``KeyError`` of
  its replay). :func:`read_journal` keeps every complete record that Optuna's replay accepts,
  in order, and drops the rest; when it dropped anything the file is rewritten with the kept
  records (atomically) and one ``selbench: warning:`` line names it and says how many trials
  were kept (none: the study restarts). The trials the study still needs are then run again,
  asked as the uninterrupted study asked them (:mod:`selbench.execution.tuning`).
* **One writer.** A results folder has one writing run (its lock) and a method's cells one
  job (its method lock), so the journal is read once and then appended to by this process
  only: :class:`JournalBackend` serves Optuna the records it read and those it appended,
  and needs no lock file of Optuna's (a symbolic link, which a kill would leave behind).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from selbench.store.results import ResultsError, open_plain_file
from selbench.util.files import atomic_write_text

try:  # Optuna >= 4.0
    from optuna.storages.journal import BaseJournalBackend
except ImportError:  # pragma: no cover - Optuna 3.x
    from optuna.storages import BaseJournalLogStorage as BaseJournalBackend

__all__ = ["JournalBackend", "journal_storage", "read_journal"]



def _open(path: Path, flags: int) -> int:
    """A descriptor of the plain journal file ``path`` (never through a link)."""
    return open_plain_file(path, flags, "the tuning journal")


class _Memory(BaseJournalBackend):
    """Records held in memory (the replay check of :func:`read_journal`)."""

    def __init__(self) -> None:
        self.logs: list[dict[str, Any]] = []

    def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
        return list(self.logs[log_number_from:])

    def append_logs(self, logs: list[dict[str, Any]]) -> None:  # pragma: no cover - unused
        self.logs.extend(logs)


def _records(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The records of a journal's bytes that Optuna's replay accepts, in order, and the
    number of lines dropped (cut short, not UTF-8 JSON objects, or refused by the replay)."""
    import optuna

    lines = data.split(b"\n")
    dropped = 1 if lines[-1] else 0  # the last line, unless empty, was cut short
    memory = _Memory()
    storage = None
    kept: list[dict[str, Any]] = []
    for line in lines[:-1]:
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            dropped += 1
            continue
        if not isinstance(record, dict):
            dropped += 1
            continue
        memory.logs.append(record)  # read once by the replay, accepted or not
        try:
            if storage is None:
                storage = optuna.storages.JournalStorage(memory)
            storage.get_all_studies()  # replays the new record
        except Exception:  # Optuna's replay refuses it (KeyError, AssertionError, ...)
            dropped += 1
            continue
        kept.append(record)
    return kept, dropped


def read_journal(path: Path) -> list[dict[str, Any]]:
    """The records of the journal ``path`` (empty when it does not exist), repaired as the
    module says: a damaged journal is rewritten with its complete records and named in one
    warning."""
    try:
        fd = _open(path, os.O_RDONLY)
    except ResultsError:
        if not path.exists() and not path.is_symlink():
            return []
        raise
    with os.fdopen(fd, "rb") as fh:
        data = fh.read()
    kept, dropped = _records(data)
    if dropped:
        atomic_write_text(path, "".join(json.dumps(r, separators=(",", ":")) + "\n"
                                        for r in kept))
        warnings.warn(
            f"tuning journal {path} was damaged ({dropped} line(s) cut short, unreadable or "
            "not Optuna records); " + (f"kept its {len(kept)} complete record(s), the "
                                       "missing trials run again" if kept
                                       else "its studies restart"),
            UserWarning, stacklevel=2)
    return kept


class JournalBackend(BaseJournalBackend):
    """Optuna's journal backend over one journal file: the records :func:`read_journal`
    read, then each record appended to the file (``O_APPEND``, ``O_NOFOLLOW``, a plain file
    of one name) and to the records served."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.logs = read_journal(self.path)

    def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
        return list(self.logs[log_number_from:])

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs)
        fd = _open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with os.fdopen(fd, "ab") as fh:
            fh.write(text.encode("utf-8"))
        self.logs.extend(json.loads(json.dumps(log)) for log in logs)  # as a reader sees them


def journal_storage(path: Path) -> Any:
    """An Optuna ``JournalStorage`` over the journal ``path`` (:class:`JournalBackend`)."""
    import optuna

    path.parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalBackend(path))
