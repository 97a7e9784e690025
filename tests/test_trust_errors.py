"""Issue "Trust": no input ever produces a traceback.

Every case goes through the real command line (``selbench.cli.main`` in-process, or
``python -m selbench.cli`` where a separate process is the point) and checks the exit code,
that stderr holds exactly one ``selbench: error:`` line naming the file, spec path or plugin
at fault, and that no traceback is printed (unless ``--debug`` asks for one).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import install_distribution, tiny_spec
from selbench.cli import main
from selbench.contract.registry import AUTOLOAD_ENV, get_registry
from selbench.store.results import RunRecord

QUICK = ["--no-progress", "--no-plots", "-q"]


def _method(label: str, recalibrator: str = "temperature", **extra) -> dict:
    return {"label": label, "scheme": {"name": "recalibration"},
            "recalibrator": {"name": recalibrator}, **extra}


def one_error(err: str, *names: str) -> str:
    """The single ``selbench: error:`` message of ``err`` (with its indented continuation
    lines), after checking that nothing else but warnings and argparse's usage line is there
    and that it names each of ``names``."""
    lines = err.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("selbench: error:")]
    assert len(starts) == 1, f"expected one error line, got:\n{err}"
    i = starts[0]
    j = i + 1
    while j < len(lines) and lines[j][:1].isspace():  # the error's own detail lines
        j += 1
    others = lines[:i] + lines[j:]
    assert all(ln.startswith(("selbench: warning:", "usage: selbench")) for ln in others), err
    assert "Traceback" not in err
    message = "\n".join(lines[i:j])
    for name in names:
        assert name in message, f"{name!r} not in {message!r}"
    return message


def cli(capsys, *argv: str) -> tuple[int, str]:
    """Run ``selbench ARGV`` in-process: (exit code, stderr); no traceback anywhere."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out
    return code, err


def listing(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``root``: relative path -> (mtime_ns, bytes)."""
    return {p.relative_to(root).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def spec_path(write_spec):
    return write_spec(tiny_spec(seeds=[0], methods=[_method("Temp")]))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished results directory of a tiny run (one method, one seed); tests copy it."""
    base = tmp_path_factory.mktemp("finished")
    spec = base / "spec.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec(seeds=[0], methods=[_method("Temp")])))
    code = main(["run", str(spec), "--out", str(base / "res"), "--cache-dir", str(base / "cache"),
                 *QUICK])
    assert code == 0
    return base / "res"


@pytest.fixture
def results_copy(finished, tmp_path):
    out = tmp_path / "res"
    shutil.copytree(finished, out)
    return out


# --------------------------------------------------------------------------- 1. paths
def test_cache_dir_env_that_is_a_file_exits_2(spec_path, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("x")
    monkeypatch.setenv("SELBENCH_CACHE_DIR", str(blocker))
    code, err = cli(capsys, "run", spec_path, "--out", tmp_path / "out", *QUICK)
    assert code == 2
    one_error(err, str(blocker), "SELBENCH_CACHE_DIR")
    assert blocker.read_text() == "x"


def test_cache_dir_option_that_is_a_file_exits_2(spec_path, tmp_path, capsys):
    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("x")
    code, err = cli(capsys, "run", spec_path, "--out", tmp_path / "out", "--cache-dir", blocker,
                    *QUICK)
    assert code == 2
    one_error(err, str(blocker), "--cache-dir")
    assert blocker.read_text() == "x"


def test_out_that_is_a_file_exits_2(spec_path, tmp_path, capsys):
    blocker = tmp_path / "out-is-a-file"
    blocker.write_text("x")
    code, err = cli(capsys, "run", spec_path, "--out", blocker, *QUICK)
    assert code == 2
    one_error(err, str(blocker), "is a file")
    assert blocker.read_text() == "x"


def test_debug_anywhere_shows_the_traceback(spec_path, tmp_path, capsys):
    blocker = tmp_path / "out-is-a-file"
    blocker.write_text("x")
    code = main(["run", str(spec_path), "--out", str(blocker), *QUICK, "--debug"])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback (most recent call last)" in err
    assert "ResultsError" in err
    assert err.count("selbench: error:") == 1 and f"{blocker} is a file" in err


# --------------------------------------------------------------------------- 2. disk failures
def _under(path, root: Path) -> bool:
    return Path(os.fspath(path)).resolve().is_relative_to(root.resolve())


def _read_only_below(monkeypatch, root: Path) -> None:
    """The file system turns read-only below ``root``: moving a finished file into place
    fails the way os.replace reports it (filename = the source, filename2 = the target)."""
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if _under(dst, root):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(src), None,
                          os.fspath(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


class _FullFile:
    """A file opened for writing on a full disk: every write fails with ENOSPC and no file
    name, as write(2) reports it (the file itself opens: it exists already)."""

    def __init__(self, fh):
        self._fh = fh

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()
        return False


def _full_below(monkeypatch, root: Path) -> None:
    """The disk below ``root`` is full: writing or flushing a file there fails with ENOSPC
    and no file name, as write(2)/fsync(2) report it (files sealed by a checksum are written
    without fsync, so the write itself must fail)."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to tell which file is being written")
    import builtins

    real_fsync, real_open = os.fsync, builtins.open

    def fsync(fd):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target and _under(target, root):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    def full_open(file, mode="r", *args, **kwargs):
        fh = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+") \
                and _under(os.fspath(file), root):
            return _FullFile(fh)
        return fh

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(builtins, "open", full_open)


def test_read_only_results_dir_exits_1_without_tmp_files(spec_path, tmp_path, monkeypatch,
                                                         capsys):
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o555)
    try:
        really_read_only = not os.access(out, os.W_OK)
    finally:
        os.chmod(out, 0o755)
    if really_read_only:  # not root: a read-only directory is refused up front
        os.chmod(out, 0o555)
        try:
            code, err = cli(capsys, "run", spec_path, "--out", out, *QUICK)
        finally:
            os.chmod(out, 0o755)
        assert code == 2
        one_error(err, str(out), "not writable")
        assert listing(out) == {}
    # as root chmod changes nothing: simulate the file system turning read-only mid-run
    cells = out / "cells"
    _read_only_below(monkeypatch, cells)
    code, err = cli(capsys, "run", spec_path, "--out", out, *QUICK)
    assert code == 1
    one_error(err, str(out), "Read-only file system")
    assert not list(out.rglob("*.tmp")), "a half-written file was left behind"
    assert not list(cells.rglob("*.json")) and not list(cells.rglob("*.npz"))
    json.loads((out / "run.json").read_text())  # written before the failure, intact


def test_full_disk_exits_1_without_tmp_files(spec_path, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    cells = out / "cells"
    _full_below(monkeypatch, cells)
    code, err = cli(capsys, "run", spec_path, "--out", out, *QUICK)
    assert code == 1
    one_error(err, "No space left on device")
    assert not list(out.rglob("*.tmp")), "a half-written file was left behind"
    assert not list(cells.rglob("*.json"))  # the cell record never landed
    json.loads((out / "run.json").read_text())


@pytest.mark.parametrize("failure", [_read_only_below, _full_below], ids=["erofs", "enospc"])
def test_disk_errors_name_the_file_being_written(spec_path, tmp_path, monkeypatch, capsys,
                                                 failure):
    out = tmp_path / "out"
    failure(monkeypatch, out / "cells")
    code, err = cli(capsys, "run", spec_path, "--out", out, *QUICK)
    assert code == 1
    msg = one_error(err, "cannot write " + str(out / "cells"))
    assert ".tmp" not in msg


# --------------------------------------------------------------------------- 3. run.json
def _truncated(text: str) -> str:
    return text[: len(text) // 2]


def _not_an_object(text: str) -> str:
    return json.dumps([1, 2, 3])


def _no_cells(text: str) -> str:
    data = json.loads(text)
    del data["cells"]
    return json.dumps(data)


def _checksum_edited(text: str) -> str:
    data = json.loads(text)
    data["checksum"] = "0" * 64
    return json.dumps(data)


def _value_edited(text: str) -> str:  # checksum kept, content changed
    data = json.loads(text)
    data["provenance"]["seeds"] = [0, 1]
    return json.dumps(data)


@pytest.mark.parametrize("damage, why", [
    (_truncated, "not readable as JSON"),
    (_not_an_object, "not a selbench run record"),
    (_no_cells, "cells"),
    (_checksum_edited, "checksum mismatch"),
    (_value_edited, "checksum mismatch"),
], ids=["truncated", "not-an-object", "no-cells", "checksum-edited", "value-edited"])
def test_leaderboard_of_a_damaged_run_json_exits_1(results_copy, damage, why, capsys):
    run_json = results_copy / "run.json"
    run_json.write_text(damage(run_json.read_text()))
    code, err = cli(capsys, "leaderboard", results_copy, "-q")
    assert code == 1  # LeaderboardError: a results directory that cannot be rendered
    one_error(err, str(run_json), why)


# --------------------------------------------------------------------------- 4. plugins
PLUGIN_MODULE = '''
import sys

import numpy as np

from selbench import NoParams, Params, Plugin, Recalibrator, hookimpl


class _Plain(Recalibrator):
    def fit(self, outputs, context):
        return self

    def confidence(self, outputs):
        return outputs.confidence()


class Boom(_Plain):
    def fit(self, outputs, context):
        raise RuntimeError("boom")


class NaNConfidence(_Plain):
    def confidence(self, outputs):
        return np.full(len(outputs), np.nan)


class WrongShape(_Plain):
    def confidence(self, outputs):
        return outputs.confidence()[:-1]


class Exits(_Plain):
    def fit(self, outputs, context):
        sys.exit(3)


class PickyParams(Params):
    level: int = 1


class Picky(_Plain):
    def __init__(self, level=1):
        raise ValueError(f"level {level} is not supported")


@hookimpl
def selbench_recalibrators():
    return [Plugin("trust-boom", Boom, NoParams),
            Plugin("trust-nan", NaNConfidence, NoParams),
            Plugin("trust-shape", WrongShape, NoParams),
            Plugin("trust-exit", Exits, NoParams),
            Plugin("trust-picky", Picky, PickyParams)]
'''


def _install_plugins(where: Path) -> Path:
    """A real third-party distribution (dist-info + entry point) under ``where``."""
    return install_distribution(where, "trust-plugins", "0.1", {"trust_plugins": PLUGIN_MODULE},
                                {"trust": "trust_plugins"})


@pytest.fixture
def bad_plugins(tmp_path, monkeypatch):
    """The misbehaving recalibrators above, installed through the entry-point group."""
    site = _install_plugins(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    get_registry(refresh=True)
    yield site
    sys.modules.pop("trust_plugins", None)
    monkeypatch.undo()  # off sys.path before the registry is rebuilt
    get_registry(refresh=True)


def _run_plugin(write_spec, tmp_path, capsys, recalibrator: str, *extra: str,
                selector: str | None = None) -> tuple[int, str]:
    method = _method("Mine", recalibrator)
    if selector is not None:
        method["selector"] = {"name": selector}
    path = write_spec(tiny_spec(seeds=[0], methods=[method]))
    return cli(capsys, "run", path, "--out", tmp_path / "out", *QUICK, *extra)


def test_recalibrator_fit_raising_names_method_and_plugin(bad_plugins, write_spec, tmp_path,
                                                          capsys):
    code, err = _run_plugin(write_spec, tmp_path, capsys, "trust-boom")
    assert code == 1
    one_error(err, "'Mine'", "recalibrator 'trust-boom'", "RuntimeError: boom", "fitting")


def test_debug_shows_the_plugins_traceback(bad_plugins, write_spec, tmp_path, capsys):
    code, err = _run_plugin(write_spec, tmp_path, capsys, "trust-boom", "--debug")
    assert code == 1
    assert "Traceback (most recent call last)" in err
    assert "trust_plugins.py" in err and 'raise RuntimeError("boom")' in err
    assert err.count("selbench: error:") == 1


@pytest.mark.parametrize("selector", [None, "confidence"])
def test_nan_confidence_blames_the_recalibrator(bad_plugins, write_spec, tmp_path, capsys,
                                                selector):
    code, err = _run_plugin(write_spec, tmp_path, capsys, "trust-nan", selector=selector)
    assert code == 1
    msg = one_error(err, "'Mine'", "recalibrator 'trust-nan'", ".confidence returned NaN")
    assert "selector" not in msg


def test_wrong_shape_confidence_blames_the_recalibrator(bad_plugins, write_spec, tmp_path,
                                                        capsys):
    code, err = _run_plugin(write_spec, tmp_path, capsys, "trust-shape")
    assert code == 1
    msg = one_error(err, "'Mine'", "recalibrator 'trust-shape'", ".confidence returned shape",
                    "(299,)", "(300,)")
    assert "selector" not in msg


def test_plugin_rejecting_its_params_is_named(bad_plugins, write_spec, tmp_path, capsys):
    code, err = _run_plugin(write_spec, tmp_path, capsys, "trust-picky")
    assert code == 1
    one_error(err, "'Mine'", "recalibrator 'trust-picky'", "ValueError: level 1 is not supported")


def test_plugin_calling_sys_exit_does_not_end_the_process(tmp_path, write_spec):
    site = _install_plugins(tmp_path / "site")
    path = write_spec(tiny_spec(seeds=[0], methods=[_method("Mine", "trust-exit")]))
    env = {k: v for k, v in os.environ.items() if k != AUTOLOAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "selbench.cli", "run", str(path), "--out", str(tmp_path / "out"),
         *QUICK],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )
    assert proc.returncode == 1, proc.stderr  # not 3: the plugin does not decide the exit
    assert "Traceback" not in proc.stdout
    one_error(proc.stderr, "'Mine'", "recalibrator 'trust-exit'", "sys.exit(3)")


# --------------------------------------------------------------------------- 5. security
def _reseal_run(run_json: Path, edit) -> None:
    data = json.loads(run_json.read_text())
    edit(data)
    record = RunRecord.model_validate(data)
    run_json.write_text(json.dumps(record.sealed().model_dump(mode="json")))


def _rename_experiment(name: str):
    def edit(data):
        data["spec"]["experiments"][0]["name"] = name
    return edit


@pytest.mark.parametrize("bad", ["../../x", "ABSOLUTE"], ids=["dotdot", "absolute"])
@pytest.mark.parametrize("sealed", [True, False], ids=["resealed", "tampered"])
def test_plot_refuses_experiment_names_that_leave_the_directory(results_copy, tmp_path, capsys,
                                                                bad, sealed):
    name = str(tmp_path / "escaped") if bad == "ABSOLUTE" else bad
    run_json = results_copy / "run.json"
    if sealed:
        _reseal_run(run_json, _rename_experiment(name))
    else:
        data = json.loads(run_json.read_text())
        _rename_experiment(name)(data)
        run_json.write_text(json.dumps(data))
    before = listing(tmp_path)
    code, err = cli(capsys, "plot", results_copy, "--format", "svg")
    assert code == 1
    msg = one_error(err, str(run_json))
    if sealed:  # the checksum is fine: the name itself is refused
        assert "experiment name" in msg and repr(name) in msg
    else:
        assert "checksum mismatch" in msg
    assert listing(tmp_path) == before, "a file was written"
    assert not (results_copy / "plots").exists()


def test_leaderboard_refuses_cell_paths_that_leave_the_directory(results_copy, tmp_path, capsys):
    outside = tmp_path / "outside.json"
    outside.write_text("{}")

    def edit(data):
        data["cells"][0] = "../outside.json"

    _reseal_run(results_copy / "run.json", edit)
    code, err = cli(capsys, "leaderboard", results_copy, "-q")
    assert code == 1
    one_error(err, str(results_copy / "run.json"), "'../outside.json'",
              "leaves the results directory")


def _escaped_at(text: str, i: int) -> bool:
    """Whether ``text[i]`` is escaped: preceded by an odd number of backslashes."""
    return (i - len(text[:i].rstrip("\\"))) % 2 == 1


def _unescaped(text: str, char: str) -> int:
    return sum(not _escaped_at(text, m.start()) for m in re.finditer(re.escape(char), text))


def _table_cells(line: str) -> list[str]:
    """A Markdown table line split at its unescaped ``|``."""
    cells, start = [], 0
    for i, c in enumerate(line):
        if c == "|" and not _escaped_at(line, i):
            cells.append(line[start:i])
            start = i + 1
    return [*cells, line[start:]][1:-1]


def test_markdown_special_characters_in_labels_do_not_break_the_table(write_spec, tmp_path,
                                                                       capsys):
    labels = ["a|b", "*star*", "_under_", "new\nline", "back\\|slash", "Plain"]
    methods = [_method(lab, "none" if lab == "Plain" else "temperature") for lab in labels]
    path = write_spec(tiny_spec(seeds=[0], methods=methods))
    out = tmp_path / "out"
    code, _ = cli(capsys, "run", path, "--out", out, *QUICK)
    assert code == 0
    md = (out / "leaderboard.md").read_text()
    table = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert len(table) == 2 + len(labels), md  # header, rule, one line per method
    assert len({_unescaped(ln, "|") for ln in table}) == 1, "\n".join(table)
    for line, label in zip(table[2:], labels):
        first = _table_cells(line)[0].strip()
        assert _unescaped(first, "*") == 0 and _unescaped(first, "_") == 0, line
        shown = re.sub(r"\\(.)", r"\1", first)  # what a Markdown reader displays
        if "\n" in label:
            assert shown.split() == label.split(), line
        else:
            assert shown == label, line


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_files_written_by_run_follow_the_umask(write_spec, tmp_path, capsys, umask, mode):
    path = write_spec(tiny_spec(seeds=[0], methods=[_method("Temp")]))
    out, cache = tmp_path / "out", tmp_path / "cache"
    old = os.umask(umask)
    try:
        code, _ = cli(capsys, "run", path, "--out", out, "--cache-dir", cache, *QUICK)
    finally:
        os.umask(old)
    assert code == 0
    files = [p for p in [*out.rglob("*"), *cache.rglob("*")] if p.is_file()]
    assert {"run.json", "spec.yaml", "leaderboard.md", "seed0.json", "seed0.npz"} <= {
        p.name for p in files}
    modes = {p.relative_to(tmp_path).as_posix(): oct(stat.S_IMODE(p.stat().st_mode))
             for p in files}
    assert set(modes.values()) == {oct(mode)}, modes


# --------------------------------------------------------------------------- 6. two specs
def test_second_spec_into_the_same_out_exits_2_and_leaves_the_first(write_spec, tmp_path,
                                                                    capsys):
    out = tmp_path / "out"
    first = write_spec(tiny_spec(name="first", seeds=[0], methods=[_method("Temp")]), "a.yaml")
    second = write_spec(tiny_spec(name="second", seeds=[0], methods=[_method("Temp")]), "b.yaml")
    assert cli(capsys, "run", first, "--out", out, *QUICK)[0] == 0
    before = listing(out)
    assert any(k.startswith("cells/") for k in before)
    code, err = cli(capsys, "run", second, "--out", out, *QUICK)
    assert code == 2
    one_error(err, str(out), "'first'", "'second'")
    assert listing(out) == before


# --------------------------------------------------------------------------- 7. the lock
def test_run_into_a_locked_results_dir_exits_2(spec_path, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import fcntl, os, sys, time
            fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, f"{os.getpid()}\\n".encode())
            print("locked", flush=True)
            time.sleep(60)
        """), str(out / ".selbench.lock")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, err = cli(capsys, "run", spec_path, "--out", out, *QUICK)
    finally:
        holder.kill()
        holder.wait(timeout=10)
        holder.stdout.close()
    assert code == 2
    one_error(err, str(out), "another selbench run", f"pid {holder.pid}")
    assert sorted(p.name for p in out.iterdir()) == [".selbench.lock"]


# --------------------------------------------------------------------------- 8. bad input
def test_unknown_option_exits_2(spec_path, capsys):
    code, err = cli(capsys, "run", spec_path, "--no-such-option")
    assert code == 2
    one_error(err, "--no-such-option")


def test_missing_spec_file_exits_2(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    code, err = cli(capsys, "run", missing, *QUICK)
    assert code == 2
    one_error(err, str(missing), "no such file")


def test_spec_that_is_a_folder_exits_2(tmp_path, capsys):
    folder = tmp_path / "spec.yaml"
    folder.mkdir()
    code, err = cli(capsys, "validate", folder)
    assert code == 2
    one_error(err, str(folder), "folder")


def test_non_utf8_spec_exits_2(tmp_path, capsys):
    spec = tmp_path / "latin1.yaml"
    spec.write_bytes(yaml.safe_dump(tiny_spec(name="caf\u00e9", seeds=[0]),
                                    allow_unicode=True).encode("latin-1"))
    code, err = cli(capsys, "run", spec, *QUICK)
    assert code == 2
    one_error(err, str(spec), "UTF-8")

