"""What memory there is for the process, in one place: the smallest of the machine's available
RAM, what the process's address-space limit leaves (``RLIMIT_AS``, ``ulimit -v``) and what its
cgroup's memory limit leaves; a CUDA device's free memory. The library refuses work that cannot
fit (:func:`check_fits`, a ``ValueError`` naming the argument) and the command line refuses it
before any work (``fvlib.cli.limits``).

Each source is read where the system says it (Linux's ``/proc`` and ``/sys/fs/cgroup``, POSIX
``sysconf`` and ``resource``); a source that says nothing counts as ``inf``.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

__all__ = [
    "UNCHECKED_BYTES",
    "address_space_left",
    "available_memory",
    "cgroup_memory_left",
    "check_fits",
    "format_bytes",
    "physical_memory_available",
]

_CGROUP = Path("/sys/fs/cgroup")


def _meminfo_kib(field: str, text: str) -> float:
    """The value of ``field`` (in KiB) in the text of ``/proc/meminfo`` or ``/proc/self/status``."""
    found = re.search(rf"^{field}:\s+(\d+)\s*kB", text, re.MULTILINE)
    return float(found.group(1)) * 1024 if found else math.inf


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def physical_memory_available() -> float:
    """The machine's RAM that a process can still take, in bytes: Linux's ``MemAvailable``
    (free memory plus the caches it can reclaim), else all physical memory (``sysconf``), else
    ``inf``."""
    text = _read(Path("/proc/meminfo"))
    if text is not None and math.isfinite(_meminfo_kib("MemAvailable", text)):
        return _meminfo_kib("MemAvailable", text)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):  # no sysconf (Windows)
        return math.inf


def address_space_left() -> float:
    """What the soft ``RLIMIT_AS`` (``ulimit -v``) leaves for new mappings, in bytes: the limit
    minus the address space already mapped (``VmSize`` of ``/proc/self/status``; without it the
    whole limit); ``inf`` without a limit."""
    try:
        import resource
    except ImportError:  # not POSIX
        return math.inf
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return math.inf
    status = _read(Path("/proc/self/status"))
    mapped = _meminfo_kib("VmSize", status) if status is not None else math.inf
    return max(0.0, soft - (mapped if math.isfinite(mapped) else 0.0))


def cgroup_memory_left(root: Path = _CGROUP) -> float:
    """What the process's cgroup still allows, in bytes: v2 ``memory.max - memory.current``, v1
    ``memory.limit_in_bytes - memory.usage_in_bytes``; ``inf`` without a limit (``max``, or no
    cgroup files)."""
    for limit_name, usage_name in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
                                   ("memory.limit_in_bytes", "memory.usage_in_bytes")):
        limit = _read(root / limit_name)
        if limit is None:
            continue
        limit = limit.strip()
        if not limit.isdigit() or int(limit) >= 2**62:  # "max", or v1's "no limit" (a page-rounded 2^63)
            return math.inf
        usage = (_read(root / usage_name) or "0").strip()
        return max(0.0, float(int(limit) - (int(usage) if usage.isdigit() else 0)))
    return math.inf


def available_memory(device=None) -> float:
    """The memory there is for new work, in bytes: a CUDA ``torch.device``'s free memory, else the
    smallest of :func:`physical_memory_available`, :func:`address_space_left` and
    :func:`cgroup_memory_left` (``inf`` where nothing says)."""
    if device is not None and getattr(device, "type", None) == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return float(free)
    return min(physical_memory_available(), address_space_left(), cgroup_memory_left())


def format_bytes(nbytes: float) -> str:
    """``nbytes`` for a message: ``2.4 TB``, ``19.3 GB``, ``33.6 MB``."""
    if nbytes >= 1e12:
        return f"{nbytes / 1e12:.3g} TB"
    return f"{nbytes / 1e9:.3g} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.3g} MB"


#: :func:`check_fits` passes a request under this many bytes without reading the limits (reading
#: them takes tens of microseconds, more than allocating so little).
UNCHECKED_BYTES = 2**24


def check_fits(name: str, value, nbytes: float, device=None):
    """``value`` if the ``nbytes`` it needs fit in :func:`available_memory` (or are under
    :data:`UNCHECKED_BYTES`), else ``ValueError`` naming the argument ``name``, e.g. ``batch =
    1000000000000 would need about 24 TB of memory, more than the 22 GB there is``."""
    if nbytes < UNCHECKED_BYTES:
        return value
    there_is = available_memory(device)
    if nbytes > there_is:
        raise ValueError(f"{name} = {value!r} would need about {format_bytes(nbytes)} of memory, more than the "
                         f"{format_bytes(there_is)} there is")
    return value
