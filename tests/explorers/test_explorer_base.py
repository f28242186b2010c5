"""fvlib.explorers.base: every explorer module exports its explorer; the HTML view of the static
page; the figure at its natural size; bad settings name the value."""

import base64

import pytest

from fvlib.explorers import dp_policy, layer_split, patching, prior, strategy, training
from fvlib.explorers.base import LIVE_NOTE
from fvlib.explorers.patching import patching_explorer
from fvlib.explorers.prior import prior_explorer
from fvlib.explorers.strategy import strategy_explorer
from fvlib.explorers.training import training_explorer


@pytest.mark.parametrize(
    ("module", "name"),
    [(prior, "prior_explorer"), (strategy, "strategy_explorer"), (training, "training_explorer"),
     (patching, "patching_explorer"), (dp_policy, "dp_policy_explorer"), (layer_split, "layer_split_explorer")],
)
def test_each_explorer_is_exported_by_its_module(module, name):
    assert name in module.__all__
    assert callable(getattr(module, name))


def test_static_html_shows_the_figure_settings_and_live_note():
    explorer = prior_explorer(depth=3)
    bundle = explorer._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # live in Jupyter / Colab
    page = bundle["text/html"]
    png = base64.b64encode(explorer.image.value).decode()
    assert png in page and "depth = 3" in page and LIVE_NOTE in page


@pytest.mark.parametrize(
    ("factory", "kwargs", "bad"),
    [
        (prior_explorer, {"depth": 9}, "9"),
        (prior_explorer, {"alpha": -0.5}, "-0.5"),
        (strategy_explorer, {"n_ctx": 100}, "100"),
        (strategy_explorer, {"depth": 3, "budget": 8}, "8"),
        (patching_explorer, {"layer": 7}, "7"),
        (training_explorer, {"model": "D"}, "'D'"),
    ],
)
def test_bad_settings_name_the_value(factory, kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        factory(**kwargs)


def test_figures_are_shown_at_their_natural_size():
    """Not stretched to the output's width (the column box's default), shrunk keeping their
    aspect ratio where the output is narrower."""
    layout = prior_explorer(depth=3).image.layout
    assert (layout.align_self, layout.max_width, layout.height) == ("flex-start", "100%", "auto")
    assert layout.width is None
