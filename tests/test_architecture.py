"""The layout is the architecture (docs/architecture.md): layers, no import circles, no
private names across modules, functions a reader can hold, and the old module paths still
importing for one release."""

from __future__ import annotations

import ast
import importlib
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "benchmark" / "selbench"
BUILTINS = REPO / "plugins" / "selbench_plugins"
PERF = REPO / "perf"

MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 700
KEPT_WHOLE = "# kept whole:"
#: Most parameters of a core function (``self`` / ``cls`` not counted): parameters that
#: travel together unchanged are a concept to name (a run's plan and settings, a training
#: job, an interval request: docs/architecture.md, "The plan of a run")
MAX_PARAMETERS = 8
#: The public entry points whose many parameters are keyword options a user names, each
#: with why it keeps them (path relative to benchmark/, then the qualified name)
MANY_PARAMETERS = {
    "selbench/execution/runner.py:run": "selbench.run, the Python face of `selbench run`: "
    "one keyword per command-line option; it builds RunSettings and the RunPlan",
    "selbench/library/estimator.py:SelectiveRecalibrator.__init__": "a scikit-learn "
    "estimator: its parameters are its hyper-parameters (get_params / set_params / clone "
    "read them from this signature, and scikit-learn forbids **kwargs here)",
    "selbench/execution/pysearch.py:TuneSearch.__init__": "a scikit-learn search estimator "
    "(like GridSearchCV): its keyword options are its parameters, for get_params and clone",
}

pytest.importorskip("importlinter", reason="import-linter is in the test extra")


def _sources(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.py"))


def _lint_imports(cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code, "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


# --------------------------------------------------------------------------- layers
def test_import_contracts_are_kept():
    """pyproject.toml's [tool.importlinter] contracts: the layers, the core never importing
    the built-ins, no import circle among the modules of any package."""
    done = _lint_imports(REPO)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


@pytest.mark.slow
def test_import_contracts_catch_a_circle_and_an_upward_import(tmp_path):
    """The contracts have teeth: a copy of the tree with one module importing upwards (a
    metric importing the runner), which also closes a circle, fails with that import named."""
    tree = tmp_path / "src"
    shutil.copytree(CORE, tree / "selbench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(BUILTINS, tree / "selbench_plugins",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    binning = tree / "selbench" / "measure" / "stats.py"
    binning.write_text(binning.read_text() + "\nimport selbench.execution.runner  # noqa\n")
    done = _lint_imports(tmp_path, pythonpath=str(tree))
    assert done.returncode != 0
    assert "selbench.measure is not allowed to import selbench.execution" in done.stdout
    assert "selbench.measure.stats -> selbench.execution.runner" in done.stdout


def test_no_private_name_is_imported_from_another_module():
    found = []
    for path in _sources(CORE, BUILTINS):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
                continue
            if not node.module.startswith(("selbench", "selbench_plugins")):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: "
                                 f"from {node.module} import {alias.name}")
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def _perf_imports() -> dict[str, set[str]]:
    scripts = {p.stem for p in PERF.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in PERF.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                deps.add(node.module.split(".")[0])
        graph[path.stem] = deps & scripts - {path.stem}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle_among_the_perf_scripts():
    """perf/ is a folder of scripts, not a package, so import-linter cannot see it."""
    cycle = _cycle(_perf_imports())
    assert cycle is None, "import circle in perf/: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# --------------------------------------------------------------------------- size
def _long_functions(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    out = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        if length <= MAX_FUNCTION_LINES:
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        above = lines[first - 2].strip() if first >= 2 else ""
        if above.startswith(KEPT_WHOLE) and len(above) > len(KEPT_WHOLE) + 10:
            continue
        out.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_functions_a_reader_can_hold():
    """No function over 60 lines in the core or the built-ins, unless the line above it
    says why it stays whole (``# kept whole: <reason>``)."""
    found = [f for path in _sources(CORE, BUILTINS) for f in _long_functions(path)]
    assert not found, "functions over 60 lines:\n" + "\n".join(found)


def test_modules_of_a_readable_size():
    found = [f"{p.relative_to(REPO)} ({n} lines)" for p in _sources(CORE, BUILTINS)
             if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not found, "modules over 700 lines:\n" + "\n".join(found)


def test_the_length_check_needs_a_reason(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    plain = tmp_path / "plain.py"
    plain.write_text(f"def f():\n{body}\n")
    kept = tmp_path / "kept.py"
    kept.write_text(f"# kept whole: a numerically delicate loop (float order)\ndef f():\n{body}\n")
    bare = tmp_path / "bare.py"
    bare.write_text(f"# kept whole:\ndef f():\n{body}\n")
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        assert _long_functions(plain) == ["plain.py:1 f (62 lines)"]
        assert _long_functions(kept) == []
        assert _long_functions(bare) == ["bare.py:2 f (62 lines)"]
    finally:
        REPO = saved


# --------------------------------------------------------------------------- parameters
def _parameter_counts(path: Path) -> list[tuple[str, int, int]]:
    """(qualified name, line, number of parameters) of every function of ``path``; a
    method's ``self`` / ``cls`` is not counted, ``*args`` and ``**kwargs`` count one each."""
    out: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                n = (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
                     + (a.vararg is not None) + (a.kwarg is not None))
                first = (a.posonlyargs + a.args)[:1]
                if prefix and first and first[0].arg in ("self", "cls"):
                    n -= 1
                out.append((prefix + child.name, child.lineno, n))
                visit(child, f"{prefix}{child.name}.<locals>.")

    visit(ast.parse(path.read_text()), "")
    return out


def _many_parameters(paths: list[Path], exempt: dict[str, str]) -> list[str]:
    found = []
    for path in paths:
        rel = path.relative_to(REPO / "benchmark").as_posix()
        for name, line, n in _parameter_counts(path):
            if n > MAX_PARAMETERS and f"{rel}:{name}" not in exempt:
                found.append(f"{rel}:{line} {name} ({n} parameters)")
    return found


def test_no_core_function_takes_nine_parameters():
    """Parameters passed on unchanged are a concept without a name: a core function takes at
    most 8 (the public entry points of :data:`MANY_PARAMETERS` keep their keyword options)."""
    found = _many_parameters(_sources(CORE), MANY_PARAMETERS)
    assert not found, ("functions of more than 8 parameters (pass the plan, the settings, the "
                       "job or the request they belong to):\n" + "\n".join(found))


def test_every_exemption_is_still_needed():
    """An exemption names a function that exists and still has more than 8 parameters."""
    counts = {f"{p.relative_to(REPO / 'benchmark').as_posix()}:{name}": n
              for p in _sources(CORE) for name, _, n in _parameter_counts(p)}
    stale = [key for key in MANY_PARAMETERS if counts.get(key, 0) <= MAX_PARAMETERS]
    assert not stale, f"exemptions no longer needed (remove them): {stale}"


def test_the_parameter_check_counts_what_a_caller_passes(tmp_path):
    src = tmp_path / "benchmark" / "m.py"
    src.parent.mkdir()
    src.write_text(
        "def nine(a, b, c, d, e, f, g, h, i): pass\n"
        "def eight(a, b, c, /, d, *args, e, f, **kw): pass\n"
        "class C:\n"
        "    def method(self, a, b, c, d, e, f, g, h): pass\n"
        "    def nine(self, a, b, c, d, e, f, g, h, *, i=0): pass\n"
        "    @classmethod\n"
        "    def make(cls, a, b, c, d, e, f, g, h): pass\n"
        "def outer():\n"
        "    def inner(a, b, c, d, e, f, g, h, i): pass\n")
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        assert [(name, n) for name, _, n in _parameter_counts(src)] == [
            ("nine", 9), ("eight", 8), ("C.method", 8), ("C.nine", 9), ("C.make", 8),
            ("outer", 0), ("outer.<locals>.inner", 9)]
        assert _many_parameters([src], {}) == [
            "m.py:1 nine (9 parameters)", "m.py:5 C.nine (9 parameters)",
            "m.py:9 outer.<locals>.inner (9 parameters)"]
        assert _many_parameters([src], {"m.py:nine": "", "m.py:C.nine": "",
                                        "m.py:outer.<locals>.inner": ""}) == []
    finally:
        REPO = saved


# --------------------------------------------------------------------------- compatibility
def _moved():
    from selbench.util.moved import MOVED

    return sorted(MOVED.items())


@pytest.mark.parametrize(("old", "new"), _moved())
def test_old_module_paths_still_import_with_a_deprecation_warning(old, new):
    module = importlib.import_module(old)
    target = importlib.import_module(new[0])
    public = [n for n in getattr(target, "__all__", dir(target)) if not n.startswith("_")]
    assert public, f"{new[0]} has no public names"
    name = public[0]
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated .* from {new[0]}"):
        value = getattr(module, name)
    assert value is getattr(target, name)
    for name in public:  # every public name of the new home is reachable from the old path
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            assert hasattr(module, name), f"{old}.{name}"
    with pytest.raises(AttributeError, match="moved to"):
        module.no_such_name_xyz  # noqa: B018


def test_a_plugin_importing_an_old_path_is_keyed_on_the_code_it_runs(tmp_path, monkeypatch):
    """The code digest follows an old path to the module it re-exports."""
    from selbench.execution import codeid

    (tmp_path / "oldstyle_plugin.py").write_text(
        "from selbench.torchutils import to_tensor\nfrom selbench.engine import train_replicas\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    codeid.clear_caches()
    try:
        closure = codeid.module_closure("oldstyle_plugin")
    finally:
        codeid.clear_caches()
    assert {"selbench.training.torchutils", "selbench.training.engine"} <= set(closure)


def test_the_public_faces_export_what_they_did():
    import selbench
    import selbench.metrics
    import selbench.plots
    from selbench.measure import metrics as measured

    for name in selbench.metrics.__all__:
        assert hasattr(selbench.metrics, name), name
    assert {"ece", "METRICS", "smece", "aurc", "bootstrap_ci", "selective_metrics"} <= set(
        selbench.metrics.__all__)
    assert selbench.metrics.ece is getattr(measured, "ece", selbench.metrics.ece)
    for name in selbench.plots.__all__:
        assert hasattr(selbench.plots, name), name
    for name in selbench.__all__:
        assert hasattr(selbench, name), name
    assert callable(selbench.run)


def test_the_core_does_not_import_the_builtins_by_name():
    """The built-ins come through the ``selbench`` entry point of selbench's distribution."""
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group="selbench")}
    assert names.get("selbench_plugins") == "selbench_plugins"
    for path in _sources(CORE):
        assert "import selbench_plugins" not in path.read_text(), path
