"""The parser of ``python -m fvlib``: the command it names, and the flags of ``train`` made from
the fields of :class:`fvlib.training.TrainConfig` (a new field is a flag, or is named in
:data:`NOT_FLAGS`), which take the recipe's value or the field's default when not given and
whose bad values the config itself refuses, in one line naming the flag."""

import dataclasses
import os
import subprocess
import sys
import typing

import pytest
from conftest import run_cli

from fvlib.cli import build_parser, main
from fvlib.cli.limits import flag_for
from fvlib.cli.train_flags import config_fields, config_help, field_choices, train_config
from fvlib.training import IMITATION_RECIPE, TrainConfig, recipe_for

#: The fields of TrainConfig that are deliberately not flags of ``train`` (runs take their defaults).
NOT_FLAGS = {"hidden_layers", "data_seed", "eval_every", "eval_contexts", "checkpoint_every"}
TRAIN = ["train", "--model", "A", "--depth", "3", "--n-ctx", "16", "--budget", "2", "--steps", "5"]
GIVEN = {"model", "depth", "n_ctx", "budget", "steps"}  # the fields TRAIN gives


def _train(*extra: str) -> list[str]:
    """TRAIN with ``extra`` flags; a flag of TRAIN given in ``extra`` takes its value there (a flag
    may be given only once)."""
    pairs = dict(zip(TRAIN[1::2], TRAIN[2::2]))
    kept = [item for flag, value in pairs.items() if flag not in extra for item in (flag, value)]
    return ["train", *kept, *extra]


def _train_help(capsys) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    return capsys.readouterr().out


def test_every_trainconfig_field_is_a_train_flag_or_named_as_not_one(capsys):
    flags = {f.name for f in config_fields()}
    assert flags | NOT_FLAGS == {f.name for f in dataclasses.fields(TrainConfig)} and not flags & NOT_FLAGS
    shown = _train_help(capsys)
    args = vars(build_parser().parse_args([*TRAIN, "--out", "run"]))
    for name in flags:
        assert f"{flag_for(name)} " in shown and name in args
    for name in NOT_FLAGS:
        assert flag_for(name) not in shown and name not in args


def test_the_train_flags_carry_the_fields_help(capsys):
    shown = " ".join(_train_help(capsys).split())
    for field in config_fields():
        assert config_help(field.name) == field.metadata["help"]
        if field.metadata["help"]:
            assert " ".join(field.metadata["help"].split()) in shown, field.name


@pytest.mark.parametrize("extra", [[], ["--arch", "transformer"], ["--arch", "transformer-open", "--model", "B"],
                                   ["--prior", "gaussian"], ["--alpha", "0.3"], ["--imitation"]],
                         ids=lambda extra: " ".join(extra) or "plain")
def test_a_train_flag_not_given_takes_the_recipe_or_the_field_default(extra):
    config = train_config(build_parser().parse_args([*_train(*extra), "--out", "run"]))
    recipe = IMITATION_RECIPE if "--imitation" in extra else recipe_for(config.arch, config.prior, config.alpha)
    given = GIVEN | {name.lstrip("-").replace("-", "_") for name in extra[::2]}
    for field in config_fields():
        if field.name not in given:
            assert getattr(config, field.name) == recipe.get(field.name, field.default), field.name


def _value_for(field) -> tuple[list[str], object]:
    """A command line giving ``field`` a value other than its default, and that value."""
    kind = typing.get_type_hints(TrainConfig)[field.name]
    if kind is bool:
        return [flag_for(field.name)], True
    if field_choices(field):
        value = field_choices(field)[-1]
        return [flag_for(field.name), value], value
    if field.name == "device":
        return ["--device", "cpu"], "cpu"
    value = {int: 3, float: 0.75, float | None: 0.75}[kind]
    return [flag_for(field.name), str(value)], value


@pytest.mark.parametrize("field", config_fields(), ids=lambda f: f.name)
def test_a_train_flag_given_sets_its_field(field):
    argv, value = _value_for(field)
    args = build_parser().parse_args([*_train(*argv), "--out", "run"])
    assert getattr(args, field.name) == value and type(getattr(args, field.name)) is type(value)


NUMERIC = [f for f in config_fields() if typing.get_type_hints(TrainConfig)[f.name] in (int, float, float | None)]


@pytest.mark.parametrize("field", NUMERIC, ids=lambda f: f.name)
def test_a_bad_train_value_is_refused_by_the_config_in_one_line_naming_the_flag(field, capsys, tmp_path):
    """Every number of the config is checked once, by TrainConfig; the command line names the flag."""
    assert main([*_train(flag_for(field.name), "-5"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fvlib: error: {flag_for(field.name)} ") and "-5" in err[0], err
    assert not (tmp_path / "run").exists()


def test_usage_names_the_command_the_user_typed():
    """`fvlib --help` (the console script) says fvlib, `python -m fvlib --help` says that."""
    from pathlib import Path

    from fvlib.cli import program_name

    assert program_name("/venv/bin/fvlib") == "fvlib"
    assert program_name(str(Path("fvlib") / "__main__.py")) == "python -m fvlib"
    out = run_cli("--help")
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m fvlib ")
    script = Path(sys.executable).parent / "fvlib"  # installed by pip install -e . (make venv)
    if script.is_file():
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # this checkout's fvlib
        out = subprocess.run([str(script), "--help"], check=False, capture_output=True, text=True, timeout=900, env=env)
        assert out.returncode == 0 and out.stdout.startswith("usage: fvlib ")
