"""Theory strategies as predictors (batch -> theta_hat) and every predictor's errors on the same
contexts (fvlib.theory.predictors, fvlib.training.evaluate.per_context_errors)."""


import pytest
import torch

from fvlib import TreePrior
from fvlib.theory import (
    GreedyRule,
    channel_tau2,
    evaluate_strategies,
    optimise_directions,
    policy_predictor,
    strategy_predictor,
)
from fvlib.training.evaluate import per_context_errors, sample_eval_batches

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


def test_evaluate_strategies_in_chunks_gives_the_numbers_of_one_batch(monkeypatch):
    """On the finite-N channel the contexts are read in chunks (memory); every number is the one
    of a single batch: each context is read on its own."""
    from fvlib.theory import strategies

    tree = TreePrior(4, 0.5)
    names = ("adaptive_greedy", "nonadaptive_coord", "lmmse")
    monkeypatch.setattr(strategies, "EVALUATION_CHUNK", 10**9)
    whole = strategies.evaluate_strategies(tree, 32, 0.1, 3, samples=700, seed=3, strategies=names)
    monkeypatch.setattr(strategies, "EVALUATION_CHUNK", 64)
    chunked = strategies.evaluate_strategies(tree, 32, 0.1, 3, samples=700, seed=3, strategies=names)
    for name in names:
        assert chunked[name].mean == pytest.approx(whole[name].mean, rel=1e-12, abs=1e-15), name
        assert chunked[name].stderr == pytest.approx(whole[name].stderr, rel=1e-9), name
