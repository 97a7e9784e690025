"""Distributed extraction: a split larger than the executor's ``shard_size`` is extracted by
one job per row range when the backbone declares ``shardable``, merged into the
content-addressed cache once (each key once, even when experiments share it), with the same
outputs and leaderboard as an inline run; a failed range is the only one extracted again."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import plugin_site, tiny_spec
from selbench.contract.data import ModelOutputs
from selbench.execution.runner import JobsFailed, run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: theory-linear that logs each extraction to $SELBENCH_TEST_SHARD_LOG and fails the row
#: range starting at $SELBENCH_TEST_SHARD_FAIL; and one that declares shardable but ignores
#: the rows it is asked for
PROBE = '''
import dataclasses
import os
from selbench import Plugin, hookimpl
from selbench_plugins.backbones.linear import TheoryLinear

class ShardProbe(TheoryLinear):
    """theory-linear, logging every extraction."""
    def extract(self, dataset, split, context):
        rows = context.rows
        fail = os.environ.get("SELBENCH_TEST_SHARD_FAIL")
        if fail is not None and rows is not None and rows[0] == int(fail):
            raise RuntimeError(f"shard probe fails the rows from {fail} on purpose")
        with open(os.environ["SELBENCH_TEST_SHARD_LOG"], "a") as fh:
            fh.write(f"{split} {rows}\\n")
        return super().extract(dataset, split, context)

class IgnoresRows(TheoryLinear):
    """Declares shardable (inherited) but always returns the whole split."""
    def extract(self, dataset, split, context):
        return super().extract(dataset, split, dataclasses.replace(context, rows=None))

@hookimpl
def selbench_backbones():
    return [Plugin("shard-probe", ShardProbe), Plugin("ignores-rows", IgnoresRows)]
'''

VAL, TEST = 400, 600  # tiny_spec's fitting and evaluation splits


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    with plugin_site(tmp_path_factory.mktemp("site"), "selbench-shard-probe",
                     {"selbench_shard_probe": PROBE},
                     clear_env=["SELBENCH_TEST_SHARD_FAIL"]) as root:
        yield root


@pytest.fixture
def log(tmp_path, monkeypatch):
    path = tmp_path / "extractions.log"
    path.write_text("")
    monkeypatch.setenv("SELBENCH_TEST_SHARD_LOG", str(path))
    return path


def _lines(path) -> list[str]:
    return path.read_text().splitlines()


def spec(backbone: str = "theory-linear", n_experiments: int = 1, **executor) -> dict:
    s = tiny_spec(name="shards", backbone={"name": backbone})
    s["experiments"] += [{**s["experiments"][0], "name": f"again{i}"}
                         for i in range(1, n_experiments)]
    if executor:
        s["executor"] = executor
    return s


def _cached(cache) -> dict[str, ModelOutputs]:
    return {p.name: ModelOutputs.from_npz(p) for p in sorted((cache / "outputs").glob("*.npz"))}


def test_sharded_extraction_gives_the_inline_outputs_and_leaderboard(tmp_path):
    ref = run(spec(), out_dir=tmp_path / "inline", cache_dir=tmp_path / "c1", progress=False,
              plots=False)
    report = run(spec(name="local", workers=2, shard_size=128), out_dir=tmp_path / "local",
                 cache_dir=tmp_path / "c2", progress=False, plots=False)
    assert report.computed == ref.computed == 6
    for name in ("leaderboard.md", "leaderboard.csv"):
        assert (tmp_path / "local" / name).read_bytes() == \
            (tmp_path / "inline" / name).read_bytes(), name
    whole, merged = _cached(tmp_path / "c1"), _cached(tmp_path / "c2")
    assert list(whole) == list(merged) and len(whole) == 2  # the same two keys
    for key, out in whole.items():
        got = merged[key]
        assert len(got) in (VAL, TEST)
        for name in ("features", "logits", "labels", "domain"):
            a, b = getattr(out, name), getattr(got, name)
            assert (a is None and b is None) or np.array_equal(a, b), (key, name)
        assert got.meta == out.meta
    assert not any((tmp_path / "c2" / "shards").rglob("*.npz"))  # merged, then removed


def test_submitit_debug_shards_give_the_inline_leaderboard(tmp_path):
    pytest.importorskip("submitit")
    run(spec(), out_dir=tmp_path / "inline", cache_dir=tmp_path / "c1", progress=False,
        plots=False)
    run(spec(name="submitit", cluster="debug", poll_s=0.01, shard_size=256),
        out_dir=tmp_path / "s", cache_dir=tmp_path / "c2", progress=False, plots=False)
    assert (tmp_path / "s" / "leaderboard.md").read_bytes() == \
        (tmp_path / "inline" / "leaderboard.md").read_bytes()


def test_each_row_range_of_each_key_is_extracted_once(site, tmp_path, log):
    """Two experiments share both keys: every range is extracted by exactly one job."""
    run(spec("shard-probe", n_experiments=2, name="local", workers=2, shard_size=256),
        out_dir=tmp_path / "out", cache_dir=tmp_path / "cache", progress=False, plots=False)
    want = {"val (0, 256)", "val (256, 400)",
            "test (0, 256)", "test (256, 512)", "test (512, 600)"}
    got = _lines(log)
    # the shards, once each; a whole-split extraction happens nowhere
    assert sorted(got) == sorted(want)
    assert len(_cached(tmp_path / "cache")) == 2
    # a rerun (new results folder, same cache) extracts nothing
    run(spec("shard-probe", n_experiments=2, name="local", workers=2, shard_size=256),
        out_dir=tmp_path / "out2", cache_dir=tmp_path / "cache", progress=False, plots=False)
    assert sorted(_lines(log)) == sorted(want)


def test_no_sharding_below_the_shard_size_or_when_switched_off(site, tmp_path, log):
    run(spec("shard-probe", name="local", workers=1, shard_size=TEST),
        out_dir=tmp_path / "a", cache_dir=tmp_path / "c1", progress=False, plots=False)
    assert sorted(_lines(log)) == ["test None", "val None"]
    log.write_text("")
    run(spec("shard-probe", name="local", workers=1, shard_size=None),
        out_dir=tmp_path / "b", cache_dir=tmp_path / "c2", progress=False, plots=False)
    assert sorted(_lines(log)) == ["test None", "val None"]


def test_a_failed_row_range_is_the_only_one_extracted_again(site, tmp_path, log, monkeypatch):
    args = dict(out_dir=tmp_path / "out", cache_dir=tmp_path / "cache", progress=False,
                plots=False)
    monkeypatch.setenv("SELBENCH_TEST_SHARD_FAIL", "256")
    with pytest.raises(JobsFailed) as info:
        run(spec("shard-probe", name="local", workers=2, shard_size=256), **args)
    failed = sorted(f.unit.describe() for f in info.value.failures)
    assert failed == ["experiment 'mixture': backbone outputs of split 'test' rows [256, 512)",
                      "experiment 'mixture': backbone outputs of split 'val' rows [256, 400)"]
    assert "shard probe fails the rows from 256 on purpose" in str(info.value)
    first = set(_lines(log))
    assert first == {"val (0, 256)", "test (0, 256)", "test (512, 600)"}
    assert not list((tmp_path / "cache" / "outputs").glob("*.npz"))  # nothing merged yet
    assert len(list((tmp_path / "cache" / "shards").rglob("*.npz"))) == 3  # kept

    monkeypatch.delenv("SELBENCH_TEST_SHARD_FAIL")
    log.write_text("")
    report = run(spec("shard-probe", name="local", workers=2, shard_size=256), **args)
    assert sorted(_lines(log)) == ["test (256, 512)", "val (256, 400)"]  # only those
    assert report.computed == 6
    ref = run(spec("shard-probe"), out_dir=tmp_path / "inline", cache_dir=tmp_path / "c2",
              progress=False, plots=False)
    assert ref.computed == 6
    assert (tmp_path / "out" / "leaderboard.md").read_bytes() == \
        (tmp_path / "inline" / "leaderboard.md").read_bytes()


def test_shardable_backbone_that_ignores_rows_is_a_clear_failure(site, tmp_path):
    with pytest.raises(JobsFailed) as info:
        run(spec("ignores-rows", name="local", workers=1, shard_size=256),
            out_dir=tmp_path / "out", cache_dir=tmp_path / "cache", progress=False,
            plots=False)
    msg = str(info.value)
    assert "declares shardable, but extract with FitContext.rows=(0, 256) returned 400 rows" \
        in msg
    assert "ignores-rows" in msg and "honour context.rows" in msg
    assert not list((tmp_path / "cache" / "outputs").glob("*.npz"))  # nothing cached
