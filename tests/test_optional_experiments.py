"""Experiments marked ``optional: true`` (specs/beyond.yaml's CIFAR-100 block, the extra block
of specs/paper.yaml): skipped with one line when an input they declare is missing, left out by
``--no-optional``, run when present; a required experiment with a missing input still fails.
Also: ``selbench plugins`` prints each method's reference."""

import copy

import numpy as np
import pytest
from conftest import tiny_spec
from selbench.cli import main
from selbench.contract.registry import get_registry
from selbench.spec import SpecError, load_spec


def _precomputed_experiment(path) -> dict:
    return {
        "name": "extra",
        "optional": True,
        "dataset": {"name": "precomputed",
                    "params": {"path": str(path), "fractions": {"val": 0.5, "test": 0.5}}},
        "backbone": {"name": "precomputed"},
        "fit_split": "val",
        "eval_split": "test",
        "methods": [{"label": "Temp. scale", "scheme": {"name": "recalibration"},
                     "recalibrator": {"name": "temperature"}}],
    }


def _spec_with(path, optional_first: bool = False) -> dict:
    spec = tiny_spec(seeds=[0])
    extra = _precomputed_experiment(path)
    spec["experiments"] = ([extra] if optional_first else []) + spec["experiments"] + (
        [] if optional_first else [extra])
    return spec


def _write_outputs(path) -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(200, 4)).astype(np.float32)
    np.savez(path, labels=rng.integers(0, 4, 200), logits=logits)


def test_missing_optional_experiment_is_skipped_and_named(tmp_path):
    spec = _spec_with(tmp_path / "absent.npz")
    resolved = load_spec(spec)
    assert [e.name for e in resolved.spec.experiments] == ["mixture"]
    ((name, why),) = resolved.skipped
    assert name == "extra"
    assert "experiments[1].dataset.params.path" in why and "absent.npz" in why
    # the same spec without the optional block: same canonical form and hash
    alone = tiny_spec(seeds=[0])
    assert resolved.hash() == load_spec(alone).hash()


def test_optional_experiment_with_its_inputs_runs(tmp_path):
    path = tmp_path / "outputs.npz"
    _write_outputs(path)
    resolved = load_spec(_spec_with(path))
    assert [e.name for e in resolved.spec.experiments] == ["mixture", "extra"]
    assert resolved.skipped == []
    left_out = load_spec(_spec_with(path), optional=False)
    assert [e.name for e in left_out.spec.experiments] == ["mixture"]
    assert left_out.skipped == [("extra", "optional, left out by --no-optional")]


def test_required_experiment_with_a_missing_input_still_fails(tmp_path):
    spec = _spec_with(tmp_path / "absent.npz")
    spec["experiments"][1]["optional"] = False
    with pytest.raises(SpecError, match=r"experiments\[1\]\.dataset\.params\.path"):
        load_spec(spec)


def test_every_experiment_skipped_is_an_error(tmp_path):
    spec = _spec_with(tmp_path / "absent.npz")
    only = copy.deepcopy(spec)
    only["experiments"] = [spec["experiments"][1]]
    with pytest.raises(SpecError, match="every experiment is optional and skipped"):
        load_spec(only)


def test_cli_run_and_validate_report_the_skip(write_spec, tmp_path, capsys):
    path = write_spec(_spec_with(tmp_path / "absent.npz", optional_first=True))
    assert main(["validate", str(path)]) == 0
    err = capsys.readouterr().err
    assert "experiment 'extra' optional, skipped: experiments[0].dataset.params.path" in err
    out = tmp_path / "res"
    assert main(["run", str(path), "--out", str(out), "--no-progress", "--no-plots", "-q"]) == 0
    err = capsys.readouterr().err
    assert "experiment 'extra' optional, skipped" in err
    assert "3 cell(s) computed" in err
    assert "extra" not in (out / "leaderboard.md").read_text()
    assert main(["validate", str(path), "--no-optional"]) == 0
    assert "left out by --no-optional" in capsys.readouterr().err


def test_plugins_prints_each_methods_reference(capsys):
    """Every selector and recalibrator that implements a published method names it."""
    registry = get_registry()
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    for kind in ("selector", "recalibrator"):
        for name in registry.names(kind):
            if name in ("none", "oracle-domain"):  # not methods of a paper
                continue
            ref = registry.get(kind, name).plugin.reference()
            assert ref, f"{kind} {name!r} declares no reference"
            assert f"      reference: {ref}" in out
