"""--lens: the logit lens as a table, a row per layer and a column per position, each cell the top next token and its
probability when the residual stream after that layer goes through ln_f and the output head; or (--lens --json) the
same for every position, as data."""
import numpy as np

from gpt2_numpy.interpret.stepwise import cut, fit
from gpt2_numpy.interpret.tracing import lens_layers, no_progress
from gpt2_numpy.checks import check_finite

LENS_COLUMNS = 6  # positions shown: a longer prompt shows its last ones, which fit a 120-character line
CELL = 17  # characters per column
HIT = "*"  # marks a cell whose top token is the one that actually comes next


def lens_table(ids, params, n_head, label, progress=no_progress):  # -> the table's text
    """The lens at the last LENS_COLUMNS positions of token ids `ids`; label(token_id) names a token (token_label);
    progress(items, total) wraps the loop over the layers. NonFiniteError when the model computes NaN or infinity."""
    n_seq, n_layer = len(ids), len(params["blocks"])
    first = max(0, n_seq - LENS_COLUMNS)
    positions = range(first, n_seq)
    layers = top_tokens(ids, params, n_head, first, progress)
    lines = [f"Logit lens: the likeliest next token after each layer, and its probability; {HIT}: the token that "
             "comes next"]
    if first:
        lines.append(f"(a long prompt: showing the last {LENS_COLUMNS} of {n_seq} positions)")
    lines.append("")
    rows = [("position", [str(position) for position in positions]),
            ("token", [fit(label(ids[position]), CELL - 1) for position in positions]),
            ("next", [fit(label(ids[position + 1]), CELL - 1) if position + 1 < n_seq else "?"
                      for position in positions]),
            ("", ["-" * (CELL - 1)] * len(positions))]
    for name, (top, probabilities) in zip(["embed", *map(str, range(n_layer))], layers):
        hits = [position + 1 < n_seq and token_id == ids[position + 1] for position, token_id in zip(positions, top)]
        rows.append((name, list(map(lens_cell, map(label, top), probabilities, hits))))
    for name, cells in rows:
        lines.append(f"  {name:<8}" + "".join(f"{cut(cell, CELL - 1):>{CELL}}" for cell in cells).rstrip())
    return "\n".join(lines) + "\n"


def lens_cell(label, probability, hit):  # -> "' the' 0.42*": a label cut to fit, its probability, the mark
    mark = HIT if hit else " "
    return f"{fit(label, CELL - 7)} {probability:.2f}{mark}"


def lens_json(ids, params, n_head, text, progress=no_progress):  # -> the JSON-ready object --lens --json prints
    """The lens at every position of token ids `ids`: for each layer ("embed" for the embeddings, then 0, 1, ...), the
    top next token's id, text (text(token_id)) and probability at each position."""
    names = ["embed", *range(len(params["blocks"]))]
    return {"prompt_ids": [int(token_id) for token_id in ids],
            "layers": [{"layer": name, "top_ids": top.tolist(), "top_texts": [text(token_id) for token_id in top],
                        "probabilities": probabilities.tolist()}
                       for name, (top, probabilities) in zip(names, top_tokens(ids, params, n_head, 0, progress))]}


def top_tokens(ids, params, n_head, first, progress):  # -> per layer: (top ids, probabilities), int/float [n - first]
    # read at positions first.. only: each position's row is independent of the others; one layer's log-probabilities
    # at a time, as a long prompt's [n_seq, n_vocab] for every layer at once would take gigabytes
    layers, n_layer = [], len(params["blocks"])
    for log_probs in progress(lens_layers(ids, params, n_head, positions=slice(first, None)), n_layer + 1):
        check_finite(log_probs)
        top = np.argmax(log_probs, axis=-1)
        layers.append((top, np.exp(log_probs[np.arange(len(top)), top])))
    return layers
