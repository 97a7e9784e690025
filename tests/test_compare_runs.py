"""selbench compare on real runs of a small spec: a bug-sized change on the same seeds and
data is flagged, another draw of seeds of the same spec agrees, and the report says what
differs in the spec and the seeds."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from conftest import tiny_spec
from selbench.cli import main
from selbench.execution.runner import run
from selbench.reporting.compare import compare, render_comparison

METHODS = [
    {"label": "None", "scheme": {"name": "recalibration"}},
    {"label": "Temp. scale", "scheme": {"name": "recalibration"},
     "recalibrator": {"name": "temperature"}},
    {"label": "Hist. binning", "scheme": {"name": "recalibration"},
     "recalibrator": {"name": "histogram-binning", "params": {"n_bins": 15}}},
]


def _spec(seeds, n_bins=15) -> dict:
    methods = copy.deepcopy(METHODS)
    methods[2]["recalibrator"]["params"]["n_bins"] = n_bins
    return tiny_spec(seeds=seeds, methods=methods, bootstrap={"resamples": 20},
                     metrics=["ece1", "ece2", "smece", "brier", "accuracy", "coverage"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare_runs")
    out = {}
    for name, spec in (("a", _spec([0, 1, 2, 3, 4])), ("bins14", _spec([0, 1, 2, 3, 4], 14)),
                       ("seeds", _spec([5, 6, 7, 8, 9]))):
        run(spec, out_dir=root / name, cache_dir=root / "cache", progress=False, plots=False)
        out[name] = root / name
    return out


def test_a_rerun_on_the_same_machine_is_identical(runs, tmp_path):
    result = compare(runs["a"], runs["a"])
    assert result.agree and result.identical
    assert "expect identical numbers" in render_comparison(result)


def test_fourteen_bins_instead_of_fifteen_is_flagged(runs, capsys):
    """The issue's bug-sized change: same seeds and evaluation data, so the per-seed
    differences are paired and the shared bootstrap noise does not hide them."""
    result = compare(runs["a"], runs["bins14"])
    assert not result.agree
    assert {d.key[1] for d in result.differences} == {"Hist. binning"}
    assert main(["compare", str(runs["a"]), str(runs["bins14"])]) == 1
    text = capsys.readouterr().out
    assert "n_bins: 15 vs 14" in text and "seeds: the same on both sides" in text
    assert "identical numbers expected" in text


def test_another_draw_of_seeds_of_one_spec_agrees(runs, capsys):
    assert main(["compare", str(runs["a"]), str(runs["seeds"])]) == 0
    text = capsys.readouterr().out
    assert "seeds differ: A [0, 1, 2, 3, 4], B [5, 6, 7, 8, 9]" in text
    assert "spec: the same apart from the seeds" in text


def test_the_backbone_outputs_decide_whether_the_evaluation_data_are_the_same(runs, tmp_path):
    """Another CPU with bit-identical backbone outputs (the cells' raw confidence) evaluates
    on the same data: the shared bootstrap noise is not counted; other outputs make it count."""
    import json
    import shutil

    import numpy as np

    other = tmp_path / "other_cpu"
    shutil.copytree(runs["a"], other)
    board = json.loads((other / "leaderboard.json").read_text())
    board["provenance"]["cpu_capability"] = "AVX2"
    (other / "leaderboard.json").write_text(json.dumps(board))
    result = compare(runs["a"], other)
    assert result.agree and not result.identical
    assert "evaluation data of mixture: the same" in render_comparison(result)
    for npz in other.glob("cells/*/*/seed0.npz"):
        arrays = dict(np.load(npz))
        arrays["raw_confidence"] = arrays["raw_confidence"] * (1 - 1e-12)
        np.savez(npz, **arrays)
    result = compare(runs["a"], other)
    assert result.agree and "evaluation data of mixture: may differ" in render_comparison(result)
