"""Leaderboards: statistics over seeds, p-values, provenance, and refusing mixed spec hashes."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import reseal_cell, tiny_spec
from scipy import stats as sps
from selbench.cli import main
from selbench.execution.runner import run, slug
from selbench.measure.metrics import auc
from selbench.reporting.leaderboard import build_tables, write_leaderboard
from selbench.reporting.loading import LeaderboardError

TEMP = {"scheme": {"name": "recalibration"}, "recalibrator": {"name": "temperature"}}
METHODS = [
    {"label": "None", "scheme": {"name": "recalibration"}},
    {"label": "Temp. scale", **TEMP},
    {"label": "Confidence", **TEMP, "selector": {"name": "confidence"}},
    {"label": "Confidence twin", **TEMP, "selector": {"name": "confidence"}},
]


@pytest.fixture(scope="module")
def five(tmp_path_factory):
    """A finished run of 4 methods x 5 seeds (shared by the tests; copy it to modify it)."""
    root = tmp_path_factory.mktemp("five")
    out = root / "out"
    run(tiny_spec(name="five", seeds=[0, 1, 2, 3, 4], methods=METHODS), out_dir=out,
        cache_dir=root / "cache", progress=False, plots=False)
    return out


def _rows(board, exp=0):
    return {r["method"]: r for r in board["experiments"][exp]["rows"]}


def _md_row(md: str, label: str) -> list[str]:
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {label} "))
    return [c.strip() for c in line.strip("|").split("|")]


def _cells(out, label):
    return sorted((out / "cells").glob(f"*/{slug(label)}/seed*.json"))


def test_stats_and_p_values_over_five_seeds(five):
    board = json.loads((five / "leaderboard.json").read_text())
    rows = _rows(board)
    betas = board["experiments"][0]["betas"]
    # per-seed AUC from the cell curves; mean, std and t-interval from those values
    conf_cells = [json.loads(p.read_text()) for p in _cells(five, "Confidence")]
    per_seed = [auc(betas, c["metrics"]["ece1"]) for c in sorted(conf_cells, key=lambda c: c["seed"])]
    stat = rows["Confidence"]["metrics"]["ece1"]["auc"]
    assert stat["seeds"] == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(stat["values"], per_seed, rtol=0, atol=1e-15)
    assert stat["mean"] == pytest.approx(np.mean(per_seed))
    assert stat["std"] == pytest.approx(np.std(per_seed, ddof=1))
    ref = sps.t.interval(0.95, 4, loc=np.mean(per_seed), scale=sps.sem(per_seed))
    assert stat["ci95"] == pytest.approx(list(ref))
    # the selector's twin ties with it: both are the best mean; the others are worse on every
    # seed, so the exact one-sided signed-rank p-value is 2^-5 and they are not marked
    ece1 = {m: r["metrics"]["ece1"]["auc"] for m, r in rows.items()}
    assert ece1["Confidence"]["best_mean"] and ece1["Confidence twin"]["best_mean"]
    for worse in ("None", "Temp. scale"):
        assert ece1[worse]["p_vs_best"] == pytest.approx(1 / 32)
        assert not ece1[worse]["best"] and ece1[worse]["n_pairs"] == 5
    # coverage is never marked; accuracy (higher is better) is
    assert not any(r["metrics"]["coverage"]["auc"]["best"] for r in rows.values())
    assert rows["Confidence"]["metrics"]["accuracy"]["auc"]["best"]
    md = (five / "leaderboard.md").read_text()
    assert "| p (ECE₁)" in md and "not significantly worse" in md
    none_row, conf_row = _md_row(md, "None"), _md_row(md, "Confidence")
    assert none_row[-1] == "0.031" and not none_row[1].startswith("**")
    assert conf_row[-1] == "best" and conf_row[1].startswith("**")
    # CSV carries the same numbers, interval and p-value
    lines = (five / "leaderboard.csv").read_text().splitlines()
    assert lines[0] == ("experiment,method,metric,point,mean,std,ci95_low,ci95_high,n_seeds,"
                        "p_vs_best,best,best_mean,boot_level,boot_low_mean,boot_high_mean")
    rec = next(ln.split(",") for ln in lines if ln.startswith("mixture,None,ece1,auc,"))
    assert float(rec[9]) == pytest.approx(1 / 32) and rec[10:12] == ["0", "0"]
    assert float(rec[6]) == float(rec[4]) == float(rec[7])  # no fitting: no spread over seeds
    rec = next(ln.split(",") for ln in lines if ln.startswith("mixture,Confidence,ece1,auc,"))
    assert [float(v) for v in rec[6:8]] == pytest.approx(list(ref), rel=1e-12)
    assert rec[9] == "" and rec[10:12] == ["1", "1"]
    boot = rows["Confidence"]["metrics"]["ece1"]["auc"]["bootstrap"]
    assert [float(v) for v in rec[12:]] == [boot["level"], boot["low_mean"], boot["high_mean"]]


def test_a_method_not_significantly_worse_is_marked_best(five, tmp_path):
    """Make 'Temp. scale' a hair worse than the best on average, with mixed signs."""
    out = tmp_path / "out"
    shutil.copytree(five, out)
    best = {json.loads(p.read_text())["seed"]: json.loads(p.read_text())
            for p in _cells(out, "Confidence")}
    offsets = {0: 0.004, 1: -0.002, 2: 0.005, 3: -0.003, 4: 0.001}  # W+ = 4 + 5 + 1
    for path in _cells(out, "Temp. scale"):
        cell = json.loads(path.read_text())
        cell["metrics"]["ece1"] = [v + offsets[cell["seed"]] for v in best[cell["seed"]]["metrics"]["ece1"]]
        path.write_text(json.dumps(cell))
        reseal_cell(path)
    write_leaderboard(out)
    stat = _rows(json.loads((out / "leaderboard.json").read_text()))["Temp. scale"]["metrics"]["ece1"]["auc"]
    expected = sps.wilcoxon(list(offsets.values()), alternative="greater").pvalue
    assert stat["p_vs_best"] == pytest.approx(expected) == pytest.approx(10 / 32)
    assert stat["best"] and not stat["best_mean"]
    row = _md_row((out / "leaderboard.md").read_text(), "Temp. scale")
    assert row[1].startswith("**") and row[-1] == f"{expected:.3f}"


def test_one_seed_marks_only_the_best_mean_and_has_no_p_column(tmp_path):
    run(tiny_spec(seeds=[3]), out_dir=tmp_path, progress=False, plots=False)
    md = (tmp_path / "leaderboard.md").read_text()
    assert "One seed" in md and "p (ECE₁)" not in md
    ece_col = [_md_row(md, m)[1] for m in ("None", "Temp. scale", "Confidence")]
    assert [c.startswith("**") for c in ece_col] == [False, False, True]
    stat = _rows(json.loads((tmp_path / "leaderboard.json").read_text()))["None"]["metrics"]["ece1"]["auc"]
    assert stat["ci95"] is None and stat["p_vs_best"] is None and stat["n"] == 1


def test_betas_report_has_a_p_value_table_and_explains_low_power(tmp_path):
    run(tiny_spec(seeds=[0, 1], betas=[0.8, 0.9], report="betas"), out_dir=tmp_path,
        progress=False, plots=False)
    md = (tmp_path / "leaderboard.md").read_text()
    assert "### p-value against the best mean, ECE₁" in md
    assert "with 2 seeds it cannot reach p < 0.05" in md
    table = md.split("### p-value against the best mean, ECE₁")[1]
    assert _md_row(table, "None")[1:] == ["0.250", "0.250"]
    assert _md_row(table, "Confidence")[1:] == ["best", "best"]


def test_provenance_in_cells_run_and_leaderboard_json(five):
    run_json = json.loads((five / "run.json").read_text())
    board = json.loads((five / "leaderboard.json").read_text())
    prov = board["provenance"]
    for key in ("selbench", "plugins", "plugin_versions", "spec_hash", "git_commit", "torch",
                "numpy", "device", "device_name", "date", "python"):
        assert key in prov, key
    assert prov["spec_hash"] == run_json["provenance"]["spec_hash"]
    assert prov["plugin_versions"]["dataset/theory-mixture"]["provider"] == "selbench_plugins"
    assert "selector/confidence" in prov["plugin_versions"]
    assert board["spec"] == run_json["spec"]
    assert prov["cell_spec_hashes"] == [prov["spec_hash"]] and prov["mixed_spec_hashes"] == []
    assert prov["cells"] == {"planned": 20, "left_out": 0, "tabulated": 20}
    for path in (five / "cells").rglob("seed*.json"):
        cell = json.loads(path.read_text())
        assert cell["spec_hash"] == prov["spec_hash"] and cell["timing"]["fit_s"] >= 0
    timing = _rows(board)["Temp. scale"]["timing"]
    assert timing["cells"] == 5 and timing["fit_s_total"] >= 0 and timing["devices"] == [prov["device"]]
    fit_s = [json.loads(p.read_text())["timing"]["fit_s"]
             for p in (five / "cells").rglob("seed*.json")
             if json.loads(p.read_text())["method"] == "Temp. scale"]
    assert len(fit_s) == 5
    assert timing["fit_s_total"] == round(sum(fit_s), 6)  # rounded: no float noise in the JSON
    assert timing["fit_s_mean"] == round(sum(fit_s) / 5, 6)
    # the Markdown carries no date or timing, so a resumed run renders it identically
    md = (five / "leaderboard.md").read_text()
    assert prov["date"][:10] not in md and "fit_s" not in md


def test_foreign_cells_are_refused_unless_allowed(five, tmp_path, capsys):
    """cells/ written for one spec, run.json for another (an unfinished rerun)."""
    other = tiny_spec(name="five", seeds=[0, 1, 2, 3, 4], methods=METHODS, n_fit=200)
    run(other, out_dir=tmp_path / "other", progress=False, plots=False)
    mixed = tmp_path / "mixed"
    shutil.copytree(five, mixed)
    shutil.copy(tmp_path / "other" / "run.json", mixed / "run.json")
    h_cells = json.loads((five / "run.json").read_text())["provenance"]["spec_hash"][:12]
    h_run = json.loads((mixed / "run.json").read_text())["provenance"]["spec_hash"][:12]
    with pytest.raises(LeaderboardError) as err:
        build_tables(mixed)
    msg = str(err.value)
    assert f"spec hash {h_cells}" in msg and f"spec hash {h_run}" in msg and "--allow-mixed" in msg
    assert main(["leaderboard", str(mixed), "-q"]) == 1
    assert h_cells in capsys.readouterr().err
    assert main(["leaderboard", str(mixed), "-q", "--allow-mixed"]) == 0
    md = (mixed / "leaderboard.md").read_text()
    assert "**Mixed results**" in md and h_cells in md and h_run in md
    board = json.loads((mixed / "leaderboard.json").read_text())
    assert _rows(board)["None"]["metrics"]["ece1"]["auc"]["n"] == 5
    assert sorted(board["provenance"]["mixed_spec_hashes"]) == sorted(
        [json.loads((five / "run.json").read_text())["provenance"]["spec_hash"],
         board["provenance"]["spec_hash"]])
    # --allow-partial leaves the foreign cells out instead
    assert main(["leaderboard", str(mixed), "-q", "--allow-partial"]) == 0
    md = (mixed / "leaderboard.md").read_text()
    assert "**Partial results**: 20 of 20 cells" in md and "Mixed" not in md


def test_several_results_dirs_combine_only_when_allowed(five, tmp_path, capsys):
    extra = tmp_path / "extra"
    run(tiny_spec(name="five", seeds=[5, 6], methods=METHODS), out_dir=extra, progress=False,
        plots=False)
    combined = tmp_path / "combined"
    assert main(["leaderboard", str(five), str(extra), "-q"]) == 1
    assert "--out" in capsys.readouterr().err
    assert main(["leaderboard", str(five), str(extra), "--out", str(combined), "-q"]) == 1
    err = capsys.readouterr().err
    assert "different specs" in err and "--allow-mixed" in err and str(extra) in err
    assert main(["leaderboard", str(five), str(extra), "--out", str(combined), "-q",
                 "--allow-mixed"]) == 0
    board = json.loads((combined / "leaderboard.json").read_text())
    stat = _rows(board)["Temp. scale"]["metrics"]["ece1"]["auc"]
    assert stat["seeds"] == [0, 1, 2, 3, 4, 5, 6] and stat["n"] == 7
    assert [s["dir"] for s in board["provenance"]["sources"]] == [str(five), str(extra)]
    assert "seeds 0, 1, 2, 3, 4, 5, 6" in (combined / "leaderboard.md").read_text()
    # the same directory twice is the same results: no conflict, no duplicates
    tables = build_tables([five, five])
    assert _rows(tables)["None"]["metrics"]["ece1"]["auc"]["n"] == 5


def test_cells_reused_by_a_changed_spec_are_not_mixed(tmp_path):
    run(tiny_spec(seeds=[0]), out_dir=tmp_path, progress=False, plots=False)
    spec = tiny_spec(seeds=[0])
    spec["experiments"][0]["methods"].append({"label": "Temp. twin", **TEMP})
    report = run(spec, out_dir=tmp_path, progress=False, plots=False)
    assert (report.computed, report.reused) == (1, 3)
    board = json.loads((tmp_path / "leaderboard.json").read_text())
    assert len(board["provenance"]["cell_spec_hashes"]) == 2
    assert board["provenance"]["mixed_spec_hashes"] == []
    assert "Mixed" not in (tmp_path / "leaderboard.md").read_text()
