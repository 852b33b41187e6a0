"""Attribution patching (Nanda 2023; edges: Syed et al. 2023; integrated gradients: Hanna et al. 2024): activation
patching's effect of every component at once, estimated to first order from one clean run, one corrupt run and one
backward pass (gradients.py's).

    scores = attribution_patching(clean_ids, corrupt_ids, params, n_head, logit_difference(a, b), edges=True)
    scores.nodes   # [n_writers, n_seq]: (a_clean - a_corrupt) · d metric / d a, on the corrupt run
    scores.edges   # [n_writers, n_readers, n_seq]: a writer's change · the gradient at a reader's input

The nodes and edges are TransformerLens 4's (transformer_lens.tools.analysis.attribution_patching), and so is the
sign: the gradient is the corrupt run's, and a positive score says that moving the node from its corrupt value toward
its clean one raises the metric (the denoising form). Writers are what adds to the residual stream: the embedding
(`embed`), each head's output (`attn_head_out`, scored at its z) and each MLP's (`mlp_out`). Readers are what reads
it: each head's query, key and value inputs (`q_input`, `k_input`, `v_input`: the stream before ln_1, as that head's
projection alone reads it), each MLP's (`mlp_in`, before ln_2) and the logits (`logits`: the last block's output).
An edge joins a writer to each reader after it at the same position; its score is the writer's clean-minus-corrupt
write, through W_O for a head, dotted with the gradient at the reader's input. A writer's edges add up to its node
score, since the stream at a position is the sum of the writes and its gradient the sum of its readers'.

ig_steps=N > 1 is EAP-IG: the gradients averaged over N runs whose embedding goes from the corrupt one toward the
clean one, at corrupt + k/N (clean - corrupt) for k = 0..N-1 (so N = 1 is plain attribution patching). The embedding
nodes' scores then add up, over positions, to the metric's clean-minus-corrupt change as N grows.
"""
from typing import NamedTuple, Optional

import numpy as np

from gpt2_numpy.backward import layer_norm_backward
from gpt2_numpy.errors import NothingToRecover
from gpt2_numpy.interpret.edits import Edit, resid_pre, run_with_edits
from gpt2_numpy.interpret.gradients import run_gradients
from gpt2_numpy.interpret.tracing import embedding, unembedding
from gpt2_numpy.model import attention, causal_mask, ffn, layer_norm, linear, merge_heads


FAITHFUL_EDGES = (10, 100, 1000)  # the circuits whose faithfulness explain reports: the k strongest edges


class Node(NamedTuple):  # TransformerLens's Node(kind, position, layer, head) less its position: the arrays' last axis
    kind: str  # writers: embed, attn_head_out, mlp_out; readers: q_input, k_input, v_input, mlp_in, logits
    layer: Optional[int] = None  # None where a field does not apply
    head: Optional[int] = None


class AttributionScores(NamedTuple):
    writers: list  # [Node]: the rows of nodes and edges
    readers: list  # [Node]: the columns of edges
    nodes: np.ndarray  # [n_writers, n_seq]: each writer's score at each position
    edges: Optional[np.ndarray]  # [n_writers, n_readers, n_seq], 0 where no edge joins them; None unless asked for
    clean: float  # the metric on the clean run
    corrupt: float  # and on the corrupt one


def writer_nodes(n_layer, n_head):  # -> [Node]: the embedding, then each layer's heads and MLP
    layers = [[Node("attn_head_out", layer, head) for head in range(n_head)] + [Node("mlp_out", layer)]
              for layer in range(n_layer)]
    return [Node("embed")] + [node for layer in layers for node in layer]


def reader_nodes(n_layer, n_head):  # -> [Node]: each layer's heads' q, k, v inputs and its MLP's, then the logits
    layers = [[Node(kind, layer, head) for kind in ("q_input", "k_input", "v_input") for head in range(n_head)]
              + [Node("mlp_in", layer)] for layer in range(n_layer)]
    return [node for layer in layers for node in layer] + [Node("logits", n_layer - 1)]


def stage(node):  # -> when a node writes or reads along the stream: a reader reads the writers of earlier stages
    if node.kind in ("embed", "logits"):
        return 0 if node.kind == "embed" else float("inf")
    return 2 * node.layer + (2 if node.kind in ("mlp_out", "mlp_in") else 1)


def edge_mask(writers, readers):  # -> bool [n_writers, n_readers]: where an edge joins them
    return np.array([[stage(writer) < stage(reader) for reader in readers] for writer in writers])


def attribution_patching(clean_ids, corrupt_ids, params, n_head, metric, edges=False, ig_steps=1):
    """Every writer's attribution-patching score at each position (and, with edges=True, every edge's), for the
    metric of gradients.py (logit_difference(a, b) is TransformerLens's and --patch's). clean_ids and corrupt_ids are
    prompts of the same length. ValueError for prompts of different lengths or ig_steps < 1."""
    if len(clean_ids) != len(corrupt_ids):
        raise ValueError(f"the clean prompt has {len(clean_ids)} tokens and the corrupt one {len(corrupt_ids)}: "
                         "attribution patching compares them position by position")
    if isinstance(ig_steps, bool) or not isinstance(ig_steps, (int, np.integer)) or ig_steps < 1:
        raise ValueError(f"ig_steps={ig_steps!r}: a whole number of steps, 1 or more")
    n_layer = len(params["blocks"])
    clean, corrupt = (run_with_edits(ids, params, n_head, []) for ids in (clean_ids, corrupt_ids))
    writers, readers = writer_nodes(n_layer, n_head), reader_nodes(n_layer, n_head)
    grads, reader_grads = mean_gradients(clean, corrupt, params, n_head, metric, edges, ig_steps)
    nodes = np.stack([np.sum((a - b) * g, axis=-1) for a, b, g in  # (a_clean - a_corrupt) · g, at each position
                      zip(*(node_values(arrays, n_layer) for arrays in (clean, corrupt, grads)))])
    edge_scores = None
    if edges:  # [n_writers, n_seq, n_embd] · [n_readers, n_seq, n_embd], at each position
        writes = writer_writes(clean, params, n_head) - writer_writes(corrupt, params, n_head)
        edge_scores = np.einsum("wpe,rpe->wrp", writes, reader_grads) * edge_mask(writers, readers)[..., None]
    return AttributionScores(writers, readers, nodes, edge_scores, metric(clean)[0], metric(corrupt)[0])


def patching_effects(clean_ids, corrupt_ids, params, n_head, metric):  # -> [n_writers]: activation patching's
    """The true effect that each writer's score estimates, summed over positions: the metric of the corrupt run with
    the writer's array (embed, a head's z, an MLP's output) copied from the clean run at every position, less the
    corrupt run's. One forward pass per writer."""
    clean = run_with_edits(clean_ids, params, n_head, [])
    corrupt = metric(run_with_edits(corrupt_ids, params, n_head, [], names=["logits"]))[0]
    effects = []
    for name, head in writer_arrays(len(params["blocks"]), n_head):
        value = clean[name] if head is None else clean[name][head]
        patched = run_with_edits(corrupt_ids, params, n_head, [Edit(name, lambda _, value=value: value, head)],
                                 names=["logits"])
        effects.append(metric(patched)[0] - corrupt)
    return np.array(effects)


def writer_arrays(n_layer, n_head):  # -> [(trace name, head or None)]: each writer's array, in writer_nodes's order
    return [("embed", None) if node.kind == "embed" else
            (f"blocks.{node.layer}.attn.z", node.head) if node.kind == "attn_head_out" else
            (f"blocks.{node.layer}.mlp.out", None) for node in writer_nodes(n_layer, n_head)]


def faithfulness(clean_ids, corrupt_ids, params, n_head, metric, kept):  # -> fraction of the gap recovered
    """TransformerLens's faithfulness check, its corrupt ablation: the clean run with every edge outside the circuit
    `kept` (bool [n_writers, n_readers, n_seq], as AttributionScores.edges) ablated, each reader then reading the
    corrupt run's write of that writer in place of the live one; (m_ablated - m_corrupt) / (m_clean - m_corrupt): 1
    when the circuit alone carries the clean behaviour, 0 when it carries none of it. NothingToRecover when the two
    runs give the metric one value."""
    n_layer = len(params["blocks"])
    excluded = edge_mask(writer_nodes(n_layer, n_head), reader_nodes(n_layer, n_head))[..., None] & ~kept
    clean, corrupt = (run_with_edits(ids, params, n_head, [], names=["logits"]) for ids in (clean_ids, corrupt_ids))
    corrupt_writes = writer_writes(run_with_edits(corrupt_ids, params, n_head, []), params, n_head)
    ablated = {"logits": ablated_logits(clean_ids, params, n_head, excluded, corrupt_writes)}
    m_clean, m_corrupt, m_ablated = (metric(arrays)[0] for arrays in (clean, corrupt, ablated))
    if m_clean == m_corrupt:  # every fraction would be 0 / 0
        raise NothingToRecover(m_clean)
    return (m_ablated - m_corrupt) / (m_clean - m_corrupt)


def faithfulness_of_strongest(clean_ids, corrupt_ids, params, n_head, metric, scores):  # -> [(k, recovered)]
    """faithfulness of the circuits of the k strongest edges, for each k of FAITHFUL_EDGES below the edges' count."""
    n_edges = edge_mask(scores.writers, scores.readers).sum() * scores.edges.shape[-1]
    return [(k, faithfulness(clean_ids, corrupt_ids, params, n_head, metric, strongest_edges(scores, k)))
            for k in FAITHFUL_EDGES if k < n_edges]


def strongest_edges(scores, k):  # -> bool [n_writers, n_readers, n_seq]: the k edges of largest |score|
    # in TransformerLens's order where they tie (top_edges's stable sort): by position, then reader, then writer
    edges = np.moveaxis(scores.edges, -1, 0).transpose(0, 2, 1)  # [n_seq, n_readers, n_writers]
    valid = np.broadcast_to(edge_mask(scores.writers, scores.readers).T, edges.shape).ravel()
    order = np.flatnonzero(valid)[np.argsort(-np.abs(edges.ravel()[valid]), kind="stable")[:k]]
    kept = np.zeros(edges.size, bool)
    kept[order] = True
    return np.moveaxis(kept.reshape(edges.shape).transpose(0, 2, 1), 0, -1)


def ablated_logits(ids, params, n_head, excluded, corrupt_writes):  # int [n_seq] -> [n_seq, n_vocab]
    """The forward pass with each reader's input rebuilt: the stream, less the live writes of the writers whose edge
    to it is excluded ([n_writers, n_readers, n_seq]), plus their corrupt_writes. Each head's q, k and v read inputs
    of their own, so this pass runs the heads one by one (as TransformerLens's split q/k/v inputs do)."""
    x = embedding(ids, params["wte"], params["wpe"])
    live, first = [x], 0  # the writes made so far, in writer_nodes's order; the layer's first reader
    for block in params["blocks"]:
        n_readers = 3 * n_head + 1  # q, k, v of each head, then the MLP's input
        inputs = reader_inputs(x, live, corrupt_writes, excluded[:, first:first + n_readers])
        z = split_attention(inputs[:-1].reshape(3, n_head, *x.shape), block["ln_1"], block["attn"]["c_attn"])
        w_o = block["attn"]["c_proj"]["w"]
        live += list(z @ w_o.reshape(n_head, -1, w_o.shape[-1]))  # each head's write: writer_writes's
        mid = x + linear(merge_heads(z), **block["attn"]["c_proj"])
        mlp_in = reader_inputs(mid, live, corrupt_writes, excluded[:, first + n_readers - 1:first + n_readers])[0]
        live.append(ffn(layer_norm(mlp_in, **block["ln_2"]), **block["mlp"]))
        x, first = mid + live[-1], first + n_readers
    final = reader_inputs(x, live, corrupt_writes, excluded[:, -1:])[0]  # the logits' reader
    return unembedding(layer_norm(final, **params["ln_f"]), params["wte"])


def reader_inputs(x, live, corrupt_writes, excluded):  # [n_seq, n_embd], [n_live] -> [n_readers, n_seq, n_embd]
    swaps = np.stack(live) - corrupt_writes[:len(live)]  # a writer later than a reader has no edge to it
    return x - np.einsum("wrp,wpe->rpe", excluded[:len(live)], swaps)


def split_attention(inputs, ln_1, c_attn):  # [3, n_head, n_seq, n_embd] -> z [n_head, n_seq, d_head]
    # mha's first lines, each head's q, k and v from an input of its own: c_attn's columns of that head alone
    n_embd, n_head = c_attn["w"].shape[0], inputs.shape[1]
    w_heads = np.moveaxis(c_attn["w"].reshape(n_embd, 3, n_head, -1), 0, 2)  # [3, n_head, n_embd, d_head]
    q, k, v = layer_norm(inputs, **ln_1) @ w_heads + c_attn["b"].reshape(3, n_head, 1, -1)
    return attention(q, k, v, causal_mask(inputs.shape[-2]))


def mean_gradients(clean, corrupt, params, n_head, metric, edges, ig_steps):  # -> {name: gradient}, readers' or None
    # the gradients at the writers' arrays (and at the readers' inputs) on the corrupt run, or their mean over the
    # runs whose embedding goes from the corrupt one toward the clean one (EAP-IG)
    n_layer = len(params["blocks"])
    names = ["embed"] + [f"blocks.{layer}.{step}" for layer in range(n_layer) for step in ("attn.z", "mlp.out")]
    if edges:
        names += [f"blocks.{layer}.{step}" for layer in range(n_layer) for step in ("attn.q", "attn.k", "attn.v",
                                                                                     "ln_2")]
        names.append(f"blocks.{n_layer - 1}.out")  # the logits' reader: the stream ln_f reads
    total, total_readers = {}, 0
    for step in range(ig_steps):
        run = corrupt if step == 0 else interpolated(corrupt, clean, step / ig_steps, params, n_head)
        _, grads = run_gradients(run, params, n_head, metric, names)
        total = {name: total.get(name, 0) + grad for name, grad in grads.items()}
        if edges:
            total_readers = total_readers + reader_gradients(run, grads, params, n_head)
    return ({name: grad / ig_steps for name, grad in total.items()},
            total_readers / ig_steps if edges else None)


def interpolated(corrupt, clean, alpha, params, n_head):  # -> the run whose embedding is corrupt's moved alpha of the
    # way to clean's: every array after it computed from there
    embed = corrupt["embed"] + alpha * (clean["embed"] - corrupt["embed"])
    return {"embed": embed, **run_with_edits(embed, params, n_head, [], start_at_layer=0)}


def node_values(arrays, n_layer):  # -> [writer's array [n_seq, width]], in writer_nodes's order
    values = [arrays["embed"]]
    for layer in range(n_layer):
        values += list(arrays[f"blocks.{layer}.attn.z"])  # each head's z [n_seq, d_head]: TransformerLens's hook_z
        values.append(arrays[f"blocks.{layer}.mlp.out"])
    return values


def writer_writes(arrays, params, n_head):  # -> [n_writers, n_seq, n_embd]: what each writer adds to the stream
    writes = [arrays["embed"][None]]
    for layer, block in enumerate(params["blocks"]):
        w_o = block["attn"]["c_proj"]["w"]  # [n_embd, n_embd]: head h's z reads rows h d_head .. (h + 1) d_head
        writes.append(arrays[f"blocks.{layer}.attn.z"] @ w_o.reshape(n_head, -1, w_o.shape[-1]))  # [n_head, ..]
        writes.append(arrays[f"blocks.{layer}.mlp.out"][None])
    return np.concatenate(writes)


def reader_gradients(run, grads, params, n_head):  # -> [n_readers, n_seq, n_embd]: the gradient at each reader's input
    readers = []
    for layer, block in enumerate(params["blocks"]):
        w = block["attn"]["c_attn"]["w"]  # [n_embd, 3 n_embd]: q, k, v's columns, each head's d_head of them
        w_heads = np.moveaxis(w.reshape(w.shape[0], 3, n_head, -1), 0, -1)  # [3, n_head, d_head, n_embd]
        d_heads = np.stack([grads[f"blocks.{layer}.attn.{kind}"] for kind in "qkv"])  # [3, n_head, n_seq, d_head]
        # each head's q, k or v alone back through ln_1: the stream's gradient along that one reader
        d_inputs = layer_norm_backward(d_heads @ w_heads, run[resid_pre(layer)], block["ln_1"]["g"])[0]
        readers += [*d_inputs.reshape(-1, *d_inputs.shape[-2:]),
                    layer_norm_backward(grads[f"blocks.{layer}.ln_2"], run[f"blocks.{layer}.mid"],
                                        block["ln_2"]["g"])[0]]
    readers.append(grads[f"blocks.{len(params['blocks']) - 1}.out"])
    return np.stack(readers)


# --- What explain --attribution-patching prints ---

TOP_EDGES = 20  # the table's strongest edges; --json has every one


def node_label(node):  # -> "embed", "L1 H2", "L1 MLP", "L1 H2 q", "L1 MLP in", "logits": a table's name of a node
    if node.kind in ("embed", "logits"):
        return node.kind
    suffix = {"mlp_in": " in", "q_input": " q", "k_input": " k", "v_input": " v"}.get(node.kind, "")
    return f"L{node.layer} " + ("MLP" if node.head is None else f"H{node.head}") + suffix


def attribution_patching_table(scores, effects, faithful, answers, label, ig_steps, clean_ids):  # -> explain's text
    """effects: patching_effects's, each writer's true effect over all positions, beside its score; faithful:
    faithfulness_of_strongest's [(k, recovered)]."""
    a, b = (label(answer) for answer in answers)
    method = f"EAP-IG, {ig_steps} steps" if ig_steps > 1 else "one gradient, on the corrupt run"
    lines = [f"Attribution patching ({method}): metric logit({a}) - logit({b}) at the last position:",
             f"clean {scores.clean:.4f}, corrupt {scores.corrupt:.4f}",
             "score: (clean - corrupt activation) · the metric's gradient on the corrupt run, the first-order estimate "
             "of how", "much copying a node's clean value into the corrupt run raises the metric (TransformerLens's "
             "sign); patched: what", "that copy, at every position, really does", "",
             f"{'node':<10}{'score':>10}{'patched':>10}   {'the strongest position':>22}"]
    for node, row, effect in zip(scores.writers, scores.nodes, effects):
        lines.append(f"{node_label(node):<10}{row.sum():10.4f}{effect:10.4f}   {position_cells(row, label, clean_ids)}")
    if scores.edges is not None:
        lines += ["", f"The {TOP_EDGES} strongest edges (writer -> reader, at a position):"]
        strongest = np.argsort(-np.abs(scores.edges), axis=None, kind="stable")[:TOP_EDGES]
        for writer, reader, position in zip(*np.unravel_index(strongest, scores.edges.shape)):
            edge = f"{node_label(scores.writers[writer])} -> {node_label(scores.readers[reader])}"
            lines.append(f"{edge:<24}" + position_cells(scores.edges[writer, reader], label, clean_ids, position))
    if faithful:  # none when the runs give the metric one value
        lines += ["", "Faithfulness: the k strongest edges kept, every other edge's write replaced by the corrupt "
                  "run's as its reader", "reads it (TransformerLens's), in the clean run; the fraction of the gap "
                  "that remains:"]
        lines += [f"{k:>8} edges {recovered:10.4f}" for k, recovered in faithful]
    return "\n".join(lines) + "\n"


def position_cells(row, label, clean_ids, position=None):  # -> "  5 'J'        -0.5738": a position and its score
    position = int(np.argmax(np.abs(row))) if position is None else position  # the strongest, unless given
    return f"{position:>4} {label(clean_ids[position]):<12}{row[position]:10.4f}"


def attribution_patching_json(scores, faithful):  # -> {"clean", "corrupt", "nodes", "edges", "faithfulness"}
    n_seq = scores.nodes.shape[-1]
    nodes = [{**node_json(node, position), "score": float(row[position] if position is not None else row.sum())}
             for node, row in zip(scores.writers, scores.nodes) for position in [*range(n_seq), None]]
    edges = [] if scores.edges is None else [
        {"writer": node_json(scores.writers[writer], position), "reader": node_json(scores.readers[reader], position),
         "score": float(scores.edges[writer, reader, position])}
        for writer, reader in zip(*np.nonzero(edge_mask(scores.writers, scores.readers))) for position in range(n_seq)]
    return {"clean": scores.clean, "corrupt": scores.corrupt, "nodes": nodes, "edges": edges,
            "faithfulness": [{"edges": k, "recovered": recovered} for k, recovered in faithful]}


def node_json(node, position):  # -> {"kind", "layer", "head", "position"}: null where a field does not apply
    return {"kind": node.kind, "layer": node.layer, "head": node.head,
            "position": None if position is None else int(position)}
