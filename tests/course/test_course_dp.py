"""fvlib.course.dp: the DP value, right (other quadratures too) and wrong."""

import pytest
import torch
from course_results import failed_with

from fvlib.course import check_dp_value
from fvlib.theory import dp_value, greedy_value

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def dp_right(tree, n_layers, tau, points=161):
    """An independent DP: brute-force recursion, a uniform grid for each observation."""
    leaves = tree.leaf_thetas

    def value(log_w, steps):
        if steps == 0:
            mean = torch.softmax(log_w, -1) @ leaves
            return tree.energy - (mean**2).sum(-1)
        best = None
        for a in range(tree.dim):
            t = leaves[:, a]
            c = float(t.abs().max())
            phi = torch.linspace(-c - 7 * tau, c + 7 * tau, points, dtype=torch.float64)
            lik = torch.exp(-((phi[:, None] - t) ** 2) / (2 * tau**2))  # (P, J)
            w = (torch.softmax(log_w, -1)[..., None, :] * lik).sum(-1)
            w = w / w.sum(-1, keepdim=True)
            child = log_w[..., None, :] + (phi[:, None] * t - 0.5 * t**2) / tau**2
            v = (w * value(child, steps - 1)).sum(-1)
            best = v if best is None else torch.minimum(best, v)
        return best

    return float(value(torch.zeros(tree.num_leaves, dtype=torch.float64), n_layers))


def test_dp_value_right_implementations_pass():
    assert check_dp_value(dp_right)
    # the reference DP with other quadratures is within the tolerance
    assert check_dp_value(lambda tree, L, tau: dp_value(tree, L, tau, quad_points=16))
    assert check_dp_value(lambda tree, L, tau: dp_value(tree, L, tau, quad_points=32, rule="grid"))
    assert check_dp_value(0.53)  # K = 3, L = 2, tau = 0.6: 0.529


def test_dp_value_greedy_and_other_mistakes_fail():
    greedy = check_dp_value(lambda tree, L, tau: greedy_value(tree, L, tau))
    assert failed_with(greedy, "greedy", "greedy", "off-path")
    assert failed_with(check_dp_value(0.580), "greedy", "0.58", "0.5291")
    tau_taken_as_variance = check_dp_value(lambda tree, L, tau: dp_right(tree, L, tau * tau))
    assert failed_with(tau_taken_as_variance, "tau2_as_tau", "standard deviation")
    assert failed_with(check_dp_value(lambda tree, L, tau: tree.energy), "no_measurement", "prior risk")
    assert failed_with(check_dp_value(0.40), None, "below the optimum")
    with pytest.raises(ValueError, match="'abc'"):
        check_dp_value("abc")
    with pytest.raises(ValueError, match="depth"):
        check_dp_value(0.5, depth=5)
    with pytest.raises(ValueError, match="tau"):
        check_dp_value(0.5, tau=-1.0)
