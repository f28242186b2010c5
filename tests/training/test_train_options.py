"""Training options that are off by default (fvlib.training.TrainConfig): the expected query loss and
the curriculum over the tree's decay."""

import dataclasses

import pytest
import torch

from fvlib import make_prior
from fvlib.models import make_model
from fvlib.task import make_generator, sample_task
from fvlib.training import (
    TrainConfig,
    expected_query_loss,
    query_loss,
    run_dir_for,
    sample_queries,
    train,
    training_prior,
)
from fvlib.training.batched import train_many

#: Tree K=3 (D=7), N=32, budget 3: small and quick.
TINY = TrainConfig(model="A", depth=3, n_ctx=32, budget=3, steps=40, batch=32, queries=8, width=16,
                   eval_every=20, eval_contexts=64, checkpoint_every=20, device="cpu")

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def test_expected_loss_is_the_mean_of_the_sampled_query_loss():
    """|theta_hat - theta|^2 + sigma^2 is the sampled query loss averaged over many query tokens."""
    prior = make_prior("tree", 3, 0.5)
    torch.manual_seed(0)
    model = make_model("A", prior.dim, 3, width=16)
    with torch.no_grad():
        model.decoder[-1].weight.normal_(0, 0.3)
    generator = make_generator(1)
    batch = sample_task(prior, 64, 32, 0.3, generator)
    x, y = batch.x.float(), batch.y.float()
    with torch.no_grad():
        exact = expected_query_loss(model.predict_theta, x, y, batch.x_query.float(), batch.theta, 0.3)
        x_query, y_query = sample_queries(batch, 4000, generator)
        sampled = query_loss(model, x, y, x_query.float(), y_query.float())
    assert float(exact) == pytest.approx(float(sampled), rel=0.03)


def test_expected_loss_trains_and_keeps_the_other_runs_directories(tmp_path):
    config = dataclasses.replace(TINY, expected_loss=True)
    result = train(config, out_dir=tmp_path / "run", progress=False)
    assert result.final_loss < 0.5 * result.history[0]["eval_excess_loss"]
    assert run_dir_for(config, "r") != run_dir_for(TINY, "r")
    assert run_dir_for(dataclasses.replace(config, expected_loss=False), "r") == run_dir_for(TINY, "r")
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert TrainConfig.from_dict({k: v for k, v in TINY.to_dict().items() if k != "expected_loss"}) == TINY
    # the same run trained alone and batched (with another seed) agree to float rounding
    batched = train_many([config, dataclasses.replace(config, seed=1, data_seed=0)], progress=False)
    assert abs(batched[0].final_loss - result.final_loss) <= 1e-4 * result.final_loss


@pytest.mark.parametrize("value", [1, "yes", None])
def test_expected_loss_must_be_a_bool(value):
    with pytest.raises(ValueError, match="expected_loss"):
        dataclasses.replace(TINY, expected_loss=value)


def test_expected_loss_needs_a_theta_hat():
    with pytest.raises(ValueError, match="expected_loss"):
        TrainConfig(arch="transformer", expected_loss=True, width=32)


# ----- the curriculum over alpha ----------------------------------------------------------
def test_training_prior_moves_alpha_linearly_then_holds_it():
    config = dataclasses.replace(TINY, alpha=0.5, alpha_start=0.7, alpha_ramp=0.5)  # 40 steps: ramp of 20
    assert training_prior(config, 0).alpha == pytest.approx(0.7)
    assert training_prior(config, 10).alpha == pytest.approx(0.6)
    assert training_prior(config, 20).alpha == pytest.approx(0.5)
    assert training_prior(config, 39).alpha == pytest.approx(0.5)
    assert training_prior(TINY, 0).alpha == TINY.alpha


def test_curriculum_trains_alone_and_batched_alike_and_keeps_the_other_runs_directories(tmp_path):
    config = dataclasses.replace(TINY, alpha_start=0.8, expected_loss=True)
    alone = train(config, out_dir=tmp_path / "run", progress=False)
    batched = train_many([config, dataclasses.replace(config, seed=1, data_seed=0)], progress=False)
    assert abs(batched[0].final_loss - alone.final_loss) <= 1e-4 * alone.final_loss
    assert alone.final_loss < 0.5 * alone.history[0]["eval_excess_loss"]
    assert run_dir_for(config, "r") != run_dir_for(dataclasses.replace(config, alpha_start=0.7), "r")
    assert run_dir_for(config, "r") != run_dir_for(dataclasses.replace(config, alpha_ramp=0.3), "r")
    assert run_dir_for(dataclasses.replace(TINY, alpha_ramp=0.3), "r") == run_dir_for(TINY, "r")  # unused
    # without a curriculum the run is the one of the defaults, bitwise
    plain = train(TINY, progress=False)
    assert train(dataclasses.replace(TINY, alpha_ramp=0.3), progress=False).final_loss == plain.final_loss


@pytest.mark.parametrize("changes", [dict(alpha_start=0.0), dict(alpha_start=1.5), dict(alpha_ramp=0.0),
                                     dict(alpha_ramp=1.2), dict(alpha_start=0.7, prior="gaussian-twin")])
def test_bad_curriculum_raises(changes):
    with pytest.raises(ValueError, match="alpha_start|alpha_ramp"):
        dataclasses.replace(TINY, **changes)


def test_cli_train_takes_the_options(tmp_path):
    from fvlib.cli import main
    from fvlib.training import load_run

    common = ["train", "--model", "A", "--depth", "2", "--n-ctx", "8", "--budget", "2", "--steps", "5",
              "--batch", "8", "--width", "8", "--device", "cpu", "--no-progress", "--json"]
    assert main([*common, "--out", str(tmp_path / "a"), "--expected-loss", "--alpha-start", "0.7",
                 "--alpha-ramp", "0.5"]) == 0
    config = load_run(tmp_path / "a")[1]
    assert (config.expected_loss, config.alpha_start, config.alpha_ramp) == (True, 0.7, 0.5)
    # without the flags: the learning recipe, expected loss and the curriculum from alpha + 0.4 (1 - alpha)
    assert main([*common, "--out", str(tmp_path / "b")]) == 0
    config = load_run(tmp_path / "b")[1]
    assert (config.expected_loss, config.alpha_start, config.alpha_ramp) == (True, 0.7, 0.6)
    # and both switched off
    assert main([*common, "--out", str(tmp_path / "c"), "--no-expected-loss", "--no-curriculum"]) == 0
    config = load_run(tmp_path / "c")[1]
    assert (config.expected_loss, config.alpha_start) == (False, None)
    # the imitation recipe keeps the stored runs' sampled loss and has no curriculum
    assert main([*common, "--out", str(tmp_path / "d"), "--imitation", "--router-warm-start", "2"]) == 0
    config = load_run(tmp_path / "d")[1]
    assert (config.expected_loss, config.alpha_start, config.warm_starts) == (False, None, True)


@pytest.mark.parametrize("alpha, start", [(0.5, 0.7), (0.4, 0.64), (0.9, 0.94), (1.0, 1.0)])
def test_curriculum_start_lies_between_alpha_and_one(alpha, start):
    from fvlib.training import curriculum_start

    assert curriculum_start(alpha) == pytest.approx(start, abs=1e-12)
    assert alpha <= curriculum_start(alpha) <= 1


def test_recipe_for_each_arch_and_prior():
    """python -m fvlib train's recipe: the learning recipe for constrained models, with the
    curriculum on the tree only; the transformers' own recipe (sampled loss) otherwise."""
    from fvlib.training import LEARNING_RECIPE, RECIPE, TRANSFORMER_RECIPE, recipe_for

    assert recipe_for("constrained", "tree", 0.3) == {**LEARNING_RECIPE, "alpha_start": 0.58}
    assert recipe_for("constrained", "gaussian-twin", 0.3) == LEARNING_RECIPE
    assert LEARNING_RECIPE == {**RECIPE, "batch": 512, "expected_loss": True}
    assert LEARNING_RECIPE["router_warm_start"] == 0   # no teacher
    assert recipe_for("transformer", "tree", 0.3) == TRANSFORMER_RECIPE
    for bad in (("rnn",), ("constrained", "cube"), ("constrained", "tree", 0.0)):
        with pytest.raises(ValueError, match="rnn|cube|alpha"):
            recipe_for(*bad)


@pytest.mark.parametrize("argv, message", [
    (["--no-curriculum", "--alpha-start", "0.6"], "contradict"),
    (["--no-curriculum", "--alpha-ramp", "0.5"], "needs a curriculum"),
    (["--prior", "gaussian", "--alpha-ramp", "0.5"], "needs a curriculum"),
])
def test_cli_curriculum_flags_that_contradict(tmp_path, capsys, argv, message):
    from fvlib.cli import main

    common = ["train", "--model", "A", "--depth", "2", "--n-ctx", "8", "--budget", "2", "--steps", "2",
              "--no-progress", "--out", str(tmp_path / "run")]
    assert main([*common, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
