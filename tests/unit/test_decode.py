"""The decode loop: Hugging Face's greedy ids, the KV cache against full recomputation, stopping, argument checks."""
import copy
import json
import re
import tracemalloc

import numpy as np
import pytest

from gpt2_numpy import decode
from gpt2_numpy import fast as model_module
from gpt2_numpy.console import plural
from gpt2_numpy.errors import NonFiniteError, UsageError
from gpt2_numpy.generate import generate, generate_batch, iter_batch, iter_generate
from gpt2_numpy.fast import gpt2, gpt2_cached, new_cache
from gpt2_numpy.params import random_params
from gpt2_numpy.sampling import next_token
from tests.conftest import FIXTURES

CONFIGS = json.loads((FIXTURES / "configs.json").read_text())


def model(name):  # -> hparams, params of a fixture config
    config = CONFIGS[name]
    return config["hparams"], random_params(config["hparams"], config["seed"])


@pytest.fixture(scope="module")
def tiny():
    hparams, params = model("tiny")
    reference = np.load(FIXTURES / "reference_tiny.npz")
    return hparams, params, reference["greedy_prompt"].tolist(), reference["greedy_ids"].tolist()


def uncached_ids(prompt, params, n_head, n_tokens, **sampling):  # -> new ids, recomputing the whole sequence each step
    rng = np.random.default_rng(sampling.pop("seed", None))
    ids = list(prompt)
    for _ in range(n_tokens):
        ids.append(next_token(gpt2(ids, **params, n_head=n_head)[-1], rng, **sampling))
    return ids[len(prompt) :]


def test_greedy_equals_hugging_face(tiny):
    hparams, params, prompt, hf_ids = tiny
    assert len(hf_ids) >= 20
    assert generate(prompt, params, hparams["n_head"], len(hf_ids)) == hf_ids


def test_streaming_yields_the_same_ids_one_at_a_time(tiny):
    hparams, params, prompt, hf_ids = tiny
    stream = iter_generate(prompt, params, hparams["n_head"], len(hf_ids))
    assert next(stream) == hf_ids[0]
    assert list(stream) == hf_ids[1:]


@pytest.mark.parametrize("name", ["tiny", "odd_heads"])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "top_k": 50, "top_p": 0.95, "seed": 3}])
def test_cached_equals_uncached(name, sampling):
    hparams, params = model(name)
    prompt = np.random.default_rng(0).integers(0, hparams["n_vocab"], 5).tolist()
    n_tokens = hparams["n_ctx"] - len(prompt)  # up to the last position of the context
    cached = generate(prompt, params, hparams["n_head"], n_tokens, **sampling, stop_at_eos=False)
    assert cached == uncached_ids(prompt, params, hparams["n_head"], n_tokens, **sampling)


def test_top_k_1_and_tiny_temperature_equal_greedy(tiny):
    hparams, params, prompt, hf_ids = tiny
    n_head = hparams["n_head"]
    assert generate(prompt, params, n_head, len(hf_ids), temperature=1.0, top_k=1, seed=0) == hf_ids
    assert generate(prompt, params, n_head, len(hf_ids), temperature=1e-6, seed=0) == hf_ids


def test_same_seed_same_ids(tiny):
    hparams, params, prompt, _ = tiny

    def sample(seed):
        return generate(prompt, params, hparams["n_head"], 30, temperature=1.0, seed=seed)

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


def test_stops_at_end_of_text_without_yielding_it(tiny):
    hparams, params, prompt, hf_ids = tiny
    # the tiny vocabulary has no id 50256: let the 6th greedy id (first seen there) play <|endoftext|>
    assert hf_ids[5] not in hf_ids[:5]
    assert generate(prompt, params, hparams["n_head"], len(hf_ids), eos_id=hf_ids[5]) == hf_ids[:5]
    assert generate(prompt, params, hparams["n_head"], len(hf_ids), stop_at_eos=False, eos_id=hf_ids[5]) == hf_ids


def test_prompt_plus_new_tokens_must_fit_the_context(tiny):
    hparams, params, prompt, _ = tiny  # 8 prompt tokens, n_ctx 64
    assert len(generate(prompt, params, hparams["n_head"], 56)) == 56
    with pytest.raises(UsageError, match="prompt's 8 tokens plus 57 new tokens make 65, more than the model's context "
                                         "of 64 tokens: shorten the prompt to at most 7 tokens or generate at most 56 "
                                         "tokens"):
        iter_generate(prompt, params, hparams["n_head"], 57)  # raised at the call, before any id is asked for
    with pytest.raises(UsageError, match="63 tokens plus 2 new tokens make 65, .* generate at most 1 token$"):
        iter_generate(list(range(63)), params, hparams["n_head"], 2)
    for n_prompt in (64, 65, 1000):  # a prompt as long as the context, or longer, gets the same UsageError
        with pytest.raises(UsageError, match=f"the prompt's {n_prompt} tokens plus 1 new token make {n_prompt + 1}, "
                                             "more than the model's context of 64 tokens: shorten the prompt to at "
                                             "most 63 tokens$"):
            iter_generate([1] * n_prompt, params, hparams["n_head"], 1)


@pytest.mark.parametrize(
    "n_tokens, options, error, fragment",
    [
        (0, {}, UsageError, "number of tokens to generate must be a whole number >= 1"),
        (2.0, {}, UsageError, "number of tokens to generate must be a whole number >= 1"),
        (5, {"temperature": -1.0}, UsageError, "temperature (--temperature) must be a number >= 0"),
        (5, {"top_k": 0}, UsageError, "top_k (--top-k) must be a whole number >= 1"),
        (5, {"top_p": 0.0}, UsageError, "top_p (--top-p) must be a number in"),
    ],
)
def test_bad_arguments_are_refused_up_front(tiny, n_tokens, options, error, fragment):
    hparams, params, prompt, _ = tiny
    with pytest.raises(error, match=re.escape(fragment)):
        iter_generate(prompt, params, hparams["n_head"], n_tokens, **options)


@pytest.mark.parametrize("prompt", [[], [512], [-1], [[1, 2]]])
def test_bad_prompt_ids_raise_value_error(tiny, prompt):
    hparams, params, _, _ = tiny
    with pytest.raises(ValueError):
        iter_generate(prompt, params, hparams["n_head"], 1)


# --- Batched generation ---


@pytest.fixture(scope="module")
def batch_reference():  # -> prompts (lists of different lengths), HF's batched greedy ids, the stand-in end id and ids
    reference = np.load(FIXTURES / "reference_batch.npz")
    prompts = [[int(t) for t in row if t >= 0] for row in reference["prompts"]]  # -1 marks the fixture's padding
    eos_id = int(reference["eos_id"])
    # HF keeps the end id in the row it ends (then pads, -1 here); we return the ids before it
    eos_rows = [[int(t) for t in row if t >= 0 and t != eos_id] for row in reference["eos_greedy_ids"]]
    return prompts, reference["greedy_ids"].tolist(), eos_id, eos_rows


def test_batch_greedy_equals_hugging_face_batched_and_each_prompt_alone(tiny, batch_reference):
    hparams, params, _, _ = tiny
    prompts, hf_ids, _, _ = batch_reference
    assert sorted(map(len, prompts)) == [1, 4, 9, 16]
    n_new = len(hf_ids[0])
    batch = generate_batch(prompts, params, hparams["n_head"], n_new, stop_at_eos=False)
    assert batch == hf_ids
    assert batch == [generate(prompt, params, hparams["n_head"], n_new) for prompt in prompts]


def test_a_row_that_reaches_end_of_text_stops_and_the_others_go_on(tiny, batch_reference):
    hparams, params, _, _ = tiny
    prompts, hf_ids, eos_id, hf_eos_rows = batch_reference
    assert eos_id > 256  # above CPython's cached small ints: `is` instead of `==` would never stop
    batch = generate_batch(prompts, params, hparams["n_head"], len(hf_ids[0]), eos_id=eos_id)
    assert batch == hf_eos_rows
    assert sum(len(row) < len(hf_ids[0]) for row in batch) == 1  # exactly one row stopped early
    assert batch == [generate(prompt, params, hparams["n_head"], len(hf_ids[0]), eos_id=eos_id) for prompt in prompts]


def test_finished_rows_leave_the_batch(tiny, batch_reference, monkeypatch):
    hparams, params, _, _ = tiny
    prompts, hf_ids, eos_id, hf_eos_rows = batch_reference
    rows_per_step = []
    real_lm_head = model_module.lm_head
    monkeypatch.setattr(model_module, "lm_head", lambda x, wte: rows_per_step.append(len(x)) or real_lm_head(x, wte))
    generate_batch(prompts, params, hparams["n_head"], len(hf_ids[0]), eos_id=eos_id)
    stopped_after = min(len(row) for row in hf_eos_rows) + 1  # the step that chose the end id
    assert rows_per_step == [4] * stopped_after + [3] * (len(hf_ids[0]) - stopped_after)


def test_batched_cache_logits_equal_each_row_alone_at_every_position(tiny, batch_reference):
    hparams, params, _, _ = tiny
    prompts, hf_ids, _, _ = batch_reference
    n_head, width = hparams["n_head"], max(map(len, prompts))
    sequences = [prompt + ids for prompt, ids in zip(prompts, hf_ids)]  # [n_rows] of prompt + 12 ids
    pad = [width - len(prompt) for prompt in prompts]
    cache = new_cache(params["wpe"], params["blocks"], n_head, pad=pad, n_slots=width + len(hf_ids[0]))
    padded = np.array([[0] * n_pad + seq for n_pad, seq in zip(pad, sequences)])  # [n_rows, width + 12]
    prefill, cache = gpt2_cached(padded[:, :width], cache, **params, n_head=n_head)
    steps = [gpt2_cached(padded[:, [t]], cache, **params, n_head=n_head)[0] for t in range(width, padded.shape[1])]
    batched = np.concatenate([prefill, *steps], axis=1)  # [n_rows, width + 12, n_vocab]
    for row, (n_pad, seq) in enumerate(zip(pad, sequences)):
        alone = gpt2(seq, **params, n_head=n_head)
        assert np.abs(batched[row, n_pad:] - alone).max() <= 1e-5


def test_same_seed_same_batch_and_each_row_has_its_own_generator(tiny, batch_reference):
    hparams, params, _, _ = tiny
    prompts, _, _, _ = batch_reference

    def sample(seed):
        return generate_batch(prompts, params, hparams["n_head"], 10, temperature=1.0, seed=seed)

    first = sample(7)
    assert first == sample(7)
    assert all(row != other for row, other in zip(first, sample(8)))
    # row i draws with seed 7 + i, exactly as the prompt alone would
    alone = [generate(p, params, hparams["n_head"], 10, temperature=1.0, seed=7 + i) for i, p in enumerate(prompts)]
    assert first == alone


def test_each_row_samples_from_its_own_distribution(tiny, batch_reference):
    hparams, params, _, _ = tiny
    prompts, _, _, _ = batch_reference
    a, b = prompts[1], prompts[3]
    probs = [np.exp(np.float64(x) - np.logaddexp.reduce(np.float64(x))) for x in
             (gpt2(p, **params, n_head=hparams["n_head"])[-1] for p in (a, b))]
    token = int(np.argmax(np.abs(probs[0] - probs[1])))  # the id whose probability differs most between the rows
    n = 1500
    rows = generate_batch([a, b] * n, params, hparams["n_head"], 1, temperature=1.0, seed=0, stop_at_eos=False)
    for parity, p in enumerate(probs):
        count = sum(row == [token] for row in rows[parity::2])
        sigma = np.sqrt(n * p[token] * (1 - p[token]))
        assert abs(count - n * p[token]) <= 5 * sigma, (parity, count, n * p[token])
    other_sigma = np.sqrt(n * probs[1][token] * (1 - probs[1][token]))
    assert abs(probs[0][token] - probs[1][token]) * n > 10 * other_sigma  # the check can tell the rows apart


def test_by_default_a_continuation_ends_at_the_model_s_last_id():
    # <|endoftext|>'s id: 50256 is GPT-2's last, and every vocabulary train and tokenizer make puts it last too
    hparams = {"n_vocab": 5, "n_ctx": 64, "n_embd": 8, "n_head": 2, "n_layer": 1}
    params = random_params(hparams, 0)
    whole = generate([0], params, 2, 40, temperature=1.0, seed=3, stop_at_eos=False)
    assert 4 in whole  # 40 draws among 5 ids reach the last one
    before = whole[: whole.index(4)]
    assert generate([0], params, 2, 40, temperature=1.0, seed=3) == before
    assert generate_batch([[0], [0]], params, 2, 40, temperature=1.0, seed=3)[0] == before


@pytest.mark.parametrize("n_head", [3, 0, "4", None])
def test_a_head_count_that_does_not_divide_the_width_is_named(tiny, n_head):
    hparams, params, _, _ = tiny
    message = f"n_head={n_head!r} must be a whole number >= 1 that divides n_embd=64"
    with pytest.raises(ValueError, match=re.escape(message)):
        generate([1, 2], params, n_head, 2)
    with pytest.raises(ValueError, match=re.escape(message)):
        new_cache(params["wpe"], params["blocks"], n_head)


def test_batch_arguments_are_checked_up_front_and_name_the_prompt(tiny):
    hparams, params, _, _ = tiny
    with pytest.raises(UsageError, match="non-empty list of token-id lists, got generator"):
        generate_batch((prompt for prompt in [[1, 2]]), params, hparams["n_head"], 5)
    with pytest.raises(UsageError, match="^prompt 1's 70 tokens plus 5 new tokens make 75, more than the model's "):
        iter_batch([[1, 2], [3] * 70], params, hparams["n_head"], 5)
    with pytest.raises(ValueError, match="^prompt 2: token id 512 is outside the vocabulary"):
        iter_batch([[1, 2], [3], [512]], params, hparams["n_head"], 5)
    with pytest.raises(UsageError, match="non-empty list"):
        iter_batch([], params, hparams["n_head"], 5)
    with pytest.raises(UsageError, match="seed"):
        iter_batch([[1]], params, hparams["n_head"], 5, temperature=1.0, seed=-1)


@pytest.mark.parametrize("seed", [-1, 1.5, "a", True])
def test_a_bad_seed_is_a_usage_error(tiny, seed):
    hparams, params, prompt, _ = tiny
    with pytest.raises(UsageError, match=r"seed \(--seed\) must be a whole number >= 0"):
        generate(prompt, params, hparams["n_head"], 1, temperature=1.0, seed=seed)


def test_batch_without_stop_at_eos_goes_past_end_of_text(tiny, batch_reference):
    hparams, params, _, _ = tiny
    prompts, hf_ids, eos_id, _ = batch_reference
    assert any(eos_id in row for row in hf_ids)
    n_new = len(hf_ids[0])
    assert generate_batch(prompts, params, hparams["n_head"], n_new, stop_at_eos=False, eos_id=eos_id) == hf_ids


def test_when_the_new_tokens_alone_fill_the_context_only_fewer_tokens_can_help():
    with pytest.raises(UsageError, match="^the prompt's 1 token plus 64 new tokens make 65, more than the model's "
                                         "context of 64 tokens: generate at most 63 tokens$"):
        decode.check_room(1, 64, 64)


def test_counts_read_as_sentences():
    assert [plural(n, "token") for n in (0, 1, 2)] == ["0 tokens", "1 token", "2 tokens"]


def with_weight(params, value):  # -> a copy of params with one weight set to value (NaN or inf)
    params = copy.deepcopy(params)
    params["blocks"][0]["mlp"]["c_fc"]["w"][0, 0] = value  # input 0 feeds every position: every logit turns non-finite
    return params


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # NumPy meeting the inf
@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("options", [{}, {"temperature": 1.0, "seed": 0}])
def test_weights_holding_nan_or_inf_stop_generation_with_an_error(tiny, value, options):
    hparams, params, prompt, _ = tiny
    broken = with_weight(params, value)
    with pytest.raises(NonFiniteError, match="its weights hold NaN or infinite values"):
        generate(prompt, broken, hparams["n_head"], 3, **options)
    with pytest.raises(NonFiniteError):
        generate_batch([prompt, prompt[:2]], broken, hparams["n_head"], 3, **options)


def test_a_cache_s_rows_are_those_of_a_batch(tiny):
    hparams, params, _, _ = tiny
    wpe, blocks, n_head = params["wpe"], params["blocks"], hparams["n_head"]
    with pytest.raises(ValueError, match="keep\\(\\) selects rows of a batch cache"):  # was a TypeError from None[rows]
        new_cache(wpe, blocks, n_head).keep([0])
    for pad in ([0, -1], [], [[0]]):  # a negative pad was taken, and would index the cache from its end
        with pytest.raises(ValueError, match="pad must hold one whole number >= 0 per row of the batch"):
            new_cache(wpe, blocks, n_head, pad=pad)


def test_keeping_rows_allocates_only_the_cache_it_keeps(tiny):
    hparams, params, _, _ = tiny
    n_rows, n_past, rows = 8, 40, [0, 2, 5, 7]
    cache = new_cache(params["wpe"], params["blocks"], hparams["n_head"], pad=np.zeros(n_rows, np.int64))
    ids = np.random.default_rng(0).integers(0, hparams["n_vocab"], (n_rows, n_past))
    _, cache = gpt2_cached(ids, cache, **params, n_head=hparams["n_head"])  # fills 40 of the 64 slots
    tracemalloc.start()
    try:
        kept = cache.keep(rows)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    kept_bytes = kept.keys.nbytes + kept.values.nbytes  # 128 KiB: 2 layers x 4 rows x 4 heads x 64 slots x 16 x 4 B
    assert peak <= kept_bytes + 16 * 1024  # a temporary of the kept rows (the old code's) would add 64 KiB or more
    for old, new in ((cache.keys, kept.keys), (cache.values, kept.values)):
        np.testing.assert_array_equal(new, old[:, rows])  # every slot, the untouched ones zero in both
    assert (kept.n_past, kept.pad.tolist()) == (n_past, [0] * len(rows))


@pytest.mark.parametrize("n_tokens", [1, 7])
def test_a_single_decode_caches_only_the_positions_it_feeds_back(tiny, monkeypatch, n_tokens):
    hparams, params, prompt, _ = tiny
    slots = []
    real = decode.new_cache
    monkeypatch.setattr(decode, "new_cache", lambda *a, **kw: slots.append(kw["n_slots"]) or real(*a, **kw))
    generate(prompt, params, hparams["n_head"], n_tokens)
    # the prompt and every chosen id but the last: so --n-tokens, not the context, sizes the cache
    assert slots == [len(prompt) + n_tokens - 1]
