"""The worked example of CONTRIBUTING.md really registers through an entry point and runs."""

import json
import re
import sys

import pytest
from conftest import REPO, install_distribution, tiny_spec
from selbench.plugins import AUTOLOAD_ENV, get_registry
from selbench.runner import run


def _blocks(lang):
    text = (REPO / "CONTRIBUTING.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


@pytest.fixture
def example_installed(tmp_path, monkeypatch):
    code = next(b for b in _blocks("python") if b.startswith("# my_selbench_plugins.py"))
    toml = next(b for b in _blocks("toml") if "[project.entry-points.selbench]" in b)
    entry = toml.split("[project.entry-points.selbench]", 1)[1].strip()
    name, target = (s.strip().strip('"') for s in entry.split("=", 1))
    install_distribution(tmp_path, "my-selbench-plugins", "0.1", {"my_selbench_plugins": code},
                         {name: target})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    get_registry(refresh=True)
    yield
    sys.modules.pop("my_selbench_plugins", None)
    get_registry(refresh=True)


def test_the_example_is_about_twenty_lines():
    code = next(b for b in _blocks("python") if b.startswith("# my_selbench_plugins.py"))
    lines = [ln for ln in code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(lines) <= 22


def test_contributing_example_registers_and_runs(example_installed, tmp_path):
    entry = get_registry().get("recalibrator", "isotonic")
    assert entry.provider == "isotonic" and entry.plugin.version == "0.1"
    methods = [
        {"label": "None", "scheme": {"name": "recalibration"}},
        {"label": "Isotonic", "scheme": {"name": "recalibration"},
         "recalibrator": {"name": "isotonic", "params": {"y_min": 0.01}}},
    ]
    run(tiny_spec(methods=methods, seeds=[0]), out_dir=tmp_path / "out", progress=False)
    board = json.loads((tmp_path / "out" / "leaderboard.json").read_text())
    rows = {r["method"]: r["metrics"]["ece1"]["auc"]["mean"] for r in board["experiments"][0]["rows"]}
    assert rows["Isotonic"] < 0.5 * rows["None"]
