"""Figures: files written and valid, and reliability diagrams that agree with the ECE metric."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import matplotlib.image
import numpy as np
import pytest
from conftest import tiny_spec
from selbench import metrics as M
from selbench.cli import main
from selbench.plots import (
    accepted_mask,
    plot_beta,
    reliability_bins,
    reliability_figure,
    write_plots,
)
from selbench.runner import run, slug

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
    stems = [where / "selective-ece", where / "selective-accuracy"]
    for label in LABELS:
        stems += [where / "reliability" / slug(label), where / "confidence" / slug(label)]
    return [stem.with_name(f"{stem.name}.{fmt}") for stem in stems for fmt in ("png", "svg")]


def test_run_draws_every_figure_as_valid_png_and_svg(results):
    files = _expected_files(results)
    assert sorted(p for p in (results / "plots").rglob("*") if p.is_file()) == sorted(files)
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


def test_reliability_diagram_agrees_with_the_cell_metrics(results):
    cell_path = results / "cells" / "mixture" / slug("Confidence") / "seed0.json"
    cell = json.loads(cell_path.read_text())
    with np.load(cell_path.with_suffix(".npz")) as data:
        arrays = {k: data[k] for k in ("confidence", "raw_confidence", "score", "correct")}
    beta = 0.5  # the training β of tiny_spec, the diagrams' default
    accept = accepted_mask(arrays["score"], beta)
    b_i = cell["betas"].index(beta)
    assert accept.mean() == pytest.approx(cell["metrics"]["coverage"][b_i])
    conf, correct = arrays["confidence"], arrays["correct"]
    ece_acc = M.ece(conf[accept], correct[accept])
    assert ece_acc == pytest.approx(cell["metrics"]["ece1"][b_i], abs=1e-6)  # float32 arrays
    fig = reliability_figure(arrays, accept, beta, "t", "temperature")
    before, after = fig.axes
    expected = {
        (before, "all"): (arrays["raw_confidence"], correct),
        (before, "accepted"): (arrays["raw_confidence"][accept], correct[accept]),
        (after, "all"): (conf, correct),
        (after, "accepted"): (conf[accept], correct[accept]),
    }
    for (ax, which), (c, y) in expected.items():
        ref = reliability_bins(c, y)
        label = next(t.get_text() for t in ax.get_legend().get_texts() if t.get_text().startswith(which))
        assert label.endswith(f"ECE₁ = {M.ece(c, y):.3f}") and f"n={len(c)}" in label
        coll = next(col for col in ax.collections if col.get_label() == label)
        np.testing.assert_allclose(coll.get_offsets(), np.c_[ref.confidence, ref.accuracy])
        np.testing.assert_allclose(coll.get_sizes(), 700.0 * ref.mass)
    assert "after recalibration (temperature)" in after.get_title()


def test_svgs_are_reproducible_and_plot_command_options(results, tmp_path, capsys):
    svg = results / "plots" / "mixture" / "selective-ece.svg"
    first = svg.read_bytes()
    write_plots(results, formats=("svg",))
    assert svg.read_bytes() == first
    out = tmp_path / "elsewhere"
    assert main(["plot", str(results), "--out", str(out), "--format", "png", "--beta", "0.8"]) == 0
    assert "wrote 8 figure file(s)" in capsys.readouterr().err
    assert len(list((out / "plots").rglob("*.png"))) == 8 and not list(out.rglob("*.svg"))
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
