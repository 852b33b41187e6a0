"""`python -m gpt2_numpy.generate` end to end in a subprocess, on the tiny TF checkpoint with the official tokenizer.

The greedy text is Hugging Face's greedy continuation of the prompt (tests/fixtures/reference_tiny.npz), decoded.
Sampled text is `generate`'s continuation decoded: on these weights (random_params of the "tiny" config, which
tests/fixtures/tf_tiny holds) `generate` reproduces Hugging Face's greedy ids (tests/unit/test_decode.py).
"""
import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.commands import generate as generate_command
from gpt2_numpy.commands.common import run_cli
from gpt2_numpy.commands.generate import print_sample, run
from gpt2_numpy.errors import Gpt2NumpyError, UsageError
from gpt2_numpy.generate import generate
from gpt2_numpy.loading import prompt_ids
from gpt2_numpy.params import random_params
from gpt2_numpy.tokenizer import Tokenizer, load_tokenizer
from tests.conftest import FIXTURES, REPO, assert_one_error_line, official_path, tiny_models_dir
from tests.http_server import FileServer, official_layout_files
from tests.unit.test_decode import with_weight
from tests.unit.test_likelihood import hf_models_dir

PROMPT = "I will go to the"  # [40, 481, 467, 284, 262]: every id fits the tiny model's 512-token vocabulary
N_TOKENS = 20
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, so no test can reach the internet by mistake
TINY = json.loads((FIXTURES / "configs.json").read_text())["tiny"]


def cli(*args, models_dir, stdin=b"", base_url=UNREACHABLE, env=()):  # -> CompletedProcess, str output
    env = {**os.environ, "GPT2_NUMPY_BASE_URL": base_url, "PYTHONPATH": str(REPO), **dict(env)}
    env.pop("GPT2_NUMPY_WEIGHTS", None)
    command = [sys.executable, "-m", "gpt2_numpy.generate", *args, "--models-dir", str(models_dir)]
    result = subprocess.run(command, input=stdin, capture_output=True, env=env, timeout=120)
    assert "Traceback" not in result.stderr.decode("utf-8", "replace")
    return subprocess.CompletedProcess(command, result.returncode, result.stdout.decode(), result.stderr.decode())


@pytest.fixture
def models_dir(tmp_path):  # -> a models dir whose 124M/ holds the tiny TF checkpoint and the official tokenizer
    return tiny_models_dir(tmp_path)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def params():
    return random_params(TINY["hparams"], TINY["seed"])


def continuation(tokenizer, params, **options):  # -> the text generate() continues PROMPT with, on the tiny weights
    ids = generate(tokenizer.encode(PROMPT), params, TINY["hparams"]["n_head"], N_TOKENS, **options)
    assert len(ids) == N_TOKENS  # the tiny vocabulary has no <|endoftext|>, so nothing stops early
    return tokenizer.decode(ids)


@pytest.fixture(scope="module")
def hf_greedy_text(tokenizer):  # -> Hugging Face's greedy continuation of PROMPT on the tiny weights, as text
    reference = np.load(FIXTURES / "reference_tiny.npz")
    assert tokenizer.encode(PROMPT) == reference["cli_prompt"].tolist()
    assert len(reference["cli_greedy_ids"]) == N_TOKENS
    return tokenizer.decode(reference["cli_greedy_ids"])


@pytest.mark.slow
def test_greedy_stdout_is_only_the_continuation(models_dir, hf_greedy_text):
    result = cli(PROMPT, "--n-tokens", str(N_TOKENS), models_dir=models_dir)
    assert result.returncode == 0
    assert result.stdout == hf_greedy_text + "\n"
    assert f"{N_TOKENS} tokens in" in result.stderr and "tokens/s" in result.stderr
    assert str(models_dir / "124M") in result.stderr


@pytest.mark.slow
def test_the_hugging_face_layout_generates_the_same_text(tmp_path, hf_greedy_text):
    folder = tmp_path / "models" / "124M-hf"
    shutil.copytree(FIXTURES / "hf_tiny", folder)
    shutil.copy(official_path("124M/encoder.json"), folder / "vocab.json")  # the same files under HF's names
    shutil.copy(official_path("124M/vocab.bpe"), folder / "merges.txt")
    result = cli(PROMPT, "--n-tokens", str(N_TOKENS), "--source", "huggingface", models_dir=folder.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout == hf_greedy_text + "\n"


@pytest.mark.slow
def test_a_terminal_that_cannot_show_the_text_gets_replacements(models_dir, hf_greedy_text):
    result = cli(PROMPT, "--n-tokens", str(N_TOKENS), models_dir=models_dir, env={"PYTHONIOENCODING": "ascii"})
    assert result.returncode == 0
    assert result.stdout == hf_greedy_text.encode("ascii", "replace").decode() + "\n"


@pytest.mark.slow
def test_stdin_prompt_without_streaming_gives_the_same_text(models_dir, tokenizer, params):
    result = cli("-", "--n-tokens", str(N_TOKENS), "--no-stream", models_dir=models_dir, stdin=PROMPT.encode())
    assert result.returncode == 0
    assert result.stdout == continuation(tokenizer, params) + "\n"


@pytest.mark.slow
def test_samples_use_seed_plus_i_and_are_separated_by_a_blank_line(models_dir, tokenizer, params):
    args = ["--n-tokens", str(N_TOKENS), "--temperature", "1", "--top-k", "40", "--top-p", "0.9", "--seed", "5"]
    result = cli(PROMPT, *args, "--num-samples", "2", models_dir=models_dir)
    assert result.returncode == 0
    samples = [continuation(tokenizer, params, temperature=1.0, top_k=40, top_p=0.9, seed=seed) for seed in (5, 6)]
    assert samples[0] != samples[1]
    assert result.stdout == samples[0] + "\n\n" + samples[1] + "\n"
    assert "sample 2 of 2 (seed 6)" in result.stderr


@pytest.mark.slow
def test_missing_weights_are_downloaded_from_the_server(tmp_path, tokenizer, params):
    with FileServer(official_layout_files("124M")) as server:
        result = cli(PROMPT, "--n-tokens", str(N_TOKENS), models_dir=tmp_path / "models", base_url=server.url)
    assert result.returncode == 0, result.stderr
    assert result.stdout == continuation(tokenizer, params) + "\n"
    assert "downloading GPT-2 124M" in result.stderr
    assert len(server.requested("/124M/model.ckpt.data-00000-of-00001")) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--n-tokens", "60"], "the prompt's 5 tokens plus 60 new tokens make 65, more than the model's context of 64 "
                               "tokens: shorten the prompt to at most 4 tokens or generate at most 59 tokens"),
        (["--temperature", "-1"], "temperature (--temperature) must be a number >= 0"),
        (["--temperature", "warm"], "argument --temperature: invalid float value: 'warm'"),
        (["--top-p", "0"], "top_p (--top-p) must be a number in (0, 1]"),
        (["--top-p", "1.5"], "top_p (--top-p) must be a number in (0, 1]"),
        (["--top-k", "0"], "argument --top-k: must be at least 1, got 0"),
        (["--n-tokens", "0"], "argument --n-tokens: must be at least 1, got 0"),
        (["--num-samples", "0"], "argument --num-samples: must be at least 1, got 0"),
        (["--seed", "-1"], "argument --seed: must be at least 0, got -1"),
        (["--model-size", "2B"], "argument --model-size: invalid choice: '2B'"),
        (["--colour"], "unrecognized arguments: --colour"),
    ],
)
def test_bad_arguments_are_one_error_line_with_exit_2(models_dir, args, fragment):
    assert_one_error_line(cli(PROMPT, *args, models_dir=models_dir), fragment)


@pytest.mark.slow
@pytest.mark.parametrize(
    "prompt, stdin, fragment",
    [
        ("Hello world", b"", "the prompt's token 15496 ('Hello', position 0) is outside this model's vocabulary of "
                             "512 tokens"),
        ("", b"", "the prompt's token 50256 ('<|endoftext|>', position 0) is outside this model's vocabulary of 512 "
                  "tokens"),
        ("-", b"caf\xe9", "stdin is not UTF-8 text (byte 3)"),
    ],
)
def test_prompts_the_model_cannot_take_are_refused(models_dir, prompt, stdin, fragment):
    assert_one_error_line(cli(prompt, models_dir=models_dir, stdin=stdin), fragment)


def test_corrupt_checkpoint_reports_the_loader_message(models_dir):
    data = models_dir / "124M" / "model.ckpt.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:-100])  # a cut-off file
    assert_one_error_line(cli(PROMPT, models_dir=models_dir), "model.ckpt.data-00000-of-00001")


def test_malformed_vocabulary_reports_the_tokenizer_message(models_dir):
    (models_dir / "124M" / "encoder.json").write_text("{")
    assert_one_error_line(cli(PROMPT, models_dir=models_dir), "encoder.json is malformed")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hparams.json", "model.ckpt.index", "model.ckpt.data-00000-of-00001", "vocab.bpe"])
def test_unreadable_model_files_are_reported_by_the_loaders(models_dir, name):
    path = models_dir / "124M" / name
    path.unlink()
    path.mkdir()  # unreadable even for root, which a chmod is not
    assert_one_error_line(cli(PROMPT, models_dir=models_dir), name)


def test_a_model_with_more_tokens_than_its_vocabulary_files_is_refused(models_dir):
    byte_tokens = json.loads((models_dir / "124M" / "encoder.json").read_text(encoding="utf-8"))
    first_256 = sorted(byte_tokens.items(), key=lambda t: t[1])[:256]
    small = {token: i for i, token in enumerate(token for token, i in first_256)}
    (models_dir / "124M" / "encoder.json").write_text(json.dumps({**small, "<|endoftext|>": 256}), encoding="utf-8")
    (models_dir / "124M" / "vocab.bpe").write_text("#version: 0.2\n")  # 257 tokens: bytes and end of text, no merges
    assert_one_error_line(cli("a", models_dir=models_dir), "the model has 512 tokens but its vocabulary files only 257")


def deny_access_below(folder, monkeypatch, method):  # Path.<method> raises EACCES inside folder, as without rights
    real = getattr(Path, method)

    def checked(path, *args, **kwargs):
        if path == folder or folder in path.parents:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Path, method, checked)  # in-process: tests run as root, whom file modes do not stop


def test_a_models_dir_that_cannot_be_read_is_a_usage_error(models_dir, monkeypatch):
    deny_access_below(models_dir, monkeypatch, "exists")
    with pytest.raises(UsageError, match=f"cannot read the models dir {models_dir} \\(Permission denied\\)"):
        run([PROMPT, "--models-dir", str(models_dir)])


@pytest.mark.parametrize("loader", [load_params, load_tokenizer])
def test_a_model_dir_that_cannot_be_read_is_named_by_the_loaders(models_dir, monkeypatch, loader):
    deny_access_below(models_dir, monkeypatch, "exists")
    with pytest.raises(Gpt2NumpyError, match=f"{models_dir / '124M'}.*Permission denied"):
        loader(models_dir / "124M")


def test_a_models_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "models").write_text("")
    assert_one_error_line(cli(PROMPT, models_dir=tmp_path / "models"), "is a file: pass a folder with --models-dir")


@pytest.mark.slow
def test_a_reader_that_quits_early_ends_generation_quietly(models_dir):
    env = {**os.environ, "GPT2_NUMPY_BASE_URL": UNREACHABLE, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "gpt2_numpy.generate", PROMPT, "--models-dir", str(models_dir)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    process.stdout.close()  # like `| head` exiting before the first token: every write now fails with EPIPE
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + 13  # 13 is SIGPIPE: the status `cat` reports in the same situation
    assert "Traceback" not in stderr.decode() and "error" not in stderr.decode()


# --- in-process: end of text, notes, streaming, Ctrl-C and the empty prompt ---


def stand_in_for_end_of_text(monkeypatch, token_id):  # tokenizers loaded from now on end text with token_id
    # the tiny model's 512 ids hold no <|endoftext|> (50256): a token it generates stands in for the tokenizer's own
    build = Tokenizer.__init__

    def with_stand_in(self, *args):
        build(self, *args)
        self.eot_id = token_id

    monkeypatch.setattr(Tokenizer, "__init__", with_stand_in)


@pytest.mark.slow
def test_ignore_eos_keeps_going_past_end_of_text(models_dir, tokenizer, params, monkeypatch, capsys):
    ids = generate(tokenizer.encode(PROMPT), params, TINY["hparams"]["n_head"], N_TOKENS)
    stop = next(i for i, token_id in enumerate(ids) if token_id not in ids[:i] and i >= 3)
    stand_in_for_end_of_text(monkeypatch, ids[stop])
    args = [PROMPT, "--n-tokens", str(N_TOKENS), "--models-dir", str(models_dir)]
    assert run(args) == 0
    out, err = capsys.readouterr()
    assert out == tokenizer.decode(ids[:stop]) + "\n"
    assert f"generated {stop} tokens (stopped at <|endoftext|>) in " in err
    assert run([*args, "--ignore-eos"]) == 0
    out, err = capsys.readouterr()
    assert out == tokenizer.decode(ids) + "\n"
    assert f"generated {N_TOKENS} tokens in " in err


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, note",
    [
        (["--top-k", "5", "--seed", "0"],
         "note: greedy decoding (--temperature 0, the default) ignores --top-k, --seed"),
        (["--num-samples", "2"], "note: greedy decoding (--temperature 0, the default) gives 2 identical samples "
                                 "(each is computed once)"),
        (["--seed", "1", "--num-samples", "2"], "note: greedy decoding (--temperature 0, the default) ignores --seed "
                                                "and gives 2 identical samples (each is computed once)"),
        (["--temperature", "0.5", "--top-k", "5"], None),
    ],
)
def test_greedy_notes_options_that_change_nothing(models_dir, capsys, args, note):
    assert run([PROMPT, "--n-tokens", "2", "--models-dir", str(models_dir), *args]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert notes == ([f"{note}; add e.g. --temperature 0.8 to sample"] if note else [])
    assert "(seed" not in err or "--temperature" in args  # greedy never announces a seed it ignores


def stdout_while_generating(ids, capsys):  # -> generator of ids, and the list of stdout text seen before each next id
    seen = []

    def ids_and_record():
        for token_id in ids:
            yield token_id
            seen.append(capsys.readouterr().out)  # runs when the next id is asked for

    return ids_and_record(), seen


@pytest.mark.parametrize("stream", [True, False])
def test_each_token_is_written_before_the_next_is_generated(tokenizer, capsys, stream):
    text = "I go \N{GRINNING FACE} out"
    ids = tokenizer.encode(text)
    emoji_ids = tokenizer.encode(" \N{GRINNING FACE}")
    assert len(emoji_ids) == 2  # its four UTF-8 bytes span two tokens
    generated, seen = stdout_while_generating(ids, capsys)
    assert print_sample(generated, tokenizer, stream=stream) == ids
    seen.append(capsys.readouterr().out)
    if stream:  # the emoji's first token prints its space but holds back the incomplete bytes, never U+FFFD
        assert seen == ["I", " go", " ", "\N{GRINNING FACE}", " out", "\n"]
    else:
        assert seen == ["", "", "", "", "", text + "\n"]


@pytest.mark.parametrize("stream", [True, False])
def test_ctrl_c_keeps_the_text_so_far(tokenizer, capsys, stream):
    def interrupted():
        yield from tokenizer.encode("I go out")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        print_sample(interrupted(), tokenizer, stream=stream)
    assert capsys.readouterr().out == "I go out\n"


def test_ending_mid_character_prints_the_replacement_character(tokenizer, capsys):
    first_byte = tokenizer.encode("\N{GRINNING FACE}")[:1]  # its 4 UTF-8 bytes span two tokens: stop after one
    assert print_sample(iter(first_byte), tokenizer, stream=True) == first_byte
    assert capsys.readouterr().out == "\N{REPLACEMENT CHARACTER}\n"


def test_ctrl_c_says_what_was_kept(models_dir, monkeypatch, capsys):
    def interrupted(*args, **options):
        yield 262
        raise KeyboardInterrupt

    monkeypatch.setattr(generate_command, "iter_generate", interrupted)
    with pytest.raises(SystemExit) as stop:
        generate_command.main([PROMPT, "--models-dir", str(models_dir)])
    out, err = capsys.readouterr()
    assert stop.value.code == 130
    assert out == " the\n"
    assert err.splitlines()[-1] == "interrupted: stopped by Ctrl-C; the text generated so far is printed above"


@pytest.mark.slow
def test_several_prompts_and_samples_print_in_order_with_blank_lines(models_dir, tokenizer, params):
    prompts = [PROMPT, "I go"]
    args = ["--n-tokens", "6", "--temperature", "1", "--seed", "3", "--num-samples", "2", "--batch-size", "3"]
    result = cli(*prompts, *args, models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    n_head = TINY["hparams"]["n_head"]
    expected = [tokenizer.decode(generate(tokenizer.encode(prompt), params, n_head, 6, temperature=1.0, seed=3 + k))
                for k, prompt in enumerate(p for p in prompts for _ in range(2))]  # the k-th printed: seed 3 + k
    assert len(set(expected)) == 4
    assert result.stdout == "\n\n".join(expected) + "\n"
    assert "prompt 2, sample 2 of 2 (seed 6): 6 tokens, reached --n-tokens" in result.stderr
    assert "generated 24 tokens in 4 rows in " in result.stderr and "batches of up to 3" in result.stderr


@pytest.mark.slow
def test_greedy_several_prompts_equal_each_alone(models_dir, tokenizer, params, hf_greedy_text):
    result = cli(PROMPT, "I go", "--n-tokens", str(N_TOKENS), "--num-samples", "2", models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    other = tokenizer.decode(generate(tokenizer.encode("I go"), params, TINY["hparams"]["n_head"], N_TOKENS))
    assert result.stdout == "\n\n".join([hf_greedy_text, hf_greedy_text, other, other]) + "\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, fragment",
    [
        (["I will go", " the" * 70, "--n-tokens", "1"],
         "prompt 2's 70 tokens plus 1 new token make 71, more than the model's context of 64 tokens: shorten prompt 2 "
         "to at most 63 tokens"),
        (["a", "b", "--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
        (["-", "-"], '"-" (read the prompt from stdin) may be given only once'),
        (["-x"], "a prompt that begins with '-' goes last, after '--': gpt2-numpy generate --n-tokens 5 -- \"-x\""),
        (["hello", "-x"], "a prompt that begins with '-' goes last, after '--'"),
    ],
)
def test_bad_batch_arguments_are_one_error_line(models_dir, args, fragment):
    result = cli(*args, models_dir=models_dir)
    assert result.returncode == 2 and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and fragment in errors[0], result.stderr


@pytest.mark.slow
def test_prompts_stand_before_and_after_the_flags_as_the_dash_hint_says(models_dir):
    # the hint's form, `... -- "-x"`, once a first prompt stood before the flags: argparse alone refused the second
    env = {**os.environ, "GPT2_NUMPY_BASE_URL": UNREACHABLE, "PYTHONPATH": str(REPO)}
    outputs = []
    for args in (["I go", "--n-tokens", "4", "--models-dir", str(models_dir), "--", "-x"],
                 ["--n-tokens", "4", "--models-dir", str(models_dir), "--", "I go", "-x"]):
        result = subprocess.run([sys.executable, "-m", "gpt2_numpy.generate", *args], capture_output=True, text=True,
                                env=env, timeout=120)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1] and outputs[0].count("\n\n") == 1  # two continuations, one blank line between


@pytest.mark.slow
def test_a_prompt_longer_than_the_context_is_one_error_line(models_dir):
    result = cli("-", "--n-tokens", "1", models_dir=models_dir, stdin=b" the" * 65)  # " the" (262) fits tiny's vocab
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        "error: the prompt's 65 tokens plus 1 new token make 66, more than the model's context of 64 tokens: "
        "shorten the prompt to at most 63 tokens")


def test_empty_prompt_starts_from_end_of_text_and_the_token_is_allowed(tokenizer):
    assert prompt_ids(tokenizer, "", 50257) == [50256]
    assert prompt_ids(tokenizer, "a<|endoftext|>b", 50257) == [64, 50256, 65]


def test_rows_finishing_out_of_order_print_in_order(models_dir, tokenizer, params, monkeypatch, capsys):
    n_head, prompts = TINY["hparams"]["n_head"], [PROMPT, "I go"]
    ids = [generate(tokenizer.encode(p), params, n_head, N_TOKENS) for p in prompts]
    # a stand-in end of text that only the second row reaches, mid-way: it finishes before the first
    stop = next(i for i, token in enumerate(ids[1]) if i >= 1 and token not in ids[1][:i] and token not in ids[0])
    stand_in_for_end_of_text(monkeypatch, ids[1][stop])
    assert run([*prompts, "--n-tokens", str(N_TOKENS), "--models-dir", str(models_dir)]) == 0
    out, err = capsys.readouterr()
    assert out == tokenizer.decode(ids[0]) + "\n\n" + tokenizer.decode(ids[1][:stop]) + "\n"
    assert f"prompt 2: {stop} tokens, stopped at <|endoftext|>" in err


def test_greedy_rows_carry_no_seed_label(models_dir, capsys):
    assert run([PROMPT, "I go", "--n-tokens", "2", "--seed", "5", "--models-dir", str(models_dir)]) == 0
    err = capsys.readouterr().err
    assert "prompt 1: 2 tokens, reached --n-tokens" in err.splitlines()
    assert "seed 5)" not in err and "seed 6)" not in err  # greedy ignores the seed, and says so once


# --- --json: one object per sample and line, which a program can read back whatever the text holds ---


def json_records(out):  # -> the objects of a --json stdout, every line parsed on its own
    assert out.endswith("\n")
    return [json.loads(line) for line in out.splitlines()]


def sampled(tokenizer, params, prompt, seed, n_tokens):  # -> generate()'s ids for prompt at temperature 1 with seed
    return generate(tokenizer.encode(prompt), params, TINY["hparams"]["n_head"], n_tokens, temperature=1.0, seed=seed)


@pytest.mark.slow
def test_json_prints_one_line_per_sample_of_every_prompt(models_dir, tokenizer, params):
    prompts = [PROMPT, "I go"]
    args = ["--n-tokens", "6", "--temperature", "1", "--seed", "3", "--num-samples", "2", "--batch-size", "3", "--json"]
    result = cli(*prompts, *args, models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    expected = []
    for k, (prompt_index, sample_index) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):  # the k-th: seed 3 + k
        ids = sampled(tokenizer, params, prompts[prompt_index], 3 + k, 6)
        expected.append({"prompt_index": prompt_index, "sample_index": sample_index, "seed": 3 + k,
                         "prompt": prompts[prompt_index], "text": tokenizer.decode(ids), "token_ids": ids,
                         "finish_reason": "length"})
    assert len({record["text"] for record in expected}) == 4
    assert json_records(result.stdout) == expected
    assert "prompt 2, sample 2 of 2 (seed 6): 6 tokens, reached --n-tokens" in result.stderr  # stderr as without it


@pytest.mark.slow
def test_the_seed_json_records_reproduces_its_sample_alone(models_dir, tokenizer, params, capsys):
    # no --seed: the run draws one, and each record names the one its sample used
    assert run([PROMPT, "I go", "--n-tokens", "8", "--temperature", "1", "--num-samples", "2", "--json",
                "--models-dir", str(models_dir)]) == 0
    records = json_records(capsys.readouterr().out)
    assert [record["seed"] - records[0]["seed"] for record in records] == [0, 1, 2, 3]
    last = records[-1]  # the second sample of the second prompt
    assert (last["prompt_index"], last["sample_index"], last["prompt"]) == (1, 1, "I go")
    assert last["token_ids"] == sampled(tokenizer, params, "I go", last["seed"], 8)
    assert run(["I go", "--n-tokens", "8", "--temperature", "1", "--seed", str(last["seed"]), "--json",
                "--models-dir", str(models_dir)]) == 0
    [alone] = json_records(capsys.readouterr().out)
    assert alone == {**last, "prompt_index": 0, "sample_index": 0}


def test_json_greedy_samples_are_copies_without_a_seed(models_dir, hf_greedy_text, capsys):
    assert run([PROMPT, "--n-tokens", str(N_TOKENS), "--num-samples", "2", "--seed", "4", "--json",
                "--models-dir", str(models_dir)]) == 0
    out, err = capsys.readouterr()
    reference = np.load(FIXTURES / "reference_tiny.npz")["cli_greedy_ids"].tolist()
    greedy = {"prompt": PROMPT, "text": hf_greedy_text, "token_ids": reference, "seed": None, "finish_reason": "length"}
    assert json_records(out) == [{"prompt_index": 0, "sample_index": index, **greedy} for index in (0, 1)]
    assert "the continuation: 20 tokens, reached --n-tokens; printed 2 times" in err


@pytest.mark.slow
def test_json_says_which_samples_stopped_at_end_of_text(models_dir, tokenizer, params, monkeypatch, capsys):
    n_head, prompts = TINY["hparams"]["n_head"], [PROMPT, "I go"]
    ids = [generate(tokenizer.encode(p), params, n_head, N_TOKENS) for p in prompts]
    # a stand-in end of text that only the second row reaches, mid-way (the tiny vocabulary has no id 50256)
    stop = next(i for i, token in enumerate(ids[1]) if i >= 1 and token not in ids[1][:i] and token not in ids[0])
    stand_in_for_end_of_text(monkeypatch, ids[1][stop])
    args = [*prompts, "--n-tokens", str(N_TOKENS), "--json", "--models-dir", str(models_dir)]
    assert run(args) == 0
    records = json_records(capsys.readouterr().out)
    assert [(r["token_ids"], r["finish_reason"]) for r in records] == [(ids[0], "length"), (ids[1][:stop], "stop")]
    assert records[1]["text"] == tokenizer.decode(ids[1][:stop])
    assert run([*args, "--ignore-eos"]) == 0
    assert [(r["token_ids"], r["finish_reason"]) for r in json_records(capsys.readouterr().out)] == [
        (ids[0], "length"), (ids[1], "length")]


def test_a_json_sample_holding_blank_lines_reads_back_exactly(models_dir, tokenizer, monkeypatch, capsys):
    # the text the blank-line separated output cannot delimit: the tiny model cannot write it (its 512 tokens lack
    # "\n\n"), so the decode loop hands it over, and what is tested is the line that carries it
    text = "First line.\n\n\nAfter two blank lines,\ttabs, \"quotes\", caf\u00e9 \N{GRINNING FACE}\n\n"
    ids = tokenizer.encode(text)
    monkeypatch.setattr(generate_command, "iter_batch", lambda *args, **options: iter([(0, ids)]))
    assert run([PROMPT, "--n-tokens", str(len(ids)), "--json", "--models-dir", str(models_dir),
                "--temperature", "1", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one sample, one line
    [record] = json_records(out)
    assert record["text"] == text and tokenizer.decode(record["token_ids"]) == text


# --- Weights that hold NaN, and a KV cache too large for the machine ---


@pytest.mark.slow
@pytest.mark.parametrize("args", [[PROMPT], [PROMPT, "--temperature", "1", "--seed", "0"], [PROMPT, "I go"]])
def test_weights_holding_nan_are_one_error_line(tmp_path, params, args):
    models_dir = hf_models_dir(tmp_path, with_weight(params, np.nan), TINY["hparams"])
    result = cli(*args, "--n-tokens", "3", "--source", "huggingface", models_dir=models_dir)
    assert_one_error_line(result, "the model's outputs are NaN or infinite: its weights hold NaN or infinite values")


# allocations are capped at what the process holds after its imports plus 512 MiB, so that the KV cache below
# (2.4 GiB) cannot be allocated on any machine, however much memory it has or how it overcommits
CAPPED_MEMORY_CLI = """import re, resource, sys
from gpt2_numpy.commands import generate
held = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read())[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (held + 2**29, resource.RLIM_INFINITY))
generate.main(sys.argv[1:])
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_kv_cache_too_large_to_allocate_is_one_line_naming_its_size_and_the_flags(models_dir):
    env = {**os.environ, "GPT2_NUMPY_BASE_URL": UNREACHABLE, "PYTHONPATH": str(REPO)}
    # 40000 rows x 63 slots (a 2-token prompt and 62 new tokens) x 2 layers x 64 floats, keys and values: 2.4 GiB
    args = ["I go", "--n-tokens", "62", "--temperature", "1", "--num-samples", "40000", "--batch-size", "40000"]
    result = subprocess.run([sys.executable, "-c", CAPPED_MEMORY_CLI, *args, "--models-dir", str(models_dir)],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1 and result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "error: the KV cache of 40000 rows x 63 positions needs 2.4 GiB, more than this machine could allocate: "
        "compute fewer rows at once (--batch-size) or generate fewer tokens (--n-tokens)")


# --- Standard streams closed, full or unreadable: one line on stderr (when it is open), never a traceback ---

CLI_ARGS = {  # what each CLI needs to run on the tiny model
    "generate": [PROMPT, "--n-tokens", "3"],
    "score": [PROMPT, "--no-bos", "--json"],
    "explain": [PROMPT],
}


def cli_with_streams(module, args, models_dir, redirect="", stdout=subprocess.PIPE, unbuffered=True):
    """-> CompletedProcess with str output: a CLI run under bash, which applies `redirect` (e.g. `1>&-`, closing stdout)
    before it starts python; unbuffered=False runs it without PYTHONUNBUFFERED, so print() writes only when flushed."""
    env = {**os.environ, "GPT2_NUMPY_BASE_URL": UNREACHABLE, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    for name in ["GPT2_NUMPY_WEIGHTS"] + ([] if unbuffered else ["PYTHONUNBUFFERED"]):
        env.pop(name, None)
    command = ["bash", "-c", f'exec "$@" {redirect}', "bash", sys.executable, "-m", f"gpt2_numpy.{module}", *args,
               "--models-dir", str(models_dir)]
    result = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE, env=env,
                            timeout=120)
    stderr = result.stderr.decode()
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    return subprocess.CompletedProcess(command, result.returncode, (result.stdout or b"").decode(), stderr)


FULL_STDOUT_CASES = [
    *CLI_ARGS.items(),
    ("generate", [PROMPT, "--n-tokens", "3", "--no-stream"]),
    ("generate", [PROMPT, "I go", "--n-tokens", "3"]),
    ("score", [PROMPT, "--no-bos", "--per-token"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("module, args, unbuffered", [
    *[(module, args, unbuffered) for module, args in FULL_STDOUT_CASES for unbuffered in (True, False)],
    *[("download", ["124M"], unbuffered) for unbuffered in (True, False)],  # prints the model's folder
])
def test_a_full_stdout_is_one_error_line(models_dir, module, args, unbuffered):
    with open("/dev/full", "w") as full:
        result = cli_with_streams(module, args, models_dir, stdout=full, unbuffered=unbuffered)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == ("error: cannot write to stdout (No space left on device): send it to a "
                                              "file or pipe that takes the output, on a disk with free space")
    assert len(re.findall("^error", result.stderr, re.MULTILINE)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("module", ["generate", "score", "explain"])
def test_a_closed_stdout_is_one_error_line_before_the_model_loads(models_dir, module):
    result = cli_with_streams(module, CLI_ARGS[module], models_dir, redirect="1>&-")
    assert result.returncode == 1
    assert result.stderr == "error: stdout is closed: give the command somewhere to write its output, e.g. > out.txt\n"


@pytest.mark.slow
@pytest.mark.parametrize("module", CLI_ARGS)
@pytest.mark.parametrize("redirect", ["2>&-", "2>/dev/full"])
def test_a_closed_or_full_stderr_leaves_stdout_to_the_output_alone(models_dir, module, redirect):
    expected = cli_with_streams(module, CLI_ARGS[module], models_dir)
    assert expected.returncode == 0 and "\nloaded " in expected.stderr  # stderr was written
    result = cli_with_streams(module, CLI_ARGS[module], models_dir, redirect=redirect)
    assert (result.returncode, result.stdout, result.stderr) == (0, expected.stdout, "")


@pytest.mark.slow
@pytest.mark.parametrize("module", CLI_ARGS)
@pytest.mark.parametrize("redirect, fragment", [
    ("0<&-", 'stdin is closed, and "-" reads {} from it: pipe the text in, or give it as an argument'),
    ("0>/dev/null", "cannot read {} from stdin (Bad file descriptor): pipe the text in, or give it as an "
                    "argument"),  # open for writing only
])
def test_a_prompt_from_a_closed_or_unreadable_stdin_is_one_error_line(models_dir, module, redirect, fragment):
    args = ["-", *CLI_ARGS[module][1:]]
    what = "the text" if module.endswith("score") else "the prompt"  # score's argument is the text it scores
    assert_one_error_line(cli_with_streams(module, args, models_dir, redirect=redirect), fragment.format(what))


def test_running_out_of_memory_elsewhere_is_one_line(capsys):
    def main(argv):
        raise MemoryError

    with pytest.raises(SystemExit) as stop:
        run_cli(main)
    assert stop.value.code == 1
    assert capsys.readouterr() == ("", "error: this machine ran out of memory: ask for less at once (a smaller model, "
                                       "fewer rows, a shorter text)\n")
