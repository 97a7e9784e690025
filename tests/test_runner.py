"""The runner: cached outputs, cells, resume after interruption, leaderboard files."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import REPO, tiny_spec
from selbench.execution import cells as cells_mod
from selbench.execution.runner import RunError, run
from selbench.spec import SpecError
from selbench.store.cache import default_cache_dir
from selbench.training.devices import DeviceError, resolve_device


def _cells(out):
    return sorted(p for p in (out / "cells").rglob("*.json"))


def test_run_writes_cells_and_leaderboards(tmp_path):
    report = run(tiny_spec(), out_dir=tmp_path / "out", progress=False)
    out = tmp_path / "out"
    assert (report.computed, report.reused) == (6, 0)
    assert len(_cells(out)) == 6
    for name in ("leaderboard.md", "leaderboard.csv", "leaderboard.json", "run.json", "spec.yaml"):
        assert (out / name).is_file(), name
    cell = json.loads(_cells(out)[0].read_text())
    assert cell["betas"] == pytest.approx([0.5 + 0.05 * i for i in range(11)])
    assert cell["n_fit"] == 300 and cell["n_eval"] == 600
    # at β = 1 every example is accepted, whatever the selector
    assert all(json.loads(p.read_text())["metrics"]["coverage"][-1] == 1.0 for p in _cells(out))
    board = json.loads((out / "leaderboard.json").read_text())
    rows = {r["method"]: r for r in board["experiments"][0]["rows"]}
    assert set(rows) == {"None", "Temp. scale", "Confidence"}
    # temperature scaling calibrates the over-confident linear model (full coverage AUC)
    assert rows["Temp. scale"]["metrics"]["ece1"]["auc"]["mean"] < rows["None"]["metrics"]["ece1"]["auc"]["mean"]
    md = (out / "leaderboard.md").read_text()
    assert "| Method" in md and "ECE₁ ↓" in md and "Temp. scale" in md


def test_rerun_reuses_cells_and_cached_outputs(tmp_path, monkeypatch):
    run(tiny_spec(), out_dir=tmp_path / "a", progress=False, plots=False)
    first = (tmp_path / "a" / "leaderboard.md").read_text()
    cached = sorted((default_cache_dir() / "outputs").glob("*.npz"))
    assert len(cached) == 2  # val and test

    from selbench_plugins.backbones.linear import TheoryLinear

    def boom(*args, **kwargs):
        raise AssertionError("extract must not run: outputs are cached")

    monkeypatch.setattr(TheoryLinear, "extract", boom)
    report = run(tiny_spec(), out_dir=tmp_path / "a", progress=False, plots=False)
    assert (report.computed, report.reused) == (0, 6)
    assert (tmp_path / "a" / "leaderboard.md").read_text() == first
    # a new results dir recomputes the cells but still reuses the cached outputs
    report = run(tiny_spec(), out_dir=tmp_path / "b", progress=False, plots=False)
    assert report.computed == 6
    assert (tmp_path / "b" / "leaderboard.md").read_text() == first
    # any changed dataset parameter misses the cache
    spec = tiny_spec()
    spec["experiments"][0]["dataset"]["params"]["test_size"] = 601
    with pytest.raises(RunError, match="extract must not run"):
        run(spec, out_dir=tmp_path / "c", progress=False, plots=False)


def test_changed_method_recomputes_only_its_cells(tmp_path):
    run(tiny_spec(), out_dir=tmp_path, progress=False, plots=False)
    spec = tiny_spec()
    spec["experiments"][0]["methods"][2]["recalibrator"] = {"name": "none"}
    report = run(spec, out_dir=tmp_path, progress=False, plots=False)
    assert (report.computed, report.reused) == (2, 4)


def test_interrupted_run_resumes_and_matches_an_uninterrupted_one(tmp_path, monkeypatch):
    run(tiny_spec(), out_dir=tmp_path / "full", progress=False, plots=False)
    real = cells_mod.run_cell
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(cells_mod, "run_cell", flaky)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_spec(), out_dir=tmp_path / "cut", progress=False, plots=False)
    assert len(_cells(tmp_path / "cut")) == 3
    assert not (tmp_path / "cut" / "leaderboard.md").exists()
    assert not list((tmp_path / "cut").rglob("*.tmp"))
    monkeypatch.setattr(cells_mod, "run_cell", real)
    report = run(tiny_spec(), out_dir=tmp_path / "cut", progress=False, plots=False)
    assert (report.computed, report.reused) == (3, 3)
    for name in ("leaderboard.md", "leaderboard.csv"):
        assert (tmp_path / "cut" / name).read_text() == (tmp_path / "full" / name).read_text()


def _slow_spec():
    trained = {"scheme": {"name": "sequential", "params": {"epochs": 60, "batch_size": 50}},
               "selector": {"name": "mlp", "params": {"hidden": [32]}},
               "recalibrator": {"name": "temperature"},
               "loss": {"name": "s-tlbce"}, "coverage": {"name": "quadratic"}}
    return tiny_spec(name="killed", seeds=[0, 1, 2, 3],
                     methods=[{"label": "A", **trained}, {"label": "B", **trained,
                              "loss": {"name": "s-mmce"}}])


def test_killed_process_resumes_without_recomputing(tmp_path, write_spec):
    """SIGKILL a real `selbench run` mid-way, rerun it, compare with an uninterrupted run."""
    path = write_spec(_slow_spec())
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "selbench.cli", "run", str(path), "--no-progress", "-q", "--no-plots",
           "--device", "cpu"]
    out = tmp_path / "killed"
    proc = subprocess.Popen(cmd + ["--out", str(out)], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and len(_cells(out)) < 2 and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "run finished before it could be killed: " + proc.stderr.read().decode()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(_cells(out))
    assert 2 <= done < 8
    assert not (out / "leaderboard.md").exists()
    report = run(path, out_dir=out, progress=False, device="cpu", plots=False)
    assert report.reused >= done and report.computed == 8 - report.reused
    ref = run(path, out_dir=tmp_path / "ref", progress=False, device="cpu", plots=False)
    assert ref.computed == 8
    assert (out / "leaderboard.md").read_text() == (tmp_path / "ref" / "leaderboard.md").read_text()


def test_same_split_for_fitting_and_evaluation_excludes_fitted_rows(tmp_path):
    run(tiny_spec(eval_split="val", n_fit=100), out_dir=tmp_path, progress=False, plots=False)
    cell = json.loads(_cells(tmp_path)[0].read_text())
    assert cell["n_fit"] == 100 and cell["n_eval"] == 300


def test_per_beta_training_and_reported_betas(tmp_path):
    spec = tiny_spec(seeds=[0], betas=[0.8, 0.9], train_beta="per_beta", report="betas")
    report = run(spec, out_dir=tmp_path, progress=False, plots=False)
    assert report.computed == 6  # 3 methods x 2 betas
    md = (tmp_path / "leaderboard.md").read_text()
    assert "β=0.8" in md and "β=0.9" in md


def test_hoeffding_guarantee_is_recorded(tmp_path):
    run(tiny_spec(seeds=[0], coverage_guarantee={"delta": 0.1}), out_dir=tmp_path, progress=False, plots=False)
    conf_cell = [json.loads(p.read_text()) for p in _cells(tmp_path)
                 if json.loads(p.read_text())["method"] == "Confidence"][0]
    eps = np.sqrt(np.log(2 / 0.1) / (2 * 600))
    cov = np.array(conf_cell["metrics"]["coverage"])
    betas = np.array(conf_cell["betas"])
    feasible = betas + eps <= 1
    assert np.all(cov[feasible] - eps >= betas[feasible] - 1e-12)
    np.testing.assert_allclose(conf_cell["metrics"]["guaranteed_coverage"], cov - eps)
    board = json.loads((tmp_path / "leaderboard.json").read_text())
    row = next(r for r in board["experiments"][0]["rows"] if r["method"] == "Confidence")
    auc_cov = row["metrics"]["coverage"]["auc"]["mean"]
    assert row["metrics"]["guaranteed_coverage"]["auc"]["mean"] == pytest.approx(auc_cov - eps)
    assert "Guaranteed cov." in (tmp_path / "leaderboard.md").read_text()


def test_misbehaving_plugin_and_bad_sizes_are_named(tmp_path, monkeypatch):
    # an n_fit larger than its split is bad input, caught when the spec is loaded (the
    # dataset declares its split sizes), before anything runs
    with pytest.raises(SpecError, match=r"experiments\[0\].n_fit: 5000 examples asked, but split 'val' of dataset 'theory-mixture' has only 400"):
        run(tiny_spec(n_fit=5000), out_dir=tmp_path / "a", progress=False, plots=False)
    from selbench_plugins.selectors.baselines import NoSelector

    monkeypatch.setattr(NoSelector, "score", lambda self, outputs, confidence: np.ones(3))
    with pytest.raises(RunError, match=r"\n  - experiments\[0\].methods\[0\] \('None'\), seed\(s\) 0: selector 'none'.*\.score returned shape \(3,\), expected \(600,\)"):
        run(tiny_spec(), out_dir=tmp_path / "b", progress=False, plots=False)
    # a plugin's own ValueError is reported with the method it came from, not as a traceback
    monkeypatch.setattr(NoSelector, "fit", lambda self, o, c, ctx: (_ for _ in ()).throw(ValueError("bad input")))
    with pytest.raises(RunError, match=r"\n  - experiments\[0\].methods\[0\] \('None'\), seed\(s\) 0, 1: selector 'none'.* raised ValueError: bad input while fitting\n"):
        run(tiny_spec(), out_dir=tmp_path / "c", progress=False, plots=False)


def test_device_resolution():
    import torch

    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="no CUDA device"):  # bad input: a ValueError
            resolve_device("cuda")


def test_fit_checks_leave_plugins_untouched(tmp_path, monkeypatch):
    """The runner checks what plugins return while they are fitted without changing the
    instances (their vars() and type() stay theirs): equal recalibrators of one seed's
    training β's are still fitted once, and the classes are restored afterwards."""
    from selbench_plugins.recalibrators.temperature import TemperatureScaling

    fits = []
    real_fit = TemperatureScaling.fit

    def counting_fit(self, outputs, context):
        fits.append(sorted(vars(self)))
        return real_fit(self, outputs, context)

    monkeypatch.setattr(TemperatureScaling, "fit", counting_fit)
    def methods():  # pickling adds __slotnames__, which is not ours to check
        return {k: v for k, v in vars(TemperatureScaling).items() if not k.startswith("__")}

    before = methods()
    spec = tiny_spec(seeds=[0], betas=[0.8, 0.9], train_beta="per_beta", report="betas")
    run(spec, out_dir=tmp_path, progress=False, plots=False)
    # two methods use temperature scaling; each is fitted once for both training β's
    assert len(fits) == 2
    assert all("confidence" not in names and "predict" not in names for names in fits)
    assert methods() == before


def test_leaderboard_from_the_records_held_equals_one_read_from_disk(tmp_path, monkeypatch):
    """The runner hands the leaderboard the records it wrote or verified (issue 28: not read
    again); the files are those a leaderboard built from the cells on disk gives, byte for
    byte, on a first run and on a rerun that reuses every cell."""
    from selbench.reporting.leaderboard import write_leaderboard
    from selbench.store.results import ResultsDir

    out = tmp_path / "out"
    reads = []
    real = ResultsDir.check_cell
    monkeypatch.setattr(ResultsDir, "check_cell",
                        lambda self, *a, **k: reads.append(a[0]) or real(self, *a, **k))
    for attempt in range(2):
        reads.clear()
        report = run(tiny_spec(), out_dir=out, progress=False, plots=False)
        held = {name: (out / name).read_bytes() for name in
                ("leaderboard.md", "leaderboard.csv", "leaderboard.json")}
        # each cell checked once, by the plan (the leaderboard reads none again)
        assert len(reads) == report.computed + report.reused
        assert report.reused == (0 if attempt == 0 else len(reads))
        write_leaderboard(out)
        for name, data in held.items():
            assert (out / name).read_bytes() == data, name
