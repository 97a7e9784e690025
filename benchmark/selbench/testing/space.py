"""The check of a plugin across the search space it declares (issue 36): a plugin that
declares ``Annotated[..., Tune...]`` spaces on its parameters (:class:`selbench.contract.
search.Tune`) promises that tuning may pick any point of them, so the kit fits and uses it
there too, not only at its defaults: at both ends of each parameter's space (the others as
given), and at :data:`SPACE_DRAWS` seeded draws of all of them together (a parameter the
caller gives in ``params`` is held at that value: that is how a test keeps a long training
short), with the core
checks of its kind (a selector's or recalibrator's outputs are arrays of the right dtype,
shape and range, finite, on K=3 and binary outputs; a loss is a finite scalar with finite
gradients; a scheme fits its companions to finite outputs). A failure names the parameter
values.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from selbench.contract.search import Tune, declared_space

from .errors import Broken, CheckSkipped
from .support import (
    N_EVAL,
    Subject,
    brief,
    call,
    companion_outputs,
    companions,
    eval_data,
    expect_array,
    fit_context,
    fit_data,
    fit_plugin,
    fmt_exc,
    loss_value,
    register_check,
)

#: seeded draws of the whole space, besides the ends of each parameter
SPACE_DRAWS = 3
#: the seed of those draws
SPACE_SEED = 0


def _space(s: Subject) -> dict[str, Tune]:
    """The declared space of the parameters the caller left free (a parameter given in
    ``params`` is held at its given value: e.g. a short training chosen for speed)."""
    if s.model is None or s.at is None:
        return {}
    return {k: v for k, v in declared_space(s.model).items() if k not in s.params}


def _declares_space(s: Subject) -> str | None:
    if _space(s):
        return None
    if s.model is not None and declared_space(s.model):
        return "every parameter with a declared search space is given in params"
    return "the plugin declares no search space (no Tune on its params)"


def _ends(tune: Tune) -> list[Any]:
    """A parameter's extreme values: the bounds, the smallest and largest of numeric
    choices, or every choice that is not a number (lists, strings)."""
    values = tune.corners()
    if tune.dist == "choice" and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                     for v in values):
        return [min(values), max(values)]
    return values


def _draw(tune: Tune, rng: np.random.Generator) -> Any:
    """One value of ``tune``, as a sampler could pick it."""
    if tune.dist == "choice":
        return tune.choices[int(rng.integers(len(tune.choices)))]
    if tune.dist == "int":
        return int(rng.integers(int(tune.low), int(tune.high) + 1))
    if tune.dist == "log_uniform":
        return float(math.exp(rng.uniform(math.log(tune.low), math.log(tune.high))))
    return float(rng.uniform(tune.low, tune.high))


def space_points(s: Subject) -> list[tuple[dict[str, Any], str]]:
    """The points the check visits, each with how it was chosen: every end of every
    parameter's space (the others as given), then :data:`SPACE_DRAWS` seeded draws of all
    the parameters of the space; a point met twice is visited once."""
    space = _space(s)
    points: list[tuple[dict[str, Any], str]] = []
    for name, tune in space.items():
        for value in _ends(tune):
            points.append(({name: value}, f"an end of {name}'s space {tune.describe()}"))
    rng = np.random.default_rng(SPACE_SEED)
    for i in range(SPACE_DRAWS):
        draw = {name: _draw(tune, rng) for name, tune in space.items()}
        points.append((draw, f"draw {i + 1} of {SPACE_DRAWS} from the space "
                             f"(seed {SPACE_SEED})"))
    seen, unique = set(), []
    for point, why in points:
        key = json.dumps(point, sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append((point, why))
    return unique


def _fitted_outputs(s: Subject, make) -> None:
    """A selector's or recalibrator's core contract at one point: fit, then its outputs."""
    ks = (3, 2) if s.kind == "recalibrator" else (3,)
    for k in ks:
        where = "" if k == 3 else " on binary outputs (K=2)"
        obj, ev = fit_plugin(s, call("building the plugin", make), fit_data(k)), eval_data(k)
        if s.kind == "recalibrator":
            conf = call(f"confidence(outputs){where}", obj.confidence, ev)
            expect_array(f"confidence(outputs){where}", conf, len(ev), np.float64, low=0.0,
                         high=1.0)
            pred = call(f"predict(outputs){where}", obj.predict, ev)
            expect_array(f"predict(outputs){where}", pred, len(ev), np.int64, classes=k)
        else:
            score = call("score(outputs, confidence)", obj.score, ev, ev.confidence())
            expect_array("score(outputs, confidence)", score, len(ev), np.float64)


def _loss(make) -> None:
    """A loss's core contract at one point: a finite scalar with finite gradients."""
    import torch

    what, value, leaves = loss_value(call("building the plugin", make), grad=True)
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        raise Broken(f"{what} returned {brief(value)}, expected a scalar torch.Tensor")
    if not torch.isfinite(value):
        raise Broken(f"{what} returned {value.item()}, expected a finite value")
    if value.requires_grad:
        call(f"{what}.backward()", value.backward)
        for name, leaf in leaves.items():
            if leaf.grad is not None and not torch.isfinite(leaf.grad).all():
                raise Broken(f"the gradient of {what} in {name} is not finite")


def _scheme(make) -> None:
    """A scheme's core contract at one point: it fits its built-in companions, whose
    outputs are then valid."""
    scheme = call("building the plugin", make)
    comp = companions(type(scheme))
    call("fit(outputs, selector=..., recalibrator=..., loss=..., coverage=..., context=...)",
         scheme.fit, fit_data(), **comp, context=fit_context())
    out = companion_outputs(comp, eval_data())
    expect_array("the fitted recalibrator's confidence(outputs)",
                 out["recalibrator confidence"], N_EVAL, np.float64, low=0.0, high=1.0)
    expect_array("the fitted selector's score(outputs, confidence)", out["selector score"],
                 N_EVAL, np.float64)


@register_check("selector", "recalibrator", "loss", "scheme", applies=_declares_space)
def check_search_space(s: Subject) -> None:
    """Across the search space its parameters declare (``Tune``), the plugin keeps its core
    contract: at both ends of each parameter's space and at a few seeded draws of the whole
    space (the parameters given in ``params`` held at their values), it fits and its outputs are valid (a selector's or recalibrator's arrays of the
    right dtype, shape and range, finite; a loss's finite scalar and gradients; a scheme's
    fitted companions), since tuning may choose any of these points."""
    points = space_points(s)
    if not points:  # pragma: no cover - applies only with a space
        raise CheckSkipped("no search space")
    for point, why in points:
        shown = ", ".join(f"{k}={v!r}" for k, v in point.items())
        try:
            make = s.at(point)
            if s.kind in ("selector", "recalibrator"):
                _fitted_outputs(s, make)
            elif s.kind == "loss":
                _loss(make)
            else:
                _scheme(make)
        except Broken as exc:
            raise Broken(f"with {shown} ({why}): {exc}") from exc.__cause__
        except Exception as exc:  # the model refused a value of the plugin's own space
            raise Broken(f"with {shown} ({why}): the parameters were refused: "
                         f"{fmt_exc(exc)}") from exc
