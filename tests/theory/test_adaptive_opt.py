"""The optimised adaptive policy and the DP without re-measuring (issue items of chapters 4 and 6).

``adaptive_opt`` must be at most ``min(adaptive_greedy, nonadaptive_opt)`` within Monte Carlo
error, and ``dp_optimal <= dp_no_repeat <= greedy``, at configurations the book does not list.
"""

import math

import pytest
import torch

from fvlib import TreePrior
from fvlib.theory import (
    FiniteSampleChannel,
    FixedRows,
    GreedyRule,
    channel_tau2,
    dp_no_repeat,
    dp_value,
    evaluate_strategies,
    log_likelihood_directions,
    mc_contexts,
    optimise_adaptive_policy,
    optimise_directions,
    policy_rollout,
    policy_value,
    posterior_probs,
    run_greedy,
)

# (depth, alpha, n_ctx, noise_std, budget): none of them appears in the book
CONFIGS = [(3, 0.6, 48, 0.3, 2), (4, 0.45, 96, 0.2, 3), (3, 0.7, 200, 0.0, 3)]


@pytest.mark.parametrize("depth,alpha,n_ctx,noise_std,budget", CONFIGS)
def test_adaptive_opt_is_at_most_greedy_and_nonadaptive_opt(depth, alpha, n_ctx, noise_std, budget):
    torch.set_num_threads(1)
    tree = TreePrior(depth, alpha)
    est = evaluate_strategies(tree, n_ctx, noise_std, budget, samples=1500, seed=3,
                              strategies=("adaptive_greedy", "nonadaptive_opt", "adaptive_opt"))
    best = min(("adaptive_greedy", "nonadaptive_opt"), key=lambda k: est[k].mean)
    error = math.hypot(est["adaptive_opt"].stderr, est[best].stderr)
    assert est["adaptive_opt"].mean <= est[best].mean + 3 * error


def _contexts(depth=3, n_ctx=64, budget=3, samples=500):
    tree = TreePrior(depth, 0.5)
    tau2 = channel_tau2(tree, n_ctx, 0.2)
    theta, _, g_hat = mc_contexts(tree, samples, n_ctx, 0.2, seed=5)
    return tree, tau2, theta, FiniteSampleChannel(g_hat), budget


def test_greedy_rule_rollout_is_the_greedy_strategy():
    tree, tau2, _, chan, budget = _contexts()
    ours = policy_rollout(tree, GreedyRule(tree), chan, budget, tau2)
    ref = run_greedy(tree, chan, budget, tau2)
    assert torch.equal(ours.directions.argmax(-1), ref.nodes)
    assert torch.allclose(ours.theta_hat, ref.theta_hat, atol=1e-10)


def test_fixed_rows_rollout_is_the_nonadaptive_decoder():
    tree, tau2, _, chan, budget = _contexts()
    Q = optimise_directions(tree, budget, tau2, steps=20, seed=1)
    ours = policy_rollout(tree, FixedRows(Q), chan, budget, tau2)
    u = chan.measure(Q)
    ref = posterior_probs(log_likelihood_directions(tree, Q, u, tau2)) @ tree.leaf_thetas
    assert torch.allclose(ours.theta_hat, ref, atol=1e-10)


def test_measuring_a_direction_again_adds_nothing():
    tree, tau2, _, chan, _ = _contexts()
    row = torch.randn(1, tree.dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    once = policy_rollout(tree, FixedRows(row), chan, 1, tau2)
    twice = policy_rollout(tree, FixedRows(torch.cat([row, 2 * row])), chan, 2, tau2)
    assert torch.allclose(once.theta_hat, twice.theta_hat, atol=1e-10)


def test_forced_rows_replace_the_policy_at_that_layer():
    tree, tau2, _, chan, budget = _contexts()
    forced = torch.eye(tree.dim, dtype=torch.float64)[[2]].expand(chan.g_hat.shape[0], -1)
    ro = policy_rollout(tree, GreedyRule(tree), chan, budget, tau2, forced={2: forced})
    assert torch.equal(ro.directions[:, 1], forced)


def test_optimisation_is_seeded_and_keeps_the_best_candidate():
    tree, tau2, _, _, budget = _contexts()
    Q = optimise_directions(tree, budget, tau2, steps=20, seed=1)
    runs = [optimise_adaptive_policy(tree, budget, tau2, directions=Q, steps=5, batch=64, validation=300, seed=2)
            for _ in range(2)]
    assert runs[0].validation == runs[1].validation
    assert set(runs[0].validation) == {"learned", "greedy", "nonadaptive_opt"}
    assert runs[0].validation[runs[0].kind] == min(runs[0].validation.values())


@pytest.mark.parametrize("kwargs,needle", [
    ({"budget": 0}, "budget"),
    ({"tau2": -1.0}, "tau2"),
    ({"steps": 0}, "steps"),
    ({"directions": torch.zeros(2, 7, dtype=torch.float64)}, "directions"),
])
def test_bad_arguments_name_the_bad_value(kwargs, needle):
    tree = TreePrior(3, 0.5)
    args = {"tree": tree, "budget": 3, "tau2": 0.05, "directions": torch.eye(7, dtype=torch.float64)[:3]}
    args.update(kwargs)
    with pytest.raises(ValueError, match=needle):
        optimise_adaptive_policy(**args)


def test_adaptive_opt_needs_the_finite_channel():
    with pytest.raises(ValueError, match="channel"):
        evaluate_strategies(TreePrior(2, 0.5), 32, 0.1, 2, samples=10, strategies=("adaptive_opt",),
                            channel="gaussian")


# ----- the DP on the channel a transformer has ----------------------------------------------------
@pytest.mark.parametrize("depth,alpha,tau", [(2, 0.65, 0.25), (3, 0.4, 0.35), (3, 0.8, 0.7)])
def test_dp_optimal_le_no_repeat_le_greedy(depth, alpha, tau):
    tree = TreePrior(depth, alpha)
    values = {p: policy_value(tree, 2, tau, p, quad_points=24) for p in ("optimal", "no_repeat", "greedy")}
    assert values["optimal"] <= values["no_repeat"] + 1e-9
    assert values["no_repeat"] <= values["greedy"] + 1e-9


def test_no_repeat_with_every_node_is_measuring_all_of_them():
    tree, tau = TreePrior(2, 0.5), 0.4
    every = policy_value(tree, 3, tau, "nonadaptive", quad_points=16)
    # the same three nodes in another order: equal up to the quadrature error
    assert dp_no_repeat(tree, 3, tau, quad_points=16) == pytest.approx(every, abs=1e-4)
    # with fresh noise, measuring the root twice beats measuring the empty sibling
    assert dp_value(tree, 3, tau, quad_points=16) < every - 1e-4
