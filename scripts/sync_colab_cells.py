"""Write the Colab install cell into every notebook of the book.

The first code cell of each notebook installs fvlib *at the book's version* when the notebook
runs on Google Colab (the tag ``v<version>`` of the repository in ``_config.yml``) and turns on
Colab's widget manager for the explorers; anywhere else it does nothing. Run this after a
version bump (pyproject.toml and fvlib/__init__.py) and commit the notebooks:

    python scripts/sync_colab_cells.py          # rewrite the cells
    python scripts/sync_colab_cells.py --check  # exit 1 if any notebook is out of date

tests/test_colab.py checks the cells with the same function and simulates Colab.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def book_version(root: Path = ROOT) -> str:
    """The version in pyproject.toml (the book and fvlib share it)."""
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]


def _repository_setting(key: str, root: Path) -> str:
    """``repository: <key>:`` from _config.yml (no YAML parser needed for one key)."""
    text = (root / "_config.yml").read_text()
    match = re.search(rf"^repository:\s*\n(?:\s+.*\n)*?\s+{key}:\s*(\S+)", text, flags=re.M)
    if match is None:
        raise SystemExit(f"_config.yml has no repository {key}")
    return match.group(1)


def repository_url(root: Path = ROOT) -> str:
    """The repository the book is published from."""
    return _repository_setting("url", root)


def install_spec(root: Path = ROOT) -> str:
    """The pip requirement the Colab cell installs, e.g. ``fvlib @ git+https://...@v0.1.0``."""
    return f"fvlib @ git+{repository_url(root)}@v{book_version(root)}"


def install_cell_source(root: Path = ROOT) -> str:
    """The install cell: on Colab, pip-installs :func:`install_spec` (a failed install raises
    ``RuntimeError`` with pip's last lines and what to do) and turns on the widget manager."""
    tag = f"v{book_version(root)}"
    return (
        f"# On Google Colab: install fvlib at this book's version ({tag}) and turn on the\n"
        "# widget manager for the interactive explorers. Does nothing anywhere else.\n"
        "import subprocess, sys\n"
        'if "google.colab" in sys.modules:\n'
        f'    FVLIB = "{install_spec(root)}"\n'
        '    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", FVLIB],\n'
        "                         capture_output=True, text=True)\n"
        "    if pip.returncode != 0:\n"
        "        raise RuntimeError(\n"
        '            f"pip could not install {FVLIB}:\\n{pip.stderr[-1500:]}\\n"\n'
        f'            "Publish the repository with the tag {tag} (its README: Releasing), or "\n'
        '            "copy the repository to this machine and run: %pip install <its folder>")\n'
        "    from google.colab import output\n"
        "    output.enable_custom_widget_manager()"
    )


def repository_branch(root: Path = ROOT) -> str:
    """The ref the Colab launch buttons open (``repository: branch:``)."""
    return _repository_setting("branch", root)


def sync_branch(root: Path, write: bool) -> bool:
    """Point the launch buttons (``repository: branch:``) at the tag ``v<version>``."""
    tag = f"v{book_version(root)}"
    if repository_branch(root) == tag:
        return False
    if write:
        path = root / "_config.yml"
        text = re.sub(r"^(repository:\s*\n(?:\s+.*\n)*?\s+branch:\s*)\S+", lambda m: m.group(1) + tag,
                      path.read_text(), count=1, flags=re.M)
        path.write_text(text)
    return True


def notebooks(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in (root / "book").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def first_code_cell(notebook) -> dict:
    return next(cell for cell in notebook["cells"] if cell["cell_type"] == "code")


def cell_source(cell) -> str:
    """A cell's source as one string (a notebook file may store it as a list of lines)."""
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def read_notebook(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def sync(path: Path, source: str, write: bool) -> bool:
    """Make the first code cell of ``path`` the install cell (tagged ``remove-cell``);
    return whether it was out of date. The file is rewritten as Jupyter writes it (one-space
    indent, keys in their order, UTF-8 as is), so only that cell changes."""
    notebook = read_notebook(path)
    cell = first_code_cell(notebook)
    tags = cell.setdefault("metadata", {}).setdefault("tags", [])
    if cell_source(cell) == source and "remove-cell" in tags:
        return False
    cell["source"] = source.splitlines(keepends=True)
    if "remove-cell" not in tags:
        tags.append("remove-cell")
    if write:
        path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report notebooks that are out of date")
    args = parser.parse_args(argv)
    source = install_cell_source()
    stale = [p for p in notebooks() if sync(p, source, write=not args.check)]
    if sync_branch(ROOT, write=not args.check):
        stale.append(ROOT / "_config.yml")
    for path in stale:
        print(("out of date: " if args.check else "updated: ") + str(path.relative_to(ROOT)))
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
