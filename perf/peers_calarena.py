"""The CalArena recalibrators against their references, a section of ``bench_peers.py``:
``sms`` / ``svs`` against probmetrics 1.3's ``SMSCalibrator`` / ``SVSCalibrator`` and
``venn-abers`` against the ``venn-abers`` package's ``VennAbers``.

On the seeded synthetic data of ``bench_peers`` (``peers_common.make_data``: float32 logits
``2 N(0, 1)``, labels from ``softmax(z / 2)``); the peers get float64 softmax probabilities
(and, for Venn–Abers, the binary scores ``[1 - conf, conf]`` of the top-label confidence and
its correctness), made outside the timed calls:

1. SMS and SVS fit, N = 5,000 fitting rows, K = 10 and 100 (CIFAR's sizes): the plugins'
   ``fit`` from the logits vs ``get_calibrator("sms" / "svs").fit(probs, labels)``. Check:
   the objective (written out here: mean NLL of the tempered, mixed log-probabilities' map
   plus the ridge penalty) at our parameters no higher than at theirs (each with its own
   inverse temperature; theirs stop at torchmin's float32 tolerances, ours at the optimum),
   and their probabilities on the fitting rows within :data:`SMS_PROB_ATOL` of ours.
2. Venn–Abers fit and apply, N = 5,000 / 50,000 (and 200,000 in a full run), K = 10:
   ``VennAbersPredictor.fit`` / ``.confidence`` from the logits (and
   ``venn_abers_table`` / ``venn_abers_interval`` on the confidences) vs ``VennAbers().fit``
   / ``.predict_proba``. Check: the point confidences and ``[p0, p1]`` within
   :data:`VA_ATOL`.

Rows, ratios (``peer time / selbench time``, above 1: selbench faster) and failed checks go
to the ``report`` of ``bench_peers`` (section ``"calarena"``). Run alone: ``python
perf/peers_calarena.py [--quick] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

import numpy as np
from common import machine, rule
from peers_common import Report, Row, make_data, peer, softmax64, timeit, top

SECTION = "calarena"
#: probmetrics' SMS / SVS probabilities vs ours on the fitting rows (their float32 BFGS
#: stops early: measured up to ~3e-3 on the CIFAR outputs)
SMS_PROB_ATOL = 2e-2
#: Venn–Abers: the package's values vs ours (both exact arithmetic on counts)
VA_ATOL = 1e-12
N_FIT = 5_000


def structured_objective(z: np.ndarray, y: np.ndarray, a: float, weight: np.ndarray,
                         bias: np.ndarray) -> float:
    """probmetrics' SMS / SVS objective (default lambdas, rho, tau) at inverse temperature
    ``a``, ``W`` (a vector for SVS) and ``b``, float64."""
    n, k = z.shape
    s = a * (z.astype(np.float64) - z.max(1, keepdims=True))
    q = np.exp(s)
    q /= q.sum(1, keepdims=True)
    eps = 1.0 / (n + 1)
    x = np.log((1.0 - eps) * q + eps / k)
    t = x @ weight.T + bias if weight.ndim == 2 else x * weight + bias
    t -= t.max(1, keepdims=True)
    nll = float(np.mean(np.log(np.exp(t).sum(1)) - t[np.arange(n), y]))
    delta = weight - np.eye(k) if weight.ndim == 2 else np.diag(weight - 1.0)
    diag = np.diag(delta)
    off = float((delta ** 2).sum() - (diag ** 2).sum())
    return (nll + k / n * float((bias ** 2).sum()) + k / n * float((diag ** 2).sum())
            + k * (k - 1) / n * off)


def structured_rows(name: str, k: int, repeats: int, report: Any) -> None:
    """SMS or SVS fit at N = :data:`N_FIT`, K = ``k``: selbench vs probmetrics."""
    import torch
    from selbench import FitContext, ModelOutputs
    from selbench.contract.registry import get_registry

    z, y = make_data(N_FIT, k)
    out = ModelOutputs(features=np.zeros((N_FIT, 1), np.float32), logits=z, labels=y)
    plugin = get_registry().get("recalibrator", name)
    ctx = FitContext(seed=0)
    plugin.build().fit(ModelOutputs(features=np.zeros((50, 1), np.float32), logits=z[:50],
                                    labels=y[:50]), ctx)  # warm-up
    sec, rec = timeit(lambda: plugin.build().fit(out, ctx), repeats)
    ours = structured_objective(z, y, rec.inv_temperature_, rec.weight_fit_, rec.bias_fit_)
    sel = Row(f"selbench {name} fit (logits)", sec,
              f"objective {ours:.12f}, |grad| = {rec.fit_info_['grad_max']:.1e}")
    rows = []
    if peer("probmetrics") is not None and peer("numba") is not None:
        from probmetrics.calibrators import get_calibrator

        t_probs, probs = timeit(lambda: softmax64(z), repeats)
        get_calibrator(name).fit(probs[:50], y[:50])  # warm-up (torchmin, torch.jit)
        sec, cal = timeit(lambda: get_calibrator(name).fit(probs, y), repeats)
        a = float(cal.ts_.cal_.invtemp_)
        if name == "sms":
            w = np.asarray(cal.W_, dtype=np.float64)
            weight, bias = w[:, :k], w[:, k]
        else:
            weight = np.asarray(cal.v_, dtype=np.float64)
            bias = np.asarray(cal.b_, dtype=np.float64)
        theirs = structured_objective(z, y, a, weight, bias)
        with torch.no_grad():
            with_ours = rec.module_.log_probs(torch.tensor(z)).exp().double().numpy()
        gap = float(np.abs(cal.predict_proba(probs) - with_ours).max())
        ok = ours <= theirs + 1e-12 * abs(theirs) and gap <= SMS_PROB_ATOL
        report.fail_unless(ok, f"{name} K={k}: objective {ours!r} vs probmetrics {theirs!r}, "
                               f"probabilities {gap:.1e} apart")
        rows.append(Row(f"probmetrics {name.upper()}Calibrator (probs)", sec,
                        f"objective - ours = {theirs - ours:.1e} (>= 0), probabilities "
                        f"max|Δ| = {gap:.1e} (<= {SMS_PROB_ATOL:g}) "
                        f"{'OK' if ok else 'DIFFERS'}", ok, prep=t_probs))
    report.table(SECTION, f"{name} fit, N = {N_FIT:,}, K = {k}", sel, rows)


def venn_abers_rows(n: int, repeats: int, report: Any) -> None:
    """Venn–Abers fit and apply at N = ``n`` (fit and apply on two seeded halves)."""
    from selbench import FitContext, ModelOutputs
    from selbench_plugins.recalibrators.vennabers import (
        VennAbersPredictor,
        venn_abers_interval,
        venn_abers_table,
    )

    z, y = make_data(2 * n, 10)
    fit = ModelOutputs(features=np.zeros((n, 1), np.float32), logits=z[:n], labels=y[:n])
    test = ModelOutputs(features=np.zeros((n, 1), np.float32), logits=z[n:], labels=y[n:])
    ctx = FitContext(seed=0)
    sec, rec = timeit(lambda: VennAbersPredictor().fit(fit, ctx), repeats)
    fit_api = Row("selbench VennAbersPredictor.fit (logits)", sec,
                  f"{len(rec.scores_):,} distinct confidences")
    sec, conf = timeit(lambda: rec.confidence(test), repeats)
    apply_api = Row("selbench VennAbersPredictor.confidence (logits)", sec)
    t_probs, probs = timeit(lambda: softmax64(z[:n]), repeats)
    t_top, (c_fit, r_fit) = timeit(lambda: top(probs, y[:n]), repeats)
    c_test, _ = top(softmax64(z[n:]), y[n:])
    sec, table = timeit(lambda: venn_abers_table(c_fit, r_fit), repeats)
    fit_same = Row("  selbench venn_abers_table (conf, correct given)", sec)
    sec, _ = timeit(lambda: venn_abers_interval(table, c_test), repeats)
    apply_same = Row("  selbench venn_abers_interval (conf given)", sec)
    fit_rows, apply_rows = [], []
    if peer("venn_abers") is not None:
        from venn_abers import VennAbers

        t_stack, (p_fit, p_test) = timeit(lambda: (np.stack([1 - c_fit, c_fit], 1),
                                                   np.stack([1 - c_test, c_test], 1)), repeats)
        prep = t_probs + t_top + t_stack
        sec, va = timeit(lambda: VennAbers().fit(p_fit, r_fit), repeats)
        sec_apply, (p_prime, p0_p1) = timeit(lambda: va.predict_proba(p_test), repeats)
        d = max(float(np.abs(p_prime[:, 1] - conf).max()),
                float(np.abs(p0_p1 - rec.confidence_interval(test)).max()))
        ok = d <= VA_ATOL
        report.fail_unless(ok, f"venn-abers N={n}: values {d:.1e} apart")
        check = f"p, [p0, p1] max|Δ| = {d:.1e} (<= {VA_ATOL:g}) {'OK' if ok else 'DIFFERS'}"
        fit_rows.append(Row("venn-abers VennAbers.fit ([1-conf, conf])", sec, check, ok,
                            prep=prep))
        apply_rows.append(Row("venn-abers .predict_proba ([1-conf, conf])", sec_apply, check,
                              ok, prep=prep))
    report.table(SECTION, f"Venn-Abers fit, N = {n:,}, K = 10", fit_api, fit_rows, fit_same)
    report.table(SECTION, f"Venn-Abers apply, N = {n:,}, K = 10", apply_api, apply_rows,
                 apply_same)


def workload(repeats: int, report: Any, quick: bool = False) -> None:
    """The section's rows (see the module docstring)."""
    with warnings.catch_warnings():  # the peers' notices (torch.jit, All-NaN slices)
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            for name in ("sms", "svs"):
                for k in (10, 100):
                    structured_rows(name, k, repeats, report)
            for n in (5_000, 50_000) + (() if quick else (200_000,)):
                venn_abers_rows(n, repeats, report)


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="best of (calls under 1 s)")
    ap.add_argument("--quick", action="store_true", help="Venn-Abers up to N = 50,000")
    args = ap.parse_args(argv)
    report = Report()
    print(machine("cpu"))
    rule("CalArena recalibrators: sms / svs vs probmetrics, venn-abers vs venn-abers")
    workload(args.repeats, report, args.quick)
    summary = report.summary(SECTION, "sms / svs / venn-abers")
    report.check()
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
