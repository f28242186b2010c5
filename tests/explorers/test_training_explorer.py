"""fvlib.explorers.training: the training explorer trains, stops, resumes and shows a run
(its own or an existing one), with points between the run's evaluations."""

import pytest
import torch
from conftest import strip_times

from fvlib.explorers.training import live_eval_steps, training_explorer


def _small_training_explorer(tmp_path, steps=100):
    """A tiny run: every redraw of the figure costs more than its steps, so it is evaluated
    only every 25 steps."""
    return training_explorer(
        "A", "tree", steps, depth=3, budget=3, n_ctx=32, run_root=tmp_path, reference_samples=200,
        batch=32, queries=4, width=16, eval_contexts=64, device="cpu", router_warm_start=0, eval_every=25,
    )


@pytest.mark.slow  # trains (about 10 s each on a loaded 2-core machine)
def test_training_explorer_trains_and_shows_the_run(tmp_path):
    torch.manual_seed(0)
    explorer = _small_training_explorer(tmp_path)
    assert explorer.summary["steps_done"] == 0 and "press Train" in explorer.summary["status"]
    before = explorer.updates
    explorer.start(blocking=True)
    assert explorer.summary["steps_done"] == 100 and explorer.summary["status"] == "finished"
    # one redraw per evaluation after step 0 and per extra early point, plus the final one
    assert explorer.updates == before + 4 + len(live_eval_steps(0, 25, 100)) + 1
    assert explorer.summary["final_loss"] < explorer.summary["history"][0]["eval_excess_loss"]
    assert explorer.progress.n == 100
    # another model: nothing trained yet, its own theory baseline
    explorer.controls["model"].value = "C"
    assert explorer.summary["steps_done"] == 0 and explorer.summary["theory_name"] == "lmmse"
    # back to A: the saved run is shown without retraining
    explorer.controls["model"].value = "A"
    assert explorer.summary["steps_done"] == 100


@pytest.mark.slow  # trains (about 10 s each on a loaded 2-core machine)
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


def test_training_explorer_shows_an_existing_run_of_a_base_config(tmp_path):
    from fvlib.training import TrainConfig, run_dir_for, train

    config = TrainConfig(model="C", depth=3, budget=3, n_ctx=32, steps=100, batch=32, queries=4, width=16,
                         eval_every=50, eval_contexts=64, device="cpu")
    train(config, out_dir=run_dir_for(config, tmp_path), progress=False)
    explorer = training_explorer(base=config, run_root=tmp_path, reference_samples=200)
    assert explorer.summary["steps_done"] == 100 and explorer.config() == config
    assert [h["step"] for h in explorer.summary["history"]] == [0, 50, 100]


@pytest.mark.slow  # trains (about 10 s each on a loaded 2-core machine)
def test_training_explorer_reports_a_damaged_run_instead_of_dying(tmp_path):
    explorer = _small_training_explorer(tmp_path)
    explorer.start(blocking=True)
    (explorer.run_dir() / "model.safetensors").write_bytes(b"not a checkpoint")
    explorer.start()  # background thread: the error must reach the reader, not vanish
    explorer.wait(timeout=60)
    assert explorer.summary["status"] == "failed"
    assert "Training failed" in explorer.caption.value and "model.safetensors" in explorer.caption.value
    assert not explorer.train_button.disabled  # the controls come back


def _recording(explorer):
    """Record (summary, progress n, progress total) at every redraw of the explorer."""
    frames, show = [], explorer.show

    def record(*args):
        show(*args)
        frames.append((explorer.summary, explorer.progress.n, explorer.progress.total))

    explorer.show = record
    return frames


@pytest.mark.slow  # trains (about 10 s each on a loaded 2-core machine)
def test_training_explorer_resumes_with_the_whole_curve_and_counts_this_session(tmp_path):
    from fvlib.training import train

    explorer = _small_training_explorer(tmp_path)
    config = explorer.config()
    train(config, out_dir=explorer.run_dir(), progress=False, until_step=50)  # an earlier session
    explorer.refresh()
    earlier = [h["step"] for h in explorer.summary["history"]]
    assert earlier == [0, 25, 50] and explorer.summary["steps_done"] == 50
    assert (explorer.progress.n, explorer.progress.total) == (50, 100)  # trained of total
    frames = _recording(explorer)
    explorer.start(blocking=True)
    during = frames[:-1]
    assert during and all(f[0]["status"] == "training" for f in during)
    for summary, n, total in during:
        assert [h["step"] for h in summary["history"]][:len(earlier)] == earlier  # the curve never shrinks
        assert total == 50 and n <= 50  # this session's steps against the steps still to do
    assert explorer.summary["status"] == "finished" and explorer.summary["steps_done"] == 100
    assert (explorer.progress.n, explorer.progress.total) == (100, 100)
    # the slider changes the run: its bar follows
    explorer.controls["steps"].value = 200
    assert (explorer.progress.n, explorer.progress.total) == (0, 200)


@pytest.mark.slow  # trains (about 10 s each on a loaded 2-core machine)
def test_training_explorer_shows_a_first_point_after_one_step(tmp_path):
    """The extra evaluations come at once and thin out; they are the run's own evaluation
    set (the loss train() reports when stopped there) and change nothing of the run."""
    from fvlib.training import train
    explorer = _small_training_explorer(tmp_path)
    config = explorer.config()
    assert config.eval_every == 25
    frames = _recording(explorer)
    explorer.start(blocking=True)
    first = frames[0][0]
    assert first["live"] and first["live"][0]["step"] == 1 and first["status"] == "training"
    shown = [p["step"] for f in frames for p in f[0]["live"]]
    assert sorted(set(shown)) == [1, 2, 4, 8, 16] == sorted(live_eval_steps(0, 25, 100))
    point = next(p for f in frames for p in f[0]["live"] if p["step"] == 4)
    assert point["eval_excess_loss"] == pytest.approx(train(config, progress=False, until_step=4).final_loss,
                                                      rel=1e-9)
    assert strip_times(explorer.summary["history"]) == strip_times(train(config, progress=False).history)


def test_live_eval_steps_double_up_to_the_next_evaluation():
    assert sorted(live_eval_steps(0, 250, 1500)) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert sorted(live_eval_steps(437, 250, 1500)) == [438, 439, 441, 445, 453, 469]
    assert live_eval_steps(1499, 250, 1500) == set()
    assert sorted(live_eval_steps(0, 250, 6)) == [1, 2, 4]


@pytest.mark.slow  # trains (about 10 s each on a loaded 2-core machine)
def test_training_explorer_stops_after_the_step_in_progress(tmp_path):
    """Stop acts at the next step, between evaluations; the checkpoint is there and a resumed
    run is the uninterrupted one."""
    from fvlib.training import checkpoint_step, train

    explorer = _small_training_explorer(tmp_path)
    show = explorer.show

    def stop_at_step_2(*args):
        show(*args)
        if any(p["step"] == 2 for p in explorer.summary.get("live", [])):
            explorer.stop()

    explorer.show = stop_at_step_2
    explorer.start(blocking=True)
    assert explorer.summary["steps_done"] == 2 == checkpoint_step(explorer.run_dir())
    assert [h["step"] for h in explorer.summary["history"]] == [0]  # the next evaluation is at step 25
    assert explorer.summary["status"].startswith("stopped at step 2 of 100")
    assert [p["step"] for p in explorer.summary["live"]] == [1, 2]  # the points since step 0 stay
    assert (explorer.progress.n, explorer.progress.total) == (2, 100)
    assert "it/s" not in str(explorer.progress)  # no rate between sessions
    explorer.show = show
    explorer.start(blocking=True)
    assert strip_times(explorer.summary["history"]) == strip_times(train(explorer.config(), progress=False).history)


def test_training_explorer_names_its_baseline_in_words(tmp_path):
    explorer = _small_training_explorer(tmp_path)
    legend = [t.get_text() for t in _figure_of(explorer).axes[0].get_legend().get_texts()]
    assert "theory: adaptive greedy (Bayes)" in legend
    assert "adaptive_greedy" not in explorer.caption.value
    assert "Monte Carlo, 200 contexts" in explorer.caption.value
    explorer.controls["prior"].value = "gaussian-twin"
    legend = [t.get_text() for t in _figure_of(explorer).axes[0].get_legend().get_texts()]
    assert legend == ["Gaussian closed form"]
    assert "(exact)" in explorer.caption.value and "contexts)" not in explorer.caption.value


def _figure_of(explorer):
    """The figure the explorer shows now (drawn again from its current values)."""
    return explorer._draw(**explorer.values())[0]


def test_a_tree_curriculum_is_dropped_on_a_prior_without_one(tmp_path):
    """A base run with the one recipe's tree curriculum (``alpha_start``) switched to the Gaussian
    twin is the twin's run of the same recipe: no curriculum there (it would be refused)."""
    explorer = training_explorer("A", "tree", 100, depth=3, budget=3, n_ctx=32, run_root=tmp_path,
                                 reference_samples=200, batch=32, width=16, eval_contexts=64, device="cpu",
                                 alpha_start=0.7)
    assert explorer.config().alpha_start == 0.7
    twin = explorer.config(prior="gaussian-twin")
    assert twin.alpha_start is None and twin.prior == "gaussian-twin" and twin.depth == 3
