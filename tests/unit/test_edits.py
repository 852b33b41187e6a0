"""explain --ablate, --attribute and --patch: edits in a forward pass (interpret/edits.py) against the model's own
functions and against math, and the three techniques on the command line against TransformerLens's hooks
(scripts/fixtures/make_intervene_reference.py: random GPT-2 folders of their own, loaded by TransformerLens's
TransformerBridge); the tables, the picture and every bad input."""
import json
import re

import numpy as np
import pytest

from gpt2_numpy.commands import explain as explain_cli
from gpt2_numpy.interpret.ablation import ablation, ablation_edits, next_token_loss, reference_means, reference_windows
from gpt2_numpy.interpret.attribution import attribution
from gpt2_numpy.interpret import patching as patching_module
from gpt2_numpy.interpret.edits import Edit, resid_pre, run_with_edits
from gpt2_numpy.interpret.patching import patching
from gpt2_numpy.interpret.present import patching_table
from gpt2_numpy.interpret.names import run_names
from gpt2_numpy.interpret.tracing import trace
from gpt2_numpy.model import gpt2, layer_norm, softmax
from gpt2_numpy.params import random_params
from tests.conftest import FIXTURES, assert_one_error_line, official_path, run_explain, tiny_models_dir

RTOL = 1e-4  # relative to TransformerLens's number, as the issue asks
CONFIGS = ["three_heads", "four_heads", "one_layer"]
HPARAMS = {"n_vocab": 300, "n_ctx": 24, "n_embd": 24, "n_head": 3, "n_layer": 2}


def reference(name):  # -> the model folder, the texts, TransformerLens's arrays
    arrays = np.load(FIXTURES / f"reference_intervene_{name}.npz")
    return FIXTURES / f"intervene_{name}", json.loads(str(arrays["texts"])), arrays


def explain_json(capsys, *argv):  # -> the JSON object `explain ARGV --json` prints, run in this process
    assert explain_cli.run([*map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def close(ours, theirs, scale=None):  # within RTOL of TransformerLens's numbers, relative to `scale` (each's own)
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    tolerance = RTOL * (np.abs(theirs) if scale is None else scale)
    assert ours.shape == theirs.shape and np.all(np.abs(ours - theirs) <= tolerance), (ours - theirs, theirs)


@pytest.fixture
def model():  # -> params, token ids: a random model and prompt
    return random_params(HPARAMS, 5), np.random.default_rng(5).integers(0, HPARAMS["n_vocab"], 17)


# --- Edits in a forward pass ---


def test_no_edit_is_trace_and_model_gpt2_bit_for_bit(model):
    params, ids = model
    names = trace(ids, params, 3)
    for edits in ([], [Edit("blocks.1.attn.weights", lambda weights: weights)]):
        edited = run_with_edits(ids, params, 3, edits)
        assert edited.keys() == names.keys()
        assert all(np.array_equal(edited[name], names[name]) for name in names)
    assert np.array_equal(names["logits"], gpt2(ids, **params, n_head=3))


def test_an_edit_of_the_embedding_is_a_model_with_other_position_embeddings(model):
    # everything downstream comes from the edited array: the run equals the model on edited weights
    params, ids = model
    shift = np.random.default_rng(1).standard_normal((len(ids), HPARAMS["n_embd"])).astype(np.float32)
    edited = run_with_edits(ids, params, 3, [Edit("embed", lambda x: x + shift)])
    wpe = params["wpe"].copy()
    wpe[: len(ids)] += shift
    np.testing.assert_allclose(edited["logits"], gpt2(ids, **{**params, "wpe": wpe}, n_head=3), atol=1e-4)


def test_zeroing_every_head_of_a_layer_is_a_model_without_its_attention_weights(model):
    params, ids = model
    edits = [Edit("blocks.0.attn.z", np.zeros_like, head) for head in range(3)]
    blocks = [dict(block) for block in params["blocks"]]
    c_proj = blocks[0]["attn"]["c_proj"]
    blocks[0]["attn"] = {**blocks[0]["attn"], "c_proj": {**c_proj, "w": np.zeros_like(c_proj["w"])}}
    np.testing.assert_allclose(run_with_edits(ids, params, 3, edits)["logits"],
                               gpt2(ids, **{**params, "blocks": blocks}, n_head=3), atol=1e-4)


def test_an_edited_head_s_weights_feed_its_z_and_leave_the_other_heads(model):
    params, ids = model
    uniform = np.tril(np.ones((len(ids), len(ids)), np.float32)) / np.arange(1, len(ids) + 1)[:, None]
    names = trace(ids, params, 3)
    edited = run_with_edits(ids, params, 3, [Edit("blocks.1.attn.weights", lambda weights: uniform, head=2)])
    np.testing.assert_allclose(edited["blocks.1.attn.z"][2], uniform @ names["blocks.1.attn.v"][2], atol=1e-6)
    assert np.array_equal(edited["blocks.1.attn.z"][:2], names["blocks.1.attn.z"][:2])
    assert np.array_equal(edited["blocks.0.out"], names["blocks.0.out"])  # upstream untouched
    assert not np.allclose(edited["logits"], names["logits"])


def test_an_edit_of_no_array_or_of_another_shape_is_refused(model):
    params, ids = model
    with pytest.raises(ValueError, match="blocks.9.attn.z"):
        run_with_edits(ids, params, 3, [Edit("blocks.9.attn.z", np.zeros_like)])
    with pytest.raises(ValueError, match="shape"):
        run_with_edits(ids, params, 3, [Edit("blocks.0.attn.z", lambda z: z[:, :-1], head=0)])


def test_edits_are_checked_before_anything_runs(model):
    # a run that fails on its last edit's name after computing everything costs a long prompt's whole pass
    params, ids = model
    calls = []

    def spy(z):
        calls.append(z.shape)
        return z

    for edits, fragment in (([Edit("blocks.0.attn.z", spy), Edit("blocks.7.out", spy)], "blocks.7.out"),
                            ([Edit("blocks.0.attn.z", spy), Edit("blocks.1.attn.z", spy, head=3)], "head 3"),
                            ([Edit("blocks.0.attn.z", spy), Edit("blocks.1.attn.z", spy, head=-1)], "head -1"),
                            ([Edit("blocks.0.attn.z", spy), Edit("blocks.1.attn.z", spy, head=True)], "head True"),
                            ([Edit("blocks.0.attn.z", spy), Edit("blocks.1.mid", spy, head=0)], "has no heads")):
        with pytest.raises(ValueError, match=fragment):
            run_with_edits(ids, params, 3, edits)
        assert calls == []
    with pytest.raises(ValueError, match="blocks.0.out"):  # made before the run's start
        run_with_edits(trace(ids, params, 3)["blocks.0.out"], params, 3, [Edit("blocks.0.out", spy)], start_at_layer=1)
    with pytest.raises(ValueError, match="ln_2"):
        run_with_edits(ids, params, 3, [], names=["ln_2"])
    for start in (-1, 3, True, 1.0):
        with pytest.raises(ValueError, match="a run starts at block 0 to 2"):
            run_with_edits(trace(ids, params, 3)["blocks.0.out"], params, 3, [], start_at_layer=start)
    with pytest.raises(ValueError, match="takes the residual stream entering it"):
        run_with_edits(ids, params, 3, [], start_at_layer=1)  # token ids where the stream should be


def test_the_names_of_a_run_are_trace_s_in_its_order(model):
    params, ids = model
    assert run_names(2) == list(trace(ids, params, 3))
    assert run_names(2, start_at_layer=1) == [name for name in trace(ids, params, 3) if not name.startswith(
        ("embed", "blocks.0."))]


def test_a_run_started_at_a_layer_is_the_rest_of_the_whole_run(model):
    # TransformerLens's start_at_layer: the stream entering block 1 goes on as the whole run would
    params, ids = model
    names = trace(ids, params, 3)
    rest = run_with_edits(names["blocks.0.out"], params, 3, [], start_at_layer=1)
    assert list(rest) == run_names(2, start_at_layer=1)
    assert all(np.array_equal(rest[name], names[name]) for name in rest)
    # names: only those kept, and the run stops after the last of them (no logits: an edit of them never runs)
    never = Edit("logits", lambda logits: pytest.fail("the run went on past ln_f"))
    kept = run_with_edits(ids, params, 3, [never], names=["ln_f", "blocks.1.attn.z"])
    assert sorted(kept) == ["blocks.1.attn.z", "ln_f"] and np.array_equal(kept["ln_f"], names["ln_f"])


def test_a_run_started_at_n_layer_is_ln_f_of_the_last_block_s_output(model):
    # start_at_layer=n_layer: the stream after the last block, through ln_f alone (the logit lens's last row)
    params, ids = model
    names = trace(ids, params, 3)
    rest = run_with_edits(names["blocks.1.out"], params, 3, [], start_at_layer=2, names=["ln_f"])
    assert list(rest) == ["ln_f"] and np.array_equal(rest["ln_f"], names["ln_f"])
    assert list(run_with_edits(names["blocks.1.out"], params, 3, [], start_at_layer=2)) == ["ln_f.normalized", "ln_f",
                                                                                               "logits"]


def test_a_head_edit_of_a_batch_of_runs_edits_each_run_s_head(model):
    # the head axis is third from the end: a leading batch axis must not be taken for it
    params, ids = model
    other = np.random.default_rng(7).integers(0, HPARAMS["n_vocab"], len(ids))
    streams = np.stack([trace(prompt, params, 3)["blocks.0.out"] for prompt in (ids, other)])
    edit = [Edit("blocks.1.attn.z", np.zeros_like, head=1)]
    batched = run_with_edits(streams, params, 3, edit, start_at_layer=1)["logits"]
    for run, prompt in zip(batched, (ids, other)):
        np.testing.assert_allclose(run, run_with_edits(prompt, params, 3, edit)["logits"], atol=1e-5)


def test_the_library_refuses_indices_numpy_would_wrap(model):
    # -1 was the last token or head; n_vocab or n_head a bare IndexError
    params, ids = model
    for answers in ((-1, 5), (5, HPARAMS["n_vocab"]), (2.0, 5)):
        with pytest.raises(ValueError, match="answer token id .* is out of range"):
            attribution(ids, params, 3, answers)
        with pytest.raises(ValueError, match="answer token id .* is out of range"):
            patching(ids, ids[::-1], params, 3, answers)
    for heads, fragment in (([(0, -1)], "ablated head -1"), ([(-1, 0)], "ablated layer -1"),
                            ([(2, 0)], "ablated layer 2"), ([(0, 3)], "ablated head 3")):
        with pytest.raises(ValueError, match=fragment):
            ablation(ids, params, 3, heads, "zero")
    with pytest.raises(ValueError, match="as long"):
        patching(ids, ids[:-1], params, 3, (3, 7))


def test_a_mean_ablation_lets_no_position_see_a_later_token(model):
    # the mean over the prompt's own positions moved earlier positions' logits when the last token changed
    params, ids = model
    reference = reference_windows(np.random.default_rng(8).integers(0, HPARAMS["n_vocab"], 200), HPARAMS["n_ctx"])
    heads = [(0, 1), (1, 2)]
    changed = ids.copy()
    changed[-1] = (changed[-1] + 1) % HPARAMS["n_vocab"]
    logits = [run_with_edits(prompt, params, 3, ablation_edits(heads, "mean", reference_means(
        reference, params, 3, heads, len(ids), "mean")))["logits"] for prompt in (ids, changed)]
    np.testing.assert_allclose(logits[0][:-1], logits[1][:-1], atol=1e-6)
    assert not np.allclose(logits[0][-1], logits[1][-1])
    # and the mean is the reference's, position by position: the first window alone gives its own z, the whole
    # window's first positions (only those are run)
    alone = reference_means(reference[:1], params, 3, heads, len(ids), "mean")
    np.testing.assert_allclose(alone[1], trace(reference[0], params, 3)["blocks.1.attn.z"][:, :len(ids)], atol=1e-6)


def test_a_mean_ablation_needs_a_reference_as_long_as_the_prompt(model):
    params, ids = model
    with pytest.raises(ValueError, match="reference token ids"):
        ablation(ids, params, 3, [(0, 0)], "mean")
    with pytest.raises(ValueError, match="shorter than the prompt's 17"):
        ablation(ids, params, 3, [(0, 0)], "mean", reference=np.zeros((4, 16), int))
    # one exactly as long is enough: the prompt as its own one window, whose mean is its own z, changes nothing
    same = ablation(ids, params, 3, [(0, 0)], "mean", reference=np.asarray(ids)[None])
    assert same["after"][0] == pytest.approx(same["before"][0], abs=1e-6)
    # windows of the model's context whatever the prompt, or the whole text when it is shorter
    assert reference_windows(np.arange(40), 17).tolist() == [list(range(17)), list(range(17, 34))]
    assert reference_windows(np.arange(16), 17).tolist() == [list(range(16))]
    with pytest.raises(ValueError, match="no token"):
        reference_windows(np.arange(0), 17)


# --- The three techniques, from the math ---


def test_the_attribution_terms_add_up_to_the_logit_difference(model):
    params, ids = model
    for answers in ((3, 7), (250, 1), (0, 299)):
        logits = gpt2(ids, **params, n_head=3)[-1].astype(np.float64)
        logit_diff, terms = attribution(ids, params, 3, answers)
        assert abs(sum(value for _, value in terms) - (logits[answers[0]] - logits[answers[1]])) < 1e-5
        assert abs(logit_diff - (logits[answers[0]] - logits[answers[1]])) < 1e-5


def test_the_attribution_terms_are_each_part_through_the_final_layer_norm(model):
    # one term from its definition: the embedding alone, centred, over the final stream's σ, times g, dotted with d
    params, ids = model
    names = trace(ids, params, 3)
    x = names["blocks.1.out"][-1].astype(np.float64)
    sigma = np.sqrt(x.var() + 1e-5)
    direction = params["wte"][3].astype(np.float64) - params["wte"][7]
    embed = names["embed"][-1].astype(np.float64)
    terms = dict(attribution(ids, params, 3, (3, 7))[1])
    assert terms["embed"] == pytest.approx(params["ln_f"]["g"] * (embed - embed.mean()) / sigma @ direction, rel=1e-6)
    # and the head terms of a layer with the bias term are its attention output, so layer_norm of the sum checks σ
    whole = layer_norm(names["blocks.1.out"][-1], **params["ln_f"]).astype(np.float64) @ direction
    assert sum(terms.values()) == pytest.approx(whole, rel=1e-5)


def test_patching_everything_recovers_one_and_nothing_zero(model):
    params, ids = model
    corrupt = ids.copy()
    corrupt[5] = (corrupt[5] + 1) % HPARAMS["n_vocab"]
    result = patching(ids, corrupt, params, 3, (3, 7))
    # at layer 0 the stream is the embedding: only the changed position matters, and it is everything; a patch that
    # copies in what is already there, or makes the clean run itself, is 0 or 1 exactly (not rounding over a small gap)
    assert result["resid"][0].tolist() == np.eye(len(ids))[5].tolist()
    assert result["resid"][:, :5].tolist() == np.zeros((len(result["resid"]), 5)).tolist()  # before it: the same
    assert np.all(result["heads"][:, :] != 0)
    with pytest.raises(ValueError, match="nothing to recover"):  # a library error, not the command line's
        patching(ids, ids, params, 3, (3, 7))


@pytest.mark.parametrize("batch_positions", [1024, 2 * 17, 1])  # every run of a layer at once, in twos, one by one
def test_patching_from_the_patched_layer_equals_whole_patched_runs(model, monkeypatch, batch_positions):
    # the plain way: each patch a whole run of the corrupt prompt with the edit, every position unembedded
    monkeypatch.setattr(patching_module, "BATCH_POSITIONS", batch_positions)
    params, ids = model
    corrupt = np.random.default_rng(6).integers(0, HPARAMS["n_vocab"], len(ids))
    clean = trace(ids, params, 3)

    def metric(edits):  # -> logit(3) - logit(7) at the last position of the corrupt run with these edits
        logits = run_with_edits(corrupt, params, 3, edits)["logits"]
        return float(logits[-1, 3] - logits[-1, 7])

    def with_row(position, rows):  # -> an edit function: the array with one row from rows
        def replace(array):
            array = array.copy()
            array[position] = rows[position]
            return array
        return replace

    m_clean, m_corrupt = float(clean["logits"][-1, 3] - clean["logits"][-1, 7]), metric([])
    heads = [[metric([Edit(f"blocks.{layer}.attn.z", lambda z, clean_z=clean[f"blocks.{layer}.attn.z"][head]: clean_z,
                           head)]) for head in range(3)] for layer in range(2)]
    resid = [[metric([Edit(resid_pre(layer), with_row(position, clean[resid_pre(layer)]))])
              for position in range(len(ids))] for layer in range(2)]
    result = patching(ids, corrupt, params, 3, (3, 7))
    assert (result["clean"], result["corrupt"]) == pytest.approx((m_clean, m_corrupt), abs=1e-5)
    assert abs(m_clean - m_corrupt) > 0.1  # recoveries not blown up by a small denominator: 1e-5 means something
    for ours, whole in ((result["heads"], heads), (result["resid"], resid)):
        np.testing.assert_allclose(ours, (np.array(whole) - m_corrupt) / (m_clean - m_corrupt), atol=1e-5)


def test_the_loss_is_the_mean_next_token_cross_entropy(model):
    params, ids = model
    logits = gpt2(ids, **params, n_head=3).astype(np.float64)
    expected = np.mean([-np.log(softmax(logits[i])[ids[i + 1]]) for i in range(len(ids) - 1)])
    assert next_token_loss(logits.astype(np.float32), ids) == pytest.approx(expected, rel=1e-5)
    assert np.isnan(next_token_loss(logits[:1], ids[:1]))


# --- On the command line, against TransformerLens ---


@pytest.mark.parametrize("name", CONFIGS)
def test_ablation_matches_transformer_lens(name, capsys, tmp_path):
    # a mean ablation's mean: over windows of another text at each position, from TransformerLens's cache of them
    folder, texts, tl = reference(name)
    (tmp_path / "reference.txt").write_text(texts["reference"], encoding="utf-8")
    for number, (how, heads) in enumerate(texts["ablations"]):
        ablate = [f"{layer}.{head}" for layer, head in heads]
        mean_over = ["--mean-over", tmp_path / "reference.txt"] if how == "mean" else []
        out = explain_json(capsys, texts["clean"], "--model", folder, "--ablate", *ablate, "--ablation", how,
                           *mean_over)
        assert out["prompt_ids"] == tl["clean_ids"].tolist()
        assert out["ablated"] == heads and out["ablation"] == how
        assert out.get("mean_windows") == (int(tl["mean_windows"]) if how == "mean" else None)
        close(out["loss"]["before"], tl["loss_before"])
        close(out["loss"]["after"], tl[f"ablation{number}_loss"])
        for when, key in (("before", "top_{}_before"), ("after", f"ablation{number}_top_{{}}")):
            assert [row["id"] for row in out["next_token"][when]] == tl[key.format("ids")].tolist()
            close([row["prob"] for row in out["next_token"][when]], tl[key.format("probs")])


@pytest.mark.parametrize("name", CONFIGS)
def test_attribution_matches_transformer_lens(name, capsys):
    folder, texts, tl = reference(name)
    out = explain_json(capsys, texts["clean"], "--model", folder, "--attribute", *texts["answers"])
    assert out["prompt_ids"] == tl["clean_ids"].tolist() and out["answer_ids"] == tl["answer_ids"].tolist()
    close(out["logit_diff"], tl["logit_diff"])
    assert [term["name"] for term in out["terms"]] == tl["term_names"].tolist()
    # a term near zero is compared relative to the largest: float32's error is relative to what is summed
    close([term["value"] for term in out["terms"]], tl["terms"], scale=np.abs(tl["terms"]).max())


@pytest.mark.parametrize("name", CONFIGS)
def test_patching_matches_transformer_lens(name, capsys):
    folder, texts, tl = reference(name)
    out = explain_json(capsys, texts["clean"], "--model", folder, "--patch", texts["corrupt"], "--answer",
                       *texts["answers"])
    assert out["clean_ids"] == tl["clean_ids"].tolist() and out["corrupt_ids"] == tl["corrupt_ids"].tolist()
    close(out["clean_logit_diff"], tl["clean_logit_diff"])
    close(out["corrupt_logit_diff"], tl["corrupt_logit_diff"])
    # a recovery is a difference of logit differences over another: relative to 1, the whole recovery
    close(out["heads"], tl["heads"], scale=1)
    close(out["resid"], tl["resid"], scale=1)


# --- Tables, the picture, and bad input ---

FOLDER = FIXTURES / "intervene_four_heads"  # a vocabulary with " the" and " a" as tokens, 3 layers of 4 heads
PROMPT, CORRUPT = "the cat sat on the mat and the cat", "the dog sat on the mat and the cat"


def test_the_tables_print_the_numbers_of_the_json(capsys):
    common = [PROMPT, "--model", str(FOLDER)]
    assert explain_cli.run([*common, "--ablate", "2.3", "--attribute", " the", " a", "--patch", CORRUPT,
                            "--answer", " the", " a"]) == 0
    printed = capsys.readouterr().out
    ablated = explain_json(capsys, *common, "--ablate", "2.3")
    attributed = explain_json(capsys, *common, "--attribute", " the", " a")
    patched = explain_json(capsys, *common, "--patch", CORRUPT, "--answer", " the", " a")
    loss = ablated["loss"]
    assert f"{loss['before']:.4f} before, {loss['after']:.4f} after ({loss['after'] - loss['before']:+.4f})" in printed
    rows = [line.split() for line in printed.splitlines() if line.startswith("  blocks.") or line.startswith("  embed")
            or line.startswith("  ln_f.b")]
    terms = sorted(attributed["terms"], key=lambda term: -abs(term["value"]))  # largest first
    assert [(name, float(value)) for name, value in rows] == [(t["name"], round(t["value"], 4)) for t in terms]
    for layer, recoveries in enumerate(patched["heads"]):
        assert f"{layer:<7}" + "".join(f"{value:8.3f}" for value in recoveries) in printed


def test_patch_plot_draws_a_png(tmp_path, capsys):
    png = tmp_path / "patching.png"
    assert explain_cli.run([PROMPT, "--model", str(FOLDER), "--patch", CORRUPT, "--answer", " the", " a", "--plot",
                            str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in capsys.readouterr().err


def test_the_ablation_heading_says_what_was_done(capsys, tmp_path):
    common = [PROMPT, "--model", str(FOLDER), "--ablate"]
    assert explain_cli.run([*common, "2.3"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == ("Ablation of head 2.3 (layer.head): its attn.z set to zero at "
                                                       "every position")
    (tmp_path / "text.txt").write_text(PROMPT * 7, encoding="utf-8")  # 182 tokens: 4 windows of the context's 40
    mean_over = ["--ablation", "mean", "--mean-over", str(tmp_path / "text.txt")]
    assert explain_cli.run([*common, "2.3", "0.1", *mean_over]) == 0
    assert capsys.readouterr().out.splitlines()[0] == ("Ablation of heads 2.3, 0.1 (layer.head): each head's attn.z "
                                                       "replaced by its mean at each position over 4 windows of the "
                                                       "reference text")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):  # -> a models dir whose 124M/ is the tiny model with GPT-2's own tokenizer
    return tiny_models_dir(tmp_path_factory.mktemp("intervene"))


@pytest.mark.slow
def test_answers_and_the_corrupt_prompt_may_begin_with_a_dash(tiny_models, capsys):
    # the tiny model keeps GPT-2's first 512 tokens: among them "-" and "--", each one token of the official vocabulary
    vocabulary = json.loads(official_path("124M/encoder.json").read_text())
    dashes = [vocabulary["--"], vocabulary["-"]]
    common = ["I will go to the", "--models-dir", tiny_models]
    for attribute in (["--attribute", "--", "-"], ["--attribute=--", "-"]):
        assert explain_json(capsys, *common, *attribute)["answer_ids"] == dashes
    patched = explain_json(capsys, *common, "--patch", "- will go to the", "--answer", "--", "-")
    assert patched["answer_ids"] == dashes and patched["corrupt_ids"][0] == vocabulary["-"]
    assert patched["corrupt_ids"][1:] == patched["clean_ids"][1:]
    # a prompt that begins with '-' still goes last, after "--": here the answers are "-" and "--", then comes "--"
    assert explain_cli.run(["--models-dir", str(tiny_models), "--json", "--attribute", "-", "--", "--", "- will"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_ids"] == [vocabulary["-"], vocabulary["\u0120will"]]


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["--ablate", "1.0", "--layer", "1"], ["--lens", "--layer", "0"], ["--attribute", " the", " a", "--layer", "2"],
    ["--lens", "--head", "1"], ["--ablate", "1.0", "--head", "all"], ["--patch", CORRUPT, "--answer", " the", " a",
                                                                       "--head", "0", "--plot", "{tmp}/patch.png"],
])
def test_a_layer_or_head_that_no_output_shows_is_refused(args, tmp_path):
    args = [arg.format(tmp=tmp_path) for arg in args]
    flag = "--layer" if "--layer" in args else "--head"
    assert_one_error_line(run_explain(PROMPT, "--model", str(FOLDER), *args, models_dir=tmp_path),
                          f"{flag} picks the {flag[2:]} that the walkthrough")
    assert list(tmp_path.iterdir()) == []  # no plot either


@pytest.mark.slow
@pytest.mark.parametrize("args, fragment", [
    (["--attribute", " cat", " a"], "--attribute: ' cat' encodes to 4 tokens: ' ' 'c' 'a' 't'"),
    (["--attribute", "", " a"], "--attribute: '' encodes to 0 tokens"),
    (["--patch", CORRUPT, "--answer", " the", "mat"], "--answer: 'mat' encodes to 3 tokens"),
    (["--attribute", " a", " a"], "A and B are the same token"),
    (["--patch", CORRUPT + " x", "--answer", " the", " a"], "the prompt is 26 tokens but the --patch prompt 28"),
    (["--patch", PROMPT, "--answer", " the", " a"], "the two prompts give the same logit difference"),
    (["--ablate", "3.0"], "--ablate 3.0: layer 3 is out of range: this model has 3 layers, numbered 0 to 2"),
    (["--ablate", "0.1", "1.4"], "--ablate 1.4: head 4 is out of range: this model has 4 heads per layer"),
    (["--ablate", "1"], "'1' is not L.H"),
    (["--ablate", "1.x"], "'1.x' is not L.H"),
    (["--ablate", "0.1.2"], "'0.1.2' is not L.H"),
    (["--ablate", "-1.0"], "'-1.0' is not L.H"),
    (["--ablate", "1.0", "2.3", "1.0"], "--ablate names head 1.0 more than once: give each head once"),
    (["--attribute", " the", "--json"], "--attribute A B needs 2 words after it, got 1 before --json; a word that "
                                        "begins with '-' counts: --attribute -x +x"),
    (["--patch", "--answer", " the", " a"], "--patch CORRUPT needs 1 word after it, got 0 before --answer"),
    (["--patch", CORRUPT], "--patch needs --answer A B"),
    (["--answer", " the", " a"], "--answer belongs to --patch"),
    (["--ablation", "mean"], "--ablation belongs to --ablate"),
    (["--ablation", "half", "--ablate", "0.0"], "invalid choice: 'half'"),
    (["--ablate", "0.0", "--attribute", " the", " a", "--json"], "keep one of --ablate --attribute"),
    # a --flag=value ends the answers as a bare flag does: it is not answer B
    (["--attribute", " the", f"--model={FOLDER}"], "--attribute A B needs 2 words after it, got 1 before --model="),
    (["--patch", CORRUPT, "--answer", " the", "--json=x"], "--answer A B needs 2 words after it, got 1 before --json="),
    (["--ablate", "0.1", "--ablation", "mean"], "--ablation mean needs --mean-over FILE"),
    (["--ablate", "0.1", "--mean-over", "README.md"], "--mean-over belongs to --ablation mean"),
    (["--ablate", "0.1", "--ablation", "mean", "--mean-over", "{tmp}/none.txt"], "cannot read --mean-over"),
    (["--ablate", "0.1", "--ablation", "mean", "--mean-over", "{tmp}/short.txt"],
     "short.txt is 5 tokens, fewer than the prompt's 26"),
])
def test_bad_input_is_one_error_line_with_exit_2(args, fragment, tmp_path):
    (tmp_path / "short.txt").write_text("a cat", encoding="utf-8")
    args = [arg.format(tmp=tmp_path) for arg in args]
    assert_one_error_line(run_explain(PROMPT, "--model", str(FOLDER), *args, models_dir=tmp_path), fragment)


@pytest.mark.parametrize("name", CONFIGS)
def test_a_mean_ablated_prompt_s_loss_is_its_prefix_s_plus_the_last_token_s_surprisal(name, capsys, tmp_path):
    # the means came from windows as long as the prompt: one more token changed them at every earlier position, and
    # the difference of the two losses was not the last token's surprisal (0.2-0.34 nats off on a byte-level model)
    folder, texts, _ = reference(name)
    (tmp_path / "reference.txt").write_text(texts["reference"], encoding="utf-8")
    how, heads = next(ablation for ablation in texts["ablations"] if ablation[0] == "mean")
    ablate = ["--ablate", *[f"{layer}.{head}" for layer, head in heads], "--ablation", "mean", "--mean-over",
              tmp_path / "reference.txt"]
    prefix = explain_json(capsys, texts["clean"], "--model", folder, *ablate)
    # the prefix's likeliest next tokens after the ablation, those of whole characters (a text to append)
    followers = [row for row in prefix["next_token"]["after"] if "\\x" not in row["token"]]
    assert followers
    for following in followers:
        whole = explain_json(capsys, texts["clean"] + following["token"], "--model", folder, *ablate)
        assert whole["prompt_ids"] == prefix["prompt_ids"] + [following["id"]]
        n = len(whole["prompt_ids"])
        total = whole["loss"]["after"] * (n - 1)
        assert total == pytest.approx(prefix["loss"]["after"] * (n - 2) - np.log(following["prob"]), abs=2e-4)


def test_a_one_token_prompt_s_loss_is_null_as_the_docs_say(capsys):
    out = explain_json(capsys, "x", "--model", FOLDER, "--ablate", "0.1")
    assert out["loss"] is None and len(out["next_token"]["after"]) == 5
    assert json.loads(json.dumps(explain_json(capsys, "x y", "--model", FOLDER, "--ablate", "0.1")["loss"])).keys() == {
        "before", "after"}


def test_each_position_s_recovery_stands_under_its_own_header():
    # a prompt of 15 tokens shows its last 12 positions: header, tokens and values from the same position
    n_seq, n_layer = 15, 2
    result = {"clean": 2.0, "corrupt": 0.0, "small_gap": False, "heads": np.zeros((n_layer, 3)),
              "resid": np.array([[layer + position / 100 for position in range(n_seq)] for layer in range(n_layer)])}
    table = patching_table(list(range(n_seq)), list(range(n_seq)), (0, 1), result, lambda token_id: f"t{token_id}")
    lines = table.splitlines()
    start = next(number for number, line in enumerate(lines) if line.startswith("The residual stream"))
    header, clean = lines[start + 1].split(), lines[start + 2].split()
    assert header == ["layer", *map(str, range(3, n_seq))] and clean == ["clean", *(f"t{p}" for p in range(3, n_seq))]
    for layer in range(n_layer):
        row = lines[start + 4 + layer].split()
        assert row[0] == str(layer) and [float(value) for value in row[1:]] == [
            round(layer + int(position) / 100, 3) for position in header[1:]]
        assert cell_ends(lines[start + 4 + layer])[1:] == cell_ends(lines[start + 1])[1:]  # under the header


def cell_ends(line):  # -> where each cell of a fixed-width line ends
    return [match.end() for match in re.finditer(r"\S+", line)]


def test_patching_cautions_when_clean_and_corrupt_barely_differ(model, monkeypatch):
    # "clean 0.5145, corrupt 0.5148" printed recoveries of 2.49 and 1.41 with no caveat
    base = {"heads": np.zeros((1, 2)), "resid": np.zeros((1, 2))}
    for clean, corrupt, small in ((0.5145, 0.5148, True), (0.5, 0.45, True), (1.0, 0.0, False), (0.0, -0.1, False)):
        result = {**base, "clean": clean, "corrupt": corrupt, "small_gap": small}
        table = patching_table([0, 1], [0, 2], (0, 1), result, str)
        assert ("caution: clean and corrupt differ by" in table) == small, table
    params, ids = model
    corrupt = np.random.default_rng(6).integers(0, HPARAMS["n_vocab"], len(ids))
    result = patching(ids, corrupt, params, 3, (3, 7))
    assert result["small_gap"] == (abs(result["clean"] - result["corrupt"]) < 0.1) == False  # noqa: E712
    monkeypatch.setattr(patching_module, "MIN_GAP", abs(result["clean"] - result["corrupt"]) * 2)
    assert patching(ids, corrupt, params, 3, (3, 7))["small_gap"]


def test_the_command_line_cautions_in_the_table_and_beside_the_json(monkeypatch, capsys):
    # the fixture's prompts differ by 0.69 nats: no caution, until the threshold is above that
    common = [PROMPT, "--model", str(FOLDER), "--patch", CORRUPT, "--answer", " the", " a"]
    for threshold, cautioned in ((0.1, False), (1.0, True)):
        monkeypatch.setattr(patching_module, "MIN_GAP", threshold)
        assert explain_cli.run(common) == 0
        assert ("caution: clean and corrupt differ by 0.69" in capsys.readouterr().out) == cautioned
        assert explain_cli.run([*common, "--json"]) == 0
        captured = capsys.readouterr()
        assert json.loads(captured.out)["small_gap"] == cautioned
        assert ("caution: clean and corrupt differ by 0.69" in captured.err) == cautioned
