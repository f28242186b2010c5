"""fvlib.course.posterior: the exact tree posterior (mean and leaf probabilities), right, wrong
and misused."""

import math

import pytest
import torch
from course_results import failed_with

from fvlib.course import check_posterior

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def _log_weights(tree, nodes, phis, tau2, quadratic=True):
    t = tree.leaf_thetas[:, nodes]  # (J, B, L)
    terms = phis * t - (0.5 * t**2 if quadratic else 0.0)
    return (terms / tau2).sum(-1).T  # (B, J)


def posterior_right(tree, nodes, phis, tau2):
    return torch.softmax(_log_weights(tree, nodes, phis, tau2), -1) @ tree.leaf_thetas


def test_posterior_right_mean_and_probs():
    result = check_posterior(posterior_right)
    assert result and result.cases == 4 and result.max_error < 1e-10
    probs = check_posterior(lambda tree, n, p, t2: torch.softmax(_log_weights(tree, n, p, t2), -1), output="probs")
    assert probs, probs


@pytest.mark.parametrize(
    "student, diagnosis, words",
    [
        (lambda tree, n, p, t2: posterior_right(tree, n, p, math.sqrt(t2)), "tau_not_tau2", ("tau2",)),
        (lambda tree, n, p, t2: torch.softmax(_log_weights(tree, n, p, t2, quadratic=False), -1) @ tree.leaf_thetas,
         "no_quadratic", ("t^2",)),
        (lambda tree, n, p, t2: posterior_right(tree, n[:, -1:], p[:, -1:], t2), "last_only", ("every measurement",)),
        (lambda tree, n, p, t2: tree.leaf_thetas[_log_weights(tree, n, p, t2).argmax(-1)], "map", ("MAP",)),
    ],
)
def test_posterior_wrong_answers_are_named(student, diagnosis, words):
    result = check_posterior(student)
    expected_words = ("posterior mean of context", "coordinate", "yours", "expected", *words)
    assert failed_with(result, diagnosis, *expected_words), result


def test_posterior_unnormalised_probs():
    result = check_posterior(lambda tree, n, p, t2: torch.exp(_log_weights(tree, n, p, t2)), output="probs")
    assert failed_with(result, "unnormalised", "leaf", "sums to 1"), result


def test_posterior_bad_returns_and_misuse():
    def unfinished(tree, nodes, phis, tau2):
        raise NotImplementedError("Student exercise: compute the posterior mean")

    assert failed_with(check_posterior(unfinished), None, "NotImplementedError", "template")
    assert failed_with(check_posterior(lambda *a: None), None, "returned None", "return")
    assert failed_with(check_posterior(lambda t, n, p, t2: torch.zeros(3)), None, "shape (3,)", "(B, D)")
    assert failed_with(check_posterior(lambda t, n, p, t2: posterior_right(t, n, p, t2).T), None, "transposed")
    probs = lambda t, n, p, t2: torch.softmax(_log_weights(t, n, p, t2), -1)  # noqa: E731
    assert failed_with(check_posterior(probs), None, "(B, 2^K)", "output='probs'")
    assert failed_with(check_posterior(lambda t, n, p, t2: posterior_right(t, n, p, t2) * float("nan")), None, "NaN")
    assert failed_with(check_posterior(lambda t, n, p, t2: n[:, 99]), None, "IndexError")
    assert failed_with(check_posterior(lambda t, n, p, t2: "mean"), None, "str", "tensor")
    with pytest.raises(ValueError, match="itself"):
        check_posterior(torch.zeros(4, 7))
    with pytest.raises(ValueError, match="output"):
        check_posterior(posterior_right, output="leaves")
