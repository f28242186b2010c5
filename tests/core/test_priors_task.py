"""Priors and the task: the conventions of the book's appendix *Conventions*, sections "The task and the loss" and
"The tree prior and its indexing"."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fvlib import GaussianPrior, TreePrior, make_generator, make_prior, sample_task


def test_heap_indexing_and_leaf_order():
    tree = TreePrior(3, 0.5)
    assert tree.dim == 7 and tree.num_leaves == 8
    assert tree.node_levels.tolist() == [0, 1, 1, 2, 2, 2, 2]
    # leaf 5 = signs (+, -, +): root -> node 2 (sign +) -> node 5 (sign -) ; theta[5] = +alpha
    signs = tree.all_signs[5]
    assert signs.tolist() == [1, -1, 1]
    assert tree.path_nodes(signs).tolist() == [0, 2, 5]
    theta = tree.theta_from_signs(signs)
    expected = torch.zeros(7, dtype=torch.float64)
    expected[0], expected[2], expected[5] = 1.0, -math.sqrt(0.5), 0.5
    assert torch.allclose(theta, expected)
    assert int(tree.leaf_index(signs)) == 5


@given(depth=st.integers(1, 10), alpha=st.floats(0.05, 1.0))
@settings(max_examples=30, deadline=None)
def test_every_leaf_has_the_same_energy(depth, alpha):
    tree = TreePrior(depth, alpha)
    signs = tree.sample_signs(64, make_generator(depth))
    norms = tree.theta_from_signs(signs).pow(2).sum(-1)
    assert torch.allclose(norms, torch.full_like(norms, tree.energy))
    assert math.isclose(tree.energy, sum(alpha**k for k in range(depth)))


def test_second_moment_matches_monte_carlo():
    tree = TreePrior(4, 0.6)
    n = 200_000
    theta = tree.sample(n, make_generator(1))
    emp = theta.T @ theta / n
    exact = tree.second_moment()
    # entries are bounded by 1, so a 5-standard-error band of 5/sqrt(n) is safe
    assert (emp - exact).abs().max() < 5 / math.sqrt(n)
    assert torch.allclose(torch.diagonal(exact), (0.3) ** tree.node_levels.double())


def test_gaussian_twin_has_the_same_second_moment():
    tree = TreePrior(5, 0.5)
    twin = GaussianPrior.twin_of(tree)
    assert torch.equal(twin.second_moment(), tree.second_moment())
    theta = twin.sample(100_000, make_generator(2))
    assert (theta.T @ theta / 100_000 - tree.second_moment()).abs().max() < 0.02


@pytest.mark.parametrize(
    "kwargs",
    [dict(depth=0, alpha=0.5), dict(depth=-2, alpha=0.5), dict(depth=3, alpha=0.0), dict(depth=3, alpha=1.5),
     dict(depth=3, alpha=float("nan")), dict(depth=2.5, alpha=0.5), dict(depth=40, alpha=0.5)],
)
def test_invalid_tree_raises(kwargs):
    with pytest.raises(ValueError) as err:
        TreePrior(**kwargs)
    bad = "depth" if "alpha" not in str(err.value) else "alpha"
    assert bad in str(err.value)


def test_invalid_gaussian_raises():
    with pytest.raises(ValueError, match="symmetric"):
        GaussianPrior(torch.tensor([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="semi-definite"):
        GaussianPrior(torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
    with pytest.raises(ValueError, match="prior must be"):
        make_prior("laplace", 3)


def test_task_shapes_and_noise_free_labels():
    tree = TreePrior(3, 0.5)
    batch = sample_task(tree, 5, 11, 0.0, make_generator(0))
    assert batch.x.shape == (5, 11, 7) and batch.y.shape == (5, 11)
    assert batch.x_query.shape == (5, 7) and batch.signs.shape == (5, 3)
    assert torch.allclose(batch.y, torch.einsum("bnd,bd->bn", batch.x, batch.theta), atol=1e-5)
    assert torch.allclose(batch.theta.double(), tree.theta_from_signs(batch.signs), atol=1e-6)


def test_task_is_deterministic_and_query_loss_decomposes():
    tree = TreePrior(4, 0.5)
    a = sample_task(tree, 4000, 8, 0.3, make_generator(7), dtype=torch.float64)
    b = sample_task(tree, 4000, 8, 0.3, make_generator(7), dtype=torch.float64)
    assert torch.equal(a.y, b.y)
    # zero predictor: E y_q^2 = sigma^2 + E|theta|^2
    assert abs(a.y_query.pow(2).mean() - (0.09 + tree.energy)) < 0.15


@pytest.mark.parametrize("n_ctx,noise", [(0, 0.1), (-3, 0.1), (10, -0.5), (10, float("inf"))])
def test_task_rejects_bad_arguments(n_ctx, noise):
    with pytest.raises(ValueError):
        sample_task(TreePrior(2, 0.5), 3, n_ctx, noise, make_generator(0))


@pytest.mark.parametrize("alpha", [True, "0.5", None, [0.5]])
def test_tree_alpha_must_be_a_number(alpha):
    with pytest.raises(ValueError, match="alpha must be a number in"):
        TreePrior(3, alpha)


def test_tree_alpha_takes_numpy_and_tensor_numbers():
    import numpy as np

    assert TreePrior(3, np.float32(0.5)).alpha == 0.5 and TreePrior(3, torch.tensor(0.25)).alpha == 0.25


def test_task_bad_arguments_name_the_argument():
    from fvlib.task import MAX_NOISE_STD

    tree, gen = TreePrior(2, 0.5), make_generator(0)
    for call, words in [
        (lambda: sample_task([1], 3, 4, 0.0, gen), "prior must be a Prior, got list"),
        (lambda: sample_task(tree, 0, 4, 0.0, gen), "batch must be a positive integer, got 0"),
        (lambda: sample_task(tree, 3, 4, 0.0, None), "generator must be a Generator, got NoneType"),
        (lambda: sample_task(tree, 3, 4, 1e200, gen), f"noise_std must be a number in [0, {MAX_NOISE_STD}]"),
        (lambda: sample_task(tree, 3, 4, 0.0, gen, x=[[0.0]]), "x must be a torch.Tensor of shape (B, N, D)"),
        (lambda: sample_task(tree, 3, 4, 0.0, gen, x=torch.zeros(3, 4, 2)), "x must have shape (B, N, D) = (3, 4, 3)"),
        (lambda: tree.sample(2, 0), "generator must be a Generator, got int"),
        (lambda: GaussianPrior.isotropic(3, "1"), "variance must be a positive number, got '1'"),
        (lambda: make_generator(-1), "seed must be an integer in [0, 18446744073709551615], got -1"),
        (lambda: make_generator(2**64), "seed must be"),
    ]:
        with pytest.raises(ValueError) as err:
            call()
        assert words in str(err.value), str(err.value)
