"""sae/features.py: an SAE's latents on a model, each checked against the model run by hand from model.py's
functions: the strongest latents, a latent's ablation (with the error term kept) and steering as edits in the run,
attn.z's heads flattened as SAELens's hook_z, the direct effect on the logits against a finite difference through
layer_norm, and the scan of a text against a brute-force search."""
import json
import shutil

import numpy as np
import pytest

from gpt2_numpy.interpret.edits import run_with_edits
from gpt2_numpy.sae.features import (
    ablation_edit,
    busiest_latents,
    latent_activations,
    logit_effects,
    scan,
    steered,
    steering_edit,
    strongest_latents,
)
from gpt2_numpy.sae.files import CFG, WEIGHTS, read_weights
from gpt2_numpy.sae.releases import load_sae
from gpt2_numpy.interpret.tracing import trace
from gpt2_numpy.model import block, layer_norm, merge_heads, split_heads
from gpt2_numpy.params import random_params
from tests.conftest import FIXTURES
from tests.sae_helpers import random_sae

HPARAMS = {"n_vocab": 40, "n_ctx": 16, "n_embd": 16, "n_head": 4, "n_layer": 2}
IDS = [3, 17, 5, 9, 3, 17, 5, 22, 30, 1, 0, 12]


@pytest.fixture(scope="module")
def model():
    params = random_params(HPARAMS, 3)
    params["ln_f"]["g"] = np.linspace(0.2, 3.0, HPARAMS["n_embd"]).astype(np.float32)  # a gain that reorders tokens
    return params


def logits_from_stream(x, params, first):  # resid entering block `first` -> logits, by hand from model.py
    for block_params in params["blocks"][first:]:
        x = block(x, **block_params, n_head=HPARAMS["n_head"])
    return layer_norm(x, **params["ln_f"]) @ params["wte"].T


def test_each_position_s_strongest_latents_are_its_largest_activations(model):
    sae = random_sae(16, 24, "blocks.0.out", seed=1)
    f = latent_activations(IDS, model, HPARAMS["n_head"], sae)
    np.testing.assert_allclose(f, sae.encode(trace(IDS, model, HPARAMS["n_head"])["blocks.0.out"]))
    ids, values = strongest_latents(f, 3)
    for row, top, top_values in zip(f, ids, values):
        assert sorted(top.tolist()) == sorted(np.argsort(row)[::-1][:3].tolist())
        assert list(top_values) == sorted(row, reverse=True)[:3]


def test_ablating_a_latent_takes_its_share_out_and_keeps_the_error(model):
    sae = random_sae(16, 24, "blocks.0.out", seed=2)
    x = trace(IDS, model, HPARAMS["n_head"])["blocks.0.out"]
    f = sae.encode(x)
    latents = [int(np.argmax(f.sum(axis=0))), 5]
    # SAELens's latent ablation with the error term: the reconstruction with the latents zeroed, plus x's error
    zeroed = f.copy()
    zeroed[:, latents] = 0
    expected_stream = sae.decode(zeroed) + (x - sae.decode(f))
    edited = run_with_edits(IDS, model, HPARAMS["n_head"], [ablation_edit(sae, latents)])
    np.testing.assert_allclose(edited["blocks.0.out"], expected_stream, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(edited["logits"], logits_from_stream(expected_stream, model, 1), rtol=1e-4, atol=1e-4)
    assert np.abs(edited["logits"] - trace(IDS, model, HPARAMS["n_head"])["logits"]).max() > 1e-2


def test_steering_adds_the_scaled_decoder_row_at_every_position(model):
    sae = random_sae(16, 24, "blocks.0.mid", seed=3)
    names = trace(IDS, model, HPARAMS["n_head"])
    steers = [(7, 4.0), (2, -1.5)]
    edited = run_with_edits(IDS, model, HPARAMS["n_head"], [steering_edit(sae, steers)])
    mid = names["blocks.0.mid"] + 4.0 * sae.params["W_dec"][7] - 1.5 * sae.params["W_dec"][2]
    p = model["blocks"][0]
    from gpt2_numpy.model import ffn
    out = mid + ffn(layer_norm(mid, **p["ln_2"]), **p["mlp"])
    np.testing.assert_allclose(edited["logits"], logits_from_stream(out, model, 1), rtol=1e-4, atol=1e-4)


def test_an_sae_on_attn_z_reads_the_heads_side_by_side_as_hook_z(model):
    sae = random_sae(16, 24, "blocks.1.attn.z", seed=4)
    z = trace(IDS, model, HPARAMS["n_head"])["blocks.1.attn.z"]  # [n_head, n_seq, d_head]
    flat = merge_heads(z)  # model.py's own merge, which c_proj reads: head 0's d_head values first
    np.testing.assert_allclose(latent_activations(IDS, model, HPARAMS["n_head"], sae), sae.encode(flat))
    edited = run_with_edits(IDS, model, HPARAMS["n_head"], [ablation_edit(sae, [0, 1, 2])])
    f = sae.encode(flat)
    expected = split_heads(flat - f[:, :3] @ sae.params["W_dec"][:3], HPARAMS["n_head"])
    np.testing.assert_allclose(edited["blocks.1.attn.z"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("step", ["q", "k", "v"])
def test_an_sae_on_attn_q_k_or_v_reads_the_heads_side_by_side_as_training_does(model, step):
    # training (sae/activations.py's hook_rows) flattens every per-head hook; reading or editing it was attn.z's alone
    sae = random_sae(16, 24, f"blocks.1.attn.{step}", seed=8)
    heads = trace(IDS, model, HPARAMS["n_head"])[f"blocks.1.attn.{step}"]  # [n_head, n_seq, d_head]
    flat = merge_heads(heads)
    f = sae.encode(flat)
    np.testing.assert_allclose(latent_activations(IDS, model, HPARAMS["n_head"], sae), f)
    edited = run_with_edits(IDS, model, HPARAMS["n_head"], [ablation_edit(sae, [0, 5]), steering_edit(sae, [(3, 2.0)])])
    expected = flat - f[:, [0, 5]] @ sae.params["W_dec"][[0, 5]] + 2.0 * sae.params["W_dec"][3]
    np.testing.assert_allclose(edited[f"blocks.1.attn.{step}"], split_heads(expected, HPARAMS["n_head"]), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("latent", [-1, 24, 3.0, True])
def test_a_latent_out_of_range_is_refused_by_name(latent):
    sae = random_sae(16, 24, "blocks.0.out")
    with pytest.raises(ValueError, match=f"latent {latent!r} is out of range: this SAE has 24 latents"):
        ablation_edit(sae, [1, latent])
    with pytest.raises(ValueError, match="out of range"):
        steering_edit(sae, [(latent, 1.0)])


def test_the_direct_effect_is_the_logits_change_through_ln_f(model):
    # a finite difference through model.py's layer_norm, at a stream x whose centred part is orthogonal to the
    # direction: there ln_f's norm does not move to first order, so the logits move by effect / sigma(x)
    sae = random_sae(16, 24, "blocks.1.out", seed=5)
    rng = np.random.default_rng(0)
    for latent in (0, 9):
        d = sae.params["W_dec"][latent].astype(np.float64)
        d_centred = d - d.mean()
        x = rng.standard_normal(16)
        x -= x.mean()
        x -= d_centred * (x @ d_centred) / (d_centred @ d_centred)
        ln = {"g": model["ln_f"]["g"].astype(np.float64), "b": model["ln_f"]["b"].astype(np.float64)}
        step = 1e-5
        change = (layer_norm(x + step * d, **ln) - layer_norm(x - step * d, **ln)) @ model["wte"].T.astype(float)
        expected = change / (2 * step) * np.sqrt(np.mean(x**2) + 1e-5)
        promoted, suppressed = logit_effects(sae, model, [latent], 5)
        assert [t for t, _ in promoted[0]] == np.argsort(-expected)[:5].tolist()
        assert [t for t, _ in suppressed[0]] == np.argsort(expected)[:5].tolist()
        np.testing.assert_allclose([e for _, e in promoted[0]], np.sort(expected)[::-1][:5], rtol=1e-3)


def test_the_direct_effect_of_an_attn_z_latent_goes_through_c_proj(model):
    sae = random_sae(16, 24, "blocks.0.attn.z", seed=6)
    promoted, _ = logit_effects(sae, model, [4], 3)
    written = sae.params["W_dec"][4] @ model["blocks"][0]["attn"]["c_proj"]["w"]  # what the head writes to the stream
    centred = written - written.mean()
    expected = (centred * model["ln_f"]["g"]) @ model["wte"].T
    assert [t for t, _ in promoted[0]] == np.argsort(-expected)[:3].tolist()
    with pytest.raises(ValueError, match="writes nothing the logits read directly"):
        logit_effects(random_sae(4, 8, "blocks.0.attn.q"), model, [0], 3)


def test_the_scan_finds_each_latent_s_strongest_contexts_and_its_histogram(model):
    sae = random_sae(16, 24, "blocks.0.out", seed=7)
    rng = np.random.default_rng(1)
    windows = rng.integers(0, 40, (5, 12))
    latents = busiest_latents(windows, model, HPARAMS["n_head"], sae, 4)
    every = np.stack([sae.encode(trace(w, model, HPARAMS["n_head"])["blocks.0.out"]) for w in windows])
    fired = (every > 0).sum(axis=(0, 1))
    assert [fired[latent] for latent in latents] == sorted(fired, reverse=True)[:4]
    found = scan(windows, model, HPARAMS["n_head"], sae, latents, n_contexts=3, bins=4)
    assert found["positions"] == 60
    for latent in latents:
        seen = found["latents"][latent]
        values = every[..., latent]
        best = sorted(((values[w, p], w, p) for w in range(5) for p in range(12)), reverse=True)[:3]
        assert [(w, p) for _, w, p in seen["contexts"]] == [(w, p) for _, w, p in best]
        np.testing.assert_allclose([v for v, _, _ in seen["contexts"]], [v for v, _, _ in best])
        counts, edges = seen["histogram"]
        positive = values[values > 0]
        assert seen["fired"] == len(positive) == counts.sum()
        assert edges[0] == 0 and np.isclose(edges[-1], positive.max())
        assert counts.tolist() == [int(((positive >= lo) & (positive < hi)).sum() + (i == 3) * (positive == hi).sum())
                                   for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:]))]


# --- rescale_acts_by_decoder_norm, as SAELens 6 reads it ---


@pytest.mark.parametrize("architecture", ["standard", "jumprelu"])
def test_rescale_acts_by_decoder_norm_is_ignored_but_by_a_topk_sae(architecture, tmp_path):
    # SAELens's StandardSAE and JumpReLUSAE never read the key; folding a standard SAE's norms in changed its encode
    folder = shutil.copytree(FIXTURES / "sae" / f"sae_lens_{architecture}", tmp_path / "sae")
    cfg = json.loads((folder / CFG).read_text())
    (folder / CFG).write_text(json.dumps({**cfg, "rescale_acts_by_decoder_norm": True}))
    file_params = read_weights(folder / WEIGHTS, cfg)
    x = np.random.default_rng(0).standard_normal((6, cfg["d_in"])).astype(np.float32)
    pre = (x - file_params["b_dec"]) @ file_params["W_enc"] + file_params["b_enc"]
    expected = np.maximum(pre, 0) * (pre > file_params.get("threshold", 0))
    sae = load_sae(folder)
    np.testing.assert_allclose(sae.encode(x), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(sae.params["W_dec"], file_params["W_dec"])


def test_steering_a_rescaled_topk_sae_adds_the_row_its_decode_applies():
    # SAELens's TopKSAE.decode with the key: (f / ‖W_dec[j]‖) @ W_dec + b_dec, W_dec the file's; steering by SCALE adds
    # what raising latent F by SCALE adds to that decode (docs/sae.md): SCALE times the file's row over its norm
    folder = FIXTURES / "sae" / "sae_lens_topk_rescaled"
    cfg = json.loads((folder / CFG).read_text())
    W_dec = read_weights(folder / WEIGHTS, cfg)["W_dec"].astype(np.float64)
    assert cfg["rescale_acts_by_decoder_norm"] and not np.allclose(np.linalg.norm(W_dec, axis=-1), 1, atol=0.05)
    sae = load_sae(folder)
    x = np.random.default_rng(1).standard_normal((4, cfg["d_in"])).astype(np.float32)
    f = sae.encode(x).astype(np.float64)
    raised = f.copy()
    raised[:, 3] += 4.0
    decode = lambda acts: (acts / np.linalg.norm(W_dec, axis=-1)) @ W_dec  # noqa: E731 (b_dec cancels)
    np.testing.assert_allclose(steered(sae, [(3, 4.0)], x) - x, decode(raised) - decode(f), rtol=1e-5, atol=1e-6)
