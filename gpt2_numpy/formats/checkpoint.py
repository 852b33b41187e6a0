"""GPT-2 weights from a model folder into our params layout: OpenAI's TensorFlow checkpoint or Hugging Face
safetensors, read by this package's readers and the file helpers beside them.

Either way the result is (hparams, params) with OpenAI's key names, weights [in, out] and float32 arrays. TF and F32
safetensors arrays are read-only views of the memory-mapped files: loading is nearly free and pages are read on use.
"""
import os
import re
from functools import partial
from pathlib import Path

import numpy as np

from gpt2_numpy.errors import CheckpointError
from gpt2_numpy.formats import SETTINGS_LIMIT, describe, parse_json, read_file, shown, unreadable
from gpt2_numpy.formats.safetensors import read_safetensors, to_float32
from gpt2_numpy.formats.tf_bundle import TensorBundle
from gpt2_numpy.formats.vocabulary import check_model_vocabulary, vocabulary_files
from gpt2_numpy.params import block_shapes, nest, top_shapes

OPENAI_FILES = ("checkpoint", "hparams.json", "model.ckpt.index", "model.ckpt.data-00000-of-00001")
HF_FILES = ("model.safetensors", "config.json")
SAE_FILES = ("cfg.json", "sae_weights.safetensors")  # SAELens's SAE folder (interpret/sae_files.py), not a model
FOLDER_KINDS = {"model": f"a GPT-2 model folder ({', '.join(HF_FILES)}, or OpenAI's {OPENAI_FILES[0]} files)",
                "sae": f"an SAE folder ({', '.join(SAE_FILES)})"}
HPARAM_NAMES = {  # the hparams file's own key -> ours
    "hparams.json": {key: key for key in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer")},
    "config.json": {"vocab_size": "n_vocab", "n_positions": "n_ctx", "n_embd": "n_embd", "n_head": "n_head",
                    "n_layer": "n_layer"},
}
# OpenAI names tensors "model/h3/mlp/c_fc/w"; Hugging Face "transformer.h.3.mlp.c_fc.weight", or without "transformer."
# (DOTALL: a name from a damaged file may hold a newline; at most 9 digits: a layer number always fits an int)
FOREIGN_NAME = re.compile(r"(?:model/|transformer\.)?(?:h\.?([0-9]{1,9})[./])?(.*)", re.DOTALL)
# (module, leaf) pairs to skip: Hugging Face's causal-mask buffers
SKIPPED = {("attn", "bias"), ("attn", "masked_bias")}
LM_HEAD = ("lm_head",)  # Hugging Face's output layer: GPT-2 ties it to wte, so a file may hold it only as wte's copy
# config.json's options that change the math: the values this code computes (GPT-2's, which are also Hugging Face's
# defaults, so an absent key is the first) and what they compute. reorder_and_upcast_attn is not among them: it only
# reorders attention's float32 math, which transformers measures as the same (tests/fixtures/config_options.json)
OPTIONS = {
    # transformers' three names of that one formula: gelu_fast writes sqrt(2/pi) as 0.7978845608 and factors out x
    "activation_function": (("gelu_new", "gelu_pytorch_tanh", "gelu_fast"), "GPT-2's tanh approximation of GELU"),
    "layer_norm_epsilon": ((1e-5,), "GPT-2's layer norm"),
    "scale_attn_weights": ((True,), "attention scores divided by the square root of the head size, as GPT-2's"),
    "scale_attn_by_inverse_layer_idx": ((False,), "GPT-2's attention, the same scale in every layer"),
    "tie_word_embeddings": ((True,), "the logits from the token embeddings: GPT-2's output layer, tied to them"),
}


def load_params(model_dir, verify=False, n_tokens=None):  # -> (hparams, params)
    """Load the checkpoint in model_dir; verify=True also checks every tensor's CRC32C (TF checkpoints; safetensors
    files are always checked for structure and have no checksums). n_tokens: the size of the vocabulary beside the
    weights, checked against n_vocab before any tensor is read. Raises CheckpointError naming what is wrong."""
    model_dir = Path(model_dir)
    present = files_in(model_dir, ("checkpoint", "model.safetensors", "pytorch_model.bin"))
    # two models, or one and a stale other: which is meant cannot be told. No file is to blame (a download deletes none)
    if {"checkpoint", "model.safetensors"} <= present:
        raise CheckpointError(f"{model_dir} holds two models, OpenAI's (checkpoint, {', '.join(OPENAI_FILES[1:])}) "
                              f"and Hugging Face's ({', '.join(HF_FILES)}): move one of them to a folder of its own")
    if "checkpoint" in present:
        hparams_path, weights_path, tensors = open_openai(model_dir, verify)
    elif "model.safetensors" in present:
        hparams_path, weights_path, tensors = open_hf(model_dir)
    elif "pytorch_model.bin" in present:
        raise CheckpointError(f"{model_dir} holds only pytorch_model.bin, a pickle (which could run any code), and "
                              "pickles are never loaded; download the model's model.safetensors instead")
    else:
        raise CheckpointError(f"{model_dir} holds no GPT-2 checkpoint: expected {', '.join(OPENAI_FILES)} (OpenAI) or "
                              f"{' and '.join(HF_FILES)} (Hugging Face); download the model there first")
    hparams = read_hparams(hparams_path)
    if n_tokens is not None:
        vocab = vocabulary_files(model_dir)[0]
        check_model_vocabulary(n_tokens, hparams["n_vocab"], vocab, files=(vocab, hparams_path))
    return hparams, to_params(tensors, hparams, Path(weights_path), hparams_path)


def folder_kind(folder):  # -> "model", "sae" (FOLDER_KINDS's) or None: what the files in folder make it
    present = files_in(Path(folder), ("checkpoint", HF_FILES[0], SAE_FILES[1]))
    return "model" if present & {"checkpoint", HF_FILES[0]} else "sae" if present else None


def files_in(model_dir, names):  # -> the names present in model_dir; CheckpointError if it cannot be read
    try:  # a FIFO or a folder under a model file's name is refused by the reader, naming it
        return {name for name in names if (model_dir / name).exists()}
    except OSError as error:
        raise unreadable(model_dir, error) from None


def verify_checkpoint(model_dir):  # -> None, or raises CheckpointError
    """Check every tensor of the checkpoint in model_dir: CRC32C (TF) or full structure (safetensors), and shapes."""
    load_params(model_dir, verify=True)


def open_openai(model_dir, verify):  # -> (hparams path, index path, {tensor name: (shape, loader)})
    bundle = TensorBundle(checkpoint_prefix(model_dir))
    tensors = {name: (entry.shape, partial(bundle.read, name, verify)) for name, entry in bundle.entries.items()}
    return model_dir / "hparams.json", bundle.index_path, tensors


def open_hf(model_dir):  # -> (config path, safetensors path, {tensor name: (shape, loader)})
    path = model_dir / "model.safetensors"
    tensors = {name: (tensor.shape, partial(to_float32, path, name, tensor))
               for name, tensor in read_safetensors(path).items()}
    return model_dir / "config.json", path, tensors


def checkpoint_prefix(model_dir):  # -> the path prefix the "checkpoint" file names, e.g. model_dir/"model.ckpt"
    """The prefix must lie in model_dir and have an index there; CheckpointError naming the checkpoint file if not."""
    path = model_dir / "checkpoint"
    text = read_file(path, SETTINGS_LIMIT).decode(errors="replace")
    match = re.search(r'^model_checkpoint_path:\s*"([^"]+)"', text, re.MULTILINE)
    if not match:
        raise CheckpointError(f"{path} names no model_checkpoint_path; download the model again", files=(path,))
    name = match.group(1)
    if not name.isprintable():  # a NUL would fail every file call; a line break would split our messages
        raise CheckpointError(f"{path} names the checkpoint {shown(name)}, which holds unprintable characters; "
                              "download the model again", files=(path,))
    prefix = model_dir / name  # relative to the folder, as TensorFlow does; an absolute path stays as it is
    index = Path(f"{prefix}.index")
    # The file may come from a mirror: it must not make us read files outside the folder, by an absolute path, by ".."
    # or through a symlinked folder. The data files themselves may be symlinks: only a user can make those.
    if not inside(index.parent, model_dir):
        raise CheckpointError(f"{path} names the checkpoint {shown(name)}, outside {model_dir}; only a checkpoint in "
                              "the model folder is loaded: download the model again", files=(path,))
    if not os.path.lexists(index):  # say which file chose the name, or a damaged one would stay hidden
        raise CheckpointError(f"{index} is missing ({path} names the checkpoint {shown(name)}); download the model "
                              "again", files=(path,))
    return prefix


def inside(folder, model_dir):  # -> True when folder, symlinks followed, is model_dir or a folder below it
    try:
        folder, model_dir = folder.resolve(), model_dir.resolve()
    except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13)
        return False
    return folder == model_dir or model_dir in folder.parents


def read_hparams(path):  # -> our hparams, from OpenAI's hparams.json or Hugging Face's config.json
    key_names = HPARAM_NAMES[path.name]
    try:
        config = parse_json(read_file(path, SETTINGS_LIMIT))
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors too
        raise CheckpointError(f"{path} is not valid JSON ({error}); download the model again", files=(path,)) from None
    missing = [key for key in key_names if not isinstance(config, dict) or key not in config]
    if missing:
        raise CheckpointError(f"{path} lacks the hyperparameter {missing[0]!r}; download the model again",
                              files=(path,))
    for theirs in key_names:
        value = config[theirs]
        if type(value) is not int or value < 1:  # bool is an int subclass, but never a size
            raise CheckpointError(f"{path}: the hyperparameter {theirs!r} must be a positive integer, not "
                                  f"{describe(value)}; download the model again", files=(path,))
    hparams = {ours: config[theirs] for theirs, ours in key_names.items()}
    if hparams["n_embd"] % hparams["n_head"]:
        raise CheckpointError(f"{path}: hyperparameters {hparams} must have n_embd divisible by n_head; download the "
                              "model again", files=(path,))
    if path.name == "config.json":
        check_options(config, path, hparams["n_embd"])
    return hparams


def check_options(config, path, n_embd):  # -> None, or CheckpointError naming an option whose math is not GPT-2's
    # computed as GPT-2's, such a model would give other numbers than its own, silently: refused by name instead
    options = {**OPTIONS, "n_inner": ((None, 4 * n_embd), "GPT-2's MLP, 4 x n_embd wide")}
    for option, (values, what) in options.items():
        value = config.get(option, values[0])
        if not any(type(value) is type(ours) and value == ours for ours in values):  # type: true is not 1
            raise CheckpointError(f"{path}: {option} is {describe(value)}, but this code computes only "
                                  f"{' or '.join(map(describe, values))} ({what}); use a library that supports it, "
                                  "such as transformers, or a model of GPT-2's own architecture", files=(path,))


def our_key(name):  # foreign tensor name -> key in our params, e.g. ("blocks", 3, "mlp", "c_fc", "w"); None: skip it
    layer, path = FOREIGN_NAME.fullmatch(name).groups()
    *module, leaf = re.split(r"[./]", path)
    if (*module[-1:], leaf) in SKIPPED:
        return None
    if leaf == "weight" and module in (["wte"], ["wpe"], list(LM_HEAD)):
        return tuple(module)  # OpenAI's "model/wte" has no leaf name at all
    if leaf in ("weight", "bias"):  # Hugging Face calls every leaf weight or bias; OpenAI calls a norm's gain g
        leaf = "b" if leaf == "bias" else "g" if "".join(module[-1:]).startswith("ln_") else "w"
    return (("blocks", int(layer)) if layer else ()) + tuple(module) + (leaf,)


def to_params(tensors, hparams, weights_path, hparams_path):  # {foreign name: (shape, loader)} -> params in our layout
    """Names and shapes are checked against hparams before any tensor is read, and nothing is built from hparams
    alone: absurd ones (a trillion layers) fail as fast as wrong ones."""
    top, block = top_shapes(hparams), block_shapes(hparams["n_embd"])
    files = weights_path, hparams_path
    found = {}
    for name, (shape, load) in tensors.items():
        key = our_key(name)
        if key is None:
            continue
        expected = expected_shape(key, top, block, hparams["n_layer"])
        if expected is None and not is_gpt2_key(key, block):
            raise CheckpointError(f"{weights_path}: tensor {shown(name)} is none of GPT-2's weights (an optimizer slot "
                                  "or a training counter?): the checkpoint holds a tensor the model does not use; save "
                                  "the model's weights alone", files=(weights_path,))
        if expected is None:  # a layer beyond n_layer
            raise mismatch(files, f"tensor {shown(name)} has no place in a GPT-2 with {hparams}")
        # The surprise: GPT-2's linear layers are Conv1D modules, whose weights both formats store [in, out] (a torch
        # nn.Linear would be [out, in]), which is our layout already: no transposes. TF adds a leading 1 (a 1x1 kernel).
        if len(shape) == 3 and shape[0] == 1:
            shape = shape[1:]
        if tuple(shape) != expected:
            raise mismatch(files, f"tensor {shown(name)} has shape {list(shape)} but {hparams} imply {list(expected)}")
        if key in found:
            raise mismatch(files, f"tensors {shown(found[key][0])} and {shown(name)} are both "
                           f"{'/'.join(map(str, key))}")
        found[key] = name, load
    lm_head = found.pop(LM_HEAD, None)
    if len(found) < len(top) + len(block) * hparams["n_layer"]:  # found holds no key twice and none out of place
        missing = next(key for key in expected_keys(top, block) if key not in found)
        raise mismatch(files, f"the weights lack {'/'.join(map(str, missing))} of a GPT-2 with {hparams}")
    arrays = {key: load() for key, (_, load) in found.items()}
    if lm_head:
        check_tied(*lm_head, arrays[("wte",)], weights_path)
    return nest({key: array[0] if array.ndim == 3 else array for key, array in arrays.items()}, hparams["n_layer"])


def expected_shape(key, top, block, n_layer):  # -> the shape hparams give our key, or None: no such tensor in GPT-2
    if key == LM_HEAD:
        return top[("wte",)]
    if len(key) > 2 and key[0] == "blocks" and isinstance(key[1], int):  # e.g. a tensor named "blocks" is not one
        return block.get(key[2:]) if key[1] < n_layer else None
    return top.get(key)


def is_gpt2_key(key, block):  # -> True for a key of some layer's block, whatever n_layer (top keys always have a place)
    return len(key) > 2 and key[0] == "blocks" and isinstance(key[1], int) and key[2:] in block


def check_tied(name, load, wte, weights_path):  # -> None, or CheckpointError for an output layer other than wte
    # the forward pass computes logits with wte itself (x @ wte.T), as GPT-2 was trained: an untied head would be lost
    if not np.array_equal(load(), wte, equal_nan=True):
        raise CheckpointError(f"{weights_path}: tensor {shown(name)} differs from wte: this model's output layer is "
                              "not tied to its token embeddings, as GPT-2's is and as this code computes the logits; "
                              "use a library that supports an untied output layer, or a checkpoint without it",
                              files=(weights_path,))


def expected_keys(top, block):  # -> every key of our params layout, blocks in order, lazily (there may be no end)
    yield from top
    layer = 0
    while True:
        yield from (("blocks", layer, *key) for key in block)
        layer += 1


def mismatch(files, problem):  # -> CheckpointError for weights and hyperparameters that do not belong together
    weights_path, hparams_path = files
    return CheckpointError(f"{weights_path} and {hparams_path} disagree: {problem}; use the hyperparameter file that "
                           "came with these weights", files=(hparams_path, weights_path))
