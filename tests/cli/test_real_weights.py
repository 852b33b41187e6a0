"""Published answers of the real GPT-2 124M checkpoint. Runs only when weights/124M holds it (skipped otherwise, and
not counted in CI): `python -m gpt2_numpy.download 124M`, then `python -m pytest -m real_weights`."""
import hashlib
import json

import numpy as np
import pytest

from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.generate import generate
from gpt2_numpy.model import gpt2
from gpt2_numpy.tokenizer import load_tokenizer
from tests.conftest import REPO
from tests.cli.test_generate import cli
from tests.unit.test_likelihood import score_cli

WEIGHTS = REPO / "weights" / "124M"
# the official files (see ../shared/gpt2-official/README.md): the index holds every tensor's CRC32C, so it tells the
# real checkpoint from any other of the same shape
INDEX_SHA256 = "71916f763f9746f9b2a06b12d91996cf1084ae008d0424543d39391c5f2dc687"
DATA_BYTES = 497_759_232


def holds_real_checkpoint():
    index, data = WEIGHTS / "model.ckpt.index", WEIGHTS / "model.ckpt.data-00000-of-00001"
    return (
        index.is_file()
        and hashlib.sha256(index.read_bytes()).hexdigest() == INDEX_SHA256
        and data.is_file()
        and data.stat().st_size == DATA_BYTES
        and (WEIGHTS / "encoder.json").is_file()
    )


pytestmark = [
    pytest.mark.real_weights,
    pytest.mark.skipif(not holds_real_checkpoint(), reason=f"{WEIGHTS} does not hold the real 124M checkpoint"),
]

# Hugging Face's test_lm_generate_gpt2 (tests/models/gpt2/test_modeling_gpt2.py): greedy from "The dog"
THE_DOG = [464, 3290]
THE_DOG_GREEDY = [373, 1043, 287, 257, 2214, 1474, 262, 16246, 286, 2688, 290, 2688, 27262, 13, 198, 198, 464, 3290]
TURING = "Alan Turing theorized that computers would one day become very powerful, but even he could not imagine"
TURING_IDS = [36235, 39141, 18765, 1143, 326, 9061, 561, 530, 1110, 1716, 845, 3665, 11, 475, 772, 339, 714, 407, 5967]
TURING_GREEDY = [703, 484, 561, 307, 1498, 284, 466, 523, 13, 198, 198, 1, 40, 892, 326, 262, 749, 1593, 1517, 318]
HELLO_WORLD = [50256, 15496, 995, 0]  # <|endoftext|>Hello world!
HELLO_WORLD_LOSS = 5.3318558  # mean next-token cross-entropy, nats


@pytest.fixture(scope="module")
def model():  # -> hparams, params
    return load_params(WEIGHTS)


def test_the_dog_continues_like_hugging_face(model):
    hparams, params = model
    assert generate(THE_DOG, params, hparams["n_head"], len(THE_DOG_GREEDY)) == THE_DOG_GREEDY


def test_alan_turing_prompt_encodes_and_continues_greedily(model):
    hparams, params = model
    assert load_tokenizer(WEIGHTS).encode(TURING) == TURING_IDS
    assert generate(TURING_IDS, params, hparams["n_head"], len(TURING_GREEDY)) == TURING_GREEDY


def test_mean_next_token_loss_of_hello_world(model):
    hparams, params = model
    logits = gpt2(HELLO_WORLD[:-1], **params, n_head=hparams["n_head"]).astype(np.float64)  # [3, n_vocab]
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    loss = -np.mean(log_probs[np.arange(3), HELLO_WORLD[1:]])
    assert loss == pytest.approx(HELLO_WORLD_LOSS, abs=1e-4)


def test_cli_prints_the_greedy_continuation_of_the_dog():
    result = cli("The dog", "--n-tokens", str(len(THE_DOG_GREEDY)), models_dir=WEIGHTS.parent)
    assert result.returncode == 0
    assert result.stdout == load_tokenizer(WEIGHTS).decode(THE_DOG_GREEDY) + "\n"


def test_cli_generates_from_an_empty_prompt():
    result = cli("", "--n-tokens", "5", "--ignore-eos", models_dir=WEIGHTS.parent)
    assert result.returncode == 0
    assert "5 tokens in" in result.stderr and "after a 1-token prompt" in result.stderr


def test_score_cli_gives_the_published_loss_of_hello_world():  # TransformerLens's 5.3318557, with <|endoftext|> first
    result = score_cli("Hello world!", "--json", models_dir=WEIGHTS.parent)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["n_tokens"] == len(HELLO_WORLD) - 1
    assert output["nll"] == pytest.approx(HELLO_WORLD_LOSS, abs=1e-4)
