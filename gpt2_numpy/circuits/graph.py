"""Attribution graphs (Ameisen et al. 2025, "Circuit Tracing"), as circuit-tracer's `attribute()` computes them.

For one prompt, the local replacement model is GPT-2 with each MLP replaced by its transcoder plus an error (the MLP's
output minus the transcoder's, held fixed), attention patterns and LayerNorm denominators frozen at the prompt's
values. The model is then linear in the residual stream, and the direct effect of every node on every other is one
dot product: a source's output vector times the gradient, through the frozen model, of the target's input direction.

Nodes, in circuit-tracer's order (the rows and columns of the adjacency; rows are targets, columns sources):
    active features   (layer, position, feature), sorted so; output vector activation x W_dec[feature], input
                      direction W_enc[feature] at the transcoder's input hook; position 0's features are zeroed, as
                      circuit-tracer's zero_positions (its BOS) are
    errors            (layer, position), layer by layer; output vector the MLP's output minus the transcoder's
                      (position 0's zeroed)
    tokens            (position): output vector the token's embedding (wte; the position embedding is no node)
    logits            the top logits of the last position (at most max_logits, until logit_prob of the probability
                      is covered); input direction wte[token] minus wte's mean over the vocabulary, at ln_f's output
Errors and tokens have no inputs: their rows are 0, as are the logits' columns.
"""
import functools
from typing import NamedTuple

import numpy as np

from gpt2_numpy.sae.transcoder_model import (
    INPUT_HOOKS, encode, decode, input_name, output_name, transcoder_input,
)
from gpt2_numpy.interpret.tracing import trace
from gpt2_numpy.model import softmax

ZERO_POSITIONS = slice(0, 1)  # circuit-tracer's zero_positions: features and errors at position 0 are dropped
QUEUE = 2048  # features traced between two rankings: circuit-tracer's update_interval 4 x batch_size 512
MAX_HOPS = 128  # circuit-tracer's limit on the ranking's paths
BATCH_FLOATS = 2**24  # floats of one batch of gradients [batch, n_seq, n_embd]: targets are traced in such batches


class Graph(NamedTuple):
    adjacency: np.ndarray  # float32 [n, n]: rows targets, columns sources, in the module docstring's order
    active_features: np.ndarray  # int [n_active, 3]: (layer, position, feature)
    selected_features: np.ndarray  # int [n_selected]: indices into active_features, the graph's feature nodes
    activation_values: np.ndarray  # float32 [n_active]
    logit_token_ids: np.ndarray  # int [n_logits]
    logit_probabilities: np.ndarray  # float32 [n_logits]
    input_ids: np.ndarray  # int [n_seq]
    n_layer: int


class Frozen(NamedTuple):  # the prompt's run, as the linearized model needs it
    scales: dict  # {"ln_1", "ln_2": [n_layer, n_seq, 1], "ln_f": [n_seq, 1]}: LayerNorm's denominators
    patterns: np.ndarray  # [n_layer, n_head, n_seq, n_seq]: the attention weights
    sources: np.ndarray  # [n_sources, d_model]: every source's output vector (features, errors, tokens)
    feature_layers: np.ndarray  # [n_active]
    feature_positions: np.ndarray  # [n_active]
    encoders: np.ndarray  # [n_active, d_model]: each active feature's input direction


def attribution_graph(ids, params, n_head, transcoders, max_logits=10, logit_prob=0.95, max_features=None,
                      queue=QUEUE):  # int [n_seq] -> Graph
    """The unpruned graph of ids (circuit-tracer's attribute()). max_features: at most this many feature nodes, the
    most influential on the logits, chosen as circuit-tracer chooses them (queue: how many are traced between two
    rankings, its update_interval x batch_size); every active feature when None."""
    ids = np.asarray(ids)
    arrays = trace(ids, params, n_head)
    n_layer, n_seq = len(params["blocks"]), len(ids)
    activations = np.stack([layer_features(transcoders, layer, arrays) for layer in range(n_layer)])
    active = np.argwhere(activations)  # (layer, position, feature), sorted so, as torch's coalesce sorts
    values = activations[tuple(active.T)]
    frozen = freeze(arrays, params, ids, transcoders, activations, active)
    logit_ids, probabilities = top_logits(arrays["logits"][-1], max_logits, logit_prob)
    wte = params["wte"]
    logit_vectors = wte[logit_ids] - wte.mean(axis=0)  # circuit-tracer's demeaned unembedding columns
    logit_rows = effect_rows(frozen, params, n_head, transcoders, np.full(len(logit_ids), n_layer),
                             np.full(len(logit_ids), n_seq - 1), logit_vectors)
    trace_features = functools.partial(feature_rows, frozen, params, n_head, transcoders)
    selected, rows = select_features(trace_features, logit_rows, probabilities, len(active), max_features, queue)
    # the sources kept: the selected features, then every error and token
    columns = np.concatenate([selected, np.arange(len(active), len(frozen.sources))])
    n_sources, n_logits = len(columns), len(logit_ids)
    adjacency = np.zeros((n_sources + n_logits,) * 2, dtype=np.float32)
    adjacency[:len(selected), :n_sources] = rows[:, columns]
    adjacency[n_sources:, :n_sources] = logit_rows[:, columns]
    return Graph(adjacency, active, selected, values, logit_ids, probabilities, ids, n_layer)


def feature_rows(frozen, params, n_head, transcoders, features):  # int [k] -> [k, n_sources]: their input rows
    return effect_rows(frozen, params, n_head, transcoders, frozen.feature_layers[features],
                       frozen.feature_positions[features], frozen.encoders[features])


def select_features(trace_features, logit_rows, probabilities, n_active, max_features, queue):  # -> int [k], [k, n]
    """The feature nodes, in active_features' order, and their rows: every active feature, or the max_features most
    influential, as circuit-tracer's attribute() picks them: ranked by their influence on the logits through the rows
    traced so far, the best `queue` not yet traced traced next, until max_features are."""
    if max_features is None or max_features >= n_active:
        return np.arange(n_active), trace_features(np.arange(n_active))
    chosen, rows = np.zeros(0, dtype=int), np.zeros((0, logit_rows.shape[1]), dtype=np.float32)
    while len(chosen) < max_features:
        traced = np.concatenate([logit_rows, rows])
        row_nodes = np.concatenate([logit_rows.shape[1] + np.arange(len(logit_rows)), chosen])
        ranked = np.argsort(-partial_influences(traced, probabilities, row_nodes)[:n_active], kind="stable")
        pending = ranked[~np.isin(ranked, chosen)][:min(queue, max_features - len(chosen))]
        chosen, rows = np.concatenate([chosen, pending]), np.concatenate([rows, trace_features(pending)])
    order = np.argsort(chosen)
    return chosen[order], rows[order]


def partial_influences(rows, probabilities, row_nodes):  # [r, n_sources], [n_logits], int [r] -> [n_sources + n_logits]
    # circuit-tracer's compute_partial_influences: each node's influence on the logits through the rows known so far
    weights = np.abs(rows)
    weights /= np.maximum(weights.sum(axis=1, keepdims=True), 1e-8)
    product = np.zeros(rows.shape[1] + len(probabilities), dtype=np.float32)
    product[-len(probabilities):] = probabilities
    influences = np.zeros_like(product)
    for _ in range(MAX_HOPS):
        product = np.concatenate([product[row_nodes] @ weights, np.zeros(len(probabilities), np.float32)])
        if not product.any():
            return influences
        influences += product
    raise ValueError("the feature ranking did not converge: an attribution graph's edges go forward only")


def layer_features(transcoders, layer, arrays):  # -> [n_seq, d_transcoder]: layer's features, position 0's zeroed
    return row_features(transcoders, layer, arrays[input_name(transcoders.input_hook, layer)])


def row_features(transcoders, layer, rows):  # [n_seq, d_model] of input_name's array -> [n_seq, d_transcoder]
    features = encode(transcoders.layers[layer], transcoder_input(transcoders.input_hook, rows))
    features[ZERO_POSITIONS] = 0
    return features


def layer_input(transcoders, layer, arrays):  # -> [n_seq, d_model]: what layer's transcoder reads
    return transcoder_input(transcoders.input_hook, arrays[input_name(transcoders.input_hook, layer)])


def freeze(arrays, params, ids, transcoders, activations, active):  # -> Frozen
    n_layer = len(params["blocks"])
    blocks = [f"blocks.{layer}." for layer in range(n_layer)]
    block_inputs = [arrays["embed"]] + [arrays[f"{block}out"] for block in blocks[:-1]]
    scales = {"ln_1": np.stack([scale(x) for x in block_inputs]),
              "ln_2": np.stack([scale(arrays[f"{block}mid"]) for block in blocks]),
              "ln_f": scale(arrays[f"{blocks[-1]}out"])}
    layer, position, feature = active.T
    decoders = feature_vectors(transcoders, "W_dec", layer, feature) * activations[layer, position, feature, None]
    encoders = feature_vectors(transcoders, "W_enc", layer, feature)
    errors = np.stack([layer_error(transcoders, each, arrays, activations[each]) for each in range(n_layer)])
    sources = np.concatenate([decoders, errors.reshape(-1, errors.shape[-1]), params["wte"][ids]])
    patterns = np.stack([arrays[f"{block}attn.weights"] for block in blocks])
    return Frozen(scales, patterns, sources, layer, position, encoders)


def feature_vectors(transcoders, name, layers, features):  # -> [n, d_model]: row features[i] of layers[i]'s `name`
    vectors = np.zeros((len(layers), transcoders.d_model), dtype=np.float32)
    for layer in np.unique(layers):
        at = layers == layer
        vectors[at] = transcoders.layers[layer][name][features[at]]
    return vectors


def layer_error(transcoders, layer, arrays, features):  # -> [n_seq, d_model]: the MLP's output minus the transcoder's
    x = layer_input(transcoders, layer, arrays)
    reconstruction = decode(transcoders.layers[layer], features, x)
    error = arrays[output_name(transcoders.output_hook, layer)] - reconstruction
    error[ZERO_POSITIONS] = 0
    return error


def scale(x, eps=1e-5):  # [n_seq, d_model] -> [n_seq, 1]: LayerNorm's denominator, frozen
    return np.sqrt(np.var(x, axis=-1, keepdims=True) + eps)


def top_logits(logits, max_logits, logit_prob):  # [n_vocab] -> int [k], float32 [k]: circuit-tracer's salient logits
    probabilities = softmax(logits)
    top = np.argsort(-probabilities, kind="stable")[:max_logits]
    count = int(np.searchsorted(np.cumsum(probabilities[top]), logit_prob)) + 1  # torch.searchsorted's left side
    return top[:count], probabilities[top[:count]]


def effect_rows(frozen, params, n_head, transcoders, layers, positions, vectors):  # -> [n_targets, n_sources]
    """Each target's row of direct effects: the gradient of its input direction (vectors[t], read at layer layers[t]'s
    transcoder input, or at ln_f's output for layer n_layer, at positions[t]) through the frozen model, dotted with
    every source's output vector. Targets go in batches by position, each batch traced up to its last position only
    and each target down from its own layer only: the gradients are 0 after a target's position (attention is
    causal) and above its layer."""
    rows = np.zeros((len(layers), len(frozen.sources)), dtype=np.float32)
    order = np.lexsort((-layers, positions))
    n_seq, d_model = frozen.patterns.shape[-1], vectors.shape[-1]
    size = max(1, BATCH_FLOATS // (n_seq * d_model))
    for start in range(0, len(order), size):
        batch = order[start:start + size]
        batch = batch[np.argsort(-layers[batch], kind="stable")]  # highest layer first: see batch_rows
        rows[batch] = batch_rows(frozen, params, n_head, transcoders, layers[batch], positions[batch], vectors[batch])
    return rows


def batch_rows(frozen, params, n_head, transcoders, layers, positions, vectors):  # [b] x2, [b, d] -> [b, n_sources]
    # layers: sorted highest first, so that the targets whose gradient is still 0 at a layer are the batch's last
    n_layer, n_seq, length = len(params["blocks"]), frozen.patterns.shape[-1], int(positions.max()) + 1
    targets, n_active = np.arange(len(layers)), len(frozen.feature_layers)
    rows = np.zeros((len(layers), len(frozen.sources)), dtype=np.float32)
    d = np.zeros((len(layers), length, vectors.shape[-1]), dtype=np.float32)  # the gradient at the residual stream
    at_top = targets[layers == n_layer]  # logits read ln_f's output: back through it at their positions alone
    d[at_top, positions[at_top]] = layer_norm_frozen(vectors[at_top], params["ln_f"]["g"],
                                                     frozen.scales["ln_f"][positions[at_top]])
    bounds = np.searchsorted(frozen.feature_layers * n_seq + frozen.feature_positions, np.arange(n_layer * n_seq + 1))
    for layer in reversed(range(min(n_layer, int(layers.max()) + 1))):
        live = int(np.count_nonzero(layers >= layer))  # the targets at or above this layer; below it, all is 0
        g = d[:live]  # the gradient at block layer's output, which is its MLP output's too: the features' and errors'
        by_position = np.ascontiguousarray(np.swapaxes(g, 0, 1))  # each position's [live, d_model] in one block:
        # BLAS reads a strided g[:, position] several times slower
        for position in range(length):  # active features are sorted by layer and position: each a slice, no gather
            at = slice(bounds[layer * n_seq + position], bounds[layer * n_seq + position + 1])
            rows[:live, at] = by_position[position] @ frozen.sources[at].T
        errors = n_active + layer * n_seq
        rows[:live, errors:errors + length] = np.einsum("bpd,pd->bp", g, frozen.sources[errors:errors + length])
        block, ln_2 = params["blocks"][layer], frozen.scales["ln_2"][layer]
        mid = g + skip_backward(transcoders, layer, g, block["ln_2"]["g"], ln_2[:length]) if transcoders.skip else g
        here = targets[:live][layers[:live] == layer]  # the targets reading this layer's input, at their positions
        mid[here, positions[here]] += input_backward(transcoders.input_hook, vectors[here], block["ln_2"]["g"],
                                                     ln_2[positions[here]])
        d[:live] = mid + attention_backward(mid, block, n_head, frozen.patterns[layer], frozen.scales["ln_1"][layer])
    tokens = n_active + n_layer * n_seq
    rows[:, tokens:tokens + length] = np.einsum("bpd,pd->bp", d, frozen.sources[tokens:tokens + length])
    return rows


def flat_product(x, w):  # [..., n], [n, m] -> [..., m]
    # one BLAS call for every row: NumPy runs a stacked [b, n_seq, n] @ w as a product per b, 10-50x slower here
    return (x.reshape(-1, x.shape[-1]) @ w).reshape(*x.shape[:-1], w.shape[-1])


def layer_norm_frozen(d, g, scale):  # [..., d_model] -> like d: back through layer_norm with its scale frozen
    d = d * g
    return (d - d.mean(axis=-1, keepdims=True)) / scale  # the centring still depends on x; the denominator does not


def centred(w, g):  # [n, d_model], [d_model] -> like w: d @ centred(w, g) = layer_norm_frozen(d @ w, g, 1)
    # layer_norm_frozen's gain and centring are linear in d's last axis: folded into the product before them, they
    # cost a [d_model, d_model] pass instead of three over the batch's [b, n_seq, d_model] gradient
    w = w * g
    return w - w.mean(axis=-1, keepdims=True)


def skip_backward(transcoders, layer, d, g, scale):  # [b, n_seq, d_model] -> like d: from x W_skipᵀ's output to mid
    w_skip = transcoders.layers[layer]["W_skip"]  # the MLP is linear only through its skip connection
    if INPUT_HOOKS[transcoders.input_hook] == "mid":
        return flat_product(d, w_skip)
    return flat_product(d, centred(w_skip, g if INPUT_HOOKS[transcoders.input_hook] == "ln_2" else 1)) / scale


def input_backward(input_hook, d, g, scale):  # [..., d_model] -> like d: from the transcoder's input to mid
    step = INPUT_HOOKS[input_hook]
    if step == "mid":
        return d
    return layer_norm_frozen(d, g if step == "ln_2" else 1, scale)


def attention_backward(d, block, n_head, pattern, scale):  # [b, n_seq, d_model] -> like d: attn.out's share at x
    # with the pattern frozen, attention is linear in its values: out = merge(pattern @ v) c_proj, v = ln_1(x) W_V
    attn, (b, length, n_embd) = block["attn"], d.shape
    d_z = flat_product(d, attn["c_proj"]["w"].T).reshape(b, length, n_head, -1)
    # heads first and the batch beside d_head: each head's [length, length] pattern meets all the batch in one product
    d_z = np.ascontiguousarray(d_z.transpose(2, 1, 0, 3)).reshape(n_head, length, -1)
    keys_from_queries = np.ascontiguousarray(np.swapaxes(pattern[:, :length, :length], -1, -2))
    d_v = (keys_from_queries @ d_z).reshape(n_head, length, b, -1).transpose(2, 1, 0, 3)  # [b, length, n_head, d_head]
    d_normed = flat_product(np.ascontiguousarray(d_v).reshape(b, length, n_embd),
                            centred(attn["c_attn"]["w"][:, 2 * n_embd:].T, block["ln_1"]["g"]))
    return d_normed / scale[:length]
