"""Batched training's threads under load: the engine's own choice against fixed counts.

A tuning batch's workload — the joint scheme (MLP selector + temperature, S-TLBCE, λ = 8)
fitted as one model of ``--replicas`` replicas on 500 rows of 64 features — is timed in
fresh subprocesses with

* ``SELBENCH_TRAIN_THREADS=1`` (the baseline: the robust choice when cores are shared),
* ``SELBENCH_TRAIN_THREADS=<all>`` (the engine's choice before: every torch thread),
* the variable unset (the engine's choice now: every thread unless the CPU is
  oversubscribed, then one; :func:`selbench.training.torchutils.batched_threads`),

while ``--load N`` busy processes (pure Python loops, ended with the benchmark) hold the
cores, after ``--settle`` seconds so that the kernel's CPU pressure has seen them. It prints
each setting's wall time (best of ``--repeats``) as a ratio to the one-thread baseline of
the same run, with the load average and the CPU pressure measured at the start.

    python perf/bench_threads.py --load 4     # at load ~4 on two cores
    python perf/bench_threads.py --load 0     # idle: all threads should win
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from common import machine, rule

CHILD = r"""
import json, sys, time
import numpy as np, torch
from selbench import FitContext, ModelOutputs
from selbench.contract.api import FitJob
from selbench.contract.registry import get_registry

replicas, epochs = int(sys.argv[1]), int(sys.argv[2])
reg = get_registry()
def build(kind, name, params=None):
    return reg.get(kind, name).build(params)
rng = np.random.default_rng(0)
x = rng.normal(size=(500, 64)).astype(np.float32)
z = (x[:, :10] * 0.8).astype(np.float32)
labels = rng.integers(0, 10, 500)
out = ModelOutputs(features=x, logits=2 * z, labels=labels)
jobs = [FitJob(out, build("selector", "mlp", {"hidden": [64]}), build("recalibrator", "temperature"),
               build("loss", "s-tlbce"), build("loss", "quadratic", {"lam": 8.0}),
               FitContext(seed=i, beta=0.5)) for i in range(replicas)]
scheme = build("scheme", "joint", {"epochs": epochs, "batch_size": 128, "lr": 1e-3})
t0 = time.perf_counter()
scheme.fit_many(jobs)
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def pressure() -> str:
    from selbench.training.torchutils import cpu_pressure

    p = cpu_pressure()
    return "not reported" if p is None else f"{p:.0f} %"


def run_child(threads: str | None, replicas: int, epochs: int) -> float:
    env = dict(os.environ)
    env.pop("SELBENCH_TRAIN_THREADS", None)
    if threads is not None:
        env["SELBENCH_TRAIN_THREADS"] = threads
    out = subprocess.run([sys.executable, "-c", CHILD, str(replicas), str(epochs)], env=env,
                         capture_output=True, text=True, check=True, timeout=1800)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", type=int, default=4, help="busy processes to start (default 4)")
    ap.add_argument("--settle", type=float, default=12.0, help="seconds before measuring")
    ap.add_argument("--replicas", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    import torch

    every = str(torch.get_num_threads())
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(args.load)]
    try:
        time.sleep(args.settle if burners else 0)
        rule(f"batched training under load: {args.load} busy processes")
        print(machine("cpu"))
        print(f"load average {os.getloadavg()[0]:.1f}; CPU pressure (PSI some avg10) "
              f"{pressure()}; {args.replicas} replicas x {args.epochs} epochs")
        settings = [("1 thread (baseline)", "1"), (f"{every} threads (before)", every),
                    ("engine's choice (now)", None)]
        times = {}
        for label, threads in settings:
            times[label] = min(run_child(threads, args.replicas, args.epochs)
                               for _ in range(args.repeats))
        base = times[settings[0][0]]
        for label, seconds in times.items():
            print(f"  {label:<24} {seconds:7.2f} s   {seconds / base:5.2f}x the baseline")
    finally:
        for b in burners:
            b.kill()
            b.wait()


if __name__ == "__main__":
    main()
