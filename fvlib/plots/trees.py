"""Tree drawings: the tree prior in heap order, and DP policies as decision trees.

Two kinds of tree appear in the book and both are drawn here:

* the **prior tree** of :class:`fvlib.priors.TreePrior` (:func:`draw_tree_prior`): internal nodes in
  heap order, level ``k`` on row ``-k``, the leaves on row ``-K``, one sign path highlighted;
* a **policy tree** as returned by :func:`fvlib.theory.dp.dp_policy_tree`
  (:func:`draw_policy_tree`): a box per measurement (the node and its level), one edge per
  observation interval of that measurement, and the expected final risk in every box.

:func:`policy_paths` and :func:`remeasured_nodes` read a policy tree without drawing it (the
chapters use them to state and check what the optimal policy does).

Colours follow the Okabe-Ito palette, which stays distinguishable under the common forms of
colour blindness.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Patch

from .._checks import check_int
from .style import OKABE_ITO

__all__ = [
    "tree_node_positions",
    "draw_tree_prior",
    "policy_paths",
    "remeasured_nodes",
    "format_interval",
    "draw_policy_tree",
]


def _new_axes(ax, figsize):
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


# ----- the prior tree ------------------------------------------------------------------------
def tree_node_positions(depth: int) -> dict[int, tuple[float, float]]:
    """Drawing positions of a depth-``K`` tree in heap order.

    Node ``n`` at level ``k`` (the ``j``-th of its level, ``j = n - (2^k - 1)``) sits at
    ``x = (j + 1/2) / 2^k`` in ``[0, 1]`` and ``y = -k``. Keys ``0 .. 2^(K+1) - 2`` cover the
    ``2^K - 1`` internal nodes and, after them, the ``2^K`` leaves (heap ids continued, row
    ``y = -K``), so every child id ``2n+1``, ``2n+2`` has a position.
    """
    check_int("depth", depth, 1)
    pos = {}
    for k in range(depth + 1):
        for j in range(2**k):
            pos[2**k - 1 + j] = ((j + 0.5) / 2**k, -float(k))
    return pos


def draw_tree_prior(tree, signs=None, ax=None, *, annotate: dict | None = None, show_values: bool = True,
                    node_size: float | None = None, color: str = OKABE_ITO["vermillion"]):
    """Draw a :class:`~fvlib.priors.TreePrior` in heap order, optionally with one sign path highlighted.

    Args:
        tree: the prior (its ``depth`` sets the drawing; ``alpha`` the values shown).
        signs: an optional sign path ``(K,)`` of +-1; its nodes and edges are drawn in
            ``color`` and, with ``show_values``, labelled with ``theta_n = alpha^(k/2) s_k``.
        ax: axes to draw on (a new figure when omitted).
        annotate: optional ``{node: text}``; each text is written above-left of its node,
            with an arrow to it (for example to mark which node a policy measures).
        show_values: label the path nodes with their value of ``theta``.
        node_size: marker area of a node (default: shrinks with depth).
        color: colour of the highlighted path.

    Returns:
        The axes. Node ``n`` is drawn at ``tree_node_positions(K)[n]``; internal nodes carry
        their heap id as text where it fits between its neighbours (the deep levels of a large
        tree in a small axes have smaller nodes and no ids), leaves are small dots.
    """
    K = tree.depth
    ax = _new_axes(ax, (1.6 + 1.4 * K, 0.9 + 0.9 * K))
    pos = tree_node_positions(K)
    size = node_size if node_size is not None else max(120.0, 560.0 / 2 ** max(K - 3, 0))
    fontsize = 8 if K > 4 else 9
    # room between neighbours of level k, in points (x runs over 1.33 units of the axes): a
    # crowded level gets smaller nodes and no heap ids, instead of an unreadable band
    room = [ax.get_position().width * ax.figure.get_figwidth() * 72 / 1.33 / 2**k for k in range(K + 1)]
    level_size = [min(size, (0.85 * r) ** 2) for r in room]
    path, theta, path_edges, leaf_on = [], None, set(), None
    if signs is not None:
        signs_t = torch.as_tensor(signs).long()
        path = tree.path_nodes(signs_t).tolist()
        theta = tree.theta_from_signs(signs_t)
        for k, n in enumerate(path):
            path_edges.add((n, 2 * n + 1 + int(signs_t[k] > 0)))
        leaf_on = 2 * path[-1] + 1 + int(signs_t[-1] > 0)
    for n in range(tree.dim):
        for child in (2 * n + 1, 2 * n + 2):
            on = (n, child) in path_edges
            (x0, y0), (x1, y1) = pos[n], pos[child]
            ax.plot([x0, x1], [y0, y1], color=color if on else "0.75", lw=2.5 if on else 1.0, zorder=1)
    for n in range(tree.dim):
        x, y = pos[n]
        on, level = n in path, int(-y)
        ax.scatter([x], [y], s=level_size[level], color=color if on else "white", edgecolor="0.3", zorder=2)
        # the id, in the largest of two sizes that fits beside its neighbours' (else none)
        fits = [f for f in (fontsize, 6) if 0.6 * f * len(str(n)) + 2 <= 0.95 * room[level]]
        if fits:
            ax.text(x, y, str(n), ha="center", va="center", fontsize=fits[0], zorder=3,
                    color="white" if on else "black")
        if on and show_values:
            # away from the incoming edge: upper left for a left child, upper right otherwise
            left = n > 0 and n % 2 == 1
            ax.text(x - 0.035 if left else x + 0.035, y + 0.27, f"$\\theta_{{{n}}}={float(theta[n]):+.2f}$",
                    fontsize=9, color=color, ha="right" if left else "left")
    leaves = range(tree.dim, 2 * tree.dim + 1)
    ax.scatter([pos[n][0] for n in leaves], [pos[n][1] for n in leaves], s=min(18.0, level_size[K]),
               color=[color if n == leaf_on else "0.45" for n in leaves], zorder=2)
    for n, text in (annotate or {}).items():
        x, y = pos[int(n)]
        ax.annotate(text, (x, y), xytext=(x - 0.06, y + 0.55), ha="right", va="center", fontsize=8.5,
                    color=OKABE_ITO["blue"], arrowprops=dict(arrowstyle="->", color=OKABE_ITO["blue"], lw=1))
    for k in range(K + 1):
        ax.text(-0.05, -k, f"level {k}" if k < K else "leaves", ha="right", va="center", fontsize=9)
    ax.set_xlim(-0.28, 1.05)
    ax.set_ylim(-K - 0.7, 0.7)
    ax.axis("off")
    return ax


# ----- policy trees --------------------------------------------------------------------------
def _check_policy(policy: dict) -> dict:
    if not isinstance(policy, dict) or "node" not in policy or "branches" not in policy:
        raise ValueError("policy must be a nested dict from fvlib.theory.dp_policy_tree "
                         "({'node', 'value', 'branches'})")
    return policy


def policy_paths(policy: dict) -> list[list[tuple[int, tuple[float, float] | None]]]:
    """Every root-to-leaf path of a policy tree.

    Each path is a list of ``(node, phi_range)`` pairs, one per measurement, where
    ``phi_range`` is the observation interval that led to this measurement (``None`` for the
    first one). The measured nodes of a path are ``[node for node, _ in path]``.
    """
    _check_policy(policy)
    out = []

    def walk(sub, prefix):
        here = prefix + [(int(sub["node"]), tuple(sub["phi_range"]) if "phi_range" in sub else None)]
        if not sub["branches"]:
            out.append(here)
        for branch in sub["branches"]:
            walk(branch, here)

    walk(policy, [])
    return out


def remeasured_nodes(policy: dict) -> set[int]:
    """Nodes that some branch of the policy measures more than once."""
    again = set()
    for path in policy_paths(policy):
        nodes = [n for n, _ in path]
        again |= {n for n in nodes if nodes.count(n) > 1}
    return again


def format_interval(phi_range, step: int, digits: int = 2) -> str:
    """A MathJax label for ``phi_step`` in ``[lo, hi)``, e.g. ``$|\\phi_1|<0.38$``."""
    lo, hi = (float(v) for v in phi_range)
    sym = f"\\phi_{{{step}}}"
    f = f"{{:.{digits}f}}"
    if math.isinf(lo) and math.isinf(hi):
        return "any $" + sym + "$"
    if math.isinf(lo):
        return f"${sym}<{f.format(hi)}$"
    if math.isinf(hi):
        return f"${sym}\\geq{f.format(lo)}$"
    if abs(lo + hi) < 10 ** (-digits):
        return f"$|{sym}|<{f.format(hi)}$"
    return f"${f.format(lo)}\\leq{sym}<{f.format(hi)}$"


def _layout(policy):
    """x (leaf order, centred parents) and depth of every box; returns a list of records."""
    records, counter = [], [0]

    def place(sub, depth, parent, history, index=0):
        rec = {"sub": sub, "depth": depth, "parent": parent, "index": index, "again": int(sub["node"]) in history}
        records.append(rec)
        children = [place(b, depth + 1, rec, history | {int(sub["node"])}, i) for i, b in enumerate(sub["branches"])]
        if children:
            rec["x"] = (children[0]["x"] + children[-1]["x"]) / 2
        else:
            rec["x"] = float(counter[0])
            counter[0] += 1
        return rec

    place(policy, 0, None, frozenset())
    return records, counter[0]


def draw_policy_tree(policy: dict, tree=None, ax=None, *, digits: int = 2, risk_digits: int = 3,
                     title: str | None = None, legend: bool = True):
    """Draw a DP policy (the nested dict of :func:`fvlib.theory.dp.dp_policy_tree`) as a decision tree.

    Every box is one measurement: ``measure n``, the node's level (when ``tree`` is given)
    and the expected final risk from that point on (``sub["value"]``; ``dp_policy_tree``
    evaluates it at the middle grid point of the interval that leads to the box). Measurement ``l`` sits
    on row ``l``; the edges below a box are labelled with the interval of that box's
    observation ``phi_l`` that leads to each child. Boxes that measure a node already measured
    earlier on the same branch are orange, the others sky blue.

    Args:
        policy: nested dict ``{"node", "value", "branches": [{"phi_range", ...}]}``.
        tree: the :class:`~fvlib.priors.TreePrior`, to print node levels (optional).
        ax: axes to draw on (a new figure when omitted).
        digits: decimals of the interval ends.
        risk_digits: decimals of the expected risks.
        title: optional axes title.
        legend: add a legend for the two box colours.

    The font sizes follow the width each leaf of the policy gets on the axes (between 5 and
    9 points), so boxes and edge labels do not overlap; give a wide figure for a bushy policy.

    Returns:
        The axes. The boxes are the axes' texts whose label is ``"box"``; the edge labels have
        label ``"edge"`` (handy for tests and for restyling).
    """
    _check_policy(policy)
    records, n_leaves = _layout(policy)
    depth = max(r["depth"] for r in records) + 1
    ax = _new_axes(ax, (max(4.5, 1.5 * n_leaves), 1.9 * depth + 0.4))
    colours = {False: OKABE_ITO["sky"], True: OKABE_ITO["orange"]}
    fmt = f"{{:.{risk_digits}f}}"
    # Font sizes from the room each leaf has on the axes (in points), so that neighbouring boxes
    # and edge labels never overlap however many leaves the policy has: a box line holds at most
    # 12 characters ("E risk 0.123"), an edge label about 16.
    fig_w, _ = ax.figure.get_size_inches()
    per_leaf = fig_w * ax.get_position().width * 72 / max(n_leaves, 1)
    box_size = max(5.0, min(9.0, 0.85 * per_leaf / (0.62 * 12 + 1.2)))
    edge_size = max(5.0, min(8.5, 0.9 * per_leaf / (0.55 * 16)))
    for rec in records:
        x, y = rec["x"], -float(rec["depth"])
        if rec["parent"] is not None:
            px, py = rec["parent"]["x"], -float(rec["parent"]["depth"])
            ax.plot([px, x], [py, y], color="0.5", lw=1.2, zorder=1)
            label = format_interval(rec["sub"]["phi_range"], rec["depth"], digits)
            # with many siblings, stagger the labels along the edges so that they do not collide
            n_siblings = len(rec["parent"]["sub"]["branches"])
            frac = 0.55 if n_siblings <= 3 else (0.42, 0.72)[rec["index"] % 2]
            ax.text(px + frac * (x - px), py + frac * (y - py), label, ha="center", va="center",
                    fontsize=edge_size, zorder=2, label="edge",
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.9))
        node = int(rec["sub"]["node"])
        lines = [f"measure {node}"]
        if tree is not None:
            lines.append(f"level {int(tree.node_levels[node])}")
        risk = float(rec["sub"]["value"])
        lines.append("E risk " + fmt.format(max(risk, 0.0)))
        ax.text(x, y, "\n".join(lines), ha="center", va="center", fontsize=box_size, zorder=3, label="box",
                bbox=dict(boxstyle="round,pad=0.3", fc=colours[rec["again"]], ec="0.25", lw=1))
    ax.set_xlim(-0.7, n_leaves - 0.3)
    ax.set_ylim(-depth + 0.5, 0.5)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    if legend:
        handles = [Patch(fc=colours[False], ec="0.25", label="first measurement of this node"),
                   Patch(fc=colours[True], ec="0.25", label="re-measures a node")]
        ax.legend(handles=handles, loc="upper left", fontsize=8.5, frameon=False, bbox_to_anchor=(0.0, 1.0))
    return ax
