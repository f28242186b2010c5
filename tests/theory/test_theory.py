"""The theory core: posteriors, strategies, closed forms, DP and fits (chapters 2 and 4-6)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fvlib import GaussianPrior, TreePrior, make_generator, sample_task
from fvlib.theory import (
    FiniteSampleChannel,
    GaussianChannel,
    channel_tau2,
    dp_value,
    evaluate_strategies,
    finite_n_covariance,
    fit_decay,
    gaussian_coordinate_loss,
    gaussian_posterior,
    gaussian_posterior_cov,
    greedy_value,
    leaf_values_at,
    log_likelihood_nodes,
    noisefree_adaptive_loss,
    noisefree_nonadaptive_loss,
    policy_value,
    posterior_probs,
    run_greedy,
    sample_statistic,
    theory_baselines,
    tree_posterior_mean,
)


# ----- exact posteriors ---------------------------------------------------------------------
@given(depth=st.integers(1, 12), steps=st.integers(1, 6), scale=st.floats(0.01, 100.0), seed=st.integers(0, 10**6))
@settings(max_examples=25, deadline=None)
def test_posterior_weights_sum_to_one_and_stay_finite(depth, steps, scale, seed):
    tree = TreePrior(depth, 0.7)
    gen = make_generator(seed)
    nodes = torch.randint(0, tree.dim, (3, steps), generator=gen)
    phis = scale * torch.randn(3, steps, generator=gen, dtype=torch.float64)
    probs = posterior_probs(log_likelihood_nodes(tree, nodes, phis, tau2=1e-3))
    assert torch.isfinite(probs).all()
    assert torch.allclose(probs.sum(-1), torch.ones(3, dtype=torch.float64))


def test_leaf_values_and_posterior_mean_match_the_leaf_matrix():
    tree = TreePrior(5, 0.6)
    nodes = torch.arange(tree.dim)
    assert torch.equal(leaf_values_at(tree, nodes), tree.leaf_thetas.T)
    probs = torch.softmax(torch.randn(4, tree.num_leaves, dtype=torch.float64), -1)
    assert torch.allclose(tree_posterior_mean(tree, probs), probs @ tree.leaf_thetas)


def test_statistic_sampler_has_the_law_of_the_explicit_sum():
    tree = TreePrior(3, 0.5)
    theta = tree.theta_from_signs(torch.tensor([[1, -1, 1]])).expand(60_000, -1)
    g = sample_statistic(theta, 16, 0.5, make_generator(3))
    signs = torch.tensor([[1, -1, 1]]).expand(60_000, -1)
    explicit = sample_task(tree, 60_000, 16, 0.5, make_generator(4), signs=signs, dtype=torch.float64)
    g2 = explicit.sufficient_statistic()
    W = torch.eye(7, dtype=torch.float64)
    exact_cov = finite_n_covariance(theta[0], W, 16, 0.5)
    for sample in (g, g2):
        assert (sample.mean(0) - theta[0]).abs().max() < 0.01
        assert (torch.cov(sample.T) - exact_cov).abs().max() < 0.01


# ----- Gaussian prior -----------------------------------------------------------------------
def test_gaussian_posterior_covariance_does_not_depend_on_observations():
    cov = GaussianPrior.twin_of(TreePrior(3, 0.5)).cov
    W = torch.randn(2, 7, generator=make_generator(0), dtype=torch.float64)
    phi = torch.randn(5, 2, generator=make_generator(1), dtype=torch.float64) * 10
    mean, post = gaussian_posterior(cov, W, phi, 0.1)
    inverse_form = torch.linalg.inv(torch.linalg.inv(cov) + W.T @ W / 0.1)
    assert torch.allclose(post, inverse_form, atol=1e-10)
    assert mean.shape == (5, 7)


def test_gaussian_monte_carlo_matches_closed_form():
    prior = GaussianPrior.twin_of(TreePrior(4, 0.5))
    tau2, budget, n = 0.05, 5, 40_000
    gen = make_generator(5)
    theta = prior.sample(n, gen)
    W = torch.eye(prior.dim, dtype=torch.float64)[:budget]  # the 5 largest variances (heap order)
    phi = GaussianChannel(theta, math.sqrt(tau2), gen).measure(W)
    mean, post = gaussian_posterior(prior.cov, W, phi, tau2)
    errors = (mean - theta).pow(2).sum(-1)
    stderr = errors.std() / math.sqrt(n)
    closed = gaussian_coordinate_loss(prior.variances, budget, tau2)
    assert abs(float(post.trace()) - closed) < 1e-12
    assert abs(errors.mean() - closed) < 4 * stderr


def test_gaussian_adaptive_equals_nonadaptive():
    """Adaptive choice by posterior variance gives one fixed sequence: depth buys nothing."""
    prior = GaussianPrior.twin_of(TreePrior(3, 0.6))
    tau2 = 0.1
    for seed in range(3):
        phi_data = torch.randn(4, generator=make_generator(seed), dtype=torch.float64) * 3
        chosen = []
        for step in range(4):
            W = torch.eye(7, dtype=torch.float64)[chosen] if chosen else torch.zeros(0, 7, dtype=torch.float64)
            post = gaussian_posterior_cov(prior.cov, W, tau2) if chosen else prior.cov
            chosen.append(int(torch.diagonal(post).argmax()))
            _ = phi_data[:step]  # the observations exist but cannot enter the choice
        assert chosen == [0, 1, 2, 0] or chosen[:3] == [0, 1, 2]
    adaptive_risk = float(gaussian_posterior_cov(prior.cov, torch.eye(7, dtype=torch.float64)[[0, 1, 2]], tau2).trace())
    assert math.isclose(adaptive_risk, gaussian_coordinate_loss(prior.variances, 3, tau2), rel_tol=1e-12)


# ----- closed forms and limits --------------------------------------------------------------
def test_noise_free_closed_forms():
    tree = TreePrior(6, 0.5)
    assert noisefree_adaptive_loss(tree, 3) == pytest.approx(0.125 + 0.0625 + 0.03125)
    assert noisefree_adaptive_loss(tree, 6) == 0.0
    # M = 6 = 2^2 - 1 + 3: alpha^2 (1 - 3/4) + sum_{k>2} alpha^k
    assert noisefree_nonadaptive_loss(tree, 6) == pytest.approx(0.0625 + 0.21875)
    assert noisefree_nonadaptive_loss(tree, 7) == pytest.approx(0.21875)
    with pytest.raises(ValueError, match="budget"):
        noisefree_nonadaptive_loss(tree, 0)


@pytest.mark.parametrize("budget", [1, 2, 3, 5])
def test_small_noise_limits_match_noise_free_closed_forms(budget):
    tree = TreePrior(5, 0.6)
    gen = make_generator(budget)
    signs = tree.sample_signs(2000, gen)
    theta = tree.theta_from_signs(signs)
    tau = 1e-3
    greedy = run_greedy(tree, GaussianChannel(theta, tau, gen), budget, tau * tau)
    greedy_loss = (greedy.theta_hat - theta).pow(2).sum(-1).mean()
    assert greedy_loss == pytest.approx(noisefree_adaptive_loss(tree, budget), abs=0.01)
    est = evaluate_strategies(tree, 10**7, 0.0, budget, samples=4000, seed=budget, strategies=("nonadaptive_coord",),
                              channel="gaussian")
    band = 4 * est["nonadaptive_coord"].stderr + 1e-3
    assert abs(est["nonadaptive_coord"].mean - noisefree_nonadaptive_loss(tree, budget)) < band


# ----- section 7 anchors ------------------------------------------------------------------------
def test_design_section_7_configuration():
    tree = TreePrior(6, 0.5)
    res = theory_baselines(tree, 128, 0.0, 6, samples=4000, seed=0, optimised=True)
    assert res["tau2"] == pytest.approx(1.96875 / 128)
    assert res["gaussian_twin"] == pytest.approx(0.3624, abs=5e-4)
    anchors = {"adaptive_greedy": 0.012, "nonadaptive_coord": 0.28, "lmmse": 0.37, "nonadaptive_opt": 0.104}
    for key, anchor in anchors.items():
        band = 4 * res[f"{key}_stderr"] + 0.03 * anchor
        assert abs(res[key] - anchor) < band, (key, res[key], anchor)
    assert res["adaptive_greedy"] < res["nonadaptive_opt"] < res["nonadaptive_coord"] < res["lmmse"]


def test_gaussian_channel_and_finite_statistic_agree_at_large_n():
    tree = TreePrior(4, 0.5)
    kw = dict(samples=3000, seed=1, strategies=("adaptive_greedy", "nonadaptive_coord"))
    finite = evaluate_strategies(tree, 512, 0.2, 4, channel="finite", **kw)
    channel = evaluate_strategies(tree, 512, 0.2, 4, channel="gaussian", **kw)
    for key in finite:
        band = 4 * math.hypot(finite[key].stderr, channel[key].stderr) + 0.002
        assert abs(finite[key].mean - channel[key].mean) < band


def test_same_seed_same_numbers():
    tree = TreePrior(4, 0.5)
    a = theory_baselines(tree, 32, 0.1, 4, samples=500, seed=3)
    b = theory_baselines(tree, 32, 0.1, 4, samples=500, seed=3)
    assert a == b


def test_finite_channel_measures_the_statistic():
    g = torch.arange(12, dtype=torch.float64).reshape(2, 6)
    chan = FiniteSampleChannel(g)
    assert chan.measure_nodes(torch.tensor([1, 4])).tolist() == [1.0, 10.0]
    assert torch.equal(chan.measure(torch.eye(6, dtype=torch.float64)[:2]), g[:, :2])


# ----- dynamic programming ------------------------------------------------------------------------
@given(depth=st.integers(2, 3), tau=st.floats(0.15, 1.5), alpha=st.floats(0.3, 0.9))
@settings(max_examples=8, deadline=None)
def test_dp_is_at_most_greedy_is_at_most_nonadaptive(depth, tau, alpha):
    tree = TreePrior(depth, alpha)
    dp = policy_value(tree, 2, tau, "optimal", quad_points=24)
    greedy = policy_value(tree, 2, tau, "greedy", quad_points=24)
    fixed = policy_value(tree, 2, tau, "nonadaptive", quad_points=24)
    assert dp <= greedy + 1e-9
    assert greedy <= fixed + 1e-9


def test_quadrature_matches_monte_carlo_for_greedy():
    tree, tau = TreePrior(3, 0.5), 0.5
    gen = make_generator(11)
    theta = tree.sample(40_000, gen)
    roll = run_greedy(tree, GaussianChannel(theta, tau, gen), 3, tau * tau)
    errors = (roll.theta_hat - theta).pow(2).sum(-1)
    assert abs(errors.mean() - greedy_value(tree, 3, tau)) < 4 * errors.std() / math.sqrt(len(errors)) + 2e-3


@pytest.mark.slow
def test_dp_reference_values_tau_06():
    """Chapter 4 (*Choosing what to measure*): K = 3, alpha = 0.5, L = 3, tau = 0.6: DP ~ 0.34, greedy ~ 0.49."""
    tree = TreePrior(3, 0.5)
    dp, greedy = dp_value(tree, 3, 0.6), greedy_value(tree, 3, 0.6)
    assert dp == pytest.approx(0.34, abs=0.01)
    assert greedy == pytest.approx(0.49, abs=0.01)


def test_dp_reference_values_two_layers():
    tree = TreePrior(3, 0.5)
    assert dp_value(tree, 2, 0.3) == pytest.approx(greedy_value(tree, 2, 0.3), abs=1e-3)
    assert greedy_value(tree, 3, 0.3) == pytest.approx(0.052, abs=0.002)


@pytest.mark.parametrize("kwargs", [dict(tree=TreePrior(4, 0.5), n_layers=2, tau=0.3),
                                    dict(tree=TreePrior(3, 0.5), n_layers=0, tau=0.3),
                                    dict(tree=TreePrior(3, 0.5), n_layers=2, tau=0.0)])
def test_dp_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        dp_value(**kwargs)


# ----- fits ------------------------------------------------------------------------------------
def test_fit_tells_exponential_from_power_law():
    x = [1, 2, 3, 4, 5, 6, 7, 8]
    expo = fit_decay(x, [0.5**m for m in x])
    assert expo.best == "exponential" and expo.exp_base == pytest.approx(0.5)
    power = fit_decay(x, [(m + 0.0) ** -1.0 for m in x])
    assert power.best == "power" and power.power_exponent == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        fit_decay([1, 2, 3], [1.0, 0.0, 2.0])


def test_strategy_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="unknown strategies"):
        evaluate_strategies(TreePrior(3, 0.5), 16, 0.0, 2, strategies=("magic",))
    with pytest.raises(ValueError, match="budget"):
        theory_baselines(TreePrior(2, 0.5), 16, 0.0, 9)
    with pytest.raises(ValueError, match="n_ctx"):
        channel_tau2(TreePrior(2, 0.5), 0, 0.0)


def test_optimise_gaussian_rows_unit_rows_beat_top_coordinates_at_small_n():
    from fvlib import GaussianPrior
    from fvlib.theory import gaussian_coordinate_loss, optimise_gaussian_rows

    twin = GaussianPrior.twin_of(TreePrior(4, 0.5))
    tau2 = channel_tau2(twin, 8, 0.0)
    top = gaussian_coordinate_loss(twin.variances, 4, tau2)
    W, ortho = optimise_gaussian_rows(twin.cov, 4, tau2, steps=200)
    _, unit = optimise_gaussian_rows(twin.cov, 4, tau2, rows="unit", steps=400)
    assert W.shape == (4, twin.dim)
    assert abs(ortho - top) < 1e-3          # Gaussian channel: the top-M coordinates are best
    assert unit < top - 0.05                # noise tau^2 I: mixed unit rows do better
    with pytest.raises(ValueError, match="rows"):
        optimise_gaussian_rows(twin.cov, 4, tau2, rows="free")
    with pytest.raises(ValueError, match="budget"):
        optimise_gaussian_rows(twin.cov, 0, tau2)


# ----- bad input at the public entry points --------------------------------------------------
def _bad_theory_calls():
    """``(label, call, words the ValueError must hold)``: each call is a mistake a user makes."""
    import fvlib.theory as th

    t = TreePrior(3, 0.5)
    long = torch.zeros(2, 2, dtype=torch.long)
    phis = torch.zeros(2, 2, dtype=torch.float64)
    f64 = dict(dtype=torch.float64)
    return [
        ("channel_tau2 list", lambda: th.channel_tau2([1.0, 2.0], 16, 0.0), ["prior", "Prior", "list"]),
        ("theory_baselines list", lambda: th.theory_baselines([1], 16, 0.0, 2), ["tree", "TreePrior", "list"]),
        ("theory_baselines budget", lambda: th.theory_baselines(t, 16, 0.0, 8), ["budget", "[1, 7]", "8"]),
        ("log_likelihood_nodes lists", lambda: th.log_likelihood_nodes(t, [[0, 1]], [[0.1, 0.2]], 0.1),
         ["nodes", "torch.Tensor", "list"]),
        ("log_likelihood_nodes mismatch",
         lambda: th.log_likelihood_nodes(t, torch.zeros(2, 3, dtype=torch.long), phis, 0.1),
         ["phis", "(2, 3)", "(2, 2)"]),
        ("log_likelihood_nodes float nodes", lambda: th.log_likelihood_nodes(t, phis, phis, 0.1), ["nodes", "integer"]),
        ("log_likelihood_nodes tau2", lambda: th.log_likelihood_nodes(t, long, phis, -1.0), ["tau2", "-1.0"]),
        ("tree_posterior_mean shape", lambda: th.tree_posterior_mean(t, torch.ones(2, 7)),
         ["probs", "(*, 8)", "(2, 7)"]),
        ("tree_posterior_cov shape", lambda: th.tree_posterior_cov(t, torch.ones(2, 6)), ["probs", "(2, 6)"]),
        ("node_masses shape", lambda: th.node_masses(t, torch.ones(2, 6)), ["probs", "(2, 6)"]),
        ("level_node_masses level", lambda: th.level_node_masses(t, torch.ones(2, 8) / 8, 9), ["level", "[0, 2]", "9"]),
        ("greedy_action log_w", lambda: th.greedy_action(t, torch.zeros(2, 7), 0), ["log_w", "(2, 7)"]),
        ("greedy_action step", lambda: th.greedy_action(t, torch.zeros(2, 8), 99), ["step", "[0, 6]", "99"]),
        ("greedy_action measured",
         lambda: th.greedy_action(t, torch.zeros(2, 8), 3, torch.zeros(2, 6, dtype=torch.bool)),
         ["measured", "(2, 7)"]),
        ("update_with_node mismatch",
         lambda: th.update_with_node(t, torch.zeros(2, 8), torch.zeros(3, dtype=torch.long), torch.zeros(2), 0.1),
         ["nodes", "(3,)"]),
        ("leaf_values_at float", lambda: th.leaf_values_at(t, torch.tensor([0.5])), ["nodes", "integer"]),
        ("uniform_log_weights batch", lambda: th.uniform_log_weights(t, -1), ["batch", "-1"]),
        ("posterior_probs list", lambda: th.posterior_probs([[0.0] * 8]), ["log_w", "list"]),
        ("log_likelihood_directions Q",
         lambda: th.log_likelihood_directions(t, torch.eye(6, **f64), torch.zeros(1, 6, **f64), 0.1),
         ["Q", "(6, 6)"]),
        ("gaussian_coordinate_loss tau2", lambda: th.gaussian_coordinate_loss(t.node_variances, 3, -1.0),
         ["tau2", "-1.0"]),
        ("twin_finite_n_loss tau2", lambda: th.twin_finite_n_loss(t.node_variances, 3, 16, -1.0), ["tau2", "-1.0"]),
        ("gaussian_posterior_cov tau2",
         lambda: th.gaussian_posterior_cov(torch.eye(3, **f64), torch.eye(3, **f64)[:2], -1.0),
         ["tau2", "-1.0"]),
        ("gaussian_posterior_cov W", lambda: th.gaussian_posterior_cov(torch.eye(3, **f64), torch.eye(4, **f64), 0.1),
         ["W", "(4, 4)"]),
        ("optimise_gaussian_rows tau2", lambda: th.optimise_gaussian_rows(torch.eye(3, **f64), 2, -1.0, steps=1),
         ["tau2", "-1.0"]),
        ("optimise_directions tau2", lambda: th.optimise_directions(t, 2, -1.0, steps=1), ["tau2", "-1.0"]),
        ("lmmse_decode_nodes tau2", lambda: th.lmmse_decode_nodes(t.node_variances, torch.arange(2), phis, -1.0),
         ["tau2", "-1.0"]),
        ("noisefree_adaptive_loss list", lambda: th.noisefree_adaptive_loss([1], 2), ["tree", "list"]),
        ("sample_statistic list", lambda: th.sample_statistic([[1.0] * 7], 16, 0.0, torch.Generator()),
         ["theta", "list"]),
        ("GaussianChannel list", lambda: th.GaussianChannel([[0.0] * 7], 0.1, torch.Generator()), ["theta", "list"]),
        ("FiniteSampleChannel W", lambda: th.FiniteSampleChannel(torch.zeros(2, 7)).measure(torch.zeros(2, 5)),
         ["W", "(2, 5)"]),
        ("FiniteSampleChannel nodes",
         lambda: th.FiniteSampleChannel(torch.zeros(2, 7)).measure_nodes(torch.tensor([0, 7])),
         ["nodes", "[0, 6]"]),
        ("evaluate_strategies seed", lambda: th.evaluate_strategies(t, 16, 0.0, 2, samples=10, seed=10**23), ["seed"]),
        ("run_greedy channel", lambda: th.run_greedy(t, torch.zeros(2, 7), 2, 0.1), ["channel", "Tensor"]),
    ]


@pytest.mark.parametrize("label, call, words", _bad_theory_calls(), ids=[c[0] for c in _bad_theory_calls()])
def test_bad_input_is_a_value_error_naming_the_argument(label, call, words):
    with pytest.raises(ValueError) as err:
        call()
    assert all(w in str(err.value) for w in words), str(err.value)


def test_theory_cost_grows_with_every_size_but_n_and_flags_the_slow_options():
    from fvlib.theory import theory_cost

    base = dict(depth=6, n_ctx=128, budget=6, samples=4000)
    seconds, memory = theory_cost(**base)
    assert 0 < seconds < 60 and 0 < memory < 1e9  # the book's reference configuration
    for name, value in (("depth", 8), ("budget", 12), ("samples", 40000)):
        more = theory_cost(**{**base, name: value})
        assert more[0] > seconds and more[1] >= memory, name
    # the statistic is drawn in O(D) whatever N (fvlib.task.sample_statistic): a long context is free
    assert theory_cost(**{**base, "n_ctx": 10**12}) == (seconds, memory)
    assert theory_cost(**base, optimised=True)[0] > 10 * seconds
    assert theory_cost(3, 16, 4, dp=True)[0] > 3600 > theory_cost(3, 16, 3, dp=True)[0]
