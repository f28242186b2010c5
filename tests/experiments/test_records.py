"""The result file as typed records (version 3, sealed): every stored file round-trips; older versions and
unknown fields are refused naming them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fvlib.experiments import ResultError, ResultFile, experiment_names, get_experiment, result_path
from fvlib.experiments.seal import seal_of

ROOT = Path(__file__).resolve().parents[2]


def _as_version_1(data: dict) -> dict:
    """A version-2 result's JSON written back as version 1 wrote it (rules at the top level)."""
    old = {k: v for k, v in data.items() if k not in ("rules", "theory_kind")}
    old["version"] = 1
    old.update({f"{k}_rule": v for k, v in data["rules"].items()})
    return old


#: The experiments with a result file (a definition is planned before its first item is stored).
STORED = [name for name in experiment_names() if result_path(name).exists()]


@pytest.mark.parametrize("name", STORED)
def test_every_stored_file_is_version_3_and_round_trips(name):
    data = json.loads(result_path(name).read_text())
    assert data["version"] == 3
    seal = data.pop("seal")
    assert ResultFile.from_dict({**data, "seal": seal}).to_dict() == data
    # the theory parameters beside every file; the kept models beside those of experiments that keep some
    kept = {f"{name}.models.safetensors"} if get_experiment(name).stored_models else set()
    assert seal_of(data, {})["runs"] == seal["runs"]
    assert {f"{name}.theory.safetensors"} <= set(seal["beside"]) <= {f"{name}.theory.safetensors"} | kept


def test_an_unsealed_older_version_is_refused_with_what_to_do():
    data = json.loads(result_path("recipes-a").read_text())
    with pytest.raises(ResultError, match="version-1 result file.*experiment seal"):
        ResultFile.from_dict(_as_version_1(data))
    unsealed = {k: v for k, v in data.items() if k != "seal"} | {"version": 2}
    with pytest.raises(ResultError, match="version-2 result file.*git checkout"):
        ResultFile.from_dict(unsealed)
    assert ResultFile.from_dict(unsealed, unsealed=True).runs.keys() == data["runs"].keys()


def test_an_unknown_version_or_field_is_refused_naming_it():
    data = json.loads(result_path("transformers-k4").read_text())
    with pytest.raises(ResultError, match="unknown result file version 4"):
        ResultFile.from_dict({**data, "version": 4})
    key = next(iter(data["runs"]))
    data["runs"][key]["colour"] = "red"
    with pytest.raises(ResultError, match=rf"runs/{key}.* unknown fields \['colour'\]"):
        ResultFile.from_dict(data)


def test_the_compare_script_counts_the_numbers_and_names_a_change(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    data = json.loads(result_path("recipes-transformer-k4").read_text())
    (old / "x.json").write_text(json.dumps(_as_version_1(data)))
    (new / "x.json").write_text(json.dumps(data))
    script = [sys.executable, str(ROOT / "scripts" / "compare_result_numbers.py"), str(old), str(new)]
    same = subprocess.run(script, capture_output=True, text=True, timeout=120, check=False)
    assert same.returncode == 0 and ", 0 differences" in same.stdout
    key = next(iter(data["runs"]))
    data["runs"][key]["final_loss"] += 1e-12
    (new / "x.json").write_text(json.dumps(data))
    changed = subprocess.run(script, capture_output=True, text=True, timeout=120, check=False)
    assert changed.returncode == 1 and f"runs/{key}/final_loss" in changed.stdout
