"""gpt2_numpy.explain's walkthrough and plot: the attention weights against Hugging Face's
(scripts/fixtures/make_explain_reference.py), the walkthrough against the textbook model and against math, the printed
text against the arrays, and the command line end to end on the tiny TF checkpoint with the official tokenizer. The
trace, the lens and the page have tests of their own (unit/test_tracing.py, unit/test_page.py)."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import pytest

from gpt2_numpy import model
from gpt2_numpy.errors import UsageError
from gpt2_numpy.explain import attention_weights, report, token_label, walkthrough
from gpt2_numpy.commands import common, explain as explain_cli
from gpt2_numpy.interpret import plot, stepwise as explain
from gpt2_numpy.commands.explain import run
from gpt2_numpy.interpret.plot import attention_figure
from gpt2_numpy.model import block, gpt2
from gpt2_numpy.params import random_params
from gpt2_numpy.tokenizer import load_tokenizer
from tests.conftest import FIXTURES, REPO, assert_one_error_line, byte_model_dir, run_explain, tiny_models_dir
from tests.cli.test_tokenizer import read_only_file_system

CONFIGS = json.loads((FIXTURES / "configs.json").read_text())
HF_TOLERANCE = 1e-5  # max |weights - HF's| in float32; measured 1.3e-6 (tiny) and 1.1e-6 (odd_heads)
LAYER, HEAD = 1, 2  # not the first block nor the first head: an index mix-up shows
PROMPT = "I will go to the"  # [40, 481, 467, 284, 262]: every id fits the tiny model's 512-token vocabulary
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def load(name):  # -> hparams, params, HF's attention weights and the ids they belong to
    config = CONFIGS[name]
    return config["hparams"], random_params(config["hparams"], config["seed"]), np.load(
        FIXTURES / f"reference_attention_{name}.npz")


def fake_label(token_id):  # a token's label for report(), without the tokenizer files
    return f"<{token_id}>"


@pytest.fixture(scope="module")
def tiny():
    return load("tiny")


@pytest.fixture(scope="module")
def steps(tiny):  # walkthrough of the tiny model on the reference's 40 tokens, showing block LAYER
    hparams, params, reference = tiny
    return walkthrough(reference["inputs"], params, hparams["n_head"], LAYER)


@pytest.fixture(scope="module")
def printed(tiny, steps):  # report() of those steps for head HEAD
    hparams, _, reference = tiny
    return report("a prompt", reference["inputs"].tolist(), fake_label, steps, hparams, LAYER, HEAD)


def head_slices(steps, params, n_head, head):  # -> q, k, v of one head, cut from c_attn's columns, in float64
    c_attn = params["blocks"][LAYER]["attn"]["c_attn"]
    c_attn = steps["ln_1"].astype(np.float64) @ c_attn["w"] + c_attn["b"]  # [n_seq, 3 n_embd]: q, k, v side by side
    n_embd = c_attn.shape[-1] // 3
    d_head = n_embd // n_head
    return [c_attn[:, part * n_embd + head * d_head : part * n_embd + (head + 1) * d_head].astype(np.float64)
            for part in range(3)]


# --- The arrays ---


@pytest.mark.parametrize("name", ["tiny", "odd_heads"])
def test_attention_weights_match_hugging_face(name):
    hparams, params, reference = load(name)
    weights = attention_weights(reference["inputs"], params, hparams["n_head"])
    n_seq = len(reference["inputs"])
    assert weights.shape == (hparams["n_layer"], hparams["n_head"], n_seq, n_seq)
    assert weights.dtype == np.float32
    assert np.abs(weights - reference["weights"]).max() <= HF_TOLERANCE


def test_the_walkthrough_logits_are_gpt2s(tiny, steps):
    hparams, params, reference = tiny
    np.testing.assert_array_equal(steps["logits"], gpt2(reference["inputs"], **params, n_head=hparams["n_head"]))


def test_the_walkthrough_shows_the_chosen_layer_as_the_model_runs_it(tiny, steps):
    hparams, params, reference = tiny
    ids = reference["inputs"]
    np.testing.assert_array_equal(steps["embed"], params["wte"][ids] + params["wpe"][: len(ids)])
    layer_input = steps["embed"]
    for block_params in params["blocks"][:LAYER]:
        layer_input = block(layer_input, **block_params, n_head=hparams["n_head"])
    np.testing.assert_array_equal(steps["x"], layer_input)
    assert np.abs(steps["attn.weights"] - reference["weights"][LAYER]).max() <= HF_TOLERANCE
    # the composed steps end where model.block does, bit for bit: the same functions in the same order
    np.testing.assert_array_equal(steps["out"], block(steps["x"], **params["blocks"][LAYER], n_head=hparams["n_head"]))


@pytest.mark.parametrize("layer", [-1, 2])
def test_the_walkthrough_refuses_a_layer_the_model_lacks(tiny, layer):
    hparams, params, reference = tiny  # -1 would otherwise show the last block with the model's output as its input
    with pytest.raises(UsageError, match=f"layer {layer} is out of range: this model has 2 layers, numbered 0 to 1"):
        walkthrough(reference["inputs"], params, hparams["n_head"], layer)


def test_scores_are_q_dot_k_then_scaled_then_masked(tiny, steps):
    hparams, params, _ = tiny
    n_head, n_seq = hparams["n_head"], len(steps["mask"])
    d_head = hparams["n_embd"] // n_head
    future = np.triu(np.ones((n_seq, n_seq), bool), 1)
    np.testing.assert_array_equal(steps["mask"], np.where(future, -np.inf, 0))
    for head in range(n_head):
        q, k, _ = head_slices(steps, params, n_head, head)
        np.testing.assert_allclose(steps["qk"][head], q @ k.T, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(steps["attn.scores"][head], q @ k.T / np.sqrt(d_head), rtol=1e-5, atol=1e-5)
    assert np.all(np.isneginf(steps["masked"][:, future]))
    np.testing.assert_array_equal(steps["masked"][:, ~future], steps["attn.scores"][:, ~future])


def test_weights_rows_sum_to_one_and_the_future_gets_exactly_zero(steps):
    n_seq = len(steps["mask"])
    assert steps["attn.weights"].dtype == np.float32
    np.testing.assert_allclose(steps["attn.weights"].sum(-1), 1, atol=1e-6)
    assert np.all(steps["attn.weights"][:, np.triu(np.ones((n_seq, n_seq), bool), 1)] == 0)
    masked = steps["masked"].astype(np.float64)
    exp = np.exp(masked - masked.max(-1, keepdims=True))
    np.testing.assert_allclose(steps["attn.weights"], exp / exp.sum(-1, keepdims=True), atol=1e-6)


def test_each_head_outputs_its_weights_times_its_values(tiny, steps):
    hparams, params, reference = tiny
    n_head = hparams["n_head"]
    d_head = hparams["n_embd"] // n_head
    for head in range(n_head):
        _, _, v = head_slices(steps, params, n_head, head)
        expected = reference["weights"][LAYER, head].astype(np.float64) @ v  # HF's weights, our values
        assert np.abs(steps["attn.z"][head] - expected).max() <= 1e-4
        np.testing.assert_array_equal(steps["merged"][:, head * d_head : (head + 1) * d_head], steps["attn.z"][head])


# --- The printed walkthrough ---


def section(text, number):  # -> the lines of section `number` ("1." ... "4.")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{number}. "))
    end = next((i for i, line in enumerate(lines) if line.startswith(f"{number + 1}. ")), len(lines))
    return "\n".join(lines[start:end]).rstrip().splitlines()  # without the blank line between sections


def printed_matrix(text, title):  # -> (float [n_rows, n_cols] of the matrix printed under `title`, raw cells)
    lines = section(text, 3)
    start = next(i for i, line in enumerate(lines) if title in line) + 2  # the title, then the column labels
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(line[2 + 4 + explain.LABEL_WIDTH :].split())  # after the position and the token's label
    return np.array(rows, dtype=np.float64), rows


def rounding(digits):  # -> the largest difference between a value and its printed form with `digits` decimals
    return 0.5 * 10.0**-digits + 1e-6


def test_report_prints_every_section_in_order(printed):
    titles = [line for line in printed.splitlines() if line[:2] in ("1.", "2.", "3.", "4.")]
    assert [title[:2] for title in titles] == ["1.", "2.", "3.", "4."]
    assert "Tokens" in titles[0] and "Shape flow" in titles[1] and f"layer {LAYER}, head {HEAD}" in titles[2]
    assert "prediction" in titles[3]
    assert "Dropout: none" in printed


def test_tokens_are_listed_with_their_positions_and_ids(printed, tiny):
    _, _, reference = tiny
    rows = [line.split() for line in section(printed, 1)[2:]]
    assert rows == [[str(position), str(token_id), fake_label(token_id)]
                    for position, token_id in enumerate(reference["inputs"])]


def test_the_shape_flow_follows_the_model_with_its_function_names(printed, tiny):
    hparams, _, reference = tiny
    n, n_embd, n_head, n_vocab = len(reference["inputs"]), hparams["n_embd"], hparams["n_head"], hparams["n_vocab"]
    d_head = n_embd // n_head
    rows = [line for line in section(printed, 2)[2:] if not line.startswith("  --")]
    flow = [(line[2:20].strip(), line[21:51].strip(), line[52:70].strip()) for line in rows]
    # model.py: gpt2 embeds; mha is linear, np.split, split_heads, attention (attention_scores, softmax), merge_heads,
    # linear; block adds; ffn is linear, gelu, linear; gpt2 loops over the blocks and ends in ln_f and wte.T
    expected = [
        ("gpt2", f"[{n}, {n_embd}]"), ("gpt2", f"[{n}, {n_embd}]"), ("gpt2", f"[{n}, {n_embd}]"),
        ("causal_mask", f"[{n}, {n}]"),
        ("layer_norm", f"[{n}, {n_embd}]"), ("linear", f"[{n}, {3 * n_embd}]"),
        ("mha", f"3 × [{n}, {n_embd}]"), ("split_heads", f"3 × [{n_head}, {n}, {d_head}]"),
        ("attention_scores", f"[{n_head}, {n}, {n}]"), ("softmax", f"[{n_head}, {n}, {n}]"),
        ("attention", f"[{n_head}, {n}, {d_head}]"), ("merge_heads", f"[{n}, {n_embd}]"),
        ("linear", f"[{n}, {n_embd}]"), ("block", f"[{n}, {n_embd}]"),
        ("layer_norm", f"[{n}, {n_embd}]"), ("linear", f"[{n}, {4 * n_embd}]"), ("gelu", f"[{n}, {4 * n_embd}]"),
        ("linear", f"[{n}, {n_embd}]"), ("block", f"[{n}, {n_embd}]"),
        ("gpt2", f"[{n}, {n_embd}]"), ("layer_norm", f"[{n}, {n_embd}]"), ("gpt2", f"[{n}, {n_vocab}]"),
    ]
    assert [(function, step_shape) for function, _, step_shape in flow] == expected
    # each is a function of the textbook model.py, so one search in the file the reader has open finds it
    assert all(callable(getattr(model, function)) for function, _, _ in flow)
    assert flow[-3][1] == f"for block in blocks: × {hparams['n_layer']}"


def test_the_printed_matrices_are_the_head_s_arrays(printed, steps, tiny):
    hparams, params, reference = tiny
    shown = explain.SHOWN
    corner = (slice(0, shown), slice(0, shown))
    for title, array, digits in [("q·kᵀ", steps["qk"][HEAD], 2),
                                 ("attention_scores(q, k)", steps["attn.scores"][HEAD], 2),
                                 ("causal_mask:", steps["mask"], 0), ("masked scores", steps["masked"][HEAD], 2)]:
        values, _ = printed_matrix(printed, title)
        assert values.shape == (shown, shown)
        np.testing.assert_array_equal(np.isneginf(values), np.isneginf(array[corner]))
        finite = np.isfinite(values)
        assert np.abs(values[finite] - array[corner][finite]).max() <= rounding(digits), title
    values, cells = printed_matrix(printed, "softmax(masked scores)")
    hf_weights = reference["weights"][LAYER, HEAD]
    assert np.abs(values[:, :shown] - hf_weights[corner]).max() <= rounding(3) + HF_TOLERANCE
    assert np.abs(values[:, shown] - 1).max() <= rounding(4)  # the row sums
    assert all(cells[i][j] == "0" for i in range(shown) for j in range(i + 1, shown))  # exactly 0, not rounded
    values, _ = printed_matrix(printed, "attention(q, k, v, mask)")
    _, _, v = head_slices(steps, params, hparams["n_head"], HEAD)
    assert np.abs(values - (hf_weights.astype(np.float64) @ v)[:shown, :shown]).max() <= rounding(3) + 1e-4


def test_a_long_prompt_prints_a_corner_and_says_so_and_a_short_one_all_of_it(printed, tiny):
    hparams, params, reference = tiny
    assert f"showing the first {explain.SHOWN} of {len(reference['inputs'])} positions" in printed
    ids = reference["inputs"][:5].tolist()
    short = report("a prompt", ids, fake_label, walkthrough(ids, params, hparams["n_head"], 0), hparams, 0, 0)
    assert "showing the first" not in short
    shown = explain.SHOWN  # the head's output shows that many of its 16 dims, whatever the prompt's length
    columns = {"q·kᵀ": (shown, 5), "causal_mask:": (shown, 5), "softmax(masked scores)": (shown + 1, 6),
               "attention(q, k, v, mask)": (shown, shown)}  # the weights add a column of row sums
    for title, (long_columns, short_columns) in columns.items():
        assert printed_matrix(printed, title)[0].shape == (shown, long_columns), title
        assert printed_matrix(short, title)[0].shape == (5, short_columns), title


def test_the_prediction_is_hugging_face_s_top_5(printed, tiny):
    _, _, reference = tiny
    hf_logits = np.load(FIXTURES / "reference_tiny.npz")["logits"][len(reference["inputs"]) - 1]  # the same tokens
    probabilities = np.exp(hf_logits - hf_logits.max()) / np.exp(hf_logits - hf_logits.max()).sum()
    rows = [line.split() for line in section(printed, 4)[2:]]
    assert [int(row[1]) for row in rows] == np.argsort(-probabilities)[:5].tolist()
    assert [row[2] for row in rows] == [fake_label(int(row[1])) for row in rows]
    np.testing.assert_allclose([float(row[-1]) for row in rows], np.sort(probabilities)[::-1][:5], atol=1e-4)


def test_token_labels_show_whitespace_and_bytes_and_are_cut_to_width():
    tokenizer = load_tokenizer()
    assert token_label(tokenizer, 481) == "' will'"
    assert token_label(tokenizer, 198) == "'\\n'"  # a newline shows as \n, not as a line break
    assert token_label(tokenizer, 50256) == "'<|endoftext|>'"
    byte_e2 = next(i for i in range(tokenizer.n_vocab) if tokenizer.token_bytes(i) == b"\xe2")
    assert token_label(tokenizer, byte_e2) == "b'\\xe2'"  # the start of a character: its bytes, not U+FFFD
    long_id = next(i for i in range(tokenizer.n_vocab) if len(tokenizer.token_bytes(i)) > 20)
    text = tokenizer.token_bytes(long_id).decode()
    assert token_label(tokenizer, long_id) == repr(text)[: explain.LABEL_WIDTH - 2] + "…" + repr(text)[-1]


def test_an_empty_prompt_explains_from_endoftext(monkeypatch, capsys):
    tokenizer = load_tokenizer()
    hparams = {"n_vocab": tokenizer.n_vocab, "n_ctx": 8, "n_embd": 16, "n_head": 2, "n_layer": 1}
    monkeypatch.setattr(explain_cli, "model_from_args", lambda args: (hparams, random_params(hparams, 0), tokenizer))
    assert run([""]) == 0
    tokens = section(capsys.readouterr().out, 1)
    assert "<|endoftext|>" in tokens[0]
    assert tokens[2:] == ["         0   50256  '<|endoftext|>'"]


# --- The picture ---


@pytest.mark.slow
def test_the_figure_draws_each_head_with_the_future_left_empty(steps):
    n_head, n_seq = steps["attn.weights"].shape[:2]
    labels = [fake_label(i) for i in range(n_seq)]
    future = np.triu(np.ones((n_seq, n_seq), bool), 1)
    figure = attention_figure(steps["attn.weights"], list(range(n_head)), labels, "title")
    maps = [ax for ax in figure.axes if ax.images and ax.get_title().startswith("head ")]
    assert [ax.get_title() for ax in maps] == [f"head {head}" for head in range(n_head)]
    for head, ax in enumerate(maps):
        image = ax.images[0]
        np.testing.assert_array_equal(np.ma.getmaskarray(image.get_array()), future)  # drawn as nothing
        np.testing.assert_array_equal(image.get_array().data[~future], steps["attn.weights"][head][~future])
        assert image.cmap.get_bad()[3] == 0  # masked cells are transparent
    assert [label.get_text() for label in maps[0].get_yticklabels()] == labels


@pytest.mark.slow
def test_head_all_plots_every_head_of_the_layer_and_prints_head_0(tiny, monkeypatch, capsys, tmp_path):
    hparams, params, _ = tiny
    tokenizer = load_tokenizer()
    monkeypatch.setattr(explain_cli, "model_from_args", lambda args: (hparams, params, tokenizer))
    figures = []
    monkeypatch.setattr(explain_cli, "save_figure", lambda figure, path: (figures.append((figure, path)),
                                                                          path.write_bytes(b"a picture")))
    assert run([PROMPT, "--layer", "1", "--head", "all", "--plot", str(tmp_path / "a.png"), "--walkthrough"]) == 0
    assert "layer 1, head 0" in section(capsys.readouterr().out, 3)[0]
    (figure, path), = figures
    assert path == tmp_path / "a.png"
    maps = [ax for ax in figure.axes if ax.images and ax.get_title().startswith("head ")]
    expected = attention_weights(tokenizer.encode(PROMPT), params, hparams["n_head"])[1]
    assert len(maps) == hparams["n_head"]
    for ax, head_weights in zip(maps, expected):
        np.testing.assert_allclose(ax.images[0].get_array().filled(0), head_weights, atol=1e-6)


class FailingFigure:  # a figure whose saving fails midway, as on a full disk
    def savefig(self, file, **options):
        file.write(b"\x89PNG half of it")
        raise OSError(28, "No space left on device")


def test_a_failed_save_leaves_no_file_behind(tmp_path):
    target = tmp_path / "a.png"
    target.write_bytes(b"an earlier picture")
    with pytest.raises(UsageError, match=f"cannot write the plot {target}: No space left on device"):
        common.save_figure(FailingFigure(), target)
    assert target.read_bytes() == b"an earlier picture"  # the old file stays whole
    assert [path.name for path in tmp_path.iterdir()] == ["a.png"]  # and no part of the new one is left


# --- The command line ---


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):  # -> a models dir whose 124M/ holds the tiny TF checkpoint and the official tokenizer
    return tiny_models_dir(tmp_path_factory.mktemp("explain"))




@pytest.mark.slow
def test_the_command_prints_every_section_for_the_chosen_head(models_dir):
    result = run_explain(PROMPT, "--layer", "1", "--head", "3", models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    tokens = [line.split() for line in section(result.stdout, 1)[2:]]
    assert [int(row[1]) for row in tokens] == [40, 481, 467, 284, 262]
    assert [row[2:] for row in tokens] == [["'I'"], ["'", "will'"], ["'", "go'"], ["'", "to'"], ["'", "the'"]]
    assert "· @ wte.T" in "\n".join(section(result.stdout, 2))
    assert "layer 1, head 3" in section(result.stdout, 3)[0]
    hparams, params = CONFIGS["tiny"]["hparams"], random_params(CONFIGS["tiny"]["hparams"], CONFIGS["tiny"]["seed"])
    expected = attention_weights([40, 481, 467, 284, 262], params, hparams["n_head"])[1, 3]
    values, _ = printed_matrix(result.stdout, "softmax(masked scores)")
    assert np.abs(values[:, :5] - expected).max() <= rounding(3)
    hf_next = np.load(FIXTURES / "reference_tiny.npz")["cli_greedy_ids"][0]  # HF's greedy choice after the prompt
    assert int(section(result.stdout, 4)[2].split()[1]) == hf_next


def png_size(data):  # -> (width, height) from the IHDR chunk, which a PNG starts with
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
def test_plot_writes_a_png_of_every_head_and_an_svg_of_one(models_dir, tmp_path):
    import matplotlib.image

    png, svg = tmp_path / "heads.png", tmp_path / "head.svg"
    result = run_explain(PROMPT, "--head", "all", "--plot", str(png), "--walkthrough", models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    assert "layer 0, head 0" in section(result.stdout, 3)[0]  # all heads plotted, head 0 printed
    data = png.read_bytes()
    width, height = png_size(data)
    assert width >= 400 and height >= 300 and len(data) < 200_000
    pixels = matplotlib.image.imread(png)
    assert pixels.shape[:2] == (height, width)
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 10  # a picture, not one colour
    result = run_explain(PROMPT, "--layer", "1", "--head", "2", "--plot", str(svg), models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    root = ElementTree.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.find(".//{http://www.w3.org/2000/svg}image") is not None  # the heatmap
    assert sorted(path.name for path in tmp_path.iterdir()) == ["head.svg", "heads.png"]  # no temporary file left


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--layer", "2"], "--layer 2 is out of range: this model has 2 layers, numbered 0 to 1"),
        (["--layer", "-1"], "--layer -1 is out of range: this model has 2 layers, numbered 0 to 1"),
        (["--head", "4"], "--head 4 is out of range: this model has 4 heads per layer, numbered 0 to 3"),
        (["--head", "-1"], "--head -1 is out of range: this model has 4 heads per layer, numbered 0 to 3"),
        (["--head", "first"], "argument --head: invalid head number or 'all' value: 'first'"),
        (["--plot", "{tmp}/no/such/folder/a.png"], "the folder {tmp}/no/such/folder does not exist"),
        (["--plot", "{tmp}/a.jpg"], "the file name must end in .png or .svg (got '.jpg')"),
        (["--plot", "{tmp}/a"], "the file name must end in .png or .svg (got no suffix)"),
        (["--plot", "{tmp}"], "is a folder: name a .png or .svg file"),
    ],
)
def test_bad_arguments_are_one_error_line_with_exit_2(models_dir, tmp_path, args, fragment):
    args = [arg.format(tmp=tmp_path) for arg in args]
    assert_one_error_line(run_explain(PROMPT, *args, models_dir=models_dir), fragment.format(tmp=tmp_path))
    assert list(tmp_path.iterdir()) == []  # no plot, not even a part of one


@pytest.mark.slow
@pytest.mark.parametrize("args, fragment", [
    (["--layer", "12"], "--layer 12 is out of range: this model has 12 layers, numbered 0 to 11"),
    (["--head", "12"], "--head 12 is out of range: this model has 12 heads per layer, numbered 0 to 11"),
])
def test_a_layer_or_head_beyond_an_official_size_is_refused_before_its_download(args, fragment, tmp_path):
    empty = tmp_path / "models"  # 124M is not there: the check must not wait for a download (here: unreachable)
    assert_one_error_line(run_explain(PROMPT, *args, models_dir=empty), fragment)
    assert not empty.exists()


@pytest.mark.slow
def test_a_prompt_longer_than_the_context_is_one_error_line(models_dir):
    assert_one_error_line(run_explain(" the" * 65, models_dir=models_dir),
                          "the prompt's 65 tokens exceed the model's context of 64 tokens: shorten it")


@pytest.mark.slow
def test_a_prompt_that_fills_the_context_exactly_is_explained(models_dir):
    result = run_explain(" the" * 64, models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    assert "1. Tokens: the prompt is 64 tokens" in result.stdout


HIDE_MATPLOTLIB = """
import importlib.abc, sys

class Hide(importlib.abc.MetaPathFinder):  # as if matplotlib were not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "matplotlib":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Hide())
from gpt2_numpy.commands.explain import main
main(sys.argv[1:])
"""


@pytest.mark.slow
def test_without_matplotlib_plot_names_the_install_command_and_the_rest_works(models_dir, tmp_path):
    result = run_explain(PROMPT, "--plot", str(tmp_path / "a.png"), models_dir=models_dir, code=HIDE_MATPLOTLIB)
    assert_one_error_line(result, '--plot needs matplotlib, an optional extra: pip install -e ".[plot]"')
    assert list(tmp_path.iterdir()) == []
    result = run_explain(PROMPT, models_dir=models_dir, code=HIDE_MATPLOTLIB)
    assert result.returncode == 0 and "4. The prediction" in result.stdout


def test_installed_without_its_clone_plot_names_an_install_that_works_there(models_dir, tmp_path, monkeypatch):
    # from a wheel, `pip install -e ".[plot]"` names a folder that is not there: matplotlib itself is the install
    site = tmp_path / "site-packages"
    shutil.copytree(REPO / "gpt2_numpy", site / "gpt2_numpy", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(site), "GPT2_NUMPY_BASE_URL": "http://127.0.0.1:9"}
    result = subprocess.run([sys.executable, "-c", HIDE_MATPLOTLIB, PROMPT, "--plot", str(tmp_path / "a.png"),
                             "--models-dir", str(models_dir)], capture_output=True, text=True, env=env, cwd=tmp_path,
                            timeout=120)
    assert_one_error_line(result, "--plot needs matplotlib, an optional extra: pip install matplotlib")
    # in the clone, from another folder: the extra of the clone, by its path
    assert plot.plot_install() in ('pip install -e ".[plot]"', f'pip install -e "{REPO}[plot]"')
    monkeypatch.chdir(tmp_path)
    assert plot.plot_install() == f'pip install -e "{REPO}[plot]"'


# --- Issue 20: plots of any prompt, any valid name, and folders this user may not use ---


@pytest.mark.slow
def test_a_prompt_with_dollar_signs_plots(monkeypatch, tmp_path):
    # matplotlib reads a label with two "$" as mathtext: '$$' failed to draw, "$x$" would show an italic x
    tokenizer = load_tokenizer()
    hparams = {"n_vocab": tokenizer.n_vocab, "n_ctx": 16, "n_embd": 16, "n_head": 2, "n_layer": 1}
    monkeypatch.setattr(explain_cli, "model_from_args", lambda args: (hparams, random_params(hparams, 0), tokenizer))
    prompt = "It costs $$5 or $x$ or a$b"
    assert any("$$" in tokenizer.decode([token_id]) for token_id in tokenizer.encode(prompt))  # one token: '$$'
    target = tmp_path / "dollars.png"
    assert run([prompt, "--plot", str(target)]) == 0
    assert png_size(target.read_bytes())[0] >= 400
    figure = attention_figure(np.eye(3, dtype=np.float32)[None], [0], ["'$$'", "'$x$'", "'a$b'"], "title")
    figure.canvas.draw()
    # as drawn: (text, is it mathtext?), the dollars shown as typed
    shown = [label._preprocess_math(label.get_text()) for label in figure.axes[0].get_yticklabels()]
    assert shown == [("'$$'", False), ("'$x$'", False), ("'a$b'", False)]


@pytest.mark.slow
def test_a_long_file_name_that_the_folder_allows_is_written(models_dir, tmp_path):
    target = tmp_path / ("a" * 250 + ".png")  # 254 bytes: a valid name, with no room for a longer temporary one
    result = run_explain(PROMPT, "--plot", str(target), models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    assert png_size(target.read_bytes())[0] >= 400
    assert [path.name for path in tmp_path.iterdir()] == [target.name]  # no temporary file left


@pytest.fixture
def public_dir():  # -> a folder every user may enter (pytest's tmp_path is root's alone), removed afterwards
    folder = Path(tempfile.mkdtemp(prefix="gpt2-numpy-explain-"))
    folder.chmod(0o755)
    yield folder
    for path in folder.iterdir():
        path.chmod(0o755)
    shutil.rmtree(folder)


# explain's main as an unprivileged user: CI runs as root, whom permissions do not stop, so the child drops to nobody
# (65534) first, as setpriv does. It starts as this user and loads what it needs before the drop: nobody cannot read
# packages installed under /root, as here. A new Python, not a fork of pytest's, which has threads (OpenBLAS's).
AS_NOBODY = """
import os, sys
import matplotlib  # nobody may not be allowed to read its files
from gpt2_numpy.commands import explain
from gpt2_numpy.commands.common import package_version
package_version()  # so is the metadata reader every parser's --version uses (importlib.metadata's email.parser)
if os.geteuid() == 0:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
explain.main(sys.argv[1:])
"""


def run_as_nobody(argv, folder):  # -> (exit status, stdout, stderr) of explain's main run as an unprivileged user
    result = subprocess.run([sys.executable, "-c", AS_NOBODY, *argv], cwd=folder, capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    return result.returncode, result.stdout, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("flag, name, mode, fragment", [
    ("--plot", "a.png", 0o000, "cannot read the folder {folder} (Permission denied): fix its permissions"),
    ("--plot", "a.png", 0o555, "cannot write into the folder {folder} (permission denied)"),
    ("--html", "a.html", 0o000, "cannot read the folder {folder} (Permission denied): fix its permissions"),
    ("--html", "a.html", 0o555, "cannot write into the folder {folder} (permission denied)"),
])
def test_a_folder_this_user_may_not_use_is_one_error_line(public_dir, models_dir, flag, name, mode, fragment):
    folder = public_dir / "closed"
    folder.mkdir()
    folder.chmod(mode)
    status, stdout, stderr = run_as_nobody([PROMPT, flag, str(folder / name), "--models-dir", str(models_dir)],
                                           public_dir)
    result = subprocess.CompletedProcess([], status, stdout, stderr)
    assert "Traceback" not in stderr
    assert_one_error_line(result, fragment.format(folder=folder))
    folder.chmod(0o755)
    assert list(folder.iterdir()) == []


# --- Issue 29: a NaN model, what a command that writes a file prints, progress ---

BYTES = {"n_vocab": 257, "n_ctx": 128, "n_embd": 32, "n_head": 4, "n_layer": 2}  # a model with a vocabulary of its own


@pytest.mark.slow
@pytest.mark.parametrize("args", [[], ["--lens"], ["--heads"], ["--heads", "--json"], ["--plot", "{tmp}/a.png"],
                                  ["--html", "{tmp}/a.html"], ["--html", "{tmp}/a.html", "--walkthrough"]])
def test_a_model_with_a_nan_weight_is_one_error_line_in_every_output(tmp_path, args):
    params = random_params(BYTES, 4)
    params["blocks"][0]["mlp"]["c_fc"]["w"][0, 0] = np.nan  # input 0 feeds every position: all that follows is NaN
    model = byte_model_dir(tmp_path / "nan", BYTES, params)
    result = run_explain(PROMPT, "--model", str(model), *[arg.format(tmp=tmp_path) for arg in args],
                         models_dir=tmp_path)
    assert_one_error_line(result, "the model's outputs are NaN or infinite: its weights hold NaN or infinite values")
    assert "Warning" not in result.stderr  # NumPy's warnings about the NaN would only repeat the error
    assert [path.name for path in tmp_path.iterdir()] == ["nan"]  # no picture, no page


@pytest.mark.slow
def test_a_command_that_writes_a_file_prints_only_where_it_went(models_dir, tmp_path):
    for flag, name in [("--html", "page.html"), ("--plot", "heads.png")]:
        target = tmp_path / name
        result = run_explain(PROMPT, flag, str(target), models_dir=models_dir)
        assert result.returncode == 0, result.stderr
        assert result.stdout == ""  # no walkthrough that nobody asked for
        size = target.stat().st_size
        assert size < 1e6 and f"wrote {target} ({round(size / 1e3)} KB)" in result.stderr.splitlines()
    result = run_explain(PROMPT, "--html", str(tmp_path / "page.html"), "--walkthrough", models_dir=models_dir)
    assert [line[:2] for line in result.stdout.splitlines() if line[:2] in ("1.", "2.", "3.", "4.")] == [
        "1.", "2.", "3.", "4."]


def test_the_size_of_a_large_file_is_in_mb(tmp_path):
    path = tmp_path / "page.html"
    path.write_bytes(b"x" * 3_450_000)
    assert explain_cli.file_size(path) == "3.5 MB"
    path.write_bytes(b"x" * 2_400)
    assert explain_cli.file_size(path) == "2 KB"


@pytest.fixture
def byte_model(tmp_path):  # -> a folder holding a model whose vocabulary (257 ids) includes <|endoftext|>
    return byte_model_dir(tmp_path / "bytes", BYTES, random_params(BYTES, 4))


def test_each_stage_shows_a_progress_bar_on_stderr(byte_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(explain_cli, "PROGRESS_DELAY", 0)  # as a long prompt on a large model would
    assert run([PROMPT, "--model", str(byte_model), "--walkthrough", "--lens", "--heads", "--html",
                str(tmp_path / "a.html")]) == 0
    err = capsys.readouterr().err
    n_layer = BYTES["n_layer"]
    for stage, total in [("walkthrough", n_layer + 1), ("logit lens", n_layer + 1), ("head scores", n_layer),
                         ("page", n_layer)]:
        assert re.search(rf"\r{stage}: +0%.* 0/{total} ", err), (stage, err)  # a quick stage shows only its start


def test_a_model_folder_whose_name_is_not_utf_8_is_named_on_the_page_with_a_replacement(tmp_path):
    folder = byte_model_dir(tmp_path / os.fsdecode(b"tiny\xff"), BYTES, random_params(BYTES, 4))
    target = tmp_path / "a.html"
    assert run([PROMPT, "--model", str(folder), "--html", str(target)]) == 0
    data = re.search(r'\{"title": .*\}', target.read_text(encoding="utf-8"))[0]
    n_bytes = len(PROMPT.encode())  # a byte-level vocabulary without merges: one token per byte
    assert json.loads(data)["title"] == f"tiny\ufffd (2 layers of 4 heads, 32 wide) on {n_bytes} tokens"


@pytest.mark.parametrize("flag, name", [("--html", "a.html"), ("--plot", "a.png")])
def test_a_read_only_file_system_is_named_as_such(byte_model, tmp_path, monkeypatch, capsys, flag, name):
    # it was "permission denied: fix its permissions"
    folder = tmp_path / "mounted"
    folder.mkdir()
    read_only_file_system(monkeypatch, folder)
    with pytest.raises(UsageError) as caught:
        run([PROMPT, "--model", str(byte_model), flag, str(folder / name)])
    assert str(caught.value) == (f"{flag} {folder / name}: cannot write into the folder {folder} (read-only file "
                                 "system): its file system is read-only: remount it writable or choose another file")


class FullStream:  # stderr on a full disk
    def write(self, text):
        raise OSError(28, "No space left on device")

    def flush(self):
        raise OSError(28, "No space left on device")


def test_a_full_stderr_loses_the_progress_bars_not_the_run(byte_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(explain_cli, "PROGRESS_DELAY", 0)
    monkeypatch.setattr(sys, "stderr", FullStream())
    target = tmp_path / "a.html"
    assert run([PROMPT, "--model", str(byte_model), "--lens", "--html", str(target)]) == 0
    assert "Logit lens" in capsys.readouterr().out and target.stat().st_size > 0
