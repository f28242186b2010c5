"""Shared configs and depth sweeps (fvlib.experiments), finite-N twin loss and posterior
covariances (fvlib.theory), and the training figures (fvlib.plots.training)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from fvlib import GaussianPrior, TreePrior  # noqa: E402
from fvlib.experiments import DepthSweep, depth_sweep, depth_sweep_theory, shared_configs, train_all  # noqa: E402
from fvlib.plots.training import (  # noqa: E402
    plot_covariance_heatmaps,
    plot_depth_sweep,
    plot_grouped_bars,
    plot_training_curves,
)
from fvlib.theory import channel_tau2, gaussian_coordinate_loss, tree_posterior_cov, twin_finite_n_loss  # noqa: E402
from fvlib.train import TrainConfig, run_dir_for  # noqa: E402


def teardown_function():
    plt.close("all")


def test_shared_configs_are_the_books_configs():
    cfgs = shared_configs()
    assert set(cfgs) == {(m, p) for m in "ABC" for p in ("tree", "gaussian-twin")}
    expected = TrainConfig(model="A", prior="tree", depth=5, alpha=0.5, n_ctx=128, budget=5, steps=1500)
    assert cfgs[("A", "tree")] == expected
    assert run_dir_for(cfgs[("B", "gaussian-twin")]) == run_dir_for(
        TrainConfig(model="B", prior="gaussian-twin", depth=5, alpha=0.5, n_ctx=128, budget=5, steps=1500)
    )
    assert shared_configs(steps=10)[("C", "tree")].steps == 10


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


def test_plot_grouped_bars_returns_bars_per_label():
    values = {"tree": {"A": (0.02, 0.001), "B": (0.1, 0.002)}, "twin": {"A": (0.38, 0.01), "B": (0.38, 0.01)}}
    theory = {"tree": {"A": 0.015}, "twin": {"A": 0.38, "B": 0.38}}
    bars = plot_grouped_bars(values, theory)
    assert set(bars) == {"A", "B"} and len(bars["A"].patches) == 2
    assert np.isclose(bars["B"].patches[0].get_height(), 0.1)


def test_depth_sweep_trains_tiny_runs_and_plots(tmp_path, monkeypatch):
    monkeypatch.setenv("FVLIB_RUN_ROOT", str(tmp_path))
    sweep = depth_sweep([1, 2], models=("A", "B"), progress=False, depth=2, alpha=0.5, n_ctx=16, steps=4,
                        batch=8, queries=4, width=8, eval_every=2, eval_contexts=16)
    assert isinstance(sweep, DepthSweep) and sweep.loss["A"].shape == (2,) and sweep.stderr["B"].shape == (2,)
    assert len(list(tmp_path.iterdir())) == 4
    again = train_all({"a": sweep.configs["A"][0]}, progress=False)
    assert again["a"].history[-1]["eval_excess_loss"] == sweep.loss["A"][0]
    theory = depth_sweep_theory(TreePrior(2, 0.5), 16, 0.0, [1, 2], samples=50,
                                strategies=("adaptive_greedy", "nonadaptive_coord"))
    assert theory["adaptive_greedy"][0].shape == (2,)
    ax = plot_depth_sweep(sweep, theory)
    assert ax.get_yscale() == "log"
