"""explain --heads: the five head scores against the same scores computed here, with a few lines of numpy, from
Hugging Face's attention probabilities (scripts/fixtures/make_heads_reference.py: configs the scores were never tuned
to); the repeated sequence <|endoftext|> R R; the table and the JSON object on the command line, on a model with a
vocabulary of its own. The page's table is tested in test_page.py."""
import json

import numpy as np
import pytest

from gpt2_numpy.errors import NonFiniteError, OutOfVocabulary
from gpt2_numpy.interpret.heads import PATTERNS, head_scores, repeat_length, repeated_tokens, repetition_problem
from gpt2_numpy.interpret.present import heads_json, heads_table
from gpt2_numpy.interpret.tracing import attention_weights, logit_lens
from gpt2_numpy.params import random_params
from gpt2_numpy.tokenizer import EOT, bytes_to_unicode
from tests.conftest import FIXTURES, assert_one_error_line, byte_model_dir, run_explain, tiny_models_dir

HF_TOLERANCE = 1e-5  # max |score - HF's|: a mean of float32 weights that agree with HF's to about 1e-6
BYTES = {"n_vocab": 257, "n_ctx": 128, "n_embd": 32, "n_head": 4, "n_layer": 2}  # a byte-level model, L = 50
SHORT = {**BYTES, "n_ctx": 40}  # a context that caps L at 19
PROMPT = "I will go to it, and he is in the"


def reference(name):  # -> hparams, params, the fixture's arrays
    arrays = np.load(FIXTURES / f"reference_heads_{name}.npz")
    hparams = json.loads(str(arrays["hparams"]))
    return hparams, random_params(hparams, int(arrays["seed"])), arrays


def scores_from(prompt_weights, repeated_weights):  # -> {pattern: [n_layer, n_head]}, straight from the definitions
    n_layer, n_head, n, _ = prompt_weights.shape
    length = (repeated_weights.shape[-1] - 1) // 2  # <|endoftext|> R R holds 2 L + 1 tokens
    second_copy = range(length + 1, 2 * length + 1)
    scores = {pattern: np.zeros((n_layer, n_head)) for pattern in PATTERNS}
    for layer in range(n_layer):
        for head in range(n_head):
            w, r = prompt_weights[layer, head].astype(np.float64), repeated_weights[layer, head].astype(np.float64)
            scores["previous_token"][layer, head] = np.mean([w[i, i - 1] for i in range(1, n)]) if n > 1 else np.nan
            scores["first_token"][layer, head] = np.mean([w[i, 0] for i in range(n)])
            scores["self"][layer, head] = np.mean([w[i, i] for i in range(n)])
            scores["duplicate_token"][layer, head] = np.mean([r[i, i - length] for i in second_copy])
            scores["induction"][layer, head] = np.mean([r[i, i - length + 1] for i in second_copy])
    return scores


# --- The scores against Hugging Face's attention ---


@pytest.mark.parametrize("name, n_layer, n_head, length", [("three_heads", 2, 3, 31), ("five_heads", 3, 5, 50)])
def test_head_scores_match_those_computed_from_hugging_face_s_attention(name, n_layer, n_head, length):
    hparams, params, arrays = reference(name)
    assert (hparams["n_layer"], hparams["n_head"]) == (n_layer, n_head)
    repeated = arrays["repeated_ids"]
    assert len(repeated) == 2 * length + 1 and repeat_length(hparams["n_ctx"]) == length
    expected = scores_from(arrays["prompt_weights"], arrays["repeated_weights"])
    scores = head_scores(arrays["prompt_ids"], repeated, params, n_head)
    for pattern in PATTERNS:
        assert scores[pattern].shape == (n_layer, n_head)
        assert np.abs(scores[pattern] - expected[pattern]).max() <= HF_TOLERANCE, pattern
    # neighbouring keys' scores differ by far more than the tolerance: a key one off would be seen
    for pattern, neighbour in [("duplicate_token", "induction"), ("previous_token", "self")]:
        assert np.abs(expected[pattern] - expected[neighbour]).max() > 100 * HF_TOLERANCE


def test_a_one_token_prompt_has_no_previous_token_score():
    hparams, params, arrays = reference("three_heads")
    scores = head_scores(arrays["prompt_ids"][:1], arrays["repeated_ids"], params, hparams["n_head"])
    assert np.isnan(scores["previous_token"]).all()
    np.testing.assert_allclose(scores["first_token"], 1, atol=1e-6)  # query 0 sees only itself
    np.testing.assert_allclose(scores["self"], 1, atol=1e-6)
    printed = heads_json([5], arrays["repeated_ids"], scores, [0])
    assert {row["previous_token"] for row in printed["heads"]} == {None}  # JSON has no NaN
    json.dumps(printed, allow_nan=False)
    assert heads_table([5], arrays["repeated_ids"], scores, [0], 0).splitlines()[-1].split()[2] == "-"


# --- <|endoftext|> R R ---


@pytest.mark.parametrize("n_vocab, eot_id", [(257, 256), (300, 7), (50257, 50256), (3, 1)])
def test_the_repeated_sequence_is_endoftext_then_random_tokens_twice(n_vocab, eot_id):
    sequence = repeated_tokens(n_vocab, eot_id, 50, seed=0)
    assert len(sequence) == 101 and sequence[0] == eot_id
    first, second = sequence[1:51], sequence[51:]
    np.testing.assert_array_equal(first, second)
    assert eot_id not in first and first.min() >= 0 and first.max() < n_vocab
    np.testing.assert_array_equal(repeated_tokens(n_vocab, eot_id, 50, seed=0), sequence)  # seeded
    assert (repeated_tokens(n_vocab, eot_id, 50, seed=1) != sequence).any()
    if n_vocab == 3:  # every other id can be drawn: 0 and 2, never 1
        assert set(first.tolist()) == {0, 2}


def test_the_repeated_sequence_is_capped_by_the_context():
    assert [repeat_length(n_ctx) for n_ctx in (1024, 101, 100, 64, 3)] == [50, 50, 49, 31, 1]
    assert "more than this model's context of 2" in repetition_problem(257, 2, 256)
    assert "outside this model's vocabulary of 512 tokens" in repetition_problem(512, 64, 50256)
    assert repetition_problem(257, 3, 256) is None
    with pytest.raises(OutOfVocabulary, match="outside this model's vocabulary"):  # a library error, not a usage one
        repeated_tokens(512, 50256, 10, 0)


# --- The command line ---


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):  # -> a folder holding a byte-level model (ids 0-255 and <|endoftext|> = 256)
    return byte_model_dir(tmp_path_factory.mktemp("heads") / "bytes", BYTES, random_params(BYTES, 6))


def explain(*args, model):  # -> CompletedProcess of explain --model on the byte-level model
    return run_explain(*args, "--model", str(model), models_dir=model.parent)


def own_scores(ids, repeated, params, n_head):  # -> {pattern: [n_layer, n_head]} from our attention weights
    return scores_from(attention_weights(ids, params, n_head), attention_weights(repeated, params, n_head))


@pytest.mark.slow
def test_heads_json_holds_the_ids_and_every_head_s_scores(byte_model):
    result = explain(PROMPT, "--heads", "--json", model=byte_model)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    byte_order = list(bytes_to_unicode())  # ids 0-255 are the bytes in GPT-2's order
    assert printed["prompt_ids"] == [byte_order.index(byte) for byte in PROMPT.encode()]
    repeated = printed["repeated_ids"]
    assert len(repeated) == 101 and repeated[0] == 256 and repeated[1:51] == repeated[51:] and 256 not in repeated[1:]
    assert [(row["layer"], row["head"]) for row in printed["heads"]] == [(layer, head) for layer in range(2)
                                                                          for head in range(4)]
    expected = own_scores(printed["prompt_ids"], repeated, random_params(BYTES, 6), BYTES["n_head"])
    for row in printed["heads"]:
        assert list(row)[2:] == list(PATTERNS)
        for pattern in PATTERNS:
            assert abs(row[pattern] - expected[pattern][row["layer"], row["head"]]) <= 1e-6
    again = explain(PROMPT, "--heads", "--json", model=byte_model)
    assert json.loads(again.stdout)["repeated_ids"] == repeated  # the default seed is fixed
    other = json.loads(explain(PROMPT, "--heads", "--json", "--seed", "7", model=byte_model).stdout)
    assert other["repeated_ids"] != repeated and other["prompt_ids"] == printed["prompt_ids"]


@pytest.mark.slow
def test_heads_prints_a_table_and_layer_keeps_one_layer(byte_model):
    printed = json.loads(explain(PROMPT, "--heads", "--json", model=byte_model).stdout)
    result = explain(PROMPT, "--heads", "--layer", "1", model=byte_model)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[3].split() == ["layer", "head", "previous", "first", "self", "duplicate", "induction"]
    n, length = len(printed["prompt_ids"]), 50
    even = 1 / np.arange(1, 2 * length + 2)  # a head that spreads its weight evenly: query i gives each key 1 / (i + 1)
    assert [float(cell) for cell in lines[4].split()[1:]] == pytest.approx(
        [np.mean(even[1:n]), np.mean(even[:n]), np.mean(even[:n]), np.mean(even[length + 1:]),
         np.mean(even[length + 1:])], abs=0.0005)
    rows = [line.split() for line in lines[5:]]
    assert [(int(row[0]), int(row[1])) for row in rows] == [(1, head) for head in range(4)]
    for row, scores in zip(rows, printed["heads"][4:]):
        assert [float(cell) for cell in row[2:]] == pytest.approx([scores[p] for p in PATTERNS], abs=0.0005)
    one_layer = json.loads(explain(PROMPT, "--heads", "--json", "--layer", "0", model=byte_model).stdout)
    assert one_layer["heads"] == printed["heads"][:4]


def test_the_context_caps_the_repeated_sequence(tmp_path):
    model = byte_model_dir(tmp_path / "short", SHORT, random_params(SHORT, 6))
    printed = json.loads(explain("Hi", "--heads", "--json", model=model).stdout)
    assert len(printed["repeated_ids"]) == 2 * 19 + 1  # (40 - 1) // 2 tokens, twice, after <|endoftext|>


@pytest.mark.slow
@pytest.mark.parametrize("args, fragment", [
    (["--json"], "--json belongs to --lens, --heads, --ablate, --attribute, --patch, --attribution-patching, --sae: "
                 "add one of them, or drop --json"),
    (["--seed", "3"], "--seed belongs to --heads: add --heads, or drop --seed"),
    (["--heads", "--json", "--lens"], "and nothing else: keep one of --lens --heads, or drop --json"),
    (["--lens", "--json", "--walkthrough"], "and nothing else: drop --walkthrough, or drop --json"),
    (["--heads", "--layer", "2"], "--layer 2 is out of range: this model has 2 layers"),
    (["--heads", "--seed", "-1"], "argument --seed: must be at least 0, got -1"),
])
def test_bad_heads_arguments_are_one_error_line(byte_model, args, fragment):
    assert_one_error_line(explain(PROMPT, *args, model=byte_model), fragment)


@pytest.mark.slow
def test_a_vocabulary_without_endoftext_is_one_error_line(tmp_path):
    # the tiny model keeps 512 of GPT-2's tokens: <|endoftext|>, 50256, is not among them
    result = run_explain(PROMPT, "--heads", models_dir=tiny_models_dir(tmp_path))
    assert_one_error_line(result, "--heads: the repeated sequence starts with <|endoftext|> (id 50256), which is "
                                  "outside this model's vocabulary of 512 tokens")


def test_an_empty_prompt_starts_from_the_model_s_own_endoftext(byte_model):
    # the byte-level vocabulary's <|endoftext|> is 256, not GPT-2's 50256
    printed = json.loads(explain("", "--heads", "--json", model=byte_model).stdout)
    assert printed["prompt_ids"] == [256]
    assert {row["previous_token"] for row in printed["heads"]} == {None}  # one token: no previous one
    assert {row["first_token"] for row in printed["heads"]} == {1.0}


def test_lens_json_is_the_logit_lens_at_every_position(byte_model):
    # the lens's numbers against logit_lens (held to Hugging Face's hidden states in test_tracing.py)
    result = explain(PROMPT, "--lens", "--json", model=byte_model)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    byte_order = list(bytes_to_unicode())  # ids 0-255 are the bytes in GPT-2's order, 256 is <|endoftext|>
    ids = printed["prompt_ids"]
    assert ids == [byte_order.index(byte) for byte in PROMPT.encode()]
    lens = logit_lens(ids, random_params(BYTES, 6), BYTES["n_head"])  # [n_layer + 1, n_seq, n_vocab]
    assert [layer["layer"] for layer in printed["layers"]] == ["embed", *range(BYTES["n_layer"])]
    for layer, log_probs in zip(printed["layers"], lens):
        assert layer["top_ids"] == log_probs.argmax(-1).tolist()
        np.testing.assert_allclose(layer["probabilities"], np.exp(log_probs.max(-1)), rtol=1e-5)
        texts = [EOT if token_id == 256 else bytes([byte_order[token_id]]).decode("utf-8", "backslashreplace")
                 for token_id in layer["top_ids"]]
        assert layer["top_texts"] == texts


def test_nan_weights_on_the_repeated_sequence_alone_are_refused_not_scored():
    # the prompt's weights finite, <|endoftext|> R R's not (a token of R alone has a NaN embedding): the model is
    # refused as it is for the prompt's, not given NaN duplicate_token and induction scores
    params = random_params(BYTES, 6)
    ids = np.array(list(PROMPT.encode()), np.int64)
    repeated = repeated_tokens(BYTES["n_vocab"], 256, repeat_length(BYTES["n_ctx"]), 0)
    token = next(int(token) for token in repeated[1:] if token not in ids)
    params["wte"][token] = np.nan
    assert np.isfinite(attention_weights(ids, params, BYTES["n_head"])).all()
    with pytest.raises(NonFiniteError):
        head_scores(ids, repeated, params, BYTES["n_head"])
