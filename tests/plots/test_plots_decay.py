"""Advantage sweeps (fvlib.theory.sweeps), fits on semilog / log-log panels and the advantage heatmap
(fvlib.plots.decay)."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fvlib.plots.decay import (  # noqa: E402
    plot_advantage_heatmap,
    plot_decay,
    plot_decay_panels,
)
from fvlib.theory import fit_decay  # noqa: E402
from fvlib.theory.sweeps import advantage_sweep  # noqa: E402


def teardown_function():
    plt.close("all")


def test_plot_decay_draws_points_and_fit():
    x = np.arange(1, 8)
    y = 0.5**x
    fit = fit_decay(x, y)
    fig, ax = plt.subplots()
    art = plot_decay(ax, x, y, fit=fit, law="exponential", label="a")
    assert len(ax.lines) == 2  # points and the dashed fit
    assert np.allclose(ax.lines[1].get_ydata(), y)  # an exact exponential is fitted exactly
    assert art.get_label() == "a"
    art2 = plot_decay(ax, x, y, yerr=0.01 * y, fit=fit, law="power", x_offset=1)
    assert type(art2).__name__ == "ErrorbarContainer"
    with pytest.raises(ValueError):
        plot_decay(ax, x, y, fit=fit, law="linear")


def test_plot_decay_panels_sets_the_scales():
    x = np.arange(1, 6)
    axes = plot_decay_panels([dict(x=x, y=0.5**x, label="e"), dict(x=x, y=(x + 1.0) ** -1, label="p")])
    assert axes[0].get_yscale() == "log" and axes[0].get_xscale() == "linear"
    assert axes[1].get_yscale() == "log" and axes[1].get_xscale() == "log"
    assert len(axes[0].lines) == 2 and len(axes[1].lines) == 2


def test_advantage_sweep_and_heatmap():
    grid = advantage_sweep([0.5, 0.7], [16, 256], depth=4, budget=3, samples=200, seed=1)
    assert grid.ratio.shape == (2, 2) and grid.log_se.shape == (2, 2)
    assert grid.samples == 200 and grid.baseline_name == "nonadaptive_coord"
    # noise-free limit for M = 3 = 2^2 - 1, K = 4: (alpha^2 + alpha^3) / alpha^3
    a = 0.5
    assert math.isclose(grid.noisefree_ratio[0], (a**2 + a**3) / a**3)
    assert (grid.ratio[:, 1] > grid.ratio[:, 0]).all()  # more tokens, larger advantage
    fig, ax = plt.subplots()
    im = plot_advantage_heatmap(grid, ax=ax)
    assert im.get_array().shape == (2, 3)  # two N columns plus the noise-free column
    assert len(ax.texts) == 6
    im2 = plot_advantage_heatmap(grid, noisefree_column=False, annotate=False)
    assert im2.get_array().shape == (2, 2)
    # the colour bar speaks the legend words of fvlib.plots.style, not the strategies' keys
    from fvlib.plots.style import STRATEGY_LABELS

    bar_label = fig.axes[-1].get_ylabel()
    assert STRATEGY_LABELS["nonadaptive_coord"] in bar_label and STRATEGY_LABELS["adaptive_greedy"] in bar_label
    assert "_" not in bar_label


# The direction optimisation is many tiny steps: threads only cost. The fixture is module-scoped
# (see conftest.py), so this test stays the last of the module.
@pytest.mark.usefixtures("one_thread")
def test_advantage_sweep_against_optimised_directions():
    grid = advantage_sweep([0.5], [64], depth=3, budget=2, samples=100, seed=0, baseline="nonadaptive_opt")
    assert grid.baseline_name == "nonadaptive_opt" and grid.ratio.shape == (1, 1)
    assert np.isnan(grid.noisefree_ratio).all()  # no closed form for optimised directions
    im = plot_advantage_heatmap(grid)
    assert im.get_array().shape == (1, 1)  # no noise-free column by default
