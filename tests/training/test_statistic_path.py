"""Training from the pooled statistic: the exact sampler of g (fvlib.task.sample_statistic) against
token sampling, and models A, B, C on the statistic against the same models on the tokens."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from conftest import TINY

from fvlib.interventions import key_patching_sweep
from fvlib.models import FVTransformer, ModelConfig, make_model
from fvlib.priors import TreePrior
from fvlib.task import StatisticBatch, make_generator, sample_chi2, sample_statistic, sample_statistic_task, sample_task
from fvlib.training import TrainConfig, run_dir_for, train
from fvlib.transformer import StandardTransformer, transformer_config

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

#: Two-sample Kolmogorov-Smirnov at level about 1e-4: c = sqrt(-ln(alpha / 2) / 2).
KS_C = math.sqrt(-math.log(0.5e-4) / 2)


def token_statistics(theta: torch.Tensor, n_ctx: int, sigma: float, samples: int, seed: int) -> torch.Tensor:
    """``samples`` draws of ``(1/N) sum_i y_i x_i`` from explicit tokens, ``(S, D)`` float64."""
    gen = make_generator(seed)
    x = torch.randn(samples, n_ctx, theta.numel(), generator=gen, dtype=torch.float64)
    y = x @ theta + sigma * torch.randn(samples, n_ctx, generator=gen, dtype=torch.float64)
    return torch.einsum("snd,sn->sd", x, y) / n_ctx


def ks_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """The two-sample Kolmogorov-Smirnov statistic of two 1-d samples."""
    a, b = np.sort(a.numpy()), np.sort(b.numpy())
    grid = np.concatenate([a, b])
    return float(np.abs(np.searchsorted(a, grid, side="right") / a.size
                        - np.searchsorted(b, grid, side="right") / b.size).max())


def ks_critical(n: int, m: int) -> float:
    return KS_C * math.sqrt((n + m) / (n * m))


CASES = [(1, 0.5, 3), (2, 0.0, 4), (2, 1.0, 3), (5, 0.3, 7), (64, 0.1, 7)]


@pytest.mark.parametrize("n_ctx, sigma, dim", CASES)
def test_the_sampler_has_the_law_of_the_token_sum(n_ctx, sigma, dim):
    """Mean theta, covariance [(|theta|^2 + sigma^2) I + theta theta^T] / N, and the same law along
    theta and across it as explicit token sums (two-sample KS), N = 1 and 2 included."""
    samples = 20_000
    theta = torch.randn(dim, generator=make_generator(dim + n_ctx), dtype=torch.float64)
    fast = sample_statistic(theta.repeat(samples, 1), n_ctx, sigma, make_generator(1))
    slow = token_statistics(theta, n_ctx, sigma, samples, seed=2)
    cov = ((theta @ theta + sigma**2) * torch.eye(dim, dtype=torch.float64) + torch.outer(theta, theta)) / n_ctx
    u = theta / theta.norm()
    random_direction = torch.randn(dim, dtype=torch.float64, generator=make_generator(5))
    perp = torch.linalg.qr(torch.stack([u, random_direction], 1))[0][:, 1]
    for g in (fast, slow):
        centred = g - theta
        assert ((g.mean(0) - theta).abs() < 5 * (torch.diagonal(cov) / samples).sqrt()).all()
        products = centred[:, :, None] * centred[:, None, :]
        assert ((products.mean(0) - cov).abs() < 5 * products.std(0) / samples**0.5 + 1e-12).all()
    for direction in (u, perp):
        assert ks_distance(fast @ direction, slow @ direction) < ks_critical(samples, samples)
    assert ks_distance(fast.norm(dim=1), slow.norm(dim=1)) < ks_critical(samples, samples)


def test_the_law_check_catches_a_gaussian_approximation():
    """The check above can fail: a Gaussian with the right mean and covariance is not the law of
    g at N = 1 (along theta, g is the product y a of two correlated normals)."""
    theta, samples = torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64), 20_000
    cov = ((theta @ theta + 0.25) * torch.eye(3, dtype=torch.float64) + torch.outer(theta, theta))
    noise = torch.randn(samples, 3, dtype=torch.float64, generator=make_generator(3))
    gaussian = theta + noise @ torch.linalg.cholesky(cov).T
    slow = token_statistics(theta, 1, 0.5, samples, seed=2)
    u = theta / theta.norm()
    assert ks_distance(gaussian @ u, slow @ u) > ks_critical(samples, samples)


@pytest.mark.parametrize("dof", [2, 3, 7, 40, 10**9])
def test_chi_square_variates_have_the_chi_square_law(dof):
    """Mean and variance, and (up to 40 degrees of freedom) the exact CDF, P(dof/2, x/2), by a
    one-sample Kolmogorov-Smirnov test at level about 1e-4."""
    x = sample_chi2(dof, 100_000, make_generator(dof % 1000))
    assert abs(float(x.mean()) - dof) < 5 * math.sqrt(2 * dof / x.numel())
    assert float(x.var()) / (2 * dof) == pytest.approx(1, abs=0.03)
    if dof <= 40:
        x = x.sort().values
        cdf = torch.special.gammainc(torch.full_like(x, dof / 2), x / 2)
        n = x.numel()
        steps = torch.arange(1, n + 1, dtype=torch.float64) / n
        distance = float(torch.maximum(steps - cdf, cdf - (steps - 1 / n)).max())
        assert distance < KS_C / math.sqrt(n)


def test_chi_square_edge_cases_and_bad_input():
    assert torch.equal(sample_chi2(0, 5, make_generator(0)), torch.zeros(5, dtype=torch.float64))
    one = sample_chi2(1, 50_000, make_generator(1))
    assert (one >= 0).all() and float(one.mean()) == pytest.approx(1, abs=0.03)
    with pytest.raises(ValueError, match="dof"):
        sample_chi2(-1, 3, make_generator(0))


def test_the_statistic_is_drawn_without_the_tokens_at_any_context_length():
    """A context of 10^12 tokens: finite statistics about theta, spread about |theta| / sqrt(N)."""
    theta = torch.ones(4, 3, dtype=torch.float64)
    g = sample_statistic(theta, 10**12, 0.1, make_generator(0), dtype=torch.float32)
    assert g.dtype == torch.float32 and torch.isfinite(g).all()
    assert float((g.double() - theta).abs().max()) < 1e-4


def test_sample_statistic_task_is_a_statistic_batch_of_the_prior():
    tree = TreePrior(3, 0.5)
    batch = sample_statistic_task(tree, 16, 32, 0.2, make_generator(0))
    assert isinstance(batch, StatisticBatch) and batch.g.shape == (16, 7) and batch.g.dtype == torch.float32
    assert batch.n_ctx == 32 and batch.batch_size == 16
    assert torch.equal(batch.theta, tree.theta_from_signs(batch.signs).float())
    pooled = sample_task(tree, 16, 32, 0.2, make_generator(0)).pooled()
    assert isinstance(pooled, StatisticBatch) and pooled.n_ctx == 32


# ----- models on the tokens and on their statistic -------------------------------------------
def briefly_trained(kind: str, tree: TreePrior) -> FVTransformer:
    torch.manual_seed(0)
    model = make_model(kind, tree, 3, width=32)
    optimizer = torch.optim.Adam(model.parameters(), 1e-2)
    gen = make_generator(5)
    for _ in range(60):
        batch = sample_statistic_task(tree, 64, 32, 0.0, gen)
        loss = ((model.predict_theta(batch) - batch.theta) ** 2).sum(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.mark.parametrize("kind", ["A", "B", "C"])
def test_a_model_gives_the_same_outputs_on_tokens_and_on_their_statistic(kind):
    """float32, N = 128: rtol 1e-5 (atol 1e-5 for outputs that cancel near zero)."""
    tree = TreePrior(4, 0.5)
    model = briefly_trained(kind, tree)
    assert model.reads_statistic
    batch = sample_task(tree, 256, 128, 0.2, make_generator(1))
    with torch.no_grad():
        torch.testing.assert_close(model(batch.pooled()), model(batch), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.predict_theta(batch.pooled()), model.predict_theta(batch),
                                   rtol=1e-5, atol=1e-5)
        g = batch.sufficient_statistic()
        torch.testing.assert_close(model.forward_statistic(g, batch.x_query), model(batch), rtol=1e-5, atol=1e-5)


def test_models_that_read_every_token_refuse_the_statistic():
    tree = TreePrior(3, 0.5)
    batch = sample_statistic_task(tree, 4, 8, 0.0, make_generator(0))
    mlp = FVTransformer(ModelConfig(7, 2, 1, router="mlp", width=8))
    assert not mlp.reads_statistic
    with pytest.raises(ValueError, match="reads every token"):
        mlp(batch)
    transformer = StandardTransformer(transformer_config("A", 7, 2, "bottlenecked", d_model=8))
    with pytest.raises(ValueError, match="reads every token"):
        transformer(batch)
    with pytest.raises(ValueError, match="g must be"):
        make_model("A", tree, 2).forward_statistic(torch.zeros(4, 5), batch.x_query)


def test_key_patching_on_the_statistic_is_key_patching_on_the_tokens():
    """The patched slot G_l(Phi_donor) g_target equals pooling the donor's keys against the target's
    labels (donor and target share their x_i)."""
    tree = TreePrior(3, 0.5)
    model = briefly_trained("A", tree)
    tokens = key_patching_sweep(model, tree, 32, 0.0, contexts=300, statistic=False)
    pooled = key_patching_sweep(model, tree, 32, 0.0, contexts=300)  # the model reads the statistic
    torch.testing.assert_close(pooled.loss, tokens.loss, rtol=1e-5, atol=1e-7)
    assert pooled.baseline == pytest.approx(tokens.baseline, rel=1e-5)
    assert float((tokens.loss - tokens.baseline_by_level[:, None]).abs().max()) > 1e-3  # the patch acts
    double = key_patching_sweep(model.double(), tree, 32, 0.0, contexts=300)  # float64 weights, float32 contexts
    torch.testing.assert_close(double.loss, tokens.loss, rtol=1e-4, atol=1e-6)


# ----- the config records the path ------------------------------------------------------------
def test_the_config_records_the_path_that_trained_the_run():
    assert TrainConfig().input_path == "statistic" and TrainConfig().to_dict()["inputs"] == "statistic"
    assert TrainConfig(arch="transformer").input_path == "tokens"
    assert TrainConfig(inputs="statistic") == TrainConfig()  # the architecture's own path is kept as 'auto'
    assert dataclasses.replace(TrainConfig(), arch="transformer").input_path == "tokens"
    tokens = TrainConfig(inputs="tokens")
    saved = {k: v for k, v in tokens.to_dict().items() if k != "inputs"}  # saved before the field existed
    assert TrainConfig.from_dict(saved) == tokens
    assert run_dir_for(tokens).name == run_dir_for(TrainConfig.from_dict(saved)).name
    assert run_dir_for(tokens) != run_dir_for(TrainConfig())
    with pytest.raises(ValueError, match="inputs 'statistic' needs"):
        TrainConfig(arch="transformer", inputs="statistic")
    with pytest.raises(ValueError, match="inputs must be one of"):
        TrainConfig(inputs="pooled")


def test_a_statistic_run_trains_resumes_and_says_so(tmp_path):
    config = dataclasses.replace(TINY, router_warm_start=0)
    assert config.statistic
    whole = train(config, out_dir=tmp_path / "a", progress=False)
    train(config, out_dir=tmp_path / "b", progress=False, until_step=15)
    resumed = train(config, out_dir=tmp_path / "b", progress=False)
    assert resumed.final_loss == whole.final_loss
    import json
    assert json.loads((tmp_path / "a" / "config.json").read_text())["train"]["inputs"] == "statistic"
    tokens = train(dataclasses.replace(config, inputs="tokens"), progress=False)
    assert tokens.final_loss != whole.final_loss  # other draws of the same law
