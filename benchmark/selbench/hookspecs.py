"""Hook specifications: how a package adds datasets, backbones, selectors, recalibrators,
losses and schemes to selbench.

A plugin package is a module with functions named after these hooks, decorated with
:data:`hookimpl`. Each returns the :class:`~selbench.api.Plugin` descriptors it provides
(a list, or ``None`` / nothing for none). Register the module through the ``selbench``
entry-point group in your ``pyproject.toml``::

    [project.entry-points.selbench]
    my_plugins = "my_package.selbench_hooks"

and ``selbench plugins`` lists your additions next to the built-ins. Set
``SELBENCH_DISABLE_PLUGIN_AUTOLOAD=1`` to skip every entry point (built-ins stay).

Example, a complete recalibrator plugin (``my_package/selbench_hooks.py``)::

    import numpy as np
    from selbench import Plugin, Params, Recalibrator, hookimpl

    class ShrinkParams(Params):
        factor: float = 0.9

    class Shrink(Recalibrator):
        "Shrink confidence towards 1/K by a fixed factor."
        def __init__(self, factor=0.9):
            self.factor = factor
        def fit(self, outputs, context):
            self.k_ = outputs.num_classes
            return self
        def confidence(self, outputs):
            c = outputs.confidence()
            return 1 / self.k_ + self.factor * (c - 1 / self.k_)

    @hookimpl
    def selbench_recalibrators():
        return [Plugin("shrink", Shrink, ShrinkParams)]

Names are unique per kind across all installed packages: two providers of one name is an
error naming both.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from selbench.api import Plugin

PROJECT = "selbench"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def selbench_datasets() -> Iterable[Plugin] | None:
    """Return the dataset plugins this package provides.

    Each factory builds a :class:`selbench.api.Dataset`: ``splits()`` lists split names and
    ``split(name)`` returns a :class:`selbench.api.SplitData` whose ``inputs`` the paired
    backbone understands (images, vectors, or ready :class:`~selbench.data.ModelOutputs`).
    A missing file is a ``FileNotFoundError`` saying where to get it; never download
    silently inside ``split``.

    Example::

        @hookimpl
        def selbench_datasets():
            return [Plugin("my-data", MyDataset, MyDatasetParams)]
    """


@hookspec
def selbench_backbones() -> Iterable[Plugin] | None:
    """Return the backbone plugins this package provides.

    Each factory builds a :class:`selbench.api.Backbone` whose
    ``extract(dataset, split, context)`` returns :class:`~selbench.data.ModelOutputs`
    (features = penultimate layer, logits, labels). Use ``context.device`` for compute and
    ``context.seed`` for any randomness; the core caches the result on disk, keyed by the
    dataset and backbone configuration and the split.

    Example::

        @hookimpl
        def selbench_backbones():
            return [Plugin("my-net", MyNet, MyNetParams)]
    """


@hookspec
def selbench_selectors() -> Iterable[Plugin] | None:
    """Return the selector plugins (g) this package provides.

    Each factory builds a :class:`selbench.api.Selector`: ``fit(outputs, confidence,
    context)`` returns ``self``; ``score(outputs, confidence)`` returns float64 ``[N]``,
    higher = accepted first. The core, not the selector, chooses the threshold for each
    coverage β. Set ``trainable = True`` only for selectors trained by a scheme's loss.

    Example::

        @hookimpl
        def selbench_selectors():
            return [Plugin("entropy", EntropySelector)]
    """


@hookspec
def selbench_recalibrators() -> Iterable[Plugin] | None:
    """Return the recalibrator plugins (h) this package provides.

    Each factory builds a :class:`selbench.api.Recalibrator`: ``fit(outputs, context)``
    returns ``self``; ``confidence(outputs)`` returns the recalibrated top-label confidence,
    float64 ``[N]`` in ``[0, 1]``. The prediction stays ``argmax(logits)``.

    Example::

        @hookimpl
        def selbench_recalibrators():
            return [Plugin("shrink", Shrink, ShrinkParams)]
    """


@hookspec
def selbench_losses() -> Iterable[Plugin] | None:
    """Return the loss plugins this package provides.

    A factory builds either a :class:`selbench.api.SelectionLoss` (named by a method's
    ``loss``) or a :class:`selbench.api.CoverageLoss` (named by its ``coverage``). Losses
    are torch callables returning a scalar; they must be differentiable in ``g`` and in the
    recalibrated confidence.

    Example::

        @hookimpl
        def selbench_losses():
            return [Plugin("s-focal", SelectiveFocal, SelectiveFocalParams)]
    """


@hookspec
def selbench_schemes() -> Iterable[Plugin] | None:
    """Return the training-scheme plugins this package provides.

    Each factory builds a :class:`selbench.api.Scheme` whose ``fit(outputs, selector=...,
    recalibrator=..., loss=..., coverage=..., context=...)`` fits the given recalibrator and
    selector in place and returns ``self``.

    Example::

        @hookimpl
        def selbench_schemes():
            return [Plugin("alternating", Alternating, AlternatingParams)]
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
