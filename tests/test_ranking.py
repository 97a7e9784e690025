"""Rankings across experiments: ranks and ties, the Friedman and Nemenyi tests against scipy and
scikit-posthocs, win rates and their bootstrap, and the leaderboard's summary end to end."""

from __future__ import annotations

import json
import math

import matplotlib
import numpy as np
import pytest
import scikit_posthocs
from conftest import tiny_spec
from scipy import stats as sps
from selbench.cli import main
from selbench.execution.runner import run
from selbench.measure.metrics import auc
from selbench.reporting import plots as P
from selbench.reporting import ranking as R
from selbench.reporting.figures import RC_PARAMS, critical_difference_figure, save_figure
from selbench.reporting.leaderboard import build_tables, render_markdown
from selbench.reporting.plots import write_plots


def _exp(name: str, table: dict[str, dict[str, list[float]]], report: str = "auc",
         betas=(0.5, 1.0)) -> dict:
    """A hand-made experiment table (as ``tables["experiments"]`` holds them): ``table[method]
    [metric]`` = the values of seeds 0, 1, ... (``report: auc``)."""
    rows = []
    for method, metrics in table.items():
        rows.append({"method": method, "metrics": {
            k: {"auc": {"seeds": list(range(len(v))), "values": list(v)}}
            for k, v in metrics.items()}})
    keys = list(next(iter(table.values())))
    return {"name": name, "report": report, "betas": list(betas), "metrics": keys, "rows": rows}


def _means_table(means: np.ndarray, methods, key="ece1") -> list[dict]:
    """One experiment per row of ``means`` [N, k], one seed each."""
    return [_exp(f"e{i}", {m: {key: [float(v)]} for m, v in zip(methods, row)})
            for i, row in enumerate(means)]


# --------------------------------------------------------------------------- ranks
def test_rank_within_averages_ties_and_follows_the_direction():
    np.testing.assert_array_equal(R.rank_within([0.3, 0.1, 0.2]), [3, 1, 2])
    np.testing.assert_array_equal(R.rank_within([0.3, 0.1, 0.2], lower_is_better=False), [1, 3, 2])
    np.testing.assert_array_equal(R.rank_within([0.2, 0.1, 0.2, 0.4]), [2.5, 1, 2.5, 4])
    # within the stats' tolerance is a tie (floating-point noise), beyond it is not
    np.testing.assert_array_equal(R.rank_within([0.1, 0.1 + 1e-14, 0.1 + 1e-6]), [1.5, 1.5, 3])
    with pytest.raises(ValueError, match="finite"):
        R.rank_within([0.1, float("nan")])


def test_ranks_average_ranks_and_ties_on_a_hand_made_example():
    # three experiments, four methods, two seeds; ECE (lower is better) and accuracy (higher)
    exps = [
        _exp("a", {"A": {"ece1": [0.1, 0.3], "accuracy": [0.9, 0.9]},   # mean 0.2
                   "B": {"ece1": [0.1, 0.1], "accuracy": [0.8, 0.8]},   # 0.1
                   "C": {"ece1": [0.2, 0.2], "accuracy": [0.7, 0.7]},   # 0.2: ties with A
                   "D": {"ece1": [0.5, 0.5], "accuracy": [0.95, 0.95]}}),
        _exp("b", {"A": {"ece1": [0.1, 0.1], "accuracy": [0.6, 0.6]},
                   "B": {"ece1": [0.2, 0.2], "accuracy": [0.7, 0.7]},
                   "C": {"ece1": [0.3, 0.3], "accuracy": [0.8, 0.8]},
                   "D": {"ece1": [0.4, 0.4], "accuracy": [0.9, 0.9]}}),
        _exp("c", {"A": {"ece1": [0.4, 0.4], "accuracy": [0.5, 0.5]},
                   "B": {"ece1": [0.1, 0.1], "accuracy": [0.5, 0.5]},
                   "C": {"ece1": [0.2, 0.2], "accuracy": [0.5, 0.5]},
                   "D": {"ece1": [0.3, 0.3], "accuracy": [0.6, 0.6]}}),
    ]
    ece = R.summarize_metric(exps, "ece1")
    assert ece["methods"] == ["A", "B", "C", "D"] and ece["left_out"] == {}
    assert ece["ranks"] == {"a": {"A": 2.5, "B": 1.0, "C": 2.5, "D": 4.0},
                            "b": {"A": 1.0, "B": 2.0, "C": 3.0, "D": 4.0},
                            "c": {"A": 4.0, "B": 1.0, "C": 2.0, "D": 3.0}}
    assert ece["average_rank"] == pytest.approx({"A": 7.5 / 3, "B": 4 / 3, "C": 7.5 / 3,
                                                 "D": 11 / 3})
    assert ece["means"]["a"]["A"] == pytest.approx(0.2)
    # higher is better: the highest mean ranks first
    acc = R.summarize_metric(exps, "accuracy")
    assert acc["ranks"]["a"] == {"D": 1.0, "A": 2.0, "B": 3.0, "C": 4.0}
    assert acc["ranks"]["c"] == {"D": 1.0, "A": 3.0, "B": 3.0, "C": 3.0}
    assert acc["average_rank"]["D"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="coverage"):
        R.summarize_metric(exps, "coverage")  # no direction to rank by


def test_methods_missing_from_an_experiment_are_left_out():
    exps = [_exp("a", {"A": {"ece1": [0.1]}, "B": {"ece1": [0.2]}, "X": {"ece1": [0.0]}}),
            _exp("b", {"A": {"ece1": [0.2]}, "B": {"ece1": [0.1]},
                       "Y": {"ece1": [float("nan")]}})]
    exps[1]["rows"].append({"method": "Y2", "metrics": {"ece1": {"auc": {"seeds": [0],
                                                                         "values": [0.1]}}}})
    s = R.summarize_metric(exps, "ece1")
    assert s["methods"] == ["A", "B"]
    assert s["left_out"] == {"X": "not in b", "Y": "not in a", "Y2": "not in a"}
    exps[0]["rows"].append({"method": "Y", "metrics": {"ece1": {"auc": {"seeds": [0],
                                                                        "values": [0.3]}}}})
    assert R.summarize_metric(exps, "ece1")["left_out"]["Y"] == "no value in b"
    # a row without seeds (e.g. --allow-partial) has no value either
    exps[0]["rows"].append({"method": "Z", "metrics": {"ece1": {"auc": {"seeds": [],
                                                                        "values": []}}}})
    exps[1]["rows"].append({"method": "Z", "metrics": {"ece1": {"auc": {"seeds": [0],
                                                                        "values": [0.1]}}}})
    assert R.summarize_metric(exps, "ece1")["left_out"]["Z"] == "no value in a"


def test_a_per_beta_table_enters_by_its_area_under_beta():
    betas = [0.6, 0.8, 1.0]
    vals = {0.6: [0.1, 0.3], 0.8: [0.2, 0.2], 1.0: [0.4, 0.1]}
    row = {"method": "A", "metrics": {"ece1": {f"{b:g}": {"seeds": [0, 1], "values": vals[b]}
                                               for b in betas}}}
    exp = {"name": "p", "report": "betas", "betas": betas, "metrics": ["ece1"], "rows": [row]}
    got = R.experiment_values(exp, "ece1")["A"]
    assert got[0] == pytest.approx(auc(betas, [0.1, 0.2, 0.4]))
    assert got[1] == pytest.approx(auc(betas, [0.3, 0.2, 0.1]))
    # hand: trapezoids (0.2 * (0.1 + 0.2) / 2 + 0.2 * (0.2 + 0.4) / 2) / 0.4 = 0.225
    assert got[0] == pytest.approx(0.225)


# --------------------------------------------------------------------------- tests
def test_friedman_against_scipy_and_a_hand_computed_statistic():
    rng = np.random.default_rng(3)
    means = rng.normal(size=(6, 4)) + np.array([0.0, 0.5, 1.0, 1.5])  # no ties
    ranks = np.stack([R.rank_within(r) for r in means])
    got = R.friedman(ranks)
    ref = sps.friedmanchisquare(*means.T)
    assert got["statistic"] == pytest.approx(ref.statistic, rel=1e-12)
    assert got["p_value"] == pytest.approx(ref.pvalue, rel=1e-12)
    n, k = ranks.shape
    mean_rank = ranks.mean(0)
    hand = 12 * n / (k * (k + 1)) * (np.sum(mean_rank ** 2) - k * (k + 1) ** 2 / 4)
    assert got["statistic"] == pytest.approx(hand, rel=1e-12)
    assert got["p_value"] == pytest.approx(sps.chi2.sf(hand, k - 1), rel=1e-12)
    assert (got["n_experiments"], got["n_methods"], got["reason"]) == (6, 4, None)
    # with ties, scipy's tie correction on the raw values
    tied = np.round(means, 0)
    got_t = R.friedman(np.stack([R.rank_within(r) for r in tied]))
    assert got_t["statistic"] == pytest.approx(sps.friedmanchisquare(*tied.T).statistic)


def test_friedman_and_posthoc_are_not_defined_below_their_minimum():
    two = R.friedman(np.array([[1.0, 2.0], [2.0, 1.0], [1.0, 2.0]]))
    assert two["statistic"] is None and two["p_value"] is None
    assert "at least 3 ranked methods" in two["reason"]
    one = R.friedman(np.array([[1.0, 2.0, 3.0]]))
    assert one["p_value"] is None and "at least 2 experiments" in one["reason"]
    tied = R.friedman(np.full((3, 4), 2.5))
    assert tied["p_value"] is None and "ties in every experiment" in tied["reason"]
    post = R.nemenyi(np.array([[1.0, 2.0, 3.0]]), ["a", "b", "c"])
    assert post["p_values"] is None and post["critical_difference"] is None
    # the Markdown says so instead of printing a number
    exps = _means_table(np.array([[0.1, 0.2], [0.2, 0.1]]), ["A", "B"])
    md = "\n".join(R.markdown_section(R.summarize(exps)))
    assert "not defined: needs at least 3 ranked methods (has 2)" in md
    assert "| *Friedman p*" in md and "nan" not in md.lower()


def test_nemenyi_against_scikit_posthocs_and_demsars_critical_values():
    rng = np.random.default_rng(5)
    methods = ["A", "B", "C", "D", "E"]
    means = rng.normal(size=(12, 5)) + np.array([0.0, 0.2, 0.9, 1.4, 2.0])
    ranks = np.stack([R.rank_within(r) for r in means])
    got = R.nemenyi(ranks, methods)
    ref = np.asarray(scikit_posthocs.posthoc_nemenyi_friedman(means))
    mat = np.array([[got["p_values"][a][b] for b in methods] for a in methods])
    np.testing.assert_allclose(mat, ref, rtol=1e-10, atol=1e-14)
    # Demšar (2006), Table 5(a): q_0.05 = 2.728 for k = 5 (2.343 for 3, 2.569 for 4)
    assert got["critical_difference"] == pytest.approx(2.728 * math.sqrt(5 * 6 / (6 * 12)),
                                                       abs=5e-4)
    assert R.critical_difference(3, 10) == pytest.approx(2.343 * math.sqrt(3 * 4 / 60), abs=5e-4)
    assert R.critical_difference(4, 10) == pytest.approx(2.569 * math.sqrt(4 * 5 / 60), abs=5e-4)
    # the critical difference and the p-values agree: a pair differs exactly beyond CD
    avg = ranks.mean(0)
    cd = got["critical_difference"]
    for i in range(5):
        for j in range(i + 1, 5):
            gap = abs(avg[i] - avg[j])
            if abs(gap - cd) > 1e-9:
                assert (mat[i, j] < R.ALPHA) == (gap > cd)
    assert any(mat[i, j] < R.ALPHA for i in range(5) for j in range(5))  # the example separates


def test_groups_not_different_are_the_maximal_runs():
    avg = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    far = {("a", "c"), ("a", "d"), ("b", "d")}  # significant pairs
    p = {x: {y: (0.01 if (x, y) in far or (y, x) in far else 0.5) for y in avg} for x in avg}
    assert R.groups_not_different(avg, p) == [["a", "b"], ["b", "c"], ["c", "d"]]
    same = {x: {y: 0.9 for y in avg} for x in avg}
    assert R.groups_not_different(avg, same) == [["a", "b", "c", "d"]]
    apart = {x: {y: (0.9 if x == y else 0.001) for y in avg} for x in avg}
    assert R.groups_not_different(avg, apart) == []


# --------------------------------------------------------------------------- win rates
def test_win_rates_by_hand():
    # experiment 1, seeds 0-1; experiment 2, seeds 0-2; lower is better
    e1 = {"A": {0: 0.1, 1: 0.3}, "B": {0: 0.2, 1: 0.2}, "C": {0: 0.1, 1: 0.5}}
    e2 = {"A": {0: 0.4, 1: 0.4, 2: 0.1}, "B": {0: 0.5, 1: 0.3, 2: 0.1},
          "C": {0: 0.9, 1: 0.9, 2: 0.9}}
    win = R.win_rates([e1, e2], ["A", "B", "C"], lower_is_better=True, resamples=200)
    # A vs B: e1 win, loss; e2 win, loss, tie -> (1 + 0 + 1 + 0 + 0.5) / 5
    assert win["rate"]["A"]["B"] == pytest.approx(2.5 / 5)
    # A vs C: e1 tie, win; e2 win, win, win -> 4.5 / 5
    assert win["rate"]["A"]["C"] == pytest.approx(4.5 / 5)
    # B vs C: e1 loss, win; e2 win x3 -> 4 / 5
    assert win["rate"]["B"]["C"] == pytest.approx(4 / 5)
    for a in "ABC":
        assert win["rate"][a][a] is None
        for b in "ABC":
            if a != b:
                assert win["rate"][a][b] + win["rate"][b][a] == pytest.approx(1.0)
                assert win["low"][a][b] <= win["rate"][a][b] <= win["high"][a][b]
    assert win["overall"]["A"]["rate"] == pytest.approx((2.5 + 4.5) / 10)
    assert win["pairs"] == 5 and win["seeds"] == [[0, 1], [0, 1, 2]]
    # higher is better flips every comparison
    flipped = R.win_rates([e1, e2], ["A", "B", "C"], lower_is_better=False, resamples=200)
    assert flipped["rate"]["A"]["C"] == pytest.approx(0.5 / 5)


def test_win_rate_bootstrap_resamples_experiments_then_seeds_and_is_seeded():
    # A beats B on every seed of e1 and loses on every seed of e2: resampling only seeds
    # would always give 1/2; resampling the experiments gives 0, 1/2 or 1
    e1 = {"A": dict.fromkeys(range(5), 0.1), "B": dict.fromkeys(range(5), 0.2)}
    e2 = {"A": dict.fromkeys(range(5), 0.3), "B": dict.fromkeys(range(5), 0.2)}
    win = R.win_rates([e1, e2], ["A", "B"], lower_is_better=True)
    assert win["rate"]["A"]["B"] == 0.5
    assert (win["low"]["A"]["B"], win["high"]["A"]["B"]) == (0.0, 1.0)
    # within one experiment the seeds are resampled: 3 wins of 5 spread the interval
    e3 = {"A": {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.3, 4: 0.3}, "B": dict.fromkeys(range(5), 0.2)}
    one = R.win_rates([e3], ["A", "B"], lower_is_better=True, resamples=2000)
    assert one["rate"]["A"]["B"] == pytest.approx(0.6)
    assert one["low"]["A"]["B"] < 0.6 < one["high"]["A"]["B"]
    assert one["low"]["A"]["B"] in (0.0, 0.2) and one["high"]["A"]["B"] == 1.0
    again = R.win_rates([e3], ["A", "B"], lower_is_better=True, resamples=2000)
    assert again == one  # seeded: the same intervals every time
    other = R.win_rates([e3], ["A", "B"], lower_is_better=True, resamples=2000, seed=1)
    assert other["rate"] == one["rate"]


# --------------------------------------------------------------------------- summary and outputs
def test_summary_needs_two_experiments_and_ranks_the_metrics_every_table_shows():
    one = _means_table(np.array([[0.1, 0.2, 0.3]]), ["A", "B", "C"])
    assert R.summarize(one) is None
    exps = _means_table(np.array([[0.1, 0.2, 0.3], [0.2, 0.1, 0.3]]), ["A", "B", "C"])
    exps[0]["metrics"].append("brier")  # shown in one experiment only
    s = R.summarize(exps)
    assert list(s["metrics"]) == ["ece1"] and s["left_out_metrics"] == {
        "brier": "not shown in every experiment"}
    assert s["experiments"] == ["e0", "e1"]
    json.dumps(s, allow_nan=False)  # JSON-ready, no NaN


def test_critical_difference_figure_draws_ranks_groups_and_cd(tmp_path):
    entry = R.summarize_metric(_means_table(np.array(
        [[0.1, 0.2, 0.3, 0.4]] * 6 + [[0.2, 0.1, 0.4, 0.3]] * 2), list("ABCD")), "ece1")
    ranks, groups, cd, title = R.diagram(entry, 8)
    assert [m for m, _ in ranks] == ["A", "B", "C", "D"]
    assert cd == pytest.approx(R.critical_difference(4, 8))
    assert groups and all(lo < hi for lo, hi in groups)
    assert "Friedman p < 0.001" in title
    fig = critical_difference_figure(ranks, groups, cd, title)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "A (1.25)" in texts and "D (3.75)" in texts and f"CD = {cd:.2f}" in texts
    thick = [ln for ln in fig.axes[0].lines if ln.get_linewidth() == 3.0]
    assert len(thick) == len(groups)
    svgs = []
    with matplotlib.rc_context(RC_PARAMS):  # as write_plots draws it: the same bytes again
        for name in ("one", "two"):
            fig = critical_difference_figure(ranks, groups, cd, title)
            svgs.append(save_figure(fig, tmp_path / name, ["svg"])[0].read_bytes())
    assert svgs[0] == svgs[1]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two small theory-mixture experiments in one spec, and each in a results folder of its own."""
    root = tmp_path_factory.mktemp("ranking")
    a = tiny_spec()["experiments"][0]
    a["name"] = "mixture-a"
    b = tiny_spec(n_fit=200)["experiments"][0]
    b["name"] = "mixture-b"
    b["dataset"]["params"]["sigma"] = 1.5
    both = {"spec_version": 1, "name": "both", "seeds": [0, 1], "experiments": [a, b]}
    run(both, out_dir=root / "both", cache_dir=root / "cache", progress=False, plots=False)
    for name, exp in (("a", a), ("b", b)):
        spec = {"spec_version": 1, "name": name, "seeds": [0, 1], "experiments": [exp]}
        run(spec, out_dir=root / name, cache_dir=root / "cache", progress=False, plots=False)
    return root


def test_a_run_with_two_experiments_has_the_summary(two_runs, monkeypatch):
    out = two_runs / "both"
    # the figures across experiments only (each experiment's own are tested in test_plots.py)
    monkeypatch.setattr(P, "_experiment_jobs", lambda *a, **k: [])
    drawn = write_plots(out, formats=["png", "svg"], workers=1)
    assert drawn == [out / "plots" / "summary" / f"critical-difference-{k}.{fmt}"
                     for k in ("ece1", "ece2", "brier", "accuracy") for fmt in ("png", "svg")]
    board = json.loads((out / "leaderboard.json").read_text())
    md = (out / "leaderboard.md").read_text()
    assert "## Across experiments" in md and "### Win rates, ECE₁" in md
    summary = board["summary"]
    assert summary["experiments"] == ["mixture-a", "mixture-b"]
    assert list(summary["metrics"]) == ["ece1", "ece2", "brier", "accuracy"]
    for key, entry in summary["metrics"].items():
        assert entry["methods"] == ["None", "Temp. scale", "Confidence"]
        for exp in board["experiments"]:
            means = {r["method"]: r["metrics"][key]["auc"]["mean"] for r in exp["rows"]}
            assert entry["means"][exp["name"]] == pytest.approx(means)
            best = (min if entry["lower_is_better"] else max)(means.values())
            firsts = [m for m, v in means.items() if abs(v - best) <= 1e-12]
            assert {m for m, r in entry["ranks"][exp["name"]].items()
                    if r == min(entry["ranks"][exp["name"]].values())} == set(firsts)
        assert entry["friedman"]["reason"] is None and 0 <= entry["friedman"]["p_value"] <= 1
        assert set(entry["posthoc"]["p_values"]) == set(entry["methods"])
    # accuracy: higher is better; the confidence selector keeps the confident examples
    acc = summary["metrics"]["accuracy"]
    assert acc["average_rank"]["Confidence"] == 1.0
    assert acc["win_rate"]["rate"]["Confidence"]["None"] == 1.0
    assert (out / "plots" / "summary" / "critical-difference-ece1.png").is_file()
    assert (out / "plots" / "summary" / "critical-difference-accuracy.svg").is_file()
    # the Markdown and JSON show the same average ranks
    row = next(ln for ln in md.split("## Across experiments")[1].splitlines()
               if ln.startswith("| Confidence "))
    assert f"{summary['metrics']['ece1']['average_rank']['Confidence']:.2f}" in row


def test_leaderboard_over_two_results_folders_has_the_summary(two_runs, tmp_path, capsys):
    out = tmp_path / "combined"
    assert main(["leaderboard", str(two_runs / "a"), str(two_runs / "b"), "--out", str(out),
                 "-q", "--allow-mixed"]) == 0
    combined = json.loads((out / "leaderboard.json").read_text())
    together = json.loads((two_runs / "both" / "leaderboard.json").read_text())
    assert combined["summary"]["metrics"] == together["summary"]["metrics"]
    assert "## Across experiments" in (out / "leaderboard.md").read_text()


def test_a_single_experiment_has_no_summary(two_runs):
    tables = build_tables(two_runs / "a")
    assert "summary" not in tables
    assert "Across experiments" not in render_markdown(tables)
    assert "summary" not in json.loads((two_runs / "a" / "leaderboard.json").read_text())
