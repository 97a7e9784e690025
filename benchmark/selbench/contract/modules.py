"""The torch-module protocols of the contract: the module of a differentiable recalibrator
(:class:`RecalibratorModule`, :class:`PredictingModule`) and the hand-stacked
implementations the training engine (:mod:`selbench.training.engine`) uses instead of its
generic ``torch.func`` batching (:class:`StackableModule`, :class:`StackedSelectorModule`,
:class:`StackedRecalibratorModule`, :class:`StackedPredictingModule`). Plugins import these
names from :mod:`selbench.contract.api`, which re-exports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "PredictingModule",
    "RecalibratorModule",
    "StackableModule",
    "StackedPredictingModule",
    "StackedRecalibratorModule",
    "StackedSelectorModule",
]


# --------------------------------------------------------------------------- recalibrator modules
@runtime_checkable
class RecalibratorModule(Protocol):
    """The torch module of a :class:`DifferentiableRecalibrator`.

    ``module(logits [B, K], features [B, d])`` returns ``(confidence [B], log_probs [B, K]
    or None)``: ``confidence`` in [0, 1] is the recalibrated top-label confidence,
    differentiable in the module's parameters; ``log_probs`` is the full recalibrated
    log-probability vector where one is defined (S-MCE needs it), else ``None``. Inputs
    arrive as float32 tensors on the module's device. It is a ``torch.nn.Module`` (a
    scheme calls ``.to(device)``, ``.train()``, ``.eval()`` and ``.parameters()``).
    """

    def __call__(self, logits: torch.Tensor, features: torch.Tensor | None) -> tuple[
        torch.Tensor, torch.Tensor | None]: ...


@runtime_checkable
class PredictingModule(Protocol):
    """A :class:`RecalibratorModule` whose prediction may differ from ``argmax(logits)``.

    When ``changes_prediction`` is true, ``predict(logits, features) -> int64 [B]`` is the
    recalibrated prediction (what the recalibrator's :meth:`Recalibrator.predict` returns)
    and the confidence is that label's probability; schemes then give the selective loss
    the correctness of that prediction, recomputed at every step while h trains.
    """

    changes_prediction: bool

    def predict(self, logits: torch.Tensor, features: torch.Tensor | None) -> torch.Tensor: ...


# --------------------------------------------------------------------------- training engine
@runtime_checkable
class StackableModule(Protocol):
    """A module (g's from :meth:`TrainableSelector.init_module`, h's from
    :meth:`DifferentiableRecalibrator.module`) whose class has its own hand-stacked
    implementation for the training engine (:mod:`selbench.training.engine`), used instead of the
    generic ``torch.func`` one; worth writing only where it is measurably faster.

    ``type(m).stacked(modules)`` receives R replicas, all of that class and of equal shapes,
    and returns a :class:`StackedSelectorModule` (selectors) or a
    :class:`StackedRecalibratorModule` (recalibrators) whose parameters start from the
    replicas' own values. Each replica must end where its own training alone would (to
    float rounding).

    A selector module class that also sets ``stacks_lanes = True`` accepts
    ``stacked(modules, lanes=L, split=s)``: the replicas then come in L lanes of equal size
    that read the same mini-batch (same data and seed: the training β's of a seed), and
    ``forward`` receives one input per lane, ``x [L, B, d_in]`` (``split`` is a hint for
    balancing CPU threads that it may ignore).

    Any trainable module (stacked or not) may set ``cuda_graphs = False``: on a GPU the
    engine then runs its training step eagerly instead of capturing it in a CUDA graph
    (needed by a ``forward`` that reads values back to the host or changes Python state
    from step to step; :func:`selbench.training.engine.cuda_graphs_enabled`).
    """

    @classmethod
    def stacked(cls, modules: Sequence[Any]) -> Any: ...


@runtime_checkable
class StackedSelectorModule(Protocol):
    """R selector networks as one: ``forward(x [R, B, d_in]) -> ĝ [R, B]``;
    :meth:`write_back` copies the trained values into the replicas' own modules."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def write_back(self, modules: Sequence[Any]) -> None: ...


@runtime_checkable
class StackedRecalibratorModule(Protocol):
    """R recalibrator modules as one.

    * ``uses_features``: whether ``forward`` reads the features (else they are not passed);
    * ``prepare(logits [U, n, K], features [U, n, d] | None, labels [U, n] | None)``: the
      per-example tensors ``{name: [U, n, ...]}`` of the U distinct data copies, computed
      once before training (the engine gathers each replica's mini-batches from them);
    * ``forward(batch {name: [R, B, ...]}, features [R, B, d] | None, need_log_prob) ->
      (confidence [R, B], log-probability of the label [R, B] | None)``;
    * ``write_back(modules)``: copy the trained values into the replicas' own modules;
    * when the replicas' prediction can change (their modules are
      :class:`PredictingModule` s), it is a :class:`StackedPredictingModule` too.
    """

    uses_features: bool

    def prepare(self, logits: torch.Tensor, features: torch.Tensor | None,
                labels: torch.Tensor | None) -> dict[str, torch.Tensor]: ...

    def __call__(self, batch: dict[str, torch.Tensor], features: torch.Tensor | None,
                 need_log_prob: bool) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def write_back(self, modules: Sequence[Any]) -> None: ...


@runtime_checkable
class StackedPredictingModule(Protocol):
    """A :class:`StackedRecalibratorModule` whose replicas' prediction can change: when
    ``changes_prediction`` is true, ``correct(batch) -> [R, B]`` is the correctness (0/1,
    float) of each replica's current prediction on the batch (``prepare`` then receives
    the labels); schemes give it to the selective loss at every step."""

    changes_prediction: bool

    def correct(self, batch: dict[str, torch.Tensor]) -> torch.Tensor: ...
