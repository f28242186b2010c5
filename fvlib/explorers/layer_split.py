"""The layer split explorer (chapter 5): budget ``M``, layers ``L`` and ``alpha``: the tree
against its Gaussian twin as ``M`` is split into ``L`` layers; the state is
:func:`fvlib.explorers.states.layer_split_state`."""

from __future__ import annotations

import ipywidgets as widgets
from matplotlib.figure import Figure

from ..plots.explorers import plot_layer_split_state
from .base import Explorer, check_one_of, keep_at_most
from .states import LAYER_SPLIT_GRID, layer_split_live, layer_split_state

__all__ = ["layer_split_explorer"]


def _draw_layer_split(budget: int, layers: int, alpha: float) -> tuple[Figure, dict, str]:
    state = layer_split_state(budget, layers, alpha)
    sizes = state["layer_sizes"]
    caption = (f"M = {budget} measurements in L = {layers} layers (sizes {sizes}): tree "
               f"{state['tree_loss']:.4f}, Gaussian twin {state['gaussian_loss']:.4f} (the same for "
               f"every L). K = {state['depth']}, alpha = {alpha:g}, no channel noise; closed forms, "
               f"no Monte Carlo.")
    return plot_layer_split_state(state), state, caption


def layer_split_explorer(budget: int = 6, layers: int = 2, alpha: float = 0.5) -> Explorer:
    """Budget ``M``, layers ``L`` and ``alpha`` (the values of ``LAYER_SPLIT_GRID``): ``M``
    coordinate measurements split evenly into ``L`` layers, on the depth-5 tree and on its
    Gaussian twin without channel noise. The twin's loss depends only on ``M``; the tree's
    adaptive loss falls as the same budget is spread over more layers.

    ``summary`` is :func:`fvlib.explorers.states.layer_split_state` at the current settings.
    """
    check_one_of("budget", budget, LAYER_SPLIT_GRID["budget"])
    check_one_of("layers", layers, LAYER_SPLIT_GRID["layers"])
    check_one_of("alpha", alpha, LAYER_SPLIT_GRID["alpha"])
    if layers > budget:
        raise ValueError(f"layers must be at most budget = {budget} (a layer measures at least once), got {layers}")
    controls = {
        "budget": widgets.SelectionSlider(options=LAYER_SPLIT_GRID["budget"], value=budget,
                                          description="budget M", continuous_update=False),
        "layers": widgets.SelectionSlider(options=LAYER_SPLIT_GRID["layers"], value=layers,
                                          description="layers L", continuous_update=False),
        "alpha": widgets.SelectionSlider(options=LAYER_SPLIT_GRID["alpha"], value=alpha,
                                         description="alpha", continuous_update=False),
    }
    keep_at_most(controls["layers"], controls["budget"])
    return Explorer("Layer split explorer: one budget, more or fewer layers", controls, _draw_layer_split,
                    live=lambda: layer_split_live(budget, layers, alpha))
