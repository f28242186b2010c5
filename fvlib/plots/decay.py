"""Decay of the excess loss with depth and budget: ``alpha^L`` versus a power law (chapter 6,
*Tree prior*).

Experiment loops and figures of the tree-prior chapter:

* :func:`closed_form_curves` -- the two noise-free closed forms over a range of budgets;
* :func:`decay_sweep` -- Monte Carlo losses of several strategies over a range of budgets
  (one :func:`fvlib.theory.evaluate_strategies` call per budget, same seed, so every budget
  sees the same contexts);
* :func:`plot_decay` and :func:`plot_decay_panels` -- points, error bars and fitted laws on
  semilog and log-log axes (a law is a straight line on one of them);
* :func:`advantage_sweep` and :func:`plot_advantage_heatmap` -- the adaptive advantage over
  a grid of ``alpha`` and context lengths ``N``.

Colours: the Okabe-Ito palette and the viridis colour map (both colour-blind safe).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm

from ..priors import TreePrior
from ..theory import channel_tau2, evaluate_strategies, noisefree_adaptive_loss, noisefree_nonadaptive_loss
from .trees import OKABE_ITO

__all__ = [
    "closed_form_curves",
    "DecaySweep",
    "decay_sweep",
    "plot_decay",
    "plot_decay_panels",
    "AdvantageGrid",
    "advantage_sweep",
    "plot_advantage_heatmap",
]


def closed_form_curves(tree: TreePrior, budgets) -> dict[str, np.ndarray]:
    """Noise-free losses at each budget ``M`` in ``budgets`` (positive integers).

    Returns ``{"adaptive": (len(budgets),), "nonadaptive": (len(budgets),)}`` from
    :func:`fvlib.theory.noisefree_adaptive_loss` (``L = M`` layers, one node each) and
    :func:`fvlib.theory.noisefree_nonadaptive_loss` (the first ``M`` nodes in heap order).
    """
    budgets = [int(m) for m in budgets]
    return {
        "adaptive": np.array([noisefree_adaptive_loss(tree, m) for m in budgets]),
        "nonadaptive": np.array([noisefree_nonadaptive_loss(tree, m) for m in budgets]),
    }


@dataclass(frozen=True)
class DecaySweep:
    """Monte Carlo losses over budgets.

    ``budgets (B,)``; ``mean[name]`` and ``stderr[name]`` are ``(B,)`` arrays per strategy;
    ``samples`` contexts per budget; ``n_ctx``, ``noise_std`` and the channel variance ``tau2``.
    """

    budgets: np.ndarray
    mean: dict = field(default_factory=dict)
    stderr: dict = field(default_factory=dict)
    samples: int = 0
    n_ctx: int = 0
    noise_std: float = 0.0
    tau2: float = 0.0


def decay_sweep(tree: TreePrior, n_ctx: int, noise_std: float, budgets, *, samples: int = 2000, seed: int = 0,
                strategies=("adaptive_greedy", "nonadaptive_coord"), channel: str = "finite") -> DecaySweep:
    """Excess losses of ``strategies`` at every budget, finite-``N`` statistic by default.

    One :func:`fvlib.theory.evaluate_strategies` call per budget with the same ``seed``: the
    contexts (and their statistics) are the same at every budget, so the curves are smooth
    and their differences are not Monte Carlo noise between budgets.
    """
    budgets = np.array([int(m) for m in budgets])
    mean = {name: np.empty(len(budgets)) for name in strategies}
    stderr = {name: np.empty(len(budgets)) for name in strategies}
    for i, m in enumerate(budgets):
        est = evaluate_strategies(tree, n_ctx, noise_std, int(m), samples=samples, seed=seed,
                                  strategies=tuple(strategies), channel=channel)
        for name in strategies:
            mean[name][i] = est[name].mean
            stderr[name][i] = est[name].stderr
    return DecaySweep(budgets, mean, stderr, samples, n_ctx, noise_std, channel_tau2(tree, n_ctx, noise_std))


def plot_decay(ax, x, y, *, yerr=None, fit=None, law: str | None = None, fit_x=None, x_offset: float = 0.0,
               label: str = "", color: str = OKABE_ITO["blue"], marker: str = "o", line: str = "-"):
    """Points ``y(x)`` (with optional error bars ``yerr``) and, optionally, a fitted law.

    Args:
        ax: axes (their scales are left alone: set semilog or log-log yourself).
        x, y: positive 1-D arrays of the same length.
        yerr: optional standard errors; drawn as +-2 standard errors.
        fit: a :class:`fvlib.theory.DecayFit`; with ``law`` ``"exponential"`` or ``"power"``
            its prediction is drawn dashed over ``fit_x`` (default ``x``).
        x_offset: the fit was made against ``x + x_offset`` (e.g. ``1`` to fit in ``M + 1``).
        label, color, marker, line: styling of the points.

    Returns:
        The points' artist (a ``Line2D``, or an ``ErrorbarContainer`` when ``yerr`` is given).
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if yerr is not None:
        art = ax.errorbar(x, y, yerr=2 * np.asarray(yerr, dtype=float), fmt=marker + line, ms=4, lw=1.3,
                          capsize=2, color=color, label=label)
    else:
        (art,) = ax.plot(x, y, marker + line, ms=4, lw=1.3, color=color, label=label)
    if fit is not None and law is not None:
        xs = np.asarray(fit_x if fit_x is not None else x, dtype=float)
        if law == "exponential":
            pred = fit.predict_exponential(xs + x_offset)
        elif law == "power":
            pred = fit.predict_power(xs + x_offset)
        else:
            raise ValueError(f"law must be 'exponential' or 'power', got {law!r}")
        ax.plot(xs, pred, "--", color=color, lw=1.0, alpha=0.8)
    return art


def plot_decay_panels(series, axes=None, *, xlabel: str = "budget $M$ (= layers $L$ for the adaptive policy)",
                      ylabel: str = r"excess loss $\mathbb{E}\|\hat\theta-\theta\|^2$"):
    """The same curves on semilog (left) and log-log (right) axes.

    ``series`` is a list of dicts with keys ``x``, ``y`` and optionally ``yerr``, ``fit``,
    ``law``, ``x_offset``, ``label``, ``color``, ``marker``, ``line`` (see :func:`plot_decay`).
    An exponential law is a straight line on the left panel, a power law on the right one.
    Returns the two axes.
    """
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, kind in zip(axes, ("semilog", "loglog")):
        for s in series:
            kwargs = {k: s[k] for k in ("yerr", "fit", "law", "x_offset", "label", "color", "marker", "line") if k in s}
            plot_decay(ax, s["x"], s["y"], **kwargs)
        ax.set_yscale("log")
        if kind == "loglog":
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title("semilog axes: exponentials are straight" if kind == "semilog"
                     else "log-log axes: power laws are straight", fontsize=10)
    axes[0].legend(fontsize=8, frameon=False)
    return axes


@dataclass(frozen=True)
class AdvantageGrid:
    """Adaptive advantage over a grid: rows ``alphas (A,)``, columns ``n_ctxs (N,)``.

    ``adaptive``, ``baseline`` and their standard errors are ``(A, N)`` Monte Carlo losses;
    ``ratio = baseline / adaptive``; ``log_se`` is the standard error of ``log(ratio)`` by the
    delta method, treating the two estimates as independent (they share contexts and are
    positively correlated, so this overstates the error); ``noisefree_ratio (A,)`` is the
    ratio of the noise-free closed forms (``N -> infinity``) for the coordinate baseline, and
    NaN for other baselines (optimised directions have no closed form).
    """

    alphas: np.ndarray
    n_ctxs: np.ndarray
    depth: int
    budget: int
    samples: int
    baseline_name: str
    adaptive: np.ndarray
    adaptive_se: np.ndarray
    baseline: np.ndarray
    baseline_se: np.ndarray
    noisefree_ratio: np.ndarray

    @property
    def ratio(self) -> np.ndarray:
        return self.baseline / self.adaptive

    @property
    def log_se(self) -> np.ndarray:
        return np.hypot(self.adaptive_se / self.adaptive, self.baseline_se / self.baseline)


def advantage_sweep(alphas, n_ctxs, *, depth: int, budget: int, samples: int = 1000, seed: int = 0,
                    noise_std: float = 0.0, baseline: str = "nonadaptive_coord") -> AdvantageGrid:
    """Monte Carlo ``baseline / adaptive_greedy`` on every ``(alpha, N)`` of a grid.

    Each cell is one :func:`fvlib.theory.evaluate_strategies` call with ``samples`` contexts
    of a ``TreePrior(depth, alpha)``, budget ``M = budget`` (the adaptive policy uses
    ``L = M`` layers of one node), the finite-``N`` statistic and its own seed
    ``seed + 1000 i + j``. ``baseline`` is ``"nonadaptive_coord"`` or ``"nonadaptive_opt"``
    (the latter optimises directions per cell, which is slow).
    """
    alphas = np.asarray(alphas, dtype=float)
    n_ctxs = np.asarray(n_ctxs, dtype=int)
    shape = (len(alphas), len(n_ctxs))
    ad, ad_se, bl, bl_se = (np.empty(shape) for _ in range(4))
    noisefree = np.empty(len(alphas))
    for i, a in enumerate(alphas):
        tree = TreePrior(depth, float(a))
        ad_nf = noisefree_adaptive_loss(tree, budget)
        if baseline != "nonadaptive_coord":
            noisefree[i] = math.nan
        else:
            noisefree[i] = noisefree_nonadaptive_loss(tree, budget) / ad_nf if ad_nf > 0 else math.inf
        for j, n in enumerate(n_ctxs):
            est = evaluate_strategies(tree, int(n), noise_std, budget, samples=samples, seed=seed + 1000 * i + j,
                                      strategies=("adaptive_greedy", baseline))
            ad[i, j], ad_se[i, j] = est["adaptive_greedy"].mean, est["adaptive_greedy"].stderr
            bl[i, j], bl_se[i, j] = est[baseline].mean, est[baseline].stderr
    return AdvantageGrid(alphas, n_ctxs, depth, budget, samples, baseline, ad, ad_se, bl, bl_se, noisefree)


def plot_advantage_heatmap(grid: AdvantageGrid, ax=None, *, annotate: bool = True, noisefree_column=None,
                           cmap: str = "viridis"):
    """Heatmap of ``grid.ratio`` (log colour scale), rows ``alpha`` and columns ``N``.

    With ``noisefree_column`` a last column ``N = inf`` shows the noise-free closed-form ratio
    (the limit of each row); by default it is shown when the grid has one (coordinate
    baseline). With ``annotate`` every cell prints its ratio. Returns the image.
    """
    if noisefree_column is None:
        noisefree_column = bool(np.isfinite(grid.noisefree_ratio).all())
    values = grid.ratio
    cols = [str(int(n)) for n in grid.n_ctxs]
    if noisefree_column:
        values = np.concatenate([values, grid.noisefree_ratio[:, None]], axis=1)
        cols.append(r"$\infty$")
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 * len(cols) + 2.5, 0.6 * len(grid.alphas) + 1.6))
    finite = values[np.isfinite(values) & (values > 0)]
    norm = LogNorm(vmin=finite.min(), vmax=max(finite.max(), finite.min() * 1.01))
    im = ax.imshow(values, origin="lower", aspect="auto", cmap=cmap, norm=norm)
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(grid.alphas)), [f"{a:g}" for a in grid.alphas])
    ax.set_xlabel("context length $N$")
    ax.set_ylabel(r"$\alpha$")
    if noisefree_column:
        ax.axvline(len(grid.n_ctxs) - 0.5, color="white", lw=3)
    if annotate:
        mid = math.sqrt(norm.vmin * norm.vmax)
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                v = values[i, j]
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=8,
                        color="white" if v < mid else "black")
    cbar = ax.figure.colorbar(im, ax=ax, label=f"{grid.baseline_name} / adaptive_greedy")
    ticks = [t for t in (0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3, 5, 10, 20, 30, 50, 100, 200, 500, 1000)
             if norm.vmin <= t <= norm.vmax]
    cbar.minorticks_off()
    cbar.set_ticks(ticks, labels=[f"{t:g}" for t in ticks])
    return im
