"""The textbook model.py: against Hugging Face's logits (scripts/fixtures/make_reference.py) and against the
formulas."""
import math

import numpy as np
import pytest

from gpt2_numpy import decode, model
from tests.conftest import HF_TOLERANCE, load_reference


def logits_error(name):  # -> max |model.gpt2's logits - HF's| on a fixture
    hparams, params, reference = load_reference(name)
    logits = model.gpt2(reference["inputs"], **params, n_head=hparams["n_head"])
    assert logits.shape == (len(reference["inputs"]), hparams["n_vocab"]) and logits.dtype == np.float32
    if "positions" in reference.files:
        logits = logits[reference["positions"]]
    return np.abs(logits - reference["logits"]).max()


@pytest.mark.parametrize("name", ["tiny", "odd_heads", pytest.param("124M", marks=pytest.mark.slow)])
def test_textbook_logits_match_hugging_face(name):
    assert logits_error(name) <= HF_TOLERANCE


def test_a_batch_axis_gives_each_row_its_own_logits():
    hparams, params, reference = load_reference("tiny")
    ids = reference["inputs"]
    batch = np.stack([ids, ids[::-1]])  # [2, 64]: "..." in every shape comment
    logits = model.gpt2(batch, **params, n_head=hparams["n_head"])
    assert logits.shape == (2, 64, hparams["n_vocab"])
    assert np.abs(logits[0] - reference["logits"]).max() <= HF_TOLERANCE


@pytest.mark.parametrize(
    "name, wrong",
    [
        ("causal_mask", lambda n_seq: np.zeros((n_seq, n_seq), np.float32)),  # sees the future
        ("causal_mask", lambda n_seq: np.triu(np.full((n_seq, n_seq), -np.inf, np.float32))),  # hides itself too
        ("split_heads", lambda x, n_head: x.reshape(*x.shape[:-2], n_head, x.shape[-2], -1)),  # cut across positions
        ("attention_scores", lambda q, k: np.einsum("...qd,...kd->...qk", q, k) / q.shape[-1]),  # / d, not / √d
        ("gelu", lambda x: x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))),  # without the ½
    ],
)
def test_the_fixture_catches_a_wrong_piece(name, wrong, monkeypatch):
    monkeypatch.setattr(model, name, wrong)
    with np.errstate(all="ignore"):  # a query that sees nothing has NaN weights: still a wrong answer
        error = logits_error("tiny")
    assert not error <= 1.0  # NaN or far off


def test_every_function_stays_float32(monkeypatch):
    hparams, params, reference = load_reference("tiny")
    dtypes = {}
    for name in ["gelu", "softmax", "layer_norm", "linear", "ffn", "attention_scores", "attention", "mha", "block"]:
        real = getattr(model, name)
        monkeypatch.setattr(model, name, lambda *a, _r=real, _n=name, **k: dtypes.setdefault(_n, set()).add(
            _r(*a, **k).dtype) or _r(*a, **k))
    model.gpt2(reference["inputs"][:8], **params, n_head=hparams["n_head"])
    assert dtypes == {name: {np.dtype(np.float32)} for name in dtypes} and len(dtypes) == 9


def test_gelu_is_the_tanh_formula_and_close_to_the_erf_gelu():
    x = np.linspace(-6, 6, 49, dtype=np.float32)
    y = model.gelu(x)
    assert y.dtype == np.float32  # math.sqrt's Python float keeps it float32; np.sqrt(2 / np.pi) would not
    exact = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.tolist()])
    assert np.abs(y - exact).max() < 1e-3  # the tanh approximation is within about 2e-4 of x Φ(x)
    assert abs(float(model.gelu(np.float32(1.0))) - 0.8411920) < 1e-6  # ½(1 + tanh(√(2/π) · 1.044715)), by hand


def test_softmax_sums_to_one_ignores_shifts_and_does_not_overflow():
    x = np.random.default_rng(0).standard_normal((5, 7), dtype=np.float32) * 10
    p = model.softmax(x)
    np.testing.assert_allclose(p.sum(-1), 1, atol=1e-6)
    np.testing.assert_allclose(model.softmax(x + 50), p, atol=1e-5)
    np.testing.assert_allclose(model.softmax(np.array([1000, 1000, 0], np.float32)), [0.5, 0.5, 0], atol=1e-7)


def test_layer_norm_normalizes_then_scales_and_shifts():
    x = np.random.default_rng(0).standard_normal((4, 64), dtype=np.float32) * 3 + 5
    y = model.layer_norm(x, g=np.ones(64, np.float32), b=np.zeros(64, np.float32))
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(y.var(-1), 1, atol=1e-3)
    np.testing.assert_allclose(model.layer_norm(x, np.float32(2), np.float32(0.5)), 2 * y + 0.5, atol=1e-5)


def test_attention_is_softmax_of_scaled_scores_plus_mask_times_v():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 5, 8), dtype=np.float32) * 4 for _ in range(3))
    mask = model.causal_mask(5)
    scores = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) / math.sqrt(8) + mask
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    expected = weights / weights.sum(-1, keepdims=True) @ v
    np.testing.assert_allclose(model.attention(q, k, v, mask), expected, rtol=0, atol=1e-5)


def test_causal_mask_hides_exactly_the_later_positions():
    mask = model.causal_mask(4)
    assert mask.dtype == np.float32
    np.testing.assert_array_equal(np.isneginf(mask), np.arange(4)[None, :] > np.arange(4)[:, None])
    assert np.all(mask[np.tril_indices(4)] == 0)


def test_split_and_merge_heads_are_inverse_and_cut_the_embedding():
    x = np.arange(2 * 5 * 12, dtype=np.float32).reshape(2, 5, 12)
    heads = model.split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    np.testing.assert_array_equal(heads[1, 2, 4], x[1, 4, 8:12])  # head 2 of position 4: embedding columns 8-11
    np.testing.assert_array_equal(model.merge_heads(heads), x)


def test_greedy_generate_gives_hugging_face_s_ids_and_those_of_the_cached_loop():
    hparams, params, reference = load_reference("tiny")
    prompt, hf_ids = reference["greedy_prompt"].tolist(), reference["greedy_ids"].tolist()
    ids = model.generate(prompt, params, hparams["n_head"], len(hf_ids))
    assert ids == hf_ids and len(hf_ids) >= 20
    assert ids == decode.generate(prompt, params, hparams["n_head"], len(hf_ids), stop_at_eos=False)
    assert prompt == reference["greedy_prompt"].tolist()  # the caller's list is left as it was
