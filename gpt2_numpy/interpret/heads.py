"""--heads: which heads did the model learn? Five scores per layer and head, each the mean attention weight a pattern
names, from the weights tracing.py computes with model.py's functions.

On the prompt's tokens, with w[i, j] the weight query i gives key j (each row sums to 1):
    previous_token   mean over queries i >= 1 of w[i, i-1]: the token just before (query 0 has none)
    first_token      mean over all queries of w[i, 0]: the first position, where a head with nothing to do rests
    self             mean over all queries of w[i, i]
On <|endoftext|> R R, a seeded random sequence R of L tokens fed twice, as TransformerLens scores heads; the queries
are the second copy, i = L+1 ... 2L:
    duplicate_token  mean of w[i, i-L]: the same token in the first copy
    induction        mean of w[i, i-L+1]: the token that followed it there, which an induction head predicts
A head that spreads its weight evenly scores what `uniform_weights` scores: the table prints that line for comparison.
"""
import numpy as np

from gpt2_numpy.errors import OutOfVocabulary
from gpt2_numpy.interpret.tracing import layer_weights, no_progress
from gpt2_numpy.checks import check_finite

PROMPT_PATTERNS = ("previous_token", "first_token", "self")
REPEAT_PATTERNS = ("duplicate_token", "induction")
PATTERNS = PROMPT_PATTERNS + REPEAT_PATTERNS
REPEAT_LENGTH = 50  # L, TransformerLens's choice; a context shorter than 2 L + 1 takes the longest L that fits


def head_scores(ids, repeated, params, n_head, progress=no_progress):  # -> {pattern: float [n_layer, n_head]}
    """The five scores (module docstring) of every head: the prompt's patterns on token ids `ids`, the repetition's on
    `repeated` (<|endoftext|> R R, see repeated_tokens). previous_token is NaN for a one-token prompt, which has no
    query i >= 1. progress(items, total) wraps the loop over the layers. NonFiniteError when a weight is NaN."""
    layers = zip(layer_weights(ids, params, n_head), layer_weights(repeated, params, n_head))
    return stacked([layer_scores(prompt, repeat) for prompt, repeat in progress(layers, len(params["blocks"]))])


def layer_scores(prompt, repeat):  # [n_head, n_seq, n_seq], [n_head, 2 L + 1, 2 L + 1] -> {pattern: [n_head]}
    """One layer's scores, from its weights on the prompt and on <|endoftext|> R R; NonFiniteError for NaN weights."""
    check_finite(prompt)  # a NaN weight would make its head's scores NaN: the model is refused instead
    check_finite(repeat)
    return {**prompt_scores(prompt), **repeat_scores(repeat, (repeat.shape[-1] - 1) // 2)}


def stacked(layers):  # [{pattern: [n_head]}] a layer each -> {pattern: [n_layer, n_head]}
    return {pattern: np.array([layer[pattern] for layer in layers]) for pattern in PATTERNS}


def prompt_scores(weights):  # [..., n_seq, n_seq] -> {pattern: [...]}, the prompt's three patterns
    queries = np.arange(weights.shape[-1])
    previous = (weights[..., queries[1:], queries[1:] - 1].mean(-1) if len(queries) > 1
                else np.full(weights.shape[:-2], np.nan))  # one query: no previous token to score
    return {"previous_token": previous, "first_token": weights[..., queries, 0].mean(-1),
            "self": weights[..., queries, queries].mean(-1)}


def repeat_scores(weights, length):  # [..., 2 L + 1, 2 L + 1] -> {pattern: [...]}, the repetition's two patterns
    queries = np.arange(length + 1, 2 * length + 1)  # the second copy of R
    return {"duplicate_token": weights[..., queries, queries - length].mean(-1),
            "induction": weights[..., queries, queries - length + 1].mean(-1)}


def uniform_weights(n_seq):  # -> [n_seq, n_seq]: every query spreads its weight evenly over the keys it may see
    return np.tril(np.ones((n_seq, n_seq))) / np.arange(1, n_seq + 1)[:, None]


def repeat_length(n_ctx):  # -> L: REPEAT_LENGTH, or the longest that fits when <|endoftext|> R R would not
    return min(REPEAT_LENGTH, (n_ctx - 1) // 2)


def repetition_problem(n_vocab, n_ctx, eot_id):  # -> why <|endoftext|> R R cannot be fed to this model, or None
    if not 0 <= eot_id < n_vocab:
        return (f"the repeated sequence starts with <|endoftext|> (id {eot_id}), which is outside this model's "
                f"vocabulary of {n_vocab} tokens: use a model whose vocabulary includes it")
    if repeat_length(n_ctx) < 1:
        return (f"<|endoftext|> and one token fed twice make 3 tokens, more than this model's context of {n_ctx}: use "
                "a model with a longer context")
    return None


def repeated_tokens(n_vocab, eot_id, length, seed):  # -> int64 [2 * length + 1]: <|endoftext|> R R
    """R: `length` ids drawn uniformly, with `seed`, from the model's vocabulary 0 .. n_vocab - 1 without eot_id (the
    tokenizer's <|endoftext|>, which starts the sequence). OutOfVocabulary when eot_id is outside the vocabulary."""
    if not 0 <= eot_id < n_vocab:
        raise OutOfVocabulary(repetition_problem(n_vocab, 2 * length + 1, eot_id))
    drawn = np.random.default_rng(seed).integers(0, n_vocab - 1, length)
    tokens = drawn + (drawn >= eot_id)  # n_vocab - 1 values mapped onto the ids other than eot_id
    return np.concatenate([[eot_id], tokens, tokens])
