"""Training, evaluation, checkpoints and resumption (fvlib.training)."""

import dataclasses
import json

import pytest
import torch
from conftest import TINY, same_parameters, strip_times
from safetensors.torch import load_file

from fvlib import make_prior
from fvlib.models import make_model
from fvlib.training import (
    EVAL_SEED_OFFSET,
    IMITATION_RECIPE,
    ORIGINAL_RECIPE,
    RECIPE,
    RunDirError,
    TrainConfig,
    build_prior,
    checkpoint_step,
    evaluate,
    load_history,
    load_run,
    lr_at,
    repair_run,
    resolve_device,
    train,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


# ----- configuration ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [
        ("model", "D"),
        ("prior", "laplace"),
        ("depth", -1),
        ("depth", 0),
        ("alpha", 1.5),
        ("alpha", 0.0),
        ("budget", 0),
        ("steps", 0),
        ("batch", 2.5),
        ("lr", -1e-3),
        ("queries", 0),
        ("n_ctx", 0),
        ("noise_std", -0.1),
        ("seed", -1),
        ("seed", 2**32),
        ("data_seed", 10**23),
        ("budget", 8),  # more than D = 7 at depth 3, as theory refuses it
        ("eval_contexts", 0),
    ],
)
def test_bad_config_raises_naming_the_value(field, value):
    with pytest.raises(ValueError, match=str(value).replace(".", r"\.")):
        dataclasses.replace(TINY, **{field: value})


def test_config_round_trip_and_unknown_keys():
    assert TrainConfig.from_dict(json.loads(json.dumps(TINY.to_dict()))) == TINY
    with pytest.raises(ValueError, match="epochs"):
        TrainConfig.from_dict({**TINY.to_dict(), "epochs": 3})


def test_model_config_matches_the_kind():
    config = TINY.model_config()
    assert (config.dim, config.n_layers, config.channels) == (7, 3, 1)


def test_cosine_schedule():
    plain = dataclasses.replace(TINY, warmup=0.0)
    assert lr_at(0, plain) == plain.lr
    assert lr_at(plain.steps // 2, plain) == pytest.approx(plain.lr / 2)
    assert lr_at(plain.steps, plain) == pytest.approx(0.0, abs=1e-15)


def test_warmup_then_cosine():
    config = dataclasses.replace(TINY, steps=100, warmup=0.1, lr=0.02)   # w = 10 steps
    assert [lr_at(s, config) for s in (0, 4, 9)] == pytest.approx([0.002, 0.01, 0.02])
    assert lr_at(10, config) == pytest.approx(0.02)                      # the peak, then cosine
    assert lr_at(55, config) == pytest.approx(0.01)                      # half-way through the decay
    assert lr_at(100, config) == pytest.approx(0.0, abs=1e-15)
    lrs = [lr_at(s, config) for s in range(101)]
    assert max(lrs) == pytest.approx(0.02) and all(a <= b for a, b in zip(lrs[:10], lrs[1:11]))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    tiny = dataclasses.replace(TINY, steps=1, warmup=0.5)                # floor(0.5) = 0: no warm-up
    assert lr_at(0, tiny) == tiny.lr


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan"), "0.1"])
def test_warmup_must_be_a_fraction(bad):
    with pytest.raises(ValueError, match="warmup"):
        dataclasses.replace(TINY, warmup=bad)


def test_default_recipe_the_imitation_one_and_the_original_one():
    """The defaults are the recipe of chapter 8's closing section, with no teacher (model A on
    the tree does not warm-start); IMITATION_RECIPE adds the imitation warm start;
    ORIGINAL_RECIPE is the old one."""
    default = TrainConfig()
    assert (default.model, default.prior, default.arch) == ("A", "tree", "constrained")
    assert (default.lr, default.warmup, default.queries, default.width) == (1e-2, 0.05, 256, 256)
    assert default.router_warm_start == 0 and not default.warm_starts
    assert {k: getattr(default, k) for k in RECIPE} == RECIPE and set(RECIPE) | {"inputs"} == set(ORIGINAL_RECIPE)
    assert default.input_path == "statistic" and TrainConfig(**ORIGINAL_RECIPE).input_path == "tokens"
    imitation = TrainConfig(**IMITATION_RECIPE)
    assert (imitation.router_warm_start, imitation.router_lr_scale) == (600, 0.1) and imitation.warm_starts
    assert IMITATION_RECIPE == {**RECIPE, "router_warm_start": 600, "router_lr_scale": 0.1}
    assert ORIGINAL_RECIPE == {"lr": 3e-3, "warmup": 0.0, "queries": 64, "width": 128,
                               "router_warm_start": 0, "router_lr_scale": 1.0, "inputs": "tokens"}
    old = TrainConfig(**ORIGINAL_RECIPE)
    assert lr_at(0, old) == 3e-3 and old.queries == 64 and not old.warm_starts


def test_resolve_device():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="gpu0"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            resolve_device("cuda")


# ----- training ---------------------------------------------------------------------------
def test_same_seed_gives_bitwise_the_same_run():
    a, b = train(TINY, progress=False), train(TINY, progress=False)
    assert strip_times(a.history) == strip_times(b.history)
    assert same_parameters(a.model, b.model)
    c = train(dataclasses.replace(TINY, seed=1), progress=False)
    assert strip_times(c.history) != strip_times(a.history)


def test_history_layout():
    result = train(TINY, progress=False)
    assert [entry["step"] for entry in result.history] == [0, 10, 20, 30, 40]
    assert result.history[0]["train_loss"] is None
    assert result.final_loss == result.history[-1]["eval_excess_loss"]
    assert result.checkpoint is None and result.seconds > 0
    for key in ("lr", "train_loss", "eval_excess_loss", "eval_stderr", "eval_query_loss", "seconds"):
        assert key in result.history[-1]


def test_callback_can_stop_training(tmp_path):
    seen = []
    result = train(
        TINY,
        out_dir=tmp_path,
        progress=False,
        callback=lambda entry: seen.append(entry) or entry["step"] >= 20,
    )
    assert [entry["step"] for entry in seen] == [10, 20]
    assert result.history[-1]["step"] == 20 and result.final_loss == result.history[-1]["eval_excess_loss"]
    resumed = train(TINY, out_dir=tmp_path, progress=False)  # the stop left a checkpoint
    assert strip_times(resumed.history) == strip_times(train(TINY, progress=False).history)


def test_on_step_stops_between_evaluations_and_resumes_exactly(tmp_path):
    """on_step sees every step and may stop at any; an evaluation there changes nothing."""
    seen, extra = [], []

    def on_step(step, model):
        seen.append(step)
        if step in (3, 7):
            extra.append(evaluate(model, build_prior(TINY), TINY.n_ctx, TINY.noise_std, contexts=50, seed=1))
        return step == 13

    stopped = train(TINY, out_dir=tmp_path, progress=False, on_step=on_step)
    assert seen == list(range(1, 14)) and len(extra) == 2
    assert checkpoint_step(tmp_path) == 13 and [h["step"] for h in stopped.history] == [0, 10]
    resumed = train(TINY, out_dir=tmp_path, progress=False)
    assert strip_times(resumed.history) == strip_times(train(TINY, progress=False).history)


def test_training_does_not_touch_the_global_rng():
    state = torch.random.get_rng_state()
    train(dataclasses.replace(TINY, steps=2), progress=False)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_model_a_beats_the_zero_predictor():
    config = dataclasses.replace(
        TINY, steps=300, batch=128, n_ctx=64, queries=16, width=64, eval_every=300, eval_contexts=1000
    )
    result = train(config, progress=False)
    energy = make_prior("tree", 3, 0.5).energy  # excess loss of theta_hat = 0
    assert result.history[0]["eval_excess_loss"] == pytest.approx(energy)
    assert result.final_loss < 0.2 * energy


def test_model_c_tracks_the_linear_closed_form():
    """C is linear: it can only reach the LMMSE of its M best coordinates (Gaussian twin).

    The closed form uses the noise ``tau2 = (E|theta|^2 + sigma^2) / N`` per measurement;
    at finite N the measurement of node n has the extra variance ``v_n / N`` (the
    ``theta theta^T / N`` term), which the trained model should match more tightly.
    """
    depth, n_ctx, budget, noise = 4, 64, 4, 0.2
    config = TrainConfig(
        model="C", depth=depth, n_ctx=n_ctx, budget=budget, noise_std=noise, steps=300, batch=128,
        queries=16, lr=1e-2, eval_every=300, eval_contexts=2000, device="cpu",
    )  # fmt: skip
    result = train(config, progress=False)
    prior = make_prior("tree", depth, 0.5)
    tau2 = (prior.energy + noise**2) / n_ctx
    v = prior.node_variances.sort(descending=True).values
    measured, unmeasured = v[:budget], float(v[budget:].sum())
    closed_form = unmeasured + float((measured * tau2 / (measured + tau2)).sum())
    noise_n = tau2 + measured / n_ctx
    finite_n = unmeasured + float((measured * noise_n / (measured + noise_n)).sum())
    assert result.final_loss == pytest.approx(closed_form, rel=0.1)
    assert result.final_loss == pytest.approx(finite_n, rel=0.03)


def test_query_loss_agrees_with_excess_loss_plus_noise():
    prior = make_prior("tree", 3, 0.5)
    torch.manual_seed(0)
    model = make_model("C", prior.dim, 3)
    with torch.no_grad():
        model.decoder.weight.normal_(0, 0.5)
    noise = 0.5
    result = evaluate(model, prior, n_ctx=32, noise_std=noise, contexts=4000, seed=3)
    assert set(result) >= {"excess_loss", "stderr", "query_loss", "contexts"}
    assert result["query_loss"] == pytest.approx(noise**2 + result["excess_loss"], rel=0.1)
    assert evaluate(model, prior, 32, noise, 4000, seed=3) == result


def test_eval_set_is_separate_from_training_contexts():
    assert EVAL_SEED_OFFSET >= 1000


# ----- checkpoints ------------------------------------------------------------------------
def test_checkpoint_round_trip(tmp_path):
    result = train(TINY, out_dir=tmp_path, progress=False)
    assert result.checkpoint == str(tmp_path / "model.safetensors")
    model, config, history = load_run(tmp_path)
    assert config == TINY
    assert strip_times(history) == strip_times(result.history)
    assert same_parameters(model, result.model)
    prior = make_prior("tree", 3, 0.5)
    assert evaluate(model, prior, 32, 0.0, 100, seed=5) == evaluate(result.model, prior, 32, 0.0, 100, seed=5)
    stored = json.loads((tmp_path / "config.json").read_text())
    assert stored["model"]["n_layers"] == 3 and stored["train"]["model"] == "A"
    state = load_file(str(tmp_path / "train_state.safetensors"))
    assert state["generator_state"].dtype == torch.uint8


def test_resumed_run_matches_an_uninterrupted_one(tmp_path):
    whole = train(TINY, out_dir=tmp_path / "whole", progress=False)
    part = train(TINY, out_dir=tmp_path / "split", progress=False, until_step=23)
    assert [e["step"] for e in part.history] == [0, 10, 20]
    _, _, saved = load_run(tmp_path / "split")
    assert strip_times(saved) == strip_times(part.history)
    resumed = train(dataclasses.replace(TINY, checkpoint_every=7), out_dir=tmp_path / "split", progress=False)
    assert strip_times(resumed.history) == strip_times(whole.history)
    assert same_parameters(resumed.model, whole.model)
    again = train(TINY, out_dir=tmp_path / "split", progress=False)  # finished: nothing left to do
    assert strip_times(again.history) == strip_times(whole.history)


def test_resume_refuses_a_different_config(tmp_path):
    train(TINY, out_dir=tmp_path, progress=False, until_step=5)
    with pytest.raises(RunDirError, match="another config: lr 0.03 here, 0.01 in the run"):
        train(dataclasses.replace(TINY, lr=3e-2), out_dir=tmp_path, progress=False)
    fresh = train(dataclasses.replace(TINY, lr=1e-2, steps=5), out_dir=tmp_path, resume=False, progress=False)
    assert load_run(tmp_path)[1] == fresh.config


def test_until_step_must_be_in_range():
    with pytest.raises(ValueError, match="until_step"):
        train(TINY, progress=False, until_step=TINY.steps + 1)


@pytest.fixture
def run_dir(tmp_path):
    train(dataclasses.replace(TINY, steps=5), out_dir=tmp_path / "run", progress=False)
    return tmp_path / "run"


def test_missing_run_dir(tmp_path):
    with pytest.raises(RunDirError, match="nowhere"):
        load_run(tmp_path / "nowhere")


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "history.json"])
def test_missing_file(run_dir, name):
    (run_dir / name).unlink()
    with pytest.raises(RunDirError, match=name):
        load_run(run_dir)


@pytest.fixture
def legacy_run_dir(run_dir):
    """A run directory as written before checkpoints had a manifest (the files are read as they are)."""
    (run_dir / "manifest.json").unlink()
    return run_dir


@pytest.mark.parametrize("name", ["config.json", "history.json"])
def test_corrupt_json(run_dir, name):
    (run_dir / name).write_text("{not json")
    with pytest.raises(RunDirError, match=f"{name} and manifest.json .* disagree"):
        load_run(run_dir)


@pytest.mark.parametrize("name", ["config.json", "history.json"])
def test_corrupt_json_of_a_legacy_run(legacy_run_dir, name):
    (legacy_run_dir / name).write_text("{not json")
    with pytest.raises(RunDirError, match=f"corrupt JSON.*{name}"):
        repair_run(legacy_run_dir)


@pytest.mark.parametrize("payload", [b"", b"garbage bytes that are not safetensors", b"\xff" * 64])
def test_corrupt_weights(run_dir, payload):
    (run_dir / "model.safetensors").write_bytes(payload)
    with pytest.raises(RunDirError, match="model.safetensors"):
        load_run(run_dir)


def test_truncated_weights(run_dir):
    path = run_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(RunDirError, match="model.safetensors"):
        load_run(run_dir)


def test_corrupt_training_state_blocks_resume(run_dir):
    (run_dir / "train_state.safetensors").write_bytes(b"nope")
    config = dataclasses.replace(TINY, steps=5)
    with pytest.raises(RunDirError, match="train_state.safetensors"):
        train(config, out_dir=run_dir, progress=False)


def test_invalid_config_contents(legacy_run_dir):
    payload = json.loads((legacy_run_dir / "config.json").read_text())
    payload["train"]["depth"] = -2
    (legacy_run_dir / "config.json").write_text(json.dumps(payload))
    with pytest.raises(RunDirError, match="-2"):
        repair_run(legacy_run_dir)


def test_weights_and_history_from_different_steps(legacy_run_dir):
    payload = json.loads((legacy_run_dir / "history.json").read_text())
    payload["step"] = 3
    payload["history"] = [entry for entry in payload["history"] if entry["step"] <= 3]
    (legacy_run_dir / "history.json").write_text(json.dumps(payload))
    with pytest.raises(RunDirError, match="different steps.*history.json step 3"):
        repair_run(legacy_run_dir)


def test_load_history_reads_the_history_without_the_weights(tmp_path):
    result = train(TINY, out_dir=tmp_path / "run", progress=False)
    assert strip_times(load_history(tmp_path / "run")) == strip_times(result.history)
    with pytest.raises(RunDirError, match="does not exist"):
        load_history(tmp_path / "missing")


def test_progress_is_switched_off_by_tqdm_disable(monkeypatch):
    from fvlib.training.loop import progress_shown

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert progress_shown(True) and not progress_shown(False)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert not progress_shown(True)


def test_runs_saved_before_warmup_existed_load_without_warmup(tmp_path):
    """Their config.json has no ``warmup``: read as 0 (their schedule), not today's default."""
    old = dataclasses.replace(TINY, steps=4, **ORIGINAL_RECIPE)
    first = train(old, out_dir=tmp_path, progress=False)
    (tmp_path / "manifest.json").unlink()  # such runs have none
    path = tmp_path / "config.json"
    payload = json.loads(path.read_text())
    del payload["train"]["warmup"]
    path.write_text(json.dumps(payload))
    repair_run(tmp_path, old)  # a run without manifest is read once repaired
    _, config, _ = load_run(tmp_path)
    assert config == old and config.warmup == 0.0
    again = train(old, out_dir=tmp_path, progress=False)   # resumes: the same finished run
    assert again.final_loss == first.final_loss


def test_from_dict_reads_a_config_saved_before_warmup_as_no_warmup():
    saved = {k: v for k, v in dataclasses.replace(TINY, **ORIGINAL_RECIPE).to_dict().items() if k != "warmup"}
    assert TrainConfig.from_dict(saved).warmup == 0.0
    assert TrainConfig.from_dict({"model": "B"}).warmup == RECIPE["warmup"]   # a partial dict: defaults


def test_estimate_memory_counts_what_training_holds():
    """The estimate is the float32 numbers of the evaluation set and the batch plus four copies of
    the parameters (weights, gradients, two Adam moments) and the activations of the MLPs: exact
    in its parts, and it grows with every size flag of the CLI (but ``queries`` under the
    expected loss, which draws no query tokens)."""
    from fvlib.training import build_model, estimate_memory

    config = dataclasses.replace(TINY, queries=1, inputs="tokens", expected_loss=False)
    D = 2**config.depth - 1
    model = build_model(config)
    params = sum(p.numel() for p in model.parameters())
    activations = 1.75 * config.batch * config.width * (config.hidden_layers + 1) * model.config.n_layers
    contexts = (config.eval_contexts + 3 * config.batch) * config.n_ctx * (D + 1) + 3 * config.batch * (D + 1)
    assert estimate_memory(config) == 4.0 * (contexts + 4 * params + activations)
    expected = dataclasses.replace(config, expected_loss=True)
    assert estimate_memory(expected) == estimate_memory(config) - 4.0 * 3 * config.batch * (D + 1)
    assert estimate_memory(dataclasses.replace(expected, queries=10**9)) == estimate_memory(expected)
    for name, value in (("depth", 5), ("n_ctx", 64), ("batch", 64), ("queries", 8), ("width", 64)):
        assert estimate_memory(dataclasses.replace(config, **{name: value})) > estimate_memory(config), name
    # on the pooled statistic a context is D numbers, whatever N
    statistic = dataclasses.replace(config, inputs="statistic")
    contexts = (config.eval_contexts + 3 * config.batch) * (D + 1) + 3 * config.batch * (D + 1)
    assert estimate_memory(statistic) == 4.0 * (contexts + 4 * params + activations)
    assert estimate_memory(dataclasses.replace(statistic, n_ctx=10**12)) == estimate_memory(statistic)
    wide = dataclasses.replace(config, arch="transformer", width=10**9)
    assert estimate_memory(wide) == float("inf")  # too large for torch to describe
