"""A trained model beside the theory (fvlib.experiments.beside_theory): the matching baseline
on the model's own contexts, greedy on the same contexts, chapter 8's gap table and its record."""

import dataclasses

import pytest
import torch
from conftest import TINY, untrained_model_a

from fvlib import TreePrior
from fvlib.experiments.beside_theory import (
    baseline_predictor,
    compare_with_theory,
    gap_record,
    gap_table,
    greedy_paired,
)
from fvlib.models import FVTransformer
from fvlib.stats import paired_ratio
from fvlib.training import EVAL_SEED_OFFSET, TrainConfig, train
from fvlib.training.evaluate import (
    model_predictor,
    per_context_errors,
    sample_eval_batches,
)

pytestmark = pytest.mark.usefixtures("one_thread")



def test_gap_table_rows():
    _, model, _ = untrained_model_a(budget=2)
    config = TrainConfig(depth=3, budget=2, n_ctx=64, noise_std=0.1, steps=1)
    table = gap_table(model, config, contexts=600, seed=1)
    for row in ("adaptive_greedy", "nonadaptive_opt", "adaptive_opt", "model", "router_bayes",
                "adaptive_greedy_paired", "adaptive_opt_paired"):
        mean, stderr = table[row]
        assert 0 <= mean and 0 <= stderr < mean
    # the paired rows: the same policies on other contexts (the model rows'), so other numbers
    # that agree within Monte Carlo error
    for row in ("adaptive_greedy", "adaptive_opt"):
        (m1, s1), (m2, s2) = table[row], table[row + "_paired"]
        assert m1 != m2 and abs(m1 - m2) < 4 * (s1**2 + s2**2) ** 0.5, row
    if table["adaptive_opt_kind"] == "greedy":
        assert table["adaptive_opt_paired"] == table["adaptive_greedy_paired"]
    best = min(table["adaptive_greedy"][0], table["nonadaptive_opt"][0])
    assert table["adaptive_opt"][0] <= best + 3 * max(table["adaptive_greedy"][1], table["nonadaptive_opt"][1])
    assert table["adaptive_opt_kind"] in ("learned", "greedy", "nonadaptive_opt")
    with pytest.raises(ValueError, match="tree"):
        gap_table(model, TrainConfig(prior="gaussian-twin", depth=3, budget=2), contexts=10)


@pytest.mark.slow  # Monte Carlo over the gap table (about 20 s)
def test_gap_table_others_share_the_contexts():
    """A second model decoded on the same contexts: its rows equal the table of that model alone."""
    _, model, _ = untrained_model_a(budget=2)
    other = FVTransformer(model.config)
    other.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():   # another model: every weight moved (the decoder's last layer too)
        for p in other.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    config = TrainConfig(depth=3, budget=2, n_ctx=64, noise_std=0.1, steps=1)
    both = gap_table(model, config, contexts=300, seed=2, others={"new": other})
    alone = gap_table(other, config, contexts=300, seed=2)
    assert both["new"] == alone["model"] and both["new_router_bayes"] == alone["router_bayes"]
    assert both["model"] != both["new"]
    for bad in ("model", "adaptive_greedy", 3):
        with pytest.raises(ValueError, match="others"):
            gap_table(model, config, contexts=50, others={bad: other})


def test_paired_ratio():
    from fvlib.stats import paired_ratio

    gen = torch.Generator().manual_seed(0)
    b = torch.rand(5000, generator=gen, dtype=torch.float64) ** 4   # a heavy-ish tail
    assert paired_ratio(b, b) == (1.0, 0.0)
    ratio, stderr = paired_ratio(2 * b, b)
    assert ratio == pytest.approx(2.0) and stderr == pytest.approx(0.0, abs=1e-12)
    # correlated pairs: a far smaller error than the two means' own errors suggest
    a = 1.3 * b + 0.01 * torch.rand(5000, generator=gen, dtype=torch.float64)
    ratio, stderr = paired_ratio(a, b)
    unpaired = ratio * ((a.std() / a.mean()) ** 2 + (b.std() / b.mean()) ** 2).sqrt() / 5000**0.5
    assert abs(ratio - 1.3 - 0.005 / b.mean()) < 0.01 and 0 < stderr < 0.2 * unpaired
    # against resampling: the spread of the ratio over independent halves
    halves = [paired_ratio(a[i::10], b[i::10])[0] for i in range(10)]
    assert torch.tensor(halves).std() / 10**0.5 == pytest.approx(stderr, rel=0.6)
    with pytest.raises(ValueError, match="same n"):
        paired_ratio(a, b[:10])


def test_gap_table_ratios_are_paired():
    _, model, _ = untrained_model_a(budget=2)
    config = TrainConfig(depth=3, budget=2, n_ctx=64, noise_std=0.1, steps=1)
    table = gap_table(model, config, contexts=600, seed=1)
    best = table[table["best_paired"]][0]
    assert best == min(table["adaptive_greedy_paired"][0], table["adaptive_opt_paired"][0])
    for row in ("model", "router_bayes"):
        ratio, stderr = table["ratios"][row]
        assert ratio == pytest.approx(table[row][0] / best) and 0 < stderr < ratio


def test_greedy_paired_is_on_the_evaluate_contexts():
    from fvlib.training import evaluate
    tree, model, _ = untrained_model_a(budget=2)
    config = TrainConfig(depth=3, budget=2, n_ctx=64, noise_std=0.1, steps=1)
    out = greedy_paired(model, config, contexts=700, seed=4)
    ev = evaluate(model, tree, 64, 0.1, contexts=700, seed=4)
    assert out["contexts"] == 700
    assert out["model_loss"] == pytest.approx(ev["excess_loss"], rel=1e-12)
    assert out["model_stderr"] == pytest.approx(ev["stderr"], rel=1e-12)
    assert out["ratio"] == pytest.approx(out["model_loss"] / out["greedy_loss"], rel=1e-9)
    # the untrained model predicts 0 (loss E|theta|^2), far above greedy with two reads
    assert out["ratio"] > 2 and out["ratio_stderr"] > 0
    # another seed: other contexts, so another greedy loss
    assert greedy_paired(model, config, contexts=700, seed=5)["greedy_loss"] != out["greedy_loss"]
    with pytest.raises(ValueError, match="tree"):
        greedy_paired(model, TrainConfig(depth=3, budget=2, prior="gaussian-twin", steps=1),
                      contexts=10, seed=0)
    with pytest.raises(ValueError):
        greedy_paired(model, config, contexts=1, seed=0)


def test_greedy_paired_takes_a_standard_transformer():
    """A standard transformer predicts y at its query tokens, not theta_hat: its paired loss is
    evaluate()'s (the query error against <theta, x_q>), beside greedy on the same contexts."""
    from fvlib.training import build_model, evaluate
    config = TrainConfig(arch="transformer", model="A", depth=3, budget=2, n_ctx=16, noise_std=0.0, steps=1,
                         width=16)
    model = build_model(config)
    tree = TreePrior(3, config.alpha)
    out = greedy_paired(model, config, contexts=300, seed=4)
    ev = evaluate(model, tree, 16, 0.0, contexts=300, seed=4)
    assert out["contexts"] == 300 and out["model_loss"] == pytest.approx(ev["excess_loss"], rel=1e-12)
    assert out["ratio"] == pytest.approx(out["model_loss"] / out["greedy_loss"], rel=1e-9)


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


def test_greedy_paired_defaults_to_the_runs_own_evaluation_set():
    _, model, _ = untrained_model_a(budget=2)
    config = TrainConfig(depth=3, budget=2, n_ctx=64, noise_std=0.1, steps=1, eval_contexts=200, data_seed=3)
    explicit = greedy_paired(model, config, contexts=200, seed=3 + EVAL_SEED_OFFSET)
    assert greedy_paired(model, config) == explicit


def test_gap_record_is_the_gap_table_as_lists():
    _, model, _ = untrained_model_a(budget=2)
    config = TrainConfig(depth=3, budget=2, n_ctx=64, noise_std=0.1, steps=1)
    table = gap_table(model, config, contexts=200, seed=1)
    record = gap_record(model, config, contexts=200, seed=1)
    assert record["rows"]["model"] == list(table["model"]) and record["seed"] == 1
    assert record["ratios"] == {k: list(v) for k, v in table["ratios"].items()}
    assert {k: record[k] for k in ("best_paired", "adaptive_opt_kind", "contexts")} == {
        k: table[k] for k in ("best_paired", "adaptive_opt_kind", "contexts")}
    assert set(record["rows"]) == {k for k, v in table.items() if isinstance(v, tuple)}
