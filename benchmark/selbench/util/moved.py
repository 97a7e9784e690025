"""Module paths that moved in 0.2 (the core was grouped into subpackages): each old path
still imports, for one release, and re-exports the names of its new home with a
:class:`DeprecationWarning` that names the new path.

:data:`MOVED` is the one table of old → new paths: the re-export modules read it, and so
does the code digest (:mod:`selbench.execution.codeid`), so that a third-party plugin that
still imports an old path is keyed on the code it really runs.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["MOVED", "reexport"]

#: old module path -> the module(s) that now hold its names, searched in order
MOVED: dict[str, tuple[str, ...]] = {
    "selbench.api": ("selbench.contract.api", "selbench.contract.params", "selbench.contract.modules"),
    "selbench.data": ("selbench.contract.data",),
    "selbench.checks": ("selbench.contract.checks",),
    "selbench.hookspecs": ("selbench.contract.hookspecs",),
    "selbench.inputs": ("selbench.contract.inputs",),
    "selbench.vision": ("selbench.contract.vision",),
    "selbench.plugins": ("selbench.contract.registry",),
    "selbench.smooth": ("selbench.measure.smooth",),
    "selbench.riskcoverage": ("selbench.measure.riskcoverage",),
    "selbench.bootstrap": ("selbench.measure.bootstrap", "selbench.measure.resampled"),
    "selbench.stats": ("selbench.measure.stats",),
    "selbench.evaluate": ("selbench.measure.evaluate",),
    "selbench.engine": ("selbench.training.engine",),
    "selbench.torchutils": ("selbench.training.torchutils",),
    "selbench.results": ("selbench.store.results",),
    "selbench.estimator": ("selbench.library.estimator",),
    "selbench.leaderboard": ("selbench.reporting.leaderboard", "selbench.reporting.loading"),
    "selbench.runner": ("selbench.execution.runner", "selbench.execution.errors",
                        "selbench.execution.keys", "selbench.execution.guard",
                        "selbench.execution.cells", "selbench.execution.extraction",
                        "selbench.execution.distributed", "selbench.execution.results_api"),
    "selbench.executors": ("selbench.execution.executors",),
    "selbench.codeid": ("selbench.execution.codeid",),
}


def reexport(old: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the old module ``old``: a name is looked up in the
    new modules of ``MOVED[old]`` (imported when first asked), with a DeprecationWarning."""
    targets = MOVED[old]

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        for target in targets:
            module = importlib.import_module(target)
            if hasattr(module, name):
                warnings.warn(
                    f"{old} is deprecated and will be removed in the next release: "
                    f"import {name} from {target}",
                    DeprecationWarning,
                    stacklevel=2,
                )
                return getattr(module, name)
        raise AttributeError(f"module {old!r} has no attribute {name!r} (it moved to "
                             f"{' / '.join(targets)})")

    def __dir__() -> list[str]:
        names: set[str] = set()
        for target in targets:
            names.update(dir(importlib.import_module(target)))
        return sorted(names)

    return __getattr__, __dir__
