"""The image backbones (random-init weights, tiny fixtures) and the runner end to end:
dataset -> backbone -> cached outputs -> fitted methods -> leaderboard."""

from __future__ import annotations

import importlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_vision import (
    HAS,
    make_camelyon17,
    make_cifar100,
    make_cifar100_c,
    make_imagefolder,
    make_rxrx1,
    make_tiny_clip,
    needs_open_clip,
    needs_torchvision,
    needs_wilds,
)
from selbench.contract.api import FitContext, SplitData
from selbench_plugins.backbones.clip import ClipZeroShot
from selbench_plugins.backbones.extract import IMAGENET_MEAN, IMAGENET_STD, extract_outputs
from selbench_plugins.backbones.torchvision_nets import ResNet34, hub_weights_path
from selbench_plugins.backbones.wilds_nets import WildsDenseNet121, WildsResNet50
from selbench_plugins.datasets.cifar import CIFAR100C
from selbench_plugins.datasets.imagenet import ImageNetVal
from selbench_plugins.datasets.wilds_data import Camelyon17, RxRx1

#: torchvision, for the reference networks (the tests that use it are marked needs_torchvision)
tv = importlib.import_module("torchvision") if HAS["torchvision"] else None
CTX = FitContext(seed=0, device="cpu")


pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.vision]
LOADER = {"num_workers": 0, "batch_size": 4}


def _batch(items) -> torch.Tensor:
    return torch.stack([items[i][0] for i in range(len(items))]).float() / 255.0


def _imagenet_norm(x: torch.Tensor) -> torch.Tensor:
    m = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    s = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (x - m) / s


def _reference(model: torch.nn.Module, head: str, x: torch.Tensor):
    model.eval()
    last = getattr(model, head)
    setattr(model, head, torch.nn.Identity())
    with torch.no_grad():
        f = model(x)
        z = last(f)
    setattr(model, head, last)
    return f.numpy(), z.numpy()


@pytest.fixture
def imagenet_ds(tmp_path) -> ImageNetVal:
    return ImageNetVal(root=str(make_imagefolder(tmp_path / "val", per_class=2)), resize=36,
                       crop=32)  # fmt: skip


# --------------------------------------------------------------------------- resnet34
@needs_torchvision
def test_resnet34_random_init_matches_torchvision(imagenet_ds):
    out = ResNet34(weights=None, **LOADER).extract(imagenet_ds, "val", CTX)
    assert out.features.shape == (6, 512) and out.logits.shape == (6, 3)
    assert out.features.dtype == np.float32 and out.logits.dtype == np.float32
    np.testing.assert_array_equal(out.labels, [0, 0, 1, 1, 2, 2])
    torch.manual_seed(0)
    ref = tv.models.resnet34(weights=None, num_classes=3)
    f, z = _reference(ref, "fc", _imagenet_norm(_batch(imagenet_ds.split("val").inputs)))
    np.testing.assert_allclose(out.features, f, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out.logits, z, rtol=1e-4, atol=1e-5)
    again = ResNet34(weights=None, num_workers=0, batch_size=5).extract(imagenet_ds, "val", CTX)
    np.testing.assert_allclose(again.logits, out.logits, rtol=1e-5, atol=1e-6)


@needs_torchvision
def test_resnet34_reads_the_hub_cache_and_never_downloads(imagenet_ds, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    enum = tv.models.ResNet34_Weights.IMAGENET1K_V1
    with pytest.raises(FileNotFoundError) as info:
        ResNet34(**LOADER).extract(imagenet_ds, "val", CTX)
    assert enum.url in str(info.value)
    assert str(hub_weights_path(enum)) in str(info.value)
    assert not hub_weights_path(enum).exists()  # nothing was downloaded
    # a file at the cache location is used as the IMAGENET1K_V1 weights, 1000 classes
    torch.manual_seed(7)
    net = tv.models.resnet34(weights=None)
    hub_weights_path(enum).parent.mkdir(parents=True)
    torch.save(net.state_dict(), hub_weights_path(enum))
    out = ResNet34(**LOADER).extract(imagenet_ds, "val", CTX)
    _, z = _reference(net, "fc", _imagenet_norm(_batch(imagenet_ds.split("val").inputs)))
    assert out.logits.shape == (6, 1000)
    np.testing.assert_allclose(out.logits, z, rtol=1e-4, atol=1e-5)
    # ... and a state-dict path works the same way
    small = tv.models.resnet34(weights=None, num_classes=5)
    torch.save(small.state_dict(), tmp_path / "mine.pth")
    assert ResNet34(weights=str(tmp_path / "mine.pth"), **LOADER).extract(
        imagenet_ds, "val", CTX).logits.shape == (6, 5)  # fmt: skip
    with pytest.raises(ValueError, match="unknown weights 'IMAGENET9K'"):
        ResNet34(weights="IMAGENET9K").build(3)


# --------------------------------------------------------------------------- WILDS models
def _wilds_checkpoint(path: Path, state: dict, fmt: str, head: str) -> Path:
    if fmt == "erm":
        algo = {f"model.{k}": v for k, v in state.items()}
    elif fmt == "data-parallel":
        algo = {f"model.module.{k}": v for k, v in state.items()}
    elif fmt == "featurizer-classifier":
        algo = {(f"model.1.{k[len(head) + 1:]}" if k.startswith(head + ".") else f"model.0.{k}"): v
                for k, v in state.items()}  # fmt: skip
    else:
        torch.save(state, path)
        return path
    torch.save({"algorithm": algo, "epoch": 4, "best_val_metric": np.float64(0.93)}, path)
    return path


@needs_torchvision
def test_wilds_densenet121_loads_every_checkpoint_layout(tmp_path):
    make_camelyon17(tmp_path / "data", counts=(2, 2, 5, 2), size=32)
    ds = Camelyon17(root_dir=str(tmp_path / "data"))
    torch.manual_seed(3)
    net = tv.models.densenet121(weights=None, num_classes=2)
    state = net.state_dict()
    path = _wilds_checkpoint(tmp_path / "best_model.pth", state, "erm", "classifier")
    out = WildsDenseNet121(checkpoint=str(path), **LOADER).extract(ds, "val", CTX)
    assert out.features.shape == (5, 1024) and out.logits.shape == (5, 2)
    np.testing.assert_array_equal(out.domain, np.full(5, 1))
    f, z = _reference(net, "classifier", _imagenet_norm(_batch(ds.split("val").inputs)))
    np.testing.assert_allclose(out.features, f, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out.logits, z, rtol=1e-4, atol=1e-5)
    for fmt in ("data-parallel", "featurizer-classifier", "bare"):
        p = _wilds_checkpoint(tmp_path / f"{fmt}.pth", state, fmt, "classifier")
        loaded = WildsDenseNet121(checkpoint=str(p)).build().state_dict()
        assert all(torch.equal(loaded[k], v) for k, v in state.items()), fmt


@needs_torchvision
def test_wilds_checkpoint_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="worksheets.codalab.org"):
        WildsDenseNet121(checkpoint=str(tmp_path / "absent.pth")).build()
    resnet = tv.models.resnet18(weights=None, num_classes=2).state_dict()
    p = _wilds_checkpoint(tmp_path / "r.pth", resnet, "erm", "fc")
    with pytest.raises(ValueError, match="no 'classifier.weight'"):
        WildsDenseNet121(checkpoint=str(p)).build()
    with pytest.raises(ValueError, match="does not fit torchvision's resnet50"):
        WildsResNet50(checkpoint=str(p)).build()  # a ResNet-18 is not a ResNet-50


@needs_torchvision
def test_wilds_resnet50_standardizes_each_image(tmp_path):
    make_rxrx1(tmp_path / "data", n_classes=4, size=32)
    ds = RxRx1(root_dir=str(tmp_path / "data"))
    torch.manual_seed(5)
    net = tv.models.resnet50(weights=None, num_classes=4)
    path = _wilds_checkpoint(tmp_path / "rx.pth", net.state_dict(), "erm", "fc")
    out = WildsResNet50(checkpoint=str(path), **LOADER).extract(ds, "val", CTX)
    x = _batch(ds.split("val").inputs)
    x = (x - x.mean(dim=(2, 3), keepdim=True)) / x.std(dim=(2, 3), keepdim=True)
    f, z = _reference(net, "fc", x)
    assert out.features.shape == (8, 2048)
    np.testing.assert_allclose(out.logits, z, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.features, f, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- CLIP
@pytest.fixture
def cifar_c(tmp_path) -> CIFAR100C:
    make_cifar100(tmp_path / "clean", n_train=12, n_test=4)
    c_root = make_cifar100_c(tmp_path / "c", per_severity=4)
    return CIFAR100C(root=str(c_root), cifar_root=str(tmp_path / "clean"), n=60, val_size=12)


@needs_open_clip
def test_clip_zero_shot_logits_are_scaled_cosines(tmp_path, cifar_c):
    model = make_tiny_clip(tmp_path)
    clip = ClipZeroShot(model=model, pretrained=None, **LOADER)
    out = clip.extract(cifar_c, "val", CTX)
    assert out.features.shape == (12, 16) and out.logits.shape == (12, 100)
    np.testing.assert_allclose(np.linalg.norm(out.features, axis=1), 1.0, atol=1e-5)
    text = clip.text_embeddings(cifar_c.split("val").class_names, torch.device("cpu")).numpy()
    scale = float(clip.build().logit_scale.detach().exp())
    np.testing.assert_allclose(out.logits, scale * out.features @ text.T, rtol=1e-4, atol=1e-4)
    # seeded init, and the prompt matters
    same = ClipZeroShot(model=model, pretrained=None, **LOADER).extract(cifar_c, "val", CTX)
    np.testing.assert_allclose(same.logits, out.logits, rtol=1e-5, atol=1e-6)
    other = ClipZeroShot(model=model, pretrained=None, template="itap of a {}.", **LOADER)
    assert not np.allclose(other.extract(cifar_c, "val", CTX).logits, out.logits)


def _in_row_ranges(backbone, dataset, split, bounds):
    """``backbone``'s outputs of ``split`` extracted range by range (``FitContext.rows``)."""
    return [backbone.extract(dataset, split, FitContext(seed=0, device="cpu", rows=r))
            for r in zip(bounds[:-1], bounds[1:])]


def _assert_concatenation_is_whole(parts, whole) -> None:
    for name in ("features", "logits", "labels", "domain"):
        got = [getattr(p, name) for p in parts]
        want = getattr(whole, name)
        if want is None:
            assert all(g is None for g in got), name
            continue
        np.testing.assert_array_equal(np.concatenate(got), want, err_msg=name)  # bit for bit
    assert all(p.meta == whole.meta for p in parts)  # meta describes the whole split


@needs_torchvision
@pytest.mark.parametrize("bounds", [(0, 2, 4, 6), (0, 4, 6)])
def test_row_ranges_of_a_split_are_the_whole_split_bit_for_bit(imagenet_ds, bounds):
    """The image backbones declare shardable: rows [a, b) extracted alone (a a multiple of
    the batch size) are exactly those rows of a whole-split extraction."""
    net = ResNet34(weights=None, num_workers=0, batch_size=2)
    assert type(net).shardable
    whole = net.extract(imagenet_ds, "val", CTX)
    _assert_concatenation_is_whole(_in_row_ranges(net, imagenet_ds, "val", bounds), whole)
    with pytest.raises(ValueError, match=r"rows \[4, 9\) are not inside the split's 6 items"):
        net.extract(imagenet_ds, "val", FitContext(seed=0, device="cpu", rows=(4, 9)))


@needs_open_clip
def test_clip_row_ranges_are_the_whole_split(tmp_path, cifar_c):
    clip = ClipZeroShot(model=make_tiny_clip(tmp_path), pretrained=None, **LOADER)
    whole = clip.extract(cifar_c, "val", CTX)
    _assert_concatenation_is_whole(_in_row_ranges(clip, cifar_c, "val", (0, 4, 8, 12)), whole)


@needs_torchvision
def test_augmented_outputs_do_not_depend_on_loader_workers(tmp_path):
    """AugMix views are seeded per image, so worker processes change nothing."""
    make_cifar100(tmp_path / "clean", n_train=8, n_test=2)
    ds = CIFAR100C(root=str(tmp_path / "none"), cifar_root=str(tmp_path / "clean"), val_size=8,
                   augmix_splits=["val"])  # fmt: skip
    model = make_tiny_clip(tmp_path)
    outs = [ClipZeroShot(model=model, pretrained=None, num_workers=w, batch_size=3)
            .extract(ds, "val", CTX) for w in (0, 2)]  # fmt: skip
    np.testing.assert_array_equal(outs[0].logits, outs[1].logits)
    plain = CIFAR100C(root=str(tmp_path / "none"), cifar_root=str(tmp_path / "clean"), val_size=8)
    clean = ClipZeroShot(model=model, pretrained=None, **LOADER).extract(plain, "val", CTX)
    assert not np.allclose(clean.logits, outs[0].logits)


@needs_open_clip
def test_clip_never_downloads_weights(tmp_path):
    clip = ClipZeroShot(model="ViT-B-32", pretrained="openai", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError) as info:
        clip.build()
    msg = str(info.value)
    assert "open_clip.create_model('ViT-B-32', pretrained='openai')" in msg
    assert "timm/vit_base_patch32_clip_224.openai" in msg
    assert not any((tmp_path / "cache").rglob("*"))  # nothing fetched
    with pytest.raises(ValueError, match="tags: openai"):
        ClipZeroShot(model="ViT-B-32", pretrained="no-such-tag").build()
    with pytest.raises(ValueError, match="local-dir"):
        ClipZeroShot(model="hf-hub:org/model").build()


def test_clip_needs_class_names():
    class NoNames:
        num_classes = 2

        def split(self, name):
            return SplitData(inputs=[], labels=np.zeros(0, dtype=np.int64))

    with pytest.raises(ValueError, match="no class names"):
        ClipZeroShot(pretrained=None).extract(NoNames(), "val", CTX)


# --------------------------------------------------------------------------- extraction
@needs_torchvision
def test_extraction_fails_fast_on_missing_files_and_bad_inputs(tmp_path, imagenet_ds):
    first = min(Path(imagenet_ds.root).rglob("*.JPEG"))
    imagenet_ds.split("val")  # indexed while the file existed
    os.remove(first)
    with pytest.raises(FileNotFoundError):
        ResNet34(weights=None, **LOADER).extract(imagenet_ds, "val", CTX)

    class Arrays:
        num_classes = 2

        def split(self, name):
            return SplitData(inputs=5, labels=np.zeros(3, dtype=np.int64))

    with pytest.raises(TypeError, match="torch Dataset of \\(image, label\\) items"):
        ResNet34(weights=None, **LOADER).extract(Arrays(), "val", CTX)


@needs_torchvision
def test_extraction_checks_labels(imagenet_ds):
    class Shuffled:
        num_classes = 3

        def split(self, name):
            data = imagenet_ds.split("val")
            return SplitData(inputs=data.inputs, labels=data.labels[::-1].copy())

    with pytest.raises(ValueError, match="differ from split.labels"):
        extract_outputs(Shuffled(), "val", CTX, lambda x: (x.float().mean((2, 3)),) * 2,
                        batch_size=4, num_workers=0, amp=True, name="t")  # fmt: skip


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_mixed_precision_matches_float32(imagenet_ds):
    gpu = FitContext(seed=0, device="cuda")
    amp = ResNet34(weights=None, **LOADER).extract(imagenet_ds, "val", gpu)
    fp32 = ResNet34(weights=None, amp=False, **LOADER).extract(imagenet_ds, "val", CTX)
    assert amp.logits.dtype == np.float32
    np.testing.assert_allclose(amp.logits, fp32.logits, rtol=0.05, atol=0.05)
    np.testing.assert_array_equal(amp.labels, fp32.labels)


# --------------------------------------------------------------------------- end to end
METHODS = [
    {"label": "Temp. scaling", "scheme": {"name": "recalibration"},
     "recalibrator": {"name": "temperature"}},
    {"label": "Confidence", "scheme": {"name": "recalibration"},
     "recalibrator": {"name": "temperature"}, "selector": {"name": "confidence"}},
    {"label": "S-TLBCE joint", "scheme": {"name": "joint",
                                          "params": {"epochs": 2, "batch_size": 4}},
     "selector": {"name": "mlp", "params": {"hidden": [8]}},
     "recalibrator": {"name": "temperature"}, "loss": {"name": "s-tlbce"},
     "coverage": {"name": "quadratic", "params": {"lam": 8}}},
]  # fmt: skip


def _run_e2e(tmp_path, experiment: dict, data_dirs: list[Path], n_methods: int = 3):
    from selbench.execution.runner import RunError, run

    spec = {
        "spec_version": 1, "name": "vision-e2e", "seeds": [0], "device": "cpu",
        "experiments": [{"name": "e2e", "betas": [0.5, 1.0], "train_beta": 0.5,
                         "methods": METHODS[:n_methods], **experiment}],
    }  # fmt: skip
    report = run(spec, out_dir=tmp_path / "out", progress=False, plots=False)
    assert report.computed == n_methods
    board = json.loads((tmp_path / "out" / "leaderboard.json").read_text())
    text = json.dumps(board)
    assert all(m["label"] in text for m in METHODS[:n_methods])
    cache = Path(os.environ["SELBENCH_CACHE_DIR"]) / "outputs"
    cached = sorted(cache.glob("*.npz"))
    splits = {experiment["fit_split"], experiment["eval_split"]}
    assert len(cached) == len(splits)
    for f in cached:
        with np.load(f) as z:
            assert z["features"].dtype == np.float32 and z["logits"].dtype == np.float32
    # a fresh run (new results folder) on unchanged data comes from the output cache
    stamps = {f: f.stat().st_mtime_ns for f in cached}
    again = run(spec, out_dir=tmp_path / "out2", progress=False, plots=False)
    assert again.computed == n_methods
    assert sorted(cache.glob("*.npz")) == cached
    assert {f: f.stat().st_mtime_ns for f in cached} == stamps
    # the data changes (a file added to each data folder): its content key changes, so the
    # outputs are extracted again rather than served stale from the cache
    for d in data_dirs:
        (Path(d) / "added-later.txt").write_text("x")
    third = run(spec, out_dir=tmp_path / "out3", progress=False, plots=False)
    assert third.computed == n_methods
    assert len(set(cache.glob("*.npz")) - set(cached)) == len(splits)
    # without its data the spec is refused before any work, naming the missing input
    for d in data_dirs:
        shutil.rmtree(d)
    from selbench.spec import SpecError

    try:
        run(spec, out_dir=tmp_path / "out4", progress=False, plots=False)
    except SpecError as exc:
        assert any("no such folder" in e for e in exc.errors)
    except RunError as exc:  # inputs the plugin may create itself (download: true)
        assert "never downloads" in str(exc)
    else:
        raise AssertionError("a run without its data must fail")
    return board


@needs_torchvision
@needs_wilds
def test_e2e_camelyon17_densenet(tmp_path):
    data = tmp_path / "wilds"
    make_camelyon17(data, counts=(2, 2, 16, 12), size=32)
    torch.manual_seed(0)
    net = tv.models.densenet121(weights=None, num_classes=2)
    ckpt = _wilds_checkpoint(tmp_path / "best_model.pth", net.state_dict(), "erm", "classifier")
    _run_e2e(tmp_path, {
        "dataset": {"name": "camelyon17", "params": {"root_dir": str(data)}},
        "backbone": {"name": "wilds-densenet121",
                     "params": {"checkpoint": str(ckpt), **LOADER}},
        "fit_split": "val", "eval_split": "test", "n_fit": 12,
    }, [data], n_methods=2)  # fmt: skip


@needs_torchvision
@needs_wilds
def test_e2e_rxrx1_resnet50(tmp_path):
    data = tmp_path / "wilds"
    make_rxrx1(data, n_classes=4, size=32)
    net = tv.models.resnet50(weights=None, num_classes=4)
    ckpt = _wilds_checkpoint(tmp_path / "best_model.pth", net.state_dict(), "erm", "fc")
    _run_e2e(tmp_path, {
        "dataset": {"name": "rxrx1", "params": {"root_dir": str(data)}},
        "backbone": {"name": "wilds-resnet50", "params": {"checkpoint": str(ckpt), **LOADER}},
        "fit_split": "val", "eval_split": "test", "n_fit": 8,
    }, [data], n_methods=2)  # fmt: skip


@needs_torchvision
def test_e2e_imagenet_resnet34(tmp_path):
    root = make_imagefolder(tmp_path / "val", per_class=6)
    _run_e2e(tmp_path, {
        "dataset": {"name": "imagenet", "params": {"root": str(root), "resize": 36, "crop": 32}},
        "backbone": {"name": "resnet34", "params": {"weights": None, **LOADER}},
        "fit_split": "val", "eval_split": "val", "n_fit": 8,
    }, [root])  # fmt: skip


@needs_open_clip
def test_e2e_cifar100c_clip(tmp_path):
    make_cifar100(tmp_path / "clean", n_train=16, n_test=4)
    c_root = make_cifar100_c(tmp_path / "c", per_severity=4)
    model = make_tiny_clip(tmp_path)
    _run_e2e(tmp_path, {
        "dataset": {"name": "cifar100-c", "params": {
            "root": str(c_root), "cifar_root": str(tmp_path / "clean"), "n": 40, "val_size": 16,
            "augmix_splits": ["val"]}},
        "backbone": {"name": "clip", "params": {"model": model, "pretrained": None, **LOADER}},
        "fit_split": "val", "eval_split": "test", "n_fit": 12,
    }, [tmp_path / "clean", c_root])  # fmt: skip


# --------------------------------------------------------------------------- specs/paper.yaml
PAPER = Path(__file__).resolve().parents[1] / "specs" / "paper.yaml"


def _paper_with_placeholder_inputs(tmp_path: Path) -> Path:
    """specs/paper.yaml copied into ``tmp_path`` with an empty placeholder at every data and
    checkpoint path it names (relative paths resolve against the spec's folder)."""
    from selbench.spec import SpecError, load_spec

    spec = tmp_path / "paper.yaml"
    spec.write_text(PAPER.read_text())
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    for line in info.value.errors:
        kind, _, path = line.partition(": no such ")[2].partition(": ")
        assert kind in ("file", "folder"), line
        if kind == "folder":
            Path(path).mkdir(parents=True, exist_ok=True)
        else:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).touch()
    return spec


def test_paper_spec_is_valid_and_follows_appendix_a(tmp_path):
    from selbench.spec import load_spec

    path = _paper_with_placeholder_inputs(tmp_path)
    full = load_spec(path).spec  # with its optional block of the methods beyond the paper
    assert [e.name for e in full.experiments if e.optional] == ["cifar100-c-beyond"]
    spec = load_spec(path, optional=False).spec
    exps = {e.name: e for e in spec.experiments}
    assert list(exps) == ["camelyon17", "imagenet", "rxrx1", "cifar100-c"]
    assert {k: e.n_fit for k, e in exps.items()} == {
        "camelyon17": 1000, "imagenet": 2000, "rxrx1": 1000, "cifar100-c": 2000}
    for name in ("camelyon17", "imagenet"):
        e = exps[name]
        assert e.betas == [0.75, 0.8, 0.85, 0.9] and e.train_beta == "per_beta"
        joint = next(m for m in e.methods if m.label == "S-TLBCE joint")
        assert joint.selector.params == {"hidden": [128, 128]}
        assert joint.coverage.params == {"lam": 32}
        assert joint.scheme.params["epochs"] == 1000
    assert exps["imagenet"].methods[-1].scheme.params["lr"] == pytest.approx(1e-5)
    for name in ("rxrx1", "cifar100-c"):
        e = exps[name]
        assert e.report == "auc" and e.train_beta == 0.5 and len(e.betas) == 11
        labels = [m.label for m in e.methods]
        for row in ("Confidence", "One-class SVM", "Iso. Forest", "S-MCE sequential",
                    "S-MCE joint", "S-MMCE sequential", "S-MMCE joint", "S-TLBCE sequential",
                    "S-TLBCE joint"):  # fmt: skip
            assert row in labels, (name, row)
        seq = next(m for m in e.methods if m.label == "S-TLBCE sequential")
        assert seq.selector.params == {"hidden": [64]} and seq.coverage.params == {"lam": 8}
        assert seq.scheme.params["epochs"] == 50
    noise = [m.scheme.params.get("noise_std") for m in exps["rxrx1"].methods]
    assert 1.0 in noise
    assert exps["cifar100-c"].dataset.params["augmix_splits"] == ["val"]


def test_paper_spec_without_data_fails_fast_with_instructions(tmp_path, capsys):
    """Without the data the spec is refused before any work (exit 2), every missing data
    folder and checkpoint named with its YAML path, resolved against the spec's folder."""
    from selbench.cli import main

    assert main(["run", str(PAPER), "--out", str(tmp_path / "out"), "--device", "cpu",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
    specs = PAPER.parent
    assert f"experiments[0].backbone.params.checkpoint: no such file: {specs}/checkpoints/" in err
    assert f"experiments[1].dataset.params.root: no such folder: {specs}/data/imagenet/val" in err
