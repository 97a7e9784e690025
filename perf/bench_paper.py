"""The method stage of ``specs/paper.yaml`` on cached (synthetic) outputs of the paper's sizes.

The backbone stage is replaced by synthetic model outputs of the paper's shapes — feature
dimension, classes and split sizes of Camelyon17 (DenseNet-121, 1024-d, 2 classes, 34,904 /
85,054), ImageNet (ResNet-34, 512-d, 1000 classes, 50,000), RxRx1 (ResNet-50, 2048-d, 1139
classes, 9,854 / 34,432) and CIFAR-100-C (CLIP ViT-B/32, 512-d, 100 classes, 10,000 / 50,000)
— written into a fresh output cache under the very keys the runner computes for
``specs/paper.yaml``. Then ``selbench.execution.runner.run`` runs the spec unchanged (every method, 5
seeds, every training β): the whole method stage, cells and leaderboard, no plots.

FLOPs are counted analytically for what is matmul-bound: training the MLP selectors (and
MLP recalibrators: their fit ignores β, so one per seed), counted as in
``bench_training.py``, and their forward passes over the fitting and evaluation data.
Everything else (the baselines' sklearn models, binning, temperature and Platt fits, the
elementwise softmax and kernel terms of the losses) is counted as zero FLOPs, so the
fraction of the floor is a lower bound. The floor is FLOPs / the float32 matmul peak
measured in the same run.

By default the run is shortened to a few minutes: every ``epochs`` divided by
``--epoch-divisor`` (20) and the splits cut to ``--max-split`` (12,000) examples; ``--full``
runs the paper's sizes (on 2 CPU cores about an hour).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from common import machine, matmul_peak, resolve_device, rule, step_flops, target
from selbench.contract.api import Backbone, Dataset, SplitData
from selbench.contract.data import ModelOutputs
from selbench.execution import cells as cells_mod
from selbench.execution import runner
from selbench.execution.extraction import experiment_outputs
from selbench.execution.keys import identify, output_keys
from selbench.measure.bootstrap import bootstrap_threads
from selbench.spec import load_spec
from selbench.store.cache import OutputCache

REPO = Path(__file__).resolve().parents[1]
TRAINING = ("selection", "sequential", "joint")

#: experiment -> (feature dim, classes, {split: size}) as in the paper (Appendix A)
SHAPES = {
    "camelyon17": (1024, 2, {"val": 34_904, "test": 85_054}),
    "imagenet": (512, 1000, {"val": 50_000}),
    "rxrx1": (2048, 1139, {"val": 9_854, "test": 34_432}),
    "cifar100-c": (512, 100, {"val": 10_000, "test": 50_000}),
}


def synthetic(n: int, d: int, k: int, seed: int) -> ModelOutputs:
    """Gaussian features; logits a linear function of 32 of them (over-confident: labels
    drawn from the softmax at half the scale)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d), dtype=np.float32)
    w = rng.standard_normal((32, k), dtype=np.float32) * np.float32(4.0 / math.sqrt(32))
    z = x[:, :32] @ w
    gumbel = -np.log(-np.log(rng.random((n, k), dtype=np.float32) + 1e-12) + 1e-12)
    labels = np.argmax(0.5 * z + gumbel, axis=1)
    return ModelOutputs(features=x, logits=z, labels=labels)


class _SyntheticDataset(Dataset):
    def __init__(self, sizes: dict[str, int], k: int):
        self.sizes, self.num_classes = sizes, k

    def splits(self) -> list[str]:
        return list(self.sizes)

    def split(self, name: str) -> SplitData:
        return SplitData(inputs=None, labels=np.zeros(self.sizes[name], dtype=np.int64))


class _SyntheticBackbone(Backbone):
    def __init__(self, d: int, k: int, sizes: dict[str, int]):
        self.d, self.k, self.sizes = d, k, sizes

    def extract(self, dataset, split, context) -> ModelOutputs:
        seed = sorted(self.sizes).index(split) + 17 * self.d + self.k
        return synthetic(self.sizes[split], self.d, self.k, seed)


def paper_spec(divisor: int, resamples: int | None = None) -> dict:
    raw = yaml.safe_load((REPO / "specs" / "paper.yaml").read_text())
    # the paper's experiments only: the optional block of methods beyond the paper is not
    # part of the measured workload (its figures stay comparable across issues)
    raw["experiments"] = [e for e in raw["experiments"] if not e.get("optional")]
    if divisor > 1:
        for exp in raw["experiments"]:
            for m in exp["methods"]:
                for field in ("scheme", "recalibrator"):
                    params = (m.get(field) or {}).get("params") or {}
                    if "epochs" in params:
                        params["epochs"] = max(1, math.ceil(params["epochs"] / divisor))
    if resamples is not None:  # the cells' bootstrap intervals (the spec's default: 200)
        for exp in raw["experiments"]:
            exp["bootstrap"] = {**(exp.get("bootstrap") or {}), "resamples": resamples}
    return raw


def placeholder_inputs(raw: dict, work: Path) -> dict:
    """Point every declared input file/folder of the datasets and backbones at an empty
    placeholder under ``work`` (the synthetic outputs replace what they would be read for;
    the spec validates only when its inputs exist)."""
    from selbench.contract.inputs import declared_inputs
    from selbench.contract.registry import get_registry

    reg = get_registry()
    for exp in raw["experiments"]:
        for kind in ("dataset", "backbone"):
            comp = exp[kind]
            model = reg.get(kind, comp["name"]).plugin.params
            for field, spec in declared_inputs(model).items():
                params = comp.setdefault("params", {})
                info = model.model_fields[field]
                if field not in params and not info.is_required() and info.get_default() is None:
                    continue
                path = work / "inputs" / exp["name"] / f"{kind}-{field}"
                if spec.kind == "dir":
                    path.mkdir(parents=True, exist_ok=True)
                else:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.touch()
                params[field] = str(path)
    return raw


def fill_cache(raw: dict, cache_dir: Path, max_split: int | None) -> None:
    """Write synthetic outputs under the keys ``runner.run`` will look up."""
    resolved = load_spec(raw)
    cache = OutputCache(cache_dir)
    ident = identify(resolved, cache)
    real_build = resolved.build
    for e_i, exp in enumerate(resolved.spec.experiments):
        d, k, sizes = SHAPES[exp.name]
        if max_split:
            sizes = {s: min(n, max_split) for s, n in sizes.items()}

        def build(kind, comp, d=d, k=k, sizes=sizes):
            if kind == "dataset":
                return _SyntheticDataset(sizes, k)
            if kind == "backbone":
                return _SyntheticBackbone(d, k, sizes)
            return real_build(kind, comp)

        resolved.build = build
        experiment_outputs(resolved, e_i, output_keys(resolved, ident, e_i), cache, "cpu", False)


def mlp_fwd(d: int, hidden: list[int]) -> int:
    widths = [d, *hidden, 1]
    return sum(2 * a * b for a, b in zip(widths[:-1], widths[1:]))


def count_flops(resolved, cells: list[dict]) -> dict[tuple[str, str], float]:
    """Analytic matmul FLOPs per (experiment, method label), from the spec and the cells."""
    flops: dict[tuple[str, str], float] = {}
    for exp in resolved.spec.experiments:
        d = SHAPES[exp.name][0]
        for m in exp.methods:
            mine = [c for c in cells if c["experiment"] == exp.name and c["method"] == m.label]
            total = 0.0
            rec = resolved.params("recalibrator", m.recalibrator)
            if m.recalibrator.name == "mlp":  # one fit per seed (it ignores β)
                seeds = {c["seed"] for c in mine}
                for c in mine:
                    if c["seed"] in seeds:
                        seeds.discard(c["seed"])
                        steps = rec["epochs"] * math.ceil(c["n_fit"] / rec["batch_size"])
                        total += steps * step_flops(d, rec["hidden"], rec["batch_size"])
                    total += (c["n_eval"] + c["n_fit"]) * mlp_fwd(d, rec["hidden"])
            if m.scheme.name in TRAINING and m.selector.name == "mlp":
                sch = resolved.params("scheme", m.scheme)
                hidden = resolved.params("selector", m.selector)["hidden"]
                for c in mine:
                    steps = sch["epochs"] * math.ceil(c["n_fit"] / sch["batch_size"])
                    total += steps * step_flops(d, hidden, sch["batch_size"])
                    total += c["n_eval"] * mlp_fwd(d, hidden)
            flops[(exp.name, m.label)] = total
    return flops


def main(argv: list[str] | None = None) -> list[str]:
    args = parser().parse_args(argv)
    if args.against:
        return against(args, argv or [])
    device = resolve_device(args.device)
    divisor = 1 if args.full else args.epoch_divisor
    max_split = None if args.full else args.max_split

    rule("method stage of specs/paper.yaml on cached synthetic outputs")
    print(machine(device))
    print("epochs: the paper's" if divisor == 1 else f"epochs: the paper's / {divisor}",
          "; splits:", "the paper's sizes" if not max_split else f"at most {max_split:,}",
          "" if args.resamples is None else f"; bootstrap resamples per cell: {args.resamples}")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="selbench-"))
    try:
        raw = placeholder_inputs(paper_spec(divisor, args.resamples), work)
        t0 = time.perf_counter()
        fill_cache(raw, work / "cache", max_split)
        print(f"synthetic outputs cached in {time.perf_counter() - t0:.1f} s (not timed below)")
        peak = matmul_peak(device)
        report, wall, boot = run_stage(raw, work, device.type, args.progress)
        peak = max(peak, matmul_peak(device))
        cells = [json.loads(p.read_text()) for p in (work / "results" / "cells").rglob("*.json")]
        resolved = load_spec(raw)
        flops = count_flops(resolved, cells)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    floor, t_counted = print_table(cells, flops, peak, wall, boot, report.computed)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {**phases(cells, wall, boot), "cells": report.computed, "floor": floor}))
    lines = []
    if device.type == "cuda":
        lines.append(target("GPU method stage", wall < 120 and divisor == 1 and not max_split,
                            f"{wall:.1f} s{'' if args.full else ' (shortened run)'} (< 120 s at "
                            "the paper's sizes)"))
    else:
        lines.append(target("CPU method stage, fraction of the floor", floor / wall >= 0.55,
                            f"{100 * floor / wall:.1f}% (>= 55%)"))
        lines.append(target("CPU FLOP-counted methods, fraction of the floor",
                            floor / t_counted >= 0.4, f"{100 * floor / t_counted:.1f}% (>= 40%)"))
    return lines


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--full", action="store_true", help="the paper's epochs and split sizes")
    ap.add_argument("--epoch-divisor", type=int, default=20)
    ap.add_argument("--max-split", type=int, default=12_000)
    ap.add_argument("--workdir", help="keep the cache and results here (default: a temp dir)")
    ap.add_argument("--progress", action="store_true", help="the runner's progress bars")
    ap.add_argument("--resamples", type=int,
                    help="bootstrap resamples per cell (default: the spec's; 0: no intervals)")
    ap.add_argument("--against", metavar="DIR",
                    help="a checkout of earlier selbench code (e.g. `git worktree add DIR "
                         "<commit>`): run the same stage with it and with this tree, one after "
                         "the other, each in its own process, and print both side by side")
    ap.add_argument("--json", metavar="PATH", help="also write the phase times as JSON")
    return ap


def phases(cells: list[dict], wall: float, boot: float) -> dict[str, float]:
    """Wall seconds of the stage by phase: fitting, evaluating (scores, metrics and intervals,
    from the cells' own timings), the bootstrap intervals alone, and outside the cells
    (loading the cached outputs, planning, writing cells and the leaderboard)."""
    fit_s = sum(c["timing"]["fit_s"] for c in cells)
    eval_s = sum(c["timing"]["eval_s"] for c in cells)
    return {"wall": wall, "fit": fit_s, "evaluate": eval_s, "intervals": boot,
            "evaluate_without_intervals": eval_s - boot, "outside": wall - fit_s - eval_s}


def against(args: argparse.Namespace, argv: list[str]) -> list[str]:
    """The stage with the code in ``args.against`` and with this tree, in that order, each in a
    fresh process on a fresh cache; the phase table and the targets of issue 28 (CPU evaluation
    and outside the cells each at least halved)."""
    import os
    import subprocess

    old_root = Path(args.against).resolve()
    rest = [a for i, a in enumerate(argv) if a != "--against" and
            not (i and argv[i - 1] == "--against") and not a.startswith("--against=")]
    results = {}
    for label, root in (("before", old_root), ("after", REPO)):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(root / "benchmark"), str(root / "plugins")]))
        with tempfile.TemporaryDirectory(prefix="selbench-against-") as tmp:
            out = Path(tmp) / "phases.json"
            subprocess.run([sys.executable, str(Path(__file__).resolve()), *rest, "--json",
                            str(out)], env=env, check=True)
            results[label] = json.loads(out.read_text())
    rule(f"side by side: before = {old_root}, after = this tree")
    before, after = results["before"], results["after"]
    for key in ("wall", "fit", "evaluate", "intervals", "evaluate_without_intervals", "outside"):
        ratio = before[key] / after[key] if after[key] > 0 else float("inf")
        print(f"  {key:28s} {before[key]:9.1f} s {after[key]:9.1f} s   {ratio:5.2f}x")
    lines = [target("CPU evaluation at least halved", before["evaluate"] >= 2 * after["evaluate"],
                    f"{before['evaluate']:.1f} -> {after['evaluate']:.1f} s"),
             target("outside the cells at least halved", before["outside"] >= 2 * after["outside"],
                    f"{before['outside']:.1f} -> {after['outside']:.1f} s")]
    return lines


def run_stage(raw: dict, work: Path, device_type: str, progress: bool
              ) -> tuple[object, float, float]:
    """Run the spec on the cache in ``work`` into ``work / results``: the runner's report,
    the wall seconds and the seconds spent in the cells' bootstrap intervals (CPU, part of
    each cell's eval_s)."""
    boot = [0.0]  # seconds in the cells' bootstrap intervals (CPU, part of eval_s)
    real_intervals = cells_mod.evaluate_intervals

    def timed_intervals(*a, **kw):
        t = time.perf_counter()
        try:
            return real_intervals(*a, **kw)
        finally:
            boot[0] += time.perf_counter() - t

    cells_mod.evaluate_intervals = timed_intervals
    t0 = time.perf_counter()
    try:
        report = runner.run(load_spec(raw), out_dir=work / "results", device=device_type,
                            cache_dir=work / "cache", progress=progress, plots=False)
    finally:
        cells_mod.evaluate_intervals = real_intervals
    return report, time.perf_counter() - t0, boot[0]


def print_table(cells: list[dict], flops: dict, peak: float, wall: float, boot: float,
                computed: int) -> tuple[float, float]:
    """Print FLOPs, seconds and GFLOP/s per experiment and method, and the totals; returns
    the FLOP-bound floor and the seconds of the FLOP-counted methods."""
    secs: dict[tuple[str, str], float] = {}
    for c in cells:
        key = (c["experiment"], c["method"])
        secs[key] = secs.get(key, 0.0) + c["timing"]["fit_s"] + c["timing"]["eval_s"]
    counted = {k for k, v in flops.items() if v > 0}
    total_flops = sum(flops.values())
    t_counted = sum(secs[k] for k in counted)
    t_other = sum(v for k, v in secs.items() if k not in counted)
    floor = total_flops / (peak * 1e9)
    print(f"{computed} cells in {wall:.1f} s; matmul peak (same run) {peak:.1f} GFLOP/s")
    print(f"{'experiment':12s} {'method':22s} {'cells':>5s} {'TFLOP':>8s} {'seconds':>8s} "
          f"{'GFLOP/s':>8s}")
    for (e, m), f in flops.items():
        n = sum(1 for c in cells if (c["experiment"], c["method"]) == (e, m))
        rate = f / secs[(e, m)] / 1e9 if f else 0.0
        print(f"{e:12s} {m[:22]:22s} {n:5d} {f / 1e12:8.3f} {secs[(e, m)]:8.1f} "
              f"{rate if f else float('nan'):8.1f}")
    print(f"total: {total_flops / 1e12:.2f} TFLOP counted; floor {floor:.1f} s; wall {wall:.1f} s "
          f"-> {100 * floor / wall:.1f}% of the FLOP-bound floor")
    print(f"  FLOP-counted methods (learned selectors, MLP recalibrators): {t_counted:.1f} s "
          f"-> {100 * floor / t_counted:.1f}% of the floor")
    print(f"  other methods (baselines, binning, temperature/Platt only): {t_otherfmt(t_other)}")
    ph = phases(cells, wall, boot)
    print(f"  fitting {ph['fit']:.1f} s; evaluating {ph['evaluate']:.1f} s (bootstrap intervals "
          f"{boot:.1f} s, {bootstrap_threads()} threads; scores and point metrics "
          f"{ph['evaluate_without_intervals']:.1f} s); outside the cells {ph['outside']:.1f} s")
    return floor, t_counted


def t_otherfmt(seconds: float) -> str:
    return f"{seconds:.1f} s, no FLOPs counted"


if __name__ == "__main__":
    main(sys.argv[1:])
