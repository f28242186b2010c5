"""fvlib.theory.closed_forms.noisefree_layered_loss: the noise-free loss of a budget measured in
layers, against the two known closed forms, by hand and by brute-force enumeration."""

import pytest

from fvlib import TreePrior
from fvlib.priors import GaussianPrior
from fvlib.theory import noisefree_adaptive_loss, noisefree_layered_loss, noisefree_nonadaptive_loss


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.9])
def test_layered_loss_matches_the_two_known_closed_forms(alpha):
    tree = TreePrior(5, alpha)
    for m in range(1, 12):
        # one layer of M nodes: the non-adaptive heap-order loss
        assert noisefree_layered_loss(tree, [m]) == pytest.approx(noisefree_nonadaptive_loss(tree, m), abs=1e-12)
        # one node per layer: the adaptive greedy loss
        assert noisefree_layered_loss(tree, [1] * m) == pytest.approx(noisefree_adaptive_loss(tree, m), abs=1e-12)


def test_layered_loss_by_hand_and_empty_layers():
    tree = TreePrior(4, 0.5)  # level energies 1, 1/2, 1/4, 1/8
    # [2, 1]: layer 1 resolves the root and hits the level-1 node with prob 1/2; layer 2 then
    # resolves one more level: depth 3 w.p. 1/2 (loss 1/8), depth 2 w.p. 1/2 (loss 1/4 + 1/8)
    assert noisefree_layered_loss(tree, [2, 1]) == pytest.approx(0.5 * 0.125 + 0.5 * 0.375)
    assert noisefree_layered_loss(tree, [3, 0, 0]) == noisefree_layered_loss(tree, [3])
    assert noisefree_layered_loss(tree, [15]) == 0.0
    with pytest.raises(ValueError, match="layer_sizes"):
        noisefree_layered_loss(tree, [2, -1])
    with pytest.raises(ValueError, match="tree"):
        noisefree_layered_loss(GaussianPrior.isotropic(3), [1])


def test_layered_loss_against_a_brute_force_enumeration():
    """Enumerate all 2^K sign paths: simulate the breadth-first batches and the Bayes decoder
    (an unresolved level keeps its energy) and average."""
    import itertools

    tree = TreePrior(4, 0.6)
    for sizes in ([2, 2], [3, 1, 2], [5], [1, 4], [6, 6]):
        total = 0.0
        for signs in itertools.product((-1, 1), repeat=tree.depth):
            path = [0]
            for s in signs[:-1]:
                path.append(2 * path[-1] + (1 if s < 0 else 2))
            resolved = 0
            for d in sizes:
                # breadth-first batch below path[resolved]: which of its nodes are on the path?
                frontier, batch = [path[resolved]] if resolved < tree.depth else [], []
                while frontier and len(batch) < d:
                    nxt = []
                    for n in frontier:
                        if len(batch) < d and n < tree.dim:
                            batch.append(n)
                            nxt += [2 * n + 1, 2 * n + 2]
                    frontier = nxt
                while resolved < tree.depth and path[resolved] in batch:
                    resolved += 1
            total += sum(tree.alpha**k for k in range(resolved, tree.depth))
        assert noisefree_layered_loss(tree, sizes) == pytest.approx(total / 2**tree.depth, abs=1e-12), sizes
