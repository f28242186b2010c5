"""Key patching, workspace transplant and probes (fvlib.interventions, fvlib.theory.patching)."""

import pytest
import torch

from fvlib import TreePrior, make_generator, make_prior
from fvlib.interventions import (
    key_patching_sweep,
    level_overlap,
    patch_keys,
    patch_level_effect,
    probe_workspace,
    transplant_workspace,
)
from fvlib.models import make_model
from fvlib.theory import donor_signs, patching_pairs, theory_patching_sweep
from fvlib.training import TrainConfig, train

K, N = 3, 64
TREE = make_prior("tree", K, 0.5)


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def trained_a():
    """Model A on a depth-3 tree, trained just long enough to follow the path."""
    config = TrainConfig(
        model="A",
        depth=K,
        n_ctx=N,
        budget=K,
        steps=300,
        batch=128,
        queries=16,
        width=64,
        eval_every=300,
        eval_contexts=500,
        device="cpu",
        router_warm_start=0,  # the patching code is under test here, not the warm start
    )
    return train(config, progress=False).model


@pytest.fixture(scope="module")
def random_a():
    torch.manual_seed(0)
    model = make_model("A", TREE.dim, K, width=16)
    with torch.no_grad():
        for param in model.parameters():
            if torch.all(param == 0):
                param.normal_(0, 0.3)
    return model


# ----- pairs ------------------------------------------------------------------------------
@pytest.mark.parametrize("split_level", [1, 2, 3])
def test_pairs_share_inputs_and_split_where_asked(split_level):
    target, donor = patching_pairs(TREE, 400, split_level, N, 0.0, make_generator(0))
    assert torch.equal(target.x, donor.x) and torch.equal(target.x_query, donor.x_query)
    s, s2 = target.signs, donor.signs
    nodes, nodes2 = TREE.path_nodes(s), TREE.path_nodes(s2)
    assert torch.equal(nodes[:, :split_level], nodes2[:, :split_level])  # shared path nodes
    if split_level < K:
        assert torch.all(nodes[:, split_level] != nodes2[:, split_level])  # first different node
    flip = split_level - 1
    assert torch.all(s[:, flip] == -s2[:, flip])
    split_level = flip  # below: the signs after the flipped one
    torch.testing.assert_close(donor.y, torch.einsum("bnd,bd->bn", donor.x, donor.theta))
    torch.testing.assert_close(donor.y_query, (donor.theta * donor.x_query).sum(-1))
    below = (s[:, split_level + 1 :] == s2[:, split_level + 1 :]).double()
    if below.numel():
        assert 0.4 < below.mean() < 0.6  # uniform below the split: agree half the time


def test_donor_signs_checks_the_level():
    signs = TREE.sample_signs(4, make_generator(0))
    with pytest.raises(ValueError, match="split_level"):
        donor_signs(TREE, signs, K + 1, make_generator(0))
    with pytest.raises(ValueError, match="split_level"):
        donor_signs(TREE, signs, 0, make_generator(0))
    with pytest.raises(ValueError, match="TreePrior"):
        patching_pairs(make_prior("gaussian-twin", K, 0.5), 4, 1, N, 0.0, make_generator(0))


# ----- exactness --------------------------------------------------------------------------
def test_patching_with_the_target_itself_changes_nothing(random_a):
    target, _ = patching_pairs(TREE, 50, 1, N, 0.1, make_generator(1))
    clean = random_a.predict_theta(target)
    _, cache = random_a.run_with_cache(target)
    for l in range(1, K + 1):
        assert torch.equal(patch_keys(random_a, target, cache[f"blocks.{l}.hook_keys"], l), clean)
        name = f"blocks.{l}.hook_workspace"
        with random_a.hooks([(name, lambda t, hook: cache[hook.name])]):
            assert torch.equal(random_a.predict_theta(target), clean)


def test_transplanting_the_last_workspace_gives_the_donor_prediction(random_a):
    target, donor = patching_pairs(TREE, 50, 1, N, 0.0, make_generator(2))
    _, cache = random_a.run_with_cache(donor)
    name = f"blocks.{K}.hook_workspace"
    with random_a.hooks([(name, lambda t, hook: cache[name])]):
        assert torch.equal(random_a.predict_theta(target), cache["hook_theta_hat"])


def test_layer_one_keys_do_not_depend_on_the_leaf(random_a):
    """Layer 1 routes with a constant matrix and donor/target share x: its patch is a no-op."""
    result = key_patching_sweep(random_a, TREE, N, 0.0, contexts=60, seed=0, chunk=25)
    assert result.loss.shape == (K, K) and result.stderr.shape == (K, K)
    assert result.n_contexts == 60 and result.layers == [1, 2, 3] and result.split_levels == [1, 2, 3]
    assert float(result.loss[:, 0].mean()) == pytest.approx(result.baseline, rel=1e-12)
    torch.testing.assert_close(result.loss[:, 0], result.baseline_by_level, rtol=1e-12, atol=0)


@pytest.mark.parametrize("kind", ["B", "C"])
def test_one_layer_models_are_immune_to_key_patching(kind):
    torch.manual_seed(0)
    model = make_model(kind, TREE.dim, K)
    result = key_patching_sweep(model, TREE, N, 0.0, contexts=40, seed=0)
    assert result.loss.shape == (K, 1)
    assert torch.allclose(result.loss.mean(), torch.tensor(result.baseline, dtype=torch.float64))


def test_sweeps_are_reproducible(random_a):
    a = key_patching_sweep(random_a, TREE, N, 0.1, contexts=30, seed=4)
    b = key_patching_sweep(random_a, TREE, N, 0.1, contexts=30, seed=4)
    assert a.to_dict() == b.to_dict()


def test_level_overlap_of_the_truth_is_one():
    signs = TREE.sample_signs(10, make_generator(0))
    theta = TREE.theta_from_signs(signs)
    torch.testing.assert_close(level_overlap(TREE, theta, signs), torch.ones(10, K, dtype=torch.float64))
    torch.testing.assert_close(level_overlap(TREE, -theta, signs), -torch.ones(10, K, dtype=torch.float64))


# ----- trained model A: the adaptive pattern ----------------------------------------------
def test_trained_model_a_routes_on_the_path(trained_a):
    """Donor keys hurt when the paths split early and hardly matter when they split late."""
    result = key_patching_sweep(trained_a, TREE, N, 0.0, contexts=400, seed=0)
    loss = result.loss
    assert result.baseline < 0.1
    assert loss[0, 1:].min() > 3 * result.baseline  # split at the root, patch after layer 1
    assert loss[K - 1].max() < 0.5 * loss[0, 1:].min()  # split at the last level
    assert torch.all(loss[0, 1:] > loss[K - 1, 1:])


def test_transplant_moves_the_prediction_to_the_donor(trained_a):
    result = transplant_workspace(trained_a, TREE, N, 0.0, contexts=400, seed=0)
    assert result.donor_overlap.shape == (K, K) and result.n_contexts == 400
    assert result.baseline_overlap.min() > 0.7
    # the whole final workspace from the donor: the model predicts the donor's theta, and the
    # target's root (opposite sign, split level 1) with overlap -1
    assert result.donor_overlap[-1].min() > 0.7
    assert result.target_overlap[-1, 0] < -0.7
    assert result.target_overlap[-1, 1:].abs().max() < 0.3
    # the later the transplant, the more of the donor's path the model outputs
    assert torch.all(result.donor_overlap[-1] >= result.donor_overlap[0] - 0.05)


def test_probes_read_the_path_from_the_workspace(trained_a):
    linear = probe_workspace(trained_a, TREE, N, 0.0, contexts=1000, seed=0)
    assert linear.accuracy.shape == (K, K) and linear.n_train + linear.n_test == 1000
    assert linear.kind == "linear" and linear.accuracy[-1, 0] > 0.95  # the root sign, read linearly
    mlp = probe_workspace(trained_a, TREE, N, 0.0, contexts=1000, seed=0, kind="mlp")
    assert mlp.accuracy[-1, :2].min() > 0.9  # the final workspace holds the coarse path
    assert mlp.accuracy[:, 0].max() > 0.95
    assert torch.all((0 <= mlp.accuracy) & (mlp.accuracy <= 1))


def test_probe_arguments_are_checked(random_a):
    with pytest.raises(ValueError, match="test_fraction"):
        probe_workspace(random_a, TREE, N, 0.0, contexts=100, test_fraction=1.0)
    with pytest.raises(ValueError, match="contexts"):
        probe_workspace(random_a, TREE, N, 0.0, contexts=0)
    with pytest.raises(ValueError, match="kernel"):
        probe_workspace(random_a, TREE, N, 0.0, contexts=100, kind="kernel")


# ----- theory side ------------------------------------------------------------------------
def test_theory_heatmap_is_flat_before_the_split_and_high_after():
    tree = TreePrior(4, 0.5)
    result = theory_patching_sweep(tree, 128, 0.0, 4, contexts=300, seed=0)
    loss, se = result.loss, result.stderr
    assert loss.shape == (4, 4) and result.split_levels == [1, 2, 3, 4]
    for m in range(1, 5):
        for l in range(1, 5):
            cell = float(loss[m - 1, l - 1])
            if l <= m:  # same node measured (unless the donor misroutes): like the unpatched policy
                gap = abs(cell - float(result.baseline_by_level[m - 1]))
                assert gap <= 3 * float(se[m - 1, l - 1]) + 1e-12
            else:
                assert cell > 3 * float(result.baseline_by_level[m - 1])


def test_theory_sweep_uses_the_same_pairs_as_the_model_sweep(random_a):
    model_side = key_patching_sweep(random_a, TREE, N, 0.0, contexts=20, seed=3)
    theory_side = theory_patching_sweep(TREE, N, 0.0, K, contexts=20, seed=3)
    assert model_side.n_contexts == theory_side.n_contexts == 20
    assert theory_side.loss.shape == model_side.loss.shape


def test_patch_level_effect_resolves_a_cell_by_level():
    tree = TreePrior(4, 0.5)
    before = patch_level_effect(tree, 128, 0.0, split_level=2, layer=2, n_layers=4, contexts=300)
    after = patch_level_effect(tree, 128, 0.0, split_level=2, layer=4, n_layers=4, contexts=300)
    # l <= m: the patched measurement is the target's own node, nothing changes
    assert torch.allclose(before.target, before.baseline)
    # l > m: levels measured before layer l keep the target's coefficients, deeper ones suffer
    assert after.target[:3].min() > 0.95 and after.target[3] < 0.8
    # the donor's root sign is shared (m = 2), its level-1 sign is the opposite of the target's
    assert after.donor[0] > 0.95 and after.donor[1] < -0.95
    assert after.n_contexts == 300 and after.layer == 4 and after.split_level == 2


def test_patch_level_effect_rejects_a_bad_layer():
    with pytest.raises(ValueError, match="layer must be an integer in \\[1, 3\\], got 4"):
        patch_level_effect(TreePrior(3, 0.5), 64, 0.0, split_level=1, layer=4, n_layers=3)


def test_theory_sweep_of_a_direction_policy_generalises_greedy():
    """The greedy rule run as a direction policy gives the greedy heatmap on the same pairs."""
    import numpy as np

    from fvlib import TreePrior
    from fvlib.theory import GreedyRule, theory_patching_sweep

    tree = TreePrior(3, 0.5)
    ref = theory_patching_sweep(tree, 64, 0.0, n_layers=3, contexts=120, seed=2)
    ours = theory_patching_sweep(tree, 64, 0.0, n_layers=3, contexts=120, seed=2, policy=GreedyRule(tree))
    assert np.allclose(np.asarray(ours.loss), np.asarray(ref.loss), rtol=1e-8, atol=1e-10)
