"""Joint training of every differentiable recalibrator with a learned selector reaches a
training objective at least as good as the sequential scheme's (h frozen after its fit).

Both schemes start from the same pretrained h and the same selector initialisation (same
seed) and run the same full-batch Adam steps; joint also moves h, so its objective, the
selective loss plus the coverage term on the whole fitting set, must end no higher. Each
built-in (and any installed) differentiable recalibrator with parameters is checked, with
each selective loss it supports.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from selbench import FitContext
from selbench.contract.api import DifferentiableRecalibrator
from selbench.contract.registry import get_registry
from test_schemes import synthetic

REGISTRY = get_registry()
#: full batch (the whole fitting set is one batch), so the objective below is the one trained
N, EPOCHS, LR, BETA, SEED = 240, 150, 1e-2, 0.7, 0
TRAIN = {"epochs": EPOCHS, "batch_size": N, "lr": LR}
#: training params of recalibrators whose defaults train long
REC_PARAMS = {"mlp": {"hidden": [16], "epochs": 30, "lr": 1e-2}}


def _differentiable_with_parameters() -> list[str]:
    names = []
    for name in REGISTRY.names("recalibrator"):
        factory = REGISTRY.get("recalibrator", name).plugin.factory
        if isinstance(factory, type) and issubclass(factory, DifferentiableRecalibrator):
            rec = REGISTRY.get("recalibrator", name).build(REC_PARAMS.get(name))
            out = synthetic(n=60)
            module = rec.fit(out, FitContext(seed=SEED)).module(out, FitContext(seed=SEED))
            if any(p.requires_grad for p in module.parameters()):
                names.append(name)
    return names


RECALIBRATORS = _differentiable_with_parameters()


def _objective(out, selector, recalibrator, loss, coverage) -> float:
    """The training objective on the whole fitting set: loss(ĝ, h) + coverage(ĝ, β)."""
    conf = recalibrator.confidence(out)
    g = selector.score(out, conf)
    correct = (recalibrator.predict(out) == out.labels).astype(np.float32)
    label_lp = None
    if loss.needs_log_probs:
        module = recalibrator.module(out, FitContext(seed=SEED))
        with torch.no_grad():
            lp = module(torch.tensor(out.logits), torch.tensor(out.features))[1]
        label_lp = lp.gather(1, torch.tensor(out.labels).view(-1, 1)).view(-1).double()
    t = lambda a: torch.tensor(np.asarray(a, dtype=np.float64))
    with torch.no_grad():
        value = loss(t(g), t(conf), t(correct), label_lp) + coverage(t(g), BETA)
    return float(value)


def _train(scheme: str, rec_name: str, loss_name: str, out):
    selector = REGISTRY.get("selector", "mlp").build({"hidden": [16]})
    recalibrator = REGISTRY.get("recalibrator", rec_name).build(REC_PARAMS.get(rec_name))
    loss = REGISTRY.get("loss", loss_name).build(None)
    coverage = REGISTRY.get("loss", "quadratic").build({"lam": 8.0})
    REGISTRY.get("scheme", scheme).build(TRAIN).fit(
        out, selector=selector, recalibrator=recalibrator, loss=loss, coverage=coverage,
        context=FitContext(seed=SEED, beta=BETA))
    return _objective(out, selector, recalibrator, loss, coverage)


def _losses(rec_name: str) -> list[str]:
    out = synthetic(n=60)
    rec = REGISTRY.get("recalibrator", rec_name).build(REC_PARAMS.get(rec_name))
    module = rec.fit(out, FitContext(seed=SEED)).module(out, FitContext(seed=SEED))
    with torch.no_grad():
        has_lp = module(torch.tensor(out.logits[:2]), torch.tensor(out.features[:2]))[1] is not None
    return ["s-tlbce", "s-mmce"] + (["s-mce"] if has_lp else [])


def test_every_differentiable_builtin_is_checked():
    for name in ("temperature", "platt", "mlp"):
        assert name in RECALIBRATORS
    for name in ("beta", "vector-scaling", "matrix-scaling", "dirichlet"):
        if name in REGISTRY.names("recalibrator"):
            assert name in RECALIBRATORS


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("rec_name", RECALIBRATORS)
def test_joint_objective_is_at_most_the_sequential_one(rec_name):
    out = synthetic(n=N, k=4, seed=3)
    for loss_name in _losses(rec_name):
        sequential = _train("sequential", rec_name, loss_name, out)
        joint = _train("joint", rec_name, loss_name, out)
        assert np.isfinite(sequential) and np.isfinite(joint)
        assert joint <= sequential + 1e-6 * abs(sequential), (loss_name, joint, sequential)
