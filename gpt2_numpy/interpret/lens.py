"""--lens: the logit lens's top next token and its probability at each position, when the residual stream after each
layer goes through ln_f and the output head (present.py prints them: a table of the last LENS_COLUMNS positions, or
with --json every position)."""
import numpy as np

from gpt2_numpy.interpret.tracing import lens_layers, no_progress
from gpt2_numpy.checks import check_finite

LENS_COLUMNS = 6  # positions the table shows: a longer prompt shows its last ones, which fit a 120-character line


def top_tokens(ids, params, n_head, first=0, progress=no_progress):  # -> [(top ids, probabilities) [n - first]]
    """The lens on token ids `ids` at positions first.. : for the embedding, then each block, the top next token and
    its probability. progress(items, total) wraps the loop over the layers. NonFiniteError for NaN or infinity."""
    # read at positions first.. only: each position's row is independent of the others; one layer's log-probabilities
    # at a time, as a long prompt's [n_seq, n_vocab] for every layer at once would take gigabytes
    layers, n_layer = [], len(params["blocks"])
    for log_probs in progress(lens_layers(ids, params, n_head, positions=slice(first, None)), n_layer + 1):
        check_finite(log_probs)
        top = np.argmax(log_probs, axis=-1)
        layers.append((top, np.exp(log_probs[np.arange(len(top)), top])))
    return layers


def first_shown(n_seq):  # -> the first position the table shows
    return max(0, n_seq - LENS_COLUMNS)
