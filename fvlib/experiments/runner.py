"""Training a stored experiment: ``python -m fvlib experiment run NAME`` (:func:`run`).

* **Work items.** ``--jobs N`` trains ``N`` work items at a time in separate processes
  (:func:`fvlib.workers.worker_pool`), one thread each. Checkpoints go to
  :func:`fvlib.training.config.run_dir_for` directories under the run root, so a killed
  experiment resumes where its checkpoints stand.
* **Results, added as they finish.** After every item the parent process adds the item's runs
  to ``results/NAME.json`` (in one step), each with its full config, its evaluation history, its
  final excess loss and Monte Carlo standard error, the ``converged`` flag and the provenance of
  the process that trained it. An experiment can therefore span several working sessions and
  machines: runs already in the file are not trained again.
* **Converged, or trained until it is**, by the rule the definition names
  (:attr:`~fvlib.experiments.definitions.Experiment.convergence`, :mod:`fvlib.experiments.rules`);
  the record keeps every attempt. Under the paired-doubling rule every run trains ``S`` and
  ``2S`` at least, and each doubling is judged on the run's evaluation contexts against the
  previous attempt's final model, loaded from its run directory (never retrained).
* **Analyses in the worker.** Every tree run carries its ratio to the greedy policy on its own
  evaluation contexts (paired, :func:`fvlib.stats.paired_ratio`); the runs of the variants of
  :attr:`~fvlib.experiments.definitions.Experiment.gap_variants` carry chapter 8's gap table
  (:func:`fvlib.experiments.beside_theory.gap_table`).
* **Kept models.** When an item holding a run of
  :attr:`~fvlib.experiments.definitions.Experiment.stored_models` is stored, the run's final
  weights are read from its run directory into ``results/NAME.models.safetensors`` and sealed
  with the result (:func:`~fvlib.experiments.kept_models.add_kept_models`).
* **References** are computed once, when the file is started; :func:`refresh_theory`
  recomputes them, training nothing.

Nothing in a result file is typed by hand: every number in it is written by :func:`run`.
"""

from __future__ import annotations

import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..priors import get_prior_kind
from ..training import (
    EVAL_SEED_OFFSET,
    TrainConfig,
    load_run,
    per_context_losses,
    resolve_device,
    run_dir_for,
    train_many,
)
from ..training.checkpoint import load_history
from ..training.evaluate import eval_set_key, run_eval_batches
from ..training.rundir import RunDirError, has_checkpoint
from ..workers import worker_pool
from .beside_theory import gap_record, greedy_paired
from .definitions import Experiment, Run, estimate_seconds, get_experiment
from .kept_models import add_kept_models
from .provenance import git_commit, provenance, provenances_of
from .records import Provenance, ResultFile, RunRecord, new_result, theory_kind
from .references import TheoryParams
from .rules import converged, may_double, paired_converged, paired_drop, runs_to_double
from .storage import (
    check_results_dir,
    load_result,
    read_result,
    result_lock,
    result_path,
    theory_params_path,
    write_result,
    write_theory_params,
)

__all__ = ["GAP_CONTEXTS", "refresh_theory", "run", "stored"]

#: Contexts of the gap table of the reference runs.
GAP_CONTEXTS = 4000


def _greedy_paired(model, config: TrainConfig) -> dict:
    """The model against the greedy policy on the model's own evaluation contexts."""
    out = greedy_paired(model, config, contexts=config.eval_contexts,
                        seed=config.effective_data_seed + EVAL_SEED_OFFSET)
    return {k: out[k] for k in ("greedy_loss", "greedy_stderr", "ratio", "ratio_stderr", "contexts")}


def _gap(model, config: TrainConfig) -> dict:
    return gap_record(model, config, contexts=GAP_CONTEXTS, seed=0)


def _record(run_: Run, result, attempts: list, gap: bool) -> dict:
    c = result.config
    last = result.history[-1]
    record = {"key": run_.key, **run_.labels, "config": c.to_dict(), "final_loss": last["eval_excess_loss"],
              "final_stderr": last["eval_stderr"], "final_query_loss": last["eval_query_loss"],
              "steps": c.steps, "converged": attempts[-1]["converged"], "attempts": attempts,
              "history": result.history}
    if get_prior_kind(c.prior).is_tree:
        record["greedy_paired"] = _greedy_paired(result.model, c)
        if gap:
            record["gap"] = _gap(result.model, c)
    return record


def _attempt(result, experiment: Experiment) -> dict:
    """A run's first attempt: under the last-fifth rule judged by its own history; under the
    paired-doubling rule not converged (convergence at ``S`` needs ``L(2S)``), its drop null."""
    steps = result.config.steps
    if experiment.convergence == "paired-doubling":
        return {"steps": steps, "final_loss": result.final_loss, "converged": False, "drop": None,
                "drop_stderr": None}
    return {"steps": steps, "final_loss": result.final_loss, "converged": converged(result.history, steps)}


def _doubled_attempt(result, experiment: Experiment, previous: dict, previous_config: TrainConfig, root) -> dict:
    """The attempt of a doubled run (``result``), ``previous`` the attempt before it (of
    ``previous_config``): under the paired-doubling rule, the paired drop from the previous
    attempt's final model (loaded from its run directory under ``root``) to this one on the same
    evaluation contexts, and whether it converged at the previous attempt's steps."""
    if experiment.convergence != "paired-doubling":
        return _attempt(result, experiment)
    if eval_set_key(previous_config) != eval_set_key(result.config):
        raise ValueError(f"a doubling of {previous_config.steps} steps changed the evaluation contexts: "
                         f"{eval_set_key(previous_config)} -> {eval_set_key(result.config)}")
    before, _, _ = load_run(run_dir_for(previous_config, root))
    batches = run_eval_batches(result.config)   # the same contexts for both (eval_set_key)
    drop, stderr = paired_drop(per_context_losses(before, batches)[0], per_context_losses(result.model, batches)[0])
    return {"steps": result.config.steps, "final_loss": result.final_loss,
            "converged": paired_converged(drop, stderr, previous["final_loss"]), "drop": drop, "drop_stderr": stderr}


def _seconds_spent(dirs) -> float:
    """The wall seconds that earlier processes spent training one stack of runs, read from the
    history of their checkpoints (which carries the training time over a resume; the largest
    over the stack, whose models train together); 0 for runs not started."""
    spent = 0.0
    for d in dirs:
        if has_checkpoint(d):
            try:
                history = load_history(d)
            except RunDirError:   # a broken directory: train_many starts it over
                continue
            spent = max(spent, float(history[-1].get("seconds", 0.0)) if history else 0.0)
    return spent


def _train_item(args) -> list[dict]:
    """Worker: train one work item (its runs in one ``train_many`` call, on one thread), train
    the runs that have not converged again with twice the steps (together, in one
    ``train_many`` call per doubling), analyse each run; returns the records.

    ``args``: ``(name, index, root, device, progress, stored)``; ``stored`` (``None`` for a new
    item) holds the item's stored records when the experiment allows more doublings than they
    had (:func:`~fvlib.experiments.rules.runs_to_double`): then only those runs are trained, from their last attempt's
    steps doubled, and the others are returned as stored."""
    name, index, root, device, progress, stored = args
    torch.set_num_threads(1)
    experiment = get_experiment(name)
    item = experiment.items[index]
    wall, cpu, code = time.perf_counter(), time.process_time(), git_commit()
    if stored is None:
        configs = [replace(r.config, device=device) for r in item]
        dirs = [run_dir_for(c, root) for c in configs]
        resumed = _seconds_spent(dirs)
        results = train_many(configs, dirs, progress=progress)
        attempts = [[_attempt(r, experiment)] for r in results]
        configs = [r.config for r in results]
    else:
        results = [None] * len(item)
        attempts = [list(stored[r.key]["attempts"]) for r in item]
        configs = [replace(TrainConfig.from_dict(stored[r.key]["config"]), device=device) for r in item]
        resumed = 0.0
    while todo := [i for i, a in enumerate(attempts) if may_double(a, experiment)]:
        longer = [replace(configs[i], steps=2 * configs[i].steps, eval_every=2 * configs[i].steps // 20)
                  for i in todo]
        dirs = [run_dir_for(c, root) for c in longer]
        resumed += _seconds_spent(dirs)
        for i, result in zip(todo, train_many(longer, dirs, progress=progress)):
            attempts[i].append(_doubled_attempt(result, experiment, attempts[i][-1], configs[i], root))
            results[i], configs[i] = result, result.config
    # a resumed item also cost what earlier processes spent (one thread: their CPU ~ their wall)
    prov = provenance(device, time.perf_counter() - wall + resumed, time.process_time() - cpu + resumed, code)
    prov["resumed_seconds"] = round(resumed, 2)
    prov["runs_in_item"] = len(item)
    # unique even for two items of one index trained within the same second (a doubling of a
    # quick item): the stack a run was trained in is told by this id (verify.stack_of)
    prov["item"] = f"{name}#{index}@{prov['date']}/{uuid.uuid4().hex[:8]}"
    records = []
    for run_, result, tries in zip(item, results, attempts):
        if result is None:   # not trained again: as stored
            records.append(stored[run_.key])
            continue
        record = _record(run_, result, tries, run_.variant in experiment.gap_variants)
        record["provenance"] = dict(prov)
        if stored is not None:   # the items that trained its earlier attempts, for the cost
            record["provenance"]["earlier"] = [{k: v for k, v in p.items() if k != "earlier"}
                                               for p in provenances_of(stored[run_.key])]
        records.append(record)
    return records


def run(name: str, *, device: str = "cpu", jobs: int = 1, root=None, directory=None, progress: bool = True,
        max_items: int | None = None, refresh_theory: bool = False) -> dict:
    """Train the runs of experiment ``name`` that ``results/NAME.json`` does not hold yet, and
    retrain with twice the steps the stored runs that may double again
    (:func:`~fvlib.experiments.rules.runs_to_double`).

    ``jobs`` work items at a time (separate processes, one thread each), the cheapest first;
    each finished item's runs are added to the result file at once. ``root``: the run root of the checkpoints
    (default ``$FVLIB_RUN_ROOT`` or ``./.fvlib_runs``). ``max_items``: stop after that many
    items (e.g. to spread an experiment over sessions). The references are computed once, when
    the file is started; ``refresh_theory`` recomputes them with today's code (after a fix that
    :func:`~fvlib.experiments.verify.verify` reports), keeping the runs, before training what is missing (to recompute
    only the references, :func:`refresh_theory`). Returns the result dict.
    """
    experiment = get_experiment(name)
    resolve_device(device)
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    check_results_dir(directory, writable=True)
    path = result_path(name, directory)
    with result_lock(path):
        data = read_result(name, directory, beside=not refresh_theory) if path.exists() else new_result(experiment)
        _update_rules(path, data, experiment)
        if data.theory is None or refresh_theory:
            _store_theory(path, data, experiment)
        missing = [i for i, item in enumerate(experiment.items) if any(r.key not in data.runs for r in item)]
        # stored items whose runs may double again (a definition that allows more doublings)
        doubling = set(runs_to_double(data.to_dict(), experiment))
        longer = [i for i, item in enumerate(experiment.items)
                  if i not in missing and any(r.key in doubling for r in item)]
        todo = missing + longer
        if max_items is not None:
            todo = todo[:max_items]
        # the cheapest first: an experiment spread over sessions stores the most runs per hour
        todo.sort(key=lambda i: sum(estimate_seconds(r.config) for r in experiment.items[i]))
        args = [(name, i, root, device, progress and jobs == 1,
                 None if i in missing else {r.key: data.runs[r.key].to_dict() for r in experiment.items[i]})
                for i in todo]
        bar = tqdm(total=sum(len(experiment.items[i]) for i in todo), desc=f"{name} runs",
                   disable=not progress or not todo)

        def add(records):
            for record in records:
                data.runs[record["key"]] = RunRecord.from_dict(record, f"{path}/runs/{record['key']}")
            write_result(path, data)
            _keep_models(name, data, [record["key"] for record in records], root, directory)
            bar.update(len(records))

        if jobs == 1 or len(args) <= 1:
            for a in args:
                add(_train_item(a))
        else:
            with worker_pool(min(jobs, len(args))) as pool:  # the workers end when this process ends
                for records in pool.imap_unordered(_train_item, args):
                    add(records)
        bar.close()
    return data.to_dict()


def _keep_models(name: str, data: ResultFile, keys: list[str], root, directory) -> None:
    """The final weights of the kept runs among ``keys`` (just stored in ``data``) added beside the
    result file, which is sealed again; a run directory that cannot give them is said on stderr
    (the runs stay stored; ``experiment keep-models NAME`` adds the weights later)."""
    try:
        added = add_kept_models(name, data, keys, root, directory)
    except ValueError as err:   # a ResultError naming the run
        print(f"fvlib: note: {err}; the run is stored without its weights (`python -m fvlib experiment "
              f"keep-models {name}` adds them)", file=sys.stderr)
        return
    if added:
        write_result(result_path(name, directory), data)


def _update_rules(path: Path, data: ResultFile, experiment: Experiment) -> None:
    """What the file says of its experiment follows the definition and the code (a definition that
    grew plans its new runs; an older file gains the rules it lacks); written when it changed."""
    today = new_result(experiment)
    if (data.planned_runs, data.description, data.rules) != (today.planned_runs, today.description, today.rules):
        data.planned_runs, data.description, data.rules = today.planned_runs, today.description, today.rules
        write_result(path, data)


def _store_theory(path: Path, data: ResultFile, experiment: Experiment) -> None:
    """Compute the references of ``experiment`` (their optimised parameters searched,
    :class:`TheoryParams`) and store them: the parameters beside ``path``
    (:func:`~fvlib.experiments.storage.theory_params_path`), then the theory block, its kind and its
    ``theory_provenance``
    (the code, machine and seconds of the computation) in ``data``, written to ``path``."""
    wall, cpu = time.perf_counter(), time.process_time()
    params = TheoryParams()
    theory = experiment.theory(params)
    prov = provenance("cpu", time.perf_counter() - wall, time.process_time() - cpu)
    write_theory_params(theory_params_path(experiment.name, path.parent), experiment.name, params)
    data.theory, data.theory_kind = theory, theory_kind(theory)
    data.theory_provenance = Provenance.from_dict(prov, f"{path}/theory_provenance")
    write_result(path, data)


def refresh_theory(name: str, directory=None) -> dict:
    """Recompute the references of the stored experiment ``name`` with today's code, and nothing
    else: the theory block of ``results/NAME.json`` (with its ``theory_provenance``) and the
    optimised parameters beside it (:func:`~fvlib.experiments.storage.theory_params_path`), each searched again from
    :data:`~fvlib.experiments.references.OPTIMISER_STARTS` starts. No run is trained, every run
    is kept; the file's rules are brought up to date. Raises :class:`~fvlib.experiments.records.ResultError` when the
    file is missing or not of ``name``. Returns the result dict."""
    experiment = get_experiment(name)
    path = result_path(name, directory)
    with result_lock(path):
        data = read_result(name, directory, beside=False)   # the parameters are written anew
        _update_rules(path, data, experiment)
        _store_theory(path, data, experiment)
    return data.to_dict()


def stored(name: str, *, recompute: bool = False, device: str = "auto", directory="recomputed",
           progress: bool = True) -> dict:
    """The result of experiment ``name`` as a chapter reads it.

    By default the stored ``results/NAME.json`` (:func:`~fvlib.experiments.storage.load_result`). With
    ``recompute=True``
    the experiment is trained here first (:func:`run` on ``device``, resumable), into
    ``directory`` (default ``./recomputed``, so the stored file is never overwritten), and that
    result is returned: on a GPU (Colab) minutes to an hour, on a CPU hours.
    """
    if not recompute:
        return load_result(name)
    return run(name, device=device, directory=directory, root=Path(directory) / "runs", progress=progress)
