"""Computed numbers in a page's text (myst-nb's *glue*).

A chapter that quotes a number of its own computation in its prose does not type it: a code
cell calls ``quote("k2-a-mean", value)`` and the markdown writes
``{glue:text}`k2-a-mean:.3f```, so the page shows the number this build computed. That matters
for trained runs: their last bits differ between CPUs (the kernels differ), training amplifies
that, and a typed number would then disagree with the page's own figure. The hidden assert
cells check the *claims* about such numbers (an order, a bound, a ratio within a tolerance), not
their digits.

A word that a rule computes from the data (a verdict such as "reproduced") is glued the same
way, by :func:`quote_word`, so the page shows what the rule decided on this build's numbers.

Outside a book build (Jupyter without myst-nb, Colab) :func:`quote` and :func:`quote_word` only
return the value, and the markdown shows the role's text instead.
"""

from __future__ import annotations

import numbers
import re

__all__ = ["quote", "quote_word"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_WORDS = re.compile(r"[A-Za-z][A-Za-z '-]*")


def quote(name: str, value):
    """Glue the number ``value`` (a Python, NumPy or 0-d torch number) under ``name`` for the
    page's text (``{glue:text}`NAME:FORMAT```, e.g. ``:.2f``); returns it as a plain ``int`` or
    ``float``. ``name``: letters, digits, ``-`` and ``_``; unique within the page."""
    _check_name(name)
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"value of {name!r} must be a real number, got {value!r}")
    value = int(value) if isinstance(value, numbers.Integral) else float(value)
    return _glue(name, value)


def quote_word(name: str, text: str) -> str:
    """Glue the words ``text`` (letters, spaces, ``-`` and ``'``; no digits: numbers go through
    :func:`quote`) under ``name`` for the page's text (``{glue:text}`NAME```); returns ``text``."""
    _check_name(name)
    if not isinstance(text, str) or not _WORDS.fullmatch(text):
        raise ValueError(f"text of {name!r} must be words (letters, spaces, '-', \"'\"), got {text!r}")
    return _glue(name, text)


def _check_name(name) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"name must be letters, digits, '-' and '_', got {name!r}")


def _glue(name: str, value):
    """Glue ``value`` under ``name`` when myst-nb is there (a book build); return ``value``."""
    try:
        from myst_nb import glue
    except ImportError:  # not a book build: the value is only returned
        return value
    glue(name, value, display=False)
    return value
