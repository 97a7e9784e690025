"""A plugin's parameters: how they are declared, described and held. Declared once, by the
signature: :func:`params_model` derives the pydantic model of the accepted parameters from a
factory's ``__init__`` (or its own signature), on the :class:`Params` base
(:class:`NoParams` for none); described by :class:`Plugin`, the descriptor a hook returns,
which carries that model; held by :class:`PluginBase`, scikit-learn's estimator contract
(``get_params`` / ``set_params``) that every plugin kind derives from. Part of the contract:
plugins import these names from :mod:`selbench.contract.api`, which re-exports them.
"""

from __future__ import annotations

import contextlib
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, create_model

__all__ = ["NoParams", "Params", "Plugin", "PluginBase", "params_model"]


class Params(BaseModel):
    """Base class of a plugin's parameter model: unknown keys are an error, values frozen.

    The model of a plugin is normally derived from its ``__init__`` signature
    (:func:`params_model`); subclass this directly only for cross-parameter validators (see
    :attr:`PluginBase.params_base`) or for an explicit model passed to :class:`Plugin`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(Params):
    """Parameter model of a plugin that takes no parameters."""


_DERIVED: dict[Any, type[BaseModel]] = {}


def _annotations(target: Any) -> dict[str, Any]:
    """``target``'s parameter annotations, resolved (``Annotated`` metadata kept); one that
    cannot be resolved (a name imported only for type checkers) is ``Any``."""
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception:
        pass
    namespace = getattr(target, "__globals__", {})
    hints: dict[str, Any] = {}
    for name, annotation in getattr(target, "__annotations__", {}).items():
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, namespace)  # what get_type_hints does, per name
            except Exception:
                annotation = Any
        hints[name] = annotation
    return hints


def params_model(factory: Callable[..., Any]) -> type[BaseModel]:
    """The pydantic model of ``factory``'s keyword parameters: its signature is the schema.

    For a class the signature is that of ``__init__`` (without ``self``); for a function,
    its own. Each parameter that can be passed by keyword becomes a field with the
    parameter's annotation (``Any`` when it has none or it cannot be resolved;
    ``typing.Annotated`` metadata such as ``pydantic.Field(gt=0, description=...)`` or an
    :class:`~selbench.contract.inputs.InputSpec` is kept) and its default (required when it has
    none). Mutable defaults are copied by pydantic for every validation. ``*args``,
    ``**kwargs`` and positional-only parameters take no part; a callable without a readable
    signature takes no parameters. The model derives from ``factory.params_base`` when the
    factory defines it (:class:`PluginBase`), else from :class:`Params`. The result is
    remembered per factory.

    Raises:
        TypeError: ``params_base`` is not a pydantic model class, or pydantic rejects the
            fields (e.g. an annotation that is not a type).
    """
    try:
        return _DERIVED[factory]
    except (KeyError, TypeError):
        pass
    name = getattr(factory, "__name__", type(factory).__name__)
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        parameters = []
    target = factory.__init__ if isinstance(factory, type) else factory
    hints = _annotations(target)
    fields: dict[str, Any] = {}
    for p in parameters:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            continue
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (hints.get(p.name, Any), default)
    base = getattr(factory, "params_base", Params) if isinstance(factory, type) else Params
    if not (isinstance(base, type) and issubclass(base, BaseModel)):
        raise TypeError(f"{name}.params_base must be a pydantic model class, got {base!r}")
    try:
        model = create_model(
            f"{name}Params", __base__=base, __module__=getattr(factory, "__module__", __name__),
            **fields,
        )
    except Exception as exc:
        raise TypeError(
            f"the parameters of {name} cannot be derived from its signature: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    model.__doc__ = f"Parameters of {name}, derived from its signature."
    with contextlib.suppress(TypeError):  # an unhashable callable: derived again next time
        _DERIVED[factory] = model
    return model


@dataclass(frozen=True)
class Plugin:
    """What a ``selbench_*`` hook returns, one per plugin.

    Args:
        name: the name a spec uses, e.g. ``"temperature"``. Unique within its kind across
            every installed package; a clash is an error that names both providers.
        factory: the plugin's class (a subclass of its kind's base class, checked when the
            plugin is registered), or a callable returning such an object (checked when it
            is built), called as ``factory(**params)`` with the validated parameters.
        params: the pydantic model of the accepted parameters. Leave it out: it is derived
            from the factory's signature (:func:`params_model`). An explicit model is
            still accepted and then wins over the signature. Field descriptions are shown
            by ``selbench plugins``.
        summary: one line shown by ``selbench plugins``; defaults to the first line of the
            factory's docstring.
        version: the providing package's version, recorded in every result's provenance.
    """

    name: str
    factory: Callable[..., Any]
    params: type[BaseModel] | None = None
    summary: str = ""
    version: str | None = None

    def __post_init__(self) -> None:
        if self.params is None:
            derived = params_model(self.factory) if callable(self.factory) else NoParams
            object.__setattr__(self, "params", derived)

    def describe(self) -> str:
        if self.summary:
            return self.summary
        doc = (getattr(self.factory, "__doc__", None) or "").strip()
        return doc.splitlines()[0] if doc else ""

    def reference(self) -> str:
        """The method's canonical citation, shown by ``selbench plugins``: the factory's
        ``reference`` class attribute (a string, e.g. ``"Guo et al., ICML 2017"``), else
        ``""``."""
        ref = getattr(self.factory, "reference", "")
        return ref if isinstance(ref, str) else ""


# --------------------------------------------------------------------------- estimator base
class PluginBase:
    """What every plugin kind shares: scikit-learn's estimator contract.

    :meth:`get_params` returns the ``__init__`` parameters as stored on the instance and
    :meth:`set_params` sets them, so ``sklearn.base.clone`` builds an unfitted copy (it
    calls ``type(p)(**p.get_params(deep=False))`` and checks that ``__init__`` stored every
    value unchanged: keep normalisation and derived values out of ``__init__``).
    """

    #: Base class of the parameter model derived from ``__init__``'s signature: a
    #: :class:`Params` subclass holding only validators (pydantic ``model_validator`` s)
    #: for checks that involve several parameters, or that rewrite what older specs wrote.
    params_base: ClassVar[type[BaseModel]] = Params

    #: Parameters stored under another attribute name, ``{parameter: attribute}``: for a
    #: parameter whose name is taken by a method of the kind (a dataset's ``splits``).
    param_attributes: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def _param_names(cls) -> list[str]:
        """The keyword parameters of ``__init__``, sorted (as scikit-learn lists them)."""
        if cls.__init__ is object.__init__:
            return []
        names = []
        for p in inspect.signature(cls.__init__).parameters.values():
            if p.kind is p.VAR_POSITIONAL:
                raise TypeError(f"{cls.__name__}.__init__ takes *args; parameters must be named")
            if p.name != "self" and p.kind is not p.VAR_KEYWORD:
                names.append(p.name)
        return sorted(names)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The ``__init__`` parameters and their current values; with ``deep``, also those
        of parameters that are estimators themselves, as ``name__param``."""
        out: dict[str, Any] = {}
        for name in self._param_names():
            value = getattr(self, self.param_attributes.get(name, name))
            if deep and not isinstance(value, type) and callable(getattr(value, "get_params", None)):
                out.update((f"{name}__{k}", v) for k, v in value.get_params(deep=True).items())
            out[name] = value
        return out

    def check_inputs(self) -> None:
        """Open the input files and folders this plugin declares (:class:`InputFile`,
        :func:`InputDir`) just enough to catch what it would reject when it runs (a damaged
        archive, a missing member, inconsistent shapes): read headers and tables of
        contents, not the data. Raise a ``ValueError`` (e.g. a ``DataError``) naming the
        file. ``selbench validate`` (and ``run``, before any computation) calls it on each
        plugin that overrides it, built with its spec's params and resolved paths, after the
        core has checked that the inputs exist; the default checks nothing more."""

    def set_params(self, **params: Any) -> PluginBase:
        """Set parameters (``name__param`` for a nested estimator's); returns ``self``."""
        names = self._param_names()
        nested: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in names:
                raise ValueError(
                    f"{type(self).__name__} has no parameter {name!r}; its parameters are "
                    f"{', '.join(names) or 'none'}"
                )
            if sub:
                nested.setdefault(name, {})[sub] = value
            else:
                setattr(self, self.param_attributes.get(name, name), value)
        for name, sub_params in nested.items():
            getattr(self, self.param_attributes.get(name, name)).set_params(**sub_params)
        return self

    def __repr__(self) -> str:
        """``Name(param=value, ...)`` with the parameters that differ from the defaults."""
        try:
            defaults = {n: p.default for n, p in inspect.signature(type(self)).parameters.items()}
            shown = []
            for name, value in self.get_params(deep=False).items():
                default = defaults.get(name, inspect.Parameter.empty)
                try:
                    same = default is not inspect.Parameter.empty and bool(default == value)
                except Exception:
                    same = False
                if not same:
                    shown.append(f"{name}={value!r}")
        except Exception:  # a half-built object: never fail in repr
            return object.__repr__(self)
        return f"{type(self).__name__}({', '.join(shown)})"

