"""Figures for causal interventions: key patching and workspace transplant (chapter 10,
*Causal interventions*; the book's appendix *Conventions*, section "Donor, target and the split level").

They draw the results of :mod:`fvlib.interventions` and :mod:`fvlib.theory.patching_policies` (sweeps,
transplants, probes, and the ratios and summaries of a sweep:
:func:`fvlib.interventions.patching.patching_ratio`,
:func:`fvlib.interventions.patching.patching_summary`) and of :mod:`fvlib.interventions.probes`:

* :func:`plot_patching_heatmap` and :func:`plot_patching_pair` -- the model's and the theory's
  heatmaps side by side (rows: split level ``m = 1..K``; columns: patched layer ``l = 1..L``);
* :func:`plot_transplant` -- overlap of the prediction with the donor's and the target's path,
  level by level, after the workspace ``Phi_l`` is transplanted;
* :func:`plot_patching_row` -- one row of the theory heatmap against the context length.

Also the figures of the chapter on the inside of the model:
:func:`plot_workspace_projections` (PCA of ``Phi_l`` coloured by path prefix, from
:func:`fvlib.interventions.probes.workspace_projections`) and :func:`plot_probe_heatmap` (probe
accuracy per layer and level).

Colours: the viridis-like ``cividis`` map and the Okabe-Ito palette (colour-blind safe).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm

from ..interventions import patching_ratio
from .style import OKABE_ITO, palette

__all__ = [
    "plot_patching_heatmap",
    "plot_patching_pair",
    "plot_patching_panels",
    "plot_transplant",
    "prefix_index",
    "plot_workspace_projections",
    "plot_probe_heatmap",
    "plot_patching_row",
]


def plot_patching_heatmap(result, ax=None, title: str | None = None, vmin: float | None = None,
                          vmax: float | None = None, annotate: bool = True, colorbar: bool = True,
                          value: str = "ratio"):
    """Draw a key-patching heatmap on log colour axes; the staircase line marks ``l = m``
    (cells to its right are patched *after* the split). Returns the ``AxesImage``.

    ``value``: ``"ratio"`` (``patching_ratio(result)``, the patched loss over the unpatched loss
    of the same targets; ``vmin`` defaults to 0.5) or ``"loss"`` (the patched excess loss
    ``result.loss`` itself, for long contexts where the unpatched loss is near 0 and the ratios
    say little; ``vmin`` defaults to its smallest positive cell). ``vmin``, ``vmax``: the colour
    range (share them to compare panels)."""
    cells = _heatmap_cells(result, value)
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.6))
    K, L = cells.shape
    low, high = _colour_range(cells, value)
    vmin, vmax = low if vmin is None else vmin, high if vmax is None else vmax
    image = ax.imshow(np.clip(cells, vmin, vmax), cmap="cividis", norm=LogNorm(vmin=vmin, vmax=vmax),
                      origin="upper", aspect="auto")
    if annotate:
        for i in range(K):
            for j in range(L):
                light = np.log(max(cells[i, j], vmin) / vmin) < 0.55 * np.log(vmax / vmin)
                ax.text(j, i, _cell_text(cells[i, j], value), ha="center", va="center",
                        fontsize=8 if value == "ratio" else 7, color="white" if light else "black")
    # boundary between l <= m and l > m: vertical edge right of column l = m in row m
    xs, ys = [], []
    for i in range(K):
        edge = min(i + 1, L) - 0.5
        xs += [edge, edge]
        ys += [i - 0.5, i + 0.5]
    ax.plot(xs, ys, color=OKABE_ITO["vermillion"], lw=2, label="$l = m$")
    ax.set_xticks(range(L), [str(l) for l in range(1, L + 1)])
    ax.set_yticks(range(K), [str(m) for m in range(1, K + 1)])
    ax.set_xlabel("patched layer $l$")
    ax.set_ylabel("split level $m$")
    if title:
        ax.set_title(title, fontsize=10)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, label=HEATMAP_LABELS[value])
    return image


#: The colour-bar label of each ``value`` of :func:`plot_patching_heatmap`.
HEATMAP_LABELS = {"ratio": "loss / unpatched loss", "loss": "patched excess loss"}


def _heatmap_cells(result, value: str) -> np.ndarray:
    """The ``(K, L)`` cells a heatmap draws: the ratios or the patched losses (``value``)."""
    if value not in HEATMAP_LABELS:
        raise ValueError(f"value must be one of {sorted(HEATMAP_LABELS)}, got {value!r}")
    return patching_ratio(result) if value == "ratio" else np.asarray(result.loss, dtype=float)


def _colour_range(cells: np.ndarray, value: str) -> tuple[float, float]:
    """The default log colour range of ``cells``: ratios from 0.5 to at least 2, losses from the
    smallest positive cell to the largest."""
    if value == "ratio":
        return 0.5, float(max(cells.max(), 2.0))
    return float(cells[cells > 0].min()), float(cells.max())


def _cell_text(value: float, kind: str) -> str:
    """A heatmap cell's annotation: ratios with one decimal below 100, whole up to 10^4, then
    as a power of ten; losses with two significant digits."""
    if kind == "loss":
        return f"{value:.2g}"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}" if value < 1e4 else f"{value:.0e}"


def plot_patching_pair(model_result, theory_result, titles=("trained model A", "greedy theory policy"),
                       figsize=(9.5, 3.8)):
    """The model's and the theory's heatmaps side by side on a shared colour scale.
    Returns ``(fig, axes)``."""
    return plot_patching_panels(dict(zip(titles, (model_result, theory_result))), panel_size=(figsize[0] / 2,
                                                                                           figsize[1]))


def plot_patching_panels(panels, value: str = "ratio", title: str | None = None,
                         panel_size: tuple = (3.75, 3.9)):
    """A row of key-patching heatmaps, ``panels`` ``{title: result}`` in order, drawn by
    :func:`plot_patching_heatmap` on one shared log colour scale with one colour bar; ``value``
    as there (``"ratio"`` or ``"loss"``), ``title`` above the row, each panel ``panel_size``
    inches. Returns ``(fig, axes)`` (one axis per panel)."""
    if not panels:
        raise ValueError("panels must name at least one heatmap")
    vmin, vmax = _colour_range(np.concatenate([_heatmap_cells(r, value).ravel() for r in panels.values()]), value)
    fig, axes = plt.subplots(1, len(panels), figsize=(panel_size[0] * len(panels), panel_size[1]),
                             constrained_layout=True, squeeze=False)
    for ax, (name, result) in zip(axes[0], panels.items()):
        image = plot_patching_heatmap(result, ax=ax, title=name, vmin=vmin, vmax=vmax, colorbar=False, value=value)
    fig.colorbar(image, ax=list(axes[0]), label=HEATMAP_LABELS[value])
    if title:
        fig.suptitle(title, fontsize=10)
    return fig, axes[0]


def plot_transplant(result, axes=None, figsize=(9.5, 3.4)):
    """Per tree level ``k`` (one panel each), the overlap of ``theta_hat`` with the target's
    path and with the donor's path after the workspace ``Phi_l`` is transplanted, against
    ``l``; the dotted line is the unpatched overlap with the target. Returns ``(fig, axes)``;
    each panel holds two lines (target, donor) and one horizontal reference line."""
    target = np.asarray(result.target_overlap, dtype=float)
    donor = np.asarray(result.donor_overlap, dtype=float)
    base = np.asarray(result.baseline_overlap, dtype=float)
    L, K = target.shape
    if axes is None:
        fig, axes = plt.subplots(1, K, figsize=figsize, sharey=True, constrained_layout=True)
    axes = np.atleast_1d(axes)
    fig = axes[0].figure
    layers = np.arange(1, L + 1)
    for k, ax in enumerate(axes):
        ax.plot(layers, target[:, k], "o-", color=OKABE_ITO["blue"], label="target")
        ax.plot(layers, donor[:, k], "s--", color=OKABE_ITO["orange"], label="donor")
        ax.axhline(base[k], color="0.4", ls=":", lw=1, label="no transplant")
        ax.axhline(0, color="0.8", lw=0.8)
        ax.set_title(f"level {k}", fontsize=10)
        ax.set_xticks(layers)
        ax.set_xlabel(r"$\Phi_l$ transplanted, $l$")
    axes[0].set_ylabel("overlap with path")
    axes[-1].legend(fontsize=7, frameon=False, loc="center left")
    return fig, axes


# ----------------------------------------------------------------------------------------
# Inside the model (chapter "Inside the model"): the workspace across layers and probes
# ----------------------------------------------------------------------------------------
def prefix_index(signs, length: int) -> np.ndarray:
    """Index ``0 .. 2^length - 1`` of the path prefix ``(s_0, ..., s_{length-1})`` read as binary
    digits (``+1`` as 1, ``s_0`` most significant), so prefixes of one subtree are adjacent.
    ``signs``: ``(B, K)`` in {-1, +1}; returns ``(B,)`` integers."""
    bits = (np.asarray(signs)[:, :length] > 0).astype(int)
    return bits @ (2 ** np.arange(length - 1, -1, -1)) if length else np.zeros(len(bits), int)


def plot_workspace_projections(projections, signs, axes=None, seed: int = 0, size: float = 2.6):
    """One scatter panel per layer: the workspace ``Phi_l`` projected on its top principal
    directions, each context coloured by its path prefix ``(s_0..s_{l-1})`` (``2^l`` colours of
    the ``viridis`` map in leaf order, so adjacent colours are neighbouring subtrees). A
    one-dimensional workspace (``l d = 1``) is drawn against a small random jitter.

    The key to the colours: the panels with at most four prefixes carry a legend of their
    prefixes (e.g. ``(-, +)``), and one colour bar for all panels runs from the all-minus prefix
    (left subtree) to the all-plus one. Without ``axes`` the panels are laid out in rows of at
    most three (``size`` inches each). Returns ``(fig, axes)`` with one axes per layer."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.lines import Line2D

    L = len(projections)
    spare = None
    if axes is None:
        ncols = min(L, 3)
        nrows = -(-L // ncols)
        fig, grid = plt.subplots(nrows, ncols, figsize=(size * ncols + 0.6, (size + 0.5) * nrows),
                                 constrained_layout=True, squeeze=False)
        for ax in grid.flat[L:]:
            ax.axis("off")
        spare = grid.flat[L] if grid.size > L else None
        axes = grid.flat[:L]
    axes = np.atleast_1d(axes)
    fig = axes[0].figure
    rng = np.random.default_rng(seed)
    cmap = plt.get_cmap("viridis")
    for l, (proj, ax) in enumerate(zip(projections, axes), start=1):
        coords = proj["coords"]
        colour = prefix_index(signs, l)
        y = coords[:, 1] if coords.shape[1] > 1 else rng.uniform(-1, 1, len(coords))
        ax.scatter(coords[:, 0], y, c=colour, cmap=cmap, vmin=0, vmax=2**l - 1, s=5, alpha=0.6,
                   linewidths=0)
        share = proj["explained"]
        ax.set_title(f"$\\Phi_{{{l}}}$: {2**l} prefixes", fontsize=10)
        ax.set_xlabel(f"PC1 ({share[0]:.0%})", fontsize=9)
        ax.set_ylabel(f"PC2 ({share[1]:.0%})" if coords.shape[1] > 1 else "jitter", fontsize=9)
        ax.tick_params(labelsize=8)
        if 2**l <= 4:
            handles = [Line2D([], [], ls="", marker="o", ms=5, color=cmap(i / max(2**l - 1, 1)),
                              label="(" + ", ".join("+" if (i >> (l - 1 - k)) & 1 else "-"
                                                    for k in range(l)) + ")")
                       for i in range(2**l)]
            ax.legend(handles=handles, fontsize=8, frameon=True, framealpha=0.8, loc="best",
                      title="$(s_0, \\dots)$" if l > 1 else "$s_0$", title_fontsize=8,
                      handletextpad=0.2, borderpad=0.3, labelspacing=0.2)
    mappable = ScalarMappable(Normalize(0, 1), cmap)
    if spare is not None:  # the empty cell of the grid holds the colour bar
        bar = fig.colorbar(mappable, cax=spare.inset_axes([0.1, 0.1, 0.08, 0.8]), ticks=[0, 1])
    else:
        bar = fig.colorbar(mappable, ax=list(axes), shrink=0.8, aspect=30, ticks=[0, 1])
    bar.ax.set_yticklabels(["(-, ..., -)", "(+, ..., +)"], fontsize=8)
    bar.set_label("path prefix, in leaf order", fontsize=9)
    return fig, axes


def plot_probe_heatmap(result, ax=None, title: str | None = None, colorbar: bool = True):
    """Probe accuracy ``(L, K)`` of a :class:`fvlib.interventions.probes.ProbeResult` as an annotated heatmap
    (rows: workspace ``Phi_l``; columns: tree level ``k``; 0.5 = chance). Returns the image."""
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.4))
    acc = np.asarray(result.accuracy, dtype=float)
    L, K = acc.shape
    image = ax.imshow(acc, cmap="cividis", vmin=0.5, vmax=1.0, aspect="auto")
    for i in range(L):
        for j in range(K):
            ax.text(j, i, f"{acc[i, j]:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if acc[i, j] < 0.75 else "black")
    ax.set_xticks(range(K), [str(k) for k in range(K)])
    ax.set_yticks(range(L), [f"$\\Phi_{{{l}}}$" for l in range(1, L + 1)])
    ax.set_xlabel("tree level $k$ (sign $s_k$)")
    ax.set_ylabel("workspace")
    if title:
        ax.set_title(title, fontsize=10)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, label="test accuracy")
    return image


# ----------------------------------------------------------------------------------------
# One row of the theory heatmap against the context length
# ----------------------------------------------------------------------------------------
def plot_patching_row(row, ax=None, figsize=(6.4, 3.6)):
    """Draw a :class:`fvlib.theory.patching_policies.PatchingRow`: the patched loss of the greedy theory at every
    layer ``l > m`` against the context length ``N`` (log-log, error bars ``+-2`` s.e.), the
    unpatched loss of the same targets (grey; it goes to 0 as ``N`` grows, and its points below a
    tenth of the smallest patched loss are left out so the axis stays readable), and
    the noise-free limits ``alpha^(K-1) / 2^(K-l)`` as dashed lines in the layers' colours.
    The cells with ``l <= m`` equal the unpatched loss and are not drawn. Returns ``(fig, ax)``;
    the axes hold one error-bar line per layer ``l > m`` and one for the unpatched loss."""
    if ax is None:
        _, ax = plt.subplots(figsize=figsize, constrained_layout=True)
    n = np.asarray(row.n_ctx, dtype=float)
    loss = np.asarray(row.loss, dtype=float)
    se = np.asarray(row.stderr, dtype=float)
    base = np.asarray(row.baseline, dtype=float)
    base_se = np.asarray(row.baseline_stderr, dtype=float)
    L, m = loss.shape[1], row.split_level
    colours = palette("blue", "orange", "green", "vermillion", "purple", "sky", "yellow", "black")
    for j, l in enumerate(range(m + 1, L + 1)):
        colour = colours[j % len(colours)]
        ax.errorbar(n, loss[:, l - 1], yerr=2 * se[:, l - 1], fmt="o-", ms=4, capsize=2, color=colour,
                    label=f"patch at layer $l = {l}$")
        if row.noisefree is not None:
            ax.axhline(float(row.noisefree[l - 1]), color=colour, ls="--", lw=1)
    after = loss[:, m:]
    floor = 0.1 * float(after[after > 0].min()) if (after > 0).any() else 0.0
    shown = base > floor
    ax.errorbar(n[shown], base[shown], yerr=2 * base_se[shown], fmt="s:", ms=3, capsize=2, color="0.45",
                label="unpatched")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("context length $N$")
    ax.set_ylabel("target excess loss")
    ax.set_title(f"greedy theory, split level $m = {m}$: {row.n_contexts:,} pairs per $N$"
                 + ("; dashed: noise-free limit" if row.noisefree is not None else ""), fontsize=10)
    ax.legend(fontsize=7, frameon=False, loc="upper right")
    return ax.figure, ax
