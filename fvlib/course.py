"""Automatic checks for the course module's problem sets.

Each ``check_*`` function takes a student's *function* (or, where it says so, a computed
value), runs it on a few seeded random inputs, compares the answers with fvlib's reference
implementation and returns a :class:`CheckResult`. A result is truthy when the answer is
right; it prints (and renders in a notebook) as ``Correct: ...`` or
``Not yet: <what differs, where>; hint: <the likely mistake>``. Where a wrong answer matches a
known misconception (``tau`` instead of ``tau^2``, greedy instead of optimal, a layer index
off by one, ...), the hint names it.

Every check is data: a ``Check`` holds its cases, its reference, how an answer is read
and compared, and its list of ``Misconception`` rows; one runner, ``_run``, executes
them all. To add a recognised mistake, add a row to the check's misconception table.

Two kinds of bad input are told apart:

* misuse of the check itself (not a function where one is needed, a bad depth or noise
  level) raises ``ValueError`` naming the bad value;
* a student function that raises, returns the wrong type or shape, or returns ``NaN`` gives a
  *failed* :class:`CheckResult` that says so. Nothing the student function does escapes as a
  traceback.

Conventions (as in the rest of fvlib; see the book's appendix *Conventions*):

* Tree prior in heap order: root 0, children of ``n`` are ``2n+1`` (sign -1) and ``2n+2``
  (sign +1); level ``k`` holds nodes ``2^k - 1 .. 2^(k+1) - 2``; ``D = 2^K - 1``. Leaves are
  indexed ``0 .. 2^K - 1`` reading the sign path as binary digits (``+1`` is 1), most
  significant first, as in :attr:`fvlib.priors.TreePrior.all_signs` (section "The tree prior
  and its indexing").
* Gaussian channel: a measurement of node ``a`` is ``phi ~ N(theta[a], tau2)``; ``tau2`` is a
  *variance* (:func:`fvlib.theory.closed_forms.channel_tau2`; section "Measurements and the
  channel").
* Patching heatmaps: ``loss[m - 1, l - 1]``, rows split levels ``m = 1..K`` (the first level at
  which donor and target paths visit different nodes), columns layers ``l = 1..L`` (1-based,
  as in the hook names ``blocks.{l}``); see :mod:`fvlib.theory.patching` (section "Donor, target and
  the split level").

Every check is fast (well under a second with fvlib's reference solutions) and deterministic
for a given ``seed``.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, Callable, Iterable

import torch

from ._checks import check_int, check_number
from .priors import GaussianPrior, Prior, TreePrior
from .task import make_generator, sample_task
from .theory import (
    GaussianChannel,
    PatchingResult,
    channel_tau2,
    dp_value,
    gaussian_posterior,
    greedy_action,
    leaf_values_at,
    level_node_masses,
    log_likelihood_nodes,
    noisefree_adaptive_loss,
    noisefree_nonadaptive_loss,
    policy_value,
    posterior_probs,
    theory_patching_sweep,
    tree_posterior_mean,
)

__all__ = [
    "CheckResult",
    "check_channel_tau2",
    "check_sufficient_statistic",
    "check_posterior",
    "check_gaussian_posterior",
    "check_greedy_action",
    "check_noisefree_loss",
    "check_dp_value",
    "check_patching_sweep",
    "ideal_patching_mask",
    "DP_CASES",
    "PATCHING_CASES",
]


# ----------------------------------------------------------------------------------------
# The result object
# ----------------------------------------------------------------------------------------
@dataclass
class CheckResult:
    """The outcome of a check.

    Attributes:
        name: which check produced it (e.g. ``"check_posterior"``).
        passed: ``True`` when every test case agreed with the reference.
        message: one sentence: what was checked, or what differs and where.
        hint: for a failed check, the likely mistake and what to look at (empty when passed).
        max_error: the largest absolute difference from the reference over the cases that
            ran (``None`` when no comparable answer came back).
        cases: how many test cases were run (a failed check stops at the first bad case).
        details: anything else worth keeping (tolerances, the failing case's parameters, the
            matched misconception under ``"diagnosis"``).

    ``bool(result)`` is ``passed``, so ``assert check_posterior(fn)`` works; ``str(result)``
    reads ``Correct: ...`` or ``Not yet: ...; hint: ...``.
    """

    name: str
    passed: bool
    message: str
    hint: str = ""
    max_error: float | None = None
    cases: int = 0
    details: dict = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.passed)

    def __str__(self) -> str:
        if self.passed:
            return f"Correct: {self.message}"
        text = f"Not yet: {self.message}"
        return f"{text}; hint: {self.hint}" if self.hint else text

    def __repr__(self) -> str:
        return f"<CheckResult {self.name}: {self}>"

    def _repr_html_(self) -> str:
        colour, border, word = ("#e8f5e9", "#2e7d32", "Correct") if self.passed else ("#fff3e0", "#e65100", "Not yet")
        body = f"<b>{word}:</b> {html.escape(self.message)}"
        if self.hint and not self.passed:
            body += f"<br><b>Hint:</b> {html.escape(self.hint)}"
        return (
            f'<div style="background:{colour};border-left:4px solid {border};padding:6px 10px;'
            f'margin:4px 0;font-family:sans-serif"><code>{html.escape(self.name)}</code> {body}</div>'
        )


class _Fail(Exception):
    """Internal: carries a failed CheckResult out of nested helpers."""

    def __init__(self, message: str, hint: str = "", **details):
        super().__init__(message)
        self.message, self.hint, self.details = message, hint, details


# ----------------------------------------------------------------------------------------
# Checks as data, and the one runner
# ----------------------------------------------------------------------------------------
#: One test case: the student's arguments ``args``, their description ``what``, and whatever
#: the reference, the misconceptions and the messages need (``tree``, ``tau2``, ...). The
#: runner adds ``number`` (1-based) and, for answers in parts, ``part``.
Case = SimpleNamespace


@dataclass(frozen=True)
class Misconception:
    """A known mistake: its ``label`` (kept as ``details["diagnosis"]``), how to recognise it,
    and the ``hint`` it earns (a text, or ``hint(case)`` for one that names the case's values).

    ``answer(case, expected)`` is the answer the mistake gives on a case (``None`` where it does
    not apply), compared with the student's by the check's ``same``; or, instead,
    ``matches(case, yours, expected)`` tests the student's answer directly. A misconception that
    cannot be computed on a case is skipped.
    """

    label: str
    answer: Callable[[Case, Any], Any] | None
    hint: str | Callable[[Case], str]
    matches: Callable[[Case, Any, Any], bool] | None = None


@dataclass(frozen=True)
class Check:
    """One problem-set check: its cases, its reference and its misconceptions.

    Attributes:
        name: the public function's name, as in :attr:`CheckResult.name`.
        cases: ``cases(options) -> iterable of Case``, the seeded test cases (drawn lazily).
        answer: ``answer(student, case)``, the student's answer on a case, read and validated
            (a bad return value raises a failed result).
        reference: ``reference(case)``, fvlib's answer.
        error: ``error(yours, expected)``, the distance tracked as ``max_error`` (``None``:
            not tracked; a passed check then reports 0).
        passes: ``passes(case, yours, expected, error)``, whether the answer is right.
        same: ``same(case, yours, wrong)``, whether the student's answer is a misconception's.
        misconceptions: tried in order; the first match names the mistake.
        fallback_hint: the hint when no misconception matches (a text, or
            ``fallback_hint(case, yours, expected)``).
        mismatch: ``mismatch(case, yours, expected)``, the failure message: what differs, where.
        summary: ``summary(options, progress)``, the message of a passed check.
        details: ``details(options)``, kept in a passed result.
        failure_details: ``failure_details(case, expected)``, kept in a failed result beside
            the diagnosis.
        parts: for an answer in named parts (a dict), the parts compared in turn.
    """

    name: str
    cases: Callable[[SimpleNamespace], Iterable[Case]]
    answer: Callable[[Any, Case], Any]
    reference: Callable[[Case], Any]
    error: Callable[[Any, Any], float | None]
    passes: Callable[[Case, Any, Any, float | None], bool]
    same: Callable[[Case, Any, Any], bool]
    misconceptions: tuple[Misconception, ...]
    fallback_hint: str | Callable[[Case, Any, Any], str]
    mismatch: Callable[[Case, Any, Any], str]
    summary: Callable[[SimpleNamespace, "_Progress"], str]
    details: Callable[[SimpleNamespace], dict] = lambda options: {}
    failure_details: Callable[[Case, Any], dict] = lambda case, expected: {"case": case.number}
    parts: tuple[str, ...] | None = None


@dataclass
class _Progress:
    """How far a run got: cases compared, the largest error so far, the last case."""

    cases: int = 0
    max_error: float | None = None
    case: Case | None = None

    def track(self, error: float | None) -> None:
        if error is not None:
            self.max_error = error if self.max_error is None else max(self.max_error, error)


def _run(check: Check, student, **options) -> CheckResult:
    """Run ``check`` on ``student`` (a function, or a given answer) case by case; the first
    case that differs ends the run with a failed result."""
    options = SimpleNamespace(**options)
    progress = _Progress()
    try:
        for number, case in enumerate(check.cases(options), start=1):
            case.number = number
            yours, expected = check.answer(student, case), check.reference(case)
            progress.cases, progress.case = number, case
            for part in check.parts or (None,):
                case.part = part
                _compare(check, case, *_part(yours, expected, part), progress)
    except _Fail as fail:
        return CheckResult(check.name, False, fail.message, fail.hint, progress.max_error, progress.cases, fail.details)
    max_error = 0.0 if progress.max_error is None else progress.max_error
    return CheckResult(check.name, True, check.summary(options, progress), "", max_error, progress.cases,
                       check.details(options))


def _part(yours, expected, part):
    return (yours, expected) if part is None else (yours[part], expected[part])


def _compare(check: Check, case: Case, yours, expected, progress: _Progress) -> None:
    """Track the error; if the answer is wrong, raise the failure with its diagnosis."""
    error = check.error(yours, expected)
    progress.track(error)
    if check.passes(case, yours, expected, error):
        return
    found = _diagnose(check, case, yours, expected)
    if found is not None:
        hint = found.hint(case) if callable(found.hint) else found.hint
    else:
        fallback = check.fallback_hint
        hint = fallback(case, yours, expected) if callable(fallback) else fallback
    raise _Fail(check.mismatch(case, yours, expected), hint,
                **check.failure_details(case, expected), diagnosis=found.label if found else None)


def _diagnose(check: Check, case: Case, yours, expected) -> Misconception | None:
    """The first misconception whose answer is the student's."""
    for misconception in check.misconceptions:
        try:
            if misconception.matches is not None:
                if misconception.matches(case, yours, expected):
                    return misconception
                continue
            wrong = misconception.answer(case, expected)
            if wrong is not None and check.same(case, yours, wrong):
                return misconception
        except Exception:  # noqa: BLE001 - a diagnosis that cannot be computed is skipped
            continue
    return None


# ----------------------------------------------------------------------------------------
# Reading and comparing answers
# ----------------------------------------------------------------------------------------
def _require_callable(name: str, fn, signature: str) -> None:
    if callable(fn):
        return
    raise ValueError(
        f"{name} needs your function {signature} itself (not its result), got {_describe(fn)}"
    )


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"a {type(value).__name__} of shape {tuple(shape)}"
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def _call(fn: Callable, args: tuple, what: str):
    """Call the student's function; turn every exception into a failed check."""
    try:
        return fn(*args)
    except NotImplementedError as err:
        raise _Fail(
            f"your function still raises NotImplementedError({str(err)!r})",
            "replace the `raise NotImplementedError(...)` line of the template with your code",
        ) from None
    except Exception as err:  # noqa: BLE001 - any student error becomes a readable result
        raise _Fail(
            f"your function raised {type(err).__name__}: {err} (called with {what})",
            "run your function by hand on these inputs and read the traceback",
            exception=type(err).__name__,
        ) from None


def _call_on(student, case: Case):
    """The student's function called on the case's arguments."""
    return _call(student, case.args, case.what)


def _tensor(value, what: str, shape: tuple[int, ...], shape_text: str) -> torch.Tensor:
    """The student's return value as a float64 tensor of ``shape``, or a failed check."""
    if isinstance(value, PatchingResult):
        value = value.loss
    if value is None:
        raise _Fail(f"your function returned None instead of {what}", "did you forget the `return` statement?")
    try:
        tensor = torch.as_tensor(value).detach().cpu()
    except Exception:  # noqa: BLE001
        tensor = None
    if tensor is not None and tensor.is_complex():
        raise _Fail(f"your {what} is complex (dtype {tensor.dtype}), expected real numbers",
                    "keep the computation real: no complex inputs, no square roots or logs of negative numbers")
    try:
        tensor = torch.as_tensor(value).detach().cpu()
        if tensor.dtype == torch.bool:
            tensor = tensor.double()
        tensor = tensor.to(torch.float64)
    except Exception:  # noqa: BLE001
        raise _Fail(
            f"your function returned {_describe(value)}, expected {what} as a tensor of shape {shape_text} = {shape}",
            "return a torch tensor (a numpy array or nested list works too)",
        ) from None
    if tuple(tensor.shape) != tuple(shape):
        hint = "check which dimension is which"
        if tensor.ndim == len(shape) and tuple(tensor.shape) == tuple(reversed(shape)):
            hint = "your array looks transposed"
        elif tensor.numel() == math.prod(shape):
            hint = f"the right number of entries in the wrong layout: reshape to {shape_text}"
        raise _Fail(
            f"your {what} has shape {tuple(tensor.shape)}, expected {shape_text} = {shape}", hint
        )
    if not torch.isfinite(tensor).all():
        bad = int((~torch.isfinite(tensor)).sum())
        raise _Fail(
            f"your {what} contains {bad} non-finite value(s) (NaN or inf)",
            "normalise in log space (subtract the maximum, or use torch.logsumexp / torch.softmax) "
            "instead of exponentiating raw log-weights",
        )
    return tensor


def _scalar(value, what: str) -> float:
    if isinstance(value, PatchingResult) or value is None:
        raise _Fail(f"your function returned {_describe(value)}, expected {what} as one number",
                    "return a float")
    try:
        number = float(value)
    except Exception:  # noqa: BLE001
        raise _Fail(f"your function returned {_describe(value)}, expected {what} as one number",
                    "return a float (e.g. `float(x)` or `x.item()`)") from None
    if not math.isfinite(number):
        raise _Fail(f"your {what} is {number}", "look for a division by zero or a log of zero")
    return number


def _worst(yours: torch.Tensor, expected: torch.Tensor) -> tuple[tuple[int, ...], float]:
    """The index of the largest absolute difference, and that difference."""
    diff = (yours - expected).abs()
    flat = int(diff.argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
    return index, float(diff.max())


def _largest_difference(yours: torch.Tensor, expected: torch.Tensor) -> float:
    return _worst(yours, expected)[1]


def _close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float = 0.0) -> bool:
    return a.shape == b.shape and bool(((a - b).abs() <= atol + rtol * b.abs()).all())


def _equal(case, yours: torch.Tensor, other: torch.Tensor) -> bool:
    return bool((yours == other).all())


def _absolute_difference(yours: float, expected: float) -> float:
    return abs(yours - expected)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _argmax2(values: torch.Tensor) -> tuple[int, int]:
    """1-based ``(row, column)`` of the largest entry of a matrix."""
    flat = int(values.flatten().argmax())
    return flat // values.shape[1] + 1, flat % values.shape[1] + 1


# ----------------------------------------------------------------------------------------
# 1. Channel noise
# ----------------------------------------------------------------------------------------
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
    answer=lambda student, c: _scalar(_call_on(student, c), "tau2"),
    reference=lambda c: channel_tau2(c.prior, c.n_ctx, c.noise_std),
    error=_absolute_difference,
    passes=lambda c, yours, expected, error: error <= c.rtol * abs(expected) + 1e-12,
    same=lambda c, yours, wrong: abs(yours - wrong) <= 1e-6 * abs(wrong) + 1e-12,
    misconceptions=_TAU2_MISCONCEPTIONS,
    fallback_hint="tau^2 = (E|theta|^2 + sigma^2) / N, see chapter 2 (what one pooled average knows)",
    mismatch=lambda c, yours, expected: f"for {c.what} your tau2 is {_fmt(yours)}, expected {_fmt(expected)}",
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
    _require_callable("check_channel_tau2", student_fn, "fn(prior, n_ctx, noise_std) -> tau2")
    check_number("rtol", rtol, 0)
    return _run(_TAU2, student_fn, rtol=rtol)


# ----------------------------------------------------------------------------------------
# 2. The pooled statistic
# ----------------------------------------------------------------------------------------
def _statistic_cases(options):
    gen = make_generator(options.seed)
    for prior, B, N in ((TreePrior(3, 0.5), 6, 20), (TreePrior(4, 0.7), 5, 9), (GaussianPrior.isotropic(5), 4, 33)):
        task = sample_task(prior, B, N, 0.3, gen, dtype=torch.float64)
        yield Case(prior=prior, batch=B, n_ctx=N, task=task, atol=options.atol, args=(task.x.clone(), task.y.clone()),
                   what=f"x of shape {tuple(task.x.shape)}, y of shape {tuple(task.y.shape)}")


def _statistic_mismatch(c, yours, expected) -> str:
    index, _ = _worst(yours, expected)
    b, d = index
    return (f"g_hat of context {b} differs at coordinate {d} (yours {_fmt(float(yours[index]))}, "
            f"expected {_fmt(float(expected[index]))}) for {c.what}")


_STATISTIC = Check(
    name="check_sufficient_statistic",
    cases=_statistic_cases,
    answer=lambda student, c: _tensor(_call_on(student, c), "g_hat", (c.batch, c.prior.dim), "(B, D)"),
    reference=lambda c: c.task.sufficient_statistic(),
    error=_largest_difference,
    passes=lambda c, yours, expected, error: error <= c.atol,
    same=lambda c, yours, wrong: _close(yours, wrong, c.atol * max(1.0, c.n_ctx)),
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
    _require_callable("check_sufficient_statistic", student_fn, "fn(x, y) -> g_hat")
    check_number("atol", atol, 0)
    return _run(_STATISTIC, student_fn, seed=seed, atol=atol)


# ----------------------------------------------------------------------------------------
# 3. The exact tree posterior
# ----------------------------------------------------------------------------------------
_POSTERIOR_CASES = (
    # depth, alpha, tau2, measurements per context
    (3, 0.5, 0.09, 2),
    (2, 0.7, 0.36, 1),
    (4, 0.5, 0.05, 3),
    (3, 0.8, 0.2, 4),
)
#: What ``output="mean"`` / ``"probs"`` asks for: its name, the name of its columns, its shape.
_POSTERIOR_OUTPUTS = {
    "mean": ("posterior mean", "coordinate", "(B, D)"),
    "probs": ("leaf probabilities", "leaf", "(B, 2^K)"),
}


def _posterior_inputs(tree: TreePrior, batch: int, n_meas: int, tau2: float, gen: torch.Generator):
    """Nodes ``(B, L)``: the true path for some contexts, random (also off-path, repeated)
    nodes for the others; ``phis (B, L)`` from the Gaussian channel."""
    signs = tree.sample_signs(batch, gen)
    theta = tree.theta_from_signs(signs)
    path = tree.path_nodes(signs)
    random_nodes = torch.randint(0, tree.dim, (batch, n_meas), generator=gen)
    on_path = path[:, torch.arange(n_meas) % tree.depth]
    use_path = torch.rand(batch, 1, generator=gen) < 0.5
    nodes = torch.where(use_path, on_path, random_nodes)
    channel = GaussianChannel(theta, math.sqrt(tau2), gen)
    phis = torch.stack([channel.measure_nodes(nodes[:, j]) for j in range(n_meas)], dim=1)
    return nodes, phis


def _posterior_cases(options):
    gen = make_generator(options.seed)
    for depth, alpha, tau2, n_meas in _POSTERIOR_CASES:
        tree = TreePrior(depth, alpha)
        nodes, phis = _posterior_inputs(tree, options.batch, n_meas, tau2, gen)
        yield Case(tree=tree, nodes=nodes, phis=phis, tau2=tau2, alpha=alpha, n_meas=n_meas, batch=options.batch,
                   output=options.output, atol=options.atol, args=(tree, nodes.clone(), phis.clone(), tau2),
                   what=f"{tree!r}, nodes of shape {tuple(nodes.shape)}, tau2={tau2}")


def _read_posterior(student, c) -> torch.Tensor:
    raw = _call_on(student, c)
    if c.output == "mean" and isinstance(raw, torch.Tensor) and tuple(raw.shape) == (c.batch, c.tree.num_leaves):
        raise _Fail(
            f"your function returned shape {tuple(raw.shape)} = (B, 2^K), leaf probabilities, "
            f"but check_posterior(output='mean') wants the posterior mean of shape (B, D) = {(c.batch, c.tree.dim)}",
            "multiply by tree.leaf_thetas (or pass output='probs' to check the probabilities)",
        )
    noun, _, shape_text = _POSTERIOR_OUTPUTS[c.output]
    shape = (c.batch, c.tree.dim) if c.output == "mean" else (c.batch, c.tree.num_leaves)
    return _tensor(raw, noun, shape, shape_text)


def _posterior_answer(c, probs: torch.Tensor) -> torch.Tensor:
    """What the check asks for, from leaf probabilities ``(B, 2^K)``."""
    return probs if c.output == "probs" else tree_posterior_mean(c.tree, probs)


def _posterior_reference(c) -> torch.Tensor:
    return _posterior_answer(c, posterior_probs(log_likelihood_nodes(c.tree, c.nodes, c.phis, c.tau2)))


def _from_log_weights(c, log_w: torch.Tensor) -> torch.Tensor:
    return _posterior_answer(c, posterior_probs(log_w))


def _posterior_without_quadratic(c, expected):
    log_w = torch.zeros(c.nodes.shape[0], c.tree.num_leaves, dtype=torch.float64)
    for j in range(c.nodes.shape[1]):
        log_w = log_w + c.phis[:, j, None] * leaf_values_at(c.tree, c.nodes[:, j]) / c.tau2
    return _from_log_weights(c, log_w)


def _posterior_map_leaf(c, expected):
    probs = posterior_probs(log_likelihood_nodes(c.tree, c.nodes, c.phis, c.tau2))
    return _posterior_answer(c, torch.nn.functional.one_hot(probs.argmax(-1), c.tree.num_leaves).double())


def _posterior_linear_shrinkage(c, expected):
    if c.output == "probs":
        return None
    v = c.tree.node_variances
    out = torch.zeros(c.nodes.shape[0], c.tree.dim, dtype=torch.float64)
    rows = torch.arange(c.nodes.shape[0])
    for j in range(c.nodes.shape[1]):
        node = c.nodes[:, j]
        out[rows, node] = c.phis[:, j] * v[node] / (v[node] + c.tau2)
    return out


def _posterior_unnormalised(c, expected):
    return torch.exp(log_likelihood_nodes(c.tree, c.nodes, c.phis, c.tau2)) if c.output == "probs" else None


def _posterior_prior(c, expected):
    leaves = c.tree.num_leaves
    return _posterior_answer(c, torch.full((c.nodes.shape[0], leaves), 1.0 / leaves, dtype=torch.float64))


_POSTERIOR_MISCONCEPTIONS = (
    Misconception("tau_not_tau2",
                  lambda c, e: _from_log_weights(c, log_likelihood_nodes(c.tree, c.nodes, c.phis, math.sqrt(c.tau2))),
                  "you divided by tau where the Gaussian likelihood has the variance tau2 = tau^2: "
                  "log p(phi | theta_a = t) = (phi t - t^2 / 2) / tau2 + const"),
    Misconception("tau2_squared",
                  lambda c, e: _from_log_weights(c, log_likelihood_nodes(c.tree, c.nodes, c.phis, c.tau2**2)),
                  "tau2 is already the variance; do not square it again"),
    Misconception("no_quadratic", _posterior_without_quadratic,
                  "keep the -t^2 / 2 term of the log-likelihood: theta_a is 0 for leaves off the node's path "
                  "and +-alpha^(k/2) on it, so t^2 differs between leaves and does not cancel"),
    Misconception("last_only",
                  lambda c, e: _from_log_weights(c, log_likelihood_nodes(c.tree, c.nodes[:, -1:], c.phis[:, -1:], c.tau2)),
                  "use every measurement of the context: add the log-likelihoods of all L of them"),
    Misconception("first_only",
                  lambda c, e: _from_log_weights(c, log_likelihood_nodes(c.tree, c.nodes[:, :1], c.phis[:, :1], c.tau2)),
                  "use every measurement of the context, not only the first"),
    Misconception("map", _posterior_map_leaf,
                  "that is the most probable leaf (MAP); the posterior mean averages theta over all leaves, "
                  "weighted by their posterior probabilities"),
    Misconception("lmmse", _posterior_linear_shrinkage,
                  "that is the linear (per-coordinate shrinkage) estimate; the tree posterior is not Gaussian, "
                  "so enumerate the 2^K leaves and weight each by its likelihood"),
    Misconception("unnormalised", _posterior_unnormalised,
                  "normalise the probabilities so that each row sums to 1 (softmax of the log-weights)"),
    Misconception("prior", _posterior_prior,
                  "that is the prior; the measurements must move the posterior (did the update get lost?)"),
)


def _posterior_mismatch(c, yours, expected) -> str:
    index, _ = _worst(yours, expected)
    noun, column, _ = _POSTERIOR_OUTPUTS[c.output]
    b, d = index
    return (f"the {noun} of context {b} differs at {column} {d} (yours {_fmt(float(yours[index]))}, "
            f"expected {_fmt(float(expected[index]))}) in case {c.number} of {len(_POSTERIOR_CASES)} "
            f"(depth {c.tree.depth}, alpha {c.alpha}, tau2 {c.tau2}, {c.n_meas} measurement(s) per context)")


def _posterior_summary(o, progress) -> str:
    noun = _POSTERIOR_OUTPUTS[o.output][0]
    return (f"your {noun} matches the exact posterior on {progress.cases} cases "
            f"({o.batch} contexts each; max error {progress.max_error:.1e})")


_POSTERIOR = Check(
    name="check_posterior",
    cases=_posterior_cases,
    answer=_read_posterior,
    reference=_posterior_reference,
    error=_largest_difference,
    passes=lambda c, yours, expected, error: error <= c.atol,
    same=lambda c, yours, wrong: _close(yours, wrong, max(c.atol, 1e-6)),
    misconceptions=_POSTERIOR_MISCONCEPTIONS,
    fallback_hint=("build the log-weights of the 2^K leaves, add (phi t - t^2/2) / tau2 per measurement with "
                   "t = theta_leaf[node], normalise with a softmax, then average theta over the leaves"),
    mismatch=_posterior_mismatch,
    summary=_posterior_summary,
    details=lambda o: {"atol": o.atol, "output": o.output},
    failure_details=lambda c, expected: {"case": c.number, "atol": c.atol},
)


def check_posterior(
    student_fn: Callable,
    *,
    output: str = "mean",
    seed: int = 0,
    batch: int = 32,
    atol: float = 1e-4,
) -> CheckResult:
    """Check the exact tree posterior after coordinate measurements through the Gaussian channel.

    ``student_fn(tree, nodes, phis, tau2)`` receives a :class:`fvlib.priors.TreePrior`, the measured
    nodes ``nodes (B, L)`` (long, heap order; nodes may repeat and may be off the path),
    the observations ``phis (B, L)`` (float64, ``phi ~ N(theta[node], tau2)`` independently) and
    the channel *variance* ``tau2`` (float). It returns

    * ``output="mean"`` (default): the posterior mean ``E[theta | phis]``, shape ``(B, D)``;
    * ``output="probs"``: the leaf probabilities ``P(leaf j | phis)``, shape ``(B, 2^K)``, leaves
      in the order of :attr:`fvlib.priors.TreePrior.all_signs`.

    The prior over leaves is uniform. Reference: :func:`fvlib.theory.posteriors.log_likelihood_nodes`,
    :func:`~fvlib.theory.posteriors.posterior_probs`, :func:`~fvlib.theory.posteriors.tree_posterior_mean`. Four
    cases (depth 2-4, ``tau2`` from 0.05 to 0.36, 1-4 measurements per context), ``batch``
    contexts each; half the contexts measure their own path, half random nodes. Recognised
    mistakes: ``tau`` instead of ``tau2``, dropping ``-t^2/2``, using only one measurement, the
    MAP leaf, linear shrinkage, unnormalised probabilities, returning the prior.
    """
    _require_callable("check_posterior", student_fn, "fn(tree, nodes, phis, tau2)")
    if output not in _POSTERIOR_OUTPUTS:
        raise ValueError(f"output must be 'mean' or 'probs', got {output!r}")
    check_int("batch", batch, 1)
    check_number("atol", atol, 0)
    return _run(_POSTERIOR, student_fn, output=output, seed=seed, batch=batch, atol=atol)


# ----------------------------------------------------------------------------------------
# 4. The Gaussian posterior
# ----------------------------------------------------------------------------------------
_COV, _MEAN = "posterior covariance", "posterior mean"


def _gaussian_settings(gen: torch.Generator):
    """``(label, cov (D, D), W (M, D), tau2)`` of each case, drawn lazily from ``gen``."""
    def random_cov(d):
        a = torch.randn(d, d, generator=gen, dtype=torch.float64)
        return a @ a.T / d + 0.1 * torch.eye(d, dtype=torch.float64)

    tree = TreePrior(3, 0.5)
    coords = torch.eye(tree.dim, dtype=torch.float64)[:3]
    yield "the Gaussian twin of TreePrior(3, 0.5), 3 coordinates", tree.second_moment(), coords, 0.05
    yield "a random 4 x 4 covariance, 2 random directions", random_cov(4), torch.randn(2, 4, generator=gen, dtype=torch.float64), 0.3
    yield "a random 5 x 5 covariance, 5 random directions", random_cov(5), torch.randn(5, 5, generator=gen, dtype=torch.float64), 0.1


def _gaussian_cases(options):
    gen = make_generator(options.seed)
    for label, cov, W, tau2 in _gaussian_settings(gen):
        theta = GaussianPrior(cov).sample(options.batch, gen)
        phi = theta @ W.T + math.sqrt(tau2) * torch.randn(options.batch, W.shape[0], generator=gen, dtype=torch.float64)
        yield Case(label=label, cov=cov, W=W, phi=phi, tau2=tau2, batch=options.batch, atol=options.atol,
                   args=(cov.clone(), W.clone(), phi.clone(), tau2),
                   what=f"{label} (cov {tuple(cov.shape)}, W {tuple(W.shape)}, phi {tuple(phi.shape)}, tau2={tau2})")


def _read_gaussian(student, c) -> dict:
    raw = _call_on(student, c)
    if not (isinstance(raw, (tuple, list)) and len(raw) == 2):
        raise _Fail(
            f"your function returned {_describe(raw)}; expected a pair (mean (B, D), cov (D, D))",
            "end with `return mean, post_cov`",
        )
    D = c.cov.shape[0]
    mean = _tensor(raw[0], _MEAN, (c.batch, D), "(B, D)")
    return {_COV: _tensor(raw[1], _COV, (D, D), "(D, D)"), _MEAN: mean}


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
    index, _ = _worst(yours, expected)
    where = f"entry {index}" if c.part == _COV else f"context {index[0]}, coordinate {index[1]}"
    return (f"your {c.part} differs at {where} (yours {_fmt(float(yours[index]))}, "
            f"expected {_fmt(float(expected[index]))}) for {c.label}")


_GAUSSIAN = Check(
    name="check_gaussian_posterior",
    cases=_gaussian_cases,
    answer=_read_gaussian,
    reference=_gaussian_reference,
    parts=(_COV, _MEAN),
    error=_largest_difference,
    passes=lambda c, yours, expected, error: error <= c.atol + 1e-9 * float(expected.abs().max()),
    same=lambda c, yours, wrong: _close(yours, wrong, 1e-6, 1e-6),
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
    _require_callable("check_gaussian_posterior", student_fn, "fn(cov, W, phi, tau2) -> (mean, cov)")
    check_int("batch", batch, 1)
    check_number("atol", atol, 0)
    return _run(_GAUSSIAN, student_fn, seed=seed, batch=batch, atol=atol)


# ----------------------------------------------------------------------------------------
# 5. The greedy action
# ----------------------------------------------------------------------------------------
def _greedy_cases(options):
    gen = make_generator(options.seed)
    for depth in (3, 4):
        tree = TreePrior(depth, 0.5)
        for step in range(depth):
            log_w = 2.0 * torch.randn(options.batch, tree.num_leaves, generator=gen, dtype=torch.float64)
            yield Case(tree=tree, log_w=log_w, step=step, offset=2**step - 1, batch=options.batch,
                       args=(tree, log_w.clone(), step), what=f"{tree!r}, log_w of shape {tuple(log_w.shape)}, step={step}")


def _greedy_at(c, step: int) -> torch.Tensor | None:
    """The greedy node of another level (``None`` beyond the tree)."""
    return greedy_action(c.tree, c.log_w, step).double() if 0 <= step < c.tree.depth else None


def _most_probable_leaf_path(c, expected) -> torch.Tensor:
    probs = posterior_probs(c.log_w)
    return c.tree.path_nodes(c.tree.all_signs[probs.argmax(-1)])[:, c.step].double()


def _least_massive(c, expected) -> torch.Tensor:
    masses = level_node_masses(c.tree, posterior_probs(c.log_w), c.step)
    return (masses.argmin(-1) + c.offset).double()


_GREEDY_MISCONCEPTIONS = (
    Misconception("no_offset", lambda c, e: e - c.offset,
                  lambda c: f"return heap-order node ids: level {c.step} starts at node 2^{c.step} - 1 = {c.offset}"),
    Misconception("leaf_path", _most_probable_leaf_path,
                  "that is the node on the path of the single most probable leaf; greedy picks the node "
                  "whose *total* mass (sum over the leaves below it) is largest"),
    Misconception("next_level", lambda c, e: _greedy_at(c, c.step + 1),
                  "step is 0-based: at step l measure a node of level l (the root at step 0)"),
    Misconception("prev_level", lambda c, e: _greedy_at(c, c.step - 1),
                  "step is 0-based: at step l measure a node of level l (the root at step 0)"),
    Misconception("min", _least_massive, "take the node with the largest mass (argmax), not the smallest"),
)


def _greedy_mismatch(c, yours, expected) -> str:
    wrong = (yours != expected).nonzero().flatten()
    b = int(wrong[0])
    return (f"for context {b} at step {c.step} of {c.tree!r} you chose node {_fmt(float(yours[b]))}, "
            f"greedy measures node {int(expected[b])} ({len(wrong)} of {c.batch} contexts differ)")


_GREEDY = Check(
    name="check_greedy_action",
    cases=_greedy_cases,
    answer=lambda student, c: _tensor(_call_on(student, c), "nodes", (c.batch,), "(B,)"),
    reference=lambda c: greedy_action(c.tree, c.log_w, c.step).double(),
    error=lambda yours, expected: None,
    passes=lambda c, yours, expected, error: _equal(c, yours, expected),
    same=_equal,
    misconceptions=_GREEDY_MISCONCEPTIONS,
    fallback_hint=lambda c, yours, expected: (
        f"sum the leaf probabilities in blocks of 2^(K - {c.step}) leaves (one block per node of level "
        f"{c.step}), take the argmax and add {c.offset}"
    ),
    mismatch=_greedy_mismatch,
    summary=lambda o, progress: f"your greedy rule picks the most massive node on {progress.cases} (tree, step) cases",
)


def check_greedy_action(student_fn: Callable, *, seed: int = 0, batch: int = 64) -> CheckResult:
    """Check ``student_fn(tree, log_w, step) -> nodes``, the greedy "follow the most probable
    path" rule.

    ``log_w (B, 2^K)`` are unnormalised leaf log-weights (any real numbers; leaves in the order
    of :attr:`fvlib.priors.TreePrior.all_signs`), ``step`` is the 0-based layer index with
    ``step < K``. The answer is, for each context, the node of level ``step`` with the largest
    posterior *mass* (the summed probability of the leaves below it), as a heap-order node id,
    shape ``(B,)``. Reference: :func:`fvlib.theory.posteriors.greedy_action`. Random log-weights on trees
    of depth 3 and 4, every step. Recognised mistakes: the position within the level instead of
    the node id, the path of the single most probable leaf, the wrong level.
    """
    _require_callable("check_greedy_action", student_fn, "fn(tree, log_w, step) -> nodes")
    check_int("batch", batch, 1)
    return _run(_GREEDY, student_fn, seed=seed, batch=batch)


# ----------------------------------------------------------------------------------------
# 6. Noise-free closed forms
# ----------------------------------------------------------------------------------------
_NOISEFREE_CASES = ((6, 0.5), (5, 0.7), (4, 0.3), (7, 0.9))


def _nonadaptive_floor(tree, budget):
    """The closed form without the partial level (a common slip): budget rounded down to 2^m - 1."""
    m = (budget + 1).bit_length() - 1
    return float(sum(tree.alpha**k for k in range(m, tree.depth)))


def _noisefree_cases(options):
    for depth, alpha in _NOISEFREE_CASES:
        tree = TreePrior(depth, alpha)
        for budget in range(1, min(tree.dim, 20) + 1):
            yield Case(tree=tree, budget=budget, rtol=options.rtol, args=(tree, budget), what=f"{tree!r}, budget={budget}")


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
    answer=lambda student, c: _scalar(_call_on(student, c), "loss"),
    reference=lambda c: noisefree_adaptive_loss(c.tree, c.budget),
    error=_absolute_difference,
    passes=lambda c, yours, expected, error: error <= c.rtol * max(abs(expected), 1.0) + 1e-12,
    same=lambda c, yours, wrong: abs(yours - wrong) <= 1e-9 * max(abs(wrong), 1.0),
    misconceptions=_ADAPTIVE_MISCONCEPTIONS,
    fallback_hint="sum_{k >= L} alpha^k",
    mismatch=lambda c, yours, expected: f"for {c.what} your loss is {_fmt(yours)}, expected {_fmt(expected)}",
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
    _require_callable("check_noisefree_loss", student_fn, "fn(tree, budget) -> loss")
    if kind not in _NOISEFREE:
        raise ValueError(f"kind must be 'adaptive' or 'nonadaptive', got {kind!r}")
    check_number("rtol", rtol, 0)
    return _run(_NOISEFREE[kind], student_fn, kind=kind, rtol=rtol)


# ----------------------------------------------------------------------------------------
# 7. The DP value
# ----------------------------------------------------------------------------------------
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
                  lambda c: f"a layer off by one: the recursion runs over {c.n_layers} measurements, not {c.n_layers + 1}"),
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
    return (f"for {c.what} your value is {_fmt(yours)}, the optimal risk is {_fmt(expected)} (greedy {_fmt(greedy)}; "
            f"tolerance {_fmt(_dp_tolerance(c, expected))})")


def _dp_answer(student, c) -> float:
    return _scalar(_call_on(student, c) if callable(student) else student, "DP value")


_DP = Check(
    name="check_dp_value",
    cases=_dp_cases,
    answer=_dp_answer,
    reference=lambda c: dp_value(c.tree, c.n_layers, c.tau, **c.rule),
    error=_absolute_difference,
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
    ``fn(tree, n_layers, tau) -> float``, run on :data:`DP_CASES` (depth 2-3, one or two
    layers, ``tau`` in {0.1, 0.5, 0.6}). Note that ``tau`` is the noise *standard deviation*
    here, as in :func:`fvlib.theory.dp.dp_value` (the reference, 48-point Gauss-Hermite rule).

    Tolerance: ``max(rtol * reference, atol)`` (3%, at least 0.003). A correct DP with another
    quadrature (16 or more Gauss-Hermite points, or 32 or more grid points) is within 2.2% on
    these cases; 12 Hermite points can be 3% off (the observation integral needs care, see
    chapter 4). The greedy policy is 10%, 13% and 260% worse on the three discriminating cases. Recognised answers: greedy, non-adaptive
    (heap order), the prior risk (no measurement), one layer too few or too many, ``tau^2``
    used as the std, and values below the optimum (impossible: check the quadrature weights).
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
                f"check_dp_value needs a number or a function fn(tree, n_layers, tau) -> float, got {_describe(student)}"
            ) from None
        check_int("depth", depth, 1, 3)
        check_int("n_layers", n_layers, 1, 3)
        check_number("tau", tau, 0, low_open=True)
        TreePrior(depth, alpha)  # validates alpha
        cases = ((depth, alpha, n_layers, tau),)
    check_number("rtol", rtol, 0)
    check_number("atol", atol, 0)
    return _run(_DP, student, cases=cases, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------------------
# 8. The theory key-patching heatmap
# ----------------------------------------------------------------------------------------
#: Default patching cases ``(depth, n_layers, n_ctx, noise_std)``; K != L in the second, so a
#: transposed heatmap shows in its shape.
PATCHING_CASES = ((3, 3, 32, 0.5), (4, 3, 64, 0.25))


def ideal_patching_mask(depth: int, n_layers: int) -> torch.Tensor:
    """The ideal key-patching pattern as a boolean ``(K, L)`` mask: ``mask[m - 1, l - 1]`` is
    ``True`` (the patch changes what the target measures) exactly when ``l > m``.

    A donor path that splits off at level ``m`` shares the nodes of levels ``0..m-1`` with the
    target. In the ideal adaptive model layer ``l`` measures the path node of level ``l - 1``, so
    donor keys at layers ``l <= m`` route the target to its own node (no effect) and at
    ``l > m`` to a node off its path. That wastes one layer, not every level below it: a later
    outcome reveals the skipped sign, so without noise (and ``L = K``) the expected cost is only
    ``alpha^(K-1) / 2^(K-l)`` (:func:`fvlib.theory.patching.noisefree_patching_loss`).
    """
    check_int("depth", depth, 1)
    check_int("n_layers", n_layers, 1)
    m = torch.arange(1, depth + 1)[:, None]
    l = torch.arange(1, n_layers + 1)[None, :]
    return l > m


# ----- the qualitative mask -------------------------------------------------------------
def _mask_cases(options):
    """The one case: the student's own mask, whose shape ``(K, L)`` sets the reference's."""
    try:
        mask = torch.as_tensor(options.mask)
    except Exception:  # noqa: BLE001
        raise _Fail(f"expected a boolean (K, L) mask, got {_describe(options.mask)}", "return a torch.bool tensor") from None
    if mask.ndim != 2:
        raise _Fail(f"your mask has shape {tuple(mask.shape)}, expected a (K, L) matrix", "rows are split levels m, columns layers l")
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
                  "at l = m the patched layer measures a node of level m - 1, which donor and target still share: no effect"),
    Misconception("transposed", lambda c, e: torch.arange(1, c.depth + 1)[:, None] > torch.arange(1, c.n_layers + 1)[None, :],
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
    passes=lambda c, yours, expected, error: _equal(c, yours, expected),
    same=_equal,
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
                   seed=options.seed, z=options.z, atol=options.atol, args=(tree, N, sigma, L, options.contexts, options.seed),
                   what=(f"{tree!r}, n_ctx={N}, noise_std={sigma}, n_layers={L}, contexts={options.contexts}, "
                         f"seed={options.seed}"))


def _read_heatmap(student, c) -> torch.Tensor:
    """The student's ``(K, L)`` heatmap; its own standard errors, when it returned a
    :class:`~fvlib.theory.patching.PatchingResult`, are kept as ``c.student_stderr``."""
    raw = _call_on(student, c) if callable(student) else student
    own = isinstance(raw, PatchingResult) and isinstance(raw.stderr, torch.Tensor)
    c.student_stderr = raw.stderr.double() if own else None
    return _tensor(raw, "heatmap", (c.depth, c.n_layers), "(K, L) = (split levels, layers)")


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
    m, l = _argmax2((yours - ref.loss).abs() / tolerance)
    return (f"cell (split level m = {m}, layer l = {l}) of your heatmap is {_fmt(float(yours[m - 1, l - 1]))}, "
            f"expected {_fmt(float(ref.loss[m - 1, l - 1]))} +- {_fmt(float(ref.stderr[m - 1, l - 1]))} "
            f"(tolerance {_fmt(float(tolerance[m - 1, l - 1]))}) for {c.what}")


_PATCHING = Check(
    name="check_patching_sweep",
    cases=_heatmap_cases,
    answer=_read_heatmap,
    reference=lambda c: theory_patching_sweep(c.tree, c.n_ctx, c.noise_std, c.n_layers, contexts=c.contexts, seed=c.seed),
    error=lambda yours, ref: _largest_difference(yours, ref.loss),
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
            f"a (K, L) heatmap or a boolean (K, L) mask, got {_describe(student)}"
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
      whose paths split at level ``m``; run on :data:`PATCHING_CASES`;
    * a numeric ``(K, L)`` heatmap (or ``PatchingResult``) computed for ``TreePrior(depth, 0.5)``,
      ``n_ctx``, ``noise_std``, ``n_layers`` with at least ``contexts`` pairs per split level;
    * a *boolean* ``(K, L)`` mask of the cells where the patch changes what the target
      measures: the qualitative shape, compared with :func:`ideal_patching_mask` (``l > m``).

    Reference: :func:`fvlib.theory.patching.theory_patching_sweep` with ``contexts`` pairs and
    ``seed``. A numeric answer passes when every cell is within
    ``z * sqrt(2) * stderr + atol`` of the reference (``sqrt(2)``: the student's heatmap has its
    own Monte Carlo error of about the same size). Recognised mistakes: a transposed heatmap,
    the loss scored against the donor's ``theta``, layers or split levels off by one, a patch
    that changed nothing.
    """
    given = _given_heatmap(student)
    if isinstance(given, torch.Tensor) and given.dtype == torch.bool:
        return _run(_PATCHING_MASK, None, mask=given)
    for name, value in (("contexts", contexts), ("depth", depth), ("n_layers", n_layers), ("n_ctx", n_ctx)):
        check_int(name, value, 1)
    if contexts < 50:
        raise ValueError(f"contexts must be at least 50 for a meaningful Monte Carlo comparison, got {contexts!r}")
    check_number("noise_std", noise_std, 0)
    check_number("z", z, 0)
    check_number("atol", atol, 0)
    cases = PATCHING_CASES if given is None else ((depth, n_layers, n_ctx, noise_std),)
    return _run(_PATCHING, student if given is None else given, cases=cases, contexts=contexts, seed=seed, z=z, atol=atol)
