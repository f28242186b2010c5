"""Standard transformers on the in-context regression task: pre-LayerNorm blocks, softmax
attention with learned queries and keys, residual streams of width ``d_model``, MLP blocks and
no positions (so every model is exchangeable in the context tokens), in two arrangements.

Tokens. Context token ``i`` embeds its features ``f_i`` (``features="product"``:
``f_i = (x_i, y_i, y_i x_i)``; ``features="raw"``: ``f_i = (x_i, y_i)``), a query token embeds
``x_q``; each kind has its own linear embedding (so the token kind is known without positions).
The prediction is a linear readout of the query token's final stream after a LayerNorm.

Arrangements (``d`` = value rank per layer, ``L`` = depth, budget ``M = d L``):

* ``"bottlenecked"`` -- the theory's communication limit made exact. One extra *workspace*
  token (a learned start vector) pools the context; layer ``l`` runs

  1. *pool*: the workspace attends (softmax, one head) to the context tokens; the values have
     rank ``d``, so the workspace receives ``phi_l = sum_i a_i V h_i`` in ``R^d``, the only path
     from the context onwards; then the workspace's MLP (its own weights);
  2. *read*: every context and query token attends to ``{workspace after layer l, itself}``;
     context tokens thereby see the workspace (their router input for layer ``l + 1``, like
     ``Phi_l`` of the constrained models) but never each other, query tokens see only the
     workspace;
  3. the tokens' MLP (shared by context and query tokens).

  The query tokens therefore depend on the context only through ``phi_1, ..., phi_L``: ``M``
  numbers in all, as in the theory of chapter 7.
* ``"open"`` -- context tokens attend to all context tokens, query tokens to the context and
  themselves (never to other queries; context tokens never attend to queries), value rank ``d``
  per layer; then an MLP. Queries can weight the context by ``x_q``-dependent attention
  (kernel regression), so the limit of ``d`` numbers per layer does not bind.

Training. :func:`fvlib.training.loop.train` trains these models (``TrainConfig(arch="transformer")`` or
``arch="transformer-open"``; ``width`` is ``d_model``). What the bottlenecked model A' needs on
a CPU budget, measured on the tree (``K = 3``, ``alpha = 0.7``, ``N = 32``, ``sigma = 0``, ``M
= 3``; batch 64, ``d_model`` 32, 1000 steps, Adam with cosine decay): the number of query
tokens per context matters most (16 queries: excess loss 0.26 at lr ``2e-3``; 32 queries:
0.039), then the learning rate (16 queries: 0.85 at ``5e-3``, diverged at ``1e-2``, 0.061 at
``1e-3``); the ``y_i x_i`` features changed little at these settings (``raw`` 0.27 against
``product`` 0.26 at 16 queries and lr ``2e-3``; at ``5e-3`` 0.54 against 0.85). Single runs,
seed 0. Through the CLI at seed 1 (evaluated on 8192 fresh contexts): 32 queries 0.144 (seed 2:
0.063), 64 queries 0.049, against B' 0.187 with 64 queries, so seeds spread widely at 32
queries. The :class:`~fvlib.training.config.TrainConfig` defaults (:data:`fvlib.training.config.RECIPE`) are the
constrained models'; ``python -m fvlib train --arch transformer`` takes
:data:`fvlib.training.config.TRANSFORMER_RECIPE` (lr ``2e-3``, 64 queries, batch 64, ``d_model`` 32)
where no flag is given.

Hook points (names are module paths; layers numbered from 1, as in the book)::

    blocks.{l}.hook_queries    (B, 1, h) bottlenecked (the workspace's query); (B, T, h) open
    blocks.{l}.hook_keys       (B, N, h) bottlenecked;                         (B, T, h) open
    blocks.{l}.hook_values     (B, N, d) bottlenecked;                         (B, T, d) open
    blocks.{l}.hook_pattern    (B, 1, N) bottlenecked;    (B, T, T) open (masked entries are 0)
    blocks.{l}.hook_phi        (B, d) bottlenecked only: the pooled statistic phi_l
    blocks.{l}.hook_attn_out   (B, 1, D_m) bottlenecked (into the workspace); (B, T, D_m) open
    blocks.{l}.hook_workspace  (B, D_m) bottlenecked only: the workspace stream after layer l
    blocks.{l}.hook_read_out   (B, N + Q, D_m) bottlenecked only: what the read step adds
    blocks.{l}.hook_context    (B, N, D_m) the context streams after layer l
    blocks.{l}.hook_query      (B, Q, D_m) the query streams after layer l
    hook_prediction            (B, Q) (or (B,) for one query token per context)

with ``T = N + Q`` (context tokens first), ``h = head_dim``, ``D_m = d_model``.
:func:`fvlib.hooks.hook_name` builds the names (the same function as for the constrained
models); the hooks themselves (:meth:`fvlib.hooks.HookedModel.hooks`,
:meth:`fvlib.hooks.HookedModel.run_with_hooks`, :meth:`fvlib.hooks.HookedModel.run_with_cache`)
are those of :class:`fvlib.hooks.HookedModel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import DictRoundTrip, check_int
from .hooks import LAYER_HOOKS, HookedModel, HookPoint
from .models import MODEL_KINDS
from .priors import Prior

__all__ = [
    "ARRANGEMENTS",
    "TRANSFORMER_KINDS",
    "FEATURES",
    "TRANSFORMER_LAYER_HOOKS",
    "TransformerConfig",
    "StandardTransformer",
    "transformer_config",
    "make_transformer",
]

ARRANGEMENTS = ("bottlenecked", "open")
FEATURES = ("product", "raw")
#: Hook kinds per layer and the arrangements that have them (:data:`fvlib.hooks.LAYER_HOOKS`).
TRANSFORMER_LAYER_HOOKS = {
    kind: tuple(a for a in families if a in ARRANGEMENTS)
    for kind, families in LAYER_HOOKS.items()
    if set(families) & set(ARRANGEMENTS)
}


@dataclass(frozen=True)
class TransformerConfig(DictRoundTrip):
    """Architecture of a :class:`StandardTransformer`.

    Attributes:
        dim: input dimension ``D``.
        n_layers: depth ``L``.
        channels: value rank ``d`` of each layer's attention (budget ``M = d L``).
        arrangement: ``'bottlenecked'`` or ``'open'`` (module docs).
        d_model: residual stream width.
        head_dim: width ``h`` of the attention queries and keys.
        mlp_ratio: MLP hidden width is ``mlp_ratio * d_model``.
        features: ``'product'`` (context tokens embed ``(x_i, y_i, y_i x_i)``) or ``'raw'``
            (``(x_i, y_i)``).
    """

    WHAT: ClassVar[str] = "transformer config"

    dim: int
    n_layers: int
    channels: int
    arrangement: str = "bottlenecked"
    d_model: int = 64
    head_dim: int = 16
    mlp_ratio: int = 4
    features: str = "product"

    def __post_init__(self):
        for name in ("dim", "n_layers", "channels", "d_model", "head_dim", "mlp_ratio"):
            check_int(name, getattr(self, name), 1)
        if self.arrangement not in ARRANGEMENTS:
            raise ValueError(f"arrangement must be one of {ARRANGEMENTS}, got {self.arrangement!r}")
        if self.features not in FEATURES:
            raise ValueError(f"features must be one of {FEATURES}, got {self.features!r}")

    @property
    def budget(self) -> int:
        """``M = d L``."""
        return self.channels * self.n_layers



# ----------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------
class MLP(nn.Module):
    """``d_model -> ratio d_model -> d_model`` with GELU."""

    def __init__(self, d_model: int, ratio: int):
        super().__init__()
        self.fc = nn.Linear(d_model, ratio * d_model)
        self.out = nn.Linear(ratio * d_model, d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(h)))


class _Attention(nn.Module):
    """Projections of one softmax head with value rank ``d``."""

    def __init__(self, d_model: int, head_dim: int, channels: int):
        super().__init__()
        self.W_Q = nn.Linear(d_model, head_dim, bias=False)
        self.W_K = nn.Linear(d_model, head_dim, bias=False)
        self.W_V = nn.Linear(d_model, channels, bias=False)
        self.W_O = nn.Linear(channels, d_model, bias=False)


class BottleneckedBlock(nn.Module):
    """Layer ``l`` of the bottlenecked arrangement: pool, read, MLP (module docs)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        dm = config.d_model
        self.ln_pool_ws, self.ln_pool_ctx = nn.LayerNorm(dm), nn.LayerNorm(dm)
        self.pool = _Attention(dm, config.head_dim, config.channels)
        self.ln_mlp_ws, self.mlp_ws = nn.LayerNorm(dm), MLP(dm, config.mlp_ratio)
        self.ln_read = nn.LayerNorm(dm)
        self.read = _Attention(dm, config.head_dim, dm)
        self.ln_mlp = nn.LayerNorm(dm)
        self.mlp = MLP(dm, config.mlp_ratio)
        for kind, arrangements in TRANSFORMER_LAYER_HOOKS.items():
            if "bottlenecked" in arrangements:
                setattr(self, f"hook_{kind}", HookPoint())

    def forward(self, ws, ctx, qry):
        """``ws (B, 1, D_m)``, ``ctx (B, N, D_m)``, ``qry (B, Q, D_m)`` -> the same after layer l."""
        N = ctx.shape[1]
        # 1. pool: the workspace attends to the context, rank-d values
        a_ws, a_ctx = self.ln_pool_ws(ws), self.ln_pool_ctx(ctx)
        q = self.hook_queries(self.pool.W_Q(a_ws))
        k = self.hook_keys(self.pool.W_K(a_ctx))
        v = self.hook_values(self.pool.W_V(a_ctx))
        pattern = self.hook_pattern((q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])).softmax(-1))
        phi = self.hook_phi((pattern @ v)[:, 0])  # (B, d)
        ws = ws + self.hook_attn_out(self.pool.W_O(phi)[:, None])
        ws = self.hook_workspace((ws + self.mlp_ws(self.ln_mlp_ws(ws)))[:, 0])[:, None]
        # 2. read: context and query tokens attend to {workspace after layer l, themselves}
        tokens = torch.cat([ctx, qry], dim=1)
        a_tok, a_ws = self.ln_read(tokens), self.ln_read(ws)
        q_tok = self.read.W_Q(a_tok)  # (B, T, h)
        s_ws = (q_tok * self.read.W_K(a_ws)).sum(-1) / math.sqrt(q_tok.shape[-1])
        s_self = (q_tok * self.read.W_K(a_tok)).sum(-1) / math.sqrt(q_tok.shape[-1])
        w = torch.stack([s_ws, s_self], -1).softmax(-1)  # (B, T, 2)
        read = w[..., :1] * self.read.W_V(a_ws) + w[..., 1:] * self.read.W_V(a_tok)
        tokens = tokens + self.hook_read_out(self.read.W_O(read))
        # 3. the tokens' MLP
        tokens = tokens + self.mlp(self.ln_mlp(tokens))
        return ws, self.hook_context(tokens[:, :N]), self.hook_query(tokens[:, N:])


class OpenBlock(nn.Module):
    """Layer ``l`` of the open arrangement: masked softmax attention, then an MLP."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        dm = config.d_model
        self.ln_attn = nn.LayerNorm(dm)
        self.attn = _Attention(dm, config.head_dim, config.channels)
        self.ln_mlp = nn.LayerNorm(dm)
        self.mlp = MLP(dm, config.mlp_ratio)
        for kind, arrangements in TRANSFORMER_LAYER_HOOKS.items():
            if "open" in arrangements:
                setattr(self, f"hook_{kind}", HookPoint())

    @staticmethod
    def mask(n_ctx: int, n_query: int, device=None) -> torch.Tensor:
        """``(T, T)`` bool: context rows see the context; query rows the context and themselves."""
        T = n_ctx + n_query
        mask = torch.zeros(T, T, dtype=torch.bool, device=device)
        mask[:, :n_ctx] = True
        idx = torch.arange(n_ctx, T, device=device)
        mask[idx, idx] = True
        return mask

    def forward(self, ctx, qry):
        N = ctx.shape[1]
        tokens = torch.cat([ctx, qry], dim=1)
        a = self.ln_attn(tokens)
        q = self.hook_queries(self.attn.W_Q(a))
        k = self.hook_keys(self.attn.W_K(a))
        v = self.hook_values(self.attn.W_V(a))
        scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~self.mask(N, qry.shape[1], tokens.device), float("-inf"))
        pattern = self.hook_pattern(scores.softmax(-1))
        tokens = tokens + self.hook_attn_out(self.attn.W_O(pattern @ v))
        tokens = tokens + self.mlp(self.ln_mlp(tokens))
        return self.hook_context(tokens[:, :N]), self.hook_query(tokens[:, N:])


# ----------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------
class StandardTransformer(HookedModel):
    """A standard transformer for in-context regression (module docs).

    ``forward(batch)`` or ``forward(x (B, N, D), y (B, N), x_query (B, D) or (B, Q, D))``
    returns the query predictions, ``(B,)`` or ``(B, Q)``. There is no ``theta_hat``: the
    prediction need not be linear in ``x_q``, so the excess loss is measured against the
    noise-free target ``<theta, x_q>`` (see :func:`fvlib.training.evaluate.evaluate`).
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise ValueError(f"config must be a TransformerConfig, got {type(config).__name__}")
        self.config = config
        D, dm = config.dim, config.d_model
        n_features = 2 * D + 1 if config.features == "product" else D + 1
        self.embed_context = nn.Linear(n_features, dm)
        self.embed_query = nn.Linear(D, dm)
        block = BottleneckedBlock if config.arrangement == "bottlenecked" else OpenBlock
        if config.arrangement == "bottlenecked":
            self.workspace_start = nn.Parameter(torch.randn(dm) / math.sqrt(dm))
        self.blocks = nn.ModuleDict({str(l): block(config) for l in range(1, config.n_layers + 1)})
        self.ln_final = nn.LayerNorm(dm)
        self.readout = nn.Linear(dm, 1)
        # the readout starts at zero, so an untrained model predicts 0 (excess loss E|theta|^2)
        nn.init.zeros_(self.readout.weight)
        nn.init.zeros_(self.readout.bias)
        self.hook_prediction = HookPoint()
        self._register_hook_points()

    def context_features(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``(B, N, 2D + 1)`` features ``(x_i, y_i, y_i x_i)`` or ``(B, N, D + 1)`` ``(x_i, y_i)``."""
        parts = [x, y[..., None]]
        if self.config.features == "product":
            parts.append(y[..., None] * x)
        return torch.cat(parts, dim=-1)

    def forward(self, batch_or_x, y: torch.Tensor | None = None, x_query: torch.Tensor | None = None):
        x, y, x_query = self._inputs(batch_or_x, y, x_query)
        single = x_query.ndim == 2
        if single:
            x_query = x_query[:, None, :]
        ctx = self.embed_context(self.context_features(x, y))
        qry = self.embed_query(x_query)
        if self.config.arrangement == "bottlenecked":
            ws = self.workspace_start.expand(x.shape[0], 1, -1)
            for block in self.blocks.values():
                ws, ctx, qry = block(ws, ctx, qry)
        else:
            for block in self.blocks.values():
                ctx, qry = block(ctx, qry)
        prediction = self.readout(self.ln_final(qry))[..., 0]
        if single:
            prediction = prediction[:, 0]
        return self.hook_prediction(prediction)

    def block(self, layer: int) -> nn.Module:
        """Layer ``l`` (1-based)."""
        return self.blocks[str(check_int("layer", layer, 1, self.config.n_layers))]

    def extra_repr(self) -> str:
        c = self.config
        return f"{c.arrangement}, D={c.dim}, L={c.n_layers}, d={c.channels}, d_model={c.d_model}"


#: ``kind -> (n_layers, channels)`` as functions of the budget: A' deep and narrow, B' wide.
_LAYOUTS = {"A": lambda M: (M, 1), "B": lambda M: (1, M)}
#: The model letters of the standard transformers (A', B').
TRANSFORMER_KINDS = tuple(_LAYOUTS)


def transformer_config(
    kind: str, prior_or_dim: Prior | int, budget: int, arrangement: str = "bottlenecked", **kwargs
) -> TransformerConfig:
    """Model A' (``L = M``, ``d = 1``) or B' (``L = 1``, ``d = M``) as a :class:`TransformerConfig`;
    ``kwargs`` are further :class:`TransformerConfig` fields (``d_model``, ``features``, ...)."""
    if kind not in _LAYOUTS:
        raise ValueError(
            f"transformer model kind must be one of {TRANSFORMER_KINDS} (of {MODEL_KINDS}), got {kind!r}"
        )
    dim = prior_or_dim.dim if isinstance(prior_or_dim, Prior) else check_int("dim", prior_or_dim, 1)
    check_int("budget", budget, 1, dim)  # M <= D, the rule of TrainConfig
    n_layers, channels = _LAYOUTS[kind](budget)
    return TransformerConfig(dim, n_layers, channels, arrangement, **kwargs)


def make_transformer(
    kind: str, prior_or_dim: Prior | int, budget: int, arrangement: str = "bottlenecked", **kwargs
) -> StandardTransformer:
    """The untrained :class:`StandardTransformer` of :func:`transformer_config`."""
    return StandardTransformer(transformer_config(kind, prior_or_dim, budget, arrangement, **kwargs))
