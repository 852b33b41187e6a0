"""GPT-2's backward pass, read beside model.py: each training forward directly above its backward, as llm.c lays
them out.

A `*_forward` runs model.py's function and also returns what its backward needs, kept by name in a dict (named like
explain's trace: a block keeps {"x", "attn": {"x", "q", "k", "v", "weights", "heads"}, "mid", "mlp": {"x", "pre",
"hidden"}}). A `*_backward(d_out, kept, ...)` takes the gradient of the loss with respect to the forward's output and
returns the gradient with respect to its input, and its parameters' gradients as a dict named like the params.

The training forward is model.py's functions composed as `gpt2` composes them, except for two that run in the tuned
pass's form (fast.py, held equal to model.py by tests/test_fast.py): the attention scores and GELU, the two that cost
most in model.py's form. `loss_and_grads` runs both directions: the mean cross-entropy of next-token prediction and
its gradient for every param. Float32 throughout, as the forward; a leading batch axis works too ("..." in shapes).
"""
import math

import numpy as np

from gpt2_numpy import fast
from gpt2_numpy.model import causal_mask, layer_norm, linear, merge_heads, softmax, split_heads

GELU_C = math.sqrt(2 / math.pi)  # gelu(x) = ½x(1 + tanh(GELU_C (x + 0.044715x³)))


def rows(x):  # [..., n] -> [n_rows, n], a view
    # every position as one matrix's rows: NumPy runs a stacked [batch, n_seq, n] @ w as a matmul per batch row,
    # and a 2-D one as a single BLAS call, which keeps every core busy
    return x.reshape(-1, x.shape[-1])


def einsum(subscripts, a, b):  # np.einsum, every head at once
    # optimize=True: NumPy runs these as a batched matmul (BLAS), many times faster than einsum's own loop
    return np.einsum(subscripts, a, b, optimize=True)


# --- linear: y = x w + b ---


def linear_forward(x, w, b):  # model.linear -> [..., n_out]
    return linear(rows(x), w, b).reshape(*x.shape[:-1], -1)  # one BLAS call for every position: see rows()


def linear_backward(d_out, x, w):  # [..., n_out], [..., n_in], [n_in, n_out] -> [..., n_in], {"w", "b"}
    # y = x w + b: dx = dy wᵀ, dw = xᵀ dy and db = Σ dy, both summed over every position
    rows_x, rows_d = rows(x), rows(d_out)
    return (rows_d @ w.T).reshape(*x.shape), {"w": rows_x.T @ rows_d, "b": rows_d.sum(axis=0)}


# --- GELU (its forward is fast.gelu) ---


def gelu_backward(d_out, x):  # [...], [...] -> [...]
    # y = ½x(1 + tanh u), u = c(x + 0.044715x³): dy/dx = ½(1 + tanh u) + ½x(1 - tanh²u) c(1 + 3·0.044715x²).
    # The formula as one expression makes a fresh array per operation; in place, three arrays serve every step, which
    # runs in less than half the time on a step's [batch, n_seq, 4 n_embd] (the benchmark's training breakdown)
    x_sq = x * x
    tanh_u = 0.044715 * x_sq
    tanh_u += 1
    tanh_u *= x
    tanh_u *= GELU_C
    np.tanh(tanh_u, out=tanh_u)  # tanh u, u = c(x + 0.044715x³) written as cx(1 + 0.044715x²)
    sech_sq = np.subtract(1, tanh_u * tanh_u, dtype=x.dtype)  # 1 - tanh²u
    x_sq *= 3 * 0.044715
    x_sq += 1
    x_sq *= x
    x_sq *= 0.5 * GELU_C
    x_sq *= sech_sq  # ½x(1 - tanh²u) c(1 + 3·0.044715x²)
    tanh_u += 1
    tanh_u *= 0.5
    tanh_u += x_sq  # ½(1 + tanh u) + the line above: dy/dx
    tanh_u *= d_out
    return tanh_u


# --- layer norm (its forward is model.layer_norm) ---


def layer_norm_backward(d_out, x, g, b, eps=1e-5):  # [..., n], [..., n], [n], [n] -> [..., n], {"g", "b"}
    # y = g x̂ + b, x̂ = (x - μ)/σ: dx = (ĝ - mean(ĝ) - x̂ mean(ĝ x̂))/σ with ĝ = g dy; dg = Σ dy x̂, db = Σ dy
    x_hat = layer_norm(x, 1, 0, eps)  # x̂: model.py's formula with g = 1, b = 0
    inv_sigma = 1 / np.sqrt(np.var(x, axis=-1, keepdims=True) + eps)
    g_dy = g * d_out
    d_x = inv_sigma * (g_dy - g_dy.mean(axis=-1, keepdims=True) - x_hat * (g_dy * x_hat).mean(axis=-1, keepdims=True))
    return d_x, {"g": (rows(d_out) * rows(x_hat)).sum(axis=0), "b": rows(d_out).sum(axis=0)}


# --- softmax (its forward is model.softmax) ---


def softmax_backward(d_out, y):  # [..., n], [..., n] (the softmax's output) -> [..., n]
    # y = softmax(x): dx = y ⊙ (dy - Σ dy ⊙ y), the Jacobian diag(y) - y yᵀ applied to dy
    return y * (d_out - (d_out * y).sum(axis=-1, keepdims=True))


# --- attention: softmax(q kᵀ/√d + mask) v ---


def attention_forward(q, k, v, mask):  # model.attention -> [..., n_head, n_q, d_head], weights [..., n_head, n_q, n_k]
    # model.attention's two lines, keeping the weights for the backward (recomputing them there would cost another
    # q kᵀ and softmax per layer). Both einsums run as batched matmuls: the scores by the tuned pass's
    # attention_scores (held equal to model.attention_scores by tests/test_fast.py), the weighted sum by einsum();
    # model.py's plain einsum of the scores is the slowest part of a step on the 124M shape (scripts/benchmark.py)
    weights = softmax(fast.attention_scores(q, k) + mask)
    return einsum("...qk,...kd->...qd", weights, v), weights


def attention_backward(d_out, q, k, v, weights):  # [..., n_head, n_q, d_head], q, k, v, [..., n_head, n_q, n_k]
    # out = w v, w = softmax(q kᵀ/√d + mask): dv = wᵀ dout, dw = dout vᵀ, ds = softmax'(dw), dq = ds k/√d, dk = dsᵀ q/√d
    d_v = einsum("...qk,...qd->...kd", weights, d_out)
    d_scores = softmax_backward(einsum("...qd,...kd->...qk", d_out, v), weights) / math.sqrt(q.shape[-1])
    return einsum("...qk,...kd->...qd", d_scores, k), einsum("...qk,...qd->...kd", d_scores, q), d_v  # the mask: none


# --- multi-head attention: c_proj(merge(attention(split(c_attn(x))))) ---


def mha_forward(x, c_attn, c_proj, n_head):  # model.mha -> [..., n_seq, n_embd], kept
    q, k, v = (split_heads(a, n_head) for a in np.split(linear_forward(x, **c_attn), 3, axis=-1))
    out, weights = attention_forward(q, k, v, causal_mask(x.shape[-2]))
    heads = merge_heads(out)
    return linear_forward(heads, **c_proj), {"x": x, "q": q, "k": k, "v": v, "weights": weights, "heads": heads}


def mha_backward(d_out, kept, c_attn, c_proj, n_head):  # [..., n_seq, n_embd], mha_forward's kept -> dx, grads
    # the chain rule, from c_proj back to c_attn
    d_heads, g_proj = linear_backward(d_out, kept["heads"], c_proj["w"])
    # split_heads and merge_heads are each other's inverse, so each one's backward is the other
    d_q, d_k, d_v = attention_backward(split_heads(d_heads, n_head), kept["q"], kept["k"], kept["v"], kept["weights"])
    d_qkv = np.concatenate([merge_heads(d_q), merge_heads(d_k), merge_heads(d_v)], axis=-1)  # the backward of split
    d_x, g_attn = linear_backward(d_qkv, kept["x"], c_attn["w"])
    return d_x, {"c_attn": g_attn, "c_proj": g_proj}


# --- the feed-forward network: c_proj(gelu(c_fc(x))) ---


def ffn_forward(x, c_fc, c_proj):  # model.ffn -> [..., n_seq, n_embd], kept
    pre = linear_forward(x, **c_fc)
    hidden = fast.gelu(pre)  # the tuned pass's form (tests/test_fast.py): model.gelu is several times slower
    return linear_forward(hidden, **c_proj), {"x": x, "pre": pre, "hidden": hidden}


def ffn_backward(d_out, kept, c_fc, c_proj):  # [..., n_seq, n_embd], ffn_forward's kept -> dx, grads
    # the chain rule, from c_proj back to c_fc
    d_hidden, g_proj = linear_backward(d_out, kept["hidden"], c_proj["w"])
    d_x, g_fc = linear_backward(gelu_backward(d_hidden, kept["pre"]), kept["x"], c_fc["w"])
    return d_x, {"c_fc": g_fc, "c_proj": g_proj}


# --- a block: mid = x + mha(ln_1(x)), out = mid + ffn(ln_2(mid)) ---


def block_forward(x, ln_1, attn, ln_2, mlp, n_head):  # model.block -> [..., n_seq, n_embd], kept
    attn_out, attn_kept = mha_forward(layer_norm(x, **ln_1), **attn, n_head=n_head)
    mid = x + attn_out
    mlp_out, mlp_kept = ffn_forward(layer_norm(mid, **ln_2), **mlp)
    return mid + mlp_out, {"x": x, "attn": attn_kept, "mid": mid, "mlp": mlp_kept}


def block_backward(d_out, kept, ln_1, attn, ln_2, mlp, n_head):  # [..., n_seq, n_embd], block_forward's kept
    # each residual passes its gradient through unchanged, and adds it to its branch's
    d_ln_2, g_mlp = ffn_backward(d_out, kept["mlp"], **mlp)
    d_mid, g_ln_2 = layer_norm_backward(d_ln_2, kept["mid"], **ln_2)
    d_mid += d_out
    d_ln_1, g_attn = mha_backward(d_mid, kept["attn"], **attn, n_head=n_head)
    d_x, g_ln_1 = layer_norm_backward(d_ln_1, kept["x"], **ln_1)
    d_x += d_mid
    return d_x, {"ln_1": g_ln_1, "attn": g_attn, "ln_2": g_ln_2, "mlp": g_mlp}


# --- the embedding: x = wte[inputs] + wpe[positions] (its forward is model.gpt2's first line) ---


def embedding_backward(d_x, inputs, d_wte, n_ctx):  # [..., n_seq, n_embd], int [..., n_seq], [n_vocab, n_embd]
    # each row's gradient goes back to the rows it was read from, summed over repeats -> dwte, dwpe. wte is tied to
    # the output head: its share comes in as d_wte, and the embedding's is added to it
    np.add.at(d_wte, inputs.reshape(-1), rows(d_x))  # in place: a fresh [n_vocab, n_embd] would cost 150 MB and a pass
    d_wpe = np.zeros((n_ctx, d_x.shape[-1]), d_x.dtype)
    d_wpe[: d_x.shape[-2]] = d_x.reshape(-1, *d_x.shape[-2:]).sum(axis=0)
    return d_wte, d_wpe


# --- the output head: logits = x wteᵀ, and the loss ---


def lm_head_backward(d_logits, x, wte):  # [..., n_seq, n_vocab], [..., n_seq, n_embd], [n_vocab, n_embd]
    # logits = x wteᵀ: dx = dlogits wte, dwte = dlogitsᵀ x (the tied head's share of wte's gradient)
    rows_d = rows(d_logits)
    return (rows_d @ wte).reshape(*x.shape), rows_d.T @ rows(x)


def cross_entropy(logits, targets):  # [..., n_vocab] (overwritten), int [...] -> mean loss (float), dlogits
    # loss = mean(log Σ exp(logits) - logits[target]): dlogits = (softmax(logits) - onehot(target)) / n_positions
    # softmax written out in place, where model.softmax would make three [n_positions, n_vocab] temporaries (200 MB
    # each at 4 x 256 tokens of GPT-2's vocabulary) and a pass over each: the logits become the gradient
    logits -= logits.max(axis=-1, keepdims=True)  # the same softmax and loss, and exp cannot overflow
    target_rows = (np.arange(targets.size), targets.reshape(-1))
    target_logits = rows(logits)[target_rows]
    np.exp(logits, out=logits)
    z = logits.sum(axis=-1, keepdims=True)
    loss = float((np.log(z).reshape(-1) - target_logits).mean(dtype=np.float64))
    logits /= z * targets.size  # softmax / n_positions, in one pass
    rows(logits)[target_rows] -= 1 / targets.size
    return loss, logits


# --- the whole model ---


def loss_and_grads(inputs, targets, params, n_head):  # int [..., n_seq] x2 -> (mean cross-entropy, grads like params)
    """The mean next-token cross-entropy of `targets` given `inputs`, and its gradient for every parameter."""
    inputs, targets = np.asarray(inputs), np.asarray(targets)
    wte, wpe, ln_f = params["wte"], params["wpe"], params["ln_f"]
    x = wte[inputs] + wpe[np.arange(inputs.shape[-1])]  # as model.gpt2
    kept = []
    for block_params in params["blocks"]:
        x, block_kept = block_forward(x, **block_params, n_head=n_head)
        kept.append(block_kept)
    x_f = layer_norm(x, **ln_f)
    loss, d_logits = cross_entropy((rows(x_f) @ wte.T).reshape(*x.shape[:-1], -1), targets)

    d_x_f, d_wte_head = lm_head_backward(d_logits, x_f, wte)
    d_x, g_ln_f = layer_norm_backward(d_x_f, x, **ln_f)
    block_grads = []
    for block_params, block_kept in zip(reversed(params["blocks"]), reversed(kept)):
        d_x, block_grad = block_backward(d_x, block_kept, **block_params, n_head=n_head)
        block_grads.append(block_grad)
    d_wte, d_wpe = embedding_backward(d_x, inputs, d_wte_head, wpe.shape[0])  # the embedding's share + the head's
    return loss, {"wte": d_wte, "wpe": d_wpe, "blocks": block_grads[::-1], "ln_f": g_ln_f}
