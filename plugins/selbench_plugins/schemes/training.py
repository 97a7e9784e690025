"""The schemes that train a learned selector: ``selection``, ``sequential``, ``joint``.

All three minimise ``loss(ĝ, ĥ, y^c) + coverage(ĝ, β)`` over mini-batches with Adam
(Appendix A of the paper: 1000 epochs, batch 100, learning rate 5e-4, β from
``FitContext.beta``); they differ in what happens to the recalibrator h:

* ``selection`` — h is used as given, not fitted (normally ``none``), and frozen;
* ``sequential`` — h is fitted first (``recalibrator.fit``), then frozen while g trains;
* ``joint`` — h is fitted first (pre-training), then trained together with g
  (selective recalibration proper); h must be differentiable.

When h is frozen its confidence (and log-probabilities) are computed once before
training. The loss's ``correct`` is the correctness of h's prediction
(``recalibrator.predict``, ``argmax(logits)`` unless h changes it); for a trained h that can
change its prediction (binary Platt) it is recomputed at every step from the module's
current prediction, so the loss always pairs a confidence with the correctness of the label
that confidence is for. Shuffling, initial weights and input noise are seeded by ``context.seed``;
training runs on ``context.device`` and the modules are moved back to the CPU after.

``fit`` trains one replica with :func:`train`, a plain loop over mini-batches.
``fit_many`` (what the runner calls with all seeds × training β of a method) trains the
replicas that share data shapes as one batched model (:mod:`.batched`), each replica ending
where its own ``fit`` would, to float rounding; replicas that cannot be batched (a
third-party module or loss without the batched protocol) are trained one by one.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import Field
from selbench.api import (
    CoverageLoss,
    DifferentiableRecalibrator,
    FitContext,
    FitJob,
    PredictingModule,
    Recalibrator,
    Scheme,
    SelectionLoss,
    Selector,
    TrainableSelector,
)
from selbench.checks import check_outputs
from selbench.data import ModelOutputs
from selbench.torchutils import EVAL_CHUNK, cpu_threads, device_of, to_tensor

TRAINING_SCHEMES = ("selection", "sequential", "joint")


def _check_args(
    name: str,
    selector: Selector,
    recalibrator: Recalibrator,
    loss: Any,
    coverage: Any,
) -> None:
    if not isinstance(selector, TrainableSelector):
        raise ValueError(
            f"scheme {name!r} trains a learned selector (trainable = True, e.g. 'mlp'), but "
            f"{type(selector).__name__} is fitted by its own fit(); use the 'recalibration' "
            "scheme for it"
        )
    if loss is None:
        raise ValueError(
            f"scheme {name!r} needs a selection loss (loss: s-tlbce, s-mce or s-mmce), got none"
        )
    if not isinstance(loss, SelectionLoss):
        raise TypeError(
            f"loss: scheme {name!r} expects a SelectionLoss (s-tlbce, s-mce, s-mmce), "
            f"got {type(loss).__name__}"
        )
    if coverage is None:
        raise ValueError(
            f"scheme {name!r} needs a coverage loss (coverage: quadratic or log-coverage), "
            "got none"
        )
    if not isinstance(coverage, CoverageLoss):
        raise TypeError(
            f"coverage: scheme {name!r} expects a CoverageLoss (quadratic, log-coverage), "
            f"got {type(coverage).__name__}"
        )


def recalibrated_correct(recalibrator: Recalibrator, outputs: ModelOutputs) -> np.ndarray:
    """0/1 float64 correctness of the recalibrator's prediction (``recalibrator.predict``,
    which for most recalibrators is ``argmax(logits)``; binary Platt may change it)."""
    pred = np.asarray(recalibrator.predict(outputs))
    return (pred == outputs.labels).astype(np.float64)


def changes_prediction(module: Any) -> bool:
    """Whether a trained h module is a :class:`~selbench.api.PredictingModule` whose
    prediction can differ from ``argmax(logits)``: the selective loss must then see the
    correctness of that prediction, recomputed at every step as h trains."""
    return isinstance(module, PredictingModule) and bool(module.changes_prediction)


@torch.no_grad()
def _frozen_confidence(
    name: str,
    outputs: ModelOutputs,
    recalibrator: Recalibrator,
    context: FitContext,
    need_log_probs: bool,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """h's confidence (and log-probabilities when the loss needs them) on ``outputs``."""
    if not isinstance(recalibrator, DifferentiableRecalibrator):
        if need_log_probs:
            raise ValueError(
                f"loss: the selection loss needs recalibrated log-probabilities, which "
                f"{type(recalibrator).__name__} does not define; use s-tlbce or s-mmce, or "
                "a recalibrator such as none, temperature or platt"
            )
        conf = recalibrator.confidence(outputs)
        return to_tensor(conf, device, torch.float32), None
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
        confs.append(c.float().to(device))
        if need_log_probs:
            if lp is None:
                raise ValueError(
                    f"loss: the selection loss needs recalibrated log-probabilities, which "
                    f"{type(recalibrator).__name__} does not define; use s-tlbce or s-mmce"
                )
            lps.append(lp.float().to(device))
    module.train(was_training)
    return torch.cat(confs), (torch.cat(lps) if need_log_probs else None)


def train(
    name: str,
    params: Any,
    outputs: ModelOutputs,
    selector: TrainableSelector,
    recalibrator: Recalibrator,
    loss: SelectionLoss,
    coverage: CoverageLoss,
    context: FitContext,
    *,
    train_h: bool,
) -> None:
    """Train ``selector`` (and ``recalibrator`` when ``train_h``) in place; ``params`` has the
    training hyperparameters as attributes (the scheme itself)."""
    device = context.torch_device()
    n = len(outputs)
    need_lp = bool(loss.needs_log_probs)

    x = to_tensor(selector.inputs(outputs), device, torch.float32)
    labels = None

    g_module = selector.init_module(outputs, context).to(device)
    parameters = list(g_module.parameters())
    h_module = None
    if train_h:
        if not isinstance(recalibrator, DifferentiableRecalibrator):
            raise ValueError(
                f"scheme {name!r} trains h with g and needs a differentiable recalibrator "
                f"(none, temperature, platt, mlp); {type(recalibrator).__name__} is not"
            )
        h_module = recalibrator.module(outputs, context).to(device)
        logits = to_tensor(outputs.logits, device, torch.float32)
        features = to_tensor(outputs.features, device, torch.float32)
        if need_lp:
            with torch.no_grad():
                if h_module(logits[:1], features[:1])[1] is None:
                    raise ValueError(
                        f"loss: the selection loss needs recalibrated log-probabilities, "
                        f"which {type(recalibrator).__name__} does not define; use s-tlbce "
                        "or s-mmce"
                    )
        parameters += list(h_module.parameters())
        conf_all = log_probs_all = None
    else:
        conf_all, log_probs_all = _frozen_confidence(
            name, outputs, recalibrator, context, need_lp, device
        )
    # the correctness of h's prediction: fixed, unless a trained h can change its prediction
    h_predicts = changes_prediction(h_module)
    correct = None
    if not h_predicts:
        correct = to_tensor(recalibrated_correct(recalibrator, outputs), device, torch.float32)
    if need_lp or h_predicts:
        labels = to_tensor(outputs.labels, device, torch.int64)

    optimizer = torch.optim.Adam(
        parameters, lr=params.lr, weight_decay=params.weight_decay, foreach=True
    )
    shuffle = torch.Generator().manual_seed(int(context.seed))
    noise_std = float(params.noise_std)
    noise_gen = None
    if noise_std > 0:
        noise_gen = torch.Generator(device=device).manual_seed(int(context.seed) + 1)
    beta = float(context.beta)
    bs = int(params.batch_size)

    epochs = range(int(params.epochs))
    if context.progress:
        from tqdm.auto import tqdm

        epochs = tqdm(epochs, desc=f"{name}: training g" + (" and h" if train_h else ""))

    g_module.train()
    if h_module is not None:
        h_module.train()
    lp_b = labels_b = None
    with cpu_threads(device):
        for _ in epochs:
            perm = torch.randperm(n, generator=shuffle).to(device)
            for idx in perm.split(bs):
                xb = x[idx]
                if noise_gen is not None:
                    xb = xb + noise_std * torch.randn(
                        xb.shape, generator=noise_gen, device=device, dtype=xb.dtype
                    )
                g = g_module(xb)
                if h_module is not None:
                    fb = features[idx]
                    if noise_gen is not None:
                        fb = fb + noise_std * torch.randn(
                            fb.shape, generator=noise_gen, device=device, dtype=fb.dtype
                        )
                    conf_b, lp_b = h_module(logits[idx], fb)
                else:
                    conf_b = conf_all[idx]
                    if log_probs_all is not None:
                        lp_b = log_probs_all[idx]
                if labels is not None:
                    labels_b = labels[idx]
                if h_predicts:
                    with torch.no_grad():
                        correct_b = (h_module.predict(logits[idx], fb) == labels_b).float()
                else:
                    correct_b = correct[idx]
                if not need_lp:
                    labels_b = None
                total = loss(g, conf_b, correct_b, lp_b, labels_b) + coverage(g, beta)
                optimizer.zero_grad(set_to_none=True)
                total.backward()
                optimizer.step()

    g_module.eval().to("cpu")
    if h_module is not None:
        h_module.eval().to("cpu")


#: the training hyperparameters of the three training schemes (Appendix A of the paper)
Epochs = Annotated[int, Field(ge=0, description="passes over the fitting data (paper: 1000)")]
BatchSize = Annotated[int, Field(ge=1, description="mini-batch size (paper: 100)")]
LearningRate = Annotated[float, Field(gt=0, description="Adam learning rate (paper: 5e-4)")]
WeightDecay = Annotated[float, Field(ge=0, description="Adam weight decay")]
NoiseStd = Annotated[float, Field(
    ge=0, description="std of Gaussian noise added to the selector's (and an MLP "
    "recalibrator's) input at every step, for robustness under shift (paper, RxRx1: 1)",
)]
Optimizer = Annotated[Literal["adam"], Field(description="optimiser (Adam only)")]


class _TrainingScheme(Scheme):
    name: str = ""
    #: whether h is trained together with g
    train_h: bool = False
    requires = frozenset({"loss", "coverage"})
    selector_must_be_trainable = True
    loss_reads_recalibrator_log_probs = True

    def __init__(
        self,
        epochs: Epochs = 1000,
        batch_size: BatchSize = 100,
        lr: LearningRate = 5e-4,
        weight_decay: WeightDecay = 0.0,
        noise_std: NoiseStd = 0.0,
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
        _check_args(self.name, selector, recalibrator, loss, coverage)

    def _check_job(self, job: FitJob) -> None:
        """The scheme's checks of one replica's arguments (before anything is fitted)."""
        self._prepare(job.outputs, job.selector, job.recalibrator, job.loss, job.coverage)

    def _prefit(self, jobs: list[FitJob]) -> None:
        """Fit h before g is trained (sequential, joint); the selection scheme does not."""

    def fit(self, outputs, *, selector, recalibrator, loss, coverage, context):
        job = FitJob(outputs, selector, recalibrator, loss, coverage, context)
        self._check_job(job)
        self._prefit([job])
        train(self.name, self, outputs, selector, recalibrator, loss, coverage,
              context, train_h=self.train_h)
        self.n_fit_ = len(outputs)
        return self

    def fit_many(self, jobs):
        """Fit every job as :meth:`fit` would, training the replicas that share data shapes
        as one batched model (see :mod:`selbench_plugins.schemes.batched`)."""
        jobs = list(jobs)
        for job in jobs:
            self._check_job(job)
        self._prefit(jobs)
        train_jobs(self.name, self, jobs, train_h=self.train_h)
        if jobs:
            self.n_fit_ = len(jobs[-1].outputs)
        return self


def fit_recalibrators(jobs: list[FitJob]) -> None:
    """``job.recalibrator.fit(job.outputs, job.context)`` for every job: the recalibrators
    of one class are fitted together by the class's
    :meth:`~selbench.api.Recalibrator.fit_many` (which fits equal ones once, or many MLPs as
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


def train_jobs(name: str, params: Any, jobs: list[FitJob], *, train_h: bool) -> None:
    """:func:`train` for every job, batching the replicas that can be (:mod:`.batched`)."""
    from .batched import _prepare, batchable, train_many

    if len(jobs) < 2:
        for job in jobs:
            train(name, params, job.outputs, job.selector, job.recalibrator, job.loss,
                  job.coverage, job.context, train_h=train_h)
        return
    reps = [_prepare(name, job, train_h, job.context.torch_device()) for job in jobs]
    parts: dict[tuple, list] = {}
    for rep in reps:
        job = rep.job
        key = (
            str(job.context.torch_device()),
            type(rep.g_module),
            tuple((k, tuple(v.shape)) for k, v in rep.g_module.state_dict().items()),
            rep.x.shape,
            type(job.loss),
            type(job.coverage),
            None if rep.h_module is None else (
                type(rep.h_module), job.outputs.logits.shape, job.outputs.features.shape,
            ),
        )
        parts.setdefault(key, []).append(rep)
    for part in parts.values():
        if batchable(part):
            train_many(name, params, part, train_h=train_h)
        else:
            for rep in part:
                job = rep.job
                train(name, params, job.outputs, job.selector, job.recalibrator, job.loss,
                      job.coverage, job.context, train_h=train_h)


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
