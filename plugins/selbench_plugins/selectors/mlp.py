"""``mlp``: the learned soft selector ĝ(x) = sigmoid(MLP(x)) of selective recalibration."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field
from selbench.contract.api import FitContext, TrainableSelector
from selbench.contract.checks import NotFittedError, check_confidence, check_outputs
from selbench.contract.data import ModelOutputs
from selbench.contract.search import Tune
from selbench.training.torchutils import BatchedMLP, build_mlp, run_module, seeded_init

#: the schemes that train a trainable selector (named in error messages)
TRAINING_SCHEMES = ("selection", "sequential", "joint")

InputKind = Literal["features", "logits", "probabilities"]


class MLPSelectorNet(torch.nn.Module):
    """``forward(x [B, d_in]) -> ĝ [B]`` in (0, 1): sigmoid of an MLP's single output."""

    def __init__(self, d_in: int, hidden: list[int]):
        super().__init__()
        self.net = build_mlp(d_in, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.net(x).squeeze(-1))

    #: ``stacked`` takes ``lanes``: replicas that read the same batch share one wide
    #: first-layer matmul (see :class:`selbench.training.torchutils.BatchedMLP`)
    stacks_lanes = True

    @classmethod
    def stacked(cls, modules: list[MLPSelectorNet], lanes: int | None = None,
                split: int = 1) -> BatchedMLPSelector:
        """The replicas ``modules`` as one hand-stacked module (see
        :class:`BatchedMLPSelector`)."""
        return BatchedMLPSelector(modules, lanes, split)


class BatchedMLPSelector(torch.nn.Module):
    """R :class:`MLPSelectorNet` replicas trained as one (hand-stacked for the training
    engine; measured faster than ``torch.func``, see :class:`selbench.training.torchutils.BatchedMLP`).

    ``forward(x [R, B, d_in]) -> ĝ [R, B]``, or ``x [L, B, d_in]`` with ``lanes = L``
    (replicas ``r`` of lane ``r // (R / L)`` read ``x[l]``). Starts from the replicas' own
    weights; :meth:`write_back` returns the trained weights to them.
    """

    def __init__(self, modules: list[MLPSelectorNet], lanes: int | None = None,
                 split: int = 1):
        super().__init__()
        self.mlp = BatchedMLP([m.net for m in modules], lanes, split)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.mlp(x))

    def write_back(self, modules: list[MLPSelectorNet]) -> None:
        self.mlp.write_back([m.net for m in modules])


class MLPSelector(TrainableSelector):
    """Learned soft selector ĝ(x) = sigmoid(MLP(x)), trained by a scheme through a loss.

    ReLU MLP with widths ``hidden`` and one sigmoid output, reading the feature embedding
    (default), the logits or the probabilities. The score is ĝ(x); the core thresholds it
    at each coverage level. ``fit`` is not how it is trained: the ``selection``,
    ``sequential`` and ``joint`` schemes train it (the protocol of
    :class:`selbench.contract.api.TrainableSelector`: :meth:`inputs`, :meth:`init_module`,
    ``module_``). Its network class is hand-stacked for the training engine
    (:meth:`MLPSelectorNet.stacked`).
    """

    #: the method's canonical citation (shown by ``selbench plugins``)
    reference: ClassVar[str] = "Zollo et al., Improving Predictor Reliability with Selective Recalibration, TMLR 2024"

    def __init__(
        self,
        hidden: Annotated[list[int], Field(
            description="hidden layer widths (ReLU); the paper uses [128, 128] "
            "in-distribution and [64] under distribution shift",
        ), Tune.choice([64], [128], [128, 128])] = [128, 128],  # noqa: B006 - parameters are never mutated
        input: Annotated[InputKind, Field(
            description="what ĝ reads: the feature embedding (paper), the logits, or the "
            "softmax probabilities",
        )] = "features",
    ) -> None:
        self.hidden = hidden
        self.input = input

    def inputs(self, outputs: ModelOutputs) -> np.ndarray:
        """The selector's input matrix, float32 ``[N, d_in]`` (a new array)."""
        check_outputs(outputs, "selector 'mlp'")
        return np.array(self._input_of(outputs), dtype=np.float32)

    def _input_of(self, outputs: ModelOutputs) -> np.ndarray:
        """What ĝ reads, without a copy where the outputs hold it (scoring only reads it)."""
        if self.input == "features":
            return outputs.features
        if self.input == "logits":
            return outputs.logits
        return outputs.probabilities().astype(np.float32)

    def init_module(self, outputs: ModelOutputs, context: FitContext) -> torch.nn.Module:
        """Create, store as ``module_`` and return a freshly initialised selector network."""
        check_outputs(outputs, "selector 'mlp'", min_rows=1)
        d_in = outputs.feature_dim if self.input == "features" else outputs.num_classes
        self.input_dim_ = int(d_in)
        self.module_ = seeded_init(context.seed, lambda: MLPSelectorNet(d_in, self.hidden))
        return self.module_

    def fit(self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext):
        raise ValueError(
            "selector 'mlp' is trained through a selection loss by the "
            + ", ".join(repr(s) for s in TRAINING_SCHEMES)
            + " schemes, not by fit(); use one of them (the 'recalibration' scheme only fits "
            "selectors such as 'confidence', 'isolation-forest' or 'one-class-svm')"
        )

    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        check_outputs(outputs, "selector 'mlp'")
        check_confidence(outputs, confidence, "selector 'mlp'")
        if getattr(self, "module_", None) is None:
            raise NotFittedError(
                "selector 'mlp' is not trained; train it with the "
                + ", ".join(repr(s) for s in TRAINING_SCHEMES)
                + " scheme"
            )
        x = self._input_of(outputs)
        if x.shape[1] != self.input_dim_:
            raise ValueError(
                f"{self.input}: selector 'mlp' was trained on inputs of dimension "
                f"{self.input_dim_}, got {x.shape[1]}"
            )
        return run_module(self.module_, x, index=None, borrow=True)
