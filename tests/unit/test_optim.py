"""AdamW and clipping against torch.optim.AdamW and clip_grad_norm_ (fixture from
scripts/fixtures/make_grad_reference.py); the schedule and clipping against their formulas; a training step's update
against the two."""
import copy
import json
import math

import numpy as np
import pytest

from gpt2_numpy import fast
from gpt2_numpy.params import flatten
from gpt2_numpy.fast_backward import loss_and_grads
from gpt2_numpy.optim import CLIP, adamw_state, adamw_step, clip_scale, global_norm, learning_rate
from gpt2_numpy.params import random_params
from gpt2_numpy.training import train_step
from tests.conftest import FIXTURES


def path_name(path):
    return "/".join(str(part) for part in path)


def rebuild(tree, leaf, prefix=()):  # the same structure, each leaf replaced by leaf(its path)
    if isinstance(tree, dict):
        return {key: rebuild(value, leaf, prefix + (key,)) for key, value in tree.items()}
    if isinstance(tree, list):
        return [rebuild(value, leaf, prefix + (i,)) for i, value in enumerate(tree)]
    return leaf(prefix)


@pytest.mark.parametrize("chunk", [fast.CHUNK, 5])  # 5: every param in many pieces of rows, the last one short
# inference_layout: a column-major mlp.c_proj.w, as load_model gives it, must be updated in place all the same
@pytest.mark.parametrize("layout", [None, fast.inference_layout])
def test_adamw_and_clipping_match_torch(monkeypatch, chunk, layout):  # clipped within AdamW, as train_step does
    monkeypatch.setattr(fast, "CHUNK", chunk)
    with np.load(FIXTURES / "reference_adamw.npz") as f:
        ref = dict(f)
    params = random_params(json.loads(str(ref["hparams"])), int(ref["seed"]))
    params = layout(params) if layout else params
    state = adamw_state(params)
    n_clipped = 0
    for step, lr in enumerate(ref["lrs"]):
        grads = rebuild(params, lambda path: ref[f"grads/{step}/{path_name(path)}"].copy())
        norm = global_norm(grads)
        assert norm == pytest.approx(float(ref[f"norm/{step}"]), rel=1e-5)
        n_clipped += norm > 1
        adamw_step(params, grads, state, float(lr), grad_scale=clip_scale(norm, 1.0))
        assert state["step"] == step + 1
        for path, array in flatten(params):
            np.testing.assert_allclose(array, ref[f"params/{step}/{path_name(path)}"], rtol=1e-6, atol=1e-7,
                                       err_msg=f"step {step} {path}")
    assert 0 < n_clipped < len(ref["lrs"])  # both branches of the clip ran


def test_weight_decay_only_on_matrices_and_embeddings():
    params = random_params({"n_vocab": 8, "n_ctx": 4, "n_embd": 4, "n_head": 2, "n_layer": 1}, seed=0)
    before = copy.deepcopy(params)
    zero = rebuild(params, lambda path: np.zeros_like(dict(flatten(params))[path]))
    adamw_step(params, zero, adamw_state(params), lr=0.5, weight_decay=0.1)  # zero grads: the decay alone moves p
    for (path, old), (_, new) in zip(flatten(before), flatten(params)):
        expected = old * (1 - 0.5 * 0.1) if old.ndim == 2 else old
        np.testing.assert_allclose(new, expected, rtol=1e-7, err_msg=str(path))


def test_clip_scales_to_the_max_norm_and_leaves_small_grads():
    grads = {"a": np.array([3.0, 0.0], np.float32), "b": [np.array([[4.0]], np.float32)]}  # global norm 5
    assert global_norm(grads) == 5
    assert clip_scale(5, 1.0) == pytest.approx(0.2, rel=1e-6)  # the gradients then of norm 1: [0.6, 0], [[0.8]]
    assert clip_scale(global_norm({"a": np.array([0.3, 0.4], np.float32)}), 1.0) == 1  # norm 0.5: left as it is


def test_cosine_schedule_at_warmup_end_middle_and_end():
    peak, warmup, total = 6e-4, 10, 110
    assert learning_rate(0, peak, warmup, total) == pytest.approx(peak / warmup)
    assert learning_rate(4, peak, warmup, total) == pytest.approx(peak * 5 / warmup)
    assert learning_rate(warmup - 1, peak, warmup, total) == pytest.approx(peak)  # warmup ends at the peak
    assert learning_rate(warmup, peak, warmup, total) == pytest.approx(peak)  # cos 0: the decay starts at the peak
    assert learning_rate(60, peak, warmup, total) == pytest.approx(0.1 * peak + 0.5 * 0.9 * peak)  # cos(π/2) = 0
    quarter = 0.1 * peak + 0.5 * (1 + math.cos(math.pi / 4)) * 0.9 * peak
    assert learning_rate(35, peak, warmup, total) == pytest.approx(quarter)
    assert learning_rate(total, peak, warmup, total) == pytest.approx(0.1 * peak)  # 10% of the peak at the end
    rates = [learning_rate(step, peak, warmup, total) for step in range(warmup, total + 1)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))


def test_constant_schedule_after_its_warmup():
    assert learning_rate(0, 1e-4, 10, 50, schedule="constant") == pytest.approx(1e-5)
    assert {learning_rate(step, 1e-4, 10, 50, schedule="constant") for step in range(9, 60)} == {1e-4}
    assert {learning_rate(step, 1e-4, 0, 50, schedule="constant") for step in range(60)} == {1e-4}


def test_past_total_the_rate_stays_at_the_final_one():
    peak, warmup, total = 6e-4, 10, 110
    for step in (total, total + 1, total + 50, 2 * total - warmup, 5 * total):  # 2 total - warmup: a full cosine
        assert learning_rate(step, peak, warmup, total) == pytest.approx(0.1 * peak), step
        assert learning_rate(step, peak, warmup, total, schedule="constant") == peak, step
    # a run shorter than its warmup ends on the way up, at step total's rate (total + 1)/warmup of the peak
    assert [learning_rate(step, peak, 10, 5) for step in (5, 6, 9, 30)] == pytest.approx([peak * 6 / 10] * 4)


def test_a_training_step_clips_its_gradients():
    # train_step's update must be adamw_step's with clip_scale's factor (held to torch above) on the same gradients,
    # with the norm well over the limit
    hparams = {"n_vocab": 50, "n_ctx": 16, "n_embd": 16, "n_head": 2, "n_layer": 1}
    ids = np.random.default_rng(3).integers(0, hparams["n_vocab"], (2, 2, 8))
    params, expected = random_params(hparams, seed=4), random_params(hparams, seed=4)
    loss, grads = loss_and_grads(*ids, expected, hparams["n_head"])
    norm = global_norm(grads)
    adamw_step(expected, grads, adamw_state(expected), lr=1e-2, grad_scale=clip_scale(norm, CLIP))
    assert norm > 2 * CLIP
    assert train_step(*ids, params, hparams["n_head"], adamw_state(params), 1e-2) == (loss, norm)
    for (path, got), (_, want) in zip(flatten(params), flatten(expected)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=str(path))
