"""What the gated router of a trained model measures (fvlib.interventions.router): its rows
reproduce the workspace, the exact Bayes decoder given them, the alignment with a theory policy,
and where each layer puts its measurement weight."""

import pytest
import torch
from conftest import untrained_model_a

from fvlib import TreePrior, make_generator, sample_task
from fvlib.interventions import (
    measurement_profile,
    router_bayes_decode,
    router_directions,
    router_policy_alignment,
)
from fvlib.models import FVTransformer, model_config
from fvlib.theory.adaptive_opt import FixedRows, GreedyRule

pytestmark = pytest.mark.usefixtures("one_thread")


def test_router_rows_reproduce_the_workspace():
    tree, model, batch = untrained_model_a()
    rows = router_directions(model, batch)
    assert rows.shape == (batch.batch_size, 3, tree.dim)
    _, cache = model.run_with_cache(batch, names_filter="blocks.3.hook_workspace")
    readings = torch.einsum("bmd,bd->bm", rows, batch.to("cpu", torch.float64).sufficient_statistic())
    assert torch.allclose(readings, cache["blocks.3.hook_workspace"].double(), atol=1e-4)


def test_bayes_decoder_beats_an_untrained_decoder():
    # the untrained decoder outputs 0 (its last layer starts at zero): loss = E|theta|^2
    tree, model, batch = untrained_model_a()
    out = router_bayes_decode(model, tree, batch)
    assert out["contexts"] == batch.batch_size
    assert out["model"][0] == pytest.approx(tree.energy, rel=1e-6)
    assert out["router_bayes"][0] < 0.8 * out["model"][0]


def test_router_directions_need_keys_linear_in_the_token():
    tree = TreePrior(3, 0.5)
    config = model_config("A", tree, 2)
    model = FVTransformer(type(config)(**{**config.to_dict(), "router": "mlp"}))
    batch = sample_task(tree, 8, 16, 0.0, make_generator(0))
    with pytest.raises(ValueError, match="linear in the token"):
        router_directions(model, batch)


def test_router_directions_of_a_coord_router_are_the_coordinates_it_measures():
    tree = TreePrior(3, 0.5)
    model = FVTransformer(model_config("A", tree, 3, router="coord"))
    batch = sample_task(tree, 8, 16, 0.0, make_generator(0))
    rows = router_directions(model, batch)  # (B, L d, D)
    assert torch.equal((rows != 0).sum(-1), torch.ones(rows.shape[:2], dtype=torch.long))  # one node a row
    scale = rows.abs().sum(-1)
    assert torch.equal(scale, scale.flatten()[0].expand_as(scale))  # the same scale in every row


def test_alignment_with_the_routers_own_rows():
    """An untrained router's first rows are fixed: a FixedRows policy of exactly those rows aligns
    perfectly at layer 1; the greedy rule (coordinates) aligns with a generic row only in part."""
    tree, model, batch = untrained_model_a(budget=3, contexts=64)
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


def test_measurement_profile_rows_are_fractions_of_the_weight():
    tree, model, batch = untrained_model_a(budget=3, contexts=64)
    profile = measurement_profile(model, tree, batch)
    assert profile.shape == (3, tree.depth + 1) and (profile >= 0).all()
    assert profile.sum(1) == pytest.approx([1.0, 1.0, 1.0])
    config = model_config("A", tree, 2)
    mlp = FVTransformer(type(config)(**{**config.to_dict(), "router": "mlp"}))
    with pytest.raises(ValueError, match="linear in the token"):
        measurement_profile(mlp, tree, batch)
