"""Shared configs and depth sweeps (fvlib.catalogue), finite-N twin loss and posterior
covariances (fvlib.theory), and the training figures (fvlib.plots.training)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from fvlib import GaussianPrior, TreePrior  # noqa: E402
from fvlib.analysis import depth_sweep_theory  # noqa: E402
from fvlib.catalogue import DepthSweep, depth_sweep, shared_configs, train_all  # noqa: E402
from fvlib.plots.training import (  # noqa: E402
    plot_covariance_heatmaps,
    plot_depth_sweep,
    plot_grouped_bars,
    plot_training_curves,
)
from fvlib.theory import channel_tau2, gaussian_coordinate_loss, tree_posterior_cov, twin_finite_n_loss  # noqa: E402
from fvlib.plots.style import STRATEGY_LABELS  # noqa: E402
from fvlib.training import ORIGINAL_RECIPE, TrainConfig, run_dir_for  # noqa: E402


def teardown_function():
    plt.close("all")


def test_shared_configs_are_the_books_configs():
    cfgs = shared_configs()
    assert set(cfgs) == {(m, p) for m in "ABC" for p in ("tree", "gaussian-twin")}
    # the book's original training recipe, not today's TrainConfig defaults
    expected = TrainConfig(model="A", prior="tree", depth=5, alpha=0.5, n_ctx=128, budget=5, steps=1500,
                           **ORIGINAL_RECIPE)
    assert cfgs[("A", "tree")] == expected
    assert run_dir_for(cfgs[("B", "gaussian-twin")]) == run_dir_for(
        TrainConfig(model="B", prior="gaussian-twin", depth=5, alpha=0.5, n_ctx=128, budget=5, steps=1500,
                    **ORIGINAL_RECIPE)
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
    # the optimised adaptive policy has its own style (black, dash-dotted) and label
    theory["adaptive_opt"] = (np.array([0.5, 0.2]), np.array([0.01, 0.01]))
    lines = {ln.get_label(): ln for ln in plot_depth_sweep(sweep, theory).get_lines()}
    line = lines[f"theory: {STRATEGY_LABELS['adaptive_opt']}"]
    assert line.get_linestyle() == "-." and line.get_color() == "#000000"
    np.testing.assert_allclose(line.get_ydata(), [0.5, 0.2])


# ----- several seeds (batched) -------------------------------------------------------------
TINY_SWEEP = dict(depth=2, alpha=0.5, n_ctx=16, steps=4, batch=8, queries=4, width=8, eval_every=2,
                  eval_contexts=16, device="cpu", router_warm_start=0)


def test_seed_configs_keep_the_data_and_the_own_seed_run():
    from fvlib.catalogue import seed_configs

    base = TrainConfig(budget=2, **TINY_SWEEP)
    cfgs = seed_configs(base, [0, 1, 2])
    assert cfgs[0] is base and run_dir_for(cfgs[0]) == run_dir_for(base)
    assert [c.seed for c in cfgs] == [0, 1, 2] and all(c.effective_data_seed == 0 for c in cfgs)
    assert cfgs[1].data_seed == 0 and len({run_dir_for(c) for c in cfgs}) == 3


@pytest.mark.parametrize("seeds, message", [([], "non-empty"), ([0, 0], "distinct"), ([-1], "seed"),
                                             ("01", "non-empty")])
def test_seed_configs_reject_bad_seeds(seeds, message):
    from fvlib.catalogue import seed_configs

    with pytest.raises(ValueError, match=message):
        seed_configs(TrainConfig(budget=2, **TINY_SWEEP), seeds)


def test_train_seeds_trains_the_own_seed_alone_and_the_others_batched(tmp_path, monkeypatch):
    from fvlib.catalogue import final_losses, train_seeds

    monkeypatch.setenv("FVLIB_RUN_ROOT", str(tmp_path))
    configs = {"a": TrainConfig(budget=2, **TINY_SWEEP), "b": TrainConfig(model="B", budget=2, **TINY_SWEEP)}
    out = train_seeds(configs, [0, 1, 2], progress=False)
    assert set(out) == {"a", "b"} and [r.config.seed for r in out["a"]] == [0, 1, 2]
    alone = train_all({"a": configs["a"]}, progress=False)["a"]  # reloaded: bitwise the same
    assert out["a"][0].history == alone.history
    loss, se = final_losses(out["b"])
    assert loss.shape == se.shape == (3,) and (se > 0).all() and len(set(loss)) == 3
    assert len(list(tmp_path.iterdir())) == 6
    again = train_seeds(configs, [0, 1, 2], progress=False)  # everything reloaded
    assert [r.history for r in again["b"]] == [r.history for r in out["b"]]


def test_train_seeds_alone_names_the_own_seed_runs_trained_alone(tmp_path, monkeypatch):
    """Keys left out of ``alone`` train their own seed in the batched call (with the other
    seeds, one stack): the run of that call, within float rounding of the run trained alone."""
    from fvlib.training.batched import train_many
    from fvlib.catalogue import seed_configs, train_seeds
    from fvlib.training import train

    monkeypatch.setenv("FVLIB_RUN_ROOT", str(tmp_path))
    configs = {"a": TrainConfig(budget=2, **TINY_SWEEP), "b": TrainConfig(model="B", budget=2, **TINY_SWEEP)}
    out = train_seeds(configs, [0, 1], progress=False, alone=["a"])
    assert out["a"][0].history == train_all({"a": configs["a"]}, progress=False)["a"].history
    solo_b = train(configs["b"], progress=False)
    batched_b = train_many(seed_configs(configs["b"], [0, 1]), progress=False)[0]
    losses = [[e["eval_excess_loss"] for e in r.history] for r in (out["b"][0], batched_b, solo_b)]
    assert losses[0] == losses[1]
    assert abs(out["b"][0].final_loss / solo_b.final_loss - 1) < 1e-4
    with pytest.raises(ValueError, match="'c'"):
        train_seeds(configs, [0, 1], progress=False, alone=["c"])


def test_depth_sweep_with_seeds_gives_the_spread_and_plots(tmp_path, monkeypatch):
    monkeypatch.setenv("FVLIB_RUN_ROOT", str(tmp_path))
    sweep = depth_sweep([1, 2], models=("A", "B"), progress=False, seeds=(0, 1, 2), **TINY_SWEEP)
    assert sweep.seeds == (0, 1, 2) and sweep.seed_loss["A"].shape == (3, 2)
    np.testing.assert_allclose(sweep.loss["A"], sweep.seed_loss["A"].mean(0))
    np.testing.assert_allclose(sweep.spread["B"], sweep.seed_loss["B"].std(0, ddof=1))
    np.testing.assert_allclose(sweep.stderr["A"], np.sqrt((sweep.seed_stderr["A"] ** 2).sum(0)) / 3)
    assert [c.seed for c in sweep.configs["A"]] == [0, 0, 1, 1, 2, 2]
    # the same network with one channel: A and B at budget 1 agree for every seed
    np.testing.assert_allclose(sweep.seed_loss["A"][:, 0], sweep.seed_loss["B"][:, 0], rtol=1e-6)
    from fvlib.theory import fit_decay

    fits = {"A": fit_decay([1, 2, 3], [1.0, 0.5, 0.25])}
    ax = plot_depth_sweep(sweep, fits=fits)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("mean of 3 seeds" in t for t in labels) and "fit to A: exponential" in labels


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
