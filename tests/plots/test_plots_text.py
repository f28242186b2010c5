"""fvlib.plots.text.quote and quote_word: a computed number, or a word a rule computed, glued into the
page's text."""

import numpy as np
import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from myst_nb.core.variables import format_plain_text

from fvlib.plots.text import quote, quote_word


@pytest.fixture
def outputs(monkeypatch) -> list:
    """What the kernel publishes (``(data, metadata)`` per display), as myst-nb reads it."""
    published = []
    monkeypatch.setattr(InteractiveShell.instance().display_pub, "publish",
                        lambda data, metadata=None, **kw: published.append((data, metadata)))
    return published


def test_quote_returns_plain_numbers_and_glues_them(monkeypatch):
    glued = []
    monkeypatch.setattr("myst_nb.glue", lambda name, value, display=True: glued.append((name, value, display)))
    assert quote("a-ratio", np.float64(0.664)) == 0.664 and type(quote("b", np.float32(0.5))) is float
    assert quote("c_count", np.int64(3)) == 3 and type(quote("d", torch.tensor(7))) is int
    assert quote("e", torch.tensor(0.25, dtype=torch.float64)) == 0.25
    assert glued[0] == ("a-ratio", 0.664, False) and [g[0] for g in glued] == ["a-ratio", "b", "c_count", "d", "e"]
    # the value is glued as a plain float, so its text form is what {glue:text}`name:.2f` formats
    assert all(type(v) in (int, float) for _, v, _ in glued)


def test_quote_glues_into_the_output_myst_nb_reads(outputs):
    quote("k4-mean", np.float64(0.0132))
    (data, metadata), = outputs
    assert metadata["scrapbook"]["name"] == "k4-mean"
    assert float(next(v for k, v in data.items() if k.endswith("text/plain"))) == 0.0132


@pytest.mark.parametrize("name, value", [("", 1.0), ("has space", 1.0), ("-lead", 1.0), (3, 1.0),
                                         ("x", "0.5"), ("x", True), ("x", np.array([1.0, 2.0])),
                                         ("x", torch.tensor([1.0])), ("x", None)])
def test_quote_refuses_bad_names_and_values(name, value):
    with pytest.raises(ValueError, match="name|value"):
        quote(name, value)


def test_quote_word_glues_words_that_myst_nb_pastes_as_they_are(outputs):
    assert quote_word("k12-verdict", "reproduced in part") == "reproduced in part"
    (data, metadata), = outputs
    assert metadata["scrapbook"]["name"] == "k12-verdict"
    plain = next(v for k, v in data.items() if k.endswith("text/plain"))
    assert format_plain_text(plain, "") == "reproduced in part"   # what {glue:text}`k12-verdict` shows


@pytest.mark.parametrize("name, text", [("", "shown"), ("x", "3 seeds"), ("x", ""), ("x", 0.5), ("x", " lead")])
def test_quote_word_refuses_bad_names_and_digits(name, text):
    with pytest.raises(ValueError, match="name|text"):
        quote_word(name, text)


def test_quote_figure_shows_the_figure_once_and_glues_it(outputs):
    import matplotlib.pyplot as plt

    from fvlib.plots.text import quote_figure

    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [1, 0])
    quote_figure("fig-k4-box", fig)
    (data, metadata), = outputs
    assert metadata["scrapbook"]["name"] == "fig-k4-box"
    # shown here too: the mime types carry no glue prefix (a kernel with the inline backend
    # adds image/png to the bundle)
    assert data and not any(k.startswith("application/papermill") for k in data), data
    assert not plt.fignum_exists(fig.number)      # closed: the inline backend does not draw it again


def test_quote_figure_refuses_bad_names_and_non_figures():
    import matplotlib.pyplot as plt

    from fvlib.plots.text import quote_figure

    fig = plt.figure()
    with pytest.raises(ValueError, match="name"):
        quote_figure("bad name", fig)
    plt.close(fig)
    for not_a_figure in (None, 1.0, plt):
        with pytest.raises(ValueError, match="fig"):
            quote_figure("x", not_a_figure)
