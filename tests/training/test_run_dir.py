"""Run directories you can trust (fvlib.training.rundir): a kill or a full disk during a checkpoint
leaves the previous one, corrupt or edited files are named, a second writer waits, a diverging
run stops at its last good checkpoint, and worker processes end with their parent."""

import dataclasses
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import same_parameters, strip_times
from safetensors.torch import load_file, save_file

import fvlib.files as disk
import fvlib.training.rundir as ckpt
from fvlib.cli import main
from fvlib.training import TrainConfig, TrainingDiverged, UnverifiedRunError, load_history, load_run, repair_run, train
from fvlib.training.rundir import CheckpointWriteError, RunDirError, RunLock

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

ROOT = Path(__file__).resolve().parents[2]

#: Six steps, a checkpoint every two: checkpoints at steps 2, 4 and 6.
SMALL = TrainConfig(model="A", depth=2, n_ctx=8, budget=2, steps=6, batch=8, queries=4, width=8,
                    hidden_layers=1, router_warm_start=0, eval_every=2, eval_contexts=16,
                    checkpoint_every=2, device="cpu")
#: The events of one checkpoint, in order (fvlib.training.rundir.commit): staging the three files,
#: writing the manifest's temporary file, renaming it into place (the commit), three renames.
EVENTS = ["write state", "write model", "write history", "write manifest", "commit manifest",
          "rename state", "rename model", "rename history"]


@pytest.fixture(scope="module")
def whole(one_thread):
    """The uninterrupted run, in memory."""
    return train(SMALL, progress=False)


def manifest_step(run_dir) -> int:
    return json.loads((Path(run_dir) / "manifest.json").read_text())["step"]


def assert_resumes_exactly(run_dir, whole):
    resumed = train(SMALL, out_dir=run_dir, progress=False)
    assert strip_times(resumed.history) == strip_times(whole.history)
    assert same_parameters(resumed.model, whole.model)
    assert manifest_step(run_dir) == SMALL.steps
    assert not list(Path(run_dir).glob("*.next")) and not list(Path(run_dir).glob("*.tmp"))


class Killed(BaseException):
    """Stands for a kill: no ``except Exception`` clean-up runs."""


def fail_at(monkeypatch, event: int, error: BaseException, at_step: int = 4):
    """Make the ``event``-th write or rename (:data:`EVENTS`) of the checkpoint of ``at_step`` raise."""
    import fvlib.training.checkpoint

    seen = {"armed": False, "count": 0}
    write, replace, commit = disk.write_synced, disk.replace_file, fvlib.training.checkpoint.commit

    def counted(real):
        def wrapper(*args):
            if seen["armed"]:
                if seen["count"] == event:
                    raise error
                seen["count"] += 1
            return real(*args)
        return wrapper

    def arming_commit(run_dir, step, files, **kw):
        seen["armed"] = step == at_step
        try:
            return commit(run_dir, step, files, **kw)
        finally:
            seen["armed"] = False

    monkeypatch.setattr(disk, "write_synced", counted(write))
    monkeypatch.setattr(disk, "replace_file", counted(replace))
    monkeypatch.setattr(fvlib.training.checkpoint, "commit", arming_commit)


# ----- a kill between the files of a checkpoint ----------------------------------------------
@pytest.mark.parametrize("event", range(len(EVENTS)), ids=EVENTS)
def test_a_kill_during_a_checkpoint_leaves_a_run_that_resumes_exactly(tmp_path, monkeypatch, whole, event):
    run_dir = tmp_path / "run"
    fail_at(monkeypatch, event, Killed())
    with pytest.raises(Killed):
        train(SMALL, out_dir=run_dir, progress=False)
    monkeypatch.undo()
    committed = EVENTS.index("commit manifest")
    expected = 4 if event > committed else 2  # the checkpoint of step 4 exists once its manifest is in place
    assert manifest_step(run_dir) == expected
    _, _, history = load_run(run_dir)  # a reader sees one whole checkpoint (renames not done: from NAME.next)
    assert history[-1]["step"] == expected and load_history(run_dir) == history
    assert_resumes_exactly(run_dir, whole)


KILL_SCRIPT = """
import os, signal, sys
import fvlib.files as files
from fvlib.training import TrainConfig, train
config = TrainConfig(**{config})
calls = {{"n": 0}}
real = files.{function}
def kill_at(*args):
    calls["n"] += 1
    if calls["n"] == {call}:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args)
setattr(files, "{function}", kill_at)
train(config, out_dir=sys.argv[1], progress=False)
"""


@pytest.mark.parametrize("function, call, expected", [
    ("write_synced", 7, 2),  # config (1), checkpoint 2 (4 writes), then the model file of checkpoint 4
    ("replace_file", 7, 4),     # config (1), checkpoint 2 (4 renames), commit 4, then its first rename
])
def test_a_process_killed_by_sigkill_mid_checkpoint_resumes_exactly(tmp_path, whole, function, call, expected):
    run_dir = tmp_path / "run"
    script = KILL_SCRIPT.format(config=SMALL.to_dict(), function=function, call=call)
    out = subprocess.run([sys.executable, "-c", script, str(run_dir)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert manifest_step(run_dir) == expected
    assert list(run_dir.glob("*.next"))  # the kill left staged files behind
    assert_resumes_exactly(run_dir, whole)


# ----- a full disk ----------------------------------------------------------------------------
@pytest.mark.parametrize("event", range(4), ids=EVENTS[:4])
def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch, whole, event):
    run_dir = tmp_path / "run"
    fail_at(monkeypatch, event, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    with pytest.raises(CheckpointWriteError, match=r"step 4 to .*run/.*No space left on device.*keeps step 2"):
        train(SMALL, out_dir=run_dir, progress=False)
    monkeypatch.undo()
    assert manifest_step(run_dir) == 2
    assert not list(run_dir.glob("*.next")) and not list(run_dir.glob("*.tmp"))  # the staged files are gone
    assert load_run(run_dir)[2][-1]["step"] == 2
    assert_resumes_exactly(run_dir, whole)


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a tmpfs at a fresh directory: ``mount(size, read_only)`` returns its path. Skips
    where mounting is not allowed (not root, no CAP_SYS_ADMIN, not Linux)."""
    mounted = []

    def mount(size: str = "4m", read_only: bool = False) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                                  capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            done = False
        if not done:
            pytest.skip("cannot mount a tmpfs here")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], capture_output=True, timeout=30)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` up to the last byte; returns the filler file."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC
    return filler


def test_a_real_full_disk_keeps_the_previous_checkpoint(tmpfs, whole):
    run_dir = tmpfs("4m") / "run"
    train(SMALL, out_dir=run_dir, progress=False, until_step=2)
    filler = fill(run_dir.parent)
    with pytest.raises(CheckpointWriteError, match="No space left on device.*keeps step 2"):
        train(SMALL, out_dir=run_dir, progress=False)
    assert load_run(run_dir)[2][-1]["step"] == 2 and not list(run_dir.glob("*.next"))
    filler.unlink()
    assert_resumes_exactly(run_dir, whole)


# ----- corrupt, edited and non-finite files ----------------------------------------------------
@pytest.fixture
def run_dir(tmp_path):
    train(SMALL, out_dir=tmp_path / "run", progress=False)
    return tmp_path / "run"


def test_overwritten_weight_bytes_are_named(run_dir):
    path = run_dir / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-64:] = bytes(64)  # weights, not the header: still a valid safetensors file
    path.write_bytes(bytes(data))
    load_file(str(path))
    with pytest.raises(RunDirError, match="model.safetensors and manifest.json .* disagree: the file's SHA-256"):
        load_run(run_dir)
    with pytest.raises(RunDirError, match="model.safetensors and manifest.json .* disagree"):
        train(SMALL, out_dir=run_dir, progress=False)  # resuming the finished run refuses it too


@pytest.mark.parametrize("name", ["config.json", "history.json", "train_state.safetensors"])
def test_an_edited_file_is_named(run_dir, name):
    path = run_dir / name
    path.write_bytes(path.read_bytes() + b" ")
    with pytest.raises(RunDirError, match=f"{name} and manifest.json .* disagree: the file has .* bytes"):
        train(SMALL, out_dir=run_dir, progress=False)


def nan_weights(run_dir):
    path = run_dir / "model.safetensors"
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, str(path), metadata={"step": str(SMALL.steps)})
    return name


def test_nan_weights_of_a_legacy_run_are_refused(run_dir):
    (run_dir / "manifest.json").unlink()  # a run written before manifests: only what can be checked
    name = nan_weights(run_dir)
    with pytest.raises(RunDirError, match=f"model.safetensors holds non-finite values .* in '{name}'"):
        repair_run(run_dir)


def test_nan_weights_are_refused_even_with_a_matching_manifest(run_dir):
    name = nan_weights(run_dir)
    files = {n: (run_dir / n).read_bytes() for n in ("model.safetensors", "history.json", "train_state.safetensors")}
    ckpt.commit(run_dir, SMALL.steps, files)  # a manifest that agrees with the NaN weights
    with pytest.raises(RunDirError, match=f"non-finite values .* in '{name}'"):
        load_run(run_dir)


def test_a_hand_edited_config_whose_shapes_disagree_is_one_line(run_dir):
    (run_dir / "manifest.json").unlink()
    path = run_dir / "config.json"
    payload = json.loads(path.read_text())
    payload["model"]["width"] = payload["train"]["width"] = 12  # consistent, but not the weights
    path.write_text(json.dumps(payload))
    with pytest.raises(RunDirError) as err:
        repair_run(run_dir)
    message = str(err.value)
    assert "model.safetensors do not fit" in message and "the config needs" in message and "\n" not in message
    payload["train"]["depth"] = 3  # the train section now disagrees with the model section
    path.write_text(json.dumps(payload))
    with pytest.raises(RunDirError, match="its model section .* is not the model of its train section"):
        repair_run(run_dir)


def test_legacy_runs_load_and_resume(tmp_path, whole):
    """A run written by the code before manifests (the same files, no manifest) is refused until
    repaired, then resumes exactly."""
    run_dir = tmp_path / "run"
    train(SMALL, out_dir=run_dir, progress=False, until_step=4)
    (run_dir / "manifest.json").unlink()
    with pytest.raises(UnverifiedRunError, match="no manifest.json.*--repair"):
        load_run(run_dir)
    assert repair_run(run_dir, SMALL)[-1] == "wrote manifest.json (checkpoint of step 4)"
    assert load_run(run_dir)[2][-1]["step"] == 4
    assert_resumes_exactly(run_dir, whole)


def test_a_legacy_run_with_files_from_different_steps_says_so(tmp_path):
    run_dir = tmp_path / "run"
    train(SMALL, out_dir=run_dir, progress=False, until_step=2)
    history = (run_dir / "history.json").read_bytes()
    train(SMALL, out_dir=run_dir, progress=False, until_step=4)
    (run_dir / "manifest.json").unlink()
    (run_dir / "history.json").write_bytes(history)  # what a kill between files did before manifests
    with pytest.raises(UnverifiedRunError):
        train(SMALL, out_dir=run_dir, progress=False)
    with pytest.raises(RunDirError, match="different steps .*history.json step 2.*delete the directory"):
        repair_run(run_dir, SMALL)


def test_starting_over_removes_the_old_checkpoint_first(run_dir):
    other = dataclasses.replace(SMALL, lr=3e-3, steps=2)
    train(other, out_dir=run_dir, resume=False, progress=False)
    assert load_run(run_dir)[1] == other and manifest_step(run_dir) == 2


# ----- the lock -------------------------------------------------------------------------------
def test_one_process_cannot_train_a_run_twice_at_once(tmp_path):
    with RunLock(tmp_path / "run"):
        with pytest.raises(RunDirError, match="already being trained in this process"):
            train(SMALL, out_dir=tmp_path / "run", progress=False)
    train(SMALL, out_dir=tmp_path / "run", progress=False, until_step=2)  # released: fine


def test_a_file_system_without_flock_trains_unlocked(tmp_path, monkeypatch):
    def no_flock(fd, operation):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(fcntl, "flock", no_flock)  # what some network and FUSE mounts answer
    train(SMALL, out_dir=tmp_path / "run", progress=False, until_step=2)
    assert manifest_step(tmp_path / "run") == 2


HOLDER = """
import sys, time
from fvlib.training.rundir import RunLock
with RunLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_a_second_writer_waits_for_the_first(tmp_path, capfd, whole):
    run_dir, hold = tmp_path / "run", 3.0
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir), str(hold)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        start = time.monotonic()
        result = train(SMALL, out_dir=run_dir, progress=False)
        waited = time.monotonic() - start
    finally:
        holder.wait(timeout=60)
    assert waited > hold / 2  # it waited for the holder (which slept `hold` seconds after locking)
    assert f"waiting for {run_dir}: another process (pid {holder.pid}) is training it" in capfd.readouterr().err
    assert strip_times(result.history) == strip_times(whole.history)


# ----- divergence -----------------------------------------------------------------------------
def test_a_diverging_run_stops_at_its_last_good_checkpoint(tmp_path):
    config = dataclasses.replace(SMALL, lr=1e6, steps=20, checkpoint_every=1, eval_every=1)
    with pytest.raises(TrainingDiverged, match=r"diverged at step (\d+): .* keeps its checkpoint of step") as err:
        train(config, out_dir=tmp_path / "run", progress=False)
    model, _, history = load_run(tmp_path / "run")  # finite weights (load_run checks), finite history
    kept = int(str(err.value).split("checkpoint of step ")[1].split(";")[0])
    assert history[-1]["step"] == kept == manifest_step(tmp_path / "run")
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(e["train_loss"] is None or e["train_loss"] == e["train_loss"] for e in history)
    with pytest.raises(TrainingDiverged, match=f"keeps its checkpoint of step {kept}"):
        train(config, out_dir=tmp_path / "run", progress=False)  # deterministic: diverges again


def test_train_many_stops_a_diverging_run_too(tmp_path):
    from fvlib.training.batched import train_many

    good, bad = SMALL, dataclasses.replace(SMALL, lr=1e6, steps=20)
    with pytest.raises(TrainingDiverged, match="diverged"):
        train_many([good, bad], [tmp_path / "good", tmp_path / "bad"], progress=False)
    with RunLock(tmp_path / "good"), RunLock(tmp_path / "bad"):  # the locks were released
        pass


def test_cli_train_with_a_huge_learning_rate_is_one_line(tmp_path, capsys):
    argv = ["train", "--model", "A", "--depth", "2", "--n-ctx", "8", "--budget", "2", "--steps", "30",
            "--batch", "8", "--width", "8", "--lr", "1e6",
            "--no-progress", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "diverged" in err[0] and captured.out == ""


# ----- unwritable places, caught before any training ------------------------------------------
def cli_args(command: str, path: str) -> list[str]:
    return {
        "train": ["train", "--model", "C", "--depth", "2", "--n-ctx", "8", "--budget", "2", "--steps", "5",
                  "--no-progress", "--out", path],
        "warm": ["warm", "--root", path],
        "experiment warm": ["experiment", "warm", "--root", path],
        "reproduce": ["reproduce", "--quick", "--no-progress", "--out", path],
        "experiment run": ["experiment", "run", "transformers-k4", "--root", path],
    }[command]


COMMANDS = ["train", "warm", "experiment warm", "reproduce", "experiment run"]


@pytest.fixture
def no_work(tmp_path, monkeypatch):
    """Whatever the commands would do after their checks fails the test at once (and the
    stored results/ stay untouched)."""
    def work(*args, **kwargs):
        pytest.fail("the command started its work")

    monkeypatch.setenv("FVLIB_RESULTS_DIR", str(tmp_path / "results"))
    for target in ("fvlib.training.train", "fvlib.experiments.inbuild.train_parallel",
                   "fvlib.experiments.reproduce.reproduce", "fvlib.experiments.run"):
        monkeypatch.setattr(target, work)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_cli_refuses_an_output_that_is_a_file_before_any_work(tmp_path, capsys, no_work, command, where):
    (tmp_path / "f").write_text("x")
    path = str(tmp_path / "f") if where == "a file" else str(tmp_path / "f" / "runs")
    assert main(cli_args(command, path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    flag = cli_args(command, path)[-2]
    assert len(err) == 1 and err[0].startswith(f"fvlib: error: {flag}: {path}")
    assert ("is a file" if where == "a file" else "which is a file") in err[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_cli_refuses_a_read_only_output_before_any_work(tmpfs, capsys, no_work, command):
    path = str(tmpfs("1m", read_only=True) / "runs")
    assert main(cli_args(command, path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path} is not writable (Read-only file system)" in err[0]


def test_an_unwritable_run_directory_fails_before_training(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(ckpt.tempfile, "mkstemp", refuse)  # what a read-only place does, for any user
    monkeypatch.setattr("fvlib.training.loop.build_model", lambda *a: pytest.fail("built a model"))
    with pytest.raises(RunDirError, match="run is not writable .*Permission denied"):
        train(SMALL, out_dir=tmp_path / "run", progress=False)


def test_patch_on_a_file_says_it_is_not_a_directory(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(["patch", "--run", str(tmp_path / "f")]) == 2
    assert capsys.readouterr().err.strip() == f"fvlib: error: --run: {tmp_path / 'f'} is a file, not a run directory"


def test_patch_on_a_corrupt_run_names_the_file(run_dir, capsys):
    path = run_dir / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-64:] = bytes(64)
    path.write_bytes(bytes(data))
    assert main(["patch", "--run", str(run_dir), "--contexts", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path.name} and manifest.json in {path.parent} disagree" in err[0]


# ----- worker processes end with their parent -----------------------------------------------
def children(pid: int) -> set[int]:
    """The live (not zombie) child processes of ``pid`` (Linux /proc)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(stat.parent.name))
    return out


def alive(pids) -> set[int]:
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(pid)
    return out


PARALLEL = """
import sys
from fvlib.experiments.inbuild import train_parallel
from fvlib.training import TrainConfig
config = TrainConfig(**{config})
train_parallel([config, TrainConfig(**{{**config.to_dict(), "seed": 1}})], jobs=2, root=sys.argv[1])
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("command", ["train_parallel", "warm"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_parallel_training_leaves_no_worker(tmp_path, command, sig):
    root = tmp_path / "runs"
    if command == "warm":
        argv = [sys.executable, "-m", "fvlib", "warm", "--jobs", "2", "--root", str(root)]
    else:
        long = dataclasses.replace(SMALL, steps=10**6, checkpoint_every=10**6)
        argv = [sys.executable, "-c", PARALLEL.format(config=long.to_dict()), str(root)]
    started = 2
    if command == "warm":
        from fvlib.experiments.inbuild import warm_work

        started = len(warm_work()[0]) + 1  # the first item's runs (one worker), one run of the second
    parent = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while len(list(root.glob("*/config.json"))) < started:  # both workers are training
            assert parent.poll() is None and time.monotonic() < deadline, parent.stderr.read()
            time.sleep(0.2)
        workers = children(parent.pid)
        assert len(workers) >= 2
        parent.send_signal(sig)
        parent.wait(timeout=60)
        deadline = time.monotonic() + 10
        while alive(workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(workers), f"workers {alive(workers)} outlived their parent"
        if sig == signal.SIGTERM:
            assert parent.returncode == 128 + signal.SIGTERM and "Traceback" not in parent.stderr.read()
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in alive(workers):
            os.kill(pid, signal.SIGKILL)
