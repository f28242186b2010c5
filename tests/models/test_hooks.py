"""fvlib.hooks: one ``hook_name`` for every model family, and the input checks the families share."""

import pytest
import torch

from fvlib import make_generator, make_prior, sample_task
from fvlib.hooks import FAMILIES, LAYER_HOOKS, MODEL_HOOKS, hook_name
from fvlib.models import make_model
from fvlib.transformer import make_transformer

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

PRIOR = make_prior("tree", 3, 0.5)  # D = 7


def build(family: str, budget: int = 2):
    if family == "constrained":
        return make_model("A", PRIOR, budget, width=8)
    return make_transformer("A", PRIOR, budget, family, d_model=8, head_dim=4)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_hook_of_every_family_is_named_by_hook_name(family):
    model = build(family)
    layer_kinds = [kind for kind, families in LAYER_HOOKS.items() if family in families]
    model_kinds = [kind for kind, families in MODEL_HOOKS.items() if family in families]
    expected = [hook_name(kind, l) for l in (1, 2) for kind in layer_kinds] + [hook_name(k) for k in model_kinds]
    assert sorted(model.hook_names()) == sorted(expected)


def test_hook_name_names_the_bad_value():
    assert hook_name("pattern", "*") == "blocks.*.hook_pattern"
    with pytest.raises(ValueError, match="'nope'"):
        hook_name("nope", 1)
    with pytest.raises(ValueError, match="whole model.*layer=1"):
        hook_name("theta_hat", 1)
    with pytest.raises(ValueError, match="layer"):
        hook_name("workspace", 0)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_families_check_their_inputs_alike(family):
    model = build(family)
    batch = sample_task(PRIOR, 4, 6, 0.0, make_generator(0))
    assert model(batch).shape == (4,)
    torch.testing.assert_close(model(batch), model(batch.x, batch.y, batch.x_query))
    with pytest.raises(ValueError, match=r"x must have shape \(B, N, 7\)"):
        model(batch.x[..., :3], batch.y, batch.x_query)
    with pytest.raises(ValueError, match="not both"):
        model(batch, batch.y)
    with pytest.raises(ValueError, match="TaskBatch or all of"):
        model(batch.x, batch.y)
