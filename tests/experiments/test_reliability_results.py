"""Issue 41, items 1 and 2: stored results you can trust. The cases of
``reliability-cases.md`` on result files (``X-*``, ``XL-*``, ``XV-*``, ``YV-*``, ``YF1``, ``YR1``,
``YR3``, ``YR5``), each by its case id: a result file with a missing or mistyped field, a future
version, a file of another experiment or one edited outside fvlib is refused in one line naming
the file and the field or part (exit 2, no traceback, no numpy warning); a re-sealed change is
caught by ``verify`` (its tolerance comes from the definition); a results folder that cannot be
used is refused before any work; a failed write leaves no temporary file.

The CLI runs in-process (:func:`fvlib.cli.main`) on copies of the stored ``reference-k6`` in a
temporary ``FVLIB_RESULTS_DIR``, and on a tiny experiment (two runs of model B, K = 2, 30 steps)
added to the catalogue and trained once for the module.
"""

import errno
import importlib
import json
import math
import shutil
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from fvlib import experiments, files
from fvlib.cli import main
from fvlib.experiments import runner
from fvlib.experiments.definitions import constrained_config
from fvlib.experiments.storage import RESULTS_ENV

pytestmark = pytest.mark.usefixtures("one_thread")

#: The module (``fvlib.experiments.verify`` is also the name of its function).
verify = importlib.import_module("fvlib.experiments.verify")

RESULTS = Path(__file__).resolve().parents[2] / "results"
REF = "reference-k6"
RUN = "B/tree/M6/seed0"


def _never(*args, **kwargs):
    raise AssertionError("training started before the bad result file was refused")


@pytest.fixture
def store(monkeypatch, tmp_path):
    """A results folder holding a copy of the stored reference-k6 (and its parameters); returns it."""
    folder = tmp_path / "results"
    folder.mkdir()
    for name in (f"{REF}.json", f"{REF}.theory.safetensors"):
        shutil.copy(RESULTS / name, folder / name)
    monkeypatch.setenv(RESULTS_ENV, str(folder))
    monkeypatch.setenv("FVLIB_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setattr(verify, "train_many", _never)
    return folder


def _edit(folder: Path, change, name: str = REF) -> Path:
    """``folder/NAME.json`` with ``change(data)`` applied to its JSON, written as a user would
    (not sealed again); returns its path."""
    path = folder / f"{name}.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def _refused(capsys, argv) -> str:
    """Run ``argv``: exit status 2 and one line on stderr, no traceback and no warning; the line."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a numpy RuntimeWarning must not leak (X-inf_loss)
        status = main(argv)
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and err.startswith("fvlib: error: "), (status, err)
    assert "Traceback" not in err
    return err


def _run(data: dict, key: str = RUN) -> dict:
    return data["runs"][key]


def _set_loss(record: dict, value) -> None:
    """A run's final loss changed everywhere the file states it (the last evaluation, the last
    attempt): an edit that the file's own consistency does not betray."""
    record["final_loss"] = record["history"][-1]["eval_excess_loss"] = record["attempts"][-1]["final_loss"] = value


LOSS = f"runs/{RUN}/final_loss"


def _loss(value):
    """An edit: run ``RUN``'s final loss set to ``value`` (nowhere else)."""
    return lambda data: _run(data).update(final_loss=value)


#: case id -> (how the file is changed, what the one line must say).
BAD_FILES = {
    "X-nan_loss": (_loss(math.nan), f"{LOSS} must be a finite number, got nan"),
    "X-inf_loss": (_loss(math.inf), f"{LOSS} must be a finite number, got inf"),
    "X-str_loss": (_loss("abc"), f"{LOSS} must be a finite number, got 'abc'"),
    "X-null_loss": (_loss(None), f"{LOSS} must be a finite number, got None"),
    "X-no_runs": (lambda d: d.pop("runs"), ": runs is missing"),
    "X-runs_list": (lambda d: d.update(runs=list(d["runs"].values())), ": runs must be a mapping, got a list"),
    "X-no_theory": (lambda d: d.pop("theory"), ": theory is missing"),
    "X-no_stderr": (lambda d: _run(d).pop("final_stderr"), f"runs/{RUN}/final_stderr is missing"),
    "X-no_config": (lambda d: _run(d).pop("config"), f"runs/{RUN}/config is missing"),
    "X-bad_config": (lambda d: _run(d)["config"].update(depth=-1),
                     f"runs/{RUN}/config: depth must be a positive integer, got -1"),
    "X-no_provenance": (lambda d: _run(d).pop("provenance"), f"runs/{RUN}/provenance is missing"),
    "X-no_attempts": (lambda d: _run(d).pop("attempts"), f"runs/{RUN}/attempts is missing"),
    "X-no_description": (lambda d: d.pop("description"), ": description is missing"),
    "X-version99": (lambda d: d.update(version=99), "unknown result file version 99"),
    "X-theory_nan": (lambda d: d["theory"]["A/tree"].update(value=math.nan),
                     "theory/A/tree/value must be a finite number, got nan"),
}


@pytest.mark.parametrize("flags", [[], ["--json"]], ids=["s", "j"])
@pytest.mark.parametrize("case", list(BAD_FILES))
def test_show_refuses_a_bad_result_file_naming_its_field(case, flags, store, capsys):
    change, words = BAD_FILES[case]
    path = _edit(store, change)
    err = _refused(capsys, ["experiment", "show", REF, *flags])
    assert f"{path}: " in err and words in err, err


def test_X_is_dir_show_names_a_folder_where_the_file_should_be(store, capsys):
    path = store / f"{REF}.json"
    path.unlink()
    path.mkdir()
    for flags in ([], ["--json"]):
        err = _refused(capsys, ["experiment", "show", REF, *flags])
        assert f"{path} is a folder, not a result file" in err and "no stored result" not in err


@pytest.mark.parametrize("case", ["XL-trunc", "XL-no_runs", "XL-runs_list", "XL-wrong_name"])
def test_list_refuses_a_bad_file_instead_of_counting_it_as_nothing_stored(case, store, capsys):
    path = store / f"{REF}.json"
    if case == "XL-trunc":
        path.write_bytes(path.read_bytes()[:5000])
        words = f"corrupt result file {path}"
    elif case == "XL-wrong_name":   # another experiment's result under reference-k6's name
        shutil.copy(RESULTS / "recipes-a.json", path)
        words = f"{path}: experiment is 'recipes-a', but the file is named for 'reference-k6'"
    else:
        change, words = BAD_FILES[case.replace("XL-", "X-")]
        _edit(store, change)
    assert words in _refused(capsys, ["experiment", "list"])
    # with the good file back, it lists 21 stored runs
    shutil.copy(RESULTS / f"{REF}.json", path)
    assert main(["experiment", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["experiments"]
    assert listed[REF]["stored_runs"] == 21 and listed["recipes-a"]["stored_runs"] == 0


@pytest.mark.parametrize("case", ["XV-no_runs", "XV-runs_list"])
def test_verify_refuses_a_bad_file_before_any_training(case, store, capsys):
    change, words = BAD_FILES[case.replace("XV-", "X-")]
    _edit(store, change)
    assert words in _refused(capsys, ["experiment", "verify", REF, "--no-theory"])


def test_XV_real_tamper_verify_refuses_an_edited_file_before_retraining(store, capsys):
    """All three A-scratch/tree/M6 final losses doubled: refused by the file's own numbers
    (history, attempts) when only final_loss was edited, and by the seal when all were; the
    cheapest run is never retrained (verify's train_many fails this test if reached)."""
    keys = [f"A-scratch/tree/M6/seed{s}" for s in range(3)]
    _edit(store, lambda d: [_run(d, k).update(final_loss=2 * _run(d, k)["final_loss"]) for k in keys])
    err = _refused(capsys, ["experiment", "verify", REF, "--no-theory"])
    assert f"runs/{keys[0]}/final_loss" in err and "must be the last evaluation's" in err
    shutil.copy(RESULTS / f"{REF}.json", store / f"{REF}.json")
    _edit(store, lambda d: [_set_loss(_run(d, k), 2 * _run(d, k)["final_loss"]) for k in keys])
    err = _refused(capsys, ["experiment", "verify", REF, "--no-theory"])
    assert ", ".join(f"runs/{k} (changed)" for k in keys) in err and "differs from the file's seal" in err
    assert f"git checkout {store / REF}.json" in err


def test_a_loss_changed_by_ten_percent_is_refused_by_the_seal_and_seal_result_reseals(store, capsys):
    """The issue's first demonstration, on the stored reference-k6: one run's loss raised 10%
    (consistently) is refused by every reader; ``experiment seal`` checks the file and seals it
    again (a maintainer's explicit step), after which it reads."""
    before = _run(json.loads((store / f"{REF}.json").read_text()))["final_loss"]
    _edit(store, lambda d: _set_loss(_run(d), 1.1 * before))
    with pytest.raises(experiments.ResultError, match=f"runs/{RUN} \\(changed\\) differs from the file's seal"):
        experiments.load_result(REF)
    _refused(capsys, ["experiment", "show", REF])
    assert main(["experiment", "seal", REF]) == 0
    out = capsys.readouterr().out
    assert "21 runs of its definition" in out and "3 tensors" in out and f"runs/{RUN} (changed)" in out
    assert experiments.load_result(REF)["runs"][RUN]["final_loss"] == pytest.approx(1.1 * before)


def test_a_replaced_parameter_file_is_refused_by_the_seal(store, capsys):
    params = store / f"{REF}.theory.safetensors"
    shutil.copy(RESULTS / "recipes-a.theory.safetensors", params)
    err = _refused(capsys, ["experiment", "show", REF])
    assert f"{params.name} (changed)" in err and "--refresh-theory" in err


# --- the tiny experiment: verify retrains on this CPU, bit for bit ---------------------------

TINY = "tiny-i41"


def _tiny_theory(params) -> dict:
    """A fixed per-budget reference (nothing optimised): what the store writes, in no time."""
    return {"M2": {"nonadaptive_coord": {"mean": 0.5, "stderr": 0.01}}, "samples": 10}


def _tiny_experiment() -> experiments.Experiment:
    base = constrained_config("B", steps=30, prior="tree", depth=2, alpha=0.5, n_ctx=8, noise_std=0.0, budget=2)
    base = replace(base, batch=32, queries=8, width=16, eval_contexts=128)
    runs = tuple(experiments.Run(experiments.run_key("B", "tree", 2, s), "B", replace(base, seed=s)) for s in (0, 1))
    return experiments.Experiment(TINY, "tiny", "x", (runs,), _tiny_theory, max_doublings=0)


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    """The tiny experiment trained once into a results folder (copied by :func:`tiny`)."""
    folder = tmp_path_factory.mktemp("tiny")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(experiments.EXPERIMENTS, TINY, _tiny_experiment())
        mp.setenv("FVLIB_RUN_ROOT", str(folder / "runs"))
        experiments.run(TINY, directory=folder / "results", progress=False)
        yield folder / "results"


@pytest.fixture
def tiny(tiny_store, monkeypatch, tmp_path):
    """A copy of the tiny experiment's results folder as ``FVLIB_RESULTS_DIR``, the experiment in
    the catalogue; returns ``(folder, key of the run verify --full retrains, the other key)``."""
    folder = tmp_path / "results"
    shutil.copytree(tiny_store, folder)
    monkeypatch.setitem(experiments.EXPERIMENTS, TINY, _tiny_experiment())
    monkeypatch.setenv(RESULTS_ENV, str(folder))
    monkeypatch.setenv("FVLIB_RUN_ROOT", str(tmp_path / "runs"))
    report = experiments.verify(TINY, full=True, theory=False)
    assert report["ok"] and report["checked"][0]["difference"] == 0.0   # same CPU, same bits
    retrained = report["checked"][0]["key"]
    (other,) = [k for k in json.loads((folder / f"{TINY}.json").read_text())["runs"] if k != retrained]
    return folder, retrained, other


def test_YV_loss10_a_resealed_ten_percent_change_is_caught_by_verify(tiny, capsys):
    """The issue's second demonstration: unsealed, the change is refused by the seal; sealed
    again (``seal_result``), ``verify --full`` retrains the run and catches it, within the
    definition's tolerance (5% of the stored loss), not one of the stored numbers."""
    folder, retrained, _ = tiny
    _edit(folder, lambda d: _set_loss(_run(d, retrained), 1.1 * _run(d, retrained)["final_loss"]), TINY)
    assert f"runs/{retrained} (changed)" in _refused(capsys, ["experiment", "verify", TINY, "--full"])
    experiments.seal_result(TINY)
    report = experiments.verify(TINY, full=True, theory=False)
    (check,) = report["checked"]
    assert not report["ok"] and check["tolerance"] == pytest.approx(experiments.FINAL_RTOL * check["stored"])
    assert check["difference"] == pytest.approx(check["stored"] / 11, rel=1e-9)
    err = _refused(capsys, ["experiment", "verify", TINY, "--full", "--no-theory"])
    assert f"does not reproduce: {retrained}: stored" in err


def test_YV_loss_big_stderr_a_large_stored_stderr_widens_nothing(tiny, capsys):
    folder, retrained, _ = tiny

    def forge(data):
        _set_loss(_run(data, retrained), 0.5)
        _run(data, retrained)["final_stderr"] = 1.0

    _edit(folder, forge, TINY)
    experiments.seal_result(TINY)
    err = _refused(capsys, ["experiment", "verify", TINY, "--full", "--no-theory"])
    assert f"{retrained}: stored 0.5, retrained" in err and "tolerance 0.025" in err


def test_YV_version99_verify_refuses_a_future_version(tiny, capsys):
    folder, _, _ = tiny
    path = _edit(folder, lambda d: d.update(version=99), TINY)
    err = _refused(capsys, ["experiment", "verify", TINY])
    assert f"{path}: unknown result file version 99 (this fvlib reads version 3)" in err


def test_YV_other_run_a_run_verify_does_not_retrain_is_checked_by_its_seal(tiny, capsys, monkeypatch):
    folder, _, other = tiny
    monkeypatch.setattr(verify, "train_many", _never)
    _edit(folder, lambda d: _set_loss(_run(d, other), 3 * _run(d, other)["final_loss"]), TINY)
    assert f"runs/{other} (changed)" in _refused(capsys, ["experiment", "verify", TINY, "--full"])


def test_YF1_a_full_disk_names_the_file_and_leaves_no_tmp(tiny, capsys, monkeypatch):
    folder, _, _ = tiny
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def full_disk(path, data):
        Path(path).write_bytes(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "write_synced", full_disk)
    err = _refused(capsys, ["experiment", "run", TINY, "--no-progress", "--refresh-theory"])
    assert f"cannot write {folder}/{TINY}." in err and "No space left on device" in err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before   # no .tmp, nothing changed
    monkeypatch.undo()


def test_YR1_a_read_only_results_folder_is_refused_before_any_work(tiny, capsys, monkeypatch):
    folder, _, _ = tiny
    mkstemp = tempfile.mkstemp

    def read_only(*args, dir=None, **kwargs):   # the results folder on a read-only file system
        if Path(dir) == folder:
            raise OSError(errno.EROFS, "Read-only file system")
        return mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(runner, "_train_item", _never)
    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    err = _refused(capsys, ["experiment", "run", TINY, "--no-progress"])
    assert f"results folder {RESULTS_ENV}={folder} cannot be written" in err and "Read-only file system" in err


@pytest.mark.parametrize("argv", [["experiment", "run", TINY, "--no-progress"], ["experiment", "list"],
                                  ["experiment", "show", TINY]], ids=["YR3", "YR5", "YR3-show"])
def test_YR3_YR5_a_results_folder_that_is_a_file_is_refused(argv, tiny, capsys, monkeypatch, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    monkeypatch.setenv(RESULTS_ENV, str(afile))
    monkeypatch.setattr(runner, "_train_item", _never)
    err = _refused(capsys, argv)
    assert f"{afile} is a file, not a folder" in err and "Errno" not in err
    assert f"{RESULTS_ENV}={afile}" in err


def test_an_unsealed_version_2_file_is_refused_until_experiment_seal_checks_and_seals_it(store, capsys):
    """How the stored files were sealed: a version-2 file (before seals) is refused by every
    reader with what to do; ``experiment seal`` checks it and seals it, changing no number."""
    path = _edit(store, lambda d: [d.pop("seal"), d.update(version=2)])
    assert "a version-2 result file" in _refused(capsys, ["experiment", "show", REF])
    assert main(["experiment", "seal", REF, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["version"] == 2 and report["unsealed_parts"] == ["all (version 2)"] and report["runs"] == 21
    sealed = json.loads(path.read_text())
    stored = json.loads((RESULTS / f"{REF}.json").read_text())
    assert sealed["version"] == 3 and sealed["runs"] == stored["runs"] and sealed["seal"] == stored["seal"]
