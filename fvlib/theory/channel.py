"""How a layer's measurement ``phi_l`` is observed (the book's appendix *Conventions*, section "Measurements and the
channel").

Two observation models share one interface, ``measure_nodes(nodes)`` for coordinate actions
and ``measure(W)`` for general directions:

* :class:`FiniteSampleChannel` -- the real thing: every linear measurement of a context is a
  function of its sufficient statistic ``g_hat = (1/N) sum_i y_i x_i``; ``phi = W g_hat``.
  Measuring the same direction twice returns the same number.
* :class:`GaussianChannel` -- the large-``N`` approximation ``phi = W (theta + tau z)`` with
  fresh ``z ~ N(0, I)`` for every measurement, i.e. noise covariance ``tau^2 W W^T``.
"""

from __future__ import annotations

import torch

from .._checks import check_instance, check_number, check_tensor
from ..task import check_task_args

__all__ = ["sample_statistic", "FiniteSampleChannel", "GaussianChannel"]

_MAX_CHUNK_ELEMENTS = 1 << 22


def sample_statistic(theta: torch.Tensor, n_ctx: int, noise_std: float, generator: torch.Generator) -> torch.Tensor:
    """Draw ``g_hat = (1/N) sum_i y_i x_i`` exactly, in ``O(N + D)`` per context.

    With ``u = theta / |theta|`` and ``a_i = <x_i, u>``, ``y_i = |theta| a_i + sigma eps_i``; the
    part of ``x_i`` orthogonal to ``u`` is independent of ``y``, so
    ``g_hat = u (1/N) sum_i a_i y_i + (sqrt(sum_i y_i^2) / N) P_perp z`` with ``z ~ N(0, I_D)``.
    This has the law of the explicit sum over tokens without drawing ``N x D`` inputs.

    Args:
        theta: ``(B, D)`` latents (float64).
    Returns:
        ``(B, D)`` statistics (float64).
    """
    check_task_args(n_ctx, noise_std)
    check_instance("generator", generator, torch.Generator)
    theta = check_tensor("theta", theta, (None, None), "(B, D)").to(torch.float64)
    B, D = theta.shape
    norm = theta.norm(dim=-1, keepdim=True)
    u = torch.where(norm > 0, theta / norm.clamp_min(1e-300), torch.zeros_like(theta))
    sum_ay = torch.zeros(B, 1, dtype=torch.float64)
    sum_yy = torch.zeros(B, 1, dtype=torch.float64)
    chunk = max(1, _MAX_CHUNK_ELEMENTS // B)  # bounded memory for long contexts
    for start in range(0, n_ctx, chunk):
        width = min(chunk, n_ctx - start)
        a = torch.randn(B, width, generator=generator, dtype=torch.float64)
        eps = torch.randn(B, width, generator=generator, dtype=torch.float64)
        y = norm * a + noise_std * eps
        sum_ay += (a * y).sum(-1, keepdim=True)
        sum_yy += y.pow(2).sum(-1, keepdim=True)
    z = torch.randn(B, D, generator=generator, dtype=torch.float64)
    z_perp = z - (z * u).sum(-1, keepdim=True) * u
    return sum_ay / n_ctx * u + sum_yy.sqrt() / n_ctx * z_perp


class FiniteSampleChannel:
    """Measurements computed from each context's statistic ``g_hat`` (shape ``(B, D)``)."""

    def __init__(self, g_hat: torch.Tensor):
        self.g_hat = check_tensor("g_hat", g_hat, (None, None), "(B, D)").to(torch.float64)

    def measure_nodes(self, nodes: torch.Tensor) -> torch.Tensor:
        """``phi = g_hat[b, nodes[b]]``; ``nodes (B,)`` -> ``(B,)``."""
        return self.g_hat.gather(-1, _check_nodes(nodes, self.g_hat.shape)[:, None])[:, 0]

    def measure(self, W: torch.Tensor) -> torch.Tensor:
        """``phi = W g_hat``; ``W (M, D)`` or per context ``(B, M, D)`` -> ``(B, M)``."""
        W = _check_rows(W, self.g_hat.shape)
        if W.ndim == 2:
            return self.g_hat @ W.T
        return torch.einsum("bmd,bd->bm", W, self.g_hat)


def _check_nodes(nodes, shape) -> torch.Tensor:
    """``nodes`` as a LongTensor ``(B,)`` of node ids in ``[0, D)`` for contexts of ``shape (B, D)``."""
    nodes = check_tensor("nodes", nodes, (shape[0],), "(B,)", integer=True).long()
    if nodes.numel() and (nodes.min() < 0 or nodes.max() >= shape[1]):
        raise ValueError(f"nodes must be in [0, {shape[1] - 1}], got values in [{int(nodes.min())}, {int(nodes.max())}]")
    return nodes


def _check_rows(W, shape) -> torch.Tensor:
    """``W (M, D)`` or ``(B, M, D)`` as float64 for contexts of ``shape (B, D)``."""
    W = torch.as_tensor(W, dtype=torch.float64)
    if W.shape[-1:] != shape[1:] or W.ndim not in (2, 3) or (W.ndim == 3 and W.shape[0] != shape[0]):
        raise ValueError(f"W must have shape (M, D) or (B, M, D) with B, D = {tuple(shape)}, got {tuple(W.shape)}")
    return W


class GaussianChannel:
    """``phi = W (theta + tau z)`` with fresh noise at every call; ``theta (B, D)``."""

    def __init__(self, theta: torch.Tensor, tau: float, generator: torch.Generator):
        check_number("tau", tau, 0)
        self.theta = check_tensor("theta", theta, (None, None), "(B, D)").to(torch.float64)
        self.tau = float(tau)
        self.generator = check_instance("generator", generator, torch.Generator)

    def measure_nodes(self, nodes: torch.Tensor) -> torch.Tensor:
        clean = self.theta.gather(-1, _check_nodes(nodes, self.theta.shape)[:, None])[:, 0]
        noise = torch.randn(clean.shape, generator=self.generator, dtype=torch.float64)
        return clean + self.tau * noise

    def measure(self, W: torch.Tensor) -> torch.Tensor:
        W = _check_rows(W, self.theta.shape)
        z = torch.randn(self.theta.shape, generator=self.generator, dtype=torch.float64)
        noisy = self.theta + self.tau * z
        if W.ndim == 2:
            return noisy @ W.T
        return torch.einsum("bmd,bd->bm", W, noisy)
