"""How a cell is evaluated: the fitting sample, the evaluation rows, and the measurement.

This module and :mod:`selbench.measure.metrics` decide every number of a cell, so their source is part
of every cell's key (:func:`selbench.execution.codeid.core_digest`): editing either recomputes the cells.

* The fitting sample of seed ``s`` is ``n_fit`` rows of the fitting split drawn without
  replacement by ``np.random.default_rng([s, 0x5E1EC7])`` (all rows when ``n_fit`` is unset).
* The evaluation rows are the evaluation split, less the fitting sample when both splits are
  the same, then a fixed seeded subsample of ``n_eval`` rows when set.
* The recalibrator gives the confidence and prediction of every evaluation example, the
  selector its score; at each β the accepted examples are chosen by
  :func:`selbench.measure.metrics.selective_metrics` (exactly ⌈β·n⌉ of them, ties broken by the
  cell's seed) and measured: every metric of the registry :data:`selbench.measure.metrics.METRICS`
  (:func:`measure`), the ``selective`` ones on the accepted examples at each β, the
  ``ranking`` ones (AURC, E-AURC, AUGRC) once over all evaluation examples from the
  selector's scores.
* With ``bootstrap.resamples > 0`` each metric also gets a percentile bootstrap interval over
  the evaluation examples (:func:`intervals`, :func:`selbench.measure.bootstrap.selective_intervals`).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from selbench.contract.data import ModelOutputs
from selbench.measure.bootstrap import selective_intervals
from selbench.measure.classic import (
    ece_equal_width,
    fpr_at_tpr,
    mce,
    nll,
    nll_full,
    selector_auroc,
)
from selbench.measure.guarantee import risk_guarantee_intervals, risk_guarantee_metrics, sgr
from selbench.measure.metrics import (
    METRICS,
    accepted_counts,
    augrc,
    aurc,
    classwise_ece,
    eaurc,
    ece,
    selection_order,
    selective_metrics,
    smece,
)
from selbench.measure.rcstats import augrc_ba, aurc_achievable, aurc_ba, eaugrc, paurc
from selbench.measure.reliability import signed_ce
from selbench.measure.riskcoverage import rc_counts
from selbench.measure.smooth import smece_bandwidth, smece_prefix_rows, smece_rows

__all__ = ["EvaluationError", "check_vector", "distribution_metrics", "eval_rows", "fit_indices",
           "guaranteed_risk", "guaranteed_risk_intervals", "smece_at_bandwidths",
           "intervals", "measure", "score"]

#: How each ranking metric of the registry is computed from a cell's scores and correctness.
RANKING = {"aurc": aurc, "eaurc": eaurc, "augrc": augrc,
           "auroc": selector_auroc, "fpr95": fpr_at_tpr,
           "aurc_achievable": aurc_achievable, "eaugrc": eaugrc, "paurc": paurc}
#: Ranking metrics that also need the true classes (``arrays["labels"]``, which
#: :func:`score` returns; ``nan`` for arrays without them): fd-shifts' balanced-accuracy
#: areas. No bootstrap intervals (the resampling hooks pass scores and correctness only).
RANKING_LABELLED = {"aurc_ba": aurc_ba, "augrc_ba": augrc_ba}
#: Selective metrics measured here on the accepted examples, beyond those of
#: :func:`selective_metrics` (ECE₁, ECE₂, Brier, accuracy, coverage).
def ece2_debiased(confidence: Any, correct: Any) -> float:
    """The debiased ECE₂ of the leaderboard: ``ece(confidence, correct, p=2, debias=True)``."""
    return ece(confidence, correct, p=2, debias=True)


def _ece2_debiased_bins(counts: np.ndarray, conf_mean: np.ndarray,
                        acc_mean: np.ndarray) -> np.ndarray:
    """:func:`ece2_debiased` of every row of equal-mass bin statistics ``[R, bins]``
    (``from_bins``: the library's ``unbiased_l2_ce``, bins of fewer than 2 examples count 0)."""
    weights = counts / counts.sum(axis=1, keepdims=True)
    big = counts >= 2
    denom = np.where(big, counts - 1.0, 1.0)
    errors = np.where(big, (conf_mean - acc_mean) ** 2 - acc_mean * (1.0 - acc_mean) / denom,
                      0.0)
    return np.maximum(np.sum(weights * errors, axis=1), 0.0) ** 0.5


ece2_debiased.from_bins = _ece2_debiased_bins  # type: ignore[attr-defined]

EXTRA_SELECTIVE = {"smece": smece, "signed_ce": signed_ce, "nll": nll, "mce": mce,
                   "ece1_ew": ece_equal_width, "ece2_debiased": ece2_debiased}
#: The metrics of the recalibrated distribution (registry ``needs="log_probs"``), from the
#: accepted examples' log-probabilities ``[k, K]`` and labels ``[k]``; measured only when the
#: cell's arrays hold ``log_probs`` (:func:`measure`).
DISTRIBUTION = {"nll_full": nll_full, "classwise_ece": lambda lp, y: classwise_ece(
    _probabilities(lp), y)}
#: Those of :data:`EXTRA_SELECTIVE` that get bootstrap intervals per cell (all of them;
#: smECE at a fixed bandwidth, see :func:`smece_at_bandwidths`).
BOOTSTRAPPED_EXTRA: tuple[str, ...] = ("smece", "signed_ce", "nll", "mce", "ece1_ew",
                                       "ece2_debiased")


class EvaluationError(ValueError):
    """A plugin returned something the core cannot measure; the message names the plugin."""


def fit_indices(n_total: int, n_fit: int | None, seed: int, where: str) -> np.ndarray:
    """The rows of the fitting split that seed ``seed`` fits on (sorted)."""
    if n_fit is None:
        return np.arange(n_total)
    if n_fit > n_total:
        raise EvaluationError(
            f"{where}: n_fit={n_fit} but the fitting split has only {n_total} examples"
        )
    rng = np.random.default_rng([seed, 0x5E1EC7])
    return np.sort(rng.choice(n_total, size=n_fit, replace=False))


def eval_rows(n_total: int, fit_idx: np.ndarray, same_split: bool, n_eval: int | None,
              e_i: int) -> np.ndarray:
    """Rows of the evaluation split a cell is measured on."""
    rows = np.arange(n_total)
    if same_split:  # never evaluate on the examples used for fitting
        mask = np.ones(n_total, dtype=bool)
        mask[fit_idx] = False
        rows = np.flatnonzero(mask)
    if n_eval is not None and n_eval < len(rows):
        rng = np.random.default_rng([0xE7A1, e_i])
        rows = rows[np.sort(rng.choice(len(rows), n_eval, replace=False))]
    return rows


def check_vector(values: Any, n: int, what: str, lo: float | None = None,
                 hi: float | None = None, integer: bool = False) -> np.ndarray:
    """``values`` as a float64 (or int64) ``[n]`` array; :class:`EvaluationError` naming
    ``what`` when it is not one, holds NaN/inf, or leaves ``[lo, hi]``."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise EvaluationError(f"{what} returned {type(values).__name__}, not a numeric "
                              f"array ({exc})") from None
    if arr.shape != (n,):
        raise EvaluationError(f"{what} returned shape {arr.shape}, expected ({n},)")
    if not np.all(np.isfinite(arr)):
        raise EvaluationError(f"{what} returned NaN or infinite values")
    if lo is not None and n and (arr.min() < lo - 1e-9 or arr.max() > hi + 1e-9):
        raise EvaluationError(f"{what} returned values outside [{lo:g}, {hi:g}]")
    if integer:
        if n and not np.all(arr == np.round(arr)):
            raise EvaluationError(f"{what} returned non-integer labels")
        return arr.astype(np.int64)
    return np.clip(arr, lo, hi) if lo is not None else arr


def score(
    outputs: ModelOutputs, recalibrator: Any, selector: Any, names: tuple[str, str]
) -> dict[str, np.ndarray]:
    """Per-example ``confidence``, ``prediction``, ``score`` and ``correct`` of a fitted
    recalibrator and selector on ``outputs``, each checked (``names``: the recalibrator's and
    the selector's descriptions, for error messages)."""
    n = len(outputs)
    recal_name, sel_name = names
    conf = check_vector(recalibrator.confidence(outputs), n, f"{recal_name}.confidence", 0.0, 1.0)
    pred = check_vector(recalibrator.predict(outputs), n, f"{recal_name}.predict", 0,
                        outputs.num_classes - 1, integer=True)
    sc = check_vector(selector.score(outputs, conf), n, f"{sel_name}.score")
    correct = (pred == outputs.labels).astype(np.float64)
    return {"confidence": conf, "prediction": pred, "score": sc, "correct": correct,
            "labels": outputs.labels}


def measure(arrays: dict[str, np.ndarray], betas: list[float], *, delta: float | None,
            seed: int, selects: bool = True) -> dict[str, np.ndarray]:
    """Every metric of the registry at each β, ties broken by ``seed``.

    The selective metrics are those of :func:`selective_metrics`, with :data:`EXTRA_SELECTIVE`
    computed there on the same accepted examples (in confidence order); the ranking
    metrics (:data:`RANKING`) are computed once from all scores and repeated at every β. For
    a selector that does not select (``Selector.selects`` is False) every example is
    accepted at every β: the metrics of β = 1 are repeated, coverage (and, with ``delta``,
    the guaranteed coverage: nothing is rejected) is 1.
    """
    m = len(betas)
    scores, conf, correct = arrays["score"], arrays["confidence"], arrays["correct"]
    if selects:
        out = selective_metrics(scores, conf, correct, betas, delta=delta, seed=seed,
                                extra=EXTRA_SELECTIVE)
    else:
        full = selective_metrics(scores, conf, correct, [1.0], seed=seed, extra=EXTRA_SELECTIVE)
        out = {k: np.repeat(v, m) for k, v in full.items()}
        if delta is not None:
            out["guaranteed_coverage"] = np.ones(m)
    curve = None  # the merged-tie curve, shared by the metrics that have a from_counts form
    for key, fn in RANKING.items():
        from_counts = getattr(fn, "from_counts", None)
        if from_counts is not None and len(scores):
            curve = rc_counts(scores, correct) if curve is None else curve
            out[key] = np.full(m, from_counts(*curve))
        else:
            out[key] = np.full(m, fn(scores, correct))
    labels = arrays.get("labels")  # from score(); without the classes: nan
    for key, fn in RANKING_LABELLED.items():
        out[key] = np.full(m, fn(scores, correct, labels) if labels is not None else np.nan)
    if "log_probs" in arrays:
        out.update(distribution_metrics(arrays, betas, delta=delta, seed=seed, selects=selects))
    missing = {k for k, info in METRICS.items() if info.needs is None} - set(out)
    assert not missing, f"registered metrics not measured: {sorted(missing)}"
    return out


def _probabilities(log_probs: np.ndarray) -> np.ndarray:
    p = np.exp(log_probs)
    return p / p.sum(axis=1, keepdims=True)


def distribution_metrics(arrays: dict[str, np.ndarray], betas: list[float], *,
                         delta: float | None, seed: int, selects: bool = True
                         ) -> dict[str, np.ndarray]:
    """The :data:`DISTRIBUTION` metrics at each β on the examples accepted there (the rule
    of :func:`selective_metrics`: the first ⌈β·n⌉ of :func:`selection_order`, or the
    Hoeffding count with ``delta``; every example for a selector that does not select),
    from ``arrays["log_probs"]`` ``[n, K]`` and ``arrays["labels"]`` ``[n]``."""
    log_probs, labels = arrays["log_probs"], arrays["labels"]
    n = labels.shape[0]
    if selects:
        order = selection_order(arrays["score"], seed=seed)
        with warnings.catch_warnings():  # selective_metrics has warned already
            warnings.filterwarnings("ignore", "coverage cannot be guaranteed", RuntimeWarning)
            counts, _ = accepted_counts(n, betas, delta=delta)
    else:
        order, counts = np.arange(n), np.full(len(betas), n)
    out = {key: np.empty(len(betas)) for key in DISTRIBUTION}
    for j, k in enumerate(counts):
        rows = np.sort(order[: int(k)])
        for key, fn in DISTRIBUTION.items():
            out[key][j] = fn(log_probs[rows], labels[rows])
    return out


def guaranteed_risk(fit_arrays: dict[str, np.ndarray], arrays: dict[str, np.ndarray],
                    betas: list[float], *, risk: float, delta: float) -> dict[str, np.ndarray]:
    """A risk guarantee's metrics (registry ``needs="risk_guarantee"``), repeated at each β:
    SGR's threshold from the scored fitting data ``fit_arrays`` (:func:`selbench.measure.
    guarantee.sgr`), applied to the evaluation ``arrays`` (``score >= threshold``)."""
    got = risk_guarantee_metrics(fit_arrays["score"], fit_arrays["correct"], arrays["score"],
                                 arrays["correct"], risk, delta)
    return {key: np.full(len(betas), value) for key, value in got.items()}


def guaranteed_risk_intervals(fit_arrays: dict[str, np.ndarray], arrays: dict[str, np.ndarray],
                              *, risk: float, delta: float, resamples: int, level: float,
                              seed: int) -> dict[str, dict[str, float]]:
    """Bootstrap intervals over the evaluation examples of :func:`guaranteed_risk`'s metrics
    (SGR's threshold fixed by the fitting data: :func:`selbench.measure.guarantee.
    risk_guarantee_intervals`), in the form of a ranking metric's (one interval a cell)."""
    chosen = sgr(fit_arrays["score"], fit_arrays["correct"], risk, delta)
    return risk_guarantee_intervals(chosen.threshold, arrays["score"], arrays["correct"], risk,
                                    chosen.bound, resamples=resamples, level=level, seed=seed)


def smece_at_bandwidths(arrays: dict[str, np.ndarray], betas: list[float], *,
                        delta: float | None, seed: int, selects: bool) -> Any:
    """smECE for the bootstrap of one cell: on ``k`` accepted examples, smECE at the
    bandwidth ``s*`` that :func:`smece` chose on the cell's own ``k`` accepted examples
    (:func:`selbench.measure.smooth.smece_bandwidth`), not searched again per resample: the
    search costs about eleven smoothings where one is needed, and the batched form
    (``.batched``, :func:`selbench.measure.smooth.smece_rows`) smooths all resamples at once.
    The interval so leaves out the bandwidth's own variation between resamples: measured on
    five quickstart cells (200 resamples) it is as wide as the searched one's or wider (the
    AUC's up to 15 %, single β's up to 45 %), never narrower by more than rounding, at about
    an eighth of the cost (:func:`selbench.measure.smooth.smece_prefix_rows`, all β's at once)."""
    sc, conf, corr = arrays["score"], arrays["confidence"], arrays["correct"]
    n = sc.shape[0]
    if selects:
        order = selection_order(sc, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            counts = accepted_counts(n, betas, delta=delta)[0]
    else:
        order, counts = np.arange(n), np.array([n])
    sigma = {int(k): smece_bandwidth(conf[order[:k]], corr[order[:k]])
             for k in np.unique(counts).tolist() if k > 0}

    def at_bandwidth(confidence: Any, correct: Any) -> float:
        k = len(confidence)
        return smece(confidence, correct, sigma=sigma[k]) if k else float("nan")

    def rows(confidence: np.ndarray, correct: np.ndarray) -> np.ndarray:
        k = confidence.shape[1]
        return smece_rows(confidence, correct, sigma[k]) if k else np.full(len(confidence),
                                                                             np.nan)

    def prefixes(confidence: np.ndarray, correct: np.ndarray, ks: np.ndarray) -> np.ndarray:
        return smece_prefix_rows(confidence, correct, ks, [sigma.get(int(k), 1.0) for k in ks])

    at_bandwidth.batched = rows  # type: ignore[attr-defined]
    at_bandwidth.prefixes = prefixes  # type: ignore[attr-defined]
    return at_bandwidth


def intervals(arrays: dict[str, np.ndarray], betas: list[float], *, delta: float | None,
              seed: int, selects: bool, resamples: int, level: float) -> dict[str, Any]:
    """Percentile bootstrap intervals over the evaluation examples of every metric of
    :func:`measure` but the coverages (set by β, not measured) and those of the recalibrated
    distribution (:data:`DISTRIBUTION`): for the selective ones at each β and of their AUC over
    β (smECE at the cell's own bandwidth, :func:`smece_at_bandwidths`), for the ranking ones of
    their single value (see :func:`selbench.measure.bootstrap.selective_intervals`). Resample
    draws are seeded by ``seed``."""
    extra = {k: EXTRA_SELECTIVE[k] for k in BOOTSTRAPPED_EXTRA}
    extra["smece"] = smece_at_bandwidths(arrays, betas, delta=delta, seed=seed, selects=selects)
    with warnings.catch_warnings():  # measure() has warned of an infeasible guarantee once
        warnings.filterwarnings("ignore", "coverage cannot be guaranteed", RuntimeWarning)
        return selective_intervals(
            arrays["score"], arrays["confidence"], arrays["correct"], betas,
            n_resamples=resamples, level=level, seed=seed, delta=delta, selects=selects,
            extra=extra, ranking=RANKING,
        )
