"""Closed forms: the channel noise ``tau^2`` (the book's appendix *Conventions*, section "Measurements and the
channel"), the noise-free tree losses (chapter 6, *Tree prior*) and the Gaussian posteriors
(chapter 5, *Gaussian prior*)."""

from __future__ import annotations

import torch

from .._checks import check_int
from ..priors import Prior, TreePrior
from ..task import check_task_args

__all__ = [
    "channel_tau2",
    "noisefree_adaptive_loss",
    "noisefree_nonadaptive_loss",
    "gaussian_coordinate_loss",
    "gaussian_posterior",
    "gaussian_posterior_cov",
    "finite_n_covariance",
    "twin_finite_n_loss",
]


def channel_tau2(prior: Prior, n_ctx: int, noise_std: float) -> float:
    """Gaussian-channel noise variance ``tau^2 = (E|theta|^2 + sigma^2) / N``."""
    check_task_args(n_ctx, noise_std)
    return (prior.energy + noise_std**2) / n_ctx


def noisefree_adaptive_loss(tree: TreePrior, n_layers: int) -> float:
    """Adaptive greedy, no channel noise, ``L`` layers: ``sum_{k >= L} alpha^k`` (~ alpha^L)."""
    check_int("budget", n_layers, 1)
    return float(sum(tree.alpha**k for k in range(n_layers, tree.depth)))


def noisefree_nonadaptive_loss(tree: TreePrior, budget: int) -> float:
    """Non-adaptive coordinates in heap order, no channel noise, budget ``M = 2^m - 1 + r``.

    Leaves ``alpha^m (1 - r / 2^m) + sum_{k > m} alpha^k``, roughly ``(M + 1)^(log2 alpha)``.
    """
    check_int("budget", budget, 1)
    if budget >= tree.dim:
        return 0.0
    m = (budget + 1).bit_length() - 1  # largest m with 2^m - 1 <= M
    r = budget - (2**m - 1)
    tail = sum(tree.alpha**k for k in range(m + 1, tree.depth))
    return float(tree.alpha**m * (1 - r / 2**m) + tail)


def gaussian_coordinate_loss(variances: torch.Tensor, budget: int, tau2: float) -> float:
    """Diagonal Gaussian prior, measuring its ``M`` largest-variance coordinates once each.

    ``sum(unmeasured v) + sum(measured v * tau2 / (v + tau2))``.
    """
    check_int("budget", budget, 1)
    v = torch.sort(torch.as_tensor(variances, dtype=torch.float64), descending=True).values
    measured, unmeasured = v[:budget], v[budget:]
    return float(unmeasured.sum() + (measured * tau2 / (measured + tau2)).sum())


def _noise_cov(W: torch.Tensor, tau2: float, noise_cov: torch.Tensor | None) -> torch.Tensor:
    if noise_cov is not None:
        return noise_cov
    return tau2 * torch.eye(W.shape[-2], dtype=torch.float64)


def gaussian_posterior_cov(cov: torch.Tensor, W: torch.Tensor, tau2: float, noise_cov=None) -> torch.Tensor:
    """Posterior covariance of ``theta ~ N(0, C)`` after ``phi = W theta + xi``.

    ``xi ~ N(0, R)`` with ``R = tau2 * I`` unless ``noise_cov`` is given. Equals
    ``(C^-1 + W^T R^-1 W)^-1``; computed as ``C - C W^T (W C W^T + R)^-1 W C`` so that a
    singular ``C`` is fine. It does not depend on the observed ``phi``. Shapes: ``C (D, D)``,
    ``W (M, D)``; returns ``(D, D)``.
    """
    C = torch.as_tensor(cov, dtype=torch.float64)
    W = torch.as_tensor(W, dtype=torch.float64)
    S = W @ C @ W.T + _noise_cov(W, tau2, noise_cov)
    K = torch.linalg.solve(S, W @ C).T  # C W^T S^-1, shape (D, M)
    post = C - K @ W @ C
    return (post + post.T) / 2


def gaussian_posterior(cov, W, phi: torch.Tensor, tau2: float, noise_cov=None):
    """Posterior mean ``(B, D)`` and covariance ``(D, D)`` of a Gaussian prior given ``phi (B, M)``."""
    C = torch.as_tensor(cov, dtype=torch.float64)
    W = torch.as_tensor(W, dtype=torch.float64)
    S = W @ C @ W.T + _noise_cov(W, tau2, noise_cov)
    gain = torch.linalg.solve(S, W @ C).T  # (D, M)
    mean = torch.as_tensor(phi, dtype=torch.float64) @ gain.T
    return mean, gaussian_posterior_cov(C, W, tau2, noise_cov)


def finite_n_covariance(theta: torch.Tensor, W: torch.Tensor, n_ctx: int, noise_std: float) -> torch.Tensor:
    """Exact covariance of ``phi = (1/N) sum_i y_i W x_i`` given ``theta``.

    ``[(|theta|^2 + sigma^2) W W^T + W theta theta^T W^T] / N`` for ``theta (D,)``, ``W (M, D)``.
    The Gaussian-channel approximation keeps only the first term, with ``|theta|^2`` replaced
    by its prior mean.
    """
    check_task_args(n_ctx, noise_std)
    theta = torch.as_tensor(theta, dtype=torch.float64)
    W = torch.as_tensor(W, dtype=torch.float64)
    Wt = W @ theta
    return ((theta @ theta + noise_std**2) * (W @ W.T) + torch.outer(Wt, Wt)) / n_ctx


def twin_finite_n_loss(variances, budget: int, n_ctx: int, tau2: float) -> float:
    """Closed form for the Gaussian twin measured on its ``M`` largest-variance coordinates,
    decoded linearly, *with* the finite-``N`` term.

    The pooled statistic ``g_n = (1/N) sum_i y_i x_{i,n}`` has
    ``E g_n^2 = v_n (1 + 1/N) + tau^2``: besides the channel noise ``tau^2`` it carries the
    extra ``v_n / N`` of ``theta_n^2 / N`` in its conditional variance. The best linear
    decoder leaves ``v (tau^2 + v/N) / (v (1 + 1/N) + tau^2)`` per measured coordinate
    (``v tau^2 / (v + tau^2)`` when the ``v/N`` term is dropped) and ``v`` per unmeasured one.
    ``variances`` has shape ``(D,)``.
    """
    v = torch.sort(torch.as_tensor(variances, dtype=torch.float64).flatten(), descending=True).values
    m, rest = v[:budget], v[budget:]
    return float(rest.sum() + (m * (tau2 + m / n_ctx) / (m * (1 + 1 / n_ctx) + tau2)).sum())
