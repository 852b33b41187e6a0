"""Training an SAE (gpt2_numpy/sae/training.py's step) on planted features: it finds the directions; and the benchmark
of that step (scripts/bench/sae.py) says why SAELens cannot be compared when it cannot."""
import numpy as np
import pytest

from gpt2_numpy.optim import adamw_state
from gpt2_numpy.sae.training import SaeSettings, train_step
from scripts.sae.planted import train_planted


@pytest.mark.parametrize("architecture, goal", [("topk", 0.95), ("standard", 0.8)])
def test_an_sae_finds_planted_directions(architecture, goal):
    # the goal's small version (scripts/sae/planted.py runs the full one): 64 directions in 32 dimensions, about 2
    # active per activation
    share, _, _ = train_planted(architecture, steps=200, batch_size=256, lr=1e-2, d_sae=128, k=3, l1=0.3,
                                n_features=64, d_in=32, active=2)
    assert share >= goal


def test_a_latent_that_never_fires_keeps_its_weights_exactly():
    # latent 2's pre-activation is below 0 on every row: f_2 = 0, so the MSE and the L1 penalty give W_enc[:, 2],
    # b_enc[2] and W_dec[2] no gradient, and Adam without weight decay (SAELens's) leaves them as they were
    rng = np.random.default_rng(0)
    params = {"W_enc": rng.standard_normal((4, 3)).astype(np.float32), "b_enc": np.array([0, 0, -100], np.float32),
              "W_dec": rng.standard_normal((3, 4)).astype(np.float32), "b_dec": np.zeros(4, np.float32)}
    before = {name: value.copy() for name, value in params.items()}
    settings = SaeSettings("standard", 4, 3, None, 0.1, 1e-2, 8, 0, None, "test", "", None, 16, 1, 1)
    train_step(rng.standard_normal((8, 4)).astype(np.float32), params, adamw_state(params), 1e-2, settings, None)
    assert not np.array_equal(params["W_enc"][:, :2], before["W_enc"][:, :2])  # the live latents did move
    assert np.array_equal(params["W_enc"][:, 2], before["W_enc"][:, 2])
    assert params["b_enc"][2] == before["b_enc"][2]
    assert np.array_equal(params["W_dec"][2], before["W_dec"][2])


def test_the_benchmark_shows_why_an_installed_sae_lens_does_not_import(monkeypatch):
    from scripts.bench import sae as bench

    def broken(data, size):
        raise ImportError("No module named 'torch'")
    monkeypatch.setattr(bench, "batches", lambda size: [])
    monkeypatch.setattr(bench, "our_measure", lambda data, size: lambda: 1.0)
    monkeypatch.setattr(bench, "sae_lens_measure", broken)
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: object() if name == "sae_lens" else None)
    metric = bench.sae_rows(1)[0]["metric"]
    assert "fails to import: No module named 'torch'" in metric and "pip install" not in metric
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: None)
    assert "pip install sae-lens" in bench.sae_rows(1)[0]["metric"]
