"""Priors over the latent context variable ``theta`` (the book's appendix *Conventions*, section "The tree prior and
its indexing"; chapter 2, *In-context regression as Bayesian inference*).

Two families:

* :class:`GaussianPrior` -- ``theta ~ N(0, C)``; isotropic (``C = I``) or the *Gaussian twin*
  of a tree prior (same second moments, no hierarchy).
* :class:`TreePrior` -- a balanced binary tree of depth ``K``. Internal nodes are stored in
  heap order: root 0, children of ``n`` are ``2n+1`` (sign -1) and ``2n+2`` (sign +1); level
  ``k`` holds nodes ``2^k - 1 .. 2^(k+1) - 2`` and ``D = 2^K - 1``. A leaf is a sign path
  ``s = (s_0, ..., s_{K-1})``; ``theta[n_k] = alpha^(k/2) s_k`` on the path nodes and 0 elsewhere.

Leaves are indexed ``0 .. 2^K - 1`` by reading the signs as binary digits, most significant
first (``s_k = +1`` is digit 1). Leaf ``j`` is therefore the ``j``-th leaf from the left and
the leaves under a node form one contiguous block.

All sampling goes through an explicit :class:`torch.Generator`, so results are reproducible.

**The prior kinds** a config names (``TrainConfig.prior``) are registered here, each once with its
builder ``(depth, alpha) -> Prior``: :func:`make_prior` looks the kind up, :func:`prior_kinds`
lists them, and a new prior is a class plus one :func:`register_prior` line. What code asks of a
prior it asks of the object (:attr:`~fvlib.priors.Prior.is_tree`: sign paths, the exact tree
posterior) or of its kind (:attr:`~fvlib.priors.PriorKind.is_tree`), never of a class name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

from ._checks import check_instance, check_int, check_number
from .registry import Registry

__all__ = ["Prior", "GaussianPrior", "TreePrior", "MAX_TREE_DEPTH", "check_tree_prior", "PriorKind", "register_prior",
           "unregister_prior", "prior_kinds", "get_prior_kind", "make_prior"]

#: Largest depth accepted by :class:`TreePrior` (``2^16`` leaves). Exact enumeration is
#: tested up to depth 12.
MAX_TREE_DEPTH = 16


class Prior:
    """Common interface: ``dim``, ``sample``, ``second_moment`` and ``energy``.

    ``is_tree`` says whether the prior is a balanced binary tree of sign paths with the
    interface of :class:`TreePrior` (``depth``, ``sample_signs``, ``theta_from_signs``,
    ``leaf_thetas``, ...), which the exact tree posterior, the strategies and patching need.
    """

    dim: int
    dtype: torch.dtype = torch.float64
    #: The prior is a balanced binary tree of sign paths with the interface of :class:`TreePrior`.
    is_tree: bool = False

    def sample(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        """Draw ``batch`` latents; returns a ``(batch, dim)`` tensor."""
        raise NotImplementedError

    def second_moment(self) -> torch.Tensor:
        """``E[theta theta^T]`` as a ``(dim, dim)`` tensor."""
        raise NotImplementedError

    @property
    def energy(self) -> float:
        """``E|theta|^2``, the trace of the second moment."""
        return float(torch.diagonal(self.second_moment()).sum())


class GaussianPrior(Prior):
    """``theta ~ N(0, cov)`` with a symmetric positive semi-definite ``(D, D)`` covariance."""

    def __init__(self, cov: torch.Tensor, name: str = "gaussian"):
        try:
            cov = torch.as_tensor(cov, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError("covariance must be a square (D, D) matrix of numbers, "
                             f"got {type(cov).__name__}") from None
        if cov.ndim != 2 or cov.shape[0] != cov.shape[1] or cov.shape[0] < 1:
            raise ValueError(f"covariance must be a square (D, D) matrix, got shape {tuple(cov.shape)}")
        if not torch.isfinite(cov).all():
            raise ValueError("covariance has non-finite entries")
        if not torch.allclose(cov, cov.T, atol=1e-10):
            raise ValueError("covariance must be symmetric")
        eigmin = float(torch.linalg.eigvalsh(cov).min())
        if eigmin < -1e-10:
            raise ValueError(f"covariance must be positive semi-definite (smallest eigenvalue {eigmin:.3g})")
        self.cov = cov
        self.dim = cov.shape[0]
        self.name = name

    @classmethod
    def isotropic(cls, dim: int, variance: float = 1.0) -> GaussianPrior:
        """``N(0, variance * I_dim)``."""
        check_int("dim", dim, 1)
        check_number("variance", variance, 0, low_open=True)
        return cls(variance * torch.eye(dim, dtype=torch.float64), name="gaussian")

    @classmethod
    def twin_of(cls, prior: Prior) -> GaussianPrior:
        """The Gaussian with the same second moments as ``prior`` (no hierarchy)."""
        return cls(check_instance("prior", prior, Prior).second_moment(), name="gaussian-twin")

    @cached_property
    def variances(self) -> torch.Tensor:
        """Diagonal of the covariance, shape ``(D,)``."""
        return torch.diagonal(self.cov).clone()

    @cached_property
    def _factor(self) -> torch.Tensor:
        evals, evecs = torch.linalg.eigh(self.cov)
        return evecs * evals.clamp_min(0).sqrt()

    def second_moment(self) -> torch.Tensor:
        return self.cov

    def sample(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        check_instance("generator", generator, torch.Generator)
        z = torch.randn(check_int("batch", batch, 1), self.dim, generator=generator, dtype=torch.float64)
        return z @ self._factor.T

    def __repr__(self) -> str:
        return f"GaussianPrior(name={self.name!r}, dim={self.dim})"


class TreePrior(Prior):
    """Hierarchical prior on a balanced binary tree of depth ``K`` with decay ``alpha``.

    ``|theta|^2 = sum_{k<K} alpha^k`` for every leaf and ``E[theta theta^T] = diag(v)`` with
    ``v_n = alpha^k / 2^k`` for a node ``n`` at level ``k``.
    """

    is_tree = True

    def __init__(self, depth: int, alpha: float):
        check_int("depth", depth, 1, MAX_TREE_DEPTH)
        alpha = float(check_number("alpha", alpha, 0.0, 1.0, low_open=True))
        self.depth = depth
        self.alpha = alpha
        self.dim = 2**depth - 1
        self.num_leaves = 2**depth
        self.name = "tree"

    # ----- structure -------------------------------------------------------------------
    @cached_property
    def node_levels(self) -> torch.Tensor:
        """Level of every node, shape ``(D,)`` (``level(n) = floor(log2(n + 1))``)."""
        return torch.cat([torch.full((2**k,), k, dtype=torch.long) for k in range(self.depth)])

    @cached_property
    def level_scales(self) -> torch.Tensor:
        """``alpha^(k/2)``: the magnitude of ``theta`` on the path node at level ``k``; ``(K,)``."""
        return self.alpha ** (torch.arange(self.depth, dtype=torch.float64) / 2)

    @cached_property
    def node_variances(self) -> torch.Tensor:
        """``v_n = alpha^k / 2^k`` for node ``n`` at level ``k``; shape ``(D,)``."""
        k = self.node_levels.to(torch.float64)
        return (self.alpha / 2.0) ** k

    def level_nodes(self, level: int) -> torch.Tensor:
        """Node ids at ``level`` (``2^k - 1 .. 2^(k+1) - 2``)."""
        check_int("level", level, 0, self.depth - 1)
        return torch.arange(2**level - 1, 2 ** (level + 1) - 1)

    @cached_property
    def all_signs(self) -> torch.Tensor:
        """Sign paths of all leaves in leaf order, shape ``(2^K, K)`` with entries +-1."""
        j = torch.arange(self.num_leaves)
        bits = (j[:, None] >> torch.arange(self.depth - 1, -1, -1)) & 1
        return (2 * bits - 1).to(torch.long)

    def path_nodes(self, signs: torch.Tensor) -> torch.Tensor:
        """Nodes visited by sign paths: ``(..., K)`` signs -> ``(..., K)`` node ids."""
        signs = self._check_signs(signs)
        nodes = torch.zeros_like(signs)
        for k in range(1, self.depth):
            nodes[..., k] = 2 * nodes[..., k - 1] + 1 + (signs[..., k - 1] > 0).long()
        return nodes

    def leaf_index(self, signs: torch.Tensor) -> torch.Tensor:
        """Leaf ids of sign paths: ``(..., K)`` -> ``(...)``."""
        bits = (self._check_signs(signs) > 0).long()
        weights = 2 ** torch.arange(self.depth - 1, -1, -1)
        return (bits * weights).sum(-1)

    def theta_from_signs(self, signs: torch.Tensor) -> torch.Tensor:
        """Latents of sign paths: ``(..., K)`` -> ``(..., D)`` (float64)."""
        signs = self._check_signs(signs)
        theta = torch.zeros(*signs.shape[:-1], self.dim, dtype=torch.float64)
        values = signs.to(torch.float64) * self.level_scales
        theta.scatter_(-1, self.path_nodes(signs), values)
        return theta

    @cached_property
    def leaf_thetas(self) -> torch.Tensor:
        """``theta`` of every leaf, shape ``(2^K, D)``."""
        return self.theta_from_signs(self.all_signs)

    def _check_signs(self, signs: torch.Tensor) -> torch.Tensor:
        signs = torch.as_tensor(signs)
        if signs.shape[-1:] != (self.depth,):
            raise ValueError(f"signs must have last dimension {self.depth}, got shape {tuple(signs.shape)}")
        if not ((signs == 1) | (signs == -1)).all():
            raise ValueError("signs must be +1 or -1")
        return signs.to(torch.long)

    # ----- moments and sampling ---------------------------------------------------------
    def second_moment(self) -> torch.Tensor:
        return torch.diag(self.node_variances)

    @property
    def energy(self) -> float:
        return float(sum(self.alpha**k for k in range(self.depth)))

    def sample_signs(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        """Uniform sign paths, shape ``(batch, K)``."""
        check_instance("generator", generator, torch.Generator)
        bits = torch.randint(0, 2, (check_int("batch", batch, 1), self.depth), generator=generator)
        return 2 * bits - 1

    def sample(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        return self.theta_from_signs(self.sample_signs(batch, generator))

    def __repr__(self) -> str:
        return f"TreePrior(depth={self.depth}, alpha={self.alpha})"


def check_tree_prior(name: str, value) -> TreePrior:
    """``value`` if it is a tree prior (:attr:`Prior.is_tree`), else ``ValueError`` naming ``name``
    and what was given."""
    if not (isinstance(value, Prior) and value.is_tree):
        raise ValueError(f"{name} must be a tree prior (a TreePrior: sign paths, the exact tree posterior), "
                         f"got {type(value).__name__}")
    return value


# ----------------------------------------------------------------------------------------
# The registry of prior kinds
# ----------------------------------------------------------------------------------------
#: ``(depth, alpha) -> Prior``: what a kind builds from a config's tree depth and decay.
PriorBuilder = Callable[[int, float], Prior]


@dataclass(frozen=True)
class PriorKind:
    """A registered prior kind.

    Attributes:
        name: its name (``TrainConfig.prior``).
        build: its ``PriorBuilder``, ``(depth, alpha) -> Prior``.
        description: one line for listings.
        is_tree: its priors are trees (:attr:`Prior.is_tree`), read once from the prior it
            builds at depth 1 when it is registered.
    """

    name: str
    build: PriorBuilder
    description: str
    is_tree: bool


_PRIOR_KINDS: Registry[PriorKind] = Registry("prior kind", "prior")


def register_prior(name: str, build: PriorBuilder, description: str = "") -> PriorKind:
    """Register the prior kind ``name``, built by ``build(depth, alpha)``; ``ValueError`` if
    ``name`` is taken or not a non-empty string."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a prior kind's name must be a non-empty string, got {name!r}")
    return _PRIOR_KINDS.add(name, PriorKind(name, build, description, bool(build(1, 0.5).is_tree)))


def unregister_prior(name: str) -> None:
    """Remove the prior kind ``name`` (``ValueError`` if it is not registered)."""
    _PRIOR_KINDS.remove(name)


def prior_kinds() -> tuple[str, ...]:
    """The registered prior kinds' names, in the order they were registered."""
    return _PRIOR_KINDS.names()


def get_prior_kind(name: str) -> PriorKind:
    """The registered :class:`PriorKind` ``name``; ``ValueError`` naming ``name`` and the registered kinds."""
    return _PRIOR_KINDS.get(name)


def make_prior(kind: str, depth: int, alpha: float = 0.5) -> Prior:
    """Build a prior of the registered ``kind`` (:func:`prior_kinds`) from a tree depth and decay."""
    return get_prior_kind(kind).build(depth, alpha)


def _twin_of_tree(depth: int, alpha: float) -> GaussianPrior:
    return GaussianPrior.twin_of(TreePrior(depth, alpha))


def _isotropic_like_tree(depth: int, alpha: float) -> GaussianPrior:
    tree = TreePrior(depth, alpha)
    return GaussianPrior.isotropic(tree.dim, tree.energy / tree.dim)


register_prior("tree", TreePrior, "the tree prior of depth K and decay alpha")
register_prior("gaussian-twin", _twin_of_tree, "the Gaussian twin of that tree (same second moments)")
register_prior("gaussian", _isotropic_like_tree,
               "the isotropic Gaussian in D = 2^K - 1 dimensions with the tree's energy E|theta|^2 (the same "
               "loss scale)")
