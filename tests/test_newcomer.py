"""What a new user met on the command line (issue 26, items 3, 5, 6, 7): bad input exits 2
with one line, `validate` opens the declared inputs and checks n_fit against known split
sizes, unknown keys get "did you mean", YAML errors in our words, plain progress lines off a
terminal, figures redrawn only when their inputs change, β-free metrics shown once, each
part's seeds in a combined leaderboard."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from conftest import tiny_spec
from selbench.cli import main
from selbench.contract.registry import AUTOLOAD_ENV


@pytest.fixture(autouse=True)
def _builtins_only(monkeypatch):
    monkeypatch.setenv(AUTOLOAD_ENV, "1")


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# --------------------------------------------------------------------------- exit codes
@pytest.mark.parametrize("command", ["leaderboard", "plot"])
def test_a_folder_that_is_not_results_is_bad_input(tmp_path, capsys, command):
    assert main([command, str(tmp_path / "nope")]) == 2
    err = _one_error(capsys)
    assert err == f"selbench: error: {tmp_path / 'nope'}: no such folder; give a results " \
                  "directory written by `selbench run`\n"


def test_validate_help_describes_its_arguments(capsys):
    assert main(["validate", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "YAML spec, e.g. specs/quickstart.yaml" in out
    assert "override a spec value before checking" in out
    assert "n_fit larger than its split" in out


# --------------------------------------------------------------------------- n_fit, inputs
def test_n_fit_larger_than_a_known_split_is_caught_by_validate(write_spec, capsys):
    path = write_spec(tiny_spec(n_fit=401))  # val_size is 400
    assert main(["validate", str(path)]) == 2
    assert _one_error(capsys).splitlines()[1].strip() == (
        "experiments[0].n_fit: 401 examples asked, but split 'val' of dataset "
        "'theory-mixture' has only 400; lower n_fit to at most 400, or leave it out to fit on "
        "the whole split")
    assert main(["validate", str(write_spec(tiny_spec(n_fit=400)))]) == 0


def test_unknown_split_is_caught_by_validate(write_spec, capsys):
    path = write_spec(tiny_spec(eval_split="tets"))
    assert main(["validate", str(path)]) == 2
    assert _one_error(capsys).splitlines()[1].strip() == (
        "experiments[0].eval_split: dataset 'theory-mixture' has no split 'tets'; available: "
        "train, val, test")


def test_digits_split_sizes_are_those_its_splits_have():
    from selbench.contract.registry import get_registry

    ds = get_registry().get("dataset", "digits").build(
        {"split_fractions": [0.5, 0.2, 0.3], "severities": [1, 3], "shifted_per_domain": 50})
    sizes = ds.split_sizes()
    assert sizes == {name: len(ds.split(name).labels) for name in ds.splits()}
    assert sizes["shifted"] == 50 * 6 * 2


def _precomputed_spec(n_fit=None, **params) -> dict:
    return tiny_spec(dataset={"name": "precomputed", "params": {"path": "outputs.npz", **params}},
                     backbone={"name": "precomputed"}, n_fit=n_fit)


def _outputs(tmp_path, n=100, **changes):
    rng = np.random.default_rng(0)
    arrays = {"labels": rng.integers(0, 2, n), "logits": rng.normal(size=(n, 2))}
    arrays.update(changes)
    np.savez(tmp_path / "outputs.npz", **{k: v for k, v in arrays.items() if v is not None})
    return tmp_path / "outputs.npz"


def test_precomputed_split_sizes_from_the_npz_header(tmp_path, write_spec, capsys):
    _outputs(tmp_path, n=100)  # fractions val 0.5, test 0.5: 50 rows each
    assert main(["validate", str(write_spec(_precomputed_spec(n_fit=50)))]) == 0
    capsys.readouterr()
    assert main(["validate", str(write_spec(_precomputed_spec(n_fit=51)))]) == 2
    assert "experiments[0].n_fit: 51 examples asked, but split 'val' of dataset 'precomputed' " \
           "has only 50" in _one_error(capsys)
    tags = np.array(["val"] * 30 + ["test"] * 70)
    _outputs(tmp_path, n=100, split=tags)
    assert main(["validate", str(write_spec(_precomputed_spec(n_fit=31)))]) == 2
    assert "has only 30" in _one_error(capsys)


@pytest.mark.parametrize("damage, needle", [
    ("truncated", "is a truncated or damaged .npz archive"),
    ("no-logits", "needs a 'logits' or a 'probabilities' array; the file holds 'labels', 'z'"),
    ("rows", "array 'logits' (logits) has 90 rows but 'labels' (labels) has 100"),
    ("pickled", "is stored as pickled Python objects"),
    ("keys", "keys.labels names array 'y', which is not in the file"),
])
def test_validate_opens_the_npz_as_run_would(tmp_path, write_spec, capsys, damage, needle):
    rng = np.random.default_rng(1)
    params = {}
    if damage == "truncated":
        blob = _outputs(tmp_path).read_bytes()
        (tmp_path / "outputs.npz").write_bytes(blob[: len(blob) // 2])
    elif damage == "no-logits":
        _outputs(tmp_path, logits=None, z=rng.normal(size=(100, 2)))
    elif damage == "rows":
        _outputs(tmp_path, logits=rng.normal(size=(90, 2)))
    elif damage == "pickled":
        _outputs(tmp_path, labels=np.array([1, 0] * 50, dtype=object))
    else:
        _outputs(tmp_path)
        params = {"keys": {"labels": "y"}}
    path = write_spec(_precomputed_spec(**params))
    for command in ("validate", "run"):
        argv = [command, str(path)] + (["--out", str(tmp_path / "r"), "--no-progress"]
                                       if command == "run" else [])
        assert main(argv) == 2
        lines = _one_error(capsys).splitlines()
        assert len(lines) == 2 and lines[1].strip().startswith(
            "experiments[0].dataset.params.path: precomputed: ")
        assert needle in lines[1]
    assert not (tmp_path / "r").exists()  # refused before anything was written


# --------------------------------------------------------------------------- messages
def test_unknown_keys_say_did_you_mean_and_list_the_valid_names(write_spec, capsys):
    spec = tiny_spec()
    spec["seed"] = spec.pop("seeds")
    assert main(["validate", str(write_spec(spec))]) == 2
    line = _one_error(capsys).splitlines()[1].strip()
    assert line.startswith("seed: unknown key 'seed'; did you mean 'seeds'? valid keys: "
                           "spec_version, name, description, seeds,")
    assert "Extra inputs are not permitted" not in line

    spec = tiny_spec()
    spec["experiments"][0]["methods"][2]["selector"] = {
        "name": "isolation-forest", "params": {"n_estimator": 10}}
    assert main(["validate", str(write_spec(spec))]) == 2
    assert _one_error(capsys).splitlines()[1].strip() == (
        "experiments[0].methods[2].selector.params.n_estimator: unknown key 'n_estimator'; "
        "did you mean 'n_estimators'? valid keys: n_estimators, max_samples")


def test_yaml_syntax_error_names_file_line_and_column_in_our_words(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text("spec_version: 1\nname: x\n  seeds: [0]\n")
    assert main(["validate", str(path)]) == 2
    err = _one_error(capsys)
    assert err.splitlines()[1].strip() == (
        f"{path}, line 3, column 8: not valid YAML: a ':' where a plain value was expected; "
        "put a nested mapping on its own, indented lines, or quote a value that contains ': '")
    assert "mapping values are not allowed" not in err
    path.write_text("spec_version: 1\nseeds: [0, 1\nname: x\n")
    assert main(["validate", str(path)]) == 2
    assert "not valid YAML: a '[' list is not closed by ']'" in _one_error(capsys)


# --------------------------------------------------------------------------- progress
def test_progress_off_a_terminal_is_plain_lines(write_spec, tmp_path, capsys):
    path = write_spec(tiny_spec())
    assert main(["run", str(path), "--out", str(tmp_path / "r"), "--no-plots", "-q"]) == 0
    err = capsys.readouterr().err  # captured: not a terminal
    assert "\r" not in err and "\x1b" not in err
    lines = err.splitlines()
    assert "methods: 0/6 cells" in lines
    assert any(line.startswith("methods: 6/6 cells (100%), done in ") for line in lines)
    assert sum(line.startswith("methods: ") for line in lines) <= 12


def test_progress_bar_is_tqdm_on_a_terminal_and_lines_elsewhere():
    from selbench.util.progress import PlainProgress, progress_bar

    class Tty(io.StringIO):
        def isatty(self):
            return True

    from tqdm import tqdm

    assert isinstance(progress_bar(total=3, file=Tty()), tqdm)
    out = io.StringIO()
    bar = progress_bar(total=40, desc="cells", unit="cell", file=out)
    assert isinstance(bar, PlainProgress)
    for _ in range(40):
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[:3] == ["cells: 0/40 cells", "cells: 4/40 cells (10%)", "cells: 8/40 cells (20%)"]
    assert len(lines) == 11 and lines[-1].startswith("cells: 40/40 cells (100%), done in ")
    silent = io.StringIO()
    assert list(progress_bar(range(3), disable=True, file=silent)) == [0, 1, 2]
    assert silent.getvalue() == ""


def _json(path):
    return json.loads(path.read_text())


# --------------------------------------------------------------------------- figures
def _run(path, out, *extra):
    assert main(["run", str(path), "--out", str(out), "--no-progress", "-q", *extra]) == 0


def test_figures_are_redrawn_only_when_their_inputs_change(write_spec, tmp_path, monkeypatch):
    from selbench.reporting import plots

    drawn: list[str] = []
    real = plots._draw

    def counting(job, formats):
        drawn.append(job.stem.relative_to(out / "plots").as_posix())
        return real(job, formats)

    monkeypatch.setattr(plots, "_draw", counting)
    monkeypatch.setenv(plots.WORKERS_ENV, "1")
    out = tmp_path / "r"
    path = write_spec(tiny_spec())
    _run(path, out)
    first = sorted(drawn)
    assert "mixture/selective-ece" in first and len(first) == 9
    keys = _json(out / "plots" / ".keys.json")["figures"]
    assert sorted(keys) == first
    drawn.clear()
    paths = plots.write_plots(out)  # nothing changed: nothing drawn, every path returned
    assert drawn == [] and len(paths) == 18 and all(p.is_file() for p in paths)
    (out / "plots" / "mixture" / "risk-coverage.svg").unlink()  # a file gone: that figure
    plots.write_plots(out)
    assert drawn == ["mixture/risk-coverage"]
    drawn.clear()
    plots.write_plots(out, beta=0.9)  # another β: the figures drawn at a β change
    assert sorted(drawn) == sorted(k for k in first if k.startswith(
        ("mixture/reliability/", "mixture/confidence/")))
    assert len(drawn) == 6
    drawn.clear()
    _run(write_spec(tiny_spec(n_fit=200)), out)  # other cells: every figure
    assert sorted(drawn) == first


def test_many_methods_get_distinct_colour_blind_safe_lines():
    from selbench.reporting.figures import OKABE_ITO, _style

    styles = [(_style(i, 16)["color"], _style(i, 16)["linestyle"]) for i in range(16)]
    assert len(set(styles)) == 16
    assert {c for c, _ in styles} == set(OKABE_ITO) and "#F0E442" not in OKABE_ITO


# --------------------------------------------------------------------------- output
RANKED = [
    {"label": "None", "scheme": {"name": "recalibration"}},
    {"label": "Confidence", "scheme": {"name": "recalibration"},
     "recalibrator": {"name": "temperature"}, "selector": {"name": "confidence"}},
]


def test_beta_free_metrics_are_shown_once_in_a_per_beta_table(write_spec, tmp_path):
    spec = tiny_spec(methods=RANKED, report="betas", betas=[0.5, 0.8, 1.0])
    spec["metrics"] = ["ece1", "aurc", "augrc"]
    out = tmp_path / "r"
    _run(write_spec(spec), out, "--no-plots")
    md = (out / "leaderboard.md").read_text()
    assert "### ECE₁ ↓ at coverage β" in md
    assert "AURC ↓ at coverage β" not in md and "AUGRC ↓ at coverage β" not in md
    assert "### AURC, AUGRC: the same at every coverage β" in md
    table = md.split("### AURC, AUGRC: the same at every coverage β")[1]
    assert "| Method     | AURC ↓" in table and "β=" not in table
    tables = _json(out / "leaderboard.json")["experiments"][0]["rows"]
    aurc = tables[1]["metrics"]["aurc"]["0.5"]["mean"]
    assert f"{aurc:.3f}" in table  # the value itself, once


def test_combined_leaderboard_states_each_parts_seeds(write_spec, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    methods = tiny_spec()["experiments"][0]["methods"]
    _run(write_spec(tiny_spec(seeds=(0, 1, 2), methods=methods[:1]), "a.yaml"), a, "--no-plots")
    _run(write_spec(tiny_spec(seeds=(0, 1, 2, 3, 4), methods=methods[1:]), "b.yaml"), b,
         "--no-plots")
    assert main(["leaderboard", str(a), str(b), "--out", str(tmp_path / "c"), "--allow-mixed",
                 "-q"]) == 0
    md = (tmp_path / "c" / "leaderboard.md").read_text()
    a_md, b_md = (str(d).replace("_", "\\_") for d in (a, b))  # Markdown-escaped
    assert f"seeds 0, 1, 2, 3, 4 ({a_md}: seeds 0, 1, 2; {b_md}: seeds 0, 1, 2, 3, 4) ·" in md
    single = (a / "leaderboard.md").read_text()
    assert "seeds 0, 1, 2 · values are" in single  # one part: as before
