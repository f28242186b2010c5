"""fvlib.course: every check passes a right student answer, fails plausible wrong ones with a
message that names the problem, and turns bad input into a clear failure or ValueError."""

import math

import pytest
import torch

from fvlib import TreePrior, make_generator
from fvlib.course import (
    CheckResult,
    check_channel_tau2,
    check_dp_value,
    check_gaussian_posterior,
    check_greedy_action,
    check_noisefree_loss,
    check_patching_sweep,
    check_posterior,
    check_sufficient_statistic,
    ideal_patching_mask,
)
from fvlib.theory import (FiniteSampleChannel, channel_tau2, dp_value, greedy_value, patching_pairs, run_greedy,
                          theory_patching_sweep)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def failed_with(result: CheckResult, diagnosis: str | None = None, *words: str) -> bool:
    text = str(result).lower()
    ok = not result and text.startswith("not yet") and all(w.lower() in text for w in words)
    return ok and (diagnosis is None or result.details.get("diagnosis") == diagnosis)


# ----- students written from scratch (not calling the reference) -------------------------
def tau2_right(prior, n_ctx, noise_std):
    return (prior.energy + noise_std**2) / n_ctx


def ghat_right(x, y):
    return torch.einsum("bn,bnd->bd", y, x) / x.shape[1]


def _log_weights(tree, nodes, phis, tau2, quadratic=True):
    t = tree.leaf_thetas[:, nodes]  # (J, B, L)
    terms = phis * t - (0.5 * t**2 if quadratic else 0.0)
    return (terms / tau2).sum(-1).T  # (B, J)


def posterior_right(tree, nodes, phis, tau2):
    return torch.softmax(_log_weights(tree, nodes, phis, tau2), -1) @ tree.leaf_thetas


def gauss_right(cov, W, phi, tau2):
    S = W @ cov @ W.T + tau2 * torch.eye(W.shape[0], dtype=torch.float64)
    gain = torch.linalg.solve(S, W @ cov).T
    return phi @ gain.T, cov - gain @ W @ cov


def greedy_right(tree, log_w, step):
    probs = torch.softmax(log_w, -1)
    return probs.reshape(probs.shape[0], 2**step, -1).sum(-1).argmax(-1) + 2**step - 1


def adaptive_right(tree, L):
    return sum(tree.alpha**k for k in range(L, tree.depth))


def nonadaptive_right(tree, M):
    if M >= tree.dim:
        return 0.0
    m = int(math.log2(M + 1))
    r = M - (2**m - 1)
    return tree.alpha**m * (1 - r / 2**m) + sum(tree.alpha**k for k in range(m + 1, tree.depth))


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


def make_patching_student(score="target", forced_key=lambda l: l, transpose=False, patch=True):
    def student(tree, n_ctx, noise_std, n_layers, contexts, seed):
        gen = make_generator(seed + 1000)  # other random pairs than the reference
        tau2 = channel_tau2(tree, n_ctx, noise_std)
        out = torch.zeros(tree.depth, n_layers, dtype=torch.float64)
        for m in range(1, tree.depth + 1):
            target, donor = patching_pairs(tree, contexts, m, n_ctx, noise_std, gen)
            t_chan = FiniteSampleChannel(target.to("cpu", torch.float64).sufficient_statistic())
            d_chan = FiniteSampleChannel(donor.to("cpu", torch.float64).sufficient_statistic())
            d_nodes = run_greedy(tree, d_chan, n_layers, tau2).nodes
            truth = (target if score == "target" else donor).theta.double()
            for l in range(1, n_layers + 1):
                forced = {forced_key(l): d_nodes[:, l - 1]} if patch else None
                theta_hat = run_greedy(tree, t_chan, n_layers, tau2, forced=forced).theta_hat
                out[m - 1, l - 1] = ((theta_hat - truth) ** 2).sum(-1).mean()
        return out.T if transpose else out

    return student


# ----- the result object -------------------------------------------------------------------
def test_check_result_reads_well():
    good = CheckResult("check_x", True, "all fine", max_error=0.0, cases=2)
    bad = CheckResult("check_x", False, "coordinate 5 differs", "use tau^2")
    assert good and not bad
    assert str(good) == "Correct: all fine"
    assert str(bad) == "Not yet: coordinate 5 differs; hint: use tau^2"
    assert "Correct" in good._repr_html_() and "Hint" in bad._repr_html_()
    assert "<script>" not in CheckResult("c", False, "<script>", "x")._repr_html_()


# ----- channel noise ---------------------------------------------------------------------------
def test_tau2_right_and_wrong():
    assert check_channel_tau2(tau2_right)
    assert failed_with(check_channel_tau2(lambda p, n, s: (p.energy + s) / n), "sigma", "sigma^2")
    assert failed_with(check_channel_tau2(lambda p, n, s: p.energy / n), "no_sigma", "label noise")
    assert failed_with(check_channel_tau2(lambda p, n, s: math.sqrt(tau2_right(p, n, s))), "tau", "standard deviation")
    assert failed_with(check_channel_tau2(lambda p, n, s: (p.dim + s**2) / n), "dimension", "energy")


def test_sufficient_statistic_right_and_wrong():
    assert check_sufficient_statistic(ghat_right)
    result = check_sufficient_statistic(lambda x, y: torch.einsum("bn,bnd->bd", y, x))
    assert failed_with(result, "sum", "context", "coordinate", "divide")


# ----- the tree posterior ----------------------------------------------------------------------
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
    assert failed_with(result, diagnosis, "posterior mean of context", "coordinate", "yours", "expected", *words), result


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


# ----- the Gaussian posterior ------------------------------------------------------------------
def test_gaussian_posterior_right_and_wrong():
    assert check_gaussian_posterior(gauss_right)

    def no_prior(cov, W, phi, tau2):
        return phi @ torch.linalg.pinv(W).T, gauss_right(cov, W, phi, tau2)[1]

    assert failed_with(check_gaussian_posterior(no_prior), "no_prior", "least squares", "posterior mean")
    tau = check_gaussian_posterior(lambda c, W, p, t2: gauss_right(c, W, p, math.sqrt(t2)))
    assert failed_with(tau, "tau_not_tau2", "tau2")
    prior_cov = check_gaussian_posterior(lambda c, W, p, t2: (gauss_right(c, W, p, t2)[0], c))
    assert failed_with(prior_cov, "prior_cov", "posterior covariance")
    assert failed_with(check_gaussian_posterior(lambda c, W, p, t2: gauss_right(c, W, p, t2)[0]), None, "pair")


# ----- the greedy action -----------------------------------------------------------------------
def test_greedy_action_right_and_wrong():
    assert check_greedy_action(greedy_right)
    no_offset = check_greedy_action(lambda tree, lw, step: greedy_right(tree, lw, step) - (2**step - 1))
    assert failed_with(no_offset, "no_offset", "node ids")

    def leaf_path(tree, log_w, step):
        return tree.path_nodes(tree.all_signs[log_w.argmax(-1)])[:, step]

    assert failed_with(check_greedy_action(leaf_path), "leaf_path", "most probable leaf", "total")
    next_level = check_greedy_action(lambda tree, lw, step: greedy_right(tree, lw, min(step + 1, tree.depth - 1)))
    assert failed_with(next_level, "next_level", "0-based")


# ----- noise-free closed forms -----------------------------------------------------------------
def test_noisefree_right_and_wrong():
    assert check_noisefree_loss(adaptive_right)
    assert check_noisefree_loss(nonadaptive_right, "nonadaptive")
    off = check_noisefree_loss(lambda tree, L: sum(tree.alpha**k for k in range(L + 1, tree.depth)))
    assert failed_with(off, "off_by_one_up", "off by one")
    no_partial = check_noisefree_loss(lambda tree, M: adaptive_right(tree, int(math.log2(M + 1))), "nonadaptive")
    assert failed_with(no_partial, "no_partial_level", "partial level")
    swapped = check_noisefree_loss(nonadaptive_right, "adaptive")
    assert failed_with(swapped, "other_formula", "swap")
    with pytest.raises(ValueError, match="kind"):
        check_noisefree_loss(adaptive_right, "greedy")


# ----- the DP value ----------------------------------------------------------------------------
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
    assert failed_with(check_dp_value(lambda tree, L, tau: dp_right(tree, L, tau * tau)), "tau2_as_tau", "standard deviation")
    assert failed_with(check_dp_value(lambda tree, L, tau: tree.energy), "no_measurement", "prior risk")
    assert failed_with(check_dp_value(0.40), None, "below the optimum")
    with pytest.raises(ValueError, match="'abc'"):
        check_dp_value("abc")
    with pytest.raises(ValueError, match="depth"):
        check_dp_value(0.5, depth=5)
    with pytest.raises(ValueError, match="tau"):
        check_dp_value(0.5, tau=-1.0)


# ----- the patching heatmap --------------------------------------------------------------------
def test_patching_right_function_and_heatmap():
    result = check_patching_sweep(make_patching_student())
    assert result and result.cases == 2, result
    heatmap = theory_patching_sweep(TreePrior(3, 0.5), 32, 0.5, 3, contexts=1000, seed=7)
    assert check_patching_sweep(heatmap)  # a PatchingResult from other pairs
    assert check_patching_sweep(heatmap.loss.numpy())


@pytest.mark.parametrize(
    "kwargs, diagnosis, words",
    [
        ({"score": "donor"}, "donor_scored", ("target",)),
        ({"transpose": True}, "transposed", ("transposed",)),
        ({"patch": False}, "no_effect", ("forced",)),
    ],
)
def test_patching_wrong_answers_are_named(kwargs, diagnosis, words):
    result = check_patching_sweep(make_patching_student(**kwargs))
    assert failed_with(result, diagnosis, "split level m", "layer l", *words), result


def test_patching_zero_based_layer_fails():
    # forced={l - 1: ...}: layer 1 is never patched and layer l - 1 gets the donor's layer-l node
    result = check_patching_sweep(make_patching_student(forced_key=lambda l: l - 1))
    assert failed_with(result, None, "split level m", "layer l", "expected"), result


def test_patching_qualitative_mask():
    assert check_patching_sweep(ideal_patching_mask(4, 3))
    m = torch.arange(1, 4)[:, None]
    l = torch.arange(1, 4)[None, :]
    assert failed_with(check_patching_sweep(l >= m), "l_ge_m", "l = m")
    assert failed_with(check_patching_sweep(m > l), "transposed", "rows")


def test_patching_bad_input():
    assert failed_with(check_patching_sweep(torch.zeros(2, 3)), None, "shape (2, 3)")
    assert failed_with(check_patching_sweep(lambda *a: torch.zeros(3)), None, "shape (3,)")
    with pytest.raises(ValueError, match="'heatmap'"):
        check_patching_sweep("heatmap")
    with pytest.raises(ValueError, match="contexts"):
        check_patching_sweep(make_patching_student(), contexts=10)


def test_a_complex_answer_is_not_called_correct():
    """A complex tensor whose real part is right is a failure that says it is complex."""
    result = check_sufficient_statistic(lambda x, y: ghat_right(x, y).to(torch.complex128) + 1e-3j)
    assert failed_with(result, None, "complex")
