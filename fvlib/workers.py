"""Worker processes that end when the process that started them ends, however it ends.

:func:`worker_pool` is the one process pool of fvlib: a
``ProcessPoolExecutor`` (``spawn`` start method: a forked copy of a
process whose torch threads hold locks can hang), behind :meth:`WorkerPool.imap_unordered`, of
:func:`fvlib.experiments.inbuild.train_parallel` (``python -m fvlib warm``) and of
:func:`~fvlib.experiments.runner.run` (``python -m fvlib experiment run --jobs``):

* each worker asks the kernel to kill it when its parent dies (Linux: ``prctl(PR_SET_PDEATHSIG)``
  through ``ctypes``); elsewhere a thread of the worker checks ``os.getppid()`` every
  second. So a parent killed by ``SIGKILL`` leaves no orphan training on;
* while the pool is open, ``SIGTERM`` to the parent (in its main thread) raises ``SystemExit``
  there, which terminates the workers on the way out (exit status 143);
* Ctrl-C reaches the whole process group, workers included.

A worker killed in the middle of a checkpoint leaves its run at the previous checkpoint
(:mod:`fvlib.training.rundir`).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed

__all__ = ["WorkerPool", "end_with_parent", "worker_pool"]

#: ``prctl`` option: the signal the calling process gets when its parent thread dies (Linux).
PR_SET_PDEATHSIG = 1
#: How often (seconds) a worker without ``PR_SET_PDEATHSIG`` checks that its parent lives.
POLL_SECONDS = 1.0


def _set_parent_death_signal() -> bool:
    """Ask the kernel to ``SIGKILL`` this process when its parent dies; ``False`` where the
    platform has no such request (anything but Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_SECONDS)
    os._exit(1)


def end_with_parent(parent: int) -> None:
    """Make the calling process end when process ``parent`` (its parent) ends; the pool's
    worker initialiser."""
    if not _set_parent_death_signal():
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the parent died before we asked
        os._exit(1)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


class WorkerPool:
    """The workers of :func:`worker_pool`: a ``ProcessPoolExecutor`` whose workers end with their parent."""

    def __init__(self, executor: ProcessPoolExecutor):
        self.executor = executor

    def imap_unordered(self, function: Callable, items: Iterable) -> Iterator:
        """``function(item)`` of every item (a picklable module-level function), computed by the
        workers, yielded as each finishes; a worker's exception is raised here."""
        futures = [self.executor.submit(function, item) for item in items]
        for future in as_completed(futures):
            yield future.result()

    def terminate(self) -> None:
        """End the workers now (what is running is lost) and the executor with them."""
        for process in list((self.executor._processes or {}).values()):  # the executor names no public way
            process.terminate()
        self.executor.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def worker_pool(processes: int) -> Iterator[WorkerPool]:
    """A pool of ``processes`` ``spawn`` workers that end with this process (module docs);
    leaving the ``with`` block waits for them, leaving it by an exception (``SIGTERM``, Ctrl-C,
    a worker's error) terminates them."""
    context = multiprocessing.get_context("spawn")
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main else None
    executor = ProcessPoolExecutor(processes, mp_context=context, initializer=end_with_parent,
                                   initargs=(os.getpid(),))
    pool = WorkerPool(executor)
    try:
        yield pool
    except BaseException:
        pool.terminate()
        raise
    else:
        executor.shutdown(wait=True)
    finally:
        if main and previous is not None:  # None: a handler set outside Python, left alone
            signal.signal(signal.SIGTERM, previous)
