"""Closed forms: the channel noise ``tau^2`` (the book's appendix *Conventions*, section "Measurements and the
channel"), the noise-free tree losses (chapter 6, *Tree prior*) and the Gaussian posteriors
(chapter 5, *Gaussian prior*)."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import torch

from .._checks import check_instance, check_int, check_number, check_tensor
from ..priors import Prior, TreePrior, check_tree_prior
from ..task import check_task_args

__all__ = [
    "channel_tau2",
    "noisefree_adaptive_loss",
    "noisefree_nonadaptive_loss",
    "noisefree_nodes_loss",
    "noisefree_layered_loss",
    "best_fixed_nodes",
    "best_fixed_method",
    "fixed_set_lower_bound",
    "DP_MAX_DEPTH",
    "FIXED_SET_METHODS",
    "gaussian_coordinate_loss",
    "gaussian_posterior",
    "gaussian_posterior_cov",
    "finite_n_covariance",
    "twin_finite_n_loss",
]


def channel_tau2(prior: Prior, n_ctx: int, noise_std: float) -> float:
    """Gaussian-channel noise variance ``tau^2 = (E|theta|^2 + sigma^2) / N``."""
    check_instance("prior", prior, Prior)
    check_task_args(n_ctx, noise_std)
    return (prior.energy + noise_std**2) / n_ctx


def noisefree_adaptive_loss(tree: TreePrior, n_layers: int) -> float:
    """Adaptive greedy, no channel noise, ``L`` layers: ``sum_{k >= L} alpha^k`` (~ alpha^L)."""
    _check_tree(tree)
    check_int("budget", n_layers, 1)
    return float(sum(tree.alpha**k for k in range(n_layers, tree.depth)))


def noisefree_nonadaptive_loss(tree: TreePrior, budget: int) -> float:
    """Non-adaptive coordinates in heap order, no channel noise, budget ``M = 2^m - 1 + r``.

    Leaves ``alpha^m (1 - r / 2^m) + sum_{k > m} alpha^k``, roughly ``(M + 1)^(log2 alpha)``.
    Heap order is *not* the best fixed coordinate set (see :func:`best_fixed_nodes`); this
    is the loss of the ``nonadaptive_coord`` strategy without noise.
    """
    _check_tree(tree)
    check_int("budget", budget, 1)
    if budget >= tree.dim:
        return 0.0
    m = (budget + 1).bit_length() - 1  # largest m with 2^m - 1 <= M
    r = budget - (2**m - 1)
    tail = sum(tree.alpha**k for k in range(m + 1, tree.depth))
    return float(tree.alpha**m * (1 - r / 2**m) + tail)


def _check_tree(tree) -> TreePrior:
    return check_tree_prior("tree", tree)


def _variances(variances) -> torch.Tensor:
    """``variances`` as a 1-D float64 tensor (a list or array is converted)."""
    v = torch.as_tensor(variances, dtype=torch.float64)
    if v.ndim != 1:
        raise ValueError(f"variances must have shape (D,), got {tuple(v.shape)}")
    return v


def _check_tau2(tau2) -> float:
    return check_number("tau2", tau2, 0)


def check_nodes(tree: TreePrior, nodes) -> torch.Tensor:
    """``nodes`` (node ids of ``tree``) as a 1-D LongTensor of distinct ids in ``[0, D)`` (heap order).

    Raises:
        ValueError: ``nodes`` not integer ids, not distinct, or outside ``[0, D)``.
    """
    if isinstance(nodes, torch.Tensor):
        if nodes.dtype.is_floating_point or nodes.dtype.is_complex or nodes.dtype == torch.bool:
            raise ValueError(f"nodes must hold integer node ids, got dtype {nodes.dtype}")
        t = nodes.detach().cpu().long()
    else:
        items = list(nodes)
        for n in items:
            if isinstance(n, bool) or not isinstance(n, (int, torch.Tensor)) and not hasattr(n, "__index__"):
                raise ValueError(f"nodes must hold integer node ids, got {n!r}")
        t = torch.tensor([int(n) for n in items], dtype=torch.long)
    if t.ndim != 1:
        raise ValueError(f"nodes must be one-dimensional, got shape {tuple(t.shape)}")
    bad = t[(t < 0) | (t >= tree.dim)]
    if bad.numel():
        raise ValueError(f"node ids must be in [0, D) = [0, {tree.dim}), got {int(bad[0])}")
    uniq, counts = torch.unique(t, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"nodes must be distinct, node {int(uniq[counts > 1][0])} is repeated")
    return t


def _nodes_losses(tree: TreePrior, sets: torch.Tensor) -> torch.Tensor:
    """Noise-free Bayes losses of many fixed node sets at once: ``sets (C, M)`` -> ``(C,)``.

    NumPy arrays in and out (small arrays: NumPy is several times faster than torch here).

    Exact, by a recursion over subtrees that groups the ``2^K`` leaves by what they read (the
    same result as enumerating the leaves, in ``O(D)`` per set). Condition on the path passing
    node ``n`` (level ``k``, children ``a`` and ``b``) and keep, over the leaves below ``n``:
    ``z_n`` the number of leaves whose reads below ``n`` (``n`` included) are all zero,
    ``Q_n`` the squared norm of the sum of their ``theta`` (restricted to the subtree) and
    ``E_n`` the summed squared error of the Bayes mean (group means) on the subtree. A non-zero
    read below ``n`` puts the path on one side, so only the all-zero outcomes of ``a`` and
    ``b`` merge: if ``n`` is not read, ``z_n = z_a + z_b``,
    ``Q_n = Q_a + Q_b + alpha^k (z_b - z_a)^2`` and ``E_n = E_a + E_b - E0_a - E0_b + E0_n``
    with ``E0 = z e - Q / z`` the error of the all-zero group (``e`` the energy of the levels
    of the subtree); if ``n`` is read, its sign is known and ``E_n = E_a + E_b``, ``z_n = 0``.
    Below the last level each leaf is a group of one. The loss is ``E_root / 2^K``.
    """
    K = tree.depth
    sets = np.asarray(sets, dtype=np.int64)
    C = sets.shape[0]
    read = np.zeros((C, tree.dim), dtype=bool)
    if sets.size:
        read[np.arange(C)[:, None], sets] = True
    tails = [sum(tree.alpha**j for j in range(k, K)) for k in range(K + 1)]  # e_k

    def zero_group_error(z, q, e):  # an empty group (z = 0) has q = 0: no error
        return z * e - q / np.maximum(z, 1.0)

    z = np.ones((C, 2**K))
    q = np.zeros((C, 2**K))
    err = np.zeros((C, 2**K))
    for k in range(K - 1, -1, -1):
        za, zb, qa, qb = z[:, 0::2], z[:, 1::2], q[:, 0::2], q[:, 1::2]
        children_err = err[:, 0::2] + err[:, 1::2]
        is_read = read[:, 2**k - 1: 2 ** (k + 1) - 1]  # (C, 2^k)
        z_n = za + zb
        q_n = qa + qb + tree.alpha**k * (zb - za) ** 2
        e0 = zero_group_error(za, qa, tails[k + 1]) + zero_group_error(zb, qb, tails[k + 1])
        err_n = children_err - e0 + zero_group_error(z_n, q_n, tails[k])
        z = np.where(is_read, 0.0, z_n)
        q = np.where(is_read, 0.0, q_n)
        err = np.where(is_read, children_err, err_n)
    return np.maximum(err[:, 0] / 2**K, 0.0)


def noisefree_nodes_loss(tree: TreePrior, nodes) -> float:
    """Exact noise-free Bayes excess loss ``E|theta_hat - theta|^2`` of a fixed node set.

    Measures the coordinates ``theta_n`` for ``n`` in ``nodes`` (a LongTensor or sequence of
    distinct node ids in heap order, shape ``(M,)``, ``M >= 0``) without channel noise, the
    same nodes for every context, and decodes with the Bayes posterior mean. By enumeration
    over the ``2^K`` leaves: leaves that read the same values are indistinguishable, so the
    posterior is uniform on each such group and the Bayes mean is the group mean. For the
    first ``M`` nodes in heap order this equals :func:`noisefree_nonadaptive_loss`.
    Computed by an exact recursion over subtrees in ``O(2^K)``, without forming the leaf
    matrix (see the source of ``_nodes_losses``).
    """
    tree = _check_tree(tree)
    t = check_nodes(tree, nodes)
    return float(_nodes_losses(tree, t[None].numpy())[0])


#: Trees up to this depth get the exact best fixed set for every budget from the dynamic
#: program over subtrees (about 0.2 s for all budgets at ``K = 6``; ``K = 7`` would take seconds).
DP_MAX_DEPTH = 6

#: The searches of :func:`best_fixed_nodes`; all but ``"local"`` are exact.
FIXED_SET_METHODS = ("dp", "exhaustive", "local")


def fixed_set_lower_bound(tree: TreePrior, budget: int) -> float:
    """``sum_k alpha^k max(0, 1 - M / 2^k)``: no fixed set of ``M`` coordinates read without
    noise (or with it) leaves less (chapter 6, proposition "The best fixed set of coordinates",
    item 1). The path node of level ``k`` is uniform over the ``2^k`` nodes of the level and
    at most ``M`` of their disjoint subtrees hold a read node; when its subtree holds none,
    the sign there stays a fair coin and costs ``alpha^k``."""
    _check_tree(tree)
    check_int("budget", budget, 0)
    return float(sum(tree.alpha**k * max(0.0, 1 - budget / 2**k) for k in range(tree.depth)))


def best_fixed_method(tree: TreePrior, budget: int, *, exact_limit: int = 20_000) -> str:
    """The search that :func:`best_fixed_nodes` uses by default: ``"dp"`` (depth at most
    :data:`DP_MAX_DEPTH`), ``"exhaustive"`` (``comb(D, M) <= exact_limit``) or ``"local"``.
    The first two are exact; ``"local"`` gives an upper bound on the best loss."""
    _check_tree(tree)
    check_int("budget", budget, 1)
    check_int("exact_limit", exact_limit, 1)
    if tree.depth <= DP_MAX_DEPTH:
        return "dp"
    return "exhaustive" if math.comb(tree.dim, budget) <= exact_limit else "local"


def best_fixed_nodes(tree: TreePrior, budget: int, *, exact_limit: int = 20_000,
                     method: str | None = None) -> torch.Tensor:
    """The fixed coordinate set of ``M = budget`` nodes with the smallest noise-free Bayes loss.

    Returns the node ids, sorted, as a LongTensor of shape ``(M,)``; its loss is
    ``noisefree_nodes_loss(tree, nodes)``. Heap order is not the best set: the ``2^(L-1)``
    nodes of level ``L-1`` alone give the first ``L`` signs (exactly one of them is non-zero;
    its position gives the path above it and its value the next sign).

    ``method`` (default :func:`best_fixed_method`, which says which one is used):

    * ``"dp"``: exact, a dynamic program over subtrees (see ``_best_sets_dp``), for every
      budget at once; the default up to depth :data:`DP_MAX_DEPTH`. Ties go to the set that
      is lexicographically first among the candidates the program keeps.
    * ``"exhaustive"``: exact, every ``M``-subset is scored (ties go to the lexicographically
      first set); the default for deeper trees when ``comb(D, M) <= exact_limit``.
    * ``"local"``: a deterministic local search, so the result is an upper bound on the
      optimum, not a proof. It starts from heap order, from a greedy forward selection (add
      the node that lowers the loss most, one at a time), from the leftmost ``M`` nodes of
      every level with at least ``M`` nodes and from every complete level with fewer nodes
      completed by greedy additions; from each start it swaps one chosen node for one
      unchosen node as long as the best swap lowers the loss, and keeps the best result (the
      first start wins ties). Never worse than heap order.
    """
    tree = _check_tree(tree)
    check_int("budget", budget, 1)
    if budget > tree.dim:
        raise ValueError(f"budget must be <= D = {tree.dim}, got {budget}")
    check_int("exact_limit", exact_limit, 1)
    if method is None:
        method = best_fixed_method(tree, budget, exact_limit=exact_limit)
    if method not in FIXED_SET_METHODS:
        raise ValueError(f"method must be one of {FIXED_SET_METHODS}, got {method!r}")
    tol = 1e-12
    if method == "dp":
        return torch.tensor(_best_sets_dp(tree.depth, tree.alpha)[budget][1], dtype=torch.long)
    if method == "exhaustive":
        return _exhaustive_search(tree, budget, tol)
    return _local_search(tree, budget, tol)


def _exhaustive_search(tree: TreePrior, M: int, tol: float) -> torch.Tensor:
    best, best_loss = None, math.inf
    combos = itertools.combinations(range(tree.dim), M)
    while True:
        block = list(itertools.islice(combos, 16384))
        if not block:
            break
        sets = np.array(block, dtype=np.int64)
        losses = _nodes_losses(tree, sets)
        i = int(np.argmin(losses))
        if losses[i] < best_loss - tol:
            best, best_loss = sets[i], float(losses[i])
    return torch.from_numpy(best.copy())


def _zero_group_error(z: int, q: float, energy: float) -> float:
    """Error of a group of ``z`` leaves whose summed ``theta`` has squared norm ``q``."""
    return z * energy - q / z if z else 0.0


def _first_best(pairs) -> tuple:
    """The ``(value, nodes)`` pair with the smallest value; near ties (1e-9) go to the
    lexicographically first node tuple."""
    return min(pairs, key=lambda p: (round(p[0], 9), p[1]))


def _pareto(states: list, tol: float = 1e-12) -> list:
    """Keep, for each ``z``, the states that no other beats in both ``q`` (larger is better)
    and ``f`` (smaller is better); exact ties keep the lexicographically first node set."""
    by_z: dict[int, list] = {}
    for s in states:
        by_z.setdefault(s[0], []).append(s)
    kept = []
    for z in sorted(by_z):
        best_f = math.inf
        for s in sorted(by_z[z], key=lambda s: (-round(s[1], 9), round(s[2], 9), s[3])):
            if s[2] < best_f - tol:
                kept.append(s)
                best_f = s[2]
    return kept


@functools.lru_cache(maxsize=8)
def _best_sets_dp(depth: int, alpha: float) -> tuple:
    """Exact best fixed sets of every budget: ``result[M] = (loss, sorted node ids)``.

    The recursion of ``_nodes_losses`` describes a set, below a node ``n``, by
    ``(z, q, f)``: ``z`` leaves whose reads below ``n`` are all zero, ``q`` the squared norm
    of their summed ``theta`` (restricted to the subtree) and ``f`` the error of all the
    other, finished groups. The final loss ``(f + z e - q / z) / 2^K`` at the root grows
    with ``f`` and falls with ``q`` at fixed ``z``, and so does every merge on the way up,
    so for each node, budget and ``z`` only the Pareto front in ``(q, f)`` can lead to an
    optimum. The program builds these fronts from the leaves up: an unread node merges the
    all-zero groups of its children (``z = z_a + z_b``,
    ``q = q_a + q_b + alpha^k (z_b - z_a)^2``); a read node finishes them
    (``f = f_a + f_b + E0_a + E0_b`` with the zero-group errors ``E0``, ``z = q = 0``) and
    needs only the smallest such ``f`` per budget. States carry their node sets as sorted
    tuples.
    """
    tails = [sum(alpha**j for j in range(k, depth)) for k in range(depth + 1)]
    leaf = [[(1, 0.0, 0.0, ())]]  # below the last level: one leaf, nothing to read

    def solve(n: int, k: int) -> list:
        left = leaf if k == depth - 1 else solve(2 * n + 1, k + 1)
        right = leaf if k == depth - 1 else solve(2 * n + 2, k + 1)
        # finished children: the best error per budget when n is read
        done_l = [_first_best((f + _zero_group_error(z, q, tails[k + 1]), nodes) for z, q, f, nodes in s)
                  for s in left]
        done_r = [_first_best((f + _zero_group_error(z, q, tails[k + 1]), nodes) for z, q, f, nodes in s)
                  for s in right]
        fronts = []
        for b in range(len(left) + len(right)):  # subtree budgets 0 .. 2^(K-k) - 1
            states = []
            for ba in range(max(0, b - len(right) + 1), min(b, len(left) - 1) + 1):
                for za, qa, fa, na in left[ba]:
                    for zb, qb, fb, nb in right[b - ba]:
                        states.append((za + zb, qa + qb + alpha**k * (zb - za) ** 2, fa + fb,
                                       tuple(sorted(na + nb))))
            if b >= 1:
                reads = [(done_l[ba][0] + done_r[b - 1 - ba][0],
                          tuple(sorted((n,) + done_l[ba][1] + done_r[b - 1 - ba][1])))
                         for ba in range(max(0, b - len(right)), min(b - 1, len(left) - 1) + 1)]
                f, nodes = _first_best(reads)
                states.append((0, 0.0, f, nodes))
            fronts.append(_pareto(states))
        return fronts

    root = solve(0, 0)
    best = [_first_best(((f + _zero_group_error(z, q, tails[0])) / 2**depth, nodes) for z, q, f, nodes in s)
            for s in root]
    return tuple((max(loss, 0.0), nodes) for loss, nodes in best)


def _greedy_extend(tree: TreePrior, chosen: list, M: int) -> np.ndarray:
    """Add nodes to ``chosen`` one at a time, each the one that lowers the loss most."""
    chosen = list(chosen)
    while len(chosen) < M:
        rest = np.setdiff1d(np.arange(tree.dim), chosen)
        sets = np.concatenate([np.tile(chosen, (rest.size, 1)).astype(np.int64), rest[:, None]], 1)
        chosen.append(int(rest[np.argmin(_nodes_losses(tree, sets))]))
    return np.array(chosen, dtype=np.int64)


def _local_search(tree: TreePrior, M: int, tol: float) -> torch.Tensor:
    D = tree.dim
    starts = [np.arange(M), _greedy_extend(tree, [], M)]
    for k in range(tree.depth):
        first = 2**k - 1
        if 2**k >= M:  # the leftmost M nodes of level k
            starts.append(np.arange(first, first + M))
        else:  # all of level k, then greedy additions
            starts.append(_greedy_extend(tree, list(range(first, 2 * first + 1)), M))
    best, best_loss = None, math.inf
    for start in starts:
        current = np.sort(start)
        loss = float(_nodes_losses(tree, current[None])[0])
        while M < D:
            outside = np.setdiff1d(np.arange(D), current)
            # every swap: position p of the set takes the unchosen node q
            p = np.repeat(np.arange(M), outside.size)
            cand = np.tile(current, (p.size, 1))
            cand[np.arange(p.size), p] = np.tile(outside, M)
            cand.sort(axis=1)
            losses = _nodes_losses(tree, cand)
            i = int(np.argmin(losses))
            if losses[i] >= loss - tol:
                break
            current, loss = cand[i], float(losses[i])
        if loss < best_loss - tol:
            best, best_loss = current, loss
    return torch.from_numpy(best.copy())


def gaussian_coordinate_loss(variances: torch.Tensor, budget: int, tau2: float) -> float:
    """Diagonal Gaussian prior, measuring its ``M`` largest-variance coordinates once each.

    ``sum(unmeasured v) + sum(measured v * tau2 / (v + tau2))``.
    """
    check_int("budget", budget, 1)
    _check_tau2(tau2)
    v = torch.sort(_variances(variances), descending=True).values
    measured, unmeasured = v[:budget], v[budget:]
    return float(unmeasured.sum() + (measured * tau2 / (measured + tau2)).sum())


def _noise_cov(W: torch.Tensor, tau2: float, noise_cov: torch.Tensor | None) -> torch.Tensor:
    if noise_cov is not None:
        return check_tensor("noise_cov", noise_cov, (W.shape[0], W.shape[0]), "(M, M)")
    return _check_tau2(tau2) * torch.eye(W.shape[-2], dtype=torch.float64)


def _cov_and_rows(cov, W) -> tuple[torch.Tensor, torch.Tensor]:
    """``cov (D, D)`` and ``W (M, D)`` as float64 tensors, or ``ValueError`` naming the bad one."""
    C = torch.as_tensor(cov, dtype=torch.float64)
    if C.ndim != 2 or C.shape[0] != C.shape[1]:
        raise ValueError(f"cov must have shape (D, D), got {tuple(C.shape)}")
    W = torch.as_tensor(W, dtype=torch.float64)
    if W.ndim != 2 or W.shape[1] != C.shape[0]:
        raise ValueError(f"W must have shape (M, D) = (*, {C.shape[0]}), got {tuple(W.shape)}")
    return C, W


def gaussian_posterior_cov(cov: torch.Tensor, W: torch.Tensor, tau2: float, noise_cov=None) -> torch.Tensor:
    """Posterior covariance of ``theta ~ N(0, C)`` after ``phi = W theta + xi``.

    ``xi ~ N(0, R)`` with ``R = tau2 * I`` unless ``noise_cov`` is given. Equals
    ``(C^-1 + W^T R^-1 W)^-1``; computed as ``C - C W^T (W C W^T + R)^-1 W C`` so that a
    singular ``C`` is fine. It does not depend on the observed ``phi``. Shapes: ``C (D, D)``,
    ``W (M, D)``; returns ``(D, D)``.
    """
    C, W = _cov_and_rows(cov, W)
    S = W @ C @ W.T + _noise_cov(W, tau2, noise_cov)
    K = torch.linalg.solve(S, W @ C).T  # C W^T S^-1, shape (D, M)
    post = C - K @ W @ C
    return (post + post.T) / 2


def gaussian_posterior(cov, W, phi: torch.Tensor, tau2: float, noise_cov=None):
    """Posterior mean ``(B, D)`` and covariance ``(D, D)`` of a Gaussian prior given ``phi (B, M)``."""
    C, W = _cov_and_rows(cov, W)
    S = W @ C @ W.T + _noise_cov(W, tau2, noise_cov)
    gain = torch.linalg.solve(S, W @ C).T  # (D, M)
    phi = torch.as_tensor(phi, dtype=torch.float64)
    if phi.ndim != 2 or phi.shape[1] != W.shape[0]:
        raise ValueError(f"phi must have shape (B, M) = (*, {W.shape[0]}), got {tuple(phi.shape)}")
    mean = phi @ gain.T
    return mean, gaussian_posterior_cov(C, W, tau2, noise_cov)


def finite_n_covariance(theta: torch.Tensor, W: torch.Tensor, n_ctx: int, noise_std: float) -> torch.Tensor:
    """Exact covariance of ``phi = (1/N) sum_i y_i W x_i`` given ``theta``.

    ``[(|theta|^2 + sigma^2) W W^T + W theta theta^T W^T] / N`` for ``theta (D,)``, ``W (M, D)``.
    The Gaussian-channel approximation keeps only the first term, with ``|theta|^2`` replaced
    by its prior mean.
    """
    check_task_args(n_ctx, noise_std)
    theta = torch.as_tensor(theta, dtype=torch.float64)
    if theta.ndim != 1:
        raise ValueError(f"theta must have shape (D,), got {tuple(theta.shape)}")
    W = torch.as_tensor(W, dtype=torch.float64)
    if W.ndim != 2 or W.shape[1] != theta.shape[0]:
        raise ValueError(f"W must have shape (M, D) = (*, {theta.shape[0]}), got {tuple(W.shape)}")
    Wt = W @ theta
    return ((theta @ theta + noise_std**2) * (W @ W.T) + torch.outer(Wt, Wt)) / n_ctx


def twin_finite_n_loss(variances, budget: int, n_ctx: int, tau2: float) -> float:
    """Closed form for the Gaussian twin measured on its ``M`` largest-variance coordinates,
    decoded linearly, *with* the finite-``N`` term.

    The pooled statistic ``g_n = (1/N) sum_i y_i x_{i,n}`` has
    ``E g_n^2 = v_n (1 + 1/N) + tau^2``: besides the channel noise ``tau^2`` it carries the
    extra ``v_n / N`` of ``theta_n^2 / N`` in its conditional variance. The best linear
    decoder leaves ``v (tau^2 + v/N) / (v (1 + 1/N) + tau^2)`` per measured coordinate
    (``v tau^2 / (v + tau^2)`` when the ``v/N`` term is dropped) and ``v`` per unmeasured one.
    ``variances`` has shape ``(D,)``.
    """
    check_int("budget", budget, 1)
    check_int("n_ctx", n_ctx, 1)
    _check_tau2(tau2)
    v = torch.sort(_variances(variances), descending=True).values
    m, rest = v[:budget], v[budget:]
    return float(rest.sum() + (m * (tau2 + m / n_ctx) / (m * (1 + 1 / n_ctx) + tau2)).sum())


def noisefree_layered_loss(tree: TreePrior, layer_sizes) -> float:
    """Adaptive, no channel noise, ``d_l`` coordinate measurements in layer ``l``.

    Policy: layer ``l`` measures, in one non-adaptive batch, the first ``d_l`` nodes in
    breadth-first order of the subtree whose root is the next unresolved node of the path (its
    position is known once its parent has been measured). With ``d = 2^j - 1 + r``
    (``0 <= r < 2^j``) the batch resolves ``j`` levels for certain and one more with
    probability ``r / 2^j`` (the path's node is uniform among the ``2^j`` nodes of that row).
    Unresolved levels keep their prior energy, so the loss is ``E sum_{k >= k_L} alpha^k``
    over the distribution of the resolved depth ``k_L`` after the last layer.

    One node per layer gives :func:`noisefree_adaptive_loss`; one layer of ``M`` nodes gives
    :func:`noisefree_nonadaptive_loss`, which is also the loss of the Gaussian twin measured
    on its ``M`` largest variances without noise, whatever the split into layers. Layers of
    size 0 measure nothing. ``layer_sizes`` is a sequence of non-negative ints.
    """
    _check_tree(tree)
    sizes = [check_int(f"layer_sizes[{i}]", d, 0) for i, d in enumerate(layer_sizes)]
    K = tree.depth
    tails = [sum(tree.alpha**k for k in range(start, K)) for start in range(K + 1)]
    resolved = {0: 1.0}  # resolved depth -> probability
    for d in sizes:
        nxt: dict[int, float] = {}
        j = (d + 1).bit_length() - 1  # largest j with 2^j - 1 <= d
        hit = (d - (2**j - 1)) / 2**j
        for k, p in resolved.items():
            for k_new, q in ((k + j + 1, hit), (k + j, 1.0 - hit)):
                if q > 0:
                    k_new = min(k_new, K)
                    nxt[k_new] = nxt.get(k_new, 0.0) + p * q
        resolved = nxt
    return float(sum(p * tails[k] for k, p in resolved.items()))
