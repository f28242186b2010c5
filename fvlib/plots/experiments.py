"""Training experiments of models A, B, C and their theory overlays (chapters 5, *Gaussian
prior*, and 8, *Experiments*; the book's appendix *Conventions*, sections "Models A, B, C" and "Strategies and their names").

Experiment loops and figures of the chapters "Gaussian prior: depth does not help" and
"Experiments: A vs B vs C":

* :func:`shared_configs` -- the book's SHARED training configurations (A, B, C on the tree
  prior and on its Gaussian twin), trained once and reused by every chapter through
  :func:`fvlib.train.run_dir_for`;
* :func:`train_all` -- train (or reload) a dict of configs, each into its ``run_dir_for``;
* :func:`twin_finite_n_loss` -- the Gaussian-twin closed form with the finite-``N`` term;
* :func:`tree_posterior_cov` and :func:`plot_covariance_heatmaps` -- posterior covariances
  (Gaussian: independent of the observations; tree: not);
* :func:`plot_training_curves` -- evaluation excess loss against step, log scale, with
  horizontal theory lines;
* :func:`plot_grouped_bars` -- final excess losses as grouped bars with error bars and theory
  markers;
* :func:`depth_sweep`, :func:`depth_sweep_theory` and :func:`plot_depth_sweep` -- model A
  with ``L = 1..K`` layers against model B with ``d = 1..K`` channels, with theory curves.

Colours: the Okabe-Ito palette (colour-blind safe), one fixed colour per model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
import torch

from ..priors import TreePrior
from ..theory import evaluate_strategies, tree_posterior_cov, twin_finite_n_loss  # noqa: F401 (re-exported)
from ..train import TrainConfig, TrainResult, run_dir_for, train
from .trees import OKABE_ITO as _OI

OKABE_ITO = [_OI[k] for k in ("blue", "orange", "green", "vermillion", "purple", "sky", "yellow", "black")]

__all__ = [
    "MODEL_COLORS",
    "THEORY_STYLES",
    "shared_configs",
    "train_all",
    "twin_finite_n_loss",
    "tree_posterior_cov",
    "plot_covariance_heatmaps",
    "plot_training_curves",
    "plot_grouped_bars",
    "DepthSweep",
    "depth_sweep",
    "depth_sweep_theory",
    "plot_depth_sweep",
]

#: One colour per model, used by every figure of the experiment chapters.
MODEL_COLORS = {"A": _OI["green"], "B": _OI["orange"], "C": _OI["blue"]}
#: Line styles and colours of the theory curves.
THEORY_STYLES = {
    "adaptive_greedy": dict(color=_OI["green"], ls="--", label="adaptive greedy (theory)"),
    "nonadaptive_opt": dict(color=_OI["orange"], ls="--", label="optimised non-adaptive (theory)"),
    "nonadaptive_coord": dict(color=_OI["purple"], ls=":", label="non-adaptive coordinates (theory)"),
    "lmmse": dict(color=_OI["blue"], ls="--", label="LMMSE (theory)"),
    "gaussian_closed_form": dict(color="0.3", ls="--", label="Gaussian closed form"),
}


def shared_configs(
    models: Sequence[str] = ("A", "B", "C"),
    priors: Sequence[str] = ("tree", "gaussian-twin"),
    **overrides,
) -> dict[tuple[str, str], TrainConfig]:
    """The SHARED configurations ``{(model, prior): TrainConfig}`` of the book.

    Depth ``K = 5``, ``alpha = 0.5``, ``N = 128``, ``sigma = 0``, budget ``M = 5``, 1500 steps;
    ``overrides`` change any :class:`~fvlib.train.TrainConfig` field for all of them (e.g. a
    bigger ``FULL`` run). With no overrides the run directories are shared between chapters.
    """
    base = dict(depth=5, alpha=0.5, n_ctx=128, noise_std=0.0, budget=5, steps=1500)
    base.update(overrides)
    return {(m, p): TrainConfig(model=m, prior=p, **base) for p in priors for m in models}


def train_all(configs: Mapping, progress: bool = True) -> dict:
    """Train every config into ``run_dir_for(config)`` (reloaded when already trained).

    Returns ``{key: TrainResult}`` with the keys of ``configs``.
    """
    return {key: train(cfg, out_dir=run_dir_for(cfg), progress=progress) for key, cfg in configs.items()}


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
            dicts with ``step``, ``eval_excess_loss``, ``eval_stderr``). The first character of
            the label picks the colour from :data:`MODEL_COLORS` unless ``colors`` is given.
        theory: ``{label: value}``; each is drawn as a dashed horizontal line in the colour of
            the run with the same label.
    Returns the axes.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.6))
    colors = dict(colors or {})
    for i, (label, hist) in enumerate(histories.items()):
        color = colors.get(label, MODEL_COLORS.get(label[:1], OKABE_ITO[i % len(OKABE_ITO)]))
        colors[label] = color
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
):
    """Grouped bars with ``+-2`` standard-error bars and theory markers.

    Args:
        values: ``{group: {label: (mean, stderr)}}`` (e.g. group = prior, label = model).
        theory: ``{group: {label: value}}``; each is drawn as a black horizontal tick
            on top of the bar with the same group and label.
    Returns ``{label: BarContainer}``.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    groups = list(values)
    labels = list(dict.fromkeys(lab for g in groups for lab in values[g]))
    width = 0.8 / len(labels)
    bars = {}
    marker_done = False
    for j, lab in enumerate(labels):
        xs = np.arange(len(groups)) + (j - (len(labels) - 1) / 2) * width
        means = np.array([values[g].get(lab, (np.nan, 0.0))[0] for g in groups], dtype=float)
        ses = np.array([values[g].get(lab, (np.nan, 0.0))[1] for g in groups], dtype=float)
        bars[lab] = ax.bar(
            xs, means, width * 0.92, yerr=2 * ses, capsize=3, color=MODEL_COLORS.get(lab, OKABE_ITO[j]), label=lab
        )
        for x, g in zip(xs, groups):
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


@dataclass
class DepthSweep:
    """Final excess losses of trained models over a range of budgets.

    ``loss[model]`` and ``stderr[model]`` are arrays of shape ``(len(budgets),)``;
    ``configs[model]`` lists the :class:`~fvlib.train.TrainConfig` of each point.
    """

    budgets: np.ndarray
    loss: dict = field(default_factory=dict)
    stderr: dict = field(default_factory=dict)
    configs: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)


def depth_sweep(
    budgets: Sequence[int],
    models: Sequence[str] = ("A", "B"),
    progress: bool = True,
    **config,
) -> DepthSweep:
    """Train ``TrainConfig(model=X, budget=M, **config)`` for every model and budget.

    Model A with budget ``M`` has ``L = M`` layers of one channel; model B has one layer of
    ``d = M`` channels. Each run goes to ``run_dir_for`` (trained once, then reloaded). The
    reported loss is the final evaluation (``history[-1]``: ``eval_contexts`` fresh contexts).
    """
    out = DepthSweep(budgets=np.asarray(list(budgets), dtype=int))
    for model in models:
        cfgs = [TrainConfig(model=model, budget=int(m), **config) for m in budgets]
        res: list[TrainResult] = [train(c, out_dir=run_dir_for(c), progress=progress) for c in cfgs]
        out.configs[model] = cfgs
        out.results[model] = res
        out.loss[model] = np.array([r.history[-1]["eval_excess_loss"] for r in res])
        out.stderr[model] = np.array([r.history[-1]["eval_stderr"] for r in res])
    return out


def depth_sweep_theory(
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    budgets: Sequence[int],
    samples: int = 2000,
    seed: int = 0,
    strategies: Sequence[str] = ("adaptive_greedy", "nonadaptive_opt", "nonadaptive_coord"),
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Theory curves for :func:`plot_depth_sweep`: ``{strategy: (mean (n,), stderr (n,))}``.

    One :func:`fvlib.theory.evaluate_strategies` call per budget (finite-``N`` statistics,
    ``samples`` contexts, the same ``seed`` for every budget).
    """
    per = [
        evaluate_strategies(tree, n_ctx, noise_std, int(m), samples=samples, seed=seed, strategies=tuple(strategies))
        for m in budgets
    ]
    return {s: (np.array([p[s].mean for p in per]), np.array([p[s].stderr for p in per])) for s in strategies}


def plot_depth_sweep(sweep: DepthSweep, theory: Mapping[str, tuple] | None = None, ax=None, labels=None):
    """Excess loss against budget (log ``y``): trained models as points with ``+-2`` s.e. bars,
    theory strategies as dashed lines (styles from :data:`THEORY_STYLES`). Returns the axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.8))
    labels = labels or {"A": "model A (L = M layers, d = 1)", "B": "model B (L = 1, d = M channels)"}
    for model, loss in sweep.loss.items():
        ax.errorbar(
            sweep.budgets, loss, yerr=2 * sweep.stderr[model], fmt="o-", ms=6, lw=2, capsize=3,
            color=MODEL_COLORS.get(model, "k"), label=labels.get(model, f"model {model}"),
        )
    for name, (mean, _se) in (theory or {}).items():
        style = dict(THEORY_STYLES.get(name, dict(color="0.4", ls="--", label=name)))
        ax.plot(sweep.budgets, mean, lw=1.4, marker="x", ms=5, **style)
    ax.set_yscale("log")
    ax.set_xticks(sweep.budgets)
    ax.set_xlabel("budget M (layers for A, channels for B)")
    ax.set_ylabel(r"excess loss $\mathbb{E}\,\|\hat\theta-\theta\|^2$")
    ax.legend(fontsize=7.5)
    return ax
