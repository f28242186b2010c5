"""The explorers build and react headless: change a control, check that the figure changed."""

import base64

import pytest
import torch

from fvlib import TreePrior, widgets
from fvlib.models import model_a


def _changed(explorer, name, value):
    """Set one control; return (updates before, updates after, png before, png after)."""
    before, png = explorer.updates, explorer.image.value
    explorer.controls[name].value = value
    return before, explorer.updates, png, explorer.image.value


def test_all_explorers_are_exported():
    for name in ("prior_explorer", "strategy_explorer", "training_explorer", "patching_explorer"):
        assert name in widgets.__all__
        assert callable(getattr(widgets, name))


def test_prior_explorer_redraws_for_a_new_depth():
    explorer = widgets.prior_explorer()
    assert explorer.summary["dim"] == 15 and explorer.summary["nonzero"] == 4
    before, after, old_png, new_png = _changed(explorer, "depth", 5)
    assert after == before + 1 and new_png != old_png
    assert explorer.summary["dim"] == 31 and explorer.summary["nonzero"] == 5
    assert "D = 31" in explorer.caption.value
    # the twin has the tree's energy per coordinate on average, not one non-zero per level
    assert sum(v != 0 for v in explorer.summary["twin_theta"]) == 31


def test_prior_explorer_alpha_scales_the_sample():
    explorer = widgets.prior_explorer(depth=3, alpha=0.5)
    level2 = max(abs(v) for v in explorer.summary["theta"][3:])  # coordinates 3..6 are level 2
    explorer.controls["alpha"].value = 0.25
    new_level2 = max(abs(v) for v in explorer.summary["theta"][3:])
    assert level2 == pytest.approx(0.5) and new_level2 == pytest.approx(0.25)  # alpha^(k/2), k = 2


def test_strategy_explorer_noise_hurts_adaptive_inference():
    explorer = widgets.strategy_explorer(depth=4, budget=4, samples=300)
    clean = explorer.summary["final"]
    assert clean["adaptive_greedy"] < clean["nonadaptive_coord"] < clean["lmmse"]
    before, after, old_png, new_png = _changed(explorer, "noise_std", 1.5)
    assert after == before + 1 and new_png != old_png
    assert explorer.summary["final"]["adaptive_greedy"] > clean["adaptive_greedy"]
    assert explorer.summary["tau2"] > 0.01


def test_strategy_explorer_budget_sets_the_curve_length():
    explorer = widgets.strategy_explorer(depth=4, budget=3, samples=200)
    assert explorer.summary["budgets"] == [1, 2, 3]
    explorer.controls["budget"].value = 5
    assert explorer.summary["budgets"] == [1, 2, 3, 4, 5]
    assert len(explorer.summary["mean"]["lmmse"]) == 5


def _small_training_explorer(tmp_path, steps=100):
    return widgets.training_explorer(
        "A", "tree", steps, depth=3, budget=3, n_ctx=32, run_root=tmp_path, reference_samples=200,
        batch=32, queries=4, width=16, eval_contexts=64, device="cpu",
    )


def test_training_explorer_trains_and_shows_the_run(tmp_path):
    torch.manual_seed(0)
    explorer = _small_training_explorer(tmp_path)
    assert explorer.summary["steps_done"] == 0 and "press Train" in explorer.summary["status"]
    before = explorer.updates
    explorer.start(blocking=True)
    assert explorer.summary["steps_done"] == 100 and explorer.summary["status"] == "finished"
    assert explorer.updates >= before + 20  # one redraw per evaluation, plus the final one
    assert explorer.summary["final_loss"] < explorer.summary["history"][0]["eval_excess_loss"]
    assert explorer.progress.n == 100
    # another model: nothing trained yet, its own theory baseline
    explorer.controls["model"].value = "C"
    assert explorer.summary["steps_done"] == 0 and explorer.summary["theory_name"] == "lmmse"
    # back to A: the saved run is shown without retraining
    explorer.controls["model"].value = "A"
    assert explorer.summary["steps_done"] == 100


def test_training_explorer_stops_and_resumes(tmp_path):
    explorer = _small_training_explorer(tmp_path)
    explorer.start()  # background thread
    explorer.stop()
    explorer.wait(timeout=120)
    stopped_at = explorer.summary["steps_done"]
    assert 0 < stopped_at < 100 and "stopped" in explorer.summary["status"]
    assert not explorer.train_button.disabled and explorer.stop_button.disabled
    explorer.start(blocking=True)  # resumes from the checkpoint
    history = explorer.summary["history"]
    assert history[-1]["step"] == 100
    assert [h["step"] for h in history] == sorted({h["step"] for h in history})  # no step evaluated twice


def test_patching_explorer_theory_reacts_to_layer_and_split():
    explorer = widgets.patching_explorer(TreePrior(3, 0.5), contexts=200, noise_std=0.5, layer=1)
    assert explorer.summary["ratio"] == pytest.approx(1.0, abs=0.05)  # l <= m: the patch is harmless
    before, after, old_png, new_png = _changed(explorer, "layer", 3)
    assert after == before + 1 and new_png != old_png
    assert explorer.summary["ratio"] > 3  # l > m: the target is routed off its path
    # level by level: levels above the patched layer's node keep the target's coefficients
    assert explorer.summary["target_overlap"][0] == pytest.approx(1.0, abs=0.05)
    assert explorer.summary["target_overlap"][2] < 0.9
    explorer.controls["split_level"].value = 3
    assert explorer.summary["ratio"] == pytest.approx(1.0, abs=0.05)


def test_patching_explorer_with_a_model():
    torch.manual_seed(0)
    model = model_a(7, 3, width=16)
    explorer = widgets.patching_explorer(TreePrior(3, 0.5), model=model, contexts=50, layer=2)
    assert set(explorer.summary) >= {"ratio", "row", "target_overlap", "donor_overlap"}
    before, after, _, _ = _changed(explorer, "split_level", 2)
    assert after == before + 1 and explorer.summary["split_level"] == 2


def test_static_html_shows_the_figure_settings_and_live_note():
    explorer = widgets.prior_explorer(depth=3)
    bundle = explorer._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # live in Jupyter / Colab
    page = bundle["text/html"]
    png = base64.b64encode(explorer.image.value).decode()
    assert png in page and "depth = 3" in page and widgets.LIVE_NOTE in page


@pytest.mark.parametrize(
    ("factory", "kwargs", "bad"),
    [
        (widgets.prior_explorer, {"depth": 9}, "9"),
        (widgets.prior_explorer, {"alpha": -0.5}, "-0.5"),
        (widgets.strategy_explorer, {"n_ctx": 100}, "100"),
        (widgets.strategy_explorer, {"depth": 3, "budget": 8}, "8"),
        (widgets.patching_explorer, {"layer": 7}, "7"),
        (widgets.training_explorer, {"model": "D"}, "'D'"),
    ],
)
def test_bad_settings_name_the_value(factory, kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        factory(**kwargs)


def test_training_explorer_shows_an_existing_run_of_a_base_config(tmp_path):
    from fvlib.train import TrainConfig, run_dir_for, train

    config = TrainConfig(model="C", depth=3, budget=3, n_ctx=32, steps=100, batch=32, queries=4, width=16,
                         eval_every=50, eval_contexts=64, device="cpu")
    train(config, out_dir=run_dir_for(config, tmp_path), progress=False)
    explorer = widgets.training_explorer(base=config, run_root=tmp_path, reference_samples=200)
    assert explorer.summary["steps_done"] == 100 and explorer.config() == config
    assert [h["step"] for h in explorer.summary["history"]] == [0, 50, 100]


def test_training_explorer_reports_a_damaged_run_instead_of_dying(tmp_path):
    explorer = _small_training_explorer(tmp_path)
    explorer.start(blocking=True)
    (explorer.run_dir() / "model.safetensors").write_bytes(b"not a checkpoint")
    explorer.start()  # background thread: the error must reach the reader, not vanish
    explorer.wait(timeout=60)
    assert explorer.summary["status"] == "failed"
    assert "Training failed" in explorer.caption.value and "model.safetensors" in explorer.caption.value
    assert not explorer.train_button.disabled  # the controls come back
