"""Tests of fvlib.theory.decoders: the radial decoder theta_hat = g * p(|g|^2)."""

import math

import pytest
import torch

from fvlib import GaussianPrior, TreePrior
from fvlib.theory import Estimate, RadialDecoder, channel_tau2, fit_radial_decoder, mc_contexts, twin_finite_n_loss


def _twin_draws(depth, samples, n_ctx, sigma, seed):
    twin = GaussianPrior.twin_of(TreePrior(depth, 0.5))
    theta, _, g_hat = mc_contexts(twin, samples, n_ctx, sigma, seed)
    return twin, theta, g_hat


def test_full_statistic_twin_k4_beats_linear():
    # The twin of K = 4, N = 32, sigma = 0.2: the best linear decoder leaves ~0.41, a radial
    # decoder fitted on half the draws ~0.37 on the other half (a gap of ~30 s.e.).
    twin, theta, g = _twin_draws(4, 16_000, 32, 0.2, seed=0)
    half = theta.shape[0] // 2
    nonlin = fit_radial_decoder(g[:half], theta[:half])
    linear = fit_radial_decoder(g[:half], theta[:half], degree=0)
    e_nl = nonlin.squared_errors(g[half:], theta[half:])
    e_lin = linear.squared_errors(g[half:], theta[half:])
    closed = twin_finite_n_loss(twin.variances, twin.dim, 32, channel_tau2(twin, 32, 0.2))
    lin, nl, gap = Estimate.of(e_lin), Estimate.of(e_nl), Estimate.of(e_lin - e_nl)
    assert abs(closed - 0.4136) < 1e-3
    assert abs(lin.mean - closed) < 4 * lin.stderr, (lin, closed)   # degree 0 = best linear
    assert abs(nl.mean - 0.37) < 0.01, nl
    assert gap.mean > 0.03 and gap.mean > 10 * gap.stderr, gap
    assert nl.mean < closed - 10 * gap.stderr


def test_measured_coordinates_twin_k5_beats_linear_closed_form():
    # K = 5, M = 5 largest variances, N = 128, sigma = 0: linear closed form 0.3919; a radial
    # decoder of the same five coordinates ~0.387.
    twin, theta, g = _twin_draws(5, 20_000, 128, 0.0, seed=1)
    v = twin.variances
    top = torch.argsort(v, descending=True)[:5]
    rest = float(v.sum() - v[top].sum())
    half = theta.shape[0] // 2
    gm, tm = g[:, top], theta[:, top]
    nonlin = fit_radial_decoder(gm[:half], tm[:half])
    linear = fit_radial_decoder(gm[:half], tm[:half], degree=0)
    e_nl = nonlin.squared_errors(gm[half:], tm[half:]) + rest
    e_lin = linear.squared_errors(gm[half:], tm[half:]) + rest
    closed = twin_finite_n_loss(v, 5, 128, channel_tau2(twin, 128, 0.0))
    gap = Estimate.of(e_lin - e_nl)
    assert abs(closed - 0.3919) < 1e-3
    assert abs(Estimate.of(e_lin).mean - closed) < 4 * Estimate.of(e_lin).stderr
    assert gap.mean > 0.003 and gap.mean > 8 * gap.stderr, gap
    assert Estimate.of(e_nl).mean < closed - 0.003


def test_degree_zero_is_linear_shrinkage():
    twin, theta, g = _twin_draws(3, 40_000, 64, 0.0, seed=2)
    dec = fit_radial_decoder(g, theta, degree=0)
    v = twin.variances
    tau2 = channel_tau2(twin, 64, 0.0)
    shrink = v / (v * (1 + 1 / 64) + tau2)
    assert dec.coef.shape == (twin.dim, 1)
    assert torch.allclose(dec.coef[:, 0], shrink, atol=0.02)
    assert torch.allclose(dec(g), g * dec.coef[:, 0], atol=1e-12)


def test_recovers_an_exact_radial_map():
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(500, 4, generator=gen, dtype=torch.float64)
    r = (g**2).sum(-1, keepdim=True)
    target = g * (0.5 - 0.1 * r + 0.01 * r**2) * torch.tensor([1.0, 2.0, -1.0, 0.0])
    dec = fit_radial_decoder(g, target, degree=2)
    assert isinstance(dec, RadialDecoder) and dec.degree == 2 and dec.dim == 4
    assert torch.allclose(dec(g), target, atol=1e-9)
    assert float(dec.squared_errors(g, target).max()) < 1e-15


def test_shapes_clamping_and_determinism():
    twin, theta, g = _twin_draws(3, 2000, 32, 0.1, seed=4)
    a = fit_radial_decoder(g, theta, degree=3)
    b = fit_radial_decoder(g.clone(), theta.clone(), degree=3)
    assert torch.equal(a.coef, b.coef)
    out = a(g[:7])
    assert out.shape == (7, twin.dim) and out.dtype == torch.float64
    # outside the training range of |g|^2 the polynomial is held at its edge value
    big = g[:1] * 100.0
    assert torch.isfinite(a(big)).all()
    edge = g[:1] / g[:1].norm() * math.sqrt(a.r_max)
    ratio = a(big) / big
    assert torch.allclose(ratio, a(edge) / edge, atol=1e-10)
    assert a.squared_errors(g, theta).shape == (2000,)


@pytest.mark.parametrize("degree", [-1, 1.5, True, 11, "2"])
def test_bad_degree(degree):
    g = torch.randn(50, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="degree"):
        fit_radial_decoder(g, g, degree=degree)


def test_bad_inputs():
    g = torch.randn(50, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="shape"):
        fit_radial_decoder(g[:, 0], g[:, 0])
    with pytest.raises(ValueError, match="same shape"):
        fit_radial_decoder(g, g[:, :2])
    bad = g.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        fit_radial_decoder(bad, g)
    with pytest.raises(ValueError, match="draws"):
        fit_radial_decoder(g[:5], g[:5], degree=4)
    with pytest.raises(ValueError, match="real"):
        fit_radial_decoder(g > 0, g)
    dec = fit_radial_decoder(g, g, degree=1)
    with pytest.raises(ValueError, match="columns"):
        dec(g[:, :2])
    with pytest.raises(ValueError, match="thetas must have shape"):
        dec.squared_errors(g, g[:10])


def test_coordinate_decoder_losses_twin_k2_n16():
    # chapter 11's twin (K = 2, alpha = 0.7, N = 16, sigma = 0): the fitted linear decoder of the
    # two largest-variance coordinates is the finite-N closed form 0.588; the radial decoder of
    # the same two coordinates leaves ~0.543, of the whole statistic ~0.268 (closed form 0.332)
    from fvlib import make_prior
    from fvlib.theory import coordinate_decoder_losses
    twin = make_prior("gaussian-twin", 2, 0.7)
    tau2 = channel_tau2(twin, 16, 0.0)
    for budget, radial in ((2, 0.543), (3, 0.268)):
        r = coordinate_decoder_losses(twin, budget, 16, 0.0, samples=80_000, seed=0)
        assert set(r) == {"linear", "radial", "gain"} and r["radial"].n == 40_000
        closed = twin_finite_n_loss(twin.variances, budget, 16, tau2)
        assert abs(r["linear"].mean - closed) < 4 * r["linear"].stderr, (budget, r, closed)
        assert abs(r["radial"].mean - radial) < 0.005, (budget, r)
        assert r["gain"].mean > 10 * r["gain"].stderr, (budget, r)
    # budget 1 measures the root alone: the two level-1 variances stay unmeasured
    one = coordinate_decoder_losses(twin, 1, 16, 0.0, samples=4000, seed=1)
    assert one["linear"].mean > 0.7 - 1e-9 and one["radial"].mean > 0.7 - 1e-9
    with pytest.raises(ValueError):
        coordinate_decoder_losses(twin, 4, 16, 0.0)
    with pytest.raises(ValueError):
        coordinate_decoder_losses(twin, 0, 16, 0.0)
