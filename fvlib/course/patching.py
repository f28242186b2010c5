"""The check of the theory key-patching heatmap of the greedy policy, or its qualitative shape
(chapter 10).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .._checks import check_int, check_number
from ..priors import TreePrior
from ..theory import PatchingResult, ideal_patching_mask, theory_patching_sweep
from .engine import (
    Case,
    Check,
    CheckResult,
    Fail,
    Misconception,
    argmax2,
    call_on,
    describe,
    equal,
    fmt,
    largest_difference,
    read_tensor,
    run_check,
)

__all__ = ["check_patching_sweep", "PATCHING_CASES"]


#: Default patching cases ``(depth, n_layers, n_ctx, noise_std)``; K != L in the second, so a
#: transposed heatmap shows in its shape.
PATCHING_CASES = ((3, 3, 32, 0.5), (4, 3, 64, 0.25))


# ----- the qualitative mask -------------------------------------------------------------
def _mask_cases(options):
    """The one case: the student's own mask, whose shape ``(K, L)`` sets the reference's."""
    try:
        mask = torch.as_tensor(options.mask)
    except Exception:  # noqa: BLE001
        raise Fail(f"expected a boolean (K, L) mask, got {describe(options.mask)}",
                   "return a torch.bool tensor") from None
    if mask.ndim != 2:
        raise Fail(f"your mask has shape {tuple(mask.shape)}, expected a (K, L) matrix",
                   "rows are split levels m, columns layers l")
    K, L = mask.shape
    yield Case(mask=mask.bool(), depth=K, n_layers=L)


def _mask_at_split(c, expected) -> torch.Tensor:
    """The mask with the cells ``l = m`` also marked."""
    return expected | (torch.arange(1, c.n_layers + 1)[None, :] == torch.arange(1, c.depth + 1)[:, None])


def _mask_mismatch(c, yours, expected) -> str:
    m, l = (int(i) + 1 for i in (yours != expected).nonzero()[0])
    return f"cell (m = {m}, l = {l}) is {bool(yours[m - 1, l - 1])}, expected {bool(expected[m - 1, l - 1])}"


#: How the qualitative mask goes wrong (texts about which cells a patch affects).
_MASK_MISCONCEPTIONS = (
    Misconception("l_ge_m", _mask_at_split,
                  "at l = m the patched layer measures a node of level m - 1, "
                  "which donor and target still share: no effect"),
    Misconception("transposed",
                  lambda c, e: torch.arange(1, c.depth + 1)[:, None] > torch.arange(1, c.n_layers + 1)[None, :],
                  "rows are split levels m and columns layers l; the effect is large for l > m, not m > l"),
    Misconception("inverted", lambda c, e: ~e, "True marks the cells where the patch changes what the target measures"),
)
_MASK_HINT = "layer l measures the path node of level l - 1; the paths share levels 0..m-1"

_PATCHING_MASK = Check(
    name="check_patching_sweep",
    cases=_mask_cases,
    answer=lambda student, c: c.mask,
    reference=lambda c: ideal_patching_mask(c.depth, c.n_layers),
    error=lambda yours, expected: None,
    passes=lambda c, yours, expected, error: equal(c, yours, expected),
    same=equal,
    misconceptions=_MASK_MISCONCEPTIONS,
    fallback_hint=_MASK_HINT,
    mismatch=_mask_mismatch,
    summary=lambda o, progress: (f"the ideal pattern for K = {progress.case.depth}, L = {progress.case.n_layers}: "
                                 "the patch changes what the target measures exactly when the patched layer l "
                                 "comes after the split (l > m)"),
    failure_details=lambda c, expected: {},
)


# ----- the numeric heatmap ----------------------------------------------------------------
def _heatmap_cases(options):
    for K, L, N, sigma in options.cases:
        tree = TreePrior(K, 0.5)
        yield Case(tree=tree, depth=K, n_layers=L, n_ctx=N, noise_std=sigma, contexts=options.contexts,
                   seed=options.seed, z=options.z, atol=options.atol,
                   args=(tree, N, sigma, L, options.contexts, options.seed),
                   what=(f"{tree!r}, n_ctx={N}, noise_std={sigma}, n_layers={L}, contexts={options.contexts}, "
                         f"seed={options.seed}"))


def _read_heatmap(student, c) -> torch.Tensor:
    """The student's ``(K, L)`` heatmap; its own standard errors, when it returned a
    :class:`~fvlib.theory.patching.PatchingResult`, are kept as ``c.student_stderr``."""
    raw = call_on(student, c) if callable(student) else student
    own = isinstance(raw, PatchingResult) and isinstance(raw.stderr, torch.Tensor)
    c.student_stderr = raw.stderr.double() if own else None
    return read_tensor(raw, "heatmap", (c.depth, c.n_layers), "(K, L) = (split levels, layers)")


def _heatmap_tolerance(c, ref: PatchingResult) -> torch.Tensor:
    """Per cell ``z * (combined standard error) + atol``: the reference's Monte Carlo error and
    the student's own (the student's if it returned one, else the reference's again)."""
    if c.student_stderr is not None and c.student_stderr.shape == ref.stderr.shape:
        combined = torch.sqrt(ref.stderr**2 + c.student_stderr**2)
    else:
        combined = math.sqrt(2) * ref.stderr
    return c.z * combined + c.atol


def _loose_tolerance(c, ref: PatchingResult) -> torch.Tensor:
    """The tolerance for recognising a misconception: 10% of the reference on top."""
    return _heatmap_tolerance(c, ref) + 0.1 * ref.loss.abs()


def _heatmaps_close(yours: torch.Tensor, other: torch.Tensor, tolerance: torch.Tensor) -> bool:
    return yours.shape == other.shape and bool(((yours - other).abs() <= tolerance).all())


def _columns_shifted(c, yours, ref: PatchingResult, step: int) -> bool:
    """Does column ``j`` of ``yours`` hold column ``j - step`` of the reference?"""
    if c.n_layers < 2:
        return False
    loose = _loose_tolerance(c, ref)
    if step > 0:
        return _heatmaps_close(yours[:, step:], ref.loss[:, :-step], loose[:, step:])
    return _heatmaps_close(yours[:, :step], ref.loss[:, -step:], loose[:, :step])


def _rows_shifted(c, yours, ref: PatchingResult, step: int) -> bool:
    """Does row ``i`` of ``yours`` hold row ``i - step`` of the reference?"""
    if c.depth < 2:
        return False
    loose = _loose_tolerance(c, ref)
    if step > 0:
        return _heatmaps_close(yours[step:], ref.loss[:-step], loose[step:])
    return _heatmaps_close(yours[:step], ref.loss[-step:], loose[:step])


def _patch_changed_nothing(c, yours, ref: PatchingResult) -> bool:
    """Every cell is the unpatched loss, although the reference shows large effects."""
    flat = (yours - ref.baseline).abs() <= c.z * math.sqrt(2) * ref.baseline_stderr + c.atol + 0.1 * ref.baseline
    return bool(flat.all()) and bool((ref.loss > 2 * ref.baseline + 0.05).any())


#: How a numeric heatmap goes wrong, in the order they are tried (texts about what a patch does).
_PATCHING_MISCONCEPTIONS = (
    Misconception("transposed", None,
                  "rows are split levels m = 1..K and columns layers l = 1..L: your heatmap is transposed",
                  matches=lambda c, y, ref: c.depth == c.n_layers
                  and _heatmaps_close(y, ref.loss.T, _loose_tolerance(c, ref).T)),
    Misconception("donor_scored", None,
                  "score the patched run against the *target's* theta (the donor's is the other curve, donor_loss)",
                  matches=lambda c, y, ref: _heatmaps_close(y, ref.donor_loss, _loose_tolerance(c, ref))),
    Misconception("no_effect", None,
                  "every cell equals the unpatched loss: the donor's node never reached the target; pass "
                  "forced={l: donor_nodes[:, l - 1]} to run_greedy for the target (l is 1-based)",
                  matches=_patch_changed_nothing),
    Misconception("layer_late", None,
                  "your column l - 1 holds the effect of patching layer l + 1: the layers are 1-based "
                  "(forced={l: donor_nodes[:, l - 1]} for l = 1..L)",
                  matches=lambda c, y, ref: _columns_shifted(c, y, ref, -1)),
    Misconception("layer_early", None,
                  "your column l - 1 holds the effect of patching layer l - 1: the layers are 1-based "
                  "(forced={l: donor_nodes[:, l - 1]} for l = 1..L)",
                  matches=lambda c, y, ref: _columns_shifted(c, y, ref, 1)),
    Misconception("level_off", None,
                  "split levels are 1-based: row m - 1 holds donors whose path first differs at level m "
                  "(patching_pairs(tree, n, m, ...))",
                  matches=lambda c, y, ref: _rows_shifted(c, y, ref, 1) or _rows_shifted(c, y, ref, -1)),
)
_PATCHING_HINT = (
    "for each split level m draw pairs with fvlib.theory.patching_pairs, run the greedy policy on the "
    "donor's statistic to get its nodes, then rerun the target with forced={l: donor_nodes[:, l - 1]} "
    "and score E|theta_hat - theta_target|^2"
)


def _heatmap_mismatch(c, yours, ref: PatchingResult) -> str:
    tolerance = _heatmap_tolerance(c, ref)
    m, l = argmax2((yours - ref.loss).abs() / tolerance)
    return (f"cell (split level m = {m}, layer l = {l}) of your heatmap is {fmt(float(yours[m - 1, l - 1]))}, "
            f"expected {fmt(float(ref.loss[m - 1, l - 1]))} +- {fmt(float(ref.stderr[m - 1, l - 1]))} "
            f"(tolerance {fmt(float(tolerance[m - 1, l - 1]))}) for {c.what}")


_PATCHING = Check(
    name="check_patching_sweep",
    cases=_heatmap_cases,
    answer=_read_heatmap,
    reference=lambda c: theory_patching_sweep(c.tree, c.n_ctx, c.noise_std, c.n_layers,
                                              contexts=c.contexts, seed=c.seed),
    error=lambda yours, ref: largest_difference(yours, ref.loss),
    passes=lambda c, yours, ref, error: not bool(((yours - ref.loss).abs() > _heatmap_tolerance(c, ref)).any()),
    same=lambda c, yours, wrong: False,  # every patching misconception tests the answer itself
    misconceptions=_PATCHING_MISCONCEPTIONS,
    fallback_hint=_PATCHING_HINT,
    mismatch=_heatmap_mismatch,
    summary=lambda o, progress: (f"your heatmap agrees with the greedy theory sweep within Monte Carlo error on "
                                 f"{progress.cases} case(s) ({o.contexts} pairs per split level)"),
    details=lambda o: {"z": o.z, "atol": o.atol},
)


def _given_heatmap(student) -> PatchingResult | torch.Tensor | None:
    """A heatmap or mask handed in as a value (``None`` for a function), or ``ValueError``."""
    if isinstance(student, PatchingResult):
        return student
    if callable(student):
        return None
    try:
        if isinstance(student, (str, bytes, dict)):
            raise TypeError
        return torch.as_tensor(student)
    except Exception:  # noqa: BLE001
        raise ValueError(
            "check_patching_sweep needs a function fn(tree, n_ctx, noise_std, n_layers, contexts, seed), "
            f"a (K, L) heatmap or a boolean (K, L) mask, got {describe(student)}"
        ) from None


def check_patching_sweep(
    student: Callable | torch.Tensor,
    *,
    contexts: int = 1000,
    seed: int = 0,
    z: float = 4.5,
    atol: float = 0.005,
    depth: int = 3,
    n_layers: int = 3,
    n_ctx: int = 32,
    noise_std: float = 0.5,
) -> CheckResult:
    """Check the theory key-patching heatmap of the greedy policy, or its qualitative shape.

    ``student`` is one of

    * a function ``fn(tree, n_ctx, noise_std, n_layers, contexts, seed)`` returning the heatmap
      ``loss (K, L)`` (a tensor or a :class:`fvlib.theory.patching.PatchingResult`), with
      ``loss[m - 1, l - 1]`` the target's excess loss ``E|theta_hat - theta_target|^2`` when the
      target's measured node at layer ``l`` is replaced by the donor's, for donor/target pairs
      whose paths split at level ``m``; run on :data:`~fvlib.course.patching.PATCHING_CASES`;
    * a numeric ``(K, L)`` heatmap (or ``PatchingResult``) computed for ``TreePrior(depth, 0.5)``,
      ``n_ctx``, ``noise_std``, ``n_layers`` with at least ``contexts`` pairs per split level;
    * a *boolean* ``(K, L)`` mask of the cells where the patch changes what the target
      measures: the qualitative shape, compared with
      :func:`fvlib.theory.patching.ideal_patching_mask` (``l > m``).

    Reference: :func:`fvlib.theory.patching_policies.theory_patching_sweep` with ``contexts`` pairs and
    ``seed``. A numeric answer passes when every cell is within
    ``z * sqrt(2) * stderr + atol`` of the reference (``sqrt(2)``: the student's heatmap has its
    own Monte Carlo error of about the same size). Recognised mistakes: a transposed heatmap,
    the loss scored against the donor's ``theta``, layers or split levels off by one, a patch
    that changed nothing.
    """
    given = _given_heatmap(student)
    if isinstance(given, torch.Tensor) and given.dtype == torch.bool:
        return run_check(_PATCHING_MASK, None, mask=given)
    for name, value in (("contexts", contexts), ("depth", depth), ("n_layers", n_layers), ("n_ctx", n_ctx)):
        check_int(name, value, 1)
    if contexts < 50:
        raise ValueError(f"contexts must be at least 50 for a meaningful Monte Carlo comparison, got {contexts!r}")
    check_number("noise_std", noise_std, 0)
    check_number("z", z, 0)
    check_number("atol", atol, 0)
    cases = PATCHING_CASES if given is None else ((depth, n_layers, n_ctx, noise_std),)
    answer = student if given is None else given
    return run_check(_PATCHING, answer, cases=cases, contexts=contexts, seed=seed, z=z, atol=atol)
