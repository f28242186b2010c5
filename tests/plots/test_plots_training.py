"""Finite-N twin loss and posterior covariances (fvlib.theory), and the training figures
(fvlib.plots.training)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from fvlib import GaussianPrior, TreePrior  # noqa: E402
from fvlib.plots.training import (  # noqa: E402
    plot_covariance_heatmaps,
    plot_grouped_bars,
    plot_training_curves,
)
from fvlib.theory import channel_tau2, gaussian_coordinate_loss, tree_posterior_cov, twin_finite_n_loss  # noqa: E402


def teardown_function():
    plt.close("all")


def test_twin_finite_n_loss_tends_to_closed_form_and_matches_reference():
    tree = TreePrior(6, 0.5)
    v = tree.node_variances
    tau2 = channel_tau2(tree, 128, 0.0)
    assert abs(twin_finite_n_loss(v, 6, 128, tau2) - 0.3743) < 1e-3
    big = 10**9
    assert abs(twin_finite_n_loss(v, 6, big, tau2) - gaussian_coordinate_loss(v, 6, tau2)) < 1e-8


def test_tree_posterior_cov_prior_is_second_moment():
    tree = TreePrior(3, 0.5)
    probs = torch.full((2, tree.num_leaves), 1.0 / tree.num_leaves, dtype=torch.float64)
    cov = tree_posterior_cov(tree, probs)
    assert cov.shape == (2, tree.dim, tree.dim)
    assert torch.allclose(cov[0], tree.second_moment().double(), atol=1e-12)
    point = torch.zeros(1, tree.num_leaves, dtype=torch.float64)
    point[0, 3] = 1.0
    assert torch.allclose(tree_posterior_cov(tree, point), torch.zeros(1, tree.dim, tree.dim, dtype=torch.float64))


def test_plot_covariance_heatmaps_returns_one_image_per_matrix():
    c = GaussianPrior.twin_of(TreePrior(3, 0.5)).second_moment()
    images = plot_covariance_heatmaps([c, c, -c], ["a", "b", "c"])
    assert len(images) == 3 and images[0].get_array().shape == (7, 7)


def _fake_history(scale):
    return [{"step": s, "eval_excess_loss": scale / (1 + s), "eval_stderr": 0.01 * scale / (1 + s)}
            for s in (0, 10, 20)]


def test_plot_training_curves_draws_lines_and_theory():
    ax = plot_training_curves({"A": _fake_history(1.0), "B": _fake_history(2.0)}, theory={"A": 0.1, "B": 0.2})
    assert len(ax.get_lines()) == 4 and ax.get_yscale() == "log"


def test_plot_grouped_bars_keeps_more_labels_than_colours_distinct():
    """Ten labels, more than the palette's eight: each bar still differs in colour or hatch."""
    values = {"": {f"row {j}": (1.0 + j, 0.1) for j in range(10)}}
    bars = plot_grouped_bars(values)
    looks = {(tuple(b.patches[0].get_facecolor()), b.patches[0].get_hatch()) for b in bars.values()}
    assert len(bars) == 10 and len(looks) == 10
    plt.close("all")


def test_plot_grouped_bars_returns_bars_per_label():
    values = {"tree": {"A": (0.02, 0.001), "B": (0.1, 0.002)}, "twin": {"A": (0.38, 0.01), "B": (0.38, 0.01)}}
    theory = {"tree": {"A": 0.015}, "twin": {"A": 0.38, "B": 0.38}}
    bars = plot_grouped_bars(values, theory)
    assert set(bars) == {"A", "B"} and len(bars["A"].patches) == 2
    assert np.isclose(bars["B"].patches[0].get_height(), 0.1)


# ----- several seeds (batched) -------------------------------------------------------------


def test_training_curves_and_bars_show_the_seeds():
    hist = [[{"step": 0, "eval_excess_loss": v, "eval_stderr": 0.01}, {"step": 5, "eval_excess_loss": v / 2,
             "eval_stderr": 0.01}] for v in (1.0, 1.2, 0.9)]
    ax = plot_training_curves({"A": hist})
    assert ax.get_legend().get_texts()[0].get_text() == "A (mean of 3 seeds)"
    with pytest.raises(ValueError, match="different steps"):
        plot_training_curves({"A": [hist[0], hist[1][:1]]})
    values = {"tree": {"A": (0.02, 0.001)}}
    bars = plot_grouped_bars(values, points={"tree": {"A": [0.018, 0.02, 0.022]}})
    ax = bars["A"].patches[0].axes
    assert any(t.get_text() == "single seeds" for t in ax.get_legend().get_texts())
