"""The decode loop: Hugging Face's greedy ids, the KV cache against full recomputation, stopping, argument checks."""
import json
import re

import numpy as np
import pytest

from gpt2_numpy import generate as generate_module
from gpt2_numpy.errors import UsageError
from gpt2_numpy.generate import generate, iter_generate
from gpt2_numpy.model import gpt2
from gpt2_numpy.random_params import random_params
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
    cached = generate(prompt, params, hparams["n_head"], n_tokens, **sampling)
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


def test_stops_at_end_of_text_without_yielding_it(tiny, monkeypatch):
    hparams, params, prompt, hf_ids = tiny
    # the tiny vocabulary has no id 50256: let the 6th greedy id (first seen there) play <|endoftext|>
    assert hf_ids[5] not in hf_ids[:5]
    monkeypatch.setattr(generate_module, "EOT_ID", hf_ids[5])
    assert generate(prompt, params, hparams["n_head"], len(hf_ids)) == hf_ids[:5]
    assert generate(prompt, params, hparams["n_head"], len(hf_ids), stop_at_eos=False) == hf_ids


def test_prompt_plus_new_tokens_must_fit_the_context(tiny):
    hparams, params, prompt, _ = tiny  # 8 prompt tokens, n_ctx 64
    assert len(generate(prompt, params, hparams["n_head"], 56)) == 56
    with pytest.raises(UsageError, match="prompt's 8 tokens plus 57 new tokens make 65, more than the model's context "
                                         "of 64 tokens: shorten the prompt or generate at most 56 tokens"):
        iter_generate(prompt, params, hparams["n_head"], 57)  # raised at the call, before any id is asked for
    with pytest.raises(UsageError, match="cut it to under 64 tokens"):
        iter_generate(list(range(64)), params, hparams["n_head"], 1)


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
