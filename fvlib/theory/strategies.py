"""Measurement strategies and their Monte Carlo excess losses (the book's appendix *Conventions*, section
"Strategies and their names"; chapter 6, *Tree prior*).

Every strategy spends a budget of ``M`` scalar measurements (one per layer for the adaptive
ones) and decodes with the exact Bayes posterior under the Gaussian-channel likelihood
(``lmmse`` decodes linearly instead). Observations come from a channel (``channel.py``): the
finite-``N`` statistic by default, or the Gaussian channel itself.

Every strategy is registered once (:func:`register_strategy`) with its estimator, what it needs
(directions, a node set, a policy), the channels it runs on and whether it is **adaptive**:
whether it chooses each measurement from what it has read (:func:`choosing_strategies`).
:func:`strategy_names` lists them and :func:`get_strategy` looks one up.

The greedy rule itself is a function of the belief and lives with the posteriors
(:func:`fvlib.theory.posteriors.greedy_action`); :func:`run_greedy` runs it against a channel.
The table of all baselines (strategies beside the DP optimum) is
:func:`fvlib.theory.baselines.theory_baselines`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._checks import check_budget, check_instance, check_int, check_number, check_seed, check_tensor
from ..priors import Prior, TreePrior, check_tree_prior
from ..registry import Registry
from ..stats import mean_and_stderr, squared_error
from .adaptive_opt import OptimisedPolicy, optimise_adaptive_policy
from .channel import FiniteSampleChannel, GaussianChannel, sample_statistic
from .closed_forms import best_fixed_nodes, channel_tau2, check_nodes, gaussian_posterior_cov
from .decoders import fit_radial_decoder
from .posteriors import (
    greedy_action,
    log_likelihood_directions,
    posterior_probs,
    tree_posterior_mean,
    uniform_log_weights,
    update_with_node,
)

__all__ = [
    "Estimate",
    "Rollout",
    "run_greedy",
    "nonadaptive_nodes",
    "bayes_decode_nodes",
    "lmmse_decode_nodes",
    "optimise_directions",
    "orthonormal_rows",
    "optimise_gaussian_rows",
    "mc_contexts",
    "evaluate_strategies",
    "strategy_estimate",
    "coordinate_decoder_losses",
    "CHANNELS",
    "STRATEGY_NEEDS",
    "Strategy",
    "register_strategy",
    "unregister_strategy",
    "strategy_names",
    "get_strategy",
    "choosing_strategies",
]

#: The channels a strategy is observed through (:func:`evaluate_strategies`).
CHANNELS = ("finite", "gaussian")
#: What a strategy may need beside the tree, the channel, the budget and ``tau^2``.
STRATEGY_NEEDS = ("directions", "nodes", "policy")


@dataclass(frozen=True)
class Estimate:
    """A Monte Carlo mean with its standard error over ``n`` samples."""

    mean: float
    stderr: float
    n: int

    @classmethod
    def of(cls, values: torch.Tensor) -> Estimate:
        values = torch.as_tensor(values, dtype=torch.float64).flatten()
        mean, stderr = mean_and_stderr(values)
        return cls(float(mean), float(stderr), values.numel())

    def __float__(self) -> float:
        return self.mean

    def __repr__(self) -> str:
        return f"{self.mean:.4g} ± {self.stderr:.2g} (n={self.n})"


@dataclass(frozen=True)
class Rollout:
    """One run of an adaptive policy over ``B`` contexts and ``L`` steps.

    ``nodes (B, L)`` measured nodes, ``phis (B, L)`` observations, ``log_w (B, 2^K)`` final
    log-weights, ``theta_hat (B, D)`` posterior means.
    """

    nodes: torch.Tensor
    phis: torch.Tensor
    log_w: torch.Tensor
    theta_hat: torch.Tensor


def run_greedy(tree: TreePrior, channel, n_layers: int, tau2: float, forced: dict | None = None,
               readings: dict | None = None) -> Rollout:
    """Run the greedy adaptive policy for ``n_layers`` steps.

    Args:
        channel: a :class:`~fvlib.theory.channel.FiniteSampleChannel` or
            :class:`~fvlib.theory.channel.GaussianChannel` over ``B`` contexts.
        tau2: the channel variance used in the likelihood.
        forced: optional ``{layer: nodes (B,)}`` with 1-based layers; at those layers the given
            nodes are measured instead of the greedy choice, and the posterior knows it (the
            *aware* key-patching intervention).
        readings: optional ``{layer: phis (B,)}`` with 1-based layers; at those layers the
            policy chooses its own node but records the given reading, which it then takes for
            that node's measurement (the *unaware* key-patching intervention: the workspace
            slot is overwritten, as in a network that only sees its workspace).
    """
    check_tree_prior("tree", tree)
    check_budget("budget", n_layers, tree.depth)
    check_instance("channel", channel, (FiniteSampleChannel, GaussianChannel))
    batch = _channel_batch(channel)
    log_w = uniform_log_weights(tree, batch)
    measured = torch.zeros(batch, tree.dim, dtype=torch.bool)
    nodes, phis = [], []
    for step in range(n_layers):
        if forced and (step + 1) in forced:
            node = torch.as_tensor(forced[step + 1]).long()
        else:
            node = greedy_action(tree, log_w, step, measured)
        if readings and (step + 1) in readings:
            phi = torch.as_tensor(readings[step + 1], dtype=torch.float64)
        else:
            phi = channel.measure_nodes(node)
        log_w = update_with_node(tree, log_w, node, phi, tau2)
        measured[torch.arange(batch), node] = True
        nodes.append(node)
        phis.append(phi)
    theta_hat = tree_posterior_mean(tree, posterior_probs(log_w))
    return Rollout(torch.stack(nodes, 1), torch.stack(phis, 1), log_w, theta_hat)


def _channel_batch(channel) -> int:
    source = channel.g_hat if isinstance(channel, FiniteSampleChannel) else channel.theta
    return source.shape[0]


def nonadaptive_nodes(tree_or_dim, budget: int) -> torch.Tensor:
    """The first ``M`` nodes in heap order (breadth first), ``(M,)``.

    This is the set of the ``nonadaptive_coord`` strategy. It is not the best fixed set of
    coordinates: see :func:`~fvlib.theory.closed_forms.best_fixed_nodes`.
    """
    if isinstance(tree_or_dim, Prior):
        tree_or_dim = tree_or_dim.dim
    dim = check_int("tree_or_dim", tree_or_dim, 1)
    check_int("budget", budget, 1, dim)
    return torch.arange(budget)


def bayes_decode_nodes(tree: TreePrior, nodes: torch.Tensor, phis: torch.Tensor, tau2: float) -> torch.Tensor:
    """Exact posterior mean ``(B, D)`` from coordinate measurements ``phis (B, M)`` at ``nodes (M,)``."""
    check_tensor("nodes", nodes, (None,), "(M,)", integer=True)
    check_tensor("phis", phis, (None, nodes.shape[0]), "(B, M)")
    tau2 = check_number("tau2", tau2, 0, low_open=True)
    # the same nodes for every context: the log-likelihood of every leaf in one product,
    # (phi t - t^2 / 2) / tau2 summed over the nodes, t the leaf's values there (2^K, M)
    values = tree.leaf_thetas[:, nodes.long()]
    log_w = (phis @ values.T - 0.5 * (values * values).sum(-1)) / tau2
    return tree_posterior_mean(tree, posterior_probs(log_w))


def lmmse_decode_nodes(variances: torch.Tensor, nodes: torch.Tensor, phis: torch.Tensor, tau2: float) -> torch.Tensor:
    """Linear decoding per coordinate: ``theta_hat_n = v_n / (v_n + tau2) phi_n`` on measured nodes."""
    check_number("tau2", tau2, 0)
    variances = check_tensor("variances", variances, (None,), "(D,)")
    nodes = check_tensor("nodes", nodes, (None,), "(M,)", integer=True)
    check_tensor("phis", phis, (None, nodes.shape[0]), "(B, M)")
    v = variances[nodes]
    theta_hat = torch.zeros(phis.shape[0], variances.shape[0], dtype=torch.float64)
    theta_hat[:, nodes] = phis * (v / (v + tau2))
    return theta_hat


def orthonormal_rows(W: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis ``(M, D)`` of the row space of ``W (M, D)`` (sign-fixed QR)."""
    check_tensor("W", W, (None, None), "(M, D)")
    q, r = torch.linalg.qr(W.T)
    signs = torch.sign(torch.diagonal(r))
    signs = torch.where(signs == 0, torch.ones_like(signs), signs)
    return (q * signs).T


def optimise_directions(
    tree: TreePrior,
    budget: int,
    tau2: float,
    *,
    steps: int = 400,
    batch: int = 1024,
    lr: float = 0.05,
    seed: int = 0,
    init_noise: float = 0.3,
) -> torch.Tensor:
    """Best fixed (non-adaptive) measurement subspace for the Bayes decoder, by gradient descent.

    Only the row space of ``W`` matters (the noise ``tau^2 W W^T`` scales with ``W``), so the
    directions are parametrised as the orthonormal rows of a free matrix. The objective is the
    Monte Carlo Bayes risk under the Gaussian channel, with fresh samples every step (Adam).
    Starts from the first ``M`` heap-order coordinates plus noise. Returns ``Q (M, D)``.
    """
    check_tree_prior("tree", tree)
    check_budget("budget", budget, tree.depth)
    check_number("tau2", tau2, 0, low_open=True)
    for name, value in (("steps", steps), ("batch", batch)):
        check_int(name, value, 1)
    check_seed("seed", seed)
    gen = torch.Generator().manual_seed(seed)
    W = torch.zeros(budget, tree.dim, dtype=torch.float64)
    W[torch.arange(budget), torch.arange(budget)] = 1.0
    W = W + init_noise * torch.randn(W.shape, generator=gen, dtype=torch.float64) / math.sqrt(tree.dim)
    W.requires_grad_(True)
    opt = torch.optim.Adam([W], lr=lr)
    leaf_thetas = tree.leaf_thetas
    for _ in range(steps):
        idx = torch.randint(0, tree.num_leaves, (batch,), generator=gen)
        theta = leaf_thetas[idx]
        Q = orthonormal_rows(W)
        u = theta @ Q.T + math.sqrt(tau2) * torch.randn(batch, budget, generator=gen, dtype=torch.float64)
        probs = posterior_probs(log_likelihood_directions(tree, Q, u, tau2))
        loss = ((probs @ leaf_thetas - theta) ** 2).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return orthonormal_rows(W.detach())


def optimise_gaussian_rows(
    cov: torch.Tensor,
    budget: int,
    tau2: float,
    *,
    rows: str = "orthonormal",
    steps: int = 400,
    lr: float = 0.1,
    seed: int = 7,
    init_noise: float = 0.1,
) -> tuple[torch.Tensor, float]:
    """The one-layer plan of ``M`` rows that minimises the Gaussian posterior trace, by Adam.

    Minimises ``tr Sigma_post`` (:func:`~fvlib.theory.closed_forms.gaussian_posterior_cov`)
    for the prior covariance ``cov (D, D)``. ``rows="orthonormal"``: the rows are orthonormal
    and the noise is the Gaussian channel ``tau^2 W W^T`` (only the row space matters);
    ``rows="unit"``: unit-norm rows with independent noise ``tau^2 I``, where mixed rows can
    beat measuring the largest variances (chapter 5, *Gaussian prior*). Starts from the first
    ``M`` coordinates plus ``init_noise`` Gaussian noise (seeded). Returns ``(W (M, D), loss)``
    with the loss of the last step.
    """
    if rows not in ("orthonormal", "unit"):
        raise ValueError(f"rows must be 'orthonormal' or 'unit', got {rows!r}")
    cov = torch.as_tensor(cov, dtype=torch.float64)
    if cov.ndim != 2 or cov.shape[0] != cov.shape[1]:
        raise ValueError(f"cov must have shape (D, D), got {tuple(cov.shape)}")
    check_int("budget", budget, 1, cov.shape[0])
    check_number("tau2", tau2, 0, low_open=True)
    check_int("steps", steps, 1)
    check_seed("seed", seed)
    gen = torch.Generator().manual_seed(seed)
    W = torch.eye(cov.shape[0], dtype=torch.float64)[:budget]
    W = W + init_noise * torch.randn(W.shape, generator=gen, dtype=torch.float64)
    W.requires_grad_(True)
    opt = torch.optim.Adam([W], lr=lr)
    for _ in range(steps):
        rows_w = W / W.norm(dim=1, keepdim=True) if rows == "unit" else orthonormal_rows(W)
        # noise tau^2 I: for orthonormal rows this is the Gaussian channel tau^2 W W^T
        loss = torch.trace(gaussian_posterior_cov(cov, rows_w, tau2))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return rows_w.detach(), float(loss.detach())


def mc_contexts(prior, samples: int, n_ctx: int, noise_std: float, seed: int, statistic: bool = True):
    """Shared Monte Carlo contexts: latents ``(S, D)``, signs (tree) and statistics ``g_hat (S, D)``.

    With ``statistic=False`` the statistic is not drawn (``None``): the Gaussian channel does
    not need it, and drawing it costs ``O(N)`` per context.
    """
    check_seed("seed", seed)
    check_instance("prior", prior, Prior)
    gen = torch.Generator().manual_seed(seed)
    if prior.is_tree:
        signs = prior.sample_signs(samples, gen)
        theta = prior.theta_from_signs(signs)
    else:
        signs, theta = None, prior.sample(samples, gen)
    g_hat = sample_statistic(theta, n_ctx, noise_std, gen) if statistic else None
    return theta, signs, g_hat


#: The contexts :func:`evaluate_strategies` hands a strategy at once on the finite-``N`` channel
#: (each context is read on its own, so the chunks change no number; they bound the memory of
#: the posterior over paths, ``(contexts, paths, D)``, at ``10^5`` contexts).
EVALUATION_CHUNK = 8192


def evaluate_strategies(
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    budget: int,
    *,
    samples: int = 4000,
    seed: int = 0,
    strategies=("adaptive_greedy", "nonadaptive_coord", "lmmse"),
    channel: str = "finite",
    directions: torch.Tensor | None = None,
    nodes: torch.Tensor | None = None,
    policy: OptimisedPolicy | None = None,
) -> dict[str, Estimate]:
    """Monte Carlo excess losses of several strategies on the *same* contexts.

    Args:
        channel: ``"finite"`` (the finite-``N`` statistic) or ``"gaussian"`` (the channel
            approximation with ``tau^2 = (E|theta|^2 + sigma^2)/N``).
        directions: ``Q (M, D)`` for ``nonadaptive_opt`` (and the start of ``adaptive_opt``);
            optimised here when omitted (:func:`optimise_directions` with ``seed``).
        policy: the :class:`~fvlib.theory.adaptive_opt.OptimisedPolicy` of ``adaptive_opt``;
            :func:`~fvlib.theory.adaptive_opt.optimise_adaptive_policy` with ``seed`` when
            omitted (``adaptive_opt`` needs ``channel="finite"``).
        nodes: the ``M`` distinct node ids ``(M,)`` read by ``nonadaptive_best_coord``
            (Bayes decoding); ``best_fixed_nodes(tree, M)`` when omitted, i.e. the set that is
            best *without* channel noise (at finite ``N`` another set may do better).
    Returns ``{strategy: Estimate}``; the sample count is in each estimate.
    """
    unknown = set(strategies) - set(strategy_names())
    if unknown:
        raise ValueError(f"unknown strategies {sorted(unknown)}; choose from {strategy_names()}")
    if channel not in CHANNELS:
        raise ValueError(f"channel must be one of {CHANNELS}, got {channel!r}")
    chosen = [get_strategy(name) for name in strategies]
    needs = set().union(*(strategy.needs for strategy in chosen))
    check_tree_prior("tree", tree)
    tau2 = channel_tau2(tree, n_ctx, noise_std)
    check_budget("budget", budget, tree.depth)
    check_int("samples", samples, 1)
    check_seed("seed", seed)
    if nodes is not None:
        nodes = check_nodes(tree, nodes)
        if nodes.numel() != budget:
            raise ValueError(f"nodes must hold budget = {budget} node ids, got {nodes.numel()}")
    elif "nodes" in needs:
        nodes = best_fixed_nodes(tree, budget)
    for strategy in chosen:
        if channel not in strategy.channels:
            raise ValueError(f"{strategy.name} needs channel one of {strategy.channels}, got {channel!r}")
    if directions is None and ("directions" in needs or ("policy" in needs and policy is None)):
        directions = optimise_directions(tree, budget, tau2, seed=seed)
    if "policy" in needs and policy is None:
        policy = optimise_adaptive_policy(tree, budget, tau2, directions=directions, seed=seed)
    theta, _, g_hat = mc_contexts(tree, samples, n_ctx, noise_std, seed, statistic=channel == "finite")
    gen = torch.Generator().manual_seed(seed + 1)

    def make_channel():
        if channel == "finite":
            return FiniteSampleChannel(g_hat)
        return GaussianChannel(theta, math.sqrt(tau2), gen)

    out = {}
    for strategy in chosen:
        if channel == "finite":   # deterministic given g_hat: in chunks of contexts, to bound the memory
            theta_hat = torch.cat([strategy.estimate(tree, FiniteSampleChannel(part), budget, tau2,
                                                     directions=directions, nodes=nodes, policy=policy)
                                   for part in g_hat.split(EVALUATION_CHUNK)])
        else:
            theta_hat = strategy.estimate(tree, make_channel(), budget, tau2, directions=directions, nodes=nodes,
                                          policy=policy)
        out[strategy.name] = Estimate.of(squared_error(theta_hat, theta))
    return out


def strategy_estimate(name: str, tree: TreePrior, chan, budget: int, tau2: float, *, directions=None,
                      nodes=None, policy=None) -> torch.Tensor:
    """``theta_hat (B, D)`` of the registered strategy ``name`` (:func:`get_strategy`) on the ``B``
    contexts of the channel ``chan``, spending ``budget`` measurements; what it needs
    (:attr:`Strategy.needs`): ``directions`` ``(M, D)`` (``nonadaptive_opt``), ``nodes`` ``(M,)``
    (``nonadaptive_best_coord``), ``policy`` (``adaptive_opt``: an
    :class:`~fvlib.theory.adaptive_opt.OptimisedPolicy`)."""
    return get_strategy(name).estimate(tree, chan, budget, tau2, directions=directions, nodes=nodes, policy=policy)


# ----------------------------------------------------------------------------------------
# The registry of strategies
# ----------------------------------------------------------------------------------------
#: ``estimate(tree, channel, budget, tau2, *, directions, nodes, policy) -> theta_hat (B, D)``.
StrategyEstimator = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Strategy:
    """A registered strategy.

    Attributes:
        name: its name (a key of :func:`evaluate_strategies`' results and of the stored experiments).
        estimate: its ``StrategyEstimator``.
        adaptive: it chooses each measurement from what it has read (greedy, the optimised
            adaptive policy); the others fix their measurements in advance.
        needs: what of :data:`STRATEGY_NEEDS` it reads beside the channel.
        channels: the channels of :data:`CHANNELS` it runs on.
        description: one line for listings.
    """

    name: str
    estimate: StrategyEstimator
    adaptive: bool
    needs: frozenset[str]
    channels: tuple[str, ...]
    description: str


_STRATEGIES: Registry[Strategy] = Registry("strategy", "strategy")


def register_strategy(name: str, estimate: StrategyEstimator, *, adaptive: bool, needs=(), channels=CHANNELS,
                      description: str = "") -> Strategy:
    """Register the strategy ``name``; ``ValueError`` if the name is taken, or a need or channel unknown."""
    unknown = (set(needs) - set(STRATEGY_NEEDS)) | (set(channels) - set(CHANNELS))
    if unknown:
        raise ValueError(f"unknown needs or channels {sorted(unknown)}; needs are {STRATEGY_NEEDS}, "
                         f"channels {CHANNELS}")
    strategy = Strategy(name, estimate, bool(adaptive), frozenset(needs), tuple(channels), description)
    return _STRATEGIES.add(name, strategy)


def unregister_strategy(name: str) -> None:
    """Remove the strategy ``name`` (``ValueError`` if it is not registered)."""
    _STRATEGIES.remove(name)


def strategy_names() -> tuple[str, ...]:
    """The registered strategies' names, in the order they were registered."""
    return _STRATEGIES.names()


def get_strategy(name: str) -> Strategy:
    """The registered strategy ``name``; ``ValueError`` naming ``name`` and the registered strategies."""
    return _STRATEGIES.get(name)


def choosing_strategies() -> tuple[str, ...]:
    """The registered strategies that choose their measurements adaptively (:attr:`Strategy.adaptive`)."""
    return tuple(s.name for s in _STRATEGIES.entries() if s.adaptive)


def _greedy_estimate(tree, chan, budget, tau2, **given) -> torch.Tensor:
    return run_greedy(tree, chan, budget, tau2).theta_hat


def _directions_estimate(tree, chan, budget, tau2, *, directions, **given) -> torch.Tensor:
    u = chan.measure(directions)
    return posterior_probs(log_likelihood_directions(tree, directions, u, tau2)) @ tree.leaf_thetas


def _read_nodes(tree, chan, nodes) -> torch.Tensor:
    """``phis (B, M)``: the coordinates ``nodes (M,)`` read through ``chan``."""
    return chan.measure(torch.eye(tree.dim, dtype=torch.float64)[nodes])


def _heap_coordinates_estimate(tree, chan, budget, tau2, **given) -> torch.Tensor:
    nodes = nonadaptive_nodes(tree, budget)
    return bayes_decode_nodes(tree, nodes, _read_nodes(tree, chan, nodes), tau2)


def _node_set_estimate(tree, chan, budget, tau2, *, nodes, **given) -> torch.Tensor:
    return bayes_decode_nodes(tree, nodes, _read_nodes(tree, chan, nodes), tau2)


def _lmmse_estimate(tree, chan, budget, tau2, **given) -> torch.Tensor:
    nodes = nonadaptive_nodes(tree, budget)
    return lmmse_decode_nodes(tree.node_variances, nodes, _read_nodes(tree, chan, nodes), tau2)


def _policy_estimate(tree, chan, budget, tau2, *, policy, **given) -> torch.Tensor:
    return policy.rollout(tree, chan, tau2).theta_hat


register_strategy("adaptive_greedy", _greedy_estimate, adaptive=True,
                  description="greedy coordinates, chosen from the posterior, decoded exactly")
register_strategy("nonadaptive_coord", _heap_coordinates_estimate, adaptive=False,
                  description="the first M nodes in heap order (not the best fixed set), decoded exactly")
register_strategy("lmmse", _lmmse_estimate, adaptive=False,
                  description="the first M nodes in heap order, decoded linearly")
register_strategy("nonadaptive_opt", _directions_estimate, adaptive=False, needs=("directions",),
                  description="optimised fixed directions (optimise_directions), decoded exactly")
register_strategy("nonadaptive_best_coord", _node_set_estimate, adaptive=False, needs=("nodes",),
                  description="a fixed node set (best_fixed_nodes: best without channel noise), decoded exactly")
register_strategy("adaptive_opt", _policy_estimate, adaptive=True, needs=("policy",), channels=("finite",),
                  description="the optimised adaptive policy (fvlib.theory.adaptive_opt), finite-N channel only")


def coordinate_decoder_losses(
    prior: Prior, budget: int, n_ctx: int, noise_std: float, *, samples: int = 20000, seed: int = 0,
    degree: int = 4,
) -> dict[str, Estimate]:
    """Finite-``N`` excess losses of the ``M`` largest-variance coordinates of the pooled statistic,
    decoded linearly and by a radial decoder, on the same Monte Carlo draws.

    Draws ``samples`` contexts (:func:`mc_contexts`, ``seed``), keeps the ``budget`` coordinates of
    largest prior variance (ties by index), fits :func:`~fvlib.theory.decoders.fit_radial_decoder`
    with degree 0 (the best per-coordinate linear shrinkage, whose loss is
    :func:`~fvlib.theory.closed_forms.twin_finite_n_loss` for a Gaussian prior) and with ``degree``
    on the first half of the draws, and scores both on the second half; the unmeasured coordinates
    add their variance. ``budget = D`` decodes the whole statistic. Under the Gaussian channel the
    linear decoder is optimal for a Gaussian prior; at finite ``N`` the statistic is not
    Gaussian-linear and the radial decoder does better (chapters 2 and 5).

    Returns ``{"linear", "radial", "gain"}`` as :class:`Estimate` over the held-out half (``gain``:
    linear minus radial, context by context).
    """
    check_instance("prior", prior, Prior)
    check_int("budget", budget, 1, prior.dim)
    check_int("samples", samples, 4 * (degree + 1))
    theta, _, g_hat = mc_contexts(prior, samples, n_ctx, noise_std, seed)
    theta, g_hat = theta.double(), g_hat.double()
    variances = torch.diagonal(prior.second_moment()).double()
    top = torch.sort(variances, descending=True, stable=True).indices[:budget]
    unmeasured = float(variances.sum() - variances[top].sum())
    half = samples // 2
    g_top, theta_top = g_hat[:, top], theta[:, top]
    errors = {}
    for name, deg in (("linear", 0), ("radial", degree)):
        decoder = fit_radial_decoder(g_top[:half], theta_top[:half], degree=deg)
        errors[name] = decoder.squared_errors(g_top[half:], theta_top[half:]) + unmeasured
    return {"linear": Estimate.of(errors["linear"]), "radial": Estimate.of(errors["radial"]),
            "gain": Estimate.of(errors["linear"] - errors["radial"])}
