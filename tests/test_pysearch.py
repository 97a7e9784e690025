"""Equal-budget tuning from Python (issue 36, item 4): ``selbench.tune`` / ``TuneSearch`` run the
spec route's tuning (:func:`selbench.execution.tuning.tune_cell`) on arrays and choose what a
spec's cell chooses for the same rows, seed and training β."""

from __future__ import annotations

import json

import numpy as np
import pytest
import selbench
from conftest import tiny_spec
from selbench import SelectiveRecalibrator, TuneSearch
from selbench.execution.runner import run
from selbench.library.estimator import ParamsError
from selbench.measure.evaluate import fit_indices
from sklearn.base import clone

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HB = {"label": "HB", "scheme": {"name": "recalibration"},
      "recalibrator": {"name": "histogram-binning"}}
SEQ = {"label": "Seq", "scheme": {"name": "sequential",
                                  "params": {"epochs": 5, "batch_size": 50, "lr": 5e-6}},
       "selector": {"name": "mlp", "params": {"hidden": [16]}},
       "recalibrator": {"name": "temperature"},
       "loss": {"name": "s-tlbce"}, "coverage": {"name": "quadratic"},
       "search": {"scheme.lr": {"log_uniform": [1e-6, 1e-1]}}}


def _arrays(path):
    rng = np.random.default_rng(11)
    n_val, n_test, k, d = 400, 200, 3, 5
    x = rng.normal(size=(n_val + n_test, d))
    z = 2.5 * x @ rng.normal(size=(d, k))
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = (p.cumsum(1) < rng.random((len(p), 1))).sum(1)
    split = np.array(["val"] * n_val + ["test"] * n_test)
    arrays = {"logits": z.astype(np.float32), "labels": y, "features": x.astype(np.float32),
              "split": split}
    np.savez(path, **arrays)
    return arrays


def _estimator(method: dict, **params) -> SelectiveRecalibrator:
    comps = {k: v for k, v in method.items() if k not in ("label", "search")}
    return SelectiveRecalibrator.from_method(comps, device="cpu", **params)


@pytest.mark.parametrize("sampler, protocol", [("random", {}), ("tpe", {}),
                                               ("random", {"folds": 3, "over": "betas"})])
def test_the_python_route_chooses_what_the_spec_route_chooses(tmp_path, sampler, protocol):
    arrays = _arrays(tmp_path / "outputs.npz")
    spec = tiny_spec(name="tuned", seeds=(0, 1), methods=[HB, SEQ], n_fit=300,
                     tuning={"trials": 4, "objective": "ece1", "sampler": sampler, **protocol},
                     bootstrap={"resamples": 0},
                     dataset={"name": "precomputed",
                              "params": {"path": str(tmp_path / "outputs.npz")}},
                     backbone={"name": "precomputed"})
    run(spec, out_dir=tmp_path / "out", progress=False, plots=False, device="cpu")
    val = arrays["split"] == "val"
    cells = {(r["method"], r["seed"]): r for r in (
        json.loads(p.read_text()) for p in (tmp_path / "out" / "cells").rglob("seed*.json"))}
    assert len(cells) == 4
    for method in (HB, SEQ):
        for seed in (0, 1):
            cell = cells[method["label"], seed]
            rows = fit_indices(int(val.sum()), 300, seed, "n_fit")
            search = selbench.tune(
                _estimator(method, beta=cell["train_beta"], seed=seed),
                arrays["logits"][val][rows], arrays["labels"][val][rows],
                arrays["features"][val][rows], trials=4, objective="ece1", sampler=sampler,
                search=method.get("search"), progress=False, **protocol)
            want = cell["tuning"]
            assert search.best_params_ == want["chosen"], (method["label"], seed)
            assert [h["params"] for h in search.tuning_["history"]] == \
                [h["params"] for h in want["history"]]
            np.testing.assert_allclose(search.cv_results_["value"],
                                       [h["value"] for h in want["history"]], rtol=1e-9)
            assert search.best_score_ == pytest.approx(want["best_value"], rel=1e-9)
            assert {k: want[k] for k in ("n_inner", "n_heldout", "space", "best_trial")} == \
                {k: search.tuning_[k] for k in ("n_inner", "n_heldout", "space", "best_trial")}


def test_search_attributes_refit_and_progress(tmp_path, capsys):
    arrays = _arrays(tmp_path / "o.npz")
    z, y = arrays["logits"][:300], arrays["labels"][:300]
    est = _estimator(HB, beta=0.8, seed=3)
    search = TuneSearch(est, trials=5, sampler="random").fit(z, y)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "tuning: 0/5 trials" and err[-1].startswith("tuning: 5/5 trials (100%), done")
    space = search.tuning_["space"]
    assert list(space) == ["recalibrator.n_bins"]  # the plugin's declared space
    res = search.cv_results_
    assert len(res["params"]) == 5 and res["param_recalibrator.n_bins"] == \
        [p["recalibrator.n_bins"] for p in res["params"]]
    assert res["rank"][search.best_index_] == 1 and sorted(res["rank"])[0] == 1
    assert search.best_score_ == pytest.approx(float(np.min(res["value"])))
    assert search.direction_ == "minimize"
    best = search.best_estimator_
    assert best.recalibrator["params"]["n_bins"] == search.best_params_["recalibrator.n_bins"]
    assert est.recalibrator == {"name": "histogram-binning"}  # the given estimator untouched
    ref = clone(best).fit(z, y)  # refitted on every row, as a fresh fit is
    np.testing.assert_array_equal(search.predict_confidence(z[:50]), ref.predict_confidence(z[:50]))
    np.testing.assert_array_equal(search.accept(z[:50], beta=0.5), ref.accept(z[:50], beta=0.5))
    assert search.score(z, y) == ref.score(z, y)
    # a journal keeps the trials: a larger budget extends the study, the first 5 unchanged
    journal = tmp_path / "t.journal"
    first = TuneSearch(est, trials=3, sampler="random", journal=journal, progress=False).fit(z, y)
    more = TuneSearch(est, trials=5, sampler="random", journal=journal, progress=False).fit(z, y)
    assert more.cv_results_["params"][:3] == first.cv_results_["params"]
    assert more.cv_results_["params"] == res["params"]


def test_what_cannot_be_tuned_is_named(tmp_path):
    arrays = _arrays(tmp_path / "o.npz")
    z, y = arrays["logits"][:200], arrays["labels"][:200]
    temp = _estimator({"scheme": {"name": "recalibration"}, "recalibrator": "temperature"})
    with pytest.raises(ParamsError, match="nothing to tune"):
        selbench.tune(temp, z, y, trials=2, progress=False)
    with pytest.raises(ParamsError, match=r"TuneSearch\.search\.recalibrator\.n_bin: .*did you "
                                          r"mean 'n_bins'"):
        selbench.tune(_estimator(HB), z, y, search={"recalibrator.n_bin": {"int": [2, 9]}},
                      progress=False)
    with pytest.raises(ParamsError, match="objective: unknown metric 'ece'"):
        selbench.tune(_estimator(HB), z, y, objective="ece", progress=False)
    from selbench_plugins.recalibrators.binning import HistogramBinning

    obj = SelectiveRecalibrator(scheme="recalibration", selector="none", loss=None,
                                coverage=None, recalibrator=HistogramBinning())
    with pytest.raises(ParamsError, match="recalibrator: a plugin object"):
        selbench.tune(obj, z, y, progress=False)
