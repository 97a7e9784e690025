"""Batched training: many replicas of one method trained as one model.

A leaderboard trains the same method for every seed × training β (× loss weight). Those
replicas share data shapes, so :func:`train_many` trains them together: every parameter
gets a leading replica dimension (one ``baddbmm`` per layer for all replicas), one Adam
runs over the stacked parameters (Adam is elementwise, so this is exactly per-replica
Adam, weight decay included), and the per-replica losses are summed before one backward
pass (replicas share no parameter, so each one's gradient is that of its own loss).

Each replica reproduces its solo training (:func:`~selbench_plugins.schemes.training.train`)
to float rounding:

* initial weights: each replica's modules are created by its own ``init_module`` /
  ``module`` call (seeded by its own ``context.seed``) and copied into the stack;
* batch order: each replica's epochs are permuted by its own generator seeded by its seed,
  as in the solo loop, and the same for input noise (its own generator, seed + 1, drawing
  the same shapes in the same order — including the feature noise of joint training that
  a temperature never reads);
* its own fitting sample, training β (a tensor ``[R]`` in the coverage loss) and λ.

Replicas with the same seed and equal data (the training β's of one seed, in the runner)
form a *stream*: they read identical mini-batches, so the batch, its noise and the
selector's first layer are computed once per stream (``x_u @ [W_1 | ... | W_m]``).

**Protocol** (what makes a method batchable; anything else falls back to the solo loop): the
batched-training protocol of :mod:`selbench.api`. The selector's module class and, for joint
training, the recalibrator's module class (when it has parameters) are
:class:`~selbench.api.StackableModule` s whose ``stacked`` returns a
:class:`~selbench.api.StackedSelectorModule` / :class:`~selbench.api.StackedRecalibratorModule`
(with ``changes_prediction`` and ``correct`` when the prediction can change, binary Platt);
the loss and coverage classes return per-replica loss functions from their ``batched``
class methods (:meth:`selbench.api.SelectionLoss.batched`,
:meth:`selbench.api.CoverageLoss.batched`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from selbench.api import (
    DifferentiableRecalibrator,
    FitJob,
    StackableModule,
    StackedPredictingModule,
)
from selbench.torchutils import (
    balanced_split,
    batched_adam,
    batched_threads,
    cpu_threads,
    epoch_permutations,
    group_streams,
    take_rows,
    to_tensor,
)

__all__ = ["step_flops", "train_many"]


@dataclass
class _Replica:
    job: FitJob
    x: np.ndarray
    g_module: torch.nn.Module
    h_module: torch.nn.Module | None  # trained with g (joint, with parameters)
    conf: torch.Tensor | None  # frozen confidence [n]
    label_lp: torch.Tensor | None  # frozen log-probability of the label [n]


def _has_params(module: torch.nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _prepare(name: str, job: FitJob, train_h: bool, device: torch.device) -> _Replica:
    """What the solo loop sets up for one replica, with the same checks and errors."""
    from .training import _frozen_confidence

    outputs, loss = job.outputs, job.loss
    need_lp = bool(loss.needs_log_probs)
    x = np.asarray(job.selector.inputs(outputs), dtype=np.float32)
    g_module = job.selector.init_module(outputs, job.context)
    h_module = None
    if train_h:
        if not isinstance(job.recalibrator, DifferentiableRecalibrator):
            raise ValueError(
                f"scheme {name!r} trains h with g and needs a differentiable recalibrator "
                f"(none, temperature, platt, mlp); {type(job.recalibrator).__name__} is not"
            )
        module = job.recalibrator.module(outputs, job.context)
        if need_lp:
            with torch.no_grad():
                mdev = next((p.device for p in module.parameters()), torch.device("cpu"))
                probe = module(
                    to_tensor(outputs.logits[:1], mdev, torch.float32),
                    to_tensor(outputs.features[:1], mdev, torch.float32),
                )[1]
            if probe is None:
                raise ValueError(
                    f"loss: the selection loss needs recalibrated log-probabilities, "
                    f"which {type(job.recalibrator).__name__} does not define; use s-tlbce "
                    "or s-mmce"
                )
        if _has_params(module):
            h_module = module
    conf = label_lp = None
    if h_module is None:  # frozen h, or a parameter-free one: its output never changes
        conf, lp = _frozen_confidence(name, outputs, job.recalibrator, job.context, need_lp,
                                      device)
        if lp is not None:
            labels = to_tensor(outputs.labels, device, torch.int64)
            label_lp = lp.gather(1, labels[:, None]).squeeze(1)
    return _Replica(job, x, g_module, h_module, conf, label_lp)


def _batched_fn(objs: Sequence[Any]) -> Callable | None:
    """The losses' per-replica function (their class's ``batched``), or None when the
    replicas' losses are not all of one class or the class does not batch."""
    cls = type(objs[0])
    if any(type(o) is not cls for o in objs):
        return None
    return cls.batched(list(objs))


def _stackable(modules: Sequence[torch.nn.Module]) -> bool:
    cls = type(modules[0])
    return isinstance(modules[0], StackableModule) and all(type(m) is cls for m in modules)


def batchable(reps: Sequence[_Replica]) -> bool:
    """Whether the prepared replicas can be trained as one batched model."""
    if len(reps) < 2:
        return False
    first = reps[0]
    if not _stackable([r.g_module for r in reps]):
        return False
    if len({r.x.shape for r in reps}) != 1 or len({str(r.job.context.torch_device())
                                                    for r in reps}) != 1:
        return False
    if len({r.h_module is None for r in reps}) != 1:
        return False
    if first.h_module is not None:
        if not _stackable([r.h_module for r in reps]):
            return False
        shapes = {(r.job.outputs.logits.shape, r.job.outputs.features.shape) for r in reps}
        if len(shapes) != 1:
            return False
    if len({r.label_lp is None for r in reps}) != 1:
        return False
    return (_batched_fn([r.job.loss for r in reps]) is not None
            and _batched_fn([r.job.coverage for r in reps]) is not None)


def step_flops(d_in: int, hidden: Sequence[int], batch: int) -> int:
    """Matmul FLOPs of one training step of one MLP selector replica: forward ``2 B d h``
    per layer, backward the same for the weight gradient and (except the first layer,
    whose input needs none) again for the input gradient."""
    widths = [int(d_in), *[int(h) for h in hidden], 1]
    flops = 0
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        flops += (2 if i == 0 else 3) * 2 * batch * a * b
    return flops


def train_many(name: str, params: Any, reps: Sequence[_Replica], *, train_h: bool) -> None:
    """Train the prepared replicas ``reps`` (see :func:`batchable`) as one batched model, each
    as :func:`~selbench_plugins.schemes.training.train` would train it alone."""
    jobs = [r.job for r in reps]
    device = jobs[0].context.torch_device()
    seeds = [int(j.context.seed) for j in jobs]
    from .training import recalibrated_correct

    trained_h = reps[0].h_module is not None
    need_lp = bool(jobs[0].loss.needs_log_probs)
    # correctness of each replica's (recalibrated) prediction; h_net.correct replaces it
    # at every step when a trained h can change its prediction
    corrects = [recalibrated_correct(j.recalibrator, j.outputs) for j in jobs]

    def same(i: int, j: int) -> bool:
        a, b = jobs[i].outputs, jobs[j].outputs
        if not (np.array_equal(reps[i].x, reps[j].x)
                and np.array_equal(corrects[i], corrects[j])):
            return False
        return not trained_h or (np.array_equal(a.logits, b.logits)
                                 and np.array_equal(a.labels, b.labels)
                                 and np.array_equal(a.features, b.features))

    order, streams = group_streams(seeds, same)
    r_count, per = len(order), len(order) // streams
    lead = order[::per]
    n = reps[0].x.shape[0]
    bs = int(params.batch_size)
    noise_std = float(params.noise_std)

    f32 = torch.float32
    x = torch.stack([to_tensor(reps[i].x, device, f32) for i in lead])  # [U, n, d]
    correct = torch.stack([to_tensor(corrects[i], device, f32) for i in lead])
    beta = torch.tensor([float(jobs[i].context.beta) for i in order], dtype=f32, device=device)

    threads = batched_threads(device)
    split = balanced_split(streams, device, threads)
    g_net = type(reps[0].g_module).stacked([reps[i].g_module for i in order], streams,
                                           split=split)
    g_net = g_net.to(device)
    parameters = list(g_net.parameters())
    h_net = None
    h_data: dict[str, torch.Tensor] = {}
    features = None
    frozen_conf = frozen_lp = None
    h_predicts = False
    if trained_h:
        h_net = type(reps[0].h_module).stacked([reps[i].h_module for i in order], streams,
                                               split=split)
        h_net = h_net.to(device)
        uses_features = bool(h_net.uses_features)
        parameters += list(h_net.parameters())
        h_predicts = (isinstance(h_net, StackedPredictingModule)
                      and bool(h_net.changes_prediction))
        logits = torch.stack([to_tensor(jobs[i].outputs.logits, device, f32) for i in lead])
        labels = None
        if need_lp or h_predicts:
            labels = torch.stack(
                [to_tensor(jobs[i].outputs.labels, device, torch.int64) for i in lead]
            )
        if uses_features:
            features = torch.stack(
                [to_tensor(jobs[i].outputs.features, device, f32) for i in lead]
            )
        h_data = h_net.prepare(logits, features, labels)
        del logits, labels
    else:
        frozen_conf = torch.stack([reps[i].conf for i in order]).view(streams, per, n)
        if need_lp:
            frozen_lp = torch.stack([reps[i].label_lp for i in order]).view(streams, per, n)
    d_feat = jobs[0].outputs.feature_dim

    sel_fn = _batched_fn([jobs[i].loss for i in order])
    cov_fn = _batched_fn([jobs[i].coverage for i in order])
    optimizer = batched_adam(parameters, params.lr, params.weight_decay)
    shuffles = [torch.Generator().manual_seed(seeds[i]) for i in lead]
    noise_gens = []
    if noise_std > 0:
        noise_gens = [torch.Generator(device=device).manual_seed(seeds[i] + 1) for i in lead]

    def noise(width: int, rows: int) -> torch.Tensor:
        return torch.stack([
            torch.randn((rows, width), generator=gen, device=device, dtype=f32)
            for gen in noise_gens
        ])

    epochs = range(int(params.epochs))
    if any(j.context.progress for j in jobs):
        from tqdm.auto import tqdm

        epochs = tqdm(epochs, desc=f"{name}: training {r_count} replicas of g"
                      + (" and h" if train_h else ""))

    g_net.train()
    if h_net is not None:
        h_net.train()
    lp_b = None
    with cpu_threads(device, threads):
        for _, perm in zip(epochs, epoch_permutations(shuffles, n, int(params.epochs), device)):
            xp = take_rows(x, perm)
            cp = take_rows(correct, perm)[:, None, :].expand(streams, per, n).reshape(r_count, n)
            if h_net is not None:
                hp = {k: take_rows(v, perm) for k, v in h_data.items()}
                fp = take_rows(features, perm) if features is not None else None
            else:
                rows = perm[:, None, :].expand(streams, per, n)
                confp = frozen_conf.gather(2, rows).reshape(r_count, n)
                lpp = frozen_lp.gather(2, rows).reshape(r_count, n) if need_lp else None
            for start in range(0, n, bs):
                stop = min(start + bs, n)
                xb = xp[:, start:stop]
                if noise_gens:
                    xb = xb + noise_std * noise(xb.shape[-1], stop - start)
                g = g_net(xb)
                if h_net is not None:
                    fb = fp[:, start:stop] if fp is not None else None
                    if noise_gens:  # the solo loop draws feature noise whether h reads it or not
                        draw = noise(d_feat, stop - start)
                        fb = fb + noise_std * draw if fb is not None else None
                    hb = {k: v[:, start:stop] for k, v in hp.items()}
                    conf_b, lp_b = h_net(hb, fb, need_lp)
                    if h_predicts:
                        cb = h_net.correct(hb)
                else:
                    if train_h and noise_gens:  # the solo loop's feature noise, unused here
                        noise(d_feat, stop - start)
                    conf_b = confp[:, start:stop]
                    if lpp is not None:
                        lp_b = lpp[:, start:stop]
                if not h_predicts:
                    cb = cp[:, start:stop]
                total = (sel_fn(g, conf_b, cb, lp_b) + cov_fn(g, beta)).sum()
                optimizer.zero_grad(set_to_none=True)
                total.backward()
                optimizer.step()

    g_net.write_back([reps[i].g_module for i in order])
    for rep in reps:
        rep.g_module.eval().to("cpu")
    if h_net is not None:
        h_net.write_back([reps[i].h_module for i in order])
        for rep in reps:
            rep.h_module.eval().to("cpu")
