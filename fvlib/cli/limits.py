"""The command line's refusals before any work: the one-line :class:`CliError`, and the checks
that size a run against the machine before it starts.

``theory``, ``gap`` and ``patch`` are refused when they would need more memory than there is
(:func:`memory_limit`) or more than :data:`TIME_LIMIT` seconds of computing (and say how long
they will take when that is over :data:`NOTE_AFTER` seconds); ``train`` is refused when it would
need more memory than there is on the machine (or the GPU), and ``warm`` when its ``--jobs``
runs at once would. A refusal names the flag most responsible (:func:`culprit`). Output
directories are checked writable before any work (:func:`check_writable_dir`).
"""

from __future__ import annotations

import math
import sys

from .._checks import check_budget
from ..resources import available_memory, format_bytes

__all__ = [
    "NOTE_AFTER",
    "TIME_LIMIT",
    "CliError",
    "check_contexts_cost",
    "check_jobs_memory",
    "check_theory_args",
    "check_theory_cost",
    "check_train_memory",
    "check_writable_dir",
    "culprit",
    "flag_for",
    "memory_limit",
]


class CliError(Exception):
    """A user error: printed on one line, exit status 2."""


#: ``theory``, ``gap`` and ``patch`` refuse a run estimated (:func:`fvlib.theory.theory_cost`,
#: :func:`fvlib.experiments.beside_theory.gap_cost`, :func:`fvlib.interventions.patching_cost`) to
#: need more seconds of computing than this, and note on stderr how long one over
#: :data:`NOTE_AFTER` takes.
TIME_LIMIT = 3600.0
NOTE_AFTER = 60.0


def flag_for(name: str) -> str:
    """The command-line flag of a field or argument name: ``n_ctx`` -> ``--n-ctx``."""
    return "--" + name.replace("_", "-")


def check_writable_dir(flag: str, path) -> None:
    """Before any work: directory ``path``, given by ``flag``, exists or can be made, and is writable."""
    from ..training.rundir import RunDirError
    from ..training.rundir import check_writable_dir as writable

    try:
        writable(path)
    except RunDirError as err:
        raise CliError(f"{flag}: {err}") from None


def check_theory_args(args) -> None:
    """Refuse a ``theory`` command line before any work: ``--budget`` in ``[1, D]`` (the rule of
    every subcommand), ``--dp`` within its depth and budget, and a cost that fits
    (:func:`check_theory_cost`)."""
    from ..theory import MAX_DP_DEPTH, MAX_DP_LAYERS

    try:
        check_budget("--budget", args.budget, args.depth, "--depth")
    except ValueError as err:
        raise CliError(str(err)) from None
    if args.dp and args.depth > MAX_DP_DEPTH:
        raise CliError(f"--dp needs --depth <= {MAX_DP_DEPTH}, got {args.depth}")
    if args.dp and args.budget > MAX_DP_LAYERS:
        raise CliError(f"--dp needs --budget <= {MAX_DP_LAYERS}, got {args.budget}")
    check_theory_cost(args)


def memory_limit(device=None) -> float:
    """The memory there is for a run, in bytes (:func:`fvlib.resources.available_memory`): the GPU's
    free memory for a CUDA ``torch.device``, else the smallest of the machine's available RAM, what
    ``ulimit -v`` leaves and what the cgroup leaves (``inf`` where nothing says)."""
    return available_memory(device)


def culprit(estimate, values: dict, reference: dict) -> str:
    """The flag (with its value) whose ``reference`` value lowers ``estimate(values)`` the most:
    the one to name when the estimate is over a limit. ``values`` and ``reference`` map field
    names (``n_ctx``) to values; the flag is ``--n-ctx``."""

    def lowered(name):
        try:
            return estimate({**values, name: reference[name]})
        except ValueError:  # the reference value does not fit the others
            return math.inf

    name = min(reference, key=lowered)
    return flag_for(name) if values[name] is True else f"{flag_for(name)} {values[name]}"


def _duration(seconds: float) -> str:
    if seconds >= 3600 * 24 * 365:
        return f"{seconds / (3600 * 24 * 365):.2g} years"
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 60:.2g} min" if seconds >= 60 else f"{seconds:.2g} s"


def check_theory_cost(args) -> None:
    """Refuse a ``theory`` run that cannot fit or finish (:func:`fvlib.theory.theory_cost`), naming
    the flag most responsible; note on stderr how long a long one takes."""
    from ..theory import theory_cost

    values = {name: getattr(args, name) for name in ("depth", "n_ctx", "budget", "samples", "optimised", "dp")}
    reference = {"depth": 6, "n_ctx": 128, "budget": min(6, 2**args.depth - 1), "samples": 4000,
                 "optimised": False, "dp": False}  # the book's reference configuration
    seconds, memory = theory_cost(**values)
    limit = memory_limit()
    if memory > limit:
        flag = culprit(lambda v: theory_cost(**v)[1], values, reference)
        raise CliError(f"{flag}: theory needs about {format_bytes(memory)} of memory (estimated), more than the "
                       f"{format_bytes(limit)} there is")
    if seconds > TIME_LIMIT:
        flag = culprit(lambda v: theory_cost(**v)[0], values, reference)
        raise CliError(f"{flag}: theory needs about {_duration(seconds)} of computing (estimated on one "
                       f"core), over the limit of {_duration(TIME_LIMIT)}")
    if seconds > NOTE_AFTER:
        print(f"fvlib: note: this takes about {_duration(seconds)} (estimated on one core)", file=sys.stderr)


def check_contexts_cost(command: str, contexts: int, seconds: float, memory: float) -> None:
    """Refuse ``command`` (``gap``, ``patch``) when its estimated ``memory`` (bytes) is more than
    there is or its ``seconds`` over :data:`TIME_LIMIT`, naming ``--contexts`` (the one flag its
    cost grows with; the run's size is fixed); note on stderr how long a long one takes."""
    limit = memory_limit()
    if memory > limit:
        raise CliError(f"--contexts {contexts}: {command} needs about {format_bytes(memory)} of memory (estimated), "
                       f"more than the {format_bytes(limit)} there is")
    if seconds > TIME_LIMIT:
        raise CliError(f"--contexts {contexts}: {command} needs about {_duration(seconds)} of computing (estimated "
                       f"on one core), over the limit of {_duration(TIME_LIMIT)}")
    if seconds > NOTE_AFTER:
        print(f"fvlib: note: this takes about {_duration(seconds)} (estimated on one core)", file=sys.stderr)


def check_jobs_memory(command: str, jobs: int, work) -> None:
    """Refuse ``command`` (``warm``) when its ``jobs`` largest items of ``work`` (each a
    :class:`fvlib.training.TrainConfig`, or a list of them trained together) training at once need
    more memory than there is (:func:`fvlib.training.estimate_memory`), naming ``--jobs``."""
    from ..training import estimate_memory

    sizes = sorted((sum(estimate_memory(c) for c in (item if isinstance(item, list) else [item])) for item in work),
                   reverse=True)
    memory, limit = sum(sizes[:jobs]), memory_limit()
    if memory > limit:
        raise CliError(f"--jobs {jobs}: {command} needs about {format_bytes(memory)} of memory with "
                       f"{min(jobs, len(sizes))} runs at once (estimated), more than the {format_bytes(limit)} "
                       f"there is")


def check_train_memory(config) -> None:
    """Refuse a training run (a :class:`fvlib.training.TrainConfig`) that cannot fit in memory
    (:func:`fvlib.training.estimate_memory`), naming the flag most responsible."""
    from dataclasses import replace

    from ..training import TrainConfig, estimate_memory, recipe_for, resolve_device

    memory = estimate_memory(config)
    device = resolve_device(config.device)
    limit = memory_limit(device)
    if memory <= limit:
        return
    default = replace(TrainConfig(arch=config.arch, model=config.model),
                      **recipe_for(config.arch, config.prior, config.alpha))
    names = ("depth", "n_ctx", "batch", "queries", "width")
    values = {name: getattr(config, name) for name in names}
    flag = culprit(lambda v: estimate_memory(replace(config, **v)), values,
                   {name: getattr(default, name) for name in names})
    where = "free on the GPU" if device.type == "cuda" else "there is"
    raise CliError(f"{flag}: training needs about {format_bytes(memory)} of memory (estimated), more than the "
                   f"{format_bytes(limit)} {where}")
