"""What every conformance check stands on: the kit's tiny deterministic data
(:func:`make_outputs`, the fitting and evaluation sets, the tolerances), message formatting,
guarded calls and checks of returned arrays, the plugin under test (:class:`Subject`, resolved
from a registered name, a descriptor, a factory or an instance), the check registry and its
decorator :func:`register_check`, and fitting plugins, with the built-in companions the kit
trains and pairs them with, as the core would.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from selbench.contract.api import (
    KIND_BASES,
    KINDS,
    CoverageLoss,
    DifferentiableRecalibrator,
    FitContext,
    Plugin,
    TrainableSelector,
)
from selbench.contract.data import ModelOutputs

from .errors import Broken, CheckSkipped

#: float tolerance of ``fit_many`` against ``fit`` (batched training sums in another order)
FIT_MANY_TOL = 1e-5
#: float tolerance of comparisons that reorder or re-chunk float32 computations
FLOAT_TOL = 1e-6

#: rows of the fitting and the evaluation data, classes, feature width
N_FIT, N_EVAL, K, D = 120, 80, 3, 6

#: what the kit trains trainable components with (the built-in schemes' parameters)
TRAINING = {"epochs": 4, "batch_size": 40, "lr": 5e-3}
#: the learned selector used as a companion (joint training of a recalibrator)
MLP_SELECTOR = {"hidden": [8]}
#: replicas of fit_many checks: (seed, training beta, data seed); equal seeds share data, as
#: the training betas of one seed do in the runner
CELLS = ((0, 0.6, 10), (0, 0.8, 10), (1, 0.6, 11), (1, 0.8, 11))


# ---------------------------------------------------------------------------- data
def make_outputs(n: int = N_FIT, k: int = K, d: int = D, seed: int = 0, *,
                 domain: bool = True) -> ModelOutputs:
    """Tiny deterministic model outputs for tests: the same arguments give the same arrays.

    Features ``x ~ N(0, I)`` ``[n, d]`` (float32); a linear model ``z = x W`` with
    ``W ~ N(0, 1)`` whose labels are drawn from ``softmax(z)`` (so ``z`` is calibrated) and
    over-confident logits ``2 z``; the first third of the rows form an outlier group (feature
    0 shifted by +3, labels drawn uniformly, so the model is often wrong there), which is
    domain 1 (the rest domain 0) when ``domain`` is true.
    """
    if n < 0 or k < 2 or d < 1:
        raise ValueError(f"make_outputs: needs n >= 0, k >= 2, d >= 1, got n={n}, k={k}, d={d}")
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    z = x @ rng.normal(size=(d, k))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    labels = np.minimum((p.cumsum(axis=1) < rng.random((n, 1))).sum(axis=1), k - 1)
    outlier = np.arange(n) < n // 3
    x[outlier, 0] += 3.0
    labels[outlier] = rng.integers(0, k, int(outlier.sum()))
    return ModelOutputs(
        features=x.astype(np.float32), logits=(2.0 * z).astype(np.float32),
        labels=labels.astype(np.int64),
        domain=outlier.astype(np.int64) if domain else None,
    )


def fit_context(seed: int = 0, beta: float = 0.8) -> FitContext:
    return FitContext(seed=seed, beta=beta)


def fit_data(k: int = K) -> ModelOutputs:
    return make_outputs(N_FIT, k, D, seed=0 if k == K else 2)


def eval_data(k: int = K) -> ModelOutputs:
    return make_outputs(N_EVAL, k, D, seed=1 if k == K else 3)


# ---------------------------------------------------------------------------- formatting
def fmt_num(x: Any) -> str:
    if isinstance(x, (float, np.floating)):
        return f"{float(x):.6g}"
    if isinstance(x, np.integer):
        return str(int(x))
    return repr(x)


def fmt_index(idx: Any) -> str:
    idx = tuple(int(i) for i in np.atleast_1d(idx))
    return str(idx[0]) if len(idx) == 1 else str(idx)


def fmt_exc(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def brief(value: Any) -> str:
    """A returned value, for messages: ``None``, ``ndarray of shape (3,)``, ``float``."""
    if value is None:
        return "None"
    if isinstance(value, np.ndarray):
        return f"an ndarray of dtype {value.dtype} and shape {value.shape}"
    return f"a {type(value).__name__}"


def fmt_types(types: tuple[type, ...]) -> str:
    names = [t.__name__ for t in types]
    return "a " + " or ".join(names)


def diff(a: Any, b: Any, tol: float = 0.0) -> str:
    """Where two arrays differ (first index beyond ``tol``, and the largest difference)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shapes {a.shape} and {b.shape}"
    try:
        delta = np.abs(a.astype(np.float64) - b.astype(np.float64))
        bad = ~(delta <= tol)  # NaN counts as a difference
    except (TypeError, ValueError):
        delta, bad = None, a != b
    where = np.argwhere(bad)
    if not len(where):
        return "no difference"
    i = tuple(where[0])
    text = f"first at index {fmt_index(i)}: {fmt_num(a[i])} vs {fmt_num(b[i])}"
    if delta is not None and np.isfinite(delta).any():
        text += f"; largest difference {fmt_num(np.nanmax(delta))}"
    return text


def equal(a: Any, b: Any, tol: float = 0.0) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if tol == 0.0:
        try:
            return bool(np.array_equal(a, b, equal_nan=True))
        except TypeError:
            return bool(np.array_equal(a, b))
    return bool(np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=0.0, atol=tol,
                            equal_nan=True))


def same(a: Any, b: Any) -> bool:
    """Equality of parameter values (arrays, nested lists and dicts included)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:
        return a is b


# ---------------------------------------------------------------------------- helpers
def call(what: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; an exception becomes a failure saying which call raised."""
    try:
        return fn(*args, **kwargs)
    except Broken:
        raise
    except CheckSkipped:
        raise
    except Exception as exc:
        raise Broken(f"{what} raised {fmt_exc(exc)}") from exc


def expect_error(what: str, fn: Callable, *args: Any, types: tuple[type, ...] = (ValueError,),
                 names: Sequence[str] = ()) -> BaseException:
    """``fn(*args)`` must raise one of ``types`` whose message contains one of ``names``."""
    naming = f" whose message names {' or '.join(repr(n) for n in names)}" if names else ""
    try:
        result = fn(*args)
    except types as exc:
        if names and not any(n in str(exc) for n in names):
            raise Broken(
                f"{what} raised {type(exc).__name__}({str(exc)!r}), whose message does not name "
                f"the bad argument ({' or '.join(repr(n) for n in names)})"
            ) from exc
        return exc
    except Exception as exc:
        raise Broken(f"{what} raised {fmt_exc(exc)}; expected {fmt_types(types)}{naming}") from exc
    raise Broken(f"{what} returned {brief(result)} instead of raising {fmt_types(types)}{naming}")


def expect_array(what: str, value: Any, n: int, dtype: type, *, low: float | None = None,
                 high: float | None = None, classes: int | None = None) -> np.ndarray:
    """``value`` must be a finite numpy array of ``dtype`` and shape ``(n,)``, within
    ``[low, high]`` (floats) or ``[0, classes)`` (integers)."""
    if not isinstance(value, np.ndarray):
        raise Broken(f"{what} returned {brief(value)}, expected a numpy.ndarray of dtype "
                     f"{np.dtype(dtype)} and shape ({n},)")
    if value.dtype != np.dtype(dtype):
        raise Broken(f"{what} returned dtype {value.dtype}, expected {np.dtype(dtype)}")
    if value.shape != (n,):
        raise Broken(f"{what} returned shape {value.shape} for {n} examples, expected ({n},)")
    if np.issubdtype(value.dtype, np.floating):
        finite = np.isfinite(value)
        if not finite.all():
            i = int(np.flatnonzero(~finite)[0])
            raise Broken(f"{what} returned NaN or infinite values (first at index {i}: "
                         f"{fmt_num(value[i])})")
    if low is not None and high is not None and n:
        i, j = int(np.argmin(value)), int(np.argmax(value))
        if value[i] < low:
            raise Broken(f"{what} returned values outside [{fmt_num(low)}, {fmt_num(high)}] "
                         f"(min {fmt_num(value[i])} at index {i})")
        if value[j] > high:
            raise Broken(f"{what} returned values outside [{fmt_num(low)}, {fmt_num(high)}] "
                         f"(max {fmt_num(value[j])} at index {j})")
    if classes is not None and n:
        bad = np.flatnonzero((value < 0) | (value >= classes))
        if len(bad):
            i = int(bad[0])
            raise Broken(f"{what} returned classes outside [0, {classes}) (found "
                         f"{fmt_num(value[i])} at index {i})")
    return value


def outputs_arrays(outputs: ModelOutputs, name: str = "outputs") -> dict[str, Any]:
    return {f"{name}.{a}": getattr(outputs, a)
            for a in ("features", "logits", "labels", "domain")}


def context_fields(context: FitContext) -> dict[str, Any]:
    return {f"context.{f.name}": copy.deepcopy(getattr(context, f.name))
            for f in dataclasses.fields(context)}


class Snapshot:
    """Copies of arrays (and context fields) to prove a call left them unchanged."""

    def __init__(self, current: Callable[[], dict[str, Any]]):
        self.current = current
        self.before = {k: copy.deepcopy(v) for k, v in current().items()}

    def unchanged(self, call: str) -> None:
        now = self.current()
        for name, before in self.before.items():
            after = now[name]
            if isinstance(before, np.ndarray) or isinstance(after, np.ndarray):
                if equal(before, after):
                    continue
                raise Broken(f"{call} modified {name} in place ({diff(before, after)}, "
                             "before vs after); copy an array before changing it")
            if not same(before, after):
                raise Broken(f"{call} changed {name} from {before!r} to {after!r}")


def learned_attributes(obj: Any) -> list[str]:
    """Names of learned attributes (ending in ``_``, not dunder/private)."""
    try:
        names = vars(obj)
    except TypeError:
        return []
    return sorted(k for k in names if k.endswith("_") and not k.startswith("_"))


def no_shared_state(jobs: Sequence[Any], attr: str) -> None:
    """No two jobs' ``attr`` objects may share a mutable learned attribute."""
    import torch

    mutable = (np.ndarray, torch.nn.Module, torch.Tensor, list, dict)
    objs = [getattr(job, attr) for job in jobs]
    for i in range(len(objs)):
        for j in range(i + 1, len(objs)):
            a, b = objs[i], objs[j]
            if a is b:
                raise Broken(f"fit_many jobs {i} and {j} hold one {attr} object; the kit gave "
                             "each job its own")
            for name in learned_attributes(a):
                value = getattr(a, name, None)
                if isinstance(value, mutable) and getattr(b, name, None) is value:
                    raise Broken(
                        f"fit_many left the {attr}s of jobs {i} and {j} sharing the learned "
                        f"attribute {name} (one object); each job's {attr} must own its state "
                        "(copy it, e.g. copy.deepcopy)")


def builtin(kind: str, name: str, params: dict | None = None) -> Any:
    """A built-in companion plugin (the kit trains and pairs with these)."""
    from selbench.contract.registry import get_registry

    return get_registry().get(kind, name).build(params)


def is_trainable(obj: Any) -> bool:
    """A selector a scheme trains: a :class:`selbench.TrainableSelector`."""
    return isinstance(obj, TrainableSelector)


def is_differentiable(obj: Any) -> bool:
    """A recalibrator with a trainable module: a :class:`selbench.DifferentiableRecalibrator`."""
    return isinstance(obj, DifferentiableRecalibrator)


# ---------------------------------------------------------------------------- the subject
@dataclass
class Subject:
    """A plugin under test: how to build fresh instances of it, and how to name it."""

    kind: str
    label: str  # for messages: recalibrator 'temperature'
    ident: str  # for test ids: temperature
    factory: Callable[[], Any]
    params: dict
    probe: Any = None  # one instance, built when the checks were listed (None: not built)
    #: the plugin's parameter model (None: an instance, whose parameters the kit reads back)
    model: Any = None
    #: ``at(point)``: a factory of the plugin with the parameters of ``point`` set over the
    #: subject's own (validated by ``model`` where there is one)
    at: Callable[[dict], Callable[[], Any]] | None = None
    #: the factory when it is a class (None: a factory function or an instance, whose
    #: ``__init__`` arguments the kit does not know), and the arguments it passes to it
    init_class: type | None = None
    passed: dict | None = None
    #: what the checks worked out once about the subject (e.g. its parameter rule)
    notes: dict = dataclasses.field(default_factory=dict)

    def make(self) -> Any:
        return call("building the plugin", self.factory)

    @property
    def cls(self) -> type | None:
        return None if self.probe is None else type(self.probe)


def resolve_subject(kind: str, plugin: Any, params: Mapping[str, Any] | None) -> Subject:
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    if params is not None and not isinstance(params, Mapping):
        raise TypeError(f"params: expected a mapping of parameter names to values, got "
                        f"{type(params).__name__}")
    params = dict(params or {})
    shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
    if isinstance(plugin, str):
        from selbench.contract.registry import get_registry

        registered = get_registry().get(kind, plugin)  # PluginError names close matches
        return _modelled(kind, f"{kind} {plugin!r}", plugin, registered.plugin.factory,
                         registered.plugin.params, params)
    if isinstance(plugin, Plugin):
        return _modelled(kind, f"{kind} {plugin.name!r}", plugin.name, plugin.factory,
                         plugin.params, params)
    if isinstance(plugin, type) or (callable(plugin) and not isinstance(plugin, KIND_BASES[kind])):
        name = getattr(plugin, "__name__", None) or repr(plugin)
        ident = f"{name}({shown})" if params else name
        model = _model_of(plugin)

        def at(point: dict) -> Callable[[], Any]:
            return lambda: plugin(**{**params, **point})

        return Subject(kind, f"{kind} {ident}", ident, lambda: plugin(**params), params,
                       model=model, at=at,
                       init_class=plugin if isinstance(plugin, type) else None,
                       passed=_with_defaults(plugin, params))
    if params:
        raise ValueError("params: give params with a plugin's name or factory; an instance "
                         "already holds its parameters")
    template = copy.deepcopy(plugin)
    name = type(plugin).__name__

    def at_instance(point: dict) -> Callable[[], Any]:
        return lambda: copy.deepcopy(template).set_params(**point)

    return Subject(kind, f"{kind} {name} instance", name,
                   lambda: copy.deepcopy(template), params, model=_model_of(type(plugin)),
                   at=at_instance)


def _with_defaults(factory: Any, params: dict) -> dict | None:
    """``params`` with the defaults of the other arguments of ``factory``'s signature."""
    import inspect

    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    defaults = {p.name: p.default for p in signature.parameters.values()
                if p.default is not p.empty}
    return {**defaults, **params}


def _model_of(factory: Any) -> Any:
    """The parameter model selbench derives from ``factory``'s signature (None when it
    cannot be derived: the kit then knows no search space)."""
    from selbench.contract.params import params_model

    try:
        return params_model(factory)
    except TypeError:
        return None


def _modelled(kind: str, label: str, ident: str, factory: Callable[..., Any], model: Any,
              params: dict) -> Subject:
    """A subject built through its parameter model (a registered plugin, a descriptor): the
    params validated as the registry validates them, at every point too."""
    validated = model.model_validate(params)

    def at(point: dict) -> Callable[[], Any]:
        chosen = model.model_validate({**params, **point})
        return lambda: factory(**chosen.model_dump())

    return Subject(kind, label, ident, lambda: factory(**validated.model_dump()), params,
                   model=model, at=at,
                   init_class=factory if isinstance(factory, type) else None,
                   passed=validated.model_dump())


# ---------------------------------------------------------------------------- check registry
@dataclass(frozen=True)
class CheckSpec:
    name: str
    kinds: tuple[str, ...]
    fn: Callable[[Subject], None]
    #: None when the check applies, else why it does not
    applies: Callable[[Subject], str | None]

    @property
    def rule(self) -> str:
        doc = (self.fn.__doc__ or "").strip()
        return " ".join(doc.split("\n\n")[0].split())


REGISTRY: list[CheckSpec] = []


def always(s: Subject) -> str | None:
    return None


def register_check(*kinds: str, applies: Callable[[Subject], str | None] = always):
    def register(fn: Callable[[Subject], None]) -> Callable[[Subject], None]:
        REGISTRY.append(CheckSpec(fn.__name__, kinds, fn, applies))
        return fn

    return register


# ---------------------------------------------------------------------------- fit / observe
def train_with_selection_scheme(selector: Any, outputs: ModelOutputs, context: FitContext) -> Any:
    """Train a trainable selector as the ``selection`` scheme does (h = ``none``)."""
    scheme = builtin("scheme", "selection", TRAINING)
    call("training it with scheme 'selection' (scheme.fit(outputs, selector=...))",
         scheme.fit, outputs, selector=selector, recalibrator=builtin("recalibrator", "none"),
         loss=builtin("loss", "s-tlbce"), coverage=builtin("loss", "quadratic"),
         context=context)
    return selector


def fit_plugin(s: Subject, obj: Any, outputs: ModelOutputs, seed: int = 0) -> Any:
    """Fit a selector or recalibrator as the core would; returns ``obj``."""
    context = fit_context(seed)
    if s.kind == "recalibrator":
        call("fit(outputs, context)", obj.fit, outputs, context)
    elif is_trainable(obj):
        train_with_selection_scheme(obj, outputs, context)
    else:
        call("fit(outputs, confidence, context)", obj.fit, outputs, outputs.confidence(),
             context)
    return obj


def observe(s: Subject, obj: Any, outputs: ModelOutputs) -> dict[str, Any]:
    """What a fitted selector or recalibrator returns on ``outputs``."""
    if s.kind == "recalibrator":
        return {"confidence(outputs)": call("confidence(outputs)", obj.confidence, outputs),
                "predict(outputs)": call("predict(outputs)", obj.predict, outputs)}
    return {"score(outputs, confidence)": call("score(outputs, confidence)", obj.score,
                                               outputs, outputs.confidence())}


def expect_same_observations(expected: dict[str, Any], got: dict[str, Any], what: str,
                             tol: float = 0.0) -> None:
    for key, value in expected.items():
        if not equal(value, got[key], tol):
            raise Broken(f"{what} gave a different {key} ({diff(value, got[key], tol)})")


# ---------------------------------------------------------------------------- companions
def loss_inputs(seed: int = 0, b: int = 24, k: int = K) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    g = torch.rand(b, generator=gen) * 0.9 + 0.05
    conf = torch.rand(b, generator=gen) * 0.69 + 0.3
    correct = (torch.rand(b, generator=gen) < 0.7).float()
    log_probs = torch.log_softmax(torch.randn(b, k, generator=gen), -1)
    labels = torch.randint(0, k, (b,), generator=gen)
    label_lp = log_probs.gather(1, labels[:, None]).squeeze(1)
    return {"g": g, "confidence": conf, "correct": correct, "label_log_prob": label_lp}


def loss_value(loss: Any, inputs: dict[str, Any] | None = None, *, grad: bool = False):
    """``loss(...)`` on fixed inputs; with ``grad`` also the gradients in g (and confidence)."""
    inputs = loss_inputs() if inputs is None else inputs
    leaf = (lambda t: t.clone().requires_grad_()) if grad else (lambda t: t)
    g = leaf(inputs["g"])
    if isinstance(loss, CoverageLoss):
        what = "loss(g, beta=0.8)"
        value = call(what, loss, g, 0.8)
        leaves = {"g": g}
    else:
        what = "loss(g, confidence, correct, label_log_prob)"
        conf, label_lp = leaf(inputs["confidence"]), leaf(inputs["label_log_prob"])
        value = call(what, loss, g, conf, inputs["correct"], label_lp)
        # what h's training reads: the label's log-probability for a loss that needs it
        # (S-MCE), else the confidence
        if getattr(loss, "needs_log_probs", False):
            leaves = {"g": g, "label_log_prob": label_lp}
        else:
            leaves = {"g": g, "confidence": conf}
    return what, value, leaves


def scheme_observe(s: Subject, scheme: Any, seed: int = 0, beta: float = 0.8,
                   data_seed: int = 10) -> dict[str, Any]:
    """Fit fresh companions with ``scheme`` and return what they output on evaluation data."""
    outputs = make_outputs(N_FIT, K, D, seed=data_seed)
    comp = companions(type(scheme))
    call("fit(outputs, selector=..., recalibrator=..., loss=..., coverage=..., context=...)",
         scheme.fit, outputs, **comp, context=fit_context(seed, beta))
    return companion_outputs(comp, eval_data())


def companions(cls: type) -> dict[str, Any]:
    """Built-in companions a scheme of class ``cls`` can fit, from its declared capabilities."""
    requires = set(getattr(cls, "requires", ()) or ())
    if getattr(cls, "selector_must_be_trainable", None) is True:
        selector = builtin("selector", "mlp", MLP_SELECTOR)
    else:
        selector = builtin("selector", "confidence")
    if getattr(cls, "fits_recalibrator", True) is False:
        recalibrator = builtin("recalibrator", "none")
    else:
        recalibrator = builtin("recalibrator", "temperature")
    return {
        "selector": selector,
        "recalibrator": recalibrator,
        "loss": builtin("loss", "s-tlbce") if "loss" in requires else None,
        "coverage": builtin("loss", "quadratic") if "coverage" in requires else None,
    }


def companion_outputs(comp: dict[str, Any], outputs: ModelOutputs) -> dict[str, Any]:
    conf = call("the fitted recalibrator's confidence(outputs)", comp["recalibrator"].confidence,
                outputs)
    score = call("the fitted selector's score(outputs, confidence)", comp["selector"].score,
                 outputs, conf)
    return {"recalibrator confidence": conf, "selector score": score}


def compare_replicas(prefix: str, results) -> None:
    solo, batched = results
    for i, (a, b) in enumerate(zip(solo, batched)):
        seed, beta, _ = CELLS[i]
        for key, value in a.items():
            if not equal(value, b[key], FIT_MANY_TOL):
                raise Broken(
                    f"{prefix}replica {i} (seed {seed}, beta {beta}) fitted by "
                    f"fit_many gives a different {key} than fitted alone by fit "
                    f"({diff(value, b[key], FIT_MANY_TOL)}; tolerance {FIT_MANY_TOL:g}); "
                    "fit_many must leave every replica as its own fit would")


