"""The files that circuit-tracer's graph viewer opens (`circuit_tracer.utils.create_graph_files` writes them): a pruned
graph as `<slug>.json`, {metadata, qParams, nodes, links}, and `graph-metadata.json`, the list of the folder's graphs.
Node ids, kinds and fields are circuit-tracer's, so its viewer (and Neuronpedia's) draws ours as its own."""


def cantor_pairing(x, y):  # -> the one integer circuit-tracer gives a feature (layer, index)
    return (x + y) * (x + y + 1) // 2 + y


def node(node_id, feature, layer, position, kind, js_id, influence=None, activation=None, **more):  # -> its JSON
    return {"node_id": node_id, "feature": feature, "layer": layer, "ctx_idx": position, "feature_type": kind,
            "token_prob": more.get("token_prob", 0.0), "is_target_logit": more.get("is_target_logit", False),
            "run_idx": 0, "reverse_ctx_idx": 0, "jsNodeId": js_id, "clerp": more.get("clerp", ""),
            "influence": influence, "activation": activation}


def node_place(graph, index):  # -> (kind, layer, position, feature) of node `index` in the adjacency's order
    """kind: "feature" (layer, position, feature index), "error" (layer, position), "token" (position) or "logit"
    (position the last, feature its rank among the logits); what does not apply is None."""
    n_features, n_seq = len(graph.selected_features), len(graph.input_ids)
    errors_end = n_features + graph.n_layer * n_seq
    if index < n_features:
        layer, position, feature = map(int, graph.active_features[graph.selected_features[index]])
        return "feature", layer, position, feature
    if index < errors_end:
        return ("error", *divmod(index - n_features, n_seq), None)
    if index < errors_end + n_seq:
        return "token", None, index - errors_end, None
    return "logit", None, n_seq - 1, index - errors_end - n_seq


def graph_nodes(graph, pruned, decode):  # -> {index: node JSON} of the pruned graph's nodes
    """decode(ids) -> their text, as circuit-tracer's tokenizer.decode gives it (a token alone, the prompt)."""
    nodes = {}
    for index in map(int, pruned.node_mask.nonzero()[0]):
        influence = float(pruned.cumulative_scores[index])
        kind, layer, position, feature = node_place(graph, index)
        if kind == "feature":
            activation = float(graph.activation_values[graph.selected_features[index]])
            nodes[index] = node(f"{layer}_{feature}_{position}", cantor_pairing(layer, feature), str(layer), position,
                                "cross layer transcoder", f"{layer}_{feature}-0", influence, activation)
        elif kind == "error":
            nodes[index] = node(f"0_{layer}_{position}", -1, str(layer), position, "mlp reconstruction error",
                                f"{layer}_{position}-0", influence)
        elif kind == "token":
            token = int(graph.input_ids[position])
            nodes[index] = node(f"E_{token}_{position}", position, "E", position, "embedding", f"E_{token}-{position}",
                                influence)
        else:
            nodes[index] = logit_node(graph, feature, decode)
    return nodes


def logit_node(graph, rank, decode):  # -> the JSON of the rank-th logit node
    token, probability = int(graph.logit_token_ids[rank]), float(graph.logit_probabilities[rank])
    layer, position = str(graph.n_layer + 1), len(graph.input_ids) - 1
    return node(f"{layer}_{token}_{position}", token, layer, position, "logit", f"L_{token}-{position}",
                token_prob=probability, is_target_logit=rank == 0,
                clerp=f'Output "{decode([token])}" (p={probability:.3f})')


def viewer_graph(graph, pruned, decode, slug, scan, node_threshold):  # -> the JSON object of <slug>.json
    nodes = graph_nodes(graph, pruned, decode)
    targets, sources = pruned.edge_mask.nonzero()
    links = [{"source": nodes[source]["node_id"], "target": nodes[target]["node_id"],
              "weight": float(graph.adjacency[target, source])}
             for target, source in zip(targets.tolist(), sources.tolist()) if source in nodes and target in nodes]
    linked = {link["source"] for link in links} | {link["target"] for link in links}
    used = [each for each in nodes.values() if each["node_id"] in linked or each["feature_type"] in ("embedding",
                                                                                                     "logit")]
    metadata = {"slug": slug, "scan": scan, "transcoder_list": [],
                "prompt_tokens": [decode([int(token)]) for token in graph.input_ids],
                "prompt": decode(graph.input_ids.tolist()),
                "node_threshold": node_threshold, "schema_version": 1}
    return {"metadata": metadata, "qParams": {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "",
                                              "sg_pos": ""},
            "nodes": used, "links": links}
