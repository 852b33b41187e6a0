"""Scoring text (gpt2_numpy/likelihood.py) against Hugging Face and against math, and its command line end to end.

The reference log-probabilities and losses are HF's (tests/fixtures/reference_score.npz, from
scripts/fixtures/make_score_reference.py): one window on the "tiny" and "124M" configs, and the sliding-window loop of
HF's guide "Perplexity of fixed-length models" on "tiny" (n_ctx 64) over 320 ids. The CLI runs in a subprocess on the
tiny TF checkpoint (its vocabulary of 512 tokens has no <|endoftext|>), and on a one-layer model with GPT-2's full
vocabulary written here, for the default <|endoftext|> before the text.
"""
import copy
import json
import math
import os
import pty
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from gpt2_numpy import fast as model, likelihood
from gpt2_numpy.commands.score import visible
from gpt2_numpy.errors import NonFiniteError, UsageError
from gpt2_numpy.params import random_params
from gpt2_numpy.fast import log_softmax_at
from gpt2_numpy.score import score_windows, summary, token_log_probs
from gpt2_numpy.tokenizer import EOT_ID, load_tokenizer
from tests.conftest import FIXTURES, REPO, assert_one_error_line, official_path
from tests.unit.test_checkpoint import write_safetensors_raw
from tests.unit.test_decode import with_weight

CONFIGS = json.loads((FIXTURES / "configs.json").read_text())
TINY = CONFIGS["tiny"]
REFERENCE = np.load(FIXTURES / "reference_score.npz")
HF_LOG_PROB_TOLERANCE = 1e-4  # per token, float32 logits; measured at most 1.1e-5 (124M) and 5.5e-6 (tiny, sliding)
HF_LOSS_TOLERANCE = 1e-5  # the mean over all tokens; measured at most 7.6e-7
CLI_TOLERANCE = 1e-5  # the CLI's numbers against the API's in this process
STRIDES = (63, 32, 3)  # W - 1, W / 2 and a small one, for W = n_ctx = 64
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: no test can reach the internet by mistake
# a one-layer model with GPT-2's whole vocabulary, so <|endoftext|> exists: small enough to write in every test run
FULL_VOCAB = {"n_vocab": 50257, "n_ctx": 32, "n_embd": 8, "n_head": 2, "n_layer": 1}
SURPRISAL_COLOURS = [(2, "32"), (6, "33"), (12, "31"), (math.inf, "1;31")]  # the README's scale, in bits


@pytest.fixture(scope="module")
def tiny_params():
    return random_params(TINY["hparams"], TINY["seed"])


# --- token_log_probs against Hugging Face ---


@pytest.mark.parametrize("name", ["tiny", pytest.param("124M", marks=pytest.mark.slow)])
def test_one_window_matches_hugging_face_log_softmax_and_loss(name, tiny_params):
    config = CONFIGS[name]
    params = tiny_params if name == "tiny" else random_params(config["hparams"], config["seed"])
    inputs = REFERENCE[f"single_{name}_inputs"]
    log_probs = token_log_probs(inputs, params, config["hparams"]["n_head"])
    assert log_probs.shape == (len(inputs) - 1,)
    assert np.abs(log_probs - REFERENCE[f"single_{name}_log_probs"]).max() <= HF_LOG_PROB_TOLERANCE
    assert -log_probs.mean() == pytest.approx(float(REFERENCE[f"single_{name}_loss"]), abs=HF_LOSS_TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("stride", STRIDES)
def test_sliding_windows_match_the_guide_token_by_token(stride, tiny_params):
    inputs = REFERENCE["sliding_inputs"]
    log_probs = token_log_probs(inputs, tiny_params, TINY["hparams"]["n_head"], stride=stride)
    assert np.abs(log_probs - REFERENCE[f"sliding_log_probs_{stride}"]).max() <= HF_LOG_PROB_TOLERANCE
    assert -log_probs.mean() == pytest.approx(float(REFERENCE[f"sliding_nll_{stride}"]), abs=HF_LOSS_TOLERANCE)
    # each token 1 .. n-1 in the window the guide scores it in, so with the same context
    begins = [begin for begin, first, end in score_windows(len(inputs), TINY["hparams"]["n_ctx"], stride)
              for _ in range(first, end)]
    np.testing.assert_array_equal(begins, REFERENCE[f"sliding_begin_{stride}"])


@pytest.mark.slow
def test_the_default_stride_is_half_the_context(tiny_params):
    inputs = REFERENCE["sliding_inputs"]
    log_probs = token_log_probs(inputs, tiny_params, TINY["hparams"]["n_head"])
    assert np.abs(log_probs - REFERENCE["sliding_log_probs_32"]).max() <= HF_LOG_PROB_TOLERANCE
    assert np.abs(log_probs - REFERENCE["sliding_log_probs_63"]).max() > 0.1  # the fixture tells strides apart


# --- the windows, from their definition ---


@pytest.mark.parametrize("n_ctx", [2, 3, 8, 64])
def test_windows_score_every_token_once_with_enough_context(n_ctx):
    for n in range(2, 5 * n_ctx):
        for stride in range(1, n_ctx):
            windows = score_windows(n, n_ctx, stride)
            scored = [t for _, first, end in windows for t in range(first, end)]
            assert scored == list(range(1, n)), (n, n_ctx, stride)  # each token after the first, once, in order
            for k, (begin, first, end) in enumerate(windows):
                assert begin == k * stride and end == min(begin + n_ctx, n)
                assert first == (1 if k == 0 else windows[k - 1][2])
                assert first - begin >= min(first, n_ctx - stride)  # the context the window's first token gets
            assert windows[-1][2] == n and all(end < n for _, _, end in windows[:-1])  # stop at the first reaching n


@pytest.mark.parametrize("stride", [0, -1, 64, 65, 2.5, True, "8"])
def test_a_stride_outside_1_to_n_ctx_minus_1_is_refused(stride, tiny_params):
    with pytest.raises(UsageError, match="the stride must be a whole number from 1 to 63") as error:
        token_log_probs([1, 2, 3], tiny_params, TINY["hparams"]["n_head"], stride=stride)
    if stride == 64:
        assert "no context" in str(error.value) and "silently skips" in str(error.value)


@pytest.mark.parametrize("inputs", [[], [7]])
def test_fewer_than_two_tokens_are_refused(inputs, tiny_params):
    with pytest.raises(UsageError, match="at least 2 tokens"):
        token_log_probs(inputs, tiny_params, TINY["hparams"]["n_head"])


def test_ids_outside_the_vocabulary_are_refused_before_any_window_runs(tiny_params, monkeypatch):
    for module in (model, likelihood):  # any forward pass would fail with a TypeError instead
        monkeypatch.setattr(module, "transformer", None)
    inputs = [1] * 300 + [512]  # in the last window only
    with pytest.raises(ValueError, match=r"token id 512 is outside the vocabulary \[0, 512\)"):
        token_log_probs(inputs, tiny_params, TINY["hparams"]["n_head"])


def test_logits_are_computed_only_for_positions_that_score(tiny_params, monkeypatch):
    rows = []
    lm_head = model.lm_head
    for module in (model, likelihood):  # wherever the logits are computed from
        monkeypatch.setattr(module, "lm_head", lambda x, wte: rows.append(x.shape[-2]) or lm_head(x, wte))
    inputs = REFERENCE["sliding_inputs"]
    token_log_probs(inputs, tiny_params, TINY["hparams"]["n_head"], stride=32)
    assert sum(rows) == len(inputs) - 1  # one row of logits per scored token, none for context-only positions


def test_log_softmax_is_stable_for_large_logits():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((3, 50257)) * 5 + [[0], [1e4], [-1e4]]).astype(np.float32)
    targets = np.array([5, 50000, 123])
    exact = logits.astype(np.float64)
    exact = exact - exact.max(-1, keepdims=True)
    exact = exact - np.log(np.exp(exact).sum(-1, keepdims=True))
    np.testing.assert_allclose(log_softmax_at(logits.copy(), targets), exact[np.arange(3), targets], rtol=0, atol=1e-6)


@pytest.mark.parametrize("token_bytes, shown", [
    (b" the", "␣the"),
    (b"\n\n", "\\n\\n"),
    (b"\t\r", "\\t\\r"),
    (b"\x00\x1b\x7f", "\\u0000\\u001b\\u007f"),  # whole characters: \u, never \x, which is a byte of a partial one
    ("\u00a0\u200b".encode(), "\\u00a0\\u200b"),  # no-break space, zero-width space: whitespace that looks like nothing
    ("\u00ad\U000e0001".encode(), "\\u00ad\\U000e0001"),  # soft hyphen; a tag beyond the BMP gets 8 hex digits
    (b"\xe2\x80", "\\xe2\\x80"),  # the first two bytes of a three-byte character
    (b"a\\x41", "a\\\\x41"),  # a real backslash is doubled, so it cannot pass for an escape
    ("␣é".encode(), "\\u2423é"),  # a real "␣" is escaped, so it cannot pass for a space
])
def test_token_text_shows_whitespace_and_partial_characters(token_bytes, shown):
    assert visible(token_bytes) == shown


# --- The command line ---


def cli_env(extra):  # -> the environment of a CLI subprocess: offline, this repo's package, no caller's settings
    env = {**os.environ, "GPT2_NUMPY_BASE_URL": UNREACHABLE, "PYTHONPATH": str(REPO)}
    for name in ("GPT2_NUMPY_WEIGHTS", "NO_COLOR"):
        env.pop(name, None)
    return {**env, **dict(extra)}


def score_cli(*args, models_dir, stdin=b"", env=()):  # -> CompletedProcess with str output
    command = [sys.executable, "-m", "gpt2_numpy.score", "--models-dir", str(models_dir), *args]
    result = subprocess.run(command, input=stdin, capture_output=True, env=cli_env(env), timeout=120)
    assert "Traceback" not in result.stderr.decode("utf-8", "replace")
    return subprocess.CompletedProcess(command, result.returncode, result.stdout.decode(), result.stderr.decode())


@pytest.fixture
def tiny_dir(tmp_path):  # -> a models dir whose 124M/ holds the tiny TF checkpoint and the official tokenizer
    folder = tmp_path / "models" / "124M"
    shutil.copytree(FIXTURES / "tf_tiny", folder)
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(official_path(f"124M/{name}"), folder)
    return folder.parent


@pytest.fixture(scope="module")
def full_vocab_params():
    return random_params(FULL_VOCAB, seed=5)


@pytest.fixture
def full_vocab_dir(tmp_path, full_vocab_params):  # -> a models dir whose 124M-hf/ holds FULL_VOCAB in HF's layout
    return hf_models_dir(tmp_path, full_vocab_params, FULL_VOCAB)


def hf_models_dir(root, params, hparams):  # -> a models dir whose 124M-hf/ holds params, the official tokenizer
    folder = root / "models" / "124M-hf"
    folder.mkdir(parents=True)
    tensors = hf_tensors(params)
    header, offset = {}, 0
    for name, array in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    write_safetensors_raw(folder / "model.safetensors", header, b"".join(a.astype("<f4").tobytes()
                                                                         for a in tensors.values()))
    (folder / "config.json").write_text(json.dumps({
        "vocab_size": hparams["n_vocab"], "n_positions": hparams["n_ctx"], "n_embd": hparams["n_embd"],
        "n_head": hparams["n_head"], "n_layer": hparams["n_layer"]}))
    shutil.copy(official_path("124M/encoder.json"), folder / "vocab.json")
    shutil.copy(official_path("124M/vocab.bpe"), folder / "merges.txt")
    return folder.parent


def hf_tensors(params):  # our params -> {Hugging Face's name: array}
    names = {"g": "weight", "w": "weight", "b": "bias"}

    def leaves(tree, prefix):
        for key, value in tree.items():
            yield from leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else [(prefix + names[key], value)]

    tensors = {"wte.weight": params["wte"], "wpe.weight": params["wpe"], **dict(leaves(params["ln_f"], "ln_f."))}
    for layer, block in enumerate(params["blocks"]):
        tensors.update(leaves(block, f"h.{layer}."))
    return tensors


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def assert_scores(output, log_probs, n_bytes):  # the JSON fields against the API's log-probs and their definitions
    assert output["n_tokens"] == len(log_probs)
    # another process, with weights from another file: the BLAS may round differently, within float32
    assert output["nll"] == pytest.approx(-np.mean(log_probs), abs=CLI_TOLERANCE)
    assert output["perplexity"] == pytest.approx(math.exp(output["nll"]), rel=1e-12)
    assert output["bits_per_byte"] == pytest.approx(output["nll"] * len(log_probs) / math.log(2) / n_bytes, rel=1e-12)


@pytest.mark.slow
def test_json_without_bos_scores_from_the_second_token(tiny_dir, tokenizer, tiny_params):
    text = "¿I will go to the¿"  # "¿" is two bytes and two tokens: bytes are not characters, scored or not
    ids = tokenizer.encode(text)
    assert max(ids) < 512 and len(text.encode()) == len(text) + 2
    result = score_cli(text, "--no-bos", "--json", "--per-token", models_dir=tiny_dir)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    log_probs = token_log_probs(ids, tiny_params, TINY["hparams"]["n_head"])
    scored_bytes = len(text.encode()) - len(tokenizer.token_bytes(ids[0]))  # the first token is context, unscored
    assert_scores(output, log_probs, scored_bytes)
    assert [token["position"] for token in output["tokens"]] == list(range(1, len(ids)))
    assert [token["id"] for token in output["tokens"]] == ids[1:]
    # a token holding part of a character (each "¿" is two) reads as U+FFFD
    assert [token["text"] for token in output["tokens"]] == ["\ufffd", "I", " will", " go", " to", " the", "\ufffd",
                                                             "\ufffd"]
    np.testing.assert_allclose([token["logprob"] for token in output["tokens"]], log_probs, rtol=0, atol=CLI_TOLERANCE)


def test_json_with_bos_scores_the_first_token_after_endoftext(full_vocab_dir, tokenizer, full_vocab_params):
    text = "Hello world! Scoring text, one token at a time."
    result = score_cli(text, "--json", "--source", "huggingface", models_dir=full_vocab_dir)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    ids = [EOT_ID] + tokenizer.encode(text)
    log_probs = token_log_probs(ids, full_vocab_params, FULL_VOCAB["n_head"])  # 13 ids: one window of 32
    assert_scores(output, log_probs, len(text.encode()))
    assert "tokens" not in output  # only with --per-token


@pytest.mark.slow
def test_long_text_goes_through_windows_with_a_progress_bar(full_vocab_dir, tokenizer, full_vocab_params):
    text = "The quick brown fox jumps over the lazy dog. " * 12  # 121 ids with <|endoftext|>: n_ctx is 32
    result = score_cli("-", "--json", "--stride", "10", "--source", "huggingface", models_dir=full_vocab_dir,
                       stdin=text.encode())
    assert result.returncode == 0, result.stderr
    ids = [EOT_ID] + tokenizer.encode(text)
    n_windows = len(score_windows(len(ids), FULL_VOCAB["n_ctx"], 10))
    log_probs = token_log_probs(ids, full_vocab_params, FULL_VOCAB["n_head"], stride=10)
    assert_scores(json.loads(result.stdout), log_probs, len(text.encode()))
    assert re.search(rf"\b{n_windows} windows: +0%.* 0/{len(ids) - 1} ", result.stderr), result.stderr
    short = score_cli("-", "--json", "--source", "huggingface", models_dir=full_vocab_dir, stdin=b"A short text.")
    assert short.returncode == 0 and "windows" not in short.stderr  # one window: no bar


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--data", "--file"])  # --file: the old name
def test_a_file_gives_the_same_scores_as_text(tiny_dir, tmp_path, flag):
    path = tmp_path / "text.txt"
    path.write_text("I will go to the", encoding="utf-8")
    from_file = score_cli(flag, str(path), "--no-bos", "--json", models_dir=tiny_dir)
    from_text = score_cli("I will go to the", "--no-bos", "--json", models_dir=tiny_dir)
    assert from_file.returncode == 0 and from_file.stdout == from_text.stdout


def table_rows(stdout):  # -> [(position, id, logprob, bits, token)] of a --per-token table
    lines = stdout.splitlines()
    assert lines[0].split() == ["position", "id", "logprob", "bits", "token"]
    rows = []
    for line in lines[1:]:
        if not re.match(r"\s*\d", line):
            break
        position, token_id, log_prob, bits, token = line.split(maxsplit=4)
        rows.append((int(position), int(token_id), float(log_prob), float(bits), token))
    return rows


@pytest.mark.slow
def test_per_token_table_without_colour(tiny_dir, tokenizer, tiny_params):
    text = "I will go to the\n"
    result = score_cli(text, "--no-bos", "--per-token", models_dir=tiny_dir, env={"NO_COLOR": "1"})
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout
    ids = tokenizer.encode(text)
    log_probs = token_log_probs(ids, tiny_params, TINY["hparams"]["n_head"])
    rows = table_rows(result.stdout)
    assert [row[:2] for row in rows] == [(position, ids[position]) for position in range(1, len(ids))]
    np.testing.assert_allclose([row[2] for row in rows], log_probs, atol=5e-5)  # printed to 4 decimals
    np.testing.assert_allclose([row[3] for row in rows], -log_probs / math.log(2), atol=5e-4)  # to 3 decimals
    assert [row[4] for row in rows] == ["␣will", "␣go", "␣to", "␣the", "\\n"]
    summary = result.stdout.splitlines()[len(rows) + 1 :]
    assert summary[0].startswith(f"tokens scored  {len(ids) - 1}")
    nll = re.search(r"([0-9.]+) nats per token", summary[1])  # printed to 6 decimals; the CLI's mean may round the
    assert nll and float(nll.group(1)) == pytest.approx(-log_probs.mean(), abs=2e-6)  # last one otherwise


def on_terminal(args, models_dir, env=()):  # -> what the CLI writes to stdout when stdout is a terminal (a pty)
    leader, follower = pty.openpty()
    with open(os.devnull, "wb") as devnull:
        process = subprocess.Popen([sys.executable, "-m", "gpt2_numpy.score", *args, "--models-dir", str(models_dir)],
                                   stdin=subprocess.DEVNULL, stdout=follower, stderr=devnull,
                                   env=cli_env({"TERM": "xterm", **dict(env)}))
    os.close(follower)
    output = b""
    try:
        while chunk := os.read(leader, 65536):
            output += chunk
    except OSError:  # EIO: the process closed the terminal
        pass
    os.close(leader)
    assert process.wait(timeout=120) == 0
    return output.decode().replace("\r\n", "\n")


@pytest.mark.slow
def test_a_terminal_gets_tokens_coloured_by_surprisal_unless_no_color(tiny_dir, tokenizer, tiny_params):
    args = ["I will go to the", "--no-bos", "--per-token"]
    coloured = on_terminal(args, tiny_dir)
    ids = tokenizer.encode(args[0])
    bits = -token_log_probs(ids, tiny_params, TINY["hparams"]["n_head"]) / math.log(2)
    codes = re.findall(r"\x1b\[([\d;]+)m([^\x1b]*)\x1b\[0m", coloured)
    expected = [(next(code for limit, code in SURPRISAL_COLOURS if b < limit), tokenizer.decode([token_id]))
                for b, token_id in zip(bits, ids[1:])]
    assert codes == [(code, text.replace(" ", "␣")) for code, text in expected]
    plain = on_terminal(args, tiny_dir, env={"NO_COLOR": "1"})
    assert "\x1b" not in plain and plain == re.sub(r"\x1b\[[\d;]*m", "", coloured)
    piped = score_cli(*args, models_dir=tiny_dir, env={"TERM": "xterm"})  # NO_COLOR is not set here either
    assert piped.stdout == plain


@pytest.mark.slow
def test_text_with_a_leading_dash_goes_after_double_dash(tiny_dir):
    result = score_cli("--no-bos", "--json", "--", "-I", models_dir=tiny_dir)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["n_tokens"] == 1  # "-", "I": two tokens, the second scored
    assert_one_error_line(score_cli("--no-bos", "-I", models_dir=tiny_dir),
                          "unrecognized arguments: -I; a text that begins with '-' goes last, after '--'")


@pytest.mark.slow
@pytest.mark.parametrize("args, fragment", [
    ([""], "the text is empty"),
    (["-"], "the text is empty"),  # stdin is empty
    (["", "--no-bos"], "the text is empty"),
    ([" the", "--no-bos"], "the text is a single token (' the') and --no-bos leaves nothing before it"),
    (["I will go to the"], "vocabulary of 512 tokens has no <|endoftext|> (id 50256) to put before the text: pass "
                           "--no-bos"),
    (["Hello world", "--no-bos"], "the text's token 15496 ('Hello', position 0) is outside this model's vocabulary "
                                  "of 512"),
    (["I will go to the", "--no-bos", "--stride", "64"], "the stride must be a whole number from 1 to 63"),
    (["I will go to the", "--no-bos", "--stride", "100"], "the stride must be a whole number from 1 to 63"),
    (["I will go to the", "--stride", "0"], "argument --stride: must be at least 1, got 0"),
    (["I will go to the", "--file", "x.txt"], "give the text either as TEXT or with --file, not both"),
    ([], "nothing to score"),
    (["--file", "missing.txt"], "cannot read --file missing.txt: No such file or directory"),
    (["--file", "."], "cannot read --file .: Is a directory"),
    (["--file", "latin1.txt"], "--file latin1.txt is not UTF-8 text (byte 3 cannot be decoded)"),
    (["I will go to the", "--data", "x.txt"], "give the text either as TEXT or with --data, not both"),
    (["--data", "missing.txt"], "cannot read --data missing.txt: No such file or directory"),
    (["--data", "latin1.txt"], "--data latin1.txt is not UTF-8 text (byte 3 cannot be decoded)"),
    (["--data", "x.txt", "--file", "x.txt"], "--file is the old name of --data: give one of them"),
])
def test_bad_input_is_one_error_line_with_exit_2(tiny_dir, tmp_path, monkeypatch, args, fragment):
    (tmp_path / "latin1.txt").write_bytes("Caf\u00e9 au lait".encode("latin-1"))
    monkeypatch.chdir(tmp_path)
    assert_one_error_line(score_cli(*args, models_dir=tiny_dir), fragment)


# --- Weights that give NaN, infinite or huge logits ---


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # NumPy meeting the inf
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_weights_holding_nan_or_inf_are_an_error_not_a_nan_score(tmp_path, full_vocab_params, tiny_params, value):
    with pytest.raises(NonFiniteError, match="its weights hold NaN or infinite values"):
        token_log_probs(np.arange(10), with_weight(tiny_params, value), TINY["hparams"]["n_head"])
    models_dir = hf_models_dir(tmp_path, with_weight(full_vocab_params, value), FULL_VOCAB)
    result = score_cli("Hello world", "--json", "--source", "huggingface", models_dir=models_dir)
    assert_one_error_line(result, "the model's outputs are NaN or infinite: its weights hold NaN or infinite values")
    assert "Warning" not in result.stderr  # NumPy's warnings about the NaN would only repeat the error


@pytest.mark.slow
def test_a_perplexity_past_the_largest_double_is_inf_and_null_in_json(tmp_path, full_vocab_params, tokenizer):
    params = copy.deepcopy(full_vocab_params)
    params["ln_f"]["g"] *= 1e4  # logits 10^4 times as far apart: finite, but e^nll overflows
    models_dir = hf_models_dir(tmp_path, params, FULL_VOCAB)
    text = "Hello world! Scoring text, one token at a time."
    nll = -token_log_probs([EOT_ID] + tokenizer.encode(text), params, FULL_VOCAB["n_head"]).mean()
    assert math.log(sys.float_info.max) < nll < 1e30
    args = [text, "--source", "huggingface"]
    result = score_cli(*args, "--json", models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout, parse_constant=lambda name: pytest.fail(f"{name} is not standard JSON"))
    assert output["perplexity"] is None
    assert output["nll"] == pytest.approx(nll, rel=1e-6)
    text_result = score_cli(*args, models_dir=models_dir)
    assert "perplexity     inf\n" in text_result.stdout


def test_perplexity_is_e_to_the_nll_up_to_the_largest_double():
    assert summary(np.array([-709.0]), 1)["perplexity"] == math.exp(709.0)
    assert summary(np.array([-710.0, -710.0]), 1)["perplexity"] == math.inf  # e^710 > 1.8e308


@pytest.mark.slow
def test_a_whole_character_shows_as_u_and_a_partial_one_as_its_bytes(full_vocab_dir, tokenizer):
    text = "a\u00a0b\u00bf"  # "¿" (0xc2 0xbf) is two tokens here, one byte each
    result = score_cli(text, "--per-token", "--source", "huggingface", models_dir=full_vocab_dir,
                       env={"NO_COLOR": "1"})
    assert result.returncode == 0, result.stderr
    ids = tokenizer.encode(text)
    assert ids[1] == 1849 and tokenizer.token_bytes(1849) == "\u00a0".encode()  # the whole no-break space
    assert [row[4] for row in table_rows(result.stdout)] == ["a", "\\u00a0", "b", "\\xc2", "\\xbf"]
