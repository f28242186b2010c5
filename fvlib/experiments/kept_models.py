"""The trained models a stored experiment keeps: the final weights of the runs of
:attr:`~fvlib.experiments.definitions.Experiment.stored_models`, in
``results/NAME.models.safetensors`` beside ``results/NAME.json`` and sealed with it
(:func:`~fvlib.experiments.storage.models_path`, :func:`~fvlib.experiments.storage.write_models_file`).

* :func:`load_stored_model` -- a kept model and its config, for a chapter that reads a trained
  model instead of training its own; :func:`stored_model_keys`, the runs it can load;
* :func:`add_kept_models` -- what :func:`~fvlib.experiments.runner.run` calls when it stores a
  work item holding a kept run: the final weights read from the run's directory;
* :func:`keep_models` (``python -m fvlib experiment keep-models NAME``) -- the maintainer's step
  for runs stored before their weights were kept (or by another fvlib): each run's directory read
  and its model re-evaluated on the run's own evaluation contexts against the stored final loss
  (:data:`KEEP_RTOL`), then the file written and the result sealed again.

A run directory yields a kept model only when its config is the stored record's and its
checkpoint is of the record's final step (:func:`run_model`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..training import RunDirError, TrainConfig, build_model, checkpoint_step, load_run, run_dir_for
from ..training.checkpoint import config_differences, load_weights
from ..training.evaluate import per_context_losses, run_eval_batches
from .definitions import get_experiment
from .records import ResultError, ResultFile, RunRecord
from .rules import failed
from .storage import (
    load_models_file,
    models_path,
    read_result,
    result_lock,
    result_path,
    write_models_file,
    write_result,
)

__all__ = ["KEEP_RTOL", "add_kept_models", "keep_models", "load_stored_model", "run_model", "stored_model_keys"]

#: The relative tolerance of :func:`keep_models`'s check: the mean excess loss of the model read
#: from a run's directory, on the run's own evaluation contexts, against the record's final loss
#: (the same computation on the same contexts, so float rounding only).
KEEP_RTOL = 1e-6


def run_model(record: RunRecord, root=None) -> tuple[torch.nn.Module, TrainConfig]:
    """The final model of stored run ``record``, read from its run directory
    (:func:`~fvlib.training.config.run_dir_for` its config under ``root``), and its config. Raises
    :class:`~fvlib.experiments.records.ResultError` naming the run's key when the directory is
    missing or broken, holds another config, or its checkpoint is not of the record's steps."""
    config = TrainConfig.from_dict(record.config)
    run_dir = run_dir_for(config, root)
    try:
        model, loaded, _ = load_run(run_dir)
        step = checkpoint_step(run_dir)
    except RunDirError as err:
        raise ResultError(f"kept run {record.key}: {err}") from None
    differences = config_differences(loaded, config)
    if differences:
        field, here, there = differences[0]
        raise ResultError(f"kept run {record.key}: {run_dir} holds another run ({field} {there!r}, the record "
                          f"says {here!r})")
    if step != record.steps:
        raise ResultError(f"kept run {record.key}: {run_dir} is at step {step}, the record at step {record.steps}")
    return model, config


def _entry(record: RunRecord, model: torch.nn.Module) -> dict:
    """What the kept-models file holds of run ``record``: weights, config, steps."""
    return {"weights": model.state_dict(), "config": record.config, "steps": record.steps}


def _held(name: str, directory) -> dict[str, dict]:
    """The kept models in the file beside the result (``{}`` when there is none yet)."""
    return load_models_file(name, directory) if models_path(name, directory).is_file() else {}


def _same(a: dict, b: dict) -> bool:
    """Two kept-model entries hold the same config, steps and weights."""
    return (a["config"] == b["config"] and a["steps"] == b["steps"] and a["weights"].keys() == b["weights"].keys()
            and all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"]))


def add_kept_models(name: str, data: ResultFile, keys, root=None, directory=None) -> list[str]:
    """Read the final models of the stored runs ``keys`` of ``data`` (those of the experiment's
    :attr:`~fvlib.experiments.definitions.Experiment.stored_models`; others are skipped) from
    their run directories (:func:`run_model`) and write them into the kept-models file beside
    the result, next to those it holds; a run the file already holds with the record's config and
    steps is not read again. The caller holds the result lock and writes the result file next,
    which seals the new file. Returns the keys written; none: the file is left as it was."""
    kept = set(get_experiment(name).stored_models)
    held = _held(name, directory)
    added = {}
    for key in keys:
        record = data.runs[key]
        if key not in kept or (key in held and (held[key]["config"], held[key]["steps"]) == (record.config,
                                                                                            record.steps)):
            continue
        added[key] = _entry(record, run_model(record, root)[0])
    if added:
        write_models_file(models_path(name, directory), name, {**held, **added})
    return sorted(added)


def _checked_model(record: RunRecord, root) -> torch.nn.Module:
    """The final model of ``record`` from its run directory (:func:`run_model`), re-evaluated on
    the run's own evaluation contexts: its mean excess loss must be the record's final loss within
    :data:`KEEP_RTOL`, else a :class:`~fvlib.experiments.records.ResultError` naming the key."""
    model, config = run_model(record, root)
    loss = float(per_context_losses(model, run_eval_batches(config))[0].mean())
    if not abs(loss - record.final_loss) <= KEEP_RTOL * abs(record.final_loss):
        raise ResultError(f"kept run {record.key}: the model in {run_dir_for(config, root)} has loss {loss!r} on "
                          f"the run's evaluation contexts, the record {record.final_loss!r} (tolerance "
                          f"{KEEP_RTOL:g} relative); it is not the stored run's model")
    return model


def keep_models(name: str, directory=None, root=None) -> dict:
    """Write the kept models of the stored experiment ``name`` from the run directories under
    ``root`` (default ``$FVLIB_RUN_ROOT`` or ``./.fvlib_runs``) and seal them with the result
    (``python -m fvlib experiment keep-models NAME``), under the result lock: for a result whose
    runs were stored before their weights were kept. Each kept run the file stores is read from
    its directory (:func:`run_model`: the record's config, its final step) and re-evaluated on its
    own evaluation contexts, which must give the record's final loss (:data:`KEEP_RTOL`); the
    first that does not is refused, naming its key and both numbers, and nothing is written. A
    file that already holds these very models is left as it is, and so is the result file when
    its seal holds.

    Returns ``{"experiment", "file", "kept", "not_stored", "written"}``: the keys written, the
    kept keys the result does not store yet, whether anything was written."""
    experiment = get_experiment(name)
    if not experiment.stored_models:
        raise ValueError(f"experiment {name!r} keeps no models (its definition's stored_models is empty)")
    path = result_path(name, directory)
    with result_lock(path):
        data = read_result(name, directory, models=False)   # the models are written anew
        keys = [k for k in experiment.stored_models if k in data.runs]
        models = {k: _entry(data.runs[k], _checked_model(data.runs[k], root)) for k in keys}
        held = _held(name, directory)
        same = models.keys() == held.keys() and all(_same(models[k], held[k]) for k in models)
        if not same:
            write_models_file(models_path(name, directory), name, models)
        sealed = _sealed(name, directory)
        if not (same and sealed):
            write_result(path, data)
    return {"experiment": name, "file": str(models_path(name, directory)), "kept": keys,
            "not_stored": [k for k in experiment.stored_models if k not in data.runs],
            "written": not (same and sealed)}


def _sealed(name: str, directory) -> bool:
    """Whether the result file of ``name`` and every file beside it match its seal."""
    try:
        read_result(name, directory)
    except ResultError:
        return False
    return True


def stored_model_keys(name: str, directory=None, *, trained_only: bool = False) -> tuple[str, ...]:
    """The keys of the runs of experiment ``name`` whose models :func:`load_stored_model` can load
    (in the order of its :attr:`~fvlib.experiments.definitions.Experiment.stored_models`): those the
    kept-models file holds, checked against the result's seal; ``()`` when there is no result file
    or no kept-models file yet. ``trained_only``: only the runs that did not fail by
    :data:`~fvlib.experiments.rules.FAILURE_RULE` (a failed run's model is kept and counted, but an
    analysis of what a trained network does should not read it)."""
    experiment = get_experiment(name)
    if not result_path(name, directory).is_file():
        return ()
    data = read_result(name, directory).to_dict()
    held = _held(name, directory)
    return tuple(k for k in experiment.stored_models
                 if k in held and not (trained_only and failed(data, data["runs"][k])))


def load_stored_model(name: str, key: str, directory=None) -> tuple[torch.nn.Module, TrainConfig]:
    """The trained model of run ``key`` of the stored experiment ``name`` and its config, from
    ``results/NAME.models.safetensors``: ``(model, config)``, the model on the CPU in eval mode
    (as :func:`~fvlib.training.checkpoint.load_run` returns one), built from the stored config and loaded with
    the stored weights. The result file is read with its checks, the seal of the models file
    included (:func:`~fvlib.experiments.storage.read_result`).

    Raises ``ValueError`` for an unknown experiment, a key whose weights the experiment does not
    keep (listing those it keeps); :class:`~fvlib.experiments.records.ResultError` for a run not
    stored yet, a missing models file (naming the command that writes it), a file that does not
    hold the run or holds another config or step count than the record."""
    experiment = get_experiment(name)
    if key not in experiment.stored_models:
        kept = ", ".join(experiment.stored_models) or "none"
        raise ValueError(f"key: experiment {name!r} keeps no model of run {key!r}; it keeps {kept}")
    data = read_result(name, directory)
    if key not in data.runs:
        raise ResultError(f"{result_path(name, directory)} does not store run {key!r} yet; "
                          f"run `python -m fvlib experiment run {name}`")
    record, path = data.runs[key], models_path(name, directory)
    held = load_models_file(name, directory)
    if key not in held:
        raise ResultError(f"{path} holds no model of run {key!r}; write it with "
                          f"`python -m fvlib experiment keep-models {name}`")
    if (held[key]["config"], held[key]["steps"]) != (record.config, record.steps):
        raise ResultError(f"{path}: the model of run {key!r} is not the stored run's (config or steps differ: "
                          f"{held[key]['steps']} steps, the record {record.steps}); write it again with "
                          f"`python -m fvlib experiment keep-models {name}`")
    config = TrainConfig.from_dict(record.config)
    model = build_model(config)
    load_weights(model, held[key]["weights"], Path(path))
    return model.eval(), config
