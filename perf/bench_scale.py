"""Scale-out: the method stage of ``specs/paper.yaml`` with ``--executor inline`` and with
``--executor local --workers N``, side by side.

The paper's method stage is set up as in ``bench_paper.py``: synthetic model outputs of the
paper's shapes are written into a fresh output cache under the keys the runner computes for
``specs/paper.yaml`` (not timed), then ``selbench.execution.runner.run`` runs the spec twice on that
cache, into two results directories: every cell in one process (``inline``), then as one job
per method on a pool of ``--workers`` processes (``local``; worker start-up included). Both
leaderboards must be byte-identical (the benchmark errors otherwise); the speed-up is
inline wall time / local wall time.

Defaults shorten the run like ``bench_paper.py`` (``--epoch-divisor`` 20, ``--max-split``
12,000); ``--full`` runs the paper's sizes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_paper import SHAPES, fill_cache, paper_spec, placeholder_inputs
from common import machine, resolve_device, rule, target
from selbench.execution import runner
from selbench.spec import load_spec


def main(argv: list[str] | None = None) -> list[str]:
    args = parser().parse_args(argv)
    device = resolve_device(args.device)
    divisor = 1 if args.full else args.epoch_divisor
    max_split = None if args.full else args.max_split

    rule(f"method stage of specs/paper.yaml: inline vs local --workers {args.workers}")
    print(machine(device))
    print("epochs: the paper's" if divisor == 1 else f"epochs: the paper's / {divisor}",
          "; splits:", "the paper's sizes" if not max_split else f"at most {max_split:,}")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="selbench-"))
    try:
        raw = paper_spec(divisor)
        # the paper's four experiments (those bench_paper.py has synthetic shapes for)
        keep = args.experiments or list(SHAPES)
        raw["experiments"] = [e for e in raw["experiments"] if e["name"] in keep]
        raw = placeholder_inputs(raw, work)
        if args.seeds:
            raw["seeds"] = raw.get("seeds", [0])[: args.seeds]
        t0 = time.perf_counter()
        fill_cache(raw, work / "cache", max_split)
        print(f"synthetic outputs cached in {time.perf_counter() - t0:.1f} s (not timed below)")
        walls, cells, load, threads = run_executors(raw, work, device, args.workers)
        same = all((work / f"results-{row}" / f).read_bytes()
                   == (work / "results-inline" / f).read_bytes()
                   for row in ("inline1", "local") for f in ("leaderboard.md", "leaderboard.csv"))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    if not same:
        raise SystemExit("bench_scale: the local executor's leaderboard differs from inline")
    speedup = walls["inline"] / walls["local"]
    print(f"{cells} cells; {os.cpu_count()} CPU cores; load average before the runs "
          f"{load:.1f}")
    print(f"{'executor':42s} {'wall s':>8s} {'speed-up':>9s}")
    print(f"{f'inline ({threads} torch threads)':42s} {walls['inline']:8.1f} {1.0:9.2f}")
    print(f"{'inline (1 torch thread)':42s} {walls['inline1']:8.1f} "
          f"{walls['inline'] / walls['inline1']:9.2f}")
    print(f"{f'local --workers {args.workers} (worker start-up incl.)':42s} "
          f"{walls['local']:8.1f} {speedup:9.2f}")
    print("leaderboards byte-identical: yes (all three)")
    ideal = min(args.workers, os.cpu_count() or 1)
    best = min(walls["inline"], walls["inline1"]) / walls["local"]
    return [target(f"local --workers {args.workers} speed-up over the faster inline run",
                   best >= 0.6 * ideal,
                   f"{best:.2f}x (>= {0.6 * ideal:.1f}x, 60% of {ideal} cores)")]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--full", action="store_true", help="the paper's epochs and split sizes")
    ap.add_argument("--epoch-divisor", type=int, default=20)
    ap.add_argument("--max-split", type=int, default=12_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=None,
                    help="use only the first N seeds of the spec (default: all)")
    ap.add_argument("--experiments", nargs="+", choices=list(SHAPES), default=None,
                    help="run only these experiments of the spec (default: all four)")
    ap.add_argument("--workdir", help="keep the cache and results here (default: a temp dir)")
    return ap


def run_executors(raw: dict, work: Path, device: torch.device, workers: int
                  ) -> tuple[dict[str, float], int, float, int]:
    """Run the spec on the cache in ``work`` inline (torch's threads, then one thread) and
    with the local executor, each into ``work / results-<row>``: the wall times by row, the
    cells computed, the load average before the runs and torch's thread count."""
    walls: dict[str, float] = {}
    load = os.getloadavg()[0]
    cells = 0
    threads = torch.get_num_threads()
    runs = (("inline", "inline", {}, threads), ("inline1", "inline", {}, 1),
            ("local", "local", {"workers": workers}, threads))
    for row, name, kwargs, n_threads in runs:
        out = work / f"results-{row}"
        torch.set_num_threads(n_threads)
        try:
            t0 = time.perf_counter()
            report = runner.run(load_spec(raw), out_dir=out, device=device.type,
                                cache_dir=work / "cache", progress=False, plots=False,
                                executor=name, **kwargs)
            walls[row] = time.perf_counter() - t0
        finally:
            torch.set_num_threads(threads)
        cells = report.computed
    return walls, cells, load, threads


if __name__ == "__main__":
    main(sys.argv[1:])
