"""The states of the explorers of chapters 4 and 5 (fvlib.explorers.states): pure, JSON-able
states over their control grids."""

import json

import pytest

from fvlib import TreePrior
from fvlib.explorers.states import DP_POLICY_GRID, LAYER_SPLIT_GRID, dp_policy_state, layer_split_state, split_budget
from fvlib.plots.explorers import policy_from_state
from fvlib.priors import GaussianPrior
from fvlib.theory import dp_policy_tree, gaussian_coordinate_loss, policy_value


def _json_roundtrip(state):
    """States are plain numbers: JSON gives back exactly the same thing."""
    assert json.loads(json.dumps(state, allow_nan=False)) == state
    return state


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
