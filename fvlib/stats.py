"""The two statistics every loss in fvlib is built from: the squared error of an estimate and
the Monte Carlo mean with its standard error; and the relative gap between two such means.

Every loss in the book is the excess loss ``E|theta_hat - theta|^2`` (see the book's appendix
*Conventions*, section "The task and the loss"), estimated by averaging
:func:`squared_error` over seeded contexts; :func:`mean_and_stderr` gives the average and its
standard error. The theory strategies, the training evaluation and the patching sweeps all
use these two. :func:`relative_gap` compares two estimates (chapter 3: the finite-``N``
statistic against the Gaussian channel), with the standard error of the ratio;
:func:`independent_ratio` divides two independent estimates and :func:`paired_ratio` two
per-context losses on the same contexts (a model against a baseline, chapter 8), counting
their correlation. :func:`seed_mean` averages the final losses of runs trained at several
seeds (chapter 8, the stored experiments).
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["independent_ratio", "mean_and_stderr", "paired_ratio", "relative_gap", "seed_mean", "seed_mean_stderr",
           "side_of", "squared_error"]


def squared_error(theta_hat: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Per-context ``|theta_hat - theta|^2``: ``(..., D)`` and ``(..., D)`` -> ``(...)``.

    Computed in the inputs' dtype; cast them first for another precision.
    """
    return ((theta_hat - theta) ** 2).sum(-1)


def mean_and_stderr(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard error (sample standard deviation / ``sqrt(n)``) over the last
    dimension of ``values (..., n)``; both of shape ``(...)``. The standard error is ``NaN``
    when ``n < 2``."""
    n = values.shape[-1]
    if n < 2:
        return values.mean(-1), torch.full(values.shape[:-1], float("nan"), dtype=values.dtype)
    return values.mean(-1), values.std(-1) / math.sqrt(n)


def relative_gap(finite, gaussian) -> tuple[float, float]:
    """``(finite - gaussian) / gaussian`` for two Monte Carlo estimates, with its standard error.

    Args:
        finite, gaussian: objects with ``.mean`` and ``.stderr`` (e.g.
            :class:`fvlib.theory.strategies.Estimate`) computed on independent noise.
    Returns:
        ``(gap, stderr)``; the standard error is the first-order (delta method) one,
        ``|f/g| * sqrt((se_f/f)^2 + (se_g/g)^2)``.
    """
    f, g = float(finite.mean), float(gaussian.mean)
    if g == 0:
        raise ValueError("the Gaussian-channel loss is 0; the relative gap is undefined")
    gap = (f - g) / g
    rel_f = finite.stderr / f if f != 0 else 0.0
    rel_g = gaussian.stderr / g
    return gap, abs(f / g) * math.hypot(rel_f, rel_g)


def independent_ratio(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """``a / b`` of two independent estimates ``(mean, stderr)``, with the delta-method standard
    error ``|a/b| sqrt((se_a/a)^2 + (se_b/b)^2)`` (estimates on different contexts; on the same
    contexts use :func:`paired_ratio`)."""
    (x, sx), (y, sy) = a, b
    if y == 0 or x == 0:
        raise ValueError(f"independent_ratio needs two nonzero means, got {x!r} and {y!r}")
    return x / y, abs(x / y) * math.hypot(sx / x, sy / y)


def seed_mean_stderr(losses, stderrs) -> float:
    """The standard error of a mean over seeds that counts both the seeds' spread and each loss's
    Monte Carlo error: ``sqrt(spread^2 / S + mc^2)``, with ``spread`` the standard deviation over
    the ``S`` seeds (``ddof=1``) and ``mc`` the Monte Carlo standard error of the mean
    (:func:`seed_mean`). ``losses``, ``stderrs``: ``(S,)``. With one seed only ``mc`` counts."""
    losses, stderrs = np.asarray(losses, dtype=float), np.asarray(stderrs, dtype=float)
    if losses.ndim != 1:
        raise ValueError(f"seed_mean_stderr needs losses of shape (S,), got {losses.shape}")
    _, mc, spread = seed_mean(losses, stderrs)
    return float(math.hypot(spread / math.sqrt(losses.shape[0]), mc))


def side_of(value: float, stderr: float, threshold: float, stderrs: float = 2.0) -> int:
    """Where ``value`` lies against ``threshold`` given its standard error: ``-1`` below it by
    more than ``stderrs`` standard errors, ``+1`` above it by more, ``0`` within (no claim either
    way)."""
    if not (math.isfinite(value) and math.isfinite(stderr) and stderr >= 0):
        raise ValueError(f"side_of needs a finite value and stderr >= 0, got {value!r} and {stderr!r}")
    if value < threshold - stderrs * stderr:
        return -1
    if value > threshold + stderrs * stderr:
        return 1
    return 0


def paired_ratio(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """``mean(a) / mean(b)`` of two per-context losses ``(n,)`` on the same contexts, and its
    standard error by the delta method, which counts their correlation:
    ``var(a - R b) / (n mean(b)^2)`` with ``R`` the ratio."""
    a, b = a.double().flatten(), b.double().flatten()
    if a.shape != b.shape or a.numel() < 2:
        raise ValueError("paired_ratio needs two losses on the same n >= 2 contexts, "
                         f"got {tuple(a.shape)} and {tuple(b.shape)}")
    ratio = float(a.mean() / b.mean())
    residual = a - ratio * b
    return ratio, float(residual.std() / (math.sqrt(a.numel()) * b.mean()))


def seed_mean(losses, stderrs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mean over seeds of losses with Monte Carlo standard errors: ``(mean, stderr, spread)``.

    ``losses`` and ``stderrs``: ``(S, ...)`` arrays, one row per seed (each seed's loss and the
    Monte Carlo standard error of it). Returns three ``(...)`` arrays: the mean over the ``S``
    seeds, the Monte Carlo standard error of that mean ``sqrt(sum_s se_s^2) / S``, and the
    spread, the standard deviation over seeds (``ddof=1``; zeros for one seed).

    Raises:
        ValueError: ``losses`` with no seed, or ``stderrs`` of another shape.
    """
    losses, stderrs = np.asarray(losses, dtype=float), np.asarray(stderrs, dtype=float)
    if losses.ndim == 0 or losses.shape[0] == 0 or stderrs.shape != losses.shape:
        raise ValueError(f"seed_mean needs losses and stderrs of one shape (S, ...) with S >= 1, got "
                         f"{losses.shape} and {stderrs.shape}")
    n = losses.shape[0]
    spread = losses.std(axis=0, ddof=1) if n > 1 else np.zeros(losses.shape[1:])
    return losses.mean(axis=0), np.sqrt((stderrs**2).sum(axis=0)) / n, spread
