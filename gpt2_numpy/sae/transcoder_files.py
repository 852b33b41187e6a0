"""circuit-tracer's transcoder-set folders, read and written without torch or a YAML library:
`circuit_tracer.transcoder.single_layer_transcoder.load_transcoder_set` reads one, `TranscoderSet.to_safetensors`
writes its layer files.

    config.yaml             model_kind: transcoder_set, feature_input_hook, feature_output_hook, scan (optional),
                            transcoders: the layer files in layer order (names inside the folder)
    layer_<i>.safetensors   W_enc [d_transcoder, d_model], W_dec [d_transcoder, d_model], b_enc [d_transcoder],
                            b_dec [d_model], and W_skip [d_model, d_model] (skip connection),
                            activation_function.threshold [d_transcoder] (JumpReLU) when present

config.yaml is read in the small subset of YAML that circuit-tracer's configs use: `key: value` lines of strings (plain
or quoted), a key whose value is a list of `- item` lines, blank lines and comments. Anything else is refused with
its line number, rather than guessed at.
"""
import re
from pathlib import Path

import numpy as np

from gpt2_numpy.sae.transcoder_model import INPUT_HOOKS, OUTPUT_HOOKS, TranscoderSet
from gpt2_numpy.console import plural
from gpt2_numpy.disk import atomic_write
from gpt2_numpy.errors import CheckpointError, UsageError
from gpt2_numpy.formats import SETTINGS_LIMIT, read_regular, shown
from gpt2_numpy.formats.safetensors import read_safetensors, to_float32, write_safetensors

CONFIG = "config.yaml"
KIND = "transcoder_set"
THRESHOLD = "activation_function.threshold"  # circuit-tracer's name of a JumpReLU's threshold in a layer file
# a layer file's tensor names -> the parameter names of transcoder_model.py
STORED = {"W_enc": "W_enc", "W_dec": "W_dec", "b_enc": "b_enc", "b_dec": "b_dec", "W_skip": "W_skip",
          THRESHOLD: "threshold"}
KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# plain scalars that YAML reads as something other than a string (null, booleans, numbers): refused, not guessed at
NOT_STRING = re.compile(r"~|null|Null|NULL|true|True|TRUE|false|False|FALSE|yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF"
                        r"|[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9]*)?)([eE][-+]?[0-9]+)?|0x[0-9a-fA-F]+|0o[0-7]+"
                        r"|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")
# a plain one-line scalar: no indicator first, no ": " or " #" inside
PLAIN = re.compile(r"[^-?:,\[\]{}#&*!|>'\"%@`\s]([^#:]|:(?!\s|$)|(?<!\s)#)*")


def layer_file(layer):  # -> the name circuit-tracer gives layer `layer`'s file
    return f"layer_{layer}.safetensors"


def save_transcoders(transcoders, folder, metadata=None):  # -> None: folder holds config.yaml and a safetensors file
    # per layer; metadata ({str: str}): more of each layer file's header ({"step": "100"} for a training run's save)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for layer, params in enumerate(transcoders.layers):
        tensors = {name: params[key] for name, key in STORED.items() if key in params}
        atomic_write(folder / layer_file(layer),
                     lambda file, tensors=tensors: write_safetensors(file, tensors, metadata))
    atomic_write(folder / CONFIG, lambda file: file.write(config_text(transcoders).encode()))


def config_text(transcoders):  # -> config.yaml's text, as yaml.dump writes it (keys sorted, lists unindented)
    entries = {"feature_input_hook": transcoders.input_hook, "feature_output_hook": transcoders.output_hook,
               "model_kind": KIND, **({"scan": transcoders.scan} if transcoders.scan else {})}
    lines = [f"{key}: {yaml_string(value)}" for key, value in entries.items()]
    lines += ["transcoders:", *(f"- {layer_file(layer)}" for layer in range(len(transcoders.layers)))]
    return "\n".join(lines) + "\n"


def yaml_string(text):  # -> text as a YAML scalar that reads back as that string: plain where it can be
    if PLAIN.fullmatch(text) and not NOT_STRING.fullmatch(text) and text == text.strip():
        return text
    return "'" + text.replace("'", "''") + "'"


def load_transcoders(folder):  # -> TranscoderSet, every file checked; CheckpointError (one line) for a damaged one
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder: pass a transcoder-set folder ({CONFIG} + layer_<i>.safetensors), "
                         "as circuit-tracer or gpt2-numpy writes it")
    config = read_config(folder / CONFIG)
    layers = [read_layer(folder / name) for name in config["transcoders"]]
    check_layers(folder, layers)
    return TranscoderSet(layers, config["feature_input_hook"], config["feature_output_hook"], config.get("scan"))


def damaged(path, problem):  # -> CheckpointError for a transcoder file that cannot be used as it is
    return CheckpointError(f"{path}: {problem}", files=(path,))


def read_config(path):  # -> config.yaml's entries, checked: a transcoder set of hooks we compute, files inside
    try:
        text = read_regular(path, SETTINGS_LIMIT).decode()
    except OSError as error:
        raise damaged(path, f"cannot be read ({error.strerror or error}): pass a folder holding circuit-tracer's "
                      f"{CONFIG}") from None
    except UnicodeDecodeError:
        raise damaged(path, "is not UTF-8 text: write it again with gpt2-numpy or circuit-tracer") from None
    config = parse_yaml(path, text)
    if config.get("model_kind") != KIND:
        raise damaged(path, f"model_kind is {shown(str(config.get('model_kind')))}, not {KIND}: only per-layer "
                      "transcoder sets load here")
    for key, allowed in (("feature_input_hook", INPUT_HOOKS), ("feature_output_hook", OUTPUT_HOOKS)):
        if config.get(key) not in allowed:
            raise damaged(path, f"{key} is {shown(str(config.get(key)))}: only {', '.join(allowed)} are computed here")
    names = config.get("transcoders")
    if not isinstance(names, list) or not names:
        raise damaged(path, "has no transcoders list (the layer files, in layer order)")
    for name in names:
        if Path(name).name != name or name in (".", ".."):
            raise damaged(path, f"transcoder file {shown(name)} is not a file name inside the folder")
    if config.get("scan") is not None and not isinstance(config["scan"], str):
        raise damaged(path, "scan is not a string")
    return config


def parse_yaml(path, text):  # -> {key: str or [str]}; CheckpointError naming the first line outside the subset
    config, listing = {}, None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("- ") or stripped == "-":
            if listing is None:
                raise damaged(path, f"line {number}: a list item belongs under a key with no value")
            listing.append(scalar(path, number, stripped[1:].strip()))
            continue
        key, colon, value = line.partition(":")
        if line[:1].isspace() or not colon or not KEY.fullmatch(key) or value[:1] not in ("", " "):
            raise damaged(path, f"line {number} is not `key: value` (only that subset of YAML is read)")
        if key in config:
            raise damaged(path, f"line {number}: key {key} is given twice")
        listing = [] if not value.strip() else None
        config[key] = listing if listing is not None else scalar(path, number, value.strip())
    return config


def scalar(path, number, text):  # -> the string a YAML scalar holds; CheckpointError for anything but a string
    if not text.isprintable():  # a NUL would reach the file system as a name; YAML refuses control characters too
        raise damaged(path, f"line {number}: {shown(text)} holds a control character")
    if text.startswith("'") and text.endswith("'") and len(text) > 1 and "'" not in text[1:-1].replace("''", ""):
        return text[1:-1].replace("''", "'")
    if text.startswith('"') and text.endswith('"') and len(text) > 1 and not re.search(r'["\\]', text[1:-1]):
        return text[1:-1]
    if PLAIN.fullmatch(text) and not NOT_STRING.fullmatch(text):
        return text
    raise damaged(path, f"line {number}: {shown(text)} is not a string this reader takes (plain or quoted, one line)")


def read_layer(path):  # -> {name: float32 array} of one layer file, finite, with the tensors circuit-tracer reads
    try:
        tensors = read_safetensors(path)  # CheckpointError names what is wrong with a damaged file
    except OSError as error:
        raise damaged(path, f"cannot be read ({error.strerror or error})") from None
    unknown = sorted(set(tensors) - set(STORED))
    missing = [name for name in ("W_enc", "W_dec", "b_enc", "b_dec") if name not in tensors]
    if unknown or missing:
        raise damaged(path, f"holds {', '.join(map(shown, tensors)) or 'no tensors'}: a transcoder's are W_enc, W_dec, "
                      f"b_enc, b_dec (and W_skip, {THRESHOLD}); write it again with gpt2-numpy or circuit-tracer")
    params = {STORED[name]: to_float32(path, name, tensor) for name, tensor in tensors.items()}
    check_shapes(path, params)
    for name, array in params.items():
        if not np.isfinite(array).all():
            raise damaged(path, f"{name} holds NaN or infinite values: use another transcoder")
    return params


def check_shapes(path, params):  # -> None; CheckpointError when the tensors' shapes do not fit one transcoder
    if params["W_enc"].ndim != 2:
        raise damaged(path, f"W_enc has shape {list(params['W_enc'].shape)}, not [d_transcoder, d_model]")
    d_transcoder, d_model = params["W_enc"].shape
    shapes = {"W_enc": (d_transcoder, d_model), "W_dec": (d_transcoder, d_model), "b_enc": (d_transcoder,),
              "b_dec": (d_model,), "W_skip": (d_model, d_model), "threshold": (d_transcoder,)}
    for name, array in params.items():
        if array.shape != shapes[name]:
            raise damaged(path, f"{name} has shape {list(array.shape)}, but W_enc's [{d_transcoder}, {d_model}] "
                          f"makes it {list(shapes[name])}")


def check_layers(folder, layers):  # -> None; CheckpointError when the layers differ in width or in their parts
    first = layers[0]
    for layer, params in enumerate(layers):
        if params["W_enc"].shape != first["W_enc"].shape or params.keys() != first.keys():
            raise damaged(folder, f"layer {layer}'s transcoder differs from layer 0's in shape or in its parts "
                          f"({', '.join(sorted(params))} of {list(params['W_enc'].shape)}): a set's layers match")


def check_fits(transcoders, n_layer, n_embd):  # -> None; UsageError when the set is not one for this model
    if len(transcoders.layers) != n_layer or transcoders.d_model != n_embd:
        raise UsageError(f"the transcoder set has {plural(len(transcoders.layers), 'layer')} of width "
                         f"{transcoders.d_model}, but the model has {plural(n_layer, 'layer')} of width {n_embd}: use "
                         "transcoders trained on this model")
