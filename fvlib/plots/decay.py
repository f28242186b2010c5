"""Decay of the excess loss with depth and budget: ``alpha^L`` versus a power law (chapter 6,
*Tree prior*).

Figures of the tree-prior chapter, drawn from the results of :mod:`fvlib.theory.sweeps`
(:func:`~fvlib.theory.sweeps.closed_form_curves`, :func:`~fvlib.theory.sweeps.best_coord_curves`,
:func:`~fvlib.theory.sweeps.decay_sweep`, :func:`~fvlib.theory.sweeps.advantage_sweep`):

* :func:`plot_decay` and :func:`plot_decay_panels` -- points, error bars and fitted laws on
  semilog and log-log axes (a law is a straight line on one of them);
* :func:`plot_advantage_heatmap` -- the adaptive advantage over a grid of ``alpha`` and
  context lengths ``N`` (an :class:`fvlib.theory.sweeps.AdvantageGrid`).

Colours: the Okabe-Ito palette and the viridis colour map (both colour-blind safe).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm

from .style import OKABE_ITO, STRATEGY_LABELS

__all__ = [
    "plot_decay",
    "plot_decay_panels",
    "plot_advantage_heatmap",
]


def plot_decay(ax, x, y, *, yerr=None, fit=None, law: str | None = None, fit_x=None, x_offset: float = 0.0,
               label: str = "", color: str = OKABE_ITO["blue"], marker: str = "o", line: str = "-"):
    """Points ``y(x)`` (with optional error bars ``yerr``) and, optionally, a fitted law.

    Args:
        ax: axes (their scales are left alone: set semilog or log-log yourself).
        x, y: positive 1-D arrays of the same length.
        yerr: optional standard errors; drawn as +-2 standard errors.
        fit: a :class:`fvlib.theory.fits.DecayFit`; with ``law`` ``"exponential"`` or ``"power"``
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
    axes[0].legend(fontsize=9, frameon=False)
    return axes


_QUANTITIES = {
    "ratio": None,  # label from the baseline's name
    "best_lower": "best noise-free coordinate set\n(noise-free loss)",
    "best_upper": "better of the two fixed\ncoordinate sets",
}


def _ratio_label(numerator: str) -> str:
    """Colour-bar label of a loss ratio over the adaptive greedy loss, in the strategies' legend
    words (:data:`fvlib.plots.style.STRATEGY_LABELS`), one line per term."""
    return f"loss of {numerator}\n/ loss of {STRATEGY_LABELS['adaptive_greedy']}"


def plot_advantage_heatmap(grid, ax=None, *, annotate: bool = True, noisefree_column=None,
                           cmap: str = "viridis", quantity: str = "ratio", norm=None):
    """Heatmap of an advantage (log colour scale), rows ``alpha`` and columns ``N``.

    ``quantity`` is ``"ratio"`` (``grid.ratio``, the default), ``"best_lower"`` or
    ``"best_upper"`` (grids swept with ``best_coord=True``; see :class:`fvlib.theory.sweeps.AdvantageGrid`).
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
    numerator = _QUANTITIES[quantity] or STRATEGY_LABELS.get(grid.baseline_name, grid.baseline_name)
    cbar = ax.figure.colorbar(im, ax=ax)
    cbar.set_label(_ratio_label(numerator), fontsize=9)
    ticks = [t for t in (0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3, 5, 10, 20, 30, 50, 100, 200, 500, 1000)
             if norm.vmin <= t <= norm.vmax]
    cbar.minorticks_off()
    cbar.set_ticks(ticks, labels=[f"{t:g}" for t in ticks])
    return im
