"""Bad input to the command line: one line on stderr naming the flag, exit status 2, no
traceback, and before any expensive work (the book's appendix *Conventions*, section "The
command line"). The CLI runs in-process through :func:`fvlib.cli.main`; the functions that do the
work are replaced by ones that fail the test if they are reached, and the machine's memory is
fixed at 16 GB so that the size checks answer the same on every machine. The last tests run
``python -m fvlib`` itself (``run_cli``)."""

import json
import re
from pathlib import Path

import pytest
from conftest import run_cli

from fvlib import cli
from fvlib.cli import dispatch, limits

ROOT = Path(__file__).resolve().parents[2]
MEMORY = 16e9


def _never(*args, **kwargs):
    raise AssertionError("the expensive work started before the bad input was refused")


@pytest.fixture
def guarded(monkeypatch):
    """The CLI with its expensive entry points replaced by :func:`_never`."""
    import fvlib.interventions
    import fvlib.theory
    import fvlib.training

    monkeypatch.setattr(limits, "memory_limit", lambda device=None: MEMORY)
    for module, name in ((fvlib.theory, "theory_baselines"), (fvlib.training, "train"),
                         (fvlib.training, "load_run"), (fvlib.interventions, "key_patching_sweep")):
        monkeypatch.setattr(module, name, _never)


THEORY = ["theory", "--depth", "3", "--n-ctx", "16", "--budget", "2"]
TRAIN = ["train", "--model", "A", "--depth", "3", "--n-ctx", "16", "--budget", "2", "--steps", "2", "--no-progress"]


def _with(base, *flags):
    """``base`` with ``flags`` added; a flag of ``base`` given again is replaced (the CLI refuses a
    flag given twice)."""
    given, kept, index = {f for f in flags if f.startswith("--")}, [], 0
    while index < len(base):
        if base[index] in given:
            index += 2 if index + 1 < len(base) and not base[index + 1].startswith("--") else 1
            continue
        kept.append(base[index])
        index += 1
    return [*kept, *flags]


BAD = [
    # sizes that cannot fit or finish: refused from an estimate of their cost
    (_with(THEORY, "--depth", "16"), "--depth 16"),
    (_with(THEORY, "--samples", "1000000000"), "--samples 1000000000"),
    (_with(THEORY, "--budget", "4", "--dp"), "--dp"),
    (_with(THEORY, "--depth", "14", "--budget", "14", "--optimised"), "--depth 14"),
    (_with(TRAIN, "--batch", "1000000000"), "--batch 1000000000"),
    (_with(TRAIN, "--width", "1000000000"), "--width 1000000000"),
    # query tokens are drawn only without the expected loss (the default of the constrained models)
    (_with(TRAIN, "--queries", "1000000000", "--no-expected-loss"), "--queries 1000000000"),
    # on the tokens a long context costs N D numbers per context (on the pooled statistic nothing)
    (_with(TRAIN, "--inputs", "tokens", "--n-ctx", "1000000000"), "--n-ctx 1000000000"),
    (_with(TRAIN, "--inputs", "tokens", "--n-ctx", "1000000000000"), "--n-ctx 1000000000000"),
    (_with(TRAIN, "--arch", "transformer", "--inputs", "statistic"), "--inputs statistic"),
    (_with(TRAIN, "--depth", "16", "--no-expected-loss"), "--depth 16"),
    (_with(TRAIN, "--arch", "transformer", "--n-ctx", "100000"), "--n-ctx 100000"),
    (_with(TRAIN, "--arch", "transformer", "--width", "1000000000"), "--width 1000000000"),
    # the flag limits
    (_with(THEORY, "--depth", "17"), "--depth"),
    (_with(THEORY, "--budget", "7", "--dp"), "--budget"),
    (_with(THEORY, "--depth", "4", "--dp"), "--depth"),
    (_with(THEORY, "--noise-std", "1e200"), "--noise-std"),
    (_with(TRAIN, "--noise-std", "1e200"), "--noise-std"),
    (_with(THEORY, "--samples", "1e9"), "--samples"),
    (_with(TRAIN, "--batch", "1e9"), "--batch"),
    # one rule for budgets: [1, D]
    (_with(THEORY, "--budget", "9"), "--budget"),
    (_with(TRAIN, "--budget", "9"), "--budget"),
    (_with(TRAIN, "--budget", "0"), "--budget"),
    # one rule for seeds: [0, 2^32 - 1], in every subcommand
    *[(_with(base, "--seed", seed), "--seed")
      for base in (THEORY, TRAIN, ["patch", "--run", "nowhere"], ["reproduce", "--out", "nowhere"])
      for seed in ("1e23", "100000000000000000000000", "-1", "4294967296")],
]


@pytest.mark.parametrize("argv, needle", BAD, ids=[" ".join(a[0:1] + a[-2:]) for a, _ in BAD])
def test_bad_input_is_one_line_naming_the_flag(guarded, capsys, tmp_path, argv, needle):
    out_dir = tmp_path / "run"
    if argv[0] == "train":
        argv = argv + ["--out", str(out_dir)]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err and needle in lines[0], lines[0]
    assert captured.out == ""
    assert not out_dir.exists()  # nothing written before the refusal


def test_the_refusal_names_the_estimate(guarded, capsys):
    assert cli.main(_with(THEORY, "--budget", "4", "--dp")) == 2
    line = capsys.readouterr().err.strip()
    assert re.search(r"about [\d.]+ h of computing", line) and "limit of 1 h" in line, line
    assert cli.main(_with(THEORY, "--depth", "16")) == 2
    line = capsys.readouterr().err.strip()
    assert re.search(r"about [\d.]+ GB of memory", line) and "16 GB" in line, line


def test_seeds_and_budgets_at_the_edges_of_the_rules_run(monkeypatch, capsys):
    """The largest seed and the budget D are accepted (and the run is reached)."""
    import fvlib.theory

    reached = []
    monkeypatch.setattr(fvlib.theory, "theory_baselines", lambda *a, **kw: reached.append(kw["seed"]) or
                        {k: 0.0 for k in dispatch.THEORY_KEYS})
    assert cli.main(_with(THEORY, "--seed", "4294967295", "--budget", "7")) == 0
    assert reached == [4294967295]


def _documented_theory_usages():
    """Every ``python -m fvlib theory ...`` command of the README and the book's pages (not the
    templates such as ``--depth K``), and those of ``tests/cli/test_cli_dispatch.py``, as argument lists."""
    usages = []
    for path in [ROOT / "README.md", *sorted((ROOT / "book").glob("*.md"))]:
        text = path.read_text().replace("\\\n", " ")
        for match in re.finditer(r"fvlib theory((?:\s+--[\w-]+(?: [\w.]+)?)+)", text):
            argv = match.group(1).split()
            if not any(a.isupper() for a in argv):
                usages.append(["theory", *argv])
    assert usages, "no documented usage found"
    return usages + [
        ["theory", "--depth", "4", "--alpha", "0.5", "--n-ctx", "64", "--noise-std", "0.1", "--budget", "4",
         "--samples", "500"],
        ["theory", "--depth", "3", "--n-ctx", "128", "--budget", "2", "--samples", "300", "--dp", "--optimised"],
    ]


@pytest.mark.parametrize("argv", _documented_theory_usages(), ids=" ".join)
def test_documented_theory_usages_are_within_the_limits(argv):
    args = cli.build_parser().parse_args(argv)
    limits.check_theory_cost(args)  # raises CliError when over a limit


def test_documented_train_usages_fit_in_16_gb():
    """The runs the chapters train, the stored experiments' runs and the README's example."""
    from fvlib.experiments import EXPERIMENTS
    from fvlib.experiments.inbuild import warm_work
    from fvlib.training import TrainConfig, estimate_memory

    configs = [c for item in warm_work() for c in (item if isinstance(item, list) else [item])]
    configs += [run.config for e in EXPERIMENTS.values() for run in e.runs]
    configs.append(TrainConfig(model="A", depth=6, n_ctx=128, budget=6, steps=3000))
    assert all(isinstance(c, TrainConfig) for c in configs)
    assert max(estimate_memory(c) for c in configs) < MEMORY


def test_json_never_holds_a_bare_nan(capsys, tmp_path):
    """One Monte Carlo sample has no standard error, one pair no spread: JSON null, not NaN."""

    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in the JSON output"))

    assert cli.main(_with(THEORY, "--samples", "1", "--stderr", "--json")) == 0
    out = strict(capsys.readouterr().out)
    assert out["stderr"]["adaptive_greedy"] is None and out["adaptive_greedy"] >= 0
    run = tmp_path / "run"
    argv = ["train", "--model", "C", "--depth", "2", "--n-ctx", "8", "--budget", "2", "--steps", "3",
            "--out", str(run), "--no-progress", "--json"]
    assert cli.main(argv) == 0
    capsys.readouterr()
    assert cli.main(["patch", "--run", str(run), "--contexts", "1", "--json"]) == 0
    out = strict(capsys.readouterr().out)
    assert out["stderr"] == [[None], [None]] and all(v is not None for row in out["loss"] for v in row)


# ----- through python -m fvlib -----------------------------------------------------------
@pytest.mark.parametrize(
    "args,needle",
    [
        (["--depth", "-1"], "-1"),
        (["--depth", "3", "--alpha", "1.5"], "1.5"),
        (["--depth", "3", "--alpha", "0"], "alpha"),
        (["--depth", "3", "--budget", "0"], "budget"),
        (["--depth", "3", "--budget", "99"], "99"),
        (["--depth", "3", "--n-ctx", "zero"], "zero"),
        (["--depth", "3", "--noise-std", "-0.5"], "-0.5"),
    ],
)
def test_bad_input_is_one_line_without_traceback(args, needle):
    base = {"--depth": "3", "--n-ctx": "16", "--budget": "2"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = ["theory"] + [x for kv in base.items() for x in kv]
    out = run_cli(*argv)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert needle in lines[0]


@pytest.mark.parametrize("damage", ["missing", "corrupt-weights", "corrupt-config"])
def test_patch_with_a_bad_run_directory_is_one_line(tmp_path, damage):
    run = tmp_path / "run"
    if damage != "missing":
        out = run_cli("train", "--model", "C", "--depth", "2", "--n-ctx", "8", "--budget", "2", "--steps", "5",
                      "--out", str(run), "--no-progress")
        assert out.returncode == 0, out.stderr
        victim = run / ("model.safetensors" if damage == "corrupt-weights" else "config.json")
        victim.write_text("{ not what it should be")
    out = run_cli("patch", "--run", str(run), "--json")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr and str(run) in lines[0]


@pytest.mark.parametrize("args", [["--model", "B"], ["--model", "A", "--prior", "gaussian-twin"],
                                  ["--model", "A", "--arch", "transformer"]])
def test_train_imitation_elsewhere_than_model_a_on_the_tree_is_one_line(tmp_path, args):
    out = run_cli("train", *args, "--imitation", "--depth", "2", "--n-ctx", "8", "--budget", "2", "--steps", "5",
                  "--out", str(tmp_path / "r"), "--no-progress")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr and "--imitation" in lines[0]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flag, value", [("--router-warm-start", "-1"), ("--router-warm-start", "x"),
                                         ("--router-lr-scale", "0"), ("--router-lr-scale", "2")])
def test_train_bad_router_flags_are_one_line(tmp_path, flag, value):
    out = run_cli("train", "--model", "A", "--depth", "2", "--n-ctx", "8", "--budget", "2", "--steps", "5",
                  flag, value, "--out", str(tmp_path / "r"), "--no-progress")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr and flag in lines[0] and value in lines[0]


@pytest.mark.parametrize("value", ["1", "1.5", "-0.1", "x"])
def test_train_bad_warmup_is_one_line(tmp_path, value):
    out = run_cli("train", "--model", "C", "--depth", "2", "--n-ctx", "8", "--budget", "2", "--steps", "5",
                  "--warmup", value, "--out", str(tmp_path / "r"), "--no-progress")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr and "warmup" in lines[0]


def test_warm_bad_jobs_is_one_line(tmp_path):
    out = run_cli("warm", "--jobs", "0", "--root", str(tmp_path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "--jobs" in out.stderr


