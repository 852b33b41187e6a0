"""Writing a model folder in Hugging Face's layout, which `transformers.GPT2LMHeadModel.from_pretrained(folder)` and our
own loader (gpt2_numpy.formats.checkpoint) both read:

    model.safetensors   float32 tensors under Hugging Face's names ("transformer.h.3.mlp.c_fc.weight"); no lm_head,
                        which GPT-2 ties to wte
    config.json         GPT2Config's fields: the sizes, GPT-2's fixed choices (tanh GELU, eps 1e-5, tied head) and the
                        tokenizer's <|endoftext|> id
    vocab.json, merges.txt   the tokenizer (OpenAI's encoder.json and vocab.bpe hold the same text under other names)

Every file is written whole or not at all (gpt2_numpy/disk.py's atomic_write), so a crash or Ctrl-C midway leaves
either the old file or the new one, never half of one.
"""
import json
from pathlib import Path

from gpt2_numpy.disk import atomic_write
from gpt2_numpy.params import flatten
from gpt2_numpy.errors import TokenizerError
from gpt2_numpy.formats.safetensors import write_safetensors
from gpt2_numpy.formats.vocabulary import EOT, FILE_NAMES, read_encoder

LEAF_NAMES = {"w": "weight", "g": "weight", "b": "bias"}  # ours -> Hugging Face's (a norm's gain is its weight)


def save_model(folder, hparams, params, tokenizer_dir, metadata=None):  # -> None: folder holds a complete model
    """Write params and hparams as model.safetensors + config.json, and copy the tokenizer files from tokenizer_dir
    (either layout) as vocab.json + merges.txt; None: folder holds them already. metadata ({str: str}) goes into the
    safetensors header."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is not None:
        copy_tokenizer(tokenizer_dir, folder)
    tensors = {hf_name(key): array for key, array in flatten(params)}
    config = hf_config(hparams, end_of_text_id(folder, hparams["n_vocab"]))
    atomic_write(folder / "config.json", lambda file: file.write(json.dumps(config, indent=2).encode()))
    # "format": "pt" tells transformers which framework's layout the tensors follow; it refuses files without it
    atomic_write(folder / "model.safetensors", lambda file: write_safetensors(file, tensors, {"format": "pt",
                                                                                             **(metadata or {})}))


def hf_name(key):  # our key path, e.g. ("blocks", 3, "mlp", "c_fc", "w") -> "transformer.h.3.mlp.c_fc.weight"
    if key in (("wte",), ("wpe",)):
        return f"transformer.{key[0]}.weight"
    *module, leaf = key
    if module[0] == "blocks":
        module = ["h", *module[1:]]
    return "transformer." + ".".join(map(str, module)) + "." + LEAF_NAMES[leaf]


def end_of_text_id(folder, n_vocab):  # -> the id of <|endoftext|> in folder's vocab.json; None: not in the model
    # the tokenizer's own: GPT-2's and ours put it last, Hugging Face's BpeTrainer first (0). A model that reads only
    # the first n_vocab ids of a larger vocabulary never produces it, so generation has no end-of-text id to stop at
    eot_id = read_encoder(folder / FILE_NAMES["Hugging Face"][0])[EOT]
    return eot_id if eot_id < n_vocab else None


def hf_config(hparams, eot_id):  # -> GPT2Config's fields for a GPT-2 of these sizes and this end-of-text id
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": hparams["n_vocab"],
        "n_positions": hparams["n_ctx"],
        "n_embd": hparams["n_embd"],
        "n_layer": hparams["n_layer"],
        "n_head": hparams["n_head"],
        "activation_function": "gelu_new",  # transformers' name for GPT-2's tanh approximation
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "bos_token_id": eot_id,  # <|endoftext|> both starts and ends a text, as in GPT-2's training data
        "eos_token_id": eot_id,
    }


def copy_tokenizer(source_dir, folder):  # -> None: folder holds vocab.json + merges.txt, from either layout
    source_dir, folder = Path(source_dir), Path(folder)
    hf_names = FILE_NAMES["Hugging Face"]
    for names in FILE_NAMES.values():
        if (source_dir / names[0]).is_file():
            for name, hf in zip(names, hf_names):
                data = (source_dir / name).read_bytes()  # 1.5 MB in all
                atomic_write(folder / hf, lambda file: file.write(data))
            return
    raise TokenizerError(f"no vocabulary in {source_dir}: expected {' or '.join(map(' + '.join, FILE_NAMES.values()))}")
