"""Hook specifications: how a package adds datasets, backbones, selectors, recalibrators,
losses and schemes to selbench — and the whole protocol the runner follows with them.

**Registering plugins.** A plugin package is a module with functions named after these
hooks, decorated with :data:`hookimpl`. Each returns the :class:`~selbench.contract.api.Plugin`
descriptors it provides (a list, or ``None`` / nothing for none). Register the module
through the ``selbench`` entry-point group in your ``pyproject.toml``::

    [project.entry-points.selbench]
    my_plugins = "my_package.selbench_hooks"

and ``selbench plugins`` lists your additions next to the built-ins. Set
``SELBENCH_DISABLE_PLUGIN_AUTOLOAD=1`` to skip every entry point (built-ins stay). A factory
class must subclass its kind's base class in :mod:`selbench.contract.api` (checked at registration:
otherwise the plugin is skipped with a warning naming it, its kind and its distribution).
Names are unique per kind across all installed packages: two providers of one name is an
error naming both.

Example, a complete recalibrator plugin (``my_package/selbench_hooks.py``); its parameters
are declared once, by its signature (:func:`selbench.contract.api.params_model`)::

    from typing import Annotated

    from pydantic import Field
    from selbench import Plugin, Recalibrator, hookimpl

    class Shrink(Recalibrator):
        "Shrink confidence towards 1/K by a fixed factor."
        def __init__(self, factor: Annotated[float, Field(gt=0, le=1)] = 0.9):
            self.factor = factor
        def fit(self, outputs, context):
            self.k_ = outputs.num_classes
            return self
        def confidence(self, outputs):
            c = outputs.confidence()
            return 1 / self.k_ + self.factor * (c - 1 / self.k_)

    @hookimpl
    def selbench_recalibrators():
        return [Plugin("shrink", Shrink)]

**The protocol, fit → score → threshold.** What ``selbench run SPEC`` calls, in order (the
types are those of :mod:`selbench.contract.api`; ``FitContext`` carries the seed, device and β):

1. *Load the spec* (also ``selbench validate``): every component ``{name, params}`` is looked
   up in the registry and its ``params`` validated, once, against the plugin's params model;
   plugin combinations are checked against the capabilities the classes declare; declared
   input files and folders must exist. Nothing else runs on a spec that fails.
2. *Model outputs, per experiment*: ``dataset = Dataset factory(**params)``,
   ``backbone = Backbone factory(**params)``, then for the fitting and evaluation splits
   ``backbone.extract(dataset, split, FitContext(seed=0, device, cache_dir))`` ->
   :class:`~selbench.contract.data.ModelOutputs`, cached on disk by the content of every input, the
   params and the plugins' code (so this runs once per configuration).
3. *Fit, per method*: a *cell* is one seed × training β. Its fitting data are ``n_fit`` rows
   of the fitting split drawn by ``np.random.default_rng([seed, 0x5E1EC7])``. Each cell gets
   newly built plugins, ``Scheme``, ``Selector``, ``Recalibrator`` and the optional
   ``SelectionLoss`` / ``CoverageLoss`` (``factory(**validated params)``), and
   ``FitContext(seed, device, beta=training β)``; torch's, numpy's and Python's global
   generators are seeded with the seed. All unfinished cells of a method go to one
   ``scheme.fit_many([FitJob(outputs, selector, recalibrator, loss, coverage, context),
   ...])`` (the default calls ``scheme.fit(outputs, selector=..., recalibrator=...,
   loss=..., coverage=..., context=...)`` per job), which fits each job's selector and
   recalibrator in place. The built-in schemes call ``Recalibrator.fit_many`` /
   ``recalibrator.fit(outputs, context)``, then either ``selector.fit(outputs,
   recalibrator.confidence(outputs), context)`` (``recalibration``) or train a
   :class:`~selbench.contract.api.TrainableSelector` (``fit_inputs``, ``inputs``, ``init_module``)
   — and, ``joint``, a :class:`~selbench.contract.api.DifferentiableRecalibrator`'s ``module`` —
   on ``loss(ĝ, ĥ, correct, ...) + coverage(ĝ, β)`` (``sequential``, ``selection``,
   ``joint``), all jobs of a method as one model with the training engine
   (:mod:`selbench.training.engine`: any module, ``[R, B]`` losses). A tuned method (an
   experiment's ``tuning``) fits each batch of trials with one
   ``type(scheme).fit_configurations([(scheme, job), ...])`` call, a scheme per trial with
   its own parameters (the default calls ``fit_many`` once per group of equal ones; the
   training schemes train the trials as one model, a learning rate, epochs and noise each).
4. *Score* the cell's evaluation rows (the evaluation split, less the fitting rows when both
   splits are the same, optionally a fixed ``n_eval`` subsample):
   ``confidence = recalibrator.confidence(eval)`` (float64 ``[N]`` in [0, 1]),
   ``prediction = recalibrator.predict(eval)`` (int64 ``[N]``), ``score =
   selector.score(eval, confidence)`` (float64 ``[N]``, higher = accepted first); each is
   checked, and ``correct = prediction == labels``.
5. *Threshold*: at each coverage β the core accepts exactly ``k`` examples,
   ``k = ceil(β·n)`` (:func:`selbench.measure.metrics.accepted_counts`; with
   ``coverage_guarantee: {delta}`` the Hoeffding count), the first ``k`` of
   :func:`selbench.measure.metrics.selection_order` (the highest scores; ties broken by a
   permutation seeded with the cell's seed). A selector with ``selects = False`` accepts
   every example at every β. The selector never chooses its own threshold.
6. *Measure*: ECE₁, ECE₂, Brier score, accuracy and coverage of the accepted examples
   (:func:`selbench.measure.metrics.selective_metrics`), then the leaderboard.

Plugins never compute metrics and never write result files: the core owns both.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from selbench.contract.api import Plugin

PROJECT = "selbench"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def selbench_datasets() -> Iterable[Plugin] | None:
    """Return the dataset plugins this package provides.

    Each factory builds a :class:`selbench.contract.api.Dataset`: ``splits()`` lists split names and
    ``split(name)`` returns a :class:`selbench.contract.api.SplitData` whose ``inputs`` the paired
    backbone understands (images, vectors, or ready :class:`~selbench.contract.data.ModelOutputs`).
    A missing file is a ``FileNotFoundError`` saying where to get it; never download
    silently inside ``split``.

    Example::

        @hookimpl
        def selbench_datasets():
            return [Plugin("my-data", MyDataset)]
    """


@hookspec
def selbench_backbones() -> Iterable[Plugin] | None:
    """Return the backbone plugins this package provides.

    Each factory builds a :class:`selbench.contract.api.Backbone` whose
    ``extract(dataset, split, context)`` returns :class:`~selbench.contract.data.ModelOutputs`
    (features = penultimate layer, logits, labels). Use ``context.device`` for compute and
    ``context.seed`` for any randomness; the core caches the result on disk, keyed by the
    dataset and backbone configuration and the split.

    Example::

        @hookimpl
        def selbench_backbones():
            return [Plugin("my-net", MyNet)]
    """


@hookspec
def selbench_selectors() -> Iterable[Plugin] | None:
    """Return the selector plugins (g) this package provides.

    Each factory builds a :class:`selbench.contract.api.Selector`: ``fit(outputs, confidence,
    context)`` returns ``self``; ``score(outputs, confidence)`` returns float64 ``[N]``,
    higher = accepted first. The core, not the selector, chooses the threshold for each
    coverage β. A selector trained by a scheme's loss subclasses
    :class:`selbench.contract.api.TrainableSelector` instead.

    Example::

        @hookimpl
        def selbench_selectors():
            return [Plugin("entropy", EntropySelector)]
    """


@hookspec
def selbench_recalibrators() -> Iterable[Plugin] | None:
    """Return the recalibrator plugins (h) this package provides.

    Each factory builds a :class:`selbench.contract.api.Recalibrator`: ``fit(outputs, context)``
    returns ``self``; ``confidence(outputs)`` returns the recalibrated top-label confidence,
    float64 ``[N]`` in ``[0, 1]``, of the label ``predict(outputs)`` returns (by default
    ``argmax(logits)``). One that a scheme may train jointly with a selector subclasses
    :class:`selbench.contract.api.DifferentiableRecalibrator`.

    Example::

        @hookimpl
        def selbench_recalibrators():
            return [Plugin("shrink", Shrink)]
    """


@hookspec
def selbench_losses() -> Iterable[Plugin] | None:
    """Return the loss plugins this package provides.

    A factory builds either a :class:`selbench.contract.api.SelectionLoss` (named by a method's
    ``loss``) or a :class:`selbench.contract.api.CoverageLoss` (named by its ``coverage``). Losses
    are torch callables returning a scalar; they must be differentiable in ``g`` and in the
    recalibrated confidence.

    Example::

        @hookimpl
        def selbench_losses():
            return [Plugin("s-focal", SelectiveFocal)]
    """


@hookspec
def selbench_schemes() -> Iterable[Plugin] | None:
    """Return the training-scheme plugins this package provides.

    Each factory builds a :class:`selbench.contract.api.Scheme` whose ``fit(outputs, selector=...,
    recalibrator=..., loss=..., coverage=..., context=...)`` fits the given recalibrator and
    selector in place and returns ``self``.

    Example::

        @hookimpl
        def selbench_schemes():
            return [Plugin("alternating", Alternating)]
    """


#: hook name for each plugin kind
HOOK_FOR_KIND: dict[str, str] = {
    "dataset": "selbench_datasets",
    "backbone": "selbench_backbones",
    "selector": "selbench_selectors",
    "recalibrator": "selbench_recalibrators",
    "loss": "selbench_losses",
    "scheme": "selbench_schemes",
}
