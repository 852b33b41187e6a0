"""The GPT-2 params tree, defined once: its shapes from the hyperparameters, its one key order, the ways to walk it
(flatten, nest, map_leaves), and the initialisations built on it (GPT-2's for training, a seeded preset for tests).

    {"wte": [n_vocab, n_embd], "wpe": [n_ctx, n_embd],
     "blocks": [{"ln_1": {"g", "b"}, "attn": {"c_attn": {"w", "b"}, "c_proj": {"w", "b"}},
                 "ln_2": {"g", "b"}, "mlp": {"c_fc": {"w", "b"}, "c_proj": {"w", "b"}}}, ...],
     "ln_f": {"g", "b"}}

The names are OpenAI's checkpoint's (model/h3/mlp/c_fc/w is ("blocks", 3, "mlp", "c_fc", "w")). Every tree this
module builds lists its keys in the order above, and so do the gradients of fast_backward.loss_and_grads: AdamW walks
params, grads and moments side by side with flatten, so they must agree.
"""
import math

import numpy as np


def top_shapes(hparams):  # -> {key path: shape} of the params outside the blocks, in the one order
    norm = {("ln_f", "g"): (hparams["n_embd"],), ("ln_f", "b"): (hparams["n_embd"],)}
    return {("wte",): (hparams["n_vocab"], hparams["n_embd"]), ("wpe",): (hparams["n_ctx"], hparams["n_embd"]), **norm}


def block_shapes(n_embd):  # -> {key path within one block: shape}, in the one order
    def norm(name):
        return {(name, "g"): (n_embd,), (name, "b"): (n_embd,)}

    def dense(*name, n_in, n_out):
        return {(*name, "w"): (n_in, n_out), (*name, "b"): (n_out,)}

    return {**norm("ln_1"), **dense("attn", "c_attn", n_in=n_embd, n_out=3 * n_embd),
            **dense("attn", "c_proj", n_in=n_embd, n_out=n_embd), **norm("ln_2"),
            **dense("mlp", "c_fc", n_in=n_embd, n_out=4 * n_embd),
            **dense("mlp", "c_proj", n_in=4 * n_embd, n_out=n_embd)}


def flatten(tree, prefix=()):  # nested dicts and lists -> iterator of (key path, leaf), in the tree's order
    for key, value in tree.items() if isinstance(tree, dict) else enumerate(tree):
        if isinstance(value, (dict, list)):
            yield from flatten(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def nest(flat, n_layer):  # {key path: leaf} -> the nested tree, keys in the one order whatever flat's order
    def subtree(prefix, keys):  # -> nested dicts of flat's leaves under prefix
        tree = {}
        for key in keys:
            node = tree
            for part in key[:-1]:
                node = node.setdefault(part, {})
            node[key[-1]] = flat[prefix + key]
        return tree

    top = subtree((), top_shapes({"n_vocab": 0, "n_ctx": 0, "n_embd": 0}))
    blocks = [subtree(("blocks", layer), block_shapes(0)) for layer in range(n_layer)]
    return {"wte": top["wte"], "wpe": top["wpe"], "blocks": blocks, "ln_f": top["ln_f"]}


def map_leaves(function, tree):  # -> a tree of the same structure and order, each leaf function(leaf)
    if isinstance(tree, dict):
        return {key: map_leaves(function, value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [map_leaves(function, value) for value in tree]
    return function(tree)


def build(hparams, make):  # make(key path, shape) -> leaf; -> the tree of every leaf, in the one order
    # make is called for the blocks first, then wte, wpe and ln_f: the order in which the seeded initialisations
    # below have always drawn their random numbers, so the same seed still gives the same weights
    blocks = {("blocks", layer, *key): shape for layer in range(hparams["n_layer"])
              for key, shape in block_shapes(hparams["n_embd"]).items()}
    shapes = {**blocks, **top_shapes(hparams)}
    return nest({key: make(key, shape) for key, shape in shapes.items()}, hparams["n_layer"])


def gpt2_init(hparams, seed):  # -> float32 params, initialised as GPT-2 was
    """GPT-2's initialisation: every weight matrix and embedding N(0, 0.02); the residual projections (attn.c_proj.w,
    mlp.c_proj.w) scaled by 1/sqrt(2 n_layer), so the residual stream's variance does not grow with depth; biases 0;
    layer norms g = 1, b = 0."""
    rng = np.random.default_rng(seed)
    residual_std = 0.02 / math.sqrt(2 * hparams["n_layer"])

    def make(key, shape):
        if key[-1] == "g":
            return np.ones(shape, np.float32)
        if key[-1] == "b":
            return np.zeros(shape, np.float32)
        std = residual_std if key[-2:] == ("c_proj", "w") else 0.02
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    return build(hparams, make)


def random_params(hparams, seed=0):  # -> float32 params for tests, fixtures and benchmarks
    """Seeded random weights, scaled so that the model is far from trivial: attention scores have a standard deviation
    of about 3 (so a wrong mask or head split changes the output visibly) and logits spread over several units (so
    argmax is stable). Only `numpy.random.default_rng(seed).standard_normal(dtype=float32)` is used, so the numbers are
    the same everywhere."""
    rng = np.random.default_rng(seed)
    n_embd = hparams["n_embd"]
    # q.k / sqrt(d_head) has std ~ std_qk^2 * n_embd for unit-variance inputs: pick std_qk for a spread of ~3
    weight_std = {("c_attn", "w"): math.sqrt(3 / n_embd), ("wte",): 2 / math.sqrt(n_embd), ("wpe",): 0.5,
                  ("c_fc", "w"): 1 / math.sqrt(n_embd)}

    def make(key, shape):
        if key[-1] in ("g", "b"):
            return (key[-1] == "g") + rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
        # the projections back into the residual stream: half the scale of their inputs' width
        std = weight_std.get(key[-2:]) or 0.5 / math.sqrt(shape[0])  # key[-2:] of ("wte",) is ("wte",)
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    return build(hparams, make)
