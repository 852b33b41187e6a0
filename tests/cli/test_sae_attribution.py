"""`explain PROMPT --sae DIR --attribute A B`: each SAE latent's activation times the gradient of logit(A) - logit(B)
with respect to it, the SAE spliced in, against finite differences through the model and the SAE written out here from
model.py's functions (an SAE at blocks.1.attn.z, heads side by side, that layer-normalises its input as OpenAI's
do); the table; and bad input as one error line."""
import json
import re
import subprocess

import numpy as np
import pytest

from gpt2_numpy import model
from gpt2_numpy.commands import explain as explain_command
from gpt2_numpy.params import random_params
from gpt2_numpy.sae import new_sae, save_sae
from tests.cli.test_sae_latents import byte_ids
from tests.conftest import assert_one_error_line, byte_model_dir

HPARAMS = {"n_vocab": 257, "n_ctx": 16, "n_embd": 16, "n_head": 4, "n_layer": 2}
HOOK = "blocks.1.attn.z"
PROMPT = "the cat sat on t"
A, B = "h", "e"  # byte tokens: one each


@pytest.fixture(scope="module")
def folders(tmp_path_factory):  # -> (model folder, SAE folder, params, SAE weights)
    root = tmp_path_factory.mktemp("attribution")
    params = random_params(HPARAMS, 5)
    byte_model_dir(root / "model", HPARAMS, params)
    rng = np.random.default_rng(3)
    weights = {"W_enc": rng.normal(0, 0.4, (16, 24)), "b_enc": rng.normal(-0.3, 0.1, 24),
               "W_dec": rng.normal(0, 0.3, (24, 16)), "b_dec": rng.normal(0, 0.1, 16)}
    sae = new_sae({"architecture": "standard"}, weights, HOOK)
    sae.cfg["normalize_activations"] = "layer_norm"
    save_sae(sae, root / "sae")
    return root / "model", root / "sae", params, weights


def explain(folders, capsys, *more):  # -> what explain prints, run in this process as the command line runs it
    model_dir, sae_dir, _, _ = folders
    capsys.readouterr()
    status = explain_command.run([PROMPT, "--model", str(model_dir), "--sae", str(sae_dir), *more])
    assert status == 0
    return capsys.readouterr().out


def spliced_metric(params, weights, ids, latent_scale):  # -> logit(A) - logit(B) with the SAE spliced in at HOOK
    """model.py's functions and the SAE written out here, in float64: latent_scale(f) -> the latents carried on."""
    n_head = HPARAMS["n_head"]
    x = params["wte"][ids] + params["wpe"][:len(ids)]
    x = model.block(x, **params["blocks"][0], n_head=n_head)
    block = params["blocks"][1]
    q, k, v = np.split(model.linear(model.layer_norm(x, **block["ln_1"]), **block["attn"]["c_attn"]), 3, axis=-1)
    z = model.attention(*(model.split_heads(part, n_head) for part in (q, k, v)), model.causal_mask(len(ids)))
    rows = model.merge_heads(z)  # [n_seq, n_embd]: heads side by side, as the SAE reads hook_z
    mu = rows.mean(axis=-1, keepdims=True)  # SAELens's layer_norm: the unbiased σ, ε added to σ
    sigma = (rows - mu).std(axis=-1, ddof=1, keepdims=True)
    f = np.maximum(((rows - mu) / (sigma + 1e-5) - weights["b_dec"]) @ weights["W_enc"] + weights["b_enc"], 0)
    rows = (latent_scale(f) @ weights["W_dec"] + weights["b_dec"]) * sigma + mu
    x = x + model.linear(rows, **block["attn"]["c_proj"])
    x = x + model.ffn(model.layer_norm(x, **block["ln_2"]), **block["mlp"])
    logits = model.layer_norm(x, **params["ln_f"]) @ params["wte"].T
    return logits[-1, byte_ids(A)[0]] - logits[-1, byte_ids(B)[0]], f


def test_each_latent_s_attribution_is_the_spliced_metric_s_slope_in_its_scale(folders, capsys):
    _, _, params, weights = folders
    params = float64(params)
    ids = byte_ids(PROMPT)
    printed = json.loads(explain(folders, capsys, "--attribute", A, B, "--json"))
    value, f = spliced_metric(params, weights, ids, lambda f: f)
    assert printed["logit_diff"] == pytest.approx(value, rel=1e-4)
    assert printed["hook"] == HOOK and printed["answer_ids"] == byte_ids(A + B)
    rows = printed["latents"]
    assert sorted((row["position"], row["latent"]) for row in rows) == sorted(map(tuple, np.argwhere(f > 0).tolist()))
    scores = [abs(row["attribution"]) for row in rows]
    assert scores == sorted(scores, reverse=True) and scores[0] > 1e-3
    step = 1e-4
    for row in rows[:4] + rows[len(rows) // 2:][:2]:  # the strongest, and some from the middle
        position, latent = row["position"], row["latent"]

        def scaled(by):  # the metric with one latent's activation scaled
            def scale(f):
                f = f.copy()
                f[position, latent] *= by
                return f
            return spliced_metric(params, weights, ids, scale)[0]

        slope = (scaled(1 + step) - scaled(1 - step)) / (2 * step)  # d metric / d log-scale = activation x gradient
        assert row["attribution"] == pytest.approx(slope, rel=1e-3, abs=1e-6)
        assert row["activation"] == pytest.approx(f[position, latent], rel=1e-4)
        assert row["activation"] * row["gradient"] == pytest.approx(row["attribution"], rel=1e-5)
        assert row["token"] == PROMPT[position]


def float64(tree):  # -> the params with every array in float64
    return {key: float64(value) for key, value in tree.items()} if isinstance(tree, dict) else (
        [float64(each) for each in tree] if isinstance(tree, list) else np.asarray(tree, np.float64))


def test_the_table_lists_the_largest_attributions_first(folders, capsys):
    printed = json.loads(explain(folders, capsys, "--attribute", A, B, "--json"))
    table = explain(folders, capsys, "--attribute", A, B)
    assert f"logit('{A}') - logit('{B}') = {printed['logit_diff']:.4f}" in table
    lines = [line for line in table.splitlines() if re.match(r"^\s+\d+ ", line)]
    assert len(lines) == min(20, len(printed["latents"]))
    for line, row in zip(lines, printed["latents"]):
        fields = line.split()
        assert (int(fields[0]), int(fields[-4])) == (row["position"], row["latent"])
        assert float(fields[-1]) == pytest.approx(row["attribution"], rel=1e-3)


@pytest.mark.parametrize("more, fragment", [
    (["--attribute", "hi", "e"], "--attribute: 'hi' encodes to 2 tokens"),
    (["--attribute", "e", "e"], "--attribute: A and B are the same token"),
    (["--attribute", "\u00e9", "e"], "--attribute: '\u00e9' encodes to 2 tokens"),
    (["--attribute", "h", "e", "--sae-ablate", "3"], "--attribute with --sae scores the SAE's latents, and "
     "--sae-ablate edits them: give one of them"),
    (["--attribute", "h", "e", "--steer", "3:2"], "and --steer edits them"),
    (["--attribute", "h"], "--attribute A B needs 2 words after it, got 1"),
])
def test_bad_attribute_input_is_one_error_line(folders, capsys, more, fragment):
    model_dir, sae_dir, _, _ = folders
    with pytest.raises(SystemExit) as exit_info:
        explain_command.main([PROMPT, "--model", str(model_dir), "--sae", str(sae_dir), *more])
    output = capsys.readouterr()
    assert_one_error_line(subprocess.CompletedProcess([], exit_info.value.code, output.out, output.err), fragment)


def test_attribute_with_sae_is_one_output_for_json(folders, capsys):  # not also the direct logit attribution
    printed = json.loads(explain(folders, capsys, "--attribute", A, B, "--json"))
    assert "latents" in printed and "terms" not in printed
