"""Models A, B, C: shapes, hook points, caches and interventions (fvlib.models)."""

import json

import pytest
import torch

from fvlib import make_generator, make_prior, sample_task
from fvlib.hooks import ActivationCache, hook_name
from fvlib.models import (
    FVTransformer,
    ModelConfig,
    make_model,
    model_a,
    model_b,
    model_c,
)
from fvlib.routers import measure

K, M, N, B = 3, 3, 16, 5
D = 2**K - 1


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def batch():
    return sample_task(make_prior("tree", K, 0.5), B, N, 0.1, make_generator(0))


def seeded_model(kind: str, seed: int = 0, **kwargs) -> FVTransformer:
    torch.manual_seed(seed)
    model = make_model(kind, D, M, width=16, **kwargs)
    randomise_zero_inits(model)
    return model


def randomise_zero_inits(model: FVTransformer) -> None:
    """Output layers start at zero; give them weights so every path carries signal."""
    with torch.no_grad():
        for param in model.parameters():
            if torch.all(param == 0):
                param.normal_(0, 0.3)


def expected_shapes(model: FVTransformer) -> dict:
    d = model.config.channels
    shapes = {}
    for l in range(1, model.config.n_layers + 1):
        shapes[f"blocks.{l}.hook_keys"] = (B, N, d)
        shapes[f"blocks.{l}.hook_phi"] = (B, d)
        shapes[f"blocks.{l}.hook_workspace"] = (B, l * d)
    shapes["hook_theta_hat"] = (B, D)
    shapes["hook_prediction"] = (B,)
    return shapes


# ----- configuration ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind, layers, channels, router, decoder",
    [("A", M, 1, "gated", "mlp"), ("B", 1, M, "gated", "mlp"), ("C", 1, M, "linear", "linear")],
)
def test_factories_follow_the_design(kind, layers, channels, router, decoder):
    config = make_model(kind, D, M).config
    assert (config.n_layers, config.channels, config.router, config.decoder) == (
        layers,
        channels,
        router,
        decoder,
    )
    assert config.budget == M


def test_factories_accept_a_prior():
    prior = make_prior("tree", K, 0.5)
    assert model_a(prior, M).config.dim == D
    assert model_b(prior, M).config.dim == D
    assert model_c(prior, M).config.dim == D


def test_config_json_round_trip():
    config = ModelConfig(
        dim=D, n_layers=2, channels=3, router="mlp", decoder="linear", width=8, hidden_layers=1
    )
    assert ModelConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


@pytest.mark.parametrize(
    "kwargs, bad",
    [
        (dict(dim=0), "0"),
        (dict(n_layers=-1), "-1"),
        (dict(channels=1.5), "1.5"),
        (dict(router="softmax"), "softmax"),
        (dict(decoder="attention"), "attention"),
        (dict(width=0), "0"),
        (dict(hidden_layers=True), "True"),
    ],
)
def test_bad_config_raises_naming_the_value(kwargs, bad):
    base = dict(dim=D, n_layers=2, channels=1)
    with pytest.raises(ValueError, match=bad):
        ModelConfig(**{**base, **kwargs})


def test_bad_factory_arguments():
    with pytest.raises(ValueError, match="'Z'"):
        make_model("Z", D, M)
    with pytest.raises(ValueError, match="budget"):
        make_model("A", D, 0)
    with pytest.raises(ValueError, match="dim"):
        make_model("B", -3, M)
    with pytest.raises(ValueError, match="unknown model config keys"):
        ModelConfig.from_dict({"dim": 3, "n_layers": 1, "channels": 1, "heads": 2})


# ----- forward ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["A", "B", "C"])
def test_forward_shapes_and_readout(kind, batch):
    model = seeded_model(kind)
    y_hat = model(batch)
    theta_hat = model.predict_theta(batch)
    assert y_hat.shape == (B,) and theta_hat.shape == (B, D)
    torch.testing.assert_close(y_hat, (theta_hat * batch.x_query).sum(-1))
    torch.testing.assert_close(model(batch.x, batch.y, batch.x_query), y_hat, rtol=0, atol=0)


def test_several_query_tokens(batch):
    model = seeded_model("A")
    x_query = torch.randn(B, 4, D)
    y_hat = model(batch.x, batch.y, x_query)
    assert y_hat.shape == (B, 4)
    torch.testing.assert_close(y_hat, torch.einsum("bd,bqd->bq", model.predict_theta(batch), x_query))


def test_bad_inputs_raise(batch):
    model = seeded_model("A")
    with pytest.raises(ValueError, match="x must have shape"):
        model(batch.x[..., :-1], batch.y, batch.x_query)
    with pytest.raises(ValueError, match="y must have shape"):
        model(batch.x, batch.y[:, :-1], batch.x_query)
    with pytest.raises(ValueError, match="x_query"):
        model(batch.x, batch.y, batch.x_query[:-1])
    with pytest.raises(ValueError, match="TaskBatch"):
        model(batch.x)


def test_untrained_decoder_predicts_zero(batch):
    torch.manual_seed(0)
    for kind in "ABC":
        assert torch.all(make_model(kind, D, M)(batch) == 0)


def test_model_b_router_is_a_constant_matrix(batch):
    model = seeded_model("B")
    _, cache = model.run_with_cache(batch)
    base = model.block(1).router.base  # (M, D): the optimised non-adaptive directions
    torch.testing.assert_close(cache["blocks.1.hook_keys"], batch.x @ base.T)


def test_gated_router_of_model_a_depends_on_the_workspace(batch):
    model = seeded_model("A")
    _, clean = model.run_with_cache(batch)
    shifted = clean["blocks.1.hook_phi"] + 1.0
    with model.hooks([("blocks.1.hook_phi", lambda t, hook: t + 1.0)]):
        _, patched = model.run_with_cache(batch)
    torch.testing.assert_close(patched["blocks.1.hook_phi"], shifted)
    torch.testing.assert_close(patched["blocks.1.hook_keys"], clean["blocks.1.hook_keys"])
    assert not torch.allclose(patched["blocks.2.hook_keys"], clean["blocks.2.hook_keys"])


def test_mlp_router_runs(batch):
    torch.manual_seed(0)
    model = FVTransformer(ModelConfig(dim=D, n_layers=2, channels=2, router="mlp", width=8))
    randomise_zero_inits(model)
    _, cache = model.run_with_cache(batch)
    assert cache["blocks.2.hook_keys"].shape == (B, N, 2)
    assert cache["blocks.2.hook_workspace"].shape == (B, 4)


# ----- hooks and caches -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["A", "B", "C"])
def test_hook_names_and_cache_shapes(kind, batch):
    model = seeded_model(kind)
    shapes = expected_shapes(model)
    assert model.hook_names() == list(shapes)
    y_hat, cache = model.run_with_cache(batch)
    assert isinstance(cache, ActivationCache)
    assert {name: tuple(t.shape) for name, t in cache.items()} == shapes
    torch.testing.assert_close(cache["hook_prediction"], y_hat, rtol=0, atol=0)


def test_cache_is_consistent_with_the_math(batch):
    model = seeded_model("A")
    _, cache = model.run_with_cache(batch)
    phis = []
    for l in range(1, M + 1):
        keys, phi = cache[f"blocks.{l}.hook_keys"], cache[f"blocks.{l}.hook_phi"]
        torch.testing.assert_close(phi, (keys * batch.y[..., None]).mean(1))
        phis.append(phi)
        torch.testing.assert_close(cache[f"blocks.{l}.hook_workspace"], torch.cat(phis, -1))
    torch.testing.assert_close(cache["hook_theta_hat"], model.predict_theta(batch))


def test_names_filter(batch):
    model = seeded_model("A")
    _, cache = model.run_with_cache(batch, names_filter="blocks.*.hook_phi")
    assert list(cache) == [f"blocks.{l}.hook_phi" for l in range(1, M + 1)]
    _, cache = model.run_with_cache(batch, names_filter=["hook_theta_hat", "blocks.2.hook_keys"])
    assert set(cache) == {"hook_theta_hat", "blocks.2.hook_keys"}
    _, cache = model.run_with_cache(batch, names_filter=lambda name: name.endswith("workspace"))
    assert len(cache) == M
    with pytest.raises(ValueError, match="matches no hook"):
        model.run_with_cache(batch, names_filter="blocks.9.*")
    with pytest.raises(KeyError, match="not in the cache"):
        cache["hook_prediction"]


@pytest.mark.parametrize("kind", ["A", "B", "C"])
def test_hooks_returning_none_change_nothing(kind, batch):
    model = seeded_model(kind)
    clean = model(batch)
    seen = []
    hooks = [(name, lambda t, hook: seen.append(hook.name)) for name in model.hook_names()]
    hooked = model.run_with_hooks(batch, fwd_hooks=hooks)
    assert torch.equal(hooked, clean)
    assert seen == model.hook_names()


@pytest.mark.parametrize(
    "name", ["blocks.1.hook_keys", "blocks.2.hook_phi", "blocks.3.hook_workspace", "hook_theta_hat"]
)
def test_replacing_an_activation_changes_the_output(name, batch):
    model = seeded_model("A")
    clean = model(batch)
    patched = model.run_with_hooks(batch, fwd_hooks=[(name, lambda t, hook: t + 0.5)])
    assert not torch.allclose(patched, clean)
    assert torch.equal(model(batch), clean)  # hooks are gone afterwards


def test_replacing_the_prediction(batch):
    model = seeded_model("C")
    out = model.run_with_hooks(batch, fwd_hooks=[("hook_prediction", lambda t, hook: torch.zeros_like(t))])
    assert torch.all(out == 0)


def test_hooks_context_manager_cleans_up_after_errors(batch):
    model = seeded_model("A")
    clean = model(batch)
    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks([("hook_theta_hat", lambda t, hook: t * 0)]):
            raise RuntimeError("boom")
    assert torch.equal(model(batch), clean)


def test_unknown_hook_names_raise(batch):
    model = seeded_model("B")
    with pytest.raises(ValueError, match="blocks.2.hook_keys"):
        model.run_with_hooks(batch, fwd_hooks=[("blocks.2.hook_keys", lambda t, hook: None)])
    with pytest.raises(ValueError, match="hook_nope"):
        with model.hooks([("hook_nope", lambda t, hook: None)]):
            pass


def test_hook_with_wrong_shape_raises(batch):
    model = seeded_model("A")
    with pytest.raises(ValueError, match="blocks.1.hook_phi"):
        model.run_with_hooks(batch, fwd_hooks=[("blocks.1.hook_phi", lambda t, hook: t[:, :0])])


def test_cache_can_keep_the_graph(batch):
    model = seeded_model("A")
    _, cache = model.run_with_cache(batch, names_filter="hook_theta_hat", detach=False)
    cache["hook_theta_hat"].sum().backward()
    assert model.decoder[-1].weight.grad is not None


def test_block_numbering_is_one_based():
    model = seeded_model("A")
    assert model.block(1) is model.blocks["1"]
    assert model.block(1).hook_keys.name == "blocks.1.hook_keys"
    with pytest.raises(ValueError, match="layer"):
        model.block(0)


def test_hook_names_come_from_one_helper():
    model = seeded_model("A")
    kinds = ("keys", "phi", "workspace")
    layers = [hook_name(kind, l) for l in range(1, M + 1) for kind in kinds]
    assert model.hook_names() == layers + [hook_name("theta_hat"), hook_name("prediction")]
    assert hook_name("keys", 2) == "blocks.2.hook_keys" and hook_name("phi", "*") == "blocks.*.hook_phi"
    for kind, layer in (("keys", 0), ("keys", None), ("theta_hat", 1), ("nope", 1)):
        with pytest.raises(ValueError, match=repr(kind if kind == "nope" else layer)):
            hook_name(kind, layer)


def test_a_hook_handle_removes_exactly_its_hook(batch):
    model = seeded_model("A")
    clean = model(batch)
    shift = lambda t, hook: t + 0.5  # noqa: E731
    point = model.block(1).hook_phi
    first, second = point.add_hook(shift), point.add_hook(shift)  # the same function twice
    twice = model(batch)
    first.remove()
    once = model.run_with_hooks(batch, fwd_hooks=[])
    with model.hooks([("blocks.1.hook_phi", shift)]):
        assert torch.equal(model(batch), twice)
    assert torch.equal(model(batch), once)  # the context manager took out only its own hook
    second.remove()
    second.remove()  # removing again does nothing
    assert torch.equal(model(batch), clean) and not torch.equal(once, clean)


# ----- measure: the model's one contraction with its inputs ---------------------------------
def _grads(fn, tokens, directions, grad_out, needs=(True, True)):
    tokens = tokens.detach().clone().requires_grad_(needs[0])
    directions = directions.detach().clone().requires_grad_(needs[1])
    out = fn(tokens, directions)
    inputs = [t for t in (tokens, directions) if t.requires_grad]
    return out, torch.autograd.grad(out, inputs, grad_out)


PLAIN = {2: lambda t, d: t @ d.T, 3: lambda t, d: torch.bmm(t, d.transpose(1, 2))}


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("needs", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("channels", [1, 4])
def test_measure_is_bitwise_the_plain_expression(ndim, needs, channels):
    generator = torch.Generator().manual_seed(channels)
    tokens = torch.randn(6, 33, D, generator=generator)
    directions = torch.randn(*((6,) if ndim == 3 else ()), channels, D, generator=generator)
    grad_out = torch.randn(6, channels, 33, generator=generator).transpose(1, 2)  # not contiguous
    out, grads = _grads(measure, tokens, directions, grad_out, needs)
    ref, ref_grads = _grads(PLAIN[ndim], tokens, directions, grad_out, needs)
    assert torch.equal(out, ref)
    assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads, strict=True))


def test_measure_pools_and_predicts_like_einsum():
    generator = torch.Generator().manual_seed(1)
    keys, y = torch.randn(5, 16, 3, generator=generator), torch.randn(5, 16, generator=generator)
    pooled = measure(y[:, None, :], keys.transpose(1, 2))[:, 0]
    assert torch.equal(pooled, torch.einsum("bnc,bn->bc", keys, y))
    theta, x_query = torch.randn(5, D, generator=generator), torch.randn(5, 4, D, generator=generator)
    assert torch.equal(measure(theta[:, None, :], x_query)[:, 0], torch.einsum("bd,bqd->bq", theta, x_query))


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("in_dims", [(None, 0), (0, None), (0, 0), (1, 0)])
def test_measure_under_vmap_equals_a_loop(ndim, in_dims):
    """Every batching case of the vmap rule, values and gradients, against one call per model."""
    k, generator = 3, torch.Generator().manual_seed(2)
    t_shape, d_shape = (4, 9, D), ((4,) if ndim == 3 else ()) + (2, D)

    def stacked(shape, dim):
        if dim is None:
            return torch.randn(shape, generator=generator, dtype=torch.float64)
        return torch.randn(k, *shape, generator=generator, dtype=torch.float64).movedim(0, dim)

    tokens = stacked(t_shape, in_dims[0]).requires_grad_()
    directions = stacked(d_shape, in_dims[1]).requires_grad_()
    out = torch.func.vmap(measure, in_dims=in_dims)(tokens, directions)
    pick = lambda t, dim, i: t if dim is None else t.select(dim, i)  # noqa: E731
    loop = torch.stack([measure(pick(tokens, in_dims[0], i), pick(directions, in_dims[1], i)) for i in range(k)])
    torch.testing.assert_close(out, loop)
    weights = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    grads = torch.autograd.grad((out * weights).sum(), (tokens, directions))
    loop_grads = torch.autograd.grad((loop * weights).sum(), (tokens, directions))
    for grad, ref in zip(grads, loop_grads):
        torch.testing.assert_close(grad, ref)
