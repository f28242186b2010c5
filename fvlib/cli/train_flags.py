"""The flags of ``python -m fvlib train``, made from the fields of
:class:`fvlib.training.TrainConfig`, and the config a command line asks for.

Every field whose metadata has a ``help`` entry is a flag (:func:`config_fields`): ``--`` and its
name with ``-`` for ``_``, typed by the field's annotation (``bool``: ``--name``/``--no-name``),
with the metadata's help, ``choices`` and ``required``. A new training knob is one field.
A flag not given takes the recipe's value (:func:`fvlib.training.recipe_for`, or
:data:`fvlib.training.IMITATION_RECIPE` with ``--imitation``) or else the field's default.

The values are checked once, by :class:`~fvlib.training.TrainConfig` itself: the flags only turn
text into numbers, and a config's ``ValueError`` becomes a one-line :class:`CliError` that names
the flag (:func:`train_config`). The flags of the command line alone (``--imitation``,
``--no-curriculum``) are checked here.
"""

from __future__ import annotations

import argparse
import re
import typing
from dataclasses import Field, fields

from ..training import IMITATION_RECIPE, TrainConfig, recipe_for
from .argtypes import BooleanOnce, to_float, to_int
from .limits import CliError, flag_for

__all__ = ["add_config_flags", "config_fields", "config_help", "field_choices", "train_config"]

#: The argparse type of a flag, by its field's annotation: ``converter(flag)``.
_CONVERTERS = {int: to_int, float: to_float, str: lambda flag: str}


def config_fields() -> tuple[Field, ...]:
    """The fields of :class:`fvlib.training.TrainConfig` that are flags of ``train``, in the
    order of the class: those whose metadata has a ``help`` entry."""
    return tuple(f for f in fields(TrainConfig) if "help" in f.metadata)


def config_help(name: str) -> str | None:
    """The help of the flag of :class:`fvlib.training.TrainConfig`'s field ``name``."""
    return next(f.metadata["help"] for f in config_fields() if f.name == name)


def _value_type(name: str) -> type:
    """The type of field ``name`` of :class:`fvlib.training.TrainConfig`, ``X`` for ``X | None``."""
    hint = typing.get_type_hints(TrainConfig)[name]
    inner = [t for t in typing.get_args(hint) if t is not type(None)]
    return inner[0] if inner else hint


def field_choices(field) -> tuple | None:
    """A field's ``choices`` metadata: a tuple, or a function returning one (the registries')."""
    choices = field.metadata.get("choices")
    return tuple(choices()) if callable(choices) else choices


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag to ``parser`` for each field of :func:`config_fields`. Each defaults to
    ``None`` (not given), so that :func:`train_config` can tell a flag given from a default."""
    for field in config_fields():
        flag, kind = flag_for(field.name), _value_type(field.name)
        common = {"default": None, "help": field.metadata["help"],
                  "required": field.metadata.get("required", False)}
        if kind is bool:
            parser.add_argument(flag, action=BooleanOnce, **common)
        elif kind in _CONVERTERS:
            parser.add_argument(flag, type=_CONVERTERS[kind](flag), choices=field_choices(field), **common)
        else:
            raise ValueError(f"TrainConfig field {field.name!r} is of type {kind!r}, which no flag reads "
                             f"(int, float, str, bool); its metadata must have no 'help'")


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The :class:`fvlib.training.TrainConfig` that the parsed ``train`` command line ``args``
    asks for: the flags given over the recipe (over the field defaults). Raises
    :class:`CliError` naming the flag for a bad value or flags that contradict each other."""
    given = {f.name: getattr(args, f.name) for f in config_fields() if getattr(args, f.name) is not None}
    _check_command_line_flags(args, given)
    settings = given
    try:
        settings = _settings(args, given)
        config = TrainConfig(**settings)
    except ValueError as err:
        raise CliError(_named_by_flag(str(err), settings)) from None
    _check_flags_that_act(args, given, config)
    return config


def _check_flags_that_act(args: argparse.Namespace, given: dict, config: TrainConfig) -> None:
    """Refuse a flag typed on the command line that would change nothing in ``config``'s run:
    ``--router`` for a model that has its own, the warm-start flags of a run that does not
    warm-start its router, ``--queries`` under the expected loss (which draws no query tokens)."""
    if "router" in given and "router" in config.unused_fields():
        raise CliError(f"--router {given['router']} does nothing here: only model A (--arch constrained) "
                       f"chooses its router, this run is model {config.model} (--arch {config.arch})")
    if "router_warm_start" in given and not config.warm_starts and given["router_warm_start"] > 0:
        raise CliError(f"--router-warm-start does nothing here: only model A with the gated router on the tree "
                       f"prior warm-starts its router, this run is model {config.model} (--arch {config.arch}, "
                       f"--router {config.router}) on the {config.prior} prior")
    if args.imitation and not config.warm_starts:
        raise CliError(f"--imitation with --router-warm-start {config.router_warm_start} leaves no imitation "
                       f"(drop --imitation, or give --router-warm-start > 0)")
    if "router_lr_scale" in given and not config.warm_starts:
        raise CliError("--router-lr-scale does nothing without a warm start (it scales the learning rate of a "
                       "warm-started router: --imitation or --router-warm-start > 0)")
    if "queries" in given and config.expected_loss:
        raise CliError(f"--queries {given['queries']} does nothing under the expected loss, which draws no "
                       f"query tokens (the default for constrained models; --no-expected-loss samples them)")


def _settings(args: argparse.Namespace, given: dict) -> dict:
    """The config's fields that differ from its defaults: the recipe (:func:`_recipe`, without
    its curriculum under ``--no-curriculum``), and over it the flags ``given``."""
    settings = {**_recipe(args, given), **given}
    if args.no_curriculum:
        settings.pop("alpha_start", None)
    if "alpha_ramp" in given and settings.get("alpha_start") is None:
        raise CliError("--alpha-ramp needs a curriculum (--alpha-start; the tree prior's default without "
                       "--imitation or --no-curriculum)")
    return settings


def _setting(given: dict, name: str):
    """The value of field ``name``: given, or else the field's default."""
    return given.get(name, TrainConfig.__dataclass_fields__[name].default)


def _check_command_line_flags(args: argparse.Namespace, given: dict) -> None:
    """The rules of the flags that are not fields: ``--imitation`` only for model A with the gated
    router on the tree, ``--no-curriculum`` without ``--alpha-start``."""
    arch, model, prior, router = (_setting(given, name) for name in ("arch", "model", "prior", "router"))
    if args.imitation and (arch, model, prior) != ("constrained", "A", "tree"):
        raise CliError(f"--imitation needs --arch constrained --model A --prior tree (the teacher is the greedy "
                       f"policy of model A's router), got --arch {arch} --model {model} --prior {prior}")
    if args.imitation and router != "gated":
        raise CliError(f"--imitation needs --router gated (the warm start fits the gated router's matrix), "
                       f"got --router {router}")
    if args.no_curriculum and "alpha_start" in given:
        raise CliError(f"--no-curriculum and --alpha-start {given['alpha_start']} contradict each other")


def _recipe(args: argparse.Namespace, given: dict) -> dict:
    """The settings of the flags not given: :data:`fvlib.training.IMITATION_RECIPE` with
    ``--imitation``, else :func:`fvlib.training.recipe_for` the architecture, prior and decay."""
    if args.imitation:
        return dict(IMITATION_RECIPE)
    return recipe_for(*(_setting(given, name) for name in ("arch", "prior", "alpha")))


def _named_by_flag(message: str, settings: dict) -> str:
    """The first line of a config's error as the command line says it: a field named with its
    setting (``arch 'transformer'``) becomes the flag and the value as typed (``--arch transformer``),
    and the field it starts with becomes its flag (``warmup must be ...`` -> ``--warmup must be ...``)."""
    message = message.splitlines()[0]
    names = [f.name for f in config_fields()]
    for name in names:
        if name in settings:
            pattern = rf"(?<![\w-]){name} {re.escape(repr(settings[name]))}(?![\w.])"
            message = re.sub(pattern, lambda _, name=name: f"{flag_for(name)} {settings[name]}", message)
    first, _, rest = message.partition(" ")
    return f"{flag_for(first)} {rest}" if first in names else message
