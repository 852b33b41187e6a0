"""Resuming, fine-tuning a model folder and the data pipeline of `python -m gpt2_numpy.train`, on tiny models.

Expected values come from outside the code under test: window counts and the schedule worked out by hand from their
definitions, an uninterrupted run for an interrupted one, GPT-2's published layer-norm epsilon, and Hugging Face's
logits for a folder written by save_model (tests/fixtures/reference_epsilon.npz:
scripts/fixtures/make_epsilon_reference.py).
"""
import csv
import inspect
import json
import math
import io
import os
import re
import shutil
import signal
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from gpt2_numpy import fast, fast_backward, model, training
from gpt2_numpy.commands import train as train_command
from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.interpret import repeated_tokens, trace
from gpt2_numpy.params import gpt2_init, random_params
from gpt2_numpy.save import save_model
from gpt2_numpy.tokenizer import PACKAGED_VOCABULARY
from gpt2_numpy.training import Batches, eval_loss, val_windows
from tests.conftest import FIXTURES, HF_TOLERANCE, REPO, assert_one_error_line
from tests.cli.test_train import SHAPE, assert_same_weights, log_rows, run_cli, weights

TINY = json.loads((FIXTURES / "configs.json").read_text())["tiny"]
# 8-token windows, half the text held out: a text of a hundred tokens makes an epoch of a few steps
FLAGS = [*SHAPE, "--seq-len", 8, "--batch-size", 2, "--eval-batches", 1, "--warmup", 2, "--lr", 1e-2,
         "--val-fraction", 0.5]


def train(data, out, *args):  # -> CompletedProcess of the train command (from scratch: no models dir needed)
    return run_cli("gpt2_numpy.train", "--data", data, "--out", out, *args)


def a_tokens(path, n_tokens):  # -> path, holding a text of exactly n_tokens GPT-2 tokens: "a", then " a" (ids 64, 257)
    path.write_text(("a" + " a" * (n_tokens - 1)) if n_tokens else "", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def short_text(tmp_path_factory):  # -> a text of 100 tokens: with FLAGS, 6 training windows, so 3 steps an epoch
    return a_tokens(tmp_path_factory.mktemp("data") / "short.txt", 100)


def snapshot(folder):  # -> {file name: bytes} of a folder
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


# --- The data, counted by hand ---


@pytest.mark.parametrize("n_tokens, n_windows", [
    (50, 7),  # windows of 7 + 1 tokens start at 0, 7, ..., 42; the last ends at token 49, the stream's last
    (56, 7),  # a multiple of 7: a window at 49 would need token 56, one past the end
    (57, 8),  # now it fits
])
def test_every_epoch_visits_every_window_once(n_tokens, n_windows):
    seq_len, batch_size, epochs = 7, 3, 4  # 3 does not divide the windows: batches straddle the epochs
    batches = Batches(np.arange(n_tokens, dtype=np.int32), seq_len, batch_size, seed=5)
    starts = []
    for _ in range(math.ceil(epochs * n_windows / batch_size)):
        inputs, targets = batches.next()
        assert inputs.shape == targets.shape == (batch_size, seq_len)
        # tokens equal to their positions: each row is a run of seq_len positions, its targets one ahead
        np.testing.assert_array_equal(inputs, inputs[:, :1] + np.arange(seq_len))
        np.testing.assert_array_equal(targets, inputs + 1)
        starts += list(inputs[:, 0])
    every_window = list(range(0, seq_len * n_windows, seq_len))
    orders = [starts[i: i + n_windows] for i in range(0, epochs * n_windows, n_windows)]
    for order in orders:
        assert sorted(order) == every_window
    assert len({tuple(order) for order in orders}) > 1  # a new order each epoch


def test_restored_batches_continue_as_the_original_across_epochs():
    tokens, seq_len, batch_size = np.arange(60, dtype=np.int32), 7, 2  # 8 windows, 4 batches an epoch
    original = Batches(tokens, seq_len, batch_size, seed=3)
    for _ in range(6):  # into the second epoch: the RNG has drawn two orders
        original.next()
    resumed = Batches(tokens, seq_len, batch_size, seed=3)
    resumed.restore(original.state())
    for _ in range(12):  # through the third and fourth epochs, whose orders come from the restored RNG
        np.testing.assert_array_equal(resumed.next()[0], original.next()[0])


@pytest.mark.parametrize("n_val, n_windows, expected", [
    (40, 10, [0, 8, 16, 24]),  # (40 - 1) // 8 = 4 windows of 9 tokens fit
    (33, 10, [0, 8, 16, 24]),  # the last window ends exactly at token 32
    (32, 10, [0, 8, 16]),
    (40, 2, [0, 8]),  # only the first n_windows
])
def test_validation_windows_are_whole_windows(n_val, n_windows, expected):
    windows = val_windows(np.arange(n_val, dtype=np.int32), 8, n_windows)
    np.testing.assert_array_equal(windows, np.array(expected)[:, None] + np.arange(9))


def test_too_short_data_asks_for_one_minimum_and_that_minimum_trains(tmp_path):
    # with --seq-len 16 each part needs 17 tokens; the held-out part of n tokens is round(0.2 n): 16.4 for 82 tokens,
    # 16.6 for 83 (and 66 left for training), so 83 is the fewest
    args = [*SHAPE, "--seq-len", 16, "--val-fraction", 0.2, "--steps", 0]
    for n_tokens in (0, 82):
        result = train(a_tokens(tmp_path / f"{n_tokens}.txt", n_tokens), tmp_path / "out", *args)
        assert_one_error_line(result, "give at least 83 tokens")
    result = train(a_tokens(tmp_path / "83.txt", 83), tmp_path / "out", *args)
    assert result.returncode == 0, result.stderr
    assert "66 training tokens, 17 held out" in result.stderr


# --- The log: the schedule, and the last evaluation ---


@pytest.fixture(scope="module")
def seven_steps(tmp_path_factory, short_text):  # -> log.csv's rows of a 7-step cosine run evaluating every 3 steps
    out = tmp_path_factory.mktemp("runs") / "seven"
    result = train(short_text, out, *FLAGS, "--steps", 7, "--eval-every", 3, "--schedule", "cosine")
    assert result.returncode == 0, result.stderr
    return log_rows(out)


def test_the_lr_column_follows_warmup_then_cosine(seven_steps):
    # optim's schedule, as nanoGPT's: the update of step i (1-based) uses peak * i / warmup during the warmup, then
    # a cosine from the peak, at the first step after the warmup, toward 10% of it at step `total` + 1
    peak, warmup, total = 1e-2, 2, 7
    expected = [peak * i / warmup if i <= warmup else
                0.1 * peak + 0.5 * (1 + math.cos(math.pi * (i - 1 - warmup) / (total - warmup))) * 0.9 * peak
                for i in range(1, total + 1)]
    assert [int(row["step"]) for row in seven_steps] == list(range(total + 1))
    assert [float(row["lr"]) for row in seven_steps[1:]] == pytest.approx(expected, rel=1e-5)


def test_the_last_step_is_evaluated_when_not_a_multiple_of_eval_every(seven_steps):
    assert [int(row["step"]) for row in seven_steps if row["val_loss"]] == [0, 3, 6, 7]


# --- The seconds column, the progress bar ---


class Clock:
    """time.perf_counter for training.py, moved on by hand: a step takes 1 s, an evaluation 10, a save 100."""

    def __init__(self, monkeypatch):
        self.now = 0.0
        monkeypatch.setattr(training, "time", SimpleNamespace(perf_counter=lambda: self.now))
        for name, seconds in (("train_step", 1), ("validation_row", 10), ("save_run", 100)):
            monkeypatch.setattr(training, name, self.taking(seconds, getattr(training, name)))

    def taking(self, seconds, function):
        def timed(*args):
            self.now += seconds
            return function(*args)
        return timed


def train_here(data, out, *args):  # -> train.run's exit status, in this process
    return train_command.run(["--data", str(data), "--out", str(out), *map(str, args)])


def test_the_seconds_column_counts_the_steps_alone_and_goes_on_across_a_resume(tmp_path, short_text, monkeypatch):
    Clock(monkeypatch)
    # evaluations at 0, 2, 4 and 6, and at the first run's last step, 3; saves at 0, 3 and 6
    assert train_here(short_text, tmp_path / "run", *FLAGS, "--steps", 3, "--eval-every", 2) == 0
    assert train_here(short_text, tmp_path / "run", "--steps", 6, "--eval-every", 2, "--resume") == 0
    assert [float(row["seconds"]) for row in log_rows(tmp_path / "run")] == [0, 1, 2, 3, 4, 5, 6]
    with np.load(tmp_path / "run" / "train_state.npz") as state:
        assert float(state["seconds"]) == 6


def test_the_bar_shows_each_steps_loss_beside_its_own_count(tmp_path, short_text, monkeypatch):
    from tqdm import tqdm

    drawn = io.StringIO()
    monkeypatch.setattr(training, "progress_bar", lambda **options: tqdm(file=drawn, mininterval=0, **options))
    assert train_here(short_text, tmp_path / "run", *FLAGS, "--steps", 4) == 0
    losses = {int(row["step"]): f"{float(row['train_loss']):.3f}" for row in log_rows(tmp_path / "run")[1:]}
    shown = re.findall(r"(\d+)/4 \[[^]]*loss (\d+\.\d+)", drawn.getvalue())
    assert shown and all(loss == losses.get(int(count)) for count, loss in shown), (shown, losses)


def test_steps_0_then_resume_keeps_the_step_0_rows_of_both_logs(tmp_path, short_text, saved_run):
    # README's flow: the initial model first, then training on; saved_run is the same two steps, uninterrupted
    out = tmp_path / "run"
    assert train(short_text, out, *FLAGS, "--steps", 0).returncode == 0
    result = train(short_text, out, *FLAGS, "--steps", 2, "--resume")
    assert result.returncode == 0, result.stderr
    assert [{**row, "seconds": None} for row in log_rows(out)] == [
        {**row, "seconds": None} for row in log_rows(saved_run)]
    assert (out / "heads.csv").read_bytes() == (saved_run / "heads.csv").read_bytes()
    assert {row["step"] for row in csv_rows(out / "heads.csv")} == {"0", "2"}


# --- Resuming: the command the user started with, across epochs ---


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, short_text):  # -> the folder of a real 2-step run
    out = tmp_path_factory.mktemp("runs") / "saved"
    assert train(short_text, out, *FLAGS, "--steps", 2).returncode == 0
    return out


INTERRUPTED_TRAIN = """
import os, signal, sys
import gpt2_numpy.training as training
from gpt2_numpy.commands.train import main
signal.signal(signal.SIGINT, signal.default_int_handler)  # pytest's runner may have started us with SIGINT ignored
at_step, next_batch, taken = int(sys.argv[1]), training.Batches.next, []

def next_then_ctrl_c(batches):  # Ctrl-C while step at_step is in progress, as a user presses it mid-step
    taken.append(1)
    if len(taken) == at_step:
        os.kill(os.getpid(), signal.SIGINT)
    return next_batch(batches)

training.Batches.next = next_then_ctrl_c
main(sys.argv[2:])
"""


@pytest.mark.slow
def test_ctrl_c_advice_followed_across_epochs_equals_an_uninterrupted_run(tmp_path, short_text):
    steps, stop_at = 12, 5  # 3 steps an epoch: stopped in the second epoch, resumed through the third and fourth
    command = ["--data", short_text, "--out", tmp_path / "stopped", *FLAGS, "--steps", steps]
    stopped = subprocess.run([sys.executable, "-c", INTERRUPTED_TRAIN, str(stop_at), *map(str, command)],
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert stopped.returncode == 130, stopped.stderr
    assert "Traceback" not in stopped.stderr
    advice = stopped.stderr.splitlines()[-1]
    assert advice == f"interrupted: saved step {stop_at} to {tmp_path / 'stopped'}; continue with the same command " \
                     "and --resume"
    assert "50 training tokens" in stopped.stderr  # (50 - 1) // 8 = 6 windows: 3 steps an epoch, as planned
    resumed = run_cli("gpt2_numpy.train", *command, "--resume")  # what the advice says, word for word
    assert resumed.returncode == 0, resumed.stderr
    whole = train(short_text, tmp_path / "whole", *FLAGS, "--steps", steps)
    assert whole.returncode == 0, whole.stderr
    assert_same_weights(tmp_path / "whole", tmp_path / "stopped")
    assert [row["train_loss"] for row in log_rows(tmp_path / "stopped")] == [
        row["train_loss"] for row in log_rows(tmp_path / "whole")]
    assert [int(row["step"]) for row in log_rows(tmp_path / "stopped")] == list(range(steps + 1))


def test_ctrl_c_in_the_last_step_ends_a_complete_run_without_resume_advice(tmp_path, short_text):
    steps = 4  # Ctrl-C while the last step runs: that step is saved, and nothing is left for --resume to do
    command = ["--data", short_text, "--out", tmp_path / "run", *FLAGS, "--steps", steps]
    result = subprocess.run([sys.executable, "-c", INTERRUPTED_TRAIN, str(steps), *map(str, command)],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[-1] == f"step {steps}: saved the model to {tmp_path / 'run'}; load it with " \
                                             f"--model {tmp_path / 'run'}"
    assert "--resume" not in result.stderr
    assert [int(row["step"]) for row in log_rows(tmp_path / "run")] == list(range(steps + 1))


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads Linux's list of the process's mappings")
def test_a_resumed_run_leaves_no_mapping_of_the_weights_its_saves_replace(tmp_path, short_text, saved_run,
                                                                          monkeypatch):
    # every save replaces model.safetensors, which Windows refuses while a mapping of it is open: the loaded views
    # must be gone once training starts (here, the maps of this very process, read as training would begin)
    from gpt2_numpy.commands import train as train_command

    out = tmp_path / "run"
    shutil.copytree(saved_run, out)
    weights_file, mapped = str(out / "model.safetensors"), []

    def training_starts(*args):
        with open("/proc/self/maps") as maps:
            mapped.append(any(line.rstrip("\n").endswith(weights_file) for line in maps))
        return 0

    monkeypatch.setattr(train_command, "train", training_starts)
    assert train_command.run(["--data", str(short_text), "--out", str(out), "--steps", "4", "--resume"]) == 0
    assert mapped == [False]


def test_a_resume_at_another_thread_count_says_so_in_one_note(tmp_path, short_text):
    out, note = tmp_path / "run", "note: the run was saved at 2 threads and goes on at 1: "
    assert train(short_text, out, *FLAGS, "--steps", 1, "--threads", 2).returncode == 0
    with np.load(out / "train_state.npz") as state:
        assert int(state["threads"]) == 2
    result = train(short_text, out, "--steps", 2, "--resume", "--threads", 1)
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: the run was saved at")]
    assert notes == [note + "products split among another number of threads round otherwise, so from here its "
                     "numbers differ in the last digits from those of a run kept at 2 (--threads 2 keeps them)"]
    result = train(short_text, out, "--steps", 3, "--resume", "--threads", 1)  # saved at 1 now: nothing to say
    assert result.returncode == 0, result.stderr
    assert "note: the run was saved at" not in result.stderr


@pytest.mark.parametrize("flag, value, saved", [
    ("--n-layer", 2, "saved run's 1"),
    ("--init", "124M", "saved run's none (it trained from scratch)"),
    ("--seq-len", 16, "saved run's 8"),
    ("--weight-decay", 0.0, "saved run's 0.1"),
])
def test_resume_refuses_a_flag_that_differs_naming_the_saved_value(tmp_path, short_text, saved_run, flag, value,
                                                                   saved):
    out = tmp_path / "out"
    shutil.copytree(saved_run, out)
    before = snapshot(out)
    args = [*FLAGS, "--steps", 2, flag, value]
    if flag == "--init":
        args = args[len(SHAPE):]  # --init and shape flags together are refused before the comparison
    result = train(short_text, out, *args, "--resume")
    assert_one_error_line(result, f"{flag} {value} differs from the {saved}")
    assert snapshot(out) == before


def test_weight_decay_shrinks_the_matrices_alone_by_lr_times_decay(tmp_path, short_text):
    # AdamW's decoupled decay: p <- p (1 - lr λ) - update, the update the same for any λ; so after one step from the
    # same init, (p at λ = 0) - (p at λ) = lr λ p_init on the matrices and embeddings, and 0 on the biases and gains
    flags = [*FLAGS, "--warmup", 0, "--schedule", "constant"]  # the rate is --lr's 1e-2 from the first step
    runs = {}
    for name, steps, decay in (("init", 0, 0.1), ("decayed", 1, 0.3), ("undecayed", 1, 0)):
        result = train(short_text, tmp_path / name, *flags, "--steps", steps, "--weight-decay", decay)
        assert result.returncode == 0, result.stderr
        runs[name] = weights(tmp_path / name)
    for key, start in runs["init"].items():
        expected = 1e-2 * 0.3 * start if start.ndim >= 2 else np.zeros_like(start)
        np.testing.assert_allclose(runs["undecayed"][key] - runs["decayed"][key], expected, rtol=0, atol=2e-8,
                                   err_msg=str(key))


def test_a_run_saved_before_weight_decay_was_a_setting_resumes_with_gpt2s_decay(tmp_path, short_text, saved_run):
    out = tmp_path / "out"
    shutil.copytree(saved_run, out)
    rewrite_state(out, lambda arrays: drop_setting(arrays, "weight_decay"))
    result = train(short_text, out, *FLAGS, "--steps", 3, "--resume")
    assert result.returncode == 0, result.stderr
    with np.load(out / "train_state.npz") as state:
        assert json.loads(str(state["settings"]))["weight_decay"] == 0.1


def test_validation_bits_per_byte_counts_the_bytes_of_the_predicted_tokens():
    # windows that do not continue each other, id i spelling i + 1 bytes: each window predicts its last 4 tokens,
    # whose bytes are 2+3+4+5 + 7+8+9+10 = 48 (its first 4, the inputs, would be 1+2+3+4 + 6+7+8+9 = 40)
    hparams = {"n_vocab": 10, "n_ctx": 8, "n_embd": 8, "n_head": 2, "n_layer": 1}
    params = random_params(hparams, 0)
    windows = np.array([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]])
    nll = 0.0  # the textbook model's cross-entropy, in float64
    for window in windows:
        logits = model.gpt2(window[:-1], **params, n_head=2).astype(np.float64)
        shifted = logits - logits.max(-1, keepdims=True)
        nll -= (shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)))[np.arange(4), window[1:]].sum()
    nats, bits_per_byte = eval_loss(windows, params, 2, token_lengths=np.arange(1, 11))
    assert nats == pytest.approx(nll / 8, rel=1e-5)
    assert bits_per_byte == pytest.approx(nll / math.log(2) / 48, rel=1e-5)


# --- heads.csv: every head scored at each evaluation ---


def csv_rows(path):  # -> the rows of a CSV file, as dicts
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def pattern_scores(weights, length):  # [n_head, 2 L + 1, 2 L + 1] -> {pattern: [n_head]}, from their definitions
    # (explain --heads's docstring): w[i, j] the weight query i gives key j; the second copy of R is i = L+1 .. 2L
    every, second = np.arange(weights.shape[-1]), np.arange(length + 1, 2 * length + 1)
    return {"previous_token": weights[:, every[1:], every[1:] - 1].mean(-1),
            "first_token": weights[:, :, 0].mean(-1), "self": weights[:, every, every].mean(-1),
            "duplicate_token": weights[:, second, second - length].mean(-1),
            "induction": weights[:, second, second - length + 1].mean(-1)}


def test_heads_csv_scores_every_head_on_the_repeated_probe_at_each_evaluation(tmp_path, short_text):
    out = tmp_path / "run"
    result = train(short_text, out, *FLAGS, "--n-layer", 2, "--steps", 3, "--eval-every", 2)
    assert result.returncode == 0, result.stderr
    rows = csv_rows(out / "heads.csv")
    assert [(row["step"], row["layer"], row["head"]) for row in rows] == [
        (str(step), str(layer), str(head)) for step in (0, 2, 3) for layer in range(2) for head in range(2)]
    # the probe as explain --heads builds it by default: <|endoftext|> (50256), then 15 random ids (the most that a
    # context of 32 holds twice) from seed 0, twice; every pattern scored on it
    probe = repeated_tokens(50257, 50256, 15, 0)
    hparams, trained = load_params(out)
    for step, params in ((0, gpt2_init(hparams, 0)), (3, trained)):  # seed 0's init; the last save
        activations = trace(probe, params, hparams["n_head"])
        for layer in range(2):
            expected = pattern_scores(activations[f"blocks.{layer}.attn.weights"], 15)
            for head in range(2):
                row = next(row for row in rows if row["step"] == str(step) and row["layer"] == str(layer)
                           and row["head"] == str(head))
                for pattern, scores in expected.items():
                    assert float(row[pattern]) == pytest.approx(scores[head], abs=1e-6), (step, layer, head, pattern)
    assert "induction 0." in result.stderr  # the progress bar's best induction score


KILLED_TRAIN = """
import os, sys
import gpt2_numpy.training as training
from gpt2_numpy.commands.train import main
at_step, next_batch, taken = int(sys.argv[1]), training.Batches.next, []

def next_or_killed(batches):  # killed as step at_step begins: its log rows are written up to the step before
    taken.append(1)
    if len(taken) == at_step:
        os._exit(9)
    return next_batch(batches)

training.Batches.next = next_or_killed
main(sys.argv[2:])
"""


@pytest.mark.slow
def test_a_run_killed_after_its_last_save_resumes_to_the_heads_csv_of_an_uninterrupted_run(tmp_path, short_text):
    # saves at 4 and 8, an evaluation every step: killed as step 7 begins, heads.csv holds steps 0 .. 6, and --resume
    # goes on from the save at step 4, so rows 5 and 6 come again
    command = ["--data", short_text, "--out", tmp_path / "killed", *FLAGS, "--steps", 8, "--eval-every", 1,
               "--save-every", 4]
    killed = subprocess.run([sys.executable, "-c", KILLED_TRAIN, "7", *map(str, command)], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert killed.returncode == 9, killed.stderr
    assert {row["step"] for row in csv_rows(tmp_path / "killed" / "heads.csv")} == set(map(str, range(7)))
    resumed = run_cli("gpt2_numpy.train", *command, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    whole = train(short_text, tmp_path / "whole", *FLAGS, "--steps", 8, "--eval-every", 1, "--save-every", 4)
    assert whole.returncode == 0, whole.stderr
    assert (tmp_path / "killed" / "heads.csv").read_bytes() == (tmp_path / "whole" / "heads.csv").read_bytes()


# a row cut off as it was written, where a full disk or a kill cuts it: short of fields, or inside its step number
# (step 13's row cut to "1"); one whose step is past the save's is dropped as any row after the save is
TORN_ROWS = {"log.csv": ["1", "2", "3,10.8"], "heads.csv": ["2", "3,1,0,0.25"]}


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory, short_text, saved_run):  # -> the folder of saved_run resumed to step 3
    out = tmp_path_factory.mktemp("runs") / "resumed"
    shutil.copytree(saved_run, out)
    assert train(short_text, out, "--steps", 3, "--resume").returncode == 0
    return out


@pytest.mark.parametrize("name, torn", [(name, torn) for name, tears in TORN_ROWS.items() for torn in tears])
def test_a_torn_last_row_is_dropped_on_resume(tmp_path, short_text, saved_run, resumed_run, name, torn):
    out = tmp_path / "run"
    shutil.copytree(saved_run, out)
    with (out / name).open("a", newline="") as file:
        file.write(torn)
    result = train(short_text, out, "--steps", 3, "--resume")
    assert result.returncode == 0, result.stderr
    # every row as the same resume without the torn row wrote it, once; the seconds column aside, which is timed
    for log in ("log.csv", "heads.csv"):
        assert [{**row, "seconds": None} for row in csv_rows(out / log)] == [
            {**row, "seconds": None} for row in csv_rows(resumed_run / log)], log
    assert [int(row["step"]) for row in csv_rows(out / "log.csv")] == [0, 1, 2, 3]


def test_a_whole_last_row_without_its_line_end_is_kept(tmp_path, short_text, saved_run, resumed_run):
    out = tmp_path / "run"  # as an editor may save log.csv: every field there, the last line end gone
    shutil.copytree(saved_run, out)
    (out / "log.csv").write_bytes((out / "log.csv").read_bytes().rstrip(b"\r\n"))
    result = train(short_text, out, "--steps", 3, "--resume")
    assert result.returncode == 0, result.stderr
    assert [{**row, "seconds": None} for row in csv_rows(out / "log.csv")] == [
        {**row, "seconds": None} for row in csv_rows(resumed_run / "log.csv")]


# --- Fine-tuning a model folder: --init DIR, alias --model DIR ---


@pytest.mark.slow
def test_model_dir_fine_tunes_that_model_and_resumes_with_the_same_flag(tmp_path, short_text):
    source = tmp_path / "mine"
    source.mkdir()
    save_model(source, TINY["hparams"], random_params(TINY["hparams"], TINY["seed"]), PACKAGED_VOCABULARY)
    out = tmp_path / "tuned"
    run_flags = FLAGS[len(SHAPE):]  # the model's shape comes from its folder
    result = train(short_text, out, "--model", source, *run_flags, "--steps", 0)
    assert result.returncode == 0, result.stderr
    assert load_params(out)[0] == TINY["hparams"]  # not a new random model of the default shape
    assert_same_weights(source, out)
    for name in ("vocab.json", "merges.txt"):
        assert (out / name).read_bytes() == (source / name).read_bytes()
    out = tmp_path / "resumed"
    assert train(short_text, out, "--model", source, *run_flags, "--steps", 1).returncode == 0
    result = train(short_text, out, "--model", source, *run_flags, "--steps", 2, "--resume")
    assert result.returncode == 0, result.stderr
    tuned = weights(out)
    assert all(not np.array_equal(tuned[key], array) for key, array in weights(source).items())  # every one trained
    other = tmp_path / "other"
    shutil.copytree(source, other)
    result = train(short_text, out, "--init", other, *run_flags, "--steps", 3, "--resume")
    assert_one_error_line(result, f"differs from the saved run's {source.resolve()}")


@pytest.mark.parametrize("vocabulary, n_vocab, eot_id", [
    (FIXTURES / "hf_bpe_300", 300, 0),  # Hugging Face's BpeTrainer puts <|endoftext|> first (make_hf_vocabulary.py)
    (PACKAGED_VOCABULARY, 50257, 50256),
    (PACKAGED_VOCABULARY, 512, None),  # a model of GPT-2's first 512 ids never makes 50256, as make_reference.py says
])
def test_config_names_the_tokenizers_end_of_text_id(tmp_path, short_text, vocabulary, n_vocab, eot_id):
    # transformers stops generating at config.json's eos_token_id: it must be <|endoftext|>'s id in vocab.json
    spelled = json.loads(next(vocabulary.glob("*.json")).read_text(encoding="utf-8"))  # vocab.json or encoder.json
    assert spelled["<|endoftext|>"] == (50256 if eot_id is None else eot_id)
    hparams = {**TINY["hparams"], "n_vocab": n_vocab}
    source = tmp_path / "mine"
    save_model(source, hparams, random_params(hparams, 0), vocabulary)
    folders = [source]
    if n_vocab == 300:  # train --init DIR writes it too, in every save
        result = train(short_text, tmp_path / "tuned", "--init", source, *FLAGS[len(SHAPE):], "--steps", 1)
        assert result.returncode == 0, result.stderr
        folders.append(tmp_path / "tuned")
    for folder in folders:
        config = json.loads((folder / "config.json").read_text())
        assert (config["bos_token_id"], config["eos_token_id"]) == (eot_id, eot_id)


def test_init_refuses_a_folder_whose_config_changes_the_math_and_rewrites_nothing(tmp_path, short_text):
    # a config.json that Hugging Face computes otherwise than GPT-2 (tests/fixtures/config_options.json, written by
    # transformers) must not be fine-tuned as GPT-2 and saved with GPT-2's options in its place
    source = tmp_path / "mine"
    save_model(source, TINY["hparams"], random_params(TINY["hparams"], TINY["seed"]), PACKAGED_VOCABULARY)
    case = next(case for case in json.loads((FIXTURES / "config_options.json").read_text())["cases"]
                if case["option"] == "layer_norm_epsilon" and case["value"] == 0.1)
    (source / "config.json").write_text(json.dumps(case["config"]))
    before = snapshot(source)
    result = train(short_text, tmp_path / "tuned", "--init", source, *FLAGS[len(SHAPE):], "--steps", 1)
    assert_one_error_line(result, f"{source / 'config.json'}: layer_norm_epsilon is 0.1, but this code computes only "
                          "1e-05")
    assert snapshot(source) == before and not (tmp_path / "tuned").exists()


@pytest.mark.parametrize("module, args, abbreviation", [
    ("gpt2_numpy.train", ["--data", "x.txt", "--out", "out", "--mod", "folder"], "--mod"),
    ("gpt2_numpy.train", ["--data", "x.txt", "--out", "out", "--vers"], "--vers"),
    ("gpt2_numpy.generate", ["hello", "--vers"], "--vers"),
    ("gpt2_numpy.score", ["hello", "--vers"], "--vers"),
    ("gpt2_numpy.explain", ["hello", "--vers"], "--vers"),
    ("gpt2_numpy.download", ["124M", "--vers"], "--vers"),
])
def test_no_command_accepts_an_abbreviated_flag(tmp_path, module, args, abbreviation):
    # an abbreviation silently picks a flag: train's --model DIR used to become --models-dir and train a random model
    result = run_cli(module, *args)
    assert_one_error_line(result, f"unrecognized arguments: {abbreviation}")


def test_unknown_init_is_neither_a_size_nor_a_folder(tmp_path, short_text):
    result = train(short_text, tmp_path / "out", "--init", "125M", "--steps", 0)  # 124m would be 124M: any case
    assert_one_error_line(result, "--init 125M is neither an official size (124M, 355M, 774M, 1558M) nor a model")


# --- A damaged run: one error line, nothing written ---


def rewrite_state(folder, change):  # change({name: array}) -> None, applied to folder/train_state.npz
    with np.load(folder / "train_state.npz") as file:
        arrays = dict(file)
    change(arrays)
    np.savez(folder / "train_state.npz", **arrays)


def drop_setting(arrays, name):
    settings = json.loads(str(arrays["settings"]))
    del settings[name]
    arrays["settings"] = np.array(json.dumps(settings))


DAMAGES = {  # name -> (damage(folder), a fragment of the error line)
    "truncated state": (lambda folder: (folder / "train_state.npz").write_bytes(
        (folder / "train_state.npz").read_bytes()[:3000]), "train_state.npz is damaged (it cannot be read"),
    "no data_order": (lambda folder: rewrite_state(folder, lambda arrays: arrays.pop("data_order")),
                      "is damaged (no data_order)"),
    "no data_sha256": (lambda folder: rewrite_state(folder, lambda arrays: drop_setting(arrays, "data_sha256")),
                       "the setting data_sha256 is 'missing'"),
    "data_position out of range": (lambda folder: rewrite_state(
        folder, lambda arrays: arrays.update(data_position=np.array(10**6))), "data_position 1000000 is outside"),
    "data_rng not JSON": (lambda folder: rewrite_state(
        folder, lambda arrays: arrays.update(data_rng=np.array("{not json"))), "settings or data_rng"),
    "a moment of the wrong shape": (lambda folder: rewrite_state(
        folder, lambda arrays: arrays.update({"opt/m/wpe": arrays["opt/m/wpe"][:-1]})),
        "the moment opt/m/wpe should be (32, 8) floats, found (31, 8)"),
    "a step in log.csv not a number": (lambda folder: (folder / "log.csv").write_text(
        (folder / "log.csv").read_text().replace("\n2,", "\ntwo,")), "line 4 of"),
    # the resumed run writes the log's rows back under its own columns: csv refuses a field that has no column
    "a row of log.csv with a field past its header's": (lambda folder: edit_log_line(folder, 2, ",a note"),
                                                         "line 3 of"),
    "a column in log.csv's header that a run does not write": (lambda folder: edit_log_line(folder, 0, ",note"),
                                                               "has the column 'note'"),
    # a whole line (its line end written) short of fields is no torn row: it was written back with blanks
    "a row of heads.csv with fewer fields than its header": (lambda folder: (folder / "heads.csv").write_text(
        (folder / "heads.csv").read_text().replace("\n0,0,1,", "\n0,0,1\n", 1)), "line 3 of"),
}


def edit_log_line(folder, index, added):  # -> None: `added` appended to line `index` (0: the header) of log.csv
    lines = (folder / "log.csv").read_bytes().split(b"\r\n")
    lines[index] += added.encode()
    (folder / "log.csv").write_bytes(b"\r\n".join(lines))


@pytest.mark.parametrize("damage", DAMAGES)
def test_resuming_a_damaged_run_is_one_error_line_and_writes_nothing(tmp_path, short_text, saved_run, damage):
    out = tmp_path / "run"
    shutil.copytree(saved_run, out)
    make_damage, fragment = DAMAGES[damage]
    make_damage(out)
    before = snapshot(out)
    result = train(short_text, out, "--steps", 4, "--resume")
    assert_one_error_line(result, fragment)
    assert snapshot(out) == before


# --- The saved folder's layer-norm epsilon ---


def test_the_saved_config_carries_the_epsilon_the_model_uses(tmp_path, short_text):
    # GPT-2's layer norms use 1e-5 (OpenAI's model.py: norm(..., epsilon=1e-5); GPT2Config's layer_norm_epsilon)
    for function in (model.layer_norm, fast.layer_norm, fast_backward.layer_norm_forward):
        assert inspect.signature(function).parameters["eps"].default == 1e-5, function
    out = tmp_path / "out"
    assert train(short_text, out, *FLAGS, "--seed", 4, "--steps", 0).returncode == 0
    assert json.loads((out / "config.json").read_text())["layer_norm_epsilon"] == 1e-5
    # and our loader reads back the model train made: the logits of the seed's initial weights
    hparams, params = load_params(out)
    ids = [64, 257, 257, 40, 481, 467]
    expected = fast.gpt2(ids, **gpt2_init(hparams, seed=4), n_head=hparams["n_head"])
    np.testing.assert_array_equal(fast.gpt2(ids, **params, n_head=hparams["n_head"]), expected)


def test_hugging_face_reads_the_saved_epsilon_and_computes_our_logits(tmp_path):
    reference = np.load(FIXTURES / "reference_epsilon.npz")
    # transformers reads layer_norm_epsilon from config.json: the same weights give other logits under another one
    logits = reference["logits"]
    assert len(reference["epsilons"]) > 1
    assert min(np.abs(logits[i] - logits[0]).max() for i in range(1, len(logits))) > 100 * HF_TOLERANCE
    hparams = json.loads(str(reference["hparams"]))
    save_model(tmp_path, hparams, random_params(hparams, int(reference["seed"])), PACKAGED_VOCABULARY)
    saved_epsilon = json.loads((tmp_path / "config.json").read_text())["layer_norm_epsilon"]
    assert saved_epsilon in list(reference["epsilons"])
    theirs = logits[list(reference["epsilons"]).index(saved_epsilon)]
    loaded_hparams, params = load_params(tmp_path)
    ours = fast.gpt2(reference["ids"], **params, n_head=loaded_hparams["n_head"])
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=HF_TOLERANCE)


def test_ctrl_c_stops_leaves_an_ignored_sigint_ignored_and_puts_a_handler_back():
    # whoever started the run with SIGINT ignored (a script's background job, nohup) meant it: a Ctrl-C at the
    # terminal must not stop that run, nor the run leave SIGINT handled after it
    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with training.ctrl_c_stops() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGINT)
        assert not stop.requested and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with training.ctrl_c_stops() as stop:
            signal.raise_signal(signal.SIGINT)  # the first Ctrl-C asks for a stop after the step, raising nothing
            assert stop.requested
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
