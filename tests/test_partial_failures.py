"""Issue 36 item 2: one failing method does not lose every result. A plugin whose confidence
turns NaN for one parameter value makes its method fail; the run goes on with the other
methods, writes their leaderboard with the failed rows marked (Markdown, CSV, JSON), names
the method, its seeds and its parameters in the one error line, exits 1, and a rerun
retries only the failed cells (they were never written as results)."""

from __future__ import annotations

import csv
import io
import json

import pytest
from conftest import plugin_site, tiny_spec
from selbench.cli import main
from selbench.execution.runner import MethodsFailed, run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: a recalibrator whose confidence is NaN for n_bins >= 20 (as an empty bin divided by zero
#: would make it), unless $SELBENCH_TEST_NANBINS_FIXED is set (the plugin fixed)
NANBINS = '''
import os
from typing import Annotated

import numpy as np
from selbench import Plugin, Recalibrator, hookimpl
from selbench.contract.search import Tune

class NanBins(Recalibrator):
    """The raw confidence; NaN for n_bins >= 20 unless fixed."""
    def __init__(self, n_bins: Annotated[int, Tune.int(2, 30)] = 3):
        self.n_bins = n_bins
    def fit(self, outputs, context):
        return self
    def confidence(self, outputs):
        c = outputs.confidence()
        broken = self.n_bins >= 20 and not os.environ.get("SELBENCH_TEST_NANBINS_FIXED")
        return np.full_like(c, np.nan) if broken else c

@hookimpl
def selbench_recalibrators():
    return [Plugin("nan-bins-test", NanBins)]
'''

METHODS = [
    {"label": "None", "scheme": {"name": "recalibration"}},
    {"label": "Bins 3", "scheme": {"name": "recalibration"},
     "recalibrator": {"name": "nan-bins-test", "params": {"n_bins": 3}}},
    {"label": "Bins 20", "scheme": {"name": "recalibration"},
     "recalibrator": {"name": "nan-bins-test", "params": {"n_bins": 20}}},
    {"label": "Temp. scale", "scheme": {"name": "recalibration"},
     "recalibrator": {"name": "temperature"}},
]
REASON = ("experiments[0].methods[2] ('Bins 20'), seed(s) 0, 1, recalibrator 'nan-bins-test' "
          '{"n_bins": 20}: recalibrator \'nan-bins-test\' (selbench-nanbins-test 1.0).confidence '
          "returned NaN or infinite values")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    with plugin_site(tmp_path_factory.mktemp("site"), "selbench-nanbins-test",
                     {"selbench_nanbins_test": NANBINS},
                     clear_env=["SELBENCH_TEST_NANBINS_FIXED"]) as root:
        yield root


def _check_partial(out, reason: str = REASON) -> None:
    """The leaderboard of the finished methods, with 'Bins 20' marked failed everywhere."""
    tables = json.loads((out / "leaderboard.json").read_text())
    (exp,) = tables["experiments"]
    assert [r["method"] for r in exp["rows"]] == ["None", "Bins 3", "Temp. scale"]
    assert exp["failed"] == [{"method": "Bins 20", "seeds": [0, 1], "error": reason}]
    temp = next(r for r in exp["rows"] if r["method"] == "Temp. scale")
    assert temp["metrics"]["ece1"]["auc"]["n"] == 2  # the finished methods are complete
    md = (out / "leaderboard.md").read_text()
    assert "| Bins 20 " in md and md.count("| failed ") == len(exp["metrics"]) + 1  # + p
    assert "**Bins 20 failed** (seeds 0, 1): " in md and "returned NaN or infinite" in md
    rows = list(csv.DictReader(io.StringIO((out / "leaderboard.csv").read_text())))
    failed = [r for r in rows if r["method"] == "Bins 20"]
    assert len(failed) == len(exp["metrics"]) and {r["error"] for r in failed} == {reason}
    assert all(r["mean"] == "" and r["n_seeds"] == "0" for r in failed)
    assert all(r["error"] == "" and r["mean"] != "" for r in rows if r["method"] != "Bins 20")


def test_failed_method_leaves_the_others_leaderboard_and_is_retried(site, tmp_path,
                                                                     monkeypatch):
    out = tmp_path / "out"
    with pytest.raises(MethodsFailed) as info:
        run(tiny_spec(methods=METHODS), out_dir=out, progress=False, plots=False)
    (failure,) = info.value.failures
    assert (failure.experiment, failure.method, failure.seeds) == ("mixture", "Bins 20", (0, 1))
    assert str(info.value).splitlines()[0] == REASON
    assert str(out / "leaderboard.md") in str(info.value)
    _check_partial(out)
    # the failed cells were never written: the rerun retries exactly them
    assert not list((out / "cells").rglob("*bins-20*/*.json"))
    monkeypatch.setenv("SELBENCH_TEST_NANBINS_FIXED", "1")
    report = run(tiny_spec(methods=METHODS), out_dir=out, progress=False, plots=False)
    assert (report.computed, report.reused) == (2, 6)
    tables = json.loads((out / "leaderboard.json").read_text())
    assert "failed" not in tables["experiments"][0]
    assert [r["method"] for r in tables["experiments"][0]["rows"]] == [m["label"] for m in METHODS]
    assert "error" not in (out / "leaderboard.csv").read_text().splitlines()[0]


def test_command_line_exits_1_with_one_error_naming_seeds_and_parameters(site, tmp_path,
                                                                         write_spec, capsys):
    out = tmp_path / "out"
    code = main(["run", str(write_spec(tiny_spec(methods=METHODS))), "--out", str(out),
                 "--no-progress", "--no-plots", "-q"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.count("selbench: error:") == 1
    assert f"selbench: error: {REASON}\n" in err
    assert (f"  (the leaderboard of the methods that finished is written to "
            f"{out / 'leaderboard.md'} with the failed row marked; rerun the same command to "
            "retry it)") in err
    _check_partial(out)


def test_several_failures_are_listed_once_each(site, tmp_path):
    methods = METHODS + [{"label": "Bins 25", "scheme": {"name": "recalibration"},
                          "recalibrator": {"name": "nan-bins-test", "params": {"n_bins": 25}}}]
    with pytest.raises(MethodsFailed) as info:
        run(tiny_spec(methods=methods, report="betas", betas=[0.5, 1.0]),
            out_dir=tmp_path / "o", progress=False, plots=False)
    lines = str(info.value).splitlines()
    assert lines[0].startswith("2 of 5 methods failed; the leaderboard of the methods that "
                               "finished is written to ")
    assert [ln[:41] for ln in lines[1:]] == ["  - experiments[0].methods[2] ('Bins 20')",
                                             "  - experiments[0].methods[4] ('Bins 25')"]
    tables = json.loads((tmp_path / "o" / "leaderboard.json").read_text())
    exp = tables["experiments"][0]
    assert [f["method"] for f in exp["failed"]] == ["Bins 20", "Bins 25"]
    rows = list(csv.DictReader(io.StringIO((tmp_path / "o" / "leaderboard.csv").read_text())))
    assert {r["point"] for r in rows if r["method"] == "Bins 25"} == {"0.5", "1"}
