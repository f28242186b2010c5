"""The fixture of the command-line tests."""

import subprocess
import sys

import pytest


def _run_cli(*args):
    # the limit only catches a hang: far above the slowest call here (reproduce --quick, about
    # 20 s on a loaded 2-core machine)
    return subprocess.run([sys.executable, "-m", "fvlib", *args], check=False, capture_output=True, text=True, timeout=900)


@pytest.fixture
def run_cli():
    """``run_cli(*args)``: ``python -m fvlib ARGS`` in a fresh process, its ``CompletedProcess``
    (``returncode``, ``stdout``, ``stderr`` as text)."""
    return _run_cli
