"""Training an SAE (gpt2_numpy/sae/training.py's step) on planted features: it finds the directions."""
import pytest

from scripts.sae.planted import train_planted


@pytest.mark.parametrize("architecture, goal", [("topk", 0.95), ("standard", 0.8)])
def test_an_sae_finds_planted_directions(architecture, goal):
    # the goal's small version (scripts/sae/planted.py runs the full one): 64 directions in 32 dimensions, about 2
    # active per activation
    share, _, _ = train_planted(architecture, steps=200, batch_size=256, lr=1e-2, d_sae=128, k=3, l1=0.3,
                                n_features=64, d_in=32, active=2)
    assert share >= goal
