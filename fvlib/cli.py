"""Command-line interface: ``python -m fvlib theory|train|gap|warm|patch|reproduce|experiment``.

The contract (subcommands, flags, JSON keys) is the book's appendix *Conventions*, section "The command line".

Bad input never shows a traceback: the message names the flag and the bad value on one line
and the exit status is 2, before any expensive work. Sizes are checked against an estimate of
their cost first: ``theory`` is refused when it would need more memory than the machine has or
more than :data:`THEORY_TIME_LIMIT` seconds of computing (and says how long it will take when
that is over :data:`NOTE_AFTER` seconds); ``train`` is refused when it would need more memory
than the machine (or the GPU) has, and shows its progress otherwise. JSON output holds ``null``
where a number is not finite, never a bare ``NaN`` or ``Infinity``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from ._checks import check_budget, check_int, check_number, check_seed

__all__ = ["main", "build_parser"]


class CliError(Exception):
    """A user error: printed on one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise CliError(message)


#: ``theory`` refuses a run estimated (:func:`fvlib.theory.theory_cost`) to need more seconds
#: of computing than this, and notes on stderr how long one over :data:`NOTE_AFTER` takes.
THEORY_TIME_LIMIT = 3600.0
NOTE_AFTER = 60.0


def _integer(name, low=None, high=None, check=None):
    """An argparse type: an integer in ``[low, high]``, checked by :func:`fvlib._checks.check_int`
    (or by ``check(name, value)``)."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        return _checked(check, name, value) if check else _checked(check_int, name, value, low, high)

    return parse


def _seed(name="--seed"):
    """An argparse type: a seed, one rule for every subcommand (:func:`fvlib._checks.check_seed`)."""
    return _integer(name, check=check_seed)


def _positive_int(name):
    return _integer(name, 1)


def _number(name, low=None, high=None, low_open=False):
    """An argparse type: a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``)."""

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        return _checked(check_number, name, value, low, high, low_open=low_open)

    return parse


def _checked(check, *args, **kwargs):
    """Run a :mod:`fvlib._checks` check; its ``ValueError`` becomes argparse's one-line error."""
    try:
        return check(*args, **kwargs)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _writable_dir(flag: str, path) -> None:
    """Before any work: directory ``path``, given by ``flag``, exists or can be made, and is writable."""
    from .training.rundir import RunDirError, check_writable_dir

    try:
        check_writable_dir(path)
    except RunDirError as err:
        raise CliError(f"{flag}: {err}") from None


def _add_task_args(p, prior_choices):
    from .priors import MAX_TREE_DEPTH
    from .task import MAX_NOISE_STD

    p.add_argument("--prior", choices=prior_choices, default="tree")
    p.add_argument("--depth", type=_integer("--depth", 1, MAX_TREE_DEPTH), required=True, help="tree depth K (D = 2^K - 1)")
    p.add_argument("--alpha", type=_number("--alpha", 0.0, 1.0, low_open=True), default=0.5)
    p.add_argument("--n-ctx", type=_positive_int("--n-ctx"), required=True, help="context length N")
    p.add_argument("--noise-std", type=_number("--noise-std", 0.0, MAX_NOISE_STD), default=0.0, help="label noise sigma")
    p.add_argument("--budget", type=_positive_int("--budget"), required=True, help="measurement budget M, in [1, D]")
    p.add_argument("--seed", type=_seed(), default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def program_name(argv0: str | None = None) -> str:
    """How the user called the CLI (``sys.argv[0]`` by default): ``python -m fvlib`` for the
    module (``.../fvlib/__main__.py``), else the script's name (``fvlib``, the console script)."""
    name = os.path.basename(sys.argv[0] if argv0 is None else argv0)
    return "python -m fvlib" if name in ("__main__.py", "") else name
def _check_budget(args) -> None:
    """One rule for ``--budget`` in every subcommand: an integer in ``[1, D]``."""
    try:
        check_budget("--budget", args.budget, args.depth, "--depth")
    except ValueError as err:
        raise CliError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=program_name(), description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    theory = sub.add_parser("theory", help="theory baselines for one configuration")
    _add_task_args(theory, ["tree"])
    theory.add_argument("--samples", type=_positive_int("--samples"), default=4000, help="Monte Carlo contexts")
    theory.add_argument("--optimised", action="store_true", help="also optimise general non-adaptive directions and the adaptive policy")
    theory.add_argument("--dp", action="store_true", help="also the DP-optimal policy, with and without re-measuring (depth <= 3)")
    theory.add_argument("--stderr", action="store_true", help="add Monte Carlo standard errors to the JSON")
    theory.set_defaults(handler=_run_theory)

    train = sub.add_parser("train", help="train model A, B or C (or a standard transformer) and save a checkpoint")
    train.add_argument("--model", choices=["A", "B", "C"], required=True)
    train.add_argument(
        "--arch", choices=["constrained", "transformer", "transformer-open"], default="constrained",
        help="constrained (models A, B, C), transformer (bottlenecked; A', B'), transformer-open",
    )
    _add_task_args(train, ["tree", "gaussian-twin", "gaussian"])
    train.add_argument("--steps", type=_positive_int("--steps"), required=True)
    # recipe options: None takes fvlib.training.recipe_for(--arch, --prior, --alpha): LEARNING_RECIPE (no
    # teacher) for constrained models, TRANSFORMER_RECIPE otherwise; --imitation: IMITATION_RECIPE
    train.add_argument("--batch", type=_positive_int("--batch"), default=None,
                       help="contexts per step (default 512; transformers 64; 256 with --imitation)")
    train.add_argument("--lr", type=_number("--lr", 0.0, None, low_open=True), default=None,
                       help="peak learning rate (default 1e-2; transformers 2e-3)")
    train.add_argument("--warmup", type=_number("--warmup", 0.0, 1.0), default=None,
                       help="fraction of --steps spent warming up the learning rate, in [0, 1)")
    train.add_argument("--queries", type=_positive_int("--queries"), default=None,
                       help="query tokens per training context (default 256; transformers 64)")
    train.add_argument("--width", type=_positive_int("--width"), default=None, help="MLP width, d_model for transformers (default 256; transformers 32)")
    train.add_argument("--imitation", action="store_true",
                       help="model A on the tree prior: start with the imitation warm start (its router "
                            "first fitted to the greedy policy, fvlib.training.IMITATION_RECIPE); default: no teacher")
    train.add_argument("--router-warm-start", type=_integer("--router-warm-start", 0), default=None,
                       help="model A on the tree prior: steps fitting its router to the greedy policy "
                            "before training (default 0: none; 600 with --imitation)")
    train.add_argument("--router-lr-scale", type=_number("--router-lr-scale", 0.0, 1.0, low_open=True), default=None,
                       help="a warm-started router's learning rate as a fraction of --lr (default 0.1)")
    train.add_argument("--expected-loss", action=argparse.BooleanOptionalAction, default=None,
                       help="constrained models: train on the query loss's expectation over the query token, "
                            "|theta_hat - theta|^2 + sigma^2 (infinitely many query tokens; --queries unused); "
                            "the default for constrained models without --imitation; --no-expected-loss: "
                            "sampled query tokens")
    train.add_argument("--alpha-start", type=_number("--alpha-start", 0.0, 1.0, low_open=True), default=None,
                       help="tree prior: a curriculum over the decay, from this alpha at step 0 to --alpha "
                            "(default for constrained models without --imitation: alpha + 0.4 (1 - alpha), "
                            "fvlib.training.curriculum_start)")
    train.add_argument("--alpha-ramp", type=_number("--alpha-ramp", 0.0, 1.0, low_open=True), default=None,
                       help="with a curriculum: the fraction of --steps over which alpha moves (default 0.6)")
    train.add_argument("--no-curriculum", action="store_true",
                       help="tree prior: train at --alpha from the first step (no curriculum)")
    train.add_argument("--inputs", choices=["auto", "statistic", "tokens"], default="auto",
                       help="what each step draws and the model reads: statistic (each context's pooled statistic, "
                            "drawn exactly without its tokens: a longer context costs nothing), tokens (every "
                            "token), auto (statistic for constrained models, tokens for transformers)")
    train.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, ...")
    train.add_argument("--out", required=True, help="run directory (resumed if it holds a checkpoint)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.set_defaults(handler=_run_train)

    gap = sub.add_parser("gap", help="how close a trained run of model A on the tree comes to the best "
                                     "adaptive reference (chapter 8's gap table)")
    gap.add_argument("--run", required=True, help="run directory written by 'train'")
    gap.add_argument("--contexts", type=_integer("--contexts", 2), default=4000,
                     help="task contexts, the same for the model and the references")
    gap.add_argument("--seed", type=_integer("--seed", 0), default=0, help="seed of the contexts and the optimisation")
    gap.add_argument("--json", action="store_true", help="print one JSON object")
    gap.set_defaults(handler=_run_gap)

    _add_warm_parser(sub, "warm", "the same as 'experiment warm'")
    patch = sub.add_parser("patch", help="key-patching heatmap of a trained tree-prior run")
    patch.add_argument("--run", required=True, help="run directory written by 'train'")
    patch.add_argument("--contexts", type=_positive_int("--contexts"), default=2000, help="pairs per split level")
    patch.add_argument("--seed", type=_seed(), default=0)
    patch.add_argument("--json", action="store_true", help="print one JSON object")
    patch.set_defaults(handler=_run_patch)

    _add_reproduce_parser(sub, "reproduce", "the same as 'experiment reproduce'")
    _add_experiment_parser(sub)
    return parser


def _add_warm_parser(sub, name: str, help_text: str) -> None:
    warm = sub.add_parser(name, help=help_text)
    warm.add_argument("--jobs", type=_positive_int("--jobs"), default=2, help="processes (one thread each)")
    warm.add_argument("--root", default=None, help="run root (default: $FVLIB_RUN_ROOT or ./.fvlib_runs)")
    warm.add_argument("--json", action="store_true", help="print one JSON object")
    warm.set_defaults(handler=_run_warm)


def _add_reproduce_parser(sub, name: str, help_text: str) -> None:
    repro = sub.add_parser(name, help=help_text)
    repro.add_argument("--quick", action="store_true", help="small configuration (about a minute)")
    repro.add_argument("--out", required=True, help="output directory")
    repro.add_argument("--seed", type=_seed(), default=0)
    repro.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    repro.set_defaults(handler=_run_reproduce)


def _add_experiment_parser(sub) -> None:
    """``experiment list|run|verify|show|warm|reproduce``: the book's experiments. The named
    long ones are stored in ``results/`` (:mod:`fvlib.experiments`); ``warm`` trains the short runs
    the chapters train in the page build, ``reproduce`` writes the headline numbers as JSON."""
    experiment = sub.add_parser("experiment", help="the book's experiments: list, run, verify, show (stored, "
                                                   "long); warm (the chapters' own runs); reproduce (headline JSON)")
    verbs = experiment.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    _add_warm_parser(verbs, "warm", "train the runs the chapters train, ahead of them, in parallel")
    _add_reproduce_parser(verbs, "reproduce", "regenerate the book's headline results as JSON files")
    listing = verbs.add_parser("list", help="every named experiment, its size and estimated cost")
    listing.add_argument("--json", action="store_true", help="print one JSON object")
    listing.set_defaults(handler=_run_experiment_list)
    run = verbs.add_parser("run", help="train an experiment's missing runs into results/NAME.json, and "
                                           "double again its runs still falling if its definition allows")
    run.add_argument("name")
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu")
    run.add_argument("--jobs", type=_positive_int("--jobs"), default=1, help="work items at a time (processes)")
    run.add_argument("--root", default=None, help="run root of the checkpoints (default: $FVLIB_RUN_ROOT or ./.fvlib_runs)")
    run.add_argument("--max-items", type=_positive_int("--max-items"), default=None,
                     help="stop after this many work items (resume later)")
    run.add_argument("--refresh-theory", action="store_true",
                     help="recompute the stored theory references with today's code (keeps the runs)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.set_defaults(handler=_run_experiment_run)
    check = verbs.add_parser("verify", help="retrain a prefix of each model family's cheapest stored run (--full: "
                                             "whole runs) and re-evaluate the references; compare with the store")
    check.add_argument("name")
    check.add_argument("--full", action="store_true",
                       help="retrain whole runs (the --runs cheapest) and re-optimise the references for "
                            "information, instead of the quick check of a prefix per model family")
    check.add_argument("--runs", type=_positive_int("--runs"), default=1, help="with --full: how many runs to retrain")
    check.add_argument("--no-theory", action="store_true", help="do not re-evaluate the theory references")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.set_defaults(handler=_run_experiment_verify)
    show = verbs.add_parser("show", help="the stored summary and provenance of an experiment")
    show.add_argument("name")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(handler=_run_experiment_show)


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
    from .theory import MAX_DP_DEPTH, MAX_DP_LAYERS, theory_baselines

    _check_budget(args)
    if args.dp and args.depth > MAX_DP_DEPTH:
        raise CliError(f"--dp needs --depth <= {MAX_DP_DEPTH}, got {args.depth}")
    if args.dp and args.budget > MAX_DP_LAYERS:
        raise CliError(f"--dp needs --budget <= {MAX_DP_LAYERS}, got {args.budget}")
    _check_theory_cost(args)
    tree = TreePrior(args.depth, args.alpha)
    res = theory_baselines(
        tree, args.n_ctx, args.noise_std, args.budget, samples=args.samples, seed=args.seed, optimised=args.optimised, dp=args.dp,
        adaptive_opt=args.optimised,
    )
    keys = list(THEORY_KEYS) + [k for k in ("nonadaptive_opt", "adaptive_opt", "dp_optimal", "dp_no_repeat") if k in res]
    out = {k: res[k] for k in keys}
    if args.stderr:
        out["stderr"] = {k[: -len("_stderr")]: v for k, v in res.items() if k.endswith("_stderr")}
        out["samples"] = res["samples"]
    return out


def _run_train(args) -> dict:
    from .training import IMITATION_RECIPE, TrainConfig, recipe_for, train

    _check_budget(args)
    if args.imitation and (args.arch, args.model, args.prior) != ("constrained", "A", "tree"):
        raise CliError(f"--imitation needs --arch constrained --model A --prior tree (the teacher is the greedy "
                       f"policy of model A's router), got --arch {args.arch} --model {args.model} --prior {args.prior}")
    if args.inputs == "statistic" and args.arch != "constrained":
        raise CliError(f"--inputs statistic needs --arch constrained (models A, B, C read only the pooled "
                       f"statistic); --arch {args.arch} reads every token")
    if args.no_curriculum and args.alpha_start is not None:
        raise CliError(f"--no-curriculum and --alpha-start {args.alpha_start} contradict each other")
    recipe = (dict(IMITATION_RECIPE) if args.imitation
              else recipe_for(args.arch, args.prior, args.alpha))  # flags given override it
    recipe.update({k: getattr(args, k) for k in ("batch", "lr", "warmup", "queries", "width", "expected_loss",
                                                  "router_warm_start", "router_lr_scale", "alpha_start", "alpha_ramp")
                   if getattr(args, k) is not None})
    if args.no_curriculum:
        recipe.pop("alpha_start", None)
    if args.alpha_ramp is not None and recipe.get("alpha_start") is None:
        raise CliError("--alpha-ramp needs a curriculum (--alpha-start; the tree prior's default without "
                       "--imitation or --no-curriculum)")
    if recipe.get("warmup", 0) == 1:
        raise CliError("--warmup must be a fraction in [0, 1), got 1")
    config = TrainConfig(
        model=args.model, prior=args.prior, depth=args.depth, alpha=args.alpha, n_ctx=args.n_ctx,
        noise_std=args.noise_std, budget=args.budget, steps=args.steps, seed=args.seed, device=args.device,
        arch=args.arch, inputs=args.inputs, **recipe,
    )
    _check_train_memory(config)
    _writable_dir("--out", args.out)
    result = train(config, out_dir=args.out, progress=not args.no_progress)
    return {
        "final_loss": result.final_loss,
        "seconds": result.seconds,
        "checkpoint": str(result.checkpoint),
        "steps": config.steps,
        "model": config.model,
        "prior": config.prior,
        "inputs": config.input_path,
    }


def _memory_limit(device=None) -> float:
    """The memory there is for a run: the GPU's for a CUDA device, else the machine's RAM."""
    import torch

    if device is not None and device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):  # no sysconf (Windows): no limit known
        return math.inf


def _culprit(estimate, values: dict, reference: dict) -> str:
    """The flag (with its value) whose ``reference`` value lowers ``estimate(values)`` the most:
    the one to name when the estimate is over a limit."""

    def lowered(name):
        try:
            return estimate({**values, name: reference[name]})
        except ValueError:  # the reference value does not fit the others
            return math.inf

    name = min(reference, key=lowered)
    flag = "--" + name.replace("_", "-")
    return flag if values[name] is True else f"{flag} {values[name]}"


def _size(nbytes: float) -> str:
    if nbytes >= 1e12:
        return f"{nbytes / 1e12:.3g} TB"
    return f"{nbytes / 1e9:.3g} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.3g} MB"


def _duration(seconds: float) -> str:
    if seconds >= 3600 * 24 * 365:
        return f"{seconds / (3600 * 24 * 365):.2g} years"
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 60:.2g} min" if seconds >= 60 else f"{seconds:.2g} s"


def _check_theory_cost(args) -> None:
    """Refuse a ``theory`` run that cannot fit or finish (:func:`fvlib.theory.theory_cost`), naming
    the flag most responsible; note on stderr how long a long one takes."""
    from .theory import theory_cost

    values = {name: getattr(args, name) for name in ("depth", "n_ctx", "budget", "samples", "optimised", "dp")}
    reference = {"depth": 6, "n_ctx": 128, "budget": min(6, 2**args.depth - 1), "samples": 4000,
                 "optimised": False, "dp": False}  # the book's reference configuration
    seconds, memory = theory_cost(**values)
    limit = _memory_limit()
    if memory > limit:
        culprit = _culprit(lambda v: theory_cost(**v)[1], values, reference)
        raise CliError(f"{culprit}: theory needs about {_size(memory)} of memory (estimated), more than the "
                       f"{_size(limit)} this machine has")
    if seconds > THEORY_TIME_LIMIT:
        culprit = _culprit(lambda v: theory_cost(**v)[0], values, reference)
        raise CliError(f"{culprit}: theory needs about {_duration(seconds)} of computing (estimated on one "
                       f"core), over the limit of {_duration(THEORY_TIME_LIMIT)}")
    if seconds > NOTE_AFTER:
        print(f"fvlib: note: this takes about {_duration(seconds)} (estimated on one core)", file=sys.stderr)


def _check_train_memory(config) -> None:
    """Refuse a training run that cannot fit in memory (:func:`fvlib.training.config.estimate_memory`),
    naming the flag most responsible."""
    from dataclasses import replace

    from .training import TrainConfig, estimate_memory, recipe_for, resolve_device

    memory = estimate_memory(config)
    device = resolve_device(config.device)
    limit = _memory_limit(device)
    if memory <= limit:
        return
    default = replace(TrainConfig(arch=config.arch, model=config.model),
                      **recipe_for(config.arch, config.prior, config.alpha))
    names = ("depth", "n_ctx", "batch", "queries", "width")
    values = {name: getattr(config, name) for name in names}
    culprit = _culprit(lambda v: estimate_memory(replace(config, **v)), values,
                       {name: getattr(default, name) for name in names})
    where = "the GPU" if device.type == "cuda" else "this machine"
    raise CliError(f"{culprit}: training needs about {_size(memory)} of memory (estimated), more than the "
                   f"{_size(limit)} {where} has")


#: The rows of ``gap --json``: mean excess losses on the same contexts (chapter 8's gap table).
GAP_ROWS = ("model", "router_bayes", "adaptive_greedy_paired", "adaptive_opt_paired")


def _run_gap(args) -> dict:
    """Chapter 8's gap table (:func:`fvlib.analysis.gap_table`) of a trained run of model A
    on the tree prior: the model, its router with the exact Bayes decoder, and greedy and the
    optimised adaptive policy on the model's own contexts; ``ratio``: the model over the
    better of the two, context by context."""
    from .analysis import gap_table
    from .training import RunDirError, load_run

    try:
        model, config, _ = load_run(args.run)
    except RunDirError as err:
        raise CliError(f"--run: {err}") from None
    if (config.arch, config.model, config.prior) != ("constrained", "A", "tree"):
        raise CliError(f"gap needs a run of model A (--arch constrained) on the tree prior; {args.run} is "
                       f"model {config.model} (--arch {config.arch}) on the {config.prior} prior")
    table = gap_table(model, config, contexts=args.contexts, seed=args.seed)
    best = table["best_paired"]
    (ratio, ratio_se), (bayes_ratio, bayes_ratio_se) = table["ratios"]["model"], table["ratios"]["router_bayes"]
    if args.json:
        out = {row: _finite_or_none(table[row][0]) for row in GAP_ROWS}
        out["stderr"] = {row: _finite_or_none(table[row][1]) for row in GAP_ROWS}
        out["best_paired"] = best
        for key, value in (("ratio", ratio), ("ratio_stderr", ratio_se), ("router_bayes_ratio", bayes_ratio),
                           ("router_bayes_ratio_stderr", bayes_ratio_se)):
            out[key] = _finite_or_none(value)
        return {**out, "adaptive_opt_kind": table["adaptive_opt_kind"], "contexts": args.contexts,
                "seed": args.seed}
    names = {"model": "model A", "router_bayes": "its router + Bayes decoder",
             "adaptive_greedy_paired": "greedy (paired)", "adaptive_opt_paired": "optimised adaptive (paired)"}
    out = {names[row]: f"{table[row][0]:.4g} +- {table[row][1]:.2g}" + ("  (best paired)" if row == best else "")
           for row in GAP_ROWS}
    out["model / best paired"] = f"{ratio:.3g} +- {ratio_se:.2g}"
    out["router + Bayes / best paired"] = f"{bayes_ratio:.3g} +- {bayes_ratio_se:.2g}"
    out["contexts"] = f"{args.contexts} (seed {args.seed}), excess loss E|theta_hat - theta|^2"
    return out


def _run_warm(args) -> dict:
    """The runs the chapters train (:func:`fvlib.catalogue.warm_work`), each exactly as the
    chapter trains it, ``--jobs`` processes at a time."""
    from .catalogue import train_parallel, warm_work
    from .training import run_root

    _writable_dir("--root", run_root(args.root))
    return {"runs": train_parallel(warm_work(), jobs=args.jobs, root=args.root)}


def _run_patch(args) -> dict:
    from .interventions import key_patching_sweep, state_patching_sweep
    from .priors import TreePrior
    from .theory import theory_patching_sweep
    from .training import RunDirError, build_prior, load_run

    try:
        model, config, _ = load_run(args.run)
    except RunDirError as err:
        raise CliError(f"--run: {err}") from None
    if config.arch == "transformer-open":
        raise CliError(f"patch supports --arch constrained runs (key patching) and --arch transformer runs "
                       f"(its state-patching analogue); {args.run} is an --arch {config.arch} run, which has "
                       f"no separate state to patch (use fvlib.interventions.transplant_stream)")
    prior = build_prior(config)
    if not isinstance(prior, TreePrior):
        raise CliError(f"patching needs a run trained on the tree prior, {args.run} used {config.prior!r}")
    kw = dict(contexts=args.contexts, seed=args.seed)
    if config.arch == "constrained":
        model_side = key_patching_sweep(model, prior, config.n_ctx, config.noise_std, **kw)
    else:
        model_side = state_patching_sweep(model, prior, config.n_ctx, config.noise_std, **kw)
    theory_side = theory_patching_sweep(prior, config.n_ctx, config.noise_std, model.config.n_layers, **kw)
    return {
        "baseline": model_side.baseline,
        "loss": model_side.loss.tolist(),
        "theory_loss": theory_side.loss.tolist(),
        "theory_baseline": theory_side.baseline,
        "stderr": model_side.stderr.tolist(),
        "split_levels": model_side.split_levels,
        "layers": model_side.layers,
        "contexts": args.contexts,
    }


def _run_reproduce(args) -> dict:
    from .experiments.reproduce import reproduce

    _writable_dir("--out", args.out)
    return reproduce(args.out, quick=args.quick, seed=args.seed, progress=not args.no_progress)


def _experiment_name(name: str) -> str:
    from .experiments import experiment_names

    if name not in experiment_names():
        raise CliError(f"unknown experiment {name!r}; choose from {', '.join(experiment_names())}")
    return name


def _run_experiment_list(args) -> dict:
    from .experiments import EXPERIMENTS, estimate_seconds, provenance_summary, result_path

    out = {}
    for name, e in EXPERIMENTS.items():
        path = result_path(name)
        runs, spent = {}, 0.0
        if path.is_file():
            try:
                data = json.loads(path.read_text())
                runs = data.get("runs", {})
                spent = provenance_summary(data).get("cpu_seconds", 0.0)
            except (OSError, ValueError, KeyError, TypeError):
                runs, spent = {}, 0.0
        left = [r for r in e.runs if r.key not in runs]
        out[name] = {"description": e.description, "chapter": e.chapter, "runs": len(e.runs),
                     "stored_runs": len(e.runs) - len(left), "work_items": len(e.items),
                     "estimated_cpu_minutes": round(sum(estimate_seconds(r.config) for r in e.runs) / 60, 1),
                     "stored_cpu_minutes": round(spent / 60, 1),
                     "remaining_cpu_minutes": round(sum(estimate_seconds(r.config) for r in left) / 60, 1),
                     "max_doublings": e.max_doublings}
    if args.json:
        return {"experiments": out}
    return {name: f"{v['runs']} runs ({v['stored_runs']} stored, {v['stored_cpu_minutes']} CPU min spent), "
                  f"about {v['remaining_cpu_minutes']} CPU min left"
                  + (f" before doublings (x1 to x{2 ** (v['max_doublings'] + 1) - 1} when runs are doubled)"
                     if v["max_doublings"] else " (no doublings)")
                  + f": {v['description']}" for name, v in out.items()}


def _run_experiment_run(args) -> dict:
    from .experiments import run, summarise
    from .training import run_root

    name = _experiment_name(args.name)
    _writable_dir("--root", run_root(args.root))
    data = run(name, device=args.device, jobs=args.jobs, root=args.root,
               progress=not args.no_progress, max_items=args.max_items, refresh_theory=args.refresh_theory)
    return {"experiment": args.name, "stored_runs": len(data["runs"]), "planned_runs": len(data["planned_runs"]),
            "not_converged": sum(not r["converged"] for r in data["runs"].values()),
            **({"summary": summarise(data)} if args.json else {})}


def _run_experiment_verify(args) -> dict:
    from .experiments import verify

    if args.runs != 1 and not args.full:
        raise CliError(f"--runs {args.runs} needs --full (the quick check retrains one prefix per model family)")
    result = verify(_experiment_name(args.name), runs=args.runs, theory=not args.no_theory, full=args.full)
    theory = result["theory"]
    if not result["ok"]:
        bad = [c for c in result["checked"] if not c["ok"]]
        detail = [f"{c['key']}: stored {c['stored']:.6g}, retrained {c['retrained']:.6g} at step {c['steps']}, "
                  f"tolerance {c['tolerance']:.3g}" + (" (relative)" if result["mode"] == "prefix" else "")
                  for c in bad]
        if theory and theory["differences"]:
            diffs = theory["differences"]
            detail.append(f"{len(diffs)} theory value(s) differ, e.g. {diffs[0]['path']}: stored "
                          f"{diffs[0]['stored']}, re-evaluated {diffs[0]['fresh']} (after a fix of the theory "
                          f"code: `python -m fvlib experiment run {args.name} --refresh-theory`)")
        raise CliError(f"experiment {args.name} does not reproduce: {'; '.join(detail)}")
    if args.json:
        return result
    out = {"experiment": args.name, "ok": True, "mode": result["mode"], "configs_rebuilt": result["configs_rebuilt"],
           **{c["key"]: f"stored {c['stored']:.6g}, retrained {c['retrained']:.6g} at step {c['steps']} "
                        f"(tolerance {c['tolerance']:.3g}{' relative' if result['mode'] == 'prefix' else ''}, "
                        f"{c['seconds']} s)" for c in result["checked"]},
           "theory": (f"{theory['checked']} stored values re-evaluated from the stored parameters, all within "
                      f"tolerance ({theory['seconds']} s)" if theory else "not checked")}
    if theory and theory.get("reoptimised"):
        out["re-optimised (information only)"] = json.dumps(theory["reoptimised"])[:300]
    return out


def _run_experiment_show(args) -> dict:
    from .experiments import get_experiment, load_result, provenance_summary, runs_to_double, summarise

    data = load_result(_experiment_name(args.name))
    out = {"experiment": args.name, "description": data["description"], "stored_runs": len(data["runs"]),
           "planned_runs": len(data["planned_runs"]),
           # runs still falling that the definition allows to double again (`experiment run`)
           "runs_to_double": len(runs_to_double(data, get_experiment(args.name))),
           "provenance": provenance_summary(data)}
    if args.json:
        return {**out, "summary": summarise(data), "theory": data["theory"]}
    for row in summarise(data):
        ratio = f", x{row['ratio_mean']:.2f} greedy" if "ratio_mean" in row else ""
        out[f"{row['variant']} {row['prior']} M={row['budget']}"] = (
            f"{row['mean']:.4g} +- {row['stderr']:.2g} (seeds {row['seeds']}, spread {row['spread']:.2g}, "
            f"not converged {row['not_converged']}{ratio})")
    out["provenance"] = json.dumps(out["provenance"])
    return out


def _finite_or_none(value):
    """``value`` with every float that is not finite replaced by ``None`` (JSON ``null``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(_finite_or_none(result), allow_nan=False))
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
        result = args.handler(args)
    except CliError as err:
        print(f"fvlib: error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # validation inside the library names the bad value
        print(f"fvlib: error: {err}".splitlines()[0], file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fvlib: interrupted", file=sys.stderr)
        return 130
    except OSError as err:  # e.g. a full disk while writing a result file: one line naming it
        print(f"fvlib: error: {err}".splitlines()[0], file=sys.stderr)
        return 1
    try:
        _print(result, getattr(args, "json", False))
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
    return 0
