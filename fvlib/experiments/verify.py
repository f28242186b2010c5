"""Checking a stored experiment against today's code: ``python -m fvlib experiment verify NAME``.

:func:`verify`'s quick check retrains a prefix of the cheapest stored run of each model family
(:func:`prefix_runs`, :data:`~fvlib.experiments.rules.PREFIX_RULE`); ``full=True`` retrains the
cheapest stored runs to the end (:data:`~fvlib.experiments.rules.TOLERANCE_RULE`) and
re-optimises the references for information. First, the stored references are re-evaluated with
the stored parameters on the stored Monte Carlo seeds and compared (:func:`check_theory`,
:func:`theory_differences`, :data:`~fvlib.experiments.rules.THEORY_TOLERANCE_RULE`), so that a
change of the theory code that moves a stored reference is noticed.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from ..families import get_family
from ..theory import choosing_strategies
from ..training import TrainConfig, train_many
from .definitions import EXPERIMENTS, estimate_seconds, get_experiment
from .provenance import cpu_name, items_of
from .records import ResultError
from .references import TheoryParams
from .rules import tolerance
from .storage import load_result, load_theory_params, result_path, theory_params_path

__all__ = ["check_theory", "prefix_runs", "stack_of", "theory_differences", "verify"]

def _numbers(tree, path: str = "") -> dict:
    """The leaves of a JSON-able ``tree`` by path (``"curves/adaptive_opt/mean/3"``)."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _numbers(sub, f"{path}/{key}").items()}
    if isinstance(tree, list):
        return {k: v for i, sub in enumerate(tree) for k, v in _numbers(sub, f"{path}/{i}").items()}
    return {path.lstrip("/"): tree}


def _stderr_path(path: str) -> str | None:
    """The path of the standard error stored beside a Monte Carlo mean (``mean`` or ``value``)."""
    parts = path.split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in ("mean", "value"):
            return "/".join(parts[:i] + ["stderr"] + parts[i + 1:])
    return None


def _chooses(path: str, numbers: dict) -> bool:
    """A number of a strategy of :func:`~fvlib.theory.strategies.choosing_strategies`: named in its path
    (``"curves/adaptive_opt/mean/3"``), or a reference whose ``name`` is one (``"A/tree/value"``)."""
    parts = path.split("/")
    choosing = choosing_strategies()
    return any(p in choosing for p in parts) or numbers.get("/".join(parts[:-1] + ["name"])) in choosing


def theory_differences(stored: dict, fresh: dict) -> list[dict]:
    """Where a re-evaluated theory ``fresh`` differs from the ``stored`` one, by
    :data:`~fvlib.experiments.rules.THEORY_TOLERANCE_RULE`: one ``{"path", "stored", "fresh", "tolerance"}`` per leaf
    that differs (a leaf present in only one of them counts, with ``None`` for the missing side). A
    number of a strategy that chooses its measurements (:func:`~fvlib.theory.strategies.choosing_strategies`)
    may move by 3 of its stored standard errors (a mean) or 10% (a standard error); any other by a
    relative 1e-6."""
    old, new = _numbers(stored), _numbers(fresh)
    out = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
        if not numeric:
            if a != b:
                out.append({"path": path, "stored": a, "fresh": b, "tolerance": 0.0})
            continue
        se = old.get(_stderr_path(path) or "")
        tol = 1e-6 * (1 + abs(a))
        if _chooses(path, old):
            if isinstance(se, (int, float)) and math.isfinite(se):
                tol = max(tol, 3 * se)
            elif "stderr" in path.split("/"):
                tol = max(tol, 0.1 * abs(a))
        if not (abs(a - b) <= tol or (a != a and b != b)):   # nan == nan here
            out.append({"path": path, "stored": a, "fresh": b, "tolerance": tol})
    return out


def verify(name: str, runs: int = 1, *, directory=None, device: str = "cpu", progress: bool = False,
           theory: bool = True, full: bool = False) -> dict:
    """Check a stored experiment against today's code.

    The quick check (default): for each model family of the file, retrain a prefix of its
    cheapest stored run and compare it with the stored history (:data:`~fvlib.experiments.rules.PREFIX_RULE`, tolerance
    :attr:`~fvlib.experiments.definitions.Experiment.prefix_rtol` of the definition). ``full``: retrain the ``runs``
    cheapest stored runs to the end instead (in memory, batched as they were stored, so that the same CPU
    gives the same bits) and compare their final losses (:data:`~fvlib.experiments.rules.TOLERANCE_RULE`: within the
    definition's :attr:`~fvlib.experiments.definitions.Experiment.final_rtol`), and
    re-optimise the references for information. With ``theory`` (first) the stored references are
    re-evaluated from their stored parameters and compared (:func:`theory_differences`; a
    missing or unreadable parameter file raises :class:`~fvlib.experiments.records.ResultError` naming it).

    Returns ``{"experiment", "ok", "mode", "checked": [...], "configs_rebuilt", "theory": {...} or
    None}``; every stored config is also rebuilt (``TrainConfig.from_dict`` and its model) first.
    """
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
        raise ValueError(f"runs must be a positive integer, got {runs!r}")
    data = load_result(name, directory)   # every run's seal checked before anything is retrained
    if not data["runs"]:
        raise ResultError(f"{result_path(name, directory)} holds no runs yet")
    # first: a missing parameter file fails before any training
    theory_check = check_theory(name, data, directory, full) if theory else None
    configs = {k: TrainConfig.from_dict(r["config"]) for k, r in data["runs"].items()}
    for config in configs.values():
        config.model_config()
    if full:
        chosen = sorted(configs, key=lambda k: estimate_seconds(configs[k]))[:runs]
        checked = [check_whole_run(data, key, configs[key], device, progress) for key in chosen]
    else:
        rtol = get_experiment(name).prefix_rtol
        checked = [check_prefix(data, key, configs[key], rtol, device, progress)
                   for key in prefix_runs(data).values()]
    ok = all(c["ok"] for c in checked) and not (theory_check and theory_check["differences"])
    return {"experiment": name, "ok": ok, "mode": "full" if full else "prefix", "checked": checked,
            "configs_rebuilt": len(configs), "theory": theory_check}


def _family(config: TrainConfig) -> str:
    """A run's model family: ``A``, ``B``, ``C`` or, for the standard transformers, ``A'``, ``B'``,
    ``A'-open``."""
    return get_family(config.arch).model_label(config.model)


def _prefix_steps(record: dict) -> int:
    """The step of a stored run's first evaluation after step 0."""
    return min(e["step"] for e in record["history"] if e["step"] > 0)


def prefix_runs(data: dict, machine: str | None = None) -> dict[str, str]:
    """``{family: key}``: the stored run whose prefix :func:`verify`'s quick check retrains for each
    model family (:data:`~fvlib.experiments.rules.PREFIX_RULE`): the cheapest to its first evaluation, among the
    family's runs of two layers or more where it has any, among those the runs whose router
    is not model A's ``coord`` router where it has any (its hard choice of a node turns the last
    bits of a sum, which differ between a run trained alone and in a stack, into another route:
    the prefix of such a run checks nothing of the code), and among those the runs last trained
    on this machine's kind of processor (``machine``, default
    ``fvlib.experiments.provenance.cpu_name()``) where it has any: model A at K = 8 starts
    chaotically, so the last bits another CPU rounds differently give another trajectory within
    300 steps (0.41 against 0.55 stored, an AMD EPYC run retrained on an Intel Xeon)."""
    here = cpu_name() if machine is None else machine
    by_family: dict[str, list[str]] = {}
    for key, record in data["runs"].items():
        by_family.setdefault(_family(TrainConfig.from_dict(record["config"])), []).append(key)

    def cost(key):
        config = TrainConfig.from_dict(data["runs"][key]["config"])
        return estimate_seconds(config) * _prefix_steps(data["runs"][key]) / config.steps

    def deep(key):
        return TrainConfig.from_dict(data["runs"][key]["config"]).model_config().n_layers >= 2

    def smooth(key):
        return TrainConfig.from_dict(data["runs"][key]["config"]).router != "coord"

    def trained_here(key):
        return data["runs"][key].get("provenance", {}).get("device_name") == here

    def candidates(keys):
        deep_keys = [k for k in keys if deep(k)] or keys
        smooth_keys = [k for k in deep_keys if smooth(k)] or deep_keys
        return [k for k in smooth_keys if trained_here(k)] or smooth_keys

    return {family: min(candidates(keys), key=cost) for family, keys in sorted(by_family.items())}


def check_prefix(data: dict, key: str, config: TrainConfig, rtol: float, device: str, progress: bool) -> dict:
    """Retrain ``key``'s first evaluation period and compare its evaluations with the stored history."""
    record, start = data["runs"][key], time.perf_counter()
    stop = _prefix_steps(record)
    # the first run of a stack trains to the same bits beside any second one (two models, not
    # the whole stack: the quick check stays quick); a later one as before, alone (last bits apart)
    stack = stack_of(data, key)
    result = _retrain_in_its_stack(data, key, config, device, progress, until_step=stop,
                                   stack=stack[:2] if stack[0] == key else [key])
    stored = {e["step"]: e["eval_excess_loss"] for e in record["history"] if e["step"] <= stop}
    fresh = {e["step"]: e["eval_excess_loss"] for e in result.history}
    worst = max(abs(fresh[step] - value) / abs(value) for step, value in stored.items())
    return {"key": key, "steps": stop, "stored": stored[stop], "retrained": fresh[stop],
            "difference": abs(fresh[stop] - stored[stop]), "relative": worst, "tolerance": rtol,
            "ok": bool(worst <= rtol), "seconds": round(time.perf_counter() - start, 1)}


def _retrain_in_its_stack(data: dict, key: str, config: TrainConfig, device: str, progress: bool,
                          until_step: int | None = None, stack: list[str] | None = None):
    """Run ``key`` (of config ``config``) retrained in the stack its last attempt was trained in
    (:func:`stack_of`, or the keys ``stack``), so that the same CPU reproduces it bit for bit;
    its ``TrainResult``."""
    stack = stack if stack is not None else stack_of(data, key)
    configs = [config if k == key else replace(TrainConfig.from_dict(data["runs"][k]["config"]), steps=config.steps,
                                              eval_every=config.eval_every)
               for k in stack]
    results = train_many([replace(c, device=device) for c in configs], progress=progress, until_step=until_step)
    return results[stack.index(key)]


def check_whole_run(data: dict, key: str, config: TrainConfig, device: str, progress: bool) -> dict:
    """Retrain ``key`` to the end, batched as it was stored, and compare its final loss
    (:data:`~fvlib.experiments.rules.TOLERANCE_RULE`)."""
    record, start = data["runs"][key], time.perf_counter()
    result = _retrain_in_its_stack(data, key, config, device, progress)
    tol = tolerance(get_experiment(data["experiment"]), record)
    diff = abs(result.final_loss - record["final_loss"])
    return {"key": key, "steps": config.steps, "stored": record["final_loss"], "retrained": result.final_loss,
            "difference": diff, "tolerance": tol, "ok": bool(diff <= tol),
            "seconds": round(time.perf_counter() - start, 1)}


def stack_of(data: dict, key: str) -> list[str]:
    """The keys of the runs that the last attempt of run ``key`` was trained with in one
    :func:`~fvlib.training.batched.train_many` call, in the order they were stacked: the runs of
    its work item that made an attempt of the same length (``_train_item`` trains them together),
    in the order of the experiment's definition (of ``data["runs"]`` for an experiment not
    defined here). Retraining that very stack reproduces the run bit for bit on the same CPU;
    alone, or in another stack, its last bits differ, which a chaotic start (model A at K = 8)
    turns into another trajectory within a few hundred steps."""
    record = data["runs"][key]
    item = record["provenance"].get("item")
    if not item:
        return [key]
    order = list(data["runs"])
    if data.get("experiment") in EXPERIMENTS:
        defined = [run.key for run in EXPERIMENTS[data["experiment"]].runs]
        order = [k for k in defined if k in data["runs"]] + [k for k in order if k not in defined]
    return [k for k in order if item in items_of(data["runs"][k])
            and any(a["steps"] == record["steps"] for a in data["runs"][k]["attempts"])]


def check_theory(name: str, data: dict, directory=None, full: bool = False) -> dict:
    """The theory check of :func:`verify`: the references re-evaluated with the stored parameters
    (:func:`~fvlib.experiments.storage.load_theory_params`; all of them must be read) against the stored ones; with
    ``full`` also ``"reoptimised"`` (``_reoptimise``, for information)."""
    start = time.perf_counter()
    path = theory_params_path(name, directory)
    if data.get("theory") is None:
        return {"checked": 0, "differences": [{"path": "theory", "stored": None, "fresh": "missing",
                                               "tolerance": 0.0}], "seconds": 0.0, "parameters": str(path)}
    params = TheoryParams(*load_theory_params(name, directory), path=path)
    fresh = get_experiment(name).theory(params)
    unread = sorted(set(params.stored) - set(params.tensors))
    if unread:
        raise ResultError(f"{path} holds parameters the definition of {name!r} does not read: {', '.join(unread)}")
    out = {"checked": len(_numbers(data["theory"])), "differences": theory_differences(data["theory"], fresh),
           "seconds": round(time.perf_counter() - start, 1), "parameters": str(path), "reoptimised": None}
    if full:
        out["reoptimised"] = _reoptimise(name, data)
    return out


def _reoptimise(name: str, data: dict) -> dict:
    """The references of ``name`` with their parameters searched again here, against the stored
    ones, printed for information (another CPU lands in other local optima; never judged):
    ``{"cpu", "seconds", "checked", "differences" (:func:`theory_differences`), "largest"
    (the largest relative change of a number, or None)}``."""
    start = time.perf_counter()
    fresh = get_experiment(name).theory(TheoryParams())
    diffs = theory_differences(data["theory"], fresh)
    moved = [d for d in diffs if all(isinstance(d[k], (int, float)) for k in ("stored", "fresh"))]
    largest = max(moved, key=lambda d: abs(d["fresh"] - d["stored"]) / max(abs(d["stored"]), 1e-300), default=None)
    out = {"cpu": cpu_name(), "seconds": round(time.perf_counter() - start, 1),
           "checked": len(_numbers(data["theory"])), "differences": diffs, "largest": largest}
    change = (f"; largest {largest['path']}: stored {largest['stored']:.4g}, re-optimised {largest['fresh']:.4g}"
              if largest else "")
    print(f"{name}: references re-optimised on {out['cpu']} in {out['seconds']} s, for information: "
          f"{len(diffs)} of {out['checked']} values differ from the stored ones{change}")
    return out
