"""Evaluating a model on a fixed set of contexts (chapter 8, *Experiments*); a model beside the
theory on the same contexts is :mod:`fvlib.experiments.beside_theory`.

The one per-context error of the book's training: :func:`theta_losses` scores a ``theta_hat``
(the excess loss ``|theta_hat - theta|^2`` and the query loss ``(<theta_hat, x_q> - y_q)^2``);
the single loop (:func:`per_context_losses`) and the batched one
(:func:`fvlib.training.batched.train_many`, a stack of ``theta_hat``) both use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from .._checks import check_int
from ..models import FVTransformer
from ..priors import Prior
from ..stats import mean_and_stderr, squared_error
from ..task import StatisticBatch, TaskBatch, make_generator, sample_statistic_task, sample_task
from .config import EVAL_SEED_OFFSET, TrainConfig, build_prior

__all__ = [
    "sample_eval_batches",
    "run_eval_batches",
    "eval_set_key",
    "theta_losses",
    "per_context_losses",
    "eval_summary",
    "evaluate",
    "model_predictor",
    "per_context_errors",
]

def sample_eval_batches(prior, n_ctx, noise_std, contexts, seed, chunk=512, *,
                        statistic: bool = False) -> list[TaskBatch] | list[StatisticBatch]:
    """``contexts`` contexts drawn with ``seed``, in batches of at most ``chunk``: an evaluation
    set (a run's is drawn with ``effective_data_seed + EVAL_SEED_OFFSET``). With ``statistic``
    the contexts are drawn as their pooled statistics (:func:`fvlib.task.sample_statistic_task`),
    for the runs that train on them (:attr:`~fvlib.training.config.TrainConfig.inputs`)."""
    generator = make_generator(seed)
    sample = sample_statistic_task if statistic else sample_task
    sizes = [min(chunk, contexts - start) for start in range(0, contexts, chunk)]
    return [sample(prior, size, n_ctx, noise_std, generator) for size in sizes]



def run_eval_batches(config: TrainConfig) -> list[TaskBatch] | list[StatisticBatch]:
    """The evaluation set of the run of ``config`` (the one its history was evaluated on):
    ``eval_contexts`` contexts of its prior, drawn with ``effective_data_seed +
    EVAL_SEED_OFFSET``, as tokens or as statistics as the run reads them."""
    return sample_eval_batches(build_prior(config), config.n_ctx, config.noise_std, config.eval_contexts,
                               config.effective_data_seed + EVAL_SEED_OFFSET, statistic=config.statistic)

@torch.no_grad()
def evaluate_batches(model, batches: list[TaskBatch]) -> dict:
    """:func:`eval_summary` of ``model`` on ``batches``."""
    return eval_summary(*per_context_losses(model, batches))


def theta_losses(theta_hat: torch.Tensor, batch: TaskBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-context excess loss ``|theta_hat - theta|^2`` and query loss
    ``(<theta_hat, x_q> - y_q)^2`` of ``theta_hat`` (``(..., B, D)``: one model's, or a stack of
    ``k`` models' ``(k, B, D)``) on ``batch``; ``(..., B)`` float64 each, on the CPU."""
    excess = squared_error(theta_hat, batch.theta).double().cpu()
    y_hat = (theta_hat * batch.x_query).sum(-1)
    return excess, ((y_hat - batch.y_query) ** 2).double().cpu()


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
            context_excess, context_query = theta_losses(model.predict_theta(batch), batch)
        else:  # a prediction that need not be linear in x_q: against the noise-free target
            y_hat = model(batch)
            context_excess = ((y_hat - (batch.theta * batch.x_query).sum(-1)) ** 2).double().cpu()
            context_query = ((y_hat - batch.y_query) ** 2).double().cpu()
        excess.append(context_excess)
        query.append(context_query)
    model.train(was_training)
    return torch.cat(excess), torch.cat(query)


def model_predictor(model) -> Callable[[TaskBatch], torch.Tensor]:
    """A constrained model's ``predict_theta`` as a predictor (the signature of
    :mod:`fvlib.theory.predictors`): the batch moved to the model's device, no gradients."""
    if not isinstance(model, FVTransformer):
        raise ValueError(f"model_predictor needs a model that predicts theta_hat (FVTransformer), got "
                         f"{type(model).__name__}")
    device = next(model.parameters()).device

    @torch.no_grad()
    def predict(batch: TaskBatch) -> torch.Tensor:
        return model.predict_theta(batch.to(device))

    return predict


def per_context_errors(predictors: Mapping[str, Callable[[TaskBatch], torch.Tensor]],
                       batches: Sequence[TaskBatch]) -> dict[str, torch.Tensor]:
    """Every predictor's squared error ``|theta_hat - theta|^2`` on every context of ``batches``:
    ``{name: (n,) float64}`` on the CPU, the same contexts in the same order for all, so that any
    two compare paired (:func:`fvlib.stats.paired_ratio`). A predictor maps a batch to
    ``theta_hat (B, D)``: a model's (:func:`model_predictor`) or a theory strategy's
    (:mod:`fvlib.theory.predictors`); the error is taken in the predictor's dtype."""
    if not predictors:
        raise ValueError("per_context_errors needs at least one predictor")
    errors = {}
    for name, predict in predictors.items():
        parts = []
        for batch in batches:
            theta_hat = predict(batch)
            parts.append(squared_error(theta_hat, batch.theta.to(theta_hat.device, theta_hat.dtype)).double().cpu())
        errors[name] = torch.cat(parts)
    return errors


def eval_summary(excess_all: torch.Tensor, query_all: torch.Tensor) -> dict:
    """An evaluation's numbers from the per-context excess and query losses ``(n,)`` each."""
    excess_loss, stderr = mean_and_stderr(excess_all)
    return {
        "excess_loss": float(excess_loss),
        "stderr": float(stderr),
        "query_loss": float(query_all.mean()),
        "contexts": excess_all.numel(),
    }


def evaluate(
    model: FVTransformer, prior: Prior, n_ctx: int, noise_std: float, contexts: int = 4000, seed: int = 0, *,
    statistic: bool = False,
) -> dict:
    """Excess and query loss of ``model`` on ``contexts`` fresh contexts drawn with ``seed``.

    For a :class:`~fvlib.transformer.StandardTransformer` (no ``theta_hat``) the excess loss
    is ``E(y_hat_q - <theta, x_q>)^2`` over the contexts' query tokens, which equals
    ``E|theta_hat - theta|^2`` for a prediction linear in ``x_q``. ``statistic``: draw the contexts
    as their pooled statistics (a model that reads only them, as its run's evaluation set does
    when it trained on them; :attr:`~fvlib.training.config.TrainConfig.inputs`).

    Returns:
        dict with ``excess_loss`` (``E|theta_hat - theta|^2``), ``stderr`` (its standard
        error), ``query_loss`` (``E(y_hat_q - y_q)^2``, about ``noise_std^2 + excess_loss``)
        and ``contexts``.
    """
    check_int("contexts", contexts, 1)
    return evaluate_batches(model, sample_eval_batches(prior, n_ctx, noise_std, contexts, seed, statistic=statistic))


def eval_set_key(config: TrainConfig) -> tuple:
    """Configs with equal keys are evaluated on the very same contexts (their runs can share one
    evaluation set)."""
    c = config
    return (c.prior, c.depth, c.alpha, c.n_ctx, c.noise_std, c.eval_contexts, c.effective_data_seed, c.input_path)
