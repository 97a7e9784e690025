"""selbench: a benchmark framework for selective recalibration.

Public API for plugin authors: :class:`Plugin`, :class:`Params`, the six base classes
(:class:`Dataset`, :class:`Backbone`, :class:`Selector`, :class:`Recalibrator`,
:class:`SelectionLoss` / :class:`CoverageLoss`, :class:`Scheme`), :class:`ModelOutputs`,
:class:`FitContext` and the :data:`hookimpl` marker. Metrics live in :mod:`selbench.metrics`.
"""

from selbench.api import (
    Backbone,
    CoverageLoss,
    Dataset,
    FitContext,
    NoParams,
    Params,
    Plugin,
    Recalibrator,
    Scheme,
    SelectionLoss,
    Selector,
    SplitData,
)
from selbench.data import DataError, ModelOutputs
from selbench.hookspecs import hookimpl, hookspec
from selbench.inputs import InputDir, InputFile

__version__ = "0.1.0"

__all__ = [
    "Backbone",
    "CoverageLoss",
    "DataError",
    "Dataset",
    "FitContext",
    "InputDir",
    "InputFile",
    "ModelOutputs",
    "NoParams",
    "Params",
    "Plugin",
    "Recalibrator",
    "Scheme",
    "SelectionLoss",
    "Selector",
    "SplitData",
    "__version__",
    "hookimpl",
    "hookspec",
]
