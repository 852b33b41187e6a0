"""SAELens's released SAEs by name (gpt2_numpy/sae/releases.py, processing.py, formats/torch_zip.py), all offline:
a loopback hub serves fake files of four releases where the hub keeps them, and what SAELens 6.x with TransformerLens
computed from the same files on the same random GPT-2 is the expected value
(scripts/fixtures/make_sae_release_reference.py): latents within 1e-4 relative, for each kind of preprocessing."""
import hashlib
import io
import json
import pickle
import zipfile

import numpy as np
import pytest

from gpt2_numpy.errors import CheckpointError, DownloadError, UsageError
from gpt2_numpy.formats.torch_zip import read_torch_zip
from gpt2_numpy.interpret.edits import Edit, run_with_edits
from gpt2_numpy.sae.activations import model_rows, splice, zeroed_activation
from gpt2_numpy.sae.evaluation import evaluate
from gpt2_numpy.sae.files import save_sae
from gpt2_numpy.sae.releases import load_sae
from gpt2_numpy.interpret.names import our_hook
from gpt2_numpy.interpret.tracing import log_softmax, trace
from gpt2_numpy.sae.processing import ProcessedSAE, attach, forward, layer_norm, model_activation
from gpt2_numpy.sae.releases import cache_folder, neuronpedia_url, releases
from tests.download_helpers import fast_and_isolated, unlike_at_the_end  # noqa: F401 (an autouse fixture)
from tests.http_server import FileServer
from tests.sae_release_helpers import KINDS, N_HEAD, RELEASE_FIXTURES, kind_files, loopback_hub, model_params, \
    reference, url_path

TOLERANCE = 1e-4  # relative to the largest value SAELens computed


def relative_error(ours, theirs):  # -> max |ours - theirs| over max |theirs|
    return float(np.abs(np.asarray(ours, np.float64) - theirs).max() / np.abs(theirs).max())


@pytest.fixture(scope="module")
def params():
    return model_params()


def loaded(monkeypatch, tmp_path, i, params):  # -> the SAE of kind i, downloaded from the loopback hub, attached
    with loopback_hub(monkeypatch, tmp_path / "weights", kinds=[i]):
        return attach(load_sae(*KINDS[i]), params)


# --- equal to SAELens with TransformerLens ---


@pytest.mark.parametrize("i", range(len(KINDS)), ids=[release for release, _ in KINDS])
def test_latents_and_output_equal_saelens_on_transformer_lens(monkeypatch, tmp_path, params, i):
    sae, expected = loaded(monkeypatch, tmp_path, i, params), reference()
    rows = model_rows(expected["tokens"], params, N_HEAD, sae.hook)
    activation = model_activation(sae, rows)
    assert relative_error(activation, expected[f"k{i}_activation"]) < TOLERANCE  # TransformerLens's hook
    assert relative_error(sae.encode(rows), expected[f"k{i}_latents"]) < TOLERANCE
    assert relative_error(forward(sae, activation), expected[f"k{i}_output"]) < TOLERANCE


@pytest.mark.parametrize("i", range(len(KINDS)), ids=[release for release, _ in KINDS])
def test_spliced_and_zeroed_losses_equal_transformer_lens(monkeypatch, tmp_path, params, i):
    # zeroed: the activation the SAE reads set to zero, as SAELens's evals zero TransformerLens's hook; for hook_z that
    # keeps the value bias, which TransformerLens's processed model holds in the attention output's bias
    sae, expected = loaded(monkeypatch, tmp_path, i, params), reference()
    tokens = expected["tokens"]
    for edits, name in (([], "loss_clean"), ([splice(sae)], "loss_sae"), ([zeroed_activation(sae)], "loss_zero")):
        logits = run_with_edits(tokens[:-1], params, N_HEAD, edits)["logits"]
        loss = -np.take_along_axis(log_softmax(logits), tokens[1:, None], -1).mean()
        assert abs(loss - expected[f"k{i}_{name}"]) < TOLERANCE * expected[f"k{i}_{name}"]


def test_each_kind_reads_what_its_release_was_trained_on(monkeypatch, tmp_path, params):
    saes = [loaded(monkeypatch, tmp_path / str(i), i, params) for i in range(len(KINDS))]
    assert [sae.hook for sae in saes] == ["blocks.0.out", "blocks.0.out", "blocks.1.mlp.out", "blocks.1.attn.z"]
    assert all(isinstance(sae, ProcessedSAE) for sae in saes)
    assert [(sae.center, sae.layer_norm, sae.needs_value_bias) for sae in saes] == [
        (True, False, False), (True, True, False), (True, False, False), (False, False, True)]
    assert saes[1].architecture == "topk" and saes[1].k == 8  # a pre-6.0 cfg's activation_fn_str topk
    kwargs = saes[0].cfg["metadata"]["model_from_pretrained_kwargs"]  # what it reads, said in sae.cfg
    assert kwargs["center_writing_weights"] and kwargs["fold_value_biases"]


@pytest.mark.parametrize("i", [0, 3], ids=["centred", "value bias"])
def test_a_splice_that_reconstructs_exactly_leaves_the_model_unchanged(monkeypatch, tmp_path, params, i):
    # what model_activation removed (the mean, the value bias) goes back: an SAE whose output is its input changes
    # nothing, the activation itself included (the layer norms after it would hide a lost mean from the logits)
    sae = loaded(monkeypatch, tmp_path, i, params)
    sae.forward = lambda a: a
    tokens = reference()["tokens"]
    clean = run_with_edits(tokens, params, N_HEAD, [])
    spliced = run_with_edits(tokens, params, N_HEAD, [splice(sae)])
    for name in (sae.hook, "logits"):
        np.testing.assert_allclose(spliced[name], clean[name], atol=1e-4 * np.abs(clean[name]).max())


def test_value_bias_sae_refuses_to_run_unattached(monkeypatch, tmp_path):
    with loopback_hub(monkeypatch, tmp_path / "weights", kinds=[3]):
        sae = load_sae(*KINDS[3])
    with pytest.raises(UsageError, match="attach"):
        sae.encode(np.zeros((1, 64), np.float32))


# --- the downloads and the cache ---


def test_second_use_reads_the_cache_with_the_server_stopped(monkeypatch, tmp_path, params):
    with loopback_hub(monkeypatch, tmp_path / "weights", kinds=[0]) as server:
        first = load_sae(*KINDS[0])
    repo = releases()[KINDS[0][0]]["repo"]
    assert sorted(path for path, _, _ in server.requests) == sorted(url_path(repo, path) for path in kind_files(0))
    second = load_sae("gpt2-small-res-jb/blocks.1.hook_resid_pre")  # the server is gone: "RELEASE/ID" from the cache
    for name in first.params:
        np.testing.assert_array_equal(second.params[name], first.params[name])
    for path, file in kind_files(0).items():  # byte for byte what the hub served, under the repo's own paths
        assert (cache_folder(repo, tmp_path / "weights") / path).read_bytes() == file.read_bytes()


def test_two_ids_of_a_release_keep_their_own_files(monkeypatch, tmp_path):
    # each id's cfg.json under its own folder, as the repo has it: the second id's is not the first's
    release, sae_id = KINDS[0]
    repo = releases()[release]["repo"]
    cfg = json.loads((RELEASE_FIXTURES / "k0" / "cfg.json").read_text())
    other = {**cfg, "hook_point": "blocks.0.hook_resid_pre", "hook_point_layer": 0}
    weights = (RELEASE_FIXTURES / "k0" / "sae_weights.safetensors").read_bytes()
    files = {url_path(repo, "blocks.0.hook_resid_pre/cfg.json"): json.dumps(other).encode(),
             url_path(repo, "blocks.0.hook_resid_pre/sae_weights.safetensors"): weights}
    with FileServer(files) as server, loopback_hub(monkeypatch, tmp_path / "weights", kinds=[0]):
        assert load_sae(release, sae_id).hook == "blocks.0.out"
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        assert load_sae(release, "blocks.0.hook_resid_pre").hook == "embed"


def test_a_release_s_latent_links_to_its_neuronpedia_page(monkeypatch, tmp_path, params):
    # the page's address: Neuronpedia's model/set id from SAELens's list (gpt2-small/1-res-jb), then the latent
    assert neuronpedia_url(loaded(monkeypatch, tmp_path, 0, params), 5) == \
        "https://www.neuronpedia.org/gpt2-small/1-res-jb/5"


def test_a_download_whose_hash_differs_is_deleted_and_refused(monkeypatch, tmp_path):
    release, sae_id = KINDS[0]
    path = url_path(releases()[release]["repo"], f"{sae_id}/sae_weights.safetensors")
    data = (RELEASE_FIXTURES / "k0" / "sae_weights.safetensors").read_bytes()
    wrong = unlike_at_the_end(hashlib.sha256(data).hexdigest())
    with loopback_hub(monkeypatch, tmp_path / "weights", kinds=[0], published={path: (wrong, len(data))}):
        with pytest.raises(DownloadError, match="SHA-256"):
            load_sae(release, sae_id)
    assert not list((tmp_path / "weights").rglob("*.safetensors*"))


def test_a_cached_file_damaged_since_is_one_line_saying_to_delete_it(monkeypatch, tmp_path):
    with loopback_hub(monkeypatch, tmp_path / "weights", kinds=[0]):
        load_sae(*KINDS[0])
    [weights] = (tmp_path / "weights").rglob("sae_weights.safetensors")
    weights.write_bytes(weights.read_bytes()[:1000])  # cut short after it was checked
    fragment = "cached download of gpt2-small-res-jb/blocks.1.hook_resid_pre: delete it"
    with pytest.raises(CheckpointError, match=fragment) as error:
        load_sae(*KINDS[0])
    assert "\n" not in str(error.value) and str(weights) in str(error.value)


def test_no_network_is_one_line_saying_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("GPT2_NUMPY_WEIGHTS", str(tmp_path))
    with pytest.raises(DownloadError) as error:
        load_sae(*KINDS[0])
    assert "no network connection to 127.0.0.1:9" in str(error.value) and "\n" not in str(error.value)
    assert "HF_ENDPOINT" in str(error.value)


def test_a_file_the_hub_lacks_is_one_line(monkeypatch, tmp_path):
    with loopback_hub(monkeypatch, tmp_path / "weights", kinds=[1]):  # kind 0's files are not there
        with pytest.raises(DownloadError, match="HTTP 404.*no such file"):
            load_sae(*KINDS[0])


@pytest.mark.parametrize("name, nearest", [(("gpt2-small-res-jbb", "blocks.8.hook_resid_pre"), "gpt2-small-res-jb"),
                                           (("gpt2-small-res-jb", "blocks.8.hook_resid_prex"),
                                            "blocks.8.hook_resid_pre")])
def test_an_unknown_release_or_id_names_the_nearest(name, nearest):
    with pytest.raises(UsageError, match=nearest):
        load_sae(*name)


# --- the table ---


def test_the_table_holds_saelens_gpt2_small_releases():
    # facts of SAELens's pretrained_saes.yaml as issue 56 and SAELens's docs state them
    table = releases()
    assert len(table) == 18
    jb = table["gpt2-small-res-jb"]
    assert jb["repo"] == "jbloom/GPT2-Small-SAEs-Reformatted"
    assert jb["config_overrides"]["model_from_pretrained_kwargs"] == {"center_writing_weights": True}
    assert jb["saes"]["blocks.8.hook_resid_pre"]["neuronpedia"] == "gpt2-small/8-res-jb"
    assert table["gpt2-small-hook-z-kk"]["conversion"] == "connor_rob_hook_z"
    assert all("norm_scaling_factor" in sae for sae in table["gpt2-small-mlp-tm"]["saes"].values())


# --- folders that ask for processing ---


def folder_with(tmp_path, sae, **changes):  # -> a folder of sae with cfg's metadata changed
    sae.cfg = {**sae.cfg, **changes.pop("top", {}), "metadata": {**sae.cfg["metadata"], **changes}}
    save_sae(sae, tmp_path / "sae")
    return tmp_path / "sae"


def test_a_folder_asking_for_centring_gets_it_and_one_asking_for_none_reads_the_raw_activation(monkeypatch, tmp_path,
                                                                                                 params):
    sae = loaded(monkeypatch, tmp_path, 0, params)
    x = np.random.default_rng(0).normal(size=(5, 64)).astype(np.float32) + 3
    centred = load_sae(folder_with(tmp_path / "a", sae, model_from_pretrained_kwargs={"center_writing_weights": True}))
    np.testing.assert_allclose(centred.encode(x), sae.encode(x), rtol=1e-6, atol=1e-6)
    raw = load_sae(folder_with(tmp_path / "b", sae, model_from_pretrained_kwargs={}))
    assert not isinstance(raw, ProcessedSAE)


@pytest.mark.parametrize("changes, fragment", [
    ({"model_from_pretrained_kwargs": {"refactor_factored_attn_matrices": True}}, "refactor_factored_attn_matrices"),
    ({"model_from_pretrained_kwargs": {"n_devices": 2}}, "n_devices"),
    ({"top": {"normalize_activations": "expected_average_only_in"}}, "norm_scaling_factor"),
    ({"top": {"normalize_activations": "constant_norm_rescale"}}, "constant_norm_rescale"),
])
def test_a_folder_asking_for_math_not_done_here_is_refused_in_one_line(monkeypatch, tmp_path, params, changes,
                                                                       fragment):
    sae = loaded(monkeypatch, tmp_path, 0, params)
    with pytest.raises(UsageError, match=fragment) as error:
        load_sae(folder_with(tmp_path, sae, **changes))
    assert "\n" not in str(error.value)


# --- torch's .pt without torch ---


class Payload:
    def __reduce__(self):
        return print, ("pickled code ran",)


def test_a_pt_file_naming_code_is_refused_without_running_it(tmp_path, capsys):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"W_enc": Payload()}, protocol=2))
    (tmp_path / "evil.pt").write_bytes(buffer.getvalue())
    with pytest.raises(CheckpointError, match=r"names __builtin__\.print, which this reader does not run"):
        read_torch_zip(tmp_path / "evil.pt")
    assert "pickled code ran" not in capsys.readouterr().out


def test_a_damaged_pt_file_is_one_line(tmp_path):
    data = (RELEASE_FIXTURES / "k3" / "weights.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cut.pt"):
        read_torch_zip(tmp_path / "cut.pt")


# --- sae eval's metrics, as SAELens's evals.py computes them ---

EVAL_NAMES = {"L_clean": "ce_loss_without_sae", "L_sae": "ce_loss_with_sae", "L_zero": "ce_loss_with_ablation",
              "loss_recovered": "ce_loss_score", "kl_div_with_sae": "kl_div_with_sae",
              "kl_div_with_ablation": "kl_div_with_ablation", "kl_div_score": "kl_div_score",
              "explained_variance": "explained_variance", "mse": "mse", "l0": "l0", "l1": "l1", "cossim": "cossim",
              "l2_ratio": "l2_ratio", "relative_reconstruction_bias": "relative_reconstruction_bias"}


@pytest.mark.parametrize("i", range(3), ids=[release for release, _ in KINDS[:3]])  # SAELens's evals fail on hook_z
def test_sae_eval_metrics_equal_saelens_evals(monkeypatch, tmp_path, params, i):
    sae, expected = loaded(monkeypatch, tmp_path, i, params), reference()
    windows = np.stack([expected["tokens"][start:start + 9] for start in (0, 8, 16)])  # the script's EVAL_SEQ_LEN 8,
    # EVAL_WINDOWS 3: each window and its next token
    numbers = evaluate(sae, params, N_HEAD, windows)
    for ours, theirs in EVAL_NAMES.items():  # a score, 1 - a ratio of two such numbers, within TOLERANCE of it
        tolerance = {"abs": TOLERANCE} if theirs.endswith("score") else {"rel": TOLERANCE}
        assert numbers[ours] == pytest.approx(float(expected[f"k{i}_eval_{theirs}"]), **tolerance), ours
    np.testing.assert_allclose(numbers["feature_density"], expected[f"k{i}_eval_feature_density"], atol=1e-6)
    listed = releases()[KINDS[i][0]]["saes"][KINDS[i][1]]
    assert numbers["published"] == {name: listed[name] for name in ("l0", "variance_explained") if name in listed}


# --- TransformerLens's hook_normalized: layer norm's output before its gain and bias ---


@pytest.mark.parametrize("theirs", ["blocks.1.ln1.hook_normalized", "blocks.0.ln2.hook_normalized",
                                    "ln_final.hook_normalized"])
def test_hook_normalized_maps_to_the_norm_before_its_gain(params, theirs):
    ours = our_hook(theirs)
    assert ours.endswith(".normalized")
    names = trace(reference()["tokens"], params, N_HEAD)
    assert relative_error(names[ours], reference()[f"normalized_{theirs}"]) < TOLERANCE


def test_layer_norm_is_saelens_s_unbiased_std_with_epsilon_on_the_std():
    # SAELens's run_time_activation_ln_in, from its definition in float64: (x - μ) / (std(ddof=1) + 1e-5). A spread of
    # 1e-3 tells it from the biased std (a factor √(d/(d-1))) and from ε under the square root (1e-5 against 1e-3)
    x = np.random.default_rng(3).normal(5, 1e-3, (4, 16))
    centred = x - x.mean(axis=-1, keepdims=True)
    expected = centred / (centred.std(axis=-1, ddof=1, keepdims=True) + 1e-5)
    normed, mu, sigma = layer_norm(x.astype(np.float32))
    np.testing.assert_allclose(normed, expected, rtol=1e-3, atol=1e-3)
    sd = centred.std(axis=-1, ddof=1, keepdims=True)  # undone as SAELens's ln_out does: × σ + μ, ε not added back
    np.testing.assert_allclose(sigma, sd, rtol=1e-3)
    np.testing.assert_allclose(mu, x.mean(axis=-1, keepdims=True), rtol=1e-6)


def test_an_edit_of_ln_1_normalized_goes_on_through_the_gain_and_bias(params):
    tokens = reference()["tokens"]
    ln_1 = params["blocks"][1]["ln_1"]
    names = run_with_edits(tokens, params, N_HEAD, [Edit("blocks.1.ln_1.normalized", np.zeros_like)])
    np.testing.assert_array_equal(names["blocks.1.ln_1"], np.broadcast_to(ln_1["b"], names["blocks.1.ln_1"].shape))


def test_ablating_a_latent_of_a_layer_norm_sae_takes_out_its_share_of_the_output(monkeypatch, tmp_path, params):
    # SAELens's latent ablation with the error term: x minus (output with f - output with f_F zeroed), its output
    # decode(f) σ + μ, so the share is f_F W_dec[F] σ
    from gpt2_numpy.sae.features import ablated_latents

    sae = loaded(monkeypatch, tmp_path, 1, params)
    x = model_rows(reference()["tokens"], params, N_HEAD, sae.hook).astype(np.float64)
    f = reference()["k1_latents"].astype(np.float64)
    latents = [int(j) for j in np.flatnonzero(f.any(axis=0))[:2]]
    centred = x - x.mean(axis=-1, keepdims=True)
    sigma = centred.std(axis=-1, ddof=1, keepdims=True)
    expected = x - f[:, latents] @ sae.params["W_dec"][latents].astype(np.float64) * sigma
    assert relative_error(ablated_latents(sae, latents, x.astype(np.float32)), expected) < TOLERANCE
