"""Interventions on the standard transformers (fvlib.interventions): the linear part of
the prediction, the function-vector transplant, probes, the state-patching analogue of key
patching, and `patch --run` on transformer runs."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import seeded_transformer

from fvlib import make_generator, make_prior
from fvlib.hooks import hook_name
from fvlib.interventions import (
    PROBE_QUERY_SEED_OFFSET,
    EffectiveTheta,
    effective_theta,
    level_overlap,
    pair_patcher,
    probe_stream,
    probe_workspace,
    state_patching_sweep,
    stream_hook_name,
    transplant_stream,
)
from fvlib.theory import patching_pairs
from fvlib.training import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

TREE = make_prior("tree", 3, 0.7)  # D = 7
N = 12


def seeded(kind="A", arrangement="bottlenecked", seed=0):
    return seeded_transformer(TREE, kind, arrangement, 3, seed)


def pair(contexts=20, split_level=1, seed=0):
    return patching_pairs(TREE, contexts, split_level, N, 0.0, make_generator(seed))


def state_patcher(model, queries, seed, kind="sent"):
    """The state patch of every layer of ``model`` as a ``run_pair(target, donor)``."""
    layers = range(1, model.config.n_layers + 1)
    return pair_patcher(model, EffectiveTheta(model, queries=queries, seed=seed), kind, layers)


def test_effective_theta_is_exact_for_a_linear_prediction():
    model = seeded()
    target, _ = pair()
    x_probe = torch.randn(20, 16, TREE.dim, generator=make_generator(3))
    theta = torch.randn(20, TREE.dim, generator=make_generator(4))
    linear = lambda prediction, hook: torch.einsum("bqd,bd->bq", x_probe, theta).to(prediction.dtype)  # noqa: E731
    got = effective_theta(model, target, x_probe, [("hook_prediction", linear)])
    assert got.dtype == torch.float64 and got.shape == (20, TREE.dim)
    torch.testing.assert_close(got, theta.double(), atol=1e-4, rtol=1e-4)


def test_effective_theta_rejects_too_few_probe_queries():
    target, _ = pair()
    with pytest.raises(ValueError, match="x_probe"):
        effective_theta(seeded(), target, torch.randn(20, TREE.dim - 1, TREE.dim))
    with pytest.raises(ValueError, match="queries"):
        transplant_stream(seeded(), TREE, N, 0.0, contexts=4, queries=3)


def test_stream_hook_names():
    assert stream_hook_name(seeded(), 2) == "blocks.2.hook_workspace"
    assert stream_hook_name(seeded(arrangement="open"), 3) == "blocks.3.hook_query"
    with pytest.raises(ValueError, match="layer"):
        stream_hook_name(seeded(), 4)
    with pytest.raises(ValueError, match="FVTransformer or StandardTransformer"):
        stream_hook_name(object(), 1)


def test_open_transplant_at_the_last_layer_predicts_the_donor():
    """After the last layer the query stream is all the readout sees: the transplanted target
    predicts exactly the donor's theta_eff."""
    model = seeded(arrangement="open")
    result = transplant_stream(model, TREE, N, 0.0, contexts=30, queries=16, seed=5)
    target, donor = patching_pairs(TREE, 30, 1, N, 0.0, make_generator(5))
    x_probe = torch.randn(30, 16, TREE.dim, generator=make_generator(5 + PROBE_QUERY_SEED_OFFSET), dtype=target.x.dtype)
    donor_own = level_overlap(TREE, effective_theta(model, donor, x_probe), donor.signs).mean(0)
    torch.testing.assert_close(result.donor_overlap[-1], donor_own)
    assert not torch.allclose(result.target_overlap[-1], result.baseline_overlap)
    assert result.target_overlap.shape == (3, 3) and result.n_contexts == 30


def test_bottlenecked_transplant_changes_the_prediction_and_is_deterministic():
    model = seeded()
    a = transplant_stream(model, TREE, N, 0.0, contexts=25, queries=8, seed=1, chunk=10)
    b = transplant_stream(model, TREE, N, 0.0, contexts=25, queries=8, seed=1, chunk=10)
    torch.testing.assert_close(a.target_overlap, b.target_overlap, rtol=0, atol=0)
    assert not torch.allclose(a.target_overlap[0], a.baseline_overlap)
    assert a.to_dict()["split_level"] == 1


def test_probe_stream_is_probe_workspace_for_the_bottlenecked_arrangement():
    model = seeded()
    ours = probe_stream(model, TREE, N, 0.0, contexts=200, seed=2)
    chapter10 = probe_workspace(model, TREE, N, 0.0, contexts=200, seed=2)
    torch.testing.assert_close(ours.accuracy, chapter10.accuracy)
    open_ = probe_stream(seeded(arrangement="open"), TREE, N, 0.0, contexts=200, seed=2, kind="mlp")
    assert open_.accuracy.shape == (3, 3) and ((0 <= open_.accuracy) & (open_.accuracy <= 1)).all()
    with pytest.raises(ValueError, match="kind"):
        probe_stream(model, TREE, N, 0.0, kind="tree")


def test_state_patch_with_the_target_as_donor_is_the_identity():
    model = seeded()
    target, _ = pair(contexts=15)
    clean, patched, _, _ = state_patcher(model, 8, 0)(target, target)
    for theta in patched:
        torch.testing.assert_close(theta, clean)


def test_state_patching_sweep_layout():
    model = seeded()
    result = state_patching_sweep(model, TREE, N, 0.0, contexts=20, queries=8, seed=3)
    assert result.loss.shape == (3, 3)
    # layer 1: no state has been read yet, so the patch changes nothing
    torch.testing.assert_close(result.loss[:, 0], result.baseline_by_level)
    assert (result.loss[:, 1:] - result.baseline_by_level[:, None]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="bottlenecked"):
        state_patching_sweep(seeded(arrangement="open"), TREE, N, 0.0, contexts=4)
    with pytest.raises(ValueError, match="StandardTransformer"):
        state_patching_sweep(object(), TREE, N, 0.0)


def test_state_patch_recomputes_what_the_targets_tokens_send():
    """At layer 2 the patched values are those of the target's own tokens having read the
    donor's phi_1: they differ from the target's own values and from the donor's."""
    model = seeded()
    target, donor = pair(contexts=10)
    # the layer-2 values differ from the target's own ones (the donor's state was read)
    names = [hook_name("values", 2)]
    _, own = model.run_with_cache(target, names_filter=names)
    _, dcache = model.run_with_cache(donor, names_filter=[hook_name("workspace", 1)])
    ws = dcache[hook_name("workspace", 1)]
    with model.hooks([(hook_name("workspace", 1), lambda t, h: ws)]):
        _, hybrid = model.run_with_cache(target, names_filter=names)
    _, donor_own = model.run_with_cache(donor, names_filter=names)
    assert not torch.allclose(own[names[0]], hybrid[names[0]])
    assert not torch.allclose(donor_own[names[0]], hybrid[names[0]])


# ----- the command line -------------------------------------------------------------------
def run_cli(*args):
    # the limit only catches a hang: far above the slowest call here (reproduce --quick, about
    # 20 s on a loaded 2-core machine)
    return subprocess.run([sys.executable, "-m", "fvlib", *args], capture_output=True, text=True, timeout=900)


def test_cli_patch_on_a_bottlenecked_run(tmp_path):
    config = TrainConfig(arch="transformer", model="A", depth=2, n_ctx=8, budget=2, steps=2, batch=8,
                         queries=4, width=8, device="cpu", eval_contexts=16)
    train(config, out_dir=tmp_path / "run", progress=False)
    out = run_cli("patch", "--run", str(tmp_path / "run"), "--contexts", "6", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert len(result["loss"]) == 2 and len(result["loss"][0]) == 2  # rows m = 1..K, columns l = 1..L
    assert len(result["theory_loss"]) == 2


def test_attention_spread_of_uniform_and_of_peaked_attention():
    from fvlib.interventions import attention_spread

    model = seeded()
    for l in (1, 2, 3):
        model.block(l).pool.W_K.weight.data.zero_()  # equal scores: uniform pooling
    uniform = attention_spread(model, TREE, N, 0.0, contexts=20, n_show=3)
    torch.testing.assert_close(uniform.entropy, torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(uniform.peak, torch.ones(3, dtype=torch.float64))
    assert uniform.patterns.shape == (3, 3, N)
    for l in (1, 2, 3):
        model.block(l).pool.W_K.weight.data.normal_(0, 30.0)  # huge scores: near one-hot
    peaked = attention_spread(model, TREE, N, 0.0, contexts=20)
    assert (peaked.entropy < 0.5).all() and (peaked.peak > N / 3).all()
    open_ = attention_spread(seeded(arrangement="open"), make_prior("gaussian-twin", 3, 0.7), N, 0.0, contexts=20)
    assert ((open_.entropy > 0) & (open_.entropy <= 1 + 1e-12)).all()
    with pytest.raises(ValueError, match="n_show"):
        attention_spread(model, TREE, N, 0.0, contexts=5, n_show=6)


def test_plot_attention_spread_draws_one_panel_per_model():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fvlib.interventions import attention_spread
    from fvlib.plots.transformers import plot_attention_spread

    spreads = {"bottlenecked": attention_spread(seeded(), TREE, N, 0.0, contexts=10, n_show=2),
               "open": attention_spread(seeded(arrangement="open"), TREE, N, 0.0, contexts=10, n_show=2)}
    fig, axes = plot_attention_spread(spreads)
    assert len(axes) == 2 and len(axes[0].lines) == 3 * 2 + 1  # L layers x n_show contexts + uniform
    with pytest.raises(ValueError, match="at least one"):
        plot_attention_spread({})
    plt.close(fig)


def test_query_patch_is_the_identity_at_layer_one_and_acts_later():
    model = seeded()
    result = state_patching_sweep(model, TREE, N, 0.0, contexts=20, queries=8, seed=3, kind="query")
    torch.testing.assert_close(result.loss[:, 0], result.baseline_by_level)
    assert (result.loss[:, 1:] - result.baseline_by_level[:, None]).abs().max() > 1e-3
    target, _ = pair(contexts=15)
    clean, patched, _, _ = state_patcher(model, 8, 0, "query")(target, target)
    for theta in patched:
        torch.testing.assert_close(theta, clean)
    with pytest.raises(ValueError, match="kind"):
        state_patching_sweep(model, TREE, N, 0.0, contexts=4, kind="values")
