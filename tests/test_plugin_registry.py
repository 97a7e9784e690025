"""Plugin discovery: built-ins, entry points, duplicates, typos, the autoload switch."""

import sys
import types

import pytest
from conftest import install_distribution
from selbench import Plugin, hookimpl
from selbench.contract.api import KINDS
from selbench.contract.registry import (
    AUTOLOAD_ENV,
    PluginError,
    Registry,
    get_registry,
    make_plugin_manager,
)


def test_builtins_provide_every_kind():
    reg = get_registry()
    for kind in KINDS:
        assert reg.names(kind), f"no built-in {kind} plugin"
    assert reg.get("recalibrator", "temperature").provider == "selbench_plugins"
    assert {"s-tlbce", "s-mce", "s-mmce", "quadratic"} <= set(reg.names("loss"))


def test_unknown_name_suggests_close_matches():
    reg = get_registry()
    with pytest.raises(PluginError, match=r"unknown recalibrator 'temprature'; did you mean 'temperature'( or '[a-z-]+')*\?"):
        reg.get("recalibrator", "temprature")
    with pytest.raises(PluginError, match=r"unknown plugin kind 'selectors'; did you mean 'selector'"):
        reg.get("selectors", "mlp")


def _module_providing(name, **hooks):
    mod = types.ModuleType(name)
    for hook, plugins in hooks.items():
        def impl(plugins=plugins):
            return plugins
        impl.__name__ = hook
        setattr(mod, hook, hookimpl(impl))
    return mod


def test_duplicate_name_is_an_error_naming_both_providers():
    from selbench_plugins.recalibrators.temperature import TemperatureScaling

    pm = make_plugin_manager(autoload=False)
    other = _module_providing(
        "acme_calibration",
        selbench_recalibrators=[Plugin("temperature", TemperatureScaling)],
    )
    pm.register(other, name="acme_calibration")
    with pytest.raises(PluginError) as info:
        Registry(pm)
    msg = str(info.value)
    assert "recalibrator plugin name 'temperature' is provided twice" in msg
    assert "'selbench_plugins'" in msg and "'acme_calibration'" in msg


def test_hook_returning_something_else_than_plugins_is_skipped_with_a_warning(capsys):
    pm = make_plugin_manager(autoload=False)
    pm.register(_module_providing("broken", selbench_selectors=["not a plugin"]), name="broken")
    reg = Registry(pm)
    want = ("selbench: warning: skipped selbench_selectors() of plugin module 'broken': it must "
            "return selbench.Plugin objects, got str")  # fmt: skip
    assert want in capsys.readouterr().err
    assert reg.skipped == [want.split("skipped ", 1)[1]]
    assert "confidence" in reg.names("selector")  # the built-ins are all there


@pytest.fixture
def installed_distribution(tmp_path, monkeypatch):
    """A real installed distribution (dist-info + module on sys.path) with a selbench entry point."""
    install_distribution(tmp_path, "ext-selbench-demo", "1.2.3", {"ext_selbench_demo": '''
        import numpy as np
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
    '''}, {"demo": "ext_selbench_demo"})
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("ext_selbench_demo", None)


def test_entry_point_plugins_are_discovered_with_their_version(installed_distribution, monkeypatch):
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    reg = Registry(make_plugin_manager())
    entry = reg.get("recalibrator", "halve")
    assert entry.provider == "demo"
    assert entry.plugin.version == "1.2.3"
    assert entry.describe() == "recalibrator 'halve' (ext-selbench-demo 1.2.3)"
    assert entry.plugin.describe() == "Halve the distance of the confidence to 1/K."


def test_autoload_can_be_switched_off(installed_distribution, monkeypatch):
    monkeypatch.setenv(AUTOLOAD_ENV, "1")
    reg = Registry(make_plugin_manager())
    assert "halve" not in reg.names("recalibrator")
    assert "temperature" in reg.names("recalibrator")  # built-ins stay
