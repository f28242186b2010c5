"""fvlib.explorers.strategy: the strategy explorer reacts to the noise and the budget."""

from explorer_controls import changed

from fvlib.explorers.strategy import strategy_explorer


def test_strategy_explorer_noise_hurts_adaptive_inference():
    explorer = strategy_explorer(depth=4, budget=4, samples=300)
    clean = explorer.summary["final"]
    assert clean["adaptive_greedy"] < clean["nonadaptive_coord"] < clean["lmmse"]
    before, after, old_png, new_png = changed(explorer, "noise_std", 1.5)
    assert after == before + 1 and new_png != old_png
    assert explorer.summary["final"]["adaptive_greedy"] > clean["adaptive_greedy"]
    assert explorer.summary["tau2"] > 0.01


def test_strategy_explorer_budget_sets_the_curve_length():
    explorer = strategy_explorer(depth=4, budget=3, samples=200)
    assert explorer.summary["budgets"] == [1, 2, 3]
    explorer.controls["budget"].value = 5
    assert explorer.summary["budgets"] == [1, 2, 3, 4, 5]
    assert len(explorer.summary["mean"]["lmmse"]) == 5
