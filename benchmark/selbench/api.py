"""The interfaces every plugin implements, and the descriptor a hook returns.

A plugin is a class following scikit-learn's estimator contract: every hyperparameter is an
``__init__`` keyword argument (validated beforehand by the plugin's own pydantic ``params``
model), ``fit`` returns ``self``, and learned state lives in attributes ending in ``_``.

The six kinds and how the runner uses them, for one method and one seed::

    outputs = backbone.extract(dataset, split, context)         # cached on disk by the core
    scheme.fit(fit_outputs, selector=..., recalibrator=...,      # trains h and/or g
               loss=..., coverage=..., context=...)
    conf  = recalibrator.confidence(eval_outputs)                # recalibrated top-label conf.
    score = selector.score(eval_outputs, conf)                   # higher = accept first
    # the core then thresholds `score` at each coverage level and computes the metrics

Plugins never compute metrics and never write result files: the core owns both.

**Capabilities.** Plugins declare, as class attributes, what they need from each other, so
that ``selbench validate`` (and ``run``, before any computation) rejects a combination that
cannot run, one line per problem naming the YAML path; the core never branches on a plugin's
name. Every declaration has a default that checks nothing, so a plugin that declares nothing
validates as before (a mistake then shows when it runs). The core reads them from the
plugin's factory when that is a class (a factory function declares nothing):

========================  ===================================================  ===========
class                     attribute                                            default
========================  ===================================================  ===========
:class:`Dataset`          ``input_kind``: what ``SplitData.inputs`` holds      ``None``
:class:`Backbone`         ``input_kinds``: the input kinds it can read         ``None``
:class:`Scheme`           ``requires``: ``"loss"`` and/or ``"coverage"``       empty
:class:`Scheme`           ``selector_must_be_trainable``: True/False/None      ``None``
:class:`Scheme`           ``recalibrator_must_be_differentiable``              ``False``
:class:`Scheme`           ``fits_recalibrator``: False = uses h as given       ``True``
:class:`Scheme`           ``loss_reads_recalibrator_log_probs``                ``False``
:class:`Selector`         ``trainable``                                        ``False``
:class:`Recalibrator`     ``differentiable``                                   ``False``
:class:`Recalibrator`     ``provides_log_probs``: True/False/None              ``None``
:class:`Recalibrator`     ``usable_unfitted``: True/False/None                 ``None``
:class:`SelectionLoss`    ``needs_log_probs``                                  ``False``
========================  ===================================================  ===========

``None`` means "not declared": nothing is checked against it. :data:`INPUT_KINDS` lists the
input kinds the built-ins use; a third-party dataset may name a new kind for its own
backbones.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from selbench.data import ModelOutputs

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "KINDS",
    "Backbone",
    "CoverageLoss",
    "Dataset",
    "FitContext",
    "FitJob",
    "INPUT_KINDS",
    "NoParams",
    "Params",
    "Plugin",
    "Recalibrator",
    "Scheme",
    "SelectionLoss",
    "Selector",
    "SplitData",
]

Kind = Literal["dataset", "backbone", "selector", "recalibrator", "loss", "scheme"]
KINDS: tuple[str, ...] = ("dataset", "backbone", "selector", "recalibrator", "loss", "scheme")


#: The values of :attr:`Dataset.input_kind` / :attr:`Backbone.input_kinds` used by the
#: built-in plugins: kind -> what :attr:`SplitData.inputs` then holds. Any other string is
#: allowed (a third-party dataset and its backbones may agree on their own kind).
INPUT_KINDS: dict[str, str] = {
    "model-outputs": "ready-made selbench.ModelOutputs (features, logits, labels)",
    "image-items": "a torch Dataset of (uint8 [3, H, W] image tensor, int label) items",
    "image-array": "a float numpy array of images [N, C, H, W]",
    "vectors": "a float numpy array of feature vectors [N, p]",
}


class Params(BaseModel):
    """Base class for a plugin's parameter model: unknown keys are an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(Params):
    """Parameter model of a plugin that takes no parameters."""


@dataclass(frozen=True)
class Plugin:
    """What a ``selbench_*`` hook returns, one per plugin.

    Args:
        name: the name a spec uses, e.g. ``"temperature"``. Unique within its kind across
            every installed package; a clash is an error that names both providers.
        factory: a class (or callable) called as ``factory(**params)`` with the validated
            parameters; it returns the plugin object (a :class:`Recalibrator`, ...).
        params: a :class:`Params` subclass describing the accepted parameters. Field
            descriptions are shown by ``selbench plugins``.
        summary: one line shown by ``selbench plugins``; defaults to the first line of the
            factory's docstring.
        version: the providing package's version, recorded in every result's provenance.
    """

    name: str
    factory: Callable[..., Any]
    params: type[BaseModel] = NoParams
    summary: str = ""
    version: str | None = None

    def describe(self) -> str:
        if self.summary:
            return self.summary
        doc = (getattr(self.factory, "__doc__", None) or "").strip()
        return doc.splitlines()[0] if doc else ""


@dataclass
class FitContext:
    """Everything a plugin may need besides its own parameters and the data.

    Attributes:
        seed: the replica's seed; plugins seed all their randomness from it.
        device: the torch device chosen by the runner (``cuda`` when present, else ``cpu``).
        beta: the target coverage used for training (the coverage loss's β).
        progress: whether the plugin may show a progress bar.
        cache_dir: a directory the plugin may use for its own artefacts (e.g. a trained
            backbone's weights); the core keys it by content.
    """

    seed: int = 0
    device: Any = "cpu"
    beta: float = 1.0
    progress: bool = False
    cache_dir: Any = None
    extra: dict = field(default_factory=dict)

    def generator(self, offset: int = 0) -> np.random.Generator:
        """A numpy generator seeded from ``seed`` (``offset`` decorrelates streams)."""
        return np.random.default_rng([self.seed, offset])

    def torch_device(self) -> torch.device:
        import torch

        return torch.device(self.device)


@dataclass
class SplitData:
    """One split of a dataset, as returned by :meth:`Dataset.split`.

    Attributes:
        inputs: what the backbone consumes: an array ``[N, ...]``, a
            ``torch.utils.data.Dataset`` yielding ``(input, label)``, or ready-made
            :class:`ModelOutputs` for datasets that are model outputs already.
        labels: int64 ``[N]`` classes.
        domain: optional ``[N]`` domain ids.
        class_names: optional class names (used by zero-shot backbones).
    """

    inputs: Any
    labels: np.ndarray
    domain: np.ndarray | None = None
    class_names: list[str] | None = None
    meta: dict = field(default_factory=dict)


class Dataset(abc.ABC):
    """A source of labelled examples, split by name (``"train"``, ``"val"``, ``"test"``...).

    The spec picks which split fits the methods (``fit_split``) and which is the target
    data they are evaluated on (``eval_split``); backbones that train in-process use the
    split named by their own parameters (usually ``"train"``).
    """

    #: number of classes K
    num_classes: int

    #: What :attr:`SplitData.inputs` holds in every split (a key of :data:`INPUT_KINDS`, or
    #: a kind of your own); validation rejects a backbone whose :attr:`Backbone.input_kinds`
    #: does not include it. ``None``: not declared, any backbone is accepted.
    input_kind: ClassVar[str | None] = None

    @abc.abstractmethod
    def splits(self) -> list[str]:
        """Names of the available splits."""

    @abc.abstractmethod
    def split(self, name: str) -> SplitData:
        """Load one split. Raise ``FileNotFoundError`` saying where to get missing data."""


class Backbone(abc.ABC):
    """A pretrained (or in-process trained) classifier that turns a split into outputs."""

    #: The :attr:`Dataset.input_kind` values :meth:`extract` can read (see
    #: :data:`INPUT_KINDS`); validation rejects a dataset declaring any other kind.
    #: ``None``: not declared, any dataset is accepted.
    input_kinds: ClassVar[frozenset[str] | None] = None

    @abc.abstractmethod
    def extract(self, dataset: Dataset, split: str, context: FitContext) -> ModelOutputs:
        """Return features, logits and labels for ``dataset.split(split)``.

        Runs on ``context.device``; results are cached by the core, keyed by the dataset
        and backbone configuration, so this is called once per configuration and split.
        """


class Recalibrator(abc.ABC):
    """h: maps a model's outputs to a recalibrated top-label confidence.

    The predicted class never changes (``argmax`` of the logits); h only says how sure
    the model is of that prediction. Differentiable recalibrators also implement
    :meth:`module` so that schemes can train them jointly with a selector.
    """

    #: True when :meth:`module` is implemented (temperature, Platt, MLP).
    differentiable: ClassVar[bool] = False

    #: Whether :meth:`module`'s forward returns the full log-probability vector (needed by
    #: losses with :attr:`SelectionLoss.needs_log_probs` in schemes that read it from h,
    #: see :attr:`Scheme.loss_reads_recalibrator_log_probs`). ``None``: not declared
    #: (checked when the scheme runs). A non-differentiable recalibrator provides none.
    provides_log_probs: ClassVar[bool | None] = None

    #: Whether :meth:`confidence` works before :meth:`fit` (the identity does; anything
    #: with learned state does not). Schemes with ``fits_recalibrator = False`` use h as
    #: given and reject ``usable_unfitted = False``. ``None``: not declared.
    usable_unfitted: ClassVar[bool | None] = None

    @abc.abstractmethod
    def fit(self, outputs: ModelOutputs, context: FitContext) -> Recalibrator:
        """Fit on labelled outputs on their own (no selection) and return ``self``."""

    @abc.abstractmethod
    def confidence(self, outputs: ModelOutputs) -> np.ndarray:
        """Recalibrated top-label confidence, float64 ``[N]`` in ``[0, 1]``: the confidence
        of the label :meth:`predict` returns."""

    def predict(self, outputs: ModelOutputs) -> np.ndarray:
        """The label the recalibrated model predicts, int64 ``[N]``.

        The default keeps the backbone's prediction ``argmax(logits)``. A recalibrator whose
        recalibrated probabilities can change the top label (binary Platt scaling, as the
        paper's library scores it) overrides this; the core then measures correctness and
        accuracy against this prediction, and :meth:`confidence` must be its confidence.
        """
        return outputs.predictions()

    def module(self, outputs: ModelOutputs, context: FitContext) -> torch.nn.Module:
        """A torch module for joint training (see ``selbench_plugins`` for the protocol)."""
        raise NotImplementedError(f"{type(self).__name__} is not differentiable")


class Selector(abc.ABC):
    """g: scores examples so that higher scores are accepted first.

    The core turns scores into decisions: at coverage β it accepts the examples whose score
    is at least the (1-β) quantile of the scores on the unlabelled evaluation data.
    """

    #: True when the selector is trained by a scheme through a loss (the learned MLP);
    #: False when :meth:`fit` alone fits it (confidence, Isolation Forest, ...).
    trainable: ClassVar[bool] = False

    #: False for a selector that does not select (``none``): the core then accepts every
    #: example at every β (coverage 1) instead of choosing ⌈β·n⌉ among its equal scores.
    selects: ClassVar[bool] = True

    @abc.abstractmethod
    def fit(
        self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext
    ) -> Selector:
        """Fit on the fitting outputs and the recalibrated confidence; return ``self``."""

    @abc.abstractmethod
    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        """Selection scores, float64 ``[N]``; higher means more likely to be accepted."""


class SelectionLoss(abc.ABC):
    """A selective calibration loss l(ĝ, h) over a batch (S-TLBCE, S-MCE, S-MMCE)."""

    #: True when the loss needs the full recalibrated log-probability vector (S-MCE).
    needs_log_probs: ClassVar[bool] = False

    @abc.abstractmethod
    def __call__(
        self,
        g: torch.Tensor,
        confidence: torch.Tensor,
        correct: torch.Tensor,
        log_probs: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scalar loss. ``g``: soft selection in [0,1] ``[B]``; ``confidence``: recalibrated
        top-label confidence ``[B]``; ``correct``: 0/1 ``[B]``."""


class CoverageLoss(abc.ABC):
    """A coverage term λ·L_cov(β) that keeps ĝ from rejecting everything."""

    @abc.abstractmethod
    def __call__(self, g: torch.Tensor, beta: float) -> torch.Tensor:
        """Scalar loss, weight included, for soft selections ``g`` and target coverage β."""


@dataclass
class FitJob:
    """One replica for :meth:`Scheme.fit_many`: the arguments of one :meth:`Scheme.fit` call.

    The selector and recalibrator are fitted in place, as by ``fit``; each job has its own
    (they are never shared between jobs).
    """

    outputs: ModelOutputs
    selector: Selector
    recalibrator: Recalibrator
    loss: SelectionLoss | None
    coverage: CoverageLoss | None
    context: FitContext


class Scheme(abc.ABC):
    """How h and g are trained: recalibration only, selection only, sequential, joint.

    The class attributes below declare what a scheme needs from the method's other
    components; validation checks them before anything runs (defaults check nothing).
    """

    #: Method fields the scheme cannot run without: ``"loss"`` (a :class:`SelectionLoss`)
    #: and/or ``"coverage"`` (a :class:`CoverageLoss`).
    requires: ClassVar[frozenset[str]] = frozenset()

    #: True: the selector must be :attr:`Selector.trainable` (the scheme trains it through
    #: the loss); False: it must not be (the scheme only calls its ``fit``); None: either.
    selector_must_be_trainable: ClassVar[bool | None] = None

    #: True when the scheme trains h through :meth:`Recalibrator.module`: the recalibrator
    #: must be :attr:`Recalibrator.differentiable`.
    recalibrator_must_be_differentiable: ClassVar[bool] = False

    #: False when the scheme uses the recalibrator as given, never calling its ``fit``:
    #: a recalibrator declaring ``usable_unfitted = False`` is then rejected.
    fits_recalibrator: ClassVar[bool] = True

    #: True when a loss with :attr:`SelectionLoss.needs_log_probs` gets its log-probabilities
    #: from the recalibrator's module: the recalibrator must then be differentiable and not
    #: declare ``provides_log_probs = False``.
    loss_reads_recalibrator_log_probs: ClassVar[bool] = False

    @abc.abstractmethod
    def fit(
        self,
        outputs: ModelOutputs,
        *,
        selector: Selector,
        recalibrator: Recalibrator,
        loss: SelectionLoss | None,
        coverage: CoverageLoss | None,
        context: FitContext,
    ) -> Scheme:
        """Fit ``recalibrator`` and ``selector`` in place on ``outputs``; return ``self``."""

    def fit_many(self, jobs: Sequence[FitJob]) -> Scheme:
        """Fit every job as ``self.fit(job.outputs, selector=job.selector, ...)`` would.

        The runner calls this once per method with all the unfinished replicas of that
        method (its seeds × training β), so that a scheme can train replicas that share
        data shapes together (e.g. as one model with a leading replica dimension). An
        override must leave every job's selector and recalibrator exactly as its own
        ``fit`` call would (to float tolerance): same initial weights, batch order and
        random draws, each seeded by its own ``job.context``. The default fits the jobs one
        after the other. Learned state of the scheme itself (attributes ending in ``_``) is
        that of the last job. Returns ``self``.
        """
        for job in jobs:
            self.fit(
                job.outputs,
                selector=job.selector,
                recalibrator=job.recalibrator,
                loss=job.loss,
                coverage=job.coverage,
                context=job.context,
            )
        return self
