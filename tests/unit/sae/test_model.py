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
