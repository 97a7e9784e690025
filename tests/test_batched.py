"""Batched training: ``fit_many`` trains all replicas of a method as one model, and every
replica ends where its own ``fit`` would (to float rounding)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import sampled_linear_task, tiny_spec
from selbench import FitContext, ModelOutputs
from selbench import runner as runner_mod
from selbench.api import FitJob, Scheme, SelectionLoss
from selbench.plugins import get_registry
from selbench.torchutils import BatchedMLP, build_mlp, group_streams

TOL = 1e-5
FAST = {"epochs": 12, "lr": 5e-3, "batch_size": 64}
#: two seeds x two training betas: two streams of two replicas
CELLS = ((0, 0.6), (0, 0.8), (1, 0.6), (1, 0.8))


def synthetic(n=200, d=8, k=3, seed=0):
    """Over-confident logits on a feature cluster with random labels (as test_schemes)."""
    rng = np.random.default_rng(seed)
    x, z, labels = sampled_linear_task(rng, n, d, k)
    bad = np.arange(n) < n // 3
    x[bad, 0] += 4.0
    labels[bad] = rng.integers(0, k, bad.sum())
    return ModelOutputs(features=x.astype(np.float32), logits=(2 * z).astype(np.float32),
                        labels=labels)


def reg(kind, name, params=None):
    return get_registry().get(kind, name).build(params)


def make_job(seed, beta, out, *, rec, loss, coverage="quadratic", cov_params=None,
             rec_params=None, loss_obj=None):
    return FitJob(
        out,
        reg("selector", "mlp", {"hidden": [16, 8]}),
        reg("recalibrator", rec, rec_params),
        loss_obj if loss_obj is not None else reg("loss", loss),
        reg("loss", coverage, cov_params),
        FitContext(seed=seed, beta=beta),
    )


def solo_and_batched(scheme, *, cells=CELLS, params=FAST, k=3, lams=None, **kw):
    """Fit each cell alone with ``fit`` and all together with ``fit_many``; return both
    lists of (confidence, score) on the fitting data, and the batched jobs."""
    outs = {s: synthetic(k=k, seed=s) for s, _ in cells}
    results = []
    for batched in (False, True):
        jobs = [
            make_job(s, b, outs[s], cov_params=None if lams is None else {"lam": lams[i]}, **kw)
            for i, (s, b) in enumerate(cells)
        ]
        sch = reg("scheme", scheme, params)
        if batched:
            assert sch.fit_many(jobs) is sch
        else:
            for j in jobs:
                sch.fit(j.outputs, selector=j.selector, recalibrator=j.recalibrator,
                        loss=j.loss, coverage=j.coverage, context=j.context)
        res = []
        for j in jobs:
            conf = j.recalibrator.confidence(j.outputs)
            res.append((conf, j.selector.score(j.outputs, conf)))
        results.append((res, jobs))
    return results


def assert_same(results):
    (solo, _), (batched, _) = results
    for (c1, s1), (c2, s2) in zip(solo, batched):
        np.testing.assert_allclose(c2, c1, atol=TOL, rtol=0)
        np.testing.assert_allclose(s2, s1, atol=TOL, rtol=0)
    # the replicas really differ (seed and beta both matter)
    scores = [s for _, s in solo]
    assert all(np.abs(scores[0] - s).max() > 1e-3 for s in scores[1:])


@pytest.mark.parametrize(
    "scheme,rec,loss,k",
    [
        ("sequential", "temperature", "s-tlbce", 3),
        ("joint", "temperature", "s-mce", 3),
        ("joint", "platt", "s-mmce", 2),  # binary Platt
        ("joint", "platt", "s-tlbce", 3),  # top-label Platt
        ("sequential", "platt", "s-mce", 3),
    ],
)
def test_fit_many_equals_fit(scheme, rec, loss, k):
    results = solo_and_batched(scheme, rec=rec, loss=loss, k=k)
    assert_same(results)
    if rec == "temperature" and scheme == "joint":
        for solo_job, batched_job in zip(results[0][1], results[1][1]):
            assert batched_job.recalibrator.T_ == pytest.approx(solo_job.recalibrator.T_,
                                                                abs=TOL)
            assert abs(batched_job.recalibrator.T_ - batched_job.recalibrator.T_fit_) > 1e-3


def test_fit_many_with_noise_weight_decay_and_per_replica_lambda():
    """Input noise (its own generator per replica, feature noise drawn as in the solo loop
    even where h ignores it), weight decay, and a coverage weight λ per replica."""
    params = dict(FAST, noise_std=1.0, weight_decay=1e-2)
    assert_same(solo_and_batched("joint", rec="temperature", loss="s-tlbce", params=params,
                                 lams=[8.0, 32.0, 8.0, 32.0]))
    assert_same(solo_and_batched("selection", rec="none", loss="s-mce", params=params,
                                 coverage="log-coverage", lams=[0.01, 0.3, 0.01, 0.3]))


def test_fit_many_trains_mlp_recalibrators_and_uneven_streams():
    """An MLP h trained jointly; three replicas (streams of unequal size: one per replica)."""
    rec_params = {"hidden": [8], "epochs": 4, "lr": 1e-2}
    assert_same(solo_and_batched("joint", rec="mlp", loss="s-tlbce", rec_params=rec_params,
                                 cells=((0, 0.6), (0, 0.8), (1, 0.7))))


def test_mlp_recalibrator_fit_many_equals_fit():
    """The recalibration scheme fits MLP recalibrators together; replicas with the same seed
    and data (the training β's) are trained once and copied."""
    outs = {s: synthetic(seed=s) for s in (0, 1)}
    params = {"hidden": [16, 8], "epochs": 15, "lr": 1e-2}
    cells = ((0, 0.6), (0, 0.8), (1, 0.6), (2, 0.6))
    jobs = [FitJob(outs[min(s, 1)], reg("selector", "confidence"),
                   reg("recalibrator", "mlp", params), None, None, FitContext(seed=s, beta=b))
            for s, b in cells]
    reg("scheme", "recalibration").fit_many(jobs)
    confs = []
    for job, (s, _) in zip(jobs, cells):
        solo = reg("recalibrator", "mlp", params).fit(job.outputs, FitContext(seed=s))
        conf = job.recalibrator.confidence(job.outputs)
        np.testing.assert_allclose(conf, solo.confidence(job.outputs), atol=TOL, rtol=0)
        np.testing.assert_array_equal(job.selector.score(job.outputs, conf), conf)
        confs.append(conf)
    np.testing.assert_array_equal(confs[0], confs[1])  # same seed and data: copied
    assert jobs[0].recalibrator.module_ is not jobs[1].recalibrator.module_
    assert np.abs(confs[0] - confs[2]).max() > 1e-3


class PlainSTLBCE(SelectionLoss):
    """A third-party loss without the batched protocol (S-TLBCE written out)."""

    def __call__(self, g, confidence, correct, log_probs=None, labels=None):
        bce = torch.nn.functional.binary_cross_entropy(confidence, correct, reduction="none")
        return (g * bce).mean()


def test_fit_many_falls_back_to_solo_training_without_the_protocol():
    outs = {s: synthetic(seed=s) for s in (0, 1)}
    jobs = [make_job(s, 0.7, outs[s], rec="temperature", loss=None, loss_obj=PlainSTLBCE())
            for s in (0, 1)]
    reg("scheme", "sequential", FAST).fit_many(jobs)
    ref = reg("scheme", "sequential", FAST)
    for s, job in zip((0, 1), jobs):
        solo = make_job(s, 0.7, outs[s], rec="temperature", loss="s-tlbce")
        ref.fit(solo.outputs, selector=solo.selector, recalibrator=solo.recalibrator,
                loss=solo.loss, coverage=solo.coverage, context=solo.context)
        conf = solo.recalibrator.confidence(solo.outputs)
        np.testing.assert_array_equal(job.selector.score(job.outputs, conf),
                                      solo.selector.score(solo.outputs, conf))


def test_fit_many_reports_the_solo_errors():
    out = synthetic()
    jobs = [make_job(s, 0.7, out, rec="mlp", loss="s-mce", rec_params={"epochs": 1})
            for s in (0, 1)]
    with pytest.raises(ValueError, match="log-probabilities"):
        reg("scheme", "joint", FAST).fit_many(jobs)
    jobs = [make_job(s, 0.7, out, rec="histogram-binning", loss="s-tlbce") for s in (0, 1)]
    with pytest.raises(ValueError, match="differentiable"):
        reg("scheme", "joint", FAST).fit_many(jobs)


def test_default_fit_many_loops_fit():
    calls = []

    class Recorder(Scheme):
        def fit(self, outputs, *, selector, recalibrator, loss, coverage, context):
            calls.append((len(outputs), context.seed, context.beta))
            return self

    out = synthetic(n=50)
    jobs = [FitJob(out, None, None, None, None, FitContext(seed=s, beta=b))
            for s, b in CELLS]
    sch = Recorder()
    assert sch.fit_many(jobs) is sch
    assert calls == [(50, s, b) for s, b in CELLS]
    assert not runner_mod.batches(sch)
    assert runner_mod.batches(reg("scheme", "joint"))


@pytest.mark.parametrize("streams,split", [(3, 1), (3, 2), (6, 2), (2, 3), (6, 4)])
def test_batched_mlp_matches_its_networks_and_writes_back(streams, split):
    torch.manual_seed(0)
    nets = [build_mlp(6, [4, 3]) for _ in range(6)]
    per = 6 // streams
    x = torch.randn(streams, 7, 6)
    batched = BatchedMLP(nets, streams=streams, split=split)
    out = batched(x)
    assert out.shape == (6, 7)
    for r, net in enumerate(nets):
        torch.testing.assert_close(out[r], net(x[r // per]).squeeze(-1), atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        for p in batched.parameters():
            p.add_(torch.rand(p.shape))
    batched.write_back(nets)
    for r, net in enumerate(nets):
        torch.testing.assert_close(batched(x)[r], net(x[r // per]).squeeze(-1),
                                   atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="streams"):
        BatchedMLP(nets, streams=4)


def test_group_streams():
    seeds = [0, 0, 1, 1]
    assert group_streams(seeds, lambda i, j: True) == ([0, 1, 2, 3], 2)
    assert group_streams([0, 1, 0, 1], lambda i, j: True) == ([0, 2, 1, 3], 2)
    assert group_streams([0, 0, 1], lambda i, j: True) == ([0, 1, 2], 3)  # uneven
    assert group_streams(seeds, lambda i, j: False) == ([0, 1, 2, 3], 4)


@pytest.mark.parametrize("name,params", [("s-tlbce", {}), ("s-mce", {}), ("s-mmce", {}),
                                         ("s-mmce", {"q": 1, "normalize": True})])
def test_batched_losses_equal_per_replica_calls(name, params):
    gen = torch.Generator().manual_seed(0)
    r, b, k = 3, 20, 4
    g = torch.rand(r, b, generator=gen)
    conf = torch.rand(r, b, generator=gen) * 0.7 + 0.3
    correct = (torch.rand(r, b, generator=gen) < 0.7).float()
    lp = torch.log_softmax(torch.randn(r, b, k, generator=gen), -1)
    labels = torch.randint(0, k, (r, b), generator=gen)
    conf[0, 1] = conf[0, 0]  # a tie: |c_i - c_j| has derivative 0 there in both
    losses = [reg("loss", name, params) for _ in range(r)]
    fn = type(losses[0]).batched(losses)
    grads = []
    for batched in (True, False):
        gg, cc = g.clone().requires_grad_(), conf.clone().requires_grad_()
        lpp = lp.clone().requires_grad_()
        if batched:
            out = fn(gg, cc, correct, lpp.gather(-1, labels[..., None]).squeeze(-1))
        else:
            out = torch.stack([losses[i](gg[i], cc[i], correct[i], lpp[i], labels[i])
                               for i in range(r)])
        out.sum().backward()
        grads.append((out.detach(), gg.grad, cc.grad, lpp.grad))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    other = reg("loss", name, {**params, "normalize": not params.get("normalize", False)})
    assert type(losses[0]).batched([losses[0], other]) is None
    lams = [reg("loss", "quadratic", {"lam": lam}) for lam in (1.0, 8.0, 32.0)]
    beta = torch.tensor([0.5, 0.7, 0.9])
    cov = type(lams[0]).batched(lams)(g, beta)
    torch.testing.assert_close(cov, torch.stack([lams[i](g[i], float(beta[i]))
                                                 for i in range(r)]))


def test_runner_fits_a_method_in_one_group_like_cell_by_cell(tmp_path, monkeypatch):
    trained = {"scheme": {"name": "joint", "params": {"epochs": 8, "batch_size": 50,
                                                      "lr": 5e-3}},
               "selector": {"name": "mlp", "params": {"hidden": [16]}},
               "recalibrator": {"name": "temperature"},
               "loss": {"name": "s-tlbce"}, "coverage": {"name": "quadratic"}}
    spec = tiny_spec(seeds=[0, 1], methods=[{"label": "Joint", **trained}],
                     betas=[0.7, 0.9], train_beta="per_beta", report="betas")
    calls = []
    real = runner_mod.fit_group

    def counting(resolved, cells, *args, **kwargs):
        calls.append(len(cells))
        return real(resolved, cells, *args, **kwargs)

    monkeypatch.setattr(runner_mod, "fit_group", counting)
    runner_mod.run(spec, out_dir=tmp_path / "grouped", progress=False, plots=False)
    assert calls == [4]  # 2 seeds x 2 training betas, one fit_many call
    monkeypatch.setattr(runner_mod, "batches", lambda scheme: False)
    runner_mod.run(spec, out_dir=tmp_path / "solo", progress=False, plots=False)
    assert calls == [4]
    grouped = sorted((tmp_path / "grouped" / "cells").rglob("*.json"))
    solo = sorted((tmp_path / "solo" / "cells").rglob("*.json"))
    assert [p.name for p in grouped] == [p.name for p in solo] and len(grouped) == 4
    for a, b in zip(grouped, solo):
        ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
        assert ra["key"] == rb["key"]
        assert ra["timing"]["fit_batch"] == 4 and "fit_batch" not in rb["timing"]
        for metric, values in ra["metrics"].items():
            np.testing.assert_allclose(values, rb["metrics"][metric], atol=1e-5, err_msg=metric)


@pytest.mark.parametrize("same_split", [False, True])
def test_runner_scores_identical_fitted_states_once(tmp_path, monkeypatch, same_split):
    """per_beta: a baseline fitted on one seed's data is the same model at every training β;
    the runner scores the evaluation data once per distinct fitted state (and, when fitting
    and evaluation share a split, builds each seed's evaluation subset once), exactly."""
    from selbench_plugins.selectors.baselines import ConfidenceSelector

    split = {"eval_split": "val", "n_fit": 100} if same_split else {}
    spec = tiny_spec(seeds=[0, 1], betas=[0.8, 0.9], train_beta="per_beta", report="betas",
                     methods=[{"label": "Confidence", "scheme": {"name": "recalibration"},
                               "recalibrator": {"name": "temperature"},
                               "selector": {"name": "confidence"}}], **split)
    calls = []
    real = ConfidenceSelector.score

    def counting(self, outputs, confidence):
        calls.append(len(outputs))
        return real(self, outputs, confidence)

    monkeypatch.setattr(ConfidenceSelector, "score", counting)
    runner_mod.run(spec, out_dir=tmp_path / "memo", progress=False, plots=False)
    n_eval = 300 if same_split else 600
    assert calls == [n_eval, n_eval]  # 2 seeds x 2 betas: one scoring per seed
    real_cell = runner_mod.run_cell
    monkeypatch.setattr(runner_mod, "run_cell",
                        lambda *args, **kw: real_cell(*args[:5], memo=None))
    runner_mod.run(spec, out_dir=tmp_path / "plain", progress=False, plots=False)
    assert len(calls) == 6
    memo = sorted((tmp_path / "memo").rglob("seed*.json"))
    plain = sorted((tmp_path / "plain").rglob("seed*.json"))
    assert len(memo) == len(plain) == 4
    for a, b in zip(memo, plain):
        ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
        assert ra["n_eval"] == n_eval and ra["metrics"] == rb["metrics"]
