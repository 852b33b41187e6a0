"""`python -m gpt2_numpy.sae train` and `eval` end to end in subprocesses, on tiny activations and a tiny model:
the run folder (SAELens's files, log.csv, exact resume, no overwriting), the loss recovered, and bad input."""
import csv
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from gpt2_numpy.commands import sae as sae_command
from gpt2_numpy.errors import Gpt2NumpyError, UsageError
from gpt2_numpy.sae.files import load_sae, save_sae
from gpt2_numpy.params import random_params
from tests.conftest import REPO, assert_one_error_line, byte_model_dir
from tests.sae_helpers import exact_sae

HPARAMS = {"n_vocab": 257, "n_ctx": 32, "n_embd": 8, "n_head": 2, "n_layer": 2}
TRAIN = ["--d-sae", "16", "--k", "2", "--batch-size", "32", "--buffer", "64", "--lr", "1e-2"]


def run_sae(*args):  # -> CompletedProcess of python -m gpt2_numpy.sae args, never a traceback
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "gpt2_numpy.sae", *map(str, args)], capture_output=True,
                            text=True, env=env, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture(scope="module")
def activations(tmp_path_factory):  # -> an .npy file of 300 activations of 8 numbers
    path = tmp_path_factory.mktemp("acts") / "acts.npy"
    np.save(path, np.random.default_rng(3).standard_normal((300, 8)).astype(np.float32))
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory):  # -> a tiny model folder with a byte-level vocabulary, and a text for it
    folder = byte_model_dir(tmp_path_factory.mktemp("model") / "tiny", HPARAMS, random_params(HPARAMS, 4))
    text = folder.parent / "text.txt"
    text.write_text("the cat sat on the mat and the dog sat on the log. " * 8, encoding="utf-8")
    return folder, text


def log_rows(folder):  # -> log.csv's rows without the seconds column, which differs between runs
    with (folder / "log.csv").open(newline="") as file:
        return [{key: value for key, value in row.items() if key != "seconds"} for row in csv.DictReader(file)]


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(activations, tmp_path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    assert run_sae("train", "--activations", activations, "--out", whole, "--steps", 6, *TRAIN).returncode == 0
    assert run_sae("train", "--activations", activations, "--out", halves, "--steps", 3, *TRAIN).returncode == 0
    resumed = run_sae("train", "--activations", activations, "--out", halves, "--steps", 6, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert (whole / "sae_weights.safetensors").read_bytes() == (halves / "sae_weights.safetensors").read_bytes()
    assert log_rows(whole) == log_rows(halves) and len(log_rows(whole)) == 6
    sae = load_sae(whole)
    assert (sae.architecture, sae.d_in, sae.d_sae, sae.k, sae.hook) == ("topk", 8, 16, 2, None)
    assert np.allclose(np.linalg.norm(sae.params["W_dec"], axis=1), 1, atol=1e-5)  # topk's unit-norm rows


def test_each_latents_count_since_it_fired_restarts_when_it_fires(activations, tmp_path):
    # topk fires k latents in every row, so those of the last batch stand at 0 and none has waited longer than the run
    out = tmp_path / "run"
    assert run_sae("train", "--activations", activations, "--out", out, "--steps", 3, *TRAIN).returncode == 0
    batch, k = int(TRAIN[TRAIN.index("--batch-size") + 1]), int(TRAIN[TRAIN.index("--k") + 1])
    with np.load(out / "train_state.npz") as state:
        since_fired = state["since_fired"]
    assert np.sum(since_fired == 0) >= k
    assert since_fired.max() <= 3 * batch


def test_a_run_never_writes_over_a_folder_that_is_not_its_own(activations, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = run_sae("train", "--activations", activations, "--out", tmp_path, "--steps", 1, *TRAIN)
    assert_one_error_line(result, "holds files that are not a training run")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]
    again = run_sae("train", "--activations", activations, "--out", tmp_path / "run", "--steps", 1, *TRAIN)
    assert again.returncode == 0
    assert_one_error_line(run_sae("train", "--activations", activations, "--out", tmp_path / "run", "--steps", 2,
                                  *TRAIN), "already holds a training run")


@pytest.mark.parametrize("array, fragment", [
    (np.zeros((10, 8), np.int32), "int32"), (np.zeros(10, np.float32), "[10]"), (None, "not an .npy array"),
    (np.full((10, 8), np.nan, np.float32), "NaN")])
def test_bad_activations_are_refused_and_no_folder_is_made(array, fragment, tmp_path):
    path = tmp_path / "acts.npy"
    if array is None:
        path.write_text("not numpy")
    else:
        np.save(path, array)
    with pytest.raises(UsageError, match=re.escape(fragment)):  # in this process: run_cli's line is checked below
        sae_command.run(["train", "--activations", str(path), "--out", str(tmp_path / "out"), *TRAIN])
    assert not (tmp_path / "out").exists()
    if array is None:
        assert_one_error_line(run_sae("train", "--activations", path, "--out", tmp_path / "out", *TRAIN), fragment)
        assert not (tmp_path / "out").exists()


def test_eval_recovers_all_the_loss_with_an_exact_sae_and_none_with_a_zero_one(model, tmp_path):
    folder, text = model
    sae = exact_sae(8, "blocks.0.out")
    save_sae(sae, tmp_path / "exact")
    sae.params["W_dec"] = np.zeros_like(sae.params["W_dec"])  # decodes every activation to b_dec = 0
    save_sae(sae, tmp_path / "zero")
    numbers = {}
    for name in ("exact", "zero"):
        result = run_sae("eval", "--sae", tmp_path / name, "--model", folder, "--data", text, "--seq-len", 16,
                         "--json")
        assert result.returncode == 0, result.stderr
        numbers[name] = json.loads(result.stdout)
    assert numbers["exact"]["loss_recovered"] == pytest.approx(1.0, abs=1e-5)
    assert numbers["exact"]["L_sae"] == pytest.approx(numbers["exact"]["L_clean"], abs=1e-5)
    assert numbers["exact"]["explained_variance"] == pytest.approx(1.0, abs=1e-5)
    assert numbers["zero"]["loss_recovered"] == pytest.approx(0.0, abs=1e-5)
    assert numbers["zero"]["L_zero"] != pytest.approx(numbers["zero"]["L_clean"], abs=1e-3)
    text_report = run_sae("eval", "--sae", tmp_path / "exact", "--model", folder, "--data", text, "--seq-len", 16)
    assert "L_clean" in text_report.stdout and "loss recovered 1.0000" in text_report.stdout


def test_train_from_a_model_reads_the_hook_and_writes_transformer_lens_name(model, tmp_path):
    folder, text = model
    result = run_sae("train", "--model", folder, "--hook", "blocks.1.hook_resid_pre", "--data", text, "--seq-len",
                     16, "--out", tmp_path / "sae", "--steps", 2, *TRAIN)
    assert result.returncode == 0, result.stderr
    cfg = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    assert cfg["metadata"]["hook_name"] == "blocks.0.hook_resid_post"
    assert load_sae(tmp_path / "sae").hook == "blocks.0.out"


def test_bad_hooks_and_widths_get_one_line(model, tmp_path):
    folder, text = model
    result = run_sae("train", "--model", folder, "--hook", "blocks.5.out", "--data", text, "--out", tmp_path / "a",
                     *TRAIN)
    assert_one_error_line(result, "blocks.L.STEP for L from 0 to 1")
    assert not (tmp_path / "a").exists()
    save_sae(exact_sae(4, "blocks.0.out"), tmp_path / "narrow")
    assert_one_error_line(run_sae("eval", "--sae", tmp_path / "narrow", "--model", folder, "--data", text),
                          "the SAE reads 4 numbers per position, but the model's blocks.0.out has 8")


@pytest.mark.parametrize("change, fragment", [
    ({"normalize_activations": "layer_norm"}, 'normalize_activations "layer_norm" is not supported'),
    ({"architecture": "gated"}, "architecture gated is not supported"),
    ({"d_sae": 17}, "W_enc has shape [8, 16], but cfg.json's d_in 8 and d_sae 17 make it [8, 17]"),
    ({"k": 0}, "k is 0"), (None, "is not JSON")])
def test_damaged_or_unsupported_folders_are_refused_by_name(tmp_path, change, fragment):
    sae = exact_sae(8, "blocks.0.out")
    sae.cfg.update(architecture="topk", k=2)
    save_sae(sae, tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    (tmp_path / "cfg.json").write_text("{" if change is None else json.dumps({**cfg, **change}))
    with pytest.raises(Gpt2NumpyError, match=re.escape(fragment)):
        load_sae(tmp_path)


def test_damaged_weights_get_one_line(model, tmp_path):
    folder, text = model
    save_sae(exact_sae(8, "blocks.0.out"), tmp_path)
    weights = tmp_path / "sae_weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])  # cut short, as an interrupted copy leaves it
    assert_one_error_line(run_sae("eval", "--sae", tmp_path, "--model", folder, "--data", text), "sae_weights")


def test_an_sae_on_a_per_head_activation_splices_back_in_place(model, tmp_path):
    folder, text = model
    save_sae(exact_sae(8, "blocks.1.attn.z"), tmp_path / "z")  # 2 heads of 4 numbers, side by side
    result = run_sae("eval", "--sae", tmp_path / "z", "--model", folder, "--data", text, "--seq-len", 16, "--json")
    assert result.returncode == 0, result.stderr
    numbers = json.loads(result.stdout)
    assert numbers["L_sae"] == pytest.approx(numbers["L_clean"], abs=1e-5)
    assert numbers["L_zero"] != pytest.approx(numbers["L_clean"], abs=1e-3)


def test_the_subcommands_are_listed_and_a_missing_one_is_named():
    listing = run_sae("--help")
    assert listing.returncode == 0 and "train" in listing.stdout and "eval" in listing.stdout
    assert_one_error_line(run_sae("fit"), "unknown subcommand 'fit'")
