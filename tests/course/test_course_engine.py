"""fvlib.course.engine: the result object, and the one runner on a toy check (a passed run, a
named misconception, the fallback hint, a student function that raises, a complex answer)."""

import pytest
import torch
from course_results import failed_with

from fvlib.course import CheckResult, check_sufficient_statistic
from fvlib.course.engine import Case, Check, Misconception, absolute_difference, call_on, read_scalar, run_check

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

#: A toy check: the student squares a number.
SQUARE = Check(
    name="check_square",
    cases=lambda options: (Case(x=x, args=(x,), what=f"x = {x}") for x in (1.5, -2.0, 3.0)),
    answer=lambda student, c: read_scalar(call_on(student, c), "square"),
    reference=lambda c: c.x**2,
    error=absolute_difference,
    passes=lambda c, yours, expected, error: error <= 1e-12,
    same=lambda c, yours, wrong: abs(yours - wrong) <= 1e-12,
    misconceptions=(Misconception("doubled", lambda c, e: 2 * c.x, "square, do not double"),),
    fallback_hint="x * x",
    mismatch=lambda c, yours, expected: f"for {c.what} yours is {yours}, expected {expected}",
    summary=lambda options, progress: f"squares on {progress.cases} cases",
)


def test_check_result_reads_well():
    good = CheckResult("check_x", True, "all fine", max_error=0.0, cases=2)
    bad = CheckResult("check_x", False, "coordinate 5 differs", "use tau^2")
    assert good and not bad
    assert str(good) == "Correct: all fine"
    assert str(bad) == "Not yet: coordinate 5 differs; hint: use tau^2"
    assert "Correct" in good._repr_html_() and "Hint" in bad._repr_html_()
    assert "<script>" not in CheckResult("c", False, "<script>", "x")._repr_html_()


def test_the_runner_passes_names_and_falls_back():
    right = run_check(SQUARE, lambda x: x * x)
    assert right and str(right) == "Correct: squares on 3 cases" and right.cases == 3 and right.max_error == 0.0
    doubled = run_check(SQUARE, lambda x: 2 * x)
    assert failed_with(doubled, "doubled", "x = 1.5", "square, do not double") and doubled.cases == 1
    cubed = run_check(SQUARE, lambda x: x**3)
    assert failed_with(cubed, None, "x = 1.5", "x * x")
    assert cubed.details == {"case": 1, "diagnosis": None}


def test_the_runner_turns_student_errors_into_failures():
    assert failed_with(run_check(SQUARE, lambda x: 1 / 0), None, "ZeroDivisionError", "x = 1.5")
    assert failed_with(run_check(SQUARE, lambda x: None), None, "None", "one number")
    assert failed_with(run_check(SQUARE, lambda x: float("nan")), None, "nan")


def test_a_complex_answer_is_not_called_correct():
    """A complex tensor whose real part is right is a failure that says it is complex."""
    def ghat_right(x, y):
        return torch.einsum("bn,bnd->bd", y, x) / x.shape[1]

    result = check_sufficient_statistic(lambda x, y: ghat_right(x, y).to(torch.complex128) + 1e-3j)
    assert failed_with(result, None, "complex")
