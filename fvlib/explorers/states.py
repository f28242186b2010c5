"""The states of the six explorers, and the grids of control values they are embedded on.

A *state* is what an explorer shows at one setting of its controls: a pure function of the
control values that returns plain JSON-able numbers (dicts of lists, floats, ints, strings).
The ipywidgets explorer (:mod:`fvlib.explorers.base`) calls it on every change of a
control and draws the result (with the figure functions of :mod:`fvlib.plots.explorers`); the
static book calls the same function on a grid of control values ahead of time
(:mod:`fvlib.explorers.live`), so the page shows the numbers the widget shows. Nothing here
imports a widget library: a state can be computed (and tested) without ipywidgets.

* :func:`prior_state` -- a path of the tree prior and a draw of its Gaussian twin (chapter 2);
* :func:`strategy_state` -- Monte Carlo curves of the adaptive greedy, non-adaptive and LMMSE
  strategies over budgets (chapter 6);
* :func:`training_state` -- a run's evaluation history beside its theory baseline (chapter 8);
* :func:`patching_state` -- one cell ``(m, l)`` of key patching, level by level (chapter 10);
* :func:`dp_policy_state` -- the optimal two-layer DP policy against greedy at one channel
  noise ``tau`` (chapter 4, exact quadrature);
* :func:`layer_split_state` -- a budget ``M`` split into ``L`` layers: the noise-free tree loss
  against the Gaussian twin's (chapter 5, closed forms); :func:`split_budget` is the split.

Each explorer's grid for the static page is a :class:`fvlib.explorers.live.LiveSpec` built by
one function here (:func:`prior_live`, :func:`strategy_live`, :func:`training_live`,
:func:`patching_live`, :func:`dp_policy_live`, :func:`layer_split_live`) from the grid of control
values (:data:`PRIOR_GRID`, :data:`STRATEGY_GRID`, :data:`DP_POLICY_GRID`,
:data:`LAYER_SPLIT_GRID`; the training and patching grids are the runs recorded and the cells
of the sweep).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from .._checks import check_int, check_number
from ..interventions import patching_ratio
from ..plots.explorers import POLICY_COLORS, STRATEGY_COLORS
from ..plots.style import MODEL_COLORS, OKABE_ITO, STRATEGY_LABELS
from ..plots.training import theory_label
from ..priors import GaussianPrior, TreePrior
from ..task import make_generator
from ..theory import (
    decay_sweep,
    dp_policy_tree,
    gaussian_coordinate_loss,
    leaf_values_at,
    noisefree_layered_loss,
    policy_value,
)
from ..training import TrainConfig
from .live import Control, LiveSpec

__all__ = [
    "PRIOR_GRID",
    "prior_state",
    "prior_live",
    "EXPLORER_STRATEGIES",
    "STRATEGY_GRID",
    "strategy_state",
    "strategy_live",
    "training_state",
    "training_live",
    "patching_state",
    "patching_live",
    "DP_POLICY_GRID",
    "DP_POLICY_SETTINGS",
    "dp_policy_state",
    "dp_policy_live",
    "LAYER_SPLIT_GRID",
    "LAYER_SPLIT_DEPTH",
    "split_budget",
    "layer_split_state",
    "layer_split_live",
]


def _grid_values(values, default) -> tuple:
    """``values`` with ``default`` added (the explorer's own setting is always on the grid)."""
    return tuple(sorted(set(values) | {default}))


# ----------------------------------------------------------------------------------------
# Prior explorer (chapter 2)
# ----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=32)
def _prior_pair(depth: int, alpha: float) -> tuple[TreePrior, GaussianPrior]:
    """The tree prior and its Gaussian twin (kept: the grid samples each one many times)."""
    tree = TreePrior(depth, alpha)
    return tree, GaussianPrior.twin_of(tree)


def prior_state(depth: int, alpha: float, seed: int) -> dict:
    """What the prior explorer shows at ``(depth, alpha, seed)``: a path of the tree prior and a
    draw of its Gaussian twin from ``make_generator(seed)`` (the path first).

    Returns ``{"depth", "alpha", "dim", "energy", "signs" (K,), "theta" (D,), "twin_theta" (D,),
    "nonzero"}`` (lists; ``nonzero`` counts the non-zero tree coordinates, always ``K``).
    """
    tree, twin = _prior_pair(depth, alpha)
    generator = make_generator(seed)
    signs = tree.sample_signs(1, generator)[0]
    theta = tree.theta_from_signs(signs)
    twin_theta = twin.sample(1, generator)[0]
    return {"depth": depth, "alpha": alpha, "dim": tree.dim, "energy": tree.energy, "signs": signs.tolist(),
            "theta": theta.tolist(), "twin_theta": twin_theta.tolist(), "nonzero": int((theta != 0).sum())}


#: The static page's grid of the prior explorer (the widget's sliders, alpha and the sample
#: seed coarser).
PRIOR_GRID = {"depth": tuple(range(2, 8)), "alpha": (0.05,) + tuple(round(0.1 * i, 2) for i in range(1, 11)),
              "seed": tuple(range(10))}


def prior_live(depth: int, alpha: float, seed: int) -> LiveSpec:
    """The prior explorer's grid (:data:`PRIOR_GRID`, with the explorer's own setting ``depth``,
    ``alpha``, ``seed`` added and shown first): :func:`prior_state` at every point."""
    controls = (Control("depth", "depth K", _grid_values(PRIOR_GRID["depth"], depth), depth),
                Control("alpha", "alpha", _grid_values(PRIOR_GRID["alpha"], alpha), alpha),
                Control("seed", "sample seed", _grid_values(PRIOR_GRID["seed"], seed), seed))
    colors = {"path": OKABE_ITO["vermillion"], "tree": OKABE_ITO["vermillion"], "twin": OKABE_ITO["blue"]}
    return LiveSpec("prior", controls, prior_state, shared={"colors": colors},
                    note="every setting of the grid was sampled by fvlib when this page was built "
                         "(prior_state, the widget's own function).")


# ----------------------------------------------------------------------------------------
# Strategy explorer (chapter 6)
# ----------------------------------------------------------------------------------------
#: The strategies the strategy explorer compares (their labels and colours are those of
#: :mod:`fvlib.plots.explorers`).
EXPLORER_STRATEGIES = ("adaptive_greedy", "nonadaptive_coord", "lmmse")


def strategy_state(depth: int, budget: int, alpha: float, n_ctx: int, noise_std: float, samples: int,
                   seed: int) -> dict:
    """What the strategy explorer shows: :func:`fvlib.theory.sweeps.decay_sweep` of the
    strategies ``EXPLORER_STRATEGIES`` (adaptive greedy, non-adaptive coordinates, LMMSE) on a
    depth-``depth`` tree at budgets ``1..min(budget, D)``
    (``samples`` contexts, ``seed``; the same contexts at every budget, so the curves up to a
    smaller budget are the first entries of these).

    Returns ``{"budgets", "tau2", "samples", "mean", "stderr" (per strategy, one entry per
    budget), "final" (the losses at the largest budget)}``.
    """
    tree = TreePrior(depth, alpha)
    budgets = np.arange(1, min(budget, tree.dim) + 1)
    sweep = decay_sweep(tree, n_ctx, noise_std, budgets, samples=samples, seed=seed, strategies=EXPLORER_STRATEGIES)
    final = {name: float(sweep.mean[name][-1]) for name in EXPLORER_STRATEGIES}
    return {"budgets": budgets.tolist(), "tau2": sweep.tau2, "samples": samples,
            "mean": {k: v.tolist() for k, v in sweep.mean.items()},
            "stderr": {k: v.tolist() for k, v in sweep.stderr.items()}, "final": final}


#: The static page's grid of the strategy explorer. Each point is a Monte Carlo sweep over all
#: budgets (about 0.7 s of one CPU core at depth 6 with 1000 contexts, most of it at N = 512),
#: so alpha, N and sigma are coarser than the widget's sliders (27 sweeps, about 20 s of one
#: core; benchmarks/bench_live.py).
STRATEGY_GRID = {"alpha": (0.25, 0.5, 1.0), "n_ctx": (32, 128, 512), "noise_std": (0.0, 0.5, 1.0)}


def strategy_live(depth, budget, alpha, n_ctx, noise_std, samples, seed) -> LiveSpec:
    """The strategy explorer's grid (:data:`STRATEGY_GRID`, with the explorer's own ``alpha``,
    ``n_ctx`` and ``noise_std`` added): :func:`strategy_state` up to the largest budget the
    widget offers (``min(2^depth - 1, 12)``) at every point; the budget is a view control (the
    page shows the first ``budget`` entries of the curves), starting at ``budget``."""
    max_budget = min(2**depth - 1, 12)
    controls = (Control("budget", "budget M", tuple(range(1, max_budget + 1)), budget, grid=False),
                Control("alpha", "alpha", _grid_values(STRATEGY_GRID["alpha"], alpha), alpha),
                Control("n_ctx", "context N", _grid_values(STRATEGY_GRID["n_ctx"], n_ctx), n_ctx),
                Control("noise_std", "noise sigma", _grid_values(STRATEGY_GRID["noise_std"], noise_std), noise_std))

    def compute(alpha, n_ctx, noise_std):
        return strategy_state(depth, max_budget, alpha, n_ctx, noise_std, samples, seed)

    shared = {"depth": depth, "seed": seed, "strategies": list(EXPLORER_STRATEGIES),
              "colors": {k: STRATEGY_COLORS[k] for k in EXPLORER_STRATEGIES},
              "labels": {k: STRATEGY_LABELS[k] for k in EXPLORER_STRATEGIES}}
    return LiveSpec("strategy", controls, compute, shared=shared,
                    note=f"each setting of the grid is a Monte Carlo sweep run by fvlib when this page was "
                         f"built (strategy_state, the widget's own function): {samples} contexts per point, "
                         f"seed {seed}, the same contexts at every budget.")


# ----------------------------------------------------------------------------------------
# Training explorer (chapter 8)
# ----------------------------------------------------------------------------------------
def training_state(config: TrainConfig, history: list[dict], reference: Mapping) -> dict | None:
    """What the training explorer shows of a run: its evaluation history (``history``, as
    :func:`fvlib.training.checkpoint.load_history` returns it) beside its theory baseline (``reference``, as
    :func:`fvlib.experiments.beside_theory.theory_reference` returns it); ``None`` when the run has no history.

    Returns ``{"model", "prior", "total_steps", "eval_contexts", "steps", "loss", "stderr"
    (one entry per evaluation), "theory", "theory_stderr", "theory_name", "theory_label" (its
    legend text), "theory_samples" (0 for a closed form)}``.
    """
    if not history:
        return None
    return {"model": config.model, "prior": config.prior, "total_steps": config.steps,
            "eval_contexts": config.eval_contexts, "steps": [h["step"] for h in history],
            "loss": [h["eval_excess_loss"] for h in history], "stderr": [h["eval_stderr"] for h in history],
            "theory": reference["value"], "theory_stderr": reference["stderr"], "theory_name": reference["name"],
            "theory_label": theory_label(reference["name"]), "theory_samples": reference["samples"]}


def training_live(states: Mapping, models: Sequence[str], priors: Sequence[str], values: Mapping,
                  base: TrainConfig) -> LiveSpec:
    """The training explorer's grid: ``states`` ``{(model, prior): training_state}`` of the runs
    recorded at the current steps (those never trained left out), played back step by step.

    ``models`` and ``priors``: the widget's options (a prior no model was trained on is not
    offered); ``values``: its current ``model``, ``prior`` and ``steps``; ``base``: its
    :class:`~fvlib.training.config.TrainConfig` (depth, budget, seed and the prior shown when
    nothing was recorded).
    """
    steps = values["steps"]
    # a prior no model was trained on is not offered
    shown = tuple(p for p in priors if any(key[1] == p for key in states)) or (base.prior,)
    recorded = sorted({step for state in states.values() for step in state["steps"]}) or [steps]
    prior = values["prior"] if values["prior"] in shown else shown[0]
    controls = (Control("model", "model", tuple(models), values["model"]),
                Control("prior", "prior", shown, prior),
                Control("step", "training step", tuple(recorded), recorded[-1], grid=False))
    return LiveSpec("training", controls, lambda model, prior: states.get((model, prior)),
                    shared={"depth": base.depth, "budget": base.budget, "colors": dict(MODEL_COLORS)},
                    note="a playback of the runs recorded when this page was built (the chapter's "
                         f"runs, seed {base.seed}); the widget in Jupyter or Colab trains new ones.")


# ----------------------------------------------------------------------------------------
# Patching explorer (chapter 10)
# ----------------------------------------------------------------------------------------
def patching_state(sweeps: Mapping, effect) -> dict:
    """What the patching explorer shows of one cell ``(m, l)``: the loss ratio of the cell and
    of its row ``m`` (of the model's sweep when ``sweeps`` has one, else the theory's) and, level
    by level, the overlaps of the patched prediction (``effect``, a
    :class:`fvlib.interventions.patching.LevelEffect`).

    Returns ``{"split_level", "layer", "ratio", "row" (L,), "target_overlap", "donor_overlap",
    "baseline_overlap" (K,), "contexts"}``.
    """
    main = sweeps["model"] if "model" in sweeps else sweeps["theory"]
    row = patching_ratio(main)[effect.split_level - 1]
    return {"split_level": effect.split_level, "layer": effect.layer, "ratio": float(row[effect.layer - 1]),
            "row": row.tolist(), "target_overlap": effect.target.tolist(), "donor_overlap": effect.donor.tolist(),
            "baseline_overlap": effect.baseline.tolist(), "contexts": effect.n_contexts}


def patching_live(tree: TreePrior, n_layers: int, split_level: int, layer: int, sweeps: Mapping,
                  compute: Callable[..., dict], *, source: str, contexts: int, seed: int) -> LiveSpec:
    """The patching explorer's grid: every cell ``(m, l)`` of a depth-``tree.depth`` tree and
    ``n_layers`` layers, starting at ``(split_level, layer)``; ``compute(split_level, layer)``
    gives its :func:`patching_state`. ``sweeps`` (``{"model"?, "theory"}``, each a
    :class:`fvlib.theory.patching.PatchingResult`) gives the heatmaps every state outlines a cell of;
    ``source``, ``contexts`` and ``seed`` are shown in the page's note."""
    grid = (Control("split_level", "split level m", tuple(range(1, tree.depth + 1)), split_level),
            Control("layer", "patched layer l", tuple(range(1, n_layers + 1)), layer))
    colors = {"split": OKABE_ITO["vermillion"], "cell": "#000000", "model": MODEL_COLORS["A"],
              "target": OKABE_ITO["green"], "donor": OKABE_ITO["orange"]}
    shared = {"source": source, "depth": tree.depth, "n_layers": n_layers, "contexts": contexts, "seed": seed,
              "colors": colors,
              "ratio": {name: patching_ratio(result).tolist() for name, result in sweeps.items()}}
    return LiveSpec("patching", grid, compute, shared=shared,
                    note=f"every cell was patched by fvlib when this page was built (patching_state, the "
                         f"widget's own function): {contexts} donor/target pairs per cell, seed {seed}.")


# ----------------------------------------------------------------------------------------
# DP policy explorer (chapter 4)
# ----------------------------------------------------------------------------------------
#: Control grid of :func:`dp_policy_state`: the channel noise levels ``tau`` (those of chapter 4's
#: two-layer table, plus 0.25).
DP_POLICY_GRID = {"tau": (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.25, 1.5)}

#: Fixed settings of :func:`dp_policy_state`: chapter 4's tree, two layers, its quadrature rule and
#: its observation grid (spacing 0.025 on ``[-2, 2]``).
DP_POLICY_SETTINGS = {"depth": 3, "alpha": 0.5, "layers": 2, "quad_points": 48, "rule": "hermite",
                      "phi_points": 161, "phi_max": 2.0}


def _normal_cdf(x: float) -> float:
    if math.isinf(x):
        return 1.0 if x > 0 else 0.0
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def dp_policy_state(tau: float = 0.6) -> dict:
    """The optimal two-layer policy (chapter 4) against greedy at channel noise ``tau``.

    Tree, layers and quadrature are :data:`DP_POLICY_SETTINGS`. Returns plain numbers:
    ``tau``, ``depth``, ``alpha``, ``layers``, ``quad_points``, ``rule``; ``values``
    (``optimal``, ``greedy``, ``nonadaptive``: expected final risks by the same quadrature)
    and ``ratio`` (optimal / greedy); ``first_node`` and ``first_value`` (the first
    measurement and its risk); ``branches``, lists over the intervals of the first observation
    ``phi_1``: ``lo``, ``hi`` (``None`` for an infinite end), ``node`` (the second measurement),
    ``value`` (its expected risk) and ``prob`` (the prior probability of the interval);
    ``remeasure_prob`` (probability that the first node is measured again). About 0.5 s.
    """
    cfg = DP_POLICY_SETTINGS
    check_number("tau", tau, 0.01, 5.0)
    tree = TreePrior(cfg["depth"], cfg["alpha"])
    quad = {"quad_points": cfg["quad_points"], "rule": cfg["rule"]}
    grid = torch.linspace(-cfg["phi_max"], cfg["phi_max"], cfg["phi_points"], dtype=torch.float64)
    policy = dp_policy_tree(tree, cfg["layers"], tau, phi_grid=grid, **quad)
    values = {p: policy_value(tree, cfg["layers"], tau, p, **quad) for p in ("optimal", "greedy", "nonadaptive")}
    centres = leaf_values_at(tree, torch.tensor([policy["node"]]))[0].tolist()  # theta[first] per leaf

    def prob(lo, hi):
        return sum(_normal_cdf((hi - c) / tau) - _normal_cdf((lo - c) / tau) for c in centres) / len(centres)

    branches = {"lo": [], "hi": [], "node": [], "value": [], "prob": []}
    for b in policy["branches"]:
        lo, hi = b["phi_range"]
        branches["lo"].append(None if math.isinf(lo) else float(lo))
        branches["hi"].append(None if math.isinf(hi) else float(hi))
        branches["node"].append(int(b["node"]))
        branches["value"].append(float(b["value"]))
        branches["prob"].append(float(prob(lo, hi)))
    again = sum(p for n, p in zip(branches["node"], branches["prob"]) if n == policy["node"])
    return {"tau": float(tau), "depth": cfg["depth"], "alpha": cfg["alpha"], "layers": cfg["layers"],
            "quad_points": cfg["quad_points"], "rule": cfg["rule"],
            "values": {k: float(v) for k, v in values.items()},
            "ratio": float(values["optimal"] / values["greedy"]),
            "first_node": int(policy["node"]), "first_value": float(policy["value"]),
            "branches": branches, "remeasure_prob": float(again)}


def dp_policy_live(tau: float) -> LiveSpec:
    """The DP policy explorer's grid (:data:`DP_POLICY_GRID`, starting at ``tau``):
    :func:`dp_policy_state` at every point."""
    controls = (Control("tau", "noise tau", DP_POLICY_GRID["tau"], tau),)
    colors = {name: POLICY_COLORS[name] for name in ("optimal", "greedy", "nonadaptive")}
    return LiveSpec("dp_policy", controls, dp_policy_state, shared={"colors": colors},
                    note="every value of tau was solved by fvlib when this page was built (dp_policy_state, "
                         "the widget's own function; exact quadrature, no Monte Carlo).")


# ----------------------------------------------------------------------------------------
# Layer split explorer (chapter 5)
# ----------------------------------------------------------------------------------------
#: Control grid of :func:`layer_split_state`: budget ``M``, layers ``L`` and decay ``alpha``.
LAYER_SPLIT_GRID = {"budget": tuple(range(1, 13)), "layers": tuple(range(1, 13)), "alpha": (0.3, 0.5, 0.7, 0.9)}

#: Tree depth of :func:`layer_split_state` (chapter 5's twin: ``K = 5``, ``D = 31``).
LAYER_SPLIT_DEPTH = 5


def split_budget(budget: int, layers: int) -> list[int]:
    """``budget`` measurements over ``layers`` layers as evenly as possible, larger layers
    first: ``[ceil(M/L)] * (M mod L) + [floor(M/L)] * (L - M mod L)`` (zeros when ``L > M``)."""
    check_int("budget", budget, 1)
    check_int("layers", layers, 1)
    base, extra = divmod(budget, layers)
    return [base + 1] * extra + [base] * (layers - extra)


def layer_split_state(budget: int = 6, layers: int = 2, alpha: float = 0.5) -> dict:
    """A budget of ``M`` coordinate measurements split into ``L`` layers (:func:`split_budget`):
    the tree prior against its Gaussian twin, without channel noise (closed forms).

    Tree: depth :data:`LAYER_SPLIT_DEPTH`, decay ``alpha``. Tree loss:
    :func:`fvlib.theory.closed_forms.noisefree_layered_loss` (breadth-first batches below the resolved
    path); Gaussian twin: :func:`fvlib.theory.closed_forms.gaussian_coordinate_loss` of its ``M`` largest
    variances with ``tau^2 = 0``, which does not depend on the split (adaptive choices gain
    nothing for a Gaussian prior, chapter 5). Returns plain numbers: ``budget``, ``layers``,
    ``alpha``, ``depth``, ``dim``, ``energy``, ``layer_sizes``, ``tree_loss``,
    ``gaussian_loss``; ``layer_axis`` (``1..M``, at most 12: a layer measures at least once)
    with ``tree_by_layers`` at this budget (the Gaussian loss is ``gaussian_loss`` whatever the
    split); ``budget_axis`` (``L..12``) with ``tree_by_budget`` and ``gaussian_by_budget`` at
    this number of layers. More layers than measurements leave layers empty (the explorer
    never offers that: its layers stay at most its budget).
    """
    check_int("budget", budget, 1, 64)
    check_int("layers", layers, 1, 64)
    check_number("alpha", alpha, 0.05, 1.0)
    tree = TreePrior(LAYER_SPLIT_DEPTH, alpha)
    variances = GaussianPrior.twin_of(tree).variances

    def tree_loss(m, n_layers):  # rounded to 1e-9: compact JSON, far below any difference shown
        return round(noisefree_layered_loss(tree, split_budget(m, n_layers)), 9)

    def gauss_loss(m):
        return round(gaussian_coordinate_loss(variances, m, 0.0), 9)

    layer_axis = [n for n in LAYER_SPLIT_GRID["layers"] if n <= budget]
    budget_axis = [m for m in LAYER_SPLIT_GRID["budget"] if m >= layers]
    return {"budget": budget, "layers": layers, "alpha": float(alpha), "depth": tree.depth, "dim": tree.dim,
            "energy": float(tree.energy), "layer_sizes": split_budget(budget, layers),
            "tree_loss": tree_loss(budget, layers), "gaussian_loss": gauss_loss(budget),
            "layer_axis": layer_axis, "tree_by_layers": [tree_loss(budget, n) for n in layer_axis],
            "budget_axis": budget_axis, "tree_by_budget": [tree_loss(m, layers) for m in budget_axis],
            "gaussian_by_budget": [gauss_loss(m) for m in budget_axis]}


def layer_split_live(budget: int, layers: int, alpha: float) -> LiveSpec:
    """The layer split explorer's grid (:data:`LAYER_SPLIT_GRID`, never more layers than
    budget, starting at ``budget``, ``layers``, ``alpha``): :func:`layer_split_state` at every
    point."""
    controls = (Control("budget", "budget M", LAYER_SPLIT_GRID["budget"], budget),
                Control("layers", "layers L", LAYER_SPLIT_GRID["layers"], layers, at_most="budget"),
                Control("alpha", "alpha", LAYER_SPLIT_GRID["alpha"], alpha))
    colors = {"tree": OKABE_ITO["vermillion"], "gaussian": OKABE_ITO["blue"], "mark": "#000000"}
    return LiveSpec("layer_split", controls, layer_split_state, shared={"colors": colors},
                    note="every setting of the grid was computed by fvlib when this page was built "
                         "(layer_split_state, the widget's own function; closed forms, no Monte Carlo).")
