"""selbench: a benchmark framework for selective recalibration.

Public API for plugin authors (the contract is :mod:`selbench.contract.api`): :class:`Plugin`, the six
base classes (:class:`Dataset`, :class:`Backbone`, :class:`Selector`, :class:`Recalibrator`,
:class:`SelectionLoss` / :class:`CoverageLoss`, :class:`Scheme`), the typed protocols
:class:`TrainableSelector` and :class:`DifferentiableRecalibrator`, :class:`ModelOutputs`,
:class:`FitContext`, the input checks (:func:`check_outputs`, :func:`check_confidence`,
:func:`check_features`, :class:`NotFittedError`) and the :data:`hookimpl` marker; the
conformance kit is :mod:`selbench.testing` (it needs no pytest: :func:`selbench.testing.check_plugin`
runs anywhere). For a jointly trainable recalibrator: :class:`ModuleRecalibrator` (the base
that keeps a live torch module in ``module_``) and :func:`run_module` (run a module on numpy
arrays in eval mode); both import torch, so they load on first use. Metrics live in
:mod:`selbench.metrics`.

For scikit-learn users: :class:`SelectiveRecalibrator` (:mod:`selbench.library.estimator`) fits a
method on your own arrays; :func:`tune` (:class:`TuneSearch`) tunes one with a spec's
equal-budget protocol; :func:`run` runs a spec.
"""

from typing import TYPE_CHECKING

from selbench.contract.api import (
    Backbone,
    CoverageLoss,
    Dataset,
    DifferentiableRecalibrator,
    FitContext,
    NoParams,
    Params,
    Plugin,
    Recalibrator,
    Scheme,
    SelectionLoss,
    Selector,
    SplitData,
    TrainableSelector,
    params_model,
)
from selbench.contract.data import DataError, ModelOutputs
from selbench.contract.hookspecs import hookimpl, hookspec
from selbench.contract.inputs import InputDir, InputFile
from selbench.contract.search import Tune
from selbench.util.version import __version__

if TYPE_CHECKING:  # pragma: no cover - imported lazily by __getattr__ below
    from selbench.contract.checks import (
        NotFittedError,
        check_confidence,
        check_features,
        check_outputs,
    )
    from selbench.execution.pysearch import TuneSearch
    from selbench.library.estimator import SelectiveRecalibrator
    from selbench.training.recalibrator import ModuleRecalibrator
    from selbench.training.torchutils import run_module



def run(spec, **kwargs):
    """Run (or resume) a spec and return its results: see :func:`selbench.execution.runner.run`.

    ``spec`` is a YAML path, a dict or a resolved spec; the keyword arguments are those of
    :func:`selbench.execution.runner.run` (``out_dir``, ``device``, ``overrides``, ``cache_dir``,
    ``progress``, ``plots``, ``force``, ``only``). The returned
    :class:`~selbench.execution.results_api.RunResults` gives the typed cell records (``.cells()``), the
    leaderboard (``.leaderboard()``) and a pandas frame (``.to_frame()``).
    """
    from selbench.execution.runner import run as _run

    return _run(spec, **kwargs)


def tune(estimator=None, logits=None, labels=None, features=None, **kwargs):
    """Tune a :class:`SelectiveRecalibrator` on your arrays with the equal-budget protocol of
    a spec's ``tuning:`` block: see :class:`selbench.execution.pysearch.TuneSearch`.

    ``tune(est, logits, labels, trials=20, objective="ece1", search={...})`` returns the
    fitted search: ``best_params_``, ``best_score_``, ``cv_results_`` and
    ``best_estimator_`` (refitted on every row); ``estimator`` None tunes the paper's method.
    """
    from selbench.execution.pysearch import tune as _tune

    if logits is None:
        raise TypeError("tune() needs the logits (or a classifier's inputs) to tune on")
    return _tune(estimator, logits, labels, features, **kwargs)


_CHECKS = ("NotFittedError", "check_confidence", "check_features", "check_outputs")


def __getattr__(name):
    # these import scikit-learn (about a second): only when asked for
    if name == "SelectiveRecalibrator":
        from selbench.library.estimator import SelectiveRecalibrator

        return SelectiveRecalibrator
    if name == "TuneSearch":
        from selbench.execution.pysearch import TuneSearch

        return TuneSearch
    if name == "ModuleRecalibrator":  # these import torch: only when asked for
        from selbench.training.recalibrator import ModuleRecalibrator

        return ModuleRecalibrator
    if name == "run_module":
        from selbench.training.torchutils import run_module

        return run_module
    if name in _CHECKS:
        from selbench.contract import checks

        return getattr(checks, name)
    raise AttributeError(f"module 'selbench' has no attribute {name!r}")


def __dir__():
    # the lazily loaded names above are public too: dir() and tab completion list them
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Backbone",
    "CoverageLoss",
    "DataError",
    "Dataset",
    "DifferentiableRecalibrator",
    "FitContext",
    "InputDir",
    "InputFile",
    "ModelOutputs",
    "ModuleRecalibrator",
    "NoParams",
    "NotFittedError",
    "Params",
    "Plugin",
    "Recalibrator",
    "Scheme",
    "SelectionLoss",
    "SelectiveRecalibrator",
    "Selector",
    "SplitData",
    "TrainableSelector",
    "Tune",
    "TuneSearch",
    "__version__",
    "check_confidence",
    "check_features",
    "check_outputs",
    "params_model",
    "run",
    "run_module",
    "tune",
    "hookimpl",
    "hookspec",
]
