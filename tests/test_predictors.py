"""Theory strategies as predictors (batch -> theta_hat) and the paired evaluation of models and
baselines on the same contexts (fvlib.theory.predictors, fvlib.training.evaluate)."""

import dataclasses

import pytest
import torch

from conftest import TINY
from fvlib import TreePrior
from fvlib.stats import paired_ratio
from fvlib.theory import (GreedyRule, channel_tau2, evaluate_strategies, optimise_directions, policy_predictor,
                          strategy_predictor)
from fvlib.training import compare_with_theory, train
from fvlib.training.evaluate import (baseline_predictor, model_predictor, per_context_errors,
                                     sample_eval_batches)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

TREE, N, SIGMA, M = TreePrior(3, 0.5), 32, 0.1, 3


@pytest.fixture(scope="module")
def batches():
    return sample_eval_batches(TREE, N, SIGMA, 3000, seed=5)


@pytest.mark.parametrize("name", ["adaptive_greedy", "nonadaptive_coord", "lmmse", "nonadaptive_opt",
                                  "nonadaptive_best_coord"])
def test_a_strategy_predictor_scores_what_evaluate_strategies_scores(batches, name):
    """On other contexts of the same law the two Monte Carlo means agree within 4 s.e."""
    tau2 = channel_tau2(TREE, N, SIGMA)
    directions = optimise_directions(TREE, M, tau2, seed=0) if name == "nonadaptive_opt" else None
    errors = per_context_errors({name: strategy_predictor(name, TREE, M, directions=directions)}, batches)[name]
    assert errors.shape == (3000,) and errors.dtype == torch.float64
    est = evaluate_strategies(TREE, N, SIGMA, M, samples=3000, seed=0, strategies=(name,), directions=directions)[name]
    se = (errors.std() ** 2 / errors.numel() + est.stderr**2) ** 0.5
    assert abs(float(errors.mean()) - est.mean) < 4 * float(se), (name, float(errors.mean()), est.mean)


def test_the_greedy_rule_as_a_policy_is_the_greedy_strategy(batches):
    a = strategy_predictor("adaptive_greedy", TREE, M)(batches[0])
    b = policy_predictor(TREE, GreedyRule(TREE), M)(batches[0])
    assert a.shape == b.shape == (batches[0].theta.shape[0], TREE.dim)
    assert torch.allclose(a, b, atol=1e-9)


def test_predictors_refuse_what_they_cannot_do():
    with pytest.raises(ValueError, match="adaptive_opt is a policy"):
        strategy_predictor("adaptive_opt", TREE, M)
    with pytest.raises(ValueError, match="'best'"):
        strategy_predictor("best", TREE, M)
    with pytest.raises(ValueError, match="nonadaptive_opt needs its directions"):
        strategy_predictor("nonadaptive_opt", TREE, M)
    with pytest.raises(ValueError, match="budget"):
        strategy_predictor("lmmse", TREE, 99)
    with pytest.raises(ValueError, match="at least one predictor"):
        per_context_errors({}, [])


@pytest.fixture(scope="module")
def trained():
    return train(dataclasses.replace(TINY, router_warm_start=0), progress=False)


def test_compare_with_theory_pairs_the_model_with_its_baseline(trained):
    config = trained.config
    out = compare_with_theory(trained.model, config, contexts=600, seed=3)
    batches = sample_eval_batches(TreePrior(config.depth, config.alpha), config.n_ctx, config.noise_std, 600,
                                  seed=3 + 10_000, statistic=config.statistic)
    errors = per_context_errors({"model": model_predictor(trained.model), "theory": baseline_predictor(config, 3)},
                                batches)
    assert out["theory_name"] == "adaptive_greedy" and out["contexts"] == 600
    assert out["model"] == pytest.approx(float(errors["model"].mean()), rel=1e-12)
    assert out["theory"] == pytest.approx(float(errors["theory"].mean()), rel=1e-12)
    assert (out["ratio"], out["ratio_stderr"]) == pytest.approx(paired_ratio(errors["model"], errors["theory"]))
    assert out["ratio_stderr"] > 0


def test_compare_with_theory_on_the_twin_uses_the_closed_form(trained):
    config = dataclasses.replace(trained.config, prior="gaussian-twin")
    out = compare_with_theory(trained.model, config, contexts=300)
    assert out["theory_name"] == "gaussian_closed_form" and out["theory_stderr"] == 0.0
    assert out["ratio"] == pytest.approx(out["model"] / out["theory"])
    assert out["ratio_stderr"] == pytest.approx(out["model_stderr"] / out["theory"])
    with pytest.raises(ValueError, match="tree prior"):
        baseline_predictor(config)
