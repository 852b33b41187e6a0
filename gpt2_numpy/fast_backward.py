"""GPT-2's backward pass as training runs it: each training forward directly above its backward, as llm.c lays them
out. backward.py states each backward as its plain formula; tests/unit/test_backward.py holds the two equal, and
tests/unit/test_fast_backward.py this file against torch autograd.

A `*_forward` runs model.py's function and also returns what its backward needs, kept by name in a dict (named like
explain's trace: a block keeps {"ln_1": {"x_hat", "inv_sigma"}, "attn": {"x", "q", "k", "v", "weights", "heads"},
"ln_2": {...}, "mlp": {"x", "pre", "hidden"}}). A `*_backward(d_out, kept, ...)` takes the gradient of the loss with
respect to the forward's output and returns the gradient with respect to its input, and its parameters' gradients as a
dict named like the params. A function whose contract differs from backward.py's is named for the difference:
`*_kept` takes its forward's kept values (backward.py's takes the forward's input), `*_in_place` overwrites its
first argument, `lm_head_backward_scaled` takes the loss's gradient as cross_entropy_in_place leaves it (an array
and a scale a row), and `embedding_backward_into` adds the embedding's gradient into the lm head's.

The training forward is model.py's functions composed as `gpt2` composes them, except where model.py's form costs
most: the attention scores, the attention's softmax and GELU run in the tuned pass's form (fast.py, held equal to
model.py by tests/unit/test_fast.py), and layer norm in two steps keeping x̂. `loss_and_grads` runs both directions: the
mean cross-entropy of next-token prediction and its gradient for every param. Float32 throughout, as the forward; a
leading batch axis works too ("..." in shapes).
"""
import math
import threading
from contextlib import contextmanager
from functools import lru_cache, partial

import numpy as np

from gpt2_numpy import cores, fast
from gpt2_numpy.allocator import scratch
from gpt2_numpy.checks import check_heads, check_inputs
from gpt2_numpy.model import causal_mask, split_heads
from gpt2_numpy.params import flatten

GELU_C = math.sqrt(2 / math.pi)  # gelu(x) = ½x(1 + tanh(GELU_C (x + 0.044715x³)))
# the cross-entropy's chunks hold this many times fast.CHUNK elements: a dozen Python calls a chunk, each holding the
# GIL, cost more than L2 saves over L3 (in 4 MB chunks, 20 rows of 50,257 logits, a step's took 20 ms less here than
# in chunks of 2 rows)
CE_CHUNKS = 8
QUERY_BLOCK = 64  # causal_blocks' queries: at 128 positions a head's forward and backward took 26% less time than
# unblocked here, at 1,024 31% (blocks of 128: 25% and 32%, of 32: 27% and 27%)


def rows(x):  # [..., n] -> [n_rows, n], a view
    # every position as one matrix's rows: NumPy runs a stacked [batch, n_seq, n] @ w as a matmul per batch row,
    # and a 2-D one as a single BLAS call, which keeps every core busy
    return x.reshape(-1, x.shape[-1])


# --- linear: y = x w + b ---


def linear_forward(x, w, b):  # model.linear -> [..., n_out]
    # one product for every position (see rows()); within cores.all_cores() by rows: at a training step's width
    # (256) its pieces by columns, their bias added over strided columns, cost a step 15 ms more here
    return cores.matmul(rows(x), w, bias=b, over=cores.ROWS).reshape(*x.shape[:-1], w.shape[-1])


def linear_backward(d_out, x, w):  # [..., n_out], [..., n_in], [n_in, n_out] -> [..., n_in], {"w", "b"}
    # y = x w + b: dx = dy wᵀ, dw = xᵀ dy and db = Σ dy = 1ᵀ dy, both summed over every position
    # Within cores.all_cores() the products share one split: on two threads dx runs whole on one and dw, then db, on
    # the other (10% faster here than each in pieces on both; db as a sum beside them cost a step 2 ms of one thread
    # alone); in pieces, dx goes by rows (all of w, the smaller, and some rows of dy), dw and db by columns (dy's)
    rows_x, rows_d = rows(x), rows(d_out)
    d_x, d_w, d_b = cores.matmuls(cores.Product(rows_d, w.T, over=cores.ROWS), cores.Product(rows_x.T, rows_d),
                                  cores.Product(fast.ones(len(rows_d), rows_d.dtype)[None], rows_d))
    return d_x.reshape(*x.shape), {"w": d_w, "b": d_b[0]}


# --- GELU (its forward is fast.gelu) ---


def gelu_backward_kept(d_out, x, y):  # [...], gelu's input and output [...] -> [...]
    # y = x s, s = ½(1 + tanh u) = 1/(1 + e^(-2u)), u = c(x + 0.044715x³):
    # dy/dx = s + x·2s(1 - s)·c(1 + 3·0.044715x²) = s (1 + (1 - s)·2cx(1 + 3·0.044715x²)),
    # with s = y/x taken from the forward's output instead of a second exp (s = ½ at x = 0). A dozen passes, run as
    # fast.gelu runs its own: a chunk at a time, in cache (fast.in_chunks)
    return fast.in_chunks(gelu_backward_chunk, d_out, x, y)


def gelu_backward_chunk(d_out, x, y, out):  # [n] x3 -> out [n]: gelu_backward_kept's passes
    out.fill(0.5)
    s = np.divide(y, x, out=out, where=x != 0)
    slope = x * x
    slope *= 2 * GELU_C * 3 * 0.044715
    slope += 2 * GELU_C
    slope *= x  # 2cx(1 + 3·0.044715x²) as x(2c + 2c·3·0.044715x²): a pass fewer
    slope *= np.subtract(1, s, dtype=s.dtype)
    slope += 1
    s *= slope
    s *= d_out
    return s


# --- layer norm: y = g x̂ + b, x̂ = (x - μ)/σ ---


def layer_norm_forward(x, g, b, eps=1e-5):  # model.layer_norm -> [..., n], kept
    # model.layer_norm's formula in two steps, keeping x̂ and 1/σ for the backward, as llm.c keeps μ and 1/σ: the
    # backward needs no second pass over x. Centred in place, with the variance as one dot product per row
    rows_x, n = rows(x), x.shape[-1]
    out, x_hat, inv_sigma = np.empty(rows_x.shape, x.dtype), np.empty(rows_x.shape, x.dtype), np.empty((len(rows_x), 1),
                                                                                                        x.dtype)

    def some_rows(piece):  # within cores.all_cores() the rows are shared among the cores, as in fast.layer_norm
        centered = np.subtract(rows_x[piece], rows_x[piece].mean(axis=-1, keepdims=True), out=x_hat[piece])
        inv_sigma[piece] = 1 / np.sqrt(np.vecdot(centered, centered)[:, None] / n + eps)
        centered *= inv_sigma[piece]
        np.multiply(g, centered, out=out[piece])
        out[piece] += b

    cores.split(some_rows, len(rows_x), item_size=n)
    return out.reshape(x.shape), {"x_hat": x_hat.reshape(x.shape), "inv_sigma": inv_sigma.reshape(*x.shape[:-1], 1)}


def layer_norm_backward_kept(d_out, kept, g):  # [..., n], layer_norm_forward's kept, [n] -> [..., n], {"g", "b"}
    # dx = (ĝ - mean(ĝ) - x̂ mean(ĝ x̂))/σ with ĝ = g dy; dg = Σ dy x̂, db = Σ dy. In place on ĝ, a fresh array;
    # dg and db summed by each piece over its rows while they are in cache, the pieces' sums added up in order
    rows_d, x_hat, inv_sigma, n = rows(d_out), rows(kept["x_hat"]), rows(kept["inv_sigma"]), d_out.shape[-1]
    d_x = np.empty(rows_d.shape, d_out.dtype)
    sums = {}

    def some_rows(piece):  # shared among the cores within cores.all_cores(), as layer_norm_forward's
        sums[piece.start] = (rows_d[piece] * x_hat[piece]).sum(axis=0), rows_d[piece].sum(axis=0)
        d = np.multiply(g, rows_d[piece], out=d_x[piece])
        d -= d.mean(axis=-1, keepdims=True)  # mean(x̂) = 0, so this leaves d's product with x̂ as it was
        d -= x_hat[piece] * (np.vecdot(d, x_hat[piece])[:, None] / n)
        d *= inv_sigma[piece]

    cores.split(some_rows, len(rows_d), item_size=n)
    d_g, d_b = (sum(parts) for parts in zip(*(sums[start] for start in sorted(sums))))
    return d_x.reshape(d_out.shape), {"g": d_g, "b": d_b}


# --- softmax (its forward is model.softmax) ---


def softmax_backward_in_place(d_out, y):  # [..., n], [..., n] (the softmax's output) -> [..., n], in d_out's memory
    # y = softmax(x): dx = y ⊙ (dy - Σ dy ⊙ y), the Jacobian diag(y) - y yᵀ applied to dy. In place on d_out (the
    # caller's own fresh array), with Σ dy ⊙ y as one dot product per row: the formula as written would make three
    # arrays the size of the attention weights, the largest of a step
    d_out -= np.vecdot(d_out, y)[..., None]
    d_out *= y
    return d_out


# --- attention: softmax(q kᵀ/√d + mask) v ---


def attention_forward(q, k, v, mask, out=None):  # model.attention with model.causal_mask's mask -> [..., n_head, n_q,
    # d_head] (in out if given), weights [..., n_head, n_q, n_k]
    # model.attention's two lines, keeping the weights for the backward (recomputing them there would cost another
    # q kᵀ and softmax per layer): the scores made in the weights' own memory, with q scaled first as
    # fast.attention_scores does, and the softmax in place on them as the tuned pass takes it (e^x unshifted where
    # that is safe, the row sums as dot products), where model.softmax(scores + mask) would make three more arrays of
    # the weights' size. Every product below is a matmul, one BLAS call per head; by blocks of queries, each against
    # the keys up to its last (causal_blocks)
    out = np.empty(q.shape, q.dtype) if out is None else out
    weights = np.zeros((*q.shape[:-1], k.shape[-2]), q.dtype)  # 0 where the mask hides a key: softmax's e^-inf
    scale = 1 / math.sqrt(q.shape[-1])

    def some_heads(at):
        for start, stop in causal_blocks(q.shape[-2]):
            queries, keys = (..., slice(start, stop), slice(None)), (..., slice(None, stop), slice(None))
            scores = np.matmul(q[at][queries] * scale, k[at][keys].swapaxes(-1, -2),
                               out=weights[at][..., start:stop, :stop])
            scores += mask[start:stop, :stop]
            fast.exp_in_place(scores)
            scores /= fast.row_sums(scores)[..., None]
            np.matmul(scores, v[at][keys], out=out[at][queries])

    each_head(some_heads, q, k)
    return out, weights


def attention_backward_kept(d_out, q, k, v, weights, out=None):  # [..., n_head, n_q, d_head], q, k, v,
    # [..., n_head, n_q, n_k] (causal: 0 above the diagonal) -> d_q, d_k, d_v (in out's three arrays if given)
    # out = w v, w = softmax(q kᵀ/√d + mask): dv = wᵀ dout, dw = dout vᵀ, ds = softmax'(dw), dq = ds k/√d, dk = dsᵀ q/√d
    # (the mask: none). The 1/√d scales k and q, [n, d_head] each, instead of ds, [n_q, n_k]. By causal_blocks: dw,
    # ds and dq by blocks of queries, each against the keys up to its last; dv and dk by the same blocks of keys, each
    # against the queries from its first on (where w and ds are 0 above the diagonal)
    d_q, d_k, d_v = (np.empty(a.shape, a.dtype) for a in (q, k, v)) if out is None else out
    scale = 1 / math.sqrt(q.shape[-1])
    blocks = causal_blocks(q.shape[-2])

    def some_heads(at):
        w, d_o, q_s, k_s = weights[at], d_out[at], q[at] * scale, k[at] * scale
        d_scores = np.empty(w.shape, w.dtype)  # filled at and below the diagonal's blocks, as the products read it
        for start, stop in blocks:
            queries, keys = (..., slice(start, stop), slice(None)), (..., slice(None, stop), slice(None))
            block = np.matmul(d_o[queries], v[at][keys].swapaxes(-1, -2), out=d_scores[..., start:stop, :stop])
            softmax_backward_in_place(block, w[..., start:stop, :stop])
            np.matmul(block, k_s[keys], out=d_q[at][queries])
        for start, stop in blocks:
            later = (..., slice(start, None), slice(None))
            np.matmul(w[..., start:, start:stop].swapaxes(-1, -2), d_o[later], out=d_v[at][..., start:stop, :])
            np.matmul(d_scores[..., start:, start:stop].swapaxes(-1, -2), q_s[later], out=d_k[at][..., start:stop, :])

    each_head(some_heads, q, k)
    return d_q, d_k, d_v


def causal_blocks(n_q):  # -> [(start, stop)]: the queries in blocks of QUERY_BLOCK
    # Causal attention's queries in a block see no key after the block's last: its products and passes skip them,
    # about a quarter of the work at 2 blocks (128 positions), 7/16 at 8 (512)
    return [(start, min(start + QUERY_BLOCK, n_q)) for start in range(0, n_q, QUERY_BLOCK)]


def each_head(work, q, k):  # work(at) for index tuples `at` that cover q's and k's heads [..., n_head] once
    # Within cores.all_cores() the batch rows' heads, each independent, are shared among the cores, as NumPy runs the
    # softmax's passes on one: a thread's share may span batch rows, so it runs one call per row it touches
    heads = q.shape[:-2]
    n_head = heads[-1]

    def some_heads(piece):
        if piece.stop - piece.start == math.prod(heads):  # one thread: one call for every head, as the plain form
            work((...,))
            return
        item = piece.start
        while item < piece.stop:
            *row, head = (int(i) for i in np.unravel_index(item, heads))
            stop = min(n_head, head + piece.stop - item)
            work((*row, slice(head, stop)))
            item += stop - head

    cores.split(some_heads, math.prod(heads), item_size=q.shape[-2] * k.shape[-2])  # a head's weights


# --- multi-head attention: c_proj(merge(attention(split(c_attn(x))))) ---


@lru_cache(maxsize=4)
def shared_causal_mask(n_seq):  # -> model.causal_mask(n_seq), read-only: made once for every layer of every step
    mask = causal_mask(n_seq)
    mask.flags.writeable = False
    return mask


def mha_forward(x, c_attn, c_proj, n_head):  # model.mha -> [..., n_seq, n_embd], kept
    q, k, v = (split_heads(a, n_head) for a in np.split(linear_forward(x, **c_attn), 3, axis=-1))
    # each head's output written straight into its columns of merge_heads' layout (a BLAS call writes rows of any
    # stride), where merge_heads would copy them there
    heads = np.empty(x.shape, x.dtype)
    weights = attention_forward(q, k, v, shared_causal_mask(x.shape[-2]), out=split_heads(heads, n_head))[1]
    return linear_forward(heads, **c_proj), {"x": x, "q": q, "k": k, "v": v, "weights": weights, "heads": heads}


def mha_backward(d_out, kept, c_attn, c_proj, n_head):  # [..., n_seq, n_embd], mha_forward's kept -> dx, grads
    # the chain rule, from c_proj back to c_attn
    d_heads, g_proj = linear_backward(d_out, kept["heads"], c_proj["w"])
    # split_heads and merge_heads are each other's inverse, so each one's backward is the other: d_q, d_k and d_v
    # written straight into their heads' columns of d_qkv, as the forward writes its heads (the backward of the
    # split of c_attn's output into q, k, v and heads, without merge_heads' copies and a concatenation)
    d_qkv = np.empty((*d_heads.shape[:-1], 3 * d_heads.shape[-1]), d_heads.dtype)
    attention_backward_kept(split_heads(d_heads, n_head), kept["q"], kept["k"], kept["v"], kept["weights"],
                            out=[split_heads(part, n_head) for part in np.split(d_qkv, 3, axis=-1)])
    d_x, g_attn = linear_backward(d_qkv, kept["x"], c_attn["w"])
    return d_x, {"c_attn": g_attn, "c_proj": g_proj}


# --- the feed-forward network: c_proj(gelu(c_fc(x))) ---


def ffn_forward(x, c_fc, c_proj):  # model.ffn -> [..., n_seq, n_embd], kept
    pre = linear_forward(x, **c_fc)
    hidden = fast.gelu(pre)  # the tuned pass's form (tests/unit/test_fast.py): model.gelu is several times slower
    return linear_forward(hidden, **c_proj), {"x": x, "pre": pre, "hidden": hidden}


def ffn_backward(d_out, kept, c_fc, c_proj):  # [..., n_seq, n_embd], ffn_forward's kept -> dx, grads
    # the chain rule, from c_proj back to c_fc
    d_hidden, g_proj = linear_backward(d_out, kept["hidden"], c_proj["w"])
    d_x, g_fc = linear_backward(gelu_backward_kept(d_hidden, kept["pre"], kept["hidden"]), kept["x"], c_fc["w"])
    return d_x, {"c_fc": g_fc, "c_proj": g_proj}


# --- a block: mid = x + mha(ln_1(x)), out = mid + ffn(ln_2(mid)) ---


def block_forward(x, ln_1, attn, ln_2, mlp, n_head):  # model.block -> [..., n_seq, n_embd], kept
    normed_1, ln_1_kept = layer_norm_forward(x, **ln_1)
    attn_out, attn_kept = mha_forward(normed_1, **attn, n_head=n_head)
    mid = x + attn_out
    normed_2, ln_2_kept = layer_norm_forward(mid, **ln_2)
    mlp_out, mlp_kept = ffn_forward(normed_2, **mlp)
    return mid + mlp_out, {"ln_1": ln_1_kept, "attn": attn_kept, "ln_2": ln_2_kept, "mlp": mlp_kept}


def block_backward(d_out, kept, ln_1, attn, ln_2, mlp, n_head):  # [..., n_seq, n_embd], block_forward's kept
    # each residual passes its gradient through unchanged, and adds it to its branch's
    d_ln_2, g_mlp = ffn_backward(d_out, kept["mlp"], **mlp)
    d_mid, g_ln_2 = layer_norm_backward_kept(d_ln_2, kept["ln_2"], ln_2["g"])
    d_mid += d_out
    d_ln_1, g_attn = mha_backward(d_mid, kept["attn"], **attn, n_head=n_head)
    d_x, g_ln_1 = layer_norm_backward_kept(d_ln_1, kept["ln_1"], ln_1["g"])
    d_x += d_mid
    return d_x, {"ln_1": g_ln_1, "attn": g_attn, "ln_2": g_ln_2, "mlp": g_mlp}


# --- the embedding: x = wte[inputs] + wpe[positions] (its forward is model.gpt2's first line) ---


def embedding_backward_into(d_x, inputs, d_wte, n_ctx):  # [..., n_seq, n_embd], int [..., n_seq], [n_vocab, n_embd]
    # each row's gradient goes back to the rows it was read from, summed over repeats -> dwte, dwpe. wte is tied to
    # the output head: its share comes in as d_wte, and the embedding's is added to it
    # in place: a fresh [n_vocab, n_embd] would cost 150 MB and a pass. Into a C-ordered d_wte (a product's output,
    # train_step's) as element indices into its flat view, not row indices into the 2-D one: np.add.at runs a 1-D
    # index through its fast loop, 5 times as fast here at 8 x 128 tokens, and adds the repeats of a row in the same
    # order. Any other layout (a caller's lent array) has no flat view, and takes the rows
    if d_wte.flags.c_contiguous:
        n_embd = d_x.shape[-1]
        at = np.add.outer(inputs.reshape(-1) * n_embd, np.arange(n_embd))
        np.add.at(d_wte.reshape(-1), at.reshape(-1), d_x.reshape(-1))
    else:
        np.add.at(d_wte, inputs.reshape(-1), rows(d_x))
    d_wpe = np.zeros((n_ctx, d_x.shape[-1]), d_x.dtype)
    d_wpe[: d_x.shape[-2]] = d_x.reshape(-1, *d_x.shape[-2:]).sum(axis=0)
    return d_wte, d_wpe


# --- the output head: logits = x wteᵀ, and the loss ---


def cross_entropy_in_place(logits, targets, head=None):  # [..., n_vocab] (overwritten), int [...] -> (mean loss,
    # float), row scales [...]; head: (x [..., n_embd], wte [n_vocab, n_embd]) when logits = x wteᵀ
    # loss = mean(log Σ exp(logits) - logits[target]), and dlogits = (softmax(logits) - onehot(target)) / n_positions
    # = s (e^(logits - c) - onehot(target) Σ e^(logits - c)), with one scale s = 1 / (n_positions Σ e^(logits - c)) a
    # row, c constant along it (scaled_gradient_rows). The logits become the bracket in place, a chunk of rows at a
    # time (each pass over a chunk runs in cache), where model.softmax would make three [n_positions, n_vocab]
    # temporaries (200 MB each at 4 x 256 tokens of GPT-2's vocabulary) and a pass over each; the scales are
    # lm_head_backward_scaled's to apply. Given the head, a chunk takes e^x before knowing that it may (exp_fits), and
    # a chunk that may not has its logits made again: the first one that fails leaves the rest to check first
    flat, targets = rows(logits), targets.reshape(-1)
    pieces = fast.chunks(len(flat), -(-flat.shape[-1] // CE_CHUNKS))
    losses = np.empty(len(pieces))  # each chunk's summed loss, added up in order: the same sum on any team
    sums = np.empty(len(flat), flat.dtype)
    ones = np.ones(flat.shape[-1], flat.dtype)
    guessing = {"on": head is not None}

    def remake(piece):  # the chunk's logits made again, and the chunks after it checked first
        guessing["on"] = False
        np.matmul(rows(head[0])[piece], head[1].T, out=flat[piece])

    def some_chunks(share):  # within cores.all_cores() the chunks are shared among the cores
        for i in range(len(pieces))[share]:
            piece = pieces[i]
            losses[i] = scaled_gradient_rows(flat[piece], targets[piece], ones, sums[piece],
                                             partial(remake, piece) if guessing["on"] else None)

    cores.split(some_chunks, len(pieces), item_size=flat.size // len(pieces))
    return sum(losses.tolist()) / len(targets), (1 / (sums * len(targets))).reshape(logits.shape[:-1])


def scaled_gradient_rows(logits, targets, ones, sums, remake=None):  # [n, n_vocab] (made dlogits / s), int [n],
    # [n_vocab] of ones -> the summed loss; sums [n] made Σ e^(logits - c); remake(): the logits made again
    # the same softmax and loss for any c constant along a row: c = 0 where exp cannot overflow, else the row's max
    # (fast.exp_in_place); loss = log Σ e^(logits - c) + c - logits[target]
    target_at = (np.arange(len(targets)), targets)
    target_logits = logits[target_at]
    if remake is not None and exp_fits(logits, ones, sums):
        shift = 0.0
    else:
        if remake is not None:
            remake()
        shift = fast.exp_in_place(logits)
        np.matmul(logits, ones, out=sums)  # the sums as a product on one thread: 2.5x as fast as sum(axis=-1) here
    logits[target_at] -= sums
    return float((np.log(sums) + np.reshape(shift, -1) - target_logits).sum(dtype=np.float64))


def exp_fits(logits, ones, sums):  # [n, n_vocab] made e^logits, [n_vocab] of ones, sums [n] made Σ e^logits ->
    # whether e^x unshifted was as good as exp_in_place's
    # Σ e^x bounds each row's max m on both sides, e^m ≤ Σ ≤ n_vocab e^m: within (n_vocab e^-50, e^50) it puts m
    # within ±fast.UNSHIFTED, exp_in_place's rule for taking e^x unshifted, without its pass for the maxes (False for
    # a sum that overflowed, and for NaN)
    with np.errstate(over="ignore"):  # e^x or a sum beyond float32 is inf, and fails the check
        np.exp(logits, out=logits)
        np.matmul(logits, ones, out=sums)
    low, high = len(ones) * math.exp(-fast.UNSHIFTED), math.exp(fast.UNSHIFTED)
    return bool(np.all((low < sums) & (sums < high)))


def lm_head_backward_scaled(d_logits, row_scales, x, wte, d_wte=None):  # [..., n_seq, n_vocab] and [..., n_seq]
    # (dlogits = d_logits row_scales: cross_entropy_in_place's), [..., n_seq, n_embd], [n_vocab, n_embd] -> dx, dwte
    # (in d_wte if given)
    # logits = x wteᵀ: dx = dlogits wte, dwte = dlogitsᵀ x (the tied head's share of wte's gradient), with the row
    # scales s applied to the [n, n_embd] sides instead of the [n, n_vocab] one, which saves a pass over it:
    # dx = s (d_logits wte), dwte = d_logitsᵀ (s x). Within cores.all_cores() each product is shared by the
    # vocabulary: dx by its partial sums over the vocabulary (cores.INNER: by columns, every thread would read all of
    # d_logits, and by rows all of wte), dwte by its rows
    rows_d, rows_x, scales = rows(d_logits), rows(x), row_scales.reshape(-1, 1)
    d_x = cores.matmul(rows_d, wte, over=cores.INNER)
    d_x *= scales
    return d_x.reshape(*x.shape), cores.matmul(rows_d.T, rows_x * scales, over=cores.ROWS, out=d_wte)


# --- the whole model ---


def checked_ids(ids, what, n_vocab, n_ctx):  # int [..., n_seq] -> int64, the same shape; ValueError naming what
    ids = np.asarray(ids)
    rows = ids.reshape(-1, ids.shape[-1]) if ids.ndim > 2 else ids  # check_inputs takes one sequence or one batch
    try:
        return check_inputs(rows, n_vocab=n_vocab, n_ctx=n_ctx).reshape(ids.shape)
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None


@contextmanager
def step_cores(inputs, n_embd):  # within: a training step of these inputs on a model n_embd wide, on its cores
    # The forward's rules: a model narrower than cores.NARROW runs on one thread; from fast.ALL_CORES_FROM positions
    # each split of the step's products and passes holds enough work to pay for its hand-over, and OpenBLAS on one
    # thread stops its workers spinning beside ours; a shorter step keeps OpenBLAS's threads for its products (each
    # split stays on one thread below cores.MIN_WORK)
    with cores.for_model(n_embd), cores.all_cores(enabled=np.size(inputs) >= fast.ALL_CORES_FROM):
        yield


def loss_and_grads(inputs, targets, params, n_head, d_wte=None):  # int [..., n_seq] x2 -> (mean cross-entropy, grads
    # like params)
    """The mean next-token cross-entropy of `targets` given `inputs`, and its gradient for every parameter; wte's
    gradient in d_wte where given (an array like wte that the caller lends: train_step's own, kept between steps)."""
    wte, wpe, ln_f = params["wte"], params["wpe"], params["ln_f"]
    # NumPy would wrap negative ids, and a mismatched target array would drop or broadcast targets, without a word
    check_heads(n_head, wte.shape[-1])
    inputs, targets = (checked_ids(ids, what, wte.shape[0], wpe.shape[0]) for ids, what in
                       ((inputs, "inputs"), (targets, "targets")))
    if targets.shape != inputs.shape:
        raise ValueError(f"targets {targets.shape} must have the inputs' shape {inputs.shape}: the next token of each "
                         "position")
    with step_cores(inputs, wte.shape[1]):  # a no-op within train_step's, which includes clipping and AdamW
        sequences, n_seq = inputs.reshape(-1, inputs.shape[-1]), inputs.shape[-1]
        x_f = np.empty((inputs.size, wte.shape[1]), wte.dtype)  # ln_f's output, a row a position
        kept = {}

        def forward(piece, rank):  # as model.gpt2, these sequences through the blocks and ln_f
            x = wte[sequences[piece]] + wpe[np.arange(n_seq)]
            blocks_kept = []
            for block_params in params["blocks"]:
                x, block_kept = block_forward(x, **block_params, n_head=n_head)
                blocks_kept.append(block_kept)
            normed, ln_f_kept = layer_norm_forward(x, **ln_f)
            x_f[piece.start * n_seq: piece.stop * n_seq] = rows(normed)
            kept[rank] = blocks_kept, ln_f_kept, normed.shape

        by_sequences(forward, len(sequences))
        # the step's largest array, its pages faulted in anew at every step but for scratch()
        logits = scratch("logits", (inputs.size, len(wte)), x_f.dtype)
        loss, row_scales = cross_entropy_in_place(cores.matmul(x_f, wte.T, out=logits), targets, (x_f, wte))
        d_x_f, d_wte_head = lm_head_backward_scaled(logits, row_scales, x_f, wte, d_wte)
        d_x, grads = np.empty_like(x_f), InOrder()
        n_layer = len(params["blocks"])

        def backward(piece, rank):  # these sequences back through ln_f and the blocks, their shares of the gradients
            # added up as they come
            positions = slice(piece.start * n_seq, piece.stop * n_seq)
            blocks_kept, ln_f_kept, shape = kept[rank]
            d, g_ln_f = layer_norm_backward_kept(d_x_f[positions].reshape(shape), ln_f_kept, ln_f["g"])
            grads.add(rank, "ln_f", g_ln_f)
            for layer in reversed(range(n_layer)):
                d, block_grad = block_backward(d, blocks_kept[layer], **params["blocks"][layer], n_head=n_head)
                grads.add(rank, layer, block_grad)
            d_x[positions] = rows(d)

        by_sequences(backward, len(sequences))
        # the embedding's share + the head's
        d_wte, d_wpe = embedding_backward_into(d_x.reshape(*inputs.shape, -1), inputs, d_wte_head, wpe.shape[0])
        sums = grads.sums
        return loss, {"wte": d_wte, "wpe": d_wpe, "blocks": [sums[layer] for layer in range(n_layer)],
                      "ln_f": sums["ln_f"]}


def by_sequences(work, n_sequences):  # work(piece, rank) for slices that cover range(n_sequences), rank 0, 1, ... in
    # their order: within cores.all_cores() each thread of a team that divides the sequences evenly takes its share of
    # them whole, and runs every pass over them alone; else one piece takes them all, its passes shared by the team
    # A block's passes shared by the team hand pieces over some 20 times a layer, each time both threads waiting on
    # the slower one; by sequences, once for the blocks forward and once back: 4 to 18 ms a step less at 4 layers x
    # 256, 8 x 128 tokens on 2 threads here (two runs, in turns in one process). The output head's products stay
    # shared by the team, each thread reading part of wte instead of all of it
    team = cores.team_size()
    if team > 1 and n_sequences % team == 0:  # split() gives each thread n_sequences / team of them
        cores.split(partial(alone, work, n_sequences // team), n_sequences, item_size=cores.MIN_WORK)
    else:
        work(slice(0, n_sequences), 0)


class InOrder:
    """Sums of shares that the pieces of a split make, each added as it comes but in the pieces' order (rank 0, 1,
    ...), whatever the threads' timing: the same sums on any schedule. A share that comes before those of the ranks
    before it waits, parked, for the thread that adds theirs to add it too: no thread waits for another, and the
    shares held beside the sums are no more than the pieces are apart (a piece's gradients for the 124M shape's blocks
    are 340 MB: a sum at the end would hold one such share a thread)."""

    def __init__(self):
        self.sums, self.parked, self.summed, self.adding = {}, {}, {}, set()  # summed: key -> the ranks added
        self.lock = threading.Lock()

    def add(self, rank, key, share):  # share: a tree of arrays; sums[key] holds it once every rank before it is in
        with self.lock:
            self.parked.setdefault(key, {})[rank] = share
            if key in self.adding:  # another thread adds to this sum now, and takes this share when its turn comes
                return
            self.adding.add(key)
        while True:
            with self.lock:
                share = self.parked[key].pop(self.summed.get(key, 0), None)
                if share is None:  # the next rank's has yet to come: its thread adds it
                    self.adding.discard(key)
                    return
                self.summed[key] = self.summed.get(key, 0) + 1
            if key not in self.sums:
                self.sums[key] = share
            else:  # this thread's alone while key is in adding
                for (_, total), (_, part) in zip(flatten(self.sums[key]), flatten(share)):
                    total += part


def alone(work, per_piece, piece):  # work(piece, its rank) with every split in it on this thread
    with cores.one_core():
        work(piece, piece.start // per_piece)
