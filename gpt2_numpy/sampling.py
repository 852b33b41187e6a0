"""Choosing the next token id from a logits vector.

Greedy (argmax) when temperature is 0, the default. Otherwise the logits are divided by the temperature, cut to the
top_k highest, then to the nucleus (the smallest set of most probable tokens whose probability reaches top_p), and one
id is drawn from what is left with a `numpy.random.Generator`, so a seed reproduces the same ids.
"""
import math
import numbers

import numpy as np

from gpt2_numpy.errors import UsageError
from gpt2_numpy.model import softmax

FLOAT32_TINY = float(np.finfo(np.float32).tiny)
NUCLEUS_START = 64  # first slice sorted when looking for the nucleus; it grows 8x until it holds enough probability


def check_sampling_args(temperature=0.0, top_k=None, top_p=None):  # -> None, or UsageError naming the bad argument
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not temperature >= 0:
        raise UsageError(f"temperature (--temperature) must be a number >= 0 (0: greedy), got {temperature!r}")
    if math.isinf(temperature):
        raise UsageError("temperature (--temperature) must be finite: use e.g. 100 for nearly uniform sampling")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise UsageError(f"top_k (--top-k) must be a whole number >= 1 (unset keeps every token), got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1):
        raise UsageError(f"top_p (--top-p) must be a number in (0, 1] (1 keeps every token), got {top_p!r}")


def next_token(logits, rng=None, temperature=0.0, top_k=None, top_p=None):  # [n_vocab] -> int
    check_sampling_args(temperature, top_k, top_p)
    if temperature == 0:
        return int(np.argmax(logits))
    ids = top_indices(logits, top_k) if top_k is not None else np.arange(len(logits))  # [n_kept]
    probs = temperature_softmax(logits[ids], temperature)  # [n_kept]
    if top_p is not None and top_p < 1:
        keep = nucleus(probs, top_p)  # [n_nucleus]
        ids, probs = ids[keep], probs[keep]
    return int(ids[draw(probs, rng if rng is not None else np.random.default_rng())])


def top_indices(x, k):  # [n] -> [min(k, n)] indices of the largest values, largest first
    # argpartition finds the k largest in O(n); only those k are sorted, not the whole vocabulary
    part = np.argpartition(x, -k)[-k:] if k < len(x) else np.arange(len(x))
    return part[np.argsort(-x[part], kind="stable")]


def temperature_softmax(logits, temperature):  # [n] -> [n] probabilities
    # shift before dividing: the top logit becomes 0 and the others can only overflow towards -inf, where exp gives 0;
    # a temperature below float32's smallest normal number would round to 0 and make the top logit 0/0
    with np.errstate(over="ignore"):
        return softmax((logits - np.max(logits)) / max(temperature, FLOAT32_TINY))


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


def draw(probs, rng):  # [n] -> index, chosen with probability probs[i] / sum(probs)
    # inverse CDF: far cheaper than rng.choice(p=...), which re-validates 50257 probabilities every step
    # float32: each entry's share of the CDF is off by at most half an ulp of the running total (<= 6e-8), negligible
    # for sampling, and 3x faster here than a float64 CDF of 50257 entries
    cdf = np.cumsum(probs)
    # side="right": a zero-probability entry adds nothing to the CDF, so no u in [0, total) can land on it;
    # min: u * total may round up to the total itself
    return min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(probs) - 1)
