"""What a run will compute, decided once before anything is fitted, and what it was asked for.

Two small frozen records travel forward through a run instead of long parameter lists:

:class:`RunSettings`
    what the run was asked for (``selbench.run``'s keywords, checked): the device it computes
    on and the one it was asked for, progress, plots, ``--force`` / ``--only`` and the
    executor's options. Made by :func:`selbench.execution.runner.run`.
:class:`RunPlan`
    what the run will compute: the spec, the results folder and the output cache, the
    :class:`~selbench.execution.keys.Identity` of its inputs and code, every cell with its key,
    the keys of each experiment's backbone outputs, the run's provenance and what is reused
    (:class:`Reuse`). Made by :func:`make_plan`, the one place a run consults
    :mod:`selbench.execution.keys`; every later step (extraction, fitting, the jobs of a
    distributed run) reads the plan. A job of a distributed run makes its own plan once per
    process (:func:`make_plan` without settings: no provenance, nothing triaged), so a job
    whose spec, inputs or code changed after submission refuses to write.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from selbench.execution.keys import (
    Cell,
    Identity,
    identify,
    output_keys,
    plan_cells,
    provenance,
    why_recomputed,
)
from selbench.spec import ResolvedSpec
from selbench.store.cache import OutputCache
from selbench.store.results import LEGACY, CellRecord, ResultsDir

__all__ = ["Reuse", "RunPlan", "RunSettings", "make_plan"]


@dataclass(frozen=True)
class RunSettings:
    """What a run was asked for: ``selbench.run``'s keywords once checked."""

    #: the device this process computes on (resolved: ``cpu`` / ``cuda``)
    device: str
    #: the device as asked (``auto`` ...): what the jobs on a cluster resolve themselves
    requested_device: str = "auto"
    #: the executor's options (:func:`selbench.execution.executors.choose_options`)
    executor: Any = None
    progress: bool = True
    plots: bool = True
    force: bool = False
    #: the method labels ``force`` applies to (empty: every method)
    only: frozenset[str] = frozenset()

    def forces(self, label: str) -> bool:
        """Whether ``--force`` recomputes the finished cells of the method ``label``."""
        return self.force and (not self.only or label in self.only)

    @property
    def inline(self) -> bool:
        """Whether the cells are computed in this process (no jobs)."""
        return self.executor is None or self.executor.name == "inline"

    @property
    def job_device(self) -> str:
        """The device the jobs resolve: the parent's on a local pool, the requested one on a
        cluster."""
        return self.device if getattr(self.executor, "name", None) == "local" \
            else self.requested_device


@dataclass(frozen=True)
class Reuse:
    """Which planned cells are reused and which are computed, and why those are recomputed."""

    #: the verified records of the finished cells reused, by absolute path
    known: Mapping[str, CellRecord]
    #: the cells to compute, in plan order
    todo: tuple[Cell, ...]
    #: why finished cells are recomputed: reason -> number of cells
    reasons: Mapping[str, int]


@dataclass(frozen=True)
class RunPlan:
    """What a run computes, decided once (:func:`make_plan`)."""

    resolved: ResolvedSpec
    results: ResultsDir
    cache: OutputCache
    identity: Identity
    #: every cell of the spec, each with its key, in the spec's order
    cells: tuple[Cell, ...]
    #: experiment index -> split -> (cache key, key material) of its backbone outputs
    output_keys: Mapping[int, Mapping[str, tuple[str, dict]]]
    spec_hash: str
    #: what the run records beside its cells (None in a job's own plan)
    provenance: dict[str, Any] | None = None
    #: what is reused (None in a job's own plan: a job checks its cells under its lock)
    reuse: Reuse | None = field(default=None)

    def label(self, cell: Cell) -> str:
        """The label of the method ``cell`` belongs to."""
        return self.resolved.spec.experiments[cell.e_i].methods[cell.m_i].label

    @property
    def todo(self) -> tuple[Cell, ...]:
        return self.reuse.todo if self.reuse is not None else self.cells


def make_plan(resolved: ResolvedSpec, results: ResultsDir, cache: OutputCache,
              settings: RunSettings | None = None) -> RunPlan:
    """The plan of a run: identity, cells and keys; with ``settings`` (the run itself, not
    one of its jobs) also its provenance and which finished cells are reused (printing why
    others are recomputed)."""
    ident = identify(resolved, cache)
    cells = tuple(plan_cells(resolved, results, ident))
    outputs = {e_i: output_keys(resolved, ident, e_i)
               for e_i in range(len(resolved.spec.experiments))}
    plan = RunPlan(resolved, results, cache, ident, cells, outputs, resolved.hash())
    if settings is None:
        return plan
    prov = provenance(resolved, settings.device)
    prov["inputs"] = ident.inputs
    prov["code"] = {"core": ident.core, **ident.code}
    return RunPlan(resolved, results, cache, ident, cells, outputs, plan.spec_hash, prov,
                   _reuse(plan, settings))


def _reuse(plan: RunPlan, settings: RunSettings) -> Reuse:
    """The finished cells whose records are intact and whose keys still hold are reused;
    ``--force`` recomputes those of the methods it names. Prints why cells are recomputed."""
    known: dict[str, CellRecord] = {}
    todo: list[Cell] = []
    reasons: dict[str, int] = {}
    for c in plan.cells:
        if settings.forces(plan.label(c)):
            todo.append(c)
            reasons["--force"] = reasons.get("--force", 0) + 1
            continue
        check = plan.results.check_cell(c.path, c.key, c.needs_arrays)
        if check.record is not None:
            known[os.path.abspath(c.path)] = check.record
            continue
        todo.append(c)
        if check.problem != "missing":
            reason = why_recomputed(c, check)
            reasons[reason] = reasons.get(reason, 0) + 1
            if check.previous is None and check.problem != LEGACY:
                print(f"selbench: warning: {c.path}: {check.problem}; recomputing it",
                      file=sys.stderr)
    for reason, n in reasons.items():
        print(f"{n} cell(s) recomputed: {reason}", file=sys.stderr)
    return Reuse(known, tuple(todo), reasons)
