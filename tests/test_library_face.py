"""The library face a scikit-learn / netcal user reaches for (issue 26, item 8): the
recalibrated distribution (``predict_proba``), a fitted scikit-learn classifier on its raw
inputs, labels of any hashable type, and the classic metrics (NLL, MCE, equal-width and
debiased ECE, the selector's AUROC and FPR@95TPR, the full-distribution NLL and class-wise
ECE) as functions checked against their references and as leaderboard columns."""

from __future__ import annotations

import json
import re
import warnings

import calibration
import numpy as np
import pytest
from calibration.utils import bin as lib_bin
from calibration.utils import difference_mean, get_equal_bins
from conftest import tiny_spec
from selbench import DataError, SelectiveRecalibrator
from selbench.execution.runner import run
from selbench.library.adapters import DistributionError
from selbench.library.estimator import ParamsError
from selbench.measure import metrics as M
from selbench.measure.evaluate import measure
from selbench.metrics import (
    ece_equal_width,
    fpr_at_tpr,
    mce,
    nll,
    nll_full,
    selector_auroc,
)
from selbench.spec import SpecError, load_spec
from sklearn.base import clone
from sklearn.datasets import make_classification
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss, roc_auc_score, roc_curve
from sklearn.model_selection import GridSearchCV

RECAL = {"selector": "none", "scheme": "recalibration", "loss": None, "coverage": None,
         "device": "cpu"}
NAMES = np.array(["cat", "dog", "eel"])


def _task(n=900, k=3, seed=0):
    x, y = make_classification(n, 8, n_informative=5, n_classes=k, random_state=seed)
    return x, y


def _logits(seed=0, n=600, k=4, scale=3.0):
    rng = np.random.default_rng(seed)
    z = (rng.normal(size=(n, k)) * scale).astype(np.float32)
    y = np.array([rng.choice(k, p=np.exp(r) / np.exp(r).sum()) for r in z / 2.0])
    return z, y


# --------------------------------------------------------------------------- predict_proba
def test_predict_proba_is_the_recalibrated_softmax_and_agrees_with_confidence_and_predict():
    z, y = _logits()
    est = SelectiveRecalibrator(recalibrator="temperature", **RECAL).fit(z[:300], y[:300])
    p = est.predict_proba(z[300:])
    zz = z[300:].astype(np.float64) / est.recalibrator_.T_
    ref = np.exp(zz - zz.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    assert est.recalibrator_.T_ != pytest.approx(1.0, abs=0.05)  # really recalibrated
    np.testing.assert_allclose(p, ref, atol=2e-6)
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-12)
    np.testing.assert_allclose(p.max(1), est.predict_confidence(z[300:]), atol=2e-6)
    np.testing.assert_array_equal(p.argmax(1), est.predict(z[300:]))
    np.testing.assert_allclose(np.exp(est.predict_log_proba(z[300:])), p, atol=2e-6)


def test_top_label_platt_distribution_puts_the_confidence_on_the_prediction():
    z, y = _logits(seed=1)
    est = SelectiveRecalibrator(recalibrator="platt", **RECAL).fit(z[:300], y[:300])
    p = est.predict_proba(z[300:])
    pred = est.predict(z[300:])
    conf = est.predict_confidence(z[300:])
    np.testing.assert_allclose(p[np.arange(len(pred)), pred], conf, atol=2e-6)
    # the rest is shared in proportion to the original probabilities
    q = np.exp(z[300:] - z[300:].max(1, keepdims=True))
    rest = np.where(np.arange(4) == pred[:, None], 0.0, q)
    rest = rest / rest.sum(1, keepdims=True) * (1 - conf)[:, None]
    other = np.arange(4) != pred[:, None]
    np.testing.assert_allclose(p[other], rest[other], atol=2e-6)


def test_predict_proba_of_a_top_label_only_recalibrator_is_a_clear_error():
    z, y = _logits()
    est = SelectiveRecalibrator(recalibrator="histogram-binning", **RECAL).fit(z, y)
    with pytest.raises(DistributionError, match="recalibrator 'histogram-binning'.*defines no "
                       "recalibrated distribution"):
        est.predict_proba(z)
    assert issubclass(DistributionError, ValueError)
    # evaluate still works, without the distribution's metrics
    out = est.evaluate(z, y, betas=[1.0])
    assert "nll" in out and "nll_full" not in out


# --------------------------------------------------------------------------- labels
def test_string_labels_are_mapped_to_sorted_classes_and_reported_back():
    z, y = _logits(k=3)
    names = NAMES[y]
    est = SelectiveRecalibrator(recalibrator="temperature", **RECAL).fit(z[:300], names[:300])
    np.testing.assert_array_equal(est.classes_, NAMES)
    ref = SelectiveRecalibrator(recalibrator="temperature", **RECAL).fit(z[:300], y[:300])
    np.testing.assert_array_equal(est.predict(z[300:]), NAMES[ref.predict(z[300:])])
    a = est.evaluate(z[300:], names[300:], betas=[0.8, 1.0])
    b = ref.evaluate(z[300:], y[300:], betas=[0.8, 1.0])
    for key in ("ece1", "accuracy", "nll", "nll_full"):
        np.testing.assert_array_equal(a[key], b[key])
    assert est.score(z[300:], names[300:]) == ref.score(z[300:], y[300:])
    with pytest.raises(DataError, match=r"labels: labels\[0\] = 'fox' is not one of the classes"):
        est.evaluate(z[:2], np.array(["fox", "cat"]))


def test_labels_that_do_not_name_the_columns_need_classes():
    z, y = _logits(k=3)
    with pytest.raises(DataError, match=r"labels: 2 distinct labels .* K=3 columns; pass "
                       r"classes="):
        SelectiveRecalibrator(recalibrator="temperature", **RECAL).fit(
            z, np.where(y == 0, "a", "b"))
    # classes names the columns in their order (not sorted), as the caller says
    order = np.array(["eel", "cat", "dog"])
    est = SelectiveRecalibrator(recalibrator="temperature", **RECAL).fit(
        z, order[y], classes=order)
    np.testing.assert_array_equal(est.classes_, order)
    np.testing.assert_array_equal(est.predict(z), order[z.argmax(1)])
    # integers outside [0, K) are sorted as scikit-learn does: {1, 2} -> columns 0, 1
    z2, y2 = _logits(k=2)
    est2 = SelectiveRecalibrator(recalibrator="temperature", **RECAL).fit(z2, y2 + 1)
    np.testing.assert_array_equal(est2.classes_, [1, 2])
    assert set(np.unique(est2.predict(z2))) <= {1, 2}


# --------------------------------------------------------------------------- a classifier
def test_a_fitted_classifier_on_raw_inputs_equals_its_logits():
    x, y = _task()
    names = NAMES[y]
    clf = LogisticRegression(max_iter=1000).fit(x[:300], names[:300])
    est = SelectiveRecalibrator(recalibrator="temperature", classifier=clf, **RECAL)
    est.fit(x[300:600], names[300:600])
    np.testing.assert_array_equal(est.classes_, clf.classes_)
    z = clf.decision_function(x)
    ref = SelectiveRecalibrator(recalibrator="temperature", **RECAL).fit(z[300:600], y[300:600])
    np.testing.assert_allclose(est.predict_proba(x[600:]), ref.predict_proba(z[600:]),
                               atol=1e-12)
    np.testing.assert_array_equal(est.predict(x[600:]), NAMES[ref.predict(z[600:])])
    # before recalibration the logits are the classifier's own probabilities
    raw = SelectiveRecalibrator(recalibrator="none", classifier=clf, **RECAL).fit(
        x[300:600], names[300:600])
    np.testing.assert_allclose(raw.predict_proba(x[600:]), clf.predict_proba(x[600:]),
                               atol=2e-6)


def test_classifier_survives_clone_and_grid_search_and_must_be_fitted():
    x, y = _task()
    clf = LogisticRegression(max_iter=1000).fit(x[:300], NAMES[y[:300]])
    est = SelectiveRecalibrator(classifier=clf, **RECAL)
    assert clone(est).classifier is clf
    grid = GridSearchCV(est, {"recalibrator": ["temperature", "histogram-binning"]}, cv=3)
    grid.fit(x[300:], NAMES[y[300:]])
    assert grid.best_params_["recalibrator"] in ("temperature", "histogram-binning")
    assert set(grid.predict(x[:50])) == set(NAMES)
    with pytest.raises(ParamsError, match="classifier: LogisticRegression is not fitted"):
        SelectiveRecalibrator(classifier=LogisticRegression(), **RECAL).fit(x, y)


def test_a_probability_only_classifier_gives_log_probabilities_as_logits():
    x, y = _task()
    forest = RandomForestClassifier(20, random_state=0).fit(x[:300], y[:300])
    assert not hasattr(forest, "decision_function")
    est = SelectiveRecalibrator(recalibrator="none", classifier=forest, **RECAL)
    est.fit(x[300:600], y[300:600])
    p = forest.predict_proba(x[600:])
    # a zero probability is floored (finite logits): the identity gives p back
    assert (p == 0).any()
    np.testing.assert_allclose(est.predict_proba(x[600:]), p, atol=1e-6)


# --------------------------------------------------------------------------- metrics
def _data(n, seed):
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.3, 1.0, n)
    conf[: n // 4] = np.round(conf[: n // 4], 1)  # ties
    conf[0] = 1.0
    corr = (rng.uniform(size=n) < conf).astype(float)
    scores = np.round(rng.normal(size=n) + corr, 1)  # ties in the scores
    return conf, corr, scores


@pytest.mark.parametrize("n", [7, 60, 1000, 5000])
def test_classic_metrics_equal_their_references(n):
    conf, corr, scores = _data(n, n)
    ilab = corr.astype(int)
    assert nll(conf, corr) == pytest.approx(log_loss(corr, conf, labels=[0, 1]), abs=1e-12)
    for p in (1, 2):
        ref = calibration.lower_bound_scaling_ce(
            conf, ilab, p=p, debias=False, num_bins=15,
            binning_scheme=calibration.get_equal_prob_bins, mode="top-label")
        assert ece_equal_width(conf, corr, p=p) == pytest.approx(ref, abs=1e-12)
    ref_deb = calibration.lower_bound_scaling_ce(conf, ilab, p=2, debias=True, num_bins=15,
                                                 binning_scheme=get_equal_bins, mode="top-label")
    assert M.ece(conf, corr, p=2, debias=True) == pytest.approx(ref_deb, abs=1e-12)
    binned = lib_bin(list(zip(conf, corr)), get_equal_bins(conf, 15))
    ref_mce = max(abs(difference_mean(b)) for b in binned if len(b))
    assert mce(conf, corr) == pytest.approx(ref_mce, abs=1e-12)
    assert mce(conf, corr) >= M.ece(conf, corr)
    assert selector_auroc(scores, corr) == pytest.approx(roc_auc_score(corr, scores), abs=1e-12)
    fpr, tpr, _ = roc_curve(corr, scores)
    for level in (0.95, 0.5, 1.0):
        assert fpr_at_tpr(scores, corr, tpr=level) == pytest.approx(
            fpr[np.searchsorted(tpr, level)], abs=1e-12)
    k = 5
    rng = np.random.default_rng(n)
    logp = np.log(rng.dirichlet(np.full(k, 0.3), n))
    y = rng.integers(0, k, n)
    assert nll_full(logp, y) == pytest.approx(
        log_loss(y, np.exp(logp), labels=range(k)), abs=1e-12)


def test_classic_metrics_edge_cases():
    assert np.isnan(selector_auroc([0.1, 0.2], [1, 1]))
    assert np.isnan(fpr_at_tpr([0.1, 0.2], [0, 0]))
    assert nll([1.0, 0.0], [0, 1]) == pytest.approx(-np.log(np.finfo(float).eps))
    with pytest.raises(ValueError, match="tpr must lie in"):
        fpr_at_tpr([0.1, 0.2], [0, 1], tpr=0)
    with pytest.raises(ValueError, match="confidence"):
        nll([1.5], [1])
    # a perfect separation: AUROC 1, no wrong prediction accepted at 95 % TPR
    assert selector_auroc([3, 2, 1, 0], [1, 1, 0, 0]) == 1.0
    assert fpr_at_tpr([3, 2, 1, 0], [1, 1, 0, 0]) == 0.0


def test_registry_has_the_classic_metrics_with_directions_and_cells_measure_them():
    lower = {"nll": True, "mce": True, "ece1_ew": True, "ece2_debiased": True,
             "auroc": False, "fpr95": True, "nll_full": True, "classwise_ece": True}
    for key, low in lower.items():
        assert M.METRICS[key].lower_is_better is low, key
    assert M.METRICS["auroc"].kind == "ranking" and M.METRICS["fpr95"].kind == "ranking"
    assert M.METRICS["nll_full"].needs == "log_probs"
    conf, corr, scores = _data(800, 3)
    betas = [0.5, 0.8, 1.0]
    arrays = {"score": scores, "confidence": conf, "correct": corr,
              "labels": (1 - corr).astype(np.int64)}  # the labels some ranking metrics read
    out = measure(arrays, betas, delta=None, seed=4)
    order = M.selection_order(scores, seed=4)
    for j, b in enumerate(betas):
        acc = order[: int(np.ceil(b * 800 - 1e-9))]
        assert out["nll"][j] == pytest.approx(nll(conf[acc], corr[acc]), abs=1e-12)
        assert out["mce"][j] == pytest.approx(mce(conf[acc], corr[acc]), abs=1e-12)
        assert out["ece1_ew"][j] == pytest.approx(ece_equal_width(conf[acc], corr[acc]),
                                                  abs=1e-12)
    np.testing.assert_array_equal(out["auroc"], selector_auroc(scores, corr))
    assert "nll_full" not in out


def test_distribution_columns_run_in_a_spec_and_are_refused_where_undefined(tmp_path):
    methods = [{"label": "Temp. scale", "scheme": {"name": "recalibration"},
                "recalibrator": {"name": "temperature"}, "selector": {"name": "confidence"}}]
    cols = ["ece1", "nll", "nll_full", "classwise_ece", "auroc", "fpr95", "mce", "ece1_ew"]
    spec = tiny_spec(methods=methods, seeds=[0], metrics=cols)
    run(spec, out_dir=tmp_path / "a", progress=False, plots=False)
    board = json.loads((tmp_path / "a" / "leaderboard.json").read_text())
    row = board["experiments"][0]["rows"][0]["metrics"]
    for key in cols:
        assert np.isfinite(row[key]["auc"]["mean"]), key
    assert row["auroc"]["auc"]["mean"] > 0.5  # confidence separates right from wrong
    # the cell is keyed on the distribution's columns it computed
    cell = json.loads(next((tmp_path / "a").rglob("seed0.json")).read_text())
    assert cell["components"]["distribution_metrics"] == ["classwise_ece", "nll_full"]
    assert 0.0 < cell["metrics"]["nll_full"][-1] < 5.0
    # a recalibrator without a distribution: validate names it, before anything runs
    bad = tiny_spec(methods=[{**methods[0], "recalibrator": {"name": "histogram-binning"}}],
                    seeds=[0], metrics=["nll_full"])
    with pytest.raises(SpecError, match=r"experiments\[0\]\.metrics: 'nll_full' need the "
                       r"recalibrated distribution, which recalibrator 'histogram-binning'"):
        load_spec(bad)
    # without such a column nothing changes in the cells' keys
    plain = tiny_spec(methods=methods, seeds=[0], metrics=["ece1"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run(plain, out_dir=tmp_path / "b", progress=False, plots=False)
    cell_b = json.loads(next((tmp_path / "b").rglob("seed0.json")).read_text())
    assert "distribution_metrics" not in cell_b["components"]
    assert cell_b["metrics"]["nll"] == cell["metrics"]["nll"]


# --------------------------------------------------------------------------- the kit
def test_the_conformance_kit_runs_without_pytest():
    """``check_plugin`` in a process where ``import pytest`` fails (selbench's first install
    has no pytest); only ``parametrize_with_checks`` needs it, and says so."""
    import subprocess
    import sys

    code = (
        "import sys, warnings\n"
        "sys.modules['pytest'] = None  # import pytest now raises ImportError\n"
        "from selbench.testing import check_plugin, parametrize_with_checks, ConformanceError\n"
        "check_plugin('recalibrator', 'temperature')\n"
        "check_plugin('selector', 'confidence')\n"
        "from selbench import Recalibrator\n"
        "class Bad(Recalibrator):\n"
        "    def fit(self, outputs, context): return None\n"
        "    def confidence(self, outputs): return outputs.confidence()\n"
        "try:\n"
        "    check_plugin('recalibrator', Bad)\n"
        "except ConformanceError as exc:\n"
        "    print('BROKEN', 'check_fit_returns_self' in str(exc))\n"
        "try:\n"
        "    parametrize_with_checks([('recalibrator', 'temperature')])\n"
        "except ImportError:\n"
        "    print('NEEDS PYTEST')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert re.fullmatch(r"recalibrator 'temperature': \d+ checks passed", lines[0]), out.stdout
    assert re.fullmatch(r"selector 'confidence': \d+ checks passed", lines[1]), out.stdout
    assert lines[2:4] == ["BROKEN True", "NEEDS PYTEST"], out.stdout
