"""fvlib.plots.trees: prior-tree and policy-tree drawings, and the policy-tree readers."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from fvlib import TreePrior  # noqa: E402
from fvlib.plots.trees import (  # noqa: E402
    draw_policy_tree,
    draw_tree_prior,
    format_interval,
    policy_paths,
    remeasured_nodes,
    tree_node_positions,
)
from fvlib.theory import dp_policy_tree  # noqa: E402

# A hand-made policy in the format of dp_policy_tree: root, then 1 / 0 again / 2.
POLICY = {
    "node": 0,
    "value": 0.5,
    "branches": [
        {"phi_range": (-math.inf, -0.4), "node": 1, "value": 0.43, "branches": []},
        {"phi_range": (-0.4, 0.4), "node": 0, "value": 0.89, "branches": []},
        {"phi_range": (0.4, math.inf), "node": 2, "value": 0.43, "branches": []},
    ],
}


def teardown_function():
    plt.close("all")


def test_positions_cover_internal_nodes_and_leaves():
    pos = tree_node_positions(3)
    assert len(pos) == 15  # 7 internal nodes + 8 leaves
    assert pos[0] == (0.5, 0.0)
    assert pos[5][1] == -2.0 and pos[14][1] == -3.0
    xs = [pos[n][0] for n in range(3, 7)]
    assert xs == sorted(xs)
    with pytest.raises(ValueError):
        tree_node_positions(0)


def test_draw_tree_prior_highlights_the_path():
    tree = TreePrior(3, 0.5)
    ax = draw_tree_prior(tree, signs=[1, -1, 1], annotate={1: "here"})
    texts = [t.get_text() for t in ax.texts]
    for n in range(tree.dim):
        assert str(n) in texts
    # theta labels on the three path nodes 0, 2, 5
    value_labels = [t for t in texts if t.startswith("$\\theta_")]
    assert len(value_labels) == 3 and any("theta_{5}" in t for t in value_labels)
    assert any(t == "here" for t in texts)
    assert "leaves" in texts
    # without a path nothing is labelled with values
    ax2 = draw_tree_prior(TreePrior(4, 0.7))
    assert not [t for t in ax2.texts if t.get_text().startswith("$\\theta_")]


def test_policy_paths_and_remeasured_nodes():
    paths = policy_paths(POLICY)
    assert [[n for n, _ in p] for p in paths] == [[0, 1], [0, 0], [0, 2]]
    assert paths[0][0][1] is None and paths[1][1][1] == (-0.4, 0.4)
    assert remeasured_nodes(POLICY) == {0}
    assert remeasured_nodes({"node": 3, "value": 0.1, "branches": []}) == set()
    with pytest.raises(ValueError):
        policy_paths({"value": 1.0})


def test_format_interval():
    assert format_interval((-math.inf, -0.25), 1) == "$\\phi_{1}<-0.25$"
    assert format_interval((-math.inf, math.inf), 3) == "any $\\phi_{3}$"
    assert format_interval((-0.4, 0.4), 2) == "$|\\phi_{2}|<0.40$"
    assert format_interval((0.4, math.inf), 1) == "$\\phi_{1}\\geq0.40$"
    assert format_interval((0.1, 0.3), 1) == "$0.10\\leq\\phi_{1}<0.30$"


def test_draw_policy_tree_boxes_edges_and_colours():
    tree = TreePrior(3, 0.5)
    ax = draw_policy_tree(POLICY, tree, title="t")
    boxes = [t for t in ax.texts if t.get_label() == "box"]
    edges = [t for t in ax.texts if t.get_label() == "edge"]
    assert len(boxes) == 4 and len(edges) == 3
    assert boxes[0].get_text().startswith("measure 0\nlevel 0")
    assert "E risk 0.500" in boxes[0].get_text()
    # the re-measurement of node 0 is drawn in a different colour from first measurements
    colours = {b.get_text().split("\n")[0]: b.get_bbox_patch().get_facecolor() for b in boxes[1:]}
    assert colours["measure 0"] != colours["measure 1"]
    assert ax.get_legend() is not None


def test_draw_policy_tree_on_a_real_dp_policy():
    tree = TreePrior(2, 0.5)
    policy = dp_policy_tree(tree, 2, 0.6, quad_points=16)
    ax = draw_policy_tree(policy, tree, legend=False)
    boxes = [t for t in ax.texts if t.get_label() == "box"]
    assert len(boxes) == 1 + len(policy["branches"])
    assert ax.get_legend() is None


def test_draw_policy_tree_boxes_do_not_overlap_on_a_bushy_policy():
    """Nine leaves in a 16-inch figure (chapter 4's three-layer policy): the font follows the
    room per leaf, so no two boxes (nor a box and an edge label) overlap."""
    import matplotlib.pyplot as plt

    leaf = {"node": 3, "value": 0.154, "branches": []}
    third = [{"phi_range": r, **leaf} for r in ((-math.inf, -0.5), (-0.5, 0.5), (0.5, math.inf))]
    second = {"node": 1, "value": 0.277, "branches": third}
    policy = {"node": 0, "value": 0.347,
              "branches": [{"phi_range": r, **second} for r in ((-math.inf, -0.5), (-0.5, 0.5), (0.5, math.inf))]}
    fig, ax = plt.subplots(figsize=(16, 5.2))
    draw_policy_tree(policy, TreePrior(3, 0.5), ax=ax)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_bbox_patch().get_window_extent(renderer) for t in ax.texts if t.get_label() == "box"]
    assert len(boxes) == 13
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
    plt.close(fig)
