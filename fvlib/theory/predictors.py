"""The theory's strategies as **predictors**: callables with a trained model's signature,
``batch -> theta_hat``, so that models and baselines are scored on the very same contexts,
paired (:func:`fvlib.training.evaluate.per_context_errors`).

A model maps each context of a :class:`~fvlib.task.TaskBatch` to ``theta_hat (B, D)``. A
strategy reads the context's pooled statistic ``g_hat = (1/N) sum_i y_i x_i``
(:meth:`~fvlib.task.TaskBatch.sufficient_statistic`: the finite-``N`` channel,
:class:`~fvlib.theory.channel.FiniteSampleChannel`), spends its ``M`` measurements and decodes
with the Bayes posterior under the Gaussian-channel likelihood of variance
``tau^2 = channel_tau2(tree, N, sigma)``, ``N`` and ``sigma`` being the batch's own. Predictors
compute in float64 on the CPU and return ``theta_hat (B, D)`` float64.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._checks import check_budget
from ..priors import TreePrior, check_tree_prior
from ..task import TaskBatch
from .adaptive_opt import policy_rollout
from .channel import FiniteSampleChannel
from .closed_forms import best_fixed_nodes, channel_tau2
from .strategies import get_strategy, strategy_estimate

__all__ = ["Predictor", "strategy_predictor", "policy_predictor"]

#: ``batch -> theta_hat (B, D)``: a trained model's ``predict_theta`` or a theory strategy.
Predictor = Callable[[TaskBatch], torch.Tensor]


def _channel(tree: TreePrior, batch: TaskBatch) -> tuple[FiniteSampleChannel, float]:
    """The batch's finite-``N`` channel and the likelihood variance ``tau^2`` of its ``N``, ``sigma``."""
    g_hat = batch.to("cpu", torch.float64).sufficient_statistic()
    return FiniteSampleChannel(g_hat), channel_tau2(tree, batch.n_ctx, batch.noise_std)


def strategy_predictor(name: str, tree: TreePrior, budget: int, *, directions: torch.Tensor | None = None,
                       nodes: torch.Tensor | None = None) -> Predictor:
    """The registered strategy ``name`` (:func:`~fvlib.theory.strategies.strategy_names`; not one that
    needs a policy, ``adaptive_opt``: see :func:`policy_predictor`) as a predictor spending
    ``budget`` measurements. ``directions`` ``(M, D)``: the rows of ``nonadaptive_opt``
    (required there, e.g. :func:`~fvlib.theory.strategies.optimise_directions`); ``nodes``: the
    set of ``nonadaptive_best_coord`` (default :func:`~fvlib.theory.closed_forms.best_fixed_nodes`)."""
    check_tree_prior("tree", tree)
    check_budget("budget", budget, tree.depth)
    needs = get_strategy(name).needs
    if "policy" in needs:
        raise ValueError(f"{name} is a policy: policy_predictor runs it")
    if "directions" in needs and directions is None:
        raise ValueError(f"{name} needs its directions (M, D), e.g. optimise_directions(tree, M, tau2)")
    if "nodes" in needs and nodes is None:
        nodes = best_fixed_nodes(tree, budget)

    @torch.no_grad()
    def predict(batch: TaskBatch) -> torch.Tensor:
        channel, tau2 = _channel(tree, batch)
        return strategy_estimate(name, tree, channel, budget, tau2, directions=directions, nodes=nodes)

    return predict


def policy_predictor(tree: TreePrior, policy, budget: int) -> Predictor:
    """A direction policy (an :class:`~fvlib.theory.adaptive_opt.OptimisedPolicy`'s ``policy``,
    a :class:`~fvlib.theory.adaptive_opt.GreedyRule`, ...) run for ``budget`` layers by
    :func:`~fvlib.theory.adaptive_opt.policy_rollout` and decoded exactly, as a predictor.
    (``strategy_predictor("adaptive_greedy", ...)`` runs the same greedy rule by
    :func:`~fvlib.theory.strategies.run_greedy`'s own loop: equal up to float rounding.)"""
    check_tree_prior("tree", tree)
    check_budget("budget", budget, tree.depth)

    @torch.no_grad()
    def predict(batch: TaskBatch) -> torch.Tensor:
        channel, tau2 = _channel(tree, batch)
        return policy_rollout(tree, policy, channel, budget, tau2).theta_hat

    return predict

