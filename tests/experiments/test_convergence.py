"""The paired-doubling convergence rule (issue 42, item 4): the pure rule, the attempt records,
and a tiny experiment trained under it (S and 2S at least, doubled up to the cap, resumed)."""

import json
from dataclasses import replace

import pytest
import torch

from fvlib import experiments
from fvlib.cli import main
from fvlib.experiments.definitions import constrained_config
from fvlib.experiments.records import Attempt, ResultError
from fvlib.experiments.rules import (
    PAIRED_RELATIVE_DROP,
    PAIRED_STDERRS,
    paired_converged,
    paired_drop,
)
from fvlib.experiments.storage import RESULTS_ENV
from fvlib.training import TrainConfig, load_history, run_dir_for, train_many

pytestmark = pytest.mark.usefixtures("one_thread")

NAME = "paired-tiny"
STEPS = 40


def _losses(n=4000, seed=0) -> torch.Tensor:
    """Per-context excess losses of a model: positive, spread like a chi-square (mean about 1)."""
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) ** 2


def _verdict(previous, this) -> bool:
    drop, stderr = paired_drop(previous, this)
    return paired_converged(drop, stderr, float(torch.as_tensor(previous).mean()))


# ----------------------------------------------------------------------------------------
# The pure rule
# ----------------------------------------------------------------------------------------
def test_paired_drop_is_the_mean_difference_and_its_standard_error():
    previous, this = [3.0, 5.0, 4.0], [1.0, 2.0, 4.0]   # differences 2, 3, 0
    drop, stderr = paired_drop(previous, this)
    assert drop == pytest.approx(5 / 3)
    assert stderr == pytest.approx(torch.tensor([2.0, 3.0, 0.0]).std().item() / 3 ** 0.5)


def test_a_drop_within_the_noise_converges():
    this = _losses()
    noise = 0.3 * torch.randn(this.numel(), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    previous = this + noise - noise.mean() + 0.5 * noise.std() / this.numel() ** 0.5   # half a SE of drop
    assert _verdict(previous, this)


def test_a_clear_drop_does_not_converge():
    this = _losses()
    previous = this * 1.05   # 5% on every context: far above 2% and the noise of a paired difference
    assert not _verdict(previous, this)
    # compared unpaired (as two independent sets of contexts), the same drop would be within the noise
    unpaired_se = ((previous.var() + this.var()) / this.numel()) ** 0.5
    assert previous.mean() - this.mean() < PAIRED_RELATIVE_DROP * previous.mean() + PAIRED_STDERRS * unpaired_se


@pytest.mark.parametrize("relative, converges", [(0.015, True), (0.025, False)], ids=["1.5%", "2.5%"])
def test_the_relative_term_decides_a_drop_without_noise(relative, converges):
    this = _losses()
    previous = this + relative * this.mean() / (1 - relative)   # the same drop on every context: SE = 0
    drop, stderr = paired_drop(previous, this)
    assert stderr < 1e-12 and drop / previous.mean() == pytest.approx(relative)
    assert paired_converged(drop, stderr, float(previous.mean())) is converges


def test_the_noise_term_counts_two_standard_errors():
    assert paired_converged(drop=0.05, drop_stderr=0.021, previous_loss=0.5)       # 0.05 < 0.01 + 0.042 ...
    assert not paired_converged(drop=0.05, drop_stderr=0.019, previous_loss=0.5)   # ... 0.05 >= 0.01 + 0.038


@pytest.mark.parametrize("previous, this", [([1.0, 2.0], [1.0]), ([1.0], [1.0]), ([[1.0, 2.0]], [[1.0, 2.0]]),
                                            ([1.0, float("nan")], [1.0, 2.0])],
                         ids=["lengths", "one-context", "two-dims", "nan"])
def test_paired_drop_refuses_vectors_it_cannot_pair(previous, this):
    with pytest.raises(ValueError, match="paired_drop"):
        paired_drop(previous, this)


def test_an_experiment_names_a_known_rule_and_the_paired_rule_doubles():
    with pytest.raises(ValueError, match="convergence must be one of"):
        experiments.Experiment("x", "x", "x", (), lambda p: {}, convergence="last-third")
    with pytest.raises(ValueError, match="max_doublings must be >= 1"):
        experiments.Experiment("x", "x", "x", (), lambda p: {}, convergence="paired-doubling", max_doublings=0)
    assert experiments.get_experiment("reference-k6").convergence == "last-fifth"


# ----------------------------------------------------------------------------------------
# The attempt record
# ----------------------------------------------------------------------------------------
def test_an_attempt_keeps_its_fields_as_stored():
    old = {"steps": 3000, "final_loss": 0.1, "converged": True}   # the last-fifth rule: no drop fields
    assert Attempt.from_dict(dict(old)).to_dict() == old
    first = {**old, "converged": False, "drop": None, "drop_stderr": None}
    assert Attempt.from_dict(dict(first)).to_dict() == first
    doubled = {**old, "steps": 6000, "drop": -0.001, "drop_stderr": 0.002}
    assert Attempt.from_dict(dict(doubled)).to_dict() == doubled


@pytest.mark.parametrize("fields, words", [
    ({"drop": 0.1}, "attempt/drop_stderr is missing"),
    ({"drop": 0.1, "drop_stderr": None}, "both null or both numbers"),
    ({"drop": float("nan"), "drop_stderr": 0.1}, "attempt/drop must be a finite number"),
    ({"drop": 0.1, "drop_stderr": -0.1}, "attempt/drop_stderr must be >= 0"),
    ({"paired": True}, "unknown fields"),
], ids=["half", "null-and-number", "nan", "negative-se", "paired-field"])
def test_a_bad_attempt_is_named(fields, words):
    with pytest.raises(ResultError, match=words):
        Attempt.from_dict({"steps": 6000, "final_loss": 0.1, "converged": False, **fields})


# ----------------------------------------------------------------------------------------
# A tiny experiment under the rule
# ----------------------------------------------------------------------------------------
def _tiny_configs(seeds=(0, 1)):
    base = constrained_config("B", steps=STEPS, prior="gaussian-twin", depth=3, alpha=0.5, n_ctx=16,
                              noise_std=0.0, budget=2)
    base = replace(base, batch=32, queries=8, width=16, eval_contexts=512)
    return [replace(base, seed=s) for s in seeds]


def _register(monkeypatch, tmp_path):
    """A tiny experiment under the paired-doubling rule registered through the library, its run
    root and results under ``tmp_path``: model B (K = 3, 40 steps, two seeds), far from
    converged, and one run of it whose learning rate is too small to move it (``B-still``, its own
    work item), converged at once; its references are an empty block (the rule needs none)."""
    runs = tuple(experiments.Run(experiments.run_key("B", c.prior, c.budget, c.seed), "B", c) for c in _tiny_configs())
    still = replace(_tiny_configs((0,))[0], lr=1e-12)
    items = (runs, (experiments.Run(experiments.run_key("B-still", still.prior, still.budget, 0), "B-still", still),))
    experiment = experiments.Experiment(NAME, "tiny", "x", items, lambda params: {"tree": {}},
                                        convergence="paired-doubling")
    monkeypatch.setitem(experiments.EXPERIMENTS, NAME, experiment)
    monkeypatch.setenv("FVLIB_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))
    return experiment, tmp_path


@pytest.fixture
def paired_tiny(monkeypatch, tmp_path):
    return _register(monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def trained(one_thread, tmp_path_factory):
    """The tiny experiment trained once, for the tests that read it."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _, tmp = _register(monkeypatch, tmp_path_factory.mktemp("paired"))
        yield experiments.run(NAME, progress=False), tmp


def test_runs_train_s_and_2s_and_their_attempts_carry_the_paired_drop(trained):
    data, tmp = trained
    assert "paired drop" in data["rules"]["convergence"] and "at most 2 doublings" in data["rules"]["convergence"]
    for key, record in data["runs"].items():
        attempts = record["attempts"]
        assert [a["steps"] for a in attempts] == [STEPS * 2 ** i for i in range(len(attempts))], key
        assert len(attempts) >= 2, key   # convergence at S needs L(2S)
        assert (attempts[0]["drop"], attempts[0]["drop_stderr"], attempts[0]["converged"]) == (None, None, False)
        for before, after in zip(attempts, attempts[1:]):
            # re-evaluated from the two final models on one set of contexts: the drop of the losses their
            # histories recorded
            assert after["drop"] == pytest.approx(before["final_loss"] - after["final_loss"], rel=1e-5)
            assert after["drop_stderr"] > 0 or record["variant"] == "B-still"   # two models that differ
            assert after["converged"] is paired_converged(after["drop"], after["drop_stderr"], before["final_loss"])
        # doubled again only while the last doubling still bought more than the rule allows
        assert [a["converged"] for a in attempts[1:-1]] == [False] * (len(attempts) - 2), key
        assert (record["converged"], record["final_loss"], record["steps"]) == (
            attempts[-1]["converged"], attempts[-1]["final_loss"], attempts[-1]["steps"])
        for a in attempts:   # every attempt's model is in the run root; none was trained twice
            config = replace(TrainConfig.from_dict(record["config"]), steps=a["steps"], eval_every=a["steps"] // 20)
            assert load_history(run_dir_for(config))[-1]["eval_excess_loss"] == a["final_loss"]


def test_a_run_still_improving_doubles_up_to_the_cap_and_is_stored_capped(trained):
    data, _ = trained
    capped = [r for r in data["runs"].values() if not r["converged"]]
    assert {r["variant"] for r in capped} == {"B"}   # 40 steps are far from converged
    for record in capped:
        assert [a["steps"] for a in record["attempts"]] == [STEPS, 2 * STEPS, 4 * STEPS]   # two doublings, no third
        before, last = record["attempts"][-2:]
        # stored with what its last doubling bought: more than the rule lets pass
        assert last["drop"] >= PAIRED_RELATIVE_DROP * before["final_loss"] + PAIRED_STDERRS * last["drop_stderr"]


def test_a_run_that_no_longer_improves_converges_at_its_first_doubling(trained):
    data, _ = trained
    still = data["runs"][experiments.run_key("B-still", "gaussian-twin", 2, 0)]
    assert [a["steps"] for a in still["attempts"]] == [STEPS, 2 * STEPS]
    assert still["converged"] is True and still["steps"] == 2 * STEPS   # its numbers are 2S's
    assert abs(still["attempts"][1]["drop"]) < 1e-6


def test_show_prints_how_many_seeds_converged(trained, capsys):
    data, _ = trained
    assert main(["experiment", "show", NAME]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("B")}
    for variant in ("B", "B-still"):
        records = [r for r in data["runs"].values() if r["variant"] == variant]
        assert f"converged {sum(r['converged'] for r in records)} of {len(records)} seeds" in rows[variant]
    assert main(["experiment", "show", NAME, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert {row["variant"]: row["converged"] for row in summary} == {
        v: sum(r["converged"] for r in data["runs"].values() if r["variant"] == v) for v in ("B", "B-still")}


def test_list_counts_the_first_doubling_of_every_paired_run(paired_tiny, capsys):
    assert main(["experiment", "list"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(NAME))
    assert "(x3 to x7 when runs are doubled)" in line   # S + 2S at least, S + 2S + 4S at most
    assert main(["experiment", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["experiments"][NAME]["convergence"] == "paired-doubling"


def test_resume_after_a_kill_between_the_doublings_does_not_retrain_s(paired_tiny):
    """S trained and checkpointed, 2S stopped half-way (a process killed before the item reached
    the result file): the run trains 2S on from its checkpoint and reads S's model from its run
    directory, leaving S's files as they were."""
    _, tmp = paired_tiny
    configs = _tiny_configs()
    first = train_many(configs, [run_dir_for(c) for c in configs], progress=False)
    doubled = [replace(c, steps=2 * STEPS, eval_every=2 * STEPS // 20) for c in configs]
    train_many(doubled, [run_dir_for(c) for c in doubled], progress=False, until_step=STEPS)
    files = sorted(p for c in configs for p in run_dir_for(c).iterdir() if p.is_file() and p.suffix != ".lock")
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files}
    data = experiments.run(NAME, progress=False)
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files} == before
    for result, config in zip(first, configs):
        record = data["runs"][experiments.run_key("B", config.prior, config.budget, config.seed)]
        assert record["attempts"][0]["final_loss"] == result.final_loss
        assert record["attempts"][1]["steps"] == 2 * STEPS and record["attempts"][1]["drop"] is not None
