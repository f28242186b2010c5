"""The explorers' shared base: the :class:`Explorer` box and the helpers of its controls.

An explorer is a function with defaults that returns an :class:`Explorer`: an ipywidgets
``VBox`` with controls on top and the figure below. Changing a control redraws the figure
(as a PNG in a ``widgets.Image``) and updates ``summary`` -- the numbers the figure shows --
so tests and notebooks can check what an explorer displays without a browser. Each explorer
draws the state of :mod:`fvlib.explorers.states` at its current control values (control values
-> plain JSON-able numbers) with a figure function of :mod:`fvlib.plots.explorers`.

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
from collections.abc import Callable, Mapping

import ipywidgets as widgets
from matplotlib.figure import Figure

from .live import LiveSpec, live_block, live_enabled

__all__ = ["Explorer", "LIVE_NOTE", "figure_png", "slider", "keep_at_most", "check_one_of"]


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


def slider(kind, value, low, high, step, description: str, readout_format: str | None = None):
    """A continuous-update-off slider (one redraw per release, not per pixel)."""
    options = {"value": value, "min": low, "max": high, "step": step, "description": description,
               "continuous_update": False, "style": {"description_width": "initial"}}
    if readout_format is not None:
        options["readout_format"] = readout_format
    return kind(**options)


def keep_at_most(control: widgets.Widget, limit: widgets.Widget) -> None:
    """Keep ``control.value <= limit.value``: moving either past the other moves ``control``
    to the limit. Called before the :class:`Explorer` observes them, so it never draws a
    setting that breaks the rule."""
    def clamp(_change) -> None:
        if control.value > limit.value:
            control.value = limit.value

    limit.observe(clamp, names="value")
    control.observe(clamp, names="value")


def check_one_of(name: str, value, options) -> None:
    """``ValueError`` naming ``value`` unless it is one of ``options`` (a control's values)."""
    if value not in options:
        raise ValueError(f"{name} must be one of {list(options)}, got {value!r}")

