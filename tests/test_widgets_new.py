"""The explorers of chapters 4 and 5: pure, JSON-able states over their control grids, the
closed form behind the layer split, and the ipywidgets explorers that draw them."""

import json
import math

import pytest

from fvlib import TreePrior
from fvlib.explorers import widgets
from fvlib.explorers.states import (DP_POLICY_GRID, LAYER_SPLIT_GRID, dp_policy_state, layer_split_state,
                                    split_budget)
from fvlib.plots.explorers import policy_from_state
from fvlib.priors import GaussianPrior
from fvlib.theory import (
    dp_policy_tree,
    gaussian_coordinate_loss,
    noisefree_adaptive_loss,
    noisefree_layered_loss,
    noisefree_nonadaptive_loss,
    policy_value,
)


def _json_roundtrip(state):
    """States are plain numbers: JSON gives back exactly the same thing."""
    assert json.loads(json.dumps(state, allow_nan=False)) == state
    return state


# ----- the closed form --------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.9])
def test_layered_loss_matches_the_two_known_closed_forms(alpha):
    tree = TreePrior(5, alpha)
    for m in range(1, 12):
        # one layer of M nodes: the non-adaptive heap-order loss
        assert noisefree_layered_loss(tree, [m]) == pytest.approx(noisefree_nonadaptive_loss(tree, m), abs=1e-12)
        # one node per layer: the adaptive greedy loss
        assert noisefree_layered_loss(tree, [1] * m) == pytest.approx(noisefree_adaptive_loss(tree, m), abs=1e-12)


def test_layered_loss_by_hand_and_empty_layers():
    tree = TreePrior(4, 0.5)  # level energies 1, 1/2, 1/4, 1/8
    # [2, 1]: layer 1 resolves the root and hits the level-1 node with prob 1/2; layer 2 then
    # resolves one more level: depth 3 w.p. 1/2 (loss 1/8), depth 2 w.p. 1/2 (loss 1/4 + 1/8)
    assert noisefree_layered_loss(tree, [2, 1]) == pytest.approx(0.5 * 0.125 + 0.5 * 0.375)
    assert noisefree_layered_loss(tree, [3, 0, 0]) == noisefree_layered_loss(tree, [3])
    assert noisefree_layered_loss(tree, [15]) == 0.0
    with pytest.raises(ValueError, match="layer_sizes"):
        noisefree_layered_loss(tree, [2, -1])
    with pytest.raises(ValueError, match="tree"):
        noisefree_layered_loss(GaussianPrior.isotropic(3), [1])


def test_layered_loss_against_a_brute_force_enumeration():
    """Enumerate all 2^K sign paths: simulate the breadth-first batches and the Bayes decoder
    (an unresolved level keeps its energy) and average."""
    import itertools

    tree = TreePrior(4, 0.6)
    for sizes in ([2, 2], [3, 1, 2], [5], [1, 4], [6, 6]):
        total = 0.0
        for signs in itertools.product((-1, 1), repeat=tree.depth):
            path = [0]
            for s in signs[:-1]:
                path.append(2 * path[-1] + (1 if s < 0 else 2))
            resolved = 0
            for d in sizes:
                # breadth-first batch below path[resolved]: which of its nodes are on the path?
                frontier, batch = [path[resolved]] if resolved < tree.depth else [], []
                while frontier and len(batch) < d:
                    nxt = []
                    for n in frontier:
                        if len(batch) < d and n < tree.dim:
                            batch.append(n)
                            nxt += [2 * n + 1, 2 * n + 2]
                    frontier = nxt
                while resolved < tree.depth and path[resolved] in batch:
                    resolved += 1
            total += sum(tree.alpha**k for k in range(resolved, tree.depth))
        assert noisefree_layered_loss(tree, sizes) == pytest.approx(total / 2**tree.depth, abs=1e-12), sizes


def test_split_budget():
    assert split_budget(7, 3) == [3, 2, 2]
    assert split_budget(6, 2) == [3, 3]
    assert split_budget(2, 4) == [1, 1, 0, 0]
    with pytest.raises(ValueError, match="layers"):
        split_budget(3, 0)


# ----- layer split state ------------------------------------------------------------------
def test_layer_split_state_gaussian_depends_only_on_the_budget():
    tree = TreePrior(5, 0.5)
    variances = GaussianPrior.twin_of(tree).variances
    for m in (1, 4, 6, 12):
        states = [_json_roundtrip(layer_split_state(m, n, 0.5)) for n in (1, 2, 3, 12) if n <= m]
        g = {s["gaussian_loss"] for s in states}
        assert len(g) == 1
        assert g.pop() == pytest.approx(gaussian_coordinate_loss(variances, m, 0.0), abs=1e-9)
        # with one layer the tree is no better than its twin; with more it is never worse
        assert states[0]["tree_loss"] == pytest.approx(states[0]["gaussian_loss"], abs=1e-9)
        assert all(s["tree_loss"] <= s["gaussian_loss"] + 1e-9 for s in states)


def test_layer_split_state_tree_loss_falls_with_layers():
    s = layer_split_state(6, 2, 0.5)
    assert s["layer_sizes"] == [3, 3] and s["dim"] == 31 and s["energy"] == pytest.approx(1.9375)
    curve = s["tree_by_layers"]
    assert curve[0] == pytest.approx(0.25) and curve[1] == pytest.approx(0.0625)  # alpha^2 vs alpha^4
    assert all(b <= a + 1e-12 for a, b in zip(curve, curve[1:]))  # never rises with L at M = 6
    assert curve[5] == pytest.approx(0.0)  # six levels' worth of budget, one per layer: K = 5 resolved
    assert s["tree_loss"] == curve[1] == s["tree_by_budget"][s["budget_axis"].index(6)]
    assert s["gaussian_by_budget"][s["budget_axis"].index(6)] == s["gaussian_loss"]
    # a layer measures at least once: the axes stop at L = M and start at M = L
    assert s["layer_axis"] == [1, 2, 3, 4, 5, 6] and s["budget_axis"] == list(range(2, 13))


def test_layer_split_grid_states_are_cheap_and_plain():
    import time

    start = time.perf_counter()
    for m in LAYER_SPLIT_GRID["budget"][::3]:
        for n in LAYER_SPLIT_GRID["layers"][::3]:
            for a in LAYER_SPLIT_GRID["alpha"]:
                if n <= m:
                    _json_roundtrip(layer_split_state(m, n, a))
    assert time.perf_counter() - start < 30  # generous: about 1 ms per state
    with pytest.raises(ValueError, match="alpha"):
        layer_split_state(3, 2, 0.0)


# ----- DP policy state --------------------------------------------------------------------
def test_dp_policy_state_matches_the_dp_functions():
    s = _json_roundtrip(dp_policy_state(0.6))
    tree = TreePrior(3, 0.5)
    for p in ("optimal", "greedy", "nonadaptive"):
        assert s["values"][p] == pytest.approx(policy_value(tree, 2, 0.6, p), rel=1e-12)
    assert s["values"]["optimal"] <= s["values"]["greedy"] <= s["values"]["nonadaptive"]
    # chapter 4: at tau = 0.6 the root is measured first and again on ambiguous observations,
    # about one context in seven
    assert s["first_node"] == 0 and s["branches"]["node"] == [1, 0, 2]
    assert 0.12 < s["remeasure_prob"] < 0.16
    assert sum(s["branches"]["prob"]) == pytest.approx(1.0, abs=1e-12)
    assert s["branches"]["lo"][0] is None and s["branches"]["hi"][-1] is None
    grid = [-2 + 0.025 * i for i in range(161)]
    policy = dp_policy_tree(tree, 2, 0.6, phi_grid=grid)
    rebuilt = policy_from_state(s)
    assert rebuilt["node"] == policy["node"]
    ends = [e for b in rebuilt["branches"] for e in b["phi_range"]]
    assert ends == pytest.approx([e for b in policy["branches"] for e in b["phi_range"]], abs=1e-12)


def test_dp_policy_state_small_noise_starts_off_the_root():
    s = dp_policy_state(0.05)
    assert s["first_node"] in (1, 2) and s["remeasure_prob"] == 0.0
    assert s["values"]["optimal"] == pytest.approx(0.0625, abs=1e-3)  # alpha^2 / 4
    assert s["values"]["greedy"] == pytest.approx(0.25, abs=1e-3)
    with pytest.raises(ValueError, match="tau"):
        dp_policy_state(0.0)


def test_dp_policy_grid_is_chapter_4s_noise_levels():
    taus = DP_POLICY_GRID["tau"]
    assert list(taus) == sorted(taus) and {0.05, 0.3, 0.6, 1.5} <= set(taus)


# ----- the explorers ----------------------------------------------------------------------
def test_new_explorers_are_exported():
    for name in ("dp_policy_explorer", "layer_split_explorer"):
        assert name in widgets.__all__


def test_dp_policy_explorer_redraws_with_tau():
    e = widgets.dp_policy_explorer()
    assert e.summary == dp_policy_state(0.6)
    before, png = e.updates, e.image.value
    e.controls["tau"].value = 0.1
    assert e.updates == before + 1 and e.image.value != png
    assert e.summary["first_node"] != 0 and "tau = 0.1" in e.caption.value
    assert '<div class="fvlib-explorer">' in e._repr_mimebundle_()["text/html"]
    with pytest.raises(ValueError, match="tau"):
        widgets.dp_policy_explorer(0.7)


def test_layer_split_explorer_redraws_with_each_control():
    e = widgets.layer_split_explorer()
    assert e.summary == layer_split_state(6, 2, 0.5)
    for name, value in (("layers", 6), ("budget", 8), ("alpha", 0.9)):
        before, png = e.updates, e.image.value
        e.controls[name].value = value
        assert e.updates == before + 1 and e.image.value != png, name
    assert e.summary == layer_split_state(8, 6, 0.9)
    assert "L = 6" in e.caption.value
    # never more layers than measurements: the layers follow a budget that falls below them,
    # and cannot be moved past it
    drawn = []
    show = e.show
    e.show = lambda *args: (drawn.append((e.controls["budget"].value, e.controls["layers"].value)), show(*args))
    e.controls["budget"].value = 3
    assert e.controls["layers"].value == 3 and e.summary["layer_sizes"] == [1, 1, 1]
    e.controls["layers"].value = 5
    assert e.controls["layers"].value == 3 and e.summary == layer_split_state(3, 3, 0.9)
    assert drawn and all(layers <= budget for budget, layers in drawn)
    with pytest.raises(ValueError, match="layers"):
        widgets.layer_split_explorer(budget=2, layers=3)
    with pytest.raises(ValueError, match="layers"):
        widgets.layer_split_explorer(layers=13)
