"""Judging replicas while they train (multi-fidelity tuning).

A pruned tuning study (:mod:`selbench.execution.tuning`, ``tuning.pruner``) puts one
:class:`EpochJudge` on the :class:`~selbench.contract.api.FitContext` of every trial of a
batch (``context.judge``). A scheme that declares
:attr:`~selbench.contract.api.Scheme.judges_epochs` stops its replicas at each of
:attr:`EpochJudge.rungs` below their own number of epochs (and at their last epoch, when it
is a rung), leaves the fitted selector and recalibrator of each replica as they stand then,
and calls :meth:`EpochJudge.judge`; the replicas it does not keep stop training (they are
dropped from the model). A scheme that declares nothing ignores the judge: every trial then
trains to its end.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selbench.contract.api import FitJob

__all__ = ["EpochJudge"]


class EpochJudge(abc.ABC):
    """Decides, at given epochs, which of the replicas of one fit keep training."""

    #: the epochs (ascending) at which the replicas that reach them are judged
    rungs: tuple[int, ...] = ()

    @abc.abstractmethod
    def judge(self, epoch: int, jobs: Sequence[FitJob],
              ends: Sequence[int] | None = None) -> list[bool]:
        """Whether each of ``jobs`` (replicas trained ``epoch`` epochs, their selector and
        recalibrator as they stand) keeps training; called with the jobs in the order the
        scheme received them. ``ends``: each job's own number of epochs, where the scheme
        knows it (a judge then never stops a replica at its own last epoch, and may stop
        one with epochs ahead to train it later with others: the tuner's deferral)."""
