"""The GPT-2 forward pass: small NumPy functions, float32 throughout, no I/O.

Params are nested dicts named like OpenAI's checkpoint (see README), splatted into the functions with `**`.
"""
import math
from dataclasses import dataclass

import numpy as np

GELU_SCALE = math.sqrt(2 / math.pi)  # a Python float: NumPy 2 would promote float32 * np.float64 to float64
SCORES_PATH = ["einsum_path", (0, 1)]  # precomputed contraction: BLAS-backed, and no path search on every call
PREFILL_CHUNK = 256  # tokens per step of a long prompt through the KV cache: 1024 tokens in 2.5 s instead of 3.2 s


def gelu(x):  # [...] -> [...]
    # GPT-2's tanh approximation of x * Phi(x); x * x * x because NumPy's float32 x**3 is about 10x slower
    return 0.5 * x * (1 + np.tanh(GELU_SCALE * (x + 0.044715 * x * x * x)))


def softmax(x):  # [..., n] -> [..., n]
    exp_x = x - np.max(x, axis=-1, keepdims=True)  # shifting by the max cannot overflow exp
    np.exp(exp_x, out=exp_x)  # in place here and below: attention's scores [n_head, n_seq, n_seq] are large
    exp_x /= np.sum(exp_x, axis=-1, keepdims=True)
    return exp_x


def layer_norm(x, g, b, eps=1e-5):  # [n_seq, n_embd] -> [n_seq, n_embd]
    centered = x - x.mean(axis=-1, keepdims=True)
    variance = (centered * centered).mean(axis=-1, keepdims=True)  # reuses `centered`, unlike np.var
    return g * centered / np.sqrt(variance + eps) + b


def linear(x, w, b):  # [n_seq, n_in] -> [n_seq, n_out]
    return x @ w + b


def ffn(x, c_fc, c_proj):  # [n_seq, n_embd] -> [n_seq, n_embd]
    return linear(gelu(linear(x, **c_fc)), **c_proj)  # [n_seq, 4*n_embd] in between


def causal_mask(n_q, n_k):  # -> [n_q, n_k]
    # query i is position n_k - n_q + i (earlier positions may come from the KV cache); it must not see later keys
    return np.triu(np.full((n_q, n_k), -np.inf, dtype=np.float32), k=n_k - n_q + 1)


def attention(q, k, v, mask):  # [n_head, n_q, d_head], [n_head, n_k, d_head] x2, [n_q, n_k] -> [n_head, n_q, d_head]
    # softmax(q k^T / sqrt(d_head) + mask) v, for all heads in one batched contraction; with k (or v) as the first
    # operand NumPy lays the result out C-ordered, which the softmax over the last axis needs to be fast
    scores = np.einsum("hkd,hqd->hqk", k, q / math.sqrt(q.shape[-1]), optimize=SCORES_PATH)
    scores += mask  # in place: no second [n_head, n_q, n_k] array
    return np.einsum("hkd,hqk->hqd", v, softmax(scores), optimize=SCORES_PATH)


def split_heads(x, n_head):  # [n_seq, 3*n_embd] -> [3, n_head, n_seq, d_head]: q, k, v, each split into heads
    n_seq = x.shape[0]
    return x.reshape(n_seq, 3, n_head, -1).transpose(1, 2, 0, 3)


def merge_heads(x):  # [n_head, n_seq, d_head] -> [n_seq, n_head*d_head]
    n_head, n_seq, d_head = x.shape
    return x.transpose(1, 0, 2).reshape(n_seq, n_head * d_head)


def mha(x, c_attn, c_proj, n_head, past=None):  # [n_seq, n_embd] -> [n_seq, n_embd]
    q, k, v = split_heads(linear(x, **c_attn), n_head)  # [n_head, n_seq, d_head] each
    if past is not None:
        k, v = extend_past(past, k, v)  # [n_head, n_past+n_seq, d_head]
    return linear(merge_heads(attention(q, k, v, causal_mask(q.shape[1], k.shape[1]))), **c_proj)


def block(x, ln_1, attn, ln_2, mlp, n_head, past=None):  # [n_seq, n_embd] -> [n_seq, n_embd]
    x = x + mha(layer_norm(x, **ln_1), **attn, n_head=n_head, past=past)  # pre-norm residual branches
    return x + ffn(layer_norm(x, **ln_2), **mlp)


def embed(inputs, wte, wpe, n_past=0):  # [n_seq] -> [n_seq, n_embd]
    ids = check_inputs(inputs, n_vocab=wte.shape[0], n_ctx=wpe.shape[0], n_past=n_past)
    return wte[ids] + wpe[n_past : n_past + len(ids)]


def transformer(inputs, wte, wpe, blocks, ln_f, n_head, cache=None):  # [n_seq] -> [n_seq, n_embd]
    n_past = 0 if cache is None else cache.n_past
    x = embed(inputs, wte, wpe, n_past)
    for layer, block_params in enumerate(blocks):
        past = None if cache is None else (cache.keys[layer], cache.values[layer], n_past)
        x = block(x, **block_params, n_head=n_head, past=past)
    if cache is not None:
        cache.n_past += len(x)
    return layer_norm(x, **ln_f)


def lm_head(x, wte):  # [n_seq, n_embd] -> [n_seq, n_vocab]
    return x @ wte.T  # GPT-2 ties the output projection to the token embeddings


def gpt2(inputs, wte, wpe, blocks, ln_f, n_head):  # [n_seq] -> [n_seq, n_vocab]
    return lm_head(transformer(inputs, wte, wpe, blocks, ln_f, n_head), wte)


# --- Incremental decoding: the same blocks, with the keys and values of earlier positions kept ---


@dataclass
class KVCache:
    keys: np.ndarray  # [n_layer, n_head, n_ctx, d_head], valid up to n_past
    values: np.ndarray  # [n_layer, n_head, n_ctx, d_head], valid up to n_past
    n_past: int = 0


def new_cache(wpe, blocks, n_head):  # -> KVCache sized for the model's whole context
    # preallocated once, so each step writes in place instead of concatenating (which copies the cache every token)
    n_ctx, n_embd = wpe.shape
    shape = (len(blocks), n_head, n_ctx, n_embd // n_head)
    return KVCache(np.zeros(shape, np.float32), np.zeros(shape, np.float32))


def extend_past(past, k, v):  # [n_head, n_seq, d_head] x2 -> [n_head, n_past+n_seq, d_head] x2
    k_cache, v_cache, n_past = past
    n_total = n_past + k.shape[1]
    k_cache[:, n_past:n_total], v_cache[:, n_past:n_total] = k, v
    return k_cache[:, :n_total], v_cache[:, :n_total]


def gpt2_cached(inputs, cache, wte, wpe, blocks, ln_f, n_head, last_only=False):  # [n_new] -> [n_new or 1, n_vocab]
    # runs only the new tokens; the cache supplies (and then stores) the keys and values of all earlier positions
    ids = check_inputs(inputs, n_vocab=wte.shape[0], n_ctx=wpe.shape[0], n_past=cache.n_past)  # before any change
    # a long prompt goes in chunks: each chunk's queries skip the keys after it (which the mask would zero anyway)
    # and its [n_head, chunk, n_k] scores stay cache-sized
    chunks = [ids[start : start + PREFILL_CHUNK] for start in range(0, len(ids), PREFILL_CHUNK)]
    x = np.concatenate([transformer(chunk, wte, wpe, blocks, ln_f, n_head, cache) for chunk in chunks])
    return lm_head(x[-1:] if last_only else x, wte), cache  # sampling needs only the last row: skip the rest


def check_inputs(inputs, n_vocab, n_ctx, n_past=0):  # [n_seq] -> int64 [n_seq]
    # NumPy would wrap negative ids silently (and wpe would run short past n_ctx), so both are refused here, by name
    ids = np.asarray(inputs)
    if ids.ndim != 1 or len(ids) == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"inputs must be a non-empty 1-D sequence of integer token ids, got {ids.dtype} shape {ids.shape}"
        )
    bad = ids[(ids < 0) | (ids >= n_vocab)]
    if len(bad):
        raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {n_vocab})")
    if n_past + len(ids) > n_ctx:
        raise ValueError(f"{n_past + len(ids)} positions exceed the model's context of n_ctx={n_ctx} tokens")
    return ids.astype(np.int64, copy=False)
