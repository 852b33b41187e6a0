"""Keep the memory a forward pass frees for the next one (glibc only; elsewhere a no-op).

A forward pass allocates and frees the same large temporaries layer after layer: a block's attention scores
[n_head, 128, n_seq] and the ffn's [n_seq, 4 n_embd] activations are megabytes each. By default glibc maps each such
array fresh from the kernel and unmaps it when freed (or, for smaller ones, trims its heap), and the next array
touches the memory again page by page, faulting every page in anew. `python -m scripts.benchmark --only allocator`
measures both ways in fresh processes: the page faults and the share of a 1024-token prefill that they cost.
The CLIs call keep_freed_memory() once, before their first forward pass; programs that call the model functions
directly can too. From then on the arrays too large for glibc's heap that a pass uses only inside itself (a training
step's [n_positions, n_vocab] logits, 206 MB at 8 x 128 tokens) come from scratch(), which keeps each one for the
next pass instead of faulting its pages in anew. A training step keeps its own whether or not keep_freed_memory() was
called (kept_scratch(): a loop of steps, each as large as the last); release_scratch() frees them.
"""
import ctypes
import threading
from contextlib import contextmanager

import numpy as np

# glibc's mallopt options (malloc.h)
M_TOP_PAD = -2  # free bytes the heap keeps at its top when it shrinks, instead of returning them to the kernel
M_MMAP_THRESHOLD = -3  # arrays from this size up get their own mapping, unmapped again when freed
HEAP_ARRAYS_UP_TO = 32 << 20  # the cap of glibc's own sliding threshold: a [1024, 3072] activation (12.6 MB) comes
# from the heap; larger arrays (all 1024 positions' logits, a batch's scores) still get their own mapping
KEPT_BYTES = 256 << 20  # more than the temporaries of a 1024-token pass of the 124M model
keeping = {"on": False}  # whether keep_freed_memory() was called: scratch() then keeps its arrays
scratches = threading.local()  # name -> the array scratch() last gave this thread under that name
holding = threading.local()  # holding.depth: this thread's kept_scratch() blocks under way


def keep_freed_memory():  # -> True if glibc now reuses freed arrays instead of returning them to the kernel
    """Have glibc serve the model's large temporary arrays from its heap and keep up to 256 MB of freed heap for
    reuse instead of returning it to the kernel. That memory was in use a moment before, so the process's peak
    barely grows; only its size between passes stays up. Returns False where the C library has no mallopt (macOS,
    Windows)."""
    keeping["on"] = True
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols, which include its C library's
    except (OSError, AttributeError, TypeError):  # Windows (no such handle), or a C library without mallopt
        return False
    # both: M_TOP_PAD alone freezes the mapping threshold at its 128 KB start, so every array gets mapped, and
    # M_MMAP_THRESHOLD alone freezes trimming at 128 KB, so freed heap goes back to the kernel
    return mallopt(M_MMAP_THRESHOLD, HEAP_ARRAYS_UP_TO) == 1 and mallopt(M_TOP_PAD, KEPT_BYTES) == 1


def scratch(name, shape, dtype):  # -> an array of shape and dtype, its values undefined
    """After keep_freed_memory() or within kept_scratch(), the same memory as this thread's last scratch(name, ...) of
    that size (a pass's largest temporary, used again by the next pass); otherwise a new array, freed with its last
    reference. The caller uses it only until its next call with name."""
    if not (keeping["on"] or getattr(holding, "depth", 0)):
        return np.empty(shape, dtype)
    kept = getattr(scratches, name, None)
    if kept is None or kept.shape != tuple(shape) or kept.dtype != dtype:
        kept = np.empty(shape, dtype)
        setattr(scratches, name, kept)
    return kept


@contextmanager
def kept_scratch():  # within: scratch() keeps its arrays on this thread, as after keep_freed_memory()
    # for a caller that runs the same large pass again and again (training.train_step): its arrays stay between calls,
    # until release_scratch()
    holding.depth = getattr(holding, "depth", 0) + 1
    try:
        yield
    finally:
        holding.depth -= 1


def release_scratch():  # -> None; the arrays scratch() keeps for this thread are freed (with their last reference)
    scratches.__dict__.clear()
