"""Execute the book's notebooks, several at a time, into the cache that `jupyter-book build` reads.

``make book`` runs this before ``jupyter-book build``. Jupyter Book 1.x executes the notebooks of
a build one after another, and most chapters run on one thread, so one of two cores sat idle
for most of the build. This script executes every notebook listed in ``_toc.yml`` in
``--jobs`` kernels at once (``--first`` ones start first: put the longest there), exactly as
myst-nb's own execution would (the notebook's folder as working directory, the same timeout,
no errors allowed, ``FVLIB_LIVE_HTML=1`` as ``_ext/fvlib_live.py`` sets it for the build's
kernels), and stores the executed notebooks in the Jupyter cache
(``execute_notebooks: cache`` in ``_config.yml``). The build then renders them from the cache,
and executes any notebook that is not there itself.

A notebook that fails is reported with its traceback and the script exits with status 1, so
``make book`` stops at once. ``make book`` empties the cache before every build: every page is
executed from scratch on every build.

Usage::

    python scripts/execute_book.py [--jobs 2] [--timeout 1200] [--first book/08_x.ipynb ...]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
from pathlib import Path

import nbformat
import yaml
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn
from jupyter_cache.executors.utils import single_nb_execution

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "_ext"))
import fvlib_live  # noqa: E402  (the book's Sphinx extension: what the build sets for the kernels)


def toc_notebooks(toc: Path) -> list[Path]:
    """Every ``file:`` of ``toc`` (and its ``root:``) that is a notebook, in the book's order."""
    found: list[Path] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            for key in ("root", "file"):
                if key in node:
                    path = (toc.parent / f"{node[key]}.ipynb").resolve()
                    if path.exists() and path not in found:
                        found.append(path)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(yaml.safe_load(toc.read_text()))
    return found


def execute(path: Path, timeout: int) -> tuple[Path, float, str | None, str | None]:
    """Run ``path`` in a fresh kernel in its own folder: ``(path, seconds, notebook JSON, error)``."""
    notebook = nbformat.read(path, as_version=4)
    result = single_nb_execution(notebook, cwd=str(path.parent), timeout=timeout, allow_errors=False,
                                 meta_override=True)
    if result.err is not None:
        return path, result.time, None, result.exc_string or repr(result.err)
    return path, result.time, nbformat.writes(notebook), None


def order(notebooks: list[Path], first: list[str]) -> list[Path]:
    """``notebooks`` with the ones named in ``first`` moved to the front, in that order."""
    firsts = [(ROOT / name).resolve() for name in first]
    missing = [str(p) for p in firsts if p not in notebooks]
    if missing:
        raise SystemExit(f"error: --first names notebooks that are not in _toc.yml: {missing}")
    return firsts + [nb for nb in notebooks if nb not in firsts]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="notebooks executed at once (default 2)")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per cell (default 1200)")
    parser.add_argument("--first", nargs="*", default=[], help="notebooks to start first")
    parser.add_argument("--cache", default=str(ROOT / "_build" / ".jupyter_cache"),
                        help="the Jupyter cache the build reads (default _build/.jupyter_cache)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    notebooks = order(toc_notebooks(ROOT / "_toc.yml"), args.first)
    # The kernels inherit the environment the build gives them (the live explorers' grids).
    os.environ[fvlib_live.LIVE_ENV] = "1"
    cache = get_cache(args.cache)
    failed = []
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(execute, nb, args.timeout) for nb in notebooks]
        for future in concurrent.futures.as_completed(futures):
            path, seconds, text, error = future.result()
            name = path.relative_to(ROOT)
            if error is not None:
                failed.append(name)
                print(f"FAILED {name} after {seconds:.1f} s\n{error}", file=sys.stderr, flush=True)
                continue
            bundle = CacheBundleIn(nbformat.reads(text, as_version=4), str(path),
                                   data={"execution_seconds": seconds})
            cache.cache_notebook_bundle(bundle, check_validity=False, overwrite=True)
            print(f"executed {name} in {seconds:.1f} s", flush=True)
    if failed:
        print(f"error: {len(failed)} notebook(s) failed: {', '.join(map(str, failed))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
