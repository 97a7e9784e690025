"""Every registered selector and recalibrator (built-in or third-party) honours the plugin
contract: fit returns self, same seed -> same output, inputs untouched, output shapes and
ranges, clear ValueErrors for bad input. Plugins are built with their default params;
trainable selectors are trained by the ``sequential`` scheme (few epochs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import sampled_linear_task
from selbench import FitContext, ModelOutputs, Recalibrator, Selector
from selbench.plugins import get_registry

REGISTRY = get_registry()
SELECTORS = REGISTRY.names("selector")
RECALIBRATORS = REGISTRY.names("recalibrator")
TRAINING = {"epochs": 3, "batch_size": 50}


def synthetic(n=240, d=16, k=4, seed=0):
    rng = np.random.default_rng(seed)
    x, z, labels = sampled_linear_task(rng, n, d, k)
    domain = (x[:, 0] > 1).astype(np.int64)  # some selectors (oracles) read the domain
    return ModelOutputs(
        features=x.astype(np.float32), logits=(2 * z).astype(np.float32), labels=labels,
        domain=domain,
    )


FIT = synthetic(seed=0)
EVAL = synthetic(n=150, seed=1)
#: recalibrators fit on one default-size batch (100 rows) so the MLP's 1000 default epochs
#: stay quick
REC_FIT = synthetic(n=100, seed=2)


def snapshot(outputs: ModelOutputs):
    return [a.copy() for a in (outputs.features, outputs.logits, outputs.labels, outputs.domain)]


def assert_unchanged(outputs: ModelOutputs, snap) -> None:
    for a, b in zip((outputs.features, outputs.logits, outputs.labels, outputs.domain), snap):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- selectors
def fit_selector(name: str, seed: int = 0):
    """Build selector ``name`` with default params and fit it on FIT."""
    sel = REGISTRY.get("selector", name).build()
    assert isinstance(sel, Selector)
    ctx = FitContext(seed=seed, beta=0.8)
    conf = FIT.confidence()
    if sel.trainable:
        scheme = REGISTRY.get("scheme", "sequential").build(TRAINING)
        returned = scheme.fit(
            FIT,
            selector=sel,
            recalibrator=REGISTRY.get("recalibrator", "none").build(),
            loss=REGISTRY.get("loss", "s-tlbce").build(),
            coverage=REGISTRY.get("loss", "quadratic").build(),
            context=ctx,
        )
        assert returned is scheme
    else:
        assert sel.fit(FIT, conf, ctx) is sel
    return sel


@pytest.mark.parametrize("name", SELECTORS)
def test_selector_contract(name):
    fit_snap, eval_snap = snapshot(FIT), snapshot(EVAL)
    conf = EVAL.confidence()
    conf_copy = conf.copy()
    sel = fit_selector(name)
    score = sel.score(EVAL, conf)
    assert isinstance(score, np.ndarray) and score.dtype == np.float64
    assert score.shape == (len(EVAL),)
    assert np.all(np.isfinite(score))
    # same seed -> same output
    np.testing.assert_array_equal(score, fit_selector(name).score(EVAL, conf))
    # nothing was mutated
    assert_unchanged(FIT, fit_snap)
    assert_unchanged(EVAL, eval_snap)
    np.testing.assert_array_equal(conf, conf_copy)


@pytest.mark.parametrize("name", SELECTORS)
def test_selector_rejects_confidence_of_the_wrong_length(name):
    sel = fit_selector(name)
    with pytest.raises(ValueError, match="confidence"):
        sel.score(EVAL, EVAL.confidence()[:-1])
    if not sel.trainable:
        fresh = REGISTRY.get("selector", name).build()
        with pytest.raises(ValueError, match="confidence"):
            fresh.fit(FIT, np.zeros(len(FIT) + 3), FitContext())


# ---------------------------------------------------------------- recalibrators
@pytest.mark.parametrize("name", RECALIBRATORS)
def test_recalibrator_contract(name):
    fit_snap, eval_snap = snapshot(REC_FIT), snapshot(EVAL)
    rec = REGISTRY.get("recalibrator", name).build()
    assert isinstance(rec, Recalibrator)
    assert rec.fit(REC_FIT, FitContext(seed=0)) is rec
    conf = rec.confidence(EVAL)
    assert isinstance(conf, np.ndarray) and conf.dtype == np.float64
    assert conf.shape == (len(EVAL),)
    assert np.all(np.isfinite(conf)) and np.all((conf >= 0) & (conf <= 1))
    again = REGISTRY.get("recalibrator", name).build().fit(REC_FIT, FitContext(seed=0))
    np.testing.assert_array_equal(conf, again.confidence(EVAL))
    assert_unchanged(REC_FIT, fit_snap)
    assert_unchanged(EVAL, eval_snap)
    if rec.differentiable:
        module = rec.module(REC_FIT, FitContext(seed=0))
        assert module is rec.module(REC_FIT, FitContext(seed=0))  # the live module, not a copy
        c, lp = module(torch.tensor(EVAL.logits), torch.tensor(EVAL.features))
        np.testing.assert_allclose(c.detach().numpy(), conf, atol=1e-6)
        if lp is not None:
            assert lp.shape == (len(EVAL), EVAL.num_classes)
            np.testing.assert_allclose(lp.exp().sum(1).detach().numpy(), 1.0, atol=1e-4)


@pytest.mark.parametrize("name", RECALIBRATORS)
def test_recalibrator_rejects_bad_input(name):
    empty = REC_FIT.subset(np.zeros(0, dtype=np.int64))
    with pytest.raises(ValueError, match="outputs"):
        REGISTRY.get("recalibrator", name).build().fit(empty, FitContext())
