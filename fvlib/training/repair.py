"""The repair of a run directory without a manifest (written before manifests existed, or whose
manifest was deleted): every reader refuses such a directory (:mod:`fvlib.training.rundir`) until
:func:`repair_run` has checked what can be checked and written its manifest
(``python -m fvlib train ... --repair``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import torch

from .checkpoint import check_same_run, load_optimizer_tensors, load_weights, read_stored
from .config import TrainConfig, lr_at, model_from_config
from .loop import parameter_groups
from .rundir import (
    CHECKPOINT_FILES,
    CONFIG_FILE,
    HISTORY_FILE,
    MANIFEST_FILE,
    MODEL_FILE,
    STATE_FILE,
    RunDirError,
    RunLock,
    commit,
    has_checkpoint,
    read_files,
)

__all__ = ["repair_run"]


def repair_run(run_dir: str | os.PathLike, config: TrainConfig | None = None,
               report: Callable[[str], None] | None = None) -> list[str]:
    """Check a run directory without manifest and write its manifest; returns the checks passed,
    one line each (also given to ``report`` as each passes).

    The checks: ``config.json`` is an fvlib run config (and, given ``config``, the run it asks
    for); the weights, training state and history parse and are from one step; the weights are
    finite and of the config's shapes; Adam's moments have the parameters' shapes; the history
    is well formed and its learning rates are the config's schedule. A directory that has a
    manifest is only checked against it; one without checkpoint files needs no repair.

    Raises:
        RunDirError: (a ``ValueError``) a check failed (the message names the file); nothing
            was written.
    """
    run_dir, passed = Path(run_dir), []

    def ok(line: str) -> None:
        passed.append(line)
        if report is not None:
            report(line)

    with RunLock(run_dir):
        if (run_dir / MANIFEST_FILE).is_file():
            read_stored(run_dir, with_state=True)
            ok(f"{MANIFEST_FILE} present: every file matches it, nothing to repair")
            return passed
        if not has_checkpoint(run_dir):
            ok("no checkpoint files: nothing to repair")
            return passed
        _check_files(run_dir, config, ok)
        step = read_stored(run_dir, unverified=True).step
        commit(run_dir, step, {}, keep=(CONFIG_FILE, *CHECKPOINT_FILES))
        ok(f"wrote {MANIFEST_FILE} (checkpoint of step {step})")
    return passed


def _check_files(run_dir: Path, config: TrainConfig | None, ok: Callable[[str], None]) -> None:
    """The checks of :func:`repair_run`, each reported to ``ok`` as it passes."""
    read_files(run_dir, (CONFIG_FILE, *CHECKPOINT_FILES), unverified=True)  # every file is there
    stored = read_stored(run_dir, with_state=True, unverified=True)
    ok(f"{CONFIG_FILE}: an fvlib run config (model {stored.config.model}, {stored.config.steps} steps)")
    ok(f"{MODEL_FILE}, {STATE_FILE}, {HISTORY_FILE}: they parse, are finite and are all of step {stored.step}")
    if config is not None:
        check_same_run(run_dir, stored.config, config, stored.step)
        ok(f"{CONFIG_FILE}: the run the flags ask for")
    model = model_from_config(stored.model_config)
    load_weights(model, stored.weights, run_dir / MODEL_FILE)
    ok(f"{MODEL_FILE}: {len(stored.weights)} tensors of the config's shapes")
    optimizer = torch.optim.Adam(parameter_groups(model, stored.config), lr=stored.config.lr)
    load_optimizer_tensors(optimizer, stored.state[0], run_dir / STATE_FILE)
    ok(f"{STATE_FILE}: Adam's moments have the parameters' shapes")
    _check_schedule(run_dir, stored.history, stored.config)
    ok(f"{HISTORY_FILE}: {len(stored.history)} evaluations, learning rates on the config's schedule")


def _check_schedule(run_dir: Path, history: list[dict], config: TrainConfig) -> None:
    """Each evaluation's learning rate is the config's at its step (a history of another run
    with another schedule is refused)."""
    for entry in history:
        expected = lr_at(entry["step"], config)
        if not math.isclose(entry["lr"], expected, rel_tol=1e-9, abs_tol=1e-15):
            raise RunDirError(f"{run_dir / HISTORY_FILE}: the evaluation of step {entry['step']} has lr "
                              f"{entry['lr']}, the config's schedule {expected} (the history of another run?)")
