"""graph.html: one offline page of a pruned attribution graph, which `circuits graph` writes beside graph.npz.

The page draws the kept nodes by layer (rows: the tokens at the bottom, then each layer's features and errors, the
logits at the top) and by position (columns, under the prompt's tokens), the kept edges coloured by sign and as wide as
their weight; a click on a node shows what it is, its strongest incoming and outgoing edges, and for a feature its
strongest contexts in a text (contexts(): each kept feature over windows of that text, as sae features' page has a
latent's). The data goes inline as JSON with "<" escaped (a token "</script>" cannot end the script that holds it),
and the script sets every text with textContent, never as HTML.
"""
import functools
import json
import types
from importlib import resources

from gpt2_numpy.circuits.graph import row_features
from gpt2_numpy.sae.transcoder_model import input_name
from gpt2_numpy.circuits.viewer import node_place
from gpt2_numpy.sae.features import scan
from gpt2_numpy.sae.page import context_rows

DATA_SLOT = "/*DATA*/null"  # the template's placeholder for the JSON data: valid JavaScript before it is filled
TOP_EDGES = 8  # incoming and outgoing edges the panel lists per node, strongest first
CONTEXTS = 5  # contexts per feature
DIGITS = 6  # significant digits of the weights and activations on the page: enough for 4 shown, half the bytes


def graph_html(data):  # -> the page's text: graph.html with data (graph_data's) inline
    template = resources.files("gpt2_numpy.circuits").joinpath("graph.html").read_text(encoding="utf-8")
    # "<" as \u003c: a token "</script>" must not end the script that holds the data
    return template.replace(DATA_SLOT, json.dumps(data, ensure_ascii=False).replace("<", "\\u003c"), 1)


def graph_data(graph, pruned, text, title, prompt, contexts=None, contexts_note=""):  # -> the page script's data
    """The pruned graph's nodes and edges, indexed as graph.npz's adjacency is; text(token_id) -> a token's text,
    prompt the prompt's text.
    contexts: {"layer/feature": [context]} (contexts()'s), or None with contexts_note saying how to get them."""
    kept = pruned.node_mask
    targets, sources = (pruned.edge_mask & kept[:, None] & kept[None, :]).nonzero()
    return {"title": title, "prompt": prompt, "tokens": [text(int(token)) for token in graph.input_ids],
            "n_layer": graph.n_layer, "top_edges": TOP_EDGES,
            "nodes": [page_node(graph, pruned, index, text) for index in map(int, kept.nonzero()[0])],
            "edges": [[target, source, rounded(graph.adjacency[target, source])]
                      for target, source in zip(targets.tolist(), sources.tolist())],
            "contexts": contexts, "contexts_note": contexts_note}


def page_node(graph, pruned, index, text):  # -> the page's JSON of node `index`
    kind, layer, position, feature = node_place(graph, index)
    node = {"index": index, "kind": kind, "layer": layer, "position": position, "feature": feature,
            "influence": rounded(pruned.cumulative_scores[index])}
    if kind == "feature":
        node["activation"] = rounded(graph.activation_values[graph.selected_features[index]])
    elif kind == "token":
        node["text"] = text(int(graph.input_ids[position]))
    elif kind == "logit":
        node.update(text=text(int(graph.logit_token_ids[feature])),
                    probability=rounded(graph.logit_probabilities[feature]))
    return node


def rounded(value):  # -> a float to DIGITS significant digits
    return float(f"{float(value):.{DIGITS}g}")


def graph_features(graph, pruned):  # -> {layer: [feature index]}: the kept features, each once, by layer
    kept = pruned.node_mask[:len(graph.selected_features)]
    found = {}
    for layer, _, feature in graph.active_features[graph.selected_features[kept]].tolist():
        found.setdefault(layer, set()).add(feature)
    return {layer: sorted(features) for layer, features in sorted(found.items())}


def contexts(windows, params, n_head, transcoders, features, text, n_contexts=CONTEXTS):  # -> {"L/F": [context]}
    """Each feature of features ({layer: [feature index]}) over token ids [n_windows, n_seq], position 0's zeroed
    as in the graph: its n_contexts strongest contexts (sae/page.py's context_rows)."""
    found_all = {}
    for layer, chosen in features.items():
        # a layer's transcoder as sae.features.scan reads an SAE: the trace name it reads, and its encoder
        reader = types.SimpleNamespace(hook=input_name(transcoders.input_hook, layer),
                                       encode=functools.partial(row_features, transcoders, layer))
        found = scan(windows, params, n_head, reader, chosen, n_contexts)
        for column, feature in enumerate(chosen):
            rows = context_rows(found, windows, feature, column, text)
            found_all[f"{layer}/{feature}"] = [{**row, "value": rounded(row["value"]),
                                                "acts": [rounded(act) for act in row["acts"]]} for row in rows]
    return found_all

