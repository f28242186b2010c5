"""The check engine: how a student's answer is checked, and what the student is told.

Every check is data: a :class:`Check` holds its cases, its reference, how an answer is read
and compared, and its list of :class:`Misconception` rows; one runner, :func:`run_check`,
executes them all and returns a :class:`CheckResult`. To add a recognised mistake, add a row to
the check's misconception table (in the topic's module).

A student function that raises, returns the wrong type or shape, or returns ``NaN`` raises
:class:`Fail` inside the engine (:func:`call_student`, :func:`read_tensor`, :func:`read_scalar`),
which the runner turns into a failed result that says so: nothing the student function does
escapes as a traceback.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from ..theory import PatchingResult

__all__ = [
    "CheckResult",
    "Fail",
    "Case",
    "Misconception",
    "Check",
    "Progress",
    "run_check",
    "require_callable",
    "describe",
    "call_student",
    "call_on",
    "read_tensor",
    "read_scalar",
    "worst",
    "largest_difference",
    "close",
    "equal",
    "absolute_difference",
    "fmt",
    "argmax2",
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


class Fail(Exception):
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
    summary: Callable[[SimpleNamespace, Progress], str]
    details: Callable[[SimpleNamespace], dict] = lambda options: {}
    failure_details: Callable[[Case, Any], dict] = lambda case, expected: {"case": case.number}
    parts: tuple[str, ...] | None = None


@dataclass
class Progress:
    """How far a run got: cases compared, the largest error so far, the last case."""

    cases: int = 0
    max_error: float | None = None
    case: Case | None = None

    def track(self, error: float | None) -> None:
        if error is not None:
            self.max_error = error if self.max_error is None else max(self.max_error, error)


def run_check(check: Check, student, **options) -> CheckResult:
    """Run ``check`` on ``student`` (a function, or a given answer) case by case; the first
    case that differs ends the run with a failed result."""
    options = SimpleNamespace(**options)
    progress = Progress()
    try:
        for number, case in enumerate(check.cases(options), start=1):
            case.number = number
            yours, expected = check.answer(student, case), check.reference(case)
            progress.cases, progress.case = number, case
            for part in check.parts or (None,):
                case.part = part
                _compare(check, case, *_part(yours, expected, part), progress)
    except Fail as fail:
        return CheckResult(check.name, False, fail.message, fail.hint, progress.max_error, progress.cases, fail.details)
    max_error = 0.0 if progress.max_error is None else progress.max_error
    return CheckResult(check.name, True, check.summary(options, progress), "", max_error, progress.cases,
                       check.details(options))


def _part(yours, expected, part):
    return (yours, expected) if part is None else (yours[part], expected[part])


def _compare(check: Check, case: Case, yours, expected, progress: Progress) -> None:
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
    raise Fail(check.mismatch(case, yours, expected), hint,
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
def require_callable(name: str, fn, signature: str) -> None:
    """The check ``name`` misused: ``ValueError`` unless ``fn`` is a function (``signature`` says which)."""
    if callable(fn):
        return
    raise ValueError(
        f"{name} needs your function {signature} itself (not its result), got {describe(fn)}"
    )


def describe(value) -> str:
    """A short description of ``value`` for a message: its type, and its shape or its ``repr``."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"a {type(value).__name__} of shape {tuple(shape)}"
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def call_student(fn: Callable, args: tuple, what: str):
    """Call the student's function; turn every exception into a failed check."""
    try:
        return fn(*args)
    except NotImplementedError as err:
        raise Fail(
            f"your function still raises NotImplementedError({str(err)!r})",
            "replace the `raise NotImplementedError(...)` line of the template with your code",
        ) from None
    except Exception as err:  # noqa: BLE001 - any student error becomes a readable result
        raise Fail(
            f"your function raised {type(err).__name__}: {err} (called with {what})",
            "run your function by hand on these inputs and read the traceback",
            exception=type(err).__name__,
        ) from None


def call_on(student, case: Case):
    """The student's function called on the case's arguments."""
    return call_student(student, case.args, case.what)


def read_tensor(value, what: str, shape: tuple[int, ...], shape_text: str) -> torch.Tensor:
    """The student's return value as a float64 tensor of ``shape``, or a failed check."""
    if isinstance(value, PatchingResult):
        value = value.loss
    if value is None:
        raise Fail(f"your function returned None instead of {what}", "did you forget the `return` statement?")
    try:
        tensor = torch.as_tensor(value).detach().cpu()
    except Exception:  # noqa: BLE001
        tensor = None
    if tensor is not None and tensor.is_complex():
        raise Fail(f"your {what} is complex (dtype {tensor.dtype}), expected real numbers",
                   "keep the computation real: no complex inputs, no square roots or logs of negative numbers")
    try:
        tensor = torch.as_tensor(value).detach().cpu()
        if tensor.dtype == torch.bool:
            tensor = tensor.double()
        tensor = tensor.to(torch.float64)
    except Exception:  # noqa: BLE001
        raise Fail(
            f"your function returned {describe(value)}, expected {what} as a tensor of shape {shape_text} = {shape}",
            "return a torch tensor (a numpy array or nested list works too)",
        ) from None
    if tuple(tensor.shape) != tuple(shape):
        hint = "check which dimension is which"
        if tensor.ndim == len(shape) and tuple(tensor.shape) == tuple(reversed(shape)):
            hint = "your array looks transposed"
        elif tensor.numel() == math.prod(shape):
            hint = f"the right number of entries in the wrong layout: reshape to {shape_text}"
        raise Fail(
            f"your {what} has shape {tuple(tensor.shape)}, expected {shape_text} = {shape}", hint
        )
    if not torch.isfinite(tensor).all():
        bad = int((~torch.isfinite(tensor)).sum())
        raise Fail(
            f"your {what} contains {bad} non-finite value(s) (NaN or inf)",
            "normalise in log space (subtract the maximum, or use torch.logsumexp / torch.softmax) "
            "instead of exponentiating raw log-weights",
        )
    return tensor


def read_scalar(value, what: str) -> float:
    """The student's return value as one finite float, or a failed check."""
    if isinstance(value, PatchingResult) or value is None:
        raise Fail(f"your function returned {describe(value)}, expected {what} as one number",
                   "return a float")
    try:
        number = float(value)
    except Exception:  # noqa: BLE001
        raise Fail(f"your function returned {describe(value)}, expected {what} as one number",
                   "return a float (e.g. `float(x)` or `x.item()`)") from None
    if not math.isfinite(number):
        raise Fail(f"your {what} is {number}", "look for a division by zero or a log of zero")
    return number


def worst(yours: torch.Tensor, expected: torch.Tensor) -> tuple[tuple[int, ...], float]:
    """The index of the largest absolute difference, and that difference."""
    diff = (yours - expected).abs()
    flat = int(diff.argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
    return index, float(diff.max())


def largest_difference(yours: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest absolute difference of two tensors of one shape."""
    return worst(yours, expected)[1]


def close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float = 0.0) -> bool:
    """Same shape, and every entry within ``atol + rtol * |b|``."""
    return a.shape == b.shape and bool(((a - b).abs() <= atol + rtol * b.abs()).all())


def equal(case, yours: torch.Tensor, other: torch.Tensor) -> bool:
    """Every entry equal (``case`` unused: the signature of a check's ``same``)."""
    return bool((yours == other).all())


def absolute_difference(yours: float, expected: float) -> float:
    """``|yours - expected|``."""
    return abs(yours - expected)


def fmt(x: float) -> str:
    """A number in a message: four significant digits."""
    return f"{x:.4g}"


def argmax2(values: torch.Tensor) -> tuple[int, int]:
    """1-based ``(row, column)`` of the largest entry of a matrix."""
    flat = int(values.flatten().argmax())
    return flat // values.shape[1] + 1, flat % values.shape[1] + 1

