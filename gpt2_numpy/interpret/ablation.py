"""--ablate: switch heads off and see what changes. A head's output attn.z [n_seq, d_head] is replaced at every
position, in the run itself (edits.py), so later layers see the change:

    zero   z[i] ← 0
    mean   z[i] ← the mean of the head's z at position i over reference windows: token ids [n_windows, n_seq] of
           other text, run through the model unablated (TransformerLens's mean ablation: a mean over a dataset, at
           the same position)

The mean never reads the prompt, so the logits at position i still depend on tokens 0 .. i alone, as the model's do;
a mean over the prompt's own positions would let position i see the tokens after it, the one it is scored against
among them. Nor does it depend on the prompt's length: the windows have one fixed length, the model's context (or the
whole text, when it is shorter), so a prompt and its prefix get the same means at the positions they share, and the
prefix's numbers never depend on what follows it. Only the first len(prompt) positions of each window are run: the
model is causal, so they are the whole window's first positions. Position i's mean comes from position i, since z
carries the position's embedding: a reference shorter than the prompt is refused, not stretched. reference_windows
cuts a text's token ids into such windows.

The effect is read twice, before (trace) and after (run_with_edits):
    loss        mean over positions i < n_seq - 1 of -log softmax(logits[i])[ids[i + 1]], the next-token loss
    next token  the TOP most likely tokens after the last position, softmax(logits[-1])
"""
import functools
import math

import numpy as np

from gpt2_numpy.interpret.edits import Edit, check_index, run_with_edits
from gpt2_numpy.interpret.tracing import log_softmax, trace
from gpt2_numpy.model import softmax
from gpt2_numpy.checks import check_finite

TOP = 5  # next tokens shown before and after
ABLATIONS = ("zero", "mean")
REFERENCE_TOKENS = 2048  # a reference's tokens used at most: its first windows, which a long text has plenty of


def ablation(ids, params, n_head, heads, how, reference=None):  # -> {"before": prediction, "after": prediction}
    """The loss and the next tokens (prediction) on token ids `ids`, as the model runs and with `heads` ([(layer,
    head)]) ablated the `how` way: "zero", or "mean" over `reference`, token ids [n_windows, n_ref] with n_ref >=
    len(ids) (reference_windows makes them from a text). ValueError for a layer or head out of range, or a missing
    or short reference; NonFiniteError when the model computes NaN or infinity."""
    check_ablation(heads, how, len(params["blocks"]), n_head)
    edits = ablation_edits(heads, how, reference_means(reference, params, n_head, heads, len(ids), how))
    before = trace(ids, params, n_head)["logits"]
    after = run_with_edits(ids, params, n_head, edits)["logits"]
    return {"before": prediction(before, ids), "after": prediction(after, ids)}


def check_ablation(heads, how, n_layer, n_head):  # -> None; ValueError for an unknown way or a head out of range
    if how not in ABLATIONS:
        raise ValueError(f"ablation {how!r} is not one of {', '.join(ABLATIONS)}")
    for layer, head in heads:
        check_index(layer, n_layer, "ablated layer", "layer")
        check_index(head, n_head, "ablated head", "head", " per layer")


def ablation_edits(heads, how, means=None):  # -> [Edit], one per head; means: reference_means's, for "mean"
    if how == "zero":
        return [Edit(f"blocks.{layer}.attn.z", np.zeros_like, head) for layer, head in heads]
    return [Edit(f"blocks.{layer}.attn.z", functools.partial(replaced_by, means[layer][head]), head)
            for layer, head in heads]


def replaced_by(value, z):  # [n_seq, d_head], [n_seq, d_head] -> value: z's replacement, whatever z was
    return value


def reference_means(reference, params, n_head, heads, n_seq, how):  # -> {layer: mean z [n_head, n_seq, d_head]}
    """Each ablated layer's attn.z averaged over the windows of `reference` at each of the first n_seq positions, from
    one unablated run of them all; None for a zero ablation, which needs none."""
    if how != "mean":
        return None
    if reference is None:
        raise ValueError("a mean ablation needs reference token ids [n_windows, n_ref]: the mean at each position is "
                         "taken over other text, never over the prompt, whose later tokens it would let in")
    windows = np.atleast_2d(np.asarray(reference))
    if windows.shape[-1] < n_seq:
        raise ValueError(f"the reference windows are {windows.shape[-1]} tokens, shorter than the prompt's {n_seq}: "
                         "a position's mean comes from that position")
    layers = sorted({layer for layer, _ in heads})
    names = run_with_edits(windows[:, :n_seq], params, n_head, [], names=[f"blocks.{layer}.attn.z" for layer in layers])
    return {layer: names[f"blocks.{layer}.attn.z"].mean(axis=0) for layer in layers}


def reference_windows(token_ids, n_ctx):  # int [n] -> int [n_windows, min(n_ctx, n)]: the text's consecutive windows
    """The first windows of min(n_ctx, n) consecutive ids (REFERENCE_TOKENS at most, at least one window): one length
    whatever the prompt, the model's context n_ctx, or the whole text when it is shorter. ValueError for no token."""
    token_ids = np.asarray(token_ids)
    if len(token_ids) == 0:
        raise ValueError("the reference text has no token: a position's mean comes from that position of other text")
    n_seq = min(n_ctx, len(token_ids))
    n_windows = min(len(token_ids) // n_seq, max(1, REFERENCE_TOKENS // n_seq))
    return token_ids[:n_windows * n_seq].reshape(n_windows, n_seq)


def prediction(logits, ids):  # [n_seq, n_vocab], int [n_seq] -> (loss or NaN, top ids [TOP], their probabilities)
    check_finite(logits)
    probabilities = softmax(logits[-1])
    top = np.argsort(-probabilities, kind="stable")[:TOP]  # ties keep the lower id first
    return next_token_loss(logits, ids), top, probabilities[top]


def next_token_loss(logits, ids):  # [n_seq, n_vocab], int [n_seq] -> float; NaN for one token, which has no next
    if len(ids) < 2:
        return math.nan
    log_probs = log_softmax(logits[:-1])
    return float(-np.mean(log_probs[np.arange(len(ids) - 1), np.asarray(ids[1:])]))
