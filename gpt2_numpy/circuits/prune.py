"""Pruning an attribution graph by influence on the logits, as circuit-tracer's `prune_graph` does.

A node's influence is the sum over paths from it to the logits of the product of normalized edge weights (each row's
absolute weights divided by their sum), each logit weighted by its probability. The nodes that carry node_threshold of
the total influence are kept, and the tokens and logits always; then, among the edges of the kept nodes, those that
carry edge_threshold of the edge influence; then, repeatedly, the feature and error nodes left with no outgoing edge,
and the features with no incoming one, are dropped, until nothing changes.
"""
from typing import NamedTuple

import numpy as np


class Pruned(NamedTuple):
    node_mask: np.ndarray  # bool [n]: the nodes kept
    edge_mask: np.ndarray  # bool [n, n]: the edges kept (rows targets, columns sources)
    cumulative_scores: np.ndarray  # float32 [n]: the share of the total influence of the nodes at least as influential


def normalized(adjacency):  # [n, n] -> [n, n]: absolute weights, each row summing to 1 (or 0)
    weights = np.abs(adjacency)
    return weights / np.maximum(weights.sum(axis=1, keepdims=True), 1e-10)


def influence(matrix, logit_weights):  # [n, n], [n] -> [n]: logit_weights (A + A² + ...), A nilpotent on a DAG
    current = logit_weights @ matrix
    total = current.copy()
    for _ in range(len(matrix)):  # a path of a DAG has fewer than n edges
        if not current.any():
            return total
        current = current @ matrix
        total += current
    raise ValueError("the adjacency has a cycle: an attribution graph's edges go forward only")


def threshold(scores, share):  # [m] -> the score at which the strongest scores carry `share` of their total
    ordered = np.sort(scores)[::-1]
    cumulative = np.cumsum(ordered) / ordered.sum()
    return ordered[min(int(np.searchsorted(cumulative, share)), len(ordered) - 1)]


def prune(graph, node_threshold=0.8, edge_threshold=0.98):  # Graph -> Pruned
    if not (0 <= node_threshold <= 1 and 0 <= edge_threshold <= 1):
        raise ValueError("node_threshold and edge_threshold are shares of the influence, from 0 to 1")
    adjacency = graph.adjacency
    n_kept = len(graph.input_ids) + len(graph.logit_token_ids)  # the tokens and logits, always kept
    n_features = len(graph.selected_features)
    logit_weights = np.zeros(len(adjacency), dtype=np.float32)
    logit_weights[-len(graph.logit_token_ids):] = graph.logit_probabilities
    node_influence = influence(normalized(adjacency), logit_weights)
    node_mask = node_influence >= threshold(node_influence, node_threshold)
    node_mask[-n_kept:] = True
    kept = adjacency * node_mask[:, None] * node_mask[None, :]
    edge_scores = normalized(kept) * (influence(normalized(kept), logit_weights) + logit_weights)[:, None]
    edge_mask = edge_scores >= threshold(edge_scores.ravel(), edge_threshold)
    before = node_mask.copy()
    drop_dangling(node_mask, edge_mask, n_features, n_kept)
    while (node_mask != before).any():  # each drop may leave others dangling
        before = node_mask.copy()
        edge_mask &= node_mask[:, None] & node_mask[None, :]
        drop_dangling(node_mask, edge_mask, n_features, n_kept)
    order = np.argsort(-node_influence, kind="stable")
    cumulative = np.empty_like(node_influence)
    cumulative[order] = np.cumsum(node_influence[order]) / node_influence.sum()
    return Pruned(node_mask, edge_mask, cumulative)


def drop_dangling(node_mask, edge_mask, n_features, n_kept):  # -> None; node_mask without the nodes left dangling
    node_mask[:-n_kept] &= edge_mask[:, :-n_kept].any(axis=0)  # features and errors need an outgoing edge
    node_mask[:n_features] &= edge_mask[:n_features].any(axis=1)  # features need an incoming one
