"""The plugin contract: built-in kinds never import each other's modules."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
from conftest import REPO
from selbench import ModelOutputs
from selbench.api import (
    KINDS,
)
from selbench.plugins import (
    BUILTIN_NAME,
    get_registry,
)

PLUGINS_ROOT = REPO / "plugins" / "selbench_plugins"
KIND_PACKAGES = ("datasets", "backbones", "selectors", "recalibrators", "losses", "schemes")

#: params a built-in needs to be built at all (construction reads no file)
REQUIRED = {("dataset", "precomputed"): {"path": "outputs.npz"},
            ("backbone", "wilds-densenet121"): {"checkpoint": "best_model.pth"},
            ("backbone", "wilds-resnet50"): {"checkpoint": "best_model.pth"}}

BUILTINS = [(kind, name) for kind in KINDS for name in get_registry().names(kind)
            if get_registry().get(kind, name).provider == BUILTIN_NAME]


def synthetic(n=200, d=6, k=3, seed=0) -> ModelOutputs:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=(d, k))
    labels = (x @ w + rng.normal(size=(n, k))).argmax(1)
    return ModelOutputs(features=x, logits=(2 * x @ w).astype(np.float32), labels=labels)


def build(kind: str, name: str, params: dict | None = None):
    return get_registry().get(kind, name).build({**REQUIRED.get((kind, name), {}),
                                                 **(params or {})})


# --------------------------------------------------------------------------- imports
def _imported(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in a plugin file."""
    package = ".".join(path.relative_to(REPO / "plugins").with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            found.append((node.lineno, mod))
            found += [(node.lineno, f"{mod}.{a.name}") for a in node.names if a.name != "*"]
    return found


def test_no_kind_imports_another_kinds_modules():
    """Each kind of the built-ins is self-contained: what two kinds share lives in selbench
    (selbench.torchutils, selbench.vision, selbench.checks), never in a kind's module."""
    offending = []
    for kind in KIND_PACKAGES:
        for path in sorted((PLUGINS_ROOT / kind).rglob("*.py")):
            for line, mod in _imported(path):
                parts = mod.split(".")
                if parts[0] != "selbench_plugins" or len(parts) < 2:
                    continue
                if parts[1] != kind:
                    offending.append(f"{path.relative_to(REPO)}:{line} imports {mod}")
    assert offending == []


def test_the_scan_sees_relative_and_absolute_imports(tmp_path):
    fake = PLUGINS_ROOT / "selectors" / "_probe_for_test.py"
    fake.write_text("from ..recalibrators import _common\nimport selbench_plugins.datasets\n"
                    "from . import baselines\n")
    try:
        mods = [m for _, m in _imported(fake)]
    finally:
        fake.unlink()
    assert "selbench_plugins.recalibrators._common" in mods
    assert "selbench_plugins.datasets" in mods
    assert "selbench_plugins.selectors.baselines" in mods


