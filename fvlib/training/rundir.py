"""Run directories on disk: checkpoints that are one atomic step, verified when read, and a lock.

A run directory (:func:`fvlib.training.loop.train`, :func:`fvlib.training.batched.train_many`) holds::

    config.json              TrainConfig and ModelConfig (written when the run starts)
    model.safetensors        model weights             (metadata: step)
    train_state.safetensors  Adam moments, RNG state   (metadata: step, JSON scalars)
    history.json             evaluation history        (and the step it belongs to)
    manifest.json            the checkpoint: its step, each file's size and SHA-256
    run.lock                 locked (``flock``) by the process that trains the run

**One checkpoint, one step.** :func:`commit` writes checkpoint ``s`` in three steps:

1. *stage*: each new file is written beside its place as ``NAME.next`` (flushed to disk);
2. *commit*: ``manifest.json`` is replaced atomically (:func:`~fvlib.training.rundir.write_atomic`);
   from here on ``s`` is the run's checkpoint;
3. *install*: each ``NAME.next`` is renamed to ``NAME``.

A kill or a full disk before step 2 leaves the previous checkpoint and its manifest as they
were (a failed write removes what it staged; a kill leaves staged files that nothing reads).
After step 2 a file not yet renamed is read from ``NAME.next``, and the next writer finishes
the renames (:func:`recover`) before it writes anything. Reading (:func:`read_files`) checks
every file against the manifest and names the first that differs, is missing or is cut short.

**Legacy runs.** Directories written before the manifest existed have none: their files are
read as they are (the caller checks what it can: the files agree on the step, the weights are
finite and fit the config) and the first checkpoint written into them adds a manifest.

**Lock.** :class:`RunLock` takes an exclusive lock (:class:`~fvlib.files.ExclusiveLock`, an
OS-level ``flock`` that a dying process releases) on ``run.lock`` while a run is trained. A
second process that opens the same run waits for the first to finish (it says so
on stderr, once), then resumes or reloads what the first left: training is deterministic, so
the numbers are the same. The same process opening a run twice is refused (it would wait on
itself). Readers (:func:`fvlib.training.checkpoint.load_run`) take no lock: the manifest tells them which
files belong together. On a file system without ``flock`` (some network and FUSE mounts) runs
are not locked.

Nothing is unpickled: tensors go through safetensors, the rest through JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import files as disk

__all__ = [
    "CONFIG_FILE",
    "MODEL_FILE",
    "STATE_FILE",
    "HISTORY_FILE",
    "MANIFEST_FILE",
    "LOCK_FILE",
    "RunDirError",
    "CheckpointWriteError",
    "check_writable_dir",
    "RunLock",
    "write_atomic",
    "has_checkpoint",
    "start_over",
    "recover",
    "commit",
    "Checkpoint",
    "read_files",
    "tensors_to_bytes",
    "tensors_from_bytes",
]

CONFIG_FILE = "config.json"
MODEL_FILE = "model.safetensors"
STATE_FILE = "train_state.safetensors"
HISTORY_FILE = "history.json"
MANIFEST_FILE = "manifest.json"
LOCK_FILE = "run.lock"
#: The suffix of a staged file (step 1 of :func:`commit`).
STAGED = ".next"
#: The files a checkpoint replaces (``config.json`` is written once, when the run starts).
CHECKPOINT_FILES = (STATE_FILE, MODEL_FILE, HISTORY_FILE)


class RunDirError(ValueError):
    """A run directory is missing, incomplete, corrupt, not writable or belongs to another config."""


class CheckpointWriteError(RunDirError):
    """A checkpoint could not be written (full disk, read-only file system, ...); the run
    directory still holds its previous checkpoint."""


# ----------------------------------------------------------------------------------------
# Writing files
# ----------------------------------------------------------------------------------------
def _sync_dir(path: Path) -> None:
    """Flush a directory's entries (the renames in it) to disk, where the platform allows."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path, data: bytes) -> None:
    """Replace ``path`` by ``data`` in one step; a failed write leaves ``path`` as it was and
    raises :class:`CheckpointWriteError` naming it."""
    path = Path(path)
    try:
        disk.write_atomic(path, data)
    except OSError as err:
        raise CheckpointWriteError(f"cannot write {path} ({err.strerror or err})") from None


def check_writable_dir(path) -> Path:
    """Create directory ``path`` (and its parents) if needed and check that files can be
    created in it; returns it as a ``pathlib.Path``.

    Raises:
        RunDirError: ``path`` is a file, lies under a file, or is not writable (permissions,
            read-only file system); the message names the path and the reason.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{path} is a file, not a directory")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise RunDirError(f"{path} lies under {parent}, which is a file")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".fvlib-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise RunDirError(f"{path} is not writable ({err.strerror or err})") from None
    return path


# ----------------------------------------------------------------------------------------
# The lock
# ----------------------------------------------------------------------------------------
class RunLock(disk.ExclusiveLock):
    """An exclusive lock on a run directory, held while the run is trained (``with RunLock(dir):``):
    :class:`~fvlib.files.ExclusiveLock` on ``run.lock``, waiting while another process holds it.

    :meth:`acquire` creates the directory if needed (so it also checks it is writable, before
    any training) and waits while another process holds the lock, saying so once on stderr;
    this process locking it twice raises :class:`RunDirError`.
    """

    def __init__(self, run_dir):
        self.run_dir = Path(run_dir)
        super().__init__(self.run_dir / LOCK_FILE, wait=True, error=RunDirError,
                         held_here=f"{self.run_dir} is already being trained in this process",
                         waiting=f"fvlib: waiting for {self.run_dir}: another process (pid {{pid}}) is training it")

    def acquire(self) -> RunLock:
        """Take the lock, waiting while another process holds it; returns ``self``.

        Raises:
            RunDirError: the directory is not writable, or this process holds its lock already.
        """
        check_writable_dir(self.run_dir)
        super().acquire()
        return self


# ----------------------------------------------------------------------------------------
# The manifest
# ----------------------------------------------------------------------------------------
def _digest(data: bytes) -> dict:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _read_manifest(run_dir: Path) -> tuple[dict | None, bytes | None]:
    """The manifest of ``run_dir`` and its raw bytes; ``(None, None)`` for a legacy run."""
    path = run_dir / MANIFEST_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None
    try:
        manifest = json.loads(raw)
        ok = (isinstance(manifest, dict) and isinstance(manifest.get("step"), int)
              and isinstance(manifest.get("files"), dict)
              and all(isinstance(v, dict) and set(v) >= {"bytes", "sha256"} for v in manifest["files"].values()))
    except (json.JSONDecodeError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise RunDirError(f"corrupt checkpoint manifest {path}")
    return manifest, raw


def has_checkpoint(run_dir) -> bool:
    """``True`` when ``run_dir`` holds a checkpoint (a manifest, or a legacy run's weights)."""
    run_dir = Path(run_dir)
    return (run_dir / MANIFEST_FILE).is_file() or (run_dir / MODEL_FILE).is_file()


def _remove_staged(run_dir: Path) -> None:
    for name in CHECKPOINT_FILES + (CONFIG_FILE,):
        (run_dir / (name + STAGED)).unlink(missing_ok=True)
    (run_dir / (MANIFEST_FILE + ".tmp")).unlink(missing_ok=True)


def start_over(run_dir) -> None:
    """Remove the checkpoint of ``run_dir`` (a run restarted from step 0): the manifest first,
    then the weights, so that a kill on the way leaves either the old checkpoint or none."""
    run_dir = Path(run_dir)
    (run_dir / MANIFEST_FILE).unlink(missing_ok=True)
    for name in (MODEL_FILE, STATE_FILE, HISTORY_FILE):
        (run_dir / name).unlink(missing_ok=True)
    _remove_staged(run_dir)


def recover(run_dir) -> None:
    """Finish the renames of a checkpoint whose writer stopped after its commit (step 3 of
    :func:`commit`) and remove staged files that no manifest refers to. Call it holding the
    run's lock, before writing into the run."""
    run_dir = Path(run_dir)
    manifest, _ = _read_manifest(run_dir)
    for name, expected in (manifest or {}).get("files", {}).items():
        staged = run_dir / (name + STAGED)
        if staged.is_file() and _digest(staged.read_bytes()) == _pick(expected):
            disk.replace_file(staged, run_dir / name)
    _remove_staged(run_dir)


def _pick(entry: dict) -> dict:
    return {"bytes": entry["bytes"], "sha256": entry["sha256"]}


def commit(run_dir, step: int, files: Mapping[str, bytes], keep: Iterable[str] = (CONFIG_FILE,)) -> None:
    """Write the checkpoint of ``step``: ``files`` (name -> bytes) and the manifest that lists
    them with the files ``keep`` already in ``run_dir``, as one atomic step (module docs).

    Raises:
        CheckpointWriteError: a write failed (e.g. the disk is full); what was staged is
            removed and the previous checkpoint is intact. The message names the file.
    """
    run_dir = Path(run_dir)
    entries = {name: _digest((run_dir / name).read_bytes()) for name in keep}
    target = None
    try:
        for name, data in files.items():
            target = run_dir / (name + STAGED)
            disk.write_synced(target, data)
            entries[name] = _digest(data)
        manifest = {"format": "fvlib-checkpoint", "version": 1, "step": step, "files": entries}
        target = run_dir / MANIFEST_FILE
        disk.write_atomic(target, json.dumps(manifest, indent=1) + "\n")
    except OSError as err:
        _remove_staged(run_dir)
        previous = _read_manifest(run_dir)[0]
        kept = f"step {previous['step']}" if previous else "what it held before"
        raise CheckpointWriteError(f"cannot write the checkpoint of step {step} to {target} "
                                   f"({err.strerror or err}); the run keeps {kept}") from None
    for name in files:
        disk.replace_file(run_dir / (name + STAGED), run_dir / name)
    _sync_dir(run_dir)


# ----------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """Files read from a run directory.

    Attributes:
        data: ``{name: bytes}`` of the files asked for.
        step: the manifest's step, or ``None`` for a legacy run (no manifest).
    """

    data: dict[str, bytes]
    step: int | None


def _read_verified(run_dir: Path, name: str, expected: dict | None) -> bytes:
    """The bytes of ``name``; with a manifest entry ``expected``, those of ``NAME`` or (a commit
    whose renames were cut short) ``NAME.next`` that match it."""
    path = run_dir / name
    if expected is None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise RunDirError(f"missing file {path}") from None
    found = None
    for candidate in (path, run_dir / (name + STAGED)):
        try:
            data = candidate.read_bytes()
        except FileNotFoundError:
            continue
        digest = _digest(data)
        if digest == _pick(expected):
            return data
        found = found or (candidate, digest)
    if found is None:
        raise RunDirError(f"missing file {path} (listed in {run_dir / MANIFEST_FILE})")
    candidate, digest = found
    what = (f"{digest['bytes']} bytes where the manifest says {expected['bytes']}"
            if digest["bytes"] != expected["bytes"] else "its SHA-256 differs from the manifest's")
    raise RunDirError(f"{candidate} is corrupt or was edited: {what}")


def read_files(run_dir, names: Iterable[str]) -> Checkpoint:
    """Read the files ``names`` of ``run_dir``, verified against its manifest (module docs).

    Raises:
        RunDirError: a file is missing, corrupt or edited (the message names it), or the
            manifest itself is corrupt.
    """
    run_dir, names = Path(run_dir), list(names)
    for attempt in range(3):  # a writer may commit while we read: read again from its manifest
        manifest, raw = _read_manifest(run_dir)
        try:
            if manifest is not None:
                for name in names:
                    if name not in manifest["files"]:
                        raise RunDirError(f"{run_dir / MANIFEST_FILE} lists no {name}")
            data = {name: _read_verified(run_dir, name, manifest["files"][name] if manifest else None)
                    for name in names}
            return Checkpoint(data, manifest["step"] if manifest else None)
        except RunDirError:
            if attempt == 2 or _read_manifest(run_dir)[1] == raw:
                raise
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------------------
# Tensors as bytes
# ----------------------------------------------------------------------------------------
def tensors_to_bytes(tensors: Mapping, metadata: Mapping[str, str]) -> bytes:
    """A safetensors file's bytes: ``tensors`` (moved to the CPU, made contiguous) and ``metadata``."""
    from safetensors.torch import save  # torch is imported only when tensors are written

    return save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata=dict(metadata))


def tensors_from_bytes(data: bytes, path) -> tuple[dict, dict]:
    """``(tensors, metadata)`` of a safetensors file's bytes read from ``path`` (named in errors)."""
    from safetensors.torch import load

    try:
        # the format: an 8-byte little-endian header length, then the JSON header
        header = json.loads(data[8: 8 + int.from_bytes(data[:8], "little")])
        metadata = header.get("__metadata__") or {}
        return load(data), metadata
    except Exception as err:  # safetensors raises several error types for corrupt files
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise RunDirError(f"corrupt safetensors file {path}: {reason}") from None
