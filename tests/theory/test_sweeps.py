"""Monte Carlo sweeps of the theory and the closed forms' curves (fvlib.theory.sweeps)."""

import math

import numpy as np
import pytest

from fvlib import TreePrior
from fvlib.theory import (
    evaluate_strategies,
    noisefree_adaptive_loss,
    noisefree_nonadaptive_loss,
)
from fvlib.theory.sweeps import closed_form_curves, decay_sweep, depth_sweep_theory


def test_closed_form_curves_match_the_theory_functions():
    tree = TreePrior(5, 0.5)
    cf = closed_form_curves(tree, [1, 2, 3, 7])
    assert cf["adaptive"].shape == (4,) and cf["nonadaptive"].shape == (4,)
    assert cf["adaptive"][1] == noisefree_adaptive_loss(tree, 2)
    assert cf["nonadaptive"][3] == noisefree_nonadaptive_loss(tree, 7)


def test_decay_sweep_shapes_and_noise_free_limit():
    tree = TreePrior(4, 0.5)
    s = decay_sweep(tree, 4096, 0.0, [1, 2, 3], samples=200, seed=3)
    assert list(s.budgets) == [1, 2, 3] and s.samples == 200 and s.n_ctx == 4096
    for name in ("adaptive_greedy", "nonadaptive_coord"):
        assert s.mean[name].shape == (3,) and s.stderr[name].shape == (3,)
        assert (s.stderr[name] >= 0).all()
    # at a long context the adaptive curve sits on its noise-free closed form
    cf = closed_form_curves(tree, s.budgets)["adaptive"]
    assert np.allclose(s.mean["adaptive_greedy"], cf, rtol=0.02)
    assert math.isclose(s.tau2, tree.energy / 4096)


def test_depth_sweep_theory_is_one_evaluation_per_budget():
    """The curves beside the depth sweep: each budget's evaluate_strategies with the same seed,
    bitwise, and the decay sweep's curves."""
    tree, names = TreePrior(3, 0.5), ("adaptive_greedy", "nonadaptive_coord")
    theory = depth_sweep_theory(tree, 32, 0.1, [1, 3], samples=100, seed=2, strategies=names)
    for i, m in enumerate([1, 3]):
        est = evaluate_strategies(tree, 32, 0.1, m, samples=100, seed=2, strategies=names)
        for name in names:
            assert (theory[name][0][i], theory[name][1][i]) == (est[name].mean, est[name].stderr)
    sweep = decay_sweep(tree, 32, 0.1, [1, 3], samples=100, seed=2, strategies=names)
    for name in names:
        np.testing.assert_array_equal(theory[name][0], sweep.mean[name])
    with pytest.raises(ValueError):
        depth_sweep_theory(tree, 32, 0.1, [1], samples=10, strategies=("nope",))
