"""--lens: the logit lens as a table, a row per layer and a column per position, each cell the top next token and its
probability when the residual stream after that layer goes through ln_f and the output head."""
import numpy as np

from gpt2_numpy.explain.stepwise import cut, fit
from gpt2_numpy.explain.tracing import lens_layers, no_progress
from gpt2_numpy.generate import check_finite

LENS_COLUMNS = 6  # positions shown: a longer prompt shows its last ones, which fit a 120-character line
CELL = 17  # characters per column
HIT = "*"  # marks a cell whose top token is the one that actually comes next


def lens_table(ids, params, n_head, label, progress=no_progress):  # -> the table's text
    """The lens at the last LENS_COLUMNS positions of token ids `ids`; label(token_id) names a token (token_label);
    progress(items, total) wraps the loop over the layers. NonFiniteError when the model computes NaN or infinity."""
    n_seq, n_layer = len(ids), len(params["blocks"])
    first = max(0, n_seq - LENS_COLUMNS)
    positions = range(first, n_seq)
    # the lens is read at the shown positions only: each position's row is independent of the others
    layers = list(progress(lens_layers(ids, params, n_head, positions=slice(first, None)), n_layer + 1))
    for log_probs in layers:
        check_finite(log_probs)
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
    for name, log_probs in zip(["embed", *map(str, range(n_layer))], layers):
        top = np.argmax(log_probs, axis=-1)
        rows.append((name, [lens_cell(label(token_id), np.exp(log_probs[column, token_id]),
                                      position + 1 < n_seq and token_id == ids[position + 1])
                            for column, (position, token_id) in enumerate(zip(positions, top))]))
    for name, cells in rows:
        lines.append(f"  {name:<8}" + "".join(f"{cut(cell, CELL - 1):>{CELL}}" for cell in cells).rstrip())
    return "\n".join(lines) + "\n"


def lens_cell(label, probability, hit):  # -> "' the' 0.42*": a label cut to fit, its probability, the mark
    mark = HIT if hit else " "
    return f"{fit(label, CELL - 7)} {probability:.2f}{mark}"
