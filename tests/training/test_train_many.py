"""Batched training (fvlib.training.train_many) against training alone (fvlib.training.train)."""

import dataclasses
import json

import pytest
import torch
from conftest import TINY, same_parameters, strip_times
from safetensors import safe_open

from fvlib.experiments.definitions import controls_config
from fvlib.experiments.inbuild import original_config, shared_configs
from fvlib.training import (
    EVAL_SEED_OFFSET,
    ORIGINAL_RECIPE,
    RunDirError,
    TrainConfig,
    build_prior,
    curriculum_start,
    evaluate,
    load_run,
    run_dir_for,
    train,
    train_many,
)

#: Largest relative difference of final losses allowed between batched and alone.
TOLERANCE = 1e-4

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def assert_matches_alone(batched, alone):
    """Same history layout and step-0 entry; final losses and weights to float tolerance."""
    assert [e["step"] for e in batched.history] == [e["step"] for e in alone.history]
    assert strip_times(batched.history[:1]) == strip_times(alone.history[:1])
    assert abs(batched.final_loss - alone.final_loss) <= TOLERANCE * alone.final_loss
    for name, weight in alone.model.state_dict().items():
        # the stacked pooling adds the same products in another order; Adam, which divides by the
        # gradient's size, carries that rounding into a few near-zero weights at the 1e-5 level
        torch.testing.assert_close(batched.model.state_dict()[name], weight, rtol=1e-3, atol=1e-4)


def seeds(config, n=3, **changes):
    return [dataclasses.replace(config, seed=seed, **changes) for seed in range(n)]


#: Several stacks in one call: seeds of A (one with another prior, evaluation and checkpoint
#: period), and B and C, which cannot be stacked with A.
MIXED = seeds(TINY, 2) + [
    dataclasses.replace(TINY, seed=2, prior="gaussian-twin", eval_every=20, checkpoint_every=7),
    dataclasses.replace(TINY, model="B", seed=1),
    dataclasses.replace(TINY, model="C", seed=1, lr=1e-2),
    dataclasses.replace(TINY, seed=3, inputs="tokens"),   # every token, as the stored runs
]


# ----- numbers ----------------------------------------------------------------------------
def test_batched_models_match_training_alone():
    for batched, config in zip(train_many(MIXED, progress=False), MIXED):
        assert batched.config == config
        assert_matches_alone(batched, train(config, progress=False))


def test_shared_contexts_match_training_alone_with_that_data_seed():
    configs = seeds(TINY, 3, data_seed=7)
    for batched, config in zip(train_many(configs, progress=False), configs):
        assert_matches_alone(batched, train(config, progress=False))


def test_batched_evaluations_match_evaluating_each_model_alone():
    """The evaluations after step 0 run batched over a stack (two evaluation sets here: the
    tree and the twin); each equals evaluating that model's own weights alone."""
    configs = MIXED[:3] + seeds(TINY, 2, data_seed=7)
    for result in train_many(configs, progress=False):
        c = result.config
        alone = evaluate(result.model, build_prior(c), c.n_ctx, c.noise_std, contexts=c.eval_contexts,
                         seed=c.effective_data_seed + EVAL_SEED_OFFSET, statistic=c.statistic)
        last = result.history[-1]
        assert last["step"] == c.steps and alone["contexts"] == c.eval_contexts
        for key in ("excess_loss", "query_loss"):
            assert last[f"eval_{key}"] == pytest.approx(alone[key], rel=1e-6, abs=0)
        assert last["eval_stderr"] == pytest.approx(alone["stderr"], rel=1e-5, abs=0)


def test_train_many_is_bitwise_reproducible():
    a, b = train_many(MIXED, progress=False), train_many(MIXED, progress=False)
    for x, y in zip(a, b):
        assert strip_times(x.history) == strip_times(y.history) and same_parameters(x.model, y.model)


def test_data_seed_sets_the_contexts_and_the_evaluation_set(tmp_path):
    """Two seeds with one data seed draw the same contexts; without it, different ones."""
    configs = {
        "a": dataclasses.replace(TINY, seed=0, data_seed=5),
        "b": dataclasses.replace(TINY, seed=1, data_seed=5),
        "c": dataclasses.replace(TINY, seed=1),
    }
    states = {}
    for name, config in configs.items():
        train(dataclasses.replace(config, steps=3), out_dir=tmp_path / name, progress=False)
        with safe_open(str(tmp_path / name / "train_state.safetensors"), framework="pt") as f:
            states[name] = f.get_tensor("generator_state")
    assert torch.equal(states["a"], states["b"]) and not torch.equal(states["b"], states["c"])
    assert train(configs["b"], progress=False).history[0] != train(configs["c"], progress=False).history[0]


# ----- run directories and resumption -----------------------------------------------------
def file_layout(run_dir):
    """File names, config, and the names, shapes and step metadata of every tensor."""
    layout = {"files": sorted(p.name for p in run_dir.iterdir()), "config": (run_dir / "config.json").read_text()}
    for name in ("model.safetensors", "train_state.safetensors"):
        with safe_open(str(run_dir / name), framework="pt") as f:
            layout[name] = ({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}, f.metadata()["step"])
    layout["history_step"] = json.loads((run_dir / "history.json").read_text())["step"]
    return layout


def test_run_directories_are_those_of_train(tmp_path):
    configs = seeds(TINY, 2)
    train_many(configs, [tmp_path / f"many{i}" for i in range(2)], progress=False, until_step=23)
    for i, config in enumerate(configs):
        train(config, out_dir=tmp_path / f"alone{i}", progress=False, until_step=23)
        assert file_layout(tmp_path / f"many{i}") == file_layout(tmp_path / f"alone{i}")
        model, stored, history = load_run(tmp_path / f"many{i}")
        assert stored == config and [e["step"] for e in history] == [0, 10, 20]


def test_an_interrupted_batch_resumes_bitwise(tmp_path):
    dirs = [tmp_path / str(i) for i in range(len(MIXED))]
    whole = train_many(MIXED, progress=False)
    part = train_many(MIXED, dirs, progress=False, until_step=17)
    assert [e["step"] for e in part[0].history] == [0, 10] and part[0].final_loss != whole[0].final_loss
    resumed = train_many(MIXED, dirs, progress=False)
    for x, y in zip(resumed, whole):
        assert strip_times(x.history) == strip_times(y.history) and same_parameters(x.model, y.model)


def test_train_many_resumes_what_train_started_and_the_other_way_round(tmp_path):
    configs = seeds(TINY, 2)
    alone = [train(c, progress=False) for c in configs]
    train(configs[0], out_dir=tmp_path / "0", progress=False, until_step=20)  # started alone
    train_many(configs[1:], [tmp_path / "1"], progress=False, until_step=20)  # started batched
    finished = train_many(configs[:1], [tmp_path / "0"], progress=False) + [
        train(configs[1], out_dir=tmp_path / "1", progress=False)
    ]
    for result, reference in zip(finished, alone):
        assert_matches_alone(result, reference)


def test_finished_runs_are_loaded_not_retrained(tmp_path):
    done = train(TINY, out_dir=tmp_path / "done", progress=False)
    fresh = dataclasses.replace(TINY, seed=1)
    loaded, trained = train_many([TINY, fresh], [tmp_path / "done", tmp_path / "fresh"], progress=False)
    assert strip_times(loaded.history) == strip_times(done.history) and loaded.final_loss == done.final_loss
    assert same_parameters(loaded.model, done.model)
    assert_matches_alone(trained, train(fresh, progress=False))
    again = train(fresh, out_dir=tmp_path / "fresh", progress=False)  # train reloads what train_many wrote
    assert strip_times(again.history) == strip_times(trained.history)


def test_resume_refuses_a_directory_of_another_config(tmp_path):
    train(TINY, out_dir=tmp_path, progress=False, until_step=5)
    with pytest.raises(RunDirError, match="another config: seed 3 here, 0 in the run"):
        train_many([dataclasses.replace(TINY, seed=3)], [tmp_path], progress=False)


# ----- configuration and bad input ---------------------------------------------------------
def test_run_dir_names_do_not_change():
    """Names computed before data_seed and warmup existed (a None data seed and a zero warm-up
    are left out of the hash), for the book's original recipe."""
    old = ORIGINAL_RECIPE
    assert run_dir_for(TrainConfig(**old), "r").name == "A-tree-K6-M6-N128-s3000-ad8cdb7a2b"
    config_b = TrainConfig(model="B", seed=3, steps=500, **old)
    assert run_dir_for(config_b, "r").name == "B-tree-K6-M6-N128-s500-0ad8cd3eec"
    assert run_dir_for(TrainConfig(data_seed=0), "r") != run_dir_for(TrainConfig(), "r")
    assert run_dir_for(TrainConfig(data_seed=0), "r") != run_dir_for(TrainConfig(data_seed=1), "r")
    # the current defaults (another recipe) have their own directories; so has any warm-up
    assert run_dir_for(TrainConfig(), "r") != run_dir_for(TrainConfig(**old), "r")
    assert run_dir_for(TrainConfig(**{**old, "warmup": 0.05}), "r") != run_dir_for(TrainConfig(**old), "r")


def test_shared_runs_take_the_one_recipe_and_the_original_run_keeps_its_directory():
    """The book's shared runs (chapters 5, 7-10) train with the one recipe of the stored controls
    (controls_config: recipe_for, the pooled statistic); chapter 8's original-recipe run of model
    A keeps the directory, and so the numbers, of the shared run it was before."""
    shared = shared_configs()
    control = controls_config("A", prior="tree", depth=5, alpha=0.5, n_ctx=128, noise_std=0.0, budget=5)
    task_and_recipe = [f.name for f in dataclasses.fields(TrainConfig)
                       if f.name not in ("eval_every", "data_seed", "device", "inputs")]
    assert all(getattr(shared[("A", "tree")], k) == getattr(control, k) for k in task_and_recipe)
    assert all(c.input_path == "statistic" for c in shared.values())
    twin = controls_config("C", prior="gaussian-twin", depth=5, alpha=0.5, n_ctx=128, noise_std=0.0, budget=5)
    assert shared[("C", "gaussian-twin")].alpha_start is None
    assert all(getattr(shared[("C", "gaussian-twin")], k) == getattr(twin, k) for k in task_and_recipe)
    original = original_config(shared[("A", "tree")])
    assert run_dir_for(original, "r").name == "A-tree-K5-M5-N128-s1500-6a1833258d"
    assert (original.lr, original.warmup, original.queries, original.input_path) == (3e-3, 0.0, 64, "tokens")
    assert shared_configs(lr=3e-3)[("A", "tree")].lr == 3e-3           # overrides still win
    assert shared_configs(alpha=0.6)[("B", "tree")].alpha_start == curriculum_start(0.6)


#: Another valid value of every TrainConfig field (TINY warm-starts its router).
OTHER = dict(model="B", prior="gaussian-twin", depth=4, alpha=0.6, n_ctx=16, noise_std=0.2, budget=2, steps=50,
             batch=16, lr=2e-3, warmup=0.1, queries=4, expected_loss=True, alpha_start=0.8, alpha_ramp=0.5,
             width=8, hidden_layers=1, router_warm_start=5, router_lr_scale=0.5, seed=3, data_seed=2, eval_every=5,
             eval_contexts=32, checkpoint_every=7, device="auto", arch="transformer", inputs="tokens", router="coord")


def test_stacks_split_by_every_field_but_the_free_ones():
    from fvlib.training import TrainConfig
    from fvlib.training.batched import STACK_FREE_FIELDS, stack_key

    assert set(OTHER) == {f.name for f in dataclasses.fields(TrainConfig)}
    cold = dataclasses.replace(TINY, router_warm_start=0)   # no warm start, sampled loss
    for name, value in OTHER.items():
        base = TINY if name == "router_warm_start" else cold  # 20 -> 5 steps: still warm-started
        changed = dataclasses.replace(base, **{name: value})
        same = stack_key(changed) == stack_key(base)
        assert same == (name in STACK_FREE_FIELDS | {"noise_std", "router_lr_scale"}), name
    # noise_std splits with the expected loss, router_lr_scale with a warm start
    expected = dataclasses.replace(cold, expected_loss=True)
    assert stack_key(dataclasses.replace(expected, noise_std=0.2)) != stack_key(expected)
    assert stack_key(dataclasses.replace(TINY, router_lr_scale=0.5)) != stack_key(TINY)


def test_configs_without_data_seed_still_load():
    old = {k: v for k, v in TINY.to_dict().items() if k != "data_seed"}
    assert TrainConfig.from_dict(old) == TINY and TINY.effective_data_seed == TINY.seed
    assert dataclasses.replace(TINY, data_seed=4).effective_data_seed == 4


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True])
def test_bad_data_seed_raises_naming_the_value(bad):
    with pytest.raises(ValueError, match=f"data_seed.*{bad!r}"):
        dataclasses.replace(TINY, data_seed=bad)


@pytest.mark.parametrize(
    "configs, out_dirs, until_step, message",
    [
        ([], None, None, "non-empty"),
        (TINY, None, None, "non-empty"),
        ([TINY, TINY.to_dict()], None, None, r"configs\[1\] must be a TrainConfig, got dict"),
        ([TINY, TINY], ["a"], None, "1 directories for 2 configs"),
        ([TINY], "a", None, "out_dirs must be None or a list"),
        ([TINY, TINY], ["same", "same"], None, r"out_dirs\[0\] and out_dirs\[1\] are the same directory 'same'"),
        ([TINY], None, 0, "until_step.*got 0"),
        ([TINY], None, TINY.steps + 1, f"until_step.*got {TINY.steps + 1}"),
    ],
)
def test_bad_input_raises_naming_it(configs, out_dirs, until_step, message):
    with pytest.raises(ValueError, match=message):
        train_many(configs, out_dirs, progress=False, until_step=until_step)


def test_threads_are_set_for_the_loop_and_restored(monkeypatch):
    import torch

    from fvlib.training import TrainConfig
    from fvlib.training.batched import train_many

    seen = []
    import fvlib.training.batched as batched

    original = batched.make_stacks

    def spy(runs, stops):
        seen.append(torch.get_num_threads())
        return original(runs, stops)

    monkeypatch.setattr(batched, "make_stacks", spy)
    before = torch.get_num_threads()
    config = TrainConfig(model="B", depth=2, budget=2, n_ctx=8, steps=2, batch=4, eval_every=2,
                         eval_contexts=16, width=8)
    train_many([config], progress=False, threads=1 if before != 1 else 2)
    assert seen == [1 if before != 1 else 2] and torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads"):
        train_many([config], progress=False, threads=0)


