"""The best fixed set of coordinates: exact noise-free losses, the search, and its Monte Carlo use."""

import itertools
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from fvlib import TreePrior  # noqa: E402
from fvlib.plots.decay import plot_advantage_heatmap  # noqa: E402
from fvlib.theory import (  # noqa: E402
    DP_MAX_DEPTH,
    best_fixed_method,
    best_fixed_nodes,
    evaluate_strategies,
    fit_decay,
    fixed_set_lower_bound,
    noisefree_nodes_loss,
    noisefree_nonadaptive_loss,
    strategy_names,
    theory_baselines,
)
from fvlib.theory.sweeps import advantage_sweep, best_coord_curves  # noqa: E402


def teardown_function():
    plt.close("all")


def brute_force(tree, nodes):
    """Noise-free Bayes loss by enumeration: group the leaves by what they read at ``nodes``."""
    leaves = tree.leaf_thetas
    reads = leaves[:, list(nodes)]
    _, group = torch.unique(reads, dim=0, return_inverse=True)
    loss = 0.0
    for g in group.unique():
        members = leaves[group == g]
        loss += float(((members - members.mean(0)) ** 2).sum())
    return loss / tree.num_leaves


def lower_bound(tree, budget):
    return sum(tree.alpha**k * max(0.0, 1 - budget / 2**k) for k in range(tree.depth))


def brute_force_best(tree, budget):
    """The smallest noise-free loss over every set of ``budget`` nodes (scored by the
    subtree recursion, itself checked against enumeration above)."""
    return min(noisefree_nodes_loss(tree, s) for s in itertools.combinations(range(tree.dim), budget))


@pytest.mark.parametrize("depth,alpha", [(1, 0.5), (3, 0.5), (4, 0.7), (5, 0.3), (6, 0.5)])
def test_nodes_loss_equals_brute_force_enumeration(depth, alpha):
    tree = TreePrior(depth, alpha)
    gen = torch.Generator().manual_seed(depth)
    for _ in range(12):
        m = int(torch.randint(0, tree.dim + 1, (1,), generator=gen))
        nodes = torch.randperm(tree.dim, generator=gen)[:m]
        expected = brute_force(tree, nodes) if m else tree.energy
        assert abs(noisefree_nodes_loss(tree, nodes) - expected) < 1e-12


def test_heap_order_matches_its_closed_form():
    for depth, alpha in [(3, 0.5), (5, 0.6), (6, 0.3)]:
        tree = TreePrior(depth, alpha)
        for m in range(1, tree.dim + 1):
            assert abs(noisefree_nodes_loss(tree, range(m)) - noisefree_nonadaptive_loss(tree, m)) < 1e-12


def test_issue_brute_force_numbers_at_alpha_one_half():
    t3 = TreePrior(3, 0.5)
    assert noisefree_nodes_loss(t3, [0, 1, 2, 3]) == pytest.approx(0.1875)
    assert noisefree_nodes_loss(t3, [3, 4, 5, 6]) == pytest.approx(0.0, abs=1e-12)
    assert noisefree_nodes_loss(t3, best_fixed_nodes(t3, 4)) == pytest.approx(0.0, abs=1e-12)
    t4 = TreePrior(4, 0.5)
    heap = [0.875, 0.625, 0.375, 0.3125, 0.25, 0.1875, 0.125, 0.109375]
    best = [0.625, 0.3125, 0.1875, 0.109375, 0.078125, 0.046875, 0.015625, 0.0]
    for m in range(1, 9):
        assert noisefree_nonadaptive_loss(t4, m) == pytest.approx(heap[m - 1], abs=1e-12)
        nodes = best_fixed_nodes(t4, m)  # exact search: comb(15, m) <= 6435
        assert noisefree_nodes_loss(t4, nodes) == pytest.approx(best[m - 1], abs=1e-12)
        assert noisefree_nodes_loss(t4, nodes) == pytest.approx(brute_force(t4, nodes), abs=1e-12)
    # K = 6: the dynamic program is exact at every budget (comb(63, 6) sets are too many to try)
    t6 = TreePrior(6, 0.5)
    assert noisefree_nonadaptive_loss(t6, 6) == pytest.approx(0.28125)
    exact = [0.71875, 0.40625, 0.28125, 0.203125, 0.171875, 0.140625]
    for m, loss in enumerate(exact, start=1):
        nodes = best_fixed_nodes(t6, m)
        assert noisefree_nodes_loss(t6, nodes) == pytest.approx(loss, abs=1e-12)
        assert noisefree_nodes_loss(t6, nodes) >= lower_bound(t6, m)
    assert best_fixed_nodes(t6, 5).tolist() == [1, 5, 7, 9, 13]
    assert best_fixed_nodes(t6, 6).tolist() == [1, 7, 9, 11, 12, 13]


@pytest.mark.parametrize("depth,alpha", [(1, 0.5), (2, 0.9), (3, 0.5), (3, 1.0), (4, 0.5), (4, 0.3), (4, 0.77)])
def test_dynamic_program_is_exact_at_every_budget_on_small_trees(depth, alpha):
    tree = TreePrior(depth, alpha)
    for m in range(1, tree.dim + 1):  # K = 4: all 32,767 non-empty sets
        nodes = best_fixed_nodes(tree, m, method="dp")
        assert nodes.shape == (m,) and nodes.unique().numel() == m
        assert noisefree_nodes_loss(tree, nodes) == pytest.approx(brute_force_best(tree, m), abs=1e-12)


@pytest.mark.parametrize("depth,alpha,budgets", [(5, 0.5, (1, 2, 3, 4, 27, 28, 29, 30)),
                                                  (5, 0.6, (3, 4)), (6, 0.5, (1, 2, 3)),
                                                  (6, 0.35, (2, 3))])
def test_dynamic_program_matches_exhaustive_search(depth, alpha, budgets):
    tree = TreePrior(depth, alpha)
    for m in budgets:
        dp = best_fixed_nodes(tree, m, method="dp")
        full = best_fixed_nodes(tree, m, method="exhaustive")
        assert noisefree_nodes_loss(tree, dp) == pytest.approx(noisefree_nodes_loss(tree, full), abs=1e-12)


def test_dynamic_program_beats_or_ties_the_local_search():
    tree = TreePrior(6, 0.5)
    for m in (5, 6, 9, 17, 40):
        dp = noisefree_nodes_loss(tree, best_fixed_nodes(tree, m))
        local = noisefree_nodes_loss(tree, best_fixed_nodes(tree, m, method="local"))
        assert dp <= local + 1e-12 and dp >= lower_bound(tree, m) - 1e-12


def test_which_search_is_used():
    assert DP_MAX_DEPTH >= 6
    assert best_fixed_method(TreePrior(6, 0.5), 6) == "dp"
    deep = TreePrior(DP_MAX_DEPTH + 1, 0.5)
    assert best_fixed_method(deep, 1) == "exhaustive"
    assert best_fixed_method(deep, 6) == "local"
    assert best_fixed_method(deep, 6, exact_limit=math.comb(deep.dim, 6)) == "exhaustive"


def test_lower_bound_function():
    for depth, alpha in [(3, 0.5), (6, 0.5), (6, 0.8)]:
        tree = TreePrior(depth, alpha)
        assert fixed_set_lower_bound(tree, 0) == pytest.approx(tree.energy)
        for m in range(1, tree.dim + 1):
            assert fixed_set_lower_bound(tree, m) == pytest.approx(lower_bound(tree, m), abs=1e-15)
            assert noisefree_nodes_loss(tree, best_fixed_nodes(tree, m)) >= fixed_set_lower_bound(tree, m) - 1e-12
    with pytest.raises(ValueError, match="budget"):
        fixed_set_lower_bound(TreePrior(3, 0.5), -1)


def test_result_shape_sorted_distinct_and_never_worse_than_heap():
    for depth, alpha, m in [(4, 0.5, 3), (5, 0.8, 7), (6, 0.3, 4), (7, 0.5, 9)]:
        tree = TreePrior(depth, alpha)
        nodes = best_fixed_nodes(tree, m)
        assert nodes.shape == (m,) and nodes.dtype == torch.long
        assert torch.equal(nodes, torch.sort(nodes).values) and nodes.unique().numel() == m
        assert ((nodes >= 0) & (nodes < tree.dim)).all()
        assert noisefree_nodes_loss(tree, nodes) <= noisefree_nonadaptive_loss(tree, m) + 1e-12
    full = TreePrior(3, 0.5)
    assert torch.equal(best_fixed_nodes(full, 7), torch.arange(7))


def test_local_search_finds_the_exact_optimum_on_small_trees():
    tree = TreePrior(5, 0.5)
    for m in range(1, 7):
        exact = best_fixed_nodes(tree, m)  # the dynamic program
        local = best_fixed_nodes(tree, m, method="local")
        assert noisefree_nodes_loss(tree, local) == pytest.approx(noisefree_nodes_loss(tree, exact), abs=1e-12)
        # the exact search really is the minimum over all subsets
        if m <= 2:
            losses = [noisefree_nodes_loss(tree, s) for s in itertools.combinations(range(tree.dim), m)]
            assert min(losses) == pytest.approx(noisefree_nodes_loss(tree, exact), abs=1e-12)


def test_bounds_of_the_best_fixed_set():
    tree = TreePrior(6, 0.5)
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):  # no fixed set beats the lower bound
        m = int(torch.randint(1, tree.dim, (1,), generator=gen))
        nodes = torch.randperm(tree.dim, generator=gen)[:m]
        assert noisefree_nodes_loss(tree, nodes) >= lower_bound(tree, m) - 1e-12
    for level in range(tree.depth):  # a complete level L - 1 reveals the first L signs
        nodes = tree.level_nodes(level)
        expected = sum(tree.alpha**k for k in range(level + 1, tree.depth))
        assert noisefree_nodes_loss(tree, nodes) == pytest.approx(expected, abs=1e-12)
    curves = best_coord_curves(tree, range(1, 9))
    assert (curves["lower"] <= curves["best"] + 1e-12).all()
    assert (curves["best"] <= curves["upper"] + 1e-12).all()
    assert (curves["best"] <= curves["heap"] + 1e-12).all()
    assert (np.diff(curves["best"]) <= 1e-12).all()  # one more read never hurts
    assert [len(n) for n in curves["nodes"]] == list(range(1, 9))


def test_best_fixed_set_keeps_the_power_law_exponent():
    tree = TreePrior(6, 0.5)
    budgets = np.arange(1, 9)
    fit = fit_decay(budgets, best_coord_curves(tree, budgets)["best"])
    assert fit.best == "power" and abs(fit.power_exponent - math.log2(tree.alpha)) < 0.3


def test_input_validation_names_the_bad_value():
    tree = TreePrior(3, 0.5)
    with pytest.raises(ValueError, match="7"):
        noisefree_nodes_loss(tree, [0, 7])
    with pytest.raises(ValueError, match="-1"):
        noisefree_nodes_loss(tree, torch.tensor([-1]))
    with pytest.raises(ValueError, match="repeated"):
        noisefree_nodes_loss(tree, [2, 2])
    with pytest.raises(ValueError, match="dtype"):
        noisefree_nodes_loss(tree, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="1.5"):
        noisefree_nodes_loss(tree, [1.5])
    with pytest.raises(ValueError, match="shape"):
        noisefree_nodes_loss(tree, torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="TreePrior"):
        noisefree_nodes_loss("tree", [0])
    assert noisefree_nodes_loss(tree, []) == pytest.approx(tree.energy)
    with pytest.raises(ValueError, match="8"):
        best_fixed_nodes(tree, 8)
    with pytest.raises(ValueError, match="0"):
        best_fixed_nodes(tree, 0)
    with pytest.raises(ValueError, match="exact_limit"):
        best_fixed_nodes(tree, 2, exact_limit=0)
    with pytest.raises(ValueError, match="method.*'greedy'"):
        best_fixed_nodes(tree, 2, method="greedy")


def test_monte_carlo_strategy_reads_the_best_set():
    assert "nonadaptive_best_coord" in strategy_names() and strategy_names()[:4] == (
        "adaptive_greedy", "nonadaptive_coord", "lmmse", "nonadaptive_opt")
    tree = TreePrior(4, 0.5)
    # a very precise Gaussian channel gives the noise-free loss of the set
    est = evaluate_strategies(tree, 10**8, 0.0, 4, samples=2000, seed=2, channel="gaussian",
                              strategies=("nonadaptive_best_coord",))
    nf = noisefree_nodes_loss(tree, best_fixed_nodes(tree, 4))
    assert abs(est["nonadaptive_best_coord"].mean - nf) < 4 * est["nonadaptive_best_coord"].stderr + 1e-3
    # with the heap-order set it is the heap-order strategy, number for number
    both = evaluate_strategies(tree, 64, 0.1, 3, samples=300, seed=5, nodes=torch.arange(3),
                               strategies=("nonadaptive_coord", "nonadaptive_best_coord"))
    assert both["nonadaptive_coord"].mean == both["nonadaptive_best_coord"].mean
    # at finite N no fixed set does better than without noise (the reads are a garbling of theta_S)
    finite = evaluate_strategies(tree, 32, 0.0, 4, samples=2000, seed=3, strategies=("nonadaptive_best_coord",))
    assert finite["nonadaptive_best_coord"].mean > nf - 4 * finite["nonadaptive_best_coord"].stderr
    with pytest.raises(ValueError, match="budget = 3"):
        evaluate_strategies(tree, 64, 0.0, 3, samples=10, nodes=[0, 1], strategies=("nonadaptive_best_coord",))


def test_theory_baselines_extra_keys_change_nothing_else():
    tree = TreePrior(4, 0.5)
    plain = theory_baselines(tree, 32, 0.1, 4, samples=300, seed=1)
    extra = theory_baselines(tree, 32, 0.1, 4, samples=300, seed=1, best_coord=True)
    for key, value in plain.items():
        assert extra[key] == value, key
    assert "nonadaptive_best_coord" not in plain
    assert extra["noisefree_best_coord"] == pytest.approx(0.109375)
    assert extra["nonadaptive_best_coord_stderr"] > 0


def test_advantage_sweep_with_the_best_coordinate_set():
    kw = dict(depth=4, budget=3, samples=200, seed=1)
    plain = advantage_sweep([0.5, 0.7], [16, 256], **kw)
    grid = advantage_sweep([0.5, 0.7], [16, 256], best_coord=True, **kw)
    assert np.array_equal(plain.ratio, grid.ratio) and plain.best_lower is None
    a = 0.5  # K = 4, M = 3: the best set leaves 0.1875, the adaptive policy alpha^3
    assert grid.noisefree_best[0] == pytest.approx(0.1875)
    assert grid.noisefree_best_ratio[0] == pytest.approx(0.1875 / a**3)
    assert grid.best_coord.shape == (2, 2) and (grid.best_coord_se > 0).all()
    assert (grid.best_lower <= grid.best_upper * (1 + 1e-12)).all()
    assert (grid.best_upper <= grid.ratio * (1 + 1e-12)).all()
    fig, axes = plt.subplots(1, 2)
    im = plot_advantage_heatmap(grid, ax=axes[0], quantity="best_lower")
    assert im.get_array().shape == (2, 3)  # two N columns and the noise-free limit
    plot_advantage_heatmap(grid, ax=axes[1], quantity="best_upper", norm=im.norm)
    with pytest.raises(ValueError, match="quantity"):
        plot_advantage_heatmap(grid, quantity="nope")
    with pytest.raises(ValueError, match="best_coord"):
        plot_advantage_heatmap(plain, quantity="best_lower")
    with pytest.raises(ValueError, match="best_coord"):
        advantage_sweep([0.5], [16], baseline="nonadaptive_opt", best_coord=True, **kw)
