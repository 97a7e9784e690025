"""Results from Python: ``selbench.run`` returns typed results; ``python -m selbench`` works."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import selbench
from conftest import REPO, tiny_spec
from selbench.store.results import CellRecord


def test_run_returns_typed_results(tmp_path):
    results = selbench.run(tiny_spec(seeds=[0, 1]), out_dir=tmp_path, progress=False,
                           plots=False)
    assert (results.computed, results.reused) == (6, 0)
    cells = results.cells()
    assert len(cells) == 6 and all(isinstance(c, CellRecord) for c in cells)
    on_disk = json.loads((tmp_path / "leaderboard.json").read_text())
    board = results.leaderboard()
    assert board.tables["experiments"] == on_disk["experiments"]
    assert board.markdown() == (tmp_path / "leaderboard.md").read_text()
    assert str(board) == board.markdown()
    assert board.csv() == (tmp_path / "leaderboard.csv").read_text()
    temp = next(c for c in cells if c.method == "Temp. scale" and c.seed == 1)
    assert temp.metrics["coverage"][-1] == 1.0 and temp.betas[-1] == 1.0


def test_to_frame_has_one_row_per_cell_beta_and_metric(tmp_path):
    pd = pytest.importorskip("pandas")
    results = selbench.run(tiny_spec(seeds=[0]), out_dir=tmp_path, progress=False, plots=False)
    frame = results.to_frame()
    assert list(frame.columns) == ["experiment", "method", "seed", "train_beta", "beta",
                                   "metric", "value"]
    cells = results.cells()
    assert len(frame) == sum(len(c.betas) * len(c.metrics) for c in cells)
    conf = cells[2]
    row = frame[(frame.method == conf.method) & (frame.metric == "ece1") & (frame.beta == 0.5)]
    assert row.value.item() == conf.metrics["ece1"][0]
    table = results.leaderboard().to_frame()
    assert isinstance(table, pd.DataFrame)
    assert set(table.method) == {"None", "Temp. scale", "Confidence"}


def test_python_dash_m_selbench(tmp_path):
    out = subprocess.run([sys.executable, "-m", "selbench", "--version"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"selbench {selbench.__version__}"
    out = subprocess.run([sys.executable, "-m", "selbench", "validate", str(tmp_path / "no.yaml")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "selbench: error:" in out.stderr
