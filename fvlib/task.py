"""The in-context regression task (the book's appendix *Conventions*, section "The task and the loss";
chapter 2, *In-context regression as Bayesian inference*).

A context holds ``N`` tokens ``z_i = (x_i, y_i)`` with ``x_i ~ N(0, I_D)`` and
``y_i = <theta, x_i> + sigma * eps_i``; a query ``x_q`` has the same law and the target is
``y_q = <theta, x_q> + sigma * eps_q``. For a prediction ``y_hat = <theta_hat, x_q>``,
``E(y_hat - y_q)^2 = sigma^2 + E|theta_hat - theta|^2``; the book reports the *excess* loss
``E|theta_hat - theta|^2``.

The same :class:`TaskBatch` feeds training, evaluation and the theory baselines, so they can
be compared on the very same contexts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ._checks import check_finite, check_instance, check_int, check_number, check_tensor
from .priors import Prior
from .resources import check_fits

__all__ = ["TaskBatch", "StatisticBatch", "sample_task", "sample_statistic_task", "sample_statistic", "sample_chi2",
           "check_task_args", "make_generator", "MAX_NOISE_STD"]

#: Largest label noise ``sigma`` accepted: far beyond any signal (``|theta|^2 <= K <= 16``),
#: and far below where ``sigma^2`` overflows (float32 arithmetic near ``1e19``).
MAX_NOISE_STD = 1e6


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A seeded :class:`torch.Generator` (the only source of randomness in fvlib).

    Any seed torch takes, ``[0, 2^64 - 1]``: a seed a user gives is in ``[0, MAX_SEED]``
    (``fvlib._checks.check_seed``), the seeds derived from it add offsets to it.
    """
    check_int("seed", seed, 0, 2**64 - 1)
    return torch.Generator(device=device).manual_seed(seed)


@dataclass(frozen=True)
class TaskBatch:
    """A batch of ``B`` contexts of ``N`` tokens in dimension ``D``.

    Attributes:
        x: ``(B, N, D)`` context inputs.
        y: ``(B, N)`` context labels.
        x_query: ``(B, D)`` query inputs.
        y_query: ``(B,)`` query labels (with label noise).
        theta: ``(B, D)`` latents.
        signs: ``(B, K)`` leaf sign paths for a tree prior, else ``None``.
        noise_std: the label noise ``sigma``.
    """

    x: torch.Tensor
    y: torch.Tensor
    x_query: torch.Tensor
    y_query: torch.Tensor
    theta: torch.Tensor
    signs: torch.Tensor | None
    noise_std: float

    @property
    def batch_size(self) -> int:
        return self.x.shape[0]

    @property
    def n_ctx(self) -> int:
        return self.x.shape[1]

    def to(self, device: str | torch.device, dtype: torch.dtype | None = None) -> TaskBatch:
        """Move the float tensors to ``device`` (and ``dtype``); signs stay integer."""
        return _moved(self, ("x", "y", "x_query", "y_query", "theta"), device, dtype)

    def sufficient_statistic(self) -> torch.Tensor:
        """``g_hat = (1/N) sum_i y_i x_i``, shape ``(B, D)``.

        Every linear measurement ``phi = (1/N) sum_i y_i (W x_i)`` equals ``W g_hat``.
        """
        return torch.einsum("bnd,bn->bd", self.x, self.y) / self.n_ctx

    def pooled(self) -> StatisticBatch:
        """The same contexts as their pooled statistics (:class:`StatisticBatch`)."""
        return StatisticBatch(self.sufficient_statistic(), self.x_query, self.y_query, self.theta, self.signs,
                              self.noise_std, self.n_ctx)


@dataclass(frozen=True)
class StatisticBatch:
    """A batch of ``B`` contexts given by their pooled statistic ``g = (1/N) sum_i y_i x_i``
    instead of their ``N`` tokens: all that models whose keys are linear in the token read
    (:attr:`fvlib.models.FVTransformer.reads_statistic`), and all the theory reads.

    Attributes:
        g: ``(B, D)`` pooled statistics.
        x_query, y_query, theta, signs, noise_std: as in :class:`TaskBatch`.
        n_ctx: the context length ``N`` the statistic pools.
    """

    g: torch.Tensor
    x_query: torch.Tensor
    y_query: torch.Tensor
    theta: torch.Tensor
    signs: torch.Tensor | None
    noise_std: float
    n_ctx: int

    @property
    def batch_size(self) -> int:
        return self.g.shape[0]

    def to(self, device: str | torch.device, dtype: torch.dtype | None = None) -> StatisticBatch:
        """Move the float tensors to ``device`` (and ``dtype``); signs stay integer."""
        return _moved(self, ("g", "x_query", "y_query", "theta"), device, dtype)

    def sufficient_statistic(self) -> torch.Tensor:
        """``g``, shape ``(B, D)`` (as :meth:`TaskBatch.sufficient_statistic`)."""
        return self.g


def _moved(batch, float_fields, device, dtype):
    """``batch`` (a frozen dataclass) with ``float_fields`` moved to ``device`` (and ``dtype``) and
    its integer ``signs`` to ``device``."""
    moved = {name: getattr(batch, name).to(device=device, dtype=dtype or getattr(batch, name).dtype)
             for name in float_fields}
    return replace(batch, **moved, signs=None if batch.signs is None else batch.signs.to(device))


def check_task_args(n_ctx: int, noise_std: float) -> None:
    """Raise ``ValueError`` naming the bad value for a bad context length or noise level."""
    check_int("n_ctx", n_ctx, 1)
    check_number("noise_std", noise_std, 0, MAX_NOISE_STD)


def sample_task(
    prior: Prior,
    batch: int,
    n_ctx: int,
    noise_std: float,
    generator: torch.Generator,
    *,
    signs: torch.Tensor | None = None,
    x: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> TaskBatch:
    """Sample ``batch`` in-context regression problems.

    Args:
        prior: the prior of ``theta``.
        batch, n_ctx: number of contexts ``B`` and tokens per context ``N``.
        noise_std: label noise ``sigma >= 0``.
        generator: the random source.
        signs: optional ``(B, K)`` leaf paths to use instead of sampling (tree prior only);
            used by the patching experiments to pick donor and target leaves.
        x: optional ``(B, N, D)`` inputs to reuse (donor and target share their ``x_i``), finite.
        dtype: dtype of the returned tensors, a floating-point one (float32 for models, float64
            for theory).

    A ``batch`` whose tensors would need more memory than there is
    (:func:`fvlib.resources.available_memory`) raises ``ValueError`` before anything is drawn.
    """
    _check_sample_args(prior, batch, n_ctx, noise_std, generator, dtype, tokens=True)
    if x is not None:
        check_tensor("x", x, (batch, n_ctx, prior.dim), "(B, N, D)")
        check_finite("x", x)
    theta, signs = _sample_latents(prior, batch, generator, signs)
    D = prior.dim
    if x is None:
        x = torch.randn(batch, n_ctx, D, generator=generator, dtype=dtype)
    x = x.to(dtype)
    theta = theta.to(dtype)
    x_query = torch.randn(batch, D, generator=generator, dtype=dtype)
    eps = torch.randn(batch, n_ctx + 1, generator=generator, dtype=dtype)
    y = torch.bmm(x, theta[:, :, None])[..., 0] + noise_std * eps[:, :-1]
    y_query = (x_query * theta).sum(-1) + noise_std * eps[:, -1]
    return TaskBatch(x, y, x_query, y_query, theta, signs, float(noise_std))


def _check_sample_args(prior, batch, n_ctx, noise_std, generator, dtype, *, tokens: bool) -> None:
    """The arguments of :func:`sample_task` (``tokens``) and :func:`sample_statistic_task`, and the
    memory their tensors need: per context ``N (D + 3) + 3 D`` numbers of ``dtype`` with the tokens
    (``x``, ``y``, the noise and the product, the query and ``theta``), ``4 D`` without, and the
    float64 latents and int64 signs."""
    check_instance("prior", prior, Prior)
    check_int("batch", batch, 1)
    check_task_args(n_ctx, noise_std)
    check_instance("generator", generator, torch.Generator)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype (torch.float32 for models, torch.float64 "
                         f"for the theory), got {dtype!r}")
    D = prior.dim
    numbers = n_ctx * (D + 3) + 3 * D if tokens else 4 * D
    check_fits("batch", batch, batch * (numbers * dtype.itemsize + 16.0 * D))


def _sample_latents(prior, batch, generator, signs):
    """``(theta (B, D), signs (B, K) or None)`` of :func:`sample_task` (its arguments checked)."""
    if signs is not None:
        if not prior.is_tree:
            raise ValueError(f"signs can only be given for a tree prior, got {prior!r}")
        theta = prior.theta_from_signs(signs)
    elif prior.is_tree:
        signs = prior.sample_signs(batch, generator)
        theta = prior.theta_from_signs(signs)
    else:
        theta = prior.sample(batch, generator)
    if theta.shape[0] != batch:
        raise ValueError(f"signs hold {theta.shape[0]} paths but batch is {batch}")
    return theta, signs


def sample_statistic_task(
    prior: Prior,
    batch: int,
    n_ctx: int,
    noise_std: float,
    generator: torch.Generator,
    *,
    signs: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> StatisticBatch:
    """Sample ``batch`` in-context regression problems as their pooled statistics: what
    :func:`sample_task` followed by :meth:`TaskBatch.pooled` gives, in law, without drawing the
    ``B x N x D`` token inputs (:func:`sample_statistic`, ``O(D)`` per context). Latents, then
    statistics, then the query token and its label are drawn from ``generator``. ``dtype`` and a
    ``batch`` too large for memory are refused as in :func:`sample_task`."""
    _check_sample_args(prior, batch, n_ctx, noise_std, generator, dtype, tokens=False)
    theta, signs = _sample_latents(prior, batch, generator, signs)
    g = sample_statistic(theta, n_ctx, noise_std, generator, dtype=dtype)
    theta = theta.to(dtype)
    x_query = torch.randn(batch, prior.dim, generator=generator, dtype=dtype)
    eps = torch.randn(batch, generator=generator, dtype=dtype)
    y_query = (x_query * theta).sum(-1) + noise_std * eps
    return StatisticBatch(g, x_query, y_query, theta, signs, float(noise_std), n_ctx)


# ----------------------------------------------------------------------------------------
# The pooled statistic, drawn without the tokens
# ----------------------------------------------------------------------------------------
def _standard_normal(shape, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, generator=generator, dtype=dtype)


def sample_chi2(dof: int, size: int, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``size`` chi-square variates with ``dof >= 0`` degrees of freedom, ``(size,)``, exact,
    from ``generator`` alone (torch's own gamma sampler takes no generator).

    ``dof = 0`` gives zeros, ``dof = 1`` a squared normal; otherwise ``2 Gamma(dof / 2)`` by
    Marsaglia and Tsang's rejection method (shape ``>= 1``; more than 95% of proposals are kept,
    and the loop redraws only the rejected ones, so the cost is ``O(size)``). Computed in float64,
    with the acceptance test written as ``d (log v - expm1(log v))`` so that it stays accurate
    for any ``dof`` (a context of ``10^12`` tokens included), then cast to ``dtype``.
    """
    check_int("dof", dof, 0)
    if dof == 0:
        return torch.zeros(size, dtype=dtype)
    if dof == 1:
        return _standard_normal(size, generator, dtype).square()
    d = dof / 2 - 1 / 3
    c = 1 / math.sqrt(9 * d)
    out = torch.empty(size, dtype=torch.float64)
    todo = torch.arange(size)
    while todo.numel():
        z = _standard_normal(todo.numel(), generator, torch.float64)
        log_u = torch.rand(todo.numel(), generator=generator, dtype=torch.float64).log()
        positive = c * z > -1  # v = (1 + c z)^3 > 0
        log_v = 3 * torch.log1p((c * z).clamp_min(-1 + 1e-15))
        ok = positive & (log_u < 0.5 * z.square() + d * (log_v - torch.expm1(log_v)))
        out[todo[ok]] = 2 * d * log_v[ok].exp()
        todo = todo[~ok]
    return out.to(dtype)


def sample_statistic(
    theta: torch.Tensor, n_ctx: int, noise_std: float, generator: torch.Generator, *, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Draw the pooled statistic ``g = (1/N) sum_i y_i x_i`` of one context per latent, exactly
    and without the tokens, in ``O(D)`` per context whatever ``N`` (the book's appendix
    *Derivations*, section "An exact sampler for the pooled statistic").

    With ``u = theta / |theta|`` and ``a_i = <x_i, u>``, ``y_i = |theta| a_i + sigma eps_i`` and
    ``g = u (1/N) sum_i a_i y_i + (sqrt(sum_i y_i^2) / N) P_perp z`` with ``z ~ N(0, I_D)``. The two
    sums are functions of the ``2 x 2`` Gram matrix ``S`` of the vectors ``(a_i)`` and ``(eps_i)``,
    a Wishart matrix with ``N`` degrees of freedom, drawn by Bartlett's decomposition ``S = T T^T``,
    ``T = [[c_1, 0], [n, c_2]]`` with ``c_1^2 ~ chi2(N)``, ``c_2^2 ~ chi2(N - 1)``, ``n ~ N(0, 1)``
    (``N = 1`` included: ``c_2 = 0``).

    Args:
        theta: ``(B, D)`` latents.
        dtype: of the draws and the result (float64 for the theory, float32 for training).
    Returns:
        ``(B, D)`` statistics.
    """
    check_task_args(n_ctx, noise_std)
    check_instance("generator", generator, torch.Generator)
    theta = check_tensor("theta", theta, (None, None), "(B, D)").to(torch.float64)  # cast at the end
    B, D = theta.shape
    c1 = sample_chi2(n_ctx, B, generator).sqrt()
    c2 = sample_chi2(n_ctx - 1, B, generator).sqrt()
    n = _standard_normal(B, generator, torch.float64)
    s_aa, s_ae, s_ee = c1.square(), c1 * n, n.square() + c2.square()  # S = T T^T
    r = theta.norm(dim=-1)
    sum_ay = r * s_aa + noise_std * s_ae
    sum_yy = (r.square() * s_aa + 2 * noise_std * r * s_ae + noise_std**2 * s_ee).clamp_min(0)
    u = torch.where(r[:, None] > 0, theta / r.clamp_min(1e-300)[:, None], torch.zeros_like(theta))
    z = _standard_normal((B, D), generator, torch.float64)
    z_perp = z - (z * u).sum(-1, keepdim=True) * u
    return ((sum_ay / n_ctx)[:, None] * u + (sum_yy.sqrt() / n_ctx)[:, None] * z_perp).to(dtype)
