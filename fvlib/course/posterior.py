"""The check of the exact tree posterior after coordinate measurements (its mean or leaf
probabilities).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .._checks import check_int, check_number
from ..priors import TreePrior
from ..task import make_generator
from ..theory import GaussianChannel, leaf_values_at, log_likelihood_nodes, posterior_probs, tree_posterior_mean
from .engine import (
    Case,
    Check,
    CheckResult,
    Fail,
    Misconception,
    call_on,
    close,
    fmt,
    largest_difference,
    read_tensor,
    require_callable,
    run_check,
    worst,
)

__all__ = ["check_posterior"]


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
    raw = call_on(student, c)
    if c.output == "mean" and isinstance(raw, torch.Tensor) and tuple(raw.shape) == (c.batch, c.tree.num_leaves):
        raise Fail(
            f"your function returned shape {tuple(raw.shape)} = (B, 2^K), leaf probabilities, "
            f"but check_posterior(output='mean') wants the posterior mean of shape (B, D) = {(c.batch, c.tree.dim)}",
            "multiply by tree.leaf_thetas (or pass output='probs' to check the probabilities)",
        )
    noun, _, shape_text = _POSTERIOR_OUTPUTS[c.output]
    shape = (c.batch, c.tree.dim) if c.output == "mean" else (c.batch, c.tree.num_leaves)
    return read_tensor(raw, noun, shape, shape_text)


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
                  lambda c, e: _from_log_weights(
                      c, log_likelihood_nodes(c.tree, c.nodes[:, -1:], c.phis[:, -1:], c.tau2)),
                  "use every measurement of the context: add the log-likelihoods of all L of them"),
    Misconception("first_only",
                  lambda c, e: _from_log_weights(
                      c, log_likelihood_nodes(c.tree, c.nodes[:, :1], c.phis[:, :1], c.tau2)),
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
    index, _ = worst(yours, expected)
    noun, column, _ = _POSTERIOR_OUTPUTS[c.output]
    b, d = index
    return (f"the {noun} of context {b} differs at {column} {d} (yours {fmt(float(yours[index]))}, "
            f"expected {fmt(float(expected[index]))}) in case {c.number} of {len(_POSTERIOR_CASES)} "
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
    error=largest_difference,
    passes=lambda c, yours, expected, error: error <= c.atol,
    same=lambda c, yours, wrong: close(yours, wrong, max(c.atol, 1e-6)),
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
    require_callable("check_posterior", student_fn, "fn(tree, nodes, phis, tau2)")
    if output not in _POSTERIOR_OUTPUTS:
        raise ValueError(f"output must be 'mean' or 'probs', got {output!r}")
    check_int("batch", batch, 1)
    check_number("atol", atol, 0)
    return run_check(_POSTERIOR, student_fn, output=output, seed=seed, batch=batch, atol=atol)

