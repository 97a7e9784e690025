"""Combining results folders (issue 36, item 6): what `--allow-mixed` merges is said, a
same-named experiment or same-labelled method whose configuration differs is kept apart, and
`selbench rank DIR...` ranks the methods over every experiment of any folders."""

from __future__ import annotations

import json
import warnings

import pytest
from conftest import tiny_spec
from selbench.cli import main
from selbench.execution.runner import run
from selbench.reporting.leaderboard import build_tables
from selbench.reporting.loading import load_results

pytestmark = pytest.mark.usefixtures("one_torch_thread")

METHODS = tiny_spec()["experiments"][0]["methods"]  # None, Temp. scale, Confidence
PLATT = {"label": "Temp. scale", "scheme": {"name": "recalibration"},
         "recalibrator": {"name": "platt"}}  # the same label, another method


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("folders")
    specs = {
        "a": tiny_spec(name="a", seeds=(0, 1)),
        "b": tiny_spec(name="b", seeds=(2, 3)),  # more seeds of the same methods
        "c": tiny_spec(name="c", seeds=(0, 1), methods=[METHODS[0], PLATT]),
        "d": tiny_spec(name="d", seeds=(0, 1), n_fit=200),  # the same names, other settings
        "both": {"spec_version": 1, "name": "both", "seeds": [0, 1], "experiments": [
            tiny_spec()["experiments"][0], {**tiny_spec(n_fit=200)["experiments"][0],
                                            "name": "other"}]},
    }
    for name, spec in specs.items():
        run(spec, out_dir=root / name, cache_dir=root / "cache", progress=False, plots=False)
    return root


def _loaded(*dirs, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = load_results(list(dirs), allow_mixed=True, **kw)
    return results, [str(w.message) for w in caught]


def _rows(results) -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for rec in results.cells:
        out.setdefault((rec["experiment"], rec["method"]), []).append(rec["seed"])
    return {k: sorted(v) for k, v in out.items()}


def test_merging_the_same_methods_of_two_specs_is_said(runs):
    results, said = _loaded(runs / "a", runs / "b")
    assert _rows(results) == {("mixture", m["label"]): [0, 1, 2, 3] for m in METHODS}
    assert said == [f"experiment 'mixture': method {m['label']!r} merges the cells of a (seeds "
                    "0, 1) and b (seeds 2, 3), computed with the same parameters by different "
                    "specs" for m in METHODS]
    # one spec split over two folders (its seeds sharded): merged without a word, as before
    same, said = _loaded(runs / "a", runs / "a")
    assert said == [] and _rows(same) == {("mixture", m["label"]): [0, 1] for m in METHODS}


def test_a_same_labelled_method_of_another_configuration_is_kept_apart(runs):
    results, said = _loaded(runs / "a", runs / "c")
    rows = _rows(results)
    assert rows[("mixture", "Temp. scale")] == [0, 1]
    assert rows[("mixture", "Temp. scale (c)")] == [0, 1]  # platt: its own row
    assert rows[("mixture", "None")] == [0, 1]  # the very same cells, taken once
    assert ("experiment 'mixture': method 'Temp. scale' of c differs from a's (its parameters "
            "or tuning); kept apart as 'Temp. scale (c)'") in said
    with pytest.warns(UserWarning, match="kept apart"):
        board = build_tables([runs / "a", runs / "c"], allow_mixed=True)
    labels = [r["method"] for r in board["experiments"][0]["rows"]]
    assert labels == ["None", "Temp. scale", "Confidence", "Temp. scale (c)"]
    rows = {r["method"]: r for r in board["experiments"][0]["rows"]}
    own = {r["method"]: r for r in json.loads(
        (runs / "c" / "leaderboard.json").read_text())["experiments"][0]["rows"]}
    for stat in ("mean", "std", "n", "seeds"):  # c's own row (the marks depend on the others)
        assert rows["Temp. scale (c)"]["metrics"]["ece1"]["auc"][stat] == \
            own["Temp. scale"]["metrics"]["ece1"]["auc"][stat]
    assert rows["Temp. scale"]["metrics"]["ece1"]["auc"]["mean"] != \
        own["Temp. scale"]["metrics"]["ece1"]["auc"]["mean"]


def test_a_same_named_experiment_of_other_settings_is_kept_apart(runs):
    results, said = _loaded(runs / "a", runs / "d")
    assert [e["name"] for e in results.experiments] == ["mixture", "mixture (d)"]
    assert said == ["experiment 'mixture' of d differs from a's (its settings or backbone "
                    "outputs); kept apart as 'mixture (d)'"]
    assert _rows(results)[("mixture (d)", "Confidence")] == [0, 1]


def test_rank_prints_the_summary_a_two_experiment_run_has(runs, capsys, tmp_path):
    assert main(["rank", str(runs / "a"), str(runs / "d"), "--out", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("## Across experiments") and "Friedman" in out and "CD" in out
    assert "kept apart as 'mixture (d)'" in err
    ranked = json.loads((tmp_path / "r" / "ranking.json").read_text())
    assert (tmp_path / "r" / "ranking.md").read_text() == out
    want = json.loads((runs / "both" / "leaderboard.json").read_text())["summary"]
    assert ranked["experiments"] == ["mixture", "mixture (d)"]
    assert list(ranked["metrics"]) == list(want["metrics"])
    for key, entry in want["metrics"].items():  # the same numbers, other experiment names
        got = ranked["metrics"][key]
        assert got["average_rank"] == entry["average_rank"]
        assert got["friedman"] == entry["friedman"]
        assert got["posthoc"]["critical_difference"] == entry["posthoc"]["critical_difference"]
    assert main(["rank", str(runs / "a"), str(runs / "d"), "--metric", "accuracy"]) == 0
    out = capsys.readouterr().out
    assert "| Acc. ↑" in out and "ECE₁" not in out


def test_rank_needs_two_experiments_and_ranked_metrics(runs, capsys):
    assert main(["rank", str(runs / "a"), str(runs / "b")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (f"selbench: error: {runs / 'a'}, {runs / 'b'}: 1 experiment (mixture); "
                       "ranking needs two or more experiments")
    assert all(line.startswith("selbench: warning: ") for line in err[:-1])  # the merges
    assert main(["rank", str(runs / "a"), str(runs / "d"), "--metric", "coverage"]) == 2
    err = capsys.readouterr().err
    assert "--metric coverage: not ranked over these experiments; ranked metrics" in err
    assert main(["rank", "--help"]) == 0
    assert "Friedman" in capsys.readouterr().out
