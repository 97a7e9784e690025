"""Guaranteed selective risk (selbench.measure.guarantee): SGR against an independent
implementation of Geifman & El-Yaniv's Algorithm 1 written here (bisection on the binomial
CDF, as the paper's code solves it), the guarantee's rate over seeded draws of a synthetic
task with a known true risk, MAPIE's binomial p-value, and the spec option end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import binom
from selbench.measure.guarantee import binomial_upper_bound, risk_guarantee_metrics, sgr


# --------------------------------------------------------------------------- reference
def ref_bound(errors: int, n: int, delta: float) -> float:
    """The b with P(Bin(n, b) <= errors) = delta, by root finding on scipy's binomial CDF."""
    if errors == n:
        return 1.0
    return brentq(lambda b: binom.cdf(errors, n, b) - delta, errors / n, 1.0,
                  xtol=1e-15, rtol=4 * np.finfo(float).eps)


def ref_sgr(scores, correct, r, delta, union=True, tail=True):
    """Algorithm 1 as printed (1-based z over the ascending sort, ceil(log2 m) steps, bound at
    delta / ceil(log2 m)); returns the visited threshold of largest coverage whose bound is
    below r (inf if none) and that bound. ``union=False``: every step at delta;
    ``tail=False``: the empirical risk itself instead of a bound (ignores delta)."""
    m = len(scores)
    s = sorted(scores)
    steps = max(1, math.ceil(math.log2(m)))
    lo, hi, best = 0, m, (math.inf, math.nan)
    for _ in range(steps):
        z = math.ceil((lo + hi) / 2)
        theta = s[z - 1]
        acc = [c for sc, c in zip(scores, correct) if sc >= theta]
        k, e = len(acc), sum(1 for c in acc if c == 0)
        b = (ref_bound(e, k, delta / steps if union else delta) if tail else e / k)
        if b < r:
            hi, best = z, (theta, b)
        else:
            lo = z
    return best


# --------------------------------------------------------------------------- the bound
@pytest.mark.parametrize("errors,n,delta", [(0, 1, 0.1), (0, 50, 0.05), (3, 50, 0.05),
                                            (17, 200, 0.001), (199, 200, 0.2), (40, 41, 0.5),
                                            (0, 10_000, 1e-6), (250, 10_000, 0.01)])
def test_binomial_bound_solves_the_tail_equation(errors, n, delta):
    b = binomial_upper_bound(errors, n, delta)
    assert b == pytest.approx(ref_bound(errors, n, delta), abs=1e-10)
    assert binom.cdf(errors, n, b) == pytest.approx(delta, rel=1e-8)
    assert b > errors / n
    assert binomial_upper_bound(n, n, delta) == 1.0


def test_bound_rejects_bad_counts():
    with pytest.raises(ValueError, match="errors"):
        binomial_upper_bound(5, 4, 0.1)
    with pytest.raises(ValueError, match="n must"):
        binomial_upper_bound(0, 0, 0.1)
    with pytest.raises(ValueError, match="delta"):
        sgr([0.1, 0.2], [1, 1], 0.1, 0.0)
    with pytest.raises(ValueError, match="risk"):
        sgr([0.1, 0.2], [1, 1], 1.5, 0.1)


# --------------------------------------------------------------------------- the algorithm
@pytest.mark.parametrize("seed", range(6))
def test_sgr_equals_the_reference_algorithm(seed):
    rng = np.random.default_rng(seed)
    m = [37, 200, 513, 1000, 64, 300][seed]
    sc = rng.random(m)
    if seed % 2:
        sc = np.round(sc, 1)  # ties: accepted together at a tied threshold
    correct = (rng.random(m) < 0.5 + 0.5 * sc).astype(float)
    r, delta = [0.1, 0.2, 0.15, 0.05, 0.3, 0.12][seed], 0.05
    got = sgr(sc, correct, r, delta)
    theta, bound = ref_sgr(list(sc), list(correct), r, delta)
    assert got.threshold == theta
    if math.isfinite(theta):
        assert got.bound == pytest.approx(bound, abs=1e-10)
        assert got.bound < r
        acc = sc >= theta
        assert got.coverage == acc.mean()
        assert got.risk == pytest.approx(1 - correct[acc].mean(), abs=1e-15)
    else:
        assert got.coverage == 0.0 and math.isnan(got.bound)
    assert got.visited == math.ceil(math.log2(m))


def test_sgr_without_the_union_bound_would_pick_another_threshold():
    # a case where delta instead of delta / ceil(log2 m) changes the chosen threshold
    rng = np.random.default_rng(11)
    sc = rng.random(400)
    correct = (rng.random(400) < 0.7 + 0.3 * sc).astype(float)
    got = sgr(sc, correct, 0.1, 0.1)
    no_union = ref_sgr(list(sc), list(correct), 0.1, 0.1, union=False)[0]
    assert got.threshold == ref_sgr(list(sc), list(correct), 0.1, 0.1)[0]
    assert got.threshold > no_union  # the union bound costs coverage


def test_sgr_rejects_everything_when_no_threshold_is_certified():
    got = sgr([0.9, 0.8, 0.7, 0.6], [0, 1, 0, 1], 0.05, 0.1)
    assert got.threshold == math.inf and got.coverage == 0.0
    out = risk_guarantee_metrics([0.9, 0.8, 0.7, 0.6], [0, 1, 0, 1], [0.95, 0.5], [1, 0],
                                 0.05, 0.1)
    assert out["rg_coverage"] == 0.0 and math.isnan(out["rg_risk"]) and out["rg_held"] == 1.0


# --------------------------------------------------------------------------- the guarantee
def _task(rng, m):
    """Scores U(0, 1), wrong with probability 0.4 (1 - s): the true selective risk of the
    threshold t is 0.2 (1 - t)."""
    s = rng.random(m)
    return s, (rng.random(m) >= 0.4 * (1.0 - s)).astype(float)


def _true_risk(theta: float) -> float:
    return 0.0 if not math.isfinite(theta) else 0.2 * (1.0 - theta)


def test_guarantee_holds_at_the_stated_rate_and_fails_when_delta_is_ignored():
    r, delta, m, draws = 0.1, 0.1, 500, 500
    violated = {"sgr": 0, "no_tail": 0}
    coverage = []
    for seed in range(draws):
        sc, correct = _task(np.random.default_rng([seed, 27]), m)
        got = sgr(sc, correct, r, delta)
        violated["sgr"] += _true_risk(got.threshold) > r
        coverage.append(got.coverage)
        # ignoring delta: the largest coverage whose empirical risk is at most r
        order = np.argsort(-sc)
        risk = np.cumsum(1 - correct[order]) / np.arange(1, m + 1)
        ok = np.flatnonzero(risk <= r)
        theta = sc[order][ok[-1]] if ok.size else math.inf
        violated["no_tail"] += _true_risk(theta) > r
    assert violated["sgr"] / draws <= delta
    assert violated["no_tail"] / draws > 3 * delta  # about half the draws
    assert 0.1 < np.mean(coverage) < 0.5  # the true risk r is met at coverage 0.5


# --------------------------------------------------------------------------- MAPIE
def test_the_bound_is_mapies_binary_learn_then_test_p_value():
    methods = pytest.importorskip("mapie.risk_control.methods")
    rng = np.random.default_rng(3)
    for _ in range(200):
        k = int(rng.integers(1, 2000))
        e = int(rng.integers(0, k + 1))
        delta, r = float(rng.uniform(1e-4, 0.3)), float(rng.uniform(0.01, 0.5))
        # MAPIE's p-value of "risk <= r" for a binary loss (Bentkus, Learn-Then-Test) is the
        # binomial tail P(Bin(k, r) <= k r_hat); SGR certifies r exactly when it is < delta
        if math.ceil(k * (e / k)) != e:
            continue  # MAPIE reads the count back as ceil(k * r_hat), here one too many
        p = methods.compute_hoeffding_bentkus_p_value(np.array([e / k]), k, r, binary=True)
        p = float(np.asarray(p).ravel()[0])
        b = binomial_upper_bound(e, k, delta)
        if abs(p - delta) > 1e-9 and abs(b - r) > 1e-9:
            assert (b < r) == (p < delta)
        # and at r = the bound, the p-value is delta
        if e < k:
            pb = methods.compute_hoeffding_bentkus_p_value(np.array([e / k]), k, b, binary=True)
            assert float(np.asarray(pb).ravel()[0]) == pytest.approx(delta, rel=1e-6)


# --------------------------------------------------------------------------- spec, end to end
def test_risk_guarantee_spec_runs_and_reports(tmp_path):
    import json

    from conftest import tiny_spec
    from selbench.execution.runner import run
    from selbench.spec import SpecError, load_spec

    methods = [{"label": "Confidence", "scheme": {"name": "recalibration"},
                "recalibrator": {"name": "temperature"}, "selector": {"name": "confidence"}}]
    spec = tiny_spec(methods=methods, risk_guarantee={"risk": 0.2, "delta": 0.1},
                     bootstrap={"resamples": 0})
    resolved = load_spec(spec)
    assert resolved.spec.experiments[0].metrics[-3:] == ["rg_coverage", "rg_risk", "rg_held"]
    plain = load_spec(tiny_spec(methods=methods))
    assert "risk_guarantee" not in plain.canonical()["experiments"][0]  # hash unchanged
    with pytest.raises(SpecError, match="exclusive"):
        load_spec(tiny_spec(methods=methods, risk_guarantee={"risk": 0.2, "delta": 0.1},
                            coverage_guarantee={"delta": 0.1}))
    with pytest.raises(SpecError, match="rg_risk.*needs risk_guarantee"):
        load_spec({**tiny_spec(methods=methods), "metrics": ["ece1", "rg_risk"]})
    out = tmp_path / "res"
    run(spec, out_dir=out, cache_dir=tmp_path / "cache", progress=False, plots=False)
    board = json.loads(next(out.rglob("leaderboard.json")).read_text())
    exp = board["experiments"][0]
    assert exp["risk_guarantee"] == {"risk": 0.2, "delta": 0.1}
    row = exp["rows"][0]["metrics"]
    for key in ("rg_coverage", "rg_risk", "rg_held"):
        assert key in row
    cells = sorted(out.rglob("seed*.json"))
    cell = json.loads(cells[0].read_text())
    m = cell["metrics"]
    assert 0.0 <= m["rg_coverage"][0] <= 1.0 and len(set(m["rg_coverage"])) == 1
    assert m["rg_held"][0] == float(m["rg_risk"][0] <= 0.2)
    md = next(out.rglob("leaderboard.md")).read_text()
    assert "Selective risk guaranteed ≤ r = 0.2" in md


def test_risk_guarantee_intervals_are_the_bootstrap_of_the_evaluation_examples():
    """At a fixed threshold the coverage is a binomial proportion: its 95% bootstrap
    interval has the normal approximation's width; the risk's is that of the accepted
    errors; the bound (fitting data only) has no evaluation noise."""
    from selbench.measure.guarantee import risk_guarantee_intervals

    g = np.random.default_rng(3)
    n = 4000
    scores = g.uniform(size=n)
    correct = (g.uniform(size=n) < 0.5 + 0.5 * scores).astype(float)
    got = risk_guarantee_intervals(0.4, scores, correct, 0.2, 0.17, resamples=2000,
                                   level=0.95, seed=0)
    p = float(np.mean(scores >= 0.4))
    half = 1.96 * math.sqrt(p * (1 - p) / n)
    cov = got["rg_coverage"]
    assert cov["low"] < p < cov["high"]
    assert cov["high"] - cov["low"] == pytest.approx(2 * half, rel=0.08)
    acc = scores >= 0.4
    r = float(np.mean(1 - correct[acc]))
    half_r = 1.96 * math.sqrt(r * (1 - r) / acc.sum())
    assert got["rg_risk"]["high"] - got["rg_risk"]["low"] == pytest.approx(2 * half_r, rel=0.08)
    assert got["rg_bound"] == {"low": 0.17, "high": 0.17}
    assert got["rg_held"]["low"] in (0.0, 1.0) and got["rg_held"]["high"] in (0.0, 1.0)
    assert got == risk_guarantee_intervals(0.4, scores, correct, 0.2, 0.17, resamples=2000,
                                           level=0.95, seed=0)


def test_risk_guarantee_columns_carry_bootstrap_intervals(tmp_path):
    import json

    from conftest import tiny_spec
    from selbench.execution.runner import run

    methods = [{"label": "Confidence", "scheme": {"name": "recalibration"},
                "recalibrator": {"name": "temperature"}, "selector": {"name": "confidence"}}]
    spec = tiny_spec(methods=methods, risk_guarantee={"risk": 0.2, "delta": 0.1},
                     bootstrap={"resamples": 50})
    out = tmp_path / "res"
    run(spec, out_dir=out, cache_dir=tmp_path / "cache", progress=False, plots=False)
    cell = json.loads(sorted(out.rglob("seed*.json"))[0].read_text())
    for key in ("rg_coverage", "rg_risk", "rg_held", "rg_bound"):
        iv = cell["intervals"][key]
        assert iv["low"] <= cell["metrics"][key][0] <= iv["high"] or key == "rg_held"
    board = json.loads(next(out.rglob("leaderboard.json")).read_text())
    row = board["experiments"][0]["rows"][0]["metrics"]
    for key in ("rg_coverage", "rg_risk"):
        (point,) = row[key].values()
        assert point["bootstrap"]["low_mean"] <= point["bootstrap"]["high_mean"]
