"""The package stays easy to find one's way in: no module of fvlib grows past 600 lines (split it
by concept instead), and the test folders mirror the package's."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 600
MODULES = sorted((ROOT / "fvlib").rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_longer_than_the_limit(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines; split it by concept (at most {MAX_LINES})"


def test_every_package_of_fvlib_has_its_test_folder():
    packages = {p.parent.name for p in (ROOT / "fvlib").glob("*/__init__.py")}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert packages <= folders, f"packages without a test folder in tests/: {sorted(packages - folders)}"
    assert not list((ROOT / "tests").glob("test_*.py")), "tests live in the folder of what they test"
