"""The noise-free key-patching pattern and one heatmap row against N (fvlib.theory.patching,
fvlib.plots.interventions): noisefree_patching_loss, sample_pair_statistics,
theory_patching_row, plot_patching_row."""

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from fvlib import TreePrior, make_generator  # noqa: E402
from fvlib.plots.interventions import plot_patching_row  # noqa: E402
from fvlib.theory import (  # noqa: E402
    PatchingRow,
    donor_signs,
    noisefree_patching_loss,
    sample_pair_statistics,
    theory_patching_row,
    theory_patching_sweep,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def teardown_function():
    plt.close("all")


# ----- the noise-free pattern -------------------------------------------------------------
def test_noisefree_loss_is_alpha_k_minus_1_over_2_k_minus_l():
    tree = TreePrior(4, 0.6)
    for m in range(1, 5):
        loss = noisefree_patching_loss(tree, m, 4)
        expected = torch.tensor([0.6**3 / 2 ** (4 - l) if l > m else 0.0 for l in range(1, 5)],
                                dtype=torch.float64)
        assert loss.dtype == torch.float64 and loss.shape == (4,)
        assert torch.allclose(loss, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    "args",
    [(TreePrior(3, 0.5), 0, 3), (TreePrior(3, 0.5), 4, 3), (TreePrior(3, 0.5), 1, 2),
     (TreePrior(3, 0.5), 1, 4), (TreePrior(3, 0.5), True, 3), (TreePrior(3, 0.5), 1.0, 3)],
)
def test_noisefree_loss_rejects_bad_input(args):
    with pytest.raises(ValueError):
        noisefree_patching_loss(*args)


def test_noisefree_loss_needs_a_tree():
    from fvlib import make_prior

    with pytest.raises(ValueError, match="TreePrior"):
        noisefree_patching_loss(make_prior("gaussian-twin", 3, 0.5), 1, 3)


def test_greedy_theory_at_long_contexts_reaches_the_noise_free_pattern():
    """The issue's check: K = 4, alpha = 0.6, N = 20000, sigma = 0, 600 pairs, every split level."""
    tree = TreePrior(4, 0.6)
    for m in (1, 2, 3):
        row = theory_patching_row(tree, [20000], 0.0, 4, split_level=m, contexts=600, seed=0)
        expected = noisefree_patching_loss(tree, m, 4)
        assert torch.equal(row.noisefree, expected)
        assert ((row.loss[0] - expected).abs() <= 3 * row.stderr[0] + 1e-3).all(), (m, row.loss)
        assert row.baseline[0] < 1e-6
        # for the same targets the loss never falls from one layer after the split to the next
        steps = row.loss[0, m:] - row.loss[0, m - 1 : -1]
        assert (steps[1:] > 3 * row.step_stderr[0, m:]).all(), steps


# ----- the pair sampler -------------------------------------------------------------------
def _pair_covariance(theta_t, theta_d, n_ctx, sigma):
    """Exact covariance of (g_target, g_donor) for shared inputs x_i ~ N(0, I) (Isserlis)."""
    D = theta_t.shape[0]
    eye = torch.eye(D, dtype=torch.float64)

    def block(a, b, same):
        return ((a @ b + (sigma**2 if same else 0.0)) * eye + torch.outer(b, a)) / n_ctx

    cov = torch.zeros(2 * D, 2 * D, dtype=torch.float64)
    cov[:D, :D] = block(theta_t, theta_t, True)
    cov[D:, D:] = block(theta_d, theta_d, True)
    cov[:D, D:] = block(theta_t, theta_d, False)
    cov[D:, :D] = cov[:D, D:].T
    return cov


@pytest.mark.parametrize("split_level", [1, 2])
def test_pair_statistics_have_the_exact_mean_and_covariance(split_level):
    tree = TreePrior(2, 0.5)
    n_ctx, sigma, draws = 5, 0.3, 100_000
    gen = make_generator(3)
    target = tree.sample_signs(1, gen)
    donor = donor_signs(tree, target, split_level, gen)
    theta_t = tree.theta_from_signs(target).expand(draws, -1)
    theta_d = tree.theta_from_signs(donor).expand(draws, -1)
    g_t, g_d = sample_pair_statistics(theta_t, theta_d, n_ctx, sigma, make_generator(4))
    assert g_t.shape == g_d.shape == (draws, 3) and g_t.dtype == torch.float64
    joint = torch.cat([g_t, g_d], dim=1)
    cov = _pair_covariance(theta_t[0], theta_d[0], n_ctx, sigma)
    mean_se = (cov.diagonal() / draws).sqrt()
    assert ((joint.mean(0) - torch.cat([theta_t[0], theta_d[0]])).abs() < 5 * mean_se).all()
    # the variance of a sample covariance entry is at most sqrt(E x^4 E y^4) / n ~ 3 var_x var_y / n
    cov_se = (3 * torch.outer(cov.diagonal(), cov.diagonal()) / draws).sqrt()
    assert ((torch.cov(joint.T) - cov).abs() < 5 * cov_se).all()


def test_pair_statistics_of_a_donor_parallel_to_the_target():
    """theta_donor = -theta_target: the span is one-dimensional; D = 1 has no orthogonal part."""
    for depth in (1, 2):
        tree = TreePrior(depth, 0.5)
        signs = torch.ones(50_000, depth, dtype=torch.long)
        theta_t = tree.theta_from_signs(signs)
        g_t, g_d = sample_pair_statistics(theta_t, -theta_t, 8, 0.0, make_generator(0))
        assert torch.isfinite(g_t).all() and torch.isfinite(g_d).all()
        # sigma = 0 and theta_d = -theta_t: y'_i = -y_i, so g_d = -g_t (up to the square root
        # of a rounding error in the orthogonal part)
        assert torch.allclose(g_d, -g_t, atol=1e-6)
        assert torch.allclose(g_t.mean(0), theta_t[0], atol=0.02)


def test_pair_statistics_reject_bad_input():
    theta = torch.ones(2, 3, dtype=torch.float64)
    gen = make_generator(0)
    with pytest.raises(ValueError, match="shape"):
        sample_pair_statistics(theta, torch.ones(2, 4), 8, 0.0, gen)
    with pytest.raises(ValueError, match="shape"):
        sample_pair_statistics(theta[0], theta[0], 8, 0.0, gen)
    with pytest.raises(ValueError, match="non-zero"):
        sample_pair_statistics(torch.zeros(2, 3), theta, 8, 0.0, gen)
    with pytest.raises(ValueError):
        sample_pair_statistics(theta, theta, 0, 0.0, gen)
    with pytest.raises(ValueError):
        sample_pair_statistics(theta, theta, 8, -1.0, gen)


# ----- one row against N ------------------------------------------------------------------
def test_row_agrees_with_the_heatmap_row_at_moderate_n():
    tree = TreePrior(4, 0.5)
    row = theory_patching_row(tree, [64], 0.25, 4, split_level=1, contexts=1000, seed=1)
    sweep = theory_patching_sweep(tree, 64, 0.25, n_layers=4, contexts=1000, seed=2)
    tol = 4 * (row.stderr[0] + sweep.stderr[0]) + 1e-3
    assert ((row.loss[0] - sweep.loss[0]).abs() <= tol).all(), (row.loss, sweep.loss)
    assert abs(float(row.baseline[0]) - float(sweep.baseline_by_level[0])) < 4 * (
        float(row.baseline_stderr[0]) + float(sweep.stderr[0, 0])) + 1e-3
    # layer 1 cannot be patched: exactly the unpatched loss
    assert torch.allclose(row.loss[:, 0], row.baseline, rtol=1e-12)


def test_row_layout_is_deterministic_and_serialisable():
    tree = TreePrior(3, 0.5)
    a = theory_patching_row(tree, [16, 256], 0.1, 3, split_level=2, contexts=60, seed=5)
    b = theory_patching_row(tree, (16, 256), 0.1, 3, split_level=2, contexts=60, seed=5)
    assert isinstance(a, PatchingRow)
    assert a.loss.shape == a.stderr.shape == (2, 3) and a.step_stderr.shape == (2, 2)
    assert a.baseline.shape == a.baseline_stderr.shape == (2,)
    assert a.n_ctx.tolist() == [16, 256] and a.split_level == 2 and a.n_contexts == 60
    assert torch.equal(a.loss, b.loss) and torch.equal(a.step_stderr, b.step_stderr)
    assert torch.allclose(a.ratio, a.loss / a.baseline[:, None], equal_nan=True)
    # l <= m: the greedy policy measures the same nodes as without the patch
    assert torch.allclose(a.loss[:, :2], a.baseline[:, None].expand(-1, 2), rtol=1e-12)
    assert json.loads(json.dumps(a.to_dict()))["n_ctx"] == [16, 256]


def test_row_without_one_layer_per_level_has_no_noise_free_limit():
    row = theory_patching_row(TreePrior(3, 0.5), [32], 0.0, 2, contexts=50, seed=0)
    assert row.noisefree is None and row.loss.shape == (1, 2)
    assert row.to_dict()["noisefree"] is None


@pytest.mark.parametrize("values", [[], [0, 8], [64, 32], [16, 16], "abc", [True, 8], [8.5], 8])
def test_row_rejects_bad_context_lengths(values):
    with pytest.raises(ValueError, match="n_ctx_values"):
        theory_patching_row(TreePrior(3, 0.5), values, 0.0, 3, contexts=10)


@pytest.mark.parametrize("kwargs", [{"contexts": 0}, {"split_level": 0}, {"split_level": 4}])
def test_row_rejects_bad_counts_and_split_levels(kwargs):
    with pytest.raises(ValueError):
        theory_patching_row(TreePrior(3, 0.5), [16], 0.0, 3, **kwargs)


# ----- the figure -------------------------------------------------------------------------
def test_plot_patching_row_draws_one_curve_per_layer_after_the_split():
    tree = TreePrior(3, 0.5)
    row = theory_patching_row(tree, [16, 64, 1024], 0.0, 3, split_level=1, contexts=100, seed=0)
    fig, ax = plot_patching_row(row)
    assert ax.figure is fig
    assert len(ax.containers) == 3  # layers l = 2, 3 and the unpatched loss
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert sorted(float(line.get_ydata()[0]) for line in dashed) == pytest.approx([0.125, 0.25])
    assert ax.get_xscale() == ax.get_yscale() == "log"
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["patch at layer $l = 2$", "patch at layer $l = 3$", "unpatched"]
    # drawing into given axes
    fig2, ax2 = plt.subplots()
    assert plot_patching_row(row, ax=ax2) == (fig2, ax2)
