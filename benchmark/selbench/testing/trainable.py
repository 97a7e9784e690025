"""Checks of trainable parts: a trainable selector's protocol, ``Scheme.fit_many`` against
``Scheme.fit`` for every selector and recalibrator (and for a differentiable recalibrator
trained jointly with a learned selector), and a differentiable recalibrator's module protocol.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from selbench.contract.api import FitJob
from selbench.contract.data import ModelOutputs

from .errors import Broken
from .support import (
    CELLS,
    FLOAT_TOL,
    MLP_SELECTOR,
    N_FIT,
    REGISTRY,
    TRAINING,
    CheckSpec,
    D,
    K,
    Subject,
    always,
    brief,
    builtin,
    call,
    companion_outputs,
    compare_replicas,
    diff,
    equal,
    eval_data,
    expect_array,
    fit_context,
    fit_data,
    fit_plugin,
    is_differentiable,
    is_trainable,
    make_outputs,
    no_shared_state,
    register_check,
)


def _trainable(s: Subject) -> str | None:
    return None if is_trainable(s.probe) else "it is not trainable (not a selbench.TrainableSelector)"


def _differentiable(s: Subject) -> str | None:
    return None if is_differentiable(s.probe) else "it is not differentiable"


@register_check("selector", applies=_trainable)
def check_trainable_protocol(s: Subject) -> None:
    """A trainable selector implements ``inputs(outputs)`` (float32 ``[N, d_in]``, read
    after the optional ``fit_inputs(outputs, context)``) and ``init_module(outputs,
    context)``, which stores in ``module_`` and returns a ``torch.nn.Module`` whose
    initial weights depend on ``context.seed`` only and which maps ``[B, d_in]`` to ĝ
    ``[B]`` in [0, 1]."""
    import torch

    sel, fit = s.make(), fit_data()
    for method in ("inputs", "init_module"):
        if not callable(getattr(sel, method, None)):
            raise Broken(f"is a TrainableSelector but has no {method}() method; a "
                         "trainable selector implements inputs(outputs) and "
                         "init_module(outputs, context)")
    call("fit_inputs(outputs, context)", sel.fit_inputs, fit, fit_context())  # as a scheme does
    x = call("inputs(outputs)", sel.inputs, fit)
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 2 \
            or x.shape[0] != len(fit):
        got = brief(x)
        raise Broken(f"inputs(outputs) returned {got}, expected a float32 ndarray of shape "
                     f"({len(fit)}, d_in)")
    module = call("init_module(outputs, context)", sel.init_module, fit, fit_context())
    if not isinstance(module, torch.nn.Module):
        raise Broken(f"init_module(outputs, context) returned {brief(module)}, expected a "
                     "torch.nn.Module")
    if getattr(sel, "module_", None) is not module:
        raise Broken("init_module(outputs, context) did not store the module it returned as "
                     "module_ (score() reads the trained module from there)")
    again = call("init_module(outputs, context)", s.make().init_module, fit, fit_context())
    for (name, a), b in zip(module.state_dict().items(), again.state_dict().values()):
        if not torch.equal(a, b):
            raise Broken(f"two init_module calls with FitContext(seed=0) gave different initial "
                         f"weights ({name}); seed them from context.seed")
    with torch.no_grad():
        g = call("module_(inputs)", module, torch.tensor(x))
    if not isinstance(g, torch.Tensor) or tuple(g.shape) != (len(fit),):
        raise Broken(f"module_(inputs [{len(fit)}, d_in]) returned "
                     f"{tuple(g.shape) if isinstance(g, torch.Tensor) else brief(g)}, "
                     f"expected a tensor of shape ({len(fit)},)")
    expect_array("module_(inputs)", g.double().numpy(), len(fit), np.float64, low=0.0,
                 high=1.0)


def _fit_many_jobs(s: Subject, scheme_name: str, *, train_selector: bool):
    """Fit the replicas ``CELLS`` with ``Scheme.fit_many`` and one by one with
    ``Scheme.fit``; returns both lists of observations on evaluation data."""
    ev = eval_data()
    datas = {data_seed: make_outputs(N_FIT, K, D, seed=data_seed) for _, _, data_seed in CELLS}
    results = []
    for batched in (False, True):
        jobs = []
        for seed, beta, data_seed in CELLS:
            if s.kind == "selector":
                selector, recalibrator = s.make(), builtin("recalibrator", "none")
            elif train_selector:
                selector, recalibrator = builtin("selector", "mlp", MLP_SELECTOR), s.make()
            else:
                selector, recalibrator = builtin("selector", "confidence"), s.make()
            loss = builtin("loss", "s-tlbce") if scheme_name != "recalibration" else None
            coverage = builtin("loss", "quadratic") if scheme_name != "recalibration" else None
            jobs.append(FitJob(datas[data_seed], selector, recalibrator, loss, coverage,
                               fit_context(seed, beta)))
        params = None if scheme_name == "recalibration" else TRAINING
        scheme = builtin("scheme", scheme_name, params)
        if batched:
            got = call(f"scheme {scheme_name!r} fit_many(jobs)", scheme.fit_many, jobs)
            if got is not scheme:
                raise Broken(f"scheme {scheme_name!r} fit_many returned {brief(got)}")
            no_shared_state(jobs, s.kind)
        else:
            for job in jobs:
                call(f"scheme {scheme_name!r} fit(outputs, ...)", scheme.fit, job.outputs,
                     selector=job.selector, recalibrator=job.recalibrator, loss=job.loss,
                     coverage=job.coverage, context=job.context)
        results.append([companion_outputs({"selector": j.selector,
                                           "recalibrator": j.recalibrator}, ev)
                        for j in jobs])
    return results


@register_check("selector")
def check_fit_many_equals_fit(s: Subject) -> None:
    """Fitting replicas (two seeds x two training betas) together with ``Scheme.fit_many``
    leaves each exactly (to 1e-5) as fitting it alone with ``Scheme.fit`` (trainable
    selector: scheme ``selection``; any other selector, through its class's
    ``Selector.fit_many``, and recalibrator: scheme ``recalibration``), each job owning its
    state."""
    if s.kind == "selector" and is_trainable(s.probe):
        compare_replicas("scheme 'selection': ",
                         _fit_many_jobs(s, "selection", train_selector=True))
    else:
        compare_replicas("scheme 'recalibration': ",
                         _fit_many_jobs(s, "recalibration", train_selector=False))


# the same check applies to every recalibrator (the recalibration scheme fits them together)
REGISTRY.append(CheckSpec("check_fit_many_equals_fit", ("recalibrator",), check_fit_many_equals_fit,
                          always))


@register_check("recalibrator", applies=_differentiable)
def check_joint_fit_many_equals_fit(s: Subject) -> None:
    """A differentiable recalibrator trained jointly with a learned selector (scheme
    ``joint``) ends the same (to 1e-5) whether its replicas are trained together by
    ``fit_many`` or one by one by ``fit``."""
    compare_replicas("scheme 'joint': ", _fit_many_jobs(s, "joint", train_selector=True))


def _live_module(rec: Any, fit: ModelOutputs) -> Any:
    """``rec.module(outputs, context)``, which must be a ``torch.nn.Module`` and the same
    object on a second call (the recalibrator's own live module, not a copy)."""
    import torch

    module = call("module(outputs, context)", rec.module, fit, fit_context())
    if not isinstance(module, torch.nn.Module):
        raise Broken(f"module(outputs, context) returned {brief(module)}, expected a "
                     "torch.nn.Module")
    if call("module(outputs, context)", rec.module, fit, fit_context()) is not module:
        raise Broken("module(outputs, context) returned a new object on a second call; it "
                     "must return the recalibrator's own live module, not a copy")
    return module


def _module_forward(module: Any, ev: ModelOutputs) -> tuple[np.ndarray, Any]:
    """The module's ``(confidence as float64, log_probs)`` on ``ev`` (eval mode, no grad)."""
    import torch

    module.eval()
    with torch.no_grad():
        out = call("module(logits, features)", module, torch.tensor(ev.logits),
                   torch.tensor(ev.features))
    if not (isinstance(out, tuple) and len(out) == 2):
        raise Broken(f"module(logits, features) returned {brief(out)}, expected a tuple "
                     "(confidence [B], log_probs [B, K] or None)")
    return out[0].double().numpy(), out[1]


def _check_log_probs(rec: Any, log_probs: Any, ev: ModelOutputs) -> None:
    """The module's log-probabilities are present exactly when ``provides_log_probs`` says
    so, of shape ``[B, K]``, and exponentiate to a distribution."""
    import torch

    declared = getattr(type(rec), "provides_log_probs", None)
    if log_probs is None and declared is True:
        raise Broken("declares provides_log_probs = True, but the module returned "
                     "log_probs None")
    if log_probs is not None:
        if declared is False:
            raise Broken("declares provides_log_probs = False, but the module returned "
                         "log-probabilities")
        if tuple(log_probs.shape) != (len(ev), ev.num_classes):
            raise Broken(f"the module's log_probs have shape {tuple(log_probs.shape)}, "
                         f"expected ({len(ev)}, {ev.num_classes})")
        total = torch.logsumexp(log_probs.double(), -1).numpy()
        if not equal(total, np.zeros(len(ev)), 1e-4):
            raise Broken("the module's log_probs do not exponentiate to a distribution "
                         f"(log-sum-exp per row: {diff(total, np.zeros(len(ev)), 1e-4)})")


def _check_module_predict(module: Any, rec: Any, ev: ModelOutputs) -> None:
    """A module that ``changes_prediction`` predicts as ``predict(outputs)`` does."""
    import torch

    if getattr(module, "changes_prediction", False):
        with torch.no_grad():
            pred = call("module.predict(logits, features)", module.predict,
                        torch.tensor(ev.logits), torch.tensor(ev.features))
        pred = np.asarray(pred.cpu().numpy() if isinstance(pred, torch.Tensor) else pred)
        expected = call("predict(outputs)", rec.predict, ev)
        if not equal(pred, expected):
            raise Broken("the module's predict differs from predict(outputs) "
                         f"({diff(pred, expected)})")


def _check_follows_parameters(module: Any, rec: Any, ev: ModelOutputs) -> None:
    """After the module's parameters change in place, ``confidence(outputs)`` follows."""
    import torch

    params = list(module.parameters())
    if params:
        with torch.no_grad():
            for p in params:
                p.add_(0.05)
        moved, _ = _module_forward(module, ev)
        now = call("confidence(outputs)", rec.confidence, ev)
        if not equal(moved, now, FLOAT_TOL):
            raise Broken("after the module's parameters were changed in place, "
                         f"confidence(outputs) did not follow ({diff(moved, now, FLOAT_TOL)}); "
                         "it must read the live module that module() returns")


@register_check("recalibrator", applies=_differentiable)
def check_module_protocol(s: Subject) -> None:
    """A differentiable recalibrator's ``module(outputs, context)`` returns its own live
    ``torch.nn.Module`` (the same object on every call); ``forward(logits, features)`` returns
    ``(confidence [B] in [0, 1], log_probs [B, K] or None)`` with the confidence equal to
    ``confidence(outputs)`` (to 1e-6), log-probabilities that exponentiate to a distribution
    and are present exactly when ``provides_log_probs`` says so; ``confidence`` follows
    changes made to the module's parameters in place (a scheme trains it so)."""
    fit, ev = fit_data(), eval_data()
    rec = fit_plugin(s, s.make(), fit)
    module = _live_module(rec, fit)
    conf_m, log_probs = _module_forward(module, ev)
    expect_array("module(logits, features)[0]", conf_m, len(ev), np.float64, low=0.0,
                 high=1.0)
    conf = call("confidence(outputs)", rec.confidence, ev)
    if not equal(conf_m, conf, FLOAT_TOL):
        raise Broken("the module's confidence differs from confidence(outputs) "
                     f"({diff(conf_m, conf, FLOAT_TOL)}); confidence must be computed by the "
                     "module module() returns")
    _check_log_probs(rec, log_probs, ev)
    _check_module_predict(module, rec, ev)
    _check_follows_parameters(module, rec, ev)
