"""Constrained linear-attention transformers: models A, B and C (chapter 7, *From theory to
architecture*; the book's appendix *Conventions*, section "Models A, B, C").

A context of ``N`` tokens ``z_i = (x_i, y_i)`` and a query token ``x_q`` go in; layer
``l = 1..L`` computes

* keys ``k_i^l = router_l(x_i, Phi_{l-1})`` in ``R^d`` (``d`` heads, one scalar channel each),
* values ``v_i = y_i``,
* the pooled statistic ``phi_l = (1/N) sum_i k_i^l v_i`` in ``R^d`` (linear attention with
  uniform weights, so every token receives the same ``phi_l``),
* the workspace (function vector) ``Phi_l = Phi_{l-1} (+) phi_l`` in ``R^{l d}``,

and the readout is ``theta_hat = decoder(Phi_L)`` in ``R^D``, ``y_hat_q = <theta_hat, x_q>``.
Every contraction with the inputs (keys, pooling, the predictions of ``Q`` query tokens) is one
function, :func:`measure`, whose ``torch.func.vmap`` rule lets stacked models read shared
contexts once (:mod:`fvlib.training.batched`).

Router kinds:

* ``gated`` -- ``k = G_l(Phi_{l-1}) x`` with ``G_l`` an MLP from ``Phi_{l-1}`` to a ``(d, D)``
  matrix (multiplicative gating, as in GLU MLPs). ``Phi_0`` is empty, so ``G_1`` is a learned
  constant matrix: layer 1 always measures fixed directions.
* ``mlp`` -- a plain MLP on the concatenation ``[x_i, Phi_{l-1}]`` (optional, harder to train).
* ``linear`` -- ``k = W_l x`` (no dependence on ``Phi``).

Decoder kinds: ``mlp`` and ``linear`` (no bias).

**Two paths, one function.** With a gated or linear router the keys are linear in the token,
``k_i = G_l(Phi) x_i``, so ``phi_l = (1/N) sum_i y_i G_l(Phi) x_i = G_l(Phi) g`` with the pooled
statistic ``g = (1/N) sum_i y_i x_i`` (chapter 3): such a model reads a context only through
``g`` (:attr:`FVTransformer.reads_statistic`). It runs on the tokens (a
:class:`~fvlib.task.TaskBatch`, or ``x, y, x_query``) or on the statistic (a
:class:`~fvlib.task.StatisticBatch`, or :meth:`FVTransformer.forward_statistic` with ``g,
x_query``); the two agree to float rounding. On the statistic there are no per-token keys, so
``hook_keys`` does not fire; every other hook does.

Hook points (:mod:`fvlib.hooks`). **Layers are numbered from 1**, as in the book's math, so
``blocks.1`` is the first layer and ``blocks.{L}`` the last; the hook names are also the module
paths (``model.blocks["1"].hook_keys``):

* ``blocks.{l}.hook_keys`` -- ``(B, N, d)``: keys ``k_i^l`` of every context token;
* ``blocks.{l}.hook_phi`` -- ``(B, d)``: pooled statistic ``phi_l``;
* ``blocks.{l}.hook_workspace`` -- ``(B, l d)``: workspace ``Phi_l = (phi_1, ..., phi_l)``;
* ``hook_theta_hat`` -- ``(B, D)``: decoder output ``theta_hat``;
* ``hook_prediction`` -- ``(B,)``: query prediction ``y_hat_q`` (``(B, Q)`` for ``Q`` query
  tokens per context).

:func:`fvlib.hooks.hook_name` builds every name (``hook_name("keys", l)``,
``hook_name("theta_hat")``); the hooks themselves are those of :class:`fvlib.hooks.HookedModel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ._checks import DictRoundTrip, check_int
from .hooks import LAYER_HOOKS, MODEL_HOOKS, HookedModel, HookPoint, check_model_input, hook_name
from .priors import Prior
from .task import StatisticBatch

__all__ = [
    "ROUTER_KINDS",
    "STATISTIC_ROUTERS",
    "DECODER_KINDS",
    "MODEL_KINDS",
    "ModelConfig",
    "FVTransformer",
    "model_a",
    "model_b",
    "model_c",
    "model_config",
    "make_model",
    "measure",
]

ROUTER_KINDS = ("gated", "mlp", "linear")
#: The routers whose keys are linear in the token (``k_i = G(Phi) x_i``): their models read a
#: context only through its pooled statistic.
STATISTIC_ROUTERS = ("gated", "linear")
DECODER_KINDS = ("mlp", "linear")
MODEL_KINDS = ("A", "B", "C")


# ----------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelConfig(DictRoundTrip):
    """Architecture of an :class:`FVTransformer`.

    Attributes:
        dim: input dimension ``D`` (``2^K - 1`` for a tree of depth ``K``).
        n_layers: depth ``L``.
        channels: channels per layer ``d``; the communication budget is ``M = d L``.
        router: ``'gated'``, ``'mlp'`` or ``'linear'``.
        decoder: ``'mlp'`` or ``'linear'``.
        width: hidden width of the router and decoder MLPs.
        hidden_layers: number of hidden layers of each MLP (router and decoder).
    """

    WHAT: ClassVar[str] = "model config"

    dim: int
    n_layers: int
    channels: int
    router: str = "gated"
    decoder: str = "mlp"
    width: int = 128
    hidden_layers: int = 2

    def __post_init__(self):
        for name in ("dim", "n_layers", "channels", "width", "hidden_layers"):
            check_int(name, getattr(self, name), 1)
        if self.router not in ROUTER_KINDS:
            raise ValueError(f"router must be one of {ROUTER_KINDS}, got {self.router!r}")
        if self.decoder not in DECODER_KINDS:
            raise ValueError(f"decoder must be one of {DECODER_KINDS}, got {self.decoder!r}")

    @property
    def budget(self) -> int:
        """Total communication budget ``M = d L``."""
        return self.channels * self.n_layers



# ----------------------------------------------------------------------------------------
# Building blocks
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


def _mlp(n_in: int, n_out: int, width: int, hidden_layers: int) -> nn.Sequential:
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


class GatedRouter(nn.Module):
    """``k_i = G(Phi) x_i`` with ``G(Phi) = base + MLP(Phi)`` a ``(d, D)`` matrix; at layer 1
    ``Phi`` is empty and ``G`` is the learned constant ``base``. The MLP's last layer starts at
    zero, so every layer starts non-adaptive and learns to depend on ``Phi``."""

    def __init__(self, dim: int, channels: int, workspace_dim: int, width: int, hidden_layers: int):
        super().__init__()
        self.dim, self.channels = dim, channels
        # Standard normal entries (row norm sqrt(D)): E[phi^2] = E|theta|^2 at initialisation
        # for any prior, so the MLPs downstream see signal from the start.
        self.base = _measurement_init(channels, dim, math.sqrt(dim))
        self.gate = _mlp(workspace_dim, channels * dim, width, hidden_layers) if workspace_dim else None

    def matrix(self, workspace: torch.Tensor) -> torch.Tensor:
        """The measurement matrices ``G(Phi)``, shape ``(B, d, D)``."""
        base = self.base.expand(workspace.shape[0], -1, -1)
        if self.gate is None:
            return base
        return base + self.gate(workspace).view(-1, self.channels, self.dim)

    def forward(self, x: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor:
        if self.gate is None:
            return measure(x, self.base)
        return measure(x, self.matrix(workspace))

    def pool(self, g: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor:
        """The pooled keys ``G(Phi) g`` from the statistic ``g (B, D)``: ``(B, d)``."""
        return measure(g[:, None, :], self.base if self.gate is None else self.matrix(workspace))[:, 0]


class LinearRouter(nn.Module):
    """``k_i = W x_i`` with a fixed ``(d, D)`` matrix ``W``."""

    def __init__(self, dim: int, channels: int):
        super().__init__()
        # Unit-norm rows: nothing downstream needs a large signal, and a small start lets the
        # linear model shed off-target directions quickly (it converges to the LMMSE sooner).
        self.weight = _measurement_init(channels, dim, 1.0)

    def forward(self, x: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor:
        return measure(x, self.weight)

    def pool(self, g: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor:
        """The pooled keys ``W g`` from the statistic ``g (B, D)``: ``(B, d)``."""
        return measure(g[:, None, :], self.weight)[:, 0]


class MLPRouter(nn.Module):
    """``k_i = MLP([x_i, Phi])`` applied token by token."""

    def __init__(self, dim: int, channels: int, workspace_dim: int, width: int, hidden_layers: int):
        super().__init__()
        self.net = _mlp(dim + workspace_dim, channels, width, hidden_layers)
        nn.init.normal_(self.net[-1].weight, std=1.0 / math.sqrt(width))

    def forward(self, x: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor:
        context = workspace[:, None, :].expand(-1, x.shape[1], -1)
        return self.net(torch.cat([x, context], dim=-1))


class Block(nn.Module):
    """One layer: route (keys), pool against the values ``y_i``, append to the workspace."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        workspace_dim = (layer - 1) * config.channels
        if config.router == "gated":
            self.router = GatedRouter(
                config.dim, config.channels, workspace_dim, config.width, config.hidden_layers
            )
        elif config.router == "mlp":
            self.router = MLPRouter(
                config.dim, config.channels, workspace_dim, config.width, config.hidden_layers
            )
        else:
            self.router = LinearRouter(config.dim, config.channels)
        self.hook_keys = HookPoint()
        self.hook_phi = HookPoint()
        self.hook_workspace = HookPoint()

    def forward(self, x: torch.Tensor, y: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor:
        """``x (B, N, D)``, ``y (B, N)``, ``workspace Phi_{l-1} (B, (l-1) d)`` -> ``Phi_l (B, l d)``."""
        keys = self.hook_keys(self.router(x, workspace))  # (B, N, d)
        pooled = measure(y[:, None, :], keys.transpose(1, 2))[:, 0]  # (B, d): sum_i y_i k_i
        return self._append(pooled / y.shape[1], workspace)

    def forward_statistic(self, g: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor:
        """The same layer on the pooled statistic ``g (B, D)``: ``phi_l = G_l(Phi) g`` (gated and
        linear routers only) -> ``Phi_l (B, l d)``."""
        return self._append(self.router.pool(g, workspace), workspace)

    def _append(self, phi: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor:
        phi = self.hook_phi(phi)  # (B, d)
        return self.hook_workspace(torch.cat([workspace, phi], dim=-1))


# ----------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------
class FVTransformer(HookedModel):
    """Constrained linear-attention transformer with a growing workspace (see module docs).

    ``forward(batch)`` or ``forward(x, y, x_query)`` returns the query predictions
    ``y_hat_q`` of shape ``(B,)``; :meth:`predict_theta` returns ``theta_hat`` ``(B, D)``.
    Layers are numbered ``1..L``: ``model.blocks["l"]`` is layer ``l``.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise ValueError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = config
        self.blocks = nn.ModuleDict({str(l): Block(config, l) for l in range(1, config.n_layers + 1)})
        workspace_dim = config.budget
        if config.decoder == "mlp":
            self.decoder = _mlp(workspace_dim, config.dim, config.width, config.hidden_layers)
        else:
            self.decoder = nn.Linear(workspace_dim, config.dim, bias=False)
            nn.init.zeros_(self.decoder.weight)
        self.hook_theta_hat = HookPoint()
        self.hook_prediction = HookPoint()
        self._register_hook_points()
        kinds = [kind for kind, families in LAYER_HOOKS.items() if "constrained" in families]
        layer_hooks = [hook_name(kind, l) for l in range(1, config.n_layers + 1) for kind in kinds]
        assert list(self._hook_points) == layer_hooks + [hook_name(kind) for kind in MODEL_HOOKS]

    # ----- forward ---------------------------------------------------------------------
    def block(self, layer: int) -> Block:
        """Layer ``l`` (1-based)."""
        return self.blocks[str(check_int("layer", layer, 1, self.config.n_layers))]

    def workspace(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The final workspace ``Phi_L``, shape ``(B, L d)``."""
        workspace = x.new_zeros(x.shape[0], 0)
        for block in self.blocks.values():
            workspace = block(x, y, workspace)
        return workspace

    @property
    def reads_statistic(self) -> bool:
        """``True`` when the model reads a context only through its pooled statistic ``g`` (gated
        and linear routers, :data:`STATISTIC_ROUTERS`): it then runs on a
        :class:`~fvlib.task.StatisticBatch` too."""
        return self.config.router in STATISTIC_ROUTERS

    def workspace_from_statistic(self, g: torch.Tensor) -> torch.Tensor:
        """The final workspace ``Phi_L`` from the pooled statistics ``g (B, D)``: ``(B, L d)``."""
        workspace = g.new_zeros(g.shape[0], 0)
        for block in self.blocks.values():
            workspace = block.forward_statistic(g, workspace)
        return workspace

    def _statistic_inputs(self, g, x_query) -> tuple[torch.Tensor, torch.Tensor]:
        """``(g (B, D), x_query)`` checked and cast to the model's dtype; ``ValueError`` for a
        model that reads every token, or a bad shape."""
        if not self.reads_statistic:
            raise ValueError(f"a model with router {self.config.router!r} reads every token, not only the pooled "
                             f"statistic: pass a TaskBatch (tokens)")
        D = self.config.dim
        g, x_query = check_model_input("g", g), check_model_input("x_query", x_query)
        if g.ndim != 2 or g.shape[-1] != D:
            raise ValueError(f"g must be a tensor of shape (B, {D}), got {tuple(g.shape)}")
        if x_query.shape[0] != g.shape[0] or x_query.shape[-1] != D or x_query.ndim not in (2, 3):
            raise ValueError(f"x_query must be a tensor of shape ({g.shape[0]}, {D}) or ({g.shape[0]}, Q, {D})")
        dtype = next(self.parameters()).dtype
        return g.to(dtype), x_query.to(dtype)

    def forward_statistic(self, g: torch.Tensor, x_query: torch.Tensor) -> torch.Tensor:
        """Query predictions ``(B,)`` (or ``(B, Q)``) from the pooled statistics ``g (B, D)``:
        the same function as :meth:`forward` on the tokens that pool to ``g``."""
        g, x_query = self._statistic_inputs(g, x_query)
        return self._readout(self.workspace_from_statistic(g), x_query)[1]

    def predict_theta_statistic(self, g: torch.Tensor, x_query: torch.Tensor) -> torch.Tensor:
        """``theta_hat (B, D)`` from the pooled statistics ``g (B, D)`` (see :meth:`forward_statistic`)."""
        g, x_query = self._statistic_inputs(g, x_query)
        return self._readout(self.workspace_from_statistic(g), x_query)[0]

    def _theta_and_prediction(self, x, y, x_query) -> tuple[torch.Tensor, torch.Tensor]:
        return self._readout(self.workspace(x, y), x_query)

    def _readout(self, workspace, x_query) -> tuple[torch.Tensor, torch.Tensor]:
        theta_hat = self.hook_theta_hat(self.decoder(workspace))
        if x_query.ndim == 2:
            prediction = (theta_hat * x_query).sum(-1)
        else:
            prediction = measure(theta_hat[:, None, :], x_query)[:, 0]  # (B, Q)
        prediction = self.hook_prediction(prediction)
        return theta_hat, prediction

    def forward(
        self, batch_or_x, y: torch.Tensor | None = None, x_query: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Query predictions ``y_hat_q``, shape ``(B,)``.

        Call with a :class:`~fvlib.task.TaskBatch` or with tensors ``x (B, N, D)``, ``y (B, N)``,
        ``x_query (B, D)``; or, for a model that :attr:`reads_statistic`, with a
        :class:`~fvlib.task.StatisticBatch`. Several query tokens per context,
        ``x_query (B, Q, D)``, give predictions ``(B, Q)``.
        """
        if isinstance(batch_or_x, StatisticBatch):
            return self.forward_statistic(*self._statistic_batch(batch_or_x, y, x_query))
        return self._theta_and_prediction(*self._inputs(batch_or_x, y, x_query))[1]

    def predict_theta(
        self, batch_or_x, y: torch.Tensor | None = None, x_query: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The decoder output ``theta_hat`` (after ``hook_theta_hat``), shape ``(B, D)``.

        Runs the full forward pass, so hooks on ``hook_prediction`` also fire. Takes what
        :meth:`forward` takes, a :class:`~fvlib.task.StatisticBatch` included.
        """
        if isinstance(batch_or_x, StatisticBatch):
            return self.predict_theta_statistic(*self._statistic_batch(batch_or_x, y, x_query))
        return self._theta_and_prediction(*self._inputs(batch_or_x, y, x_query))[0]

    @staticmethod
    def _statistic_batch(batch: StatisticBatch, y, x_query) -> tuple[torch.Tensor, torch.Tensor]:
        if y is not None or x_query is not None:
            raise ValueError("pass either a StatisticBatch or tensors, not both")
        return batch.g, batch.x_query

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"D={c.dim}, L={c.n_layers}, d={c.channels}, router={c.router!r}, "
            f"decoder={c.decoder!r}, width={c.width}"
        )


# ----------------------------------------------------------------------------------------
# Factories
# ----------------------------------------------------------------------------------------
def _dim_of(prior_or_dim: Prior | int) -> int:
    if isinstance(prior_or_dim, Prior):
        return prior_or_dim.dim
    return check_int("dim", prior_or_dim, 1)


#: ``kind -> (n_layers, channels, router, decoder)`` as functions of the budget ``M``.
_LAYOUTS = {
    "A": lambda M: (M, 1, "gated", "mlp"),
    "B": lambda M: (1, M, "gated", "mlp"),
    "C": lambda M: (1, M, "linear", "linear"),
}


def model_config(
    kind: str, prior_or_dim: Prior | int, budget: int, width: int = 128, hidden_layers: int = 2
) -> ModelConfig:
    """The :class:`ModelConfig` of model ``'A'``, ``'B'`` or ``'C'`` with budget ``M``."""
    if kind not in _LAYOUTS:
        raise ValueError(f"model kind must be one of {MODEL_KINDS}, got {kind!r}")
    check_int("budget", budget, 1, _dim_of(prior_or_dim))  # M <= D, the rule of TrainConfig
    n_layers, channels, router, decoder = _LAYOUTS[kind](budget)
    return ModelConfig(_dim_of(prior_or_dim), n_layers, channels, router, decoder, width, hidden_layers)


def model_a(
    prior_or_dim: Prior | int, budget: int, width: int = 128, hidden_layers: int = 2
) -> FVTransformer:
    """Model A: deep and narrow, ``L = M``, ``d = 1``, gated router, MLP decoder."""
    return FVTransformer(model_config("A", prior_or_dim, budget, width, hidden_layers))


def model_b(
    prior_or_dim: Prior | int, budget: int, width: int = 128, hidden_layers: int = 2
) -> FVTransformer:
    """Model B: one wide layer, ``L = 1``, ``d = M``, gated router, MLP decoder.

    With ``Phi_0`` empty its router is a learned constant ``(M, D)`` matrix: optimised
    non-adaptive directions, decoded by an MLP.
    """
    return FVTransformer(model_config("B", prior_or_dim, budget, width, hidden_layers))


def model_c(
    prior_or_dim: Prior | int, budget: int, width: int = 128, hidden_layers: int = 2
) -> FVTransformer:
    """Model C: linear attention only, ``L = 1``, ``d = M``, linear router and decoder.

    ``width`` and ``hidden_layers`` are recorded in the config but unused.
    """
    return FVTransformer(model_config("C", prior_or_dim, budget, width, hidden_layers))


def make_model(
    kind: str, prior_or_dim: Prior | int, budget: int, width: int = 128, hidden_layers: int = 2
) -> FVTransformer:
    """Model ``'A'``, ``'B'`` or ``'C'`` for a prior (or input dimension ``D``) and budget ``M``."""
    return FVTransformer(model_config(kind, prior_or_dim, budget, width, hidden_layers))
