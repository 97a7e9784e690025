"""Trust: no result is reused unless its inputs, its code and its bytes are what they were.

Each test reproduces a way an earlier selbench printed a stale or wrong leaderboard with
exit code 0 (content keyed by names, not content or code; damaged files reused or crashing
every rerun) and checks that it is now detected and recomputed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from conftest import install_distribution, tiny_spec
from selbench.cli import main
from selbench.execution.runner import run
from selbench.spec import SpecError
from selbench.store.cache import OutputCache, default_cache_dir
from selbench.store.results import CellRecord


def _write_outputs(path, seed: int, n: int = 400, k: int = 4, acc_shift: float = 0.0) -> None:
    """A user's model outputs: logits, labels and a split column, as `precomputed` reads."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, size=n)
    logits = rng.normal(size=(n, k)).astype(np.float32)
    logits[np.arange(n), labels] += 1.5 + acc_shift
    split = np.array(["val", "test"] * (n // 2))
    np.savez(path, labels=labels, logits=logits, features=logits, split=split)


def _precomputed_spec(path: str, name: str = "mine") -> dict:
    return {
        "spec_version": 1,
        "name": name,
        "seeds": [0],
        "experiments": [{
            "name": "own-model",
            "dataset": {"name": "precomputed",
                        "params": {"path": path, "splits": {"fit": ["val"], "target": ["test"]}}},
            "backbone": {"name": "precomputed"},
            "fit_split": "fit",
            "eval_split": "target",
            "methods": [
                {"label": "None", "scheme": {"name": "recalibration"}},
                {"label": "Temp. scale", "scheme": {"name": "recalibration"},
                 "recalibrator": {"name": "temperature"}},
            ],
        }],
    }


def _accuracy(out) -> float:
    board = json.loads((out / "leaderboard.json").read_text())
    return board["experiments"][0]["rows"][0]["metrics"]["accuracy"]["auc"]["mean"]


def _cells(out):
    return sorted((out / "cells").rglob("*.json"))


# --------------------------------------------------------------------------- inputs
def test_rewritten_precomputed_file_is_never_served_from_the_cache(tmp_path):
    data = tmp_path / "outputs.npz"
    _write_outputs(data, seed=0)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_precomputed_spec("outputs.npz")))
    first = run(spec, out_dir=tmp_path / "a", progress=False, plots=False)
    assert first.computed == 2
    acc_before = _accuracy(tmp_path / "a")
    # a retrained model's outputs, written over the same file
    _write_outputs(data, seed=1, acc_shift=3.0)
    again = run(spec, out_dir=tmp_path / "a", progress=False, plots=False)
    assert (again.computed, again.reused) == (2, 0)
    assert "the backbone outputs changed" in " ".join(again.reasons)
    fresh = run(spec, out_dir=tmp_path / "b", progress=False, plots=False)
    assert fresh.computed == 2
    assert _accuracy(tmp_path / "a") == _accuracy(tmp_path / "b") != acc_before
    # the run records where the file is and what it held
    prov = json.loads((tmp_path / "a" / "run.json").read_text())["provenance"]
    entry = prov["inputs"]["experiments[0].dataset.params.path"]
    assert entry["path"] == str(data)
    assert entry["digest"].startswith("sha256:")


def test_files_that_share_a_name_do_not_share_outputs(tmp_path):
    for project, seed in (("p1", 0), ("p2", 1)):
        (tmp_path / project).mkdir()
        _write_outputs(tmp_path / project / "outputs.npz", seed=seed, acc_shift=2.0 * seed)
        (tmp_path / project / "spec.yaml").write_text(
            yaml.safe_dump(_precomputed_spec("outputs.npz")))
    for project in ("p1", "p2"):
        run(tmp_path / project / "spec.yaml", out_dir=tmp_path / project / "out", progress=False,
            plots=False)
    assert _accuracy(tmp_path / "p1" / "out") != _accuracy(tmp_path / "p2" / "out")


def test_relative_paths_resolve_against_the_spec_file_not_the_cwd(tmp_path, monkeypatch):
    (tmp_path / "project").mkdir()
    _write_outputs(tmp_path / "project" / "outputs.npz", seed=0)
    spec = tmp_path / "project" / "spec.yaml"
    spec.write_text(yaml.safe_dump(_precomputed_spec("outputs.npz")))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    report = run(spec, out_dir=tmp_path / "out", progress=False, plots=False)
    assert report.computed == 2


def test_a_warm_cache_does_not_hide_a_missing_input(tmp_path, capsys):
    data = tmp_path / "outputs.npz"
    _write_outputs(data, seed=0)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_precomputed_spec("outputs.npz")))
    run(spec, out_dir=tmp_path / "a", progress=False, plots=False)
    data.unlink()
    with pytest.raises(SpecError, match=r"experiments\[0\]\.dataset\.params\.path: no such file"):
        run(spec, out_dir=tmp_path / "a", progress=False, plots=False)
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and str(data) in err and "Traceback" not in err


# --------------------------------------------------------------------------- code
PLUGIN = '''
import numpy as np
from selbench import Plugin, Recalibrator, hookimpl


class Shrink(Recalibrator):
    """Shrinks the confidence towards 1/2 (a test plugin)."""

    def fit(self, outputs, context):
        return self

    def confidence(self, outputs):
        return 0.5 + FACTOR * (outputs.confidence() - 0.5)


FACTOR = 0.5


@hookimpl
def selbench_recalibrators():
    return [Plugin("shrink", Shrink)]
'''


def _install_plugin(tmp_path, monkeypatch):
    """A third-party distribution `shrink-plugin` with a `selbench` entry point."""
    return install_distribution(tmp_path / "site", "shrink-plugin", "1.0",
                                {"shrink_plugin": PLUGIN}, {"shrink": "shrink_plugin"})


def _cli(args, site, cwd):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(site) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("SELBENCH_DISABLE_PLUGIN_AUTOLOAD", None)
    return subprocess.run([sys.executable, "-m", "selbench.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_editing_a_plugin_recomputes_exactly_its_cells_and_says_why(tmp_path, monkeypatch):
    site = _install_plugin(tmp_path, monkeypatch)
    methods = [
        {"label": "Temp. scale", "scheme": {"name": "recalibration"},
         "recalibrator": {"name": "temperature"}},
        {"label": "Shrink", "scheme": {"name": "recalibration"},
         "recalibrator": {"name": "shrink"}},
    ]
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec(seeds=[0, 1], methods=methods)))
    args = ["run", str(spec), "--out", str(tmp_path / "out"), "--no-progress", "--no-plots",
            "-q"]
    first = _cli(args, site, tmp_path)
    assert first.returncode == 0, first.stderr
    assert "4 cell(s) computed, 0 reused" in first.stderr
    board = (tmp_path / "out" / "leaderboard.md").read_text()
    # the plugin's author changes its code, not its version
    src = site / "shrink_plugin.py"
    src.write_text(src.read_text().replace("FACTOR = 0.5", "FACTOR = 0.9"))
    second = _cli(args, site, tmp_path)
    assert second.returncode == 0, second.stderr
    assert "2 cell(s) recomputed: recalibrator 'shrink'" in second.stderr
    assert "2 cell(s) computed, 2 reused" in second.stderr
    assert (tmp_path / "out" / "leaderboard.md").read_text() != board
    # unchanged code: everything is reused
    third = _cli(args, site, tmp_path)
    assert "0 cell(s) computed, 4 reused" in third.stderr


def test_a_change_in_the_core_metric_code_recomputes_every_cell(tmp_path, monkeypatch):
    import selbench.execution.keys as keys_mod

    run(tiny_spec(seeds=[0]), out_dir=tmp_path, progress=False, plots=False)
    monkeypatch.setattr(keys_mod, "core_digest", lambda: "src:edited")
    report = run(tiny_spec(seeds=[0]), out_dir=tmp_path, progress=False, plots=False)
    assert (report.computed, report.reused) == (3, 0)
    assert report.reasons == {"selbench's metric definitions changed": 3}


def test_force_and_only_recompute_on_demand(tmp_path, capsys):
    run(tiny_spec(seeds=[0, 1]), out_dir=tmp_path, progress=False, plots=False)
    report = run(tiny_spec(seeds=[0, 1]), out_dir=tmp_path, progress=False, plots=False,
                 force=True, only=["Temp. scale"])
    assert (report.computed, report.reused) == (2, 4)
    report = run(tiny_spec(seeds=[0, 1]), out_dir=tmp_path, progress=False, plots=False,
                 force=True)
    assert (report.computed, report.reused) == (6, 0)
    with pytest.raises(SpecError, match="--only: no method labelled 'Nope'"):
        run(tiny_spec(seeds=[0]), out_dir=tmp_path, progress=False, plots=False, force=True,
            only=["Nope"])


def test_code_digest_covers_the_modules_a_plugin_imports():
    from selbench.execution.codeid import module_closure

    mods = module_closure("selbench_plugins.recalibrators.temperature")
    assert "selbench_plugins.recalibrators.temperature" in mods
    assert "selbench_plugins.recalibrators._common" in mods
    assert "selbench.training.torchutils" in mods  # selbench's plugin toolkit it builds on
    assert not any(m.startswith("selbench_plugins.datasets") for m in mods)


def test_a_trained_plugins_digest_covers_the_whole_training_engine():
    """The engine's per-replica Adam and CUDA-graph modules decide a trained plugin's
    numbers as much as the engine does: they are in its digest (they were not before
    2026-12-02, so an edit of the per-replica Adam reused trained cells)."""
    from selbench.execution.codeid import module_closure

    mods = module_closure("selbench_plugins.schemes.training")
    assert {"selbench.training.engine", "selbench.training.hyper",
            "selbench.training.graphs", "selbench.training.torchutils"} <= set(mods)
    assert not any(m.startswith("selbench.execution") for m in mods)


# --------------------------------------------------------------------------- cached outputs
@pytest.fixture
def finished(tmp_path):
    """A finished tiny run and its leaderboard."""
    out = tmp_path / "out"
    run(tiny_spec(seeds=[0, 1]), out_dir=out, progress=False, plots=False)
    return out, (out / "leaderboard.md").read_text()


def _cached(kind: str = "npz"):
    return sorted((default_cache_dir() / "outputs").glob(f"*.{kind}"))


def _rerun(out):
    # a fresh results dir forces the cells to need the cached outputs
    return run(tiny_spec(seeds=[0, 1]), out_dir=out, progress=False, plots=False)


@pytest.mark.parametrize("damage", ["swap", "truncate", "flip", "empty", "other-shape",
                                    "no-sidecar"])
def test_damaged_or_swapped_cached_outputs_are_named_and_rebuilt(finished, tmp_path, damage,
                                                                  capsys):
    out, board = finished
    val, test = _cached()
    if damage == "swap":  # another valid file of the same width, other rows
        val.write_bytes(test.read_bytes())
    elif damage == "truncate":
        val.write_bytes(val.read_bytes()[: val.stat().st_size // 2])
    elif damage == "flip":
        data = bytearray(val.read_bytes())
        data[len(data) // 2] ^= 0xFF
        val.write_bytes(bytes(data))
    elif damage == "empty":
        val.write_bytes(b"")
    elif damage == "other-shape":
        from selbench.contract.data import ModelOutputs

        rng = np.random.default_rng(0)
        ModelOutputs(rng.normal(size=(10, 3)), rng.normal(size=(10, 2)),
                     rng.integers(0, 2, 10)).to_npz(val)
    elif damage == "no-sidecar":
        val.with_suffix(".json").unlink()
    capsys.readouterr()
    report = _rerun(tmp_path / "again")
    err = capsys.readouterr().err
    assert report.computed == 6
    assert f"cached outputs {val}" in err and "recomputing them" in err
    assert (tmp_path / "again" / "leaderboard.md").read_text() == board
    # rebuilt: the next run reads it without complaint
    capsys.readouterr()
    _rerun(tmp_path / "third")
    assert "cached outputs" not in capsys.readouterr().err
    assert OutputCache(default_cache_dir()).get(val.stem) is not None


# --------------------------------------------------------------------------- cells on disk
def _cell(out, label="Temp. scale", seed=0):
    from selbench.store.results import slug

    return next((out / "cells").glob(f"*/{slug(label)}/seed{seed}.json"))


@pytest.mark.parametrize("damage", ["digit", "null", "list", "no-metrics", "truncated",
                                    "arrays-truncated", "arrays-deleted", "arrays-swapped"])
def test_damaged_cells_are_recomputed_never_reused(finished, damage, capsys):
    out, board = finished
    path = _cell(out)
    text = path.read_text()
    npz = path.with_suffix(".npz")
    if damage == "digit":  # one digit of one metric
        record = json.loads(text)
        value = record["metrics"]["ece1"][3]
        record["metrics"]["ece1"][3] = float(repr(value)[:-1] + str((int(repr(value)[-1]) + 1) % 10))
        path.write_text(json.dumps(record, indent=2))
    elif damage == "null":
        path.write_text("null")
    elif damage == "list":
        path.write_text("[]")
    elif damage == "no-metrics":
        record = json.loads(text)
        del record["metrics"]
        path.write_text(json.dumps(record))
    elif damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "arrays-truncated":
        npz.write_bytes(npz.read_bytes()[:100])
    elif damage == "arrays-deleted":
        npz.unlink()
    elif damage == "arrays-swapped":
        npz.write_bytes(_cell(out, "None").with_suffix(".npz").read_bytes())
    capsys.readouterr()
    report = run(tiny_spec(seeds=[0, 1]), out_dir=out, progress=False, plots=False)
    err = capsys.readouterr().err
    assert (report.computed, report.reused) == (1, 5)
    assert str(path) in err and "recomputing it" in err
    assert (out / "leaderboard.md").read_text() == board
    CellRecord.model_validate(json.loads(path.read_text()))
    assert npz.is_file()


def test_the_leaderboard_refuses_a_tampered_cell(finished, capsys):
    out, _ = finished
    path = _cell(out)
    record = json.loads(path.read_text())
    record["metrics"]["ece1"] = [0.0] * len(record["metrics"]["ece1"])
    path.write_text(json.dumps(record))
    assert main(["leaderboard", str(out), "-q"]) == 1
    err = capsys.readouterr().err
    assert "checksum mismatch" in err and "Traceback" not in err


def test_plots_fail_loudly_on_missing_arrays(finished, capsys):
    out, _ = finished
    _cell(out).with_suffix(".npz").unlink()
    assert main(["plot", str(out), "--format", "png"]) == 1
    err = capsys.readouterr().err
    assert "per-example arrays" in err and "missing" in err


def test_old_format_results_are_recomputed_not_misread(finished, capsys):
    """Cells written before the typed records (no schema_version) are recomputed."""
    out, board = finished
    for path in _cells(out):
        record = json.loads(path.read_text())
        legacy = {k: v for k, v in record.items()
                  if k not in ("schema_version", "checksum", "components", "arrays", "selects")}
        path.write_text(json.dumps({"format": 1, **legacy}))
    report = run(tiny_spec(seeds=[0, 1]), out_dir=out, progress=False, plots=False)
    assert report.computed == 6
    assert (out / "leaderboard.md").read_text() == board


def test_plugin_error_names_the_spec_path_for_missing_input(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_precomputed_spec("nowhere/outputs.npz")))
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert err.count("selbench: error:") == 1
    assert "experiments[0].dataset.params.path: no such file: " + str(tmp_path / "nowhere") in err
