"""selbench: a benchmark framework for selective recalibration.

Public API for plugin authors: :class:`Plugin`, :class:`Params`, the six base classes
(:class:`Dataset`, :class:`Backbone`, :class:`Selector`, :class:`Recalibrator`,
:class:`SelectionLoss` / :class:`CoverageLoss`, :class:`Scheme`), :class:`ModelOutputs`,
:class:`FitContext` and the :data:`hookimpl` marker. Metrics live in :mod:`selbench.metrics`.

For scikit-learn users: :class:`SelectiveRecalibrator` (:mod:`selbench.estimator`) fits a
method on your own arrays; :func:`run` runs a spec.
"""

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:  # pragma: no cover - imported lazily by __getattr__ below
    from selbench.estimator import SelectiveRecalibrator

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


def __getattr__(name):
    # SelectiveRecalibrator imports scikit-learn (about a second): only when asked for
    if name == "SelectiveRecalibrator":
        from selbench.estimator import SelectiveRecalibrator

        return SelectiveRecalibrator
    raise AttributeError(f"module 'selbench' has no attribute {name!r}")


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
    "SelectiveRecalibrator",
    "Selector",
    "SplitData",
    "__version__",
    "run",
    "hookimpl",
    "hookspec",
]
