"""`train --vocab-size N`: a model trained from scratch with its own byte-level BPE tokenizer, which travels with it.

Expected values come from outside the code under test: the validation loss and bits per byte recomputed with
model.py's textbook forward from the saved folder and the held-out text's bytes; score's bits per byte recomputed
the same way; the tokenizer's vocabulary counted from its definition (256 bytes, the merges, <|endoftext|> last).
That Hugging Face's GPT2TokenizerFast reads such a folder id for id is tests/unit/test_tokenizer_train.py's.
"""
import json
import math
import shutil

import numpy as np
import pytest

from gpt2_numpy import model
from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.commands import train as train_command
from gpt2_numpy.errors import UsageError
from gpt2_numpy.generate import generate
from gpt2_numpy.params import random_params
from gpt2_numpy.tokenizer import PACKAGED_VOCABULARY, load_tokenizer
from tests.conftest import assert_one_error_line
from tests.cli.test_train import SHAPE, log_rows, run_cli

WORDS = "the king and queen of a far land rode out to see what the sea had left upon its sand".split()
FLAGS = [*SHAPE, "--seq-len", 16, "--batch-size", 2, "--eval-batches", 2, "--warmup", 2, "--lr", 1e-2,
         "--val-fraction", 0.25]


def prose(n_words, seed):  # -> a text of n_words from WORDS, in sentences and lines
    rng = np.random.default_rng(seed)
    words = [WORDS[i] for i in rng.integers(0, len(WORDS), n_words)]
    return "".join(word + (".\n" if i % 9 == 8 else " ") for i, word in enumerate(words))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):  # -> (folder, text) of a 300-token run whose held-out tail has letters of its own
    root = tmp_path_factory.mktemp("vocab")
    text = prose(3000, seed=1)
    # the tail (a quarter of the characters) mixes the prose with words of letters the training part never uses: a
    # tokenizer that saw the tail would merge them, as they are among its most frequent pairs
    tail_length = round(len(text) / 3)
    text += "".join(f"{word} zjv vjz " for word in prose(tail_length, seed=2).split())[:tail_length]
    (root / "data.txt").write_text(text, encoding="utf-8")
    result = run_cli("gpt2_numpy.train", "--data", root / "data.txt", "--out", root / "m", "--vocab-size", 300,
                     *FLAGS, "--steps", 3, "--eval-every", 3)
    assert result.returncode == 0, result.stderr
    return root / "m", text


def test_the_folder_holds_its_tokenizer_with_gpt2s_id_convention(trained):
    folder, _ = trained
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    merges = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert merges[0] == "#version: 0.2" and len(merges) - 1 == 300 - 257
    assert sorted(vocab.values()) == list(range(300)) and vocab["<|endoftext|>"] == 299
    config = json.loads((folder / "config.json").read_text())
    assert config["vocab_size"] == 300 and config["eos_token_id"] == config["bos_token_id"] == 299
    assert load_params(folder)[0]["n_vocab"] == 300


def test_the_smallest_vocabulary_the_flag_allows_trains_bytes_alone(tmp_path):
    # --vocab-size 257: the 256 bytes and <|endoftext|>, no merge. Its empty list of merges is still a tokenizer
    (tmp_path / "data.txt").write_text(prose(300, seed=3), encoding="utf-8")
    result = run_cli("gpt2_numpy.train", "--data", tmp_path / "data.txt", "--out", tmp_path / "m", "--vocab-size", 257,
                     *FLAGS, "--steps", 1)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "m" / "merges.txt").read_text(encoding="utf-8").splitlines() == ["#version: 0.2"]
    gpt2 = load_tokenizer(PACKAGED_VOCABULARY)  # whose first 256 ids are the bytes, in the order ours keeps
    assert load_tokenizer(tmp_path / "m").encode("the king") == [gpt2.encode(char)[0] for char in "the king"]
    assert load_params(tmp_path / "m")[0]["n_vocab"] == 257


def test_the_tokenizer_never_sees_the_held_out_tail(trained):
    folder, _ = trained
    spelled = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    assert not [token for token in spelled if len(token) > 1 and set(token) & set("zjv")]  # none in WORDS


def test_log_has_validation_bits_per_byte_of_the_held_out_text(trained):
    folder, text = trained
    hparams, params = load_params(folder)  # the last step's weights: the last row's validation
    tokenizer = load_tokenizer(folder)
    tail = text[len(text) - round(len(text) * 0.25):]
    ids = tokenizer.encode(tail)
    windows = [ids[i * 16: i * 16 + 17] for i in range(4)]  # --eval-batches 2 x --batch-size 2 windows of 16 + 1
    nats = bytes_ = 0.0
    for window in windows:
        logits = model.gpt2(window[:-1], **params, n_head=hparams["n_head"]).astype(np.float64)
        log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        nats += (log_z - logits[np.arange(16), window[1:]]).sum()
        bytes_ += sum(len(tokenizer.token_bytes(token)) for token in window[1:])
    last = log_rows(folder)[-1]
    assert float(last["val_loss"]) == pytest.approx(nats / 64, rel=1e-4)
    assert float(last["val_bits_per_byte"]) == pytest.approx(nats / math.log(2) / bytes_, rel=1e-4)


@pytest.mark.slow
def test_every_command_loads_the_folder_with_its_tokenizer(trained):
    folder, text = trained
    assert run_cli("gpt2_numpy.generate", "--model", folder, "the king", "--n-tokens", 5).returncode == 0
    assert run_cli("gpt2_numpy.explain", "--model", folder, "the king and", "--lens").returncode == 0
    scored = run_cli("gpt2_numpy.score", "--model", folder, "--json", "the queen rode out")
    assert scored.returncode == 0, scored.stderr
    # bits per byte recomputed: the text's ids after <|endoftext|> (the tokenizer's own, id 299), scored by model.py
    hparams, params = load_params(folder)
    ids = [299, *load_tokenizer(folder).encode("the queen rode out")]
    logits = model.gpt2(ids[:-1], **params, n_head=hparams["n_head"]).astype(np.float64)
    log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    nats = (log_z - logits[np.arange(len(ids) - 1), ids[1:]]).sum()
    assert json.loads(scored.stdout)["bits_per_byte"] == pytest.approx(nats / math.log(2) / 18, rel=1e-4)


def test_generation_stops_at_the_tokenizers_own_end_of_text():
    hparams = {"n_vocab": 300, "n_ctx": 16, "n_embd": 8, "n_head": 2, "n_layer": 1}
    params = random_params(hparams, seed=2)
    first = generate([1, 2, 3], params, 2, 4)[0]  # greedy: the id the model picks first
    assert generate([1, 2, 3], params, 2, 4, eos_id=first) == []
    assert generate([1, 2, 3], params, 2, 4, stop_at_eos=False, eos_id=first)[0] == first


def test_resume_keeps_the_vocabulary(trained, tmp_path):
    folder, _ = trained
    data = tmp_path / "data.txt"
    data.write_text(trained[1], encoding="utf-8")
    changed = run_cli("gpt2_numpy.train", "--data", data, "--out", folder, "--resume", "--vocab-size", 320, *FLAGS,
                      "--steps", 3)
    assert_one_error_line(changed, "--vocab-size 320 differs from the saved run's 300")


@pytest.mark.parametrize("flags", [["--min-frequency", "2"], ["--vocab-size", "300"]])
def test_resuming_a_run_of_gpt2_s_vocabulary_with_tokenizer_flags_says_it_had_none(flags):  # "the saved run's None"
    args = train_command.parse_args(["--data", "x", "--out", "y", "--resume", *flags])
    with pytest.raises(UsageError) as caught:
        train_command.refuse_changes(args, {"init": None, "vocab_size": None, "min_frequency": None})
    assert str(caught.value).startswith(f"{' '.join(flags)} differs from the saved run, which used GPT-2's vocabulary "
                                        "(no --vocab-size, so no --min-frequency): a resumed run keeps")


@pytest.mark.slow
@pytest.mark.parametrize("swapped", ["GPT-2's", "smaller"])
def test_resume_refuses_vocabulary_files_that_are_not_the_runs_own(trained, tmp_path, swapped):
    # the run's 300-token tokenizer replaced: GPT-2's 50,257 tokens would make ids the model has no row for, and a
    # smaller one would train on other tokens than those the model learned. Before, the run went on or failed later
    # with a message about the data order
    folder = tmp_path / "m"
    shutil.copytree(trained[0], folder)
    data = tmp_path / "data.txt"
    data.write_text(trained[1], encoding="utf-8")
    if swapped == "GPT-2's":
        for name in ("vocab.json", "merges.txt"):
            (folder / name).unlink()
        for name in ("encoder.json", "vocab.bpe"):
            shutil.copyfile(PACKAGED_VOCABULARY / name, folder / name)
        expected = "the model has 300 tokens but its vocabulary files 50,257"
    else:  # the last ten merges and their tokens cut: a valid 290-token vocabulary
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        kept = {token: i for token, i in vocab.items() if i < 289}
        (folder / "vocab.json").write_text(json.dumps({**kept, "<|endoftext|>": 289}), encoding="utf-8")
        lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines(keepends=True)
        (folder / "merges.txt").write_text("".join(lines[:-10]), encoding="utf-8")
        expected = "the model has 300 tokens but its vocabulary files only 290"
    result = run_cli("gpt2_numpy.train", "--data", data, "--out", folder, "--resume", *FLAGS, "--steps", 4)
    assert_one_error_line(result, expected)


@pytest.mark.slow
@pytest.mark.parametrize("flags, fragment", [
    (["--vocab-size", "256"], "--vocab-size: must be at least 257, got 256"),
    (["--vocab-size", "5000"], "make a vocabulary of"),
    (["--vocab-size", "300", "--init", "124M"], "--vocab-size trains a new tokenizer"),
    (["--min-frequency", "3"], "--min-frequency sets how --vocab-size trains"),
])
def test_bad_vocabulary_requests_are_one_line(tmp_path, flags, fragment):
    data = tmp_path / "data.txt"
    data.write_text(prose(400, seed=3), encoding="utf-8")
    shape = [] if "--init" in flags else FLAGS
    result = run_cli("gpt2_numpy.train", "--data", data, "--out", tmp_path / "m", *flags, *shape)
    assert_one_error_line(result, fragment)
    assert not (tmp_path / "m").exists()
