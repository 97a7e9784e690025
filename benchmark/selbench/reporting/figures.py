"""The figures, drawn with matplotlib on plain data (arrays, metric curves, titles): reliability
diagrams (binned and smoothed), metric-vs-coverage curves, risk-coverage curves and confidence
histograms, and how a figure is saved so that redrawing it gives the same bytes. What each
figure shows, and which data :mod:`selbench.reporting.plots` hands it from a results folder,
is described there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from selbench.measure.metrics import METRICS, bin_stats, plugin_ce
from selbench.measure.riskcoverage import augrc, aurc, risk_coverage_curve
from selbench.measure.smooth import smooth_reliability
from selbench.util.files import atomic_path

__all__ = [
    "RC_PARAMS",
    "ReliabilityBins",
    "confidence_figure",
    "curves_figure",
    "figure_paths",
    "reliability_bins",
    "reliability_figure",
    "risk_coverage_figure",
    "save_figure",
]

N_BINS = 15
ALL_COLOR, ACCEPTED_COLOR, DIAGONAL_COLOR = "tab:blue", "tab:green", "tab:red"
#: matplotlib settings every figure is drawn under (SVGs with stable element ids)
RC_PARAMS = {"svg.hashsalt": "selbench", "svg.fonttype": "path", "font.size": 9.0}
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
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


def save_figure(fig, stem: Path, formats: Sequence[str]) -> list[Path]:
    """Save ``fig`` to ``stem`` plus each format's suffix (SVGs without a date),
    its titles pinned (:func:`_pin_titles`); the paths written."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    _pin_titles(fig)
    paths = figure_paths(stem, formats)
    for fmt, path in zip(formats, paths):
        metadata = {"Date": None} if fmt == "svg" else None
        with atomic_path(path, suffix=f".{fmt}") as tmp:
            fig.savefig(tmp, format=fmt, dpi=150, metadata=metadata)
    return paths


def figure_paths(stem: Path, formats: Sequence[str]) -> list[Path]:
    """The files of ``stem`` in ``formats``."""
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

    ``series``: (method, its :func:`~selbench.reporting.plots.metric_curves`) per method; ``keys``: one panel per
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
    β (``curve``: the method's :func:`~selbench.reporting.plots.metric_curves` with
    ``accuracy``)."""
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
