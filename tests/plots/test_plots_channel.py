"""fvlib.plots.channel: the figures of chapters 1 and 3 run and return what they drew (and
fvlib.stats.relative_gap, the gap they draw)."""

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.container import BarContainer, ErrorbarContainer  # noqa: E402
from matplotlib.image import AxesImage  # noqa: E402

from fvlib import TreePrior  # noqa: E402
from fvlib.plots.channel import (  # noqa: E402
    plot_channel_sweep,
    plot_covariances,
    plot_leaf_posteriors,
    plot_level_error_rates,
    plot_relative_gap,
)
from fvlib.stats import relative_gap  # noqa: E402
from fvlib.theory import Estimate, evaluate_strategies  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def sweep():
    tree = TreePrior(3, 0.5)
    names = ("adaptive_greedy", "lmmse")
    return {
        ch: {n: evaluate_strategies(tree, n, 0.0, 3, samples=200, seed=n, channel=ch, strategies=names)
             for n in (8, 32)}
        for ch in ("finite", "gaussian")
    }


def test_relative_gap_value_and_stderr():
    gap, se = relative_gap(Estimate(1.1, 0.01, 100), Estimate(1.0, 0.02, 100))
    assert gap == pytest.approx(0.1)
    assert se == pytest.approx(1.1 * math.hypot(0.01 / 1.1, 0.02 / 1.0))
    with pytest.raises(ValueError):
        relative_gap(Estimate(1.0, 0.1, 10), Estimate(0.0, 0.1, 10))


def test_leaf_posteriors_one_panel_per_row_and_true_leaf_coloured():
    probs = torch.softmax(torch.randn(5, 16, generator=torch.Generator().manual_seed(0)), -1)
    fig, axes = plt.subplots(1, 5)
    bars = plot_leaf_posteriors(probs, true_leaf=3, axes=axes)
    assert len(bars) == 5 and all(isinstance(b, BarContainer) for b in bars)
    heights = np.array([[r.get_height() for r in b] for b in bars])
    assert np.allclose(heights, probs.numpy())
    colours = [r.get_facecolor() for r in bars[0]]
    assert colours[3] != colours[0] and colours[0] == colours[1]
    with pytest.raises(ValueError):
        plot_leaf_posteriors(probs, axes=axes[:2])
    # default axes and sign-path labels
    labels = [f"{j:04b}" for j in range(16)]
    assert len(plot_leaf_posteriors(probs[:2], leaf_labels=labels)) == 2


def test_covariances_share_one_colour_scale():
    a = torch.eye(3)
    b = 2 * torch.eye(3) - 0.5
    images = plot_covariances({"a": a, "b": b})
    assert len(images) == 2 and all(isinstance(im, AxesImage) for im in images)
    assert images[0].get_clim() == images[1].get_clim() == (-1.5, 1.5)
    with pytest.raises(ValueError):
        plot_covariances({"bad": torch.ones(2, 3)})


def test_channel_sweep_and_gap(sweep):
    drawn = plot_channel_sweep(sweep)
    assert set(drawn) == {"adaptive_greedy", "lmmse"}
    for per_channel in drawn.values():
        assert set(per_channel) == {"finite", "gaussian"}
        assert all(isinstance(c, ErrorbarContainer) for c in per_channel.values())
    line = drawn["lmmse"]["finite"].lines[0]
    assert np.allclose(line.get_ydata(), [sweep["finite"][n]["lmmse"].mean for n in (8, 32)])
    gaps = plot_relative_gap(sweep, strategies=["lmmse"], predicted={"lmmse": [0.1, 0.02]})
    assert set(gaps) == {"lmmse"}
    expected = [relative_gap(sweep["finite"][n]["lmmse"], sweep["gaussian"][n]["lmmse"])[0] for n in (8, 32)]
    assert np.allclose(gaps["lmmse"].lines[0].get_ydata(), expected)
    with pytest.raises(ValueError):
        plot_channel_sweep({"finite": sweep["finite"]})


def test_relative_gap_keeps_points_outside_ylim_in_the_frame(sweep):
    """A gap beyond ``ylim`` is drawn at the edge with a triangle and its value, so no line
    leaves the frame (chapter 3's greedy gap at large N)."""
    import matplotlib.pyplot as plt

    expected = [relative_gap(sweep["finite"][n]["lmmse"], sweep["gaussian"][n]["lmmse"])[0] for n in (8, 32)]
    half = 0.5 * min(abs(g) for g in expected if g != 0)
    fig, ax = plt.subplots()
    gaps = plot_relative_gap(sweep, ax=ax, strategies=["lmmse"], ylim=(-half, half))
    y = gaps["lmmse"].lines[0].get_ydata()
    assert np.all(np.abs(y) <= half + 1e-12) and ax.get_ylim() == pytest.approx((-half, half))
    labels = [t.get_text() for t in ax.texts]
    assert len(labels) == sum(abs(g) > half for g in expected)
    assert labels[0] == f"{expected[0]:+.0%}" if labels else True
    with pytest.raises(ValueError, match="ylim"):
        plot_relative_gap(sweep, ax=ax, ylim=(0.3, -0.3))
    plt.close(fig)


def test_level_error_rates():
    f, g = plot_level_error_rates([0.01, 0.1, 0.3], [0.02, 0.1, 0.3], finite_stderr=[0.001, 0.01, 0.01])
    assert isinstance(f, BarContainer) and isinstance(g, BarContainer)
    assert [r.get_height() for r in g] == pytest.approx([0.02, 0.1, 0.3])
    with pytest.raises(ValueError):
        plot_level_error_rates([0.1, 0.2], [0.1])
