"""Edits in a forward pass: trace's walk through model.py's functions, with named arrays replaced as they are made, so
everything downstream is computed from the replacement. Ablation (ablation.py), activation patching (patching.py) and
direct logit attribution (attribution.py) are built on it.

    edits = [Edit("blocks.1.attn.z", np.zeros_like, head=3)]   # head 3 of layer 1 switched off
    names = run_with_edits(ids, params, n_head, edits)         # trace's names, with the edit in place

An edit names an array as trace does (tracing.py's docstring lists them) and gives a function of it that returns its
replacement, of the same shape. The per-head arrays (attn.q, .k, .v, .scores, .weights, .z: [n_head, n_seq, ...]) can
be edited one head at a time: with head=H the function gets and returns that head's [n_seq, ...] alone. Edits of one
name apply in the order given. No edits: trace itself, the same walk, so the same arrays bit for bit.
"""
import functools
from typing import Callable, NamedTuple, Optional

import numpy as np

from gpt2_numpy.interpret.tracing import trace


class Edit(NamedTuple):
    name: str  # an array of trace's: "embed", "blocks.{L}.attn.z", "blocks.{L}.out", ...
    function: Callable  # array -> its replacement, of the same shape
    head: Optional[int] = None  # for a per-head array: edit this head's slice only


def run_with_edits(inputs, params, n_head, edits):  # int [n_seq], [Edit] -> {name: float32 array}, trace's names
    """trace(inputs, params, n_head) with `edits` in place: each named array replaced as it is made, and the arrays
    after it computed from the replacement. ValueError for an edit whose name trace does not make, or whose function
    changes the shape."""
    names = trace(inputs, params, n_head, edit=functools.partial(apply_edits, edits))
    unknown = sorted({edit.name for edit in edits} - names.keys())
    if unknown:
        raise ValueError(f"no activation is named {', '.join(unknown)}: the names are trace's (interpret/tracing.py)")
    return names


def apply_edits(edits, name, array):  # -> array after the edits that name it, in order; the array itself if none do
    for edit in edits:
        if edit.name == name:
            array = edited(array, edit.function, edit.head)
    return array


def edited(array, function, head):  # [...] -> [...]: function(array), or with array[head] alone replaced
    if head is None:
        return same_shape(function(array), array)
    array = array.copy()  # the run's other arrays, and a caller's, keep their values
    array[head] = same_shape(function(array[head]), array[head])
    return array


def same_shape(new, old):  # -> new as an array of old's dtype; ValueError when an edit changed the shape
    new = np.asarray(new, dtype=old.dtype)
    if new.shape != old.shape:
        raise ValueError(f"an edit returned shape {new.shape} for an array of shape {old.shape}")
    return new


def resid_pre(layer):  # -> the name of the residual stream entering block `layer` (TransformerLens's resid_pre)
    return "embed" if layer == 0 else f"blocks.{layer - 1}.out"
