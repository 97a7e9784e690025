"""A selective recalibrator as a scikit-learn estimator: fit on your own arrays.

:class:`SelectiveRecalibrator` is one method of a spec (a scheme, a selector, a recalibrator
and the losses) fitted on the logits, labels and optionally features of *your* model::

    from selbench import SelectiveRecalibrator

    est = SelectiveRecalibrator(beta=0.8).fit(val_logits, val_labels, features=val_features)
    confidence = est.predict_confidence(test_logits, features=test_features)
    accepted = est.accept(test_logits, features=test_features, beta=0.8)
    metrics = est.evaluate(test_logits, test_labels, features=test_features, betas=[0.8])
    est.score(test_logits, test_labels, features=test_features)  # -metrics["ece1"][0]

It is the code the runner fits every leaderboard cell with: the runner builds each cell as
``SelectiveRecalibrator(**method, beta=train_beta, seed=seed, device=device)``, where
``method`` is the spec's method without its label, so a YAML method is exactly the
estimator's :meth:`get_params` (its ``scheme``, ``selector``, ``recalibrator``, ``loss`` and
``coverage``). :meth:`evaluate` measures with the core's own functions
(:func:`selbench.measure.evaluate.score` and :func:`selbench.measure.evaluate.measure`), so on the same data
and seed its numbers are those of a leaderboard cell. :meth:`score` (higher is better) is minus
the selective ECE₁ at the estimator's ``beta``, so scikit-learn's model selection works
unchanged, with no scorer argument (``GridSearchCV(SelectiveRecalibrator(...), {"recalibrator":
["temperature", "platt"]}, cv=5).fit(logits, labels)``). ``betas``, ``beta`` and ``delta`` are
checked up front with the metrics' own checks (:mod:`selbench.measure.validation`), for every
selector: one that does not select (``none``) accepts everything, but an impossible coverage
is still a ``ValueError`` naming the argument.

**Parameters.** Each component is given as

* a registered name, e.g. ``"temperature"`` (``selbench plugins`` lists them);
* a ``{"name": ..., "params": {...}}`` mapping, exactly as in a spec; ``params`` are
  validated against the plugin's own model, as spec validation does;
* a plugin object (e.g. ``TemperatureScaling()`` or your own class): used as given, deep-copied
  for every fit so the object you passed is never changed;
* ``None``: for ``loss`` and ``coverage``, none (schemes that do not train need none); for
  ``selector`` and ``recalibrator``, the ``none`` plugin (no selection, the identity).

The defaults are the paper's method: S-TLBCE selective recalibration, the MLP selector and
temperature scaling trained jointly with a quadratic coverage loss at coverage ``beta=0.8``.
Plain temperature scaling is ``SelectiveRecalibrator(selector="none",
scheme="recalibration", loss=None, coverage=None)``. Nothing is validated in ``__init__``
(scikit-learn's rule); :meth:`fit` validates every parameter and the combination (the rules
of ``selbench validate``) and raises :class:`ParamsError` listing every problem.

**Inputs.** Every method takes ``logits`` ``[N, K]`` (log-probabilities are valid logits;
probabilities are not: pass ``np.log(p)``), ``labels`` ``[N]`` where needed, and optionally
``features`` ``[N, d]`` (an embedding of the inputs, which learned selectors read). Without
``features`` the softmax probabilities of the logits are used as features, as
:meth:`ModelOutputs.from_probabilities <selbench.ModelOutputs.from_probabilities>` does; the
same rule applies when predicting, so fit and predict consistently (an estimator fitted with
features needs features of the same dimension). A :class:`~selbench.ModelOutputs` may be
passed instead of the arrays. Bad arrays raise :class:`~selbench.DataError` naming the array,
as everywhere in selbench.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from selbench.contract.api import CoverageLoss, FitContext, FitJob, Plugin, SelectionLoss
from selbench.contract.data import DataError, ModelOutputs, as_array
from selbench.contract.registry import (
    PluginError,
    Registered,
    format_validation_error,
    get_registry,
)
from selbench.library.adapters import (
    check_classifier,
    classifier_logits,
    decode,
    encode,
    fit_classes,
    log_probabilities,
    provides_distribution,
)
from selbench.measure.evaluate import check_vector, measure, score
from selbench.measure.metrics import DEFAULT_BETAS, accept_mask
from selbench.measure.validation import check_betas, check_delta

__all__ = ["FIELDS", "ParamsError", "SelectiveRecalibrator"]

#: The component parameters, in the order they are built: (parameter, plugin kind).
FIELDS: tuple[tuple[str, str], ...] = (
    ("scheme", "scheme"),
    ("selector", "selector"),
    ("recalibrator", "recalibrator"),
    ("loss", "loss"),
    ("coverage", "loss"),
)

#: What ``None`` means for each component parameter (``"none"``: that plugin; None: none).
_NONE_MEANS = {"selector": "none", "recalibrator": "none", "loss": None, "coverage": None}

#: The methods an object must have to serve as each component (duck-typed, as the core
#: drives plugins only through them).
_METHODS = {
    "scheme": ("fit",),
    "selector": ("fit", "score"),
    "recalibrator": ("fit", "confidence"),
}

_DEVICES = ("auto", "cpu", "cuda")


class ParamsError(ValueError):
    """An estimator's parameters are invalid; ``errors`` holds one ``path: message`` line per
    problem, with the path of the spec's method (``scheme.params.lr``, ``selector.name``)."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("invalid SelectiveRecalibrator parameters:\n"
                         + "\n".join("  " + e for e in self.errors))


# --------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class _Part:
    """One validated component: a registered plugin with validated params, or an object."""

    field: str
    kind: str
    name: str  # the spec's name: registered name, or the object's class name
    reg: Registered  # the registered plugin (a stand-in for an object: its class)
    params: BaseModel | None  # validated params (registered plugins)
    obj: Any = None  # the plugin object given as the parameter

    def build(self) -> Any:
        """A new component: the factory called with the params, or a copy of the object."""
        if self.params is None:
            return copy.deepcopy(self.obj)
        return self.reg.build(self.params)

    def describe(self) -> str:
        """How messages name it: ``recalibrator 'temperature' (selbench 0.1.0)``."""
        if self.params is None:
            return f"{self.kind} {self.name!r} (object)"
        return self.reg.describe()


@dataclass(frozen=True)
class _Plan:
    """Every component of an estimator, validated; built anew for each fit."""

    parts: dict[str, _Part | None]

    def build(self, field: str) -> Any:
        part = self.parts[field]
        return None if part is None else part.build()

    def names(self) -> dict[str, str]:
        return {f: p.describe() for f, p in self.parts.items() if p is not None}


@dataclass
class _Built:
    """The components of one fit and its context (what one ``Scheme.fit`` call takes)."""

    scheme: Any
    selector: Any
    recalibrator: Any
    loss: Any
    coverage: Any
    context: FitContext
    names: dict[str, str]

    def job(self, outputs: ModelOutputs) -> FitJob:
        """These components as one replica of :meth:`~selbench.contract.api.Scheme.fit_many`."""
        return FitJob(outputs, self.selector, self.recalibrator, self.loss, self.coverage,
                      self.context)


def _component(value: Any, field: str, kind: str, registry, errors: list[str]) -> _Part | None:
    """Validate one component parameter (see the module docstring for the accepted forms)."""
    if value is None:
        value = _NONE_MEANS.get(field)
        if value is None:
            return None
    if isinstance(value, BaseModel) and {"name", "params"} <= set(type(value).model_fields):
        value = {"name": value.name, "params": value.params}  # a spec's Component
    if isinstance(value, str):
        value = {"name": value}
    if isinstance(value, Mapping):
        unknown = sorted(map(str, set(value) - {"name", "params"}))
        if unknown:
            errors.append(f"{field}: unknown key(s) {', '.join(map(repr, unknown))}; a component "
                          "is {name, params}")
            return None
        name, params = value.get("name"), value.get("params")
        if not isinstance(name, str) or not name:
            errors.append(f"{field}.name: expected a plugin name (a non-empty string), got "
                          f"{name!r}")
            return None
        if params is not None and not isinstance(params, Mapping):
            errors.append(f"{field}.params: expected a mapping of parameters, got "
                          f"{type(params).__name__}")
            return None
        try:
            reg = registry.get(kind, name)
        except PluginError as exc:
            errors.append(f"{field}.name: {exc}")
            return None
        try:
            model = reg.validate_params(dict(params or {}))
        except ValidationError as exc:
            errors.extend(format_validation_error(exc, f"{field}.params", reg.plugin.params))
            return None
        return _Part(field, kind, name, reg, model)
    # a plugin object
    if isinstance(value, type):
        errors.append(f"{field}: got the class {value.__name__}; pass an instance, e.g. "
                      f"{value.__name__}(), or a registered name")
        return None
    if isinstance(value, (bytes, bool, int, float, list, tuple)):
        errors.append(_form_error(field, value))
        return None
    needs = _METHODS.get(field, ("__call__",))
    missing = [m for m in needs if not callable(getattr(value, m, None))]
    if missing:
        errors.append(_form_error(field, value)
                      + f" ({type(value).__name__} has no {', '.join(missing)}())")
        return None
    klass = type(value)
    reg = Registered(kind, Plugin(klass.__name__, klass), provider="<object>")
    return _Part(field, kind, klass.__name__, reg, None, value)


def _form_error(field: str, value: Any) -> str:
    what = "a selection loss" if field == "loss" else "a coverage loss" if field == "coverage" \
        else f"a {field}"
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return (f"{field}: expected a registered name, a {{name, params}} mapping or {what} object, "
            f"got {type(value).__name__} {shown}")


def _check_kinds(parts: dict[str, _Part | None], errors: list[str]) -> None:
    """A selection loss in ``loss`` and a coverage loss in ``coverage``, as spec validation
    checks them; a misplaced one is dropped from the capability checks."""
    for field, want in (("loss", SelectionLoss), ("coverage", CoverageLoss)):
        part = parts.get(field)
        factory = part.reg.plugin.factory if part is not None else None
        if isinstance(factory, type) and not issubclass(factory, want):
            other = "coverage" if field == "loss" else "selection"
            errors.append(f"{field}.name: {part.name!r} is a {other} loss; `{field}` expects a "
                          f"{want.__name__}")
            parts[field] = None


def _check_combination(registry, parts: dict[str, _Part | None],
                       errors: list[str]) -> None:
    """The capability rules of ``selbench validate`` (:func:`selbench.spec.check_method`)."""
    from selbench.spec import Component, MethodSpec, check_method

    fields = {f: Component(name=p.name) for f, p in parts.items() if p is not None}
    method = MethodSpec(label="estimator", **fields)
    regs = {f: (p.reg if p is not None else None) for f, p in parts.items()}
    found: list[str] = []
    check_method(registry, method, regs, "", found)
    errors.extend(line.lstrip(".") for line in found)


def _check_beta(beta: Any) -> Any:
    """``beta`` when it is one coverage level in (0, 1] (the metrics' check,
    :func:`~selbench.measure.validation.check_betas`), else a ``ValueError`` naming ``beta``."""
    if isinstance(beta, (bool, np.bool_, str, bytes)) or np.ndim(beta) != 0:
        raise ValueError(f"beta must be a single coverage level in (0, 1]; got {beta!r}")
    try:
        check_betas([beta])
    except ValueError:
        raise ValueError(f"beta must lie in (0, 1]; got {beta!r}") from None
    return beta


# --------------------------------------------------------------------------- estimator
class SelectiveRecalibrator(BaseEstimator):
    """A selector g and a recalibrator h fitted together by a scheme (scikit-learn API).

    Args:
        selector: g, which inputs to accept: ``"mlp"`` (learned, the paper's), ``"confidence"``,
            ``"isolation-forest"``, ``"one-class-svm"``, ``"none"`` (accept everything), a
            ``{name, params}`` mapping, or a selector object.
        recalibrator: h, the recalibrated confidence: ``"temperature"``, ``"platt"``,
            ``"histogram-binning"``, ``"platt-binning"``, ``"mlp"``, ``"none"``, ...
        scheme: how h and g are fitted: ``"joint"`` (selective recalibration),
            ``"sequential"``, ``"selection"`` (g only), ``"recalibration"`` (h only, then a
            non-trainable g on its output).
        loss: the selective loss trained schemes minimise (``"s-tlbce"``, ``"s-mce"``,
            ``"s-mmce"``), or None.
        coverage: the coverage loss of trained schemes (``"quadratic"``, ``"log-coverage"``),
            or None.
        beta: the training coverage in (0, 1], passed to the scheme as ``FitContext.beta``
            (the coverage loss's target and the ``recalibration`` scheme's
            ``fit_on: accepted`` level); also the default coverage of :meth:`accept`.
        seed: seeds every random draw of :meth:`fit` (weights, batches) and the tie-break of
            :meth:`accept` and :meth:`evaluate`; ``0 <= seed <= 2**32 - 1``.
        device: ``"auto"`` (cuda when torch sees a GPU, else cpu), ``"cpu"`` or ``"cuda"``.
        classifier: a *fitted* scikit-learn classifier, or None. When given, every method
            takes the classifier's raw inputs ``X`` where it otherwise takes logits, and the
            logits are the classifier's (``decision_function``, else the log of
            ``predict_proba``; :mod:`selbench.library.adapters`); its ``classes_`` name the
            labels. selbench never fits or changes it, and :func:`sklearn.base.clone` keeps
            the same fitted object (as :class:`sklearn.frozen.FrozenEstimator` does), so
            ``GridSearchCV`` and ``cross_val_score`` work on the raw inputs.

    Attributes (after :meth:`fit`):
        selector_, recalibrator_, scheme_, loss_, coverage_: the fitted components (new
            objects, never the parameters themselves).
        n_classes_: K, the number of logit columns.
        classes_: the label of each logit column: the classifier's ``classes_``, the
            ``classes`` given to :meth:`fit`, ``arange(K)`` for integer labels in ``[0, K)``,
            else the sorted distinct labels (strings, any hashable; they must number K).
            :meth:`predict` returns these labels and :meth:`evaluate` / :meth:`score` read
            labels in them.
        feature_dim_: the dimension of the features fitted on.
        features_given_: whether ``fit`` was given features (else the probabilities).
        device_: the device the fit ran on.

    :meth:`score` ``(logits, labels, features=None)`` is minus the selective ECE₁ at ``beta``
    (higher is better), scikit-learn's default score for model selection.
    """

    def __init__(
        self,
        selector: Any = "mlp",
        recalibrator: Any = "temperature",
        scheme: Any = "joint",
        loss: Any = "s-tlbce",
        coverage: Any = "quadratic",
        beta: float = 0.8,
        seed: int = 0,
        device: str = "auto",
        classifier: Any = None,
    ):
        self.selector = selector
        self.recalibrator = recalibrator
        self.scheme = scheme
        self.loss = loss
        self.coverage = coverage
        self.beta = beta
        self.seed = seed
        self.device = device
        self.classifier = classifier

    def __sklearn_clone__(self) -> SelectiveRecalibrator:
        """An unfitted copy with the same parameters, each cloned as scikit-learn's
        :func:`~sklearn.base.clone` clones them, except ``classifier``: the same fitted
        object (selbench never fits it; cloning it would unfit it)."""
        from sklearn.base import clone

        params = self.get_params(deep=False)
        return type(self)(**{k: v if k == "classifier" else clone(v, safe=False)
                             for k, v in params.items()})

    @classmethod
    def from_method(cls, method: Mapping[str, Any] | BaseModel, **params: Any
                    ) -> SelectiveRecalibrator:
        """The estimator of a spec's method (a mapping as in the YAML, or a ``MethodSpec``).

        Components the method leaves out take the spec's defaults (selector and
        recalibrator ``none``, no losses), not the estimator's; ``label`` is ignored;
        ``params`` (``beta``, ``seed``, ``device``, or a component) are passed on.
        """
        if isinstance(method, BaseModel):
            method = method.model_dump()
        unknown = sorted(set(method) - {f for f, _ in FIELDS} - {"label"})
        if unknown:
            raise ParamsError([f"{k}: not a field of a method" for k in unknown])
        comps = {f: method.get(f, _NONE_MEANS.get(f)) for f, _ in FIELDS}
        if "scheme" not in method:
            raise ParamsError(["scheme: a method needs a scheme"])
        return cls(**{**comps, **params})

    # ------------------------------------------------------------------ validation
    def _plan(self) -> _Plan:
        """Validate every parameter and the combination; raise :class:`ParamsError`."""
        registry = get_registry()
        errors: list[str] = []
        parts = {f: _component(getattr(self, f), f, kind, registry, errors) for f, kind in FIELDS}
        if parts["scheme"] is None and not any(e.startswith("scheme") for e in errors):
            errors.append("scheme: a scheme is required")
        _check_kinds(parts, errors)
        if not errors:
            _check_combination(registry, parts, errors)
        beta = self.beta
        if (isinstance(beta, bool) or not isinstance(beta, (int, float, np.integer, np.floating))
                or not (0.0 < float(beta) <= 1.0)):
            errors.append(f"beta: the training coverage must be a number in (0, 1], got {beta!r}")
        seed = self.seed
        if (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                or not 0 <= int(seed) <= 2**32 - 1):
            errors.append(f"seed: expected an integer 0 <= seed <= 2**32 - 1, got {seed!r}")
        if not (isinstance(self.device, str) and self.device in _DEVICES):
            errors.append(f"device: expected one of {', '.join(_DEVICES)}, got {self.device!r}")
        if self.classifier is not None:
            try:
                check_classifier(self.classifier)
            except ValueError as exc:
                errors.append(str(exc))
        if errors:
            raise ParamsError(errors)
        return _Plan(parts)

    def _build(self, wrap: Callable[[str, Callable[[], Any]], Any] | None = None,
               plan: _Plan | None = None) -> _Built:
        """Validate, seed every generator from ``seed`` (as the runner does), and build new
        components and the :class:`~selbench.contract.api.FitContext` of one fit.

        ``wrap(field, make)`` (the runner's) calls ``make()`` and may rename its errors.
        """
        from selbench.training.devices import resolve_device, seed_everything

        plan = plan or self._plan()
        device = resolve_device(self.device)
        seed_everything(int(self.seed))
        objs = {}
        for field, _ in FIELDS:
            make = functools.partial(plan.build, field)
            objs[field] = make() if wrap is None else wrap(field, make)
        context = FitContext(seed=int(self.seed), device=device, beta=float(self.beta),
                             progress=False)
        return _Built(**objs, context=context, names=plan.names())

    # ------------------------------------------------------------------ fitting
    def fit(self, logits: Any, labels: Any = None, features: Any = None, *,
            classes: Any = None) -> SelectiveRecalibrator:
        """Fit h and g on labelled outputs; return ``self``.

        Args:
            logits: ``[N, K]`` logits of your model, or a :class:`~selbench.ModelOutputs`
                (then leave ``labels`` and ``features`` out); with a ``classifier``, its
                raw inputs ``X``.
            labels: ``[N]`` true labels: integers in ``[0, K)`` (the logit columns), or
                any hashable labels (strings ...) named by ``classes`` (see ``classes_``).
            features: optional ``[N, d]`` embedding; default the softmax probabilities.
            classes: optional, the label of each logit column in column order (default:
                the classifier's ``classes_``, else see ``classes_``).
        """
        plan = self._plan()
        outputs, given = self._fitting_outputs(logits, labels, features, classes)
        built = self._build(plan=plan)
        return self._fit_built(built, outputs, given)

    def _fitting_outputs(self, logits: Any, labels: Any, features: Any,
                         classes: Any) -> tuple[ModelOutputs, bool]:
        """:meth:`fit`'s arguments as validated :class:`ModelOutputs` (labels encoded as
        logit columns, ``classes_`` decided) and whether features were given; what
        :class:`selbench.execution.pysearch.TuneSearch` tunes on."""
        if self.classifier is not None and not isinstance(logits, ModelOutputs):
            if classes is not None and not np.array_equal(np.asarray(classes),
                                                          self.classifier.classes_):
                raise DataError("classes: differs from the classifier's classes_, which name "
                                "its output columns; leave classes out")
            classes = self.classifier.classes_
        z = self._logits(logits)
        if z is None:  # ModelOutputs
            k = logits.num_classes
            self._classes = fit_classes(np.zeros(0, np.int64), k, classes)
        else:
            if labels is None:
                raise DataError("labels: required; pass the true labels [N]")
            self._classes = fit_classes(labels, z.shape[1], classes)
        return self._outputs(logits, labels, features, labelled=True, fitted=False)

    def _fit_built(self, built: _Built, outputs: ModelOutputs,
                   features_given: bool = True) -> SelectiveRecalibrator:
        """Fit built components as one job of the scheme's ``fit_many`` (what the runner
        calls for all cells of a method) and keep them."""
        from selbench.library.watch import fit_guarded  # a NaN is blamed on its producer

        names = (built.names.get("recalibrator", "the recalibrator"),
                 built.names.get("selector", "the selector"))
        fit_guarded(lambda: built.scheme.fit_many([built.job(outputs)]),
                    [(built.recalibrator, built.selector)], names)
        return self._adopt(built, outputs, features_given)

    def _adopt(self, built: _Built, outputs: ModelOutputs,
               features_given: bool = True) -> SelectiveRecalibrator:
        """Keep fitted components as this estimator's state."""
        self.scheme_ = built.scheme
        self.selector_ = built.selector
        self.recalibrator_ = built.recalibrator
        self.loss_ = built.loss
        self.coverage_ = built.coverage
        self.n_classes_ = outputs.num_classes
        classes = getattr(self, "_classes", None)
        self.classes_ = (classes if classes is not None and len(classes) == self.n_classes_
                         else np.arange(outputs.num_classes))
        self._classes = None
        self.feature_dim_ = outputs.feature_dim
        self.features_given_ = bool(features_given)
        self.device_ = built.context.device
        self.names_ = dict(built.names)
        return self

    # ------------------------------------------------------------------ inputs
    def _outputs(self, logits: Any, labels: Any, features: Any, *, labelled: bool,
                 fitted: bool = True) -> tuple[ModelOutputs, bool]:
        """The arguments as validated :class:`ModelOutputs` (``DataError`` naming the array)
        and whether features were given; when ``fitted``, checked against the fit.

        Unlabelled calls get placeholder labels (0), which nothing reads.
        """
        if fitted:
            check_is_fitted(self, "recalibrator_")
        if isinstance(logits, ModelOutputs):
            if labels is not None or features is not None:
                raise TypeError("pass either a ModelOutputs or arrays (logits, labels, "
                                "features), not both")
            out, given = logits, True
        else:
            z = self._logits(logits)
            if labelled and labels is None:
                raise DataError("labels: required; pass the true labels [N]")
            if not labelled:
                labels = np.zeros(z.shape[0], dtype=np.int64)
            else:
                labels = encode(labels, self.classes_ if fitted else self._classes)
            if labels.shape[0] != z.shape[0]:
                raise DataError(f"logits: has {z.shape[0]} rows but labels has "
                                f"{labels.shape[0]}; all arrays must describe the same N "
                                "examples")
            given = features is not None
            if not given:
                p = z.astype(np.float64)
                p = np.exp(p - p.max(axis=1, keepdims=True)) if p.size else p
                features = p / p.sum(axis=1, keepdims=True) if p.size else p
            out = ModelOutputs(features=features, logits=z, labels=labels)
        if fitted:
            self._check_like_fit(out, given)
        return out, given

    def _logits(self, logits: Any) -> np.ndarray | None:
        """The logits of the first argument: the array itself, or with a ``classifier`` its
        logits of these raw inputs; None for a :class:`ModelOutputs`."""
        if isinstance(logits, ModelOutputs):
            return None
        if self.classifier is not None:
            return as_array("logits", classifier_logits(self.classifier, logits),
                            np.dtype(np.float32), 2)
        return as_array("logits", logits, np.dtype(np.float32), 2)

    def _check_like_fit(self, out: ModelOutputs, given: bool) -> None:
        if out.num_classes != self.n_classes_:
            raise DataError(f"logits: has {out.num_classes} classes per row, but the estimator "
                            f"was fitted on K={self.n_classes_}")
        if self.features_given_ and not given:
            raise DataError(f"features: the estimator was fitted with features of dimension "
                            f"{self.feature_dim_}; pass the same features here (features=None "
                            "means the softmax probabilities)")
        if out.feature_dim != self.feature_dim_:
            raise DataError(f"features: has {out.feature_dim} columns, but the estimator was "
                            f"fitted on features of dimension {self.feature_dim_}")

    # ------------------------------------------------------------------ predicting
    def predict_confidence(self, logits: Any, features: Any = None) -> np.ndarray:
        """Recalibrated top-label confidence, float64 ``[N]`` in ``[0, 1]``: h's confidence in
        the label :meth:`predict` returns."""
        out, _ = self._outputs(logits, None, features, labelled=False)
        return check_vector(self.recalibrator_.confidence(out), len(out),
                            f"{self.names_['recalibrator']}.confidence", 0.0, 1.0)

    def predict(self, logits: Any, features: Any = None) -> np.ndarray:
        """Predicted labels ``[N]`` (of ``classes_``: int64 column indices for integer
        labels, else the labels fitted on): ``argmax(logits)`` unless h changes it (binary
        Platt scaling may)."""
        out, _ = self._outputs(logits, None, features, labelled=False)
        pred = check_vector(self.recalibrator_.predict(out), len(out),
                            f"{self.names_['recalibrator']}.predict", 0, out.num_classes - 1,
                            integer=True)
        return decode(pred, self.classes_)

    def predict_proba(self, logits: Any, features: Any = None) -> np.ndarray:
        """The recalibrated distribution, float64 ``[N, K]`` (column ``j``: class
        ``classes_[j]``; rows sum to 1), for a recalibrator that defines one: it declares
        ``provides_log_probs = True`` (temperature, vector and matrix scaling, Platt and
        beta, ``none``); the exponential of its module's log-probabilities, renormalised.
        For the top-label recalibrators (Platt, beta with K > 2) that is the recalibrated
        confidence on the predicted class and the rest shared among the others in
        proportion to their original probabilities. Its maximum is
        :meth:`predict_confidence` (to float32 rounding).

        Raises:
            selbench.library.adapters.DistributionError: (a ``ValueError``) naming the
                recalibrator when it defines only a top-label confidence (histogram
                binning, isotonic, ``mlp``...).
        """
        p = np.exp(self.predict_log_proba(logits, features))
        return p / p.sum(axis=1, keepdims=True)

    def predict_log_proba(self, logits: Any, features: Any = None) -> np.ndarray:
        """The recalibrated log-probabilities, float64 ``[N, K]``, as the recalibrator's
        module computes them (:meth:`predict_proba` is their exponential, renormalised);
        the same ``DistributionError`` for a recalibrator that defines none."""
        out, _ = self._outputs(logits, None, features, labelled=False)
        return log_probabilities(self.recalibrator_, out, self.names_["recalibrator"],
                                 self.device_)

    def decision_function(self, logits: Any, features: Any = None) -> np.ndarray:
        """The selector's scores, float64 ``[N]``: higher is accepted first."""
        out, _ = self._outputs(logits, None, features, labelled=False)
        return self._score(out)["score"]

    def accept(self, logits: Any, features: Any = None, beta: float | None = None, *,
               delta: float | None = None) -> np.ndarray:
        """Which examples are accepted at coverage ``beta`` (default the estimator's
        ``beta``): boolean ``[N]``, exactly ``ceil(beta * N)`` True, the highest scores, ties
        broken by ``seed`` (:func:`selbench.measure.metrics.accept_mask`, the rule every metric
        uses); with ``delta`` the Hoeffding count. A selector that does not select
        (``none``) accepts everything."""
        beta = _check_beta(self.beta if beta is None else beta)
        if delta is not None:
            check_delta(delta)
        out, _ = self._outputs(logits, None, features, labelled=False)
        if not self._selects():
            if len(out) == 0:
                raise ValueError("scores must hold at least one value to choose a threshold "
                                 "(n = 0)")
            accept_mask(np.zeros(len(out)), beta, delta=delta, seed=int(self.seed))  # validates
            return np.ones(len(out), dtype=bool)
        return accept_mask(self._score(out)["score"], beta, delta=delta, seed=int(self.seed))

    def evaluate(self, logits: Any, labels: Any = None, features: Any = None,
                 betas: Any = DEFAULT_BETAS, *, delta: float | None = None
                 ) -> dict[str, np.ndarray]:
        """The core's selective metrics on labelled data at each coverage in ``betas``.

        Returns the dict of :func:`selbench.measure.evaluate.measure` (the leaderboard cell's
        metrics): float64 arrays over ``betas`` under every key of the metric registry
        :data:`selbench.measure.metrics.METRICS` (``ece1``, ``ece2``, ``smece``, ``brier``,
        ``accuracy``, ``coverage``, ``nll``, ``mce``, ...; the ranking metrics ``aurc``,
        ``eaurc``, ``augrc``, ``auroc``, ``fpr95`` repeated at each β; ``nll_full`` and
        ``classwise_ece`` where the recalibrator defines a distribution, see
        :meth:`predict_proba`), ``threshold`` (and ``guaranteed_coverage`` with ``delta``). ``betas`` defaults to 0.5, 0.55, ..., 1.0, the paper's AUC grid; ties
        are broken by ``seed``. ``betas`` (one or more levels in (0, 1]) and ``delta`` (in
        (0, 1]) are checked first, whatever the selector: a ``ValueError`` names the argument.
        """
        betas = [float(b) for b in check_betas(betas)]
        if delta is not None:
            check_delta(delta)
        out, _ = self._outputs(logits, labels, features, labelled=True)
        arrays = self._score(out)
        if provides_distribution(self.recalibrator_):
            arrays.update(log_probs=log_probabilities(
                self.recalibrator_, out, self.names_["recalibrator"], self.device_),
                labels=out.labels)
        return self._measure(arrays, betas, delta)

    def score(self, logits: Any, labels: Any = None, features: Any = None) -> float:
        """Minus the selective ECE₁ at the estimator's ``beta`` on labelled data (higher is
        better): ``-evaluate(logits, labels, features, betas=[beta])["ece1"][0]``, the score
        scikit-learn's model selection (``GridSearchCV``, ``cross_val_score``) uses when no
        scorer is given. Arguments as in :meth:`evaluate`."""
        return -float(self.evaluate(logits, labels, features, betas=[self.beta])["ece1"][0])

    def _score(self, out: ModelOutputs) -> dict[str, np.ndarray]:
        """Per-example confidence, prediction, score and correctness, each checked
        (:func:`selbench.measure.evaluate.score`; the runner scores a cell's evaluation data so)."""
        return score(out, self.recalibrator_, self.selector_,
                     (self.names_["recalibrator"], self.names_["selector"]))

    def _measure(self, arrays: dict[str, np.ndarray], betas: list[float],
                 delta: float | None) -> dict[str, np.ndarray]:
        """The metrics of scored ``arrays`` at each β (:func:`selbench.measure.evaluate.measure`,
        ties broken by ``seed``; how the runner measures a cell)."""
        return measure(arrays, betas, delta=delta, seed=int(self.seed), selects=self._selects())

    def _selects(self) -> bool:
        return bool(getattr(self.selector_, "selects", True))
