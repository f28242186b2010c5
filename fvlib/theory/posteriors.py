"""Exact Bayes posteriors (chapter 2, *In-context regression as Bayesian inference*, and
chapter 6, *Tree prior*).

Tree prior: the posterior is a distribution over the ``2^K`` leaves, kept as log-weights
``(B, 2^K)`` and normalised with log-sum-exp, which stays stable for ``K`` up to 12 and
beyond. Coordinate measurements never materialise the ``(2^K, D)`` leaf matrix: the value of
``theta`` at a node is computed from the leaf index (see :func:`leaf_values_at`).

The likelihood of a measurement is the Gaussian-channel one: ``phi ~ N(theta[a], tau2)`` for a
coordinate ``a`` (or ``u ~ N(Q theta, tau2 I)`` for orthonormal directions ``Q``).

The greedy rule of the adaptive policy is a function of the belief and is here too
(:func:`greedy_action`), below both the strategies that run it and the dynamic programme that
compares it with the optimum.
"""

from __future__ import annotations

import torch

from .._checks import check_int, check_number, check_tensor
from ..priors import TreePrior, check_tree_prior

__all__ = [
    "uniform_log_weights",
    "leaf_values_at",
    "update_with_node",
    "log_likelihood_nodes",
    "log_likelihood_directions",
    "posterior_probs",
    "node_masses",
    "level_node_masses",
    "tree_posterior_mean",
    "tree_posterior_variance",
    "node_posterior_variances",
    "tree_posterior_cov",
    "greedy_action",
]


def _check_tree(tree) -> TreePrior:
    return check_tree_prior("tree", tree)


def _check_leaf_tensor(name: str, tree: TreePrior, value) -> torch.Tensor:
    """``value`` if it is a real ``(B, 2^K)`` tensor (leaf probabilities or log-weights)."""
    return check_tensor(name, value, (None, _check_tree(tree).num_leaves), "(B, 2^K)")


def _check_tau2(tau2) -> float:
    return check_number("tau2", tau2, 0, low_open=True)


def uniform_log_weights(tree: TreePrior, batch: int) -> torch.Tensor:
    """The prior as log-weights, shape ``(batch, 2^K)``."""
    check_int("batch", batch, 0)
    return torch.zeros(batch, _check_tree(tree).num_leaves, dtype=torch.float64)


def leaf_values_at(tree: TreePrior, nodes: torch.Tensor) -> torch.Tensor:
    """``theta_j[nodes[b]]`` for every leaf ``j``: ``nodes (B,)`` -> ``(B, 2^K)``.

    For a node at level ``k`` the leaves under it are one contiguous block of ``2^(K-k)``;
    the first half has ``s_k = -1`` and the second ``s_k = +1``; all other leaves give 0.
    """
    nodes = check_tensor("nodes", nodes, (None,), "(B,)", integer=True).long()
    if nodes.numel() and (nodes.min() < 0 or nodes.max() >= _check_tree(tree).dim):
        raise ValueError(f"nodes must be in [0, {tree.dim - 1}]")
    K = tree.depth
    level = tree.node_levels[nodes]  # (B,)
    offset = nodes - (2**level - 1)  # position of the node within its level
    j = torch.arange(tree.num_leaves)
    block = j[None, :] >> (K - level)[:, None]  # ancestor at that level, per leaf
    sign_bit = (j[None, :] >> (K - 1 - level)[:, None]) & 1
    on_path = block == offset[:, None]
    value = tree.level_scales[level][:, None] * (2 * sign_bit - 1).to(torch.float64)
    return torch.where(on_path, value, torch.zeros((), dtype=torch.float64))


def update_with_node(tree: TreePrior, log_w: torch.Tensor, nodes: torch.Tensor, phi: torch.Tensor,
                     tau2: float) -> torch.Tensor:
    """Bayes update after observing ``phi (B,)`` at ``nodes (B,)``; returns new ``(B, 2^K)`` log-weights.

    Adds ``(phi * t - t^2 / 2) / tau2`` with ``t = theta_j[node]`` (constants dropped).
    """
    _check_tau2(tau2)
    batch = _check_leaf_tensor("log_w", tree, log_w).shape[0]
    check_tensor("nodes", nodes, (batch,), "(B,)", integer=True)
    check_tensor("phi", phi, (batch,), "(B,)")
    t = leaf_values_at(tree, nodes)
    return log_w + (phi[:, None] * t - 0.5 * t * t) / tau2


def log_likelihood_nodes(tree: TreePrior, nodes: torch.Tensor, phis: torch.Tensor, tau2: float) -> torch.Tensor:
    """Log-likelihood of ``phis (B, L)`` measured at ``nodes (B, L)``; returns ``(B, 2^K)``."""
    _check_tau2(tau2)
    nodes = check_tensor("nodes", nodes, (None, None), "(B, L)", integer=True)
    check_tensor("phis", phis, tuple(nodes.shape), "(B, L) like nodes")
    log_w = uniform_log_weights(tree, nodes.shape[0])
    for step in range(nodes.shape[1]):
        log_w = update_with_node(tree, log_w, nodes[:, step], phis[:, step], tau2)
    return log_w


def log_likelihood_directions(tree: TreePrior, Q: torch.Tensor, u: torch.Tensor, tau2: float) -> torch.Tensor:
    """Log-likelihood of ``u = Q theta + tau z`` (orthonormal rows ``Q (M, D)``), ``u (B, M)`` -> ``(B, 2^K)``."""
    _check_tau2(tau2)
    Q = check_tensor("Q", Q, (None, _check_tree(tree).dim), "(M, D)")
    check_tensor("u", u, (None, Q.shape[0]), "(B, M)")
    means = tree.leaf_thetas @ Q.T  # (J, M)
    return (u @ means.T - 0.5 * (means * means).sum(-1)) / tau2


def posterior_probs(log_w: torch.Tensor) -> torch.Tensor:
    """Normalised leaf probabilities ``(B, 2^K)`` from log-weights (log-sum-exp safe)."""
    return torch.softmax(check_tensor("log_w", log_w, (None, None), "(B, 2^K)"), dim=-1)


def level_node_masses(tree: TreePrior, probs: torch.Tensor, level: int) -> torch.Tensor:
    """Probability that the path passes each node of ``level``: ``(B, 2^K)`` -> ``(B, 2^level)``."""
    _check_leaf_tensor("probs", tree, probs)
    check_int("level", level, 0, tree.depth - 1)
    return probs.reshape(probs.shape[0], 2**level, -1).sum(-1)


def node_masses(tree: TreePrior, probs: torch.Tensor) -> torch.Tensor:
    """``P(node on the path)`` for all nodes in heap order, ``(B, D)``."""
    return torch.cat([level_node_masses(tree, probs, k) for k in range(tree.depth)], dim=-1)


def tree_posterior_mean(tree: TreePrior, probs: torch.Tensor) -> torch.Tensor:
    """``E[theta | data]`` from leaf probabilities: ``(B, 2^K)`` -> ``(B, D)``.

    For a node at level ``k``: ``alpha^(k/2) (P(through it, s_k=+1) - P(through it, s_k=-1))``.
    Costs ``O(B 2^K K)``, never forming the ``(2^K, D)`` leaf matrix.
    """
    B = _check_leaf_tensor("probs", tree, probs).shape[0]
    parts = []
    for k in range(tree.depth):
        halves = probs.reshape(B, 2**k, 2, -1).sum(-1)  # (B, 2^k, 2)
        parts.append(tree.level_scales[k] * (halves[..., 1] - halves[..., 0]))
    return torch.cat(parts, dim=-1)


def tree_posterior_variance(tree: TreePrior, probs: torch.Tensor) -> torch.Tensor:
    """Bayes risk of a belief, ``E|theta - E theta|^2 = E|theta|^2 - |E theta|^2``; ``(B,)``.

    Uses that ``|theta|^2`` is the same for every leaf.
    """
    mean = tree_posterior_mean(tree, probs)
    return tree.energy - (mean * mean).sum(-1)


def node_posterior_variances(tree: TreePrior, probs: torch.Tensor) -> torch.Tensor:
    """``Var(theta_n | data)`` for every node, ``(B, D)``."""
    mean = tree_posterior_mean(tree, probs)
    scales2 = (tree.level_scales**2)[tree.node_levels]
    return scales2 * node_masses(tree, probs) - mean * mean


def tree_posterior_cov(tree: TreePrior, probs: torch.Tensor) -> torch.Tensor:
    """Posterior covariance ``(B, D, D)`` of ``theta`` under a tree prior, from leaf
    probabilities ``probs (B, 2^K)``: ``sum_j p_j theta_j theta_j^T - mean mean^T``."""
    probs = _check_leaf_tensor("probs", tree, probs).to(torch.float64)
    leaves = tree.leaf_thetas.to(torch.float64)
    mean = probs @ leaves
    second = torch.einsum("bj,jd,je->bde", probs, leaves, leaves)
    return second - mean[:, :, None] * mean[:, None, :]


def greedy_action(tree: TreePrior, log_w: torch.Tensor, step: int,
                  measured: torch.Tensor | None = None) -> torch.Tensor:
    """The greedy node for each context at ``step`` (0-based); ``log_w (B, 2^K)`` -> ``(B,)``.

    Greedy rule ("follow the most probable path"): at step ``l < K`` measure the node of level
    ``l`` with the largest posterior mass. Beyond the tree depth (``l >= K``) measure the
    not-yet-measured node with the largest posterior variance (the design leaves this case open).
    ``measured`` is an optional ``(B, D)`` boolean mask of nodes already measured, used only
    beyond the tree depth. ``step`` is in ``[0, D - 1]``: a budget never exceeds ``D``.
    """
    batch = _check_leaf_tensor("log_w", tree, log_w).shape[0]
    check_int("step", step, 0, tree.dim - 1)
    if measured is not None and (not isinstance(measured, torch.Tensor) or measured.dtype != torch.bool
                                 or tuple(measured.shape) != (batch, tree.dim)):
        raise ValueError(f"measured must be a boolean tensor of shape (B, D) = {(batch, tree.dim)}, got "
                         f"{tuple(measured.shape) if isinstance(measured, torch.Tensor) else type(measured).__name__}")
    probs = posterior_probs(log_w)
    if step < tree.depth:
        masses = level_node_masses(tree, probs, step)
        return masses.argmax(-1) + (2**step - 1)
    variances = node_posterior_variances(tree, probs)
    if measured is not None:
        variances = variances.masked_fill(measured, -1.0)
    return variances.argmax(-1)
