"""The attention blog posts' walkthrough, on GPT-2's own weights and the reader's own sentence: the arrays of one
forward pass with one block step by step, and the four printed sections of `python -m gpt2_numpy.explain`.

Every array comes from tracing.py, which composes model.py's functions in the order model.block runs them; the only
arrays added here are the ones the blogs print and the model never forms (q·kᵀ before its scaling, the masked scores).
"""
import math

import numpy as np

from gpt2_numpy.console import plural
from gpt2_numpy.checks import check_finite
from gpt2_numpy.errors import UsageError
from gpt2_numpy.interpret.tracing import block_trace, embedding, no_progress, residual_stream, unembedding
from gpt2_numpy.model import causal_mask, layer_norm, merge_heads, softmax

SHOWN = 8  # rows, columns and dimensions of one head's matrices printed: a longer prompt shows its top-left corner
TOP_K = 5  # next tokens listed in the prediction
LABEL_WIDTH = 15  # characters of a token's label: '<|endoftext|>' with its quotes


def walkthrough(inputs, params, n_head, layer, progress=no_progress):  # [n_seq] -> {step name: array}
    """One forward pass of model.gpt2 with the arrays a reader follows, in the order the code runs them: "wte" and
    "wpe" (the rows gpt2 adds), "embed", "mask", "x" (block `layer`'s input), that block's steps by their trace names
    ("ln_1", "attn.q", ..., "out"; see tracing.py) with the blogs' "qk" (q·kᵀ unscaled), "masked" (scores + mask) and
    "merged" (merge_heads of the heads' outputs), then "ln_f" and "logits". UsageError when there is no such layer,
    NonFiniteError when the logits are NaN or infinite. progress(items, total) wraps the loop over the layers."""
    check_index(layer, len(params["blocks"]), "layer", "layer")
    wte, wpe = params["wte"], params["wpe"]
    x = embedding(inputs, wte, wpe)  # first: it checks the ids
    n_seq = x.shape[-2]
    steps = {"wte": wte[np.asarray(inputs)], "wpe": wpe[:n_seq], "embed": x, "mask": causal_mask(n_seq)}
    # n_layer + 1 arrays [n_seq, n_embd], model.block's
    stream = list(progress(residual_stream(inputs, params, n_head), len(params["blocks"]) + 1))
    steps["x"] = stream[layer]
    steps.update(block_trace(steps["x"], **params["blocks"][layer], n_head=n_head))
    q, k = steps["attn.q"], steps["attn.k"]
    steps["qk"] = q @ k.swapaxes(-1, -2)  # the blogs' unscaled product, shown only: attention_scores divides it
    steps["masked"] = steps["attn.scores"] + steps["mask"]  # what attention adds before its softmax
    steps["merged"] = merge_heads(steps["attn.z"])
    steps["ln_f"] = layer_norm(stream[-1], **params["ln_f"])
    steps["logits"] = unembedding(steps["ln_f"], wte)
    check_finite(steps["logits"])  # every weight the walkthrough shows feeds the logits: a NaN among them shows here
    return steps


def check_index(value, count, flag, noun, where=""):  # -> None, or UsageError naming the valid range
    if not 0 <= value < count:
        raise UsageError(f"{flag} {value} is out of range: this model has {plural(count, noun)}{where}, numbered 0 "
                         f"to {count - 1}")


# --- The printed walkthrough ---


def report(prompt, ids, label, steps, hparams, layer, head):  # -> the walkthrough's text, every section
    """The four sections `python -m gpt2_numpy.explain` prints, from walkthrough()'s steps for `layer` on the token
    ids of `prompt`; label(token_id) names a token (see token_label)."""
    labels = [label(token_id) for token_id in ids]
    sections = [
        tokens_section(prompt, ids, labels),
        shapes_section(steps, hparams, layer),
        head_section(steps, labels, layer, head),
        prediction_section(steps["logits"][-1], label),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"


def tokens_section(prompt, ids, labels):  # -> lines: each token's position, id and text
    lines = [f"1. Tokens: the prompt is {plural(len(ids), 'token')}"]
    if not prompt:
        lines[0] += " (an empty prompt starts from <|endoftext|>, as generate does)"
    lines.append(f"  {'position':>8}  {'id':>6}  token")
    lines += [f"  {position:>8}  {token_id:>6}  {label}" for position, (token_id, label) in enumerate(zip(ids, labels))]
    return lines


def shapes_section(steps, hparams, layer):  # -> lines: the shape of every step, in the order the code runs it
    n_head, n_layer = hparams["n_head"], hparams["n_layer"]
    d_head = hparams["n_embd"] // n_head
    n_seq, n_embd = steps["x"].shape
    before = [
        ("gpt2", "wte[inputs]", "token embeddings", shape(steps["wte"])),
        ("gpt2", "wpe[positions]", "position embeddings", shape(steps["wpe"])),
        ("gpt2", "wte[inputs] + wpe[positions]", "x, the residual stream", shape(steps["embed"])),
        ("causal_mask", "causal_mask(n_seq)", "-inf above the diagonal", shape(steps["mask"])),
    ]
    one_block = [
        ("layer_norm", "layer_norm(x, **ln_1)", "", shape(steps["ln_1"])),
        ("linear", "linear(·, **c_attn)", "q, k, v side by side", f"[{n_seq}, {3 * n_embd}]"),
        ("mha", "np.split(·, 3, axis=-1)", "q, k, v: thirds of the last axis", f"3 × [{n_seq}, {n_embd}]"),
        ("split_heads", "split_heads(q, n_head), k, v", f"{n_head} heads of {d_head} each",
         "3 × " + shape(steps["attn.q"])),
        ("attention_scores", "attention_scores(q, k)", "q·kᵀ / √d_head, per head", shape(steps["attn.scores"])),
        ("softmax", "softmax(scores + mask)", "attention weights", shape(steps["attn.weights"])),
        ("attention", "attention(q, k, v, mask)", "weights · v, per head", shape(steps["attn.z"])),
        ("merge_heads", "merge_heads(·)", "the heads side by side", shape(steps["merged"])),
        ("linear", "linear(·, **c_proj)", "mha's output", shape(steps["attn.out"])),
        ("block", "x + mha(...)", "residual", shape(steps["mid"])),
        ("layer_norm", "layer_norm(x, **ln_2)", "", shape(steps["ln_2"])),
        ("linear", "linear(·, **c_fc)", "4× wider", shape(steps["mlp.pre"])),
        ("gelu", "gelu(·)", "", shape(steps["mlp.hidden"])),
        ("linear", "linear(·, **c_proj)", "ffn's output, back to n_embd", shape(steps["mlp.out"])),
        ("block", "x + ffn(...)", "residual: the block's output", shape(steps["out"])),
    ]
    after = [
        ("gpt2", f"for block in blocks: × {n_layer}", f"block after block, {plural(n_layer, 'layer')}",
         shape(steps["out"])),
        ("layer_norm", "layer_norm(x, **ln_f)", "", shape(steps["ln_f"])),
        ("gpt2", "· @ wte.T", "one logit per vocabulary token", shape(steps["logits"])),
    ]

    def row_lines(rows):
        return [f"  {function:<18} {step:<30} {step_shape:<18} {what}".rstrip()
                for function, step, what, step_shape in rows]

    return ["2. Shape flow: one forward pass of gpt2(), step by step (search model.py for the function's name)",
            f"  {'function':<18} {'step':<30} {'shape':<18} what", *row_lines(before),
            f"  -- block {layer}: one block; the {plural(n_layer, 'block')} all have these shapes --",
            *row_lines(one_block), *row_lines(after)]


def shape(array):  # -> "[5, 768]"
    return "[" + ", ".join(map(str, array.shape)) + "]"


def head_section(steps, labels, layer, head):  # -> lines: one head's attention, matrix by matrix
    n_seq = len(steps["mask"])
    d_head = steps["attn.q"].shape[-1]
    shown = min(n_seq, SHOWN)
    lines = [
        f"3. One head, step by step: layer {layer}, head {head} (d_head = {d_head})",
        "  Rows are the queries (the token that looks), columns the keys (the tokens it looks at).",
        f"  this head's q, k and v: split_heads(·, n_head)[{head}] of each third, {shape(steps['attn.q'][head])} "
        "each",
    ]
    if n_seq > SHOWN:
        lines.append(f"  (a long prompt: showing the first {shown} of {n_seq} positions, the top-left corner; the "
                     "row sums cover whole rows)")
    corner = (slice(0, shown), slice(0, shown))
    matrices = [
        ("q·kᵀ: each query dotted with each key", steps["qk"][head], 2),
        (f"÷ √d_head = √{d_head} = {math.sqrt(d_head):g}: attention_scores(q, k)", steps["attn.scores"][head], 2),
        ("causal_mask: 0 where a query may look, -inf at later positions", steps["mask"], 0),
        ("masked scores: scores + mask", steps["masked"][head], 2),
    ]
    for title, matrix, digits in matrices:
        lines += ["", f"  {title}"] + matrix_lines(matrix[corner], labels[:shown], labels[:shown], digits)
    weights = steps["attn.weights"][head]
    lines += ["", "  softmax(masked scores): the attention weights; every row sums to 1, and the future gets exactly 0"]
    lines += matrix_lines(weights[corner], labels[:shown], labels[:shown], 3, row_sums=weights.sum(-1)[:shown])
    n_dims = min(d_head, SHOWN)
    lines += ["", f"  attention(q, k, v, mask): weights · v, this head's output (first {n_dims} of {d_head} dims)"]
    dims = [f"dim {dim}" for dim in range(n_dims)]
    lines += matrix_lines(steps["attn.z"][head, :shown, :n_dims], labels[:shown], dims, 3)
    lines += ["", "  Dropout: none. The blog posts drop weights at random in training; GPT-2 inference uses them all."]
    return lines


def matrix_lines(matrix, row_labels, column_labels, digits, row_sums=None):  # [n_rows, n_cols] -> lines
    # a fixed-width table: each column as wide as its widest entry, labels cut to fit
    cells = [[number(value, digits) for value in row] for row in matrix]
    width = max(9, *(len(cell) + 1 for row in cells for cell in row))
    header = "".join(f"{cut(label, width - 1):>{width}}" for label in column_labels)
    lines = [f"  {'':<{LABEL_WIDTH + 4}}{header}" + (f"{'row sum':>9}" if row_sums is not None else "")]
    for position, (label, row) in enumerate(zip(row_labels, cells)):
        line = f"  {position:>3} {label:<{LABEL_WIDTH}}" + "".join(f"{cell:>{width}}" for cell in row)
        lines.append(line + (f"{row_sums[position]:>9.4f}" if row_sums is not None else ""))
    return lines


def number(value, digits):  # -> text of one matrix entry
    if value == 0:
        return "0"  # exactly: the softmax of -inf, told apart from a small weight that rounds to 0.000
    if np.isinf(value):
        return str(float(value))  # "-inf", the mask
    return f"{value:.{digits}f}"


def cut(text, width):  # -> text of at most width characters, ending in "…" when shortened
    return text if len(text) <= width else text[: width - 1] + "…"


def prediction_section(last_logits, label):  # -> lines: the TOP_K most likely next tokens
    probabilities = softmax(last_logits)
    top = np.argsort(-probabilities, kind="stable")[:TOP_K]
    lines = [f"4. The prediction: the {TOP_K} most likely next tokens, softmax(logits[-1])",
             f"  {'rank':>4}  {'id':>6}  {'token':<{LABEL_WIDTH}}  probability"]
    lines += [f"  {rank:>4}  {token_id:>6}  {label(token_id):<{LABEL_WIDTH}}  {probabilities[token_id]:.4f}"
              for rank, token_id in enumerate(top, 1)]
    return lines


def token_label(tokenizer, token_id):  # -> a token's text, repr-quoted so whitespace shows, at most LABEL_WIDTH chars
    raw = tokenizer.token_bytes(token_id)
    try:
        label = repr(raw.decode("utf-8"))
    except UnicodeDecodeError:  # a piece of a character split over several tokens: its bytes
        label = repr(raw)
    return fit(label, LABEL_WIDTH)


def fit(label, width):  # -> a quoted label of at most width characters, cut inside its quotes: "' perj…'"
    return label if len(label) <= width else label[: width - 2] + "…" + label[-1]
