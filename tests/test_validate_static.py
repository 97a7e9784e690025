"""`selbench validate` catches everything static: a spec that `run` would reject for a reason
known before any computation is an exit-2 error of `validate` and of `run`, one line per
problem naming the YAML path, no traceback, nothing computed.

Plugin compatibility comes from the capabilities plugins declare (``selbench.contract.api``), never
from their names; plugins that declare nothing validate as before.
"""

from __future__ import annotations

import copy
import re

import pytest
import yaml
from conftest import REPO, tiny_spec
from selbench import Plugin, hookimpl
from selbench.cli import main
from selbench.contract.api import Backbone, Dataset, Recalibrator, Scheme, Selector
from selbench.contract.registry import AUTOLOAD_ENV, Registry, make_plugin_manager
from selbench.spec import NAME_MAX, SEED_MAX, SpecError, apply_overrides, load_spec


@pytest.fixture(autouse=True)
def _builtins_only(monkeypatch):
    """Only the built-in plugins, so that the plugin lists in the messages are exact."""
    monkeypatch.setenv(AUTOLOAD_ENV, "1")


TRAINED = {
    "label": "Trained",
    "scheme": {"name": "joint", "params": {"epochs": 1}},
    "selector": {"name": "mlp", "params": {"hidden": [8]}},
    "recalibrator": {"name": "temperature"},
    "loss": {"name": "s-tlbce"},
    "coverage": {"name": "quadratic"},
}


def method(**changes) -> dict:
    """The trained method above with fields replaced (a value of None removes the field)."""
    m = copy.deepcopy(TRAINED)
    for key, value in changes.items():
        if value is None:
            m.pop(key)
        else:
            m[key] = value
    return m


def scheme(name: str) -> dict:
    return {"name": name, "params": {"epochs": 1}}


def quickstart(**experiment) -> dict:
    spec = yaml.safe_load((REPO / "specs" / "quickstart.yaml").read_text())
    spec["experiments"][0].update(experiment)
    return spec


M0 = "experiments[0].methods[0]"

# (id, spec dict or YAML bytes, the exact error lines)
CASES = [
    ("joint-without-loss", tiny_spec(methods=[method(loss=None)]),
     [f"{M0}.loss: scheme 'joint' needs a selective loss (loss: {{name: s-mce|s-mmce|s-tlbce}})"]),
    ("sequential-without-coverage",
     tiny_spec(methods=[method(scheme=scheme("sequential"), coverage=None)]),
     [f"{M0}.coverage: scheme 'sequential' needs a coverage loss "
      "(coverage: {name: log-coverage|quadratic})"]),
    ("selection-with-a-non-trainable-selector",
     tiny_spec(methods=[method(scheme=scheme("selection"), recalibrator={"name": "none"},
                               selector={"name": "confidence"})]),
     [f"{M0}.selector.name: scheme 'selection' trains the selector through its loss; "
      "selector 'confidence' is not trainable (trainable selectors: meta-features, mlp)"]),
    ("joint-with-the-default-selector", tiny_spec(methods=[method(selector=None)]),
     [f"{M0}.selector.name: scheme 'joint' trains the selector through its loss; "
      "selector 'none' is not trainable (trainable selectors: meta-features, mlp)"]),
    ("recalibration-with-a-trainable-selector",
     tiny_spec(methods=[{"label": "R", "scheme": {"name": "recalibration"},
                         "selector": {"name": "mlp"}}]),
     [f"{M0}.selector.name: scheme 'recalibration' only fits non-trainable selectors; "
      "selector 'mlp' is trained through a loss "
      "(schemes that train it: joint, selection, sequential)"]),
    ("joint-with-a-non-differentiable-recalibrator",
     tiny_spec(methods=[method(recalibrator={"name": "histogram-binning"})]),
     [f"{M0}.recalibrator.name: scheme 'joint' trains the recalibrator with the selector and "
      "needs a differentiable one; recalibrator 'histogram-binning' is not "
      "(differentiable recalibrators: beta, dirichlet, "
      "ensemble-temperature, matrix-scaling, mlp, none, platt, sms, svs, temperature, vector-scaling)"]),
    ("s-mce-after-a-binning-recalibrator",
     tiny_spec(methods=[method(scheme=scheme("sequential"), loss={"name": "s-mce"},
                               recalibrator={"name": "histogram-binning"})]),
     [f"{M0}.loss.name: loss 's-mce' needs the recalibrator's log-probabilities, which "
      "recalibrator 'histogram-binning' does not provide (losses that do not need them: "
      "s-mmce, s-tlbce; recalibrators that provide them: beta, dirichlet, "
      "ensemble-temperature, matrix-scaling, none, platt, sms, svs, temperature, vector-scaling)"]),
    ("s-mce-with-the-mlp-recalibrator",
     tiny_spec(methods=[method(loss={"name": "s-mce"}, recalibrator={"name": "mlp"})]),
     [f"{M0}.loss.name: loss 's-mce' needs the recalibrator's log-probabilities, which "
      "recalibrator 'mlp' does not provide (losses that do not need them: s-mmce, s-tlbce; "
      "recalibrators that provide them: beta, dirichlet, "
      "ensemble-temperature, matrix-scaling, none, platt, sms, svs, temperature, vector-scaling)"]),
    ("selection-with-a-recalibrator-that-needs-fitting",
     tiny_spec(methods=[method(scheme=scheme("selection"))]),
     [f"{M0}.recalibrator.name: scheme 'selection' uses the recalibrator as given, without "
      "fitting it; recalibrator 'temperature' must be fitted first "
      "(recalibrators usable unfitted: none)"]),
    ("seeds-out-of-range", tiny_spec(seeds=[0, -1, 2**64, 2**32]),
     [f"seeds[1]: seed -1 is outside 0 <= seed <= {SEED_MAX} (2**32 - 1), the range "
      "numpy's and torch's seeding accept",
      f"seeds[2]: seed {2**64} is outside 0 <= seed <= {SEED_MAX} (2**32 - 1), the range "
      "numpy's and torch's seeding accept",
      f"seeds[3]: seed {2**32} is outside 0 <= seed <= {SEED_MAX} (2**32 - 1), the range "
      "numpy's and torch's seeding accept"]),
    ("precomputed-backbone-on-digits", quickstart(backbone={"name": "precomputed"}),
     ["experiments[0].backbone.name: backbone 'precomputed' reads model-outputs inputs, but "
      "dataset 'digits' provides image-array (backbones that read image-array: digits-net)"]),
    ("digits-net-on-precomputed",
     quickstart(dataset={"name": "precomputed", "params": {"path": "outputs.npz"}}),
     ["experiments[0].backbone.name: backbone 'digits-net' reads image-array inputs, but "
      "dataset 'precomputed' provides model-outputs (backbones that read model-outputs: "
      "precomputed)"]),
    ("digits-net-on-the-theory-mixture", tiny_spec(backbone={"name": "digits-net"}),
     ["experiments[0].backbone.name: backbone 'digits-net' reads image-array inputs, but "
      "dataset 'theory-mixture' provides vectors (backbones that read vectors: "
      "theory-linear)"]),
    ("spec-name-too-long", tiny_spec(name="x" * (NAME_MAX + 1)),
     [f"name: names become folder names under results/; at most {NAME_MAX} characters, "
      f"got {NAME_MAX + 1}"]),
    ("experiment-name-too-long", tiny_spec(name="e" * 300),
     [f"experiments[0].name: names become folder names under results/; at most {NAME_MAX} "
      f"characters, got 300"]),
    ("duplicate-keys",
     b"spec_version: 1\nname: a\nseeds: [0]\nname: b\nexperiments:\n"
     b"  - name: e\n    dataset: {name: theory-mixture}\n    backbone: {name: theory-linear}\n"
     b"    fit_split: val\n    eval_split: test\n    methods:\n      - label: x\n"
     b"        scheme: {name: recalibration, name: joint}\n",
     ["name: duplicate key 'name' at line 4, column 1 (first set at line 2, column 1); YAML "
      "would silently keep only the last value",
      "experiments[0].methods[0].scheme.name: duplicate key 'name' at line 13, column 39 "
      "(first set at line 13, column 18); YAML would silently keep only the last value"]),
    ("not-utf-8", b"spec_version: 1\nname: caf\xe9\n",
     ["{path}: not UTF-8 text: byte 0xe9 at byte offset 25 (line 2, column 10); save the "
      "spec as UTF-8"]),
    ("nested-too-deep", b"spec_version: 1\nname: x\ndescription: " + b"[" * 5000 + b"]" * 5000,
     ["{path}, line 3, column 77: nested more than 64 levels deep"]),
    ("control-character", b"spec_version: 1\nname: \"a\x07\"\n",
     ["{path}, line 2, column 9: unacceptable character U+0007 (special characters are "
      "not allowed)"]),
    ("alias-bomb",
     b"a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n" + b"".join(
         f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n".encode()
         for i in range(6)),
     ["g[9][9]: more than 100000 values (YAML aliases expand to too much)"]),
    ("empty-file", b"# nothing but a comment\n",
     ["{path}: the file is empty; a spec is a YAML mapping with spec_version, name, ..."]),
    ("a-folder", None, ["{path}: is a folder, not a spec file"]),
]
for case in CASES:  # the experiment's name, not the spec's
    if case[0] == "experiment-name-too-long":
        case[1]["name"], case[1]["experiments"][0]["name"] = "tiny", "e" * 300


def _write(tmp_path, content):
    path = tmp_path / "spec.yaml"
    if content is None:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(yaml.safe_dump(content, sort_keys=False))
    (tmp_path / "outputs.npz").write_bytes(b"")  # the precomputed dataset's declared input
    return path


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("content, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_static_problem_is_exit_2_naming_the_yaml_path(tmp_path, capsys, command, content,
                                                       expected):
    path = _write(tmp_path, content)
    cache, out = tmp_path / "cache", tmp_path / "results"
    argv = [command, str(path)]
    if command == "run":
        argv += ["--out", str(out), "--cache-dir", str(cache), "--no-progress", "--no-plots"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines[0] == f"selbench: error: invalid spec {path}:"
    assert [line.strip() for line in lines[1:]] == [e.replace("{path}", str(path)) for e in expected]
    if command == "run":  # rejected before any computation: nothing cached, nothing written
        assert not cache.exists() and not out.exists()


def test_the_boundaries_are_valid():
    """The cases above are wrong only where they say: the trained method they start from,
    seeds 0 and 2**32 - 1 and a name of NAME_MAX characters are valid."""
    load_spec(tiny_spec(name="x" * NAME_MAX, methods=[method()], seeds=[0, SEED_MAX]))


@pytest.mark.parametrize("path", sorted((REPO / "specs").glob("*.yaml")), ids=lambda p: p.name)
def test_committed_specs_validate(path, capsys):
    """quickstart and theory validate; paper.yaml validates, or (its data and checkpoints
    being absent here) fails with exactly the missing-input errors."""
    code = main(["validate", str(path)])
    captured = capsys.readouterr()
    if code == 0:
        assert ": valid (spec " in captured.out
        return
    assert path.name == "paper.yaml", captured.err
    assert code == 2
    lines = captured.err.splitlines()
    assert lines[0] == f"selbench: error: invalid spec {path}:"
    missing = re.compile(r"^experiments\[\d+\]\.[\w.\[\]]+\.params\.\w+: "
                         r"no such (file|folder): /\S+$")
    assert lines[1:] and all(missing.match(line.strip()) for line in lines[1:]), captured.err


# --------------------------------------------------------------------------- units
def _errors(spec, **kw):
    with pytest.raises(SpecError) as info:
        load_spec(spec, **kw)
    return info.value.errors


def test_method_labels_need_no_bound_their_folders_are_short_slugs():
    from selbench.execution.runner import slug

    label = "A very long method label " * 40
    resolved = load_spec(tiny_spec(methods=[{"label": label, "scheme": {"name": "recalibration"}}]))
    assert resolved.spec.experiments[0].methods[0].label == label
    assert len(slug(label)) <= 55


def test_a_boolean_is_not_a_seed():
    assert _errors(tiny_spec(seeds=[True])) == ["seeds[0]: a seed is an integer, not true or false"]


def test_unreadable_spec_file_is_one_line(tmp_path, monkeypatch):
    from pathlib import Path

    path = tmp_path / "spec.yaml"
    path.write_text("spec_version: 1\n")

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    assert _errors(path) == [f"{path}: cannot read (Permission denied)"]


def test_overrides_are_read_by_the_same_strict_yaml_reader():
    with pytest.raises(SpecError) as info:
        apply_overrides(tiny_spec(), ["experiments[0].n_fit={a: 1, a: 2}"])
    assert info.value.errors == [
        "--set experiments[0].n_fit={a: 1, a: 2}: a: duplicate key 'a' at line 1, column 8 "
        "(first set at line 1, column 2); YAML would silently keep only the last value"
    ]
    deep = "[" * 100 + "]" * 100
    with pytest.raises(SpecError, match=r"nested more than 64 levels deep"):
        apply_overrides(tiny_spec(), [f"description={deep}"])


def test_dict_specs_too_deep_or_cyclic_are_spec_errors():
    spec = tiny_spec()
    node = spec["experiments"][0]["dataset"]["params"]
    for _ in range(100):
        node["x"] = {}
        node = node["x"]
    errs = _errors(spec)
    assert len(errs) == 1 and errs[0].endswith(": nested more than 64 levels deep")
    assert errs[0].startswith("experiments[0].dataset.params.x.x.")
    spec = tiny_spec()
    spec["experiments"][0]["dataset"]["params"]["loop"] = spec["experiments"]
    assert _errors(spec) == [
        "experiments[0].dataset.params.loop: refers to itself (a reference cycle)"
    ]


# --------------------------------------------------------------------------- third parties
class _Quiet(Scheme):
    """A third-party scheme that declares nothing."""

    def fit(self, outputs, *, selector, recalibrator, loss, coverage, context):
        return self


class _Undeclared(Selector):
    def fit(self, outputs, confidence, context):
        return self

    def score(self, outputs, confidence):
        return confidence


class _Fixed(Recalibrator):
    def fit(self, outputs, context):
        return self

    def confidence(self, outputs):
        return outputs.confidence()


class _AnyData(Dataset):
    num_classes = 2

    def splits(self):
        return ["val", "test"]

    def split(self, name):
        raise NotImplementedError


class _AnyBackbone(Backbone):
    def extract(self, dataset, split, context):
        raise NotImplementedError


def _registry_with_third_party() -> Registry:
    import types

    mod = types.ModuleType("acme")
    hooks = {
        "selbench_schemes": [Plugin("acme", _Quiet),
                             Plugin("acme-fn", lambda: _Quiet())],
        "selbench_selectors": [Plugin("acme", _Undeclared)],
        "selbench_recalibrators": [Plugin("acme", _Fixed)],
        "selbench_datasets": [Plugin("acme", _AnyData)],
        "selbench_backbones": [Plugin("acme", _AnyBackbone)],
    }
    for hook, plugins in hooks.items():
        def impl(plugins=plugins):
            return plugins
        impl.__name__ = hook
        setattr(mod, hook, hookimpl(impl))
    pm = make_plugin_manager(autoload=False)
    pm.register(mod, name="acme")
    return Registry(pm)


def test_plugins_that_declare_nothing_validate_as_before():
    registry = _registry_with_third_party()
    methods = [
        # a third-party scheme constrains nothing: any selector, no losses
        {"label": "a", "scheme": {"name": "acme"}, "selector": {"name": "mlp"}},
        {"label": "b", "scheme": {"name": "acme"}, "selector": {"name": "confidence"},
         "recalibrator": {"name": "histogram-binning"}, "loss": {"name": "s-mce"}},
        # a factory that is not a class declares nothing either
        {"label": "c", "scheme": {"name": "acme-fn"}, "selector": {"name": "mlp"}},
        # an undeclared recalibrator may be used unfitted as far as validation knows
        method(label="d", scheme=scheme("selection"), recalibrator={"name": "acme"}),
        # an undeclared selector under a scheme that takes either kind
        {"label": "e", "scheme": {"name": "recalibration"}, "selector": {"name": "acme"}},
    ]
    load_spec(tiny_spec(methods=methods), registry=registry)
    # an undeclared dataset with any backbone, any dataset with an undeclared backbone
    load_spec(tiny_spec(dataset={"name": "acme"}, backbone={"name": "precomputed"}),
              registry=registry)
    load_spec(quickstart(backbone={"name": "acme"}), registry=registry)


def test_undeclared_plugins_keep_the_checks_that_already_failed_at_run_time():
    """Defaults that the training schemes already enforced when running (an undeclared
    selector is not trainable, an undeclared recalibrator not differentiable) are now
    reported by validation instead: earlier, not new."""
    registry = _registry_with_third_party()
    errs = _errors(tiny_spec(methods=[method(selector={"name": "acme"},
                                             recalibrator={"name": "acme"})]),
                   registry=registry)
    assert [e.split(":")[0] for e in errs] == [f"{M0}.selector.name", f"{M0}.recalibrator.name"]
