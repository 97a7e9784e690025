"""``mlp``: an MLP on the feature embedding that predicts the top-label confidence."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Annotated, ClassVar

import numpy as np
import torch
from pydantic import Field
from selbench.contract.api import DifferentiableRecalibrator, FitContext
from selbench.contract.checks import NotFittedError, check_outputs
from selbench.contract.data import ModelOutputs
from selbench.contract.search import Tune
from selbench.training.engine import (
    ReplicaData,
    ReplicaHyper,
    Schedule,
    Tables,
    TrainingJob,
    train_replicas,
)
from selbench.training.torchutils import (
    BatchedMLP,
    build_mlp,
    equal_groups,
    run_module,
    seeded_init,
)


class MLPRecalibratorNet(torch.nn.Module):
    """``forward(logits, features) -> (sigmoid(MLP(features)), None)``: the confidence is
    a function of the features only; no log-probability vector is defined."""

    def __init__(self, d_in: int, hidden: list[int]):
        super().__init__()
        self.net = build_mlp(d_in, hidden)

    def logit(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features).squeeze(-1)

    def forward(self, logits: torch.Tensor | None, features: torch.Tensor):
        return torch.sigmoid(self.logit(features)), None

    @classmethod
    def stacked(cls, modules: list[MLPRecalibratorNet]) -> BatchedMLPRecalibrator:
        """The replicas ``modules`` as one hand-stacked module (see
        :class:`BatchedMLPRecalibrator`)."""
        return BatchedMLPRecalibrator(modules)


class BatchedMLPRecalibrator(torch.nn.Module):
    """R :class:`MLPRecalibratorNet` replicas trained as one (hand-stacked for the training
    engine, see :class:`selbench.training.torchutils.BatchedMLP`): ``forward(batch, features [R, B,
    d], need_log_prob) -> (sigmoid(MLP) [R, B], None)``."""

    uses_features = True

    def __init__(self, modules: list[MLPRecalibratorNet]):
        super().__init__()
        self.mlp = BatchedMLP([m.net for m in modules])

    def prepare(self, logits, features, labels) -> dict[str, torch.Tensor]:
        return {}

    def logit(self, features: torch.Tensor) -> torch.Tensor:
        return self.mlp(features)

    def forward(self, batch, features: torch.Tensor, need_log_prob: bool):
        return torch.sigmoid(self.mlp(features)), None

    def write_back(self, modules: list[MLPRecalibratorNet]) -> None:
        self.mlp.write_back([m.net for m in modules])


def _same_data(a: ModelOutputs, b: ModelOutputs) -> bool:
    """Whether the MLP recalibrator's fit reads the same data from ``a`` and ``b``."""
    return np.array_equal(a.features, b.features) and np.array_equal(a.correct(), b.correct())


class MLPRecalibrator(DifferentiableRecalibrator):
    """MLP recalibrator: confidence = sigmoid(MLP(features)), fitted by BCE on correctness.

    The paper's control for the selector's extra parameters: a recalibrator with the
    selector's architecture (2x128, ReLU) on the feature embedding. Trained with Adam on
    the binary cross entropy between its output and the prediction's correctness, mini-
    batches shuffled and weights initialised from ``context.seed``, on ``context.device``;
    the module is returned to the CPU afterwards. Learned state: ``module_``.
    """

    #: the method's canonical citation (shown by ``selbench plugins``)
    reference: ClassVar[str] = "Zollo et al., Improving Predictor Reliability with Selective Recalibration, TMLR 2024"

    provides_log_probs = False  # its module returns (confidence, None)
    usable_unfitted = False

    def __init__(
        self,
        hidden: Annotated[list[int], Field(
            description="hidden layer widths (ReLU); the paper's comparison uses [128, 128]",
        ), Tune.choice([64], [128], [128, 128])] = [128, 128],  # noqa: B006 - parameters are never mutated
        epochs: Annotated[int, Field(ge=0, description="passes over the fitting data"),
                          Tune.choice(25, 50, 100, 200, 500, 1000)] = 1000,
        lr: Annotated[float, Field(gt=0, description="Adam learning rate"),
                      Tune.log_uniform(1e-4, 1e-1)] = 5e-4,
        batch_size: Annotated[int, Field(ge=1, description="mini-batch size")] = 100,
        weight_decay: Annotated[float, Field(ge=0, description="Adam weight decay")] = 0.0,
    ) -> None:
        self.hidden = hidden
        self.epochs = epochs
        self.lr = lr
        self.batch_size = batch_size
        self.weight_decay = weight_decay

    def fit(self, outputs: ModelOutputs, context: FitContext) -> MLPRecalibrator:
        type(self).fit_many([self], [outputs], [context])
        return self

    def _hyper(self) -> tuple:
        return (tuple(self.hidden), self.epochs, self.lr, self.batch_size, self.weight_decay)

    @classmethod
    def fit_many(
        cls,
        recalibrators: Sequence[MLPRecalibrator],
        outputs: Sequence[ModelOutputs],
        contexts: Sequence[FitContext],
    ) -> None:
        """Fit ``recalibrators[i]`` on ``outputs[i]`` with ``contexts[i]``, each as its own
        :meth:`fit` would (to float rounding, see :mod:`selbench.training.engine`), training those
        with equal hyperparameters, data shapes and device as one model with the training
        engine (same seeded initial weights and batch order per replica, one Adam over the
        stacked parameters).
        """
        groups: dict[tuple, list[int]] = {}
        for i, (rec, out, ctx) in enumerate(zip(recalibrators, outputs, contexts)):
            check_outputs(out, "recalibrator 'mlp'", min_rows=1)
            key = (rec._hyper(), len(out), out.feature_dim, str(ctx.torch_device()))
            groups.setdefault(key, []).append(i)
        for members in groups.values():
            # replicas with the same seed and data (e.g. the training β's of one seed, which
            # this fit does not read) would train identically: train one, copy it
            outs = [outputs[i] for i in members]
            same = equal_groups(
                [int(contexts[i].seed) for i in members],
                lambda a, b, outs=outs: _same_data(outs[a], outs[b]),
            )
            lead = [members[g[0]] for g in same]
            if lead:
                cls._fit_batched(
                    [recalibrators[i] for i in lead],
                    [outputs[i] for i in lead],
                    [contexts[i] for i in lead],
                )
            for g in same:
                src = recalibrators[members[g[0]]]
                for j in g[1:]:
                    dst = recalibrators[members[j]]
                    dst.feature_dim_ = src.feature_dim_
                    dst.module_ = copy.deepcopy(src.module_)

    @staticmethod
    def _fit_batched(recs, outs, ctxs) -> None:
        """Train the recalibrators' networks as one model with the training engine
        (:mod:`selbench.training.engine`): BCE of each replica's logit against its correctness.

        A spare replica (a twin of the last one, discarded) trains after them, so that no
        replica that is kept is ever the last of the stack: the CPU kernels compute the last
        elements of a tensor (its tail, shorter than a vector) and a stack of one replica on
        other code paths, so without it a replica's last float bits depended on how many
        replicas trained with it and where it stood (issue 34: a cell fitted alone differed
        from the same cell fitted with other seeds). With it, each replica's arithmetic is
        the same whichever others train with it (``tests/test_cell_independence.py``).
        """
        first = recs[0]
        device = ctxs[0].torch_device()
        d = outs[0].feature_dim
        outs, ctxs = [*outs, outs[-1]], [*ctxs, ctxs[-1]]  # the spare: a twin of the last
        modules = [
            seeded_init(ctx.seed, lambda: MLPRecalibratorNet(d, first.hidden)) for ctx in ctxs
        ]
        tables = Tables(len(outs[0]))
        for out in outs:
            tables.add({"x": np.asarray(out.features, dtype=np.float32),
                        "y": out.correct().astype(np.float32)})
        net = BatchedMLP([m.net for m in modules]).to(device)
        bce = torch.nn.functional.binary_cross_entropy_with_logits

        def step_loss(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            return bce(net(batch["x"]), batch["y"], reduction="none").mean(-1)

        train_replicas(TrainingJob(
            modules=[net], step_loss=step_loss,
            data=ReplicaData(tables.to(device, {}), tables.source,
                             [int(ctx.seed) for ctx in ctxs]),
            schedule=Schedule(batch_size=int(first.batch_size), device=device),
            hyper=ReplicaHyper(epochs=int(first.epochs), lr=first.lr,
                               weight_decay=first.weight_decay)))
        net.write_back([m.net for m in modules])
        for rec, module in zip(recs, modules):  # the spare, last, is left out
            rec.feature_dim_ = d
            rec.module_ = module.eval().to("cpu")

    def _check(self, outputs: ModelOutputs) -> None:
        check_outputs(outputs, "recalibrator 'mlp'")
        if getattr(self, "module_", None) is None:
            raise NotFittedError("recalibrator 'mlp' is not fitted; call fit first")
        if outputs.feature_dim != self.feature_dim_:
            raise ValueError(
                f"features: recalibrator 'mlp' was fitted on d={self.feature_dim_} features, "
                f"got d={outputs.feature_dim}"
            )

    def confidence(self, outputs: ModelOutputs) -> np.ndarray:
        self._check(outputs)
        return np.clip(run_module(self.module_, outputs.logits, outputs.features, borrow=True), 0.0, 1.0)

    def module(self, outputs: ModelOutputs, context: FitContext) -> torch.nn.Module:
        self._check(outputs)
        return self.module_
