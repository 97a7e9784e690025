"""Risk–coverage metrics: selbench.measure.riskcoverage vs torch-uncertainty (a workload of
``bench_peers.py``).

``workload(n, repeats, report)`` times AURC, AUGRC, coverage at a risk level and risk at a
coverage level on the same seeded synthetic data as the other metric rows of
``bench_peers.py`` (float32 logits ``2 * N(0, 1)``, K = 10, labels drawn from their softmax),
and records one row per metric in section ``"riskcov"`` of ``report`` (``report.summary(
"riskcov", ...)`` gives the target line). Both libraries get the same inputs, made outside
the timed call: the float64 softmax probabilities and the labels (torch tensors sharing the
memory of the numpy arrays for torch-uncertainty); selbench's timed call includes
``top_label`` (max-prob score and correctness, the score torch-uncertainty uses), and its
row also gives the time from ``(scores, correct)`` alone. The ratio is
``torch-uncertainty time / selbench time`` (above 1: selbench is faster).

Value checks. torch-uncertainty 0.13.0 breaks ties (``argsort(descending=True)``, one
curve point per example) where selbench merges them (fd-shifts' rule), omits fd-shifts'
coverage-0 anchor and rescales the areas by ``1 / (1 - 1/N)``; its coverages ``k / N`` are
float32 unless torch's default dtype is float64. The definitions therefore agree only on
tie-free scores, through the exact conversions (``r_1`` the error of the top example)::

    AURC_tu  = (aurc  - r_1 / N)       / (1 - 1/N)
    AUGRC_tu = (augrc - r_1 / (2 N^2)) / (1 - 1/N)

and, for the working points, ``CovAtxRisk`` = ``coverage_at_risk`` where some point qualifies
(``nan`` vs 0.0 otherwise) and ``RiskAtxCov`` = ``risk_at_coverage`` where ``N * coverage``
is exact. The float64 max-probabilities of this data are tie-free (checked: the run fails
otherwise). Each row checks the library as shipped (float32 coverages) to ``TU_ATOL`` and one
more, untimed call with torch's default dtype at float64 to ``ATOL``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from peers_common import Report, Row, make_data, peer, softmax64, timeit

#: value tolerances: torch-uncertainty with float64 default dtype, and as shipped (float32
#: coverages k / N, relative rounding 6e-8)
ATOL = 1e-12
TU_ATOL = 1e-6
K = 10
RISK = 0.05  # coverage at 5% risk, as torch-uncertainty's CovAt5Risk
COVERAGE = 0.8  # risk at 80% coverage, as torch-uncertainty's RiskAt80Cov


def workload(n: int, repeats: int, report) -> None:
    """Time and check the four risk–coverage rows at ``n`` examples (K = 10)."""
    import torch
    from selbench.measure.metrics import top_label
    from selbench.measure.riskcoverage import augrc, aurc, coverage_at_risk, risk_at_coverage

    z, labels = make_data(n, K, temperature=1.0)
    probs = softmax64(z)
    conf, correct = top_label(probs, labels)
    distinct = len(np.unique(conf))
    tie_free = distinct == n
    report.fail_unless(tie_free, f"risk-coverage N={n}: {n - distinct} tied max-probabilities "
                                 "(the value checks need tie-free scores)")
    top_err = 1.0 - float(correct[np.argmax(conf)])

    # (title, selbench function, its call, torch-uncertainty class and arguments, the
    # conversion of selbench's value to torch-uncertainty's convention on tie-free data)
    cases = [
        ("AURC", "aurc", lambda s, c: aurc(s, c), "AURC", (),
         lambda v: (v - top_err / n) / (1 - 1 / n)),
        ("AUGRC", "augrc", lambda s, c: augrc(s, c), "AUGRC", (),
         lambda v: (v - top_err / (2 * n * n)) / (1 - 1 / n)),
        (f"coverage at {RISK:g} risk", "coverage_at_risk",
         lambda s, c: coverage_at_risk(s, c, RISK), "CovAtxRisk", (RISK,),
         lambda v: v if v > 0 else math.nan),
        (f"risk at {COVERAGE:g} coverage", "risk_at_coverage",
         lambda s, c: risk_at_coverage(s, c, COVERAGE), "RiskAtxCov", (COVERAGE,),
         lambda v: v),
    ]
    tu = None
    if peer("torch_uncertainty") is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch_uncertainty.metrics.classification as tu
    probs_t, labels_t = torch.from_numpy(probs), torch.from_numpy(labels)

    for title, sel_name, fn, tu_name, tu_args, to_tu in cases:
        sec_same, _ = timeit(lambda fn=fn: fn(conf, correct), repeats)
        sec, value = timeit(lambda fn=fn: fn(*top_label(probs, labels)), repeats)
        api = Row(f"selbench top_label + {sel_name} (probs, labels)", sec,
                  f"{value:.12f}; {sec_same * 1e3:.1f} ms from (scores, correct)")
        rows = []
        if tu is not None:
            rows.append(_tu_row(getattr(tu, tu_name), tu_name, tu_args, (probs_t, labels_t),
                                to_tu(value), tie_free, n, repeats, report))
        report.table("riskcov", f"{title}, N = {n:,}, K = {K} (max-prob scores)", api, rows,
                     logits=False)


def _tu_row(cls, tu_name: str, tu_args: tuple, inputs: tuple, expected: float,
            tie_free: bool, n: int, repeats: int, report) -> Row:
    """The row of torch-uncertainty's metric ``cls(*tu_args)`` on ``inputs`` (probabilities
    and labels), timed as shipped and checked, as shipped and with float64 default dtype,
    against selbench's value converted to its convention (``expected``)."""
    import torch

    probs_t, labels_t = inputs

    def run_tu(cls=cls, args=tu_args):
        m = cls(*args)
        m.update(probs_t, labels_t)
        return float(m.compute())

    sec_tu, v_tu = timeit(run_tu, repeats)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        v_tu64 = run_tu()
    finally:
        torch.set_default_dtype(old)
    d32, d64 = _dist(v_tu, expected), _dist(v_tu64, expected)
    ok = tie_free and d32 <= TU_ATOL and d64 <= ATOL
    report.fail_unless(ok, f"risk-coverage N={n}: torch-uncertainty {tu_name} "
                           f"{v_tu!r} / {v_tu64!r} (float64) vs selbench converted "
                           f"{expected!r}")
    note = "tie-free data" + (", converted (anchor, 1/(1-1/N))" if not tu_args else "")
    shown = f"{tu_name}({tu_args[0]:g})" if tu_args else tu_name
    return Row(f"torch-uncertainty {shown} (probs, labels)", sec_tu,
               f"{note}: |Δ| = {d32:.1e} as shipped (<= {TU_ATOL:g}), "
               f"{d64:.1e} float64 (<= {ATOL:g}) {'OK' if ok else 'DIFFERS'}", ok)


def _dist(a: float, b: float) -> float:
    if math.isnan(a) and math.isnan(b):
        return 0.0
    return abs(a - b)


if __name__ == "__main__":  # python perf/peers_riskcov.py [N]: this workload alone
    import sys

    report = Report()
    workload(int(float(sys.argv[1])) if len(sys.argv) > 1 else 1_000_000, 5, report)
    report.summary("riskcov", "risk-coverage metrics")
    report.check()
