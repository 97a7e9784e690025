"""Selector training per configuration: a naive PyTorch loop vs selbench's batched training.

The configuration is the paper's selector training (Appendix A): ĝ = MLP 512 -> 128 -> 128
-> 1 (sigmoid) trained jointly with a temperature h, S-TLBCE + quadratic coverage loss
(λ = 32), Adam (lr 5e-4), 1000 fitting examples, batch 100 — 10 steps per epoch, 1000 epochs
in the paper (``--full``; the default runs fewer epochs, the rates do not depend on it).
The logits have K = 10 classes.

* naive: that training written as a plain PyTorch loop (``nn.Sequential``, one replica,
  torch's default threads), the issue's baseline;
* selbench solo: ``JointScheme.fit`` for one replica (the training engine with R = 1);
* selbench batched: ``JointScheme.fit_many`` over seeds × training β (× λ on a GPU) — all
  replicas as one model, with the built-in hand-stacked modules (``BatchedMLP``,
  ``BatchedTemperature``);
* selbench batched, torch.func: the same, with the modules stacked by the engine's generic
  path (``stack_module_state`` + ``functional_call`` + ``vmap``), what a third-party module
  gets — the measurement that decides whether a hand-stacked module earns its place;
* on a GPU, selbench batched with the step launched eagerly (``SELBENCH_CUDA_GRAPHS=0``)
  instead of replayed from a CUDA graph.

FLOPs are counted analytically (matmuls of the MLP only: forward, weight gradients, input
gradients except for the first layer — 36.1 MFLOP per step), and set against the float32
matmul peak measured in the same run.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from common import machine, matmul_peak, resolve_device, rule, step_flops, target, timed
from selbench import FitContext, ModelOutputs
from selbench.contract.api import FitJob
from selbench.contract.registry import get_registry

N, D, K, HIDDEN, BATCH, LR, LAM = 1000, 512, 10, [128, 128], 100, 5e-4, 32.0


def synthetic(seed: int) -> ModelOutputs:
    """A fitting sample: features, over-confident logits that depend on them, labels."""
    rng = np.random.default_rng([seed, 7])
    x = rng.normal(size=(N, D)).astype(np.float32)
    z = (x[:, :32] @ rng.normal(size=(32, K)) * 0.5).astype(np.float32)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    labels = (p.cumsum(1) < rng.random((N, 1))).sum(1).clip(0, K - 1)
    return ModelOutputs(features=x, logits=2 * z, labels=labels)


def naive(outputs: ModelOutputs, seed: int, beta: float, epochs: int, device) -> None:
    """The paper's training as a plain PyTorch loop (one replica)."""
    torch.manual_seed(seed)
    g = torch.nn.Sequential(
        torch.nn.Linear(D, HIDDEN[0]), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN[0], HIDDEN[1]), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN[1], 1),
    ).to(device)
    log_t = torch.nn.Parameter(torch.zeros((), device=device))
    x = torch.tensor(outputs.features, device=device)
    z = torch.tensor(outputs.logits, device=device)
    correct = torch.tensor(outputs.correct(), dtype=torch.float32, device=device)
    opt = torch.optim.Adam([*g.parameters(), log_t], lr=LR)
    for _ in range(epochs):
        for idx in torch.randperm(N, device=device).split(BATCH):
            sel = torch.sigmoid(g(x[idx]).squeeze(-1))
            conf = torch.log_softmax(z[idx] / log_t.exp(), -1).max(-1).values.exp()
            bce = torch.nn.functional.binary_cross_entropy(conf, correct[idx], reduction="none")
            loss = (sel * bce).mean() + LAM * (beta - sel.mean()) ** 2
            opt.zero_grad()
            loss.backward()
            opt.step()


def jobs(cells, outs, device) -> list[FitJob]:
    reg = get_registry()
    return [
        FitJob(
            outs[seed],
            reg.get("selector", "mlp").build({"hidden": HIDDEN}),
            reg.get("recalibrator", "temperature").build(),
            reg.get("loss", "s-tlbce").build(),
            reg.get("loss", "quadratic").build({"lam": lam}),
            FitContext(seed=seed, beta=beta, device=str(device)),
        )
        for seed, beta, lam in cells
    ]


def generic(fn):
    """``fn()`` with the training engine's generic torch.func stacking for every module."""
    from selbench.training import engine
    from selbench_plugins.schemes import training

    saved = training.stack_selectors, training.stack_recalibrators
    training.stack_selectors = engine.FuncStack
    training.stack_recalibrators = engine.FuncRecalibratorStack
    try:
        return fn()
    finally:
        training.stack_selectors, training.stack_recalibrators = saved


def eager(fn):
    """``fn()`` with the engine's CUDA graphs off (``SELBENCH_CUDA_GRAPHS=0``)."""
    import os

    saved = os.environ.get("SELBENCH_CUDA_GRAPHS")
    os.environ["SELBENCH_CUDA_GRAPHS"] = "0"
    try:
        return fn()
    finally:
        if saved is None:
            del os.environ["SELBENCH_CUDA_GRAPHS"]
        else:
            os.environ["SELBENCH_CUDA_GRAPHS"] = saved


def scheme(epochs: int):
    params = {"epochs": epochs, "batch_size": BATCH, "lr": LR}
    return get_registry().get("scheme", "joint").build(params)


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--full", action="store_true", help="the paper's 1000 epochs")
    ap.add_argument("--epochs", type=int, help="epochs (default 100 on a CPU, 1000 on a GPU)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--betas", type=float, nargs="+", default=[0.75, 0.8, 0.85, 0.9])
    ap.add_argument("--lams", type=float, nargs="+",
                    help="coverage weights (default 32 on a CPU; 8 16 32 64 128 on a GPU)")
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    epochs = 1000 if args.full else (args.epochs or (1000 if gpu else 100))
    lams = args.lams or ([8.0, 16.0, 32.0, 64.0, 128.0] if gpu else [LAM])
    cells = [(s, b, lam) for s in range(args.seeds) for b in args.betas for lam in lams]
    outs = {s: synthetic(s) for s in range(args.seeds)}

    rule("selector training per configuration: naive loop vs batched")
    print(machine(device))
    steps = epochs * -(-N // BATCH)
    flops = step_flops(D, HIDDEN, BATCH)
    print(f"MLP {D}->{'->'.join(map(str, HIDDEN))}->1 + temperature (K={K}), S-TLBCE + "
          f"coverage, Adam, n={N}, batch {BATCH}, {epochs} epochs = {steps} steps, "
          f"{flops / 1e6:.1f} MFLOP/step; batched: {len(cells)} replicas "
          f"({args.seeds} seeds x {len(args.betas)} beta x {len(lams)} lambda)")
    peak = matmul_peak(device)

    t_naive, t_solo, t_batch, t_func, t_eager = time_runs(cells, outs, epochs, device)
    peak = max(peak, matmul_peak(device))
    return print_report(cells, epochs, steps, flops, peak, gpu,
                        t_naive, t_solo, t_batch, t_func, t_eager)


def time_runs(cells: list, outs: dict, epochs: int, device: torch.device) -> tuple:
    """Seconds of the naive loop, the solo fit, the batched fit, the batched fit through
    ``torch.func`` and (on a GPU, else None) the batched fit without CUDA graphs, after a
    warm-up."""
    # warm-up (first-call costs), then the timed runs
    naive(outs[0], 0, 0.8, 2, device)
    scheme(2).fit_many(jobs(cells[:2], outs, device))
    t_naive = timed(lambda: naive(outs[0], 0, 0.8, epochs, device), device)
    one = jobs(cells[:1], outs, device)[0]
    t_solo = timed(lambda: scheme(epochs).fit(
        one.outputs, selector=one.selector, recalibrator=one.recalibrator, loss=one.loss,
        coverage=one.coverage, context=one.context), device)
    t_batch = timed(lambda: scheme(epochs).fit_many(jobs(cells, outs, device)), device)
    t_func = timed(lambda: generic(lambda: scheme(epochs).fit_many(jobs(cells, outs, device))),
                   device)
    t_eager = None
    if device.type == "cuda":
        # the same batched training with the step launched eagerly, not from CUDA graphs
        t_eager = timed(lambda: eager(lambda: scheme(epochs).fit_many(
            jobs(cells, outs, device))), device)
    return t_naive, t_solo, t_batch, t_func, t_eager


def print_report(cells: list, epochs: int, steps: int, flops: int, peak: float, gpu: bool,
           t_naive: float, t_solo: float, t_batch: float, t_func: float,
           t_eager: float | None) -> list[str]:
    """Print the table of the timings against the matmul peak; returns the target lines."""
    per = t_batch / len(cells)
    rows = [("naive loop", t_naive, 1), ("selbench solo fit", t_solo, 1),
            (f"selbench batched ({len(cells)} replicas)", per, len(cells)),
            ("selbench batched, torch.func", t_func / len(cells), len(cells))]
    if t_eager is not None:
        rows.append(("selbench batched, no CUDA graphs", t_eager / len(cells), len(cells)))
    print(f"matmul peak (float32, same run): {peak:.1f} GFLOP/s")
    print(f"{'':34s} {'s/config':>10s} {'GFLOP/s':>9s} {'% peak':>7s} {'speed-up':>9s}")
    for name, t, _ in rows:
        rate = steps * flops / t / 1e9
        print(f"{name:34s} {t:10.3f} {rate:9.1f} {100 * rate / peak:6.1f}% "
              f"{t_naive / t:8.1f}x")
    floor = steps * flops / (peak * 1e9)
    print(f"FLOP-bound floor: {floor:.3f} s/config; batched reaches "
          f"{100 * floor / per:.1f}% of it")
    if epochs != 1000:
        print(f"(per configuration of {epochs} epochs; x{1000 / epochs:g} for the paper's 1000)")
    lines = []
    rate = steps * flops / per / 1e9
    lines.append(f"engine: hand-stacked {per:.3f} s/config, torch.func "
                 f"{t_func / len(cells):.3f} s/config ({t_func / t_batch:.2f}x)")
    if gpu:
        lines.append(target("GPU batched vs naive", t_naive / per >= 50,
                            f"{t_naive / per:.1f}x faster per configuration (>= 50x)"))
    else:
        lines.append(target("CPU batched GFLOP/s", rate >= 0.6 * peak,
                            f"{rate:.1f} GFLOP/s = {100 * rate / peak:.1f}% of the "
                            f"{peak:.1f} GFLOP/s peak (>= 60%)"))
        lines.append(target("CPU batched vs naive", t_naive / per >= 4,
                            f"{t_naive / per:.1f}x faster per configuration (about 4x)"))
    return lines


if __name__ == "__main__":
    main(sys.argv[1:])
