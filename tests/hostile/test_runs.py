"""A training run never loses work: whatever stops it (a full disk, a second Ctrl-C, a kill, a NaN loss, a lost stderr
reader, a second run into the same folder), --out holds one whole save that --resume continues, and a folder that is
not a run of ours is never written over.

Expected values come from an uninterrupted run of the same command: a run cut off anywhere and resumed must end with
its weights and its log. Cuts are injected in this process at every file operation of a run (os.replace, os.mkdir,
os.rmdir; os.fsync for a full disk), which is where a second Ctrl-C or a kill can change what the folder holds.
"""
import errno
import functools
import io
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gpt2_numpy import cores
from gpt2_numpy.commands import train as train_module
from gpt2_numpy.errors import Gpt2NumpyError
from gpt2_numpy.formats.safetensors import read_metadata
from gpt2_numpy.tokenizer import load_tokenizer
from tests.conftest import REPO, assert_one_error_line, tiny_models_dir
from tests.cli.test_train import assert_same_weights, log_rows, train, weights
from scripts.common.text_samples import WORDS

pytestmark = pytest.mark.slow  # every case trains and cuts a run: the quick lane leaves them out

SHAPE = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--n-ctx", "64", "--seq-len", "32", "--batch-size", "2"]
# The two saves a cut can hit. The first, into an empty folder: a run of 0 steps, nothing trained. A later one, over
# the save of step 1: a run resumed to step 2. Each run, uninterrupted, is the reference its cut runs must end as.
START = [*SHAPE, "--eval-batches", 1, "--eval-every", 100, "--schedule", "constant", "--steps"]
SCENARIOS = {  # name: (the step saved in the folder first or None, the command cut, what --resume continues it with)
    "the first save": (None, [*START, 0], ["--resume", "--steps", 0]),
    "a later save": (1, ["--resume", "--steps", 2], ["--resume", "--steps", 2]),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):  # -> a text file of about 1,500 tokens of English-like sentences (6 KB)
    rng = random.Random(0)
    sentences = [" ".join(rng.choices(WORDS, k=rng.randint(4, 12))).capitalize() + "." for _ in range(150)]
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def quick_runs(monkeypatch):  # the many runs in this process, each a second or less, and the few in subprocesses
    monkeypatch.setattr(train_module, "load_tokenizer", functools.cache(load_tokenizer))  # 1.5 MB read once
    # all on one thread: OpenBLAS's idle threads spin for a tenth of a second after each product, which made tiny
    # runs 5 times slower on a busy machine
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    with cores.all_cores(), cores.one_core():
        yield


def run_here(data, out, *args):  # -> train.run's exit status, or what it raised, in this process
    try:
        return train_module.run(["--data", str(data), "--out", str(out), *map(str, args)])
    except (Gpt2NumpyError, KeyboardInterrupt, Killed) as error:
        return error


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):  # -> {steps: the folder of a run of START to that step, never cut}
    folders = {steps: tmp_path_factory.mktemp("uninterrupted") / f"{steps}-steps" for steps in (0, 1, 2)}
    for steps, out in folders.items():
        assert run_here(data, out, *START, steps) == 0
    return folders


def saved_step(out):  # -> the step of the whole save in out; None when nothing is saved there
    if not (out / "train_state.npz").exists():
        return None
    step = int(np.load(out / "train_state.npz")["step"])
    assert read_metadata(out / "model.safetensors")["step"] == str(step)  # the weights --model loads are the state's
    return step


class Killed(BaseException):
    """A kill: train.py catches nothing of this kind, so nothing it does on the way out repairs the folder."""


class Cuts:
    """Counts calls of some os functions; the at-th raises error, after doing its work or (before=True) instead."""

    def __init__(self, monkeypatch, names, at, error, before=False):
        self.calls, self.at, self.error, self.before = 0, at, error, before
        for name in names:
            patch_everywhere(monkeypatch, os, name, self.wrap(getattr(os, name)))

    def wrap(self, real):
        def cut(*args, **kwargs):
            self.calls += 1
            if self.calls == self.at and self.before:
                raise self.error
            try:
                return real(*args, **kwargs)
            finally:
                if self.calls == self.at:  # also after an operation that failed (mkdir of a folder that exists)
                    raise self.error
        return cut


def cut_at_every_operation(data, tmp_path, monkeypatch, uninterrupted, scenario, names, error, before=False):
    # -> (folder, what the run returned or raised) of the scenario's command cut at the 1st call of os.<names>, then
    # at the 2nd, ..., until a run makes fewer calls
    saved, command, _ = SCENARIOS[scenario]
    for at in range(1, 1000):
        out = tmp_path / f"cut-{at}"
        if saved is not None:
            shutil.copytree(uninterrupted[saved], out)
        with monkeypatch.context() as patch:
            cuts = Cuts(patch, names, at, error, before)
            outcome = run_here(data, out, *command)
        if cuts.calls < at:  # not cut: every operation has been
            assert outcome == 0, outcome
            return
        yield out, outcome


def assert_goes_on_as_uninterrupted(data, out, scenario, uninterrupted):  # the user's next command, once the cut run
    # has stopped, ends as the uninterrupted run: the same command again, and --resume if told so
    _, command, resume = SCENARIOS[scenario]
    outcome = run_here(data, out, *command)
    if "already holds a training run: add --resume" in str(outcome):
        outcome = run_here(data, out, *resume)
    assert outcome == 0, (out, outcome)
    steps = resume[-1]
    assert_same_weights(uninterrupted[steps], out)
    assert saved_step(out) == steps
    if steps:  # every step logged once, with the uninterrupted run's losses
        assert [(row["step"], row["train_loss"]) for row in log_rows(out)] == [
            (row["step"], row["train_loss"]) for row in log_rows(uninterrupted[steps])]
    shutil.rmtree(out)


def npz(**arrays):  # -> the bytes of an .npz file holding arrays
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


@pytest.mark.parametrize("staged", [b"garbage\n", b"PK\x03\x04cut", npz(step=np.float64("inf"))],
                         ids=["text", "a cut zip", "step inf"])  # each was a traceback at every later --resume
def test_a_staged_save_that_cannot_be_read_is_dropped_as_never_whole(tmp_path, data, uninterrupted, staged):
    out = tmp_path / "run"
    shutil.copytree(uninterrupted[1], out)
    (out / ".train.save").mkdir()
    (out / ".train.save" / "train_state.npz").write_bytes(staged)
    assert_goes_on_as_uninterrupted(data, out, "a later save", uninterrupted)


# --- --out: someone else's folder, another run ---


@pytest.mark.parametrize("case", ["model", "log", "openai"])
def test_a_folder_that_is_not_a_run_is_refused_and_left_as_it_was(tmp_path, data, case):
    out, args = tmp_path / "precious", [*SHAPE, "--steps", 1]
    if case == "model":  # a model folder of the user's, with a hand-written config
        out.mkdir()
        (out / "config.json").write_text('{"n_layer": 1, "written": "by hand"}')
        (out / "model.safetensors").write_bytes(b"the user's weights")
        args[-1] = 0
    elif case == "log":  # --steps 1 used to replace log.csv too
        out.mkdir()
        (out / "log.csv").write_text("the user's own log\n")
    else:  # an OpenAI checkpoint, as a models dir holds it: fine-tuning into it used to hide the trained weights
        out = tiny_models_dir(tmp_path) / "124M"
        args = ["--init", "124M", "--steps", 1]
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    result = train(data, out, out.parent, *args)
    assert_one_error_line(result, f"--out {out} holds files that are not a training run")
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before  # nothing written, not even a lock
    assert ("checkpoint" if case == "openai" else "config.json" if case == "model" else "log.csv") in result.stderr


def test_a_second_run_into_the_same_out_stops_at_once(tmp_path, data):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen([sys.executable, "-m", "gpt2_numpy.train", "--data", str(data), "--out", str(out),
                              *SHAPE, "--steps", "100000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=env)
    try:
        deadline = time.monotonic() + 60
        while not (out / "log.csv").exists():  # training has begun
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        for args in ([*SHAPE, "--steps", 10], ["--resume", "--steps", 10]):
            assert_one_error_line(train(data, out, tmp_path, *args), f"another training run holds {out}")
        assert first.poll() is None  # still running, untouched
    finally:
        first.kill()
        first.wait()
    # a killed run leaves no stale lock, and its last save resumes
    result = train(data, out, tmp_path, "--resume", "--steps", 1)
    assert result.returncode == 0, result.stderr


# --- Cut off: a second Ctrl-C, a kill, a full disk ---


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("cut", [KeyboardInterrupt, Killed], ids=["second Ctrl-C", "kill"])
def test_a_run_cut_at_any_file_operation_goes_on_as_the_uninterrupted_run(tmp_path, data, monkeypatch, uninterrupted,
                                                                           scenario, cut):
    cuts = cut_at_every_operation(data, tmp_path, monkeypatch, uninterrupted, scenario, ("replace", "mkdir", "rmdir"),
                                  cut())
    for at, (out, outcome) in enumerate(cuts, 1):
        if cut is Killed:
            assert isinstance(outcome, Killed), outcome
        elif at == 1:  # making the folder, before the run took its lock: nothing to say but "stopped by Ctrl-C"
            assert isinstance(outcome, KeyboardInterrupt), outcome
        else:  # stopped at once, saying which save is kept, the folder settled
            saved = saved_step(out)
            assert type(outcome).__name__ == "Interrupted", outcome
            assert ("nothing was saved" if saved is None else f"the last save (step {saved}) is kept") in str(outcome)
            assert not (out / ".train.save").exists()
        assert_goes_on_as_uninterrupted(data, out, scenario, uninterrupted)
    assert at >= 13  # the 12 operations of a save, and the folder or the log made


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_full_disk_keeps_the_last_save_and_the_run_goes_on_once_there_is_room(tmp_path, data, monkeypatch,
                                                                               uninterrupted, scenario):
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    cuts = cut_at_every_operation(data, tmp_path, monkeypatch, uninterrupted, scenario, ("fsync",), full, before=True)
    for at, (out, outcome) in enumerate(cuts, 1):
        message, saved = str(outcome), saved_step(out)
        assert type(outcome).__name__ == "TrainingFailed" and outcome.exit_code == 1, outcome
        assert message == f"cannot write to {out} (No space left on device): free some disk space, " + after(saved)
        assert ".tmp" not in message and ".train.save" not in message  # never a temporary name
        assert not (out / ".train.save").exists()  # the cut save is gone: it would take the room freed
        assert_goes_on_as_uninterrupted(data, out, scenario, uninterrupted)
    assert at >= 11  # each of a save's 5 files, its folder, and the 5 renames


@pytest.mark.parametrize("saved", [None, 1], ids=["nothing saved", "a save"])
def test_a_read_only_out_says_which_save_is_kept_and_names_no_temporary(tmp_path, data, monkeypatch, saved):
    out = tmp_path / "out"
    out.mkdir()
    if saved:
        assert run_here(data, out, *SHAPE, "--steps", saved) == 0
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    with monkeypatch.context() as patch:
        read_only(patch, out)
        outcome = run_here(data, out, *(["--resume", "--steps", 3] if saved else [*SHAPE, "--steps", 3]))
    message = str(outcome)
    assert type(outcome).__name__ == "TrainingFailed", outcome
    assert message == (f"cannot write to {out} (Read-only file system): its file system is read-only: remount it "
                       f"writable, {after(saved)}")
    assert "free some disk space" not in message and ".tmp" not in message
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before


def after(saved):  # -> the end of a disk error's line, after its fix: what to do next, and which save is kept
    # nothing saved: --resume would find nothing to continue; a save: another --out would start over without it
    if saved is None:
        return "or choose another --out; nothing was saved"
    return f"then continue with the same command and --resume; the last save (step {saved}) is kept"


def read_only(monkeypatch, folder):  # -> None: writing in folder, or making a folder in it, fails as on a read-only
    # disk
    real_open, real_mkdir = io.open, os.mkdir

    def refused(path):  # -> True for a path inside folder
        return isinstance(path, (str, os.PathLike)) and folder in Path(path).parents

    def open_for_reading(path, mode="r", *args, **kwargs):
        if refused(path) and set(mode) & set("wax+"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, mode, *args, **kwargs)

    def mkdir_if_there(path, *args, **kwargs):  # mkdir of an existing folder says EEXIST, on a read-only disk too
        if refused(path) and not os.path.exists(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_mkdir(path, *args, **kwargs)

    patch_everywhere(monkeypatch, io, "open", open_for_reading)
    patch_everywhere(monkeypatch, os, "mkdir", mkdir_if_there)


def patch_everywhere(monkeypatch, module, name, replacement):  # -> None: module.<name> is replacement, in pathlib too
    # Before Python 3.11, Path.mkdir, .rmdir, .replace (and on 3.10 .open) call the functions pathlib took at import,
    # through its _normal_accessor, and not os.mkdir or io.open: a patch of os alone missed every Path call there.
    real = getattr(module, name)
    monkeypatch.setattr(module, name, replacement)
    accessor = getattr(pathlib, "_normal_accessor", None)
    if getattr(accessor, name, None) is real:
        monkeypatch.setattr(accessor, name, replacement)


# --- A NaN, a lost stderr ---


def test_a_diverging_run_stops_at_the_first_nan_keeping_the_last_good_save(tmp_path, data):
    out = tmp_path / "out"
    result = train(data, out, tmp_path, *SHAPE, "--lr", "1e6", "--warmup", "0", "--steps", 20, "--save-every", 1)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    assert "Warning" not in result.stderr  # no NumPy RuntimeWarnings before it
    found = re.fullmatch(r"error: step (\d+): .* training diverged; the last save \(step (\d+)\) is kept; .*",
                         errors[0])
    assert found and "lower --lr" in errors[0] and "longer --warmup" in errors[0], errors[0]
    stopped, saved = map(int, found.groups())
    assert stopped < 20 and saved == stopped - 1  # the save of every step before the first non-finite one
    assert saved_step(out) == saved
    assert all(np.isfinite(array).all() for array in weights(out).values())
    assert [int(row["step"]) for row in log_rows(out)] == list(range(saved + 1))
    assert "nan" not in (out / "log.csv").read_text()


@pytest.mark.parametrize("stderr", ["closed", "full"])
def test_losing_stderr_does_not_stop_the_run(tmp_path, data, stderr):
    if stderr == "full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full (Linux's always-full device) on this system")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TQDM_MININTERVAL": "0"}  # the bar writes at every step
    command = [sys.executable, "-m", "gpt2_numpy.train", "--data", str(data), "--out", str(out), *SHAPE, "--steps",
               "10"]
    if stderr == "closed":  # `train ... 2>&1 | head -c 100`: the reader quits after 100 bytes
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        assert len(child.stderr.read(100)) == 100
        child.stderr.close()
    else:  # every write to stderr fails with ENOSPC, which is not --out's disk
        with open("/dev/full", "w") as full:
            child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=full, env=env)
    assert child.wait(timeout=120) == 0
    assert saved_step(out) == 10
    assert [int(row["step"]) for row in log_rows(out)] == list(range(11))
