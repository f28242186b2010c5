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
function, :func:`fvlib.routers.measure`, whose ``torch.func.vmap`` rule lets stacked models read
shared contexts once (:mod:`fvlib.training.batched`).

The routers are those of :mod:`fvlib.routers` (``ModelConfig.router``): ``gated`` (``k = G_l(Phi_{l-1})
x`` with ``G_l`` an MLP from ``Phi_{l-1}`` to a ``(d, D)`` matrix; ``Phi_0`` is empty, so layer 1
measures fixed directions), ``linear`` (``k = W_l x``), ``bilinear``, ``coord`` and ``mlp``.
Models A and B have the gated router, model C the linear one; model A may take another
(:data:`fvlib.routers.MODEL_A_ROUTERS`, :func:`model_a`'s ``router``). Decoder kinds: ``mlp``
and ``linear`` (no bias).

**Two paths, one function.** With every router but ``mlp`` the keys are linear in the token,
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
from .routers import DEFAULT_ROUTER, MODEL_A_ROUTERS, ROUTER_KINDS, STATISTIC_ROUTERS, make_mlp, make_router, measure
from .task import StatisticBatch

__all__ = [
    "DECODER_KINDS",
    "MODEL_KINDS",
    "ModelConfig",
    "FVTransformer",
    "model_a",
    "model_b",
    "model_c",
    "model_config",
    "make_model",
]

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
        router: one of :data:`fvlib.routers.ROUTER_KINDS` (``'gated'``, ``'mlp'``, ``'linear'``,
            ``'bilinear'``, ``'coord'``).
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
class Block(nn.Module):
    """One layer: route (keys), pool against the values ``y_i``, append to the workspace."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        workspace_dim = (layer - 1) * config.channels
        # A linear router's rows start at norm 1 before a linear decoder (model C), sqrt(D) before an MLP
        # decoder (model A's linear router, which then starts as model B's router does).
        row_norm = 1.0 if config.decoder == "linear" else math.sqrt(config.dim)
        self.router = make_router(config.router, config.dim, config.channels, workspace_dim, config.width,
                                  config.hidden_layers, linear_row_norm=row_norm)
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
            self.decoder = make_mlp(workspace_dim, config.dim, config.width, config.hidden_layers)
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
        """``True`` when the model reads a context only through its pooled statistic ``g`` (every
        router but ``mlp``, :data:`fvlib.routers.STATISTIC_ROUTERS`): it then runs on a
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
    kind: str, prior_or_dim: Prior | int, budget: int, width: int = 128, hidden_layers: int = 2,
    router: str = DEFAULT_ROUTER,
) -> ModelConfig:
    """The :class:`ModelConfig` of model ``'A'``, ``'B'`` or ``'C'`` with budget ``M``; ``router``
    is model A's (one of :data:`fvlib.routers.MODEL_A_ROUTERS`), models B and C take only their own."""
    if kind not in _LAYOUTS:
        raise ValueError(f"model kind must be one of {MODEL_KINDS}, got {kind!r}")
    check_int("budget", budget, 1, _dim_of(prior_or_dim))  # M <= D, the rule of TrainConfig
    n_layers, channels, own_router, decoder = _LAYOUTS[kind](budget)
    if router not in MODEL_A_ROUTERS:
        raise ValueError(f"router must be one of {MODEL_A_ROUTERS}, got {router!r}")
    if router != DEFAULT_ROUTER and kind != "A":
        raise ValueError(f"router {router!r} is a choice of model A only; model {kind} has its own router")
    chosen = router if kind == "A" else own_router
    return ModelConfig(_dim_of(prior_or_dim), n_layers, channels, chosen, decoder, width, hidden_layers)


def model_a(
    prior_or_dim: Prior | int, budget: int, width: int = 128, hidden_layers: int = 2, router: str = DEFAULT_ROUTER
) -> FVTransformer:
    """Model A: deep and narrow, ``L = M``, ``d = 1``, MLP decoder, the gated router or ``router``
    (:data:`fvlib.routers.MODEL_A_ROUTERS`; ``'linear'`` makes it model B's function class)."""
    return FVTransformer(model_config("A", prior_or_dim, budget, width, hidden_layers, router))


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
