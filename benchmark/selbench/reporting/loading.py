"""The results folders a leaderboard or the figures are built from: their cells read,
checked and merged into one :class:`ResultSet` (:func:`load_results`), and the
:class:`LeaderboardError` raised when they are incomplete or inconsistent (cells missing or
damaged, or computed for different specs: see "One spec per table" in
:mod:`selbench.reporting.leaderboard`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selbench.store.results import ResultsDir, ResultsError

__all__ = ["LeaderboardError", "NotResultsError", "ResultSet", "load_results", "short_hash"]


class LeaderboardError(RuntimeError):
    """The results directory is incomplete or inconsistent."""


class NotResultsError(LeaderboardError, ResultsError):
    """The folder given is not a results directory at all (absent, or no ``run.json``): bad
    input (exit 2 on the command line), and still a :class:`LeaderboardError`."""


@dataclass
class ResultSet:
    """Cells of one or more results directories, checked and merged.

    ``cells`` are the cell records (as in the JSON files) with one extra key, ``_file``: the
    :class:`~pathlib.Path` of the cell file (its per-example ``.npz``, when the runner wrote
    one, sits next to it).
    """

    sources: list[dict[str, Any]]
    experiments: list[dict[str, Any]]
    cells: list[dict[str, Any]]
    seeds: list[int]
    mixed: list[str] = field(default_factory=list)  # spec hashes mixed in, when allowed
    left_out: int = 0  # cells of the specs that are missing (or foreign) and left out
    planned: int = 0  # cells the specs call for

    @property
    def spec_hashes(self) -> list[str]:
        hashes = [s["spec_hash"] for s in self.sources] + self.mixed
        return list(dict.fromkeys(hashes))


def short_hash(h: str | None) -> str:
    """A spec hash as the messages and the Markdown show it: its first 12 characters."""
    return (h or "unknown")[:12]


def _read_run(out_dir: Path) -> tuple[ResultsDir, dict]:
    """The results directory's store and its run.json (one clear error when it is none)."""
    store = ResultsDir(out_dir)
    if not out_dir.is_dir():
        raise NotResultsError(f"{out_dir}: no such folder; give a results directory written "
                              "by `selbench run`" if not out_dir.exists() else
                              f"{out_dir}: is a file, not a results directory")
    if not store.run_path.is_file():
        raise NotResultsError(f"{out_dir}: no run.json; is this a selbench results directory?")
    try:
        return store, store.read_run().model_dump(mode="json")
    except ResultsError as exc:
        raise LeaderboardError(str(exc)) from None


def _load_dir(
    out_dir: Path, allow_partial: bool, allow_mixed: bool, known: Mapping[str, Any] | None = None,
) -> tuple[dict, list[dict], list[str], int]:
    """run.json, the usable cells, the spec hashes of foreign cells taken in, cells left out.

    Cells are read through :class:`selbench.store.results.ResultsDir`, which verifies each
    record's checksum (and its arrays'): a damaged cell counts as missing, never as data.
    ``known`` maps absolute cell paths to the records this process has just written or
    verified there (the runner's): those are taken as they are, not read again.
    """
    store, run = _read_run(out_dir)
    current = run["provenance"].get("spec_hash")
    cells: list[dict] = []
    missing: list[str] = []
    damaged: list[str] = []
    foreign: list[tuple[str, dict]] = []
    for rel, key in zip(run["cells"], run["cell_keys"]):
        path = store.resolve(rel)
        held = known.get(os.path.abspath(path)) if known else None
        if held is not None and held.key == key:
            cells.append({**held.model_dump(mode="json"), "_file": path})
            continue
        check = store.check_cell(path, key)
        if check.record is not None:
            cells.append({**check.record.model_dump(mode="json"), "_file": path})
        elif check.previous is not None:
            foreign.append((rel, check.previous.model_dump(mode="json")))
        else:
            missing.append(rel)
            if check.problem != "missing":
                damaged.append(f"{rel} ({check.problem})")
    if foreign and not allow_mixed and not allow_partial:
        hashes = sorted({short_hash(r.get("spec_hash")) for _, r in foreign})
        raise LeaderboardError(
            f"{out_dir}: {len(foreign)} of {len(run['cells'])} cells under cells/ were written for "
            f"a different spec (spec hash {', '.join(hashes)}) than run.json's (spec hash "
            f"{short_hash(current)}), first: {foreign[0][0]}. Rerun `selbench run` with the spec to "
            "recompute them, pass --allow-mixed to tabulate them anyway (the outputs will say "
            "so), or --allow-partial to leave them out"
        )
    mixed_in: list[str] = []
    if foreign and allow_mixed:
        for rel, record in foreign:
            cells.append({**record, "_file": store.resolve(rel)})
            mixed_in.append(record.get("spec_hash") or "unknown")
    elif foreign:  # allow_partial: foreign cells are left out like missing ones
        missing.extend(rel for rel, _ in foreign)
    if missing and not allow_partial:
        detail = f"; damaged: {damaged[0]}" if damaged else ""
        raise LeaderboardError(
            f"{out_dir}: {len(missing)} of {len(run['cells'])} cells are missing or damaged "
            f"(first: {missing[0]}{detail}); run `selbench run` again to recompute them, or pass "
            "--allow-partial to tabulate the intact ones"
        )
    return run, cells, sorted(set(mixed_in)), len(missing)


def _cell_id(rec: dict) -> tuple:
    return (rec["experiment"], rec["method"], int(rec["seed"]), float(rec["train_beta"]))


def _check_one_spec(loaded: list[tuple]) -> None:
    """LeaderboardError when the directories loaded (``(dir, run, ...)``) were run with
    different specs."""
    hashes = {run["provenance"]["spec_hash"] for _, run, _, _, _ in loaded}
    if len(hashes) > 1:
        listing = ", ".join(f"{d} (spec hash {short_hash(run['provenance']['spec_hash'])})"
                            for d, run, _, _, _ in loaded)
        raise LeaderboardError(
            f"the results directories were run with different specs: {listing}. Pass "
            "--allow-mixed to combine them in one table anyway (the outputs will say so)"
        )


def _merge_experiments(spec_experiments: list[dict], by_name: dict[str, dict],
                       experiments: list[dict]) -> None:
    """Add one directory's experiments to ``experiments`` (``by_name`` indexes them): a new
    one as a copy, a known one's methods extended with those it lacks."""
    for exp in spec_experiments:
        if exp["name"] not in by_name:
            exp = json.loads(json.dumps(exp))  # a copy we may extend
            by_name[exp["name"]] = exp
            experiments.append(exp)
        else:
            known = {m["label"] for m in by_name[exp["name"]]["methods"]}
            by_name[exp["name"]]["methods"] += [m for m in exp["methods"] if m["label"] not in known]


def _merge_cells(dir_cells: list[dict], seen: dict[tuple, tuple[str, Path]],
                 cells: list[dict]) -> None:
    """Add one directory's cells to ``cells`` (``seen``: the key and file of each cell taken,
    by :func:`_cell_id`): a cell found twice with the same key once, with different keys a
    LeaderboardError."""
    for rec in dir_cells:
        ident = _cell_id(rec)
        if ident in seen:
            if seen[ident][0] == rec.get("key"):
                continue  # the very same computation, found twice
            raise LeaderboardError(
                f"{seen[ident][1]} and {rec['_file']} hold different results for experiment "
                f"{ident[0]!r}, method {ident[1]!r}, seed {ident[2]}, training β {ident[3]:g} "
                "(their content keys differ); leave one of the directories out"
            )
        seen[ident] = (rec.get("key"), rec["_file"])
        cells.append(rec)


def load_results(
    results_dirs: str | Path | Sequence[str | Path],
    *,
    allow_partial: bool = False,
    allow_mixed: bool = False,
    known: Mapping[str, Any] | None = None,
) -> ResultSet:
    """Load and check the cells of one or more results directories (``known``: records this
    process holds already, by absolute cell path; see :func:`_load_dir`).

    Raises :class:`LeaderboardError` when cells are missing (unless ``allow_partial``), when
    cells or directories of different spec hashes would be combined (unless
    ``allow_mixed``), and when two directories hold different results for the same
    experiment, method, seed and training β (always: which one to show is ambiguous).
    """
    dirs = [Path(results_dirs)] if isinstance(results_dirs, (str, Path)) else [Path(d) for d in results_dirs]
    if not dirs:
        raise LeaderboardError("no results directory given")
    loaded = [(d, *_load_dir(d, allow_partial, allow_mixed, known)) for d in dirs]
    if not allow_mixed:
        _check_one_spec(loaded)
    sources, experiments, cells, seeds, mixed = [], [], [], [], []
    by_name: dict[str, dict] = {}
    seen: dict[tuple, tuple[str, Path]] = {}
    left_out = sum(n for *_, n in loaded)
    planned = sum(len(run["cells"]) for _, run, *_ in loaded)
    for d, run, dir_cells, mixed_in, _ in loaded:
        prov = run["provenance"]
        sources.append({"dir": str(d), "spec_name": prov["spec_name"],
                        "spec_hash": prov["spec_hash"], "provenance": prov, "spec": run["spec"]})
        mixed.extend(mixed_in)
        for s in prov["seeds"]:
            if s not in seeds:
                seeds.append(s)
        _merge_experiments(run["spec"]["experiments"], by_name, experiments)
        _merge_cells(dir_cells, seen, cells)
    for rec in cells:
        if rec["seed"] not in seeds:
            seeds.append(rec["seed"])
    mixed = sorted(set(mixed))
    return ResultSet(sources, experiments, cells, seeds, mixed, left_out, planned)
