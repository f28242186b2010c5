"""The routers of the constrained models (chapter 7, *From theory to architecture*): how layer ``l``
of :class:`fvlib.models.FVTransformer` turns a context token ``x_i`` (in ``R^D``) and the
workspace ``Phi_{l-1}`` (in ``R^{(l-1) d}``) into its ``d`` keys ``k_i^l``; and :func:`measure`,
the one contraction of a model with its inputs (keys, pooling, predictions).

Router kinds (:data:`ROUTER_KINDS`; ``G`` is a ``(d, D)`` matrix, ``Phi`` the workspace):

* ``gated`` (:class:`GatedRouter`) -- ``k = G_l(Phi) x`` with ``G_l(Phi) = G_0 + MLP(Phi)``
  (multiplicative gating, as in GLU MLPs). ``Phi_0`` is empty, so ``G_1`` is the learned
  constant ``G_0``: layer 1 always measures fixed directions. Models A and B.
* ``linear`` (:class:`LinearRouter`) -- ``k = W_l x`` (no dependence on ``Phi``). Model C; as
  model A's router (``L = M`` layers, ``d = 1``) it makes ``Phi_M = W g`` with a free ``W`` of
  shape ``(M, D)`` and the prediction ``decoder(W g)``: exactly model B's function class.
* ``bilinear`` (:class:`BilinearRouter`) -- ``k = G_l(Phi) x`` with
  ``G_l(Phi) = G_0 + sum_j Phi_j U_j``: a multiplicative interaction between token and state
  and no hidden layer (``U_j`` start at zero: every layer starts non-adaptive).
* ``coord`` (:class:`CoordRouter`) -- each channel measures one coordinate ``sqrt(D) x_{i, a}``,
  the node ``a = argmax_n s_n(Phi)`` of scores ``s(Phi) = s_0 + MLP(Phi)`` over the ``D`` nodes
  (one node per layer for model A): the trained counterpart of the greedy theory, which measures
  one coordinate per layer. Training starts soft (a softmax mixture of the nodes whose
  temperature anneals from 1 to 0.05 over the first 80% of the steps) and ends hard (the one
  node, straight-through), as every evaluation is; the loop passes the share of training done
  (:func:`training_progress`; see the class).
* ``mlp`` (:class:`MLPRouter`) -- a plain MLP on the concatenation ``[x_i, Phi_{l-1}]``
  (optional, harder to train; not a choice of ``TrainConfig``).

Model A's router is a choice (:data:`MODEL_A_ROUTERS`, ``TrainConfig.router``; ``gated`` by
default, the model of every stored run); models B and C keep theirs.

**Keys linear in the token.** Every router but ``mlp`` computes ``k_i = G_l(Phi) x_i``
(:class:`TokenLinearRouter`: :meth:`~TokenLinearRouter.directions` is ``G_l(Phi)``), so the pooled
keys are ``(1/N) sum_i y_i G_l(Phi) x_i = G_l(Phi) g`` with the pooled statistic
``g = (1/N) sum_i y_i x_i`` (:meth:`~TokenLinearRouter.pool`): a model with such a router reads a
context only through ``g`` (:data:`STATISTIC_ROUTERS`). Every router is a function of tensors
without branches on their values, in-place updates of parameters or data-dependent shapes, so
stacks of models train under ``torch.func.vmap`` (:mod:`fvlib.training.batched`).

**measure.** Every contraction with the inputs (keys, pooling, the predictions of ``Q`` query
tokens) is one function, :func:`measure`, whose ``torch.func.vmap`` rule lets stacked models
read shared contexts once (:mod:`fvlib.training.batched`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = [
    "ROUTER_KINDS",
    "STATISTIC_ROUTERS",
    "MODEL_A_ROUTERS",
    "DEFAULT_ROUTER",
    "measure",
    "make_mlp",
    "TokenLinearRouter",
    "GatedRouter",
    "LinearRouter",
    "BilinearRouter",
    "CoordRouter",
    "MLPRouter",
    "make_router",
    "training_progress",
    "PROGRESS_BUFFER",
    "COORD_SOFT_SHARE",
    "COORD_FINAL_TEMPERATURE",
]

#: Every router kind of :class:`fvlib.models.ModelConfig` (``router``).
ROUTER_KINDS = ("gated", "mlp", "linear", "bilinear", "coord")
#: The routers whose keys are linear in the token (``k_i = G(Phi) x_i``): their models read a
#: context only through its pooled statistic.
STATISTIC_ROUTERS = ("gated", "linear", "bilinear", "coord")
#: The routers model A may take (``TrainConfig.router``, ``train --router``).
MODEL_A_ROUTERS = ("gated", "linear", "bilinear", "coord")
#: Model A's router unless a config says otherwise, the router of every run stored before the choice existed.
DEFAULT_ROUTER = "gated"


# ----------------------------------------------------------------------------------------
# measure: the model's one contraction with its inputs
# ----------------------------------------------------------------------------------------
class _Measure(torch.autograd.Function):
    """See :func:`measure`. Forward and backward are the ops autograd records for the plain
    expressions, so results and gradients are bitwise those of ``x @ W.T`` and ``torch.bmm``."""

    @staticmethod
    def forward(tokens, directions):
        if directions.ndim == 2:
            return tokens @ directions.T
        return torch.bmm(tokens, directions.transpose(1, 2))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        tokens, directions = ctx.saved_tensors
        grad_tokens = grad_directions = None
        if directions.ndim == 2:  # autograd of matmul: folded into one mm over the B R rows
            flat = grad.reshape(-1, grad.shape[-1])  # (B R, c)
            if ctx.needs_input_grad[0]:
                grad_tokens = flat.mm(directions).view(tokens.shape)
            if ctx.needs_input_grad[1]:
                grad_directions = flat.t().mm(tokens.reshape(-1, tokens.shape[-1]))
        else:  # autograd of bmm, then of the transpose
            if ctx.needs_input_grad[0]:
                grad_tokens = grad.bmm(directions)
            if ctx.needs_input_grad[1]:
                grad_directions = tokens.transpose(1, 2).bmm(grad).transpose(1, 2)
        return grad_tokens, grad_directions

    @staticmethod
    def vmap(info, in_dims, tokens, directions):
        """``torch.func.vmap`` over models (:mod:`fvlib.training.batched`): an operand that is not
        batched is shared by all ``k`` models and read once, the ``k`` models' rows or
        directions folded into one matrix product; the backward passes never read the
        tokens transposed."""
        t_dim, d_dim = in_dims
        tokens = tokens if t_dim is None else tokens.movedim(t_dim, 0)
        directions = directions if d_dim is None else directions.movedim(d_dim, 0)
        if directions.ndim - (d_dim is not None) == 2:
            return _measure_fixed_batched(tokens, directions, t_dim is not None, d_dim is not None)
        return _measure_per_context_batched(tokens, directions, t_dim is not None, d_dim is not None)


def _measure_fixed_batched(tokens, directions, tokens_batched: bool, directions_batched: bool):
    """vmap rule of :func:`measure` for directions ``(c, D)``: returns ``(out, out_dim)``."""
    if not directions_batched:  # tokens (k, B, R, D): one mm over all rows
        return tokens @ directions.T, 0
    k, c, D = directions.shape
    if not tokens_batched:  # tokens (B, R, D) shared: (B R, D) x (D, k c)
        out = tokens.reshape(-1, D) @ directions.reshape(k * c, D).T
        return out.view(*tokens.shape[:-1], k, c), tokens.ndim - 1
    out = torch.bmm(directions, tokens.reshape(k, -1, D).transpose(1, 2)).transpose(1, 2)  # (k, B R, c)
    return out.reshape(*tokens.shape[:-1], c), 0


def _measure_per_context_batched(tokens, directions, tokens_batched: bool, directions_batched: bool):
    """vmap rule of :func:`measure` for directions ``(B, c, D)``: returns ``(out, out_dim)``."""
    if tokens_batched and directions_batched:  # (k, B, ...): k B independent products
        k, B = tokens.shape[:2]
        out = torch.bmm(directions.flatten(0, 1), tokens.flatten(0, 1).transpose(1, 2)).transpose(1, 2)
        return out.unflatten(0, (k, B)), 0
    if directions_batched:  # tokens (B, R, D) shared, directions (k, B, c, D)
        k, B, c, D = directions.shape
        out = torch.bmm(directions.transpose(0, 1).reshape(B, k * c, D), tokens.transpose(1, 2))  # (B, k c, R)
        return out.view(B, k, c, -1).transpose(2, 3), 1
    k, B, R, D = tokens.shape  # directions (B, c, D) shared, tokens (k, B, R, D)
    out = torch.bmm(tokens.transpose(0, 1).reshape(B, k * R, D), directions.transpose(1, 2))  # (B, k R, c)
    return out.view(B, k, R, -1), 1


def measure(tokens: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """Inner products of every token with every direction: ``out[b, r, c] = <tokens[b, r], directions[., c]>``.

    ``tokens (B, R, D)`` with directions ``(c, D)`` (the same for every context) or
    ``(B, c, D)`` (one set per context) give ``(B, R, c)``. It is the one contraction of the
    model with its inputs: keys ``k_i = G x_i``, their pooling against the values
    ``sum_i y_i k_i`` and the predictions ``<theta_hat, x_q>``. Numbers and gradients are
    bitwise those of ``tokens @ directions.T``, ``torch.bmm`` and the equivalent ``einsum``; under
    ``torch.func.vmap`` over stacked models a shared operand (the same contexts for every
    model) is read once instead of once per model.
    """
    return _Measure.apply(tokens, directions)


# ----------------------------------------------------------------------------------------
# Routers
# ----------------------------------------------------------------------------------------
def make_mlp(n_in: int, n_out: int, width: int, hidden_layers: int) -> nn.Sequential:
    """``n_in -> width -> ... -> n_out`` with GELU; the last layer starts at zero weights."""
    layers: list[nn.Module] = []
    for i in range(hidden_layers):
        layers += [nn.Linear(n_in if i == 0 else width, width), nn.GELU()]
    last = nn.Linear(width, n_out)
    nn.init.zeros_(last.weight)
    nn.init.zeros_(last.bias)
    layers.append(last)
    return nn.Sequential(*layers)


def _measurement_init(channels: int, dim: int, row_norm: float) -> nn.Parameter:
    """A random ``(d, D)`` measurement matrix whose rows have norm about ``row_norm``."""
    return nn.Parameter(torch.randn(channels, dim) * (row_norm / math.sqrt(dim)))


class TokenLinearRouter(nn.Module):
    """A router whose keys are linear in the token, ``k_i = G(Phi) x_i``: a subclass gives
    :meth:`directions`, ``G(Phi)``; the keys on the tokens and the pooled keys on the statistic
    follow from it."""

    def directions(self, workspace: torch.Tensor) -> torch.Tensor:
        """``G(Phi)`` for the workspaces ``Phi (B, (l-1) d)``: ``(d, D)`` when it does not depend
        on ``Phi`` (one matrix for every context), else ``(B, d, D)``."""
        raise NotImplementedError

    def matrix(self, workspace: torch.Tensor) -> torch.Tensor:
        """The measurement matrices ``G(Phi)``, shape ``(B, d, D)``."""
        directions = self.directions(workspace)
        return directions.expand(workspace.shape[0], -1, -1) if directions.ndim == 2 else directions

    def forward(self, x: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor:
        """The keys ``k_i = G(Phi) x_i`` of tokens ``x (B, N, D)``: ``(B, N, d)``."""
        return measure(x, self.directions(workspace))

    def pool(self, g: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor:
        """The pooled keys ``G(Phi) g`` from the statistic ``g (B, D)``: ``(B, d)``."""
        return measure(g[:, None, :], self.directions(workspace))[:, 0]


class GatedRouter(TokenLinearRouter):
    """``k_i = G(Phi) x_i`` with ``G(Phi) = base + MLP(Phi)`` a ``(d, D)`` matrix; at layer 1
    ``Phi`` is empty and ``G`` is the learned constant ``base``. The MLP's last layer starts at
    zero, so every layer starts non-adaptive and learns to depend on ``Phi``."""

    def __init__(self, dim: int, channels: int, workspace_dim: int, width: int, hidden_layers: int):
        super().__init__()
        self.dim, self.channels = dim, channels
        # Standard normal entries (row norm sqrt(D)): E[phi^2] = E|theta|^2 at initialisation
        # for any prior, so the MLPs downstream see signal from the start.
        self.base = _measurement_init(channels, dim, math.sqrt(dim))
        self.gate = make_mlp(workspace_dim, channels * dim, width, hidden_layers) if workspace_dim else None

    def directions(self, workspace: torch.Tensor) -> torch.Tensor:
        if self.gate is None:
            return self.base
        return self.base + self.gate(workspace).view(-1, self.channels, self.dim)


class LinearRouter(TokenLinearRouter):
    """``k_i = W x_i`` with a fixed ``(d, D)`` matrix ``W``, whose rows start at norm ``row_norm``:
    1 before a linear decoder (model C: nothing downstream needs a large signal, and a small start
    lets the linear model shed off-target directions quickly, so it converges to the LMMSE
    sooner), ``sqrt(D)`` before an MLP decoder (model A's ``linear`` router: the start of the
    gated router's ``base``, so that the decoder sees the signal model B's sees)."""

    def __init__(self, dim: int, channels: int, row_norm: float = 1.0):
        super().__init__()
        self.weight = _measurement_init(channels, dim, row_norm)

    def directions(self, workspace: torch.Tensor) -> torch.Tensor:
        return self.weight


class BilinearRouter(TokenLinearRouter):
    """``k_i = G(Phi) x_i`` with ``G(Phi) = base + sum_j Phi_j U_j``: ``base`` a ``(d, D)``
    matrix, one ``(d, D)`` matrix ``U_j`` per workspace coordinate (``interaction``, shape
    ``((l-1) d, d D)``). A multiplicative interaction between the token and the state, and no
    hidden layer: ``d D (1 + (l-1) d)`` parameters at layer ``l``. ``base`` starts as the gated
    router's, the ``U_j`` at zero, so every layer starts non-adaptive; at layer 1 ``G`` is
    ``base``."""

    def __init__(self, dim: int, channels: int, workspace_dim: int):
        super().__init__()
        self.dim, self.channels = dim, channels
        self.base = _measurement_init(channels, dim, math.sqrt(dim))
        self.interaction = nn.Parameter(torch.zeros(workspace_dim, channels * dim)) if workspace_dim else None

    def directions(self, workspace: torch.Tensor) -> torch.Tensor:
        if self.interaction is None:
            return self.base
        return self.base + (workspace @ self.interaction).view(-1, self.channels, self.dim)


#: The coord router's schedule (:class:`CoordRouter`): over the first ``COORD_SOFT_SHARE`` of the
#: steps it measures a softmax mixture of the nodes at a temperature falling geometrically from
#: 1 to ``COORD_FINAL_TEMPERATURE``; after that, and at evaluation, one node.
COORD_SOFT_SHARE = 0.8
#: The temperature the coord router's softmax mixture reaches at the end of its soft phase.
COORD_FINAL_TEMPERATURE = 0.05
#: The name of the buffer through which the training loop tells a router how far training is.
PROGRESS_BUFFER = "progress"


class CoordRouter(TokenLinearRouter):
    """Each channel measures one coordinate: ``k_i = sqrt(D) x_{i, a}`` with ``a = argmax_n s_n(Phi)``.

    The scores ``s(Phi) = base + MLP(Phi)`` over the ``D`` nodes (``(d, D)``, one row per
    channel) are made as the gated router's matrix is (``base`` standard normal, the MLP's last
    layer at zero, so every layer starts at a fixed node; at layer 1 ``Phi`` is empty and the
    node is ``argmax base``). The direction is scaled by ``sqrt(D)``, the row norm the gated
    router starts at, so the networks downstream see a signal of the same size.

    **Schedule.** The training loop sets the buffer ``progress`` to the fraction of steps done
    (:func:`training_progress`; outside a training step it is 1). Over the first
    :data:`COORD_SOFT_SHARE` of training the router measures the mixture
    ``sqrt(D) softmax(s / tau)`` with ``tau`` falling geometrically from 1 to
    :data:`COORD_FINAL_TEMPERATURE`; for the rest, and at every evaluation, it measures the
    one-hot ``sqrt(D) e_a`` and the scores learn straight-through
    (``e_a + softmax(s) - stop_gradient(softmax(s))``: value ``e_a``, gradient of
    ``softmax(s)``), so the decoder finishes on the hard routes it is evaluated on. A trained
    model is a deterministic coordinate policy (:meth:`nodes`), comparable node for node with
    greedy's. Same parameter count as :class:`GatedRouter`; no branch on tensor values (the
    phase is a ``torch.where``), so stacks train under ``torch.func.vmap``."""

    def __init__(self, dim: int, channels: int, workspace_dim: int, width: int, hidden_layers: int):
        super().__init__()
        self.dim, self.channels = dim, channels
        self.base = nn.Parameter(torch.randn(channels, dim))
        self.score = make_mlp(workspace_dim, channels * dim, width, hidden_layers) if workspace_dim else None
        self.register_buffer(PROGRESS_BUFFER, torch.tensor(1.0), persistent=False)

    def scores(self, workspace: torch.Tensor) -> torch.Tensor:
        """The node scores ``s(Phi)``: ``(d, D)`` at layer 1, else ``(B, d, D)``."""
        if self.score is None:
            return self.base
        return self.base + self.score(workspace).view(-1, self.channels, self.dim)

    def nodes(self, workspace: torch.Tensor) -> torch.Tensor:
        """The node each channel measures, ``argmax_n s_n(Phi)``: ``(B, d)`` integers."""
        return self.scores(workspace).argmax(-1).expand(workspace.shape[0], -1)

    def directions(self, workspace: torch.Tensor) -> torch.Tensor:
        scores = self.scores(workspace)
        soft_phase = self.progress < COORD_SOFT_SHARE
        temperature = torch.pow(COORD_FINAL_TEMPERATURE, (self.progress / COORD_SOFT_SHARE).clamp(max=1.0))
        mixture = (scores / temperature).softmax(-1)
        soft = scores.softmax(-1)
        hard = torch.zeros_like(soft).scatter(-1, scores.argmax(-1, keepdim=True), 1.0)  # the nodes of nodes()
        one_hot = hard + (soft - soft.detach())  # value e_a, gradient of softmax(s)
        return math.sqrt(self.dim) * torch.where(soft_phase, mixture, one_hot)


@contextmanager
def training_progress(buffers: Iterable[tuple[str, torch.Tensor]], fraction: float) -> Iterator[None]:
    """Within the block, every buffer named :data:`PROGRESS_BUFFER` among the named ``buffers``
    (``model.named_buffers()``, or a stack's) holds ``fraction`` (the share of training done);
    after it, 1 (a trained router). The training loops wrap each step's forward and backward."""
    progress = [buffer for name, buffer in buffers if name.rsplit(".", 1)[-1] == PROGRESS_BUFFER]
    for buffer in progress:
        buffer.fill_(fraction)
    try:
        yield
    finally:
        for buffer in progress:
            buffer.fill_(1.0)


class MLPRouter(nn.Module):
    """``k_i = MLP([x_i, Phi])`` applied token by token."""

    def __init__(self, dim: int, channels: int, workspace_dim: int, width: int, hidden_layers: int):
        super().__init__()
        self.net = make_mlp(dim + workspace_dim, channels, width, hidden_layers)
        nn.init.normal_(self.net[-1].weight, std=1.0 / math.sqrt(width))

    def forward(self, x: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor:
        context = workspace[:, None, :].expand(-1, x.shape[1], -1)
        return self.net(torch.cat([x, context], dim=-1))


def make_router(kind: str, dim: int, channels: int, workspace_dim: int, width: int, hidden_layers: int,
                linear_row_norm: float = 1.0) -> nn.Module:
    """The router ``kind`` (:data:`ROUTER_KINDS`) of a layer reading tokens of dimension ``D = dim``
    and a workspace of ``workspace_dim`` numbers, with ``channels`` keys; ``width`` and
    ``hidden_layers`` size its MLP, ``linear_row_norm`` the start of a ``linear`` router's rows."""
    if kind == "gated":
        return GatedRouter(dim, channels, workspace_dim, width, hidden_layers)
    if kind == "coord":
        return CoordRouter(dim, channels, workspace_dim, width, hidden_layers)
    if kind == "bilinear":
        return BilinearRouter(dim, channels, workspace_dim)
    if kind == "mlp":
        return MLPRouter(dim, channels, workspace_dim, width, hidden_layers)
    if kind == "linear":
        return LinearRouter(dim, channels, linear_row_norm)
    raise ValueError(f"router must be one of {ROUTER_KINDS}, got {kind!r}")
