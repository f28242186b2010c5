"""Live explorers in the static HTML book: states computed on a grid, drawn in the browser.

A static page cannot run Python, so at build time an explorer's *states* -- the numbers its
figure shows -- are computed on a grid of control values, by the same state function of
:mod:`fvlib.explorers.states` that the ipywidgets explorer (:mod:`fvlib.explorers.base`)
calls on every change of a control, and embedded in the explorer's ``text/html`` output as
JSON. The book's JavaScript module
``_static/fvlib-live.js`` (written for this book; nothing is loaded from outside the site)
builds the controls as HTML inputs, and on every change looks up the state of the current
settings and draws it as SVG. The PNG of the default settings stays in the page: it is what a
reader without JavaScript, and a printed page, sees.

The pieces:

* :class:`Control` -- one control: its name, label and the values of the grid. A control with
  ``grid=False`` is a *view* control: the state does not depend on it and the drawing uses
  it (e.g. the strategy explorer's budget, which shortens curves computed up to the largest
  budget, or the training explorer's step, a playback of a recorded history).
* :class:`LiveSpec` -- an explorer's controls, its compute function and the name of its
  JavaScript draw function.
* :func:`grid_states` -- every state of the grid (floats rounded to ``digits`` significant
  digits), :func:`live_block` the HTML (the data as ``<script type="application/json">``),
  :func:`embedded_specs` reads the data back from a page (for tests).

Recipe: adding an explorer to the static book.

1. A compute function ``state(**values) -> dict`` of JSON numbers, lists and strings (the one
   home of the explorer's numbers), in :mod:`fvlib.explorers.states`: the ipywidgets draw
   calls it and draws its figure from the result, so the notebook and the page cannot
   disagree.
2. A grid, built by a function beside the state: a :class:`LiveSpec` with one
   :class:`Control` per control (values: the widget's options, or a subset of them when each
   state costs Monte Carlo time; keep the page's data under 1.5 MB and measure the build
   time), ``kind`` naming the draw function, and ``shared`` for numbers common to every state
   (drawn once, embedded once). Give it to the :class:`fvlib.explorers.base.Explorer` as
   ``live=`` (in the explorer's own module of :mod:`fvlib.explorers`).
3. A draw function in ``_static/fvlib-live.js``: ``FvlibLive.register(kind, draw)`` where
   ``draw(ctx)`` gets the state, the view values and ``shared``, draws panels with the SVG
   helpers there, and returns a caption. Mark the drawn numbers with ``data-values`` so the
   browser test (tests/book/test_book_html.py) can compare them with the embedded state.

Then a test recomputes a few grid points with the compute function and compares them with the
page (tests/explorers/test_explorer_live.py does this for every explorer).

The grid is computed only when the page is built (``jupyter-book build`` sets
:data:`LIVE_ENV` through the book's ``_ext/fvlib_live.py``) or when asked for
(``Explorer.static_html(live=True)``): in Jupyter and Colab the widget itself is live, and
computing a grid nobody sees would only delay it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "LIVE_ENV",
    "Control",
    "LiveSpec",
    "live_enabled",
    "state_key",
    "rounded",
    "grid_states",
    "live_block",
    "embedded_specs",
]

#: Environment variable that turns on the live grids of the explorers' HTML output ("1").
LIVE_ENV = "FVLIB_LIVE_HTML"


def live_enabled() -> bool:
    """Whether :data:`LIVE_ENV` asks for the live grids (set while the book is built)."""
    return os.environ.get(LIVE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _key_part(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format(value, ".6g")
    return str(value)


@dataclass(frozen=True)
class Control:
    """One control of a live explorer.

    Args:
        name: the keyword of the compute function (``grid=True``) or of the draw (``grid=False``).
        label: what the reader sees next to the control.
        values: the values offered, in order (numbers or strings); a slider moves over them.
        default: the value shown first (one of ``values``).
        grid: ``False`` for a view control (the states do not depend on it).
        at_most: the name of another control this one may not exceed (the layers of a budget):
            the page moves it down when the other falls below it, and the grid leaves out the
            combinations where it is larger.
    """

    name: str
    label: str
    values: tuple
    default: object
    grid: bool = True
    at_most: str | None = None

    def __post_init__(self):
        values = tuple(self.values)
        if not values:
            raise ValueError(f"control {self.name!r} has no values")
        object.__setattr__(self, "values", values)
        if self.default not in values:
            raise ValueError(f"default of control {self.name!r} must be one of {list(values)}, got {self.default!r}")

    def to_json(self) -> dict:
        return {"name": self.name, "label": self.label, "values": list(self.values),
                "keys": [_key_part(v) for v in self.values], "default": self.values.index(self.default),
                "grid": self.grid, "select": any(isinstance(v, str) for v in self.values), "at_most": self.at_most}


@dataclass(frozen=True)
class LiveSpec:
    """An explorer's grid: ``compute(**grid values) -> state`` (a JSON-able dict) for every
    combination of the values of the grid controls.

    Args:
        kind: name of the draw function in ``_static/fvlib-live.js``.
        controls: the controls, in the order they are shown.
        compute: the explorer's compute function (keyword arguments: the grid controls' names).
        shared: numbers common to all states (e.g. a heatmap every state outlines a cell of).
        note: one sentence under the live drawing: how the grid was computed.
        digits: significant digits kept of every float.
    """

    kind: str
    controls: tuple[Control, ...]
    compute: Callable[..., dict]
    shared: Mapping = field(default_factory=dict)
    note: str = ""
    digits: int = 4

    @property
    def grid_controls(self) -> tuple[Control, ...]:
        return tuple(c for c in self.controls if c.grid)

    def points(self):
        """Every combination of the grid controls' values, as ``{name: value}`` dicts (those
        that break a control's ``at_most`` left out)."""
        names = [c.name for c in self.grid_controls]
        limits = [(c.name, c.at_most) for c in self.grid_controls if c.at_most is not None]
        for values in itertools.product(*(c.values for c in self.grid_controls)):
            point = dict(zip(names, values))
            if all(point[name] <= point[limit] for name, limit in limits):
                yield point


def state_key(values: Mapping, controls: Sequence[Control]) -> str:
    """The key of a state in the embedded data: the grid controls' values joined by ``|``."""
    return "|".join(_key_part(values[c.name]) for c in controls if c.grid)


def rounded(value, digits: int = 4):
    """``value`` (nested dicts, lists, tuples, numbers, strings, numpy/torch scalars and arrays)
    as JSON data with every float rounded to ``digits`` significant digits (NaN and inf:
    ``None``)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {str(k): rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(format(value, f".{digits}g"))
    raise ValueError(f"cannot embed a value of type {type(value).__name__}: {value!r}")


def grid_states(spec: LiveSpec) -> dict:
    """The embedded data of ``spec``: ``kind``, ``controls``, ``shared``, ``note``, ``digits``
    and ``states`` (``{state_key: rounded state}``, one per grid point; a point whose compute
    function returns ``None`` -- e.g. a run that was never trained -- is left out and the page
    says so)."""
    states = {}
    for values in spec.points():
        state = spec.compute(**values)
        if state is not None:
            states[state_key(values, spec.controls)] = rounded(state, spec.digits)
    return {"kind": spec.kind, "controls": [c.to_json() for c in spec.controls],
            "shared": rounded(spec.shared, spec.digits), "note": spec.note, "digits": spec.digits,
            "states": states}


def _json_for_html(data) -> str:
    # inside <script>: "</" would end the element early, "<!--" would start a comment
    return json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/").replace("<!--", "\\u003c!--")


def live_block(spec: LiveSpec) -> str:
    """The live part of an explorer's HTML: an empty ``div`` the JavaScript fills (controls,
    drawing, caption) and the grid as ``<script type="application/json">``."""
    data = grid_states(spec)
    return (f'<div class="fvlib-live" data-kind="{spec.kind}" hidden></div>'
            f'<script type="application/json" class="fvlib-live-data">{_json_for_html(data)}</script>')


_DATA = re.compile(r'<script type="application/json" class="fvlib-live-data">(.*?)</script>', re.S)


def embedded_specs(page: str) -> list[dict]:
    """The embedded data (as :func:`grid_states` returns it) of every live explorer in an HTML
    page or explorer output, in page order."""
    return [json.loads(block) for block in _DATA.findall(page)]
