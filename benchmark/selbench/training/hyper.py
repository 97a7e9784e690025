"""Per-replica training hyperparameters for :func:`selbench.training.engine.train_replicas`:
replicas that differ in learning rate, number of epochs or input noise (the trials of a tuned
method, :mod:`selbench.execution.tuning`) still train as one model.

* :func:`per_replica` reads an engine argument given as one value or one value per replica;
  equal values collapse to the one value, so such a call takes the engine's usual path (the
  fused Adam of :func:`~selbench.training.torchutils.batched_adam`) unchanged.
* :class:`ReplicaAdam` is Adam with a learning rate per replica (the leading dimension of
  every stacked parameter): Adam is elementwise, so replica ``r`` gets exactly the update of
  an Adam with ``lr[r]``, to float rounding. :meth:`ReplicaAdam.freeze` sets a replica's rate
  to 0, which leaves its parameters exactly as they are (``p + 0·u == p``): how a replica
  that trains fewer epochs than the others stops after its own last epoch.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

from selbench.training.torchutils import batched_adam

__all__ = ["ReplicaAdam", "noise_scale", "per_replica", "replica_optimizer", "replica_owners"]


def per_replica(value: Any, replicas: int, name: str, cast: type) -> Any:
    """``value`` (one number, or a sequence of one per replica) as ``cast(value)`` when every
    replica has the same, else as a tuple of ``replicas`` values (ValueError for a sequence
    of another length)."""
    if isinstance(value, (int, float)) or (hasattr(value, "ndim") and value.ndim == 0):
        return cast(value)
    values = tuple(cast(v) for v in value)
    if len(values) != replicas:
        raise ValueError(f"{name}: expected one value or {replicas} (one per replica), "
                         f"got {len(values)}")
    if len(set(values)) == 1:
        return values[0]
    return values


@torch.no_grad()
def replica_owners(stacked: torch.nn.Module, replicas: Sequence[torch.nn.Module]
                   ) -> list[torch.Tensor]:
    """For each parameter of ``stacked`` (R ``replicas`` stacked as one: a stacked module of
    :mod:`selbench.contract.modules`), the replica that owns each of its elements (int64,
    the parameter's shape; -1 where none does), read off the module's own ``write_back``:
    the parameters are set to their elements' indices, written back into copies of the
    replicas (the stacked values are restored after), and each index found in replica
    ``r`` is ``r``'s. Any layout works (a leading replica dimension, one flat tensor,
    lanes side by side). Float32 or float64 parameters of fewer than 2**24 elements in all
    (the indices must be exact), else ValueError."""
    params = list(stacked.parameters())
    total = sum(p.numel() for p in params)
    if total >= 2 ** 24 or any(p.dtype not in (torch.float32, torch.float64) for p in params):
        raise ValueError("a learning rate per replica reads the stacked parameters' layout "
                         "off write_back: float32 or float64 parameters of fewer than 2**24 "
                         "elements in all")
    copies = [copy.deepcopy(m) for m in replicas]
    for m in copies:
        for q in m.parameters():
            q.fill_(-1.0)
    saved = [p.detach().clone() for p in params]
    at = 0
    try:
        for p in params:
            p.copy_(torch.arange(at, at + p.numel(), dtype=p.dtype).view_as(p))
            at += p.numel()
        stacked.write_back(copies)
    finally:
        for p, v in zip(params, saved):
            p.copy_(v)
    owner = torch.full((total,), -1, dtype=torch.int64)
    for r, m in enumerate(copies):
        for q in m.parameters():
            index = q.detach().to("cpu", torch.float64).reshape(-1)
            index = index[index != -1.0]
            if not bool(((index >= 0) & (index < total) & (index == index.round())).all()):
                raise ValueError(f"{type(stacked).__name__}.write_back does not copy the "
                                 "stacked values: the replica of each element is unknown")
            owner[index.long()] = r
    return [part.view(p.shape) for part, p in
            zip(owner.split([p.numel() for p in params]), params)]


class ReplicaAdam(torch.optim.Optimizer):
    """Adam (``torch.optim.Adam``'s arithmetic: L2 ``weight_decay`` added to the gradient,
    bias-corrected moments) over stacked parameters, with learning rate ``lr[r]`` for the
    elements of replica ``r``: ``owners`` gives each parameter's element owners
    (:func:`replica_owners`; an element no replica owns is never updated), or, None, every
    parameter's leading dimension is the replica.

    It runs as ``torch._foreach_*`` operations (one pass per operation over all parameters)
    in the fused Adam's order of operations, the step ``p += (s · m) / (√v / √(1 - β2^t) +
    ε)`` with ``s = -lr[owner] / (1 - β1^t)`` per element: on the CPU a replica's update is
    the fused kernel's bit for bit (measured on 100 steps of 2 × 4,225 elements; a tensor's
    last ``numel % 16`` elements, which the kernel does not vectorise, may differ in the last
    bit), so a replica ends where its solo training does. Measured on one CPU thread, 10
    replicas of the tuned digits selector (64 -> 64 -> 1) and a temperature: 158 µs a step
    against the fused Adam's 24 µs (of about 0.9 ms a training step). There is no CUDA-graph
    path for it (the engine captures only the fused Adam): on a GPU it steps eagerly.
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: Sequence[float], weight_decay: float,
                 owners: Sequence[torch.Tensor] | None = None,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        params = list(params)
        replicas = len(lr)
        super().__init__(params, {"weight_decay": float(weight_decay), "betas": betas,
                                  "eps": float(eps)})
        device, dtype = params[0].device, params[0].dtype
        if any(p.dtype != dtype for p in params):
            raise ValueError("ReplicaAdam: every stacked parameter must have one dtype")
        self.rates = torch.tensor([*map(float, lr), 0.0], dtype=torch.float64)  # host; [R]: 0
        self.steps = 0
        self._sizes = torch.zeros(replicas + 1, dtype=dtype, device=device)
        if owners is None:
            for p in params:
                if p.dim() == 0 or p.shape[0] != replicas:
                    raise ValueError(
                        f"a learning rate per replica needs the replica of each parameter: "
                        f"a leading dimension of {replicas} replicas, or owners; got a "
                        f"parameter of shape {tuple(p.shape)}")
        # each element's step size: a view of the replicas' sizes where a parameter's leading
        # dimension is the replica, else gathered by owner (-1, no replica, reads the last
        # size, always 0)
        self._views: list[torch.Tensor] = []
        self._gathers: list[tuple[torch.Tensor, torch.Tensor]] = []
        leading = self._sizes[:replicas]
        for i, p in enumerate(params):
            shape = (replicas, *[1] * (p.dim() - 1))
            if owners is None or _leading(owners[i], replicas):
                self._views.append(leading.view(shape))
                continue
            view = torch.empty_like(p)
            owner = torch.where(owners[i].reshape(-1) < 0, replicas, owners[i].reshape(-1))
            self._gathers.append((view.view(-1), owner.to(device)))
            self._views.append(view)
        # the moments and the step's denominator live in one flat buffer each (a view per
        # parameter): √v and the operations that need no parameter or gradient run once
        # on the buffer instead of once per parameter (the same arithmetic, element by
        # element)
        self._numels = [p.numel() for p in params]
        total = sum(self._numels)
        self._m_flat = torch.zeros(total, dtype=dtype, device=device)
        self._v_flat = torch.zeros(total, dtype=dtype, device=device)
        self._denom = torch.empty(total, dtype=dtype, device=device)
        self._exp_avg = _views_of(self._m_flat, params)
        self._exp_avg_sq = _views_of(self._v_flat, params)
        self._denoms = _views_of(self._denom, params)

    def freeze(self, replicas: Sequence[int]) -> None:
        """Learning rate 0 for ``replicas`` from the next step on: their parameters stay
        exactly as they are."""
        if len(replicas):
            self.rates[list(replicas)] = 0.0

    def moments(self) -> tuple[int, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """(steps taken, Adam's first moments, second moments), one per parameter."""
        return self.steps, tuple(self._exp_avg), tuple(self._exp_avg_sq)

    @torch.no_grad()
    def load_moments(self, steps: int, exp_avg: Sequence[torch.Tensor],
                     exp_avg_sq: Sequence[torch.Tensor]) -> None:
        """Continue an Adam that took ``steps`` steps, with its moments (laid out as the
        parameters, :func:`selbench.training.engine.restack_state`)."""
        self.steps = int(steps)
        for mine, theirs in zip(self._exp_avg + self._exp_avg_sq, [*exp_avg, *exp_avg_sq]):
            mine.copy_(theirs)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # closure: Optimizer's signature, unused
        group = self.param_groups[0]
        params = group["params"]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        beta1, beta2 = group["betas"]
        self.steps += 1
        correction1 = 1.0 - beta1 ** self.steps
        correction2_sqrt = math.sqrt(1.0 - beta2 ** self.steps)
        # step size -lr / (1 - β1^t) per replica, in float64 then rounded, as Adam's scalar is
        self._sizes.copy_(self.rates / -correction1)
        for view, owner in self._gathers:
            torch.index_select(self._sizes, 0, owner, out=view)
        if group["weight_decay"] != 0:  # g + wd·p, one rounding, as the fused Adam adds it
            grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
        torch._foreach_lerp_(self._exp_avg, grads, 1.0 - beta1)
        self._v_flat.mul_(beta2)
        torch._foreach_addcmul_(self._exp_avg_sq, grads, grads, 1.0 - beta2)
        _correct_sqrt(self._v_flat, self._denom)
        self._denom.div_(correction2_sqrt).add_(group["eps"])
        update = torch._foreach_mul(self._exp_avg, self._views)  # (s·m) / d, the fused order
        torch._foreach_div_(update, self._denoms)
        torch._foreach_add_(params, update)


def _leading(owner: torch.Tensor, replicas: int) -> bool:
    """Whether ``owner`` (a parameter's element owners) is its leading index, replica r
    owning row r."""
    if owner.dim() == 0 or owner.shape[0] != replicas:
        return False
    rows = torch.arange(replicas, device=owner.device).view(replicas, *[1] * (owner.dim() - 1))
    return bool((owner == rows).all())


def _views_of(flat: torch.Tensor, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.view_as(p) for t, p in zip(flat.split([p.numel() for p in params]), params)]


def _correct_sqrt(v: torch.Tensor, out: torch.Tensor) -> None:
    """``out = √v``, correctly rounded, as the fused Adam's (torch.sqrt of float32 is not on
    the CPU: it differed in the last bit on ~18% of the elements, measured). On the CPU
    NumPy's float32 square root (the hardware's, correctly rounded by IEEE 754; equal to
    the float64 root rounded on 47,000 elements over 25 decades, measured) takes 20 us for
    the 47,000 elements of 11 replicas of the tuned digits selector, against 130 us for
    torch's float64 root; elsewhere the float64 root, rounded."""
    if v.device.type == "cpu" and v.dtype == torch.float32:
        np.sqrt(v.numpy(), out=out.numpy())
    else:
        out.copy_(v.double().sqrt_())


def replica_optimizer(params: Sequence[torch.Tensor], replicas: int, lr: Any, epochs: Any,
                      weight_decay: float, lanes: bool,
                      owners: Sequence[torch.Tensor] | None = None,
                      ) -> tuple[torch.optim.Optimizer, int, Callable[[int], None] | None]:
    """The engine's optimiser, its number of epochs and its ``on_epoch(e)`` hook (None when
    there is nothing to do between epochs), for ``lr`` and ``epochs`` given as one value or
    one per replica: equal values -> the fused Adam and their epochs (the engine's usual
    path); otherwise a :class:`ReplicaAdam` run for the largest number of epochs, each
    replica frozen (rate 0) from its own last epoch on, ``owners`` (:func:`replica_owners`)
    saying which replica each parameter element belongs to (None: the leading dimension;
    refused with ``lanes``, whose stacked parameters are not one row per replica)."""
    rates = per_replica(lr, replicas, "lr", float)
    counts = per_replica(epochs, replicas, "epochs", int)
    if not isinstance(rates, tuple) and not isinstance(counts, tuple):
        return batched_adam(params, rates, weight_decay), counts, None
    if lanes and owners is None:
        raise ValueError("lane_tables: a learning rate or number of epochs per replica needs "
                         "the owners of the stacked parameters' elements")
    if not isinstance(rates, tuple):
        rates = (rates,) * replicas
    if not isinstance(counts, tuple):
        counts = (counts,) * replicas
    optimizer = ReplicaAdam(params, rates, weight_decay, owners)
    stops: dict[int, list[int]] = {}
    for r, count in enumerate(counts):
        stops.setdefault(count, []).append(r)

    def on_epoch(epoch: int) -> None:
        optimizer.freeze(stops.get(epoch, ()))

    return optimizer, max(counts), on_epoch


def noise_scale(noise_std: Any, replicas: int, device: torch.device,
                lane_first: Sequence[int] = ()) -> float | torch.Tensor:
    """The input noise's std: one float, or ``[R, 1, 1]`` (float32, on ``device``) when the
    replicas' differ; replicas that read one lane (``lane_first``: the first replica of each
    lane) must share theirs (ValueError)."""
    stds = per_replica(noise_std, replicas, "noise_std", float)
    if not isinstance(stds, tuple):
        return stds
    bounds = [*lane_first, replicas]
    for start, stop in zip(bounds[:-1], bounds[1:]):
        if len(set(stds[start:stop])) > 1:
            raise ValueError("lane_tables: the replicas of one lane read one noisy batch and "
                             "must share noise_std; give each replica its own lane")
    return torch.tensor(stds, dtype=torch.float32, device=device).view(replicas, 1, 1)
