"""An SAE spliced into the model (gpt2_numpy/sae/evaluation.py): an exact SAE recovers all of the loss, one that decodes
everything to zero none of it, each loss against the model's own next-token loss computed here; transcoders in place
of the MLPs against a forward pass composed here of model.py's functions."""
import numpy as np
import pytest

from gpt2_numpy.interpret.tracing import log_softmax, trace
from gpt2_numpy.params import random_params
from gpt2_numpy.sae.transcoder_model import TranscoderSet
from gpt2_numpy.model import ffn, layer_norm, mha
from gpt2_numpy.sae.evaluation import evaluate, evaluate_transcoders
from gpt2_numpy.tokenizer import token_windows
from tests.sae_helpers import exact_sae

HPARAMS = {"n_vocab": 50, "n_ctx": 16, "n_embd": 8, "n_head": 2, "n_layer": 2}


def test_an_exact_sae_recovers_all_the_loss_and_a_zero_one_none():
    params = random_params(HPARAMS, 4)
    windows = token_windows(np.random.default_rng(2).integers(0, 50, 70), 16, targets=True)  # 4 windows of 17
    clean = np.mean([-log_softmax(trace(w[:-1], params, 2)["logits"])[np.arange(16), w[1:]].mean() for w in windows])
    exact = exact_sae(8, "blocks.0.out")
    numbers = evaluate(exact, params, 2, windows)
    assert numbers["tokens"] == 64 and numbers["L_clean"] == pytest.approx(clean, rel=1e-5)
    assert numbers["L_sae"] == pytest.approx(clean, rel=1e-5)
    assert numbers["loss_recovered"] == pytest.approx(1, abs=1e-4)
    assert numbers["mse"] == pytest.approx(0, abs=1e-9) and numbers["explained_variance"] == pytest.approx(1, abs=1e-6)
    exact.params["W_dec"] = np.zeros_like(exact.params["W_dec"])  # every activation decoded to b_dec = 0: zeroed
    numbers = evaluate(exact, params, 2, windows)
    assert numbers["L_sae"] == pytest.approx(numbers["L_zero"], rel=1e-5)
    assert numbers["loss_recovered"] == pytest.approx(0, abs=1e-4)
    assert numbers["L_zero"] != pytest.approx(clean, abs=1e-3)
    # x̂ = 0 everywhere: cos(x, 0) is 0 with torch's eps under each norm, and E‖x̂‖² / E[x·x̂] is 0 / 0, undefined (no
    # NaN in the JSON)
    assert numbers["cossim"] == 0 and numbers["relative_reconstruction_bias"] is None


def hand_run(ids, params, mlps):  # -> (logits [n_seq, n_vocab], {layer: MLP output}) of the model composed afresh of
    # model.py's functions, block L's MLP output mlps[L](x, ln_2's output, its MLP's output) where mlps names it
    x = params["wte"][ids] + params["wpe"][np.arange(len(ids))]
    outputs = {}
    for layer, block in enumerate(params["blocks"]):
        x = x + mha(layer_norm(x, **block["ln_1"]), **block["attn"], n_head=2)
        h = layer_norm(x, **block["ln_2"])
        outputs[layer] = ffn(h, **block["mlp"])
        x = x + mlps.get(layer, lambda x, h, out: out)(x, h, outputs[layer])
    return layer_norm(x, **params["ln_f"]) @ params["wte"].T, outputs


def hand_transcoder(params, hook, features=None):  # -> mlps entry: the transcoder's output, written out: ReLU or
    # JumpReLU, and a skip; each call's features appended to `features`
    def output(x, h, out):
        inputs = {"ln2.hook_normalized": (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5),
                  "mlp.hook_in": h, "hook_resid_mid": x}[hook]
        pre = inputs @ params["W_enc"].T + params["b_enc"]
        f = np.where(pre > params.get("threshold", 0), pre, 0)
        (features if features is not None else []).append(f)
        return f @ params["W_dec"] + params["b_dec"] + (inputs @ params["W_skip"].T if "W_skip" in params else 0)
    return output


def nats(logits, targets):  # -> the mean next-token loss
    shifted = logits - logits.max(-1, keepdims=True)
    return float(np.mean(np.log(np.exp(shifted).sum(-1)) - shifted[np.arange(len(targets)), targets]))


@pytest.mark.parametrize("hook, layers, extra", [("ln2.hook_normalized", [0, 1], "W_skip"),
                                                 ("hook_resid_mid", [1], "threshold"), ("mlp.hook_in", [0], None)])
def test_transcoders_in_place_of_the_mlps_against_a_pass_composed_here(hook, layers, extra):
    params = random_params(HPARAMS, 4)
    rng = np.random.default_rng(7)
    shapes = {"W_enc": (32, 8), "b_enc": (32,), "W_dec": (32, 8), "b_dec": (8,), "W_skip": (8, 8), "threshold": (32,)}
    parts = [name for name in shapes if name not in ("W_skip", "threshold") or name == extra]
    sets = [{name: (rng.standard_normal(shapes[name]) * (0.3 if name != "threshold" else 0.5)).astype(np.float32)
             for name in parts} for _ in layers]
    transcoders = TranscoderSet(sets, hook, "hook_mlp_out")
    windows = token_windows(rng.integers(0, 50, 40), 16, targets=True)  # 2 windows of 17
    numbers = evaluate_transcoders(transcoders, layers, params, 2, windows)
    replaced = {layer: hand_transcoder(p, hook) for layer, p in zip(layers, sets)}
    zeroed = {layer: lambda x, h, out: 0 * out for layer in layers}
    expected = {name: np.mean([nats(hand_run(w[:-1], params, mlps)[0], w[1:]) for w in windows])
                for name, mlps in (("L_clean", {}), ("L_replaced", replaced), ("L_zero", zeroed))}
    for name, value in expected.items():
        assert numbers[name] == pytest.approx(value, rel=1e-5), name
    assert numbers["loss_recovered"] == pytest.approx(
        (expected["L_zero"] - expected["L_replaced"]) / (expected["L_zero"] - expected["L_clean"]), rel=1e-4)
    assert [row["layer"] for row in numbers["layers"]] == layers and numbers["tokens"] == 32
    for row, layer, p in zip(numbers["layers"], layers, sets):
        y, y_hat, f = [], [], []
        for w in windows:  # on the clean run: each transcoder's output against its MLP's
            _, outputs = hand_run(w[:-1], params, {layer: lambda x, h, out: y_hat.append(
                hand_transcoder(p, hook, f)(x, h, out)) or out})
            y.append(outputs[layer])
        y, y_hat, f = np.concatenate(y), np.concatenate(y_hat), np.concatenate(f)
        assert row["mse"] == pytest.approx(np.mean(np.sum((y - y_hat) ** 2, -1)), rel=1e-4)
        assert row["explained_variance"] == pytest.approx(
            1 - np.sum((y - y_hat) ** 2) / np.sum((y - y.mean(0)) ** 2), rel=1e-4)
        assert row["l0"] == pytest.approx(np.mean(np.sum(f != 0, -1))) and 0 < row["l0"] < 32
