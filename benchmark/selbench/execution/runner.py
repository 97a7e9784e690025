"""The runner: spec -> cached backbone outputs -> fitted methods -> metrics -> leaderboard.

For each experiment the backbone outputs of the fitting and evaluation splits come from the
on-disk cache (computed once per dataset + backbone configuration + split:
:mod:`selbench.execution.extraction`). Then each *cell* — one method × seed (× training β
when ``train_beta: per_beta``) — is fitted on a seeded sample of ``n_fit`` fitting examples,
scored on the evaluation data, thresholded at each coverage β, and measured
(:mod:`selbench.execution.cells`). Every finished cell is written atomically to
``OUT/cells/...``, keyed by a hash of everything that determines it
(:mod:`selbench.execution.keys`), so an interrupted run picks up where it stopped and a
changed method recomputes only its own cells.

The unfinished cells of a method — its seeds × training β — are always fitted by one
:meth:`~selbench.contract.api.Scheme.fit_many` call (the training schemes train them as one model
with :mod:`selbench.training.engine`; a scheme that does not override it fits them one by one), then
evaluated and written one by one as above.

Where the cells are computed is the executor's choice (:mod:`selbench.execution.executors`): in this
process (``inline``, the default), or as jobs — one per method with unfinished cells, after
one job per experiment whose backbone outputs are missing from the cache — on a local
process pool or on Slurm through submitit (:func:`~selbench.execution.distributed.run_unit`
is what a job runs: :mod:`selbench.execution.distributed`). Every executor writes the same
cells, so the leaderboard is the same byte for byte.

Each cell is a :class:`~selbench.library.estimator.SelectiveRecalibrator` whose parameters are the
method's YAML fields (``scheme``, ``selector``, ``recalibrator``, ``loss``, ``coverage``, with
their validated params) and the cell's training β, seed and device: the estimator builds the
plugins from the registry, fits them (its components as one job of ``fit_many``) and scores and measures the evaluation data, so a Python user fitting the same
estimator on the same rows gets the cell's numbers. The runner knows nothing about individual
plugins: it drives them through the interfaces in :mod:`selbench.contract.api`.

:func:`run` turns its keywords into :class:`~selbench.execution.plan.RunSettings`, makes the
run's :class:`~selbench.execution.plan.RunPlan` once (:func:`~selbench.execution.plan.make_plan`:
identity, cells and keys, provenance, what is reused) and hands both forward.

This module is the entry point (:func:`run`) and the inline run; it re-exports the names
users import from it (:class:`RunError`, :class:`RunReport` / :class:`RunResults`,
:class:`Leaderboard`, :class:`JobsFailed`, :func:`fit_indices`, :func:`slug`,
:func:`resolve_device`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from selbench.execution.cells import fit_cells, method_groups
from selbench.execution.distributed import JobsFailed, run_distributed, work_context
from selbench.execution.errors import MethodFailure, MethodsFailed, RunError
from selbench.execution.extraction import experiment_outputs
from selbench.execution.keys import Cell
from selbench.execution.plan import RunPlan, RunSettings, make_plan
from selbench.execution.results_api import Leaderboard, RunReport, RunResults
from selbench.measure.evaluate import fit_indices
from selbench.spec import ResolvedSpec, SpecError, load_spec
from selbench.store.cache import OutputCache
from selbench.store.results import CellRecord, ResultsDir, ResultsError, RunRecord, slug
from selbench.training.devices import resolve_device

__all__ = ["JobsFailed", "Leaderboard", "MethodsFailed", "RunError", "RunReport", "RunResults", "fit_indices",
           "resolve_device", "run", "slug"]


def run(
    spec: str | Path | dict | ResolvedSpec,
    *,
    out_dir: str | Path | None = None,
    device: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    cache_dir: str | Path | None = None,
    progress: bool = True,
    plots: bool = True,
    force: bool = False,
    only: list[str] | tuple[str, ...] = (),
    optional: bool = True,
    executor: str | None = None,
    workers: int | None = None,
    retries: int | None = None,
) -> RunReport:
    """Run every cell of ``spec`` not already finished in ``out_dir``; write the leaderboard.

    A finished cell is reused only when its record is intact (checksums verified) and its key
    — the spec's settings, the content of every input file, the code of every plugin it uses
    and the core's metric definitions — is unchanged; every other cell is recomputed and the
    report says why (:attr:`RunReport.reasons`).

    Args:
        spec: a spec path, a raw dict, or an already resolved spec.
        out_dir: results directory (default ``results/<spec name>``).
        device: ``auto`` / ``cpu`` / ``cuda``; default the spec's ``device``.
        overrides: ``key.path=value`` strings applied before validation.
        cache_dir: where backbone outputs are cached (default :func:`default_cache_dir`).
        progress: show progress on stderr (a bar on a terminal, plain lines in a pipe or
            a log: :func:`selbench.util.progress.progress_bar`).
        plots: also draw the figures into ``out_dir/plots/`` (see :mod:`selbench.reporting.plots`).
        force: recompute every cell (or, with ``only``, every cell of those methods).
        only: method labels whose cells ``force`` recomputes.
        optional: run the experiments marked ``optional: true`` whose inputs are present
            (False: leave every optional experiment out); each one left out is printed and
            listed in :attr:`RunReport.skipped`.
        executor: ``inline`` / ``local`` / ``submitit`` (see :mod:`selbench.execution.executors`);
            default the spec's ``executor:`` block, else inline. Every executor gives the
            same cells and leaderboard.
        workers: worker processes of the ``local`` executor.
        retries: resubmit a failed job up to this many times (distributed executors).
    """
    overrides, only = _strings(overrides, "overrides"), _strings(only, "only")
    resolved = _resolve(spec, overrides, optional, only)
    requested = device or resolved.spec.device
    settings = RunSettings(
        device=resolve_device(requested), requested_device=requested,
        executor=_executor_options(resolved, executor, workers, retries),
        progress=progress, plots=plots, force=force, only=frozenset(only))
    results = _results_dir(resolved, out_dir)
    cache = OutputCache(cache_dir)
    cache.prepare()
    with results.lock():
        plan = make_plan(resolved, results, cache, settings)
        report = _run_plan(plan, settings)
    report.skipped = list(resolved.skipped)
    return report


def _resolve(spec, overrides, optional, only) -> ResolvedSpec:
    """The resolved spec (its optional experiments left out printed), ``only``'s labels
    checked against its methods."""
    resolved = spec if isinstance(spec, ResolvedSpec) else load_spec(
        spec, overrides=overrides, optional=optional)
    for name, why in resolved.skipped:
        print(f"selbench: experiment {name!r} {why}", file=sys.stderr)
    labels = {m.label for e in resolved.spec.experiments for m in e.methods}
    unknown = [lab for lab in only if lab not in labels]
    if unknown:
        raise SpecError([f"--only: no method labelled {lab!r}; the spec has "
                         f"{', '.join(repr(x) for x in sorted(labels))}" for lab in unknown],
                        resolved.source)
    return resolved


def _strings(value, name: str) -> list[str]:
    """``overrides`` / ``only`` as a list of strings: one string is one item (not its
    characters); anything else than strings is a ``ValueError`` naming the argument."""
    if isinstance(value, str):
        return [value]
    try:
        items = list(value or ())
    except TypeError:
        raise ValueError(f"{name}: expected a list of strings, got "
                         f"{type(value).__name__}") from None
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"{name}: expected a list of strings, got an item {item!r}")
    return items


def _executor_options(resolved: ResolvedSpec, executor, workers, retries):
    """The run's executor options, checked (with the environment) before anything is
    written."""
    from selbench.execution.executors import check_environment, choose_options, require_submitit

    check_environment()  # the SELBENCH_* switches read deep inside the run
    options = choose_options(resolved.spec.executor, executor, workers, retries)
    if options.name == "submitit":
        require_submitit()  # one clear line before anything is written
    return options


def _results_dir(resolved: ResolvedSpec, out_dir) -> ResultsDir:
    """The results directory (prepared), refused when it holds another spec's results."""
    results = ResultsDir(out_dir if out_dir is not None else Path("results") / resolved.spec.name)
    results.prepare()
    other = results.existing_spec_name()
    if other is not None and other != resolved.spec.name:
        raise ResultsError(
            f"{results.root} holds the results of spec {other!r}, not {resolved.spec.name!r}; "
            "use another --out (two specs never share a results directory)"
        )
    return results


def _record(plan: RunPlan) -> None:
    """The run's spec (every default filled in) and its record (provenance, cells, keys)."""
    canonical = plan.resolved.canonical()
    plan.results.write_spec(yaml.safe_dump(canonical, sort_keys=False, allow_unicode=True))
    plan.results.write_run(RunRecord(
        provenance=plan.provenance,
        spec=canonical,
        cells=[c.path.relative_to(plan.results.root).as_posix() for c in plan.cells],
        cell_keys=[c.key for c in plan.cells],
    ))


def _run_plan(plan: RunPlan, settings: RunSettings) -> RunReport:
    """Record the plan, compute its unfinished cells (here or as jobs), then write the
    leaderboard of what finished; a failed method or job is raised after it."""
    from selbench.reporting.leaderboard import write_leaderboard

    _record(plan)
    report = RunReport(plan.results.root)
    report.reasons = dict(plan.reuse.reasons)
    report.reused = len(plan.cells) - len(plan.todo)
    known = dict(plan.reuse.known)  # records verified or written here: not read again
    if settings.inline:
        jobs_failed = None
        failed = _run_inline(plan, settings, report, known)
    else:
        failed, jobs_failed = _run_jobs_keeping_failures(plan, settings, report)
    report.files = _write_outputs(plan.results.root, write_leaderboard, known, failed,
                                  settings.plots)
    if jobs_failed is not None:
        raise jobs_failed.with_leaderboard(report.files[0])
    if failed:
        n_methods = len({(c.e_i, c.m_i) for c in plan.cells})
        raise MethodsFailed(failed, n_methods, report.files[0]) from failed[0].cause
    return report


def _write_outputs(root, write_leaderboard, known, failed, plots) -> list:
    """The leaderboard of what finished (failed methods marked), then the figures and the
    page that shows them."""
    files = write_leaderboard(root, known=known, failed=[f.entry() for f in failed],
                              html=not plots)
    if plots:
        from selbench.reporting.html import write_page
        from selbench.reporting.plots import write_plots

        files += write_plots(root, allow_partial=bool(failed))
        files.append(write_page(root))  # the page shows the figures
    return files


def _run_inline(plan: RunPlan, settings: RunSettings, report: RunReport,
                known: dict[str, CellRecord]) -> list[MethodFailure]:
    """Every unfinished cell of ``plan`` in this process, one method (one ``fit_many``) at a
    time; each record written is added to ``known`` (by absolute path) for the leaderboard. A
    method that fails (a :class:`RunError`) is set aside with its error and the run goes on
    with the next one: the failures are returned, none of the failed cells is written."""
    from selbench.util.progress import progress_bar as tqdm  # plain lines off a terminal

    failed: list[MethodFailure] = []
    by_exp: dict[int, list[Cell]] = {}
    for c in plan.todo:
        by_exp.setdefault(c.e_i, []).append(c)
    bar = tqdm(total=len(plan.todo), desc="methods", unit="cell",
               disable=not settings.progress or not plan.todo)
    try:
        for e_i, exp_cells in by_exp.items():
            outputs = experiment_outputs(plan.resolved, e_i, plan.output_keys[e_i], plan.cache,
                                         settings.device, settings.progress)
            for group in method_groups(exp_cells):
                def written(cell: Cell, record: CellRecord) -> None:
                    known[os.path.abspath(cell.path)] = record
                    report.computed += 1
                    bar.update(1)

                try:
                    fit_cells(plan, group, outputs, settings.device, written, bar)
                except RunError as exc:
                    exp = plan.resolved.spec.experiments[e_i]
                    failed.append(MethodFailure(exp.name, plan.label(group[0]),
                                                tuple(c.seed for c in group), str(exc), exc))
    finally:
        bar.close()
    return failed


def _run_jobs_keeping_failures(plan: RunPlan, settings: RunSettings, report: RunReport
                               ) -> tuple[list[MethodFailure], JobsFailed | None]:
    """:func:`_run_jobs`; the method jobs that failed as failures (and their error), for
    the leaderboard of the others. A failed extraction job is raised: no method ran."""
    try:
        _run_jobs(plan, settings, report)
    except JobsFailed as exc:
        if any(f.unit.stage != "fit" for f in exc.failures):
            raise
        return [MethodFailure(f.unit.experiment, str(f.unit.method), f.unit.seeds, f.error)
                for f in exc.failures], exc
    return [], None


def _run_jobs(plan: RunPlan, settings: RunSettings, report: RunReport) -> None:
    """The unfinished cells as jobs (:func:`~selbench.execution.distributed.run_distributed`)
    on the executor's backend, each job running the executor's task: the jobs resolve the
    parent's device on a local pool, the requested one on a cluster."""
    from selbench.execution.executors import UnitTask, make_backend

    device = settings.job_device
    backend = make_backend(settings.executor, plan.results.root, device)
    task = UnitTask(work_context(plan, device), log_dir=backend.log_dir())
    run_distributed(plan, settings, report, backend, task)
