"""The subcommands of the command line: one function each, from the parsed arguments to the
result that :func:`fvlib.cli.main` prints (a dict: one JSON object with ``--json``, else one
``key  value`` line per entry). Each refuses bad input (:class:`CliError`, one line) before any
work. The book's experiments (:mod:`fvlib.experiments` and its modules ``inbuild``,
``beside_theory``, ``reproduce``) are called through their modules; the computing layers (theory,
training, interventions) are imported when a subcommand runs.
"""

from __future__ import annotations

import json
import math
import sys

from .. import experiments
from ..experiments import beside_theory, inbuild
from ..experiments import reproduce as headline
from ..families import get_family
from ..priors import get_prior_kind
from .limits import (
    CliError,
    check_contexts_cost,
    check_jobs_memory,
    check_theory_args,
    check_train_memory,
    check_writable_dir,
    flag_for,
)
from .train_flags import train_config

__all__ = [
    "GAP_ROWS",
    "THEORY_KEYS",
    "experiment_keep_models",
    "experiment_list",
    "experiment_run",
    "experiment_seal",
    "experiment_show",
    "experiment_verify",
    "finite_or_none",
    "gap",
    "patch",
    "reproduce",
    "theory",
    "train",
    "warm",
]

#: The keys of ``theory --json`` always present; ``--optimised``, ``--dp`` and ``--stderr`` add more.
THEORY_KEYS = (
    "tau2",
    "adaptive_greedy",
    "nonadaptive_coord",
    "lmmse",
    "gaussian_twin",
    "noisefree_adaptive",
    "noisefree_nonadaptive",
)

#: The rows of ``gap --json``: mean excess losses on the same contexts (chapter 8's gap table).
GAP_ROWS = ("model", "router_bayes", "adaptive_greedy_paired", "adaptive_opt_paired")


def theory(args) -> dict:
    """The theory baselines of one configuration (:func:`fvlib.theory.theory_baselines`)."""
    from ..priors import TreePrior
    from ..theory import theory_baselines

    check_theory_args(args)
    tree = TreePrior(args.depth, args.alpha)
    res = theory_baselines(
        tree, args.n_ctx, args.noise_std, args.budget, samples=args.samples, seed=args.seed, optimised=args.optimised,
        dp=args.dp, adaptive_opt=args.optimised,
    )
    optional = ("nonadaptive_opt", "adaptive_opt", "dp_optimal", "dp_no_repeat")
    out = {k: res[k] for k in [*THEORY_KEYS, *(k for k in optional if k in res)]}
    if args.stderr:
        out["stderr"] = {k[: -len("_stderr")]: v for k, v in res.items() if k.endswith("_stderr")}
        out["samples"] = res["samples"]
    return out


def train(args) -> dict:
    """Train the run the flags describe (:func:`fvlib.cli.train_flags.train_config`) into ``--out``,
    once it is known to fit in memory and ``--out`` to be writable and a run directory (or
    empty); ``--repair`` first checks a run without manifest and writes one
    (:func:`fvlib.training.repair.repair_run`), saying each check on stderr."""
    from ..training import RunConfigMismatch, RunDirError, check_run_dir, repair_run
    from ..training import train as train_run

    config = train_config(args)
    check_train_memory(config)
    try:
        check_run_dir(args.out)
    except RunDirError as err:
        raise CliError(f"--out: {err}") from None
    check_writable_dir("--out", args.out)
    try:
        if args.repair:
            repair_run(args.out, config, report=lambda line: print(f"fvlib: repair: {line}", file=sys.stderr))
        result = train_run(config, out_dir=args.out, progress=not args.no_progress)
    except RunConfigMismatch as err:
        worded = err.worded(flag_for, where="--out", start_over="or delete it to train it again")
        raise CliError(f"--out {worded}") from None
    except RunDirError as err:  # a checkpoint that cannot be read or written, named
        raise CliError(f"--out: {err}") from None
    return {
        "final_loss": result.final_loss,
        "seconds": result.seconds,
        "checkpoint": str(result.checkpoint),
        "steps": config.steps,
        "model": config.model,
        "prior": config.prior,
        "inputs": config.input_path,
    }


def _load_run(path):
    """``(model, config)`` of the run directory ``--run``; a bad one is one line naming it."""
    from ..training import RunDirError, load_run

    try:
        model, config, _ = load_run(path)
    except RunDirError as err:
        raise CliError(f"--run: {err}") from None
    return model, config


def gap(args) -> dict:
    """Chapter 8's gap table (:func:`fvlib.experiments.beside_theory.gap_table`) of a trained run of model A
    on the tree prior: the model, its router with the exact Bayes decoder, and greedy and the
    optimised adaptive policy on the model's own contexts; ``ratio``: the model over the
    better of the two, context by context. Refused before any work when ``--contexts`` cannot
    fit or finish (:func:`fvlib.experiments.beside_theory.gap_cost`)."""

    model, config = _load_run(args.run)
    if get_family(config.arch).model_label(config.model) != "A" or not get_prior_kind(config.prior).is_tree:
        raise CliError(f"gap needs a run of model A (--arch constrained) on the tree prior; {args.run} is "
                       f"model {config.model} (--arch {config.arch}) on the {config.prior} prior")
    check_contexts_cost("gap", args.contexts, *beside_theory.gap_cost(config, args.contexts))
    table = beside_theory.gap_table(model, config, contexts=args.contexts, seed=args.seed)
    return _gap_json(table, args) if args.json else _gap_lines(table, args)


def _gap_json(table: dict, args) -> dict:
    (ratio, ratio_se), (bayes_ratio, bayes_ratio_se) = table["ratios"]["model"], table["ratios"]["router_bayes"]
    out = {row: finite_or_none(table[row][0]) for row in GAP_ROWS}
    out["stderr"] = {row: finite_or_none(table[row][1]) for row in GAP_ROWS}
    out["best_paired"] = table["best_paired"]
    for key, value in (("ratio", ratio), ("ratio_stderr", ratio_se), ("router_bayes_ratio", bayes_ratio),
                       ("router_bayes_ratio_stderr", bayes_ratio_se)):
        out[key] = finite_or_none(value)
    return {**out, "adaptive_opt_kind": table["adaptive_opt_kind"], "contexts": args.contexts, "seed": args.seed}


def _gap_lines(table: dict, args) -> dict:
    (ratio, ratio_se), (bayes_ratio, bayes_ratio_se) = table["ratios"]["model"], table["ratios"]["router_bayes"]
    names = {"model": "model A", "router_bayes": "its router + Bayes decoder",
             "adaptive_greedy_paired": "greedy (paired)", "adaptive_opt_paired": "optimised adaptive (paired)"}
    out = {names[row]: f"{table[row][0]:.4g} +- {table[row][1]:.2g}"
           + ("  (best paired)" if row == table["best_paired"] else "") for row in GAP_ROWS}
    out["model / best paired"] = f"{ratio:.3g} +- {ratio_se:.2g}"
    out["router + Bayes / best paired"] = f"{bayes_ratio:.3g} +- {bayes_ratio_se:.2g}"
    out["contexts"] = f"{args.contexts} (seed {args.seed}), excess loss E|theta_hat - theta|^2"
    return out


def warm(args) -> dict:
    """The runs the chapters train (:func:`fvlib.experiments.inbuild.warm_work`), each exactly as the
    chapter trains it, ``--jobs`` processes at a time, once they are known to fit in memory together."""
    from ..training import run_root

    work = inbuild.warm_work()
    check_jobs_memory("warm", args.jobs, work)
    check_writable_dir("--root", run_root(args.root))
    return {"runs": inbuild.train_parallel(work, jobs=args.jobs, root=args.root)}


def patch(args) -> dict:
    """The key-patching heatmap of a trained tree-prior run (its state-patching analogue for a
    bottlenecked transformer) beside the greedy theory's on the same pairs, both references of
    :mod:`fvlib.theory.patching_policies` (``theory_loss``: aware, ``theory_loss_unaware``);
    refused before any work when ``--contexts`` cannot fit or finish
    (:func:`fvlib.interventions.patching_cost`)."""
    from ..interventions import key_patching_sweep, patching_cost, state_patching_sweep
    from ..theory import theory_patching_references
    from ..training import build_prior

    model, config = _load_run(args.run)
    family = get_family(config.arch)
    if not family.has_hook("workspace"):
        raise CliError(f"patch supports --arch constrained runs (key patching) and --arch transformer runs "
                       f"(its state-patching analogue); {args.run} is an --arch {config.arch} run, which has "
                       f"no separate state to patch (use fvlib.interventions.transplant_stream)")
    prior = build_prior(config)
    if not prior.is_tree:
        raise CliError(f"patching needs a run trained on the tree prior, {args.run} used {config.prior!r}")
    check_contexts_cost("patch", args.contexts, *patching_cost(model, prior, config.n_ctx, args.contexts))
    kw = {"contexts": args.contexts, "seed": args.seed}
    sweep = state_patching_sweep if family.softmax_attention else key_patching_sweep
    model_side = sweep(model, prior, config.n_ctx, config.noise_std, **kw)
    theory = theory_patching_references(prior, config.n_ctx, config.noise_std, model.config.n_layers, **kw)
    aware, unaware = theory["aware"], theory["unaware"]
    return {
        "baseline": model_side.baseline,
        "loss": model_side.loss.tolist(),
        "theory_loss": aware.loss.tolist(),
        "theory_loss_unaware": unaware.loss.tolist(),
        "theory_baseline": aware.baseline,
        "stderr": model_side.stderr.tolist(),
        "split_levels": model_side.split_levels,
        "layers": model_side.layers,
        "contexts": args.contexts,
    }


def reproduce(args) -> dict:
    """The book's headline results as JSON files in ``--out`` (:func:`fvlib.experiments.reproduce.reproduce`)."""

    check_writable_dir("--out", args.out)
    return headline.reproduce(args.out, quick=args.quick, seed=args.seed, progress=not args.no_progress)


def _experiment_name(name: str) -> str:

    if name not in experiments.experiment_names():
        raise CliError(f"unknown experiment {name!r}; choose from {', '.join(experiments.experiment_names())}")
    return name


def _stored(name: str) -> tuple[dict, float]:
    """The runs stored in ``results/NAME.json`` and the CPU seconds they took (none when there is
    no file); a file that is not a sealed result of ``name`` is refused, naming it."""

    if not experiments.result_path(name).exists():
        return {}, 0.0
    data = experiments.load_result(name)
    return data["runs"], experiments.provenance_summary(data).get("cpu_seconds", 0.0)


def experiment_list(args) -> dict:
    """Every named experiment of :mod:`fvlib.experiments`: its size, its stored runs and its cost.
    Every stored file is read with its checks first: a bad one (corrupt, edited, of another
    experiment) refuses the whole listing in one line naming it, rather than counting it as
    nothing stored."""

    experiments.check_results_dir()
    stored = {name: _stored(name) for name in experiments.EXPERIMENTS}
    out = {}
    for name, e in experiments.EXPERIMENTS.items():
        runs, spent = stored[name]
        left = [r for r in e.runs if r.key not in runs]
        out[name] = {"description": e.description, "chapter": e.chapter, "runs": len(e.runs),
                     "stored_runs": len(e.runs) - len(left), "work_items": len(e.items),
                     "estimated_cpu_minutes": round(sum(experiments.estimate_seconds(r.config) for r in e.runs) / 60,
                                                    1),
                     "stored_cpu_minutes": round(spent / 60, 1),
                     "remaining_cpu_minutes": round(sum(experiments.estimate_seconds(r.config) for r in left) / 60, 1),
                     "max_doublings": e.max_doublings, "convergence": e.convergence,
                     "stored_models": list(e.stored_models),
                     "kept_models": len(experiments.stored_model_keys(name)) if e.stored_models else 0}
    if args.json:
        return {"experiments": out}
    return {name: f"{v['runs']} runs ({v['stored_runs']} stored, {v['stored_cpu_minutes']} CPU min spent), "
                  f"about {v['remaining_cpu_minutes']} CPU min left"
                  + (f" before doublings (x{3 if v['convergence'] == 'paired-doubling' else 1} to "
                     f"x{2 ** (v['max_doublings'] + 1) - 1} when runs are doubled)"
                     if v["max_doublings"] else " (no doublings)")
                  + f": {v['description']}" for name, v in out.items()}


def experiment_run(args) -> dict:
    """Train an experiment's missing runs into ``results/NAME.json`` (:func:`fvlib.experiments.run`)."""
    from ..training import run_root

    name = _experiment_name(args.name)
    check_writable_dir("--root", run_root(args.root))
    experiments.check_results_dir(writable=True)
    data = experiments.run(name, device=args.device, jobs=args.jobs, root=args.root,
                     progress=not args.no_progress, max_items=args.max_items, refresh_theory=args.refresh_theory)
    return {"experiment": args.name, "stored_runs": len(data["runs"]), "planned_runs": len(data["planned_runs"]),
            "not_converged": sum(not r["converged"] for r in data["runs"].values()),
            **({"summary": experiments.summarise(data)} if args.json else {})}


def experiment_verify(args) -> dict:
    """Retrain and re-evaluate an experiment against its stored results (:func:`fvlib.experiments.verify`);
    a result that does not reproduce is a one-line error."""

    if args.runs != 1 and not args.full:
        raise CliError(f"--runs {args.runs} needs --full (the quick check retrains one prefix per model family)")
    result = experiments.verify(_experiment_name(args.name), runs=args.runs, theory=not args.no_theory, full=args.full)
    if not result["ok"]:
        raise CliError(f"experiment {args.name} does not reproduce: {'; '.join(_verify_failures(result, args.name))}")
    if args.json:
        return result
    theory_check = result["theory"]
    relative = " relative" if result["mode"] == "prefix" else ""
    out = {"experiment": args.name, "ok": True, "mode": result["mode"], "configs_rebuilt": result["configs_rebuilt"],
           **{c["key"]: f"stored {c['stored']:.6g}, retrained {c['retrained']:.6g} at step {c['steps']} "
                        f"(tolerance {c['tolerance']:.3g}{relative}, {c['seconds']} s)" for c in result["checked"]},
           "theory": (f"{theory_check['checked']} stored values re-evaluated from the stored parameters, all within "
                      f"tolerance ({theory_check['seconds']} s)" if theory_check else "not checked")}
    if theory_check and theory_check.get("reoptimised"):
        out["re-optimised (information only)"] = json.dumps(theory_check["reoptimised"])[:300]
    return out


def _verify_failures(result: dict, name: str) -> list[str]:
    """What of a failed :func:`fvlib.experiments.verify` did not reproduce, one phrase each."""
    detail = [f"{c['key']}: stored {c['stored']:.6g}, retrained {c['retrained']:.6g} at step {c['steps']}, "
              f"tolerance {c['tolerance']:.3g}" + (" (relative)" if result["mode"] == "prefix" else "")
              for c in result["checked"] if not c["ok"]]
    theory_check = result["theory"]
    if theory_check and theory_check["differences"]:
        diffs = theory_check["differences"]
        detail.append(f"{len(diffs)} theory value(s) differ, e.g. {diffs[0]['path']}: stored "
                      f"{diffs[0]['stored']}, re-evaluated {diffs[0]['fresh']} (after a fix of the theory "
                      f"code: `python -m fvlib experiment run {name} --refresh-theory`)")
    return detail


def experiment_seal(args) -> dict:
    """Check a stored result file and seal it (:func:`fvlib.experiments.seal_result`): what it checked."""

    report = experiments.seal_result(_experiment_name(args.name))
    if args.json:
        return report
    return {"sealed": report["file"],
            "checked": f"version {report['version']} file: every field's type, experiment {report['experiment']}, "
                       f"{report['runs']} runs of its definition",
            "theory parameters": report["theory_parameters"] or "none (no theory yet)",
            "kept models": report["kept_models"] or "none",
            "newly sealed": ", ".join(report["unsealed_parts"]) or "nothing (the seal matched)",
            "rules": "brought up to today's" if report["rules_updated"] else "today's"}


def experiment_keep_models(args) -> dict:
    """Store the final weights of an experiment's kept runs beside its result and seal them
    (:func:`fvlib.experiments.keep_models`): what it wrote."""
    from ..training import run_root

    name = _experiment_name(args.name)
    check_writable_dir("--root", run_root(args.root))
    report = experiments.keep_models(name, root=args.root)
    if args.json:
        return report
    return {"kept models": f"{len(report['kept'])} runs in {report['file']}"
                           + ("" if report["written"] else " (unchanged: the file held these models)"),
            "not stored yet": ", ".join(report["not_stored"]) or "none"}


def _kept_line(name: str) -> str:
    """What ``experiment show`` says of the models an experiment keeps."""
    kept = experiments.get_experiment(name).stored_models
    held = experiments.stored_model_keys(name)
    if not held:
        return (f"none of {len(kept)} yet (`python -m fvlib experiment keep-models {name}` writes those stored)")
    return (f"{len(held)} of {len(kept)} in {experiments.models_path(name)} "
            f"(fvlib.experiments.load_stored_model(NAME, KEY)): {', '.join(held)}")


def experiment_show(args) -> dict:
    """The stored summary and provenance of an experiment."""

    data = experiments.load_result(_experiment_name(args.name))
    out = {"experiment": args.name, "description": data["description"], "stored_runs": len(data["runs"]),
           "planned_runs": len(data["planned_runs"]),
           # runs still falling that the definition allows to double again (`experiment run`)
           "runs_to_double": len(experiments.runs_to_double(data, experiments.get_experiment(args.name))),
           "provenance": experiments.provenance_summary(data)}
    kept = experiments.get_experiment(args.name).stored_models
    if args.json:
        return {**out, "summary": experiments.summarise(data), "theory": data["theory"], "stored_models": list(kept),
                "kept_models": list(experiments.stored_model_keys(args.name)) if kept else []}
    for row in experiments.summarise(data):
        ratio = f", x{row['ratio_mean']:.2f} greedy" if "ratio_mean" in row else ""
        out[f"{row['variant']} {row['prior']} M={row['budget']}"] = (
            f"{row['mean']:.4g} +- {row['stderr']:.2g} (seeds {row['seeds']}, spread {row['spread']:.2g}, "
            f"converged {row['converged']} of {len(row['seeds'])} seeds{ratio})")
    if kept:
        out["kept models"] = _kept_line(args.name)
    out["provenance"] = json.dumps(out["provenance"])
    return out


def finite_or_none(value):
    """``value`` with every float that is not finite replaced by ``None`` (JSON ``null``), in
    nested dicts, lists and tuples too."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value
