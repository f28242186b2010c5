"""The seal of a result file: the SHA-256 of each of its parts and of the files stored beside it.

:func:`~fvlib.experiments.storage.write_result`, the store's only writer, adds a ``seal`` to every
result file it writes (:func:`seal_of`); every read compares it with the content
(:func:`broken_parts`), so that an edit made outside fvlib (a number changed by hand, a run
copied in from elsewhere, a parameter file replaced) is refused, naming the part that changed::

    {"algorithm": "sha256",
     "fields": {FIELD: hash},            every top-level field but runs and seal (the theory, the
                                         rules, the format and version, ...)
     "runs":   {KEY: hash},              each run's record, so a change names its run
     "beside": {FILE: hash}}             the bytes of each file beside it (NAME.theory.safetensors)

A part's hash is the SHA-256 of its canonical JSON (:func:`canonical_json`: sorted keys, no
spaces, floats as Python's shortest round-trip repr), so reading a file and writing it back
seals the same bytes. The seal tells a change made outside fvlib from the store's own writes; it
is no signature (anyone can compute it): ``python -m fvlib experiment seal NAME``
(:func:`~fvlib.experiments.storage.seal_result`) is the maintainer's explicit way to seal a file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

__all__ = ["ALGORITHM", "broken_parts", "canonical_json", "digest", "seal_of", "seal_shape_error"]

#: The hash of every part of a seal.
ALGORITHM = "sha256"


def canonical_json(value) -> bytes:
    """``value``'s canonical JSON as UTF-8 bytes: sorted keys, no spaces, no ASCII escaping."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest(data: bytes) -> str:
    """The SHA-256 of ``data`` in hex."""
    return hashlib.sha256(data).hexdigest()


def seal_of(data: dict, beside: dict[str, bytes]) -> dict:
    """The seal of a result file's JSON ``data`` (its ``seal`` field, if any, left out) and of
    the files ``beside`` it (``{file name: bytes}``)."""
    return {"algorithm": ALGORITHM,
            "fields": {k: digest(canonical_json(v)) for k, v in data.items() if k not in ("runs", "seal")},
            "runs": {k: digest(canonical_json(v)) for k, v in data["runs"].items()},
            "beside": {name: digest(content) for name, content in sorted(beside.items())}}


def seal_shape_error(seal) -> str | None:
    """What is wrong with the shape of a ``seal`` (``None`` when it is a seal of this module)."""
    if not isinstance(seal, dict) or set(seal) != {"algorithm", "fields", "runs", "beside"}:
        return "seal must be a mapping with the fields algorithm, fields, runs and beside"
    if seal["algorithm"] != ALGORITHM:
        return f"seal/algorithm must be {ALGORITHM!r}, got {seal['algorithm']!r}"
    for part in ("fields", "runs", "beside"):
        hashes = seal[part]
        if not isinstance(hashes, dict) or not all(isinstance(h, str) for h in hashes.values()):
            return f"seal/{part} must map names to hashes, got {hashes!r}"[:300]
    return None


def broken_parts(data: dict, read_beside: Callable[[str], bytes | None] | None) -> list[str]:
    """The parts of a result file's JSON ``data`` whose content differs from its ``seal``
    (``fields/FIELD`` named ``FIELD``, ``runs/KEY``, a file beside it by its name), each with how
    (``changed``, ``added``, ``removed``, ``missing``); ``[]`` when every part matches.
    ``read_beside(name)``: the bytes of the file ``name`` beside the result file (``None`` if
    there is none); ``None``: the files beside it are not compared (they are about to be
    written anew)."""
    fresh = seal_of(data, {})
    seal = data["seal"]
    out = []
    for part, prefix in (("fields", ""), ("runs", "runs/")):
        for name in sorted(set(seal[part]) | set(fresh[part])):
            if name not in fresh[part]:
                out.append(f"{prefix}{name} (removed)")
            elif name not in seal[part]:
                out.append(f"{prefix}{name} (added)")
            elif fresh[part][name] != seal[part][name]:
                out.append(f"{prefix}{name} (changed)")
    for name, want in sorted(seal["beside"].items()) if read_beside is not None else ():
        content = read_beside(name)
        if content is None:
            out.append(f"{name} (missing)")
        elif digest(content) != want:
            out.append(f"{name} (changed)")
    return out
