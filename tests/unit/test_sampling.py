"""Choosing the next id: greedy limits, seeds, top-k / top-p sets, and frequencies against the softmax math."""
import math
import re

import numpy as np
import pytest

from gpt2_numpy.errors import UsageError
from gpt2_numpy.generate import generate
from gpt2_numpy.params import random_params
from gpt2_numpy.sampling import DRAW_BLOCK, check_sampling_args, draw, next_token, nucleus

N_DRAWS = 8_000
# A frequency f of a bin with probability p over N draws has binomial std sqrt(p (1 - p) / N) <= 0.0056 here; 5 std
# per bin is exceeded by chance with probability < 6e-7, while a wrong temperature, order or renormalisation shifts
# the frequencies by 0.05 or more.
N_STD = 5

# a hand-made distribution (sums to 1), in scrambled order so that ids are not already sorted by probability
PROBS = np.array([0.05, 0.40, 0.02, 0.30, 0.10, 0.08, 0.03, 0.02])
LOGITS = np.log(PROBS).astype(np.float32)


def frequencies(logits, n_draws=N_DRAWS, seed=0, **options):  # -> [n] empirical frequency of each id
    rng = np.random.default_rng(seed)
    ids = [next_token(logits, rng, **options) for _ in range(n_draws)]
    return np.bincount(ids, minlength=len(logits)) / n_draws


def assert_matches(freqs, expected):  # expected: {id: probability}, every other id must never be drawn
    for token_id, freq in enumerate(freqs):
        p = expected.get(token_id, 0.0)
        assert abs(freq - p) <= N_STD * math.sqrt(p * (1 - p) / N_DRAWS), (token_id, freq, p)


def exact_softmax(logits, temperature):  # -> {id: probability}, in float64 from the definition
    weights = [math.exp(float(x) / temperature) for x in logits]
    return {i: w / sum(weights) for i, w in enumerate(weights)}


def renormalised(probs, ids):  # -> {id: probability} of the distribution restricted to ids
    return {i: probs[i] / sum(probs[j] for j in ids) for i in ids}


@pytest.mark.parametrize("temperature", [0.7, 2.5])
def test_frequencies_match_softmax_with_temperature(temperature):
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0], np.float32)
    assert_matches(frequencies(logits, temperature=temperature), exact_softmax(logits, temperature))


def test_top_p_keeps_the_smallest_set_reaching_p():
    # sorted probabilities 0.40 (id 1), 0.30 (id 3), 0.10 (id 4), 0.08 (id 5), ...: cumulative 0.40, 0.70, 0.80
    for top_p, nucleus_ids in [(0.75, [1, 3, 4]), (0.5, [1, 3]), (0.3, [1])]:
        expected = renormalised(PROBS, nucleus_ids)
        assert_matches(frequencies(LOGITS, temperature=1.0, top_p=top_p), expected)


def test_top_k_keeps_the_k_most_likely():
    for top_k in [1, 3, 100]:
        top_ids = [1, 3, 4, 5, 0, 6, 2, 7][:top_k]  # PROBS by decreasing probability
        assert_matches(frequencies(LOGITS, temperature=1.0, top_k=top_k), renormalised(PROBS, top_ids))


def test_temperature_then_top_k_then_top_p():
    # T=0.5 squares the probabilities: 0.16 (id 1), 0.09 (id 3), 0.01 (id 4), 0.0064 (id 5), ...; top_k=4 keeps those
    # four, renormalised 0.601, 0.338, 0.038, 0.024; top_p=0.9 then needs ids 1 and 3 (0.938), in ratio 16:9.
    # (top-p on the T=1 probabilities would keep five ids; top-k after top-p would keep the same two with T=1 ratios.)
    freqs = frequencies(LOGITS, temperature=0.5, top_k=4, top_p=0.9)
    assert_matches(freqs, {1: 0.16 / 0.25, 3: 0.09 / 0.25})


def test_top_k_never_leaves_the_top_k_of_a_large_vocabulary():
    logits = np.random.default_rng(1).standard_normal(5000).astype(np.float32)
    allowed = set(np.argsort(logits)[-7:].tolist())
    rng = np.random.default_rng(2)
    drawn = {next_token(logits, rng, temperature=3.0, top_k=7) for _ in range(3000)}
    assert drawn == allowed  # at T=3 all seven are likely enough to appear in 3000 draws


@pytest.mark.parametrize("scale", [0.1, 3.0])  # nearly flat (a nucleus of most of the vocabulary) and peaked
def test_nucleus_equals_the_full_sort_definition(scale):
    logits = np.random.default_rng(3).standard_normal(50257).astype(np.float32) * scale
    probs = np.exp(logits) / np.exp(logits).sum()  # float32, as sampling sees them
    order = np.argsort(-probs.astype(np.float64))
    for top_p in [0.1, 0.5, 0.9, 0.99]:
        n_keep = int(np.argmax(np.cumsum(probs[order], dtype=np.float64) >= top_p * probs.sum(dtype=np.float64))) + 1
        assert set(nucleus(probs, top_p).tolist()) == set(order[:n_keep].tolist())


def test_draw_never_picks_a_zero_probability():
    probs = np.array([0.0, 0.5, 0.0, 0.5, 0.0], np.float32)
    rng = np.random.default_rng(4)
    assert {draw(probs, rng) for _ in range(2000)} == {1, 3}


class StubRng:
    """Returns the same uniform number every time, to reach the ends of [0, 1) that a real generator almost never
    gives."""

    def __init__(self, value):
        self.value = value

    def random(self):
        return self.value


# 1 - 2**-30 is a valid draw of [0, 1), but times a float32 total near 1 it rounds up to the total itself (float32's
# spacing below 1 is 2**-24); a real generator gives such a number about 3e-8 of the time.
HIGHEST_UNIFORM = 1 - 2**-30


def banned_eot_logits(n_vocab=50257):  # -> logits with the last id (<|endoftext|> in GPT-2) banned by -inf
    logits = np.random.default_rng(9).standard_normal(n_vocab).astype(np.float32)
    logits[-1] = -np.inf
    return logits


@pytest.mark.parametrize(
    "logits, options",
    [
        (banned_eot_logits(), {"temperature": 1.0}),
        (banned_eot_logits(), {"temperature": 0.8, "top_k": 50257}),
        (banned_eot_logits(), {"temperature": 1.0, "top_p": 0.9999999}),
        (banned_eot_logits(300), {"temperature": 1.0}),  # a vocabulary of a single block
        # finite logits whose probability underflows to 0 in float32: exp(-200) and exp(-60 / 0.5)
        (np.array([0.0] * 50256 + [-200.0], np.float32), {"temperature": 1.0}),
        (np.array([0.0] * 50256 + [-60.0], np.float32), {"temperature": 0.5}),
    ],
)
def test_highest_uniform_draws_the_last_id_of_nonzero_probability(logits, options):
    # u = 1 - 2**-30 falls in the last interval of the inverse CDF: the last id with a probability above 1e-9.
    # Rounding u * total up to the total must not pick the zero-probability id after it.
    assert next_token(logits, StubRng(HIGHEST_UNIFORM), **options) == len(logits) - 2


def test_top_k_draws_no_zero_probability_id():
    # ten finite logits: top-k 20 must also keep ten ids of probability 0
    logits = np.full(1000, -np.inf, np.float32)
    logits[100:110] = np.linspace(0.0, 1.0, 10)
    assert next_token(logits, StubRng(0.0), temperature=1.0, top_k=20) == 100
    assert next_token(logits, StubRng(HIGHEST_UNIFORM), temperature=1.0, top_k=20) == 109


def test_top_k_draws_over_its_ids_in_id_order():
    # The draw depends only on which ids top-k keeps, not on the order argpartition (a NumPy detail) leaves them in:
    # u picks the id whose interval holds u in the CDF of the kept ids taken in id order, computed here in float64.
    logits = np.random.default_rng(16).standard_normal(5000).astype(np.float32)
    kept = np.sort(np.argsort(logits)[-40:])
    cdf = np.cumsum(np.exp((logits[kept].astype(np.float64) - logits.max()) / 0.7))
    cdf /= cdf[-1]
    for u in [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, HIGHEST_UNIFORM]:
        assert np.min(np.abs(cdf[:-1] - u)) > 1e-5  # far from inner bounds: float32 rounding cannot move the answer
        assert next_token(logits, StubRng(u), temperature=0.7, top_k=40) == kept[np.searchsorted(cdf, u, side="right")]


@pytest.mark.parametrize("n", [3, DRAW_BLOCK - 1, DRAW_BLOCK, DRAW_BLOCK + 1, 3 * DRAW_BLOCK + 5])
def test_draw_at_both_ends_of_the_uniform_range(n):
    # zero-probability ids first and last, around blocks of DRAW_BLOCK ids: u = 0 takes the first nonzero id, u
    # near 1 the last
    probs = np.zeros(n, np.float32)
    probs[1 : n - 1] = 1 / (n - 2)
    assert draw(probs, StubRng(0.0)) == 1
    assert draw(probs, StubRng(HIGHEST_UNIFORM)) == n - 2


def test_draw_frequencies_across_blocks():
    # probability on the first and last ids of blocks, and zeros in between: a block or an offset off by one moves
    # a whole 0.1 or more to an id that must never be drawn
    n = 4 * DRAW_BLOCK + 7
    expected = {0: 0.1, DRAW_BLOCK - 1: 0.2, DRAW_BLOCK: 0.25, 3 * DRAW_BLOCK + 1: 0.15, n - 1: 0.3}
    probs = np.zeros(n, np.float32)
    probs[list(expected)] = list(expected.values())
    rng = np.random.default_rng(10)
    assert_matches(np.bincount([draw(probs, rng) for _ in range(N_DRAWS)], minlength=n) / N_DRAWS, expected)


def test_nucleus_stops_where_the_mass_equals_top_p():
    # exactly representable probabilities: the cumulative mass equals top_p exactly, and that prefix is enough
    assert len(nucleus(np.array([0.5, 0.5], np.float32), 0.5)) == 1
    probs = np.array([0.125, 0.5, 0.25, 0.125], np.float32)
    assert nucleus(probs, 0.5).tolist() == [1]
    assert nucleus(probs, 0.75).tolist() == [1, 2]
    assert len(nucleus(probs, 0.875)) == 3


def test_keeping_every_token_draws_exactly_as_no_filter():
    logits = np.random.default_rng(11).standard_normal(50257).astype(np.float32) * 2

    def draws(seed, **options):  # -> 200 ids from one seed
        rng = np.random.default_rng(seed)
        return [next_token(logits, rng, temperature=0.9, **options) for _ in range(200)]

    for seed in [12, 13]:
        unfiltered = draws(seed)
        assert draws(seed, top_k=50257) == unfiltered
        assert draws(seed, top_k=10**9) == unfiltered
        assert draws(seed, top_p=1.0) == unfiltered
        assert draws(seed, top_k=50257, top_p=1.0) == unfiltered


def test_a_nucleus_holding_all_of_top_k_draws_as_top_k_alone():
    # scale 1: the 40 highest logits of 50257 lie within 1.7 of each other, so each of them has probability above
    # 0.005 among the 40, and top-p 0.999 must keep all 40
    logits = np.random.default_rng(14).standard_normal(50257).astype(np.float32)

    def draws(**options):  # -> 300 ids from one seed
        rng = np.random.default_rng(15)
        return [next_token(logits, rng, temperature=1.0, top_k=40, **options) for _ in range(300)]

    assert draws(top_p=0.999) == draws()


def test_greedy_limits_equal_argmax():
    rng = np.random.default_rng(5)
    for _ in range(50):
        logits = rng.standard_normal(512).astype(np.float32) * 3
        best = int(np.argmax(logits))
        assert next_token(logits) == best  # temperature 0 needs no generator
        assert next_token(logits, rng, temperature=1.0, top_k=1) == best
        assert next_token(logits, rng, temperature=1e-6) == best  # other logits are >= 1e-4 lower: exp(-100) at most
        assert next_token(logits, rng, temperature=1e-30) == best


def test_same_seed_same_ids():
    logits = np.random.default_rng(6).standard_normal(1000).astype(np.float32)

    def draws(seed):
        rng = np.random.default_rng(seed)
        return [next_token(logits, rng, temperature=1.0, top_k=50, top_p=0.9) for _ in range(30)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_float32_logits_stay_finite_without_warnings():
    logits = np.array([80.0, -80.0, 0.0], np.float32)
    with np.errstate(over="raise", divide="raise", invalid="raise"):  # underflow to 0 is the point
        for temperature in [1e-300, 1e-6, 1.0, 1e300]:
            assert next_token(logits, np.random.default_rng(0), temperature=temperature) in (0, 1, 2)


@pytest.mark.parametrize(
    "arguments, fragment",
    [
        ({"temperature": -0.1}, "temperature (--temperature) must be a number >= 0"),
        ({"temperature": float("nan")}, "temperature (--temperature) must be a number >= 0"),
        ({"temperature": float("inf")}, "temperature (--temperature) must be finite"),
        ({"temperature": "1"}, "temperature (--temperature) must be a number"),
        ({"top_k": 0}, "top_k (--top-k) must be a whole number >= 1"),
        ({"top_k": 2.5}, "top_k (--top-k) must be a whole number"),
        ({"top_p": 0.0}, "top_p (--top-p) must be a number in (0, 1]"),
        ({"top_p": 1.5}, "top_p (--top-p) must be a number in (0, 1]"),
        ({"seed": -1}, "seed (--seed) must be a whole number >= 0"),
        ({"seed": 1.5}, "seed (--seed) must be a whole number >= 0"),
        ({"seed": "a"}, "seed (--seed) must be a whole number >= 0"),
        ({"seed": True}, "seed (--seed) must be a whole number >= 0"),
        ({"seed": np.int64(-3)}, "seed (--seed) must be a whole number >= 0"),
        ({"seed": [1, 2]}, "seed (--seed) must be a whole number >= 0"),
    ],
)
def test_bad_arguments_raise_usage_error(arguments, fragment):
    with pytest.raises(UsageError, match=re.escape(fragment)):
        check_sampling_args(**arguments)
    if "seed" not in arguments:  # next_token takes a generator, not a seed
        with pytest.raises(UsageError):
            next_token(LOGITS, np.random.default_rng(0), **{"temperature": 1.0, **arguments})


@pytest.mark.parametrize("seed", [None, 0, 7, 2**70, np.int64(5), np.uint8(3)])
def test_good_seeds_pass(seed):
    check_sampling_args(1.0, seed=seed)


@pytest.mark.parametrize("seed", [-1, 1.5, "a", True])
def test_generate_refuses_a_bad_seed_with_usage_error(seed):
    # NumPy's own errors (ValueError, TypeError) would escape run_cli as a traceback
    hparams = {"n_vocab": 16, "n_ctx": 8, "n_embd": 8, "n_head": 2, "n_layer": 1}
    with pytest.raises(UsageError, match=re.escape("seed (--seed)")):
        generate([1, 2], random_params(hparams), hparams["n_head"], 1, seed=seed)


@pytest.mark.parametrize("logits, fragment", [
    (np.zeros((1, 8), np.float32), r"1-D float array \[n_vocab\].*got float32 shape \(1, 8\)"),  # a last_only row
    (np.zeros((3, 8), np.float32), "1-D float array"),  # every position's logits: argmax would pick a flat index
    (np.array([np.nan, 1, 2], np.float32), "no NaN or [+]inf"),  # NaN was drawn as the id past the vocabulary
    (np.array([1, np.inf], np.float32), "no NaN or [+]inf"),
    (np.full(5, -np.inf, np.float32), "at least one finite value"),
])
@pytest.mark.parametrize("options", [{}, {"temperature": 1.0}, {"temperature": 1.0, "top_k": 1},
                                     {"temperature": 1.0, "top_p": 0.5}])
def test_anything_but_one_position_s_scores_is_refused(logits, fragment, options):
    with pytest.raises(ValueError, match=fragment):
        next_token(logits, np.random.default_rng(0), **options)


def test_whole_number_scores_are_scores():  # greedy took them before the logits were checked
    assert next_token([1, 5, 2]) == 1
    assert next_token(np.array([0, 0, 9], np.int64), np.random.default_rng(0), temperature=0.1) == 2


def test_minus_infinity_bans_a_token():  # the usual way to forbid one: probability 0, never drawn
    logits = np.array([0.0, -np.inf, 0.0], np.float32)
    assert {next_token(logits, np.random.default_rng(seed), temperature=1.0) for seed in range(200)} == {0, 2}
    assert next_token(logits) == 0


def test_a_seed_given_as_rng_draws_as_a_generator_of_that_seed():
    assert [next_token(LOGITS, seed, temperature=1.0) for seed in range(30)] == [
        next_token(LOGITS, np.random.default_rng(seed), temperature=1.0) for seed in range(30)]
