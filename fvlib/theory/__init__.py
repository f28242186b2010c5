"""The theory: exact Bayes baselines, measurement strategies, dynamic programming, closed forms,
and their Monte Carlo sweeps.

Submodules, in layers from the bottom up; a submodule imports only from the layers below it
(``tests/core/test_import_layers.py`` checks this)::

    channel, closed_forms, posteriors, decoders, fits
        how measurements are observed; closed forms; exact Bayes posteriors and the greedy
        rule (a function of the belief); nonlinear decoders of the finite-N statistic; fits
    adaptive_opt
        the optimised adaptive policy: directions W_l(Phi_{l-1}) learned through the exact
        posterior, kept only where they beat greedy and the optimised non-adaptive directions
    strategies, dp
        greedy, non-adaptive, LMMSE and optimised directions with their Monte Carlo losses, and the
        registry of strategies (name -> estimator, adaptive or not, what it needs);
        dynamic programming over coordinate actions (re-measuring allowed, or not)
    predictors, sweeps
        the strategies and policies as predictors with a model's signature, batch -> theta_hat;
        Monte Carlo sweeps of the strategies (over budgets, over grids of alpha and N) and the
        closed forms' curves
    baselines, patching
        the table of all baselines (strategies, closed forms, the DP optimum): the CLI's
        ``theory`` command; the theory of key patching (donor/target pairs, the sweep shared
        with the models' interventions, the noise-free pattern)
    patching_policies
        the theory policies patched as the models are, greedy or any direction policy: the
        aware reference (it knows what was patched) and the unaware one (it reads the patched
        slot as its own measurement, as a network does); their heatmaps and one row against N

Every public name of the submodules is importable from ``fvlib.theory``.
"""

from .adaptive_opt import (
    POLICY_KINDS,
    AdaptivePolicy,
    FixedRows,
    GreedyRule,
    OptimisedPolicy,
    PolicyRollout,
    optimise_adaptive_policy,
    policy_from_state,
    policy_rollout,
    policy_state,
)
from .baselines import theory_baselines, theory_cost
from .channel import FiniteSampleChannel, GaussianChannel, sample_statistic
from .closed_forms import (
    DP_MAX_DEPTH,
    FIXED_SET_METHODS,
    best_fixed_method,
    best_fixed_nodes,
    channel_tau2,
    finite_n_covariance,
    fixed_set_lower_bound,
    gaussian_coordinate_loss,
    gaussian_posterior,
    gaussian_posterior_cov,
    noisefree_adaptive_loss,
    noisefree_layered_loss,
    noisefree_nodes_loss,
    noisefree_nonadaptive_loss,
    twin_finite_n_loss,
)
from .decoders import RadialDecoder, fit_radial_decoder
from .dp import (
    MAX_DP_DEPTH,
    MAX_DP_LAYERS,
    dp_no_repeat,
    dp_policy_tree,
    dp_value,
    greedy_value,
    optimal_actions,
    policy_value,
)
from .fits import DecayFit, fit_decay
from .patching import (
    DEFAULT_CHUNK,
    PatchingResult,
    check_tree,
    chunk_sizes,
    donor_signs,
    ideal_patching_mask,
    noisefree_patching_loss,
    patching_pairs,
    run_patching_sweep,
    sample_pair_statistics,
)
from .patching_policies import (
    PATCHING_REFERENCES,
    PatchingRow,
    check_reference,
    greedy_patcher,
    pair_channels,
    patched_greedy_runs,
    policy_patcher,
    theory_patching_references,
    theory_patching_row,
    theory_patching_sweep,
)
from .posteriors import (
    greedy_action,
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
from .predictors import Predictor, policy_predictor, strategy_predictor
from .strategies import (
    CHANNELS,
    STRATEGY_NEEDS,
    Estimate,
    Rollout,
    Strategy,
    bayes_decode_nodes,
    choosing_strategies,
    coordinate_decoder_losses,
    evaluate_strategies,
    get_strategy,
    lmmse_decode_nodes,
    mc_contexts,
    nonadaptive_nodes,
    optimise_directions,
    optimise_gaussian_rows,
    orthonormal_rows,
    register_strategy,
    run_greedy,
    strategy_estimate,
    strategy_names,
    unregister_strategy,
)
from .sweeps import (
    AdvantageGrid,
    DecaySweep,
    advantage_sweep,
    best_coord_curves,
    closed_form_curves,
    decay_sweep,
    depth_sweep_theory,
)

__all__ = [name for name in dir() if not name.startswith("_")]
