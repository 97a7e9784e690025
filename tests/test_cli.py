"""The command line: plugins listing, run + leaderboard re-rendering, exit codes."""

import pytest
from conftest import tiny_spec
from selbench.cli import main

PAPER_PLUGINS = {
    "selector": ["mlp", "confidence", "isolation-forest", "one-class-svm", "none", "oracle-domain"],
    "recalibrator": ["temperature", "platt", "histogram-binning", "platt-binning", "mlp", "none"],
    "loss": ["s-tlbce", "s-mce", "s-mmce", "quadratic", "log-coverage"],
    "scheme": ["recalibration", "selection", "sequential", "joint"],
    "dataset": ["digits", "theory-mixture"],
    "backbone": ["digits-net", "theory-linear"],
}


@pytest.mark.parametrize("kind", sorted(PAPER_PLUGINS))
def test_plugins_lists_every_method_with_parameters(kind, capsys):
    assert main(["plugins", kind]) == 0
    out = capsys.readouterr().out
    listed = {line.split()[0] for line in out.splitlines() if line.startswith("  ") and not line.startswith("      ")}
    assert set(PAPER_PLUGINS[kind]) <= listed
    if kind == "scheme":
        assert "      epochs: int (default 1000; tuned over {25, 50, 100, 200, 500, 1000})" in out
        assert "      fit_on: Literal['all', 'accepted'] (default 'all')" in out
    if kind == "selector":
        assert "      hidden: list[int] (default [128, 128]; tuned over {[64], [128], [128, 128]})" in out


def test_run_then_rerender_leaderboard(write_spec, tmp_path, capsys):
    path = write_spec(tiny_spec(seeds=[0]))
    out = tmp_path / "res"
    assert main(["run", str(path), "--out", str(out), "--no-progress", "--no-plots",
                 "--set", "experiments[0].n_fit=200"]) == 0
    printed = capsys.readouterr()
    assert "# Leaderboard: tiny" in printed.out
    assert "3 cell(s) computed, 0 reused" in printed.err
    md = (out / "leaderboard.md").read_text()
    (out / "leaderboard.md").unlink()
    assert main(["leaderboard", str(out), "-q"]) == 0
    assert (out / "leaderboard.md").read_text() == md


def test_leaderboard_of_a_non_results_dir_exits_2(tmp_path, capsys):
    assert main(["leaderboard", str(tmp_path)]) == 2  # bad input
    assert "no run.json" in capsys.readouterr().err


@pytest.mark.parametrize("var,value", [("SELBENCH_BOOTSTRAP_THREADS", "x"),
                                       ("SELBENCH_TRAIN_THREADS", "two"),
                                       ("SELBENCH_CUDA_GRAPHS", "maybe")])
def test_bad_environment_switch_exits_2_before_running(write_spec, tmp_path, capsys,
                                                       monkeypatch, var, value):
    """A SELBENCH_* switch read deep inside a run is checked before it starts: one line
    naming the variable, exit 2 (bad input), nothing written."""
    path = write_spec(tiny_spec(seeds=[0]))
    monkeypatch.setenv(var, value)
    out = tmp_path / "res"
    assert main(["run", str(path), "--out", str(out), "--no-progress", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("selbench: error: environment: " + var) and err.count("\n") == 1
    assert not out.exists()
