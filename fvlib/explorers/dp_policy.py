"""The DP policy explorer (chapter 4): channel noise ``tau``: the optimal two-layer DP policy
against greedy; the state is :func:`fvlib.explorers.states.dp_policy_state`."""

from __future__ import annotations

import ipywidgets as widgets
from matplotlib.figure import Figure

from ..plots.explorers import plot_dp_policy_state
from .base import Explorer, check_one_of
from .states import DP_POLICY_GRID, dp_policy_live, dp_policy_state

__all__ = ["dp_policy_explorer"]


def _draw_dp_policy(tau: float) -> tuple[Figure, dict, str]:
    state = dp_policy_state(tau)
    v = state["values"]
    caption = (f"tau = {tau:g}: optimal {v['optimal']:.4f}, greedy {v['greedy']:.4f}, non-adaptive "
               f"{v['nonadaptive']:.4f} (optimal / greedy = {state['ratio']:.3f}). The optimal policy "
               f"measures node {state['first_node']} first and measures it again with probability "
               f"{state['remeasure_prob']:.3f}. K = {state['depth']}, alpha = {state['alpha']:g}, "
               f"L = {state['layers']}; exact quadrature ({state['quad_points']}-point "
               f"{state['rule']} rule), no Monte Carlo.")
    return plot_dp_policy_state(state), state, caption


def dp_policy_explorer(tau: float = 0.6) -> Explorer:
    """Channel noise ``tau`` (the values of ``DP_POLICY_GRID``): the optimal two-layer policy of
    chapter 4 (K = 3, alpha = 1/2) as a decision tree with the probability of each branch,
    beside the values of the optimal, greedy and non-adaptive policies.

    ``summary`` is :func:`fvlib.explorers.states.dp_policy_state` at the current ``tau``.
    """
    check_one_of("tau", tau, DP_POLICY_GRID["tau"])
    controls = {"tau": widgets.SelectionSlider(options=DP_POLICY_GRID["tau"], value=tau,
                                               description="noise tau", continuous_update=False)}
    return Explorer("DP policy explorer: the optimal policy against greedy", controls, _draw_dp_policy,
                    live=lambda: dp_policy_live(tau))
