"""selbench's metrics, the public face: every metric function and the registry
(:data:`METRICS`) that leaderboard columns are chosen from. The definitions live in
:mod:`selbench.measure`; this module is the path users import (``selbench.metrics.ece``).
It assembles the public names of :mod:`selbench.measure.metrics` and
:func:`~selbench.measure.bootstrap.bootstrap_ci` (whose module builds on
:mod:`selbench.measure.metrics`, so the latter cannot re-export it).
"""

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
from selbench.measure.metrics import (
    DEFAULT_BETAS,
    DEFAULT_COLUMNS,
    METRICS,
    MetricInfo,
    SmoothReliability,
    accept_mask,
    accepted_counts,
    accuracy,
    auc,
    augrc,
    aurc,
    brier,
    classwise_ece,
    coverage_at_risk,
    eaurc,
    ece,
    ece_sorted,
    metric_info,
    risk_at_coverage,
    risk_coverage_curve,
    selection_order,
    selective_metrics,
    smece,
    smooth_reliability,
    thresholds,
    top_label,
)
from selbench.measure.rcstats import (
    augrc_ba,
    aurc_achievable,
    aurc_ba,
    eaugrc,
    eaurc_achievable,
    partial_aurc,
)
from selbench.measure.reliability import clopper_pearson, signed_ce

__all__ = [
    "augrc_ba",
    "aurc_achievable",
    "aurc_ba",
    "binomial_upper_bound",
    "clopper_pearson",
    "eaugrc",
    "eaurc_achievable",
    "partial_aurc",
    "sgr",
    "signed_ce",
    "ece_equal_width",
    "fpr_at_tpr",
    "mce",
    "nll",
    "nll_full",
    "selector_auroc",
    "DEFAULT_BETAS",
    "SmoothReliability",
    "DEFAULT_COLUMNS",
    "METRICS",
    "MetricInfo",
    "accept_mask",
    "accepted_counts",
    "accuracy",
    "auc",
    "aurc",
    "augrc",
    "bootstrap_ci",
    "brier",
    "classwise_ece",
    "coverage_at_risk",
    "eaurc",
    "ece",
    "ece_sorted",
    "metric_info",
    "risk_at_coverage",
    "risk_coverage_curve",
    "selection_order",
    "selective_metrics",
    "smece",
    "smooth_reliability",
    "thresholds",
    "top_label",
]
