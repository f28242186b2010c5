"""Tell exponential from power-law decay: ``alpha^L`` versus ``M^(log2 alpha)`` (chapter 6,
*Tree prior*).

Both laws are straight lines after a log transform: ``log y = a - r x`` (exponential, a line on
semilog axes) and ``log y = a + p log x`` (power law, a line on log-log axes). We fit both by
least squares in log space and compare their residuals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["DecayFit", "fit_decay"]


@dataclass(frozen=True)
class DecayFit:
    """Least-squares fits of ``y(x)`` in log space.

    ``exp_rate`` r and ``exp_r2`` for ``y ~ C exp(-r x)`` (so ``exp(-r)`` estimates ``alpha``
    for ``y ~ alpha^x``); ``power_exponent`` p and ``power_r2`` for ``y ~ C x^p``; ``best`` is
    ``"exponential"`` or ``"power"``, whichever has the larger R^2 (in log y).
    """

    exp_rate: float
    exp_intercept: float
    exp_r2: float
    power_exponent: float
    power_intercept: float
    power_r2: float

    @property
    def best(self) -> str:
        return "exponential" if self.exp_r2 >= self.power_r2 else "power"

    @property
    def exp_base(self) -> float:
        """``exp(-rate)``: the per-step factor of the exponential fit."""
        return math.exp(-self.exp_rate)

    def predict_exponential(self, x):
        return np.exp(self.exp_intercept - self.exp_rate * np.asarray(x, dtype=float))

    def predict_power(self, x):
        return np.exp(self.power_intercept + self.power_exponent * np.log(np.asarray(x, dtype=float)))


def _line_fit(u: np.ndarray, v: np.ndarray) -> tuple[float, float, float]:
    slope, intercept = np.polyfit(u, v, 1)
    residual = v - (slope * u + intercept)
    total = ((v - v.mean()) ** 2).sum()
    r2 = 1.0 - (residual**2).sum() / total if total > 0 else 1.0
    return float(slope), float(intercept), float(r2)


def fit_decay(x, y) -> DecayFit:
    """Fit exponential and power-law decay to positive ``y`` at positive ``x`` (at least 3 points)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 3:
        raise ValueError(f"x and y must be 1-D of the same length >= 3, got shapes {x.shape} and {y.shape}")
    if (x <= 0).any() or (y <= 0).any() or not np.isfinite(y).all():
        raise ValueError("x and y must be positive and finite for a log-space fit")
    slope_e, icpt_e, r2_e = _line_fit(x, np.log(y))
    slope_p, icpt_p, r2_p = _line_fit(np.log(x), np.log(y))
    return DecayFit(-slope_e, icpt_e, r2_e, slope_p, icpt_p, r2_p)
