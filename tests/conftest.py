"""Shared fixtures: an isolated output cache, the location of the shared real data, and one torch
thread for tiny forward passes."""

from __future__ import annotations

import contextlib
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own backbone-output cache, never the user's ~/.cache."""
    monkeypatch.setenv("SELBENCH_CACHE_DIR", str(tmp_path_factory.mktemp("selbench-cache")))


@pytest.fixture
def one_torch_thread():
    """Tiny CPU forward passes: one intra-op thread avoids oversubscribing shared CI cores
    (two threads contending with other processes made a 6-image ResNet pass take seconds).
    Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real model outputs not available: {SHARED_DATA} is absent")
    return SHARED_DATA


def tiny_spec(name: str = "tiny", seeds=(0, 1), methods=None, **experiment) -> dict:
    """A spec that runs in about a second: the paper's theory mixture, small splits."""
    if methods is None:
        methods = [
            {"label": "None", "scheme": {"name": "recalibration"}},
            {"label": "Temp. scale", "scheme": {"name": "recalibration"},
             "recalibrator": {"name": "temperature"}},
            {"label": "Confidence", "scheme": {"name": "recalibration"},
             "recalibrator": {"name": "temperature"}, "selector": {"name": "confidence"}},
        ]
    exp = {
        "name": "mixture",
        "dataset": {"name": "theory-mixture",
                    "params": {"train_size": 500, "val_size": 400, "test_size": 600}},
        "backbone": {"name": "theory-linear"},
        "fit_split": "val",
        "eval_split": "test",
        "n_fit": 300,
        "methods": methods,
    }
    exp.update(experiment)
    return {"spec_version": 1, "name": name, "seeds": list(seeds), "experiments": [exp]}


@pytest.fixture
def write_spec(tmp_path):
    """Write a spec dict as YAML and return its path."""
    import yaml

    def _write(spec: dict, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    return _write


def sampled_linear_task(rng, n: int, d: int, k: int):
    """Features ``x ~ N(0, I)`` [n, d], logits ``z = x W`` with ``W ~ N(0, 1)`` [d, k], and
    labels sampled from ``softmax(z)``: a model that is calibrated by construction, for tests
    to perturb. Draws from ``rng`` in a fixed order (x, W, then the label uniforms)."""
    x = rng.normal(size=(n, d))
    z = x @ rng.normal(size=(d, k))
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    labels = (p.cumsum(1) < rng.random((n, 1))).sum(1)
    return x, z, labels


def reseal_cell(path) -> None:
    """Rewrite a cell file edited by a test with a valid checksum, as if selbench wrote it
    (tests that fabricate results on purpose; any other edit is detected and recomputed)."""
    import json as _json

    from selbench.store.results import CellRecord

    record = CellRecord.model_validate(_json.loads(path.read_text()))
    path.write_text(_json.dumps(record.sealed().model_dump(mode="json")))


def install_distribution(root: Path, dist: str, version: str, modules: dict[str, str],
                         entry_points: dict[str, str] | None = None) -> Path:
    """Install a fake third-party distribution on ``root`` as ``pip install`` leaves it: each
    module of ``modules`` (name -> source, dedented) as ``root/<name>.py``, and a
    ``<dist>-<version>.dist-info`` folder (``-`` in ``dist`` written ``_``) with ``METADATA``
    and an ``entry_points.txt`` whose ``[selbench]`` group maps each entry-point name to its
    target (``module`` or ``module:attr``); by default one entry point per module, named
    after it. ``root`` is created if needed and returned, for the caller to put on
    ``sys.path`` or ``PYTHONPATH``."""
    root.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    if entry_points is None:
        entry_points = {module: module for module in modules}
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[selbench]\n{lines}")
    return root


@contextlib.contextmanager
def plugin_site(root: Path, dist: str, modules: dict[str, str], clear_env=()):
    """A fake third-party distribution (:func:`install_distribution`) on ``sys.path`` —
    which worker processes inherit — with entry-point autoloading on and the registry
    refreshed; the environment variables ``clear_env`` unset. Undone on exit."""
    import sys

    from selbench.contract.registry import AUTOLOAD_ENV, get_registry

    root = install_distribution(root, dist, "1.0", modules)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(root))
        mp.delenv(AUTOLOAD_ENV, raising=False)
        for name in clear_env:
            mp.delenv(name, raising=False)
        get_registry(refresh=True)
        try:
            yield root
        finally:
            for module in modules:
                sys.modules.pop(module, None)
    get_registry(refresh=True)
