"""A third-party plugin that fails to load is skipped with a warning, never fatal.

Each broken plugin is a real installed distribution (a ``*.dist-info`` folder with
``entry_points.txt`` and the module next to it on ``sys.path``), as ``pip install`` would
leave it. Import errors, ``sys.exit`` at import, a missing entry-point attribute, a module
pluggy refuses to register, and hooks that raise, exit or return the wrong thing are all
skipped with one warning naming the distribution, its version and the entry point; the
commands keep working for every spec that does not use them. A name clash between two
distributions and any failure of the built-ins stay errors.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from conftest import REPO, install_distribution, tiny_spec
from selbench import hookimpl
from selbench.contract.registry import (
    AUTOLOAD_ENV,
    BUILTIN_NAME,
    PluginError,
    Registry,
    SelbenchPluginManager,
    make_plugin_manager,
)

GOOD = '''
from selbench import Plugin, Recalibrator, hookimpl

class Halve(Recalibrator):
    """Halve the distance of the confidence to 1/K."""
    def fit(self, outputs, context):
        self.k_ = outputs.num_classes
        return self
    def confidence(self, outputs):
        c = outputs.confidence()
        return 1 / self.k_ + 0.5 * (c - 1 / self.k_)

@hookimpl
def selbench_recalibrators():
    return [Plugin("halve", Halve)]
'''

HOOK = '''
from selbench import Plugin, hookimpl
from selbench_plugins.recalibrators.temperature import TemperatureScaling
from selbench_plugins.selectors.baselines import ConfidenceSelector

@hookimpl
def selbench_selectors():  # this hook works: its plugin stays available
    return [Plugin("{module}-selector", ConfidenceSelector)]

@hookimpl
def selbench_recalibrators():
    {body}
'''

# distribution, version, module, entry point target, module source, expected warning tail
BROKEN = [
    ("bad-import", "0.3", "bad_import", "bad_import", "import no_such_module_xyz\n",
     "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    ("raises-at-import", "1.0", "raises_at_import", "raises_at_import",
     "raise RuntimeError('boom at import')\n", "RuntimeError: boom at import"),
    ("exits-at-import", "2.1", "exits_at_import", "exits_at_import",
     "import sys\nsys.exit(3)\n", "called sys.exit(3)"),
    ("missing-attr", "0.1", "missing_attr", "missing_attr:hooks", "X = 1\n",
     "AttributeError: module 'missing_attr' has no attribute 'hooks'"),
    ("bad-signature", "0.2", "bad_signature", "bad_signature",
     "from selbench import hookimpl\n\n@hookimpl\ndef selbench_recalibrators(config):\n"
     "    return []\n", "cannot be registered: PluginValidationError"),
    ("hook-raises", "0.4", "hook_raises", "hook_raises",
     HOOK.format(module="hook_raises", body="raise ValueError('bad hook')"),
     "ValueError: bad hook"),
    ("hook-exits", "0.5", "hook_exits", "hook_exits",
     HOOK.format(module="hook_exits", body="import sys; sys.exit('no')"),
     "called sys.exit('no')"),
    ("hook-wrong", "0.6", "hook_wrong", "hook_wrong",
     HOOK.format(module="hook_wrong", body="return ['zeta']"),
     "it must return selbench.Plugin objects, got str"),
    ("hook-scalar", "0.7", "hook_scalar", "hook_scalar",
     HOOK.format(module="hook_scalar",
                 body="return Plugin('zeta', TemperatureScaling)"),
     "it returned Plugin, expected a list of selbench.Plugin"),
    ("hook-bad-params", "0.8", "hook_bad_params", "hook_bad_params",
     HOOK.format(module="hook_bad_params",
                 body="return [Plugin('zeta', TemperatureScaling, params=dict)]"),
     "plugin 'zeta': params <class 'dict'> is not a pydantic model class"),
]  # fmt: skip

HOOK_LEVEL = {"hook-raises", "hook-exits", "hook-wrong", "hook-scalar", "hook-bad-params"}


def install(root: Path, dist: str, version: str, module: str, target: str, code: str,
            entry: str | None = None) -> None:
    """A distribution as pip leaves it: the module and its dist-info on ``root``."""
    install_distribution(root, dist, version, {module: code}, {entry or module: target})


def expected_warning(dist, version, module, target, tail) -> str:
    origin = (f"plugin module {target!r} of distribution '{dist} {version}' "
              f"(entry point {module!r} in group 'selbench')")  # fmt: skip
    if dist in HOOK_LEVEL:
        return f"selbench: warning: skipped selbench_recalibrators() of {origin}: {tail}"
    return f"selbench: warning: skipped {origin}: {tail}"


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path to install distributions into; their modules are forgotten after."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    before = set(sys.modules)
    yield root
    for name in set(sys.modules) - before:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(str(root)):
            del sys.modules[name]


@pytest.mark.parametrize("case", BROKEN, ids=[c[0] for c in BROKEN])
def test_each_broken_plugin_is_skipped_with_a_warning(site, capsys, case):
    dist, version, module, target, code, tail = case
    install(site, dist, version, module, target, code)
    install(site, "good-plugins", "1.0", "good_plugins", "good_plugins", GOOD)
    reg = Registry(make_plugin_manager())
    err = capsys.readouterr().err
    assert expected_warning(dist, version, module, target, tail) in err, err
    assert err.count("selbench: warning:") == 1
    assert len(reg.skipped) == 1 and dist in reg.skipped[0]
    assert "halve" in reg.names("recalibrator")  # the other plugins load
    assert "temperature" in reg.names("recalibrator")
    assert "zeta" not in reg.names("recalibrator")
    if dist in HOOK_LEVEL:  # only the failing hook's result is skipped
        assert f"{module}-selector" in reg.names("selector")
    with pytest.raises(PluginError, match=r"unknown recalibrator 'zeta'.*1 third-party plugin"):
        reg.get("recalibrator", "zeta")


def test_registered_plugins_know_their_distribution(site):
    install(site, "good-plugins", "1.0", "good_plugins", "good_plugins", GOOD, entry="good")
    reg = Registry(make_plugin_manager())
    halve = reg.get("recalibrator", "halve")
    assert halve.provider == "good" and halve.plugin.version == "1.0"
    assert (halve.distribution, halve.distribution_version) == ("good-plugins", "1.0")
    assert halve.origin.entry_point == "good" and halve.origin.module == "good_plugins"
    assert halve.describe() == "recalibrator 'halve' (good-plugins 1.0)"
    from selbench import __version__

    temp = reg.get("recalibrator", "temperature")
    assert temp.describe() == f"recalibrator 'temperature' (selbench {__version__})"
    # pluggy's distribution records are kept as its own loader keeps them
    pm = reg.pm
    # the built-ins come through selbench's own entry point, as a third party's would
    assert [d.project_name for p, d in pm.list_plugin_distinfo()] == ["selbench", "good-plugins"]


def test_blocked_and_already_registered_entry_points_are_not_loaded(site):
    install(site, "bad-import", "0.3", "bad_import", "bad_import", "import no_such_module_xyz\n")
    pm = SelbenchPluginManager()
    pm.set_blocked("bad_import")
    pm.set_blocked("selbench_plugins")  # the built-ins' own entry point
    assert pm.load_setuptools_entrypoints("selbench") == 0 and pm.skipped == []
    install(site, "good-plugins", "1.0", "good_plugins", "good_plugins", GOOD)
    pm = SelbenchPluginManager()
    pm.set_blocked("selbench_plugins")
    assert pm.load_setuptools_entrypoints("selbench", name="good_plugins") == 1
    assert pm.load_setuptools_entrypoints("selbench") == 0  # good one already there
    assert len(pm.skipped) == 1 and "bad-import 0.3" in pm.skipped[0]


def test_a_name_clash_between_two_distributions_stays_an_error(site):
    code = ("from selbench import Plugin, hookimpl\n"
            "from selbench_plugins.recalibrators.temperature import TemperatureScaling\n"
            "@hookimpl\ndef selbench_recalibrators():\n"
            "    return [Plugin('twin', TemperatureScaling)]\n")  # fmt: skip
    install(site, "twin-a", "1.0", "twin_a", "twin_a", code)
    install(site, "twin-b", "2.0", "twin_b", "twin_b", code)
    with pytest.raises(PluginError) as info:
        Registry(make_plugin_manager())
    msg = str(info.value)
    assert "recalibrator plugin name 'twin' is provided twice" in msg
    assert "twin-a 1.0" in msg and "twin-b 2.0" in msg


def test_a_failing_builtin_hook_stays_an_error():
    from selbench.contract import hookspecs

    pm = SelbenchPluginManager()
    pm.add_hookspecs(hookspecs)
    builtins = types.ModuleType(BUILTIN_NAME)

    def selbench_recalibrators():
        raise RuntimeError("broken built-in")

    builtins.selbench_recalibrators = hookimpl(selbench_recalibrators)
    pm.register(builtins, name=BUILTIN_NAME)
    with pytest.raises(PluginError, match=r"built-in plugins: selbench_recalibrators\(\).*broken built-in"):
        Registry(pm)


def test_built_ins_that_cannot_be_imported_stay_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "selbench_plugins", None)  # import raises ImportError
    with pytest.raises(PluginError, match=r"built-in plugins \(selbench_plugins\) cannot be imported"):
        make_plugin_manager(autoload=False)


# --------------------------------------------------------------------------- the commands
def _selbench(args: list[str], site: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != AUTOLOAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "selbench.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)  # fmt: skip


def test_commands_keep_working_with_every_broken_plugin_installed(tmp_path, write_spec):
    import yaml

    site = tmp_path / "site"
    site.mkdir()
    for case in BROKEN:
        install(site, *case[:5])
    install(site, "good-plugins", "1.0", "good_plugins", "good_plugins", GOOD)
    warnings = [expected_warning(*c[:4], c[5]) for c in BROKEN]

    listed = _selbench(["plugins", "recalibrator"], site, tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "halve" in listed.stdout and "temperature" in listed.stdout
    for w in warnings:
        assert w in listed.stderr, (w, listed.stderr)
    assert "Traceback" not in listed.stderr

    valid = _selbench(["validate", str(REPO / "specs" / "theory.yaml")], site, tmp_path)
    assert valid.returncode == 0, valid.stderr
    assert all(w in valid.stderr for w in warnings)

    methods = [{"label": "Zeta", "scheme": {"name": "recalibration"},
                "recalibrator": {"name": "zeta"}}]  # fmt: skip
    spec = write_spec(tiny_spec(methods=methods))
    used = _selbench(["validate", str(spec)], site, tmp_path)
    assert used.returncode == 2, used.stderr
    assert "unknown recalibrator 'zeta'" in used.stderr
    assert all(w in used.stderr for w in warnings)
    assert "Traceback" not in used.stderr
    assert yaml.safe_load(spec.read_text())["experiments"][0]["methods"] == methods
