"""Selection and coverage losses: hand-computed values and finite-difference gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from selbench.contract.registry import get_registry


def build(name, params=None):
    return get_registry().get("loss", name).build(params)


def t64(values, grad=False):
    return torch.tensor(values, dtype=torch.float64, requires_grad=grad)


G = [1.0, 0.5, 0.25]
CONF = [0.8, 0.6, 0.3]
CORRECT = [1.0, 0.0, 1.0]


# ---------------------------------------------------------------- hand-computed values
def test_s_tlbce_value():
    loss = build("s-tlbce")(t64(G), t64(CONF), t64(CORRECT))
    expected = -(1.0 * math.log(0.8) + 0.5 * math.log(0.4) + 0.25 * math.log(0.3)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    normalized = build("s-tlbce", {"normalize": True})(t64(G), t64(CONF), t64(CORRECT))
    assert normalized.item() == pytest.approx(expected / (1.75 / 3), rel=1e-12)


def test_s_mce_value_uses_the_true_label():
    log_probs = torch.log(t64([[0.8, 0.1, 0.1], [0.6, 0.3, 0.1], [0.2, 0.5, 0.3]]))
    labels = torch.tensor([0, 2, 1])
    label_lp = log_probs.gather(1, labels[:, None]).squeeze(1)
    loss = build("s-mce")(t64(G), t64(CONF), t64(CORRECT), label_lp)
    expected = -(1.0 * math.log(0.8) + 0.5 * math.log(0.1) + 0.25 * math.log(0.5)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_s_mce_equals_s_tlbce_for_two_classes():
    # binary: the true class is the predicted one when correct, the other one otherwise
    p1 = t64([0.9, 0.3, 0.7, 0.2])
    log_probs = torch.stack([torch.log(1 - p1), torch.log(p1)], dim=1)
    pred = (p1 > 0.5).long()
    labels = torch.tensor([1, 1, 0, 0])
    conf = torch.where(pred == 1, p1, 1 - p1)
    correct = (pred == labels).double()
    g = t64([0.9, 0.2, 0.6, 0.4])
    a = build("s-mce")(g, conf, correct, log_probs.gather(1, labels[:, None]).squeeze(1))
    b = build("s-tlbce")(g, conf, correct)
    assert a.item() == pytest.approx(b.item(), rel=1e-12)


@pytest.mark.parametrize("q", [1, 2])
def test_s_mmce_value(q):
    g, c, y = [1.0, 0.5], [0.8, 0.6], [1.0, 0.0]
    e = [abs(y[i] - c[i]) ** q * g[i] for i in range(2)]
    k01 = math.exp(-abs(0.8 - 0.6) / 0.2)
    inner = (e[0] ** 2 + e[1] ** 2 + 2 * e[0] * e[1] * k01) / 4
    loss = build("s-mmce", {"q": q})(t64(g), t64(c), t64(y))
    assert loss.item() == pytest.approx(inner ** (1 / q), rel=1e-12)
    wide = build("s-mmce", {"q": q, "width": 0.4})(t64(g), t64(c), t64(y))
    k_wide = math.exp(-0.2 / 0.4)
    inner_wide = (e[0] ** 2 + e[1] ** 2 + 2 * e[0] * e[1] * k_wide) / 4
    assert wide.item() == pytest.approx(inner_wide ** (1 / q), rel=1e-12)


def test_s_mmce_is_zero_for_perfect_confidence():
    loss = build("s-mmce")(t64([1.0, 1.0]), t64([1.0, 0.0]), t64([1.0, 0.0]))
    assert loss.item() == pytest.approx(1e-6, abs=1e-9)  # sqrt of the 1e-12 floor


def test_coverage_values():
    g = t64([0.9, 0.5, 0.1, 0.7])  # mean 0.55
    assert build("quadratic")(g, 0.8).item() == pytest.approx(32 * 0.25**2)
    assert build("quadratic", {"lam": 8})(g, 0.55).item() == pytest.approx(0.0, abs=1e-12)
    expected = 0.01 * -(math.log(0.9) + math.log(0.5) + math.log(0.1) + math.log(0.7)) / 4
    assert build("log-coverage")(g, 0.8).item() == pytest.approx(expected)
    assert build("log-coverage", {"lam": 2.0})(g, 0.3).item() == pytest.approx(expected * 200)


def test_logs_are_clamped():
    g, y = t64([1.0, 1.0], grad=True), t64([1.0, 0.0])
    conf = t64([0.0, 1.0], grad=True)  # confidently wrong both ways
    loss = build("s-tlbce")(g, conf, y)
    assert loss.item() == pytest.approx(100.0)
    loss.backward()
    assert torch.isfinite(conf.grad).all() and torch.isfinite(g.grad).all()
    g0 = t64([0.0, 1e-12], grad=True)
    cov = build("log-coverage")(g0, 0.5)
    cov.backward()
    assert math.isfinite(cov.item()) and torch.isfinite(g0.grad).all()


# ---------------------------------------------------------------- gradients
@pytest.mark.parametrize("normalize", [False, True])
def test_gradcheck_s_tlbce(normalize):
    loss = build("s-tlbce", {"normalize": normalize})
    y = t64([1.0, 0.0, 1.0, 0.0, 1.0])
    assert torch.autograd.gradcheck(
        lambda g, c: loss(g, c, y),
        (t64([0.9, 0.2, 0.5, 0.7, 0.4], True), t64([0.8, 0.6, 0.3, 0.55, 0.95], True)),
    )


@pytest.mark.parametrize("normalize", [False, True])
def test_gradcheck_s_mce(normalize):
    loss = build("s-mce", {"normalize": normalize})
    y = t64([1.0, 0.0, 1.0])
    labels = torch.tensor([0, 2, 1])
    log_probs = torch.log_softmax(t64([[2.0, 0.5, 0.1], [1.0, 0.2, 0.4], [0.3, 1.5, 0.0]]), 1)
    assert torch.autograd.gradcheck(
        lambda g, c, lp: loss(g, c, y, lp.gather(1, labels[:, None]).squeeze(1)),
        (t64([0.9, 0.2, 0.5], True), t64([0.8, 0.6, 0.3], True), log_probs.requires_grad_()),
    )


@pytest.mark.parametrize("q", [1, 2])
@pytest.mark.parametrize("normalize", [False, True])
def test_gradcheck_s_mmce(q, normalize):
    loss = build("s-mmce", {"q": q, "normalize": normalize})
    y = t64([1.0, 0.0, 1.0, 0.0])
    assert torch.autograd.gradcheck(
        lambda g, c: loss(g, c, y),
        (t64([0.9, 0.2, 0.5, 0.7], True), t64([0.8, 0.6, 0.3, 0.45], True)),
    )


@pytest.mark.parametrize("name", ["quadratic", "log-coverage"])
def test_gradcheck_coverage(name):
    cov = build(name)
    assert torch.autograd.gradcheck(lambda g: cov(g, 0.7), (t64([0.9, 0.2, 0.5], True),))


# ---------------------------------------------------------------- errors and params
def test_s_mce_without_log_probs_is_a_clear_error():
    loss = build("s-mce")
    assert loss.needs_log_probs and not build("s-tlbce").needs_log_probs
    with pytest.raises(ValueError, match="label_log_prob"):
        loss(t64(G), t64(CONF), t64(CORRECT))


def test_shape_mismatch_is_a_clear_error():
    for name in ["s-tlbce", "s-mmce"]:
        with pytest.raises(ValueError, match="confidence"):
            build(name)(t64(G), t64([0.5, 0.5]), t64(CORRECT))


def test_params_are_validated():
    reg = get_registry().get("loss", "s-mmce")
    with pytest.raises(ValidationError):
        reg.build({"q": 3})
    with pytest.raises(ValidationError):
        reg.build({"width": 0.0})
    with pytest.raises(ValidationError):
        get_registry().get("loss", "quadratic").build({"lambda": 1.0})


# ---------------------------------------------------------------- replica rows
@pytest.mark.parametrize("name,params", [
    ("s-tlbce", {}), ("s-tlbce", {"normalize": True}), ("s-mce", {}),
    ("s-mmce", {"q": 1}), ("s-mmce", {"q": 2, "normalize": True}),
])
def test_selection_losses_of_r_replicas_equal_each_row_alone(name, params):
    """Written once: on [R, B] tensors (how the training engine calls them) a loss returns
    [R], row r equal to the loss of row r alone, and its gradient is each row's own."""
    gen = torch.Generator().manual_seed(4)
    g = (torch.rand(3, 9, generator=gen, dtype=torch.float64) * 0.9 + 0.05).requires_grad_()
    c = (torch.rand(3, 9, generator=gen, dtype=torch.float64) * 0.6 + 0.3).requires_grad_()
    y = (torch.rand(3, 9, generator=gen, dtype=torch.float64) < 0.6).double()
    lp = torch.log(c.detach() * 0.9)
    loss = build(name, params)
    together = loss(g, c, y, lp)
    assert together.shape == (3,)
    together.sum().backward()
    for r in range(3):
        gr, cr = g.detach()[r].clone().requires_grad_(), c.detach()[r].clone().requires_grad_()
        alone = loss(gr, cr, y[r], lp[r])
        alone.backward()
        assert alone.item() == pytest.approx(together[r].item(), rel=1e-12)
        np.testing.assert_allclose(gr.grad.numpy(), g.grad[r].numpy(), rtol=1e-12)
        if cr.grad is None:  # s-mce does not read the confidence
            assert c.grad is None or not c.grad[r].any()
        else:
            np.testing.assert_allclose(cr.grad.numpy(), c.grad[r].numpy(), rtol=1e-12,
                                       atol=1e-15)


@pytest.mark.parametrize("name", ["quadratic", "log-coverage"])
def test_coverage_losses_take_one_beta_and_lambda_per_row(name):
    g = torch.tensor([[0.9, 0.2, 0.5], [0.3, 0.3, 0.8]], dtype=torch.float64)
    beta = torch.tensor([0.7, 0.5], dtype=torch.float64)
    cov = build(name, {"lam": 3.0})
    together = cov(g, beta)
    assert together.shape == (2,)
    for r in range(2):
        assert cov(g[r], float(beta[r])).item() == pytest.approx(together[r].item(), rel=1e-12)
