"""The theory: exact Bayes baselines, measurement strategies, dynamic programming, closed forms.

Submodules: ``closed_forms``, ``channel`` (how measurements are observed), ``posteriors``
(exact Bayes), ``strategies`` (greedy, non-adaptive, LMMSE, optimised directions, Monte
Carlo), ``dp`` (dynamic programming over coordinate actions), ``decoders`` (nonlinear
decoders of the finite-``N`` statistic) and ``fits``.
"""

from .channel import FiniteSampleChannel, GaussianChannel, sample_statistic
from .closed_forms import (
    best_fixed_nodes,
    channel_tau2,
    finite_n_covariance,
    gaussian_coordinate_loss,
    gaussian_posterior,
    gaussian_posterior_cov,
    noisefree_adaptive_loss,
    noisefree_nodes_loss,
    noisefree_nonadaptive_loss,
    twin_finite_n_loss,
)
from .decoders import RadialDecoder, fit_radial_decoder
from .dp import dp_policy_tree, dp_value, greedy_value, optimal_actions, policy_value
from .fits import DecayFit, fit_decay
from .posteriors import (
    leaf_values_at,
    level_node_masses,
    log_likelihood_directions,
    log_likelihood_nodes,
    node_masses,
    node_posterior_variances,
    posterior_probs,
    tree_posterior_cov,
    tree_posterior_mean,
    tree_posterior_variance,
    uniform_log_weights,
    update_with_node,
)
from .strategies import (
    STRATEGIES,
    Estimate,
    Rollout,
    bayes_decode_nodes,
    evaluate_strategies,
    greedy_action,
    lmmse_decode_nodes,
    mc_contexts,
    nonadaptive_nodes,
    optimise_directions,
    optimise_gaussian_rows,
    orthonormal_rows,
    run_greedy,
    theory_baselines,
)

__all__ = [name for name in dir() if not name.startswith("_")]
