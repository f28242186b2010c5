"""What a run's checkpoint holds, written and read: its config, weights, evaluation history and
training state (Adam moments, RNG state, running scalars), and the runs loaded back
(:func:`load_run`). The files, their manifest and the lock are :mod:`fvlib.training.rundir`'s.
Nothing is ever unpickled: tensors go through safetensors, scalars through JSON.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch

from .._checks import is_int
from ..families import get_family
from ..models import FVTransformer, ModelConfig
from ..transformer import TransformerConfig
from .config import RESUMABLE_FIELDS, TrainConfig, model_from_config
from .rundir import (
    CONFIG_FILE,
    FORMAT_VERSION,
    HISTORY_FILE,
    MANIFEST_FILE,
    MODEL_FILE,
    RUN_FORMAT,
    STATE_FILE,
    RunDirError,
    check_format,
    commit,
    has_checkpoint,
    is_run_config,
    read_files,
    tensors_from_bytes,
    tensors_to_bytes,
    write_atomic,
)

__all__ = [
    "write_config",
    "StoredRun",
    "read_stored",
    "load_weights",
    "save_checkpoint",
    "load_run",
    "load_history",
    "checkpoint_step",
    "same_run",
    "load_optimizer_tensors",
    "stored_config",
    "RunConfigMismatch",
    "config_differences",
    "check_same_run",
    "try_resume",
    "HISTORY_KEYS",
]

#: The keys of every evaluation in ``history.json`` (:attr:`fvlib.training.loop.TrainResult.history`);
#: each a finite number, ``step`` an integer, ``train_loss`` ``None`` at step 0.
HISTORY_KEYS = ("step", "lr", "train_loss", "eval_excess_loss", "eval_stderr", "eval_query_loss", "seconds")

def _json_from_bytes(data: bytes, path: Path):
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RunDirError(f"corrupt JSON in {path}: {err}") from None


def write_config(out_dir: Path, config: TrainConfig, model: FVTransformer) -> None:
    """Write the run's ``config.json`` (its train and model configs), once, when the run starts."""
    payload = {
        "format": RUN_FORMAT,
        "version": FORMAT_VERSION,
        "train": config.to_dict(),
        "model": model.config.to_dict(),
    }
    write_atomic(out_dir / CONFIG_FILE, (json.dumps(payload, indent=2) + "\n").encode())


def _parse_config(data: bytes, path: Path) -> tuple[TrainConfig, ModelConfig | TransformerConfig]:
    """The train and model configs of a ``config.json``; they must describe the same model."""
    payload = _json_from_bytes(data, path)
    if not is_run_config(payload):
        raise RunDirError(f"{path} is not an fvlib run config (no format 'fvlib-run', no train and model sections)")
    check_format(payload, RUN_FORMAT, path)
    try:
        config = TrainConfig.from_dict(payload["train"])
        model_config = get_family(config.arch).config_class.from_dict(payload["model"])
    except (KeyError, TypeError, ValueError) as err:
        raise RunDirError(f"invalid run config in {path}: {err}") from None
    if model_config != config.model_config():
        raise RunDirError(f"invalid run config in {path}: its model section {model_config} is not the "
                          f"model of its train section, {config.model_config()}")
    return config, model_config


def _parse_history(data: bytes, path: Path) -> tuple[int, list[dict]]:
    payload = _json_from_bytes(data, path)
    if (
        not isinstance(payload, dict)
        or not isinstance(payload.get("history"), list)
        or not is_int(payload.get("step"))
    ):
        raise RunDirError(f"invalid history in {path}: not an object with a step and a list 'history'")
    for index, entry in enumerate(payload["history"]):
        fault = _bad_history_entry(entry, payload["step"])
        if fault:
            raise RunDirError(f"invalid history in {path}: entry {index} {fault}")
    return payload["step"], payload["history"]


def _bad_history_entry(entry, last_step: int) -> str | None:
    """What is wrong with one evaluation of a history ending at ``last_step``, or ``None``."""
    if not isinstance(entry, dict):
        return f"is {entry!r}, not an evaluation (a mapping of {', '.join(HISTORY_KEYS)})"
    missing = [key for key in HISTORY_KEYS if key not in entry]
    if missing:
        return f"lacks {', '.join(missing)}"
    if not is_int(entry["step"]) or not 0 <= entry["step"] <= last_step:
        return f"has step {entry['step']!r}, not a step in [0, {last_step}]"
    for key in HISTORY_KEYS[1:]:
        value = entry[key]
        if value is None and key == "train_loss":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"has {key} {value!r}, not a finite number"
    return None


def _checkpoint_step(metadata: dict, path: Path) -> int:
    try:
        return int(metadata["step"])
    except (KeyError, ValueError):
        raise RunDirError(f"checkpoint {path} has no valid step in its metadata") from None


def _parse_tensors(data: bytes, path: Path) -> tuple[dict, dict, int]:
    """``(tensors, metadata, step)`` of a checkpoint's safetensors file; every float tensor
    must be finite."""
    tensors, metadata = tensors_from_bytes(data, path)
    for name, value in tensors.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise RunDirError(f"{path} holds non-finite values (NaN or inf) in {name!r}")
    return tensors, metadata, _checkpoint_step(metadata, path)


@dataclass
class StoredRun:
    """A run directory's checkpoint as read from disk (files verified, steps in agreement)."""

    config: TrainConfig
    model_config: ModelConfig | TransformerConfig
    step: int
    history: list[dict]
    weights: dict
    state: tuple[dict, dict] | None  # (tensors, metadata) of train_state.safetensors


def read_stored(run_dir: Path, with_state: bool = False, unverified: bool = False) -> StoredRun:
    """Read and check the checkpoint of ``run_dir``: config, weights, history (and training
    state). Every file is checked against the manifest (:mod:`fvlib.training.rundir`), and all
    for what can be checked: the files agree on the step, the weights are finite, the history
    is well formed. ``unverified``: read a run without manifest (its repair). Raises
    :class:`~fvlib.training.rundir.RunDirError` naming the file at fault."""
    names = [CONFIG_FILE, MODEL_FILE, HISTORY_FILE] + ([STATE_FILE] if with_state else [])
    files = read_files(run_dir, names, unverified=unverified)
    config, model_config = _parse_config(files.data[CONFIG_FILE], run_dir / CONFIG_FILE)
    weights, _, model_step = _parse_tensors(files.data[MODEL_FILE], run_dir / MODEL_FILE)
    history_step, history = _parse_history(files.data[HISTORY_FILE], run_dir / HISTORY_FILE)
    steps = {MODEL_FILE: model_step, HISTORY_FILE: history_step}
    state = None
    if with_state:
        tensors, metadata, steps[STATE_FILE] = _parse_tensors(files.data[STATE_FILE], run_dir / STATE_FILE)
        state = (tensors, metadata)
    if files.step is not None:
        steps[MANIFEST_FILE] = files.step
    if len(set(steps.values())) > 1:
        found = ", ".join(f"{name} step {step}" for name, step in steps.items())
        raise RunDirError(f"{run_dir}: checkpoint files are from different steps ({found}); "
                          f"the run cannot be resumed: delete the directory to train it again")
    return StoredRun(config, model_config, model_step, history, weights, state)


def load_weights(model, weights: dict, path: Path) -> None:
    """Load ``weights`` into ``model``; a missing, extra or wrongly shaped tensor is a one-line
    :class:`~fvlib.training.rundir.RunDirError` naming ``path``."""
    expected = model.state_dict()
    missing, extra = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or extra:
        raise RunDirError(f"weights in {path} do not fit the model of its config.json: "
                          f"missing {missing[:3]}, unexpected {extra[:3]}")
    for name, value in expected.items():
        if weights[name].shape != value.shape:
            raise RunDirError(f"weights in {path} do not fit the model of its config.json: {name!r} has "
                              f"shape {tuple(weights[name].shape)}, the config needs {tuple(value.shape)}")
    model.load_state_dict(weights)


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict:
    tensors = {}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"optimizer.{index}.{key}"] = torch.as_tensor(value)
    return tensors


def load_optimizer_tensors(optimizer: torch.optim.Optimizer, tensors: dict, path: Path) -> None:
    """Load Adam's state from ``tensors`` (``optimizer.INDEX.KEY``); a moment whose shape is not
    its parameter's, or an index with no parameter, is a one-line error naming ``path`` and the
    tensor (before Adam sees it)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            if not index.isdigit() or int(index) >= len(params):
                raise RunDirError(f"{path} holds {name!r}, for a parameter the model does not have")
            shape = tuple(params[int(index)].shape)
            if key != "step" and tuple(value.shape) != shape:
                raise RunDirError(f"{path} holds {name!r} of shape {tuple(value.shape)}, its parameter has "
                                  f"shape {shape} (the state of another run?)")
            state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


def save_checkpoint(out_dir: Path, step: int, model, optimizer, generator, history, scalars) -> None:
    """Write the checkpoint of ``step`` as one atomic step (:func:`fvlib.training.rundir.commit`)."""
    meta = {"step": str(step)}
    state_tensors = _optimizer_tensors(optimizer)
    state_tensors["generator_state"] = generator.get_state()
    commit(out_dir, step, {
        STATE_FILE: tensors_to_bytes(state_tensors, {**meta, "scalars": json.dumps(scalars)}),
        MODEL_FILE: tensors_to_bytes(model.state_dict(), meta),
        HISTORY_FILE: (json.dumps({"step": step, "history": history}, indent=1) + "\n").encode(),
    })


def _existing_run_dir(run_dir) -> Path:
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is a file, not a run directory")
    if not run_dir.is_dir():
        raise RunDirError(f"run directory {run_dir} does not exist")
    return run_dir


def load_run(run_dir: str | os.PathLike) -> tuple[FVTransformer, TrainConfig, list[dict]]:
    """Load a trained run: ``(model, config, history)``; the model is on the CPU in eval mode.

    Raises:
        RunDirError: (a ``ValueError``) missing directory or files, a file that does not match
            the checkpoint's manifest (corrupt or edited), corrupt JSON or safetensors,
            non-finite weights, weights that do not fit ``config.json``, a history that is not
            a list of evaluations, a config or manifest of an unknown format or version, or files
            from different checkpoints; the message names the path.
            :class:`~fvlib.training.rundir.UnverifiedRunError` for a run without manifest (until
            :func:`fvlib.training.repair.repair_run`).
    """
    run_dir = _existing_run_dir(run_dir)
    stored = read_stored(run_dir)
    model = model_from_config(stored.model_config)
    load_weights(model, stored.weights, run_dir / MODEL_FILE)
    return model.eval(), stored.config, stored.history


def load_history(run_dir: str | os.PathLike) -> list[dict]:
    """The evaluation history of a run (as in :attr:`fvlib.training.loop.TrainResult.history`) without loading its
    weights; raises :class:`~fvlib.training.rundir.RunDirError` when the directory or its history file is missing,
    corrupt or not the one of the checkpoint's manifest."""
    run_dir = _existing_run_dir(run_dir)
    files = read_files(run_dir, [HISTORY_FILE])
    step, history = _parse_history(files.data[HISTORY_FILE], run_dir / HISTORY_FILE)
    if files.step is not None and step != files.step:
        raise RunDirError(f"{run_dir / HISTORY_FILE} is from step {step}, the checkpoint from step {files.step}")
    return history


def checkpoint_step(run_dir: str | os.PathLike) -> int:
    """The step of a run's latest checkpoint, where :func:`~fvlib.training.loop.train` resumes (it can lie after the
    last evaluation of :func:`load_history` when training was stopped between evaluations);
    raises :class:`~fvlib.training.rundir.RunDirError` as :func:`load_history` does."""
    run_dir = _existing_run_dir(run_dir)
    files = read_files(run_dir, [HISTORY_FILE])
    step, _ = _parse_history(files.data[HISTORY_FILE], run_dir / HISTORY_FILE)
    return step if files.step is None else files.step


def same_run(a: TrainConfig, b: TrainConfig) -> bool:
    """Whether ``a`` and ``b`` train the same run: equal up to :data:`~fvlib.training.config.RESUMABLE_FIELDS`
    and, as in :func:`~fvlib.training.config.run_dir_for`, up to the fields that change nothing in
    either (:meth:`~fvlib.training.config.TrainConfig.unused_fields`; e.g. a model B run saved when
    the defaults had a warm start)."""
    same = {k: getattr(b, k) for k in RESUMABLE_FIELDS}
    same.update({k: getattr(b, k) for k in a.unused_fields() & b.unused_fields()})
    return replace(a, **same) == b


def config_differences(stored: TrainConfig, config: TrainConfig) -> list[tuple[str, object, object]]:
    """``(field, value here, value in the run)`` for each field where ``config`` asks for another
    run than ``stored`` (as :func:`same_run` judges: resumable and unused fields left out)."""
    ignored = set(RESUMABLE_FIELDS) | (stored.unused_fields() & config.unused_fields())
    return [(f.name, getattr(config, f.name), getattr(stored, f.name)) for f in fields(TrainConfig)
            if f.name not in ignored and getattr(config, f.name) != getattr(stored, f.name)]


class RunConfigMismatch(RunDirError):
    """A run directory holds a run of another config. ``differences``: ``(field, here, in the
    run)``; :meth:`worded` says it with the caller's names for the fields and the directory."""

    def __init__(self, run_dir: Path, differences: list, finished: bool):
        self.run_dir, self.differences, self.finished = Path(run_dir), differences, finished
        super().__init__(self.worded())

    def worded(self, name_of=lambda field: field, where: str = "out_dir",
               start_over: str = "or resume=False to train over it") -> str:
        """The one-line message, each field named by ``name_of(field)`` (e.g. its flag)."""
        shown = "; ".join(f"{name_of(k)} {here} here, {there} in the run" for k, here, there in self.differences)
        note = ""
        if any(k == "steps" for k, _, _ in self.differences):
            state = "is finished and " if self.finished else ""
            note = f"; the run {state}cannot be extended: its learning-rate schedule ends at its {name_of('steps')}"
        return f"{self.run_dir} holds a run with another config: {shown}{note} (use another {where}, {start_over})"


def check_same_run(run_dir: Path, stored: TrainConfig, config: TrainConfig, stored_step: int | None = None) -> None:
    """Raise :class:`RunConfigMismatch` when ``config`` is not the run ``stored`` in ``run_dir``
    (:func:`same_run`); ``stored_step``: the step of its checkpoint, if any."""
    if not same_run(stored, config):
        finished = stored_step is not None and stored_step == stored.steps
        raise RunConfigMismatch(run_dir, config_differences(stored, config) or [("config", config, stored)],
                                finished)


def stored_config(run_dir: Path) -> TrainConfig | None:
    """The config in ``run_dir``'s ``config.json`` (written when its run starts), or ``None``
    when there is none or it cannot be read (the checks of the checkpoint then say why)."""
    try:
        return _parse_config((Path(run_dir) / CONFIG_FILE).read_bytes(), Path(run_dir) / CONFIG_FILE)[0]
    except (OSError, RunDirError):
        return None


def try_resume(
    out_dir: Path, config: TrainConfig, model, optimizer, generator
) -> tuple[int, list, dict] | None:
    """Restore the checkpoint in ``out_dir``; ``None`` when there is none."""
    if not has_checkpoint(out_dir):
        return None
    stored = read_stored(out_dir, with_state=True)
    check_same_run(out_dir, stored.config, config, stored.step)
    load_weights(model, stored.weights, out_dir / MODEL_FILE)
    tensors, metadata = stored.state
    try:
        load_optimizer_tensors(optimizer, tensors, out_dir / STATE_FILE)
        generator.set_state(tensors["generator_state"])
        scalars = json.loads(metadata["scalars"])
    except (KeyError, ValueError, RuntimeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise RunDirError(f"corrupt training state in {out_dir / STATE_FILE}: {reason}") from None
    return stored.step, stored.history, scalars
