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

from dataclasses import dataclass, replace

import torch

from ._checks import check_instance, check_int, check_number, check_tensor
from .priors import Prior, TreePrior

__all__ = ["TaskBatch", "sample_task", "check_task_args", "make_generator", "MAX_NOISE_STD"]

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

    def to(self, device: str | torch.device, dtype: torch.dtype | None = None) -> "TaskBatch":
        """Move the float tensors to ``device`` (and ``dtype``); signs stay integer."""
        def move(t):
            return t.to(device=device, dtype=dtype or t.dtype)

        return replace(
            self,
            x=move(self.x),
            y=move(self.y),
            x_query=move(self.x_query),
            y_query=move(self.y_query),
            theta=move(self.theta),
            signs=None if self.signs is None else self.signs.to(device),
        )

    def sufficient_statistic(self) -> torch.Tensor:
        """``g_hat = (1/N) sum_i y_i x_i``, shape ``(B, D)``.

        Every linear measurement ``phi = (1/N) sum_i y_i (W x_i)`` equals ``W g_hat``.
        """
        return torch.einsum("bnd,bn->bd", self.x, self.y) / self.n_ctx


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
        x: optional ``(B, N, D)`` inputs to reuse (donor and target share their ``x_i``).
        dtype: dtype of the returned tensors (float32 for models, float64 for theory).
    """
    check_instance("prior", prior, Prior)
    check_int("batch", batch, 1)
    check_task_args(n_ctx, noise_std)
    check_instance("generator", generator, torch.Generator)
    if signs is not None:
        if not isinstance(prior, TreePrior):
            raise ValueError("signs can only be given for a tree prior")
        theta = prior.theta_from_signs(signs)
    elif isinstance(prior, TreePrior):
        signs = prior.sample_signs(batch, generator)
        theta = prior.theta_from_signs(signs)
    else:
        theta = prior.sample(batch, generator)
    if theta.shape[0] != batch:
        raise ValueError(f"signs hold {theta.shape[0]} paths but batch is {batch}")
    D = prior.dim
    if x is None:
        x = torch.randn(batch, n_ctx, D, generator=generator, dtype=dtype)
    else:
        check_tensor("x", x, (batch, n_ctx, D), "(B, N, D)")
    x = x.to(dtype)
    theta = theta.to(dtype)
    x_query = torch.randn(batch, D, generator=generator, dtype=dtype)
    eps = torch.randn(batch, n_ctx + 1, generator=generator, dtype=dtype)
    y = torch.bmm(x, theta[:, :, None])[..., 0] + noise_std * eps[:, :-1]
    y_query = (x_query * theta).sum(-1) + noise_std * eps[:, -1]
    return TaskBatch(x, y, x_query, y_query, theta, signs, float(noise_std))
