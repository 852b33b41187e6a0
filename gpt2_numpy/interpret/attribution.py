"""--attribute: direct logit attribution. At the last position the residual stream x entering ln_f is a sum of what
each part wrote into it:

    x = embed + Σ_L (Σ_H head_{L,H} + bias_L + mlp_L)
        embed        wte[ids] + wpe[positions]                        trace's "embed"
        head_{L,H}   z_{L,H} @ c_proj.w[H d_head : (H+1) d_head]      the head's output through its rows of c_proj.w
        bias_L       c_proj.b                                         attention's output bias
        mlp_L        trace's "blocks.{L}.mlp.out"

ln_f(x) = g (x - mean(x)) / σ + b, with σ = √(var(x) + eps) the final stream's own, is linear in x once σ is fixed,
so the logit difference logit(A) - logit(B) = ln_f(x) · d, with d = wte[A] - wte[B], splits into one term per part:

    term(c) = (g (c - mean(c)) / σ) · d        for each part c above, and   term(ln_f.b) = b · d

They add up to the logit difference, to float error. The parts are read from one unedited run_with_edits (edits.py),
which keeps only the arrays named here.
"""
import inspect

import numpy as np

from gpt2_numpy.interpret.edits import check_index, run_with_edits
from gpt2_numpy.model import layer_norm
from gpt2_numpy.checks import check_finite

EPS = inspect.signature(layer_norm).parameters["eps"].default  # model.layer_norm's, which ln_f divides with


def attribution(ids, params, n_head, answers):  # int [n_seq], (A, B) -> (logit_diff, [(name, term)])
    """logit(A) - logit(B) at the last position of token ids `ids`, as the model computes it, and its terms, one per
    writer of the residual stream, in the model's order: embed; blocks.{L}.attn.head.{H} for each head, then
    blocks.{L}.attn.bias and blocks.{L}.mlp, layer by layer; ln_f.b. ValueError for an answer outside the
    vocabulary; NonFiniteError for NaN or infinity."""
    a, b = check_answers(answers, params["wte"].shape[0])
    n_layer = len(params["blocks"])
    names = run_with_edits(ids, params, n_head, [], names=["embed", "logits", *(
        f"blocks.{layer}.{name}" for layer in range(n_layer) for name in ("attn.z", "mlp.out", "out"))])
    check_finite(names["logits"][-1])
    direction = (params["wte"][a] - params["wte"][b]).astype(np.float64)  # [n_embd]; float64: the terms' sum exact
    x = names[f"blocks.{len(params['blocks']) - 1}.out"][-1] if params["blocks"] else names["embed"][-1]
    sigma = np.sqrt(np.var(x.astype(np.float64)) + EPS)
    g, bias = params["ln_f"]["g"], params["ln_f"]["b"]
    terms = [(name, float(through_ln_f(part, g, sigma) @ direction)) for name, part in writers(names, params, n_head)]
    terms.append(("ln_f.b", float(bias.astype(np.float64) @ direction)))
    return float(names["logits"][-1][a] - names["logits"][-1][b]), terms


def check_answers(answers, n_vocab):  # -> (A, B); ValueError unless two token ids of the vocabulary
    # NumPy would take -1 as the last token, and wte[n_vocab] fails with an IndexError that names nothing
    if len(answers) != 2:
        raise ValueError(f"answers are two token ids (A, B), got {len(answers)}")
    for answer in answers:
        check_index(answer, n_vocab, "answer token id", "token")
    return tuple(answers)


def writers(names, params, n_head):  # -> [(name, [n_embd])]: what each part wrote into the last position's stream
    parts = [("embed", names["embed"][-1])]
    for layer, block in enumerate(params["blocks"]):
        c_proj = block["attn"]["c_proj"]
        heads = head_outputs(names[f"blocks.{layer}.attn.z"][:, -1], c_proj["w"])
        parts += [(f"blocks.{layer}.attn.head.{head}", out) for head, out in enumerate(heads)]
        parts += [(f"blocks.{layer}.attn.bias", c_proj["b"]),
                  (f"blocks.{layer}.mlp", names[f"blocks.{layer}.mlp.out"][-1])]
    return parts


def head_outputs(z, w):  # [n_head, d_head], [n_embd, n_embd] -> [n_head, n_embd]: each head's z through its rows of w
    # merge_heads(z) @ w, the attention output before its bias, is the sum of these over the heads
    n_head, d_head = z.shape
    return np.einsum("hd,hde->he", z, w.reshape(n_head, d_head, -1))


def through_ln_f(part, g, sigma):  # [n_embd] -> float64 [n_embd]: a part of the stream as ln_f scales it, no bias
    part = part.astype(np.float64)
    return g * (part - part.mean()) / sigma
