"""The plugin contract of selbench.contract.api: one module of types, parameters declared once by the
signature, the registry's type check, scikit-learn's clone/pickle on every built-in, and
built-in kinds that never import each other's modules."""

from __future__ import annotations

import ast
import pickle
import sys
import types
from pathlib import Path
from typing import Annotated

import numpy as np
import pytest
import torch
from conftest import REPO, install_distribution, tiny_spec
from pydantic import Field, ValidationError
from selbench import FitContext, ModelOutputs, Plugin, hookimpl
from selbench.contract import hookspecs
from selbench.contract.api import (
    KIND_BASES,
    KINDS,
    DifferentiableRecalibrator,
    Params,
    PredictingModule,
    Recalibrator,
    Selector,
    StackableModule,
    TrainableSelector,
    params_model,
)
from selbench.contract.inputs import InputSpec, declared_inputs
from selbench.contract.registry import (
    AUTOLOAD_ENV,
    BUILTIN_NAME,
    PluginError,
    Registered,
    Registry,
    SelbenchPluginManager,
    get_registry,
    make_plugin_manager,
)
from selbench.spec import SpecError, load_spec
from sklearn.base import clone

PLUGINS_ROOT = REPO / "plugins" / "selbench_plugins"
KIND_PACKAGES = ("datasets", "backbones", "selectors", "recalibrators", "losses", "schemes")

#: params a built-in needs to be built at all (construction reads no file)
REQUIRED = {("dataset", "precomputed"): {"path": "outputs.npz"},
            ("dataset", "calarena"): {"folder": "calibration_benchmarks",
                                      "benchmark": "cv-multiclass", "dataset": "c10",
                                      "model": "densenet40"},
            ("dataset", "fd-shifts"): {"folder": "test_results"},
            ("dataset", "labelled-sentences"): {"folder": "sentiment"},
            ("backbone", "wilds-densenet121"): {"checkpoint": "best_model.pth"},
            ("backbone", "wilds-resnet50"): {"checkpoint": "best_model.pth"}}

BUILTINS = [(kind, name) for kind in KINDS for name in get_registry().names(kind)
            if get_registry().get(kind, name).provider == BUILTIN_NAME]


def synthetic(n=200, d=6, k=3, seed=0) -> ModelOutputs:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=(d, k))
    labels = (x @ w + rng.normal(size=(n, k))).argmax(1)
    return ModelOutputs(features=x, logits=(2 * x @ w).astype(np.float32), labels=labels)


def build(kind: str, name: str, params: dict | None = None):
    return get_registry().get(kind, name).build({**REQUIRED.get((kind, name), {}),
                                                 **(params or {})})


# --------------------------------------------------------------------------- imports
def _imported(path: Path, package: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in a plugin file (of ``package``, by default
    the one its place under ``plugins/`` says)."""
    if package is None:
        package = ".".join(path.relative_to(REPO / "plugins").with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            found.append((node.lineno, mod))
            found += [(node.lineno, f"{mod}.{a.name}") for a in node.names if a.name != "*"]
    return found


def test_no_kind_imports_another_kinds_modules():
    """Each kind of the built-ins is self-contained: what two kinds share lives in selbench
    (selbench.training.torchutils, selbench.contract.vision, selbench.contract.checks), never in a kind's module."""
    offending = []
    for kind in KIND_PACKAGES:
        for path in sorted((PLUGINS_ROOT / kind).rglob("*.py")):
            for line, mod in _imported(path):
                parts = mod.split(".")
                if parts[0] != "selbench_plugins" or len(parts) < 2:
                    continue
                if parts[1] != kind:
                    offending.append(f"{path.relative_to(REPO)}:{line} imports {mod}")
    assert offending == []


def test_the_scan_sees_relative_and_absolute_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from ..recalibrators import _common\nimport selbench_plugins.datasets\n"
                     "from . import baselines\n")
    mods = [m for _, m in _imported(probe, "selbench_plugins.selectors")]
    assert "selbench_plugins.recalibrators._common" in mods
    assert "selbench_plugins.datasets" in mods
    assert "selbench_plugins.selectors.baselines" in mods


# --------------------------------------------------------------------------- clone / pickle
@pytest.mark.parametrize("kind,name", BUILTINS, ids=[f"{k}-{n}" for k, n in BUILTINS])
def test_every_builtin_clones_and_pickles(kind, name):
    obj = build(kind, name)
    assert isinstance(obj, KIND_BASES[kind])
    params = obj.get_params()
    assert set(params) == set(get_registry().get(kind, name).plugin.params.model_fields)
    twin = clone(obj)
    assert type(twin) is type(obj) and twin is not obj
    assert twin.get_params() == params
    back = pickle.loads(pickle.dumps(obj))
    assert type(back) is type(obj) and back.get_params() == params


def test_set_params_and_clone_with_changed_parameters():
    sel = build("selector", "mlp", {"hidden": [8], "input": "logits"})
    assert sel.get_params() == {"hidden": [8], "input": "logits"}
    assert sel.set_params(hidden=[4, 4]) is sel and sel.hidden == [4, 4]
    assert clone(sel).get_params() == {"hidden": [4, 4], "input": "logits"}
    assert repr(sel) == "MLPSelector(hidden=[4, 4], input='logits')"
    with pytest.raises(ValueError, match="no parameter 'width'; its parameters are hidden"):
        sel.set_params(width=3)
    # a parameter named like a method of its kind is stored under another attribute
    ds = build("dataset", "precomputed", {"splits": {"val": ["a"]}})
    assert ds.get_params()["splits"] == {"val": ["a"]} and ds.splits() == ["val"]
    assert clone(ds).set_params(splits={"x": ["b"]}).splits() == ["x"]


def test_fitted_plugins_pickle_with_their_torch_state_and_clone_unfitted():
    out, ctx = synthetic(), FitContext(seed=3, beta=0.7)
    temp = build("recalibrator", "temperature").fit(out, ctx)
    sel = build("selector", "mlp", {"hidden": [8]})
    build("scheme", "joint", {"epochs": 2, "batch_size": 50}).fit(
        out, selector=sel, recalibrator=temp, loss=build("loss", "s-tlbce"),
        coverage=build("loss", "quadratic"), context=ctx)
    conf = temp.confidence(out)
    for obj, value in ((temp, conf), (sel, sel.score(out, conf))):
        back = pickle.loads(pickle.dumps(obj))
        got = back.confidence(out) if obj is temp else back.score(out, conf)
        np.testing.assert_array_equal(got, value)
        twin = clone(obj)
        assert not hasattr(twin, "module_") and twin.get_params() == obj.get_params()
    mlp = build("recalibrator", "mlp", {"hidden": [4], "epochs": 2}).fit(out, ctx)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(mlp)).confidence(out),
                                  mlp.confidence(out))


# --------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("kind,name", BUILTINS, ids=[f"{k}-{n}" for k, n in BUILTINS])
def test_builtin_params_are_their_signature(kind, name):
    plugin = get_registry().get(kind, name).plugin
    fields = plugin.params.model_fields
    assert list(fields) == [p for p in _signature(plugin.factory)]
    for field, info in fields.items():
        assert info.description, f"{kind} {name!r}: parameter {field!r} has no description"


def _signature(factory) -> list[str]:
    import inspect

    return [p.name for p in inspect.signature(factory).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def test_declared_inputs_survive_the_derivation():
    reg = get_registry()

    def inputs(kind, name):
        return declared_inputs(reg.get(kind, name).plugin.params)

    assert inputs("dataset", "precomputed") == {"path": InputSpec("file")}
    assert inputs("backbone", "resnet34") == {"weights_file": InputSpec("file")}
    assert set(inputs("backbone", "clip")) == {"model_dir", "pretrained_file", "cache_dir"}
    assert inputs("dataset", "camelyon17") == {
        "root_dir": InputSpec("dir", ("metadata.csv", "RELEASE_v*.txt"), must_exist=False)}
    assert inputs("backbone", "wilds-resnet50") == {"checkpoint": InputSpec("file")}
    assert inputs("dataset", "digits") == {}


class _Shrink(Recalibrator):
    """Shrink towards 1/K."""

    def __init__(self, factor: Annotated[float, Field(gt=0, le=1, description="kept")] = 0.9,
                 unannotated=3, *, mode: str = "a"):
        self.factor = factor
        self.unannotated = unannotated
        self.mode = mode

    def fit(self, outputs, context):
        return self

    def confidence(self, outputs):
        return outputs.confidence()


def test_the_signature_is_the_schema():
    model = Plugin("shrink", _Shrink).params
    assert model is params_model(_Shrink)  # derived once per factory
    assert issubclass(model, Params)
    info = model.model_fields
    assert list(info) == ["factor", "unannotated", "mode"]
    assert (info["factor"].default, info["factor"].description) == (0.9, "kept")
    assert model().model_dump() == {"factor": 0.9, "unannotated": 3, "mode": "a"}
    with pytest.raises(ValidationError, match="less than or equal to 1"):
        model(factor=2)
    with pytest.raises(ValidationError, match="Extra inputs"):
        model(facter=0.5)
    # a function factory: its own signature; none at all: no parameters
    assert list(Plugin("f", lambda lam=1.0: _Shrink()).params.model_fields) == ["lam"]
    assert Plugin("g", lambda: _Shrink()).params.model_fields == {}


def test_an_explicit_params_model_still_wins():
    class Explicit(Params):
        factor: float = 0.5

    plugin = Plugin("shrink", _Shrink, Explicit)
    assert plugin.params is Explicit
    reg = Registered("recalibrator", plugin, "test")
    assert reg.build().factor == 0.5
    with pytest.raises(ValidationError):
        reg.build({"mode": "b"})  # the explicit model does not know it


def test_cross_parameter_checks_run_when_the_spec_is_loaded():
    methods = [{"label": "T", "scheme": {"name": "recalibration"},
                "recalibrator": {"name": "temperature",
                                 "params": {"min_temperature": 5, "max_temperature": 1}}}]
    with pytest.raises(SpecError) as info:
        load_spec(tiny_spec(methods=methods))
    assert ("experiments[0].methods[0].recalibrator.params: Value error, min_temperature must "
            "be smaller than max_temperature") in info.value.errors
    with pytest.raises(SpecError, match=r"dataset\.params: Value error, r1 \+ r2 = 1.4 must"):
        load_spec(tiny_spec(dataset={"name": "theory-mixture", "params": {"r1": 0.9}}))


def test_a_loaded_spec_validates_each_component_once(monkeypatch):
    calls: list[tuple[str, str]] = []
    real = Registered.validate_params

    def counting(self, params):
        calls.append((self.kind, self.name))
        return real(self, params)

    monkeypatch.setattr(Registered, "validate_params", counting)
    methods = [{"label": "J", "scheme": {"name": "joint", "params": {"epochs": 2}},
                "selector": {"name": "mlp", "params": {"hidden": [8]}},
                "recalibrator": {"name": "temperature"}, "loss": {"name": "s-tlbce"},
                "coverage": {"name": "quadratic"}},
               {"label": "T", "scheme": {"name": "recalibration"},
                "recalibrator": {"name": "temperature"}}]
    resolved = load_spec(tiny_spec(methods=methods))
    exp = resolved.spec.experiments[0]
    for _ in range(3):  # building, hashing and listing inputs validate nothing again
        resolved.build("dataset", exp.dataset)
        for m in exp.methods:
            for kind, field in (("scheme", "scheme"), ("selector", "selector"),
                                ("recalibrator", "recalibrator"), ("loss", "loss"),
                                ("loss", "coverage")):
                comp = getattr(m, field)
                if comp is not None:
                    resolved.build(kind, comp)
                    resolved.inputs(kind, comp)
        resolved.hash()
    # one validation per distinct component (temperature is used by both methods)
    assert sorted(calls) == sorted(set(calls)) and len(calls) == 9


def test_built_plugins_receive_the_validated_values():
    reg = get_registry()
    sel = reg.get("selector", "mlp").build({"hidden": ["16"]})  # lax: "16" -> 16
    assert sel.hidden == [16]
    ds = reg.get("dataset", "cifar100-c").build({"severities": [5, 1]})
    assert ds.severities == [1, 5]  # the validator's normalised value


# --------------------------------------------------------------------------- registry
def _module(name: str, **hooks) -> types.ModuleType:
    mod = types.ModuleType(name)
    for hook, plugins in hooks.items():
        def impl(plugins=plugins):
            return plugins
        impl.__name__ = hook
        setattr(mod, hook, hookimpl(impl))
    return mod


class _NotASelector:
    """Scores nothing."""

    def fit(self, outputs, confidence, context):
        return self

    def score(self, outputs, confidence):
        return confidence


def test_a_factory_of_the_wrong_type_is_skipped_naming_plugin_kind_and_module(capsys):
    pm = make_plugin_manager(autoload=False)
    pm.register(_module("acme", selbench_selectors=[Plugin("duck", _NotASelector)],
                        selbench_recalibrators=[Plugin("wrong", _NotASelector),
                                                Plugin("shrink", _Shrink)]), name="acme")
    reg = Registry(pm)
    err = capsys.readouterr().err
    for kind, name, base in (("selector", "duck", "selbench.Selector"),
                             ("recalibrator", "wrong", "selbench.Recalibrator")):
        want = (f"selbench: warning: skipped {kind} plugin {name!r} of plugin module 'acme': "
                f"its factory {__name__}._NotASelector is not a subclass of {base}")
        assert want in err
        assert name not in reg.names(kind)
    assert "shrink" in reg.names("recalibrator")  # the hook's other plugins stay
    assert len(reg.skipped) == 2


def test_a_distribution_with_a_wrong_factory_is_named(tmp_path, monkeypatch, capsys):
    root = install_distribution(tmp_path, "acme-selbench", "0.4", {"acme_hooks": '''
        from selbench import Plugin, hookimpl

        class Loss:
            def __call__(self, g, beta):
                return g.mean()

        @hookimpl
        def selbench_losses():
            return [Plugin("half-loss", Loss)]
    '''})
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    try:
        reg = Registry(make_plugin_manager())
    finally:
        sys.modules.pop("acme_hooks", None)
    assert "half-loss" not in reg.names("loss")
    assert ("skipped loss plugin 'half-loss' of plugin module 'acme_hooks' of distribution "
            "'acme-selbench 0.4' (entry point 'acme_hooks' in group 'selbench'): its factory "
            "acme_hooks.Loss is not a subclass of selbench.SelectionLoss or "
            "selbench.CoverageLoss") in capsys.readouterr().err


def test_a_builtin_of_the_wrong_type_is_an_error():
    pm = SelbenchPluginManager()
    pm.add_hookspecs(hookspecs)
    pm.register(_module("selbench_plugins", selbench_schemes=[Plugin("odd", _NotASelector)]),
                name=BUILTIN_NAME)
    with pytest.raises(PluginError, match="built-in plugins: scheme plugin 'odd' .* is not a "
                                          "subclass of selbench.Scheme"):
        Registry(pm)


def test_what_a_factory_function_builds_is_checked_when_built():
    pm = make_plugin_manager(autoload=False)
    pm.register(_module("acme", selbench_recalibrators=[
        Plugin("fn-ok", lambda factor=0.5: _Shrink(factor)),
        Plugin("fn-bad", lambda: _NotASelector())]), name="acme")
    reg = Registry(pm)
    assert reg.get("recalibrator", "fn-ok").build({"factor": 0.25}).factor == 0.25
    with pytest.raises(TypeError, match=r"recalibrator 'fn-bad' \(acme\): its factory returned "
                                        r".*_NotASelector, which is not a selbench.Recalibrator"):
        reg.get("recalibrator", "fn-bad").build()


# --------------------------------------------------------------------------- typed protocols
def test_capabilities_follow_the_types():
    reg = get_registry()
    for name in reg.names("selector"):
        f = reg.get("selector", name).plugin.factory
        assert f.trainable == issubclass(f, TrainableSelector)
    for name in reg.names("recalibrator"):
        f = reg.get("recalibrator", name).plugin.factory
        assert f.differentiable == issubclass(f, DifferentiableRecalibrator)
    assert {n for n in reg.names("selector")
            if issubclass(reg.get("selector", n).plugin.factory, TrainableSelector)} == {"mlp", "meta-features"}
    assert {n for n in reg.names("recalibrator")
            if issubclass(reg.get("recalibrator", n).plugin.factory,
                          DifferentiableRecalibrator)} == {
        "none", "temperature", "platt", "mlp", "beta", "ensemble-temperature",
        "vector-scaling", "matrix-scaling", "dirichlet", "sms", "svs"}


def test_a_capability_that_contradicts_the_type_is_refused():
    with pytest.raises(TypeError, match="subclassing selbench.TrainableSelector"):
        class Claims(Selector):
            trainable = True

            def fit(self, outputs, confidence, context):
                return self

            def score(self, outputs, confidence):
                return confidence
    with pytest.raises(TypeError, match="subclassing selbench.DifferentiableRecalibrator"):
        class AlsoClaims(Recalibrator):
            differentiable = True


def test_builtin_modules_implement_the_declared_protocols():
    out, ctx = synthetic(k=2), FitContext(seed=0)
    for name in ("temperature", "platt", "mlp"):
        params = {"epochs": 1, "hidden": [4]} if name == "mlp" else {}
        rec = build("recalibrator", name, params).fit(out, ctx)
        module = rec.module(out, ctx)
        assert isinstance(module, StackableModule)
        conf, _ = module(torch.tensor(out.logits), torch.tensor(out.features))
        assert conf.shape == (len(out),)
    platt = build("recalibrator", "platt").fit(out, ctx).module(out, ctx)
    assert isinstance(platt, PredictingModule) and platt.changes_prediction
    sel = build("selector", "mlp", {"hidden": [4]})
    assert isinstance(sel.init_module(out, ctx), StackableModule)


def test_recalibrators_fit_many_defaults_to_fit_one_by_one():
    seen = []

    class Recorded(_Shrink):
        def fit(self, outputs, context):
            seen.append(context.seed)
            return self

    Recorded.fit_many([Recorded(), Recorded()], [synthetic()] * 2,
                      [FitContext(seed=1), FitContext(seed=2)])
    assert seen == [1, 2]
