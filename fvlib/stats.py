"""The two statistics every loss in fvlib is built from: the squared error of an estimate and
the Monte Carlo mean with its standard error; and the relative gap between two such means.

Every loss in the book is the excess loss ``E|theta_hat - theta|^2`` (see the book's appendix
*Conventions*, section "The task and the loss"), estimated by averaging
:func:`squared_error` over seeded contexts; :func:`mean_and_stderr` gives the average and its
standard error. The theory strategies, the training evaluation and the patching sweeps all
use these two. :func:`relative_gap` compares two estimates (chapter 3: the finite-``N``
statistic against the Gaussian channel), with the standard error of the ratio.
"""

from __future__ import annotations

import math

import torch

__all__ = ["squared_error", "mean_and_stderr", "relative_gap"]


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
