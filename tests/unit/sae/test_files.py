"""SAELens's folders (gpt2_numpy/sae/files.py): one SAELens wrote loads and computes as SAELens does, one written here
is byte for byte the one SAELens loaded, and the package loads them without torch."""
import json
import subprocess
import sys

import numpy as np
import pytest

from gpt2_numpy.formats.safetensors import write_safetensors
from gpt2_numpy.sae.files import new_sae, save_sae
from gpt2_numpy.sae.releases import load_sae
from tests.conftest import REPO
from tests.sae_helpers import SAE_FIXTURES, exact_params, relative_error


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


def test_the_package_exports_load_sae_and_imports_no_torch():
    code = ("import sys, gpt2_numpy; from gpt2_numpy.commands import sae; "
            f"s = gpt2_numpy.load_sae({str(SAE_FIXTURES / 'sae_lens_topk')!r}); s.encode(s.params['b_dec']); "
            "print(sorted(name for name in ('torch', 'sae_lens', 'tensorflow', 'transformer_lens') "
            "if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


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


def test_an_older_jumprelu_file_s_log_threshold_is_the_threshold_s_log(tmp_path):
    # SAELens's older JumpReLU files store log_threshold; the threshold is its exp. Thresholds 0.5 and 2 on the
    # identity encoder: x = [1, 1] fires latent 0 alone (1 > 0.5, 1 <= 2)
    params = {"W_enc": np.eye(2, dtype=np.float32), "b_enc": np.zeros(2, np.float32),
              "W_dec": np.eye(2, dtype=np.float32), "b_dec": np.zeros(2, np.float32)}
    save_sae(new_sae({"architecture": "jumprelu"}, {**params, "threshold": np.zeros(2, np.float32)}, "blocks.0.out"),
             tmp_path)
    with (tmp_path / "sae_weights.safetensors").open("wb") as file:
        write_safetensors(file, {**params, "log_threshold": np.log(np.array([0.5, 2.0], np.float32))}, {"format": "pt"})
    sae = load_sae(tmp_path)
    assert np.allclose(sae.params["threshold"], [0.5, 2.0])
    assert sae.encode(np.ones((1, 2), np.float32)).tolist() == [[1.0, 0.0]]
