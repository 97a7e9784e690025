"""Where a run's cells are computed: in this process, in a process pool, or on Slurm.

``selbench run SPEC --executor NAME`` (or a spec's top-level ``executor:`` block; the
command line wins) picks one of:

``inline`` (the default)
    every cell in the ``selbench`` process itself, one method after the other.
``local``
    a pool of ``workers`` processes on this machine (``--workers N``); where several GPUs
    are visible each worker gets one of them (``CUDA_VISIBLE_DEVICES``), and each worker's
    torch uses ``cpu_count // workers`` threads.
``submitit``
    jobs submitted through `submitit <https://github.com/facebookincubator/submitit>`_'s
    ``AutoExecutor``: a Slurm job array where ``sbatch`` is available (partition, time, GPUs,
    CPUs, memory, array parallelism and any other ``slurm_*`` option below), else local
    subprocesses; ``cluster: debug`` runs the jobs in this process (tests, debugging).
    submitit is an optional extra: ``pip install 'selbench[cluster]'``.

The unit of work is a *job*: the unfinished cells of one method on one experiment (its
seeds × training β, which the scheme's ``fit_many`` trains together). The backbone outputs
are made first, in a stage of their own: one job per split (per content key: a split that
several experiments share is extracted once) whose outputs are not in the cache — or, for a
backbone that declares ``shardable`` (the built-in image backbones do), one job per
``shard_size`` rows of a larger split, which the parent concatenates into the cache once
every range is in (a finished range is kept and never extracted again) — so that the method
jobs only read the (content-addressed) cache. A job writes its
cells through the atomic results store, holding the method's lock
(:meth:`selbench.store.results.ResultsDir.method_lock`): two jobs never write the same cell. A
job skips the cells that are already finished, so a resubmitted (``--retries``), preempted
(requeued by submitit: :meth:`UnitTask.checkpoint`) or rerun job never recomputes them. The
parent process renders the leaderboard and the figures once every cell is in; a failed job
is reported with its method, seeds, error and log file, and the run exits 1.

The cache and results directories must be on a filesystem every job can read and write
(on a cluster: a shared filesystem, with working ``flock``).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import sys
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from selbench.spec.executor import (
    ExecutorOptions,
    InlineOptions,
    LocalOptions,
    Options,
    SubmititOptions,
)
from selbench.store.results import ResultsDir

__all__ = [
    "EXECUTORS",
    "ExecutorError",
    "ExecutorOptions",
    "InlineOptions",
    "LocalOptions",
    "Outcome",
    "SubmititOptions",
    "UnitTask",
    "choose_options",
]

EXECUTORS = ("inline", "local", "submitit")
INSTALL_HINT = "pip install 'selbench[cluster]' (or, in a checkout, pip install -e '.[cluster]')"


class ExecutorError(ValueError):
    """The executor cannot be used as asked (unknown name, bad option, submitit missing);
    the message names the option. Bad input: ``selbench run`` exits 2."""


def check_environment() -> None:
    """The ``SELBENCH_*`` switches read deep inside a run (training threads, bootstrap
    threads, CUDA graphs), checked before it starts: :class:`ExecutorError` naming the
    variable (bad input), not a failure mid-run."""
    from selbench.measure.bootstrap import bootstrap_threads
    from selbench.training.engine import cuda_graphs_enabled
    from selbench.training.torchutils import batched_threads

    try:
        bootstrap_threads()
        batched_threads("cpu")
        cuda_graphs_enabled("cuda")
    except ValueError as exc:
        raise ExecutorError(f"environment: {exc}") from None


def choose_options(from_spec: BaseModel | None, name: str | None = None,
                   workers: int | None = None, retries: int | None = None) -> Options:
    """The executor of a run: the command line's ``--executor`` (with the spec's options when
    the spec names the same executor), else the spec's ``executor:`` block, else inline;
    then ``--workers`` and ``--retries``."""
    if name is not None and name not in EXECUTORS:
        raise ExecutorError(f"--executor: unknown executor {name!r}; expected one of "
                            f"{', '.join(EXECUTORS)}")
    if from_spec is not None and (name is None or name == from_spec.name):
        opts = from_spec.model_copy()
    else:
        opts = {"inline": InlineOptions, "local": LocalOptions,
                "submitit": SubmititOptions}[name or "inline"]()
    if workers is not None:
        if opts.name != "local":
            raise ExecutorError(f"--workers: applies to --executor local, not {opts.name!r}")
        if workers < 1:
            raise ExecutorError(f"--workers: must be at least 1, got {workers}")
        opts = opts.model_copy(update={"workers": workers})
    if retries is not None:
        if retries < 0:
            raise ExecutorError(f"--retries: must be at least 0, got {retries}")
        opts = opts.model_copy(update={"retries": retries})
    return opts


# --------------------------------------------------------------------------- jobs
@dataclass
class Outcome:
    """What one job came to: ``value`` (the worker's result) or ``error`` and ``log``."""

    ok: bool
    value: Any = None
    error: str | None = None
    log: str | None = None


@dataclass
class UnitTask:
    """The function every job runs: ``UnitTask(context)(unit)`` computes one unit of work
    (see :func:`selbench.execution.distributed.run_unit`) and returns an :class:`Outcome`; it
    never raises, so that a failure is reported with its message, not hidden in a pickled
    exception.

    :meth:`checkpoint` makes it requeue-able by submitit: a preempted or timed-out Slurm job
    is resubmitted with the same unit, and the new attempt skips the cells already written.
    """

    context: Any
    log_dir: str | None = None  # where a failure's traceback is written (local pool)
    #: worker-level setup, applied once per process (threads, GPU)
    setup: dict[str, Any] = field(default_factory=dict)

    def __call__(self, unit: Any) -> Outcome:
        from selbench.execution.distributed import run_unit
        from selbench.execution.errors import RunError

        _setup_process(self.setup)
        try:
            return Outcome(True, run_unit(self.context, unit))
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as exc:
            text = "".join(traceback.format_exception(exc))
            if os.environ.get("SUBMITIT_DEBUG_JOB_ID"):  # submitit's in-process debug job:
                import logging  # its log file is a handler of the root logger

                logging.getLogger("selbench.execution.executors").error(text)
            elif self.log_dir is None:  # a cluster job: its stderr is the job's log file
                print(text, file=sys.stderr, flush=True)
            # a local pool's worker shares the terminal: the traceback goes to its log only
            if isinstance(exc, (RunError, ValueError, OSError)) and str(exc):
                message = str(exc)
            else:
                message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return Outcome(False, error=message, log=self._write_log(unit, text))

    def _write_log(self, unit: Any, text: str) -> str | None:
        if self.log_dir is None:
            return None
        from selbench.util.files import atomic_write_text

        path = Path(self.log_dir) / f"{unit.log_name()}.log"
        try:
            ResultsDir(self.context.out_dir).inside(path.parent)  # no link out of OUT
            atomic_write_text(path, text)
        except (OSError, ValueError):
            return None
        return str(path)

    def checkpoint(self, unit: Any) -> Any:
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, unit)


_SETUP_DONE: dict[str, Any] | None = None


def _setup_process(setup: dict[str, Any]) -> None:
    global _SETUP_DONE
    if not setup or _SETUP_DONE == setup:
        return
    threads = setup.get("threads")
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    _SETUP_DONE = dict(setup)


# --------------------------------------------------------------------------- backends
class Backend:
    """Runs jobs: :meth:`run` takes a task and its units and returns one :class:`Outcome`
    per unit, in order, once all of them are done."""

    name = "?"

    def run(self, task: UnitTask, units: list[Any], progress: bool, done=None) -> list[Outcome]:
        raise NotImplementedError

    def log_dir(self) -> str | None:
        return None


def _visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


#: in a pool worker: the run's shared array of job states (:class:`LocalBackend`)
_JOB_STATES = None
_WAITING, _RUNNING, _FINISHED = 0, 1, 2


def _init_local_worker(counter, states, gpus: list[str], environ: dict[str, str],
                       path: list[str], run_pid: int) -> None:
    """Pool initializer: the parent's environment and ``sys.path`` as they are now (a
    forkserver child starts from the server's), the shared job states, and one GPU per
    worker (round robin) before torch sees CUDA; the worker exits when the run is gone."""
    global _JOB_STATES
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    _JOB_STATES = states
    os.environ.clear()
    os.environ.update(environ)
    sys.path[:] = path + [p for p in sys.path if p not in path]
    if len(gpus) > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index % len(gpus)]
    os.environ["SELBENCH_WORKER"] = str(index)
    _die_with_the_run(run_pid)
    from selbench.util.warnlines import install

    install()  # the worker shares the terminal: warnings as "selbench: warning:" lines


def _die_with_the_run(run_pid: int) -> None:
    """Exit this worker as soon as the run that started its pool (process ``run_pid``) is
    gone. Without it, a run killed with ``kill`` (or by a job scheduler) left its workers
    computing on and holding the method locks of their cells, so that the resumed run
    reported those methods as "being written by another process". A worker's parent is
    the pool's forkserver, which outlives the run as long as a worker lives (each worker
    holds the forkserver's liveness pipe), so ``prctl(PR_SET_PDEATHSIG)`` cannot do it: a
    daemon thread waits on a pidfd of the run instead (Linux 5.3+, no PID reuse race; the
    run is alive while the pool starts). Elsewhere nothing changes."""
    open_pidfd = getattr(os, "pidfd_open", None)
    if open_pidfd is None or run_pid == os.getpid():
        return
    try:
        fd = open_pidfd(run_pid)
    except OSError:  # already gone, or no pidfd support in this kernel
        if not _pid_alive(run_pid):
            os._exit(1)
        return
    import select
    import threading

    def watch() -> None:
        select.select([fd], [], [])
        os._exit(1)  # cells are written atomically: nothing half-written is left

    threading.Thread(target=watch, name="selbench-run-watch", daemon=True).start()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _run_tracked(task: UnitTask, index: int, unit: Any) -> Outcome:
    """What a pool worker runs: ``task(unit)``, with the job's state in the shared array
    (running, then finished), so that the parent knows which jobs a dead worker may have
    been running."""
    if _JOB_STATES is not None:
        _JOB_STATES[index] = _RUNNING
    outcome = task(unit)
    if _JOB_STATES is not None:
        _JOB_STATES[index] = _FINISHED
    return outcome


#: imported once by the forkserver, so that each worker starts without importing them
_PRELOAD = ["torch", "selbench.execution.distributed", "selbench.library.estimator",
            "selbench.contract.registry"]


def _pool_context(multiprocessing):
    """``forkserver`` where available (workers fork from a server that has imported torch
    and selbench once, never CUDA), else ``spawn``; never a plain fork of this process,
    whose threads and CUDA state do not survive it."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)  # no effect once the server runs
        return ctx
    return multiprocessing.get_context("spawn")


@contextlib.contextmanager
def _selbench_main():
    """While the pool starts its workers, ``__main__`` is a stand-in named
    ``selbench.__main__``: a forkserver or spawned child prepares its ``__main__`` from the
    parent's (it re-runs the parent's script, or re-imports its ``-m`` module, as
    ``__mp_main__``), and multiprocessing skips a main module named ``*.__main__``. So a
    worker never re-executes the caller's script, guarded by ``if __name__ ==
    "__main__":`` or not; the jobs need nothing from it (they rebuild the run from the spec
    and the installed plugins)."""
    main = sys.modules.get("__main__")
    stand_in = types.ModuleType("__main__")
    stand_in.__spec__ = importlib.machinery.ModuleSpec("selbench.__main__", None)
    sys.modules["__main__"] = stand_in
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


DIED = ("its worker process died while running it (killed, out of memory, or the plugin "
        "ended the process, e.g. os._exit)")


class LocalBackend(Backend):
    """A pool of worker processes (``concurrent.futures``) on this machine.

    A worker that dies breaks the whole pool (Python fails every job still in it): the jobs
    that were waiting, and those that had finished, are resubmitted to a new pool; a job
    that was running is the culprit when it was the only one, else each running job is
    rerun alone, and the one whose worker dies again is the culprit. So only the culprit is
    reported failed (the others' finished cells are skipped when resubmitted).
    """

    name = "local"

    def __init__(self, options: LocalOptions, out_dir: Path, device: str):
        self.gpus = _visible_gpus() if device == "cuda" else []
        if options.workers is not None:
            self.workers = options.workers
        elif len(self.gpus) > 1:
            self.workers = len(self.gpus)
        else:
            self.workers = os.cpu_count() or 1
        self.threads = max(1, (os.cpu_count() or 1) // self.workers)
        self.out_dir = Path(out_dir)
        ResultsDir(self.out_dir).inside(Path(self.log_dir()))  # no link out of OUT

    def log_dir(self) -> str:
        return str(self.out_dir / "logs" / "local")

    def run(self, task: UnitTask, units: list[Any], progress: bool, done=None) -> list[Outcome]:
        import multiprocessing

        if not units:
            return []
        ctx = _pool_context(multiprocessing)
        task.setup = {"threads": self.threads}
        outcomes: list[Outcome | None] = [None] * len(units)

        def finish(i: int, outcome: Outcome) -> None:
            outcomes[i] = outcome
            if done is not None:
                done(units[i], outcome)

        pending = list(range(len(units)))
        while pending:
            died = self._pool(ctx, task, units, pending, finish, self.workers)
            running = [i for i, state in died if state == _RUNNING]
            pending = [i for i, state in died if state != _RUNNING]
            if died:  # printed with or without progress: a recovery is never silent
                print(f"selbench: warning: a worker process died; finding which of "
                      f"{len(running)} running job(s) killed it, and resubmitting "
                      f"{len(pending)} other job(s)", file=sys.stderr)
            for i in running:
                if len(running) == 1 or self._pool(ctx, task, units, [i], finish, 1):
                    finish(i, Outcome(False, error=DIED if len(running) == 1 else
                                      DIED + ", and again when rerun alone"))
            if died and not running:  # a worker died before starting any job
                for i in pending:
                    finish(i, Outcome(False, error="a worker process died before starting "
                                                   "this job (see the messages above)"))
                pending = []
        return [o for o in outcomes if o is not None]

    def _pool(self, ctx, task: UnitTask, units: list[Any], indices: list[int], finish,
              workers: int) -> list[tuple[int, int]]:
        """Run ``units[indices]`` on a new pool of at most ``workers`` processes, calling
        ``finish(i, outcome)`` for each job that ends; the jobs left when a worker died
        (the pool is then broken), each with its state (waiting, running or finished)."""
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        states = ctx.Array("i", len(units), lock=False)
        pool = ProcessPoolExecutor(max_workers=min(workers, len(indices)), mp_context=ctx,
                                   initializer=_init_local_worker,
                                   initargs=(ctx.Value("i", 0), states, self.gpus,
                                             dict(os.environ), list(sys.path),
                                             os.getpid()))
        died: list[int] = []
        futures = {}
        try:
            with _selbench_main():  # the workers start at submit
                for i in indices:
                    try:
                        futures[pool.submit(_run_tracked, task, i, units[i])] = i
                    except BrokenProcessPool:
                        died.append(i)
            for future in as_completed(futures):
                i = futures[future]
                try:
                    outcome = future.result()
                except BrokenProcessPool:
                    died.append(i)
                    continue
                except Exception as exc:  # e.g. the unit could not be pickled
                    outcome = Outcome(False, error=f"{type(exc).__name__}: {exc}")
                finish(i, outcome)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return [(i, states[i]) for i in sorted(died)]


def require_submitit():
    try:
        import submitit
    except ImportError:
        raise ExecutorError(f"--executor submitit needs submitit, which is not installed: "
                            f"{INSTALL_HINT}") from None
    return submitit


class SubmititBackend(Backend):
    """Jobs through ``submitit.AutoExecutor``: one Slurm job array per stage."""

    name = "submitit"

    def __init__(self, options: SubmititOptions, out_dir: Path):
        submitit = require_submitit()
        self.options = options
        if options.folder:  # a folder of the user's choice
            self.folder = Path(options.folder)
        else:  # OUT/logs/submitit: no link out of OUT
            self.folder = ResultsDir(out_dir).inside(Path(out_dir) / "logs" / "submitit")
        cluster = None if options.cluster == "auto" else options.cluster
        try:
            self.executor = submitit.AutoExecutor(
                folder=self.folder / "%j", cluster=cluster,
                slurm_max_num_timeout=options.max_requeues)
            self.executor.update_parameters(**options.parameters())
        except (AssertionError, NameError, ValueError, TypeError, RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ExecutorError(f"executor submitit: {first}") from None

    def run(self, task: UnitTask, units: list[Any], progress: bool, done=None) -> list[Outcome]:
        import time

        if not units:
            return []
        if self.executor.cluster != "debug":  # a debug job runs in this very process
            task.setup = {"threads": self.options.cpus_per_task}  # torch: the job's CPUs
        jobs = self.executor.map_array(task, units)  # one job array (sbatch --array)
        if progress:
            first = jobs[0].job_id.split("_")[0] if jobs else "?"
            print(f"selbench: submitted {len(jobs)} job(s) ({self.executor.cluster}, "
                  f"array {first}); logs in {self.folder}/", file=sys.stderr)
        outcomes: list[Outcome | None] = [None] * len(units)
        pending = set(range(len(jobs)))
        while pending:
            for i in sorted(pending):
                job = jobs[i]
                if self.executor.cluster != "debug" and not job.done():
                    continue
                pending.discard(i)
                outcomes[i] = self._outcome(job)
                if done is not None:
                    done(units[i], outcomes[i])
            if pending:
                time.sleep(self.options.poll_s)
        # submitit's local cluster creates the job folder's template itself, a literal
        # (and empty) "%j" directory: leave only the per-job folders
        with contextlib.suppress(OSError):
            (self.folder / "%j").rmdir()
        return [o for o in outcomes if o is not None]

    @staticmethod
    def _outcome(job) -> Outcome:
        log = str(job.paths.stderr)
        try:
            outcome = job.result()
        except Exception as exc:  # submitit: UncompletedJobError, FailedJobError
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            return Outcome(False, error=(lines[0] if lines else type(exc).__name__)
                           + f" (job {job.job_id})", log=log)
        if not isinstance(outcome, Outcome):
            return Outcome(False, error=f"job {job.job_id} returned {type(outcome).__name__}",
                           log=log)
        if not outcome.ok:
            outcome.log = log
            outcome.error = f"{outcome.error} (job {job.job_id})"
        return outcome


def make_backend(options: Options, out_dir: Path, device: str) -> Backend:
    if isinstance(options, LocalOptions):
        return LocalBackend(options, out_dir, device)
    if isinstance(options, SubmititOptions):
        return SubmititBackend(options, out_dir)
    raise ExecutorError(f"executor {options.name!r} has no backend")  # pragma: no cover
