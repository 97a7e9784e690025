"""Loaders of user files never traceback and never run code from data.

* every way a ``precomputed`` ``.npz`` can be broken is a :class:`DataError` naming the file
  and what is wrong, also through the runner and the command line;
* the CIFAR-100 python files are read by a restricted unpickler: a crafted pickle is refused
  before anything in it runs, the real (Python 2, protocol 2) format still loads;
* weights files go through ``torch.load(weights_only=True)`` and unreadable ones are a
  ``ValueError`` naming the file.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import yaml
from conftest import REPO
from selbench.contract.data import DataError
from selbench_plugins.datasets import cifar, precomputed
from selbench_plugins.datasets.cifar import CIFAR100, read_cifar100
from selbench_plugins.datasets.precomputed import PrecomputedDataset

RNG = np.random.default_rng(0)
LABELS = RNG.integers(0, 3, size=20)
LOGITS = RNG.normal(size=(20, 3))


# --------------------------------------------------------------------------- precomputed
def _savez(path, **arrays):
    np.savez(path, **arrays)


def _good_bytes(tmp_path) -> bytes:
    _savez(tmp_path / "good.npz", labels=LABELS, logits=LOGITS)
    return (tmp_path / "good.npz").read_bytes()


def _nan_logits():
    z = LOGITS.copy()
    z[3, 1] = np.nan
    return z


def _flip_member_bytes(data: bytes) -> bytes:
    out = bytearray(data)
    i = data.index(b"\x93NUMPY") + 150  # inside the first member's array data
    out[i] ^= 0xFF
    return bytes(out)


# (case id, how to write the file, substrings the message must hold)
BROKEN = [
    ("empty-file", lambda p, t: p.write_bytes(b""), ["is empty (0 bytes)"]),
    ("zero-rows", lambda p, t: _savez(p, labels=np.zeros(0, int), logits=np.zeros((0, 3))),
     ["holds zero rows"]),
    ("zero-rows-probabilities",
     lambda p, t: _savez(p, labels=np.zeros(0, int), probabilities=np.zeros((0, 3))),
     ["holds zero rows"]),
    ("truncated", lambda p, t: p.write_bytes(_good_bytes(t)[:300]),
     ["truncated or damaged .npz archive"]),
    ("truncated-end", lambda p, t: p.write_bytes(_good_bytes(t)[:-10]),
     ["truncated or damaged .npz archive"]),
    ("damaged-member", lambda p, t: p.write_bytes(_flip_member_bytes(_good_bytes(t))),
     ["array 'labels' (labels) is truncated or damaged", "CRC"]),
    ("not-a-zip", lambda p, t: p.write_bytes(b"label,logit\n1,0.5\n"),
     ["is not an .npz archive (not a zip file"]),
    ("single-npy", lambda p, t: p.write_bytes(_npy_bytes(LOGITS)),
     ["holds a single array (.npy format)"]),
    ("no-arrays", lambda p, t: _savez(p), ["no 'labels' array", "holds no arrays"]),
    ("no-labels", lambda p, t: _savez(p, logits=LOGITS), ["no 'labels' array", "'logits'"]),
    ("object-labels",
     lambda p, t: _savez(p, labels=np.array(list(LABELS), dtype=object), logits=LOGITS),
     ["array 'labels' (labels) is stored as pickled Python objects (dtype=object)"]),
    ("object-logits",
     lambda p, t: _savez(p, labels=LABELS, logits=np.array(LOGITS.tolist(), dtype=object)),
     ["array 'logits' (logits) is stored as pickled Python objects"]),
    ("row-mismatch", lambda p, t: _savez(p, labels=LABELS, logits=LOGITS[:5]),
     ["array 'logits' (logits) has 5 rows but 'labels' (labels) has 20"]),
    ("nan-logits", lambda p, t: _savez(p, labels=LABELS, logits=_nan_logits()),
     ["array 'logits' (logits) contains NaN or infinite values (first at row 3, column 1)"]),
    ("inf-features",
     lambda p, t: _savez(p, labels=LABELS, logits=LOGITS, features=np.full((20, 2), np.inf)),
     ["array 'features' (features) contains NaN or infinite values"]),
    ("1d-logits", lambda p, t: _savez(p, labels=LABELS, logits=LOGITS[:, 0]),
     ["array 'logits' (logits) has shape (20,), expected 2-D [N, K]"]),
    ("3d-probabilities",
     lambda p, t: _savez(p, labels=LABELS, probabilities=np.full((20, 3, 1), 1 / 3)),
     ["array 'probabilities' (probabilities) has shape (20, 3, 1)"]),
    ("2d-labels", lambda p, t: _savez(p, labels=LABELS[:, None], logits=LOGITS),
     ["array 'labels' (labels) has shape (20, 1)"]),
    ("scalar-labels", lambda p, t: _savez(p, labels=np.int64(1), logits=LOGITS),
     ["array 'labels' (labels) has shape ()"]),
    ("labels-out-of-range", lambda p, t: _savez(p, labels=LABELS + 5, logits=LOGITS),
     ["array 'labels' (labels): values must lie in [0, 3)"]),
    ("negative-labels", lambda p, t: _savez(p, labels=LABELS - 5, logits=LOGITS),
     ["array 'labels' (labels): values must lie in [0, 3)"]),
    ("string-logits",
     lambda p, t: _savez(p, labels=LABELS, logits=np.full((20, 3), "x")),
     ["array 'logits' (logits) holds <U1 values, expected real numbers"]),
    ("foreign-member", lambda p, t: _zip_with(p, {"labels.npy": b"not numpy"}),
     ["member 'labels' (labels) is not a numpy array"]),
    ("folder", lambda p, t: p.mkdir(), ["is a folder, not an .npz file"]),
]  # fmt: skip


def _npy_bytes(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _zip_with(path, members: dict) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


@pytest.mark.parametrize(("make", "needles"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_broken_npz_is_a_data_error_naming_the_file(tmp_path, make, needles):
    path = tmp_path / "outputs.npz"
    make(path, tmp_path)
    with pytest.raises(DataError) as info:
        ds = PrecomputedDataset(str(path))
        ds.split(ds.splits()[0])
    msg = str(info.value)
    assert str(path) in msg
    for needle in needles:
        assert needle in msg, msg


def test_unreadable_file_is_a_data_error(tmp_path, monkeypatch):
    path = tmp_path / "outputs.npz"
    _savez(path, labels=LABELS, logits=LOGITS)

    def no_read(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(precomputed, "open", no_read, raising=False)  # the module's own open()
    with pytest.raises(DataError, match=r"outputs.npz: cannot read the file \(Permission denied\)"):
        PrecomputedDataset(str(path)).splits()
    monkeypatch.undo()

    def eio(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(precomputed.np, "load", eio)
    with pytest.raises(DataError, match=r"outputs.npz: cannot read the file \(Input/output error\)"):
        PrecomputedDataset(str(path)).splits()


def test_missing_file_is_a_data_error_and_a_file_not_found_error(tmp_path):
    with pytest.raises(DataError) as info:
        PrecomputedDataset(str(tmp_path / "nope.npz")).split("val")
    assert isinstance(info.value, FileNotFoundError)
    assert "nope.npz" in str(info.value) and "does not exist" in str(info.value)


def _spec(path) -> dict:
    return {
        "spec_version": 1, "name": "broken-npz", "seeds": [0],
        "experiments": [{
            "name": "mine", "dataset": {"name": "precomputed", "params": {"path": str(path)}},
            "backbone": {"name": "precomputed"}, "fit_split": "val", "eval_split": "test",
            "n_fit": 5, "betas": [0.5, 1.0], "train_beta": 0.5,
            "methods": [{"label": "None", "scheme": {"name": "recalibration"}}],
        }],
    }  # fmt: skip


@pytest.mark.parametrize("case", ["truncated", "nan-logits"])
def test_selbench_run_reports_a_broken_npz_without_a_traceback(tmp_path, case):
    make, needles = next(b[1:] for b in BROKEN if b[0] == case)
    npz = tmp_path / "outputs.npz"
    make(npz, tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(npz)))
    proc = subprocess.run(
        [sys.executable, "-m", "selbench.cli", "run", str(spec), "--out", str(tmp_path / "out"),
         "--no-progress", "--no-plots", "-q"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "SELBENCH_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )  # fmt: skip
    # a truncated archive is bad input caught before the run (the dataset opens its declared
    # file when the spec is validated): exit 2; NaN logits are found when the data is read: 1
    assert proc.returncode == (2 if case == "truncated" else 1), proc.stderr
    assert "Traceback" not in proc.stderr
    assert str(npz) in proc.stderr and needles[0] in proc.stderr


# --------------------------------------------------------------------------- CIFAR pickles
def _py2_str(b: bytes) -> bytes:
    """A Python 2 ``str`` as cPickle writes it (SHORT_BINSTRING / BINSTRING)."""
    if len(b) < 256:
        return b"U" + bytes([len(b)]) + b
    return b"T" + struct.pack("<I", len(b)) + b


def _py2_int(v: int) -> bytes:
    return b"K" + bytes([v]) if 0 <= v < 256 else b"J" + struct.pack("<i", v)


def _py2_cifar_pickle(batch: dict) -> bytes:
    """``batch`` pickled exactly as the official CIFAR-100 python release is: Python 2
    cPickle, protocol 2, ``str`` keys and byte strings, the image array through
    ``numpy.core.multiarray._reconstruct`` with its raw bytes as a Python 2 ``str``."""
    out = [b"\x80\x02}("]
    for key, value in batch.items():
        out.append(_py2_str(key.encode()))
        if isinstance(value, np.ndarray):
            out.append(b"cnumpy.core.multiarray\n_reconstruct\n")
            out.append(b"cnumpy\nndarray\n" + _py2_int(0) + b"\x85" + _py2_str(b"b") + b"\x87R")
            out.append(b"(" + _py2_int(1) + b"".join(_py2_int(s) for s in value.shape)
                       + b"\x86cnumpy\ndtype\n" + _py2_str(b"u1") + _py2_int(0) + _py2_int(1)
                       + b"\x87R(" + _py2_int(3) + _py2_str(b"|") + b"NNN" + _py2_int(-1)
                       + _py2_int(-1) + _py2_int(0) + b"tb\x89" + _py2_str(value.tobytes())
                       + b"tb")  # fmt: skip
        elif isinstance(value, list):
            out.append(b"](")
            for v in value:
                out.append(_py2_str(v.encode()) if isinstance(v, str) else _py2_int(v))
            out.append(b"e")
        else:
            out.append(_py2_str(value.encode()))
    out.append(b"u.")
    return b"".join(out)


def test_the_real_python2_cifar_format_loads(tmp_path):
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    data = RNG.integers(0, 256, size=(6, 3072), dtype=np.uint8)
    fine = [3, 99, 0, 42, 7, 42]
    (d / "train").write_bytes(_py2_cifar_pickle({
        "filenames": [f"img_{i}.png" for i in range(6)], "batch_label": "training batch 1 of 1",
        "fine_labels": fine, "coarse_labels": [f // 5 for f in fine], "data": data,
    }))  # fmt: skip
    (d / "meta").write_bytes(_py2_cifar_pickle({
        "fine_label_names": [f"name_{i}" for i in range(100)],
        "coarse_label_names": [f"super_{i}" for i in range(20)],
    }))  # fmt: skip
    with open(d / "train", "rb") as fh:  # the hand-written pickle is what pickle reads
        ref = pickle.load(fh, encoding="latin1")
    np.testing.assert_array_equal(ref["data"], data)
    images, labels = read_cifar100(tmp_path, "train")
    np.testing.assert_array_equal(labels, fine)
    np.testing.assert_array_equal(images, data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    assert cifar.cifar100_class_names(tmp_path)[:2] == ["name_0", "name_1"]


def test_python3_pickles_with_bytes_keys_load(tmp_path):
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    data = RNG.integers(0, 256, size=(4, 3072), dtype=np.uint8)
    for protocol in (2, 4, 5):
        with open(d / "test", "wb") as fh:
            pickle.dump({b"data": data, b"fine_labels": [1, 2, 3, 4],
                         b"filenames": [b"a.png"] * 4}, fh, protocol=protocol)  # fmt: skip
        images, labels = read_cifar100(tmp_path, "test")
        np.testing.assert_array_equal(labels, [1, 2, 3, 4])
        assert images.shape == (4, 32, 32, 3)


class _RunsCommand:
    def __init__(self, func, arg):
        self.func, self.arg = func, arg

    def __reduce__(self):
        return (self.func, (self.arg,))


@pytest.mark.parametrize("how", ["os.system", "builtins.exec", "nested-in-the-dict"])
def test_a_crafted_cifar_pickle_is_refused_and_runs_nothing(tmp_path, how):
    marker = tmp_path / "marker"
    if how == "os.system":
        payload = _RunsCommand(os.system, f"touch {marker}")
    elif how == "builtins.exec":
        payload = _RunsCommand(exec, f"open({str(marker)!r}, 'w').close()")
    else:
        payload = {"data": np.zeros((1, 3072), np.uint8), "fine_labels": [0],
                   "filenames": [_RunsCommand(os.system, f"touch {marker}")]}  # fmt: skip
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    with open(d / "train", "wb") as fh:
        pickle.dump(payload, fh, protocol=2)
    with pytest.raises(ValueError) as info:
        CIFAR100(root=str(tmp_path)).split("train")
    msg = str(info.value)
    assert str(d / "train") in msg and "refused to unpickle" in msg
    assert ("system" if how != "builtins.exec" else "exec") in msg  # names the global
    assert not marker.exists()


def test_the_meta_file_goes_through_the_same_unpickler(tmp_path):
    from fixtures_vision import make_cifar100

    d = make_cifar100(tmp_path)
    marker = tmp_path / "marker"
    with open(d / "meta", "wb") as fh:
        pickle.dump({"fine_label_names": _RunsCommand(os.system, f"touch {marker}")}, fh)
    with pytest.raises(ValueError, match="refused to unpickle"):
        CIFAR100(root=str(tmp_path)).split("test")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("content", "needle"),
    [(b"", "EOFError"), (b"\x80\x02}q\x00(X\x04\x00\x00\x00data", "not a readable CIFAR-100"),
     (pickle.dumps([1, 2, 3], protocol=2), "holds a list, expected a dict"),
     (pickle.dumps({"fine_labels": [1]}, protocol=2), "missing 'data'")],
)  # fmt: skip
def test_damaged_cifar_files_are_value_errors_naming_the_file(tmp_path, content, needle):
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    (d / "train").write_bytes(content)
    with pytest.raises(ValueError) as info:
        read_cifar100(tmp_path, "train")
    assert str(d / "train") in str(info.value) and needle in str(info.value)


def test_cifar100c_npy_files_are_read_without_pickle(tmp_path):
    from fixtures_vision import make_cifar100_c

    root = make_cifar100_c(tmp_path / "c", per_severity=2, corruptions=("fog",))
    np.save(root / "labels.npy", np.array([1, 2] * 5, dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"labels.npy: holds pickled Python objects"):
        cifar.CIFAR100C(root=str(root), corruptions=["fog"], n=4).split("test")
    (root / "labels.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(ValueError, match=r"labels.npy: is unreadable"):
        cifar.CIFAR100C(root=str(root), corruptions=["fog"], n=4).split("test")


def test_no_plugin_module_unpickles_user_files():
    """Every pickle / numpy / torch load in the plugins is the restricted unpickler, refuses
    pickle, or is weights-only (calls found in the code, not in strings)."""
    import ast

    root = REPO / "plugins" / "selbench_plugins"
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = ast.unparse(node.func.value)
            kw = {k.arg: ast.unparse(k.value) for k in node.keywords}
            where = f"{rel}:{node.lineno}: {ast.unparse(node)}"
            assert not (owner in ("pickle", "dill", "joblib") and node.func.attr.startswith("load")), where
            if owner == "torch" and node.func.attr == "load":
                assert kw.get("weights_only") == "True", where
            if owner == "np" and node.func.attr == "load":
                assert kw.get("allow_pickle") == "False", where


# --------------------------------------------------------------------------- weights files
@pytest.mark.vision
def test_torchvision_weights_file_that_is_not_weights_only_is_a_value_error(tmp_path):
    pytest.importorskip("torchvision")
    from selbench_plugins.backbones.torchvision_nets import ResNet34

    marker = tmp_path / "marker"
    bad = tmp_path / "evil.pth"
    with open(bad, "wb") as fh:
        pickle.dump(_RunsCommand(os.system, f"touch {marker}"), fh, protocol=2)
    with pytest.raises(ValueError, match=r"evil.pth cannot be read as a weights-only torch file"):
        ResNet34(weights_file=str(bad)).build(3)
    assert not marker.exists()
    (tmp_path / "empty.pth").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty.pth cannot be read"):
        ResNet34(weights_file=str(tmp_path / "empty.pth")).build(3)
