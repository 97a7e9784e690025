"""selbench compare on inputs that hold no verdict: each is bad input (exit 2, one line naming
the file and what is wrong), never "agree" on zero or broken numbers."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from selbench.cli import main
from selbench.reporting.compare import CompareError, compare, render_comparison

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "leaderboards" / "quickstart"


def _rows() -> tuple[list[str], list[dict]]:
    with open(QUICKSTART / "leaderboard.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames), list(reader)


def _csv(path: Path, header: list[str], rows: list[dict]) -> Path:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(buf.getvalue())
    return path


def _bad(capsys, a: Path, b: Path, *needles: str) -> None:
    with pytest.raises(CompareError) as info:
        compare(a, b)
    assert all(n in str(info.value) for n in needles), str(info.value)
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("selbench: error:") and len(err.splitlines()) == 1
    assert all(n in err for n in needles) and "a bug" not in err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_mean_that_is_not_a_number_is_bad_input(tmp_path, capsys, value):
    header, rows = _rows()
    rows[3]["mean"] = value
    bad = _csv(tmp_path / "leaderboard.csv", header, rows)
    _bad(capsys, QUICKSTART / "leaderboard.csv", bad, str(bad), "line 5")


def test_a_csv_without_the_leaderboard_columns_is_bad_input(tmp_path, capsys):
    header, rows = _rows()
    renamed = ["average" if h == "mean" else h for h in header]
    for row in rows:
        row["average"] = row.pop("mean")
    bad = _csv(tmp_path / "renamed.csv", renamed, rows)
    _bad(capsys, bad, bad, str(bad), "no column mean")
    plain = _csv(tmp_path / "plain.csv", ["name", "score"], [{"name": "a", "score": "1"}])
    _bad(capsys, plain, plain, str(plain), "no column experiment")


def test_a_row_of_nul_bytes_is_bad_input(tmp_path, capsys):
    header, rows = _rows()
    text = (QUICKSTART / "leaderboard.csv").read_text()
    first, rest = text.split("\n", 1)
    bad = tmp_path / "nul.csv"
    bad.write_text(first + "\n" + "\x00" * 40 + "\n" + rest)
    _bad(capsys, QUICKSTART / "leaderboard.csv", bad, str(bad), "line 2", "NUL")


@pytest.mark.parametrize(("edit", "where"), [
    (lambda d: d.__setitem__("experiments", "xyz"), "experiments: expected a list"),
    (lambda d: d["experiments"][0]["rows"][1]["metrics"]["ece1"]["auc"].__setitem__("n", "5"),
     "experiments[0].rows[1].metrics.ece1.auc.n"),
    (lambda d: d["experiments"][0]["rows"][2].__setitem__("metrics", ["ece1"]),
     "experiments[0].rows[2].metrics: expected an object"),
    (lambda d: d["experiments"][0]["rows"][0]["metrics"]["ece1"]["auc"].__setitem__(
        "mean", "0.1"), "metrics.ece1.auc.mean: expected a number"),
    (lambda d: d["experiments"][0]["rows"][0]["metrics"]["ece1"]["auc"].__setitem__(
        "values", [0.1]), "1 values for n = 5"),
    (lambda d: d["experiments"][0]["rows"][0]["metrics"]["ece1"]["auc"]["bootstrap"]
     .__setitem__("low_mean", 0.9), "low > high"),
    (lambda d: d.__setitem__("provenance", "abc"), "provenance: expected an object"),
    (lambda d: d.__setitem__("experiments", []), "holds no leaderboard numbers"),
])
def test_a_leaderboard_json_of_wrong_types_is_bad_input(tmp_path, capsys, edit, where):
    data = json.loads((QUICKSTART / "leaderboard.json").read_text())
    edit(data)
    bad = tmp_path / "leaderboard.json"
    bad.write_text(json.dumps(data))
    _bad(capsys, QUICKSTART, bad, str(bad), where)


def test_zero_numbers_is_never_agree(tmp_path, capsys):
    header, _ = _rows()
    empty = _csv(tmp_path / "leaderboard.csv", header, [])
    _bad(capsys, empty, empty, str(empty), "holds no leaderboard numbers")


def test_a_metric_without_a_value_on_both_sides_agrees_and_on_one_side_differs(tmp_path):
    """A leaderboard writes nan for the mean and the std of a metric that has no value on
    some seed: that is data, not bad input."""
    header, rows = _rows()
    rows[3]["mean"] = rows[3]["std"] = "nan"
    a = _csv(tmp_path / "a.csv", header, rows)
    both = compare(a, a)
    assert both.agree
    one = compare(QUICKSTART / "leaderboard.csv", a)
    [diff] = one.differences
    assert diff.what == "no value in B" and math.isnan(diff.b.mean)
    assert "differ: 1 of" in render_comparison(one)
