"""Published model outputs of other benchmarks as selbench datasets: ``calarena`` (CalArena's
HDF5 benchmark files) and ``fd-shifts`` (an FD-Shifts experiment's ``test_results/``).

The fixtures are written here in the real formats, as the real writers write them:

* CalArena: ``calibration_benchmarks/generate_cv_benchmarks.py`` and
  ``generate_tabrepo_benchmarks.py`` of probkit/CalArena (groups ``{dataset}/{model}`` of
  ``{benchmark}.h5`` with gzip-compressed ``probas_cal`` / ``probas_test`` float32 and
  ``labels_cal`` / ``labels_test`` int32, file attributes ``source`` / ``problem_type``, and
  ``{benchmark}-experiments.csv``), read as its ``run_benchmark.py`` reads them;
* FD-Shifts: ``fd_shifts/models/callbacks/confid_monitor.py`` (``on_test_end``:
  ``np.savez_compressed(test_results/raw_logits.npz, [logits | label | dataset_idx])`` and
  ``encoded_output.npz`` = ``[encoding | dataset_idx]`` in float16) of IML-DKFZ/fd-shifts,
  read as ``fd_shifts/analysis/__init__.py`` (``ExperimentData.from_experiment``) and
  ``fd_shifts/analysis/studies.py`` (the noise study's 15 x 5 x n layout) read them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from selbench.contract.api import FitContext
from selbench.contract.data import DataError
from selbench.contract.registry import get_registry
from selbench_plugins.backbones.precomputed import PrecomputedBackbone
from selbench_plugins.datasets.calarena import CalArena, MissingCalArenaData
from selbench_plugins.datasets.calarena_spec import main as calarena_main
from selbench_plugins.datasets.fdshifts import FDShifts, MissingFDShiftsOutputs

CTX = FitContext(seed=0)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _methods() -> list[dict]:
    return [{"label": "none", "scheme": {"name": "recalibration"}},
            {"label": "temperature", "scheme": {"name": "recalibration"},
             "recalibrator": {"name": "temperature"}}]


def _ece1_by_seed(out) -> dict:
    cells = {}
    for f in (out / "cells").rglob("*.json"):
        rec = json.loads(f.read_text())
        cells[(rec["experiment"], rec["method"], rec["seed"])] = rec["metrics"]["ece1"][-1]
    return cells


# =========================================================================== CalArena
def _probas(rng, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Overconfident probabilities and labels drawn from the calibrated ones."""
    z = rng.normal(size=(n, k)) * 1.5
    labels = (_softmax(z).cumsum(1) < rng.random((n, 1))).sum(1)
    return _softmax(2.5 * z).astype(np.float32), labels


def write_calarena(folder, benchmark: str, groups: dict) -> None:
    """``groups``: (dataset, model) -> (probas_cal, labels_cal, probas_test, labels_test),
    written as CalArena's generate_*_benchmarks.py write them."""
    h5py = pytest.importorskip("h5py", reason="the calarena plugin reads HDF5 with h5py")
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    with h5py.File(folder / f"{benchmark}.h5", "w") as f:
        f.attrs["source"] = benchmark.split("-")[0]
        f.attrs["problem_type"] = benchmark.split("-")[-1]
        for (dataset, model), (pc, yc, pt, yt) in groups.items():
            grp = f.create_group(f"{dataset}/{model}")
            grp.create_dataset("probas_cal", data=pc.astype(np.float32), compression="gzip")
            grp.create_dataset("labels_cal", data=yc.flatten().astype(np.int32),
                               compression="gzip")
            grp.create_dataset("probas_test", data=pt.astype(np.float32), compression="gzip")
            grp.create_dataset("labels_test", data=yt.flatten().astype(np.int32),
                               compression="gzip")
            row = {"dataset": dataset, "model": model, "cal_size": len(pc),
                   "test_size": len(pt)}
            if pc.ndim == 2:
                row["n_classes"] = pc.shape[1]
            rows.append(row)
    header = list(rows[0])
    lines = [",".join(header)] + [",".join(str(r[h]) for h in header) for r in rows]
    (folder / f"{benchmark}-experiments.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture
def calarena_folder(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "calibration_benchmarks"
    multi = {("c100", "densenet40"): (*_probas(rng, 600, 5), *_probas(rng, 400, 5)),
             ("c10", "resnet110"): (*_probas(rng, 300, 3), *_probas(rng, 200, 3))}
    write_calarena(folder, "cv-multiclass", multi)
    pc, yc = _probas(rng, 500, 2)
    pt, yt = _probas(rng, 300, 2)
    binary = {("adult", "CatBoost"): (pc[:, 1], yc, pt[:, 1], yt)}  # positive-class p, [n]
    write_calarena(folder, "tabrepo-binary", binary)
    return folder, multi, binary


def test_calarena_multiclass_parts_are_the_published_arrays(calarena_folder):
    folder, multi, _ = calarena_folder
    ds = CalArena(str(folder), "cv-multiclass", "c100", "densenet40")
    assert ds.splits() == ["cal", "test"]
    assert ds.split_sizes() == {"cal": 600, "test": 400}
    assert ds.num_classes == 5
    pc, yc, pt, yt = multi[("c100", "densenet40")]
    cal = PrecomputedBackbone().extract(ds, "cal", CTX)
    test = ds.split("test").inputs
    np.testing.assert_array_equal(cal.labels, yc)
    np.testing.assert_array_equal(test.labels, yt)
    # logits are log p (p as stored: float32), the features the probability vector
    np.testing.assert_allclose(cal.probabilities(), pc, atol=1e-6)
    np.testing.assert_allclose(cal.features, pc, atol=1e-7)
    np.testing.assert_allclose(test.probabilities(), pt, atol=1e-6)
    assert cal.domain is None
    other = CalArena(str(folder), "cv-multiclass", "c10", "resnet110")
    assert other.num_classes == 3 and other.split_sizes() == {"cal": 300, "test": 200}


def test_calarena_binary_probability_becomes_two_classes(calarena_folder):
    folder, _, binary = calarena_folder
    pc, yc, _, _ = binary[("adult", "CatBoost")]
    ds = CalArena(str(folder), "tabrepo-binary", "adult", "CatBoost")
    assert ds.num_classes == 2
    cal = ds.split("cal").inputs
    np.testing.assert_allclose(cal.probabilities()[:, 1], pc, atol=1e-6)
    np.testing.assert_allclose(cal.probabilities()[:, 0], 1 - pc, atol=1e-6)
    # the top-label confidence is max(p, 1 - p), as CalArena's Base-model evaluates it
    np.testing.assert_allclose(cal.confidence(), np.maximum(pc, 1 - pc), atol=1e-6)
    np.testing.assert_array_equal(cal.labels, yc)


@pytest.mark.parametrize("kwargs, exc, needles", [
    ({"benchmark": "cv-binary"}, MissingCalArenaData,
     ["cv-binary.h5 does not exist", "cv-binary-experiments.csv"]),
    ({"dataset": "c1000"}, DataError, ["no group 'c1000/densenet40'", "no dataset 'c1000'",
                                       "did you mean c100"]),
    ({"model": "densenet4"}, DataError, ["no model 'densenet4'", "densenet40"]),
])
def test_calarena_names_the_missing_file_or_group(calarena_folder, kwargs, exc, needles):
    folder, _, _ = calarena_folder
    params = {"folder": str(folder), "benchmark": "cv-multiclass", "dataset": "c100",
              "model": "densenet40", **kwargs}
    for call in (lambda ds: ds.check_inputs(), lambda ds: ds.split("cal")):
        with pytest.raises(exc) as err:
            call(CalArena(**params))
        msg = str(err.value)
        assert "\n" not in msg and all(n in msg for n in needles), msg


def test_calarena_names_a_missing_array(tmp_path):
    h5py = pytest.importorskip("h5py", reason="the calarena plugin reads HDF5 with h5py")
    with h5py.File(tmp_path / "cv-multiclass.h5", "w") as f:
        grp = f.create_group("c10/vgg")
        grp.create_dataset("probas_cal", data=np.full((4, 2), 0.5, dtype=np.float32))
        grp.create_dataset("labels_cal", data=np.zeros(4, dtype=np.int32))
        grp.create_dataset("probas_test", data=np.full((4, 2), 0.5, dtype=np.float32))
    with pytest.raises(DataError, match="group 'c10/vgg' has no array 'labels_test'"):
        CalArena(str(tmp_path), "cv-multiclass", "c10", "vgg").check_inputs()


def test_calarena_without_h5py_says_what_to_install(tmp_path, monkeypatch):
    import sys

    (tmp_path / "cv-multiclass.h5").write_bytes(b"\x89HDF\r\n\x1a\n")  # never opened
    monkeypatch.setitem(sys.modules, "h5py", None)  # import h5py now raises ImportError
    for call in (lambda ds: ds.check_inputs(), lambda ds: ds.split("cal")):
        with pytest.raises(DataError, match=r"^calarena: reading CalArena's .h5 files needs "
                                            r"the h5py package; install it with `pip install "
                                            r"h5py`$"):
            call(CalArena(str(tmp_path), "cv-multiclass", "c100", "densenet40"))


def test_calarena_benchmark_name_is_validated():
    params = get_registry().get("dataset", "calarena").plugin.params
    with pytest.raises(ValueError, match="benchmark"):
        params(folder="x", benchmark="cv-regression", dataset="a", model="b")


def _calarena_spec(folder, n_fit=300) -> dict:
    return {"spec_version": 1, "name": "calarena", "seeds": [0, 1], "experiments": [{
        "name": "c100-densenet40",
        "dataset": {"name": "calarena", "params": {
            "folder": str(folder), "benchmark": "cv-multiclass",
            "dataset": "c100", "model": "densenet40"}},
        "backbone": {"name": "precomputed"}, "fit_split": "cal", "eval_split": "test",
        "n_fit": n_fit, "betas": [0.8, 1.0], "train_beta": 0.8, "report": "betas",
        "methods": _methods()}]}


def test_calarena_experiment_runs_and_every_seed_fits_its_own_rows(calarena_folder, tmp_path):
    from selbench.execution.runner import run

    folder, _, _ = calarena_folder
    report = run(_calarena_spec(folder), out_dir=tmp_path / "out", device="cpu",
                 progress=False, plots=False)
    assert report.computed == 4
    ece1 = _ece1_by_seed(tmp_path / "out")
    none = {ece1[("c100-densenet40", "none", s)] for s in (0, 1)}
    temp = [ece1[("c100-densenet40", "temperature", s)] for s in (0, 1)]
    assert len(none) == 1 and temp[0] != temp[1]  # other fitting rows, the same test rows
    assert max(temp) < min(none)  # the fixture is overconfident: temperature scaling helps


def test_calarena_errors_at_validate_are_one_line_exit_2(calarena_folder, write_spec, capsys):
    from selbench.cli import main

    folder, _, _ = calarena_folder
    spec = _calarena_spec(folder)
    spec["experiments"][0]["dataset"]["params"]["model"] = "densenet41"
    assert main(["validate", str(write_spec(spec))]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert any("no model 'densenet41'" in ln and "cv-multiclass.h5" in ln
               for ln in err.splitlines())
    spec = _calarena_spec(folder, n_fit=601)  # more than the 600 calibration rows
    assert main(["validate", str(write_spec(spec))]) == 2
    assert "n_fit: 601 examples asked, but split 'cal'" in capsys.readouterr().err


def test_calarena_spec_generator_writes_one_experiment_per_row(calarena_folder, tmp_path,
                                                               capsys):
    from selbench.spec import load_spec

    folder, _, _ = calarena_folder
    like = tmp_path / "like.yaml"
    template = _calarena_spec(folder)
    template["experiments"][0]["n_fit"] = 400
    like.write_text(yaml.safe_dump(template))
    out = tmp_path / "generated.yaml"
    assert calarena_main([str(folder), "cv-multiclass", "--like", str(like),
                          "--out", str(out)]) == 0
    spec = yaml.safe_load(out.read_text())
    exps = {e["name"]: e for e in spec["experiments"]}
    assert set(exps) == {"cv-multiclass-c100-densenet40", "cv-multiclass-c10-resnet110"}
    assert exps["cv-multiclass-c100-densenet40"]["n_fit"] == 400  # min(0.8 * 600, 400)
    assert exps["cv-multiclass-c10-resnet110"]["n_fit"] == 240  # 0.8 * 300
    assert exps["cv-multiclass-c10-resnet110"]["methods"] == template["experiments"][0][
        "methods"]
    assert len(load_spec(out).spec.experiments) == 2  # a valid spec
    assert calarena_main([str(folder), "cv-binary", "--like", str(like),
                          "--out", str(tmp_path / "x.yaml")]) == 2
    assert "cv-binary-experiments.csv does not exist" in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


# =========================================================================== FD-Shifts
K, D, PER = 4, 6, 2  # classes, encoding width, images per (corruption, intensity)


def _fdshifts_raw(rng):
    """val_tuning (60 rows), an i.i.d. test set (50), a corruption set (15 x 5 x PER rows,
    FD-Shifts' order) and a new-class set (10 rows, labels of another dataset)."""
    sizes = {0: 60, 1: 50, 2: 15 * 5 * PER, 3: 10}
    idx = np.concatenate([np.full(n, i) for i, n in sizes.items()])
    n = len(idx)
    logits = rng.normal(size=(n, K)) * 3
    labels = (_softmax(logits / 3).cumsum(1) < rng.random((n, 1))).sum(1).astype(float)
    labels[idx == 3] = rng.integers(K, K + 20, size=10)  # new-class: not the model's classes
    corrupted = np.flatnonzero(idx == 2)
    # mark every corrupted row with its (corruption, intensity) in the last logit column
    c, lvl, _ = np.meshgrid(np.arange(15), np.arange(5), np.arange(PER), indexing="ij")
    logits[corrupted, -1] = 100 * c.reshape(-1) + lvl.reshape(-1)
    raw = np.column_stack([logits, labels, idx]).astype(np.float32)
    encoded = np.column_stack([rng.normal(size=(n, D)), idx]).astype(np.float16)
    return raw, encoded


@pytest.fixture
def fdshifts_run(tmp_path):
    """An FD-Shifts experiment folder: <exp>/test_results/{raw_logits,encoded_output}.npz."""
    raw, encoded = _fdshifts_raw(np.random.default_rng(0))
    results = tmp_path / "confidnet_bbvgg13_do1_run1_rew2.2" / "test_results"
    results.mkdir(parents=True)
    np.savez_compressed(results / "raw_logits.npz", raw)  # arr_0, as confid_monitor.py
    np.savez_compressed(results / "encoded_output.npz", encoded)
    return results.parent, raw, encoded


SETS = ["val_tuning", "cifar10", "corrupt_cifar10", "svhn"]


def test_fdshifts_sets_become_splits_with_logits_and_encodings(fdshifts_run):
    exp, raw, encoded = fdshifts_run
    ds = FDShifts(str(exp), sets=SETS)  # the experiment folder: test_results/ is found
    assert ds.splits() == SETS
    assert ds.num_classes == K
    assert ds.split_sizes() == {"val_tuning": 60, "cifar10": 50, "corrupt_cifar10": 150,
                                "svhn": 10}
    val = PrecomputedBackbone().extract(ds, "val_tuning", CTX)
    rows = raw[:, -1] == 0
    np.testing.assert_array_equal(val.logits, raw[rows, :K])
    np.testing.assert_array_equal(val.labels, raw[rows, K].astype(int))
    np.testing.assert_array_equal(val.features, encoded[rows, :D].astype(np.float32))
    np.testing.assert_array_equal(val.domain, np.zeros(60))
    # without names: val_tuning, set1, set2, ...; without encodings: the softmax vector
    plain = FDShifts(str(exp / "test_results"), features="probabilities")
    assert plain.splits() == ["val_tuning", "set1", "set2", "set3"]
    test = plain.split("set1").inputs
    np.testing.assert_allclose(test.features, _softmax(raw[raw[:, -1] == 1, :K].astype(
        np.float64)), atol=1e-6)


def test_fdshifts_noise_set_is_split_by_intensity_as_fd_shifts_reads_it(fdshifts_run):
    exp, raw, _ = fdshifts_run
    ds = FDShifts(str(exp), sets=SETS, noise_sets=["corrupt_cifar10"])
    assert [s for s in ds.splits() if s.startswith("corrupt")] == [
        "corrupt_cifar10"] + [f"corrupt_cifar10-{k}" for k in range(1, 6)]
    corrupted = raw[raw[:, -1] == 2]
    for level in range(5):
        split = ds.split(f"corrupt_cifar10-{level + 1}").inputs
        # FD-Shifts' filter: rows.reshape(15, 5, -1)[:, level]
        want = corrupted.reshape(15, 5, PER, -1)[:, level].reshape(-1, corrupted.shape[1])
        np.testing.assert_array_equal(split.logits, want[:, :K])
        marks = split.logits[:, -1].astype(int)
        assert set(marks % 100) == {level} and set(marks // 100) == set(range(15))
        # domain: corruption x 5 + intensity
        np.testing.assert_array_equal(split.domain, (marks // 100) * 5 + level)
    assert len(ds.split("corrupt_cifar10").labels) == 150


def test_fdshifts_softmax_outputs_of_older_runs(tmp_path):
    rng = np.random.default_rng(1)
    raw, _ = _fdshifts_raw(rng)
    probs = _softmax(raw[:, :K].astype(np.float64))
    (tmp_path / "test_results").mkdir()
    np.savez_compressed(tmp_path / "test_results" / "raw_output.npz",
                        np.column_stack([probs, raw[:, K:]]))
    out = FDShifts(str(tmp_path), sets=SETS).split("cifar10").inputs
    np.testing.assert_allclose(out.probabilities(), probs[raw[:, -1] == 1], atol=1e-6)


def test_fdshifts_errors_name_the_file_and_the_split(fdshifts_run, tmp_path):
    exp, _, _ = fdshifts_run
    with pytest.raises(DataError, match=r"split 'svhn' has labels outside the model's 4 "
                                        r"classes .*a new-class set"):
        FDShifts(str(exp), sets=SETS).split("svhn")
    with pytest.raises(MissingFDShiftsOutputs, match=r"no raw_logits.npz or raw_output.npz"):
        FDShifts(str(tmp_path)).check_inputs()
    with pytest.raises(DataError, match=r"dataset_idx runs to 3 but sets names only 2"):
        FDShifts(str(exp), sets=["val_tuning", "cifar10"]).splits()
    with pytest.raises(DataError, match=r"noise_sets names \['svhn2'\]"):
        FDShifts(str(exp), sets=SETS, noise_sets=["svhn2"]).splits()
    with pytest.raises(DataError, match=r"noise set 'cifar10' has 50 rows, not a multiple"):
        FDShifts(str(exp), sets=SETS, noise_sets=["cifar10"]).splits()
    bad = tmp_path / "bad" / "test_results"
    bad.mkdir(parents=True)
    np.savez_compressed(bad / "raw_logits.npz", outputs=np.zeros((3, 6)))
    with pytest.raises(DataError, match=r"raw_logits.npz: no array 'arr_0'.*it holds outputs"):
        FDShifts(str(bad.parent)).splits()


def test_fdshifts_experiment_runs_fit_on_val_tuning_evaluate_under_corruption(
        fdshifts_run, tmp_path, write_spec, capsys):
    from selbench.cli import main
    from selbench.execution.runner import run

    exp, _, _ = fdshifts_run
    spec = {"spec_version": 1, "name": "fds", "seeds": [0, 1], "experiments": [{
        "name": "corrupt-3",
        "dataset": {"name": "fd-shifts", "params": {
            "folder": str(exp), "sets": SETS, "noise_sets": ["corrupt_cifar10"]}},
        "backbone": {"name": "precomputed"}, "fit_split": "val_tuning",
        "eval_split": "corrupt_cifar10-3", "n_fit": 45, "betas": [0.8, 1.0],
        "train_beta": 0.8, "report": "betas", "methods": _methods()}]}
    report = run(spec, out_dir=tmp_path / "out", device="cpu", progress=False, plots=False)
    assert report.computed == 4
    ece1 = _ece1_by_seed(tmp_path / "out")
    assert ece1[("corrupt-3", "temperature", 0)] != ece1[("corrupt-3", "temperature", 1)]
    # a missing outputs file is one line at validate, exit 2
    spec["experiments"][0]["dataset"]["params"]["folder"] = str(tmp_path)
    assert main(["validate", str(write_spec(spec))]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and any(
        "no raw_logits.npz or raw_output.npz" in ln for ln in err.splitlines())
