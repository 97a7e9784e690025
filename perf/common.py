"""Shared helpers of the benchmarks: the machine, the matmul peak, timing, target lines."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def sync(device: Any) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: Any = "cpu") -> float:
    """Wall seconds of ``fn()`` (the device synchronised before and after)."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine()


def machine(device: Any) -> str:
    """One line: date, CPU model and cores, torch threads, the GPU if used."""
    dev = torch.device(device)
    parts = [
        datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        f"CPU {cpu_model()} x {os.cpu_count()} cores",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads",
    ]
    if dev.type == "cuda":
        parts.append(f"GPU {torch.cuda.get_device_name(dev)}")
    return "; ".join(parts)


def matmul_peak(device: Any, size: int | None = None, seconds: float = 1.5) -> float:
    """Float32 matmul GFLOP/s on ``device`` with torch's current threads: the best of
    repeated ``size x size`` products (2048 on the CPU, 8192 on a GPU); TF32 stays at torch's default (off), as in
    the training."""
    dev = torch.device(device)
    size = size or (8192 if dev.type == "cuda" else 2048)
    a = torch.randn(size, size, device=dev)
    b = torch.randn(size, size, device=dev)
    c = torch.empty(size, size, device=dev)
    torch.matmul(a, b, out=c)
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while True:
        best = min(best, timed(lambda: torch.matmul(a, b, out=c), dev))
        if time.perf_counter() > deadline:
            break
    return 2.0 * size**3 / best / 1e9


def best_of(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """(fastest wall time of ``repeats`` calls in seconds, the last call's value)."""
    best, value = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def target(label: str, ok: bool, detail: str) -> str:
    line = f"  target {label}: {detail} -> {'MET' if ok else 'MISSED'}"
    print(line)
    return line


def rule(title: str) -> None:
    print()
    print(f"== {title} " + "=" * max(0, 76 - len(title)))


def step_flops(d_in: int, hidden, batch: int) -> int:
    """Matmul FLOPs of one training step of one MLP replica (``d_in -> hidden... -> 1``):
    forward ``2 B d h`` per layer, backward the same for the weight gradient and (except the
    first layer, whose input needs none) again for the input gradient."""
    widths = [int(d_in), *[int(h) for h in hidden], 1]
    flops = 0
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        flops += (2 if i == 0 else 3) * 2 * batch * a * b
    return flops
