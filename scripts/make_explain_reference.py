"""Build the attention-weight fixtures for gpt2_numpy.explain from Hugging Face transformers, independent of our code.

For each config named in N_INPUTS it makes the seeded weights with `random_params`, copies them into a
`GPT2LMHeadModel` with eager attention (make_reference.hf_model: softmax(q kᵀ / √d_head + mask), the textbook
formula), runs it with `output_attentions=True` on the first tokens of make_reference's fixed sequence (so for "tiny"
the logits of reference_tiny.npz belong to the same tokens) and saves
tests/fixtures/reference_attention_<name>.npz: `inputs` (int64 [n_seq]) and `weights` (float32
[n_layer, n_head, n_seq, n_seq], HF's softmax attention probabilities, layer by layer), plus the tool versions.

Rerun (reference tools live in a venv outside the repo; they are never runtime dependencies), from the repo root:
    ../refvenv/bin/pip install --no-deps -e .
    ../refvenv/bin/python scripts/make_explain_reference.py
"""
import json

import numpy as np
import torch
import transformers

from make_reference import FIXTURES, fixed_inputs, hf_model
from gpt2_numpy.random_params import random_params

# long enough for a printed corner to be cut (more than explain.SHOWN), short enough to keep the files small;
# odd_heads (3 heads of 16) takes an odd length
N_INPUTS = {"tiny": 40, "odd_heads": 29}


@torch.no_grad()
def make_attention_reference(name, hparams, seed):  # -> None; writes reference_attention_<name>.npz
    model = hf_model(hparams, random_params(hparams, seed))  # eager attention: the only one that returns weights
    inputs = fixed_inputs(name, hparams, seed)[: N_INPUTS[name]]
    out = model(torch.from_numpy(inputs)[None], output_attentions=True)
    weights = torch.stack(out.attentions)[:, 0].numpy()  # n_layer x [1, n_head, n_seq, n_seq] -> one array
    assert weights.shape == (hparams["n_layer"], hparams["n_head"], len(inputs), len(inputs)), weights.shape
    np.savez_compressed(
        FIXTURES / f"reference_attention_{name}.npz", inputs=inputs, weights=weights,
        versions=np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}"]),
    )
    print(f"{name}: weights {weights.shape}, largest above the diagonal {np.triu(weights, 1).max()}, largest "
          f"|row sum - 1| {np.abs(weights.sum(-1) - 1).max():.1e}")


def main():
    torch.manual_seed(0)
    configs = json.loads((FIXTURES / "configs.json").read_text())
    for name in N_INPUTS:
        make_attention_reference(name, configs[name]["hparams"], configs[name]["seed"])


if __name__ == "__main__":
    main()
