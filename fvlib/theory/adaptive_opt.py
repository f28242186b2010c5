"""The optimised adaptive policy: general directions ``W_l(Phi_{l-1})`` learned end to end
through the exact tree posterior (chapter 6, *Tree prior*; the book's appendix *Conventions*,
section "Strategies and their names", strategy ``adaptive_opt``).

Channel. Every measurement of a context is a linear function of its statistic ``g``: layer
``l`` reads ``phi_l = w_l . g`` with a unit row ``w_l`` chosen from the workspace
``Phi_{l-1} = (phi_1, ..., phi_{l-1})``. Under the Gaussian channel ``g ~ N(theta, tau^2 I)``
the ``L`` readings together are ``N(W theta, tau^2 W W^T)`` whatever the rule that chose the
rows, so their exact likelihood is that of the orthonormalised rows: with ``q_l`` the part of
``w_l`` orthogonal to ``w_1..w_{l-1}`` (normalised) and ``u_l = q_l . g``,
``log p(Phi_L | theta) = sum_l (u_l q_l.theta - (q_l.theta)^2 / 2) / tau^2`` (constants
dropped). Measuring a direction again (``q_l = 0``) adds nothing, as on the finite-``N``
statistic a transformer pools. Decoding is the exact posterior mean over the ``2^K`` leaves
(:mod:`fvlib.theory.posteriors`).

Policy class. :class:`AdaptivePolicy` has the parametrisation of model A's gated router
(chapter 7, *From theory to architecture*): ``W_l(Phi) = base_l + MLP_l(features)`` with the
MLP's last layer starting at zero, so the policy starts non-adaptive. Its features are the
workspace ``Phi_{l-1}`` and the posterior node masses it implies (a function of ``Phi_{l-1}``,
so the policy is still a function of the workspace; the masses make the greedy rule easy to
represent). The greedy coordinate rule (:class:`GreedyRule`) and fixed directions
(:class:`FixedRows`) are members of the same class.

:func:`optimise_adaptive_policy` trains an :class:`AdaptivePolicy` warm-started at the
optimised non-adaptive directions (Adam on the exact Bayes risk, fresh Gaussian-channel samples
every step), then keeps whichever of the trained policy, the greedy rule and the non-adaptive
directions has the smallest loss on held-out validation contexts, so the result is never worse
than either reference beyond the validation set's Monte Carlo error.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from .._checks import check_int, check_number, check_seed
from ..priors import TreePrior, check_tree_prior
from ..stats import squared_error
from .channel import FiniteSampleChannel
from .posteriors import greedy_action, node_masses, posterior_probs, tree_posterior_mean, uniform_log_weights

__all__ = [
    "PolicyRollout",
    "AdaptivePolicy",
    "GreedyRule",
    "FixedRows",
    "policy_rollout",
    "OptimisedPolicy",
    "optimise_adaptive_policy",
    "POLICY_KINDS",
    "policy_state",
    "policy_from_state",
]

#: A row whose part orthogonal to the earlier rows is shorter than this re-measures them.
_SPAN_EPS = 1e-6


@dataclass(frozen=True)
class PolicyRollout:
    """One run of a direction policy over ``B`` contexts and ``L`` layers.

    ``directions (B, L, D)`` unit rows ``w_l``, ``phis (B, L)`` readings ``w_l . g`` (the
    workspace), ``log_w (B, 2^K)`` final log-likelihoods, ``theta_hat (B, D)`` posterior means.
    """

    directions: torch.Tensor
    phis: torch.Tensor
    log_w: torch.Tensor
    theta_hat: torch.Tensor


def _unit(w: torch.Tensor) -> torch.Tensor:
    return w / w.norm(dim=-1, keepdim=True).clamp_min(1e-12)


class AdaptivePolicy(nn.Module):
    """``W_l(Phi_{l-1}) = c_l soft_l + base_l + MLP_l([Phi_{l-1}, node masses])``, one row per layer.

    ``soft_l`` is the greedy rule made smooth: over the nodes of level ``l - 1``, weights
    ``softmax(beta_l log P(node))`` (beyond the tree depth, the greedy row itself); ``c_l`` and
    ``beta_l`` are learned. Every term is a function of the workspace ``Phi_{l-1}``.

    Args:
        tree: the prior (``D = 2^K - 1`` nodes).
        n_layers: ``L`` layers of one scalar measurement each (budget ``M = L``).
        width, hidden_layers: the MLPs, as model A's router.
        init_rows: ``(L, D)`` starting rows ``base_l`` (default zero).
        greedy_start: ``c_l`` starts at 1 with ``beta_l = 100`` (the policy starts close to the
            greedy rule); otherwise ``c_l`` starts at 0 (the policy starts at ``init_rows``).
    Layer 1 has no workspace: it measures ``c_1 e_0 + base_1``. Float64 throughout.
    """

    def __init__(self, tree: TreePrior, n_layers: int, *, width: int = 64, hidden_layers: int = 2,
                 init_rows: torch.Tensor | None = None, greedy_start: bool = False):
        super().__init__()
        check_tree_prior("tree", tree)
        check_int("n_layers", n_layers, 1)
        check_int("width", width, 1)
        check_int("hidden_layers", hidden_layers, 1)
        D = tree.dim
        if init_rows is None:
            init_rows = torch.zeros(n_layers, D, dtype=torch.float64)
        init_rows = torch.as_tensor(init_rows, dtype=torch.float64)
        if init_rows.shape != (n_layers, D):
            raise ValueError(f"init_rows must have shape ({n_layers}, {D}), got {tuple(init_rows.shape)}")
        self.tree, self.n_layers = tree, n_layers
        self.base = nn.Parameter(init_rows.clone())
        self.mix = nn.Parameter(torch.full((n_layers,), 1.0 if greedy_start else 0.0, dtype=torch.float64))
        self.log_beta = nn.Parameter(torch.full((n_layers,), math.log(100.0), dtype=torch.float64))
        gates = []
        for layer in range(2, n_layers + 1):
            layers: list[nn.Module] = []
            n_in = layer - 1 + D
            for i in range(hidden_layers):
                layers += [nn.Linear(n_in if i == 0 else width, width), nn.GELU()]
            last = nn.Linear(width, D)
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)
            gates.append(nn.Sequential(*layers, last))
        self.gates = nn.ModuleList(gates)
        self.double()

    def _soft_greedy(self, step: int, log_w: torch.Tensor, measured) -> torch.Tensor:
        tree, B = self.tree, log_w.shape[0]
        if step >= tree.depth:
            return GreedyRule(tree).direction(step, None, log_w, measured)
        probs = posterior_probs(log_w)
        masses = probs.reshape(B, 2**step, -1).sum(-1)  # level `step`
        weights = torch.softmax(self.log_beta[step].exp() * masses.clamp_min(1e-300).log(), dim=-1)
        row = torch.zeros(B, tree.dim, dtype=torch.float64)
        return torch.cat([row[:, : 2**step - 1], weights, row[:, 2 ** (step + 1) - 1:]], dim=-1)

    def direction(self, step: int, phis: torch.Tensor, log_w: torch.Tensor, measured) -> torch.Tensor:
        """The row ``w`` of layer ``step + 1`` (``(B, D)``) from the workspace ``phis (B, step)``."""
        B = log_w.shape[0]
        row = self.base[step].expand(B, -1) + self.mix[step] * self._soft_greedy(step, log_w, measured)
        if step == 0:
            return row
        features = torch.cat([phis, node_masses(self.tree, posterior_probs(log_w))], dim=-1)
        return row + self.gates[step - 1](features)


class GreedyRule:
    """The greedy coordinate rule as a direction policy (:func:`~fvlib.theory.posteriors.greedy_action`)."""

    def __init__(self, tree: TreePrior):
        self.tree = tree

    def direction(self, step: int, phis: torch.Tensor, log_w: torch.Tensor, measured) -> torch.Tensor:
        nodes = greedy_action(self.tree, log_w.detach(), step, measured)
        return torch.eye(self.tree.dim, dtype=torch.float64)[nodes]


class FixedRows:
    """Fixed (non-adaptive) rows ``Q (L, D)`` as a direction policy."""

    def __init__(self, rows: torch.Tensor):
        self.rows = torch.as_tensor(rows, dtype=torch.float64)
        if self.rows.ndim != 2:
            raise ValueError(f"rows must have shape (L, D), got {tuple(self.rows.shape)}")

    def direction(self, step: int, phis: torch.Tensor, log_w: torch.Tensor, measured) -> torch.Tensor:
        return self.rows[step].expand(log_w.shape[0], -1)


def policy_rollout(tree: TreePrior, policy, channel, n_layers: int, tau2: float,
                   forced: dict | None = None, readings: dict | None = None) -> PolicyRollout:
    """Run a direction policy for ``n_layers`` layers and decode exactly (see the module docs).

    Args:
        policy: an :class:`AdaptivePolicy`, :class:`GreedyRule` or :class:`FixedRows` (anything
            with ``direction(step, phis, log_w, measured) -> (B, D)``).
        channel: a :class:`~fvlib.theory.channel.FiniteSampleChannel` over ``B`` contexts (the
            readings are linear functions of one statistic per context).
        tau2: the channel variance of the likelihood.
        forced: optional ``{layer: rows (B, D)}`` with 1-based layers; at those layers these
            rows are measured instead of the policy's, and the likelihood knows it (the *aware*
            key patching of chapter 10).
        readings: optional ``{layer: phis (B,)}`` with 1-based layers; at those layers the policy
            chooses its own row but its workspace slot holds the given reading, which it takes
            for that row's measurement in every later choice and in the likelihood (the
            *unaware* key patching: a network only sees its workspace). With ``readings`` every
            likelihood term is computed from the workspace readings, not from the channel.
    Differentiable in the policy's parameters.
    """
    check_tree_prior("tree", tree)
    check_int("n_layers", n_layers, 1)
    check_number("tau2", tau2, 0, low_open=True)
    if not isinstance(channel, FiniteSampleChannel):
        raise ValueError("policy_rollout needs a FiniteSampleChannel (one statistic per context), "
                         f"got {type(channel).__name__}")
    B, D = channel.g_hat.shape
    if D != tree.dim:
        raise ValueError(f"channel must hold statistics of D = {tree.dim} coordinates, got shape {(B, D)}")
    leaves = tree.leaf_thetas  # (J, D)
    log_w = uniform_log_weights(tree, B)
    measured = torch.zeros(B, D, dtype=torch.bool)
    basis = torch.zeros(B, 0, D, dtype=torch.float64)
    rows, phis, us = [], [], torch.zeros(B, 0, dtype=torch.float64)
    for step in range(n_layers):
        if forced and (step + 1) in forced:
            w = torch.as_tensor(forced[step + 1], dtype=torch.float64).expand(B, D)
        else:
            w = policy.direction(step, torch.stack(phis, 1) if phis else basis[:, :, 0], log_w, measured)
        w = _unit(w)
        overlaps = torch.einsum("bkd,bd->bk", basis, w)
        q = w - torch.einsum("bkd,bk->bd", basis, overlaps)
        r = q.norm(dim=-1, keepdim=True)
        new = r > _SPAN_EPS
        q = torch.where(new, q / r.clamp_min(_SPAN_EPS), torch.zeros_like(q))
        if readings and (step + 1) in readings:
            phi = torch.as_tensor(readings[step + 1], dtype=torch.float64)
        else:
            phi = channel.measure(w[:, None, :])[:, 0]
        if readings:
            u = _workspace_coordinate(phi, overlaps, us, r, new)
        else:
            u = channel.measure(q[:, None, :])[:, 0]
        t = q @ leaves.T  # (B, J): q . theta_j
        log_w = log_w + (u[:, None] * t - 0.5 * t * t) / tau2
        basis = torch.cat([basis, q[:, None, :]], dim=1)
        us = torch.cat([us, u[:, None]], dim=1)
        measured = measured | (w.detach() > 1 - 1e-12)
        rows.append(w)
        phis.append(phi)
    theta_hat = tree_posterior_mean(tree, posterior_probs(log_w))
    return PolicyRollout(torch.stack(rows, 1), torch.stack(phis, 1), log_w, theta_hat)


def _workspace_coordinate(phi, overlaps, us, r, new) -> torch.Tensor:
    """The reading along the new orthonormal direction ``q = (w - sum_k (b_k . w) b_k) / r`` as
    the workspace implies it: ``u = (phi - sum_k (b_k . w) u_k) / r`` with ``phi (B,)`` the
    reading taken for ``w . g``, ``overlaps (B, k)`` the ``b_k . w``, ``us (B, k)`` the earlier
    ``u_k`` and ``r (B, 1)`` (zero where ``w`` adds no direction, ``new`` false). Equal to
    ``q . g`` when every reading is true."""
    u = (phi - (overlaps * us).sum(-1)) / r[:, 0].clamp_min(_SPAN_EPS)
    return torch.where(new[:, 0], u, torch.zeros_like(u))


@dataclass
class OptimisedPolicy:
    """What :func:`optimise_adaptive_policy` returns.

    ``policy``: the kept policy (its ``kind`` says which: ``"learned"``, ``"greedy"`` or
    ``"nonadaptive_opt"``); ``learned``: the trained :class:`AdaptivePolicy` (kept or not);
    ``validation``: ``{kind: validation loss}`` of the candidates (three; two at ``M = 1``) on the same held-out
    contexts; ``seconds``: wall time of the optimisation (not counting the rows it starts from).
    """

    policy: object
    kind: str
    learned: AdaptivePolicy
    validation: dict = field(default_factory=dict)
    seconds: float = 0.0

    def rollout(self, tree: TreePrior, channel, tau2: float, forced: dict | None = None,
                readings: dict | None = None) -> PolicyRollout:
        """:func:`policy_rollout` of the kept policy (no gradients)."""
        with torch.no_grad():
            return policy_rollout(tree, self.policy, channel, self.learned.n_layers, tau2, forced, readings)


def _gaussian_statistic(tree: TreePrior, batch: int, tau2: float, gen: torch.Generator):
    idx = torch.randint(0, tree.num_leaves, (batch,), generator=gen)
    theta = tree.leaf_thetas[idx]
    g = theta + math.sqrt(tau2) * torch.randn(theta.shape, generator=gen, dtype=torch.float64)
    return theta, FiniteSampleChannel(g)


def optimise_adaptive_policy(
    tree: TreePrior,
    budget: int,
    tau2: float,
    *,
    directions: torch.Tensor,
    steps: int = 200,
    batch: int = 256,
    lr: float = 3e-3,
    width: int = 64,
    validation: int = 4000,
    seed: int = 0,
) -> OptimisedPolicy:
    """The optimised adaptive policy with ``budget`` layers of one measurement (see the module docs).

    Scores the greedy rule and the non-adaptive rows ``directions (M, D)`` (those of
    :func:`~fvlib.theory.strategies.optimise_directions`) on ``validation`` held-out contexts
    of the Gaussian channel ``g ~ N(theta, tau2 I)``; trains an :class:`AdaptivePolicy` started
    at the better of the two (``greedy_start``, or ``base = directions``) by Adam on the exact
    Bayes risk, ``steps`` steps of ``batch`` fresh contexts; scores it on the same validation
    contexts and keeps the best of the three (with ``budget = 1`` there is no workspace to adapt
    to: no training, the better of the two is kept). Seeded: the same
    arguments give the same policy on CPU.
    """
    check_tree_prior("tree", tree)
    check_int("budget", budget, 1, tree.dim)
    check_number("tau2", tau2, 0, low_open=True)
    check_seed("seed", seed)
    for name, value in (("steps", steps), ("batch", batch), ("validation", validation)):
        check_int(name, value, 1)
    check_number("lr", lr, 0, low_open=True)
    start = time.perf_counter()
    directions = torch.as_tensor(directions, dtype=torch.float64)
    if directions.shape != (budget, tree.dim):
        raise ValueError(f"directions must have shape ({budget}, {tree.dim}), got {tuple(directions.shape)}")
    theta_val, chan_val = _gaussian_statistic(tree, validation, tau2, torch.Generator().manual_seed(seed + 29))

    def score(policy) -> float:
        with torch.no_grad():
            theta_hat = policy_rollout(tree, policy, chan_val, budget, tau2).theta_hat
        return float(squared_error(theta_hat, theta_val).mean())

    candidates = {"greedy": GreedyRule(tree), "nonadaptive_opt": FixedRows(directions)}
    scores = {kind: score(policy) for kind, policy in candidates.items()}
    greedy_start = scores["greedy"] <= scores["nonadaptive_opt"]
    with torch.random.fork_rng(devices=[]):  # seeded initial weights, global RNG untouched
        torch.manual_seed(seed)
        learned = AdaptivePolicy(tree, budget, width=width, greedy_start=greedy_start,
                                 init_rows=None if greedy_start else directions)
    gen = torch.Generator().manual_seed(seed + 17)
    opt = torch.optim.Adam(learned.parameters(), lr=lr)
    if budget == 1:  # one layer has no workspace to adapt to: the class is the fixed rows
        kind = min(scores, key=scores.get)
        return OptimisedPolicy(candidates[kind], kind, learned, scores, time.perf_counter() - start)
    for _ in range(steps):
        theta, chan = _gaussian_statistic(tree, batch, tau2, gen)
        loss = squared_error(policy_rollout(tree, learned, chan, budget, tau2).theta_hat, theta).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    learned.eval()
    candidates["learned"] = learned
    scores["learned"] = score(learned)
    kind = min(scores, key=scores.get)
    return OptimisedPolicy(candidates[kind], kind, learned, scores, time.perf_counter() - start)


#: The kinds of policy :func:`optimise_adaptive_policy` keeps, by the code :func:`policy_state` stores.
POLICY_KINDS = ("learned", "greedy", "nonadaptive_opt")


def policy_state(policy: OptimisedPolicy) -> dict[str, torch.Tensor]:
    """The tensors that rebuild the kept policy of ``policy`` (:func:`policy_from_state`): ``kind``
    (0-d int64, its index in :data:`POLICY_KINDS`); for the kind ``"learned"`` the trained
    :class:`AdaptivePolicy` by its parameter names (``base (L, D)``, ``mix (L,)``, ``log_beta
    (L,)``, ``gates.<i>.<j>.weight`` and ``.bias``: its MLPs, none at ``L = 1``); for the kind
    ``"nonadaptive_opt"`` its rows ``rows (L, D)``; nothing more for ``"greedy"`` (a trained
    policy that was not kept is not saved). Float64 but ``kind``; copies."""
    state = {"kind": torch.tensor(POLICY_KINDS.index(policy.kind))}
    if policy.kind == "learned":
        state.update({k: v.detach().clone() for k, v in policy.learned.state_dict().items()})
    elif policy.kind == "nonadaptive_opt":
        state["rows"] = policy.policy.rows.clone()
    return state


def policy_from_state(tree: TreePrior, n_layers: int, state: dict, **kwargs) -> OptimisedPolicy:
    """The :class:`OptimisedPolicy` of ``n_layers`` layers on ``tree`` whose kept policy
    :func:`policy_state` saved as ``state``; ``kwargs``: the :class:`AdaptivePolicy` arguments it
    was trained with (``width``, ``hidden_layers``; by default those of
    :func:`optimise_adaptive_policy`). Its ``validation`` is empty, its ``seconds`` 0, and unless
    the kind is ``"learned"`` its ``learned`` is an untrained :class:`AdaptivePolicy` (the trained
    one was not saved). Raises ``ValueError`` naming a missing, unknown or misshapen tensor."""
    state = dict(state)
    if "kind" not in state:
        raise ValueError(f"state holds no 'kind'; it holds {sorted(state)}")
    code = int(state.pop("kind"))
    if not 0 <= code < len(POLICY_KINDS):
        raise ValueError(f"state's kind must be a code of {POLICY_KINDS} (0 to {len(POLICY_KINDS) - 1}), got {code}")
    kind = POLICY_KINDS[code]
    rows = state.pop("rows", None) if kind == "nonadaptive_opt" else None
    if kind == "nonadaptive_opt" and (rows is None or tuple(rows.shape) != (n_layers, tree.dim)):
        raise ValueError(f"state of kind 'nonadaptive_opt' needs rows of shape ({n_layers}, {tree.dim}), got "
                         f"{None if rows is None else tuple(rows.shape)}")
    if kind != "learned" and state:
        raise ValueError(f"state of kind {kind!r} holds unknown tensors {sorted(state)}")
    with torch.random.fork_rng(devices=[]):  # initial weights overwritten or unused: global RNG untouched
        learned = AdaptivePolicy(tree, n_layers, **kwargs)
    if kind == "learned":
        try:
            learned.load_state_dict(state)
        except RuntimeError as err:
            raise ValueError(f"state does not fit an AdaptivePolicy of {n_layers} layers on D = {tree.dim}: "
                             f"{' '.join(str(err).split())}") from None
    learned.eval()
    policy = learned if kind == "learned" else GreedyRule(tree) if kind == "greedy" else FixedRows(rows)
    return OptimisedPolicy(policy, kind, learned)
