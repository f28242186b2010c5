"""Where the stored experiments live on disk, and reading and writing them.

``results/NAME.json`` (:func:`result_path`, in :func:`results_dir`) holds an experiment's runs
and references as a version-3 result file (:mod:`fvlib.experiments.records`). Beside it:
``results/NAME.theory.safetensors`` (:func:`theory_params_path`), the optimised parameters of its
references (:class:`~fvlib.experiments.references.TheoryParams`), and for an experiment that keeps
trained weights (:attr:`~fvlib.experiments.definitions.Experiment.stored_models`)
``results/NAME.models.safetensors`` (:func:`models_path`), the final weights of those runs. Every
file is written in one step (:func:`~fvlib.files.write_atomic`), under :func:`result_lock` (one
writer at a time), and only here: :func:`write_result` seals what it writes and the files beside
it (:mod:`fvlib.experiments.seal`), and every read (:func:`read_result`, :func:`load_result`)
checks the file's fields and its seal, so an edit made outside fvlib is refused in one line naming
the file and the part. :func:`seal_result` (``python -m fvlib experiment seal NAME``) checks a
file and seals it, the maintainer's explicit step.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from ..files import ExclusiveLock, write_atomic, write_json_atomic
from ..training.rundir import RunDirError, check_writable_dir, tensors_from_bytes, tensors_to_bytes
from .definitions import get_experiment, same_config
from .records import ResultError, ResultFile, new_result
from .references import THEORY_PARAMS_FORMAT, THEORY_PARAMS_SUFFIX, TheoryParams
from .seal import broken_parts, seal_of, seal_shape_error

__all__ = ["MODELS_FORMAT", "MODELS_SUFFIX", "RESULTS_ENV", "check_results_dir", "load_models_file", "load_result",
           "load_theory_params", "models_path", "read_result", "result_lock", "result_path", "results_dir",
           "seal_result", "theory_params_path", "write_models_file", "write_result", "write_theory_params"]

RESULTS_ENV = "FVLIB_RESULTS_DIR"

#: The file beside ``results/NAME.json`` holding the final weights of its kept runs.
MODELS_SUFFIX = ".models.safetensors"

#: The ``format`` tag in the metadata of a kept-models file (:func:`write_models_file`).
MODELS_FORMAT = "fvlib-kept-models"


#: Where ``pip install`` puts a copy of the repository's ``results/*.json``, their theory
#: parameters ``results/*.theory.safetensors`` and their kept models ``results/*.models.safetensors``
#: (pyproject.toml, ``data-files``), relative to the environment's prefix.
INSTALLED_RESULTS = Path("share") / "fvlib" / "results"


def results_dir() -> Path:
    """``$FVLIB_RESULTS_DIR``, else the ``results/`` folder of the repository this fvlib lives in
    (an editable install, as ``make book`` makes), else the copy a ``pip install`` of the
    repository made (``sys.prefix/share/fvlib/results``, e.g. on Colab), else ``./results``."""
    if os.environ.get(RESULTS_ENV):
        return Path(os.environ[RESULTS_ENV])
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file():
        return repo / "results"
    installed = Path(sys.prefix) / INSTALLED_RESULTS
    if installed.is_dir():
        return installed
    return Path("results")


def result_path(name: str, directory=None) -> Path:
    """``results/NAME.json`` of experiment ``name`` (in ``directory``, default :func:`results_dir`)."""
    get_experiment(name)
    return Path(directory if directory is not None else results_dir()) / f"{name}.json"


def theory_params_path(name: str, directory=None) -> Path:
    """The optimised parameters of the references of ``results/NAME.json``, beside it:
    ``results/NAME.theory.safetensors`` (:class:`~fvlib.experiments.references.TheoryParams`)."""
    return result_path(name, directory).with_name(f"{name}{THEORY_PARAMS_SUFFIX}")


def models_path(name: str, directory=None) -> Path:
    """The final weights of the kept runs of ``results/NAME.json``
    (:attr:`~fvlib.experiments.definitions.Experiment.stored_models`), beside it:
    ``results/NAME.models.safetensors`` (:func:`write_models_file`)."""
    return result_path(name, directory).with_name(f"{name}{MODELS_SUFFIX}")


def _beside_names(name: str) -> tuple[str, str]:
    """The names of the files beside ``results/NAME.json`` that its seal covers."""
    return f"{name}{THEORY_PARAMS_SUFFIX}", f"{name}{MODELS_SUFFIX}"


def _read_sidecar(path: Path, name: str, file_format: str, what: str, missing: str):
    """``(tensors, metadata)`` of the safetensors file ``path`` beside experiment ``name``'s result,
    whose metadata must name ``file_format`` and ``name``; a missing file (the message ``missing``),
    an unreadable one or another's raises :class:`~fvlib.experiments.records.ResultError` naming ``what``."""
    if not path.is_file():
        raise ResultError(missing)
    try:
        tensors, metadata = tensors_from_bytes(path.read_bytes(), path)
    except (OSError, RunDirError) as err:
        raise ResultError(f"unreadable {what} {path}: {err}") from None
    if metadata.get("format") != file_format or metadata.get("experiment") != name:
        raise ResultError(f"{path} holds no {what} of experiment {name!r} (metadata: format "
                          f"{metadata.get('format')!r}, experiment {metadata.get('experiment')!r})")
    return tensors, metadata


def load_theory_params(name: str, directory=None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(tensors, metadata)`` of experiment ``name``'s stored theory parameters
    (:func:`theory_params_path`): the tensors by key (:class:`~fvlib.experiments.references.TheoryParams`), the metadata
    with ``format``, ``experiment``, ``optimiser_starts``, ``selection_seed`` and ``selection`` (JSON:
    each searched reference's starts and their held-out losses). Raises :class:`~fvlib.experiments.records.ResultError`
    naming the file when it is missing, unreadable or of another experiment."""
    path = theory_params_path(name, directory)
    tensors, metadata = _read_sidecar(path, name, THEORY_PARAMS_FORMAT, "theory parameters",
                                      f"no stored theory parameters {path}; recompute the references with "
                                      f"fvlib.experiments.refresh_theory({name!r})")
    for field in ("optimiser_starts", "selection_seed"):
        if not str(metadata.get(field, "")).isdigit():
            raise ResultError(f"{path}: metadata {field} must be a count, got {metadata.get(field)!r}")
    return tensors, metadata


def load_models_file(name: str, directory=None) -> dict[str, dict]:
    """The kept models of experiment ``name`` (:func:`models_path`) as written by
    :func:`write_models_file`: ``{key: {"weights": {param: tensor}, "config": dict, "steps": int}}``.
    Raises :class:`~fvlib.experiments.records.ResultError` naming the file when it is missing,
    unreadable, of another experiment, or when a tensor or a metadata entry has no partner. The
    seal is not checked here (:func:`read_result` does)."""
    path = models_path(name, directory)
    tensors, metadata = _read_sidecar(path, name, MODELS_FORMAT, "kept models",
                                      f"no kept models {path}; write them from the run directories with "
                                      f"`python -m fvlib experiment keep-models {name}`")
    models = {}
    for entry, value in sorted(metadata.items()):
        key, _, field = entry.rpartition("/")
        if field == "config":
            models[key] = {"weights": {}, "config": _json_object(value, f"{path}: metadata {entry}"),
                           "steps": _count(metadata.get(f"{key}/steps"), f"{path}: metadata {key}/steps")}
    for tensor_name, tensor in tensors.items():
        key, _, param = tensor_name.rpartition("/")
        if key not in models:
            raise ResultError(f"{path}: tensor {tensor_name!r} belongs to no kept run (no metadata {key}/config)")
        models[key]["weights"][param] = tensor
    empty = [key for key, model in models.items() if not model["weights"]]
    if empty:
        raise ResultError(f"{path}: kept run {empty[0]!r} has a config but no tensors")
    return models


def _json_object(text, where: str) -> dict:
    """``text`` read as a JSON object, or a :class:`ResultError` naming ``where``."""
    try:
        value = json.loads(text)
    except (TypeError, json.JSONDecodeError):
        value = None
    if not isinstance(value, dict):
        raise ResultError(f"{where} must be a JSON object, got {str(text)[:80]!r}")
    return value


def _count(text, where: str) -> int:
    """``text`` read as a count (decimal digits), or a :class:`ResultError` naming ``where``."""
    if not isinstance(text, str) or not text.isdigit():
        raise ResultError(f"{where} must be a count, got {text!r}")
    return int(text)


def write_models_file(path: Path, name: str, models: dict[str, dict]) -> None:
    """The kept models of experiment ``name`` as ``path`` (safetensors, written in one step; the
    result file written next seals its bytes). ``models``: ``{key: {"weights": state_dict,
    "config": dict, "steps": int}}``; each parameter is stored as the tensor ``KEY/PARAM``, each
    key's config (JSON) and step count as the metadata ``KEY/config`` and ``KEY/steps``, beside
    ``format`` (:data:`MODELS_FORMAT`) and ``experiment``."""
    tensors = {f"{key}/{param}": value for key, model in models.items() for param, value in model["weights"].items()}
    metadata = {"format": MODELS_FORMAT, "experiment": name}
    for key, model in models.items():
        metadata[f"{key}/config"] = json.dumps(model["config"], sort_keys=True)
        metadata[f"{key}/steps"] = str(model["steps"])
    try:
        write_atomic(path, tensors_to_bytes(tensors, metadata))
    except OSError as err:
        raise ResultError(f"cannot write {path} ({err.strerror or err}); the stored file is as it was") from None


def check_results_dir(directory=None, *, writable: bool = False) -> Path:
    """The folder of the result files (``directory``, default :func:`results_dir`), checked: not a
    file, and with ``writable`` a folder that exists or can be made and where files can be
    created. Raises :class:`~fvlib.experiments.records.ResultError` naming the folder (and
    ``$FVLIB_RESULTS_DIR`` when it comes from there)."""
    folder = Path(directory if directory is not None else results_dir())
    from_env = os.environ.get(RESULTS_ENV) and folder == Path(os.environ[RESULTS_ENV])
    named = f"{RESULTS_ENV}={folder}" if from_env else str(folder)
    if folder.exists() and not folder.is_dir():
        raise ResultError(f"the results folder {named} is a file, not a folder")
    if writable:
        try:
            check_writable_dir(folder)
        except RunDirError as err:
            raise ResultError(f"the results folder {named} cannot be written: {err}") from None
    return folder


def _read_json(name: str, path: Path) -> dict:
    """The JSON of result file ``path``, or a :class:`ResultError` naming it."""
    check_results_dir(path.parent)
    if path.is_dir():
        raise ResultError(f"{path} is a folder, not a result file; move it away")
    if not path.is_file():
        raise ResultError(f"no stored result {path}; run `python -m fvlib experiment run {name}`")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultError(f"corrupt result file {path}: {err}") from None


def _check_name(name: str, path: Path, result: ResultFile) -> None:
    """``result`` (read from ``path``) is of experiment ``name``."""
    if result.experiment != name:
        raise ResultError(f"{path}: experiment is {result.experiment!r}, but the file is named for {name!r} "
                          f"(a result of another experiment); move it away")


def _check_definition(name: str, path: Path, result: ResultFile) -> None:
    """``result`` is of experiment ``name`` and holds only runs of its definition."""
    _check_name(name, path, result)
    experiment = get_experiment(name)
    defined = experiment.run_by_key()
    for key, record in result.runs.items():
        if key not in defined or not same_config(record.config, defined[key].config, experiment.max_doublings):
            raise ResultError(f"{path} holds run {key!r} of another definition of {name!r}; "
                              f"move the file away to start over")


def _beside_reader(path: Path):
    """``name -> bytes or None``: the files beside result file ``path``."""
    def read(name: str) -> bytes | None:
        other = path.with_name(name)
        return other.read_bytes() if other.is_file() and Path(name).name == name else None
    return read


def _unsealed_parts(name: str, path: Path, raw: dict, unchecked: tuple[str, ...] = ()) -> list[str]:
    """The parts of result file ``path`` (JSON ``raw``, version 3, of experiment ``name``) that
    differ from its seal, the files beside it included (a file there that the seal does not
    name is ``not sealed``), but those named in ``unchecked`` (about to be written anew)."""
    problem = seal_shape_error(raw["seal"])
    if problem:
        return [problem]
    broken = broken_parts(raw, _beside_reader(path))
    broken += [f"{other} (not sealed)" for other in _beside_names(name)
               if other not in raw["seal"]["beside"] and path.with_name(other).is_file()]
    return [part for part in broken if part.split(" (")[0] not in unchecked]


def _check_seal(name: str, path: Path, raw: dict, unchecked: tuple[str, ...]) -> None:
    """The seal of result file ``path`` (JSON ``raw``) matches its content and the files beside
    it (but those named in ``unchecked``)."""
    broken = _unsealed_parts(name, path, raw, unchecked)
    if broken:
        params, models = theory_params_path(name, path.parent), models_path(name, path.parent)
        stored = [params] + ([models] if models.name in raw["seal"]["beside"] or models.is_file() else [])
        if all(part.startswith(params.name) for part in broken):
            fix = f"recompute the references (`python -m fvlib experiment run {name} --refresh-theory`)"
        elif all(part.startswith(models.name) for part in broken):
            fix = f"write the kept models again from their runs (`python -m fvlib experiment keep-models {name}`)"
        else:
            fix = f"move them away and run `python -m fvlib experiment run {name}` again"
        raise ResultError(f"{path}: {', '.join(broken)} differs from the file's seal: it was edited outside fvlib; "
                          f"restore the stored files (`git checkout {path} {' '.join(map(str, stored))}`), or {fix}")


def read_result(name: str, directory=None, *, complete: bool = False, beside: bool = True,
                models: bool = True) -> ResultFile:
    """The stored result of experiment ``name`` (``results/NAME.json``) as typed records, checked:
    every field's type (:meth:`~fvlib.experiments.records.ResultFile.from_dict`), the experiment it
    names, its seal (:mod:`fvlib.experiments.seal`: no part edited outside fvlib, nor the
    files beside it), its runs of the definition.

    Raises :class:`~fvlib.experiments.records.ResultError` (a ``ValueError``) naming the file and
    the first bad field or part when the file is missing, corrupt, unsealed, edited or of
    another experiment, when it holds a run the experiment does not define (with another
    config), or with ``complete=True`` when runs are missing. ``beside=False``: the theory
    parameters beside the file are not compared with the seal (for a writer about to recompute
    them, :func:`~fvlib.experiments.runner.refresh_theory`); ``models=False``: nor are the kept
    models (:func:`models_path`; for :func:`~fvlib.experiments.kept_models.keep_models`, which
    writes them anew).
    """
    path = result_path(name, directory)
    raw = _read_json(name, path)
    result = ResultFile.from_dict(raw, str(path))
    _check_name(name, path, result)
    theory_file, models_file = _beside_names(name)
    _check_seal(name, path, raw, (() if beside else (theory_file,)) + (() if models else (models_file,)))
    _check_definition(name, path, result)
    defined = get_experiment(name).run_by_key()
    missing = [k for k in defined if k not in result.runs]
    if complete and (missing or result.theory is None):
        raise ResultError(f"{path} is incomplete: {len(missing)} of {len(defined)} runs missing"
                          + ("" if result.theory is not None else ", theory missing")
                          + f"; run `python -m fvlib experiment run {name}`")
    return result


def load_result(name: str, directory=None, *, complete: bool = False) -> dict:
    """The stored result of experiment ``name`` as the chapters read it: the JSON of
    :func:`read_result` (same checks, same errors), without its seal."""
    return read_result(name, directory, complete=complete).to_dict()


def write_result(path: Path, result: ResultFile) -> None:
    """Write ``result`` to ``path`` in one step, sealed (:func:`~fvlib.experiments.seal.seal_of`:
    its parts and the files beside it, if any: the theory parameters and the kept models). A
    failed write (a full disk) is a :class:`~fvlib.experiments.records.ResultError` naming the
    file, which stays as it was."""
    path = Path(path)
    data = result.to_dict()
    beside = [path.with_name(other) for other in _beside_names(result.experiment)]
    data["seal"] = seal_of(data, {other.name: other.read_bytes() for other in beside if other.is_file()})
    try:
        write_json_atomic(path, data, indent=1)
    except OSError as err:
        raise ResultError(f"cannot write {path} ({err.strerror or err}); the stored file is as it was") from None


def write_theory_params(path: Path, name: str, params: TheoryParams) -> None:
    """``params.tensors`` and what was searched as ``path`` (safetensors, written in one step; the
    result file written next seals its bytes)."""
    metadata = {"format": THEORY_PARAMS_FORMAT, "experiment": name, "optimiser_starts": str(params.starts),
                "selection_seed": str(params.selection_seed), "selection": json.dumps(params.selection)}
    try:
        write_atomic(path, tensors_to_bytes(params.tensors, metadata))
    except OSError as err:
        raise ResultError(f"cannot write {path} ({err.strerror or err}); the stored file is as it was") from None


def seal_result(name: str, directory=None) -> dict:
    """Check the result file of experiment ``name`` and seal it (``python -m fvlib experiment seal
    NAME``): the maintainer's way to seal a file written before seals (version 2) or changed on
    purpose. Checked first: every field's type, the experiment it names, every run of the
    definition (:func:`read_result`'s checks but the seal), the theory parameters and the kept
    models beside it (if any) readable and of this experiment; then the file is written by
    :func:`write_result` with today's rules (the seal covers the bytes of both). Returns what was
    checked: ``{"experiment", "file", "version", "runs", "theory_parameters", "kept_models",
    "rules_updated", "unsealed_parts"}`` (the last: the parts that differed from the old seal, now
    sealed)."""
    path = result_path(name, directory)
    with result_lock(path):
        raw = _read_json(name, path)
        result = ResultFile.from_dict(raw, str(path), unsealed=True)
        _check_definition(name, path, result)
        unsealed = ["all (version 2)"] if raw.get("version") == 2 else _unsealed_parts(name, path, raw)
        params = models = None
        if result.theory is not None:
            tensors, _ = load_theory_params(name, directory)
            params = f"{theory_params_path(name, directory)} ({len(tensors)} tensors)"
        if models_path(name, directory).is_file():
            models = f"{models_path(name, directory)} ({len(load_models_file(name, directory))} runs)"
        today = new_result(get_experiment(name)).rules
        updated = result.rules != today
        result.rules = today
        write_result(path, result)
    return {"experiment": name, "file": str(path), "version": raw.get("version"), "runs": len(result.runs),
            "theory_parameters": params, "kept_models": models, "rules_updated": updated,
            "unsealed_parts": unsealed}


def result_lock(path: Path) -> ExclusiveLock:
    """The lock beside result file ``path`` (``NAME.json.lock``): a second writer of the same
    result (another ``experiment run`` or ``refresh_theory``) is refused with
    :class:`~fvlib.experiments.records.ResultError`."""
    return ExclusiveLock(path.with_name(path.name + ".lock"), wait=False, error=ResultError,
                         held_here=f"{path} is already being written by this process",
                         busy="{path} is held by another `experiment run` (pid {pid}) writing this result")
