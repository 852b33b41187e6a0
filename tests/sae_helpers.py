"""SAEs built from arrays for the feature tests: make_sae wraps given weights in interpret/sae.py's SAE (with the
cfg.json that sae_files.new_sae completes), random_sae draws seeded ones."""
import numpy as np

from gpt2_numpy.sae.files import new_sae


def make_sae(params, hook, architecture="standard", k=None):  # -> an SAE of these weights, reading hook
    cfg = {"architecture": architecture} if k is None else {"architecture": architecture, "k": k}
    return new_sae(cfg, {name: np.asarray(value, np.float32) for name, value in params.items()}, hook)


def random_sae(d_in, d_sae, hook, seed=0, architecture="standard", k=None):  # -> an SAE with seeded random weights
    rng = np.random.default_rng(seed)
    return make_sae({"W_enc": rng.standard_normal((d_in, d_sae)) / np.sqrt(d_in),
                     "b_enc": rng.standard_normal(d_sae) * 0.1,
                     "W_dec": rng.standard_normal((d_sae, d_in)) / np.sqrt(d_in),
                     "b_dec": rng.standard_normal(d_in) * 0.1}, hook, architecture, k)
