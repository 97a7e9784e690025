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
    assert set(modules) == {"my_selbench_plugins", "my_selector", "my_trainable",
                            "my_recalibrator"}
    assert set(_entry_points().values()) == set(modules)
    code = modules["my_selbench_plugins"]
    lines = [ln for ln in code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(lines) <= 24


def test_contributing_examples_register_run_and_pass_the_kit(examples_installed, tmp_path):
    reg = get_registry()
    entry = reg.get("recalibrator", "clipped-isotonic")
    # the provider is named by its distribution, as installed, not by its entry point
    assert entry.package_name == "my-selbench-plugins" and entry.plugin.version == "0.1"
    assert reg.packages()["my-selbench-plugins"] == "0.1"
    assert reg.get("selector", "centroid").plugin.version == "0.1"
    assert reg.get("selector", "linear-gate").plugin.params.model_fields == {}
    # the spec snippet of the page, as written
    snippet = next(b for b in _blocks("yaml") if "label: Clipped isotonic" in b)
    methods = [{"label": "None", "scheme": {"name": "recalibration"}}, *yaml.safe_load(snippet)]
    report = run(tiny_spec(methods=methods, seeds=[0]), out_dir=tmp_path / "out", progress=False,
                 plots=False)
    assert report.computed == 5
    prov = json.loads((tmp_path / "out" / "leaderboard.json").read_text())["provenance"]
    assert prov["plugin_versions"]["recalibrator/clipped-isotonic"]["provider"] \
        == "my-selbench-plugins"
    assert "my-selbench-plugins" in prov["plugins"] and "clipped-isotonic" not in prov["plugins"]
    board = json.loads((tmp_path / "out" / "leaderboard.json").read_text())
    rows = {r["method"]: r["metrics"] for r in board["experiments"][0]["rows"]}
    assert rows["Clipped isotonic"]["ece1"]["auc"]["mean"] < 0.5 * rows["None"]["ece1"]["auc"]["mean"]
    for label in ("Centroid + temperature", "Linear gate joint", "Adaptive temperature joint"):
        # they select: coverage follows β (AUC of β over [0.5, 1] is 0.75)
        assert rows[label]["coverage"]["auc"]["mean"] == pytest.approx(0.75, abs=1e-3)
    # every example passes every rule of the conformance kit
    check_plugin("recalibrator", "clipped-isotonic")
    check_plugin("selector", "centroid")
    check_plugin("selector", "linear-gate")
    check_plugin("recalibrator", "adaptive-temperature", {"steps": 20})


def test_the_jointly_trainable_recalibrator_uses_only_public_names_and_is_a_distribution(
        examples_installed):
    import ast

    import selbench

    code = _modules()["my_recalibrator"]
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module == "selbench":
            assert {a.name for a in node.names} <= set(selbench.__all__)
        if isinstance(node, ast.ImportFrom):
            assert not node.module.startswith("selbench.") and not node.module.startswith("_")
    reg = get_registry()
    recal = reg.get("recalibrator", "adaptive-temperature").plugin.factory
    assert recal.differentiable and recal.provides_log_probs is True
    # fitted from a spec's method: its distribution is what predict_proba returns
    import numpy as np
    from selbench import SelectiveRecalibrator

    rng = np.random.default_rng(0)
    z = (rng.normal(size=(400, 3)) * 4).astype(np.float32)
    y = np.array([rng.choice(3, p=np.exp(r) / np.exp(r).sum()) for r in z / 3])
    est = SelectiveRecalibrator(selector="none", scheme="recalibration", loss=None,
                                coverage=None, recalibrator="adaptive-temperature",
                                device="cpu").fit(z, y)
    p = est.predict_proba(z)
    np.testing.assert_allclose(p.max(1), est.predict_confidence(z), atol=2e-6)
    np.testing.assert_array_equal(p.argmax(1), z.argmax(1))
    raw = np.exp(z - z.max(1, keepdims=True))
    raw /= raw.sum(1, keepdims=True)
    nll_raw = -np.log(raw[np.arange(400), y]).mean()
    assert -np.log(p[np.arange(400), y]).mean() < nll_raw - 0.05  # the fit lowered the NLL


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
