"""The names of the activations, in one place: the names trace gives them (tracing.py makes the arrays, in this order)
and TransformerLens's names for the same arrays, which SAELens's files use (docs/look-inside.md has the table):

    embed, blocks.{L}.{STEP} for STEP in BLOCK_STEPS, ln_f.normalized, ln_f, logits

A TransformerLens hook maps to the trace name of the same activation, and back: blocks.8.hook_resid_pre, the stream
entering block 8, is our blocks.7.out (embed for block 0).
"""
import re

BLOCK_STEPS = ("ln_1.normalized", "ln_1", "attn.q", "attn.k", "attn.v", "attn.scores", "attn.weights", "attn.z",
               "attn.out", "mid", "ln_2.normalized", "ln_2", "mlp.pre", "mlp.hidden", "mlp.out", "out")  # block_trace's
# names, in the order it makes them
HEAD_STEPS = ("attn.q", "attn.k", "attn.v", "attn.scores", "attn.weights", "attn.z")  # [..., n_head, n_seq, ...]
RESIDUAL_STEPS = ("mid", "out", "attn.out", "mlp.out")  # a block's arrays in the residual stream's space
VALUE_STEPS = ("attn.v", "attn.z")  # a block's arrays that carry attention's value bias
# TransformerLens's name within block L -> ours (trace's, within block L)
TL_BLOCK_NAMES = {"hook_resid_mid": "mid", "hook_resid_post": "out", "attn.hook_z": "attn.z", "hook_mlp_out": "mlp.out",
                  "hook_attn_out": "attn.out", "attn.hook_q": "attn.q", "attn.hook_k": "attn.k",
                  "attn.hook_v": "attn.v", "mlp.hook_pre": "mlp.pre", "mlp.hook_post": "mlp.hidden",
                  "ln1.hook_normalized": "ln_1.normalized", "ln2.hook_normalized": "ln_2.normalized"}
OUR_BLOCK_NAMES = {ours: theirs for theirs, ours in TL_BLOCK_NAMES.items()}
BLOCK_NAME = re.compile(r"blocks\.(\d+)\.(.+)")


def run_names(n_layer, start_at_layer=None):  # -> [name]: the arrays tracing.walk makes, in its order
    first = 0 if start_at_layer is None else start_at_layer
    blocks = [f"blocks.{i}.{step}" for i in range(first, n_layer) for step in BLOCK_STEPS]
    return ["embed"] * (start_at_layer is None) + blocks + ["ln_f.normalized", "ln_f", "logits"]


def step_of(name):  # -> "attn.z" for "blocks.3.attn.z"; a name outside the blocks (embed, ln_f, logits) as it is
    match = BLOCK_NAME.fullmatch(name)
    return match[2] if match else name


def layer_of(name):  # -> L for "blocks.L.STEP"; None for a name outside the blocks
    match = BLOCK_NAME.fullmatch(name)
    return int(match[1]) if match else None


def is_trace_name(name):  # -> True for a name trace makes in some model
    match = BLOCK_NAME.fullmatch(name)
    return name in ("embed", "ln_f.normalized", "ln_f", "logits") or bool(match and match[2] in BLOCK_STEPS)


def is_per_head(name):  # -> True for a trace name of shape [n_head, n_seq, ...]
    return step_of(name) in HEAD_STEPS


def hook_problem(name, n_layer):  # -> None, or what is wrong with a name that a model of n_layer blocks does not make
    names = run_names(n_layer)
    if name in names:
        return None
    shown = ", ".join(names[:3] + ["...", names[-1]]) if len(names) > 12 else ", ".join(names)
    return (f"{name!r} is not an activation of this {n_layer}-layer model: the names are embed, blocks.L.STEP for L "
            f"from 0 to {n_layer - 1} and STEP one of {', '.join(BLOCK_STEPS)}; ln_f.normalized, ln_f and logits "
            f"(in order: {shown})")


def our_hook(name):  # -> the trace name of TransformerLens's hook name (or of one of ours, as it is); None if neither
    match = BLOCK_NAME.fullmatch(name)
    if match and match[2] == "hook_resid_pre":
        layer = int(match[1])
        return "embed" if layer == 0 else f"blocks.{layer - 1}.out"
    if match and match[2] in TL_BLOCK_NAMES:
        return f"blocks.{match[1]}.{TL_BLOCK_NAMES[match[2]]}"
    if name == "ln_final.hook_normalized":
        return "ln_f.normalized"
    return name if is_trace_name(name) else None


def tl_hook(name):  # -> TransformerLens's name for a trace name, or the trace name when TransformerLens has none
    match = BLOCK_NAME.fullmatch(name)
    if name == "embed":
        return "blocks.0.hook_resid_pre"
    if match and match[2] in OUR_BLOCK_NAMES:
        return f"blocks.{match[1]}.{OUR_BLOCK_NAMES[match[2]]}"
    return "ln_final.hook_normalized" if name == "ln_f.normalized" else name
