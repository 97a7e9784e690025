"""Where the arena's time goes: ``specs/arena.yaml`` (or a slice of it) run as a user runs it,
its wall time, and the seconds its cells recorded, by phase and by family of experiments.

The cells record what each of them cost (``timing.fit_s``: its share of the fit of the cells
fitted together as replicas; ``timing.eval_s``: scoring and measuring it, bootstrap
intervals included; ``tuning.tune_s``: its tuning trials), so the phases are

* **tuning trials**: the tuned cells' trials (inner fits and held-out scoring);
* **refit**: the tuned cells' fit of the chosen parameters on all fitting rows;
* **fit (untuned)**: every other cell's fit;
* **evaluation**: scoring the evaluation split, the metrics at every β and their
  bootstrap intervals;
* outside the cells (wall only): start-up, the backbones' outputs (read from the cache
  after the first run: text encoding is cached by content), the leaderboard, the
  statistics (the hierarchical model's Stan sampling included) and the figures.

With ``--executor local --workers N`` the cells' seconds add up to about N times the wall
time of the cells phase; the ratio is printed. ``--results DIR`` reads a finished results
folder instead of running (no wall time then).

    python perf/bench_arena.py                          # the whole arena, as committed
    python perf/bench_arena.py --experiments text-yelp-amazon-linear digits-rotation \
        --seeds 0 1                                      # a slice
    python perf/bench_arena.py --results leaderboards/arena
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import yaml
from common import machine, rule

REPO = Path(__file__).resolve().parents[1]


def family(experiment: str) -> str:
    """The arena's families of experiments: text, digits, cifar (by the name's head)."""
    head = experiment.split("-", 1)[0]
    return "cifar" if head.startswith("cifar") else head


def phases(results: Path) -> tuple[dict[str, float], dict[str, dict[str, float]], int, list]:
    """Seconds by phase over every cell of ``results``, the same by family, the number of
    cells, and the cell files' modification times (to bound the cells phase's wall)."""
    total: dict[str, float] = defaultdict(float)
    by_family: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    stamps, n = [], 0
    for path in sorted((results / "cells").glob("*/*/seed*.json")):
        rec = json.loads(path.read_text())
        timing, tuning = rec.get("timing") or {}, rec.get("tuning") or {}
        tuned = bool(tuning)
        parts = {"tuning trials": float(tuning.get("tune_s", 0.0)) if tuned else 0.0,
                 "refit" if tuned else "fit (untuned)": float(timing.get("fit_s", 0.0)),
                 "evaluation": float(timing.get("eval_s", 0.0))}
        for name, seconds in parts.items():
            total[name] += seconds
            by_family[family(rec["experiment"])][name] += seconds
        stamps.append(path.stat().st_mtime)
        n += 1
    return dict(total), {k: dict(v) for k, v in by_family.items()}, n, stamps


def slice_spec(spec: Path, experiments: list[str] | None, seeds: list[int] | None,
               folder: Path) -> Path:
    """``spec`` cut to ``experiments`` and ``seeds`` (its questions dropped when cut: they
    need every experiment), written into ``folder`` with relative data paths made absolute."""
    data = yaml.safe_load(spec.read_text())
    if not experiments and not seeds:
        return spec
    if experiments:
        names = [e["name"] for e in data["experiments"]]
        missing = sorted(set(experiments) - set(names))
        if missing:
            sys.exit(f"--experiments: {', '.join(missing)} not in {spec} ({', '.join(names)})")
        data["experiments"] = [e for e in data["experiments"] if e["name"] in experiments]
        data.pop("questions", None)
    if seeds:
        data["seeds"] = seeds
    for exp in data["experiments"]:
        params = exp.get("dataset", {}).get("params", {})
        for key in ("folder", "path"):
            if isinstance(params.get(key), str) and not os.path.isabs(params[key]):
                params[key] = str((spec.parent / params[key]).resolve())
    out = folder / spec.name
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def run(spec: Path, out: Path, executor: str, workers: int, plots: bool) -> float:
    cmd = [sys.executable, "-m", "selbench", "run", str(spec), "--out", str(out),
           "--no-progress", "-q", "--executor", executor]
    if executor == "local":
        cmd += ["--workers", str(workers)]
    if not plots:
        cmd.append("--no-plots")
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"selbench run exited {proc.returncode}")
    return t0


def report(results: Path, started: float | None, finished: float | None) -> None:
    total, by_family, n, stamps = phases(results)
    cells = sum(total.values())
    order = ["tuning trials", "refit", "fit (untuned)", "evaluation"]
    rule("phases (seconds the cells recorded)")
    print(f"{n} cells; their recorded seconds: {cells:.0f} s ({cells / 60:.1f} min)")
    print(f"{'phase':<16}{'seconds':>10}{'share':>8}   " +
          "".join(f"{f:>10}" for f in sorted(by_family)))
    for name in order:
        s = total.get(name, 0.0)
        print(f"{name:<16}{s:>10.0f}{s / max(cells, 1e-9):>8.0%}   " +
              "".join(f"{by_family[f].get(name, 0.0):>10.0f}" for f in sorted(by_family)))
    if started is None or not stamps:
        return
    wall = finished - started
    cells_wall = max(stamps) - started
    rule("wall")
    print(f"wall {wall:.0f} s ({wall / 60:.1f} min): until the last cell was written "
          f"{cells_wall:.0f} s, after it (leaderboard, statistics, figures) "
          f"{finished - max(stamps):.0f} s")
    print(f"cells' seconds / cells phase wall: {cells / max(cells_wall, 1e-9):.2f} "
          "(about the number of busy workers when the machine gives them their cores)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", type=Path, default=REPO / "specs" / "arena.yaml")
    ap.add_argument("--experiments", nargs="+", help="run only these experiments")
    ap.add_argument("--seeds", nargs="+", type=int, help="run only these seeds")
    ap.add_argument("--executor", default="local", choices=["inline", "local"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--plots", action="store_true", help="draw the figures too")
    ap.add_argument("--out", type=Path, help="results folder (default: a fresh temporary one)")
    ap.add_argument("--results", type=Path, help="only read this finished results folder")
    args = ap.parse_args()
    print(machine("cpu"))
    if args.results:
        report(args.results, None, None)
        return
    with tempfile.TemporaryDirectory(prefix="bench_arena_") as tmp:
        spec = slice_spec(args.spec.resolve(), args.experiments, args.seeds, Path(tmp))
        out = args.out or Path(tmp) / "results"
        load = os.getloadavg()[0]
        started = run(spec, out, args.executor, args.workers, args.plots)
        finished = time.time()
        print(f"{spec.name}: {args.executor}"
              + (f", {args.workers} workers" if args.executor == "local" else "")
              + f"; load average at the start {load:.1f}, at the end {os.getloadavg()[0]:.1f}")
        report(out, started, finished)


if __name__ == "__main__":
    main()
