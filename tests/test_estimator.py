"""``selbench.SelectiveRecalibrator``: a scikit-learn estimator over the core's own fitting,
selection and metrics (issue 11, item 1)."""

from __future__ import annotations

import math
import pickle
import re

import numpy as np
import pytest
from conftest import REPO, sampled_linear_task
from selbench import DataError, ModelOutputs, SelectiveRecalibrator
from selbench.contract.api import FitContext, Scheme
from selbench.library.estimator import ParamsError
from selbench.measure.evaluate import measure, score
from selbench.measure.metrics import DEFAULT_BETAS, accept_mask
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: a short training run: the tests check behaviour, not the paper's numbers
FAST = {"name": "joint", "params": {"epochs": 15, "batch_size": 64, "lr": 5e-3}}
SMALL_MLP = {"name": "mlp", "params": {"hidden": [16]}}
PLAIN = dict(selector="none", scheme="recalibration", loss=None, coverage=None)


def task(n=300, d=6, k=4, seed=0):
    """Over-confident logits with a cluster of noisy labels, features of dimension d."""
    rng = np.random.default_rng(seed)
    x, z, labels = sampled_linear_task(rng, n, d, k)
    bad = np.arange(n) < n // 4
    x[bad, 0] += 3.0
    labels[bad] = rng.integers(0, k, bad.sum())
    return (2 * z).astype(np.float32), labels, x.astype(np.float32)


@pytest.fixture(scope="module")
def data():
    return task(seed=0), task(n=200, seed=1)


def joint(**kw):
    return SelectiveRecalibrator(scheme=FAST, selector=SMALL_MLP, **kw)


# --------------------------------------------------------------------------- the README
def _readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## From Python", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]


def test_readme_example_is_at_most_ten_lines_and_runs(capsys):
    code = _readme_example()
    assert len(code.strip().splitlines()) <= 10
    assert "accept(" in code and "beta=0.8" in code and '"ece1"' in code
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    out = capsys.readouterr().out
    match = re.fullmatch(r"accepted (\d+\.\d)%, selective ECE at 80% coverage: (\d\.\d{3})\n",
                         out)
    assert match, out
    assert float(match.group(1)) == pytest.approx(80.0, abs=0.2)  # ceil(0.8 n) of n = 597
    assert 0 <= float(match.group(2)) < 0.1


# --------------------------------------------------------------------------- parameters
def test_defaults_are_the_papers_method(data):
    est = SelectiveRecalibrator()
    assert est.get_params() == {
        "selector": "mlp", "recalibrator": "temperature", "scheme": "joint", "loss": "s-tlbce",
        "coverage": "quadratic", "beta": 0.8, "seed": 0, "device": "auto", "classifier": None}
    (z, y, x), _ = data
    est.set_params(scheme={"name": "joint", "params": {"epochs": 2}}).fit(z, y, features=x)
    names = {k: type(getattr(est, k + "_")).__name__
             for k in ("selector", "recalibrator", "scheme", "loss", "coverage")}
    assert names == {"selector": "MLPSelector", "recalibrator": "TemperatureScaling",
                     "scheme": "JointScheme", "loss": "STLBCE", "coverage": "QuadraticCoverage"}
    from selbench.execution.runner import resolve_device

    assert est.device_ == resolve_device("auto")
    assert (est.n_classes_, est.feature_dim_, est.features_given_) == (4, 6, True)
    np.testing.assert_array_equal(est.classes_, np.arange(4))


class SpyScheme(Scheme):
    """Records the context a scheme receives (in the class: the estimator fits a copy of the
    object it is given); fits h on everything."""

    seen: list = []

    def fit(self, outputs, *, selector, recalibrator, loss, coverage, context):
        SpyScheme.seen.append(context)
        recalibrator.fit(outputs, context)
        selector.fit(outputs, recalibrator.confidence(outputs), context)
        return self


def test_beta_seed_and_device_reach_the_scheme(data):
    """The issue's complaint: forgetting FitContext(beta=...) trained for coverage 1.0."""
    (z, y, x), _ = data
    SpyScheme.seen = []
    est = SelectiveRecalibrator(scheme=SpyScheme(), selector="confidence", loss=None,
                                coverage=None, beta=0.65, seed=7, device="cpu")
    est.fit(z, y)
    (ctx,) = SpyScheme.seen
    assert (ctx.beta, ctx.seed, ctx.device) == (0.65, 7, "cpu")


def test_plain_recalibration_is_temperature_scaling(data):
    (z, y, _), (z2, _, _) = data
    est = SelectiveRecalibrator(**PLAIN).fit(z, y)
    from selbench_plugins.recalibrators.temperature import TemperatureScaling

    ref = TemperatureScaling().fit(ModelOutputs(features=z, logits=z, labels=y), FitContext())
    assert est.recalibrator_.T_ == pytest.approx(ref.T_, rel=1e-9)
    assert est.accept(z2, beta=0.5).all()  # selector 'none' accepts everything


@pytest.mark.parametrize("params, line", [
    (dict(selector="mpl"), "selector.name: unknown selector 'mpl'; did you mean 'mlp'?"),
    (dict(scheme={"name": "joint", "params": {"lr": "fast"}}), "scheme.params.lr: Input "
     "should be a valid number"),
    (dict(scheme={"name": "joint", "params": {"epoch": 3}}), "scheme.params.epoch: unknown "
     "key 'epoch'; did you mean 'epochs'? valid keys: epochs, batch_size"),
    (dict(scheme={"name": "joint", "parameters": {}}), "scheme: unknown key(s) 'parameters'"),
    (dict(selector="confidence"), "selector.name: scheme 'joint' trains the selector through "
     "its loss; selector 'confidence' is not trainable (trainable selectors: meta-features, mlp)"),
    (dict(loss=None), "loss: scheme 'joint' needs a selective loss"),
    (dict(loss="quadratic"), "loss.name: 'quadratic' is a coverage loss; `loss` expects a "
     "SelectionLoss"),
    (dict(recalibrator="histogram-binning"), "recalibrator.name: scheme 'joint' trains the "
     "recalibrator with the selector and needs a differentiable one"),
    (dict(scheme=None), "scheme: a scheme is required"),
    (dict(selector=3), "selector: expected a registered name, a {name, params} mapping or a "
     "selector object, got int 3"),
    (dict(beta=0.0), "beta: the training coverage must be a number in (0, 1], got 0.0"),
    (dict(beta=True), "beta: the training coverage must be a number in (0, 1]"),
    (dict(seed=-1), "seed: expected an integer 0 <= seed <= 2**32 - 1, got -1"),
    (dict(seed=1.5), "seed: expected an integer"),
    (dict(device="tpu"), "device: expected one of auto, cpu, cuda, got 'tpu'"),
])
def test_bad_params_are_named_like_spec_paths(data, params, line):
    (z, y, _), _ = data
    with pytest.raises(ParamsError) as info:
        SelectiveRecalibrator(**params).fit(z, y)
    assert any(e.startswith(line) for e in info.value.errors), info.value.errors
    assert isinstance(info.value, ValueError)


def test_a_plugin_class_instead_of_an_instance_is_explained(data):
    from selbench_plugins.recalibrators.temperature import TemperatureScaling

    (z, y, _), _ = data
    with pytest.raises(ParamsError, match=r"recalibrator: got the class TemperatureScaling; "
                                          r"pass an instance, e\.g\. TemperatureScaling\(\)"):
        SelectiveRecalibrator(recalibrator=TemperatureScaling, **PLAIN).fit(z, y)


def test_set_params_and_unknown_params():
    est = SelectiveRecalibrator().set_params(beta=0.5, selector={"name": "none"})
    assert est.get_params()["beta"] == 0.5 and est.selector == {"name": "none"}
    with pytest.raises(ValueError, match="Invalid parameter 'lam'"):
        est.set_params(lam=3)


def test_from_method_takes_a_spec_method_with_the_specs_defaults():
    est = SelectiveRecalibrator.from_method(
        {"label": "Temp. scale", "scheme": {"name": "recalibration"},
         "recalibrator": {"name": "temperature"}}, seed=3)
    assert est.get_params() == {"scheme": {"name": "recalibration"}, "selector": "none",
                                "recalibrator": {"name": "temperature"}, "loss": None,
                                "coverage": None, "beta": 0.8, "seed": 3, "device": "auto",
                                "classifier": None}
    with pytest.raises(ParamsError, match="colour: not a field of a method"):
        SelectiveRecalibrator.from_method({"scheme": "joint", "colour": "red"})


# --------------------------------------------------------------------------- clone, pickle
def test_clone_then_fit_reproduces_fit_exactly(data):
    (z, y, x), (z2, _, x2) = data
    est = joint(seed=3, beta=0.7)
    first = est.fit(z, y, features=x)
    conf, scores = first.predict_confidence(z2, x2), first.decision_function(z2, x2)
    twin = clone(est)
    assert twin.get_params() == est.get_params() and not hasattr(twin, "selector_")
    twin.fit(z, y, features=x)
    np.testing.assert_array_equal(twin.predict_confidence(z2, x2), conf)
    np.testing.assert_array_equal(twin.decision_function(z2, x2), scores)
    # and refitting the same estimator gives the same model again (fit seeds everything)
    np.testing.assert_array_equal(est.fit(z, y, features=x).decision_function(z2, x2), scores)


def test_a_different_seed_gives_a_different_model(data):
    (z, y, x), (z2, _, x2) = data
    a = joint(seed=0).fit(z, y, features=x).decision_function(z2, x2)
    b = joint(seed=1).fit(z, y, features=x).decision_function(z2, x2)
    assert not np.array_equal(a, b)


def test_plugin_objects_are_used_as_given_and_never_changed(data):
    from selbench_plugins.recalibrators.temperature import TemperatureScaling

    (z, y, x), (z2, _, x2) = data
    obj = TemperatureScaling(min_temperature=0.01)
    before = dict(vars(obj))
    est = joint(recalibrator=obj).fit(z, y, features=x)
    assert vars(obj) == before and est.recalibrator_ is not obj
    assert est.get_params()["recalibrator"] is obj
    by_name = joint(recalibrator={"name": "temperature", "params": {"min_temperature": 0.01}})
    np.testing.assert_array_equal(by_name.fit(z, y, features=x).predict_confidence(z2, x2),
                                  est.predict_confidence(z2, x2))
    twin = clone(est).fit(z, y, features=x)
    assert twin.recalibrator is not obj
    np.testing.assert_array_equal(twin.predict_confidence(z2, x2), est.predict_confidence(z2, x2))


def test_pickled_fitted_estimator_gives_identical_outputs(data):
    (z, y, x), (z2, y2, x2) = data
    est = joint().fit(z, y, features=x)
    back = pickle.loads(pickle.dumps(est))
    for method in ("predict_confidence", "predict", "decision_function", "accept"):
        np.testing.assert_array_equal(getattr(back, method)(z2, x2), getattr(est, method)(z2, x2))
    a, b = back.evaluate(z2, y2, x2), est.evaluate(z2, y2, x2)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------- predictions
def test_predictions_are_the_fitted_components(data):
    (z, y, x), (z2, _, x2) = data
    est = joint().fit(z, y, features=x)
    out = ModelOutputs(features=x2, logits=z2, labels=np.zeros(len(z2), dtype=np.int64))
    conf = est.recalibrator_.confidence(out)
    np.testing.assert_array_equal(est.predict_confidence(z2, x2), conf)
    np.testing.assert_array_equal(est.predict(z2, x2), np.argmax(z2, axis=1))
    np.testing.assert_array_equal(est.decision_function(z2, x2), est.selector_.score(out, conf))
    assert est.predict(z2, x2).dtype == np.int64


@pytest.mark.parametrize("beta", [0.5, 0.8, 0.55, 1.0])
def test_accept_is_the_cores_rule(data, beta):
    (z, y, x), (z2, _, x2) = data
    est = joint(seed=5).fit(z, y, features=x)
    mask = est.accept(z2, x2, beta=beta)
    assert mask.dtype == bool and mask.sum() == math.ceil(beta * len(z2) - 1e-9)
    np.testing.assert_array_equal(mask, accept_mask(est.decision_function(z2, x2), beta, seed=5))
    if beta == 0.8:
        np.testing.assert_array_equal(est.accept(z2, x2), mask)  # default: the estimator's β


def test_accept_breaks_ties_with_the_seed_and_honours_delta(data):
    (z, y, _), (z2, _, _) = data
    # histogram binning + the confidence selector: few distinct scores, many ties
    params = dict(selector="confidence", recalibrator="histogram-binning",
                  scheme="recalibration", loss=None, coverage=None)
    masks = [SelectiveRecalibrator(**params, seed=s).fit(z, y).accept(z2, beta=0.5)
             for s in (0, 1)]
    assert all(m.sum() == 100 for m in masks) and not np.array_equal(*masks)
    est = SelectiveRecalibrator(**params).fit(z, y)
    guaranteed = est.accept(z2, beta=0.5, delta=0.1)
    expected = accept_mask(est.decision_function(z2), 0.5, delta=0.1, seed=0)
    np.testing.assert_array_equal(guaranteed, expected)
    assert guaranteed.sum() > 100


def test_evaluate_is_the_cores_measurement(data):
    (z, y, x), (z2, y2, x2) = data
    est = joint(seed=2).fit(z, y, features=x)
    got = est.evaluate(z2, y2, x2)
    out = ModelOutputs(features=x2, logits=z2, labels=y2)
    names = (est.names_["recalibrator"], est.names_["selector"])
    arrays = score(out, est.recalibrator_, est.selector_, names)
    # temperature defines the recalibrated distribution: its metrics are measured too
    arrays.update(log_probs=est.predict_log_proba(out), labels=out.labels)
    want = measure(arrays, list(DEFAULT_BETAS), delta=None, seed=2)
    assert {"nll_full", "classwise_ece"} <= set(want)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    at = est.evaluate(out, betas=0.8)
    assert at["coverage"].tolist() == [math.ceil(0.8 * 200) / 200]
    assert at["ece1"][0] == got["ece1"][np.flatnonzero(np.isclose(DEFAULT_BETAS, 0.8))[0]]
    assert "guaranteed_coverage" in est.evaluate(z2, y2, x2, betas=[0.5], delta=0.1)


def test_selector_none_is_measured_at_coverage_one(data):
    (z, y, _), (z2, y2, _) = data
    metrics = SelectiveRecalibrator(**PLAIN).fit(z, y).evaluate(z2, y2, betas=[0.5, 0.8])
    assert metrics["coverage"].tolist() == [1.0, 1.0]
    assert metrics["ece1"][0] == metrics["ece1"][1]


# --------------------------------------------------------------------------- inputs
def test_features_none_means_the_softmax_probabilities(data):
    (z, y, _), (z2, _, _) = data
    p, p2 = (ModelOutputs(features=a, logits=a, labels=np.zeros(len(a), dtype=int))
              .probabilities() for a in (z, z2))
    implicit = joint().fit(z, y)
    explicit = joint().fit(z, y, features=p)
    assert not implicit.features_given_ and implicit.feature_dim_ == 4
    np.testing.assert_array_equal(implicit.decision_function(z2),
                                  explicit.decision_function(z2, p2))
    np.testing.assert_array_equal(implicit.decision_function(z2),
                                  implicit.decision_function(z2, p2))


def test_model_outputs_are_accepted_in_place_of_arrays(data):
    (z, y, x), (z2, y2, x2) = data
    fit_out = ModelOutputs(features=x, logits=z, labels=y)
    eval_out = ModelOutputs(features=x2, logits=z2, labels=y2)
    a = joint().fit(fit_out)
    b = joint().fit(z, y, features=x)
    np.testing.assert_array_equal(a.decision_function(eval_out), b.decision_function(z2, x2))
    np.testing.assert_array_equal(a.evaluate(eval_out)["ece1"], b.evaluate(z2, y2, x2)["ece1"])
    with pytest.raises(TypeError, match="either a ModelOutputs or arrays"):
        a.predict(eval_out, x2)


def test_bad_arrays_get_the_data_contracts_errors(data):
    (z, y, x), (z2, _, x2) = data
    est = SelectiveRecalibrator(**PLAIN)
    with pytest.raises(DataError, match=r"^logits: has 300 rows but labels has 3"):
        est.fit(z, y[:3])
    with pytest.raises(DataError, match=r"^features: has 2 rows but labels has 300"):
        est.fit(z, y, features=x[:2])
    bad = z.copy()
    bad[4, 1] = np.nan
    with pytest.raises(DataError, match=r"^logits: contains NaN or infinite values \(first at "
                                        r"index \(4, 1\)\)"):
        est.fit(bad, y)
    probs = np.full((10, 4), 0.25)
    with pytest.raises(DataError, match="look like probabilities"):
        est.fit(probs, np.zeros(10, dtype=int))
    with pytest.raises(DataError, match=r"^labels: values must lie in \[0, 4\)"):
        est.fit(z, np.where(np.arange(len(y)) == 0, 9, y))  # 5 distinct labels for K = 4
    with pytest.raises(DataError, match=r"^labels: required"):
        est.fit(z)
    with pytest.raises(DataError, match=r"^logits: expected a 2-D array"):
        est.fit(z[:, 0], y)
    with pytest.raises(NotFittedError):
        est.predict(z2)
    est.fit(z, y, features=x)
    with pytest.raises(DataError, match=r"^logits: has 3 classes per row, but the estimator "
                                        r"was fitted on K=4"):
        est.predict(z2[:, :3], x2)
    with pytest.raises(DataError, match=r"^features: the estimator was fitted with features of "
                                        r"dimension 6"):
        est.predict_confidence(z2)
    with pytest.raises(DataError, match=r"^features: has 5 columns, but the estimator was "
                                        r"fitted on features of dimension 6"):
        est.accept(z2, x2[:, :5])
    with pytest.raises(ValueError, match="beta"):
        est.accept(z2, x2, beta=1.5)


# --------------------------------------------------------------------------- the runner
TRAINING = {"selection", "sequential", "joint"}


def _quickstart_methods() -> list[dict]:
    """The methods of specs/quickstart.yaml (YAML anchors expanded), trained for 20 epochs."""
    from selbench.spec import load_spec

    methods = load_spec(REPO / "specs" / "quickstart.yaml").raw["experiments"][0]["methods"]
    for m in methods:
        for field in ("scheme", "recalibrator"):
            comp = m.get(field) or {}
            if "epochs" in comp.get("params", {}):
                comp["params"]["epochs"] = 20
    return methods


def test_each_quickstart_method_is_its_estimator(tmp_path):
    """A YAML method is exactly the estimator's parameters: the estimator built from each
    method of the quickstart fits, on a cell's data, to that cell's metrics, bit for bit (one
    seed and one training β: the runner's fit_many trains one replica, as the estimator's
    fit does — one fitting path)."""
    import selbench
    from conftest import tiny_spec
    from selbench.execution import cells as cells_mod
    from selbench.execution.extraction import experiment_outputs
    from selbench.execution.keys import identify, output_keys
    from selbench.measure.evaluate import eval_rows, fit_indices
    from selbench.spec import load_spec
    from selbench.store.cache import OutputCache

    methods = _quickstart_methods()
    spec = tiny_spec(seeds=[3], methods=methods, train_beta=0.5, n_fit=300, n_eval=400)
    cells = {c.method: c for c in selbench.run(spec, out_dir=tmp_path, device="cpu",
                                                progress=False, plots=False).cells()}
    resolved = load_spec(spec)
    cache = OutputCache()
    keys = output_keys(resolved, identify(resolved, cache), 0)
    outputs = experiment_outputs(resolved, 0, keys, cache, "cpu", False)
    exp = resolved.spec.experiments[0]
    idx = fit_indices(len(outputs["val"]), exp.n_fit, 3, "")
    rows = eval_rows(len(outputs["test"]), idx, False, exp.n_eval, 0)
    fit_out, eval_out = outputs["val"].subset(idx), outputs["test"].subset(rows)
    assert len(cells) == len(methods) == 16
    canonical = resolved.canonical()["experiments"][0]["methods"]
    for m_i, method in enumerate(methods):
        # the runner's estimator of a cell: the canonical YAML method (defaults filled in)
        runners = cells_mod._Method(resolved, 0, m_i).estimator(3, 0.5, "cpu").get_params()
        assert runners == {**{k: v for k, v in canonical[m_i].items() if k != "label"},
                           "beta": 0.5, "seed": 3, "device": "cpu", "classifier": None}
        est = SelectiveRecalibrator.from_method(method, beta=0.5, seed=3, device="cpu")
        yaml_fields = {k: v for k, v in method.items() if k != "label"}
        assert {k: v for k, v in est.get_params().items() if k in yaml_fields} == yaml_fields
        got = est.fit(fit_out).evaluate(eval_out, betas=exp.betas)
        cell = cells[method["label"]]
        assert cell.selects == est._selects()
        for key, values in cell.metrics.items():
            np.testing.assert_array_equal(got[key], values, err_msg=f"{method['label']}: {key}")
