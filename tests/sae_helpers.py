"""What the SAE tests share: make_sae wraps given weights in sae/model.py's SAE (with the cfg.json that
sae/files.py's new_sae completes), random_sae draws seeded ones; the committed SAELens fixtures, and relative_error."""
import numpy as np

from gpt2_numpy.sae.files import new_sae
from tests.conftest import FIXTURES


def make_sae(params, hook, architecture="standard", k=None):  # -> an SAE of these weights, reading hook
    cfg = {"architecture": architecture} if k is None else {"architecture": architecture, "k": k}
    return new_sae(cfg, {name: np.asarray(value, np.float32) for name, value in params.items()}, hook)


def random_sae(d_in, d_sae, hook, seed=0, architecture="standard", k=None):  # -> an SAE with seeded random weights
    rng = np.random.default_rng(seed)
    return make_sae({"W_enc": rng.standard_normal((d_in, d_sae)) / np.sqrt(d_in),
                     "b_enc": rng.standard_normal(d_sae) * 0.1,
                     "W_dec": rng.standard_normal((d_sae, d_in)) / np.sqrt(d_in),
                     "b_dec": rng.standard_normal(d_in) * 0.1}, hook, architecture, k)


def exact_params(d_in):  # -> a standard SAE's params that reconstruct their input: relu(x) - relu(-x) = x
    eye = np.eye(d_in, dtype=np.float32)
    return {"W_enc": np.concatenate([eye, -eye], axis=1), "b_enc": np.zeros(2 * d_in, np.float32),
            "W_dec": np.concatenate([eye, -eye]), "b_dec": np.zeros(d_in, np.float32)}


def exact_sae(d_in, hook):  # -> a standard SAE whose reconstruction is its input
    return make_sae(exact_params(d_in), hook)


SAE_FIXTURES = FIXTURES / "sae"  # SAELens's folders and torch's numbers (scripts/fixtures/make_sae_reference.py)


def relative_error(ours, reference):  # -> max |ours - reference| over max |reference|
    return float(np.max(np.abs(ours - reference)) / np.max(np.abs(reference)))
