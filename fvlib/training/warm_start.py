"""The imitation warm start: model A's router fitted to the greedy coordinate policy (chapter
8, *Experiments*, section "How close does model A come to the best adaptive reference?"; the
book's appendix *Conventions*, section "Training").

Trained from a random start, model A's router settles on mixed directions that its decoder
can read but that lose to the greedy coordinate policy. The imitation recipe
(:data:`fvlib.training.config.IMITATION_RECIPE`; not the default :data:`fvlib.training.config.RECIPE`, which has no
teacher) first fits the router to that policy by regression, then trains the whole model on
the query loss as usual, the router at a reduced learning rate: it measures how well model A
can *represent* greedy once shown it, not what it learns alone.

The fit is teacher-forced: on a context with statistic ``g_hat``, the greedy rule
(:class:`fvlib.theory.adaptive_opt.GreedyRule`, run by
:func:`~fvlib.theory.adaptive_opt.policy_rollout` with the Gaussian-channel variance
``tau^2``) measures unit rows ``e_{n_1}, ..., e_{n_L}`` and reads ``phi_l = g_hat[n_l]``; the
router of layer ``l`` is given greedy's workspace ``(phi_1, ..., phi_{l-1})`` and its matrix
``G_l`` (``(1, D)``, one channel) is pulled towards ``e_{n_l}``::

    loss = (1/L) sum_l mean over contexts of |G_l(phi_1..phi_{l-1}) - e_{n_l}|^2.

Only the router's parameters move; the decoder keeps its initialisation (its last layer is
zero, so ``theta_hat = 0`` until training starts).
"""

from __future__ import annotations

import torch

from .._checks import check_int, check_number
from ..models import FVTransformer
from ..priors import TreePrior
from ..task import sample_task
from ..theory import FiniteSampleChannel, channel_tau2
from ..theory.adaptive_opt import GreedyRule, policy_rollout

__all__ = ["is_router_parameter", "greedy_targets", "router_imitation_loss", "warm_start_router"]


def is_router_parameter(name: str) -> bool:
    """Whether the parameter ``name`` of an :class:`~fvlib.models.FVTransformer` belongs to a
    router (every ``blocks.*`` parameter; the rest is the decoder)."""
    return name.startswith("blocks.")


def greedy_targets(tree: TreePrior, g_hat: torch.Tensor, n_layers: int,
                   tau2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy policy on statistics ``g_hat (B, D)``: its readings ``phis (B, L)`` and unit
    rows ``rows (B, L, D)`` (float64)."""
    with torch.no_grad():
        rollout = policy_rollout(tree, GreedyRule(tree), FiniteSampleChannel(g_hat.double()), n_layers, tau2)
    return rollout.phis, rollout.directions


def router_imitation_loss(model: FVTransformer, phis: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean over layers and contexts of ``|G_l(phis[:, :l-1]) - rows[:, l-1]|^2`` (a scalar).

    ``phis (B, L)`` and ``rows (B, L, D)``: the teacher's workspace and rows
    (:func:`greedy_targets`); ``model`` has a gated router with one channel per layer.
    """
    dtype = next(model.parameters()).dtype
    phis, rows = phis.to(dtype), rows.to(dtype)
    total = 0.0
    for layer in range(1, model.config.n_layers + 1):
        matrix = model.block(layer).router.matrix(phis[:, : layer - 1])[:, 0]  # (B, D)
        total = total + ((matrix - rows[:, layer - 1]) ** 2).sum(-1).mean()
    return total / model.config.n_layers


def warm_start_router(model: FVTransformer, tree: TreePrior, n_ctx: int, noise_std: float, *, steps: int,
                      batch: int, generator: torch.Generator, lr: float = 1e-2) -> float:
    """Fit model A's router to the greedy coordinate policy (see the module docs), in place.

    ``steps`` Adam steps at learning rate ``lr`` on ``batch`` fresh contexts each, drawn from
    ``generator`` (CPU). Returns the imitation loss of the last step.

    Raises:
        ValueError: a model without a gated router of one channel per layer, a budget that
            is not the model's number of layers, or bad ``steps``, ``batch``, ``lr``.
    """
    check_int("steps", steps, 1)
    check_int("batch", batch, 1)
    check_number("lr", lr, 0, low_open=True)
    config = model.config
    if config.router != "gated" or config.channels != 1:
        raise ValueError("warm_start_router needs model A (a gated router, one channel per layer), "
                         f"got router {config.router!r} with {config.channels} channels")
    if config.dim != tree.dim:
        raise ValueError(f"the model reads D = {config.dim}, the tree has D = {tree.dim}")
    device = next(model.parameters()).device
    router = [p for name, p in model.named_parameters() if is_router_parameter(name)]
    optimizer = torch.optim.Adam(router, lr=lr)
    tau2 = channel_tau2(tree, n_ctx, noise_std)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        contexts = sample_task(tree, batch, n_ctx, noise_std, generator)
        phis, rows = greedy_targets(tree, contexts.sufficient_statistic(), config.n_layers, tau2)
        loss = router_imitation_loss(model, phis.to(device), rows.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return loss.item()
