"""Scoring text: the log-probability GPT-2 gives each token after the ones before it, and the loss, perplexity and
bits per byte they add up to; texts longer than the context go through overlapping windows. The command line that
prints them is gpt2_numpy/commands/score.py.

    log_probs = token_log_probs(text_ids(tokenizer, "The quick brown fox", hparams["n_vocab"], bos=True), params, 12)
"""
import math

import numpy as np

from gpt2_numpy.errors import NonFiniteError, UsageError
from gpt2_numpy.checks import check_inputs
from gpt2_numpy.fast import lm_head, log_softmax_at, transformer
from gpt2_numpy.tokenizer import EOT, checked_ids


def token_log_probs(inputs, params, n_head, *, stride=None):  # int [n] -> float64 [n - 1]
    """ln p(inputs[t] | the tokens before t in its window) for t = 1 .. n-1, in nats.

    Up to n_ctx tokens are scored in one forward pass. A longer sequence goes through windows of n_ctx tokens that
    start every `stride` tokens (default n_ctx // 2), each scoring only the tokens no earlier window scored (see
    score_windows): every token is scored once, with at least n_ctx - stride tokens of context once the sequence is
    that long. This is the method of Hugging Face's guide "Perplexity of fixed-length models". ValueError for token
    ids outside the vocabulary; UsageError for fewer than 2 ids or a stride outside 1 .. n_ctx - 1."""
    return np.concatenate(list(iter_log_probs(inputs, params, n_head, stride=stride)))


def iter_log_probs(inputs, params, n_head, *, stride=None):  # -> iterator of float64 [n_scored], one per window
    """token_log_probs window by window (for progress reports), in order. Every argument and every token id is checked
    here, before the first window runs."""
    ids = np.asarray(inputs)
    if ids.ndim != 1:
        raise ValueError(f"inputs must be a 1-D sequence of token ids, got shape {ids.shape}")
    if len(ids) < 2:
        raise UsageError(f"scoring needs at least 2 tokens, got {len(ids)}: the first token is only context")
    n_vocab, n_ctx = params["wte"].shape[0], params["wpe"].shape[0]
    windows = score_windows(len(ids), n_ctx, stride)
    windows = [(check_inputs(ids[begin:end], n_vocab, n_ctx), first - begin) for begin, first, end in windows]
    return (window_log_probs(window, n_context, params, n_head) for window, n_context in windows)


def score_windows(n, n_ctx, stride=None):  # -> [(begin, first, end)]: window [begin, end) scores tokens first .. end-1
    """The windows that score n >= 2 tokens with a context of n_ctx: starting at 0, stride, 2 * stride, ..., each n_ctx
    tokens long (or up to n), each scoring from where the previous one ended (token 1 for the first), up to its own
    end; the last is the first one that reaches n. A token scored at t then has t - begin tokens of context."""
    stride = check_stride(n_ctx // 2 if stride is None else stride, n_ctx)
    windows, begin, scored_up_to = [], 0, 1  # token 0 has no context and is never scored
    while scored_up_to < n:
        end = min(begin + n_ctx, n)
        windows.append((begin, scored_up_to, end))
        begin, scored_up_to = begin + stride, end
    return windows


def check_stride(stride, n_ctx):  # -> stride, or UsageError unless it is a whole number in 1 .. n_ctx - 1
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or not 1 <= stride < n_ctx:
        why = ("the first token a window scores needs the token before it in the same window; with a stride of "
               "n_ctx that token would have no context, and Hugging Face's guide silently skips it"
               if stride == n_ctx else "each window must overlap the one before by at least one token")
        raise UsageError(f"the stride must be a whole number from 1 to {n_ctx - 1} (n_ctx - 1), got {stride!r}: {why}")
    return int(stride)


def window_log_probs(window, n_context, params, n_head):  # int [n_window] -> float64 [n_window - n_context]
    # the hidden state at position t predicts token t + 1: so the window's last token, only a target, never goes in,
    # and the lm head (nearly a third of the work at 124M) runs only on the positions that predict a scored token
    x = transformer(window[:-1], **params, n_head=n_head)  # [n_window - 1, n_embd]
    log_probs = log_softmax_at(lm_head(x[n_context - 1 :], params["wte"]), window[n_context:])
    if not np.isfinite(log_probs).all():  # NaN or inf anywhere in a row of logits makes its log-probability NaN
        raise NonFiniteError
    return log_probs


def summary(log_probs, n_bytes):  # float [n] -> {n_tokens, nll, perplexity, bits_per_byte, n_bytes}
    """The scores of a text from its tokens' log-probabilities (nats) and the UTF-8 bytes those tokens spell: the mean
    negative log-likelihood per token (nats), the perplexity e^nll, and bits per byte (total NLL / ln 2 / bytes)."""
    total = -math.fsum(log_probs)
    nll = total / len(log_probs)
    return {"n_tokens": len(log_probs), "nll": nll, "perplexity": perplexity(nll),
            "bits_per_byte": total / math.log(2) / n_bytes, "n_bytes": n_bytes}


def scored_bytes(tokenizer, ids):  # -> the UTF-8 bytes the scored tokens spell: every id's but the first, only context
    return sum(len(tokenizer.token_bytes(token_id)) for token_id in ids[1:])


def perplexity(nll):  # -> e^nll; inf where that exceeds the largest double (nll above 709.78 nats)
    try:
        return math.exp(nll)
    except OverflowError:  # math.exp raises where np.exp would return inf
        return math.inf


def text_ids(tokenizer, text, n_vocab, bos):  # -> ids to score, all < n_vocab: [<|endoftext|>, *text's ids] with bos
    ids = checked_ids(tokenizer, text, n_vocab, "the text", "use a model with GPT-2's full vocabulary, or a text of "
                      "other words")
    if len(ids) + bos < 2:
        what = "the text is empty" if not text else f"the text is a single token ({text!r}) and --no-bos leaves " \
            "nothing before it"
        raise UsageError(f"{what}: scoring needs a token to predict after some context; give a longer text"
                         + ("" if bos else f", or drop --no-bos to predict the first token after {EOT}"))
    if bos and tokenizer.eot_id >= n_vocab:
        raise UsageError(f"this model's vocabulary of {n_vocab} tokens has no {EOT} (id {tokenizer.eot_id}) to put "
                         "before the text: pass --no-bos to score the text from its second token")
    return [tokenizer.eot_id] * bos + ids
