"""The training engine: R ≥ 1 replicas of a small network trained as one model.

Everything selbench trains by gradient descent goes through :func:`train_replicas`: the
learned selector g (with or without the recalibrator h) in the ``selection``,
``sequential`` and ``joint`` schemes, and the MLP recalibrator's own fit. One replica
(R = 1) is the solo case; a leaderboard passes every seed × training β (× loss weight) of
a method at once. Any ``torch.nn.Module`` can be a replica:

* :func:`stack_selectors` / :func:`stack_recalibrators` turn R modules of one class into one module with a leading replica
  dimension. A module class that defines ``stacked`` (the :class:`~selbench.contract.api.StackableModule`
  protocol) gets its own hand-stacked implementation; any other module is stacked with
  ``torch.func`` (:class:`FuncStack`: ``stack_module_state`` + ``functional_call`` +
  ``vmap``), so a third-party trainable selector or differentiable recalibrator is
  batched without writing anything for it. The built-in hand-stacked modules are kept
  because they were measured faster than ``torch.func`` at the paper's sizes
  (``perf/bench_training.py``, engine rows; the MLP selector/recalibrator and the
  temperature and Platt modules of joint training).
* One Adam runs over the stacked parameters (Adam is elementwise: each replica gets
  exactly its own update, weight decay included), and the per-replica losses are summed
  before one backward pass (replicas share no parameter, so each gradient is that of its
  own loss).
* Each replica reads its own data (:class:`Tables`, deduplicated: replicas with equal
  data share one copy) in its own batch order (``torch.randperm`` of a generator seeded by
  its seed, epoch after epoch) with its own input noise (a generator seeded by ``seed +
  1``); replicas with equal seeds share the draws.
* Replicas with equal data and seed (the training β's of a seed) form a *lane*: they read
  the same batch, which a module class that declares ``stacks_lanes`` receives once per
  lane (:func:`lane_order`; the hand-stacked MLP selector then runs one wide first-layer
  GEMM per lane, measured as fast as the old engine's "streams", ``perf/README.md``).
* Replicas may differ in learning rate, number of epochs and input noise (the trials of a
  tuned method, :mod:`selbench.execution.tuning`): they train with
  :class:`~selbench.training.hyper.ReplicaAdam` (Adam with each replica's rate) for the
  largest number of epochs, a replica frozen (rate 0: its parameters stay exactly those
  after its own last epoch) from then on, each replica's noise draw scaled by its own std;
  its batch order and draws of its own epochs are those of its solo training. Equal values
  are the usual training (the fused Adam), unchanged.
* On a GPU the step (gathers, forward, backward, Adam) is captured in a CUDA graph per
  batch length and replayed (:class:`GraphedSteps`): a step of a few small replicas is
  bound by the host launching its ~60 kernels, and one replay launches them all (measured
  5.5x on an H200 for 100 replicas of the paper's MLP, ``perf/README.md``).

**Replica independence.** A replica's arithmetic is the same whichever replicas train
with it, except that CPU (and GPU) kernels may sum a reduction in another order for other
batch shapes (measured: weights after 400 steps of the paper's MLP differ by up to ~1e-7
relative when trained with 0 or 6 others). The replicas' results therefore agree with
each one trained alone to float32 rounding, not bit for bit; ``tests/test_engine.py``
bounds the difference (``REPLICA_RTOL``), and a resumed or extended run reproduces an
uninterrupted one's metrics to that tolerance (about the 7th significant digit of a
metric; the leaderboard's printed digits do not move). Measured (issue 34), the differences
come from where a replica stands: the last elements of a tensor (its tail, shorter than a
vector) and a stack of one replica run on other kernel paths. So the built-in callers (the
MLP recalibrator, the training schemes) train a spare replica last and discard it: each
replica kept is then bit for bit the same whichever others train with it (with one
training β per seed; the selector's lanes of ``per_beta`` training still differ in the last
bits), ``tests/test_cell_independence.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from selbench.training.graphs import GraphedSteps, cuda_graphs_enabled
from selbench.training.hyper import ReplicaAdam, noise_scale, per_replica, replica_optimizer
from selbench.training.torchutils import (
    batched_adam,
    batched_threads,
    cpu_threads,
    epoch_permutations,
)

__all__ = [
    "REPLICA_RTOL",
    "lane_order",
    "FuncRecalibratorStack",
    "FuncStack",
    "ReplicaData",
    "ReplicaHyper",
    "Schedule",
    "Tables",
    "TrainingJob",
    "TrainingState",
    "cuda_graphs_enabled",
    "restack_state",
    "stack_recalibrators",
    "stack_selectors",
    "train_replicas",
]

#: relative tolerance between a replica trained with others and trained alone (float32
#: rounding of reductions summed in another order; see the module docstring)
REPLICA_RTOL = 1e-4


def _func_call(base: torch.nn.Module, method: str | None):
    """``f(params, buffers, *args)``: ``base``'s forward (or ``method``) with the given state."""
    from torch.func import functional_call

    if method is None:
        def call(params, buffers, *args):
            return functional_call(base, (params, buffers), args)
    else:
        wrapper = _Method(base, method)

        def call(params, buffers, *args):
            params = {f"m.{k}": v for k, v in params.items()}
            buffers = {f"m.{k}": v for k, v in buffers.items()}
            return functional_call(wrapper, (params, buffers), args)
    return call


class _Method(torch.nn.Module):
    """``forward`` that calls another method of ``m`` (so ``functional_call`` can run it)."""

    def __init__(self, m: torch.nn.Module, name: str):
        super().__init__()
        self.m = m
        self.name = name

    def forward(self, *args):
        return getattr(self.m, self.name)(*args)


class FuncStack(torch.nn.Module):
    """R modules of one class as one, through ``torch.func`` (any ``torch.nn.Module``).

    The replicas' parameters and buffers are stacked along a new leading dimension
    (``torch.func.stack_module_state``); :meth:`forward` maps the replicas' own ``forward``
    over it (``vmap`` of ``functional_call``): every tensor argument has a leading
    dimension R (``None`` passes through), every output gains one. :meth:`call` runs
    another method the same way (``predict``), and :meth:`write_back` copies the trained
    values into the replicas' own modules. Randomness inside a module (dropout) draws
    differently per replica.
    """

    def __init__(self, modules: Sequence[torch.nn.Module]):
        super().__init__()
        from torch.func import stack_module_state

        params, buffers = stack_module_state(list(modules))
        self._names = list(params)
        self._buffer_names = list(buffers)
        self.stacked_params = torch.nn.ParameterList(
            torch.nn.Parameter(params[k].detach().clone()) for k in self._names
        )
        for i, k in enumerate(self._buffer_names):
            self.register_buffer(f"stacked_buffer_{i}", buffers[k].detach().clone())
        base = copy.deepcopy(modules[0]).to("meta")
        self.__dict__["_base"] = base  # not a submodule: its (meta) state is never used
        self.replicas = len(modules)
        for attr in ("uses_features", "changes_prediction", "cuda_graphs"):
            if hasattr(modules[0], attr):
                setattr(self, attr, getattr(modules[0], attr))

    def _state(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        params = dict(zip(self._names, self.stacked_params))
        buffers = {k: getattr(self, f"stacked_buffer_{i}")
                   for i, k in enumerate(self._buffer_names)}
        return params, buffers

    def call(self, method: str | None, *args: Any) -> Any:
        """``method`` (``None``: forward) of every replica, mapped over the leading dimension."""
        from torch.func import vmap

        self._base.train(self.training)
        params, buffers = self._state()
        in_dims = (0, 0, *[None if a is None else 0 for a in args])
        inner = _func_call(self._base, method)
        absent: list[int] = []

        def call(*a):  # vmap maps tensors only: a None output (no log_probs) is set aside
            out = inner(*a)
            if not isinstance(out, tuple):
                return out
            absent[:] = [i for i, o in enumerate(out) if o is None]
            return tuple(torch.zeros(()) if o is None else o for o in out)

        out = vmap(call, in_dims=in_dims, randomness="different")(params, buffers, *args)
        if absent:
            out = tuple(None if i in absent else o for i, o in enumerate(out))
        return out

    def forward(self, *args: Any) -> Any:
        return self.call(None, *args)

    @torch.no_grad()
    def write_back(self, modules: Sequence[torch.nn.Module]) -> None:
        params, buffers = self._state()
        for r, module in enumerate(modules):
            own = dict(module.named_parameters())
            for k, v in params.items():
                own[k].copy_(v[r])
            own_buffers = dict(module.named_buffers())
            for k, v in buffers.items():
                own_buffers[k].copy_(v[r])


def _check_stackable(modules: list[torch.nn.Module]) -> type:
    cls = type(modules[0])
    if any(type(m) is not cls for m in modules):
        raise ValueError("replicas of different module classes cannot be stacked: "
                         + ", ".join(sorted({type(m).__name__ for m in modules})))
    shapes = {tuple((k, tuple(v.shape)) for k, v in m.state_dict().items()) for m in modules}
    if len(shapes) != 1:
        raise ValueError(f"replicas of {cls.__name__} with different shapes cannot be stacked")
    return cls


def stack_selectors(modules: Sequence[torch.nn.Module]) -> torch.nn.Module:
    """R selector networks (``[B, d_in] -> ĝ [B]``) as one
    (:class:`~selbench.contract.api.StackedSelectorModule`: ``[R, B, d_in] -> [R, B]``): the class's
    own ``stacked`` where it has one (hand-stacked, :class:`~selbench.contract.api.StackableModule`),
    else a :class:`FuncStack`."""
    modules = list(modules)
    maker = getattr(_check_stackable(modules), "stacked", None)
    return maker(modules) if callable(maker) else FuncStack(modules)


class FuncRecalibratorStack(FuncStack):
    """R recalibrator modules (:class:`~selbench.contract.api.RecalibratorModule`) as one
    :class:`~selbench.contract.api.StackedRecalibratorModule`, through ``torch.func``: the per-example
    tables are the logits (and the labels), a step maps the modules' own ``forward`` over the
    replicas and reads the label's log-probability off each replica's vector; a
    :class:`~selbench.contract.api.PredictingModule` replica's ``predict`` gives :meth:`correct`."""

    def __init__(self, modules: Sequence[torch.nn.Module]):
        super().__init__(modules)
        self.uses_features = bool(getattr(modules[0], "uses_features", True))
        first = modules[0]
        self.changes_prediction = bool(getattr(first, "changes_prediction", False)) and \
            callable(getattr(first, "predict", None))

    @torch.no_grad()
    def prepare(self, logits: torch.Tensor, features: torch.Tensor | None,
                labels: torch.Tensor | None) -> dict[str, torch.Tensor]:
        out = {"logits": logits}
        if labels is not None:
            out["labels"] = labels
        return out

    def forward(self, batch: dict[str, torch.Tensor], features: torch.Tensor | None,
                need_log_prob: bool):
        conf, log_probs = self.call(None, batch["logits"], features)
        if not need_log_prob or log_probs is None:
            return conf, None
        return conf, log_probs.gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def correct(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        pred = self.call("predict", batch["logits"], None)
        return (pred == batch["labels"]).float()


def stack_recalibrators(modules: Sequence[torch.nn.Module]) -> torch.nn.Module:
    """R recalibrator modules as one :class:`~selbench.contract.api.StackedRecalibratorModule`: the
    class's own ``stacked`` where it has one, else a :class:`FuncRecalibratorStack`."""
    modules = list(modules)
    maker = getattr(_check_stackable(modules), "stacked", None)
    return maker(modules) if callable(maker) else FuncRecalibratorStack(modules)


@dataclass
class Tables:
    """Per-example data of R replicas, stored once per distinct copy.

    ``data[name]`` is ``[U, n, ...]`` (U distinct sources) and ``source[r]`` the row of
    replica ``r``. :meth:`add` deduplicates: a replica whose arrays equal an earlier
    source's (all of them) reads that source.
    """

    n: int
    source: list[int] = field(default_factory=list)
    _arrays: list[dict[str, np.ndarray]] = field(default_factory=list)
    data: dict[str, torch.Tensor] = field(default_factory=dict)

    def add(self, arrays: dict[str, np.ndarray]) -> int:
        """Register one replica's arrays (each ``[n, ...]``); returns its source index."""
        for u, known in enumerate(self._arrays):
            if known.keys() == arrays.keys() and all(
                known[k].dtype == arrays[k].dtype and np.array_equal(known[k], arrays[k])
                for k in arrays
            ):
                self.source.append(u)
                return u
        for k, a in arrays.items():
            if a.shape[0] != self.n:
                raise ValueError(f"{k}: expected {self.n} rows, got {a.shape[0]}")
        self._arrays.append(arrays)
        self.source.append(len(self._arrays) - 1)
        return len(self._arrays) - 1

    def to(self, device: Any, dtypes: dict[str, torch.dtype]) -> dict[str, torch.Tensor]:
        """The stacked tables ``{name: [U, n, ...]}`` on ``device``."""
        out = {}
        for k in self._arrays[0]:
            out[k] = torch.stack([
                torch.as_tensor(np.ascontiguousarray(a[k])) for a in self._arrays
            ]).to(device=device, dtype=dtypes.get(k))
        self.data = out
        return out


def lane_order(source: Sequence[int], seeds: Sequence[int]) -> tuple[list[int], int]:
    """Arrange R replicas in *lanes*: replicas with the same data source and seed read
    identical mini-batches (same rows, same noise). Returns ``(order, lanes)``: ``order``
    lists the replica indices lane by lane (lanes in order of first appearance); when the
    lanes are not all of one size, every replica is its own lane (``order = range(R)``,
    ``lanes = R``), as lane-reading modules need ``R / lanes`` replicas per lane."""
    groups: dict[tuple[int, int], list[int]] = {}
    for r, key in enumerate(zip(source, seeds)):
        groups.setdefault((int(key[0]), int(key[1])), []).append(r)
    if len({len(g) for g in groups.values()}) != 1:
        return list(range(len(seeds))), len(seeds)
    return [r for g in groups.values() for r in g], len(groups)


def _gather(table: torch.Tensor, rows: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """``table [U, n, ...]`` at flat rows ``u * n + i`` -> ``[R, B, ...]``."""
    flat = table.reshape(table.shape[0] * table.shape[1], *table.shape[2:])
    return flat.index_select(0, rows).view(*shape, *table.shape[2:])


@dataclass
class _Lanes:
    """How the R replicas address the tables' flat rows ``u * n + i``: ``lane[r]`` is the
    index of replica ``r``'s seed among the distinct seeds (the permutation it reads),
    ``offsets[r]`` its source's first flat row (``[R, 1]``); ``first`` lists the first
    replica of each lane when tables come once per lane (empty otherwise), and
    ``lane_of_lane`` / ``offsets_lane`` are ``lane`` / ``offsets`` at those replicas (the
    replicas' own where there are no lane tables)."""

    lane: torch.Tensor
    offsets: torch.Tensor
    first: list[int]
    lane_of_lane: torch.Tensor
    offsets_lane: torch.Tensor


def _lanes(source: Sequence[int], seeds: Sequence[int], distinct: list[int], n: int,
           device: torch.device, lane_tables: Sequence[str]) -> _Lanes:
    """The replicas' :class:`_Lanes` (ValueError when ``lane_tables`` are named and the
    replicas are not in equal, consecutive lanes)."""
    r_count = len(seeds)
    lane = torch.tensor([distinct.index(int(s)) for s in seeds], device=device)
    offsets = torch.tensor([int(u) * n for u in source], device=device)[:, None]
    lane_first: list[int] = []  # the first replica of each lane
    if lane_tables:
        order, lanes = lane_order(source, seeds)
        if order != list(range(r_count)):
            raise ValueError("lane_tables: the replicas are not in equal, consecutive lanes")
        lane_first = list(range(0, r_count, r_count // lanes))
    lane_of_lane = lane[lane_first] if lane_first else lane
    offsets_lane = offsets[lane_first] if lane_first else offsets
    return _Lanes(lane, offsets, lane_first, lane_of_lane, offsets_lane)


@dataclass(frozen=True)
class ReplicaData:
    """What R replicas read: ``tables`` (``{name: [U, n, ...]}``, :class:`Tables`), the
    source row ``source[r]`` and seed ``seeds[r]`` of each replica, the tables that get
    input noise (``noise``: ``(name, width)`` in drawing order) and those that come once per
    lane (``lane_tables``)."""

    tables: dict[str, torch.Tensor]
    source: Sequence[int]
    seeds: Sequence[int]
    noise: Sequence[tuple[str | None, int]] = ()
    lane_tables: Sequence[str] = ()


@dataclass(frozen=True)
class ReplicaHyper:
    """The replicas' training hyper-parameters: ``epochs``, ``lr`` and ``noise_std`` one
    value or one per replica (:mod:`selbench.training.hyper`), ``owners`` the replica of
    each stacked parameter element where they differ (None: the leading dimension)."""

    epochs: int | Sequence[int]
    lr: float | Sequence[float]
    weight_decay: float = 0.0
    noise_std: float | Sequence[float] = 0.0
    owners: Sequence[torch.Tensor] | None = None


@dataclass(frozen=True)
class Schedule:
    """How the steps run: mini-batches of ``batch_size`` on ``device``, under a progress
    bar named ``desc`` (None: none)."""

    batch_size: int
    device: Any
    desc: str | None = None


@dataclass(frozen=True)
class TrainingJob:
    """One call of :func:`train_replicas`: the stacked ``modules`` (on the schedule's
    device), ``step_loss(batch) -> [R]`` (the per-replica losses of a batch
    ``{name: [R, B, ...]}``), the data the replicas read, the schedule and the per-replica
    hyper-parameters. Made by the callers of the engine (the training schemes, the MLP
    recalibrator), consumed by :func:`train_replicas`."""

    modules: Sequence[torch.nn.Module]
    step_loss: Callable[[dict[str, torch.Tensor]], torch.Tensor]
    data: ReplicaData
    schedule: Schedule
    hyper: ReplicaHyper


@dataclass(frozen=True)
class TrainingState:
    """Where a training stands after :func:`train_replicas` (what a later call continues
    from, ``resume``): the epochs trained, the Adam steps taken, Adam's moments of each
    stacked parameter (``exp_avg``, ``exp_avg_sq``, in the parameters' order) and the
    generators of each distinct seed (batch order, input noise or None), advanced past
    the epochs trained. A replica continued from it reads the batch orders and noise of
    its next epochs exactly as an uninterrupted training does."""

    epoch: int
    steps: int
    exp_avg: tuple[torch.Tensor, ...]
    exp_avg_sq: tuple[torch.Tensor, ...]
    generators: dict[int, tuple[torch.Generator, torch.Generator | None]]


@dataclass(frozen=True)
class _Steps:
    """The epoch loop's step: ``step`` (eager), ``draw_noise``, the CUDA ``graphs`` (or
    None) and the ``on_epoch(e)`` hook (or None)."""

    step: Callable[..., None]
    draw_noise: Callable[[int], list[torch.Tensor | None]]
    graphs: GraphedSteps | None
    on_epoch: Callable[[int], None] | None


def _generators(distinct: list[int], device: torch.device, noisy: bool,
                resume: TrainingState | None
                ) -> tuple[list[torch.Generator], list[torch.Generator]]:
    """The generators of the distinct seeds: the batch orders' (on the CPU, seeded by the
    seed) and the input noise's (on ``device``, seeded by the seed + 1; none when ``noisy``
    is false), or those ``resume`` carries on."""
    if resume is not None:
        gens = [resume.generators[s] for s in distinct]
        return [g for g, _ in gens], ([n for _, n in gens] if noisy else [])
    shuffles = [torch.Generator().manual_seed(s) for s in distinct]
    noise_gens = []
    if noisy:
        noise_gens = [torch.Generator(device=device).manual_seed(s + 1) for s in distinct]
    return shuffles, noise_gens


def _epoch_progress(epochs: int, desc: str | None) -> Any:
    """``range(epochs)``, under a progress bar named ``desc`` when one is given (plain lines
    off a terminal: :func:`selbench.util.progress.progress_bar`)."""
    epoch_iter: Any = range(int(epochs))
    if desc is not None:
        from selbench.util.progress import progress_bar

        epoch_iter = progress_bar(epoch_iter, desc=desc, unit="epoch")
    return epoch_iter


def _step_functions(job: TrainingJob, lanes: _Lanes, noise_std: float | torch.Tensor,
                    noise_gens: list[torch.Generator], optimizer: Any, device: torch.device,
                    ) -> tuple[Callable[..., None], Callable[[int], list[torch.Tensor | None]]]:
    """The eager training step ``step(rows, lane_rows, draws, b)`` (gather the batch, add
    the input noise, one backward of the summed losses, one Adam step: what a CUDA graph
    captures) and ``draw_noise(b)``, the step's noise draws in their eager order.
    ``noise_std`` is one std, or one per replica (``[R, 1, 1]``: each replica's draw scaled
    by its own, the lane tables' by their lane's)."""
    tables, lane_tables, noise = job.data.tables, job.data.lane_tables, job.data.noise
    step_loss, r_count = job.step_loss, len(job.data.seeds)
    lane, lane_of_lane = lanes.lane, lanes.lane_of_lane
    lane_count = len(lanes.first)
    lane_std = noise_std
    if isinstance(noise_std, torch.Tensor) and lanes.first:
        lane_std = noise_std.index_select(0, torch.tensor(lanes.first, device=device))

    def gather(rows: torch.Tensor, lane_rows: torch.Tensor | None,
               draws: Sequence[torch.Tensor | None], b: int) -> dict[str, torch.Tensor]:
        batch = {}
        for k, t in tables.items():
            if k in lane_tables:
                batch[k] = _gather(t, lane_rows, (lane_count, b))
            else:
                batch[k] = _gather(t, rows, (r_count, b))
        for (name, _), draw in zip(noise, draws):
            if name is not None and draw is not None:
                draw = draw.index_select(0, lane_of_lane if name in lane_tables else lane)
                std = lane_std if name in lane_tables else noise_std
                batch[name] = batch[name] + std * draw.to(batch[name].dtype)
        return batch

    def step(rows: torch.Tensor, lane_rows: torch.Tensor | None,
             draws: Sequence[torch.Tensor | None], b: int) -> None:
        total = step_loss(gather(rows, lane_rows, draws, b)).sum()
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        optimizer.step()

    def draw_noise(b: int) -> list[torch.Tensor | None]:
        if not noise_gens:
            return [None] * len(noise)
        return [torch.stack([torch.randn((b, width), generator=gen, device=device)
                             for gen in noise_gens]) for _, width in noise]

    return step, draw_noise


def _run_epochs(steps: _Steps, perms: Iterator[torch.Tensor], epoch_iter: Any, lanes: _Lanes,
                n: int, bs: int) -> None:
    """The epoch loop: every epoch's rows in mini-batches of ``bs``, each step replayed
    through ``steps.graphs`` when it can be, else run eagerly (the inner loop calls nothing
    but the step); ``steps.on_epoch(e)`` is called before epoch ``e`` (0, 1, ...)."""
    lane, offsets = lanes.lane, lanes.offsets
    lane_of_lane, offsets_lane, lane_first = lanes.lane_of_lane, lanes.offsets_lane, lanes.first
    graphs, step, draw_noise, on_epoch = steps.graphs, steps.step, steps.draw_noise, \
        steps.on_epoch
    for epoch, perm in zip(epoch_iter, perms):
        if on_epoch is not None:
            on_epoch(epoch)
        rows_all = perm.index_select(0, lane) + offsets  # [R, n]
        rows_lane = perm.index_select(0, lane_of_lane) + offsets_lane if lane_first else None
        for start in range(0, n, bs):
            stop = min(start + bs, n)
            rows = rows_all[:, start:stop]
            lane_rows = rows_lane[:, start:stop] if rows_lane is not None else None
            if graphs is not None and graphs.run(rows, lane_rows, stop - start):
                continue
            step(rows.reshape(-1), None if lane_rows is None else lane_rows.reshape(-1),
                 draw_noise(stop - start), stop - start)


def _optimizer(job: TrainingJob, params: list[torch.Tensor], resume: TrainingState | None
               ) -> tuple[torch.optim.Optimizer, int, Callable[[int], None] | None]:
    """The optimiser, the number of epochs and the ``on_epoch`` hook
    (:func:`~selbench.training.hyper.replica_optimizer`); continuing ``resume``, a
    :class:`~selbench.training.hyper.ReplicaAdam` holding its moments and steps (the
    replicas then train one number of epochs)."""
    hyper, r_count = job.hyper, len(job.data.seeds)
    if resume is None:
        return replica_optimizer(params, r_count, hyper.lr, hyper.epochs, hyper.weight_decay,
                                 lanes=bool(job.data.lane_tables), owners=hyper.owners)
    epochs = per_replica(hyper.epochs, r_count, "epochs", int)
    if isinstance(epochs, tuple):
        raise ValueError("resume: the replicas continue for one number of epochs")
    rates = per_replica(hyper.lr, r_count, "lr", float)
    if not isinstance(rates, tuple):  # one rate: the fused Adam, continued
        optimizer = batched_adam(params, rates, hyper.weight_decay)
        for p, m, v in zip(params, resume.exp_avg, resume.exp_avg_sq):
            optimizer.state[p] = {
                "step": torch.tensor(float(resume.steps), dtype=torch.float32,
                                     device=p.device if _fused(optimizer) else "cpu"),
                "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
        return optimizer, epochs, None
    optimizer = ReplicaAdam(params, rates, hyper.weight_decay, hyper.owners)
    optimizer.load_moments(resume.steps, resume.exp_avg, resume.exp_avg_sq)
    return optimizer, epochs, None


def _fused(optimizer: torch.optim.Optimizer) -> bool:
    return all(group.get("fused") for group in optimizer.param_groups)


def _state(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], epoch: int,
           distinct: list[int], shuffles: list[torch.Generator],
           noise_gens: list[torch.Generator]) -> TrainingState:
    """The :class:`TrainingState` after a training (Adam's moments: the
    :class:`~selbench.training.hyper.ReplicaAdam`'s, or the torch Adam's state)."""
    if isinstance(optimizer, ReplicaAdam):
        steps, exp_avg, exp_avg_sq = optimizer.moments()
    else:
        states = [optimizer.state.get(p, {}) for p in params]
        steps = int(states[0]["step"]) if states and "step" in states[0] else 0
        exp_avg = tuple(s.get("exp_avg", torch.zeros_like(p)) for s, p in zip(states, params))
        exp_avg_sq = tuple(s.get("exp_avg_sq", torch.zeros_like(p))
                           for s, p in zip(states, params))
    gens = {s: (g, noise_gens[u] if noise_gens else None)
            for u, (s, g) in enumerate(zip(distinct, shuffles))}
    return TrainingState(epoch, steps, tuple(t.detach() for t in exp_avg),
                         tuple(t.detach() for t in exp_avg_sq), gens)


def train_replicas(job: TrainingJob, resume: TrainingState | None = None) -> TrainingState:
    """Train the stacked ``job.modules`` (already on the schedule's device) in place; the
    :class:`TrainingState` reached (what a later call may continue with ``resume``).

    Every epoch, replica ``r`` reads the rows of its source ``source[r]`` of every table
    (``{name: [U, n, ...]}``) in the order ``torch.randperm(n)`` of a generator seeded by
    ``seeds[r]``, in mini-batches of ``batch_size``. ``noise`` lists, in drawing order, the
    tables that get Gaussian noise of std ``noise_std`` at every step (``(name, width)``;
    a ``None`` name draws ``[B, width]`` and discards it, as a field the replica does not
    read), from a generator seeded by ``seeds[r] + 1``. ``step_loss(batch)`` receives the
    batch ``{name: [R, B, ...]}`` and returns the per-replica losses ``[R]`` (or their
    sum), summed for one backward pass; one Adam (``lr``, ``weight_decay``) updates all
    parameters (:class:`TrainingJob`).

    ``epochs``, ``lr`` and ``noise_std`` are one value or one per replica (see the module
    docstring); ``owners`` then gives, for each parameter of ``modules`` in order, the
    replica of each element (:func:`~selbench.training.hyper.replica_owners`; None: the
    leading dimension). With ``resume`` the replicas (restacked by the caller, with the
    state's moments laid out as their parameters, :func:`restack_state`) continue a
    training for ``epochs`` more epochs, one number for all.

    The tables named in ``lane_tables`` come once per lane instead, ``[L, B, ...]``: the
    replicas must then be in lanes of equal size, consecutive, as :func:`lane_order`
    arranges them (ValueError otherwise), for modules that read a lane's batch once (the
    hand-stacked MLP's wide first layer).

    On a CUDA device the step is captured in CUDA graphs (:func:`cuda_graphs_enabled`):
    the same kernels replayed, so the same numbers as the eager step, at a fraction of the
    host's launch cost.
    """
    data, r_count = job.data, len(job.data.seeds)
    n = int(next(iter(data.tables.values())).shape[1])
    device = torch.device(job.schedule.device)
    distinct = list(dict.fromkeys(int(s) for s in data.seeds))
    lanes = _lanes(data.source, data.seeds, distinct, n, device, data.lane_tables)
    params = [p for m in job.modules for p in m.parameters()]
    optimizer, epochs, on_epoch = _optimizer(job, params, resume)
    noise_std = noise_scale(job.hyper.noise_std, r_count, device, lanes.first)
    noisy = isinstance(noise_std, torch.Tensor) or noise_std > 0
    shuffles, noise_gens = _generators(distinct, device, noisy and bool(data.noise), resume)
    epoch_iter = _epoch_progress(epochs, job.schedule.desc)
    # one replica trains with one thread: its matmuls are too small to gain from more (see
    # cpu_threads); R replicas' batched matmuls are large enough that all threads pay
    threads = 1 if r_count == 1 else batched_threads(device)
    for m in job.modules:
        m.train()
    step, draw_noise = _step_functions(job, lanes, noise_std, noise_gens, optimizer, device)
    graphs = GraphedSteps.create(device, job.modules, optimizer, step, data.noise, noise_gens)
    with cpu_threads(device, threads), (graphs.stream() if graphs else nullcontext()):
        perms = epoch_permutations(shuffles, n, int(epochs), device)
        _run_epochs(_Steps(step, draw_noise, graphs, on_epoch), perms, epoch_iter, lanes, n,
                    int(job.schedule.batch_size))
    for m in job.modules:
        m.eval()
    start = 0 if resume is None else resume.epoch
    return _state(optimizer, params, start + int(epochs), distinct, shuffles, noise_gens)


@torch.no_grad()
def restack_state(state: TrainingState, parts: Sequence[tuple[torch.nn.Module, list, Callable]],
                  keep: Sequence[int]) -> TrainingState:
    """``state`` for the replicas ``keep`` restacked: ``parts`` lists, for each stacked
    module of the training (its parameters in the optimiser's order), ``(stack, replicas,
    make)``: the stacked module, its R replica modules and ``make(modules)``, which stacks
    replica modules as the caller's new stack does. Each moment is laid out as the new
    stack's parameters by the modules' own ``write_back`` and stacking: set as the old
    stack's parameters, written back into copies of the kept replicas, stacked again (the
    old stack's values are restored after), so any stacked layout works."""
    moments: list[list[torch.Tensor]] = [[], []]
    at = 0
    for stack, replicas, make in parts:
        own = list(stack.parameters())
        saved = [p.detach().clone() for p in own]
        for k, tensors in enumerate((state.exp_avg, state.exp_avg_sq)):
            for p, t in zip(own, tensors[at: at + len(own)]):
                p.copy_(t)
            copies = [copy.deepcopy(m) for m in replicas]
            stack.write_back(copies)
            moments[k] += [p.detach().clone()
                           for p in make([copies[r] for r in keep]).parameters()]
        for p, v in zip(own, saved):
            p.copy_(v)
        at += len(own)
    return replace(state, exp_avg=tuple(moments[0]), exp_avg_sq=tuple(moments[1]))
