"""Checks every fitted kind shares: the base class of every kind; a selector's and a
recalibrator's contract (``fit`` returns ``self``, determinism, untouched inputs, the dtype,
shape and range of every return, per-example outputs, unfitted use, bad inputs); and the
``sklearn.base.clone`` and pickle round trips of selectors, recalibrators, losses and schemes.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from selbench.contract.api import KIND_BASES, KINDS
from selbench.contract.data import ModelOutputs

from .errors import Broken, CheckSkipped
from .support import (
    FLOAT_TOL,
    D,
    K,
    Snapshot,
    Subject,
    brief,
    call,
    context_fields,
    diff,
    equal,
    eval_data,
    expect_array,
    expect_error,
    expect_same_observations,
    fit_context,
    fit_data,
    fit_plugin,
    fmt_exc,
    is_trainable,
    learned_attributes,
    loss_value,
    observe,
    outputs_arrays,
    register_check,
    same,
    scheme_observe,
    train_with_selection_scheme,
)


def _not_trainable(s: Subject) -> str | None:
    if s.kind == "selector" and is_trainable(s.probe):
        return "a trainable selector is trained by a scheme, not by its own fit()"
    return None


@register_check(*KINDS)
def check_base_class(s: Subject) -> None:
    """The factory builds an instance of the kind's base class (``selbench.Selector``,
    ``selbench.Recalibrator``, ``selbench.SelectionLoss`` or ``selbench.CoverageLoss``, ...)."""
    try:
        obj = s.factory()
    except FileNotFoundError as exc:
        if s.kind in ("dataset", "backbone"):
            raise CheckSkipped(f"data not available: {fmt_exc(exc)}") from exc
        raise Broken(f"building the plugin raised {fmt_exc(exc)}") from exc
    except Exception as exc:
        raise Broken(f"building the plugin raised {fmt_exc(exc)}") from exc
    bases = KIND_BASES[s.kind]
    if not isinstance(obj, bases):
        names = " or ".join(f"selbench.{b.__name__}" for b in bases)
        raise Broken(f"the factory built a {type(obj).__name__}, expected an instance of "
                     f"{names}")


@register_check("selector", "recalibrator", applies=_not_trainable)
def check_fit_returns_self(s: Subject) -> None:
    """``fit`` returns the plugin itself (``return self``), as scikit-learn estimators do."""
    obj, data = s.make(), fit_data()
    if s.kind == "recalibrator":
        what = "fit(outputs, context)"
        got = call(what, obj.fit, data, fit_context())
    else:
        what = "fit(outputs, confidence, context)"
        got = call(what, obj.fit, data, data.confidence(), fit_context())
    if got is not obj:
        other = f"another {type(got).__name__} object" if type(got) is type(obj) else brief(got)
        raise Broken(f"{what} returned {other}, expected the {s.kind} itself (end fit with "
                     "`return self`)")


@register_check("selector", "recalibrator")
def check_fit_is_deterministic(s: Subject) -> None:
    """Two fits on the same outputs with the same ``FitContext(seed=...)`` give identical
    outputs: all randomness is seeded from ``context.seed`` (``context.generator()``)."""
    fit, ev = fit_data(), eval_data()
    first = observe(s, fit_plugin(s, s.make(), fit), ev)
    second = observe(s, fit_plugin(s, s.make(), fit), ev)
    for key, value in first.items():
        if not equal(value, second[key]):
            raise Broken(f"two fits with FitContext(seed=0) on the same outputs gave different "
                         f"{key} ({diff(value, second[key])}); seed all randomness from "
                         "context.seed")


@register_check("selector", "recalibrator")
def check_does_not_mutate_inputs(s: Subject) -> None:
    """``fit``, ``confidence``/``predict`` and ``score`` leave their inputs unchanged: every
    array of the ``ModelOutputs``, the confidence array and the ``FitContext``."""
    fit, ev, context = fit_data(), eval_data(), fit_context()
    obj = s.make()
    if s.kind == "recalibrator":
        snap = Snapshot(lambda: {**outputs_arrays(fit), **context_fields(context)})
        call("fit(outputs, context)", obj.fit, fit, context)
        snap.unchanged("fit(outputs, context)")
        for method in ("confidence", "predict"):
            snap = Snapshot(lambda: outputs_arrays(ev))
            call(f"{method}(outputs)", getattr(obj, method), ev)
            snap.unchanged(f"{method}(outputs)")
        return
    conf = fit.confidence()
    snap = Snapshot(lambda: {**outputs_arrays(fit), "confidence": conf,
                             **context_fields(context)})
    if is_trainable(obj):
        train_with_selection_scheme(obj, fit, context)
        snap.unchanged("training it (scheme 'selection')")
    else:
        call("fit(outputs, confidence, context)", obj.fit, fit, conf, context)
        snap.unchanged("fit(outputs, confidence, context)")
    conf = ev.confidence()
    snap = Snapshot(lambda: {**outputs_arrays(ev), "confidence": conf})
    call("score(outputs, confidence)", obj.score, ev, conf)
    snap.unchanged("score(outputs, confidence)")


@register_check("recalibrator")
def check_confidence_output(s: Subject) -> None:
    """``confidence(outputs)`` is a float64 numpy array of shape ``[N]``, finite, within
    [0, 1] (on K=3 and on binary K=2 outputs)."""
    for k in (K, 2):
        where = "" if k == K else " on binary outputs (K=2)"
        rec, ev = fit_plugin(s, s.make(), fit_data(k)), eval_data(k)
        conf = call(f"confidence(outputs){where}", rec.confidence, ev)
        expect_array(f"confidence(outputs){where}", conf, len(ev), np.float64, low=0.0,
                     high=1.0)


@register_check("recalibrator")
def check_predict_output(s: Subject) -> None:
    """``predict(outputs)`` is an int64 numpy array of shape ``[N]`` of classes in [0, K)
    (on K=3 and on binary K=2 outputs)."""
    for k in (K, 2):
        where = "" if k == K else " on binary outputs (K=2)"
        rec, ev = fit_plugin(s, s.make(), fit_data(k)), eval_data(k)
        pred = call(f"predict(outputs){where}", rec.predict, ev)
        expect_array(f"predict(outputs){where}", pred, len(ev), np.int64, classes=k)


@register_check("selector")
def check_score_output(s: Subject) -> None:
    """``score(outputs, confidence)`` is a float64 numpy array of shape ``[N]``, finite."""
    sel, ev = fit_plugin(s, s.make(), fit_data()), eval_data()
    score = call("score(outputs, confidence)", sel.score, ev, ev.confidence())
    expect_array("score(outputs, confidence)", score, len(ev), np.float64)


@register_check("selector", "recalibrator")
def check_outputs_are_per_example(s: Subject) -> None:
    """Each example's output depends on that example only: given half of the rows in a
    shuffled order, a fitted plugin returns, for each of them, its value on all the rows (to
    1e-6; no statistics of the batch, no dependence on the order)."""
    obj, ev = fit_plugin(s, s.make(), fit_data()), eval_data()
    rows = np.random.default_rng(0).permutation(len(ev))[: len(ev) // 2]
    base, part = observe(s, obj, ev), observe(s, obj, ev.subset(rows))
    for key, value in base.items():
        value, other = np.asarray(value), np.asarray(part[key])
        if value.shape != (len(ev),):
            raise Broken(f"{key} returned shape {value.shape} for {len(ev)} examples")
        tol = 0.0 if key.startswith("predict") else FLOAT_TOL
        if not equal(value[rows], other, tol):
            raise Broken(f"{key} on a shuffled half of the rows is not those rows' values on "
                         f"all of them ({diff(value[rows], other, tol)}, all rows vs the "
                         "half); an example's output must depend on that example only")


@register_check("selector", "recalibrator")
def check_unfitted(s: Subject) -> None:
    """Before ``fit``, ``confidence`` / ``score`` either raise a ``ValueError`` saying the
    plugin is not fitted (scikit-learn's ``NotFittedError`` is one) or, for a plugin that works
    unfitted, return a valid result; a recalibrator's ``usable_unfitted`` says which (True:
    works unfitted, False: raises, None: either). Any other exception is an error."""
    obj, ev = s.make(), eval_data()
    if s.kind == "recalibrator":
        declared = getattr(type(obj), "usable_unfitted", None)
        calls = [("confidence(outputs)", obj.confidence, (ev,), declared),
                 ("predict(outputs)", obj.predict, (ev,), None)]
    else:
        calls = [("score(outputs, confidence)", obj.score, (ev, ev.confidence()), None)]
    for what, fn, args, declared in calls:
        try:
            result = fn(*args)
        except ValueError as exc:
            if declared is True:
                raise Broken(f"declares usable_unfitted = True, but {what} before fit raised "
                             f"{fmt_exc(exc)}") from exc
            continue
        except Exception as exc:
            raise Broken(
                f"{what} before fit raised {fmt_exc(exc)}; expected sklearn.exceptions."
                "NotFittedError (or another ValueError) saying it is not fitted"
                + ("" if declared is False else ", or a valid result")) from exc
        if declared is False:
            raise Broken(f"declares usable_unfitted = False, but {what} before fit returned "
                         f"{brief(result)} instead of raising sklearn.exceptions."
                         "NotFittedError")
        if what.startswith("predict"):
            expect_array(f"{what} before fit", result, len(ev), np.int64, classes=K)
        elif what.startswith("confidence"):
            expect_array(f"{what} before fit", result, len(ev), np.float64, low=0.0, high=1.0)
        else:
            expect_array(f"{what} before fit", result, len(ev), np.float64)


@register_check("selector", "recalibrator")
def check_rejects_non_model_outputs(s: Subject) -> None:
    """``fit`` and ``confidence`` / ``score`` given something other than
    ``selbench.ModelOutputs`` (here the logits array) raise a ``TypeError`` or ``ValueError``
    whose message names ``outputs``."""
    fit, ev = fit_data(), eval_data()
    errors = (TypeError, ValueError)
    if s.kind == "recalibrator":
        expect_error("fit(<ndarray>, context)", s.make().fit, fit.logits, fit_context(),
                     types=errors, names=("outputs",))
        rec = fit_plugin(s, s.make(), fit)
        expect_error("confidence(<ndarray>)", rec.confidence, ev.logits, types=errors,
                     names=("outputs",))
        return
    if not is_trainable(s.probe):
        expect_error("fit(<ndarray>, confidence, context)", s.make().fit, fit.logits,
                     fit.confidence(), fit_context(), types=errors, names=("outputs",))
    sel = fit_plugin(s, s.make(), fit)
    expect_error("score(<ndarray>, confidence)", sel.score, ev.logits, ev.confidence(),
                 types=errors, names=("outputs",))


@register_check("recalibrator")
def check_predict_rejects_non_model_outputs(s: Subject) -> None:
    """``predict`` given something other than ``selbench.ModelOutputs`` (here the logits
    array) raises a ``TypeError`` or ``ValueError`` whose message names ``outputs``."""
    rec = fit_plugin(s, s.make(), fit_data())
    expect_error("predict(<ndarray>)", rec.predict, eval_data().logits,
                 types=(TypeError, ValueError), names=("outputs",))


@register_check("selector", "recalibrator")
def check_rejects_empty_outputs(s: Subject) -> None:
    """Fitting on outputs with no rows raises a ``ValueError`` whose message names
    ``outputs`` (a trainable selector: ``init_module``)."""
    empty = fit_data().subset(np.zeros(0, dtype=np.int64))
    obj = s.make()
    if s.kind == "recalibrator":
        expect_error("fit(<outputs with 0 rows>, context)", obj.fit, empty, fit_context(),
                     names=("outputs",))
    elif is_trainable(obj):
        expect_error("init_module(<outputs with 0 rows>, context)", obj.init_module, empty,
                     fit_context(), names=("outputs",))
    else:
        expect_error("fit(<outputs with 0 rows>, confidence, context)", obj.fit, empty,
                     np.zeros(0), fit_context(), names=("outputs",))


@register_check("selector")
def check_rejects_confidence_of_wrong_length(s: Subject) -> None:
    """``score`` and ``fit`` given a confidence array whose length is not the number of rows
    of ``outputs`` raise a ``ValueError`` whose message names ``confidence``."""
    fit, ev = fit_data(), eval_data()
    if not is_trainable(s.probe):
        expect_error(f"fit(outputs, <confidence of length {len(fit) + 3}>, context)",
                     s.make().fit, fit, np.full(len(fit) + 3, 0.5), fit_context(),
                     names=("confidence",))
    sel = fit_plugin(s, s.make(), fit)
    expect_error(f"score(outputs, <confidence of length {len(ev) - 1}>) for {len(ev)} rows",
                 sel.score, ev, ev.confidence()[:-1], names=("confidence",))


@register_check("selector", "recalibrator")
def check_rejects_other_feature_width(s: Subject) -> None:
    """After fitting on features of width d, outputs with features of width d-1 either raise
    a ``ValueError`` whose message names ``features`` or give exactly the outputs of the
    original features (the plugin does not read them)."""
    obj, ev = fit_plugin(s, s.make(), fit_data()), eval_data()
    narrow = ModelOutputs(features=ev.features[:, :-1], logits=ev.logits, labels=ev.labels,
                          domain=ev.domain)
    expected = observe(s, obj, ev)
    conf = ev.confidence()
    calls = ([("confidence", obj.confidence, (narrow,)), ("predict", obj.predict, (narrow,))]
             if s.kind == "recalibrator" else [("score", obj.score, (narrow, conf))])
    for (what, fn, args), value in zip(calls, expected.values()):
        call = f"{what}(<outputs with d={D - 1} features>) after fitting on d={D}"
        try:
            got = fn(*args)
        except ValueError as exc:
            if "features" not in str(exc):
                raise Broken(f"{call} raised ValueError({str(exc)!r}), whose message does not "
                             "name 'features'") from exc
            continue
        except Exception as exc:
            raise Broken(f"{call} raised {fmt_exc(exc)}; expected a ValueError whose message "
                         "names 'features'") from exc
        if not equal(value, got):
            raise Broken(f"{call} neither raised a ValueError naming 'features' nor ignored "
                         f"the features ({diff(value, got)} against the original outputs)")


def _fitted_and_observed(s: Subject) -> tuple[Any, dict[str, Any]]:
    """A fitted (or, for losses and schemes, used) plugin and what it gives."""
    obj = s.make()
    if s.kind == "loss":
        return obj, {"loss value": loss_value(obj)[1].detach().numpy()}
    if s.kind == "scheme":
        return obj, scheme_observe(s, obj)
    return fit_plugin(s, obj, fit_data()), observe(s, obj, eval_data())


def _observe_again(s: Subject, obj: Any) -> dict[str, Any]:
    """What a copy of a fitted plugin gives (a loss: its value; a scheme: a new fit)."""
    if s.kind == "loss":
        return {"loss value": loss_value(obj)[1].detach().numpy()}
    if s.kind == "scheme":
        return scheme_observe(s, obj)
    return observe(s, obj, eval_data())


def _refit(s: Subject, obj: Any) -> dict[str, Any]:
    if s.kind in ("loss", "scheme"):
        return _observe_again(s, obj)
    return observe(s, fit_plugin(s, obj, fit_data()), eval_data())


@register_check("selector", "recalibrator", "loss", "scheme")
def check_clone(s: Subject) -> None:
    """``sklearn.base.clone`` of a fitted plugin returns a new, unfitted plugin of the same
    class with equal ``get_params()`` (the parameters it was built with), and fitting the
    clone reproduces the original fit exactly. Hyperparameters are ``__init__`` keyword
    arguments stored unchanged under their own names (the kind's selbench base class provides
    ``get_params`` / ``set_params``)."""
    from sklearn.base import clone

    fitted, expected = _fitted_and_observed(s)
    what = f"sklearn.base.clone(<fitted {s.kind}>)"
    try:
        twin = clone(fitted)
    except Exception as exc:
        if not callable(getattr(fitted, "get_params", None)):
            bases = " or ".join(f"selbench.{b.__name__}" for b in KIND_BASES[s.kind])
            hint = ("; make the plugin a scikit-learn estimator: derive from its kind's "
                    f"selbench base class ({bases}), which provides get_params and "
                    "set_params, and store every __init__ argument unchanged under its own "
                    "name")
        elif isinstance(exc, RuntimeError):
            hint = "; __init__ must store every argument unchanged under its own name"
        else:
            hint = ""
        raise Broken(f"{what} raised {fmt_exc(exc).rstrip('.')}{hint}") from exc
    if twin is fitted or type(twin) is not type(fitted):
        raise Broken(f"{what} returned {brief(twin)}, expected a new "
                     f"{type(fitted).__name__}")
    kept = learned_attributes(twin)
    if kept:
        raise Broken(f"{what} kept learned state ({', '.join(kept)}); __init__ must set "
                     "hyperparameters only")
    params = call("get_params()", fitted.get_params, deep=False)
    twin_params = call("get_params() of the clone", twin.get_params, deep=False)
    if params.keys() != twin_params.keys():
        raise Broken(f"the clone's get_params() has keys {sorted(twin_params)}, the "
                     f"original's {sorted(params)}")
    for key, value in params.items():
        if not same(value, twin_params[key]):
            raise Broken(f"the clone's get_params()[{key!r}] is {twin_params[key]!r}, the "
                         f"original's {value!r}")
    for key, value in s.params.items():
        if key not in params:
            raise Broken(f"get_params() has no {key!r}, but the plugin was built with "
                         f"{key}={value!r}")
        if not same(params[key], value):
            raise Broken(f"get_params()[{key!r}] is {params[key]!r}, but the plugin was built "
                         f"with {key}={value!r}")
    expect_same_observations(expected, _refit(s, twin), "refitting the clone the same way")


@register_check("selector", "recalibrator", "loss", "scheme")
def check_pickle(s: Subject) -> None:
    """A fitted plugin survives ``pickle.dumps`` / ``pickle.loads`` and the copy gives
    exactly the original's outputs (what the runner needs to cache and hand plugins to
    worker processes)."""
    fitted, expected = _fitted_and_observed(s)
    if s.kind == "scheme":  # a used scheme's copy must fit new companions the same way
        expected = scheme_observe(s, s.make())
    blob = call(f"pickle.dumps(<fitted {s.kind}>)", pickle.dumps, fitted)
    twin = call(f"pickle.loads(pickle.dumps(<fitted {s.kind}>))", pickle.loads, blob)
    expect_same_observations(expected, _observe_again(s, twin), "the unpickled copy")


