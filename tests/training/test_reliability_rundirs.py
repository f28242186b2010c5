"""Issue 41, items 3 and 5: run directories that refuse what they cannot check, no command that
eats a user's files, refusals that name the flag. Each test carries the id of its row in the
reliability case list (the adversarial user's cases); tiny runs, the CLI called in-process."""

import fcntl
import json
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time

import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import fvlib.files as disk
from fvlib.cli import main
from fvlib.training import RunDirError, TrainConfig, TrainingInterrupted, load_run, repair_run, train_many
from fvlib.training.rundir import commit

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

FLAGS = ["--model", "A", "--depth", "2", "--n-ctx", "8", "--budget", "2", "--steps", "20", "--batch", "16",
         "--width", "16", "--no-progress", "--json"]
FILES = ("config.json", "train_state.safetensors", "model.safetensors", "history.json")


def train_argv(out, *extra):
    """``train`` with FLAGS, a flag of FLAGS given in ``extra`` taking its value there."""
    pairs = [(FLAGS[i], FLAGS[i + 1]) for i in range(0, len(FLAGS) - 2, 2)]
    kept = [item for flag, value in pairs if flag not in extra for item in (flag, value)]
    return ["train", *kept, "--no-progress", "--json", *extra, "--out", str(out)]


def run_cli(argv, capsys):
    """``(exit status, stdout, stderr lines)`` of the CLI called in-process."""
    status = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err.strip().splitlines()


def refused(argv, capsys, *words):
    """The command exits 2 with one line holding every one of ``words`` and no errno text."""
    status, out, err = run_cli(argv, capsys)
    assert status == 2 and out == "" and len(err) == 1, err
    assert err[0].startswith("fvlib: error: ") and "Errno" not in err[0] and "Traceback" not in err[0], err
    for word in words:
        assert word in err[0], (word, err[0])
    return err[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished tiny runs: ``base`` (FLAGS) and ``other`` (another width and learning rate)."""
    root = tmp_path_factory.mktemp("runs")
    for name, extra in (("base", []), ("other", ["--width", "8", "--lr", "0.02"])):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("OMP_NUM_THREADS", "1")
            assert main(train_argv(root / name, *extra)) == 0
    return root / "base", root / "other"


@pytest.fixture
def run(runs, tmp_path):
    """A copy of the base run to forge."""
    target = tmp_path / "run"
    shutil.copytree(runs[0], target)
    return target


def resign(run_dir, step=20):
    """Write the manifest again over the files as they are now (a forged, consistent checkpoint)."""
    commit(run_dir, step, {}, keep=FILES)


def edit_json(path, change):
    payload = json.loads(path.read_text())
    payload = change(payload) or payload
    path.write_text(json.dumps(payload))


# ---------------------------------------------------------------------------------------------
# item 3: every file validated when read
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["C18p", "C18g", "C18t"])
def test_C18_an_edited_manifest_names_both_files(run, capsys, case):
    edit_json(run / "manifest.json", lambda m: m["files"]["model.safetensors"].update(sha256="0" * 64))
    argv = {"C18p": ["patch", "--run", run, "--contexts", "20", "--json"],
            "C18g": ["gap", "--run", run, "--contexts", "20", "--json"], "C18t": train_argv(run)}[case]
    refused(argv, capsys, "model.safetensors and manifest.json", "disagree", "corrupt or was edited")


def test_C21p_a_run_without_manifest_is_refused_naming_repair(run, capsys):
    (run / "manifest.json").unlink()
    weights = load_file(str(run / "model.safetensors"))
    name = next(iter(weights))
    weights[name].view(-1)[0] *= -1  # a flipped sign bit: nothing without a manifest can tell
    save_file(weights, str(run / "model.safetensors"), metadata={"step": "20"})
    refused(["patch", "--run", run, "--contexts", "50", "--json"], capsys, "--run", "no manifest.json", "--repair")


@pytest.mark.parametrize("case", ["F-config_format-p", "F-config_format-t", "F-manifest_future-p",
                                  "F-manifest_future-t"])
def test_F_future_formats_are_refused_naming_the_version(run, capsys, case):
    if "config" in case:
        edit_json(run / "config.json", lambda c: c.update(version=99))
        resign(run)
        where = "config.json is format 'fvlib-run' version 99"
    else:
        edit_json(run / "manifest.json", lambda m: m.update(format="something-else", version=99))
        where = "manifest.json is format 'something-else' version 99"
    argv = ["patch", "--run", run, "--contexts", "20", "--json"] if case.endswith("-p") else train_argv(run)
    refused(argv, capsys, where, "this fvlib reads")


@pytest.mark.parametrize("case", ["F-manifest_bytes_str-p", "F-manifest_bytes_str-t"])
def test_F_a_manifest_field_of_the_wrong_type_is_named(run, capsys, case):
    edit_json(run / "manifest.json", lambda m: m["files"]["model.safetensors"].update(
        bytes=str(m["files"]["model.safetensors"]["bytes"])))
    argv = ["patch", "--run", run, "--contexts", "20", "--json"] if case.endswith("-p") else train_argv(run)
    refused(argv, capsys, "'files.model.safetensors.bytes' must be an integer, got '")


@pytest.mark.parametrize("case, history, words", [
    ("F-history_nan-t", None, ["entry 1 has eval_excess_loss nan, not a finite number"]),
    ("F-history_bad_entries-t", [1, 2, "x"], ["entry 0 is 1, not an evaluation"]),
])
def test_F_history_entries_must_be_evaluations(run, capsys, case, history, words):
    def forge(payload):
        if history is None:
            payload["history"][1]["eval_excess_loss"] = math.nan
        else:
            payload["history"] = history
    edit_json(run / "history.json", forge)
    resign(run)
    refused(train_argv(run), capsys, "history.json", *words)
    with pytest.raises(RunDirError, match="invalid history"):
        load_run(run)


def test_F_state_opt_shape_is_refused_before_adam_sees_it(run, capsys):
    path = run / "train_state.safetensors"
    tensors = load_file(str(path))
    name = next(k for k in tensors if k.endswith("exp_avg") and tensors[k].ndim == 2)
    tensors[name] = tensors[name][:, :1].contiguous()
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    save_file(tensors, str(path), metadata=metadata)
    resign(run)
    refused(train_argv(run, "--steps", "20"), capsys, "train_state.safetensors holds", repr(name), "its parameter has")


def test_LIB_eval_contexts_1_is_refused():
    with pytest.raises(ValueError, match="eval_contexts must be an integer >= 2, got 1"):
        TrainConfig(depth=2, n_ctx=8, budget=2, steps=5, eval_contexts=1)


# ---------------------------------------------------------------------------------------------
# runs without manifest: refused, then repaired
# ---------------------------------------------------------------------------------------------
def legacy_with(run, other, name):
    """The run without manifest, ``name`` taken from another run (what L01/L02 forged)."""
    (run / "manifest.json").unlink()
    shutil.copy(other / name, run / name)


@pytest.mark.parametrize("case, name, words", [
    ("L01", "train_state.safetensors", ["train_state.safetensors holds", "of shape", "its parameter has"]),
    ("L02", "history.json", ["history.json", "has lr", "the history of another run?"]),
])
def test_L_a_legacy_run_with_another_runs_file_is_refused_then_fails_its_repair(runs, run, capsys, case, name,
                                                                                 words):
    legacy_with(run, runs[1], name)
    refused(train_argv(run), capsys, "--out: ", "--repair", "no manifest.json")
    status, out, err = run_cli(train_argv(run, "--repair"), capsys)
    assert status == 2 and out == "" and err[0].startswith("fvlib: repair: config.json: an fvlib run config"), err
    assert err[-1].startswith("fvlib: error: ") and all(word in err[-1] for word in words), err
    assert not (run / "manifest.json").exists()


def test_repair_checks_a_legacy_run_writes_its_manifest_and_goes_on(run, capsys):
    (run / "manifest.json").unlink()
    status, out, err = run_cli(train_argv(run, "--repair"), capsys)
    assert status == 0 and json.loads(out)["steps"] == 20, err
    assert err[-1] == "fvlib: repair: wrote manifest.json (checkpoint of step 20)" and len(err) == 7, err
    assert repair_run(run) == ["manifest.json present: every file matches it, nothing to repair"]
    assert repair_run(run.parent / "new") == ["no checkpoint files: nothing to repair"]


# ---------------------------------------------------------------------------------------------
# item 1: train --out eats nothing
# ---------------------------------------------------------------------------------------------
def test_O08_an_empty_out_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused(train_argv(""), capsys, "--out", "empty path")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case, name", [("O05", "a" * 300), ("O06", "d" * 256)])
def test_O05_O06_an_over_long_out_names_the_flag(tmp_path, capsys, case, name):
    refused(train_argv(tmp_path / name), capsys, "--out", "too long a path for the file system")


def test_O11_a_users_own_files_are_never_touched(tmp_path, capsys):
    user = tmp_path / "userproj2"
    user.mkdir()
    (user / "config.json").write_text('{"name": "my project"}')
    (user / "history.json").write_text("[1, 2, 3]")
    before = {p.name: p.read_bytes() for p in user.iterdir()}
    refused(train_argv(user), capsys, f"--out: {user} is not an fvlib run directory", "config.json",
            "nothing was touched")
    (user / "config.json").unlink()
    refused(train_argv(user), capsys, "history.json but no config.json")
    assert {p.name: p.read_bytes() for p in user.iterdir()} == {"history.json": before["history.json"]}


def test_a_run_killed_before_its_first_checkpoint_starts_fresh(runs, tmp_path, capsys):
    """O11's other side: a directory with only the lock and config of the same run is a run's."""
    target = tmp_path / "run"
    target.mkdir()
    shutil.copy(runs[0] / "config.json", target / "config.json")
    (target / "run.lock").write_text("")
    status, out, err = run_cli(train_argv(target), capsys)
    assert status == 0, err


def test_O12_a_symlink_loop_says_so(tmp_path, capsys):
    (tmp_path / "loop1").symlink_to(tmp_path / "loop1")
    refused(train_argv(tmp_path / "loop1"), capsys, "--out", "loop of symbolic links")


def test_S06_a_checkpoint_that_cannot_be_written_names_the_file_and_the_step_kept(tmp_path, capsys, monkeypatch):
    real = disk.replace_file

    def immutable(src, dst):
        if dst.name == "model.safetensors":
            raise PermissionError(1, "Operation not permitted")
        real(src, dst)

    monkeypatch.setattr(disk, "replace_file", immutable)
    refused(train_argv(tmp_path / "imm"), capsys, "model.safetensors", "the run keeps step 20")


# ---------------------------------------------------------------------------------------------
# item 4: refusals name the flag; a config mismatch names the fields
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case, extra, words", [
    ("D01", ["--lr", "0.02"], ["--lr 0.02 here, 0.01 in the run", "(use another --out"]),
    ("D02", ["--steps", "40"], ["--steps 40 here, 20 in the run", "is finished", "cannot be extended"]),
    ("D03", ["--model", "B"], ["--model B here, A in the run"]),
])
def test_D_a_config_mismatch_names_the_flags_that_differ(run, capsys, case, extra, words):
    line = refused(train_argv(run, *extra), capsys, f"--out {run} holds a run with another config", *words)
    assert "TrainConfig(" not in line and "resume=False" not in line and len(line.replace(str(run), "")) < 250


def test_CC2_the_mismatch_is_found_before_waiting_on_the_lock(run, capsys):
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\n"
                               "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True)\n"
                               "time.sleep(30)", str(run / "run.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with open(run / "run.lock") as f:  # the lock is really held
            with pytest.raises(BlockingIOError):
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        refused(train_argv(run, "--lr", "0.02"), capsys, "--lr 0.02 here, 0.01 in the run")
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("case, extra, words", [
    ("R05", ["--warmup", "-0.1"], ["--warmup must be a fraction in [0, 1), got -0.1"]),
    ("Q01", ["--arch", "transformer", "--expected-loss"], ["--expected-loss needs", "got --arch transformer"]),
    ("Q02", ["--model", "B", "--router-warm-start", "100"], ["--router-warm-start does nothing", "model B"]),
    ("Q03", ["--prior", "gaussian", "--alpha-start", "0.7"], ["--alpha-start (a curriculum", "--prior gaussian"]),
    ("Q04", ["--queries", "5"], ["--queries 5 does nothing under the expected loss"]),
    ("Q05", ["--imitation", "--router-warm-start", "0"], ["--imitation with --router-warm-start 0 leaves no"]),
    ("Q06", ["--depth", "4", "--depth", "2"], ["argument --depth: given twice (--depth 4, then --depth 2)"]),
    ("Q07", ["--dep", "3"], ["unrecognized arguments: --dep 3"]),
    ("Q10", ["--router-lr-scale", "0.5"], ["--router-lr-scale does nothing without a warm start"]),
    ("Q06-bool", ["--expected-loss", "--no-expected-loss"], ["given twice (--expected-loss, then --no-expected-loss)"]),
    ("seed", ["--seed", "-1"], ["--seed must be an integer in [0, 4294967295], got -1"]),
])
def test_Q_R05_refusals_name_the_flag_the_user_typed(tmp_path, capsys, case, extra, words):
    refused(train_argv(tmp_path / "q", *extra), capsys, *words)
    assert not (tmp_path / "q").exists()


def test_Q_the_flags_that_act_are_still_taken(tmp_path, capsys):
    """The refusals are of flags that do nothing: the same flags where they act train."""
    argv = train_argv(tmp_path / "q", "--steps", "3", "--imitation", "--router-warm-start", "2",
                      "--router-lr-scale", "0.5", "--no-expected-loss", "--queries", "4")
    status, out, err = run_cli(argv, capsys)
    assert status == 0, err
    config = load_run(tmp_path / "q")[1]
    assert (config.router_warm_start, config.router_lr_scale, config.queries) == (2, 0.5, 4)


# ---------------------------------------------------------------------------------------------
# item 6: Ctrl-C checkpoints
# ---------------------------------------------------------------------------------------------
def test_SIG1_ctrl_c_checkpoints_and_the_resumed_run_ends_bit_for_bit(runs, tmp_path, capsys, monkeypatch):
    """A real SIGINT (to this process) at step 7: the run stops after that step with a checkpoint
    of step 7, exit 130, saying so; the same command resumes and ends where the uninterrupted run
    ends, bit for bit."""
    import fvlib.training.loop as loop

    real_step, calls = loop.training_step, []

    def step_then_ctrl_c(*args, **kwargs):
        calls.append(1)
        loss = real_step(*args, **kwargs)
        if len(calls) == 7:
            os.kill(os.getpid(), signal.SIGINT)
        return loss

    monkeypatch.setattr(loop, "training_step", step_then_ctrl_c)
    out_dir = tmp_path / "sig"
    status, out, err = run_cli(train_argv(out_dir), capsys)
    assert status == 130 and err == [f"fvlib: interrupted at step 7; checkpoint written to {out_dir}: the same "
                                     f"command resumes from it"], err
    assert json.loads((out_dir / "manifest.json").read_text())["step"] == 7
    monkeypatch.setattr(loop, "training_step", real_step)
    assert main(train_argv(out_dir)) == 0
    assert (out_dir / "model.safetensors").read_bytes() == (runs[0] / "model.safetensors").read_bytes()
    resumed, whole = (json.loads((d / "history.json").read_text())["history"] for d in (out_dir, runs[0]))
    strip = [{k: v for k, v in e.items() if k != "seconds"} for e in resumed]
    assert strip == [{k: v for k, v in e.items() if k != "seconds"} for e in whole]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored after training
    copy = pickle.loads(pickle.dumps(TrainingInterrupted(out_dir, 7)))  # as from a worker process
    assert (str(copy), copy.step, copy.saved) == (f"interrupted at step 7; checkpoint written to {out_dir}", 7, True)


def ctrl_c_after(calls: int, step):
    """``step`` wrapped to send this process a real SIGINT after its ``calls``-th call."""
    done = []

    def wrapped(*args, **kwargs):
        result = step(*args, **kwargs)
        done.append(1)
        if len(done) == calls:
            os.kill(os.getpid(), signal.SIGINT)
        return result

    return wrapped


def test_SIG1_train_many_checkpoints_every_run_on_ctrl_c(tmp_path, monkeypatch):
    """``experiment run`` trains with train_many: Ctrl-C checkpoints each of its runs at the step
    reached, and calling it again ends where an uninterrupted call ends, bit for bit."""
    import fvlib.training.batched as batched

    configs = [TrainConfig(depth=2, n_ctx=8, budget=2, steps=12, batch=8, width=8, eval_every=5, seed=seed,
                           device="cpu") for seed in (0, 1)]
    whole = train_many(configs, [tmp_path / "w0", tmp_path / "w1"], progress=False)
    dirs = [tmp_path / "i0", tmp_path / "i1"]
    monkeypatch.setattr(batched._Stack, "train_step", ctrl_c_after(5, batched._Stack.train_step))
    with pytest.raises(TrainingInterrupted, match="interrupted at step 5; checkpoint written to each of its 2 run"):
        train_many(configs, dirs, progress=False)
    assert [json.loads((d / "manifest.json").read_text())["step"] for d in dirs] == [5, 5]
    monkeypatch.undo()
    resumed = train_many(configs, dirs, progress=False)
    assert [r.final_loss for r in resumed] == [r.final_loss for r in whole]
    for a, b in zip(resumed, whole):
        assert all((p == q).all() for p, q in zip(a.model.parameters(), b.model.parameters()))


def test_SIG1_a_real_ctrl_c_to_the_command_checkpoints_and_says_it_resumes(tmp_path):
    """The command in its own process, sent SIGINT once its first checkpoint is written: exit 130,
    one line naming the step, whose checkpoint the directory holds (that a resumed run ends bit for
    bit where an uninterrupted one ends is the in-process test above)."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "fvlib", *[str(a) for a in train_argv(out, "--steps", "1000000")]]
    child = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 60
        while not (out / "manifest.json").exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    step = json.loads((out / "manifest.json").read_text())["step"]
    assert child.returncode == 130 and err.strip().splitlines() == [
        f"fvlib: interrupted at step {step}; checkpoint written to {out}: the same command resumes from it"], err
    assert step >= 500 and load_run(out)[2][-1]["step"] <= step
