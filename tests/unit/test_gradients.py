"""Gradients of any named activation (interpret/gradients.py) against torch autograd through Hugging Face's
GPT2LMHeadModel (scripts/fixtures/make_activation_grad_reference.py: float64, at every trace name, on models of three
shapes, for a logit difference, the next-token loss and a run with edits), and against finite differences and math.
That gradients.py imports no torch is checked with attribution patching's (tests/unit/test_attribution_patching.py)."""
import json

import numpy as np
import pytest

from gpt2_numpy.interpret.edits import Edit, run_with_edits
from gpt2_numpy.interpret.gradients import gradients, logit_difference, next_token_loss
from gpt2_numpy.interpret.names import run_names
from gpt2_numpy.params import random_params
from tests.conftest import FIXTURES

RTOL = 1e-5  # the tolerance
REFERENCE = FIXTURES / "reference_activation_grads.npz"
CASES = ["one_layer", "three_heads", "odd"]
EDITS = [Edit("blocks.0.attn.z", np.zeros_like, head=1), Edit("blocks.0.mlp.out", np.zeros_like)]  # the fixture's


def reference_case(case):  # -> the fixture's arrays, hparams, params, ids, answer, other
    arrays = np.load(REFERENCE)
    hparams = json.loads(str(arrays[f"{case}/hparams"]))
    return (arrays, hparams, random_params(hparams, int(arrays[f"{case}/seed"])), arrays[f"{case}/ids"],
            int(arrays[f"{case}/answer"]), int(arrays[f"{case}/other"]))


def as_float64(tree):  # params with every array float64
    if isinstance(tree, dict):
        return {key: as_float64(value) for key, value in tree.items()}
    return [as_float64(value) for value in tree] if isinstance(tree, list) else tree.astype(np.float64)


def metrics(case, answer, other, ids):  # -> {fixture metric: (metric, edits)}
    cases = {"logit_diff": (logit_difference(answer, other), ()), "loss": (next_token_loss(ids), ())}
    if case == "three_heads":
        cases["logit_diff_edited"] = (logit_difference(answer, other), EDITS)
    return cases


def fixture_grad(arrays, prefix, name, params):  # -> the fixture's gradient at trace name `name`; HF keeps no tensor
    # of a layer norm's output before its gain (NAME.normalized): its gradient is the output's times the gain, as
    # NAME = g NAME.normalized + b
    if not name.endswith(".normalized"):
        return arrays[f"{prefix}/{name}"]
    norm = name.removesuffix(".normalized")
    block, _, step = norm.rpartition(".")
    gain = params["ln_f"]["g"] if norm == "ln_f" else params["blocks"][int(block.split(".")[1])][step]["g"]
    return arrays[f"{prefix}/{norm}"] * gain.astype(np.float64)


@pytest.mark.parametrize("case", CASES)
def test_every_name_is_autograds_through_hugging_face(case):
    arrays, hparams, params, ids, answer, other = reference_case(case)
    for metric_name, (metric, edits) in metrics(case, answer, other, ids).items():
        value, grads = gradients(ids, params, hparams["n_head"], metric, edits=edits)
        assert value == pytest.approx(float(arrays[f"{case}/{metric_name}/value"]), rel=RTOL)
        assert list(grads) != [] and set(grads) == set(run_names(hparams["n_layer"]))
        for name, grad in grads.items():
            theirs = fixture_grad(arrays, f"{case}/{metric_name}", name, params)
            assert grad.dtype == np.float32 and grad.shape == theirs.shape, (name, grad.dtype, grad.shape)
            # float32, as the model runs: within RTOL of the array's largest gradient (an all-zero one: exactly 0)
            assert np.abs(grad - theirs).max() <= RTOL * np.abs(theirs).max(), (metric_name, name)


@pytest.mark.parametrize("case", CASES)
def test_in_float64_every_element_is_autograds(case):
    # the same formulas as autograd's, element by element: float64 leaves only the fixture's float32 rounding
    arrays, hparams, params, ids, answer, other = reference_case(case)
    for metric_name, (metric, edits) in metrics(case, answer, other, ids).items():
        _, grads = gradients(ids, as_float64(params), hparams["n_head"], metric, edits=edits)
        for name, grad in grads.items():
            theirs = fixture_grad(arrays, f"{case}/{metric_name}", name, params)
            assert grad.dtype == np.float64
            np.testing.assert_allclose(grad, theirs, rtol=RTOL, atol=1e-12, err_msg=f"{metric_name} {name}")


def test_masked_scores_have_gradient_zero_and_the_others_do_not():
    _, hparams, params, ids, answer, other = reference_case("three_heads")
    _, grads = gradients(ids, params, hparams["n_head"], logit_difference(answer, other), ["blocks.1.attn.scores"])
    d_scores = grads["blocks.1.attn.scores"]  # [n_head, n_seq, n_seq]
    masked = np.triu(np.ones(d_scores.shape[-2:], bool), k=1)  # a key after its query
    assert np.all(d_scores[:, masked] == 0) and np.all(d_scores[:, -1, :] != 0)


def test_names_picks_arrays_of_the_full_pass_and_unknown_names_are_refused():
    _, hparams, params, ids, answer, other = reference_case("odd")
    metric = logit_difference(answer, other)
    _, everything = gradients(ids, params, hparams["n_head"], metric)
    picked = ["blocks.0.attn.v", "embed"]
    value, some = gradients(ids, params, hparams["n_head"], metric, picked)
    assert set(some) == set(picked)
    assert all(np.array_equal(some[name], everything[name]) for name in picked)
    with pytest.raises(ValueError, match="no activation is named blocks.7.mid"):
        gradients(ids, params, hparams["n_head"], metric, ["blocks.7.mid"])


def finite_difference(ids, params, n_head, metric, name, index, step=1e-6):  # -> d metric / d array[index], central
    def moved(delta):
        def edit(array):
            array = array.copy()
            array[index] += delta
            return array
        return metric(run_with_edits(ids, params, n_head, [Edit(name, edit)]))[0]
    return (moved(step) - moved(-step)) / (2 * step)


def test_a_metric_of_an_earlier_array_is_carried_back_from_where_it_reads():
    # a latent's activation is such a metric: here u · blocks.0.mid at position 2, read before the logits
    _, hparams, params, ids, _, _ = reference_case("three_heads")
    params = as_float64(params)
    u = np.random.default_rng(0).standard_normal(hparams["n_embd"])

    def metric(arrays):  # -> value, {name: gradient}
        seed = np.zeros_like(arrays["blocks.0.mid"])
        seed[2] = u
        return float(arrays["blocks.0.mid"][2] @ u), {"blocks.0.mid": seed}

    value, grads = gradients(ids, params, hparams["n_head"], metric, ["blocks.0.mid", "embed", "blocks.0.attn.k",
                                                                       "blocks.1.out"])
    assert np.array_equal(grads["blocks.1.out"], np.zeros_like(grads["blocks.1.out"]))  # after what it reads
    assert np.array_equal(grads["blocks.0.mid"][2], u) and not grads["blocks.0.mid"][3:].any()  # causal
    for name, index in [("embed", (1, 4)), ("embed", (2, 0)), ("blocks.0.attn.k", (2, 1, 3))]:
        expected = finite_difference(ids, params, hparams["n_head"], metric, name, index)
        assert grads[name][index] == pytest.approx(expected, rel=1e-6, abs=1e-9)
