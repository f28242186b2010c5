"""Interactive explorers (ipywidgets) for readers who want to turn the knobs.

Each explorer is a function with defaults that returns an :class:`Explorer`: an ipywidgets
``VBox`` with controls on top and the figure below. Changing a control redraws the figure
(as a PNG in a ``widgets.Image``) and updates ``summary`` -- the numbers the figure shows --
so tests and notebooks can check what an explorer displays without a browser.

* :func:`prior_explorer` -- tree depth ``K`` and decay ``alpha``: the tree, a sampled
  ``theta`` and a draw from its Gaussian twin (same second moments, no hierarchy).
* :func:`strategy_explorer` -- budget, ``alpha``, context length ``N`` and label noise:
  Monte Carlo theory curves of the adaptive greedy, non-adaptive and LMMSE strategies.
* :func:`training_explorer` -- model A/B/C, prior and steps: trains (in a background thread,
  with a tqdm progress bar) and plots the evaluation loss against the matching theory
  baseline; *Stop* checkpoints the run and *Train* resumes it.
* :func:`patching_explorer` -- split level ``m`` and layer ``l``: the key-patching heatmap,
  its row ``m``, and what patching cell ``(m, l)`` does to each level of the prediction.
* :func:`dp_policy_explorer` -- channel noise ``tau``: the optimal two-layer DP policy against
  greedy (chapter 4).
* :func:`layer_split_explorer` -- budget ``M``, layers ``L`` and ``alpha``: the tree against
  its Gaussian twin as ``M`` is split into ``L`` layers (chapter 5).

Each explorer draws the state of :mod:`fvlib.explorers.states` at its current control values
(:func:`~fvlib.explorers.states.prior_state`, :func:`~fvlib.explorers.states.strategy_state`,
:func:`~fvlib.explorers.states.training_state`, :func:`~fvlib.explorers.states.patching_state`,
:func:`~fvlib.explorers.states.dp_policy_state`, :func:`~fvlib.explorers.states.layer_split_state`:
control values -> plain JSON-able numbers) with a figure function of :mod:`fvlib.plots.explorers`.

Static pages (the rendered book) cannot run Python, so every explorer also carries an HTML
view (``text/html`` in its display bundle), which the book's ``_config.yml`` tells myst-nb to
render instead of the widget: the figure at the current settings, the settings themselves and
a note that the controls are live in Jupyter or Colab, and -- when the book is built -- the
explorer's states on a grid of control values (:mod:`fvlib.explorers.live`; the grids are those
of :mod:`fvlib.explorers.states`), which the page's JavaScript draws as the reader moves its
controls. The widget and the grid call the same state function, so the page shows the numbers
the widget shows. A reader without JavaScript (and a printed page) sees the figure.

An explorer computes (samples, sweeps, trains, patches) and leaves the drawing to the figure
functions of :mod:`fvlib.plots.explorers`, which a chapter can call on the same results. They
draw on ``matplotlib.figure.Figure`` objects (no pyplot state), which keeps redraws from
background threads safe and leaves the notebook's own figures alone.
"""

from __future__ import annotations

import base64
import html
import io
import threading
from collections.abc import Callable, Mapping

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure
from tqdm.notebook import tqdm as notebook_tqdm

from .._checks import check_int, check_number
from ..experiments.beside_theory import theory_reference
from ..interventions import key_patching_sweep, patch_level_effect
from ..plots.explorers import (plot_dp_policy_state, plot_layer_split_state, plot_patching_cell, plot_prior_sample,
                               plot_strategy_curves, plot_training_run)
from ..plots.training import theory_label
from ..priors import TreePrior
from ..theory import DecaySweep, PatchingResult, theory_patching_sweep
from ..training import (EVAL_SEED_OFFSET, RunDirError, TrainConfig, build_prior, checkpoint_step, evaluate, load_history,
                        run_dir_for, train)
from .live import LiveSpec, live_block, live_enabled
from .states import (DP_POLICY_GRID, EXPLORER_STRATEGIES, LAYER_SPLIT_GRID, dp_policy_live, dp_policy_state,
                     layer_split_live, layer_split_state, patching_live, patching_state, prior_live, prior_state,
                     strategy_live, strategy_state, training_live, training_state)

__all__ = [
    "Explorer",
    "TrainingExplorer",
    "LIVE_NOTE",
    "prior_explorer",
    "strategy_explorer",
    "training_explorer",
    "patching_explorer",
    "dp_policy_explorer",
    "layer_split_explorer",
]

#: The note under every explorer in the static HTML.
LIVE_NOTE = (
    "This explorer is live in Jupyter or Colab (use the Colab button at the top of the page); "
    "this page shows it at the settings listed above."
)

#: Draw function of an explorer: control values -> (figure, summary numbers, one-line caption).
DrawFn = Callable[..., tuple[Figure, dict, str]]


def figure_png(figure: Figure, dpi: int = 96) -> bytes:
    """The figure as PNG bytes (tight bounding box)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return buffer.getvalue()


def _describe(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


class Explorer(widgets.VBox):
    """Controls above a figure; every change of a control redraws the figure.

    Args:
        title: one line shown above the controls.
        controls: ``{name: widget}``; each widget's ``value`` is passed to ``draw`` as the
            keyword ``name``.
        draw: ``draw(**values) -> (Figure, summary, caption)``.
        buttons: extra widgets shown next to the controls (e.g. Train / Stop).
        live: the explorer's grid for the static page (:class:`fvlib.explorers.live.LiveSpec`, or a
            function returning one, called when the grid is first needed).

    Attributes:
        controls: the control widgets by name.
        image: ``widgets.Image`` with the current figure (PNG).
        caption: ``widgets.HTML`` with the caption of the current figure.
        summary: the numbers behind the current figure (a dict; keys depend on the explorer).
        updates: how many times the figure has been drawn.
    """

    def __init__(self, title: str, controls: Mapping[str, widgets.Widget], draw: DrawFn, buttons=(),
                 live: LiveSpec | Callable[[], LiveSpec] | None = None):
        self.title = title
        self.live = live
        self._live_block: str | None = None
        self.controls = dict(controls)
        # the figure at its natural size (a column box would stretch it to the output's width,
        # blurring it), shrunk with its aspect ratio kept where the output is narrower
        self.image = widgets.Image(format="png", layout=widgets.Layout(max_width="100%", height="auto",
                                                                       align_self="flex-start"))
        self.caption = widgets.HTML()
        self.summary: dict = {}
        self.updates = 0
        self._draw = draw
        row = widgets.HBox(list(self.controls.values()) + list(buttons), layout=widgets.Layout(flex_flow="row wrap"))
        super().__init__([widgets.HTML(f"<b>{html.escape(title)}</b>"), row, self.image, self.caption])
        for control in self.controls.values():
            control.observe(self._on_change, names="value")
        self.refresh()

    def values(self) -> dict:
        """The current control values, ``{name: value}``."""
        return {name: control.value for name, control in self.controls.items()}

    def refresh(self) -> None:
        """Redraw the figure at the current control values."""
        self.show(*self._draw(**self.values()))

    def show(self, figure: Figure, summary: dict, caption: str) -> None:
        """Display a drawn figure with its summary and caption."""
        self.image.value = figure_png(figure)
        self.summary = dict(summary)
        self.caption.value = html.escape(caption)
        self.updates += 1

    def _on_change(self, change) -> None:
        self.refresh()

    def live_spec(self) -> LiveSpec | None:
        """The explorer's grid for the static page, or ``None`` if it has none."""
        return self.live() if callable(self.live) else self.live

    def live_html(self) -> str:
        """The live block of the static page (:func:`fvlib.explorers.live.live_block`; computed once),
        or ``""`` for an explorer without a grid."""
        if self._live_block is None:
            spec = self.live_spec()
            self._live_block = "" if spec is None else live_block(spec)
        return self._live_block

    def static_html(self, live: bool | None = None) -> str:
        """The HTML view: title, then settings, current figure (PNG), caption and
        :data:`LIVE_NOTE` (what a reader without JavaScript sees), then with ``live`` (default:
        :func:`fvlib.explorers.live.live_enabled`, i.e. while the book is built) the grid the page's
        JavaScript draws, in place of the figure."""
        live = live_enabled() if live is None else live
        settings = ", ".join(f"{name} = {_describe(value)}" for name, value in self.values().items())
        png = base64.b64encode(self.image.value).decode("ascii")
        return (
            '<div class="fvlib-explorer">'
            f'<p class="fvlib-explorer-title"><strong>{html.escape(self.title)}</strong></p>'
            '<div class="fvlib-explorer-static">'
            f"<p>Settings: {html.escape(settings)}</p>"
            f'<img src="data:image/png;base64,{png}" alt="{html.escape(self.title)}" style="max-width:100%"/>'
            f"<p>{self.caption.value}</p>"
            f'<p class="fvlib-explorer-note"><em>{html.escape(LIVE_NOTE)}</em></p>'
            "</div>"
            f"{self.live_html() if live else ''}"
            "</div>"
        )

    def _repr_mimebundle_(self, **kwargs):
        # ipywidgets 8 displays widgets through this method; ipywidgets 7 (still on some Colab
        # images) uses _ipython_display_ instead and never calls it.
        parent = getattr(super(), "_repr_mimebundle_", None)
        bundle = parent(**kwargs) if parent is not None else {"text/plain": repr(self)}
        bundle["text/html"] = self.static_html()
        return bundle


def _slider(kind, value, low, high, step, description: str, readout_format: str | None = None):
    """A continuous-update-off slider (one redraw per release, not per pixel)."""
    options = {"value": value, "min": low, "max": high, "step": step, "description": description,
               "continuous_update": False, "style": {"description_width": "initial"}}
    if readout_format is not None:
        options["readout_format"] = readout_format
    return kind(**options)


def _keep_at_most(control: widgets.Widget, limit: widgets.Widget) -> None:
    """Keep ``control.value <= limit.value``: moving either past the other moves ``control``
    to the limit. Called before the :class:`Explorer` observes them, so it never draws a
    setting that breaks the rule."""
    def clamp(_change) -> None:
        if control.value > limit.value:
            control.value = limit.value

    limit.observe(clamp, names="value")
    control.observe(clamp, names="value")


def _check_in(name: str, value, options) -> None:
    if value not in options:
        raise ValueError(f"{name} must be one of {list(options)}, got {value!r}")


# ----------------------------------------------------------------------------------------
# Prior explorer
# ----------------------------------------------------------------------------------------
def _draw_prior(depth: int, alpha: float, seed: int) -> tuple[Figure, dict, str]:
    summary = prior_state(depth, alpha, seed)
    tree = TreePrior(depth, alpha)
    figure = plot_prior_sample(tree, torch.tensor(summary["signs"]), np.array(summary["theta"]),
                               np.array(summary["twin_theta"]))
    caption = (
        f"D = {summary['dim']} coordinates, E|theta|^2 = {summary['energy']:.3f} for both priors. The tree sample has "
        f"one non-zero coordinate per level ({summary['nonzero']} of {summary['dim']}); the twin spreads the "
        f"same energy over all of them. Sample seed {seed}."
    )
    return figure, summary, caption


def prior_explorer(depth: int = 4, alpha: float = 0.5, seed: int = 0) -> Explorer:
    """Tree depth ``K`` (2..7) and decay ``alpha`` (0.05..1): the tree with a sampled path, the
    sampled ``theta (D,)`` and a draw from the Gaussian twin; ``seed`` picks the draws.

    ``summary`` holds ``depth``, ``alpha``, ``dim``, ``energy``, ``signs``, ``theta``,
    ``twin_theta`` and ``nonzero`` (non-zero coordinates of the tree sample, always ``K``).
    """
    check_int("depth", depth, 2, 7)
    check_number("alpha", alpha, 0.05, 1.0)
    check_int("seed", seed, 0, 10_000)
    controls = {
        "depth": _slider(widgets.IntSlider, depth, 2, 7, 1, "depth K"),
        "alpha": _slider(widgets.FloatSlider, alpha, 0.05, 1.0, 0.05, "alpha", ".2f"),
        "seed": _slider(widgets.IntSlider, seed, 0, 50, 1, "sample seed"),
    }
    return Explorer("Prior explorer: the tree and its Gaussian twin", controls, _draw_prior,
                    live=lambda: prior_live(depth, alpha, seed))


# ----------------------------------------------------------------------------------------
# Strategy explorer
# ----------------------------------------------------------------------------------------
def _strategy_drawer(depth: int, samples: int, seed: int) -> DrawFn:
    def draw(budget: int, alpha: float, n_ctx: int, noise_std: float) -> tuple[Figure, dict, str]:
        summary = strategy_state(depth, budget, alpha, n_ctx, noise_std, samples, seed)
        tree = TreePrior(depth, alpha)
        sweep = DecaySweep(np.array(summary["budgets"]), {k: np.array(v) for k, v in summary["mean"].items()},
                           {k: np.array(v) for k, v in summary["stderr"].items()}, samples, n_ctx, noise_std,
                           summary["tau2"])
        figure = plot_strategy_curves(sweep, tree, EXPLORER_STRATEGIES)
        final = summary["final"]
        m = summary["budgets"][-1]
        caption = (f"At M = {m}: adaptive {final['adaptive_greedy']:.4f}, non-adaptive "
                   f"{final['nonadaptive_coord']:.4f}, LMMSE {final['lmmse']:.4f}. "
                   f"{samples} Monte Carlo contexts per point (seed {seed}, the same contexts at every budget).")
        return figure, summary, caption

    return draw


N_CTX_OPTIONS = (16, 32, 64, 128, 256, 512, 1024, 2048)


def strategy_explorer(
    depth: int = 6,
    budget: int = 6,
    alpha: float = 0.5,
    n_ctx: int = 128,
    noise_std: float = 0.0,
    samples: int = 1000,
    seed: int = 0,
) -> Explorer:
    """Budget ``M`` (1..D, curves for every budget up to it), ``alpha``, context length ``N`` and
    label noise ``sigma``: Monte Carlo excess losses of the adaptive greedy, non-adaptive and
    LMMSE strategies on a depth-``depth`` tree (``samples`` contexts per point, finite-``N``
    statistics, ``seed``).

    ``summary`` holds ``budgets``, ``tau2``, ``samples``, ``mean`` and ``stderr`` (per strategy,
    one entry per budget) and ``final`` (the three losses at the largest budget).
    """
    check_int("depth", depth, 2, 8)
    dim = 2**depth - 1
    check_int("budget", budget, 1, dim)
    check_number("alpha", alpha, 0.05, 1.0)
    _check_in("n_ctx", n_ctx, N_CTX_OPTIONS)
    check_number("noise_std", noise_std, 0.0, 2.0)
    check_int("samples", samples, 2, 100_000)
    controls = {
        "budget": _slider(widgets.IntSlider, budget, 1, min(dim, 12), 1, "budget M"),
        "alpha": _slider(widgets.FloatSlider, alpha, 0.05, 1.0, 0.05, "alpha", ".2f"),
        "n_ctx": widgets.SelectionSlider(options=N_CTX_OPTIONS, value=n_ctx, description="context N",
                                         continuous_update=False),
        "noise_std": _slider(widgets.FloatSlider, noise_std, 0.0, 2.0, 0.1, "noise sigma", ".1f"),
    }
    return Explorer("Strategy explorer: adaptive versus non-adaptive inference",
                    controls, _strategy_drawer(depth, samples, seed),
                    live=lambda: strategy_live(depth, budget, alpha, n_ctx, noise_std, samples, seed))


# ----------------------------------------------------------------------------------------
# Training explorer
# ----------------------------------------------------------------------------------------
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
    """The training explorer: an :class:`Explorer` with *Train* and *Stop* buttons.

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
            "model": widgets.Dropdown(options=["A", "B", "C"], value=model, description="model"),
            "prior": widgets.Dropdown(options=["tree", "gaussian-twin", "gaussian"], value=prior, description="prior"),
            "steps": _slider(widgets.IntSlider, steps, 100, 5000, 100, "steps"),
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


# ----------------------------------------------------------------------------------------
# Patching explorer
# ----------------------------------------------------------------------------------------
def _patching_drawer(tree: TreePrior, n_ctx: int, noise_std: float, n_layers: int, model, sweeps: dict,
                     contexts: int, seed: int) -> tuple[DrawFn, Callable[..., dict]]:
    effects: dict = {}
    source = "trained model" if model is not None else "greedy theory policy"

    def effect_of(split_level: int, layer: int):
        key = (split_level, layer)
        if key not in effects:
            effects[key] = patch_level_effect(tree, n_ctx, noise_std, split_level=split_level, layer=layer,
                                              model=model, n_layers=n_layers, contexts=contexts, seed=seed)
        return effects[key]

    def compute(split_level: int, layer: int) -> dict:
        return patching_state(sweeps, effect_of(split_level, layer))

    def draw(split_level: int, layer: int) -> tuple[Figure, dict, str]:
        summary = compute(split_level, layer)
        figure = plot_patching_cell(sweeps, effect_of(split_level, layer))
        caption = (f"{source}: patching layer {layer} with donors that split at level {split_level} multiplies "
                   f"the loss by {summary['ratio']:.2f}. {contexts} donor/target pairs per cell (seed {seed}).")
        return figure, summary, caption

    return draw, compute


def patching_explorer(
    tree: TreePrior | None = None,
    n_layers: int | None = None,
    *,
    model=None,
    n_ctx: int = 128,
    noise_std: float = 0.0,
    split_level: int = 1,
    layer: int = 2,
    contexts: int = 500,
    seed: int = 0,
    sweep: PatchingResult | None = None,
    theory_sweep: PatchingResult | None = None,
) -> Explorer:
    """Split level ``m`` and layer ``l``: the key-patching heatmap (``(m, l)`` outlined), its
    row ``m`` for the model and the greedy theory policy, and the per-level effect of the patch
    (:func:`fvlib.interventions.patching.patch_level_effect`).

    Without ``model`` the greedy theory policy of depth ``n_layers`` (default ``K``) on a
    depth-4 tree is patched; with a trained ``model`` its keys are patched and the theory
    policy of the same depth is shown beside it. ``sweep`` reuses a model sweep already
    computed and ``theory_sweep`` a theory sweep (same ``tree``, ``n_ctx``, ``noise_std``,
    depth); otherwise the sweeps use ``contexts`` pairs per split level. ``summary`` holds ``split_level``, ``layer``, ``ratio`` (of the
    shown cell), ``row``, ``target_overlap`` and ``donor_overlap`` (``(K,)`` lists).
    """
    tree = TreePrior(4, 0.5) if tree is None else tree
    if not isinstance(tree, TreePrior):
        raise ValueError(f"tree must be a TreePrior, got {tree!r}")
    n_layers = model.config.n_layers if model is not None else (tree.depth if n_layers is None else n_layers)
    check_int("n_layers", n_layers, 1, 64)
    check_int("split_level", split_level, 1, tree.depth)
    check_int("layer", layer, 1, n_layers)
    check_int("contexts", contexts, 2, 100_000)
    sweeps = {}
    if model is not None:
        sweeps["model"] = sweep if sweep is not None else key_patching_sweep(
            model, tree, n_ctx, noise_std, contexts=contexts, seed=seed)
    sweeps["theory"] = theory_sweep if theory_sweep is not None else theory_patching_sweep(
        tree, n_ctx, noise_std, n_layers, contexts=contexts, seed=seed)
    controls = {
        "split_level": _slider(widgets.IntSlider, split_level, 1, tree.depth, 1, "split level m"),
        "layer": _slider(widgets.IntSlider, layer, 1, n_layers, 1, "patched layer l"),
    }
    draw, compute = _patching_drawer(tree, n_ctx, noise_std, n_layers, model, sweeps, contexts, seed)
    source = "trained model" if model is not None else "greedy theory policy"

    def live() -> LiveSpec:
        return patching_live(tree, n_layers, split_level, layer, sweeps, compute, source=source, contexts=contexts,
                             seed=seed)

    return Explorer("Patching explorer: where routing happens", controls, draw, live=live)


# ----------------------------------------------------------------------------------------
# DP policy explorer (chapter 4)
# ----------------------------------------------------------------------------------------
def _draw_dp_policy(tau: float) -> tuple[Figure, dict, str]:
    state = dp_policy_state(tau)
    v = state["values"]
    caption = (f"tau = {tau:g}: optimal {v['optimal']:.4f}, greedy {v['greedy']:.4f}, non-adaptive "
               f"{v['nonadaptive']:.4f} (optimal / greedy = {state['ratio']:.3f}). The optimal policy "
               f"measures node {state['first_node']} first and measures it again with probability "
               f"{state['remeasure_prob']:.3f}. K = {state['depth']}, alpha = {state['alpha']:g}, "
               f"L = {state['layers']}; exact quadrature ({state['quad_points']}-point "
               f"{state['rule']} rule), no Monte Carlo.")
    return plot_dp_policy_state(state), state, caption


def dp_policy_explorer(tau: float = 0.6) -> Explorer:
    """Channel noise ``tau`` (the values of ``DP_POLICY_GRID``): the optimal two-layer policy of
    chapter 4 (K = 3, alpha = 1/2) as a decision tree with the probability of each branch,
    beside the values of the optimal, greedy and non-adaptive policies.

    ``summary`` is :func:`fvlib.explorers.states.dp_policy_state` at the current ``tau``.
    """
    _check_in("tau", tau, DP_POLICY_GRID["tau"])
    controls = {"tau": widgets.SelectionSlider(options=DP_POLICY_GRID["tau"], value=tau,
                                               description="noise tau", continuous_update=False)}
    return Explorer("DP policy explorer: the optimal policy against greedy", controls, _draw_dp_policy,
                    live=lambda: dp_policy_live(tau))


# ----------------------------------------------------------------------------------------
# Layer split explorer (chapter 5)
# ----------------------------------------------------------------------------------------
def _draw_layer_split(budget: int, layers: int, alpha: float) -> tuple[Figure, dict, str]:
    state = layer_split_state(budget, layers, alpha)
    sizes = state["layer_sizes"]
    caption = (f"M = {budget} measurements in L = {layers} layers (sizes {sizes}): tree "
               f"{state['tree_loss']:.4f}, Gaussian twin {state['gaussian_loss']:.4f} (the same for "
               f"every L). K = {state['depth']}, alpha = {alpha:g}, no channel noise; closed forms, "
               f"no Monte Carlo.")
    return plot_layer_split_state(state), state, caption


def layer_split_explorer(budget: int = 6, layers: int = 2, alpha: float = 0.5) -> Explorer:
    """Budget ``M``, layers ``L`` and ``alpha`` (the values of ``LAYER_SPLIT_GRID``): ``M``
    coordinate measurements split evenly into ``L`` layers, on the depth-5 tree and on its
    Gaussian twin without channel noise. The twin's loss depends only on ``M``; the tree's
    adaptive loss falls as the same budget is spread over more layers.

    ``summary`` is :func:`fvlib.explorers.states.layer_split_state` at the current settings.
    """
    _check_in("budget", budget, LAYER_SPLIT_GRID["budget"])
    _check_in("layers", layers, LAYER_SPLIT_GRID["layers"])
    _check_in("alpha", alpha, LAYER_SPLIT_GRID["alpha"])
    if layers > budget:
        raise ValueError(f"layers must be at most budget = {budget} (a layer measures at least once), got {layers}")
    controls = {
        "budget": widgets.SelectionSlider(options=LAYER_SPLIT_GRID["budget"], value=budget,
                                          description="budget M", continuous_update=False),
        "layers": widgets.SelectionSlider(options=LAYER_SPLIT_GRID["layers"], value=layers,
                                          description="layers L", continuous_update=False),
        "alpha": widgets.SelectionSlider(options=LAYER_SPLIT_GRID["alpha"], value=alpha,
                                         description="alpha", continuous_update=False),
    }
    _keep_at_most(controls["layers"], controls["budget"])
    return Explorer("Layer split explorer: one budget, more or fewer layers", controls, _draw_layer_split,
                    live=lambda: layer_split_live(budget, layers, alpha))
