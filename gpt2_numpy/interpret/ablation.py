"""--ablate: switch heads off and see what changes. A head's output attn.z [n_seq, d_head] is replaced at every
position, in the run itself (edits.py), so later layers see the change:

    zero   z ← 0
    mean   z ← mean over the prompt's positions of z (the run's own z, as it reaches the head: an earlier ablated
           head has already changed it)

The effect is read twice, before (trace) and after (run_with_edits):
    loss        mean over positions i < n_seq - 1 of -log softmax(logits[i])[ids[i + 1]], the next-token loss
    next token  the TOP most likely tokens after the last position, softmax(logits[-1])
"""
import math

import numpy as np

from gpt2_numpy.interpret.edits import Edit, run_with_edits
from gpt2_numpy.interpret.heads import json_number
from gpt2_numpy.interpret.stepwise import fit
from gpt2_numpy.interpret.tracing import log_softmax, trace
from gpt2_numpy.model import softmax
from gpt2_numpy.checks import check_finite

TOP = 5  # next tokens shown before and after


def zero_ablation(z):  # [n_seq, d_head] -> [n_seq, d_head]
    return np.zeros_like(z)


def mean_ablation(z):  # [n_seq, d_head] -> [n_seq, d_head]: each position gets the mean over positions
    return np.broadcast_to(z.mean(axis=0), z.shape)


ABLATIONS = {"zero": zero_ablation, "mean": mean_ablation}


def ablation_edits(heads, how):  # [(layer, head)], "zero" | "mean" -> [Edit], one per head
    return [Edit(f"blocks.{layer}.attn.z", ABLATIONS[how], head) for layer, head in heads]


def ablation(ids, params, n_head, heads, how):  # -> {"before": prediction, "after": prediction}
    """The loss and the next tokens (prediction) on token ids `ids`, as the model runs and with `heads` ([(layer,
    head)]) ablated the `how` way ("zero" or "mean"). NonFiniteError when the model computes NaN or infinity."""
    before = trace(ids, params, n_head)["logits"]
    after = run_with_edits(ids, params, n_head, ablation_edits(heads, how))["logits"]
    return {"before": prediction(before, ids), "after": prediction(after, ids)}


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


def ablation_json(ids, heads, how, result, text):  # -> the JSON-ready object --ablate --json prints
    """text(token_id) -> a token's text."""
    return {"prompt_ids": [int(token_id) for token_id in ids], "ablated": [[layer, head] for layer, head in heads],
            "ablation": how, "loss": {when: json_number(result[when][0]) for when in ("before", "after")},
            "next_token": {when: [{"id": int(token_id), "token": text(token_id), "prob": float(prob)}
                                  for token_id, prob in zip(*result[when][1:])] for when in ("before", "after")}}


def ablation_table(ids, heads, how, result, label):  # -> the text --ablate prints; label(token_id) names a token
    (loss_before, top_before, probs_before), (loss_after, top_after, probs_after) = result["before"], result["after"]
    names = ", ".join(f"{layer}.{head}" for layer, head in heads)
    whose = "head {}: its" if len(heads) == 1 else "heads {}: each head's"
    done = "set to zero at every position" if how == "zero" else "replaced by its mean over the prompt's positions"
    lines = [f"Ablation of {whose.format(names + ' (layer.head)')} attn.z {done}", ""]
    if math.isnan(loss_before):
        lines.append("mean next-token loss: none (a prompt of one token has no next token inside it)")
    else:
        lines.append(f"mean next-token loss over the prompt: {loss_before:.4f} before, {loss_after:.4f} after "
                     f"({loss_after - loss_before:+.4f})")
    lines += ["", f"{'':4}{'before':>28}{'after':>28}"]
    for rank, row in enumerate(zip(top_before, probs_before, top_after, probs_after), start=1):
        lines.append(f"{rank:4}" + "".join(f"{fit(label(token_id), 19):>20} {prob:7.4f}"
                                           for token_id, prob in zip(row[::2], row[1::2])))
    return "\n".join(lines) + "\n"

