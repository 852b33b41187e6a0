"""`gpt2-numpy sae features` and explain's --sae, --sae-ablate and --steer (commands/sae_features.py) on a model folder
and an SAE folder of their own: the page's latents and contexts against a brute-force search, each position's
strongest latents and the loss and next tokens after an edit against the model run here, and bad input as one error
line with nothing written."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from gpt2_numpy.errors import UsageError
from gpt2_numpy.interpret.ablation import next_token_loss
from gpt2_numpy.interpret.tracing import log_softmax, trace
from gpt2_numpy.model import softmax
from gpt2_numpy.params import random_params
from tests.conftest import REPO, assert_one_error_line, byte_model_dir
from tests.sae_helpers import random_sae

from gpt2_numpy.commands.sae_features import explain_run, steer_pair
from gpt2_numpy.interpret import sae_files

HPARAMS = {"n_vocab": 257, "n_ctx": 16, "n_embd": 16, "n_head": 4, "n_layer": 2}
TEXT = "the cat sat on the mat, the cat sat on the hat; " * 8


@pytest.fixture(scope="module")
def folders(tmp_path_factory):  # -> (model folder, SAE folder, params, sae)
    root = tmp_path_factory.mktemp("features")
    params = random_params(HPARAMS, 5)
    model = byte_model_dir(root / "model", HPARAMS, params)
    stand_in = random_sae(16, 32, "blocks.0.out", seed=9)  # topk, k = 3: of a position's 5 strongest, 2 are 0
    sae = sae_files.new_sae({"architecture": "topk", "k": 3}, stand_in.params, "blocks.0.out")
    sae_files.save_sae(sae, root / "sae")
    (root / "text.txt").write_text(TEXT, encoding="utf-8")
    return model, root / "sae", params, sae


def run_sae(*args):  # -> CompletedProcess of `python -m gpt2_numpy sae ARGS`, as text, never a traceback
    return run_command("sae", *args)


def run_command(*args):  # -> CompletedProcess of `python -m gpt2_numpy ARGS`, as text, never a traceback
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "gpt2_numpy", *map(str, args)], capture_output=True,
                            text=True, env=env, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def byte_ids(text):  # the byte model's ids: the bytes in GPT-2's byte order (conftest.byte_model_dir)
    from gpt2_numpy.tokenizer import bytes_to_unicode

    order = {byte: token_id for token_id, byte in enumerate(bytes_to_unicode())}
    return [order[byte] for byte in text.encode()]


def test_the_page_shows_the_latents_that_fire_most_with_their_strongest_contexts(folders, tmp_path):
    model, sae_dir, params, sae = folders
    page = tmp_path / "features.html"
    result = run_sae("features", "--sae", sae_dir, "--model", model, "--data", sae_dir.parent / "text.txt",
                     "--html", page, "--count", 3, "--contexts", 2, "--seq-len", 16, "--windows", 4)
    assert result.returncode == 0, result.stderr
    data = json.loads(re.search(r"const DATA = (.*);\n", page.read_text(encoding="utf-8")).group(1))
    windows = np.array(byte_ids(TEXT)[:64]).reshape(4, 16)
    acts = np.stack([sae.encode(trace(w, params, 4)["blocks.0.out"]) for w in windows])  # [4, 16, 32]
    fired = (acts > 0).sum(axis=(0, 1))
    assert [latent["id"] for latent in data["latents"]] == np.argsort(-fired, kind="stable")[:3].tolist()
    for latent in data["latents"]:
        values = acts[..., latent["id"]].ravel()
        best = np.argsort(-values, kind="stable")[:2]
        assert [context["value"] for context in latent["contexts"]] == pytest.approx(values[best].tolist(), rel=1e-5)
        window, position = divmod(int(best[0]), 16)
        peak = latent["contexts"][0]
        assert peak["tokens"][peak["peak"]] == TEXT[window * 16 + position]


@pytest.mark.parametrize("overrides, extra, fragment", [
    ({}, ["--latents", "5", "32"], "--latents 32 is out of range: this SAE has 32 latents"),
    ({"--html": "page.txt"}, [], "--html"),
    ({"--data": "short.txt"}, ["--seq-len", "16"], "fewer than one window of 16"),
    ({}, ["--latents", "3", "3", "5"], "--latents names latent 3 more than once: give each latent once"),
])
def test_bad_input_is_one_error_line_and_writes_no_page(folders, tmp_path, overrides, extra, fragment):
    model, sae_dir, _, _ = folders
    (tmp_path / "short.txt").write_text("too short", encoding="utf-8")
    arguments = {"--sae": sae_dir, "--model": model, "--data": sae_dir.parent / "text.txt",
                 "--html": tmp_path / "page.html", **{flag: tmp_path / name for flag, name in overrides.items()}}
    result = run_sae("features", *[item for pair in arguments.items() for item in pair], *extra)
    assert_one_error_line(result, fragment)
    assert list(tmp_path.glob("page.*")) == []


def page_of(path):  # -> the JSON data the page's script holds
    return json.loads(re.search(r"const DATA = (.*);\n", path.read_text(encoding="utf-8")).group(1))


def test_latents_asked_for_that_never_fire_are_drawn_and_named(folders, tmp_path):
    model, sae_dir, params, sae = folders
    windows = np.array(byte_ids(TEXT)[:64]).reshape(4, 16)
    fired = np.stack([sae.encode(trace(w, params, 4)["blocks.0.out"]) > 0 for w in windows]).sum(axis=(0, 1))
    silent, busy = [int(i) for i in np.flatnonzero(fired == 0)[:2]], int(np.argmax(fired))
    assert len(silent) == 2  # k = 3 of 32 latents on a repetitive text: most never fire
    page = tmp_path / "features.html"
    result = run_sae("features", "--sae", sae_dir, "--model", model, "--data", sae_dir.parent / "text.txt",
                     "--html", page, "--seq-len", 16, "--windows", 4, "--latents", silent[0], busy, silent[1])
    assert result.returncode == 0, result.stderr
    assert (f"latents {silent[0]}, {silent[1]} of --latents never fire in --data {sae_dir.parent / 'text.txt'}: "
            "drawn without contexts") in result.stderr
    data = page_of(page)
    assert [(latent["id"], latent["fired"]) for latent in data["latents"]] == [
        (silent[0], 0), (busy, int(fired[busy])), (silent[1], 0)]


def test_without_latents_the_page_leaves_out_those_that_never_fire_and_says_when_none_does(folders, tmp_path):
    model, sae_dir, params, sae = folders
    windows = np.array(byte_ids(TEXT)[:64]).reshape(4, 16)
    fired = np.stack([sae.encode(trace(w, params, 4)["blocks.0.out"]) > 0 for w in windows]).sum(axis=(0, 1))
    page = tmp_path / "features.html"
    text = sae_dir.parent / "text.txt"
    result = run_sae("features", "--sae", sae_dir, "--model", model, "--data", text, "--html", page,
                     "--seq-len", 16, "--windows", 4, "--count", 32)
    assert result.returncode == 0, result.stderr
    firing = [int(i) for i in np.argsort(-fired, kind="stable") if fired[i] > 0]
    assert 0 < len(firing) < 32  # some never fire: they are left out, though --count 32 leaves room for them
    assert [latent["id"] for latent in page_of(page)["latents"]] == firing
    quiet = sae_files.new_sae({"architecture": "standard"}, {**sae.params, "b_enc": np.full(32, -1e4, np.float32)},
                              "blocks.0.out")  # every pre-activation far below 0: nothing fires
    sae_files.save_sae(quiet, tmp_path / "quiet")
    result = run_sae("features", "--sae", tmp_path / "quiet", "--model", model, "--data", text, "--html",
                     tmp_path / "none.html", "--seq-len", 16, "--windows", 4)
    assert_one_error_line(result, f"no latent of --sae {tmp_path / 'quiet'} fires anywhere in --data {text}")
    assert not (tmp_path / "none.html").exists()


@pytest.mark.parametrize("step", ["attn.q", "ln_1"])
def test_an_sae_the_logits_do_not_read_gets_its_page_without_the_logit_table(folders, tmp_path, step):
    # a traceback before ("writes nothing the logits read directly"); at attn.q also a broadcast error (heads unmerged)
    model, _, params, _ = folders
    stand_in = random_sae(16, 32, f"blocks.1.{step}", seed=10)
    sae_files.save_sae(stand_in, tmp_path / "sae")
    page = tmp_path / "features.html"
    result = run_sae("features", "--sae", tmp_path / "sae", "--model", model, "--data", folders[1].parent / "text.txt",
                     "--html", page, "--seq-len", 16, "--windows", 2, "--count", 2)
    assert result.returncode == 0, result.stderr
    reason = f"an SAE at blocks.1.{step} writes nothing the logits read directly"
    assert f"no logit table on the page: {reason}" in result.stderr
    data = page_of(page)
    assert data["no_logits"].startswith(reason) and len(data["latents"]) == 2
    assert all(latent["promoted"] is None and latent["contexts"] for latent in data["latents"])


def test_an_sae_of_another_width_is_refused(folders, tmp_path):
    model, _, _, _ = folders
    narrow = random_sae(8, 16, "blocks.0.out")
    sae_files.save_sae(sae_files.new_sae({"architecture": "standard"}, narrow.params, "blocks.0.out"), tmp_path / "s")
    result = run_sae("features", "--sae", tmp_path / "s", "--model", model, "--data", folders[1].parent / "text.txt",
                     "--html", tmp_path / "page.html")
    assert_one_error_line(result, "the SAE reads 8 numbers per position, but the model's blocks.0.out has 16")


# --- A model folder and an SAE folder, mixed up ---


@pytest.mark.parametrize("argv, fragment", [
    # "already holds a training run: add --resume", which then failed on cfg.json
    (["sae", "train", "--model", "{gpt}", "--hook", "blocks.0.out", "--data", "{text}", "--out", "{gpt}"],
     "--out {gpt} is a GPT-2 model folder (model.safetensors, config.json, or OpenAI's checkpoint files), and sae "
     "train writes an SAE folder: give --out a new or empty folder; the run saved there continues with gpt2-numpy "
     "train --resume"),
    # "holds no GPT-2 checkpoint ... download the model there first"
    (["train", "--data", "{text}", "--out", "{sae}", "--resume"],
     "--out {sae} is an SAE folder (cfg.json, sae_weights.safetensors), and train writes a GPT-2 model folder: give "
     "--out a new or empty folder; the run saved there continues with gpt2-numpy sae train --resume"),
    (["generate", "hi", "--model", "{sae}"], "--model {sae} is an SAE folder (cfg.json, sae_weights.safetensors), not "
                                              "a GPT-2 model: pass a model folder or an official size"),
])
def test_a_model_folder_and_an_sae_folder_mixed_up_are_named(folders, tmp_path, argv, fragment):
    model, sae_dir, _, _ = folders
    runs = {"gpt": tmp_path / "my-gpt", "sae": tmp_path / "my-sae"}  # each a training run's folder, as train leaves
    shutil.copytree(model, runs["gpt"])
    shutil.copytree(sae_dir, runs["sae"])
    for run in runs.values():
        (run / "train_state.npz").write_bytes(b"")  # a run's state: only a save writes it
    before = {run: sorted(run.iterdir()) for run in runs.values()}
    names = {**runs, "text": sae_dir.parent / "text.txt"}
    result = run_command(*[arg.format(**names) for arg in argv])
    assert_one_error_line(result, fragment.format(**names))
    assert {run: sorted(run.iterdir()) for run in runs.values()} == before


# --- explain --sae, --sae-ablate, --steer ---


def explain(folders, json_out=False, sae_ablate=None, steer=None, use_sae=True):  # -> what explain_run prints
    _, sae_dir, params, _ = folders
    ids = byte_ids("the cat sat on t")
    args = SimpleNamespace(sae=sae_dir if use_sae else None, sae_ablate=sae_ablate, steer=steer, json=json_out,
                           models_dir=None)
    model = SimpleNamespace(hparams=HPARAMS, params=params, ids=ids, label=lambda t: repr(chr(t)),
                            text_of=lambda t: f"<{t}>")
    return explain_run(args, model), ids


def test_explain_sae_prints_each_position_s_strongest_latents(folders):
    _, _, params, sae = folders
    printed, ids = explain(folders, json_out=True)
    f = sae.encode(trace(ids, params, 4)["blocks.0.out"])
    rows = json.loads(printed)["latents"]
    assert len(rows) == len(ids)
    for row, activations in zip(rows, f):
        expected = [int(i) for i in np.argsort(-activations, kind="stable")[:5] if activations[i] > 0]
        assert [latent["id"] for latent in row["top"]] == expected
        assert [latent["activation"] for latent in row["top"]] == pytest.approx(activations[expected].tolist())
    table, _ = explain(folders)
    first = int(np.argmax(f[3]))
    assert re.search(rf"^\s+3 .*  {first}:{f[3, first]:.3f}", table, re.M)


def test_explain_sae_ablate_and_steer_print_the_loss_and_next_tokens_after(folders):
    _, _, params, sae = folders
    printed, ids = explain(folders, json_out=True, sae_ablate=[4, 11], steer=[(7, 3.0)])
    result = json.loads(printed)
    # by hand: the stream after block 0 less the two latents' share, plus 3 W_dec[7]; then block 1 from model.py
    names = trace(ids, params, 4)
    x = names["blocks.0.out"]
    f = sae.encode(x)
    edited = x - f[:, [4, 11]] @ sae.params["W_dec"][[4, 11]] + 3.0 * sae.params["W_dec"][7]
    from gpt2_numpy.model import block, layer_norm
    logits = layer_norm(block(edited, **params["blocks"][1], n_head=4), **params["ln_f"]) @ params["wte"].T
    assert result["loss"]["before"] == pytest.approx(next_token_loss(names["logits"], ids), rel=1e-5)
    assert result["loss"]["after"] == pytest.approx(
        float(-np.mean(log_softmax(logits[:-1])[np.arange(len(ids) - 1), ids[1:]])), rel=1e-4)
    probabilities = softmax(logits[-1])
    top = np.argsort(-probabilities)[:5]
    assert [row["id"] for row in result["next_token"]["after"]] == top.tolist()
    assert [row["prob"] for row in result["next_token"]["after"]] == pytest.approx(probabilities[top].tolist(),
                                                                                    rel=1e-4)
    assert result["ablated"] == [4, 11] and result["steered"] == [[7, 3.0]]
    table, _ = explain(folders, sae_ablate=[4, 11], steer=[(7, 3.0)])
    assert "latents 4, 11 taken out; latent 7 steered by +3" in table
    assert f"{result['loss']['before']:.4f} before, {result['loss']['after']:.4f} after" in table


@pytest.mark.parametrize("kwargs, fragment", [
    ({"sae_ablate": [32]}, "--sae-ablate 32 is out of range: this SAE has 32 latents"),
    ({"steer": [(40, 1.0)]}, "--steer 40 is out of range"),
    ({"sae_ablate": [1], "use_sae": False}, "--sae-ablate edits an SAE's latents: add --sae DIR"),
    # taking latent 4 out twice subtracted it twice, under a header saying "latents 4, 4 taken out"
    ({"sae_ablate": [4, 9, 4]}, "--sae-ablate names latent 4 more than once: give each latent once"),
    ({"sae_ablate": [0, 0]}, "--sae-ablate names latent 0 more than once"),  # latent 0: no truth test of the id
    ({"steer": [(3, 1.0), (3, 2.0)]}, "--steer names latent 3 more than once"),
    # finite, but 1e300 is beyond float32: the edit would write infinities, reported as NaN weights
    ({"steer": [(5, 1e300)]}, "--steer 5:1e+300 overflows: the scale times the row's norm"),
    ({"steer": [(5, -1e39)]}, "--steer 5:-1e+39 overflows"),
])
def test_explain_refuses_a_latent_out_of_range_and_an_edit_without_an_sae(folders, kwargs, fragment):
    with pytest.raises(UsageError, match=re.escape(fragment)):
        explain(folders, **kwargs)


def test_a_steer_whose_row_overflows_float32_is_refused_though_its_scale_fits(folders):
    _, _, _, sae = folders
    norms = np.linalg.norm(sae.params["W_dec"].astype(np.float64), axis=-1)
    latent = int(np.argmax(norms))
    assert norms[latent] > 1.01
    scale = float(np.finfo(np.float32).max) / 1.005  # below float32's largest; times the row's norm, above
    with pytest.raises(UsageError, match=f"--steer {latent}:.* overflows: the scale times the row's norm"):
        explain(folders, steer=[(latent, scale)])
    explain(folders, steer=[(latent, 1e3)])  # a large scale that fits is taken


@pytest.mark.parametrize("text", ["1_0:2", "5:1_0", "5:inf", "5:-inf", "5:1e999", "5:nan", "-1:2", "5", "x:1", ":1"])
def test_steer_refuses_what_is_not_a_latent_id_and_a_finite_scale(text):
    # int() and float() take "1_0" for 10, and float() takes "1e999" for infinity
    with pytest.raises(argparse.ArgumentTypeError, match="is not F:SCALE"):
        steer_pair(text)
    assert steer_pair("12:-4.5") == (12, -4.5) and steer_pair("0:1e30") == (0, 1e30)


def test_the_demo_s_labelled_windows_mark_each_copy_of_each_pair():
    from scripts.demo.sae_induction import FIRST, SECOND, labelled_windows

    windows, labels = labelled_windows(50, 32, seed=3)
    assert windows.shape == labels.shape == (50, 32)
    for window, marks in zip(windows, labels):
        window.tobytes().decode("utf-8")  # whole characters: a byte-level model's tokenizer takes it as it is
        runs = [(mark, window[i:j].tobytes()) for mark, i, j in runs_of(marks) if mark in (FIRST, SECOND)]
        assert [mark for mark, _ in runs] == [FIRST, SECOND] * (len(runs) // 2) and runs
        assert all(first == second for (_, first), (_, second) in zip(runs[::2], runs[1::2]))


def runs_of(marks):  # -> [(mark, start, stop)] of the runs of equal marks
    edges = [0, *np.flatnonzero(np.diff(marks)) + 1, len(marks)]
    return [(marks[i], i, j) for i, j in zip(edges[:-1], edges[1:])]
