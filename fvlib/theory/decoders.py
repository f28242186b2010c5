"""Nonlinear decoders of the pooled statistic, fitted by least squares.

At finite ``N`` the pooled statistic ``g_hat = (1/N) sum_i y_i x_i`` is not a Gaussian-linear
function of ``theta``: given ``theta`` its covariance is
``((|theta|^2 + sigma^2) I + theta theta^T) / N`` (``finite_n_covariance``), so it grows with
``|theta|^2``. Even for a Gaussian prior the posterior mean is then *not* linear in
``g_hat``, and the best linear decoder (``twin_finite_n_loss``) is beaten by a decoder that
shrinks less when ``|g_hat|^2`` says the context carries a lot of signal and more when it does
not. :func:`fit_radial_decoder` fits the simplest such family::

    theta_hat_n = g_hat_n * p_n(|g_hat|^2),   p_n a polynomial of degree ``degree``,

one polynomial per coordinate, by least squares on training draws. ``degree=0`` is the best
per-coordinate linear shrinkage, fitted from data. The chapters on priors and on the
Gaussian prior use it to show where "nothing beats the linear estimator" stops being true.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._checks import check_int

__all__ = ["RadialDecoder", "fit_radial_decoder", "MAX_RADIAL_DEGREE"]

#: Highest polynomial degree accepted (higher powers of ``|g_hat|^2`` are ill-conditioned).
MAX_RADIAL_DEGREE = 10


def _as_stats(name: str, x) -> torch.Tensor:
    x = torch.as_tensor(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (B, D), got shape {tuple(x.shape)}")
    if not (x.is_floating_point() or x.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"{name} must be a real tensor, got dtype {x.dtype}")
    x = x.to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} must be finite, got non-finite entries")
    return x


@dataclass(frozen=True)
class RadialDecoder:
    """``theta_hat_n = g_n * sum_k coef[n, k] z^k`` with ``z = (clamp(|g|^2) - center) / scale``.

    Attributes:
        coef: ``(D, degree + 1)`` polynomial coefficients, one row per coordinate.
        center, scale: standardisation of ``|g|^2`` (mean and standard deviation of the
            training draws), for a well-conditioned fit.
        r_min, r_max: range of ``|g|^2`` on the training draws; inputs outside it are clamped
            to it, so the polynomial is never extrapolated.
        degree: the polynomial degree.

    Call it on statistics ``(B, D)`` to get estimates ``(B, D)``.
    """

    coef: torch.Tensor
    center: float
    scale: float
    r_min: float
    r_max: float
    degree: int

    @property
    def dim(self) -> int:
        return self.coef.shape[0]

    def _features(self, stats: torch.Tensor) -> torch.Tensor:
        r = (stats**2).sum(-1, keepdim=True).clamp(self.r_min, self.r_max)
        z = (r - self.center) / self.scale
        return torch.cat([z**k for k in range(self.degree + 1)], dim=-1)  # (B, degree + 1)

    def __call__(self, stats) -> torch.Tensor:
        """Estimates ``(B, D)`` from statistics ``stats (B, D)`` (float64)."""
        stats = _as_stats("stats", stats)
        if stats.shape[1] != self.dim:
            raise ValueError(f"stats must have D = {self.dim} columns, got {stats.shape[1]}")
        return stats * (self._features(stats) @ self.coef.T)

    predict = __call__

    def squared_errors(self, stats, thetas) -> torch.Tensor:
        """Per-context squared error ``|theta_hat - theta|^2``, shape ``(B,)``."""
        thetas = _as_stats("thetas", thetas)
        pred = self(stats)
        if thetas.shape != pred.shape:
            raise ValueError(f"thetas must have shape {tuple(pred.shape)}, got {tuple(thetas.shape)}")
        return ((pred - thetas) ** 2).sum(-1)


def fit_radial_decoder(stats, thetas, degree: int = 4) -> RadialDecoder:
    """Fit ``theta_hat_n = g_n p_n(|g|^2)`` by least squares, one polynomial per coordinate.

    Args:
        stats: ``(B, D)`` training statistics ``g_hat`` (e.g. from
            :func:`~fvlib.theory.strategies.mc_contexts`; restrict the columns to the measured
            coordinates to decode only those: ``|g|^2`` is then taken over them alone).
        thetas: ``(B, D)`` the matching latents (the same columns).
        degree: polynomial degree in ``|g|^2``, an integer in ``[0, MAX_RADIAL_DEGREE]``;
            ``0`` gives the best per-coordinate linear shrinkage.
    Returns:
        a :class:`RadialDecoder`; evaluate it on *fresh* draws (the fit is in-sample
        optimistic on its own training draws).
    Raises:
        ValueError: on a bad degree, shapes that are not ``(B, D)`` or differ, non-finite
            entries, or fewer than ``2 (degree + 1)`` draws.
    """
    check_int("degree", degree, 0, MAX_RADIAL_DEGREE)
    stats = _as_stats("stats", stats)
    thetas = _as_stats("thetas", thetas)
    if stats.shape != thetas.shape:
        raise ValueError("stats and thetas must have the same shape, "
                         f"got {tuple(stats.shape)} and {tuple(thetas.shape)}")
    B, D = stats.shape
    if D < 1:
        raise ValueError(f"stats must have at least one column, got D = {D}")
    if B < 2 * (degree + 1):
        raise ValueError(f"need at least {2 * (degree + 1)} draws for degree {degree}, got B = {B}")
    r = (stats**2).sum(-1, keepdim=True)
    center = float(r.mean())
    scale = float(r.std())
    if not (math.isfinite(scale) and scale > 0):  # all draws with the same |g|^2
        scale = 1.0
    z = (r - center) / scale
    features = torch.cat([z**k for k in range(degree + 1)], dim=-1)  # (B, P)
    design = stats.T[:, :, None] * features[None]  # (D, B, P): column k is g_n z^k
    coef = torch.linalg.lstsq(design, thetas.T[:, :, None], driver="gelsd").solution[..., 0]  # (D, P)
    return RadialDecoder(coef, center, scale, float(r.min()), float(r.max()), degree)
