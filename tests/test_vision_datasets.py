"""The paper's image datasets, read from tiny fixtures written in the real on-disk formats."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest
import torch
from fixtures_vision import (
    CIFAR100_C_CORRUPTIONS,
    make_camelyon17,
    make_cifar100,
    make_cifar100_c,
    make_imagefolder,
    make_rxrx1,
    needs_torchvision,
    needs_wilds,
)
from PIL import Image
from selbench.contract.registry import get_registry
from selbench_plugins.datasets.cifar import CIFAR100, CIFAR100_CLASSES, CIFAR100C
from selbench_plugins.datasets.imagenet import ImageNetVal, _class_names
from selbench_plugins.datasets.wilds_data import Camelyon17, RxRx1

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.vision]


def _pixels(path) -> torch.Tensor:
    return torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)


# --------------------------------------------------------------------------- WILDS
@needs_wilds
def test_camelyon17_splits_labels_domains_and_pixels(tmp_path):
    import pandas as pd

    data_dir = make_camelyon17(tmp_path, counts=(6, 4, 5, 7), size=32)
    ds = get_registry().get("dataset", "camelyon17").build({"root_dir": str(tmp_path)})
    assert isinstance(ds, Camelyon17) and ds.num_classes == 2
    assert ds.splits() == ["train", "id_val", "val", "test"]
    sizes = {s: len(ds.split(s).inputs) for s in ds.splits()}
    assert sizes == {"train": 6, "id_val": 4, "val": 5, "test": 7}
    md = pd.read_csv(data_dir / "metadata.csv", index_col=0, dtype={"patient": "str"})
    val = ds.split("val")
    np.testing.assert_array_equal(val.domain, np.full(5, 1))  # hospital 1
    np.testing.assert_array_equal(ds.split("test").domain, np.full(7, 2))  # hospital 2
    assert set(ds.split("train").domain.tolist()) == {0, 3, 4}
    np.testing.assert_array_equal(val.labels, md[md.center == 1].tumor.to_numpy())
    assert val.meta["domains"][1] == "hospital 1"
    assert val.class_names == ["normal lymph node tissue", "lymph node metastasis"]
    # the item is the patch's own pixels, uint8 CHW
    row = md[md.center == 1].iloc[0]
    p, n = row.patient, row.node
    png = (data_dir / "patches" / f"patient_{p}_node_{n}"
           / f"patch_patient_{p}_node_{n}_x_{row.x_coord}_y_{row.y_coord}.png")  # fmt: skip
    x, y = val.inputs[0]
    assert x.dtype == torch.uint8 and x.shape == (3, 32, 32) and y == row.tumor
    assert torch.equal(x, _pixels(png))
    # wilds was imported without its PyPI version check (a network call in a thread)
    assert "outdated" not in sys.modules


@needs_wilds
def test_wilds_split_mapping_and_missing_data(tmp_path):
    make_camelyon17(tmp_path, size=32)
    ds = Camelyon17(root_dir=str(tmp_path), splits={"fit": "val", "target": "test"})
    assert ds.splits() == ["fit", "target"]
    assert len(ds.split("fit").inputs) == 5
    with pytest.raises(KeyError, match="available: fit, target"):
        ds.split("val")
    with pytest.raises(ValueError, match="unknown Camelyon17-WILDS split"):
        get_registry().get("dataset", "camelyon17").build(
            {"root_dir": str(tmp_path), "splits": {"fit": "validation"}})
    empty = tmp_path / "empty"
    with pytest.raises(FileNotFoundError) as info:
        Camelyon17(root_dir=str(empty)).split("val")
    msg = str(info.value)
    assert "camelyon17_v1.0/metadata.csv" in msg and "wilds.stanford.edu" in msg
    assert "download=True" in msg
    assert not empty.exists()  # nothing created, nothing downloaded


@needs_wilds
def test_rxrx1_experiments_as_domains_and_sirna_names(tmp_path):
    make_rxrx1(tmp_path, n_classes=4, size=16)
    ds = RxRx1(root_dir=str(tmp_path))
    assert ds.splits() == ["train", "val", "test", "id_test"]
    test = ds.split("test")
    names = test.meta["domains"]
    assert sorted({names[d] for d in test.domain}) == ["HUVEC-17", "RPE-05"]
    assert {names[d] for d in ds.split("val").domain} == {"HEPG2-08"}
    assert len(test.inputs) == 12 and ds.num_classes == 4
    assert test.class_names == ["s1000", "s1001", "s1002", "s1003"]
    x, y = test.inputs[3]
    assert x.shape == (3, 16, 16) and y == test.labels[3]


# --------------------------------------------------------------------------- ImageNet
@needs_torchvision
def test_imagenet_folder_geometry_and_labels(tmp_path):
    root = make_imagefolder(tmp_path / "val", per_class=2)
    ds = ImageNetVal(root=str(root), resize=40, crop=32)
    assert ds.splits() == ["val"] and ds.num_classes == 3
    val = ds.split("val")
    np.testing.assert_array_equal(val.labels, [0, 0, 1, 1, 2, 2])
    assert val.class_names == ["n01440764", "n01443537", "n01484850"]
    x, y = val.inputs[5]
    assert x.shape == (3, 32, 32) and x.dtype == torch.uint8 and y == 2
    # resize the short side to 40, centre-crop 32: torchvision's eval geometry
    from torchvision.transforms import functional as TF

    img = Image.open(sorted((root / "n01484850").iterdir())[1]).convert("RGB")
    want = TF.center_crop(TF.resize(img, 40), 32)
    assert torch.equal(x, _pixels_of(want))
    assert _class_names([f"n{i:08d}" for i in range(1000)])[:2] == ["tench", "goldfish"]


def _pixels_of(img) -> torch.Tensor:
    return torch.from_numpy(np.array(img)).permute(2, 0, 1)


def test_imagenet_missing_or_flat_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="image-net.org"):
        ImageNetVal(root=str(tmp_path / "absent")).split("val")
    flat = tmp_path / "flat"
    flat.mkdir()
    Image.new("RGB", (8, 8)).save(flat / "ILSVRC2012_val_00000001.JPEG")
    with pytest.raises(FileNotFoundError, match="no class sub-folders"):
        ImageNetVal(root=str(flat)).split("val")


# --------------------------------------------------------------------------- CIFAR
def test_cifar100_reads_the_python_release(tmp_path):
    d = make_cifar100(tmp_path, n_train=12, n_test=8)
    ds = CIFAR100(root=str(tmp_path))
    test = ds.split("test")
    with open(d / "test", "rb") as fh:
        raw = pickle.load(fh, encoding="latin1")
    np.testing.assert_array_equal(test.labels, raw["fine_labels"])
    x, _ = test.inputs[2]
    assert torch.equal(x, torch.from_numpy(raw["data"][2].reshape(3, 32, 32)))
    assert test.class_names[:2] == ["class_0", "class_1"]  # from the release's meta file
    assert len(ds.split("train").inputs) == 12
    with pytest.raises(FileNotFoundError, match="cifar-100-python.tar.gz"):
        CIFAR100(root=str(tmp_path / "none")).split("train")


@needs_torchvision
def test_augmix_is_deterministic_per_image_and_seed(tmp_path):
    make_cifar100(tmp_path)
    plain = CIFAR100(root=str(tmp_path)).split("train").inputs
    aug = CIFAR100(root=str(tmp_path), augmix_splits=["train"]).split("train").inputs
    aug2 = CIFAR100(root=str(tmp_path), augmix_splits=["train"]).split("train").inputs
    other = CIFAR100(root=str(tmp_path), augmix_splits=["train"], augmix_seed=1).split("train")
    for i in (0, 5):
        assert torch.equal(aug[i][0], aug[i][0])  # same item twice: same view
        assert torch.equal(aug[i][0], aug2[i][0])  # another instance: same view
        assert not torch.equal(aug[i][0], plain[i][0])  # augmented
        assert not torch.equal(aug[i][0], other.inputs[i][0])  # seed matters
        assert aug[i][1] == plain[i][1]
    with pytest.raises(ValueError, match="augmix_splits"):
        get_registry().get("dataset", "cifar100").build(
            {"root": str(tmp_path), "augmix_splits": ["val"]})


def test_cifar100c_sample_domains_and_rows(tmp_path):
    c_root = make_cifar100_c(tmp_path / "c", per_severity=6)
    make_cifar100(tmp_path / "clean", n_train=12, n_test=8)
    ds = get_registry().get("dataset", "cifar100-c").build(
        {"root": str(c_root), "cifar_root": str(tmp_path / "clean"), "n": 100, "val_size": 5}
    )
    assert isinstance(ds, CIFAR100C) and ds.splits() == ["val", "test"]
    test = ds.split("test")
    assert len(test.inputs) == 100 and test.domain.shape == (100,)
    labels_all = np.load(c_root / "labels.npy")
    seen = set()
    for i in range(0, 100, 7):  # every item is the row of its corruption file it claims
        c, sev = divmod(int(test.domain[i]), 5)
        arr = np.load(c_root / f"{CIFAR100_C_CORRUPTIONS[c]}.npy")
        x, y = test.inputs[i]
        hwc = x.permute(1, 2, 0).numpy()
        rows = [r for r in range(sev * 6, sev * 6 + 6) if np.array_equal(arr[r], hwc)]
        assert rows and labels_all[rows[0]] == y
        assert test.meta["domains"][int(test.domain[i])] == f"{CIFAR100_C_CORRUPTIONS[c]}-{sev + 1}"
        seen.add((c, sev, rows[0]))
    assert len(seen) == len(range(0, 100, 7))  # no duplicates among the checked
    assert len(np.unique(test.domain)) > 30  # spread over corruptions × severities
    # seeded: same seed same sample, other seed another
    again = CIFAR100C(root=str(c_root), cifar_root=str(tmp_path / "clean"), n=100).split("test")
    np.testing.assert_array_equal(again.domain, test.domain)
    other = CIFAR100C(root=str(c_root), cifar_root=str(tmp_path / "clean"), n=100, seed=1)
    assert not np.array_equal(other.split("test").domain, test.domain)
    val = ds.split("val")
    assert len(val.inputs) == 5 and val.domain is None
    assert val.class_names == test.class_names


def test_cifar100c_options_and_errors(tmp_path):
    c_root = make_cifar100_c(tmp_path / "c", per_severity=4, corruptions=("fog", "snow"))
    ds = CIFAR100C(root=str(c_root), corruptions=["fog", "snow"], severities=[5], n=8)
    test = ds.split("test")
    assert sorted(set(test.domain.tolist())) == [4, 9]  # severity 5 of fog (0) and snow (1)
    assert test.class_names == list(CIFAR100_CLASSES)  # no clean CIFAR meta: standard names
    with pytest.raises(ValueError, match="exceeds the 8 CIFAR-100-C images"):
        CIFAR100C(root=str(c_root), corruptions=["fog", "snow"], severities=[5], n=9).split("test")
    with pytest.raises(FileNotFoundError, match="zenodo"):
        CIFAR100C(root=str(c_root), n=8).split("test")  # the other 13 corruptions are absent
    np.save(c_root / "snow.npy", np.zeros((20, 32, 32), dtype=np.uint8))
    with pytest.raises(ValueError, match="snow.npy"):
        CIFAR100C(root=str(c_root), corruptions=["fog", "snow"], n=8).split("test")
    with pytest.raises(FileNotFoundError, match="cifar-100-python"):
        CIFAR100C(root=str(c_root), cifar_root=str(tmp_path / "none")).split("val")


# --------------------------------------------------------------------------- optional extra
VISION_MODULES = [
    "datasets/wilds_data.py", "datasets/imagenet.py", "datasets/cifar.py",
    "datasets/precomputed.py", "backbones/extract.py", "backbones/torchvision_nets.py",
    "backbones/wilds_nets.py", "backbones/clip.py",
]  # fmt: skip


@pytest.mark.parametrize("rel", VISION_MODULES)
def test_optional_packages_are_imported_lazily(rel):
    """No module-level import of torchvision / wilds / open_clip, so ``import
    selbench_plugins`` (and the registry) work without the vision extra."""
    import ast
    from pathlib import Path

    import selbench_plugins

    path = Path(selbench_plugins.__file__).parent / rel
    for node in ast.parse(path.read_text()).body:
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        for name in names:
            assert name.split(".")[0] not in ("torchvision", "wilds", "open_clip"), (rel, name)


def test_missing_extra_names_the_install_command(tmp_path, monkeypatch):
    for mod in ("wilds", "torchvision", "torchvision.datasets", "torchvision.transforms"):
        monkeypatch.setitem(sys.modules, mod, None)  # import now raises ImportError
    with pytest.raises(ImportError, match=r"install selbench\[vision\]"):
        Camelyon17(root_dir=str(tmp_path), download=True).split("val")
    root = make_imagefolder(tmp_path / "val", per_class=1)
    with pytest.raises(ImportError, match=r"pip install 'selbench\[vision\]'"):
        ImageNetVal(root=str(root)).split("val")


# --------------------------------------------------------------------------- declared inputs
# (plugin kind, name) -> {param: (kind, metadata globs, must_exist)}
DECLARED = {
    ("dataset", "precomputed"): {"path": ("file", (), True)},
    ("dataset", "camelyon17"): {"root_dir": ("dir", ("metadata.csv", "RELEASE_v*.txt"), False)},
    ("dataset", "rxrx1"): {"root_dir": ("dir", ("metadata.csv", "RELEASE_v*.txt"), False)},
    ("dataset", "imagenet"): {"root": ("dir", (), True)},
    ("dataset", "cifar100"): {"root": ("dir", (
        "cifar-100-python/train", "cifar-100-python/test", "cifar-100-python/meta"), False)},
    ("dataset", "cifar100-c"): {
        "root": ("dir", ("labels.npy",), True),
        "cifar_root": ("dir", (
            "cifar-100-python/train", "cifar-100-python/test", "cifar-100-python/meta"), False),
    },
    ("dataset", "digits"): {},
    ("dataset", "theory-mixture"): {},
    ("dataset", "calarena"): {"folder": ("dir", ("*-experiments.csv",), True)},
    ("dataset", "fd-shifts"): {"folder": ("dir", (
        "raw_logits.npz", "raw_output.npz", "encoded_output.npz",
        "test_results/raw_logits.npz", "test_results/raw_output.npz",
        "test_results/encoded_output.npz"), True)},
    ("backbone", "resnet34"): {"weights_file": ("file", (), True)},
    ("backbone", "wilds-densenet121"): {"checkpoint": ("file", (), True)},
    ("backbone", "wilds-resnet50"): {"checkpoint": ("file", (), True)},
    ("backbone", "clip"): {
        "model_dir": ("dir", ("*.json", "*.txt", "*.safetensors", "*.bin", "*.pt", "*.pth"),
                      True),
        "pretrained_file": ("file", (), True),
        "cache_dir": ("dir", ("*.pt", "*.pth", "*/refs/*"), True),
    },
    ("dataset", "labelled-sentences"): {"folder": ("dir", ("*",), True)},
    ("backbone", "sentence-encoder"): {"model_dir": ("dir", ("*",), True)},
    ("backbone", "precomputed"): {},
    ("backbone", "digits-net"): {},
    ("backbone", "theory-linear"): {},
}  # fmt: skip


def test_every_file_parameter_is_a_declared_input():
    from selbench.contract.inputs import declared_inputs

    reg = get_registry()
    builtin = {(k, e.name) for k in ("dataset", "backbone") for e in reg.all(k)
               if e.provider == "selbench_plugins"}  # fmt: skip
    assert builtin == set(DECLARED)
    for (kind, name), want in DECLARED.items():
        got = declared_inputs(reg.get(kind, name).plugin.params)
        assert {p: (s.kind, s.metadata, s.must_exist) for p, s in got.items()} == want, name


def _spec_with(dataset: dict, backbone: dict) -> dict:
    return {
        "spec_version": 1, "name": "inputs", "seeds": [0],
        "experiments": [{
            "name": "e", "dataset": dataset, "backbone": backbone, "fit_split": "val",
            "eval_split": "test", "n_fit": 4, "betas": [0.5, 1.0], "train_beta": 0.5,
            "methods": [{"label": "None", "scheme": {"name": "recalibration"}}],
        }],
    }  # fmt: skip


def test_relative_input_paths_resolve_against_the_spec_folder(tmp_path, monkeypatch):
    import yaml
    from selbench.spec import load_spec

    project = tmp_path / "project"
    make_cifar100(project / "clean", n_train=12, n_test=8)
    make_cifar100_c(project / "c", per_severity=2, corruptions=("fog",))
    (project / "ckpt").mkdir()
    torch.save({}, project / "ckpt" / "r34.pth")
    spec = _spec_with(
        {"name": "cifar100-c", "params": {"root": "c", "cifar_root": "./clean",
                                          "corruptions": ["fog"], "n": 6, "val_size": 4}},
        {"name": "resnet34", "params": {"weights": "ckpt/r34.pth"}},  # an older spec's form
    )  # fmt: skip
    (project / "spec.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(tmp_path)  # not the spec's folder
    resolved = load_spec(project / "spec.yaml")
    exp = resolved.canonical()["experiments"][0]
    assert exp["dataset"]["params"]["root"] == str(project / "c")
    assert exp["dataset"]["params"]["cifar_root"] == str(project / "clean")
    assert exp["backbone"]["params"]["weights"] is None
    assert exp["backbone"]["params"]["weights_file"] == str(project / "ckpt" / "r34.pth")
    ds = resolved.build("dataset", resolved.spec.experiments[0].dataset)
    assert len(ds.split("val").inputs) == 4 and len(ds.split("test").inputs) == 6
    backbone = resolved.build("backbone", resolved.spec.experiments[0].backbone)
    assert backbone.weights_file == str(project / "ckpt" / "r34.pth")


def test_only_downloadable_data_may_be_missing_at_validation(tmp_path):
    from selbench.spec import SpecError, load_spec

    absent = str(tmp_path / "absent")
    net = {"name": "resnet34", "params": {"weights": None}}
    for name, key in (("cifar100", "root"), ("camelyon17", "root_dir"), ("rxrx1", "root_dir")):
        load_spec(_spec_with({"name": name, "params": {key: absent}}, net))  # download may
    images = {"name": "cifar100", "params": {"root": absent}}
    for dataset, backbone, where in [
        ({"name": "cifar100-c", "params": {"root": absent}}, net, "dataset.params.root"),
        ({"name": "imagenet", "params": {"root": absent}}, net, "dataset.params.root"),
        ({"name": "precomputed", "params": {"path": absent}}, {"name": "precomputed"},
         "dataset.params.path"),
        (images, {"name": "wilds-resnet50", "params": {"checkpoint": absent}},
         "backbone.params.checkpoint"),
        (images, {"name": "resnet34", "params": {"weights_file": absent}},
         "backbone.params.weights_file"),
        (images, {"name": "clip", "params": {"cache_dir": absent}}, "backbone.params.cache_dir"),
        (images, {"name": "clip", "params": {"model": f"local-dir:{absent}"}},
         "backbone.params.model_dir"),
    ]:  # fmt: skip
        with pytest.raises(SpecError, match=rf"experiments\[0\]\.{where}: no such"):
            load_spec(_spec_with(dataset, backbone))


def test_weight_names_and_weight_files_are_separate_parameters():
    from pydantic import ValidationError

    ClipParams = get_registry().get("backbone", "clip").plugin.params
    ResNet34Params = get_registry().get("backbone", "resnet34").plugin.params

    def dump(params_model, **params):
        return params_model.model_validate(params).model_dump()

    assert dump(ResNet34Params)["weights"] == "IMAGENET1K_V1"
    p = dump(ResNet34Params, weights="IMAGENET1K_V2")
    assert (p["weights"], p["weights_file"]) == ("IMAGENET1K_V2", None)
    for path in ("ckpt/r.pth", "r.pth", "~/r.pt", "/abs/weights"):
        p = dump(ResNet34Params, weights=path)  # older specs: a path in weights
        assert (p["weights"], p["weights_file"]) == (None, path)
    p = dump(ResNet34Params, weights_file="r.pth")
    assert (p["weights"], p["weights_file"]) == (None, "r.pth")
    assert dump(ResNet34Params, **p) == p  # validating the canonical form changes nothing
    with pytest.raises(ValidationError, match="either weights"):
        dump(ResNet34Params, weights="IMAGENET1K_V1", weights_file="r.pth")

    p = dump(ClipParams, pretrained="laion2b_s34b_b79k")
    assert (p["pretrained"], p["pretrained_file"], p["model_dir"]) == (
        "laion2b_s34b_b79k", None, None)
    p = dump(ClipParams, pretrained="ckpt/clip.pt")
    assert (p["pretrained"], p["pretrained_file"]) == (None, "ckpt/clip.pt")
    p = dump(ClipParams, model="local-dir:models/tiny")
    assert (p["model"], p["model_dir"], p["pretrained"]) == ("local-dir", "models/tiny", None)
    assert dump(ClipParams, **p) == p
    assert dump(ClipParams, model_dir="models/tiny") == p
    with pytest.raises(ValidationError, match="either model"):
        dump(ClipParams, model="ViT-B-32", model_dir="models/tiny")
    with pytest.raises(ValidationError, match="pretrained_file cannot be used"):
        dump(ClipParams, model_dir="models/tiny", pretrained_file="w.pt")
