"""The check of the greedy action: the node of the next level with the largest posterior mass."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._checks import check_int
from ..priors import TreePrior
from ..task import make_generator
from ..theory import greedy_action, level_node_masses, posterior_probs
from .engine import (
    Case,
    Check,
    CheckResult,
    Misconception,
    call_on,
    equal,
    fmt,
    read_tensor,
    require_callable,
    run_check,
)

__all__ = ["check_greedy_action"]


def _greedy_cases(options):
    gen = make_generator(options.seed)
    for depth in (3, 4):
        tree = TreePrior(depth, 0.5)
        for step in range(depth):
            log_w = 2.0 * torch.randn(options.batch, tree.num_leaves, generator=gen, dtype=torch.float64)
            yield Case(tree=tree, log_w=log_w, step=step, offset=2**step - 1, batch=options.batch,
                       args=(tree, log_w.clone(), step),
                       what=f"{tree!r}, log_w of shape {tuple(log_w.shape)}, step={step}")


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
    return (f"for context {b} at step {c.step} of {c.tree!r} you chose node {fmt(float(yours[b]))}, "
            f"greedy measures node {int(expected[b])} ({len(wrong)} of {c.batch} contexts differ)")


_GREEDY = Check(
    name="check_greedy_action",
    cases=_greedy_cases,
    answer=lambda student, c: read_tensor(call_on(student, c), "nodes", (c.batch,), "(B,)"),
    reference=lambda c: greedy_action(c.tree, c.log_w, c.step).double(),
    error=lambda yours, expected: None,
    passes=lambda c, yours, expected, error: equal(c, yours, expected),
    same=equal,
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
    require_callable("check_greedy_action", student_fn, "fn(tree, log_w, step) -> nodes")
    check_int("batch", batch, 1)
    return run_check(_GREEDY, student_fn, seed=seed, batch=batch)

