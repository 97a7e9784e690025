"""Issue 34: tuning journals. ``OUT/tuning`` and everything under it never lead a write out of
the results folder (a link is refused: one line naming it, exit 2, the link's target unchanged
byte for byte), and a damaged journal (cut mid-line, binary garbage, foreign JSON lines) never
blocks the resume: its complete records are kept, one warning names the file, and the study
ends as the undamaged one did."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import tiny_spec
from selbench.cli import main
from selbench.execution.journal import read_journal

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HB = {"label": "HB", "scheme": {"name": "recalibration"},
      "recalibrator": {"name": "histogram-binning"}}
PRECIOUS = b"a file outside the results folder\n\x00\xff"


def _spec(trials: int) -> dict:
    return tiny_spec(name="tuned", seeds=[0], methods=[HB],
                     tuning={"trials": trials, "objective": "ece1", "sampler": "random"},
                     bootstrap={"resamples": 0})


def _run(write_spec, out: Path, trials: int, capsys) -> tuple[int, str]:
    spec = write_spec(_spec(trials), f"spec{trials}.yaml")
    code = main(["run", str(spec), "--out", str(out), "--no-progress", "-q", "--no-plots"])
    return code, capsys.readouterr().err


def _journal(out: Path) -> Path:
    (path,) = (out / "tuning" / "mixture").glob("*/seed0.journal")
    return path


def _history(out: Path) -> list:
    (path,) = (out / "cells" / "mixture").glob("*/seed0.json")
    return json.loads(path.read_text())["tuning"]["history"]


@pytest.fixture
def outside(tmp_path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "precious.journal").write_bytes(PRECIOUS)
    return folder


def _untouched(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["precious.journal"]
    assert (outside / "precious.journal").read_bytes() == PRECIOUS


def _refused(code: int, err: str, link: Path) -> None:
    lines = [ln for ln in err.splitlines() if ln.startswith("selbench: error:")]
    assert code == 2, err
    assert len(lines) == 1 and str(link) in lines[0] and "symbolic link" in lines[0], err
    assert "Traceback" not in err and "a bug" not in err


def test_a_tuning_folder_linked_outside_is_refused(tmp_path, write_spec, outside, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "tuning").symlink_to(outside, target_is_directory=True)
    code, err = _run(write_spec, out, 2, capsys)
    _refused(code, err, out / "tuning")
    _untouched(outside)


def test_a_tuning_subfolder_linked_outside_is_refused(tmp_path, write_spec, outside, capsys):
    out = tmp_path / "out"
    assert _run(write_spec, out, 2, capsys)[0] == 0
    folder = _journal(out).parent
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()
    folder.symlink_to(outside, target_is_directory=True)
    code, err = _run(write_spec, out, 3, capsys)
    _refused(code, err, folder)
    _untouched(outside)


@pytest.mark.parametrize("workers", [None, 2])
def test_a_journal_linked_to_a_file_outside_is_refused(tmp_path, write_spec, outside, capsys,
                                                       workers):
    out = tmp_path / "out"
    assert _run(write_spec, out, 2, capsys)[0] == 0
    journal = _journal(out)
    journal.unlink()
    journal.symlink_to(outside / "precious.journal")
    spec = write_spec(_spec(3), "spec3.yaml")
    pool = ["--executor", "local", "--workers", str(workers)] if workers else []
    code = main(["run", str(spec), "--out", str(out), "--no-progress", "-q", "--no-plots",
                 *pool])
    _refused(code, capsys.readouterr().err, journal)
    _untouched(outside)
    assert journal.is_symlink()  # left for the user to look at


def test_a_journal_that_is_a_hard_link_is_refused(tmp_path, write_spec, outside, capsys):
    out = tmp_path / "out"
    assert _run(write_spec, out, 2, capsys)[0] == 0
    journal = _journal(out)
    journal.unlink()
    os.link(outside / "precious.journal", journal)
    code, err = _run(write_spec, out, 3, capsys)
    assert code == 2 and "hard link" in err and str(journal) in err, err
    _untouched(outside)


def _cut(data: bytes) -> bytes:  # the last record cut in its middle (a kill, a full disk)
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    return data[: last + (len(data) - last) // 2]


def _garbage(data: bytes) -> bytes:  # binary garbage in the middle and at the end
    lines = data.splitlines(keepends=True)
    return b"".join(lines[:2]) + b"\x00\xff\xfe garbage \x80\n" + b"".join(lines[2:]) \
        + bytes(range(256))


def _foreign(data: bytes) -> bytes:  # JSON lines that are not Optuna's records
    lines = data.splitlines(keepends=True)
    return (lines[0] + b'{"op_code": 4, "worker_id": "x"}\n[1, 2]\n{"op_code": 99}\n'
            + b"".join(lines[1:]) + b'"a string"\n{"op_code": 0, "worker_id": "y"}\n')


@pytest.mark.parametrize("damage, kept_trials", [(_cut, 2), (_garbage, 3), (_foreign, 3),
                                                 (lambda d: bytes(range(256)) * 4, 0)])
def test_a_damaged_journal_is_repaired_with_a_warning(tmp_path, write_spec, capsys, damage,
                                                     kept_trials):
    straight = tmp_path / "straight"
    assert _run(write_spec, straight, 5, capsys)[0] == 0
    out = tmp_path / "out"
    assert _run(write_spec, out, 3, capsys)[0] == 0
    journal = _journal(out)
    journal.write_bytes(damage(journal.read_bytes()))
    code, err = _run(write_spec, out, 5, capsys)  # the study extended: the journal is read
    assert code == 0, err
    warned = [ln for ln in err.splitlines() if ln.startswith("selbench: warning: tuning journal")]
    assert len(warned) == 1 and str(journal) in warned[0] and "damaged" in warned[0], err
    assert ("restart" in warned[0]) == (kept_trials == 0)
    assert "Traceback" not in err and "a bug" not in err and "error" not in err
    assert _history(out) == _history(straight)  # no trial lost, none changed
    # the journal holds clean records only now: read again without a warning
    records = read_journal(journal)
    assert all(isinstance(r, dict) and "op_code" in r for r in records)
    assert journal.read_bytes().endswith(b"\n")


def test_reading_a_journal_keeps_the_complete_records(tmp_path):
    good = [{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}]
    path = tmp_path / "j.journal"
    path.write_text(json.dumps(good[0]) + "\n" + '{"op_code": 0, "worker_id": "w", "stu')
    with pytest.warns(UserWarning, match=f"tuning journal {path} was damaged .1 line"):
        assert read_journal(path) == good
    assert path.read_text() == json.dumps(good[0], separators=(",", ":")) + "\n"
    assert read_journal(tmp_path / "absent.journal") == []
