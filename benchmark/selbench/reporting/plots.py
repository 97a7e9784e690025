"""The paper's figures, drawn from a results directory: reliability diagrams (binned and
smoothed), selective calibration error and selective accuracy over coverage, risk-coverage
curves, confidence histograms.

Everything is drawn from what ``selbench run`` wrote (cell files and, for the first seed, the
per-example ``.npz`` arrays next to them), so ``selbench plot DIR`` redraws the figures
without recomputing anything. Files go to ``DIR/plots/<experiment>/`` as PNG and SVG:

``reliability/<method>.png``  (the paper's Figure 1)
    Two columns: the backbone's raw max-softmax confidence (*before recalibration*) and the
    method's recalibrated confidence (*after*). Each panel shows all evaluation examples (blue)
    and the examples the method's selector accepts at coverage β (green).

    *Top row, binned*: one marker per bin, at (mean confidence, accuracy) of the bin, its area
    proportional to the bin's share of the examples (its weight in the ECE). The bins are
    exactly those of :func:`selbench.measure.metrics.ece` (15 equal-mass bins, ties merged), so the
    ECE₁ printed in each legend is the weighted mean distance of the markers from the red
    diagonal.

    *Bottom row, smoothed* (the reliability diagram of relplot's ``rel_diagram``, Błasiok &
    Nakkiran 2024): the kernel-smoothed accuracy against confidence from
    :func:`selbench.measure.smooth.smooth_reliability` (its bandwidth σ chosen with the smooth ECE
    unless given), drawn as a line whose width grows with the kernel density of the
    confidences, the density itself shaded along the bottom of the panel, the diagonal, and
    the smECE (and σ) of each curve in the legend.
``selective-ece.png``  (Figure 2)
    ECE₁ and ECE₂ of the accepted examples against the coverage level β, one line per method:
    the mean over seeds, shaded ± one standard deviation; a third panel with the smECE when
    the experiment's leaderboard columns (its spec's ``metrics:``) include ``smece``.
``selective-accuracy.png``  (Figure 3, all methods)
    Selective accuracy against β, one line per method, mean ± std over seeds.

    With more than eight methods (:data:`selbench.reporting.figures.MAX_PER_PANEL`), these
    two figures and the risk-coverage figure split the methods over rows of panels, one row
    per scheme (a scheme of more than eight methods over several rows of at most eight),
    each row with its own legend and y scale, the rows sharing the x axis; with eight or
    fewer, one row.
``risk-coverage.png``
    For every method with per-example arrays, from its selector's scores on the evaluation
    examples of the plotted seed (:func:`selbench.measure.riskcoverage.risk_coverage_curve`, ties in
    the scores merged: one point per distinct threshold): left, the selective risk (error rate
    of the accepted examples) against coverage; right, the generalized risk (errors among the
    accepted divided by all N examples, Traub et al. 2024). The legend gives each method's
    AURC and AUGRC (:func:`selbench.measure.riskcoverage.aurc`, :func:`~selbench.measure.riskcoverage.augrc`).
    A selector that does not select (its cell records ``selects: false``; its scores are
    constant) has a single point, at full coverage, drawn as a marker.
``DIR/plots/summary/critical-difference-<metric>.png``  (two or more experiments; not in an experiment's folder)
    Each method's average rank over the experiments for one metric (1 = best, on the left),
    a bar joining the methods whose ranks the Nemenyi test does not separate, and the
    critical difference drawn to scale: see :mod:`selbench.reporting.ranking`.
``DIR/plots/summary/cost-quality.png``  (specs with ``cost: true``)
    Seconds per cell (fit, and tuning where tuned; log scale) against the first ranked
    metric, one point per method and experiment and one per method at the mean: see
    :mod:`selbench.reporting.cost`.
``confidence/<method>.png``  (Figure 3)
    Left: histogram of the recalibrated confidence of all examples and of the accepted ones at
    β. Right: the method's selective accuracy over β (mean ± std over seeds), with the
    accuracy of all examples dashed.

The β of the per-example figures is the experiment's training β, or for ``per_beta``
experiments the reported β closest to 0.8 (the paper's Figure 3); ``beta=`` overrides it.
The per-example figures of a ``per_beta`` experiment (reliability, confidence, risk-coverage)
use the cells trained at the β closest to it. The accepted examples are chosen from the stored
scores by :func:`selbench.measure.metrics.accept_mask` (exactly ⌈β·n⌉ of them, ties broken by the
cell's seed, with the experiment's Hoeffding ``delta`` when it has a coverage guarantee),
exactly as the runner selected them: the arrays are stored in float64 and verified against
the checksum in their cell record.

Metric names and labels come from the registry :data:`selbench.measure.metrics.METRICS`; the curves
over β are the means and standard deviations over seeds of the values the cells hold.

Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot, no global
backend switch, no display needed); SVGs carry no date and stable element ids, so redrawing
unchanged results gives identical files, and a figure whose inputs did not change is not
redrawn at all (:mod:`selbench.reporting.figkeys`). With more than one usable CPU and enough figures,
worker processes draw some of them (``workers=`` of :func:`write_plots`, or
``$SELBENCH_PLOT_WORKERS``; 1 draws them all in the calling process): the files are the
same bytes either way.

The figures themselves (matplotlib on plain data) are :mod:`selbench.reporting.figures`; this
module reads the results folder, makes one job per figure and has them drawn into files.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from selbench.measure.metrics import accept_mask
from selbench.reporting import cost, figures, ranking
from selbench.reporting.figkeys import FigureKeys, code_digest, value_digest
from selbench.reporting.figures import (
    RC_PARAMS,
    ReliabilityBins,
    figure_paths,
    reliability_bins,
    reliability_diagram,
    reliability_figure,
    risk_coverage_figure,
    save_figure,
)
from selbench.reporting.leaderboard import columns_for, tables_from
from selbench.reporting.loading import LeaderboardError, ResultSet, load_results
from selbench.store.results import CellRecord, ResultsDir, ResultsError, slug

__all__ = [
    "ReliabilityBins",
    "accepted_mask",
    "metric_curves",
    "plot_beta",
    "reliability_bins",
    "reliability_diagram",
    "reliability_figure",
    "risk_coverage_figure",
    "write_plots",
]

FORMATS = ("png", "svg")
#: metrics of the selective-ECE figure: always these, and smECE when the experiment shows it
_ECE_KEYS = ("ece1", "ece2")
_OPTIONAL_ECE_KEYS = ("smece",)


def accepted_mask(
    score: Any, beta: float, delta: float | None = None, *, seed: int = 0
) -> np.ndarray:
    """The examples accepted at coverage ``beta``, as the runner selects them.

    :func:`selbench.measure.metrics.accept_mask`: exactly ``ceil(beta * n)`` examples (the Hoeffding
    count with ``delta``), the highest scores, ties broken by the permutation seeded with
    ``seed`` (pass the cell's seed to match its metrics).
    """
    return accept_mask(np.asarray(score, dtype=np.float64), beta, delta=delta, seed=seed)


def plot_beta(experiment: dict, override: float | None = None) -> float:
    """β of the per-example figures: ``override``, else the training β, else the β closest to 0.8."""
    if override is not None:
        if not (0.0 < override <= 1.0):
            raise ValueError(f"beta must lie in (0, 1]; got {override!r}")
        return float(override)
    tb = experiment["train_beta"]
    if tb != "per_beta":
        return float(tb)
    betas = [float(b) for b in experiment["betas"]]
    return min(betas, key=lambda b: (round(abs(b - 0.8), 9), b))


def metric_curves(results: ResultSet, experiment: str, method: str, betas: Sequence[float],
                  keys: Sequence[str]) -> dict[str, Any]:
    """One method's metrics over β, summarised over seeds from the values its cells hold.

    ``{"betas": betas, key: {"mean": [...], "std": [...], "n": [...]}}`` for each key, as
    :func:`selbench.measure.stats.summarize` gives them at each β (a metric a cell does not hold
    counts as NaN, and a seed without a cell at that β is left out; computed here without
    summarize's t-interval, whose scipy.stats import and quantiles cost half a second)."""
    per_seed: dict[int, dict[float, dict[str, Any]]] = {}
    for rec in results.cells:
        if rec["experiment"] == experiment and rec["method"] == method:
            for b_i, b in enumerate(rec["betas"]):
                point = {k: v[b_i] for k, v in rec["metrics"].items()}
                per_seed.setdefault(int(rec["seed"]), {})[float(b)] = point
    out: dict[str, Any] = {"betas": [float(b) for b in betas]}
    for key in keys:
        means, stds, ns = [], [], []
        for b in out["betas"]:
            vals = {s: math.nan if c[b].get(key) is None else float(c[b][key])
                    for s, c in per_seed.items() if b in c}
            mean, std, n = _mean_std(vals)
            means.append(mean)
            stds.append(std)
            ns.append(n)
        out[key] = {"mean": means, "std": stds, "n": ns}
    return out


def _mean_std(per_seed: dict[int, float]) -> tuple[float, float, int]:
    """``mean``, ``std`` and ``n`` exactly as :func:`selbench.measure.stats.summarize` gives them:
    NaN when a value is not finite or there is none, std 0.0 for one seed."""
    arr = np.asarray([per_seed[s] for s in sorted(per_seed)], dtype=np.float64)
    n = int(arr.size)
    finite = bool(n) and bool(np.isfinite(arr).all())
    mean = float(arr.mean()) if finite else math.nan
    std = float(arr.std(ddof=1)) if finite and n > 1 else (0.0 if finite else math.nan)
    return mean, std, n

# --------------------------------------------------------------------------- entry point
def _arrays_for(results: ResultSet, experiment: str, method: str, beta: float,
                per_beta: bool) -> tuple[dict[str, np.ndarray], int, float, bool] | None:
    """Per-example arrays of the method's lowest seed that has them (and, for per_beta
    experiments, of the cell trained at the β closest to ``beta``), verified against the
    checksum in the cell record; a cell record that names arrays it cannot deliver is an
    error naming the file, never a silently missing figure."""
    cands = [rec for rec in results.cells
             if rec["experiment"] == experiment and rec["method"] == method
             and rec.get("arrays")]
    if not cands:
        return None
    if per_beta:
        target = min({float(r["train_beta"]) for r in cands},
                     key=lambda b: (round(abs(b - beta), 9), b))
        cands = [r for r in cands if float(r["train_beta"]) == target]
        beta = target
    rec = min(cands, key=lambda r: int(r["seed"]))
    path = Path(rec["_file"])
    fields = {k: v for k, v in rec.items() if k in CellRecord.model_fields}
    try:
        arrays = ResultsDir(path.parent).load_arrays(path, CellRecord.model_validate(fields))
    except ResultsError as exc:
        raise LeaderboardError(str(exc)) from None
    return arrays, int(rec["seed"]), beta, bool(rec.get("selects", True))


def _ece_keys(exp: dict) -> list[str]:
    shown = [c.key for c in columns_for(exp)]  # the experiment's leaderboard columns
    return list(_ECE_KEYS) + [k for k in _OPTIONAL_ECE_KEYS if k in shown]


# --------------------------------------------------------------------------- drawing in parallel
#: environment variable: how many processes draw the figures (1: all in this process; unset
#: or 0: automatic, see :func:`write_plots`)
WORKERS_ENV = "SELBENCH_PLOT_WORKERS"
#: with fewer figures than this, the automatic choice draws them all in this process: a
#: worker process first imports matplotlib (about a second of CPU) before it draws anything
MIN_PARALLEL_FIGURES = 12
#: the automatic choice starts no more processes than give each this many figures
_FIGURES_PER_PROCESS = 4


@dataclass(frozen=True)
class _Job:
    """One figure to draw: the figure function of :mod:`selbench.reporting.figures` named
    ``maker``, called with
    ``args``, saved to ``stem`` (plus each format's suffix). Small enough to hand to a
    worker process: the per-example arrays of one method, metric curves, titles."""

    maker: str
    args: tuple
    stem: Path


#: rough drawing cost of each kind of figure, to hand the expensive ones out first
_COST = {"curves_figure": 3, "reliability_figure": 2, "risk_coverage_figure": 2,
         "confidence_figure": 1}


def _draw(job: _Job, formats: Sequence[str]) -> list[Path]:
    # looked up by name in selbench.reporting.figures when called: the same function in
    # a worker as in this process
    return save_figure(getattr(figures, job.maker)(*job.args), job.stem, formats)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _n_workers(workers: int | None, n_jobs: int) -> int:
    """Processes to draw ``n_jobs`` figures (this one included): ``workers``, else
    ``$SELBENCH_PLOT_WORKERS``; 0 or unset: automatic."""
    if workers is None:
        env = os.environ.get(WORKERS_ENV, "").strip()
        try:
            workers = int(env) if env else 0
        except ValueError:
            raise ValueError(f"{WORKERS_ENV} must be a number of processes (0: automatic); "
                             f"got {env!r}") from None
    if workers < 0:
        raise ValueError(f"workers must be a number of processes (0: automatic); got {workers}")
    if workers == 0:
        if n_jobs < MIN_PARALLEL_FIGURES:
            return 1
        workers = min(usable_cpus(), -(-n_jobs // _FIGURES_PER_PROCESS))
    return max(1, min(workers, n_jobs))


class _Queue:
    """The figures to draw, shared by this process and its workers through a private
    directory: position ``p`` is taken by whoever first creates ``take-p`` there (``O_EXCL``
    makes that atomic), ``done-p`` marks it drawn, ``stop`` tells everyone to take no more,
    ``error-p`` holds the exception a figure raised. Workers take from the front (the most
    expensive figures first), this process from the back, so whatever the workers have taken
    is always a prefix of the queue: this process stops at the first position it cannot take."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def take(self, pos: int) -> bool:
        try:
            os.close(os.open(self.folder / f"take-{pos}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def mark(self, name: str, data: bytes = b"") -> None:
        (self.folder / name).write_bytes(data)

    def has(self, name: str) -> bool:
        return (self.folder / name).exists()


def _failure(exc: BaseException) -> bytes:
    """An exception and its traceback, pickled for the process that waits on the worker."""
    import pickle
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        blob = pickle.dumps(exc)
    except Exception:  # an exception that does not pickle: its text only
        blob = None
    return pickle.dumps((text, f"{type(exc).__name__}: {exc}", blob))


def _reraise(failure: bytes):
    """Raise the exception of :func:`_failure` here, its worker's traceback as its cause."""
    import pickle

    text, summary, blob = pickle.loads(failure)
    try:
        exc = pickle.loads(blob)
    except Exception:  # no blob, or an exception that cannot be rebuilt
        exc = RuntimeError(f"in a worker process drawing figures: {summary}")
    exc.__cause__ = _WorkerTraceback(text)
    raise exc


def _worker_main(payload: str) -> int:
    """A worker process: draw figures from the front of the queue until none is left."""
    import pickle

    import matplotlib

    with open(payload, "rb") as fh:
        pickle.load(fh)  # sys.path, set by the code that started this process
        rc, formats, queue = pickle.load(fh)
    matplotlib.rcParams.update(rc)  # the caller's settings, RC_PARAMS included: the same bytes
    shared = _Queue(Path(payload).parent)
    for pos, (_, job) in enumerate(queue):
        if shared.has("stop"):
            break
        if not shared.take(pos):
            continue
        try:
            _draw(job, formats)
        except BaseException as exc:
            shared.mark(f"error-{pos}", _failure(exc))
            shared.mark("stop")
            return 1
        shared.mark(f"done-{pos}")
    return 0


#: what a worker process runs: it takes the caller's sys.path before importing selbench
_WORKER_CODE = ("import pickle, sys\n"
                "with open(sys.argv[1], 'rb') as fh:\n"
                "    sys.path[:] = pickle.load(fh)\n"
                "from selbench.reporting.plots import _worker_main\n"
                "sys.exit(_worker_main(sys.argv[1]))\n")


def _write_payload(payload: Path, formats: Sequence[str], queue: list[tuple[int, _Job]]) -> None:
    """Write what the workers read (:func:`_worker_main`): this process's ``sys.path``, then
    its matplotlib settings (the backend aside), the formats and the queue."""
    import pickle
    import sys

    import matplotlib

    rc = {k: v for k, v in matplotlib.rcParams.items() if k != "backend"}
    with open(payload, "wb") as fh:
        pickle.dump(list(sys.path), fh)
        pickle.dump((rc, list(formats), queue), fh, protocol=pickle.HIGHEST_PROTOCOL)


def _start_workers(procs: list[Any], payload: Path, count: int) -> None:
    """Start ``count`` worker processes on ``payload``, each appended to ``procs`` as it
    starts (so that a caller interrupted meanwhile stops those that did); fewer, with a
    warning, when the system gives no more."""
    import subprocess
    import sys

    for _ in range(count):
        try:
            procs.append(subprocess.Popen([sys.executable, "-c", _WORKER_CODE, str(payload)],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        except OSError as exc:  # no processes to be had: this one draws the rest
            warnings.warn(f"drawing the figures in fewer processes: {exc}", RuntimeWarning,
                          stacklevel=4)
            break


def _stop_workers(shared: _Queue, procs: list[Any]) -> None:
    """After an exception in this process: the workers finish their figure and stop (a
    worker still running a minute later is killed)."""
    import subprocess

    with contextlib.suppress(OSError):  # the workers finish their figure, and stop
        shared.mark("stop")
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _left_over(shared: _Queue, n: int, drawn: set[int]) -> list[int]:
    """Once the workers have exited: raise here the first exception a figure raised in a
    worker; else the positions of the queue nobody drew (those of a worker that died)."""
    errors = sorted(shared.folder.glob("error-*"), key=lambda p: int(p.name.split("-")[1]))
    if errors:
        _reraise(errors[0].read_bytes())
    return [pos for pos in range(n) if pos not in drawn and not shared.has(f"done-{pos}")]


def _draw_all(jobs: list[_Job], formats: Sequence[str], workers: int, *,
              helping: bool = True) -> list[Path]:
    """Draw every job; the paths in the order of ``jobs``, whoever drew them.

    With ``workers`` > 1, ``workers - 1`` worker processes and this one draw from one queue:
    this process starts at once, the workers join in once they have imported matplotlib
    (about a second). A worker is a fresh interpreter (``python -c``: no fork of this
    process, which may have torch's thread pools running, and no re-run of its main module,
    which multiprocessing's spawn and forkserver do) that imports this module and draws
    with this process's matplotlib settings, so every file is the same bytes as drawn here.
    An exception a figure raises in a worker is raised here; the figures of a worker that
    dies otherwise (or does not start) are drawn here. ``helping=False``: this process only
    draws what the workers left (for tests)."""
    if workers <= 1 or len(jobs) < 2:
        return [path for job in jobs for path in _draw(job, formats)]
    import shutil
    import tempfile

    queue = sorted(enumerate(jobs), key=lambda ij: -_COST.get(ij[1].maker, 1))
    folder = Path(tempfile.mkdtemp(prefix="selbench-plots-"))
    shared = _Queue(folder)
    payload = folder / "jobs.pickle"
    procs: list[Any] = []  # the worker processes (subprocess.Popen)
    drawn: set[int] = set()  # positions drawn here
    try:
        _write_payload(payload, formats, queue)
        _start_workers(procs, payload, workers - 1)
        for pos in reversed(range(len(queue))) if helping else ():
            if shared.has("stop") or not shared.take(pos):
                break  # a worker failed, or the workers have taken the rest
            _draw(queue[pos][1], formats)
            drawn.add(pos)
        for proc in procs:
            proc.wait()
    except BaseException:
        _stop_workers(shared, procs)
        shutil.rmtree(folder, ignore_errors=True)
        raise
    try:
        left = _left_over(shared, len(queue), drawn)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    failed = [proc.returncode for proc in procs if proc.returncode]
    if failed:
        warnings.warn(f"{len(failed)} worker process(es) drawing figures exited with status "
                      f"{failed}: drew their figures in this process", RuntimeWarning,
                      stacklevel=3)
    for pos in left:
        _draw(queue[pos][1], formats)
    return [path for job in jobs for path in figure_paths(job.stem, formats)]


class _WorkerTraceback(Exception):
    """The traceback of an exception raised in a worker process (its ``__cause__``)."""


def _experiment_jobs(results: ResultSet, exp: dict, store: ResultsDir,
                     beta: float | None) -> list[_Job]:
    """The figures of one experiment, in the order they are listed: the selective-ECE and
    selective-accuracy curves, each method's reliability diagram and confidence histogram
    (the methods with per-example arrays), then the risk-coverage figure of those methods."""
    where = store.plots_dir(exp["name"])
    name = (f"{exp['name']}: {exp['dataset']['name']} / {exp['backbone']['name']}, "
            f"evaluated on '{exp['eval_split']}'")
    ece_keys = _ece_keys(exp)
    curves = [(m["label"], metric_curves(results, exp["name"], m["label"], exp["betas"],
                                         [*ece_keys, "accuracy"]))
              for m in exp["methods"]]
    groups = [_group(m) for m in exp["methods"]]
    jobs = [_Job("curves_figure", (curves, ece_keys, name, groups), where / "selective-ece"),
            _Job("curves_figure", (curves, ["accuracy"], name, groups),
                 where / "selective-accuracy")]
    b = plot_beta(exp, beta)
    guarantee = exp.get("coverage_guarantee")
    delta = guarantee["delta"] if guarantee else None
    ranked, ranked_groups = [], []
    for method, group, (label, curve) in zip(exp["methods"], groups, curves):
        found = _arrays_for(results, exp["name"], label, b, exp["train_beta"] == "per_beta")
        if found is None:
            continue
        arrays, seed, b_used, selects = found
        point = _operating_point(results, exp["name"], label, seed,
                                 b_used if exp["train_beta"] == "per_beta" else None)
        ranked.append((label + ("" if b_used == b else f" (trained at β = {b_used:g})")
                       + f", seed {seed}", arrays["score"], arrays["correct"], selects)
                      + ((point,) if point is not None else ()))
        ranked_groups.append(group)
        jobs += _method_jobs(exp["name"], method, label, curve, found, delta, where)
    if ranked:
        target = (exp.get("risk_guarantee") or {}).get("risk")
        args = (ranked, f"{name}, risk against coverage", target or None, ranked_groups)
        jobs.append(_Job("risk_coverage_figure", args, where / "risk-coverage"))
    return jobs


def _group(method: dict) -> str:
    """The group of a method in the curve figures' rows of panels (with more methods than
    one panel shows, :func:`selbench.reporting.figures.method_panels`): its scheme, as the
    spec names it."""
    return f"scheme: {method['scheme']['name']}"


def _operating_point(results: ResultSet, experiment: str, method: str, seed: int,
                     train_beta: float | None) -> tuple[float, float] | None:
    """The (coverage, selective risk) a risk guarantee gave the plotted cell (for ``per_beta``
    experiments the cell trained at ``train_beta``), or ``None``."""
    for rec in results.cells:
        got = rec.get("metrics", {})
        if (rec["experiment"] == experiment and rec["method"] == method
                and int(rec["seed"]) == seed and "rg_coverage" in got
                and (train_beta is None or float(rec["train_beta"]) == train_beta)):
            return float(got["rg_coverage"][0]), float(got["rg_risk"][0])
    return None


def _method_jobs(experiment: str, method: dict, label: str, curve: dict,
                 found: tuple[dict[str, np.ndarray], int, float, bool], delta: float | None,
                 where: Path) -> list[_Job]:
    """A method's reliability diagram and confidence histogram, from its per-example arrays
    (``found``: what :func:`_arrays_for` gives) and the examples it accepts."""
    arrays, seed, b_used, selects = found
    if selects:
        accept = accepted_mask(arrays["score"], b_used, delta, seed=seed)
    else:  # a selector that does not select accepts every example
        accept = np.ones(len(arrays["score"]), dtype=bool)
    title = f"{experiment}: {label} (seed {seed})"
    arrays = {k: arrays[k] for k in ("confidence", "raw_confidence", "correct")}
    return [_Job("reliability_figure",
                 (arrays, accept, b_used, title, method["recalibrator"]["name"]),
                 where / "reliability" / slug(label)),
            _Job("confidence_figure", (arrays, accept, b_used, curve, title),
                 where / "confidence" / slug(label))]


def _summary_jobs(results: ResultSet, store: ResultsDir) -> list[_Job]:
    """The cost-versus-quality figure where the spec asks for it (:mod:`selbench.reporting.
    cost`); with two or more experiments, a critical-difference diagram of each metric the
    summary across experiments ranks (:mod:`selbench.reporting.ranking`), at least two
    methods ranked."""
    tables = tables_from(results)
    where = store.plots_dir("summary")
    costs = cost.figure_args(tables)  # where the spec asks (cost: true)
    jobs = [_Job("cost_quality_figure", costs, where / "cost-quality")] if costs else []
    summary = tables.get("summary")
    if summary is None:
        return jobs
    return jobs + [_Job("critical_difference_figure",
                        ranking.diagram(entry, len(summary["experiments"])),
                        where / f"critical-difference-{key}")
                   for key, entry in summary["metrics"].items() if len(entry["methods"]) >= 2]


def write_plots(
    results_dirs: str | Path | Sequence[str | Path],
    *,
    out: str | Path | None = None,
    allow_partial: bool = False,
    allow_mixed: bool = False,
    beta: float | None = None,
    formats: Sequence[str] = FORMATS,
    workers: int | None = None,
) -> list[Path]:
    """Draw every figure of one or more results directories into ``<out>/plots/``.

    Args:
        results_dirs: a results directory, or several combined (as for the leaderboard).
        out: where ``plots/`` goes; default the results directory (required for several).
        allow_partial, allow_mixed: as for :func:`selbench.reporting.leaderboard.write_leaderboard`.
        beta: coverage level of the per-example figures (default: see :func:`plot_beta`).
        formats: file formats, any matplotlib knows (default PNG and SVG).
        workers: how many processes draw the figures, this one included (worker
            processes are fresh interpreters, see :func:`_draw_all`). 1: all in this
            process. None: ``$SELBENCH_PLOT_WORKERS`` if set, else 0: automatic, one per
            usable CPU (at most one per four figures) when there are at least
            :data:`MIN_PARALLEL_FIGURES` figures, else 1. The files are the same bytes
            however many processes draw them.

    A figure is drawn only when its inputs changed (its data, the formats, or the drawing
    code: :mod:`selbench.reporting.figkeys`, keys in ``plots/.keys.json``) or one of its
    files is missing; the others are left as they are.

    Returns:
        The paths of every figure (drawn now or up to date), in the same order however many
        processes drew them. Methods
        without per-example arrays (e.g. cells of a foreign run) get no reliability diagram
        or histogram and no risk-coverage curve (an experiment where no method has them, no
        risk-coverage figure).
    """
    import matplotlib

    dirs = [Path(results_dirs)] if isinstance(results_dirs, (str, Path)) else [Path(d) for d in results_dirs]
    if out is None:
        if len(dirs) != 1:
            raise LeaderboardError("several results directories are combined: say where to "
                                   "write the plots with --out DIR")
        out = dirs[0]
    results = load_results(dirs, allow_partial=allow_partial, allow_mixed=allow_mixed)
    store = ResultsDir(out)  # its plots folders never lead out of it through a link
    jobs = [job for exp in results.experiments for job in _experiment_jobs(results, exp, store, beta)]
    jobs += _summary_jobs(results, store)
    with matplotlib.rc_context(RC_PARAMS):
        keys = FigureKeys(store.inside(store.root / "plots"))
        code = code_digest(figures)
        todo = []
        for job in jobs:
            key = value_digest(code, job.maker, job.args, list(formats))
            if not keys.up_to_date(job.stem, key, figure_paths(job.stem, formats)):
                todo.append((job, key))
        _draw_all([job for job, _ in todo], formats, _n_workers(workers, len(todo)))
    keys.save([(job.stem, key) for job, key in todo])
    return [path for job in jobs for path in figure_paths(job.stem, formats)]
