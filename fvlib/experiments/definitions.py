"""The book's long experiments, by name: what each trains and how its references are computed.

Some questions of the book need runs that no 15-minute page build can train: a depth sweep at
``K = 6`` trained to convergence, the reference configuration at three seeds, the standard
transformers at ``K = 4``. Each is an :class:`Experiment` of :data:`EXPERIMENTS`: a list of runs
(:class:`~fvlib.training.config.TrainConfig`), grouped into work items (the seeds of one point,
trained together by :func:`fvlib.training.batched.train_many` on one thread), and a function
computing its theory references (:mod:`fvlib.experiments.references`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..families import get_family
from ..training import (
    IMITATION_RECIPE,
    RECIPE,
    TRANSFORMER_RECIPE,
    TrainConfig,
    curriculum_start,
    recipe_for,
)
from .references import (
    LARGE_THEORY_SAMPLES,
    TREE_CURVES,
    TheoryParams,
    recipes_theory,
    reference_theory,
    tree_theory,
)
from .rules import CONVERGENCE_RULES, FINAL_RTOL, MAX_DOUBLINGS, PREFIX_RTOL

__all__ = ["CONTROL_VARIANTS", "EXPERIMENTS", "RECIPE_STEPS", "STORED_INPUTS", "STORED_WARM_START_FIELDS",
           "TRANSFORMER_RECIPE_STEPS", "Experiment", "Run", "constrained_config", "controls_config",
           "estimate_seconds", "experiment_names", "get_experiment", "run_key", "same_config"]

@dataclass(frozen=True)
class Run:
    """One run of an experiment: its key in the result file, its labels and its config."""

    key: str
    variant: str
    config: TrainConfig

    @property
    def labels(self) -> dict:
        c = self.config
        return {"variant": self.variant, "prior": c.prior, "budget": c.budget, "seed": c.seed}


@dataclass(frozen=True)
class Experiment:
    """A named experiment: runs grouped into work items, and how to compute its references.

    Attributes:
        name: the name of ``python -m fvlib experiment run NAME`` and of ``results/NAME.json``.
        description: one line for ``experiment list``.
        chapter: the chapter that reads it.
        items: tuples of :class:`Run`; the runs of one item are trained by one
            :func:`fvlib.training.batched.train_many` call.
        theory: ``(TheoryParams) -> dict`` of JSON-able reference values of the configuration,
            its optimised references searched or read through the :class:`~fvlib.experiments.references.TheoryParams`.
        gap_variants: variants whose tree runs get :func:`fvlib.experiments.beside_theory.gap_table`.
        max_doublings: how many times a run that has not converged is retrained with twice the
            steps (:data:`~fvlib.experiments.rules.MAX_DOUBLINGS`; ``0`` for an experiment that compares at a fixed
            number of steps).
        prefix_rtol: the relative tolerance of :func:`~fvlib.experiments.verify.verify`'s quick check
            (:data:`~fvlib.experiments.rules.PREFIX_RULE`, :data:`~fvlib.experiments.rules.PREFIX_RTOL`).
        final_rtol: the relative tolerance of a final loss retrained by ``verify --full``
            (:data:`~fvlib.experiments.rules.TOLERANCE_RULE`, :data:`~fvlib.experiments.rules.FINAL_RTOL`):
            ``|retrained - stored| <= final_rtol * |stored|``, whatever the stored numbers say.
        convergence: the convergence rule of its runs (:data:`~fvlib.experiments.rules.CONVERGENCE_RULES`):
            ``"last-fifth"`` (the stored experiments of chapter 8) or ``"paired-doubling"`` (the
            experiments of issue 42 on; it needs ``max_doublings >= 1``: every run trains ``S`` and ``2S``).
        stored_models: the keys of the runs whose final weights the result keeps beside its file
            (``results/NAME.models.safetensors``, sealed with it;
            :func:`~fvlib.experiments.kept_models.load_stored_model` loads one).
    """

    name: str
    description: str
    chapter: str
    items: tuple
    theory: Callable[[TheoryParams], dict]
    gap_variants: tuple = ()
    max_doublings: int = MAX_DOUBLINGS
    prefix_rtol: float = PREFIX_RTOL
    final_rtol: float = FINAL_RTOL
    convergence: str = "last-fifth"
    stored_models: tuple[str, ...] = ()

    def __post_init__(self):
        if self.convergence not in CONVERGENCE_RULES:
            raise ValueError(f"convergence must be one of {CONVERGENCE_RULES}, got {self.convergence!r}")
        if self.convergence == "paired-doubling" and self.max_doublings < 1:
            raise ValueError(f"the paired-doubling rule judges a run by its first doubling: max_doublings must be "
                             f">= 1, got {self.max_doublings!r}")
        defined = self.run_by_key()
        for key in self.stored_models:
            if key not in defined:
                raise ValueError(f"stored_models: {key!r} is not a run of experiment {self.name!r}")

    @property
    def runs(self) -> list[Run]:
        return [r for item in self.items for r in item]

    def run_by_key(self) -> dict[str, Run]:
        return {r.key: r for r in self.runs}


#: The warm-start fields of the :class:`~fvlib.training.config.TrainConfig` defaults when the runs of
#: model B, model C and the transformers were stored (those of
#: :data:`~fvlib.training.config.IMITATION_RECIPE`). They act on model A on the tree only
#: (:attr:`~fvlib.training.config.TrainConfig.warm_starts`), so these runs trained without a warm start;
#: their configs keep the fields so that they stay the stored ones.
STORED_WARM_START_FIELDS = {k: IMITATION_RECIPE[k] for k in ("router_warm_start", "router_lr_scale")}


#: The input path of every stored run of the constrained models, every token of every context
#: (:attr:`~fvlib.training.config.TrainConfig.inputs`). The definitions pin it, so that each
#: stored run verifies as it was trained.
STORED_INPUTS = "tokens"


def run_key(variant: str, prior: str, budget: int, seed: int) -> str:
    """The key of one stored run in ``results/NAME.json``'s ``runs``:
    ``"VARIANT/PRIOR/MBUDGET/seedSEED"``, e.g. ``"A'-open/tree/M4/seed0"``."""
    return f"{variant}/{prior}/M{budget}/seed{seed}"


def _key(variant: str, config: TrainConfig) -> str:
    return run_key(variant, config.prior, config.budget, config.seed)


#: Settings every trained run of the store shares: 20 evaluations (so the last fifth of the
#: steps begins at an evaluation), the data of seed 0 for every seed (common random numbers:
#: the seeds differ only in their initial weights), the checkpoints every 500 steps.
#: ``A-scratch`` is model A with :data:`~fvlib.training.config.RECIPE` (no teacher), ``A-warm`` model A
#: with :data:`~fvlib.training.config.IMITATION_RECIPE` (the imitation warm start), ``A-learn`` model A
#: with the learning recipe of ``python -m fvlib train`` (:func:`~fvlib.training.config.recipe_for`:
#: :data:`~fvlib.training.config.LEARNING_RECIPE` and its curriculum; no teacher), ``B`` and ``C``
#: RECIPE with :data:`STORED_WARM_START_FIELDS`.
def constrained_config(variant: str, steps: int = 3000, **task) -> TrainConfig:
    if variant == "A-learn":
        recipe = recipe_for("constrained", task["prior"], task["alpha"])
    else:
        recipe = {"A-scratch": RECIPE, "A-warm": IMITATION_RECIPE}.get(variant,
                                                                      {**RECIPE, **STORED_WARM_START_FIELDS})
    model = variant.split("-")[0]
    return TrainConfig(model=model, steps=steps, eval_every=steps // 20, eval_contexts=2048,
                       checkpoint_every=500, data_seed=0, device="cpu", inputs=STORED_INPUTS, **recipe, **task)


def _seeds(variant: str, seeds, **task) -> tuple:
    base = constrained_config(variant, **task)
    return tuple(Run(_key(variant, c), variant, c) for c in (replace(base, seed=s) for s in seeds))


def _depth_sweep(name: str, depth: int, variants: Sequence[str], chapter: str, seeds=(0, 1, 2),
                 max_doublings: int = MAX_DOUBLINGS) -> Experiment:
    task = dict(prior="tree", depth=depth, alpha=0.5, n_ctx=128, noise_std=0.0)
    budgets = range(1, depth + 1)
    items = tuple(_seeds(v, seeds, budget=m, **task) for v in variants for m in budgets)
    described = ", ".join(variants)
    return Experiment(name, f"tree K = {depth}, alpha = 0.5, N = 128, sigma = 0; budgets 1..{depth}; "
                            f"{described}; seeds {', '.join(map(str, seeds))}; 3000 steps",
                      chapter, items, tree_theory(depth, 0.5, 128, 0.0, budgets), max_doublings=max_doublings)


def _reference_k6() -> Experiment:
    task = dict(depth=6, alpha=0.5, n_ctx=128, noise_std=0.0, budget=6)
    seeds = (0, 1, 2)
    tree_variants = ("A-scratch", "A-warm", "B", "C")
    twin_variants = ("A-scratch", "B", "C")
    items = tuple(_seeds(v, seeds, prior="tree", **task) for v in tree_variants)
    items += tuple(_seeds(v, seeds, prior="gaussian-twin", **task) for v in twin_variants)
    refs = [constrained_config(v, prior=p, **task) for p in ("tree", "gaussian-twin") for v in ("A-warm", "B", "C")]
    return Experiment("reference-k6", "the reference configuration (tree K = 6, alpha = 0.5, N = 128, M = 6) "
                      "and its Gaussian twin: A from scratch, A after the imitation warm start (tree), B, C; "
                      "seeds 0, 1, 2; 3000 steps; chapter 8's gap table", "appendix_methods", items,
                      reference_theory(task, refs), gap_variants=("A-scratch", "A-warm"))


#: The recipes of the experiment ``recipes-a``, each model A from its random initialisation (no teacher),
#: by the name its runs are stored under: :data:`~fvlib.training.config.RECIPE` (the stored experiments'
#: recipe), then one change at a time up to :data:`~fvlib.training.config.LEARNING_RECIPE` with its
#: curriculum (the recipe of ``python -m fvlib train``). ``alpha_start`` is filled in per task.
RECIPE_STEPS = {
    "RECIPE": {},
    "+expected-loss": {"expected_loss": True},
    "+curriculum": {"expected_loss": True, "alpha_start": "curriculum"},
    "+batch-512": {"expected_loss": True, "alpha_start": "curriculum", "batch": 512},
}


def _recipe_run(variant: str, seed: int, steps: int, task: dict) -> Run:
    changes = dict(RECIPE_STEPS[variant])
    if changes.get("alpha_start") == "curriculum":
        changes["alpha_start"] = curriculum_start(task["alpha"])
    config = replace(constrained_config("A-scratch", steps, **task), seed=seed, **changes)
    return Run(_key(variant, config), variant, config)


def _recipes_a(steps: int = 3000, seeds=(0, 1)) -> Experiment:
    """What each change of the learning recipe buys model A from a random start, at chapter 8's
    shared-run configuration (K = 5, M = 5) and the reference configuration (K = 6, M = 6), at a
    fixed number of steps (no doubling)."""
    tasks = [dict(prior="tree", depth=k, alpha=0.5, n_ctx=128, noise_std=0.0, budget=k) for k in (5, 6)]
    items = tuple(tuple(_recipe_run(v, s, steps, t) for s in seeds) for t in tasks for v in RECIPE_STEPS)
    return Experiment("recipes-a", f"model A from a random start, {steps} steps, no doubling: RECIPE and the "
                      f"learning recipe's changes one at a time (expected loss, curriculum, batch 512); "
                      f"tree K = 5, M = 5 and K = 6, M = 6, alpha = 0.5, N = 128; seeds "
                      f"{', '.join(map(str, seeds))}; chapter 8's gap table", "appendix_methods", items,
                      recipes_theory(tasks), gap_variants=tuple(RECIPE_STEPS), max_doublings=0)


def _transformer_run(variant: str, prior: str, seed: int, steps: int, changes: dict | None = None) -> Run:
    arch = "transformer-open" if variant.endswith("open") else "transformer"
    recipe = {**TRANSFORMER_RECIPE, **STORED_WARM_START_FIELDS, **(changes or {})}
    config = TrainConfig(arch=arch, model=variant[0], prior=prior, depth=4, alpha=0.5, n_ctx=64, noise_std=0.0,
                         budget=4, steps=steps, eval_every=steps // 20, eval_contexts=2048, checkpoint_every=500,
                         data_seed=0, seed=seed, device="cpu", **recipe)
    return Run(_key(variant, config), variant, config)


def _transformers_k4(steps: int = 3000, seeds=(0, 1, 2, 3, 4)) -> Experiment:
    variants = ("A'", "B'", "A'-open")
    items = tuple(tuple(_transformer_run(v, p, s, steps) for s in seeds)
                  for v in variants for p in ("tree", "gaussian-twin"))
    task = dict(depth=4, alpha=0.5, n_ctx=64, noise_std=0.0, budget=4)
    refs = [replace(items[0][0].config, arch="constrained", model=m, prior=p, width=RECIPE["width"])
            for p in ("tree", "gaussian-twin") for m in ("A", "B")]
    return Experiment("transformers-k4", f"chapter 11's larger setting: tree K = 4, alpha = 0.5, N = 64, M = 4, "
                      f"and its twin; bottlenecked A' and B', open A'; seeds {', '.join(map(str, seeds))}; "
                      f"{steps} steps", "11_transformers", items, reference_theory(task, refs))


#: The recipes of the experiment ``recipes-transformer-k4``, each the bottlenecked A' from its random
#: initialisation (no teacher), by the variant its runs are stored under:
#: :data:`~fvlib.training.config.TRANSFORMER_RECIPE` (``"A'"``, the recipe of ``transformers-k4``),
#: then one change at a time: the tree curriculum of the constrained models' learning recipe
#: (``alpha_start`` filled in per task, :func:`~fvlib.training.config.curriculum_start`), 256 query
#: tokens per context, a residual stream of width 64.
TRANSFORMER_RECIPE_STEPS = {
    "A'": {},
    "A'+curriculum": {"alpha_start": "curriculum"},
    "A'+queries-256": {"alpha_start": "curriculum", "queries": 256},
    "A'+width-64": {"alpha_start": "curriculum", "queries": 256, "width": 64},
}


def _recipes_transformer(steps: int = 3000, seeds=(0, 1, 2)) -> Experiment:
    """What the bottlenecked A' needs to route at ``transformers-k4``'s tree (K = 4, M = 4,
    N = 64): :data:`TRANSFORMER_RECIPE_STEPS` at a fixed number of steps (no doubling)."""
    task = dict(depth=4, alpha=0.5, n_ctx=64, noise_std=0.0, budget=4)

    def changes(variant: str) -> dict:
        out = dict(TRANSFORMER_RECIPE_STEPS[variant])
        if out.get("alpha_start") == "curriculum":
            out["alpha_start"] = curriculum_start(task["alpha"])
        return out

    items = tuple(tuple(_transformer_run(v, "tree", s, steps, changes(v)) for s in seeds)
                  for v in TRANSFORMER_RECIPE_STEPS)
    refs = [replace(items[0][0].config, arch="constrained", model=m, width=RECIPE["width"]) for m in ("A", "B")]
    return Experiment("recipes-transformer-k4", f"the bottlenecked A' on transformers-k4's tree (K = 4, "
                      f"alpha = 0.5, N = 64, M = 4), {steps} steps, no doubling: its recipe, then one change "
                      f"at a time (tree curriculum, 256 query tokens, width 64); seeds "
                      f"{', '.join(map(str, seeds))}", "11_transformers", items, reference_theory(task, refs),
                      max_doublings=0)


#: The variants of the controls experiments, by name; model A with each router of
#: :data:`fvlib.routers.MODEL_A_ROUTERS` it is compared with (``A`` the gated MLP router of the
#: paper, ``A-bilinear`` a router with no hidden layer, ``A-coord`` a router that measures one
#: coordinate per layer), and the one-layer models B and C.
CONTROL_VARIANTS = ("A", "A-bilinear", "A-coord", "B", "C")


def controls_config(variant: str, steps: int = 3000, **task) -> TrainConfig:
    """The one recipe of the controls experiments (``controls-k6``, ``long-context-k6``,
    ``controls-k8``) for ``variant`` of :data:`CONTROL_VARIANTS` on ``task`` (``prior``, ``depth``,
    ``alpha``, ``n_ctx``, ``noise_std``, ``budget``): the learning recipe of ``python -m fvlib
    train`` (:func:`~fvlib.training.config.recipe_for`: no teacher, the expected loss, a batch of
    512 and on the tree its curriculum) for every model, trained on the pooled statistic, ``steps``
    steps with 20 evaluations on 2048 contexts, the data of seed 0 for every seed."""
    if variant not in CONTROL_VARIANTS:
        raise ValueError(f"variant must be one of {CONTROL_VARIANTS}, got {variant!r}")
    model, _, router = variant.partition("-")
    recipe = recipe_for("constrained", task["prior"], task["alpha"])
    extra = {"router": router} if router else {}
    return TrainConfig(model=model, steps=steps, eval_every=steps // 20, eval_contexts=2048, checkpoint_every=500,
                       data_seed=0, device="cpu", inputs="statistic", **extra, **recipe, **task)


def _controls(name: str, depth: int, n_ctx: int, tree_variants: Sequence[str], twin_variants: Sequence[str],
              description: str, seeds=(0, 1, 2)) -> Experiment:
    """Depth curves (budgets ``1..depth``) of ``tree_variants`` on the tree (``alpha = 1/2``,
    ``sigma = 0``) and ``twin_variants`` on its Gaussian twin, with :func:`controls_config`, judged by
    the paired-doubling rule; references on :data:`~fvlib.experiments.references.LARGE_THEORY_SAMPLES`
    contexts, with the twin's closed form and the finite-``N`` floor. The final weights of the
    tree runs of ``A`` and ``A-coord`` at ``M = depth`` (every seed) are kept
    (:attr:`Experiment.stored_models`)."""
    budgets = range(1, depth + 1)
    task = dict(depth=depth, alpha=0.5, n_ctx=n_ctx, noise_std=0.0)

    def point(variant: str, prior: str, m: int) -> tuple:
        base = controls_config(variant, prior=prior, budget=m, **task)
        return tuple(Run(_key(variant, c), variant, c) for c in (replace(base, seed=s) for s in seeds))

    items = tuple(point(v, "tree", m) for v in tree_variants for m in budgets)
    items += tuple(point(v, "gaussian-twin", m) for v in twin_variants for m in budgets)
    theory = tree_theory(depth, 0.5, n_ctx, 0.0, budgets, samples=LARGE_THEORY_SAMPLES,
                         names=TREE_CURVES + ("lmmse",), twin=bool(twin_variants), floor=True)
    kept = tuple(run_key(v, "tree", depth, s) for v in ("A", "A-coord") if v in tree_variants for s in seeds)
    return Experiment(name, f"{description}; tree K = {depth}, alpha = 0.5, N = {n_ctx}, sigma = 0, budgets "
                            f"1..{depth}; seeds {', '.join(map(str, seeds))}; the learning recipe on the statistic, "
                            f"3000 steps, paired doublings", "08_experiments", items, theory, gap_variants=("A",),
                      max_doublings=2, convergence="paired-doubling", stored_models=kept)


#: The catalogue of named experiments, by name (``python -m fvlib experiment list``).
EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    _depth_sweep("depth-sweep-k6", 6, ("A-scratch", "A-warm", "B"), "appendix_methods"),
    _depth_sweep("depth-sweep-k7", 7, ("A-scratch", "B"), "appendix_methods"),
    # three doublings (to 24000 steps): its runs still falling at 12000 were doubled again
    _depth_sweep("depth-sweep-k6-learn", 6, ("A-learn",), "appendix_methods", max_doublings=3),
    _transformers_k4(),
    _reference_k6(),
    _recipes_a(),
    _recipes_transformer(),
    _controls("controls-k6", 6, 128, CONTROL_VARIANTS, ("A", "B", "C"),
              "the controls: A with its three routers, B, C on the tree; A, B, C on the Gaussian twin"),
    _controls("long-context-k6", 6, 1024, ("A", "A-coord", "B"), (),
              "the long context: A, A-coord, B on the tree"),
    _controls("controls-k8", 8, 128, ("A", "A-coord", "B"), (), "the deeper tree: A, A-coord, B"),
)}


def experiment_names() -> list[str]:
    return list(EXPERIMENTS)


def get_experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose from {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]


def estimate_seconds(config: TrainConfig) -> float:
    """A rough CPU cost of training ``config`` on one thread, in seconds: the step time grows
    with the reading of the context (constrained models: ``batch * n_ctx * D`` per layer;
    transformers: ``batch * n_ctx * width**2`` per layer), plus a fixed part. Calibrated on the
    stored provenance of the 2-core machines (2026-12-03): within a factor of about 1.5 of the
    CPU seconds of most stored work items (seeds trained together, doublings included)."""
    d = 2**config.depth - 1
    if not get_family(config.arch).softmax_attention:
        layers = config.budget if config.model == "A" else 1
        read = 8 if config.statistic else config.n_ctx  # the statistic: a context costs what a few tokens do
        step = 0.009 + 5.6e-9 * config.batch * read * d * layers
        warm = 0.4 * config.router_warm_start * step if config.warm_starts else 0.0
    else:
        layers = config.budget if config.model == "A" else 1
        step = 0.03 + 2.5e-9 * config.batch * config.n_ctx * config.width**2 * layers
        warm = 0.0
    return config.steps * step + warm


def same_config(stored: dict, defined: TrainConfig, max_doublings: int = MAX_DOUBLINGS) -> bool:
    """A stored run's config is the defined one, up to the device and a doubled step count (a
    config stored before a field of :data:`fvlib.training.config.ADDED_FIELDS` existed reads it
    at the value that changes nothing, :meth:`fvlib.training.config.TrainConfig.from_dict`)."""
    ignore = {"device", "steps", "eval_every"}
    ours = defined.to_dict()
    stored = TrainConfig.from_dict(stored).to_dict()
    if any(stored.get(k) != v for k, v in ours.items() if k not in ignore):
        return False
    ratio = stored["steps"] / defined.steps
    return ratio in [2**k for k in range(max_doublings + 1)] and stored["eval_every"] == stored["steps"] // 20
