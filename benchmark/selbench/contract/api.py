"""The contract between selbench and its plugins: every type a plugin may implement.

This module is written for plugin authors. It declares the six plugin kinds, the typed
protocols some plugins add (joint training, trainable selectors, batched training), the
descriptor a hook returns (:class:`Plugin`) and how a plugin's parameters are declared.
:mod:`selbench.contract.hookspecs` describes the whole fit → score → threshold protocol the runner
follows with these types. Import every name from here: the parameter machinery
(:class:`Plugin`, :func:`params_model`, :class:`Params`, :class:`PluginBase`) is defined in
:mod:`selbench.contract.params` and the torch-module protocols in
:mod:`selbench.contract.modules`, and this module re-exports them.

**Estimator contract.** A plugin is a class following scikit-learn's estimator contract:
every hyperparameter is an ``__init__`` keyword argument stored unchanged under its own
name, ``fit`` returns ``self``, and learned state lives in attributes ending in ``_``. Every
kind derives from :class:`PluginBase`, which provides ``get_params`` / ``set_params``, so
``sklearn.base.clone(plugin)`` gives an unfitted copy with the same parameters and plugins
pickle with their learned state.

**Parameters are declared once: the signature is the schema.** ``Plugin(name, Factory)``
derives the pydantic model of the accepted parameters from ``Factory.__init__`` (see
:func:`params_model`): each keyword parameter becomes a field of that type and default;
``typing.Annotated[type, pydantic.Field(...)]`` adds constraints and the description
``selbench plugins`` shows, and :class:`~selbench.contract.inputs.InputFile` /
:func:`~selbench.contract.inputs.InputDir` declare input paths::

    from typing import Annotated
    from pydantic import Field

    class Shrink(Recalibrator):
        def __init__(self, factor: Annotated[float, Field(gt=0, le=1,
                     description="how much of the deviation from 1/K is kept")] = 0.9):
            self.factor = factor

A spec's ``params`` are validated against that model once, when the spec is loaded (so
``selbench validate`` reports a bad value with its YAML path), and the factory is then
called with the validated values: ``__init__`` does not validate again. Checks that involve
several parameters go in a :class:`Params` subclass named by the class attribute
:attr:`PluginBase.params_base` (pydantic ``model_validator`` s run on the derived model).
An explicit model, ``Plugin(name, Factory, MyParams)``, is still accepted and wins over the
signature (the style of selbench 0.1).

**Kinds and protocols.**

============================  ===================================================================
:class:`Dataset`              labelled examples by split
:class:`Backbone`             a split -> :class:`~selbench.contract.data.ModelOutputs`
:class:`Selector`             g: scores, higher = accepted first
:class:`TrainableSelector`    a selector a scheme trains through a loss (``fit_inputs``,
                              ``inputs``, ``init_module``, ``module_``)
:class:`Recalibrator`         h: recalibrated top-label confidence (``fit_many`` for many replicas)
:class:`DifferentiableRecalibrator`  h with a live torch module a scheme can train with g
:class:`SelectionLoss`        l(ĝ, h) over a batch (named by a method's ``loss``)
:class:`CoverageLoss`         λ·L_cov(ĝ, β) (named by a method's ``coverage``)
:class:`Scheme`               how h and g are fitted (``fit``, ``fit_many``; several
                              configurations at once: ``fit_configurations``)
============================  ===================================================================

The torch modules these return follow :class:`RecalibratorModule` and, where the prediction
can change, :class:`PredictingModule`. Trainable modules are trained by the training engine
(:mod:`selbench.training.engine`), which trains R ≥ 1 replicas as one model: any module is batched
through ``torch.func``; a module class may add a faster hand-stacked implementation
(:class:`StackableModule` returning a :class:`StackedSelectorModule` or
:class:`StackedRecalibratorModule`, and :class:`StackedPredictingModule`). Losses are
written once for any leading (replica) dimensions. The registry checks, when a plugin is
registered, that a factory class subclasses its kind's base class (:data:`KIND_BASES`); the
object a factory function returns is checked when it is built.

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
:class:`Dataset`          ``split_sizes()``: each split's size, known          ``None``
                          without loading the data (checks ``n_fit``)
any kind                  ``check_inputs()``: opens the declared input files   no check
                          enough to catch what a run would reject
:class:`Backbone`         ``input_kinds``: the input kinds it can read         ``None``
:class:`Backbone`         ``shardable``: ``extract`` honours                   ``False``
                          ``FitContext.rows``
:class:`Scheme`           ``requires``: ``"loss"`` and/or ``"coverage"``       empty
:class:`Scheme`           ``selector_must_be_trainable``: True/False/None      ``None``
:class:`Scheme`           ``recalibrator_must_be_differentiable``              ``False``
:class:`Scheme`           ``fits_recalibrator``: False = uses h as given       ``True``
:class:`Scheme`           ``loss_reads_recalibrator_log_probs``                ``False``
:class:`Scheme`           ``judges_epochs``: honours ``FitContext.judge``      ``False``
:class:`Selector`         ``trainable``: set by subclassing TrainableSelector  ``False``
:class:`Selector`         ``selects``: False accepts everything                ``True``
:class:`Recalibrator`     ``differentiable``: set by subclassing               ``False``
                          DifferentiableRecalibrator
:class:`Recalibrator`     ``provides_log_probs``: True/False/None              ``None``
:class:`Recalibrator`     ``usable_unfitted``: True/False/None                 ``None``
:class:`SelectionLoss`    ``needs_log_probs``                                  ``False``
========================  ===================================================  ===========

``None`` means "not declared": nothing is checked against it. ``trainable`` and
``differentiable`` follow the type: a class that sets them against its base class is a
``TypeError`` when it is defined. :data:`INPUT_KINDS` lists the input kinds the built-ins
use; a third-party dataset may name a new kind for its own backbones.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from selbench.contract.data import ModelOutputs
from selbench.contract.modules import (
    PredictingModule,
    RecalibratorModule,
    StackableModule,
    StackedPredictingModule,
    StackedRecalibratorModule,
    StackedSelectorModule,
)
from selbench.contract.params import NoParams, Params, Plugin, PluginBase, params_model

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "INPUT_KINDS",
    "KINDS",
    "KIND_BASES",
    "Backbone",
    "CoverageLoss",
    "Dataset",
    "DifferentiableRecalibrator",
    "FitContext",
    "FitJob",
    "NoParams",
    "Params",
    "Plugin",
    "PluginBase",
    "PredictingModule",
    "Recalibrator",
    "RecalibratorModule",
    "Scheme",
    "SelectionLoss",
    "Selector",
    "SplitData",
    "StackableModule",
    "StackedPredictingModule",
    "StackedRecalibratorModule",
    "StackedSelectorModule",
    "TrainableSelector",
    "params_model",
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
    "text": "a sequence of N sentences (a numpy array or list of str)",
}


# --------------------------------------------------------------------------- context
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
        rows: for :meth:`Backbone.extract` of a backbone declaring ``shardable``: the rows
            ``[start, stop)`` of the split to return (a distributed run extracts a large
            split in several jobs, one range each, and concatenates them); ``None``: the
            whole split.
        judge: an :class:`~selbench.contract.judge.EpochJudge` that stops replicas at its
            rungs (a pruned tuning study), for schemes declaring ``judges_epochs``.
    """

    seed: int = 0
    device: Any = "cpu"
    beta: float = 1.0
    progress: bool = False
    cache_dir: Any = None
    extra: dict = field(default_factory=dict)
    rows: tuple[int, int] | None = None
    judge: Any = None

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


# --------------------------------------------------------------------------- the six kinds
class Dataset(PluginBase, abc.ABC):
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

    def split_sizes(self) -> dict[str, int] | None:
        """The number of examples of every split, when it is known cheaply — from the
        parameters or a file's header, without loading the data or running a backbone;
        ``None`` (the default) when it is not. A capability: ``selbench validate`` (and
        ``run``, before any computation) then checks the spec's ``fit_split`` /
        ``eval_split`` names and ``n_fit`` against it. Raise a ``ValueError`` naming the
        file for an input :meth:`split` would reject."""
        return None


class Backbone(PluginBase, abc.ABC):
    """A pretrained (or in-process trained) classifier that turns a split into outputs."""

    #: The :attr:`Dataset.input_kind` values :meth:`extract` can read (see
    #: :data:`INPUT_KINDS`); validation rejects a dataset declaring any other kind.
    #: ``None``: not declared, any dataset is accepted.
    input_kinds: ClassVar[frozenset[str] | None] = None

    #: True when :meth:`extract` honours ``context.rows``: given ``(start, stop)`` it returns
    #: exactly those rows of the split — each row as a whole-split extraction computes it,
    #: with the whole split's ``meta`` — so that a distributed run (``--executor local`` or
    #: ``submitit``) may extract a split larger than the executor's ``shard_size`` in
    #: several jobs. Declare it only when a row's outputs do not depend on the other rows
    #: (an inference pass, not a backbone trained on the split itself).
    shardable: ClassVar[bool] = False

    @abc.abstractmethod
    def extract(self, dataset: Dataset, split: str, context: FitContext) -> ModelOutputs:
        """Return features, logits and labels for ``dataset.split(split)`` (only the rows
        ``context.rows`` when the backbone declares :attr:`shardable` and it is set).

        Runs on ``context.device``; results are cached by the core, keyed by the dataset
        and backbone configuration, so this is called once per configuration and split
        (or once per row range).
        """


def _flag_follows_type(cls: type, flag: str, type_name: str, what: str, needs: str) -> None:
    """``cls.<flag>`` must say whether ``cls`` subclasses the protocol type ``type_name``
    (a ``TypeError`` when the class is defined otherwise)."""
    protocol = globals().get(type_name)
    if protocol is None:  # defining the protocol type itself
        return
    value = getattr(cls, flag)
    if bool(value) != issubclass(cls, protocol):
        raise TypeError(
            f"{cls.__qualname__}: {flag} = {value!r} contradicts its type; {what} is {flag} "
            f"by subclassing selbench.{type_name} (and implementing {needs})"
        )


class Recalibrator(PluginBase, abc.ABC):
    """h: maps a model's outputs to a recalibrated top-label confidence.

    h says how sure the model is of its prediction, :meth:`predict` (``argmax`` of the
    logits unless h overrides it). A recalibrator that a scheme may train jointly with a
    selector is a :class:`DifferentiableRecalibrator`.
    """

    #: True exactly for :class:`DifferentiableRecalibrator` subclasses (set by the type;
    #: read by validation).
    differentiable: ClassVar[bool] = False

    #: Whether the module's forward returns the full log-probability vector (needed by
    #: losses with :attr:`SelectionLoss.needs_log_probs` in schemes that read it from h,
    #: see :attr:`Scheme.loss_reads_recalibrator_log_probs`). ``None``: not declared
    #: (checked when the scheme runs). A non-differentiable recalibrator provides none.
    provides_log_probs: ClassVar[bool | None] = None

    #: Whether :meth:`confidence` works before :meth:`fit` (the identity does; anything
    #: with learned state does not). Schemes with ``fits_recalibrator = False`` use h as
    #: given and reject ``usable_unfitted = False``. ``None``: not declared.
    usable_unfitted: ClassVar[bool | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _flag_follows_type(cls, "differentiable", "DifferentiableRecalibrator",
                           "a recalibrator", "module()")

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
        if not isinstance(outputs, ModelOutputs):
            raise TypeError(
                f"outputs: {type(self).__name__}.predict expects selbench.ModelOutputs, got "
                f"{type(outputs).__name__}"
            )
        return outputs.predictions()

    @classmethod
    def fit_many(
        cls,
        recalibrators: Sequence[Recalibrator],
        outputs: Sequence[ModelOutputs],
        contexts: Sequence[FitContext],
    ) -> None:
        """Fit ``recalibrators[i]`` on ``outputs[i]`` with ``contexts[i]``, each exactly as
        its own :meth:`fit` would (to float tolerance).

        Schemes call this with all the replicas of a method that they fit (its seeds ×
        training β), every recalibrator of exactly this class, so that a class can fit them
        together: equal parameters on equal data once (a fit that reads neither the seed
        nor β), or many networks as one batched model. The default fits them one after the
        other.
        """
        for recalibrator, out, context in zip(recalibrators, outputs, contexts):
            recalibrator.fit(out, context)


class DifferentiableRecalibrator(Recalibrator):
    """A recalibrator a scheme can train together with a selector (the ``joint`` scheme),
    and whose full log-probability vector the ``sequential`` / ``selection`` schemes can
    read (S-MCE).

    The protocol:

    * after :meth:`fit`, :meth:`module` returns the recalibrator's *own live*
      :class:`RecalibratorModule` holding its learned state — not a copy. A scheme may move
      it to ``context.device`` (``module.to(device)`` acts in place), train its parameters
      in place, and moves it back to the CPU afterwards; the recalibrator then reflects the
      training;
    * :meth:`confidence` computes its result with that same module (eval mode, no
      gradients), so training done by a scheme is what the evaluation sees;
    * a module whose prediction can differ from ``argmax(logits)`` is a
      :class:`PredictingModule`;
    * a scheme trains the replicas of a method together (:mod:`selbench.training.engine`, through
      ``torch.func`` for any module); optionally, the module's class adds a faster
      hand-stacked implementation (:class:`StackableModule` returning a
      :class:`StackedRecalibratorModule`).

    A parameter-free module (the identity) is never trained: its output is computed once.
    """

    differentiable: ClassVar[bool] = True

    @abc.abstractmethod
    def module(self, outputs: ModelOutputs, context: FitContext) -> RecalibratorModule:
        """The live torch module (see the class docstring); ``outputs`` are the data the
        scheme trains on (for checks; the module is made by :meth:`fit`)."""


class Selector(PluginBase, abc.ABC):
    """g: scores examples so that higher scores are accepted first.

    The core turns scores into decisions: at coverage β it accepts exactly ⌈β·n⌉ of the n
    unlabelled evaluation examples, those with the highest scores, ties broken by a seeded
    order (:func:`selbench.measure.metrics.selection_order`). A selector that a scheme trains
    through a loss is a :class:`TrainableSelector`.
    """

    #: True exactly for :class:`TrainableSelector` subclasses (set by the type; read by
    #: validation): trained by a scheme through a loss, not by :meth:`fit`.
    trainable: ClassVar[bool] = False

    #: False for a selector that does not select (``none``): the core then accepts every
    #: example at every β (coverage 1) instead of choosing ⌈β·n⌉ among its equal scores.
    selects: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _flag_follows_type(cls, "trainable", "TrainableSelector", "a selector",
                           "inputs() and init_module()")

    @abc.abstractmethod
    def fit(
        self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext
    ) -> Selector:
        """Fit on the fitting outputs and the recalibrated confidence; return ``self``."""

    @abc.abstractmethod
    def score(self, outputs: ModelOutputs, confidence: np.ndarray) -> np.ndarray:
        """Selection scores, float64 ``[N]``; higher means more likely to be accepted."""

    @classmethod
    def fit_many(
        cls,
        selectors: Sequence[Selector],
        outputs: Sequence[ModelOutputs],
        confidences: Sequence[np.ndarray],
        contexts: Sequence[FitContext],
    ) -> None:
        """Fit ``selectors[i]`` on ``outputs[i]`` and ``confidences[i]`` with
        ``contexts[i]``, each exactly as its own :meth:`fit` would.

        The ``recalibration`` scheme calls this with all the replicas of a method (its
        seeds × training β), every selector of exactly this class, so that a class whose fit
        reads neither β nor (for some) the seed can fit equal ones once: in a leaderboard the
        training β's of one seed fit on the same data. The default fits them one after the
        other.
        """
        for selector, out, conf, context in zip(selectors, outputs, confidences, contexts):
            selector.fit(out, conf, context)


class TrainableSelector(Selector):
    """A selector trained by a scheme (``selection``, ``sequential``, ``joint``) through a
    selective loss and a coverage loss, not by :meth:`fit`.

    The protocol:

    * :meth:`fit_inputs` (optional; does nothing by default) fits what :meth:`inputs` needs
      (a standardisation, OOD detectors) on the fitting data; a scheme calls it once per
      replica, before :meth:`inputs` on the fitting data;
    * :meth:`inputs` returns the float32 input matrix ``[N, d_in]`` g reads;
    * :meth:`init_module` creates ``self.module_`` (weights seeded by ``context.seed``
      only), a ``torch.nn.Module`` mapping ``[B, d_in] -> ĝ [B]`` in (0, 1), and returns
      it; the scheme trains it in place (possibly on ``context.device``, moving it back to
      the CPU at the end);
    * :meth:`score` runs ``module_`` in eval mode without gradients;
    * a scheme trains the replicas of a method together (:mod:`selbench.training.engine`, through
      ``torch.func`` for any module); optionally, the module's class adds a faster
      hand-stacked implementation (:class:`StackableModule` returning a
      :class:`StackedSelectorModule`).
    """

    trainable: ClassVar[bool] = True

    #: the trained network (set by :meth:`init_module`, trained by the scheme)
    module_: Any

    def fit_inputs(self, outputs: ModelOutputs, context: FitContext) -> None:
        """Fit whatever :meth:`inputs` needs (a standardisation, OOD detectors ...) on the
        fitting data ``outputs``; by default nothing.

        Schemes call it once per replica, before :meth:`inputs` on the fitting data (and
        :meth:`init_module`). It must be deterministic given ``context.seed`` and leave
        ``outputs`` unchanged.
        """

    @abc.abstractmethod
    def inputs(self, outputs: ModelOutputs) -> np.ndarray:
        """The selector's input matrix, float32 ``[N, d_in]`` (a new array); after
        :meth:`fit_inputs` when the selector defines one."""

    @abc.abstractmethod
    def init_module(self, outputs: ModelOutputs, context: FitContext) -> torch.nn.Module:
        """Create, store as ``module_`` and return a freshly initialised network."""

    def fit(self, outputs: ModelOutputs, confidence: np.ndarray, context: FitContext):
        """Not how a trainable selector is fitted: a ``ValueError`` naming the way."""
        raise ValueError(
            f"{type(self).__name__} is trained through a selection loss by a scheme that "
            "trains selectors (selection, sequential, joint), not by fit()"
        )


class SelectionLoss(PluginBase, abc.ABC):
    """A selective calibration loss l(ĝ, h) over a batch (S-TLBCE, S-MCE, S-MMCE).

    Written once for any leading (replica) dimensions: the training engine calls it on
    ``[R, B]`` tensors (R replicas of a method trained as one model, R = 1 alone) and sums
    the ``[R]`` result; a ``[B]`` call gives a scalar. Replica ``r``'s value must depend on
    row ``r`` only.
    """

    #: True when the loss needs the recalibrated log-probability of each example's label
    #: (S-MCE): the scheme reads it off the recalibrator's log-probability vector.
    needs_log_probs: ClassVar[bool] = False

    @abc.abstractmethod
    def __call__(
        self,
        g: torch.Tensor,
        confidence: torch.Tensor,
        correct: torch.Tensor,
        label_log_prob: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The loss ``[...]`` of each leading index. ``g``: soft selection in [0,1]
        ``[..., B]``; ``confidence``: recalibrated top-label confidence ``[..., B]``;
        ``correct``: 0/1 ``[..., B]``; ``label_log_prob``: recalibrated log-probability of
        each example's label ``[..., B]`` (given when :attr:`needs_log_probs`)."""


class CoverageLoss(PluginBase, abc.ABC):
    """A coverage term λ·L_cov(β) that keeps ĝ from rejecting everything; like
    :class:`SelectionLoss`, written for any leading (replica) dimensions."""

    #: Parameters that ``__call__`` also takes as a tensor ``[R]``, one value per leading
    #: (replica) index: the training schemes then make one call for replicas whose coverage
    #: losses differ in these only (the λ of tuning trials) instead of one per value.
    replica_params: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def __call__(self, g: torch.Tensor, beta: float | torch.Tensor) -> torch.Tensor:
        """The loss ``[...]``, weight included, for soft selections ``g [..., B]`` and target
        coverage β (a float, or one per leading index ``[...]``)."""


@dataclass
class FitJob:
    """One replica for :meth:`Scheme.fit_many`: the arguments of one :meth:`Scheme.fit` call.

    The selector and recalibrator are fitted in place, as by ``fit``; each job has its own
    (they are never shared between jobs). ``outputs`` may be shared: the runner passes the
    same rows object to every job (and every method) of one seed, so a plugin must read
    its arrays, never write into them.
    """

    outputs: ModelOutputs
    selector: Selector
    recalibrator: Recalibrator
    loss: SelectionLoss | None
    coverage: CoverageLoss | None
    context: FitContext


class Scheme(PluginBase, abc.ABC):
    """How h and g are trained: recalibration only, selection only, sequential, joint.

    The class attributes below declare what a scheme needs from the method's other
    components; validation checks them before anything runs (defaults check nothing).
    """

    #: Method fields the scheme cannot run without: ``"loss"`` (a :class:`SelectionLoss`)
    #: and/or ``"coverage"`` (a :class:`CoverageLoss`).
    requires: ClassVar[frozenset[str]] = frozenset()

    #: True: the selector must be a :class:`TrainableSelector` (the scheme trains it
    #: through the loss); False: it must not be (the scheme only calls its ``fit``); None:
    #: either.
    selector_must_be_trainable: ClassVar[bool | None] = None

    #: True when the scheme trains h through its module: the recalibrator must be a
    #: :class:`DifferentiableRecalibrator`.
    recalibrator_must_be_differentiable: ClassVar[bool] = False

    #: False when the scheme uses the recalibrator as given, never calling its ``fit``:
    #: a recalibrator declaring ``usable_unfitted = False`` is then rejected.
    fits_recalibrator: ClassVar[bool] = True

    #: True when a loss with :attr:`SelectionLoss.needs_log_probs` gets its log-probabilities
    #: from the recalibrator's module: the recalibrator must then be differentiable and not
    #: declare ``provides_log_probs = False``.
    loss_reads_recalibrator_log_probs: ClassVar[bool] = False

    #: True when the scheme trains for epochs and honours ``FitContext.judge``
    #: (:mod:`selbench.contract.judge`): replicas judged at its rungs, the others dropped.
    judges_epochs: ClassVar[bool] = False

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

        The runner (and :class:`~selbench.SelectiveRecalibrator`, with one job) always
        calls this: once per method with all the unfinished replicas of that method (its
        seeds × training β), so that a scheme can train replicas that share data shapes
        together (the built-in training schemes use :mod:`selbench.training.engine`). An
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

    @classmethod
    def fit_configurations(cls, pairs: Sequence[tuple[Scheme, FitJob]]) -> None:
        """Fit every job with its own scheme: ``pairs`` of (a scheme of this class, a job),
        the schemes' parameters free to differ (the trials of a tuned method: a learning
        rate and a number of epochs per trial, say).

        The core calls it on the schemes' class where one call fits several configurations
        (:mod:`selbench.execution.tuning` fits a batch of trials so). Afterwards each job's
        selector and recalibrator must be exactly as ``scheme.fit_many([job])`` leaves them
        (to float tolerance), and each scheme's learned state (attributes ending in ``_``)
        that of fitting its jobs. The default groups the pairs by equal parameters
        (``get_params(deep=False)``, in order of first appearance) and calls the first
        scheme's :meth:`fit_many` once per group with the group's jobs, the group's other
        schemes receiving a copy of its learned state, so a scheme that overrides nothing
        keeps working; a scheme that can fit different configurations together overrides
        it (the built-in training schemes train every trial of one architecture as one
        model, each replica with its own learning rate, epochs and input noise).
        """
        import copy

        groups: list[tuple[Scheme, list[Scheme], list[FitJob]]] = []
        for scheme, job in pairs:
            for first, schemes, jobs in groups:
                if type(first) is type(scheme) and \
                        first.get_params(deep=False) == scheme.get_params(deep=False):
                    schemes.append(scheme)
                    jobs.append(job)
                    break
            else:
                groups.append((scheme, [scheme], [job]))
        for first, schemes, jobs in groups:
            first.fit_many(jobs)
            learned = {k: v for k, v in vars(first).items() if k.endswith("_")}
            for other in schemes[1:]:
                if other is not first:
                    vars(other).update(copy.deepcopy(learned))


#: The base class(es) a factory of each kind builds: a registered factory class must
#: subclass one of them (a loss is a selection or a coverage loss).
KIND_BASES: dict[str, tuple[type, ...]] = {
    "dataset": (Dataset,),
    "backbone": (Backbone,),
    "selector": (Selector,),
    "recalibrator": (Recalibrator,),
    "loss": (SelectionLoss, CoverageLoss),
    "scheme": (Scheme,),
}
