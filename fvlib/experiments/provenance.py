"""Where and how the runs and references of a stored experiment were computed.

:func:`provenance` describes the process computing now (commit, versions, device, threads, wall
and CPU seconds, date); every stored run carries the provenance of the work item that trained it
(and of the items that trained its earlier attempts, :func:`provenances_of`);
:func:`provenance_summary` and :func:`provenance_line` tell a chapter what a result was trained
with.
"""

from __future__ import annotations

import datetime
import platform
import subprocess
from pathlib import Path

import torch

from ..training import resolve_device

__all__ = ["cpu_name", "git_commit", "items_of", "provenance", "provenance_line", "provenance_summary",
           "provenances_of"]

def git_commit() -> dict:
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "fvlib"], cwd=root, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "fvlib_modified": None}
    return {"commit": commit or None, "fvlib_modified": bool(dirty) if commit else None}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _fvlib_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fvlib")
    except PackageNotFoundError:
        return "unknown"


def provenance(device: str, wall: float, cpu: float, code: dict | None = None) -> dict:
    """Where and how a work item was trained (stored with each of its runs); ``code``: the
    commit read when the item started (default: now)."""
    dev = resolve_device(device)
    return {"fvlib": _fvlib_version(), **(code if code is not None else git_commit()), "torch": torch.__version__,
            "python": platform.python_version(), "device": str(dev),
            "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_name(),
            "threads": torch.get_num_threads(), "wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def provenances_of(record: dict) -> list[dict]:
    """The provenances of the work items that trained a stored run: those of its earlier
    attempts when a later definition doubled it again, then its last one."""
    return [*record["provenance"].get("earlier", []), record["provenance"]]


def items_of(record: dict) -> list:
    """The work items that trained a stored run (:func:`provenances_of`)."""
    return [p.get("item") for p in provenances_of(record)]


def provenance_summary(data: dict) -> dict:
    """What a result's runs were trained with: the commits, machines, versions and dates of its
    work items, and their summed wall and CPU seconds."""
    items = {}
    for record in data["runs"].values():   # with the items that trained earlier attempts
        for p in provenances_of(record):
            items[p.get("item", (p["date"], p["commit"]))] = p
    provs = list(items.values())
    if not provs:
        return {"runs": 0}
    return {"runs": len(data["runs"]), "work_items": len(provs),
            "commits": sorted({str(p["commit"])[:10] for p in provs}),
            "fvlib_modified": any(p["fvlib_modified"] for p in provs),
            "fvlib": sorted({p["fvlib"] for p in provs}), "torch": sorted({p["torch"] for p in provs}),
            "devices": sorted({f"{p['device']} ({p['device_name']}), {p['threads']} thread(s)" for p in provs}),
            "wall_seconds": round(sum(p["wall_seconds"] for p in provs), 1),
            "cpu_seconds": round(sum(p["cpu_seconds"] for p in provs), 1),
            "dates": [min(p["date"] for p in provs), max(p["date"] for p in provs)]}


def provenance_line(data: dict) -> str:
    """One line for a chapter: what the stored result is, and where and when it was trained."""
    p = provenance_summary(data)
    if not p["runs"]:
        return f"{data['experiment']}: no runs stored"
    return (f"{data['experiment']}: {p['runs']} of {len(data['planned_runs'])} runs stored, trained "
            f"{p['dates'][0][:10]} to {p['dates'][1][:10]} at fvlib {', '.join(p['fvlib'])} "
            f"(commit {', '.join(p['commits'])}{', modified' if p['fvlib_modified'] else ''}), torch "
            f"{', '.join(p['torch'])}, on {'; '.join(p['devices'])}; {p['cpu_seconds'] / 3600:.1f} CPU hours")
