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

**What a run directory is.** ``config.json`` is fvlib's (format ``fvlib-run``, or a config
written before the marker with its ``train`` and ``model`` sections) and every other file is one a
run writes (the files above, their staged ``NAME.next`` and temporary ``NAME.tmp``).
:func:`check_run_dir` refuses any other directory that holds files, so that training never
overwrites a user's own files; an empty or new directory is a fresh run.

**Runs without a manifest.** Directories written before the manifest existed (or whose manifest
was deleted) cannot be checked file by file: every reader refuses them
(:class:`UnverifiedRunError`) until :func:`fvlib.training.repair.repair_run` (``train ...
--repair``) has checked what can be checked and written the manifest.

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

import errno
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
    "UnverifiedRunError",
    "RUN_FORMAT",
    "CHECKPOINT_FORMAT",
    "FORMAT_VERSION",
    "check_format",
    "is_run_config",
    "check_run_dir",
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
#: The formats of ``config.json`` and ``manifest.json`` and the one version this code reads.
RUN_FORMAT, CHECKPOINT_FORMAT, FORMAT_VERSION = "fvlib-run", "fvlib-checkpoint", 1
#: Every name a run writes in its directory (besides the probe of :func:`check_writable_dir`).
RUN_NAMES = frozenset(
    [CONFIG_FILE, MODEL_FILE, STATE_FILE, HISTORY_FILE, MANIFEST_FILE, LOCK_FILE]
    + [name + suffix for name in CHECKPOINT_FILES + (CONFIG_FILE, MANIFEST_FILE) for suffix in (STAGED, ".tmp")]
)
WRITE_PROBE = ".fvlib-write-check-"


class RunDirError(ValueError):
    """A run directory is missing, incomplete, corrupt, not writable or belongs to another config."""


class CheckpointWriteError(RunDirError):
    """A checkpoint could not be written (full disk, read-only file system, ...); the run
    directory still holds its previous checkpoint."""


class UnverifiedRunError(RunDirError):
    """A run directory holds checkpoint files but no manifest to check them against; ``train
    ... --repair`` (:func:`fvlib.training.repair.repair_run`) checks them and writes one."""


def check_format(payload: dict, expected: str, path: Path) -> None:
    """Refuse a ``config.json`` or ``manifest.json`` of another format or of a version this code
    does not read (a file written by a later fvlib), naming the file and the version."""
    form, version = payload.get("format", expected), payload.get("version", FORMAT_VERSION)
    if form != expected or version != FORMAT_VERSION:
        raise RunDirError(f"{path} is format {form!r} version {version!r}; this fvlib reads {expected!r} "
                          f"version {FORMAT_VERSION}")


def is_run_config(payload) -> bool:
    """Whether a parsed ``config.json`` is fvlib's: format ``fvlib-run`` (any version), or,
    written before the marker, a mapping with exactly its ``train`` and ``model`` sections."""
    if not isinstance(payload, dict):
        return False
    if "format" in payload:
        return payload["format"] == RUN_FORMAT
    return set(payload) == {"train", "model"} and all(isinstance(payload[k], dict) for k in ("train", "model"))


def _foreign_file(run_dir: Path) -> str | None:
    """The first entry of ``run_dir`` (sorted) that no run writes, or a ``config.json`` that is
    not fvlib's, and why; ``None`` when the directory is (or may become) a run directory."""
    for entry in sorted(run_dir.iterdir()):
        if entry.name not in RUN_NAMES and not entry.name.startswith(WRITE_PROBE):
            return f"{entry.name}, a file no run writes"
        if entry.name in RUN_NAMES and not entry.is_file():
            return f"{entry.name}, which is not a file"
    config = run_dir / CONFIG_FILE
    written = [name for name in (MANIFEST_FILE,) + CHECKPOINT_FILES if (run_dir / name).exists()]
    if written and not config.exists():
        return f"{written[0]} but no {CONFIG_FILE} (a run writes its config first)"
    if config.is_file():
        try:
            payload = json.loads(config.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError):
            payload = None
        if not is_run_config(payload):
            return f"{CONFIG_FILE}, which is not an fvlib run config"
    return None


def check_run_dir(path) -> Path:
    """Check that ``path`` can be trained into without touching anything that is not a run's:
    a new or empty directory, or an fvlib run directory (module docs); returns it as a
    ``pathlib.Path``.

    Raises:
        RunDirError: an empty path, a name too long for the file system, a symlink loop, a
            file, or a directory holding a file no run writes (named, with the directory).
    """
    path = _checked_path(path)
    if path.is_dir():
        foreign = _foreign_file(path)
        if foreign is not None:
            raise RunDirError(f"{path} is not an fvlib run directory: it holds {foreign}; nothing was "
                              f"touched (train into a new or empty directory)")
    return path


def _checked_path(path) -> Path:
    """``path`` as a ``Path``, refusing an empty one, one the file system cannot name and a
    symlink loop, each in words (no errno text)."""
    if str(path) == "":
        raise RunDirError("an empty path names no directory (it would be the current one)")
    path = Path(path)
    try:
        os.stat(path)
    except FileNotFoundError:
        if path.is_symlink():
            raise RunDirError(f"{path} is a symbolic link to {os.readlink(path)}, which does not exist") from None
    except NotADirectoryError:
        pass
    except OSError as err:
        if err.errno == errno.ENAMETOOLONG:
            longest = max(len(part) for part in path.parts)
            raise RunDirError(f"{_short(path)} is too long a path for the file system (a name of "
                              f"{longest} characters, {len(str(path))} in all)") from None
        if err.errno == errno.ELOOP:
            raise RunDirError(f"{path} is a loop of symbolic links") from None
        raise RunDirError(f"{path} cannot be used ({err.strerror or err})") from None
    return path


def _short(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 60 else text[:40] + "..." + text[-12:]


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
    path = _checked_path(path)
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
        if err.errno == errno.ENAMETOOLONG:
            raise RunDirError(f"{_short(path)} is too long a path for the file system") from None
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
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RunDirError(f"corrupt checkpoint manifest {path}: not JSON") from None
    if not isinstance(manifest, dict):
        raise RunDirError(f"corrupt checkpoint manifest {path}: not a JSON object")
    check_format(manifest, CHECKPOINT_FORMAT, path)
    bad = _bad_manifest_field(manifest)
    if bad is not None:
        raise RunDirError(f"corrupt checkpoint manifest {path}: {bad}")
    return manifest, raw


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _bad_manifest_field(manifest: dict) -> str | None:
    """What is wrong with a manifest's fields (``step``, ``files.NAME.bytes``, ...), or ``None``."""
    if not _is_count(manifest.get("step")):
        return f"'step' must be a step number, got {manifest.get('step')!r}"
    if not isinstance(manifest.get("files"), dict):
        return f"'files' must be a mapping, got {manifest.get('files')!r}"
    for name, entry in manifest["files"].items():
        if not isinstance(entry, dict):
            return f"'files.{name}' must be a mapping, got {entry!r}"
        if not _is_count(entry.get("bytes")):
            return f"'files.{name}.bytes' must be an integer, got {entry.get('bytes')!r}"
        digest = entry.get("sha256")
        if not (isinstance(digest, str) and len(digest) == 64 and set(digest) <= set("0123456789abcdef")):
            return f"'files.{name}.sha256' must be 64 hex digits, got {digest!r}"
    return None


def has_checkpoint(run_dir) -> bool:
    """``True`` when ``run_dir`` holds a checkpoint: a manifest, or checkpoint files without one
    (which readers refuse: :class:`UnverifiedRunError`)."""
    run_dir = Path(run_dir)
    return any((run_dir / name).is_file() for name in (MANIFEST_FILE,) + CHECKPOINT_FILES)


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
        try:
            disk.replace_file(run_dir / (name + STAGED), run_dir / name)
        except OSError as err:
            raise CheckpointWriteError(
                f"cannot replace {run_dir / name} ({err.strerror or err}); the run keeps step {step}: its "
                f"manifest is written and {name + STAGED} holds the file until the rename succeeds") from None
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
    whose renames were cut short) ``NAME.next`` that match it; without one (``None``: the repair
    of a run without manifest) the file as it is."""
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
    what = (f"the file has {digest['bytes']} bytes, the manifest says {expected['bytes']}"
            if digest["bytes"] != expected["bytes"] else "the file's SHA-256 is not the one the manifest lists")
    raise RunDirError(f"{candidate.name} and {MANIFEST_FILE} in {run_dir} disagree: {what} (one of them is "
                      f"corrupt or was edited)")


def read_files(run_dir, names: Iterable[str], unverified: bool = False) -> Checkpoint:
    """Read the files ``names`` of ``run_dir``, verified against its manifest (module docs).
    ``unverified``: read a run without a manifest as it is (for its repair only).

    Raises:
        RunDirError: a file is missing, corrupt or edited (the message names it), or the
            manifest itself is corrupt; :class:`UnverifiedRunError` for a run without manifest.
    """
    run_dir, names = Path(run_dir), list(names)
    for attempt in range(3):  # a writer may commit while we read: read again from its manifest
        manifest, raw = _read_manifest(run_dir)
        if manifest is None and not unverified:
            raise unverified_run(run_dir)
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


def unverified_run(run_dir: Path) -> UnverifiedRunError:
    """The refusal of a run directory without a manifest (module docs)."""
    held = [name for name in CHECKPOINT_FILES if (run_dir / name).is_file()]
    return UnverifiedRunError(
        f"{run_dir} has no {MANIFEST_FILE}, so its files ({', '.join(held) or 'none'}) cannot be checked; "
        f"check them and write one with --repair (train with the run's flags and --repair, or "
        f"fvlib.training.repair_run)")


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
