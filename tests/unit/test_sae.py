"""The SAE's math (gpt2_numpy/interpret/sae.py) against torch autograd and SAELens, through committed fixtures
(scripts/fixtures/make_sae_reference.py), and its training on planted features."""
import json
import subprocess
import sys

import numpy as np
import pytest

from gpt2_numpy import cores
from gpt2_numpy.interpret.sae import loss_and_grads
from gpt2_numpy.interpret.sae_activations import hook_rows, model_rows, rows_back
from gpt2_numpy.interpret.sae_fast import team_loss_and_grads, top_k_grouped, topk_loss_and_grads
from gpt2_numpy.interpret.sae_files import load_sae, new_sae, our_hook, save_sae, tl_hook
from gpt2_numpy.interpret.tracing import trace
from gpt2_numpy.params import random_params
from scripts.sae.planted import train_planted
from tests.conftest import FIXTURES, REPO

SAE_FIXTURES = FIXTURES / "sae"
GRAD_CASES = {"standard": ("standard", None), "topk": ("topk", None), "topk_aux": ("topk", "dead"),
              "topk_few_dead": ("topk", "few_dead")}


def relative_error(ours, reference):  # -> max |ours - reference| over max |reference|
    return float(np.max(np.abs(ours - reference)) / np.max(np.abs(reference)))


@pytest.mark.parametrize("case", GRAD_CASES)
def test_loss_and_grads_equal_torch_autograd(case):
    reference = np.load(SAE_FIXTURES / "grads.npz")
    architecture, dead = GRAD_CASES[case]
    params = {name: reference[f"params/{name}"] for name in ("W_enc", "b_enc", "W_dec", "b_dec")}
    losses, grads, _ = loss_and_grads(reference["x"], params, architecture, k=3, l1=0.3,
                                   dead=None if dead is None else reference[dead])
    expected = {key.split("/")[-1]: float(reference[key]) for key in reference if key.startswith(f"{case}/loss/")}
    assert losses.keys() == expected.keys()
    for name, value in expected.items():
        assert losses[name] == pytest.approx(value, rel=1e-5)
    for name, grad in grads.items():
        assert relative_error(grad, reference[f"{case}/grad/{name}"]) < 1e-5, name


ARCHITECTURES = ("standard", "topk", "jumprelu")


@pytest.mark.parametrize("architecture", [*ARCHITECTURES, "topk_rescaled"])  # rescale_acts_by_decoder_norm too
def test_a_folder_sae_lens_wrote_encodes_and_decodes_as_sae_lens(architecture):
    reference = np.load(SAE_FIXTURES / "sae_lens_outputs.npz")
    sae = load_sae(SAE_FIXTURES / f"sae_lens_{architecture}")
    assert (sae.architecture, sae.d_in, sae.d_sae, sae.hook) == (architecture.split("_")[0], 16, 48, "blocks.0.out")
    f = sae.encode(reference["x"])
    assert relative_error(f, reference[f"{architecture}/f"]) < 1e-5
    assert relative_error(sae.decode(f), reference[f"{architecture}/x_hat"]) < 1e-5


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_a_folder_written_here_is_the_one_sae_lens_loaded(architecture, tmp_path):
    # the committed folder is one save_sae wrote and SAELens loaded (its outputs recorded): save_sae must write it
    # again, byte for byte, and SAELens's encode and decode of it must equal ours
    reference = np.load(SAE_FIXTURES / "ours_outputs.npz")
    params = {key.split("/")[-1]: reference[key] for key in reference if key.startswith(f"{architecture}/params/")}
    cfg = {"architecture": architecture, "k": 5 if architecture == "topk" else None}
    save_sae(new_sae(cfg, params, "blocks.0.out", "gpt2-numpy-fixture"), tmp_path)
    for name in ("cfg.json", "sae_weights.safetensors"):
        assert (tmp_path / name).read_bytes() == (SAE_FIXTURES / f"ours_{architecture}" / name).read_bytes(), name
    assert str(reference[f"{architecture}/hook_name"]) == "blocks.0.hook_resid_post"
    sae = load_sae(tmp_path)
    f = sae.encode(reference["x"])
    assert relative_error(f, reference[f"{architecture}/f"]) < 1e-5
    assert relative_error(sae.decode(f), reference[f"{architecture}/x_hat"]) < 1e-5


@pytest.mark.parametrize("theirs, ours", [
    ("blocks.0.hook_resid_pre", "embed"), ("blocks.3.hook_resid_pre", "blocks.2.out"),
    ("blocks.3.hook_resid_mid", "blocks.3.mid"), ("blocks.3.hook_resid_post", "blocks.3.out"),
    ("blocks.1.attn.hook_z", "blocks.1.attn.z"), ("blocks.2.hook_mlp_out", "blocks.2.mlp.out"),
    ("blocks.2.mlp.out", "blocks.2.mlp.out"), ("blocks.2.hook_nonsense", None)])
def test_transformer_lens_hook_names_map_to_trace_names(theirs, ours):
    assert our_hook(theirs) == ours


@pytest.mark.parametrize("with_dead", [False, True])
@pytest.mark.parametrize("tuned", ["rows", "team"])
def test_the_tuned_topk_step_equals_the_textbook(with_dead, tuned):
    # "team": the batch in pieces of sae_fast.ROWS (two and a part), shared by two threads
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1100, 16)).astype(np.float32)
    params = {"W_enc": rng.standard_normal((16, 128)).astype(np.float32),
              "b_enc": rng.standard_normal(128).astype(np.float32) - 10,  # some of the k largest are negative
              "W_dec": rng.standard_normal((128, 16)).astype(np.float32),
              "b_dec": rng.standard_normal(16).astype(np.float32)}
    dead = rng.random(128) < 0.3 if with_dead else None
    losses, grads, stats = loss_and_grads(x, params, "topk", k=4, dead=dead)
    if tuned == "rows":
        fast_losses, fast_grads, fast_stats = topk_loss_and_grads(x, params, 4, dead)
    else:
        threads = cores.threads()
        try:
            cores.set_threads(2)
            with cores.all_cores():
                fast_losses, fast_grads, fast_stats = team_loss_and_grads(x, params, 4, dead)
        finally:
            cores.set_threads(threads)
        assert fast_stats["explained_variance"] == pytest.approx(stats["explained_variance"], rel=1e-5)
    assert fast_losses.keys() == losses.keys()
    for name in losses:
        assert fast_losses[name] == pytest.approx(losses[name], rel=1e-5)
    for name in grads:
        assert relative_error(fast_grads[name], grads[name]) < 1e-5, name
    assert np.array_equal(fast_stats["fired"], stats["fired"])
    assert fast_stats["l0"] == pytest.approx(stats["l0"], rel=1e-6)


def test_the_grouped_top_k_finds_each_rows_k_largest():
    x = np.random.default_rng(6).standard_normal((500, 256)).astype(np.float32)
    expected = np.sort(np.argsort(-x, axis=-1)[:, :5], axis=-1)
    assert np.array_equal(np.sort(top_k_grouped(x, 5), axis=-1), expected)


@pytest.mark.parametrize("architecture, goal", [("topk", 0.95), ("standard", 0.8)])
def test_an_sae_finds_planted_directions(architecture, goal):
    # the goal's small version (scripts/sae/planted.py runs the full one): 64 directions in 32 dimensions, about 2
    # active per activation
    share, _, _ = train_planted(architecture, steps=200, batch_size=256, lr=1e-2, d_sae=128, k=3, l1=0.3,
                                n_features=64, d_in=32, active=2)
    assert share >= goal


def test_a_per_head_activation_is_read_as_sae_lens_reads_hook_z():
    # TransformerLens's hook_z is [pos, head, d_head], which SAELens flattens to (head d_head); ours is [head, pos, ...]
    z = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)  # [n_head, n_seq, d_head]
    rows = hook_rows(z, "blocks.0.attn.z")
    assert rows.shape == (3, 8)
    assert all(rows[s, h * 4 + j] == z[h, s, j] for h in range(2) for s in range(3) for j in range(4))
    assert np.array_equal(rows_back(rows, z, "blocks.0.attn.z"), z)
    assert np.array_equal(hook_rows(z[0], "blocks.0.out"), z[0])


def test_the_package_exports_load_sae_and_imports_no_torch():
    code = ("import sys, gpt2_numpy; from gpt2_numpy.commands import sae; "
            f"s = gpt2_numpy.load_sae({str(SAE_FIXTURES / 'sae_lens_topk')!r}); s.encode(s.params['b_dec']); "
            "print(sorted(name for name in ('torch', 'sae_lens', 'tensorflow', 'transformer_lens') "
            "if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("hook", ["embed", "blocks.0.attn.z", "blocks.1.mid", "blocks.1.out", "ln_f"])
def test_the_activations_read_for_training_are_traces(hook):
    hparams = {"n_vocab": 50, "n_ctx": 16, "n_embd": 8, "n_head": 2, "n_layer": 2}
    params, ids = random_params(hparams, 1), np.arange(10) % 50
    assert np.array_equal(model_rows(ids, params, 2, hook), hook_rows(trace(ids, params, 2)[hook], hook))


@pytest.mark.parametrize("step", ["textbook", "tuned"])
def test_a_topk_sae_of_one_number_has_no_auxk_loss(step):
    # SAELens's k_aux = d_in // 2 dead latents: 0 for d_in 1, so nothing reconstructs the residual (nor divides by 0)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 1)).astype(np.float32)
    params = {"W_enc": rng.standard_normal((1, 8)).astype(np.float32), "b_enc": np.zeros(8, np.float32),
              "W_dec": rng.standard_normal((8, 1)).astype(np.float32), "b_dec": np.zeros(1, np.float32)}
    dead = np.arange(8) >= 4
    if step == "textbook":
        losses, grads, _ = loss_and_grads(x, params, "topk", k=1, dead=dead)
        alive_losses, alive_grads, _ = loss_and_grads(x, params, "topk", k=1)
    else:
        losses, grads, _ = topk_loss_and_grads(x, params, 1, dead)
        alive_losses, alive_grads, _ = topk_loss_and_grads(x, params, 1)
    assert losses == alive_losses and "aux" not in losses
    for name in grads:
        assert np.array_equal(grads[name], alive_grads[name]), name


# TransformerLens's hook names in a block (its HookedTransformer's hook_dict), and the trace names of the same arrays
TL_NAMES = {"hook_resid_mid": "mid", "hook_resid_post": "out", "attn.hook_z": "attn.z", "hook_mlp_out": "mlp.out",
            "hook_attn_out": "attn.out", "attn.hook_q": "attn.q", "attn.hook_k": "attn.k", "attn.hook_v": "attn.v",
            "mlp.hook_pre": "mlp.pre", "mlp.hook_post": "mlp.hidden",
            "ln1.hook_normalized": "ln_1.normalized", "ln2.hook_normalized": "ln_2.normalized"}  # before the gain


@pytest.mark.parametrize("theirs", TL_NAMES)
def test_every_transformer_lens_name_in_a_block_round_trips(theirs):
    ours = f"blocks.2.{TL_NAMES[theirs]}"
    assert our_hook(f"blocks.2.{theirs}") == ours
    assert tl_hook(ours) == f"blocks.2.{theirs}"
    assert new_sae({"architecture": "standard"}, exact_params(4), ours).cfg["metadata"]["hook_name"] == \
        f"blocks.2.{theirs}"


def test_the_names_outside_the_blocks_round_trip():
    assert (our_hook("blocks.0.hook_resid_pre"), tl_hook("embed")) == ("embed", "blocks.0.hook_resid_pre")
    assert (our_hook("ln_final.hook_normalized"), tl_hook("ln_f.normalized")) == ("ln_f.normalized",
                                                                                   "ln_final.hook_normalized")


def exact_params(d_in):  # -> a standard SAE's params that reconstruct their input: relu(x) - relu(-x) = x
    eye = np.eye(d_in, dtype=np.float32)
    return {"W_enc": np.concatenate([eye, -eye], axis=1), "b_enc": np.zeros(2 * d_in, np.float32),
            "W_dec": np.concatenate([eye, -eye]), "b_dec": np.zeros(d_in, np.float32)}


@pytest.mark.parametrize("hook, reshape", [("blocks.1.attn.z", "hook_z"), ("blocks.1.attn.q", "none"),
                                           ("blocks.1.out", "none"), (None, "none")])
def test_an_sae_at_attn_z_writes_sae_lens_reshape_of_hook_z(hook, reshape, tmp_path):
    save_sae(new_sae({"architecture": "standard"}, exact_params(4), hook), tmp_path)
    assert json.loads((tmp_path / "cfg.json").read_text())["reshape_activations"] == reshape


def test_a_cfg_without_apply_b_dec_to_input_centres_the_input_as_sae_lens_does(tmp_path):
    # SAELens's SAEConfig: apply_b_dec_to_input defaults to True
    params = exact_params(4)
    params["b_dec"] = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
    save_sae(new_sae({"architecture": "standard"}, params, "blocks.0.out"), tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    del cfg["apply_b_dec_to_input"]
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    x = np.array([[0.5, 0.5, 0.5, 0.5]], np.float32)
    centred = x - params["b_dec"]
    expected = np.concatenate([np.maximum(centred, 0), np.maximum(-centred, 0)], axis=1)
    assert np.array_equal(load_sae(tmp_path).encode(x), expected)


def test_the_benchmark_shows_why_an_installed_sae_lens_does_not_import(monkeypatch):
    from scripts.bench import sae as bench

    def broken(data):
        raise ImportError("No module named 'torch'")
    monkeypatch.setattr(bench, "batches", lambda: [])
    monkeypatch.setattr(bench, "our_measure", lambda data: lambda: 1.0)
    monkeypatch.setattr(bench, "sae_lens_measure", broken)
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: object() if name == "sae_lens" else None)
    metric = bench.sae_rows(1)[0]["metric"]
    assert "fails to import: No module named 'torch'" in metric and "pip install" not in metric
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: None)
    assert "pip install sae-lens" in bench.sae_rows(1)[0]["metric"]
