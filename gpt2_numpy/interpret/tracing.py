"""Every activation of one forward pass by name, and the logit lens: model.py's functions composed in the order
model.gpt2 and model.block run them, so each array is the one the textbook model computes, never a second copy of its
formulas. float32 throughout, as the model is. The names (names.py holds them, and TransformerLens's for each):

    embed                                  [n_seq, n_embd]      wte[inputs] + wpe[positions], the residual stream
    blocks.{i}.ln_1.normalized             [n_seq, n_embd]      layer_norm(x, 1, 0): before the gain and bias
    blocks.{i}.ln_1                        [n_seq, n_embd]      layer_norm(x, **ln_1)
    blocks.{i}.attn.q / .k / .v            [n_head, n_seq, d_head]
    blocks.{i}.attn.scores                 [n_head, n_seq, n_seq]  attention_scores(q, k): q kᵀ / √d_head, unmasked
    blocks.{i}.attn.weights                [n_head, n_seq, n_seq]  softmax(scores + causal_mask): rows sum to 1
    blocks.{i}.attn.z                      [n_head, n_seq, d_head]  weighted_sum(weights, v): each head's output
    blocks.{i}.attn.out                    [n_seq, n_embd]      linear(merge_heads(z), **c_proj): mha's output
    blocks.{i}.mid                         [n_seq, n_embd]      x + attn.out, the stream after attention
    blocks.{i}.ln_2.normalized             [n_seq, n_embd]      layer_norm(mid, 1, 0)
    blocks.{i}.ln_2                        [n_seq, n_embd]      layer_norm(mid, **ln_2)
    blocks.{i}.mlp.pre / .hidden           [n_seq, 4 n_embd]    linear(ln_2, **c_fc), then its gelu
    blocks.{i}.mlp.out                     [n_seq, n_embd]      linear(hidden, **c_proj): ffn's output
    blocks.{i}.out                         [n_seq, n_embd]      mid + mlp.out, the stream after the block
    ln_f.normalized                        [n_seq, n_embd]      layer_norm(last out, 1, 0)
    ln_f                                   [n_seq, n_embd]      layer_norm(last out, **ln_f)
    logits                                 [n_seq, n_vocab]     ln_f · wteᵀ
"""
import functools

import numpy as np

from gpt2_numpy.checks import check_heads, check_inputs
from gpt2_numpy.model import (
    attention_scores,
    block,
    causal_mask,
    gelu,
    layer_norm,
    linear,
    merge_heads,
    softmax,
    split_heads,
    weighted_sum,
)


def unedited(name, array):  # -> array: trace's default edit, which keeps every array as the model made it
    return array


def trace(inputs, params, n_head, edit=unedited):  # int [n_seq] -> {name: float32 array}, the module docstring's names
    """Every intermediate array of model.gpt2(inputs, **params, n_head=n_head), by name, in the order it runs them.
    edit(name, array) -> array, when given, replaces each array as it is made, and everything after is computed from
    the replacement (interpret/edits.py builds edits); without it the arrays are model.gpt2's own."""
    return dict(walk(inputs, params, n_head, edit))


def walk(inputs, params, n_head, edit=unedited, start_at_layer=None):  # -> iterator of (name, array), in run order
    """trace's arrays one at a time, each made only when asked for (a caller that stops early skips the rest). With
    start_at_layer=L, inputs is the residual stream entering block L, [..., n_seq, n_embd], and the walk starts there
    (TransformerLens's start_at_layer): no embed, no blocks before L."""
    x, first = inputs, start_at_layer or 0
    if start_at_layer is None:
        x = edit("embed", embedding(inputs, params["wte"], params["wpe"]))
        yield "embed", x
    for i, steps in enumerate(block_traces(x, params["blocks"], n_head, edit, first), first):
        yield from ((f"blocks.{i}.{name}", array) for name, array in steps.items())
        x = steps["out"]
    made = {}

    def step(name, array):  # -> the array as edited, kept to be yielded
        made[name] = edit(name, array)
        return made[name]

    normed = normed_step(step, "ln_f", x, params["ln_f"])
    yield from made.items()
    yield "logits", edit("logits", unembedding(normed, params["wte"]))


def block_traces(x, blocks, n_head, edit=unedited, first=0):  # [..., n_seq, n_embd] -> iterator of {name: array}
    # x enters block `first`, and the blocks from there run (walk's start_at_layer: a run that is another run up to
    # block `first`, as activation patching's are, need not repeat it)
    check_heads(n_head, x.shape[-1])  # the error gpt2 and generate give, not NumPy's from split_heads
    for i, block_params in enumerate(blocks[first:], first):
        steps = block_trace(x, **block_params, n_head=n_head, edit=functools.partial(in_block, edit, i))
        yield steps
        x = steps["out"]  # the next block's input, as model.gpt2's loop carries it


def in_block(edit, i, name, array):  # -> edit's array for block i's step `name`, named as trace names it
    return edit(f"blocks.{i}.{name}", array)


def block_trace(x, ln_1, attn, ln_2, mlp, n_head, edit=unedited):  # [..., n_seq, n_embd] -> {name: array}, block's
    """model.block on x, one named array per step: mha's and ffn's bodies composed of the same model.py functions;
    each step reads the arrays before it as edit(name, array) left them."""
    steps = {}

    def step(name, array):  # -> the array as edited, recorded under its name
        steps[name] = edit(name, array)
        return steps[name]

    normed = normed_step(step, "ln_1", x, ln_1)
    q, k, v = np.split(linear(normed, **attn["c_attn"]), 3, axis=-1)  # mha's first line
    q, k, v = [step(f"attn.{name}", split_heads(part, n_head)) for name, part in zip("qkv", (q, k, v))]
    scores = step("attn.scores", attention_scores(q, k))
    weights = step("attn.weights", softmax(scores + causal_mask(x.shape[-2])))  # model.attention's first line
    z = step("attn.z", weighted_sum(weights, v))  # and its second
    mid = step("mid", x + step("attn.out", linear(merge_heads(z), **attn["c_proj"])))  # block's first residual
    normed = normed_step(step, "ln_2", mid, ln_2)
    hidden = step("mlp.hidden", gelu(step("mlp.pre", linear(normed, **mlp["c_fc"]))))  # ffn, step by step
    step("out", mid + step("mlp.out", linear(hidden, **mlp["c_proj"])))  # block's second residual
    return steps


def normed_step(step, name, x, norm):  # [..., n_seq, n_embd] -> layer_norm(x, **norm), in two steps, each
    # step(name, array)'s: name.normalized, the output before the gain and bias (TransformerLens's hook_normalized),
    # then name. Unedited, name is layer_norm's own output, bit for bit; an edited name.normalized goes on through the
    # gain and bias
    normalized = layer_norm(x, 1, 0)  # 1 · (x - mean) / σ + 0: those bits exactly
    kept = step(f"{name}.normalized", normalized)
    return step(name, layer_norm(x, **norm) if kept is normalized else norm["g"] * kept + norm["b"])


def embedding(inputs, wte, wpe):  # int [n_seq] -> [n_seq, n_embd]: model.gpt2's first line
    # checked first: NumPy would wrap a negative id silently, and wpe would run short past the context
    inputs = check_inputs(inputs, n_vocab=wte.shape[0], n_ctx=wpe.shape[0])
    return wte[inputs] + wpe[np.arange(inputs.shape[-1])]


def unembedding(x, wte):  # [n_seq, n_embd] -> [n_seq, n_vocab]: model.gpt2's last product, the tied output head
    return x @ wte.T


def attention_weights(inputs, params, n_head):  # int [n_seq] -> float32 [n_layer, n_head, n_seq, n_seq]
    """The softmax attention weights of every head of every layer: [layer, head, i, j] is how much position i attends
    to position j (0 for j > i; each row sums to 1). Keeps only the weights, not the whole trace."""
    return np.stack(list(layer_weights(inputs, params, n_head)))


def layer_weights(inputs, params, n_head):  # -> iterator of n_layer float32 arrays [n_head, n_seq, n_seq]
    for steps in block_traces(embedding(inputs, params["wte"], params["wpe"]), params["blocks"], n_head):
        yield steps["attn.weights"]


def residual_stream(inputs, params, n_head):  # -> iterator of n_layer + 1 arrays [n_seq, n_embd]
    # the embedding, then each block's output, carried by model.block itself
    x = embedding(inputs, params["wte"], params["wpe"])
    check_heads(n_head, x.shape[-1])
    yield x
    for block_params in params["blocks"]:
        x = block(x, **block_params, n_head=n_head)
        yield x


def logit_lens(inputs, params, n_head):  # int [n_seq] -> float32 [n_layer + 1, n_seq, n_vocab]
    """The logit lens: log-probabilities of the next token read from the residual stream after the embedding (row 0)
    and after each block (row i + 1), each sent through ln_f and the tied head as if the model ended there. ln_f's
    mean and variance are computed afresh from each layer's stream (layer_norm does), never reused from the last
    layer's. The last row is log_softmax of model.gpt2's logits."""
    return np.stack(list(lens_layers(inputs, params, n_head)))


def lens_layers(inputs, params, n_head, positions=slice(None)):  # -> iterator of n_layer + 1 float32 [n, n_vocab]
    # positions: the rows to read; the lens is per position, so a long prompt's table unembeds only what it shows
    for x in residual_stream(inputs, params, n_head):
        yield lens(x[positions], params["ln_f"], params["wte"])


def lens(x, ln_f, wte):  # [n, n_embd] -> [n, n_vocab]: log-probabilities of the next token, read from stream x
    return log_softmax(unembedding(layer_norm(x, **ln_f), wte))  # x's own mean and variance: layer_norm's, per row


def no_progress(items, total):  # -> items: the default progress= of the loops over layers; a command passes a bar
    return items


def log_softmax(x):  # [..., n] -> [..., n]: log(softmax(x)), which would underflow to -inf for unlikely tokens
    shifted = x - np.max(x, axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
