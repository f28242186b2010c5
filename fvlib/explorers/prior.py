"""The prior explorer (chapter 2): tree depth ``K`` and decay ``alpha``: the tree, a sampled
``theta`` and a draw from its Gaussian twin (same second moments, no hierarchy); the state is
:func:`fvlib.explorers.states.prior_state`."""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure

from .._checks import check_int, check_number
from ..plots.explorers import plot_prior_sample
from ..priors import TreePrior
from .base import Explorer, slider
from .states import prior_live, prior_state

__all__ = ["prior_explorer"]


def _draw_prior(depth: int, alpha: float, seed: int) -> tuple[Figure, dict, str]:
    summary = prior_state(depth, alpha, seed)
    tree = TreePrior(depth, alpha)
    figure = plot_prior_sample(tree, torch.tensor(summary["signs"]), np.array(summary["theta"]),
                               np.array(summary["twin_theta"]))
    caption = (
        f"D = {summary['dim']} coordinates, E|theta|^2 = {summary['energy']:.3f} for both priors. The tree sample has "
        f"one non-zero coordinate per level ({summary['nonzero']} of {summary['dim']}); the twin spreads the "
        f"same energy over all of them. Sample seed {seed}."
    )
    return figure, summary, caption


def prior_explorer(depth: int = 4, alpha: float = 0.5, seed: int = 0) -> Explorer:
    """Tree depth ``K`` (2..7) and decay ``alpha`` (0.05..1): the tree with a sampled path, the
    sampled ``theta (D,)`` and a draw from the Gaussian twin; ``seed`` picks the draws.

    ``summary`` holds ``depth``, ``alpha``, ``dim``, ``energy``, ``signs``, ``theta``,
    ``twin_theta`` and ``nonzero`` (non-zero coordinates of the tree sample, always ``K``).
    """
    check_int("depth", depth, 2, 7)
    check_number("alpha", alpha, 0.05, 1.0)
    check_int("seed", seed, 0, 10_000)
    controls = {
        "depth": slider(widgets.IntSlider, depth, 2, 7, 1, "depth K"),
        "alpha": slider(widgets.FloatSlider, alpha, 0.05, 1.0, 0.05, "alpha", ".2f"),
        "seed": slider(widgets.IntSlider, seed, 0, 50, 1, "sample seed"),
    }
    return Explorer("Prior explorer: the tree and its Gaussian twin", controls, _draw_prior,
                    live=lambda: prior_live(depth, alpha, seed))
