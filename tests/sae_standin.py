"""A stand-in for interpret/sae.py's SAE, for the feature tests until the SAE core is merged: make_sae builds the real
class when gpt2_numpy.interpret.sae has it, else this minimal one with the same contract (.cfg, .params, .hook, .d_in,
.d_sae, .encode, .decode). The lead removes the stand-in at merge; make_sae stays."""
import numpy as np

try:
    from gpt2_numpy.interpret.sae import SAE
except ImportError:  # the SAE core is not merged yet
    SAE = None


class StandInSAE:  # standard (ReLU) and topk only: what the feature tests use
    def __init__(self, cfg, params, hook):
        self.cfg, self.params, self.hook = cfg, params, hook
        self.d_in, self.d_sae = params["W_enc"].shape

    def encode(self, x):  # [..., d_in] -> [..., d_sae]
        p = self.params
        pre = (np.asarray(x, np.float32) - p["b_dec"]) @ p["W_enc"] + p["b_enc"]
        if self.cfg["architecture"] == "topk":
            kept = np.zeros_like(pre)
            top = np.argsort(-pre, axis=-1)[..., : self.cfg["k"]]
            np.put_along_axis(kept, top, np.take_along_axis(pre, top, axis=-1), axis=-1)
            pre = kept
        return np.maximum(pre, 0)

    def decode(self, f):  # [..., d_sae] -> [..., d_in]
        return np.asarray(f, np.float32) @ self.params["W_dec"] + self.params["b_dec"]


def make_sae(params, hook, architecture="standard", k=None):  # -> an SAE (the real one when merged) from arrays
    cfg = {"architecture": architecture, "d_in": params["W_enc"].shape[0], "d_sae": params["W_enc"].shape[1],
           "apply_b_dec_to_input": True, "normalize_activations": "none", "metadata": {"hook_name": hook}}
    if k is not None:
        cfg["k"] = k
    params = {name: np.asarray(value, np.float32) for name, value in params.items()}
    return (SAE or StandInSAE)(cfg, params, hook)


def random_sae(d_in, d_sae, hook, seed=0, architecture="standard", k=None):  # -> an SAE with seeded random weights
    rng = np.random.default_rng(seed)
    return make_sae({"W_enc": rng.standard_normal((d_in, d_sae)) / np.sqrt(d_in),
                     "b_enc": rng.standard_normal(d_sae) * 0.1,
                     "W_dec": rng.standard_normal((d_sae, d_in)) / np.sqrt(d_in),
                     "b_dec": rng.standard_normal(d_in) * 0.1}, hook, architecture, k)
