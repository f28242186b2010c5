"""scripts/execute_book.py: which notebooks `make book` pre-executes, and in which order."""

import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("execute_book", ROOT / "scripts" / "execute_book.py")
execute_book = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(execute_book)


def test_every_notebook_of_the_toc_is_executed_once_in_the_books_order():
    found = execute_book.toc_notebooks(ROOT / "_toc.yml")
    toc = (ROOT / "_toc.yml").read_text()
    listed = [p for p in sorted(ROOT.glob("book/**/*.ipynb"))
              if ".ipynb_checkpoints" not in p.parts and f"file: {p.relative_to(ROOT).with_suffix('')}" in toc]
    assert sorted(found) == listed and len(set(found)) == len(found)
    assert found.index(ROOT / "book" / "01_icl_function_vectors.ipynb") < found.index(
        ROOT / "book" / "12_discussion.ipynb")


def test_first_moves_the_named_notebooks_to_the_front():
    found = execute_book.toc_notebooks(ROOT / "_toc.yml")
    ordered = execute_book.order(found, ["book/08_experiments.ipynb"])
    assert ordered[0] == ROOT / "book" / "08_experiments.ipynb"
    assert sorted(ordered) == sorted(found)
    with pytest.raises(SystemExit, match="not_a_chapter"):
        execute_book.order(found, ["book/not_a_chapter.ipynb"])


def test_a_failing_notebook_is_reported_with_its_error(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("raise ValueError('bad cell 42')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    _, _, text, error = execute_book.execute(path, timeout=600)  # a hang, not a slow kernel start
    assert text is None and "bad cell 42" in error
