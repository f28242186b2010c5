"""The parser of ``python -m fvlib``: its subcommands and their flags. The flags of ``train``
that set the run are the fields of :class:`fvlib.training.TrainConfig`
(:mod:`fvlib.cli.train_flags`); each subcommand's parser names its function of
:mod:`fvlib.cli.dispatch` as ``handler``.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import dispatch
from .argtypes import OneLineParser, integer, number, positive_int, seed
from .train_flags import add_config_flags, config_help

__all__ = ["DESCRIPTION", "build_parser", "program_name"]

#: The first line of ``python -m fvlib --help``.
DESCRIPTION = "Command-line interface: ``python -m fvlib theory|train|gap|warm|patch|reproduce|experiment``."
_JSON_HELP = "print one JSON object"


def program_name(argv0: str | None = None) -> str:
    """How the user called the CLI (``sys.argv[0]`` by default): ``python -m fvlib`` for the
    module (``.../fvlib/__main__.py``), else the script's name (``fvlib``, the console script)."""
    name = os.path.basename(sys.argv[0] if argv0 is None else argv0)
    return "python -m fvlib" if name in ("__main__.py", "") else name


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand; its errors raise :class:`fvlib.cli.limits.CliError`."""
    parser = OneLineParser(prog=program_name(), description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    _add_theory_parser(sub)
    _add_train_parser(sub)
    _add_gap_parser(sub)
    _add_warm_parser(sub, "warm", "the same as 'experiment warm'")
    _add_patch_parser(sub)
    _add_reproduce_parser(sub, "reproduce", "the same as 'experiment reproduce'")
    _add_experiment_parser(sub)
    return parser


def _add_theory_parser(sub) -> None:
    """``theory``: its task flags share their help with ``train``'s (the config's fields); their
    values are checked here, as no config checks them."""
    from ..priors import MAX_TREE_DEPTH
    from ..task import MAX_NOISE_STD

    theory = sub.add_parser("theory", help="theory baselines for one configuration")
    theory.add_argument("--prior", choices=["tree"], default="tree", help=config_help("prior"))
    theory.add_argument("--depth", type=integer("--depth", 1, MAX_TREE_DEPTH), required=True,
                        help=config_help("depth"))
    theory.add_argument("--alpha", type=number("--alpha", 0.0, 1.0, low_open=True), default=0.5,
                        help=config_help("alpha"))
    theory.add_argument("--n-ctx", type=positive_int("--n-ctx"), required=True, help=config_help("n_ctx"))
    theory.add_argument("--noise-std", type=number("--noise-std", 0.0, MAX_NOISE_STD), default=0.0,
                        help=config_help("noise_std"))
    theory.add_argument("--budget", type=positive_int("--budget"), required=True, help=config_help("budget"))
    theory.add_argument("--seed", type=seed(), default=0, help=config_help("seed"))
    theory.add_argument("--json", action="store_true", help=_JSON_HELP)
    theory.add_argument("--samples", type=positive_int("--samples"), default=4000, help="Monte Carlo contexts")
    theory.add_argument("--optimised", action="store_true",
                        help="also optimise general non-adaptive directions and the adaptive policy")
    theory.add_argument("--dp", action="store_true",
                        help="also the DP-optimal policy, with and without re-measuring (depth <= 3)")
    theory.add_argument("--stderr", action="store_true", help="add Monte Carlo standard errors to the JSON")
    theory.set_defaults(handler=dispatch.theory)


def _add_train_parser(sub) -> None:
    """``train``: a flag per field of the config, then the flags of the command line alone."""
    train = sub.add_parser("train", help="train model A, B or C (or a standard transformer) and save a checkpoint")
    add_config_flags(train)
    train.add_argument("--imitation", action="store_true",
                       help="model A on the tree prior: start with the imitation warm start (its router "
                            "first fitted to the greedy policy, fvlib.training.IMITATION_RECIPE); default: no teacher")
    train.add_argument("--no-curriculum", action="store_true",
                       help="tree prior: train at --alpha from the first step (no curriculum)")
    train.add_argument("--json", action="store_true", help=_JSON_HELP)
    train.add_argument("--out", required=True, help="run directory (resumed if it holds a checkpoint); a "
                                                    "directory holding other files is refused")
    train.add_argument("--repair", action="store_true",
                       help="a run directory without manifest.json (written before manifests, or its manifest "
                            "lost): check its files against the flags, write the manifest, then go on")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.set_defaults(handler=dispatch.train)


def _add_gap_parser(sub) -> None:
    gap = sub.add_parser("gap", help="how close a trained run of model A on the tree comes to the best "
                                     "adaptive reference (chapter 8's gap table)")
    gap.add_argument("--run", required=True, help="run directory written by 'train'")
    gap.add_argument("--contexts", type=integer("--contexts", 2), default=4000,
                     help="task contexts, the same for the model and the references")
    gap.add_argument("--seed", type=seed(), default=0, help="seed of the contexts and the optimisation")
    gap.add_argument("--json", action="store_true", help=_JSON_HELP)
    gap.set_defaults(handler=dispatch.gap)


def _add_patch_parser(sub) -> None:
    patch = sub.add_parser("patch", help="key-patching heatmap of a trained tree-prior run")
    patch.add_argument("--run", required=True, help="run directory written by 'train'")
    patch.add_argument("--contexts", type=positive_int("--contexts"), default=2000, help="pairs per split level")
    patch.add_argument("--seed", type=seed(), default=0)
    patch.add_argument("--json", action="store_true", help=_JSON_HELP)
    patch.set_defaults(handler=dispatch.patch)


def _add_warm_parser(sub, name: str, help_text: str) -> None:
    warm = sub.add_parser(name, help=help_text)
    warm.add_argument("--jobs", type=positive_int("--jobs"), default=2, help="processes (one thread each)")
    warm.add_argument("--root", default=None, help="run root (default: $FVLIB_RUN_ROOT or ./.fvlib_runs)")
    warm.add_argument("--json", action="store_true", help=_JSON_HELP)
    warm.set_defaults(handler=dispatch.warm)


def _add_reproduce_parser(sub, name: str, help_text: str) -> None:
    repro = sub.add_parser(name, help=help_text)
    repro.add_argument("--quick", action="store_true", help="small configuration (about a minute)")
    repro.add_argument("--out", required=True, help="output directory")
    repro.add_argument("--seed", type=seed(), default=0)
    repro.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    repro.set_defaults(handler=dispatch.reproduce)


def _add_experiment_parser(sub) -> None:
    """``experiment list|run|verify|seal|keep-models|show|warm|reproduce``: the book's experiments. The named
    long ones are stored in ``results/`` (:mod:`fvlib.experiments`); ``warm`` trains the short runs
    the chapters train in the page build, ``reproduce`` writes the headline numbers as JSON."""
    experiment = sub.add_parser("experiment", help="the book's experiments: list, run, verify, show (stored, "
                                                   "long); warm (the chapters' own runs); reproduce (headline JSON)")
    verbs = experiment.add_subparsers(dest="verb", required=True, parser_class=OneLineParser)
    _add_warm_parser(verbs, "warm", "train the runs the chapters train, ahead of them, in parallel")
    _add_reproduce_parser(verbs, "reproduce", "regenerate the book's headline results as JSON files")
    listing = verbs.add_parser("list", help="every named experiment, its size and estimated cost")
    listing.add_argument("--json", action="store_true", help=_JSON_HELP)
    listing.set_defaults(handler=dispatch.experiment_list)
    _add_experiment_run_parser(verbs)
    _add_experiment_verify_parser(verbs)
    seal = verbs.add_parser("seal", help="check a stored result file and seal it (the maintainer's step after "
                                         "restoring or upgrading a file; every read checks the seal)")
    seal.add_argument("name")
    seal.add_argument("--json", action="store_true", help=_JSON_HELP)
    seal.set_defaults(handler=dispatch.experiment_seal)
    keep = verbs.add_parser("keep-models", help="store the final weights of an experiment's kept runs beside its "
                                                "result (read from their run directories, re-evaluated against "
                                                "the stored losses) and seal them with it")
    keep.add_argument("name")
    keep.add_argument("--root", default=None,
                      help="run root of the checkpoints (default: $FVLIB_RUN_ROOT or ./.fvlib_runs)")
    keep.add_argument("--json", action="store_true", help=_JSON_HELP)
    keep.set_defaults(handler=dispatch.experiment_keep_models)
    show = verbs.add_parser("show", help="the stored summary and provenance of an experiment")
    show.add_argument("name")
    show.add_argument("--json", action="store_true", help=_JSON_HELP)
    show.set_defaults(handler=dispatch.experiment_show)


def _add_experiment_run_parser(verbs) -> None:
    run = verbs.add_parser("run", help="train an experiment's missing runs into results/NAME.json, and "
                                       "double again its runs still falling if its definition allows")
    run.add_argument("name")
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu")
    run.add_argument("--jobs", type=positive_int("--jobs"), default=1, help="work items at a time (processes)")
    run.add_argument("--root", default=None,
                     help="run root of the checkpoints (default: $FVLIB_RUN_ROOT or ./.fvlib_runs)")
    run.add_argument("--max-items", type=positive_int("--max-items"), default=None,
                     help="stop after this many work items (resume later)")
    run.add_argument("--refresh-theory", action="store_true",
                     help="recompute the stored theory references with today's code (keeps the runs)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    run.add_argument("--json", action="store_true", help=_JSON_HELP)
    run.set_defaults(handler=dispatch.experiment_run)


def _add_experiment_verify_parser(verbs) -> None:
    check = verbs.add_parser("verify", help="retrain a prefix of each model family's cheapest stored run (--full: "
                                            "whole runs) and re-evaluate the references; compare with the store")
    check.add_argument("name")
    check.add_argument("--full", action="store_true",
                       help="retrain whole runs (the --runs cheapest) and re-optimise the references for "
                            "information, instead of the quick check of a prefix per model family")
    check.add_argument("--runs", type=positive_int("--runs"), default=1, help="with --full: how many runs to retrain")
    check.add_argument("--no-theory", action="store_true", help="do not re-evaluate the theory references")
    check.add_argument("--json", action="store_true", help=_JSON_HELP)
    check.set_defaults(handler=dispatch.experiment_verify)
