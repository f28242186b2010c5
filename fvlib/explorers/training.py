"""The training explorer (chapter 8): model A/B/C, prior and steps: trains (in a background
thread, with a tqdm progress bar) and plots the evaluation loss against the matching theory
baseline; *Stop* checkpoints the run and *Train* resumes it. The state is
:func:`fvlib.explorers.states.training_state`."""

from __future__ import annotations

import html
import threading
from collections.abc import Mapping

import ipywidgets as widgets
from tqdm.notebook import tqdm as notebook_tqdm

from .._checks import check_int
from ..experiments.beside_theory import theory_reference
from ..families import DEFAULT_FAMILY, get_family
from ..plots.explorers import plot_training_run
from ..plots.training import theory_label
from ..priors import get_prior_kind, prior_kinds
from ..training import (
    EVAL_SEED_OFFSET,
    RunDirError,
    TrainConfig,
    build_prior,
    checkpoint_step,
    evaluate,
    load_history,
    run_dir_for,
    train,
)
from .base import Explorer, slider
from .live import LiveSpec
from .states import training_live, training_state

__all__ = ["TrainingExplorer", "training_explorer", "describe_reference", "live_eval_steps"]


def describe_reference(reference: Mapping) -> str:
    """The theory baseline in words: ``theory: adaptive greedy (Bayes) = 0.0123 (Monte Carlo,
    4000 contexts)``, or ``(exact)`` for a closed form."""
    how = f"Monte Carlo, {reference['samples']} contexts" if reference["samples"] else "exact"
    return f"{theory_label(reference['name'])} = {reference['value']:.4f} ({how})"


def live_eval_steps(start: int, eval_every: int, steps: int) -> set[int]:
    """The steps at which the training explorer evaluates a run *between* the run's own
    evaluations, for a session that starts at step ``start``: ``start + 1, start + 2, start + 4,
    ...`` until the run's next own evaluation (so the first point comes after one step and the
    points thin out as the regular ones take over). These points are shown, never saved: the
    run's history and its schedule stay those of a run trained without the explorer."""
    following = (start // eval_every + 1) * eval_every
    ahead, found = 1, set()
    while start + ahead < min(following, steps):
        found.add(start + ahead)
        ahead *= 2
    return found


class TrainingExplorer(Explorer):
    """The training explorer: an :class:`~fvlib.explorers.base.Explorer` with *Train* and *Stop* buttons.

    Runs are kept in ``run_dir_for(config, run_root)``; a run that exists (e.g. trained by a
    chapter) is shown at once, *Stop* checkpoints the run within a step and *Train* resumes it.
    The figure always shows the run's whole recorded curve, and while training also the
    evaluations of ``live_eval_steps`` (open markers): a first point after one step.

    Attributes:
        progress: the tqdm (notebook) bar: between sessions the run's steps trained out of its
            total, while training this session's steps out of the steps still to do (so its
            rate is this session's).
        result: the last :class:`fvlib.training.loop.TrainResult`, or ``None``.
    """

    def __init__(self, base: TrainConfig, run_root, reference_samples: int, fixed_eval: bool = False):
        self.base, self.run_root, self.reference_samples = base, run_root, reference_samples
        self.fixed_eval = fixed_eval
        model, prior, steps = base.model, base.prior, base.steps
        self._references: dict = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._training = False
        self._extra: dict[str, list[dict]] = {}  # run directory -> its points between evaluations
        self.result = None
        self.progress = notebook_tqdm(total=steps, display=False, desc="steps trained", leave=True)
        self.train_button = widgets.Button(description="Train", button_style="success", icon="play")
        self.stop_button = widgets.Button(description="Stop", button_style="warning", icon="stop", disabled=True)
        self.train_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop())
        controls = {
            "model": widgets.Dropdown(options=list(get_family(DEFAULT_FAMILY).models), value=model,
                                      description="model"),
            "prior": widgets.Dropdown(options=list(prior_kinds()), value=prior, description="prior"),
            "steps": slider(widgets.IntSlider, steps, 100, 5000, 100, "steps"),
        }
        super().__init__("Training explorer: a model against its theory baseline", controls, self._draw_current,
                         buttons=(self.train_button, self.stop_button), live=self._live)
        self.children = (*self.children, self.progress.container)

    # -- configuration ---------------------------------------------------------------------
    def config(self, model: str | None = None, prior: str | None = None, steps: int | None = None) -> TrainConfig:
        """The :class:`~fvlib.training.config.TrainConfig` at the current control values (or at the
        ``model``, ``prior`` and ``steps`` given)."""
        values = self.values()
        model, prior = values["model"] if model is None else model, values["prior"] if prior is None else prior
        steps = values["steps"] if steps is None else steps
        data = self.base.to_dict() | {"model": model, "prior": prior, "steps": steps}
        if not get_prior_kind(prior).is_tree:
            data["alpha_start"] = None   # the curriculum acts on a tree's decay only (the one recipe's rule)
        if not self.fixed_eval:
            data["eval_every"] = data["checkpoint_every"] = max(steps // 20, 1)
        return TrainConfig.from_dict(data)

    def _recorded(self, config: TrainConfig) -> list[dict]:
        try:
            return load_history(run_dir_for(config, self.run_root))
        except RunDirError:
            return []

    def _live(self) -> LiveSpec:
        """The static page's grid (:func:`fvlib.explorers.states.training_live`): the recorded
        run of every model and prior at the current steps (those never trained are left out),
        played back step by step."""
        steps = self.values()["steps"]
        options = {name: tuple(self.controls[name].options) for name in ("model", "prior")}
        states = {(m, p): training_state(config, history, self.reference(config))
                  for m in options["model"] for p in options["prior"]
                  for config in [self.config(m, p, steps)] for history in [self._recorded(config)] if history}
        return training_live(states, options["model"], options["prior"], self.values(), self.base)

    def run_dir(self):
        return run_dir_for(self.config(), self.run_root)

    def reference(self, config: TrainConfig) -> dict:
        key = (config.model, config.prior)
        if key not in self._references:
            self._references[key] = theory_reference(config, samples=self.reference_samples)
        return self._references[key]

    def saved_history(self) -> list[dict]:
        """History of the run at the current settings if it has been (partly) trained, else ``[]``."""
        try:
            return load_history(self.run_dir())
        except RunDirError:
            return []

    def steps_done(self) -> int:
        """The steps the run at the current settings has been trained (its checkpoint), else 0."""
        try:
            return checkpoint_step(self.run_dir())
        except RunDirError:
            return 0

    # -- drawing -------------------------------------------------------------------------
    def _draw_current(self, model: str, prior: str, steps: int, history: list[dict] | None = None,
                      status: str | None = None, done: int | None = None):
        config = self.config()
        history = self.saved_history() if history is None else history
        done = self.steps_done() if done is None else done
        # this explorer's points between evaluations, after the last saved one (a stopped run's)
        live = [p for p in self._extra.get(str(self.run_dir()), []) if p["step"] <= done]
        reference = self.reference(config)
        if status is None:
            status = ("not trained yet: press Train" if not done else "finished" if done >= steps
                      else f"trained {done} of {steps} steps: press Train to resume")
        live = [p for p in live if not history or p["step"] > history[-1]["step"]]
        state = training_state(config, history, reference)
        summary = {"config": config.to_dict(), "steps_done": done, "final_loss": state["loss"][-1] if state else None,
                   "theory": reference["value"], "theory_name": reference["name"], "history": history,
                   "live": live, "status": status}
        caption = f"Theory baseline: {describe_reference(reference)}. "
        if state:
            caption += (f"Step {state['steps'][-1]}: excess loss {summary['final_loss']:.4f} on "
                        f"{config.eval_contexts} held-out contexts. ")
        if live:
            caption += f"Step {live[-1]['step']} (between evaluations): {live[-1]['eval_excess_loss']:.4f}. "
        caption += f"Status: {status}. Runs are saved in {self.run_dir()}."
        return plot_training_run(config, history, reference, status, live=live), summary, caption

    def refresh(self) -> None:
        super().refresh()
        if not self._training:
            self._show_progress()

    def _show_progress(self) -> None:
        """Between sessions: the run's steps trained out of its total (no rate)."""
        self.progress.bar_format = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}"
        self.progress.reset(total=self.values()["steps"])
        self.progress.set_description("steps trained", refresh=False)
        self.progress.n = self.summary.get("steps_done", 0)
        self.progress.refresh()

    # -- training ------------------------------------------------------------------------
    def start(self, blocking: bool = False) -> None:
        """Train (or resume) the run at the current settings; in a background thread unless
        ``blocking``. Does nothing while a run is in progress."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._set_running(True)
        if blocking:
            self._train()
        else:
            self._thread = threading.Thread(target=self._train, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Ask the run to stop after the step in progress (it is checkpointed; *Train* resumes it)."""
        self._stop.set()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the background run (if any) has finished."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _set_running(self, running: bool) -> None:
        self._training = running
        self.train_button.disabled = running
        self.stop_button.disabled = not running
        for control in self.controls.values():
            control.disabled = running

    def _train(self) -> None:
        config, values = self.config(), self.values()
        history, done = self.saved_history(), self.steps_done()
        live = self._extra.setdefault(str(self.run_dir()), [])
        live[:] = [p for p in live if 0 < p["step"] <= done]  # none of another run in this directory
        extra = live_eval_steps(done, config.eval_every, config.steps)
        self.progress.bar_format = None
        self.progress.reset(total=config.steps - done)  # this session's steps, its own rate
        self.progress.set_description("steps to go", refresh=False)
        prior = build_prior(config)

        def redraw(step: int) -> None:
            self.show(*self._draw_current(**values, history=list(history), status="training", done=step))

        def on_eval(entry: dict) -> None:
            history.append(entry)
            self.progress.set_postfix(excess=f"{entry['eval_excess_loss']:.4f}", refresh=False)
            redraw(entry["step"])

        def on_step(step: int, model) -> bool:
            self.progress.update(1)
            if step in extra and not self._stop.is_set():
                result = evaluate(model, prior, config.n_ctx, config.noise_std, contexts=config.eval_contexts,
                                  seed=config.effective_data_seed + EVAL_SEED_OFFSET,  # the run's own set,
                                  statistic=config.statistic)  # read as the run reads it
                live.append({"step": step, "eval_excess_loss": result["excess_loss"]})
                redraw(step)
            return self._stop.is_set()

        try:
            self.result = train(config, out_dir=self.run_dir(), progress=False, callback=on_eval, on_step=on_step)
        except (ValueError, OSError) as err:  # RunDirError is a ValueError: a damaged run directory
            self.caption.value = html.escape(f"Training failed: {err}")
            self.summary["status"] = "failed"
            return
        finally:
            self._set_running(False)
        done = self.steps_done()
        status = ("finished" if done >= config.steps
                  else f"stopped at step {done} of {config.steps}: press Train to resume")
        self.show(*self._draw_current(**values, history=self.result.history, status=status, done=done))
        self._show_progress()


def training_explorer(
    model: str = "A",
    prior: str = "tree",
    steps: int = 600,
    *,
    base: TrainConfig | None = None,
    depth: int = 4,
    budget: int = 4,
    n_ctx: int = 128,
    noise_std: float = 0.0,
    run_root=None,
    reference_samples: int = 2000,
    **config,
) -> TrainingExplorer:
    """Model A/B/C, prior (``tree``, ``gaussian-twin``, ``gaussian``) and steps: press *Train* to
    train with a progress bar; the figure shows the evaluation loss against the matching theory
    baseline (:func:`fvlib.experiments.beside_theory.theory_reference`, ``reference_samples`` contexts).

    The other settings are fixed when the explorer is made: either all of them from ``base``
    (a :class:`~fvlib.training.config.TrainConfig`, e.g. one of the book's shared runs; ``model``,
    ``prior`` and ``steps`` then start at its values and it keeps its ``eval_every``), or
    ``depth``, ``budget``, ``n_ctx``, ``noise_std`` and any other ``TrainConfig`` field in
    ``config`` (``eval_contexts`` defaults to 512 here, and unless ``eval_every`` is given the
    run is evaluated 20 times). The defaults train model A in about 30 s on one CPU core.
    Runs are saved under ``run_root`` (default: as :func:`fvlib.training.config.run_dir_for`), so a run
    a chapter trained is shown without retraining. ``summary`` holds ``config``,
    ``steps_done``, ``final_loss``, ``theory``, ``theory_name``, ``history`` and ``status``.
    """
    if base is not None:
        if not isinstance(base, TrainConfig):
            raise ValueError(f"base must be a TrainConfig, got {base!r}")
        model, prior, steps, fixed_eval = base.model, base.prior, base.steps, True
    else:
        check_int("steps", steps, 100, 5000)
        base = TrainConfig.from_dict({"model": model, "prior": prior, "steps": steps, "depth": depth,
                                      "budget": budget, "n_ctx": n_ctx, "noise_std": noise_std,
                                      "eval_contexts": 512, **config})
        fixed_eval = "eval_every" in config
    check_int("steps", steps, 100, 5000)
    check_int("reference_samples", reference_samples, 2, 100_000)
    return TrainingExplorer(base, run_root, reference_samples, fixed_eval)
