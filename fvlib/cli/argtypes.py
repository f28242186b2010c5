"""The command line's argparse pieces: a parser whose errors are one line (:class:`OneLineParser`),
that takes no abbreviated flag and no flag twice (:class:`StoreOnce`, :class:`StoreTrueOnce`,
:class:`BooleanOnce`), and the argument types, which turn a flag's text into a number and name the flag when it is not
one. The ranged types check with :mod:`fvlib._checks`, for the flags of subcommands that have no
config of their own to check them (``theory``, ``gap``, ``patch``, ...)."""

from __future__ import annotations

import argparse

from .._checks import check_int, check_number, check_seed
from .limits import CliError

__all__ = ["OneLineParser", "StoreOnce", "StoreTrueOnce", "BooleanOnce",
           "integer", "number", "positive_int", "seed", "to_float", "to_int"]


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors raise :class:`CliError` (one line, no usage block),
    that takes flags only in full (``--dep`` is not ``--depth``) and each flag once: its plain
    and ``store_true`` arguments are :class:`StoreOnce` and :class:`StoreTrueOnce`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.register("action", None, StoreOnce)
        self.register("action", "store", StoreOnce)
        self.register("action", "store_true", StoreTrueOnce)

    def error(self, message):
        raise CliError(message)


def _given_once(action: argparse.Action, namespace, typed: str) -> None:
    """Refuse a second occurrence of ``action``'s flag (or of its ``--no-`` form) on one command
    line; ``typed``: the flag and its value as given."""
    seen = namespace.__dict__.setdefault("_flags_given", {})
    if action.dest in seen:
        raise argparse.ArgumentError(action, f"given twice ({seen[action.dest]}, then {typed}); give it once")
    seen[action.dest] = typed


class StoreOnce(argparse.Action):
    """``store``, refusing the flag given twice."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string is not None:
            _given_once(self, namespace, f"{option_string} {values}")
        setattr(namespace, self.dest, values)


class StoreTrueOnce(argparse.Action):
    """``store_true``, refusing the flag given twice."""

    def __init__(self, option_strings, dest, default=False, required=False, help=None):
        super().__init__(option_strings, dest, nargs=0, const=True, default=default, required=required, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        _given_once(self, namespace, option_string)
        setattr(namespace, self.dest, True)


class BooleanOnce(argparse.BooleanOptionalAction):
    """``--name``/``--no-name``, refusing either given twice (or both)."""

    def __call__(self, parser, namespace, values, option_string=None):
        _given_once(self, namespace, option_string)
        super().__call__(parser, namespace, values, option_string)


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
