"""Colab support: the install cell of every notebook, run against a simulated Colab.

The first code cell of each notebook is executed here as IPython would run it (after IPython's
input transformer), with a fake ``google.colab`` module in ``sys.modules`` and a stand-in for
pip (``sys.executable`` replaced by a script that records its arguments and succeeds or fails),
and once without Colab. On "Colab" it must install fvlib from the repository at the book's
version tag and turn on the widget manager, and raise a clear error when pip fails; elsewhere
it must do nothing.
"""

import importlib.util
import sys
import types
from pathlib import Path

import nbformat
import pytest
import torch
from IPython.core.inputtransformer2 import TransformerManager
from packaging.requirements import Requirement

import fvlib
from fvlib.training import TrainConfig, resolve_device

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sync_colab_cells", ROOT / "scripts" / "sync_colab_cells.py")
sync_colab_cells = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sync_colab_cells)

NOTEBOOKS = sync_colab_cells.notebooks(ROOT)


def install_cell(path: Path) -> str:
    return sync_colab_cells.cell_source(sync_colab_cells.first_code_cell(sync_colab_cells.read_notebook(path)))


def fake_pip(tmp_path: Path, exit_code: int) -> tuple[Path, Path]:
    """A stand-in for ``python``: records its arguments (one per line) and exits with
    ``exit_code``, printing pip's error line when it fails. Returns (script, record)."""
    record = tmp_path / "pip-args.txt"
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{record}"\n'
                      + ('echo "ERROR: Repository not found" >&2\n' if exit_code else "")
                      + f"exit {exit_code}\n")
    script.chmod(0o755)
    return script, record


def run_install_cell(source: str, on_colab: bool, monkeypatch, python: Path):
    """Execute the cell's code with ``python`` as ``sys.executable``; return the widget
    manager calls (the exception the cell raises propagates)."""
    widget_calls = []
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
    monkeypatch.setattr(sys, "executable", str(python))
    code = TransformerManager().transform_cell(source)
    exec(compile(code, "<install cell>", "exec"), {})
    return widget_calls


def test_version_is_the_same_everywhere():
    assert sync_colab_cells.book_version(ROOT) == fvlib.__version__
    assert sync_colab_cells.repository_branch(ROOT) == f"v{fvlib.__version__}"


def test_running_page_and_readme_name_the_current_tag():
    tag = f"v{fvlib.__version__}"
    for name in ("book/running.md", "README.md", "book/appendix_api.md"):
        assert tag in (ROOT / name).read_text(), f"{name} does not mention {tag}"


def test_every_notebook_starts_with_the_current_install_cell():
    assert len(NOTEBOOKS) >= 12
    expected = sync_colab_cells.install_cell_source(ROOT)
    for path in NOTEBOOKS:
        cell = sync_colab_cells.first_code_cell(sync_colab_cells.read_notebook(path))
        assert sync_colab_cells.cell_source(cell) == expected, f"{path.name}: run scripts/sync_colab_cells.py"
        assert "remove-cell" in cell["metadata"].get("tags", []), path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_install_cell_on_simulated_colab(path, monkeypatch, tmp_path):
    python, record = fake_pip(tmp_path, exit_code=0)
    widget_calls = run_install_cell(install_cell(path), on_colab=True, monkeypatch=monkeypatch, python=python)
    assert widget_calls == ["enabled"]
    args = record.read_text().splitlines()
    assert args[:4] == ["-m", "pip", "install", "-q"] and len(args) == 5
    requirement = Requirement(args[4])
    assert requirement.name == "fvlib"
    assert requirement.url == f"git+{sync_colab_cells.repository_url(ROOT)}@v{fvlib.__version__}"


def test_install_cell_stops_with_what_to_do_when_pip_fails(monkeypatch, tmp_path):
    python, record = fake_pip(tmp_path, exit_code=1)
    with pytest.raises(RuntimeError) as failure:
        run_install_cell(install_cell(NOTEBOOKS[0]), on_colab=True, monkeypatch=monkeypatch, python=python)
    message = str(failure.value)
    assert record.is_file()  # pip ran, and failed
    assert "ERROR: Repository not found" in message  # pip's own words
    assert f"tag v{fvlib.__version__}" in message and "Releasing" in message  # how to publish
    assert "%pip install <its folder>" in message  # or install from a local copy
    assert "## Releasing" in (ROOT / "README.md").read_text()  # the section the message names


@pytest.mark.parametrize("path", NOTEBOOKS[:1], ids=lambda p: p.name)
def test_install_cell_does_nothing_off_colab(path, monkeypatch, tmp_path):
    python, record = fake_pip(tmp_path, exit_code=0)
    widget_calls = run_install_cell(install_cell(path), on_colab=False, monkeypatch=monkeypatch, python=python)
    assert widget_calls == [] and not record.exists()


def test_sync_script_changes_only_the_install_cell(tmp_path):
    """The script rewrites a notebook as Jupyter writes it: every other byte stays."""
    original = NOTEBOOKS[0].read_text(encoding="utf-8")
    path = tmp_path / NOTEBOOKS[0].name
    path.write_text(original.replace("import subprocess, sys", "import sys"), encoding="utf-8")
    assert sync_colab_cells.sync(path, sync_colab_cells.install_cell_source(ROOT), write=True)
    assert path.read_text(encoding="utf-8") == original


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
