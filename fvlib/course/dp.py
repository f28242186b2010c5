"""The check of the Bellman (DP) optimal risk over coordinate actions (chapter 4)."""

from __future__ import annotations

import math
from collections.abc import Callable

from .._checks import check_int, check_number
from ..priors import TreePrior
from ..theory import dp_value, policy_value
from .engine import (
    Case,
    Check,
    CheckResult,
    Misconception,
    absolute_difference,
    call_on,
    describe,
    fmt,
    read_scalar,
    run_check,
)

__all__ = ["check_dp_value", "DP_CASES"]


#: Default DP cases ``(depth, alpha, n_layers, tau)``: greedy is 10% worse at tau 0.6, four
#: times worse at tau 0.1, 13% worse on the depth-2 tree; L = 1 is a sanity case.
DP_CASES = ((3, 0.5, 2, 0.6), (3, 0.5, 2, 0.1), (2, 0.5, 2, 0.5), (3, 0.5, 1, 0.6))


def _dp_cases(options):
    for K, a, L, t in options.cases:
        tree = TreePrior(K, a)
        rule = {"quad_points": 48, "rule": "hermite"} if L <= 2 else {"quad_points": 64, "rule": "grid"}
        yield Case(tree=tree, n_layers=L, tau=t, rule=rule, rtol=options.rtol, atol=options.atol,
                   args=(tree, L, t), what=f"{tree!r}, n_layers={L}, tau={t}")


def _dp_tolerance(c, expected: float) -> float:
    return max(c.rtol * expected, c.atol)


def _policy_risk(c, policy: str, layers: int) -> float | None:
    """The risk of ``policy`` with ``layers`` measurements (the prior risk with none)."""
    if not 1 <= layers <= c.tree.dim:
        return c.tree.energy if layers == 0 else None
    return policy_value(c.tree, layers, c.tau, policy, **c.rule)


_DP_MISCONCEPTIONS = (
    Misconception("greedy", lambda c, e: _policy_risk(c, "greedy", c.n_layers),
                  "that is the greedy policy's risk; the DP minimises over *every* node at every step, including "
                  "off-path nodes (whose 0 outcome is informative) and measuring the same node again"),
    Misconception("nonadaptive", lambda c, e: _policy_risk(c, "nonadaptive", c.n_layers),
                  "that is the non-adaptive policy (the first nodes in heap order); let the next action depend on the "
                  "belief after each observation"),
    Misconception("no_measurement", lambda c, e: c.tree.energy,
                  "that is the prior risk E|theta|^2: the measurements are not used"),
    Misconception("one_layer_less", lambda c, e: _policy_risk(c, "optimal", c.n_layers - 1),
                  lambda c: f"a layer off by one: the recursion runs over {c.n_layers} measurements "
                  "(V_L at the end is the posterior variance, with no measurement left)"),
    Misconception("one_layer_more",
                  lambda c, e: _policy_risk(c, "optimal", c.n_layers + 1) if c.n_layers + 1 <= 2 else None,
                  lambda c: (f"a layer off by one: the recursion runs over {c.n_layers} measurements, "
                             f"not {c.n_layers + 1}")),
    Misconception("tau2_as_tau", lambda c, e: dp_value(c.tree, c.n_layers, c.tau * c.tau, **c.rule),
                  "tau is the noise standard deviation here; the likelihood variance is tau^2"),
    Misconception("sqrt_tau", lambda c, e: dp_value(c.tree, c.n_layers, math.sqrt(c.tau), **c.rule),
                  "tau is the noise standard deviation; the likelihood variance is tau^2, not tau"),
)


def _dp_fallback_hint(c, yours: float, expected: float) -> str:
    if yours < expected:
        return ("your value is below the optimum, which no policy can reach: check that the quadrature weights "
                "of each observation integral sum to 1 and that phi is integrated over the mixture of the "
                "-c/0/+c centres, weighted by the current belief")
    return ("V_L(b) is the posterior variance; V_l(b) = min_a E[V_(l+1)(b') | b, a], with the expectation "
            "over phi ~ mixture of N(theta_j[a], tau^2) under the belief b (chapter 4); use enough "
            "quadrature points (the posterior is a steep logistic in phi)")


def _dp_mismatch(c, yours: float, expected: float) -> str:
    greedy = policy_value(c.tree, c.n_layers, c.tau, "greedy", **c.rule)
    return (f"for {c.what} your value is {fmt(yours)}, the optimal risk is {fmt(expected)} (greedy {fmt(greedy)}; "
            f"tolerance {fmt(_dp_tolerance(c, expected))})")


def _dp_answer(student, c) -> float:
    return read_scalar(call_on(student, c) if callable(student) else student, "DP value")


_DP = Check(
    name="check_dp_value",
    cases=_dp_cases,
    answer=_dp_answer,
    reference=lambda c: dp_value(c.tree, c.n_layers, c.tau, **c.rule),
    error=absolute_difference,
    passes=lambda c, yours, expected, error: error <= _dp_tolerance(c, expected),
    same=lambda c, yours, wrong: abs(yours - wrong) <= max(0.01 * abs(wrong), 0.002),
    misconceptions=_DP_MISCONCEPTIONS,
    fallback_hint=_dp_fallback_hint,
    mismatch=_dp_mismatch,
    summary=lambda o, progress: (f"your DP value matches the optimal risk on {progress.cases} case(s) "
                                 f"(within {o.rtol:.0%})"),
    details=lambda o: {"rtol": o.rtol, "atol": o.atol},
    failure_details=lambda c, expected: {"case": c.number, "expected": expected,
                                         "tolerance": _dp_tolerance(c, expected)},
)


def check_dp_value(
    student: Callable | float,
    *,
    depth: int = 3,
    alpha: float = 0.5,
    n_layers: int = 2,
    tau: float = 0.6,
    rtol: float = 0.03,
    atol: float = 0.003,
) -> CheckResult:
    """Check the Bellman (DP) optimal risk over coordinate actions.

    ``student`` is either a number (the optimal risk for the tree ``TreePrior(depth, alpha)``
    with ``n_layers`` measurements at channel noise std ``tau``) or a function
    ``fn(tree, n_layers, tau) -> float``, run on :data:`~fvlib.course.dp.DP_CASES` (depth 2-3, one or two
    layers, ``tau`` in {0.1, 0.5, 0.6}). Note that ``tau`` is the noise *standard deviation*
    here, as in :func:`fvlib.theory.dp.dp_value` (the reference, 48-point Gauss-Hermite rule).

    Tolerance: ``max(rtol * reference, atol)`` (3%, at least 0.003). A correct DP with another
    quadrature (16 or more Gauss-Hermite points, or 32 or more grid points) is within 2.2% on
    these cases; 12 Hermite points can be 3% off (the observation integral needs care, see
    chapter 4). The greedy policy is 10%, 13% and 260% worse on the three discriminating cases.
    Recognised answers: greedy, non-adaptive (heap order), the prior risk (no measurement), one
    layer too few or too many, ``tau^2`` used as the std, and values below the optimum
    (impossible: check the quadrature weights).
    Timing: about 0.1 s per case with the reference.
    """
    if callable(student):
        cases = DP_CASES
    else:
        try:
            if isinstance(student, (bool, str, bytes)):
                raise TypeError
            student = float(student)
        except Exception:  # noqa: BLE001
            raise ValueError(
                f"check_dp_value needs a number or a function fn(tree, n_layers, tau) -> float, got {describe(student)}"
            ) from None
        check_int("depth", depth, 1, 3)
        check_int("n_layers", n_layers, 1, 3)
        check_number("tau", tau, 0, low_open=True)
        TreePrior(depth, alpha)  # validates alpha
        cases = ((depth, alpha, n_layers, tau),)
    check_number("rtol", rtol, 0)
    check_number("atol", atol, 0)
    return run_check(_DP, student, cases=cases, rtol=rtol, atol=atol)

