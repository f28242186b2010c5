"""Model A's routers (fvlib.routers, issue 42): gated, linear, bilinear and coord on the grid
K = 3..8, M = 1..K (tokens and statistic alike), model A with the linear router is model B's
function class, stacked training of the new routers, the coord router's one-hot keys, and the
``train --router`` flag with its refusals."""

import dataclasses
import json

import pytest
import torch

from fvlib import make_generator, make_prior, sample_task
from fvlib.cli import main
from fvlib.hooks import hook_name
from fvlib.interventions import key_patching_sweep
from fvlib.models import model_a, model_b
from fvlib.routers import (
    MODEL_A_ROUTERS,
    BilinearRouter,
    CoordRouter,
    GatedRouter,
    LinearRouter,
    training_progress,
)
from fvlib.theory import theory_baselines
from fvlib.training import TrainConfig, load_run, run_dir_for, train, train_many

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

ROUTER_CLASSES = {"gated": GatedRouter, "linear": LinearRouter, "bilinear": BilinearRouter, "coord": CoordRouter}
GRID = [(K, M) for K in range(3, 9) for M in range(1, K + 1)]


def _randomised(model, scale: float = 0.3, seed: int = 0):
    """``model`` with every parameter moved off its start (the zero starts of the MLPs' last
    layers and of the bilinear interaction included), so every path carries signal."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator))
    return model


def _contexts(K: int, B: int = 3, N: int = 8, seed: int = 0):
    return sample_task(make_prior("tree", K, 0.5), B, N, 0.1, make_generator(seed))


@pytest.mark.parametrize("router", MODEL_A_ROUTERS)
def test_every_router_builds_and_runs_on_tokens_and_statistic_over_the_grid(router):
    """K = 3..8, M = 1..K: model A with ``router`` reads only the statistic, and its predictions
    from the tokens and from their pooled statistic agree to float rounding."""
    for K, M in GRID:
        torch.manual_seed(K * 10 + M)
        model = _randomised(model_a(2**K - 1, M, width=8, hidden_layers=1, router=router), seed=K * 10 + M)
        batch = _contexts(K, seed=M)
        on_tokens, cache = model.run_with_cache(batch)
        on_statistic = model(batch.pooled())
        assert model.reads_statistic and isinstance(model.block(M).router, ROUTER_CLASSES[router])
        assert cache[hook_name("keys", M)].shape == (3, 8, 1) and cache[hook_name("workspace", M)].shape == (3, M)
        torch.testing.assert_close(on_statistic, on_tokens, rtol=1e-4, atol=1e-5, msg=f"K={K}, M={M}")


@pytest.mark.parametrize("router, adaptive", [("gated", True), ("linear", False), ("bilinear", True),
                                              ("coord", True)])
def test_layer_two_keys_depend_on_the_workspace_unless_the_router_is_linear(router, adaptive):
    torch.manual_seed(0)
    model = _randomised(model_a(15, 3, width=8, router=router), scale=1.0)
    batch = _contexts(4, B=64)
    _, clean = model.run_with_cache(batch)
    with model.hooks([(hook_name("phi", 1), lambda t, hook: t + 3.0 * torch.randn_like(t))]):
        _, shifted = model.run_with_cache(batch)
    changed = not torch.equal(clean[hook_name("keys", 2)], shifted[hook_name("keys", 2)])
    assert changed == adaptive


@pytest.mark.parametrize("K, M", [(3, 1), (3, 3), (4, 2), (5, 5), (6, 6), (7, 3)])
def test_model_a_with_the_linear_router_is_model_b(K, M):
    """``decoder(W g)`` with ``W (M, D)``: model B's rows copied into the ``M`` layers of an
    A-linear, with its decoder, give B's predictions to float precision (float64 here)."""
    torch.manual_seed(K + M)
    b = _randomised(model_b(2**K - 1, M, width=16), seed=1).double()
    a = model_a(2**K - 1, M, width=16, router="linear").double()
    assert a.config.n_layers == M and a.config.channels == 1
    with torch.no_grad():
        for layer in range(1, M + 1):
            a.block(layer).router.weight.copy_(b.block(1).router.base[layer - 1:layer])
    a.decoder.load_state_dict(b.decoder.state_dict())
    batch = _contexts(K, B=20, N=16, seed=K)
    torch.testing.assert_close(a(batch.pooled()), b(batch.pooled()), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a.predict_theta(batch), b.predict_theta(batch), rtol=1e-12, atol=1e-12)


def _coord_model(K: int = 4, M: int = 4):
    torch.manual_seed(1)
    return _randomised(model_a(2**K - 1, M, width=8, router="coord"), scale=1.0).eval()


def test_coord_keys_are_one_coordinate_of_the_token_and_the_node_depends_on_the_context():
    model = _coord_model()
    batch = _contexts(4, B=64)
    _, cache = model.run_with_cache(batch)
    for layer in range(1, 5):
        previous = cache[hook_name("workspace", layer - 1)] if layer > 1 else batch.x.new_zeros(64, 0).float()
        router = model.block(layer).router
        nodes = router.nodes(previous)  # (B, 1)
        chosen = torch.gather(batch.x.float(), 2, nodes[:, None, :].expand(-1, 8, -1))  # (B, N, 1)
        torch.testing.assert_close(cache[hook_name("keys", layer)], 15**0.5 * chosen, rtol=1e-6, atol=0)
        matrix = router.matrix(previous)
        assert torch.equal(matrix != 0, torch.nn.functional.one_hot(nodes, 15).bool())
    assert len(set(model.block(2).router.nodes(cache[hook_name("workspace", 1)])[:, 0].tolist())) > 1


def test_coord_router_measures_a_mixture_in_its_soft_phase_and_one_node_after_it():
    """``training_progress`` drives the schedule: every node weighted at the start, one node in
    the last fifth of training, and one node again once the training step is over."""
    router = _randomised(CoordRouter(15, 1, 2, width=8, hidden_layers=1), seed=3)
    workspace = torch.randn(6, 2, generator=torch.Generator().manual_seed(0))
    buffers = list(router.named_buffers())
    with training_progress(buffers, 0.0):
        start = router.directions(workspace)
    with training_progress(buffers, 0.9):
        late = router.directions(workspace)
    after = router.directions(workspace)
    assert (start > 0).all() and (start < start.amax(-1, keepdim=True)).sum(-1).min() == 14
    for matrix in (late, after):
        assert torch.equal(matrix != 0, torch.nn.functional.one_hot(router.nodes(workspace), 15).bool())


def test_key_patching_runs_unchanged_on_the_coord_router():
    """Key patching reads the coord router's hooks as the gated router's: at layer 1 the patch is
    the identity, and the sweep on the tokens is the sweep on the statistic."""
    model = _coord_model(K=3, M=3).double()
    tree = make_prior("tree", 3, 0.5)
    tokens = key_patching_sweep(model, tree, 16, 0.0, contexts=20, seed=0, statistic=False)
    statistic = key_patching_sweep(model, tree, 16, 0.0, contexts=20, seed=0, statistic=True)
    torch.testing.assert_close(tokens.loss[:, 0], tokens.baseline_by_level, rtol=1e-9, atol=0)
    torch.testing.assert_close(statistic.loss, tokens.loss, rtol=1e-6, atol=1e-9)


TINY = TrainConfig(model="A", depth=3, n_ctx=16, budget=3, steps=6, batch=32, width=16, eval_every=3,
                   eval_contexts=64, expected_loss=True, device="cpu")


def test_train_many_stacks_bilinear_and_coord_models_and_matches_training_alone():
    configs = [dataclasses.replace(TINY, router=router, seed=seed) for router in ("bilinear", "coord")
               for seed in (0, 1)]
    results = train_many(configs, progress=False)
    alone = train(configs[3], progress=False)
    for result in results:
        assert all(torch.isfinite(torch.tensor(e["eval_excess_loss"])) for e in result.history)
    torch.testing.assert_close(results[3].final_loss, alone.final_loss, rtol=1e-4, atol=0)
    bilinear, coord = results[0].model, results[2].model
    # both start at zero: trained away from it, the gradient reached the interaction and the scores
    assert bilinear.block(3).router.interaction.abs().max() > 0
    assert coord.block(3).router.score[-1].weight.abs().max() > 0
    g = _contexts(3, B=16, N=16).pooled().g.float()
    workspace = coord.workspace_from_statistic(g)[:, :2]
    assert torch.equal((coord.block(3).router.matrix(workspace) != 0).sum(-1), torch.ones(16, 1, dtype=torch.long))


def test_config_round_trip_and_directories_with_and_without_the_router():
    coord = dataclasses.replace(TINY, router="coord")
    assert TrainConfig.from_dict(coord.to_dict()) == coord
    stored = {k: v for k, v in TINY.to_dict().items() if k != "router"}  # a config saved before the field
    assert TrainConfig.from_dict(stored) == TINY and TINY.router == "gated"
    assert run_dir_for(TrainConfig.from_dict(stored)) == run_dir_for(TINY) != run_dir_for(coord)
    assert "router" not in run_dir_for(TINY).name and coord.model_config().router == "coord"
    with pytest.raises(ValueError, match="router 'coord' is a choice of model A only"):
        dataclasses.replace(TINY, model="B", router="coord")
    with pytest.raises(ValueError, match="router must be one of"):
        dataclasses.replace(TINY, router="mlp")


TRAIN = ["train", "--depth", "3", "--n-ctx", "16", "--budget", "2", "--steps", "3", "--batch", "16",
         "--width", "8", "--no-progress"]


def _status(argv) -> int:
    """The exit status of ``python -m fvlib ARGV``, run in-process (argparse's refusals exit)."""
    try:
        return main(argv)
    except SystemExit as exit_info:
        return exit_info.code


def test_cli_trains_model_a_with_the_bilinear_router(tmp_path, capsys):
    assert _status([*TRAIN, "--model", "A", "--router", "bilinear", "--out", str(tmp_path / "run"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    model, config = load_run(tmp_path / "run")[:2]
    assert config.router == "bilinear" and isinstance(model.block(2).router, BilinearRouter)
    assert summary["final_loss"] > 0


@pytest.mark.parametrize("flags, words", [
    (["--model", "B", "--router", "coord"], ["--router coord", "model A", "--model B"]),
    (["--model", "C", "--router", "gated"], ["--router gated does nothing", "model C"]),
    (["--model", "A", "--arch", "transformer", "--router", "linear"],
     ["--router linear", "model A only", "--arch transformer"]),
    (["--model", "A", "--router", "coord", "--imitation"], ["--imitation needs --router gated", "--router coord"]),
    (["--model", "A", "--router", "softmax"], ["--router", "softmax"]),
], ids=["B-coord", "C-typed-gated", "transformer", "imitation", "unknown"])
def test_cli_refuses_the_router_flag_where_it_does_not_apply(tmp_path, capsys, flags, words):
    status = _status([*TRAIN, *flags, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "Traceback" not in err
    assert all(word in err for word in words), err
    assert not (tmp_path / "run").exists()


def test_coord_model_a_learns_an_adaptive_route_at_k3():
    """Tree K = 3, M = 3, N = 32, sigma = 0.1, 300 steps (width 64, batch 256), seed 0: the coord
    router's A ends below 0.75 times the best non-adaptive coordinates (0.252), so its routes
    depend on the context. Measured 0.138, about 12 times greedy (0.0113): not near it. The
    straight-through router without a soft phase ended at 0.260 here. A pin of one seed, not a
    claim about every start: seeds 1 and 2 end at 0.365 and 0.231 (0.162 and 0.689 without the
    soft phase); the route search depends on the start (see :class:`fvlib.routers.CoordRouter`)."""
    config = TrainConfig(model="A", depth=3, n_ctx=32, budget=3, noise_std=0.1, steps=300, batch=256, width=64,
                         router="coord", expected_loss=True, eval_every=300, eval_contexts=2048, device="cpu")
    result = train(config, progress=False)
    references = theory_baselines(make_prior("tree", 3, 0.5), 32, 0.1, 3, samples=2000)
    assert result.final_loss < 0.75 * references["nonadaptive_coord"]
