"""What a training run is: :class:`TrainConfig`, the recipes, and what a config means at each
step (learning rate, training prior), the model and prior it builds, and its run directory's
name (chapter 8, *Experiments*; the book's appendix *Conventions*, section "Models A, B, C").

A new training knob is one field of :class:`TrainConfig` (with its check in ``__post_init__``,
and its ``help`` in the field's metadata to make it a flag of ``python -m fvlib train``)
and, when runs were saved before it existed, one row of :data:`ADDED_FIELDS`: the value that
changes nothing. Saved configs that lack the field read it at that value, and
:func:`run_dir_for` leaves the field out of a run's name at that value, so every earlier run
keeps its directory.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch

from .._checks import check_budget, check_int, check_number, check_seed
from ..families import DEFAULT_FAMILY, family_names, family_of_config, get_family
from ..models import FVTransformer, ModelConfig
from ..priors import Prior, get_prior_kind, make_prior, prior_kinds
from ..routers import DEFAULT_ROUTER, MODEL_A_ROUTERS
from ..task import check_task_args
from ..transformer import StandardTransformer, TransformerConfig

__all__ = [
    "INPUT_PATHS",
    "EVAL_SEED_OFFSET",
    "WARM_START_SEED_OFFSET",
    "RESUMABLE_FIELDS",
    "ADDED_FIELDS",
    "RECIPE",
    "LEARNING_RECIPE",
    "CURRICULUM_SHARE",
    "curriculum_start",
    "IMITATION_RECIPE",
    "WARM_START_LR",
    "ORIGINAL_RECIPE",
    "TRANSFORMER_RECIPE",
    "recipe_for",
    "TrainConfig",
    "resolve_device",
    "build_prior",
    "model_from_config",
    "build_model",
    "estimate_memory",
    "lr_at",
    "training_prior",
    "RUN_ROOT_ENV",
    "run_root",
    "run_dir_for",
]

#: What a training step draws and the model reads (:attr:`TrainConfig.inputs`).
INPUT_PATHS = ("tokens", "statistic")
#: The evaluation contexts are drawn with ``effective_data_seed + EVAL_SEED_OFFSET``, never seen
#: in training.
EVAL_SEED_OFFSET = 10_000
#: The router warm start draws its contexts with ``effective_data_seed + WARM_START_SEED_OFFSET``.
WARM_START_SEED_OFFSET = 20_000
#: Config fields that may change between an interrupted run and its resumption.
RESUMABLE_FIELDS = ("device", "checkpoint_every")

#: Fields added after runs were saved, each with the value that changes nothing (the behaviour
#: before the field existed). A saved config that lacks one of them reads it at that value
#: (:meth:`TrainConfig.from_dict`), and :func:`run_dir_for` leaves a field out of a run's name
#: at that value, so the runs saved before it keep their directories. A new knob adds one row.
ADDED_FIELDS = {
    "warmup": 0.0,
    "router_warm_start": 0,
    "data_seed": None,
    "arch": DEFAULT_FAMILY,
    "expected_loss": False,
    "alpha_start": None,
    "inputs": "tokens",
    "router": DEFAULT_ROUTER,
}


# ----------------------------------------------------------------------------------------
# Recipes
# ----------------------------------------------------------------------------------------
#: The training recipe of the :class:`TrainConfig` defaults (and of every stored experiment's
#: runs without a warm start), found in chapter 8's section on closing the gap to the adaptive
#: references: peak learning rate, warm-up fraction, query tokens per context, MLP width. It
#: has no teacher: nothing computed from a theory policy (greedy, the optimised adaptive
#: policy, DP) enters training, every model starts from its random initialisation
#: (``router_warm_start = 0``).
#: ``router_lr_scale`` acts only with a warm start (:attr:`TrainConfig.warm_starts`); it is
#: the scale :data:`IMITATION_RECIPE` trains its router at.
RECIPE = {"lr": 1e-2, "warmup": 0.05, "queries": 256, "width": 256, "router_warm_start": 0,
          "router_lr_scale": 0.1}

#: The recipe of ``python -m fvlib train`` for the constrained models (:func:`recipe_for`):
#: :data:`RECIPE` with a batch of 512 contexts and the expected query loss
#: (:attr:`TrainConfig.expected_loss`: ``|theta_hat - theta|^2 + sigma^2``, no sampled query
#: tokens), and on the tree prior a curriculum over the decay (:func:`curriculum_start`). With it
#: model A, from its random initialisation and with no teacher, comes within 1.5 times the best
#: adaptive reference in 3000 steps at the configurations chapter 8 measures. Nothing in it is
#: computed from a theory policy: the expected loss reads the task's own ``theta``, as the
#: sampled loss reads its labels.
LEARNING_RECIPE = {**RECIPE, "batch": 512, "expected_loss": True}

#: The tree curriculum of :data:`LEARNING_RECIPE`: training starts at the decay
#: ``alpha + CURRICULUM_SHARE * (1 - alpha)`` (0.7 for ``alpha = 1/2``), a tree whose deep levels
#: weigh more, and reaches ``alpha`` after the first ``alpha_ramp`` (0.6) of the steps.
CURRICULUM_SHARE = 0.4


def curriculum_start(alpha: float) -> float:
    """The decay a :data:`LEARNING_RECIPE` run on a tree of decay ``alpha`` starts from:
    ``alpha + CURRICULUM_SHARE * (1 - alpha)``, rounded to 6 decimals (in ``(alpha, 1)`` for
    ``alpha`` in ``(0, 1)``)."""
    check_number("alpha", alpha, 0, 1, low_open=True)
    return round(alpha + CURRICULUM_SHARE * (1 - alpha), 6)


#: :data:`RECIPE` with an **imitation** warm start: for model A on the tree prior, before
#: training, ``router_warm_start`` regression steps fit its router to the greedy coordinate
#: policy (:mod:`fvlib.training.warm_start`: the router is *shown* greedy's choices), which then trains
#: at ``router_lr_scale`` times the learning rate. Other runs ignore the two fields
#: (:attr:`TrainConfig.warm_starts`). The appendix *How the experiments were run* uses it to tell
#: what model A can represent
#: from what it learns (``python -m fvlib train --imitation``).
IMITATION_RECIPE = {**RECIPE, "router_warm_start": 600, "router_lr_scale": 0.1}

#: Learning rate of the router warm start (:func:`fvlib.training.warm_start.warm_start_router`).
WARM_START_LR = 1e-2


#: The training recipe the book's runs of chapters 5 and 7 to 10 were trained with, before
#: chapter 8's section on closing the gap to the adaptive references made the current
#: :class:`TrainConfig` defaults: ``TrainConfig(**ORIGINAL_RECIPE, ...)`` gives the same numbers
#: and the same :func:`run_dir_for` directories as those runs. The shared runs now take the one
#: recipe (:func:`recipe_for`); this one appears where the appendix *How the experiments were run* compares recipes
#: (``original_config`` of :mod:`fvlib.experiments.inbuild`).
#: Those runs drew every token of every context (``inputs = 'tokens'``), so the recipe pins that path.
ORIGINAL_RECIPE = {"lr": 3e-3, "warmup": 0.0, "queries": 64, "width": 128, "router_warm_start": 0,
                   "router_lr_scale": 1.0, "inputs": "tokens"}

#: The recipe of ``python -m fvlib train --arch transformer|transformer-open`` where a flag does
#: not say otherwise: the standard transformers of :mod:`fvlib.transformer` diverge at the
#: constrained models' learning rate and need no width 128 (what the bottlenecked model needed
#: is measured in that module's docstring and in chapter 11).
TRANSFORMER_RECIPE = {"lr": 2e-3, "warmup": 0.0, "queries": 64, "batch": 64, "width": 32}


def recipe_for(arch: str, prior: str = "tree", alpha: float = 0.5) -> dict:
    """The training settings that ``python -m fvlib train --arch ARCH`` uses where no flag is
    given: for a family whose models predict ``theta_hat`` (``'constrained'``)
    :data:`LEARNING_RECIPE`, on a tree prior with its curriculum (``alpha_start =
    curriculum_start(alpha)``); :data:`TRANSFORMER_RECIPE` for the others, the standard
    transformers (their sampled loss, no curriculum)."""
    family = get_family(arch)
    tree = get_prior_kind(prior).is_tree
    if not family.predicts_theta:
        return dict(TRANSFORMER_RECIPE)
    curriculum = {"alpha_start": curriculum_start(alpha)} if tree else {}
    return {**LEARNING_RECIPE, **curriculum}


# ----------------------------------------------------------------------------------------
# The config
# ----------------------------------------------------------------------------------------

def model_letters() -> tuple[str, ...]:
    """The model letters of every registered family (``A``, ``B``, ``C``), in registration order."""
    return tuple(dict.fromkeys(m for name in family_names() for m in get_family(name).models))

@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run (JSON-serialisable).

    A field whose metadata has a ``help`` entry is a flag of ``python -m fvlib train``
    (:mod:`fvlib.cli`): ``--`` and its name with ``-`` for ``_``, typed by its annotation, with
    that help (``None``: none shown), the metadata's ``choices`` and, with ``required``, given on
    every command line; a flag not given takes the field's default or the recipe's value.

    Attributes:
        model: ``'A'``, ``'B'`` or ``'C'`` (see :mod:`fvlib.models`).
        prior: ``'tree'``, ``'gaussian-twin'`` or ``'gaussian'`` (see :func:`fvlib.priors.make_prior`).
        depth, alpha: tree depth ``K`` (``D = 2^K - 1``) and decay ``alpha``.
        n_ctx, noise_std: context length ``N`` and label noise ``sigma``.
        budget: communication budget ``M``.
        steps, batch, lr: optimisation length, contexts per step, peak Adam learning rate.
        warmup: the fraction of ``steps`` spent in a linear learning-rate warm-up before the
            cosine decay (see :func:`lr_at`); ``0``, the book's original recipe, starts at the peak.
        queries: query tokens per training context (the loss averages over them); unused with
            ``expected_loss``.
        expected_loss: train on the query loss's expectation over the query token instead of
            ``queries`` sampled tokens: ``|theta_hat - theta|^2 + sigma^2`` per context (for
            ``x_q ~ N(0, I)``, ``E(<theta_hat, x_q> - y_q)^2`` is exactly that), the limit of
            infinitely many query tokens: no query-token gradient noise, and no query tokens to
            draw (a cheaper step). It reads ``theta``, which the sampled loss only sees through
            the query labels, so it needs a model that predicts ``theta_hat`` (constrained
            models). ``False``, the default, is the sampled loss of every stored run.
        alpha_start, alpha_ramp: a curriculum over the tree's decay (tree prior only): step
            ``t`` trains on contexts of a tree with decay
            ``alpha_start + (alpha - alpha_start) min(1, t / (alpha_ramp steps))``, from
            ``alpha_start`` at step 0 to ``alpha`` once ``alpha_ramp`` of the steps are done, then
            ``alpha`` to the end (:func:`training_prior`). A larger decay gives the deep levels
            more weight and clearer readings, where model A learns to route to them; the
            evaluation set is always drawn at ``alpha``. Nothing in it comes from a theory
            policy. ``alpha_start = None``, the default, trains at ``alpha`` throughout
            (``alpha_ramp`` is then unused).
        width, hidden_layers: router and decoder MLP size.
        router: model A's router (:data:`fvlib.routers.MODEL_A_ROUTERS`; the families'
            ``router_models``): ``'gated'`` (the default, every stored run's), ``'linear'`` (fixed
            directions: model B's function class), ``'bilinear'``, ``'coord'`` (one coordinate per
            layer); see :mod:`fvlib.routers`. Other models keep their own router and refuse
            another. Only the gated router takes the imitation warm start.
        router_warm_start: model A on the tree prior only (ignored otherwise, see
            :meth:`warm_starts`): before training, this many steps fit its router to the
            greedy coordinate policy (:func:`fvlib.training.warm_start.warm_start_router`, ``batch``
            contexts a step, drawn with ``effective_data_seed + WARM_START_SEED_OFFSET``, so
            the training contexts are those of a run without warm start): the imitation
            start of :data:`IMITATION_RECIPE`. ``0``, the default (:data:`RECIPE`, and the
            book's original recipe), starts from the random initialisation: no teacher.
        router_lr_scale: with a warm start, the router (every ``blocks.*`` parameter) trains
            at ``router_lr_scale * lr_at(step)``; ignored without one.
        seed: seeds the model initialisation, and the data when ``data_seed`` is ``None``.
        data_seed: seeds the data: the training contexts and the evaluation set (drawn with
            ``data_seed + 10_000``); ``None`` (the default) uses ``seed``. Runs with the same
            data seed (and the same prior, ``n_ctx``, ``noise_std``, ``batch`` and ``queries``)
            see the very same contexts: common random numbers, which
            :func:`fvlib.training.batched.train_many` samples once for all of them.
        eval_every, eval_contexts: evaluation period (steps) and evaluation set size.
        checkpoint_every: checkpoint period (steps); the last step is always checkpointed.
        device: ``'auto'`` (CUDA when available), ``'cpu'``, ``'cuda'``, ...
        arch: ``'constrained'`` (models A, B, C of :mod:`fvlib.models`), ``'transformer'``
            (the bottlenecked standard transformer of :mod:`fvlib.transformer`, models A' and
            B') or ``'transformer-open'`` (its open arrangement); for transformers ``width`` is
            ``d_model`` and ``hidden_layers`` is unused.
        inputs: what each step draws and the model reads: ``'statistic'``, each context's pooled
            statistic ``g`` drawn exactly without its tokens (:func:`fvlib.task.sample_statistic`,
            ``O(D)`` a context whatever ``N``), for models that read only ``g``
            (:attr:`fvlib.models.FVTransformer.reads_statistic`: A, B, C); or ``'tokens'``, all
            ``N`` tokens of every context (``O(N D)``), which the standard transformers need. The two
            train the same function on contexts of the same law, not the same draws. ``'auto'``
            (the default) is ``'statistic'`` for the constrained models and ``'tokens'`` otherwise
            (:attr:`input_path`); :meth:`to_dict`, and so every saved config and result file,
            records the path that trained the run. Runs stored before the field existed read
            ``'tokens'``.
    """

    model: str = field(default="A", metadata={"help": None, "required": True, "choices": model_letters})
    prior: str = field(default="tree", metadata={"help": None, "choices": prior_kinds})
    depth: int = field(default=6, metadata={"help": "tree depth K (D = 2^K - 1)", "required": True})
    alpha: float = field(default=0.5, metadata={"help": None})
    n_ctx: int = field(default=128, metadata={"help": "context length N", "required": True})
    noise_std: float = field(default=0.0, metadata={"help": "label noise sigma"})
    budget: int = field(default=6, metadata={"help": "measurement budget M, in [1, D]", "required": True})
    steps: int = field(default=3000, metadata={"help": None, "required": True})
    batch: int = field(default=256, metadata={
        "help": "contexts per step (default 512; transformers 64; 256 with --imitation)"})
    lr: float = field(default=RECIPE["lr"], metadata={"help": "peak learning rate (default 1e-2; transformers 2e-3)"})
    warmup: float = field(default=RECIPE["warmup"], metadata={
        "help": "fraction of --steps spent warming up the learning rate, in [0, 1)"})
    queries: int = field(default=RECIPE["queries"], metadata={
        "help": "query tokens per training context (default 256; transformers 64)"})
    expected_loss: bool = field(default=False, metadata={
        "help": "constrained models: train on the query loss's expectation over the query token, "
                "|theta_hat - theta|^2 + sigma^2 (infinitely many query tokens; --queries unused); "
                "the default for constrained models without --imitation; --no-expected-loss: "
                "sampled query tokens"})
    alpha_start: float | None = field(default=None, metadata={
        "help": "tree prior: a curriculum over the decay, from this alpha at step 0 to --alpha "
                "(default for constrained models without --imitation: alpha + 0.4 (1 - alpha), "
                "fvlib.training.curriculum_start)"})
    alpha_ramp: float = field(default=0.6, metadata={
        "help": "with a curriculum: the fraction of --steps over which alpha moves (default 0.6)"})
    width: int = field(default=RECIPE["width"], metadata={
        "help": "MLP width, d_model for transformers (default 256; transformers 32)"})
    hidden_layers: int = 2
    router: str = field(default=DEFAULT_ROUTER, metadata={
        "help": "model A's router: gated (an MLP of the workspace gates the key directions; the default), "
                "linear (fixed directions: model B's function class), bilinear (G_0 + sum_j Phi_j U_j, no "
                "hidden layer), coord (one coordinate per layer: soft, annealed to one-hot); fvlib.routers",
        "choices": MODEL_A_ROUTERS})
    router_warm_start: int = field(default=RECIPE["router_warm_start"], metadata={
        "help": "model A on the tree prior: steps fitting its router to the greedy policy "
                "before training (default 0: none; 600 with --imitation)"})
    router_lr_scale: float = field(default=RECIPE["router_lr_scale"], metadata={
        "help": "a warm-started router's learning rate as a fraction of --lr (default 0.1)"})
    seed: int = field(default=0, metadata={"help": None})
    data_seed: int | None = None
    eval_every: int = 250
    eval_contexts: int = 2048
    checkpoint_every: int = 500
    device: str = field(default="auto", metadata={"help": "auto (CUDA when available), cpu, cuda, ..."})
    arch: str = field(default="constrained", metadata={
        "help": "constrained (models A, B, C), transformer (bottlenecked; A', B'), transformer-open",
        "choices": family_names})
    inputs: str = field(default="auto", metadata={
        "help": "what each step draws and the model reads: statistic (each context's pooled statistic, "
                "drawn exactly without its tokens: a longer context costs nothing), tokens (every "
                "token), auto (statistic for constrained models, tokens for transformers)",
        "choices": ("auto", *sorted(INPUT_PATHS))})

    def __post_init__(self):
        family = get_family(self.arch)
        self._resolve_inputs()
        if self.model not in family.models:
            raise ValueError(f"model must be one of {family.models} for arch {self.arch!r}, got {self.model!r}")
        get_prior_kind(self.prior)
        for name in (
            "depth",
            "budget",
            "steps",
            "batch",
            "queries",
            "width",
            "hidden_layers",
            "eval_every",
            "checkpoint_every",
        ):
            check_int(name, getattr(self, name), 1)
        check_int("eval_contexts", self.eval_contexts, 2)  # a standard error needs two contexts
        check_seed("seed", self.seed)
        check_int("router_warm_start", self.router_warm_start, 0)
        self._check_router(family)
        check_number("router_lr_scale", self.router_lr_scale, 0, 1, low_open=True)
        self._check_warmup()
        if self.data_seed is not None:
            check_seed("data_seed", self.data_seed)
        check_number("lr", self.lr, 0, low_open=True)
        if not isinstance(self.device, str):
            raise ValueError(f"device must be a string, got {self.device!r}")
        if not isinstance(self.expected_loss, bool):
            raise ValueError(f"expected_loss must be True or False, got {self.expected_loss!r}")
        if self.alpha_start is not None:
            if not get_prior_kind(self.prior).is_tree:
                raise ValueError(f"alpha_start (a curriculum over the tree's decay) needs the tree prior, "
                                 f"got prior {self.prior!r}")
            check_number("alpha_start", self.alpha_start, 0, 1, low_open=True)
        check_number("alpha_ramp", self.alpha_ramp, 0, 1, low_open=True)
        if self.expected_loss and not family.predicts_theta:
            raise ValueError(f"expected_loss needs a model that predicts theta_hat (arch one of "
                             f"{_families_that('predicts_theta')}), got arch {self.arch!r}")
        check_task_args(self.n_ctx, self.noise_std)
        make_prior(self.prior, self.depth, self.alpha)  # validates depth and alpha
        check_budget("budget", self.budget, self.depth)

    def _check_router(self, family) -> None:
        """``router`` is one of :data:`fvlib.routers.MODEL_A_ROUTERS`, and other than the default only
        for a model whose router a run may choose (the family's ``router_models``: model A)."""
        if self.router not in MODEL_A_ROUTERS:
            raise ValueError(f"router must be one of {MODEL_A_ROUTERS}, got {self.router!r}")
        if self.router != DEFAULT_ROUTER and self.model not in family.router_models:
            raise ValueError(f"router {self.router!r} is a choice of model A only (arch 'constrained'); "
                             f"model {self.model!r} with arch {self.arch!r} has its own router")

    def _check_warmup(self) -> None:
        """``warmup`` is a fraction in ``[0, 1)`` (a warm-up of every step leaves no decay)."""
        try:
            fraction = check_number("warmup", self.warmup, 0, 1) < 1
        except ValueError:
            fraction = False
        if not fraction:
            raise ValueError(f"warmup must be a fraction in [0, 1), got {self.warmup!r}")

    def _resolve_inputs(self) -> None:
        """Refuse an unknown path, or one the architecture cannot take; the architecture's own path
        is kept as ``'auto'``, so that configs of the same run are equal however they were made
        (``TrainConfig(inputs='statistic') == TrainConfig()``, and a saved config reads back equal)."""
        if self.inputs == self._default_path():
            object.__setattr__(self, "inputs", "auto")
        if self.inputs not in ("auto",) + INPUT_PATHS:
            raise ValueError(f"inputs must be one of {('auto',) + INPUT_PATHS}, got {self.inputs!r}")
        if self.inputs == "statistic" and not get_family(self.arch).reads_statistic:
            raise ValueError(f"inputs 'statistic' needs a model that reads only the pooled statistic (arch one of "
                             f"{_families_that('reads_statistic')}); arch {self.arch!r} reads every token")

    @property
    def input_path(self) -> str:
        """``'statistic'`` or ``'tokens'``: :attr:`inputs`, with ``'auto'`` resolved by the architecture."""
        return self._default_path() if self.inputs == "auto" else self.inputs

    def _default_path(self) -> str:
        return get_family(self.arch).input_path

    @property
    def statistic(self) -> bool:
        """``True`` when the run trains and evaluates on the pooled statistic (:attr:`input_path`)."""
        return self.input_path == "statistic"

    def to_dict(self) -> dict:
        """The fields as a JSON-able dict, ``inputs`` resolved (:attr:`input_path`): what trained the run."""
        return {**asdict(self), "inputs": self.input_path}

    @classmethod
    def from_dict(cls, data: Mapping) -> TrainConfig:
        """Build from a dict; unknown keys raise ``ValueError`` naming them.

        A dict that gives ``lr`` is a saved config (saved configs name every field): a field of
        :data:`ADDED_FIELDS` that it lacks was saved before the field existed and takes the value
        that changes nothing (e.g. ``warmup = 0``, not the current default). Other dicts take the
        defaults for what they leave out.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"train config must be a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown train config keys: {unknown}")
        if "lr" in data:
            data = {**ADDED_FIELDS, **data}
        return cls(**data)

    @property
    def warm_starts(self) -> bool:
        """``True`` for a run that warm-starts its router, i.e. model A (constrained: the models of
        its family's ``warm_start_models``) with the gated router on a tree prior with
        ``router_warm_start > 0``; only then does ``router_lr_scale`` apply."""
        return (self.router_warm_start > 0 and self.model in get_family(self.arch).warm_start_models
                and get_prior_kind(self.prior).is_tree and self.router == DEFAULT_ROUTER)

    @property
    def effective_data_seed(self) -> int:
        """The seed of the training contexts (and, plus 10_000, of the evaluation set)."""
        return self.seed if self.data_seed is None else self.data_seed

    def unused_fields(self) -> set[str]:
        """The fields that change nothing in this run: the warm-start fields of a run that does not
        warm-start (:attr:`warm_starts`), ``alpha_ramp`` without a curriculum, ``router`` for a model
        that has its own (all but model A)."""
        unused = set() if self.warm_starts else {"router_warm_start", "router_lr_scale"}
        unused |= set() if self.model in get_family(self.arch).router_models else {"router"}
        return unused | ({"alpha_ramp"} if self.alpha_start is None else set())

    def model_config(self) -> ModelConfig | TransformerConfig:
        """The architecture this run trains (its family's
        :attr:`~fvlib.families.ModelFamily.build_config`), with model A's :attr:`router`."""
        config = get_family(self.arch).build_config(self.model, 2**self.depth - 1, self.budget, self.width,
                                                    self.hidden_layers)
        return config if self.router == DEFAULT_ROUTER else replace(config, router=self.router)


def _families_that(capability: str) -> tuple[str, ...]:
    """The registered families whose ``capability`` (a flag of :class:`~fvlib.families.ModelFamily`) is set."""
    return tuple(name for name in family_names() if getattr(get_family(name), capability))


# ----------------------------------------------------------------------------------------
# What a config builds, and what it means at each step
# ----------------------------------------------------------------------------------------
def resolve_device(device: str) -> torch.device:
    """``'auto'`` -> CUDA when available, else CPU; anything else is passed to torch."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a valid torch device") from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return resolved


def build_prior(config: TrainConfig) -> Prior:
    return make_prior(config.prior, config.depth, config.alpha)


def model_from_config(model_config: ModelConfig | TransformerConfig) -> FVTransformer | StandardTransformer:
    """The untrained model of ``model_config``, built by the class of its family
    (:func:`~fvlib.families.family_of_config`)."""
    return family_of_config(model_config).model_class(model_config)


def build_model(config: TrainConfig) -> FVTransformer | StandardTransformer:
    """The untrained model, initialised from ``config.seed`` (the global RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return model_from_config(config.model_config())


def estimate_memory(config: TrainConfig) -> float:
    """A rough peak memory of training ``config``, in bytes, computed before any work: the
    evaluation set and the training batch (``(eval_contexts + 3 batch) N (D + 1)`` float32
    numbers: contexts, their gradients and copies; ``N = 1`` on the pooled statistic), the
    query tokens (none under the expected loss), the parameters with their gradients and Adam
    moments, for the constrained models the activations of their MLPs (``1.75 batch width
    (hidden_layers + 1) L`` numbers: the address space training took at ``K = 6``, ``N = 128``,
    width 256, batch 65536, 2.16 GB, ``VmPeak`` less ``VmSize`` before), and for the standard
    transformers the attention scores (``N^2`` per context and layer). Against measured runs
    (``K = 3`` to ``8``, ``N`` up to 2048, both architectures) it is within a factor of about
    3, which is all the CLI needs to refuse a run that cannot fit.
    """
    D = 2**config.depth - 1
    per_context = D + 1 if config.statistic else config.n_ctx * (D + 1)  # what a context holds
    numbers = (config.eval_contexts + 3 * config.batch) * per_context
    if not config.expected_loss:
        numbers += 3 * config.batch * config.queries * (D + 1)
    try:  # parameters counted on the meta device: no memory is allocated
        with torch.device("meta"):
            params = sum(p.numel() for p in model_from_config(config.model_config()).parameters())
    except RuntimeError:  # too large for torch to describe
        return math.inf
    numbers += 4 * params
    if not get_family(config.arch).softmax_attention:
        model = config.model_config()
        numbers += 1.75 * config.batch * model.width * (model.hidden_layers + 1) * model.n_layers
    if get_family(config.arch).softmax_attention:
        layers = config.model_config().n_layers
        numbers += config.n_ctx**2 * (512 + 3 * config.batch * layers // 2)  # eval chunk, training
    return 4.0 * numbers


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up, then cosine decay, of the learning rate at ``step``.

    ``lr (step + 1) / w`` for the first ``w = floor(warmup * steps)`` steps, then
    ``lr (1 + cos(pi (step - w) / (steps - w))) / 2``: from ``lr`` down to 0 at ``steps``. With
    ``warmup = 0`` it is the plain cosine ``lr (1 + cos(pi step / steps)) / 2``.
    """
    w = int(config.warmup * config.steps)
    if step < w:
        return config.lr * (step + 1) / w
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * (step - w) / (config.steps - w)))


def training_prior(config: TrainConfig, step: int) -> Prior:
    """The prior the training contexts of ``step`` (0-based) are drawn from: the prior of
    ``config``, or with a curriculum (``TrainConfig.alpha_start``) the tree of decay
    ``alpha_start + (alpha - alpha_start) min(1, step / (alpha_ramp steps))``."""
    if config.alpha_start is None:
        return build_prior(config)
    done = min(1.0, step / (config.alpha_ramp * config.steps))
    return make_prior(config.prior, config.depth, config.alpha_start + (config.alpha - config.alpha_start) * done)


# ----------------------------------------------------------------------------------------
# Run directories' names
# ----------------------------------------------------------------------------------------
#: Environment variable that overrides where :func:`run_dir_for` keeps runs.
RUN_ROOT_ENV = "FVLIB_RUN_ROOT"


def run_root(root: str | os.PathLike | None = None) -> Path:
    """``root``, or where :func:`run_dir_for` keeps runs by default: ``$FVLIB_RUN_ROOT`` or
    ``./.fvlib_runs``."""
    return Path(root if root is not None else os.environ.get(RUN_ROOT_ENV, ".fvlib_runs"))


def run_dir_for(config: TrainConfig, root: str | os.PathLike | None = None) -> Path:
    """A directory named after everything in ``config`` that changes the result.

    ``train(config, out_dir=run_dir_for(config))`` trains once and, when called again with the
    same config (another chapter, a re-run), resumes the finished run instead of retraining: the
    numbers are identical either way because training is deterministic. ``root`` defaults to
    ``$FVLIB_RUN_ROOT`` or ``./.fvlib_runs``. A field of :data:`ADDED_FIELDS` at its value there
    is left out of the name, so runs named before that field existed keep their directories; so
    are the fields that change nothing in this run (:meth:`TrainConfig.unused_fields`) and
    :data:`RESUMABLE_FIELDS`.
    """
    root = run_root(root)
    fields_that_matter = {
        k: v
        for k, v in config.to_dict().items()
        if k not in RESUMABLE_FIELDS and k not in config.unused_fields()
        and not (k in ADDED_FIELDS and v == ADDED_FIELDS[k])
    }
    digest = hashlib.sha256(json.dumps(fields_that_matter, sort_keys=True).encode()).hexdigest()[:10]
    prefix = "" if config.arch == DEFAULT_FAMILY else f"{config.arch}-"
    name = (f"{prefix}{config.model}-{config.prior}-"
            f"K{config.depth}-M{config.budget}-N{config.n_ctx}-s{config.steps}-{digest}")
    return root / name
