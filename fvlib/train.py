"""Training models A, B, C on in-context regression (chapter 8, *Experiments*; the book's appendix *Conventions*,
section "Models A, B, C").

* Fresh contexts every step (infinite data) from a seeded :class:`torch.Generator`.
* Loss: the query-token loss ``(y_hat_q - y_q)^2``, averaged over the batch and over
  ``queries`` query tokens per context (the context's own query plus ``queries - 1`` extra
  ones drawn from the same law). Its expectation is ``sigma^2 + |theta_hat - theta|^2``
  whatever ``queries`` is; more query tokens only lower the gradient noise (one query
  token gives a rank-one, very noisy estimate of ``theta_hat - theta`` in ``D`` dimensions).
* Adam with a cosine learning-rate schedule ``lr_t = lr (1 + cos(pi t / steps)) / 2``.
* Evaluation on a fixed set of contexts drawn from a *separate* seed (``seed + 10_000``, or
  ``data_seed + 10_000``):
  the excess loss ``E|theta_hat - theta|^2`` and the query loss, which should agree up to
  ``sigma^2`` (``query_loss ~ noise_std^2 + excess_loss``).
* Deterministic on CPU: the same config gives bitwise the same numbers, and a run that is
  interrupted and resumed from its checkpoint ends exactly where an uninterrupted run ends.

* A run that diverges (a non-finite loss or weights, e.g. at too large a learning rate) stops
  with :class:`TrainingDiverged`; its directory keeps its last checkpoint, which was finite.

A run directory holds its config, weights, training state (Adam moments, RNG state) and
evaluation history; each checkpoint is written as one atomic step, listed in a manifest with
every file's size and SHA-256 and verified when read, and the directory is locked while it is
trained (:mod:`fvlib.checkpoint`). Nothing is ever unpickled: tensors go through safetensors,
scalars through JSON.
"""

from __future__ import annotations

import json
import hashlib
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ._checks import check_budget, check_int, check_number, check_seed, is_int
from .checkpoint import (
    CONFIG_FILE,
    HISTORY_FILE,
    MANIFEST_FILE,
    MODEL_FILE,
    STATE_FILE,
    RunDirError,
    RunLock,
    commit,
    has_checkpoint,
    read_files,
    recover,
    start_over,
    tensors_from_bytes,
    tensors_to_bytes,
    write_atomic,
)
from .models import MODEL_KINDS, FVTransformer, ModelConfig, model_config
from .transformer import StandardTransformer, TransformerConfig, transformer_config
from .warm_start import is_router_parameter, warm_start_router
from .priors import Prior, TreePrior, make_prior
from .stats import mean_and_stderr, squared_error
from .task import TaskBatch, check_task_args, make_generator, sample_task
from .theory import channel_tau2, evaluate_strategies, gaussian_coordinate_loss

__all__ = [
    "PRIOR_KINDS",
    "ARCHS",
    "EVAL_SEED_OFFSET",
    "WARM_START_SEED_OFFSET",
    "WARM_START_LR",
    "TrainConfig",
    "RECIPE",
    "LEARNING_RECIPE",
    "CURRICULUM_SHARE",
    "curriculum_start",
    "IMITATION_RECIPE",
    "ORIGINAL_RECIPE",
    "TRANSFORMER_RECIPE",
    "recipe_for",
    "TrainResult",
    "RunDirError",
    "TrainingDiverged",
    "resolve_device",
    "build_prior",
    "build_model",
    "estimate_memory",
    "lr_at",
    "sample_queries",
    "training_prior",
    "expected_query_loss",
    "sample_training_batch",
    "parameter_groups",
    "set_learning_rate",
    "training_step",
    "evaluate",
    "per_context_losses",
    "train",
    "load_run",
    "load_history",
    "checkpoint_step",
    "MATCHING_BASELINE",
    "theory_reference",
    "compare_with_theory",
    "run_root",
    "run_dir_for",
]

PRIOR_KINDS = ("tree", "gaussian-twin", "gaussian")
#: ``arch -> transformer arrangement``; ``"constrained"`` is the book's models A, B, C.
ARCHS = {"constrained": None, "transformer": "bottlenecked", "transformer-open": "open"}
#: The evaluation contexts are drawn with ``effective_data_seed + EVAL_SEED_OFFSET``, never seen
#: in training.
EVAL_SEED_OFFSET = 10_000
#: The router warm start draws its contexts with ``effective_data_seed + WARM_START_SEED_OFFSET``.
WARM_START_SEED_OFFSET = 20_000
#: Config fields that may change between an interrupted run and its resumption.
RESUMABLE_FIELDS = ("device", "checkpoint_every")


class TrainingDiverged(ValueError):
    """Training met a non-finite loss or non-finite weights (typically: the learning rate is
    too large); the run directory keeps its last checkpoint, written before that step."""


# ----------------------------------------------------------------------------------------
# Configuration
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
#: policy (:mod:`fvlib.warm_start`: the router is *shown* greedy's choices), which then trains
#: at ``router_lr_scale`` times the learning rate. Other runs ignore the two fields
#: (:attr:`TrainConfig.warm_starts`). Chapter 8 uses it to tell what model A can represent
#: from what it learns (``python -m fvlib train --imitation``).
IMITATION_RECIPE = {**RECIPE, "router_warm_start": 600, "router_lr_scale": 0.1}

#: Learning rate of the router warm start (:func:`fvlib.warm_start.warm_start_router`).
WARM_START_LR = 1e-2


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run (JSON-serialisable).

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
        router_warm_start: model A on the tree prior only (ignored otherwise, see
            :meth:`warm_starts`): before training, this many steps fit its router to the
            greedy coordinate policy (:func:`fvlib.warm_start.warm_start_router`, ``batch``
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
            :func:`fvlib.batched.train_many` samples once for all of them.
        eval_every, eval_contexts: evaluation period (steps) and evaluation set size.
        checkpoint_every: checkpoint period (steps); the last step is always checkpointed.
        device: ``'auto'`` (CUDA when available), ``'cpu'``, ``'cuda'``, ...
        arch: ``'constrained'`` (models A, B, C of :mod:`fvlib.models`), ``'transformer'``
            (the bottlenecked standard transformer of :mod:`fvlib.transformer`, models A' and
            B') or ``'transformer-open'`` (its open arrangement); for transformers ``width`` is
            ``d_model`` and ``hidden_layers`` is unused.
    """

    model: str = "A"
    prior: str = "tree"
    depth: int = 6
    alpha: float = 0.5
    n_ctx: int = 128
    noise_std: float = 0.0
    budget: int = 6
    steps: int = 3000
    batch: int = 256
    lr: float = RECIPE["lr"]
    warmup: float = RECIPE["warmup"]
    queries: int = RECIPE["queries"]
    expected_loss: bool = False
    alpha_start: float | None = None
    alpha_ramp: float = 0.6
    width: int = RECIPE["width"]
    hidden_layers: int = 2
    router_warm_start: int = RECIPE["router_warm_start"]
    router_lr_scale: float = RECIPE["router_lr_scale"]
    seed: int = 0
    data_seed: int | None = None
    eval_every: int = 250
    eval_contexts: int = 2048
    checkpoint_every: int = 500
    device: str = "auto"
    arch: str = "constrained"

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {tuple(ARCHS)}, got {self.arch!r}")
        kinds = MODEL_KINDS if self.arch == "constrained" else ("A", "B")
        if self.model not in kinds:
            raise ValueError(f"model must be one of {kinds} for arch {self.arch!r}, got {self.model!r}")
        if self.prior not in PRIOR_KINDS:
            raise ValueError(f"prior must be one of {PRIOR_KINDS}, got {self.prior!r}")
        for name in (
            "depth",
            "budget",
            "steps",
            "batch",
            "queries",
            "width",
            "hidden_layers",
            "eval_every",
            "eval_contexts",
            "checkpoint_every",
        ):
            check_int(name, getattr(self, name), 1)
        check_seed("seed", self.seed)
        check_int("router_warm_start", self.router_warm_start, 0)
        check_number("router_lr_scale", self.router_lr_scale, 0, 1, low_open=True)
        check_number("warmup", self.warmup, 0, 1)
        if self.warmup == 1:
            raise ValueError(f"warmup must be a fraction in [0, 1), got {self.warmup!r}")
        if self.data_seed is not None:
            check_seed("data_seed", self.data_seed)
        check_number("lr", self.lr, 0, low_open=True)
        if not isinstance(self.device, str):
            raise ValueError(f"device must be a string, got {self.device!r}")
        if not isinstance(self.expected_loss, bool):
            raise ValueError(f"expected_loss must be True or False, got {self.expected_loss!r}")
        if self.alpha_start is not None:
            if self.prior != "tree":
                raise ValueError(f"alpha_start (a curriculum over the tree's decay) needs the tree prior, "
                                 f"got prior {self.prior!r}")
            check_number("alpha_start", self.alpha_start, 0, 1, low_open=True)
        check_number("alpha_ramp", self.alpha_ramp, 0, 1, low_open=True)
        if self.expected_loss and self.arch != "constrained":
            raise ValueError(f"expected_loss needs a model that predicts theta_hat (arch 'constrained'), "
                             f"got arch {self.arch!r}")
        check_task_args(self.n_ctx, self.noise_std)
        make_prior(self.prior, self.depth, self.alpha)  # validates depth and alpha
        check_budget("budget", self.budget, self.depth)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> "TrainConfig":
        """Build from a dict; unknown keys raise ``ValueError`` naming them.

        A dict that gives ``lr`` but no ``warmup`` is a config saved before ``warmup`` existed
        (saved configs name every field): it had no warm-up, so ``warmup = 0`` there, not the
        current default. Likewise a dict that gives ``lr`` but no ``router_warm_start`` was
        saved before the warm start existed: ``router_warm_start = 0``.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"train config must be a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown train config keys: {unknown}")
        if "lr" in data and "warmup" not in data:
            data = {**data, "warmup": 0.0}
        if "lr" in data and "router_warm_start" not in data:
            data = {**data, "router_warm_start": 0}
        return cls(**data)

    @property
    def warm_starts(self) -> bool:
        """``True`` for a run that warm-starts its router, i.e. model A (constrained) on the
        tree prior with ``router_warm_start > 0``; only then does ``router_lr_scale`` apply."""
        return (self.router_warm_start > 0 and self.arch == "constrained" and self.model == "A"
                and self.prior == "tree")

    @property
    def effective_data_seed(self) -> int:
        """The seed of the training contexts (and, plus 10_000, of the evaluation set)."""
        return self.seed if self.data_seed is None else self.data_seed

    def model_config(self) -> ModelConfig | TransformerConfig:
        """The architecture this run trains."""
        if self.arch != "constrained":
            return transformer_config(self.model, 2**self.depth - 1, self.budget, ARCHS[self.arch], d_model=self.width)
        return model_config(self.model, 2**self.depth - 1, self.budget, self.width, self.hidden_layers)


#: The training recipe the book's runs of chapters 5 and 7 to 10 were trained with, before
#: chapter 8's section on closing the gap to the adaptive references made the current
#: :class:`TrainConfig` defaults: ``TrainConfig(**ORIGINAL_RECIPE, ...)`` gives the same numbers
#: and the same :func:`run_dir_for` directories as those runs (``shared_configs`` and
#: ``depth_sweep`` of :mod:`fvlib.experiments` use it).
ORIGINAL_RECIPE = {"lr": 3e-3, "warmup": 0.0, "queries": 64, "width": 128, "router_warm_start": 0,
                   "router_lr_scale": 1.0}

#: The recipe of ``python -m fvlib train --arch transformer|transformer-open`` where a flag does
#: not say otherwise: the standard transformers of :mod:`fvlib.transformer` diverge at the
#: constrained models' learning rate and need no width 128 (what the bottlenecked model needed
#: is measured in that module's docstring and in chapter 11).
TRANSFORMER_RECIPE = {"lr": 2e-3, "warmup": 0.0, "queries": 64, "batch": 64, "width": 32}


def recipe_for(arch: str, prior: str = "tree", alpha: float = 0.5) -> dict:
    """The training settings that ``python -m fvlib train --arch ARCH`` uses where no flag is
    given: for ``'constrained'`` :data:`LEARNING_RECIPE`, on the tree prior with its curriculum
    (``alpha_start = curriculum_start(alpha)``); :data:`TRANSFORMER_RECIPE` for the standard
    transformers (their sampled loss, no curriculum)."""
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {tuple(ARCHS)}, got {arch!r}")
    if prior not in PRIOR_KINDS:
        raise ValueError(f"prior must be one of {PRIOR_KINDS}, got {prior!r}")
    if arch != "constrained":
        return dict(TRANSFORMER_RECIPE)
    curriculum = {"alpha_start": curriculum_start(alpha)} if prior == "tree" else {}
    return {**LEARNING_RECIPE, **curriculum}


@dataclass
class TrainResult:
    """Outcome of :func:`train` (and of each run of :func:`fvlib.batched.train_many`).

    Attributes:
        model: the trained model (on the training device, in eval mode).
        config: the run's :class:`TrainConfig`.
        history: one dict per evaluation: ``step``, ``lr``, ``train_loss`` (mean query loss
            since the previous evaluation; ``None`` at step 0), ``eval_excess_loss``,
            ``eval_stderr``, ``eval_query_loss``, ``seconds`` (wall time since the start).
        final_loss: excess loss ``E|theta_hat - theta|^2`` on the evaluation set at the end.
        seconds: wall time of training (summed over resumptions).
        checkpoint: path of ``model.safetensors``, or ``None`` without ``out_dir``.
    """

    model: FVTransformer
    config: TrainConfig
    history: list[dict]
    final_loss: float
    seconds: float
    checkpoint: str | None


# ----------------------------------------------------------------------------------------
# Building blocks
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


def _model_from_config(model_config: ModelConfig | TransformerConfig) -> FVTransformer | StandardTransformer:
    if isinstance(model_config, TransformerConfig):
        return StandardTransformer(model_config)
    return FVTransformer(model_config)


def build_model(config: TrainConfig) -> FVTransformer | StandardTransformer:
    """The untrained model, initialised from ``config.seed`` (the global RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return _model_from_config(config.model_config())


def estimate_memory(config: TrainConfig) -> float:
    """A rough peak memory of training ``config``, in bytes, computed before any work: the
    evaluation set and the training batch (``(eval_contexts + 3 batch) N (D + 1)`` float32
    numbers: contexts, their gradients and copies), the query tokens, the parameters with their
    gradients and Adam moments, and for the standard transformers the attention scores
    (``N^2`` per context and layer). Against measured runs (``K = 3`` to ``8``, ``N`` up to
    2048, both architectures) it is within a factor of about 3, which is all the CLI needs to
    refuse a run that cannot fit.
    """
    D = 2**config.depth - 1
    numbers = (config.eval_contexts + 3 * config.batch) * config.n_ctx * (D + 1)
    numbers += 3 * config.batch * config.queries * (D + 1)
    try:  # parameters counted on the meta device: no memory is allocated
        with torch.device("meta"):
            params = sum(p.numel() for p in _model_from_config(config.model_config()).parameters())
    except RuntimeError:  # too large for torch to describe
        return math.inf
    numbers += 4 * params
    if config.arch != "constrained":
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


def sample_queries(
    batch: TaskBatch, queries: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's query plus ``queries - 1`` fresh query tokens per context.

    Returns ``x_query (B, Q, D)`` and ``y_query (B, Q)`` with ``y = <theta, x> + sigma eps``;
    column 0 is the batch's own query. Draws from ``generator`` (on the CPU).
    """
    B, D = batch.x_query.shape
    extra_x = torch.randn(B, queries - 1, D, generator=generator, dtype=batch.x.dtype)
    eps = torch.randn(B, queries - 1, generator=generator, dtype=batch.x.dtype)
    extra_y = torch.einsum("bqd,bd->bq", extra_x, batch.theta) + batch.noise_std * eps
    x_query = torch.cat([batch.x_query[:, None, :], extra_x], dim=1)
    y_query = torch.cat([batch.y_query[:, None], extra_y], dim=1)
    return x_query, y_query


def query_loss(model: FVTransformer, x, y, x_query, y_query) -> torch.Tensor:
    """Mean ``(y_hat_q - y_q)^2`` over contexts and query tokens (the training objective)."""
    return ((model(x, y, x_query) - y_query) ** 2).mean()


def expected_query_loss(theta_hat_of, x, y, x_query, theta, noise_std: float) -> torch.Tensor:
    """The expectation of ``query_loss`` over the query token, ``x_q ~ N(0, I)``: the mean
    over contexts of ``|theta_hat - theta|^2 + sigma^2`` (the objective of
    :attr:`TrainConfig.expected_loss`). ``theta_hat_of(x, y, x_query)`` is the model's
    ``predict_theta``."""
    theta_hat = theta_hat_of(x, y, x_query)
    return ((theta_hat - theta.to(theta_hat.dtype)) ** 2).sum(-1).mean() + noise_std**2


def _sample_eval_batches(prior, n_ctx, noise_std, contexts, seed, chunk=512) -> list[TaskBatch]:
    generator = make_generator(seed)
    sizes = [min(chunk, contexts - start) for start in range(0, contexts, chunk)]
    return [sample_task(prior, size, n_ctx, noise_std, generator) for size in sizes]


@torch.no_grad()
def _evaluate_batches(model: FVTransformer, batches: list[TaskBatch]) -> dict:
    return _eval_summary(*per_context_losses(model, batches))


@torch.no_grad()
def per_context_losses(model, batches: list[TaskBatch]) -> tuple[torch.Tensor, torch.Tensor]:
    """The excess and query losses of ``model`` on every context of ``batches``, ``(n,)`` float64
    each, on the CPU (see :func:`evaluate` for a model that predicts no ``theta_hat``)."""
    device = next(model.parameters()).device
    excess, query = [], []
    was_training = model.training
    model.eval()
    for batch in batches:
        batch = batch.to(device)
        if isinstance(model, FVTransformer):
            theta_hat = model.predict_theta(batch)
            excess.append(squared_error(theta_hat, batch.theta).double().cpu())
            y_hat = (theta_hat * batch.x_query).sum(-1)
        else:  # a prediction that need not be linear in x_q: against the noise-free target
            y_hat = model(batch)
            excess.append(((y_hat - (batch.theta * batch.x_query).sum(-1)) ** 2).double().cpu())
        query.append(((y_hat - batch.y_query) ** 2).double().cpu())
    model.train(was_training)
    return torch.cat(excess), torch.cat(query)


def _eval_summary(excess_all: torch.Tensor, query_all: torch.Tensor) -> dict:
    """An evaluation's numbers from the per-context excess and query losses ``(n,)`` each."""
    excess_loss, stderr = mean_and_stderr(excess_all)
    return {
        "excess_loss": float(excess_loss),
        "stderr": float(stderr),
        "query_loss": float(query_all.mean()),
        "contexts": excess_all.numel(),
    }


def evaluate(
    model: FVTransformer, prior: Prior, n_ctx: int, noise_std: float, contexts: int = 4000, seed: int = 0
) -> dict:
    """Excess and query loss of ``model`` on ``contexts`` fresh contexts drawn with ``seed``.

    For a :class:`~fvlib.transformer.StandardTransformer` (no ``theta_hat``) the excess loss
    is ``E(y_hat_q - <theta, x_q>)^2`` over the contexts' query tokens, which equals
    ``E|theta_hat - theta|^2`` for a prediction linear in ``x_q``.

    Returns:
        dict with ``excess_loss`` (``E|theta_hat - theta|^2``), ``stderr`` (its standard
        error), ``query_loss`` (``E(y_hat_q - y_q)^2``, about ``noise_std^2 + excess_loss``)
        and ``contexts``.
    """
    check_int("contexts", contexts, 1)
    return _evaluate_batches(model, _sample_eval_batches(prior, n_ctx, noise_std, contexts, seed))


# ----------------------------------------------------------------------------------------
# Checkpoints (the files, the manifest and the lock: fvlib.checkpoint)
# ----------------------------------------------------------------------------------------
def _json_from_bytes(data: bytes, path: Path):
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RunDirError(f"corrupt JSON in {path}: {err}") from None


def _write_config(out_dir: Path, config: TrainConfig, model: FVTransformer) -> None:
    payload = {
        "format": "fvlib-run",
        "version": 1,
        "train": config.to_dict(),
        "model": model.config.to_dict(),
    }
    write_atomic(out_dir / CONFIG_FILE, (json.dumps(payload, indent=2) + "\n").encode())


def _parse_config(data: bytes, path: Path) -> tuple[TrainConfig, ModelConfig | TransformerConfig]:
    """The train and model configs of a ``config.json``; they must describe the same model."""
    payload = _json_from_bytes(data, path)
    try:
        config = TrainConfig.from_dict(payload["train"])
        kind = ModelConfig if config.arch == "constrained" else TransformerConfig
        model_config = kind.from_dict(payload["model"])
    except (KeyError, TypeError, ValueError) as err:
        raise RunDirError(f"invalid run config in {path}: {err}") from None
    if model_config != config.model_config():
        raise RunDirError(f"invalid run config in {path}: its model section {model_config} is not the "
                          f"model of its train section, {config.model_config()}")
    return config, model_config


def _parse_history(data: bytes, path: Path) -> tuple[int, list[dict]]:
    payload = _json_from_bytes(data, path)
    if (
        not isinstance(payload, dict)
        or not isinstance(payload.get("history"), list)
        or not is_int(payload.get("step"))
    ):
        raise RunDirError(f"invalid history in {path}")
    return payload["step"], payload["history"]


def _checkpoint_step(metadata: dict, path: Path) -> int:
    try:
        return int(metadata["step"])
    except (KeyError, ValueError):
        raise RunDirError(f"checkpoint {path} has no valid step in its metadata") from None


def _parse_tensors(data: bytes, path: Path) -> tuple[dict, dict, int]:
    """``(tensors, metadata, step)`` of a checkpoint's safetensors file; every float tensor
    must be finite."""
    tensors, metadata = tensors_from_bytes(data, path)
    for name, value in tensors.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise RunDirError(f"{path} holds non-finite values (NaN or inf) in {name!r}")
    return tensors, metadata, _checkpoint_step(metadata, path)


@dataclass
class _Stored:
    """A run directory's checkpoint as read from disk (files verified, steps in agreement)."""

    config: TrainConfig
    model_config: ModelConfig | TransformerConfig
    step: int
    history: list[dict]
    weights: dict
    state: tuple[dict, dict] | None  # (tensors, metadata) of train_state.safetensors


def _read_stored(run_dir: Path, with_state: bool = False) -> _Stored:
    """Read and check the checkpoint of ``run_dir``: config, weights, history (and training
    state). Every file is checked against the manifest (:mod:`fvlib.checkpoint`); a legacy run
    (no manifest) is checked for what it can be: its files agree on the step, its weights are
    finite. Raises :class:`RunDirError` naming the file at fault."""
    names = [CONFIG_FILE, MODEL_FILE, HISTORY_FILE] + ([STATE_FILE] if with_state else [])
    files = read_files(run_dir, names)
    config, model_config = _parse_config(files.data[CONFIG_FILE], run_dir / CONFIG_FILE)
    weights, _, model_step = _parse_tensors(files.data[MODEL_FILE], run_dir / MODEL_FILE)
    history_step, history = _parse_history(files.data[HISTORY_FILE], run_dir / HISTORY_FILE)
    steps = {MODEL_FILE: model_step, HISTORY_FILE: history_step}
    state = None
    if with_state:
        tensors, metadata, steps[STATE_FILE] = _parse_tensors(files.data[STATE_FILE], run_dir / STATE_FILE)
        state = (tensors, metadata)
    if files.step is not None:
        steps[MANIFEST_FILE] = files.step
    if len(set(steps.values())) > 1:
        found = ", ".join(f"{name} step {step}" for name, step in steps.items())
        raise RunDirError(f"{run_dir}: checkpoint files are from different steps ({found}); "
                          f"the run cannot be resumed: delete the directory to train it again")
    return _Stored(config, model_config, model_step, history, weights, state)


def _load_weights(model, weights: dict, path: Path) -> None:
    """Load ``weights`` into ``model``; a missing, extra or wrongly shaped tensor is a one-line
    :class:`RunDirError` naming ``path``."""
    expected = model.state_dict()
    missing, extra = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or extra:
        raise RunDirError(f"weights in {path} do not fit the model of its config.json: "
                          f"missing {missing[:3]}, unexpected {extra[:3]}")
    for name, value in expected.items():
        if weights[name].shape != value.shape:
            raise RunDirError(f"weights in {path} do not fit the model of its config.json: {name!r} has "
                              f"shape {tuple(weights[name].shape)}, the config needs {tuple(value.shape)}")
    model.load_state_dict(weights)


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict:
    tensors = {}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"optimizer.{index}.{key}"] = torch.as_tensor(value)
    return tensors


def _load_optimizer_tensors(optimizer: torch.optim.Optimizer, tensors: dict) -> None:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


def _save_checkpoint(out_dir: Path, step: int, model, optimizer, generator, history, scalars) -> None:
    """Write the checkpoint of ``step`` as one atomic step (:func:`fvlib.checkpoint.commit`)."""
    meta = {"step": str(step)}
    state_tensors = _optimizer_tensors(optimizer)
    state_tensors["generator_state"] = generator.get_state()
    commit(out_dir, step, {
        STATE_FILE: tensors_to_bytes(state_tensors, {**meta, "scalars": json.dumps(scalars)}),
        MODEL_FILE: tensors_to_bytes(model.state_dict(), meta),
        HISTORY_FILE: (json.dumps({"step": step, "history": history}, indent=1) + "\n").encode(),
    })


def _existing_run_dir(run_dir) -> Path:
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is a file, not a run directory")
    if not run_dir.is_dir():
        raise RunDirError(f"run directory {run_dir} does not exist")
    return run_dir


def load_run(run_dir: str | os.PathLike) -> tuple[FVTransformer, TrainConfig, list[dict]]:
    """Load a trained run: ``(model, config, history)``; the model is on the CPU in eval mode.

    Raises:
        RunDirError: (a ``ValueError``) missing directory or files, a file that does not match
            the checkpoint's manifest (corrupt or edited), corrupt JSON or safetensors,
            non-finite weights, weights that do not fit ``config.json``, or files from
            different checkpoints; the message names the path.
    """
    run_dir = _existing_run_dir(run_dir)
    stored = _read_stored(run_dir)
    model = _model_from_config(stored.model_config)
    _load_weights(model, stored.weights, run_dir / MODEL_FILE)
    return model.eval(), stored.config, stored.history


def load_history(run_dir: str | os.PathLike) -> list[dict]:
    """The evaluation history of a run (as in :attr:`TrainResult.history`) without loading its
    weights; raises :class:`RunDirError` when the directory or its history file is missing,
    corrupt or not the one of the checkpoint's manifest."""
    run_dir = _existing_run_dir(run_dir)
    files = read_files(run_dir, [HISTORY_FILE])
    step, history = _parse_history(files.data[HISTORY_FILE], run_dir / HISTORY_FILE)
    if files.step is not None and step != files.step:
        raise RunDirError(f"{run_dir / HISTORY_FILE} is from step {step}, the checkpoint from step {files.step}")
    return history


def checkpoint_step(run_dir: str | os.PathLike) -> int:
    """The step of a run's latest checkpoint, where :func:`train` resumes (it can lie after the
    last evaluation of :func:`load_history` when training was stopped between evaluations);
    raises :class:`RunDirError` as :func:`load_history` does."""
    run_dir = _existing_run_dir(run_dir)
    files = read_files(run_dir, [HISTORY_FILE])
    step, _ = _parse_history(files.data[HISTORY_FILE], run_dir / HISTORY_FILE)
    return step if files.step is None else files.step


def _same_run(a: TrainConfig, b: TrainConfig) -> bool:
    """Whether ``a`` and ``b`` train the same run: equal up to :data:`RESUMABLE_FIELDS` and, as
    in :func:`run_dir_for`, up to the warm-start fields of runs that do not warm-start (they
    change nothing; e.g. a model B run saved when the defaults had a warm start)."""
    same = {k: getattr(b, k) for k in RESUMABLE_FIELDS}
    if not a.warm_starts and not b.warm_starts:
        same.update(router_warm_start=b.router_warm_start, router_lr_scale=b.router_lr_scale)
    return replace(a, **same) == b


def _try_resume(
    out_dir: Path, config: TrainConfig, model, optimizer, generator
) -> tuple[int, list, dict] | None:
    """Restore the checkpoint in ``out_dir``; ``None`` when there is none."""
    if not has_checkpoint(out_dir):
        return None
    stored = _read_stored(out_dir, with_state=True)
    if not _same_run(stored.config, config):
        raise RunDirError(
            f"{out_dir} holds a run with a different config ({stored.config}); use another directory "
            f"(or resume=False to train over it)"
        )
    _load_weights(model, stored.weights, out_dir / MODEL_FILE)
    tensors, metadata = stored.state
    try:
        _load_optimizer_tensors(optimizer, tensors)
        generator.set_state(tensors["generator_state"])
        scalars = json.loads(metadata["scalars"])
    except (KeyError, ValueError, RuntimeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise RunDirError(f"corrupt training state in {out_dir / STATE_FILE}: {reason}") from None
    return stored.step, stored.history, scalars


# ----------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------
def training_prior(config: TrainConfig, step: int) -> Prior:
    """The prior the training contexts of ``step`` (0-based) are drawn from: the prior of
    ``config``, or with a curriculum (``TrainConfig.alpha_start``) the tree of decay
    ``alpha_start + (alpha - alpha_start) min(1, step / (alpha_ramp steps))``."""
    if config.alpha_start is None:
        return build_prior(config)
    done = min(1.0, step / (config.alpha_ramp * config.steps))
    return TreePrior(config.depth, config.alpha_start + (config.alpha - config.alpha_start) * done)


def sample_training_batch(
    prior: Prior, config: TrainConfig, generator: torch.Generator
) -> tuple[TaskBatch, torch.Tensor | None, torch.Tensor | None]:
    """One step's data: ``(batch, x_query (B, Q, D), y_query (B, Q))`` on the CPU; with
    ``config.expected_loss``, ``(batch, None, None)`` (no query tokens are drawn)."""
    batch = sample_task(prior, config.batch, config.n_ctx, config.noise_std, generator)
    if config.expected_loss:
        return batch, None, None
    x_query, y_query = sample_queries(batch, config.queries, generator)
    return batch, x_query, y_query


def parameter_groups(model, config: TrainConfig) -> list[dict]:
    """Adam's parameter groups: one group, or with a warm-started router (:attr:`TrainConfig.warm_starts`)
    the router's parameters (``blocks.*``) with ``lr_scale = router_lr_scale`` and the rest
    with ``lr_scale = 1``. Each group's learning rate is ``lr_scale * lr_at(step)``."""
    named = list(model.named_parameters())
    if not config.warm_starts:
        return [{"params": [p for _, p in named], "lr_scale": 1.0}]
    router = [p for name, p in named if is_router_parameter(name)]
    rest = [p for name, p in named if not is_router_parameter(name)]
    return [{"params": router, "lr_scale": config.router_lr_scale}, {"params": rest, "lr_scale": 1.0}]


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group at ``group["lr_scale"] * lr`` (see :func:`parameter_groups`)."""
    for group in optimizer.param_groups:
        group["lr"] = group.get("lr_scale", 1.0) * lr


def training_step(model, optimizer, batch: TaskBatch, x_query, y_query, lr: float) -> float:
    """One Adam step on the query-token loss at learning rate ``lr`` (times each parameter
    group's ``lr_scale``); returns the loss. ``x_query = y_query = None`` (the data of
    :attr:`TrainConfig.expected_loss`) takes the expected loss, :func:`expected_query_loss`."""
    device = next(model.parameters()).device
    set_learning_rate(optimizer, lr)
    x, y = batch.x.to(device), batch.y.to(device)
    if x_query is None:
        loss = expected_query_loss(model.predict_theta, x, y, batch.x_query.to(device), batch.theta.to(device),
                                   batch.noise_std)
    else:
        loss = query_loss(model, x, y, x_query.to(device), y_query.to(device))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


def _eval_set_key(config: TrainConfig) -> tuple:
    """Configs with equal keys are evaluated on the very same contexts."""
    c = config
    return (c.prior, c.depth, c.alpha, c.n_ctx, c.noise_std, c.eval_contexts, c.effective_data_seed)


class _Run:
    """The mutable state of one training run (model, optimiser, RNG, history)."""

    def __init__(self, config: TrainConfig, out_dir: Path | None, resume: bool, eval_batches=None):
        """``eval_batches``: the run's evaluation set if already drawn (see :func:`_eval_set_key`).
        A run with ``out_dir`` holds its directory's lock until :meth:`close`."""
        self.config, self.out_dir = config, out_dir
        self.lock = RunLock(out_dir).acquire() if out_dir is not None else None  # before any work
        try:
            self._start(resume, eval_batches)
        except BaseException:
            self.close()
            raise

    def _start(self, resume: bool, eval_batches) -> None:
        config = self.config
        self.prior = build_prior(config)
        self.model = build_model(config).to(resolve_device(config.device))
        self.optimizer = torch.optim.Adam(parameter_groups(self.model, config), lr=config.lr)
        self.generator = make_generator(config.effective_data_seed)
        if eval_batches is None:
            eval_batches = _sample_eval_batches(
                self.prior,
                config.n_ctx,
                config.noise_std,
                config.eval_contexts,
                config.effective_data_seed + EVAL_SEED_OFFSET,
            )
        self.eval_batches = eval_batches
        self.step, self.history = 0, []
        self.saved_step: int | None = None  # the step of the checkpoint in out_dir
        self.scalars = {"loss_sum": 0.0, "loss_count": 0, "seconds": 0.0}
        restored = self._open_run_dir(resume) if self.out_dir is not None else False
        if config.warm_starts and not restored:
            self._warm_start()
        self.start_time = time.perf_counter() - self.scalars["seconds"]

    def _warm_start(self) -> None:
        """Fit model A's router to the greedy policy before step 0 (:mod:`fvlib.warm_start`)."""
        start = time.perf_counter()
        c = self.config
        warm_start_router(self.model, self.prior, c.n_ctx, c.noise_std, steps=c.router_warm_start, batch=c.batch,
                          generator=make_generator(c.effective_data_seed + WARM_START_SEED_OFFSET), lr=WARM_START_LR)
        self.scalars["seconds"] += time.perf_counter() - start

    def _open_run_dir(self, resume: bool) -> bool:
        """Reopen the (locked) run directory; ``True`` when a checkpoint was restored."""
        recover(self.out_dir)  # a checkpoint whose renames a kill cut short is completed first
        restored = (
            _try_resume(self.out_dir, self.config, self.model, self.optimizer, self.generator)
            if resume
            else None
        )
        if restored is None:
            start_over(self.out_dir)
            _write_config(self.out_dir, self.config, self.model)
            return False
        self.step, self.history, self.scalars = restored
        self.saved_step = self.step
        return True

    def close(self) -> None:
        """Release the run directory's lock (the run can still give its :meth:`result`)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def diverged(self, what: str) -> None:
        """Stop training: raise :class:`TrainingDiverged` saying what is not finite and what the
        run directory keeps."""
        c = self.config
        if self.out_dir is None:
            kept = "nothing was saved"
        elif self.saved_step is None:
            kept = f"{self.out_dir} holds no checkpoint yet"
        else:
            kept = f"{self.out_dir} keeps its checkpoint of step {self.saved_step}"
        raise TrainingDiverged(f"model {c.model} (seed {c.seed}) diverged at step {self.step}: {what}; {kept}; "
                               f"try a smaller learning rate than {c.lr:g}")

    def elapsed(self) -> float:
        return time.perf_counter() - self.start_time

    def train_step(self) -> None:
        prior = self.prior if self.config.alpha_start is None else training_prior(self.config, self.step)
        data = sample_training_batch(prior, self.config, self.generator)
        self.count_step(training_step(self.model, self.optimizer, *data, lr=lr_at(self.step, self.config)))

    def count_step(self, loss: float) -> None:
        """Book a finished step and its training loss (:meth:`diverged` if it is not finite)."""
        self.step += 1
        if not math.isfinite(loss):
            self.diverged(f"the training loss is {loss}")
        self.scalars["loss_sum"] += loss
        self.scalars["loss_count"] += 1

    def eval_due(self) -> bool:
        return self.step % self.config.eval_every == 0 or self.step == self.config.steps

    def checkpoint_due(self, stop: int) -> bool:
        return self.step % self.config.checkpoint_every == 0 or self.step == stop

    def record_eval(self, result: dict | None = None) -> dict:
        """Evaluate the model (or book ``result``, its evaluation computed elsewhere)."""
        result = _evaluate_batches(self.model, self.eval_batches) if result is None else result
        if not math.isfinite(result["excess_loss"]):
            self.diverged(f"the evaluation loss is {result['excess_loss']}")
        count = self.scalars["loss_count"]
        entry = {
            "step": self.step,
            "lr": lr_at(self.step, self.config),
            "train_loss": self.scalars["loss_sum"] / count if count else None,
            "eval_excess_loss": result["excess_loss"],
            "eval_stderr": result["stderr"],
            "eval_query_loss": result["query_loss"],
            "seconds": self.elapsed(),
        }
        self.history.append(entry)
        self.scalars["loss_sum"], self.scalars["loss_count"] = 0.0, 0
        return entry

    def checkpoint(self) -> None:
        """Save the run (only finite weights: :meth:`diverged` otherwise)."""
        if self.out_dir is not None:
            bad = [name for name, p in self.model.named_parameters() if not bool(torch.isfinite(p).all())]
            if bad:
                self.diverged(f"the weights {bad[:3]} are not finite")
            self.scalars["seconds"] = self.elapsed()
            _save_checkpoint(
                self.out_dir,
                self.step,
                self.model,
                self.optimizer,
                self.generator,
                self.history,
                self.scalars,
            )
            self.saved_step = self.step

    def result(self) -> TrainResult:
        """The outcome where training stopped (the model is put in eval mode)."""
        self.model.eval()
        return TrainResult(
            model=self.model,
            config=self.config,
            history=self.history,
            final_loss=self.final_loss(),
            seconds=self.elapsed(),
            checkpoint=str(self.out_dir / MODEL_FILE) if self.out_dir is not None else None,
        )

    def final_loss(self) -> float:
        if self.history[-1]["step"] == self.step:
            return self.history[-1]["eval_excess_loss"]
        return _evaluate_batches(self.model, self.eval_batches)["excess_loss"]  # stopped between evaluations


def progress_shown(progress: bool) -> bool:
    """``progress`` unless the environment sets ``TQDM_DISABLE=1`` (tqdm's own switch, which its
    notebook bar does not read): ``make book`` sets it, so static pages hold no frozen bars."""
    return bool(progress) and os.environ.get("TQDM_DISABLE", "").lower() not in ("1", "true", "yes")


def train(
    config: TrainConfig,
    out_dir: str | os.PathLike | None = None,
    resume: bool = True,
    progress: bool = True,
    *,
    until_step: int | None = None,
    callback: Callable[[dict], bool | None] | None = None,
    on_step: Callable[[int, torch.nn.Module], bool | None] | None = None,
) -> TrainResult:
    """Train ``config.model`` on fresh contexts and evaluate it on a fixed held-out set.

    Args:
        config: the run.
        out_dir: where checkpoints go (created if needed); ``None`` keeps everything in memory.
        resume: continue from a checkpoint in ``out_dir`` if there is one (same config
            required, except ``device`` and ``checkpoint_every``); ``False`` starts over.
        progress: show a tqdm progress bar (the notebook flavour inside Jupyter); the
            environment variable ``TQDM_DISABLE=1`` turns it off too.
        until_step: stop (with a checkpoint) after this step, as if interrupted; calling
            ``train`` again resumes. The schedule still runs to ``config.steps``.
        callback: called with each new history entry; returning ``True`` stops training
            there (with a checkpoint), e.g. once a target loss is reached.
        on_step: called after every step (after its evaluation, if one was due) with
            ``(step, model)``; returning ``True`` stops there, with a checkpoint, and a later
            call resumes with the same numbers. The model is in training mode; evaluating it
            (:func:`evaluate`) changes nothing of the run. The training explorer uses it to stop
            within a step and to show extra evaluations early in a run.

    Returns:
        :class:`TrainResult`; ``final_loss`` is the excess loss on the evaluation set at the
        step where training stopped.

    Raises:
        RunDirError: (a ``ValueError``) ``out_dir`` is not writable, holds another config's
            run, or a checkpoint that is corrupt or cannot be written (:mod:`fvlib.checkpoint`);
            the message names the file. While another process trains ``out_dir``, ``train``
            waits for it (saying so on stderr), then resumes or reloads the run.
        TrainingDiverged: (a ``ValueError``) a non-finite loss or weights; ``out_dir`` keeps
            its last checkpoint.
    """
    if not isinstance(config, TrainConfig):
        raise ValueError(f"config must be a TrainConfig, got {type(config).__name__}")
    stop = config.steps if until_step is None else until_step
    check_int("until_step", stop, 1, config.steps)
    run = _Run(config, Path(out_dir) if out_dir is not None else None, resume)
    try:
        _train_run(run, stop, progress, callback, on_step)
    finally:
        run.close()
    return run.result()


def _train_run(run: _Run, stop: int, progress: bool, callback, on_step=None) -> None:
    """The loop of :func:`train`: steps, evaluations and checkpoints up to step ``stop``."""
    config = run.config
    if not run.history:
        run.record_eval()
    run.model.train()
    bar = tqdm(
        total=config.steps, initial=run.step, disable=not progress_shown(progress), desc=f"model {config.model}" + ("" if config.arch == "constrained" else f" ({config.arch})"), leave=False
    )
    try:
        while run.step < stop:
            run.train_step()
            bar.update(1)
            stop_now = False
            if run.eval_due():
                entry = run.record_eval()
                bar.set_postfix(excess=f"{entry['eval_excess_loss']:.4f}")
                stop_now = bool(callback(entry)) if callback is not None else False
            if not stop_now and on_step is not None:
                stop_now = bool(on_step(run.step, run.model))
            if stop_now or run.checkpoint_due(stop):
                run.checkpoint()
            if stop_now:
                break
    finally:
        bar.close()


#: The theory baseline each model is measured against (chapter 8, *Experiments*).
MATCHING_BASELINE = {"A": "adaptive_greedy", "B": "nonadaptive_opt", "C": "lmmse"}


def theory_reference(config: TrainConfig, samples: int = 4000, seed: int = 0) -> dict:
    """The theory value a model of ``config`` should be compared with.

    Tree prior: model A against the adaptive greedy policy, B against optimised non-adaptive
    directions, C against LMMSE (Monte Carlo, finite-N statistics, ``samples`` contexts).
    Gaussian priors: the closed form of measuring the ``M`` largest-variance coordinates, the
    same for A, B and C (depth buys nothing). Returns ``{"name", "value", "stderr", "samples"}``.
    """
    prior = build_prior(config)
    tau2 = channel_tau2(prior, config.n_ctx, config.noise_std)
    if not isinstance(prior, TreePrior):
        value = gaussian_coordinate_loss(torch.diagonal(prior.second_moment()), config.budget, tau2)
        return {"name": "gaussian_closed_form", "value": value, "stderr": 0.0, "samples": 0}
    name = MATCHING_BASELINE[config.model]
    est = evaluate_strategies(
        prior, config.n_ctx, config.noise_std, config.budget, samples=samples, seed=seed, strategies=(name,)
    )[name]
    return {"name": name, "value": est.mean, "stderr": est.stderr, "samples": est.n}


def compare_with_theory(model: FVTransformer, config: TrainConfig, contexts: int = 4000, seed: int = 0) -> dict:
    """A trained model's excess loss next to its matching theory baseline, on ``contexts`` contexts.

    Returns ``{"model", "model_stderr", "theory", "theory_stderr", "theory_name", "ratio",
    "contexts"}`` where ``ratio = model / theory``.
    """
    prior = build_prior(config)
    measured = evaluate(model, prior, config.n_ctx, config.noise_std, contexts=contexts, seed=seed + EVAL_SEED_OFFSET)
    ref = theory_reference(config, samples=contexts, seed=seed)
    return {
        "model": measured["excess_loss"],
        "model_stderr": measured["stderr"],
        "theory": ref["value"],
        "theory_stderr": ref["stderr"],
        "theory_name": ref["name"],
        "ratio": measured["excess_loss"] / ref["value"] if ref["value"] > 0 else float("inf"),
        "contexts": contexts,
    }


#: Fields added after runs were stored, with the value that changes nothing: left out of
#: :func:`run_dir_for`'s name at that value, so the stored runs keep their directories.
_NEW_FIELDS = {"expected_loss": False, "alpha_start": None}
#: The values a config saved before those fields existed had (``alpha_ramp`` is unused there).
ADDED_FIELD_DEFAULTS = {**_NEW_FIELDS, "alpha_ramp": 0.6}

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
    ``$FVLIB_RUN_ROOT`` or ``./.fvlib_runs``. A ``data_seed`` of ``None`` is left out of the
    name, so runs named before that field existed keep their directories; so is a ``warmup`` of 0,
    an ``expected_loss`` of ``False``, an ``alpha_start`` of ``None`` (with ``alpha_ramp``, unused
    then), and so are ``router_warm_start`` and ``router_lr_scale`` when the run does not warm-start
    (:attr:`TrainConfig.warm_starts`: they change nothing then).
    """
    root = run_root(root)
    fields_that_matter = {
        k: v
        for k, v in config.to_dict().items()
        if k not in RESUMABLE_FIELDS and not (k == "data_seed" and v is None) and not (k == "warmup" and v == 0)
        and not (k in ("router_warm_start", "router_lr_scale") and not config.warm_starts)
        and not (k in _NEW_FIELDS and v == _NEW_FIELDS[k])
        and not (k == "alpha_ramp" and config.alpha_start is None)
    }
    if config.arch == "constrained":  # the names runs had before ``arch`` existed
        del fields_that_matter["arch"]
    digest = hashlib.sha256(json.dumps(fields_that_matter, sort_keys=True).encode()).hexdigest()[:10]
    prefix = "" if config.arch == "constrained" else f"{config.arch}-"
    name = f"{prefix}{config.model}-{config.prior}-K{config.depth}-M{config.budget}-N{config.n_ctx}-s{config.steps}-{digest}"
    return root / name
