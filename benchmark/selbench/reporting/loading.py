"""The results folders a leaderboard or the figures are built from: their cells read,
checked and merged into one :class:`ResultSet` (:func:`load_results`), and the
:class:`LeaderboardError` raised when they are incomplete or inconsistent (cells missing or
damaged, or computed for different specs: see "One spec per table" in
:mod:`selbench.reporting.leaderboard`).
"""

from __future__ import annotations

import json
import os
import warnings
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


def _folder_names(dirs: Sequence[Path]) -> list[str]:
    """How messages and kept-apart labels name each directory: its name, or its whole path
    when two share a name."""
    names = [d.name or str(d) for d in dirs]
    return names if len(set(names)) == len(names) else [str(d) for d in dirs]


def _signature(cells: list[dict], exp: str, label: str | None) -> str | None:
    """What must agree for two directories' cells to share a table (``label`` None: the
    experiment's settings and backbone outputs) or a row (the method's parameters and
    tuning); None when their records do not say (no cell, or records before keys)."""
    sigs = set()
    for rec in cells:
        comp = rec.get("components") or {}
        if rec["experiment"] != exp or (label is not None and rec["method"] != label):
            continue
        part = comp.get("experiment") if label is None else (
            {"method": comp["method"], "tuning": comp.get("tuning")} if "method" in comp
            else None)
        if part is not None:
            sigs.add(json.dumps(part, sort_keys=True))
    return min(sigs) if sigs else None


def _place(groups: list[tuple[str | None, str]], sig: str | None, folder: str) -> str | None:
    """The suffix of a directory's experiment or method among the variants seen so far
    (``groups``: signature and folder of each): None for the first variant (or when the
    records do not say), the folder of the first directory with that variant otherwise."""
    if sig is None or not groups:
        if not groups:
            groups.append((sig, folder))
        return None
    for i, (known, owner) in enumerate(groups):
        if known is None or known == sig:
            return None if i == 0 else owner
    groups.append((sig, folder))
    return folder


def _rename(loaded_dir: tuple, renames: dict[tuple[str, str | None], str]) -> tuple:
    """A loaded directory with experiments (``(name, None)``) and methods (``(experiment,
    label)``) renamed: its run.json's spec copied, its cells copied."""
    d, run, cells, mixed_in, n_missing = loaded_dir
    if not renames:
        return loaded_dir
    exps = []
    for exp in run["spec"]["experiments"]:
        new = json.loads(json.dumps(exp))
        new["name"] = renames.get((exp["name"], None), exp["name"])
        for m in new["methods"]:
            m["label"] = renames.get((exp["name"], m["label"]), m["label"])
        exps.append(new)
    run = {**run, "spec": {**run["spec"], "experiments": exps}}
    cells = [{**rec, "experiment": renames.get((rec["experiment"], None), rec["experiment"]),
              "method": renames.get((rec["experiment"], rec["method"]), rec["method"])}
             for rec in cells]
    return d, run, cells, mixed_in, n_missing


def _keep_apart(loaded: list[tuple], allow_mixed: bool) -> list[tuple]:
    """Directories combined in one table: an experiment whose settings or backbone outputs
    differ from the same-named experiment of an earlier directory becomes ``"name
    (folder)"``, and a method whose parameters or tuning differ from the same-labelled
    method's becomes ``"label (folder)"``, each with a warning (a row is one configuration:
    its mean and spread over seeds mean nothing across two). Same-labelled methods of the
    same configuration share a row; under ``allow_mixed``, where the directories' specs
    differ, a warning names what each directory adds to it."""
    folders = _folder_names([d for d, *_ in loaded])
    exp_groups: dict[str, list] = {}
    row_groups: dict[tuple[str, str], list] = {}
    parts: dict[tuple[str, str], list[tuple[str, str, list[int]]]] = {}
    out = []
    for (d, run, cells, *_rest), folder in zip(loaded, folders):
        renames: dict[tuple[str, str | None], str] = {}
        for exp in run["spec"]["experiments"]:
            name = exp["name"]
            suffix = _place(exp_groups.setdefault(name, []), _signature(cells, name, None),
                            folder)
            new_name = name if suffix is None else f"{name} ({suffix})"
            if suffix is not None:
                renames[(name, None)] = new_name
                first = exp_groups[name][0][1]
                warnings.warn(f"experiment {name!r} of {folder} differs from {first}'s (its "
                              f"settings or backbone outputs); kept apart as {new_name!r}",
                              UserWarning, stacklevel=3)
            for m in exp["methods"]:
                label = m["label"]
                suffix = _place(row_groups.setdefault((new_name, label), []),
                                _signature(cells, name, label), folder)
                new_label = label if suffix is None else f"{label} ({suffix})"
                if suffix is not None:
                    renames[(name, label)] = new_label
                    first = row_groups[new_name, label][0][1]
                    warnings.warn(f"experiment {new_name!r}: method {label!r} of {folder} "
                                  f"differs from {first}'s (its parameters or tuning); kept "
                                  f"apart as {new_label!r}", UserWarning, stacklevel=3)
                seeds = sorted({int(c["seed"]) for c in cells
                                if c["experiment"] == name and c["method"] == label})
                parts.setdefault((new_name, new_label), []).append(
                    (folder, run["provenance"]["spec_hash"], seeds))
        out.append(_rename((d, run, cells, *_rest), renames))
    for (exp, label), where in parts.items():
        if allow_mixed and len(where) > 1 and len({h for _, h, _ in where}) > 1:
            listing = " and ".join(f"{f} (seeds {', '.join(map(str, s)) or 'none'})"
                                   for f, _, s in where)
            warnings.warn(f"experiment {exp!r}: method {label!r} merges the cells of {listing}, "
                          "computed with the same parameters by different specs",
                          UserWarning, stacklevel=3)
    return out


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
    if len(loaded) > 1:
        loaded = _keep_apart(loaded, allow_mixed)
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
