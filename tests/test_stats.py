"""selbench.measure.stats against scipy and against hand-computed exact values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps
from selbench.measure import stats as S


def test_t_interval_matches_scipy_and_hand_values():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    lo, hi = S.t_interval(x)
    # mean 3, s = sqrt(2.5), t_{0.975, 4} = 2.7764451
    half = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)
    assert (lo, hi) == pytest.approx((3 - half, 3 + half), abs=1e-12)
    rng = np.random.default_rng(0)
    for n in (2, 3, 7, 30):
        v = rng.normal(0.1, 0.02, size=n)
        ref = sps.t.interval(0.95, n - 1, loc=v.mean(), scale=sps.sem(v))
        assert S.t_interval(v) == pytest.approx(ref, rel=1e-12, abs=1e-15)
        ref90 = sps.t.interval(0.9, n - 1, loc=v.mean(), scale=sps.sem(v))
        assert S.t_interval(v, 0.9) == pytest.approx(ref90, rel=1e-12, abs=1e-15)
    assert S.t_interval([0.3]) is None
    assert S.t_interval([0.2, 0.2, 0.2]) == pytest.approx((0.2, 0.2))


def test_summarize_mean_std_interval_and_seed_order():
    st = S.summarize({3: 0.4, 1: 0.1, 2: 0.25})
    assert st["seeds"] == [1, 2, 3] and st["values"] == [0.1, 0.25, 0.4]
    assert st["mean"] == pytest.approx(0.25)
    assert st["std"] == pytest.approx(np.std([0.1, 0.25, 0.4], ddof=1))
    assert st["ci95"] == pytest.approx(list(S.t_interval([0.1, 0.25, 0.4])))
    one = S.summarize({0: 0.7})
    assert (one["mean"], one["std"], one["n"], one["ci95"]) == (0.7, 0.0, 1, None)
    bad = S.summarize({0: 0.7, 1: float("nan")})
    assert math.isnan(bad["mean"]) and bad["ci95"] is None and bad["n"] == 2
    assert math.isnan(S.summarize({})["mean"])


def test_paired_p_value_is_the_exact_one_sided_signed_rank_test():
    worse = [0.11, 0.12, 0.13, 0.14, 0.15]
    best = [0.10, 0.10, 0.10, 0.10, 0.10]
    # all 5 differences positive: exact one-sided p = 1 / 2^5
    assert S.paired_p_value(worse, best, lower_is_better=True) == pytest.approx(1 / 32)
    # higher is better (accuracy): the same data is now in the method's favour
    assert S.paired_p_value(worse, best, lower_is_better=False) == pytest.approx(1.0)
    # ranks 1..4 positive, rank 5 negative: W+ = 10; 10 of the 32 sign patterns reach it
    d = np.array([1, 2, 3, 4, -5]) * 0.01
    assert S.paired_p_value(0.2 + d, np.full(5, 0.2), lower_is_better=True) == pytest.approx(10 / 32)
    rng = np.random.default_rng(1)
    for n in (3, 6, 12):
        x, y = rng.normal(0.1, 0.02, n), rng.normal(0.1, 0.02, n)
        ref = sps.wilcoxon(x - y, alternative="greater").pvalue
        assert S.paired_p_value(x, y, lower_is_better=True) == pytest.approx(ref, rel=1e-12)
    # zero differences are dropped; all zero means "identical to the best"
    assert S.paired_p_value([0.1, 0.2, 0.3], [0.1, 0.2, 0.3], lower_is_better=True) == 1.0
    assert S.paired_p_value([0.1, 0.3, 0.4], [0.1, 0.2, 0.3], lower_is_better=True) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="equal length"):
        S.paired_p_value([0.1, 0.2], [0.1], lower_is_better=True)
    with pytest.raises(ValueError, match="finite"):
        S.paired_p_value([0.1, float("nan")], [0.1, 0.2], lower_is_better=True)


def test_compare_to_best_marks_ties_and_untestable_methods():
    seeds = range(6)
    base = {s: 0.05 + 0.002 * s for s in seeds}
    per_method = {
        "best": base,
        "clearly worse": {s: v + 0.03 for s, v in base.items()},       # worse on every seed
        "close": {s: v + (0.004 if s % 2 else -0.003) for s, v in base.items()},  # mixed signs
        "twin": dict(base),                                              # identical: tie
        "few seeds": {s: base[s] + 0.03 for s in range(3)},              # worse, but 3 seeds only
        "broken": {s: float("nan") for s in seeds},
    }
    out = S.compare_to_best(per_method, lower_is_better=True)
    assert out["best"]["best_mean"] and out["twin"]["best_mean"]
    assert out["best"]["p_vs_best"] is None and out["best"]["best"]
    assert out["clearly worse"]["p_vs_best"] == pytest.approx(1 / 64)
    assert not out["clearly worse"]["best"]
    d = np.array([per_method["close"][s] - base[s] for s in seeds])
    assert out["close"]["p_vs_best"] == pytest.approx(sps.wilcoxon(d, alternative="greater").pvalue)
    assert out["close"]["p_vs_best"] >= 0.05 and out["close"]["best"] and not out["close"]["best_mean"]
    # 3 paired seeds: p = 1/8 >= 0.05, yet it cannot count as "not significantly worse"
    assert out["few seeds"]["p_vs_best"] == pytest.approx(1 / 8)
    assert out["few seeds"]["n_pairs"] == 3 and not out["few seeds"]["best"]
    assert out["broken"] == {"best_mean": False, "p_vs_best": None, "n_pairs": 0, "best": False}
    # higher is better: the largest mean wins
    acc = S.compare_to_best({"a": {0: 0.9, 1: 0.91}, "b": {0: 0.8, 1: 0.82}}, lower_is_better=False)
    assert acc["a"]["best_mean"] and not acc["b"]["best"] and acc["b"]["p_vs_best"] == pytest.approx(0.25)
    # one seed: no test, only the best mean is marked
    one = S.compare_to_best({"a": {0: 0.1}, "b": {0: 0.2}}, lower_is_better=True)
    assert one["a"]["best"] and not one["b"]["best"] and one["b"]["p_vs_best"] is None
    assert S.min_attainable_p(S.MIN_SEEDS_FOR_TEST) < S.ALPHA <= S.min_attainable_p(S.MIN_SEEDS_FOR_TEST - 1)
