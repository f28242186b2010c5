"""Issue 41, item 4: estimates before work that respect the process's limits, and library entry
points that refuse what cannot work. One test per case of ``/work/shared/reliability-cases.md``
(its id in the test's name or parametrize id): GP12, GP14, GP15, M03 and the ``LIB:`` rows.

The command line runs in-process (:func:`fvlib.cli.main`) on one tiny trained run; M03 runs
``python -m fvlib`` under an address-space limit, which is the point of the case."""

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fvlib.interventions
from fvlib import TreePrior, make_generator, sample_task
from fvlib.cli import limits, main
from fvlib.experiments import beside_theory
from fvlib.hooks import hook_name
from fvlib.interventions import key_patching_sweep, patching_cost
from fvlib.models import model_a
from fvlib.resources import available_memory
from fvlib.training import TrainConfig, estimate_memory, load_run, train
from fvlib.transformer import make_transformer

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
TINY = TrainConfig(model="A", prior="tree", depth=3, alpha=0.5, n_ctx=16, budget=3, steps=2, batch=16, queries=8,
                   width=16, eval_every=2, eval_contexts=16, device="cpu")
HUGE = "100000000000"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny trained run of model A on the tree (two steps: what is measured is its size)."""
    out = tmp_path_factory.mktemp("limits") / "run"
    train(TINY, out_dir=out, progress=False)
    return out


def _cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _never(*args, **kwargs):
    raise AssertionError("the work started although the estimate should have refused it")


# ----------------------------------------------------------------------------------------
# gap and patch: estimates before work
# ----------------------------------------------------------------------------------------
def test_GP12_gap_seed_is_bounded_at_parse_time(capsys):
    """Refused while parsing (the run directory does not exist and is never read), in the words of
    ``patch --seed``."""
    code, out, err = _cli(capsys, "gap", "--run", "nowhere", "--contexts", "20", "--seed", "99999999999999999999")
    assert (code, out) == (2, "")
    assert err.startswith("fvlib: error: argument --seed: --seed must be an integer in [0, 4294967295]")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command, sweep", [("patch", "key_patching_sweep"), ("gap", None)], ids=["GP14", "GP15"])
def test_GP14_GP15_huge_contexts_refused_fast_naming_the_flag(run, capsys, monkeypatch, command, sweep):
    """``--contexts 1e11`` is refused from the estimate, in one line naming ``--contexts``, in well
    under a second after loading, and no work starts."""
    if sweep:
        monkeypatch.setattr(fvlib.interventions, sweep, _never)
    else:
        monkeypatch.setattr(beside_theory, "gap_table", _never)
    start = time.perf_counter()
    code, out, err = _cli(capsys, command, "--run", str(run), "--contexts", HUGE)
    assert time.perf_counter() - start < 1.0
    assert (code, out) == (2, "")
    assert err.startswith(f"fvlib: error: --contexts {HUGE}: {command} needs about ")
    assert "TB of memory (estimated)" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["patch", "gap"])
def test_GP14_GP15_contexts_over_the_time_limit_refused(run, capsys, monkeypatch, command):
    """Where the memory would fit, a ``--contexts`` over an hour of computing is refused naming it."""
    monkeypatch.setattr(limits, "memory_limit", lambda device=None: float("inf"))
    monkeypatch.setattr(fvlib.interventions, "key_patching_sweep", _never)
    monkeypatch.setattr(beside_theory, "gap_table", _never)
    code, _, err = _cli(capsys, command, "--run", str(run), "--contexts", "1000000000")
    assert code == 2
    assert err.startswith(f"fvlib: error: --contexts 1000000000: {command} needs about ")
    assert "of computing (estimated on one core), over the limit of 1 h" in err


def test_GP14_a_long_patch_says_how_long_before_it_starts(run, capsys, monkeypatch):
    """Between a minute and the limit, ``patch`` notes on stderr how long it takes, then works
    (the memory is left out of this test: all there is)."""
    monkeypatch.setattr(limits, "memory_limit", lambda device=None: float("inf"))
    model, config, _ = load_run(run)
    per_context, _ = patching_cost(model, TreePrior(config.depth, config.alpha), config.n_ctx, 1)
    contexts = int(10 * limits.NOTE_AFTER / per_context)  # ten minutes

    class Started(Exception):
        """Stands for the long work, once it has started."""

    def started(*args, **kwargs):
        raise Started

    monkeypatch.setattr(fvlib.interventions, "key_patching_sweep", started)
    with pytest.raises(Started):
        main(["patch", "--run", str(run), "--contexts", str(contexts)])
    assert capsys.readouterr().err == "fvlib: note: this takes about 10 min (estimated on one core)\n"


@pytest.mark.parametrize("command", ["patch", "gap"])
def test_GP14_GP15_ordinary_contexts_pass(run, capsys, command):
    """An ordinary size passes the estimate and runs."""
    code, out, err = _cli(capsys, command, "--run", str(run), "--contexts", "40", "--json")
    assert code == 0, err
    assert json.loads(out)["contexts"] == 40 and "note" not in err


def test_warm_jobs_that_cannot_fit_together_are_refused(capsys, monkeypatch):
    """``warm`` sums the estimates of its ``--jobs`` largest runs: over the memory there is, it is
    refused naming ``--jobs`` before any run starts; one at a time fits."""
    from fvlib.experiments import inbuild

    monkeypatch.setattr(inbuild, "train_parallel", lambda *args, **kwargs: {})
    largest = max(sum(estimate_memory(c) for c in (item if isinstance(item, list) else [item]))
                  for item in inbuild.warm_work())
    monkeypatch.setattr(limits, "memory_limit", lambda device=None: 1.05 * largest)
    code, _, err = _cli(capsys, "warm", "--jobs", "4")
    assert code == 2
    assert err.startswith("fvlib: error: --jobs 4: warm needs about ") and "with 4 runs at once (estimated)" in err
    monkeypatch.setattr(inbuild, "train_parallel", lambda *args, **kwargs: {"ran": 1.0})
    code, out, err = _cli(capsys, "warm", "--jobs", "1", "--json")
    assert (code, json.loads(out)) == (0, {"runs": {"ran": 1.0}}), err


def test_GP14_GP15_library_refuses_contexts_that_cannot_fit(run):
    """The library functions behind the commands refuse, naming ``contexts``, before any work."""
    model, config, _ = load_run(run)
    tree = TreePrior(config.depth, config.alpha)
    with pytest.raises(ValueError, match=rf"^contexts = {HUGE} would need about .* TB of memory, more than"):
        key_patching_sweep(model, tree, config.n_ctx, 0.0, contexts=int(HUGE))
    with pytest.raises(ValueError, match=rf"^contexts = {HUGE} would need about .* TB of memory, more than"):
        beside_theory.gap_table(model, config, contexts=int(HUGE))


# ----------------------------------------------------------------------------------------
# M03: the memory there is, under ulimit -v
# ----------------------------------------------------------------------------------------
M03 = ["train", "--model", "A", "--depth", "6", "--n-ctx", "128", "--budget", "6", "--steps", "2", "--batch",
       "262144", "--no-progress", "--json"]
ULIMIT_V = 3_000_000 * 1024  # ``ulimit -v 3000000``: KiB


def _limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (ULIMIT_V, resource.RLIM_INFINITY))


def test_M03_train_under_ulimit_v_is_refused_naming_the_batch(tmp_path):
    """Under ``ulimit -v 3000000`` a run of about 9 GB is refused in one line naming ``--batch``
    before any work, instead of dying in the allocator; the process's limit is what refuses it
    (the machine's memory alone would let it through). The case's own ``--batch 65536`` takes
    2.2 GB of address space, which fits under the limit: it trains (checked by hand)."""
    memory = estimate_memory(TrainConfig(model="A", depth=6, n_ctx=128, budget=6, steps=2, batch=262144,
                                         expected_loss=True))
    assert ULIMIT_V < memory < 4 * ULIMIT_V
    if memory > available_memory():
        pytest.skip("this machine has too little memory for the address-space limit to be the one that refuses")
    out = tmp_path / "mem"
    proc = subprocess.run([sys.executable, "-m", "fvlib", *M03, "--out", str(out)], capture_output=True, text=True,
                          cwd=ROOT, preexec_fn=_limit_address_space, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fvlib: error: --batch 262144: training needs about ")
    assert "GB there is" in lines[0] and not out.exists()


# ----------------------------------------------------------------------------------------
# The LIB: rows: library entry points refuse what cannot work, naming the argument
# ----------------------------------------------------------------------------------------
TREE = TreePrior(3, 0.5)


def test_LIB_sample_task_batch_1e12_is_refused_before_allocating():
    with pytest.raises(ValueError, match=r"^batch = 1000000000000 would need about [\d.]+ TB of memory, more than"):
        sample_task(TREE, 10**12, 8, 0.0, make_generator(0))


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float32"], ids=["int64", "bool", "str"])
def test_LIB_sample_task_dtype_int64_is_refused(dtype):
    with pytest.raises(ValueError, match=r"^dtype must be a floating-point torch.dtype"):
        sample_task(TREE, 4, 8, 0.0, make_generator(0), dtype=dtype)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_LIB_sample_task_x_nan_is_refused(bad):
    x = torch.randn(4, 8, TREE.dim)
    x[1, 2, 3] = bad
    with pytest.raises(ValueError, match=r"^x must be finite, got 1 NaN or infinite value"):
        sample_task(TREE, 4, 8, 0.0, make_generator(0), x=x)


@pytest.mark.parametrize("build", [lambda budget: model_a(TREE, budget),
                                   lambda budget: make_transformer("A", TREE, budget)], ids=["A", "transformer"])
def test_LIB_model_a_budget_over_D_is_refused(build):
    with pytest.raises(ValueError, match=r"^budget must be an integer in \[1, 7\], got 100"):
        build(100)
    assert build(7).config.budget == 7


MODELS = {"A": lambda: model_a(TREE, 3, width=8), "transformer": lambda: make_transformer("A", TREE, 3, d_model=8)}


@pytest.mark.parametrize("kind", MODELS)
def test_LIB_model_x_numpy_is_refused_saying_what_to_pass(kind):
    model, batch = MODELS[kind](), sample_task(TREE, 2, 8, 0.0, make_generator(0))
    with pytest.raises(TypeError, match=r"^x must be a torch.Tensor, got numpy.ndarray: convert it with torch.as_tens"):
        model(batch.x.numpy(), batch.y, batch.x_query)
    with pytest.raises(TypeError, match=r"^x_query must be a torch.Tensor, got list"):
        model(batch.x, batch.y, batch.x_query.tolist())
    with pytest.raises(TypeError, match=r"^y must be a floating-point tensor, got dtype torch.int64"):
        model(batch.x, batch.y.long(), batch.x_query)
    assert model(batch.x, batch.y, batch.x_query).shape == (2,)


def test_LIB_model_statistic_numpy_is_refused():
    model, batch = model_a(TREE, 3, width=8), sample_task(TREE, 2, 8, 0.0, make_generator(0)).pooled()
    with pytest.raises(TypeError, match=r"^g must be a torch.Tensor, got numpy.ndarray"):
        model.forward_statistic(batch.g.numpy(), batch.x_query)


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("returned", ["None", 3.0, [1.0]], ids=["str", "float", "list"])
def test_LIB_run_with_hooks_hook_returns_str_is_refused_naming_the_hook(kind, returned):
    model, batch = MODELS[kind](), sample_task(TREE, 2, 8, 0.0, make_generator(0))
    name = hook_name("prediction")
    with pytest.raises(TypeError, match=rf"^hook on {name} returned a {type(returned).__name__}; a hook returns None"):
        model.run_with_hooks(batch, fwd_hooks=[(name, lambda activation, hook: returned)])
