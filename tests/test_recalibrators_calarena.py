"""``sms``, ``svs`` and ``venn-abers`` against their references: probmetrics 1.3's
``SMSCalibrator`` / ``SVSCalibrator`` (the ``perf`` extra) and the ``venn-abers`` package,
on the real CIFAR outputs of ``../shared/data`` and on edge cases (K = 2, K = 1,000, ties, a
class absent from the fitting data, all-correct fitting data). Each reference test skips
without its package or data.

SMS / SVS minimise a strictly convex objective; probmetrics fits it in float32 with torchmin's
BFGS and stops early, we fit it in float64 to its optimum. So against probmetrics we check
(a) that *their* loss (their own closure, captured, on float64 inputs) has the value of our
objective and a vanishing gradient at our parameters, and that their ``predict_proba`` with
our parameters gives our probabilities: both exact up to rounding, and broken by any change
of definition (temperature, mixture, penalty, its centre or its structure); and (b) that
their fit as shipped lands within a stated distance of ours (measured: CIFAR-100 probabilities
at most 1.1e-3 apart, 1.6e-6 on average; CIFAR-10 3.2e-3 / 3.1e-5; a wrong variant, e.g. SMS
with one ridge strength for all of W, is 0.16-0.59 / 1.8e-3 away).

Venn–Abers is exact arithmetic on counts: equal to the package, and to the definition (two
isotonic fits per test point, scikit-learn's ``IsotonicRegression``), to 1e-12.
"""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import torch
from selbench import FitContext, ModelOutputs
from selbench.contract.checks import NotFittedError
from selbench.contract.registry import get_registry
from selbench_plugins.recalibrators.structured import fit_sms, fit_svs
from selbench_plugins.recalibrators.vennabers import venn_abers_interval, venn_abers_table

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CTX = FitContext(seed=0)
CIFAR100 = "cifar100_densenet-bc-100"
CIFAR10 = "cifar10_wideresnet-16-4"
#: SMS / SVS probabilities as probmetrics ships them (float32 BFGS, early stop) vs ours:
#: largest and mean absolute difference
SHIPPED_MAX, SHIPPED_MEAN = 6e-3, 6e-5
SVS_SHIPPED_MAX, SVS_SHIPPED_MEAN = 1e-3, 2e-5


def build(name, params=None):
    return get_registry().get("recalibrator", name).build(params)


def outputs(z, y):
    z = np.asarray(z, dtype=np.float32)
    return ModelOutputs(features=np.zeros((len(z), 1), np.float32), logits=z,
                        labels=np.asarray(y, dtype=np.int64))


def cifar(name):
    """``(fit, eval)`` outputs: log-probabilities (rows renormalised in float64) of the two
    seeded halves of the CIFAR test set."""
    path = DATA / f"netcal_{name}.npz"
    if not path.is_file():
        pytest.skip(f"real model outputs not available: {path} is absent")
    data = np.load(path)
    p = data["predictions"].astype(np.float64)
    p /= p.sum(axis=1, keepdims=True)
    z = np.log(np.maximum(p, 1e-300)).astype(np.float32)
    y = data["ground_truth"].astype(np.int64)
    perm = np.random.default_rng(0).permutation(len(p))
    half = len(p) // 2
    return outputs(z[perm[:half]], y[perm[:half]]), outputs(z[perm[half:]], y[perm[half:]])


def synthetic(n, k, seed=0, scale=2.0):
    """Over-confident logits ``scale * N(0, 1)`` and labels drawn from ``softmax(z / 2)``."""
    rng = np.random.default_rng([seed, n, k])
    z = rng.normal(size=(n, k)) * scale
    s = z / 2.0
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = (p.cumsum(1) < rng.random((n, 1))).sum(1).clip(0, k - 1)
    return z.astype(np.float32), y


def probs_of(rec, out):
    """Our calibrated probabilities, through the live (float32) module, as float64."""
    with torch.no_grad():
        return rec.module_.log_probs(torch.tensor(out.logits)).exp().double().numpy()


# ------------------------------------------------------------------ probmetrics, captured
@pytest.fixture
def pm(monkeypatch):
    """probmetrics' SMS / SVS: ``shipped(name, out)`` fits as released; ``at(rec, out)``
    runs their fit with their ``torchmin.minimize`` replaced by one evaluation of their loss
    at ``rec``'s parameters (float64 inputs), returning the loss, its gradient and the
    calibrator (which then predicts with our parameters)."""
    pytest.importorskip("probmetrics")
    pytest.importorskip("numba")
    import probmetrics.calibrators.logistic as logistic
    from probmetrics.calibrators import get_calibrator

    def shipped(name, out):
        return get_calibrator(name).fit(out.probabilities(), out.labels)

    def at(rec, out):
        seen = {}
        k = out.num_classes
        delta = rec.weight_fit_ - (np.eye(k) if rec.weight_fit_.ndim == 2 else 1.0)
        theta = np.concatenate([delta.ravel(), rec.bias_fit_])

        def minimize(fun, x0, method):
            x = torch.tensor(theta, dtype=torch.float64, requires_grad=True)
            value = fun(x)
            seen["loss"] = float(value.detach())
            seen["grad"] = torch.autograd.grad(value, x)[0].numpy()
            return types.SimpleNamespace(success=True, x=x.detach(), message="")

        def logits64(probs):  # their float32 cast, kept in float64
            return np.clip(np.log(probs), np.log(np.finfo(np.float32).tiny), None)

        monkeypatch.setattr(logistic.torchmin, "minimize", minimize)
        monkeypatch.setattr(logistic, "multiclass_probs_to_logits", logits64)
        cal = get_calibrator(rec._name).fit(out.probabilities(), out.labels)
        monkeypatch.undo()
        return seen, cal

    return types.SimpleNamespace(shipped=shipped, at=at)


def check_against_probmetrics(pm, name, fit_out, eval_out, shipped=True,
                              tol=(SHIPPED_MAX, SHIPPED_MEAN)):
    """The checks of the module docstring for ``sms`` / ``svs`` fitted on ``fit_out``."""
    rec = build(name).fit(fit_out, CTX)
    seen, cal = pm.at(rec, fit_out)
    # equal up to the inverse temperatures (their bisection vs our Newton root, ~1e-8 apart)
    assert seen["loss"] == pytest.approx(rec.fit_info_["objective"], rel=1e-8)
    assert np.abs(seen["grad"]).max() < 1e-6  # their loss is at its optimum at ours
    assert rec.inv_temperature_ == pytest.approx(cal.ts_.cal_.invtemp_, rel=1e-6)
    ours = probs_of(rec, eval_out)
    np.testing.assert_allclose(cal.predict_proba(eval_out.probabilities()), ours, atol=2e-6)
    if shipped:
        theirs = pm.shipped(name, fit_out).predict_proba(eval_out.probabilities())
        gap = np.abs(theirs - ours)
        assert gap.max() <= tol[0] and gap.mean() <= tol[1], (gap.max(), gap.mean())
        # the predictions differ only where their two candidates are that close
        pred = rec.predict(eval_out)
        rows = np.flatnonzero(pred != theirs.argmax(1))
        assert len(rows) <= 0.005 * len(pred)
        assert np.all(theirs[rows].max(1) - theirs[rows, pred[rows]] <= tol[0])
    return rec


def test_cifar100_sms_against_probmetrics(pm):
    fit_out, eval_out = cifar(CIFAR100)
    rec = check_against_probmetrics(pm, "sms", fit_out, eval_out)
    assert rec.fit_info_["objective"] == pytest.approx(0.8518218650, abs=1e-9)
    # a wrong variant: one ridge strength K / N for all of W (no structure)
    flat = build("sms", {"lambda_off_diagonal": 1.0 / 99}).fit(fit_out, CTX)
    seen, _ = pm.at(flat, fit_out)
    assert np.abs(seen["grad"]).max() > 1e-3
    assert np.abs(probs_of(flat, eval_out) - probs_of(rec, eval_out)).max() > 10 * SHIPPED_MAX


def test_cifar10_sms_and_svs_against_probmetrics(pm):
    fit_out, eval_out = cifar(CIFAR10)
    sms = check_against_probmetrics(pm, "sms", fit_out, eval_out)
    svs = check_against_probmetrics(pm, "svs", fit_out, eval_out,
                                    tol=(SVS_SHIPPED_MAX, SVS_SHIPPED_MEAN))
    # the two differ by far more than the tolerance: the structure matters
    assert np.abs(probs_of(sms, eval_out) - probs_of(svs, eval_out)).max() > 10 * SHIPPED_MAX


def test_cifar100_svs_against_probmetrics(pm):
    fit_out, eval_out = cifar(CIFAR100)
    check_against_probmetrics(pm, "svs", fit_out, eval_out,
                              tol=(SVS_SHIPPED_MAX, SVS_SHIPPED_MEAN))


@pytest.mark.parametrize("name", ["sms", "svs"])
def test_two_classes_against_probmetrics(pm, name):
    """K = 2: their float32 BFGS stops further from the optimum of these 6 (4) parameters
    (measured: SMS probabilities 5.6e-4 apart at most, 3.1e-4 on average)."""
    z, y = synthetic(1000, 2)
    check_against_probmetrics(pm, name, outputs(z[:500], y[:500]), outputs(z[500:], y[500:]),
                              tol=(2e-3, 1e-3))


def test_ties_and_an_absent_class_against_probmetrics(pm):
    """Duplicated rows, all-equal logits (a tie for the top class: the first wins, as
    ``np.argmax``) and class 3 never in the fitting labels."""
    z, y = synthetic(1000, 10)
    z[::7] = z[1::7][: len(z[::7])]
    z[5::50] = 0.0
    y = np.where(y == 3, 4, y)
    for name in ("sms", "svs"):
        rec = check_against_probmetrics(pm, name, outputs(z[:500], y[:500]),
                                        outputs(z[500:], y[500:]))
        assert np.all(rec.predict(outputs(z[5::50], y[5::50])) == rec.predict(
            outputs(np.zeros((1, 10)), [0]))[0])


@pytest.mark.slow
def test_a_thousand_classes_against_probmetrics(pm):
    """K = 1,000, N = 60 fitting rows (most classes absent): their loss at our optimum for
    both, and SVS's shipped fit (SMS's takes tens of seconds)."""
    z, y = synthetic(160, 1000)
    fit_out, eval_out = outputs(z[:60], y[:60]), outputs(z[60:], y[60:])
    check_against_probmetrics(pm, "sms", fit_out, eval_out, shipped=False)
    check_against_probmetrics(pm, "svs", fit_out, eval_out,
                              tol=(SVS_SHIPPED_MAX, SVS_SHIPPED_MEAN))


# ------------------------------------------------------------------ definition, no reference
def sms_objective(z, y, a, weight, bias, lambdas=(1.0, 1.0, 1.0)):
    """The SMS objective written out in NumPy (mixture, ridge towards the identity)."""
    n, k = z.shape
    s = a * (z - z.max(1, keepdims=True))
    q = np.exp(s) / np.exp(s).sum(1, keepdims=True)
    eps = 1.0 / (n + 1)
    x = np.log((1 - eps) * q + eps / k)
    t = x @ weight.T + bias
    t -= t.max(1, keepdims=True)
    nll = np.mean(np.log(np.exp(t).sum(1)) - t[np.arange(n), y])
    delta = weight - np.eye(k)
    off = delta - np.diag(np.diag(delta))
    return (nll + lambdas[0] * k / n * (bias ** 2).sum() + lambdas[1] * k / n
            * (np.diag(delta) ** 2).sum() + lambdas[2] * k * (k - 1) / n * (off ** 2).sum())


def test_sms_fit_is_the_optimum_of_the_written_out_objective():
    """Without probmetrics: our fit's objective equals the NumPy one, and no perturbation of
    W or b (random, or along the structure) lowers it."""
    z, y = synthetic(400, 6)
    fit = fit_sms(z, y, lambda_intercept=0.5, lambda_off_diagonal=3.0)
    lam = (0.5, 1.0, 3.0)
    best = sms_objective(z.astype(np.float64), y, fit["inv_temperature"], fit["weight"],
                         fit["bias"], lam)
    assert best == pytest.approx(fit["info"]["objective"], rel=1e-12)
    assert fit["info"]["grad_max"] < 1e-8
    rng = np.random.default_rng(1)
    for _ in range(20):
        dw, db = rng.normal(size=(6, 6)) * 1e-3, rng.normal(size=6) * 1e-3
        assert sms_objective(z.astype(np.float64), y, fit["inv_temperature"],
                             fit["weight"] + dw, fit["bias"] + db, lam) > best
    # the inverse temperature is temperature scaling's: the derivative of its NLL vanishes
    a, lp = fit["inv_temperature"], z.astype(np.float64)
    p = np.exp(a * lp - (a * lp).max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert abs(np.mean((p * lp).sum(1) - lp[np.arange(len(y)), y])) < 1e-7


def test_svs_is_sms_with_the_off_diagonal_fixed_at_zero():
    """An off-diagonal ridge of 1e12 leaves SMS with SVS's fit."""
    z, y = synthetic(400, 5)
    svs = fit_svs(z, y)
    sms = fit_sms(z, y, lambda_off_diagonal=1e12)
    np.testing.assert_allclose(np.diag(sms["weight"]), svs["weight"], atol=1e-6)
    np.testing.assert_allclose(sms["bias"], svs["bias"], atol=1e-6)
    assert np.abs(sms["weight"] - np.diag(np.diag(sms["weight"]))).max() < 1e-9


def test_structured_scaling_plugins_follow_the_contract():
    z, y = synthetic(300, 4)
    out = outputs(z, y)
    for name in ("sms", "svs"):
        rec = build(name)
        assert rec.differentiable and rec.provides_log_probs
        with pytest.raises(NotFittedError):
            rec.confidence(out)
        rec.fit(out, CTX)
        lp = probs_of(rec, out)
        np.testing.assert_allclose(lp.sum(1), 1.0, atol=1e-5)
        np.testing.assert_allclose(rec.confidence(out), lp.max(1), atol=1e-6)
        np.testing.assert_array_equal(rec.predict(out), lp.argmax(1))
        with pytest.raises(ValueError, match=f"'{name}' was fitted on K=4"):
            rec.confidence(outputs(z[:, :3], y.clip(0, 2)))
    with pytest.raises(ValueError):
        build("sms", {"lambda_diagonal": -1.0})


def test_joint_scheme_trains_sms_with_an_mlp_selector():
    from conftest import sampled_linear_task

    x, z, y = sampled_linear_task(np.random.default_rng(0), 300, 6, 3)
    out = ModelOutputs(features=x.astype(np.float32), logits=(2.5 * z).astype(np.float32),
                       labels=y)
    reg = get_registry()
    sel = reg.get("selector", "mlp").build({"hidden": [16]})
    rec = build("sms")
    scheme = reg.get("scheme", "joint").build({"epochs": 20, "lr": 5e-3, "batch_size": 50})
    scheme.fit(out, selector=sel, recalibrator=rec, loss=reg.get("loss", "s-mce").build(None),
               coverage=reg.get("loss", "quadratic").build(None), context=CTX)
    fitted = build("sms").fit(out, CTX)
    np.testing.assert_allclose(rec.weight_fit_, fitted.weight_fit_, atol=1e-12)
    assert np.abs(rec.weight_ - fitted.weight_).max() > 1e-3  # trained in place
    with torch.no_grad():
        conf, _ = rec.module(out, CTX)(torch.tensor(out.logits), None)
    np.testing.assert_allclose(rec.confidence(out), conf.double().numpy(), atol=1e-7)


# ------------------------------------------------------------------ Venn–Abers
def two_fits(scores, labels, s):
    """The definition: isotonic regression refitted with ``(s, 0)`` and with ``(s, 1)``,
    each read at ``s`` (scikit-learn)."""
    from sklearn.isotonic import IsotonicRegression

    out = []
    for label in (0, 1):
        iso = IsotonicRegression(out_of_bounds="clip").fit(np.append(scores, s),
                                                           np.append(labels, label))
        out.append(float(iso.predict([s])[0]))
    return out


def test_venn_abers_is_the_two_isotonic_fits_per_test_point():
    """Scores on a grid of 8 values (many ties), test points on, between and beyond them;
    every 5th draw all correct, every 7th all wrong."""
    rng = np.random.default_rng(0)
    tests = np.concatenate([np.arange(-1, 10) / 8.0, np.arange(8) / 8.0 + 1 / 16])
    for draw in range(60):
        n = int(rng.integers(1, 25))
        scores = rng.integers(0, 8, n) / 8.0
        labels = (rng.random(n) < scores).astype(np.int64)
        if draw % 5 == 0:
            labels[:] = 1
        if draw % 7 == 0:
            labels[:] = 0
        ours = venn_abers_interval(venn_abers_table(scores, labels), tests)
        expected = np.array([two_fits(scores, labels, s) for s in tests])
        np.testing.assert_allclose(ours, expected, atol=1e-12, err_msg=f"draw {draw}")
    # a wrong variant, one isotonic fit without the test point, differs
    scores, labels = np.array([0.5, 0.5, 0.75]), np.array([0, 1, 1])
    np.testing.assert_allclose(venn_abers_interval(venn_abers_table(scores, labels), [0.5]),
                               [[1 / 3, 2 / 3]], atol=1e-15)


def va_package():
    pytest.importorskip("venn_abers")
    import venn_abers

    return venn_abers


def package_interval(scores, labels, tests):
    """``(p_prime[:, 1], p0_p1)`` of the ``venn-abers`` package's manual mode, the top-label
    confidence as the binary score ``[1 - conf, conf]``."""
    va = va_package()
    cal = va.VennAbersCalibrator()
    p_prime, p0_p1 = cal.predict_proba(p_cal=np.stack([1 - scores, scores], 1), y_cal=labels,
                                       p_test=np.stack([1 - tests, tests], 1),
                                       p0_p1_output=True)
    return p_prime[:, 1], p0_p1


@pytest.mark.parametrize("name", [CIFAR100, CIFAR10])
def test_venn_abers_against_the_package_on_cifar(name):
    va_package()
    fit_out, eval_out = cifar(name)
    rec = build("venn-abers").fit(fit_out, CTX)
    point, p0_p1 = package_interval(fit_out.confidence(), fit_out.correct(),
                                    eval_out.confidence())
    np.testing.assert_allclose(rec.confidence(eval_out), point, atol=1e-12, rtol=0)
    interval = rec.confidence_interval(eval_out)
    np.testing.assert_allclose(interval, p0_p1, atol=1e-12, rtol=0)
    conf = rec.confidence(eval_out)
    assert np.all(interval[:, 0] <= conf) and np.all(conf <= interval[:, 1])
    # wrong variants are far: isotonic regression alone, and the interval's midpoint
    iso = build("isotonic").fit(fit_out, CTX).confidence(eval_out)
    assert np.abs(iso - conf).max() > 1e-2
    assert np.abs(interval.mean(1) - conf).max() > 1e-4


def test_venn_abers_edge_cases_against_the_package():
    """Ties (confidences on a grid of 20 values, test points equal to them), all-correct
    fitting data, K = 2 and K = 1,000 (most classes absent from the fitting labels)."""
    va_package()
    z, y = synthetic(600, 2)
    cases = {"K=2": (outputs(z[:300], y[:300]), outputs(z[300:], y[300:]))}
    z, y = synthetic(600, 10)
    grid = np.round(np.clip(outputs(z, y).confidence(), 0, 1) * 20) / 20
    cases["ties"] = (grid[:300], grid[300:], outputs(z, y).correct())
    all_right = outputs(z[:300], np.argmax(z[:300], axis=1))
    cases["all correct"] = (all_right, outputs(z[300:], y[300:]))
    z, y = synthetic(600, 1000)
    cases["K=1000"] = (outputs(z[:300], y[:300]), outputs(z[300:], y[300:]))
    for what, case in cases.items():
        if what == "ties":
            s_fit, s_test, correct = case
            c_fit = correct[:300]
            ours = venn_abers_interval(venn_abers_table(s_fit, c_fit), s_test)
            point, p0_p1 = package_interval(s_fit, c_fit, s_test)
            np.testing.assert_allclose(ours, p0_p1, atol=1e-12, err_msg=what)
            continue
        fit_out, eval_out = case
        rec = build("venn-abers").fit(fit_out, CTX)
        point, p0_p1 = package_interval(fit_out.confidence(), fit_out.correct(),
                                        eval_out.confidence())
        np.testing.assert_allclose(rec.confidence(eval_out), point, atol=1e-12, err_msg=what)
        np.testing.assert_allclose(rec.confidence_interval(eval_out), p0_p1, atol=1e-12)
    rec = build("venn-abers").fit(all_right, CTX)
    assert np.all(rec.confidence_interval(all_right)[:, 1] == 1.0)


def test_venn_abers_plugin_contract():
    z, y = synthetic(200, 5)
    rec = build("venn-abers")
    assert not rec.differentiable
    with pytest.raises(NotFittedError, match="venn-abers"):
        rec.confidence(outputs(z, y))
    rec.fit(outputs(z, y), CTX)
    conf = rec.confidence(outputs(z, y))
    assert conf.shape == (200,) and conf.dtype == np.float64
    np.testing.assert_array_equal(rec.predict(outputs(z, y)), np.argmax(z, axis=1))
    # a higher model confidence never gets a lower calibrated one (both fits are monotone)
    order = np.argsort(outputs(z, y).confidence(), kind="stable")
    assert np.all(np.diff(rec.confidence_interval(outputs(z, y))[order], axis=0) >= -1e-15)
