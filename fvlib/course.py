"""Automatic checks for the course module's problem sets.

Each ``check_*`` function takes a student's *function* (or, where it says so, a computed
value), runs it on a few seeded random inputs, compares the answers with fvlib's reference
implementation and returns a :class:`CheckResult`. A result is truthy when the answer is
right; it prints (and renders in a notebook) as ``Correct: ...`` or
``Not yet: <what differs, where>; hint: <the likely mistake>``. Where a wrong answer matches a
known misconception (``tau`` instead of ``tau^2``, greedy instead of optimal, a layer index
off by one, ...), the hint names it.

Two kinds of bad input are told apart:

* misuse of the check itself (not a function where one is needed, a bad depth or noise
  level) raises ``ValueError`` naming the bad value;
* a student function that raises, returns the wrong type or shape, or returns ``NaN`` gives a
  *failed* :class:`CheckResult` that says so. Nothing the student function does escapes as a
  traceback.

Conventions (as in the rest of fvlib):

* Tree prior in heap order: root 0, children of ``n`` are ``2n+1`` (sign -1) and ``2n+2``
  (sign +1); level ``k`` holds nodes ``2^k - 1 .. 2^(k+1) - 2``; ``D = 2^K - 1``. Leaves are
  indexed ``0 .. 2^K - 1`` reading the sign path as binary digits (``+1`` is 1), most
  significant first, as in :attr:`fvlib.priors.TreePrior.all_signs`.
* Gaussian channel: a measurement of node ``a`` is ``phi ~ N(theta[a], tau2)``; ``tau2`` is a
  *variance* (:func:`fvlib.theory.closed_forms.channel_tau2`).
* Patching heatmaps: ``loss[m - 1, l - 1]``, rows split levels ``m = 1..K`` (the first level at
  which donor and target paths visit different nodes), columns layers ``l = 1..L`` (1-based,
  as in the hook names ``blocks.{l}``); see :mod:`fvlib.patching`.

Every check is fast (well under a second with fvlib's reference solutions) and deterministic
for a given ``seed``.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from .patching import PatchingResult, theory_patching_sweep
from .priors import GaussianPrior, Prior, TreePrior
from .task import make_generator, sample_task
from .theory import (
    GaussianChannel,
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
# Shared helpers
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


def _tensor(value, what: str, shape: tuple[int, ...], shape_text: str) -> torch.Tensor:
    """The student's return value as a float64 tensor of ``shape``, or a failed check."""
    if isinstance(value, PatchingResult):
        value = value.loss
    if value is None:
        raise _Fail(f"your function returned None instead of {what}", "did you forget the `return` statement?")
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
    diff = (yours - expected).abs()
    flat = int(diff.argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
    return index, float(diff.max())


def _close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float = 0.0) -> bool:
    return a.shape == b.shape and bool(((a - b).abs() <= atol + rtol * b.abs()).all())


def _diagnose(yours, candidates, close) -> tuple[str, str] | None:
    """First ``(label, hint)`` whose candidate answer matches ``yours``; a candidate may be a
    zero-argument callable, evaluated only when reached."""
    for label, candidate, hint in candidates:
        try:
            if callable(candidate):
                candidate = candidate()
            if candidate is not None and close(yours, candidate):
                return label, hint
        except Exception:  # noqa: BLE001 - a diagnosis that cannot be computed is skipped
            continue
    return None


def _result(name: str, run: Callable[[dict], tuple[str, float | None, int, dict]]) -> CheckResult:
    """Run a check body; a ``_Fail`` becomes a failed result."""
    state = {"max_error": None, "cases": 0}
    try:
        message, max_error, cases, details = run(state)
        return CheckResult(name, True, message, "", max_error, cases, details)
    except _Fail as fail:
        return CheckResult(name, False, fail.message, fail.hint, state["max_error"], state["cases"], fail.details)


def _track(state: dict, error: float) -> None:
    state["max_error"] = error if state["max_error"] is None else max(state["max_error"], error)


def _check_positive(name: str, value, integer: bool = False) -> None:
    if integer:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        kind = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")


def _check_tol(name: str, value) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")


def _fmt(x: float) -> str:
    return f"{x:.4g}"


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
    _check_tol("rtol", rtol)

    def run(state):
        for i, (kind, a, b, n, sigma) in enumerate(_TAU2_CASES, start=1):
            prior = _tau2_prior(kind, a, b)
            what = f"prior={prior!r}, n_ctx={n}, noise_std={sigma}"
            yours = _scalar(_call(student_fn, (prior, n, sigma), what), "tau2")
            expected = channel_tau2(prior, n, sigma)
            error = abs(yours - expected)
            _track(state, error)
            state["cases"] = i
            if error > rtol * abs(expected) + 1e-12:
                energy = prior.energy
                candidates = [
                    ("sigma", (energy + sigma) / n, "the label noise enters as its variance sigma^2, not sigma"),
                    ("no_sigma", energy / n, "add the label noise: tau^2 = (E|theta|^2 + sigma^2) / N"),
                    ("dimension", (prior.dim + sigma**2) / n,
                     "use the prior's energy E|theta|^2 (prior.energy), not the dimension D"),
                    ("tau", math.sqrt(expected), "you returned tau, a standard deviation; the check wants the variance tau^2"),
                    ("n_squared", (energy + sigma**2) / n**2, "divide by N once: averaging N tokens divides the variance by N"),
                    ("sqrt_n", (energy + sigma**2) / math.sqrt(n), "divide by N, not sqrt(N): the variance of an average of N terms is 1/N of theirs"),
                    ("no_n", energy + sigma**2, "the average over N tokens divides the variance by N"),
                ]
                found = _diagnose(yours, candidates, lambda y, c: abs(y - c) <= 1e-6 * abs(c) + 1e-12)
                hint = found[1] if found else "tau^2 = (E|theta|^2 + sigma^2) / N, see chapter 2 (what one pooled average knows)"
                raise _Fail(
                    f"for {what} your tau2 is {_fmt(yours)}, expected {_fmt(expected)}",
                    hint, case=i, diagnosis=found[0] if found else None,
                )
        return (f"tau2 agrees with (E|theta|^2 + sigma^2) / N on {len(_TAU2_CASES)} priors", state["max_error"],
                len(_TAU2_CASES), {"rtol": rtol})

    return _result("check_channel_tau2", run)


# ----------------------------------------------------------------------------------------
# 2. The pooled statistic
# ----------------------------------------------------------------------------------------
def check_sufficient_statistic(student_fn: Callable, *, seed: int = 0, atol: float = 1e-5) -> CheckResult:
    """Check ``student_fn(x, y) -> g_hat``: ``x (B, N, D)``, ``y (B, N)`` -> ``(B, D)``.

    Reference: ``g_hat = (1/N) sum_i y_i x_i`` (:meth:`fvlib.task.TaskBatch.sufficient_statistic`),
    on three seeded batches from tree and Gaussian priors (float64). Recognised mistakes: a sum
    instead of a mean, averaging over the wrong axis, dividing by ``D``.
    """
    _require_callable("check_sufficient_statistic", student_fn, "fn(x, y) -> g_hat")
    _check_tol("atol", atol)
    cases = ((TreePrior(3, 0.5), 6, 20), (TreePrior(4, 0.7), 5, 9), (GaussianPrior.isotropic(5), 4, 33))

    def run(state):
        gen = make_generator(seed)
        for i, (prior, B, N) in enumerate(cases, start=1):
            batch = sample_task(prior, B, N, 0.3, gen, dtype=torch.float64)
            what = f"x of shape {tuple(batch.x.shape)}, y of shape {tuple(batch.y.shape)}"
            raw = _call(student_fn, (batch.x.clone(), batch.y.clone()), what)
            yours = _tensor(raw, "g_hat", (B, prior.dim), "(B, D)")
            expected = batch.sufficient_statistic()
            index, error = _worst(yours, expected)
            _track(state, error)
            state["cases"] = i
            if error > atol:
                candidates = [
                    ("sum", expected * N, "divide the sum over tokens by N (a mean, as attention with uniform weights pools)"),
                    ("over_d", expected / prior.dim, "average over the N tokens only, not over the D coordinates"),
                ]
                found = _diagnose(yours, candidates, lambda y, c: _close(y, c, atol * max(1.0, N)))
                hint = found[1] if found else "g_hat[b] = (1/N) * sum_i y[b, i] * x[b, i, :], e.g. torch.einsum('bn,bnd->bd', y, x) / N"
                b, d = index
                raise _Fail(
                    f"g_hat of context {b} differs at coordinate {d} (yours {_fmt(float(yours[index]))}, "
                    f"expected {_fmt(float(expected[index]))}) for {what}",
                    hint, case=i, diagnosis=found[0] if found else None,
                )
        return (f"g_hat = (1/N) sum_i y_i x_i on {len(cases)} batches", state["max_error"], len(cases), {"atol": atol})

    return _result("check_sufficient_statistic", run)


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


def _posterior_reference(tree, nodes, phis, tau2):
    probs = posterior_probs(log_likelihood_nodes(tree, nodes, phis, tau2))
    return probs, tree_posterior_mean(tree, probs)


def _posterior_misconceptions(tree, nodes, phis, tau2, output):
    """Candidate wrong answers for :func:`check_posterior`: ``(label, answer, hint)``."""
    def answer(probs):
        return probs if output == "probs" else tree_posterior_mean(tree, probs)

    def from_log(log_w):
        return answer(posterior_probs(log_w))

    def no_quadratic():
        log_w = torch.zeros(nodes.shape[0], tree.num_leaves, dtype=torch.float64)
        for j in range(nodes.shape[1]):
            log_w = log_w + phis[:, j, None] * leaf_values_at(tree, nodes[:, j]) / tau2
        return from_log(log_w)

    def map_leaf():
        probs = posterior_probs(log_likelihood_nodes(tree, nodes, phis, tau2))
        onehot = torch.nn.functional.one_hot(probs.argmax(-1), tree.num_leaves).double()
        return answer(onehot)

    def lmmse():
        if output == "probs":
            return None
        v = tree.node_variances
        out = torch.zeros(nodes.shape[0], tree.dim, dtype=torch.float64)
        rows = torch.arange(nodes.shape[0])
        for j in range(nodes.shape[1]):
            out[rows, nodes[:, j]] = phis[:, j] * v[nodes[:, j]] / (v[nodes[:, j]] + tau2)
        return out

    def unnormalised():
        if output != "probs":
            return None
        return torch.exp(log_likelihood_nodes(tree, nodes, phis, tau2))

    tau = math.sqrt(tau2)
    candidates = [
        ("tau_not_tau2", lambda: from_log(log_likelihood_nodes(tree, nodes, phis, tau)),
         "you divided by tau where the Gaussian likelihood has the variance tau2 = tau^2: "
         "log p(phi | theta_a = t) = (phi t - t^2 / 2) / tau2 + const"),
        ("tau2_squared", lambda: from_log(log_likelihood_nodes(tree, nodes, phis, tau2**2)),
         "tau2 is already the variance; do not square it again"),
        ("no_quadratic", no_quadratic,
         "keep the -t^2 / 2 term of the log-likelihood: theta_a is 0 for leaves off the node's path "
         "and +-alpha^(k/2) on it, so t^2 differs between leaves and does not cancel"),
        ("last_only", lambda: from_log(log_likelihood_nodes(tree, nodes[:, -1:], phis[:, -1:], tau2)),
         "use every measurement of the context: add the log-likelihoods of all L of them"),
        ("first_only", lambda: from_log(log_likelihood_nodes(tree, nodes[:, :1], phis[:, :1], tau2)),
         "use every measurement of the context, not only the first"),
        ("map", map_leaf,
         "that is the most probable leaf (MAP); the posterior mean averages theta over all leaves, "
         "weighted by their posterior probabilities"),
        ("lmmse", lmmse,
         "that is the linear (per-coordinate shrinkage) estimate; the tree posterior is not Gaussian, "
         "so enumerate the 2^K leaves and weight each by its likelihood"),
        ("unnormalised", unnormalised,
         "normalise the probabilities so that each row sums to 1 (softmax of the log-weights)"),
        ("prior", lambda: answer(torch.full((nodes.shape[0], tree.num_leaves), 1.0 / tree.num_leaves, dtype=torch.float64)),
         "that is the prior; the measurements must move the posterior (did the update get lost?)"),
    ]
    for label, make, hint in candidates:
        yield label, make, hint


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
    if output not in ("mean", "probs"):
        raise ValueError(f"output must be 'mean' or 'probs', got {output!r}")
    _check_positive("batch", batch, integer=True)
    _check_tol("atol", atol)
    noun = "posterior mean" if output == "mean" else "leaf probabilities"
    column = "coordinate" if output == "mean" else "leaf"

    def run(state):
        gen = make_generator(seed)
        for i, (depth, alpha, tau2, n_meas) in enumerate(_POSTERIOR_CASES, start=1):
            tree = TreePrior(depth, alpha)
            nodes, phis = _posterior_inputs(tree, batch, n_meas, tau2, gen)
            what = f"{tree!r}, nodes of shape {tuple(nodes.shape)}, tau2={tau2}"
            raw = _call(student_fn, (tree, nodes.clone(), phis.clone(), tau2), what)
            probs, mean = _posterior_reference(tree, nodes, phis, tau2)
            expected = mean if output == "mean" else probs
            shape_text = "(B, D)" if output == "mean" else "(B, 2^K)"
            if output == "mean" and isinstance(raw, torch.Tensor) and tuple(raw.shape) == (batch, tree.num_leaves):
                raise _Fail(
                    f"your function returned shape {tuple(raw.shape)} = (B, 2^K), leaf probabilities, "
                    f"but check_posterior(output='mean') wants the posterior mean of shape (B, D) = {(batch, tree.dim)}",
                    "multiply by tree.leaf_thetas (or pass output='probs' to check the probabilities)",
                )
            yours = _tensor(raw, noun, tuple(expected.shape), shape_text)
            index, error = _worst(yours, expected)
            _track(state, error)
            state["cases"] = i
            if error > atol:
                found = None
                for label, make, hint in _posterior_misconceptions(tree, nodes, phis, tau2, output):
                    try:
                        candidate = make()
                    except Exception:  # noqa: BLE001
                        continue
                    if candidate is not None and _close(yours, candidate, max(atol, 1e-6)):
                        found = (label, hint)
                        break
                b, d = index
                hint = found[1] if found else (
                    "build the log-weights of the 2^K leaves, add (phi t - t^2/2) / tau2 per measurement with "
                    "t = theta_leaf[node], normalise with a softmax, then average theta over the leaves"
                )
                raise _Fail(
                    f"the {noun} of context {b} differs at {column} {d} (yours {_fmt(float(yours[index]))}, "
                    f"expected {_fmt(float(expected[index]))}) in case {i} of {len(_POSTERIOR_CASES)} "
                    f"(depth {depth}, alpha {alpha}, tau2 {tau2}, {n_meas} measurement(s) per context)",
                    hint, case=i, diagnosis=found[0] if found else None, atol=atol,
                )
        return (
            f"your {noun} matches the exact posterior on {len(_POSTERIOR_CASES)} cases "
            f"({batch} contexts each; max error {state['max_error']:.1e})",
            state["max_error"], len(_POSTERIOR_CASES), {"atol": atol, "output": output},
        )

    return _result("check_posterior", run)


# ----------------------------------------------------------------------------------------
# 4. The Gaussian posterior
# ----------------------------------------------------------------------------------------
def _gaussian_cases(gen: torch.Generator):
    def random_cov(d):
        a = torch.randn(d, d, generator=gen, dtype=torch.float64)
        return a @ a.T / d + 0.1 * torch.eye(d, dtype=torch.float64)

    tree = TreePrior(3, 0.5)
    coords = torch.eye(tree.dim, dtype=torch.float64)[:3]
    yield "the Gaussian twin of TreePrior(3, 0.5), 3 coordinates", tree.second_moment(), coords, 0.05
    yield "a random 4 x 4 covariance, 2 random directions", random_cov(4), torch.randn(2, 4, generator=gen, dtype=torch.float64), 0.3
    yield "a random 5 x 5 covariance, 5 random directions", random_cov(5), torch.randn(5, 5, generator=gen, dtype=torch.float64), 0.1


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
    _check_positive("batch", batch, integer=True)
    _check_tol("atol", atol)

    def run(state):
        gen = make_generator(seed)
        n_cases = 0
        for i, (label, cov, W, tau2) in enumerate(_gaussian_cases(gen), start=1):
            n_cases = i
            prior = GaussianPrior(cov)
            theta = prior.sample(batch, gen)
            phi = theta @ W.T + math.sqrt(tau2) * torch.randn(batch, W.shape[0], generator=gen, dtype=torch.float64)
            what = f"{label} (cov {tuple(cov.shape)}, W {tuple(W.shape)}, phi {tuple(phi.shape)}, tau2={tau2})"
            raw = _call(student_fn, (cov.clone(), W.clone(), phi.clone(), tau2), what)
            if not (isinstance(raw, (tuple, list)) and len(raw) == 2):
                raise _Fail(
                    f"your function returned {_describe(raw)}; expected a pair (mean (B, D), cov (D, D))",
                    "end with `return mean, post_cov`",
                )
            D = cov.shape[0]
            mean = _tensor(raw[0], "posterior mean", (batch, D), "(B, D)")
            post = _tensor(raw[1], "posterior covariance", (D, D), "(D, D)")
            exp_mean, exp_cov = gaussian_posterior(cov, W, phi, tau2)
            state["cases"] = i
            for name, yours, expected in (("posterior covariance", post, exp_cov), ("posterior mean", mean, exp_mean)):
                index, error = _worst(yours, expected)
                _track(state, error)
                if error <= atol + 1e-9 * float(expected.abs().max()):
                    continue
                tau = math.sqrt(tau2)
                wrong_tau_mean, wrong_tau_cov = gaussian_posterior(cov, W, phi, tau)
                lstsq = phi @ torch.linalg.pinv(W).T
                sign_cov = cov + (cov - exp_cov)
                candidates = [
                    ("tau_not_tau2", wrong_tau_cov if name.endswith("covariance") else wrong_tau_mean,
                     "the noise covariance is tau2 * I (tau2 is already a variance): use tau2, not sqrt(tau2)"),
                    ("prior_cov", cov if name.endswith("covariance") else None,
                     "the posterior covariance is smaller than the prior's: C - C W^T (W C W^T + tau2 I)^-1 W C"),
                    ("sign", sign_cov if name.endswith("covariance") else None,
                     "subtract the update: C - C W^T S^-1 W C, not plus"),
                    ("no_prior", lstsq if name.endswith("mean") else None,
                     "that is least squares (pseudo-inverse of W) without the prior; the posterior mean "
                     "shrinks toward 0: C W^T (W C W^T + tau2 I)^-1 phi"),
                    ("prior_mean", torch.zeros_like(exp_mean) if name.endswith("mean") else None,
                     "the posterior mean is not 0: the data phi move it, C W^T (W C W^T + tau2 I)^-1 phi"),
                ]
                found = _diagnose(yours, candidates, lambda y, c: _close(y, c, 1e-6, 1e-6))
                hint = found[1] if found else (
                    "posterior covariance C - C W^T S^-1 W C and mean C W^T S^-1 phi with S = W C W^T + tau2 I "
                    "(chapter 5); use torch.linalg.solve rather than inverting C"
                )
                where = f"entry {index}" if name.endswith("covariance") else f"context {index[0]}, coordinate {index[1]}"
                raise _Fail(
                    f"your {name} differs at {where} (yours {_fmt(float(yours[index]))}, "
                    f"expected {_fmt(float(expected[index]))}) for {label}",
                    hint, case=i, diagnosis=found[0] if found else None,
                )
        return (f"mean and covariance match the Gaussian posterior on {n_cases} cases", state["max_error"], n_cases, {"atol": atol})

    return _result("check_gaussian_posterior", run)


# ----------------------------------------------------------------------------------------
# 5. The greedy action
# ----------------------------------------------------------------------------------------
def check_greedy_action(student_fn: Callable, *, seed: int = 0, batch: int = 64) -> CheckResult:
    """Check ``student_fn(tree, log_w, step) -> nodes``, the greedy "follow the most probable
    path" rule.

    ``log_w (B, 2^K)`` are unnormalised leaf log-weights (any real numbers; leaves in the order
    of :attr:`fvlib.priors.TreePrior.all_signs`), ``step`` is the 0-based layer index with
    ``step < K``. The answer is, for each context, the node of level ``step`` with the largest
    posterior *mass* (the summed probability of the leaves below it), as a heap-order node id,
    shape ``(B,)``. Reference: :func:`fvlib.theory.strategies.greedy_action`. Random log-weights on trees
    of depth 3 and 4, every step. Recognised mistakes: the position within the level instead of
    the node id, the path of the single most probable leaf, the wrong level.
    """
    _require_callable("check_greedy_action", student_fn, "fn(tree, log_w, step) -> nodes")
    _check_positive("batch", batch, integer=True)

    def run(state):
        gen = make_generator(seed)
        count = 0
        for depth in (3, 4):
            tree = TreePrior(depth, 0.5)
            for step in range(depth):
                count += 1
                log_w = 2.0 * torch.randn(batch, tree.num_leaves, generator=gen, dtype=torch.float64)
                what = f"{tree!r}, log_w of shape {tuple(log_w.shape)}, step={step}"
                raw = _call(student_fn, (tree, log_w.clone(), step), what)
                yours = _tensor(raw, "nodes", (batch,), "(B,)")
                expected = greedy_action(tree, log_w, step).double()
                wrong = (yours != expected).nonzero().flatten()
                state["cases"] = count
                if len(wrong) == 0:
                    continue
                b = int(wrong[0])
                probs = posterior_probs(log_w)
                offset = 2**step - 1
                leaf_path = tree.path_nodes(tree.all_signs[probs.argmax(-1)])[:, step].double()
                masses = level_node_masses(tree, probs, step)
                candidates = [
                    ("no_offset", expected - offset,
                     f"return heap-order node ids: level {step} starts at node 2^{step} - 1 = {offset}"),
                    ("leaf_path", leaf_path,
                     "that is the node on the path of the single most probable leaf; greedy picks the node "
                     "whose *total* mass (sum over the leaves below it) is largest"),
                    ("next_level", (greedy_action(tree, log_w, step + 1).double() if step + 1 < depth else None),
                     "step is 0-based: at step l measure a node of level l (the root at step 0)"),
                    ("prev_level", (greedy_action(tree, log_w, step - 1).double() if step >= 1 else None),
                     "step is 0-based: at step l measure a node of level l (the root at step 0)"),
                    ("min", (masses.argmin(-1) + offset).double(), "take the node with the largest mass (argmax), not the smallest"),
                ]
                found = _diagnose(yours, candidates, lambda y, c: bool((y == c).all()))
                hint = found[1] if found else (
                    f"sum the leaf probabilities in blocks of 2^(K - {step}) leaves (one block per node of level "
                    f"{step}), take the argmax and add {offset}"
                )
                raise _Fail(
                    f"for context {b} at step {step} of {tree!r} you chose node {_fmt(float(yours[b]))}, "
                    f"greedy measures node {int(expected[b])} ({len(wrong)} of {batch} contexts differ)",
                    hint, case=count, diagnosis=found[0] if found else None,
                )
        return (f"your greedy rule picks the most massive node on {count} (tree, step) cases", 0.0, count, {})

    return _result("check_greedy_action", run)


# ----------------------------------------------------------------------------------------
# 6. Noise-free closed forms
# ----------------------------------------------------------------------------------------
_NOISEFREE_CASES = ((6, 0.5), (5, 0.7), (4, 0.3), (7, 0.9))


def _nonadaptive_floor(tree, budget):
    """The closed form without the partial level (a common slip): budget rounded down to 2^m - 1."""
    m = (budget + 1).bit_length() - 1
    return float(sum(tree.alpha**k for k in range(m, tree.depth)))


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
    if kind not in ("adaptive", "nonadaptive"):
        raise ValueError(f"kind must be 'adaptive' or 'nonadaptive', got {kind!r}")
    _check_tol("rtol", rtol)
    reference = noisefree_adaptive_loss if kind == "adaptive" else noisefree_nonadaptive_loss
    other = noisefree_nonadaptive_loss if kind == "adaptive" else noisefree_adaptive_loss

    def run(state):
        count = 0
        for depth, alpha in _NOISEFREE_CASES:
            tree = TreePrior(depth, alpha)
            for budget in range(1, min(tree.dim, 20) + 1):
                count += 1
                what = f"{tree!r}, budget={budget}"
                yours = _scalar(_call(student_fn, (tree, budget), what), "loss")
                expected = reference(tree, budget)
                error = abs(yours - expected)
                _track(state, error)
                state["cases"] = count
                if error <= rtol * max(abs(expected), 1.0) + 1e-12:
                    continue
                shifted = [reference(tree, budget + 1) if budget + 1 <= tree.dim else 0.0]
                shifted.append(reference(tree, budget - 1) if budget > 1 else tree.energy)
                candidates = [
                    ("off_by_one_up", shifted[0], "a level off by one: with L layers the levels 0..L-1 are known, so "
                     "the sum of the unknown energy starts at k = L" if kind == "adaptive" else
                     "the budget counts nodes from the root: M = 2^m - 1 + r measures the levels 0..m-1 fully"),
                    ("off_by_one_down", shifted[1], "a level off by one: the sum starts at k = L (levels 0..L-1 are read)"
                     if kind == "adaptive" else "the budget counts nodes from the root: M = 2^m - 1 + r measures the "
                     "levels 0..m-1 fully"),
                    ("other_formula", other(tree, budget), f"that is the {'non-adaptive' if kind == 'adaptive' else 'adaptive'} "
                     "closed form; swap the two"),
                ]
                if kind == "nonadaptive":
                    candidates.insert(0, ("no_partial_level", _nonadaptive_floor(tree, budget),
                                          "the r extra nodes of the partial level m each find the path with probability "
                                          "2^-m: the level-m term is alpha^m (1 - r / 2^m)"))
                found = _diagnose(yours, candidates, lambda y, c: abs(y - c) <= 1e-9 * max(abs(c), 1.0))
                hint = found[1] if found else ("sum_{k >= L} alpha^k" if kind == "adaptive"
                                               else "alpha^m (1 - r/2^m) + sum_{k > m} alpha^k with M = 2^m - 1 + r")
                raise _Fail(f"for {what} your loss is {_fmt(yours)}, expected {_fmt(expected)}",
                            hint, case=count, diagnosis=found[0] if found else None)
        return (f"the {kind} noise-free closed form holds on {count} (tree, budget) cases", state["max_error"], count,
                {"kind": kind})

    return _result("check_noisefree_loss", run)


# ----------------------------------------------------------------------------------------
# 7. The DP value
# ----------------------------------------------------------------------------------------
#: Default DP cases ``(depth, alpha, n_layers, tau)``: greedy is 10% worse at tau 0.6, four
#: times worse at tau 0.1, 13% worse on the depth-2 tree; L = 1 is a sanity case.
DP_CASES = ((3, 0.5, 2, 0.6), (3, 0.5, 2, 0.1), (2, 0.5, 2, 0.5), (3, 0.5, 1, 0.6))


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
        cases, fn, value = DP_CASES, student, None
    else:
        try:
            if isinstance(student, (bool, str, bytes)):
                raise TypeError
            value = float(student)
        except Exception:  # noqa: BLE001
            raise ValueError(
                f"check_dp_value needs a number or a function fn(tree, n_layers, tau) -> float, got {_describe(student)}"
            ) from None
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 3:
            raise ValueError(f"depth must be an integer in [1, 3] for the exact DP, got {depth!r}")
        if isinstance(n_layers, bool) or not isinstance(n_layers, int) or not 1 <= n_layers <= 3:
            raise ValueError(f"n_layers must be an integer in [1, 3], got {n_layers!r}")
        _check_positive("tau", tau)
        TreePrior(depth, alpha)  # validates alpha
        cases, fn = ((depth, alpha, n_layers, tau),), None
    _check_tol("rtol", rtol)
    _check_tol("atol", atol)

    def run(state):
        for i, (K, a, L, t) in enumerate(cases, start=1):
            tree = TreePrior(K, a)
            what = f"{tree!r}, n_layers={L}, tau={t}"
            yours = _scalar(_call(fn, (tree, L, t), what) if fn else value, "DP value")
            rule = {"quad_points": 48, "rule": "hermite"} if L <= 2 else {"quad_points": 64, "rule": "grid"}
            expected = dp_value(tree, L, t, **rule)
            error = abs(yours - expected)
            _track(state, error)
            state["cases"] = i
            tol = max(rtol * expected, atol)
            if error <= tol:
                continue
            def pol(policy, layers=L, tau_=t):
                if not 1 <= layers <= tree.dim:
                    return tree.energy if layers == 0 else None
                return policy_value(tree, layers, tau_, policy, **rule)
            candidates = [
                ("greedy", lambda: pol("greedy"),
                 "that is the greedy policy's risk; the DP minimises over *every* node at every step, including "
                 "off-path nodes (whose 0 outcome is informative) and measuring the same node again"),
                ("nonadaptive", lambda: pol("nonadaptive"),
                 "that is the non-adaptive policy (the first nodes in heap order); let the next action depend on the "
                 "belief after each observation"),
                ("no_measurement", tree.energy, "that is the prior risk E|theta|^2: the measurements are not used"),
                ("one_layer_less", lambda: pol("optimal", L - 1), f"a layer off by one: the recursion runs over {L} measurements "
                 "(V_L at the end is the posterior variance, with no measurement left)"),
                ("one_layer_more", (lambda: pol("optimal", L + 1)) if L + 1 <= 2 else None,
                 f"a layer off by one: the recursion runs over {L} measurements, not {L + 1}"),
                ("tau2_as_tau", lambda: dp_value(tree, L, t * t, **rule), "tau is the noise standard deviation here; "
                 "the likelihood variance is tau^2"),
                ("sqrt_tau", lambda: dp_value(tree, L, math.sqrt(t), **rule), "tau is the noise standard deviation; "
                 "the likelihood variance is tau^2, not tau"),
            ]
            found = _diagnose(yours, candidates, lambda y, c: abs(y - c) <= max(0.01 * abs(c), 0.002))
            if found:
                hint = found[1]
            elif yours < expected:
                hint = ("your value is below the optimum, which no policy can reach: check that the quadrature weights "
                        "of each observation integral sum to 1 and that phi is integrated over the mixture of the "
                        "-c/0/+c centres, weighted by the current belief")
            else:
                hint = ("V_L(b) is the posterior variance; V_l(b) = min_a E[V_(l+1)(b') | b, a], with the expectation "
                        "over phi ~ mixture of N(theta_j[a], tau^2) under the belief b (chapter 4); use enough "
                        "quadrature points (the posterior is a steep logistic in phi)")
            greedy = policy_value(tree, L, t, "greedy", **rule)
            raise _Fail(
                f"for {what} your value is {_fmt(yours)}, the optimal risk is {_fmt(expected)} (greedy {_fmt(greedy)}; "
                f"tolerance {_fmt(tol)})",
                hint, case=i, diagnosis=found[0] if found else None, expected=expected, tolerance=tol,
            )
        return (f"your DP value matches the optimal risk on {len(cases)} case(s) (within {rtol:.0%})",
                state["max_error"], len(cases), {"rtol": rtol, "atol": atol})

    return _result("check_dp_value", run)


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
    ``alpha^(K-1) / 2^(K-l)`` (:func:`fvlib.patching.noisefree_patching_loss`).
    """
    _check_positive("depth", depth, integer=True)
    _check_positive("n_layers", n_layers, integer=True)
    m = torch.arange(1, depth + 1)[:, None]
    l = torch.arange(1, n_layers + 1)[None, :]
    return l > m


def _check_mask(mask) -> CheckResult:
    def run(state):
        try:
            tensor = torch.as_tensor(mask)
        except Exception:  # noqa: BLE001
            raise _Fail(f"expected a boolean (K, L) mask, got {_describe(mask)}", "return a torch.bool tensor") from None
        if tensor.ndim != 2:
            raise _Fail(f"your mask has shape {tuple(tensor.shape)}, expected a (K, L) matrix", "rows are split levels m, columns layers l")
        K, L = tensor.shape
        expected = ideal_patching_mask(K, L)
        state["cases"] = 1
        wrong = (tensor.bool() != expected).nonzero()
        if len(wrong) == 0:
            return (f"the ideal pattern for K = {K}, L = {L}: the patch changes what the target measures exactly "
                    "when the patched layer l comes after the split (l > m)", 0.0, 1, {})
        m, l = (int(i) + 1 for i in wrong[0])
        candidates = [
            ("l_ge_m", ideal_patching_mask(K, L) | (torch.arange(1, L + 1)[None, :] == torch.arange(1, K + 1)[:, None]),
             "at l = m the patched layer measures a node of level m - 1, which donor and target still share: no effect"),
            ("transposed", (torch.arange(1, K + 1)[:, None] > torch.arange(1, L + 1)[None, :]),
             "rows are split levels m and columns layers l; the effect is large for l > m, not m > l"),
            ("inverted", ~expected, "True marks the cells where the patch changes what the target measures"),
        ]
        found = _diagnose(tensor.bool(), candidates, lambda y, c: bool((y == c).all()))
        hint = found[1] if found else "layer l measures the path node of level l - 1; the paths share levels 0..m-1"
        raise _Fail(
            f"cell (m = {m}, l = {l}) is {bool(tensor[m - 1, l - 1])}, expected {bool(expected[m - 1, l - 1])}",
            hint, diagnosis=found[0] if found else None,
        )

    return _result("check_patching_sweep", run)


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
      ``loss (K, L)`` (a tensor or a :class:`fvlib.patching.PatchingResult`), with
      ``loss[m - 1, l - 1]`` the target's excess loss ``E|theta_hat - theta_target|^2`` when the
      target's measured node at layer ``l`` is replaced by the donor's, for donor/target pairs
      whose paths split at level ``m``; run on :data:`PATCHING_CASES`;
    * a numeric ``(K, L)`` heatmap (or ``PatchingResult``) computed for ``TreePrior(depth, 0.5)``,
      ``n_ctx``, ``noise_std``, ``n_layers`` with at least ``contexts`` pairs per split level;
    * a *boolean* ``(K, L)`` mask of the cells where the patch changes what the target
      measures: the qualitative shape, compared with :func:`ideal_patching_mask` (``l > m``).

    Reference: :func:`fvlib.patching.theory_patching_sweep` with ``contexts`` pairs and
    ``seed``. A numeric answer passes when every cell is within
    ``z * sqrt(2) * stderr + atol`` of the reference (``sqrt(2)``: the student's heatmap has its
    own Monte Carlo error of about the same size). Recognised mistakes: a transposed heatmap,
    the loss scored against the donor's ``theta``, layers or split levels off by one, a patch
    that changed nothing.
    """
    if isinstance(student, PatchingResult):
        given = student
    elif callable(student):
        given = None
    else:
        try:
            if isinstance(student, (str, bytes, dict)):
                raise TypeError
            given = torch.as_tensor(student)
        except Exception:  # noqa: BLE001
            raise ValueError(
                "check_patching_sweep needs a function fn(tree, n_ctx, noise_std, n_layers, contexts, seed), "
                f"a (K, L) heatmap or a boolean (K, L) mask, got {_describe(student)}"
            ) from None
        if given.dtype == torch.bool:
            return _check_mask(given)
    for name, value in (("contexts", contexts), ("depth", depth), ("n_layers", n_layers), ("n_ctx", n_ctx)):
        _check_positive(name, value, integer=True)
    if contexts < 50:
        raise ValueError(f"contexts must be at least 50 for a meaningful Monte Carlo comparison, got {contexts!r}")
    _check_tol("noise_std", noise_std)
    _check_tol("z", z)
    _check_tol("atol", atol)
    fn = student if given is None else None
    cases = PATCHING_CASES if fn else ((depth, n_layers, n_ctx, noise_std),)

    def run(state):
        for i, (K, L, N, sigma) in enumerate(cases, start=1):
            tree = TreePrior(K, 0.5)
            what = f"{tree!r}, n_ctx={N}, noise_std={sigma}, n_layers={L}, contexts={contexts}, seed={seed}"
            raw = _call(fn, (tree, N, sigma, L, contexts, seed), what) if fn else given
            yours = _tensor(raw, "heatmap", (K, L), "(K, L) = (split levels, layers)")
            ref = theory_patching_sweep(tree, N, sigma, L, contexts=contexts, seed=seed)
            stderr = ref.stderr
            if isinstance(raw, PatchingResult) and raw.stderr.shape == stderr.shape:
                combined = torch.sqrt(stderr**2 + raw.stderr.double() ** 2)
            else:
                combined = math.sqrt(2) * stderr
            tol = z * combined + atol
            index, error = _worst(yours, ref.loss)
            _track(state, error)
            state["cases"] = i
            bad = (yours - ref.loss).abs() > tol
            if not bad.any():
                continue
            m, l = _argmax2((yours - ref.loss).abs() / tol)
            loose = z * combined + atol + 0.1 * ref.loss.abs()

            def close(y, c, tol_=loose):
                return y.shape == c.shape and bool(((y - c).abs() <= tol_).all())

            def shifted_cols(y, c, step):
                """Does column j of ``y`` hold column ``j - step`` of ``c``?"""
                if L < 2:
                    return False
                if step > 0:
                    return close(y[:, step:], c[:, :-step], loose[:, step:])
                return close(y[:, :step], c[:, -step:], loose[:, :step])

            def shifted_rows(y, c, step):
                if K < 2:
                    return False
                if step > 0:
                    return close(y[step:], c[:-step], loose[step:])
                return close(y[:step], c[-step:], loose[:step])

            found = None
            checks = [
                ("transposed", K == L and close(yours, ref.loss.T, loose.T),
                 "rows are split levels m = 1..K and columns layers l = 1..L: your heatmap is transposed"),
                ("donor_scored", close(yours, ref.donor_loss),
                 "score the patched run against the *target's* theta (the donor's is the other curve, donor_loss)"),
                ("no_effect", bool(((yours - ref.baseline).abs() <= z * math.sqrt(2) * ref.baseline_stderr + atol
                                    + 0.1 * ref.baseline).all()) and bool((ref.loss > 2 * ref.baseline + 0.05).any()),
                 "every cell equals the unpatched loss: the donor's node never reached the target; pass "
                 "forced={l: donor_nodes[:, l - 1]} to run_greedy for the target (l is 1-based)"),
                ("layer_late", shifted_cols(yours, ref.loss, -1),
                 "your column l - 1 holds the effect of patching layer l + 1: the layers are 1-based "
                 "(forced={l: donor_nodes[:, l - 1]} for l = 1..L)"),
                ("layer_early", shifted_cols(yours, ref.loss, 1),
                 "your column l - 1 holds the effect of patching layer l - 1: the layers are 1-based "
                 "(forced={l: donor_nodes[:, l - 1]} for l = 1..L)"),
                ("level_off", shifted_rows(yours, ref.loss, 1) or shifted_rows(yours, ref.loss, -1),
                 "split levels are 1-based: row m - 1 holds donors whose path first differs at level m "
                 "(patching_pairs(tree, n, m, ...))"),
            ]
            for label, matched, hint in checks:
                if matched:
                    found = (label, hint)
                    break
            hint = found[1] if found else (
                "for each split level m draw pairs with fvlib.patching.patching_pairs, run the greedy policy on the "
                "donor's statistic to get its nodes, then rerun the target with forced={l: donor_nodes[:, l - 1]} "
                "and score E|theta_hat - theta_target|^2"
            )
            raise _Fail(
                f"cell (split level m = {m}, layer l = {l}) of your heatmap is {_fmt(float(yours[m - 1, l - 1]))}, "
                f"expected {_fmt(float(ref.loss[m - 1, l - 1]))} +- {_fmt(float(stderr[m - 1, l - 1]))} "
                f"(tolerance {_fmt(float(tol[m - 1, l - 1]))}) for {what}",
                hint, case=i, diagnosis=found[0] if found else None,
            )
        return (f"your heatmap agrees with the greedy theory sweep within Monte Carlo error on {len(cases)} case(s) "
                f"({contexts} pairs per split level)", state["max_error"], len(cases), {"z": z, "atol": atol})

    return _result("check_patching_sweep", run)


def _argmax2(values: torch.Tensor) -> tuple[int, int]:
    flat = int(values.flatten().argmax())
    return flat // values.shape[1] + 1, flat % values.shape[1] + 1
