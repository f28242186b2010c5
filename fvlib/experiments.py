"""The experiments of the chapters: the loops that train models, sweep Monte Carlo estimates
and run hooked models, returning plain results that :mod:`fvlib.plots` draws.

This layer sits between :mod:`fvlib.interventions` and :mod:`fvlib.plots`: it computes and does not
draw; the figure functions take its results. One section per chapter family:

Training (chapters 5, *Gaussian prior*, and 8, *Experiments*; the book's appendix
*Conventions*, section "Models A, B, C"):

* :func:`shared_configs` -- the book's SHARED training configurations (A, B, C on the tree
  prior and on its Gaussian twin), trained once and reused by every chapter through
  :func:`fvlib.training.config.run_dir_for`;
* :func:`train_all` -- train (or reload) a dict of configs, each into its ``run_dir_for``;
* :func:`seed_configs` and :func:`train_seeds` -- the same configs at more seeds, trained
  batched (:func:`fvlib.training.batched.train_many`) beside the runs of the configs' own seed;
* :func:`final_losses` -- the final excess losses and their standard errors of a list of runs;
* :func:`depth_sweep` and :func:`depth_sweep_theory` -- model A with ``L = 1..K`` layers
  against model B with ``d = 1..K`` channels (several seeds, batched), and the theory curves
  beside them.

Decay with depth and budget (chapter 6, *Tree prior*):

* :func:`closed_form_curves` -- the two noise-free closed forms over a range of budgets;
* :func:`best_coord_curves` -- the noise-free loss of the best fixed coordinate set and its
  two bounds over a range of budgets;
* :func:`decay_sweep` -- Monte Carlo losses of several strategies over a range of budgets
  (one :func:`fvlib.theory.strategies.evaluate_strategies` call per budget, same seed, so
  every budget sees the same contexts);
* :func:`advantage_sweep` -- the adaptive advantage over a grid of ``alpha`` and context
  lengths ``N``.

Inside a trained model (chapters 9, *Inside the model*, and 10, *Causal interventions*):

* :func:`measurement_profile` -- where each layer of a gated-router model puts its
  measurement weight, relative to the context's own path;
* :func:`workspace_projections` -- principal-component projections of the workspace
  ``Phi_l`` of every layer.

States of the explorers of chapters 4 and 5 (:func:`fvlib.widgets.dp_policy_explorer`,
:func:`fvlib.widgets.layer_split_explorer`): pure functions of the control values that return
plain JSON-able numbers (lists, floats, ints, strings), so the same state can be computed over
the control grid (:data:`DP_POLICY_GRID`, :data:`LAYER_SPLIT_GRID`) ahead of time:

* :func:`dp_policy_state` -- the optimal two-layer DP policy against greedy at one channel
  noise ``tau`` (exact quadrature);
* :func:`layer_split_state` -- a budget ``M`` split into ``L`` layers: the noise-free tree loss
  against the Gaussian twin's (closed forms); :func:`split_budget` is the split.

Which half of model A falls short (chapter 8, *Experiments*):

* :func:`router_bayes_decode` -- model A's own decoder against the exact posterior given the
  directions its router used in each context (router + Bayes decoder), on the same contexts;
* :func:`gap_table` -- those two beside greedy, the optimised non-adaptive directions and the
  optimised adaptive policy, for one trained run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ._checks import check_int, check_number, check_seed
from .hooks import hook_name
from .priors import GaussianPrior, TreePrior
from .stats import mean_and_stderr, paired_ratio, squared_error
from .theory import (
    FiniteSampleChannel,
    policy_predictor,
    strategy_predictor,
    best_fixed_method,
    best_fixed_nodes,
    channel_tau2,
    dp_policy_tree,
    evaluate_strategies,
    fixed_set_lower_bound,
    gaussian_coordinate_loss,
    leaf_values_at,
    optimise_adaptive_policy,
    optimise_directions,
    policy_rollout,
    noisefree_adaptive_loss,
    noisefree_layered_loss,
    noisefree_nodes_loss,
    noisefree_nonadaptive_loss,
    policy_value,
)
from .theory.adaptive_opt import GreedyRule
from .training import (IMITATION_RECIPE, ORIGINAL_RECIPE, TrainConfig, TrainResult, build_prior,
                       recipe_for, run_dir_for, train, train_many)
from .training.evaluate import model_predictor, per_context_errors, sample_eval_batches
from .workers import worker_pool

__all__ = [
    "shared_configs",
    "train_all",
    "train_parallel",
    "IMITATION_STEPS",
    "imitation_config",
    "learning_config",
    "TRANSFORMER_CHAPTER",
    "transformer_chapter_configs",
    "SHARED_SEEDS",
    "warm_work",
    "seed_configs",
    "seed_plan",
    "train_seeds",
    "final_losses",
    "DepthSweep",
    "depth_sweep_configs",
    "depth_sweep",
    "depth_sweep_theory",
    "closed_form_curves",
    "best_coord_curves",
    "DecaySweep",
    "decay_sweep",
    "AdvantageGrid",
    "advantage_sweep",
    "measurement_profile",
    "workspace_projections",
    "DP_POLICY_GRID",
    "DP_POLICY_SETTINGS",
    "dp_policy_state",
    "LAYER_SPLIT_GRID",
    "LAYER_SPLIT_DEPTH",
    "split_budget",
    "layer_split_state",
    "router_directions",
    "router_bayes_decode",
    "router_policy_alignment",
    "greedy_paired",
    "gap_table",
]


# ----------------------------------------------------------------------------------------
# Training (chapters 5 and 8)
# ----------------------------------------------------------------------------------------
def shared_configs(
    models: Sequence[str] = ("A", "B", "C"),
    priors: Sequence[str] = ("tree", "gaussian-twin"),
    **overrides,
) -> dict[tuple[str, str], TrainConfig]:
    """The SHARED configurations ``{(model, prior): TrainConfig}`` of the book.

    Depth ``K = 5``, ``alpha = 0.5``, ``N = 128``, ``sigma = 0``, budget ``M = 5``, 1500 steps,
    trained with the book's original recipe (:data:`fvlib.training.config.ORIGINAL_RECIPE`, not the
    current ``TrainConfig`` defaults); ``overrides`` change any
    :class:`~fvlib.training.config.TrainConfig` field for all of them (e.g. a bigger ``FULL`` run). With
    no overrides the run directories are shared between chapters.
    """
    base = dict(depth=5, alpha=0.5, n_ctx=128, noise_std=0.0, budget=5, steps=1500, **ORIGINAL_RECIPE)
    base.update(overrides)
    return {(m, p): TrainConfig(model=m, prior=p, **base) for p in priors for m in models}


def train_all(configs: Mapping, progress: bool = True) -> dict:
    """Train every config into ``run_dir_for(config)`` (reloaded when already trained).

    Returns ``{key: TrainResult}`` with the keys of ``configs``.
    """
    return {key: train(cfg, out_dir=run_dir_for(cfg), progress=progress) for key, cfg in configs.items()}


def _train_one_process(args) -> dict[str, float]:
    """Worker of :func:`train_parallel`: one thread, no progress bar; ``{run dir: final loss}``
    of one config trained alone, or of a batch trained by one ``train_many`` call."""
    item, root = args
    torch.set_num_threads(1)
    if isinstance(item, TrainConfig):
        out_dir = run_dir_for(item, root)
        return {str(out_dir): train(item, out_dir=out_dir, progress=False).final_loss}
    dirs = [run_dir_for(c, root) for c in item]
    results = train_many(list(item), dirs, progress=False)
    return {str(d): r.final_loss for d, r in zip(dirs, results)}


def _work_item(item) -> TrainConfig | tuple[TrainConfig, ...]:
    """A :func:`train_parallel` item checked: the config, or the batch as a tuple."""
    if isinstance(item, TrainConfig):
        return item
    if (isinstance(item, Sequence) and not isinstance(item, (str, bytes)) and item
            and all(isinstance(c, TrainConfig) for c in item)):
        return tuple(item)
    raise ValueError(f"work items must be TrainConfig objects or non-empty lists of them, got {item!r}")


def train_parallel(work: Sequence, jobs: int = 2, root=None) -> dict[str, float]:
    """Train every item of ``work``, ``jobs`` processes at a time, each process on one thread.

    An item is a :class:`~fvlib.training.config.TrainConfig`, trained alone into ``run_dir_for(config,
    root)``, or a list of them, trained together by one :func:`fvlib.training.batched.train_many` call
    into their ``run_dir_for`` directories. Each run is exactly the run that ``train`` (or
    ``train_many`` on the same list) gives on one thread: same directory, same numbers, since
    training is deterministic and the processes do not interact. Finished runs are loaded, not
    retrained, so a chapter that trains a run trained here just loads it. The items start in
    the order given: put the longest first. ``make book`` uses it to train the chapters' runs
    on both cores before the chapters execute (``python -m fvlib warm``, :func:`warm_work`).

    Returns ``{run directory: final excess loss}``.

    Raises:
        ValueError: ``jobs`` not a positive integer, or an item that is neither a TrainConfig
            nor a non-empty list of them.
    """
    jobs = check_int("jobs", jobs, 1)
    items = [(_work_item(item), root) for item in work]
    out: dict[str, float] = {}
    if jobs == 1 or len(items) <= 1:
        for item in items:
            out.update(_train_one_process(item))
        return out
    with worker_pool(min(jobs, len(items))) as pool:  # the workers end when this process ends
        for part in pool.imap_unordered(_train_one_process, items):
            out.update(part)
    return out


#: Training steps of chapter 8's imitation run of model A (:func:`imitation_config`).
IMITATION_STEPS = 3000


def imitation_config(base: TrainConfig) -> TrainConfig:
    """Chapter 8's model A after the imitation warm start: ``base`` (the shared run of model A,
    at ``K = 5`` or, in the chapter's ``FULL`` setting, ``K = 6``) with the recipe
    :data:`fvlib.training.config.IMITATION_RECIPE` (its router first fitted to the greedy policy) and
    :data:`IMITATION_STEPS` steps."""
    return replace(base, steps=IMITATION_STEPS, **IMITATION_RECIPE)


def learning_config(base: TrainConfig) -> TrainConfig:
    """Chapter 8's model A with the recipe of ``python -m fvlib train``: ``base`` (the shared run
    of model A) with :func:`fvlib.training.config.recipe_for` (:data:`fvlib.training.config.LEARNING_RECIPE`, on the
    tree its curriculum; no teacher: its random initialisation, nothing from a theory policy) and
    :data:`IMITATION_STEPS` steps, the imitation run's length, so the starts compare at the same
    number of steps."""
    return replace(base, steps=IMITATION_STEPS, **recipe_for(base.arch, base.prior, base.alpha))


#: The standard-transformer runs of chapter 11, as a dict with the task (``task``), the
#: bottlenecked models' training settings (``run``), the open ones' (``open_run``) and the
#: training seeds (``seeds``).
TRANSFORMER_CHAPTER = {
    "task": dict(depth=2, alpha=0.7, n_ctx=16, noise_std=0.0, budget=2),
    "run": dict(steps=300, batch=64, queries=64, width=32, lr=2e-3, warmup=0.0,
                eval_every=100, eval_contexts=1024, checkpoint_every=300),
    "open_run": dict(steps=300, batch=32, queries=16, width=32, lr=2e-3, warmup=0.0,
                     eval_every=100, eval_contexts=1024, checkpoint_every=300),
    "seeds": (1, 2),
}
def transformer_chapter_configs(device: str = "auto") -> list[TrainConfig]:
    """Chapter 11's in-build runs (:data:`TRANSFORMER_CHAPTER`): the bottlenecked A' and B' on
    the tree and its twin at every seed, then the open A' on both priors at every seed, in that
    order (model, prior, seed). (Its larger setting, K = 4, is the stored experiment
    ``transformers-k4`` of :mod:`fvlib.store`.)"""
    setting = TRANSFORMER_CHAPTER
    priors, seeds = ("tree", "gaussian-twin"), setting["seeds"]
    configs = [TrainConfig(arch="transformer", model=kind, prior=prior, seed=seed, device=device,
                           **setting["task"], **setting["run"])
               for kind in ("A", "B") for prior in priors for seed in seeds]
    return configs + [TrainConfig(arch="transformer-open", model="A", prior=prior, seed=seed,
                                  device=device, **setting["task"], **setting["open_run"])
                      for prior in priors for seed in seeds]


#: Chapter 8's training seeds of the shared runs and of its depth sweep (seed 0 of a shared
#: run is the run the other chapters load).
SHARED_SEEDS = (0, 1, 2)
def warm_work() -> list:
    """What ``python -m fvlib experiment warm`` trains ahead of the chapters (:func:`train_parallel` items).

    The runs chapters 5 and 7 to 11 train, each exactly as the chapter trains it (one thread):
    the batch of chapter 8's seeds 1 and 2 of the shared runs (:func:`seed_plan` with
    :data:`SHARED_SEEDS`), chapter 8's imitation and learning-recipe runs of model A
    (:func:`imitation_config`, :func:`learning_config`), the six
    shared runs alone (model A first) and chapter 11's transformers
    (:func:`transformer_chapter_configs`): the longest first. (Chapter 8's depth sweep is a
    stored experiment, ``depth-sweep-k6`` of :mod:`fvlib.store`, which no page build trains.)
    """
    shared = shared_configs()
    _, _, seeds_batch = seed_plan(shared, SHARED_SEEDS)
    alone = sorted(shared.values(), key=lambda c: "ABC".index(c.model))
    return [[c for _, c in seeds_batch], imitation_config(shared[("A", "tree")]),
            learning_config(shared[("A", "tree")]), *alone,
            *transformer_chapter_configs()]


def _check_seeds(seeds) -> list[int]:
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or not seeds:
        raise ValueError(f"seeds must be a non-empty list of seeds, got {seeds!r}")
    seeds = [check_seed("seed", s) for s in seeds]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {seeds!r}")
    return seeds


def seed_configs(config: TrainConfig, seeds: Sequence[int]) -> list[TrainConfig]:
    """``config`` at every seed of ``seeds``, all on ``config``'s data (common random numbers).

    Each copy changes ``seed`` (the initialisation) and keeps the training contexts and the
    evaluation set of ``config``: ``data_seed = config.effective_data_seed``. The copy at
    ``config``'s own seed is ``config`` itself (``data_seed`` untouched), so its run directory
    (:func:`~fvlib.training.config.run_dir_for`) is the one of ``config``. The seeds then differ only in
    the initial weights: the spread over them is the training's own variability on fixed
    data, and differences between models are measured on the same contexts.

    Raises:
        ValueError: ``seeds`` empty, not distinct, or holding a bad seed.
    """
    seeds = _check_seeds(seeds)
    data = config.effective_data_seed
    return [config if s == config.seed else replace(config, seed=s, data_seed=data) for s in seeds]


def seed_plan(configs: Mapping, seeds: Sequence[int], alone: Sequence | None = None) -> tuple[dict, dict, list]:
    """How :func:`train_seeds` trains ``configs`` at ``seeds``: ``(per_key, solo, batched)``.

    ``per_key``: ``{key: [config at each seed]}`` (:func:`seed_configs`); ``solo``: ``{key:
    config}``, the runs trained alone (the own seed of every key in ``alone``, default every
    key); ``batched``: ``[(key, config)]``, all the other runs, in the order of the one
    ``train_many`` call that trains them (so ``python -m fvlib warm`` can train the very same
    batch ahead).

    Raises:
        ValueError: a key of ``alone`` that is not a key of ``configs``, or bad ``seeds``.
    """
    alone_keys = list(configs) if alone is None else list(alone)
    unknown = [key for key in alone_keys if key not in configs]
    if unknown:
        raise ValueError(f"alone names keys that are not in configs: {unknown!r}")
    per_key = {key: seed_configs(cfg, seeds) for key, cfg in configs.items()}
    solo = {key: cfg for key, cfg in configs.items() if cfg.seed in seeds and key in alone_keys}
    batched = [(key, c) for key, cfgs in per_key.items() for c in cfgs
               if not (c is configs[key] and key in alone_keys)]
    return per_key, solo, batched


def train_seeds(configs: Mapping, seeds: Sequence[int], progress: bool = True,
                threads: int | None = None, alone: Sequence | None = None) -> dict:
    """Train (or reload) every config of ``configs`` at every seed (:func:`seed_configs`).

    The run at the own seed of a config whose key is in ``alone`` (default: every key) is
    trained alone, as :func:`train_all` does, so it is bitwise the run that other chapters
    load from the same directory, whichever chapter trains it first; all the other runs, of
    every config, are trained together in one :func:`fvlib.training.batched.train_many` call (their
    final losses agree with training each alone to a relative ``1e-4``; configs of one
    architecture share a stack whatever their prior). Every run goes to its
    :func:`~fvlib.training.config.run_dir_for` directory, and finished runs are loaded, not retrained.

    ``threads``: torch CPU threads of the batched call (:func:`fvlib.training.batched.train_many`); the
    runs trained alone keep the current setting, so they stay bitwise those runs.

    Returns ``{key: [TrainResult, one per seed in the order of seeds]}``.

    Raises:
        ValueError: a key of ``alone`` that is not a key of ``configs``, or bad ``seeds``.
    """
    per_key, solo_configs, extra = seed_plan(configs, seeds, alone)
    solo = {key: train(cfg, out_dir=run_dir_for(cfg), progress=progress) for key, cfg in solo_configs.items()}
    batched = train_many([c for _, c in extra], [run_dir_for(c) for _, c in extra],
                         progress=progress, threads=threads) if extra else []
    done = dict(zip([(key, c.seed) for key, c in extra], batched))
    return {key: [solo[key] if c is configs[key] and key in solo else done[(key, c.seed)]
                  for c in cfgs]
            for key, cfgs in per_key.items()}


def final_losses(results: Sequence[TrainResult]) -> tuple[np.ndarray, np.ndarray]:
    """``(loss (n,), stderr (n,))``: each run's final evaluation (``history[-1]``: its
    excess loss and the Monte Carlo standard error over ``eval_contexts`` contexts)."""
    return (np.array([r.history[-1]["eval_excess_loss"] for r in results]),
            np.array([r.history[-1]["eval_stderr"] for r in results]))


@dataclass
class DepthSweep:
    """Final excess losses of trained models over a range of budgets, at one or more seeds.

    ``seed_loss[model]`` and ``seed_stderr[model]`` have shape ``(len(seeds), len(budgets))``:
    each seed's final excess loss and its Monte Carlo standard error (``eval_contexts``
    contexts). ``loss[model]`` is the mean over seeds ``(len(budgets),)``, ``stderr[model]``
    the Monte Carlo standard error of that mean, ``sqrt(sum_s se_s^2) / n_seeds``, and
    ``spread[model]`` the standard deviation over seeds (``ddof=1``; zeros for one seed).
    ``configs[model]`` and ``results[model]`` list the points seed by seed, budgets within.
    """

    budgets: np.ndarray
    seeds: tuple = (0,)
    loss: dict = field(default_factory=dict)
    stderr: dict = field(default_factory=dict)
    spread: dict = field(default_factory=dict)
    seed_loss: dict = field(default_factory=dict)
    seed_stderr: dict = field(default_factory=dict)
    configs: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)


def depth_sweep_configs(budgets: Sequence[int], models: Sequence[str] = ("A", "B"),
                        seeds: Sequence[int] = (0,), **config) -> tuple[dict, list[TrainConfig]]:
    """The configs :func:`depth_sweep` trains: ``(grid, flat)``, ``grid[model]`` a list (one per
    seed) of lists (one per budget), ``flat`` all of them in the order of its one
    ``train_many`` call. Fields of ``config`` not given default to
    :data:`fvlib.training.config.ORIGINAL_RECIPE`."""
    seeds = _check_seeds(seeds)
    config = {**ORIGINAL_RECIPE, **config}
    config.setdefault("data_seed", None)
    grid = {}
    for model in models:
        first = [TrainConfig(model=model, budget=int(m), seed=seeds[0], **config) for m in budgets]
        per_seed = [seed_configs(c, seeds) for c in first]  # (budgets, seeds)
        grid[model] = [[per_seed[j][i] for j in range(len(first))] for i in range(len(seeds))]
    return grid, [c for model in models for row in grid[model] for c in row]


def depth_sweep(
    budgets: Sequence[int],
    models: Sequence[str] = ("A", "B"),
    progress: bool = True,
    seeds: Sequence[int] = (0,),
    threads: int | None = None,
    **config,
) -> DepthSweep:
    """Train ``TrainConfig(model=X, budget=M, seed=s, **config)`` for every model, budget and seed.

    Model A with budget ``M`` has ``L = M`` layers of one channel; model B has one layer of
    ``d = M`` channels. Every point is trained in one :func:`fvlib.training.batched.train_many` call
    into its :func:`~fvlib.training.config.run_dir_for` directory (trained once, then reloaded); the
    seeds of a point share their data (:func:`seed_configs`: the contexts and evaluation set
    of ``data_seed`` if given, else of the first seed), and so do all the points, whose stacks
    then read one draw of contexts per step. The reported loss is the final evaluation
    (``history[-1]``: ``eval_contexts`` fresh contexts, the same for every point). ``threads``:
    torch CPU threads of that call (``None``: the current setting). Fields of ``config`` not
    given default to :data:`fvlib.training.config.ORIGINAL_RECIPE`, the recipe the book's sweep used.
    """
    seeds = _check_seeds(seeds)
    grid, flat = depth_sweep_configs(budgets, models, seeds, **config)
    out = DepthSweep(budgets=np.asarray(list(budgets), dtype=int), seeds=tuple(seeds))
    results = iter(train_many(flat, [run_dir_for(c) for c in flat], progress=progress, threads=threads))
    for model in models:
        res = [[next(results) for _ in row] for row in grid[model]]  # (seeds, budgets)
        out.configs[model] = [c for row in grid[model] for c in row]
        out.results[model] = [r for row in res for r in row]
        losses = np.array([final_losses(row)[0] for row in res])
        stderrs = np.array([final_losses(row)[1] for row in res])
        out.seed_loss[model], out.seed_stderr[model] = losses, stderrs
        out.loss[model] = losses.mean(axis=0)
        out.stderr[model] = np.sqrt((stderrs**2).sum(axis=0)) / len(seeds)
        out.spread[model] = losses.std(axis=0, ddof=1) if len(seeds) > 1 else np.zeros(len(out.budgets))
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
    """Theory curves for :func:`fvlib.plots.training.plot_depth_sweep`: ``{strategy: (mean (n,), stderr (n,))}``.

    One :func:`fvlib.theory.strategies.evaluate_strategies` call per budget (finite-``N`` statistics,
    ``samples`` contexts, the same ``seed`` for every budget).
    """
    per = [
        evaluate_strategies(tree, n_ctx, noise_std, int(m), samples=samples, seed=seed, strategies=tuple(strategies))
        for m in budgets
    ]
    return {s: (np.array([p[s].mean for p in per]), np.array([p[s].stderr for p in per])) for s in strategies}


# ----------------------------------------------------------------------------------------
# Decay with depth and budget (chapter 6)
# ----------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------
# Inside a trained model (chapters 9 and 10)
# ----------------------------------------------------------------------------------------
def measurement_profile(model, tree, batch):
    """Where a gated-router model looks: for every layer ``l`` and tree level ``k``, the mean
    fraction of the squared weight of the measurement matrix ``G_l(Phi_{l-1})`` (all ``d``
    channels together) that falls on the context's *own* path node at level ``k``.

    ``batch``: a :class:`fvlib.task.TaskBatch` from ``tree`` (its ``signs`` give the paths).
    Returns a ``(L, K + 1)`` numpy array; the last column is the weight off the path. Rows sum
    to one. In the ideal adaptive policy row ``l`` is the indicator of level ``l - 1``.
    """
    if model.config.router != "gated":
        raise ValueError(f"measurement_profile needs a gated router, got {model.config.router!r}")
    with torch.no_grad():
        _, cache = model.run_with_cache(batch, names_filter=hook_name("workspace", "*"))
        nodes = tree.path_nodes(batch.signs.cpu())  # (B, K)
        rows = []
        for l in range(1, model.config.n_layers + 1):
            previous = cache[hook_name("workspace", l - 1)] if l > 1 else batch.x.new_zeros(batch.x.shape[0], 0)
            weight = (model.block(l).router.matrix(previous.to(batch.x.dtype)) ** 2).sum(1).double().cpu()  # (B, D)
            weight = weight / weight.sum(-1, keepdim=True)
            on_path = weight.gather(-1, nodes)  # (B, K)
            rows.append(torch.cat([on_path, 1 - on_path.sum(-1, keepdim=True)], dim=-1).mean(0))
    return torch.stack(rows).numpy()


def workspace_projections(model, batch, components: int = 2) -> list[dict]:
    """Principal-component projections of the workspace ``Phi_l`` of every layer.

    ``batch``: a :class:`fvlib.task.TaskBatch` with ``B`` contexts. For each layer ``l`` the
    centred workspaces ``(B, l d)`` are projected on their top ``min(components, l d)``
    principal directions (``torch.linalg.svd``). Returns a list of ``L`` dicts with
    ``coords`` (``(B, c)`` numpy array) and ``explained`` (``(c,)`` fractions of variance).
    """
    with torch.no_grad():
        _, cache = model.run_with_cache(batch, names_filter=hook_name("workspace", "*"))
    out = []
    for l in range(1, model.config.n_layers + 1):
        phi = cache[hook_name("workspace", l)].double().cpu()
        centred = phi - phi.mean(0)
        _, s, vh = torch.linalg.svd(centred, full_matrices=False)
        c = min(components, vh.shape[0])
        out.append({"coords": (centred @ vh[:c].T).numpy(), "explained": (s[:c] ** 2 / (s**2).sum()).numpy()})
    return out


# ----------------------------------------------------------------------------------------
# Explorer states (chapters 4 and 5)
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


# Which half of model A falls short (chapter 8)
# ----------------------------------------------------------------------------------------
def router_directions(model, batch) -> torch.Tensor:
    """The measurement rows a gated-router model used in each context, ``(B, L d, D)`` float64.

    Row ``(l - 1) d + c`` is channel ``c`` of ``G_l(Phi_{l-1})``: the model's
    ``phi_l = (1/N) sum_i y_i G_l x_i = G_l g_hat`` with ``g_hat`` the context's statistic.
    """
    if model.config.router != "gated":
        raise ValueError(f"router_directions needs a gated router, got {model.config.router!r}")
    with torch.no_grad():
        _, cache = model.run_with_cache(batch, names_filter=hook_name("workspace", "*"))
        rows = []
        for l in range(1, model.config.n_layers + 1):
            previous = cache[hook_name("workspace", l - 1)] if l > 1 else batch.x.new_zeros(batch.x.shape[0], 0)
            rows.append(model.block(l).router.matrix(previous.to(batch.x.dtype)).double().cpu())
    return torch.cat(rows, dim=1)


def router_bayes_decode(model, tree: TreePrior, batch) -> dict:
    """Model A's decoder against the exact posterior given its router's directions.

    On the contexts of ``batch`` (a :class:`fvlib.task.TaskBatch` from ``tree``): the model's
    own ``theta_hat``, and the exact posterior mean given the readings ``phi = W g_hat`` of the
    rows ``W`` its router chose in that context (:func:`router_directions`; decoded by
    :func:`fvlib.theory.adaptive_opt.policy_rollout` with those rows forced, channel variance
    ``tau^2 = (E|theta|^2 + sigma^2) / N``). The readings are the model's own workspace: the
    function checks this. Returns ``{"model": (mean, stderr), "router_bayes": (mean, stderr),
    "contexts": B, "per_context": {"model": (B,), "router_bayes": (B,)}}`` of the excess loss
    ``|theta_hat - theta|^2``.
    """
    rows = router_directions(model, batch)
    cpu = batch.to("cpu", torch.float64)
    g_hat = cpu.sufficient_statistic()
    with torch.no_grad():
        _, cache = model.run_with_cache(batch, names_filter=hook_name("workspace", model.config.n_layers))
        theta_model = model.predict_theta(batch).double().cpu()
    workspace = cache[hook_name("workspace", model.config.n_layers)].double().cpu()
    readings = torch.einsum("bmd,bd->bm", rows, g_hat)
    scale = workspace.abs().max().clamp_min(1e-12)
    if not torch.allclose(readings / scale, workspace / scale, atol=1e-3):
        raise ValueError("the router's rows do not reproduce the model's workspace")
    tau2 = channel_tau2(tree, batch.n_ctx, batch.noise_std)
    forced = {s + 1: rows[:, s] for s in range(rows.shape[1])}
    with torch.no_grad():
        bayes = policy_rollout(tree, None, FiniteSampleChannel(g_hat), rows.shape[1], tau2, forced).theta_hat
    out = {"contexts": batch.batch_size, "per_context": {}}
    for name, theta_hat in (("model", theta_model), ("router_bayes", bayes)):
        errors = squared_error(theta_hat, cpu.theta)
        mean, stderr = mean_and_stderr(errors)
        out[name] = (float(mean), float(stderr))
        out["per_context"][name] = errors
    return out


def router_policy_alignment(model, tree: TreePrior, batch, policy) -> torch.Tensor:
    """How far model A's router measures what a theory policy measures: ``(L,)`` float64.

    Entry ``l - 1`` is the mean over the contexts of ``batch`` of ``|cos|`` between the row
    model A's router used at layer ``l`` (:func:`router_directions`, one channel per layer) and
    the row ``policy`` measures at layer ``l`` on the same context's statistic ``g_hat``
    (:func:`fvlib.theory.adaptive_opt.policy_rollout`; ``policy`` e.g. an
    :class:`~fvlib.theory.adaptive_opt.OptimisedPolicy`'s ``policy`` or a ``GreedyRule``).
    1 means the same direction in every context; A's decoder can read another policy's
    readings only where this is near 1.
    """
    if model.config.channels != 1:
        raise ValueError(f"router_policy_alignment needs one channel per layer, got {model.config.channels}")
    rows = router_directions(model, batch)
    rows = rows / rows.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    g_hat = batch.to("cpu", torch.float64).sufficient_statistic()
    tau2 = channel_tau2(tree, batch.n_ctx, batch.noise_std)
    with torch.no_grad():
        theory = policy_rollout(tree, policy, FiniteSampleChannel(g_hat), rows.shape[1], tau2).directions
    return (rows * theory).sum(-1).abs().mean(0)


def greedy_paired(model, config: TrainConfig, *, contexts: int, seed: int) -> dict:
    """A trained model of a tree-prior run against the greedy policy on the *same* contexts.

    The contexts are those of :func:`fvlib.training.evaluate.evaluate` with the same ``contexts`` and ``seed``
    (so ``greedy_loss`` sits beside the model's ``evaluate`` loss, context by context). Returns
    ``{"model_loss", "model_stderr", "greedy_loss", "greedy_stderr", "ratio", "ratio_stderr",
    "contexts"}``: ``ratio`` is the model's loss over greedy's with the standard error of the
    paired ratio (:func:`fvlib.stats.paired_ratio`).
    """
    if config.prior != "tree":
        raise ValueError(f"greedy_paired needs a tree prior, got {config.prior!r}")
    check_int("contexts", contexts, 2)
    check_seed("seed", seed)
    tree = build_prior(config)
    batches = sample_eval_batches(tree, config.n_ctx, config.noise_std, contexts, seed)
    errors = per_context_errors({"model": model_predictor(model),
                                 "greedy": strategy_predictor("adaptive_greedy", tree, config.budget)}, batches)
    model_mean, model_se = mean_and_stderr(errors["model"])
    mean, se = mean_and_stderr(errors["greedy"])
    ratio, ratio_se = paired_ratio(errors["model"], errors["greedy"])
    return {"model_loss": float(model_mean), "model_stderr": float(model_se), "greedy_loss": float(mean),
            "greedy_stderr": float(se), "ratio": ratio, "ratio_stderr": ratio_se,
            "contexts": int(errors["model"].numel())}


def gap_table(model, config: TrainConfig, *, contexts: int = 4000, seed: int = 0, policy=None,
              others: Mapping | None = None) -> dict:
    """How close a trained model A comes to the best adaptive references, one dict of rows.

    Rows (``(mean, stderr)`` of the excess loss): ``adaptive_greedy``, ``nonadaptive_opt`` and
    ``adaptive_opt`` (:func:`fvlib.theory.strategies.evaluate_strategies` on ``contexts`` finite-``N``
    contexts, ``seed``), ``model`` and ``router_bayes`` (:func:`router_bayes_decode` on
    ``contexts`` task contexts drawn with ``seed``), and ``adaptive_greedy_paired`` and
    ``adaptive_opt_paired``: the two adaptive references again, on the model rows' own contexts,
    so that a model row and these compare paired (greedy's loss has a heavy tail: on two
    independent sets of 4000 contexts it can differ by a fifth); ``best_paired``, the name of the
    smaller of the two, and ``ratios``: ``{model row: (ratio, stderr)}``, each model row over
    that best paired reference, context by context (:func:`fvlib.stats.paired_ratio`). ``policy``: an optimised adaptive policy
    to reuse. ``others``: ``{name: model}``, more models A of the same task (e.g. trained with
    another recipe), decoded on the very same contexts: rows ``name`` and
    ``name + "_router_bayes"``. Also ``adaptive_opt_kind`` (which candidate the optimisation
    kept), ``adaptive_opt_policy`` (the :class:`~fvlib.theory.adaptive_opt.OptimisedPolicy`)
    and ``adaptive_opt_seconds`` (its cost).
    """
    if config.prior != "tree":
        raise ValueError(f"gap_table needs a tree prior, got {config.prior!r}")
    tree = TreePrior(config.depth, config.alpha)
    tau2 = channel_tau2(tree, config.n_ctx, config.noise_std)
    start = time.perf_counter()
    directions = optimise_directions(tree, config.budget, tau2, seed=seed)
    if policy is None:
        policy = optimise_adaptive_policy(tree, config.budget, tau2, directions=directions, seed=seed)
    seconds = time.perf_counter() - start
    est = evaluate_strategies(tree, config.n_ctx, config.noise_std, config.budget, samples=contexts, seed=seed,
                              strategies=("adaptive_greedy", "nonadaptive_opt", "adaptive_opt"),
                              directions=directions, policy=policy)
    out = {name: (e.mean, e.stderr) for name, e in est.items()}
    batches = sample_eval_batches(tree, config.n_ctx, config.noise_std, contexts, seed)
    references = {"adaptive_greedy_paired": policy_predictor(tree, GreedyRule(tree), config.budget),
                  "adaptive_opt_paired": policy_predictor(tree, policy.policy, config.budget)}
    paired = per_context_errors(references, batches)   # on the model rows' contexts
    for name, errors in paired.items():
        mean, stderr = mean_and_stderr(errors)
        out[name] = (float(mean), float(stderr))
    best = min(paired, key=lambda name: float(paired[name].mean()))
    out["best_paired"] = best
    out["ratios"] = {}
    named = {"": model, **dict(others or {})}
    for prefix in named:
        if prefix and (not isinstance(prefix, str) or prefix in out or prefix in ("model", "router_bayes")):
            raise ValueError(f"others: names must be new strings, not a row of the table, got {prefix!r}")
    for prefix, each in named.items():
        device = next(each.parameters()).device
        parts = [router_bayes_decode(each, tree, b.to(device)) for b in batches]
        n = sum(p["contexts"] for p in parts)
        for name in ("model", "router_bayes"):
            mean = sum(p[name][0] * p["contexts"] for p in parts) / n
            var = sum((p[name][1] ** 2) * p["contexts"] ** 2 for p in parts) / n**2
            row = name if not prefix else (prefix if name == "model" else f"{prefix}_router_bayes")
            out[row] = (mean, math.sqrt(var))
            errors = torch.cat([p["per_context"][name] for p in parts])
            out["ratios"][row] = paired_ratio(errors, paired[best])
    out["adaptive_opt_kind"] = policy.kind
    out["adaptive_opt_policy"] = policy
    out["adaptive_opt_seconds"] = seconds
    out["contexts"] = contexts
    return out
