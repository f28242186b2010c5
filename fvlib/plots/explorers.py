"""The figures of the six explorers of :mod:`fvlib.explorers`, as figure functions a
chapter can call too.

Each function draws the results it is given (it samples, trains and patches nothing) on a
``matplotlib.figure.Figure`` and returns it. Without ``figure`` a new one is made outside
pyplot (no global state, safe from the explorers' background threads); pass
``plt.figure(figsize=...)`` to draw into a pyplot figure instead.

* :func:`plot_prior_sample` -- the tree with a sampled path beside the sampled ``theta`` and a
  draw from the Gaussian twin (chapter 2);
* :func:`plot_strategy_curves` -- Monte Carlo losses of the adaptive greedy, non-adaptive and
  LMMSE strategies over budgets, from a :class:`fvlib.theory.sweeps.DecaySweep` (chapter 6);
* :func:`plot_training_run` -- a run's evaluation loss against its theory baseline (chapter 8);
* :func:`plot_patching_cell` -- the key-patching heatmap with one cell outlined, its row for the
  model and the theory, and what that patch does to each level of the prediction (chapter 10);
* :func:`plot_dp_policy_state` -- the optimal two-layer DP policy at one noise level beside
  the values of the optimal, greedy and non-adaptive policies (chapter 4);
* :func:`plot_layer_split_state` -- a budget split into layers: tree against Gaussian twin
  over the number of layers and over the budget (chapter 5).

The last two draw a state of :func:`fvlib.explorers.states.dp_policy_state` or
:func:`fvlib.explorers.states.layer_split_state` (a dict of plain numbers); the explorers'
states are the functions of :mod:`fvlib.explorers.states`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from ..interventions import patching_ratio
from ..priors import TreePrior
from .decay import plot_decay
from .interventions import plot_patching_heatmap
from .style import MODEL_COLORS, OKABE_ITO, STRATEGY_LABELS
from .training import theory_label
from .trees import draw_policy_tree, draw_tree_prior

__all__ = [
    "STRATEGY_COLORS",
    "plot_prior_sample",
    "plot_strategy_curves",
    "plot_training_run",
    "plot_patching_cell",
    "policy_from_state",
    "plot_dp_policy_state",
    "plot_layer_split_state",
]

#: Colours of the strategies in :func:`plot_strategy_curves` (those of models A, B, C).
STRATEGY_COLORS = {"adaptive_greedy": MODEL_COLORS["A"], "nonadaptive_coord": MODEL_COLORS["B"],
                   "lmmse": MODEL_COLORS["C"]}


def _figure(figure, figsize) -> Figure:
    return Figure(figsize=figsize) if figure is None else figure


def plot_prior_sample(tree, signs, theta, twin_theta, figure=None) -> Figure:
    """The tree prior with the sampled path ``signs (K,)`` (left) and, as bars over the
    coordinates in heap order, the tree sample ``theta (D,)`` beside a Gaussian-twin sample
    ``twin_theta (D,)`` (right). Returns the figure (two axes)."""
    figure = _figure(figure, (11.5, 3.6))
    depth = tree.depth
    ax_tree, ax_theta = figure.subplots(1, 2, gridspec_kw={"width_ratios": [1.1, 1.4]})
    draw_tree_prior(tree, signs, ax=ax_tree, show_values=depth <= 4)
    ax_tree.set_title(f"tree prior, K = {depth}, alpha = {tree.alpha:.2f}: one path per context", fontsize=10)
    index = np.arange(tree.dim)
    ax_theta.bar(index - 0.2, np.asarray(theta), width=0.4, color=OKABE_ITO["vermillion"],
                 label=r"tree sample $\theta$")
    ax_theta.bar(index + 0.2, np.asarray(twin_theta), width=0.4, color=OKABE_ITO["blue"], label="Gaussian twin sample")
    for level in range(1, depth):
        ax_theta.axvline(2**level - 1.5, color="0.8", lw=0.8)
    ax_theta.axhline(0, color="k", lw=0.6)
    ax_theta.set_xlabel("coordinate n (heap order; grey lines separate levels)")
    ax_theta.set_ylabel(r"$\theta_n$")
    ax_theta.legend(fontsize=8, frameon=False)
    ax_theta.set_title("same second moments, different structure", fontsize=10)
    figure.tight_layout()
    return figure


def plot_strategy_curves(sweep, tree, strategies: Sequence[str] = tuple(STRATEGY_COLORS), figure=None) -> Figure:
    """Excess loss against budget (log ``y``, error bars 2 s.e.) of ``strategies`` in a
    :class:`fvlib.theory.sweeps.DecaySweep` of ``tree``; labels from
    :data:`~fvlib.plots.style.STRATEGY_LABELS`, colours from :data:`STRATEGY_COLORS`. The title
    states the task (``K``, ``alpha``, ``N``, ``sigma``, ``tau^2``). Returns the figure."""
    figure = _figure(figure, (7.5, 4.0))
    ax = figure.subplots()
    for name in strategies:
        plot_decay(ax, sweep.budgets, sweep.mean[name], yerr=sweep.stderr[name], label=STRATEGY_LABELS[name],
                   color=STRATEGY_COLORS[name])
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # budgets are counts
    ax.set_xlabel("budget M (= layers L for the adaptive strategy)")
    ax.set_ylabel(r"excess loss $\mathbb{E}\|\hat\theta-\theta\|^2$")
    ax.set_title(f"K = {tree.depth}, alpha = {tree.alpha:.2f}, N = {sweep.n_ctx}, sigma = {sweep.noise_std:.2f} "
                 f"(tau^2 = {sweep.tau2:.3g}); error bars 2 s.e.", fontsize=9)
    ax.legend(fontsize=8, frameon=False)
    figure.tight_layout()
    return figure


def plot_training_run(config, history: Sequence[Mapping], reference: Mapping, status: str, figure=None,
                      live: Sequence[Mapping] = ()) -> Figure:
    """Evaluation excess loss of a run against training step (log ``y``, band 2 s.e.) with its
    theory baseline as a dashed line.

    Args:
        config: the run's :class:`fvlib.training.config.TrainConfig` (model, prior, depth, budget, steps).
        history: ``TrainResult.history`` so far (may be empty).
        reference: :func:`fvlib.experiments.beside_theory.theory_reference` of the config (``name``, ``value``;
            the legend names it as :func:`fvlib.plots.training.theory_label` does).
        status: a few words for the title (e.g. ``"training"``).
        live: evaluations on the same held-out set between the run's own (``step``,
            ``eval_excess_loss``), drawn as open markers: the training explorer's early points.
    Returns the figure.
    """
    figure = _figure(figure, (7.0, 3.8))
    ax = figure.subplots()
    color = MODEL_COLORS[config.model]
    if history:
        steps = [h["step"] for h in history]
        loss = np.array([h["eval_excess_loss"] for h in history])
        err = 2 * np.array([h["eval_stderr"] for h in history])
        ax.fill_between(steps, np.maximum(loss - err, 1e-6), loss + err, color=color, alpha=0.2, lw=0)
        ax.plot(steps, loss, "o-", ms=3, color=color, label=f"model {config.model} (evaluation set, band 2 s.e.)")
    if live:
        ax.plot([p["step"] for p in live], [p["eval_excess_loss"] for p in live], "o:", ms=4, mfc="white",
                color=color, label="between evaluations (shown, not saved)")
    ax.axhline(reference["value"], ls="--", color="k", lw=1, label=theory_label(reference["name"]))
    ax.set_xlim(0, config.steps)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel(r"excess loss $\mathbb{E}\|\hat\theta-\theta\|^2$")
    ax.set_title(f"model {config.model}, {config.prior} prior, K = {config.depth}, M = {config.budget}: {status}",
                 fontsize=9)
    ax.legend(fontsize=8, frameon=False)
    figure.tight_layout()
    return figure


def plot_patching_cell(sweeps: Mapping, effect, figure=None) -> Figure:
    """One cell ``(m, l)`` of a key-patching sweep in context: the heatmap with the cell
    outlined (top left), row ``m`` of the heatmap for each sweep (top right) and, level by
    level, the overlap of the patched prediction with the target's and the donor's path
    (below).

    Args:
        sweeps: ``{"model": PatchingResult, "theory": PatchingResult}`` or just the theory's
            (the heatmap is the model's when there is one).
        effect: the :class:`fvlib.interventions.patching.LevelEffect` of the cell (its ``split_level`` and
            ``layer`` pick the cell).
    Returns the figure (three axes).
    """
    split_level, layer = effect.split_level, effect.layer
    main = sweeps["model"] if "model" in sweeps else sweeps["theory"]
    source = "trained model" if "model" in sweeps else "greedy theory policy"
    n_layers = patching_ratio(main).shape[1]
    # two panels on top, the level-by-level effect below: each readable at the width of the
    # book's column (a row of three was too small to read there)
    figure = _figure(figure, (9.0, 6.8))
    grid = figure.add_gridspec(2, 2, height_ratios=[1.0, 0.9], width_ratios=[1.0, 1.1])
    ax_map, ax_row = figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1])
    ax_level = figure.add_subplot(grid[1, :])
    plot_patching_heatmap(main, ax=ax_map, title=f"{source}:\nloss ratio, patched / unpatched", colorbar=False)
    ax_map.add_patch(Rectangle((layer - 1.45, split_level - 1.45), 0.9, 0.9, fill=False, ec="k", lw=2.5))
    layers = np.arange(1, n_layers + 1)
    for name, result in sweeps.items():
        ratio = patching_ratio(result)[split_level - 1]
        style = {"model": ("o-", MODEL_COLORS["A"], "trained model"), "theory": ("s--", "k", "greedy theory")}[name]
        ax_row.plot(layers, ratio, style[0], color=style[1], label=style[2], ms=5)
    ax_row.axvline(layer, color=OKABE_ITO["vermillion"], lw=1.2, label=f"patched layer l = {layer}")
    ax_row.axvspan(split_level + 0.5, n_layers + 0.5, color="0.92", zorder=0)
    ax_row.set_yscale("log")
    ax_row.set_xticks(layers)
    ax_row.set_xlim(0.5, n_layers + 0.5)
    ax_row.set_xlabel("patched layer l (shaded: l > m)")
    ax_row.set_ylabel("patched / unpatched loss")
    ax_row.set_title(f"row m = {split_level} of the heatmap", fontsize=11)
    ax_row.legend(fontsize=9, frameon=False, loc="best")
    target, donor, baseline = (np.asarray(v) for v in (effect.target, effect.donor, effect.baseline))
    levels = np.arange(len(target))
    ax_level.bar(levels - 0.2, target, 0.4, color=OKABE_ITO["green"], label="target's path")
    ax_level.bar(levels + 0.2, donor, 0.4, color=OKABE_ITO["orange"], label="donor's path")
    ax_level.plot(levels, baseline, "k_", ms=30, mew=2.5, label="unpatched (target)")
    ax_level.axhline(0, color="k", lw=0.6)
    ax_level.set_xticks(levels)
    ax_level.set_ylim(-1.15, 1.15)
    ax_level.set_xlim(-0.6, len(target) - 0.4)
    ax_level.set_xlabel("tree level k")
    ax_level.set_ylabel("overlap of the prediction")
    ax_level.set_title(f"patch (m = {split_level}, l = {layer}), level by level", fontsize=11)
    ax_level.legend(fontsize=9, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    return figure


#: Colours of the policies in :func:`plot_dp_policy_state` (those of chapter 4's figures).
POLICY_COLORS = {"optimal": OKABE_ITO["vermillion"], "greedy": OKABE_ITO["blue"],
                 "nonadaptive": OKABE_ITO["green"]}


def policy_from_state(state: Mapping) -> dict:
    """The nested policy dict of :func:`fvlib.theory.dp.dp_policy_tree` rebuilt from a
    :func:`fvlib.explorers.states.dp_policy_state` (``None`` interval ends are infinite)."""
    b = state["branches"]
    branches = [{"phi_range": (-math.inf if lo is None else lo, math.inf if hi is None else hi),
                 "node": n, "value": v, "branches": []}
                for lo, hi, n, v in zip(b["lo"], b["hi"], b["node"], b["value"])]
    return {"node": state["first_node"], "value": state["first_value"], "branches": branches}


def plot_dp_policy_state(state: Mapping, figure=None) -> Figure:
    """Left: the optimal policy of a :func:`fvlib.explorers.states.dp_policy_state` as a decision
    tree (:func:`fvlib.plots.trees.draw_policy_tree`), with the prior probability of every
    branch. Right: the expected final risks of the optimal, greedy and non-adaptive policies."""
    figure = _figure(figure, (10.0, 3.8))
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [2.3, 1]})
    tree = TreePrior(state["depth"], state["alpha"])
    draw_policy_tree(policy_from_state(state), tree, ax=left, legend=False)
    boxes = [t for t in left.texts if t.get_label() == "box"][1:]
    for box, p in zip(boxes, state["branches"]["prob"]):
        box.set_text(box.get_text() + f"\nP = {p:.3f}")
    left.set_title(f"optimal policy, tau = {state['tau']:g}, L = {state['layers']} "
                   "(P: probability of the branch)", fontsize=10)
    names = ["optimal", "greedy", "nonadaptive"]
    values = [state["values"][n] for n in names]
    right.bar(range(3), values, color=[POLICY_COLORS[n] for n in names])
    for i, v in enumerate(values):
        right.text(i, v, f"{v:.3f}", ha="center", va="bottom", fontsize=8.5)
    right.set_xticks(range(3), ["optimal", "greedy", "non-\nadaptive"], fontsize=9)
    right.set_ylabel("expected final risk")
    right.set_ylim(0, 1.15 * max(values))
    right.set_title(f"optimal / greedy = {state['ratio']:.3f}", fontsize=10)
    figure.tight_layout()
    return figure


def plot_layer_split_state(state: Mapping, figure=None) -> Figure:
    """A :func:`fvlib.explorers.states.layer_split_state`: left, the loss of ``M`` measurements
    against the number of layers ``L`` for the tree and the Gaussian twin (the chosen ``L``
    marked); right, the loss against the budget at the chosen ``L``."""
    figure = _figure(figure, (10.0, 3.6))
    left, right = figure.subplots(1, 2)
    tree_c, gauss_c = OKABE_ITO["vermillion"], OKABE_ITO["blue"]
    L, M = state["layers"], state["budget"]
    left.plot(state["layer_axis"], state["tree_by_layers"], "o-", ms=4, color=tree_c, label="tree (adaptive)")
    left.plot(state["layer_axis"], [state["gaussian_loss"]] * len(state["layer_axis"]), "s--", ms=3.5,
              color=gauss_c, label="Gaussian twin")
    left.plot([L], [state["tree_loss"]], "o", ms=10, mfc="none", mec="black", label=f"L = {L}")
    left.set_xlabel(f"layers L (budget M = {M} split evenly)")
    left.set_ylabel("excess loss (no noise)")
    left.legend(fontsize=8.5, frameon=False)
    right.plot(state["budget_axis"], state["tree_by_budget"], "o-", ms=4, color=tree_c,
               label=f"tree, L = {L}")
    right.plot(state["budget_axis"], state["gaussian_by_budget"], "s--", ms=3.5, color=gauss_c,
               label="Gaussian twin, any L")
    right.plot([M], [state["tree_loss"]], "o", ms=10, mfc="none", mec="black", label=f"M = {M}")
    right.set_xlabel("budget M")
    right.legend(fontsize=8.5, frameon=False)
    top = 1.05 * max(max(state["gaussian_by_budget"]), max(state["tree_by_budget"]), max(state["tree_by_layers"]))
    for ax in (left, right):
        ax.set_ylim(-0.02 * top, top)
        ax.set_xlim(0.5, state["budget_axis"][-1] + 0.5)  # the same axes at every setting
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers and budgets are counts
        ax.grid(alpha=0.3)
    sizes = state["layer_sizes"]
    shown = ", ".join(map(str, sizes[:8])) + (", ..." if len(sizes) > 8 else "")
    figure.suptitle(f"K = {state['depth']}, alpha = {state['alpha']:g}; layer sizes {shown}", fontsize=10)
    figure.tight_layout()
    return figure
