"""The params tree, defined once in gpt2_numpy/params.py: its shapes against OpenAI's own checkpoint index, its one key
order against the gradients AdamW walks beside it, and GPT-2's initialisation against the paper."""
import random

import numpy as np
import pytest

from gpt2_numpy.fast_backward import loss_and_grads
from gpt2_numpy.formats.tf_bundle import read_index
from gpt2_numpy.params import block_shapes, flatten, gpt2_init, map_leaves, nest, random_params, top_shapes
from tests.conftest import shared_path

OFFICIAL_124M = {"n_vocab": 50257, "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12}


def test_shapes_are_those_of_openais_124m_checkpoint():
    _, entries = read_index(shared_path("124M/model.ckpt.index"))
    theirs = {name: entry.shape[1:] if len(entry.shape) == 3 else entry.shape  # a Conv1D kernel has a leading 1
              for name, entry in entries.items()}
    ours = {"model/" + "/".join(map(str, key)): shape for key, shape in top_shapes(OFFICIAL_124M).items()}
    ours.update({f"model/h{layer}/" + "/".join(key): shape for layer in range(12)
                 for key, shape in block_shapes(768).items()})
    assert ours == theirs


def test_nest_builds_the_one_order_from_any_order_and_inverts_flatten():
    hparams = {"n_vocab": 11, "n_ctx": 5, "n_embd": 4, "n_head": 2, "n_layer": 3}
    params = random_params(hparams, seed=1)
    flat = list(flatten(params))
    random.Random(0).shuffle(flat)  # a file lists its tensors in an order of its own
    rebuilt = nest(dict(flat), hparams["n_layer"])
    assert [key for key, _ in flatten(rebuilt)] == [key for key, _ in flatten(params)]
    assert all(a is b for (_, a), (_, b) in zip(flatten(rebuilt), flatten(params)))


def test_gradients_list_their_keys_in_the_params_order():
    # AdamW zips flatten(params) with flatten(grads): a different order would update each weight with another's grad
    hparams = {"n_vocab": 11, "n_ctx": 5, "n_embd": 4, "n_head": 2, "n_layer": 2}
    params = nest(dict(reversed(list(flatten(random_params(hparams))))), hparams["n_layer"])
    _, grads = loss_and_grads(np.array([[1, 2, 3]]), np.array([[2, 3, 4]]), params, hparams["n_head"])
    assert [key for key, _ in flatten(grads)] == [key for key, _ in flatten(params)]
    assert all(g.shape == p.shape for (_, g), (_, p) in zip(flatten(grads), flatten(params)))


def test_map_leaves_keeps_structure_and_order():
    params = random_params({"n_vocab": 7, "n_ctx": 3, "n_embd": 2, "n_head": 1, "n_layer": 2})
    zeros = map_leaves(np.zeros_like, params)
    assert [key for key, _ in flatten(zeros)] == [key for key, _ in flatten(params)]
    assert all(not leaf.any() for _, leaf in flatten(zeros))


def test_gpt2_init_follows_the_paper():
    hparams = {"n_vocab": 3000, "n_ctx": 256, "n_embd": 128, "n_head": 4, "n_layer": 8}
    params = gpt2_init(hparams, seed=0)
    residual = 0.02 / np.sqrt(2 * 8)  # GPT-2 paper, section 2.3: residual layers' weights scaled by 1/sqrt(N)
    for key, array in flatten(params):
        assert array.dtype == np.float32, key
        if key[-1] == "w" and key[-2] == "c_proj":
            assert array.std() == pytest.approx(residual, rel=0.05), key
        elif key[-1] == "w" or key in (("wte",), ("wpe",)):
            assert array.std() == pytest.approx(0.02, rel=0.05), key
            assert abs(array.mean()) < 0.002, key
        else:
            assert np.all(array == (1 if key[-1] == "g" else 0)), key


def test_the_same_seed_gives_the_same_weights_and_another_seed_others():
    hparams = {"n_vocab": 9, "n_ctx": 4, "n_embd": 4, "n_head": 2, "n_layer": 1}
    for make in (gpt2_init, random_params):
        same = zip(flatten(make(hparams, 3)), flatten(make(hparams, 3)))
        assert all(np.array_equal(a, b) for (_, a), (_, b) in same)
        assert not np.array_equal(make(hparams, 3)["wte"], make(hparams, 4)["wte"])

