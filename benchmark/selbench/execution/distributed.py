"""A distributed run: the unfinished cells as jobs on a local process pool or a cluster.

A job is a :class:`Unit`: the unfinished cells of one method on one experiment, which its
scheme fits together, or the backbone outputs of one split of an experiment (all its rows,
or one row range of a large split for a shardable backbone), made before any method job is
submitted. :func:`run_unit` is what a job runs, in a worker process or a cluster job, from a
:class:`WorkContext` (it makes its own :class:`~selbench.execution.plan.RunPlan` once per
process, so a job whose spec, inputs or code changed after submission refuses to write); :func:`run_distributed`
submits the jobs, resubmits failed ones, merges the row ranges and raises
:class:`JobsFailed` naming every job that failed. The backends that run the jobs are
:mod:`selbench.execution.executors`' (which imports this module to run a job, so the caller,
:mod:`selbench.execution.runner`, makes the backend and its task and passes them in).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from selbench.contract.data import ModelOutputs
from selbench.execution.cells import fit_cells, method_groups
from selbench.execution.errors import RunError, leaderboard_note
from selbench.execution.extraction import Extraction, experiment_outputs
from selbench.execution.plan import RunPlan, RunSettings, make_plan
from selbench.execution.results_api import RunReport
from selbench.spec import ResolvedSpec
from selbench.store.cache import OutputCache
from selbench.store.results import ResultsDir, slug
from selbench.training.devices import resolve_device

__all__ = ["JobFailure", "JobsFailed", "Unit", "WorkContext", "run_distributed", "run_unit",
           "work_context"]


@dataclass(frozen=True)
class Unit:
    """One job of a distributed run: the unfinished cells (``keys``) of one method on one
    experiment, which its scheme fits together (``stage="fit"``), or the backbone outputs of
    one split of an experiment — all its rows, or one row range (``rows``) of a large split
    for a shardable backbone (``stage="extract"``, made before any method job is
    submitted)."""

    stage: str
    e_i: int
    experiment: str
    m_i: int | None = None
    method: str | None = None
    keys: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()
    #: recompute the cells even when finished (--force); else finished ones are skipped
    force: bool = False
    #: extraction: the split, and the row range ``[start, stop)`` (None: the whole split)
    split: str | None = None
    rows: tuple[int, int] | None = None

    def describe(self) -> str:
        if self.stage == "extract":
            rows = f" rows [{self.rows[0]}, {self.rows[1]})" if self.rows else ""
            return f"experiment {self.experiment!r}: backbone outputs of split {self.split!r}{rows}"
        seeds = ", ".join(str(s) for s in dict.fromkeys(self.seeds))
        return (f"experiment {self.experiment!r}, method {self.method!r} "
                f"(experiments[{self.e_i}].methods[{self.m_i}]), seed(s) {seeds}")

    def log_name(self) -> str:
        if self.stage == "extract":
            rows = f"-rows-{self.rows[0]}-{self.rows[1]}" if self.rows else ""
            return f"{self.experiment}-extract-{slug(str(self.split))}{rows}"
        return f"{self.experiment}-{slug(self.method or '')}"


@dataclass(frozen=True)
class WorkContext:
    """What a job needs to redo the parent's plan: the validated spec (plugins resolve from
    the job's own registry), the directories and the requested device."""

    spec: Any  # selbench.spec.Spec
    raw: dict
    source: str | None
    base_dir: str
    spec_hash: str
    out_dir: str
    cache_dir: str
    device: str


_WORKER: dict[str, Any] = {}


def _worker_state(ctx: WorkContext) -> dict[str, Any]:
    """The plan of ``ctx`` (:func:`~selbench.execution.plan.make_plan`: resolved spec,
    identity, cells, output keys) and its device, made once per process."""
    from selbench.contract.registry import get_registry

    token = (ctx.spec_hash, ctx.out_dir, ctx.cache_dir, ctx.device)
    if _WORKER.get("token") == token:
        return _WORKER
    resolved = ResolvedSpec(ctx.spec, get_registry(), ctx.raw, ctx.source, base_dir=ctx.base_dir)
    if resolved.hash() != ctx.spec_hash:
        raise RunError("this job resolves the spec differently from the run that submitted it "
                       "(plugins or their versions differ on this machine?)")
    plan = make_plan(resolved, ResultsDir(ctx.out_dir), OutputCache(ctx.cache_dir))
    _WORKER.clear()
    _WORKER.update(token=token, plan=plan, cells={c.key: c for c in plan.cells},
                   device=resolve_device(ctx.device), outputs=None)
    return _WORKER


def run_unit(ctx: WorkContext, unit: Unit) -> dict[str, int]:
    """Do one job (in a worker process or a cluster job): extract a split's outputs (or one
    row range of them), or fit, measure and write a method's cells, skipping those finished
    meanwhile (a job
    resubmitted after preemption). Returns ``{"computed": n, "reused": k}``."""
    state = _worker_state(ctx)
    plan: RunPlan = state["plan"]
    dev = state["device"]

    def outputs_of(e_i: int) -> dict[str, ModelOutputs]:
        if state["outputs"] is None or state["outputs"][0] != e_i:
            state["outputs"] = None  # free the previous experiment's outputs first
            state["outputs"] = (e_i, experiment_outputs(
                plan.resolved, e_i, plan.output_keys[e_i], plan.cache, dev, False))
        return state["outputs"][1]

    if unit.stage == "extract":
        ex = Extraction(plan.resolved, unit.e_i, plan.output_keys[unit.e_i], plan.cache, dev,
                        False)
        if unit.rows is None:
            ex.split(str(unit.split))
        else:
            ex.shard(str(unit.split), unit.rows)
        return {"computed": 0, "reused": 0}
    cells = [state["cells"].get(k) for k in unit.keys]
    if any(c is None for c in cells):
        raise RunError(f"experiments[{unit.e_i}].methods[{unit.m_i}] ({unit.method!r}): the "
                       "spec, an input file or plugin code changed after the run was "
                       "submitted; rerun `selbench run`")
    results = plan.results
    with results.method_lock(unit.experiment, unit.method):
        todo = [c for c in cells if unit.force or
                results.check_cell(c.path, c.key, c.needs_arrays).record is None]
        if todo:
            fit_cells(plan, todo, outputs_of(unit.e_i), dev)
    return {"computed": len(todo), "reused": len(cells) - len(todo)}


@dataclass
class JobFailure:
    """A job that failed after every retry: what it served, its error and its log."""

    unit: Unit
    error: str
    log: str | None

    def line(self) -> str:
        log = f"\n      log: {self.log}" if self.log else ""
        return f"  - {self.unit.describe()}: {self.error}{log}"


class JobsFailed(RunError):
    """Some jobs of a distributed run failed; finished cells are kept (rerun to resume)."""

    def __init__(self, failures: list[JobFailure], total: int, leaderboard=None):
        self.failures = failures
        self.total = total
        self.leaderboard = leaderboard
        done = "the cells that finished are saved"
        if leaderboard is not None:
            done += f" and {leaderboard_note(leaderboard, len(failures))}"
        lines = [f"{len(failures)} of {total} job(s) failed; {done}; rerun the same command "
                 "(or add --retries N) to compute the rest:"]
        lines += [f.line() for f in failures]
        super().__init__("\n".join(lines))

    def with_leaderboard(self, path) -> JobsFailed:
        """This error, saying that the leaderboard of the finished methods is at ``path``."""
        return JobsFailed(self.failures, self.total, path)


def _submit(backend, task, units: list[Unit], retries: int, progress: bool,
            report: RunReport, what: str) -> list[JobFailure]:
    """Run ``units`` on ``backend`` (an :class:`~selbench.execution.executors.Backend`;
    ``task`` its :class:`~selbench.execution.executors.UnitTask`), resubmitting failed ones
    up to ``retries`` times; the failures left."""
    pending = list(units)
    failed: list[tuple[Unit, Any]] = []  # (unit, its executors.Outcome)
    if not pending:
        return []
    for attempt in range(retries + 1):
        if progress:
            print(f"selbench: {what}: {len(pending)} job(s) on {backend.name}"
                  + (f" (retry {attempt} of {retries})" if attempt else ""), file=sys.stderr)

        def done(unit: Unit, outcome) -> None:
            if outcome.ok and unit.stage == "fit":
                report.computed += outcome.value["computed"]
                report.reused += outcome.value["reused"]
            if progress:
                state = "done" if outcome.ok else f"FAILED: {outcome.error}"
                print(f"selbench:   {unit.describe()}: {state}", file=sys.stderr)

        outcomes = backend.run(task, pending, progress, done)
        failed = [(u, o) for u, o in zip(pending, outcomes) if not o.ok]
        if not failed:
            return []
        pending = [u for u, _ in failed]
    return [JobFailure(u, o.error or "failed", o.log) for u, o in failed]


def _extraction_units(plan: RunPlan, todo, device: str, shard_size: int | None):
    """The extraction jobs of the outputs missing from the cache — one per key (a key that
    several experiments share is extracted once), or one per row range of a split of more
    than ``shard_size`` rows when the backbone is shardable — and the shards to merge."""
    units: list[Unit] = []
    merges: list[tuple[Extraction, str, list[tuple[int, int]]]] = []
    seen: set[str] = set()
    for e_i in dict.fromkeys(c.e_i for c in todo):
        ex = Extraction(plan.resolved, e_i, plan.output_keys[e_i], plan.cache, device, False)
        for split, (key, _) in ex.keys.items():
            if key in seen or plan.cache.path(key).is_file():
                continue
            seen.add(key)
            if shard_size and ex.shardable:
                n = len(ex.labels(split))
                if n > shard_size:
                    shards = [(a, min(a + shard_size, n)) for a in range(0, n, shard_size)]
                    units += [Unit("extract", e_i, ex.exp.name, split=split, rows=r)
                              for r in shards]
                    merges.append((ex, split, shards))
                    continue
            units.append(Unit("extract", e_i, ex.exp.name, split=split))
    return units, merges


def work_context(plan: RunPlan, device: str) -> WorkContext:
    """The :class:`WorkContext` of a run's jobs; ``device`` the one they resolve (the parent's
    resolved device on a local pool, the requested one on a cluster:
    :attr:`~selbench.execution.plan.RunSettings.job_device`)."""
    resolved = plan.resolved
    return WorkContext(
        spec=resolved.spec, raw=resolved.raw, source=resolved.source,
        base_dir=str(resolved.base_dir), spec_hash=plan.spec_hash,
        out_dir=str(plan.results.root.resolve()), cache_dir=str(plan.cache.root.resolve()),
        device=device)


def run_distributed(plan: RunPlan, settings: RunSettings, report: RunReport, backend,
                    task) -> None:
    """The plan's unfinished cells as jobs on a local pool or a cluster (see
    :mod:`selbench.execution.executors`): first the missing backbone outputs (one job per cache key —
    split of an experiment —, or per row range of a split larger than the executor's
    ``shard_size`` for a shardable backbone, merged here once all are in), then one job per
    method; the leaderboard is written by the caller, which also makes ``backend`` and its
    ``task`` (the executor's, for :func:`work_context`)."""
    options, progress = settings.executor, settings.progress
    extract, merges = _extraction_units(plan, plan.todo, settings.device,
                                        getattr(options, "shard_size", None))
    failures = _submit(backend, task, extract, options.retries, progress, report,
                       "backbone outputs")
    if failures:
        raise JobsFailed(failures, len(extract))
    for ex, split, shards in merges:
        if progress:
            print(f"selbench: [{ex.exp.name}] merging {len(shards)} row ranges of split "
                  f"{split!r}", file=sys.stderr)
        ex.merge(split, shards)
    units = []
    for group in method_groups(list(plan.todo)):
        e_i, m_i = group[0].e_i, group[0].m_i
        label = plan.label(group[0])
        units.append(Unit(
            "fit", e_i, plan.resolved.spec.experiments[e_i].name, m_i, label,
            tuple(c.key for c in group), tuple(c.seed for c in group),
            force=settings.forces(label)))
    failures = _submit(backend, task, units, options.retries, progress, report, "methods")
    if failures:
        raise JobsFailed(failures, len(units))
