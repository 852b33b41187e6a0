"""--html: one self-contained page to explore every head's attention, the head scores and the logit lens, offline.

The page is page.html (its HTML, CSS and JavaScript) with the data put inline as JSON: the tokens, every head's
attention weights, the logit lens's top tokens and the head scores (the object `--heads --json` prints). The weights
dominate: a 124M model at 1024 tokens has 12 x 12 lower triangles of 524,800 weights. They are stored as whole
thousandths (the 3 decimals the page shows; a weight below 0.0005 becomes 0), only the non-zero ones, as a deflate
stream that the browser's own DecompressionStream unpacks: little-endian uint16 sections, one after another,
    counts  [n_layer, n_head, n_seq]   the stored weights of each query's row
    gaps    [n_stored]                 each stored weight's key minus the previous one's minus 1 (from -1), row by row
    values  [n_stored]                 round(weight * 1000)
"""
import base64
import json
import zlib
from importlib import resources

import numpy as np

from gpt2_numpy.interpret.heads import layer_scores, stacked
from gpt2_numpy.interpret.present import heads_json
from gpt2_numpy.interpret.tracing import block_traces, embedding, layer_weights, lens, no_progress
from gpt2_numpy.checks import check_finite

WEIGHT_SCALE = 1000  # weights stored as round(w * 1000): exactly the 3 decimals shown, an error of at most 0.0005
LENS_TOP = 5  # logit-lens tokens kept per layer and position
DATA_SLOT = "/*DATA*/null"  # the template's placeholder for the JSON data: valid JavaScript before it is filled


def page_html(ids, params, n_head, text, title, repeated=None, progress=no_progress):  # -> the page's text
    """The page for token ids `ids` under `params`, text(token_id) giving a token's text: page.html with page_data
    inline."""
    template = resources.files("gpt2_numpy.interpret").joinpath("page.html").read_text(encoding="utf-8")
    data = {"title": title, **page_data(ids, params, n_head, text, repeated, progress)}
    # "<" as \u003c: a token "</script>" must not end the script that holds the data
    return template.replace(DATA_SLOT, json.dumps(data, ensure_ascii=False).replace("<", "\\u003c"), 1)


def page_data(ids, params, n_head, text, repeated=None, progress=no_progress):  # -> the data the page's script reads
    """One forward pass: every block's attention weights, encoded (module docstring), the logit lens's LENS_TOP tokens
    at each position after the embedding and after each block, and, given `repeated` (<|endoftext|> R R, see
    heads.repeated_tokens), the head scores' JSON object (present.heads_json), else None. progress(items, total) wraps
    the loop over the blocks. NonFiniteError when the model computes NaN or infinity."""
    x = embedding(ids, params["wte"], params["wpe"])
    lens_top = [finite_top_tokens(lens(x, params["ln_f"], params["wte"]))]
    counts, gaps, values, scores = [], [], [], []
    # the head scores use the prompt's weights traced here, not a second pass over a prompt of maybe 1024 tokens
    repeated_weights = None if repeated is None else layer_weights(repeated, params, n_head)
    for steps in progress(block_traces(x, params["blocks"], n_head), len(params["blocks"])):
        for section, array in zip((counts, gaps, values), sparse_weights(steps["attn.weights"])):
            section.append(array)
        lens_top.append(finite_top_tokens(lens(steps["out"], params["ln_f"], params["wte"])))
        if repeated is not None:
            scores.append(layer_scores(steps["attn.weights"], next(repeated_weights)))
    stream = b"".join(np.concatenate(section).astype("<u2").tobytes() for section in (counts, gaps, values))
    token_ids = sorted({*map(int, ids), *(token_id for layer in lens_top for row in layer for token_id, _ in row)})
    return {
        "ids": [int(token_id) for token_id in ids],
        "texts": {token_id: text(token_id) for token_id in token_ids},  # every token shown, prompt's and lens's
        "n_layer": len(params["blocks"]),
        "n_head": n_head,
        "scale": WEIGHT_SCALE,
        "weights": base64.b64encode(zlib.compress(stream, 6)).decode("ascii"),
        "lens": lens_top,  # [layer + 1][position] -> [[token id, probability in thousandths], ...], likeliest first
        "heads": None if repeated is None else heads_json(ids, repeated, stacked(scores), range(len(params["blocks"]))),
    }


def sparse_weights(weights):  # [n_head, n_seq, n_seq] -> uint16 counts [n_head, n_seq], gaps and values [n_stored]
    quantized = np.rint(weights * WEIGHT_SCALE).astype(np.uint16)
    stored = quantized > 0  # the future's weights are exactly 0, and so are weights below 0.0005
    head, query, key = np.nonzero(stored)  # row by row, keys ascending within a row
    new_row = np.r_[True, (head[1:] != head[:-1]) | (query[1:] != query[:-1])]
    previous = np.where(new_row, -1, np.r_[0, key[:-1]])
    return stored.sum(-1).ravel(), key - previous - 1, quantized[stored]


def finite_top_tokens(log_probs):  # -> top_tokens(log_probs), or NonFiniteError
    # a NaN weight reaches every later layer's lens, the last one's at least: checking each lens checks the whole page
    check_finite(log_probs)
    return top_tokens(log_probs)


def top_tokens(log_probs):  # [n_seq, n_vocab] -> [n_seq][LENS_TOP] of [token id, probability in thousandths]
    # argpartition finds the top few in linear time; only those few are then sorted, not all n_vocab
    n_top = min(LENS_TOP, log_probs.shape[-1])
    top = np.argpartition(-log_probs, n_top - 1, axis=-1)[:, :n_top]
    top = np.take_along_axis(top, np.argsort(-np.take_along_axis(log_probs, top, axis=-1), axis=-1), axis=-1)
    thousandths = np.rint(np.exp(np.take_along_axis(log_probs, top, axis=-1)) * 1000).astype(int)
    return [[[int(t), int(p)] for t, p in zip(row_ids, row_p)] for row_ids, row_p in zip(top, thousandths)]
