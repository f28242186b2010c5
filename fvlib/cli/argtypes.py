"""The command line's argparse pieces: a parser whose errors are one line (:class:`OneLineParser`)
and the argument types, which turn a flag's text into a number and name the flag when it is not
one. The ranged types check with :mod:`fvlib._checks`, for the flags of subcommands that have no
config of their own to check them (``theory``, ``gap``, ``patch``, ...)."""

from __future__ import annotations

import argparse

from .._checks import check_int, check_number, check_seed
from .limits import CliError

__all__ = ["OneLineParser", "integer", "number", "positive_int", "seed", "to_float", "to_int"]


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors raise :class:`CliError` (one line, no usage block)."""

    def error(self, message):
        raise CliError(message)


def to_int(flag: str):
    """An argparse type: the integer ``flag`` is given, unchecked otherwise."""

    def parse(text):
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be an integer, got {text!r}") from None

    return parse


def to_float(flag: str):
    """An argparse type: the number ``flag`` is given (``nan`` and ``inf`` included), unchecked
    otherwise."""

    def parse(text):
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a number, got {text!r}") from None

    return parse


def integer(flag: str, low: int | None = None, high: int | None = None, check=None):
    """An argparse type: an integer in ``[low, high]``, checked by :func:`fvlib._checks.check_int`
    (or by ``check(flag, value)``)."""
    convert = to_int(flag)

    def parse(text):
        value = convert(text)
        return _checked(check, flag, value) if check else _checked(check_int, flag, value, low, high)

    return parse


def seed(flag: str = "--seed"):
    """An argparse type: a seed, one rule for every subcommand (:func:`fvlib._checks.check_seed`)."""
    return integer(flag, check=check_seed)


def positive_int(flag: str):
    """An argparse type: an integer of at least 1."""
    return integer(flag, 1)


def number(flag: str, low: float | None = None, high: float | None = None, low_open: bool = False):
    """An argparse type: a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    convert = to_float(flag)

    def parse(text):
        return _checked(check_number, flag, convert(text), low, high, low_open=low_open)

    return parse


def _checked(check, *args, **kwargs):
    """Run a :mod:`fvlib._checks` check; its ``ValueError`` becomes argparse's one-line error."""
    try:
        return check(*args, **kwargs)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
