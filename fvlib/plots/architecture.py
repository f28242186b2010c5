"""The architecture of models A, B and C as a diagram, and parameter counts (chapter 7, *From
theory to architecture*; the book's appendix *Conventions*, section "Models A, B, C").

* :func:`draw_architecture` -- a block diagram of an :class:`fvlib.models.FVTransformer` with
  ``L`` layers: tokens ``(x_i, y_i)``, router ``G_l(Phi_{l-1})`` producing keys, values ``y_i``,
  uniform pooling ``phi_l``, the workspace ``Phi_l = Phi_{l-1} (+) phi_l``, the decoder and the
  readout ``<theta_hat, x_q>``;
* :func:`parameter_counts` -- trainable parameters per part (routers, decoder) of a model.

Colours: the Okabe-Ito palette (colour-blind safe).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from .style import OKABE_ITO

__all__ = ["draw_architecture", "parameter_counts"]

_COLOURS = {
    "token": "#DDDDDD",
    "router": OKABE_ITO["sky"],
    "pool": OKABE_ITO["yellow"],
    "workspace": OKABE_ITO["green"],
    "decoder": OKABE_ITO["orange"],
    "readout": OKABE_ITO["purple"],
}


def _box(ax, x, y, w, h, text, kind, fontsize=8.5):
    patch = FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.03,rounding_size=0.12",
                           facecolor=_COLOURS[kind], edgecolor="0.2", lw=1, alpha=0.9)
    patch.set_gid(kind)
    ax.add_patch(patch)
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)
    return patch


def _arrow(ax, start, end, text=None, offset=(0.0, 0.0), style="-|>", ls="-", fontsize=7.5, color="0.15",
           frac=0.5):
    arrow = FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=10, lw=1.1, color=color,
                            linestyle=ls, shrinkA=2, shrinkB=2)
    ax.add_patch(arrow)
    if text:
        label_x = start[0] + frac * (end[0] - start[0]) + offset[0]
        label_y = start[1] + frac * (end[1] - start[1]) + offset[1]
        ax.text(label_x, label_y, text, fontsize=fontsize, ha="center", va="center", color="0.15")
    return arrow


def draw_architecture(n_layers: int = 3, channels: int = 1, ax=None, title: str | None = None):
    """Block diagram of the constrained linear-attention transformer.

    Args:
        n_layers: layers ``L`` to draw (1 for models B and C; ``M`` for model A).
        channels: channels ``d`` per layer (only used in the labels).
        ax: axes to draw on (a new figure when ``None``).
        title: optional title.

    Returns:
        ``(fig, ax, boxes)`` where ``boxes`` maps ``"router"``, ``"pool"``, ``"workspace"`` to
        lists of ``L`` patches (layer ``l`` at index ``l - 1``) and ``"tokens"``, ``"decoder"``,
        ``"readout"`` to single patches.
    """
    if not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive integer, got {n_layers!r}")
    L = n_layers
    step = 3.5
    width = 3.2 + step * L + 3.0
    if ax is None:
        _, ax = plt.subplots(figsize=(1.6 + 1.75 * (L + 2), 4.6))
    fig = ax.figure
    boxes: dict = {"router": [], "pool": [], "workspace": []}
    # token column and the token stream
    boxes["tokens"] = _box(ax, 1.1, 4.6, 1.8, 2.4,
                           "tokens\n$z_i=(x_i,\\,y_i)$\n$i=1,\\dots,N$\n\nquery $x_q$", "token")
    stream_y = 6.6
    ax.plot([1.1, width - 1.0], [stream_y, stream_y], color="0.55", lw=2.5, solid_capstyle="round")
    ax.text(1.1, stream_y + 0.3, "token stream: $(x_i, y_i)$, $x_q$ (every token also holds $\\Phi$)",
            fontsize=8, ha="left", va="bottom", color="0.3")
    _arrow(ax, (1.1, 5.8), (1.1, stream_y), style="-")
    ws_y = 0.9
    for l in range(1, L + 1):
        x0 = 3.6 + step * (l - 1)
        prev = f"\\Phi_{{{l - 1}}}"
        router = _box(ax, x0, 4.9, 2.4, 1.1,
                      f"router (MLP) $G_{{{l}}}({prev})$\nkeys $k_i^{{{l}}}=G_{{{l}}}({prev})\\,x_i$",
                      "router", fontsize=8)
        pool = _box(ax, x0, 2.9, 3.0, 1.0,
                    f"uniform pooling ($d={channels}$)\n$\\phi_{{{l}}}=\\frac{{1}}{{N}}\\sum_i k_i^{{{l}}}\\,y_i$",
                    "pool", fontsize=8)
        slot = _box(ax, x0, ws_y, 2.8, 0.8, f"$\\Phi_{{{l}}}=\\Phi_{{{l - 1}}}\\oplus\\phi_{{{l}}}$", "workspace")
        boxes["router"].append(router)
        boxes["pool"].append(pool)
        boxes["workspace"].append(slot)
        _arrow(ax, (x0 - 0.6, stream_y), (x0 - 0.6, 5.45), "$x_i$", offset=(-0.25, 0))
        _arrow(ax, (x0, 4.35), (x0, 3.4), "keys", offset=(0.35, 0))
        _arrow(ax, (x0 + 1.35, stream_y), (x0 + 1.35, 3.4), "values $y_i$", offset=(0.5, 0.0), ls="--", frac=0.3)
        _arrow(ax, (x0, 2.4), (x0, ws_y + 0.4))
        if l > 1:  # the previous workspace routes this layer and is carried forward
            px = x0 - step
            _arrow(ax, (px + 1.4, ws_y), (x0 - 1.4, ws_y), "$\\oplus$", offset=(0, 0.22))
            _arrow(ax, (px + 1.6, ws_y + 0.4), (x0 - 1.0, 4.35), f"${prev}$", offset=(0.3, 0.0),
                   color=OKABE_ITO["green"], frac=0.15)
    xd = 3.6 + step * L + 0.6
    boxes["decoder"] = _box(ax, xd, 2.9, 2.3, 1.0, "decoder (MLP)\n$\\hat\\theta=\\mathrm{dec}(\\Phi_L)$", "decoder")
    boxes["readout"] = _box(ax, xd, 4.9, 2.3, 1.0, "readout\n$\\hat y_q=\\langle\\hat\\theta, x_q\\rangle$",
                            "readout")
    last = 3.6 + step * (L - 1)
    _arrow(ax, (last + 1.4, ws_y), (xd, 2.4), f"$\\Phi_{{{L}}}$", offset=(0.35, -0.1))
    _arrow(ax, (xd, 3.4), (xd, 4.4), "$\\hat\\theta$", offset=(0.25, 0))
    _arrow(ax, (xd, stream_y), (xd, 5.4), "$x_q$", offset=(0.25, 0))
    ax.set_xlim(-0.1, width + 0.2)
    ax.set_ylim(0.2, 7.3)
    ax.set_aspect("auto")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    return fig, ax, boxes


def parameter_counts(model) -> dict[str, int]:
    """Trainable parameters of an :class:`fvlib.models.FVTransformer` per part.

    Returns ``{"router": ..., "decoder": ..., "total": ...}`` (``router`` sums all layers).
    """
    router = sum(p.numel() for name, p in model.named_parameters() if name.startswith("blocks."))
    decoder = sum(p.numel() for name, p in model.named_parameters() if name.startswith("decoder."))
    total = sum(p.numel() for p in model.parameters())
    return {"router": router, "decoder": decoder, "total": total}
