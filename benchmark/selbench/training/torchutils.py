"""Torch helpers for plugins that train or run small networks (the built-in selectors,
recalibrators and schemes use them; so may a third-party plugin).

* tensors and devices: :func:`to_tensor`, :func:`device_of`, :func:`run_module` (a fitted
  module over a whole split, chunked, in eval mode);
* threads: :func:`cpu_threads` (one thread for small solo training), :func:`batched_threads`
  (batched training);
* seeding: :func:`seeded_init` (initial weights that depend on the replica's seed only),
  :func:`epoch_permutations` (each replica's batch order, as a solo loop draws it);
* the MLP of the learned selector and MLP recalibrator: :func:`build_mlp`, and
  :class:`BatchedMLP`, R of them trained as one (hand-stacked for
  :mod:`selbench.training.engine`); :func:`equal_groups` finds equal replicas (:func:`fit_once_per_group` fits
  each group once), :func:`batched_adam`
  is the engine's optimiser.

The code digest of a plugin that imports this module covers it (:mod:`selbench.execution.codeid`), so
editing it recomputes the cells of those plugins.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "EVAL_CHUNK",
    "BatchedMLP",
    "OVERSUBSCRIBED_PRESSURE",
    "balanced_split",
    "batched_adam",
    "batched_threads",
    "build_mlp",
    "cpu_pressure",
    "cpu_threads",
    "device_of",
    "epoch_permutations",
    "equal_groups",
    "fit_once_per_group",
    "layout_threads",
    "mlp_linears",
    "run_module",
    "seeded_init",
    "to_tensor",
]

EVAL_CHUNK = 65536


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


#: CPU pressure (Linux PSI, ``/proc/pressure/cpu``: the share of the last 10 s, in %, in
#: which some runnable task waited for a CPU) from which batched training takes one thread:
#: with no task waiting it is near 0, on a machine whose every core is wanted twice near 100.
OVERSUBSCRIBED_PRESSURE = 40.0
_PSI_CPU = "/proc/pressure/cpu"


def cpu_pressure(path: str = _PSI_CPU) -> float | None:
    """The machine's CPU pressure now: PSI's ``some avg10`` in % (0 to 100), or ``None``
    where the kernel does not report it (not Linux, PSI off, an unreadable file)."""
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        if fields[:1] == ["some"]:
            for field in fields[1:]:
                key, _, value = field.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


def batched_threads(device: Any) -> int:
    """Intra-op threads for batched training of many replicas on the CPU (see
    :func:`cpu_threads`): what ``SELBENCH_TRAIN_THREADS`` says when it is set; else all of
    torch's threads while the machine can give them, and one when it is oversubscribed
    (CPU pressure of :func:`cpu_pressure` at least :data:`OVERSUBSCRIBED_PRESSURE`): torch's
    OpenMP threads spin-wait for each other, so two threads on a core another process
    holds made one tuning 3.4x slower than one thread (perf/README.md). With a leading
    replica dimension each matmul is large enough (tens of MFLOP) that the threads pay on
    an idle machine, unlike the per-replica matmuls of the solo loop. Results do not depend
    on the choice: the batched training is bit for bit the same on 1 or 2 threads
    (tests/test_threads.py)."""
    env = os.environ.get("SELBENCH_TRAIN_THREADS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError as exc:
            raise ValueError(
                f"SELBENCH_TRAIN_THREADS must be a positive integer, got {env!r}"
            ) from exc
    threads = torch.get_num_threads()
    if threads > 1 and torch.device(device).type == "cpu":
        pressure = cpu_pressure()
        if pressure is not None and pressure >= OVERSUBSCRIBED_PRESSURE:
            return 1
    return threads


def batched_adam(parameters: Sequence[torch.Tensor], lr: float, weight_decay: float):
    """Adam over stacked replica parameters: the fused kernel (one pass over the parameters
    instead of about ten) where this torch build has it, else the ``foreach`` one. Both are
    elementwise, so every replica gets exactly its own Adam update (to float rounding)."""
    parameters = list(parameters)
    try:
        return torch.optim.Adam(parameters, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(parameters, lr=lr, weight_decay=weight_decay, foreach=True)


def equal_groups(seeds: Sequence[int], same: Callable[[int, int], bool]) -> list[list[int]]:
    """Indices grouped by equal seed and ``same(first of group, i)``, in order of first
    appearance."""
    groups: list[list[int]] = []
    for i, seed in enumerate(seeds):
        for group in groups:
            if seeds[group[0]] == seed and same(group[0], i):
                group.append(i)
                break
        else:
            groups.append([i])
    return groups


def fit_once_per_group(objects: Sequence[Any], groups: list[list[int]],
                       fit: Callable[[int], Any]) -> None:
    """``fit(i)`` for the first index ``i`` of each group of :func:`equal_groups`; every
    other member of the group gets a deep copy of that object's learned attributes (the
    names ending in ``_``), for estimators whose fit is the same on the group's members
    (equal parameters and data; see the callers)."""
    for group in groups:
        first = objects[group[0]]
        fit(group[0])
        learned = {k: v for k, v in vars(first).items() if k.endswith("_")}
        for j in group[1:]:
            vars(objects[j]).update(copy.deepcopy(learned))


def epoch_permutations(generators: Sequence[torch.Generator], n: int, epochs: int,
                       device: Any, chunk: int = 32) -> Iterator[torch.Tensor]:
    """For each epoch, the permutations ``[len(generators), n]`` on ``device``: row ``u`` is
    ``torch.randperm(n, generator=generators[u])``, drawn epoch after epoch exactly as a solo
    loop draws them. They are made on the CPU ``chunk`` epochs at a time, so a GPU gets one
    host-to-device copy per chunk rather than one per epoch."""
    for start in range(0, epochs, chunk):
        count = min(chunk, epochs - start)
        block = torch.stack([
            torch.stack([torch.randperm(n, generator=g) for g in generators])
            for _ in range(count)
        ])
        yield from block.to(device)


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


def mlp_linears(net: torch.nn.Module) -> list[torch.nn.Linear]:
    """The ``Linear`` layers of a :func:`build_mlp` network (``Linear -> ReLU`` repeated, then
    ``Linear(., 1)``); ValueError for any other structure."""
    layers = list(net.children()) if isinstance(net, torch.nn.Sequential) else []
    ok = bool(layers) and len(layers) % 2 == 1
    ok = ok and all(isinstance(m, torch.nn.Linear) for m in layers[0::2])
    ok = ok and all(type(m) is torch.nn.ReLU for m in layers[1::2])
    if not ok or layers[-1].out_features != 1 or any(m.bias is None for m in layers[0::2]):
        raise ValueError("not a build_mlp network (Linear -> ReLU ... -> Linear(., 1))")
    return layers[0::2]


class BatchedMLP(torch.nn.Module):
    """R independent :func:`build_mlp` networks evaluated as one, for batched training
    (the hand-stacked module of the MLP selector and MLP recalibrator, see
    :func:`selbench.training.engine.stack_selectors`).

    Every parameter gets a leading replica dimension, so one ``baddbmm`` per layer runs all
    replicas: ``forward(x [R, B, d_in]) -> [R, B]``, the networks' single output (a logit).
    The initial values are copied from ``nets`` (whose own initialisation, seeded per
    replica, is thereby reproduced exactly), and :meth:`write_back` copies the trained
    values into them.

    With ``lanes = L < R`` the replicas come in L *lanes* of ``m = R / L`` consecutive
    replicas that read the same mini-batch (the training β's of one seed, which share the
    fitting sample, the batch order and the noise: see :mod:`selbench.training.engine`), and
    ``forward`` takes ``x [L, B, d_in]``: the first layer of a lane is then one wide matmul
    ``x_l @ [W_1 | ... | W_m]``, cut into ``split`` column blocks so that the CPU threads get
    equal work (5 lanes on 2 threads: 10 blocks). Measured on 2 CPU cores (20 replicas of
    the paper's 512-128-128-1 network, batch 100, forward, backward and Adam): 7.5-8.2 ms a
    step, against 9.6-13.5 ms for the same networks stacked by ``torch.func`` (which runs
    the width-1 output layer as a matmul); the lanes' wide first layer saves a further ~10 %
    of the matmul time on ImageNet's 20-replica methods (``perf/bench_paper.py``).
    """

    def __init__(self, nets: Sequence[torch.nn.Module], lanes: int | None = None,
                 split: int = 1):
        super().__init__()
        per_net = [mlp_linears(net) for net in nets]
        shapes = [tuple(tuple(lin.weight.shape) for lin in lins) for lins in per_net]
        if len(set(shapes)) != 1:
            raise ValueError(f"networks of different shapes cannot be stacked: {set(shapes)}")
        r = len(nets)
        lanes = r if lanes is None else int(lanes)
        if lanes < 1 or r % lanes:
            raise ValueError(f"{r} replicas cannot form {lanes} equal lanes")
        self.replicas, self.lanes, self.per_lane = r, lanes, r // lanes
        u, m = self.lanes, self.per_lane
        self.width0 = int(per_net[0][0].weight.shape[0])
        cols = m * self.width0
        split = max(1, int(split))
        self.split = split if cols % split == 0 and (
            (cols // split) % self.width0 == 0 or self.width0 % (cols // split) == 0
        ) else 1
        self.weights = torch.nn.ParameterList()
        self.biases = torch.nn.ParameterList()
        with torch.no_grad():
            for i in range(len(per_net[0])):
                w = torch.stack([lins[i].weight.detach().t() for lins in per_net])  # [R, in, out]
                b = torch.stack([lins[i].bias.detach() for lins in per_net])[:, None, :]
                if i == 0:  # [L*split, in, m*out/split]: the m replicas of a lane side by side
                    d_in, sp = w.shape[1], self.split
                    w = w.view(u, m, d_in, -1).permute(0, 2, 1, 3).reshape(u, d_in, cols)
                    w = w.view(u, d_in, sp, -1).transpose(1, 2).reshape(u * sp, d_in, -1)
                    b = b.reshape(u * sp, 1, -1)
                self.weights.append(torch.nn.Parameter(w.contiguous().clone()))
                self.biases.append(torch.nn.Parameter(b.contiguous().clone()))

    def _first_layer(self, x: torch.Tensor) -> torch.Tensor:
        """Layer 0 (with its ReLU when more layers follow) as ``[R, B, width0]``."""
        u, batch = x.shape[0], x.shape[1]
        if u != self.lanes:
            raise ValueError(f"x: expected {self.lanes} lanes of inputs, got {u}")
        sp, m, w0 = self.split, self.per_lane, self.width0
        if sp > 1:
            x = x.unsqueeze(1).expand(u, sp, batch, x.shape[-1]).reshape(u * sp, batch, -1)
        h = torch.baddbmm(self.biases[0], x, self.weights[0])  # [L*sp, B, m*w0/sp]
        if len(self.weights) > 1:
            h = torch.relu(h)
        if m == 1 and sp == 1:
            return h
        c = h.shape[-1]
        if c % w0 == 0:  # each block holds whole replicas: [L, sp, B, m/sp, w0]
            h = h.view(u, sp, batch, c // w0, w0).permute(0, 1, 3, 2, 4)
            return h.reshape(self.replicas, batch, w0)
        h = h.view(u, sp, batch, c).permute(0, 2, 1, 3).reshape(u, batch, m, w0)
        return h.transpose(1, 2).reshape(self.replicas, batch, w0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self._first_layer(x)
        last = len(self.weights) - 1
        if last == 0:
            return h.squeeze(-1)
        for i in range(1, last):
            h = torch.relu(torch.baddbmm(self.biases[i], h, self.weights[i]))
        # the output layer (width 1) as a multiply-and-sum: a matmul with one column is
        # slow in every BLAS
        return (h * self.weights[last].transpose(1, 2)).sum(-1) + self.biases[last][:, :, 0]

    @torch.no_grad()
    def write_back(self, nets: Sequence[torch.nn.Module]) -> None:
        """Copy replica ``r``'s trained parameters into ``nets[r]`` (on its own device)."""
        u, m, sp = self.lanes, self.per_lane, self.split
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if i == 0:
                d_in = w.shape[1]
                w = w.view(u, sp, d_in, -1).transpose(1, 2).reshape(u, d_in, -1)
                w = w.view(u, d_in, m, -1).permute(0, 2, 1, 3).reshape(self.replicas, d_in, -1)
                b = b.reshape(self.replicas, 1, -1)
            for r, net in enumerate(nets):
                lin = mlp_linears(net)[i]
                lin.weight.copy_(w[r].t())
                lin.bias.copy_(b[r, 0])


def layout_threads() -> int:
    """The thread count a stacked model's layout is balanced for (:func:`balanced_split`):
    the CPU cores this process may run on (``os.sched_getaffinity``, else ``os.cpu_count``).
    Fixed for the machine, never the thread count a batch actually runs with: that one
    follows the load and ``SELBENCH_TRAIN_THREADS`` (:func:`batched_threads`) and differs
    between an inline run and a pool's workers, and the column blocks decide the last bits
    of a trained replica, so a layout cut by it made one thread and two (or a loaded and an
    idle machine) train different replicas when the lane count was odd (tests/test_threads.py)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores)


def balanced_split(lanes: int, device: Any, threads: int) -> int:
    """How many column blocks :class:`BatchedMLP` should cut each lane's first layer into so
    that the blocks divide evenly among ``threads`` CPU threads (1 on other devices); the
    training schemes pass :func:`layout_threads`, so the layout (and every bit of the
    trained replicas) does not depend on how many threads a batch runs with."""
    if torch.device(device).type != "cpu" or threads <= 1:
        return 1
    return threads // math.gcd(int(lanes), int(threads))


def _as_input(block: np.ndarray, device: torch.device, borrow: bool) -> torch.Tensor:
    """A block of rows as a tensor on ``device``: a new copy, except that with ``borrow`` a
    contiguous, writable block is passed to a CPU module in its own memory (no copy), and
    another device gets the one host-to-device copy (not a host copy first). The values are
    the same either way."""
    block = np.asarray(block)
    if (borrow or device.type != "cpu") and block.flags.c_contiguous and block.flags.writeable:
        return torch.from_numpy(block).to(device)
    return torch.tensor(block).to(device)


@torch.no_grad()
def run_module(module: torch.nn.Module, *arrays: np.ndarray, index: int | None = 0,
               borrow: bool = False) -> np.ndarray:
    """Run ``module`` in eval mode on ``arrays`` (chunked, on the module's device) and
    return output ``index`` of each call (or the sole output when ``index`` is None) as
    float64 numpy.

    ``borrow=True`` promises that the module never writes to its inputs (no in-place op on
    them, as in the built-in modules): on the CPU it then reads the arrays' own memory
    instead of a copy of each block (measured, 2 CPU cores, 48,000 rows: the temperature
    module on 1,000-class logits 0.22 -> 0.16 s, the selector MLP on 512-d features 0.105 ->
    0.07 s). Without it a module may do anything with its input tensors."""
    was_training = module.training
    module.eval()
    device = device_of(module)
    n = len(arrays[0])
    parts = []
    try:
        for start in range(0, max(n, 1), EVAL_CHUNK):
            chunk = [_as_input(a[start : start + EVAL_CHUNK], device, borrow) for a in arrays]
            out = module(*chunk)
            if index is not None:
                out = out[index]
            parts.append(out.detach().to("cpu", torch.float64).numpy())
    finally:
        module.train(was_training)
    return np.concatenate(parts) if parts else np.zeros(0)


