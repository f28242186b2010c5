"""Where the stored experiments live on disk, and reading and writing them.

``results/NAME.json`` (:func:`result_path`, in :func:`results_dir`) holds an experiment's runs
and references as a version-2 result file (:mod:`fvlib.experiments.records`);
``results/NAME.theory.safetensors`` (:func:`theory_params_path`) the optimised parameters of its
references (:class:`~fvlib.experiments.references.TheoryParams`). Both are written in one step
(:func:`~fvlib.files.write_atomic`), under :func:`result_lock` (one writer at a time).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from ..files import ExclusiveLock, write_atomic, write_json_atomic
from ..training.rundir import RunDirError, tensors_from_bytes, tensors_to_bytes
from .definitions import get_experiment, same_config
from .records import ResultError, ResultFile
from .references import THEORY_PARAMS_FORMAT, THEORY_PARAMS_SUFFIX, TheoryParams

__all__ = ["RESULTS_ENV", "load_result", "load_theory_params", "read_result", "result_lock", "result_path",
           "results_dir", "theory_params_path", "write_result", "write_theory_params"]

RESULTS_ENV = "FVLIB_RESULTS_DIR"


#: Where ``pip install`` puts a copy of the repository's ``results/*.json`` and their theory
#: parameters ``results/*.theory.safetensors`` (pyproject.toml, ``data-files``), relative to the
#: environment's prefix.
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


def load_theory_params(name: str, directory=None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(tensors, metadata)`` of experiment ``name``'s stored theory parameters
    (:func:`theory_params_path`): the tensors by key (:class:`~fvlib.experiments.references.TheoryParams`), the metadata
    with ``format``, ``experiment``, ``optimiser_starts``, ``selection_seed`` and ``selection`` (JSON:
    each searched reference's starts and their held-out losses). Raises :class:`~fvlib.experiments.records.ResultError`
    naming the file when it is missing, unreadable or of another experiment."""
    path = theory_params_path(name, directory)
    if not path.is_file():
        raise ResultError(f"no stored theory parameters {path}; recompute the references with "
                          f"fvlib.experiments.refresh_theory({name!r})")
    try:
        tensors, metadata = tensors_from_bytes(path.read_bytes(), path)
    except (OSError, RunDirError) as err:
        raise ResultError(f"unreadable theory parameters {path}: {err}") from None
    if metadata.get("format") != THEORY_PARAMS_FORMAT or metadata.get("experiment") != name:
        raise ResultError(f"{path} holds no theory parameters of experiment {name!r} (metadata: format "
                          f"{metadata.get('format')!r}, experiment {metadata.get('experiment')!r})")
    for field in ("optimiser_starts", "selection_seed"):
        if not str(metadata.get(field, "")).isdigit():
            raise ResultError(f"{path}: metadata {field} must be a count, got {metadata.get(field)!r}")
    return tensors, metadata


def read_result(name: str, directory=None, *, complete: bool = False) -> ResultFile:
    """The stored result of experiment ``name`` (``results/NAME.json``) as typed records, checked
    (a version-1 file is read as version 2, :mod:`fvlib.experiments.records`).

    Raises :class:`~fvlib.experiments.records.ResultError` (a ``ValueError``) when the file is missing or corrupt, when
    it holds a run the experiment does not define (with another config), or with ``complete=True``
    when runs are missing.
    """
    experiment = get_experiment(name)
    path = result_path(name, directory)
    if not path.is_file():
        raise ResultError(f"no stored result {path}; run `python -m fvlib experiment run {name}`")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultError(f"corrupt result file {path}: {err}") from None
    result = ResultFile.from_dict(raw, str(path))
    if result.experiment != name:
        raise ResultError(f"{path} is not a result file of experiment {name!r}")
    defined = experiment.run_by_key()
    for key, record in result.runs.items():
        if key not in defined or not same_config(record.config, defined[key].config, experiment.max_doublings):
            raise ResultError(f"{path} holds run {key!r} of another definition of {name!r}; "
                              f"move the file away to start over")
    missing = [k for k in defined if k not in result.runs]
    if complete and (missing or result.theory is None):
        raise ResultError(f"{path} is incomplete: {len(missing)} of {len(defined)} runs missing"
                          + ("" if result.theory is not None else ", theory missing")
                          + f"; run `python -m fvlib experiment run {name}`")
    return result


def load_result(name: str, directory=None, *, complete: bool = False) -> dict:
    """The stored result of experiment ``name`` as the chapters read it: the version-2 JSON of
    :func:`read_result` (same checks, same errors)."""
    return read_result(name, directory, complete=complete).to_dict()


def write_result(path: Path, result: ResultFile) -> None:
    """Write ``result`` (version 2) to ``path`` in one step."""
    write_json_atomic(path, result.to_dict(), indent=1)


def write_theory_params(path: Path, name: str, params: TheoryParams) -> None:
    """``params.tensors`` and what was searched as ``path`` (safetensors, written in one step)."""
    metadata = {"format": THEORY_PARAMS_FORMAT, "experiment": name, "optimiser_starts": str(params.starts),
                "selection_seed": str(params.selection_seed), "selection": json.dumps(params.selection)}
    write_atomic(path, tensors_to_bytes(params.tensors, metadata))


def result_lock(path: Path) -> ExclusiveLock:
    """The lock beside result file ``path`` (``NAME.json.lock``): a second writer of the same
    result (another ``experiment run`` or ``refresh_theory``) is refused with
    :class:`~fvlib.experiments.records.ResultError`."""
    return ExclusiveLock(path.with_name(path.name + ".lock"), wait=False, error=ResultError,
                         held_here=f"{path} is already being written by this process",
                         busy="{path} is held by another `experiment run` (pid {pid}) writing this result")
