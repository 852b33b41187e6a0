"""The circuits benchmark (scripts/bench/circuits.py): its check that both engines drew the same graph can fail, its
transcoders fire as often as it says, and without circuit-tracer's venv its row says how to get one."""
import numpy as np

from gpt2_numpy.circuits.graph import Graph
from scripts.bench import circuits
from scripts.bench.harness import OURS


def graph(adjacency, selected):  # -> a Graph with these fields, the rest small
    return Graph(adjacency, np.arange(12).reshape(4, 3), np.array(selected), np.ones(4, np.float32), np.array([0]),
                 np.array([1.0], np.float32), np.array([0, 1]), 1)


def test_the_check_tells_another_graph_from_the_same():
    adjacency = np.random.default_rng(0).standard_normal((5, 5)).astype(np.float32)
    theirs = {"adjacency": adjacency, "selected_features": np.array([0, 2]),
              "active_features": np.arange(12).reshape(4, 3), "logit_token_ids": np.array([0])}
    assert circuits.agreement(graph(adjacency * (1 + 1e-6), [0, 2]), theirs).endswith(": the same graph")
    moved = adjacency.copy()
    moved[3, 1] += 0.01 * np.abs(adjacency).max()  # one edge off by 1% of the largest
    assert circuits.agreement(graph(moved, [0, 2]), theirs).endswith(circuits.DIFFERENT)
    assert circuits.agreement(graph(adjacency, [0, 3]), theirs).endswith(circuits.DIFFERENT)


def test_the_transcoders_fire_a_few_per_thousand():  # the docstring's rate: P(N(0, 1) > 2.5 .. 2.8), 2.6 to 6.2 ‰
    transcoders = circuits.random_transcoders(1, 256, 4096)
    x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    x = (x - x.mean(axis=-1, keepdims=True)) / x.std(axis=-1, keepdims=True)  # as ln2.hook_normalized is
    pre = x @ transcoders.layers[0]["W_enc"].T + transcoders.layers[0]["b_enc"]
    fired = (pre > transcoders.layers[0]["threshold"]).mean()
    assert 0.002 < fired < 0.008


def test_without_circuit_tracer_the_row_is_ours_and_says_how_to_install(tmp_path):
    shape = circuits.Shape(n_layer=1, n_embd=64, n_head=1, d_transcoder=32, n_tokens=4, max_features=2)
    rows, check = circuits.graph_rows(1, shape, python=tmp_path / "no-python")
    assert check is None and rows[0][OURS] > 0 and circuits.CIRCUIT_TRACER not in rows[0]
    assert circuits.INSTALL in rows[0]["metric"]


def test_thresholds_move_off_the_prompt_s_pre_activations():  # else float32's rounding may fire a feature in one engine
    from gpt2_numpy.circuits.graph import layer_input
    from gpt2_numpy.sae.transcoder_model import pre_activations
    from gpt2_numpy.interpret.tracing import trace
    from gpt2_numpy.params import random_params

    hparams = {"n_vocab": 50257, "n_ctx": 16, "n_embd": 64, "n_head": 1, "n_layer": 1}
    params, ids = random_params(hparams), circuits.prompt(8)
    transcoders = circuits.random_transcoders(1, 64, 256)
    layer = transcoders.layers[0]
    pre = pre_activations(layer, layer_input(transcoders, 0, trace(ids, params, 1)))
    layer["threshold"][:10] = pre[5, :10]  # ten features exactly at their threshold
    before = layer["threshold"].copy()
    circuits.thresholds_off_the_prompt(transcoders, params, 1, ids)
    assert np.abs(pre - layer["threshold"]).min() >= circuits.MARGIN
    assert 10 <= np.count_nonzero(layer["threshold"] != before) < 20  # those, and the few others as near
