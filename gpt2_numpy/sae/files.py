"""SAELens's SAE folders, read and written without torch: `SAE.save_model` writes one, `SAE.load_from_disk` reads it.

    cfg.json                  architecture ("standard", "topk", "jumprelu"), d_in, d_sae, k (topk), dtype,
                              apply_b_dec_to_input, normalize_activations, reshape_activations ("hook_z" for attn.z),
                              and metadata: hook_name (TransformerLens's name), model_name, sae_lens_version
    sae_weights.safetensors   W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in], and threshold
                              [d_sae] for jumprelu (or an older file's log_threshold)

A TransformerLens hook name maps to the trace name of the same activation, and back (interpret/names.py): a released
GPT-2-small SAE (hook blocks.8.hook_resid_pre, say) reads our "blocks.7.out". Options whose math is not the one here
(normalize_activations other than "none", say) are refused, naming the option and its value.
"""
import json
from pathlib import Path

import numpy as np

from gpt2_numpy.errors import CheckpointError, Gpt2NumpyError, UsageError
from gpt2_numpy.formats import SETTINGS_LIMIT, parse_json, read_regular, shown
from gpt2_numpy.formats.safetensors import read_safetensors, to_float32, write_safetensors
from gpt2_numpy.formats.torch_zip import read_torch_zip
from gpt2_numpy.interpret.names import our_hook, tl_hook
from gpt2_numpy.sae.model import ARCHITECTURES, SAE, decoder_norms
from gpt2_numpy.disk import atomic_write
from gpt2_numpy.sae.processing import NO_PROCESSING, processed, upgraded

CFG, WEIGHTS = "cfg.json", "sae_weights.safetensors"
FORMAT_VERSION = "6.0.0"  # the SAELens release whose folder layout this writes; older layouts load as SAELens's do
# cfg options whose other values change the math: refused, since this code would compute something else
SUPPORTED = {"normalize_activations": (None, "none", "layer_norm", "expected_average_only_in"),
             "finetuning_scaling_factor": (None, False), "reshape_activations": (None, "none", "hook_z"),
             "rescale_acts_by_decoder_norm": (None, False, True), "hook_head_index": (None,)}


def new_sae(cfg, params, hook, model_name=None):  # -> SAE with a complete cfg.json from the few fields that matter
    # cfg: architecture and k at least; params: float32 arrays; hook: a trace name, or None for activations of unknown
    # origin
    d_in, d_sae = params["W_enc"].shape
    full = {"d_in": d_in, "d_sae": d_sae, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
            "normalize_activations": "none",
            "reshape_activations": "hook_z" if hook and hook.endswith(".attn.z") else "none",
            "metadata": {"hook_name": hook and tl_hook(hook), "model_name": model_name,
                         "sae_lens_version": FORMAT_VERSION, "sae_lens_training_version": FORMAT_VERSION,
                         "hook_head_index": None},
            "architecture": cfg["architecture"]}
    if cfg["architecture"] == "topk":
        full.update(k=int(cfg["k"]), rescale_acts_by_decoder_norm=False)
    return SAE(full, {name: np.asarray(value, dtype=np.float32) for name, value in params.items()}, hook)



def save_sae(sae, folder, metadata=None):  # -> None: folder holds cfg.json and sae_weights.safetensors, each written
    # atomically; metadata ({str: str}): more of the safetensors header ({"step": "100"} for a training run's save)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = ("W_enc", "b_enc", "W_dec", "b_dec", *(("threshold",) if sae.architecture == "jumprelu" else ()))
    atomic_write(folder / WEIGHTS, lambda file: write_safetensors(file, {name: sae.params[name] for name in names},
                                                                  {"format": "pt", **(metadata or {})}))
    atomic_write(folder / CFG, lambda file: file.write(json.dumps(sae.cfg, indent=2).encode()))


def load_sae_folder(folder):  # -> SAE, every file checked; CheckpointError (one line) for a folder that cannot be
    # one (releases.load_sae takes a release's name too)
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder: pass an SAE folder ({CFG} + {WEIGHTS}), as SAELens's "
                         "SAE.save_model or gpt2-numpy sae train writes")
    cfg = read_cfg(folder / CFG)
    params = read_weights(folder / WEIGHTS, cfg)
    if cfg["architecture"] == "topk" and cfg.get("rescale_acts_by_decoder_norm"):  # SAELens's TopKSAE alone reads
        cfg, params = folded(cfg, params)  # the key: its StandardSAE and JumpReLUSAE ignore it
    return processed(cfg, params, cfg_hook(folder / CFG, cfg), NO_PROCESSING, str(folder))


def folded(cfg, params):  # -> (cfg, params) of a topk SAE that rescales by its decoder's norms, with them folded in
    # SAELens's rescale_acts_by_decoder_norm multiplies the pre-activations by ‖W_dec[j]‖ and divides f by it again
    # before decoding: the same function as the plain SAE with W_enc's columns and b_enc scaled by the norms and W_dec's
    # rows divided by them (SAELens's own _fold_norm_topk), which the math here computes. W_dec's rows are then the
    # unit rows that SAELens's decode applies (f / ‖W_dec[j]‖ @ W_dec): the rows that ablation and steering use
    norms = decoder_norms(params["W_dec"])
    if not (norms > 0).all():
        raise CheckpointError("a decoder row is zero, so rescale_acts_by_decoder_norm divides by zero: use another "
                              "SAE")
    params = {**params, "W_enc": params["W_enc"] * norms, "b_enc": params["b_enc"] * norms,
              "W_dec": params["W_dec"] / norms[:, None]}
    return {**cfg, "rescale_acts_by_decoder_norm": False}, params


def damaged(path, problem):  # -> CheckpointError for an SAE file that cannot be used as it is
    return CheckpointError(f"{path}: {problem}", files=(path,))


def read_cfg(path):  # -> cfg.json's object, checked: an architecture of ours, sizes, and only math we compute
    return checked_cfg(path, read_json(path))


def read_json(path):  # -> a cfg file's JSON object
    try:
        cfg = parse_json(read_regular(path, SETTINGS_LIMIT))  # as a model's config.json: a FIFO never hangs
    except OSError as error:
        raise damaged(path, f"cannot be read ({error.strerror or error}): pass a folder holding SAELens's {CFG}") \
            from None
    except (ValueError, UnicodeDecodeError) as error:
        raise damaged(path, f"is not JSON ({error}): write it again with SAELens or gpt2-numpy sae train") from None
    if not isinstance(cfg, dict):
        raise damaged(path, "is not a JSON object: write it again with SAELens or gpt2-numpy sae train")
    return cfg


def checked_cfg(path, cfg):  # -> cfg (SAELens's keys, older layouts upgraded), checked
    cfg = upgraded(cfg)
    cfg = {**cfg, "architecture": cfg.get("architecture", "standard")}  # SAELens's default for older files
    if cfg["architecture"] not in ARCHITECTURES:
        raise damaged(path, f"architecture {shown(str(cfg['architecture']))} is not supported: only "
                      f"{', '.join(ARCHITECTURES)} SAEs load here")
    for name in ("d_in", "d_sae"):
        if type(cfg.get(name)) is not int or cfg[name] < 1:
            raise damaged(path, f"{name} is {shown(json.dumps(cfg.get(name)))}, not a whole number >= 1")
    if cfg["architecture"] == "topk" and (type(cfg.get("k")) is not int or not 1 <= cfg["k"] <= cfg["d_sae"]):
        raise damaged(path, f"k is {shown(json.dumps(cfg.get('k')))}, not a whole number from 1 to d_sae "
                      f"{cfg['d_sae']}")
    if cfg.get("apply_b_dec_to_input", True) not in (True, False):
        raise damaged(path, "apply_b_dec_to_input is not true or false")
    metadata = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    for name, allowed in SUPPORTED.items():
        value = cfg.get(name, metadata.get(name))
        if value not in allowed:
            accepted = " or ".join(json.dumps(each) for each in allowed if each is not None) or "null"
            raise UsageError(f"{path}: {name} {shown(json.dumps(value))} is not supported (this SAE's math would "
                             f"differ here): only {accepted} loads")
    return cfg


def cfg_hook(path, cfg):  # -> the trace name the SAE reads, from TransformerLens's or our name in cfg; None: unnamed
    metadata = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    name = metadata.get("hook_name") or cfg.get("hook_name") or cfg.get("hook_point")  # 6.x's, then older ones'
    if name is None:
        return None
    hook = our_hook(name) if isinstance(name, str) else None
    if hook is None:
        raise damaged(path, f"hook_name {shown(json.dumps(name))} names no activation of GPT-2: give a "
                      "TransformerLens hook (blocks.L.hook_resid_pre, ...) or a trace name (blocks.L.out, ...)")
    return hook


def read_weights(path, cfg):  # -> {name: float32 array}, shaped as cfg says, finite
    try:
        # CheckpointError names what is wrong with a damaged file
        tensors = (read_torch_zip if path.suffix == ".pt" else read_safetensors)(path)
    except OSError as error:
        raise damaged(path, f"cannot be read ({error.strerror or error})") from None
    d_in, d_sae = cfg["d_in"], cfg["d_sae"]
    shapes = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_in), "b_dec": (d_in,)}
    if cfg["architecture"] == "jumprelu":
        shapes["threshold"] = (d_sae,)
    params = {}
    for name, shape in shapes.items():
        stored = "log_threshold" if name == "threshold" and name not in tensors else name
        if stored not in tensors:
            raise damaged(path, f"holds no tensor {name} (it has {', '.join(map(shown, tensors)) or 'none'}): "
                          "write it again with SAELens or gpt2-numpy sae train")
        if tensors[stored].shape != shape:
            raise damaged(path, f"{stored} has shape {list(tensors[stored].shape)}, but {CFG}'s d_in {d_in} and "
                          f"d_sae {d_sae} make it {list(shape)}")
        array = float32(path, stored, tensors[stored])
        params[name] = np.exp(array) if stored == "log_threshold" else array  # older jumprelu files
        if not np.isfinite(params[name]).all():
            raise damaged(path, f"{stored} holds NaN or infinite values: use another SAE")
    return params


def float32(path, name, tensor):  # -> float32 array of a tensor in F32, F16, BF16 or F64
    if tensor.dtype == "F64":
        return tensor.data.view("<f8").reshape(tensor.shape).astype(np.float32)
    try:
        return to_float32(path, name, tensor)
    except Gpt2NumpyError:
        raise damaged(path, f"{shown(name)} has dtype {tensor.dtype}: only F32, F64, F16 and BF16 load") from None


def check_fits(sae, width, where):  # -> None; UsageError when the SAE's d_in is not the activation's width
    if sae.d_in != width:
        raise UsageError(f"the SAE reads {sae.d_in} numbers per position, but {where} has {width}: use an SAE "
                         "trained on this model's activation")

