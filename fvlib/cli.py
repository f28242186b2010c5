"""Command-line interface (DESIGN section 8): ``python -m fvlib theory|train|patch|reproduce``.

Bad input never shows a traceback: the message names the bad value on one line and the exit
status is 2.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main", "build_parser"]


class CliError(Exception):
    """A user error: printed on one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise CliError(message)


def _positive_int(name):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {value}")
        return value

    return parse


def _number(name, low=None, high=None, low_open=False):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{name} must be finite, got {text!r}")
        too_low = low is not None and (value <= low if low_open else value < low)
        if too_low or (high is not None and value > high):
            lo = "(" if low_open else "["
            raise argparse.ArgumentTypeError(f"{name} must be in {lo}{low}, {high}], got {text}")
        return value

    return parse


def _add_task_args(p, prior_choices):
    p.add_argument("--prior", choices=prior_choices, default="tree")
    p.add_argument("--depth", type=_positive_int("--depth"), required=True, help="tree depth K (D = 2^K - 1)")
    p.add_argument("--alpha", type=_number("--alpha", 0.0, 1.0, low_open=True), default=0.5)
    p.add_argument("--n-ctx", type=_positive_int("--n-ctx"), required=True, help="context length N")
    p.add_argument("--noise-std", type=_number("--noise-std", 0.0, None), default=0.0, help="label noise sigma")
    p.add_argument("--budget", type=_positive_int("--budget"), required=True, help="measurement budget M")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m fvlib", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    theory = sub.add_parser("theory", help="theory baselines for one configuration")
    _add_task_args(theory, ["tree"])
    theory.add_argument("--samples", type=_positive_int("--samples"), default=4000, help="Monte Carlo contexts")
    theory.add_argument("--optimised", action="store_true", help="also optimise general non-adaptive directions")
    theory.add_argument("--dp", action="store_true", help="also the DP-optimal policy (depth <= 3)")
    theory.add_argument("--stderr", action="store_true", help="add Monte Carlo standard errors to the JSON")
    theory.set_defaults(run=_run_theory)
    return parser


THEORY_KEYS = (
    "tau2",
    "adaptive_greedy",
    "nonadaptive_coord",
    "lmmse",
    "gaussian_twin",
    "noisefree_adaptive",
    "noisefree_nonadaptive",
)


def _run_theory(args) -> dict:
    from .priors import TreePrior
    from .theory import theory_baselines

    tree = TreePrior(args.depth, args.alpha)
    if args.budget > tree.dim:
        raise CliError(f"--budget must be <= D = 2^K - 1 = {tree.dim}, got {args.budget}")
    if args.dp and args.depth > 3:
        raise CliError(f"--dp needs --depth <= 3, got {args.depth}")
    res = theory_baselines(
        tree, args.n_ctx, args.noise_std, args.budget, samples=args.samples, seed=args.seed, optimised=args.optimised, dp=args.dp
    )
    keys = list(THEORY_KEYS) + [k for k in ("nonadaptive_opt", "dp_optimal") if k in res]
    out = {k: res[k] for k in keys}
    if args.stderr:
        out["stderr"] = {k[: -len("_stderr")]: v for k, v in res.items() if k.endswith("_stderr")}
        out["samples"] = res["samples"]
    return out


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    width = max(len(k) for k in result)
    for key, value in result.items():
        shown = f"{value:.6g}" if isinstance(value, float) else value
        print(f"{key:<{width}}  {shown}")


def main(argv=None) -> int:
    """Entry point; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        result = args.run(args)
    except CliError as err:
        print(f"fvlib: error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # validation inside the library names the bad value
        print(f"fvlib: error: {err}".splitlines()[0], file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fvlib: interrupted", file=sys.stderr)
        return 130
    _print(result, getattr(args, "json", False))
    return 0
