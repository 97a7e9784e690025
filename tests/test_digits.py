"""The embedded default benchmark: the ``digits`` dataset and the ``digits-net`` backbone."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from selbench.contract.api import FitContext, params_model
from selbench.contract.registry import get_registry
from selbench.measure.metrics import ece
from selbench_plugins.backbones.digits_net import DigitsNet
from selbench_plugins.datasets.digits import (
    CORRUPTIONS,
    DEFAULT_CORRUPTIONS,
    Digits,
    _rotate,
    corrupt,
    domain_id,
    domain_names,
)


@pytest.fixture(scope="module")
def digits() -> Digits:
    return Digits()


@pytest.fixture(scope="module")
def trained(digits):
    """The default backbone and its outputs on every split (trained once, ~1-2 s)."""
    backbone = DigitsNet()
    ctx = FitContext(seed=0, device="cpu")
    return backbone, {s: backbone.extract(digits, s, ctx) for s in digits.splits()}


# ---------------------------------------------------------------------------- dataset
def test_clean_splits_partition_the_real_digits(digits):
    from sklearn.datasets import load_digits

    bunch = load_digits()
    sizes = {}
    rows, labels = [], []
    for name in ("train", "val", "test"):
        s = digits.split(name)
        assert s.inputs.dtype == np.float32 and s.inputs.shape[1:] == (1, 8, 8)
        assert s.labels.dtype == np.int64 and s.labels.shape == (len(s.inputs),)
        assert s.inputs.min() == 0.0 and s.inputs.max() == 1.0
        assert np.array_equal(s.domain, np.zeros(len(s.labels)))
        sizes[name] = len(s.labels)
        rows.append(s.inputs.reshape(len(s.inputs), -1))
        labels.append(s.labels)
        # stratified: each class's share within one example of the split's share
        expected = np.bincount(bunch.target, minlength=10) * len(s.labels) / len(bunch.target)
        assert np.all(np.abs(np.bincount(s.labels, minlength=10) - expected) <= 1.0)
    assert sizes == {"train": 719, "val": 539, "test": 539}
    # together the three splits are exactly the 1797 images (as a multiset), images / 16
    ours = np.column_stack([np.concatenate(rows), np.concatenate(labels)])
    ref = np.column_stack([(bunch.images / 16.0).reshape(1797, -1), bunch.target])
    sort = lambda a: a[np.lexsort(a.T[::-1])]
    np.testing.assert_allclose(sort(ours), sort(ref), atol=1e-7)


def test_shifted_split_domains_and_sizes(digits):
    s = digits.split("shifted")
    assert s.inputs.shape == (3000, 1, 8, 8) and s.inputs.dtype == np.float32
    assert 0.0 <= s.inputs.min() and s.inputs.max() <= 1.0
    ids, counts = np.unique(s.domain, return_counts=True)
    assert list(ids) == list(range(1, 31)) and set(counts) == {100}
    names = s.meta["domains"]
    # every id is named, the default's 30 and occlusion's 5 (appended, not in the default)
    assert names == domain_names() and names[0] == "clean" and len(names) == 36
    assert names[domain_id("rotation", 3)] == "rotation-3"
    assert names[31:] == [f"occlusion-{k}" for k in range(1, 6)]
    assert s.meta["domain_severity"][domain_id("contrast", 5)] == 5
    assert len(digits.split("shifted_val").labels) == 3000


def test_shifted_uses_every_test_image_when_unlimited():
    ds = Digits(
        corruptions=["contrast", "gaussian_blur"], severities=[2, 5], shifted_per_domain=None
    )
    test, shifted = ds.split("test"), ds.split("shifted")
    assert len(shifted.labels) == 4 * len(test.labels)
    for d in np.unique(shifted.domain):
        m = shifted.domain == d
        assert np.array_equal(shifted.labels[m], test.labels)
    # blur (deterministic) of the clean test images at severity 2, recomputed directly
    expected = corrupt(test.inputs[:, 0], "gaussian_blur", 2, np.random.default_rng(0))
    got = shifted.inputs[shifted.domain == domain_id("gaussian_blur", 2), 0]
    np.testing.assert_array_equal(got, expected)


def test_domain_images_do_not_depend_on_other_corruptions(digits):
    only = Digits(corruptions=["rotation"], severities=[2]).split("shifted")
    d = domain_id("rotation", 2)
    assert set(np.unique(only.domain)) == {d}
    full = digits.split("shifted")
    np.testing.assert_array_equal(only.inputs, full.inputs[full.domain == d])


def test_dataset_is_deterministic_and_seeded():
    a, b, c = Digits(seed=0), Digits(seed=0), Digits(seed=1)
    for name in ("train", "shifted"):
        np.testing.assert_array_equal(a.split(name).inputs, b.split(name).inputs)
        np.testing.assert_array_equal(a.split(name).labels, b.split(name).labels)
    assert not np.array_equal(a.split("train").labels, c.split("train").labels)


#: SHA-256 of (dtype, shape, bytes) of inputs, labels and domain of every split of
#: ``Digits()``, measured before ``occlusion`` was added: the default splits (and so the
#: quickstart's numbers) must never move when a corruption or a parameter is added
DEFAULT_SPLIT_DIGESTS = {
    "train": "5310bd421e449f38e35a43bfcc95382d10a441a8d7293412ebbdb76cfdf20ea6",
    "val": "52c8c92e1d94080da8aafdb6dc3c4e1da64eade846d40b6fefb7a2c3d69b84ca",
    "test": "15b463e620e73744d14d0825931611e7cc7f44f1264cc19d54f501470fbd3be9",
    "shifted": "e686bb95a2c46f89efae076a360c1bf9a521d1597de449749e618743f727bf9a",
    "shifted_val": "94f2d31f8c6445b9af1c8df00ab6a214ad0677392e4277285b9ba802d2ccb60c",
}


def _split_digest(split) -> str:
    import hashlib

    h = hashlib.sha256()
    for a in (split.inputs, split.labels, split.domain):
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def test_default_splits_are_byte_identical_to_the_release(digits):
    assert {name: _split_digest(digits.split(name)) for name in digits.splits()} == (
        DEFAULT_SPLIT_DIGESTS)
    assert digits.corruptions == list(DEFAULT_CORRUPTIONS) and "occlusion" not in (
        DEFAULT_CORRUPTIONS)
    # naming the default explicitly is the same data
    explicit = Digits(seed=0, corruptions=list(CORRUPTIONS[:6]), severities=[5, 4, 3, 2, 1])
    assert _split_digest(explicit.split("shifted")) == DEFAULT_SPLIT_DIGESTS["shifted"]


def test_one_family_at_one_severity_group_is_an_experiment(digits):
    test = digits.split("test")
    one = Digits(corruptions=["rotation"], severities=[3, 4], shifted_per_domain=None)
    s = one.split("shifted")
    assert one.split_sizes()["shifted"] == len(s.labels) == 2 * len(test.labels) == 1078
    assert sorted(np.unique(s.domain)) == [domain_id("rotation", 3), domain_id("rotation", 4)]
    for sev in (3, 4):
        m = s.domain == domain_id("rotation", sev)
        np.testing.assert_array_equal(s.labels[m], test.labels)
    # the fitting split stays clean; the spec-level parameters validate
    assert np.array_equal(one.split("val").domain, np.zeros(539))
    params = get_registry().get("dataset", "digits").validate_params(
        {"seed": 0, "corruptions": ["occlusion"], "severities": [2]})
    assert params.corruptions == ["occlusion"] and params.severities == [2]


def test_occlusion_zeroes_one_square_patch(digits):
    x = digits.split("test").inputs[:, 0]
    for sev, side in enumerate((2, 3, 4, 5, 6), start=1):
        out = corrupt(x, "occlusion", sev, np.random.default_rng(sev))
        changed = out != x
        assert np.all(out[changed] == 0.0)  # only zeroing
        # recompute the patch: the square of the same draws, and nothing else changed
        rng = np.random.default_rng(sev)
        top = rng.integers(0, 8 - side + 1, size=len(x))
        left = rng.integers(0, 8 - side + 1, size=len(x))
        for i in (0, 1, len(x) - 1):
            want = x[i].copy()
            want[top[i]:top[i] + side, left[i]:left[i] + side] = 0.0
            np.testing.assert_array_equal(out[i], want)
    # positions cover the image: every top-left corner of a 2x2 patch is drawn
    hole = corrupt(np.ones((4000, 8, 8)), "occlusion", 1, np.random.default_rng(0))
    first = hole.reshape(4000, 64).argmin(axis=1)  # the patch's top-left pixel
    assert set(zip(*np.divmod(first, 8))) == {(r, c) for r in range(7) for c in range(7)}
    assert np.all((hole == 0).sum(axis=(1, 2)) == 4)
    # occlusion's domains are appended: ids 31..35, and the others did not move
    assert [domain_id("occlusion", k) for k in range(1, 6)] == [31, 32, 33, 34, 35]
    assert domain_id("impulse_noise", 5) == 30


def test_unknown_family_or_severity_is_one_line_naming_the_parameter(write_spec, capsys):
    from selbench.cli import main

    for params, needle in (
        ({"corruptions": ["fog"]}, "dataset.params.corruptions: "),
        ({"severities": [6]}, "dataset.params.severities: "),
    ):
        path = write_spec({
            "spec_version": 1, "name": "bad", "seeds": [0],
            "experiments": [{
                "name": "d", "dataset": {"name": "digits", "params": {"seed": 0, **params}},
                "backbone": {"name": "digits-net"}, "fit_split": "val", "eval_split": "shifted",
                "methods": [{"label": "None", "scheme": {"name": "recalibration"}}],
            }],
        })
        assert main(["validate", str(path)]) == 2
        err = capsys.readouterr().err
        line = next(ln for ln in err.splitlines() if needle in ln)
        assert "Traceback" not in err
        if "corruptions" in needle:
            assert "'fog'" in line and ", ".join(CORRUPTIONS) in line
        else:
            assert "[6]" in line and "1, 2, 3, 4, 5" in line


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_corruption_grows_with_severity(digits, corruption):
    x = digits.split("test").inputs[:, 0]
    before = x.copy()
    diffs = [
        float(np.abs(corrupt(x, corruption, s, np.random.default_rng(0)) - x).mean())
        for s in range(1, 6)
    ]
    assert np.array_equal(x, before)  # input not modified
    assert diffs[0] > 0.01
    assert all(b > a for a, b in itertools.pairwise(diffs)), diffs


def test_rotation_is_a_rotation():
    x = np.arange(64, dtype=np.float64).reshape(1, 8, 8)
    np.testing.assert_allclose(_rotate(x, np.array([np.pi / 2]))[0], np.rot90(x[0]), atol=1e-9)
    np.testing.assert_allclose(_rotate(x, np.array([0.0]))[0], x[0], atol=1e-12)


def test_bad_parameters_are_clear_errors():
    with pytest.raises(ValueError, match="unknown corruption"):
        corrupt(np.zeros((1, 8, 8)), "fog", 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="severity"):
        corrupt(np.zeros((1, 8, 8)), "contrast", 6, np.random.default_rng(0))
    DigitsParams = params_model(Digits)  # the parameters a spec is validated against
    with pytest.raises(ValueError, match="sum"):
        DigitsParams(split_fractions=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="unknown corruption"):
        DigitsParams(corruptions=["fog"])
    with pytest.raises(ValueError, match="severities"):
        DigitsParams(severities=[0, 1])
    with pytest.raises(ValueError, match="Extra inputs"):
        get_registry().get("dataset", "digits").validate_params({"sever": [1]})
    with pytest.raises(ValueError, match="unknown split"):
        Digits().split("tset")


# ---------------------------------------------------------------------------- backbone
def test_backbone_accuracy_and_shift(trained, digits):
    _, outs = trained
    for name, out in outs.items():
        assert out.features.shape == (len(digits.split(name).labels), 64)
        assert out.features.dtype == np.float32 and out.logits.shape[1] == 10
        np.testing.assert_array_equal(out.domain, digits.split(name).domain)
        assert out.meta["domains"] == domain_names()
    acc = {k: float(o.correct().mean()) for k, o in outs.items()}
    cal = {k: ece(o.confidence(), o.correct()) for k, o in outs.items()}
    assert acc["test"] > 0.93 and acc["val"] > 0.93  # measured 0.970 / 0.967
    assert acc["shifted"] < acc["test"] - 0.1
    assert cal["test"] < 0.03
    assert cal["shifted"] > cal["test"] + 0.05
    # the corruption severity hurts: severity 5 is far less accurate than severity 1
    sev = np.array(outs["shifted"].meta["domains"], dtype=object)[outs["shifted"].domain]
    correct = outs["shifted"].correct()
    low = np.char.endswith(sev.astype(str), "-1")
    high = np.char.endswith(sev.astype(str), "-5")
    assert correct[high].mean() < correct[low].mean() - 0.2


def test_backbone_is_deterministic_given_its_seed(digits):
    ctx = FitContext(seed=0)
    threads = torch.get_num_threads()
    a = DigitsNet(epochs=3).extract(digits, "test", ctx)
    b = DigitsNet(epochs=3).extract(digits, "test", FitContext(seed=7))  # context seed unused
    c = DigitsNet(epochs=3, seed=1).extract(digits, "test", ctx)
    assert torch.get_num_threads() == threads
    np.testing.assert_array_equal(a.logits, b.logits)
    np.testing.assert_array_equal(a.features, b.features)
    assert np.abs(a.logits - c.logits).max() > 1e-3


def test_backbone_weights_cache_round_trip(digits, tmp_path):
    ctx = FitContext(cache_dir=tmp_path)
    first = DigitsNet(epochs=2)
    a = first.extract(digits, "val", ctx)
    files = list(tmp_path.glob("digits-net-*.pt"))
    assert len(files) == 1
    second = DigitsNet(epochs=2)
    b = second.extract(digits, "val", ctx)  # loads the weights instead of training
    np.testing.assert_array_equal(a.logits, b.logits)
    assert second.train_accuracy_ == first.train_accuracy_
    # an unreadable cache entry is retrained from scratch (same result) with a warning
    files[0].write_bytes(b"not a torch file")
    with pytest.warns(UserWarning, match="unreadable"):
        c = DigitsNet(epochs=2).extract(digits, "val", ctx)
    np.testing.assert_array_equal(a.logits, c.logits)
    # another configuration is another file
    DigitsNet(epochs=2, seed=3).extract(digits, "val", ctx)
    assert len(list(tmp_path.glob("digits-net-*.pt"))) == 2


def test_backbone_rejects_non_image_inputs():
    from selbench_plugins.datasets.theory import TheoryMixture

    with pytest.raises(ValueError, match=r"digits-net: split 'train' inputs: expected images"):
        DigitsNet(epochs=1).extract(TheoryMixture(train_size=20), "val", FitContext())
