"""GPT-2 as the blogs and the paper write it: one small NumPy function per formula, float32 throughout.

This is the file to read. fast.py computes the same math with the tricks that make it quick (a KV cache, batches
of ragged prompts, query blocks), and tests hold the two equal. Params are nested dicts named like OpenAI's checkpoint
(README), splatted into the functions with **. A leading batch axis works too: the shapes' "..." below. generate, at
the end, is picoGPT's greedy loop: the first thing to run.
"""
import math

import numpy as np


def gelu(x):  # [...] -> [...]
    # GPT-2's tanh approximation of the Gaussian error linear unit x Φ(x); math.sqrt gives a Python float, where
    # np.sqrt(2 / np.pi) would be a float64 scalar that promotes every float32 array it touches
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def softmax(x):  # [..., n] -> [..., n]
    exp_x = np.exp(x - np.max(x, axis=-1, keepdims=True))  # minus the max: the same result, and exp cannot overflow
    return exp_x / np.sum(exp_x, axis=-1, keepdims=True)


def layer_norm(x, g, b, eps=1e-5):  # [..., n_embd] -> [..., n_embd]
    mean = np.mean(x, axis=-1, keepdims=True)
    variance = np.var(x, axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(variance + eps) + b  # each position normalized to mean 0, variance 1, then scaled


def linear(x, w, b):  # [..., n_in] -> [..., n_out]
    return x @ w + b  # w is stored [n_in, n_out]: OpenAI's Conv1D layout


def ffn(x, c_fc, c_proj):  # [..., n_seq, n_embd] -> [..., n_seq, n_embd]
    return linear(gelu(linear(x, **c_fc)), **c_proj)  # widened to [..., n_seq, 4*n_embd] in between


def causal_mask(n_seq):  # -> [n_seq, n_seq]
    return np.triu(np.full((n_seq, n_seq), -np.inf, dtype=np.float32), k=1)  # -inf above the diagonal: no peeking


def attention_scores(q, k):  # [..., n_head, n_q, d_head], [..., n_head, n_k, d_head] -> [..., n_head, n_q, n_k]
    return np.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])  # q kᵀ / √d_head, every head at once


def attention(q, k, v, mask):  # [..., n_head, n_q, d_head], [..., n_head, n_k, d_head] x2, [n_q, n_k] -> like q
    weights = softmax(attention_scores(q, k) + mask)  # [..., n_head, n_q, n_k]: each row sums to 1
    return weighted_sum(weights, v)


def weighted_sum(weights, v):  # [..., n_head, n_q, n_k], [..., n_head, n_k, d_head] -> [..., n_head, n_q, d_head]
    return np.einsum("...qk,...kd->...qd", weights, v)  # each query's weighted sum of the values, every head at once


def split_heads(x, n_head):  # [..., n_seq, n_embd] -> [..., n_head, n_seq, d_head]
    return np.swapaxes(x.reshape(*x.shape[:-1], n_head, -1), -3, -2)


def merge_heads(x):  # [..., n_head, n_seq, d_head] -> [..., n_seq, n_head*d_head]
    x = np.swapaxes(x, -3, -2)
    return x.reshape(*x.shape[:-2], -1)


def mha(x, c_attn, c_proj, n_head):  # [..., n_seq, n_embd] -> [..., n_seq, n_embd]
    qkv = np.split(linear(x, **c_attn), 3, axis=-1)  # q, k, v: [..., n_seq, n_embd] each
    q, k, v = (split_heads(part, n_head) for part in qkv)  # [..., n_head, n_seq, d_head] each
    heads = attention(q, k, v, causal_mask(x.shape[-2]))  # [..., n_head, n_seq, d_head]
    return linear(merge_heads(heads), **c_proj)


def block(x, ln_1, attn, ln_2, mlp, n_head):  # [..., n_seq, n_embd] -> [..., n_seq, n_embd]
    x = x + mha(layer_norm(x, **ln_1), **attn, n_head=n_head)  # pre-norm residual branches
    return x + ffn(layer_norm(x, **ln_2), **mlp)


def gpt2(inputs, wte, wpe, blocks, ln_f, n_head):  # [..., n_seq] -> [..., n_seq, n_vocab]
    inputs = np.asarray(inputs)
    x = wte[inputs] + wpe[np.arange(inputs.shape[-1])]  # token + position embeddings
    for block_params in blocks:
        x = block(x, **block_params, n_head=n_head)
    return layer_norm(x, **ln_f) @ wte.T  # GPT-2 ties the output projection to the token embeddings


def generate(inputs, params, n_head, n_tokens_to_generate):  # [n_seq] ids -> [n_tokens_to_generate] new ids
    ids = list(inputs)
    for _ in range(n_tokens_to_generate):  # the whole sequence again for each new token: no cache (fast.py has one)
        logits = gpt2(ids, **params, n_head=n_head)  # [len(ids), n_vocab]
        ids.append(int(np.argmax(logits[-1])))  # greedy: the likeliest next token, fed back as input
    return ids[len(inputs) :]  # only the new ids
