"""Which half of model A falls short: its router with the exact Bayes decoder (chapter 8)."""

import pytest
import torch

from fvlib import TreePrior, make_generator, sample_task
from fvlib.experiments import gap_table, router_bayes_decode, router_directions, router_policy_alignment
from fvlib.theory.adaptive_opt import FixedRows, GreedyRule
from fvlib.models import FVTransformer, model_a, model_config
from fvlib.train import TrainConfig


def _model_and_batch(budget=3, contexts=300, seed=0):
    torch.manual_seed(seed)
    tree = TreePrior(3, 0.5)
    model = model_a(tree, budget, width=16)
    batch = sample_task(tree, contexts, 64, 0.1, make_generator(seed))
    return tree, model, batch


def test_router_rows_reproduce_the_workspace():
    tree, model, batch = _model_and_batch()
    rows = router_directions(model, batch)
    assert rows.shape == (batch.batch_size, 3, tree.dim)
    _, cache = model.run_with_cache(batch, names_filter="blocks.3.hook_workspace")
    readings = torch.einsum("bmd,bd->bm", rows, batch.to("cpu", torch.float64).sufficient_statistic())
    assert torch.allclose(readings, cache["blocks.3.hook_workspace"].double(), atol=1e-4)


def test_bayes_decoder_beats_an_untrained_decoder():
    # the untrained decoder outputs 0 (its last layer starts at zero): loss = E|theta|^2
    tree, model, batch = _model_and_batch()
    out = router_bayes_decode(model, tree, batch)
    assert out["contexts"] == batch.batch_size
    assert out["model"][0] == pytest.approx(tree.energy, rel=1e-6)
    assert out["router_bayes"][0] < 0.8 * out["model"][0]


def test_router_directions_need_a_gated_router():
    tree = TreePrior(3, 0.5)
    config = model_config("A", tree, 2)
    model = FVTransformer(type(config)(**{**config.to_dict(), "router": "linear"}))
    batch = sample_task(tree, 8, 16, 0.0, make_generator(0))
    with pytest.raises(ValueError, match="gated"):
        router_directions(model, batch)


def test_gap_table_rows():
    tree, model, _ = _model_and_batch(budget=2)
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
    tree, model, _ = _model_and_batch(budget=2)
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


def test_alignment_with_the_routers_own_rows():
    """An untrained router's first rows are fixed: a FixedRows policy of exactly those rows aligns
    perfectly at layer 1; the greedy rule (coordinates) aligns with a generic row only in part."""
    tree, model, batch = _model_and_batch(budget=3, contexts=64)
    rows = router_directions(model, batch)
    own = FixedRows(rows[0] / rows[0].norm(dim=-1, keepdim=True))
    align = router_policy_alignment(model, tree, batch, own)
    assert align.shape == (3,) and align[0] == pytest.approx(1.0, abs=1e-6)
    assert ((0 <= align) & (align <= 1 + 1e-9)).all()
    greedy = router_policy_alignment(model, tree, batch, GreedyRule(tree))
    assert greedy[0] < 0.99
    wide = FVTransformer(model_config("B", tree, 3))
    with pytest.raises(ValueError, match="channel"):
        router_policy_alignment(wide, tree, batch, own)


def test_paired_ratio():
    from fvlib.experiments import paired_ratio

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
    tree, model, _ = _model_and_batch(budget=2)
    config = TrainConfig(depth=3, budget=2, n_ctx=64, noise_std=0.1, steps=1)
    table = gap_table(model, config, contexts=600, seed=1)
    best = table[table["best_paired"]][0]
    assert best == min(table["adaptive_greedy_paired"][0], table["adaptive_opt_paired"][0])
    for row in ("model", "router_bayes"):
        ratio, stderr = table["ratios"][row]
        assert ratio == pytest.approx(table[row][0] / best) and 0 < stderr < ratio
