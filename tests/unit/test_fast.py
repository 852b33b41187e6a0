"""The tuned pass (fast.py): equal to the textbook model.py, and against Hugging Face's logits and math."""
import math
import threading
import warnings

import numpy as np
import pytest

from gpt2_numpy import cores
from gpt2_numpy import fast as model
from gpt2_numpy import model as textbook
from gpt2_numpy.fast import (
    attention,
    offset_causal_mask,
    gelu,
    gpt2,
    gpt2_cached,
    inference_layout,
    layer_norm,
    new_cache,
    softmax,
)
from gpt2_numpy.params import flatten
from tests.conftest import HF_TOLERANCE, load_reference

CACHE_TOLERANCE = 1e-5  # cached vs full pass: only the summation order of the matmuls differs


@pytest.fixture(scope="module")
def tiny():
    return load_reference("tiny")


@pytest.mark.parametrize("name", ["tiny", "odd_heads", pytest.param("124M", marks=pytest.mark.slow)])
def test_logits_match_hugging_face(name):
    hparams, params, reference = load_reference(name)
    logits = gpt2(reference["inputs"], **params, n_head=hparams["n_head"])
    assert logits.shape == (len(reference["inputs"]), hparams["n_vocab"])
    assert logits.dtype == np.float32
    if "positions" in reference.files:
        logits = logits[reference["positions"]]
    assert np.abs(logits - reference["logits"]).max() <= HF_TOLERANCE
    np.testing.assert_array_equal(logits.argmax(-1), reference["logits"].argmax(-1))


@pytest.mark.parametrize(
    "wrong_piece, replacement",
    [
        ("offset_causal_mask", lambda n_q, n_k: np.zeros((n_q, n_k), np.float32)),  # no mask: sees the future
        ("split_qkv", lambda x, n_head: x.reshape(3, n_head, x.shape[0], -1)),  # heads cut across positions
    ],
)
def test_fixture_detects_a_wrong_mask_or_head_split(tiny, monkeypatch, wrong_piece, replacement):
    hparams, params, reference = tiny
    monkeypatch.setattr(model, wrong_piece, replacement)
    logits = gpt2(reference["inputs"], **params, n_head=hparams["n_head"])
    assert np.abs(logits - reference["logits"]).max() > 1.0


def feed_in_chunks(params, n_head, inputs, sizes):  # -> logits of every position, fed through the KV cache
    cache = new_cache(params["wpe"], params["blocks"], n_head)
    rows, start = [], 0
    for size in sizes:
        logits, cache = gpt2_cached(inputs[start : start + size], cache, **params, n_head=n_head)
        rows.append(logits)
        start += size
    assert start == len(inputs) == cache.n_past
    return np.concatenate(rows)


@pytest.mark.parametrize("sizes", [[1] * 64, [10, 1, 1, 7, 45], [64]])
def test_kv_cache_matches_full_pass_at_every_position(tiny, sizes):
    hparams, params, reference = tiny
    full = gpt2(reference["inputs"], **params, n_head=hparams["n_head"])
    cached = feed_in_chunks(params, hparams["n_head"], reference["inputs"], sizes)
    assert cached.dtype == np.float32
    assert np.abs(cached - full).max() <= CACHE_TOLERANCE


@pytest.mark.parametrize("query_block", [10, 64])
def test_attention_in_query_blocks_matches_hugging_face(tiny, monkeypatch, query_block):
    hparams, params, reference = tiny
    monkeypatch.setattr(model, "QUERY_BLOCK", query_block)  # 64 tokens: blocks of 10, ..., 10, 4; or one block
    full = gpt2(reference["inputs"], **params, n_head=hparams["n_head"])
    assert np.abs(full - reference["logits"]).max() <= HF_TOLERANCE
    cached = feed_in_chunks(params, hparams["n_head"], reference["inputs"], [30, 34])  # blocks after cached keys
    assert np.abs(cached - reference["logits"]).max() <= HF_TOLERANCE


def test_last_only_after_a_long_prompt_is_the_last_position(tiny, monkeypatch):
    hparams, params, reference = tiny
    monkeypatch.setattr(model, "QUERY_BLOCK", 10)  # 64 tokens: blocks of 10, ..., 10, 4
    cache = new_cache(params["wpe"], params["blocks"], hparams["n_head"])
    last, _ = gpt2_cached(reference["inputs"], cache, **params, n_head=hparams["n_head"], last_only=True)
    assert last.shape == (1, hparams["n_vocab"])
    assert np.abs(last[0] - reference["logits"][-1]).max() <= HF_TOLERANCE


@pytest.mark.parametrize("cached", [False, True])
def test_last_only_runs_the_last_block_on_the_last_row_only(tiny, monkeypatch, cached):
    hparams, params, reference = tiny
    inputs, n_head, n_layer = reference["inputs"], hparams["n_head"], hparams["n_layer"]
    n = len(inputs) - 1
    rows_seen = []
    real_linear = model.linear
    monkeypatch.setattr(model, "linear", lambda x, w, b: rows_seen.append(x.shape[-2]) or real_linear(x, w, b))
    if cached:
        cache = new_cache(params["wpe"], params["blocks"], n_head)
        last, cache = gpt2_cached(inputs[:-1], cache, **params, n_head=n_head, last_only=True)
    else:
        last = gpt2(inputs[:-1], **params, n_head=n_head, last_only=True)
    # c_attn, attention's c_proj, c_fc, the mlp's c_proj: only the last block's c_attn (keys, values) needs every row
    assert rows_seen == [n] * 4 * (n_layer - 1) + [n, 1, 1, 1]
    assert last.shape == (1, hparams["n_vocab"])
    assert np.abs(last[0] - reference["logits"][-2]).max() <= HF_TOLERANCE  # HF's logits at position n - 1
    if cached:  # the last block still stored every position's key and value, which the next step attends to
        step, _ = gpt2_cached(inputs[-1:], cache, **params, n_head=n_head, last_only=True)
        assert np.abs(step[0] - reference["logits"][-1]).max() <= HF_TOLERANCE


def test_kv_cache_last_only_returns_the_last_row(tiny):
    hparams, params, reference = tiny
    cache = new_cache(params["wpe"], params["blocks"], hparams["n_head"])
    last, _ = gpt2_cached(reference["inputs"][:20], cache, **params, n_head=hparams["n_head"], last_only=True)
    assert last.shape == (1, hparams["n_vocab"])
    assert np.abs(last[0] - reference["logits"][19]).max() <= HF_TOLERANCE


def test_a_cached_step_processes_only_the_new_token(tiny, monkeypatch):
    hparams, params, reference = tiny
    cache = new_cache(params["wpe"], params["blocks"], hparams["n_head"])
    gpt2_cached(reference["inputs"][:40], cache, **params, n_head=hparams["n_head"])
    rows_seen = []
    real_linear = model.linear
    monkeypatch.setattr(model, "linear", lambda x, w, b: rows_seen.append(len(x)) or real_linear(x, w, b))
    gpt2_cached(reference["inputs"][40:41], cache, **params, n_head=hparams["n_head"])
    assert rows_seen and set(rows_seen) == {1}


def test_changing_a_later_token_never_changes_earlier_logits(tiny):
    hparams, params, reference = tiny
    inputs = reference["inputs"].copy()
    before = gpt2(inputs, **params, n_head=hparams["n_head"])
    inputs[30] = (inputs[30] + 1) % hparams["n_vocab"]
    after = gpt2(inputs, **params, n_head=hparams["n_head"])
    assert np.abs(after[:30] - before[:30]).max() <= 1e-6
    assert np.abs(after[30:] - before[30:]).max() > 0.1


def test_every_intermediate_stays_float32(tiny, monkeypatch):
    hparams, params, reference = tiny
    dtypes = set()
    for name in ["gelu", "shifted_exp", "layer_norm", "linear", "attention", "mha", "block", "ffn", "embed", "lm_head"]:
        real = getattr(model, name)
        monkeypatch.setattr(model, name, lambda *a, _real=real, **k: dtypes.add(_real(*a, **k).dtype) or _real(*a, **k))
    gpt2(reference["inputs"][:8], **params, n_head=hparams["n_head"])
    assert dtypes == {np.dtype(np.float32)}


@pytest.mark.parametrize("n_rows", [1, 2, 5, 32, 33])  # one row, the few rows multiplied by pieces, and more
def test_lm_head_of_a_batch_step_is_x_times_wte_transposed(monkeypatch, n_rows):
    monkeypatch.setattr(model, "FEW_ROWS_PIECE", 3)  # 23 tokens: pieces of 3, and 2 more
    rng = np.random.default_rng(0)
    wte = rng.standard_normal((23, 16), dtype=np.float32)
    x = rng.standard_normal((n_rows, 1, 16), dtype=np.float32)  # a batch's decode step: [n_rows, 1, n_embd]
    logits = model.lm_head(x, wte)
    assert logits.shape == (n_rows, 1, 23) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, x.astype(np.float64) @ wte.T.astype(np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_rows", [1, 2, 5, 32, 33])
@pytest.mark.parametrize("order", ["C", "F"])  # row-major, and column-major as inference_layout may store it
def test_linear_of_a_batch_step_is_x_w_plus_b_in_either_order(monkeypatch, n_rows, order):
    monkeypatch.setattr(model, "FEW_ROWS_PIECE", 3)  # 23 outputs: pieces of 3, and 2 more
    monkeypatch.setattr(model, "ROW_MAJOR_PIECE", 4)  # ... of 4, and 3 more
    rng = np.random.default_rng(0)
    w = np.asarray(rng.standard_normal((16, 23), dtype=np.float32), order=order)
    b = rng.standard_normal(23, dtype=np.float32)
    x = rng.standard_normal((n_rows, 1, 16), dtype=np.float32)  # a batch's decode step: [n_rows, 1, n_in]
    out = model.linear(x, w, b)
    assert out.shape == (n_rows, 1, 23) and out.dtype == np.float32 and out.flags.c_contiguous
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.astype(np.float64) + b, rtol=1e-5, atol=1e-5)


def test_softmax_rows_sum_to_one_and_ignore_shifts():
    x = np.random.default_rng(0).standard_normal((5, 7), dtype=np.float32) * 10
    probabilities = softmax(x)
    np.testing.assert_allclose(probabilities.sum(-1), 1, atol=1e-6)
    np.testing.assert_allclose(softmax(x + 50), probabilities, atol=1e-5)  # float32 rounding of x + 50 is ~4e-6
    assert probabilities.dtype == np.float32


def test_softmax_does_not_overflow_on_large_logits():
    np.testing.assert_allclose(softmax(np.array([1000, 1000, 0], np.float32)), [0.5, 0.5, 0], atol=1e-7)


@pytest.mark.parametrize("offset", [0, 200, -200])  # scores within ±UNSHIFTED, and beyond: e^200 overflows float32,
# e^-200 vanishes (a row of zeros, 0 / 0)
def test_attention_takes_its_softmax_without_overflow_or_underflow(offset, monkeypatch):
    monkeypatch.setattr(model, "UNSHIFTED_FROM", 1)  # the check at every size, not only at a prefill's
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 5, 8), dtype=np.float32) for _ in range(3))
    q[..., 0], k[..., 0] = 1, offset * math.sqrt(8)  # every score q kᵀ / √8 moves by offset
    mask = offset_causal_mask(5, 5)
    expected = textbook.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), mask)
    np.testing.assert_allclose(attention(q, k, v, mask), expected, atol=1e-4)


def test_layer_norm_normalizes_before_the_affine():
    x = np.random.default_rng(0).standard_normal((4, 64), dtype=np.float32) * 3 + 5
    y = layer_norm(x, g=np.ones(64, np.float32), b=np.zeros(64, np.float32))
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(y.var(-1), 1, atol=1e-3)  # eps=1e-5 shrinks the variance by about eps/var(x)
    g, b = np.full(64, 2, np.float32), np.full(64, 0.5, np.float32)
    np.testing.assert_allclose(layer_norm(x, g, b), 2 * y + 0.5, atol=1e-5)


def test_gelu_is_close_to_the_exact_erf_gelu():
    points = np.array([-6, -3, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 3, 6], np.float32)
    exact = np.array([x * 0.5 * (1 + math.erf(x / math.sqrt(2))) for x in points.tolist()])
    approx = gelu(points)
    assert approx.dtype == np.float32
    assert np.abs(approx - exact).max() < 1e-3  # the tanh approximation is within ~2e-4 of the erf form


def tanh_gelu(x):  # float64, GPT-2's formula as written: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def in_a_team(monkeypatch, size):  # -> set of the threads that run gelu's chunks, in a long pass's team of size
    threads, gelu_chunk = set(), model.gelu_chunk

    def recorded(x, out):
        threads.add(threading.get_ident())
        return gelu_chunk(x, out)

    monkeypatch.setattr(model, "gelu_chunk", recorded)
    monkeypatch.setattr(cores.team, "size", size, raising=False)  # as within cores.all_cores() with size threads
    monkeypatch.setattr(cores, "MIN_WORK", 1)  # no share too small to hand over: a few elements split as millions
    return threads


@pytest.mark.parametrize("team", [None, 3])  # one thread, or the chunks shared among 3, as in a long pass
def test_gelu_in_many_chunks_is_the_tanh_formula_everywhere(monkeypatch, team):
    threads = in_a_team(monkeypatch, team)
    monkeypatch.setattr(model, "CHUNK", 7)  # 3 * 5 * 11 = 165 elements: 55 a thread, 7 whole chunks and a part
    x = np.random.default_rng(0).standard_normal((3, 5, 11), dtype=np.float32) * 4
    x[0, 0, :2] = -100, 100  # e^(-2u) overflows to inf (-100) or vanishes (100)
    for array in (x.transpose(2, 0, 1), x):  # a view in another memory order, and C-ordered
        y = gelu(array)
        assert y.shape == array.shape and y.dtype == np.float32
        np.testing.assert_allclose(y, tanh_gelu(array), rtol=1e-6, atol=1e-6)
    assert (len(threads) > 1) == bool(team)  # the caller's thread and the pool's (which may run two pieces on one)


@pytest.mark.parametrize("team", [None, 3])  # in a team, the other threads must ignore the overflow too
def test_gelu_of_very_negative_inputs_is_zero_without_a_warning(monkeypatch, team):
    in_a_team(monkeypatch, team)
    monkeypatch.setattr(model, "CHUNK", 1)  # an element per chunk: each thread meets an overflow
    x = np.array([-100, -1e4, -3e38], np.float32)  # e^(-2u) overflows to inf, which NumPy would warn about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = gelu(x)
    np.testing.assert_array_equal(y, 0)  # the tanh form's 0.5 x (1 - 1), and the limit of x Phi(x)


@pytest.mark.parametrize("size", [0, 1, 17])  # a 0-d array, one element, two whole chunks of 8 and one element
def test_gelu_of_sizes_just_past_a_chunk_is_the_tanh_formula(monkeypatch, size):
    monkeypatch.setattr(model, "CHUNK", 8)
    x = np.float32(-1.5) if size == 0 else np.linspace(-4, 4, size, dtype=np.float32)
    y = gelu(x)
    assert y.shape == np.shape(x) and y.dtype == np.float32
    np.testing.assert_allclose(y, tanh_gelu(x), rtol=1e-6, atol=1e-6)


def test_attention_is_the_textbook_softmax_formula():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 5, 8), dtype=np.float32) * 4 for _ in range(3))  # scores up to ~50
    mask = offset_causal_mask(5, 5) + np.where(np.arange(5) < 2, -np.inf, 0).astype(np.float32)  # and keys 0, 1 hidden
    mask[:2, :2] = 0  # from all but the first two queries, which must see something
    scores = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) / math.sqrt(8) + mask
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    expected = weights / weights.sum(-1, keepdims=True) @ v
    out = attention(q, k, v, mask)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5)


def test_causal_mask_zeroes_attention_to_the_future():
    n = 6
    q = k = np.random.default_rng(0).standard_normal((2, n, 4), dtype=np.float32)
    v = np.broadcast_to(np.eye(n, dtype=np.float32), (2, n, n))  # one-hot values expose the attention weights
    weights = attention(q, k, v, offset_causal_mask(n, n))
    assert np.all(weights[:, np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] == 0)
    np.testing.assert_allclose(weights.sum(-1), 1, atol=1e-6)
    assert np.all(weights[:, np.tril_indices(n)[0], np.tril_indices(n)[1]] > 0)


def test_causal_mask_for_new_queries_after_cached_keys():
    # two new queries at positions 3 and 4 of 5 keys: the first must not see key 4
    mask = offset_causal_mask(2, 5)
    assert np.isneginf(mask[0, 4]) and np.all(mask[0, :4] == 0) and np.all(mask[1] == 0)


@pytest.mark.parametrize(
    "inputs, fragment",
    [([1, -1], "token id -1 is outside the vocabulary"), ([512], "token id 512 is outside the vocabulary")],
)
def test_out_of_range_ids_are_refused(tiny, inputs, fragment):
    hparams, params, _ = tiny
    with pytest.raises(ValueError, match=fragment):
        gpt2(inputs, **params, n_head=hparams["n_head"])


@pytest.mark.parametrize("inputs", [[], [1.0, 2.0], [[[1, 2]]], [[]]])
def test_malformed_inputs_are_refused(tiny, inputs):
    hparams, params, _ = tiny
    with pytest.raises(ValueError, match="token ids must be a non-empty 1-D sequence of integers"):
        gpt2(inputs, **params, n_head=hparams["n_head"])


def test_too_long_a_sequence_is_refused(tiny):
    hparams, params, _ = tiny
    with pytest.raises(ValueError, match="65 positions exceed the model's context of n_ctx=64"):
        gpt2([0] * 65, **params, n_head=hparams["n_head"])


def test_the_cache_refuses_to_run_past_the_context_and_stays_intact(tiny):
    hparams, params, reference = tiny
    cache = new_cache(params["wpe"], params["blocks"], hparams["n_head"])
    gpt2_cached(reference["inputs"][:60], cache, **params, n_head=hparams["n_head"])
    with pytest.raises(ValueError, match="^65 positions exceed the model's context of n_ctx=64 tokens$"):
        gpt2_cached([0] * 5, cache, **params, n_head=hparams["n_head"])
    assert cache.n_past == 60
    last, _ = gpt2_cached(reference["inputs"][60:61], cache, **params, n_head=hparams["n_head"])
    assert np.abs(last[0] - reference["logits"][60]).max() <= HF_TOLERANCE


@pytest.mark.parametrize("inputs", [np.array([], np.int64), np.zeros((2, 0), np.int64)])
def test_an_empty_integer_sequence_is_refused(tiny, inputs):
    hparams, params, _ = tiny
    with pytest.raises(ValueError, match="non-empty 1-D sequence"):
        gpt2(inputs, **params, n_head=hparams["n_head"])


@pytest.mark.parametrize(
    "pad, inputs, fragment",
    [
        ([0, 0], [1, 2, 3], r"shape \(3,\) do not fit a KV cache for a batch of 2 rows"),  # would broadcast silently
        ([0, 0], [[1], [2], [3]], r"shape \(3, 1\) do not fit a KV cache for a batch of 2 rows"),
        (None, [[1, 2]], r"shape \(1, 2\) do not fit a KV cache for one sequence"),
    ],
)
def test_ids_must_fit_the_cache_they_extend(tiny, pad, inputs, fragment):
    hparams, params, _ = tiny
    cache = new_cache(params["wpe"], params["blocks"], hparams["n_head"], pad=pad)
    with pytest.raises(ValueError, match=fragment):
        gpt2_cached(inputs, cache, **params, n_head=hparams["n_head"])
    assert cache.n_past == 0


@pytest.mark.parametrize("n_slots", [0, 65])
def test_a_cache_holds_between_one_slot_and_the_context(tiny, n_slots):
    hparams, params, _ = tiny
    with pytest.raises(ValueError, match=f"n_slots={n_slots} must lie in 1 ... n_ctx=64"):
        new_cache(params["wpe"], params["blocks"], hparams["n_head"], n_slots=n_slots)


# --- the tuned pass equals the textbook model.py ---

EQUAL_RTOL = 1e-5  # of the largest textbook logit: the two differ only in float32 rounding (measured 2e-6)


def assert_tuned_equals_textbook(tuned, textbook):
    assert tuned.shape == textbook.shape and tuned.dtype == textbook.dtype == np.float32
    assert np.abs(tuned - textbook).max() <= EQUAL_RTOL * np.abs(textbook).max()


def reference_inputs(name):  # -> hparams, params, the token ids of an HF fixture
    hparams, params, reference = load_reference(name)
    return hparams, params, reference["inputs"]


# 0: every attention einsum takes the matmul route; 1 << 62: every one runs einsum's own loop
EINSUM_FORMS = {"path": 0, "plain": 1 << 62}


@pytest.mark.parametrize("form", EINSUM_FORMS)
@pytest.mark.parametrize("name", ["tiny", "odd_heads"])
def test_tuned_equals_textbook_at_full_context_and_one_position(name, form, monkeypatch):
    monkeypatch.setattr(model, "PLAIN_EINSUM_MACS", EINSUM_FORMS[form])
    hparams, params, _ = reference_inputs(name)
    n_head = hparams["n_head"]
    ids = np.random.default_rng(0).integers(0, hparams["n_vocab"], hparams["n_ctx"])  # every position of the context
    for inputs in (ids, ids[:1]):
        expected = textbook.gpt2(inputs, **params, n_head=n_head)
        assert_tuned_equals_textbook(gpt2(inputs, **params, n_head=n_head), expected)


@pytest.mark.slow
def test_tuned_equals_textbook_on_the_124M_shape():
    hparams, params, _ = reference_inputs("124M")
    ids = np.random.default_rng(0).integers(0, hparams["n_vocab"], 300)  # 3 query blocks; einsums by matmul
    expected = textbook.gpt2(ids, **params, n_head=hparams["n_head"])
    assert_tuned_equals_textbook(gpt2(ids, **params, n_head=hparams["n_head"]), expected)
    last = gpt2(ids, **params, n_head=hparams["n_head"], last_only=True)
    assert_tuned_equals_textbook(last, expected[-1:])


@pytest.mark.parametrize("name", ["tiny", "odd_heads"])
def test_tuned_cache_fed_token_by_token_equals_textbook(name):
    hparams, params, ids = reference_inputs(name)
    expected = textbook.gpt2(ids, **params, n_head=hparams["n_head"])
    assert_tuned_equals_textbook(feed_in_chunks(params, hparams["n_head"], ids, [1] * len(ids)), expected)
    cache = new_cache(params["wpe"], params["blocks"], hparams["n_head"])
    last, cache = gpt2_cached(ids[:-1], cache, **params, n_head=hparams["n_head"], last_only=True)
    assert_tuned_equals_textbook(last, expected[-2:-1])
    step, _ = gpt2_cached(ids[-1:], cache, **params, n_head=hparams["n_head"], last_only=True)
    assert_tuned_equals_textbook(step, expected[-1:])


@pytest.mark.parametrize("name", ["tiny", "odd_heads"])
def test_tuned_ragged_batch_equals_textbook_row_by_row(name):
    hparams, params, ids = reference_inputs(name)
    n_head, lengths, n_new = hparams["n_head"], [1, 9, 30, 17], 5
    prompts = [ids[i : i + n] for i, n in enumerate(lengths)]
    pad = max(lengths) - np.array(lengths)
    padded = np.array([np.concatenate([np.zeros(p, np.int64), prompt]) for p, prompt in zip(pad, prompts)])
    cache = new_cache(params["wpe"], params["blocks"], n_head, pad=pad)
    logits, cache = gpt2_cached(padded, cache, **params, n_head=n_head)  # [4, 30, n_vocab]
    following = ids[-n_new:]  # the same new tokens for every row, fed one step at a time
    steps = [gpt2_cached(np.full((len(lengths), 1), token), cache, **params, n_head=n_head)[0] for token in following]
    for row, (prompt, p) in enumerate(zip(prompts, pad)):
        expected = textbook.gpt2(np.concatenate([prompt, following]), **params, n_head=n_head)
        assert_tuned_equals_textbook(logits[row, p:], expected[: len(prompt)])
        assert_tuned_equals_textbook(np.concatenate([s[row] for s in steps]), expected[len(prompt) :])


def test_textbook_batch_axis_equals_the_tuned_batch():
    hparams, params, ids = reference_inputs("odd_heads")
    batch = np.stack([ids[:20], ids[20:40], ids[5:25]])  # [3, 20]: equal lengths, the textbook's "..." axis
    assert_tuned_equals_textbook(gpt2(batch, **params, n_head=3), textbook.gpt2(batch, **params, n_head=3))


@pytest.mark.parametrize("kernels", ["SkylakeX", "Haswell", None])  # AVX-512, AVX2, a BLAS that is not OpenBLAS
def test_inference_layout_keeps_every_value_and_equals_textbook_when_decoding(kernels, monkeypatch):
    # with AVX-512 kernels every block weight is stored column-major (a batch's few-row products run faster so),
    # with others mlp.c_proj.w alone; either way the same values, and the same logits as the textbook's
    monkeypatch.setattr(cores, "openblas_core", lambda: kernels)
    hparams, params, ids = reference_inputs("odd_heads")
    laid_out = inference_layout(params)
    moved = {path for path, _ in flatten(params) if path[0] == "blocks" and path[-1] == "w" and
             (kernels == "SkylakeX" or path[-3:] == ("mlp", "c_proj", "w"))}
    assert len(moved) == len(params["blocks"]) * (4 if kernels == "SkylakeX" else 1)
    for (path, before), (_, after) in zip(flatten(params), flatten(laid_out)):
        np.testing.assert_array_equal(after, before, err_msg=str(path))  # same shape and values, whatever the order
        assert after.flags.c_contiguous != (path in moved), path  # only those weights move
        assert before.flags.c_contiguous, path  # params unchanged
    expected = textbook.gpt2(ids, **params, n_head=hparams["n_head"])
    cached = feed_in_chunks(laid_out, hparams["n_head"], ids, [5] + [1] * (len(ids) - 5))
    assert_tuned_equals_textbook(cached, expected)
    assert_tuned_equals_textbook(gpt2(ids, **laid_out, n_head=hparams["n_head"]), expected)
    batch, n_head = np.stack([ids[:12], ids[3:15], ids[6:18]]), hparams["n_head"]  # a batch's steps: few-row products
    cache = new_cache(laid_out["wpe"], laid_out["blocks"], n_head, pad=np.zeros(len(batch), int))
    steps = [gpt2_cached(batch[:, :4], cache, **laid_out, n_head=n_head)[0]]
    steps += [gpt2_cached(batch[:, i : i + 1], cache, **laid_out, n_head=n_head)[0] for i in range(4, 12)]
    assert_tuned_equals_textbook(np.concatenate(steps, axis=1), textbook.gpt2(batch, **params, n_head=n_head))


@pytest.mark.parametrize("faster", ["few_rows_product", "matmul"])
def test_a_batch_step_s_product_runs_in_the_form_timed_faster_and_both_forms_agree(monkeypatch, faster):
    # in_faster_form times the first FORM_TRIALS calls of each form, in turns, then keeps the one of the fastest trial:
    # here the faster form is delayed in all its trials but one (as by OpenBLAS's workers still spinning beside it),
    # where a median or a mean would take the slower
    monkeypatch.setattr(model, "FORMS", {})
    clock, calls = iter(range(10**6)), []

    def timed(real, costs):  # the form, on a clock that advances costs(its call's number) per call
        made = []

        def form(rows, w, **kwargs):
            calls.append(real.__name__)
            for _ in range(costs(len(made)) - 1):
                next(clock)
            made.append(None)
            return real(rows, w, **kwargs)
        return form

    def slow(_):
        return 5

    def delayed_but_once(call):
        return 2 if call == model.FORM_TRIALS // 2 else 9

    monkeypatch.setattr(model, "few_rows_product", timed(model.few_rows_product,
                                                         delayed_but_once if faster == "few_rows_product" else slow))
    monkeypatch.setattr(cores, "matmul", timed(cores.matmul, delayed_but_once if faster == "matmul" else slow))
    monkeypatch.setattr(model.time, "perf_counter", lambda: next(clock))
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((16, 23), dtype=np.float32), rng.standard_normal(23, dtype=np.float32)
    for _ in range(2 * model.FORM_TRIALS + 3):
        x = rng.standard_normal((4, 1, 16), dtype=np.float32)
        with cores.all_cores():  # as a batch's decode step runs: OpenBLAS on one thread
            out = model.linear(x, w, b)
        np.testing.assert_allclose(out, x.astype(np.float64) @ w + b, rtol=1e-5, atol=1e-5)
    trials = 2 * model.FORM_TRIALS
    assert sorted(calls[:trials]) == sorted(["few_rows_product", "matmul"] * model.FORM_TRIALS)  # each timed in turn
    assert calls[trials:] == [faster] * 3
