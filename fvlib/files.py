"""Files written in one step, and an exclusive lock: the one home of both for fvlib.

* :func:`write_atomic` (and :func:`write_json_atomic`) replace a file in one step: the bytes go
  to ``NAME.tmp`` beside it, are flushed to disk (:func:`write_synced`), then renamed over
  ``NAME`` (:func:`replace_file`). A kill or a full disk leaves the previous file as it was.
  Run directories (:mod:`fvlib.training.rundir`), the stored experiments' result files
  (:mod:`fvlib.experiments`) and ``python -m fvlib reproduce`` write through them.
* :class:`ExclusiveLock` is an exclusive lock on a lock file, built on the ``filelock`` package:
  an OS-level ``flock``, which the kernel releases when the holding process dies (a killed writer
  leaves nothing to clean up). A second process either waits for the holder (saying so once on
  stderr) or is refused with an error naming the file and the holder's pid; the same process
  locking a path twice is refused (it would wait on itself). On a file system without
  ``flock`` (some network and FUSE mounts) nothing is locked.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import filelock

__all__ = ["NO_FLOCK", "ExclusiveLock", "replace_file", "write_atomic", "write_json_atomic", "write_synced"]

#: ``flock`` errors of file systems that do not support it (the path is then not locked).
NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and flush it to disk (the one place fvlib's files are written)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace_file(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` atomically (the one place fvlib's files are renamed into place)."""
    os.replace(src, dst)


def write_atomic(path, data: bytes | str) -> None:
    """Replace ``path`` by ``data`` (bytes, or text written as UTF-8) in one step: a temporary
    file beside it, flushed, then renamed over it; its folder is created if needed. A failed
    write removes the temporary file, leaves ``path`` as it was and raises the ``OSError``."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        write_synced(tmp, data)
        replace_file(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path, data, indent: int = 1) -> None:
    """``data`` as JSON (``indent``, a trailing newline) written to ``path`` by :func:`write_atomic`."""
    write_atomic(path, json.dumps(data, indent=indent) + "\n")


_HELD: set[str] = set()  # lock files this process holds


def _write_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)


class ExclusiveLock:
    """An exclusive lock on the file ``path`` (``with ExclusiveLock(path):``), created if needed.

    ``wait``: a second process waits for the holder, printing ``waiting`` once on stderr;
    otherwise it is refused with ``error(busy)``. ``held_here``, ``waiting`` and ``busy`` are the
    messages (``{path}`` and ``{pid}``, the holder's pid as its lock file says, are filled in);
    ``error`` is the class raised (a ``ValueError``). The holder's pid is written into the lock
    file, which stays when the lock is released (removing it would let two processes lock two
    files).
    """

    def __init__(self, path, *, wait: bool = True, error: type[ValueError] = ValueError,
                 held_here: str = "{path} is already locked by this process",
                 waiting: str = "fvlib: waiting for {path}: another process (pid {pid}) holds it",
                 busy: str = "{path} is locked by another process (pid {pid})"):
        self.path = Path(path)
        self.wait, self.error = wait, error
        self.messages = {"held_here": held_here, "waiting": waiting, "busy": busy}
        self._key = str(self.path.resolve())
        self._lock: filelock.BaseFileLock | None = None
        self._held = False

    def _say(self, which: str, pid: str = "?") -> str:
        return self.messages[which].format(path=self.path, pid=pid)

    def _holder(self) -> str:
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def acquire(self) -> ExclusiveLock:
        """Take the lock (waiting or refused, as ``wait`` says); returns ``self``."""
        if self._key in _HELD:
            raise self.error(self._say("held_here"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(self.path, fallback_to_soft=False, on_acquired=_write_pid)
        try:
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                holder = self._holder()
                if not self.wait:
                    raise self.error(self._say("busy", holder)) from None
                print(self._say("waiting", holder), file=sys.stderr, flush=True)
                lock.acquire()
        except OSError as err:
            if err.errno not in NO_FLOCK:
                raise self.error(f"cannot lock {self.path} ({err.strerror or err})") from None
            lock = None  # a file system without flock: not locked
        self._lock, self._held = lock, True
        _HELD.add(self._key)
        return self

    def release(self) -> None:
        """Release the lock (the lock file stays)."""
        if self._held:
            if self._lock is not None:
                self._lock.release()
            self._lock, self._held = None, False
            _HELD.discard(self._key)

    def __enter__(self) -> ExclusiveLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
