"""Build the reference fixtures from Hugging Face transformers, an implementation independent of ours.

For every config in tests/fixtures/configs.json it makes the seeded weights with `random_params`, copies them into a
`GPT2LMHeadModel` module by module, runs it on a fixed token sequence and saves what HF computed:

- tests/fixtures/reference_<name>.npz: `inputs`, `logits` (for 124M only the rows in `positions`, to stay small), and
  for "tiny" also `greedy_prompt` and `greedy_ids` from `generate(do_sample=False)`.
- tests/fixtures/hf_tiny/: "tiny" written by `save_pretrained` (names carry the `transformer.` prefix).
- tests/fixtures/hf_tiny_hub/: "tiny" in the hub's style (no prefix, with the `h.N.attn.bias` mask buffers).
- tests/fixtures/reference_batch.npz: HF's batched greedy `generate` on "tiny" for prompts of different lengths,
  left-padded with an `attention_mask`, with and without an end-of-text stand-in that stops one row early.

The weights themselves are not committed: tests regenerate them from the seed.

Rerun (reference tools live in a venv outside the repo; they are never runtime dependencies):
    python3 -m venv ../refvenv
    ../refvenv/bin/pip install torch==2.13.0 && ../refvenv/bin/pip install transformers safetensors
    ../refvenv/bin/pip install --no-deps -e .
    ../refvenv/bin/python scripts/make_reference.py [--only logits|batch]
"""
import argparse
import json
from pathlib import Path

import sys

try:  # the reference tools live in a venv of their own: without them, --help still works and a run says what to install
    import numpy as np
    import safetensors.numpy
    import torch
    import transformers

    from gpt2_numpy.params import random_params
except ModuleNotFoundError as error:
    MISSING = error.name.partition(".")[0]  # the package to install, not its submodule
else:
    MISSING = None

SETUP = ("run this script in a venv with the reference tools and gpt2_numpy, made from the repo root with: python3 -m "
         "venv ../refvenv && ../refvenv/bin/pip install torch==2.13.0 && ../refvenv/bin/pip install transformers "
         "safetensors -e .")

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
N_INPUTS = {"tiny": 64, "odd_heads": 48, "124M": 128}  # tiny and odd_heads fill their whole context
POSITIONS_124M = [0, 1, 63, 127]
GREEDY_PROMPT_LEN, GREEDY_NEW_TOKENS = 8, 24
CLI_PROMPT_IDS, CLI_NEW_TOKENS = [40, 481, 467, 284, 262], 20  # "I will go to the": all ids fit the tiny vocabulary
BATCH_LENGTHS, BATCH_NEW_TOKENS = [1, 4, 9, 16], 12  # ragged prompts for batched generation


def hf_model(hparams, params, attn_implementation="eager"):  # our layout -> GPT2LMHeadModel with the same numbers
    config = transformers.GPT2Config(
        vocab_size=hparams["n_vocab"],
        n_positions=hparams["n_ctx"],
        n_embd=hparams["n_embd"],
        n_layer=hparams["n_layer"],
        n_head=hparams["n_head"],
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        # GPT-2's <|endoftext|> id exists only in the full vocabulary
        bos_token_id=50256 if hparams["n_vocab"] > 50256 else None,
        eos_token_id=50256 if hparams["n_vocab"] > 50256 else None,
    )
    config._attn_implementation = attn_implementation  # eager: the textbook formula, for the reference logits
    model = transformers.GPT2LMHeadModel(config).eval()
    t = model.transformer

    def put(param, array):
        assert tuple(param.shape) == array.shape, (tuple(param.shape), array.shape)
        param.data.copy_(torch.from_numpy(np.ascontiguousarray(array)))

    def put_norm(module, norm):
        put(module.weight, norm["g"])
        put(module.bias, norm["b"])

    def put_dense(module, dense):  # HF's Conv1D stores weights [in, out], as OpenAI and we do
        put(module.weight, dense["w"])
        put(module.bias, dense["b"])

    put(t.wte.weight, params["wte"])
    put(t.wpe.weight, params["wpe"])
    for hf_block, block in zip(t.h, params["blocks"]):
        put_norm(hf_block.ln_1, block["ln_1"])
        put_dense(hf_block.attn.c_attn, block["attn"]["c_attn"])
        put_dense(hf_block.attn.c_proj, block["attn"]["c_proj"])
        put_norm(hf_block.ln_2, block["ln_2"])
        put_dense(hf_block.mlp.c_fc, block["mlp"]["c_fc"])
        put_dense(hf_block.mlp.c_proj, block["mlp"]["c_proj"])
    put_norm(t.ln_f, params["ln_f"])
    assert model.lm_head.weight.data_ptr() == t.wte.weight.data_ptr(), "lm_head must be tied to wte"
    return model


def fixed_inputs(name, hparams, seed):  # -> int64 [n_seq]
    return np.random.default_rng(seed + 1000).integers(0, hparams["n_vocab"], N_INPUTS[name])


def make_reference(name, hparams, seed):
    params = random_params(hparams, seed)
    model = hf_model(hparams, params)
    inputs = fixed_inputs(name, hparams, seed)
    logits = model(torch.from_numpy(inputs)[None]).logits[0].numpy()
    arrays = {"inputs": inputs, "logits": logits}
    if name == "124M":
        arrays = {"inputs": inputs, "positions": np.array(POSITIONS_124M), "logits": logits[POSITIONS_124M]}
    if name == "tiny":
        prompt = inputs[:GREEDY_PROMPT_LEN]
        arrays.update(greedy_prompt=prompt, greedy_ids=hf_greedy(model, prompt, GREEDY_NEW_TOKENS))
        cli_prompt = np.array(CLI_PROMPT_IDS)
        arrays.update(cli_prompt=cli_prompt, cli_greedy_ids=hf_greedy(model, cli_prompt, CLI_NEW_TOKENS))
        save_hf_fixtures(model, hparams)
    arrays["versions"] = np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}"])
    np.savez_compressed(FIXTURES / f"reference_{name}.npz", **arrays)
    print(f"{name}: logits {logits.shape}, |logit| max {np.abs(logits).max():.2f}")


def hf_greedy(model, prompt, n_new):  # int [n_prompt] -> the n_new ids HF's greedy search appends
    out = model.generate(
        torch.from_numpy(prompt)[None],
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False,
        max_new_tokens=n_new,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].numpy()


def save_hf_fixtures(model, hparams):
    model.save_pretrained(FIXTURES / "hf_tiny", safe_serialization=True)
    hub_dir = FIXTURES / "hf_tiny_hub"
    hub_dir.mkdir(exist_ok=True)
    tensors = {name: tensor.numpy() for name, tensor in model.transformer.state_dict().items()}
    n_ctx = hparams["n_ctx"]
    causal = np.tril(np.ones((n_ctx, n_ctx), np.float32))[None, None]  # the hub's files carry this buffer per layer
    tensors.update({f"h.{i}.attn.bias": causal for i in range(hparams["n_layer"])})
    safetensors.numpy.save_file(tensors, hub_dir / "model.safetensors", metadata={"format": "pt"})
    (hub_dir / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2))


def make_batch_reference(hparams, seed):  # HF's batched greedy search, left padding and attention_mask, on "tiny"
    model = hf_model(hparams, random_params(hparams, seed))
    rng = np.random.default_rng(seed + 2000)
    prompts = [rng.integers(0, hparams["n_vocab"], n) for n in BATCH_LENGTHS]
    ids, margins = hf_batch_greedy(model, prompts, eos_id=None)
    # an end-of-text stand-in that stops one row early and no other: an id above 256 (Python caches small ints, so
    # `is` would pass where `==` is meant) that one row reaches mid-way and no other row ever chooses
    eos_id = next(int(token) for row in range(len(prompts)) for step, token in enumerate(ids[row])
                  if 2 <= step < BATCH_NEW_TOKENS - 2 and token > 256 and token not in ids[row, :step]
                  and not any(token in other for k, other in enumerate(ids) if k != row))
    eos_ids, _ = hf_batch_greedy(model, prompts, eos_id=eos_id)
    np.savez_compressed(
        FIXTURES / "reference_batch.npz",
        prompts=np.array([np.pad(p, (max(BATCH_LENGTHS) - len(p), 0), constant_values=-1) for p in prompts]),
        greedy_ids=ids, eos_id=np.array(eos_id), eos_greedy_ids=eos_ids,
        versions=np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}"]),
    )
    print(f"batch: greedy ids {ids.shape}, smallest top-1 - top-2 logit margin {margins.min():.3f}")


def hf_batch_greedy(model, prompts, eos_id):  # -> ids [n_rows, n_new] (-1 after a row's end), margins [n_rows, n_new]
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor(np.array([np.pad(p, (width - len(p), 0)) for p in prompts]))
    attention_mask = torch.tensor(np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts]))
    out = model.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=BATCH_NEW_TOKENS,
                         min_new_tokens=0, eos_token_id=eos_id, pad_token_id=-1 if eos_id is None else eos_id,
                         output_scores=True, return_dict_in_generate=True)
    ids = out.sequences[:, width:].numpy()
    if eos_id is not None:  # HF pads a finished row with the pad id (here the end-of-text id): mark it -1 instead
        ended = np.cumsum(ids == eos_id, axis=1) - (ids == eos_id) > 0
        ids = np.where(ended, -1, ids)
    top2 = np.sort(torch.stack(out.scores, 1).numpy(), axis=-1)[..., -2:]
    return ids, top2[..., 1] - top2[..., 0]


def main():
    parser = argparse.ArgumentParser(description="Build the reference fixtures from Hugging Face transformers.")
    parser.add_argument("--only", choices=["logits", "batch"], help="build only these fixtures (default: all)")
    args = parser.parse_args()
    if MISSING:
        sys.exit(f"error: {MISSING} is missing from {sys.executable}: {SETUP}")
    torch.manual_seed(0)
    torch.set_grad_enabled(False)  # references only: no autograd graphs
    configs = json.loads((FIXTURES / "configs.json").read_text())
    if args.only in (None, "logits"):
        for name, config in configs.items():
            make_reference(name, config["hparams"], config["seed"])
    if args.only in (None, "batch"):
        make_batch_reference(configs["tiny"]["hparams"], configs["tiny"]["seed"])


if __name__ == "__main__":
    main()
