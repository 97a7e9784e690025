"""The plan of a run (issue 38): made once by make_plan, the one caller of execution/keys.py
in a run, with what is reused decided there; the settings a run was asked for."""

from __future__ import annotations

import os

import pytest
from conftest import tiny_spec
from selbench.execution import keys
from selbench.execution.plan import RunSettings, make_plan
from selbench.spec import load_spec
from selbench.spec.executor import InlineOptions, LocalOptions, SubmititOptions
from selbench.store.cache import OutputCache
from selbench.store.results import ResultsDir


@pytest.fixture
def folders(tmp_path):
    results, cache = ResultsDir(tmp_path / "out"), OutputCache(tmp_path / "cache")
    results.prepare()
    cache.prepare()
    return results, cache


def test_the_plan_holds_the_keys_of_keys_py(folders):
    results, cache = folders
    resolved = load_spec(tiny_spec())
    plan = make_plan(resolved, results, cache)
    ident = keys.identify(resolved, cache)
    assert [c.key for c in plan.cells] == [c.key for c in keys.plan_cells(resolved, results,
                                                                           ident)]
    assert plan.output_keys == {0: keys.output_keys(resolved, ident, 0)}
    assert plan.spec_hash == resolved.hash()
    assert plan.identity == ident
    # a job's own plan: nothing recorded or triaged; it computes what it is given
    assert plan.provenance is None and plan.reuse is None and plan.todo == plan.cells
    assert [plan.label(c) for c in plan.cells[::2]] == ["None", "Temp. scale", "Confidence"]


def test_what_is_reused_is_decided_with_the_plan(folders, capsys):
    import selbench

    results, cache = folders
    spec = tiny_spec()
    settings = RunSettings(device="cpu", requested_device="cpu")
    fresh = make_plan(load_spec(spec), results, cache, settings)
    assert fresh.reuse.todo == fresh.cells and not fresh.reuse.known
    assert fresh.provenance["spec_hash"] == fresh.spec_hash
    assert set(fresh.provenance["code"]) == {"core", *fresh.identity.code}
    selbench.run(spec, out_dir=results.root, cache_dir=cache.root, device="cpu",
                 progress=False, plots=False)
    done = make_plan(load_spec(spec), results, cache, settings)
    assert done.reuse.todo == () and not done.reuse.reasons
    assert set(done.reuse.known) == {os.path.abspath(c.path) for c in done.cells}
    forced = RunSettings(device="cpu", force=True, only=frozenset({"Temp. scale"}))
    again = make_plan(load_spec(spec), results, cache, forced)
    assert [(again.label(c), c.seed) for c in again.reuse.todo] == [("Temp. scale", 0),
                                                                    ("Temp. scale", 1)]
    assert again.reuse.reasons == {"--force": 2} and len(again.reuse.known) == 4
    assert "2 cell(s) recomputed: --force" in capsys.readouterr().err


def test_run_settings():
    plain = RunSettings(device="cuda", requested_device="auto")
    assert plain.inline and not plain.forces("A")
    assert RunSettings(device="cpu", force=True).forces("A")
    only = RunSettings(device="cpu", force=True, only=frozenset({"B"}))
    assert only.forces("B") and not only.forces("A")
    assert RunSettings(device="cpu", executor=InlineOptions()).inline
    local = RunSettings(device="cuda", requested_device="auto", executor=LocalOptions())
    cluster = RunSettings(device="cpu", requested_device="auto", executor=SubmititOptions())
    assert not local.inline and local.job_device == "cuda"  # the parent's, resolved
    assert cluster.job_device == "auto"  # each cluster job resolves its own
    with pytest.raises(AttributeError):
        plain.force = True  # frozen: decided once
