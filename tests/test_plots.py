"""Figures: files written and valid and redrawn byte for byte; reliability diagrams (binned and
smoothed), risk-coverage curves and metric curves that show exactly what the metric functions
and the cells say."""

from __future__ import annotations

import json
import warnings
import xml.etree.ElementTree as ET

import matplotlib.image
import numpy as np
import pytest
from conftest import tiny_spec
from matplotlib.collections import LineCollection, PolyCollection
from selbench.cli import main
from selbench.execution.runner import run, slug
from selbench.measure import metrics as M
from selbench.measure.metrics import METRICS
from selbench.measure.riskcoverage import augrc, aurc, risk_coverage_curve
from selbench.measure.smooth import smooth_reliability
from selbench.measure.stats import summarize
from selbench.reporting import figures as F
from selbench.reporting import plots as P
from selbench.reporting.figkeys import KEYS_FILE
from selbench.reporting.figures import reliability_bins, reliability_figure, risk_coverage_figure
from selbench.reporting.plots import accepted_mask, metric_curves, plot_beta, write_plots

LABELS = ("None", "Temp. scale", "Confidence")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A 2-seed run with its figures (drawn by `run`, as by default)."""
    root = tmp_path_factory.mktemp("plots")
    run(tiny_spec(seeds=[0, 1]), out_dir=root / "out", cache_dir=root / "cache", progress=False)
    return root / "out"


def _expected_files(out):
    where = out / "plots" / "mixture"
    stems = [where / "selective-ece", where / "selective-accuracy", where / "risk-coverage"]
    for label in LABELS:
        stems += [where / "reliability" / slug(label), where / "confidence" / slug(label)]
    return [stem.with_name(f"{stem.name}.{fmt}") for stem in stems for fmt in ("png", "svg")]


def test_run_draws_every_figure_as_valid_png_and_svg(results):
    files = _expected_files(results)
    assert sorted(p for p in (results / "plots").rglob("*")
                  if p.is_file() and p.name != KEYS_FILE) == sorted(files)
    for path in files:
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == PNG_SIGNATURE
            img = matplotlib.image.imread(path)
            assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 600
            assert img[..., :3].std() > 0.05  # something was drawn
        else:
            root = ET.parse(path).getroot()
            assert root.tag == "{http://www.w3.org/2000/svg}svg"
            assert len(list(root.iter())) > 100


@pytest.mark.parametrize("n", [1, 7, 15, 16, 200, 1000])
def test_reliability_bins_are_the_ece_bins(n):
    rng = np.random.default_rng(n)
    conf = np.round(rng.uniform(0.3, 1.0, n), 2)  # rounding makes ties across bin boundaries
    correct = (rng.uniform(size=n) < conf).astype(float)
    bins = reliability_bins(conf, correct)
    assert bins.ece1 == pytest.approx(M.ece(conf, correct), rel=1e-12, abs=1e-15)
    assert bins.n == n and len(bins.counts) <= min(15, n)
    # every example in exactly one bin; the bin means reproduce the totals
    assert np.dot(bins.counts, bins.confidence) == pytest.approx(conf.sum())
    assert np.dot(bins.counts, bins.accuracy) == pytest.approx(correct.sum())
    assert np.all(np.diff(bins.confidence) > 0)
    assert np.dot(bins.mass, np.abs(bins.confidence - bins.accuracy)) == pytest.approx(bins.ece1)


def _cell(results, label, seed=0):
    """A cell record of the fixture's run and its per-example arrays."""
    cell_path = results / "cells" / "mixture" / slug(label) / f"seed{seed}.json"
    cell = json.loads(cell_path.read_text())
    if not cell.get("arrays"):  # only the first seed stores them
        return cell, None
    with np.load(cell_path.with_suffix(".npz")) as data:
        arrays = {k: data[k] for k in ("confidence", "raw_confidence", "score", "correct")}
    return cell, arrays


def _legend_text(ax, start):
    return next(t.get_text() for t in ax.get_legend().get_texts() if t.get_text().startswith(start))


def test_reliability_diagram_agrees_with_the_cell_metrics(results):
    cell, arrays = _cell(results, "Confidence")
    beta = 0.5  # the training β of tiny_spec, the diagrams' default
    accept = accepted_mask(arrays["score"], beta)
    b_i = cell["betas"].index(beta)
    assert accept.mean() == pytest.approx(cell["metrics"]["coverage"][b_i])
    conf, correct = arrays["confidence"], arrays["correct"]
    ece_acc = M.ece(conf[accept], correct[accept])
    assert ece_acc == pytest.approx(cell["metrics"]["ece1"][b_i], abs=1e-6)  # float32 arrays
    fig = reliability_figure(arrays, accept, beta, "t", "temperature")
    before, after, smooth_before, smooth_after = fig.axes
    expected = {
        (before, "all"): (arrays["raw_confidence"], correct),
        (before, "accepted"): (arrays["raw_confidence"][accept], correct[accept]),
        (after, "all"): (conf, correct),
        (after, "accepted"): (conf[accept], correct[accept]),
    }
    for (ax, which), (c, y) in expected.items():
        ref = reliability_bins(c, y)
        label = _legend_text(ax, which)
        assert label.endswith(f"{METRICS['ece1'].label} = {M.ece(c, y):.3f}") and f"n={len(c)}" in label
        coll = next(col for col in ax.collections if col.get_label() == label)
        np.testing.assert_allclose(coll.get_offsets(), np.c_[ref.confidence, ref.accuracy])
        np.testing.assert_allclose(coll.get_sizes(), 700.0 * ref.mass)
    assert "after recalibration (temperature)" in after.get_title()
    assert "smoothed" in smooth_before.get_title() and "before" in smooth_before.get_title()
    assert "smoothed" in smooth_after.get_title() and "(temperature)" in smooth_after.get_title()


def test_smoothed_reliability_panels_draw_smooth_reliability(results):
    """The bottom row is the data of selbench.measure.smooth.smooth_reliability: the curve point for
    point, line widths and shaded density from its density, smECE and σ in the legend."""
    _, arrays = _cell(results, "Confidence")
    beta = 0.5
    accept = accepted_mask(arrays["score"], beta)
    correct = arrays["correct"].astype(np.float64)
    fig = reliability_figure(arrays, accept, beta, "t", "temperature")
    panels = {fig.axes[2]: arrays["raw_confidence"], fig.axes[3]: arrays["confidence"]}
    for ax, conf in panels.items():
        conf = conf.astype(np.float64)
        lo, hi = ax.get_xlim()
        pad = 0.015 * (hi - lo) / 1.03  # _square pads both limits by 1.5% of the range
        lo, hi = lo + pad, hi - pad
        assert hi == pytest.approx(1.0)
        for which, c, y in (("all", conf, correct),
                            (f"accepted, β = {beta:g}", conf[accept], correct[accept])):
            sm = smooth_reliability(c, y)
            label = _legend_text(ax, which + " (")
            assert label == (f"{which} (n={len(c)}): {METRICS['smece'].label} = {sm.smece:.3f}, "
                             f"σ = {sm.sigma:.3g}")
            line = next(col for col in ax.collections
                        if isinstance(col, LineCollection) and col.get_label() == f"_smoothed: {which}")
            segs = np.asarray(line.get_segments())
            np.testing.assert_allclose(segs[:, 0], np.c_[sm.x, sm.y][:-1], rtol=0, atol=1e-12)
            np.testing.assert_allclose(segs[:, 1], np.c_[sm.x, sm.y][1:], rtol=0, atol=1e-12)
            rel = sm.density / sm.density.max()
            np.testing.assert_allclose(line.get_linewidths(),
                                       F._LW[0] + F._LW[1] * (rel[:-1] + rel[1:]) / 2)
            band = next(col for col in ax.collections
                        if isinstance(col, PolyCollection) and col.get_label() == f"_density: {which}")
            verts = band.get_paths()[0].vertices
            top = np.c_[sm.x, lo + F._DENSITY_H * (hi - lo) * rel]
            dist = np.abs(top[:, None, :] - verts[None, :, :]).max(axis=2).min(axis=1)
            assert dist.max() < 1e-9  # the band's upper edge is the scaled density
            assert verts[:, 1].min() == pytest.approx(lo)
        # the panel's range holds every confidence and the curves over the confidences
        assert lo <= conf.min()


def test_risk_coverage_figure_draws_the_stored_arrays(results, tmp_path, monkeypatch):
    """write_plots hands each method's stored scores and correctness of its first seed, and
    whether it selects, to the risk-coverage figure, which plots risk_coverage_curve point for
    point (selective and generalized risk) with AURC and AUGRC in the legend."""
    seen = []
    draw = F.risk_coverage_figure
    monkeypatch.setattr(F, "risk_coverage_figure",
                        lambda series, title, *rest: seen.append(series) or draw(series, title, *rest))
    paths = write_plots(results, out=tmp_path, formats=("svg",), workers=1)
    assert tmp_path / "plots" / "mixture" / "risk-coverage.svg" in paths
    (series,) = seen
    assert [name.split(",")[0] for name, *_ in series] == list(LABELS)
    for label, (name, scores, correct, selects) in zip(LABELS, series):
        cell, arrays = _cell(results, label)
        assert name == f"{label}, seed 0"
        np.testing.assert_array_equal(scores, arrays["score"])
        np.testing.assert_array_equal(correct, arrays["correct"])
        assert selects is cell["selects"]
    assert [s[3] for s in series] == [False, False, True]  # None, Temp. scale: no selector

    fig = draw(series, "t")
    risk_ax, gen_ax = fig.axes
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    for i, (name, scores, correct, selects) in enumerate(series):
        label = (f"{name}: {METRICS['aurc'].label} = {aurc(scores, correct):.4f}, "
                 f"{METRICS['augrc'].label} = {augrc(scores, correct):.4f}")
        assert legend[i] == label
        # the areas are those the cell holds
        cell, _ = _cell(results, name.split(",")[0])
        assert cell["metrics"]["aurc"][0] == pytest.approx(aurc(scores, correct), abs=1e-12)
        assert cell["metrics"]["augrc"][0] == pytest.approx(augrc(scores, correct), abs=1e-12)
        for ax, generalized in ((risk_ax, False), (gen_ax, True)):
            (line,) = [ln for ln in ax.get_lines() if ln.get_label() == label]
            cov, risk = risk_coverage_curve(scores, correct, generalized=generalized)
            np.testing.assert_array_equal(line.get_xydata(), np.c_[cov, risk])
            if selects:
                assert len(cov) > 100 and line.get_linestyle() == "-"
            else:  # constant scores: one point at full coverage, a marker
                err = 1.0 - np.mean(correct)
                np.testing.assert_allclose(line.get_xydata(), [[1.0, err]])
                assert line.get_linestyle() == "None" and line.get_marker() not in (None, "None", "")


def test_risk_coverage_curve_merges_ties_in_the_figure():
    rng = np.random.default_rng(3)
    scores = np.round(rng.uniform(size=400), 1)  # 11 distinct scores
    correct = (rng.uniform(size=400) < 0.2 + 0.7 * scores).astype(float)
    const = np.full(400, 0.5)
    fig = risk_coverage_figure([("tied", scores, correct, True),
                                ("no selection", const, correct, False)], "t")
    for ax, generalized in zip(fig.axes, (False, True)):
        tied, single = ax.get_lines()
        assert len(tied.get_xydata()) == len(np.unique(scores))
        np.testing.assert_array_equal(tied.get_xydata(),
                                      np.c_[risk_coverage_curve(scores, correct, generalized=generalized)])
        np.testing.assert_allclose(single.get_xydata(), [[1.0, 1.0 - correct.mean()]])
        assert tied.get_xdata()[-1] == 1.0 and np.all(np.diff(tied.get_xdata()) > 0)
    # at full coverage both risks are the error rate of all examples
    assert fig.axes[0].get_lines()[0].get_ydata()[-1] == pytest.approx(1.0 - correct.mean())
    assert fig.axes[1].get_lines()[0].get_ydata()[-1] == pytest.approx(1.0 - correct.mean())


def test_metric_curves_are_the_cells_mean_and_std_over_seeds(results):
    res = P.load_results([results])
    exp = res.experiments[0]
    curve = metric_curves(res, "mixture", "Confidence", exp["betas"], ["ece1", "smece", "accuracy"])
    cells = [_cell(results, "Confidence", seed)[0] for seed in (0, 1)]
    for key in ("ece1", "smece", "accuracy"):
        for b_i, b in enumerate(exp["betas"]):
            vals = [c["metrics"][key][c["betas"].index(b)] for c in cells]
            assert curve[key]["mean"][b_i] == pytest.approx(np.mean(vals), abs=1e-15)
            assert curve[key]["std"][b_i] == pytest.approx(np.std(vals, ddof=1), abs=1e-15)
            assert curve[key]["n"][b_i] == 2
            # exactly what selbench.measure.stats.summarize gives (computed without its t-interval)
            st = summarize(dict(zip((0, 1), vals)))
            assert (curve[key]["mean"][b_i], curve[key]["std"][b_i]) == (st["mean"], st["std"])


@pytest.mark.parametrize("vals", [{}, {3: 0.25}, {0: 0.5, 2: float("nan")}, {1: 0.1, 0: 0.3, 5: 0.2}])
def test_mean_std_is_summarize(vals):
    mean, std, n = P._mean_std(vals)
    st = summarize(vals)
    np.testing.assert_equal((mean, std, n), (st["mean"], st["std"], st["n"]))


def _curves_figures(monkeypatch):
    calls = []
    draw = F.curves_figure
    monkeypatch.setattr(F, "curves_figure", lambda series, keys, title, *rest: calls.append(
        (list(keys), series, draw(series, keys, title, *rest))) or calls[-1][2])
    return calls


def test_selective_ece_figure_labels_from_the_registry_and_smece_when_shown(
        results, tmp_path, monkeypatch):
    calls = _curves_figures(monkeypatch)
    write_plots(results, out=tmp_path / "default", formats=("svg",), workers=1)
    assert [keys for keys, _, _ in calls] == [["ece1", "ece2"], ["accuracy"]]
    for keys, _, fig in calls:
        assert [ax.get_title() for ax in fig.axes] == [f"selective {METRICS[k].label}" for k in keys]
        assert [ax.get_ylabel() for ax in fig.axes] == [METRICS[k].label for k in keys]

    # a spec that shows smECE: a third panel, the cells' smECE over β
    root = tmp_path / "smece"
    run(tiny_spec(seeds=[0], metrics=["ece1", "smece", "accuracy"]), out_dir=root / "out",
        cache_dir=root / "cache", progress=False, plots=False)
    calls.clear()
    write_plots(root / "out", formats=("svg",), workers=1)
    keys, series, fig = calls[0]
    assert keys == ["ece1", "ece2", "smece"]
    assert fig.axes[2].get_title() == f"selective {METRICS['smece'].label}"
    cell = json.loads((root / "out" / "cells" / "mixture" / slug("Confidence") / "seed0.json").read_text())
    (line,) = [ln for ln in fig.axes[2].get_lines() if ln.get_label() == "Confidence"]
    np.testing.assert_allclose(line.get_xdata(), cell["betas"])
    np.testing.assert_allclose(line.get_ydata(), cell["metrics"]["smece"], rtol=0, atol=1e-15)
    assert (root / "out" / "plots" / "mixture" / "selective-ece.svg").is_file()


def test_svgs_are_reproducible_and_plot_command_options(results, tmp_path, capsys):
    svgs = sorted((results / "plots").rglob("*.svg"))
    assert len(svgs) == 9  # 3 per experiment, 2 per method (reliability, confidence)
    first = {p: p.read_bytes() for p in svgs}
    write_plots(results, formats=("svg",))
    for path in svgs:  # every figure, the smoothed reliability and risk-coverage ones too
        assert path.read_bytes() == first[path], path
    out = tmp_path / "elsewhere"
    assert main(["plot", str(results), "--out", str(out), "--format", "png", "--beta", "0.8"]) == 0
    assert "wrote 9 figure file(s)" in capsys.readouterr().err
    assert len(list((out / "plots").rglob("*.png"))) == 9 and not list(out.rglob("*.svg"))
    assert main(["plot", str(results), "--out", str(out), "--beta", "1.5"]) == 2
    assert "beta must lie in (0, 1]" in capsys.readouterr().err


def test_run_no_plots_flag(tmp_path, write_spec):
    path = write_spec(tiny_spec(seeds=[0], methods=[{"label": "T", "scheme": {"name": "recalibration"},
                                                     "recalibrator": {"name": "temperature"}}]))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--no-progress", "-q", "--no-plots"]) == 0
    assert (out / "leaderboard.md").is_file() and not (out / "plots").exists()


def test_plot_beta_choice():
    assert plot_beta({"train_beta": 0.5, "betas": [0.5, 1.0]}) == 0.5
    assert plot_beta({"train_beta": "per_beta", "betas": [0.7, 0.85, 0.9]}) == 0.85
    assert plot_beta({"train_beta": "per_beta", "betas": [0.75, 0.85]}) == 0.75  # tie: lower
    assert plot_beta({"train_beta": 0.5, "betas": [0.5]}, 0.9) == 0.9
    with pytest.raises(ValueError, match="beta must lie"):
        plot_beta({"train_beta": 0.5}, 0.0)


# --------------------------------------------------------------------------- parallel drawing
def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != KEYS_FILE}  # the figures, not their keys


def test_parallel_drawing_writes_the_same_bytes_as_serial(results, tmp_path, monkeypatch):
    """Worker processes draw every figure to the same bytes (PNG metadata and SVG ids
    included) as this process does, the paths come back in the same order, and no temporary
    file is left behind: with this process helping, and with the workers drawing all."""
    serial = write_plots(results, out=tmp_path / "serial", workers=1)
    expected = _files(tmp_path / "serial" / "plots")
    assert len(expected) == 18

    parallel = write_plots(results, out=tmp_path / "parallel", workers=3)
    assert [p.relative_to(tmp_path / "parallel") for p in parallel] == \
        [p.relative_to(tmp_path / "serial") for p in serial]
    assert _files(tmp_path / "parallel" / "plots") == expected

    drawn_here = []
    draw, draw_all = P._draw, P._draw_all
    monkeypatch.setattr(P, "_draw", lambda job, formats: drawn_here.append(job) or draw(job, formats))
    monkeypatch.setattr(P, "_draw_all", lambda jobs, formats, workers:
                        draw_all(jobs, formats, workers, helping=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no worker failed
        workers_only = write_plots(results, out=tmp_path / "workers", workers=2)
    assert drawn_here == []
    assert [p.relative_to(tmp_path / "workers") for p in workers_only] == \
        [p.relative_to(tmp_path / "serial") for p in serial]
    assert _files(tmp_path / "workers" / "plots") == expected


def test_a_figure_that_raises_in_a_worker_raises_here(tmp_path):
    jobs = [P._Job("curves_figure", ([], [f"no-such-metric-{i}"], "t"), tmp_path / f"bad{i}")
            for i in range(2)]
    with pytest.raises(KeyError, match="no-such-metric") as err:
        P._draw_all(jobs, ("svg",), 2, helping=False)
    assert isinstance(err.value.__cause__, P._WorkerTraceback)
    assert "Traceback" in str(err.value.__cause__) and "curves_figure" in str(err.value.__cause__)
    assert not list(tmp_path.iterdir())


def test_a_worker_exception_that_does_not_pickle_is_raised_by_its_text():
    class Local(Exception):  # a local class: its instances do not pickle
        pass

    try:
        raise Local("boom")
    except Local as exc:
        failure = P._failure(exc)
    with pytest.raises(RuntimeError, match="Local: boom") as err:
        P._reraise(failure)
    assert "raise Local" in str(err.value.__cause__)


def test_figures_of_a_worker_that_dies_are_drawn_here(results, tmp_path, monkeypatch):
    expected = _files(write_plots(results, out=tmp_path / "serial", formats=("svg",),
                                  workers=1)[0].parents[1])
    monkeypatch.setattr(P, "_WORKER_CODE", "import sys; sys.exit(3)")
    draw_all = P._draw_all
    monkeypatch.setattr(P, "_draw_all", lambda jobs, formats, workers:
                        draw_all(jobs, formats, workers, helping=False))
    with pytest.warns(RuntimeWarning, match=r"exited with status \[3\]"):
        paths = write_plots(results, out=tmp_path / "died", formats=("svg",), workers=2)
    assert _files(paths[0].parents[1]) == expected


def test_number_of_drawing_processes(monkeypatch):
    monkeypatch.delenv(P.WORKERS_ENV, raising=False)
    monkeypatch.setattr(P, "usable_cpus", lambda: 2)
    assert P._n_workers(None, 35) == 2  # automatic: one per CPU
    assert P._n_workers(None, P.MIN_PARALLEL_FIGURES - 1) == 1  # too few figures to pay
    assert P._n_workers(0, 35) == 2
    assert P._n_workers(1, 35) == 1
    assert P._n_workers(5, 3) == 3  # never more than figures
    assert P._n_workers(3, 0) == 1
    monkeypatch.setattr(P, "usable_cpus", lambda: 64)
    assert P._n_workers(None, 35) == 9  # at least four figures per process
    monkeypatch.setenv(P.WORKERS_ENV, "1")
    assert P._n_workers(None, 35) == 1
    assert P._n_workers(4, 35) == 4  # the argument wins
    monkeypatch.setenv(P.WORKERS_ENV, "3")
    assert P._n_workers(None, 5) == 3
    monkeypatch.setenv(P.WORKERS_ENV, "many")
    with pytest.raises(ValueError, match=P.WORKERS_ENV):
        P._n_workers(None, 35)
    with pytest.raises(ValueError, match="workers"):
        P._n_workers(-1, 35)


def _curves(scale, shift=0.0):
    betas = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    def curve(v):
        return {"mean": list(v), "std": [0.0] * 6, "n": [1] * 6}
    return [("m", {"betas": betas, "ece1": curve(shift + scale * np.linspace(1, 2, 6)),
                   "ece2": curve(shift + scale * np.linspace(2, 1, 6)),
                   "accuracy": curve(shift + scale * np.linspace(1, 3, 6))})]


@pytest.mark.parametrize(("scale", "shift"), [(1e-2, 0.0), (1e-7, 0.0), (1e-6, 0.9999)])
def test_pinned_titles_draw_the_same_figure(scale, shift, tmp_path, monkeypatch):
    """Titles pinned at y = 1 (sparing matplotlib a layout of every y tick label per draw)
    give the same files as matplotlib's automatic placement; an Axes whose y axis shows an
    offset text (1e-7, +9.999e-1 here) keeps the automatic placement, which may move it."""
    def save(stem):
        with matplotlib.rc_context(F.RC_PARAMS):
            fig = F.curves_figure(_curves(scale, shift), ["ece1", "ece2"], "a long title " * 6)
            return fig, [p.read_bytes() for p in F.save_figure(fig, stem, ("svg", "png"))]

    pinned_fig, pinned = save(tmp_path / "pinned")
    offset = [ax.yaxis.get_offset_text().get_text() for ax in pinned_fig.axes]
    assert all(offset) == (scale < 1e-5) and any(offset) == (scale < 1e-5)
    assert [ax._autotitlepos for ax in pinned_fig.axes] == [bool(t) for t in offset]
    monkeypatch.setattr(F, "_pin_titles", lambda fig: None)
    _, automatic = save(tmp_path / "automatic")
    assert pinned == automatic


def _many_curves(n):
    """``n`` synthetic methods' curves over β, each a distinct line."""
    betas = [0.5, 0.75, 1.0]
    def curve(v):
        return {"mean": list(v), "std": [0.01] * 3, "n": [2] * 3}
    return [(f"method {i}", {"betas": betas, "ece1": curve(0.01 * i + np.r_[0.0, 0.01, 0.02]),
                             "accuracy": curve(0.9 - 0.01 * i + np.r_[0.0, 0.01, 0.02])})
            for i in range(n)]


def _method_lines(ax):
    """The methods drawn in a panel: label -> (colour, line style, marker)."""
    return {ln.get_label(): (ln.get_color(), ln.get_linestyle(), ln.get_marker())
            for ln in ax.get_lines() if not ln.get_label().startswith("_")}


def test_method_panels_split_many_methods_by_group_in_parts_of_at_most_eight():
    assert F.method_panels(5, ["a", "b", "a", "c", "b"]) == [(None, [0, 1, 2, 3, 4])]
    assert F.method_panels(8) == [(None, list(range(8)))]
    groups = ["scheme: a"] * 11 + ["scheme: b"] * 2 + ["scheme: a"] * 5 + ["scheme: c"] * 2
    rows = F.method_panels(20, groups)
    # group a (16 methods) in two parts of 8, in order; then b and c whole
    assert rows == [("scheme: a (1/2)", list(range(8))),
                    ("scheme: a (2/2)", [8, 9, 10, 13, 14, 15, 16, 17]),
                    ("scheme: b", [11, 12]), ("scheme: c", [18, 19])]
    # no groups: the fewest near-equal parts of at most 8
    assert [len(m) for _, m in F.method_panels(20)] == [6, 7, 7]
    assert [name for name, _ in F.method_panels(17)] == ["methods 1/3", "methods 2/3",
                                                         "methods 3/3"]
    with pytest.raises(ValueError, match="groups"):
        F.method_panels(9, ["a"] * 8)


def test_curve_figures_with_many_methods_split_them_over_rows_of_panels():
    """20 methods: at least three rows of panels, none with more than eight lines, each method
    in exactly one row, in the same colour, line style and marker in every panel of its row,
    listed in that row's legend; 5 methods: one row and one legend, as always."""
    series = _many_curves(20)
    groups = ["scheme: recalibration"] * 12 + ["scheme: joint"] * 8
    keys = ["ece1", "accuracy"]
    fig = F.curves_figure(series, keys, "t", groups)
    axes = np.asarray(fig.axes).reshape(-1, len(keys))
    assert len(axes) >= 3 and not fig.legends
    seen = []
    for row in axes:
        styles = [_method_lines(ax) for ax in row]
        assert 0 < len(styles[0]) <= F.MAX_PER_PANEL and all(st == styles[0] for st in styles)
        assert len(set(styles[0].values())) == len(styles[0])  # distinct within the panel
        legend = row[-1].get_legend()
        assert [t.get_text() for t in legend.get_texts()] == list(styles[0])
        assert legend.get_title().get_text().startswith("scheme: ")
        seen += list(styles[0])
        for ax, key in zip(row, keys):  # the lines are the methods' curves
            for ln in ax.get_lines():
                i = int(ln.get_label().split()[-1])
                np.testing.assert_array_equal(ln.get_ydata(), series[i][1][key]["mean"])
    assert sorted(seen) == sorted(m for m, _ in series)
    assert [ax.get_title() for ax in axes[0]] == [f"selective {METRICS[k].label}" for k in keys]

    small = F.curves_figure(series[:5], keys, "t", groups[:5])
    assert len(small.axes) == len(keys) and len(small.legends) == 1
    assert all(len(_method_lines(ax)) == 5 for ax in small.axes)

    rc = [(f"m{i}", np.linspace(0, 1, 50) + 0.01 * i, (np.arange(50) % (i + 2) > 0).astype(float),
           True) for i in range(20)]
    fig = F.risk_coverage_figure(rc, "t", None, groups)
    axes = np.asarray(fig.axes).reshape(-1, 2)
    assert len(axes) >= 3
    assert all(0 < len(_method_lines(ax)) <= F.MAX_PER_PANEL for ax in fig.axes)
    assert sum(len(_method_lines(row[0])) for row in axes) == 20
