"""Reliability with uncertainty and direction (selbench.measure.reliability) and its figures:
Clopper–Pearson endpoints against the binomial tail equations that define them and scipy's
beta quantiles, the signed calibration error against a binned sum, and the public
``selbench.plots.reliability_diagram`` drawn headless."""

from __future__ import annotations

import io

import matplotlib
import numpy as np
import pytest
import selbench.plots as public_plots
from scipy.stats import beta, binom
from selbench.measure.metrics import METRICS, ece
from selbench.measure.reliability import binned_reliability, clopper_pearson, signed_ce
from selbench.reporting.figures import reliability_bins, reliability_diagram, risk_coverage_figure

matplotlib.use("Agg")


def _data(seed=0, n=900):
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.3, 1.0, n)
    correct = (rng.random(n) < conf ** 1.5).astype(float)  # over-confident
    return conf, correct


@pytest.mark.parametrize("x,n", [(0, 10), (1, 10), (5, 10), (10, 10), (37, 60), (0, 1),
                                 (1, 1), (999, 1000)])
@pytest.mark.parametrize("level", [0.95, 0.8])
def test_clopper_pearson_endpoints(x, n, level):
    lo, hi = (float(v) for v in clopper_pearson(x, n, level))
    a = 1 - level
    # the defining tail equations: P(Bin(n, lo) >= x) = a/2, P(Bin(n, hi) <= x) = a/2
    if x > 0:
        assert binom.sf(x - 1, n, lo) == pytest.approx(a / 2, rel=1e-9)
        assert lo == pytest.approx(beta.ppf(a / 2, x, n - x + 1), abs=1e-15)
    else:
        assert lo == 0.0
    if x < n:
        assert binom.cdf(x, n, hi) == pytest.approx(a / 2, rel=1e-9)
        assert hi == pytest.approx(beta.ppf(1 - a / 2, x + 1, n - x), abs=1e-15)
    else:
        assert hi == 1.0
    assert lo <= x / n <= hi


def test_clopper_pearson_rejects_bad_input():
    with pytest.raises(ValueError, match="successes"):
        clopper_pearson(5, 4)
    with pytest.raises(ValueError, match="level"):
        clopper_pearson(1, 4, level=1.0)


def test_binned_reliability_uses_the_ece_bins():
    conf, correct = _data()
    conf = np.round(conf, 2)  # ties: merged bins
    got = binned_reliability(conf, correct, 15, 0.9)
    ref = reliability_bins(conf, correct, 15)
    np.testing.assert_array_equal(got.counts, ref.counts)
    np.testing.assert_allclose(got.accuracy, ref.accuracy, atol=1e-15)
    assert np.sum(got.counts / got.counts.sum() * np.abs(got.confidence - got.accuracy)) \
        == pytest.approx(ece(conf, correct), abs=1e-12)
    hits = np.round(got.accuracy * got.counts)
    np.testing.assert_allclose(got.low, [beta.ppf(0.05, h, c - h + 1) if h else 0.0
                                         for h, c in zip(hits, got.counts)], atol=1e-14)
    assert binned_reliability([], []).counts.size == 0


def test_signed_ce_is_the_binned_gap_with_its_sign():
    conf, correct = _data(1)
    b = reliability_bins(conf, correct, 15)
    binned = float(np.sum(b.mass * (b.confidence - b.accuracy)))
    assert signed_ce(conf, correct) == pytest.approx(binned, abs=1e-12)
    assert signed_ce(conf, correct) > 0.05  # over-confident data
    assert signed_ce(1 - conf, 1 - correct) == pytest.approx(-signed_ce(conf, correct), abs=1e-12)
    assert abs(signed_ce(conf, correct)) <= ece(conf, correct) + 1e-12
    assert np.isnan(signed_ce([], []))
    assert METRICS["signed_ce"].kind == "selective"


def test_reliability_diagram_draws_the_intervals_headless():
    from matplotlib.axes import Axes
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    conf, correct = _data(2)
    accepted = conf > 0.6
    ax = public_plots.reliability_diagram(conf, correct, accepted=accepted)
    assert isinstance(ax, Axes) and isinstance(ax.figure, Figure)  # matplotlib's convention
    fig = ax.figure
    assert fig.axes == [ax]
    bars = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert len(bars) == 2  # all and accepted
    want = binned_reliability(conf[accepted], correct[accepted])
    segs = bars[1].get_segments()
    np.testing.assert_allclose([s[0][1] for s in segs], want.low, atol=1e-12)
    np.testing.assert_allclose([s[1][1] for s in segs], want.high, atol=1e-12)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")  # renders without a display
    assert buf.getvalue()[:4] == b"\x89PNG"
    no_bars = reliability_diagram(conf, correct, intervals=None)
    assert not [c for c in no_bars.collections if isinstance(c, LineCollection)]
    fig2 = Figure()
    left, right = fig2.subplots(1, 2)
    assert reliability_diagram(conf, correct, ax=right) is right  # the Axes it drew on
    assert right.collections and not left.collections
    with pytest.raises(ValueError, match="intervals"):
        reliability_diagram(conf, correct, intervals="bootstrap")
    with pytest.raises(ValueError, match="accepted"):
        reliability_diagram(conf, correct, accepted=np.ones(3, dtype=bool))
    assert "reliability_diagram" in public_plots.__all__


def test_risk_coverage_figure_marks_the_guaranteed_operating_point():
    conf, correct = _data(3)
    series = [("a", conf, correct, True, (0.4, 0.1)), ("b", conf, correct, True, None),
              ("c", conf, correct, True)]
    fig = risk_coverage_figure(series, "title", target_risk=0.12)
    stars = [ln for ln in fig.axes[0].lines if ln.get_marker() == "*"]
    assert len(stars) == 1 and list(stars[0].get_xydata()[0]) == [0.4, 0.1]
    gen = [ln for ln in fig.axes[1].lines if ln.get_marker() == "*"]
    assert gen[0].get_xydata()[0][1] == pytest.approx(0.04)
    assert any(list(ln.get_ydata()) == [0.12, 0.12] for ln in fig.axes[0].lines)
