"""The command-line contract of the book's appendix *Conventions*, section "The command line":
what each subcommand computes and prints (through ``python -m fvlib``, ``conftest.run_cli``, or in-process
through :func:`fvlib.cli.main`)."""

import json

import pytest
from conftest import run_cli

THEORY = ["theory", "--prior", "tree", "--depth", "4", "--alpha", "0.5", "--n-ctx", "64", "--noise-std", "0.1",
          "--budget", "4"]
KEYS = {"tau2", "adaptive_greedy", "nonadaptive_coord", "lmmse", "gaussian_twin", "noisefree_adaptive",
        "noisefree_nonadaptive"}


def test_theory_json_has_exactly_the_contract_keys():
    out = run_cli(*THEORY, "--samples", "500", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result) == KEYS
    assert result["tau2"] == pytest.approx((1 + 0.5 + 0.25 + 0.125 + 0.01) / 64)
    assert result["noisefree_adaptive"] == 0.0


def test_theory_optional_keys():
    out = run_cli("theory", "--depth", "3", "--n-ctx", "128", "--budget", "2", "--samples", "300",
                  "--dp", "--optimised", "--stderr", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert {"nonadaptive_opt", "adaptive_opt", "dp_optimal", "dp_no_repeat", "stderr", "samples"} <= set(result)
    assert {"adaptive_opt", "nonadaptive_opt"} <= set(result["stderr"])
    assert result["samples"] == 300
    assert result["dp_optimal"] <= result["dp_no_repeat"] + 1e-9


def test_train_then_patch_round_trip(tmp_path):
    run = tmp_path / "run"
    out = run_cli("train", "--model", "A", "--prior", "tree", "--depth", "3", "--alpha", "0.5", "--n-ctx", "32",
                  "--budget", "3", "--steps", "40", "--router-warm-start", "0", "--out", str(run), "--json",
                  "--no-progress")
    assert out.returncode == 0, out.stderr
    trained = json.loads(out.stdout)
    assert {"final_loss", "seconds", "checkpoint"} <= set(trained)
    assert (run / "model.safetensors").is_file() and (run / "config.json").is_file()
    out = run_cli("patch", "--run", str(run), "--contexts", "30", "--json")
    assert out.returncode == 0, out.stderr
    patched = json.loads(out.stdout)
    assert {"baseline", "loss", "theory_loss"} <= set(patched)
    assert len(patched["loss"]) == 3 and len(patched["loss"][0]) == 3  # rows m = 1..K, columns l = 1..L
    assert len(patched["theory_loss"]) == 3


@pytest.mark.slow  # trains six models (about 20 s)
def test_reproduce_quick_writes_every_result_file(tmp_path):
    out = run_cli("reproduce", "--quick", "--out", str(tmp_path), "--no-progress")
    assert out.returncode == 0, out.stderr
    for name in ("theory", "dp", "models", "patching"):
        data = json.loads((tmp_path / f"{name}.json").read_text())
        assert data
    models = json.loads((tmp_path / "models.json").read_text())
    assert set(models) == {f"{k}/{p}" for k in "ABC" for p in ("tree", "gaussian-twin")}
    assert all(entry["model"] > 0 and entry["contexts"] == 200 for entry in models.values())


def test_train_uses_the_trainconfig_recipe_and_takes_overrides(tmp_path):
    """Without recipe flags the run has the learning recipe (fvlib.training.LEARNING_RECIPE: RECIPE,
    batch 512, expected loss; on the tree a curriculum), and a flag overrides it."""
    from fvlib.training import LEARNING_RECIPE, load_run

    common = ["train", "--model", "C", "--depth", "2", "--n-ctx", "8", "--budget", "2", "--steps", "5",
              "--no-progress", "--json"]
    out = run_cli(*common, "--out", str(tmp_path / "a"))
    assert out.returncode == 0, out.stderr
    config = load_run(tmp_path / "a")[1]
    assert {k: getattr(config, k) for k in LEARNING_RECIPE} == LEARNING_RECIPE and config.batch == 512
    assert config.alpha_start == 0.7 and config.router_warm_start == 0
    out = run_cli(*common, "--out", str(tmp_path / "b"), "--lr", "0.003", "--warmup", "0",
                  "--no-expected-loss", "--queries", "64")
    assert out.returncode == 0, out.stderr
    config = load_run(tmp_path / "b")[1]
    assert (config.lr, config.warmup, config.queries) == (0.003, 0.0, 64)


def test_train_transformer_defaults_are_the_transformer_recipe(tmp_path):
    """--arch transformer without recipe flags trains with TRANSFORMER_RECIPE (the constrained
    models' learning rate diverges there); a flag still overrides it."""
    from fvlib.training import TRANSFORMER_RECIPE, load_run, recipe_for

    common = ["train", "--arch", "transformer", "--model", "A", "--depth", "2", "--n-ctx", "8",
              "--budget", "2", "--steps", "3", "--no-progress", "--json"]
    out = run_cli(*common, "--out", str(tmp_path / "a"))
    assert out.returncode == 0, out.stderr
    config = load_run(tmp_path / "a")[1]
    assert {k: getattr(config, k) for k in TRANSFORMER_RECIPE} == TRANSFORMER_RECIPE
    out = run_cli(*common, "--out", str(tmp_path / "b"), "--lr", "0.001", "--width", "16")
    assert out.returncode == 0, out.stderr
    config = load_run(tmp_path / "b")[1]
    assert (config.lr, config.width, config.batch) == (0.001, 16, TRANSFORMER_RECIPE["batch"])
    assert recipe_for("transformer-open") == TRANSFORMER_RECIPE
    with pytest.raises(ValueError, match="'rnn'"):
        recipe_for("rnn")


def test_train_router_warm_start_flags(tmp_path):
    """The two flags set the recipe's router fields, and 0 steps turn the warm start off."""
    from fvlib.training import load_run

    common = ["train", "--model", "A", "--depth", "2", "--n-ctx", "8", "--budget", "2", "--steps", "3",
              "--batch", "8", "--width", "8", "--no-progress", "--json"]
    out = run_cli(*common, "--out", str(tmp_path / "a"), "--router-warm-start", "5", "--router-lr-scale", "0.5")
    assert out.returncode == 0, out.stderr
    config = load_run(tmp_path / "a")[1]
    assert (config.router_warm_start, config.router_lr_scale, config.warm_starts) == (5, 0.5, True)
    out = run_cli(*common, "--out", str(tmp_path / "b"), "--router-warm-start", "0")
    assert out.returncode == 0, out.stderr
    assert not load_run(tmp_path / "b")[1].warm_starts


def test_train_has_no_teacher_by_default_and_short_runs_train_their_steps(tmp_path, monkeypatch):
    """`train` with its defaults has no teacher: a K = 3 model A on the tree with --steps 40
    fits no warm start and takes exactly 40 optimiser steps. --imitation turns on the
    imitation warm start (IMITATION_RECIPE's 600 regression steps, here spied on, not run),
    and each run's config.json says which start it had."""
    import fvlib.training.loop as train_module
    from fvlib.cli import main
    from fvlib.training import IMITATION_RECIPE, load_run

    warm_starts, steps = [], []
    real_step = train_module.training_step
    monkeypatch.setattr(train_module, "warm_start_router", lambda *a, **kw: warm_starts.append(kw["steps"]))
    monkeypatch.setattr(train_module, "training_step", lambda *a, **kw: steps.append(1) or real_step(*a, **kw))
    common = ["train", "--model", "A", "--depth", "3", "--n-ctx", "32", "--budget", "3", "--steps", "40",
              "--batch", "32", "--width", "32", "--device", "cpu", "--no-progress", "--json"]
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert warm_starts == [] and len(steps) == 40
    saved = json.loads((tmp_path / "plain" / "config.json").read_text())["train"]
    assert (saved["router_warm_start"], saved["lr"], saved["warmup"]) == (0, 1e-2, 0.05)
    assert not load_run(tmp_path / "plain")[1].warm_starts
    steps.clear()
    assert main([*common, "--imitation", "--out", str(tmp_path / "imitation")]) == 0
    assert warm_starts == [IMITATION_RECIPE["router_warm_start"]] == [600] and len(steps) == 40
    saved = json.loads((tmp_path / "imitation" / "config.json").read_text())["train"]
    assert (saved["router_warm_start"], saved["router_lr_scale"]) == (600, 0.1)
    assert load_run(tmp_path / "imitation")[1].warm_starts


