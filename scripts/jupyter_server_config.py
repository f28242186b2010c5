"""The Jupyter server's configuration for this book's environment: ``make venv`` (and so
``make book``) copies it to ``.venv/etc/jupyter/jupyter_server_config.py``, where
``.venv/bin/jupyter lab`` reads it.

Saving a notebook keeps every output's static views -- an explorer's ``text/html`` (its figure,
settings and caption) and ``text/plain`` -- and drops the view of the live widget
(``application/vnd.jupyter.widget-view+json``) and any saved widget state. A reopened notebook
has no kernel behind its widgets: JupyterLab would show "Error displaying widget: model not
found" in place of each explorer, and the widget state would embed every figure in the
notebook. Run the cell again for the live explorer. tests/test_jupyter.py checks it.
"""

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def drop_widget_views(model: dict, **_kwargs) -> None:
    """Jupyter pre-save hook: remove the widget views and widget state from a notebook model
    (in place; other files are left alone)."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    notebook = model["content"]
    notebook.get("metadata", {}).pop("widgets", None)
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            output.get("data", {}).pop(WIDGET_VIEW, None)


if "get_config" in globals():  # read by Jupyter (not when a test imports the hook)
    get_config().FileContentsManager.pre_save_hook = drop_widget_views  # noqa: F821
