"""``recalibration``: fit h only; a non-trainable selector is then fitted on its output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

import numpy as np
from pydantic import Field
from selbench.contract.api import FitContext, FitJob, Scheme, TrainableSelector
from selbench.contract.checks import check_outputs
from selbench.contract.data import ModelOutputs
from selbench.measure.metrics import accept_mask

from .training import TRAINING_SCHEMES, fit_recalibrators


class RecalibrationScheme(Scheme):
    """Recalibration only: fit h, then fit the (non-trainable) selector on h's output.

    ``fit_on='all'``: ``recalibrator.fit(outputs)``, then ``selector.fit(outputs,
    recalibrator.confidence(outputs))`` — so the selection baselines (confidence,
    Isolation Forest, One-class SVM) are applied to the recalibrated model, as in the
    paper. With selector ``none`` this is plain recalibration (β = 1).

    ``fit_on='accepted'``: the selector is first fitted on the uncalibrated confidence; the
    fitting examples it accepts at coverage β = ``context.beta`` are kept and h is fitted on
    those only (e.g. an oracle that rejects an outlier component, then fits T on the rest);
    the selector is then refitted on the recalibrated confidence. The kept examples follow
    the core's selection rule, :func:`selbench.measure.metrics.accept_mask` with
    ``seed=context.seed``: exactly ``ceil(β n)`` of the ``n`` fitting examples, the highest
    scores, ties broken by a seeded permutation — so a selector with tied scores (a 0/1
    oracle) keeps ``ceil(β n)`` rows rather than every row tied at the threshold. Learned
    state: ``kept_`` (sorted indices h was fitted on).

    A trainable selector (``mlp``) is an error: the selection, sequential and joint
    schemes train it. ``loss`` and ``coverage`` are not used.
    """

    selector_must_be_trainable = False

    def __init__(
        self,
        fit_on: Annotated[Literal["all", "accepted"], Field(
            description="all: fit h on every fitting example; accepted: fit h only on the "
            "examples the selector (fitted on the uncalibrated confidence) accepts at "
            "coverage beta",
        )] = "all",
    ) -> None:
        self.fit_on = fit_on

    def _check(self, outputs: ModelOutputs, selector) -> None:
        check_outputs(outputs, "scheme 'recalibration'", min_rows=1)
        if isinstance(selector, TrainableSelector):
            raise ValueError(
                f"scheme 'recalibration' only fits non-trainable selectors; "
                f"{type(selector).__name__} is trained through a loss by the "
                + ", ".join(repr(s) for s in TRAINING_SCHEMES)
                + " schemes"
            )

    def fit_many(self, jobs: Sequence[FitJob]) -> RecalibrationScheme:
        """Fit every job as :meth:`fit` would. With ``fit_on='all'`` the recalibrators are
        fitted first, by their class's ``fit_many`` (the MLP recalibrator's trains them as one
        batched model); then the selectors, each on its recalibrated confidence, by their
        class's :meth:`~selbench.contract.api.Selector.fit_many` (the baselines fit equal ones once)."""
        jobs = list(jobs)
        if self.fit_on != "all":
            return super().fit_many(jobs)
        for job in jobs:
            self._check(job.outputs, job.selector)
        fit_recalibrators(jobs)
        by_class: dict[type, list[FitJob]] = {}
        for job in jobs:
            by_class.setdefault(type(job.selector), []).append(job)
        for cls, members in by_class.items():
            cls.fit_many([j.selector for j in members], [j.outputs for j in members],
                         [j.recalibrator.confidence(j.outputs) for j in members],
                         [j.context for j in members])
        self.kept_ = np.arange(len(jobs[-1].outputs))
        return self

    def fit(self, outputs: ModelOutputs, *, selector, recalibrator, loss, coverage,
            context: FitContext) -> RecalibrationScheme:
        self._check(outputs, selector)
        if self.fit_on == "all":
            keep = np.arange(len(outputs))
            recalibrator.fit(outputs, context)
        else:
            raw = outputs.confidence()
            selector.fit(outputs, raw, context)
            score = np.asarray(selector.score(outputs, raw), dtype=np.float64)
            keep = np.flatnonzero(accept_mask(score, float(context.beta), seed=context.seed))
            recalibrator.fit(outputs.subset(keep), context)
        selector.fit(outputs, recalibrator.confidence(outputs), context)
        self.kept_ = keep
        return self
