"""The table of theory baselines: every strategy beside the closed forms and the DP optimum
(the book's appendix *Conventions*, section "The command line"; chapter 6, *Tree prior*).

:func:`theory_baselines` is the ``theory`` command of the CLI. It sits above both
:mod:`fvlib.theory.strategies` (the Monte Carlo losses) and :mod:`fvlib.theory.dp` (the
optimal policy), which do not import each other.
"""

from __future__ import annotations

import math

from ..priors import TreePrior
from .closed_forms import (
    best_fixed_nodes,
    channel_tau2,
    gaussian_coordinate_loss,
    noisefree_adaptive_loss,
    noisefree_nodes_loss,
    noisefree_nonadaptive_loss,
)
from .dp import dp_no_repeat, dp_value
from .strategies import evaluate_strategies

__all__ = ["theory_baselines"]


def theory_baselines(
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    budget: int,
    *,
    samples: int = 4000,
    seed: int = 0,
    optimised: bool = False,
    dp: bool = False,
    best_coord: bool = False,
    adaptive_opt: bool = False,
) -> dict[str, float]:
    """All baselines of the CLI's ``theory`` command as plain floats (the book's appendix *Conventions*, section
    "The command line").

    Keys: ``tau2``, ``adaptive_greedy``, ``nonadaptive_coord`` (heap order), ``lmmse``,
    ``gaussian_twin``, ``noisefree_adaptive``, ``noisefree_nonadaptive`` (heap order);
    ``*_stderr`` for the Monte Carlo ones, ``samples``; plus ``nonadaptive_opt`` when
    ``optimised``, ``adaptive_opt`` (the optimised adaptive policy of
    :mod:`fvlib.theory.adaptive_opt`, started from the same optimised directions; it costs
    tens of seconds at ``K = 6``) when ``adaptive_opt``, ``dp_optimal`` (Gaussian channel with the same ``tau``, fresh noise, ``K <= 3``)
    and ``dp_no_repeat`` (the same DP when no node may be measured twice) when ``dp``, and ``nonadaptive_best_coord`` with ``noisefree_best_coord`` (the set of
    :func:`~fvlib.theory.closed_forms.best_fixed_nodes` and its exact noise-free loss) when ``best_coord``.
    The extra strategies are evaluated after the others, so they change none of their numbers.
    """
    tau2 = channel_tau2(tree, n_ctx, noise_std)
    names = ("adaptive_greedy", "nonadaptive_coord", "lmmse") + (("nonadaptive_opt",) if optimised else ())
    names += ("adaptive_opt",) if adaptive_opt else ()
    names += ("nonadaptive_best_coord",) if best_coord else ()
    best = best_fixed_nodes(tree, budget) if best_coord else None
    est = evaluate_strategies(tree, n_ctx, noise_std, budget, samples=samples, seed=seed, strategies=names,
                              nodes=best)
    out = {"tau2": tau2}
    for name, e in est.items():
        out[name] = e.mean
    out["gaussian_twin"] = gaussian_coordinate_loss(tree.node_variances, budget, tau2)
    out["noisefree_adaptive"] = noisefree_adaptive_loss(tree, budget)
    out["noisefree_nonadaptive"] = noisefree_nonadaptive_loss(tree, budget)
    if best_coord:
        out["noisefree_best_coord"] = noisefree_nodes_loss(tree, best)
    if dp:
        out["dp_optimal"] = dp_value(tree, budget, math.sqrt(tau2))
        out["dp_no_repeat"] = dp_no_repeat(tree, budget, math.sqrt(tau2))
    for name, e in est.items():
        out[f"{name}_stderr"] = e.stderr
    out["samples"] = samples
    return out
