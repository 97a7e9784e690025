"""selbench's metrics, the public face: every metric function and the registry
(:data:`METRICS`) that leaderboard columns are chosen from. The definitions live in
:mod:`selbench.measure`; this module is the path users import (``selbench.metrics.ece``).
It assembles the public names of :mod:`selbench.measure.metrics` and
:func:`~selbench.measure.bootstrap.bootstrap_ci` (whose module builds on
:mod:`selbench.measure.metrics`, so the latter cannot re-export it).
"""

from selbench.measure import metrics as _measured
from selbench.measure.bootstrap import bootstrap_ci
from selbench.measure.classic import (
    ece_equal_width,
    fpr_at_tpr,
    mce,
    nll,
    nll_full,
    selector_auroc,
)
from selbench.measure.guarantee import binomial_upper_bound, sgr
from selbench.measure.metrics import *  # noqa: F403 (its __all__, below)
from selbench.measure.rcstats import (
    augrc_ba,
    aurc_achievable,
    aurc_ba,
    eaugrc,
    eaurc_achievable,
    partial_aurc,
)
from selbench.measure.reliability import clopper_pearson, signed_ce

#: every public name of :mod:`selbench.measure.metrics`, then those of the other measure modules
__all__ = [
    *_measured.__all__,
    "bootstrap_ci",
    "ece_equal_width",
    "fpr_at_tpr",
    "mce",
    "nll",
    "nll_full",
    "selector_auroc",
    "binomial_upper_bound",
    "sgr",
    "augrc_ba",
    "aurc_achievable",
    "aurc_ba",
    "eaugrc",
    "eaurc_achievable",
    "partial_aurc",
    "clopper_pearson",
    "signed_ce",
]
