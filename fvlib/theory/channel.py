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
from ..task import sample_statistic  # the one exact sampler of the pooled statistic (re-exported)

__all__ = ["sample_statistic", "FiniteSampleChannel", "GaussianChannel"]

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
        raise ValueError(f"nodes must be in [0, {shape[1] - 1}], "
                         f"got values in [{int(nodes.min())}, {int(nodes.max())}]")
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
