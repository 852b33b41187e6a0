"""Build the fixtures for `explain --heads` from Hugging Face transformers, independent of our code.

For each config of CONFIGS (shapes the head scores were never tuned to: 2 layers of 3 heads with a byte-level
vocabulary whose <|endoftext|> is the last id, and 3 layers of 5 heads with <|endoftext|> elsewhere), it makes the
seeded weights with `random_params`, copies them into a `GPT2LMHeadModel` with eager attention
(make_reference.hf_model), and runs it with `output_attentions=True` on two sequences of its own choosing:
a random prompt, and <|endoftext|> R R with R a random sequence of L tokens without <|endoftext|>, L the longest up to
50 that fits the context (31 for the first config, 50 for the second). It saves
tests/fixtures/reference_heads_<name>.npz:
`hparams` (JSON), `seed`, `eot_id`, `prompt_ids`, `repeated_ids` (int64), `prompt_weights` and `repeated_weights`
(float32 [n_layer, n_head, n_seq, n_seq], HF's softmax attention probabilities), and the tool versions.
tests/test_explain_heads.py computes the five head scores from these with its own numpy and compares them with ours.

Rerun (reference tools live in a venv outside the repo; they are never runtime dependencies), from the repo root:
    ../refvenv/bin/pip install --no-deps -e .
    ../refvenv/bin/python scripts/make_heads_reference.py
"""
import json

import numpy as np
import torch
import transformers

from make_reference import FIXTURES, hf_model
from gpt2_numpy.params import random_params

# name -> (hparams, seed, <|endoftext|>'s id, prompt length)
CONFIGS = {
    "three_heads": ({"n_vocab": 257, "n_ctx": 64, "n_embd": 24, "n_head": 3, "n_layer": 2}, 21, 256, 23),
    "five_heads": ({"n_vocab": 300, "n_ctx": 128, "n_embd": 40, "n_head": 5, "n_layer": 3}, 22, 7, 41),
}


@torch.no_grad()
def attentions(model, ids):  # -> float32 [n_layer, n_head, n_seq, n_seq], HF's attention probabilities
    out = model(torch.from_numpy(ids)[None], output_attentions=True)
    return torch.stack(out.attentions)[:, 0].numpy()


def make(name, hparams, seed, eot_id, n_prompt):  # -> None; writes reference_heads_<name>.npz
    model = hf_model(hparams, random_params(hparams, seed))
    rng = np.random.default_rng(seed + 3000)
    prompt_ids = rng.integers(0, hparams["n_vocab"], n_prompt)
    length = min(50, (hparams["n_ctx"] - 1) // 2)
    others = np.array([token_id for token_id in range(hparams["n_vocab"]) if token_id != eot_id])
    sequence = rng.choice(others, length)
    repeated_ids = np.concatenate([[eot_id], sequence, sequence])
    arrays = {"prompt_weights": attentions(model, prompt_ids), "repeated_weights": attentions(model, repeated_ids)}
    np.savez_compressed(
        FIXTURES / f"reference_heads_{name}.npz", hparams=np.array(json.dumps(hparams)), seed=np.array(seed),
        eot_id=np.array(eot_id), prompt_ids=prompt_ids, repeated_ids=repeated_ids, **arrays,
        versions=np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}"]),
    )
    print(f"{name}: {hparams['n_layer']} layers of {hparams['n_head']} heads, a prompt of {n_prompt} tokens, "
          f"L = {length}; weights {arrays['repeated_weights'].shape}")


def main():
    torch.manual_seed(0)
    for name, config in CONFIGS.items():
        make(name, *config)


if __name__ == "__main__":
    main()
