"""The check of the noise-free closed forms of chapter 6 (adaptive and non-adaptive)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .._checks import check_number
from ..priors import TreePrior
from ..theory import noisefree_adaptive_loss, noisefree_nonadaptive_loss
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

__all__ = ["check_noisefree_loss"]


_NOISEFREE_CASES = ((6, 0.5), (5, 0.7), (4, 0.3), (7, 0.9))


def _nonadaptive_floor(tree, budget):
    """The closed form without the partial level (a common slip): budget rounded down to 2^m - 1."""
    m = (budget + 1).bit_length() - 1
    return float(sum(tree.alpha**k for k in range(m, tree.depth)))


def _noisefree_cases(options):
    for depth, alpha in _NOISEFREE_CASES:
        tree = TreePrior(depth, alpha)
        for budget in range(1, min(tree.dim, 20) + 1):
            yield Case(tree=tree, budget=budget, rtol=options.rtol, args=(tree, budget),
                       what=f"{tree!r}, budget={budget}")


def _budget_shifted(loss: Callable, step: int) -> Callable:
    """The answer of the closed form ``loss`` at ``budget + step``: a level off by one."""
    def answer(c, expected):
        budget = c.budget + step
        if budget > c.tree.dim:
            return 0.0
        return loss(c.tree, budget) if budget >= 1 else c.tree.energy

    return answer


_ADAPTIVE_MISCONCEPTIONS = (
    Misconception("off_by_one_up", _budget_shifted(noisefree_adaptive_loss, 1),
                  "a level off by one: with L layers the levels 0..L-1 are known, so the sum of the unknown "
                  "energy starts at k = L"),
    Misconception("off_by_one_down", _budget_shifted(noisefree_adaptive_loss, -1),
                  "a level off by one: the sum starts at k = L (levels 0..L-1 are read)"),
    Misconception("other_formula", lambda c, e: noisefree_nonadaptive_loss(c.tree, c.budget),
                  "that is the non-adaptive closed form; swap the two"),
)
_NONADAPTIVE_MISCONCEPTIONS = (
    Misconception("no_partial_level", lambda c, e: _nonadaptive_floor(c.tree, c.budget),
                  "the r extra nodes of the partial level m each find the path with probability 2^-m: the "
                  "level-m term is alpha^m (1 - r / 2^m)"),
    Misconception("off_by_one_up", _budget_shifted(noisefree_nonadaptive_loss, 1),
                  "the budget counts nodes from the root: M = 2^m - 1 + r measures the levels 0..m-1 fully"),
    Misconception("off_by_one_down", _budget_shifted(noisefree_nonadaptive_loss, -1),
                  "the budget counts nodes from the root: M = 2^m - 1 + r measures the levels 0..m-1 fully"),
    Misconception("other_formula", lambda c, e: noisefree_adaptive_loss(c.tree, c.budget),
                  "that is the adaptive closed form; swap the two"),
)

_ADAPTIVE = Check(
    name="check_noisefree_loss",
    cases=_noisefree_cases,
    answer=lambda student, c: read_scalar(call_on(student, c), "loss"),
    reference=lambda c: noisefree_adaptive_loss(c.tree, c.budget),
    error=absolute_difference,
    passes=lambda c, yours, expected, error: error <= c.rtol * max(abs(expected), 1.0) + 1e-12,
    same=lambda c, yours, wrong: abs(yours - wrong) <= 1e-9 * max(abs(wrong), 1.0),
    misconceptions=_ADAPTIVE_MISCONCEPTIONS,
    fallback_hint="sum_{k >= L} alpha^k",
    mismatch=lambda c, yours, expected: f"for {c.what} your loss is {fmt(yours)}, expected {fmt(expected)}",
    summary=lambda o, progress: f"the {o.kind} noise-free closed form holds on {progress.cases} (tree, budget) cases",
    details=lambda o: {"kind": o.kind},
)
_NOISEFREE = {
    "adaptive": _ADAPTIVE,
    "nonadaptive": replace(
        _ADAPTIVE,
        reference=lambda c: noisefree_nonadaptive_loss(c.tree, c.budget),
        misconceptions=_NONADAPTIVE_MISCONCEPTIONS,
        fallback_hint="alpha^m (1 - r/2^m) + sum_{k > m} alpha^k with M = 2^m - 1 + r",
    ),
}


def check_noisefree_loss(student_fn: Callable, kind: str = "adaptive", *, rtol: float = 1e-9) -> CheckResult:
    """Check ``student_fn(tree, budget) -> loss``, a noise-free closed form of chapter 6.

    ``kind="adaptive"``: the greedy policy with ``L = budget`` layers and no channel noise leaves
    ``sum_{k >= L} alpha^k`` (:func:`fvlib.theory.closed_forms.noisefree_adaptive_loss`).
    ``kind="nonadaptive"``: the first ``M = budget`` nodes in heap order, ``M = 2^m - 1 + r``
    with ``0 <= r < 2^m``, leave ``alpha^m (1 - r / 2^m) + sum_{k > m} alpha^k``
    (:func:`fvlib.theory.closed_forms.noisefree_nonadaptive_loss`). Cases: depths 4-7, ``alpha`` in
    {0.3, 0.5, 0.7, 0.9}, every budget from 1 to ``D`` (up to 20). Recognised mistakes: a
    level off by one, the partial level ``r`` ignored, the two formulas swapped.
    """
    require_callable("check_noisefree_loss", student_fn, "fn(tree, budget) -> loss")
    if kind not in _NOISEFREE:
        raise ValueError(f"kind must be 'adaptive' or 'nonadaptive', got {kind!r}")
    check_number("rtol", rtol, 0)
    return run_check(_NOISEFREE[kind], student_fn, kind=kind, rtol=rtol)

