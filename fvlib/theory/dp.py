"""Dynamic programming over coordinate actions, for small trees (chapter 4, *Choosing what to
measure*).

Setting: the Gaussian channel with noise std ``tau`` given directly; each of the ``L`` layers
measures one node ``a`` and observes ``phi ~ N(theta[a], tau^2)`` (fresh noise, so measuring a
node again is allowed and useful: :func:`dp_value`). A transformer pools one statistic, so
measuring a node again returns the same number: :func:`dp_no_repeat` is the same DP over
policies that never measure a node twice. With belief ``b`` over the ``2^K`` leaves::

    V_L(b) = E_b |theta - E_b theta|^2,     V_l(b) = min_a E[ V_{l+1}(b') | b, a ].

The expectation over ``phi`` is a mixture of at most three Gaussians (``theta[a]`` is ``-c``,
``0`` or ``+c`` across leaves), integrated with Gauss-Hermite quadrature around each centre.
The posterior is a steep logistic in ``phi``, so few nodes are not enough: 12 points leave
about 1% error; the default 48 is accurate.

Cost. Let ``P`` be the number of observation points of one measurement (``P = 3Q`` for the
Gauss-Hermite rule with ``Q`` points per centre, ``P = Q`` for the grid), ``D = 2^K - 1`` and
``J = 2^K``. The optimal policy tries ``K`` nodes at the prior and ``D`` at every later step;
each tried node turns a belief into ``P`` child beliefs, and the last step is evaluated in
closed form (``_last_step_value``: ``O(J^2 + P)`` per (belief, node) pair). In all
``K (D P)^(L-1)`` (belief, node) pairs reach the last step, about ``K (D P)^(L-1) (P + J^2)``
operations; greedy and non-adaptive reach ``P^(L-1)`` pairs. Only ``K <= 3`` is supported.

At the uniform prior all nodes of a level are equivalent (the tree's symmetries preserve the
prior and the loss), so the first decision only tries one node per level.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import torch

from .._checks import check_int, check_number, check_tensor
from ..priors import TreePrior, check_tree_prior
from .posteriors import greedy_action, leaf_values_at, posterior_probs, tree_posterior_variance, uniform_log_weights

__all__ = ["dp_value", "dp_no_repeat", "greedy_value", "policy_value", "optimal_actions", "dp_policy_tree",
           "MAX_DP_DEPTH", "MAX_DP_LAYERS"]

MAX_DP_DEPTH = 3
#: The most measurements the exact DP takes (its cost grows as ``(D P)^(L-1)``, see above).
MAX_DP_LAYERS = 4
#: The policies :func:`policy_value` evaluates.
POLICIES = ("optimal", "no_repeat", "greedy", "nonadaptive")
MAX_HERMITE_POINTS = 256
MAX_GRID_POINTS = 8192
_CHUNK = 16384


def _check(tree: TreePrior, n_layers: int, tau: float, quad_points: int, rule: str):
    """Validate the DP arguments; returns the quadrature spec ``(quad_points, rule)``."""
    check_tree_prior("tree", tree)
    if tree.depth > MAX_DP_DEPTH:
        raise ValueError(f"the exact DP supports tree depth <= {MAX_DP_DEPTH}, got depth {tree.depth}")
    check_int("n_layers", n_layers, 1, min(MAX_DP_LAYERS, tree.dim))
    check_number("tau", tau, 0, low_open=True)
    if rule not in ("hermite", "grid"):
        raise ValueError(f"rule must be 'hermite' or 'grid', got {rule!r}")
    # numpy's Gauss-Hermite weights overflow beyond a few hundred points; the grid has no such limit
    most = MAX_HERMITE_POINTS if rule == "hermite" else MAX_GRID_POINTS
    check_int(f"quad_points (rule {rule!r})", quad_points, 2, most)
    return quad_points, rule


@cache
def _hermite(quad_points: int):
    x, w = np.polynomial.hermite.hermgauss(quad_points)
    return torch.tensor(x, dtype=torch.float64), torch.tensor(w / math.sqrt(math.pi), dtype=torch.float64)


def _observation_grid(tree: TreePrior, node: int, tau: float, quad_points: int, rule: str = "hermite"):
    """Quadrature for the observation at ``node``.

    Returns ``t (J,)`` (theta of each leaf at the node), the centres ``(-c, 0, +c)``, the group
    masks ``(3, J)``, the observation points ``phi (P,)`` and weights ``(3, P)`` such that
    ``E f(phi) = sum_p (mass @ weights)[p] f(phi_p)`` for a belief with group masses ``mass``.

    ``rule="hermite"``: Gauss-Hermite with ``quad_points`` nodes around each centre (``P = 3Q``).
    ``rule="grid"``: ``quad_points`` evenly spaced points on ``[-c - 9 tau, c + 9 tau]`` shared by
    the three centres, weights from the Gaussian densities (converges more steadily when the
    integrand has kinks, as the DP value function does).
    """
    t = leaf_values_at(tree, torch.tensor([node]))[0]
    c = float(tree.level_scales[tree.node_levels[node]])
    centres = torch.tensor([-c, 0.0, c], dtype=torch.float64)
    masks = (t[None, :] == centres[:, None]).double()
    if rule == "grid":
        phi = torch.linspace(-c - 9 * tau, c + 9 * tau, quad_points, dtype=torch.float64)
        density = torch.exp(-((phi - centres[:, None]) ** 2) / (2 * tau * tau))
        return t, centres, masks, phi, density / density.sum(-1, keepdim=True)
    x, w = _hermite(quad_points)
    phi = (centres[:, None] + math.sqrt(2.0) * tau * x).reshape(-1)
    weights = torch.block_diag(w[None, :], w[None, :], w[None, :])
    return t, centres, masks, phi, weights


def _children(tree: TreePrior, log_w: torch.Tensor, node: int, tau: float, quad):
    """Beliefs after measuring ``node`` at every quadrature point of the observation.

    Returns child log-weights ``(B, P, 2^K)`` and their probabilities ``(B, P)`` (rows sum to 1).
    """
    t, _, masks, phi, weights = _observation_grid(tree, node, tau, *quad)
    weight = posterior_probs(log_w) @ masks.T @ weights  # (B, P)
    child = log_w[:, None, :] + (phi[:, None] * t - 0.5 * t * t) / tau**2
    return child, weight


def _value(tree, log_w, steps_left, tau, quad, policy, step, first=False, measured=frozenset()):
    """Expected final risk ``(B,)`` from beliefs ``log_w (B, J)`` with ``steps_left`` measurements.

    ``policy`` is ``"optimal"`` (minimise over all nodes), ``"no_repeat"`` (minimise over the
    nodes not in ``measured``, the nodes this branch has measured already), ``"greedy"`` or
    ``"nonadaptive"`` (node ``step`` in heap order, whatever was observed). All beliefs of one
    call share their history of actions, hence one ``measured`` set.
    """
    if steps_left == 0:
        return tree_posterior_variance(tree, posterior_probs(log_w))
    if log_w.shape[0] > _CHUNK:
        return torch.cat([_value(tree, c, steps_left, tau, quad, policy, step, measured=measured)
                          for c in log_w.split(_CHUNK)])
    if policy == "nonadaptive":
        return _action_value(tree, log_w, step, steps_left, tau, quad, policy, step)
    if policy == "greedy":
        nodes = greedy_action(tree, log_w, step)
        out = torch.empty(log_w.shape[0], dtype=torch.float64)
        for node in nodes.unique().tolist():
            rows = nodes == node
            out[rows] = _action_value(tree, log_w[rows], node, steps_left, tau, quad, policy, step)
        return out
    candidates = _root_candidates(tree) if first else [a for a in range(tree.dim) if a not in measured]
    values = [_action_value(tree, log_w, a, steps_left, tau, quad, policy, step, measured) for a in candidates]
    return torch.stack(values, dim=1).min(dim=1).values


def _action_value(tree, log_w, node, steps_left, tau, quad, policy, step, measured=frozenset()):
    """Expected final risk ``(B,)`` when measuring ``node`` now, then following ``policy``."""
    if steps_left == 1:
        return _last_step_value(tree, log_w, node, tau, quad)
    child, weight = _children(tree, log_w, node, tau, quad)
    B, P, J = child.shape
    after = measured | {node} if policy == "no_repeat" else measured
    v = _value(tree, child.reshape(B * P, J), steps_left - 1, tau, quad, policy, step + 1, measured=after)
    return (weight * v.reshape(B, P)).sum(-1)


def _last_step_value(tree, log_w, node, tau, quad):
    """Expected final risk ``(B,)`` after one last measurement of ``node``, without child beliefs.

    Leaves split into three groups by ``theta[a] in {-c, 0, +c}``. With group masses ``m_g``,
    unnormalised group means ``mu_g`` and likelihood factors ``e_g(phi)``, the posterior mean
    after observing ``phi`` is ``sum_g e_g mu_g / sum_g e_g m_g``, hence
    ``|E theta|^2 = e^T G e / (e^T m)^2`` with the 3 x 3 Gram matrix ``G = mu mu^T``. The
    factors ``e`` depend only on the quadrature points, so every belief costs two small matmuls.
    """
    t, centres, masks, phi, weights = _observation_grid(tree, node, tau, *quad)
    probs = posterior_probs(log_w)
    B = probs.shape[0]
    mass = probs @ masks.T  # (B, 3)
    gram = (probs[:, :, None] * probs[:, None, :]).reshape(B, -1) @ _group_gram_kernel(tree, masks)  # (B, 9)
    log_e = (phi[:, None] * centres - 0.5 * centres**2) / tau**2  # (P, 3)
    e = torch.exp(log_e - log_e.amax(-1, keepdim=True))
    pair = (e[:, :, None] * e[:, None, :]).reshape(-1, 9)  # (P, 9)
    numerator = gram @ pair.T  # (B, P)
    normaliser = mass @ e.T  # (B, P)
    weight = mass @ weights
    # A normaliser below 1e-140 only occurs where the point's own group has mass < 1e-129
    # (e_g >= exp(-24.5) at every quadrature node of non-negligible weight), so dropping
    # those points changes nothing measurable and avoids 0/0.
    safe = normaliser > 1e-140
    ratio = torch.where(safe, numerator / torch.where(safe, normaliser, 1.0) ** 2, 0.0)
    return tree.energy - (weight * ratio).sum(-1)


def _group_gram_kernel(tree: TreePrior, masks: torch.Tensor) -> torch.Tensor:
    """``A[(j, k), (g, h)] = mask_g(j) mask_h(k) <theta_j, theta_k>``, shape ``(J*J, 9)``.

    With it the group Gram matrix of a belief ``p`` is ``(p p^T).flatten() @ A``.
    """
    inner = tree.leaf_thetas @ tree.leaf_thetas.T  # (J, J)
    kernel = masks[:, None, :, None] * masks[None, :, None, :] * inner  # (3, 3, J, J)
    return kernel.reshape(9, -1).T


def _root_candidates(tree: TreePrior) -> list[int]:
    return [2**k - 1 for k in range(tree.depth)]


def policy_value(
    tree: TreePrior, n_layers: int, tau: float, policy: str = "optimal", quad_points: int = 48, rule: str = "hermite"
) -> float:
    """Expected final risk of ``policy`` from the prior, by quadrature.

    ``policy``: ``"optimal"`` (the DP), ``"no_repeat"`` (the DP over policies that never
    measure a node twice), ``"greedy"`` or ``"nonadaptive"`` (the first ``n_layers`` nodes in
    heap order). All share the same quadrature, so their values are directly comparable:
    optimal <= no_repeat <= greedy (for ``n_layers <= K``, where greedy never repeats a node),
    and no_repeat <= nonadaptive.
    """
    quad = _check(tree, n_layers, tau, quad_points, rule)
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    prior = uniform_log_weights(tree, 1)
    return float(_value(tree, prior, n_layers, float(tau), quad, policy, 0, first=True)[0])


def dp_value(tree: TreePrior, n_layers: int, tau: float, quad_points: int = 48, rule: str = "hermite") -> float:
    """Bayes risk of the DP-optimal coordinate policy, ``V_0(prior)``."""
    return policy_value(tree, n_layers, tau, "optimal", quad_points, rule)


def dp_no_repeat(tree: TreePrior, n_layers: int, tau: float, quad_points: int = 48, rule: str = "hermite") -> float:
    """Bayes risk of the best coordinate policy that never measures a node twice.

    This is the optimum on the channel a transformer has: its measurements are functions of one
    pooled statistic ``g_hat``, so measuring a node again returns the same number and adds
    nothing, while :func:`dp_value` (fresh noise at every measurement) gains from repeats.
    Coordinates are orthogonal, so without repeats the Gaussian channel's noises are independent
    exactly as in :func:`dp_value`. ``dp_value <= dp_no_repeat``.
    """
    return policy_value(tree, n_layers, tau, "no_repeat", quad_points, rule)


def greedy_value(tree: TreePrior, n_layers: int, tau: float, quad_points: int = 48, rule: str = "hermite") -> float:
    """Bayes risk of the greedy "follow the most probable path" policy, by the same quadrature."""
    return policy_value(tree, n_layers, tau, "greedy", quad_points, rule)


def optimal_actions(tree: TreePrior, log_w: torch.Tensor, steps_left: int, tau: float, quad_points: int = 48,
                    rule: str = "hermite"):
    """Optimal next node and the value of every node for beliefs ``log_w (B, J)``.

    Returns ``(best (B,), values (B, D))`` where ``values[:, a]`` is the expected final risk
    when measuring ``a`` now and acting optimally afterwards (``steps_left`` measurements in all).
    """
    quad = _check(tree, steps_left, tau, quad_points, rule)
    check_tensor("log_w", log_w, (None, tree.num_leaves), "(B, 2^K)")
    values = torch.stack(
        [_action_value(tree, log_w, a, steps_left, float(tau), quad, "optimal", 0) for a in range(tree.dim)], dim=1
    )
    return values.argmin(dim=1), values


def dp_policy_tree(tree: TreePrior, n_layers: int, tau: float, phi_grid=None, quad_points: int = 48,
                   rule: str = "hermite") -> dict:
    """The optimal policy as a decision tree over observation intervals.

    Each node of the returned nested dict is ``{"node": a, "value": v, "branches": [...]}``: measure
    ``a`` now; ``v`` is the expected final risk from here. A branch is
    ``{"phi_range": (lo, hi), **subtree}``: when this step's observation falls in ``[lo, hi)`` the
    policy continues with ``subtree``. Intervals come from scanning ``phi_grid`` (default: 81
    points in ``[-2, 2]``) and merging neighbours with the same next node; each interval's
    subtree is computed at its middle grid point.
    """
    quad = _check(tree, n_layers, tau, quad_points, rule)
    if phi_grid is None:
        grid = torch.linspace(-2.0, 2.0, 81, dtype=torch.float64)
    else:
        grid = torch.as_tensor(phi_grid, dtype=torch.float64)
    if grid.ndim != 1 or grid.numel() < 1:
        raise ValueError(f"phi_grid must be a non-empty 1-D grid, got shape {tuple(grid.shape)}")
    prior = uniform_log_weights(tree, 1)
    best, values = optimal_actions(tree, prior, n_layers, tau, *quad)
    return _policy_subtree(tree, prior, int(best[0]), float(values[0].min()), n_layers, float(tau), grid, quad)


def _policy_subtree(tree, log_w, node, value, steps_left, tau, grid, quad):
    out = {"node": node, "value": value, "branches": []}
    if steps_left <= 1:
        return out
    t = leaf_values_at(tree, torch.tensor([node]))
    beliefs = log_w + (grid[:, None] * t - 0.5 * t * t) / tau**2  # (G, J)
    best, values = optimal_actions(tree, beliefs, steps_left - 1, tau, *quad)
    start = 0
    for i in range(1, len(grid) + 1):
        if i < len(grid) and best[i] == best[start]:
            continue
        lo = -math.inf if start == 0 else float((grid[start - 1] + grid[start]) / 2)
        hi = math.inf if i == len(grid) else float((grid[i - 1] + grid[i]) / 2)
        mid = (start + i - 1) // 2
        sub = _policy_subtree(tree, beliefs[mid : mid + 1], int(best[mid]), float(values[mid].min()), steps_left - 1,
                              tau, grid, quad)
        out["branches"].append({"phi_range": (lo, hi), **sub})
        start = i
    return out
