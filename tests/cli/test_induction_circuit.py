"""scripts/demo/induction_circuit.py's arithmetic: each node's total effect on a logit through the graph's paths, and
the local replacement model its interventions run in. Expected values: a linear toy model recomputed by hand, and
interventions on the test models of tests/unit/test_circuits.py, whose graphs equal circuit-tracer's."""
import numpy as np
import pytest

from gpt2_numpy import load_model
from gpt2_numpy.sae.transcoder_files import load_transcoders
from gpt2_numpy.circuits.graph import attribution_graph
from gpt2_numpy.sae.replacement import replacement_edits
from gpt2_numpy.interpret.tracing import trace
from scripts.demo.induction_circuit import graph_model_edits, logit_less_mean, total_effects
from tests.conftest import FIXTURES


def test_total_effects_are_a_linear_model_s_changes_when_a_source_is_zeroed():
    # a linear model: tokens t0, t1; features f0 = 2 t0 - t1 + 0.5, f1 = 3 f0 + t1; logit = f0 - 2 f1 + 4 t0. An edge
    # is the source's value times its weight; zeroing a source (its descendants recomputed) changes the logit by
    # minus its total effect
    def run(zeroed=None):  # -> {node: value}
        values = {"t0": 1.5, "t1": -0.7}
        values.update({name: 0.0 for name in values if name == zeroed})
        values["f0"] = 0.0 if zeroed == "f0" else 2 * values["t0"] - values["t1"] + 0.5
        values["f1"] = 0.0 if zeroed == "f1" else 3 * values["f0"] + values["t1"]
        values["logit"] = values["f0"] - 2 * values["f1"] + 4 * values["t0"]
        return values

    clean, order = run(), ["f0", "f1", "t0", "t1", "logit"]  # features, tokens, logit: the graph's node order
    weights = {("f0", "t0"): 2, ("f0", "t1"): -1, ("f1", "f0"): 3, ("f1", "t1"): 1, ("logit", "f0"): 1,
               ("logit", "f1"): -2, ("logit", "t0"): 4}
    adjacency = np.zeros((5, 5))
    for (target, source), weight in weights.items():
        adjacency[order.index(target), order.index(source)] = weight * clean[source]
    activations = np.array([clean["f0"], clean["f1"], np.nan, np.nan, np.nan])
    effects = total_effects(adjacency, activations, order.index("logit"))
    for node, name in enumerate(order[:4]):
        np.testing.assert_allclose(-effects[node], run(zeroed=name)["logit"] - clean["logit"], rtol=1e-12,
                                   err_msg=name)


@pytest.mark.parametrize("case, folder", [("skip", "three_heads"), ("jumprelu", "four_heads")])
def test_the_graph_predicts_a_feature_switched_off_in_its_own_replacement_model(case, folder):
    # attention, LayerNorm denominators and MLP errors held at the prompt's: the model the graph linearizes, so the
    # strongest features' total effects are the changes measured there (features downstream stay on: these do)
    hparams, params, _ = load_model(FIXTURES / f"intervene_{folder}")
    transcoders, n_head, n_layer = load_transcoders(FIXTURES / f"transcoders_{case}"), hparams["n_head"], hparams[
        "n_layer"]
    ids = np.load(FIXTURES / "reference_graph.npz")[f"{case}/input_ids"]
    graph = attribution_graph(ids, params, n_head, transcoders)
    n_features, n_seq = len(graph.selected_features), len(ids)
    activations = np.full(len(graph.adjacency), np.nan)
    activations[:n_features] = graph.activation_values[graph.selected_features]
    effects = total_effects(graph.adjacency.astype(np.float64), activations, n_features + n_layer * n_seq + n_seq)
    frozen, errors = graph_model_edits(trace(ids, params, n_head), transcoders, n_layer)
    token = int(graph.logit_token_ids[0])
    before = logit_less_mean(ids, params, n_head, frozen + replacement_edits(transcoders) + errors, token)
    for node in np.argsort(-np.abs(effects[:n_features]))[:4]:
        feature = tuple(map(int, graph.active_features[graph.selected_features[node]]))
        edits = frozen + replacement_edits(transcoders, zeroed=[feature]) + errors
        measured = logit_less_mean(ids, params, n_head, edits, token) - before
        np.testing.assert_allclose(measured, -effects[node], rtol=5e-3, atol=1e-6, err_msg=str(feature))
