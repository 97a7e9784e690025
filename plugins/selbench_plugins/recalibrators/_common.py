"""Helpers shared by the built-in recalibrators, selectors and schemes (private)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from selbench.data import ModelOutputs
from sklearn.exceptions import NotFittedError

__all__ = [
    "NotFittedError",
    "build_mlp",
    "check_outputs",
    "cpu_threads",
    "device_of",
    "equal_mass_edges",
    "lookup_bins",
    "run_module",
    "seeded_init",
    "to_tensor",
]

#: rows per forward pass when a fitted module scores a whole split
EVAL_CHUNK = 65536


def check_outputs(outputs: Any, who: str, *, min_rows: int = 0) -> ModelOutputs:
    """``outputs`` must be :class:`ModelOutputs` with at least ``min_rows`` examples."""
    if not isinstance(outputs, ModelOutputs):
        raise TypeError(
            f"outputs: {who} expects selbench.ModelOutputs, got {type(outputs).__name__}"
        )
    if len(outputs) < min_rows:
        raise ValueError(
            f"outputs: {who} needs at least {min_rows} example(s) to fit, got {len(outputs)}"
        )
    return outputs


def to_tensor(array: np.ndarray, device: Any = "cpu", dtype: torch.dtype | None = None) -> torch.Tensor:
    """A copy of ``array`` as a tensor on ``device`` (never shares memory with the input)."""
    t = torch.tensor(np.asarray(array))
    if dtype is not None:
        t = t.to(dtype)
    return t.to(device)


def device_of(module: torch.nn.Module) -> torch.device:
    """The device of a module's first parameter or buffer (CPU for a stateless module)."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")


@contextlib.contextmanager
def cpu_threads(device: Any, threads: int = 1) -> Iterator[None]:
    """Limit torch's intra-op threads to ``threads`` while training small modules on the CPU
    (restored afterwards; no effect on other devices).

    The selector and recalibrator MLPs are far too small to gain from intra-op
    parallelism: on an idle 2-core machine one thread is ~15% slower than two for the
    paper's 2x128 MLP on d=512, but when the cores are shared with other processes two
    threads were measured 12x slower than one (spin-waiting threads), so one is the robust
    choice.
    """
    if torch.device(device).type != "cpu" or torch.get_num_threads() <= threads:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def seeded_init(seed: int, build):
    """Call ``build()`` with torch's global RNG seeded by ``seed``, restoring it afterwards.

    Used so that a module's initial weights depend on the replica seed only.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return build()


def build_mlp(d_in: int, hidden: Sequence[int]) -> torch.nn.Sequential:
    """``Linear -> ReLU`` for each width in ``hidden``, then ``Linear(., 1)`` (a logit)."""
    layers: list[torch.nn.Module] = []
    width = int(d_in)
    for h in hidden:
        layers += [torch.nn.Linear(width, int(h)), torch.nn.ReLU()]
        width = int(h)
    layers.append(torch.nn.Linear(width, 1))
    return torch.nn.Sequential(*layers)


@torch.no_grad()
def run_module(module: torch.nn.Module, *arrays: np.ndarray, index: int | None = 0) -> np.ndarray:
    """Run ``module`` in eval mode on ``arrays`` (chunked, on the module's device) and
    return output ``index`` of each call (or the sole output when ``index`` is None) as
    float64 numpy."""
    was_training = module.training
    module.eval()
    device = device_of(module)
    n = len(arrays[0])
    parts = []
    try:
        for start in range(0, max(n, 1), EVAL_CHUNK):
            chunk = [torch.tensor(a[start : start + EVAL_CHUNK]).to(device) for a in arrays]
            out = module(*chunk)
            if index is not None:
                out = out[index]
            parts.append(out.detach().to("cpu", torch.float64).numpy())
    finally:
        module.train(was_training)
    return np.concatenate(parts) if parts else np.zeros(0)


def equal_mass_edges(values: np.ndarray, n_bins: int) -> np.ndarray:
    """Upper bin boundaries of equal-mass bins over ``values`` in [0, 1].

    The sorted values are cut into ``min(n_bins, N)`` consecutive groups whose sizes differ
    by at most one (the first ``N mod n_bins`` groups get the extra element); each inner
    boundary is the midpoint between the last value of one group and the first of the
    next, and the last boundary is 1.0. Repeated boundaries (ties) are merged, so fewer
    bins may result. This is the convention of Kumar et al.'s ``calibration`` package
    (``get_equal_bins``); a value ``v`` falls in the first bin whose boundary is ``>= v``.
    """
    v = np.sort(np.asarray(values, dtype=np.float64))
    n = v.shape[0]
    k = max(1, min(int(n_bins), n))
    sizes = np.full(k, n // k)
    sizes[: n % k] += 1
    ends = np.cumsum(sizes)  # one past the last index of each group
    inner = (v[ends[:-1] - 1] + v[ends[:-1]]) / 2.0
    return np.unique(np.concatenate([inner, [1.0]]))


def lookup_bins(edges: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Index of the bin of each value (first edge ``>= value``; values above 1 go last)."""
    idx = np.searchsorted(edges, np.asarray(values, dtype=np.float64), side="left")
    return np.minimum(idx, len(edges) - 1)


def bin_means(edges: np.ndarray, values: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Mean of ``targets`` per bin of ``values``; an empty bin gets its midpoint."""
    idx = lookup_bins(edges, values)
    nb = len(edges)
    counts = np.bincount(idx, minlength=nb).astype(np.float64)
    sums = np.bincount(idx, weights=np.asarray(targets, dtype=np.float64), minlength=nb)
    lower = np.concatenate([[0.0], edges[:-1]])
    mid = (lower + edges) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1.0), mid)
    return means
