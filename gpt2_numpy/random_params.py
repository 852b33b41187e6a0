"""Seeded random GPT-2 parameters in our layout, for tests, reference fixtures and benchmarks.

The scales are chosen so the model is far from trivial: attention scores have a standard deviation of about 3 (so a
wrong mask or head split changes the output visibly) and logits spread over several units (so argmax is stable).
Only `numpy.random.default_rng(seed).standard_normal(dtype=float32)` is used, so the numbers are the same everywhere.
"""
import math

import numpy as np


def random_params(hparams, seed=0):  # -> {"wte", "wpe", "blocks", "ln_f"} of float32 arrays
    """Seeded random weights in our params layout, scaled so that attention is neither uniform nor one-hot."""
    rng = np.random.default_rng(seed)
    n_embd, n_layer = hparams["n_embd"], hparams["n_layer"]

    def normal(*shape, std):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def norm():
        return {"g": 1 + normal(n_embd, std=0.1), "b": normal(n_embd, std=0.1)}

    def dense(n_in, n_out, std):
        return {"w": normal(n_in, n_out, std=std), "b": normal(n_out, std=0.1)}

    # q.k / sqrt(d_head) has std ~ std_qk^2 * n_embd for unit-variance inputs: pick std_qk for a spread of ~3
    std_qk = math.sqrt(3 / n_embd)
    blocks = [
        {
            "ln_1": norm(),
            "attn": {
                "c_attn": dense(n_embd, 3 * n_embd, std_qk),
                "c_proj": dense(n_embd, n_embd, 0.5 / math.sqrt(n_embd)),
            },
            "ln_2": norm(),
            "mlp": {
                "c_fc": dense(n_embd, 4 * n_embd, 1 / math.sqrt(n_embd)),
                "c_proj": dense(4 * n_embd, n_embd, 0.5 / math.sqrt(4 * n_embd)),
            },
        }
        for _ in range(n_layer)
    ]
    return {
        "wte": normal(hparams["n_vocab"], n_embd, std=2 / math.sqrt(n_embd)),
        "wpe": normal(hparams["n_ctx"], n_embd, std=0.5),
        "blocks": blocks,
        "ln_f": norm(),
    }
