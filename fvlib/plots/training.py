"""Figures of the training experiments of models A, B, C and their theory overlays (chapters
5, *Gaussian prior*, and 8, *Experiments*; the book's appendix *Conventions*, sections
"Models A, B, C" and "Strategies and their names").

The runs themselves come from :mod:`fvlib.experiments.inbuild` (:func:`~fvlib.experiments.inbuild.shared_configs`,
:func:`~fvlib.experiments.inbuild.train_all`, :func:`~fvlib.experiments.inbuild.depth_sweep`,
and the theory curves of :func:`~fvlib.theory.sweeps.depth_sweep_theory`); the figures here draw their results:

* :func:`plot_covariance_heatmaps` -- posterior covariances side by side (Gaussian:
  independent of the observations; tree: not; see
  :func:`fvlib.theory.posteriors.tree_posterior_cov`);
* :func:`plot_training_curves` -- evaluation excess loss against step, log scale, with
  horizontal theory lines;
* :func:`plot_grouped_bars` -- final excess losses as grouped bars with error bars and theory
  markers;
* :func:`plot_depth_sweep` -- model A with ``L = 1..K`` layers against model B with
  ``d = 1..K`` channels (a :class:`fvlib.experiments.inbuild.DepthSweep`), with theory curves;
* :func:`plot_controls` -- the controls experiments' depth curves on the tree and on its
  Gaussian twin, each on semilog and log-log axes, with the finite-``N`` floor.

Colours: the Okabe-Ito palette (colour-blind safe), one fixed colour per model
(:data:`fvlib.plots.style.MODEL_COLORS`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from ..stats import seed_mean
from .style import MODEL_COLORS, OKABE_ITO, STRATEGY_LABELS, VARIANT_STYLES, palette, variant_color

__all__ = [
    "THEORY_STYLES",
    "theory_label",
    "plot_covariance_heatmaps",
    "plot_training_curves",
    "plot_grouped_bars",
    "plot_depth_sweep",
    "plot_controls",
    "FLOOR_STYLE",
]

#: Colours of successive runs whose label names no model.
_SERIES = palette("blue", "orange", "green", "vermillion", "purple", "sky", "yellow", "black")

#: Line styles and colours of the theory curves, each labelled with the word theory and the
#: strategy's entry in :data:`~fvlib.plots.style.STRATEGY_LABELS`.
THEORY_STYLES = {
    "adaptive_greedy": dict(color=OKABE_ITO["green"], ls="--", label=f"theory: {STRATEGY_LABELS['adaptive_greedy']}"),
    "nonadaptive_opt": dict(color=OKABE_ITO["orange"], ls="--", label=f"theory: {STRATEGY_LABELS['nonadaptive_opt']}"),
    "nonadaptive_coord": dict(color=OKABE_ITO["purple"], ls=":",
                              label=f"theory: {STRATEGY_LABELS['nonadaptive_coord']}"),
    "lmmse": dict(color=OKABE_ITO["blue"], ls="--", label=f"theory: {STRATEGY_LABELS['lmmse']}"),
    "adaptive_opt": dict(color=OKABE_ITO["black"], ls="-.", label=f"theory: {STRATEGY_LABELS['adaptive_opt']}"),
    "gaussian_closed_form": dict(color="0.3", ls="--", label="Gaussian closed form"),
    "nonadaptive_best_coord": dict(color="0.5", ls=":",
                                   label=f"theory: {STRATEGY_LABELS['nonadaptive_best_coord']}"),
    "twin": dict(color="0.3", ls="--", label="theory: the twin's closed form (A, B and C alike)"),
}

#: The finite-``N`` floor's line (:func:`plot_controls`).
FLOOR_STYLE = dict(color="0.2", ls=(0, (1, 3)), lw=1.2)


def theory_label(name: str) -> str:
    """The legend text of the theory baseline ``name`` (:data:`THEORY_STYLES`; an unknown name
    as it is)."""
    return THEORY_STYLES[name]["label"] if name in THEORY_STYLES else name


def plot_covariance_heatmaps(covs, titles: Sequence[str], axes=None, vmax: float | None = None, cmap="RdBu_r"):
    """One heatmap per ``(D, D)`` covariance matrix, on a shared symmetric colour scale.

    Ticks mark the first node of each tree level (heap order: ``2^k - 1``).

    Returns the list of ``AxesImage`` objects (one per matrix); the colour bar is left to the caller.
    """
    covs = [np.asarray(torch.as_tensor(c).detach().cpu(), dtype=float) for c in covs]
    if axes is None:
        _, axes = plt.subplots(1, len(covs), figsize=(3.2 * len(covs), 3.0))
    axes = np.atleast_1d(axes)
    if vmax is None:
        vmax = max(float(np.abs(c).max()) for c in covs) or 1.0
    images = []
    for ax, c, title in zip(axes, covs, titles):
        images.append(ax.imshow(c, cmap=cmap, vmin=-vmax, vmax=vmax))
        ticks = [2**k - 1 for k in range(int(np.log2(c.shape[0] + 1)) + 1) if 2**k - 1 < c.shape[0]]
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("node")
        ax.set_ylabel("node")
    return images


def plot_training_curves(
    histories: Mapping[str, Sequence[Mapping]],
    theory: Mapping[str, float] | None = None,
    ax=None,
    colors: Mapping[str, str] | None = None,
    title: str | None = None,
):
    """Evaluation excess loss against training step (log ``y``), one line per run.

    Args:
        histories: ``{label: history}`` where ``history`` is ``TrainResult.history`` (a list of
            dicts with ``step``, ``eval_excess_loss``, ``eval_stderr``), or
            ``{label: [history, ...]}``, one history per seed (the same steps): then the line is
            the mean over seeds, the band spans the seeds' smallest to largest value, and the
            error bars are ``+-2`` Monte Carlo standard errors of the mean. The first character
            of the label picks the colour from :data:`~fvlib.plots.style.MODEL_COLORS` unless
            ``colors`` is given.
        theory: ``{label: value}``; each is drawn as a dashed horizontal line in the colour of
            the run with the same label.
    Returns the axes.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.6))
    colors = dict(colors or {})
    for i, (label, hist) in enumerate(histories.items()):
        color = colors.get(label, MODEL_COLORS.get(label[:1], _SERIES[i % len(_SERIES)]))
        colors[label] = color
        if hist and not isinstance(hist[0], Mapping):  # one history per seed
            steps = np.array([h["step"] for h in hist[0]], dtype=float)
            if any([h["step"] for h in other] != list(steps) for other in hist):
                raise ValueError(f"the seeds of {label!r} were evaluated at different steps")
            losses = np.array([[h["eval_excess_loss"] for h in other] for other in hist], dtype=float)
            ses = np.array([[h.get("eval_stderr", 0.0) for h in other] for other in hist], dtype=float)
            loss, se, _ = seed_mean(losses, ses)
            ax.errorbar(steps, loss, yerr=2 * se, fmt="o-", ms=3, capsize=2, color=color,
                        label=f"{label} (mean of {len(hist)} seeds)")
            ax.fill_between(steps, losses.min(0), losses.max(0), color=color, alpha=0.25, lw=0)
            continue
        steps = np.array([h["step"] for h in hist], dtype=float)
        loss = np.array([h["eval_excess_loss"] for h in hist], dtype=float)
        se = np.array([h.get("eval_stderr", 0.0) for h in hist], dtype=float)
        ax.plot(steps, loss, "o-", ms=3, color=color, label=label)
        ax.fill_between(steps, np.maximum(loss - 2 * se, 1e-12), loss + 2 * se, color=color, alpha=0.2, lw=0)
    for label, value in (theory or {}).items():
        ax.axhline(value, color=colors.get(label, "0.3"), ls="--", lw=1.2)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel(r"excess loss $\mathbb{E}\,\|\hat\theta-\theta\|^2$")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return ax


def plot_grouped_bars(
    values: Mapping[str, Mapping[str, tuple[float, float]]],
    theory: Mapping[str, Mapping[str, float]] | None = None,
    ax=None,
    log: bool = True,
    points: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
):
    """Grouped bars with ``+-2`` standard-error bars and theory markers.

    Args:
        values: ``{group: {label: (mean, stderr)}}`` (e.g. group = prior, label = model).
        theory: ``{group: {label: value}}``; each is drawn as a black horizontal tick
            on top of the bar with the same group and label.
        points: ``{group: {label: [value, ...]}}``, e.g. each seed's value when the bar is
            their mean; drawn as small white dots on the bar, spread sideways.
    Returns ``{label: BarContainer}``.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    groups = list(values)
    labels = list(dict.fromkeys(lab for g in groups for lab in values[g]))
    width = 0.8 / len(labels)
    bars = {}
    marker_done = dots_done = False
    for j, lab in enumerate(labels):
        xs = np.arange(len(groups)) + (j - (len(labels) - 1) / 2) * width
        means = np.array([values[g].get(lab, (np.nan, 0.0))[0] for g in groups], dtype=float)
        ses = np.array([values[g].get(lab, (np.nan, 0.0))[1] for g in groups], dtype=float)
        # past the palette's length the colours repeat, hatched, so every label stays distinct
        color = MODEL_COLORS.get(lab, _SERIES[j % len(_SERIES)])
        hatch = "//" if lab not in MODEL_COLORS and j >= len(_SERIES) else None
        bars[lab] = ax.bar(
            xs, means, width * 0.92, yerr=2 * ses, capsize=3, color=color, hatch=hatch,
            edgecolor="white" if hatch else None, label=lab
        )
        for x, g in zip(xs, groups):
            pts = np.asarray((points or {}).get(g, {}).get(lab, []), dtype=float)
            if pts.size:
                offsets = np.linspace(-0.25, 0.25, pts.size) * width if pts.size > 1 else [0.0]
                ax.scatter(x + np.asarray(offsets), pts, s=12, color="white", edgecolor="black",
                           linewidth=0.6, zorder=3, label=None if dots_done else "single seeds")
                dots_done = True
            if theory and lab in theory.get(g, {}):
                ax.plot(
                    [x - width * 0.45, x + width * 0.45], [theory[g][lab]] * 2, color="black", lw=2.5,
                    label=None if marker_done else "theory",
                )
                marker_done = True
    ax.set_xticks(np.arange(len(groups)))
    ax.set_xticklabels(groups)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(r"final excess loss")
    ax.legend(fontsize=8)
    return bars


def plot_depth_sweep(sweep, theory: Mapping[str, tuple] | None = None, ax=None, labels=None,
                     fits: Mapping[str, object] | None = None):
    """Excess loss against budget (log ``y``): trained models as points with ``+-2`` s.e. bars,
    theory strategies as dashed lines (styles from :data:`THEORY_STYLES`). Returns the axes.

    With several seeds (``sweep.seed_loss``) the points are the means over seeds with ``+-2``
    Monte Carlo standard errors of the mean, the band spans the seeds' smallest to largest
    loss, and each seed is a small dot. ``fits``: ``{model: DecayFit}``
    (:func:`fvlib.theory.fits.fit_decay` of that model's curve), drawn as a thin line of the
    law it is fitted best by. ``sweep``: a :class:`~fvlib.experiments.inbuild.DepthSweep` (or any
    object with its fields; plots import no computing layer).
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.8))
    labels = labels or {"A": "model A (L = M layers, d = 1)", "B": "model B (L = 1, d = M channels)"}
    n_seeds = len(getattr(sweep, "seeds", (0,)))
    for model, loss in sweep.loss.items():
        color = variant_color(model)
        marker = VARIANT_STYLES.get(model, {}).get("marker", "o")
        label = labels.get(model, VARIANT_STYLES.get(model, {}).get("label", f"model {model}"))
        ax.errorbar(
            sweep.budgets, loss, yerr=2 * sweep.stderr[model], fmt=marker + "-", ms=6, lw=2, capsize=3,
            color=color, label=label + (f", mean of {n_seeds} seeds" if n_seeds > 1 else ""),
        )
        per_seed = getattr(sweep, "seed_loss", {}).get(model)
        if per_seed is not None and len(per_seed) > 1:
            ax.fill_between(sweep.budgets, per_seed.min(0), per_seed.max(0), color=color, alpha=0.25, lw=0)
            for row in per_seed:
                ax.plot(sweep.budgets, row, ".", ms=3, color=color, alpha=0.8)
        fit = (fits or {}).get(model)
        if fit is not None:
            law = fit.predict_exponential if fit.best == "exponential" else fit.predict_power
            ax.plot(sweep.budgets, law(sweep.budgets), color=color, lw=0.8, ls="-.",
                    label=f"fit to {model}: {fit.best}")
    for name, (mean, _se) in (theory or {}).items():
        style = dict(THEORY_STYLES.get(name, dict(color="0.4", ls="--", label=name)))
        ax.plot(sweep.budgets, mean, lw=1.4, marker="x", ms=5, **style)
    ax.set_yscale("log")
    ax.set_xticks(sweep.budgets)
    ax.set_xlabel("budget M (layers for A, channels for B)")
    ax.set_ylabel(r"excess loss $\mathbb{E}\,\|\hat\theta-\theta\|^2$")
    ax.legend(fontsize=7.5)
    return ax


def plot_controls(panels: Sequence[tuple], floor: float | None = None):
    """The controls experiments' depth curves: one row per panel, each drawn on semilog (left)
    and log-log (right) axes by :func:`plot_depth_sweep`, the row's legend below it (one
    subfigure per row).

    ``panels``: ``(title, sweep, theory)`` per row (a :class:`~fvlib.experiments.inbuild.DepthSweep`
    of the row's variants and ``{name: (mean (n,), stderr (n,))}`` of its theory curves, as
    :func:`plot_depth_sweep` takes them). ``floor``: the finite-``N`` floor, a dotted horizontal
    line on the tree rows (those whose theory is not only the twin's). Returns the ``(rows, 2)``
    array of axes (their figure: ``axes[0, 0].figure.figure``).
    """
    heights = [4.8 if set(theory) != {"twin"} else 3.8 for _, _, theory in panels]
    figure = plt.figure(figsize=(10, sum(heights)), layout="constrained")
    rows = figure.subfigures(len(panels), 1, height_ratios=heights, squeeze=False)[:, 0]
    axes = np.array([row.subplots(1, 2) for row in rows])
    for (title, sweep, theory), row, subfigure in zip(panels, axes, rows):
        for ax, scale in zip(row, ("semilog", "log-log")):
            plot_depth_sweep(sweep, theory, ax=ax)
            if floor is not None and set(theory) != {"twin"}:
                ax.axhline(floor, label="theory: the finite-N floor (every coordinate read)", **FLOOR_STYLE)
            if scale == "log-log":
                ax.set_xscale("log")
                ax.set_xticks(sweep.budgets, [str(b) for b in sweep.budgets])
                ax.minorticks_off()
            ax.set_title(f"{title}, {scale}", fontsize=10)
            if ax.get_legend() is not None:
                ax.get_legend().remove()
        row[1].set_ylabel("")
        subfigure.legend(*row[1].get_legend_handles_labels(), fontsize=8, ncol=2, loc="outside lower center",
                         frameon=False)
    return axes
