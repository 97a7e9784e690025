"""The hierarchical Bayesian comparison of two methods over experiments *and* the seeds inside
each (Benavoli, Corani, Demšar & Zaffalon, JMLR 2017; Corani et al., Machine Learning 2017):
the model of ``baycomp.HierarchicalTest``, run with baycomp's own Stan program
(``baycomp/hierarchical-t-test.stan``) through PyStan 3.

Input: for each experiment, the per-seed values of method a and of method b (paired by seed;
``runs = 1``: the seeds are the "folds" of baycomp's model, so its correlation is
``rho = 1 / seeds``). Orientation as in :mod:`selbench.measure.paired`: baycomp counts higher
scores as better, so a metric where lower is better enters negated; "a better" is baycomp's
left region, where the difference b − a (in baycomp's orientation) is below −ROPE.

What is baycomp's, and what is re-done here (:func:`stan_data`, :func:`region_samples`):

* the data: the differences divided by the mean within-experiment standard deviation (so is
  the ROPE); an experiment whose differences are all equal gets baycomp's fill of ±uniform
  values within the scaled ROPE from ``numpy.random.RandomState(seed)`` (centred on 0 as
  baycomp's is, whatever the constant difference was; with an odd number of seeds the last
  one is 0, where baycomp 1.0.3 fails with a broadcasting error); the bounds and prior
  hyper-parameters are baycomp's defaults (``lower_alpha=1, upper_alpha=2, lower_beta=0.01,
  upper_beta=0.1, upper_sigma=1000``);
* the probabilities: each posterior draw (δ₀, σ₀, ν) of the higher-level Student-t gives the
  probability of the three regions for the next experiment, and P(a better), P(practically
  equal), P(b better) are the shares of draws in which each region is the most probable
  (``baycomp.multiple.Posterior.probs``, called here).

``HierarchicalTest.sample`` itself is not called because (baycomp 1.0.3) it does not pass its
``random_state`` to Stan, so its probabilities change from run to run, and it reads and
writes ``last-sample.pickle`` in the working directory (a write outside the results folder,
and a stale answer when the data's hash collides or the file is older than it thinks); its
data preparation is a closure inside that method, so the ~30 lines are written again here.

Stan's compiled model (≈65 MB, minutes of g++ on first use) and its fits live in httpstan's
cache, which is pointed at ``cache_dir`` (selbench's cache) for the duration of a call through
``XDG_CACHE_HOME`` (httpstan 4 finds its cache only through ``appdirs.user_cache_dir``, which
honours it on Linux; on macOS appdirs uses ``~/Library/Caches`` whatever the variable says).
A seeded fit is kept by httpstan (≈5 MB per 1,000 draws at 24 experiments × 5 seeds); the
fits a call adds are deleted when it has read them. httpstan's temporary files (its compile
folder, the socket of each sampling) go to a temporary folder that is removed when the call
ends. Stan's progress output is captured, not
printed; it is shown only when building or sampling fails.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CHAINS", "HIERARCHICAL_NAME", "NSAMPLES", "WARMUP", "HierarchicalUnavailable",
           "Sampling", "hierarchical", "region_samples", "stan_data", "unavailable"]

#: Stan chains, draws per chain after warm-up, warm-up iterations per chain (baycomp's
#: defaults are 4 chains × 10,000 draws; 2,500 keep the Monte-Carlo error of a probability
#: near 0.01 at a quarter of the sampling time and cache space)
CHAINS = 4
NSAMPLES = 2500
WARMUP = 1000


@dataclass(frozen=True)
class Sampling:
    """How Stan samples one hierarchical fit (a spec's ``questions.hierarchical`` block and
    the seed): the same data and sampling give the same numbers."""

    seed: int = 0
    chains: int = CHAINS
    #: draws per chain after warm-up
    nsamples: int = NSAMPLES
    #: warm-up iterations per chain
    warmup: int = WARMUP


#: baycomp's hyper-parameters of the model (HierarchicalTest.sample's defaults)
PRIOR = {"lower_alpha": 1.0, "upper_alpha": 2.0, "lower_beta": 0.01, "upper_beta": 0.1,
         "upper_sigma": 1000.0}

HIERARCHICAL_NAME = (
    "hierarchical Bayesian model over experiments and the seeds inside each (Benavoli, "
    "Corani, Demšar & Zaffalon, JMLR 2017): baycomp's Stan program and data preparation "
    "(baycomp.HierarchicalTest, runs = 1, rho = 1/seeds), sampled by PyStan 3 with a fixed "
    "seed; probabilities: the share of posterior draws in which each region is the most "
    "probable for the next experiment")


class HierarchicalUnavailable(RuntimeError):
    """The hierarchical model cannot be run here (no PyStan, or Stan cannot build); the
    message says why in one line."""


def unavailable() -> str | None:
    """Why the hierarchical model cannot run here (None: PyStan and baycomp import)."""
    try:
        import baycomp  # noqa: F401
        import stan  # noqa: F401
    except ImportError as e:  # pystan 3.10 also fails here without setuptools' pkg_resources
        return (f"the hierarchical model needs PyStan 3 and baycomp (pip install "
                f"'selbench[stats]'): {e}")
    return None


def _scores(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]
            ) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.ndim != 2 or x.shape != y.shape or x.shape[0] < 1 or x.shape[1] < 2:
        raise ValueError("a and b must be (experiments × seeds) arrays of equal shape with at "
                         f"least 2 seeds; got {x.shape} and {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("a and b must be finite")
    return x, y


def stan_data(x: np.ndarray, y: np.ndarray, rope: float, seed: int) -> tuple[dict, float]:
    """baycomp's Stan data for scores ``x``, ``y`` (experiments × seeds, higher better) and
    the ROPE on the scale of the scaled differences ``y − x``."""
    diff = y - x
    scale = float(np.mean(np.std(diff, axis=1)))
    if not scale > 0:
        raise ValueError("the differences between a and b do not vary over the seeds of any "
                         "experiment: the hierarchical model has no scale")
    rope, diff = rope / scale, diff / scale
    nexp, nseeds = diff.shape
    half = nseeds // 2
    rng = np.random.RandomState(seed)
    for row in diff:  # baycomp's fill of an experiment whose differences do not vary
        if np.var(row) == 0:
            row[:half] = rng.uniform(-rope, rope, half)
            row[half:2 * half] = -row[:half]
            row[2 * half:] = 0.0  # an odd count: baycomp 1.0.3 fails to broadcast here
    within = float(np.mean(np.std(diff, axis=1)))
    among = float(np.std(np.mean(diff, axis=1))) if nexp > 1 else within
    bound = float(np.max(np.abs(diff)))
    p = PRIOR
    return {"x": diff, "Nsamples": nseeds, "q": nexp, "rho": 1.0 / nseeds,
            "deltaLow": -bound, "deltaHi": bound,
            "lowerAlpha": p["lower_alpha"], "upperAlpha": p["upper_alpha"],
            "lowerBeta": p["lower_beta"], "upperBeta": p["upper_beta"],
            "stdLow": 0.0, "stdHi": within * p["upper_sigma"],
            "std0Low": 0.0, "std0Hi": among * p["upper_sigma"]}, rope


def region_samples(delta0: np.ndarray, std0: np.ndarray, nu: np.ndarray,
                   rope: float) -> np.ndarray:
    """baycomp's per-draw probabilities (draws × [left, rope, right]) of the next
    experiment's difference under the Student-t(ν, δ₀, σ₀) of each draw."""
    from scipy import stats

    left = stats.t.cdf(-rope, nu, delta0, std0)
    right = 1.0 - stats.t.cdf(rope, nu, delta0, std0)
    return np.column_stack([left, 1.0 - left - right, right])


@contextlib.contextmanager
def _stan_cache(cache_dir: Path) -> Iterator[None]:
    """httpstan's cache under ``cache_dir`` while the block runs (see the module's text), and
    Python's temporary folder a fresh one that is removed afterwards: httpstan 4.13 binds a
    Unix socket ``httpstan_*.sock`` per sampling in ``tempfile.gettempdir()`` and never
    removes the file (measured: one left in /tmp per call)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    old_env, old_tmp = os.environ.get("XDG_CACHE_HOME"), tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="selbench-stan-") as tmp:
        os.environ["XDG_CACHE_HOME"] = str(cache_dir)
        tempfile.tempdir = tmp
        try:
            yield
        finally:
            tempfile.tempdir = old_tmp
            if old_env is None:
                del os.environ["XDG_CACHE_HOME"]
            else:
                os.environ["XDG_CACHE_HOME"] = old_env


def _sample(data: dict, sampling: Sampling) -> dict[str, np.ndarray]:
    """δ₀, σ₀ and ν of every draw of baycomp's model (inside :func:`_stan_cache`)."""
    import baycomp
    import httpstan.cache
    import stan

    program = (Path(baycomp.__file__).parent / "hierarchical-t-test.stan").read_text()
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            model = stan.build(program, data=data, random_seed=int(sampling.seed))
            fits = httpstan.cache.model_directory(model.model_name) / "fits"
            before = set(fits.glob("*")) if fits.is_dir() else set()
            try:
                fit = model.sample(num_chains=int(sampling.chains),
                                   num_samples=int(sampling.nsamples),
                                   num_warmup=int(sampling.warmup))
            finally:
                for path in (set(fits.glob("*")) if fits.is_dir() else set()) - before:
                    path.unlink(missing_ok=True)
    except (RuntimeError, ValueError, OSError) as e:
        tail = " | ".join(log.getvalue().strip().splitlines()[-3:])
        raise HierarchicalUnavailable(f"Stan failed ({type(e).__name__}: {e})"
                                      + (f"; its last output: {tail}" if tail else "")) from e
    return {k: np.asarray(fit[k][0], dtype=np.float64) for k in ("delta0", "std0", "nu")}


def hierarchical(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], rope: float, *,
                 lower_is_better: bool, cache_dir: str | Path,
                 sampling: Sampling = Sampling()) -> dict[str, Any]:
    """P(a better), P(practically equal: the next experiment's difference within ±``rope``),
    P(b better) from baycomp's hierarchical model on ``a`` and ``b`` (experiments × seeds,
    paired by seed), sampled as ``sampling`` says (the same input, seed and sampling give the
    same numbers):
    ``{"p_a_better", "p_equal", "p_b_better", "rope", "seed", "chains", "nsamples",
    "warmup", "experiments", "seeds", "rho", "delta0_mean"}`` (``delta0_mean``: the posterior
    mean of the higher-level mean difference, in the metric's units, a − b).
    Raises :class:`HierarchicalUnavailable` when PyStan is missing or Stan fails, ValueError
    on bad input."""
    why = unavailable()
    if why:
        raise HierarchicalUnavailable(why)
    from baycomp.multiple import Posterior

    x, y = _scores(a, b)
    seed, chains, nsamples, warmup = (sampling.seed, sampling.chains, sampling.nsamples,
                                      sampling.warmup)
    sign = -1.0 if lower_is_better else 1.0  # baycomp: higher scores are better
    data, scaled_rope = stan_data(sign * x, sign * y, float(rope), int(seed))
    with _stan_cache(Path(cache_dir)):
        draws = _sample(data, sampling)
    samples = region_samples(draws["delta0"], draws["std0"], draws["nu"], scaled_rope)
    left, equal, right = (float(v) for v in Posterior(samples).probs(with_rope=True))
    scale = float(np.mean(np.std(sign * (y - x), axis=1)))
    return {"p_a_better": left, "p_equal": equal, "p_b_better": right, "rope": float(rope),
            "seed": int(seed), "chains": int(chains), "nsamples": int(nsamples),
            "warmup": int(warmup), "experiments": int(x.shape[0]), "seeds": int(x.shape[1]),
            "rho": float(data["rho"]),
            "delta0_mean": float(-sign * scale * np.mean(draws["delta0"]))}
