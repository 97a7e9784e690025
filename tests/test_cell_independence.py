"""Issue 34: a cell's content does not depend on which other cells were fitted with it.

The runner fits a method's unfinished cells in one ``fit_many`` call (its seeds as replicas
of one batched model); a finished cell is reused by a later run whose batch may differ
(seeds [0] first, then [0, 1, 2]). The MLP recalibrator's replicas used to differ in their
last float bits with the number of replicas and their place in the stack (the CPU kernels
compute a tensor's tail, and a stack of one, on other code paths), so a reused cell differed
from the same cell fitted in a batch; a spare replica trained last makes each replica's
arithmetic the same whichever others train with it (the MLP recalibrator's own fit, and the
training schemes with one training β per seed; with several, ``train_beta: per_beta``, the
selector's lanes still differ in their last bits: not covered yet)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import tiny_spec
from selbench.contract.api import FitContext
from selbench.contract.data import ModelOutputs
from selbench.execution.runner import run
from selbench_plugins.recalibrators.mlp import MLPRecalibrator

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _outputs(seed: int, n: int = 300, d: int = 24, k: int = 5) -> ModelOutputs:
    rng = np.random.default_rng(seed)
    return ModelOutputs(logits=rng.normal(size=(n, k)).astype(np.float32),
                        labels=rng.integers(0, k, n),
                        features=rng.normal(size=(n, d)).astype(np.float32))


def _fit(seeds, params) -> dict[int, MLPRecalibrator]:
    recs = [MLPRecalibrator(**params) for _ in seeds]
    MLPRecalibrator.fit_many(recs, [_outputs(s) for s in seeds],
                             [FitContext(seed=s) for s in seeds])
    return dict(zip(seeds, recs))


def _weights(rec: MLPRecalibrator) -> list[np.ndarray]:
    return [p.detach().numpy().copy() for p in rec.module_.parameters()]


@pytest.mark.parametrize("params", [
    {"hidden": [32], "epochs": 8, "lr": 1e-2, "batch_size": 64},
    {"hidden": [16, 16], "epochs": 6, "lr": 1e-2, "batch_size": 37},  # a short last batch
])
def test_mlp_recalibrator_replica_is_bit_identical_alone_or_in_any_batch(params):
    alone = _fit([0], params)[0]
    solo = MLPRecalibrator(**params).fit(_outputs(0), FitContext(seed=0))
    for seeds in ([0, 1, 2], [2, 3, 0], [1, 0]):  # first, last and middle of the stack
        batched = _fit(seeds, params)[0]
        for a, b in zip(_weights(alone), _weights(batched)):
            np.testing.assert_array_equal(a, b, err_msg=f"seeds {seeds}")
    for a, b in zip(_weights(alone), _weights(solo)):
        np.testing.assert_array_equal(a, b)
    out = _outputs(7)
    np.testing.assert_array_equal(alone.confidence(out), _fit([1, 0], params)[0].confidence(out))


_TRAIN = {"epochs": 6, "batch_size": 64, "lr": 0.003}
METHODS = [
    {"label": "MLP recalibrator", "scheme": {"name": "recalibration"},
     "recalibrator": {"name": "mlp", "params": {"hidden": [32], "epochs": 15, "lr": 0.003}}},
    {"label": "S-MMCE sequential", "scheme": {"name": "sequential", "params": _TRAIN},
     "selector": {"name": "mlp", "params": {"hidden": [16]}},
     "recalibrator": {"name": "temperature"}, "loss": {"name": "s-mmce"},
     "coverage": {"name": "quadratic", "params": {"lam": 8}}},
    {"label": "S-TLBCE joint", "scheme": {"name": "joint", "params": _TRAIN},
     "selector": {"name": "mlp", "params": {"hidden": [16]}},
     "recalibrator": {"name": "mlp", "params": {"hidden": [8]}}, "loss": {"name": "s-tlbce"},
     "coverage": {"name": "quadratic", "params": {"lam": 8}}},
]


def test_reused_cell_equals_the_cell_fitted_with_other_seeds(tmp_path):
    """The issue's case: seeds [0] run, then [0, 1, 2] reusing seed 0's cell, against a fresh
    [0, 1, 2] run: every cell's record (metrics, thresholds, intervals) and arrays agree
    exactly."""
    grown, fresh = tmp_path / "grown", tmp_path / "fresh"
    run(tiny_spec(seeds=[0], methods=METHODS), out_dir=grown, progress=False, plots=False)
    report = run(tiny_spec(seeds=[0, 1, 2], methods=METHODS), out_dir=grown, progress=False,
                 plots=False)
    assert (report.computed, report.reused) == (6, 3)
    run(tiny_spec(seeds=[0, 1, 2], methods=METHODS), out_dir=fresh, progress=False, plots=False)
    cells = sorted(p.relative_to(fresh) for p in (fresh / "cells").rglob("*.json"))
    assert len(cells) == 9
    for rel in cells:
        a, b = json.loads((grown / rel).read_text()), json.loads((fresh / rel).read_text())
        for field in ("key", "metrics", "intervals", "selects"):
            assert a[field] == b[field], (rel, field)
    arrays = sorted(p.relative_to(fresh) for p in (fresh / "cells").rglob("*.npz"))
    assert arrays
    for rel in arrays:
        with np.load(grown / rel) as a, np.load(fresh / rel) as b:
            assert sorted(a.files) == sorted(b.files)
            for name in a.files:
                np.testing.assert_array_equal(a[name], b[name], err_msg=f"{rel}: {name}")
