"""The check of the Gaussian posterior (mean and covariance) after linear measurements."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .._checks import check_int, check_number
from ..priors import GaussianPrior, TreePrior
from ..task import make_generator
from ..theory import gaussian_posterior
from .engine import (
    Case,
    Check,
    CheckResult,
    Fail,
    Misconception,
    call_on,
    close,
    describe,
    fmt,
    largest_difference,
    read_tensor,
    require_callable,
    run_check,
    worst,
)

__all__ = ["check_gaussian_posterior"]


_COV, _MEAN = "posterior covariance", "posterior mean"


def _gaussian_settings(gen: torch.Generator):
    """``(label, cov (D, D), W (M, D), tau2)`` of each case, drawn lazily from ``gen``."""
    def random_cov(d):
        a = torch.randn(d, d, generator=gen, dtype=torch.float64)
        return a @ a.T / d + 0.1 * torch.eye(d, dtype=torch.float64)

    tree = TreePrior(3, 0.5)
    coords = torch.eye(tree.dim, dtype=torch.float64)[:3]
    yield "the Gaussian twin of TreePrior(3, 0.5), 3 coordinates", tree.second_moment(), coords, 0.05
    yield ("a random 4 x 4 covariance, 2 random directions", random_cov(4),
           torch.randn(2, 4, generator=gen, dtype=torch.float64), 0.3)
    yield ("a random 5 x 5 covariance, 5 random directions", random_cov(5),
           torch.randn(5, 5, generator=gen, dtype=torch.float64), 0.1)


def _gaussian_cases(options):
    gen = make_generator(options.seed)
    for label, cov, W, tau2 in _gaussian_settings(gen):
        theta = GaussianPrior(cov).sample(options.batch, gen)
        phi = theta @ W.T + math.sqrt(tau2) * torch.randn(options.batch, W.shape[0], generator=gen, dtype=torch.float64)
        yield Case(label=label, cov=cov, W=W, phi=phi, tau2=tau2, batch=options.batch, atol=options.atol,
                   args=(cov.clone(), W.clone(), phi.clone(), tau2),
                   what=f"{label} (cov {tuple(cov.shape)}, W {tuple(W.shape)}, phi {tuple(phi.shape)}, tau2={tau2})")


def _read_gaussian(student, c) -> dict:
    raw = call_on(student, c)
    if not (isinstance(raw, (tuple, list)) and len(raw) == 2):
        raise Fail(
            f"your function returned {describe(raw)}; expected a pair (mean (B, D), cov (D, D))",
            "end with `return mean, post_cov`",
        )
    D = c.cov.shape[0]
    mean = read_tensor(raw[0], _MEAN, (c.batch, D), "(B, D)")
    return {_COV: read_tensor(raw[1], _COV, (D, D), "(D, D)"), _MEAN: mean}


def _gaussian_reference(c) -> dict:
    mean, cov = gaussian_posterior(c.cov, c.W, c.phi, c.tau2)
    return {_COV: cov, _MEAN: mean}


def _of_part(part: str, answer: Callable) -> Callable:
    """A misconception about one part of the answer only (``None`` for the other)."""
    return lambda c, e: answer(c, e) if c.part == part else None


def _gaussian_with_tau(c, expected):
    mean, cov = gaussian_posterior(c.cov, c.W, c.phi, math.sqrt(c.tau2))
    return cov if c.part == _COV else mean


_GAUSSIAN_MISCONCEPTIONS = (
    Misconception("tau_not_tau2", _gaussian_with_tau,
                  "the noise covariance is tau2 * I (tau2 is already a variance): use tau2, not sqrt(tau2)"),
    Misconception("prior_cov", _of_part(_COV, lambda c, e: c.cov),
                  "the posterior covariance is smaller than the prior's: C - C W^T (W C W^T + tau2 I)^-1 W C"),
    Misconception("sign", _of_part(_COV, lambda c, e: c.cov + (c.cov - e)),
                  "subtract the update: C - C W^T S^-1 W C, not plus"),
    Misconception("no_prior", _of_part(_MEAN, lambda c, e: c.phi @ torch.linalg.pinv(c.W).T),
                  "that is least squares (pseudo-inverse of W) without the prior; the posterior mean "
                  "shrinks toward 0: C W^T (W C W^T + tau2 I)^-1 phi"),
    Misconception("prior_mean", _of_part(_MEAN, lambda c, e: torch.zeros_like(e)),
                  "the posterior mean is not 0: the data phi move it, C W^T (W C W^T + tau2 I)^-1 phi"),
)


def _gaussian_mismatch(c, yours, expected) -> str:
    index, _ = worst(yours, expected)
    where = f"entry {index}" if c.part == _COV else f"context {index[0]}, coordinate {index[1]}"
    return (f"your {c.part} differs at {where} (yours {fmt(float(yours[index]))}, "
            f"expected {fmt(float(expected[index]))}) for {c.label}")


_GAUSSIAN = Check(
    name="check_gaussian_posterior",
    cases=_gaussian_cases,
    answer=_read_gaussian,
    reference=_gaussian_reference,
    parts=(_COV, _MEAN),
    error=largest_difference,
    passes=lambda c, yours, expected, error: error <= c.atol + 1e-9 * float(expected.abs().max()),
    same=lambda c, yours, wrong: close(yours, wrong, 1e-6, 1e-6),
    misconceptions=_GAUSSIAN_MISCONCEPTIONS,
    fallback_hint=("posterior covariance C - C W^T S^-1 W C and mean C W^T S^-1 phi with S = W C W^T + tau2 I "
                   "(chapter 5); use torch.linalg.solve rather than inverting C"),
    mismatch=_gaussian_mismatch,
    summary=lambda o, progress: f"mean and covariance match the Gaussian posterior on {progress.cases} cases",
    details=lambda o: {"atol": o.atol},
)


def check_gaussian_posterior(student_fn: Callable, *, seed: int = 0, batch: int = 8, atol: float = 1e-6) -> CheckResult:
    """Check ``student_fn(cov, W, phi, tau2) -> (mean, post_cov)`` for a Gaussian prior.

    ``theta ~ N(0, cov)`` with ``cov (D, D)``; measurements ``phi = W theta + xi``,
    ``W (M, D)``, ``xi ~ N(0, tau2 I_M)``; ``phi (B, M)``. The function returns the posterior
    mean ``(B, D)`` and the posterior covariance ``(D, D)`` (the same for every context).
    Reference: :func:`fvlib.theory.closed_forms.gaussian_posterior`. Three cases: the Gaussian twin of a
    depth-3 tree measured on 3 coordinates, and random covariances with random directions.
    Recognised mistakes: least squares without the prior, ``tau`` instead of ``tau2``,
    returning the prior covariance, a sign error in the covariance update.
    """
    require_callable("check_gaussian_posterior", student_fn, "fn(cov, W, phi, tau2) -> (mean, cov)")
    check_int("batch", batch, 1)
    check_number("atol", atol, 0)
    return run_check(_GAUSSIAN, student_fn, seed=seed, batch=batch, atol=atol)

