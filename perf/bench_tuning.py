"""Tuning at the cost of training: a trained method's tuning trials against one untuned fit.

On the digits experiment of ``specs/tuned.yaml`` (dataset ``digits`` + backbone
``digits-net``, fitting split ``val``, ``n_fit`` 500, training β 0.5) for one trained method
with the spec's search space (learning rate, epochs {50, 100, 200, 400}, input noise,
coverage λ):

* untuned fit: the method's estimator fitted on the cell's 500 fitting rows (the best of
  the fits taken before each timed tuning: ``--repeats`` per path, alternated with its
  tunings, so the fits and the tunings see the same moments of a machine whose speed
  drifts);
* tuning: :func:`selbench.execution.tuning.tune_cell` as the runner calls it (``--trials``
  trials, inner 0.3, ``--sampler``, a new journal), each trial fitted on 350 rows and scored
  on 150: selbench's batched trials (a batch's trials trained as one model, one replica per
  trial) — and, in a subprocess, the previous sequential procedure (one ``fit`` and one
  ``evaluate`` per trial) of an older checkout given by ``--old`` (a ``git worktree`` of
  a863274, the commit before the batched trials), in the same run.

It prints each path's ratio tuning / untuned fit against the target (≤ 5× on a CPU, ≤ 1.5×
on a GPU), and checks that the trials that do not depend on the batches (random search,
and TPE's random start) have the previous procedure's parameters. Beside the seconds it
prints the training engine's steps of each (:class:`EngineSteps`: the model's mini-batch
steps whatever its replicas, and replica-steps), which do not drift with the machine.

Multi-fidelity tuning (issue 37): the same trials with ``tuning.pruner`` (Optuna's
successive-halving pruner, ``--min-epochs`` and ``--reduction-factor``; the losing replicas
dropped from the batch's model) are timed in the same run, their ratio printed beside the
unpruned one. ``--quality`` instead runs the pruned and the unpruned study of every trained
method on ``--seeds`` seeds (20 by default) and prints the chosen configurations' held-out
ECE₁ (the study's best value) and evaluation ECE₁ (the chosen configuration refitted on the
cell's fitting rows, at the training β on the evaluation split), the paired difference
pruned − unpruned with its standard error and a 95% t interval, and the pruned studies'
engine steps against an untuned fit's (mean and worst seed).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import machine, resolve_device, rule, target

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "specs" / "tuned.yaml"
EXPERIMENT = "digits-shift"
#: the targets of issue 28, item 3: tuning trials / one untuned fit
TARGET = {"cpu": 5.0, "cuda": 1.5}


def load() -> float:
    return os.getloadavg()[0]


def cell(method: str, seed: int, device: str, cache: str) -> dict:
    """The digits cell of ``method`` and ``seed``: its fitting and evaluation rows, method
    parameters, search space, tuning block and ``make(chosen)``."""
    from selbench.execution.extraction import experiment_outputs
    from selbench.execution.keys import identify, method_params, output_keys
    from selbench.execution.tuning import with_params
    from selbench.library.estimator import SelectiveRecalibrator
    from selbench.measure.evaluate import fit_indices
    from selbench.spec import load_spec
    from selbench.spec.search import method_space
    from selbench.store.cache import OutputCache

    resolved = load_spec(SPEC)
    e_i = next(i for i, e in enumerate(resolved.spec.experiments) if e.name == EXPERIMENT)
    exp = resolved.spec.experiments[e_i]
    store = OutputCache(cache)
    keys = output_keys(resolved, identify(resolved, store), e_i)
    outputs = experiment_outputs(resolved, e_i, keys, store, device, False)
    spec_method = next(m for m in exp.methods if m.label == method)
    params = method_params(resolved, spec_method)
    fit_all = outputs[exp.fit_split]
    fitting = fit_all.subset(fit_indices(len(fit_all), exp.n_fit, seed, "n_fit"))
    beta = float(exp.train_beta)

    def make(chosen: dict) -> SelectiveRecalibrator:
        return SelectiveRecalibrator(**with_params(params, chosen), beta=beta, seed=seed,
                                     device=device)

    return {"make": make, "fitting": fitting, "evaluation": outputs[exp.eval_split],
            "params": params, "space": method_space(resolved.registry, spec_method),
            "tuning": exp.tuning, "beta": beta}


def tune(c: dict, method: str, seed: int, trials: int, sampler: str, pruner: Any) -> dict:
    """``tune_cell`` of the cell ``c`` (a new journal; ``pruner``: a PrunerSpec or None)."""
    from selbench.execution.tuning import TuningRequest, tune_cell

    tuning = c["tuning"].model_copy(update={"trials": trials, "sampler": sampler,
                                            "pruner": pruner})
    with tempfile.TemporaryDirectory() as tmp:
        return tune_cell(TuningRequest(
            params=c["params"], space=c["space"], tuning=tuning, fitting=c["fitting"],
            make=c["make"], seed=seed, method_key=method, beta=c["beta"],
            journal=Path(tmp) / "seed.journal", study="bench"))


def pruner_of(args: argparse.Namespace) -> Any:
    from selbench.spec.model import PrunerSpec

    return PrunerSpec(name="successive-halving", min_epochs=args.min_epochs,
                      reduction_factor=args.reduction_factor)


class EngineSteps:
    """The training engine's work, counted where the built-in schemes and the MLP recalibrator
    call it (``train_replicas``): ``steps``, the mini-batch steps of the model whatever its
    replicas (each call trains ``epochs × ⌈rows / batch_size⌉``), and ``replica_steps``,
    those times the replicas trained. Deterministic, unlike seconds: on this machine a step
    costs about 0.95 ms plus 0.1 ms a replica for the digits experiment's methods (S-MMCE
    joint, seed 0, one thread, 2026-12-02), so the steps of a study against those of an
    untuned fit are the timed ratio without the machine's drift (up to 1.6× within a run)."""

    MODULES = ("selbench_plugins.schemes.training", "selbench_plugins.recalibrators.mlp")

    def __init__(self) -> None:
        import importlib

        self.steps = self.replica_steps = 0
        for name in self.MODULES:
            module = importlib.import_module(name)
            real = module.train_replicas

            def counting(job: Any, resume: Any = None, real: Any = real) -> Any:
                rows = int(next(iter(job.data.tables.values())).shape[1])
                epochs = job.hyper.epochs
                epochs = epochs if isinstance(epochs, int) else max(epochs)
                steps = int(epochs) * -(-rows // int(job.schedule.batch_size))
                self.steps += steps
                self.replica_steps += steps * len(job.data.seeds)
                return real(job, resume)

            module.train_replicas = counting

    def of(self, fn: Any) -> tuple[Any, tuple[int, int]]:
        """``fn()`` and the (steps, replica-steps) it trained."""
        before = (self.steps, self.replica_steps)
        value = fn()
        return value, (self.steps - before[0], self.replica_steps - before[1])


@functools.cache
def engine_steps() -> EngineSteps:
    """The process's one :class:`EngineSteps`: it wraps the engine where it is called, so a
    second one would wrap the first's wrapper (each ``--full`` method measured once more)."""
    return EngineSteps()


def timed(fn: Any, repeats: int) -> tuple[float, float, Any]:
    """(fastest wall seconds, fastest process CPU seconds, the last value) of ``repeats``
    calls of ``fn``: the tuning is timed as the untuned fit is (the best of ``--repeats``;
    a study is deterministic, so each call computes the same)."""
    wall, cpu, value = float("inf"), float("inf"), None
    for _ in range(max(1, repeats)):
        t0, c0 = time.perf_counter(), time.process_time()
        value = fn()
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu, value


def measure(method: str, trials: int, seed: int, sampler: str, device: str, repeats: int,
            cache: str, threads: int = 0, pruner: Any = None) -> dict:
    """One untuned fit and one tuning of ``method`` with the selbench on ``sys.path``
    (the best wall and process CPU seconds of ``repeats`` each; ``threads``: torch's, 0 for
    its default), and with ``pruner`` the pruned tuning too (``pruned_s``, ``pruned_cpu``,
    ``pruned_history``)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    c = cell(method, seed, device, cache)
    make, fitting = c["make"], c["fitting"]
    make({}).fit(fitting)  # warm-up (first-call costs)
    counter = engine_steps() if "pruner" in type(c["tuning"]).model_fields else None
    steps: dict[str, tuple[int, int]] = {}

    def counted(label: str, fn: Any) -> Any:
        """``fn``, its engine steps kept under ``label`` (not with an older checkout)."""
        if counter is None:
            return fn

        def run() -> Any:
            value, steps[label] = counter.of(fn)
            return value
        return run
    fits: list[tuple[float, float]] = []

    def fit_then(fn: Any) -> Any:
        """An untuned fit (its wall and CPU seconds kept), then ``fn``, timed: the machine's
        speed drifts by up to 1.6x within a run (measured 2026-12-02: the same fit took
        0.47 and 0.76 s a few minutes apart), so the fits are taken beside the tunings,
        the best of all of them counting, instead of all before."""
        t0, c0 = time.perf_counter(), time.process_time()
        counted("untuned", lambda: make({}).fit(fitting))()
        fits.append((time.perf_counter() - t0, time.process_time() - c0))
        return timed(fn, 1)

    def alternated(fn: Any) -> tuple[float, float, Any]:
        runs = [fit_then(fn) for _ in range(max(1, repeats))]
        return min(r[0] for r in runs), min(r[1] for r in runs), runs[-1][2]

    load_before = load()
    if "pruner" in type(c["tuning"]).model_fields:
        tune_s, tune_cpu, info = alternated(counted("unpruned", lambda: tune(
            c, method, seed, trials, sampler, None)))
    else:  # an older checkout (--old): no pruner, the keyword call of its tune_cell
        tune_s, tune_cpu, info = alternated(lambda: _old_tune(c, method, seed, trials,
                                                              sampler))
    out = {"tune_s": tune_s, "tune_cpu": tune_cpu, "history": info["history"],
           "threads": torch.get_num_threads()}
    if pruner is not None:
        wall, cpu, pruned = alternated(counted("pruned", lambda: tune(
            c, method, seed, trials, sampler, pruner)))
        out.update(pruned_s=wall, pruned_cpu=cpu, pruned_history=pruned["history"])
        # the floor of any study that finds it: the chosen configuration trained alone on
        # the trials' rows (the inner part), as many epochs as the study trained it
        from selbench.execution.tuning import inner_split

        inner, _ = inner_split(len(fitting), c["tuning"].inner, seed)
        rows = fitting.subset(inner)
        chosen = pruned["chosen"]
        out["chosen_s"] = alternated(lambda: make(chosen).fit(rows))[0]
    out.update(steps=steps, untuned_s=min(f[0] for f in fits),
               untuned_cpu=min(f[1] for f in fits),
               untuned_spread=[min(f[0] for f in fits), max(f[0] for f in fits)],
               load=[load_before, load()])
    return out


def _old_tune(c: dict, method: str, seed: int, trials: int, sampler: str) -> dict:
    from selbench.execution.tuning import tune_cell

    tuning = c["tuning"].model_copy(update={"trials": trials, "sampler": sampler})
    with tempfile.TemporaryDirectory() as tmp:
        return tune_cell(params=c["params"], space=c["space"], tuning=tuning,
                         fitting=c["fitting"], make=c["make"], seed=seed, method_key=method,
                         beta=c["beta"], journal=Path(tmp) / "seed.journal", study="bench")


def old_path(args: argparse.Namespace) -> dict | None:
    """:func:`measure` with the checkout ``--old`` in a subprocess (None without one)."""
    old = Path(args.old) if args.old else None
    if old is None or not (old / "benchmark" / "selbench").is_dir():
        print(f"previous procedure: no checkout at {args.old!r} (git worktree add "
              "/tmp/old_a863274 a863274); not measured")
        return None
    env = dict(os.environ, PYTHONPATH=f"{old / 'benchmark'}{os.pathsep}{old / 'plugins'}")
    cmd = [sys.executable, __file__, "--worker", "--method", args.method, "--trials",
           str(args.trials), "--seed", str(args.seed), "--sampler", args.sampler, "--device",
           args.device, "--repeats", str(args.repeats), "--cache", args.cache, "--threads",
           str(args.threads)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def batches_of(trials: int, sampler: str) -> str:
    from selbench.execution.tuning import trial_batches

    return " ".join(f"[{b.start},{b.stop})" for b in trial_batches(trials, sampler))


def compare(new: dict, old: dict, sampler: str) -> str:
    """Which trials have the previous procedure's parameters, and how far their values
    are from it."""
    from selbench.execution.tuning import STARTUP

    same = [a["params"] == b["params"] for a, b in zip(new["history"], old["history"])]
    fixed = len(same) if sampler == "random" else min(STARTUP, len(same))
    diffs = [abs(a["value"] - b["value"]) for a, b, s in
             zip(new["history"], old["history"], same) if s]
    ok = all(same[:fixed])
    worst = max(diffs) if diffs else 0.0
    return (f"trials 0-{fixed - 1} ({'random search' if sampler == 'random' else 'TPE start'})"
            f": parameters {'identical' if ok else 'DIFFER'} to the previous procedure's, "
            f"objective within {worst:.1e}; {sum(same)} of {len(same)} trials identical")


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="S-TLBCE joint", help="a trained method's label in "
                    "specs/tuned.yaml (S-TLBCE seq., S-TLBCE joint, S-MMCE seq., S-MMCE joint)")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--sampler", default="tpe", choices=["tpe", "random"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--full", action="store_true", help="every trained method of the spec")
    ap.add_argument("--repeats", type=int, default=3, help="untuned fits and tunings, each "
                    "(the best counts)")
    ap.add_argument("--old", default="/tmp/old_a863274",
                    help="checkout of the previous (sequential) procedure; '' to skip it")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "selbench-bench-cache"),
                    help="backbone-output cache (the digits outputs, ~4 s to make once)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (0: its default); 1 is the least sensitive to other "
                         "processes on a shared machine")
    ap.add_argument("--batch", type=int, help="TPE trials fitted together after its random "
                    "start (default: selbench.execution.tuning.BATCH)")
    ap.add_argument("--min-epochs", type=int, default=25,
                    help="the pruner's first rung, in epochs (Optuna's min_resource)")
    ap.add_argument("--reduction-factor", type=int, default=4, help="the pruner's reduction "
                    "factor: 1 in this many trials promoted at each rung")
    ap.add_argument("--quality", action="store_true", help="the chosen configurations' "
                    "held-out and evaluation ECE1, pruned against unpruned, on --seeds seeds")
    ap.add_argument("--seeds", type=int, default=20, help="seeds of --quality (0, 1, ...; "
                    "five could not tell a loss of 0.01 ECE1 from noise, perf/README.md)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.device = str(resolve_device(args.device))
    if args.batch:
        from selbench.execution import tuning

        tuning.BATCH = args.batch
    if args.worker:  # one measurement, as JSON, for the parent process
        print(json.dumps(measure(args.method, args.trials, args.seed, args.sampler,
                                 args.device, args.repeats, args.cache, args.threads)))
        return []
    methods = (["S-TLBCE seq.", "S-TLBCE joint", "S-MMCE seq.", "S-MMCE joint"] if args.full
               else [args.method])
    if args.quality:
        return quality(args, methods)
    lines: list[str] = []
    for method in methods:
        args.method = method
        lines += run_one(args)
    print("\n".join(lines))
    return lines


def paired(diffs: list[float]) -> str:
    """Mean ± standard error of paired differences, and their 95% t interval."""
    import numpy as np
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
    half = float(stats.t.ppf(0.975, len(d) - 1) * se) if len(d) > 1 else float("nan")
    return (f"{d.mean():+.4f} ± {se:.4f} (SE), 95% interval [{d.mean() - half:+.4f}, "
            f"{d.mean() + half:+.4f}]")


def quality(args: argparse.Namespace, methods: list[str]) -> list[str]:
    """The pruned and the unpruned study of each method on ``--seeds`` seeds: the chosen
    configurations' held-out ECE₁ (the study's best value) and evaluation ECE₁ (refitted on
    the cell's fitting rows, ECE₁ at the training β on the whole evaluation split)."""
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    pruner, lines = pruner_of(args), []
    counter = engine_steps()
    rule(f"quality: {args.trials} trials ({args.sampler}), pruned (successive halving, "
         f"min_epochs {args.min_epochs}, reduction factor {args.reduction_factor}) vs "
         f"unpruned, seeds 0-{args.seeds - 1}")
    print(machine(args.device))
    for method in methods:
        rows = {"held": ([], []), "eval": ([], [])}
        cost: list[float] = []  # the pruned study's engine steps / an untuned fit's
        # an untuned fit's steps: its epochs over the cell's n_fit rows, the same every seed
        first = cell(method, 0, args.device, args.cache)
        untuned = counter.of(lambda first=first: first["make"]({}).fit(first["fitting"]))[1][0]
        for seed in range(args.seeds):
            c = cell(method, seed, args.device, args.cache)
            for k, p in enumerate((pruner, None)):
                info, (steps, _) = counter.of(
                    lambda c=c, m=method, s=seed, p=p: tune(c, m, s, args.trials, args.sampler,
                                                            p))
                if p is not None:
                    cost.append(steps / untuned)
                est = c["make"](info["chosen"]).fit(c["fitting"])
                ece = est.evaluate(c["evaluation"], betas=[c["beta"]])["ece1"][0]
                rows["held"][k].append(info["best_value"])
                rows["eval"][k].append(float(ece))
            print(f"{method:14s} seed {seed}: held-out ECE1 pruned {rows['held'][0][-1]:.4f} "
                  f"unpruned {rows['held'][1][-1]:.4f}; evaluation ECE1 pruned "
                  f"{rows['eval'][0][-1]:.4f} unpruned {rows['eval'][1][-1]:.4f}; pruned "
                  f"study {cost[-1]:.1f}x an untuned fit's engine steps; load {load():.1f}")
        for what, (pr, un) in rows.items():
            name = "held-out" if what == "held" else "evaluation"
            line = (f"{method}: {name} ECE1 pruned {sum(pr) / len(pr):.4f}, unpruned "
                    f"{sum(un) / len(un):.4f}; pruned - unpruned "
                    + paired([a - b for a, b in zip(pr, un)]))
            print(line)
            lines.append(line)
        worst = max(range(len(cost)), key=cost.__getitem__)
        line = (f"{method}: the pruned study's engine steps / an untuned fit's: mean "
                f"{sum(cost) / len(cost):.1f}x, at most {cost[worst]:.1f}x (seed {worst})")
        print(line)
        lines.append(line)
    return lines


def run_one(args: argparse.Namespace) -> list[str]:
    """Measure one method (selbench, then the previous procedure); print and return the
    target line."""
    rule(f"tuning {args.method}: {args.trials} trials ({args.sampler}) vs one untuned fit")
    print(machine(args.device))
    print(f"{EXPERIMENT} of specs/tuned.yaml, seed {args.seed}: untuned fit on 500 rows; "
          f"trials fitted on 350, scored on 150; batches {batches_of(args.trials, args.sampler)}")
    new = measure(args.method, args.trials, args.seed, args.sampler, args.device,
                  args.repeats, args.cache, args.threads, pruner_of(args))
    old = old_path(args)
    pruned = {**new, "tune_s": new["pruned_s"], "tune_cpu": new["pruned_cpu"],
              "history": new["pruned_history"]}
    rows = [("selbench, pruned (successive halving)", pruned),
            ("selbench (batched trials, unpruned)", new)] + (
        [("previous (one trial at a time)", old)] if old else [])
    print(f"pruner: min_epochs {args.min_epochs}, reduction factor {args.reduction_factor}; "
          f"{sum(h['value'] is None for h in pruned['history'])} of {args.trials} trials pruned")
    spread = new["untuned_spread"]
    print(f"untuned fits alternated with the tunings: {spread[0]:.3f}-{spread[1]:.3f} s (the "
          "best counts)")
    print(f"{'':38s} {'untuned s':>10s} {'tuning s':>9s} {'ratio':>7s}   {'CPU s: untuned':>15s}"
          f" {'tuning':>7s} {'ratio':>6s}  load (1 min)")
    for name, r in rows:
        print(f"{name:38s} {r['untuned_s']:10.3f} {r['tune_s']:9.2f} "
              f"{r['tune_s'] / r['untuned_s']:6.1f}x   {r['untuned_cpu']:15.3f} "
              f"{r['tune_cpu']:7.2f} {r['tune_cpu'] / r['untuned_cpu']:5.1f}x  "
              f"{r['load'][0]:.1f} -> {r['load'][1]:.1f}")
    if old:
        print(f"speed-up of the tuning: {old['tune_s'] / new['tune_s']:.1f}x; "
              + compare(new, old, args.sampler))
    best = min(h["value"] for h in new["history"])
    best_p = min(h["value"] for h in pruned["history"] if h["value"] is not None)
    if "chosen_s" in new:
        print(f"the pruned study's chosen configuration trained alone on the trials' rows: "
              f"{new['chosen_s']:.3f} s = {new['chosen_s'] / new['untuned_s']:.1f}x one "
              f"untuned fit (what any study that finds it pays at least)")
    if {"untuned", "pruned", "unpruned"} <= set(new.get("steps", {})):
        st = new["steps"]
        base = st["untuned"][0]
        print(f"engine steps (deterministic: the model's mini-batch steps whatever its replicas, "
              f"and replica-steps): untuned fit {st['untuned'][0]:,} ({st['untuned'][1]:,}); "
              f"pruned study {st['pruned'][0]:,} ({st['pruned'][1]:,}) = "
              f"{st['pruned'][0] / base:.1f}x; unpruned {st['unpruned'][0]:,} "
              f"({st['unpruned'][1]:,}) = {st['unpruned'][0] / base:.1f}x")
    print(f"best held-out objective: pruned {best_p:.4f}, unpruned {best:.4f}"
          + (f", previous {min(h['value'] for h in old['history']):.4f}" if old else ""))
    kind = "cuda" if args.device.startswith("cuda") else "cpu"
    ratio = pruned["tune_s"] / new["untuned_s"]
    return [target(f"tuning {args.method} on {kind.upper()}", ratio <= TARGET[kind],
                   f"{args.trials} trials {ratio:.1f}x one untuned fit pruned, "
                   f"{new['tune_s'] / new['untuned_s']:.1f}x unpruned (target <= "
                   f"{TARGET[kind]:g}x)")]


if __name__ == "__main__":
    main()
