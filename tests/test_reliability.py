"""Issue 29: the new paths under faults and hostile input.

1. A results folder whose locks or folders are symbolic links never makes selbench write
   outside it: a link is refused with one line naming it (a ``ResultsError``, exit 2), and an
   atomic write onto a link replaces the link, never the file it points to.
2. Two distributions whose ``selbench`` entry points share a name both load (the second under
   ``<entry point>@<distribution>``), or one warning says why one cannot.
3. ``SelectiveRecalibrator.evaluate`` and ``accept`` validate ``betas``/``beta`` and ``delta``
   for every selector, ``none`` included.
4. ``SelectiveRecalibrator.score`` (issue 25): minus the selective ECE at ``beta``, so a
   ``GridSearchCV`` needs no scorer.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import install_distribution, sampled_linear_task, tiny_spec
from selbench import SelectiveRecalibrator
from selbench.cli import main
from selbench.contract.registry import (
    AUTOLOAD_ENV,
    PluginError,
    Registry,
    SelbenchPluginManager,
    make_plugin_manager,
)
from selbench.store.results import CellRecord, ResultsDir, ResultsError, RunRecord
from selbench.util.files import atomic_path, atomic_write_json, atomic_write_text

PRECIOUS = "a file outside the results folder\n"


# --------------------------------------------------------------------------- 1. symlinks
@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder outside the results folder, holding one precious file."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "precious.txt").write_text(PRECIOUS)
    return folder


@pytest.fixture
def out(tmp_path) -> ResultsDir:
    results = ResultsDir(tmp_path / "res")
    results.prepare()
    return results


def _untouched(outside: Path) -> None:
    """The outside folder holds exactly its precious file, unchanged."""
    assert sorted(p.name for p in outside.iterdir()) == ["precious.txt"]
    assert (outside / "precious.txt").read_text() == PRECIOUS


def test_a_run_lock_that_is_a_symlink_is_refused(out, outside):
    link = out.root / ResultsDir.LOCK
    link.symlink_to(outside / "precious.txt")
    with pytest.raises(ResultsError, match="symbolic link") as info, out.lock():
        pass
    assert str(link) in str(info.value) and "\n" not in str(info.value)
    _untouched(outside)
    assert link.is_symlink()  # left for the user to look at


def test_a_dangling_lock_link_creates_nothing_outside(out, outside):
    link = out.root / ResultsDir.LOCK
    link.symlink_to(outside / "created.txt")
    with pytest.raises(ResultsError, match="symbolic link"), out.lock():
        pass
    _untouched(outside)


def test_a_lock_that_is_a_hard_link_or_not_a_file_is_refused(out, outside):
    lock = out.root / ResultsDir.LOCK
    os.link(outside / "precious.txt", lock)
    with pytest.raises(ResultsError, match="hard link") as info, out.lock():
        pass
    assert str(lock) in str(info.value)
    _untouched(outside)
    lock.unlink()
    lock.mkdir()
    with pytest.raises(ResultsError, match=f"lock file {lock}"), out.lock():
        pass
    lock.rmdir()
    os.mkfifo(lock)
    with pytest.raises(ResultsError, match="not a plain file"), out.lock():
        pass


def test_a_method_lock_that_is_a_symlink_is_refused(out, outside):
    link = out.method_lock_path("mixture", "Temp")
    link.parent.mkdir(parents=True)
    link.symlink_to(outside / "precious.txt")
    with pytest.raises(ResultsError, match="symbolic link") as info, \
            out.method_lock("mixture", "Temp"):
        pass
    assert str(link) in str(info.value)
    _untouched(outside)


@pytest.mark.parametrize("linked", [ResultsDir.METHOD_LOCKS, f"{ResultsDir.METHOD_LOCKS}/mixture"])
def test_a_method_lock_folder_linked_outside_is_refused(out, outside, linked):
    link = out.root / linked
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(ResultsError, match="symbolic link") as info, \
            out.method_lock("mixture", "Temp"):
        pass
    assert str(link) in str(info.value)
    _untouched(outside)


def _record(key: str = "k") -> CellRecord:
    return CellRecord(key=key, experiment="mixture", method="Temp", seed=0, train_beta=0.8,
                      betas=[0.8], metrics={"ece1": [0.1]}, n_fit=1, n_eval=1, device="cpu",
                      spec_hash="h")


@pytest.mark.parametrize("linked", ["cells", "cells/mixture"])
def test_a_cells_folder_linked_outside_is_refused(out, outside, linked):
    link = out.root / linked
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(ResultsError, match="symbolic link") as info:
        out.cell_path("mixture", "Temp", 0, None)
    assert str(link) in str(info.value)
    path = out.root / "cells" / "mixture" / "temp-x" / "seed0.json"
    with pytest.raises(ResultsError, match="symbolic link"):
        out.write_cell(path, _record(), {"confidence": np.ones(3)})
    _untouched(outside)


def test_a_folder_linked_inside_the_results_folder_is_fine(out):
    (out.root / "elsewhere").mkdir()
    (out.root / "cells").symlink_to(out.root / "elsewhere", target_is_directory=True)
    path = out.cell_path("mixture", "Temp", 0, None)
    out.write_cell(path, _record(), None)
    assert out.check_cell(path, "k").record is not None


def test_a_plots_folder_linked_outside_is_refused(out, outside):
    (out.root / "plots").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ResultsError, match="symbolic link"):
        out.plots_dir("mixture")
    _untouched(outside)


def test_atomic_writes_replace_a_link_never_write_through_it(out, outside):
    for i, write in enumerate((lambda p: atomic_write_json(p, {"a": 1}),
                               lambda p: atomic_write_text(p, "new\n"))):
        link = out.root / f"x{i}.json"
        link.symlink_to(outside / "precious.txt")
        write(link)
        assert not link.is_symlink() and link.read_text() != PRECIOUS
    link = out.root / "x.npz"
    link.symlink_to(outside / "precious.txt")
    with atomic_path(link, suffix=".npz") as tmp:
        tmp.write_bytes(b"npz")
    assert not link.is_symlink() and link.read_bytes() == b"npz"
    _untouched(outside)


def test_run_json_and_a_cell_that_are_links_are_replaced(out, outside):
    out.run_path.symlink_to(outside / "precious.txt")
    out.spec_path.symlink_to(outside / "precious.txt")
    out.write_run(RunRecord(provenance={}, spec={}, cells=[], cell_keys=[]))
    out.write_spec("name: x\n")
    assert not out.run_path.is_symlink() and out.read_run().cells == []
    assert not out.spec_path.is_symlink()
    path = out.cell_path("mixture", "Temp", 0, None)
    path.parent.mkdir(parents=True)
    path.symlink_to(outside / "precious.txt")
    path.with_suffix(".npz").symlink_to(outside / "precious.txt")
    out.write_cell(path, _record(), {"confidence": np.ones(3)})
    assert not path.is_symlink() and not path.with_suffix(".npz").is_symlink()
    assert out.check_cell(path, "k").record is not None
    _untouched(outside)


def test_selbench_run_with_a_linked_lock_exits_2(tmp_path, outside, write_spec, capsys):
    spec = write_spec(tiny_spec(seeds=[0], methods=[
        {"label": "Temp", "scheme": {"name": "recalibration"},
         "recalibrator": {"name": "temperature"}}]))
    res = tmp_path / "res"
    res.mkdir()
    (res / ResultsDir.LOCK).symlink_to(outside / "precious.txt")
    code = main(["run", str(spec), "--out", str(res), "--cache-dir", str(tmp_path / "cache"),
                 "--no-progress", "--no-plots", "-q"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("selbench: error:")]
    assert len(lines) == 1 and str(res / ResultsDir.LOCK) in lines[0], err
    assert "Traceback" not in err
    _untouched(outside)


# --------------------------------------------------------------------------- 2. entry points
@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path to install distributions into; their modules are forgotten after."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    before = set(sys.modules)
    yield root
    for name in set(sys.modules) - before:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(str(root)):
            del sys.modules[name]


def _plugins(*names: str) -> str:
    return ("from selbench import Plugin, hookimpl\n"
            "from selbench_plugins.recalibrators.temperature import TemperatureScaling\n"
            "@hookimpl\ndef selbench_recalibrators():\n"
            f"    return [{', '.join(f'Plugin({n!r}, TemperatureScaling)' for n in names)}]\n")


def test_two_distributions_with_one_entry_point_name_both_load(site, capsys):
    install_distribution(site, "acme-a", "1.0", {"acme_a": _plugins("acme-one")},
                         {"plugins": "acme_a"})
    install_distribution(site, "acme-b", "2.0", {"acme_b": _plugins("acme-two")},
                         {"plugins": "acme_b"})
    reg = Registry(make_plugin_manager())
    assert "skipped" not in capsys.readouterr().err
    one, two = reg.get("recalibrator", "acme-one"), reg.get("recalibrator", "acme-two")
    assert (one.distribution, two.distribution) == ("acme-a", "acme-b")
    assert one.origin.entry_point == two.origin.entry_point == "plugins"
    providers = {one.provider, two.provider}
    assert providers in ({"plugins", "plugins@acme-b"}, {"plugins", "plugins@acme-a"})
    assert providers <= set(reg.providers())
    assert "temperature" in reg.names("recalibrator")


def test_two_distributions_with_one_entry_point_and_one_plugin_name_clash(site):
    install_distribution(site, "acme-a", "1.0", {"acme_a": _plugins("twin")},
                         {"plugins": "acme_a"})
    install_distribution(site, "acme-b", "2.0", {"acme_b": _plugins("twin")},
                         {"plugins": "acme_b"})
    with pytest.raises(PluginError, match="'twin' is provided twice") as info:
        Registry(make_plugin_manager())
    assert "acme-a 1.0" in str(info.value) and "acme-b 2.0" in str(info.value)


def test_two_distributions_installing_one_module_get_one_warning(site, capsys):
    # both install shared_mod.py (the second overwrote the first): one module can be imported
    install_distribution(site, "acme-a", "1.0", {"shared_mod": _plugins("shared")},
                         {"plugins": "shared_mod"})
    install_distribution(site, "acme-b", "2.0", {"shared_mod": _plugins("shared")},
                         {"plugins": "shared_mod"})
    reg = Registry(make_plugin_manager())
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("selbench: warning:")]
    assert len(warnings) == 1, err
    assert all(s in warnings[0] for s in ("acme-a 1.0", "acme-b 2.0", "'plugins'")), warnings
    assert len(reg.skipped) == 1
    assert reg.get("recalibrator", "shared").distribution in ("acme-a", "acme-b")


def test_one_distribution_seen_twice_loads_once_without_a_word(site, capsys):
    install_distribution(site, "acme-a", "1.0", {"acme_a": _plugins("acme-one")},
                         {"plugins": "acme_a"})
    install_distribution(site, "acme-a", "1.1", {"acme_a": _plugins("acme-one")},
                         {"plugins": "acme_a"})
    reg = Registry(make_plugin_manager())
    assert "warning" not in capsys.readouterr().err and reg.skipped == []
    assert reg.get("recalibrator", "acme-one").provider == "plugins"


def test_the_built_in_entry_point_name_is_selbenchs_own(site, capsys):
    install_distribution(site, "impostor", "1.0", {"impostor_mod": _plugins("impostor-one")},
                         {"selbench_plugins": "impostor_mod"})
    pm = make_plugin_manager()
    assert pm.origin("selbench_plugins").distribution == "selbench"
    reg = Registry(pm)
    assert reg.get("recalibrator", "temperature").provider == "selbench_plugins"
    assert reg.get("recalibrator", "impostor-one").provider == "selbench_plugins@impostor"
    assert "warning" not in capsys.readouterr().err


def test_blocked_entry_point_names_block_every_distribution(site):
    install_distribution(site, "acme-a", "1.0", {"acme_a": _plugins("acme-one")},
                         {"plugins": "acme_a"})
    install_distribution(site, "acme-b", "2.0", {"acme_b": _plugins("acme-two")},
                         {"plugins": "acme_b"})
    pm = SelbenchPluginManager()
    pm.set_blocked("plugins")
    assert pm.load_setuptools_entrypoints("selbench", name="plugins") == 0


# --------------------------------------------------------------------------- 3. betas, delta
def _task(n=300, k=4, seed=0):
    rng = np.random.default_rng(seed)
    x, z, labels = sampled_linear_task(rng, n, 6, k)
    return (2 * z).astype(np.float32), labels


@pytest.fixture(scope="module")
def fitted():
    z, y = _task()
    plain = SelectiveRecalibrator(selector="none", scheme="recalibration", loss=None,
                                  coverage=None).fit(z, y)
    conf = SelectiveRecalibrator(selector="confidence", scheme="recalibration", loss=None,
                                 coverage=None).fit(z, y)
    return {"none": plain, "confidence": conf}, _task(n=200, seed=1)


BAD_BETAS = [([1.5], "betas"), ([-1], "betas"), ([float("nan")], "betas"), ([], "betas"),
             (0.0, "betas"), ([[0.5, 0.6]], "betas"), ("high", "betas")]


@pytest.mark.parametrize("selector", ["none", "confidence"])
@pytest.mark.parametrize("betas, name", BAD_BETAS, ids=[repr(b[0]) for b in BAD_BETAS])
def test_evaluate_refuses_impossible_betas_for_every_selector(fitted, selector, betas, name):
    models, (z, y) = fitted
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        models[selector].evaluate(z, y, betas=betas)


@pytest.mark.parametrize("selector", ["none", "confidence"])
@pytest.mark.parametrize("delta", [2, 0, -0.1, float("nan"), "x", True])
def test_evaluate_and_accept_refuse_a_bad_delta_for_every_selector(fitted, selector, delta):
    models, (z, y) = fitted
    with pytest.raises(ValueError, match=r"^delta\b"):
        models[selector].evaluate(z, y, betas=[0.8], delta=delta)
    with pytest.raises(ValueError, match=r"^delta\b"):
        models[selector].accept(z, delta=delta)


@pytest.mark.parametrize("selector", ["none", "confidence"])
@pytest.mark.parametrize("beta", [1.5, -1, 0.0, float("nan"), [0.5], "x", True])
def test_accept_refuses_an_impossible_beta_for_every_selector(fitted, selector, beta):
    models, (z, _) = fitted
    with pytest.raises(ValueError, match=r"^beta\b"):
        models[selector].accept(z, beta=beta)


def test_valid_betas_measure_as_before(fitted):
    models, (z, y) = fitted
    for est in models.values():
        a = est.evaluate(z, y, betas=[0.5, 0.75], delta=0.1)
        b = est.evaluate(z, y, betas=np.array([0.5, 0.75], dtype=np.float32), delta=0.1)
        assert all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)
        assert est.evaluate(z, y, betas=0.5)["ece1"].shape == (1,)


# --------------------------------------------------------------------------- 4. score
def test_score_is_minus_the_selective_ece_at_beta(fitted):
    models, (z, y) = fitted
    for est in models.values():
        s = est.score(z, y)
        assert isinstance(s, float)
        assert s == -est.evaluate(z, y, betas=[est.beta])["ece1"][0]
        x = np.ones((len(y), 3), dtype=np.float32)
        feat = SelectiveRecalibrator(**{**est.get_params(), "beta": 0.6}).fit(z, y, features=x)
        assert feat.score(z, y, features=x) == -feat.evaluate(z, y, x, betas=[0.6])["ece1"][0]


def test_grid_search_needs_no_scorer():
    from sklearn.model_selection import GridSearchCV

    z, y = _task(n=400)
    est = SelectiveRecalibrator(selector="confidence", scheme="recalibration", loss=None,
                                coverage=None)
    search = GridSearchCV(est, {"recalibrator": ["temperature", "none"]}, cv=2).fit(z, y)
    assert set(search.cv_results_["param_recalibrator"]) == {"temperature", "none"}
    assert np.isfinite(search.cv_results_["mean_test_score"]).all()
    assert (search.cv_results_["mean_test_score"] <= 0).all()
    best = search.best_estimator_
    zt, yt = _task(n=200, seed=3)
    assert search.score(zt, yt) == best.score(zt, yt) == -best.evaluate(zt, yt, betas=[0.8])[
        "ece1"][0]
    # a fold's score is the estimator's own score: KFold(2) tests on the first half first
    params = {**est.get_params(), **search.cv_results_["params"][0]}
    first = SelectiveRecalibrator(**params).fit(z[200:], y[200:])
    assert first.score(z[:200], y[:200]) == search.cv_results_["split0_test_score"][0]


def test_score_is_documented():
    from selbench.library import estimator

    assert "score" in SelectiveRecalibrator.__doc__ and "GridSearchCV" in estimator.__doc__


def test_plots_never_follow_a_link_out_of_the_results_folder(tmp_path):
    """A results folder whose plots/<experiment> folder links elsewhere: selbench plot refuses
    it with one line (bad input) and writes nothing through the link."""
    import shutil

    from selbench.cli import main

    committed = Path(__file__).resolve().parents[1] / "leaderboards" / "theory"
    out = tmp_path / "res"
    shutil.copytree(committed, out, ignore=shutil.ignore_patterns("plots"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "plots").symlink_to(elsewhere, target_is_directory=True)
    assert main(["plot", str(out)]) == 2
    assert list(elsewhere.iterdir()) == []
