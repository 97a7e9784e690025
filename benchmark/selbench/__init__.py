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


def run(spec, **kwargs):
    """Run (or resume) a spec and return its results: see :func:`selbench.runner.run`.

    ``spec`` is a YAML path, a dict or a resolved spec; the keyword arguments are those of
    :func:`selbench.runner.run` (``out_dir``, ``device``, ``overrides``, ``cache_dir``,
    ``progress``, ``plots``, ``force``, ``only``). The returned
    :class:`~selbench.runner.RunResults` gives the typed cell records (``.cells()``), the
    leaderboard (``.leaderboard()``) and a pandas frame (``.to_frame()``).
    """
    from selbench.runner import run as _run

    return _run(spec, **kwargs)

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
    "run",
    "hookimpl",
    "hookspec",
]
