"""Pre-registered questions and cost on the board: the paired statistics against scipy,
statsmodels and baycomp, Holm by hand, the spec's ``questions:`` block (validation, hash,
cell keys), the answers on hand-made tables, and a run end to end (Markdown, JSON, CSV,
the cost-versus-quality figure)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import scikit_posthocs
from conftest import tiny_spec
from scipy import stats as sps
from selbench.execution.runner import run
from selbench.measure import paired as P
from selbench.reporting import plots as PL
from selbench.reporting import questions as Q
from selbench.reporting.leaderboard import render_csv, render_markdown
from selbench.reporting.ranking import critical_difference, rank_within
from selbench.spec import SpecError, load_spec

baycomp = pytest.importorskip("baycomp", reason="baycomp answers the Bayesian questions")


# --------------------------------------------------------------------------- the statistics
def test_signed_rank_is_scipys_two_sided_wilcoxon_with_zeros_dropped():
    rng = np.random.default_rng(3)
    a = rng.normal(0.05, 0.01, 12)
    b = a + rng.normal(0.004, 0.006, 12)
    b[[2, 7]] = a[[2, 7]]  # two zero differences: dropped
    got = P.signed_rank(a, b)
    d = (a - b)[[i for i in range(12) if i not in (2, 7)]]
    ref = sps.wilcoxon(d, alternative="two-sided")
    assert got["p_value"] == pytest.approx(ref.pvalue, rel=1e-12)
    assert got["statistic"] == pytest.approx(ref.statistic)
    assert (got["n"], got["n_nonzero"]) == (12, 10)
    assert got["median_difference"] == pytest.approx(np.median(a - b))
    assert got["min_p"] == pytest.approx(2 * 2.0 ** -10)
    # exact: every sign in a's favour with 6 pairs gives the smallest two-sided p, 2/2^6
    six = P.signed_rank([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.2, 0.4, 0.6, 0.8, 1.0, 1.2])
    assert six["p_value"] == pytest.approx(2 / 64) and six["statistic"] == 0.0
    # every difference zero (within the stats' tolerance): p = 1, no statistic
    same = P.signed_rank([0.1, 0.2], [0.1, 0.2 + 1e-15])
    assert (same["p_value"], same["statistic"], same["n_nonzero"]) == (1.0, None, 0)
    with pytest.raises(ValueError, match="equal length"):
        P.signed_rank([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="finite"):
        P.signed_rank([0.1, math.nan], [0.1, 0.2])


def test_holm_by_hand_and_against_statsmodels():
    # m = 4: sorted 0.005, 0.01, 0.03, 0.04 -> 4*0.005, 3*0.01, 2*0.03, max(1*0.04, 0.06)
    assert P.holm([0.01, 0.04, 0.03, None, 0.005]) == pytest.approx(
        [0.03, 0.06, 0.06, None, 0.02])
    assert P.holm([0.6, 0.5]) == [1.0, 1.0]  # capped at 1, monotone
    assert P.holm([]) == []
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    p = np.random.default_rng(0).uniform(0, 0.2, 9)
    ref = multitest.multipletests(p, method="holm")[1]
    np.testing.assert_allclose(P.holm(list(p)), ref, rtol=1e-12)


def test_bayesian_signed_rank_reproduces_baycomp_and_orients_by_direction():
    rng = np.random.default_rng(7)
    a = rng.normal(0.040, 0.010, 15)  # ECE: lower is better; a is better by ~0.01
    b = a + rng.normal(0.010, 0.006, 15)
    got = P.bayesian_signed_rank(a, b, 0.005, lower_is_better=True, seed=1, nsamples=4000)
    # baycomp on its own scale (higher is better): the negated ECEs, a first
    ref = baycomp.SignedRankTest(-a, -b, 0.005, prior=0.5, nsamples=4000,
                                 random_state=1).probs(with_rope=True)
    assert (got["p_a_better"], got["p_equal"], got["p_b_better"]) == tuple(ref)
    # the seeded numbers: a mean gain of 0.01 against a ROPE of 0.005 leaves a third of the
    # posterior samples with "practically equal" the most probable region
    assert (got["p_a_better"], got["p_equal"], got["p_b_better"]) == (0.678, 0.322, 0.0)
    far = P.bayesian_signed_rank(a, a + 0.02, 0.005, lower_is_better=True, nsamples=2000)
    assert far["p_a_better"] == 1.0
    assert got["p_a_better"] + got["p_equal"] + got["p_b_better"] == pytest.approx(1.0)
    # the same numbers read as accuracies (higher is better) favour b, and swapping a and b
    # swaps the two sides
    acc = P.bayesian_signed_rank(a, b, 0.005, lower_is_better=False, seed=1, nsamples=4000)
    assert acc["p_b_better"] == got["p_a_better"] and acc["p_a_better"] == got["p_b_better"]
    swap = P.bayesian_signed_rank(b, a, 0.005, lower_is_better=True, seed=1, nsamples=4000)
    assert swap["p_b_better"] == got["p_a_better"]
    # differences all well inside the ROPE: practically equal
    eq = P.bayesian_signed_rank(a, a + 0.0005, 0.005, lower_is_better=True, nsamples=2000)
    assert eq["p_equal"] > 0.99
    # seeded: the same seed gives the same numbers
    again = P.bayesian_signed_rank(a, b, 0.005, lower_is_better=True, seed=1, nsamples=4000)
    assert again == got


def test_nemenyi_cd_for_twelve_methods_at_twenty_experiments():
    """The arena's target: CD <= 4 ranks for 12 methods at 20 experiments (Demšar's q_0.05 for
    k = 12 is 3.268); scikit-posthocs separates exactly the pairs further apart than CD."""
    assert critical_difference(12, 20) == pytest.approx(3.268004 * math.sqrt(12 * 13 / 120),
                                                        rel=1e-6)
    assert critical_difference(12, 20) == pytest.approx(3.7261, abs=1e-4)
    assert critical_difference(12, 2) == pytest.approx(11.783, abs=1e-3)
    rng = np.random.default_rng(0)
    data = rng.normal(size=(20, 12)) + np.linspace(0, 2.5, 12)  # methods drift apart
    ranks = np.stack([rank_within(row) for row in data])
    avg = ranks.mean(0)
    p = np.asarray(scikit_posthocs.posthoc_nemenyi_friedman(ranks))
    cd = critical_difference(12, 20)
    far = np.abs(avg[:, None] - avg[None, :]) > cd
    assert far.any() and (~far & ~np.eye(12, dtype=bool)).any()
    np.testing.assert_array_equal(p < 0.05, far)


# --------------------------------------------------------------------------- the spec
def _with_questions(questions: dict, **spec_keys) -> dict:
    spec = tiny_spec()
    spec.update(questions=questions, **spec_keys)
    return spec


def _problems(spec: dict) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    return info.value.errors


def test_questions_validation_names_the_path_and_the_valid_labels():
    labels = "valid labels: None, Temp. scale, Confidence"
    assert _problems(_with_questions({"rope": 0.01, "pairs": [
        {"name": "q", "a": "Confidense", "b": "None"}]})) == [
        f"questions.pairs[0].a: 'Confidense' is not a method label of any experiment; {labels}"]
    assert _problems(_with_questions({"rope": 0.01, "pairs": [
        {"name": "q", "a": "Confidence", "b": {"best_of": ["None", "TS"]}}]})) == [
        f"questions.pairs[0].b.best_of[1]: 'TS' is not a method label of any experiment; {labels}"]
    assert "has no direction" in _problems(_with_questions({"rope": 0.01, "metric": "coverage",
                                                            "pairs": [{"name": "q", "a": "None",
                                                                       "b": "Confidence"}]}))[0]
    assert _problems(_with_questions({"rope": 0.01, "metric": "smece", "pairs": [
        {"name": "q", "a": "None", "b": "Confidence"}]})) == [
        "questions.metric: 'smece' is not a column of experiments[0] (mixture); add it to its "
        "metrics"]
    assert "compared with itself" in _problems(_with_questions({"rope": 0.01, "pairs": [
        {"name": "q", "a": "None", "b": {"best_of": ["None", "Confidence"]}}]}))[0]
    assert "named twice" in _problems(_with_questions({"rope": 0.01, "pairs": [
        {"name": "q", "a": "None", "b": "Confidence"},
        {"name": "q", "a": "Temp. scale", "b": "Confidence"}]}))[0]
    assert "rope" in _problems(_with_questions({"pairs": [
        {"name": "q", "a": "None", "b": "Confidence"}]}))[0]  # stated up front: required
    # two experiments that never hold both labels together
    a, b = tiny_spec()["experiments"][0], tiny_spec()["experiments"][0]
    b["name"] = "other"
    b["methods"] = [m for m in b["methods"] if m["label"] != "None"]
    a["methods"] = [m for m in a["methods"] if m["label"] != "Confidence"]
    spec = {**tiny_spec(), "experiments": [a, b],
            "questions": {"rope": 0.01, "pairs": [{"name": "q", "a": "None", "b": "Confidence"}]}}
    assert _problems(spec) == ["questions.pairs[0]: no experiment has all of 'None', 'Confidence'"]


def test_questions_are_in_the_hash_and_leave_specs_without_them_as_they_were():
    plain = load_spec(tiny_spec())
    asked = load_spec(_with_questions({"rope": 0.01, "pairs": [
        {"name": "q", "a": "Confidence", "b": "None"}]}))
    costly = load_spec({**tiny_spec(), "cost": True})
    assert "questions" not in plain.canonical() and "cost" not in plain.canonical()
    assert asked.canonical()["questions"]["pairs"][0]["b"] == "None"
    assert asked.canonical()["questions"]["metric"] == "ece1"
    assert len({plain.hash(), asked.hash(), costly.hash()}) == 3
    assert {k: v for k, v in asked.canonical().items() if k != "questions"} == plain.canonical()


# --------------------------------------------------------------------------- the answers
def _exp(name: str, table: dict[str, list[float]], key: str = "ece1") -> dict:
    rows = [{"method": m, "metrics": {key: {"auc": {"seeds": list(range(len(v))),
                                                    "values": list(v)}}}}
            for m, v in table.items()]
    return {"name": name, "report": "auc", "betas": [0.5, 1.0], "metrics": [key], "rows": rows}


def test_answers_on_hand_made_tables():
    rng = np.random.default_rng(11)
    exps = []
    for i in range(8):
        base = rng.uniform(0.03, 0.08)
        table = {"J": [base - 0.01, base - 0.012], "S": [base + 0.001, base - 0.001],
                 "T": [base + 0.02, base + 0.02], "H": [base + 0.03, base + 0.028]}
        if i == 7:
            del table["H"]  # H is missing: the best_of question does not enter this one
        exps.append(_exp(f"e{i}", table))
    q = {"rope": 0.005, "metric": "ece1", "alpha": 0.05, "pairs": [
        {"name": "joint vs seq", "a": "J", "b": "S"},
        {"name": "joint vs best recal", "a": "J", "b": {"best_of": ["H", "T"]}}]}
    ans = Q.answer(exps, q)
    first, second = ans["pairs"]
    a = np.array([np.mean(e["rows"][0]["metrics"]["ece1"]["auc"]["values"]) for e in exps])
    s = np.array([np.mean(e["rows"][1]["metrics"]["ece1"]["auc"]["values"]) for e in exps])
    assert first["n"] == 8 and first["b"] == "S" and first["best_of"] is None
    assert first["wilcoxon"]["p_value"] == pytest.approx(sps.wilcoxon(a - s).pvalue)
    assert first["median_difference"] == pytest.approx(np.median(a - s))
    # T beats H in every experiment where both are: chosen, once; e7 does not enter
    assert second["b"] == "T" and second["best_of_average_rank"] == {"H": 2.0, "T": 1.0}
    assert second["n"] == 7 and second["left_out"] == {"e7": "no H"}
    p1, p2 = first["wilcoxon"]["p_value"], second["wilcoxon"]["p_value"]
    assert [first["p_holm"], second["p_holm"]] == pytest.approx(P.holm([p1, p2]))
    assert first["p_holm"] == pytest.approx(min(1.0, 2 * max(p1, p2)) if p1 > p2 else
                                            max(2 * p1, p2))
    # J beats S by about 0.0105 on average, more than the ROPE; and T by 0.03
    assert first["bayesian"]["p_a_better"] > 0.95
    assert second["bayesian"]["p_a_better"] > 0.95
    assert first["verdict"].startswith("J better than S (Holm p = ")
    assert "Bayesian: J better with P = " in first["verdict"]
    md = "\n".join(Q.markdown(ans))
    assert "### Pre-registered questions" in md and "ROPE ±0.005" in md
    assert "| joint vs best recal | J   | T (best of group) | 7   |" in md
    assert "b = T, the best average rank within the group (H 2.00, T 1.00; a tie" in md
    assert "Not entering: e7 (no H)." in md


def test_few_experiments_say_what_the_test_cannot_reach():
    exps = [_exp(f"e{i}", {"A": [0.01 * i + 0.01], "B": [0.01 * i + 0.05]}) for i in range(3)]
    ans = Q.answer(exps, {"rope": 0.0, "metric": "ece1", "alpha": 0.05,
                          "pairs": [{"name": "q", "a": "A", "b": "B"}]})
    (p,) = ans["pairs"]
    assert p["wilcoxon"]["p_value"] == pytest.approx(0.25) and p["p_holm"] == pytest.approx(0.25)
    assert p["verdict"].startswith("no significant difference: with 3 nonzero differences the "
                                   "test cannot reach p below 0.05")
    one = Q.answer(exps[:1], {"rope": 0.0, "metric": "ece1", "alpha": 0.05,
                              "pairs": [{"name": "q", "a": "A", "b": "B"}]})
    assert one["pairs"][0]["verdict"] == "not answered: 1 experiment(s) hold both methods"
    assert one["pairs"][0]["p_holm"] is None


def test_questions_of_combined_specs():
    q = {"rope": 0.01, "pairs": []}
    assert Q.questions_of({"name": "x"}) == (None, None)
    assert Q.questions_of([{"questions": q}, {"name": "y"}]) == (q, None)
    assert Q.questions_of([{"questions": q}, {"questions": {**q, "rope": 0.02}}])[0] is None


# --------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def asked_run(tmp_path_factory):
    """Three small theory-mixture experiments with questions and cost asked."""
    root = tmp_path_factory.mktemp("questions")
    exps = []
    for i, (sigma, n_fit) in enumerate([(1.0, 300), (1.5, 200), (0.8, 250)]):
        e = tiny_spec(n_fit=n_fit)["experiments"][0]
        e["name"] = f"mix{i}"
        e["dataset"]["params"]["sigma"] = sigma
        exps.append(e)
    spec = {"spec_version": 1, "name": "asked", "seeds": [0, 1], "experiments": exps,
            "cost": True, "questions": {"rope": 0.005, "pairs": [
                {"name": "selection vs none", "a": "Confidence", "b": "None"},
                {"name": "selection vs best recalibration", "a": "Confidence",
                 "b": {"best_of": ["None", "Temp. scale"]}}]}}
    report = run(spec, out_dir=root / "out", cache_dir=root / "cache", progress=False,
                 plots=False)
    return root, spec, report


def test_a_run_answers_its_questions_and_shows_its_cost(asked_run, monkeypatch):
    root, spec, report = asked_run
    out = root / "out"
    board = json.loads((out / "leaderboard.json").read_text())
    ans = board["summary"]["questions"]
    assert ans["rope"] == 0.005 and ans["metric"] == "ece1" and len(ans["pairs"]) == 2
    means = board["summary"]["metrics"]["ece1"]["means"]
    first = ans["pairs"][0]
    assert first["a_means"] == pytest.approx({e: means[e]["Confidence"] for e in means})
    assert first["b_means"] == pytest.approx({e: means[e]["None"] for e in means})
    d = [means[e]["Confidence"] - means[e]["None"] for e in means]
    assert first["wilcoxon"]["p_value"] == pytest.approx(sps.wilcoxon(d).pvalue)
    ranks = board["summary"]["metrics"]["ece1"]["ranks"]
    avg = {m: np.mean([ranks[e][m] for e in ranks]) for m in ("None", "Temp. scale")}
    assert ans["pairs"][1]["b"] == min(avg, key=lambda m: (avg[m], m != "None"))
    md = (out / "leaderboard.md").read_text()
    assert md.index("## Cost") < md.index("## Across experiments") < md.index(
        "### Pre-registered questions")
    rows = {r["method"]: r["timing"]["fit_s_mean"] for r in board["experiments"][0]["rows"]}
    cost_line = next(ln for ln in md.split("## Cost")[1].splitlines()
                     if ln.startswith("| Confidence "))
    assert f"{rows['Confidence']:.3g}" in cost_line
    csv_rows = [ln.split(",") for ln in render_csv(board).splitlines() if ",fit_seconds," in ln]
    assert len(csv_rows) == 9 and float(csv_rows[2][4]) == rows["Confidence"]
    assert render_markdown(board) == md
    # the cost-versus-quality figure, with the critical-difference diagrams
    monkeypatch.setattr(PL, "_experiment_jobs", lambda *a, **k: [])
    drawn = PL.write_plots(out, formats=["png"], workers=1)
    assert drawn[0] == out / "plots" / "summary" / "cost-quality.png" and drawn[0].is_file()
    # the questions and cost change the spec hash, not the cells: all reused
    plain = {k: v for k, v in spec.items() if k not in ("questions", "cost")}
    reuse = run(plain, out_dir=out, cache_dir=root / "cache", progress=False, plots=False)
    assert (reuse.computed, reuse.reused) == (0, report.computed) and report.computed == 18
    board = json.loads((out / "leaderboard.json").read_text())
    assert "questions" not in board["summary"]
    assert "## Cost" not in (out / "leaderboard.md").read_text()
    assert not [ln for ln in render_csv(board).splitlines() if ",fit_seconds," in ln]


# --------------------------------------------------------------------------- Elo
def test_bradley_terry_elo_by_hand_and_against_sklearn():
    from selbench.measure.elo import bradley_terry, elo
    from sklearn.linear_model import LogisticRegression

    # a beats b 3 times out of 4: odds 3, so 400 · log10(3) = 190.85 Elo points apart
    two = elo([[0, 3], [1, 0]], ridge=0.0)
    assert two[0] - two[1] == pytest.approx(400 * math.log10(3), abs=1e-4)
    assert two.mean() == pytest.approx(1000.0)
    # random matches among 5 methods with ties: the maximum-likelihood fit of a logistic
    # regression on +1/-1 indicators (a tie: half a win each way), as Chatbot Arena's
    rng = np.random.default_rng(0)
    k, strength = 5, rng.normal(0, 1, 5)
    wins, x, y, sw = np.zeros((k, k)), [], [], []
    for _ in range(400):
        a, b = rng.choice(k, 2, replace=False)
        u, p = rng.uniform(), 1 / (1 + math.exp(strength[b] - strength[a]))
        o = 1.0 if u < 0.9 * p else 0.5 if u < 0.9 * p + 0.1 else 0.0
        wins[a, b] += o
        wins[b, a] += 1 - o
        row = np.zeros(k)
        row[a], row[b] = 1, -1
        for label, weight in ((1, o), (0, 1 - o)):
            if weight:
                x.append(row)
                y.append(label)
                sw.append(weight)
    ref = LogisticRegression(C=np.inf, fit_intercept=False, tol=1e-12, max_iter=10_000).fit(
        np.array(x), np.array(y), sample_weight=np.array(sw)).coef_[0]
    np.testing.assert_allclose(bradley_terry(wins, ridge=0.0), ref - ref.mean(), atol=1e-6)
    # a clean sweep stays finite with the ridge
    sweep = np.array([[0, 4, 4], [0, 0, 2], [0, 2, 0]], dtype=float)
    assert np.isfinite(elo(sweep)).all() and elo(sweep)[0] > 1500


def test_win_rates_carry_elo_with_a_bootstrap_interval():
    from selbench.measure.elo import elo
    from selbench.reporting.ranking import win_rates

    per = [{"A": {0: 0.1, 1: 0.1}, "B": {0: 0.2, 1: 0.05}, "C": {0: 0.3, 1: 0.3}},
           {"A": {0: 0.1, 1: 0.2}, "B": {0: 0.2, 1: 0.1}, "C": {0: 0.3, 1: 0.3}},
           {"A": {0: 0.4, 1: 0.1}, "B": {0: 0.2, 1: 0.2}, "C": {0: 0.1, 1: 0.3}}]
    got = win_rates(per, ["A", "B", "C"], lower_is_better=True, resamples=50)
    # the matches: the row method's wins summed over the 6 (experiment, seed) pairs
    wins = np.array([[0, 3, 5], [3, 0, 5], [1, 1, 0]], dtype=float)
    point = elo(wins)
    assert [got["elo"][m]["rating"] for m in "ABC"] == pytest.approx(list(point))
    assert got["elo_resamples"] == 50
    for m in "ABC":
        assert got["elo"][m]["low"] <= got["elo"][m]["rating"] <= got["elo"][m]["high"]
