"""Tests of selbench.measure.bootstrap: the wrapper equals scipy, intervals mean what they say, and the
vectorised cell measurement equals the plain loop over ``selective_metrics`` for scipy's draws."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.stats
from selbench.measure import bootstrap as BS
from selbench.measure import metrics as M
from selbench.measure.bootstrap import bootstrap_ci, selective_intervals
from selbench.measure.resampled import IntervalRequest, ResampledCell

STREAM = 0xB007


def scipy_rng(seed):
    return np.random.default_rng([seed, STREAM])


def cell_data(n, kind="random", seed=0):
    """Scores, confidences and correctness of a synthetic cell."""
    g = np.random.default_rng([n, seed, 7])
    conf = g.uniform(0.3, 1.0, n)
    scores = conf + g.normal(0.0, 0.1, n)
    correct = (g.uniform(size=n) < conf).astype(np.float64)
    if kind == "tied_scores":
        scores = g.integers(0, 3, n).astype(np.float64)
    elif kind == "tied_conf":
        conf = g.choice([0.5, 0.7, 0.9, 1.0], n)
    elif kind == "all_correct":
        correct[:] = 1.0
    elif kind == "all_wrong":
        correct[:] = 0.0
    elif kind == "constant":
        scores[:] = 2.0
        conf[:] = 0.75
    return scores, conf, correct


def bern(n, p, seed):
    g = np.random.default_rng(seed)
    return (g.uniform(size=n) < p).astype(np.float64)


# --------------------------------------------------------------------------- bootstrap_ci
@pytest.mark.filterwarnings("ignore::RuntimeWarning:scipy.stats._resampling")
@pytest.mark.filterwarnings("ignore::scipy.stats.DegenerateDataWarning")
@pytest.mark.parametrize(("method", "metric"), [("BCa", M.brier), ("BCa", M.ece),
                                               ("percentile", M.ece), ("basic", M.ece)])
def test_bootstrap_ci_equals_scipy(method, metric):
    _, conf, correct = cell_data(150)
    ref = scipy.stats.bootstrap((conf, correct), metric, paired=True, vectorized=False,
                                n_resamples=60, method=method, rng=scipy_rng(3))
    if np.isnan(ref.confidence_interval.low):  # BCa of the ECE here: every resample is worse
        assert metric is M.ece and metric(conf, correct) < ref.bootstrap_distribution.min()
        with pytest.warns(RuntimeWarning, match="percentile interval"):
            got = bootstrap_ci(metric, conf, correct, n_resamples=60, method=method, seed=3)
        ref = scipy.stats.bootstrap((conf, correct), metric, paired=True, vectorized=False,
                                    n_resamples=60, method="percentile", rng=scipy_rng(3))
    else:
        got = bootstrap_ci(metric, conf, correct, n_resamples=60, method=method, seed=3)
    assert isinstance(got, BS.Interval) and isinstance(got.low, float)
    assert got.low == ref.confidence_interval.low
    assert got.high == ref.confidence_interval.high


def test_bootstrap_ci_vectorized_statistic_detected_and_equal():
    y = bern(500, 0.3, 1)
    mean = lambda x, axis=-1: np.mean(x, axis=axis)
    auto = bootstrap_ci(mean, y, n_resamples=300, seed=1)
    ref = scipy.stats.bootstrap((y,), mean, paired=True, n_resamples=300, rng=scipy_rng(1))
    assert auto == (ref.confidence_interval.low, ref.confidence_interval.high)
    loop = bootstrap_ci(mean, y, n_resamples=300, seed=1, vectorized=False)
    assert loop.low == pytest.approx(auto.low, abs=1e-12)
    assert loop.high == pytest.approx(auto.high, abs=1e-12)


def test_bootstrap_ci_accuracy_of_a_large_bernoulli_sample():
    n, p = 20_000, 0.3
    y = bern(n, p, 2)
    low, high = bootstrap_ci(lambda c: M.accuracy(c), y, n_resamples=400, method="percentile")
    assert low < p < high
    assert low < y.mean() < high
    width = 2 * 1.96 * math.sqrt(p * (1 - p) / n)
    assert high - low == pytest.approx(width, rel=0.12)


def test_bootstrap_ci_reproducible_and_seeded():
    _, conf, correct = cell_data(120)
    ece2 = lambda c, y: M.ece(c, y, p=2)
    a = bootstrap_ci(ece2, conf, correct, n_resamples=50, method="percentile", seed=5)
    b = bootstrap_ci(ece2, conf, correct, n_resamples=50, method="percentile", seed=5)
    c = bootstrap_ci(ece2, conf, correct, n_resamples=50, method="percentile", seed=6)
    assert a == b
    assert a != c


def test_bootstrap_ci_batch_does_not_change_the_draws():
    _, conf, correct = cell_data(90)
    kw = dict(n_resamples=45, seed=2)
    assert bootstrap_ci(M.brier, conf, correct, batch=7, **kw) == bootstrap_ci(
        M.brier, conf, correct, **kw)


def test_bootstrap_ci_vector_statistic():
    _, conf, correct = cell_data(100)
    both = lambda c, y: [M.ece(c, y), M.ece(c, y, p=2)]
    low, high = bootstrap_ci(both, conf, correct, n_resamples=40, method="percentile")
    assert low.shape == high.shape == (2,)
    for j, fn in enumerate([M.ece, lambda c, y: M.ece(c, y, p=2)]):
        one = bootstrap_ci(fn, conf, correct, n_resamples=40, method="percentile")
        assert (low[j], high[j]) == pytest.approx(one, abs=1e-15)


def test_bootstrap_ci_rows_of_any_shape_keep_their_dtype():
    g = np.random.default_rng(0)
    probs = g.dirichlet(np.ones(4), 80)
    labels = g.integers(0, 4, 80)

    def acc(p, y):
        assert p.shape[1] == 4 and y.dtype.kind == "i"
        return float(np.mean(p.argmax(1) == y))

    low, high = bootstrap_ci(acc, probs, labels, n_resamples=30, method="percentile")
    correct = (probs.argmax(1) == labels).astype(np.float64)
    assert (low, high) == bootstrap_ci(M.accuracy, correct, n_resamples=30, method="percentile")


def test_bootstrap_ci_one_example_is_a_point_mass():
    low, high = bootstrap_ci(M.brier, [0.8], [1.0])
    assert low == high == pytest.approx(0.04)


def test_bootstrap_ci_constant_distribution_gives_the_constant_silently():
    y = np.ones(40)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for method in ("BCa", "percentile", "basic"):
            assert bootstrap_ci(M.accuracy, y, n_resamples=30, method=method) == (1.0, 1.0)


def test_bootstrap_ci_undefined_bca_falls_back_to_percentile_with_a_warning():
    x = np.arange(30.0)
    distinct = lambda v: float(np.unique(v).size)  # the sample's value exceeds every resample's
    with pytest.warns(RuntimeWarning, match="percentile interval"):
        got = bootstrap_ci(distinct, x, n_resamples=50, method="BCa")
    assert got == bootstrap_ci(distinct, x, n_resamples=50, method="percentile")
    assert got.high < 30


def test_bootstrap_ci_nan_statistic_warns():
    x = np.arange(20.0)
    nan_sometimes = lambda v: float("nan") if v.min() > 0 else 1.0
    with pytest.warns(RuntimeWarning, match="NaN on"):
        low, high = bootstrap_ci(nan_sometimes, x, n_resamples=50, method="percentile")
    assert math.isnan(low) and math.isnan(high)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(level=0.0), "level"), (dict(level=1.0), "level"), (dict(level=True), "level"),
        (dict(n_resamples=0), "n_resamples"), (dict(n_resamples=2.5), "n_resamples"),
        (dict(method="bca2"), "did you mean 'BCa'"),
        (dict(method="percentil"), "did you mean 'percentile'"),
        (dict(method="jackknife"), "valid: 'percentile', 'basic', 'BCa'"),
        (dict(batch=0), "batch"), (dict(seed=-1), "seed"),
    ],
)
def test_bootstrap_ci_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bootstrap_ci(M.accuracy, np.ones(5), **kwargs)


def test_bootstrap_ci_validates_data():
    with pytest.raises(ValueError, match="same number of examples"):
        bootstrap_ci(M.brier, np.ones(5), np.ones(4))
    with pytest.raises(ValueError, match="at least one data array"):
        bootstrap_ci(M.brier)
    with pytest.raises(ValueError, match="1-D"):
        bootstrap_ci(lambda x, axis=-1: x.mean(axis), np.ones((5, 2)))
    assert bootstrap_ci(M.accuracy, np.ones(5), method="bca") == (1.0, 1.0)  # any case


# --------------------------------------------------------------------------- fast = slow
EXTRA = {"mean_conf": lambda c, y: float(np.mean(c)),
         "first_gap": lambda c, y: float(c[0] - y[0])}  # order-sensitive: selection order
RANKING = {"score_risk": lambda s, y: float(np.dot(s, 1.0 - y) / s.shape[0])}

def _mean_conf(c, y):
    return float(np.mean(c))


def _first_gap(c, y):
    return float(c[0] - y[0])


def _score_risk(s, y):
    return float(np.dot(s, 1.0 - y) / s.shape[0])


_mean_conf.batched = lambda c, y: np.mean(c, axis=1)
_first_gap.batched = lambda c, y: c[:, 0] - y[:, 0]
_score_risk.batched = lambda s, y: np.einsum("ij,ij->i", s, 1.0 - y) / s.shape[1]
BATCHED_EXTRA = {"mean_conf": _mean_conf, "first_gap": _first_gap}
BATCHED_RANKING = {"score_risk": _score_risk}

CASES = [(n, kind) for n in (1, 2, 3, 7, 14, 40)
         for kind in ("random", "tied_scores", "tied_conf", "all_correct", "all_wrong")]
CASES += [(16, "constant"), (300, "random"), (300, "tied_scores"), (300, "tied_conf")]


def both_paths(scores, conf, correct, betas, **kw):
    out = []
    for slow in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # infeasible delta at small n
            out.append(BS._selective_intervals(scores, conf, correct, IntervalRequest(betas, **kw),
                                               slow=slow))
    return out


@pytest.mark.parametrize(("n", "kind"), CASES)
@pytest.mark.parametrize(("delta", "selects"), [(None, True), (0.2, True), (None, False)])
def test_fast_path_equals_selective_metrics_loop(n, kind, delta, selects):
    scores, conf, correct = cell_data(n, kind)
    (fast, dist_fast), (slow, dist_slow) = both_paths(
        scores, conf, correct, M.DEFAULT_BETAS, n_resamples=12, level=0.9, seed=4,
        delta=delta, selects=selects, extra=EXTRA, ranking=RANKING)
    np.testing.assert_allclose(dist_fast, dist_slow, rtol=0, atol=1e-12)
    assert fast.keys() == slow.keys()
    for key in fast:
        for part in fast[key]:
            np.testing.assert_allclose(fast[key][part], slow[key][part], rtol=0, atol=1e-12)


@pytest.mark.parametrize("selects", [True, False])
def test_batched_callables_equal_the_plain_loop(selects):
    scores, conf, correct = cell_data(60, "tied_scores")
    (fast, dist_fast), (slow, dist_slow) = both_paths(
        scores, conf, correct, M.DEFAULT_BETAS, n_resamples=12, level=0.9, seed=4,
        delta=None, selects=selects, extra=BATCHED_EXTRA, ranking=BATCHED_RANKING)
    np.testing.assert_allclose(dist_fast, dist_slow, rtol=0, atol=1e-12)
    plain, dist_plain = both_paths(scores, conf, correct, M.DEFAULT_BETAS, n_resamples=12,
                                   level=0.9, seed=4, delta=None, selects=selects,
                                   extra=EXTRA, ranking=RANKING)[0]
    assert plain.keys() == fast.keys()
    np.testing.assert_allclose(dist_fast, dist_plain, rtol=0, atol=1e-12)


def _leaderboard_extra(scores, conf, correct, betas, delta, selects, seed):
    """The selective metrics a cell's bootstrap measures (selbench.measure.evaluate.intervals)."""
    from selbench.measure import evaluate as E

    extra = {k: E.EXTRA_SELECTIVE[k] for k in E.BOOTSTRAPPED_EXTRA}
    arrays = {"score": scores, "confidence": conf, "correct": correct}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        extra["smece"] = E.smece_at_bandwidths(arrays, list(betas), delta=delta, seed=seed,
                                               selects=selects)
    return extra


@pytest.mark.parametrize(("n", "kind"), [(2, "random"), (7, "tied_conf"), (40, "all_correct"),
                                         (300, "random"), (300, "tied_conf")])
@pytest.mark.parametrize(("delta", "selects"), [(None, True), (0.2, True), (None, False)])
def test_every_leaderboard_metric_has_a_fast_path_equal_to_the_loop(n, kind, delta, selects):
    """smECE (at the cell's bandwidth), NLL, MCE, equal-width and debiased ECE: their batched
    or binned forms give what the plain functions give on every resample."""
    scores, conf, correct = cell_data(n, kind)
    extra = _leaderboard_extra(scores, conf, correct, M.DEFAULT_BETAS, delta, selects, 4)
    assert {"smece", "nll", "mce", "ece1_ew", "ece2_debiased", "signed_ce"} <= set(extra)
    (fast, dist_fast), (slow, dist_slow) = both_paths(
        scores, conf, correct, M.DEFAULT_BETAS, n_resamples=12, level=0.9, seed=4,
        delta=delta, selects=selects, extra=extra, ranking=RANKING)
    assert fast.keys() == slow.keys()
    per = len(M.DEFAULT_BETAS) + 1
    keys = [*BS.BINNED, *extra]
    smooth, root = (np.zeros(dist_fast.shape[0], dtype=bool) for _ in range(2))
    smooth[keys.index("smece") * per:][:per] = True
    root[keys.index("ece2_debiased") * per:][:per] = True
    plain = ~smooth & ~root
    np.testing.assert_allclose(dist_fast[plain], dist_slow[plain], rtol=0, atol=1e-12)
    # the debiased ECE₂ is the root of a difference that may be ~0 (a rounding of 1e-17
    # there is 1e-9 after the root): its squares to 1e-12, its AUC (of roots) to 1e-8
    at = np.flatnonzero(root)
    np.testing.assert_allclose(dist_fast[at[:-1]] ** 2, dist_slow[at[:-1]] ** 2, rtol=0,
                               atol=1e-12)
    np.testing.assert_allclose(dist_fast[at[-1]], dist_slow[at[-1]], rtol=0, atol=1e-8)
    # smECE by FFT of all rows at once: rounding of the FFT (relative to the largest grid
    # value), amplified where the density is ~0 (the 1e-4 guard); 1e-13 on continuous data
    np.testing.assert_allclose(dist_fast[smooth], dist_slow[smooth], rtol=0, atol=1e-9)


def test_smece_at_the_cells_bandwidth_is_the_cells_smece():
    """On the evaluation set itself the fixed bandwidth gives exactly the searched smECE."""
    scores, conf, correct = cell_data(300)
    extra = _leaderboard_extra(scores, conf, correct, [1.0], None, True, 0)
    assert extra["smece"](conf, correct) == M.smece(conf, correct)
    assert extra["smece"].batched(conf[None], correct[None])[0] == pytest.approx(
        M.smece(conf, correct), abs=1e-14)


def test_batched_ranking_callables_share_one_read_only_gather():
    scores, conf, correct = cell_data(50, "tied_scores")
    seen = []

    def ranking_fn():
        fn = lambda s, y: float(np.mean(s))

        def rows(s, y):
            assert not s.flags.writeable and not y.flags.writeable
            seen.append((s, y))
            return np.mean(s, axis=1)

        fn.batched = rows
        return fn

    out = selective_intervals(scores, conf, correct, [0.5, 1.0], n_resamples=12,
                              ranking={"a": ranking_fn(), "b": ranking_fn(), "c": _score_risk})
    assert out["a"] == out["b"]
    assert len(seen) % 2 == 0 and seen
    for (s1, y1), (s2, y2) in zip(seen[::2], seen[1::2]):  # a and b of one batch
        assert s1 is s2 and y1 is y2

    def writes(s, y):
        s[:, 0] = 0.0
        return np.zeros(s.shape[0])

    bad = lambda s, y: 0.0
    bad.batched = writes
    with pytest.raises(ValueError, match="read-only"):
        selective_intervals(scores, conf, correct, [0.5, 1.0], n_resamples=12,
                            ranking={"bad": bad})


def test_batched_callable_of_the_wrong_shape_is_named():
    scores, conf, correct = cell_data(20)
    bad = lambda c, y: 0.0
    bad.batched = lambda c, y: np.zeros(3)
    with pytest.raises(ValueError, match=r"oops.batched returned shape \(3,\)"):
        selective_intervals(scores, conf, correct, [0.5, 1.0], n_resamples=10,
                            extra={"oops": bad})


def test_fast_rows_equal_slow_rows_on_extreme_resamples():
    n = 25
    scores, conf, correct = cell_data(n, "tied_conf")
    rows = np.array([np.zeros(n, int), np.full(n, n - 1), np.arange(n), np.arange(n)[::-1],
                     np.repeat([3, 4, 5, 6, 7], 5), np.tile([1, 2], 13)[:n]])
    for betas in (M.DEFAULT_BETAS, np.array([0.9, 0.3, 0.55]), np.array([1.0])):
        cell = ResampledCell(scores, conf, correct, IntervalRequest(
            betas, seed=1, delta=None, selects=True, extra=EXTRA, ranking=RANKING))
        np.testing.assert_allclose(cell.rows_fast(rows), cell.rows_slow(rows), rtol=0, atol=1e-12)


def test_resamples_are_scipys_draws_measured_by_selective_metrics():
    n, seed, r = 50, 9, 7
    scores, conf, correct = cell_data(n)
    betas = [0.5, 0.8, 1.0]
    _, dist = BS._selective_intervals(scores, conf, correct, IntervalRequest(
        betas, n_resamples=r, level=0.95, seed=seed, delta=None, selects=True, extra={},
        ranking={}))
    draws = scipy_rng(seed).integers(0, n, (r, n))  # what scipy.stats.bootstrap draws
    for j, idx in enumerate(draws):
        m = M.selective_metrics(scores[idx], conf[idx], correct[idx], betas, seed=seed)
        want = np.concatenate([[*m[key], M.auc(betas, m[key])]
                               for key in ("ece1", "ece2", "brier", "accuracy")])
        np.testing.assert_allclose(dist[:, j], want, rtol=0, atol=1e-12)


def test_batch_does_not_change_selective_intervals():
    scores, conf, correct = cell_data(80, "tied_scores")
    kw = dict(n_resamples=30, level=0.95, seed=2, delta=None, selects=True, extra={},
              ranking={})
    request = IntervalRequest(M.DEFAULT_BETAS, **kw)
    a = BS._selective_intervals(scores, conf, correct, request)
    b = BS._selective_intervals(scores, conf, correct, request, batch=7)
    assert a[0] == b[0]
    np.testing.assert_array_equal(a[1], b[1])


# --------------------------------------------------------------------------- selective_intervals
def test_selective_intervals_shape_and_order():
    scores, conf, correct = cell_data(400)
    betas = [0.5, 0.75, 1.0]
    out = selective_intervals(scores, conf, correct, betas, n_resamples=50,
                              extra={"mean_conf": EXTRA["mean_conf"]}, ranking=RANKING)
    assert list(out) == ["ece1", "ece2", "brier", "accuracy", "mean_conf", "score_risk"]
    point = M.selective_metrics(scores, conf, correct, betas)
    for key in ("ece1", "ece2", "brier", "accuracy", "mean_conf"):
        entry = out[key]
        assert set(entry) == {"low", "high", "auc"}
        assert len(entry["low"]) == len(entry["high"]) == 3
        assert all(lo <= hi for lo, hi in zip(entry["low"], entry["high"]))
        assert entry["auc"][0] <= entry["auc"][1]
    for j in range(3):  # the point estimate lies inside its interval (large, smooth metrics)
        for key in ("brier", "accuracy"):
            assert out[key]["low"][j] <= point[key][j] <= out[key]["high"][j]
    lo, hi = out["score_risk"]["low"], out["score_risk"]["high"]
    assert isinstance(lo, float) and lo <= RANKING["score_risk"](scores, correct) <= hi
    single = selective_intervals(scores, conf, correct, [0.8], n_resamples=20)
    assert "auc" not in single["ece1"] and len(single["ece1"]["low"]) == 1


def test_selective_intervals_accuracy_width_matches_the_binomial():
    n, p = 3000, 0.8
    g = np.random.default_rng(11)
    correct = bern(n, p, 12)
    conf = g.uniform(0.5, 1.0, n)
    out = selective_intervals(g.normal(size=n), conf, correct, [1.0], n_resamples=1000)
    low, high = out["accuracy"]["low"][0], out["accuracy"]["high"][0]
    assert low < p < high
    assert high - low == pytest.approx(2 * 1.96 * math.sqrt(p * (1 - p) / n), rel=0.1)


def test_selective_intervals_reproducible_and_seeded():
    scores, conf, correct = cell_data(200, "tied_scores")
    a = selective_intervals(scores, conf, correct, M.DEFAULT_BETAS, n_resamples=40, seed=1)
    b = selective_intervals(scores, conf, correct, M.DEFAULT_BETAS, n_resamples=40, seed=1)
    c = selective_intervals(scores, conf, correct, M.DEFAULT_BETAS, n_resamples=40, seed=2)
    assert a == b
    assert a != c


def test_selective_intervals_without_selection_repeat_beta_one():
    scores, conf, correct = cell_data(200)
    out = selective_intervals(scores, conf, correct, M.DEFAULT_BETAS, n_resamples=40,
                              selects=False)
    full = selective_intervals(scores, conf, correct, [1.0], n_resamples=40)
    for key in ("ece1", "ece2", "brier", "accuracy"):
        assert out[key]["low"] == full[key]["low"] * 11
        assert out[key]["high"] == full[key]["high"] * 11
        assert out[key]["auc"] == pytest.approx([full[key]["low"][0], full[key]["high"][0]],
                                                abs=1e-12)


def test_selective_intervals_one_example():
    out = selective_intervals([0.3], [0.9], [0.0], [0.5, 1.0], n_resamples=10,
                              ranking=RANKING)
    assert out["brier"] == {"low": [0.81, 0.81], "high": [0.81, 0.81],
                            "auc": pytest.approx([0.81, 0.81])}
    assert out["accuracy"]["low"] == [0.0, 0.0]
    assert out["score_risk"] == {"low": 0.3, "high": 0.3}


def test_selective_intervals_nan_metric_warns():
    scores, conf, correct = cell_data(30)
    extra = {"nan_if_all_right": lambda c, y: float("nan") if y.all() else 0.0}
    with pytest.warns(RuntimeWarning, match="nan_if_all_right"):
        out = selective_intervals(scores, conf, correct, [0.1, 1.0], n_resamples=30,
                                  extra=extra)
    assert math.isnan(out["nan_if_all_right"]["low"][0])
    assert not math.isnan(out["ece1"]["low"][0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(level=1.5), "level"), (dict(n_resamples=0), "n_resamples"),
        (dict(delta=0.0), "delta"), (dict(seed=-2), "seed"),
        (dict(extra={"x": 3}), "callables"), (dict(extra={"ece1": M.ece}), "clashes"),
        (dict(extra={"a": M.ece}, ranking={"a": M.ece}), "both name"),
    ],
)
def test_selective_intervals_validates(kwargs, match):
    scores, conf, correct = cell_data(10)
    with pytest.raises(ValueError, match=match):
        selective_intervals(scores, conf, correct, [0.5, 1.0], **kwargs)
    with pytest.raises(ValueError, match="betas"):
        selective_intervals(scores, conf, correct, [0.0])


def test_threads_do_not_change_the_intervals(monkeypatch):
    """The resamples of a statistic call are split among threads (rows are measured
    independently): the bootstrap distribution is the one-thread one, bit for bit, for the
    runner's metric set (binned metrics, extra and ranking callables)."""
    from selbench.measure.evaluate import intervals

    scores, conf, correct = cell_data(3000, "tied_scores")
    arrays = {"score": scores, "confidence": conf, "correct": correct}
    monkeypatch.setattr(BS, "_THREAD_ENTRIES", 1 << 12)
    calls = []
    real = ResampledCell.rows_fast

    def counting(self, idx):
        calls.append(idx.shape[0])
        return real(self, idx)

    monkeypatch.setattr(ResampledCell, "rows_fast", counting)
    out = {}
    for threads in ("1", "3"):
        monkeypatch.setenv("SELBENCH_BOOTSTRAP_THREADS", threads)
        calls.clear()
        out[threads] = intervals(arrays, list(M.DEFAULT_BETAS), delta=0.1, seed=5,
                                 selects=True, resamples=40, level=0.9)
        assert sum(calls) == 40 and len(calls) == (1 if threads == "1" else 3)
    assert repr(out["1"]) == repr(out["3"])
    monkeypatch.setenv("SELBENCH_BOOTSTRAP_THREADS", "x")
    with pytest.raises(ValueError, match="SELBENCH_BOOTSTRAP_THREADS"):
        BS.bootstrap_threads()


def test_selective_intervals_takes_a_request_or_its_fields_as_options():
    from selbench.measure.bootstrap import IntervalRequest

    rng = np.random.default_rng(3)
    sc, conf = rng.random(60), rng.uniform(0.5, 1, 60)
    corr = (rng.random(60) < conf).astype(float)
    by_options = selective_intervals(sc, conf, corr, [0.5, 1.0], n_resamples=20, seed=4)
    request = IntervalRequest([0.5, 1.0], n_resamples=20, seed=4)
    assert selective_intervals(sc, conf, corr, request) == by_options
    with pytest.raises(TypeError, match="unknown option.*n_resample"):
        selective_intervals(sc, conf, corr, [0.5, 1.0], n_resample=20)
    with pytest.raises(TypeError, match="not both"):
        selective_intervals(sc, conf, corr, request, seed=1)
