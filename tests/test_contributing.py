"""The worked examples of CONTRIBUTING.md really register through entry points, run in a spec
and pass the conformance kit, and the kit's three-line CI snippet runs as written."""

import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, install_distribution, tiny_spec
from selbench.contract.registry import AUTOLOAD_ENV, get_registry
from selbench.execution.runner import run
from selbench.testing import check_plugin


def _blocks(lang):
    text = (REPO / "CONTRIBUTING.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def _modules() -> dict[str, str]:
    """module name -> source, for every Python block that starts with '# <module>.py'."""
    out = {}
    for block in _blocks("python"):
        first = block.splitlines()[0]
        m = re.fullmatch(r"# (\w+)\.py", first.strip())
        if m:
            out[m.group(1)] = block
    return out


def _entry_points() -> dict[str, str]:
    toml = next(b for b in _blocks("toml") if "[project.entry-points.selbench]" in b)
    lines = toml.split("[project.entry-points.selbench]", 1)[1].strip().splitlines()
    return {k.strip(): v.strip().strip('"') for k, v in (ln.split("=", 1) for ln in lines)}


@pytest.fixture
def examples_installed(tmp_path, monkeypatch):
    modules = _modules()
    install_distribution(tmp_path, "my-selbench-plugins", "0.1", modules, _entry_points())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    get_registry(refresh=True)
    yield tmp_path
    for name in modules:
        sys.modules.pop(name, None)
    monkeypatch.undo()  # sys.path and the environment first, or the refreshed registry
    get_registry(refresh=True)  # would still hold the examples for the tests that follow


def test_the_page_has_the_three_examples_and_the_recalibrator_is_about_twenty_lines():
    modules = _modules()
    assert set(modules) == {"my_selbench_plugins", "my_selector", "my_trainable"}
    assert set(_entry_points().values()) == set(modules)
    code = modules["my_selbench_plugins"]
    lines = [ln for ln in code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(lines) <= 24


def test_contributing_examples_register_run_and_pass_the_kit(examples_installed, tmp_path):
    reg = get_registry()
    entry = reg.get("recalibrator", "clipped-isotonic")
    assert entry.provider == "clipped-isotonic" and entry.plugin.version == "0.1"
    assert reg.get("selector", "centroid").plugin.version == "0.1"
    assert reg.get("selector", "linear-gate").plugin.params.model_fields == {}
    # the spec snippet of the page, as written
    snippet = next(b for b in _blocks("yaml") if "label: Clipped isotonic" in b)
    methods = [{"label": "None", "scheme": {"name": "recalibration"}}, *yaml.safe_load(snippet)]
    report = run(tiny_spec(methods=methods, seeds=[0]), out_dir=tmp_path / "out", progress=False,
                 plots=False)
    assert report.computed == 4
    board = json.loads((tmp_path / "out" / "leaderboard.json").read_text())
    rows = {r["method"]: r["metrics"] for r in board["experiments"][0]["rows"]}
    assert rows["Clipped isotonic"]["ece1"]["auc"]["mean"] < 0.5 * rows["None"]["ece1"]["auc"]["mean"]
    for label in ("Centroid + temperature", "Linear gate joint"):
        # they select: coverage follows β (AUC of β over [0.5, 1] is 0.75)
        assert rows[label]["coverage"]["auc"]["mean"] == pytest.approx(0.75, abs=1e-3)
    # every example passes every rule of the conformance kit
    check_plugin("recalibrator", "clipped-isotonic")
    check_plugin("selector", "centroid")
    check_plugin("selector", "linear-gate")


def test_the_kit_snippet_runs_as_written_in_ci(examples_installed, tmp_path):
    snippet = next(b for b in _blocks("python") if "parametrize_with_checks" in b)
    assert len(snippet.strip().splitlines()) <= 4
    test_file = tmp_path / "test_my_plugins.py"
    test_file.write_text(snippet)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(examples_installed),
                                                        os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(test_file)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    passed = re.search(r"(\d+) passed", out.stdout)
    assert passed and int(passed.group(1)) >= 10, out.stdout
