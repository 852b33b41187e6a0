"""An SAE spliced into the model (gpt2_numpy/sae/evaluation.py): an exact SAE recovers all of the loss, one that decodes
everything to zero none of it, each loss against the model's own next-token loss computed here."""
import numpy as np
import pytest

from gpt2_numpy.interpret.tracing import log_softmax, trace
from gpt2_numpy.params import random_params
from gpt2_numpy.sae.evaluation import evaluate
from gpt2_numpy.tokenizer import token_windows
from tests.sae_helpers import exact_sae

HPARAMS = {"n_vocab": 50, "n_ctx": 16, "n_embd": 8, "n_head": 2, "n_layer": 2}


def test_an_exact_sae_recovers_all_the_loss_and_a_zero_one_none():
    params = random_params(HPARAMS, 4)
    windows = token_windows(np.random.default_rng(2).integers(0, 50, 70), 16, targets=True)  # 4 windows of 17
    clean = np.mean([-log_softmax(trace(w[:-1], params, 2)["logits"])[np.arange(16), w[1:]].mean() for w in windows])
    exact = exact_sae(8, "blocks.0.out")
    numbers = evaluate(exact, params, 2, windows)
    assert numbers["tokens"] == 64 and numbers["L_clean"] == pytest.approx(clean, rel=1e-5)
    assert numbers["L_sae"] == pytest.approx(clean, rel=1e-5)
    assert numbers["loss_recovered"] == pytest.approx(1, abs=1e-4)
    assert numbers["mse"] == pytest.approx(0, abs=1e-9) and numbers["explained_variance"] == pytest.approx(1, abs=1e-6)
    exact.params["W_dec"] = np.zeros_like(exact.params["W_dec"])  # every activation decoded to b_dec = 0: zeroed
    numbers = evaluate(exact, params, 2, windows)
    assert numbers["L_sae"] == pytest.approx(numbers["L_zero"], rel=1e-5)
    assert numbers["loss_recovered"] == pytest.approx(0, abs=1e-4)
    assert numbers["L_zero"] != pytest.approx(clean, abs=1e-3)
    # x̂ = 0 everywhere: cos(x, 0) is 0 with torch's eps under each norm, and E‖x̂‖² / E[x·x̂] is 0 / 0, undefined (no
    # NaN in the JSON)
    assert numbers["cossim"] == 0 and numbers["relative_reconstruction_bias"] is None
