"""selbench against its peers: netcal, probmetrics, uncertainty-calibration, torchmetrics,
relplot, torch-uncertainty.

Every workload is timed for selbench and for each peer that implements it, in the same
run, on the same seeded synthetic data: float32 logits ``z = scale * N(0, 1)`` (scale 3
for temperature scaling, 2 elsewhere), labels drawn from ``softmax(z / 2)`` (over-confident
logits; from ``softmax(z)`` for the ECE, so that the bins' errors differ in sign and the
binning matters). Times are the best of ``--repeats`` calls (a call over 1 s runs once).

Each library gets its inputs in its own format, made outside the timed call: selbench the
logits and labels (its recalibrators take ``ModelOutputs``), the peers the float64 softmax
probabilities, or the top-label confidence and correctness (``torch`` tensors for
torchmetrics). Two ratios are printed, ``peer time / selbench time`` (above 1: selbench is
faster):

* *same inputs*: the peer's call against selbench's functions on the same inputs (Platt:
  ``fit_logistic`` on the Platt inputs; binning: ``equal_mass_edges`` + ``bin_means`` /
  ``lookup_bins`` on the confidences), or against selbench's whole fit from the logits
  where there is no such function (marked ``*``);
* *from logits*: the peer's call plus the time to make its inputs from the logits (NumPy
  softmax, top-label confidence and correctness, measured in the same run) against
  selbench's fit or apply from the logits.

Workloads and value checks (the run fails when a check fails):

1. Temperature scaling fit (N x K = 2,000 x 100 and 50,000 x 1,000): ``fit_temperature``
   vs probmetrics ``TemperatureScalingCalibrator`` (30-step bisection, ``fit_torch`` on the
   logits) and netcal ``TemperatureScaling`` (scipy L-BFGS-B on the log-probabilities).
   Check: the float64 NLL at every fitted T within 1e-6 (relative) of the lowest. Targets
   of issue 12: >= 10x the fastest peer at 50,000 x 1,000, no slower than any peer at
   2,000 x 100. uncertainty-calibration and torchmetrics have no temperature scaling.
2. Platt scaling, binary (K = 2) and top-label (K = 10), N = 2,000 / 50,000 / 1,000,000:
   ``PlattScaling.fit`` vs uncertainty-calibration ``PlattCalibrator`` (binary, on
   p(class 1)) / ``PlattTopCalibrator`` (on the probabilities), netcal
   ``LogisticCalibration`` and probmetrics ``BinaryLogisticCalibrator('affine')`` (on
   p(class 1), or on the confidence against correctness). Check: the mean log-loss of every
   fitted (a, b) on selbench's float64 Platt inputs within 1e-6 (relative) of the lowest
   (the peers stop their solvers at a tolerance), and selbench's gradient below 1e-12.
3. Histogram binning (top-label, 15 equal-mass bins, Kumar et al.) and Platt binning,
   N = 50,000 / 1,000,000, K = 10: ``HistogramBinning`` / ``PlattBinning`` fit and apply
   vs uncertainty-calibration ``HistogramTopCalibrator`` / ``PlattBinnerTopCalibrator``
   (the same definition: bin edges equal, bin values and outputs within 1e-12; Platt
   binning against the library with its logistic regression solved to convergence, as in
   tests/test_reference_recalibrators.py, within 1e-9). probmetrics
   ``BinaryHistogramBinningCalibrator('quantile')`` (np.quantile edges, [a, b) bins) and
   netcal ``HistogramBinning`` (equal-width bins) bin differently: timed, values not
   compared (marked "other definition").
4. ECE_1, N = 1,000,000, K = 10, 15 bins, from probabilities and from confidences:
   ``top_label`` + ``ece`` / ``ece`` vs uncertainty-calibration ``lower_bound_scaling_ce``
   (equal-mass bins, the paper's ECE; values within 1e-9) and netcal
   ``ECE(equal_intervals=False)`` (np.quantile edges: other definition, not compared). The
   uniform-bin ECE of Guo et al. (uncertainty-calibration ``get_ece``, netcal ``ECE``,
   torchmetrics ``calibration_error``; probmetrics' ECE is torchmetrics') is a quantity
   selbench does not implement: those rows are timed for reference only, against
   selbench's equal-mass ECE, and left out of the targets; their values are compared with
   ``get_ece`` for information.
5. Smooth ECE (N = 3,000 and 1,000,000) vs ``relplot.smECE`` / ``smECE_sigma`` (values
   within 1e-6), and class-wise ECE (K = 100) vs uncertainty-calibration's marginal
   calibration error (1e-12) and torch-uncertainty's ``ClasswiseCalibrationError``
   (equal-width): ``perf/peers_smooth.py``.
6. AURC, AUGRC, coverage at risk and risk at coverage, N = 1,000,000, vs torch-uncertainty
   (values compared on tie-free data, where the definitions agree after its (1 - 1/N)
   normalisation): ``perf/peers_riskcov.py``.
7. The CalArena recalibrators: ``sms`` / ``svs`` fits (N = 5,000, K = 10 and 100) vs
   probmetrics' ``SMSCalibrator`` / ``SVSCalibrator`` (our objective no higher), and
   ``venn-abers`` fit and apply (N = 5,000 / 50,000 / 200,000) vs the ``venn-abers``
   package (values within 1e-12): ``perf/peers_calarena.py``.

``pip install -e '.[perf]'`` installs the peers; a peer that is missing is reported and
skipped.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from common import machine, rule, target
from peers_common import Report, Row, make_data, peer, softmax64, timeit, top

#: value tolerances
NLL_RTOL = 1e-6
ECE_ATOL = 1e-9
BIN_ATOL = 1e-12
PLATT_BIN_ATOL = 1e-9
GRAD_TOL = 1e-12
N_BINS = 15


# ------------------------------------------------------------------------------ data
class Inputs:
    """The logits of one workload and the peers' inputs made from them, with the time
    each step takes (for the *from logits* ratio)."""

    def __init__(self, n: int, k: int, repeats: int, **data):
        from selbench import ModelOutputs

        self.n, self.k = n, k
        self.z, self.labels = make_data(n, k, **data)
        self.outputs = ModelOutputs(features=np.zeros((n, 1), np.float32), logits=self.z,
                                    labels=self.labels)
        self.t_probs, self.probs = timeit(lambda: softmax64(self.z), repeats)
        self.t_top, (self.conf, self.correct) = timeit(lambda: top(self.probs, self.labels),
                                                       repeats)
        self.t_stack, self.conf2 = timeit(
            lambda: np.stack([1.0 - self.conf, self.conf], axis=1), repeats)


# ------------------------------------------------------------------------------ 1. temperature
def nll64(logits: np.ndarray, labels: np.ndarray, t: float) -> float:
    """Mean NLL of softmax(logits / T), float64."""
    z = logits.astype(np.float64) / t
    m = z.max(1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(1))
    return float(np.mean(lse - z[np.arange(len(labels)), labels]))


def temperature_workload(n: int, k: int, repeats: int, report: Report) -> list[str]:
    from selbench_plugins.recalibrators.temperature import fit_temperature

    data = Inputs(n, k, repeats, scale=3.0)
    z, y = data.z, data.labels
    fit_temperature(z[:100], y[:100])  # warm-up (torch's first calls)
    sec, t_sel = timeit(lambda: fit_temperature(z, y), repeats)
    fits = [("selbench fit_temperature", sec, t_sel, 0.0)]
    if peer("probmetrics") is not None:
        from probmetrics.calibrators import TemperatureScalingCalibrator
        from probmetrics.distributions import CategoricalLogits

        zt, yt = torch.from_numpy(z), torch.from_numpy(y)

        def fit_pm(zt=zt, yt=yt):
            cal = TemperatureScalingCalibrator()
            cal.fit_torch(CategoricalLogits(zt), yt)
            return 1.0 / float(cal.invtemp_)

        fit_pm(zt[:100], yt[:100])  # warm-up
        fits.append(("probmetrics TemperatureScalingCalibrator", *timeit(fit_pm, repeats), 0.0))
    if peer("netcal") is not None:
        from netcal.scaling import TemperatureScaling

        def fit_nc(probs=data.probs, y=y):
            cal = TemperatureScaling(method="mle")
            cal.fit(probs, y, tensorboard=False)
            return 1.0 / float(np.ravel(cal.weights)[0])  # its weight multiplies: 1/T

        fit_nc(data.probs[:100], y[:100])  # warm-up
        fits.append(("netcal TemperatureScaling (mle)", *timeit(fit_nc, repeats), data.t_probs))
    nlls = [nll64(z, y, t) for _, _, t, _ in fits]
    best = min(nlls)
    rows = []
    for (name, sec, t, prep), v in zip(fits, nlls):
        rel = (v - best) / best
        ok = rel <= NLL_RTOL
        report.fail_unless(ok, f"temperature {n}x{k}: {name}: NLL {rel:.1e} above the lowest")
        rows.append(Row(name, sec, f"T = {t:.9f}, NLL - min = {rel:.1e} (rel., <= "
                                   f"{NLL_RTOL:g}) {'OK' if ok else 'DIFFERS'}", ok, prep=prep))
    report.table("temperature", f"temperature scaling fit, N = {n:,}, K = {k:,}", rows[0],
                 rows[1:])
    if len(rows) < 2:
        return []
    sel, fastest = rows[0].seconds, min(r.seconds for r in rows[1:])
    if n * k > 10**7:
        return [target(f"temperature {n:,} x {k:,}: >= 10x the fastest peer",
                       sel * 10 <= fastest,
                       f"{sel * 1e3:.0f} ms vs {fastest * 1e3:.0f} ms, {fastest / sel:.1f}x")]
    return [target(f"temperature {n:,} x {k:,}: no slower than any peer", sel <= fastest,
                   f"{sel * 1e3:.2f} ms vs fastest peer {fastest * 1e3:.2f} ms, "
                   f"{fastest / sel:.1f}x")]


# ------------------------------------------------------------------------------ 2. platt
def logloss(s: np.ndarray, y: np.ndarray, a: float, b: float) -> float:
    t = a * s + b
    return float(np.mean(np.logaddexp(0.0, t) - y * t))


def logistic_gradient(s: np.ndarray, y: np.ndarray, a: float, b: float) -> float:
    """Largest |component| of the mean log-loss's gradient at (a, b), float64 NumPy."""
    r = 0.5 * (1.0 + np.tanh(0.5 * (a * s + b))) - y
    return float(max(abs(np.mean(r * s)), abs(np.mean(r))))


def closure_value(fn: Callable, name: str) -> Any:
    """The variable ``name`` captured by uncertainty-calibration's calibrator closure."""
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    return cells[name].cell_contents


def platt_workload(mode: str, n: int, repeats: int, report: Report) -> None:
    from selbench import FitContext
    from selbench_plugins.recalibrators.platt import PlattScaling, fit_logistic, platt_inputs

    k = 2 if mode == "binary" else 10
    data = Inputs(n, k, repeats)
    ctx = FitContext(seed=0)
    if mode == "binary":
        y = (data.labels == 1).astype(np.float64)
        p_in, y_in, prep = data.probs[:, 1], data.labels, data.t_probs
    else:
        y = data.outputs.correct()
        p_in, y_in, prep = data.conf, data.correct, data.t_probs + data.t_top
    s = platt_inputs(data.z, mode)
    PlattScaling(mode=mode).fit(data.outputs.subset(np.arange(min(n, 100))), ctx)  # warm-up
    sec, rec = timeit(lambda: PlattScaling(mode=mode).fit(data.outputs, ctx), repeats)
    fits = [(f"selbench PlattScaling('{mode}').fit (logits)", sec,
             (rec.weight_fit_, rec.bias_fit_), 0.0)]
    sec_same, _ = timeit(lambda: fit_logistic(s, y), repeats)
    fits += platt_peer_fits(mode, n, data, p_in, y_in, prep, repeats)
    rows = platt_rows(mode, n, fits, s, y, report)
    same = Row("  selbench fit_logistic (Platt inputs given)", sec_same)
    report.table("platt", f"Platt scaling fit, {mode}, N = {n:,}, K = {k}", rows[0], rows[1:],
                 same)


def platt_peer_fits(mode: str, n: int, data: Inputs, p_in: np.ndarray, y_in: np.ndarray,
                    prep: float, repeats: int) -> list[tuple[str, float, tuple, float]]:
    """``(name, seconds, (a, b), prep seconds)`` of each installed peer's Platt fit."""
    fits = []
    if peer("calibration") is not None:
        import calibration

        if mode == "binary":
            def fit_cu():
                cal = calibration.PlattCalibrator(n, N_BINS)
                cal.train_calibration(p_in, data.labels)
                return cal
            name, cu_prep = "uncertainty-calibration PlattCalibrator (p1)", data.t_probs
        else:
            def fit_cu():
                cal = calibration.PlattTopCalibrator(n, N_BINS)
                cal.train_calibration(data.probs, data.labels)
                return cal
            name, cu_prep = "uncertainty-calibration PlattTopCalibrator (probs)", data.t_probs
        sec, cal = timeit(fit_cu, repeats)
        clf = closure_value(cal._platt, "clf")
        fits.append((name, sec, (float(clf.coef_[0][0]), float(clf.intercept_[0])), cu_prep))
    if peer("netcal") is not None:
        from netcal.scaling import LogisticCalibration

        def fit_nc(p=p_in, yy=y_in):
            cal = LogisticCalibration(method="mle")
            cal.fit(p, yy, tensorboard=False)
            return cal

        fit_nc(p_in[:100], y_in[:100])  # warm-up
        sec, cal = timeit(fit_nc, repeats)
        fits.append((f"netcal LogisticCalibration ({'p1' if mode == 'binary' else 'conf'})", sec,
                     (float(np.ravel(cal.weights)[0]), float(np.ravel(cal.intercept)[0])), prep))
    if peer("probmetrics") is not None:
        from probmetrics.calibrators import BinaryLogisticCalibrator

        p2 = data.probs if mode == "binary" else data.conf2
        pm_prep = prep if mode == "binary" else prep + data.t_stack

        def fit_pm():
            cal = BinaryLogisticCalibrator(type="affine")
            cal.fit(p2, y_in)
            return cal

        sec, cal = timeit(fit_pm, repeats)
        b0, a0 = cal.cal_.coef_[0]  # features [1, logit], no intercept
        fits.append((f"probmetrics BinaryLogisticCalibrator('affine') "
                     f"({'probs' if mode == 'binary' else 'conf'})", sec,
                     (float(a0), float(b0)), pm_prep))
    return fits


def platt_rows(mode: str, n: int, fits: list, s: np.ndarray, y: np.ndarray,
               report: Report) -> list[Row]:
    """The rows of the fits (selbench's first), with the value checks: every log-loss
    within NLL_RTOL of the lowest, selbench's gradient below GRAD_TOL."""
    losses = [logloss(s, y, a, b) for _, _, (a, b), _ in fits]
    best = min(losses)
    a_sel, b_sel = fits[0][2]
    grad = logistic_gradient(s, y, a_sel, b_sel)
    report.fail_unless(grad < GRAD_TOL, f"platt {mode} N={n}: selbench gradient {grad:.1e}")
    rows = []
    for i, ((name, sec, (a, b), prep_i), v) in enumerate(zip(fits, losses)):
        rel = (v - best) / best
        ok = rel <= NLL_RTOL
        report.fail_unless(ok, f"platt {mode} N={n}: {name}: log-loss {rel:.1e} above lowest")
        detail = f"loss - min = {rel:.1e} (rel., <= {NLL_RTOL:g}) {'OK' if ok else 'DIFFERS'}"
        if i == 0:
            detail = (f"a = {a:.9f}, b = {b:.9f}, |grad| = {grad:.1e} "
                      f"(< {GRAD_TOL:g}) {'OK' if grad < GRAD_TOL else 'TOO LARGE'}")
        else:
            detail += f"; |Δa| = {abs(a - a_sel):.1e}, |Δb| = {abs(b - b_sel):.1e}"
        rows.append(Row(name, sec, detail, ok, prep=prep_i))
    return rows


# ------------------------------------------------------------------------------ 3. binning
def binning_workload(n: int, repeats: int, report: Report) -> None:
    from selbench import FitContext

    k = 10
    data = Inputs(n, k, repeats)
    ctx = FitContext(seed=0)
    histogram_binning_rows(n, k, data, ctx, repeats, report)
    platt_binning_rows(n, k, data, ctx, repeats, report)


def histogram_binning_rows(n: int, k: int, data: Inputs, ctx: Any, repeats: int,
                           report: Report) -> None:
    """Histogram binning, fit and apply: selbench vs the installed peers."""
    from selbench_plugins.recalibrators._common import bin_means, equal_mass_edges, lookup_bins
    from selbench_plugins.recalibrators.binning import HistogramBinning

    conf, correct = data.conf, data.correct
    sec, rec = timeit(lambda: HistogramBinning(n_bins=N_BINS).fit(data.outputs, ctx), repeats)
    fit_api = Row("selbench HistogramBinning.fit (logits)", sec, f"{len(rec.edges_)} bins")

    def fit_same():
        edges = equal_mass_edges(conf, N_BINS)
        return edges, bin_means(edges, conf, correct)

    sec, _ = timeit(fit_same, repeats)
    fit_same_row = Row("  selbench equal_mass_edges + bin_means (conf given)", sec)
    sec, out_sel = timeit(lambda: rec.confidence(data.outputs), repeats)
    apply_api = Row("selbench HistogramBinning.confidence (logits)", sec)
    sec, _ = timeit(lambda: rec.values_[lookup_bins(rec.edges_, conf)], repeats)
    apply_same = Row("  selbench values_[lookup_bins] (conf given)", sec)
    fit_rows, apply_rows = [], []
    if peer("calibration") is not None:
        histogram_calibration_rows(n, data, rec, out_sel, repeats, report, fit_rows,
                                   apply_rows)
    histogram_other_rows(n, data, repeats, fit_rows, apply_rows)
    report.table("binning", f"histogram binning fit, N = {n:,}, K = {k}", fit_api, fit_rows,
                 fit_same_row)
    report.table("binning", f"histogram binning apply, N = {n:,}, K = {k}", apply_api,
                 apply_rows, apply_same)


def histogram_calibration_rows(n: int, data: Inputs, rec: Any, out_sel: np.ndarray,
                               repeats: int, report: Report, fit_rows: list[Row],
                               apply_rows: list[Row]) -> None:
    """uncertainty-calibration's ``HistogramTopCalibrator`` (the same definition: edges,
    values and outputs checked) into ``fit_rows`` / ``apply_rows``."""
    import calibration

    def fit_cu():
        cal = calibration.HistogramTopCalibrator(n, N_BINS)
        cal.train_calibration(data.probs, data.labels)
        return cal

    sec, cal = timeit(fit_cu, repeats)
    bins = np.asarray(closure_value(cal._calibrator, "bins"), dtype=np.float64)
    means = np.asarray(closure_value(cal._calibrator, "bin_means"))
    same_edges = bins.shape == rec.edges_.shape and np.array_equal(bins, rec.edges_)
    dv = float(np.max(np.abs(means - rec.values_))) if same_edges else math.inf
    ok = same_edges and dv <= BIN_ATOL
    report.fail_unless(ok, f"histogram binning N={n}: edges/values differ from the library")
    fit_rows.append(Row("uncertainty-calibration HistogramTopCalibrator (probs)", sec,
                        f"edges {'equal' if same_edges else 'DIFFER'}, values max|Δ| = "
                        f"{dv:.1e} (<= {BIN_ATOL:g}) {'OK' if ok else 'DIFFERS'}", ok,
                        prep=data.t_probs))
    sec, out_cu = timeit(lambda: cal.calibrate(data.probs), repeats)
    d = float(np.max(np.abs(out_cu - out_sel)))
    ok = d <= BIN_ATOL
    report.fail_unless(ok, f"histogram binning N={n}: calibrated confidences differ")
    apply_rows.append(Row("uncertainty-calibration .calibrate (probs)", sec,
                          f"outputs max|Δ| = {d:.1e} (<= {BIN_ATOL:g}) "
                          f"{'OK' if ok else 'DIFFERS'}", ok, prep=data.t_probs))


def histogram_other_rows(n: int, data: Inputs, repeats: int, fit_rows: list[Row],
                         apply_rows: list[Row]) -> None:
    """probmetrics' and netcal's histogram binning (other definitions: timed, values not
    compared) into ``fit_rows`` / ``apply_rows``."""
    conf, correct = data.conf, data.correct
    prep = data.t_probs + data.t_top
    if peer("probmetrics") is not None:
        from probmetrics.calibrators import BinaryHistogramBinningCalibrator

        def fit_pm():
            cal = BinaryHistogramBinningCalibrator(n_bins=N_BINS, strategy="quantile")
            cal.fit(data.conf2, correct)
            return cal

        sec, cal = timeit(fit_pm, repeats)
        note = "np.quantile edges, [a, b) bins: not compared"
        fit_rows.append(Row("probmetrics BinaryHistogramBinning('quantile') (conf)", sec, note,
                            None, False, prep + data.t_stack))
        sec, _ = timeit(lambda: cal.predict_proba(data.conf2), repeats)
        apply_rows.append(Row("probmetrics .predict_proba (conf)", sec, note, None, False,
                              prep + data.t_stack))
    if peer("netcal") is not None:
        from netcal.binning import HistogramBinning as NetcalHistogramBinning

        def fit_nc():
            cal = NetcalHistogramBinning(bins=N_BINS)
            cal.fit(conf, correct)
            return cal

        sec, cal = timeit(fit_nc, repeats)
        note = "equal-width bins: not compared"
        fit_rows.append(Row("netcal HistogramBinning (conf)", sec, note, None, False, prep))
        sec, _ = timeit(lambda: cal.transform(conf), repeats)
        apply_rows.append(Row("netcal .transform (conf)", sec, note, None, False, prep))


def platt_binning_rows(n: int, k: int, data: Inputs, ctx: Any, repeats: int,
                       report: Report) -> None:
    """Platt binning fit: selbench vs uncertainty-calibration's ``PlattBinnerTopCalibrator``
    (checked against the library with its logistic regression solved to the optimum)."""
    from selbench_plugins.recalibrators.binning import PlattBinning

    sec, prec = timeit(lambda: PlattBinning(n_bins=N_BINS).fit(data.outputs, ctx), repeats)
    api = Row("selbench PlattBinning.fit (logits)", sec, f"{len(prec.edges_)} bins")
    rows = []
    if peer("calibration") is not None:
        import calibration
        import calibration.utils as cal_utils
        from sklearn.linear_model import LogisticRegression

        def fit_cu():
            cal = calibration.PlattBinnerTopCalibrator(n, N_BINS)
            cal.train_calibration(data.probs, data.labels)
            return cal

        sec, cal = timeit(fit_cu, repeats)

        class Converged(LogisticRegression):  # the library's C=1e10, solved to the optimum
            def __init__(self, C=1.0, solver="lbfgs"):
                super().__init__(C=C, solver="newton-cholesky", tol=1e-14, max_iter=1000)

        shipped = cal_utils.LogisticRegression
        cal_utils.LogisticRegression = Converged
        try:
            conv = fit_cu()
        finally:
            cal_utils.LogisticRegression = shipped

        def distance(c) -> float:
            bins = np.asarray(closure_value(c._discrete_calibrator, "bins"), dtype=np.float64)
            means = np.asarray(closure_value(c._discrete_calibrator, "bin_means"))
            if bins.shape != prec.edges_.shape:
                return math.inf
            return max(float(np.max(np.abs(bins - prec.edges_))),
                       float(np.max(np.abs(means - prec.values_))))

        d, d_shipped = distance(conv), distance(cal)
        ok = d <= PLATT_BIN_ATOL
        report.fail_unless(ok, f"platt binning N={n}: edges/values differ from the library")
        rows.append(Row("uncertainty-calibration PlattBinnerTopCalibrator (probs)", sec,
                        f"edges, values max|Δ| = {d:.1e} vs the library solved to the "
                        f"optimum (<= {PLATT_BIN_ATOL:g}) {'OK' if ok else 'DIFFERS'}; "
                        f"{d_shipped:.1e} vs as shipped (L-BFGS tolerance)", ok,
                        prep=data.t_probs))
    report.table("binning", f"Platt binning fit, N = {n:,}, K = {k}", api, rows)


# ------------------------------------------------------------------------------ 4. ece
def ece_workload(n: int, source: str, repeats: int, report: Report) -> None:
    from selbench.measure.metrics import ece, top_label

    k = 10
    z, labels = make_data(n, k, temperature=1.0)
    probs = softmax64(z)
    conf, correct = top_label(probs, labels)
    if source == "probabilities":
        sec, v_sel = timeit(lambda: ece(*top_label(probs, labels), n_bins=N_BINS), repeats)
        sel = Row("selbench top_label + ece (probs, labels)", sec, f"ECE = {v_sel:.12f}")
        args = (probs, labels)
    else:
        sec, v_sel = timeit(lambda: ece(conf, correct, n_bins=N_BINS), repeats)
        sel = Row("selbench ece (conf, correct)", sec, f"ECE = {v_sel:.12f}")
        args = (conf, correct.astype(np.int64))
    rows, uniform = [], []
    v_uni = None
    if peer("calibration") is not None:
        import calibration

        sec, v = timeit(lambda: calibration.lower_bound_scaling_ce(
            *args, p=1, debias=False, num_bins=N_BINS, binning_scheme=calibration.get_equal_bins,
            mode="top-label"), repeats)
        ok = abs(v - v_sel) <= ECE_ATOL
        report.fail_unless(ok, f"ECE from {source}: library {v!r} vs selbench {v_sel!r}")
        rows.append(Row("uncertainty-calibration lower_bound_scaling_ce", sec,
                        f"|Δ| = {abs(v - v_sel):.1e} (<= {ECE_ATOL:g}) "
                        f"{'OK' if ok else 'DIFFERS'}", ok))
        sec, v_uni = timeit(lambda: calibration.get_ece(*args, num_bins=N_BINS), repeats)
        uniform.append(Row("uncertainty-calibration get_ece", sec,
                           f"ECE = {v_uni:.12f} (the reference of these rows)", None, False))
    if peer("netcal") is not None:
        from netcal.metrics import ECE

        sec, v = timeit(lambda: ECE(bins=N_BINS, equal_intervals=False).measure(*args), repeats)
        rows.append(Row("netcal ECE(equal_intervals=False)", sec,
                        f"np.quantile edges: ECE = {v:.12f}, |Δ| = {abs(v - v_sel):.1e}, "
                        "not checked", None, False))
        sec, v = timeit(lambda: ECE(bins=N_BINS).measure(*args), repeats)
        detail = f"ECE = {v:.12f}"
        if v_uni is not None:
            detail += f", |Δ| to get_ece = {abs(v - v_uni):.1e} ([a, b) bins)"
        uniform.append(Row("netcal ECE", sec, detail, None, False))
    if peer("torchmetrics") is not None:
        uniform.append(torchmetrics_ece_row(source, probs, labels, conf, args[1], k, v_uni,
                                            repeats))
    report.table("ece", f"ECE_1 from {source}, equal-mass bins (the paper's), N = {n:,}",
                 sel, rows, logits=False)
    if uniform:
        report.table("ece", f"ECE_1 from {source}, uniform bins: not in selbench, timed "
                            f"for reference against its equal-mass ECE", sel, uniform,
                     count=False, logits=False)


def torchmetrics_ece_row(source: str, probs: np.ndarray, labels: np.ndarray,
                         conf: np.ndarray, correct: np.ndarray, k: int, v_uni: float | None,
                         repeats: int) -> Row:
    """torchmetrics' uniform-bin ECE (multi-class from the probabilities, binary from the
    confidences), timed for reference, its value against ``get_ece``'s ``v_uni``."""
    from torchmetrics.functional.classification import (
        binary_calibration_error,
        multiclass_calibration_error,
    )

    if source == "probabilities":
        probs_t, labels_t = torch.from_numpy(probs), torch.from_numpy(labels)

        def tm():
            return float(multiclass_calibration_error(probs_t, labels_t, num_classes=k,
                                                      n_bins=N_BINS, norm="l1"))
    else:
        conf_t, correct_t = torch.from_numpy(conf), torch.from_numpy(correct)

        def tm():
            return float(binary_calibration_error(conf_t, correct_t, n_bins=N_BINS,
                                                  norm="l1"))
    sec, v = timeit(tm, repeats)
    detail = f"ECE = {v:.12f}"
    if v_uni is not None:
        detail += f", |Δ| to get_ece = {abs(v - v_uni):.1e} ([a, b) bins"
        detail += ", float32)" if source == "probabilities" else ")"
    return Row("torchmetrics calibration_error", sec, detail, None, False)


# ------------------------------------------------------------------------------ main
SECTIONS = ("temperature", "platt", "binning", "ece", "smooth", "riskcov", "calarena")


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="best of (calls under 1 s)")
    ap.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these workloads")
    ap.add_argument("--quick", action="store_true",
                    help="small sizes only (N <= 50,000; temperature 2,000 x 100)")
    args = ap.parse_args(argv)
    with warnings.catch_warnings():  # the peers' deprecation notices (scikit-learn, torch.jit)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return run(args)


def run(args: argparse.Namespace) -> list[str]:
    sections = args.only or SECTIONS
    big = not args.quick
    report = Report()
    summary: list[str] = []
    print(machine("cpu"))
    if "temperature" in sections:
        rule("1. Temperature scaling fit: selbench vs probmetrics, netcal")
        for n, k in [(2_000, 100)] + ([(50_000, 1_000)] if big else []):
            summary += temperature_workload(n, k, args.repeats, report)
    if "platt" in sections:
        rule("2. Platt scaling fit: selbench vs uncertainty-calibration, netcal, probmetrics")
        for mode in ("binary", "top-label"):
            for n in [2_000, 50_000] + ([1_000_000] if big else []):
                platt_workload(mode, n, args.repeats, report)
        summary += report.summary("platt", "Platt scaling")
    if "binning" in sections:
        rule("3. Histogram binning and Platt binning (15 bins, top-label): selbench vs peers")
        for n in [50_000] + ([1_000_000] if big else []):
            binning_workload(n, args.repeats, report)
        summary += report.summary("binning", "histogram / Platt binning")
    if "ece" in sections:
        n = 1_000_000 if big else 50_000
        rule(f"4. ECE_1, N = {n:,}, K = 10, 15 bins: selbench vs peers")
        for source in ("probabilities", "confidences"):
            ece_workload(n, source, args.repeats, report)
        summary += report.summary("ece", "ECE (equal-mass)")
    if "smooth" in sections:
        import peers_smooth

        rule("5. Smooth ECE (relplot) and class-wise ECE (uncertainty-calibration, "
             "torch-uncertainty)")
        for n in [3_000] + ([1_000_000] if big else [50_000]):
            peers_smooth.workload(n, args.repeats, report)
        summary += report.summary("smooth", "smooth / class-wise ECE")
    if "riskcov" in sections:
        import peers_riskcov

        n = 1_000_000 if big else 50_000
        rule(f"6. Risk-coverage metrics (AURC, AUGRC, ...), N = {n:,}: selbench vs "
             "torch-uncertainty")
        peers_riskcov.workload(n, args.repeats, report)
        summary += report.summary("riskcov", "risk-coverage metrics")
    if "calarena" in sections:
        import peers_calarena

        rule("7. CalArena recalibrators: sms / svs vs probmetrics, venn-abers vs its package")
        peers_calarena.workload(args.repeats, report, quick=not big)
        summary += report.summary("calarena", "sms / svs / venn-abers")
    report.check()
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
