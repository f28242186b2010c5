"""Small Sphinx fixes for the rendered book (loaded from _config.yml, sphinx.local_extensions).

With the pinned jupyter-book 1.0.4 / Sphinx 7.4 stack, inline scripts that extensions add
after the builder starts (sphinx-thebe's ``const THEBE_JS_URL = ...``, sphinx-togglebutton's
selector) are emitted twice on every page. The second ``const`` declaration is a JavaScript
``SyntaxError`` in every reader's console, and tests/test_book_html.py rightly fails on it.
This extension drops exact duplicates from the page's script list just before rendering.

It also drops the ipywidgets *state* that myst-nb embeds in pages whose notebook ran
widgets: _config.yml renders each explorer's static fallback instead of its widget view
(``nb_mime_priority_overrides``) and loads no widget JavaScript, so the state (a second copy
of every explorer figure, as JSON) would only make the page heavier.
"""


from __future__ import annotations

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _key(js):
    filename = getattr(js, "filename", js) or ""
    attributes = getattr(js, "attributes", {}) or {}
    return str(filename), tuple(sorted((str(k), str(v)) for k, v in attributes.items()))


def _drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for js in scripts:
        key = _key(js)
        if dict(key[1]).get("type") == WIDGET_STATE:
            continue
        if key not in seen:
            seen.add(key)
            unique.append(js)
    scripts[:] = unique


def setup(app):
    # Run after every other html-page-context handler (the default priority is 500).
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "0.1"}
