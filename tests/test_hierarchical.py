"""The hierarchical Bayesian comparison (selbench.measure.hierarchical) against baycomp's
HierarchicalTest: its Stan data and its probabilities exactly (baycomp run with a stand-in
``stan`` module that records what it is given, no PyStan needed), and, where PyStan is
installed, the sampled probabilities within Monte-Carlo error, seeded determinism, the ROPE's
orientation, and the answers to a spec's questions.

Stan's compiled model (minutes of g++ on first use) is shared by these tests through pytest's
own cache folder (``.pytest_cache/d/stan``, via ``config.cache.mkdir``): built once per
checkout, a few seconds per test afterwards."""

from __future__ import annotations

import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import pytest
from selbench.measure import hierarchical as H
from selbench.reporting import questions as Q

baycomp = pytest.importorskip("baycomp", reason="baycomp holds the model's Stan program")


def _scores(nexp: int = 10, nseeds: int = 5, gain: float = 0.005, seed: int = 5):
    """ECE-like values (lower is better): a better than b by ``gain`` on average."""
    rng = np.random.default_rng(seed)
    b = rng.uniform(0.03, 0.08, (nexp, 1)) + rng.normal(0, 0.004, (nexp, nseeds))
    a = b - rng.normal(gain, 0.005, nexp)[:, None] + rng.normal(0, 0.004, (nexp, nseeds))
    return a, b


class _Recorder(types.ModuleType):
    """A stand-in for pystan's ``stan``: records the data baycomp builds and returns the
    given draws."""

    def __init__(self, draws: dict[str, np.ndarray]):
        super().__init__("stan")
        self.draws, self.data = draws, None

    def build(self, program_code, data):
        self.data = {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
                     for k, v in data.items()}
        draws = self.draws
        return types.SimpleNamespace(sample=lambda **kw: {k: v[None, :] for k, v in
                                                          draws.items()})


def _baycomp_with(draws, a, b, rope, seed, monkeypatch, tmp_path):
    rec = _Recorder(draws)
    monkeypatch.setitem(sys.modules, "stan", rec)
    monkeypatch.chdir(tmp_path)  # baycomp writes last-sample.pickle into the working dir
    post = baycomp.HierarchicalTest(-a, -b, rope, random_state=seed)
    return rec.data, post.probs(with_rope=True)


def test_stan_data_and_probabilities_are_baycomps(monkeypatch, tmp_path):
    a, b = _scores(nseeds=4)  # an even count: baycomp's fill fails on odd ones
    a[3] = b[3] + 0.002  # no variation over the seeds: baycomp's seeded ±uniform fill
    rng = np.random.default_rng(0)
    draws = {"delta0": rng.normal(0.0, 1.5, 3000), "std0": rng.uniform(0.2, 2.0, 3000),
             "nu": 1 + rng.gamma(2.0, 10.0, 3000)}
    ref_data, ref_probs = _baycomp_with(draws, a, b, 0.005, 3, monkeypatch, tmp_path)
    data, rope = H.stan_data(-a, -b, 0.005, 3)
    assert data.keys() == ref_data.keys()
    for k in data:
        np.testing.assert_array_equal(data[k], ref_data[k], err_msg=k)
    assert data["rho"] == 0.25 and np.ptp(data["x"][3]) > 0
    a, b = _scores(nseeds=5)
    a[3] = b[3] + 0.002
    odd, _ = H.stan_data(-a, -b, 0.005, 3)
    assert odd["x"][3].sum() == 0 and odd["x"][3][-1] == 0 and np.ptp(odd["x"][3]) > 0
    samples = H.region_samples(draws["delta0"], draws["std0"], draws["nu"], rope)
    got = baycomp.multiple.Posterior(samples).probs(with_rope=True)
    assert got == pytest.approx(ref_probs, abs=0)
    assert min(ref_probs) > 0.05  # the draws straddle the three regions


def test_no_variation_is_named():
    _, b = _scores(nexp=3)
    with pytest.raises(ValueError, match="do not vary over the seeds of any experiment"):
        H.stan_data(b, b, 0.005, 0)


def test_without_pystan_the_answer_says_so_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "stan", None)  # import stan -> ImportError
    assert "needs PyStan 3" in H.unavailable()
    with pytest.raises(H.HierarchicalUnavailable, match="selbench\\[stats\\]"):
        H.hierarchical(*_scores(), 0.005, lower_is_better=True, cache_dir="unused")
    ans = Q.answer(_experiments(), _block())
    assert ans["hierarchical_note"].startswith("not run: the hierarchical model needs PyStan")
    assert all(p["hierarchical"] is None for p in ans["pairs"])
    md = Q.markdown(ans)
    assert sum("Hierarchical model (seeds inside experiments): not run" in ln for ln in md) == 1
    off = Q.answer(_experiments(), {**_block(), "hierarchical": None})
    assert off["hierarchical_note"] == "not run: the spec's questions.hierarchical is null"


def _experiments(nexp: int = 8, nseeds: int = 4) -> list[dict]:
    a, b = _scores(nexp, nseeds, gain=0.02)
    out = []
    for i in range(nexp):
        rows = [{"method": m, "metrics": {"ece1": {"auc": {"seeds": list(range(nseeds)),
                                                           "values": list(v[i])}}}}
                for m, v in (("J", a), ("S", b))]
        out.append({"name": f"e{i}", "report": "auc", "betas": [0.5, 1.0],
                    "metrics": ["ece1"], "rows": rows})
    return out


def _block(**hier) -> dict:
    return {"rope": 0.005, "metric": "ece1", "alpha": 0.05,
            "pairs": [{"name": "joint vs seq", "a": "J", "b": "S"}],
            **({"hierarchical": hier} if hier else {})}


# --------------------------------------------------------------------------- with PyStan
@pytest.fixture(scope="module")
def stan_cache(request, tmp_path_factory):
    why = H.unavailable()
    if why:
        pytest.skip(why)
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    return cache.mkdir("stan") if cache is not None else tmp_path_factory.mktemp("stan")


def _small(seed: int) -> dict:
    return {"sampling": H.Sampling(seed, chains=2, nsamples=300, warmup=300)}


def test_seeded_and_oriented_by_the_rope(stan_cache):
    a, b = _scores(gain=0.03)  # a clearly better (lower) than b, far beyond the ROPE
    tmp = set(Path(tempfile.gettempdir()).glob("httpstan_*"))
    got = H.hierarchical(a, b, 0.005, lower_is_better=True, cache_dir=stan_cache, **_small(1))
    assert got == H.hierarchical(a, b, 0.005, lower_is_better=True, cache_dir=stan_cache,
                                 **_small(1))
    assert got["p_a_better"] > 0.99 and got["delta0_mean"] == pytest.approx(-0.03, abs=0.01)
    assert (got["experiments"], got["seeds"], got["rho"]) == (10, 5, 0.2)
    # read as accuracies (higher is better) the same numbers favour b; a wide ROPE: equal
    acc = H.hierarchical(a, b, 0.005, lower_is_better=False, cache_dir=stan_cache, **_small(1))
    assert acc["p_b_better"] > 0.99
    assert acc["delta0_mean"] == pytest.approx(got["delta0_mean"], abs=0.003)  # MC error
    wide = H.hierarchical(a, b, 0.2, lower_is_better=True, cache_dir=stan_cache,
                          **_small(1))
    assert wide["p_equal"] > 0.99
    assert not list(stan_cache.glob("httpstan/*/models/*/fits/*"))  # its fits are deleted
    assert set(Path(tempfile.gettempdir()).glob("httpstan_*")) == tmp  # and its sockets


def test_agrees_with_baycomps_hierarchical_test(stan_cache, monkeypatch, tmp_path):
    """Same model, data and sampler settings as baycomp's (4 chains × 1,000 draws after
    Stan's default 1,000 warm-up); baycomp's Stan seed is not ours (it passes none), so the
    two differ by Monte-Carlo error. Over six seeds our P(a better) on this input had a
    standard deviation of 0.0057 (an effective sample size near 2,300 of 4,000 draws); the
    difference of two independent runs then has one of about 0.008, and 0.04 is five of
    them."""
    a, b = _scores()
    got = H.hierarchical(a, b, 0.005, lower_is_better=True, cache_dir=stan_cache,
                         sampling=H.Sampling(0, chains=4, nsamples=1000, warmup=1000))
    monkeypatch.setenv("XDG_CACHE_HOME", str(stan_cache))  # baycomp's build: the same model
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # httpstan leaves its sockets
    ref = baycomp.HierarchicalTest(-a, -b, 0.005, chains=4, nsamples=1000).probs()
    assert (got["p_a_better"], got["p_equal"], got["p_b_better"]) == pytest.approx(ref,
                                                                                  abs=0.04)
    assert 0.5 < got["p_a_better"] < 0.99  # not a degenerate comparison
    for f in stan_cache.glob("httpstan/*/models/*/fits/*"):  # baycomp's (unseeded: none)
        f.unlink()


def test_the_questions_answer_with_it(stan_cache):
    ans = Q.answer(_experiments(), _block(chains=2, samples=300, warmup=300),
                   cache_dir=stan_cache)
    (p,) = ans["pairs"]
    h = p["hierarchical"]
    assert ans["hierarchical_note"] is None and p["hierarchical_note"] is None
    assert (h["experiments"], h["seeds"], h["chains"], h["nsamples"]) == (8, 4, 2, 300)
    a = np.array([e["rows"][0]["metrics"]["ece1"]["auc"]["values"] for e in _experiments()])
    b = np.array([e["rows"][1]["metrics"]["ece1"]["auc"]["values"] for e in _experiments()])
    assert h == H.hierarchical(a, b, 0.005, lower_is_better=True, cache_dir=stan_cache,
                               sampling=H.Sampling(Q.SEED, chains=2, nsamples=300, warmup=300))
    assert h["p_a_better"] > 0.95 and "; hierarchical: J better with P = " in p["verdict"]
    md = "\n".join(Q.markdown(ans))
    assert "| joint vs seq | 8 × 4 " in md and "experiments × seeds" in md
