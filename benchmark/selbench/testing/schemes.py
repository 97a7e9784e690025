"""Checks of schemes, fitted with built-in companions chosen from their declared
capabilities: ``fit`` returns ``self``, determinism, untouched inputs, ``fit_many`` equals
``fit``.
"""

from __future__ import annotations

from selbench.contract.api import FitJob

from .errors import Broken
from .support import (
    CELLS,
    N_FIT,
    D,
    K,
    Snapshot,
    Subject,
    brief,
    call,
    companion_outputs,
    companions,
    compare_replicas,
    context_fields,
    diff,
    equal,
    eval_data,
    fit_context,
    fit_data,
    make_outputs,
    no_shared_state,
    outputs_arrays,
    register_check,
    scheme_observe,
)


@register_check("scheme")
def check_scheme_fit_returns_self(s: Subject) -> None:
    """``fit(outputs, selector=..., recalibrator=..., loss=..., coverage=..., context=...)``
    returns the scheme itself and leaves the selector and recalibrator fitted."""
    scheme, outputs = s.make(), fit_data()
    comp = companions(type(scheme))
    got = call("fit(outputs, selector=..., ...)", scheme.fit, outputs, **comp,
               context=fit_context())
    if got is not scheme:
        raise Broken(f"fit(outputs, selector=..., ...) returned {brief(got)}, expected the "
                     "scheme itself (end fit with `return self`)")
    companion_outputs(comp, eval_data())


@register_check("scheme")
def check_scheme_is_deterministic(s: Subject) -> None:
    """Two fits with the same ``FitContext(seed=...)`` leave the selector and recalibrator
    with identical outputs."""
    first = scheme_observe(s, s.make())
    second = scheme_observe(s, s.make())
    for key, value in first.items():
        if not equal(value, second[key]):
            raise Broken(f"two fits with FitContext(seed=0) gave a different {key} "
                         f"({diff(value, second[key])}); seed all randomness from "
                         "context.seed")


@register_check("scheme")
def check_scheme_does_not_mutate_inputs(s: Subject) -> None:
    """``fit`` leaves the outputs' arrays and the ``FitContext`` unchanged."""
    scheme, outputs, context = s.make(), fit_data(), fit_context()
    snap = Snapshot(lambda: {**outputs_arrays(outputs), **context_fields(context)})
    call("fit(outputs, selector=..., ...)", scheme.fit, outputs,
         **companions(type(scheme)), context=context)
    snap.unchanged("fit(outputs, selector=..., ...)")


@register_check("scheme")
def check_scheme_fit_many_equals_fit(s: Subject) -> None:
    """``fit_many(jobs)`` returns the scheme and leaves every job's selector and recalibrator
    as ``fit`` of that job alone would (to 1e-5), each job owning its state."""
    ev = eval_data()
    results = []
    for batched in (False, True):
        jobs = [FitJob(make_outputs(N_FIT, K, D, seed=data_seed), context=fit_context(seed, beta),
                       **companions(s.cls))
                for seed, beta, data_seed in CELLS]
        scheme = s.make()
        if batched:
            got = call("fit_many(jobs)", scheme.fit_many, jobs)
            if got is not scheme:
                raise Broken(f"fit_many(jobs) returned {brief(got)}, expected the scheme "
                             "itself")
            no_shared_state(jobs, "selector")
            no_shared_state(jobs, "recalibrator")
        else:
            for job in jobs:
                call("fit(outputs, ...)", scheme.fit, job.outputs, selector=job.selector,
                     recalibrator=job.recalibrator, loss=job.loss, coverage=job.coverage,
                     context=job.context)
        results.append([companion_outputs({"selector": j.selector,
                                           "recalibrator": j.recalibrator}, ev)
                        for j in jobs])
    compare_replicas("", results)


