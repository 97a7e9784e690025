"""selbench.measure.smooth against its peers: the smooth ECE (relplot) and the class-wise ECE
(uncertainty-calibration), a section of ``bench_peers.py``.

:func:`workload` times, for one size ``n``, on the seeded synthetic data of ``bench_peers``
(``peers_common.make_data``; float64 softmax probabilities made outside the timed calls):

1. smECE of the top-label confidence and correctness, N = ``n``, K = 10 (labels from
   ``softmax(z)``): ``selbench.measure.smooth.smece`` vs ``relplot.smECE`` (the reference: values
   within :data:`SMECE_ATOL`). torch-uncertainty's ``SmoothCalibrationError(kernel_type=
   "reflected")`` is a port of relplot computed in float32 (its ``index_add_`` needs float32
   inputs) with ``int(10 / s)`` evaluation points where relplot rounds: timed for reference in
   a table of its own, its value compared for information only.
2. Class-wise ECE_1 with 15 equal-mass bins, K = 100 (the CIFAR-100 size), N =
   :func:`classwise_n` (``n`` clipped to [10,000, 100,000]: the library needs about 1.4 s
   at 10,000 and 14 s at 100,000): ``classwise_ece`` vs uncertainty-calibration
   ``lower_bound_scaling_ce(mode="marginal")`` (values within :data:`CLASSWISE_ATOL`).
3. Class-wise ECE_1 with 15 equal-width bins (Kull et al.), same data:
   ``classwise_ece(binning="equal-width")`` vs torch-uncertainty
   ``ClasswiseCalibrationError(norm="l1")`` on float64 tensors (bins closed on the other
   side, which matters only for probabilities exactly on a bin edge: values within
   :data:`CLASSWISE_ATOL`). Only at N <= 10,000 (it needs about 19 s at 100,000).

Rows, ratios (``peer time / selbench time``) and failed value checks go to the ``report``
of ``bench_peers`` (section ``"smooth"``). Run alone: ``python perf/peers_smooth.py
[--quick] [--repeats R]`` (sizes :data:`SIZES`, or 3,000 only with ``--quick``).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

import numpy as np
from common import machine, rule
from peers_common import Report, Row, make_data, peer, softmax64, timeit, top

#: sizes of a full run: the leaderboard's per-coverage call size and a large one
SIZES = (3_000, 1_000_000)
#: smECE: relplot's value within this (the contract of selbench.measure.smooth.smece)
SMECE_ATOL = 1e-6
#: class-wise ECE: the library's value within this
CLASSWISE_ATOL = 1e-12
N_BINS = 15
K_CLASSWISE = 100
#: largest N at which torch-uncertainty's class-wise ECE is timed
TU_CLASSWISE_MAX_N = 10_000
SECTION = "smooth"


def classwise_n(n: int) -> int:
    """N of the class-wise rows for a workload of size ``n``."""
    return int(min(max(n, 10_000), 100_000))


def _check(report: Any, what: str, got: float, ref: float, atol: float) -> tuple[str, bool]:
    diff = abs(got - ref)
    ok = bool(diff <= atol)
    report.fail_unless(ok, f"{what}: peer {ref!r} vs selbench {got!r}")
    return f"|Δ| = {diff:.1e} (<= {atol:g}) {'OK' if ok else 'DIFFERS'}", ok


def smece_rows(n: int, repeats: int, report: Any) -> None:
    from selbench.measure.smooth import smece

    z, labels = make_data(n, 10, temperature=1.0)
    conf, correct = top(softmax64(z), labels)
    correct = correct.astype(np.float64)
    smece(conf[:100], correct[:100])  # warm-up (scipy.fft's first plans)
    sec, v_sel = timeit(lambda: smece(conf, correct), repeats)
    sel = Row("selbench smece (conf, correct)", sec, f"smECE = {v_sel:.12f}")
    rows, other = [], []
    if peer("relplot") is not None:
        import relplot

        sec, (v, sigma) = timeit(lambda: relplot.smECE(conf, correct, return_width=True),
                                 repeats)
        detail, ok = _check(report, f"smECE N={n}", v_sel, v, SMECE_ATOL)
        rows.append(Row("relplot smECE", sec, f"{detail}; σ = {sigma:.6g}", ok))
        sec, v = timeit(lambda: relplot.smECE_sigma(conf, correct, sigma), repeats)
        sec_sel, v_sel_s = timeit(lambda: smece(conf, correct, sigma=sigma), repeats)
        detail, ok = _check(report, f"smECE_sigma N={n}", v_sel_s, v, SMECE_ATOL)
        report.table(SECTION, f"smECE at relplot's bandwidth σ = {sigma:.6g}, N = {n:,}",
                     Row("selbench smece(sigma=σ)", sec_sel, f"smECE_σ = {v_sel_s:.12f}"),
                     [Row("relplot smECE_sigma", sec, detail, ok)], logits=False)
    if peer("torch_uncertainty") is not None:
        import torch
        from torch_uncertainty.metrics.classification import SmoothCalibrationError

        conf32 = torch.from_numpy(conf.astype(np.float32))
        correct32 = torch.from_numpy(correct.astype(np.float32))

        def tu():
            m = SmoothCalibrationError(kernel_type="reflected")
            m.confidences.append(conf32)  # the state update() fills: no softmax, no argmax
            m.accuracies.append(correct32)
            with warnings.catch_warnings():  # "compute called before update"
                warnings.simplefilter("ignore", UserWarning)
                return float(m.compute())

        sec, v = timeit(tu, repeats)
        other.append(Row("torch-uncertainty SmoothCalibrationError('reflected')", sec,
                         f"float32 port: smECE = {v:.9f}, |Δ| = {abs(v - v_sel):.1e}, "
                         "not checked", None, False))
    report.table(SECTION, f"smECE (automatic bandwidth), top-label, N = {n:,}", sel, rows,
                 logits=False)
    if other:
        report.table(SECTION, f"smECE, N = {n:,}: another implementation, for reference", sel,
                     other, count=False, logits=False)


def classwise_rows(n: int, repeats: int, report: Any) -> None:
    from selbench.measure.smooth import classwise_ece

    k = K_CLASSWISE
    z, labels = make_data(n, k)
    probs = softmax64(z)
    classwise_ece(probs[:100], labels[:100])  # warm-up
    sec, v_sel = timeit(lambda: classwise_ece(probs, labels, n_bins=N_BINS), repeats)
    sel = Row("selbench classwise_ece (probs, labels)", sec, f"ECE = {v_sel:.12f}")
    rows = []
    if peer("calibration") is not None:
        import calibration

        sec, v = timeit(lambda: calibration.lower_bound_scaling_ce(
            probs, labels, p=1, debias=False, num_bins=N_BINS,
            binning_scheme=calibration.get_equal_bins, mode="marginal"), repeats)
        detail, ok = _check(report, f"class-wise ECE N={n}", v_sel, v, CLASSWISE_ATOL)
        rows.append(Row("uncertainty-calibration lower_bound_scaling_ce(marginal)", sec,
                        detail, ok))
    report.table(SECTION, f"class-wise ECE_1, equal-mass bins, N = {n:,}, K = {k}", sel, rows,
                 logits=False)
    if n > TU_CLASSWISE_MAX_N:
        return
    sec, v_sel = timeit(lambda: classwise_ece(probs, labels, n_bins=N_BINS,
                                              binning="equal-width"), repeats)
    sel = Row("selbench classwise_ece(binning='equal-width')", sec, f"ECE = {v_sel:.12f}")
    rows = []
    if peer("torch_uncertainty") is not None:
        import torch
        from torch_uncertainty.metrics.classification import ClasswiseCalibrationError

        probs_t, labels_t = torch.from_numpy(probs), torch.from_numpy(labels)

        def tu():
            m = ClasswiseCalibrationError(num_classes=k, num_bins=N_BINS, norm="l1")
            m.update(probs_t, labels_t)
            return float(m.compute())

        sec, v = timeit(tu, repeats)
        detail, ok = _check(report, f"class-wise ECE equal-width N={n}", v_sel, v,
                            CLASSWISE_ATOL)
        rows.append(Row("torch-uncertainty ClasswiseCalibrationError(l1) (float64)", sec,
                        detail, ok))
    report.table(SECTION, f"class-wise ECE_1, equal-width bins, N = {n:,}, K = {k}", sel, rows,
                 logits=False)


def workload(n: int, repeats: int, report: Any) -> None:
    """The section's rows for size ``n`` (see the module docstring)."""
    with warnings.catch_warnings():  # the peers' deprecation notices
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        smece_rows(n, repeats, report)
        classwise_rows(classwise_n(n), repeats, report)


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="best of (calls under 1 s)")
    ap.add_argument("--quick", action="store_true", help="N = 3,000 only")
    args = ap.parse_args(argv)
    report = Report()
    print(machine("cpu"))
    for n in SIZES[:1] if args.quick else SIZES:
        rule(f"smooth ECE and class-wise ECE, N = {n:,}: selbench vs relplot, "
             "uncertainty-calibration, torch-uncertainty")
        workload(n, args.repeats, report)
    summary = report.summary(SECTION, "smooth / class-wise ECE")
    report.check()
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
