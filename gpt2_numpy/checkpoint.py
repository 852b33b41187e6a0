"""GPT-2 weights from disk into our params layout: OpenAI's TensorFlow checkpoint or Hugging Face safetensors.

Either way the result is (hparams, params) with OpenAI's key names, weights [in, out] and float32 arrays. TF and F32
safetensors arrays are read-only views of the memory-mapped files: loading is nearly free and pages are read on use.
"""
import json
import re
from functools import partial
from pathlib import Path

from gpt2_numpy.errors import CheckpointError
from gpt2_numpy.formats import read_file, unreadable
from gpt2_numpy.formats.safetensors import read_safetensors, to_float32
from gpt2_numpy.formats.tf_bundle import TensorBundle

OPENAI_FILES = ("checkpoint", "hparams.json", "model.ckpt.index", "model.ckpt.data-00000-of-00001")
HF_FILES = ("model.safetensors", "config.json")
HPARAM_NAMES = {  # the hparams file's own key -> ours
    "hparams.json": {key: key for key in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer")},
    "config.json": {"vocab_size": "n_vocab", "n_positions": "n_ctx", "n_embd": "n_embd", "n_head": "n_head",
                    "n_layer": "n_layer"},
}
# OpenAI names tensors "model/h3/mlp/c_fc/w"; Hugging Face "transformer.h.3.mlp.c_fc.weight", or without "transformer."
FOREIGN_NAME = re.compile(r"(?:model/|transformer\.)?(?:h\.?(\d+)[./])?(.*)")
# (module, leaf) pairs to skip: Hugging Face's causal-mask buffers, and an output layer GPT-2 ties to wte anyway
SKIPPED = {("attn", "bias"), ("attn", "masked_bias"), ("lm_head", "weight")}


def load_params(model_dir, verify=False):  # -> (hparams, params)
    """Load the checkpoint in model_dir; verify=True also checks every tensor's CRC32C (TF checkpoints; safetensors
    files are always checked for structure and have no checksums). Raises CheckpointError naming what is wrong."""
    model_dir = Path(model_dir)
    present = files_in(model_dir, ("checkpoint", "model.safetensors", "pytorch_model.bin"))
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
    return hparams, to_params(tensors, hparams, f"{weights_path} and {hparams_path}")


def files_in(model_dir, names):  # -> the names that are files in model_dir; CheckpointError if it cannot be read
    try:
        return {name for name in names if (model_dir / name).is_file()}
    except OSError as error:
        raise unreadable(model_dir, error) from None


def verify_checkpoint(model_dir):  # -> None, or raises CheckpointError
    """Check every tensor of the checkpoint in model_dir: CRC32C (TF) or full structure (safetensors), and shapes."""
    load_params(model_dir, verify=True)


def open_openai(model_dir, verify):  # -> (hparams path, index path, {tensor name: loader})
    bundle = TensorBundle(checkpoint_prefix(model_dir))
    tensors = {name: partial(bundle.read, name, verify) for name in bundle.entries}
    return model_dir / "hparams.json", bundle.index_path, tensors


def open_hf(model_dir):  # -> (config path, safetensors path, {tensor name: loader})
    path = model_dir / "model.safetensors"
    tensors = {name: partial(to_float32, path, name, tensor) for name, tensor in read_safetensors(path).items()}
    return model_dir / "config.json", path, tensors


def checkpoint_prefix(model_dir):  # -> the path prefix the "checkpoint" file names, e.g. model_dir/"model.ckpt"
    path = model_dir / "checkpoint"
    match = re.search(r'^model_checkpoint_path:\s*"([^"]+)"', read_file(path).decode(errors="replace"), re.MULTILINE)
    if not match:
        raise CheckpointError(f"{path} names no model_checkpoint_path; download the model again")
    return model_dir / match.group(1)  # relative to the folder, as TensorFlow does; an absolute path stays as it is


def read_hparams(path):  # -> our hparams, from OpenAI's hparams.json or Hugging Face's config.json
    key_names = HPARAM_NAMES[path.name]
    try:
        config = json.loads(read_file(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} is not valid JSON ({error}); download the model again") from None
    missing = [key for key in key_names if not isinstance(config, dict) or key not in config]
    if missing:
        raise CheckpointError(f"{path} lacks the hyperparameter {missing[0]!r}; download the model again")
    hparams = {ours: config[theirs] for theirs, ours in key_names.items()}
    if not all(type(value) is int and value > 0 for value in hparams.values()) or hparams["n_embd"] % hparams["n_head"]:
        raise CheckpointError(f"{path}: hyperparameters {hparams} must be positive integers with n_embd divisible by "
                              "n_head; download the model again")
    return hparams


def our_key(name):  # foreign tensor name -> key in our params, e.g. ("blocks", 3, "mlp", "c_fc", "w"); None: skip it
    layer, path = FOREIGN_NAME.fullmatch(name).groups()
    *module, leaf = re.split(r"[./]", path)
    if (*module[-1:], leaf) in SKIPPED:
        return None
    if leaf == "weight" and module in (["wte"], ["wpe"]):
        return tuple(module)  # OpenAI's "model/wte" has no leaf name at all
    if leaf in ("weight", "bias"):  # Hugging Face calls every leaf weight or bias; OpenAI calls a norm's gain g
        leaf = "b" if leaf == "bias" else "g" if "".join(module[-1:]).startswith("ln_") else "w"
    return (("blocks", int(layer)) if layer else ()) + tuple(module) + (leaf,)


def to_params(tensors, hparams, files):  # {foreign name: loader} -> params in our layout, every shape checked
    expected = dict(flatten(param_shapes(hparams)))
    found = {}
    for name, load in tensors.items():
        key = our_key(name)
        if key is None:
            continue
        if key not in expected:
            raise mismatch(files, f"tensor {name} has no place in a GPT-2 with {hparams}")
        # The surprise: GPT-2's linear layers are Conv1D modules, whose weights both formats store [in, out] (a torch
        # nn.Linear would be [out, in]), which is our layout already: no transposes. TF adds a leading 1 (a 1x1 kernel).
        array = load()
        if array.ndim == 3 and array.shape[0] == 1:
            array = array[0]
        if array.shape != expected[key]:
            shapes = f"shape {list(array.shape)} but {hparams} imply {list(expected[key])}"
            raise mismatch(files, f"tensor {name} has {shapes}")
        found[key] = array
    missing = [key for key in expected if key not in found]
    if missing:
        raise mismatch(files, f"the weights lack {'/'.join(map(str, missing[0]))} of a GPT-2 with {hparams}")
    return nest(found, hparams["n_layer"])


def mismatch(files, problem):  # -> CheckpointError for weights and hyperparameters that do not belong together
    return CheckpointError(f"{files} disagree: {problem}; use the hyperparameter file that came with these weights")


def param_shapes(hparams):  # -> our params layout with a shape tuple at each leaf
    n_embd = hparams["n_embd"]
    norm = {"g": (n_embd,), "b": (n_embd,)}

    def dense(n_in, n_out):
        return {"w": (n_in, n_out), "b": (n_out,)}

    block = {
        "ln_1": norm,
        "attn": {"c_attn": dense(n_embd, 3 * n_embd), "c_proj": dense(n_embd, n_embd)},
        "ln_2": norm,
        "mlp": {"c_fc": dense(n_embd, 4 * n_embd), "c_proj": dense(4 * n_embd, n_embd)},
    }
    return {"wte": (hparams["n_vocab"], n_embd), "wpe": (hparams["n_ctx"], n_embd), "ln_f": norm,
            "blocks": [block] * hparams["n_layer"]}


def flatten(tree, prefix=()):  # nested dicts and lists -> [(key path, leaf)]
    for key, value in tree.items() if isinstance(tree, dict) else enumerate(tree):
        if isinstance(value, (dict, list)):
            yield from flatten(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def nest(flat, n_layer):  # {key path: array} -> nested params, the inverse of flatten
    params = {"blocks": [{} for _ in range(n_layer)]}
    for key, array in flat.items():
        node = params
        for part in key[:-1]:
            node = node[part] if isinstance(part, int) else node.setdefault(part, {})
        node[key[-1]] = array
    return params
