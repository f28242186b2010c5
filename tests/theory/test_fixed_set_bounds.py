"""Fixed coordinate sets on the tree prior, as chapter 2 (exercise "Coarse to fine") uses them.

The chapter relies on three facts that these tests pin down with exact enumeration:
the nodes of level L-1 reveal the first L levels, fewer nodes cannot, and no fixed set of M
coordinates beats the lower bound sum_k alpha^k (1 - M / 2^k)_+ (``fixed_set_lower_bound``, item 1
of chapter 6's proposition), which is at least (1 - M / 2^m)_+ sum_{k >= m} alpha^k for every level m.
"""

import math

import pytest
import torch

from fvlib import TreePrior
from fvlib.theory import best_fixed_nodes, fixed_set_lower_bound, noisefree_nodes_loss, noisefree_nonadaptive_loss

_lower_bound = fixed_set_lower_bound


def _level_bound(tree: TreePrior, budget: int) -> float:
    """The weaker one-level form: max over m of (1 - M / 2^m)_+ sum_{k >= m} alpha^k."""
    return max(max(0.0, 1 - budget / 2**m) * sum(tree.alpha**k for k in range(m, tree.depth))
               for m in range(tree.depth))


@pytest.mark.parametrize("depth, alpha", [(3, 0.5), (4, 0.5), (5, 0.7)])
def test_level_sets_reveal_the_levels_above(depth, alpha):
    tree = TreePrior(depth, alpha)
    for level in range(depth):
        tail = sum(alpha**k for k in range(level + 1, depth))
        assert noisefree_nodes_loss(tree, tree.level_nodes(level)) == pytest.approx(tail, abs=1e-12)
        # heap order needs 2^(level+1) - 1 reads for the same loss
        assert noisefree_nonadaptive_loss(tree, 2 ** (level + 1) - 1) == pytest.approx(tail, abs=1e-12)


def test_heap_order_is_not_the_best_fixed_set():
    tree = TreePrior(3, 0.5)
    assert noisefree_nodes_loss(tree, torch.arange(4)) == pytest.approx(0.1875)
    best = best_fixed_nodes(tree, 4)
    assert noisefree_nodes_loss(tree, best) == pytest.approx(0.0, abs=1e-12)


def test_lower_bound_holds_for_every_set_and_is_tight():
    tree = TreePrior(4, 0.5)  # the exact best set of every size
    for budget in range(1, tree.dim + 1):
        exact = noisefree_nodes_loss(tree, best_fixed_nodes(tree, budget))
        assert exact >= _lower_bound(tree, budget) - 1e-12, budget
        assert _lower_bound(tree, budget) >= _level_bound(tree, budget) - 1e-15, budget
    # fewer than 2^(K-1) = 8 nodes cannot reveal every level; the bound is met at M = 7
    assert noisefree_nodes_loss(tree, best_fixed_nodes(tree, 7)) == pytest.approx(_lower_bound(tree, 7))
    assert noisefree_nodes_loss(tree, best_fixed_nodes(tree, 7)) > 0.01


def test_lower_bound_is_a_power_law():
    tree = TreePrior(8, 0.5)
    for budget in range(1, 2 ** (tree.depth - 2) + 1):
        assert _lower_bound(tree, budget) >= tree.alpha**2 / 2 * budget ** math.log2(tree.alpha) - 1e-12
