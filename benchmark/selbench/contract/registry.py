"""Plugin discovery: built-ins registered explicitly, third parties through entry points.

A third-party plugin that fails to load never stops selbench: a module that cannot be
imported (or calls ``sys.exit``), that pluggy refuses to register, or whose hook raises or
returns something other than :class:`~selbench.contract.api.Plugin` objects is skipped with a
warning on stderr naming its distribution, version and entry point; every other plugin,
and every spec that does not use it, works as before. Two distributions providing one name
stay an error (it is ambiguous), and so does any failure of the built-ins.

Entry-point names are not plugin names, and two distributions may well pick the same one
(``plugins = acme_plugins``, ``plugins = other_plugins``): both are loaded (issue 29), the
first found under the entry point's name and the next under ``<entry point>@<distribution>``
(their :attr:`Registered.provider`; the :class:`Origin` keeps the real entry-point name), and
their plugins then meet the rule above. The built-ins' name (``selbench_plugins``) is
selbench's own: another distribution's entry point of that name is always registered as
``selbench_plugins@<distribution>``, never in the built-ins' place. The same distribution found
twice on ``sys.path`` (an egg-info next to an installed copy) is loaded once, without a word,
as Python imports one copy. Two distributions that install one module (whose entry points
therefore import the same object) cannot both be loaded: the second is skipped with a warning
naming both distributions and the entry point.

A factory that is a class must subclass its kind's base class (:data:`selbench.contract.api.KIND_BASES`:
a recalibrator's factory a :class:`~selbench.contract.api.Recalibrator`, a loss's a
:class:`~selbench.contract.api.SelectionLoss` or :class:`~selbench.contract.api.CoverageLoss`, ...). This is
checked when the plugin is registered: a third-party plugin that fails it is skipped with a
warning naming the plugin, its kind and its distribution; a built-in one is an error. A
factory that is a function may build anything; what it returns is checked when it is built.

>>> from selbench.contract.registry import get_registry
>>> reg = get_registry()
>>> reg.get("recalibrator", "temperature").name
'temperature'
>>> reg.get("recalibrator", "temperature").describe()
"recalibrator 'temperature' (selbench 0.1.0)"
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pluggy
from pydantic import BaseModel, ValidationError

from selbench.contract import hookspecs
from selbench.contract.api import KIND_BASES, KINDS, Plugin
from selbench.contract.search import Tune, declared_space

__all__ = [
    "AUTOLOAD_ENV",
    "Origin",
    "PluginError",
    "Registered",
    "Registry",
    "SelbenchPluginManager",
    "factory_problem",
    "get_registry",
    "make_plugin_manager",
]

#: set to 1/true/yes to skip loading third-party plugins from the ``selbench`` entry points
AUTOLOAD_ENV = "SELBENCH_DISABLE_PLUGIN_AUTOLOAD"
ENTRY_POINT_GROUP = "selbench"
BUILTIN_NAME = "selbench_plugins"


class PluginError(LookupError):
    """A plugin could not be found, or two packages provide the same name."""


@dataclass(frozen=True)
class Origin:
    """Where a registered plugin module comes from, for messages and provenance.

    Attributes:
        module: the plugin module's (or object's) name, e.g. ``my_plugins``.
        distribution: the installed distribution that provides it, e.g.
            ``my-selbench-plugins`` (None when unknown: a module registered by hand).
        version: the distribution's version.
        entry_point: the entry point's name in the ``selbench`` group (None for the
            built-ins and modules registered by hand).
    """

    module: str
    distribution: str | None = None
    version: str | None = None
    entry_point: str | None = None

    def package(self) -> str:
        """``my-selbench-plugins 0.3`` (the module's name when no distribution is known)."""
        if self.distribution is None:
            return self.module
        return f"{self.distribution} {self.version}" if self.version else self.distribution

    def __str__(self) -> str:
        """``plugin module 'm' of distribution 'd 0.3' (entry point 'e' in group 'selbench')``."""
        text = f"plugin module {self.module!r}"
        if self.distribution is not None:
            text += f" of distribution {self.package()!r}"
        if self.entry_point is not None:
            text += f" (entry point {self.entry_point!r} in group {ENTRY_POINT_GROUP!r})"
        return text


@dataclass(frozen=True)
class Registered:
    """A plugin descriptor together with the kind and the package that provided it.

    ``provider`` is the name the module is registered under (its entry point's name, or
    ``selbench_plugins`` for the built-ins); ``origin`` says which distribution and
    version it comes from.
    """

    kind: str
    plugin: Plugin
    provider: str
    origin: Origin | None = None

    @property
    def name(self) -> str:
        return self.plugin.name

    @property
    def distribution(self) -> str | None:
        """The providing distribution's name (None when unknown)."""
        return self.origin.distribution if self.origin else None

    @property
    def package_name(self) -> str:
        """Who provides the plugin, as a user installed it: a third party's distribution
        name (``pip install <it>``), not its entry point's; ``selbench_plugins`` for the
        built-ins (and the registration name when no distribution is known)."""
        if self.provider == BUILTIN_NAME or self.origin is None or not self.origin.distribution:
            return self.provider
        return self.origin.distribution

    @property
    def distribution_version(self) -> str | None:
        return self.origin.version if self.origin else None

    def describe(self) -> str:
        """The plugin for messages: ``recalibrator 'beta' (my-plugins 0.3)``."""
        where = self.origin.package() if self.origin else self.provider
        return f"{self.kind} {self.name!r} ({where})"

    def search_space(self) -> dict[str, Tune]:
        """Parameter -> the default search space its signature declares (a :class:`Tune` in
        the parameter's ``Annotated`` metadata); empty when nothing is tunable."""
        return declared_space(self.plugin.params)

    def validate_params(self, params: dict[str, Any] | None) -> BaseModel:
        """Validate ``params`` against the plugin's model (raises pydantic ValidationError)."""
        return self.plugin.params.model_validate(params or {})

    def build(self, params: dict[str, Any] | BaseModel | None = None) -> Any:
        """Call the factory with ``params`` as keyword arguments and return the plugin.

        ``params`` is a validated instance of the plugin's model (as a loaded spec carries
        them: not validated again), or a dict (or None) that is validated first. The object
        a factory function returns must be of the kind's base class (a ``TypeError``
        naming the plugin otherwise).
        """
        if not isinstance(params, BaseModel):
            params = self.validate_params(params)
        obj = self.plugin.factory(**params.model_dump())
        bases = KIND_BASES[self.kind]
        if not isinstance(obj, bases):
            raise TypeError(
                f"{self.describe()}: its factory returned {type(obj).__module__}."
                f"{type(obj).__qualname__}, which is not a {_base_names(bases)}"
            )
        return obj


def _autoload_disabled() -> bool:
    return os.environ.get(AUTOLOAD_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def _failure(exc: BaseException, limit: int = 400) -> str:
    """``ImportError: No module named 'foo'``, ``called sys.exit(3)``: one line."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})"
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def warn(message: str) -> None:
    """Print ``selbench: warning: <message>`` on stderr."""
    print(f"selbench: warning: {message}", file=sys.stderr, flush=True)


class SelbenchPluginManager(pluggy.PluginManager):
    """A pluggy manager whose entry-point loading skips (with a warning) any plugin module
    that fails to import or to register, and remembers every module's :class:`Origin`."""

    def __init__(self, project_name: str = hookspecs.PROJECT):
        super().__init__(project_name)
        #: registered name -> where the module comes from
        self.origins: dict[str, Origin] = {}
        #: a message for every plugin module (or hook result) that was skipped
        self.skipped: list[str] = []

    def skip(self, message: str) -> None:
        self.skipped.append(message)
        warn(f"skipped {message}")

    def load_setuptools_entrypoints(self, group: str, name: str | None = None) -> int:
        """pluggy's loader (same selection: the group, optionally one name, not blocked; same
        ``list_plugin_distinfo``), one entry point at a time: an entry point whose module
        fails to import or register is skipped with a warning. An entry point whose name is
        already registered from another distribution is registered as
        ``<entry point>@<distribution>`` (see the module docstring).

        Returns the number of plugin modules loaded.
        """
        import importlib.metadata

        count = 0
        for dist in list(importlib.metadata.distributions()):
            dist_name, version = _dist_name_version(dist)
            try:
                entry_points = list(dist.entry_points)
            except Exception as exc:  # a malformed entry_points.txt
                self.skip(f"distribution {dist_name!r}: unreadable entry points: {_failure(exc)}")
                continue
            for ep in entry_points:
                if (
                    ep.group != group
                    or (name is not None and ep.name != name)
                    or self.is_blocked(ep.name)
                ):
                    continue
                key = self.registration_name(ep.name, dist_name)
                if key is not None:
                    count += self._load_entry_point(ep, dist, key,
                                                    Origin(ep.value, dist_name, version, ep.name))
        return count

    def registration_name(self, entry_point: str, distribution: str) -> str | None:
        """The name to register ``distribution``'s entry point ``entry_point`` under: its
        own name while free (the built-ins' name only for selbench's own distribution), else
        ``<entry point>@<distribution>``; None when it is already registered from this
        distribution (the same distribution found twice on ``sys.path``: Python imports one
        copy)."""
        own = entry_point != BUILTIN_NAME or _canonical_dist(distribution) == "selbench"
        if own and not self.has_plugin(entry_point):
            return entry_point
        if own and self._from(entry_point, distribution):
            return None
        alias = f"{entry_point}@{distribution}"
        return None if self.has_plugin(alias) else alias

    def _from(self, name: str, distribution: str | None) -> bool:
        """Whether the module registered as ``name`` was loaded from ``distribution``."""
        origin = self.origins.get(name)
        return (origin is not None and distribution is not None
                and _canonical_dist(origin.distribution or "") == _canonical_dist(distribution))

    def _load_entry_point(self, ep: Any, dist: Any, key: str, origin: Origin) -> int:
        """Import ``ep``'s module and register it as ``key``: 1, or 0 when it is skipped
        (with a warning, unless it is a module this distribution has registered already)."""
        try:
            plugin = ep.load()
        except (Exception, SystemExit) as exc:
            self.skip(f"{origin}: {_failure(exc)}")
            return 0
        if self.is_registered(plugin):
            other = self.get_name(plugin)
            if not self._from(other, origin.distribution):
                self.skip(f"{origin}: its module is the one already registered as {other!r} from "
                          f"{_package(self.origin(other))}: both distributions install a "
                          f"module {origin.module!r} and only one can be imported; uninstall one")
            return 0
        try:
            registered = self.register(plugin, name=key)
        except (Exception, SystemExit) as exc:
            if self.has_plugin(key) and self.get_plugin(key) is plugin:
                self.unregister(name=key)  # older pluggy registers before checking
            self.skip(f"{origin}: cannot be registered: {_failure(exc)}")
            return 0
        if registered is None:  # blocked
            return 0
        self._plugin_distinfo.append((plugin, _distinfo(dist)))  # as pluggy's loader
        self.origins[key] = origin
        return 1

    def origin(self, name: str) -> Origin:
        """Where the plugin module registered as ``name`` comes from."""
        if name not in self.origins:
            self.origins[name] = _origin_of(name, self.get_plugin(name))
        return self.origins[name]


def _distinfo(dist: Any) -> Any:
    """What pluggy's own loader stores for ``dist``: the distribution itself from pluggy 1.7
    (whose ``list_plugin_distinfo`` wraps it in a ``DistFacade``), the ``DistFacade`` before
    (whose ``list_plugin_distinfo`` returns what is stored)."""
    if hasattr(pluggy.PluginManager, "list_plugin_distributions"):
        return dist
    from pluggy._manager import DistFacade  # pluggy < 1.7

    return DistFacade(dist)


def _dist_name_version(dist: Any) -> tuple[str, str | None]:
    try:
        name = dist.metadata["Name"]
    except Exception:
        name = None
    try:
        version = dist.version
    except Exception:
        version = None
    return str(name or getattr(dist, "_path", "unknown distribution")), version


def _canonical_dist(name: str) -> str:
    """A distribution's name as packaging compares them (``My_Plugins`` is ``my-plugins``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _origin_of(name: str, module: Any) -> Origin:
    """The :class:`Origin` of a module registered by hand (or the built-ins)."""
    mod_name = getattr(module, "__name__", None) or name
    if name == BUILTIN_NAME:
        from selbench.util.version import __version__

        return Origin(mod_name, "selbench", __version__)
    top = mod_name.split(".")[0]
    try:
        from importlib.metadata import packages_distributions, version

        dists = packages_distributions().get(top) or []
        if dists:
            return Origin(mod_name, dists[0], version(dists[0]))
    except Exception:
        pass
    return Origin(mod_name)


def make_plugin_manager(*, autoload: bool | None = None) -> SelbenchPluginManager:
    """A pluggy manager with selbench's hookspecs, the built-ins, and (unless disabled)
    every module registered in the ``selbench`` entry-point group that loads."""
    pm = SelbenchPluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    # the built-ins are found through the same entry point a third-party package declares
    # (selbench's own distribution registers ``selbench_plugins`` in the group): the core
    # never imports them by name
    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=BUILTIN_NAME)
    if not pm.has_plugin(BUILTIN_NAME):
        skipped = "; ".join(pm.skipped) or (
            f"no entry point {BUILTIN_NAME!r} in group {ENTRY_POINT_GROUP!r}: is selbench "
            "installed (pip install -e .)?")
        raise PluginError(f"the built-in plugins ({BUILTIN_NAME}) cannot be imported: {skipped}")
    if autoload is None:
        autoload = not _autoload_disabled()
    if autoload:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    return pm


def _result_problem(result: Any) -> tuple[list[Plugin], str | None]:
    """The hook result as a list of plugins, or what is wrong with it."""
    if result is None:
        return [], None
    if isinstance(result, (str, bytes, Plugin)) or not hasattr(result, "__iter__"):
        return [], f"it returned {type(result).__name__}, expected a list of selbench.Plugin"
    plugins = list(result)
    bad = sorted({type(p).__name__ for p in plugins if not isinstance(p, Plugin)})
    if bad:
        return [], f"it must return selbench.Plugin objects, got {', '.join(bad)}"
    for p in plugins:
        if not isinstance(p.name, str) or not p.name:
            return [], f"plugin name {p.name!r} is not a non-empty string"
        if not callable(p.factory):
            return [], f"plugin {p.name!r}: factory {p.factory!r} is not callable"
        if not (isinstance(p.params, type) and issubclass(p.params, BaseModel)):
            return [], f"plugin {p.name!r}: params {p.params!r} is not a pydantic model class"
    names = [p.name for p in plugins]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return [], f"it returns the name(s) {', '.join(map(repr, twice))} more than once"
    return plugins, None


class Registry:
    """Every plugin of every kind, by name, with clear errors for clashes and typos.

    Attributes:
        skipped: a message for every third-party plugin module or hook result that was
            skipped because it failed (each was also printed as a warning).
    """

    def __init__(self, pm: pluggy.PluginManager):
        self.pm = pm
        self.skipped: list[str] = list(getattr(pm, "skipped", ()))
        self._by_kind: dict[str, dict[str, Registered]] = {k: {} for k in KINDS}
        for kind in KINDS:
            hook_name = hookspecs.HOOK_FOR_KIND[kind]
            hook = getattr(pm.hook, hook_name)
            for impl in hook.get_hookimpls():
                provider = impl.plugin_name
                origin = (pm.origin(provider) if isinstance(pm, SelbenchPluginManager)
                          else _origin_of(provider, impl.plugin))  # fmt: skip
                try:
                    plugins, problem = _result_problem(impl.function())
                except (Exception, SystemExit) as exc:
                    plugins, problem = [], _failure(exc)
                if problem is not None:
                    self._reject(provider, f"{hook_name}() of {origin}", problem)
                    continue
                version = _provider_version(pm, impl.plugin)
                for plugin in plugins:
                    problem = factory_problem(kind, plugin)
                    if problem is not None:
                        self._reject(provider, f"{kind} plugin {plugin.name!r} of {origin}",
                                     problem)
                        continue
                    if plugin.version is None and version is not None:
                        plugin = dataclasses.replace(plugin, version=version)
                    existing = self._by_kind[kind].get(plugin.name)
                    if existing is not None:
                        raise PluginError(
                            f"{kind} plugin name {plugin.name!r} is provided twice: by "
                            f"{existing.provider!r} ({_package(existing.origin)}) and by "
                            f"{provider!r} ({origin.package()}); uninstall or rename one"
                        )
                    self._by_kind[kind][plugin.name] = Registered(kind, plugin, provider, origin)

    def _reject(self, provider: str, where: str, problem: str) -> None:
        """A built-in that fails is an error; a third party's failure is skipped, with a
        warning."""
        if provider == BUILTIN_NAME:
            raise PluginError(f"built-in plugins: {where}: {problem}")
        self.skipped.append(f"{where}: {problem}")
        warn(f"skipped {where}: {problem}")

    def names(self, kind: str) -> list[str]:
        self._check_kind(kind)
        return sorted(self._by_kind[kind])

    def all(self, kind: str) -> list[Registered]:
        self._check_kind(kind)
        return [self._by_kind[kind][n] for n in self.names(kind)]

    def get(self, kind: str, name: str) -> Registered:
        self._check_kind(kind)
        try:
            return self._by_kind[kind][name]
        except KeyError:
            msg = unknown_message(kind, name, self.names(kind))
            if self.skipped:
                msg += (
                    f" ({len(self.skipped)} third-party plugin module(s) or hook result(s) "
                    "failed to load and were skipped; see the warnings)"
                )
            raise PluginError(msg) from None

    def providers(self) -> dict[str, str | None]:
        """Provider name -> version, for provenance records."""
        out: dict[str, str | None] = {}
        for kind in KINDS:
            for reg in self._by_kind[kind].values():
                out[reg.provider] = reg.plugin.version
        return dict(sorted(out.items()))

    def packages(self) -> dict[str, str | None]:
        """Providing package (:attr:`Registered.package_name`: a third party's distribution)
        -> version, for provenance records and ``selbench plugins``."""
        out: dict[str, str | None] = {}
        for kind in KINDS:
            for reg in self._by_kind[kind].values():
                out[reg.package_name] = reg.plugin.version
        return dict(sorted(out.items()))

    @staticmethod
    def _check_kind(kind: str) -> None:
        if kind not in KINDS:
            raise PluginError(unknown_message("plugin kind", kind, list(KINDS)))


def _base_names(bases: tuple[type, ...]) -> str:
    """``selbench.Recalibrator``, ``selbench.SelectionLoss or selbench.CoverageLoss``."""
    return " or ".join(f"selbench.{b.__name__}" for b in bases)


def factory_problem(kind: str, plugin: Plugin) -> str | None:
    """What is wrong with a plugin's factory for its kind, or None: a factory class must
    subclass the kind's base class (:data:`~selbench.contract.api.KIND_BASES`); a factory function
    is checked when it is built."""
    factory = plugin.factory
    bases = KIND_BASES[kind]
    if isinstance(factory, type) and not issubclass(factory, bases):
        return (f"its factory {factory.__module__}.{factory.__qualname__} is not a subclass "
                f"of {_base_names(bases)}")
    return None


def _package(origin: Origin | None) -> str:
    return origin.package() if origin is not None else "unknown distribution"


def unknown_message(kind: str, name: str, known: list[str]) -> str:
    msg = f"unknown {kind} {name!r}"
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    if close:
        msg += "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    elif known:
        msg += f"; available: {', '.join(known)}"
    return msg


def _provider_version(pm: pluggy.PluginManager, module: Any) -> str | None:
    for plugin, dist in pm.list_plugin_distinfo():
        if plugin is module:
            return dist.version
    version = getattr(module, "__version__", None)
    if version is None:
        top = getattr(module, "__name__", "").split(".")[0]
        try:
            from importlib.metadata import version as dist_version

            version = dist_version(top)
        except Exception:
            version = None
    return version


@lru_cache(maxsize=2)
def _cached_registry(autoload: bool) -> Registry:
    return Registry(make_plugin_manager(autoload=autoload))


def get_registry(*, refresh: bool = False) -> Registry:
    """The process-wide registry (rebuilt when ``refresh`` is true)."""
    autoload = not _autoload_disabled()
    if refresh:
        _cached_registry.cache_clear()
    return _cached_registry(autoload)


def format_validation_error(exc: ValidationError, prefix: str,
                            model: type[BaseModel] | None = None) -> list[str]:
    """Pydantic errors as ``prefix.loc: message`` lines (``loc`` in YAML-path form). With
    the ``model`` validated, an unknown key says which valid name it is close to ("did you
    mean ...") and lists the valid names, as an unknown plugin name does."""
    lines = []
    for err in exc.errors():
        path = prefix
        for part in err["loc"]:
            if isinstance(part, int):
                path += f"[{part}]"
            else:
                path += f".{part}" if path else str(part)
        msg = err["msg"]
        if err["type"] == "extra_forbidden" and model is not None and err["loc"]:
            known = _field_names_at(model, err["loc"][:-1])
            if known is not None:
                msg = unknown_key_message(str(err["loc"][-1]), known)
        lines.append(f"{path}: {msg}" if path else msg)
    return lines


def unknown_key_message(name: str, known: list[str]) -> str:
    """``unknown key 'seed'; did you mean 'seeds'? valid keys: ...``."""
    msg = f"unknown key {name!r}"
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    if close:
        msg += "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    else:
        msg += ";"
    return msg + (f" valid keys: {', '.join(known)}" if known else " it takes no keys")


def _field_names_at(model: Any, loc: tuple) -> list[str] | None:
    """The field names of the pydantic model found at ``loc`` inside ``model`` (through
    lists and optional fields; a list's index keeps its item's model), or None when it
    cannot be told."""
    for part in loc:
        if isinstance(part, int):
            continue
        if not _is_model(model) or part not in model.model_fields:
            return None
        model = _inner_model(model.model_fields[part].annotation)
    return list(model.model_fields) if _is_model(model) else None


def _is_model(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, BaseModel)


def _inner_model(annotation: Any) -> Any:
    """The pydantic model an annotation holds (``X``, ``list[X]``, ``X | None``), or None."""
    if _is_model(annotation):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None
