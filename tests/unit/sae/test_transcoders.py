"""Transcoder runs (gpt2_numpy/sae/transcoders.py and the trainer's step with a target): training finds a planted sparse
map with a linear part, the set written is the function trained, a run reads each MLP input as circuits/ does, and
circuit-tracer reads a trained set as we compute it (scripts/fixtures/make_trained_transcoder_reference.py)."""
import numpy as np
import pytest

from gpt2_numpy.sae.transcoder_files import load_transcoders
from gpt2_numpy.circuits.graph import attribution_graph
from gpt2_numpy.sae.transcoder_model import decode as transcoder_decode
from gpt2_numpy.sae.transcoder_model import encode as transcoder_encode
from gpt2_numpy.sae.transcoder_model import input_name, transcode, transcoder_input
from gpt2_numpy.errors import UsageError
from gpt2_numpy.interpret.tracing import trace
from gpt2_numpy.loading import load_model
from gpt2_numpy.optim import adamw_state, learning_rate
from gpt2_numpy.params import random_params
from gpt2_numpy.sae.activations import transcoder_rows
from gpt2_numpy.sae.model import encode
from gpt2_numpy.sae.training import WARMUP, SaeSettings, init_transcoders, train_step
from gpt2_numpy.sae.transcoders import INPUT_HOOKS, stacked_params, transcoder_layers, transcoder_set
from tests.conftest import FIXTURES

D, N_FEATURES = 16, 64


def planted_map(seed):  # -> batch(n, rng): [n, 1, 2 D] rows of x and y = relu(x Eᵀ - 1.5) W + x Sᵀ, a sparse map
    # (about 4 of 64 features active) with a linear part
    rng = np.random.default_rng(seed)
    E = rng.standard_normal((N_FEATURES, D))
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    W, S = rng.standard_normal((N_FEATURES, D)), rng.standard_normal((D, D)) * 0.5

    def batch(n, rng):
        x = rng.standard_normal((n, D))
        y = np.maximum(x @ E.T - 1.5, 0) @ W + x @ S.T
        return np.concatenate([x, y], axis=-1)[:, None].astype(np.float32)

    return batch, S


def settings_of(skip, steps, architecture="topk"):  # -> a one-layer transcoder run's settings
    return SaeSettings(architecture=architecture, d_in=D, d_sae=128, k=8 if architecture == "topk" else None,
                       l1=0.0 if architecture == "topk" else 0.01, lr=1e-2, batch_size=256, seed=0,
                       hook="ln_2", source="planted", data_sha256="", seq_len=None, buffer=256, steps=steps,
                       save_every=steps, target="mlp.out", layers=[0], skip=skip)


def trained(batch, settings):  # -> stacked params of a transcoder trained on fresh batches, as sae train's loop does
    rng = np.random.default_rng(1)
    params = init_transcoders(settings, batch(settings.batch_size, rng))
    opt_state, since_fired = adamw_state(params), np.zeros((1, settings.d_sae), np.int64)
    for step in range(settings.steps):
        lr = learning_rate(step, settings.lr, WARMUP, settings.steps, "constant")
        _, stats = train_step(batch(settings.batch_size, rng), params, opt_state, lr, settings, since_fired >= 2560)
        since_fired += settings.batch_size
        since_fired[stats["fired"]] = 0
    return params


def normalized_mse(params, batch, skip, architecture="topk"):  # -> E‖y - ŷ‖² / E‖y - E y‖² on a fresh batch, the
    # transcoder's output written out afresh: topk of x W_enc + b_enc (no b_dec taken from x), decoded, plus x W_skipᵀ
    rows = batch(4096, np.random.default_rng(2))[:, 0]
    x, y = rows[:, :D], rows[:, D:]
    layer = {name: value[0] for name, value in params.items()}
    f = encode(x, layer["W_enc"], layer["b_enc"], layer["b_dec"], architecture, k=8, apply_b_dec_to_input=False)
    y_hat = f @ layer["W_dec"] + layer["b_dec"] + (x @ layer["W_skip"].T if skip else 0)
    return float(np.sum((y - y_hat) ** 2) / np.sum((y - y.mean(axis=0)) ** 2))


@pytest.mark.slow
def test_a_transcoder_with_a_skip_learns_a_planted_sparse_map_and_its_linear_part():
    batch, S = planted_map(0)
    with_skip = trained(batch, settings_of(True, 400))
    without = trained(batch, settings_of(False, 400))
    assert normalized_mse(with_skip, batch, True) < 0.1  # from 1 at the start
    assert normalized_mse(without, batch, False) > 2 * normalized_mse(with_skip, batch, True)
    # the skip took the linear part: W_skip near S (the features carry the rest)
    assert np.linalg.norm(with_skip["W_skip"][0] - S) < 0.25 * np.linalg.norm(S)


@pytest.mark.parametrize("hook, target, expected", [
    ("blocks.1.ln_2", "blocks.1.mlp.out", ("ln_2", [1])),
    ("ln_2.normalized", "mlp.out", ("ln_2.normalized", [0, 1, 2])),
    ("blocks.2.hook_resid_mid", "blocks.2.hook_mlp_out", ("mid", [2])),  # TransformerLens's names
    ("blocks.0.ln2.hook_normalized", "blocks.0.mlp.out", ("ln_2.normalized", [0])),
    ("mlp.hook_in", "hook_mlp_out", ("ln_2", [0, 1, 2])),  # circuit-tracer's hooks
    ("blocks.1.mlp.hook_in", "blocks.1.hook_mlp_out", ("ln_2", [1])),
])
def test_hook_and_target_name_the_layers_trained(hook, target, expected):
    assert transcoder_layers(hook, target, 3) == expected


@pytest.mark.parametrize("hook, target, problem", [
    ("blocks.1.ln_1", "blocks.1.mlp.out", "not an MLP's input"),
    ("blocks.1.ln_2", "blocks.1.attn.out", "not an MLP's output"),
    ("blocks.1.ln_2", "blocks.2.mlp.out", "not of one layer"),
    ("ln_2", "blocks.2.mlp.out", "not of one layer"),
    ("blocks.3.ln_2", "blocks.3.mlp.out", "0 to 2"),
])
def test_hook_and_target_that_no_transcoder_has_are_refused(hook, target, problem):
    with pytest.raises(UsageError, match=problem):
        transcoder_layers(hook, target, 3)


@pytest.mark.parametrize("architecture", ["standard", "topk"])
def test_the_set_written_computes_what_was_trained(architecture):
    # circuit-tracer's layout: W_enc transposed, a topk run's threshold for every feature; transcode on the set equals
    # the training form's output for a ReLU, and keeps exactly the features above the threshold for a JumpReLU
    rng = np.random.default_rng(3)
    settings = settings_of(True, 1, architecture)._replace(layers=[0, 1])
    params = init_transcoders(settings, rng.standard_normal((8, 2, 2 * D)).astype(np.float32))
    params["b_enc"] += rng.standard_normal(params["b_enc"].shape).astype(np.float32)
    params["W_skip"] += rng.standard_normal(params["W_skip"].shape).astype(np.float32)
    threshold = np.array([0.5, 1.5], np.float32)
    transcoders = transcoder_set(params, settings, threshold)
    assert (transcoders.input_hook, transcoders.output_hook) == ("mlp.hook_in", "hook_mlp_out")
    x = rng.standard_normal((5, D)).astype(np.float32)
    for i, layer in enumerate(transcoders.layers):
        assert layer["W_enc"].shape == (128, D)
        pre = x @ params["W_enc"][i] + params["b_enc"][i]
        f = np.maximum(pre, 0) if architecture == "standard" else pre * (pre > threshold[i])
        expected = f @ params["W_dec"][i] + params["b_dec"][i] + x @ params["W_skip"][i].T
        assert np.allclose(transcode(layer, x), expected, atol=1e-5)
    back, back_threshold = stacked_params(transcoders)
    assert back.keys() == params.keys() and all(np.array_equal(back[name], params[name]) for name in params)
    assert np.array_equal(back_threshold, threshold if architecture == "topk" else [0, 0])


@pytest.mark.parametrize("step", INPUT_HOOKS)
def test_a_run_reads_the_input_the_replacement_and_the_graph_compute(step):
    # what sae train --transcoder trains on (transcoder_rows) is, at each layer, what circuits/ feeds the transcoder
    # for the hook the set names (transcoder_input of input_name's array), and the target is the MLP's output
    hparams = {"n_vocab": 40, "n_ctx": 8, "n_embd": D, "n_head": 2, "n_layer": 2}
    params, ids = random_params(hparams, 5), np.array([3, 1, 4, 1, 5, 9])
    rows = transcoder_rows(ids, params, 2, step, [0, 1])
    names = trace(ids, params, 2)
    for i in range(2):
        expected = transcoder_input(INPUT_HOOKS[step], names[input_name(INPUT_HOOKS[step], i)])
        assert np.allclose(rows[:, i, :D], expected, atol=1e-6)
        assert np.array_equal(rows[:, i, D:], names[f"blocks.{i}.mlp.out"])


@pytest.mark.parametrize("architecture", ["standard", "topk"])
def test_a_new_transcoders_first_output_is_as_large_as_its_targets_spread(architecture):
    # an MLP's output far smaller than its input (a freshly trained model's): W_enc scaled, so that the features'
    # output on the first batch is of the target's size, not the input's
    rng = np.random.default_rng(4)
    batch = np.concatenate([rng.standard_normal((64, 2, D)) * 5, rng.standard_normal((64, 2, D)) * 1e-3 + 7], axis=-1)
    settings = settings_of(False, 1, architecture)._replace(layers=[0, 1])
    params = init_transcoders(settings, batch.astype(np.float32))
    for i in range(2):
        x, y = batch[:, i, :D], batch[:, i, D:]
        f = encode(x, params["W_enc"][i], params["b_enc"][i], params["b_dec"][i], architecture, k=8,
                   apply_b_dec_to_input=False)
        size = np.sqrt(np.mean(np.sum((f @ params["W_dec"][i]) ** 2, axis=-1)))
        assert size == pytest.approx(np.sqrt(np.mean(np.sum((y - y.mean(axis=0)) ** 2, axis=-1))), rel=1e-4)
        assert np.allclose(params["b_dec"][i], y.mean(axis=0), atol=1e-5)  # b_dec the targets' mean


def test_circuit_tracer_reads_a_trained_set_as_we_compute_it():
    # sae train --transcoder's folder (topk saved as a JumpReLU, a skip, ln2.hook_normalized), loaded by circuit-tracer:
    # its features and outputs on the prompt, and its attribution graph, are ours within 1e-4
    theirs = np.load(FIXTURES / "reference_trained_graph.npz")
    hparams, params, _ = load_model(FIXTURES / "intervene_three_heads")
    transcoders = load_transcoders(FIXTURES / "transcoders_trained")
    assert transcoders.skip and all("threshold" in layer for layer in transcoders.layers)
    names = trace(theirs["input_ids"], params, hparams["n_head"])
    for layer, weights in enumerate(transcoders.layers):
        x = names[f"blocks.{layer}.ln_2.normalized"]
        features = transcoder_encode(weights, x)
        assert (features != 0).sum() == (theirs[f"features/{layer}"] != 0).sum() > 0
        np.testing.assert_allclose(features, theirs[f"features/{layer}"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(transcoder_decode(weights, features, x), theirs[f"output/{layer}"], rtol=1e-4,
                                   atol=1e-5)
    graph = attribution_graph(theirs["input_ids"], params, hparams["n_head"], transcoders)
    assert np.array_equal(graph.active_features, theirs["active_features"])
    assert graph.adjacency.shape == theirs["adjacency"].shape
    np.testing.assert_allclose(graph.adjacency, theirs["adjacency"], rtol=1e-4,
                               atol=1e-5 * np.abs(theirs["adjacency"]).max())
