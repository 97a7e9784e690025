"""Run every benchmark (what ``tox -e perf`` runs) and print a summary of the targets.

    python perf/run_all.py            # default sizes: a few minutes on 2 CPU cores
    python perf/run_all.py --full     # the paper's sizes (about an hour on 2 CPU cores)
    python perf/run_all.py --device cuda
    python perf/run_all.py --only training ece
    python perf/run_all.py --only scale      # inline vs local --workers 2

Each benchmark measures selbench and its baseline side by side in the same run. Missed
targets are reported, not failed: the exit status is non-zero only when a benchmark errors.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

import bench_ece
import bench_paper
import bench_peers
import bench_scale
import bench_selectors
import bench_temperature
import bench_training
import bench_tuning

BENCHMARKS = {"training": bench_training, "ece": bench_ece, "temperature": bench_temperature,
              "paper": bench_paper, "scale": bench_scale, "peers": bench_peers,
              "selectors": bench_selectors, "tuning": bench_tuning}
#: benchmarks without --full / --device options (CPU-only, fixed sizes)
FIXED = ("ece", "temperature", "peers", "selectors")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="the paper's sizes")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--only", nargs="+", choices=list(BENCHMARKS), help="run only these")
    args = ap.parse_args(argv)
    summary: list[str] = []
    failed: list[str] = []
    for name, module in BENCHMARKS.items():
        if args.only and name not in args.only:
            continue
        flags = ["--full"] if args.full and name not in FIXED else []
        if name not in FIXED:
            flags += ["--device", args.device]
        t0 = time.perf_counter()
        try:
            summary += module.main(flags)
        except (Exception, SystemExit):  # report (a value mismatch too) and go on
            traceback.print_exc()
            failed.append(name)
        print(f"[{name}: {time.perf_counter() - t0:.0f} s]")
    print("\n== targets " + "=" * 69)
    for line in summary:
        print(line)
    for name in failed:
        print(f"  {name}: ERROR (see above)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
