"""The trained models a stored experiment keeps (issue 42, item 3): the runner writes the final
weights of the runs of ``stored_models`` beside the result, sealed with it; ``load_stored_model``
gives back the stored run's model; ``experiment keep-models`` writes them for runs stored without
them and refuses a run directory whose model is not the record's; the seven stored files still
read, their seals as they were.

A tiny experiment (model A with the one recipe, tree K = 3, M = 3, 40 steps, two seeds, the
weights of seed 0 kept) is registered through the library and trained once for the module.
"""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import same_parameters

from fvlib import experiments
from fvlib.cli import main
from fvlib.experiments.definitions import controls_config
from fvlib.experiments.records import ResultError
from fvlib.experiments.seal import digest
from fvlib.experiments.storage import RESULTS_ENV, load_models_file, write_result
from fvlib.training import TrainConfig, load_run, per_context_losses, run_dir_for
from fvlib.training.evaluate import run_eval_batches
from fvlib.training.rundir import (
    CONFIG_FILE,
    HISTORY_FILE,
    MODEL_FILE,
    STATE_FILE,
    commit,
    tensors_from_bytes,
    tensors_to_bytes,
)

pytestmark = pytest.mark.usefixtures("one_thread")

NAME = "kept-tiny"
STEPS = 40
RESULTS = Path(__file__).resolve().parents[2] / "results"
#: The stored experiments that keep no models (the seven files stored before issue 42).
UNKEPT = [name for name, e in experiments.EXPERIMENTS.items() if not e.stored_models]


def _runs() -> tuple:
    base = controls_config("A", steps=STEPS, prior="tree", depth=3, alpha=0.5, n_ctx=16, noise_std=0.0, budget=3)
    base = replace(base, batch=32, width=16, eval_contexts=256)
    return tuple(experiments.Run(experiments.run_key("A", "tree", 3, s), "A", replace(base, seed=s)) for s in (0, 1))


KEPT, OTHER = (r.key for r in _runs())


def _experiment(stored_models=(KEPT,)) -> experiments.Experiment:
    return experiments.Experiment(NAME, "tiny", "x", (_runs(),), lambda params: {"tree": {}}, max_doublings=0,
                                  stored_models=stored_models)


@pytest.fixture(scope="module")
def trained(one_thread, tmp_path_factory):
    """The tiny experiment trained once: its folder (``results/`` and the run root ``runs/``)."""
    folder = tmp_path_factory.mktemp("kept")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(experiments.EXPERIMENTS, NAME, _experiment())
        mp.setenv("FVLIB_RUN_ROOT", str(folder / "runs"))
        experiments.run(NAME, directory=folder / "results", progress=False)
    return folder


@pytest.fixture
def store(trained, monkeypatch, tmp_path):
    """A copy of the trained folder, as ``FVLIB_RESULTS_DIR`` and ``FVLIB_RUN_ROOT``, the tiny
    experiment in the catalogue; returns the results folder."""
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    monkeypatch.setitem(experiments.EXPERIMENTS, NAME, _experiment())
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))
    monkeypatch.setenv("FVLIB_RUN_ROOT", str(tmp_path / "runs"))
    return tmp_path / "results"


def _record(key: str) -> dict:
    return experiments.load_result(NAME)["runs"][key]


def _files(folder: Path) -> dict:
    """The bytes of the result file and the kept models."""
    return {name: (folder / name).read_bytes() for name in (f"{NAME}.json", f"{NAME}.models.safetensors")}


def _without_models(folder: Path) -> None:
    """The result as a writer that kept no models left it: no models file, a seal without it."""
    data = experiments.read_result(NAME, models=False)
    (folder / f"{NAME}.models.safetensors").unlink()
    write_result(folder / f"{NAME}.json", data)


def test_the_definitions_keep_a_and_a_coord_at_the_largest_budget():
    for name, depth in (("controls-k6", 6), ("long-context-k6", 6), ("controls-k8", 8)):
        experiment = experiments.get_experiment(name)
        runs = experiment.run_by_key()
        largest = [r.key for r in experiment.runs
                   if r.variant in ("A", "A-coord") and r.config.prior == "tree" and r.config.budget == depth]
        assert sorted(experiment.stored_models) == sorted(largest) and len(largest) == 6, name
        assert all(runs[k].config.budget == depth for k in experiment.stored_models)


def test_a_kept_key_that_is_not_a_run_is_refused():
    with pytest.raises(ValueError, match="stored_models: 'A/tree/M9/seed0' is not a run of experiment"):
        _experiment(stored_models=("A/tree/M9/seed0",))


def test_the_runner_keeps_the_weights_of_the_kept_run_and_seals_them(store):
    held = load_models_file(NAME)
    assert list(held) == [KEPT]
    record = _record(KEPT)
    assert (held[KEPT]["config"], held[KEPT]["steps"]) == (record["config"], record["steps"])
    model, _, _ = load_run(run_dir_for(TrainConfig.from_dict(record["config"])))
    assert held[KEPT]["weights"].keys() == model.state_dict().keys()
    assert all(torch.equal(held[KEPT]["weights"][k], v) for k, v in model.state_dict().items())
    seal = json.loads((store / f"{NAME}.json").read_text())["seal"]["beside"]
    assert seal[f"{NAME}.models.safetensors"] == digest((store / f"{NAME}.models.safetensors").read_bytes())
    assert experiments.stored_model_keys(NAME) == (KEPT,)


def test_a_loaded_model_gives_the_stored_final_loss_on_the_runs_contexts(store):
    model, config = experiments.load_stored_model(NAME, KEPT)
    record = _record(KEPT)
    assert config == TrainConfig.from_dict(record["config"]) and not model.training
    loss = per_context_losses(model, run_eval_batches(config))[0].mean().item()
    assert loss == pytest.approx(record["final_loss"], rel=1e-6)
    # the kept seed's model, not the other seed's (same data, same contexts, other initial weights)
    other, _, _ = load_run(run_dir_for(TrainConfig.from_dict(_record(OTHER)["config"])))
    assert not same_parameters(model, other)
    assert per_context_losses(other, run_eval_batches(config))[0].mean().item() != pytest.approx(loss, rel=1e-6)


@pytest.mark.parametrize("name, key, words", [
    ("no-such", KEPT, "unknown experiment 'no-such'"),
    (NAME, OTHER, f"keeps no model of run '{OTHER}'; it keeps {KEPT}"),
], ids=["name", "key"])
def test_an_unknown_name_or_a_key_not_kept_is_refused(store, name, key, words):
    with pytest.raises(ValueError, match=words):
        experiments.load_stored_model(name, key)


def test_a_missing_models_file_names_the_command_that_writes_it(store):
    _without_models(store)
    assert experiments.stored_model_keys(NAME) == ()
    with pytest.raises(ResultError, match=f"experiment keep-models {NAME}"):
        experiments.load_stored_model(NAME, KEPT)


def test_a_byte_changed_in_the_models_file_is_refused_by_the_seal(store, capsys):
    path = store / f"{NAME}.models.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1   # the last byte of the last tensor
    path.write_bytes(bytes(data))
    with pytest.raises(ResultError, match=f"{path.name} \\(changed\\) differs from the file's seal"):
        experiments.load_stored_model(NAME, KEPT)
    assert main(["experiment", "show", NAME]) == 2
    err = capsys.readouterr().err
    assert f"{path.name} (changed)" in err and f"experiment keep-models {NAME}" in err


def test_keep_models_writes_them_for_a_file_stored_without_and_a_second_call_changes_nothing(store, capsys):
    _without_models(store)
    models = store / f"{NAME}.models.safetensors"
    assert main(["experiment", "keep-models", NAME, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kept"] == [KEPT] and report["written"] is True and report["not_stored"] == []
    before = _files(store)
    model, config = experiments.load_stored_model(NAME, KEPT)
    assert per_context_losses(model, run_eval_batches(config))[0].mean().item() == pytest.approx(
        _record(KEPT)["final_loss"], rel=1e-6)
    assert main(["experiment", "keep-models", NAME]) == 0
    assert "unchanged" in capsys.readouterr().out
    assert _files(store) == before
    # a result written again by a writer that keeps no models: the file beside it is not sealed
    kept = models.read_bytes()
    _without_models(store)
    models.write_bytes(kept)
    with pytest.raises(ResultError, match=f"{models.name} \\(not sealed\\).*experiment keep-models {NAME}"):
        experiments.load_result(NAME)


def test_keep_models_refuses_a_run_directory_whose_model_is_not_the_records(store, capsys):
    _without_models(store)
    kept_dir = run_dir_for(TrainConfig.from_dict(_record(KEPT)["config"]))
    other, _, _ = load_run(run_dir_for(TrainConfig.from_dict(_record(OTHER)["config"])))
    # the final checkpoint of the kept run, its weights replaced by the other seed's (a valid checkpoint)
    commit(kept_dir, STEPS, {MODEL_FILE: tensors_to_bytes(other.state_dict(), {"step": str(STEPS)})},
           keep=(CONFIG_FILE, STATE_FILE, HISTORY_FILE))
    assert main(["experiment", "keep-models", NAME]) == 2
    err = capsys.readouterr().err
    stored = _record(KEPT)["final_loss"]
    assert f"kept run {KEPT}" in err and repr(stored) in err and "it is not the stored run's model" in err
    assert not (store / f"{NAME}.models.safetensors").exists()


def test_keep_models_refuses_a_run_directory_of_another_step(store, capsys):
    _without_models(store)
    record = _record(KEPT)
    kept_dir = run_dir_for(TrainConfig.from_dict(record["config"]))
    files = {name: _restep((kept_dir / name).read_bytes(), STEPS // 2) for name in (MODEL_FILE, STATE_FILE)}
    history = [entry for entry in record["history"] if entry["step"] <= STEPS // 2]
    commit(kept_dir, STEPS // 2, {**files, HISTORY_FILE: json.dumps({"step": STEPS // 2, "history": history}).encode()})
    assert main(["experiment", "keep-models", NAME]) == 2
    assert "is at step" in capsys.readouterr().err


def _restep(data: bytes, step: int) -> bytes:
    """A checkpoint's safetensors file, its step set to ``step``."""
    tensors, metadata = tensors_from_bytes(data, "checkpoint")
    return tensors_to_bytes(tensors, {**metadata, "step": str(step)})


def test_show_and_list_name_the_kept_models(store, capsys):
    assert main(["experiment", "show", NAME]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("kept models"))
    assert f"1 of 1 in {store / NAME}.models.safetensors" in line and KEPT in line
    assert main(["experiment", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["experiments"]
    assert (listed[NAME]["stored_models"], listed[NAME]["kept_models"]) == ([KEPT], 1)
    assert listed["controls-k6"]["stored_models"] == list(experiments.get_experiment("controls-k6").stored_models)


@pytest.mark.parametrize("name", UNKEPT)
def test_the_seven_stored_files_read_and_seal_only_their_theory_parameters(name):
    raw = json.loads((RESULTS / f"{name}.json").read_text())
    assert list(raw["seal"]["beside"]) == [f"{name}.theory.safetensors"]
    assert len(experiments.read_result(name).runs) == len(raw["runs"])
    assert experiments.stored_model_keys(name) == ()


def test_a_stored_file_written_again_keeps_its_bytes(tmp_path, monkeypatch):
    for suffix in (".json", ".theory.safetensors"):
        shutil.copy(RESULTS / f"reference-k6{suffix}", tmp_path / f"reference-k6{suffix}")
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path))
    write_result(tmp_path / "reference-k6.json", experiments.read_result("reference-k6"))
    assert (tmp_path / "reference-k6.json").read_bytes() == (RESULTS / "reference-k6.json").read_bytes()


def test_trained_only_leaves_out_the_kept_runs_that_fail_by_the_rule(tmp_path, monkeypatch):
    """On a copy of the stored long context: the kept keys of the runs that failed are left out, in
    the definition's order; a kept run edited to end at the coordinate reference fails too."""
    from fvlib.experiments.records import ResultFile
    from fvlib.experiments.rules import FAILURE_COORD_FRACTION

    name = "long-context-k6"
    for path in RESULTS.glob(f"{name}.*"):
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path))
    every = experiments.stored_model_keys(name)
    trained = experiments.stored_model_keys(name, trained_only=True)
    assert trained and set(trained) < set(every) and list(trained) == [k for k in every if k in trained]
    data = json.loads((tmp_path / f"{name}.json").read_text())
    theory = data["theory"]
    key = trained[0]
    coord = theory["curves"]["nonadaptive_coord"]["mean"][theory["budgets"].index(data["runs"][key]["budget"])]
    record = data["runs"][key]
    record["final_loss"] = record["history"][-1]["eval_excess_loss"] = \
        record["attempts"][-1]["final_loss"] = FAILURE_COORD_FRACTION * coord
    write_result(tmp_path / f"{name}.json", ResultFile.from_dict(data, str(tmp_path / f"{name}.json")))
    assert experiments.stored_model_keys(name, trained_only=True) == trained[1:]
    assert experiments.stored_model_keys(name) == every
