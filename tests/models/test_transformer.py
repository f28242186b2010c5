"""The standard transformers of fvlib.transformer: shapes, exchangeability, the bottleneck,
hooks, training through fvlib.training (checkpoints, resume) and the CLI."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from conftest import seeded_transformer

from fvlib import make_generator, make_prior, sample_task
from fvlib.hooks import ActivationCache, hook_name
from fvlib.training import TrainConfig, build_prior, evaluate, load_run, run_dir_for, train
from fvlib.transformer import (
    ARRANGEMENTS,
    TRANSFORMER_LAYER_HOOKS,
    StandardTransformer,
    TransformerConfig,
    transformer_config,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

PRIOR = make_prior("tree", 3, 0.5)  # D = 7
N, Q, B = 12, 3, 5


@pytest.fixture
def batch():
    return sample_task(PRIOR, B, N, 0.1, make_generator(0))


@pytest.fixture
def x_query():
    return torch.randn(B, Q, PRIOR.dim, generator=make_generator(1))


def seeded(kind="A", arrangement="bottlenecked", budget=3, seed=0, **kw):
    return seeded_transformer(PRIOR, kind, arrangement, budget, seed, **kw)


# ----- configuration ----------------------------------------------------------------------
@pytest.mark.parametrize("kind, layers, channels", [("A", 4, 1), ("B", 1, 4)])
def test_layouts_follow_the_budget(kind, layers, channels):
    config = transformer_config(kind, PRIOR, 4)
    assert (config.n_layers, config.channels, config.budget) == (layers, channels, 4)


def test_config_json_round_trip():
    config = transformer_config("A", 7, 3, "open", d_model=24, features="raw")
    assert TransformerConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


@pytest.mark.parametrize(
    "kwargs, bad",
    [
        ({"arrangement": "closed"}, "closed"),
        ({"features": "square"}, "square"),
        ({"d_model": 0}, "d_model"),
        ({"channels": -1}, "channels"),
    ],
)
def test_bad_config_raises_naming_the_value(kwargs, bad):
    base = dict(dim=7, n_layers=2, channels=1)
    with pytest.raises(ValueError, match=bad):
        TransformerConfig(**{**base, **kwargs})


def test_bad_factory_arguments():
    with pytest.raises(ValueError, match="'C'"):
        transformer_config("C", 7, 3)
    with pytest.raises(ValueError, match="budget"):
        transformer_config("A", 7, 0)
    with pytest.raises(ValueError, match="unknown transformer config keys"):
        TransformerConfig.from_dict({"dim": 7, "n_layers": 1, "channels": 1, "width": 3})
    with pytest.raises(ValueError, match="TransformerConfig"):
        StandardTransformer({"dim": 7})


# ----- forward ----------------------------------------------------------------------------
@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
@pytest.mark.parametrize("kind", ["A", "B"])
def test_shapes(kind, arrangement, batch, x_query):
    model = seeded(kind, arrangement)
    assert model(batch).shape == (B,)
    assert model(batch.x, batch.y, x_query).shape == (B, Q)
    # one query token per context gives the same numbers as the first of several
    torch.testing.assert_close(model(batch.x, batch.y, x_query)[:, 0], model(batch.x, batch.y, x_query[:, 0]))


def test_bad_inputs_raise(batch):
    model = seeded()
    with pytest.raises(ValueError, match="x must have shape"):
        model(batch.x[..., :3], batch.y, batch.x_query)
    with pytest.raises(ValueError, match="y must have shape"):
        model(batch.x, batch.y[:, :3], batch.x_query)
    with pytest.raises(ValueError, match="x_query"):
        model(batch.x, batch.y, batch.x_query[:, :2])
    with pytest.raises(ValueError, match="TaskBatch"):
        model(batch.x)


@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
@pytest.mark.parametrize("kind", ["A", "B"])
def test_exchangeable_in_the_context_tokens(kind, arrangement, batch, x_query):
    model = seeded(kind, arrangement)
    perm = torch.randperm(N, generator=make_generator(3))
    before = model(batch.x, batch.y, x_query)
    after = model(batch.x[:, perm], batch.y[:, perm], x_query)
    torch.testing.assert_close(before, after, rtol=1e-5, atol=1e-5)
    # ... and the prediction does depend on the context
    assert not torch.allclose(before, model(batch.x, batch.y.flip(0), x_query), atol=1e-4)


@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
def test_query_tokens_do_not_see_each_other(arrangement, batch, x_query):
    model = seeded("A", arrangement)
    full = model(batch.x, batch.y, x_query)
    changed = x_query.clone()
    changed[:, 1:] = torch.randn_like(changed[:, 1:])
    torch.testing.assert_close(model(batch.x, batch.y, changed)[:, 0], full[:, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["A", "B"])
def test_the_context_reaches_the_queries_only_through_the_workspace(kind, batch, x_query):
    model = seeded(kind, "bottlenecked")
    other = sample_task(PRIOR, B, N, 0.1, make_generator(9))
    names = [hook_name("workspace", l) for l in range(1, model.config.n_layers + 1)]
    _, cache = model.run_with_cache(batch.x, batch.y, x_query, names_filter=names)
    hooks = [(name, lambda t, hook: cache[hook.name]) for name in names]
    mine = model(batch.x, batch.y, x_query)
    theirs = model(other.x, other.y, x_query)
    assert not torch.allclose(mine, theirs, atol=1e-3)
    # another context, this context's workspace: this context's predictions
    transplanted = model.run_with_hooks(other.x, other.y, x_query, fwd_hooks=hooks)
    torch.testing.assert_close(transplanted, mine, rtol=1e-5, atol=1e-5)
    # and the workspace after layer l depends on the context only through phi_1..phi_l
    phis = [hook_name("phi", l) for l in range(1, model.config.n_layers + 1)]
    _, phi_cache = model.run_with_cache(batch.x, batch.y, x_query, names_filter=phis)
    hooks = [(name, lambda t, hook: phi_cache[hook.name]) for name in phis]
    phis_transplanted = model.run_with_hooks(other.x, other.y, x_query, fwd_hooks=hooks)
    torch.testing.assert_close(phis_transplanted, mine, rtol=1e-5, atol=1e-5)


def test_open_queries_read_the_context_directly(batch, x_query):
    # no workspace: the open arrangement's queries change when the context does
    model = seeded("B", "open")
    assert "blocks.1.hook_workspace" not in model.hook_names()
    other = sample_task(PRIOR, B, N, 0.1, make_generator(9))
    assert not torch.allclose(model(batch.x, batch.y, x_query), model(other.x, other.y, x_query), atol=1e-3)


# ----- hooks ------------------------------------------------------------------------------
def expected_shapes(model, T):
    c = model.config
    h, d, dm = c.head_dim, c.channels, c.d_model
    if c.arrangement == "bottlenecked":
        per_layer = {
            "queries": (B, 1, h), "keys": (B, N, h), "values": (B, N, d), "pattern": (B, 1, N),
            "phi": (B, d), "attn_out": (B, 1, dm), "read_out": (B, N + Q, dm), "workspace": (B, dm),
            "context": (B, N, dm), "query": (B, Q, dm),
        }
    else:
        per_layer = {
            "queries": (B, T, h), "keys": (B, T, h), "values": (B, T, d), "pattern": (B, T, T),
            "attn_out": (B, T, dm), "context": (B, N, dm), "query": (B, Q, dm),
        }
    shapes = {hook_name(k, l): s for l in range(1, c.n_layers + 1) for k, s in per_layer.items()}
    shapes["hook_prediction"] = (B, Q)
    return shapes


@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
@pytest.mark.parametrize("kind", ["A", "B"])
def test_hook_names_and_cache_shapes(kind, arrangement, batch, x_query):
    model = seeded(kind, arrangement)
    prediction, cache = model.run_with_cache(batch.x, batch.y, x_query)
    assert isinstance(cache, ActivationCache)
    expected = expected_shapes(model, N + Q)
    assert set(model.hook_names()) == set(expected) == set(cache)
    assert {k: tuple(v.shape) for k, v in cache.items()} == expected
    torch.testing.assert_close(cache["hook_prediction"], prediction)
    for l in range(1, model.config.n_layers + 1):
        pattern = cache[hook_name("pattern", l)]
        torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:-1]))
    if arrangement == "bottlenecked":  # phi is the pattern-weighted sum of the values
        phi = (cache["blocks.1.hook_pattern"] @ cache["blocks.1.hook_values"])[:, 0]
        torch.testing.assert_close(cache["blocks.1.hook_phi"], phi)
    else:  # queries never attend to other queries, context tokens never to queries
        pattern = cache["blocks.1.hook_pattern"]
        assert torch.all(pattern[:, :N, N:] == 0)
        off_diagonal = pattern[:, N:, N:] * (1 - torch.eye(Q))
        assert torch.all(off_diagonal == 0)


def test_hook_name_helper():
    assert hook_name("workspace", 2) == "blocks.2.hook_workspace"
    assert hook_name("pattern", "*") == "blocks.*.hook_pattern"
    assert hook_name("prediction") == "hook_prediction"
    with pytest.raises(ValueError, match="'nope'"):
        hook_name("nope", 1)
    assert hook_name("theta_hat") not in seeded("A", "bottlenecked").hook_names()  # constrained models only
    with pytest.raises(ValueError, match="layer"):
        hook_name("keys", 0)
    with pytest.raises(ValueError, match="whole model"):
        hook_name("prediction", 1)
    assert set(TRANSFORMER_LAYER_HOOKS) >= {"queries", "keys", "values", "pattern", "attn_out"}


def test_hooks_replace_and_clean_up(batch):
    model = seeded("A", "bottlenecked")
    base = model(batch)
    name = hook_name("phi", 1)
    changed = model.run_with_hooks(batch, fwd_hooks=[(name, lambda t, hook: t + 1.0)])
    assert not torch.allclose(changed, base)
    torch.testing.assert_close(model(batch), base)  # removed after the call
    with pytest.raises(ValueError, match="unknown hook names"):
        with model.hooks([("blocks.9.hook_phi", lambda t, hook: None)]):
            pass
    with pytest.raises(ValueError, match="matches no hook"):
        model.run_with_cache(batch, names_filter="blocks.*.hook_theta_hat")


def test_features(batch):
    model = seeded("B", "bottlenecked", features="raw")
    assert model.context_features(batch.x, batch.y).shape == (B, N, PRIOR.dim + 1)
    product = seeded("B", "bottlenecked")
    feats = product.context_features(batch.x, batch.y)
    torch.testing.assert_close(feats[..., PRIOR.dim + 1:], batch.y[..., None] * batch.x)


# ----- training, checkpoints, resume ------------------------------------------------------
TINY = TrainConfig(
    arch="transformer", model="A", depth=3, n_ctx=16, budget=2, steps=12, batch=16, queries=4,
    width=16, eval_every=4, eval_contexts=64, checkpoint_every=5, device="cpu",
)


@pytest.mark.parametrize("arch", ["transformer", "transformer-open"])
def test_train_save_load_and_resume(arch, tmp_path):
    config = dataclasses.replace(TINY, arch=arch)
    whole = train(config, out_dir=tmp_path / "whole", progress=False)
    assert isinstance(whole.model, StandardTransformer)
    assert whole.model.config.arrangement == {"transformer": "bottlenecked", "transformer-open": "open"}[arch]
    assert whole.history[-1]["step"] == 12 and whole.final_loss == whole.history[-1]["eval_excess_loss"]
    # interrupted at step 7 and resumed: the same numbers
    train(config, out_dir=tmp_path / "split", progress=False, until_step=7)
    resumed = train(config, out_dir=tmp_path / "split", progress=False)
    assert resumed.final_loss == whole.final_loss
    model, stored, history = load_run(tmp_path / "split")
    assert stored == config and isinstance(model, StandardTransformer)
    batch = sample_task(build_prior(config), 8, 16, 0.0, make_generator(5))
    torch.testing.assert_close(model(batch), whole.model.cpu()(batch))
    # the excess loss of a transformer is measured against the noise-free target
    ev = evaluate(model, build_prior(config), 16, 0.0, contexts=64, seed=3)
    assert ev["excess_loss"] == pytest.approx(ev["query_loss"])


@pytest.mark.parametrize("arch", ["transformer", "transformer-open"])
def test_training_lowers_the_loss(arch):
    config = dataclasses.replace(
        TINY, arch=arch, model="B", depth=2, steps=100, batch=32, eval_every=100, eval_contexts=256, lr=5e-3
    )
    result = train(config, progress=False)
    start, end = result.history[0], result.history[-1]
    # E|theta|^2 = 1.5 at the start (the readout starts at zero); far below it after 100 steps
    assert start["eval_excess_loss"] == pytest.approx(1.5, rel=0.2)
    assert end["eval_excess_loss"] < 0.6 * start["eval_excess_loss"]


def test_train_config_arch():
    with pytest.raises(ValueError, match="arch"):
        dataclasses.replace(TINY, arch="rnn")
    with pytest.raises(ValueError, match="'C'"):
        dataclasses.replace(TINY, model="C")
    assert TrainConfig().arch == "constrained"
    assert dataclasses.replace(TINY, arch="constrained", model="C").model_config().router == "linear"


def test_run_dir_names():
    # a run the book cached before the arch field existed keeps its name
    # (the config.json of book/.fvlib_runs/A-tree-K4-M4-N128-s500-ebca83d8aa, written by main)
    stored = {'model': 'A',
               'prior': 'tree',
               'depth': 4,
               'alpha': 0.5,
               'n_ctx': 128,
               'noise_std': 0.0,
               'budget': 4,
               'steps': 500,
               'batch': 128,
               'lr': 0.003,
               'queries': 64,
               'width': 128,
               'hidden_layers': 2,
               'seed': 0,
               'eval_every': 100,
               'eval_contexts': 2048,
               'checkpoint_every': 500,
               'device': 'cpu'}
    constrained = TrainConfig.from_dict(stored)
    assert run_dir_for(constrained, "r").name == "A-tree-K4-M4-N128-s500-ebca83d8aa"
    bottlenecked = dataclasses.replace(constrained, arch="transformer")
    open_ = dataclasses.replace(constrained, arch="transformer-open")
    names = {run_dir_for(c, "r").name for c in (constrained, bottlenecked, open_)}
    assert len(names) == 3
    assert run_dir_for(open_, "r").name.startswith("transformer-open-A-tree-K4")


# ----- the command line -------------------------------------------------------------------
def run_cli(*args):
    # the limit only catches a hang: far above the slowest call here (reproduce --quick, about
    # 20 s on a loaded 2-core machine)
    return subprocess.run([sys.executable, "-m", "fvlib", *args], capture_output=True, text=True, timeout=900)


@pytest.mark.slow  # trains through the CLI (about 15 s)
def test_cli_trains_a_transformer(tmp_path):
    out = run_cli("train", "--arch", "transformer-open", "--model", "B", "--depth", "2", "--n-ctx", "8",
                  "--budget", "2", "--steps", "3", "--batch", "8", "--width", "8", "--device", "cpu",
                  "--out", str(tmp_path / "run"), "--no-progress", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result) == {"final_loss", "seconds", "checkpoint", "steps", "model", "prior", "inputs"}
    assert result["inputs"] == "tokens"
    _, config, _ = load_run(tmp_path / "run")
    assert config.arch == "transformer-open" and config.model == "B"
    # patch has no analogue for the open arrangement (see test_transformer_patching.py): one line, exit 2
    patched = run_cli("patch", "--run", str(tmp_path / "run"), "--contexts", "4")
    assert patched.returncode == 2 and "Traceback" not in patched.stderr
    assert patched.stderr.strip().count("\n") == 0 and "--arch transformer-open" in patched.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--arch", "rnn", "--model", "A"], "rnn"),
        (["--arch", "transformer", "--model", "C"], "'C'"),
    ],
)
def test_cli_errors_are_one_line(args, needle, tmp_path):
    out = run_cli("train", *args, "--depth", "2", "--n-ctx", "8", "--budget", "2", "--steps", "3",
                  "--device", "cpu", "--out", str(tmp_path / "run"))
    assert out.returncode == 2
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr
