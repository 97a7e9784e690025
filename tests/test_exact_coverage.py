"""Exact coverage under ties: at coverage β the core accepts exactly ⌈β n⌉ examples.

The old rule (accept ``scores >= np.quantile(scores, 1 - β)``) accepted every example tied at
the threshold, so a selector with discrete scores over-covered: the ``oracle-domain`` row of
``specs/theory.yaml`` accepted everything whenever a sample held more than 1 - β outliers,
and its temperature was then fitted on all the data.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from selbench import FitContext, ModelOutputs
from selbench.contract.registry import get_registry
from selbench.measure import metrics as M
from selbench.reporting.plots import accepted_mask

REPO = Path(__file__).resolve().parents[1]


def _k(beta: float, n: int) -> int:
    """⌈β n⌉ without floating-point noise (β has at most a few decimals here)."""
    return math.ceil(round(beta * n, 9))


def _binary(n: int, rejected: int, seed: int = 0) -> np.ndarray:
    scores = np.ones(n)
    scores[np.random.default_rng(seed).choice(n, rejected, replace=False)] = 0.0
    return scores


def _conf_correct(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 1])
    conf = rng.uniform(0.5, 1.0, n)
    return conf, (rng.random(n) < conf).astype(np.float64)


# --------------------------------------------------------------------------- counts
def test_binary_scores_reach_beta_within_one_over_n():
    n = 1000
    scores = _binary(n, 211)  # 21.1% rejected: more than 1 - 0.8
    conf, correct = _conf_correct(n)
    betas = M.DEFAULT_BETAS
    res = M.selective_metrics(scores, conf, correct, betas)
    want = np.array([_k(b, n) for b in betas]) / n
    np.testing.assert_array_equal(res["coverage"], want)
    assert np.all(res["coverage"] - betas < 1 / n) and np.all(res["coverage"] >= betas)
    j = int(np.flatnonzero(betas == 0.8)[0])
    assert res["coverage"][j] == 0.8  # the old rule accepted all 1000 (coverage 1.0)
    # at beta <= 0.789 only score-1 examples are accepted; above it every one of them
    for beta in betas:
        mask = M.accept_mask(scores, beta)
        assert mask.sum() == _k(beta, n)
        if _k(beta, n) <= 789:
            assert (scores[mask] == 1).all()
        else:
            assert (scores[mask == 0] == 0).all()
    # thresholds reports the lowest accepted score; scores >= tau would over-cover
    tau, _ = M.thresholds(scores, [0.8])
    assert tau[0] == 0.0 and (scores >= tau[0]).mean() == 1.0


@pytest.mark.parametrize("n", [2, 7, 100, 1001])
def test_all_equal_scores(n):
    scores = np.full(n, 0.3)
    conf, correct = _conf_correct(n)
    betas = np.array([0.05, 0.5, 0.55, 0.8, 1.0])
    res = M.selective_metrics(scores, conf, correct, betas)
    k = np.array([max(1, _k(b, n)) for b in betas])
    np.testing.assert_array_equal(res["coverage"], k / n)
    np.testing.assert_array_equal(res["threshold"], np.full(len(betas), 0.3))
    for beta, kj in zip(betas, k):
        assert M.accept_mask(scores, beta).sum() == kj


def test_rounding_of_beta_n():
    # floating-point noise: 0.55 * 100 = 55.00000000000001, a naive ceil gives 56
    assert math.ceil(0.55 * 100) == 56
    k, guaranteed = M.accepted_counts(100, [0.55])
    assert guaranteed is None and k.dtype == np.int64
    assert k.tolist() == [55]
    assert M.accepted_counts(10, [0.8])[0].tolist() == [8]
    assert M.accepted_counts(10, [0.1 + 0.2, 0.7])[0].tolist() == [3, 7]
    assert M.accepted_counts(10, [0.81, 0.05, 1e-9])[0].tolist() == [9, 1, 1]
    for n in (1, 3, 10, 37, 1000, 12345):
        assert M.accepted_counts(n, [1.0])[0].tolist() == [n]
    np.testing.assert_array_equal(
        M.accepted_counts(100, M.DEFAULT_BETAS)[0], np.arange(50, 101, 5)
    )
    # beta = j / n (as a float) gives exactly j, and slightly more gives j + 1
    for n in (1, 2, 3, 7, 10, 99, 100, 1000, 4097):
        j = np.arange(1, n + 1)
        np.testing.assert_array_equal(M.accepted_counts(n, j / n)[0], j)
        if n > 1:
            above = (j[:-1] + 0.01) / n
            np.testing.assert_array_equal(M.accepted_counts(n, above)[0], j[:-1] + 1)
    # through the metrics: distinct scores, coverage exactly 0.55
    scores = np.arange(100.0)
    conf, correct = _conf_correct(100)
    res = M.selective_metrics(scores, conf, correct, [0.55, 0.8])
    np.testing.assert_array_equal(res["coverage"], [0.55, 0.8])
    assert M.accept_mask(scores, 0.55).sum() == 55


def test_validation():
    with pytest.raises(ValueError, match="at least one value"):
        M.accepted_counts(0, [0.5])
    with pytest.raises(ValueError, match="at least one value"):
        M.accept_mask([], 0.5)
    with pytest.raises(ValueError, match="seed"):
        M.selection_order([0.1, 0.2], seed=-1)
    with pytest.raises(ValueError, match="seed"):
        M.accept_mask([0.1, 0.2], 0.5, seed=1.5)
    with pytest.raises(ValueError, match="single coverage level"):
        M.accept_mask([0.1, 0.2], [0.5, 0.6])
    with pytest.raises(ValueError, match=r"betas must lie in \(0, 1\]"):
        M.accept_mask([0.1, 0.2], 0.0)
    with pytest.raises(ValueError, match="delta"):
        M.accepted_counts(10, [0.5], delta=2.0)
    assert M.selection_order([]).shape == (0,)


# --------------------------------------------------------------------------- tie-break
def test_tie_break_is_seeded_deterministic_and_nested():
    n = 500
    rng = np.random.default_rng(5)
    scores = rng.integers(0, 4, n).astype(float)  # four tied levels
    order = M.selection_order(scores, seed=3)
    assert order.dtype == np.int64 and sorted(order.tolist()) == list(range(n))
    assert np.all(np.diff(scores[order]) <= 0)  # best first
    np.testing.assert_array_equal(order, M.selection_order(scores.copy(), seed=3))
    orders = [M.selection_order(scores, seed=s) for s in range(4)]
    assert all(not np.array_equal(orders[0], o) for o in orders[1:])
    # the documented rule: pi = default_rng([seed, 0x71E5]).permutation(n), ties by pi
    pi = np.random.default_rng([3, 0x71E5]).permutation(n)
    pos = np.empty(n, np.int64)
    pos[pi] = np.arange(n)
    np.testing.assert_array_equal(order, np.lexsort((pos, -scores)))
    # without ties the order does not depend on the seed
    distinct = rng.permutation(n).astype(float)
    np.testing.assert_array_equal(
        M.selection_order(distinct, seed=0), M.selection_order(distinct, seed=9)
    )
    betas = np.round(np.linspace(0.05, 1.0, 20), 2)
    for seed in range(3):
        masks = [M.accept_mask(scores, b, seed=seed) for b in betas]
        for small, big in zip(masks, masks[1:]):
            assert np.all(big[small])  # nested
        for b, m in zip(betas, masks):
            assert m.sum() == _k(b, n)
            np.testing.assert_array_equal(m, M.accept_mask(scores, b, seed=seed))
            np.testing.assert_array_equal(m, accepted_mask(scores, b, seed=seed))
            top = np.zeros(n, bool)
            top[M.selection_order(scores, seed=seed)[: _k(b, n)]] = True
            np.testing.assert_array_equal(m, top)
    assert not np.array_equal(M.accept_mask(scores, 0.6, seed=0), M.accept_mask(scores, 0.6, seed=1))


def test_selective_metrics_use_the_seeded_mask():
    n = 400
    scores = np.random.default_rng(1).integers(0, 3, n).astype(float)
    conf, correct = _conf_correct(n, seed=2)
    betas = np.array([0.3, 0.5, 0.75])
    by_seed = []
    for seed in (0, 1):
        res = M.selective_metrics(scores, conf, correct, betas, seed=seed)
        for j, beta in enumerate(betas):
            keep = M.accept_mask(scores, beta, seed=seed)
            assert res["ece1"][j] == M.ece(conf[keep], correct[keep])
            assert res["brier"][j] == M.brier(conf[keep], correct[keep])
            assert res["accuracy"][j] == M.accuracy(correct[keep])
            assert res["coverage"][j] == keep.mean()
        by_seed.append(res)
    assert not np.array_equal(by_seed[0]["brier"], by_seed[1]["brier"])
    np.testing.assert_array_equal(by_seed[0]["coverage"], by_seed[1]["coverage"])


# --------------------------------------------------------------------------- Hoeffding
def test_hoeffding_path_accepts_exactly_the_minimal_k():
    n, delta = 100, 0.1
    eps = math.sqrt(math.log(2 / delta) / (2 * n))
    tied = np.repeat([0.0, 1.0, 2.0], [30, 40, 30])
    betas = np.array([0.3, 0.5, 0.6, 0.75])
    k, guaranteed = M.accepted_counts(n, betas, delta=delta)
    for beta, kj, g in zip(betas, k, guaranteed):
        assert kj / n - eps >= beta > (kj - 1) / n - eps  # minimal
        assert g == pytest.approx(kj / n - eps, abs=1e-15)
        assert M.accept_mask(tied, beta, delta=delta).sum() == kj
    assert k.tolist() == [43, 63, 73, 88]
    conf, correct = _conf_correct(n)
    res = M.selective_metrics(tied, conf, correct, betas, delta=delta)
    np.testing.assert_array_equal(res["coverage"], k / n)  # old rule: 0.7, 0.7, 1.0, 1.0
    np.testing.assert_allclose(res["guaranteed_coverage"], k / n - eps, atol=1e-15)
    with pytest.warns(RuntimeWarning, match=r"cannot be guaranteed at beta = \[0.9\]"):
        k, guaranteed = M.accepted_counts(n, [0.9], delta=delta)
    assert k.tolist() == [n] and guaranteed[0] == pytest.approx(1 - eps)
    with pytest.warns(RuntimeWarning, match="cannot be guaranteed"):
        assert M.accept_mask(tied, 0.9, delta=delta).all()


# --------------------------------------------------------------------------- scheme
def _reg(kind, name, params=None):
    return get_registry().get(kind, name).build(params or {})


def _fit_oracle_scheme(outputs, beta, seed, params=None):
    scheme = _reg("scheme", "recalibration", {"fit_on": "accepted"})
    selector = _reg("selector", "oracle-domain", params)
    recalibrator = _reg("recalibrator", "temperature")
    ctx = FitContext(seed=seed, beta=beta)
    scheme.fit(outputs, selector=selector, recalibrator=recalibrator, loss=None,
               coverage=None, context=ctx)
    return scheme, selector, recalibrator


def test_fit_on_accepted_keeps_exactly_ceil_beta_n_rows_with_tied_scores():
    n = 300
    rng = np.random.default_rng(0)
    z = rng.normal(size=(n, 3))
    domain = (rng.random(n) < 0.3).astype(np.int64)  # about 30% rejected: > 1 - 0.8
    labels = np.where(domain == 1, rng.integers(0, 3, n), z.argmax(1))
    out = ModelOutputs(features=z.astype(np.float32), logits=(3 * z).astype(np.float32),
                       labels=labels, domain=domain)
    assert domain.mean() > 0.2
    for beta in (0.5, 0.8):
        kept = {}
        for seed in (0, 1):
            scheme, selector, rec = _fit_oracle_scheme(out, beta, seed)
            assert len(scheme.kept_) == _k(beta, n)  # the old rule kept every row at 0.8
            score = selector.score(out, out.confidence())
            np.testing.assert_array_equal(
                scheme.kept_, np.flatnonzero(M.accept_mask(score, beta, seed=seed))
            )
            ref = _reg("recalibrator", "temperature").fit(out.subset(scheme.kept_), FitContext())
            assert rec.T_ == pytest.approx(ref.T_, rel=1e-9)
            kept[seed] = scheme.kept_
        if beta == 0.5:  # below the accepted fraction: only domain 0, a seeded subset of it
            assert (domain[kept[0]] == 0).all()
        else:  # above it: every domain-0 row plus a seeded subset of the rejected ones
            assert (domain[np.setdiff1d(np.arange(n), kept[0])] == 1).all()
        assert not np.array_equal(kept[0], kept[1])


# --------------------------------------------------------------------------- theory spec
@pytest.fixture(scope="module")
def theory():
    """The spec's oracle row and its data: fitting split, evaluation split, experiment."""
    spec = yaml.safe_load((REPO / "specs" / "theory.yaml").read_text())
    exp = spec["experiments"][0]
    method = next(m for m in exp["methods"] if m.get("selector", {}).get("name") == "oracle-domain")
    assert method["scheme"] == {"name": "recalibration", "params": {"fit_on": "accepted"}}
    dataset = _reg("dataset", exp["dataset"]["name"], exp["dataset"].get("params"))
    backbone = _reg("backbone", exp["backbone"]["name"], exp["backbone"].get("params"))
    ctx = FitContext(seed=0)
    fit_all = backbone.extract(dataset, exp["fit_split"], ctx)
    eval_out = backbone.extract(dataset, exp["eval_split"], ctx)
    return spec, exp, method, fit_all, eval_out


def test_theory_oracle_row_covers_exactly_beta_on_every_seed(theory):
    spec, exp, method, fit_all, eval_out = theory
    beta, n_fit = float(exp["train_beta"]), int(exp["n_fit"])
    assert beta == 0.8 and spec["seeds"] == [0, 1, 2, 3, 4]
    n_eval = len(eval_out)
    over = []
    for seed in spec["seeds"]:
        # the runner's seeded fitting sample (runner.fit_indices)
        rng = np.random.default_rng([seed, 0x5E1EC7])
        idx = np.sort(rng.choice(len(fit_all), size=n_fit, replace=False))
        fit = fit_all.subset(idx)
        outliers = int(np.sum(fit.domain == 1))
        scheme = _reg("scheme", method["scheme"]["name"], method["scheme"].get("params"))
        selector = _reg("selector", method["selector"]["name"], method["selector"].get("params"))
        rec = _reg("recalibrator", method["recalibrator"]["name"],
                   method["recalibrator"].get("params"))
        scheme.fit(fit, selector=selector, recalibrator=rec, loss=None, coverage=None,
                   context=FitContext(seed=seed, beta=beta))
        # h is fitted on exactly ceil(beta n_fit) rows, the oracle's choice
        kept = scheme.kept_
        assert len(kept) == _k(beta, n_fit) == 800
        if outliers <= n_fit - 800:
            assert (fit.domain[kept] == 0).all()
        else:  # more outliers than 1 - beta: every inlier plus a few outliers, not all rows
            over.append(seed)
            assert (fit.domain[kept] == 0).sum() == (fit.domain == 0).sum()
        ref = _reg("recalibrator", "temperature").fit(fit.subset(kept), FitContext(seed=seed))
        assert rec.T_ == pytest.approx(ref.T_, rel=1e-9)
        everything = _reg("recalibrator", "temperature").fit(fit, FitContext(seed=seed))
        assert abs(rec.T_ - everything.T_) > 0.05 * everything.T_
        # evaluation: coverage 0.800 ± 1/n at beta = 0.8, on every seed
        conf = rec.confidence(eval_out)
        score = selector.score(eval_out, conf)
        res = M.selective_metrics(score, conf, eval_out.correct(), exp["betas"], seed=seed)
        j = exp["betas"].index(beta)
        assert abs(res["coverage"][j] - beta) <= 1 / n_eval
        np.testing.assert_array_equal(
            res["coverage"], [_k(b, n_eval) / n_eval for b in exp["betas"]]
        )
        assert res["ece1"][j] < 0.03  # Theorem 1: rejecting the outliers, T on the rest
    assert over == [3]  # the seed-3 sample holds 21.1% outliers (seeds 0 and 2: exactly 20%)
