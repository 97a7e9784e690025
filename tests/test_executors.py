"""Executors (selbench.execution.executors): inline, a local process pool and submitit give the same
leaderboard byte for byte; failed jobs are reported with their method, seeds, error and log;
finished cells survive a failed or killed job and are reused on the rerun; two jobs never
write the same cell; bad executor input is one line and exit 2."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from conftest import plugin_site, tiny_spec
from selbench.cli import main
from selbench.execution.distributed import Unit, WorkContext, run_unit
from selbench.execution.executors import (
    ExecutorError,
    LocalOptions,
    SubmititOptions,
    choose_options,
)
from selbench.execution.runner import JobsFailed, RunError, run
from selbench.store.results import ResultsDir, ResultsError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: a recalibrator that behaves as "none" unless $SELBENCH_TEST_FLAKY tells it to fail:
#: "raise" (an exception), "exit" (the worker process dies), "once:<file>" (raises the
#: first time, when <file> does not exist yet)
FLAKY = '''
import os
from pathlib import Path
from selbench import Plugin, Recalibrator, hookimpl

class Flaky(Recalibrator):
    """The raw confidence; fails on demand ($SELBENCH_TEST_FLAKY)."""
    def fit(self, outputs, context):
        how = os.environ.get("SELBENCH_TEST_FLAKY", "")
        if how == "raise":
            raise RuntimeError("flaky recalibrator failed on purpose")
        if how == "exit":
            os._exit(17)
        if how.startswith("hang:"):  # say who is computing, then compute for a long time
            Path(how[5:]).write_text(str(os.getpid()))
            import time
            time.sleep(120)
        if how.startswith("once:"):
            marker = Path(how[5:])
            if not marker.exists():
                marker.write_text("failed once")
                raise RuntimeError("flaky recalibrator fails the first time")
        return self
    def confidence(self, outputs):
        return outputs.confidence()

@hookimpl
def selbench_recalibrators():
    return [Plugin("flaky-test", Flaky)]
'''

METHODS = [
    {"label": "None", "scheme": {"name": "recalibration"}},
    {"label": "S-MMCE sequential",
     "scheme": {"name": "sequential", "params": {"epochs": 2, "batch_size": 128}},
     "selector": {"name": "mlp", "params": {"hidden": [8]}},
     "recalibrator": {"name": "temperature"},
     "loss": {"name": "s-mmce"}, "coverage": {"name": "quadratic"}},
    {"label": "Flaky", "scheme": {"name": "recalibration"},
     "recalibrator": {"name": "flaky-test"}},
]
N_CELLS = 6  # 3 methods x seeds 0, 1


def spec(**executor) -> dict:
    s = tiny_spec(name="exec", methods=METHODS, n_fit=200)
    s["experiments"][0]["dataset"]["params"] = {"train_size": 300, "val_size": 300,
                                                "test_size": 300}
    if executor:
        s["executor"] = executor
    return s


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The flaky plugin installed on sys.path (spawned workers inherit sys.path)."""
    with plugin_site(tmp_path_factory.mktemp("site"), "selbench-flaky-test",
                     {"selbench_flaky_test": FLAKY},
                     clear_env=["SELBENCH_TEST_FLAKY"]) as root:
        yield root


@pytest.fixture(scope="module")
def reference(site, tmp_path_factory):
    """The inline run: its leaderboard files and every cell's metrics."""
    out = tmp_path_factory.mktemp("inline")
    report = run(spec(), out_dir=out, cache_dir=tmp_path_factory.mktemp("cache"),
                 progress=False, plots=False)
    assert (report.computed, report.reused) == (N_CELLS, 0)
    return out


def _same_results(out, reference) -> None:
    for name in ("leaderboard.md", "leaderboard.csv"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    ref = {p.relative_to(reference): json.loads(p.read_text())
           for p in (reference / "cells").rglob("*.json")}
    got = {p.relative_to(out): json.loads(p.read_text()) for p in (out / "cells").rglob("*.json")}
    assert set(got) == set(ref) and len(ref) == N_CELLS
    for rel, cell in ref.items():  # every metric of every cell, to the last bit
        assert got[rel]["metrics"] == cell["metrics"], rel
        assert got[rel]["key"] == cell["key"], rel


# --------------------------------------------------------------------------- same numbers
def test_local_pool_gives_the_inline_leaderboard(site, reference, tmp_path):
    report = run(spec(), out_dir=tmp_path / "local", progress=False, plots=False,
                 executor="local", workers=2)
    assert (report.computed, report.reused) == (N_CELLS, 0)
    _same_results(tmp_path / "local", reference)
    # the trained method's numbers are real: an MLP selector was fitted, not a constant
    ece = json.loads(next((tmp_path / "local" / "cells").rglob("seed0.json")).read_text())
    assert len(ece["metrics"]["ece1"]) == 11


def test_submitit_debug_executor_gives_the_inline_leaderboard(site, reference, tmp_path):
    pytest.importorskip("submitit")
    report = run(spec(name="submitit", cluster="debug", poll_s=0.01), out_dir=tmp_path / "s",
                 progress=False, plots=False)
    assert (report.computed, report.reused) == (N_CELLS, 0)
    _same_results(tmp_path / "s", reference)
    assert (tmp_path / "s" / "logs" / "submitit").is_dir()
    assert not (tmp_path / "s" / "logs" / "submitit" / "%j").exists()  # no template folder
    # a rerun submits nothing and reuses every cell
    report = run(spec(name="submitit", cluster="debug"), out_dir=tmp_path / "s",
                 progress=False, plots=False)
    assert (report.computed, report.reused) == (0, N_CELLS)


def test_executor_block_is_left_out_of_the_spec_hash(site, tmp_path):
    from selbench.spec import load_spec

    a = load_spec(spec())
    b = load_spec(spec(name="local", workers=3))
    assert a.hash() == b.hash() and "executor" not in b.canonical()
    assert b.spec.executor == LocalOptions(workers=3)


# --------------------------------------------------------------------------- failures
def test_failed_job_is_reported_and_finished_cells_are_reused(site, reference, tmp_path,
                                                              monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv("SELBENCH_TEST_FLAKY", "raise")
    with pytest.raises(JobsFailed) as info:
        run(spec(), out_dir=out, progress=False, plots=False, executor="local", workers=2)
    (failure,) = info.value.failures
    assert failure.unit.method == "Flaky" and failure.unit.seeds == (0, 1)
    assert "flaky recalibrator failed on purpose" in failure.error
    msg = str(info.value)
    assert "1 of 3 job(s) failed" in msg and "method 'Flaky'" in msg and "seed(s) 0, 1" in msg
    log = out / "logs" / "local" / f"{failure.unit.log_name()}.log"
    assert failure.log == str(log) and "RuntimeError" in log.read_text()
    assert str(out / "leaderboard.md") in msg  # the finished methods' leaderboard, Flaky failed
    tables = json.loads((out / "leaderboard.json").read_text())
    assert [r["method"] for r in tables["experiments"][0]["rows"]] == ["None", "S-MMCE sequential"]
    assert [(f["method"], f["seeds"]) for f in tables["experiments"][0]["failed"]] == [
        ("Flaky", [0, 1])]
    assert len(list((out / "cells").rglob("*.json"))) == 4  # the other methods' cells stay

    monkeypatch.delenv("SELBENCH_TEST_FLAKY")
    report = run(spec(), out_dir=out, progress=False, plots=False, executor="local", workers=2)
    assert (report.computed, report.reused) == (2, 4)  # only the failed job's cells
    _same_results(out, reference)
    # --force --only LABEL: the jobs recompute that method's finished cells, and only those
    report = run(spec(), out_dir=out, progress=False, plots=False, executor="local", workers=2,
                 force=True, only=["S-MMCE sequential"])
    assert (report.computed, report.reused) == (2, 4)
    _same_results(out, reference)


def test_killed_worker_then_rerun_recomputes_nothing_that_finished(site, reference, tmp_path,
                                                                  monkeypatch, capsys):
    out = tmp_path / "out"
    monkeypatch.setenv("SELBENCH_TEST_FLAKY", "exit")  # the worker process dies
    with pytest.raises(JobsFailed, match="worker process died") as info:
        # one worker: the jobs run in order, the flaky (last) one kills it
        run(spec(), out_dir=out, progress=False, plots=False, executor="local", workers=1)
    assert [f.unit.method for f in info.value.failures] == ["Flaky"]
    # the pool's recovery says so even without progress output (issue 34): one line
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "worker process died" in ln]
    assert warned == ["selbench: warning: a worker process died; finding which of 1 running "
                      "job(s) killed it, and resubmitting 0 other job(s)"]
    finished = sorted(p.relative_to(out) for p in (out / "cells").rglob("*.json"))
    assert len(finished) == 4
    before = {p: (out / p).read_bytes() for p in finished}

    monkeypatch.delenv("SELBENCH_TEST_FLAKY")
    report = run(spec(), out_dir=out, progress=False, plots=False)  # any executor resumes
    assert (report.computed, report.reused) == (2, 4)
    assert all((out / p).read_bytes() == data for p, data in before.items())  # untouched
    _same_results(out, reference)


def test_retries_resubmit_a_failed_job(site, reference, tmp_path, monkeypatch, capsys):
    pytest.importorskip("submitit")
    marker = tmp_path / "failed-once"
    monkeypatch.setenv("SELBENCH_TEST_FLAKY", f"once:{marker}")
    report = run(spec(name="submitit", cluster="debug", poll_s=0.01), out_dir=tmp_path / "o",
                 progress=True, plots=False, retries=1)
    assert marker.exists() and (report.computed, report.reused) == (N_CELLS, 0)
    err = capsys.readouterr().err
    failed = [ln for ln in err.splitlines() if "FAILED:" in ln]
    assert len(failed) == 1 and "method 'Flaky'" in failed[0], err
    assert "flaky recalibrator fails the first time" in failed[0]
    assert "methods: 1 job(s) on submitit (retry 1 of 1)" in err
    _same_results(tmp_path / "o", reference)


def test_failed_job_exits_1_with_method_seeds_and_log(site, tmp_path, monkeypatch, capsys,
                                                      write_spec):
    pytest.importorskip("submitit")
    monkeypatch.setenv("SELBENCH_TEST_FLAKY", "raise")
    path = write_spec(spec(name="submitit", cluster="debug", poll_s=0.01))
    code = main(["run", str(path), "--out", str(tmp_path / "o"), "--no-progress", "-q",
                 "--no-plots"])
    err = capsys.readouterr().err
    assert code == 1
    assert "selbench: error: 1 of 3 job(s) failed" in err
    assert "method 'Flaky' (experiments[0].methods[2]), seed(s) 0, 1" in err
    assert "flaky recalibrator failed on purpose" in err
    log = err.split("log: ")[1].split()[0]
    assert log.startswith(str(tmp_path / "o" / "logs" / "submitit"))
    assert "Traceback" not in err
    assert "RuntimeError: flaky recalibrator failed on purpose" in Path(log).read_text()
    assert len(list((tmp_path / "o" / "cells").rglob("*.json"))) == 4


# --------------------------------------------------------------------------- ownership
def _context(resolved, out, cache) -> WorkContext:
    return WorkContext(spec=resolved.spec, raw=resolved.raw, source=None,
                       base_dir=str(resolved.base_dir), spec_hash=resolved.hash(),
                       out_dir=str(out), cache_dir=str(cache), device="cpu")


def test_two_jobs_never_write_the_same_cell(site, tmp_path):
    from selbench.execution.cells import method_groups
    from selbench.execution.keys import identify, plan_cells
    from selbench.spec import load_spec
    from selbench.store.cache import OutputCache

    resolved = load_spec(spec())
    out, cache = tmp_path / "out", OutputCache(tmp_path / "cache")
    cache.prepare()
    results = ResultsDir(out)
    results.prepare()
    cells = plan_cells(resolved, results, identify(resolved, cache))
    group = method_groups(cells)[0]
    unit = Unit("fit", 0, "mixture", 0, "None", tuple(c.key for c in group),
                tuple(c.seed for c in group))
    ctx = _context(resolved, out, cache.root)
    with results.method_lock("mixture", "None"):  # another job owns the method's cells
        with pytest.raises(ResultsError, match="'None' on experiment 'mixture' are being "
                                               "written by another process"):
            run_unit(ctx, unit)
        assert not list(out.rglob("seed*.json"))
    assert run_unit(ctx, unit) == {"computed": 2, "reused": 0}
    # a second attempt of the same job (e.g. requeued after preemption) skips finished cells
    assert run_unit(ctx, unit) == {"computed": 0, "reused": 2}
    # a job of a changed plan refuses to write
    stale = Unit("fit", 0, "mixture", 0, "None", ("0" * 64,), (0,))
    with pytest.raises(RunError, match="changed after the run was submitted"):
        run_unit(ctx, stale)


def test_locked_method_is_a_reported_failure(site, tmp_path):
    pytest.importorskip("submitit")
    results = ResultsDir(tmp_path / "o")
    results.prepare()
    with results.method_lock("mixture", "Flaky"), pytest.raises(JobsFailed) as info:
        run(spec(name="submitit", cluster="debug", poll_s=0.01), out_dir=tmp_path / "o",
            progress=False, plots=False)
    (failure,) = info.value.failures
    assert failure.unit.method == "Flaky" and "being written by another process" in failure.error


# --------------------------------------------------------------------------- bad input
def test_choose_options_cli_wins_over_the_spec():
    from_spec = SubmititOptions(partition="gpu", retries=2)
    assert choose_options(None).name == "inline"
    assert choose_options(from_spec).partition == "gpu"
    assert choose_options(from_spec, "submitit", retries=0) == SubmititOptions(partition="gpu")
    assert choose_options(from_spec, "local", workers=3) == LocalOptions(workers=3)
    with pytest.raises(ExecutorError, match="--executor: unknown executor 'slurm'"):
        choose_options(None, "slurm")
    with pytest.raises(ExecutorError, match="--workers: applies to --executor local"):
        choose_options(None, "inline", workers=2)


def test_submitit_options_map_to_submitit_parameters():
    opts = SubmititOptions(partition="gpu", time_min=30, gpus_per_node=1, cpus_per_task=4,
                           mem_gb=16, array_parallelism=8, slurm={"slurm_account": "lab",
                                                                  "qos": "normal"})
    assert opts.parameters() == {
        "name": "selbench", "timeout_min": 30, "gpus_per_node": 1, "cpus_per_task": 4,
        "mem_gb": 16.0, "slurm_partition": "gpu", "slurm_array_parallelism": 8,
        "slurm_account": "lab", "slurm_qos": "normal"}


@pytest.mark.parametrize("argv, message", [
    (["--executor", "slurm"], "--executor: unknown executor 'slurm'; expected one of inline, "
                              "local, submitit"),
    (["--workers", "2"], "--workers: applies to --executor local, not 'inline'"),
    (["--executor", "local", "--workers", "0"], "--workers: must be at least 1, got 0"),
])
def test_bad_executor_arguments_exit_2_with_one_line(site, argv, message, write_spec, capsys):
    path = write_spec(spec())
    assert main(["run", str(path), *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"selbench: error: {message}\n"


@pytest.mark.parametrize("block, fragment", [
    ({"name": "local", "workers": 0}, "executor.local.workers: Input should be greater than "
                                      "or equal to 1"),
    ({"name": "submitit", "slurm": {"partiton_typo": "x"}}, "executor.submitit.slurm: Value "
                                                            "error, unknown Slurm option(s) "
                                                            "'partiton_typo'"),
    ({"name": "submitit", "gpus": 1}, "executor.submitit.gpus: Extra inputs are not permitted"),
    ({"name": "ray"}, "executor: Input tag 'ray' found using 'name' does not match"),
])
def test_bad_executor_block_names_the_spec(site, block, fragment, write_spec, capsys):
    if "slurm" in block:
        pytest.importorskip("submitit")
    path = write_spec(spec(**block))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and fragment in err and "Traceback" not in err


def test_missing_submitit_is_one_line_and_exit_2(site, write_spec, capsys, monkeypatch,
                                                 tmp_path):
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit -> ImportError
    path = write_spec(spec())
    assert main(["run", str(path), "--executor", "submitit", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == ("selbench: error: --executor submitit needs submitit, which is not "
                   "installed: pip install 'selbench[cluster]' (or, in a checkout, "
                   "pip install -e '.[cluster]')\n")
    assert not (tmp_path / "o").exists()  # nothing written


def test_spec_executor_block_is_used(site, reference, tmp_path, write_spec):
    path = write_spec(spec(name="local", workers=2))
    doc = yaml.safe_load(path.read_text())
    assert doc["executor"] == {"name": "local", "workers": 2}
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--no-progress", "-q",
                 "--no-plots", "--executor", "inline"]) == 0  # the command line wins
    _same_results(tmp_path / "o", reference)


def test_slurm_options_reach_the_sbatch_script(tmp_path, monkeypatch):
    """Without a cluster: a stand-in ``srun`` on PATH lets submitit build its Slurm executor,
    whose sbatch script must carry every option of the executor block."""
    pytest.importorskip("submitit")
    from selbench.execution.executors import SubmititBackend

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 0\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    opts = SubmititOptions(cluster="slurm", partition="gpu", time_min=30, gpus_per_node=1,
                           cpus_per_task=4, mem_gb=16, array_parallelism=8, max_requeues=5,
                           slurm={"account": "lab", "setup": ["module load cuda"]})
    backend = SubmititBackend(opts, tmp_path / "out")
    slurm = backend.executor._executor
    assert slurm.max_num_timeout == 5
    assert slurm.parameters["array_parallelism"] == 8
    script = slurm._make_submission_file_text("CMD", "uid")
    for line in ("#SBATCH --partition=gpu", "#SBATCH --time=30", "#SBATCH --gpus-per-node=1",
                 "#SBATCH --cpus-per-task=4", "#SBATCH --mem=16GB", "#SBATCH --account=lab",
                 "module load cuda",
                 f"#SBATCH --error={tmp_path / 'out' / 'logs' / 'submitit'}/%j/%j_0_log.err"):
        assert line in script, line


def test_slurm_without_slurm_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    from selbench.execution.executors import SubmititBackend

    monkeypatch.setenv("PATH", str(tmp_path))  # no srun, no sbatch
    with pytest.raises(ExecutorError, match=r'^executor submitit: Could not detect "srun"'):
        SubmititBackend(SubmititOptions(cluster="slurm"), tmp_path / "out")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_killing_a_local_run_stops_its_workers(site, tmp_path, write_spec):
    """`kill` (no chance to clean up) on a run with a local pool: its workers die with it
    instead of computing on and holding the method locks of their cells."""
    import signal
    import subprocess
    import time

    marker = tmp_path / "worker.pid"
    only_flaky = spec()
    only_flaky["experiments"][0]["methods"] = [m for m in METHODS if m["label"] == "Flaky"]
    env = dict(os.environ, SELBENCH_TEST_FLAKY=f"hang:{marker}",
               PYTHONPATH=os.pathsep.join([str(site), *sys.path]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "selbench", "run", str(write_spec(only_flaky)), "--out",
         str(tmp_path / "out"), "--executor", "local", "--workers", "1", "--no-progress",
         "--no-plots", "-q"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300  # a loaded machine starts the run slowly
        while not marker.exists() or not marker.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "no worker started"
            time.sleep(0.2)
        worker = int(marker.read_text())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(worker), "the worker outlived the killed run"
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
