"""Build the fixtures for gpt2_numpy.explain from Hugging Face transformers, independent of our code.

For each config named in N_INPUTS it makes the seeded weights with `random_params`, copies them into a
`GPT2LMHeadModel` with eager attention (make_reference.hf_model: softmax(q kᵀ / √d_head + mask), the textbook
formula), runs it with `output_attentions=True` on the first tokens of make_reference's fixed sequence (so for "tiny"
the logits of reference_tiny.npz belong to the same tokens) and saves
tests/fixtures/reference_attention_<name>.npz: `inputs` (int64 [n_seq]) and `weights` (float32
[n_layer, n_head, n_seq, n_seq], HF's softmax attention probabilities, layer by layer), plus the tool versions.

For explain's trace and logit lens it also saves tests/fixtures/reference_trace_<name>.npz for each config of TRACE,
shapes the tests never tuned to (5 heads of 8; 3 heads of 16 on 3 layers; 7 heads of 4, one layer): `hparams`
(JSON), `seed`, `inputs`, and from one HF forward pass with `output_attentions` and forward hooks: `block_out`
(float32 [n_layer, n_seq, n_embd], each GPT2Block's output hidden states), `weights`, `ln_f` (the output of
transformer.ln_f) and `logits`.

Rerun (reference tools live in a venv outside the repo; they are never runtime dependencies), from the repo root:
    ../refvenv/bin/pip install --no-deps -e .
    ../refvenv/bin/python scripts/make_explain_reference.py
"""
import json

import numpy as np
import torch
import transformers

from make_reference import FIXTURES, fixed_inputs, hf_model
from gpt2_numpy.params import random_params

# name -> (hparams, seed, n_inputs); the configs of configs.json are the ones the model's tests were written against
TRACE = {
    "five_heads": ({"n_vocab": 300, "n_ctx": 40, "n_embd": 40, "n_head": 5, "n_layer": 3}, 11, 37),
    "three_heads": ({"n_vocab": 384, "n_ctx": 48, "n_embd": 48, "n_head": 3, "n_layer": 3}, 12, 48),
    "one_layer": ({"n_vocab": 257, "n_ctx": 24, "n_embd": 28, "n_head": 7, "n_layer": 1}, 13, 19),
}
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


@torch.no_grad()
def make_trace_reference(name, hparams, seed, n_inputs):  # -> None; writes reference_trace_<name>.npz
    model = hf_model(hparams, random_params(hparams, seed))
    inputs = np.random.default_rng(seed + 2000).integers(0, hparams["n_vocab"], n_inputs)
    captured = {"block_out": [], "ln_f": []}
    hooks = [block.register_forward_hook(lambda module, args, out: captured["block_out"].append(out[0] if
                                         isinstance(out, tuple) else out)) for block in model.transformer.h]
    hooks.append(model.transformer.ln_f.register_forward_hook(lambda module, args, out: captured["ln_f"].append(out)))
    out = model(torch.from_numpy(inputs)[None], output_attentions=True)
    for hook in hooks:
        hook.remove()
    arrays = {
        "block_out": torch.stack(captured["block_out"])[:, 0].numpy(),
        "weights": torch.stack(out.attentions)[:, 0].numpy(),
        "ln_f": captured["ln_f"][0][0].numpy(),
        "logits": out.logits[0].numpy(),
    }
    n_layer, n_head, n_embd = hparams["n_layer"], hparams["n_head"], hparams["n_embd"]
    assert arrays["block_out"].shape == (n_layer, n_inputs, n_embd), arrays["block_out"].shape
    assert arrays["weights"].shape == (n_layer, n_head, n_inputs, n_inputs), arrays["weights"].shape
    np.savez_compressed(
        FIXTURES / f"reference_trace_{name}.npz", hparams=np.array(json.dumps(hparams)), seed=np.array(seed),
        inputs=inputs, **arrays,
        versions=np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}"]),
    )
    print(f"{name}: {n_layer} layers of {n_head} heads, {n_inputs} tokens")


def main():
    torch.manual_seed(0)
    configs = json.loads((FIXTURES / "configs.json").read_text())
    for name in N_INPUTS:
        make_attention_reference(name, configs[name]["hparams"], configs[name]["seed"])
    for name, (hparams, seed, n_inputs) in TRACE.items():
        make_trace_reference(name, hparams, seed, n_inputs)


if __name__ == "__main__":
    main()
