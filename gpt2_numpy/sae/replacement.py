"""Transcoders spliced into the model as MLP replacements, through run_with_edits (interpret/edits.py): each chosen
layer's mlp.out is replaced by its transcoder's output on the activation the transcoder reads, so everything after is
computed from the replacement.

    edits = replacement_edits(transcoders)                       # every MLP replaced
    logits = run_with_edits(ids, params, n_head, edits, names=["logits"])["logits"]

With keep_error, the MLP's error (its output minus the transcoder's) is added back, so the run is the model's own
until a feature is changed: zeroed lists (layer, position, feature) to switch off, the intervention an attribution
graph's edges predict. The edits are for forward runs: each records its transcoder's input through an edit of that
array, which gradients (interpret/gradients.py) would hold fixed.
"""
import functools

from gpt2_numpy.sae.transcoder_model import decode, encode, input_name, output_name, transcoder_input
from gpt2_numpy.interpret.edits import Edit


def replacement_edits(transcoders, layers=None, keep_error=False, zeroed=()):  # -> [Edit]
    """layers: the MLPs replaced (all when None); zeroed: (layer, position, feature) triples set to 0."""
    edits = []
    for layer in range(len(transcoders.layers)) if layers is None else layers:
        seen = {}
        off = [(position, feature) for at, position, feature in zeroed if at == layer]
        edits += [Edit(input_name(transcoders.input_hook, layer), functools.partial(record, seen)),
                  Edit(output_name(transcoders.output_hook, layer),
                       functools.partial(replaced, transcoders, layer, seen, keep_error, off))]
    return edits


def record(seen, array):  # -> array, unchanged, kept in seen for the layer's MLP output edit
    seen["input"] = array
    return array


def replaced(transcoders, layer, seen, keep_error, off, mlp_out):  # [n_seq, d_model] -> [n_seq, d_model]
    params = transcoders.layers[layer]
    x = transcoder_input(transcoders.input_hook, seen["input"])
    features = encode(params, x)
    error = mlp_out - decode(params, features, x) if keep_error else 0
    for position, feature in off:
        features[..., position, feature] = 0
    return decode(params, features, x) + error
