"""Training an SAE (gpt2_numpy/sae/training.py's step) on planted features: it finds the directions; and the benchmark
of that step (scripts/bench/sae.py) says why SAELens cannot be compared when it cannot."""
import pytest

from scripts.sae.planted import train_planted


@pytest.mark.parametrize("architecture, goal", [("topk", 0.95), ("standard", 0.8)])
def test_an_sae_finds_planted_directions(architecture, goal):
    # the goal's small version (scripts/sae/planted.py runs the full one): 64 directions in 32 dimensions, about 2
    # active per activation
    share, _, _ = train_planted(architecture, steps=200, batch_size=256, lr=1e-2, d_sae=128, k=3, l1=0.3,
                                n_features=64, d_in=32, active=2)
    assert share >= goal


def test_the_benchmark_shows_why_an_installed_sae_lens_does_not_import(monkeypatch):
    from scripts.bench import sae as bench

    def broken(data):
        raise ImportError("No module named 'torch'")
    monkeypatch.setattr(bench, "batches", lambda: [])
    monkeypatch.setattr(bench, "our_measure", lambda data: lambda: 1.0)
    monkeypatch.setattr(bench, "sae_lens_measure", broken)
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: object() if name == "sae_lens" else None)
    metric = bench.sae_rows(1)[0]["metric"]
    assert "fails to import: No module named 'torch'" in metric and "pip install" not in metric
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: None)
    assert "pip install sae-lens" in bench.sae_rows(1)[0]["metric"]
