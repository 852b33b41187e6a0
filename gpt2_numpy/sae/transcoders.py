"""Transcoder runs of the SAE trainer (training.py): what they read and write.

A transcoder (sae/transcoder_model.py) is trained as an SAE whose target is not its input: it reads block L's MLP
input (ln_2, its output before the gain and bias ln_2.normalized, or the stream before it, mid) and reconstructs the
MLP's output (mlp.out), with no b_dec taken from its input and an optional skip connection W_skip (model.py's
loss_and_grads). A run trains the transcoders of some layers at once, from one pass of the model per window: each
layer's parameters are stacked on a first axis, in the SAE's layout (W_enc [d_in, d_sae]), and each layer's
transcoder minimises its own loss.

The run's folder is circuit-tracer's transcoder set (sae/transcoder_files.py), one layer file per trained layer in layer
order, plus train_state.npz and log.csv: a run of every layer is the set that `circuits graph` reads; a run of one
layer is a set of one, which `sae eval --transcoders DIR --layers L` measures in place of MLP L.

A topk transcoder keeps each position's k largest features; circuit-tracer's files hold a ReLU or a JumpReLU. The set
is saved as a JumpReLU whose threshold is, for every feature of a layer, the pre-activation that a batch's n·k largest
reach (so that k features a position fire on average), a moving average over the last steps (training.py): BatchTopK's
threshold, as Bussmann et al. 2024 turn a BatchTopK SAE into a JumpReLU for inference. A standard (ReLU and L1)
transcoder is saved as the ReLU it is.
"""
from pathlib import Path

import numpy as np

from gpt2_numpy.sae.transcoder_files import CONFIG, layer_file
from gpt2_numpy.sae.transcoder_model import TranscoderSet
from gpt2_numpy.errors import UsageError
from gpt2_numpy.interpret.names import layer_of, our_hook, step_of
from gpt2_numpy.runs import STATE

# the steps of block L a transcoder may read -> circuit-tracer's feature_input_hook for it
INPUT_HOOKS = {"ln_2": "mlp.hook_in", "ln_2.normalized": "ln2.hook_normalized", "mid": "hook_resid_mid"}
TARGET = "mlp.out"  # the one step a transcoder writes
OUTPUT_HOOK = "hook_mlp_out"  # circuit-tracer's name of it


def transcoder_layers(hook, target, n_layer):  # -> (the step read, [layer]): what --hook and --target ask for, checked
    # blocks.L.STEP (or TransformerLens's name, or circuit-tracer's hook) trains layer L; a step alone (ln_2, mlp.out;
    # mlp.hook_in, hook_mlp_out) every layer
    read, written = (name if name in (*INPUT_HOOKS, TARGET) else our_hook(name) or name for name in (hook, target))
    layer, step = layer_of(read), step_of(read)
    step = {theirs: ours for ours, theirs in INPUT_HOOKS.items()}.get(step, step)  # circuit-tracer's names too
    written = TARGET if step_of(written) == OUTPUT_HOOK else written
    if step not in INPUT_HOOKS:
        raise UsageError(f"--hook {hook} is not an MLP's input: a transcoder reads blocks.L.ln_2, blocks.L.mid or "
                         "blocks.L.ln_2.normalized (or, for every layer, ln_2, mid or ln_2.normalized)")
    if step_of(written) != TARGET:
        raise UsageError(f"--target {target} is not an MLP's output: a transcoder writes blocks.L.mlp.out (or, for "
                         "every layer, mlp.out)")
    if layer != layer_of(written):
        raise UsageError(f"--hook {hook} and --target {target} are not of one layer: give blocks.L.{step} with "
                         f"blocks.L.{TARGET}, or {step} with {TARGET} for every layer")
    if layer is not None and layer >= n_layer:
        raise UsageError(f"--hook {hook}: the model has {n_layer} layers, 0 to {n_layer - 1}")
    return step, list(range(n_layer)) if layer is None else [layer]


def run_order(layers):  # -> a transcoder run's files as a save moves them in: the layer files (layer 0's header names
    # the step), config.yaml, the state
    return (*(layer_file(i) for i in range(len(layers))), CONFIG, STATE)


def transcoder_set(params, settings, threshold):  # stacked training params -> TranscoderSet in circuit-tracer's layout
    # threshold: float [n_layers], the JumpReLU's of a topk run
    layers = []
    for i in range(len(settings.layers)):
        layer = {"W_enc": params["W_enc"][i].T, "b_enc": params["b_enc"][i], "W_dec": params["W_dec"][i],
                 "b_dec": params["b_dec"][i], **({"W_skip": params["W_skip"][i]} if settings.skip else {})}
        if settings.architecture == "topk":
            layer["threshold"] = np.full(settings.d_sae, threshold[i], np.float32)
        layers.append({name: np.ascontiguousarray(value, np.float32) for name, value in layer.items()})
    scan = f"{Path(settings.source).name}-{settings.hook}"  # circuit-tracer's loader requires one: the set's name
    return TranscoderSet(layers, INPUT_HOOKS[settings.hook], OUTPUT_HOOK, scan)


def stacked_params(transcoders):  # TranscoderSet -> (stacked training params, threshold [n_layers]): its inverse
    names = ("W_enc", "b_enc", "W_dec", "b_dec", *(("W_skip",) if transcoders.skip else ()))
    params = {name: np.stack([layer[name].T if name == "W_enc" else layer[name] for layer in transcoders.layers])
              for name in names}
    threshold = np.array([layer["threshold"][0] if "threshold" in layer else 0.0 for layer in transcoders.layers])
    return params, threshold
