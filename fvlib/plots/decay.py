"""Decay of the excess loss with depth and budget: ``alpha^L`` versus a power law (chapter 6,
*Tree prior*).

Experiment loops and figures of the tree-prior chapter:

* :func:`closed_form_curves` -- the two noise-free closed forms over a range of budgets;
* :func:`decay_sweep` -- Monte Carlo losses of several strategies over a range of budgets
  (one :func:`fvlib.theory.evaluate_strategies` call per budget, same seed, so every budget
  sees the same contexts);
* :func:`plot_decay` and :func:`plot_decay_panels` -- points, error bars and fitted laws on
  semilog and log-log axes (a law is a straight line on one of them);
* :func:`best_coord_curves` -- the noise-free loss of the best fixed coordinate set and its
  two bounds over a range of budgets;
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
from ..theory import (
    best_fixed_nodes,
    channel_tau2,
    evaluate_strategies,
    noisefree_adaptive_loss,
    noisefree_nodes_loss,
    noisefree_nonadaptive_loss,
)
from .trees import OKABE_ITO

__all__ = [
    "closed_form_curves",
    "best_coord_curves",
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


def best_coord_curves(tree: TreePrior, budgets) -> dict[str, np.ndarray]:
    """Noise-free losses of fixed coordinate sets at each budget ``M`` in ``budgets``.

    Returns ``(len(budgets),)`` arrays: ``"best"``, the loss of
    :func:`fvlib.theory.closed_forms.best_fixed_nodes` (exact search for small ``comb(D, M)``, a local
    search otherwise); ``"heap"``, the first ``M`` nodes in heap order; ``"lower"``, the bound
    ``sum_k alpha^k max(0, 1 - M / 2^k)`` below which no fixed set of ``M`` coordinates can go;
    ``"upper"``, the loss ``sum_{k >= L} alpha^k`` of reading all ``2^(L-1)`` nodes of level
    ``L - 1`` for the largest ``L`` with ``2^(L-1) <= M`` (the remaining reads are not
    counted), an upper bound on the best set. Also ``"nodes"``: a list of the best sets.
    """
    budgets = [int(m) for m in budgets]
    a, K = tree.alpha, tree.depth
    nodes = [best_fixed_nodes(tree, m) for m in budgets]
    levels = [min(m.bit_length(), K) for m in budgets]  # L with 2^(L-1) <= M < 2^L
    return {
        "best": np.array([noisefree_nodes_loss(tree, n) for n in nodes]),
        "heap": np.array([noisefree_nonadaptive_loss(tree, m) for m in budgets]),
        "lower": np.array([sum(a**k * max(0.0, 1 - m / 2**k) for k in range(K)) for m in budgets]),
        "upper": np.array([sum(a**k for k in range(L, K)) for L in levels]),
        "nodes": nodes,
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

    With ``best_coord`` (coordinate baseline only) the grid also holds, per row, the best
    fixed coordinate set without noise (:func:`fvlib.theory.closed_forms.best_fixed_nodes`):
    ``noisefree_best (A,)`` its exact noise-free loss, ``noisefree_best_ratio (A,)`` that over
    the noise-free adaptive loss, and ``best_coord``, ``best_coord_se (A, N)`` the Monte Carlo
    loss of reading that set at finite ``N`` (same contexts). No fixed set of ``M``
    coordinates does better at any ``N`` than the best one without noise (the finite-``N``
    reads of a set ``S`` depend on ``theta`` only through ``theta_S``), so
    ``best_lower = noisefree_best / adaptive`` is a lower bound on the advantage over *every*
    fixed coordinate set, and ``best_upper = min(baseline, best_coord) / adaptive`` (the
    better of the two sets tried) an upper bound.
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
    best_coord: np.ndarray | None = None
    best_coord_se: np.ndarray | None = None
    noisefree_best: np.ndarray | None = None
    noisefree_best_ratio: np.ndarray | None = None

    @property
    def ratio(self) -> np.ndarray:
        return self.baseline / self.adaptive

    @property
    def best_lower(self) -> np.ndarray:
        """``noisefree_best / adaptive`` ``(A, N)``: a lower bound on the advantage over every
        fixed coordinate set (``None`` without ``best_coord``); its log has standard error
        ``adaptive_se / adaptive``."""
        return None if self.noisefree_best is None else self.noisefree_best[:, None] / self.adaptive

    @property
    def best_upper(self) -> np.ndarray:
        """``min(baseline, best_coord) / adaptive`` ``(A, N)`` (``None`` without ``best_coord``)."""
        return None if self.best_coord is None else np.minimum(self.baseline, self.best_coord) / self.adaptive

    @property
    def log_se(self) -> np.ndarray:
        return np.hypot(self.adaptive_se / self.adaptive, self.baseline_se / self.baseline)


def advantage_sweep(alphas, n_ctxs, *, depth: int, budget: int, samples: int = 1000, seed: int = 0,
                    noise_std: float = 0.0, baseline: str = "nonadaptive_coord",
                    best_coord: bool = False) -> AdvantageGrid:
    """Monte Carlo ``baseline / adaptive_greedy`` on every ``(alpha, N)`` of a grid.

    Each cell is one :func:`fvlib.theory.evaluate_strategies` call with ``samples`` contexts
    of a ``TreePrior(depth, alpha)``, budget ``M = budget`` (the adaptive policy uses
    ``L = M`` layers of one node), the finite-``N`` statistic and its own seed
    ``seed + 1000 i + j``. ``baseline`` is ``"nonadaptive_coord"`` (heap order) or
    ``"nonadaptive_opt"`` (the latter optimises directions per cell, which is slow). With
    ``best_coord`` (heap-order baseline only) each cell also reads the best noise-free fixed
    coordinate set of its row on the same contexts (see :class:`AdvantageGrid`); the other
    numbers do not change.
    """
    if best_coord and baseline != "nonadaptive_coord":
        raise ValueError(f"best_coord needs baseline='nonadaptive_coord', got {baseline!r}")
    alphas = np.asarray(alphas, dtype=float)
    n_ctxs = np.asarray(n_ctxs, dtype=int)
    shape = (len(alphas), len(n_ctxs))
    ad, ad_se, bl, bl_se, bc, bc_se = (np.empty(shape) for _ in range(6))
    noisefree, nf_best, nf_best_ratio = (np.empty(len(alphas)) for _ in range(3))
    names = ("adaptive_greedy", baseline) + (("nonadaptive_best_coord",) if best_coord else ())
    for i, a in enumerate(alphas):
        tree = TreePrior(depth, float(a))
        ad_nf = noisefree_adaptive_loss(tree, budget)
        if baseline != "nonadaptive_coord":
            noisefree[i] = math.nan
        else:
            noisefree[i] = noisefree_nonadaptive_loss(tree, budget) / ad_nf if ad_nf > 0 else math.inf
        nodes = best_fixed_nodes(tree, budget) if best_coord else None
        if best_coord:
            nf_best[i] = noisefree_nodes_loss(tree, nodes)
            nf_best_ratio[i] = nf_best[i] / ad_nf if ad_nf > 0 else math.inf
        for j, n in enumerate(n_ctxs):
            est = evaluate_strategies(tree, int(n), noise_std, budget, samples=samples, seed=seed + 1000 * i + j,
                                      strategies=names, nodes=nodes)
            ad[i, j], ad_se[i, j] = est["adaptive_greedy"].mean, est["adaptive_greedy"].stderr
            bl[i, j], bl_se[i, j] = est[baseline].mean, est[baseline].stderr
            if best_coord:
                bc[i, j], bc_se[i, j] = est["nonadaptive_best_coord"].mean, est["nonadaptive_best_coord"].stderr
    extra = (bc, bc_se, nf_best, nf_best_ratio) if best_coord else ()
    return AdvantageGrid(alphas, n_ctxs, depth, budget, samples, baseline, ad, ad_se, bl, bl_se, noisefree, *extra)


_QUANTITIES = {
    "ratio": None,  # label from the baseline's name
    "best_lower": "best noise-free coordinate set (noise-free loss) / adaptive_greedy",
    "best_upper": "better of the two fixed coordinate sets / adaptive_greedy",
}


def plot_advantage_heatmap(grid: AdvantageGrid, ax=None, *, annotate: bool = True, noisefree_column=None,
                           cmap: str = "viridis", quantity: str = "ratio", norm=None):
    """Heatmap of an advantage (log colour scale), rows ``alpha`` and columns ``N``.

    ``quantity`` is ``"ratio"`` (``grid.ratio``, the default), ``"best_lower"`` or
    ``"best_upper"`` (grids swept with ``best_coord=True``; see :class:`AdvantageGrid`).
    With ``noisefree_column`` a last column ``N = inf`` shows the noise-free ratio (the limit
    of each row: ``grid.noisefree_ratio``, or ``grid.noisefree_best_ratio`` for the two
    ``best_*`` quantities); by default it is shown when the grid has one. With ``annotate``
    every cell prints its value. ``norm`` (a ``LogNorm``) fixes the colour scale, e.g. to share
    it between two panels. Returns the image.
    """
    if quantity not in _QUANTITIES:
        raise ValueError(f"quantity must be one of {sorted(_QUANTITIES)}, got {quantity!r}")
    if quantity != "ratio" and grid.noisefree_best is None:
        raise ValueError(f"quantity {quantity!r} needs a grid swept with best_coord=True")
    limit = grid.noisefree_ratio if quantity == "ratio" else grid.noisefree_best_ratio
    if noisefree_column is None:
        noisefree_column = bool(np.isfinite(limit).all())
    values = getattr(grid, quantity)
    cols = [str(int(n)) for n in grid.n_ctxs]
    if noisefree_column:
        values = np.concatenate([values, limit[:, None]], axis=1)
        cols.append(r"$\infty$")
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 * len(cols) + 2.5, 0.6 * len(grid.alphas) + 1.6))
    if norm is None:
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
    label = _QUANTITIES[quantity] or f"{grid.baseline_name} / adaptive_greedy"
    cbar = ax.figure.colorbar(im, ax=ax, label=label)
    ticks = [t for t in (0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3, 5, 10, 20, 30, 50, 100, 200, 500, 1000)
             if norm.vmin <= t <= norm.vmax]
    cbar.minorticks_off()
    cbar.set_ticks(ticks, labels=[f"{t:g}" for t in ticks])
    return im
