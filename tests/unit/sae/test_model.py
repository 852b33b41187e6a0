"""The SAE's math (gpt2_numpy/sae/model.py) against torch autograd of SAELens's losses, through committed fixtures
(scripts/fixtures/make_sae_reference.py)."""
import numpy as np
import pytest

from gpt2_numpy.sae.model import loss_and_grads
from tests.sae_helpers import SAE_FIXTURES, relative_error

GRAD_CASES = {"standard": ("standard", None), "topk": ("topk", None), "topk_aux": ("topk", "dead"),
              "topk_few_dead": ("topk", "few_dead")}


@pytest.mark.parametrize("case", GRAD_CASES)
def test_loss_and_grads_equal_torch_autograd(case):
    reference = np.load(SAE_FIXTURES / "grads.npz")
    architecture, dead = GRAD_CASES[case]
    params = {name: reference[f"params/{name}"] for name in ("W_enc", "b_enc", "W_dec", "b_dec")}
    losses, grads, _ = loss_and_grads(reference["x"], params, architecture, k=3, l1=0.3,
                                   dead=None if dead is None else reference[dead])
    expected = {key.split("/")[-1]: float(reference[key]) for key in reference if key.startswith(f"{case}/loss/")}
    assert losses.keys() == expected.keys()
    for name, value in expected.items():
        assert losses[name] == pytest.approx(value, rel=1e-5)
    for name, grad in grads.items():
        assert relative_error(grad, reference[f"{case}/grad/{name}"]) < 1e-5, name


def transcoder_params(rng, d_in, d_sae):  # -> float64 params of a transcoder with a skip, in the training layout
    return {"W_enc": rng.standard_normal((d_in, d_sae)), "b_enc": rng.standard_normal(d_sae) * 0.5,
            "W_dec": rng.standard_normal((d_sae, d_in)), "b_dec": rng.standard_normal(d_in),
            "W_skip": rng.standard_normal((d_in, d_in))}


def transcoder_loss(x, y, params, architecture, k, l1, aux_target=None, dead=None):  # -> float64: the training loss
    # of a transcoder written out afresh: MSE of f W_dec + b_dec + x W_skipᵀ against y (no b_dec taken from x), plus
    # standard's decoder-norm-weighted L1, or topk's AuxK loss against aux_target (a residual held fixed, as the
    # gradient treats it)
    pre = x @ params["W_enc"] + params["b_enc"]
    if architecture == "topk":
        kept = np.argsort(-pre, axis=-1)[:, :k]
        f = np.zeros_like(pre)
        np.put_along_axis(f, kept, np.maximum(np.take_along_axis(pre, kept, -1), 0), -1)
    else:
        f = np.maximum(pre, 0)
    y_hat = f @ params["W_dec"] + params["b_dec"] + x @ params["W_skip"].T
    loss = np.mean(np.sum((y_hat - y) ** 2, axis=-1))
    if architecture == "standard":
        loss += l1 * np.mean(np.sum(f * np.linalg.norm(params["W_dec"], axis=-1), axis=-1))
    if aux_target is not None:
        k_aux = min(x.shape[-1] // 2, int(dead.sum()))
        scale = min(dead.sum() / (x.shape[-1] // 2), 1.0)
        masked = np.where(dead, pre, -np.inf)
        picked = np.argsort(-masked, axis=-1)[:, :k_aux]
        aux = np.zeros_like(pre)
        np.put_along_axis(aux, picked, np.take_along_axis(pre, picked, -1), -1)
        loss += scale / 32 * np.mean(np.sum((aux @ params["W_dec"] - aux_target) ** 2, axis=-1))
    return loss


@pytest.mark.parametrize("architecture, with_dead", [("standard", False), ("topk", False), ("topk", True)])
def test_a_transcoders_gradients_equal_finite_differences(architecture, with_dead):
    # a transcoder's step: the target is not the input, no b_dec is taken from the input, and the skip W_skip is
    # trained too; float64 central differences of the loss written out afresh, each parameter entry in turn
    rng = np.random.default_rng(11)
    x, y = rng.standard_normal((6, 4)), rng.standard_normal((6, 4))
    params = transcoder_params(rng, 4, 10)
    dead = np.arange(10) >= 5 if with_dead else None
    losses, grads, _ = loss_and_grads(x, params, architecture, k=3, l1=0.3, dead=dead, apply_b_dec_to_input=False,
                                      target=y)
    pre = x @ params["W_enc"] + params["b_enc"]
    f = np.zeros_like(pre)  # the residual the AuxK loss reconstructs, at the unperturbed params (no gradient flows)
    kept = np.argsort(-pre, axis=-1)[:, :3]
    np.put_along_axis(f, kept, np.maximum(np.take_along_axis(pre, kept, -1), 0), -1)
    residual = y - (f @ params["W_dec"] + params["b_dec"] + x @ params["W_skip"].T) if with_dead else None
    assert sum(losses.values()) == pytest.approx(
        transcoder_loss(x, y, params, architecture, 3, 0.3, residual, dead), rel=1e-10)
    assert grads.keys() == params.keys()
    for name, value in params.items():
        numeric = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            saved = value[index]
            value[index] = saved + 1e-6
            up = transcoder_loss(x, y, params, architecture, 3, 0.3, residual, dead)
            value[index] = saved - 1e-6
            down = transcoder_loss(x, y, params, architecture, 3, 0.3, residual, dead)
            value[index] = saved
            numeric[index] = (up - down) / 2e-6
        assert relative_error(grads[name], numeric) < 1e-6, name
