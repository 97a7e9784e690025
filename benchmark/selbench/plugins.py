"""Plugin discovery: built-ins registered explicitly, third parties through entry points.

>>> from selbench.plugins import get_registry
>>> reg = get_registry()
>>> reg.get("recalibrator", "temperature").name
'temperature'
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pluggy
from pydantic import BaseModel, ValidationError

from selbench import hookspecs
from selbench.api import KINDS, Plugin

__all__ = [
    "AUTOLOAD_ENV",
    "PluginError",
    "Registered",
    "Registry",
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
class Registered:
    """A plugin descriptor together with the kind and the package that provided it."""

    kind: str
    plugin: Plugin
    provider: str

    @property
    def name(self) -> str:
        return self.plugin.name

    def validate_params(self, params: dict[str, Any] | None) -> BaseModel:
        """Validate ``params`` against the plugin's model (raises pydantic ValidationError)."""
        return self.plugin.params.model_validate(params or {})

    def build(self, params: dict[str, Any] | BaseModel | None = None) -> Any:
        """Validate ``params`` and call the factory with them as keyword arguments."""
        if not isinstance(params, BaseModel):
            params = self.validate_params(params)
        return self.plugin.factory(**params.model_dump())


def _autoload_disabled() -> bool:
    return os.environ.get(AUTOLOAD_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def make_plugin_manager(*, autoload: bool | None = None) -> pluggy.PluginManager:
    """A pluggy manager with selbench's hookspecs, the built-ins, and (unless disabled)
    every module registered in the ``selbench`` entry-point group."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    import selbench_plugins

    pm.register(selbench_plugins, name=BUILTIN_NAME)
    if autoload is None:
        autoload = not _autoload_disabled()
    if autoload:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    return pm


class Registry:
    """Every plugin of every kind, by name, with clear errors for clashes and typos."""

    def __init__(self, pm: pluggy.PluginManager):
        self.pm = pm
        self._by_kind: dict[str, dict[str, Registered]] = {k: {} for k in KINDS}
        for kind in KINDS:
            hook = getattr(pm.hook, hookspecs.HOOK_FOR_KIND[kind])
            for impl in hook.get_hookimpls():
                provider = impl.plugin_name
                version = _provider_version(pm, impl.plugin)
                for plugin in impl.function() or ():
                    if not isinstance(plugin, Plugin):
                        raise PluginError(
                            f"{provider}: {hookspecs.HOOK_FOR_KIND[kind]}() must return "
                            f"selbench.Plugin objects, got {type(plugin).__name__}"
                        )
                    if plugin.version is None and version is not None:
                        plugin = Plugin(
                            plugin.name, plugin.factory, plugin.params, plugin.summary, version
                        )
                    existing = self._by_kind[kind].get(plugin.name)
                    if existing is not None:
                        raise PluginError(
                            f"{kind} plugin name {plugin.name!r} is provided twice: by "
                            f"{existing.provider!r} and by {provider!r}; uninstall or rename one"
                        )
                    self._by_kind[kind][plugin.name] = Registered(kind, plugin, provider)

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
            raise PluginError(unknown_message(kind, name, self.names(kind))) from None

    def providers(self) -> dict[str, str | None]:
        """Provider name -> version, for provenance records."""
        out: dict[str, str | None] = {}
        for kind in KINDS:
            for reg in self._by_kind[kind].values():
                out[reg.provider] = reg.plugin.version
        return dict(sorted(out.items()))

    @staticmethod
    def _check_kind(kind: str) -> None:
        if kind not in KINDS:
            raise PluginError(unknown_message("plugin kind", kind, list(KINDS)))


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


def format_validation_error(exc: ValidationError, prefix: str) -> list[str]:
    """Pydantic errors as ``prefix.loc: message`` lines (``loc`` in YAML-path form)."""
    lines = []
    for err in exc.errors():
        path = prefix
        for part in err["loc"]:
            if isinstance(part, int):
                path += f"[{part}]"
            else:
                path += f".{part}" if path else str(part)
        lines.append(f"{path}: {err['msg']}")
    return lines
