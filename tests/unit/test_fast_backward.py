"""The backward pass against torch autograd on HF's GPT2LMHeadModel (fixtures from
scripts/fixtures/make_grad_reference.py), and against float64 finite differences of model.py's forward, which need no
reference at all."""
import json
import math

import numpy as np
import pytest

from gpt2_numpy import fast, model
from gpt2_numpy.fast_backward import block_forward, ffn_forward, gelu_backward_kept, loss_and_grads, mha_forward
from gpt2_numpy.params import flatten, map_leaves
from gpt2_numpy.params import random_params
from tests.conftest import FIXTURES


@pytest.fixture(scope="module")
def reference():
    with np.load(FIXTURES / "reference_grads.npz") as f:
        arrays = dict(f)
    hparams = json.loads(str(arrays["hparams"]))
    return hparams, random_params(hparams, int(arrays["seed"])), arrays


def path_name(path):
    return "/".join(str(part) for part in path)


@pytest.mark.parametrize("chunk", [fast.CHUNK, 5])  # 5: the loss's rows and GELU's elements in many pieces
@pytest.mark.parametrize("case", ["single", "batch"])
def test_grads_match_torch_for_every_parameter(reference, case, monkeypatch, chunk):
    monkeypatch.setattr(fast, "CHUNK", chunk)
    hparams, params, ref = reference
    loss, grads = loss_and_grads(ref[f"{case}/inputs"], ref[f"{case}/targets"], params, hparams["n_head"])
    assert isinstance(loss, float) and loss == pytest.approx(float(ref[f"{case}/loss"]), rel=1e-5)
    ours = {path_name(path): grad for path, grad in flatten(grads)}
    theirs = {key.partition("/")[2]: value for key, value in ref.items()
              if key.startswith(f"{case}/") and key.split("/")[1] not in ("inputs", "targets", "loss", "wte_embedding")}
    assert ours.keys() == theirs.keys() == {path_name(path) for path, _ in flatten(params)}
    for name, expected in theirs.items():
        assert ours[name].dtype == np.float32 and ours[name].shape == expected.shape, name
        largest = np.abs(expected).max()
        assert largest > 0, name
        assert np.abs(ours[name] - expected).max() <= 1e-4 * largest, name


@pytest.mark.parametrize("case", ["single", "batch"])
def test_wte_gradient_holds_both_shares(reference, case):  # so the wte comparison above sees a bug in either share
    _, _, ref = reference
    total, embedding = ref[f"{case}/wte"], ref[f"{case}/wte_embedding"]
    head = total - embedding
    assert np.abs(embedding).max() > 0.1 * np.abs(total).max()
    assert np.abs(head).max() > 0.1 * np.abs(total).max()
    unused = np.setdiff1d(np.arange(len(total)), ref[f"{case}/inputs"])  # rows never looked up: the head's share only
    assert len(unused) > 0 and not embedding[unused].any()


@pytest.mark.parametrize("order", ["C", "F"])
def test_wte_gradient_in_a_lent_array_of_either_layout_equals_torch(reference, order):
    # loss_and_grads writes wte's gradient into the array a caller lends, whatever its layout: the embedding's share
    # goes in by flat indices into a C-ordered one, which a Fortran-ordered one has none of
    hparams, params, ref = reference
    lent = np.empty(params["wte"].shape, params["wte"].dtype, order=order)
    _, grads = loss_and_grads(ref["batch/inputs"], ref["batch/targets"], params, hparams["n_head"], d_wte=lent)
    assert grads["wte"] is lent
    assert np.abs(lent - ref["batch/wte"]).max() <= 1e-4 * np.abs(ref["batch/wte"]).max()


def test_positions_past_the_sequence_get_no_gradient(reference):
    hparams, params, ref = reference
    _, grads = loss_and_grads(ref["single/inputs"], ref["single/targets"], params, hparams["n_head"])
    n_seq = len(ref["single/inputs"])
    assert n_seq < hparams["n_ctx"] and not grads["wpe"][n_seq:].any() and grads["wpe"][:n_seq].all()


def test_batch_loss_is_the_mean_over_every_position(reference):
    hparams, params, ref = reference
    inputs, targets = ref["batch/inputs"], ref["batch/targets"]
    rows = [loss_and_grads(i, t, params, hparams["n_head"]) for i, t in zip(inputs, targets)]
    loss, grads = loss_and_grads(inputs, targets, params, hparams["n_head"])
    assert loss == pytest.approx(np.mean([row_loss for row_loss, _ in rows]), rel=1e-6)
    expected = np.mean([row_grads["blocks"][0]["attn"]["c_attn"]["w"] for _, row_grads in rows], axis=0)
    np.testing.assert_allclose(grads["blocks"][0]["attn"]["c_attn"]["w"], expected, atol=1e-6)


def test_training_forward_is_model_forward(reference):  # the cached forward composes model.py's functions
    hparams, params, _ = reference
    x = np.random.default_rng(0).standard_normal((2, 9, hparams["n_embd"]), dtype=np.float32)
    block = params["blocks"][0]
    n_head = hparams["n_head"]
    close = {"rtol": 1e-5, "atol": 1e-5}  # a 2-D matmul sums in another order than a stacked one
    np.testing.assert_allclose(mha_forward(x, **block["attn"], n_head=n_head)[0],
                               model.mha(x, **block["attn"], n_head=n_head), **close)
    np.testing.assert_allclose(ffn_forward(x, **block["mlp"])[0], model.ffn(x, **block["mlp"]), **close)
    np.testing.assert_allclose(block_forward(x, **block, n_head=n_head)[0], model.block(x, **block, n_head=n_head),
                               **close)


def float64(tree):  # -> the same tree in float64, for finite differences
    return map_leaves(lambda leaf: leaf.astype(np.float64), tree)


def textbook_loss(inputs, targets, params, n_head):  # model.py's logits and the cross-entropy written out, in float64
    logits = model.gpt2(inputs, **params, n_head=n_head)
    log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return np.mean(log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0])


# logit_scale 1000: logits in the hundreds, beyond ±fast.UNSHIFTED, where the loss's e^x is taken again shifted
@pytest.mark.parametrize("logit_scale", [1, 1000])
def test_grads_match_finite_differences_in_float64(logit_scale):
    hparams = {"n_vocab": 19, "n_ctx": 8, "n_embd": 12, "n_head": 3, "n_layer": 2}
    params = float64(random_params(hparams, seed=7))
    params["ln_f"]["g"] *= logit_scale
    rng = np.random.default_rng(8)
    inputs, targets = rng.integers(0, hparams["n_vocab"], (2, 2, 7))
    inputs[0, :3] = inputs[1, 4]  # repeated tokens: their embedding gradients must add up
    _, grads = loss_and_grads(inputs, targets, params, hparams["n_head"])
    analytic = dict(flatten(grads))
    h = 1e-6
    for path, array in flatten(params):
        assert analytic[path].dtype == np.float64, path
        picks = [tuple(rng.integers(0, n) for n in array.shape) for _ in range(4)]
        if path == ("wte",):
            picks.append((inputs[0, 0], int(rng.integers(0, array.shape[1]))))  # a row both read and predicted
        for index in picks:
            old = array[index]
            array[index] = old + h
            plus = textbook_loss(inputs, targets, params, hparams["n_head"])
            array[index] = old - h
            minus = textbook_loss(inputs, targets, params, hparams["n_head"])
            array[index] = old
            numeric = (plus - minus) / (2 * h)
            assert abs(analytic[path][index] - numeric) <= 1e-6 * max(1, abs(numeric)), (path, index)


def test_gelu_backward_is_the_tanh_formulas_derivative(monkeypatch):
    # the derivative of 0.5 x (1 + tanh u), u = c (x + 0.044715 x^3), written with tanh in float64, where ours goes
    # through gelu's output; x = 0 (where ours cannot divide by x) and far out on both sides, in ragged chunks
    monkeypatch.setattr(fast, "CHUNK", 7)
    x = np.random.default_rng(0).standard_normal((3, 5, 11)).astype(np.float32) * 4
    x[0, 0, :5] = 0, -100, 100, -1e4, 1e4
    d_out = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    x64, c = x.astype(np.float64), math.sqrt(2 / math.pi)
    tanh_u = np.tanh(c * (x64 + 0.044715 * x64**3))
    slope = 0.5 * (1 + tanh_u) + 0.5 * x64 * (1 - tanh_u**2) * c * (1 + 3 * 0.044715 * x64**2)
    d_x = gelu_backward_kept(d_out, x, fast.gelu(x))
    assert d_x.dtype == np.float32 and d_x[0, 0, 0] == 0.5 * d_out[0, 0, 0]  # slope ½ at 0
    np.testing.assert_allclose(d_x, d_out * slope, rtol=1e-5, atol=1e-6)


SMALL = {"n_vocab": 11, "n_ctx": 8, "n_embd": 8, "n_head": 2, "n_layer": 1}


@pytest.mark.parametrize("inputs, targets, fragment", [
    ([1, 2], [2, 3, 4], r"targets \(3,\) must have the inputs' shape \(2,\)"),  # else the 3rd target is dropped
    ([1, 2, 3], [2, 3], r"targets \(2,\) must have the inputs' shape \(3,\)"),
    ([1, 2], 3, "^targets: token ids must be a non-empty 1-D sequence of integers"),  # else broadcast everywhere
    ([-1, 3], [3, 4], r"^inputs: token id -1 is outside the vocabulary \[0, 11\)"),  # else wrapped to the last id
    ([3, 3], [3, -1], r"^targets: token id -1 is outside the vocabulary \[0, 11\)"),
    ([11, 3], [3, 4], r"token id 11 is outside the vocabulary"),
    (list(range(9)), list(range(1, 10)), "9 positions exceed the model's context of n_ctx=8"),
    ([], [], "non-empty 1-D sequence"),
    ([1.0, 2.0], [2, 3], "^inputs: token ids must be a non-empty 1-D sequence of integers"),
    ([1, 2], [2.0, 3.0], "^targets: token ids must be a non-empty 1-D sequence of integers"),
])
def test_inputs_and_targets_are_checked_before_any_loss(inputs, targets, fragment):
    with pytest.raises(ValueError, match=fragment):
        loss_and_grads(inputs, targets, random_params(SMALL, 0), SMALL["n_head"])


def test_any_leading_axes_are_positions_of_one_mean():  # int [..., n_seq]: a batch of batches is still a batch
    params, rng = random_params(SMALL, 0), np.random.default_rng(0)
    inputs, targets = rng.integers(0, 11, (2, 3, 5)), rng.integers(0, 11, (2, 3, 5))
    loss, grads = loss_and_grads(inputs, targets, params, SMALL["n_head"])
    flat_loss, flat_grads = loss_and_grads(inputs.reshape(6, 5), targets.reshape(6, 5), params, SMALL["n_head"])
    assert loss == pytest.approx(flat_loss, rel=1e-6)  # the mean over all 30 positions either way
    np.testing.assert_allclose(grads["wte"], flat_grads["wte"], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("n_head", [3, 0, -2, 2.0, True])
def test_a_head_count_that_does_not_divide_the_width_is_named(n_head):
    with pytest.raises(ValueError, match=f"n_head={n_head!r} must be a whole number >= 1 that divides n_embd=8"):
        loss_and_grads([1, 2], [2, 3], random_params(SMALL, 0), n_head)
