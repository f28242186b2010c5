"""``python -m fvlib gap``: chapter 8's gap table of a trained run
(:func:`fvlib.experiments.beside_theory.gap_table`) as JSON or as a short table."""

import json
import math

import pytest

from fvlib.cli import main
from fvlib.cli.dispatch import GAP_ROWS
from fvlib.experiments.beside_theory import gap_table
from fvlib.training import TrainConfig, load_run, train

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------------------
# python -m fvlib gap
# ----------------------------------------------------------------------------------------
TINY = TrainConfig(model="A", prior="tree", depth=3, alpha=0.5, n_ctx=32, noise_std=0.1, budget=3, steps=40,
                   batch=32, queries=16, width=32, eval_every=40, eval_contexts=64, device="cpu")
CONTEXTS = 300


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny trained model A on the tree, and runs the gap table does not apply to."""
    root = tmp_path_factory.mktemp("gap")
    configs = {"A": TINY, "B": TrainConfig(**{**TINY.to_dict(), "model": "B", "steps": 5}),
               "A-gaussian": TrainConfig(**{**TINY.to_dict(), "prior": "gaussian-twin", "steps": 5}),
               "transformer": TrainConfig(**{**TINY.to_dict(), "arch": "transformer", "inputs": "tokens", "steps": 5})}
    for name, config in configs.items():
        train(config, out_dir=root / name, progress=False)
    return root


def _gap(capsys, *argv):
    code = main(["gap", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_gap_json_is_the_library_gap_table(runs, capsys):
    """Every key is there, each number is the one gap_table gives for the run on the same
    contexts, and the ratios are the model (and its router + Bayes decoder) over the better
    paired reference, context by context."""
    code, out, err = _gap(capsys, "--run", str(runs / "A"), "--contexts", str(CONTEXTS), "--seed", "3", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert set(GAP_ROWS) <= set(result) and set(result["stderr"]) == set(GAP_ROWS)
    assert {"best_paired", "ratio", "ratio_stderr", "router_bayes_ratio", "router_bayes_ratio_stderr"} <= set(result)
    assert (result["contexts"], result["seed"]) == (CONTEXTS, 3)
    model, config, _ = load_run(runs / "A")
    table = gap_table(model, config, contexts=CONTEXTS, seed=3)
    for row in GAP_ROWS:
        assert (result[row], result["stderr"][row]) == pytest.approx(table[row], rel=1e-9)
        assert result[row] > 0 and result["stderr"][row] > 0
    paired = ("adaptive_greedy_paired", "adaptive_opt_paired")
    assert result["best_paired"] == min(paired, key=lambda row: result[row]) == table["best_paired"]
    best = result[result["best_paired"]]
    assert result["ratio"] == pytest.approx(result["model"] / best, rel=1e-9)
    assert result["router_bayes_ratio"] == pytest.approx(result["router_bayes"] / best, rel=1e-9)
    assert (result["ratio"], result["ratio_stderr"]) == pytest.approx(table["ratios"]["model"], rel=1e-9)
    assert result["ratio_stderr"] > 0 and result["router_bayes_ratio_stderr"] > 0


def test_gap_without_json_is_a_short_table(runs, capsys):
    code, out, err = _gap(capsys, "--run", str(runs / "A"), "--contexts", "100")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) <= 10 and any("best paired" in line and "+-" in line for line in lines)


def test_gap_json_holds_null_not_nan(runs, capsys, monkeypatch):
    import fvlib.experiments.beside_theory as beside_theory

    def with_a_nan(*args, **kwargs):
        table = gap_table(*args, **kwargs)
        return {**table, "router_bayes": (table["router_bayes"][0], math.nan)}

    monkeypatch.setattr(beside_theory, "gap_table", with_a_nan)
    code, out, err = _gap(capsys, "--run", str(runs / "A"), "--contexts", "100", "--json")
    assert code == 0, err

    def refuse(constant):
        raise ValueError(f"bare {constant} in the JSON")

    result = json.loads(out, parse_constant=refuse)
    assert result["stderr"]["router_bayes"] is None and result["stderr"]["model"] > 0


@pytest.mark.parametrize("name, needle", [("B", "model B"), ("A-gaussian", "gaussian-twin"),
                                          ("transformer", "transformer")])
def test_gap_of_another_run_is_one_line(runs, capsys, name, needle):
    code, out, err = _gap(capsys, "--run", str(runs / name), "--json")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and needle in lines[0] and "model A" in lines[0]


@pytest.mark.parametrize("argv, needle", [(["--contexts", "1"], "--contexts"), (["--contexts", "x"], "'x'"),
                                          (["--seed", "-1"], "--seed"), (["--bogus"], "--bogus"), ([], "--run")])
def test_gap_bad_flags_are_one_line(runs, capsys, argv, needle):
    run = ["--run", str(runs / "A")] if argv else []
    code, out, err = _gap(capsys, *run, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and needle in lines[0]


def test_gap_of_a_missing_run_is_one_line(tmp_path, capsys):
    code, out, err = _gap(capsys, "--run", str(tmp_path / "nowhere"))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "--run" in lines[0] and "nowhere" in lines[0]
