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
``risk-coverage.png``
    For every method with per-example arrays, from its selector's scores on the evaluation
    examples of the plotted seed (:func:`selbench.measure.riskcoverage.risk_coverage_curve`, ties in
    the scores merged: one point per distinct threshold): left, the selective risk (error rate
    of the accepted examples) against coverage; right, the generalized risk (errors among the
    accepted divided by all N examples, Traub et al. 2024). The legend gives each method's
    AURC and AUGRC (:func:`selbench.measure.riskcoverage.aurc`, :func:`~selbench.measure.riskcoverage.augrc`).
    A selector that does not select (its cell records ``selects: false``; its scores are
    constant) has a single point, at full coverage, drawn as a marker.
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
unchanged results gives identical files. With more than one usable CPU and enough figures,
worker processes draw some of them (``workers=`` of :func:`write_plots`, or
``$SELBENCH_PLOT_WORKERS``; 1 draws them all in the calling process): the files are the
same bytes either way.
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

from selbench.measure.metrics import METRICS, accept_mask, bin_stats, plugin_ce
from selbench.measure.riskcoverage import augrc, aurc, risk_coverage_curve
from selbench.measure.smooth import smooth_reliability
from selbench.reporting.leaderboard import LeaderboardError, ResultSet, columns_for, load_results
from selbench.store.results import CellRecord, ResultsDir, ResultsError, safe_name, slug
from selbench.util.files import atomic_path

__all__ = [
    "ReliabilityBins",
    "accepted_mask",
    "metric_curves",
    "plot_beta",
    "reliability_bins",
    "reliability_figure",
    "risk_coverage_figure",
    "write_plots",
]

N_BINS = 15
FORMATS = ("png", "svg")
ALL_COLOR, ACCEPTED_COLOR, DIAGONAL_COLOR = "tab:blue", "tab:green", "tab:red"
_RC = {"svg.hashsalt": "selbench", "svg.fonttype": "path", "font.size": 9.0}
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
#: metrics of the selective-ECE figure: always these, and smECE when the experiment shows it
_ECE_KEYS = ("ece1", "ece2")
_OPTIONAL_ECE_KEYS = ("smece",)
#: line width of a smoothed reliability curve: from ``_LW[0]`` where no confidences lie to
#: ``_LW[0] + _LW[1]`` at the density's peak; the shaded density rises to ``_DENSITY_H`` of
#: the panel's height
_LW = (0.6, 3.4)
_DENSITY_H = 0.2


@dataclass(frozen=True)
class ReliabilityBins:
    """The non-empty equal-mass bins of a reliability diagram.

    ``counts[b]`` examples with mean confidence ``confidence[b]`` and accuracy
    ``accuracy[b]``; ``mass = counts / counts.sum()`` (the ECE weights); ``ece1`` is
    ``sum_b mass_b |confidence_b - accuracy_b|``, equal to :func:`selbench.measure.metrics.ece`.
    """

    counts: np.ndarray
    confidence: np.ndarray
    accuracy: np.ndarray
    ece1: float

    @property
    def mass(self) -> np.ndarray:
        return self.counts / self.counts.sum()

    @property
    def n(self) -> int:
        return int(self.counts.sum())


def reliability_bins(confidence: Any, correct: Any, n_bins: int = N_BINS) -> ReliabilityBins:
    """Bins of :func:`selbench.measure.metrics.ece` (same edges, ties merged) for a reliability diagram."""
    conf = np.asarray(confidence, dtype=np.float64)
    corr = np.asarray(correct, dtype=np.float64)
    if conf.ndim != 1 or conf.shape != corr.shape:
        raise ValueError(
            f"confidence and correct must be 1-D arrays of equal length; got {conf.shape}, {corr.shape}"
        )
    if conf.size == 0:
        empty = np.zeros(0)
        return ReliabilityBins(empty.astype(np.int64), empty, empty, float("nan"))
    order = np.argsort(conf, kind="stable")
    counts, conf_mean, acc_mean = bin_stats(conf[order], corr[order], n_bins)
    ece1 = plugin_ce(counts, conf_mean, acc_mean, 1.0)
    keep = counts > 0
    return ReliabilityBins(counts[keep], conf_mean[keep], acc_mean[keep], ece1)


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


# --------------------------------------------------------------------------- drawing helpers
def _figure(width: float, height: float, **margins_in: float):
    """A figure with fixed margins in inches (a fixed layout draws about twice as fast as
    matplotlib's constrained layout, which re-measures every text)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    m = {"left": 0.8, "right": 0.15, "bottom": 0.5, "top": 0.6, "wspace": 0.25, "hspace": 0.2,
         **margins_in}
    fig.subplots_adjust(left=m["left"] / width, right=1 - m["right"] / width,
                        bottom=m["bottom"] / height, top=1 - m["top"] / height,
                        wspace=m["wspace"], hspace=m["hspace"])
    return fig


def _pin_titles(fig) -> None:
    """Fix each Axes title at its default height, y = 1, where matplotlib leaves it unless
    the y axis shows an offset text (such as "1e−6") that the title would overlap. This
    spares matplotlib laying out every y tick label once more in each draw to look for one
    (a few percent of the drawing time); an Axes whose y axis shows an offset text keeps the
    automatic placement (as does one with its x axis labelled on top or with child Axes;
    the figures here have no twin Axes). The figure comes out the same."""
    for ax in fig.axes:
        title = ax.get_title()
        if (not title or ax.child_axes or ax.xaxis.get_label_position() != "bottom"
                or ax.xaxis.get_ticks_position() not in ("bottom", "default")):
            continue
        formatter = ax.yaxis.get_major_formatter()
        formatter.set_locs(ax.yaxis.get_majorticklocs())  # as the draw sets them
        if not formatter.get_offset():
            ax.set_title(title, y=1.0)


def _save(fig, stem: Path, formats: Sequence[str]) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    _pin_titles(fig)
    paths = _paths(stem, formats)
    for fmt, path in zip(formats, paths):
        metadata = {"Date": None} if fmt == "svg" else None
        with atomic_path(path, suffix=f".{fmt}") as tmp:
            fig.savefig(tmp, format=fmt, dpi=150, metadata=metadata)
    return paths


def _paths(stem: Path, formats: Sequence[str]) -> list[Path]:
    return [stem.with_name(f"{stem.name}.{fmt}") for fmt in formats]


def _style(i: int, n: int) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return {"color": cmap(i % cmap.N), "marker": _MARKERS[i % len(_MARKERS)]}


def _floor_tenth(value: float) -> float:
    return float(np.floor(max(0.0, value - 0.02) * 10) / 10)


def _limits(*bins: ReliabilityBins) -> tuple[float, float]:
    vals = np.concatenate([np.concatenate([b.confidence, b.accuracy]) for b in bins if b.n])
    return (_floor_tenth(float(vals.min())) if vals.size else 0.0), 1.0


def _legend_below(ax) -> None:
    legend = ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=7.5, frameon=False)
    for handle in legend.legend_handles:  # same marker size in the legend, whatever the bins
        if hasattr(handle, "set_sizes"):
            handle.set_sizes([40.0])


def _square(ax, lo: float, hi: float) -> None:
    ax.plot([lo, hi], [lo, hi], linestyle="--", color=DIAGONAL_COLOR, linewidth=1.2,
            label="perfect calibration", zorder=1)
    pad = 0.015 * (hi - lo)  # markers and lines at confidence 1.0 stay whole
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_aspect("equal")
    ax.grid(alpha=0.3)


def _reliability_panel(ax, series: list[tuple[str, str, ReliabilityBins]], title: str) -> None:
    lo, hi = _limits(*(b for _, _, b in series))
    _square(ax, lo, hi)
    for name, color, b in series:
        if not b.n:
            continue
        ax.scatter(b.confidence, b.accuracy, s=700.0 * b.mass, color=color, alpha=0.75,
                   edgecolors="white", linewidths=0.5, zorder=3,
                   label=f"{name} (n={b.n}): {METRICS['ece1'].label} = {b.ece1:.3f}")
    ax.set_xlabel("mean confidence in bin")
    ax.set_ylabel("accuracy in bin")
    ax.set_title(title)
    _legend_below(ax)


def _smooth_limits(series: list[tuple[str, str, np.ndarray, Any]]) -> tuple[float, float]:
    """Lower limit of a smoothed panel: below every confidence and every point of the curves
    over the confidences' range."""
    lows = []
    for _, _, conf, sm in series:
        if conf.size:
            x, y = np.asarray(sm.x), np.asarray(sm.y)
            lows.append(float(conf.min()))
            inside = (x >= conf.min()) & np.isfinite(y)
            if inside.any():
                lows.append(float(y[inside].min()))
    return (_floor_tenth(min(lows)) if lows else 0.0), 1.0


def _smooth_panel(ax, series: list[tuple[str, str, np.ndarray, Any]], title: str) -> None:
    """Smoothed reliability curves (``series``: name, color, confidences, the result of
    :func:`selbench.measure.smooth.smooth_reliability`), as relplot's ``rel_diagram`` draws them: line
    width growing with the density of the confidences, the density shaded along the bottom."""
    from matplotlib.collections import LineCollection

    lo, hi = _smooth_limits(series)
    _square(ax, lo, hi)
    smece = METRICS["smece"].label
    for name, color, conf, sm in series:
        x, y = np.asarray(sm.x, dtype=float), np.asarray(sm.y, dtype=float)
        dens = np.asarray(sm.density, dtype=float)
        peak = float(dens.max()) if dens.size and np.isfinite(dens).all() else 0.0
        rel = dens / peak if peak > 0 else np.zeros_like(dens)
        ax.fill_between(x, lo, lo + _DENSITY_H * (hi - lo) * rel, color=color, alpha=0.15,
                        linewidth=0, zorder=2, label=f"_density: {name}")
        points = np.c_[x, y]
        segments = np.stack([points[:-1], points[1:]], axis=1)
        widths = _LW[0] + _LW[1] * (rel[:-1] + rel[1:]) / 2
        ax.add_collection(LineCollection(segments, colors=[color], linewidths=widths,
                                         capstyle="round", joinstyle="round", zorder=3,
                                         label=f"_smoothed: {name}"))
        ax.plot([], [], color=color, linewidth=_LW[0] + _LW[1] / 2,  # the legend's entry
                label=f"{name} (n={conf.size}): {smece} = {float(sm.smece):.3f}, "
                      f"σ = {float(sm.sigma):.3g}")
    ax.set_xlabel("confidence")
    ax.set_ylabel("smoothed accuracy")
    ax.set_title(title)
    _legend_below(ax)


def reliability_figure(arrays: dict[str, np.ndarray], accept: np.ndarray, beta: float,
                       title: str, recalibrator: str):
    """Figure 1: reliability before / after recalibration, all vs accepted examples; binned
    (top row, axes 0 and 1) and kernel-smoothed (bottom row, axes 2 and 3)."""
    fig = _figure(9.0, 11.0, wspace=0.3, hspace=0.5, bottom=1.3, top=1.05)
    axes = fig.subplots(2, 2)
    correct = np.asarray(arrays["correct"], dtype=np.float64)
    accepted = f"accepted, β = {beta:g}"
    for col, key, name in ((0, "raw_confidence", "before recalibration (max softmax)"),
                           (1, "confidence", f"after recalibration ({recalibrator})")):
        conf = np.asarray(arrays[key], dtype=np.float64)
        _reliability_panel(axes[0, col], [
            ("all", ALL_COLOR, reliability_bins(conf, correct)),
            (accepted, ACCEPTED_COLOR, reliability_bins(conf[accept], correct[accept])),
        ], f"binned: {name}")
        _smooth_panel(axes[1, col], [
            ("all", ALL_COLOR, conf, smooth_reliability(conf, correct)),
            (accepted, ACCEPTED_COLOR, conf[accept],
             smooth_reliability(conf[accept], correct[accept])),
        ], f"smoothed: {name}")
    fig.suptitle(f"{title}\ntop: {N_BINS} equal-mass bins, marker area ∝ bin mass\n"
                 "bottom: kernel-smoothed, line width and shading ∝ density of the confidences")
    return fig


def _band(ax, betas, curve: dict, label: str, style: dict) -> None:
    mean = np.asarray(curve["mean"], dtype=float)
    std = np.asarray(curve["std"], dtype=float)
    n = np.asarray(curve["n"])
    ax.plot(betas, mean, label=label, linewidth=1.5, markersize=4, **style)
    if (n > 1).any():
        ax.fill_between(betas, mean - std, mean + std, where=n > 1, color=style["color"],
                        alpha=0.15, linewidth=0)


def _legend_right(fig, axes, legend_w: float) -> None:
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", fontsize=8, frameon=False,
               bbox_to_anchor=(1 - (legend_w - 0.1) / fig.get_figwidth(), 0.5))


def curves_figure(series: Sequence[tuple[str, dict]], keys: Sequence[str], title: str):
    """Figure 2 style: metric vs β, one line per method, mean ± std over seeds.

    ``series``: (method, its :func:`metric_curves`) per method; ``keys``: one panel per
    metric, labelled from :data:`selbench.measure.metrics.METRICS`."""
    longest = max((len(m) for m, _ in series), default=0)
    legend_w = 0.75 + 0.065 * longest  # inches for the legend right of the panels
    fig = _figure(4.0 * len(keys) + legend_w, 4.1, right=legend_w, wspace=0.3, top=0.85)
    axes = np.atleast_1d(fig.subplots(1, len(keys)))
    for ax, key in zip(axes, keys):
        label = METRICS[key].label
        for i, (method, curve) in enumerate(series):
            _band(ax, curve["betas"], curve[key], method, _style(i, len(series)))
        ax.set_xlabel("coverage β")
        ax.set_ylabel(label)
        ax.set_title(f"selective {label}")
        ax.grid(alpha=0.3)
    _legend_right(fig, axes, legend_w)
    n_seeds = max((max(c[keys[0]]["n"], default=0) for _, c in series), default=0)
    band = "shaded: ± 1 std over seeds" if n_seeds > 1 else "one seed"
    fig.suptitle(f"{title}\nmean over {n_seeds} seed(s), {band}", fontsize=9.5)
    return fig


def risk_coverage_figure(series: Sequence[tuple[str, np.ndarray, np.ndarray, bool]], title: str):
    """Risk and generalized risk against coverage, one curve per method.

    ``series``: (legend name, selector scores, correctness, whether the selector selects) per
    method. Curves from :func:`selbench.measure.riskcoverage.risk_coverage_curve` (ties merged); a
    selector that does not select, or a curve of one point, is drawn as a marker."""
    aurc_label, augrc_label = METRICS["aurc"].label, METRICS["augrc"].label
    names = [f"{name}: {aurc_label} = 0.0000, {augrc_label} = 0.0000" for name, *_ in series]
    legend_w = 0.75 + 0.062 * max((len(n) for n in names), default=0)
    fig = _figure(8.4 + legend_w, 4.1, right=legend_w, wspace=0.3, top=0.85)
    axes = fig.subplots(1, 2)
    for i, (name, scores, correct, selects) in enumerate(series):
        style = _style(i, len(series))
        scores = np.asarray(scores, dtype=np.float64)
        correct = np.asarray(correct, dtype=np.float64)
        label = (f"{name}: {aurc_label} = {aurc(scores, correct):.4f}, "
                 f"{augrc_label} = {augrc(scores, correct):.4f}")
        for ax, generalized in ((axes[0], False), (axes[1], True)):
            cov, risk = risk_coverage_curve(scores, correct, generalized=generalized)
            if selects and len(cov) > 1:
                ax.plot(cov, risk, color=style["color"], linewidth=1.4, label=label, zorder=3)
            else:
                ax.plot(cov, risk, color=style["color"], marker=style["marker"], markersize=8,
                        fillstyle="none", markeredgewidth=1.5, linestyle="none", label=label,
                        zorder=4)  # hollow: methods at the same point stay visible
    for ax, what in ((axes[0], "selective risk (error rate of the accepted)"),
                     (axes[1], "generalized risk (errors among the accepted / N)")):
        ax.set_xlim(0.0, 1.02)
        ax.set_ylim(bottom=0.0)
        ax.set_xlabel("coverage")
        ax.set_ylabel(what)
        ax.set_title(what.split(" (")[0])
        ax.grid(alpha=0.3)
    _legend_right(fig, axes, legend_w)
    fig.suptitle(f"{title}\none point per distinct selector score (ties merged); "
                 "a selector that does not select: one marker", fontsize=9.5)
    return fig


def confidence_figure(arrays: dict[str, np.ndarray], accept: np.ndarray, beta: float,
                      curve: dict, title: str):
    """Figure 3: confidence histogram of all vs accepted examples, and selective accuracy over
    β (``curve``: the method's :func:`metric_curves` with ``accuracy``)."""
    fig = _figure(9.0, 3.9, wspace=0.25)
    ax_h, ax_a = fig.subplots(1, 2)
    conf, correct = arrays["confidence"].astype(np.float64), arrays["correct"].astype(np.float64)
    lo = float(np.floor(conf.min() * 10) / 10) if conf.size else 0.0
    edges = np.linspace(lo, 1.0, 21)
    ax_h.hist(conf, bins=edges, color=ALL_COLOR, alpha=0.45,
              label=f"all (n={conf.size}, acc. {correct.mean():.3f})")
    if accept.any():
        ax_h.hist(conf[accept], bins=edges, color=ACCEPTED_COLOR, alpha=0.7,
                  label=f"accepted, β = {beta:g} (n={int(accept.sum())}, acc. {correct[accept].mean():.3f})")
    ax_h.set_xlabel("recalibrated confidence")
    ax_h.set_ylabel("examples")
    ax_h.set_title("confidence of all vs accepted examples")
    ax_h.legend(loc="upper left", fontsize=7.5)
    ax_h.grid(alpha=0.3)
    _band(ax_a, curve["betas"], curve["accuracy"], "selective accuracy",
          {"color": ACCEPTED_COLOR, "marker": "o"})
    ax_a.axhline(correct.mean() if correct.size else math.nan, color=ALL_COLOR, linestyle="--",
                 linewidth=1, label="all examples (plotted seed)")
    ax_a.set_xlabel("coverage β")
    ax_a.set_ylabel("accuracy of accepted examples")
    ax_a.set_title("selective accuracy (mean ± std over seeds)")
    ax_a.legend(loc="best", fontsize=7.5)
    ax_a.grid(alpha=0.3)
    fig.suptitle(title)
    return fig


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
    """One figure to draw: the figure function of this module named ``maker``, called with
    ``args``, saved to ``stem`` (plus each format's suffix). Small enough to hand to a
    worker process: the per-example arrays of one method, metric curves, titles."""

    maker: str
    args: tuple
    stem: Path


#: rough drawing cost of each kind of figure, to hand the expensive ones out first
_COST = {"curves_figure": 3, "reliability_figure": 2, "risk_coverage_figure": 2,
         "confidence_figure": 1}


def _draw(job: _Job, formats: Sequence[str]) -> list[Path]:
    # looked up by name when called: the same function in a worker as in this process
    return _save(globals()[job.maker](*job.args), job.stem, formats)


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
    matplotlib.rcParams.update(rc)  # the caller's settings, _RC included: the same bytes
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
    import pickle
    import shutil
    import subprocess
    import sys
    import tempfile

    import matplotlib

    queue = sorted(enumerate(jobs), key=lambda ij: -_COST.get(ij[1].maker, 1))
    rc = {k: v for k, v in matplotlib.rcParams.items() if k != "backend"}
    folder = Path(tempfile.mkdtemp(prefix="selbench-plots-"))
    shared = _Queue(folder)
    payload = folder / "jobs.pickle"
    procs: list[subprocess.Popen] = []
    drawn: set[int] = set()  # positions drawn here
    try:
        with open(payload, "wb") as fh:
            pickle.dump(list(sys.path), fh)
            pickle.dump((rc, list(formats), queue), fh, protocol=pickle.HIGHEST_PROTOCOL)
        for _ in range(workers - 1):
            try:
                procs.append(subprocess.Popen([sys.executable, "-c", _WORKER_CODE, str(payload)],
                                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
            except OSError as exc:  # no processes to be had: this one draws the rest
                warnings.warn(f"drawing the figures in fewer processes: {exc}", RuntimeWarning,
                              stacklevel=3)
                break
        for pos in reversed(range(len(queue))) if helping else ():
            if shared.has("stop") or not shared.take(pos):
                break  # a worker failed, or the workers have taken the rest
            _draw(queue[pos][1], formats)
            drawn.add(pos)
        for proc in procs:
            proc.wait()
    except BaseException:
        with contextlib.suppress(OSError):  # the workers finish their figure, and stop
            shared.mark("stop")
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    try:
        errors = sorted(folder.glob("error-*"), key=lambda p: int(p.name.split("-")[1]))
        if errors:
            _reraise(errors[0].read_bytes())
        left = [pos for pos in range(len(queue))
                if pos not in drawn and not shared.has(f"done-{pos}")]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    failed = [proc.returncode for proc in procs if proc.returncode]
    if failed:
        warnings.warn(f"{len(failed)} worker process(es) drawing figures exited with status "
                      f"{failed}: drew their figures in this process", RuntimeWarning,
                      stacklevel=3)
    for pos in left:
        _draw(queue[pos][1], formats)
    return [path for job in jobs for path in _paths(job.stem, formats)]


class _WorkerTraceback(Exception):
    """The traceback of an exception raised in a worker process (its ``__cause__``)."""


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

    Returns:
        The paths written, in the same order however many processes drew them. Methods
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
    root = Path(out) / "plots"
    jobs: list[_Job] = []
    for exp in results.experiments:
        where = root / safe_name(exp["name"], "experiment name")
        name = (f"{exp['name']}: {exp['dataset']['name']} / {exp['backbone']['name']}, "
                f"evaluated on '{exp['eval_split']}'")
        ece_keys = _ece_keys(exp)
        curves = [(m["label"], metric_curves(results, exp["name"], m["label"], exp["betas"],
                                             [*ece_keys, "accuracy"]))
                  for m in exp["methods"]]
        jobs.append(_Job("curves_figure", (curves, ece_keys, name), where / "selective-ece"))
        jobs.append(_Job("curves_figure", (curves, ["accuracy"], name),
                         where / "selective-accuracy"))
        b = plot_beta(exp, beta)
        guarantee = exp.get("coverage_guarantee")
        delta = guarantee["delta"] if guarantee else None
        ranked = []
        for method, (label, curve) in zip(exp["methods"], curves):
            found = _arrays_for(results, exp["name"], label, b, exp["train_beta"] == "per_beta")
            if found is None:
                continue
            arrays, seed, b_used, selects = found
            ranked.append((label + ("" if b_used == b else f" (trained at β = {b_used:g})")
                           + f", seed {seed}", arrays["score"], arrays["correct"], selects))
            if selects:
                accept = accepted_mask(arrays["score"], b_used, delta, seed=seed)
            else:  # a selector that does not select accepts every example
                accept = np.ones(len(arrays["score"]), dtype=bool)
            title = f"{exp['name']}: {label} (seed {seed})"
            arrays = {k: arrays[k] for k in ("confidence", "raw_confidence", "correct")}
            jobs.append(_Job("reliability_figure",
                             (arrays, accept, b_used, title, method["recalibrator"]["name"]),
                             where / "reliability" / slug(label)))
            jobs.append(_Job("confidence_figure", (arrays, accept, b_used, curve, title),
                             where / "confidence" / slug(label)))
        if ranked:
            jobs.append(_Job("risk_coverage_figure", (ranked, f"{name}, risk against coverage"),
                             where / "risk-coverage"))
    n = _n_workers(workers, len(jobs))
    with matplotlib.rc_context(_RC):
        return _draw_all(jobs, formats, n)
