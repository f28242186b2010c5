"""Figures of the chapter on standard transformers (chapter 11): how the attention over the
context is spread (:func:`fvlib.interventions.attention.attention_spread`)."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np

from .style import palette

__all__ = ["plot_attention_spread"]


def plot_attention_spread(spreads: Mapping, axes=None, figsize=(9.5, 3.2)):
    """One panel per entry of ``spreads`` (``{title: AttentionSpread}``): the attention weights
    over the ``N`` context tokens times ``N``, sorted in decreasing order, for each shown
    context (thin lines, one colour per layer ``l``) against the token's rank; the dashed line
    at 1 is uniform pooling, a single token retrieved would sit at ``N`` on the left.
    The titles carry the mean normalised entropy per layer. Returns ``(fig, axes)``."""
    if not spreads:
        raise ValueError("spreads must name at least one AttentionSpread")
    if axes is None:
        fig, axes = plt.subplots(1, len(spreads), figsize=figsize, sharey=True, constrained_layout=True)
    axes = np.atleast_1d(axes)
    if len(axes) != len(spreads):
        raise ValueError(f"need {len(spreads)} axes, got {len(axes)}")
    colors = palette("blue", "vermillion", "green", "purple", "orange", "sky")
    for ax, (title, spread) in zip(axes, spreads.items()):
        patterns = np.asarray(spread.patterns, dtype=float)  # (L, n_show, N)
        L, _, N = patterns.shape
        ranks = np.arange(1, N + 1)
        for l in range(L):
            for j, row in enumerate(patterns[l]):
                ax.plot(ranks, N * row, color=colors[l % len(colors)], lw=0.8, alpha=0.7,
                        label=f"layer {l + 1}" if j == 0 else None)
        ax.axhline(1.0, color="0.3", ls="--", lw=1, label="uniform")
        ax.set_yscale("log")
        ax.set_xlabel("context token, by weight rank")
        entropies = ", ".join(f"{h:.2f}" for h in np.asarray(spread.entropy, dtype=float))
        ax.set_title(f"{title}\nentropy/log N: {entropies}", fontsize=9)
    axes[0].set_ylabel(r"$N \times$ attention weight")
    axes[-1].legend(fontsize=7, frameon=False)
    return axes[0].figure, axes
