"""The plugin conformance kit: run every rule of the plugin contract against a plugin.

:func:`check_plugin` runs every check that applies to a plugin and raises one
:class:`ConformanceError` naming the plugin, each broken rule and exactly what was expected
and what the plugin did::

    from selbench.testing import check_plugin

    check_plugin("recalibrator", Shrink, {"factor": 1.5})
    # ConformanceError: recalibrator Shrink(factor=1.5): check_confidence_output:
    #   confidence(outputs) returned values outside [0, 1] (max 1.33333 at index 68)

In a test suite, :func:`parametrize_with_checks` makes one pytest test per check (pytest is
imported only when it is called)::

    from selbench.testing import parametrize_with_checks

    @parametrize_with_checks([("recalibrator", Shrink), ("selector", "my-selector", {"k": 3})])
    def test_my_plugins(check):
        check()

A plugin is given as its registered name (looked up in :func:`selbench.contract.registry.get_registry`,
its params validated by its own model), a :class:`selbench.Plugin` descriptor, a factory
(the class, called as ``factory(**params)``) or an unfitted instance (deep-copied for every
use). Every check builds fresh plugins, so one check never sees another's state.

What is checked (each check's docstring states its rule; :func:`plugin_checks` lists the
checks that apply to a plugin):

* **selector**, **recalibrator**: the kind's base class; ``fit`` returns ``self``; a fit is
  deterministic for a fixed ``FitContext(seed=...)``; nothing mutates its inputs (the
  ``ModelOutputs`` arrays, the confidence array, the context); dtype, shape and range of every
  return (``confidence`` float64 ``[N]`` in [0, 1], ``predict`` int64 ``[N]`` in [0, K),
  ``score`` float64 ``[N]`` finite); each example's output depends on that example only;
  unfitted use raises a ``ValueError`` (scikit-learn's ``NotFittedError`` is one) unless the
  plugin works unfitted; bad input (not ``ModelOutputs``, no rows, confidence of the wrong
  length, features of another width) raises a ``ValueError`` / ``TypeError`` naming the
  argument; ``sklearn.base.clone`` and a pickle round trip; for every selector and
  recalibrator, ``Scheme.fit_many`` over several replicas equals ``Scheme.fit`` of each;
  for differentiable recalibrators the module protocol and joint training.
* **loss** (selection and coverage losses): a finite scalar tensor, differentiable in ĝ (and
  in the confidence, or the log-probabilities for a loss that ``needs_log_probs``),
  deterministic, inputs untouched, shape errors, replica rows (``[R, B]`` gives each row's
  own value, as the training engine calls it), clone and pickle.
* **scheme**: fitted with built-in companions chosen from its declared capabilities
  (selector ``mlp`` or ``confidence``, recalibrator ``temperature`` or ``none``, loss
  ``s-tlbce``, coverage ``quadratic``): ``fit`` returns ``self``, determinism, inputs untouched,
  ``fit_many`` equals ``fit``, clone and pickle.
* **dataset**: the split contract (labels, inputs of the declared input kind, domain),
  determinism, unknown split names. Checks of a dataset whose files are absent (it raises
  ``FileNotFoundError``, as documented) are skipped.
* **backbone**: ``extract`` on a tiny synthetic dataset of an input kind it declares
  (``vectors`` or ``image-array``; other kinds are skipped) returns matching ``ModelOutputs``,
  deterministically; a backbone declaring ``shardable`` returns, for row ranges of a split,
  exactly those rows of the whole split with the whole split's ``meta``.

The data are tiny and deterministic: plugins are fitted on ``make_outputs(120, 3, 6,
seed=0)`` and evaluated on ``make_outputs(80, 3, 6, seed=1)`` (binary checks: seeds 2 and 3,
K=2), with ``FitContext(seed=0, beta=0.8)``, on the CPU. Trainable components are trained a
few epochs by the built-in schemes; pass small training params for plugins whose defaults
train long (e.g. ``{"epochs": 20}``).
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from selbench.contract.api import (
    KIND_BASES,
    KINDS,
    CoverageLoss,
    Dataset,
    DifferentiableRecalibrator,
    FitContext,
    FitJob,
    Plugin,
    SelectionLoss,
    SplitData,
    TrainableSelector,
)
from selbench.contract.data import ModelOutputs

__all__ = [
    "Check",
    "CheckSkipped",
    "ConformanceError",
    "ConformanceWarning",
    "all_checks",
    "check_plugin",
    "make_outputs",
    "parametrize_with_checks",
    "plugin_checks",
]

#: float tolerance of ``fit_many`` against ``fit`` (batched training sums in another order)
FIT_MANY_TOL = 1e-5
#: float tolerance of comparisons that reorder or re-chunk float32 computations
FLOAT_TOL = 1e-6

#: rows of the fitting and the evaluation data, classes, feature width
N_FIT, N_EVAL, K, D = 120, 80, 3, 6

#: what the kit trains trainable components with (the built-in schemes' parameters)
_TRAINING = {"epochs": 4, "batch_size": 40, "lr": 5e-3}
#: the learned selector used as a companion (joint training of a recalibrator)
_MLP_SELECTOR = {"hidden": [8]}
#: replicas of fit_many checks: (seed, training beta, data seed); equal seeds share data, as
#: the training betas of one seed do in the runner
_CELLS = ((0, 0.6, 10), (0, 0.8, 10), (1, 0.6, 11), (1, 0.8, 11))


# ---------------------------------------------------------------------------- errors
class ConformanceError(AssertionError):
    """A plugin broke a rule of the plugin contract.

    The message is ``<plugin>: <check>: <what was expected and what happened>``, e.g.
    ``recalibrator 'shrink': check_confidence_output: confidence(outputs) returned values
    outside [0, 1] (min -0.2 at index 3)``. When :func:`check_plugin` finds several broken
    rules, one error lists them all, one per line, and :attr:`errors` holds each.

    Attributes:
        plugin: the plugin, as in messages (``recalibrator 'shrink'``).
        check: the check's name (None for a summary of several).
        detail: what was expected and what happened.
        errors: every failure this error reports (itself when it is a single one).
    """

    def __init__(self, plugin: str, check: str | None, detail: str,
                 errors: Sequence[ConformanceError] = ()):
        self.plugin, self.check, self.detail = plugin, check, detail
        self.errors: tuple[ConformanceError, ...] = tuple(errors) or (self,)
        text = f"{plugin}: {check}: {detail}" if check else f"{plugin}: {detail}"
        super().__init__(text)


class CheckSkipped(Exception):
    """A check could not run for this plugin (e.g. a dataset's files are absent); the
    message says why. :func:`check_plugin` turns it into a :class:`ConformanceWarning`,
    :func:`parametrize_with_checks` into a pytest skip."""


class ConformanceWarning(UserWarning):
    """A check that :func:`check_plugin` skipped, and why."""


class _Broken(Exception):
    """A check's failure, before it is labelled with the plugin and the check."""


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


def _ctx(seed: int = 0, beta: float = 0.8) -> FitContext:
    return FitContext(seed=seed, beta=beta)


def _fit_data(k: int = K) -> ModelOutputs:
    return make_outputs(N_FIT, k, D, seed=0 if k == K else 2)


def _eval_data(k: int = K) -> ModelOutputs:
    return make_outputs(N_EVAL, k, D, seed=1 if k == K else 3)


# ---------------------------------------------------------------------------- formatting
def _num(x: Any) -> str:
    if isinstance(x, (float, np.floating)):
        return f"{float(x):.6g}"
    if isinstance(x, np.integer):
        return str(int(x))
    return repr(x)


def _index(idx: Any) -> str:
    idx = tuple(int(i) for i in np.atleast_1d(idx))
    return str(idx[0]) if len(idx) == 1 else str(idx)


def _exc(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _brief(value: Any) -> str:
    """A returned value, for messages: ``None``, ``ndarray of shape (3,)``, ``float``."""
    if value is None:
        return "None"
    if isinstance(value, np.ndarray):
        return f"an ndarray of dtype {value.dtype} and shape {value.shape}"
    return f"a {type(value).__name__}"


def _types(types: tuple[type, ...]) -> str:
    names = [t.__name__ for t in types]
    return "a " + " or ".join(names)


def _diff(a: Any, b: Any, tol: float = 0.0) -> str:
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
    text = f"first at index {_index(i)}: {_num(a[i])} vs {_num(b[i])}"
    if delta is not None and np.isfinite(delta).any():
        text += f"; largest difference {_num(np.nanmax(delta))}"
    return text


def _equal(a: Any, b: Any, tol: float = 0.0) -> bool:
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


def _same(a: Any, b: Any) -> bool:
    """Equality of parameter values (arrays, nested lists and dicts included)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return _equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:
        return a is b


# ---------------------------------------------------------------------------- helpers
def _call(what: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; an exception becomes a failure saying which call raised."""
    try:
        return fn(*args, **kwargs)
    except _Broken:
        raise
    except CheckSkipped:
        raise
    except Exception as exc:
        raise _Broken(f"{what} raised {_exc(exc)}") from exc


def _expect_error(what: str, fn: Callable, *args: Any, types: tuple[type, ...] = (ValueError,),
                  names: Sequence[str] = ()) -> BaseException:
    """``fn(*args)`` must raise one of ``types`` whose message contains one of ``names``."""
    naming = f" whose message names {' or '.join(repr(n) for n in names)}" if names else ""
    try:
        result = fn(*args)
    except types as exc:
        if names and not any(n in str(exc) for n in names):
            raise _Broken(
                f"{what} raised {type(exc).__name__}({str(exc)!r}), whose message does not name "
                f"the bad argument ({' or '.join(repr(n) for n in names)})"
            ) from exc
        return exc
    except Exception as exc:
        raise _Broken(f"{what} raised {_exc(exc)}; expected {_types(types)}{naming}") from exc
    raise _Broken(f"{what} returned {_brief(result)} instead of raising {_types(types)}{naming}")


def _check_array(what: str, value: Any, n: int, dtype: type, *, low: float | None = None,
                 high: float | None = None, classes: int | None = None) -> np.ndarray:
    """``value`` must be a finite numpy array of ``dtype`` and shape ``(n,)``, within
    ``[low, high]`` (floats) or ``[0, classes)`` (integers)."""
    if not isinstance(value, np.ndarray):
        raise _Broken(f"{what} returned {_brief(value)}, expected a numpy.ndarray of dtype "
                      f"{np.dtype(dtype)} and shape ({n},)")
    if value.dtype != np.dtype(dtype):
        raise _Broken(f"{what} returned dtype {value.dtype}, expected {np.dtype(dtype)}")
    if value.shape != (n,):
        raise _Broken(f"{what} returned shape {value.shape} for {n} examples, expected ({n},)")
    if np.issubdtype(value.dtype, np.floating):
        finite = np.isfinite(value)
        if not finite.all():
            i = int(np.flatnonzero(~finite)[0])
            raise _Broken(f"{what} returned NaN or infinite values (first at index {i}: "
                          f"{_num(value[i])})")
    if low is not None and high is not None and n:
        i, j = int(np.argmin(value)), int(np.argmax(value))
        if value[i] < low:
            raise _Broken(f"{what} returned values outside [{_num(low)}, {_num(high)}] "
                          f"(min {_num(value[i])} at index {i})")
        if value[j] > high:
            raise _Broken(f"{what} returned values outside [{_num(low)}, {_num(high)}] "
                          f"(max {_num(value[j])} at index {j})")
    if classes is not None and n:
        bad = np.flatnonzero((value < 0) | (value >= classes))
        if len(bad):
            i = int(bad[0])
            raise _Broken(f"{what} returned classes outside [0, {classes}) (found "
                          f"{_num(value[i])} at index {i})")
    return value


def _outputs_arrays(outputs: ModelOutputs, name: str = "outputs") -> dict[str, Any]:
    return {f"{name}.{a}": getattr(outputs, a)
            for a in ("features", "logits", "labels", "domain")}


def _context_fields(context: FitContext) -> dict[str, Any]:
    return {f"context.{f.name}": copy.deepcopy(getattr(context, f.name))
            for f in dataclasses.fields(context)}


class _Snapshot:
    """Copies of arrays (and context fields) to prove a call left them unchanged."""

    def __init__(self, current: Callable[[], dict[str, Any]]):
        self.current = current
        self.before = {k: copy.deepcopy(v) for k, v in current().items()}

    def unchanged(self, call: str) -> None:
        now = self.current()
        for name, before in self.before.items():
            after = now[name]
            if isinstance(before, np.ndarray) or isinstance(after, np.ndarray):
                if _equal(before, after):
                    continue
                raise _Broken(f"{call} modified {name} in place ({_diff(before, after)}, "
                              "before vs after); copy an array before changing it")
            if not _same(before, after):
                raise _Broken(f"{call} changed {name} from {before!r} to {after!r}")


def _learned(obj: Any) -> list[str]:
    """Names of learned attributes (ending in ``_``, not dunder/private)."""
    try:
        names = vars(obj)
    except TypeError:
        return []
    return sorted(k for k in names if k.endswith("_") and not k.startswith("_"))


def _shared_state(jobs: Sequence[Any], attr: str) -> None:
    """No two jobs' ``attr`` objects may share a mutable learned attribute."""
    import torch

    mutable = (np.ndarray, torch.nn.Module, torch.Tensor, list, dict)
    objs = [getattr(job, attr) for job in jobs]
    for i in range(len(objs)):
        for j in range(i + 1, len(objs)):
            a, b = objs[i], objs[j]
            if a is b:
                raise _Broken(f"fit_many jobs {i} and {j} hold one {attr} object; the kit gave "
                              "each job its own")
            for name in _learned(a):
                value = getattr(a, name, None)
                if isinstance(value, mutable) and getattr(b, name, None) is value:
                    raise _Broken(
                        f"fit_many left the {attr}s of jobs {i} and {j} sharing the learned "
                        f"attribute {name} (one object); each job's {attr} must own its state "
                        "(copy it, e.g. copy.deepcopy)")


def _builtin(kind: str, name: str, params: dict | None = None) -> Any:
    """A built-in companion plugin (the kit trains and pairs with these)."""
    from selbench.contract.registry import get_registry

    return get_registry().get(kind, name).build(params)


def _is_trainable(obj: Any) -> bool:
    """A selector a scheme trains: a :class:`selbench.TrainableSelector`."""
    return isinstance(obj, TrainableSelector)


def _is_differentiable(obj: Any) -> bool:
    """A recalibrator with a trainable module: a :class:`selbench.DifferentiableRecalibrator`."""
    return isinstance(obj, DifferentiableRecalibrator)


# ---------------------------------------------------------------------------- the subject
@dataclass
class _Subject:
    """A plugin under test: how to build fresh instances of it, and how to name it."""

    kind: str
    label: str  # for messages: recalibrator 'temperature'
    ident: str  # for test ids: temperature
    factory: Callable[[], Any]
    params: dict
    probe: Any = None  # one instance, built when the checks were listed (None: not built)

    def make(self) -> Any:
        return _call("building the plugin", self.factory)

    @property
    def cls(self) -> type | None:
        return None if self.probe is None else type(self.probe)


def _resolve(kind: str, plugin: Any, params: Mapping[str, Any] | None) -> _Subject:
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
        validated = registered.validate_params(params)
        factory = registered.plugin.factory
        return _Subject(kind, f"{kind} {plugin!r}", plugin,
                        lambda: factory(**validated.model_dump()), params)
    if isinstance(plugin, Plugin):
        validated = plugin.params.model_validate(params)
        factory = plugin.factory
        return _Subject(kind, f"{kind} {plugin.name!r}", plugin.name,
                        lambda: factory(**validated.model_dump()), params)
    if isinstance(plugin, type) or (callable(plugin) and not isinstance(plugin, KIND_BASES[kind])):
        name = getattr(plugin, "__name__", None) or repr(plugin)
        ident = f"{name}({shown})" if params else name
        return _Subject(kind, f"{kind} {ident}", ident, lambda: plugin(**params), params)
    if params:
        raise ValueError("params: give params with a plugin's name or factory; an instance "
                         "already holds its parameters")
    template = copy.deepcopy(plugin)
    name = type(plugin).__name__
    return _Subject(kind, f"{kind} {name} instance", name,
                    lambda: copy.deepcopy(template), params)


# ---------------------------------------------------------------------------- check registry
@dataclass(frozen=True)
class _Spec:
    name: str
    kinds: tuple[str, ...]
    fn: Callable[[_Subject], None]
    #: None when the check applies, else why it does not
    applies: Callable[[_Subject], str | None]

    @property
    def rule(self) -> str:
        doc = (self.fn.__doc__ or "").strip()
        return " ".join(doc.split("\n\n")[0].split())


_REGISTRY: list[_Spec] = []


def _always(s: _Subject) -> str | None:
    return None


def _check(*kinds: str, applies: Callable[[_Subject], str | None] = _always):
    def register(fn: Callable[[_Subject], None]) -> Callable[[_Subject], None]:
        _REGISTRY.append(_Spec(fn.__name__, kinds, fn, applies))
        return fn

    return register


def _not_trainable(s: _Subject) -> str | None:
    if s.kind == "selector" and _is_trainable(s.probe):
        return "a trainable selector is trained by a scheme, not by its own fit()"
    return None


def _trainable(s: _Subject) -> str | None:
    return None if _is_trainable(s.probe) else "it is not trainable (not a selbench.TrainableSelector)"


def _differentiable(s: _Subject) -> str | None:
    return None if _is_differentiable(s.probe) else "it is not differentiable"


def _selection_loss(s: _Subject) -> str | None:
    return None if isinstance(s.probe, SelectionLoss) else "it is not a SelectionLoss"


# ---------------------------------------------------------------------------- fit / observe
def _train_selector(selector: Any, outputs: ModelOutputs, context: FitContext) -> Any:
    """Train a trainable selector as the ``selection`` scheme does (h = ``none``)."""
    scheme = _builtin("scheme", "selection", _TRAINING)
    _call("training it with scheme 'selection' (scheme.fit(outputs, selector=...))",
          scheme.fit, outputs, selector=selector, recalibrator=_builtin("recalibrator", "none"),
          loss=_builtin("loss", "s-tlbce"), coverage=_builtin("loss", "quadratic"),
          context=context)
    return selector


def _fit(s: _Subject, obj: Any, outputs: ModelOutputs, seed: int = 0) -> Any:
    """Fit a selector or recalibrator as the core would; returns ``obj``."""
    context = _ctx(seed)
    if s.kind == "recalibrator":
        _call("fit(outputs, context)", obj.fit, outputs, context)
    elif _is_trainable(obj):
        _train_selector(obj, outputs, context)
    else:
        _call("fit(outputs, confidence, context)", obj.fit, outputs, outputs.confidence(),
              context)
    return obj


def _observe(s: _Subject, obj: Any, outputs: ModelOutputs) -> dict[str, Any]:
    """What a fitted selector or recalibrator returns on ``outputs``."""
    if s.kind == "recalibrator":
        return {"confidence(outputs)": _call("confidence(outputs)", obj.confidence, outputs),
                "predict(outputs)": _call("predict(outputs)", obj.predict, outputs)}
    return {"score(outputs, confidence)": _call("score(outputs, confidence)", obj.score,
                                                outputs, outputs.confidence())}


def _same_observations(expected: dict[str, Any], got: dict[str, Any], what: str,
                       tol: float = 0.0) -> None:
    for key, value in expected.items():
        if not _equal(value, got[key], tol):
            raise _Broken(f"{what} gave a different {key} ({_diff(value, got[key], tol)})")


# ---------------------------------------------------------------------------- common checks
@_check(*KINDS)
def check_base_class(s: _Subject) -> None:
    """The factory builds an instance of the kind's base class (``selbench.Selector``,
    ``selbench.Recalibrator``, ``selbench.SelectionLoss`` or ``selbench.CoverageLoss``, ...)."""
    try:
        obj = s.factory()
    except FileNotFoundError as exc:
        if s.kind in ("dataset", "backbone"):
            raise CheckSkipped(f"data not available: {_exc(exc)}") from exc
        raise _Broken(f"building the plugin raised {_exc(exc)}") from exc
    except Exception as exc:
        raise _Broken(f"building the plugin raised {_exc(exc)}") from exc
    bases = KIND_BASES[s.kind]
    if not isinstance(obj, bases):
        names = " or ".join(f"selbench.{b.__name__}" for b in bases)
        raise _Broken(f"the factory built a {type(obj).__name__}, expected an instance of "
                      f"{names}")


@_check("selector", "recalibrator", applies=_not_trainable)
def check_fit_returns_self(s: _Subject) -> None:
    """``fit`` returns the plugin itself (``return self``), as scikit-learn estimators do."""
    obj, data = s.make(), _fit_data()
    if s.kind == "recalibrator":
        what, got = "fit(outputs, context)", _call("fit(outputs, context)", obj.fit, data, _ctx())
    else:
        what = "fit(outputs, confidence, context)"
        got = _call(what, obj.fit, data, data.confidence(), _ctx())
    if got is not obj:
        other = f"another {type(got).__name__} object" if type(got) is type(obj) else _brief(got)
        raise _Broken(f"{what} returned {other}, expected the {s.kind} itself (end fit with "
                      "`return self`)")


@_check("selector", "recalibrator")
def check_fit_is_deterministic(s: _Subject) -> None:
    """Two fits on the same outputs with the same ``FitContext(seed=...)`` give identical
    outputs: all randomness is seeded from ``context.seed`` (``context.generator()``)."""
    fit, ev = _fit_data(), _eval_data()
    first = _observe(s, _fit(s, s.make(), fit), ev)
    second = _observe(s, _fit(s, s.make(), fit), ev)
    for key, value in first.items():
        if not _equal(value, second[key]):
            raise _Broken(f"two fits with FitContext(seed=0) on the same outputs gave different "
                          f"{key} ({_diff(value, second[key])}); seed all randomness from "
                          "context.seed")


@_check("selector", "recalibrator")
def check_does_not_mutate_inputs(s: _Subject) -> None:
    """``fit``, ``confidence``/``predict`` and ``score`` leave their inputs unchanged: every
    array of the ``ModelOutputs``, the confidence array and the ``FitContext``."""
    fit, ev, context = _fit_data(), _eval_data(), _ctx()
    obj = s.make()
    if s.kind == "recalibrator":
        snap = _Snapshot(lambda: {**_outputs_arrays(fit), **_context_fields(context)})
        _call("fit(outputs, context)", obj.fit, fit, context)
        snap.unchanged("fit(outputs, context)")
        for method in ("confidence", "predict"):
            snap = _Snapshot(lambda: _outputs_arrays(ev))
            _call(f"{method}(outputs)", getattr(obj, method), ev)
            snap.unchanged(f"{method}(outputs)")
        return
    conf = fit.confidence()
    snap = _Snapshot(lambda: {**_outputs_arrays(fit), "confidence": conf,
                              **_context_fields(context)})
    if _is_trainable(obj):
        _train_selector(obj, fit, context)
        snap.unchanged("training it (scheme 'selection')")
    else:
        _call("fit(outputs, confidence, context)", obj.fit, fit, conf, context)
        snap.unchanged("fit(outputs, confidence, context)")
    conf = ev.confidence()
    snap = _Snapshot(lambda: {**_outputs_arrays(ev), "confidence": conf})
    _call("score(outputs, confidence)", obj.score, ev, conf)
    snap.unchanged("score(outputs, confidence)")


@_check("recalibrator")
def check_confidence_output(s: _Subject) -> None:
    """``confidence(outputs)`` is a float64 numpy array of shape ``[N]``, finite, within
    [0, 1] (on K=3 and on binary K=2 outputs)."""
    for k in (K, 2):
        where = "" if k == K else " on binary outputs (K=2)"
        rec, ev = _fit(s, s.make(), _fit_data(k)), _eval_data(k)
        conf = _call(f"confidence(outputs){where}", rec.confidence, ev)
        _check_array(f"confidence(outputs){where}", conf, len(ev), np.float64, low=0.0,
                     high=1.0)


@_check("recalibrator")
def check_predict_output(s: _Subject) -> None:
    """``predict(outputs)`` is an int64 numpy array of shape ``[N]`` of classes in [0, K)
    (on K=3 and on binary K=2 outputs)."""
    for k in (K, 2):
        where = "" if k == K else " on binary outputs (K=2)"
        rec, ev = _fit(s, s.make(), _fit_data(k)), _eval_data(k)
        pred = _call(f"predict(outputs){where}", rec.predict, ev)
        _check_array(f"predict(outputs){where}", pred, len(ev), np.int64, classes=k)


@_check("selector")
def check_score_output(s: _Subject) -> None:
    """``score(outputs, confidence)`` is a float64 numpy array of shape ``[N]``, finite."""
    sel, ev = _fit(s, s.make(), _fit_data()), _eval_data()
    score = _call("score(outputs, confidence)", sel.score, ev, ev.confidence())
    _check_array("score(outputs, confidence)", score, len(ev), np.float64)


@_check("selector", "recalibrator")
def check_outputs_are_per_example(s: _Subject) -> None:
    """Each example's output depends on that example only: given half of the rows in a
    shuffled order, a fitted plugin returns, for each of them, its value on all the rows (to
    1e-6; no statistics of the batch, no dependence on the order)."""
    obj, ev = _fit(s, s.make(), _fit_data()), _eval_data()
    rows = np.random.default_rng(0).permutation(len(ev))[: len(ev) // 2]
    base, part = _observe(s, obj, ev), _observe(s, obj, ev.subset(rows))
    for key, value in base.items():
        value, other = np.asarray(value), np.asarray(part[key])
        if value.shape != (len(ev),):
            raise _Broken(f"{key} returned shape {value.shape} for {len(ev)} examples")
        tol = 0.0 if key.startswith("predict") else FLOAT_TOL
        if not _equal(value[rows], other, tol):
            raise _Broken(f"{key} on a shuffled half of the rows is not those rows' values on "
                          f"all of them ({_diff(value[rows], other, tol)}, all rows vs the "
                          "half); an example's output must depend on that example only")


@_check("selector", "recalibrator")
def check_unfitted(s: _Subject) -> None:
    """Before ``fit``, ``confidence`` / ``score`` either raise a ``ValueError`` saying the
    plugin is not fitted (scikit-learn's ``NotFittedError`` is one) or, for a plugin that works
    unfitted, return a valid result; a recalibrator's ``usable_unfitted`` says which (True:
    works unfitted, False: raises, None: either). Any other exception is an error."""
    obj, ev = s.make(), _eval_data()
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
                raise _Broken(f"declares usable_unfitted = True, but {what} before fit raised "
                              f"{_exc(exc)}") from exc
            continue
        except Exception as exc:
            raise _Broken(
                f"{what} before fit raised {_exc(exc)}; expected sklearn.exceptions."
                "NotFittedError (or another ValueError) saying it is not fitted"
                + ("" if declared is False else ", or a valid result")) from exc
        if declared is False:
            raise _Broken(f"declares usable_unfitted = False, but {what} before fit returned "
                          f"{_brief(result)} instead of raising sklearn.exceptions."
                          "NotFittedError")
        if what.startswith("predict"):
            _check_array(f"{what} before fit", result, len(ev), np.int64, classes=K)
        elif what.startswith("confidence"):
            _check_array(f"{what} before fit", result, len(ev), np.float64, low=0.0, high=1.0)
        else:
            _check_array(f"{what} before fit", result, len(ev), np.float64)


@_check("selector", "recalibrator")
def check_rejects_non_model_outputs(s: _Subject) -> None:
    """``fit`` and ``confidence`` / ``score`` given something other than
    ``selbench.ModelOutputs`` (here the logits array) raise a ``TypeError`` or ``ValueError``
    whose message names ``outputs``."""
    fit, ev = _fit_data(), _eval_data()
    errors = (TypeError, ValueError)
    if s.kind == "recalibrator":
        _expect_error("fit(<ndarray>, context)", s.make().fit, fit.logits, _ctx(),
                      types=errors, names=("outputs",))
        rec = _fit(s, s.make(), fit)
        _expect_error("confidence(<ndarray>)", rec.confidence, ev.logits, types=errors,
                      names=("outputs",))
        return
    if not _is_trainable(s.probe):
        _expect_error("fit(<ndarray>, confidence, context)", s.make().fit, fit.logits,
                      fit.confidence(), _ctx(), types=errors, names=("outputs",))
    sel = _fit(s, s.make(), fit)
    _expect_error("score(<ndarray>, confidence)", sel.score, ev.logits, ev.confidence(),
                  types=errors, names=("outputs",))


@_check("recalibrator")
def check_predict_rejects_non_model_outputs(s: _Subject) -> None:
    """``predict`` given something other than ``selbench.ModelOutputs`` (here the logits
    array) raises a ``TypeError`` or ``ValueError`` whose message names ``outputs``."""
    rec = _fit(s, s.make(), _fit_data())
    _expect_error("predict(<ndarray>)", rec.predict, _eval_data().logits,
                  types=(TypeError, ValueError), names=("outputs",))


@_check("selector", "recalibrator")
def check_rejects_empty_outputs(s: _Subject) -> None:
    """Fitting on outputs with no rows raises a ``ValueError`` whose message names
    ``outputs`` (a trainable selector: ``init_module``)."""
    empty = _fit_data().subset(np.zeros(0, dtype=np.int64))
    obj = s.make()
    if s.kind == "recalibrator":
        _expect_error("fit(<outputs with 0 rows>, context)", obj.fit, empty, _ctx(),
                      names=("outputs",))
    elif _is_trainable(obj):
        _expect_error("init_module(<outputs with 0 rows>, context)", obj.init_module, empty,
                      _ctx(), names=("outputs",))
    else:
        _expect_error("fit(<outputs with 0 rows>, confidence, context)", obj.fit, empty,
                      np.zeros(0), _ctx(), names=("outputs",))


@_check("selector")
def check_rejects_confidence_of_wrong_length(s: _Subject) -> None:
    """``score`` and ``fit`` given a confidence array whose length is not the number of rows
    of ``outputs`` raise a ``ValueError`` whose message names ``confidence``."""
    fit, ev = _fit_data(), _eval_data()
    if not _is_trainable(s.probe):
        _expect_error(f"fit(outputs, <confidence of length {len(fit) + 3}>, context)",
                      s.make().fit, fit, np.full(len(fit) + 3, 0.5), _ctx(),
                      names=("confidence",))
    sel = _fit(s, s.make(), fit)
    _expect_error(f"score(outputs, <confidence of length {len(ev) - 1}>) for {len(ev)} rows",
                  sel.score, ev, ev.confidence()[:-1], names=("confidence",))


@_check("selector", "recalibrator")
def check_rejects_other_feature_width(s: _Subject) -> None:
    """After fitting on features of width d, outputs with features of width d-1 either raise
    a ``ValueError`` whose message names ``features`` or give exactly the outputs of the
    original features (the plugin does not read them)."""
    obj, ev = _fit(s, s.make(), _fit_data()), _eval_data()
    narrow = ModelOutputs(features=ev.features[:, :-1], logits=ev.logits, labels=ev.labels,
                          domain=ev.domain)
    expected = _observe(s, obj, ev)
    conf = ev.confidence()
    calls = ([("confidence", obj.confidence, (narrow,)), ("predict", obj.predict, (narrow,))]
             if s.kind == "recalibrator" else [("score", obj.score, (narrow, conf))])
    for (what, fn, args), value in zip(calls, expected.values()):
        call = f"{what}(<outputs with d={D - 1} features>) after fitting on d={D}"
        try:
            got = fn(*args)
        except ValueError as exc:
            if "features" not in str(exc):
                raise _Broken(f"{call} raised ValueError({str(exc)!r}), whose message does not "
                              "name 'features'") from exc
            continue
        except Exception as exc:
            raise _Broken(f"{call} raised {_exc(exc)}; expected a ValueError whose message "
                          "names 'features'") from exc
        if not _equal(value, got):
            raise _Broken(f"{call} neither raised a ValueError naming 'features' nor ignored "
                          f"the features ({_diff(value, got)} against the original outputs)")


# ---------------------------------------------------------------------------- clone / pickle
def _loss_inputs(seed: int = 0, b: int = 24, k: int = K) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    g = torch.rand(b, generator=gen) * 0.9 + 0.05
    conf = torch.rand(b, generator=gen) * 0.69 + 0.3
    correct = (torch.rand(b, generator=gen) < 0.7).float()
    log_probs = torch.log_softmax(torch.randn(b, k, generator=gen), -1)
    labels = torch.randint(0, k, (b,), generator=gen)
    label_lp = log_probs.gather(1, labels[:, None]).squeeze(1)
    return {"g": g, "confidence": conf, "correct": correct, "label_log_prob": label_lp}


def _loss_value(loss: Any, inputs: dict[str, Any] | None = None, *, grad: bool = False):
    """``loss(...)`` on fixed inputs; with ``grad`` also the gradients in g (and confidence)."""
    inputs = _loss_inputs() if inputs is None else inputs
    leaf = (lambda t: t.clone().requires_grad_()) if grad else (lambda t: t)
    g = leaf(inputs["g"])
    if isinstance(loss, CoverageLoss):
        what = "loss(g, beta=0.8)"
        value = _call(what, loss, g, 0.8)
        leaves = {"g": g}
    else:
        what = "loss(g, confidence, correct, label_log_prob)"
        conf, label_lp = leaf(inputs["confidence"]), leaf(inputs["label_log_prob"])
        value = _call(what, loss, g, conf, inputs["correct"], label_lp)
        # what h's training reads: the label's log-probability for a loss that needs it
        # (S-MCE), else the confidence
        if getattr(loss, "needs_log_probs", False):
            leaves = {"g": g, "label_log_prob": label_lp}
        else:
            leaves = {"g": g, "confidence": conf}
    return what, value, leaves


def _scheme_observe(s: _Subject, scheme: Any, seed: int = 0, beta: float = 0.8,
                    data_seed: int = 10) -> dict[str, Any]:
    """Fit fresh companions with ``scheme`` and return what they output on evaluation data."""
    outputs = make_outputs(N_FIT, K, D, seed=data_seed)
    comp = _companions(type(scheme))
    _call("fit(outputs, selector=..., recalibrator=..., loss=..., coverage=..., context=...)",
          scheme.fit, outputs, **comp, context=_ctx(seed, beta))
    return _companion_outputs(comp, _eval_data())


def _companions(cls: type) -> dict[str, Any]:
    """Built-in companions a scheme of class ``cls`` can fit, from its declared capabilities."""
    requires = set(getattr(cls, "requires", ()) or ())
    if getattr(cls, "selector_must_be_trainable", None) is True:
        selector = _builtin("selector", "mlp", _MLP_SELECTOR)
    else:
        selector = _builtin("selector", "confidence")
    if getattr(cls, "fits_recalibrator", True) is False:
        recalibrator = _builtin("recalibrator", "none")
    else:
        recalibrator = _builtin("recalibrator", "temperature")
    return {
        "selector": selector,
        "recalibrator": recalibrator,
        "loss": _builtin("loss", "s-tlbce") if "loss" in requires else None,
        "coverage": _builtin("loss", "quadratic") if "coverage" in requires else None,
    }


def _companion_outputs(comp: dict[str, Any], outputs: ModelOutputs) -> dict[str, Any]:
    conf = _call("the fitted recalibrator's confidence(outputs)", comp["recalibrator"].confidence,
                 outputs)
    score = _call("the fitted selector's score(outputs, confidence)", comp["selector"].score,
                  outputs, conf)
    return {"recalibrator confidence": conf, "selector score": score}


def _fitted_and_observed(s: _Subject) -> tuple[Any, dict[str, Any]]:
    """A fitted (or, for losses and schemes, used) plugin and what it gives."""
    obj = s.make()
    if s.kind == "loss":
        return obj, {"loss value": _loss_value(obj)[1].detach().numpy()}
    if s.kind == "scheme":
        return obj, _scheme_observe(s, obj)
    return _fit(s, obj, _fit_data()), _observe(s, obj, _eval_data())


def _observe_again(s: _Subject, obj: Any) -> dict[str, Any]:
    """What a copy of a fitted plugin gives (a loss: its value; a scheme: a new fit)."""
    if s.kind == "loss":
        return {"loss value": _loss_value(obj)[1].detach().numpy()}
    if s.kind == "scheme":
        return _scheme_observe(s, obj)
    return _observe(s, obj, _eval_data())


def _refit(s: _Subject, obj: Any) -> dict[str, Any]:
    if s.kind in ("loss", "scheme"):
        return _observe_again(s, obj)
    return _observe(s, _fit(s, obj, _fit_data()), _eval_data())


@_check("selector", "recalibrator", "loss", "scheme")
def check_clone(s: _Subject) -> None:
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
        raise _Broken(f"{what} raised {_exc(exc).rstrip('.')}{hint}") from exc
    if twin is fitted or type(twin) is not type(fitted):
        raise _Broken(f"{what} returned {_brief(twin)}, expected a new "
                      f"{type(fitted).__name__}")
    kept = _learned(twin)
    if kept:
        raise _Broken(f"{what} kept learned state ({', '.join(kept)}); __init__ must set "
                      "hyperparameters only")
    params = _call("get_params()", fitted.get_params, deep=False)
    twin_params = _call("get_params() of the clone", twin.get_params, deep=False)
    if params.keys() != twin_params.keys():
        raise _Broken(f"the clone's get_params() has keys {sorted(twin_params)}, the "
                      f"original's {sorted(params)}")
    for key, value in params.items():
        if not _same(value, twin_params[key]):
            raise _Broken(f"the clone's get_params()[{key!r}] is {twin_params[key]!r}, the "
                          f"original's {value!r}")
    for key, value in s.params.items():
        if key not in params:
            raise _Broken(f"get_params() has no {key!r}, but the plugin was built with "
                          f"{key}={value!r}")
        if not _same(params[key], value):
            raise _Broken(f"get_params()[{key!r}] is {params[key]!r}, but the plugin was built "
                          f"with {key}={value!r}")
    _same_observations(expected, _refit(s, twin), "refitting the clone the same way")


@_check("selector", "recalibrator", "loss", "scheme")
def check_pickle(s: _Subject) -> None:
    """A fitted plugin survives ``pickle.dumps`` / ``pickle.loads`` and the copy gives
    exactly the original's outputs (what the runner needs to cache and hand plugins to
    worker processes)."""
    fitted, expected = _fitted_and_observed(s)
    if s.kind == "scheme":  # a used scheme's copy must fit new companions the same way
        expected = _scheme_observe(s, s.make())
    blob = _call(f"pickle.dumps(<fitted {s.kind}>)", pickle.dumps, fitted)
    twin = _call(f"pickle.loads(pickle.dumps(<fitted {s.kind}>))", pickle.loads, blob)
    _same_observations(expected, _observe_again(s, twin), "the unpickled copy")


# ---------------------------------------------------------------------------- trainable parts
@_check("selector", applies=_trainable)
def check_trainable_protocol(s: _Subject) -> None:
    """A trainable selector implements ``inputs(outputs)`` (float32 ``[N, d_in]``, read
    after the optional ``fit_inputs(outputs, context)``) and ``init_module(outputs,
    context)``, which stores in ``module_`` and returns a ``torch.nn.Module`` whose
    initial weights depend on ``context.seed`` only and which maps ``[B, d_in]`` to ĝ
    ``[B]`` in [0, 1]."""
    import torch

    sel, fit = s.make(), _fit_data()
    for method in ("inputs", "init_module"):
        if not callable(getattr(sel, method, None)):
            raise _Broken(f"is a TrainableSelector but has no {method}() method; a "
                          "trainable selector implements inputs(outputs) and "
                          "init_module(outputs, context)")
    _call("fit_inputs(outputs, context)", sel.fit_inputs, fit, _ctx())  # as a scheme does
    x = _call("inputs(outputs)", sel.inputs, fit)
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 2 \
            or x.shape[0] != len(fit):
        got = _brief(x)
        raise _Broken(f"inputs(outputs) returned {got}, expected a float32 ndarray of shape "
                      f"({len(fit)}, d_in)")
    module = _call("init_module(outputs, context)", sel.init_module, fit, _ctx())
    if not isinstance(module, torch.nn.Module):
        raise _Broken(f"init_module(outputs, context) returned {_brief(module)}, expected a "
                      "torch.nn.Module")
    if getattr(sel, "module_", None) is not module:
        raise _Broken("init_module(outputs, context) did not store the module it returned as "
                      "module_ (score() reads the trained module from there)")
    again = _call("init_module(outputs, context)", s.make().init_module, fit, _ctx())
    for (name, a), b in zip(module.state_dict().items(), again.state_dict().values()):
        if not torch.equal(a, b):
            raise _Broken(f"two init_module calls with FitContext(seed=0) gave different initial "
                          f"weights ({name}); seed them from context.seed")
    with torch.no_grad():
        g = _call("module_(inputs)", module, torch.tensor(x))
    if not isinstance(g, torch.Tensor) or tuple(g.shape) != (len(fit),):
        raise _Broken(f"module_(inputs [{len(fit)}, d_in]) returned "
                      f"{tuple(g.shape) if isinstance(g, torch.Tensor) else _brief(g)}, "
                      f"expected a tensor of shape ({len(fit)},)")
    _check_array("module_(inputs)", g.double().numpy(), len(fit), np.float64, low=0.0,
                 high=1.0)


def _fit_many_jobs(s: _Subject, scheme_name: str, *, train_selector: bool):
    """Fit the replicas ``_CELLS`` with ``Scheme.fit_many`` and one by one with
    ``Scheme.fit``; returns both lists of observations on evaluation data."""
    ev = _eval_data()
    datas = {data_seed: make_outputs(N_FIT, K, D, seed=data_seed) for _, _, data_seed in _CELLS}
    results = []
    for batched in (False, True):
        jobs = []
        for seed, beta, data_seed in _CELLS:
            if s.kind == "selector":
                selector, recalibrator = s.make(), _builtin("recalibrator", "none")
            elif train_selector:
                selector, recalibrator = _builtin("selector", "mlp", _MLP_SELECTOR), s.make()
            else:
                selector, recalibrator = _builtin("selector", "confidence"), s.make()
            loss = _builtin("loss", "s-tlbce") if scheme_name != "recalibration" else None
            coverage = _builtin("loss", "quadratic") if scheme_name != "recalibration" else None
            jobs.append(FitJob(datas[data_seed], selector, recalibrator, loss, coverage,
                               _ctx(seed, beta)))
        params = None if scheme_name == "recalibration" else _TRAINING
        scheme = _builtin("scheme", scheme_name, params)
        if batched:
            got = _call(f"scheme {scheme_name!r} fit_many(jobs)", scheme.fit_many, jobs)
            if got is not scheme:
                raise _Broken(f"scheme {scheme_name!r} fit_many returned {_brief(got)}")
            _shared_state(jobs, s.kind)
        else:
            for job in jobs:
                _call(f"scheme {scheme_name!r} fit(outputs, ...)", scheme.fit, job.outputs,
                      selector=job.selector, recalibrator=job.recalibrator, loss=job.loss,
                      coverage=job.coverage, context=job.context)
        results.append([_companion_outputs({"selector": j.selector,
                                            "recalibrator": j.recalibrator}, ev)
                        for j in jobs])
    return results


def _compare_replicas(prefix: str, results) -> None:
    solo, batched = results
    for i, (a, b) in enumerate(zip(solo, batched)):
        seed, beta, _ = _CELLS[i]
        for key, value in a.items():
            if not _equal(value, b[key], FIT_MANY_TOL):
                raise _Broken(
                    f"{prefix}replica {i} (seed {seed}, beta {beta}) fitted by "
                    f"fit_many gives a different {key} than fitted alone by fit "
                    f"({_diff(value, b[key], FIT_MANY_TOL)}; tolerance {FIT_MANY_TOL:g}); "
                    "fit_many must leave every replica as its own fit would")


@_check("selector")
def check_fit_many_equals_fit(s: _Subject) -> None:
    """Fitting replicas (two seeds x two training betas) together with ``Scheme.fit_many``
    leaves each exactly (to 1e-5) as fitting it alone with ``Scheme.fit`` (trainable
    selector: scheme ``selection``; any other selector, through its class's
    ``Selector.fit_many``, and recalibrator: scheme ``recalibration``), each job owning its
    state."""
    if s.kind == "selector" and _is_trainable(s.probe):
        _compare_replicas("scheme 'selection': ",
                          _fit_many_jobs(s, "selection", train_selector=True))
    else:
        _compare_replicas("scheme 'recalibration': ",
                          _fit_many_jobs(s, "recalibration", train_selector=False))


# the same check applies to every recalibrator (the recalibration scheme fits them together)
_REGISTRY.append(_Spec("check_fit_many_equals_fit", ("recalibrator",), check_fit_many_equals_fit,
                       _always))


@_check("recalibrator", applies=_differentiable)
def check_joint_fit_many_equals_fit(s: _Subject) -> None:
    """A differentiable recalibrator trained jointly with a learned selector (scheme
    ``joint``) ends the same (to 1e-5) whether its replicas are trained together by
    ``fit_many`` or one by one by ``fit``."""
    _compare_replicas("scheme 'joint': ", _fit_many_jobs(s, "joint", train_selector=True))


@_check("recalibrator", applies=_differentiable)
def check_module_protocol(s: _Subject) -> None:
    """A differentiable recalibrator's ``module(outputs, context)`` returns its own live
    ``torch.nn.Module`` (the same object on every call); ``forward(logits, features)`` returns
    ``(confidence [B] in [0, 1], log_probs [B, K] or None)`` with the confidence equal to
    ``confidence(outputs)`` (to 1e-6), log-probabilities that exponentiate to a distribution
    and are present exactly when ``provides_log_probs`` says so; ``confidence`` follows
    changes made to the module's parameters in place (a scheme trains it so)."""
    import torch

    fit, ev = _fit_data(), _eval_data()
    rec = _fit(s, s.make(), fit)
    module = _call("module(outputs, context)", rec.module, fit, _ctx())
    if not isinstance(module, torch.nn.Module):
        raise _Broken(f"module(outputs, context) returned {_brief(module)}, expected a "
                      "torch.nn.Module")
    if _call("module(outputs, context)", rec.module, fit, _ctx()) is not module:
        raise _Broken("module(outputs, context) returned a new object on a second call; it "
                      "must return the recalibrator's own live module, not a copy")

    def forward() -> tuple[np.ndarray, Any]:
        module.eval()
        with torch.no_grad():
            out = _call("module(logits, features)", module, torch.tensor(ev.logits),
                        torch.tensor(ev.features))
        if not (isinstance(out, tuple) and len(out) == 2):
            raise _Broken(f"module(logits, features) returned {_brief(out)}, expected a tuple "
                          "(confidence [B], log_probs [B, K] or None)")
        return out[0].double().numpy(), out[1]

    conf_m, log_probs = forward()
    _check_array("module(logits, features)[0]", conf_m, len(ev), np.float64, low=0.0,
                 high=1.0)
    conf = _call("confidence(outputs)", rec.confidence, ev)
    if not _equal(conf_m, conf, FLOAT_TOL):
        raise _Broken("the module's confidence differs from confidence(outputs) "
                      f"({_diff(conf_m, conf, FLOAT_TOL)}); confidence must be computed by the "
                      "module module() returns")
    declared = getattr(type(rec), "provides_log_probs", None)
    if log_probs is None and declared is True:
        raise _Broken("declares provides_log_probs = True, but the module returned "
                      "log_probs None")
    if log_probs is not None:
        if declared is False:
            raise _Broken("declares provides_log_probs = False, but the module returned "
                          "log-probabilities")
        if tuple(log_probs.shape) != (len(ev), ev.num_classes):
            raise _Broken(f"the module's log_probs have shape {tuple(log_probs.shape)}, "
                          f"expected ({len(ev)}, {ev.num_classes})")
        total = torch.logsumexp(log_probs.double(), -1).numpy()
        if not _equal(total, np.zeros(len(ev)), 1e-4):
            raise _Broken("the module's log_probs do not exponentiate to a distribution "
                          f"(log-sum-exp per row: {_diff(total, np.zeros(len(ev)), 1e-4)})")
    if getattr(module, "changes_prediction", False):
        with torch.no_grad():
            pred = _call("module.predict(logits, features)", module.predict,
                         torch.tensor(ev.logits), torch.tensor(ev.features))
        pred = np.asarray(pred.cpu().numpy() if isinstance(pred, torch.Tensor) else pred)
        expected = _call("predict(outputs)", rec.predict, ev)
        if not _equal(pred, expected):
            raise _Broken("the module's predict differs from predict(outputs) "
                          f"({_diff(pred, expected)})")
    params = list(module.parameters())
    if params:
        with torch.no_grad():
            for p in params:
                p.add_(0.05)
        moved, _ = forward()
        now = _call("confidence(outputs)", rec.confidence, ev)
        if not _equal(moved, now, FLOAT_TOL):
            raise _Broken("after the module's parameters were changed in place, "
                          f"confidence(outputs) did not follow ({_diff(moved, now, FLOAT_TOL)}); "
                          "it must read the live module that module() returns")


# ---------------------------------------------------------------------------- losses
@_check("loss")
def check_loss_value(s: _Subject) -> None:
    """A loss returns a finite scalar (0-d) floating tensor that is differentiable, with finite
    gradients, in ĝ and, for a selection loss, in what trains h: the confidence, or the
    log-probabilities for a loss that ``needs_log_probs``."""
    import torch

    what, value, leaves = _loss_value(s.make(), grad=True)
    if not isinstance(value, torch.Tensor):
        raise _Broken(f"{what} returned {_brief(value)}, expected a torch.Tensor")
    if value.dim() != 0 or not value.is_floating_point():
        raise _Broken(f"{what} returned a {value.dtype} tensor of shape {tuple(value.shape)}, "
                      "expected a floating scalar (shape ())")
    if not torch.isfinite(value):
        raise _Broken(f"{what} returned {value.item()}, expected a finite value")
    if not value.requires_grad:
        raise _Broken(f"{what} is not differentiable (its result does not require grad)")
    _call(f"{what}.backward()", value.backward)
    for name, leaf in leaves.items():
        if leaf.grad is None:
            raise _Broken(f"{what} is not differentiable in {name} (no gradient reached it)")
        if not torch.isfinite(leaf.grad).all():
            raise _Broken(f"the gradient of {what} in {name} is not finite")


@_check("loss")
def check_loss_is_deterministic(s: _Subject) -> None:
    """A loss gives the same value twice on the same inputs and leaves its inputs unchanged."""
    loss = s.make()
    inputs = _loss_inputs()
    snap = _Snapshot(lambda: {k: v.numpy() for k, v in inputs.items()})
    what, first, _ = _loss_value(loss, inputs)
    snap.unchanged(what)
    _, second, _ = _loss_value(loss, inputs)
    if not _equal(first.detach().numpy(), second.detach().numpy()):
        raise _Broken(f"{what} gave {first.item()} then {second.item()} on the same inputs")


@_check("loss", applies=_selection_loss)
def check_loss_rejects_mismatched_shapes(s: _Subject) -> None:
    """A selection loss given a confidence whose shape differs from ĝ's raises a
    ``ValueError`` whose message names ``confidence``."""
    inputs = _loss_inputs()
    _expect_error("loss(g [24], <confidence [23]>, correct [24])", s.make(), inputs["g"],
                  inputs["confidence"][:-1], inputs["correct"], inputs["label_log_prob"],
                  names=("confidence",))


@_check("loss")
def check_loss_replica_rows(s: _Subject) -> None:
    """Called on ``[R, B]`` tensors (R replicas, as the training engine calls it), a loss
    returns ``[R]`` whose entry r is its value on row r alone (to 1e-5); a coverage loss
    takes one β per replica."""
    import torch

    loss = s.make()
    replicas = [_loss_inputs(seed) for seed in range(3)]
    solo = [_loss_value(loss, inputs)[1].detach() for inputs in replicas]

    def stack(key: str) -> torch.Tensor:
        return torch.stack([inputs[key] for inputs in replicas])

    if isinstance(loss, CoverageLoss):
        what = "loss(g [R, B], beta [R])"
        together = _call(what, loss, stack("g"), torch.full((3,), 0.8))
    else:
        what = "loss(g [R, B], confidence [R, B], correct [R, B], label_log_prob [R, B])"
        together = _call(what, loss, stack("g"), stack("confidence"), stack("correct"),
                         stack("label_log_prob"))
    if not isinstance(together, torch.Tensor) or tuple(together.shape) != (3,):
        raise _Broken(f"{what} returned {_brief(together)}, expected a tensor of shape (3,): "
                      "reduce over the last dimension only (e.g. .mean(-1))")
    expected = torch.stack(solo).double().numpy()
    got = together.detach().double().numpy()
    if not _equal(expected, got, FIT_MANY_TOL):
        raise _Broken(f"{what} differs from its value on each row alone "
                      f"({_diff(expected, got, FIT_MANY_TOL)})")


# ---------------------------------------------------------------------------- schemes
@_check("scheme")
def check_scheme_fit_returns_self(s: _Subject) -> None:
    """``fit(outputs, selector=..., recalibrator=..., loss=..., coverage=..., context=...)``
    returns the scheme itself and leaves the selector and recalibrator fitted."""
    scheme, outputs = s.make(), _fit_data()
    comp = _companions(type(scheme))
    got = _call("fit(outputs, selector=..., ...)", scheme.fit, outputs, **comp,
                context=_ctx())
    if got is not scheme:
        raise _Broken(f"fit(outputs, selector=..., ...) returned {_brief(got)}, expected the "
                      "scheme itself (end fit with `return self`)")
    _companion_outputs(comp, _eval_data())


@_check("scheme")
def check_scheme_is_deterministic(s: _Subject) -> None:
    """Two fits with the same ``FitContext(seed=...)`` leave the selector and recalibrator
    with identical outputs."""
    first = _scheme_observe(s, s.make())
    second = _scheme_observe(s, s.make())
    for key, value in first.items():
        if not _equal(value, second[key]):
            raise _Broken(f"two fits with FitContext(seed=0) gave a different {key} "
                          f"({_diff(value, second[key])}); seed all randomness from "
                          "context.seed")


@_check("scheme")
def check_scheme_does_not_mutate_inputs(s: _Subject) -> None:
    """``fit`` leaves the outputs' arrays and the ``FitContext`` unchanged."""
    scheme, outputs, context = s.make(), _fit_data(), _ctx()
    snap = _Snapshot(lambda: {**_outputs_arrays(outputs), **_context_fields(context)})
    _call("fit(outputs, selector=..., ...)", scheme.fit, outputs,
          **_companions(type(scheme)), context=context)
    snap.unchanged("fit(outputs, selector=..., ...)")


@_check("scheme")
def check_scheme_fit_many_equals_fit(s: _Subject) -> None:
    """``fit_many(jobs)`` returns the scheme and leaves every job's selector and recalibrator
    as ``fit`` of that job alone would (to 1e-5), each job owning its state."""
    ev = _eval_data()
    results = []
    for batched in (False, True):
        jobs = [FitJob(make_outputs(N_FIT, K, D, seed=data_seed), context=_ctx(seed, beta),
                       **_companions(s.cls))
                for seed, beta, data_seed in _CELLS]
        scheme = s.make()
        if batched:
            got = _call("fit_many(jobs)", scheme.fit_many, jobs)
            if got is not scheme:
                raise _Broken(f"fit_many(jobs) returned {_brief(got)}, expected the scheme "
                              "itself")
            _shared_state(jobs, "selector")
            _shared_state(jobs, "recalibrator")
        else:
            for job in jobs:
                _call("fit(outputs, ...)", scheme.fit, job.outputs, selector=job.selector,
                      recalibrator=job.recalibrator, loss=job.loss, coverage=job.coverage,
                      context=job.context)
        results.append([_companion_outputs({"selector": j.selector,
                                            "recalibrator": j.recalibrator}, ev)
                        for j in jobs])
    _compare_replicas("", results)


# ---------------------------------------------------------------------------- datasets
def _dataset(s: _Subject) -> Any:
    try:
        return s.factory()
    except FileNotFoundError as exc:
        raise CheckSkipped(f"data not available: {_exc(exc)}") from exc
    except Exception as exc:
        raise _Broken(f"building the plugin raised {_exc(exc)}") from exc


def _attr(ds: Any, name: str) -> Any:
    """``ds.<name>`` (None when absent); a missing data file skips the check."""
    try:
        return getattr(ds, name, None)
    except FileNotFoundError as exc:
        raise CheckSkipped(f"data not available: {_exc(exc)}") from exc
    except Exception as exc:
        raise _Broken(f"reading {name} raised {_exc(exc)}") from exc


def _split(ds: Any, name: str) -> Any:
    try:
        return ds.split(name)
    except FileNotFoundError as exc:
        raise CheckSkipped(f"data not available: {_exc(exc)}") from exc
    except Exception as exc:
        raise _Broken(f"split({name!r}) raised {_exc(exc)}") from exc


def _splits(ds: Any) -> list[str]:
    try:
        names = ds.splits()
    except FileNotFoundError as exc:
        raise CheckSkipped(f"data not available: {_exc(exc)}") from exc
    except Exception as exc:
        raise _Broken(f"splits() raised {_exc(exc)}") from exc
    if not isinstance(names, (list, tuple)) or not names \
            or not all(isinstance(n, str) for n in names):
        raise _Broken(f"splits() returned {names!r}, expected a non-empty list of split names")
    if len(set(names)) != len(names):
        raise _Broken(f"splits() names a split twice: {list(names)}")
    return list(names)


@_check("dataset")
def check_dataset_splits(s: _Subject) -> None:
    """``splits()`` is a non-empty list of distinct names and ``num_classes`` an integer
    K >= 2."""
    ds = _dataset(s)
    _splits(ds)
    k = _attr(ds, "num_classes")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 2:
        raise _Broken(f"num_classes is {k!r}, expected an integer K >= 2")


@_check("dataset")
def check_dataset_split_contract(s: _Subject) -> None:
    """Every ``split(name)`` returns a ``SplitData`` whose ``labels`` are an integer array
    ``[N]`` in [0, K), whose ``inputs`` hold N examples of the declared ``input_kind``
    (``vectors``: a float array ``[N, p]``; ``image-array``: a numeric array ``[N, C, H, W]``
    or ``[N, H, W]``; ``model-outputs``: ``ModelOutputs`` with these labels; ``image-items``:
    a dataset of ``(uint8 [3, H, W] tensor, label)`` items) and whose ``domain`` is None or
    ``[N]``. A missing file raises ``FileNotFoundError`` (the check is then skipped)."""
    ds = _dataset(s)
    k = int(_attr(ds, "num_classes") or 0)
    kind = getattr(type(ds), "input_kind", None)
    for name in _splits(ds):
        where = f"split({name!r})"
        data = _split(ds, name)
        if not isinstance(data, SplitData):
            raise _Broken(f"{where} returned {_brief(data)}, expected a selbench.SplitData")
        labels = data.labels
        if not isinstance(labels, np.ndarray) or labels.ndim != 1 \
                or not np.issubdtype(labels.dtype, np.integer):
            raise _Broken(f"{where}.labels is {_brief(labels)}, expected an integer ndarray [N]")
        n = len(labels)
        _check_array(f"{where}.labels", labels.astype(np.int64), n, np.int64, classes=k)
        try:
            count = len(data.inputs)
        except TypeError:
            count = None
        if count != n:
            raise _Broken(f"{where}.inputs holds {count} examples but labels {n}")
        if data.domain is not None and np.shape(data.domain) != (n,):
            raise _Broken(f"{where}.domain has shape {np.shape(data.domain)}, expected ({n},)")
        _check_input_kind(where, kind, data, n)


def _check_input_kind(where: str, kind: str | None, data: SplitData, n: int) -> None:
    x = data.inputs
    if kind == "vectors":
        if not (isinstance(x, np.ndarray) and x.ndim == 2
                and np.issubdtype(x.dtype, np.floating)):
            raise _Broken(f"{where}.inputs is {_brief(x)}; input_kind 'vectors' means a float "
                          f"ndarray [N, p]")
    elif kind == "image-array":
        if not (isinstance(x, np.ndarray) and x.ndim in (3, 4)
                and np.issubdtype(x.dtype, np.number)):
            raise _Broken(f"{where}.inputs is {_brief(x)}; input_kind 'image-array' means a "
                          "numeric ndarray [N, C, H, W] or [N, H, W]")
    elif kind == "model-outputs":
        if not isinstance(x, ModelOutputs):
            raise _Broken(f"{where}.inputs is {_brief(x)}; input_kind 'model-outputs' means "
                          "selbench.ModelOutputs")
        if not _equal(x.labels, data.labels):
            raise _Broken(f"{where}.inputs.labels differ from {where}.labels "
                          f"({_diff(x.labels, data.labels)})")
    elif kind == "image-items" and n:
        import torch

        item = _call(f"{where}.inputs[0]", x.__getitem__, 0)
        ok = (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], torch.Tensor)
              and item[0].dtype == torch.uint8 and item[0].dim() == 3 and item[0].shape[0] == 3)
        if not ok:
            raise _Broken(f"{where}.inputs[0] is {_brief(item)}; input_kind 'image-items' means "
                          "(uint8 tensor [3, H, W], int label) items")
        if int(item[1]) != int(data.labels[0]):
            raise _Broken(f"{where}.inputs[0] has label {int(item[1])} but labels[0] is "
                          f"{int(data.labels[0])}")


@_check("dataset")
def check_dataset_is_deterministic(s: _Subject) -> None:
    """Two datasets built with the same params give the same labels (and array inputs) in
    every split."""
    first, second = _dataset(s), _dataset(s)
    for name in _splits(first):
        a, b = _split(first, name), _split(second, name)
        if not _equal(a.labels, b.labels):
            raise _Broken(f"two builds gave different split({name!r}).labels "
                          f"({_diff(a.labels, b.labels)})")
        if isinstance(a.inputs, np.ndarray) and not _equal(a.inputs, b.inputs):
            raise _Broken(f"two builds gave different split({name!r}).inputs "
                          f"({_diff(a.inputs, b.inputs)})")


@_check("dataset")
def check_dataset_rejects_unknown_split(s: _Subject) -> None:
    """``split(name)`` for a name not in ``splits()`` raises a ``KeyError`` or ``ValueError``
    whose message names the split."""
    ds = _dataset(s)
    _splits(ds)
    try:
        result = ds.split("no-such-split")
    except FileNotFoundError as exc:
        raise _Broken(f"split('no-such-split') raised {_exc(exc)}; expected a KeyError or "
                      "ValueError naming the split") from exc
    except (KeyError, ValueError) as exc:
        if "no-such-split" not in str(exc):
            raise _Broken(f"split('no-such-split') raised {_exc(exc)}, whose message does not "
                          "name the split") from exc
        return
    except Exception as exc:
        raise _Broken(f"split('no-such-split') raised {_exc(exc)}; expected a KeyError or "
                      "ValueError naming the split") from exc
    raise _Broken(f"split('no-such-split') returned {_brief(result)} instead of raising a "
                  "KeyError or ValueError")


# ---------------------------------------------------------------------------- backbones
class _SyntheticDataset(Dataset):
    """A tiny dataset of one input kind, for backbone checks (splits train / val / test)."""

    def __init__(self, input_kind: str, seed: int = 0):
        self.input_kind_ = input_kind
        rng = np.random.default_rng(seed)
        self._splits: dict[str, SplitData] = {}
        for name, n in (("train", 60), ("val", 30), ("test", 30)):
            if input_kind == "vectors":  # binary, like the paper's theory mixture
                self.num_classes = 2
                x = rng.normal(size=(n, 4))
                labels = (x[:, 0] + 0.5 * rng.normal(size=n) > 0).astype(np.int64)
            else:  # image-array: 8x8 grey images, three classes
                self.num_classes = 3
                labels = rng.integers(0, 3, n).astype(np.int64)
                x = rng.random((n, 1, 8, 8)).astype(np.float32)
                x[np.arange(n), 0, labels * 2, :] += 2.0
            domain = (np.arange(n) % 2).astype(np.int64)
            self._splits[name] = SplitData(inputs=x, labels=labels, domain=domain)

    def splits(self) -> list[str]:
        return list(self._splits)

    def split(self, name: str) -> SplitData:
        if name not in self._splits:
            raise KeyError(f"no split {name!r}")
        return self._splits[name]


#: the input kinds the kit can synthesise for backbone checks
SYNTHETIC_INPUT_KINDS = ("vectors", "image-array")


def _backbone_dataset(s: _Subject) -> _SyntheticDataset:
    kinds = getattr(s.cls, "input_kinds", None)
    for kind in SYNTHETIC_INPUT_KINDS:
        if kinds is not None and kind in kinds:
            return _SyntheticDataset(kind)
    raise CheckSkipped(
        f"the kit synthesises inputs of kinds {', '.join(SYNTHETIC_INPUT_KINDS)} only; it "
        f"declares input_kinds {sorted(kinds) if kinds is not None else None}")


def _extract(s: _Subject, backbone: Any, ds: Dataset, split: str) -> ModelOutputs:
    out = _call(f"extract(dataset, {split!r}, context)", backbone.extract, ds, split, _ctx())
    if not isinstance(out, ModelOutputs):
        raise _Broken(f"extract(dataset, {split!r}, context) returned {_brief(out)}, expected "
                      "selbench.ModelOutputs")
    return out


@_check("backbone")
def check_backbone_extract(s: _Subject) -> None:
    """``extract(dataset, split, context)`` returns ``ModelOutputs`` with one row per example
    of the split, the split's labels and K = ``dataset.num_classes`` logits, and leaves the
    split's arrays unchanged (checked on a tiny synthetic dataset of a declared input kind)."""
    ds = _backbone_dataset(s)
    backbone = s.make()
    for name in ("train", "test"):
        data = ds.split(name)
        snap = _Snapshot(lambda data=data: {"inputs": data.inputs, "labels": data.labels})
        out = _extract(s, backbone, ds, name)
        snap.unchanged(f"extract(dataset, {name!r}, context)")
        where = f"extract(dataset, {name!r}, context)"
        if len(out) != len(data.labels):
            raise _Broken(f"{where} returned {len(out)} rows for a split of "
                          f"{len(data.labels)} examples")
        if not _equal(out.labels, data.labels):
            raise _Broken(f"{where}.labels differ from the split's labels "
                          f"({_diff(out.labels, data.labels)})")
        if out.num_classes != ds.num_classes:
            raise _Broken(f"{where} returned K={out.num_classes} logits for a dataset of "
                          f"num_classes={ds.num_classes}")


@_check("backbone")
def check_backbone_is_deterministic(s: _Subject) -> None:
    """Two backbones built with the same params extract identical features and logits with
    the same ``FitContext(seed=...)``."""
    ds = _backbone_dataset(s)
    a = _extract(s, s.make(), ds, "test")
    b = _extract(s, s.make(), _backbone_dataset(s), "test")
    for name in ("features", "logits"):
        if not _equal(getattr(a, name), getattr(b, name)):
            raise _Broken(f"two backbones with the same params extracted different {name} "
                          f"({_diff(getattr(a, name), getattr(b, name))})")


@_check("backbone")
def check_backbone_rows(s: _Subject) -> None:
    """A backbone declaring ``shardable`` honours ``FitContext.rows``: the row ranges of a
    split, extracted one by one and concatenated, are the whole split's outputs bit for bit
    (same ``meta``). Skipped for a backbone that does not declare it."""
    if getattr(s.cls, "shardable", False) is not True:
        raise CheckSkipped("it does not declare shardable")
    ds = _backbone_dataset(s)
    backbone = s.make()
    whole = _extract(s, backbone, ds, "test")
    n = len(whole)
    for bounds in ((0, n // 3, n), (0, n - 1, n)):
        parts = []
        for rows in zip(bounds[:-1], bounds[1:]):
            what = f"extract(dataset, 'test', context) with FitContext.rows={rows}"
            out = _call(what, backbone.extract, ds, "test", FitContext(seed=0, rows=rows))
            if not isinstance(out, ModelOutputs):
                raise _Broken(f"{what} returned {_brief(out)}, expected selbench.ModelOutputs")
            if len(out) != rows[1] - rows[0]:
                raise _Broken(f"it declares shardable, but {what} returned {len(out)} rows, "
                              f"expected {rows[1] - rows[0]}")
            if out.meta != whole.meta:
                raise _Broken(f"{what}.meta differ from the whole split's meta (a shard's "
                              "meta must describe the whole split)")
            parts.append(out)
        for name in ("features", "logits", "labels", "domain"):
            want = getattr(whole, name)
            got = [getattr(p, name) for p in parts]
            if want is None or any(g is None for g in got):
                if not (want is None and all(g is None for g in got)):
                    raise _Broken(f"row ranges of split 'test' give {name} "
                                  f"{'None' if want is not None else 'arrays'} where the "
                                  "whole split does not")
                continue
            joined = np.concatenate(got)
            if not _equal(joined, want):
                raise _Broken(f"row ranges {bounds} of split 'test', concatenated, differ from "
                              f"the whole split's {name} ({_diff(joined, want)})")


# ---------------------------------------------------------------------------- public API
class Check:
    """One check of one plugin: call it to run it.

    Raises :class:`ConformanceError` when the plugin breaks the check's rule and
    :class:`CheckSkipped` when it cannot run (:func:`parametrize_with_checks` turns that into
    a pytest skip). Attributes: ``kind``, ``plugin`` (as in messages), ``name`` (the check's),
    ``rule`` (what it requires) and ``id`` (``kind-plugin-check``, for test ids).
    """

    def __init__(self, subject: _Subject, spec: _Spec | None, *, failure: str | None = None,
                 pytest_skip: bool = False):
        self._subject, self._spec, self._failure = subject, spec, failure
        self._pytest_skip = pytest_skip
        self.kind = subject.kind
        self.plugin = subject.label
        self.name = spec.name if spec is not None else "check_base_class"
        self.rule = spec.rule if spec is not None else "the plugin can be built"
        self.id = f"{subject.kind}-{subject.ident}-{self.name}"

    def __repr__(self) -> str:
        return f"<Check {self.id}>"

    def __call__(self) -> None:
        try:
            if self._failure is not None:
                raise _Broken(self._failure)
            self._spec.fn(self._subject)
        except _Broken as exc:
            raise ConformanceError(self.plugin, self.name, str(exc)) from exc.__cause__
        except CheckSkipped as exc:
            if self._pytest_skip:
                import pytest

                pytest.skip(f"{self.plugin}: {self.name}: {exc}")
            raise


def all_checks(kind: str) -> dict[str, str]:
    """Every check of ``kind`` (whether or not it applies to a given plugin) -> its rule."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    return {spec.name: spec.rule for spec in _REGISTRY if kind in spec.kinds}


def _specs(subject: _Subject) -> list[tuple[_Spec, str | None]]:
    """Every check of the subject's kind with None (applies) or why it does not."""
    return [(spec, spec.applies(subject) if subject.probe is not None else None)
            for spec in _REGISTRY if subject.kind in spec.kinds]


def plugin_checks(kind: str, plugin: Any, params: Mapping[str, Any] | None = None,
                  ) -> Iterator[tuple[str, Check]]:
    """Yield ``(check name, check)`` for every check that applies to ``plugin``.

    ``plugin`` is a registered name, a :class:`selbench.Plugin`, a factory (class) called as
    ``factory(**params)``, or an unfitted instance (then ``params`` must be empty). A check
    is a :class:`Check`: call it to run it. A plugin that cannot be built yields one failing
    ``check_base_class``. Unknown kinds and names raise ``ValueError`` /
    :class:`selbench.contract.registry.PluginError` here, before anything runs.
    """
    yield from ((c.name, c) for c in _checks(kind, plugin, params))


def _checks(kind: str, plugin: Any, params: Mapping[str, Any] | None, *,
            pytest_skip: bool = False) -> list[Check]:
    subject = _resolve(kind, plugin, params)
    try:
        subject.probe = subject.factory()
    except FileNotFoundError as exc:
        if kind not in ("dataset", "backbone"):  # their checks skip: data not available
            return [Check(subject, None, failure=f"building the plugin raised {_exc(exc)}",
                          pytest_skip=pytest_skip)]
    except Exception as exc:
        return [Check(subject, None, failure=f"building the plugin raised {_exc(exc)}",
                      pytest_skip=pytest_skip)]
    return [Check(subject, spec, pytest_skip=pytest_skip)
            for spec, why_not in _specs(subject) if why_not is None]


def check_plugin(kind: str, plugin: Any, params: Mapping[str, Any] | None = None, *,
                 checks: Iterable[str] | None = None, skip: Iterable[str] = ()) -> None:
    """Run every check that applies to ``plugin`` (see :func:`plugin_checks` for what
    ``plugin`` may be) and raise one :class:`ConformanceError` listing each broken rule.

    Args:
        kind: ``selector``, ``recalibrator``, ``loss``, ``scheme``, ``dataset`` or
            ``backbone``.
        plugin: a registered name, a :class:`selbench.Plugin`, a factory or an instance.
        params: keyword arguments of the factory (validated by the plugin's params model
            when ``plugin`` is a name or a :class:`selbench.Plugin`).
        checks: run only these checks (names as in :func:`all_checks`).
        skip: do not run these checks.

    Raises:
        ConformanceError: an ``AssertionError`` naming the plugin, every failed check and
            what was expected vs what happened (one line each).
        ValueError: unknown kind or check name, or a named check that does not apply.

    Checks that cannot run (a dataset's files are absent) are reported as
    :class:`ConformanceWarning` warnings.
    """
    found = _checks(kind, plugin, params)
    known = all_checks(kind)
    wanted = None if checks is None else list(checks)
    skip = list(skip)
    for name in (wanted or []) + skip:
        if name not in known:
            raise ValueError(f"unknown {kind} check {name!r}; {kind} checks are: "
                             f"{', '.join(known)}")
    if found and found[0]._spec is not None and wanted is not None:
        subject = found[0]._subject
        reasons = {spec.name: why for spec, why in _specs(subject)}
        for name in wanted:
            if reasons.get(name):
                raise ValueError(f"check {name!r} does not apply to {subject.label}: "
                                 f"{reasons[name]}")
    selected = [c for c in found
                if (wanted is None or c.name in wanted or c._spec is None) and c.name not in skip]
    failures: list[ConformanceError] = []
    for check in selected:
        try:
            check()
        except ConformanceError as exc:
            failures.append(exc)
        except CheckSkipped as exc:
            warnings.warn(ConformanceWarning(f"{check.plugin}: {check.name}: skipped: {exc}"),
                          stacklevel=2)
    if len(failures) == 1:
        raise failures[0]
    if failures:
        plugin_label = failures[0].plugin
        lines = "\n".join(f"  {exc}" for exc in failures)
        raise ConformanceError(
            plugin_label, None,
            f"broke {len(failures)} of {len(selected)} checks:\n{lines}", failures)


ExpectedFailures = Mapping[str, str] | Callable[[str, Any, str], "str | None"]


def _expected_reason(expected: ExpectedFailures | None, kind: str, plugin: Any,
                     check: Check) -> str | None:
    if expected is None:
        return None
    if callable(expected) and not isinstance(expected, Mapping):
        return expected(kind, plugin, check.name)
    return expected.get(check.id) or expected.get(check.name)


def parametrize_with_checks(plugins: Iterable[Sequence[Any]], *,
                            expected_failures: ExpectedFailures | None = None,
                            xfail_strict: bool = False):
    """A ``pytest.mark.parametrize`` decorator over every check of every plugin.

    Args:
        plugins: ``(kind, plugin)`` or ``(kind, plugin, params)`` entries, ``plugin`` as in
            :func:`plugin_checks`.
        expected_failures: checks known to fail, marked ``xfail`` (failing only with a
            :class:`ConformanceError`): a mapping from a check name (every plugin) or a test
            id ``kind-plugin-check`` to the reason, or a callable ``(kind, plugin, check
            name) -> reason or None``.
        xfail_strict: make an expected failure that passes fail the test.

    The test receives one argument, ``check``, to call; ids read
    ``recalibrator-temperature-check_pickle``::

        @parametrize_with_checks([("recalibrator", MyRecal), ("selector", MySel, {"k": 3})])
        def test_my_plugins(check):
            check()
    """
    import pytest

    params = []
    for entry in plugins:
        entry = tuple(entry)
        if len(entry) not in (2, 3):
            raise ValueError(f"plugins: expected (kind, plugin) or (kind, plugin, params), "
                             f"got {entry!r}")
        kind, plugin = entry[0], entry[1]
        options = entry[2] if len(entry) == 3 else None
        for check in _checks(kind, plugin, options, pytest_skip=True):
            reason = _expected_reason(expected_failures, kind, plugin, check)
            marks = ([pytest.mark.xfail(reason=reason, strict=xfail_strict,
                                        raises=ConformanceError)] if reason else [])
            params.append(pytest.param(check, id=check.id, marks=marks))
    return pytest.mark.parametrize("check", params)
