"""Argument checks for the places people call: the CLI, the widgets, the course checks and the
public constructors and functions of the library.

Each check returns the value unchanged or raises ``ValueError`` naming the argument and its
bad value, e.g. ``depth must be an integer in [1, 12], got 0``. ``bool`` is not accepted as a
number (``True`` would otherwise pass as ``1``); numbers must be finite. Inner layers of the
library trust what the edges checked and keep at most a cheap ``assert``.
"""

from __future__ import annotations

import math

__all__ = ["is_int", "check_int", "check_number", "dataclass_from_dict"]


def is_int(value) -> bool:
    """``True`` for a Python ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value, low: int | None = None, high: int | None = None) -> int:
    """``value`` if it is an integer in ``[low, high]`` (either bound may be ``None``)."""
    too_low = low is not None and is_int(value) and value < low
    too_high = high is not None and is_int(value) and value > high
    if not is_int(value) or too_low or too_high:
        raise ValueError(f"{name} must be {_integer_range(low, high)}, got {value!r}")
    return value


def check_number(
    name: str, value, low: float | None = None, high: float | None = None, *, low_open: bool = False
) -> float:
    """``value`` if it is a finite real number in ``[low, high]`` (``(low, high]`` with
    ``low_open``; either bound may be ``None``)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    too_low = number and low is not None and (value <= low if low_open else value < low)
    too_high = number and high is not None and value > high
    if not number or too_low or too_high:
        raise ValueError(f"{name} must be {_number_range(low, high, low_open)}, got {value!r}")
    return value


def _integer_range(low, high) -> str:
    if high is not None:
        return f"an integer in [{low}, {high}]" if low is not None else f"an integer <= {high}"
    return {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}.get(low, f"an integer >= {low}")


def _number_range(low, high, low_open: bool) -> str:
    if high is not None:
        opening = "(" if low_open else "["
        return f"a number in {opening}{low}, {high}]" if low is not None else f"a number <= {high}"
    if low is None:
        return "a finite number"
    if low == 0:
        return "a positive number" if low_open else "a non-negative number"
    return f"a number > {low}" if low_open else f"a number >= {low}"


def dataclass_from_dict(cls, data, what: str):
    """``cls(**data)`` for a dataclass ``cls``; a ``data`` that is not a mapping, or that has keys
    ``cls`` does not know, raises ``ValueError`` naming them (``what``: e.g. ``"model config"``)."""
    from collections.abc import Mapping
    from dataclasses import fields

    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - {f.name for f in fields(cls)})
    if unknown:
        raise ValueError(f"unknown {what} keys: {unknown}")
    return cls(**data)
