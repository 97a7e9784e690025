"""The metric registry: one list of metrics (name, label, direction, marked, kind) that the
spec's ``metrics:`` list, every cell, the leaderboard (Markdown, CSV, JSON) and the bootstrap
intervals read; nothing else in the core lists metrics or their directions."""

from __future__ import annotations

import ast
import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_spec
from selbench.cli import main
from selbench.execution.runner import run, slug
from selbench.measure import metrics as M
from selbench.measure.evaluate import measure
from selbench.reporting.leaderboard import Column, columns_for, headline
from selbench.spec import SpecError, load_spec

CORE = Path(__file__).resolve().parents[1] / "benchmark" / "selbench"
TEMP = {"scheme": {"name": "recalibration"}, "recalibrator": {"name": "temperature"}}
METHODS = [
    {"label": "Temp. scale", **TEMP},
    {"label": "Confidence", **TEMP, "selector": {"name": "confidence"}},
]


def test_registry_entries_are_complete_and_consistent():
    assert list(M.METRICS)[:6] == ["ece1", "ece2", "smece", "brier", "accuracy", "coverage"]
    assert {"aurc", "eaurc", "augrc", "guaranteed_coverage"} <= set(M.METRICS)
    for key, info in M.METRICS.items():
        assert info.kind in ("selective", "ranking"), key
        assert info.label and info.summary, key
        assert isinstance(info.lower_is_better, bool) and isinstance(info.marked, bool), key
    # directions: errors and risks lower, accuracy higher; coverages are never marked
    assert [M.METRICS[k].lower_is_better for k in ("ece1", "smece", "brier", "aurc", "augrc")] \
        == [True] * 5
    assert M.METRICS["accuracy"].lower_is_better is False
    assert not M.METRICS["coverage"].marked and not M.METRICS["guaranteed_coverage"].marked
    assert M.METRICS["guaranteed_coverage"].needs == "coverage_guarantee"
    assert set(M.DEFAULT_COLUMNS) <= set(M.METRICS)
    with pytest.raises(ValueError, match=r"unknown metric 'augrc2'; did you mean 'augrc'"):
        M.metric_info("augrc2")


def test_a_cell_measures_every_registered_metric():
    rng = np.random.default_rng(0)
    n = 400
    conf = rng.uniform(0.3, 1.0, n)
    correct = (rng.uniform(size=n) < conf).astype(float)
    scores = conf + rng.normal(0, 0.1, n)
    arrays = {"score": scores, "confidence": conf, "correct": correct}
    betas = [0.5, 0.75, 1.0]
    out = measure(arrays, betas, delta=None, seed=3)
    assert {k for k, i in M.METRICS.items() if i.needs is None} <= set(out)
    order = M.selection_order(scores, seed=3)
    for j, b in enumerate(betas):
        k = int(np.ceil(b * n))
        acc = order[:k]
        assert out["smece"][j] == pytest.approx(M.smece(conf[acc], correct[acc]), abs=1e-15)
        assert out["ece1"][j] == pytest.approx(M.ece(conf[acc], correct[acc]), abs=1e-15)
    # ranking metrics: one value over all examples, from the scores, at every beta
    for key, fn in (("aurc", M.aurc), ("eaurc", M.eaurc), ("augrc", M.augrc)):
        np.testing.assert_array_equal(out[key], np.full(3, fn(scores, correct)))
    # a selector that does not select: beta = 1 everywhere
    flat = measure(arrays, betas, delta=0.1, seed=3, selects=False)
    np.testing.assert_array_equal(flat["smece"], np.full(3, M.smece(conf, correct)))
    # the smooth ECE of the same accepted set does not depend on the tie-break seed, to the bit
    other = measure(arrays, betas, delta=0.1, seed=4, selects=False)
    np.testing.assert_array_equal(other["smece"], flat["smece"])
    np.testing.assert_array_equal(flat["guaranteed_coverage"], np.ones(3))


def test_no_other_core_module_lists_metric_labels_or_directions():
    """Labels of registered metrics appear as string literals only in metrics.py."""
    labels = {info.label for info in M.METRICS.values()}
    for path in sorted(CORE.glob("*.py")):
        if path.name == "metrics.py":
            continue
        found = [node.value for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Constant) and node.value in labels]
        assert not found, f"{path.name} lists metric labels {found}: read selbench.measure.metrics.METRICS"


# --------------------------------------------------------------------------- spec
def _load(**top):
    spec = tiny_spec(methods=METHODS)
    exp_metrics = top.pop("exp_metrics", None)
    if exp_metrics is not None:
        spec["experiments"][0]["metrics"] = exp_metrics
    spec.update(top)
    return load_spec(spec)


def test_spec_metrics_default_inherit_and_override():
    assert _load().spec.experiments[0].metrics == list(M.DEFAULT_COLUMNS)
    assert _load(metrics=["smece", "augrc"]).spec.experiments[0].metrics == ["smece", "augrc"]
    got = _load(metrics=["smece"], exp_metrics=["ece1", "aurc"]).spec.experiments[0].metrics
    assert got == ["ece1", "aurc"]
    guaranteed = tiny_spec(methods=METHODS, coverage_guarantee={"delta": 0.1})
    assert load_spec(guaranteed).spec.experiments[0].metrics[-1] == "guaranteed_coverage"


@pytest.mark.parametrize("top, exp, message", [
    (["ece1", "smece2"], None, "metrics: unknown metric 'smece2'; did you mean 'smece'"),
    (None, ["AURC"], "experiments[0].metrics: unknown metric 'AURC'; did you mean 'aurc'"),
    (["ece1", "ece1"], None, "metrics: metrics listed twice: ece1"),
    ([], None, "metrics: list at least one metric"),
    (["guaranteed_coverage"], None,
     "metrics: 'guaranteed_coverage' needs coverage_guarantee in experiments[0] (mixture)"),
])
def test_spec_metrics_errors_name_the_path(top, exp, message):
    kwargs = {} if top is None else {"metrics": top}
    if exp is not None:
        kwargs["exp_metrics"] = exp
    with pytest.raises(SpecError) as info:
        _load(**kwargs)
    assert any(e.startswith(message) for e in info.value.errors), info.value.errors


def test_cli_validate_unknown_metric_is_one_line_exit_2(write_spec, capsys):
    spec = tiny_spec(methods=METHODS)
    spec["metrics"] = ["ece1", "augcr"]
    assert main(["validate", str(write_spec(spec))]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'augrc'" in err and "Traceback" not in err


# --------------------------------------------------------------------------- leaderboard
@pytest.fixture(scope="module")
def chosen(tmp_path_factory):
    root = tmp_path_factory.mktemp("chosen")
    spec = tiny_spec(name="chosen", seeds=[0, 1], methods=METHODS)
    spec["metrics"] = ["ece1", "smece", "accuracy", "coverage", "augrc", "aurc"]
    spec["experiments"][0]["bootstrap"] = {"resamples": 50, "level": 0.9}
    out = root / "out"
    run(spec, out_dir=out, cache_dir=root / "cache", progress=False, plots=False)
    return out


def test_leaderboard_shows_the_chosen_columns_from_the_registry(chosen):
    board = json.loads((chosen / "leaderboard.json").read_text())
    exp = board["experiments"][0]
    assert exp["metrics"] == ["ece1", "smece", "accuracy", "coverage", "augrc", "aurc"]
    assert board["metrics"]["augrc"]["label"] == "AUGRC"
    assert board["metrics"]["augrc"]["kind"] == "ranking"
    md = (chosen / "leaderboard.md").read_text()
    header = next(ln for ln in md.splitlines() if ln.startswith("| Method"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "Method", "ECE₁ ↓", "smECE ↓", "Acc. ↑", "Coverage", "AUGRC ↓", "AURC ↓", "p (ECE₁)"]
    assert "ECE₂" not in header and "Brier" not in header
    assert "AUGRC, AURC: once per cell over all evaluation examples" in md
    # a ranking metric's AUC-table value is the cell's single value (no trapezoid rounding)
    rows = {r["method"]: r for r in exp["rows"]}
    cells = sorted((chosen / "cells").glob(f"*/{slug('Confidence')}/seed*.json"))
    per_seed = [json.loads(p.read_text())["metrics"]["augrc"][0] for p in cells]
    assert rows["Confidence"]["metrics"]["augrc"]["auc"]["values"] == per_seed
    # a better selector than "accept everything": lower AUGRC for the confidence selector
    assert (rows["Confidence"]["metrics"]["augrc"]["auc"]["mean"]
            < rows["Temp. scale"]["metrics"]["augrc"]["auc"]["mean"])


def test_bootstrap_intervals_reach_the_cells_json_and_csv(chosen):
    cell = json.loads(next((chosen / "cells").glob(f"*/{slug('Confidence')}/seed0.json"))
                      .read_text())
    assert cell["bootstrap"] == {"resamples": 50, "level": 0.9, "method": "percentile",
                                 "unit": "evaluation example"}
    iv = cell["intervals"]
    nb = len(cell["betas"])
    assert "coverage" not in iv  # fixed by beta: no sampling noise
    for key in ("ece1", "ece2", "brier", "accuracy", "smece", "nll", "mce", "ece1_ew",
                "ece2_debiased"):
        assert len(iv[key]["low"]) == len(iv[key]["high"]) == nb
        assert all(lo <= hi for lo, hi in zip(iv[key]["low"], iv[key]["high"]))
    # the point estimate of a cell lies inside (or on) its accuracy interval at beta = 1
    assert iv["accuracy"]["low"][-1] <= cell["metrics"]["accuracy"][-1] <= iv["accuracy"]["high"][-1]
    assert iv["augrc"]["low"] <= cell["metrics"]["augrc"][0] <= iv["augrc"]["high"]
    # every metric the leaderboard shows has a noise estimate, smECE included
    assert iv["smece"]["auc"][0] <= iv["smece"]["auc"][1]
    board = json.loads((chosen / "leaderboard.json").read_text())
    row_metrics = next(r for r in board["experiments"][0]["rows"]
                       if r["method"] == "Confidence")["metrics"]
    entry = row_metrics["ece1"]["auc"]["bootstrap"]
    assert entry["level"] == 0.9 and entry["per_seed"]["0"] == iv["ece1"]["auc"]
    assert row_metrics["smece"]["auc"]["bootstrap"]["per_seed"]["0"] == iv["smece"]["auc"]
    rows = list(csv.DictReader(io.StringIO((chosen / "leaderboard.csv").read_text())))
    row = next(r for r in rows if r["method"] == "Confidence" and r["metric"] == "ece1")
    assert float(row["boot_level"]) == 0.9
    assert float(row["boot_low_mean"]) == pytest.approx(entry["low_mean"], rel=1e-15)
    assert float(row["boot_low_mean"]) < float(row["boot_high_mean"])
    # the Markdown stays readable: no interval columns
    assert "boot" not in (chosen / "leaderboard.md").read_text().split("## ")[1]


def test_columns_and_headline_read_the_registry():
    cols = columns_for({"metrics": ["coverage", "augrc", "ece1"]})
    assert cols == (Column("coverage", "Coverage", None), Column("augrc", "AUGRC", True, "ranking"),
                    Column("ece1", "ECE₁", True))
    assert headline(cols).key == "augrc"  # the first column marked best
    assert headline(columns_for({"metrics": ["coverage"]})) is None
    # a run.json from before metrics lists: the paper's columns
    assert [c.key for c in columns_for({})] == list(M.DEFAULT_COLUMNS)


def test_cli_metrics_lists_the_registry(capsys):
    assert main(["metrics"]) == 0
    out = capsys.readouterr().out
    for key, info in M.METRICS.items():
        line = next(ln for ln in out.splitlines() if ln.split()[:1] == [key])
        assert info.label in line and info.kind in line
    assert "augrc" in out and "lower is better" in out and "needs coverage_guarantee" in out
