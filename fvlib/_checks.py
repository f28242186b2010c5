"""Argument checks for the places people call: the CLI, the widgets, the course checks and the
public constructors and functions of the library.

Each check returns the value unchanged or raises ``ValueError`` naming the argument and its
bad value, e.g. ``depth must be an integer in [1, 12], got 0``. ``bool`` is not accepted as a
number (``True`` would otherwise pass as ``1``); numbers must be finite. Inner layers of the
library trust what the edges checked and keep at most a cheap ``assert``.
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = [
    "MAX_SEED",
    "is_int",
    "check_int",
    "check_number",
    "check_seed",
    "check_budget",
    "check_instance",
    "check_tensor",
    "check_finite",
    "dataclass_from_dict",
    "DictRoundTrip",
]

#: Seeds are integers in ``[0, MAX_SEED]`` everywhere (the library, every CLI subcommand): the
#: range of NumPy's seeds, and far inside torch's, so offsets such as ``seed + 20_000`` stay valid.
MAX_SEED = 2**32 - 1


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
    number = _is_real(value) and math.isfinite(value)
    too_low = number and low is not None and (value <= low if low_open else value < low)
    too_high = number and high is not None and value > high
    if not number or too_low or too_high:
        raise ValueError(f"{name} must be {_number_range(low, high, low_open)}, got {value!r}")
    return value


def _is_real(value) -> bool:
    """A real number (Python, NumPy, or a 0-d real tensor), not a ``bool``."""
    if isinstance(value, torch.Tensor):
        return value.ndim == 0 and not value.is_complex() and value.dtype != torch.bool
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_seed(name: str, value) -> int:
    """``value`` if it is a seed: an integer in ``[0, MAX_SEED]`` (one rule everywhere)."""
    return check_int(name, value, 0, MAX_SEED)


def check_budget(name: str, value, depth: int, depth_name: str = "depth") -> int:
    """``value`` if it is a budget for a tree of depth ``depth``: an integer in ``[1, D]`` with
    ``D = 2^depth - 1`` coordinates (one rule everywhere; ``depth_name`` names the depth)."""
    dim = 2**depth - 1
    if not is_int(value) or not 1 <= value <= dim:
        raise ValueError(f"{name} must be an integer in [1, {dim}] (D = 2^K - 1 at {depth_name} {depth}), "
                         f"got {value!r}")
    return value


def check_instance(name: str, value, cls):
    """``value`` if it is an instance of ``cls`` (a class or a tuple of classes)."""
    if not isinstance(value, cls):
        names = " or ".join(c.__name__ for c in (cls if isinstance(cls, tuple) else (cls,)))
        raise ValueError(f"{name} must be a {names}, got {type(value).__name__}")
    return value


def check_tensor(name: str, value, shape: tuple | None = None, text: str | None = None, *,
                 integer: bool = False) -> torch.Tensor:
    """``value`` if it is a real ``torch.Tensor`` (integer-valued with ``integer``) whose shape
    matches ``shape``: one entry per axis, an ``int`` size or ``None`` for any size. ``text``
    names the axes in the message, e.g. ``"(B, 2^K)"``.

    A list or NumPy array is refused, not converted: the message says what to pass.
    """
    wanted = _shape_text(shape, text)
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor{' of shape ' + wanted if wanted else ''}, "
                         f"got {type(value).__name__}")
    if value.is_complex() or value.dtype == torch.bool or (integer and value.is_floating_point()):
        raise ValueError(f"{name} must be {'an integer' if integer else 'a real'} tensor, got dtype {value.dtype}")
    if shape is not None and (value.ndim != len(shape)
                              or any(s is not None and s != n for s, n in zip(shape, value.shape))):
        raise ValueError(f"{name} must have shape {wanted}, got {tuple(value.shape)}")
    return value


def check_finite(name: str, value: torch.Tensor) -> torch.Tensor:
    """``value`` (a tensor) if it holds no NaN and no infinity. A finite sum settles it in one
    pass without a copy (a NaN or an infinity makes the sum NaN or infinite); only a sum that is
    not finite is looked at element by element (finite values may overflow it)."""
    if value.is_floating_point() and not bool(torch.isfinite(value.sum())):
        bad = int((~torch.isfinite(value)).sum())
        if bad:
            raise ValueError(f"{name} must be finite, got {bad} NaN or infinite value(s)")
    return value


def _shape_text(shape: tuple | None, text: str | None) -> str:
    if shape is None:
        return text or ""
    sizes = tuple("*" if s is None else s for s in shape)
    inner = ", ".join(map(str, sizes)) + ("," if len(sizes) == 1 else "")
    return f"{text} = ({inner})" if text else f"({inner})"


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


class DictRoundTrip:
    """A mixin for the config dataclasses saved as JSON: ``to_dict`` and its inverse ``from_dict``
    (unknown keys raise ``ValueError`` naming them; :attr:`WHAT` names the config in the message)."""

    WHAT = "config"

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (inverse of :meth:`from_dict`)."""
        from dataclasses import asdict

        return asdict(self)

    @classmethod
    def from_dict(cls, data):
        """Build from a dict; unknown keys raise ``ValueError`` naming them."""
        return dataclass_from_dict(cls, data, cls.WHAT)
