"""Build the training reference fixtures from torch, an implementation independent of ours.

- tests/fixtures/reference_grads.npz: torch autograd's gradient of the mean next-token cross-entropy of HF's
  `GPT2LMHeadModel` (dropout off, gelu_new, layer_norm_epsilon 1e-5), for every parameter, on seeded `random_params`
  of a small config, for one sequence (shorter than the context, so some wpe rows get no gradient) and for a batch.
  Keys are `<case>/<param path>` with paths like `blocks/0/attn/c_attn/w` in our layout. wte's gradient is HF's tied
  one (the embedding's plus the output head's); `<case>/wte_embedding` is the embedding's share alone, from a second
  run that feeds `inputs_embeds` looked up from an untied copy of wte. `<case>/loss` is torch's loss.
- tests/fixtures/reference_adamw.npz: `torch.optim.AdamW` (betas 0.9, 0.95, eps 1e-8, weight decay 0.1 on the 2-D
  tensors only) after each of a few steps on seeded gradients, clipped by `torch.nn.utils.clip_grad_norm_` to 1.0,
  with a different rate each step.

The weights are not committed: tests regenerate them from the seed. Rerun with the reference venv (see
scripts/make_reference.py for its setup): ../refvenv/bin/python scripts/make_grad_reference.py
"""
import json
import sys
from pathlib import Path

from make_reference import SETUP, hf_model  # works without torch too: it says what is missing

try:  # the reference tools live in a venv of their own: without them, a run says what to install
    import numpy as np
    import torch
    import transformers

    from gpt2_numpy.params import flatten
    from gpt2_numpy.params import random_params
except ModuleNotFoundError as error:
    MISSING = error.name.partition(".")[0]
else:
    MISSING = None

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
GRAD_HPARAMS = {"n_vocab": 96, "n_ctx": 16, "n_embd": 32, "n_head": 4, "n_layer": 2}
GRAD_SEED = 5
GRAD_CASES = {"single": (12,), "batch": (3, 16)}  # input shapes
ADAMW_HPARAMS = {"n_vocab": 8, "n_ctx": 4, "n_embd": 4, "n_head": 2, "n_layer": 1}
ADAMW_SEED, ADAMW_LRS = 6, [1e-3, 3e-3, 6e-3, 2e-3, 5e-4]
ADAMW_GRAD_SCALES = [0.01, 1.0, 0.05, 3.0, 0.02]  # global norms below and above the clip of 1.0
BETAS, EPS, WEIGHT_DECAY, CLIP = (0.9, 0.95), 1e-8, 0.1, 1.0


def path_name(path):  # ("blocks", 0, "attn", "c_attn", "w") -> "blocks/0/attn/c_attn/w"
    return "/".join(str(part) for part in path)


def hf_names(n_layer):  # our param path -> the HF module parameter that holds it
    names = {"wte": "transformer.wte.weight", "wpe": "transformer.wpe.weight",
             "ln_f/g": "transformer.ln_f.weight", "ln_f/b": "transformer.ln_f.bias"}
    parts = {"ln_1": "ln_1", "ln_2": "ln_2", "attn/c_attn": "attn.c_attn", "attn/c_proj": "attn.c_proj",
             "mlp/c_fc": "mlp.c_fc", "mlp/c_proj": "mlp.c_proj"}
    for i in range(n_layer):
        for ours, theirs in parts.items():
            first, second = ("g", "b") if ours.startswith("ln") else ("w", "b")
            names[f"blocks/{i}/{ours}/{first}"] = f"transformer.h.{i}.{theirs}.weight"
            names[f"blocks/{i}/{ours}/{second}"] = f"transformer.h.{i}.{theirs}.bias"
    return names


def mean_cross_entropy(logits, targets):  # torch [..., n_vocab], [...] -> the mean over every position
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def grad_case(model, inputs, targets):  # -> {"loss": torch's loss, path: torch's gradient}
    inputs, targets = np.atleast_2d(inputs), np.atleast_2d(targets)  # HF takes [batch, n_seq] only
    model.zero_grad()
    loss = mean_cross_entropy(model(torch.from_numpy(inputs)).logits, torch.from_numpy(targets))
    loss.backward()
    by_name = dict(model.named_parameters())
    grads = {path: by_name[name].grad.numpy().copy() for path, name in hf_names(model.config.n_layer).items()}
    grads["loss"] = loss.detach().numpy()

    model.zero_grad()  # again, with the lookup from an untied copy of wte: its gradient is the embedding's share
    untied = model.transformer.wte.weight.detach().clone().requires_grad_(True)
    embeds = torch.nn.functional.embedding(torch.from_numpy(inputs), untied)
    mean_cross_entropy(model(inputs_embeds=embeds).logits, torch.from_numpy(targets)).backward()
    grads["wte_embedding"] = untied.grad.numpy().copy()
    head = model.transformer.wte.weight.grad.numpy()
    assert np.allclose(head + grads["wte_embedding"], grads["wte"], atol=1e-6), "the two runs disagree"
    return grads


def make_grad_reference():
    params = random_params(GRAD_HPARAMS, GRAD_SEED)
    model = hf_model(GRAD_HPARAMS, params)
    rng = np.random.default_rng(GRAD_SEED + 1000)
    arrays = {"hparams": np.array(json.dumps(GRAD_HPARAMS)), "seed": np.array(GRAD_SEED)}
    for case, shape in GRAD_CASES.items():
        inputs, targets = (rng.integers(0, GRAD_HPARAMS["n_vocab"], shape) for _ in range(2))
        arrays.update({f"{case}/inputs": inputs, f"{case}/targets": targets})
        for path, grad in grad_case(model, inputs, targets).items():  # and the loss
            arrays[f"{case}/{path}"] = grad
        print(f"{case}: inputs {shape}, |wte grad| max {np.abs(arrays[f'{case}/wte']).max():.2e}, "
              f"embedding share max {np.abs(arrays[f'{case}/wte_embedding']).max():.2e}")
    save(FIXTURES / "reference_grads.npz", arrays)


def make_adamw_reference():
    params = dict(flatten(random_params(ADAMW_HPARAMS, ADAMW_SEED)))
    tensors = {path: torch.tensor(array, requires_grad=True) for path, array in params.items()}
    decay = [t for t in tensors.values() if t.ndim >= 2]  # the matrices and embeddings
    no_decay = [t for t in tensors.values() if t.ndim < 2]  # biases and layer-norm gains
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=ADAMW_LRS[0], betas=BETAS, eps=EPS)
    rng = np.random.default_rng(ADAMW_SEED + 1000)
    arrays = {"hparams": np.array(json.dumps(ADAMW_HPARAMS)), "seed": np.array(ADAMW_SEED), "lrs": np.array(ADAMW_LRS)}
    for step, (lr, scale) in enumerate(zip(ADAMW_LRS, ADAMW_GRAD_SCALES)):
        for path, tensor in tensors.items():
            grad = (rng.standard_normal(tensor.shape) * scale).astype(np.float32)
            arrays[f"grads/{step}/{path_name(path)}"] = grad
            tensor.grad = torch.from_numpy(grad.copy())
        norm = torch.nn.utils.clip_grad_norm_(list(tensors.values()), CLIP)
        arrays[f"norm/{step}"] = norm.numpy()
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        for path, tensor in tensors.items():
            arrays[f"params/{step}/{path_name(path)}"] = tensor.detach().numpy().copy()
    print(f"adamw: {len(ADAMW_LRS)} steps, gradient norms {[float(arrays[f'norm/{s}']) for s in range(5)]}")
    save(FIXTURES / "reference_adamw.npz", arrays)


def save(path, arrays):
    arrays["versions"] = np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}"])
    np.savez_compressed(path, **arrays)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")


def main():
    if MISSING:
        sys.exit(f"error: {MISSING} is missing from {sys.executable}: {SETUP}")
    torch.manual_seed(0)
    make_grad_reference()
    make_adamw_reference()


if __name__ == "__main__":
    main()
