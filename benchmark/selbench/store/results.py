"""The results store: the one module that knows how a results directory is laid out.

``selbench run`` writes, and ``selbench leaderboard`` / ``selbench plot`` read, a results
directory through :class:`ResultsDir`::

    OUT/run.json                      the run record (RunRecord): provenance, spec, cell list
    OUT/spec.yaml                     the spec with every default filled in
    OUT/cells/<experiment>/<method>/seed<s>[-beta<b>].json   one CellRecord per cell
    OUT/cells/<experiment>/<method>/seed<s>[-beta<b>].npz    its per-example arrays (first seed)
    OUT/leaderboard.{md,csv,json}, OUT/plots/<experiment>/...
    OUT/.selbench.lock                held by the one run writing to OUT
    OUT/.selbench.locks/<experiment>/<method>.lock   held by the job writing that method's cells
    OUT/logs/                         job logs of distributed runs (selbench.execution.executors)
    OUT/tuning/<experiment>/<method>/seed<s>.journal   Optuna journals of tuned cells

Every record is a typed pydantic model with a ``schema_version`` and a ``checksum``: the
SHA-256 of its own canonical JSON (without the checksum). A cell record also holds the
SHA-256 of its per-example arrays file. Reading verifies both: a cell that is missing,
unreadable, not a cell record, altered after it was written (one digit of a metric is enough),
computed for another configuration (its key differs), or whose arrays are missing or damaged
is reported with its path and never reused; the runner recomputes it.

Files are written atomically (:func:`selbench.store.atomic_path`) with the permissions the
user's umask gives, and only one process writes to a results directory at a time
(:meth:`ResultsDir.lock`).

Nothing selbench writes into a results directory ever follows a link out of it (issue 29):
a lock file is opened with ``O_NOFOLLOW`` (and ``O_CREAT``, never truncated before it is
held), so a lock (or a tuning journal) that is a symbolic link, a hard link to another file
or not a plain file is a :class:`ResultsError` naming it; a folder the store creates
(``cells/<experiment>/...``, ``.selbench.locks/<experiment>``, ``tuning/<experiment>/...``)
or names (``plots/<experiment>``) is refused, naming the link, when a symbolic link on its
way leads out of the directory (a link to another folder inside it is fine; the directory
itself may be a link); and a file written atomically onto a link replaces the link itself
(:func:`os.replace`), never the file it points to.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from selbench.util.files import atomic_path, atomic_write_json, atomic_write_text

__all__ = [
    "CELL_SCHEMA",
    "RUN_SCHEMA",
    "ArraysRef",
    "CellCheck",
    "CellRecord",
    "ResultsDir",
    "ResultsError",
    "RunRecord",
    "slug",
]

CELL_SCHEMA = 3
#: the problem of a cell written before the typed records (recomputed, one summary line)
LEGACY = "written by an older selbench"
RUN_SCHEMA = 2
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
#: the per-example arrays a cell stores (first seed), for figures
ARRAY_KEYS = ("confidence", "raw_confidence", "prediction", "score", "correct", "domain")


class ResultsError(ValueError):
    """A results directory cannot be used as asked; the message names the path."""


def slug(text: str) -> str:
    """A file-name-safe, collision-free name for a method label."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.").lower() or "method"
    return f"{s[:48]}-{hashlib.sha256(json.dumps(text).encode()).hexdigest()[:6]}"


def safe_name(name: Any, what: str) -> str:
    """``name`` when it can be one path component under a results directory, else an error
    (names come from files a user may have been handed: ``../x`` or ``/abs`` never pass)."""
    if not isinstance(name, str) or not _NAME.match(name) or len(name.encode()) > 200:
        raise ResultsError(f"{what} {name!r} is not a valid name (letters, digits, '.', '_', "
                           "'-'; at most 200 bytes; not starting with '.')")
    return name


def link_message(path: Path, root: Path | None = None) -> str:
    """One line saying that ``path`` is a symbolic link selbench will not write through."""
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    where = f" out of the results directory {root}" if root is not None else ""
    return (f"{path} is a symbolic link{where}{target}; selbench never writes through a link "
            "in a results directory: remove it")


def open_plain_file(path: Path, flags: int, what: str) -> int:
    """A descriptor of the plain file ``path`` (``what`` names it in messages: "the lock
    file", "the tuning journal"), opened with ``flags`` and never through a link;
    :class:`ResultsError` naming ``path`` when it is a symbolic link, a hard link to another
    file (more than one name) or not a plain file, or cannot be opened."""
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if path.is_symlink():  # ELOOP (Linux), EMLINK (FreeBSD): O_NOFOLLOW refused a link
            raise ResultsError(link_message(path)) from None
        raise ResultsError(f"cannot open {what} {path}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        kind = ("not a plain file" if not stat.S_ISREG(info.st_mode)
                else f"a hard link ({info.st_nlink} names) to a file that may lie elsewhere")
        raise ResultsError(f"{what} {path} is {kind}; selbench never writes through a "
                           "link in a results directory: remove it")
    return fd


def open_lock_file(path: Path) -> int:
    """A descriptor of the lock file ``path``, created if absent, opened read-write without
    following a link and without truncating it (:func:`open_plain_file`)."""
    return open_plain_file(path, os.O_RDWR | os.O_CREAT, "the lock file")


@contextmanager
def _flock(path: Path, held_message, holder: str | None = None) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if absent, never through a link:
    :func:`open_lock_file`), writing ``holder`` (default this process's id) into it;
    :class:`ResultsError` with ``held_message(what the holder wrote)`` when another process
    holds it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no advisory locks, no check
        yield
        return
    fd = open_lock_file(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            current = os.pread(fd, 128, 0).decode(errors="replace").strip() or "?"
            raise ResultsError(held_message(current)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{holder or os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checksum: str = ""

    def computed_checksum(self) -> str:
        return hashlib.sha256(_canonical(self.model_dump(mode="json", exclude={"checksum"})))\
            .hexdigest()

    def sealed(self):
        return self.model_copy(update={"checksum": self.computed_checksum()})


class ArraysRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: str = Field(description="file name, next to the cell record")
    sha256: str


class CellRecord(_Record):
    """One finished cell: a method × seed (× training β) on one experiment.

    Schema 3 (selbench 0.2): every metric of the registry (:data:`selbench.measure.metrics.METRICS`),
    ``intervals`` and ``bootstrap``."""

    schema_version: Literal[3] = CELL_SCHEMA
    key: str = Field(description="content key: hash of everything that determines the cell")
    components: dict[str, Any] = Field(
        default_factory=dict,
        description="what the key was made of (configuration hashes, code and input digests), "
                    "so a rerun can say why a cell is recomputed",
    )
    experiment: str
    method: str
    seed: int
    train_beta: float
    betas: list[float]
    metrics: dict[str, list[float]]
    intervals: dict[str, Any] | None = Field(
        None, description="bootstrap intervals over the evaluation examples per metric: "
                          "{low: [per β], high: [per β], auc: [low, high]} (selective) or "
                          "{low, high} (ranking); see selbench.measure.bootstrap.selective_intervals")
    bootstrap: dict[str, Any] | None = Field(
        None, description="how the intervals were drawn: resamples, level, method")
    n_fit: int
    n_eval: int
    device: str
    spec_hash: str
    selects: bool = Field(True, description="False: the selector does not select; every "
                                            "example was accepted at every β")
    timing: dict[str, float] = Field(default_factory=dict)
    arrays: ArraysRef | None = None
    tuning: dict[str, Any] | None = Field(
        None, description="how the cell's parameters were tuned (selbench.execution.tuning): "
                          "objective, sampler, inner split, chosen parameters, trial history; "
                          "None: fitted with the method's parameters")
    shared_fit_rows: bool | None = Field(
        None, description="True: every seed fits the same rows (n_fit unset or the whole "
                          "fitting split), so seeds vary only the methods' own randomness; "
                          "None: each seed draws its own n_fit rows")

    #: optional fields left out of the file and the checksum while None (a record without
    #: them is byte for byte what it was before they existed)
    OPTIONAL: ClassVar[tuple[str, ...]] = ("tuning", "shared_fit_rows")

    def unset_optional(self) -> set[str]:
        return {name for name in self.OPTIONAL if getattr(self, name) is None}

    def computed_checksum(self) -> str:
        """As every record's, without the optional fields that are unset (see
        :data:`OPTIONAL`)."""
        unset = self.unset_optional()
        if not unset:
            return super().computed_checksum()
        data = self.model_dump(mode="json", exclude={"checksum", *unset})
        return hashlib.sha256(_canonical(data)).hexdigest()


class RunRecord(_Record):
    """``run.json``: what was run, where it came from, and which cells make it up."""

    schema_version: Literal[2] = RUN_SCHEMA
    provenance: dict[str, Any]
    spec: dict[str, Any]
    cells: list[str]
    cell_keys: list[str]


@dataclass
class CellCheck:
    """What :meth:`ResultsDir.check_cell` found: ``record`` when the cell can be reused,
    else ``problem`` (and ``previous``, a readable record of another key, if any)."""

    path: Path
    record: CellRecord | None = None
    problem: str | None = None
    previous: CellRecord | None = None


class ResultsDir:
    """A results directory (see the module docstring for its layout)."""

    LOCK = ".selbench.lock"
    #: one lock file per experiment × method, held by the job writing its cells
    METHOD_LOCKS = ".selbench.locks"

    def __init__(self, root: str | Path):
        self.root = Path(root)

    # ------------------------------------------------------------------ layout
    @property
    def run_path(self) -> Path:
        return self.root / "run.json"

    @property
    def spec_path(self) -> Path:
        return self.root / "spec.yaml"

    def cell_path(self, experiment: str, method: str, seed: int, train_beta: float | None) -> Path:
        """The cell's record; :class:`ResultsError` when a link leads its folder out of the
        directory (see :meth:`inside`)."""
        name = f"seed{seed}" + (f"-beta{train_beta:g}" if train_beta is not None else "")
        folder = self.root / "cells" / safe_name(experiment, "experiment name") / slug(method)
        return self.inside(folder) / f"{name}.json"

    def journal_path(self, experiment: str, method: str, seed: int) -> Path:
        """The tuning journal of a method's cells of one seed
        (``tuning/<experiment>/<method>/seed<s>.journal``, :mod:`selbench.execution.journal`);
        :class:`ResultsError` naming the link when a link leads its folder out of the
        directory (:meth:`inside`), or when the journal itself is a symbolic link, a hard link
        or not a plain file (nothing is ever appended through one)."""
        folder = self.root / "tuning" / safe_name(experiment, "experiment name") / slug(method)
        path = self.inside(folder) / f"seed{seed}.journal"
        try:
            info = path.lstat()
        except FileNotFoundError:
            return path
        except OSError as exc:
            raise ResultsError(f"cannot read the tuning journal {path}: "
                               f"{exc.strerror or exc}") from None
        if stat.S_ISLNK(info.st_mode):
            raise ResultsError(link_message(path, self.root))
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            what = ("not a plain file" if not stat.S_ISREG(info.st_mode)
                    else f"a hard link ({info.st_nlink} names) to a file that may lie elsewhere")
            raise ResultsError(f"the tuning journal {path} is {what}; selbench never writes "
                               "through a link in a results directory: remove it")
        return path

    def plots_dir(self, experiment: str) -> Path:
        """The experiment's plots folder; :class:`ResultsError` when a link leads it out of
        the directory (see :meth:`inside`)."""
        return self.inside(self.root / "plots" / safe_name(experiment, "experiment name"))

    def inside(self, folder: Path) -> Path:
        """``folder`` (a folder under the directory, which need not exist yet) when no
        symbolic link on its way leads out of the directory; else :class:`ResultsError`
        naming the link."""
        if folder.resolve().is_relative_to(self.root.resolve()):
            return folder
        current = self.root
        try:
            parts = folder.relative_to(self.root).parts
        except ValueError:
            parts = ()
        for part in parts:
            current = current / part
            if current.is_symlink():
                raise ResultsError(link_message(current, self.root))
        raise ResultsError(f"{folder} leaves the results directory {self.root}")

    def folder(self, folder: Path) -> Path:
        """Create ``folder`` under the directory (with its parents) and return it, refused
        (:class:`ResultsError` naming the link) when a link leads it out (:meth:`inside`)."""
        self.inside(folder).mkdir(parents=True, exist_ok=True)
        return folder

    def resolve(self, rel: str) -> Path:
        """``root / rel`` for a path read from run.json, refused if it leaves the directory."""
        path = (self.root / rel).resolve()
        if not path.is_relative_to(self.root.resolve()) or Path(rel).is_absolute():
            raise ResultsError(f"{self.run_path}: cell path {rel!r} leaves the results directory")
        return self.root / rel

    # ------------------------------------------------------------------ preparing
    def prepare(self) -> None:
        """Create the directory, or say clearly why it cannot be used."""
        if self.root.exists() and not self.root.is_dir():
            raise ResultsError(f"results directory {self.root} is a file, not a folder")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultsError(f"cannot create results directory {self.root}: "
                               f"{exc.strerror or exc}") from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise ResultsError(f"results directory {self.root} is not writable")

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the directory's write lock; another process holding it is an error, and so
        is a lock file that is a link (:func:`open_lock_file`)."""
        with _flock(self.root / self.LOCK, lambda holder: (
            f"another selbench run (pid {holder}) is writing to {self.root}; wait for it "
            "to finish, or use another --out")):
            yield

    def method_lock_path(self, experiment: str, method: str) -> Path:
        return (self.root / self.METHOD_LOCKS / safe_name(experiment, "experiment name")
                / f"{slug(method)}.lock")

    @contextmanager
    def method_lock(self, experiment: str, method: str) -> Iterator[None]:
        """Own the cells of one method on one experiment while writing them: the ownership
        rule of distributed runs (``selbench run --executor local|submitit``), where each
        job writes the cells of one method and no two jobs may write the same cell. Another
        process holding it (a job still running, e.g. one resubmitted while its first
        attempt lingers) is a :class:`ResultsError` naming the method; the lock goes with
        the process that holds it, so a killed job never leaves it held."""
        import socket

        path = self.method_lock_path(experiment, method)
        self.folder(path.parent)
        with _flock(path, lambda holder: (
            f"the cells of method {method!r} on experiment {experiment!r} are being written "
            f"by another process (host:pid {holder}); two jobs never write the same cell"),
                    holder=f"{socket.gethostname()}:{os.getpid()}"):
            yield

    # ------------------------------------------------------------------ run record
    def read_run(self) -> RunRecord:
        """The run record; :class:`ResultsError` naming the file when absent or damaged."""
        path = self.run_path
        if not path.is_file():
            raise ResultsError(f"{self.root}: no run.json; is this a selbench results directory?")
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ResultsError(f"{path}: not readable as JSON ({exc})") from None
        if isinstance(data, dict) and data.get("schema_version") is None and "provenance" in data:
            raise ResultsError(f"{path}: written by an older selbench (no schema_version); "
                               "rerun `selbench run` to rewrite it")
        try:
            record = RunRecord.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "<root>"
            raise ResultsError(f"{path}: not a selbench run record ({where}: {first['msg']})") \
                from None
        if record.checksum != record.computed_checksum():
            raise ResultsError(f"{path}: checksum mismatch: the file was changed after selbench "
                               "wrote it; rerun `selbench run` to rewrite it")
        if len(record.cells) != len(record.cell_keys):
            raise ResultsError(f"{path}: cells and cell_keys differ in length")
        for rel in record.cells:
            self.resolve(rel)
        for exp in record.spec.get("experiments", []):
            safe_name(exp.get("name") if isinstance(exp, dict) else None, f"{path}: experiment name")
        return record

    def existing_spec_name(self) -> str | None:
        """The spec name of the run record already here, if one can be read."""
        try:
            return self.read_run().provenance.get("spec_name")
        except ResultsError:
            return None

    def write_run(self, record: RunRecord) -> None:
        atomic_write_json(self.run_path, record.sealed().model_dump(mode="json"))

    def write_spec(self, text: str) -> None:
        atomic_write_text(self.spec_path, text)

    # ------------------------------------------------------------------ cells
    def check_cell(self, path: Path, key: str, needs_arrays: bool = False) -> CellCheck:
        """Whether the cell at ``path`` can be reused for ``key`` (see :class:`CellCheck`)."""
        check = CellCheck(path)
        if not path.is_file():
            check.problem = "missing"
            return check
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            check.problem = f"unreadable ({type(exc).__name__})"
            return check
        if isinstance(data, dict) and (
            ("schema_version" not in data and "format" in data)
            or (isinstance(data.get("schema_version"), int) and data["schema_version"] < CELL_SCHEMA)
        ):
            check.problem = LEGACY
            return check
        try:
            record = CellRecord.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "<root>"
            check.problem = f"not a cell record ({where}: {first['msg']})"
            return check
        if record.checksum != record.computed_checksum():
            check.problem = "checksum mismatch (changed after it was written)"
            return check
        if record.key != key:
            check.problem = "computed for another configuration"
            check.previous = record
            return check
        if record.arrays is not None or needs_arrays:
            problem = self._arrays_problem(path, record)
            if problem is not None:
                check.problem = problem
                return check
        check.record = record
        return check

    def _arrays_problem(self, path: Path, record: CellRecord) -> str | None:
        if record.arrays is None:
            return "per-example arrays missing"
        arrays = path.with_name(record.arrays.file)
        if arrays.parent != path.parent or not arrays.is_file():
            return f"per-example arrays {arrays.name} missing"
        try:
            digest = _sha256_file(arrays)
        except OSError as exc:
            return f"per-example arrays unreadable ({exc.strerror or exc})"
        if digest != record.arrays.sha256:
            return f"per-example arrays {arrays.name} damaged (checksum mismatch)"
        return None

    def write_cell(self, path: Path, record: CellRecord,
                   arrays: dict[str, np.ndarray] | None) -> CellRecord:
        """Write the arrays (if any), then the sealed record; both atomically, in a folder
        no link leads out of the directory (:meth:`folder`)."""
        self.folder(path.parent)
        if arrays is not None:
            npz = path.with_suffix(".npz")
            with atomic_path(npz, suffix=".npz") as tmp:
                with open(tmp, "wb") as fh:
                    # uncompressed: the arrays are mostly float64 noise that zlib shrinks by a
                    # quarter at 50x the time (50,000 rows: 54 ms vs 1 ms; git compresses the
                    # committed ones anyway)
                    np.savez(fh, key=np.array(record.key), **arrays)
                digest = _sha256_file(tmp)
            record = record.model_copy(update={"arrays": ArraysRef(file=npz.name, sha256=digest)})
        record = record.sealed()
        # no fsync: the record is sealed with its checksum, so a file torn by a power loss
        # is recomputed, never read as data (check_cell); 4 ms a cell saved
        atomic_write_json(path, record.model_dump(mode="json",
                                                  exclude=record.unset_optional() or None),
                          durable=False)
        return record

    def load_arrays(self, path: Path, record: CellRecord) -> dict[str, np.ndarray]:
        """The verified per-example arrays of a cell; :class:`ResultsError` naming the file."""
        problem = self._arrays_problem(path, record)
        if problem is not None:
            raise ResultsError(f"{path}: {problem}; rerun `selbench run` to recompute the cell")
        npz = path.with_name(record.arrays.file)
        try:
            with np.load(npz, allow_pickle=False) as data:
                return {k: np.asarray(data[k]) for k in data.files if k != "key"}
        except (OSError, ValueError, KeyError) as exc:
            raise ResultsError(f"{npz}: unreadable ({exc})") from None

