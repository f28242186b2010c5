"""The two statistics every loss in fvlib is built from: the squared error of an estimate and
the Monte Carlo mean with its standard error.

Every loss in the book is the excess loss ``E|theta_hat - theta|^2`` (see the book's appendix
*Conventions*, section "The task and the loss"), estimated by averaging
:func:`squared_error` over seeded contexts; :func:`mean_and_stderr` gives the average and its
standard error. The theory strategies, the training evaluation and the patching sweeps all
use these two.
"""

from __future__ import annotations

import math

import torch

__all__ = ["squared_error", "mean_and_stderr"]


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
