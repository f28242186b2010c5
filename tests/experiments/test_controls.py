"""The controls experiments of issue 42: their one recipe, their definitions, and the rows the
chapters read from them (ratios to model B and to the references, with standard errors)."""

import math

import numpy as np
import pytest

from fvlib import experiments
from fvlib.experiments import CONTROL_VARIANTS, controls_config, controls_rows, get_experiment
from fvlib.stats import independent_ratio, seed_mean_stderr, side_of
from fvlib.training import LEARNING_RECIPE, TrainConfig, recipe_for

CONTROLS = ("controls-k6", "long-context-k6", "controls-k8")
TASK = dict(depth=4, alpha=0.6, n_ctx=96, noise_std=0.1, budget=3)


# the routers are compared on the tree only
@pytest.mark.parametrize(("variant", "prior"), [(v, "tree") for v in CONTROL_VARIANTS]
                         + [(v, "gaussian-twin") for v in "ABC"])
def test_every_variant_trains_with_the_learning_recipe_on_the_statistic(variant, prior):
    config = controls_config(variant, prior=prior, **TASK)
    for field, value in recipe_for("constrained", prior, TASK["alpha"]).items():
        assert getattr(config, field) == value, field
    assert config.statistic and config.model == variant[0]
    assert config.router == (variant.partition("-")[2] or TrainConfig().router)
    assert config.router_warm_start == 0   # no teacher


def test_controls_config_refuses_an_unknown_variant():
    with pytest.raises(ValueError, match="A-mlp"):
        controls_config("A-mlp", prior="tree", **TASK)


@pytest.mark.parametrize("name", CONTROLS)
def test_the_controls_experiments_hold_three_seeds_per_point_with_one_recipe(name):
    experiment = get_experiment(name)
    assert experiment.convergence == "paired-doubling" and experiment.max_doublings == 2
    depth = experiment.runs[0].config.depth
    for item in experiment.items:
        assert len(item) >= 3 and len({r.config.seed for r in item}) == len(item)
    for run in experiment.runs:
        c = run.config
        assert c.steps == 3000 and c.statistic and c.batch == LEARNING_RECIPE["batch"] and c.expected_loss
        assert c.alpha_start == recipe_for("constrained", c.prior, c.alpha).get("alpha_start")
    budgets = {(r.variant, r.config.prior): set() for r in experiment.runs}
    for r in experiment.runs:
        budgets[r.variant, r.config.prior].add(r.config.budget)
    assert all(b == set(range(1, depth + 1)) for b in budgets.values())


def test_controls_k6_compares_the_three_routers_b_and_c_and_the_twin():
    experiment = get_experiment("controls-k6")
    variants = {(r.variant, r.config.prior) for r in experiment.runs}
    assert variants == {(v, "tree") for v in CONTROL_VARIANTS} | {(v, "gaussian-twin") for v in "ABC"}
    assert {r.config.n_ctx for r in get_experiment("long-context-k6").runs} == {1024}
    assert {r.config.depth for r in get_experiment("controls-k8").runs} == {8}


def test_seed_mean_stderr_counts_the_spread_and_the_monte_carlo_error():
    loss, mc = np.array([1.0, 1.2, 1.4]), np.array([0.03, 0.04, 0.0])
    spread = np.std(loss, ddof=1)
    assert seed_mean_stderr(loss, mc) == pytest.approx(math.hypot(spread / math.sqrt(3), 0.05 / 3))
    assert seed_mean_stderr([2.0], [0.3]) == pytest.approx(0.3)


@pytest.mark.parametrize(("value", "expected"), [(1.0, -1), (1.45, 0), (1.55, 0), (2.0, 1)])
def test_side_of_makes_a_threshold_claim_only_beyond_two_stderrs(value, expected):
    assert side_of(value, 0.1, 1.5) == expected


def test_side_of_refuses_a_nan():
    with pytest.raises(ValueError, match="nan"):
        side_of(float("nan"), 0.1, 1.5)


def _controls_result() -> dict:
    budgets = [1, 2]
    loss = {("A", "tree"): [[0.30, 0.34, 0.32], [0.05, 0.07, 0.06]], ("B", "tree"): [[0.45, 0.46, 0.47],
            [0.30, 0.29, 0.31]], ("A", "gaussian-twin"): [[0.98, 0.99, 0.985], [0.75, 0.76, 0.74]]}
    runs = {}
    for (variant, prior), per_budget in loss.items():
        for m, seeds in zip(budgets, per_budget):
            for s, value in enumerate(seeds):
                key = experiments.run_key(variant, prior, m, s)
                runs[key] = {"key": key, "variant": variant, "prior": prior, "budget": m, "seed": s,
                             "config": {"model": variant[0], "arch": "constrained"}, "final_loss": value,
                             "final_stderr": 0.002, "converged": s != 2, "steps": 3000,
                             "attempts": [{"steps": 3000, "final_loss": value, "converged": s != 2}],
                             "history": [{"step": 3000, "eval_excess_loss": value}]}
    curve = {"mean": [0.9, 0.1], "stderr": [0.001, 0.002]}
    theory = {"budgets": budgets, "twin": [0.984, 0.748],
              "curves": {n: dict(curve) for n in ("adaptive_greedy", "adaptive_opt", "nonadaptive_opt", "lmmse")}
              | {"nonadaptive_coord": {"mean": [0.95, 0.33], "stderr": [0.0, 0.0]}}}
    return {"experiment": "x", "runs": runs, "theory_kind": "depth-sweep", "theory": theory}


def test_controls_rows_divide_each_point_by_b_and_by_its_references():
    data = _controls_result()
    rows = {(r["variant"], r["prior"], r["budget"]): r for r in controls_rows(data)}
    a, b = rows["A", "tree", 2], rows["B", "tree", 2]
    assert a["mean"] == pytest.approx(0.06) and a["converged"] == 2
    expected = independent_ratio((a["mean"], a["total_stderr"]), (b["mean"], b["total_stderr"]))
    assert a["ratio_to_B"] == pytest.approx(expected) and a["ratio_to_B"][0] == pytest.approx(0.06 / 0.30)
    assert a["ratio_to/adaptive_greedy"][0] == pytest.approx(0.6)
    assert "ratio_to_B" not in b and "ratio_to_B" not in rows["A", "gaussian-twin", 1]
    assert rows["A", "gaussian-twin", 2]["ratio_to/twin"][0] == pytest.approx(0.75 / 0.748)


def test_controls_rows_count_failed_seeds_among_the_seeds():
    data = _controls_result()
    data["runs"]["A/tree/M2/seed1"]["final_loss"] = 0.32   # not 10% below the heap-order coordinates (0.33)
    data["runs"]["A/gaussian-twin/M1/seed0"]["final_loss"] = 1.6   # above 1.5 times the twin's closed form
    rows = {(r["variant"], r["prior"], r["budget"]): r for r in controls_rows(data)}
    assert rows["A", "tree", 2]["failed"] == 1 and rows["A", "tree", 1]["failed"] == 0
    assert rows["A", "gaussian-twin", 1]["failed"] == 1 and len(rows["A", "tree", 2]["seeds"]) == 3


def test_controls_rows_refuse_a_file_without_budgets():
    data = _controls_result()
    data["theory"] = {"tree": {}}
    with pytest.raises(ValueError, match="depth-sweep"):
        controls_rows(data)


def test_controls_panels_put_the_tree_first_with_its_curves_and_the_twin_with_its_closed_form():
    data = _controls_result()
    data["runs"] = {k: r for k, r in data["runs"].items() if not (r["variant"] == "B" and r["budget"] == 2)}
    (tree, tree_sweep, tree_theory), (twin, twin_sweep, twin_theory) = experiments.controls_panels(data)
    assert (tree, twin) == ("tree", "gaussian-twin")
    assert list(tree_sweep.loss) == ["A", "B"] and tree_sweep.budgets.tolist() == [1]   # B has no M = 2
    assert set(tree_theory) == {"adaptive_greedy", "nonadaptive_opt", "lmmse"}   # the curves stored
    assert twin_sweep.budgets.tolist() == [1, 2] and twin_sweep.loss["A"][1] == pytest.approx(0.75)
    assert twin_theory["twin"][0].tolist() == data["theory"]["twin"]


def test_controls_panels_refuse_a_file_without_budgets():
    data = _controls_result()
    data["theory"] = {"tree": {}}
    with pytest.raises(ValueError, match="depth-sweep"):
        experiments.controls_panels(data)


def test_the_quick_check_retrains_no_coord_router_where_the_family_has_another():
    """verify's prefix run of model A's family: a deep run of a router other than coord (whose
    argmax turns last-bit differences into other routes) where the file has one, else coord."""
    from fvlib.experiments.verify import prefix_runs

    configs = {v: controls_config(v, prior="tree", **{**TASK, "budget": 2}).to_dict() for v in ("A", "A-coord")}
    first_eval = {"A": 300, "A-coord": 150}   # the coord run is the cheaper prefix
    runs = {f"{v}/tree/M2/seed0": {"config": configs[v], "history": [{"step": 0}, {"step": first_eval[v]}]}
            for v in configs}
    assert prefix_runs({"runs": runs}) == {"A": "A/tree/M2/seed0"}
    only_coord = {k: r for k, r in runs.items() if k.startswith("A-coord")}
    assert prefix_runs({"runs": only_coord}) == {"A": "A-coord/tree/M2/seed0"}


def test_the_quick_check_retrains_a_run_trained_on_this_kind_of_processor_where_there_is_one():
    """Among equally suitable runs, verify's prefix run is one trained on the processor it runs
    on (a chaotic start turns another CPU's rounding into another trajectory), else the cheapest."""
    from fvlib.experiments.verify import prefix_runs

    config = controls_config("A", prior="tree", **{**TASK, "budget": 2}).to_dict()
    deeper = controls_config("A", prior="tree", **{**TASK, "budget": 3}).to_dict()
    runs = {"A/tree/M2/seed0": {"config": config, "provenance": {"device_name": "AMD EPYC"},
                                "history": [{"step": 0}, {"step": 300}]},
            "A/tree/M3/seed0": {"config": deeper, "provenance": {"device_name": "Intel Xeon"},
                                "history": [{"step": 0}, {"step": 300}]}}
    assert prefix_runs({"runs": runs}, machine="Intel Xeon") == {"A": "A/tree/M3/seed0"}
    assert prefix_runs({"runs": runs}, machine="AMD EPYC") == {"A": "A/tree/M2/seed0"}
    assert prefix_runs({"runs": runs}, machine="Apple M3") == {"A": "A/tree/M2/seed0"}   # cheapest

