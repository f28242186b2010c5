"""fvlib.experiments: the named experiments, their result files, resume, verification, the CLI."""

import functools
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fvlib import experiments
from fvlib.cli import main
from fvlib.experiments import beside_theory, references, runner
from fvlib.experiments.definitions import constrained_config, same_config
from fvlib.experiments.records import ResultFile, new_result
from fvlib.experiments.references import tree_theory
from fvlib.experiments.storage import RESULTS_ENV, write_result
from fvlib.experiments.verify import check_theory, stack_of
from fvlib.training import ADDED_FIELDS, TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")

RESULTS = Path(__file__).resolve().parents[2] / "results"


def write_sealed(path: Path, data: dict) -> None:
    """``data`` (a result file's JSON, edited) written back by the store's own writer, sealed: a
    change the store made itself, which only the other checks can catch."""
    write_result(path, ResultFile.from_dict(data, str(path)))


def _tiny_item(variant, prior, seeds, steps=40):
    base = constrained_config(variant, steps=steps, prior=prior, depth=3, alpha=0.5, n_ctx=32,
                              noise_std=0.0, budget=3)
    base = replace(base, batch=32, queries=16, width=32,
                   router_warm_start=10 if variant.endswith("warm") else 0)
    configs = [replace(base, seed=s) for s in seeds]
    return tuple(experiments.Run(experiments.run_key(variant, c.prior, c.budget, c.seed), variant, c) for c in configs)


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    """A tiny stand-in for depth-sweep-k6 (K = 3, 40 steps): the store's code path, in seconds."""
    items = (_tiny_item("A-scratch", "tree", (0, 1)), _tiny_item("B", "gaussian-twin", (0, 1)))
    experiment = experiments.Experiment("depth-sweep-k6", "tiny", "x", items,
                                  tree_theory(3, 0.5, 32, 0.0, range(1, 4)), gap_variants=("A-scratch",))
    monkeypatch.setitem(experiments.EXPERIMENTS, "depth-sweep-k6", experiment)
    monkeypatch.setattr(references, "OPTIMISER_STARTS", 2)   # the best of two starts: quicker, the same code path
    # shorter optimisations of the references (the same code path; their quality is tested in tests/theory)
    monkeypatch.setattr(references, "optimise_directions", functools.partial(references.optimise_directions, steps=40))
    monkeypatch.setattr(references, "optimise_adaptive_policy",
                        functools.partial(references.optimise_adaptive_policy, steps=20, validation=1000))
    monkeypatch.setattr(beside_theory, "optimise_directions", references.optimise_directions)
    monkeypatch.setattr(beside_theory, "optimise_adaptive_policy", references.optimise_adaptive_policy)
    monkeypatch.setenv("FVLIB_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))
    return experiment, tmp_path


def test_run_writes_every_field_and_resumes(tiny):
    experiment, tmp = tiny
    data = experiments.run("depth-sweep-k6", progress=False, max_items=1)
    assert len(data["runs"]) == 2  # one item stored, the other not yet
    stored = json.loads((tmp / "results" / "depth-sweep-k6.json").read_text())
    record = stored["runs"]["A-scratch/tree/M3/seed0"]
    for field in ("config", "final_loss", "final_stderr", "history", "converged", "steps", "attempts",
                  "provenance", "greedy_paired", "gap"):
        assert field in record, field
    assert TrainConfig.from_dict(record["config"]).seed == 0
    assert record["history"][-1]["eval_excess_loss"] == record["final_loss"]
    for field in ("commit", "torch", "device", "threads", "wall_seconds", "cpu_seconds", "date", "fvlib"):
        assert field in record["provenance"], field
    # 40 steps are far from converged: each run was retrained with doubled steps, twice
    assert [a["steps"] for a in record["attempts"]] == [40, 80, 160]
    assert record["converged"] is False and record["steps"] == 160
    assert stored["theory"]["budgets"] == [1, 2, 3] and stored["theory"]["samples"] == experiments.THEORY_SAMPLES
    # the file states how verify judges it and what counts as converged
    assert (stored["rules"]["tolerance"], stored["rules"]["theory_tolerance"]) == (
        experiments.TOLERANCE_RULE.format(rtol=experiment.final_rtol), experiments.THEORY_TOLERANCE_RULE)
    assert "at most 2 times" in stored["rules"]["convergence"]
    # resuming trains only what is missing; the stored runs are kept as they are
    again = experiments.run("depth-sweep-k6", progress=False)
    assert len(again["runs"]) == 4
    assert again["runs"]["A-scratch/tree/M3/seed0"] == record
    rows = {(r["variant"], r["prior"]): r for r in experiments.summarise(again)}
    assert rows[("B", "gaussian-twin")]["seeds"] == [0, 1] and "ratio_mean" not in rows[("B", "gaussian-twin")]
    assert rows[("A-scratch", "tree")]["ratio_mean"] > 0
    seed_records = sorted((r for r in again["runs"].values() if r["variant"] == "A-scratch"),
                          key=lambda r: r["seed"])
    assert rows[("A-scratch", "tree")]["loss_stderr"] == [r["final_stderr"] for r in seed_records]
    assert "4 of 4 runs stored" in experiments.provenance_line(again)
    sweep = experiments.depth_sweep_of(again, ["A-scratch"])
    assert list(sweep.budgets) == [3] and sweep.seed_loss["A-scratch"].shape == (2, 1)


def test_verify_reproduces_and_fails_on_a_changed_number(tiny):
    _, tmp = tiny
    experiments.run("depth-sweep-k6", progress=False)
    report = experiments.verify("depth-sweep-k6", runs=1, full=True)
    assert report["ok"] and report["configs_rebuilt"] == 4 and report["mode"] == "full"
    checked = report["checked"][0]
    assert checked["key"].startswith("B/")  # the cheapest run
    assert checked["difference"] == 0.0   # batched as it was stored, on the same CPU: the same bits
    path = tmp / "results" / "depth-sweep-k6.json"
    data = json.loads(path.read_text())
    for key in data["runs"]:
        if key.startswith("B/"):   # a number that no longer reproduces, re-sealed: verify must catch it
            record = data["runs"][key]
            record["final_loss"] = record["history"][-1]["eval_excess_loss"] = \
                record["attempts"][-1]["final_loss"] = 1.5 * record["final_loss"]
    write_sealed(path, data)
    assert not experiments.verify("depth-sweep-k6", runs=1, full=True)["ok"]
    assert main(["experiment", "verify", "depth-sweep-k6", "--full"]) == 2


def test_the_quick_check_retrains_a_prefix_per_family_and_fails_on_a_changed_history(tiny):
    """verify's default: one run per model family (A here of two layers or more), retrained to its
    first evaluation, compared with the stored history within the definition's tolerance."""
    experiment, tmp = tiny
    experiments.run("depth-sweep-k6", progress=False)
    report = experiments.verify("depth-sweep-k6")
    assert report["ok"] and report["mode"] == "prefix"
    assert sorted(c["key"].split("/")[0] for c in report["checked"]) == ["A-scratch", "B"]
    data = json.loads((tmp / "results" / "depth-sweep-k6.json").read_text())
    assert data["rules"]["prefix"] == experiments.PREFIX_RULE.format(rtol=experiment.prefix_rtol)
    for check in report["checked"]:
        record = data["runs"][check["key"]]
        # the first run of its stack retrained beside a second one, on the same CPU: the same
        # bits; a later one alone: its last bits apart
        first = stack_of(data, check["key"])[0] == check["key"]
        assert check["steps"] == record["history"][1]["step"]
        assert check["relative"] == 0.0 if first else check["relative"] < 1e-6, (check, first)
    key = report["checked"][0]["key"]
    data["runs"][key]["history"][1]["eval_excess_loss"] *= 1 + 2 * experiment.prefix_rtol
    write_sealed(tmp / "results" / "depth-sweep-k6.json", data)
    assert not experiments.verify("depth-sweep-k6", theory=False)["ok"]
    assert main(["experiment", "verify", "depth-sweep-k6", "--no-theory"]) == 2
    assert main(["experiment", "verify", "depth-sweep-k6", "--runs", "2"]) == 2  # --runs needs --full


@pytest.mark.slow
def test_a_one_line_change_to_the_gated_router_fails_the_quick_check(monkeypatch):
    """The check make test runs catches a change to what model A computes: the gated router's
    forward without its gate (``measure(x, self.base)``, one line) trains another model."""
    from fvlib.routers import GatedRouter, measure

    assert experiments.verify("recipes-a", theory=False)["ok"]
    monkeypatch.setattr(GatedRouter, "forward", lambda self, x, workspace: measure(x, self.base))
    report = experiments.verify("recipes-a", theory=False)
    assert not report["ok"] and report["checked"][0]["relative"] > 2 * experiments.PREFIX_RTOL


def test_verify_recomputes_the_theory_and_run_refreshes_it(tiny, capsys):
    """A stored reference that today's code no longer gives fails verification (the runs still
    reproduce), and `experiment run --refresh-theory` recomputes it, keeping the runs."""
    _, tmp = tiny
    experiments.run("depth-sweep-k6", progress=False)
    report = experiments.verify("depth-sweep-k6", runs=1)
    assert report["ok"] and report["theory"]["differences"] == [] and report["theory"]["checked"] > 30
    path = tmp / "results" / "depth-sweep-k6.json"
    data = json.loads(path.read_text())
    assert data["theory_provenance"]["commit"] == data["runs"]["B/gaussian-twin/M3/seed0"]["provenance"]["commit"]
    data["theory"]["curves"]["nonadaptive_opt"]["mean"][1] += 0.1      # a reference of older code
    write_sealed(path, data)
    report = experiments.verify("depth-sweep-k6", runs=1)
    assert report["checked"][0]["ok"] and not report["ok"]
    assert [d["path"] for d in report["theory"]["differences"]] == ["curves/nonadaptive_opt/mean/1"]
    assert experiments.verify("depth-sweep-k6", runs=1, theory=False)["ok"]
    assert main(["experiment", "verify", "depth-sweep-k6"]) == 2
    assert "--refresh-theory" in capsys.readouterr().err
    assert main(["experiment", "run", "depth-sweep-k6", "--refresh-theory", "--no-progress"]) == 0
    fresh = json.loads(path.read_text())
    assert fresh["runs"] == data["runs"] and experiments.verify("depth-sweep-k6", runs=1)["ok"]


def test_refresh_theory_recomputes_only_the_references(tiny, monkeypatch):
    """refresh_theory trains nothing, even with runs missing, and keeps every stored run; the
    references and their parameters file are written anew."""
    _, tmp = tiny
    with pytest.raises(experiments.ResultError, match="no stored result"):
        experiments.refresh_theory("depth-sweep-k6")
    first = experiments.run("depth-sweep-k6", progress=False, max_items=1)
    params = tmp / "results" / "depth-sweep-k6.theory.safetensors"
    assert params.is_file() and first["theory"]["optimiser_starts"] == 2
    params.unlink()

    def no_training(*args, **kwargs):
        raise AssertionError("refresh_theory trained a run")

    monkeypatch.setattr(runner, "_train_item", no_training)
    monkeypatch.setattr(runner, "train_many", no_training)
    data = experiments.refresh_theory("depth-sweep-k6")
    assert data["runs"] == first["runs"] and len(data["runs"]) == 2 and params.is_file()
    assert json.loads((tmp / "results" / "depth-sweep-k6.json").read_text())["theory"] == data["theory"]
    assert check_theory("depth-sweep-k6", data)["differences"] == []


def test_load_result_refuses_missing_corrupt_and_foreign_files(tiny, capsys):
    _, tmp = tiny
    with pytest.raises(experiments.ResultError, match="experiment run depth-sweep-k6"):
        experiments.load_result("depth-sweep-k6")
    experiments.run("depth-sweep-k6", progress=False, max_items=1)
    with pytest.raises(experiments.ResultError, match="incomplete: 2 of 4"):
        experiments.load_result("depth-sweep-k6", complete=True)
    path = tmp / "results" / "depth-sweep-k6.json"
    data = json.loads(path.read_text())
    key = next(iter(data["runs"]))
    data["runs"][key]["config"]["lr"] = 0.5
    write_sealed(path, data)
    with pytest.raises(experiments.ResultError, match="another definition"):
        experiments.load_result("depth-sweep-k6")
    path.write_text("{not json")
    with pytest.raises(experiments.ResultError, match="corrupt"):
        experiments.load_result("depth-sweep-k6")
    assert main(["experiment", "show", "depth-sweep-k6"]) == 2
    assert "corrupt result file" in capsys.readouterr().err


HOLDER = """
import sys, time
from fvlib.files import ExclusiveLock
with ExclusiveLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_a_second_writer_is_refused_and_a_dead_ones_lock_is_taken_over(tiny):
    _, tmp = tiny
    lock = tmp / "results" / "depth-sweep-k6.json.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"   # a live process holds it
        with pytest.raises(experiments.ResultError, match=f"another `experiment run` \\(pid {holder.pid}\\)"):
            experiments.run("depth-sweep-k6", progress=False, max_items=1)
    finally:
        holder.kill()   # a writer killed: the kernel releases its lock
        holder.wait(timeout=60)
    experiments.run("depth-sweep-k6", progress=False, max_items=1)


def test_converged_reads_the_last_fifth():
    def hist(values, steps=100):
        return [{"step": s, "eval_excess_loss": v} for s, v in zip(range(0, steps + 1, steps // 5), values)]
    assert experiments.converged(hist([1, 0.5, 0.3, 0.2, 0.100, 0.099]), 100)
    assert not experiments.converged(hist([1, 0.5, 0.3, 0.2, 0.100, 0.097]), 100)
    assert experiments.converged(hist([1, 0.5, 0.3, 0.2, 0.100, 0.120]), 100)  # a rise is no fall
    assert not experiments.converged(hist([1, 0.5, 0.3, 0.2, 0.100, float("nan")]), 100)
    assert not experiments.converged(hist([1, 0.5, 0.3, 0.2, 0.1, 0.1])[:-1], 100)  # unfinished


def test_cli_list_and_bad_input(capsys):
    assert main(["experiment", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["experiments"]
    assert {"depth-sweep-k6", "depth-sweep-k7", "transformers-k4", "reference-k6"} <= set(listed)
    for entry in listed.values():
        assert entry["runs"] >= 3 and entry["estimated_cpu_minutes"] > 0
    for argv in (["experiment", "run", "nope"], ["experiment", "verify", "depth-sweep-k6", "--runs", "0"],
                 ["experiment", "run", "reference-k6", "--device", "tpu"], ["experiment", "show"],
                 ["experiment"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("name", experiments.experiment_names())
def test_every_experiment_has_three_seeds_per_point_and_buildable_configs(name):
    experiment = experiments.get_experiment(name)
    keys = [r.key for r in experiment.runs]
    assert len(keys) == len(set(keys))
    points = {}
    for r in experiment.runs:
        r.config.model_config()
        points.setdefault((r.variant, r.config.prior, r.config.budget), []).append(r.config.seed)
    # five seeds for the transformers (they fail sometimes), two for the recipe ablation (a table
    # of what each change buys, at two configurations), three elsewhere
    least = 5 if name.startswith("transformers") else 2 if name.startswith("recipes") else 3
    assert min(len(s) for s in points.values()) >= least


STORED = sorted(p.stem for p in RESULTS.glob("*.json"))


@pytest.mark.parametrize("name", STORED)
def test_every_stored_result_loads_and_its_configs_build(name):
    data = experiments.load_result(name)
    paired = experiments.get_experiment(name).convergence == "paired-doubling"
    for record in data["runs"].values():
        config = TrainConfig.from_dict(record["config"])
        config.model_config()
        assert record["history"][-1]["step"] == config.steps
        assert record["history"][-1]["eval_excess_loss"] == record["final_loss"]
        attempts = record["attempts"]
        if paired:   # each doubling judged by its paired drop from the attempt before it
            assert len(attempts) >= 2 and not attempts[0]["converged"], record["key"]
            assert record["converged"] == attempts[-1]["converged"] == experiments.paired_converged(
                attempts[-1]["drop"], attempts[-1]["drop_stderr"], attempts[-2]["final_loss"]), record["key"]
        else:
            assert record["converged"] == experiments.converged(record["history"], config.steps)
        key = experiments.run_key(record["variant"], config.prior, config.budget, config.seed)
        assert data["runs"][key] is record, key
    # the rules the file states are the ones verify and run apply today
    final_rtol = experiments.get_experiment(name).final_rtol
    assert data["rules"]["tolerance"] == experiments.TOLERANCE_RULE.format(rtol=final_rtol)
    assert data["rules"]["theory_tolerance"] == experiments.THEORY_TOLERANCE_RULE, "run `experiment run` to update"
    # the optimised parameters of its references beside it, found as the file says
    _, metadata = experiments.load_theory_params(name)
    assert int(metadata["optimiser_starts"]) == data["theory"]["optimiser_starts"] == experiments.OPTIMISER_STARTS


@pytest.mark.parametrize("name", STORED)
def test_the_catalogue_defines_every_stored_run_with_its_stored_config(name):
    """A recipe change must not rename or redefine a stored run: every run of
    results/NAME.json has a key of the catalogue, and the catalogue's config of that key is the
    stored one field by field (a run the store retrained with doubled steps stores the doubled
    schedule), written out here rather than through same_config."""
    stored = json.loads((RESULTS / f"{name}.json").read_text())["runs"]
    defined = {r.key: r.config.to_dict() for r in experiments.get_experiment(name).runs}
    assert stored and set(stored) <= set(defined), sorted(set(stored) - set(defined))
    for key, record in stored.items():
        want = defined[key]
        factor = record["config"]["steps"] // want["steps"]
        assert factor in (1, 2, 4, 8), key
        want = {**want, "steps": want["steps"] * factor, "eval_every": want["eval_every"] * factor}
        # fields added to TrainConfig after the run was stored: absent there, and read at the
        # value that changes nothing (ADDED_FIELDS; alpha_ramp, unused without alpha_start)
        missing = set(want) - set(record["config"])
        assert missing <= set(ADDED_FIELDS) | {"alpha_ramp"}, (key, sorted(missing))
        assert "alpha_ramp" not in missing or want["alpha_start"] is None, key
        assert TrainConfig.from_dict(record["config"]).to_dict() == want, key


def test_the_store_names_its_recipes():
    """A-scratch has no teacher (RECIPE), A-learn neither (the learning recipe), A-warm the
    imitation warm start; the bottlenecked A' its recipe and the stated changes only; B, C and the
    other transformers keep the warm-start fields they were stored with, which act on nothing."""
    from fvlib.training import (
        IMITATION_RECIPE,
        RECIPE,
        TRANSFORMER_RECIPE,
        curriculum_start,
        recipe_for,
    )

    for name in experiments.experiment_names():
        for r in experiments.get_experiment(name).runs:
            c = r.config
            if c.statistic:   # the controls experiments: the one recipe for every model, no teacher
                want = recipe_for("constrained", c.prior, c.alpha)
                assert {k: getattr(c, k) for k in want} == want and c.router_warm_start == 0, r.key
                assert not c.warm_starts and r.variant in experiments.CONTROL_VARIANTS, r.key
            elif r.variant == "A-scratch":
                assert {k: getattr(c, k) for k in RECIPE} == RECIPE and not c.warm_starts
            elif r.variant == "A-learn":   # the learning recipe of `fvlib train`, no teacher
                want = recipe_for("constrained", c.prior, c.alpha)
                assert {k: getattr(c, k) for k in want} == want and not c.warm_starts
                assert c.router_warm_start == 0 and c.expected_loss and c.alpha_start > c.alpha
            elif r.variant == "A-warm":
                assert {k: getattr(c, k) for k in IMITATION_RECIPE} == IMITATION_RECIPE
                assert c.warm_starts == (c.prior == "tree")
            elif r.variant in experiments.TRANSFORMER_RECIPE_STEPS:   # A' (transformers-k4, recipes-transformer-k4)
                assert c.arch == "transformer" and c.model == "A" and not c.warm_starts
                assert c.router_warm_start == IMITATION_RECIPE["router_warm_start"]   # stored field, acts on nothing
                base = TRANSFORMER_RECIPE
                changes = {k: v for k, v in c.to_dict().items() if k in base and v != base[k]}
                changes |= {"alpha_start": c.alpha_start} if c.alpha_start is not None else {}
                assert set(changes) == set(experiments.TRANSFORMER_RECIPE_STEPS[r.variant]), (r.key, changes)
                assert c.alpha_start in (None, curriculum_start(c.alpha))
            elif r.variant in experiments.RECIPE_STEPS:   # recipes-a: RECIPE and its changes, no teacher
                assert c.router_warm_start == 0 and not c.warm_starts and c.model == "A"
                base = {**RECIPE, "batch": 256}
                changes = {k: v for k, v in c.to_dict().items() if k in base and v != base[k]}
                changes |= {k: getattr(c, k) for k in ("expected_loss", "alpha_start") if getattr(c, k)}
                assert set(changes) == set(experiments.RECIPE_STEPS[r.variant]), (r.key, changes)
            else:
                assert c.router_warm_start == IMITATION_RECIPE["router_warm_start"] and not c.warm_starts


def test_last_fifth_drop_is_the_relative_fall():
    hist = [{"step": s, "eval_excess_loss": v} for s, v in zip(range(0, 101, 20), [1, 0.5, 0.3, 0.2, 0.1, 0.09])]
    assert experiments.last_fifth_drop(hist, 100) == pytest.approx(0.1)
    assert experiments.last_fifth_drop(hist[:-1], 100) != experiments.last_fifth_drop(hist[:-1], 100)  # nan: unfinished


def test_doubling_gain_compares_the_last_two_attempts():
    record = {"attempts": [{"steps": 3000, "final_loss": 0.5}, {"steps": 6000, "final_loss": 0.4},
                           {"steps": 12000, "final_loss": 0.3}]}
    assert experiments.doubling_gain(record) == pytest.approx(0.25)
    record["attempts"][-1]["final_loss"] = 0.44          # the longer run ended higher
    assert experiments.doubling_gain(record) == pytest.approx(-0.1)
    assert np.isnan(experiments.doubling_gain({"attempts": record["attempts"][:1]}))


def _sweep_result(losses: dict, theory: dict) -> dict:
    """A result dict with the given final losses {(variant, budget, seed): loss}."""
    runs = {}
    for (variant, budget, seed), loss in losses.items():
        key = experiments.run_key(variant, "tree", budget, seed)
        runs[key] = {"key": key, "variant": variant, "prior": "tree", "budget": budget, "seed": seed,
                     "config": {"model": variant[0], "arch": "constrained"}, "final_loss": loss,
                     "final_stderr": 0.01 * loss, "converged": True, "steps": 100,
                     "attempts": [{"steps": 100, "final_loss": loss, "converged": True}],
                     "history": [{"step": 80, "eval_excess_loss": loss}, {"step": 100, "eval_excess_loss": loss}]}
    return {"experiment": "x", "planned_runs": list(runs), "runs": runs, "theory_kind": "depth-sweep",
            "theory": theory}


def test_decay_fits_recover_an_exponential_and_a_power_law():
    budgets = [1, 2, 3, 4]
    losses = {("A", m, s): 0.5 ** m * (1 + 0.01 * s) for m in budgets for s in (0, 1)}
    losses |= {("B", m, s): m ** -1.0 * (1 + 0.01 * s) for m in budgets for s in (0, 1)}
    theory = {"budgets": budgets, "curves": {"adaptive_greedy": {"mean": [0.25 ** m for m in budgets],
                                                                 "stderr": [0.0] * 4}}}
    rows = {(r["curve"], r["seed"]): r for r in experiments.decay_fits(_sweep_result(losses, theory), ["A", "B"],
                                                                 ["adaptive_greedy"])}
    assert rows["A", 0]["factor"] == pytest.approx(2.0) and rows["A", "mean"]["fit"].best == "exponential"
    assert rows["B", 1]["fit"].best == "power" and rows["B", 1]["fit"].power_exponent == pytest.approx(-1.0)
    assert rows["adaptive_greedy", "theory"]["factor"] == pytest.approx(4.0)
    assert rows["A", 0]["drops"] == pytest.approx([2.0, 2.0, 2.0])
    head = experiments.decay_fits(_sweep_result(losses, theory), ["A"], budgets=[1, 2, 3])
    assert head[0]["budgets"] == [1, 2, 3] and len(head[0]["drops"]) == 2


def test_sweep_table_rows_blank_a_budget_not_stored_for_every_seed():
    curves = {n: {"mean": [0.4, 0.2], "stderr": [0.0, 0.0]} for n in ("adaptive_greedy", "adaptive_opt")}
    curves["adaptive_opt"]["mean"] = [0.5, 0.1]
    curves["nonadaptive_coord"] = {"mean": [0.9, 0.9], "stderr": [0.0, 0.0]}
    losses = {("A", 1, 0): 0.3, ("A", 1, 1): 0.5, ("A", 2, 0): 0.05}           # M = 2: seed 0 only
    result = _sweep_result(losses, {"budgets": [1, 2], "curves": curves})
    rows = {r[0]: r[1:] for r in experiments.sweep_table_rows(result, ["A"], ["adaptive_opt"])}
    assert rows["A: mean loss"] == [pytest.approx(0.4), ""]
    assert rows["A: / best adaptive"] == [pytest.approx(0.4 / 0.4), ""]      # best: min(greedy, opt) per budget
    assert rows["A: sd over seeds"][0] == pytest.approx(np.std([0.3, 0.5], ddof=1))
    assert rows["A: steps"] == ["0k/0k", ""] and rows["A: not converged"] == [0, ""]
    # both seeds at M = 1 end 10% below the heap-order coordinates (0.9): none failed
    assert rows["A: failed seeds"] == [0, ""] and rows["A: mean without failed"] == [pytest.approx(0.4), ""]
    assert rows["theory: adaptive_opt"] == [0.5, 0.1] and "theory: adaptive_greedy" not in rows
    curves["nonadaptive_coord"]["mean"] = [0.5, 0.9]                          # now 0.5 fails at M = 1
    result = _sweep_result(losses, {"budgets": [1, 2], "curves": curves})
    rows = {r[0]: r[1:] for r in experiments.sweep_table_rows(result, ["A"], [])}
    assert rows["A: failed seeds"][0] == 1 and rows["A: mean without failed"][0] == pytest.approx(0.3)
    assert rows["A: mean loss"][0] == pytest.approx(0.4)                     # the mean keeps every seed


def test_failed_runs_by_the_rule_and_point_rows_without_them():
    theory = {"budgets": [2], "curves": {"nonadaptive_coord": {"mean": [0.3], "stderr": [0.0]}}}
    data = _sweep_result({("A", 2, 0): 0.1, ("A", 2, 1): 0.29, ("A", 2, 2): 0.12}, theory)  # 0.29 > 0.9 * 0.3
    assert [experiments.failed(data, r) for r in data["runs"].values()] == [False, True, False]
    (row,) = experiments.point_rows(data)
    assert row["failed"] == [1] and row["mean_ok"] == pytest.approx(0.11)
    refs = {"theory_kind": "references", "theory": {"A/gaussian-twin": {"value": 0.4}, "C/tree": {"value": 0.37},
                                                    "tree": {"nonadaptive_coord": {"mean": 0.3}}}}
    record = {"prior": "gaussian-twin", "budget": 4, "final_loss": 0.61,
              "config": {"model": "A", "arch": "constrained"}}
    assert experiments.failed(refs, record) and not experiments.failed(refs, {**record, "final_loss": 0.59})
    linear = {"prior": "tree", "budget": 4, "final_loss": 0.38, "config": {"model": "C", "arch": "constrained"}}
    assert not experiments.failed(refs, linear)  # C is measured against LMMSE, not the coordinates
    assert experiments.failed(refs, {**linear, "config": {"model": "B", "arch": "constrained"}})


def test_depth_sweep_drops_the_budgets_with_a_failed_seed_when_asked():
    theory = {"budgets": [1, 2, 3, 4], "curves": {"nonadaptive_coord": {"mean": [0.6, 0.5, 0.4, 0.3],
                                                                         "stderr": [0.0] * 4}}}
    losses = {("A", m, s): 0.5 ** m for m in (1, 2, 3, 4) for s in (0, 1)} | {("A", 3, 1): 2.0}
    data = _sweep_result(losses, theory)                     # seed 1 fails at M = 3
    assert experiments.depth_sweep_of(data, ["A"]).budgets.tolist() == [1, 2, 3, 4]
    kept = experiments.depth_sweep_of(data, ["A"], drop_failed=True)
    assert kept.budgets.tolist() == [1, 2, 4] and kept.loss["A"].tolist() == [0.5, 0.25, 0.0625]
    (mean,) = [r for r in experiments.decay_fits(data, ["A"], drop_failed=True) if r["seed"] == "mean"]
    assert mean["budgets"] == [1, 2, 4] and mean["factor"] == pytest.approx(2.0)


def test_depth_sweep_at_a_shorter_training_reads_the_earlier_attempts():
    theory = {"budgets": [1, 2, 3], "curves": {"nonadaptive_coord": {"mean": [0.6, 0.5, 0.4],
                                                                      "stderr": [0.0] * 3}}}
    data = _sweep_result({("A", m, 0): 0.5 ** m for m in (1, 2, 3)}, theory)
    for record in data["runs"].values():                 # converged within 50 steps
        record["steps"], record["attempts"] = 50, [{"steps": 50, "final_loss": record["final_loss"]}]
    capped = data["runs"][experiments.run_key("A", "tree", 3, 0)]
    capped["attempts"] = [{"steps": 50, "final_loss": 0.45}, {"steps": 100, "final_loss": 0.125}]
    assert experiments.attempt_loss(capped) == (0.125, capped["final_stderr"])
    loss, se = experiments.attempt_loss(capped, 60)
    assert loss == 0.45 and np.isnan(se)
    assert experiments.attempt_loss(capped, 100) == (0.125, capped["final_stderr"])
    with pytest.raises(ValueError, match="max_steps=40"):
        experiments.attempt_loss(capped, 40)
    assert experiments.depth_sweep_of(data, ["A"], max_steps=100).loss["A"].tolist() == [0.5, 0.25, 0.125]
    assert experiments.depth_sweep_of(data, ["A"], max_steps=60).loss["A"].tolist() == [0.5, 0.25, 0.45]
    # at 60 steps the M = 3 run is above 0.9 x the coordinates' 0.4: failed there, not at 100
    assert experiments.depth_sweep_of(data, ["A"], drop_failed=True, max_steps=60).budgets.tolist() == [1, 2]
    assert experiments.depth_sweep_of(data, ["A"], drop_failed=True).budgets.tolist() == [1, 2, 3]
    (mean,) = [r for r in experiments.decay_fits(data, ["A"], max_steps=100) if r["seed"] == "mean"]
    assert mean["factor"] == pytest.approx(2.0)


def test_stored_reads_the_store_or_recomputes_elsewhere(tiny):
    _, tmp = tiny
    with pytest.raises(experiments.ResultError, match="experiment run depth-sweep-k6"):
        experiments.stored("depth-sweep-k6")
    data = experiments.stored("depth-sweep-k6", recompute=True, device="cpu", directory=tmp / "again", progress=False)
    assert len(data["runs"]) == 4 and (tmp / "again" / "depth-sweep-k6.json").is_file()
    assert not (tmp / "results" / "depth-sweep-k6.json").exists()


def test_experiment_warm_and_reproduce_are_verbs_of_the_family(capsys):
    assert main(["experiment", "warm", "--jobs", "0"]) == 2
    assert "--jobs" in capsys.readouterr().err
    assert main(["experiment", "reproduce"]) == 2  # --out is required
    assert "--out" in capsys.readouterr().err


def test_an_experiment_without_doublings_accepts_only_its_own_steps():
    """recipes-a compares recipes at a fixed number of steps: its runs are never doubled, so a
    stored config with twice the steps is of another definition there, and not elsewhere."""
    experiment = experiments.get_experiment("recipes-a")
    assert experiment.max_doublings == 0
    assert experiments.get_experiment("depth-sweep-k6").max_doublings == experiments.MAX_DOUBLINGS
    config = experiment.runs[0].config
    doubled = {**config.to_dict(), "steps": 2 * config.steps, "eval_every": 2 * config.steps // 20}
    assert same_config(config.to_dict(), config, 0)
    assert not same_config(doubled, config, 0)
    assert same_config(doubled, config, 2)
    assert "at most 0 times" in new_result(experiment).rules.convergence


def test_failure_rule_reads_a_theory_kept_per_budget():
    """recipes-a keeps one reference set per task, by budget: a run fails when it does not end
    10% below the heap-order coordinates of its own budget."""
    theory = {"M5": {"nonadaptive_coord": {"mean": 0.2}}, "M6": {"nonadaptive_coord": {"mean": 0.1}}}
    data = {"theory_kind": "per-budget", "theory": theory}
    run = {"prior": "tree", "budget": 6, "config": {"model": "A", "arch": "constrained"}}
    assert not experiments.failed(data, {**run, "final_loss": 0.05})
    assert experiments.failed(data, {**run, "final_loss": 0.095})
    assert not experiments.failed(data, {**run, "budget": 5, "final_loss": 0.095})


def test_the_readme_store_table_is_the_stored_provenance():
    """Each row of the README's table of stored experiments states what ``results/NAME.json``
    holds: the runs stored out of those planned, and the CPU hours of its provenance."""
    root = Path(__file__).resolve().parents[2]
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| [^|]+ \| (\d+) of (\d+) \| ([\d.]+)", (root / "README.md").read_text(),
                      flags=re.M)
    assert {name for name, *_ in rows} == set(STORED)
    for name, runs, planned, hours in rows:
        data = experiments.load_result(name, root / "results")
        summary = experiments.provenance_summary(data)
        assert (int(runs), int(planned)) == (summary["runs"], len(data["planned_runs"])), name
        assert float(hours) == round(summary["cpu_seconds"] / 3600, 1), name


def test_theory_differences_follow_the_stated_rule():
    """A Monte Carlo mean of a strategy that chooses its measurements may move within 3 stored
    standard errors, its standard error by 10%; any other number (a fixed rule's Monte Carlo
    mean too) by a relative 1e-6; a changed name or a missing value is a difference."""
    stored = {"curves": {"adaptive_opt": {"mean": [0.5, 0.2], "stderr": [0.01, 0.01]},
                         "nonadaptive_opt": {"mean": [0.6, 0.3], "stderr": [0.01, 0.01]}}, "tau2": 0.25,
              "A/tree": {"name": "adaptive_greedy", "value": 0.1, "stderr": 0.002},
              "B/tree": {"name": "nonadaptive_opt", "value": 0.3, "stderr": 0.002}, "budgets": [1, 2]}
    same = json.loads(json.dumps(stored))
    assert experiments.theory_differences(stored, same) == []
    moved = json.loads(json.dumps(stored))
    moved["curves"]["adaptive_opt"]["mean"][1] = 0.2 + 0.029           # within 3 s.e.
    moved["curves"]["adaptive_opt"]["stderr"][0] = 0.0105              # within 10%
    moved["curves"]["nonadaptive_opt"]["mean"][1] = 0.3 * (1 + 5e-7)   # rounding
    moved["A/tree"]["value"] = 0.1 - 0.0059
    assert experiments.theory_differences(stored, moved) == []
    moved["curves"]["adaptive_opt"]["mean"][0] = 0.5 + 0.031           # beyond 3 s.e.
    moved["curves"]["nonadaptive_opt"]["mean"][0] = 0.6 + 0.001        # a fixed rule: within 3 s.e., still moved
    moved["curves"]["nonadaptive_opt"]["stderr"][1] = 0.0105
    moved["B/tree"]["value"] = 0.3 + 0.001
    moved["tau2"] = 0.25 * (1 + 1e-5)                                   # a closed form that moved
    moved["A/tree"]["name"] = "adaptive_opt"
    del moved["budgets"][1]
    paths = [d["path"] for d in experiments.theory_differences(stored, moved)]
    assert paths == ["A/tree/name", "B/tree/value", "budgets/1", "curves/adaptive_opt/mean/0",
                     "curves/nonadaptive_opt/mean/0", "curves/nonadaptive_opt/stderr/1", "tau2"], paths


def test_run_plans_the_runs_a_grown_definition_adds(tiny, monkeypatch):
    """Runs added to an experiment's definition after its file was started are planned (and
    trained) by the next `experiment run`; the stored runs stay as they are."""
    experiment, tmp = tiny
    first = experiments.run("depth-sweep-k6", progress=False, max_items=1)
    assert len(first["planned_runs"]) == 4
    grown = replace(experiment, items=experiment.items + (_tiny_item("A-scratch", "tree", (2,)),))
    monkeypatch.setitem(experiments.EXPERIMENTS, "depth-sweep-k6", grown)
    data = experiments.run("depth-sweep-k6", progress=False)
    assert data["planned_runs"] == [r.key for r in grown.runs] and len(data["planned_runs"]) == 5
    stored = json.loads((tmp / "results" / "depth-sweep-k6.json").read_text())
    assert stored["planned_runs"] == data["planned_runs"] and len(stored["runs"]) == 5
    assert all(stored["runs"][k] == v for k, v in first["runs"].items())


def test_run_brings_an_older_files_rules_up_to_date_without_training(tiny):
    """A complete file written before a rule was stated (or with an older wording) gains
    today's rules from `experiment run`, which trains nothing and keeps every run."""
    experiment, tmp = tiny
    first = experiments.run("depth-sweep-k6", progress=False)
    path = tmp / "results" / "depth-sweep-k6.json"
    older = json.loads(path.read_text())
    del older["rules"]["theory_tolerance"]
    older["rules"]["tolerance"] = "an older wording"
    write_sealed(path, older)
    again = experiments.run("depth-sweep-k6", progress=False)
    stored = json.loads(path.read_text())
    assert stored["rules"]["theory_tolerance"] == experiments.THEORY_TOLERANCE_RULE
    assert stored["rules"]["tolerance"] == experiments.TOLERANCE_RULE.format(rtol=experiment.final_rtol)
    assert stored["runs"] == first["runs"] == again["runs"]


def test_verify_stacks_a_run_as_its_last_attempt_was_trained():
    """A work item trains its runs together, then retrains together those still falling: the
    last attempt of a run was trained beside every run of its item that made an attempt of the
    same length."""
    def record(item, *steps):
        return {"provenance": {"item": item}, "steps": steps[-1], "attempts": [{"steps": s} for s in steps]}
    runs = {"a": record("x", 3000), "b": record("x", 3000, 6000), "c": record("x", 3000, 6000, 12000),
            "d": record("y", 3000)}
    data = {"runs": runs}
    assert [stack_of(data, k) for k in "abcd"] == [["a", "b", "c"], ["b", "c"], ["c"], ["d"]]


def test_a_resumed_item_counts_the_time_earlier_processes_spent(tiny):
    """An item whose runs were started by an earlier process (killed) resumes from their
    checkpoints; its provenance adds the training time their histories carry."""
    from fvlib.training import run_dir_for, train_many
    experiment, tmp = tiny
    item = experiment.items[0]
    configs = [r.config for r in item]
    train_many(configs, [run_dir_for(c, tmp / "runs") for c in configs], until_step=20, progress=False)
    data = experiments.run("depth-sweep-k6", progress=False, max_items=2)
    prov = data["runs"][item[0].key]["provenance"]
    assert prov["resumed_seconds"] > 0 and prov["cpu_seconds"] >= prov["resumed_seconds"]
    fresh = data["runs"][experiment.items[1][0].key]["provenance"]
    assert fresh["resumed_seconds"] == 0.0


def test_a_definition_with_more_doublings_retrains_only_the_runs_still_falling(tiny, monkeypatch):
    """Raising an experiment's max_doublings after its runs were stored: `experiment run`
    retrains with twice the steps the stored runs that have not converged (and only those),
    keeps their earlier attempts, and counts the cost of both trainings."""
    experiment, tmp = tiny
    monkeypatch.setitem(experiments.EXPERIMENTS, "depth-sweep-k6", replace(experiment, max_doublings=0))
    first = experiments.run("depth-sweep-k6", progress=False)
    item = experiment.items[0]
    assert all(len(r["attempts"]) == 1 for r in first["runs"].values())
    assert not first["runs"][item[0].key]["converged"]    # 40 steps: still falling
    path = tmp / "results" / "depth-sweep-k6.json"
    stored = json.loads(path.read_text())
    kept = stored["runs"][item[1].key]          # pretend this one converged: it must stay
    kept["converged"] = kept["attempts"][-1]["converged"] = True
    write_sealed(path, stored)
    grown = replace(experiment, max_doublings=1)
    monkeypatch.setitem(experiments.EXPERIMENTS, "depth-sweep-k6", grown)
    falling = [k for k, r in stored["runs"].items() if not r["converged"]]
    assert item[0].key in falling and experiments.runs_to_double(stored, grown) == falling
    data = experiments.run("depth-sweep-k6", progress=False)
    assert len(data["runs"]) == 4 and data["runs"][item[1].key] == kept
    longer = data["runs"][item[0].key]
    assert [a["steps"] for a in longer["attempts"]] == [40, 80] and longer["steps"] == 80
    assert longer["attempts"][0] == first["runs"][item[0].key]["attempts"][0]
    assert longer["history"][-1]["step"] == 80 and "greedy_paired" in longer and "gap" in longer
    before = first["runs"][item[0].key]["provenance"]
    assert longer["provenance"]["earlier"] == [before] and longer["provenance"]["item"] != before["item"]
    summary = experiments.provenance_summary(data)
    items = {p["item"]: p["cpu_seconds"] for r in data["runs"].values()
             for p in [*r["provenance"].get("earlier", []), r["provenance"]]}
    # the two first items, item 0 doubled, item 1 doubled if one of its runs was still falling
    doubled_b = any(r.key in falling for r in experiment.items[1])
    assert summary["work_items"] == 3 + doubled_b and before["item"] in items and longer["provenance"]["item"] in items
    assert summary["cpu_seconds"] == pytest.approx(sum(items.values()), abs=0.2)
    # trained alone this time; the kept run was trained beside it
    assert stack_of(data, item[0].key) == [item[0].key]
    assert len(stack_of(data, item[1].key)) == 2
    assert "at most 1 times" in json.loads(path.read_text())["rules"]["convergence"]
    assert experiments.load_result("depth-sweep-k6")["runs"][item[0].key]["steps"] == 80
    assert experiments.runs_to_double(data, grown) == []
    again = experiments.run("depth-sweep-k6", progress=False)   # nothing left to double
    assert again["runs"][item[0].key] == longer
