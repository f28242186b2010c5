"""The check of the channel noise ``tau^2`` (chapter 2)."""

from __future__ import annotations

import math
from collections.abc import Callable

from .._checks import check_number
from ..priors import GaussianPrior, Prior, TreePrior
from ..theory import channel_tau2
from .engine import (
    Case,
    Check,
    CheckResult,
    Misconception,
    absolute_difference,
    call_on,
    fmt,
    read_scalar,
    require_callable,
    run_check,
)

__all__ = ["check_channel_tau2"]


_TAU2_CASES = (
    ("tree", 6, 0.5, 128, 0.0),
    ("tree", 3, 0.7, 32, 0.5),
    ("gaussian", 5, 2.0, 50, 1.0),
    ("tree", 4, 1.0, 16, 2.0),
)


def _tau2_prior(kind, a, b) -> Prior:
    return TreePrior(a, b) if kind == "tree" else GaussianPrior.isotropic(a, b)


def _tau2_cases(options):
    for kind, a, b, n, sigma in _TAU2_CASES:
        prior = _tau2_prior(kind, a, b)
        yield Case(prior=prior, n_ctx=n, noise_std=sigma, rtol=options.rtol, args=(prior, n, sigma),
                   what=f"prior={prior!r}, n_ctx={n}, noise_std={sigma}")


_TAU2_MISCONCEPTIONS = (
    Misconception("sigma", lambda c, e: (c.prior.energy + c.noise_std) / c.n_ctx,
                  "the label noise enters as its variance sigma^2, not sigma"),
    Misconception("no_sigma", lambda c, e: c.prior.energy / c.n_ctx,
                  "add the label noise: tau^2 = (E|theta|^2 + sigma^2) / N"),
    Misconception("dimension", lambda c, e: (c.prior.dim + c.noise_std**2) / c.n_ctx,
                  "use the prior's energy E|theta|^2 (prior.energy), not the dimension D"),
    Misconception("tau", lambda c, e: math.sqrt(e),
                  "you returned tau, a standard deviation; the check wants the variance tau^2"),
    Misconception("n_squared", lambda c, e: (c.prior.energy + c.noise_std**2) / c.n_ctx**2,
                  "divide by N once: averaging N tokens divides the variance by N"),
    Misconception("sqrt_n", lambda c, e: (c.prior.energy + c.noise_std**2) / math.sqrt(c.n_ctx),
                  "divide by N, not sqrt(N): the variance of an average of N terms is 1/N of theirs"),
    Misconception("no_n", lambda c, e: c.prior.energy + c.noise_std**2,
                  "the average over N tokens divides the variance by N"),
)

_TAU2 = Check(
    name="check_channel_tau2",
    cases=_tau2_cases,
    answer=lambda student, c: read_scalar(call_on(student, c), "tau2"),
    reference=lambda c: channel_tau2(c.prior, c.n_ctx, c.noise_std),
    error=absolute_difference,
    passes=lambda c, yours, expected, error: error <= c.rtol * abs(expected) + 1e-12,
    same=lambda c, yours, wrong: abs(yours - wrong) <= 1e-6 * abs(wrong) + 1e-12,
    misconceptions=_TAU2_MISCONCEPTIONS,
    fallback_hint="tau^2 = (E|theta|^2 + sigma^2) / N, see chapter 2 (what one pooled average knows)",
    mismatch=lambda c, yours, expected: f"for {c.what} your tau2 is {fmt(yours)}, expected {fmt(expected)}",
    summary=lambda o, progress: f"tau2 agrees with (E|theta|^2 + sigma^2) / N on {progress.cases} priors",
    details=lambda o: {"rtol": o.rtol},
)


def check_channel_tau2(student_fn: Callable, *, rtol: float = 1e-6) -> CheckResult:
    """Check ``student_fn(prior, n_ctx, noise_std) -> tau2``, the channel noise *variance*.

    Reference: :func:`fvlib.theory.closed_forms.channel_tau2`,
    ``tau^2 = (E|theta|^2 + sigma^2) / N`` (``prior.energy`` is ``E|theta|^2``). Cases: tree
    priors of depth 3-6 with ``alpha`` in {0.5, 0.7, 1} and an isotropic Gaussian, ``N`` from 16
    to 128, ``sigma`` from 0 to 2. Recognised mistakes: ``sigma`` instead of ``sigma^2``,
    forgetting ``sigma``, ``D`` instead of ``E|theta|^2``, returning ``tau`` (a standard
    deviation), dividing by ``N^2`` or ``sqrt(N)``.
    """
    require_callable("check_channel_tau2", student_fn, "fn(prior, n_ctx, noise_std) -> tau2")
    check_number("rtol", rtol, 0)
    return run_check(_TAU2, student_fn, rtol=rtol)

