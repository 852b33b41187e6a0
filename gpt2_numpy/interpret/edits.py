"""Edits in a forward pass: trace's walk through model.py's functions, with named arrays replaced as they are made, so
everything downstream is computed from the replacement. Ablation (ablation.py) and activation patching (patching.py)
are built on it; direct logit attribution (attribution.py) reads one unedited run, trace's.

    edits = [Edit("blocks.1.attn.z", np.zeros_like, head=3)]   # head 3 of layer 1 switched off
    names = run_with_edits(ids, params, n_head, edits)         # trace's names, with the edit in place

An edit names an array as trace does (tracing.py's docstring lists them) and gives a function of it that returns its
replacement, of the same shape: any function of the array, so Edit(name, f) puts f(activation) in the activation's
place (a zero, a mean, another run's array, a reconstruction). The per-head arrays (attn.q, .k, .v, .scores, .weights,
.z: [..., n_head, n_seq, ...]) can be edited one head at a time: with head=H the function gets and returns that head's
[..., n_seq, ...] alone. Edits of one name apply in the order given. No edits: trace itself, the same walk, so the
same arrays bit for bit.

A run may start at a block, from a residual stream of its own (start_at_layer, as TransformerLens's), and may return
only some arrays (names): it stops once the last of them is made, and keeps no other.
"""
import functools
import numbers
from typing import Callable, NamedTuple, Optional

import numpy as np

from gpt2_numpy.console import plural
from gpt2_numpy.interpret.names import HEAD_STEPS, run_names, step_of
from gpt2_numpy.interpret.tracing import walk


class Edit(NamedTuple):
    name: str  # an array of trace's: "embed", "blocks.{L}.attn.z", "blocks.{L}.out", ...
    function: Callable  # array -> its replacement, of the same shape
    head: Optional[int] = None  # for a per-head array: edit this head's slice only


def run_with_edits(inputs, params, n_head, edits, start_at_layer=None, names=None):  # -> {name: float32 array}
    """trace(inputs, params, n_head) with `edits` in place: each named array replaced as it is made, and the arrays
    after it computed from the replacement.

    start_at_layer=L: inputs is the residual stream entering block L ([..., n_seq, n_embd]: leading axes are runs of
    their own), not token ids, and the run starts there; its arrays are those of blocks L.. and ln_f, logits.
    names: the arrays to return (all the run makes when None); the run stops after the last of them is made, so one
    that asks for "ln_f" computes no logits, and it drops the others as it goes.

    ValueError, before anything runs, for an edit or a name that the run does not make, a head out of range, or a
    start that is no block's; ValueError when an edit's function changes the shape."""
    check_start(inputs, start_at_layer, len(params["blocks"]), params["wte"].shape[1])
    made = run_names(len(params["blocks"]), start_at_layer)
    check_edits(edits, made, n_head)
    wanted = set(made if names is None else check_names(names, made))
    kept = {}
    for name, array in walk(inputs, params, n_head, functools.partial(apply_edits, edits), start_at_layer):
        if name in wanted:
            kept[name] = array
            if len(kept) == len(wanted):  # nothing after this is asked for: the run stops here
                break
    return kept


def check_start(inputs, start_at_layer, n_layer, n_embd):  # -> None; ValueError for a start no run can make
    if start_at_layer is None:
        return
    if isinstance(start_at_layer, bool) or not isinstance(start_at_layer, numbers.Integral) or not (
            0 <= start_at_layer <= n_layer):
        raise ValueError(f"start_at_layer={start_at_layer!r}: a run starts at block 0 to {n_layer} (at ln_f)")
    if np.ndim(inputs) < 2 or np.shape(inputs)[-1] != n_embd:
        raise ValueError(f"a run started at block {start_at_layer} takes the residual stream entering it, [..., n_seq, "
                         f"{n_embd}], not an array of shape {np.shape(inputs)}")


def check_edits(edits, made, n_head):  # -> None; ValueError for an edit of no array of the run, or of no head
    check_names([edit.name for edit in edits], made)
    for edit in edits:
        if edit.head is not None and step_of(edit.name) not in HEAD_STEPS:
            raise ValueError(f"{edit.name} has no heads: head= edits a per-head array ({', '.join(HEAD_STEPS)})")
        if edit.head is not None:
            check_index(edit.head, n_head, f"{edit.name}: head", "head", " per layer")


def check_names(names, made):  # -> names; ValueError, naming them, for the names that the run does not make
    unknown = sorted(set(names) - set(made))
    if unknown:
        start = "" if made[0] == "embed" else f" (this run starts at {made[0].rpartition('.')[0].rpartition('.')[0]})"
        raise ValueError(f"no activation is named {', '.join(unknown)}{start}: the names are trace's "
                         "(interpret/names.py)")
    return names


def check_index(value, count, what, noun, where=""):  # -> None; ValueError unless 0 <= value < count, a whole number
    # NumPy would take -1 as the last one, and a float or True as some index: the library refuses them by name
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value < count:
        raise ValueError(f"{what} {value!r} is out of range: this model has {plural(count, noun)}{where}, numbered 0 "
                         f"to {count - 1}")


def apply_edits(edits, name, array):  # -> array after the edits that name it, in order; the array itself if none do
    for edit in edits:
        if edit.name == name:
            array = edited(array, edit.function, edit.head)
    return array


def edited(array, function, head):  # [...] -> [...]: function(array), or with head `head`'s slice alone replaced
    if head is None:
        return same_shape(function(array), array)
    array = array.copy()  # the run's other arrays, and a caller's, keep their values
    # the head axis is third from the end ([..., n_head, n_seq, ...]): a batch of runs keeps its leading axes
    array[..., head, :, :] = same_shape(function(array[..., head, :, :]), array[..., head, :, :])
    return array


def same_shape(new, old):  # -> new as an array of old's dtype; ValueError when an edit changed the shape
    new = np.asarray(new, dtype=old.dtype)
    if new.shape != old.shape:
        raise ValueError(f"an edit returned shape {new.shape} for an array of shape {old.shape}")
    return new


def resid_pre(layer):  # -> the name of the residual stream entering block `layer` (TransformerLens's resid_pre)
    return "embed" if layer == 0 else f"blocks.{layer - 1}.out"
