"""Colab support: the install cell of every notebook, run against a simulated Colab.

The first code cell of each notebook is executed here exactly as IPython would run it (its
``%pip`` line goes through IPython's own input transformer), once with a fake
``google.colab`` module in ``sys.modules`` and once without. On "Colab" it must install fvlib
from the repository at the book's version tag and turn on the widget manager; elsewhere it
must do nothing.
"""

import importlib.util
import shlex
import sys
import types
from pathlib import Path

import nbformat
import pytest
import torch
from IPython.core.inputtransformer2 import TransformerManager
from packaging.requirements import Requirement

import fvlib
from fvlib.train import TrainConfig, resolve_device

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("sync_colab_cells", ROOT / "scripts" / "sync_colab_cells.py")
sync_colab_cells = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sync_colab_cells)

NOTEBOOKS = sync_colab_cells.notebooks(ROOT)


class FakeShell:
    """Records the magics a cell runs instead of running them."""

    def __init__(self):
        self.magics = []

    def run_line_magic(self, name, line, _stack_depth=1):
        self.magics.append((name, line))


def run_install_cell(source: str, on_colab: bool, monkeypatch):
    """Execute the cell's code (after IPython's transforms); return (shell, widget manager calls)."""
    shell, widget_calls = FakeShell(), []
    if on_colab:
        output = types.ModuleType("google.colab.output")
        output.enable_custom_widget_manager = lambda: widget_calls.append("enabled")
        colab = types.ModuleType("google.colab")
        colab.output = output
        google = types.ModuleType("google")
        google.colab = colab
        monkeypatch.setitem(sys.modules, "google", google)
        monkeypatch.setitem(sys.modules, "google.colab", colab)
        monkeypatch.setitem(sys.modules, "google.colab.output", output)
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    code = TransformerManager().transform_cell(source)
    exec(compile(code, "<install cell>", "exec"), {"get_ipython": lambda: shell})
    return shell, widget_calls


def test_version_is_the_same_everywhere():
    assert sync_colab_cells.book_version(ROOT) == fvlib.__version__
    assert sync_colab_cells.repository_branch(ROOT) == f"v{fvlib.__version__}"


def test_preface_and_readme_name_the_current_tag():
    tag = f"v{fvlib.__version__}"
    for name in ("book/index.md", "README.md", "book/appendix_api.md"):
        assert tag in (ROOT / name).read_text(), f"{name} does not mention {tag}"


def test_every_notebook_starts_with_the_current_install_cell():
    assert len(NOTEBOOKS) >= 12
    expected = sync_colab_cells.install_cell_source(ROOT)
    for path in NOTEBOOKS:
        cell = sync_colab_cells.first_code_cell(nbformat.read(path, as_version=4))
        assert cell.source == expected, f"{path.name}: run scripts/sync_colab_cells.py"
        assert "remove-cell" in cell.metadata.get("tags", []), path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_install_cell_on_simulated_colab(path, monkeypatch):
    source = sync_colab_cells.first_code_cell(nbformat.read(path, as_version=4)).source
    shell, widget_calls = run_install_cell(source, on_colab=True, monkeypatch=monkeypatch)
    assert len(shell.magics) == 1 and widget_calls == ["enabled"]
    name, line = shell.magics[0]
    args = shlex.split(line)
    assert name == "pip" and args[:2] == ["install", "-q"] and len(args) == 3
    requirement = Requirement(args[2])
    assert requirement.name == "fvlib"
    assert requirement.url == f"git+{sync_colab_cells.repository_url(ROOT)}@v{fvlib.__version__}"


@pytest.mark.parametrize("path", NOTEBOOKS[:1], ids=lambda p: p.name)
def test_install_cell_does_nothing_off_colab(path, monkeypatch):
    source = sync_colab_cells.first_code_cell(nbformat.read(path, as_version=4)).source
    shell, widget_calls = run_install_cell(source, on_colab=False, monkeypatch=monkeypatch)
    assert shell.magics == [] and widget_calls == []


def test_sync_script_repairs_a_stale_cell(tmp_path):
    (tmp_path / "book").mkdir()
    for name in ("pyproject.toml", "_config.yml"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    stale = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("pass")])
    path = tmp_path / "book" / "x.ipynb"
    nbformat.write(stale, path)
    expected = sync_colab_cells.install_cell_source(tmp_path)
    assert sync_colab_cells.sync(path, expected, write=True)
    cell = sync_colab_cells.first_code_cell(nbformat.read(path, as_version=4))
    assert cell.source == expected and cell.metadata["tags"] == ["remove-cell"]
    assert not sync_colab_cells.sync(path, expected, write=False)


def test_device_is_picked_automatically(monkeypatch):
    assert TrainConfig().device == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto").type == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto").type == "cpu"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.parent.name == "book" and p.name[:2].isdigit()],
                         ids=lambda p: p.name)
def test_every_chapter_documents_a_bigger_configuration(path):
    text = path.read_text()
    assert "Run it bigger" in text, f"{path.name} has no 'Run it bigger' admonition"
    assert "FULL = False" in text or "RECOMPUTE = False" in text, \
        f"{path.name} has no FULL (or RECOMPUTE, for stored experiments) switch for the bigger configuration"
