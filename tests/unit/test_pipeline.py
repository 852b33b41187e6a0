"""The text-in, text-out calls (gpt2_numpy/pipeline.py, exported from gpt2_numpy) against the functions they stand on
and against Hugging Face: load_model by folder and by size, complete, stream, score_text.

The tiny TF checkpoint (tests/fixtures/tf_tiny, with GPT-2's tokenizer) has Hugging Face's greedy continuation of a
prompt in tests/fixtures/reference_tiny.npz; its vocabulary of 512 tokens has no <|endoftext|>, so scoring with the
default <|endoftext|> first uses a one-layer model with the whole vocabulary, written here.
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from gpt2_numpy import complete, load_model, score_text, stream
from gpt2_numpy.errors import OutOfVocabulary, UsageError
from gpt2_numpy.generate import generate
from gpt2_numpy.params import random_params
from gpt2_numpy.save import save_model
from gpt2_numpy.score import token_log_probs
from gpt2_numpy.tokenizer import EOT_ID, PACKAGED_VOCABULARY, load_tokenizer
from gpt2_numpy.loading import MARKER
from tests.conftest import FIXTURES, REPO, UNREACHABLE, tiny_models_dir

PROMPT = "I will go to the"  # every id fits the tiny model's 512-token vocabulary
FULL_VOCAB = {"n_vocab": 50257, "n_ctx": 32, "n_embd": 8, "n_head": 2, "n_layer": 1}


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):  # -> a models dir whose 124M/ holds the tiny TF checkpoint and GPT-2's tokenizer
    return tiny_models_dir(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tiny(models_dir):
    return load_model(models_dir / "124M")


@pytest.fixture(scope="module")
def full_vocab(tmp_path_factory):  # -> a Model with GPT-2's whole vocabulary, so <|endoftext|> exists
    folder = tmp_path_factory.mktemp("full_vocab")
    save_model(folder, FULL_VOCAB, random_params(FULL_VOCAB, 4), PACKAGED_VOCABULARY)
    return load_model(str(folder))


def test_a_loaded_model_is_laid_out_for_decoding(tiny):
    # fast.inference_layout: decoding reads mlp.c_proj.w column-major, twice as fast (the benchmark's decode rows)
    assert all(block["mlp"]["c_proj"]["w"].flags.f_contiguous for block in tiny.params["blocks"])


def test_complete_greedy_is_hugging_face_greedy_continuation(tiny):
    reference = np.load(FIXTURES / "reference_tiny.npz")
    assert tiny.tokenizer.encode(PROMPT) == reference["cli_prompt"].tolist()
    expected = tiny.tokenizer.decode(reference["cli_greedy_ids"])
    assert complete(tiny, PROMPT, n_tokens=len(reference["cli_greedy_ids"])) == expected


def test_sampled_text_is_generate_with_the_same_seed(tiny):
    options = dict(temperature=0.9, top_k=50, top_p=0.95, seed=7)
    ids = generate(tiny.tokenizer.encode(PROMPT), tiny.params, tiny.hparams["n_head"], 25, **options)
    assert complete(tiny, PROMPT, n_tokens=25, **options) == tiny.tokenizer.decode(ids)
    assert "".join(stream(tiny, PROMPT, 25, **options)) == tiny.tokenizer.decode(ids)


def test_stream_yields_whole_characters_as_they_complete():
    tokenizer = load_tokenizer()
    ids = tokenizer.encode("I go \N{GRINNING FACE} out")
    assert len(tokenizer.encode(" \N{GRINNING FACE}")) == 2  # the emoji's four bytes span two tokens
    assert list(tokenizer.stream_decoder().pieces(ids)) == ["I", " go", " ", "\N{GRINNING FACE}", " out"]
    cut = tokenizer.encode("I \N{GRINNING FACE}")[:-1]  # ends after the emoji's first token
    assert list(tokenizer.stream_decoder().pieces(cut)) == ["I", " ", "\N{REPLACEMENT CHARACTER}"]


def test_stream_checks_its_arguments_before_the_first_piece(tiny):
    for bad in [dict(n_tokens=0), dict(n_tokens=64), dict(temperature=-1), dict(top_p=1.5)]:
        with pytest.raises(UsageError):
            stream(tiny, PROMPT, **bad)  # no next(): the call itself refuses
    with pytest.raises(OutOfVocabulary, match="outside this model's vocabulary of 512"):  # a library error, which the
        stream(tiny, "Jabberwocky")  # command lines print as one line with exit status 2 (tests/cli/test_generate.py)


def test_score_text_puts_end_of_text_first_and_sums_up_token_log_probs(full_vocab):
    text = "Hello world!"
    hparams, params, tokenizer = full_vocab
    log_probs = token_log_probs([EOT_ID, *tokenizer.encode(text)], params, hparams["n_head"])
    scores = score_text(full_vocab, text)
    assert scores["n_tokens"] == len(tokenizer.encode(text))  # the first token is scored too, after <|endoftext|>
    assert scores["nll"] == pytest.approx(-log_probs.mean(), rel=1e-12)
    assert scores["perplexity"] == pytest.approx(math.exp(-log_probs.mean()), rel=1e-12)
    assert scores["bits_per_byte"] == pytest.approx(-log_probs.sum() / math.log(2) / len(text.encode()), rel=1e-12)
    without = score_text(full_vocab, text, bos=False)
    assert without["n_tokens"] == scores["n_tokens"] - 1
    alone = token_log_probs(tokenizer.encode(text), params, hparams["n_head"])  # the text from position 0
    assert without["nll"] == pytest.approx(-alone.mean(), rel=1e-12)


@pytest.mark.slow
def test_score_text_equals_the_score_command(full_vocab, tmp_path):
    folder = tmp_path / "model"
    save_model(folder, FULL_VOCAB, full_vocab.params, PACKAGED_VOCABULARY)
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPT2_NUMPY_BASE_URL": UNREACHABLE}
    result = subprocess.run([sys.executable, "-m", "gpt2_numpy.score", "--model", str(folder), "--json", "Hi there"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == score_text(full_vocab, "Hi there")


def test_score_text_refuses_an_empty_text(full_vocab):
    with pytest.raises(UsageError, match="the text is empty"):
        score_text(full_vocab, "")


@pytest.mark.slow
def test_a_size_goes_through_the_downloader_and_a_folder_does_not(models_dir, tmp_path):
    folder_model = load_model(models_dir / "124M")
    assert not (models_dir / "124M" / MARKER).exists()  # a folder is used as it is: nothing written there
    size_model = load_model("124M", models_dir=models_dir)
    assert (models_dir / "124M" / MARKER).is_file()  # verified by loading.ready, and recorded
    assert size_model.hparams == folder_model.hparams
    np.testing.assert_array_equal(size_model.params["wte"], folder_model.params["wte"])
    with pytest.raises(UsageError, match=f"{tmp_path / 'missing'} does not exist: pass a model folder"):
        load_model(tmp_path / "missing")


def test_the_exported_names_are_the_functions_whatever_was_imported_first():
    # the lazy names of gpt2_numpy/__init__.py must not be shadowed by submodules imported before them: no exported
    # name is also a submodule's, which would replace it once imported
    code = ("import gpt2_numpy.pipeline, gpt2_numpy.score, gpt2_numpy.explain, gpt2_numpy.generate, pkgutil\n"
            "import gpt2_numpy, types\n"
            "names = [n for n in gpt2_numpy.__all__ if isinstance(getattr(gpt2_numpy, n), types.ModuleType)]\n"
            "submodules = {module.name for module in pkgutil.iter_modules(gpt2_numpy.__path__)}\n"
            "assert names == [] and not submodules & set(gpt2_numpy.__all__) and 'generate' in submodules, names\n"
            "from gpt2_numpy import Model, complete, load_model, logit_lens, score_text, stream, trace\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr


def test_the_exported_names_are_each_listed_once_and_each_resolves():
    import gpt2_numpy

    repeated = sorted({name for name in gpt2_numpy.__all__ if gpt2_numpy.__all__.count(name) > 1})
    assert repeated == []
    star = {}
    exec("from gpt2_numpy import *", star)  # raises AttributeError for a listed name that does not resolve
    assert set(gpt2_numpy.__all__) <= set(star)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["generate", "score", "explain", "train", "download"])
def test_running_a_command_as_a_module_gives_no_import_warning(command):
    # importing the package must not import the module `python -m` is about to run (runpy's RuntimeWarning)
    result = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", f"gpt2_numpy.{command}", "--help"],
                            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0 and "Warning" not in result.stderr, result.stderr
