"""The figures, drawn with matplotlib on plain data (arrays, metric curves, titles): reliability
diagrams (binned and smoothed), metric-vs-coverage curves, risk-coverage curves, confidence
histograms, critical-difference diagrams (ranks across experiments) and cost against
quality, and how a figure is
saved so that redrawing it gives the same bytes. What each figure shows, and which data
:mod:`selbench.reporting.plots` hands it from a results folder, is described there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from selbench.measure.metrics import METRICS, bin_stats, plugin_ce
from selbench.measure.reliability import binned_reliability, clopper_pearson
from selbench.measure.riskcoverage import augrc, aurc, risk_coverage_curve
from selbench.measure.smooth import smooth_reliability
from selbench.util.files import atomic_path

__all__ = [
    "MAX_PER_PANEL",
    "RC_PARAMS",
    "ReliabilityBins",
    "confidence_figure",
    "cost_quality_figure",
    "critical_difference_figure",
    "curves_figure",
    "figure_paths",
    "method_panels",
    "reliability_bins",
    "reliability_diagram",
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


#: Okabe & Ito's colour-blind-safe palette (its yellow left out: too pale on white)
OKABE_ITO = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7")
#: with more methods than colours, each round of the palette takes the next line style
_LINESTYLES = ("-", "--", ":", "-.")


def _style(i: int, n: int) -> dict[str, Any]:
    """Method ``i`` of ``n``: a colour of :data:`OKABE_ITO`, a line style that changes each
    time the colours come round again (28 distinct lines), and a marker."""
    k = len(OKABE_ITO)
    return {"color": OKABE_ITO[i % k], "linestyle": _LINESTYLES[(i // k) % len(_LINESTYLES)],
            "marker": _MARKERS[i % len(_MARKERS)]}


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
        low, high = _cp_interval(b)
        ax.errorbar(b.confidence, b.accuracy, yerr=[b.accuracy - low, high - b.accuracy],
                    fmt="none", ecolor=color, elinewidth=0.8, alpha=0.6, zorder=2)
        ax.scatter(b.confidence, b.accuracy, s=700.0 * b.mass, color=color, alpha=0.75,
                   edgecolors="white", linewidths=0.5, zorder=3,
                   label=f"{name} (n={b.n}): {METRICS['ece1'].label} = {b.ece1:.3f}")
    ax.set_xlabel("mean confidence in bin")
    ax.set_ylabel("accuracy in bin")
    ax.set_title(title)
    _legend_below(ax)


def _cp_interval(b: ReliabilityBins, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Clopper–Pearson interval of each bin's accuracy (the hits are ``accuracy * count``)."""
    return clopper_pearson(np.round(b.accuracy * b.counts), b.counts, level)


def reliability_diagram(confidence: Any, correct: Any, accepted: Any = None, n_bins: int = N_BINS,
                        intervals: str | None = "clopper-pearson", ax: Any = None,
                        level: float = 0.95):
    """A reliability diagram on plain arrays, with an exact interval on each bin's accuracy.

    The bins are those of :func:`selbench.measure.metrics.ece` (``n_bins`` equal-mass bins,
    ties merged); each non-empty bin is a marker at (mean confidence, accuracy), its area
    proportional to the bin's share of the examples, with a vertical bar from the
    Clopper–Pearson interval of its accuracy at ``level``
    (:func:`selbench.measure.reliability.clopper_pearson`: the ``(1 - level)/2`` and
    ``(1 + level)/2`` quantiles of the beta distributions of the bin's hits), and the
    diagonal of perfect calibration. With ``accepted`` (a boolean mask ``[N]``) the accepted
    examples are binned and drawn as a second series over all examples.

    Args:
        confidence: top-label confidence ``[N]`` in [0, 1].
        correct: 0/1 correctness ``[N]``.
        accepted: optional boolean mask ``[N]`` of the examples a selector accepts.
        n_bins: equal-mass bins (the paper: 15).
        intervals: ``"clopper-pearson"`` or ``None`` (no bars).
        ax: a matplotlib Axes to draw into; default a new figure (no pyplot, so it draws
            headless).
        level: the intervals' confidence level in (0, 1).

    Returns:
        The matplotlib ``Axes`` drawn on (matplotlib's convention): ``ax`` when given, else
        the Axes of the new figure; save or show it through ``ax.figure``.
    """
    if intervals not in ("clopper-pearson", None):
        raise ValueError(f"intervals must be 'clopper-pearson' or None; got {intervals!r}")
    conf = np.asarray(confidence, dtype=np.float64)
    corr = np.asarray(correct, dtype=np.float64)
    series = [("all", ALL_COLOR, conf, corr)]
    if accepted is not None:
        mask = np.asarray(accepted)
        if mask.dtype != bool or mask.shape != conf.shape:
            raise ValueError(f"accepted must be a boolean mask of shape {conf.shape}; got "
                             f"{mask.dtype} {mask.shape}")
        series.append((f"accepted ({int(mask.sum())})", ACCEPTED_COLOR, conf[mask], corr[mask]))
    if ax is None:
        fig = _figure(4.6, 5.2, bottom=1.1, top=0.4)
        ax = fig.subplots()
    binned = [(name, color, binned_reliability(c, y, n_bins, level)) for name, color, c, y
              in series]
    vals = np.concatenate([np.r_[b.confidence, b.accuracy] for _, _, b in binned])
    _square(ax, _floor_tenth(float(vals.min())) if vals.size else 0.0, 1.0)
    for name, color, b in binned:
        if not b.counts.size:
            continue
        if intervals is not None:
            ax.errorbar(b.confidence, b.accuracy, yerr=[b.accuracy - b.low, b.high - b.accuracy],
                        fmt="none", ecolor=color, elinewidth=1.0, alpha=0.7, zorder=2)
        mass = b.counts / b.counts.sum()
        ax.scatter(b.confidence, b.accuracy, s=700.0 * mass, color=color, alpha=0.75,
                   edgecolors="white", linewidths=0.5, zorder=3, label=f"{name}, n={b.counts.sum()}")
    ax.set_xlabel("mean confidence in bin")
    ax.set_ylabel("accuracy in bin" + (f" ({level:.0%} Clopper–Pearson)" if intervals else ""))
    _legend_below(ax)
    return ax


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


#: the most methods one panel of a curve figure shows; with more, they are split over rows
MAX_PER_PANEL = 8


def method_panels(n: int, groups: Sequence[str] | None = None,
                  most: int = MAX_PER_PANEL) -> list[tuple[str | None, list[int]]]:
    """How the ``n`` methods of a curve figure are split over rows of panels: (the row's
    name, the indices of its methods). At most ``most`` methods: one row, unnamed (the
    figure drawn as with no split). More: one row per group (``groups[i]``: method ``i``'s
    group, e.g. its scheme; groups in the order they first appear; None: one group), a group
    of more than ``most`` split in order into the fewest near-equal parts of at most
    ``most``, named "group (k/parts)"."""
    if groups is not None and len(groups) != n:
        raise ValueError(f"groups must name the group of each of the {n} methods; "
                         f"got {len(groups)}")
    if n <= most:
        return [(None, list(range(n)))]
    members: dict[str, list[int]] = {}
    for i in range(n):
        members.setdefault("" if groups is None else str(groups[i]), []).append(i)
    rows: list[tuple[str | None, list[int]]] = []
    for name, idx in members.items():
        parts = -(-len(idx) // most)
        for k in range(parts):
            part = f"{k + 1}/{parts}"
            label = name if parts == 1 else (f"{name} ({part})" if name else f"methods {part}")
            rows.append((label, idx[k * len(idx) // parts:(k + 1) * len(idx) // parts]))
    return rows


def _panel_grid(width: float, n_rows: int, n_cols: int, legend_w: float):
    """The figure and its Axes ``[row, col]`` of a curve figure: one row as it has always
    been drawn; more rows (one per group of methods) each a little lower, the x axes shared
    (the y axes not: one group's wide band would flatten every other row's curves)."""
    if n_rows == 1:
        fig = _figure(width, 4.1, right=legend_w, wspace=0.3, top=0.85)
        return fig, np.asarray(fig.subplots(1, n_cols), dtype=object).reshape(1, n_cols)
    panel_h, gap = 2.6, 0.3  # inches
    fig = _figure(width, 1.45 + n_rows * panel_h + (n_rows - 1) * gap, right=legend_w,
                  wspace=0.3, top=0.95, hspace=gap / panel_h)
    return fig, fig.subplots(n_rows, n_cols, sharex=True, squeeze=False)


def _suptitle(fig, text: str, n_rows: int) -> None:
    """The figure's title at the top (a figure of several rows: 0.12 in below its top edge
    rather than 2 % of its height, which would reach into the panels' titles)."""
    where = {} if n_rows == 1 else {"y": 1 - 0.12 / fig.get_figheight()}
    fig.suptitle(text, fontsize=9.5, **where)


def _row_legends(fig, axes, rows: Sequence[tuple[str | None, list[int]]],
                 legend_w: float) -> None:
    """One legend right of each row of panels, titled with the row's name (a figure of one
    row: one legend right of the figure, as it has always been drawn)."""
    if len(rows) == 1:
        _legend_right(fig, axes[0], legend_w)
        return
    for row_axes, (name, _) in zip(axes, rows):
        handles, labels = row_axes[0].get_legend_handles_labels()
        last = row_axes[-1]
        x = 1.0 + 0.1 / (last.get_position().width * fig.get_figwidth())  # 0.1 in right of it
        last.legend(handles, labels, loc="center left", fontsize=8, frameon=False, title=name,
                    title_fontsize=8, alignment="left", bbox_to_anchor=(x, 0.5))


def curves_figure(series: Sequence[tuple[str, dict]], keys: Sequence[str], title: str,
                  groups: Sequence[str] | None = None):
    """Figure 2 style: metric vs β, one line per method, mean ± std over seeds.

    ``series``: (method, its :func:`~selbench.reporting.plots.metric_curves`) per method; ``keys``: one panel per
    metric, labelled from :data:`selbench.measure.metrics.METRICS`. More than
    :data:`MAX_PER_PANEL` methods are split over rows of panels by ``groups`` (each
    method's group: :func:`method_panels`), each row with its own legend; a method keeps its
    colour, line style and marker in every panel of its row."""
    longest = max((len(m) for m, _ in series), default=0)
    legend_w = 0.75 + 0.065 * longest  # inches for the legend right of the panels
    rows = method_panels(len(series), groups)
    fig, axes = _panel_grid(4.0 * len(keys) + legend_w, len(rows), len(keys), legend_w)
    for r, (_, members) in enumerate(rows):
        for ax, key in zip(axes[r], keys):
            label = METRICS[key].label
            for j, i in enumerate(members):
                method, curve = series[i]
                _band(ax, curve["betas"], curve[key], method, _style(j, len(members)))
            if r == len(rows) - 1:
                ax.set_xlabel("coverage β")
            ax.set_ylabel(label)
            if r == 0:
                ax.set_title(f"selective {label}")
            ax.grid(alpha=0.3)
    _row_legends(fig, axes, rows, legend_w)
    n_seeds = max((max(c[keys[0]]["n"], default=0) for _, c in series), default=0)
    band = "shaded: ± 1 std over seeds" if n_seeds > 1 else "one seed"
    _suptitle(fig, f"{title}\nmean over {n_seeds} seed(s), {band}", len(rows))
    return fig


def _risk_coverage_method(axes, name: str, scores: Any, correct: Any, selects: bool,
                          point: tuple[float, float] | None, style: dict) -> None:
    """One method's risk (``axes[0]``) and generalized risk (``axes[1]``) against coverage,
    its AURC and AUGRC in the legend, its guaranteed operating point as a star."""
    aurc_label, augrc_label = METRICS["aurc"].label, METRICS["augrc"].label
    _operating_point(axes, point, style["color"])
    scores = np.asarray(scores, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    label = (f"{name}: {aurc_label} = {aurc(scores, correct):.4f}, "
             f"{augrc_label} = {augrc(scores, correct):.4f}")
    for ax, generalized in ((axes[0], False), (axes[1], True)):
        cov, risk = risk_coverage_curve(scores, correct, generalized=generalized)
        if selects and len(cov) > 1:
            ax.plot(cov, risk, color=style["color"], linestyle=style["linestyle"],
                    linewidth=1.4, label=label, zorder=3)
        else:
            ax.plot(cov, risk, color=style["color"], marker=style["marker"], markersize=8,
                    fillstyle="none", markeredgewidth=1.5, linestyle="none", label=label,
                    zorder=4)  # hollow: methods at the same point stay visible


def risk_coverage_figure(series: Sequence[tuple], title: str, target_risk: float | None = None,
                         groups: Sequence[str] | None = None):
    """Risk and generalized risk against coverage, one curve per method.

    ``series``: (legend name, selector scores, correctness, whether the selector selects[,
    guaranteed operating point]) per method. Curves from
    :func:`selbench.measure.riskcoverage.risk_coverage_curve` (ties merged); a selector that
    does not select, or a curve of one point, is drawn as a marker. The operating point, a
    pair (coverage, selective risk) where a risk guarantee chose the threshold (``None``:
    none), is drawn as a star on both panels (generalized risk: coverage × risk), and
    ``target_risk`` (the guaranteed level r) as a dotted line on the selective-risk panel.
    More than :data:`MAX_PER_PANEL` methods are split over rows of panels by ``groups``, as
    in :func:`curves_figure`."""
    aurc_label, augrc_label = METRICS["aurc"].label, METRICS["augrc"].label
    names = [f"{name}: {aurc_label} = 0.0000, {augrc_label} = 0.0000" for name, *_ in series]
    legend_w = 0.75 + 0.062 * max((len(n) for n in names), default=0)
    rows = method_panels(len(series), groups)
    fig, axes = _panel_grid(8.4 + legend_w, len(rows), 2, legend_w)
    for r, (_, members) in enumerate(rows):
        for j, i in enumerate(members):
            name, scores, correct, selects, *point = series[i]
            _risk_coverage_method(axes[r], name, scores, correct, selects,
                                  point[0] if point else None, _style(j, len(members)))
        if target_risk is not None:
            axes[r, 0].axhline(target_risk, color="gray", linestyle=":", linewidth=1.2, zorder=1)
            axes[r, 0].annotate(f"guaranteed r = {target_risk:g} (stars: the chosen thresholds)",
                                (0.01, target_risk), fontsize=7, color="gray", va="bottom")
        for ax, what in ((axes[r, 0], "selective risk (error rate of the accepted)"),
                         (axes[r, 1], "generalized risk (errors among the accepted / N)")):
            ax.set_xlim(0.0, 1.02)
            ax.set_ylim(bottom=0.0)
            short = what.split(" (")[0]  # several rows: the rows are too low for the long label
            if r == len(rows) - 1:
                ax.set_xlabel("coverage")
            ax.set_ylabel(what if len(rows) == 1 else short)
            if r == 0:
                ax.set_title(short if len(rows) == 1 else what)
            ax.grid(alpha=0.3)
    _row_legends(fig, axes, rows, legend_w)
    _suptitle(fig, f"{title}\none point per distinct selector score (ties merged); "
              "a selector that does not select: one marker", len(rows))
    return fig


def _operating_point(axes, point: tuple[float, float] | None, color: Any) -> None:
    """A risk guarantee's chosen (coverage, selective risk) as a star on both panels."""
    if point is None or not all(np.isfinite(point)):
        return
    cov, risk = point
    for ax, y in ((axes[0], risk), (axes[1], risk * cov)):
        ax.plot([cov], [y], marker="*", markersize=13, color=color, markeredgecolor="black",
                markeredgewidth=0.6, linestyle="none", zorder=5)


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


def _cd_rows(ax, ranks: Sequence[tuple[str, float]], x_lo: float, x_hi: float,
             top: float) -> float:
    """The methods of a critical-difference diagram: the better half labelled on the left,
    the other half on the right, each joined to its average rank on the axis; the lowest y."""
    half = (len(ranks) + 1) // 2
    sides = [(ranks[:half], x_lo, "right"), (list(reversed(ranks[half:])), x_hi, "left")]
    bottom = top
    for side, x_end, align in sides:
        for i, (name, rank) in enumerate(side):
            y = top - 0.35 * i
            bottom = min(bottom, y)
            ax.plot([rank, rank, x_end], [0.0, y, y], color="0.25", linewidth=0.9)
            pad = -0.01 if align == "right" else 0.01
            ax.text(x_end + pad * (x_hi - x_lo), y, f"{name} ({rank:.2f})", ha=align,
                    va="center", fontsize=8.5, clip_on=False)
    return bottom


def critical_difference_figure(ranks: Sequence[tuple[str, float]],
                               groups: Sequence[tuple[float, float]], cd: float | None,
                               title: str):
    """A critical-difference diagram (Demšar 2006): the methods' average ranks on an axis
    (1 = best, on the left), a thick bar under each group of methods whose ranks do not
    differ significantly (``groups``: its lowest and highest average rank), and the critical
    difference drawn to scale above the axis (none where ``cd`` is None; it may reach past
    the last rank: then no two methods can differ).

    ``ranks``: (method, average rank) in rank order, as
    :func:`selbench.reporting.ranking.diagram` gives them."""
    k = len(ranks)
    hi = max(float(k), 2.0, 1.0 + (cd or 0.0))  # the critical difference may exceed the axis
    label_w = 0.3 + 0.062 * max((len(f"{n} (0.00)") for n, _ in ranks), default=0)
    top = -0.45 - 0.2 * len(groups)
    y_min = top - 0.35 * ((k + 1) // 2 - 1) - 0.3
    height = 0.75 * (1.3 - y_min) + 0.9
    fig = _figure(6.0 + 2 * label_w, height, left=label_w, right=label_w, top=0.75, bottom=0.1)
    ax = fig.subplots()
    x_lo, x_hi = 1.0 - 0.03 * (hi - 1.0) - 0.2, hi + 0.03 * (hi - 1.0) + 0.2
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_min, 1.3)
    ax.set_axis_off()
    ax.plot([1.0, max(k, 2)], [0.0, 0.0], color="black", linewidth=1.2)
    step = 1 if k <= 20 else 2 if k <= 40 else 5
    for t in range(1, max(k, 2) + 1, step):
        ax.plot([t, t], [0.0, 0.08], color="black", linewidth=1.0)
        ax.text(t, 0.14, str(t), ha="center", va="bottom", fontsize=8)
    if cd is not None:
        ax.plot([1.0, 1.0 + cd], [0.85, 0.85], color=DIAGONAL_COLOR, linewidth=1.6)
        for x in (1.0, 1.0 + cd):
            ax.plot([x, x], [0.78, 0.92], color=DIAGONAL_COLOR, linewidth=1.2)
        ax.text(1.0 + cd / 2, 0.97, f"CD = {cd:.2f}", ha="center", va="bottom", fontsize=8.5,
                color=DIAGONAL_COLOR)
    for g, (lo, high) in enumerate(groups):
        y = -0.3 - 0.2 * g
        ax.plot([lo - 0.05, high + 0.05], [y, y], color="black", linewidth=3.0,
                solid_capstyle="round", zorder=3)
    _cd_rows(ax, ranks, x_lo, x_hi, top)
    fig.suptitle(title, fontsize=9.5)
    return fig


#: the shortest time a cost figure draws on its log axis: cells record seconds to 1e-4
_MIN_SECONDS = 1e-4


def cost_quality_figure(points: Sequence[tuple[str, Sequence[tuple[float, float]],
                                               tuple[float, float]]],
                        x_label: str, y_label: str, title: str):
    """Cost against quality (as :func:`selbench.reporting.cost.figure_args` gives them): per
    method a colour of :data:`OKABE_ITO` and a marker, a small faint point per experiment and
    a large one at the mean; seconds on a log axis (below 1e-4 s drawn at 1e-4, the
    resolution the cells record)."""
    fig = _figure(7.2, 4.4, right=2.3)
    ax = fig.subplots()
    ax.set_xscale("log")
    for i, (name, per_exp, (mx, my)) in enumerate(points):
        st = _style(i, len(points))
        xs = [max(x, _MIN_SECONDS) for x, _ in per_exp]
        ax.scatter(xs, [y for _, y in per_exp], s=14, color=st["color"], marker=st["marker"],
                   alpha=0.35, linewidths=0)
        ax.scatter([max(mx, _MIN_SECONDS)], [my], s=60, color=st["color"], marker=st["marker"],
                   edgecolors="black", linewidths=0.6, label=name, zorder=3)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.grid(True, which="major", linestyle=":", color="0.8")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7.5, frameon=False)
    fig.suptitle(title, fontsize=9.5)
    return fig
