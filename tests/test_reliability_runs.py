"""Issue 29, the run-level items: faults and hostile input on the paths of a run.

1. A worker process of ``--executor local`` that dies fails its own job only: the jobs
   that were waiting or running beside it are rerun, and a failing job's traceback goes to
   its log, never to the terminal.
2. Errors name what is wrong: logits whose softmax overflows float32, a recalibrator that
   returns NaN, a plugin calling ``sys.exit`` under the conformance kit, ``overrides`` given
   as one string.
3. ``selbench.run(..., executor="local")`` from a script without a ``__main__`` guard: the
   workers never re-run the script.
4. Warnings on the command line are ``selbench: warning:`` lines, once each.
5. A ``logs`` folder linked out of the results folder is refused.
6. The promise of ``docs/reliability.md``, checked as a whole on a small run.
7. A run extended from seeds [0] to [0, 1, 2] writes the leaderboard of one uninterrupted run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import plugin_site, tiny_spec
from selbench.cli import main
from selbench.execution.runner import JobsFailed, run
from test_executors import FLAKY

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: the dying method first: with two workers it dies while the others wait or run
METHODS = [
    {"label": "Flaky", "scheme": {"name": "recalibration"},
     "recalibrator": {"name": "flaky-test"}},
    {"label": "None", "scheme": {"name": "recalibration"}},
    {"label": "Temp. scale", "scheme": {"name": "recalibration"},
     "recalibrator": {"name": "temperature"}},
    {"label": "Confidence", "scheme": {"name": "recalibration"},
     "recalibrator": {"name": "temperature"}, "selector": {"name": "confidence"}},
]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The flaky recalibrator of tests/test_executors.py, installed on sys.path."""
    with plugin_site(tmp_path_factory.mktemp("site"), "selbench-flaky-test",
                     {"selbench_flaky_test": FLAKY},
                     clear_env=["SELBENCH_TEST_FLAKY"]) as root:
        yield root


def _spec(**kw) -> dict:
    return tiny_spec(name="faults", methods=METHODS, **kw)


def _methods(out: Path) -> list[str]:
    """The method of every cell written under ``out``, sorted."""
    import json

    return sorted(json.loads(p.read_text())["method"] for p in (out / "cells").rglob("*.json"))


# --------------------------------------------------------------------------- 1. culprit
def test_a_dying_worker_fails_its_own_job_only(site, tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv("SELBENCH_TEST_FLAKY", "exit")  # os._exit(17) in the worker
    with pytest.raises(JobsFailed) as info:
        run(_spec(), out_dir=out, progress=False, plots=False, executor="local", workers=2)
    assert [f.unit.method for f in info.value.failures] == ["Flaky"], str(info.value)
    assert "worker process died while running it" in info.value.failures[0].error
    assert "1 of 4 job(s) failed" in str(info.value)
    # every innocent method's cells are in: 3 methods x 2 seeds
    assert _methods(out) == ["Confidence"] * 2 + ["None"] * 2 + ["Temp. scale"] * 2
    monkeypatch.delenv("SELBENCH_TEST_FLAKY")
    report = run(_spec(), out_dir=out, progress=False, plots=False, executor="local", workers=2)
    assert (report.computed, report.reused) == (2, 6)


def _selbench(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None
              ) -> subprocess.CompletedProcess:
    """``python -m selbench ARGS`` in a fresh process (its workers write to its own stderr,
    as on a terminal)."""
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the plugin site too
    return subprocess.run([sys.executable, "-m", "selbench", *args], capture_output=True,
                          text=True, env=full, cwd=cwd, timeout=300)


def test_a_failing_job_and_a_held_lock_print_no_traceback(site, tmp_path, write_spec):
    from selbench.store.results import ResultsDir

    path = write_spec(tiny_spec(name="faults", methods=METHODS[:2], seeds=[0]))
    args = ["run", str(path), "--no-progress", "-q", "--no-plots", "--executor", "local",
            "--workers", "1"]
    done = _selbench(*args, "--out", str(tmp_path / "o"), env={"SELBENCH_TEST_FLAKY": "raise"})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "flaky recalibrator failed on purpose" in done.stderr
    log = Path(done.stderr.split("log: ")[1].split()[0])
    assert "Traceback" in log.read_text() and log.is_relative_to(tmp_path / "o" / "logs")

    results = ResultsDir(tmp_path / "o2")
    results.prepare()
    with results.method_lock("mixture", "None"):  # held by this process
        done = _selbench(*args, "--out", str(tmp_path / "o2"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "1 of 2 job(s) failed" in done.stderr
    assert "being written by another process" in done.stderr


# --------------------------------------------------------------------------- 3. no __main__ guard
SCRIPT = """
import sys
from pathlib import Path

import selbench

with open(Path(__file__).with_suffix(".ran"), "a") as fh:  # once per execution of the body
    fh.write("ran\\n")
report = selbench.run({spec!r}, out_dir={out!r}, executor="local", workers=2,
                      progress=False, plots=False)
print("computed", report.computed)
"""


def test_a_script_without_a_main_guard_runs_once(tmp_path):
    script = tmp_path / "bench.py"
    spec = tiny_spec(name="script", seeds=[0])
    script.write_text(SCRIPT.format(spec=spec, out=str(tmp_path / "out")))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["computed", "3"]
    assert (tmp_path / "bench.ran").read_text() == "ran\n"  # the workers did not re-run it


# --------------------------------------------------------------------------- 2. blame
def _near_limit(scale: float, seed: int = 0, n: int = 300, k: int = 4):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k))
    return (z / np.abs(z).max() * scale).astype(np.float32), rng.integers(0, k, n)


def test_logits_beyond_float32_softmax_are_named_before_training():
    from selbench import DataError, SelectiveRecalibrator

    z, y = _near_limit(3e38)
    short = {"name": "joint", "params": {"epochs": 2}}
    with pytest.raises(DataError, match=r"^logits: row \d+ spans .* float32") as info:
        SelectiveRecalibrator(scheme=short, device="cpu").fit(z, y)
    assert "scheme 'joint'" in str(info.value) and "\n" not in str(info.value)
    # just inside the limit (every row's span fits float32) it trains, finite
    z, y = _near_limit(1.69e38)
    est = SelectiveRecalibrator(scheme=short, device="cpu").fit(z, y)
    assert np.isfinite(est.predict_confidence(z)).all()


def test_a_nan_from_a_recalibrator_is_blamed_on_it_not_on_the_selector():
    from selbench import SelectiveRecalibrator

    z, y = _near_limit(3e38)
    est = SelectiveRecalibrator(scheme="recalibration", selector="none",
                                recalibrator="dirichlet", loss=None, coverage=None,
                                device="cpu")
    with pytest.raises(ValueError, match=r"^recalibrator 'dirichlet'.*\.confidence returned "
                                         r"NaN") as info:
        est.fit(z, y)
    assert "selector" not in str(info.value)


EXITING = '''
import sys
from selbench import Recalibrator

class Exiting(Recalibrator):
    """Calls sys.exit(3) when fitted."""
    def fit(self, outputs, context):
        sys.exit(3)
    def confidence(self, outputs):
        return outputs.confidence()
'''


def test_check_plugin_turns_a_plugins_sys_exit_into_a_conformance_error(tmp_path):
    from selbench.testing import ConformanceError, check_plugin

    namespace: dict = {}
    exec(compile(EXITING, str(tmp_path / "exiting.py"), "exec"), namespace)
    with pytest.raises(ConformanceError, match=r"called sys.exit\(3\)") as info:
        check_plugin("recalibrator", namespace["Exiting"])
    assert "Exiting" in str(info.value)


def test_overrides_and_only_given_as_one_string(tmp_path):
    report = run(tiny_spec(), out_dir=tmp_path / "o", overrides="seeds=[0]", only="None",
                 progress=False, plots=False)
    assert (report.computed, report.reused) == (3, 0)  # 3 methods x seed 0
    for bad in (5, [1]):
        with pytest.raises(ValueError, match="^overrides: expected a list of strings"):
            run(tiny_spec(), out_dir=tmp_path / "o", overrides=bad, progress=False)


# --------------------------------------------------------------------------- 4. warnings
def test_warnings_on_the_command_line_are_one_line_each(tmp_path, write_spec, capsys):
    spec = tiny_spec(seeds=[0, 1], n_eval=5, coverage_guarantee={"delta": 0.001})
    code = main(["run", str(write_spec(spec)), "--out", str(tmp_path / "o"), "--no-progress",
                 "-q", "--no-plots"])
    err = capsys.readouterr().err
    assert code == 0, err
    warned = [ln for ln in err.splitlines() if "coverage cannot be guaranteed" in ln]
    assert warned and all(ln.startswith("selbench: warning: coverage") for ln in warned), err
    assert len(warned) == len(set(warned)) and "RuntimeWarning" not in err
    assert "metrics.py" not in err


# --------------------------------------------------------------------------- 5. logs
def test_a_logs_folder_linked_out_of_the_results_folder_is_refused(tmp_path, write_spec,
                                                                   capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "o"
    out.mkdir()
    (out / "logs").symlink_to(outside, target_is_directory=True)
    code = main(["run", str(write_spec(tiny_spec(seeds=[0]))), "--out", str(out),
                 "--no-progress", "-q", "--no-plots", "--executor", "local", "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 2 and str(out / "logs") in err and "symbolic link" in err, err
    assert list(outside.iterdir()) == []


# --------------------------------------------------------------------------- 6. the promise
def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` -> (size, mtime in ns); links as themselves."""
    return {p.relative_to(root).as_posix(): (p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in root.rglob("*") if not p.is_dir() or p.is_symlink()}


def test_the_promise_on_a_small_run(tmp_path):
    """docs/reliability.md: a run creates files only under --out and the cache (HOME, TMPDIR
    and the working folder stay as they were), a failure names its culprit only, bad input
    is one line and exit 2 naming the path, and no traceback reaches the terminal."""
    home, tmp, cwd = tmp_path / "home", tmp_path / "tmp", tmp_path / "cwd"
    for folder in (home, tmp, cwd):
        folder.mkdir()
    (home / "precious.txt").write_text("mine\n")
    spec = cwd / "spec.yaml"
    import yaml

    spec.write_text(yaml.safe_dump(tiny_spec(name="promise", seeds=[0, 1])))
    before = _tree(tmp_path)
    env = {"HOME": str(home), "TMPDIR": str(tmp), "SELBENCH_CACHE_DIR": str(tmp_path / "cache"),
           "XDG_CACHE_HOME": str(home / ".cache"), "MPLCONFIGDIR": str(tmp_path / "mpl")}
    done = _selbench("run", str(spec), "--out", str(tmp_path / "out"), "--no-progress", "-q",
                     "--executor", "local", "--workers", "2", env=env, cwd=cwd)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    bad = _selbench("run", str(spec), "--out", str(tmp_path / "out"), "--set", "seeds=[-1]",
                    env=env, cwd=cwd)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("selbench: error: ") and "seeds" in bad.stderr, bad.stderr
    after = _tree(tmp_path)
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    allowed = ("out/", "cache/", "mpl/")  # mpl/: matplotlib's own font cache (MPLCONFIGDIR)
    assert changed and all(p.startswith(allowed) for p in changed), changed
    assert any(p.startswith("out/cells/") for p in changed)


# --------------------------------------------------------------------------- 7. extended run
def test_an_extended_run_writes_the_leaderboard_of_one_uninterrupted_run(tmp_path):
    spec = tiny_spec(name="extended", seeds=[0, 1, 2])
    run(spec, out_dir=tmp_path / "once", progress=False, plots=False)
    run(spec, out_dir=tmp_path / "ext", overrides=["seeds=[0]"], progress=False, plots=False)
    report = run(spec, out_dir=tmp_path / "ext", progress=False, plots=False)
    assert (report.computed, report.reused) == (6, 3)
    for name in ("leaderboard.csv", "leaderboard.md"):  # digit for digit
        assert (tmp_path / "ext" / name).read_bytes() == (tmp_path / "once" / name).read_bytes()
    # the JSON too, but for its provenance: when, how long, and which spec hashes made cells
    import json

    def numbers(path: Path):
        def strip(obj):
            if isinstance(obj, dict):
                return {k: strip(v) for k, v in obj.items()
                        if k not in ("date", "timing", "cell_spec_hashes")}
            return [strip(v) for v in obj] if isinstance(obj, list) else obj
        return strip(json.loads(path.read_text()))

    ext = json.loads((tmp_path / "ext" / "leaderboard.json").read_text())
    assert numbers(tmp_path / "ext" / "leaderboard.json") == numbers(
        tmp_path / "once" / "leaderboard.json")
    assert len(ext["provenance"]["cell_spec_hashes"]) == 2  # seeds [0], then [0, 1, 2]
