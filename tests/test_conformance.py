"""Every registered plugin (built-in or third-party) honours the plugin contract, checked by
the shipped conformance kit (:mod:`selbench.testing`): one test per plugin and check, with
ids such as ``recalibrator-temperature-check_pickle``.

Plugins are built with their default params, except those below: trained components get a
few epochs (their defaults train for 1000), and plugins with a required input get one.
Datasets whose files are absent, and backbones reading inputs the kit cannot synthesise,
are skipped with the reason."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from selbench.contract.api import KINDS
from selbench.contract.registry import get_registry
from selbench.testing import make_outputs, parametrize_with_checks

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REGISTRY = get_registry()
TRAINING = {"epochs": 3, "batch_size": 40}


def _precomputed_file() -> str:
    """A tiny ``.npz`` of model outputs for the ``precomputed`` dataset (removed at exit)."""
    folder = Path(tempfile.mkdtemp(prefix="selbench-conformance-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    outputs = make_outputs(60, 3, 4, seed=5)
    path = folder / "outputs.npz"
    np.savez(path, labels=outputs.labels, logits=outputs.logits, features=outputs.features)
    return str(path)


def _fdshifts_folder() -> str:
    """A tiny FD-Shifts ``test_results`` folder (``raw_logits.npz``: logits | label | set)."""
    folder = Path(tempfile.mkdtemp(prefix="selbench-conformance-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    outputs = make_outputs(60, 3, 4, seed=6)
    sets = np.repeat([0, 1], 30)
    np.savez_compressed(folder / "raw_logits.npz",
                        np.column_stack([outputs.logits, outputs.labels, sets]))
    return str(folder)


def _calarena_folder() -> str:
    """A tiny CalArena benchmark (``cv-multiclass.h5``, group ``c10/m``) when h5py is
    installed; else an absent folder, whose checks are skipped as data not available."""
    folder = Path(tempfile.mkdtemp(prefix="selbench-conformance-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    try:
        import h5py
    except ImportError:
        return str(folder / "absent")
    outputs = make_outputs(60, 3, 4, seed=7)
    p = outputs.probabilities().astype(np.float32)
    with h5py.File(folder / "cv-multiclass.h5", "w") as f:
        grp = f.create_group("c10/m")
        for part, rows in (("cal", slice(0, 40)), ("test", slice(40, 60))):
            grp.create_dataset(f"probas_{part}", data=p[rows])
            grp.create_dataset(f"labels_{part}", data=outputs.labels[rows].astype(np.int32))
    return str(folder)


def _sentences_folder() -> str:
    """Two tiny domains of labelled sentences in the UCI release's format (removed at exit)."""
    folder = Path(tempfile.mkdtemp(prefix="selbench-conformance-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    for name, thing in (("a.txt", "food"), ("b.txt", "phone")):
        (folder / name).write_bytes(b"".join(
            f'"The {thing}, for once, was {word}."\t{i % 2}\r\n'.encode()
            for i, word in enumerate(["awful", "great"] * 10)))
    return str(folder)


#: (kind, name) -> params for the conformance run
PARAMS: dict[tuple[str, str], dict] = {
    ("recalibrator", "mlp"): {"hidden": [16], "epochs": 20},
    ("selector", "mlp"): {"hidden": [16]},
    ("selector", "meta-features"): {"hidden": [16]},
    **{("scheme", name): TRAINING for name in ("selection", "sequential", "joint")},
    ("backbone", "digits-net"): {"epochs": 1, "width": 2, "feature_dim": 8},
    ("dataset", "precomputed"): {"path": _precomputed_file()},
    ("dataset", "fd-shifts"): {"folder": _fdshifts_folder()},
    ("dataset", "calarena"): {"folder": _calarena_folder(), "benchmark": "cv-multiclass",
                              "dataset": "c10", "model": "m"},
    ("dataset", "labelled-sentences"): {"folder": _sentences_folder(),
                                        "files": {"a": "a.txt", "b": "b.txt"},
                                        "source": "a", "target": "b"},
    # they read image items, which the kit does not synthesise: their checks are skipped
    ("backbone", "wilds-densenet121"): {"checkpoint": "absent.pth"},
    ("backbone", "wilds-resnet50"): {"checkpoint": "absent.pth"},
}

PLUGINS = [(kind, name, PARAMS.get((kind, name)))
           for kind in KINDS for name in REGISTRY.names(kind)]


@parametrize_with_checks(PLUGINS)
def test_plugin_conforms(check):
    check()


def test_every_selector_and_recalibrator_is_covered():
    """The run above holds the checks that matter for every selector and recalibrator."""
    ids = {p.id for p in parametrize_with_checks(
        [(k, n, PARAMS.get((k, n))) for k in ("selector", "recalibrator")
         for n in REGISTRY.names(k)]).args[1]}
    for kind in ("selector", "recalibrator"):
        for name in REGISTRY.names(kind):
            for check in ("check_fit_is_deterministic", "check_does_not_mutate_inputs",
                          "check_unfitted", "check_clone", "check_pickle",
                          "check_outputs_are_per_example"):
                assert f"{kind}-{name}-{check}" in ids
    for name in REGISTRY.names("selector"):  # trainable or not (Selector.fit_many)
        assert f"selector-{name}-check_fit_many_equals_fit" in ids
    assert "selector-mlp-check_trainable_protocol" in ids
    for name in ("temperature", "platt", "mlp", "none"):
        assert f"recalibrator-{name}-check_joint_fit_many_equals_fit" in ids
        assert f"recalibrator-{name}-check_module_protocol" in ids
    assert "recalibrator-histogram-binning-check_module_protocol" not in ids
