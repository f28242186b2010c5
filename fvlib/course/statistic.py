"""The check of the pooled statistic ``g_hat = (1/N) sum_i y_i x_i``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._checks import check_number
from ..priors import GaussianPrior, TreePrior
from ..task import make_generator, sample_task
from .engine import (
    Case,
    Check,
    CheckResult,
    Misconception,
    call_on,
    close,
    fmt,
    largest_difference,
    read_tensor,
    require_callable,
    run_check,
    worst,
)

__all__ = ["check_sufficient_statistic"]


def _statistic_cases(options):
    gen = make_generator(options.seed)
    for prior, B, N in ((TreePrior(3, 0.5), 6, 20), (TreePrior(4, 0.7), 5, 9), (GaussianPrior.isotropic(5), 4, 33)):
        task = sample_task(prior, B, N, 0.3, gen, dtype=torch.float64)
        yield Case(prior=prior, batch=B, n_ctx=N, task=task, atol=options.atol, args=(task.x.clone(), task.y.clone()),
                   what=f"x of shape {tuple(task.x.shape)}, y of shape {tuple(task.y.shape)}")


def _statistic_mismatch(c, yours, expected) -> str:
    index, _ = worst(yours, expected)
    b, d = index
    return (f"g_hat of context {b} differs at coordinate {d} (yours {fmt(float(yours[index]))}, "
            f"expected {fmt(float(expected[index]))}) for {c.what}")


_STATISTIC = Check(
    name="check_sufficient_statistic",
    cases=_statistic_cases,
    answer=lambda student, c: read_tensor(call_on(student, c), "g_hat", (c.batch, c.prior.dim), "(B, D)"),
    reference=lambda c: c.task.sufficient_statistic(),
    error=largest_difference,
    passes=lambda c, yours, expected, error: error <= c.atol,
    same=lambda c, yours, wrong: close(yours, wrong, c.atol * max(1.0, c.n_ctx)),
    misconceptions=(
        Misconception("sum", lambda c, e: e * c.n_ctx,
                      "divide the sum over tokens by N (a mean, as attention with uniform weights pools)"),
        Misconception("over_d", lambda c, e: e / c.prior.dim,
                      "average over the N tokens only, not over the D coordinates"),
    ),
    fallback_hint="g_hat[b] = (1/N) * sum_i y[b, i] * x[b, i, :], e.g. torch.einsum('bn,bnd->bd', y, x) / N",
    mismatch=_statistic_mismatch,
    summary=lambda o, progress: f"g_hat = (1/N) sum_i y_i x_i on {progress.cases} batches",
    details=lambda o: {"atol": o.atol},
)


def check_sufficient_statistic(student_fn: Callable, *, seed: int = 0, atol: float = 1e-5) -> CheckResult:
    """Check ``student_fn(x, y) -> g_hat``: ``x (B, N, D)``, ``y (B, N)`` -> ``(B, D)``.

    Reference: ``g_hat = (1/N) sum_i y_i x_i`` (:meth:`fvlib.task.TaskBatch.sufficient_statistic`),
    on three seeded batches from tree and Gaussian priors (float64). Recognised mistakes: a sum
    instead of a mean, averaging over the wrong axis, dividing by ``D``.
    """
    require_callable("check_sufficient_statistic", student_fn, "fn(x, y) -> g_hat")
    check_number("atol", atol, 0)
    return run_check(_STATISTIC, student_fn, seed=seed, atol=atol)

