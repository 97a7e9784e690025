"""Honest statistics (issue 25, item 4): seeds that cannot resample the fitting rows get no
significance test, and an absolute noise_std that drowns the selector's input is said."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from conftest import tiny_spec
from selbench.execution.runner import run
from selbench_plugins.schemes.training import warn_if_noise_drowns


def _run(write_spec, tmp_path, name, **experiment):
    out = tmp_path / name
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(write_spec(tiny_spec(name=name, seeds=(0, 1, 2, 3, 4), **experiment), f"{name}.yaml"),
            out_dir=out, progress=False, plots=False)
    return out, [str(w.message) for w in caught]


def test_seeds_fitting_the_same_rows_get_no_significance_test(write_spec, tmp_path):
    """n_fit equal to the whole fitting split (400 rows): every seed fits the same rows, the
    deterministic rows have std 0, and a constant difference used to read p = 0.031."""
    out, said = _run(write_spec, tmp_path, "shared", n_fit=400)
    assert any("every seed fits the same 400 rows of 'val'" in m for m in said)
    board = json.loads((out / "leaderboard.json").read_text())
    [exp] = board["experiments"]
    assert exp["shared_fit_rows"] is True
    stats = [row["metrics"]["ece1"]["auc"] for row in exp["rows"]]
    assert all(st["p_vs_best"] is None for st in stats)
    assert sum(st["best"] for st in stats) == 1  # the best mean only
    assert all(st["best"] == st["best_mean"] for st in stats)
    temp = next(r for r in exp["rows"] if r["method"] == "Temp. scale")["metrics"]["ece1"]["auc"]
    assert temp["std"] == 0  # deterministic on the same rows
    md = (out / "leaderboard.md").read_text()
    assert "**Every seed fits the same rows**" in md
    cell = json.loads(next((out / "cells").rglob("seed0*.json")).read_text())
    assert cell["shared_fit_rows"] is True


def test_seeds_drawing_their_own_rows_are_tested_as_before(write_spec, tmp_path):
    out, said = _run(write_spec, tmp_path, "drawn", n_fit=300)
    assert not any("every seed fits the same" in m for m in said)
    board = json.loads((out / "leaderboard.json").read_text())
    [exp] = board["experiments"]
    assert "shared_fit_rows" not in exp
    stats = [row["metrics"]["ece1"]["auc"] for row in exp["rows"]]
    assert any(st["p_vs_best"] is not None for st in stats)
    cell = json.loads(next((out / "cells").rglob("seed0*.json")).read_text())
    assert "shared_fit_rows" not in cell  # the record is what it was before the field existed
    assert "Every seed fits the same rows" not in (out / "leaderboard.md").read_text()


def test_an_absolute_noise_that_drowns_the_input_is_said():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)  # unit-norm sentence embeddings
    scale = float(np.median(x.std(axis=0)))
    assert 0.04 < scale < 0.06
    with pytest.warns(UserWarning, match=r"noise_std 1 is \d+x the selector input's typical"):
        warn_if_noise_drowns(1.0, x, "S-MMCE joint")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_noise_drowns(0.1, x, "S-MMCE joint")  # 2x: noisy, not drowned
        warn_if_noise_drowns(0.0, x, "S-MMCE joint")
        warn_if_noise_drowns(1.0, 10 * rng.normal(size=(500, 8)), "S-MMCE joint")


def test_the_noise_warning_reaches_a_training_scheme(write_spec, tmp_path):
    methods = [{"label": "S-MMCE", "scheme": {"name": "selection",
                                              "params": {"epochs": 2, "noise_std": 50.0}},
                "selector": {"name": "mlp", "params": {"hidden": [8]}},
                "recalibrator": {"name": "none"}, "loss": {"name": "s-mmce"},
                "coverage": {"name": "quadratic", "params": {"lam": 8}}}]
    out = tmp_path / "noisy"
    with pytest.warns(UserWarning, match="noise_std 50 is"):
        run(write_spec(tiny_spec(name="noisy", seeds=(0,), methods=methods)), out_dir=out,
            progress=False, plots=False)
