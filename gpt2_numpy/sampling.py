"""Choosing the next token id from a logits vector.

Greedy (argmax) when temperature is 0, the default. Otherwise the logits are divided by the temperature, cut to the
top_k highest, then to the nucleus (the smallest set of most probable tokens whose probability reaches top_p), and one
id is drawn from what is left with a `numpy.random.Generator`, so a seed reproduces the same ids. The draw runs over the
kept ids in id order, so a filter that keeps every token (top_k >= n_vocab, top_p = 1) draws exactly what no filter
draws from the same seed.
"""
import math
import numbers

import numpy as np

from gpt2_numpy.errors import UsageError
from gpt2_numpy.fast import softmax

FLOAT32_TINY = float(np.finfo(np.float32).tiny)
NUCLEUS_START = 64  # first slice sorted when looking for the nucleus; it grows 8x until it holds enough probability
DRAW_BLOCK = 1024  # ids per block of the two-level draw: 50 blocks for GPT-2 (128 to 1024 draw about as fast)


def check_sampling_args(temperature=0.0, top_k=None, top_p=None, seed=None):  # -> None, or UsageError naming it
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not temperature >= 0:
        raise UsageError(f"temperature (--temperature) must be a number >= 0 (0: greedy), got {temperature!r}")
    if math.isinf(temperature):
        raise UsageError("temperature (--temperature) must be finite: use e.g. 100 for nearly uniform sampling")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise UsageError(f"top_k (--top-k) must be a whole number >= 1 (unset keeps every token), got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1):
        raise UsageError(f"top_p (--top-p) must be a number in (0, 1] (1 keeps every token), got {top_p!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
        raise UsageError(f"seed (--seed) must be a whole number >= 0 (unset: a fresh random seed), got {seed!r}")


def next_token(logits, rng=None, temperature=0.0, top_k=None, top_p=None):  # [n_vocab] -> int
    # rng: a numpy.random.Generator (anything with .random()), or the seed of a new one (None: a fresh random seed)
    check_sampling_args(temperature, top_k, top_p)
    logits = checked_logits(logits)
    if temperature == 0:
        return int(np.argmax(logits))
    # [n_kept] ids kept so far, in id order: the draw then depends on which ids are kept, not on the order argpartition
    # leaves them in. None while every id is kept, which spares a 400 kB arange per step.
    ids = None
    if top_k is not None and top_k < len(logits):
        ids = np.sort(np.argpartition(logits, -top_k)[-top_k:])  # argpartition: the k largest in O(n_vocab)
        logits = logits[ids]
    probs = temperature_softmax(logits, temperature)  # [n_kept]
    if top_p is not None and top_p < 1:
        keep = np.sort(nucleus(probs, top_p))  # [n_nucleus], in id order
        ids, probs = (keep if ids is None else ids[keep]), probs[keep]
    seeded = rng is None or isinstance(rng, numbers.Integral)
    index = draw(probs, np.random.default_rng(rng) if seeded else rng)
    return index if ids is None else int(ids[index])


def checked_logits(logits):  # -> logits as an array of one position's floats; ValueError for anything else
    logits = np.asarray(logits)
    if logits.dtype.kind in "iu":  # whole-number scores: greedy took them before sampling checked them
        logits = logits.astype(np.float32)
    if logits.ndim != 1 or logits.size == 0 or logits.dtype.kind != "f":
        raise ValueError(f"logits must be one position's scores, a 1-D float array [n_vocab] (a forward pass's last "
                         f"row: logits[-1]), got {logits.dtype} shape {logits.shape}")
    # -inf bans a token (probability 0); NaN, +inf or nothing but -inf would be drawn as an id past the vocabulary
    top = logits.max()
    if not -np.inf < top < np.inf:
        raise ValueError(f"logits must hold no NaN or +inf and at least one finite value, got a maximum of {top}")
    return logits


def top_indices(x, k):  # [n] -> [min(k, n)] indices of the largest values, largest first
    # argpartition finds the k largest in O(n); only those k are sorted, not the whole vocabulary
    part = np.argpartition(x, -k)[-k:] if k < len(x) else np.arange(len(x))
    return part[np.argsort(-x[part], kind="stable")]


def temperature_softmax(logits, temperature):  # [n] -> [n] probabilities
    # shift before dividing: the top logit becomes 0 and the others can only overflow towards -inf, where exp gives 0;
    # a temperature below float32's smallest normal number would round to 0 and make the top logit 0/0
    scaled = logits - logits.max()
    with np.errstate(over="ignore"):
        scaled /= max(temperature, FLOAT32_TINY)  # in place: one buffer of n_vocab floats fewer per step
    return softmax(scaled)


def nucleus(probs, top_p):  # [n] -> [m] indices, most probable first: the fewest whose probability reaches top_p
    # the nucleus is usually a few tokens out of 50257, so sort a growing top slice instead of everything
    threshold = top_p * np.sum(probs, dtype=np.float64)
    n_top = NUCLEUS_START
    while True:
        top = top_indices(probs, n_top)
        mass = np.cumsum(probs[top], dtype=np.float64)  # [len(top)]; float32 would misplace a flat nucleus's edge
        if mass[-1] >= threshold or len(top) == len(probs):
            n_keep = np.searchsorted(mass, threshold) + 1  # first prefix whose mass reaches the threshold
            return top[: min(n_keep, len(top))]  # (rounding may leave all of them just short of it)
        n_top *= 8


def draw(probs, rng):  # [n] -> index i, chosen with probability probs[i] / sum(probs); never one of probability 0
    # cumsum is sequential and slow (~4 ns an entry): pick a block of DRAW_BLOCK entries by its sum, then an entry in
    # it, so the cumsums cover ~50 block sums and one block instead of all 50257 entries
    if len(probs) <= DRAW_BLOCK:
        return inverse_cdf(probs, rng.random())
    block_sums = np.add.reduceat(probs, np.arange(0, len(probs), DRAW_BLOCK))  # [n_blocks]
    start = inverse_cdf(block_sums, rng.random()) * DRAW_BLOCK
    return start + inverse_cdf(probs[start : start + DRAW_BLOCK], rng.random())


def inverse_cdf(weights, u):  # [n], u in [0, 1) -> the index whose interval of the CDF holds u * sum(weights)
    # far cheaper than rng.choice(p=...), which re-validates every probability on each step.
    # float64: u * total stays below the total for every u < 1, where a float32 total would round it up to the total
    # about 3e-8 of the time; side="right": a zero weight adds nothing to the CDF, so no u * total can land on it
    cdf = np.cumsum(weights, dtype=np.float64)
    return int(np.searchsorted(cdf, u * cdf[-1], side="right"))
