"""Monte Carlo sweeps of the theory and its closed forms over budgets and over grids of
``alpha`` and context lengths ``N``, returning plain results that :mod:`fvlib.plots` draws.

Decay with depth and budget (chapter 6, *Tree prior*):

* :func:`closed_form_curves` -- the two noise-free closed forms over a range of budgets;
* :func:`best_coord_curves` -- the noise-free loss of the best fixed coordinate set and its
  two bounds over a range of budgets;
* :func:`decay_sweep` -- Monte Carlo losses of several strategies over a range of budgets
  (one :func:`fvlib.theory.strategies.evaluate_strategies` call per budget, same seed, so
  every budget sees the same contexts);
* :func:`advantage_sweep` -- the adaptive advantage over a grid of ``alpha`` and context
  lengths ``N``.

Beside the depth sweep (chapter 8, *Experiments*):

* :func:`depth_sweep_theory` -- :func:`decay_sweep`'s curves beside
  :func:`fvlib.experiments.inbuild.depth_sweep`, in the form
  :func:`fvlib.plots.training.plot_depth_sweep` takes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..priors import TreePrior
from .closed_forms import (
    best_fixed_method,
    best_fixed_nodes,
    channel_tau2,
    fixed_set_lower_bound,
    noisefree_adaptive_loss,
    noisefree_nodes_loss,
    noisefree_nonadaptive_loss,
)
from .strategies import evaluate_strategies

__all__ = [
    "AdvantageGrid",
    "DecaySweep",
    "advantage_sweep",
    "best_coord_curves",
    "closed_form_curves",
    "decay_sweep",
    "depth_sweep_theory",
]


def closed_form_curves(tree: TreePrior, budgets) -> dict[str, np.ndarray]:
    """Noise-free losses at each budget ``M`` in ``budgets`` (positive integers).

    Returns ``{"adaptive": (len(budgets),), "nonadaptive": (len(budgets),)}`` from
    :func:`fvlib.theory.closed_forms.noisefree_adaptive_loss` (``L = M`` layers, one node each) and
    :func:`fvlib.theory.closed_forms.noisefree_nonadaptive_loss` (the first ``M`` nodes in heap order).
    """
    budgets = [int(m) for m in budgets]
    return {
        "adaptive": np.array([noisefree_adaptive_loss(tree, m) for m in budgets]),
        "nonadaptive": np.array([noisefree_nonadaptive_loss(tree, m) for m in budgets]),
    }


def best_coord_curves(tree: TreePrior, budgets) -> dict[str, np.ndarray]:
    """Noise-free losses of fixed coordinate sets at each budget ``M`` in ``budgets``.

    Returns ``(len(budgets),)`` arrays: ``"best"``, the loss of
    :func:`fvlib.theory.closed_forms.best_fixed_nodes` (exact: a dynamic program for depth
    ``K <= 6``, every subset for small ``comb(D, M)``; a local search otherwise);
    ``"exact"``, whether that value is the exact optimum (boolean); ``"heap"``, the first
    ``M`` nodes in heap order; ``"lower"``, the bound
    :func:`~fvlib.theory.closed_forms.fixed_set_lower_bound` below which no fixed set of ``M``
    coordinates can go; ``"upper"``, the loss ``sum_{k >= L} alpha^k`` of reading all
    ``2^(L-1)`` nodes of level ``L - 1`` for the largest ``L`` with ``2^(L-1) <= M`` (the
    remaining reads are not counted), an upper bound on the best set. Also ``"nodes"``: a
    list of the best sets.
    """
    budgets = [int(m) for m in budgets]
    a, K = tree.alpha, tree.depth
    nodes = [best_fixed_nodes(tree, m) for m in budgets]
    levels = [min(m.bit_length(), K) for m in budgets]  # L with 2^(L-1) <= M < 2^L
    return {
        "best": np.array([noisefree_nodes_loss(tree, n) for n in nodes]),
        "exact": np.array([best_fixed_method(tree, m) != "local" for m in budgets]),
        "heap": np.array([noisefree_nonadaptive_loss(tree, m) for m in budgets]),
        "lower": np.array([fixed_set_lower_bound(tree, m) for m in budgets]),
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

    One :func:`fvlib.theory.strategies.evaluate_strategies` call per budget with the same ``seed``: the
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

    Each cell is one :func:`fvlib.theory.strategies.evaluate_strategies` call with ``samples`` contexts
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


def depth_sweep_theory(
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    budgets: Sequence[int],
    samples: int = 2000,
    seed: int = 0,
    strategies: Sequence[str] = ("adaptive_greedy", "nonadaptive_opt", "nonadaptive_coord"),
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Theory curves for :func:`fvlib.plots.training.plot_depth_sweep`: ``{strategy: (mean (n,), stderr (n,))}``.

    The :func:`decay_sweep` of ``strategies`` (finite-``N`` statistics, ``samples`` contexts, the
    same ``seed`` for every budget).
    """
    sweep = decay_sweep(tree, n_ctx, noise_std, budgets, samples=samples, seed=seed, strategies=tuple(strategies))
    return {s: (sweep.mean[s], sweep.stderr[s]) for s in strategies}
