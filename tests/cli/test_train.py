"""`python -m gpt2_numpy.train` and the model folders it writes, end to end in subprocesses, on tiny models.

Expected values come from outside the code under test: Hugging Face's greedy continuation of the tiny weights
(tests/fixtures/reference_tiny.npz) for the folder writer; an uninterrupted run for a resumed or interrupted
one. scripts/dev/check_train_hf.py loads a trained folder in transformers.
"""
import csv
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.params import flatten, random_params
from gpt2_numpy.disk import atomic_write, current_umask
from gpt2_numpy.save import save_model
from gpt2_numpy.tokenizer import load_tokenizer
from tests.conftest import FIXTURES, REPO, assert_one_error_line, official_path, tiny_models_dir
from scripts.common.text_samples import WORDS

TINY = json.loads((FIXTURES / "configs.json").read_text())["tiny"]
PROMPT = "I will go to the"  # reference_tiny.npz's cli_prompt
SHAPE = ["--n-layer", "1", "--n-head", "2", "--n-embd", "8", "--n-ctx", "32"]
RUN = ["--seq-len", "16", "--batch-size", "2", "--eval-batches", "1", "--warmup", "2", "--lr", "1e-2"]
UNREACHABLE = "http://127.0.0.1:9"  # nothing listens there: no test reaches the internet


def run_cli(module, *args, timeout=120):  # -> CompletedProcess of python -m module args, text, never a traceback
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPT2_NUMPY_BASE_URL": UNREACHABLE}
    env.pop("GPT2_NUMPY_WEIGHTS", None)
    result = subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                            env=env, timeout=timeout)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def train(data, out, models_dir, *args):  # -> CompletedProcess of the train command
    return run_cli("gpt2_numpy.train", "--data", data, "--out", out, "--models-dir", models_dir, *args)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):  # -> a models dir whose 124M/ holds only the official tokenizer files
    folder = tmp_path_factory.mktemp("models") / "124M"
    folder.mkdir()
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(official_path(f"124M/{name}"), folder)
    return folder.parent


@pytest.fixture(scope="module")
def data(tmp_path_factory):  # -> a text file of about 4,000 tokens of English-like sentences
    rng = random.Random(0)
    sentences = [" ".join(rng.choices(WORDS, k=rng.randint(4, 12))).capitalize() + "." for _ in range(500)]
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return path


def weights(folder):  # -> {key path: array} of the model in folder
    return dict(flatten(load_params(folder)[1]))


def assert_same_weights(folder_a, folder_b):
    a, b = weights(folder_a), weights(folder_b)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=0, atol=1e-6, err_msg=str(key))


def log_rows(folder):  # -> the rows of folder/log.csv
    with (folder / "log.csv").open(newline="") as file:
        return list(csv.DictReader(file))


# --- Initialisation and the folder ---


@pytest.mark.slow
def test_a_saved_folder_generates_hugging_faces_text(tmp_path, models_dir):
    # the tiny weights written by save_model must generate, through --model, what Hugging Face generated from them
    params = random_params(TINY["hparams"], TINY["seed"])
    save_model(tmp_path, TINY["hparams"], params, models_dir / "124M")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["config.json", "merges.txt", "model.safetensors",
                                                                "vocab.json"]
    reference = np.load(FIXTURES / "reference_tiny.npz")
    expected = load_tokenizer(models_dir / "124M").decode(reference["cli_greedy_ids"])
    result = run_cli("gpt2_numpy.generate", PROMPT, "--n-tokens", len(reference["cli_greedy_ids"]), "--model",
                     tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected + "\n"
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["activation_function"] == "gelu_new"
    assert {key: config[key] for key in ("vocab_size", "n_positions", "n_embd", "n_head", "n_layer")} == {
        "vocab_size": 512, "n_positions": 64, "n_embd": 64, "n_head": 4, "n_layer": 2}


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"old")

    def fails_midway(file):
        file.write(b"half of the new")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(path, fails_midway)
    assert path.read_bytes() == b"old"
    assert [each.name for each in tmp_path.iterdir()] == ["model.safetensors"]  # no temporary left behind


def test_atomic_write_keeps_a_private_file_private_and_a_symlink_a_link(tmp_path):  # both were made ordinary
    private = tmp_path / "page.html"
    private.write_bytes(b"old")
    private.chmod(0o600)
    link = tmp_path / "link.html"
    link.symlink_to(private)
    atomic_write(link, lambda file: file.write(b"new"))
    assert link.is_symlink() and private.read_bytes() == b"new"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    new = tmp_path / "new.html"
    atomic_write(new, lambda file: file.write(b"new"))
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~current_umask()  # a new file is an ordinary one


# --- Training, resuming, Ctrl-C ---


@pytest.mark.slow
def test_from_scratch_writes_a_complete_folder_that_every_command_loads(tmp_path, data):
    out, no_models = tmp_path / "out", tmp_path / "no-models"
    result = train(data, out, no_models, *SHAPE, *RUN, "--steps", 4, "--eval-every", 2)
    assert result.returncode == 0, result.stderr
    assert not no_models.exists()  # the packaged tokenizer: nothing downloaded, no models dir made
    assert "tokens/s" in result.stderr  # the progress bar
    rows = log_rows(out)
    assert [int(row["step"]) for row in rows] == [0, 1, 2, 3, 4]
    assert [bool(row["val_loss"]) for row in rows] == [True, False, True, False, True]
    # an untrained model spreads its probability evenly: the first loss is about ln(50257) = 10.82
    assert float(rows[0]["val_loss"]) == pytest.approx(np.log(50257), abs=0.05)
    hparams, _ = load_params(out)
    assert hparams == {"n_vocab": 50257, "n_ctx": 32, "n_embd": 8, "n_head": 2, "n_layer": 1}
    for module, args in (("gpt2_numpy.generate", ["hello", "--n-tokens", 3]), ("gpt2_numpy.score", ["hello there"]),
                         ("gpt2_numpy.explain", ["hello there"])):
        result = run_cli(module, *args, "--model", out)
        assert result.returncode == 0 and result.stdout, result.stderr


@pytest.mark.slow
def test_learning_lowers_the_loss(tmp_path, data, models_dir):
    out = tmp_path / "out"
    result = train(data, out, models_dir, *SHAPE, *RUN, "--steps", 30, "--eval-every", 30, "--schedule", "constant")
    assert result.returncode == 0, result.stderr
    rows = log_rows(out)
    assert float(rows[-1]["val_loss"]) < float(rows[0]["val_loss"]) - 1.0


@pytest.mark.slow
def test_constant_schedule_resumed_from_3_to_6_equals_6_steps(tmp_path, data, models_dir):
    options = [*SHAPE, *RUN, "--schedule", "constant"]
    assert train(data, tmp_path / "whole", models_dir, *options, "--steps", 6).returncode == 0
    assert train(data, tmp_path / "parts", models_dir, *options, "--steps", 3).returncode == 0
    result = train(data, tmp_path / "parts", models_dir, "--steps", 6, "--resume")
    assert result.returncode == 0, result.stderr
    assert "schedule changes" not in result.stderr
    assert_same_weights(tmp_path / "whole", tmp_path / "parts")
    whole, parts = (np.load(tmp_path / name / "train_state.npz") for name in ("whole", "parts"))
    moments = [name for name in whole.files if name.startswith("opt/")]
    assert len(moments) > 30 and set(moments) == {name for name in parts.files if name.startswith("opt/")}
    for name in moments:
        np.testing.assert_allclose(whole[name], parts[name], rtol=0, atol=1e-6, err_msg=name)
    assert [row["train_loss"] for row in log_rows(tmp_path / "whole")] == [
        row["train_loss"] for row in log_rows(tmp_path / "parts")]


@pytest.mark.slow
def test_cosine_resumed_with_other_steps_says_the_schedule_changes(tmp_path, data, models_dir):
    assert train(data, tmp_path / "out", models_dir, *SHAPE, *RUN, "--steps", 2).returncode == 0
    result = train(data, tmp_path / "out", models_dir, "--steps", 3, "--resume")
    assert result.returncode == 0, result.stderr
    assert "the cosine schedule changes" in result.stderr
    # fewer steps than the run has made: nothing is trained, so no schedule changes, and the run says it is done
    fewer = train(data, tmp_path / "out", models_dir, "--steps", 1, "--resume")
    assert fewer.returncode == 0, fewer.stderr
    assert "schedule" not in fewer.stderr
    assert fewer.stderr.splitlines()[-1] == f"{tmp_path / 'out'} holds the model at step 3; --steps 1 asks for no more"


@pytest.mark.slow
def test_ctrl_c_saves_the_last_step_and_a_resumed_run_equals_an_uninterrupted_one(tmp_path, data, models_dir):
    steps = 40
    options = [*SHAPE, *RUN, "--steps", steps, "--eval-every", 10]
    out = tmp_path / "stopped"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # SIGINT back to its default in the child: pytest's runner may have started us with it ignored, and an ignored
    # SIGINT is inherited (and rightly left alone by the train command)
    child = subprocess.Popen([sys.executable, "-c", "import signal, runpy, sys; "
                              "signal.signal(signal.SIGINT, signal.default_int_handler); sys.argv[0] = 'train'; "
                              "runpy.run_module('gpt2_numpy.train', run_name='__main__')",
                              "--data", str(data), "--out", str(out), "--models-dir", str(models_dir),
                              *map(str, options)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 90
    while not ((out / "log.csv").exists() and len(log_rows(out)) >= 4):  # step 0 and three steps done
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.02)
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=60)
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.splitlines()[-1].startswith("interrupted: saved step ")
    saved = int(np.load(out / "train_state.npz")["step"])
    assert 3 <= saved < steps and [int(row["step"]) for row in log_rows(out)][-1] == saved
    resumed = train(data, out, models_dir, "--steps", steps, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert train(data, tmp_path / "whole", models_dir, *options).returncode == 0
    assert_same_weights(tmp_path / "whole", out)
    assert [int(row["step"]) for row in log_rows(out)] == list(range(steps + 1))  # each step logged once


@pytest.mark.slow
def test_fine_tuning_starts_from_the_official_model(tmp_path, data):
    models_dir = tiny_models_dir(tmp_path)  # 124M/ holds the tiny checkpoint, standing in for the official one
    before = weights(models_dir / "124M")
    # the tiny model knows only the first 512 tokens: train on words made of them
    tokenizer = load_tokenizer(models_dir / "124M")
    words = [word for word in WORDS if max(tokenizer.encode(" " + word)) < 512]
    rng = random.Random(1)
    text = tmp_path / "small-vocab.txt"
    text.write_text(" ".join(rng.choices(words, k=2000)), encoding="utf-8")
    assert len(words) > 20 and max(tokenizer.encode(text.read_text())) < 512
    out = tmp_path / "tuned"
    result = train(text, out, models_dir, "--init", "124M", *RUN, "--steps", 2)
    assert result.returncode == 0, result.stderr
    after = weights(out)
    assert after.keys() == before.keys()
    changed = [key for key in before if not np.array_equal(before[key], after[key])]
    assert len(changed) == len(before)  # every tensor moved: every one gets a gradient
    assert max(np.abs(before[key] - after[key]).max() for key in before) < 0.1  # a few small steps, not a new model


# --- Bad input ---


@pytest.mark.slow
@pytest.mark.parametrize("case, fragment", [
    ("missing", "cannot read --data"),
    ("folder", "cannot read --data"),
    ("latin-1", "is not UTF-8 text"),
    ("short", "the data is too short"),
    ("seq-len", "--seq-len 64 is over the model's context of 32"),
    ("resume", "holds no training state"),
    ("out-file", "is a file"),
    ("init-and-shape", "--init 124M fine-tunes a model of its own shape"),
])
def test_bad_input_is_one_error_line(tmp_path, data, models_dir, case, fragment):
    out, args = tmp_path / "out", [*SHAPE, *RUN, "--steps", 1]
    paths = {"missing": tmp_path / "nothing.txt", "folder": tmp_path, "latin-1": tmp_path / "latin.txt",
             "short": tmp_path / "short.txt"}
    (tmp_path / "latin.txt").write_bytes("Où est la bibliothèque?".encode("latin-1") * 100)
    (tmp_path / "short.txt").write_text("Too short for a sequence of sixteen tokens.")
    if case == "seq-len":
        args += ["--seq-len", 64]
    elif case == "resume":
        args = ["--resume", "--steps", 1]
    elif case == "out-file":
        out = data
    elif case == "init-and-shape":
        args = ["--init", "124M", "--n-layer", 2]
    result = train(paths.get(case, data), out, models_dir, *args)
    assert_one_error_line(result, fragment)
    assert not out.exists() or out == data  # nothing written


@pytest.mark.slow
@pytest.mark.parametrize("out, in_the_way", [("link", "link"), ("link/run", "link"), ("a_file/run", "a_file")])
@pytest.mark.parametrize("vocabulary", [[], ["--vocab-size", 300]], ids=["GPT-2's vocabulary", "its own"])
def test_an_out_that_can_be_no_folder_is_refused_before_any_work(tmp_path, data, models_dir, out, in_the_way,
                                                                   vocabulary):
    # a link to nothing, or a file on the way: mkdir fails, which was found only at the first save, after the work
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    (tmp_path / "a_file").write_text("")
    result = train(data, tmp_path / out, models_dir, *SHAPE, *RUN, "--steps", 1, *vocabulary)
    named = (f"{tmp_path / in_the_way} is a symbolic link to {tmp_path / 'nowhere'}, which does not exist"
             if in_the_way == "link" else f"{tmp_path / 'a_file'} is a file, so no folder can be made below it")
    assert_one_error_line(result, f"--out {tmp_path / out}: {named}")
    assert "tokeniz" not in result.stderr  # neither a tokenizer trained nor the text tokenized
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a_file", "link"]


@pytest.mark.slow
def test_model_flag_loads_openais_layout_too(tmp_path):
    folder = tiny_models_dir(tmp_path) / "124M"  # the tiny weights as a TF checkpoint, with OpenAI's vocabulary files
    reference = np.load(FIXTURES / "reference_tiny.npz")
    expected = load_tokenizer(folder).decode(reference["cli_greedy_ids"])
    result = run_cli("gpt2_numpy.generate", PROMPT, "--n-tokens", len(reference["cli_greedy_ids"]), "--model", folder)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected + "\n"
    assert not (folder / ".verified.json").exists()  # a folder given by --model is used as it is, never recorded in


def test_model_flag_refuses_a_missing_folder(tmp_path):
    result = run_cli("gpt2_numpy.generate", "hello", "--model", tmp_path / "nothing")
    assert_one_error_line(result, "does not exist")
