"""gpt2_numpy.explain's trace and logit lens: every named activation against Hugging Face (forward hooks on each block
and on ln_f, output_attentions with eager attention; scripts/fixtures/make_explain_reference.py) on configs the
model's tests were not written against, against the textbook model.py bit for bit, and the --lens table end to end."""
import json
import re

import numpy as np
import pytest

from gpt2_numpy import model
from gpt2_numpy.explain import logit_lens, trace
from gpt2_numpy.interpret import lens as lens_module, present, token_label
from gpt2_numpy.interpret.stepwise import fit
from gpt2_numpy.params import random_params
from tests.conftest import FIXTURES, run_explain, tiny_models_dir

TRACE_CONFIGS = ["five_heads", "three_heads", "one_layer"]  # 5 heads of 8; 3 heads of 16; 7 heads of 4 on one layer
HF_TOLERANCE = 2e-5  # max |ours - HF's| in float32; measured at most 8.7e-6 (the logits of three_heads)
# 11 tokens, every id below the tiny model's vocabulary of 512; a repeated token makes the embedding's row (the tied
# head reads a token back as itself) predict the next token, so some cells are marked
PROMPT = "I will go to it, and he is is it it"


def load(name):  # -> hparams, params, HF's arrays (reference_trace_<name>.npz)
    reference = np.load(FIXTURES / f"reference_trace_{name}.npz")
    hparams = json.loads(str(reference["hparams"]))
    return hparams, random_params(hparams, int(reference["seed"])), reference


@pytest.fixture(scope="module", params=TRACE_CONFIGS)
def traced(request):  # -> hparams, params, HF's arrays, our trace
    hparams, params, reference = load(request.param)
    return hparams, params, reference, trace(reference["inputs"], params, hparams["n_head"])


def test_trace_has_every_name_with_its_shape_in_float32(traced):
    hparams, _, reference, names = traced
    n, e, h, n_vocab = len(reference["inputs"]), hparams["n_embd"], hparams["n_head"], hparams["n_vocab"]
    shapes = {"embed": (n, e), "ln_f.normalized": (n, e), "ln_f": (n, e), "logits": (n, n_vocab)}
    for i in range(hparams["n_layer"]):
        shapes.update({f"blocks.{i}.{name}": shape for name, shape in {
            "ln_1.normalized": (n, e), "ln_1": (n, e), "ln_2.normalized": (n, e),
            "attn.q": (h, n, e // h), "attn.k": (h, n, e // h), "attn.v": (h, n, e // h),
            "attn.scores": (h, n, n), "attn.weights": (h, n, n), "attn.z": (h, n, e // h), "attn.out": (n, e),
            "mid": (n, e), "ln_2": (n, e), "mlp.pre": (n, 4 * e), "mlp.hidden": (n, 4 * e), "mlp.out": (n, e),
            "out": (n, e)}.items()})
    assert {name: array.shape for name, array in names.items()} == shapes
    assert {array.dtype for array in names.values()} == {np.dtype(np.float32)}


def test_trace_matches_hugging_face_block_by_block(traced):
    hparams, _, reference, names = traced
    for i in range(hparams["n_layer"]):
        assert np.abs(names[f"blocks.{i}.out"] - reference["block_out"][i]).max() <= HF_TOLERANCE, i
        assert np.abs(names[f"blocks.{i}.attn.weights"] - reference["weights"][i]).max() <= HF_TOLERANCE, i
    assert np.abs(names["ln_f"] - reference["ln_f"]).max() <= HF_TOLERANCE
    assert np.abs(names["logits"] - reference["logits"]).max() <= HF_TOLERANCE


def test_trace_is_the_textbook_model_bit_for_bit(traced):
    hparams, params, reference, names = traced
    x = names["embed"]
    for i, block_params in enumerate(params["blocks"]):
        x = model.block(x, **block_params, n_head=hparams["n_head"])
        np.testing.assert_array_equal(names[f"blocks.{i}.out"], x)
    np.testing.assert_array_equal(names["logits"], model.gpt2(reference["inputs"], **params, n_head=hparams["n_head"]))


def test_the_named_steps_are_what_their_names_say(traced):
    # from the definitions, in float64: a step swapped with its neighbour (scores after the mask, mid without its
    # residual, hidden before gelu) fails here
    hparams, params, reference, names = traced
    n = len(reference["inputs"])
    future = np.triu(np.ones((n, n), bool), 1)
    for i, p in enumerate(params["blocks"]):
        step = {name.split(".", 2)[2]: array.astype(np.float64) for name, array in names.items()
                if name.startswith(f"blocks.{i}.")}
        x = names["embed"] if i == 0 else names[f"blocks.{i - 1}.out"]
        np.testing.assert_allclose(step["ln_1"], norm(x, **p["ln_1"]), atol=1e-4)
        np.testing.assert_allclose(step["ln_1.normalized"], norm(x, 1, 0), atol=1e-4)  # before the gain and bias
        np.testing.assert_allclose(step["ln_2.normalized"], norm(step["mid"], 1, 0), atol=1e-4)
        q, k, v = step["attn.q"], step["attn.k"], step["attn.v"]
        qkv = step["ln_1"] @ p["attn"]["c_attn"]["w"] + p["attn"]["c_attn"]["b"]
        for part, heads in enumerate((q, k, v)):  # each head's slice of c_attn's output, in order
            np.testing.assert_allclose(heads.transpose(1, 0, 2).reshape(n, -1), np.split(qkv, 3, -1)[part], atol=1e-4)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
        np.testing.assert_allclose(step["attn.scores"], scores, atol=1e-4)
        assert np.isfinite(step["attn.scores"]).all()  # before the mask: the future's scores are still there
        assert (step["attn.weights"][:, future] == 0).all()
        np.testing.assert_allclose(step["attn.z"], step["attn.weights"] @ v, atol=1e-4)
        z = step["attn.z"].transpose(1, 0, 2).reshape(n, -1)  # the heads side by side
        np.testing.assert_allclose(step["attn.out"], z @ p["attn"]["c_proj"]["w"] + p["attn"]["c_proj"]["b"], atol=1e-4)
        np.testing.assert_allclose(step["mid"], step["attn.out"] + x, atol=1e-5)
        np.testing.assert_allclose(step["ln_2"], norm(step["mid"], **p["ln_2"]), atol=1e-4)
        pre = step["ln_2"] @ p["mlp"]["c_fc"]["w"] + p["mlp"]["c_fc"]["b"]
        np.testing.assert_allclose(step["mlp.pre"], pre, atol=1e-4)
        gelu = 0.5 * pre * (1 + np.tanh(np.sqrt(2 / np.pi) * (pre + 0.044715 * pre**3)))
        np.testing.assert_allclose(step["mlp.hidden"], gelu, atol=1e-4)
        mlp_out = step["mlp.hidden"] @ p["mlp"]["c_proj"]["w"] + p["mlp"]["c_proj"]["b"]
        np.testing.assert_allclose(step["mlp.out"], mlp_out, atol=1e-4)
        np.testing.assert_allclose(step["out"], step["mid"] + step["mlp.out"], atol=1e-5)


def norm(x, g, b):  # layer norm in float64, from its definition
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b


def test_the_lens_last_row_is_log_softmax_of_the_model_s_logits(traced):
    hparams, params, reference, _ = traced
    lens = logit_lens(reference["inputs"], params, hparams["n_head"])
    assert lens.shape == (hparams["n_layer"] + 1, len(reference["inputs"]), hparams["n_vocab"])
    assert lens.dtype == np.float32
    logits = model.gpt2(reference["inputs"], **params, n_head=hparams["n_head"]).astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    np.testing.assert_allclose(lens[-1], shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)), atol=1e-5)
    hf = reference["logits"].astype(np.float64)  # and so HF's log-softmax too
    hf_shifted = hf - hf.max(-1, keepdims=True)
    assert np.abs(lens[-1] - (hf_shifted - np.log(np.exp(hf_shifted).sum(-1, keepdims=True)))).max() <= 1e-4


def test_each_lens_row_normalizes_its_own_layer(traced):
    # ln_f's statistics computed afresh per layer (TransformerLens #1076 reused the last layer's): row 1 is
    # log_softmax(layer_norm(HF's block 0 output) wteᵀ), normalized by block 0's own mean and variance
    hparams, params, reference, _ = traced
    lens = logit_lens(reference["inputs"], params, hparams["n_head"])
    ln_f, wte = params["ln_f"], params["wte"].astype(np.float64)
    embedded = params["wte"][reference["inputs"]] + params["wpe"][: len(reference["inputs"])]
    for row, stream in enumerate([embedded, *reference["block_out"]]):  # the embedding, then HF's block outputs
        stream = stream.astype(np.float64)
        normed = (stream - stream.mean(-1, keepdims=True)) / np.sqrt(stream.var(-1, keepdims=True) + 1e-5)
        logits = (normed * ln_f["g"] + ln_f["b"]) @ wte.T
        shifted = logits - logits.max(-1, keepdims=True)
        expected = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        assert np.abs(lens[row] - expected).max() <= 1e-4, row
    assert np.abs(np.exp(lens).sum(-1) - 1).max() <= 1e-4  # every row a distribution


def test_the_lens_keeps_unlikely_tokens_finite():  # log(softmax) would give -inf where exp underflows
    hparams, params, reference = load("one_layer")
    params = {**params, "wte": params["wte"] * 40}  # logits spread over thousands: exp underflows float32
    lens = logit_lens(reference["inputs"], params, hparams["n_head"])
    assert np.isfinite(lens).all() and lens.min() < -200


# --- The --lens table ---


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tiny_models_dir(tmp_path_factory.mktemp("lens"))




def table_rows(stdout):  # -> {row name: [cell text, ...]} of the printed table, cells cut at their fixed width
    rows = {}
    for line in stdout.splitlines():
        if line.startswith("  ") and line[2:10].strip() not in ("", "--"):
            cells = line[10:]
            rows[line[2:10].strip()] = [cells[i : i + present.LENS_CELL].strip()
                                        for i in range(0, len(cells), present.LENS_CELL)]
    return rows


def test_lens_prints_a_row_per_layer_and_the_last_positions_of_a_long_prompt(models_dir):
    from gpt2_numpy.tokenizer import load_tokenizer

    result = run_explain(PROMPT, "--lens", models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    tokenizer = load_tokenizer(models_dir / "124M")
    ids = tokenizer.encode(PROMPT)
    shown = lens_module.LENS_COLUMNS
    assert len(ids) > shown
    assert f"showing the last {shown} of {len(ids)} positions" in result.stdout
    rows = table_rows(result.stdout)
    assert list(rows) == ["position", "token", "next", "embed", "0", "1"]
    assert rows["position"] == [str(i) for i in range(len(ids) - shown, len(ids))]
    assert rows["next"][-1] == "?"
    assert sum(cell.endswith("*") for cell in rows["embed"]) >= 1
    hparams = json.loads((models_dir / "124M" / "hparams.json").read_text())
    configs = json.loads((FIXTURES / "configs.json").read_text())
    params = random_params(configs["tiny"]["hparams"], configs["tiny"]["seed"])  # the tiny checkpoint's weights
    lens = logit_lens(ids, params, hparams["n_head"])[:, -shown:]
    for layer, name in enumerate(["embed", "0", "1"]):
        for column, cell in enumerate(rows[name]):
            position = len(ids) - shown + column
            top = int(np.argmax(lens[layer, column]))
            label, probability = cell.rsplit(" ", 1)
            hit = probability.endswith("*")
            assert label == fit(token_label(tokenizer, top), present.LENS_CELL - 7), (cell, top)
            assert abs(float(probability.rstrip("*")) - np.exp(lens[layer, column, top])) <= 0.005 + 1e-6
            assert hit == (position + 1 < len(ids) and top == ids[position + 1]), cell


def test_lens_of_a_short_prompt_shows_every_position(models_dir):
    result = run_explain("I will go", "--lens", models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    assert "showing the last" not in result.stdout
    assert table_rows(result.stdout)["position"] == ["0", "1", "2"]


@pytest.mark.parametrize("n_head", [3, 0, "4", None])
def test_every_function_of_the_api_names_a_head_count_that_does_not_divide_the_width(n_head):
    # the same words as gpt2's (checks.check_heads), not NumPy's reshape error from deep inside a block
    import gpt2_numpy
    from gpt2_numpy.decode import generate

    params = random_params({"n_vocab": 16, "n_ctx": 8, "n_embd": 8, "n_head": 2, "n_layer": 2}, 0)
    message = f"n_head={n_head!r} must be a whole number >= 1 that divides n_embd=8"
    calls = [gpt2_numpy.trace, gpt2_numpy.logit_lens, gpt2_numpy.attention_weights, gpt2_numpy.token_log_probs,
             lambda ids, params, n_head: generate(ids, params, n_head, 2),
             lambda ids, params, n_head: gpt2_numpy.gpt2(ids, **params, n_head=n_head)]
    for call in calls:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
            call([1, 2, 3], params, n_head)
