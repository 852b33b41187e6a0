"""Transcoders (Dunefsky et al. 2024): a sparse, wider map from an MLP's input to its output, with an optional linear
skip connection (Paulo et al. 2025). Parameters as circuit-tracer's SingleLayerTranscoder holds them:

    W_enc [d_transcoder, d_model]   b_enc [d_transcoder]   W_dec [d_transcoder, d_model]   b_dec [d_model]
    W_skip [d_model, d_model] (optional, applied as x W_skipᵀ)   threshold [d_transcoder] (optional: JumpReLU)

features = activation(x W_encᵀ + b_enc), ReLU, or JumpReLU (the pre-activation where it exceeds its threshold, else 0);
output = features W_dec + b_dec + x W_skipᵀ.

A set holds one transcoder per layer and names, as circuit-tracer does, the TransformerLens hook each reads and the
one it writes; INPUT_HOOKS and OUTPUT_HOOKS say which activation of ours each is (interpret/tracing.py's names).
"""
from typing import NamedTuple, Optional

import numpy as np

from gpt2_numpy.model import layer_norm

# circuit-tracer's feature_input_hook -> (trace name within block L it is computed from, layer norm's gain it keeps):
# "ln2.hook_normalized" is ln_2's output before its gain and bias (TransformerLens's LayerNorm hooks it there), made
# here from blocks.L.mid; "mlp.hook_in" (circuit-tracer's ReplacementMLP) is ln_2's output itself
INPUT_HOOKS = {"ln2.hook_normalized": "normalized", "mlp.hook_in": "ln_2", "hook_resid_mid": "mid"}
OUTPUT_HOOKS = {"hook_mlp_out": "mlp.out", "mlp.hook_out": "mlp.out"}


class TranscoderSet(NamedTuple):
    layers: list  # [{name: float32 array}], layer i's transcoder at i
    input_hook: str  # circuit-tracer's feature_input_hook, a key of INPUT_HOOKS
    output_hook: str  # its feature_output_hook, a key of OUTPUT_HOOKS
    scan: Optional[str] = None  # circuit-tracer's identifier of the set, carried through

    @property
    def d_transcoder(self):
        return self.layers[0]["W_enc"].shape[0]

    @property
    def d_model(self):
        return self.layers[0]["W_enc"].shape[1]

    @property
    def skip(self):  # -> True when the transcoders have a skip connection (all or none do)
        return "W_skip" in self.layers[0]


def pre_activations(params, x):  # [..., d_model] -> [..., d_transcoder]
    return x @ params["W_enc"].T + params["b_enc"]


def encode(params, x):  # [..., d_model] -> [..., d_transcoder]: the features, ReLU or JumpReLU of the pre-activations
    pre = pre_activations(params, x)
    if "threshold" in params:
        return pre * (pre > params["threshold"])  # circuit-tracer's jumprelu: x where x > threshold
    return np.maximum(pre, 0)


def skip(params, x):  # [..., d_model] -> [..., d_model]: the linear skip connection, 0 without one
    return x @ params["W_skip"].T if "W_skip" in params else np.zeros_like(x)


def decode(params, features, x):  # [..., d_transcoder], [..., d_model] -> [..., d_model]
    return features @ params["W_dec"] + params["b_dec"] + skip(params, x)


def transcode(params, x):  # [..., d_model] -> [..., d_model]: the MLP's replacement
    return decode(params, encode(params, x), x)


def input_name(input_hook, layer):  # -> the trace name the transcoder input is made from
    step = INPUT_HOOKS[input_hook]
    return f"blocks.{layer}.{'mid' if step == 'normalized' else step}"


def transcoder_input(input_hook, array):  # [n_seq, d_model] of input_name's array -> [n_seq, d_model]
    if INPUT_HOOKS[input_hook] == "normalized":  # layer_norm with gain 1 and bias 0: TransformerLens's hook_normalized
        return layer_norm(array, g=np.float32(1), b=np.float32(0))
    return array


def output_name(output_hook, layer):  # -> the trace name of the activation the transcoder replaces
    return f"blocks.{layer}.{OUTPUT_HOOKS[output_hook]}"
