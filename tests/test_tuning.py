"""Equal-budget tuning (issue 25, item 1): spaces declared by plugins, the spec's ``tuning`` and
``search``, the procedure on the fitting rows only, resumable studies, records and leaderboard."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import tiny_spec
from selbench import Tune
from selbench.contract.registry import get_registry
from selbench.contract.search import SearchError
from selbench.execution import tuning as tuning_mod
from selbench.execution.runner import run
from selbench.spec import SpecError, load_spec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: a trained method whose learning rate is 100x below the scheme's default (5e-4)
POOR = {"label": "Poor", "scheme": {"name": "sequential",
                                    "params": {"epochs": 40, "batch_size": 50, "lr": 5e-6}},
        "selector": {"name": "mlp", "params": {"hidden": [16]}},
        "recalibrator": {"name": "temperature"},
        "loss": {"name": "s-tlbce"}, "coverage": {"name": "quadratic"},
        "search": {"scheme.lr": {"log_uniform": [1e-6, 1e-1]}}}
HB = {"label": "HB", "scheme": {"name": "recalibration"},
      "recalibrator": {"name": "histogram-binning"}}
TEMP = {"label": "Temp", "scheme": {"name": "recalibration"},
        "recalibrator": {"name": "temperature"}}


def _tuned(trials=4, methods=None, seeds=(0,), sampler="random", **exp):
    return tiny_spec(name="tuned", seeds=seeds, methods=methods or [HB, TEMP],
                     tuning={"trials": trials, "objective": "ece1", "sampler": sampler},
                     bootstrap={"resamples": 0}, **exp)


def _records(out) -> dict[tuple[str, int], dict]:
    recs = {}
    for path in sorted((out / "cells").rglob("seed*.json")):
        rec = json.loads(path.read_text())
        recs[(rec["method"], rec["seed"])] = rec
    return recs


def _tuning(out) -> dict:
    return {k: (r.get("tuning") or {}).get("history") for k, r in _records(out).items()}


# --------------------------------------------------------------------------- spaces
def test_tune_marker_parses_and_plugins_declare_spaces(capsys):
    assert Tune.parse({"log_uniform": [1e-4, 0.1]}) == Tune.log_uniform(1e-4, 0.1)
    assert Tune.parse({"int": [5, 30]}).contains(7) and not Tune.int(5, 30).contains(31)
    assert Tune.choice([64], [128, 128]).contains([128, 128])
    for bad, msg in [({"loguniform": [1, 2]}, "unknown distribution 'loguniform'"),
                     ({"uniform": [3, 1]}, "low < high"),
                     ({"log_uniform": [0, 1]}, "low must be > 0"),
                     ({"int": [1.5, 3]}, "bounds must be integers"),
                     ({"choice": [1]}, "at least two")]:
        with pytest.raises(SearchError, match=msg):
            Tune.parse(bad)
    reg = get_registry()
    assert reg.get("scheme", "sequential").search_space()["lr"] == Tune.log_uniform(1e-4, 1e-1)
    assert reg.get("recalibrator", "histogram-binning").search_space() == {
        "n_bins": Tune.int(5, 30)}
    assert reg.get("recalibrator", "temperature").search_space() == {}
    from selbench.cli import main

    assert main(["plugins", "loss"]) == 0
    assert "lam: float (default 32.0; tuned over log[1, 128])" in capsys.readouterr().out


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("edit, message", [
    ({"tuning": {"trials": 3, "objective": "ece"}},
     "experiments[0].tuning.objective: unknown metric 'ece'; did you mean "),
    ({"tuning": {"trials": 3, "objective": "coverage"}},
     "experiments[0].tuning.objective: 'coverage' has no direction"),
    ({"tuning": {"trials": 0, "objective": "ece1"}},
     "experiments[0].tuning.trials: Input should be greater than or equal to 1"),
    ({"tuning": {"trials": 3, "objective": "ece1", "inner": 1.0}},
     "experiments[0].tuning.inner: Input should be less than 1"),
    ({"methods": [{**HB, "search": {"recalibrator.n_bins": {"int": [5, 30]}}}]},
     "experiments[0]: methods[0].search: has no effect without the experiment's tuning "
     "block"),
])
def test_bad_tuning_blocks_are_named(edit, message):
    with pytest.raises(SpecError) as err:
        load_spec(tiny_spec(**edit))
    assert message in str(err.value)


@pytest.mark.parametrize("search, message", [
    ({"recalibrator.n_bins": {"loguniform": [5, 30]}},
     "experiments[0].methods[0].search: 'recalibrator.n_bins': unknown distribution "
     "'loguniform'"),
    ({"n_bins": {"int": [5, 30]}}, "'n_bins': name a parameter as <field>.<param>"),
    ({"recalibrator.nbins": {"int": [5, 30]}},
     "experiments[0].methods[0].search.recalibrator.nbins: recalibrator 'histogram-binning' "
     "(selbench 0.1.0) has no parameter 'nbins'; did you mean 'n_bins'?"),
    ({"recalibrator.n_bins": {"int": [0, 30]}},
     "search.recalibrator.n_bins: 0 is not a valid n_bins"),
    ({"selector.k": {"int": [1, 5]}}, "search.selector.k: selector 'none'"),
    ({"loss.q": "default"}, "search.loss.q: the method has no loss"),
    ({"recalibrator.max_temperature": "default"},
     "search.recalibrator.max_temperature: recalibrator 'temperature' (selbench 0.1.0) declares "
     "no search space for 'max_temperature'; give one"),
])
def test_bad_search_spaces_are_named(search, message):
    method = TEMP if "temperature" in next(iter(search)) else HB
    spec = _tuned(methods=[{**method, "search": search}])
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    assert message in str(err.value)


def test_untuned_spec_hash_and_cell_keys_are_unchanged_by_the_feature():
    """A spec without ``tuning`` hashes as before (no ``tuning``/``search`` key in its
    canonical form), so its results stay valid."""
    resolved = load_spec(tiny_spec())
    canon = resolved.canonical()
    assert "tuning" not in canon["experiments"][0]
    assert all("search" not in m for m in canon["experiments"][0]["methods"])


# --------------------------------------------------------------------------- the procedure
def test_poor_default_is_beaten_by_its_tuned_version(tmp_path):
    spec = _tuned(trials=6, methods=[POOR], seeds=(0,))
    run(spec, out_dir=tmp_path / "t", progress=False, plots=False, device="cpu")
    info = _records(tmp_path / "t")[("Poor", 0)]["tuning"]
    first = info["history"][0]  # the method's own parameters (inside the space) come first
    assert first["params"] == {"scheme.lr": 5e-6}
    assert len(info["history"]) == 6 and info["n_inner"] + info["n_heldout"] == 300
    assert info["best_value"] < first["value"] - 0.01  # strictly, and by a margin
    assert info["chosen"]["scheme.lr"] > 100 * 5e-6
    untuned = {k: v for k, v in POOR.items() if k != "search"}
    run(tiny_spec(name="plain", seeds=(0,), methods=[untuned], bootstrap={"resamples": 0}),
        out_dir=tmp_path / "u", progress=False, plots=False, device="cpu")
    tuned_ece = _records(tmp_path / "t")[("Poor", 0)]["metrics"]["ece1"]
    plain_ece = _records(tmp_path / "u")[("Poor", 0)]["metrics"]["ece1"]
    assert np.mean(tuned_ece) < np.mean(plain_ece)
    md = (tmp_path / "t" / "leaderboard.md").read_text()
    assert ("Tuned: 6 trials of random search per method and seed, each fitted on 70 % of the "
            "fitting rows and scored by ECE₁ at β = 0.5 on the other 30 %") in md


def _npz(path, poison: bool):
    rng = np.random.default_rng(7)
    n_val, n_test, k, d = 400, 300, 3, 5
    x = rng.normal(size=(n_val + n_test, d))
    z = 2.5 * x @ rng.normal(size=(d, k))
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = (p.cumsum(1) < rng.random((len(p), 1))).sum(1)
    split = np.array(["val"] * n_val + ["test"] * n_test)
    if poison:  # the evaluation split's labels, permuted
        y = y.copy()
        y[n_val:] = rng.permutation(y[n_val:])
    np.savez(path, logits=z.astype(np.float32), labels=y, features=x.astype(np.float32),
             split=split)


def test_evaluation_labels_are_never_read_while_tuning(tmp_path):
    methods = [HB, {**POOR, "scheme": {"name": "sequential",
                                       "params": {"epochs": 5, "batch_size": 50}}}]
    chosen = {}
    for poison in (False, True):
        npz = tmp_path / f"outputs{int(poison)}.npz"
        _npz(npz, poison)
        spec = _tuned(trials=3, methods=methods, seeds=(0, 1), n_fit=300)
        spec["experiments"][0].update(dataset={"name": "precomputed", "params": {"path": str(npz)}},
                                      backbone={"name": "precomputed"})
        out = tmp_path / f"run{int(poison)}"
        run(spec, out_dir=out, progress=False, plots=False, device="cpu")
        recs = _records(out)
        chosen[poison] = {k: (r["tuning"]["chosen"], r["tuning"]["history"])
                          for k, r in recs.items()}
        chosen[poison, "acc"] = {k: r["metrics"]["accuracy"] for k, r in recs.items()}
    assert chosen[False] == chosen[True]  # the same trials, values and choices
    assert chosen[False, "acc"] != chosen[True, "acc"]  # while the evaluation did change


def test_inline_and_local_workers_agree(tmp_path):
    spec = _tuned(trials=3, methods=[HB, TEMP, {**POOR, "scheme": {
        "name": "sequential", "params": {"epochs": 5, "batch_size": 50}}}], seeds=(0, 1))
    run(spec, out_dir=tmp_path / "inline", progress=False, plots=False, device="cpu")
    run(spec, out_dir=tmp_path / "local", progress=False, plots=False, device="cpu",
        executor="local", workers=2)
    assert _tuning(tmp_path / "inline") == _tuning(tmp_path / "local")
    assert _tuning(tmp_path / "inline")[("Temp", 0)] is None  # no space: fitted once
    for name in ("leaderboard.csv", "leaderboard.md"):
        assert ((tmp_path / "inline" / name).read_text()
                == (tmp_path / "local" / name).read_text())


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_more_trials_extend_the_study_and_an_interrupted_study_resumes(tmp_path, monkeypatch,
                                                                       sampler):
    methods = [HB, {**POOR, "scheme": {"name": "sequential",
                                       "params": {"epochs": 5, "batch_size": 50}}}]
    straight, ext, cut = (tmp_path / name for name in ("straight", "ext", "cut"))
    run(_tuned(trials=4, methods=methods, sampler=sampler), out_dir=straight,
        progress=False, plots=False, device="cpu")
    # trials=2, then the same study continued to 4
    run(_tuned(trials=2, methods=methods, sampler=sampler), out_dir=ext,
        progress=False, plots=False, device="cpu")
    assert {k: h for k, h in _tuning(ext).items() if h} == {
        k: h[:2] for k, h in _tuning(straight).items() if h}
    report = run(_tuned(trials=4, methods=methods, sampler=sampler), out_dir=ext,
                 progress=False, plots=False, device="cpu")
    assert report.computed == 2  # the tuned cells; their studies had 2 trials each
    assert _tuning(ext) == _tuning(straight)
    # a run stopped while scoring a study's third trial (its batch fitted, none told), rerun
    real = tuning_mod._Objective.score
    calls = {"n": 0}

    def flaky(self, *args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, *args)

    monkeypatch.setattr(tuning_mod._Objective, "score", flaky)
    with pytest.raises(KeyboardInterrupt):
        run(_tuned(trials=4, methods=methods, sampler=sampler), out_dir=cut,
            progress=False, plots=False, device="cpu")
    monkeypatch.setattr(tuning_mod._Objective, "score", real)
    run(_tuned(trials=4, methods=methods, sampler=sampler), out_dir=cut,
        progress=False, plots=False, device="cpu")
    assert _tuning(cut) == _tuning(straight)
    for name in ("leaderboard.csv", "leaderboard.md"):
        assert (cut / name).read_text() == (straight / name).read_text()


def test_tuned_and_untuned_cells_never_mix(tmp_path):
    out = tmp_path / "r"
    run(tiny_spec(name="tuned", seeds=(0,), methods=[HB, TEMP], bootstrap={"resamples": 0}),
        out_dir=out, progress=False, plots=False)
    report = run(_tuned(trials=2, methods=[HB, TEMP]), out_dir=out, progress=False,
                 plots=False)
    assert (report.computed, report.reused) == (1, 1)  # HB is tuned now; Temp has no space
    assert _records(out)[("HB", 0)]["tuning"]["trials"] == 2
    assert "tuning" not in _records(out)[("Temp", 0)]
    report = run(_tuned(trials=2, methods=[{**HB, "search": {}}, TEMP]), out_dir=out,
                 progress=False, plots=False)
    assert report.computed == 1 and "tuning" not in _records(out)[("HB", 0)]  # search: {}
    md = (out / "leaderboard.md").read_text()
    assert "at their parameters (no search space): HB, Temp." in md
