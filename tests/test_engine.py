"""The training engine (:mod:`selbench.training.engine`): ``fit_many`` trains all replicas of a method
as one model, any module is batched (hand-stacked or through ``torch.func``), and every
replica ends where its own ``fit`` would (to float rounding)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import sampled_linear_task, tiny_spec
from selbench import FitContext, ModelOutputs
from selbench.contract.api import (
    DifferentiableRecalibrator,
    FitJob,
    Scheme,
    SelectionLoss,
    TrainableSelector,
)
from selbench.contract.registry import get_registry
from selbench.execution import cells as cells_mod
from selbench.execution import runner as runner_mod
from selbench.training import engine
from selbench.training.torchutils import BatchedMLP, build_mlp, run_module, seeded_init
from selbench_plugins.selectors.mlp import MLPSelectorNet

TOL = 1e-5
FAST = {"epochs": 12, "lr": 5e-3, "batch_size": 64}
#: two seeds x two training betas
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


def test_fit_many_trains_mlp_recalibrators_with_three_replicas():
    """An MLP h trained jointly; three replicas, two of one seed."""
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
    """A third-party loss (S-TLBCE written out, over the last dimension)."""

    def __call__(self, g, confidence, correct, label_log_prob=None):
        bce = torch.nn.functional.binary_cross_entropy(confidence, correct, reduction="none")
        return (g * bce).mean(-1)


class TanhNet(torch.nn.Module):
    """A third-party selector network: no ``stacked``, a buffer, a tanh hidden layer."""

    def __init__(self, d):
        super().__init__()
        self.a = torch.nn.Linear(d, 6)
        self.b = torch.nn.Linear(6, 1)
        self.register_buffer("scale", torch.tensor(0.8))

    def forward(self, x):
        return torch.sigmoid(self.b(torch.tanh(self.a(x))).squeeze(-1) * self.scale)


class TanhSelector(TrainableSelector):
    def inputs(self, outputs):
        return np.array(outputs.features, dtype=np.float32)

    def init_module(self, outputs, context):
        self.module_ = seeded_init(context.seed, lambda: TanhNet(outputs.feature_dim))
        return self.module_

    def score(self, outputs, confidence):
        return run_module(self.module_, self.inputs(outputs), index=None)


class ScaleModule(torch.nn.Module):
    """A third-party h module: softmax(w z) (log-probabilities optional)."""

    def __init__(self, with_log_probs):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(0.7))
        self.with_log_probs = with_log_probs

    def forward(self, logits, features=None):
        lp = torch.log_softmax(logits * self.w, -1)
        return lp.max(-1).values.exp(), (lp if self.with_log_probs else None)


class ScaleRecalibrator(DifferentiableRecalibrator):
    def __init__(self, with_log_probs: bool = True):
        self.with_log_probs = with_log_probs

    def fit(self, outputs, context):
        self.module_ = ScaleModule(self.with_log_probs)
        return self

    def confidence(self, outputs):
        with torch.no_grad():
            return self.module_(torch.tensor(outputs.logits))[0].double().numpy()

    def module(self, outputs, context):
        return self.module_


@pytest.mark.parametrize("with_log_probs,loss", [(True, "s-mce"), (False, "plain")])
def test_third_party_trainable_modules_are_batched_through_torch_func(monkeypatch,
                                                                      with_log_probs, loss):
    """A third-party trainable selector and differentiable recalibrator, with a third-party
    loss, written with no batching code: fit_many trains them as one model (torch.func) and
    each replica ends where it would trained alone."""
    stacks = []
    real = engine.train_replicas

    def recording(job, resume=None):
        stacks.append([type(m) for m in job.modules])
        return real(job, resume)

    monkeypatch.setattr(engine, "train_replicas", recording)
    monkeypatch.setattr("selbench_plugins.schemes.training.train_replicas", recording)
    outs = {s: synthetic(seed=s) for s in (0, 1)}

    def jobs():
        return [FitJob(outs[s], TanhSelector(), ScaleRecalibrator(with_log_probs),
                       PlainSTLBCE() if loss == "plain" else reg("loss", loss),
                       reg("loss", "quadratic"), FitContext(seed=s, beta=b))
                for s, b in CELLS]

    together = jobs()
    reg("scheme", "joint", FAST).fit_many(together)
    assert stacks == [[engine.FuncStack, engine.FuncRecalibratorStack]]  # one model
    for i, alone in enumerate(jobs()):
        reg("scheme", "joint", FAST).fit(alone.outputs, selector=alone.selector,
                                         recalibrator=alone.recalibrator, loss=alone.loss,
                                         coverage=alone.coverage, context=alone.context)
        job = together[i]
        assert job.recalibrator.module_.w.item() == pytest.approx(
            alone.recalibrator.module_.w.item(), abs=TOL)
        assert abs(job.recalibrator.module_.w.item() - 0.7) > 1e-3  # h was trained
        np.testing.assert_allclose(job.selector.score(job.outputs, None),
                                   alone.selector.score(alone.outputs, None), atol=TOL, rtol=0)
    assert len(stacks) == 1 + len(CELLS)


@pytest.mark.parametrize("rec,loss,k", [("temperature", "s-mce", 3), ("platt", "s-mmce", 2),
                                        ("platt", "s-mce", 3)])
def test_hand_stacked_modules_equal_torch_func(monkeypatch, rec, loss, k):
    """The built-in hand-stacked modules (MLP, temperature, Platt — binary Platt's changing
    prediction included) train as the generic torch.func stacking of the same modules does."""
    def fit(generic):
        if generic:
            monkeypatch.setattr(MLPSelectorNet, "stacks_lanes", False)
            monkeypatch.setattr("selbench_plugins.schemes.training.stack_selectors",
                                engine.FuncStack)
            monkeypatch.setattr("selbench_plugins.schemes.training.stack_recalibrators",
                                engine.FuncRecalibratorStack)
        results = solo_and_batched("joint", rec=rec, loss=loss, k=k, cells=CELLS[:2])
        monkeypatch.undo()
        return results[1][0]  # fit_many's (confidence, score) of each replica

    hand, generic = fit(False), fit(True)
    for (c1, s1), (c2, s2) in zip(hand, generic):
        np.testing.assert_allclose(c2, c1, atol=TOL, rtol=0)
        np.testing.assert_allclose(s2, s1, atol=TOL, rtol=0)


def test_func_stack_forward_and_write_back():
    torch.manual_seed(0)
    nets = [TanhNet(5) for _ in range(3)]
    stacked = engine.FuncStack(nets)
    x = torch.randn(3, 7, 5)
    out = stacked(x)
    assert out.shape == (3, 7)
    for r, net in enumerate(nets):
        torch.testing.assert_close(out[r], net(x[r]), atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        for p in stacked.parameters():
            p.add_(torch.rand(p.shape))
    stacked.write_back(nets)
    for r, net in enumerate(nets):
        torch.testing.assert_close(stacked(x)[r], net(x[r]), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="different module classes"):
        engine.stack_selectors([nets[0], build_mlp(5, [2])])


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


@pytest.mark.parametrize("lanes,split", [(3, 1), (3, 2), (6, 2), (2, 3), (6, 4), (1, 2)])
def test_batched_mlp_lanes_match_their_networks_and_write_back(lanes, split):
    """Lanes: replica r reads x[r // (R / lanes)], its first layer one block of a wide matmul
    (cut into ``split`` column blocks for the threads)."""
    torch.manual_seed(0)
    nets = [build_mlp(6, [4, 3]) for _ in range(6)]
    per = 6 // lanes
    x = torch.randn(lanes, 7, 6)
    batched = BatchedMLP(nets, lanes=lanes, split=split)
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
    with pytest.raises(ValueError, match="lanes"):
        BatchedMLP(nets, lanes=4)


def test_lane_order():
    assert engine.lane_order([0, 0, 1, 1], [5, 5, 6, 6]) == ([0, 1, 2, 3], 2)
    assert engine.lane_order([0, 1, 0, 1], [5, 6, 5, 6]) == ([0, 2, 1, 3], 2)
    assert engine.lane_order([0, 0, 1], [5, 5, 6]) == ([0, 1, 2], 3)  # unequal lanes
    assert engine.lane_order([0, 0, 0, 0], [5, 6, 5, 6]) == ([0, 2, 1, 3], 2)  # by seed too


def test_batched_mlp_matches_its_networks_and_writes_back():
    torch.manual_seed(0)
    nets = [build_mlp(6, [4, 3]) for _ in range(5)]
    x = torch.randn(5, 7, 6)
    batched = BatchedMLP(nets)
    out = batched(x)
    assert out.shape == (5, 7)
    for r, net in enumerate(nets):
        torch.testing.assert_close(out[r], net(x[r]).squeeze(-1), atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        for p in batched.parameters():
            p.add_(torch.rand(p.shape))
    batched.write_back(nets)
    for r, net in enumerate(nets):
        torch.testing.assert_close(batched(x)[r], net(x[r]).squeeze(-1), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="different shapes"):
        BatchedMLP([*nets, build_mlp(6, [4])])



def test_run_module_copies_its_inputs_unless_borrowed():
    """run_module gives a module copies of the arrays (a module may write to its inputs);
    ``borrow=True`` (the built-in modules, which never do) reads the arrays themselves, with
    the same outputs; a read-only array is copied even then."""

    class Doubler(torch.nn.Module):  # writes to its input
        def forward(self, x):
            return x.mul_(2.0).sum(-1)

    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    before = a.copy()
    np.testing.assert_array_equal(run_module(Doubler(), a, index=None), 2 * before.sum(1))
    np.testing.assert_array_equal(a, before)
    net = build_mlp(3, [5])
    np.testing.assert_array_equal(run_module(net, a, index=None, borrow=True),
                                  run_module(net, a, index=None))
    run_module(Doubler(), a, index=None, borrow=True)
    np.testing.assert_array_equal(a, 2 * before)  # borrowed: the promise is the caller's
    frozen = before.copy()
    frozen.flags.writeable = False
    run_module(Doubler(), frozen, index=None, borrow=True)
    np.testing.assert_array_equal(frozen, before)

def test_runner_fits_a_method_in_one_group_and_an_extended_run_agrees(tmp_path, monkeypatch):
    """All unfinished cells of a method are one fit_many call; a run extended by a seed (its
    cells trained with other replicas than in an uninterrupted run) gives the uninterrupted
    run's metrics to the engine's documented tolerance."""
    trained = {"scheme": {"name": "joint", "params": {"epochs": 8, "batch_size": 50,
                                                      "lr": 5e-3}},
               "selector": {"name": "mlp", "params": {"hidden": [16]}},
               "recalibrator": {"name": "temperature"},
               "loss": {"name": "s-tlbce"}, "coverage": {"name": "quadratic"}}
    spec = tiny_spec(seeds=[0, 1], methods=[{"label": "Joint", **trained}],
                     betas=[0.7, 0.9], train_beta="per_beta", report="betas")
    calls = []
    real = cells_mod.fit_group

    def counting(resolved, cells, *args, **kwargs):
        calls.append(len(cells))
        return real(resolved, cells, *args, **kwargs)

    monkeypatch.setattr(cells_mod, "fit_group", counting)
    runner_mod.run(spec, out_dir=tmp_path / "whole", progress=False, plots=False)
    assert calls == [4]  # 2 seeds x 2 training betas, one fit_many call
    first = tiny_spec(seeds=[0], methods=[{"label": "Joint", **trained}],
                      betas=[0.7, 0.9], train_beta="per_beta", report="betas")
    runner_mod.run(first, out_dir=tmp_path / "extended", progress=False, plots=False)
    runner_mod.run(spec, out_dir=tmp_path / "extended", progress=False, plots=False)
    assert calls == [4, 2, 2]  # seed 0, then seed 1 alone
    whole = sorted((tmp_path / "whole" / "cells").rglob("*.json"))
    extended = sorted((tmp_path / "extended" / "cells").rglob("*.json"))
    assert [p.name for p in whole] == [p.name for p in extended] and len(whole) == 4
    for a, b in zip(whole, extended):
        ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
        assert ra["key"] == rb["key"]
        assert ra["timing"]["fit_batch"] == 4 and rb["timing"]["fit_batch"] == 2
        for metric, values in ra["metrics"].items():
            np.testing.assert_allclose(values, rb["metrics"][metric], atol=1e-5,
                                       rtol=engine.REPLICA_RTOL, err_msg=metric)


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
    real_cell = cells_mod.run_cell
    monkeypatch.setattr(cells_mod, "run_cell",
                        lambda *args, **kw: real_cell(*args[:6], memo=None))
    runner_mod.run(spec, out_dir=tmp_path / "plain", progress=False, plots=False)
    assert len(calls) == 6
    memo = sorted((tmp_path / "memo").rglob("seed*.json"))
    plain = sorted((tmp_path / "plain").rglob("seed*.json"))
    assert len(memo) == len(plain) == 4
    for a, b in zip(memo, plain):
        ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
        assert ra["n_eval"] == n_eval and ra["metrics"] == rb["metrics"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rec,loss,k", [("temperature", "s-mce", 3), ("platt", "s-mmce", 2),
                                        ("mlp", "s-tlbce", 3)])
def test_cuda_training_matches_cpu(rec, loss, k):
    """The engine on a GPU (replicas as one model on context.device, modules returned to the
    CPU) trains to what it trains on the CPU, to GPU float rounding."""
    rec_params = {"hidden": [8], "epochs": 4, "lr": 1e-2} if rec == "mlp" else None
    outs = {s: synthetic(k=k, seed=s) for s, _ in CELLS}
    results = []
    for device in ("cpu", "cuda"):
        jobs = [FitJob(outs[s], reg("selector", "mlp", {"hidden": [16, 8]}),
                       reg("recalibrator", rec, rec_params), reg("loss", loss),
                       reg("loss", "quadratic"), FitContext(seed=s, beta=b, device=device))
                for s, b in CELLS]
        reg("scheme", "joint", FAST).fit_many(jobs)
        res = []
        for j in jobs:
            assert all(p.device.type == "cpu" for p in j.selector.module_.parameters())
            conf = j.recalibrator.confidence(j.outputs)
            res.append((conf, j.selector.score(j.outputs, conf)))
        results.append(res)
    for (c1, s1), (c2, s2) in zip(*results):
        np.testing.assert_allclose(c2, c1, atol=1e-4, rtol=0)
        np.testing.assert_allclose(s2, s1, atol=1e-4, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_third_party_modules_batched_through_torch_func():
    outs = {s: synthetic(seed=s) for s, _ in CELLS}
    results = []
    for device in ("cpu", "cuda"):
        jobs = [FitJob(outs[s], TanhSelector(), ScaleRecalibrator(True), reg("loss", "s-mce"),
                       reg("loss", "quadratic"), FitContext(seed=s, beta=b, device=device))
                for s, b in CELLS]
        reg("scheme", "joint", FAST).fit_many(jobs)
        results.append([j.selector.score(j.outputs, None) for j in jobs])
    for a, b in zip(*results):
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=0)


def test_cuda_graphs_only_on_cuda_and_when_no_module_opts_out(monkeypatch):
    """The engine captures its step in CUDA graphs on a CUDA device only, unless
    SELBENCH_CUDA_GRAPHS=0 or a (sub)module sets ``cuda_graphs = False``."""
    net = build_mlp(4, [3])
    monkeypatch.delenv("SELBENCH_CUDA_GRAPHS", raising=False)
    assert not engine.cuda_graphs_enabled("cpu", [net])
    assert engine.cuda_graphs_enabled("cuda", [net])
    assert engine.cuda_graphs_enabled(torch.device("cuda", 0), [])
    net[0].cuda_graphs = False  # a submodule opting out
    assert not engine.cuda_graphs_enabled("cuda", [net])
    del net[0].cuda_graphs
    for off in ("0", "off", "false"):
        monkeypatch.setenv("SELBENCH_CUDA_GRAPHS", off)
        assert not engine.cuda_graphs_enabled("cuda", [net])
    monkeypatch.setenv("SELBENCH_CUDA_GRAPHS", "1")
    assert engine.cuda_graphs_enabled("cuda", [net])
    monkeypatch.setenv("SELBENCH_CUDA_GRAPHS", "sometimes")
    with pytest.raises(ValueError, match="SELBENCH_CUDA_GRAPHS must be 1 or 0"):
        engine.cuda_graphs_enabled("cpu", [net])
    monkeypatch.setenv("SELBENCH_CUDA_GRAPHS", "1")
    monkeypatch.setattr(TanhNet, "cuda_graphs", False, raising=False)  # through torch.func
    assert not engine.cuda_graphs_enabled("cuda", [engine.FuncStack([TanhNet(4)])])


def _cuda_fit(monkeypatch, graphs, scheme, rec, loss, k, noise, selector=None):
    """Fit CELLS on the GPU with the step captured in CUDA graphs or eager; return the
    trained selectors' scores and recalibrated confidences, and the graph replays counted."""
    monkeypatch.setenv("SELBENCH_CUDA_GRAPHS", "1" if graphs else "0")
    replays = []
    real = torch.cuda.CUDAGraph.replay

    def counting(self):
        replays.append(1)
        return real(self)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counting)
    rec_params = {"hidden": [8], "epochs": 5, "lr": 1e-2, "batch_size": 64} \
        if rec == "mlp" else None
    outs = {s: synthetic(k=k, seed=s) for s, _ in CELLS}
    jobs = [FitJob(outs[s], selector() if selector else reg("selector", "mlp",
                                                            {"hidden": [16, 8]}),
                   reg("recalibrator", rec, rec_params), reg("loss", loss),
                   reg("loss", "quadratic"), FitContext(seed=s, beta=b, device="cuda"))
            for s, b in CELLS]
    reg("scheme", scheme, {**FAST, "noise_std": noise}).fit_many(jobs)
    res = []
    for j in jobs:
        conf = j.recalibrator.confidence(j.outputs)
        res.append((conf, j.selector.score(j.outputs, conf)))
    return res, len(replays)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("scheme,rec,loss,k,noise", [
    ("joint", "platt", "s-mmce", 2, 0.0), ("joint", "temperature", "s-mce", 3, 0.5),
    ("sequential", "temperature", "s-tlbce", 3, 0.5), ("joint", "mlp", "s-tlbce", 3, 0.5),
    ("selection", "none", "s-mmce", 3, 0.0)])
def test_cuda_graphs_train_as_the_eager_step(monkeypatch, scheme, rec, loss, k, noise):
    """On a GPU the training step (lanes, noise, a tail batch: 200 rows in batches of 64)
    replayed from CUDA graphs trains what the eager step trains: the same kernels, equal
    up to the order of the GPU's atomic adds."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no capture may fail
        graphed, replays = _cuda_fit(monkeypatch, True, scheme, rec, loss, k, noise)
    eager, none = _cuda_fit(monkeypatch, False, scheme, rec, loss, k, noise)
    # 12 epochs of 4 steps: 3 warm-up steps per batch length, the rest replayed
    assert none == 0 and replays >= 12 * 4 - 6
    for (c1, s1), (c2, s2) in zip(graphed, eager):
        np.testing.assert_allclose(c1, c2, rtol=engine.REPLICA_RTOL, atol=1e-6)
        np.testing.assert_allclose(s1, s2, rtol=engine.REPLICA_RTOL, atol=1e-6)


class SyncingStack(engine.FuncStack):
    """A stacked g that reads a value back to the host at every step (not capturable)."""

    def forward(self, x):
        if float(x.abs().max()) > 1e9:  # a host sync
            x = x.clamp(-1e9, 1e9)
        return super().forward(x)


class SyncingNet(TanhNet):
    @classmethod
    def stacked(cls, modules):
        return SyncingStack(modules)


class SyncingSelector(TanhSelector):
    def init_module(self, outputs, context):
        self.module_ = seeded_init(context.seed, lambda: SyncingNet(outputs.feature_dim))
        return self.module_


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_capture_failure_trains_eagerly(monkeypatch):
    """A module that cannot be captured is trained eagerly, with a warning, to the same
    result; declaring ``cuda_graphs = False`` skips the attempt silently."""
    with pytest.warns(RuntimeWarning, match="could not be captured in a CUDA graph"):
        fallback, replays = _cuda_fit(monkeypatch, True, "joint", "temperature", "s-mce", 3,
                                      0.0, selector=SyncingSelector)
    assert replays == 0
    eager, _ = _cuda_fit(monkeypatch, False, "joint", "temperature", "s-mce", 3, 0.0,
                         selector=SyncingSelector)
    for (c1, s1), (c2, s2) in zip(fallback, eager):
        np.testing.assert_allclose(c1, c2, rtol=engine.REPLICA_RTOL, atol=1e-6)
        np.testing.assert_allclose(s1, s2, rtol=engine.REPLICA_RTOL, atol=1e-6)
    monkeypatch.setattr(SyncingNet, "cuda_graphs", False, raising=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _, replays = _cuda_fit(monkeypatch, True, "joint", "temperature", "s-mce", 3, 0.0,
                               selector=SyncingSelector)
    assert replays == 0


# --------------------------------------------------------------------------- per-replica hyperparameters
#: (epochs, lr, noise_std, λ) per replica: the trials of a tuned method (one seed and data),
#: a replica that never trains (0 epochs), and one of another seed
HYPER = [(12, 5e-3, 0.0, 8.0), (5, 2e-2, 0.5, 32.0), (9, 1e-3, 1.0, 2.0), (0, 1e-3, 1.0, 8.0),
         (12, 5e-3, 0.3, 16.0)]


def hyper_pairs(scheme, rec="temperature"):
    outs = {s: synthetic(seed=s) for s in (0, 1)}
    pairs = []
    for i, (epochs, lr, noise, lam) in enumerate(HYPER):
        seed = 1 if i == len(HYPER) - 1 else 0
        params = {"epochs": epochs, "lr": lr, "noise_std": noise, "batch_size": 64}
        pairs.append((reg("scheme", scheme, params),
                      make_job(seed, 0.7, outs[seed], rec=rec, loss="s-tlbce",
                               cov_params={"lam": lam})))
    return pairs


@pytest.mark.parametrize("scheme", ["joint", "sequential"])
def test_replicas_with_their_own_lr_epochs_noise_and_lambda_match_solo_fits(scheme, monkeypatch):
    """fit_configurations trains replicas that differ in learning rate, epochs, input noise
    and coverage λ as one model (one engine call, the per-replica Adam); each ends where its
    own scheme's fit leaves it, within REPLICA_RTOL; the 0-epoch replica is untouched."""
    calls = []
    real = engine.train_replicas

    def recording(job, resume=None):
        calls.append(job.hyper.epochs)
        return real(job, resume)

    monkeypatch.setattr("selbench_plugins.schemes.training.train_replicas", recording)
    together = hyper_pairs(scheme)
    type(together[0][0]).fit_configurations(together)
    # one engine call, an epoch count per replica, and the spare's (a twin of the last
    # seed's replica, trained last and discarded: issue 34)
    assert calls == [[h[0] for h in HYPER] + [HYPER[-1][0]]]
    monkeypatch.setattr("selbench_plugins.schemes.training.train_replicas", real)
    untrained = hyper_pairs(scheme)[3][1]
    untrained.selector.init_module(untrained.outputs, untrained.context)
    for (scheme_t, job), (scheme_a, alone) in zip(together, hyper_pairs(scheme)):
        scheme_a.fit_many([alone])
        assert scheme_t.n_fit_ == len(job.outputs)
        conf, conf_a = (j.recalibrator.confidence(j.outputs) for j in (job, alone))
        np.testing.assert_allclose(conf, conf_a, rtol=engine.REPLICA_RTOL, atol=1e-7)
        np.testing.assert_allclose(job.selector.score(job.outputs, conf),
                                   alone.selector.score(alone.outputs, conf_a),
                                   rtol=engine.REPLICA_RTOL, atol=1e-7)
        for k, v in job.selector.module_.state_dict().items():
            ref = alone.selector.module_.state_dict()[k]
            assert float((v - ref).abs().max()) <= engine.REPLICA_RTOL * float(ref.abs().max())
    for k, v in together[3][1].selector.module_.state_dict().items():  # 0 epochs: exact
        assert torch.equal(v, untrained.selector.module_.state_dict()[k])


def test_equal_per_replica_values_are_the_usual_training_bit_for_bit():
    """Equal values given per replica are the one value: fit_configurations of schemes with
    equal parameters is fit_many's training (the fused Adam), bit for bit."""
    outs = {s: synthetic(seed=s) for s in (0, 1)}
    params = dict(FAST, noise_std=0.5)
    results = []
    for configurations in (False, True):
        jobs = [make_job(s, b, outs[s], rec="temperature", loss="s-tlbce") for s, b in CELLS]
        if configurations:
            pairs = [(reg("scheme", "joint", params), j) for j in jobs]
            type(pairs[0][0]).fit_configurations(pairs)
        else:
            reg("scheme", "joint", params).fit_many(jobs)
        results.append([j.selector.score(j.outputs, j.recalibrator.confidence(j.outputs))
                        for j in jobs])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_replica_adam_is_the_fused_adam_per_replica_and_freezes_exactly():
    """ReplicaAdam: replica r's update is the fused Adam's with lr[r], bit for bit (weight
    decay included; 64 x 64 elements a replica, all in the kernel's vectorised loop); a
    frozen replica's parameters stay exactly as they were."""
    from selbench.training.hyper import ReplicaAdam

    torch.manual_seed(0)
    lrs, steps, freeze_at = [1e-2, 3e-3, 5e-2], 30, 10
    start = torch.randn(3, 64, 64)
    stacked = torch.nn.Parameter(start.clone())
    opt = ReplicaAdam([stacked], lrs, weight_decay=1e-2)
    solo = [torch.nn.Parameter(start[r].clone()) for r in range(3)]
    solo_opts = [torch.optim.Adam([p], lr=lr, weight_decay=1e-2, fused=True)
                 for p, lr in zip(solo, lrs)]
    frozen = None
    for t in range(steps):
        grad = torch.randn(3, 64, 64)
        if t == freeze_at:
            opt.freeze([1])
            frozen = stacked.detach()[1].clone()
        stacked.grad = grad
        opt.step()
        for r in (0, 2):
            solo[r].grad = grad[r].clone()
            solo_opts[r].step()
    assert torch.equal(stacked.detach()[1], frozen)
    for r in (0, 2):
        assert torch.equal(stacked.detach()[r], solo[r].detach())


def test_replica_adam_with_owners_of_any_layout_is_the_fused_adam_per_replica():
    """Owners that are not the leading dimension (replicas side by side in a row, one
    element no replica owns): each replica's elements take the fused Adam's steps with its
    rate, bit for bit; the unowned element never moves; the moments it reports are laid out
    as the parameters."""
    from selbench.training.hyper import ReplicaAdam

    torch.manual_seed(1)
    lrs = [1e-2, 3e-3, 5e-2]
    start = torch.randn(48, 3 * 40 + 1)  # columns r*40 .. r*40+39 are replica r's
    owners = torch.full(start.shape, -1, dtype=torch.int64)
    for r in range(3):
        owners[:, r * 40:(r + 1) * 40] = r
    stacked = torch.nn.Parameter(start.clone())
    opt = ReplicaAdam([stacked], lrs, weight_decay=1e-3, owners=[owners])
    solo = [torch.nn.Parameter(start[:, r * 40:(r + 1) * 40].clone()) for r in range(3)]
    solo_opts = [torch.optim.Adam([p], lr=lr, weight_decay=1e-3, fused=True)
                 for p, lr in zip(solo, lrs)]
    for _ in range(25):
        grad = torch.randn_like(start)
        stacked.grad = grad
        opt.step()
        for r in range(3):
            solo[r].grad = grad[:, r * 40:(r + 1) * 40].clone()
            solo_opts[r].step()
    for r in range(3):
        assert torch.equal(stacked.detach()[:, r * 40:(r + 1) * 40], solo[r].detach())
    assert torch.equal(stacked.detach()[:, -1], start[:, -1])
    steps, exp_avg, exp_avg_sq = opt.moments()
    assert steps == 25 and exp_avg[0].shape == start.shape
    assert torch.equal(exp_avg_sq[0][:, :40], solo_opts[0].state[solo[0]]["exp_avg_sq"])


def test_replica_owners_reads_each_layout_off_write_back():
    """The owner of each stacked parameter element, for the hand-stacked MLP (its own
    layout) and a torch.func stack (leading replica dimension)."""
    from selbench.training.hyper import replica_owners

    nets = [seeded_init(s, lambda: MLPSelectorNet(5, [4, 3])) for s in range(3)]
    for stacked in (MLPSelectorNet.stacked(nets), engine.FuncStack(nets)):
        owners = replica_owners(stacked, nets)
        params = list(stacked.parameters())
        assert [o.shape for o in owners] == [p.shape for p in params]
        flat = torch.cat([o.reshape(-1) for o in owners])
        assert sorted(flat.bincount().tolist()) == [sum(p.numel() for p in nets[0].parameters())] * 3
        values = torch.cat([p.detach().reshape(-1) for p in params])
        for r, net in enumerate(nets):  # replica r's elements are its own values
            own = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
            assert sorted(values[flat == r].tolist()) == sorted(own.tolist())
    if isinstance(stacked, engine.FuncStack):
        for o in owners:
            assert torch.equal(o, torch.arange(3).view(3, *[1] * (o.dim() - 1)).expand_as(o))
