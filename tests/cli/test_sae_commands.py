"""`python -m gpt2_numpy sae train` and `eval` end to end in subprocesses, on tiny activations and a tiny model:
the run folder (SAELens's files, log.csv, exact resume, no overwriting), the loss recovered, and bad input."""
import csv
import json
import os
import re
import resource
import shutil
import subprocess
import sys

import numpy as np
import pytest

from gpt2_numpy.sae import training as run_module
from gpt2_numpy.commands import sae as sae_command
from gpt2_numpy.sae.activations import sae_for_model
from gpt2_numpy.errors import Gpt2NumpyError, UsageError
from gpt2_numpy.sae.transcoder_files import load_transcoders, save_transcoders
from gpt2_numpy.sae.transcoder_model import TranscoderSet
from gpt2_numpy.sae.evaluation import evaluate_transcoders
from gpt2_numpy.sae.files import new_sae, save_sae
from gpt2_numpy.sae.releases import load_sae
from gpt2_numpy.model import block, layer_norm
from gpt2_numpy.params import random_params
from gpt2_numpy.tokenizer import bytes_to_unicode
from tests.conftest import REPO, assert_one_error_line, byte_model_dir
from tests.sae_helpers import exact_sae

HPARAMS = {"n_vocab": 257, "n_ctx": 32, "n_embd": 8, "n_head": 2, "n_layer": 2}
TRAIN = ["--d-sae", "16", "--k", "2", "--batch-size", "32", "--buffer", "64", "--lr", "1e-2"]
TRANSCODER = ["--transcoder", "--hook", "ln_2", "--target", "mlp.out", "--seq-len", 16, *TRAIN]


def run_sae(*args):  # -> CompletedProcess of python -m gpt2_numpy sae args, never a traceback
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "gpt2_numpy", "sae", *map(str, args)], capture_output=True,
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
    (np.zeros((10, 8, 2), np.float32), "[10, 8, 2]"),
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
    ({"normalize_activations": "constant_norm_rescale"},
     'normalize_activations "constant_norm_rescale" is not supported'),
    ({"architecture": "gated"}, "architecture gated is not supported"),
    ({"d_sae": 17}, "W_enc has shape [8, 16], but cfg.json's d_in 8 and d_sae 17 make it [8, 17]"),
    ({"k": 0}, "k is 0"), ({"k": 17}, "k is 17, not a whole number from 1 to d_sae 16"), (None, "is not JSON")])
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


# --- issue 54: resumes, hooks, eval's edge cases, bad files ---


def model_folder(path, seed=4, **changes):  # -> a tiny byte-level model folder, HPARAMS with changes
    hparams = {**HPARAMS, **changes}
    return byte_model_dir(path, hparams, random_params(hparams, seed))


def test_a_resume_from_another_model_hook_or_width_is_refused_naming_both(model, tmp_path):
    folder, text = model
    out = tmp_path / "run"
    command = ["train", "--hook", "blocks.0.out", "--data", text, "--seq-len", 16, "--out", out, *TRAIN]
    assert run_sae(*command, "--model", folder, "--steps", 1).returncode == 0
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    other = model_folder(tmp_path / "other", seed=5)  # the same width and vocabulary: the same tokens, digest
    wide = model_folder(tmp_path / "wide", n_embd=12)
    refusals = ((["--model", other], f"--model {other} is not the model the run in {out} trained on ({folder})"),
                (["--model", wide], "the activations have 12 numbers each, but the run"),
                (["--model", folder, "--hook", "blocks.1.out"], "differs from the saved run's blocks.0.out"))
    for given, fragment in refusals:
        words = [*command, *given, "--steps", 2, "--resume"]
        if "--hook" in given:
            words[1:3] = []
        assert_one_error_line(run_sae(*words), fragment)
        assert {path.name: path.read_bytes() for path in out.iterdir()} == before  # nothing written
    copy = shutil.copytree(folder, tmp_path / "elsewhere")  # the same weights, named by another path: the same model
    result = run_sae(*command, "--model", copy, "--steps", 2, "--resume")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("how", ["train", "activations", "eval", "explain"])
@pytest.mark.parametrize("hook", ["blocks.0.attn.scores", "blocks.1.attn.weights"])
def test_attention_scores_and_weights_are_refused_as_an_saes_hook(model, activations, tmp_path, how, hook):
    folder, text = model
    if how == "explain":  # explain --sae and sae features load their SAE so
        save_sae(exact_sae(2, hook), tmp_path / "sae")  # 2 heads x 1 key: the width sae_for_model measures
        with pytest.raises(UsageError, match=f"cannot read {re.escape(hook)}: .* read the future"):
            sae_for_model(tmp_path / "sae", random_params(HPARAMS, 4), HPARAMS)
        return
    if how == "train":
        argv = ["train", "--model", str(folder), "--hook", hook, "--data", str(text), "--out", str(tmp_path / "o")]
    elif how == "activations":
        argv = ["train", "--activations", str(activations), "--hook", hook, "--out", str(tmp_path / "o")]
    else:
        save_sae(exact_sae(64, hook), tmp_path / "sae")  # 2 heads x 32 keys: the width of a 32-token window
        argv = ["eval", "--sae", str(tmp_path / "sae"), "--model", str(folder), "--data", str(text), "--seq-len", "32"]
    with pytest.raises(UsageError, match=f"cannot read {re.escape(hook)}: .* read the future"):
        sae_command.run(argv + (TRAIN if how != "eval" else []))
    assert not (tmp_path / "o").exists()


def test_eval_where_zeroing_the_hook_changes_nothing_says_loss_recovered_is_undefined(tmp_path):
    params = random_params(HPARAMS, 4)
    for name in ("w", "b"):  # block 1's attention writes nothing: zeroing its output is no change
        params["blocks"][1]["attn"]["c_proj"][name][...] = 0
    folder = byte_model_dir(tmp_path / "model", HPARAMS, params)
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat. " * 4, encoding="utf-8")
    save_sae(exact_sae(8, "blocks.1.attn.out"), tmp_path / "sae")
    command = ["eval", "--sae", tmp_path / "sae", "--model", folder, "--data", text, "--seq-len", 16]
    result = run_sae(*command, "--json")
    assert result.returncode == 0, result.stderr
    numbers = json.loads(result.stdout)
    assert numbers["loss_recovered"] is None
    assert numbers["L_clean"] == numbers["L_zero"] == pytest.approx(numbers["L_sae"], abs=1e-6)
    printed = run_sae(*command)
    assert printed.returncode == 0, printed.stderr
    assert f"L_clean {numbers['L_clean']:.4f}  L_sae {numbers['L_sae']:.4f}  L_zero" in printed.stdout
    assert "loss recovered: undefined" in printed.stdout


def test_an_empty_npy_file_gets_one_line(tmp_path):
    path = tmp_path / "acts.npy"
    path.write_bytes(b"")
    assert_one_error_line(run_sae("train", "--activations", path, "--out", tmp_path / "out", *TRAIN),
                          "is not an .npy array")
    assert not (tmp_path / "out").exists()


def test_a_truncated_train_state_gets_one_line_on_resume(activations, tmp_path):
    out = tmp_path / "run"
    assert run_sae("train", "--activations", activations, "--out", out, "--steps", 1, *TRAIN).returncode == 0
    state = out / "train_state.npz"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # as a copy cut off midway leaves it
    result = run_sae("train", "--activations", activations, "--out", out, "--steps", 2, "--resume")
    assert_one_error_line(result, f"{state} is damaged")
    assert "start a new run in another folder" in result.stderr


def test_the_first_non_finite_row_is_named(tmp_path):
    array = np.zeros((2000, 8), np.float32)
    array[1500, 3] = np.inf
    np.save(tmp_path / "acts.npy", array)
    with pytest.raises(UsageError, match=re.escape("(first in row 1,500)")):
        sae_command.run(["train", "--activations", str(tmp_path / "acts.npy"), "--out", str(tmp_path / "out"),
                         *TRAIN])


def at_most_4_gib():  # the child's address space capped: a read of /dev/zero fails there, not on this machine
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))


@pytest.mark.parametrize("kind, fragment", [("fifo", "not a regular file"), ("dev_zero", "not a regular file"),
                                            ("huge", "larger than 1 MB")])
def test_a_cfg_json_that_is_no_small_regular_file_gets_one_line_at_once(model, tmp_path, kind, fragment):
    # read as a model's config.json is: a regular file of at most 1 MB
    folder, text = model
    save_sae(exact_sae(8, "blocks.0.out"), tmp_path / "sae")
    cfg = tmp_path / "sae" / "cfg.json"
    if kind == "huge":
        cfg.write_bytes(cfg.read_bytes() + b" " * 2**21)  # valid JSON still
    else:
        cfg.unlink()
    if kind == "fifo":
        os.mkfifo(cfg)  # opened for reading, it waits for a writer: for ever
    elif kind == "dev_zero":
        cfg.symlink_to("/dev/zero")  # read whole, it fills the memory
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "gpt2_numpy", "sae", "eval", "--sae", str(tmp_path / "sae"),
                             "--model", str(folder), "--data", str(text)], capture_output=True, text=True, env=env,
                            timeout=30, preexec_fn=at_most_4_gib)
    assert_one_error_line(result, fragment)


def test_a_seq_len_over_the_context_is_refused_so_each_run_resumes_with_its_own_command(model, tmp_path):
    # train refuses it too; cut to the context in silence, the run saved 32 and its own command's 100 differed
    folder, text = model
    over = ["train", "--model", folder, "--hook", "blocks.0.out", "--data", text, "--seq-len", 100, "--out",
            tmp_path / "over", *TRAIN]
    assert_one_error_line(run_sae(*over, "--steps", 1), "--seq-len 100 is over the model's context of 32 tokens")
    assert not (tmp_path / "over").exists()
    command = ["train", "--model", folder, "--hook", "blocks.0.out", "--data", text, "--seq-len", 32, "--out",
               tmp_path / "run", *TRAIN]
    assert run_sae(*command, "--steps", 1).returncode == 0
    resumed = run_sae(*command, "--steps", 2, "--resume")
    assert resumed.returncode == 0, resumed.stderr


def test_eval_takes_hook_for_a_folder_that_names_none_and_checks_its_width(model, tmp_path):
    folder, text = model
    save_sae(exact_sae(8, None), tmp_path / "unnamed")
    save_sae(exact_sae(4, None), tmp_path / "narrow")
    save_sae(exact_sae(8, "blocks.0.out"), tmp_path / "named")
    command = ["--model", folder, "--data", text, "--seq-len", 16]
    result = run_sae("eval", "--sae", tmp_path / "unnamed", *command, "--hook", "blocks.0.hook_resid_post", "--json")
    assert result.returncode == 0, result.stderr
    numbers = json.loads(result.stdout)
    assert numbers["hook"] == "blocks.0.out" and numbers["L_sae"] == pytest.approx(numbers["L_clean"], abs=1e-5)
    assert_one_error_line(run_sae("eval", "--sae", tmp_path / "unnamed", *command), "--hook NAME")
    assert_one_error_line(run_sae("eval", "--sae", tmp_path / "narrow", *command, "--hook", "blocks.0.out"),
                          "the SAE reads 4 numbers per position, but the model's blocks.0.out has 8")
    assert_one_error_line(run_sae("eval", "--sae", tmp_path / "named", *command, "--hook", "blocks.1.out"),
                          "--hook blocks.1.out differs from blocks.0.out")


def test_a_misspelt_subcommand_gets_the_nearest():
    assert_one_error_line(run_sae("trian"), "unknown subcommand 'trian' (did you mean train?)")


def test_without_d_sae_an_sae_has_8_latents_per_number_and_k_may_be_all_of_them(activations, tmp_path):
    # --d-sae's documented default, 8 x the activation's width (8 here); a k of every latent is allowed (k <= d_sae)
    assert sae_command.run(["train", "--activations", str(activations), "--out", str(tmp_path / "run"), "--k", "64",
                            "--steps", "0", "--batch-size", "32", "--buffer", "64"]) == 0
    sae = load_sae(tmp_path / "run")
    assert (sae.d_in, sae.d_sae, sae.k) == (8, 64, 64)


def test_a_dead_latent_counts_activations_and_turns_dead_after_dead_after_of_them(activations, tmp_path, monkeypatch):
    # 64 latents, one of them per activation, batches of 32: after 2 steps the latents no row of either batch used
    # have waited 64 activations: dead at DEAD_AFTER 64, and step 3 gives them the AuxK loss
    monkeypatch.setattr(run_module, "DEAD_AFTER", 64)
    out = tmp_path / "run"
    flags = ["--d-sae", "64", "--k", "1", "--batch-size", "32", "--buffer", "64", "--lr", "1e-2"]
    for steps in (2, 3):
        assert sae_command.run(["train", "--activations", str(activations), "--out", str(out), "--steps", str(steps),
                                *flags, *(["--resume"] if steps == 3 else [])]) == 0
        with np.load(out / "train_state.npz") as state:
            since_fired = state["since_fired"]
        assert set(np.unique(since_fired)) <= {32 * n for n in range(steps + 1)}  # activations, not steps
        row = log_rows(out)[-1]
        assert float(row["dead_fraction"]) == pytest.approx(np.mean(since_fired >= 64), abs=1e-4)
        if steps == 2:
            assert np.mean(since_fired >= 64) > 0  # the test's premise: some latent no row of the two batches used
        else:
            assert float(row["sparsity_loss"]) > 0


CUT_AFTER_WEIGHTS = """
import os, sys
import gpt2_numpy.sae.training as run_module
from gpt2_numpy.commands.sae import main
at_step, move_in = sys.argv[1], run_module.move_in

def weights_then_killed(staging, out, names):  # the save of at_step: its weights move in, then the process dies
    if run_module.read_metadata(staging / names[0]).get("step") == at_step:
        os.replace(staging / names[0], out / names[0])
        os._exit(9)
    move_in(staging, out, names)

run_module.move_in = weights_then_killed
main(sys.argv[2:])
"""


@pytest.mark.parametrize("kind", ["sae", pytest.param("transcoders", marks=pytest.mark.slow)])
def test_a_run_cut_after_its_weights_moved_in_settles_and_resumes_as_an_uninterrupted_one(activations, model, tmp_path,
                                                                                          kind):
    # a transcoder run's save: layer 0's file (whose header names the step) in place, the other layer's still staged
    source = ["--activations", activations, *TRAIN] if kind == "sae" else \
        ["--model", model[0], "--data", model[1], *TRANSCODER]
    command = ["train", *source, "--steps", 6, "--save-every", 2]
    cut = subprocess.run([sys.executable, "-c", CUT_AFTER_WEIGHTS, "4", *map(str, command), "--out",
                          str(tmp_path / "cut")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert cut.returncode == 9, cut.stderr
    assert (tmp_path / "cut" / ".train.save").is_dir()
    resumed = run_sae(*command, "--out", tmp_path / "cut", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert run_sae(*command, "--out", tmp_path / "whole").returncode == 0
    names = ("sae_weights.safetensors", "cfg.json") if kind == "sae" else \
        ("layer_0.safetensors", "layer_1.safetensors", "config.yaml")
    for name in names:
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert log_rows(tmp_path / "cut") == log_rows(tmp_path / "whole")


def test_a_resume_follows_and_records_its_own_save_every(activations, tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert sae_command.run(["train", "--activations", str(activations), "--out", str(out), "--steps", "2",
                            "--save-every", "5", *TRAIN]) == 0
    saved, save = [], run_module.save_sae_run

    def recorded(*args):
        saved.append(args[5])  # its step
        save(*args)
    monkeypatch.setattr(run_module, "save_sae_run", recorded)
    assert sae_command.run(["train", "--activations", str(activations), "--out", str(out), "--steps", "7",
                            "--save-every", "2", "--resume"]) == 0
    assert saved == [4, 6, 7]
    with np.load(out / "train_state.npz") as state:
        assert json.loads(str(state["settings"]))["save_every"] == 2


def hand_logits(ids, params, n_head, replace=None):  # int [n] -> [n, n_vocab]: model.py's blocks one by one, block
    # 0's output replaced by replace(x) where given
    x = params["wte"][ids] + params["wpe"][np.arange(len(ids))]
    for layer, block_params in enumerate(params["blocks"]):
        x = block(x, **block_params, n_head=n_head)
        if layer == 0 and replace is not None:
            x = replace(x)
    return layer_norm(x, **params["ln_f"]) @ params["wte"].T


def hand_topk(x, params, k):  # [n, d_in] -> f [n, d_sae]: the k largest of (x - b_dec) W_enc + b_enc, ReLU'd
    pre = (x - params["b_dec"]) @ params["W_enc"] + params["b_enc"]
    kept = np.argsort(-pre, axis=-1)[:, :k]
    f = np.zeros_like(pre)
    rows = np.arange(len(pre))[:, None]
    f[rows, kept] = np.maximum(pre[rows, kept], 0)
    return f


def test_eval_numbers_equal_a_next_token_loss_computed_by_hand(model, tmp_path):
    folder, text = model
    params, n_head, seq_len, n_windows, k = random_params(HPARAMS, 4), HPARAMS["n_head"], 16, 3, 2
    rng = np.random.default_rng(8)
    sae_params = {"W_enc": rng.standard_normal((8, 64)).astype(np.float32),
                  "b_enc": rng.standard_normal(64).astype(np.float32),
                  "W_dec": rng.standard_normal((64, 8)).astype(np.float32) / 4,
                  "b_dec": rng.standard_normal(8).astype(np.float32)}
    save_sae(new_sae({"architecture": "topk", "k": k}, sae_params, "blocks.0.out"), tmp_path / "sae")
    result = run_sae("eval", "--sae", tmp_path / "sae", "--model", folder, "--data", text, "--seq-len", seq_len,
                     "--windows", n_windows, "--json")
    assert result.returncode == 0, result.stderr
    numbers = json.loads(result.stdout)
    byte_ids = {byte: token_id for token_id, byte in enumerate(bytes_to_unicode())}  # the byte model's vocabulary
    tokens = np.array([byte_ids[byte] for byte in text.read_bytes()])
    losses, fired = {"clean": [], "sae": [], "zero": []}, []
    for i in range(n_windows):
        window = tokens[i * seq_len: (i + 1) * seq_len + 1]
        x = params["wte"][window[:-1]] + params["wpe"][np.arange(seq_len)]
        fired.append(hand_topk(block(x, **params["blocks"][0], n_head=n_head), sae_params, k).any(axis=0))
        for name, replace in (("clean", None), ("sae", lambda x: hand_topk(x, sae_params, k) @ sae_params["W_dec"]
                                                 + sae_params["b_dec"]), ("zero", np.zeros_like)):
            logits = hand_logits(window[:-1], params, n_head, replace).astype(np.float64)
            top = logits.max(axis=-1, keepdims=True)
            log_probs = logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
            losses[name].extend(-log_probs[np.arange(seq_len), window[1:]])
    for name in losses:
        assert numbers[f"L_{name}"] == pytest.approx(np.mean(losses[name]), rel=1e-5), name
    assert numbers["tokens"] == n_windows * seq_len
    assert numbers["dead_latents"] == 64 - np.logical_or.reduce(fired).sum()
    assert not np.array_equal(fired[-1], np.logical_or.reduce(fired))  # the premise: the windows fire differently



@pytest.mark.slow
def test_a_transcoder_run_is_a_set_that_graph_reads_and_resumes_as_an_uninterrupted_one(model, tmp_path):
    folder, text = model
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    common = ["--model", folder, "--data", text, "--skip", *TRANSCODER]
    assert run_sae("train", *common, "--out", whole, "--steps", 6).returncode == 0
    assert run_sae("train", *common, "--out", halves, "--steps", 3).returncode == 0
    resumed = run_sae("train", *common, "--out", halves, "--steps", 6, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    for name in ("layer_0.safetensors", "layer_1.safetensors", "config.yaml"):
        assert (whole / name).read_bytes() == (halves / name).read_bytes(), name
    assert log_rows(whole) == log_rows(halves) and len(log_rows(whole)) == 6
    transcoders = load_transcoders(whole)
    assert (transcoders.input_hook, transcoders.output_hook, transcoders.skip) == ("mlp.hook_in", "hook_mlp_out", True)
    assert transcoders.scan == "tiny-ln_2"  # circuit-tracer's loader requires a scan: the model's folder, the hook
    assert [layer["W_enc"].shape for layer in transcoders.layers] == [(16, 8), (16, 8)]
    assert all(np.ptp(layer["threshold"]) == 0 and layer["threshold"][0] > 0 for layer in transcoders.layers)
    assert np.any(transcoders.layers[0]["W_skip"] != 0)  # trained from its zero init
    graph = subprocess.run([sys.executable, "-m", "gpt2_numpy", "circuits", "graph", "--model", folder,
                            "--transcoders", whole, "the cat", "--out", tmp_path / "graph"], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert graph.returncode == 0, graph.stderr
    assert (tmp_path / "graph" / "graph.npz").is_file()


@pytest.mark.slow
def test_a_one_layer_run_is_a_set_of_one_that_eval_places_with_layers(model, tmp_path):
    folder, text = model
    out = tmp_path / "mid1"
    assert sae_command.run(["train", "--model", str(folder), "--data", str(text), "--out", str(out), "--steps", "2",
                            *map(str, TRANSCODER[:1]), "--hook", "blocks.1.mid", "--target", "blocks.1.mlp.out",
                            *map(str, TRANSCODER[5:])]) == 0
    transcoders = load_transcoders(out)
    assert (len(transcoders.layers), transcoders.input_hook) == (1, "hook_resid_mid")
    numbers = evaluate_transcoders(transcoders, [1], random_params(HPARAMS, 4), HPARAMS["n_head"],
                                   np.array([[1, 2, 3, 4, 5]]))
    result = run_sae("eval", "--transcoders", out, "--layers", 1, "--model", folder, "--data", text, "--seq-len", 4,
                     "--windows", 1, "--json")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert [row["layer"] for row in shown["layers"]] == [1] and shown["tokens"] == 4
    assert numbers["layers"][0]["layer"] == 1
    report = run_sae("eval", "--transcoders", out, "--layers", 1, "--model", folder, "--data", text, "--seq-len", 4,
                     "--windows", 1).stdout
    assert "4 tokens, 1 MLP replaced" in report and f"loss recovered {shown['loss_recovered']:.4f}" in report
    assert_one_error_line(run_sae("eval", "--transcoders", out, "--model", folder, "--data", text),
                          "holds 1 transcoder, but the model has 2 layers: give --layers")


def other_sets(tmp_path):  # -> {name: folder} of transcoder sets that do not fit the tiny model
    rng = np.random.default_rng(0)

    def layer(d_model):
        return {"W_enc": rng.standard_normal((4, d_model)).astype(np.float32), "b_enc": np.zeros(4, np.float32),
                "W_dec": rng.standard_normal((4, d_model)).astype(np.float32), "b_dec": np.zeros(d_model, np.float32)}

    sets = {"three": [layer(8)] * 3, "narrow": [layer(4)] * 2}
    for name, layers in sets.items():
        save_transcoders(TranscoderSet(layers, "mlp.hook_in", "hook_mlp_out"), tmp_path / name)
    return {name: tmp_path / name for name in sets}


@pytest.mark.parametrize("argv, fragment", [
    (["train", "--transcoder", "--hook", "ln_2"], "--transcoder needs --target"),
    (["train", "--hook", "blocks.0.ln_2", "--target", "blocks.0.mlp.out"], "--target applies to transcoders"),
    (["train", "--hook", "blocks.0.out", "--skip"], "--skip applies to transcoders"),
    (["train", "--transcoder", "--hook", "blocks.0.ln_2", "--target", "blocks.0.attn.out"], "not an MLP's output"),
    (["train", "--transcoder", "--hook", "blocks.0.attn.z", "--target", "blocks.0.mlp.out"], "not an MLP's input"),
    (["train", "--transcoder", "--hook", "blocks.0.ln_2", "--target", "blocks.1.mlp.out"], "not of one layer"),
    (["eval", "--transcoders", "{three}"], "holds 3 transcoders, but the model has 2 layers"),
    (["eval", "--transcoders", "{narrow}"], "reads 4 numbers per position, but the model is 8 wide"),
    (["eval", "--transcoders", "{three}", "--layers", "0", "2"], "--layers 0 2: give each layer once, from 0 to 1"),
    (["eval", "--transcoders", "{three}", "--hook", "blocks.0.out"], "--hook applies to --sae"),
    (["eval", "--transcoders", "{three}", "--sae", "{three}"], "one of the two"),
])
def test_bad_transcoder_input_gets_one_line_and_writes_nothing(model, tmp_path, argv, fragment):
    folder, text = model
    sets = other_sets(tmp_path)
    argv = [arg.format(**sets) for arg in argv] + ["--model", str(folder), "--data", str(text)]
    if argv[0] == "train":
        argv += ["--out", str(tmp_path / "out")]
    with pytest.raises(UsageError, match=re.escape(fragment)):
        sae_command.run(argv)
    assert not (tmp_path / "out").exists()
    if "--skip" in argv:  # one of them end to end: the line, the status
        assert_one_error_line(run_sae(*argv), fragment)


@pytest.mark.slow
def test_a_transcoder_resume_of_an_sae_run_is_refused(activations, model, tmp_path):
    folder, text = model
    assert run_sae("train", "--activations", activations, "--out", tmp_path / "sae", "--steps", 1, *TRAIN) \
        .returncode == 0
    assert_one_error_line(run_sae("train", "--model", folder, "--data", text, "--out", tmp_path / "sae", "--resume",
                                  *TRANSCODER), "holds an SAE's run: drop --transcoder")
