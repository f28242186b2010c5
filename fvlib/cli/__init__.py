"""Command-line interface: ``python -m fvlib theory|train|gap|warm|patch|reproduce|experiment``.

The contract (subcommands, flags, JSON keys) is the book's appendix *Conventions*, section "The command line".

Bad input never shows a traceback: the message names the flag and the bad value on one line
and the exit status is 2, before any expensive work. Sizes are checked against an estimate of
their cost first (``fvlib.cli.limits``); ``train`` shows its progress. The flags of ``train``
that set the run are the fields of :class:`~fvlib.training.config.TrainConfig`, whose own checks judge
them. JSON output holds ``null`` where a number is not finite, never a bare ``NaN`` or
``Infinity``.
Flags are taken in full and once (``fvlib.cli.argtypes.OneLineParser``); a ``train`` flag
typed that would change nothing in the run is refused (``fvlib.cli.train_flags``). Ctrl-C
during ``train`` checkpoints the run at its current step and exits 130, saying that the same
command resumes it.

The modules, in layers from the bottom up; a module imports only from the layers below it
(``tests/core/test_import_layers.py`` checks this)::

    limits          the one-line CliError; the refusals before any work: memory, time,
                    budgets, writable output directories
    argtypes        the one-line parser; argparse types that name the flag
    train_flags     the train flags made from TrainConfig's fields, and the config a
                    command line asks for
    dispatch        the subcommands, one function each
    parser          the parser of every subcommand

``main`` (here) parses, runs the subcommand and prints its result.
"""

from __future__ import annotations

import json
import sys

from .dispatch import finite_or_none
from .limits import CliError
from .parser import build_parser, program_name

__all__ = ["build_parser", "main", "program_name"]


def _print(result: dict, as_json: bool) -> None:
    """``result`` as one JSON object, or as ``key  value`` lines (floats to 6 digits)."""
    if as_json:
        print(json.dumps(finite_or_none(result), allow_nan=False))
        return
    width = max(len(k) for k in result)
    for key, value in result.items():
        shown = f"{value:.6g}" if isinstance(value, float) else value
        print(f"{key:<{width}}  {shown}")


def _interrupted(err: KeyboardInterrupt) -> str:
    """What Ctrl-C left: a training run's checkpoint at the step it stopped, and how to go on."""
    if not getattr(err, "saved", False):
        return str(err) or "interrupted"
    return f"{err}: the same command resumes from it"


def main(argv=None) -> int:
    """Entry point (``python -m fvlib``, the ``fvlib`` script): parse ``argv`` (default
    ``sys.argv[1:]``), run the subcommand and print its result; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        result = args.handler(args)
    except CliError as err:
        print(f"fvlib: error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # validation inside the library names the bad value
        print(f"fvlib: error: {err}".splitlines()[0], file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        print(f"fvlib: {_interrupted(err)}", file=sys.stderr)
        return 130
    except OSError as err:  # e.g. a full disk while writing a result file: one line naming it
        print(f"fvlib: error: {err}".splitlines()[0], file=sys.stderr)
        return 1
    try:
        _print(result, getattr(args, "json", False))
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
    return 0
