"""Uniform pooling or retrieval? The entropy and the peak of a standard transformer's attention
over the context tokens (chapter 11, *Standard transformers*): the workspace's in the
bottlenecked arrangement, the query token's in the open one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._checks import check_instance, check_int
from ..hooks import hook_name
from ..priors import Prior
from ..task import make_generator, sample_task
from ..transformer import StandardTransformer
from .readout import model_device

__all__ = ["AttentionSpread", "attention_spread"]


@dataclass
class AttentionSpread:
    """How the attention over the ``N`` context tokens is spread, per layer.

    Attributes:
        entropy: ``(L,)``, mean entropy of the attention weights over the context tokens
            divided by ``log N``: 1 is uniform pooling, 0 is retrieval of one token.
        peak: ``(L,)``, mean of ``N max_i a_i``: 1 is uniform, ``N`` one token.
        patterns: ``(L, n_show, N)``, the weights of the first ``n_show`` contexts, each sorted
            in decreasing order.
        n_contexts: contexts averaged over.
    """

    entropy: torch.Tensor
    peak: torch.Tensor
    patterns: torch.Tensor
    n_contexts: int

    def to_dict(self) -> dict:
        return {
            "entropy": self.entropy.tolist(),
            "peak": self.peak.tolist(),
            "patterns": self.patterns.tolist(),
            "n_contexts": self.n_contexts,
        }


@torch.no_grad()
def attention_spread(
    model: StandardTransformer,
    prior: Prior,
    n_ctx: int,
    noise_std: float,
    *,
    contexts: int = 1000,
    n_show: int = 8,
    seed: int = 0,
) -> AttentionSpread:
    """The attention over the context tokens at every layer, on ``contexts`` fresh contexts of
    ``prior`` drawn with ``seed`` (one query token each): the workspace's pooling weights
    (``blocks.{l}.hook_pattern``, ``(B, 1, N)``) in the bottlenecked arrangement; in the open
    arrangement the query token's row, restricted to the context tokens and renormalised (its
    weight on itself is left out). See :class:`AttentionSpread`.
    """
    check_instance("model", model, StandardTransformer)
    check_int("contexts", contexts, 2)
    check_int("n_show", n_show, 1, contexts)
    if n_ctx < 2:
        raise ValueError(f"n_ctx must be at least 2 to speak of spread, got {n_ctx!r}")
    L = model.config.n_layers
    batch = sample_task(prior, contexts, n_ctx, noise_std, make_generator(seed)).to(model_device(model))
    names = [hook_name("pattern", l) for l in range(1, L + 1)]
    _, cache = model.run_with_cache(batch, names_filter=names)
    entropy, peak, shown = [], [], []
    for name in names:
        a = cache[name].double().cpu()
        a = a[:, 0] if model.config.arrangement == "bottlenecked" else a[:, n_ctx, :n_ctx]
        a = a / a.sum(-1, keepdim=True)
        h = -(a * a.clamp_min(1e-300).log()).sum(-1) / math.log(n_ctx)
        entropy.append(h.mean())
        peak.append((n_ctx * a.max(-1).values).mean())
        shown.append(a[:n_show].sort(-1, descending=True).values)
    return AttentionSpread(torch.stack(entropy), torch.stack(peak), torch.stack(shown), contexts)
