"""The book's in-build runs: which models the chapters train, with which settings and seeds,
and the loops that train (or reload) them, returning :class:`~fvlib.training.loop.TrainResult`
objects that :mod:`fvlib.experiments.beside_theory` and :mod:`fvlib.plots` take.

This layer sits on :mod:`fvlib.training`: a run named here is trained once into its
:func:`fvlib.training.config.run_dir_for` directory and reloaded by every chapter that names it
(the book's appendix *Conventions*, section "Models A, B, C").

Shared runs (first trained in chapter 5, *Gaussian prior*, and reloaded by the later chapters):

* :func:`shared_configs` -- the book's SHARED training configurations (A, B, C on the tree
  prior and on its Gaussian twin), trained once and reused by every chapter through
  :func:`fvlib.training.config.run_dir_for`;
* :func:`train_all` -- train (or reload) a dict of configs, each into its ``run_dir_for``;
* :func:`train_parallel` -- train a list of configs (or batches of them) in worker processes,
  one thread each; :func:`warm_work` is what ``python -m fvlib warm`` trains with it ahead of
  the chapters.

Chapter 8, *Experiments*, the appendix *How the experiments were run*, and chapter 11,
*Standard transformers*:

* :func:`original_config` and :func:`imitation_config` -- model A with the book's original
  recipe and after the imitation warm start, the two recipes that the appendix *How the
  experiments were run* sets beside the one recipe of the shared runs;
* :func:`transformer_chapter_configs` -- chapter 11's standard transformers
  (:data:`TRANSFORMER_CHAPTER`);
* :func:`seed_configs`, :func:`seed_plan` and :func:`train_seeds` -- the same configs at more
  seeds (:data:`SHARED_SEEDS`), trained batched (:func:`fvlib.training.batched.train_many`)
  beside the runs of the configs' own seed;
* :func:`final_losses` -- the final excess losses and their standard errors of a list of runs;
* :func:`depth_sweep_configs` and :func:`depth_sweep` -- model A with ``L = 1..K`` layers
  against model B with ``d = 1..K`` channels (several seeds, batched, averaged by
  :func:`fvlib.stats.seed_mean`), a :class:`DepthSweep`; the theory curves beside it are
  :func:`fvlib.theory.sweeps.depth_sweep_theory`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from .._checks import check_int, check_seed
from ..stats import seed_mean
from ..training import (
    IMITATION_RECIPE,
    ORIGINAL_RECIPE,
    TrainConfig,
    TrainResult,
    recipe_for,
    run_dir_for,
    train,
    train_many,
)
from ..workers import worker_pool

__all__ = [
    "IMITATION_STEPS",
    "ORIGINAL_STEPS",
    "SHARED_SEEDS",
    "SHARED_STEPS",
    "TRANSFORMER_CHAPTER",
    "DepthSweep",
    "depth_sweep",
    "depth_sweep_configs",
    "final_losses",
    "imitation_config",
    "original_config",
    "seed_configs",
    "seed_plan",
    "shared_configs",
    "train_all",
    "train_parallel",
    "train_seeds",
    "transformer_chapter_configs",
    "warm_work",
]


# ----------------------------------------------------------------------------------------
# Training (chapters 5 and 8)
# ----------------------------------------------------------------------------------------
#: Training steps of the shared runs (:func:`shared_configs`) and of the depth sweep
#: (:func:`depth_sweep_configs`): the base length of the stored experiments' one recipe.
SHARED_STEPS = 3000


def shared_configs(
    models: Sequence[str] = ("A", "B", "C"),
    priors: Sequence[str] = ("tree", "gaussian-twin"),
    **overrides,
) -> dict[tuple[str, str], TrainConfig]:
    """The SHARED configurations ``{(model, prior): TrainConfig}`` of the book.

    Depth ``K = 5``, ``alpha = 0.5``, ``N = 128``, ``sigma = 0``, budget ``M = 5``,
    :data:`SHARED_STEPS` steps of the book's one recipe for models A, B, C
    (:func:`fvlib.training.config.recipe_for` of each prior: the learning recipe, no teacher, on
    the tree its curriculum), trained on the pooled statistic (``inputs = 'auto'``);
    ``overrides`` change any :class:`~fvlib.training.config.TrainConfig` field for all of them
    (e.g. a bigger ``FULL`` run). With no overrides the run directories are shared between
    chapters.
    """
    task = dict(depth=5, alpha=0.5, n_ctx=128, noise_std=0.0, budget=5, steps=SHARED_STEPS)
    task.update(overrides)
    return {(m, p): TrainConfig(model=m, prior=p, **{**recipe_for("constrained", p, task["alpha"]), **task})
            for p in priors for m in models}


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


#: Training steps of the methods appendix's run of model A with the book's original recipe
#: (:func:`original_config`), the shared runs' length before the one recipe.
ORIGINAL_STEPS = 1500
#: Training steps of the methods appendix's imitation run of model A (:func:`imitation_config`).
IMITATION_STEPS = 3000


def original_config(base: TrainConfig) -> TrainConfig:
    """The methods appendix's model A with the book's original recipe: ``base`` (the shared run of model
    A) with :data:`fvlib.training.config.ORIGINAL_RECIPE` (every token of every context, the
    sampled loss, batch 256, no curriculum) and :data:`ORIGINAL_STEPS` steps: the run the
    chapters used before the one recipe, which the appendix *How the experiments were run*
    sets beside it. Its task, seed and evaluation are ``base``'s."""
    return replace(base, steps=ORIGINAL_STEPS, batch=256, expected_loss=False, alpha_start=None,
                   **ORIGINAL_RECIPE)


def imitation_config(base: TrainConfig) -> TrainConfig:
    """The methods appendix's model A after the imitation warm start: ``base`` (the shared run of model A,
    at ``K = 5`` or, in the appendix's ``FULL`` setting, ``K = 6``) with the recipe
    :data:`fvlib.training.config.IMITATION_RECIPE` (its router first fitted to the greedy policy;
    the sampled loss, batch 256, no curriculum, every token of every context, as
    :func:`original_config`) and :data:`IMITATION_STEPS` steps."""
    return replace(original_config(base), steps=IMITATION_STEPS, **IMITATION_RECIPE)


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
    ``transformers-k4`` of :mod:`fvlib.experiments`.)"""
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
    :data:`SHARED_SEEDS`), the methods appendix's imitation run of model A (:func:`imitation_config`),
    the shared runs of model A alone, the methods appendix's original-recipe run of model A
    (:func:`original_config`), the shared runs of B and C alone and chapter 11's transformers
    (:func:`transformer_chapter_configs`), and chapter 10's model B at ``K = M = 6`` (the no-effect
    control beside the stored model A of ``controls-k6``): the longest first. (The methods appendix's
    depth sweep is a stored experiment, ``depth-sweep-k6`` of :mod:`fvlib.experiments`, which no page
    build trains.)
    """
    shared = shared_configs()
    _, _, seeds_batch = seed_plan(shared, SHARED_SEEDS)
    alone = sorted(shared.values(), key=lambda c: "ABC".index(c.model))
    model_a = shared[("A", "tree")]
    deep = [c for c in alone if c.model == "A"]
    return [[c for _, c in seeds_batch], imitation_config(model_a), *deep, original_config(model_a),
            *[c for c in alone if c.model != "A"], *transformer_chapter_configs(),
            shared_configs(depth=6, budget=6)[("B", "tree")]]


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
    contexts). ``loss[model]``, ``stderr[model]`` and ``spread[model]`` ``(len(budgets),)`` are
    their :func:`fvlib.stats.seed_mean`: the mean over seeds, its Monte Carlo standard error
    and the standard deviation over seeds.
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
    ``train_many`` call. Fields of ``config`` not given default to the one recipe of the shared
    runs (:func:`fvlib.training.config.recipe_for` of ``config``'s prior and decay, the pooled
    statistic, :data:`SHARED_STEPS` steps)."""
    seeds = _check_seeds(seeds)
    prior, alpha = config.get("prior", "tree"), config.get("alpha", 0.5)
    config = {**recipe_for("constrained", prior, alpha), "steps": SHARED_STEPS, **config}
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
    given default to the one recipe of the shared runs (:func:`depth_sweep_configs`).
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
        out.loss[model], out.stderr[model], out.spread[model] = seed_mean(losses, stderrs)
    return out
