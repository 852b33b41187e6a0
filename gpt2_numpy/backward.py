"""GPT-2's backward pass as the textbooks write it: for each function of model.py, the gradient of the loss with respect
to its inputs and its params, given the gradient with respect to its output (d_out), one formula per line.

This is the file to read beside model.py. Training runs fast_backward.py, which computes the same gradients in the forms
that make a step quick (a chunk at a time in cache, in place, from what the forward kept), composes them by the chain
rule through the blocks, checked against torch autograd; tests/unit/test_backward.py holds the two equal. A leading
batch axis works too ("..." in shapes): a param's gradient sums over every position.
"""
import math

import numpy as np

from gpt2_numpy.model import attention_scores, softmax

GELU_C = math.sqrt(2 / math.pi)  # gelu(x) = ½x(1 + tanh u), u = GELU_C (x + 0.044715x³), as model.gelu


def sum_positions(x):  # [..., n] -> [n]
    return x.reshape(-1, x.shape[-1]).sum(axis=0)  # a param is used at every position: its gradients add up


def summed_outer(a, b):  # [..., m], [..., n] -> [m, n]
    return a.reshape(-1, a.shape[-1]).T @ b.reshape(-1, b.shape[-1])  # Σ aᵀ b over every position


def one_hot(ids, n):  # int [...] -> [..., n]
    return (np.asarray(ids)[..., None] == np.arange(n)).astype(np.float32)


def linear_input_backward(d_out, w):  # [..., n_out], [n_in, n_out] -> [..., n_in]
    return d_out @ w.T  # y = x w + b; the gradient with respect to x alone (interpret/gradients.py's)


def linear_backward(d_out, x, w):  # [..., n_out], [..., n_in], [n_in, n_out] -> [..., n_in], {"w", "b"}
    d_x = linear_input_backward(d_out, w)
    d_w = summed_outer(x, d_out)
    return d_x, {"w": d_w, "b": sum_positions(d_out)}


def gelu_backward(d_out, x):  # [...], gelu's input [...] -> [...]
    tanh_u = np.tanh(GELU_C * (x + 0.044715 * x**3))
    du_dx = GELU_C * (1 + 3 * 0.044715 * x**2)
    return d_out * (0.5 * (1 + tanh_u) + 0.5 * x * (1 - tanh_u**2) * du_dx)  # the product rule; tanh' = 1 - tanh²


def layer_norm_backward(d_out, x, g, eps=1e-5):  # [..., n], layer_norm's input [..., n], [n] -> [..., n], {"g", "b"}
    sigma = np.sqrt(np.var(x, axis=-1, keepdims=True) + eps)
    x_hat = (x - np.mean(x, axis=-1, keepdims=True)) / sigma  # y = g x̂ + b
    d_x_hat = g * d_out
    d_x = (d_x_hat - np.mean(d_x_hat, axis=-1, keepdims=True)
           - x_hat * np.mean(d_x_hat * x_hat, axis=-1, keepdims=True)) / sigma  # x̂ depends on x through μ and σ too
    return d_x, {"g": sum_positions(d_out * x_hat), "b": sum_positions(d_out)}


def softmax_backward(d_out, y):  # [..., n], softmax's output [..., n] -> [..., n]
    return y * (d_out - np.sum(d_out * y, axis=-1, keepdims=True))  # the Jacobian diag(y) - y yᵀ applied to dy


def weighted_sum_backward(d_out, weights, v):  # [..., n_head, n_q, d_head], weights, v -> d_weights, d_v
    return d_out @ np.swapaxes(v, -1, -2), np.swapaxes(weights, -1, -2) @ d_out  # out = weights v


def attention_scores_backward(d_scores, q, k):  # [..., n_head, n_q, n_k], q, k -> d_q, d_k
    d_q = d_scores @ k / math.sqrt(q.shape[-1])  # scores = q kᵀ / √d_head
    d_k = np.swapaxes(d_scores, -1, -2) @ q / math.sqrt(q.shape[-1])
    return d_q, d_k


def attention_backward(d_out, q, k, v, mask):  # [..., n_head, n_q, d_head], q, k, v, [n_q, n_k] -> dq, dk, dv
    weights = softmax(attention_scores(q, k) + mask)  # model.attention's, again: [..., n_head, n_q, n_k]
    d_weights, d_v = weighted_sum_backward(d_out, weights, v)
    d_scores = softmax_backward(d_weights, weights)  # the mask is a constant: no gradient
    return (*attention_scores_backward(d_scores, q, k), d_v)


def lm_head_backward(d_logits, x, wte):  # [..., n_seq, n_vocab], [..., n_seq, n_embd], [n_vocab, n_embd] -> dx, dwte
    return d_logits @ wte, summed_outer(d_logits, x)  # logits = x wteᵀ; dwte is the output head's share


def embedding_backward(d_x, inputs, n_vocab, n_ctx):  # [..., n_seq, n_embd], int [..., n_seq] -> dwte, dwpe
    positions = np.broadcast_to(np.arange(inputs.shape[-1]), inputs.shape)  # x = wte[inputs] + wpe[positions]
    d_wte = summed_outer(one_hot(inputs, n_vocab), d_x)  # each position's gradient back to the row it read
    d_wpe = summed_outer(one_hot(positions, n_ctx), d_x)
    return d_wte, d_wpe


def cross_entropy(logits, targets):  # [..., n_vocab], int [...] -> mean loss (float), dlogits [..., n_vocab]
    probs = softmax(logits)
    targets_one_hot = one_hot(targets, logits.shape[-1])
    loss = -np.mean(np.log(np.sum(probs * targets_one_hot, axis=-1)))  # -log p(next token), averaged over positions
    return float(loss), (probs - targets_one_hot) / targets_one_hot[..., 0].size  # dloss/dlogits
