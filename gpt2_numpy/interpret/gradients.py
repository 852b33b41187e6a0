"""Gradients of any named activation: the backward of run_with_edits. One forward pass (trace's arrays, with the edits
in place), then one backward pass through the same steps in reverse, composed of backward.py's textbook functions,
that records the gradient of a scalar metric with respect to each array asked for, at every position.

    metric = logit_difference(answer, other)                   # logit(answer) - logit(other) at the last position
    value, grads = gradients(ids, params, n_head, metric, ["blocks.0.attn.z", "embed"])
    grads["blocks.0.attn.z"]                                   # [n_head, n_seq, d_head]: d metric / d z

The gradient at a name is the total one: through every path from that array to the metric, as autograd's at a hook.
A metric is any function of the run's arrays that returns its value and its gradient with respect to the arrays it
reads, {name: array}: logit_difference and next_token_loss read the logits; a metric of an earlier array (an SAE
latent's activation, read from blocks.L.mid) is seeded where that array is made, and the pass carries it from there.

Two choices autograd would make too: attn.scores are trace's, before the causal mask, and a masked score (a key after
its query) has gradient 0, since softmax gives it weight 0; and an edited array is a constant of the run (a zero, a
mean, another run's array does not depend on the array it replaces), so its gradient is recorded and goes no further
back, as torch's would behind a detach(). A head edit holds only its head's slice fixed.
"""
import functools

import numpy as np

from gpt2_numpy.backward import (
    attention_scores_backward,
    cross_entropy,
    gelu_backward,
    layer_norm_backward,
    linear_input_backward,
    softmax_backward,
    weighted_sum_backward,
)
from gpt2_numpy.interpret.attribution import check_answers
from gpt2_numpy.interpret.edits import check_names, run_with_edits
from gpt2_numpy.interpret.names import run_names
from gpt2_numpy.model import merge_heads, split_heads


def gradients(ids, params, n_head, metric, names=None, edits=()):  # int [n_seq] -> value, {name: gradient}
    """The metric's value on the run of ids with `edits` in place, and its gradient with respect to each array in
    `names` (trace's names; every array of the run when None), each of its array's shape and dtype.
    ValueError, before anything runs, for a name the run does not make (and run_with_edits's for a bad edit)."""
    check_names(names or [], run_names(len(params["blocks"])))
    return run_gradients(run_with_edits(ids, params, n_head, edits), params, n_head, metric, names, edits)


def run_gradients(arrays, params, n_head, metric, names=None, edits=()):  # {name: array} -> value, {name: gradient}
    """gradients' backward pass alone, on a run that is made already: arrays, every array of run_with_edits(...,
    edits) by name (attribution patching reads the run's arrays too)."""
    value, seeds = metric(arrays)
    recorded = {}
    wanted = set(arrays if names is None else names)
    backward_walk(arrays, params, n_head, functools.partial(at_array, seeds, edits, wanted, recorded))
    return value, recorded


def at_array(seeds, edits, wanted, recorded, name, d):  # -> the gradient that goes on past array `name`
    # d: the gradient reaching the array from the steps after it; the metric's own share is added where it reads it
    d = d + seeds[name] if name in seeds else d
    if name in wanted:
        recorded[name] = d
    return held_fixed(d, [edit.head for edit in edits if edit.name == name])


def held_fixed(d, heads):  # -> d with the edited arrays' share zeroed: an edit's replacement is a constant of the run
    if None in heads:
        return np.zeros_like(d)
    if heads:
        d = d.copy()
        d[..., heads, :, :] = 0  # [..., n_head, n_seq, ...]: the edited heads only
    return d


def backward_walk(arrays, params, n_head, at):  # -> None; at(name, d) for each array of walk's, in reverse order
    """walk's steps backward: at(name, d) gets the gradient reaching each array from the steps after it, and returns
    the gradient to carry back from it (d itself, or d with an edit's share held fixed)."""
    n_blocks = len(params["blocks"])
    d_logits = at("logits", np.zeros_like(arrays["logits"]))
    d_ln_f = at("ln_f", linear_input_backward(d_logits, params["wte"].T))  # logits = ln_f wteᵀ
    d_x = normed_backward(at, "ln_f", d_ln_f, arrays[f"blocks.{n_blocks - 1}.out"], params["ln_f"]["g"])
    for i in reversed(range(n_blocks)):
        steps = {name.partition(f"blocks.{i}.")[2]: array for name, array in arrays.items()
                 if name.startswith(f"blocks.{i}.")}
        block_input = arrays["embed"] if i == 0 else arrays[f"blocks.{i - 1}.out"]
        d_x = block_backward(at(f"blocks.{i}.out", d_x), block_input, steps, **params["blocks"][i], n_head=n_head,
                             at=functools.partial(in_block, at, i))
    at("embed", d_x)


def in_block(at, i, name, d):  # -> at's gradient for block i's step `name`, named as trace names it
    return at(f"blocks.{i}.{name}", d)


def block_backward(d_out, x, steps, ln_1, attn, ln_2, mlp, n_head, at):  # [n_seq, n_embd] x2, {step: array} -> d_x
    """block_trace's steps in reverse: from the gradient at the block's output to the gradient at its input x, calling
    at(step, d) at each step's array, whose answer is carried back."""
    d_mlp_out = at("mlp.out", d_out)  # out = mid + mlp.out
    d_hidden = linear_input_backward(d_mlp_out, mlp["c_proj"]["w"])
    d_pre = at("mlp.pre", gelu_backward(at("mlp.hidden", d_hidden), steps["mlp.pre"]))
    d_ln_2 = at("ln_2", linear_input_backward(d_pre, mlp["c_fc"]["w"]))
    d_mid = at("mid", d_out + normed_backward(at, "ln_2", d_ln_2, steps["mid"], ln_2["g"]))  # both of mid's readers
    # attn.out = merge_heads(z) c_proj: back through the product, then split into heads as z is
    d_z = at("attn.z", split_heads(linear_input_backward(at("attn.out", d_mid), attn["c_proj"]["w"]), n_head))
    d_weights, d_v = weighted_sum_backward(d_z, steps["attn.weights"], steps["attn.v"])
    d_scores = at("attn.scores", softmax_backward(at("attn.weights", d_weights), steps["attn.weights"]))
    d_q, d_k = attention_scores_backward(d_scores, steps["attn.q"], steps["attn.k"])
    d_qkv = np.concatenate([merge_heads(at(f"attn.{name}", d)) for name, d in zip("qkv", (d_q, d_k, d_v))], axis=-1)
    d_ln_1 = at("ln_1", linear_input_backward(d_qkv, attn["c_attn"]["w"]))
    return d_mid + normed_backward(at, "ln_1", d_ln_1, x, ln_1["g"])  # mid = x + attn.out, x = ln_1's input


def normed_backward(at, name, d_out, x, g):  # [..., n_embd] -> d_x: back through the gain (name = g name.normalized
    # + b), at(name.normalized, d), then the normalisation of x
    d_normalized = at(f"{name}.normalized", g * d_out)
    return layer_norm_backward(d_normalized, x, np.ones_like(g))[0]


def logit_difference(answer, other, position=-1):  # -> metric: logit(answer) - logit(other) at `position`
    """The metric of activation patching (--patch) and of attribution patching: how much more the model predicts
    token `answer` than token `other` at `position` (the last by default)."""
    def metric(arrays):  # -> value, {"logits": d value / d logits}
        logits = arrays["logits"]  # [n_seq, n_vocab]
        check_answers((answer, other), logits.shape[-1])  # a ValueError that names the token, not NumPy's
        d_logits = np.zeros_like(logits)
        d_logits[position, answer], d_logits[position, other] = 1, -1
        return float(logits[position, answer] - logits[position, other]), {"logits": d_logits}
    return metric


def next_token_loss(ids):  # int [n_seq] -> metric: the mean cross-entropy of each next token, as training's loss
    def metric(arrays):  # -> value, {"logits": d value / d logits}
        logits = arrays["logits"]  # [n_seq, n_vocab]: the last position predicts no token of ids
        loss, d_logits = cross_entropy(logits[:-1], np.asarray(ids)[1:])
        return loss, {"logits": np.concatenate([d_logits, np.zeros_like(logits[-1:])]).astype(logits.dtype)}
    return metric
