"""The book's in-build runs (fvlib.experiments.inbuild): the shared configs, the same configs at
more seeds (trained batched beside the runs of their own seed), the depth sweep, the runs
trained in worker processes and what ``python -m fvlib experiment warm`` trains ahead."""

import dataclasses

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from conftest import TINY

from fvlib import TreePrior
from fvlib.experiments.inbuild import (
    SHARED_SEEDS,
    TRANSFORMER_CHAPTER,
    DepthSweep,
    depth_sweep,
    depth_sweep_configs,
    final_losses,
    imitation_config,
    original_config,
    seed_configs,
    seed_plan,
    shared_configs,
    train_all,
    train_parallel,
    train_seeds,
    transformer_chapter_configs,
    warm_work,
)
from fvlib.plots.style import STRATEGY_LABELS
from fvlib.plots.training import plot_depth_sweep
from fvlib.theory.sweeps import depth_sweep_theory
from fvlib.training import (
    LEARNING_RECIPE,
    ORIGINAL_RECIPE,
    TrainConfig,
    curriculum_start,
    recipe_for,
    run_dir_for,
    train,
    train_many,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def teardown_function():
    plt.close("all")


def test_shared_configs_are_the_books_configs():
    """The one recipe (recipe_for of each prior: the learning recipe, on the tree its curriculum)
    on the pooled statistic, 3000 steps, for every model; not today's TrainConfig defaults."""
    cfgs = shared_configs()
    assert set(cfgs) == {(m, p) for m in "ABC" for p in ("tree", "gaussian-twin")}
    for (_, prior), cfg in cfgs.items():
        assert {k: getattr(cfg, k) for k in LEARNING_RECIPE} == LEARNING_RECIPE
        assert cfg.alpha_start == (curriculum_start(0.5) if prior == "tree" else None), cfg
        assert (cfg.steps, cfg.input_path, cfg.depth, cfg.budget, cfg.n_ctx) == (3000, "statistic", 5, 5, 128)
    assert cfgs[("A", "tree")] != TrainConfig(model="A", prior="tree", depth=5, alpha=0.5, n_ctx=128, budget=5)
    assert shared_configs(steps=10)[("C", "tree")].steps == 10


def test_depth_sweep_configs_take_the_one_recipe():
    """Fields not given are the shared runs' one recipe (on the twin without a curriculum);
    given fields win."""
    grid, flat = depth_sweep_configs([1, 3], models=("A", "B"), seeds=(0, 1), depth=3, n_ctx=16)
    assert [c.budget for c in grid["A"][1]] == [1, 3] and len(flat) == 8
    for config in flat:
        assert {k: getattr(config, k) for k in recipe_for("constrained")} == recipe_for("constrained")
        assert (config.steps, config.input_path) == (3000, "statistic")
    twin = depth_sweep_configs([2], prior="gaussian-twin", alpha=0.6, steps=7, depth=3)[1]
    assert all(c.alpha_start is None and c.steps == 7 and c.expected_loss for c in twin)
    assert depth_sweep_configs([2], depth=3, alpha=0.6)[1][0].alpha_start == curriculum_start(0.6)


def test_depth_sweep_trains_tiny_runs_and_plots(tmp_path, monkeypatch):
    monkeypatch.setenv("FVLIB_RUN_ROOT", str(tmp_path))
    sweep = depth_sweep([1, 2], models=("A", "B"), progress=False, depth=2, alpha=0.5, n_ctx=16, steps=4,
                        batch=8, queries=4, width=8, eval_every=2, eval_contexts=16)
    assert isinstance(sweep, DepthSweep) and sweep.loss["A"].shape == (2,) and sweep.stderr["B"].shape == (2,)
    assert len(list(tmp_path.iterdir())) == 4
    again = train_all({"a": sweep.configs["A"][0]}, progress=False)
    assert again["a"].history[-1]["eval_excess_loss"] == sweep.loss["A"][0]
    theory = depth_sweep_theory(TreePrior(2, 0.5), 16, 0.0, [1, 2], samples=50,
                                strategies=("adaptive_greedy", "nonadaptive_coord"))
    assert theory["adaptive_greedy"][0].shape == (2,)
    ax = plot_depth_sweep(sweep, theory)
    assert ax.get_yscale() == "log"
    # the optimised adaptive policy has its own style (black, dash-dotted) and label
    theory["adaptive_opt"] = (np.array([0.5, 0.2]), np.array([0.01, 0.01]))
    lines = {ln.get_label(): ln for ln in plot_depth_sweep(sweep, theory).get_lines()}
    line = lines[f"theory: {STRATEGY_LABELS['adaptive_opt']}"]
    assert line.get_linestyle() == "-." and line.get_color() == "#000000"
    np.testing.assert_allclose(line.get_ydata(), [0.5, 0.2])


TINY_SWEEP = dict(depth=2, alpha=0.5, n_ctx=16, steps=4, batch=8, queries=4, width=8, eval_every=2,
                  eval_contexts=16, device="cpu", router_warm_start=0)


def test_seed_configs_keep_the_data_and_the_own_seed_run():
    base = TrainConfig(budget=2, **TINY_SWEEP)
    cfgs = seed_configs(base, [0, 1, 2])
    assert cfgs[0] is base and run_dir_for(cfgs[0]) == run_dir_for(base)
    assert [c.seed for c in cfgs] == [0, 1, 2] and all(c.effective_data_seed == 0 for c in cfgs)
    assert cfgs[1].data_seed == 0 and len({run_dir_for(c) for c in cfgs}) == 3


@pytest.mark.parametrize("seeds, message", [([], "non-empty"), ([0, 0], "distinct"), ([-1], "seed"),
                                             ("01", "non-empty")])
def test_seed_configs_reject_bad_seeds(seeds, message):
    with pytest.raises(ValueError, match=message):
        seed_configs(TrainConfig(budget=2, **TINY_SWEEP), seeds)


def test_train_seeds_trains_the_own_seed_alone_and_the_others_batched(tmp_path, monkeypatch):
    monkeypatch.setenv("FVLIB_RUN_ROOT", str(tmp_path))
    configs = {"a": TrainConfig(budget=2, **TINY_SWEEP), "b": TrainConfig(model="B", budget=2, **TINY_SWEEP)}
    out = train_seeds(configs, [0, 1, 2], progress=False)
    assert set(out) == {"a", "b"} and [r.config.seed for r in out["a"]] == [0, 1, 2]
    alone = train_all({"a": configs["a"]}, progress=False)["a"]  # reloaded: bitwise the same
    assert out["a"][0].history == alone.history
    loss, se = final_losses(out["b"])
    assert loss.shape == se.shape == (3,) and (se > 0).all() and len(set(loss)) == 3
    assert len(list(tmp_path.iterdir())) == 6
    again = train_seeds(configs, [0, 1, 2], progress=False)  # everything reloaded
    assert [r.history for r in again["b"]] == [r.history for r in out["b"]]


def test_train_seeds_alone_names_the_own_seed_runs_trained_alone(tmp_path, monkeypatch):
    """Keys left out of ``alone`` train their own seed in the batched call (with the other
    seeds, one stack): the run of that call, within float rounding of the run trained alone."""
    from fvlib.training import train
    from fvlib.training.batched import train_many

    monkeypatch.setenv("FVLIB_RUN_ROOT", str(tmp_path))
    configs = {"a": TrainConfig(budget=2, **TINY_SWEEP), "b": TrainConfig(model="B", budget=2, **TINY_SWEEP)}
    out = train_seeds(configs, [0, 1], progress=False, alone=["a"])
    assert out["a"][0].history == train_all({"a": configs["a"]}, progress=False)["a"].history
    solo_b = train(configs["b"], progress=False)
    batched_b = train_many(seed_configs(configs["b"], [0, 1]), progress=False)[0]
    losses = [[e["eval_excess_loss"] for e in r.history] for r in (out["b"][0], batched_b, solo_b)]
    assert losses[0] == losses[1]
    assert abs(out["b"][0].final_loss / solo_b.final_loss - 1) < 1e-4
    with pytest.raises(ValueError, match="'c'"):
        train_seeds(configs, [0, 1], progress=False, alone=["c"])


def test_depth_sweep_with_seeds_gives_the_spread_and_plots(tmp_path, monkeypatch):
    monkeypatch.setenv("FVLIB_RUN_ROOT", str(tmp_path))
    sweep = depth_sweep([1, 2], models=("A", "B"), progress=False, seeds=(0, 1, 2), **TINY_SWEEP)
    assert sweep.seeds == (0, 1, 2) and sweep.seed_loss["A"].shape == (3, 2)
    np.testing.assert_allclose(sweep.loss["A"], sweep.seed_loss["A"].mean(0))
    np.testing.assert_allclose(sweep.spread["B"], sweep.seed_loss["B"].std(0, ddof=1))
    np.testing.assert_allclose(sweep.stderr["A"], np.sqrt((sweep.seed_stderr["A"] ** 2).sum(0)) / 3)
    assert [c.seed for c in sweep.configs["A"]] == [0, 0, 1, 1, 2, 2]
    # the same network with one channel: A and B at budget 1 agree for every seed
    np.testing.assert_allclose(sweep.seed_loss["A"][:, 0], sweep.seed_loss["B"][:, 0], rtol=1e-6)
    from fvlib.theory import fit_decay

    fits = {"A": fit_decay([1, 2, 3], [1.0, 0.5, 0.25])}
    ax = plot_depth_sweep(sweep, fits=fits)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("mean of 3 seeds" in t for t in labels) and "fit to A: exponential" in labels


def test_train_parallel_gives_the_runs_train_gives(tmp_path):
    """Runs trained in worker processes are bitwise the runs train gives on one thread, in
    the run_dir_for directories; a second call loads them; bad jobs name the value."""
    configs = [dataclasses.replace(TINY, steps=12, seed=s, model=m) for s, m in ((0, "A"), (1, "B"))]
    losses = train_parallel(configs, jobs=2, root=tmp_path / "par")
    torch.set_num_threads(1)
    for config in configs:
        alone = train(config, out_dir=run_dir_for(config, tmp_path / "alone"), progress=False)
        assert losses[str(run_dir_for(config, tmp_path / "par"))] == alone.final_loss
    assert train_parallel(configs, jobs=2, root=tmp_path / "par") == losses
    with pytest.raises(ValueError, match="jobs"):
        train_parallel(configs, jobs=0)
    with pytest.raises(ValueError, match="TrainConfig"):
        train_parallel(["A"])
    with pytest.raises(ValueError, match=r"\[\]"):
        train_parallel([configs[0], []])


def test_train_parallel_trains_a_batch_as_train_many_does(tmp_path):
    """A list item is one train_many call on one thread, in the run_dir_for directories."""
    batch = [dataclasses.replace(TINY, steps=12, seed=s, data_seed=0) for s in (1, 2)]
    single = dataclasses.replace(TINY, steps=12, model="B")
    losses = train_parallel([batch, single], jobs=2, root=tmp_path / "par")
    before = torch.get_num_threads()
    together = train_many(batch, [run_dir_for(c, tmp_path / "many") for c in batch], progress=False, threads=1)
    assert torch.get_num_threads() == before
    for config, result in zip(batch, together):
        assert losses[str(run_dir_for(config, tmp_path / "par"))] == result.final_loss
    assert set(losses) == {str(run_dir_for(c, tmp_path / "par")) for c in [*batch, single]}


def test_warm_work_is_what_chapter_8_trains():
    """`python -m fvlib experiment warm` trains chapter 8's batch exactly: the seeds that
    train_seeds batches, in their order, plus every run trained alone; no depth sweep (stored)."""
    work = warm_work()
    shared = shared_configs()
    per_key, solo, batched = seed_plan(shared, SHARED_SEEDS)
    assert work[0] == [c for _, c in batched] and len(work[0]) == 12
    assert solo == shared and all(c.seed in (1, 2) and c.data_seed == 0 for c in work[0])
    assert [c.seed for c in per_key[("A", "tree")]] == [0, 1, 2]
    alone = work[1:]
    assert all(isinstance(c, TrainConfig) for c in alone)
    assert set(shared.values()) <= set(alone)
    dirs = [run_dir_for(c) for c in [*work[0], *alone]]
    assert len(set(dirs)) == len(dirs)


def test_chapter_run_configs_are_the_chapters_runs():
    """The configs that `python -m fvlib warm` trains ahead are those chapters 8 and 11 train:
    beside the shared run of model A (the one recipe, 3000 steps), its original-recipe run (1500
    steps, every token) and its imitation run (IMITATION_RECIPE, 3000 steps, every token), and
    the twelve standard transformers."""
    from fvlib.training import IMITATION_RECIPE

    base = shared_configs()[("A", "tree")]
    old = original_config(base)
    assert (old.steps, old.input_path, old.batch, old.expected_loss, old.alpha_start) == (1500, "tokens", 256,
                                                                                          False, None)
    assert {k: getattr(old, k) for k in ORIGINAL_RECIPE} == ORIGINAL_RECIPE and not old.warm_starts
    assert (old.depth, old.budget, old.seed, old.n_ctx) == (base.depth, base.budget, base.seed, base.n_ctx)
    new = imitation_config(base)
    assert new.steps == 3000 and new.warm_starts and new.input_path == "tokens"
    assert {k: getattr(new, k) for k in IMITATION_RECIPE} == IMITATION_RECIPE
    assert dataclasses.replace(new, steps=old.steps, **ORIGINAL_RECIPE) == old
    assert imitation_config(old) == new                       # from either start: the same run
    assert base in warm_work() and old in warm_work() and new in warm_work()
    configs = transformer_chapter_configs()
    assert len(configs) == 6 * len(TRANSFORMER_CHAPTER["seeds"])
    assert [c.arch for c in configs].count("transformer-open") == 2 * len(TRANSFORMER_CHAPTER["seeds"])
    assert all(c.warmup == 0 and c.lr == 2e-3 and c.depth == 2 for c in configs)
    assert len({run_dir_for(c) for c in configs}) == len(configs)
