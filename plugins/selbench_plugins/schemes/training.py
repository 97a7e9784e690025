"""The schemes that train a learned selector: ``selection``, ``sequential``, ``joint``.

All three minimise ``loss(ĝ, ĥ, y^c) + coverage(ĝ, β)`` over mini-batches with Adam
(Appendix A of the paper: 1000 epochs, batch 100, learning rate 5e-4, β from
``FitContext.beta``); they differ in what happens to the recalibrator h:

* ``selection`` — h is used as given, not fitted (normally ``none``), and frozen;
* ``sequential`` — h is fitted first (``recalibrator.fit``), then frozen while g trains;
* ``joint`` — h is fitted first (pre-training), then trained together with g
  (selective recalibration proper); h must be differentiable.

When h is frozen its confidence (and the log-probability of each label) is computed once
before training. The loss's ``correct`` is the correctness of h's prediction
(``recalibrator.predict``, ``argmax(logits)`` unless h changes it); for a trained h that can
change its prediction (binary Platt) it is recomputed at every step from the module's
current prediction, so the loss always pairs a confidence with the correctness of the label
that confidence is for. Shuffling, initial weights and input noise are seeded by
``context.seed``; training runs on ``context.device`` and the modules are moved back to the
CPU after.

``fit_many`` (what the runner calls with all seeds × training β of a method; ``fit`` is one
job) trains the replicas that share data shapes and module classes as one model with the
training engine (:mod:`selbench.training.engine`): any selector or recalibrator module is batched
(hand-stacked where its class has ``stacked``, else through ``torch.func``), and each
replica ends where it would trained alone, to float rounding.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Annotated, Any

import numpy as np
import torch
from selbench.contract.api import (
    DifferentiableRecalibrator,
    FitContext,
    FitJob,
    Recalibrator,
    Scheme,
)
from selbench.contract.checks import check_outputs
from selbench.contract.data import ModelOutputs
from selbench.contract.search import Tune
from selbench.training.engine import (
    ReplicaData,
    ReplicaHyper,
    Schedule,
    Tables,
    TrainingJob,
    TrainingState,
    lane_order,
    restack_state,
    stack_recalibrators,
    stack_selectors,
    train_replicas,
)
from selbench.training.hyper import replica_owners
from selbench.training.torchutils import (
    EVAL_CHUNK,
    balanced_split,
    device_of,
    layout_threads,
    to_tensor,
)

from .common import (
    NOISE_DROWNS,
    BatchSize,
    Epochs,
    LearningRate,
    NoiseStd,
    Optimizer,
    WeightDecay,
    changes_prediction,
    check_args,
    check_logit_range,
    recalibrated_correct,
    warn_if_noise_drowns,
)

__all__ = ["NOISE_DROWNS", "TRAINING_SCHEMES", "JointScheme", "SelectionScheme",
           "SequentialScheme", "changes_prediction", "fit_recalibrators", "recalibrated_correct",
           "train_jobs", "train_part", "warn_if_noise_drowns"]

TRAINING_SCHEMES = ("selection", "sequential", "joint")


@torch.no_grad()
def _frozen_confidence(
    name: str,
    outputs: ModelOutputs,
    recalibrator: Recalibrator,
    context: FitContext,
    need_log_probs: bool,
) -> tuple[np.ndarray, np.ndarray | None]:
    """h's confidence (float32 ``[n]``) and, when the loss needs it, the log-probability of
    each example's label (float32 ``[n]``) on ``outputs``, computed once (h is frozen)."""
    if not isinstance(recalibrator, DifferentiableRecalibrator):
        if need_log_probs:
            raise ValueError(
                f"loss: the selection loss needs recalibrated log-probabilities, which "
                f"{type(recalibrator).__name__} does not define; use s-tlbce or s-mmce, or "
                "a recalibrator such as none, temperature or platt"
            )
        return np.asarray(recalibrator.confidence(outputs), dtype=np.float32), None
    module = recalibrator.module(outputs, context)
    was_training = module.training
    module.eval()
    mdev = device_of(module)
    confs, lps = [], []
    for start in range(0, len(outputs), EVAL_CHUNK):
        sl = slice(start, start + EVAL_CHUNK)
        c, lp = module(
            to_tensor(outputs.logits[sl], mdev, torch.float32),
            to_tensor(outputs.features[sl], mdev, torch.float32),
        )
        confs.append(c.float().cpu())
        if need_log_probs:
            if lp is None:
                raise ValueError(
                    f"loss: the selection loss needs recalibrated log-probabilities, which "
                    f"{type(recalibrator).__name__} does not define; use s-tlbce or s-mmce"
                )
            y = torch.as_tensor(outputs.labels[sl], dtype=torch.int64, device=lp.device)
            lps.append(lp.float().gather(1, y[:, None]).squeeze(1).cpu())
    module.train(was_training)
    conf = torch.cat(confs).numpy()
    return conf, (torch.cat(lps).numpy() if need_log_probs else None)


def _has_params(module: torch.nn.Module) -> bool:
    return any(True for _ in module.parameters())


@dataclass
class _Replica:
    """What one job trains and reads (made by :func:`_prepare`, trained by :func:`train_jobs`)."""

    job: FitJob
    g_module: torch.nn.Module
    h_module: torch.nn.Module | None  # trained with g (joint, with parameters)
    arrays: dict[str, np.ndarray]  # per-example data [n, ...] this replica reads
    params: Any = None  # its training hyperparameters (the scheme: epochs, lr, ...)


def _prepare(name: str, job: FitJob, train_h: bool) -> _Replica:
    """One replica's modules and data, with the checks of the arguments."""
    outputs, loss = job.outputs, job.loss
    need_lp = bool(loss.needs_log_probs)
    job.selector.fit_inputs(outputs, job.context)  # what inputs() needs, fitted per replica
    arrays = {"x": np.asarray(job.selector.inputs(outputs), dtype=np.float32)}
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
                mdev = device_of(module)
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
    if h_module is None:  # frozen h, or a parameter-free one: its output never changes
        conf, label_lp = _frozen_confidence(name, outputs, job.recalibrator, job.context,
                                            need_lp)
        arrays["conf"] = conf
        if label_lp is not None:
            arrays["label_lp"] = label_lp
    else:
        arrays["logits"] = np.asarray(outputs.logits, dtype=np.float32)
        arrays["features"] = np.asarray(outputs.features, dtype=np.float32)
        arrays["labels"] = np.asarray(outputs.labels, dtype=np.int64)
    if not changes_prediction(h_module):
        arrays["correct"] = recalibrated_correct(job.recalibrator, outputs).astype(np.float32)
    return _Replica(job, g_module, h_module, arrays)


def _loss_groups(objs: list[Any], device: torch.device) -> list[tuple[Any, list[int]]]:
    """Replicas whose loss objects are equal (class and parameters, but those the class
    declares ``replica_params``): one call each group, a declared parameter that differs
    within it given as a tensor of the members' values (measured on one CPU thread, 10
    replicas of the tuned digits selector with 10 coverage λ: 1.31 -> 0.93 ms a step)."""
    groups: list[tuple[Any, list[int], dict]] = []
    for i, obj in enumerate(objs):
        free = getattr(type(obj), "replica_params", ())
        key = {k: v for k, v in obj.get_params(deep=False).items() if k not in free}
        for first, members, first_key in groups:
            if type(first) is type(obj) and first_key == key:
                members.append(i)
                break
        else:
            groups.append((obj, [i], key))
    out = []
    for first, members, _ in groups:
        call = first
        for name in getattr(type(first), "replica_params", ()):
            values = [float(getattr(objs[i], name)) for i in members]
            if len(set(values)) > 1:
                call = copy.copy(call) if call is first else call
                setattr(call, name, torch.tensor(values, dtype=torch.float32, device=device))
        out.append((call, members))
    return out


def _rows(members: list[int], device: torch.device) -> slice | torch.Tensor:
    if members == list(range(members[0], members[-1] + 1)):
        return slice(members[0], members[-1] + 1)
    return torch.tensor(members, device=device)


@dataclass
class _Part:
    """One model of replicas (made by :func:`_build_part`): the replicas in the stack's
    order, the stacked selector (and trained recalibrator) and the engine's job."""

    reps: list[_Replica]
    g_stack: torch.nn.Module
    h_stack: torch.nn.Module | None
    job: TrainingJob


def _build_part(name: str, reps: list[_Replica], train_h: bool,
                segment: int | None = None) -> _Part:
    """The replicas ``reps`` (spares included) stacked as one model and their engine job;
    ``segment``: a judged training's next stretch, every replica for that many epochs,
    without lanes and with the owners of every parameter element (what
    :func:`~selbench.training.engine.restack_state` and a resumed Adam need)."""
    device = reps[0].job.context.torch_device()
    if segment is None:
        reps, tables, lanes = _lane_tables(reps)
    else:
        tables, lanes = Tables(len(reps[0].job.outputs)), None
        for r in reps:
            tables.add(r.arrays)
    hyper, jobs = [r.params for r in reps], [r.job for r in reps]
    need_lp = bool(jobs[0].loss.needs_log_probs)
    g_stack = _stack_g(reps, lanes, device)
    modules: list[torch.nn.Module] = [g_stack]
    h_stack, h_predicts, uses_features = None, False, False
    data = tables.to(device, {"labels": torch.int64})
    if reps[0].h_module is not None:
        h_stack, h_predicts, uses_features = _stack_h(reps, data, need_lp, device)
        modules.append(h_stack)
    noise_std = [float(h.noise_std) for h in hyper]
    warn_if_noise_drowns(max(noise_std), reps[0].arrays["x"], name)
    noise = [("x", reps[0].arrays["x"].shape[1])]
    if train_h:  # h's feature noise, drawn whether h reads the features or not
        noise.append(("features" if uses_features else None, jobs[0].outputs.feature_dim))
    desc = None
    if any(j.context.progress for j in jobs):
        desc = (f"{name}: training g" + (" and h" if train_h else "")
                + (f" ({len(reps)} replicas)" if len(reps) > 1 else ""))
    job = TrainingJob(
        modules=modules, step_loss=_step_loss(jobs, g_stack, h_stack, h_predicts, need_lp,
                                              device),
        data=ReplicaData(data, tables.source, [int(j.context.seed) for j in jobs], noise,
                         ("x",) if lanes is not None else ()),
        schedule=Schedule(int(hyper[0].batch_size), device, desc),
        hyper=ReplicaHyper(
            epochs=[int(h.epochs) for h in hyper] if segment is None else segment,
            lr=[float(h.lr) for h in hyper], weight_decay=hyper[0].weight_decay,
            noise_std=noise_std, owners=_owners(reps, g_stack, h_stack, segment is not None)))
    return _Part(reps, g_stack, h_stack, job)


def _write_back(part: _Part, to_cpu: bool = True) -> None:
    """The trained values into each replica's own modules (moved to the CPU, in eval mode)."""
    part.g_stack.write_back([r.g_module for r in part.reps])
    if part.h_stack is not None:
        part.h_stack.write_back([r.h_module for r in part.reps])
    for r in part.reps:
        for m in (r.g_module, r.h_module):
            if m is not None:
                m.eval()
                if to_cpu:
                    m.to("cpu")


def train_part(name: str, params: Any, reps: list[_Replica], *, train_h: bool) -> None:
    """Train replicas that share data shapes, module classes, device, batch size and weight
    decay as one model (:func:`selbench.training.engine.train_replicas`); each ends where it
    would trained alone, to float rounding (see :mod:`selbench.training.engine`). A replica's
    epochs, learning rate and input noise are its own ``params`` (``params``: the default).
    Replicas whose contexts carry one :class:`~selbench.contract.judge.EpochJudge` are
    trained by :func:`_train_judged`."""
    for r in reps:
        r.params = params if r.params is None else r.params
    judges = {id(r.job.context.judge): r.job.context.judge for r in reps}
    if len(judges) == 1 and None not in judges.values():
        _train_judged(name, reps, next(iter(judges.values())), train_h)
        return
    part = _build_part(name, reps + _spares(reps), train_h)
    train_replicas(part.job)
    _write_back(part)


def _next_stop(alive: list[_Replica], rungs: set[int], at: int) -> int:
    """Where a judged training stops next after epoch ``at``: the first rung below the
    longest replica's epochs, or the first replica's last epoch."""
    epochs = [int(r.params.epochs) for r in alive]
    return min([e for e in rungs if at < e < max(epochs)] + epochs)


def _restacked(name: str, part: _Part, survivors: list[_Replica], train_h: bool,
               state: TrainingState) -> tuple[_Part, TrainingState]:
    """``part`` without the replicas that are not ``survivors`` (written back), a new spare
    last (a twin of the last survivor as it stands, its Adam moments too), and the
    training's state laid out for the new stack
    (:func:`~selbench.training.engine.restack_state`)."""
    device = survivors[0].job.context.torch_device()
    spare = _twin(survivors[-1], int(part.reps[-1].job.context.seed))
    new = _build_part(name, [*survivors, spare], train_h, segment=1)
    where = {id(r): i for i, r in enumerate(part.reps)}
    keep = [where[id(r)] for r in survivors] + [where[id(survivors[-1])]]
    parts = [(part.g_stack, [r.g_module for r in part.reps],
              lambda mods: stack_selectors(mods).to(device))]
    if part.h_stack is not None:
        parts.append((part.h_stack, [r.h_module for r in part.reps],
                      lambda mods: stack_recalibrators(mods).to(device)))
    return new, restack_state(state, parts, keep)


def _train_judged(name: str, reps: list[_Replica], judge: Any, train_h: bool) -> None:
    """Train ``reps`` stretch by stretch (:func:`_next_stop`): at each stop the replicas
    are written back, those at a rung of ``judge`` judged, and the model restacked without
    the replicas the judge drops and those at their own last epoch, so a dropped replica
    costs nothing after it. The Adam moments and generators carry on
    (:class:`~selbench.training.engine.TrainingState`): a replica that trains to its end
    reads the batches and noise, and takes the Adam steps, of its uninterrupted training
    (to float rounding: a resumed stretch runs another Adam kernel). One spare (a twin of
    the last replica, discarded) trains last throughout (issue 34), renewed as a twin of
    the last survivor at each restack: with one survivor left every replica then has one
    learning rate, and the engine's fused Adam (and CUDA graphs) runs the rest."""
    alive = [r for r in reps if int(r.params.epochs) > 0]
    if not alive:
        return
    spare = _twin(alive[-1], max(int(r.job.context.seed) for r in reps) + 1)
    rungs = {int(e) for e in judge.rungs}
    state: TrainingState | None = None
    part: _Part | None = None
    at = 0
    while alive:
        stop = _next_stop(alive, rungs, at)
        if part is None:
            part = _build_part(name, [*alive, spare], train_h, segment=stop - at)
        else:
            part = replace(part, job=replace(part.job, hyper=replace(part.job.hyper,
                                                                     epochs=stop - at)))
        state = train_replicas(part.job, state)
        _write_back(part, to_cpu=False)
        judged = [r for r in alive if stop in rungs]
        keep = judge.judge(stop, [r.job for r in judged],
                           [int(r.params.epochs) for r in judged]) if judged else []
        dropped = {id(r) for r, k in zip(judged, keep) if not k}
        survivors = [r for r in alive if id(r) not in dropped and int(r.params.epochs) > stop]
        if survivors and len(survivors) < len(alive):
            part, state = _restacked(name, part, survivors, train_h, state)
        alive, at = survivors, stop
    for r in reps:
        for m in (r.g_module, r.h_module):
            if m is not None:
                m.eval().to("cpu")


def _spares(reps: list[_Replica]) -> list[_Replica]:
    """Spare replicas trained after the others and discarded: twins of the replicas of the
    last one's seed, under an unused seed (a lane of their own where the selector reads
    lanes), so that no replica that is kept is ever the last of the stack. The CPU kernels
    compute the last elements of a tensor (its tail, shorter than a vector) and a stack of
    one on other code paths, so without them a replica's last float bits depended on how
    many replicas trained with it and where it stood (issue 34: a cell fitted alone
    differed from the same cell fitted with other seeds). With one training β per seed each
    replica is now bit-identical whichever others train with it; with several
    (``train_beta: per_beta``, lanes) it is not yet (``tests/test_cell_independence.py``)."""
    last = int(reps[-1].job.context.seed)
    spare_seed = max(int(r.job.context.seed) for r in reps) + 1
    return [_twin(r, spare_seed) for r in reps if int(r.job.context.seed) == last]


def _twin(rep: _Replica, seed: int) -> _Replica:
    """A copy of ``rep`` (its modules as they stand) that reads its data with ``seed``."""
    return replace(rep, job=replace(rep.job, context=replace(rep.job.context, seed=seed)),
                   g_module=copy.deepcopy(rep.g_module), h_module=copy.deepcopy(rep.h_module))


def _owners(reps: list[_Replica], g_stack: torch.nn.Module,
            h_stack: torch.nn.Module | None, always: bool = False
            ) -> list[torch.Tensor] | None:
    """The replica of each element of the stacked parameters (g's, then h's), read off their
    ``write_back`` (:func:`selbench.training.hyper.replica_owners`), where the replicas'
    learning rates or epochs differ (the engine's Adam then has a rate per replica); None
    where they do not (unless ``always``)."""
    if not always and len({(float(r.params.lr), int(r.params.epochs)) for r in reps}) == 1:
        return None
    owners = replica_owners(g_stack, [r.g_module for r in reps])
    if h_stack is not None:
        owners += replica_owners(h_stack, [r.h_module for r in reps])
    return owners


def _lane_tables(reps: list[_Replica]) -> tuple[list[_Replica], Tables, int | None]:
    """The replicas (reordered by lane where lanes are used), their tables, and the number
    of lanes (None: no lanes)."""
    n = len(reps[0].job.outputs)
    tables = Tables(n)
    for r in reps:
        tables.add(r.arrays)
    # replicas that read the same rows (same data and seed: the training β's of a seed) form
    # a lane; a selector module class that reads lanes (``stacks_lanes``) multiplies a
    # lane's batch by its replicas' first-layer weights side by side
    g_cls = type(reps[0].g_module)
    lanes = None
    # a lane's replicas read one batch and step together: one lr, epochs and noise_std
    same = len({(r.params.epochs, r.params.lr, r.params.noise_std) for r in reps}) == 1
    stacks = getattr(g_cls, "stacks_lanes", False) and callable(getattr(g_cls, "stacked", None))
    if same and stacks:
        order, count = lane_order(tables.source, [int(r.job.context.seed) for r in reps])
        if count < len(reps):
            reps, lanes = [reps[i] for i in order], count
            tables = Tables(n)
            for r in reps:
                tables.add(r.arrays)
    return reps, tables, lanes


def _stack_g(reps: list[_Replica], lanes: int | None, device: torch.device) -> torch.nn.Module:
    """The replicas' selector modules as one, on ``device`` (by lanes when ``lanes``)."""
    if lanes is not None:
        split = balanced_split(lanes, device, layout_threads())
        g_stack = type(reps[0].g_module).stacked([r.g_module for r in reps], lanes=lanes,
                                                 split=split)
    else:
        g_stack = stack_selectors([r.g_module for r in reps])
    return g_stack.to(device)


def _stack_h(reps: list[_Replica], data: dict[str, torch.Tensor], need_lp: bool,
             device: torch.device) -> tuple[torch.nn.Module, bool, bool]:
    """The replicas' trained recalibrator modules as one, on ``device``, with ``data``'s
    logits (and labels, features where h does not read them) replaced by what h prepares
    from them (keys ``h.*``); also whether h changes the prediction and reads the
    features."""
    h_stack = stack_recalibrators([r.h_module for r in reps]).to(device)
    h_predicts = bool(getattr(h_stack, "changes_prediction", False))
    uses_features = bool(getattr(h_stack, "uses_features", True))
    prepared = h_stack.prepare(data.pop("logits"), data["features"],
                               data.pop("labels") if (need_lp or h_predicts) else None)
    if not uses_features:
        data.pop("features")
    data.pop("labels", None)
    for k, v in prepared.items():
        data[f"h.{k}"] = v
    return h_stack, h_predicts, uses_features


def _step_loss(jobs: list[FitJob], g_stack: torch.nn.Module, h_stack: torch.nn.Module | None,
               h_predicts: bool, need_lp: bool, device: torch.device):
    """``step_loss(batch)``: the summed selection and coverage losses of every replica,
    one call per group of replicas with equal loss objects."""
    beta = torch.tensor([float(j.context.beta) for j in jobs], dtype=torch.float32,
                        device=device)
    sel_groups = [(loss, _rows(m, device))
                  for loss, m in _loss_groups([j.loss for j in jobs], device)]
    cov_groups = [(cov, _rows(m, device))
                  for cov, m in _loss_groups([j.coverage for j in jobs], device)]

    def step_loss(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        g = g_stack(batch["x"])
        lp = None
        if h_stack is not None:
            hb = {k[2:]: v for k, v in batch.items() if k.startswith("h.")}
            conf, lp = h_stack(hb, batch.get("features"), need_lp)
            correct = h_stack.correct(hb) if h_predicts else batch["correct"]
        else:
            conf, lp, correct = batch["conf"], batch.get("label_lp"), batch["correct"]
        if len(sel_groups) == 1:  # the usual case: one call on all rows, no slicing
            total = sel_groups[0][0](g, conf, correct, lp).sum()
        else:
            total = sum(loss(g[rows], conf[rows], correct[rows],
                             None if lp is None else lp[rows]).sum()
                        for loss, rows in sel_groups)
        if len(cov_groups) == 1:
            return total + cov_groups[0][0](g, beta).sum()
        return total + sum(cov(g[rows], beta[rows]).sum() for cov, rows in cov_groups)

    return step_loss


def train_jobs(name: str, params: Any, jobs: list[FitJob], *, train_h: bool) -> None:
    """Train the selector (and, when ``train_h``, the recalibrator) of every job in place:
    the replicas that share data shapes, module classes, device, batch size and weight
    decay as one model. ``params`` holds the training hyperparameters (the scheme): one for
    every job, or a sequence of one per job (their epochs, lr and noise_std may differ)."""
    per_job = list(params) if isinstance(params, (list, tuple)) else [params] * len(jobs)
    reps = [_prepare(name, job, train_h) for job in jobs]
    parts: dict[tuple, list[_Replica]] = {}
    for rep, hyper in zip(reps, per_job):
        job, rep.params = rep.job, hyper
        key = (
            (int(hyper.batch_size), float(hyper.weight_decay), hyper.optimizer),
            str(job.context.torch_device()),
            type(rep.g_module),
            tuple((k, tuple(v.shape)) for k, v in rep.g_module.state_dict().items()),
            tuple((k, a.shape, a.dtype.str) for k, a in sorted(rep.arrays.items())),
            bool(job.loss.needs_log_probs),
            None if rep.h_module is None else (
                type(rep.h_module),
                tuple((k, tuple(v.shape)) for k, v in rep.h_module.state_dict().items()),
                changes_prediction(rep.h_module),
            ),
        )
        parts.setdefault(key, []).append(rep)
    for part in parts.values():
        train_part(name, params, part, train_h=train_h)


class _TrainingScheme(Scheme):
    name: str = ""
    #: whether h is trained together with g
    train_h: bool = False
    requires = frozenset({"loss", "coverage"})
    selector_must_be_trainable = True
    loss_reads_recalibrator_log_probs = True
    judges_epochs = True  # FitContext.judge stops replicas at its rungs (_train_judged)

    def __init__(
        self,
        epochs: Annotated[Epochs, Tune.choice(25, 50, 100, 200, 500, 1000)] = 1000,
        batch_size: BatchSize = 100,
        lr: Annotated[LearningRate, Tune.log_uniform(1e-4, 1e-1)] = 5e-4,
        weight_decay: WeightDecay = 0.0,
        noise_std: Annotated[NoiseStd, Tune.uniform(0.0, 1.0)] = 0.0,
        optimizer: Optimizer = "adam",
    ) -> None:
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.weight_decay = weight_decay
        self.noise_std = noise_std
        self.optimizer = optimizer

    def _prepare(self, outputs, selector, recalibrator, loss, coverage) -> None:
        check_outputs(outputs, f"scheme {self.name!r}", min_rows=1)
        check_args(self.name, selector, recalibrator, loss, coverage)
        check_logit_range(outputs, self.name)

    def _check_job(self, job: FitJob) -> None:
        """The scheme's checks of one replica's arguments (before anything is fitted)."""
        self._prepare(job.outputs, job.selector, job.recalibrator, job.loss, job.coverage)

    def _prefit(self, jobs: list[FitJob]) -> None:
        """Fit h before g is trained (sequential, joint); the selection scheme does not."""

    def fit(self, outputs, *, selector, recalibrator, loss, coverage, context):
        """One replica: :meth:`fit_many` of one job."""
        return self.fit_many([FitJob(outputs, selector, recalibrator, loss, coverage, context)])

    def fit_many(self, jobs):
        """Fit every job, training the replicas that share data shapes as one model
        (:func:`train_jobs`, :mod:`selbench.training.engine`); one job is the solo case."""
        jobs = list(jobs)
        for job in jobs:
            self._check_job(job)
        self._prefit(jobs)
        train_jobs(self.name, self, jobs, train_h=self.train_h)
        if jobs:
            self.n_fit_ = len(jobs[-1].outputs)
        return self

    @classmethod
    def fit_configurations(cls, pairs):
        """Fit every job with its own scheme's hyperparameters in one training: the jobs
        that share the data shapes, the selector's (and a trained h's) architecture, batch
        size and weight decay train as one model, each replica with its own ``epochs``,
        ``lr`` and ``noise_std`` (:func:`selbench.training.engine.train_replicas`), and
        each ends where ``scheme.fit_many([job])`` leaves it, to float rounding. Measured
        on the tuned digits experiment, 20 TPE trials of S-TLBCE joint (batches of 10, 5,
        5): 2.2 CPU seconds against 9.4 fitting them one by one (``perf/bench_tuning.py``)."""
        pairs = list(pairs)
        if not pairs:
            return
        if any(type(scheme) is not cls for scheme, _ in pairs):
            raise TypeError(f"{cls.__name__}.fit_configurations: every scheme must be a "
                            f"{cls.__name__}")
        for scheme, job in pairs:
            scheme._check_job(job)
        jobs = [job for _, job in pairs]
        pairs[0][0]._prefit(jobs)  # one class: how h is fitted first is the class's
        train_jobs(cls.name, [scheme for scheme, _ in pairs], jobs, train_h=cls.train_h)
        for scheme, job in pairs:
            scheme.n_fit_ = len(job.outputs)


def fit_recalibrators(jobs: list[FitJob]) -> None:
    """``job.recalibrator.fit(job.outputs, job.context)`` for every job: the recalibrators
    of one class are fitted together by the class's
    :meth:`~selbench.contract.api.Recalibrator.fit_many` (which fits equal ones once, or many MLPs as
    one batched model)."""
    if len(jobs) == 1:
        jobs[0].recalibrator.fit(jobs[0].outputs, jobs[0].context)
        return
    by_class: dict[type, list[FitJob]] = {}
    for job in jobs:
        by_class.setdefault(type(job.recalibrator), []).append(job)
    for cls, members in by_class.items():
        if len(members) > 1:
            cls.fit_many([j.recalibrator for j in members], [j.outputs for j in members],
                         [j.context for j in members])
        else:
            members[0].recalibrator.fit(members[0].outputs, members[0].context)


class SelectionScheme(_TrainingScheme):
    """Selection only: train g with the loss and coverage terms; h is used as given.

    The recalibrator is neither fitted nor trained — use ``none`` (the setting of Fisch
    et al., 2022, which needs no fitting). A recalibrator that must be fitted first is an
    error; fit it with the ``sequential`` scheme instead.
    """

    name = "selection"
    fits_recalibrator = False  # h is used as given

    def _check_job(self, job: FitJob) -> None:
        super()._check_job(job)
        try:
            job.recalibrator.confidence(job.outputs.subset(np.arange(1)))
        except (ValueError, AttributeError) as exc:
            raise ValueError(
                f"scheme 'selection' uses the recalibrator as given, without fitting it, but "
                f"{type(job.recalibrator).__name__} cannot be used unfitted ({exc}); use "
                "recalibrator 'none', or the 'sequential' scheme to fit it first"
            ) from exc


class SequentialScheme(_TrainingScheme):
    """Sequential: fit h on the fitting data (pre-training), freeze it, then train g."""

    name = "sequential"

    def _prefit(self, jobs: list[FitJob]) -> None:
        fit_recalibrators(jobs)


class JointScheme(_TrainingScheme):
    """Joint (selective recalibration): fit h (pre-training), then train g and h together.

    h must be differentiable (``none``, ``temperature``, ``platt``, ``mlp``); its live
    module is trained in place by the same optimiser as g.
    """

    name = "joint"
    train_h = True
    recalibrator_must_be_differentiable = True

    def _check_job(self, job: FitJob) -> None:
        super()._check_job(job)
        if not isinstance(job.recalibrator, DifferentiableRecalibrator):
            raise ValueError(
                f"scheme 'joint' trains h with g and needs a differentiable recalibrator "
                f"(none, temperature, platt, mlp); {type(job.recalibrator).__name__} is not"
            )

    def _prefit(self, jobs: list[FitJob]) -> None:
        fit_recalibrators(jobs)
