"""AdamW, global gradient-norm clipping and the learning-rate schedule, as nanoGPT and llm.c train GPT-2.

Params, grads and the optimizer's moments are nested dicts (and the list of blocks) of float32 arrays in the params
layout. The state is `{"step": int, "m": moments like params, "v": like params}`: saved and loaded as it is, a run
resumes exactly.
"""
import math

import numpy as np

from gpt2_numpy import cores
from gpt2_numpy.fast import chunks
from gpt2_numpy.params import flatten, map_leaves

BETAS, EPS, WEIGHT_DECAY, CLIP = (0.9, 0.95), 1e-8, 0.1, 1.0
MIN_LR_RATIO = 0.1  # the cosine decays to 10% of the peak rate


def adamw_state(params):  # -> a fresh state: no steps taken, both moments zero
    return {"step": 0, "m": map_leaves(np.zeros_like, params), "v": map_leaves(np.zeros_like, params)}


def global_norm(grads):  # -> √(Σ g²) over every gradient, as one vector
    # vdot: the sum of squares, no temporary; the chunks' sums added up in order, the same on any team
    return math.sqrt(sum(each_chunk(lambda g: float(np.vdot(g, g)), grads)))


def each_chunk(work, *trees):  # -> [work(*each tree's chunk)] for every chunk of every leaf, in order
    # trees: nested dicts in the params layout (params, grads, moments), chunked alike, a few rows of a leaf at a time
    # so that each pass over a chunk runs in cache, not memory. Within cores.all_cores() the chunks of every leaf are
    # shared among the cores in one split, as NumPy runs each pass on one
    # shared by their elements, not their count: wte's chunks are full, the biases' a few hundred elements, and an even
    # count of them left one thread of AdamW 7 ms behind the other at 4 layers x 256 here
    leaves = [[leaf for _, leaf in flatten(tree)] for tree in trees]
    pieces = [(i, rows) for i, leaf in enumerate(leaves[0]) for rows in chunks(len(leaf), leaf[0].size)]
    starts = np.cumsum([0] + [leaves[0][i][rows].size for i, rows in pieces])  # each piece's first element
    results = [None] * len(pieces)

    def some_chunks(share):  # the pieces that start within this share of the elements
        for at in range(*np.searchsorted(starts[:-1], (share.start, share.stop))):
            i, rows = pieces[at]
            results[at] = work(*(tree[i][rows] for tree in leaves))

    cores.split(some_chunks, int(starts[-1]), item_size=1)
    return results


def clip_scale(norm, max_norm=CLIP):  # -> the factor clipping multiplies every gradient by (1: none), so that their
    # global norm is at most max_norm; adamw_step applies it within its passes (grad_scale), not in a pass of its own
    return min(1.0, max_norm / (norm + 1e-6))  # as torch's clip_grad_norm_: the 1e-6 keeps a zero norm finite


def learning_rate(step, peak, warmup, total, schedule="cosine"):  # step 0, 1, ... -> the rate for that step
    """Linear warmup over `warmup` steps, then the peak ("constant") or a cosine down to 10% of it at step `total`;
    past `total` the rate stays at step `total`'s."""
    step = min(step, total)  # else the cosine would climb back toward the peak
    if step < warmup:
        return peak * (step + 1) / warmup  # linear warmup, reaching the peak at the last warmup step
    if schedule == "constant":
        return peak
    progress = (step - warmup) / max(1, total - warmup)  # 0 after warmup -> 1 at the end
    min_lr = MIN_LR_RATIO * peak
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (peak - min_lr)  # cosine from the peak to min_lr


def adamw_step(params, grads, state, lr, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, grad_scale=1.0):
    # -> state; params and state updated in place
    """One AdamW step on every parameter, its gradient taken as grads × grad_scale (clip_scale's factor: clipping
    without a pass of its own over the gradients); weight decay applies to the 2-D tensors only, not biases or norm
    params."""
    beta1, beta2 = betas
    state["step"] += 1
    t = state["step"]
    # the bias corrections of m̂ = m/(1-β₁ᵗ), v̂ = v/(1-β₂ᵗ), folded into the step size and eps as torch does:
    # lr m̂/(√v̂ + eps) = (lr/(1-β₁ᵗ)) m / (√v/√(1-β₂ᵗ) + eps) = (lr √(1-β₂ᵗ)/(1-β₁ᵗ)) m / (√v + eps √(1-β₂ᵗ)),
    # the last form a pass shorter
    sqrt_c2 = math.sqrt(1 - beta2**t)
    step_size, eps_v = lr * sqrt_c2 / (1 - beta1**t), eps * sqrt_c2
    decay = np.float32(1 - lr * weight_decay)

    def update(p, g, m, v):  # a chunk's rows keep its leaf's ndim: decay for the matrices and embeddings only
        adamw_update(p, g, m, v, decay if p.ndim >= 2 else None, beta1, beta2, step_size, eps_v, grad_scale)

    each_chunk(update, params, grads, state["m"], state["v"])
    return state


def adamw_update(p, g, m, v, decay, beta1, beta2, step_size, eps_v, grad_scale):  # one piece of adamw_step, in place
    # in place throughout, on one scratch array: the 124M model's params, moments and grads are 500 MB each
    if decay is not None:  # decoupled from the gradient: p ← p - lr λ p
        p *= decay
    scratch = np.multiply(g, np.float32((1 - beta1) * grad_scale))
    m *= np.float32(beta1)  # m ← β₁ m + (1-β₁) g
    m += scratch
    np.multiply(g, g, out=scratch)
    scratch *= np.float32((1 - beta2) * grad_scale**2)
    v *= np.float32(beta2)  # v ← β₂ v + (1-β₂) g²
    v += scratch
    np.sqrt(v, out=scratch)  # p ← p - step_size m / (√v + eps_v)
    scratch += np.float32(eps_v)
    np.divide(m, scratch, out=scratch)
    scratch *= np.float32(step_size)
    p -= scratch
