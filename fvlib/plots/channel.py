"""Figures for the measurement channel and the layer-by-layer posterior (chapters 1 and 3).

A layer pools ``phi_l = (1/N) sum_i lambda_l(z_i; Phi_{l-1})``; with linear embeddings
``lambda = y W x`` this is ``W g_hat``. The functions here draw

* :func:`plot_leaf_posteriors` -- the posterior over the ``2^K`` leaves of a tree prior after
  ``l = 0, 1, ..., L`` measurements (one bar panel per ``l``);
* :func:`plot_covariances` -- covariance matrices side by side on one colour scale (the
  empirical covariance of ``phi`` against the exact finite-``N`` formula and the
  Gaussian-channel formula);
* :func:`plot_channel_sweep` and :func:`plot_relative_gap` -- excess losses of several
  strategies against the context length ``N`` under the finite-``N`` statistic and under the
  Gaussian channel, and their relative difference;
* :func:`plot_level_error_rates` -- how often a measurement of a path node has the wrong
  sign, level by level, under the two channels.

Every function draws on given (or new) axes and returns what it drew. Colours are the
Okabe--Ito palette, which is safe for the common forms of colour blindness.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from ..stats import relative_gap
from .style import OKABE_ITO, STRATEGY_LABELS, palette

__all__ = [
    "plot_leaf_posteriors",
    "plot_covariances",
    "plot_channel_sweep",
    "plot_relative_gap",
    "plot_level_error_rates",
]

#: Colours of successive strategies (and of the two bars of a pair), black excluded.
_SERIES = palette("blue", "vermillion", "green", "purple", "orange", "sky", "yellow")


def _as_numpy(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().double().numpy()
    return np.asarray(a, dtype=float)


def plot_leaf_posteriors(
    probs,
    true_leaf: int | None = None,
    axes=None,
    titles: Sequence[str] | None = None,
    leaf_labels: Sequence[str] | None = None,
    color: str = OKABE_ITO["blue"],
    true_color: str = OKABE_ITO["vermillion"],
):
    """Bar plots of leaf posteriors, one panel per row of ``probs``.

    Args:
        probs: ``(P, 2^K)`` leaf probabilities, row ``l`` the posterior after ``l`` measurements.
        true_leaf: index of the context's true leaf, drawn in ``true_color``.
        axes: ``P`` axes to draw on (a new row of panels when ``None``).
        titles: one title per panel (default ``"l = 0"``, ``"l = 1"``, ...).
        leaf_labels: tick labels for the leaves (e.g. sign paths); indices when ``None``.
    Returns:
        The list of ``P`` :class:`~matplotlib.container.BarContainer` objects.
    """
    p = _as_numpy(probs)
    if p.ndim != 2:
        raise ValueError(f"probs must be (P, num_leaves), got shape {p.shape}")
    n_panels, n_leaves = p.shape
    if axes is None:
        _, axes = plt.subplots(1, n_panels, figsize=(2.2 * n_panels, 2.6), sharey=True)
    axes = np.atleast_1d(axes).ravel()
    if len(axes) != n_panels:
        raise ValueError(f"need {n_panels} axes, got {len(axes)}")
    colors = [true_color if j == true_leaf else color for j in range(n_leaves)]
    bars = []
    for l, ax in enumerate(axes):
        bars.append(ax.bar(np.arange(n_leaves), p[l], color=colors, width=0.8))
        ax.set_ylim(0, 1.02)
        ax.set_title(titles[l] if titles is not None else f"l = {l}", fontsize=9)
        ax.set_xlabel("leaf", fontsize=8)
        if leaf_labels is not None:
            ax.set_xticks(np.arange(n_leaves))
            ax.set_xticklabels(leaf_labels, rotation=90, fontsize=6, family="monospace")
        else:
            ax.set_xticks(np.arange(0, n_leaves, max(1, n_leaves // 4)))
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("posterior probability", fontsize=8)
    return bars


def plot_covariances(
    matrices: Mapping[str, object],
    axes=None,
    cmap: str = "RdBu_r",
    colorbar: bool = True,
):
    """Heat maps of several ``(m, m)`` matrices side by side on one symmetric colour scale.

    Args:
        matrices: ``{title: (m, m) array}`` in the order to draw them.
        axes: as many axes as matrices (a new row of panels when ``None``).
        colorbar: add one colour bar for all panels.
    Returns:
        The list of :class:`~matplotlib.image.AxesImage` objects.
    """
    mats = {name: _as_numpy(m) for name, m in matrices.items()}
    for name, m in mats.items():
        if m.ndim != 2 or m.shape[0] != m.shape[1]:
            raise ValueError(f"{name!r} must be a square matrix, got shape {m.shape}")
    if axes is None:
        _, axes = plt.subplots(1, len(mats), figsize=(3.0 * len(mats), 2.9))
    axes = np.atleast_1d(axes).ravel()
    if len(axes) != len(mats):
        raise ValueError(f"need {len(mats)} axes, got {len(axes)}")
    vmax = max(float(np.abs(m).max()) for m in mats.values()) or 1.0
    images = []
    for ax, (name, m) in zip(axes, mats.items()):
        images.append(ax.imshow(m, cmap=cmap, vmin=-vmax, vmax=vmax))
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(m.shape[0]))
        ax.set_yticks(range(m.shape[0]))
        ax.tick_params(labelsize=7)
    if colorbar:
        axes[0].figure.colorbar(images[-1], ax=list(axes), shrink=0.8)
    return images


def _check_sweep(results: Mapping) -> tuple[list[int], list[str]]:
    if set(results) != {"finite", "gaussian"}:
        raise ValueError(f"results must have the keys 'finite' and 'gaussian', got {sorted(results)}")
    n_values = sorted(results["finite"])
    if sorted(results["gaussian"]) != n_values:
        raise ValueError("the finite and Gaussian sweeps must use the same context lengths")
    names = list(results["finite"][n_values[0]])
    return n_values, names


def plot_channel_sweep(results: Mapping, ax=None, strategies: Sequence[str] | None = None, n_se: float = 2.0):
    """Excess loss against the context length ``N`` under both channels.

    Args:
        results: ``{"finite": {N: {strategy: Estimate}}, "gaussian": {N: {strategy: Estimate}}}``,
            i.e. :func:`fvlib.theory.strategies.evaluate_strategies` outputs keyed by channel and ``N``.
        strategies: which strategies to draw (default: all, in the order of the results).
        n_se: error bars of ``n_se`` Monte Carlo standard errors.
    Returns:
        ``{strategy: {"finite": ErrorbarContainer, "gaussian": ErrorbarContainer}}``. Solid lines
        with filled markers are the finite-``N`` statistic, dashed lines with open markers the
        Gaussian channel; both axes are logarithmic.
    """
    n_values, names = _check_sweep(results)
    names = list(strategies) if strategies is not None else names
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.8))
    drawn = {}
    markers = "osD^v"
    for i, name in enumerate(names):
        color, marker = _SERIES[i % len(_SERIES)], markers[i % len(markers)]
        drawn[name] = {}
        for channel, style in (("finite", "-"), ("gaussian", "--")):
            est = [results[channel][n][name] for n in n_values]
            means = np.array([e.mean for e in est])
            errs = n_se * np.array([e.stderr for e in est])
            lower = np.minimum(errs, 0.999 * means)  # keep bars above 0 on a log axis
            label = f"{STRATEGY_LABELS.get(name, name)}, {channel}"
            drawn[name][channel] = ax.errorbar(
                n_values, means, yerr=[lower, errs], fmt=marker + style, color=color,
                mfc=color if channel == "finite" else "white", ms=5, capsize=2, lw=1.4, label=label,
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(n_values)
    ax.set_xticklabels([str(n) for n in n_values])
    ax.set_xlabel("context length N")
    ax.set_ylabel(r"excess loss $\mathbb{E}\,\|\hat\theta-\theta\|^2$")
    ax.legend(fontsize=7, frameon=False)
    return drawn


def plot_relative_gap(
    results: Mapping,
    ax=None,
    strategies: Sequence[str] | None = None,
    predicted: Mapping[str, Sequence[float]] | None = None,
    n_se: float = 2.0,
    ylim: tuple[float, float] | None = None,
):
    """Relative gap ``(finite - gaussian) / gaussian`` of the excess loss against ``N``.

    Args:
        results: as in :func:`plot_channel_sweep`.
        predicted: optional ``{strategy: gaps}`` (one value per ``N``, in increasing ``N``),
            drawn as thin dotted lines in the strategy's colour.
        n_se: error bars of ``n_se`` standard errors (see :func:`fvlib.stats.relative_gap`).
        ylim: optional ``(low, high)`` of the axis. A gap outside it is drawn at the edge as a
            triangle pointing out of the frame, labelled with its value, and without its error
            bar, so no line leaves the frame; error bars of the points inside are clipped.
    Returns:
        ``{strategy: ErrorbarContainer}``.
    """
    n_values, names = _check_sweep(results)
    names = list(strategies) if strategies is not None else names
    if ylim is not None and not ylim[0] < ylim[1]:
        raise ValueError(f"ylim must be (low, high) with low < high, got {ylim!r}")
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.0))
    markers = "osD^v"
    drawn = {}
    for i, name in enumerate(names):
        color, marker = _SERIES[i % len(_SERIES)], markers[i % len(markers)]
        gaps = [relative_gap(results["finite"][n][name], results["gaussian"][n][name]) for n in n_values]
        y = np.array([g for g, _ in gaps], dtype=float)
        err = np.array([n_se * s for _, s in gaps], dtype=float)
        outside = np.zeros(len(y), dtype=bool)
        if ylim is not None:
            outside = (y < ylim[0]) | (y > ylim[1])
            err = np.where(outside, 0.0, err)
            y_shown = np.clip(y, *ylim)
        else:
            y_shown = y
        drawn[name] = ax.errorbar(
            n_values, y_shown, yerr=err, fmt=marker + "-",
            color=color, ms=5, capsize=2, lw=1.4, label=STRATEGY_LABELS.get(name, name),
        )
        for n, value, shown in zip(np.asarray(n_values)[outside], y[outside], y_shown[outside]):
            up = value > 0
            ax.plot([n], [shown], marker="^" if up else "v", color=color, ms=9, clip_on=False, zorder=4)
            ax.annotate(f"{value:+.0%}", (n, shown), xytext=(-4, -11 if up else 5), textcoords="offset points",
                        ha="right", fontsize=8, color=color)
        if predicted is not None and name in predicted:
            ax.plot(n_values, predicted[name], ":", color=color, lw=2,
                    label=f"{STRATEGY_LABELS.get(name, name)}, predicted")
    ax.axhline(0.0, color="0.4", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(n_values)
    ax.set_xticklabels([str(n) for n in n_values])
    ax.set_xlabel("context length N")
    ax.set_ylabel("(finite - Gaussian) / Gaussian")
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.legend(fontsize=8, frameon=False)
    return drawn


def plot_level_error_rates(
    finite_rates,
    gaussian_rates,
    finite_stderr=None,
    ax=None,
    labels: tuple[str, str] = ("finite-N statistic (Monte Carlo)", "Gaussian channel (closed form)"),
):
    """Grouped bars: probability that the measurement of the path node at level ``k`` has the wrong sign.

    Args:
        finite_rates, gaussian_rates: ``(K,)`` error rates per level.
        finite_stderr: optional ``(K,)`` standard errors of the finite rates (2 s.e. bars).
    Returns:
        ``(BarContainer finite, BarContainer gaussian)``; the y axis is logarithmic.
    """
    f, g = _as_numpy(finite_rates), _as_numpy(gaussian_rates)
    if f.shape != g.shape or f.ndim != 1:
        raise ValueError(f"rates must be two (K,) arrays, got {f.shape} and {g.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.0))
    k = np.arange(len(f))
    err = None if finite_stderr is None else 2 * _as_numpy(finite_stderr)
    bars_f = ax.bar(k - 0.2, f, width=0.4, color=OKABE_ITO["blue"], yerr=err, capsize=2, label=labels[0])
    bars_g = ax.bar(k + 0.2, g, width=0.4, color=OKABE_ITO["vermillion"], label=labels[1])
    ax.set_yscale("log")
    ax.set_xticks(k)
    ax.set_xlabel("level k of the path node")
    ax.set_ylabel("P(wrong sign)")
    ax.legend(fontsize=7, frameon=False)
    return bars_f, bars_g
