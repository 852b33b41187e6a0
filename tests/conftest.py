"""Shared test helpers: where the official GPT-2 files live, and the rule that CI never skips them; the HF logit
fixtures of tests/fixtures (their configs, seeded weights and tolerance)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpt2_numpy.params import random_params
from gpt2_numpy.save import save_model
from gpt2_numpy.tokenizer import EOT, PACKAGED_VOCABULARY, bytes_to_unicode

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
OFFICIAL = REPO.parent / "shared" / "gpt2-official"  # read from there, never copied into the repo
# except the tokenizer's two files: the package ships byte-identical copies (test_tokenizer checks), so tests that
# need only them run on any clone
PACKAGED = {f"124M/{name}": PACKAGED_VOCABULARY / name for name in ("encoder.json", "vocab.bpe")}
HF_TOLERANCE = 1e-4  # max |logit difference| vs HF in float32; measured about 2e-5 on all three configs


def load_reference(name):  # -> hparams, params, reference arrays of an HF fixture (scripts/make_reference.py)
    config = json.loads((FIXTURES / "configs.json").read_text())[name]
    reference = np.load(FIXTURES / f"reference_{name}.npz")
    return config["hparams"], random_params(config["hparams"], config["seed"]), reference


def official_path(relative):
    """Path to an official file: the packaged copy of encoder.json or vocab.bpe, else the file under
    ../shared/gpt2-official, which skips locally, but fails under CI=true, when absent."""
    return PACKAGED.get(relative) or shared_path(relative)


def shared_path(relative):
    """Path to a file under ../shared/gpt2-official; skips locally, but fails under CI=true, when absent."""
    path = OFFICIAL / relative
    if not path.exists():
        missing(f"{path} is missing: place the official GPT-2 files in ../shared/gpt2-official/ beside the repo")
    return path


def missing(message):  # what a test needs is absent: skip locally, but fail under CI=true, which must have it
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def official_124m():
    """The folder of official 124M files (tokenizer, hparams, checkpoint index; no data file)."""
    return official_path("124M")


def tiny_models_dir(root):  # -> a models dir under root whose 124M/ holds the tiny TF checkpoint and the real tokenizer
    folder = root / "models" / "124M"
    shutil.copytree(FIXTURES / "tf_tiny", folder)
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(official_path(f"124M/{name}"), folder)
    return folder.parent


def byte_model_dir(folder, hparams, params):  # -> folder, holding params and a byte-level tokenizer: a model of its own
    """A model folder in Hugging Face's layout with a vocabulary of its own, as a model trained with its own tokenizer
    has: the 256 bytes (ids 0-255, in GPT-2's byte order) and <|endoftext|>, the last id (256); no merges."""
    assert hparams["n_vocab"] == 257
    folder.mkdir(parents=True)
    vocabulary = {char: token_id for token_id, char in enumerate(bytes_to_unicode().values())}
    (folder / "vocab.json").write_text(json.dumps({**vocabulary, EOT: 256}), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    save_model(folder, hparams, params, folder)  # the tokenizer files are already in place
    return folder


def assert_one_error_line(result, fragment):  # a CLI's bad-input contract: exit 2, nothing on stdout, one error line
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and fragment in errors[0], result.stderr
    assert result.stderr.splitlines()[-1] == errors[0]


UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, so no test can reach the internet by mistake


def run_explain(*args, models_dir, code=None):  # -> CompletedProcess, str output; code: run instead of -m
    env = {**os.environ, "GPT2_NUMPY_BASE_URL": UNREACHABLE, "PYTHONPATH": str(REPO)}
    env.pop("GPT2_NUMPY_WEIGHTS", None)
    start = ["-c", code] if code else ["-m", "gpt2_numpy.explain"]
    command = [sys.executable, *start, *args, "--models-dir", str(models_dir)]
    result = subprocess.run(command, capture_output=True, env=env, timeout=120)
    assert "Traceback" not in result.stderr.decode("utf-8", "replace")
    return subprocess.CompletedProcess(command, result.returncode, result.stdout.decode(), result.stderr.decode())
