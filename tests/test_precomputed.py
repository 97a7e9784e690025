"""The ``precomputed`` dataset and pass-through backbone: a user's own model outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from selbench.contract.api import FitContext
from selbench.contract.data import DataError, ModelOutputs
from selbench.contract.registry import get_registry
from selbench.measure.metrics import ece
from selbench_plugins.backbones.precomputed import PrecomputedBackbone
from selbench_plugins.datasets.precomputed import PrecomputedDataset

#: the parameters a spec's precomputed dataset is validated against
PrecomputedParams = get_registry().get("dataset", "precomputed").plugin.params

CTX = FitContext(seed=0)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture
def arrays() -> dict:
    rng = np.random.default_rng(0)
    n, k, d = 40, 4, 3
    return {
        "labels": rng.integers(0, k, size=n),
        "logits": rng.normal(size=(n, k)).astype(np.float32),
        "features": rng.normal(size=(n, d)).astype(np.float32),
        "domain": rng.integers(0, 3, size=n),
        "split": np.array(["val", "test", "ood"] * 13 + ["val"]),
    }


def _save(tmp_path, **arrays) -> str:
    path = tmp_path / "outputs.npz"
    np.savez(path, **arrays)
    return str(path)


def test_split_array_mapping_and_passthrough(tmp_path, arrays):
    path = _save(tmp_path, **arrays)
    ds = PrecomputedDataset(path, splits={"fit": ["val"], "target": ["test", "ood"]})
    assert ds.splits() == ["fit", "target"]
    assert ds.num_classes == 4
    fit = PrecomputedBackbone().extract(ds, "fit", CTX)
    want = np.flatnonzero(arrays["split"] == "val")
    np.testing.assert_array_equal(fit.labels, arrays["labels"][want])
    np.testing.assert_array_equal(fit.logits, arrays["logits"][want])
    np.testing.assert_array_equal(fit.features, arrays["features"][want])
    np.testing.assert_array_equal(fit.domain, arrays["domain"][want])
    target = ds.split("target")
    assert isinstance(target.inputs, ModelOutputs)
    assert len(target.inputs) == int(np.isin(arrays["split"], ["test", "ood"]).sum()) == 26
    # without a mapping every distinct tag is a split
    assert sorted(PrecomputedDataset(path).splits()) == ["ood", "test", "val"]


def test_probabilities_become_log_probabilities_and_features(tmp_path, arrays):
    probs = _softmax(arrays["logits"].astype(np.float64))
    path = _save(tmp_path, labels=arrays["labels"], probabilities=probs)
    ds = PrecomputedDataset(path, fractions={"val": 0.25, "test": 0.75}, seed=3)
    val = ds.split("val").inputs
    test = ds.split("test").inputs
    assert (len(val), len(test)) == (10, 30)
    rows = np.sort(np.concatenate([val.labels, test.labels]))
    np.testing.assert_array_equal(rows, np.sort(arrays["labels"]))
    # logits are log p, and without features the selector sees the probability vector
    np.testing.assert_allclose(np.exp(val.logits.astype(np.float64)).sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(val.features, np.exp(val.logits), rtol=1e-5, atol=1e-7)
    # logits without features: the features are softmax(logits)
    path2 = _save(tmp_path, labels=arrays["labels"], logits=arrays["logits"])
    out = PrecomputedDataset(path2, fractions={"all": 1.0}).split("all").inputs
    np.testing.assert_allclose(out.features, _softmax(out.logits.astype(np.float64)), atol=1e-6)


def test_random_partition_is_seeded_and_disjoint(tmp_path, arrays):
    path = _save(tmp_path, labels=arrays["labels"], logits=arrays["logits"])

    def rows(seed):
        ds = PrecomputedDataset(path, fractions={"val": 0.5, "test": 0.5}, seed=seed)
        return [ds.split(s).inputs.logits[:, 0] for s in ("val", "test")]

    a, b = rows(0), rows(0)
    np.testing.assert_array_equal(a[0], b[0])
    assert len(a[0]) == len(a[1]) == 20
    assert not set(a[0].tolist()) & set(a[1].tolist())
    assert not np.array_equal(rows(1)[0], a[0])


def test_renamed_arrays_through_keys(tmp_path, arrays):
    probs = _softmax(arrays["logits"].astype(np.float64))
    path = _save(tmp_path, ground_truth=arrays["labels"], predictions=probs,
                 part=arrays["split"])  # fmt: skip
    ds = PrecomputedDataset(
        path, keys={"labels": "ground_truth", "probabilities": "predictions", "split": "part"},
        splits={"val": ["val"], "test": ["test"]},
    )  # fmt: skip
    assert len(ds.split("val").inputs) == 14 and len(ds.split("test").inputs) == 13


@pytest.mark.parametrize(
    ("arrays_fn", "kwargs", "exc", "needle"),
    [
        (lambda a: {"logits": a["logits"]}, {}, ValueError, "'labels'"),
        (lambda a: {"labels": a["labels"]}, {}, ValueError, "'logits' or a 'probabilities'"),
        (lambda a: {"labels": a["labels"], "logits": a["logits"][:5]}, {}, DataError, "logits"),
        (lambda a: {"labels": a["labels"], "logits": a["logits"], "split": a["split"]},
         {"splits": {"val": ["validation"]}}, ValueError, "'validation'"),
        (lambda a: {"labels": a["labels"], "logits": a["logits"]},
         {"splits": {"val": ["val"]}}, ValueError, "no 'split' array"),
        (lambda a: {"labels": a["labels"], "logits": a["logits"]},
         {"keys": {"features": "emb"}}, ValueError, "'emb'"),
        (lambda a: {"labels": a["labels"], "probabilities": np.full((40, 4), 0.5)},
         {}, DataError, "sum to 1"),
        (lambda a: {"labels": a["labels"], "logits": a["logits"],
                    "split": np.array(list(a["split"]), dtype=object)},
         {}, ValueError, "fixed-width string"),
    ],
)  # fmt: skip
def test_bad_files_name_the_file_and_the_array(tmp_path, arrays, arrays_fn, kwargs, exc, needle):
    path = _save(tmp_path, **arrays_fn(arrays))
    with pytest.raises(exc) as info:
        PrecomputedDataset(path, **kwargs).split(next(iter(kwargs.get("splits", {"val": 0}))))
    assert needle in str(info.value)
    assert "outputs.npz" in str(info.value)


def test_missing_file_and_bad_params(tmp_path):
    missing = tmp_path / "nope.npz"
    ds = PrecomputedDataset(str(missing))
    assert ds.splits() == ["val", "test"]
    with pytest.raises(FileNotFoundError, match="nope.npz"):
        ds.split("val")
    with pytest.raises(ValidationError, match="given to both"):
        PrecomputedParams(path="x.npz", splits={"val": ["a"], "test": ["a"]})
    with pytest.raises(ValidationError, match="sum to"):
        PrecomputedParams(path="x.npz", fractions={"val": 0.7, "test": 0.6})
    with pytest.raises(ValidationError, match="unknown role"):
        PrecomputedParams(path="x.npz", keys={"logit": "z"})


def test_passthrough_backbone_rejects_image_datasets(tmp_path):
    class Images:
        num_classes = 2

        def split(self, name):
            from selbench.contract.api import SplitData

            return SplitData(inputs=np.zeros((2, 3, 4, 4)), labels=np.zeros(2, dtype=np.int64))

    # a DataError, so the runner reports it for its experiment (still a TypeError too)
    with pytest.raises(DataError, match="pair it with the 'precomputed' dataset") as info:
        PrecomputedBackbone().extract(Images(), "val", CTX)
    assert isinstance(info.value, TypeError)


def test_path_is_a_declared_input_relative_to_the_spec(tmp_path, arrays, monkeypatch):
    from selbench.contract.inputs import InputSpec, declared_inputs
    from selbench.execution.runner import run
    from selbench.spec import SpecError, load_spec

    assert declared_inputs(PrecomputedParams) == {"path": InputSpec("file")}
    project = tmp_path / "project"
    project.mkdir()
    np.savez(project / "outputs.npz", labels=arrays["labels"], logits=arrays["logits"])
    spec = {
        "spec_version": 1, "name": "relative", "seeds": [0],
        "experiments": [{
            "name": "mine", "dataset": {"name": "precomputed", "params": {"path": "outputs.npz"}},
            "backbone": {"name": "precomputed"}, "fit_split": "val", "eval_split": "test",
            "n_fit": 10, "betas": [0.5, 1.0], "train_beta": 0.5,
            "methods": [{"label": "None", "scheme": {"name": "recalibration"}}],
        }],
    }  # fmt: skip
    (project / "spec.yaml").write_text(json.dumps(spec))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the path is the spec's neighbour, not the cwd's
    resolved = load_spec(project / "spec.yaml")
    params = resolved.canonical()["experiments"][0]["dataset"]["params"]
    assert params["path"] == str(project / "outputs.npz")
    report = run(project / "spec.yaml", out_dir=tmp_path / "out", progress=False, plots=False)
    assert report.computed == 1
    spec["experiments"][0]["dataset"]["params"]["path"] = "missing.npz"
    (project / "spec.yaml").write_text(json.dumps(spec))
    with pytest.raises(SpecError, match=r"dataset.params.path: no such file: .*project/missing.npz"):
        load_spec(project / "spec.yaml")


def test_registered_under_both_kinds():
    reg = get_registry()
    assert reg.get("dataset", "precomputed").plugin.factory is PrecomputedDataset
    assert reg.get("backbone", "precomputed").plugin.factory is PrecomputedBackbone


# --------------------------------------------------------------------------- real outputs
NETCAL = "netcal_cifar100_densenet-bc-100.npz"
NETCAL_KEYS = {"labels": "ground_truth", "probabilities": "predictions"}


def test_real_cifar100_outputs_temperature_lowers_ece(shared_data):
    path = shared_data / NETCAL
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    ds = PrecomputedDataset(str(path), keys=NETCAL_KEYS, fractions={"val": 0.5, "test": 0.5})
    fit, test = ds.split("val").inputs, ds.split("test").inputs
    assert (len(fit), len(test), fit.num_classes) == (5000, 5000, 100)
    acc = float(np.concatenate([fit.correct(), test.correct()]).mean())
    assert abs(acc - 0.754) < 0.002  # the README's accuracy: the file was read correctly
    temp = get_registry().get("recalibrator", "temperature").build({})
    temp.fit(fit, CTX)
    before = ece(test.confidence(), test.correct())
    after = ece(temp.confidence(test), test.correct())
    assert after < 0.8 * before, (before, after)


def test_real_outputs_end_to_end_through_the_runner(shared_data, tmp_path):
    from selbench.execution.runner import run

    path = shared_data / NETCAL
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    spec = {
        "spec_version": 1,
        "name": "precomputed-e2e",
        "seeds": [0, 1],
        "experiments": [{
            "name": "cifar100-densenet",
            "dataset": {"name": "precomputed",
                        "params": {"path": str(path), "keys": NETCAL_KEYS}},
            "backbone": {"name": "precomputed"},
            "fit_split": "val",
            "eval_split": "test",
            "n_fit": 2000,
            "betas": [0.8, 1.0],
            "train_beta": 0.8,
            "report": "betas",
            "methods": [
                {"label": "none", "scheme": {"name": "recalibration"}},
                {"label": "temperature", "scheme": {"name": "recalibration"},
                 "recalibrator": {"name": "temperature"}},
                {"label": "temperature + confidence", "scheme": {"name": "recalibration"},
                 "recalibrator": {"name": "temperature"}, "selector": {"name": "confidence"}},
            ],
        }],
    }  # fmt: skip
    report = run(spec, out_dir=tmp_path / "out", device="cpu", progress=False, plots=False)
    assert report.computed == 6
    cells = {}
    for f in (tmp_path / "out" / "cells").rglob("*.json"):
        rec = json.loads(f.read_text())
        cells[(rec["method"], rec["seed"])] = rec["metrics"]
    assert len(cells) == 6
    for seed in (0, 1):
        none, temp = cells[("none", seed)], cells[("temperature", seed)]
        assert temp["ece1"][1] < none["ece1"][1]  # β = 1: temperature scaling helps
        assert temp["accuracy"][1] == pytest.approx(none["accuracy"][1])  # argmax unchanged
        conf = cells[("temperature + confidence", seed)]
        assert conf["accuracy"][0] > temp["accuracy"][0]  # rejecting low confidence helps acc
    assert (tmp_path / "out" / "leaderboard.md").is_file()
    again = run(spec, out_dir=tmp_path / "out", device="cpu", progress=False, plots=False)
    assert (again.computed, again.reused) == (0, 6)


# --------------------------------------------------------------------------- checksums
def test_sha256_option_accepts_the_file_and_names_a_wrong_copy(tmp_path, arrays):
    import hashlib

    path = _save(tmp_path, labels=arrays["labels"], logits=arrays["logits"])
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    for given in (digest, digest[:16], digest[:16].upper()):
        ds = PrecomputedDataset(path, sha256=PrecomputedParams(path=path, sha256=given).sha256)
        ds.check_inputs()
        assert len(ds.split("val").inputs) == 20
    wrong = ("0" if digest[0] != "0" else "1") + digest[1:16]
    for call in ("check_inputs", "split_sizes"):
        with pytest.raises(DataError) as err:
            getattr(PrecomputedDataset(path, sha256=wrong), call)()
        msg = str(err.value)
        assert path in msg and wrong in msg and digest[:16] in msg and "sha256" in msg
        assert "\n" not in msg
    with pytest.raises(DataError, match="does not match"):
        PrecomputedDataset(path, sha256=wrong).split("val")
    for bad in ("xyz", "abc123", "0" * 65):
        with pytest.raises(ValidationError, match="sha256 must be 16 to 64 hexadecimal"):
            PrecomputedParams(path=path, sha256=bad)


def test_wrong_checksum_is_one_line_and_exit_2_at_validate(tmp_path, arrays, write_spec, capsys):
    from selbench.cli import main

    path = _save(tmp_path, labels=arrays["labels"], logits=arrays["logits"])
    spec = write_spec({
        "spec_version": 1, "name": "sum", "seeds": [0],
        "experiments": [{
            "name": "e", "backbone": {"name": "precomputed"},
            "dataset": {"name": "precomputed", "params": {"path": path, "sha256": "ab" * 8}},
            "fit_split": "val", "eval_split": "test",
            "methods": [{"label": "None", "scheme": {"name": "recalibration"}}],
        }],
    })  # fmt: skip
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = next(ln for ln in err.splitlines() if "abababababababab" in ln)
    assert "experiments[0].dataset.params.path" in line and path in line


#: the five netcal records of ../shared/data/ (README.md there): first 16 hex digits of their
#: SHA-256, classes, and the accuracy it states
NETCAL_FILES = {
    "netcal_cifar100_densenet-bc-100.npz": ("6b8c33de93bdf1ae", 100, 0.754),
    "netcal_cifar100_wideresnet-16-4.npz": ("ab3ce671b234521f", 100, 0.754),
    "netcal_cifar10_wideresnet-16-4.npz": ("ce2bafe1fa22e8da", 10, 0.911),
    "netcal_cifar100_lenet-5.npz": ("45807c28708ba788", 100, 0.125),
    "netcal_cifar10_lenet-5.npz": ("2fea8ab231920142", 10, 0.531),
}


@pytest.mark.parametrize("name", sorted(NETCAL_FILES))
def test_every_netcal_file_loads_with_its_published_checksum(shared_data, name):
    path = shared_data / name
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    digest, k, accuracy = NETCAL_FILES[name]
    ds = PrecomputedDataset(str(path), keys=NETCAL_KEYS, sha256=digest)
    ds.check_inputs()
    assert ds.split_sizes() == {"val": 5000, "test": 5000}
    fit, test = ds.split("val").inputs, ds.split("test").inputs
    assert fit.num_classes == k and len(fit) + len(test) == 10000
    acc = float(np.concatenate([fit.correct(), test.correct()]).mean())
    assert abs(acc - accuracy) < 0.002, acc


def test_lenet_outputs_run_and_every_seed_fits_its_own_rows(shared_data, tmp_path):
    """Both LeNet-5 files (accuracy 0.531 and 0.125) through the runner: with n_fit below the
    fitting split's 5000 rows each seed draws other rows, so a fitted method scores
    differently on the same evaluation rows for every seed (the runner draws them with
    ``fit_indices``; five seeds' samples of 2000 out of 5000 overlap in fewer than 1000 rows)."""
    from selbench.execution.runner import run
    from selbench.measure.evaluate import fit_indices

    rows = [fit_indices(5000, 2000, s, "n_fit") for s in range(5)]
    assert all(len(np.intersect1d(a, b)) < 1000 for i, a in enumerate(rows) for b in rows[i + 1:])
    experiments = []
    for name in ("netcal_cifar10_lenet-5.npz", "netcal_cifar100_lenet-5.npz"):
        path = shared_data / name
        if not path.is_file():
            pytest.skip(f"{path} is absent")
        experiments.append({
            "name": name[7:-4].replace("_", "-"),
            "dataset": {"name": "precomputed", "params": {
                "path": str(path), "keys": NETCAL_KEYS, "sha256": NETCAL_FILES[name][0]}},
            "backbone": {"name": "precomputed"}, "fit_split": "val", "eval_split": "test",
            "n_fit": 2000, "betas": [0.8, 1.0], "train_beta": 0.8, "report": "betas",
            "methods": [{"label": "none", "scheme": {"name": "recalibration"}},
                        {"label": "temperature", "scheme": {"name": "recalibration"},
                         "recalibrator": {"name": "temperature"}}],
        })  # fmt: skip
    spec = {"spec_version": 1, "name": "lenet", "seeds": [0, 1], "experiments": experiments}
    report = run(spec, out_dir=tmp_path / "out", device="cpu", progress=False, plots=False)
    assert report.computed == 8
    ece1 = {}
    for f in (tmp_path / "out" / "cells").rglob("*.json"):
        rec = json.loads(f.read_text())
        ece1[(rec["experiment"], rec["method"], rec["seed"])] = rec["metrics"]["ece1"][1]
    for exp in ("cifar10-lenet-5", "cifar100-lenet-5"):
        none = {ece1[(exp, "none", s)] for s in range(2)}
        temp = [ece1[(exp, "temperature", s)] for s in range(2)]
        assert len(none) == 1  # no fitting: the same evaluation rows give the same number
        assert len(set(temp)) == 2  # two seeds, two fitting samples
        assert max(temp) < min(none)  # temperature scaling helps both LeNets
