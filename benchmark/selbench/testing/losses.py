"""Checks of losses (selection and coverage losses): a finite, differentiable scalar,
determinism, untouched inputs, shape errors and replica rows (``[R, B]`` inputs).
"""

from __future__ import annotations

from selbench.contract.api import CoverageLoss, SelectionLoss

from .errors import Broken
from .support import (
    FIT_MANY_TOL,
    Snapshot,
    Subject,
    brief,
    call,
    diff,
    equal,
    expect_error,
    loss_inputs,
    loss_value,
    register_check,
)


def _selection_loss(s: Subject) -> str | None:
    return None if isinstance(s.probe, SelectionLoss) else "it is not a SelectionLoss"


@register_check("loss")
def check_loss_value(s: Subject) -> None:
    """A loss returns a finite scalar (0-d) floating tensor that is differentiable, with finite
    gradients, in ĝ and, for a selection loss, in what trains h: the confidence, or the
    log-probabilities for a loss that ``needs_log_probs``."""
    import torch

    what, value, leaves = loss_value(s.make(), grad=True)
    if not isinstance(value, torch.Tensor):
        raise Broken(f"{what} returned {brief(value)}, expected a torch.Tensor")
    if value.dim() != 0 or not value.is_floating_point():
        raise Broken(f"{what} returned a {value.dtype} tensor of shape {tuple(value.shape)}, "
                     "expected a floating scalar (shape ())")
    if not torch.isfinite(value):
        raise Broken(f"{what} returned {value.item()}, expected a finite value")
    if not value.requires_grad:
        raise Broken(f"{what} is not differentiable (its result does not require grad)")
    call(f"{what}.backward()", value.backward)
    for name, leaf in leaves.items():
        if leaf.grad is None:
            raise Broken(f"{what} is not differentiable in {name} (no gradient reached it)")
        if not torch.isfinite(leaf.grad).all():
            raise Broken(f"the gradient of {what} in {name} is not finite")


@register_check("loss")
def check_loss_is_deterministic(s: Subject) -> None:
    """A loss gives the same value twice on the same inputs and leaves its inputs unchanged."""
    loss = s.make()
    inputs = loss_inputs()
    snap = Snapshot(lambda: {k: v.numpy() for k, v in inputs.items()})
    what, first, _ = loss_value(loss, inputs)
    snap.unchanged(what)
    _, second, _ = loss_value(loss, inputs)
    if not equal(first.detach().numpy(), second.detach().numpy()):
        raise Broken(f"{what} gave {first.item()} then {second.item()} on the same inputs")


@register_check("loss", applies=_selection_loss)
def check_loss_rejects_mismatched_shapes(s: Subject) -> None:
    """A selection loss given a confidence whose shape differs from ĝ's raises a
    ``ValueError`` whose message names ``confidence``."""
    inputs = loss_inputs()
    expect_error("loss(g [24], <confidence [23]>, correct [24])", s.make(), inputs["g"],
                 inputs["confidence"][:-1], inputs["correct"], inputs["label_log_prob"],
                 names=("confidence",))


@register_check("loss")
def check_loss_replica_rows(s: Subject) -> None:
    """Called on ``[R, B]`` tensors (R replicas, as the training engine calls it), a loss
    returns ``[R]`` whose entry r is its value on row r alone (to 1e-5); a coverage loss
    takes one β per replica."""
    import torch

    loss = s.make()
    replicas = [loss_inputs(seed) for seed in range(3)]
    solo = [loss_value(loss, inputs)[1].detach() for inputs in replicas]

    def stack(key: str) -> torch.Tensor:
        return torch.stack([inputs[key] for inputs in replicas])

    if isinstance(loss, CoverageLoss):
        what = "loss(g [R, B], beta [R])"
        together = call(what, loss, stack("g"), torch.full((3,), 0.8))
    else:
        what = "loss(g [R, B], confidence [R, B], correct [R, B], label_log_prob [R, B])"
        together = call(what, loss, stack("g"), stack("confidence"), stack("correct"),
                        stack("label_log_prob"))
    if not isinstance(together, torch.Tensor) or tuple(together.shape) != (3,):
        raise Broken(f"{what} returned {brief(together)}, expected a tensor of shape (3,): "
                     "reduce over the last dimension only (e.g. .mean(-1))")
    expected = torch.stack(solo).double().numpy()
    got = together.detach().double().numpy()
    if not equal(expected, got, FIT_MANY_TOL):
        raise Broken(f"{what} differs from its value on each row alone "
                     f"({diff(expected, got, FIT_MANY_TOL)})")


