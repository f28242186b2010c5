"""The table of theory baselines: every strategy beside the closed forms and the DP optimum
(the book's appendix *Conventions*, section "The command line"; chapter 6, *Tree prior*).

:func:`theory_baselines` is the ``theory`` command of the CLI. It sits above both
:mod:`fvlib.theory.strategies` (the Monte Carlo losses) and :mod:`fvlib.theory.dp` (the
optimal policy), which do not import each other.
"""

from __future__ import annotations

import math

from .._checks import check_budget
from ..priors import TreePrior, check_tree_prior
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

__all__ = ["theory_baselines", "theory_cost"]

# The calibration of theory_cost: seconds per unit of work on one core of the book's 2-core
# machine (2026), and the work of the optimisers at their default settings.
_SECONDS_PER_TOKEN = 110e-9  # drawing the statistic: per context and token (or coordinate)
_SECONDS_PER_LEAF_STEP = 300e-9  # a strategy's posterior: per context, leaf and measurement
_SECONDS_PER_DIRECTION_UNIT = 0.25e-9  # optimise_directions: per context, leaf and coordinate
_SECONDS_PER_POLICY_UNIT = 150e-9  # optimise_adaptive_policy: per context, leaf and layer
_SECONDS_PER_DP_OPERATION = 8e-8  # the DP: per operation of its cost formula (fvlib.theory.dp)
_DIRECTION_STEPS, _DIRECTION_BATCH = 400, 1024  # optimise_directions' defaults
_POLICY_CONTEXTS = 200 * 256 * 3 + 2 * 4000  # optimise_adaptive_policy: steps * batch * 3 + validation
_DP_POINTS = 3 * 48  # observation points of one DP measurement (three centres, 48 Hermite nodes)


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
    tens of seconds at ``K = 6``) when ``adaptive_opt``, ``dp_optimal`` (Gaussian channel with
    the same ``tau``, fresh noise, ``K <= 3``) and ``dp_no_repeat`` (the same DP when no node
    may be measured twice) when ``dp``, and ``nonadaptive_best_coord`` with
    ``noisefree_best_coord`` (the set of :func:`~fvlib.theory.closed_forms.best_fixed_nodes` and
    its exact noise-free loss) when ``best_coord``.
    The extra strategies are evaluated after the others, so they change none of their numbers.
    """
    check_tree_prior("tree", tree)
    check_budget("budget", budget, tree.depth)
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


def theory_cost(depth: int, n_ctx: int, budget: int, *, samples: int = 4000, optimised: bool = False,
                dp: bool = False) -> tuple[float, float]:
    """A rough cost of :func:`theory_baselines` (``optimised`` for both ``optimised`` and
    ``adaptive_opt``): ``(seconds on one CPU core, peak bytes of memory)``, computed from the
    sizes alone, before any work.

    The terms: drawing the statistic (``samples D``: :func:`fvlib.task.sample_statistic` costs
    nothing more for a longer context, so ``n_ctx`` is free), the posteriors of the strategies
    (``samples 2^K M`` in time, ``samples (2^K + D + K)`` numbers and the ``D x D`` coordinate
    matrix in memory), the two optimisers at their default settings, and the DP's operation
    count of :mod:`fvlib.theory.dp`. Calibrated on the book's 2-core machine; against measured
    runs from ``K = 3`` to ``12`` (up to 4 million samples; the optimisers from ``K = 4`` to
    ``10`` and at ``K = 8, M = 30``) it is within a factor of about 2 in time and memory, which
    is all the CLI needs to refuse a run that cannot finish or fit.
    """
    J, D = 2**depth, 2**depth - 1
    seconds = _SECONDS_PER_TOKEN * samples * (8 + D) + _SECONDS_PER_LEAF_STEP * samples * (J * budget + 40)
    memory = 36.0 * samples * (J + D + depth) + 8.0 * D * D
    if optimised:
        seconds += _DIRECTION_STEPS * (5e-3 + _SECONDS_PER_DIRECTION_UNIT * _DIRECTION_BATCH * J * (D + budget))
        seconds += _SECONDS_PER_POLICY_UNIT * _POLICY_CONTEXTS * J * budget
        memory += 200.0 * J * 4000 + 320.0 * 256 * budget * (J + D) + 32.0 * J * D
    if dp:
        seconds += _SECONDS_PER_DP_OPERATION * depth * float(D * _DP_POINTS) ** (budget - 1) * (_DP_POINTS + J * J)
    return seconds, memory
