"""Spec validation: every mistake is one line naming the YAML path; CLI exit code 2."""

import re
from pathlib import Path

import pytest
from conftest import REPO, tiny_spec
from selbench.cli import main
from selbench.spec import SpecError, apply_overrides, load_spec
from selbench.spec.model import MethodSpec


def _errors(spec_or_path):
    with pytest.raises(SpecError) as info:
        load_spec(spec_or_path)
    return info.value.errors


@pytest.mark.parametrize("path", sorted((REPO / "specs").glob("*.yaml")), ids=lambda p: p.name)
def test_committed_specs_validate(path):
    try:
        resolved = load_spec(path)
    except SpecError as exc:  # paper.yaml without its data and checkpoints: only those
        assert path.name == "paper.yaml", exc
        assert all(re.search(r"\.params\.\w+: no such (file|folder): ", e) for e in exc.errors), exc
        return
    assert resolved.spec.experiments
    assert len(resolved.hash()) == 64


def test_unknown_plugin_names_the_path_and_suggests():
    spec = tiny_spec()
    spec["experiments"][0]["methods"][1]["recalibrator"]["name"] = "temprature"
    assert _errors(spec) == [
        "experiments[0].methods[1].recalibrator.name: unknown recalibrator 'temprature'; "
        "did you mean 'temperature' or 'ensemble-temperature'?"
    ]


def test_wrong_parameter_type_is_checked_against_the_plugins_own_model():
    spec = tiny_spec()
    spec["experiments"][0]["methods"].append(
        {"label": "joint", "scheme": {"name": "joint", "params": {"lr": "fast"}},
         "selector": {"name": "mlp"}, "loss": {"name": "s-tlbce"}, "coverage": {"name": "quadratic"}}
    )
    assert _errors(spec) == [
        "experiments[0].methods[3].scheme.params.lr: Input should be a valid number, "
        "unable to parse string as a number"
    ]


def test_unknown_parameter_of_a_plugin():
    spec = tiny_spec()
    spec["experiments"][0]["dataset"]["params"]["val_sise"] = 10
    assert _errors(spec) == [
        "experiments[0].dataset.params.val_sise: unknown key 'val_sise'; did you mean "
        "'val_size'? valid keys: dim, theta_norm, theta_direction, sigma, alpha, r1, r2, mix, "
        "train_size, val_size, test_size, seed"]


def test_missing_and_extra_fields():
    spec = tiny_spec()
    del spec["experiments"][0]["fit_split"]
    spec["experiments"][0]["methods"][0]["colour"] = "red"
    assert _errors(spec) == [
        "experiments[0].fit_split: Field required",
        "experiments[0].methods[0].colour: unknown key 'colour'; valid keys: "
        + ", ".join(MethodSpec.model_fields),
    ]


def test_structural_rules():
    assert _errors(tiny_spec(betas=[0.9, 0.5])) == [
        "experiments[0].betas: Value error, coverage levels must be strictly increasing"
    ]
    spec = tiny_spec()
    spec["experiments"][0]["methods"][1]["label"] = "None"
    assert _errors(spec) == ["experiments[0]: Value error, method label 'None' is used twice"]


def test_coverage_loss_in_the_loss_slot_is_rejected():
    spec = tiny_spec()
    spec["experiments"][0]["methods"].append(
        {"label": "x", "scheme": {"name": "sequential"}, "selector": {"name": "mlp"},
         "loss": {"name": "quadratic"}, "coverage": {"name": "quadratic"}}
    )
    assert _errors(spec) == [
        "experiments[0].methods[3].loss.name: 'quadratic' is a coverage loss; "
        "`loss` expects a SelectionLoss"
    ]


def test_broken_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("spec_version: 1\nname: x\nexperiments: [\n  {name: a\n")
    errs = _errors(path)
    assert len(errs) == 1 and errs[0].startswith(f"{path}, line ")


def test_overrides_by_index_and_by_name():
    spec = tiny_spec()
    out = apply_overrides(spec, ["seeds=[3, 4]", "experiments.mixture.n_fit=50",
                                 "experiments[0].methods.Confidence.recalibrator.params={}"])
    assert out["seeds"] == [3, 4]
    assert out["experiments"][0]["n_fit"] == 50
    assert out["experiments"][0]["methods"][2]["recalibrator"] == {"name": "temperature", "params": {}}
    assert spec["seeds"] == [0, 1]  # the input is not modified
    with pytest.raises(SpecError, match=r"no element 'nope' at experiments"):
        apply_overrides(spec, ["experiments.nope.n_fit=1"])


def test_override_of_an_aliased_list_changes_only_its_own_path(tmp_path):
    """``methods: *methods`` (a YAML alias, as specs/beyond.yaml uses) loads as one list
    shared by two experiments; ``--set experiments[0].methods...`` changes the first only."""
    text = """
spec_version: 1
name: alias
seeds: [0]
experiments:
  - name: one
    dataset: {name: theory-mixture}
    backbone: {name: theory-linear}
    fit_split: val
    eval_split: test
    methods: &methods
      - label: Temp
        scheme: {name: recalibration}
        recalibrator: {name: temperature}
  - name: two
    dataset: {name: theory-mixture}
    backbone: {name: theory-linear}
    fit_split: val
    eval_split: test
    methods: *methods
"""
    path = tmp_path / "alias.yaml"
    path.write_text(text)
    resolved = load_spec(path, overrides=["experiments[0].methods[0].label=Changed"])
    labels = [[m.label for m in e.methods] for e in resolved.spec.experiments]
    assert labels == [["Changed"], ["Temp"]]


def test_hash_changes_with_any_parameter_and_fills_defaults():
    a = load_spec(tiny_spec())
    b = load_spec(tiny_spec(n_fit=299))
    assert a.hash() != b.hash()
    canon = a.canonical()
    assert canon["experiments"][0]["dataset"]["params"]["sigma"] == 2.0  # default filled in


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda s: s["experiments"][0]["methods"][0]["scheme"].update(name="jiont"),
         "experiments[0].methods[0].scheme.name: unknown scheme 'jiont'; did you mean 'joint'?"),
        (lambda s: s.pop("spec_version"), "spec_version: Field required"),
        (lambda s: s.update(seeds="zero"), "seeds: Input should be a valid list"),
    ],
)
def test_cli_validate_exit_code_2_and_short_message(write_spec, capsys, mutate, expected):
    spec = tiny_spec()
    mutate(spec)
    path = write_spec(spec)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert "Traceback" not in err and len(err.splitlines()) <= 3


def test_cli_validate_ok(write_spec, capsys):
    assert main(["validate", str(write_spec(tiny_spec()))]) == 0
    assert "valid (spec 'tiny', 1 experiment(s), 6 cells" in capsys.readouterr().out


def test_cli_broken_yaml_exit_2(tmp_path, capsys):
    path = Path(tmp_path) / "b.yaml"
    path.write_text("a: [1, 2\n")
    assert main(["run", str(path)]) == 2
    assert f"{path}, line 2, column 1: not valid YAML" in capsys.readouterr().err
