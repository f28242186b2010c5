"""The book's own style sheet (loaded from _config.yml, sphinx.local_extensions).

Adds ``_ext/book_static/book.css`` to every page: code cells small enough that a 90-character
line fits the content column at 1280 px, and the look of the tables of results of
:class:`fvlib.plots.tables.Table`. The file is copied into the built site's ``_static/``
like any other static file (nothing is loaded from outside the site).
"""

from __future__ import annotations

from pathlib import Path

STATIC = Path(__file__).resolve().parent / "book_static"


def _add_static_path(app, config):
    if str(STATIC) not in config.html_static_path:
        config.html_static_path.append(str(STATIC))


def setup(app):
    app.connect("config-inited", _add_static_path)
    app.add_css_file("book.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "0.1"}
