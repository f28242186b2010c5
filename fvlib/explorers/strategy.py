"""The strategy explorer (chapter 6): budget, ``alpha``, context length ``N`` and label noise:
Monte Carlo theory curves of the adaptive greedy, non-adaptive and LMMSE strategies; the state
is :func:`fvlib.explorers.states.strategy_state`."""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np
from matplotlib.figure import Figure

from .._checks import check_int, check_number
from ..plots.explorers import plot_strategy_curves
from ..priors import TreePrior
from ..theory import DecaySweep
from .base import DrawFn, Explorer, check_one_of, slider
from .states import EXPLORER_STRATEGIES, strategy_live, strategy_state

__all__ = ["strategy_explorer", "N_CTX_OPTIONS"]


def _strategy_drawer(depth: int, samples: int, seed: int) -> DrawFn:
    def draw(budget: int, alpha: float, n_ctx: int, noise_std: float) -> tuple[Figure, dict, str]:
        summary = strategy_state(depth, budget, alpha, n_ctx, noise_std, samples, seed)
        tree = TreePrior(depth, alpha)
        sweep = DecaySweep(np.array(summary["budgets"]), {k: np.array(v) for k, v in summary["mean"].items()},
                           {k: np.array(v) for k, v in summary["stderr"].items()}, samples, n_ctx, noise_std,
                           summary["tau2"])
        figure = plot_strategy_curves(sweep, tree, EXPLORER_STRATEGIES)
        final = summary["final"]
        m = summary["budgets"][-1]
        caption = (f"At M = {m}: adaptive {final['adaptive_greedy']:.4f}, non-adaptive "
                   f"{final['nonadaptive_coord']:.4f}, LMMSE {final['lmmse']:.4f}. "
                   f"{samples} Monte Carlo contexts per point (seed {seed}, the same contexts at every budget).")
        return figure, summary, caption

    return draw


N_CTX_OPTIONS = (16, 32, 64, 128, 256, 512, 1024, 2048)


def strategy_explorer(
    depth: int = 6,
    budget: int = 6,
    alpha: float = 0.5,
    n_ctx: int = 128,
    noise_std: float = 0.0,
    samples: int = 1000,
    seed: int = 0,
) -> Explorer:
    """Budget ``M`` (1..D, curves for every budget up to it), ``alpha``, context length ``N`` and
    label noise ``sigma``: Monte Carlo excess losses of the adaptive greedy, non-adaptive and
    LMMSE strategies on a depth-``depth`` tree (``samples`` contexts per point, finite-``N``
    statistics, ``seed``).

    ``summary`` holds ``budgets``, ``tau2``, ``samples``, ``mean`` and ``stderr`` (per strategy,
    one entry per budget) and ``final`` (the three losses at the largest budget).
    """
    check_int("depth", depth, 2, 8)
    dim = 2**depth - 1
    check_int("budget", budget, 1, dim)
    check_number("alpha", alpha, 0.05, 1.0)
    check_one_of("n_ctx", n_ctx, N_CTX_OPTIONS)
    check_number("noise_std", noise_std, 0.0, 2.0)
    check_int("samples", samples, 2, 100_000)
    controls = {
        "budget": slider(widgets.IntSlider, budget, 1, min(dim, 12), 1, "budget M"),
        "alpha": slider(widgets.FloatSlider, alpha, 0.05, 1.0, 0.05, "alpha", ".2f"),
        "n_ctx": widgets.SelectionSlider(options=N_CTX_OPTIONS, value=n_ctx, description="context N",
                                         continuous_update=False),
        "noise_std": slider(widgets.FloatSlider, noise_std, 0.0, 2.0, 0.1, "noise sigma", ".1f"),
    }
    return Explorer("Strategy explorer: adaptive versus non-adaptive inference",
                    controls, _strategy_drawer(depth, samples, seed),
                    live=lambda: strategy_live(depth, budget, alpha, n_ctx, noise_std, samples, seed))
