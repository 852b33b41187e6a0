"""What an SAE reads and where it goes back: one trace name's activations as rows [n, d_in], streamed window by window
through a seeded shuffling buffer, so that a long text never has to fit in memory; where a run's activations come
from (a Source: a model over a text's windows, or an .npy file); and the edits that put an SAE's reconstruction (or
zeros) in their place, for run_with_edits.

    names = run_with_edits(ids, params, n_head, [splice(sae)])   # the model with the SAE in place of sae.hook

A per-head array of trace's (attn.q, .k, .v, .z: [n_head, n_seq, d_head]) is read as TransformerLens's hook_z is by
SAELens: each position's heads side by side, [n_seq, n_head * d_head].
"""
import hashlib
import json
from typing import Callable, NamedTuple, Optional

import numpy as np

from gpt2_numpy.errors import UsageError
from gpt2_numpy.interpret.edits import Edit
from gpt2_numpy.interpret.names import hook_problem, is_per_head, our_hook, step_of
from gpt2_numpy.interpret.tracing import block_traces, embedding, trace
from gpt2_numpy.params import flatten
from gpt2_numpy.sae.files import check_fits
from gpt2_numpy.sae.processing import attach, model_activation
from gpt2_numpy.sae.releases import load_sae
from gpt2_numpy.sae.transcoders import TARGET

def hook_rows(array, hook):  # trace's array for hook -> [n_seq, d_in]: a row per position
    return np.swapaxes(array, 0, 1).reshape(array.shape[1], -1) if is_per_head(hook) else array


def rows_back(rows, like, hook):  # [n_seq, d_in] -> rows in the shape of trace's array `like` for hook
    if not is_per_head(hook):
        return rows.reshape(like.shape)
    n_head, n_seq = like.shape[:2]
    return np.swapaxes(rows.reshape(n_seq, n_head, -1), 0, 1)


def at_hook(function, hook):  # -> edit function: function([n_seq, d_in]) applied to the array at hook, as rows
    return lambda array: rows_back(function(hook_rows(array, hook)), array, hook)


def splice(sae):  # -> Edit putting sae's reconstruction in place of the activation sae.hook names
    return Edit(sae.hook, at_hook(sae.reconstruct, sae.hook))


def zeroed_activation(sae):  # -> Edit setting the activation the SAE reads to zero: the "no information" baseline
    # of loss recovered (SAELens's zero ablation). What model_activation took out (the mean, the value bias) stays, so
    # a hook_z release's zero keeps the value bias, as TransformerLens's processed model does
    return Edit(sae.hook, at_hook(lambda rows: rows - model_activation(sae, rows), sae.hook))


def check_hook(hook, n_layer):  # -> None; UsageError naming the valid names when trace makes no activation `hook`,
    # or one an SAE cannot stand in for
    problem = hook_problem(hook, n_layer)
    if problem:
        raise UsageError(f"--hook {problem}")
    check_sae_hook(hook)


def check_sae_hook(hook):  # -> None; UsageError for attn.scores and attn.weights, whose rows an SAE cannot stand in for
    if step_of(hook) in ("attn.scores", "attn.weights"):
        raise UsageError(f"an SAE cannot read {hook}: each position's row holds a number for every key, the later "
                         "positions' too, so the SAE would read the future and its splice would leak it into the "
                         "loss; choose another hook (blocks.L.attn.z holds the heads' outputs)")


def resolve_hook(hook, n_layer):  # -> the trace name of a hook (ours, or TransformerLens's), checked
    name = our_hook(hook) or hook
    check_hook(name, n_layer)
    return name


def sae_for_model(folder, params, hparams, models_dir=None):  # -> the SAE in folder (or a release's, downloaded
    # into models_dir), fit for the model; UsageError (one line) otherwise
    sae = attach(load_sae(folder, models_dir=models_dir), params)  # a hook_z release reads the value bias
    if sae.hook is None:
        raise UsageError(f"--sae {folder}'s cfg.json names no hook: add metadata.hook_name (a trace name, or "
                         "TransformerLens's), so that it is known where the SAE reads")
    check_hook(sae.hook, hparams["n_layer"])
    width = model_rows([0], params, hparams["n_head"], sae.hook).shape[-1]  # one token's activation: its width
    check_fits(sae, width, f"the model's {sae.hook}")
    return sae


def model_rows(ids, params, n_head, hook):  # int [n_seq] -> [n_seq, d_in]: hook's activation on one window of tokens
    # trace's walk, stopped at the hook's block: the blocks after it and the [n_seq, n_vocab] logits are not needed
    x = embedding(ids, params["wte"], params["wpe"])
    if hook == "embed":
        return x
    if not hook.startswith("blocks."):
        return hook_rows(trace(ids, params, n_head)[hook], hook)
    layer, step = hook.split(".", 2)[1:]
    *_, steps = block_traces(x, params["blocks"][: int(layer) + 1], n_head)
    return hook_rows(steps[step], hook)


def transcoder_rows(ids, params, n_head, step, layers):  # int [n_seq] -> [n_seq, len(layers), 2 n_embd]: each
    # layer's transcoder input (block L's `step`) and target (its mlp.out) side by side, from one pass
    x = embedding(ids, params["wte"], params["wpe"])
    blocks = list(block_traces(x, params["blocks"][: max(layers) + 1], n_head))
    return np.stack([np.concatenate([blocks[i][step], blocks[i][TARGET]], axis=-1) for i in layers], axis=1)


class Stream:
    """Batches of activation rows, shuffled: windows (window(i) -> [m, d_in], i < n_windows) are read in a seeded
    order, a new one each epoch, into a buffer of about `capacity` rows; the buffer is shuffled, its first half
    served in batches, then refilled and shuffled again, so rows from windows far apart in the text share a batch.
    Its state (the rows left, the order, the RNG) is saved with a run, so a resumed run sees the same batches."""

    def __init__(self, window, n_windows, batch_size, capacity, seed):
        self.window, self.n_windows, self.batch_size = window, n_windows, batch_size
        self.capacity = max(capacity, 2 * batch_size)
        self.rng = np.random.default_rng([seed, 2])  # a stream of its own, apart from the init's draws
        self.order, self.position = self.rng.permutation(n_windows), 0
        self.rows, self.served = None, 0  # the shuffled buffer, and how many of its rows were served

    def next(self):  # -> float32 [batch_size, d_in]
        if self.rows is None or self.served + self.batch_size > len(self.rows) // 2:
            self.refill()
        batch = self.rows[self.served: self.served + self.batch_size]
        self.served += self.batch_size
        return batch

    def refill(self):  # the rows not served, topped up with whole windows to capacity, shuffled
        parts = [] if self.rows is None else [self.rows[self.served:]]
        count = sum(map(len, parts))
        while count < self.capacity:
            if self.position == self.n_windows:  # an epoch ends: a new order
                self.order, self.position = self.rng.permutation(self.n_windows), 0
            parts.append(np.asarray(self.window(int(self.order[self.position])), dtype=np.float32))
            self.position += 1
            count += len(parts[-1])
        rows = np.concatenate(parts)
        self.rows, self.served = rows[self.rng.permutation(len(rows))], 0

    def state(self):  # -> {name: array} for train_state.npz
        rows = np.zeros((0, 0), np.float32) if self.rows is None else self.rows  # whole: when the next refill comes
        return {"stream_rows": rows, "stream_served": np.array(self.served), "stream_order": self.order,  # hangs on
                "stream_position": np.array(self.position),  # its length
                "stream_rng": np.array(json.dumps(self.rng.bit_generator.state))}

    def restore(self, state):  # state: arrays of a run saved with the same windows
        rows = state["stream_rows"]
        self.rows, self.served = (rows if rows.size else None), int(state["stream_served"])
        self.order, self.position = state["stream_order"], int(state["stream_position"])
        self.rng.bit_generator.state = json.loads(str(state["stream_rng"]))


def array_windows(array, rows_per_window=1024):  # [n, d_in] -> (window(i), n_windows): a file's rows, in pieces
    n_windows = -(-len(array) // rows_per_window)
    return (lambda i: array[i * rows_per_window: (i + 1) * rows_per_window]), n_windows


# --- Where a run's activations come from ---


class Source(NamedTuple):
    """Where a run's activations come from."""
    window: Callable  # window(i) -> [m, d_in]: the activations of window i
    n_windows: int
    n_rows: int  # activations in all the windows
    d_in: int
    hook: Optional[str]  # the trace name; None for an .npy file given without --hook
    model_name: Optional[str]
    name: str  # the .npy file or the model, as the run records it
    digest: str  # sha256 of the file, or of the text's tokens
    seq_len: Optional[int]
    model_digest: Optional[str] = None  # sha256 of the model's weights: the same model, whatever path names it
    layers: Optional[list] = None  # a transcoder run's layers (its hook a step of each: ln_2, ...); None for an SAE


def params_digest(params):  # -> sha256 of every weight's values, in the tree's order
    digest = hashlib.sha256()
    for _, leaf in flatten(params):
        digest.update(np.ascontiguousarray(leaf))  # the values in row order, however the array is laid out
    return digest.hexdigest()


def model_source(params, n_head, hook, ids, windows, name, layers=None):  # -> Source: hook's activations on windows
    # [n, seq_len] of the token ids `ids` (the whole text's, whose digest the run records), for the model folder
    # `name`; with layers, a transcoder run's: the step `hook` and mlp.out of each layer (transcoder_rows)
    def window(i):
        if layers is None:
            return model_rows(windows[i], params, n_head, hook)
        return transcoder_rows(windows[i], params, n_head, hook, layers)

    digest = hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()
    n_windows, seq_len = windows.shape
    d_in = window(0).shape[1] if layers is None else params["wte"].shape[1]
    return Source(window, n_windows, n_windows * seq_len, d_in, hook, name, name, digest, seq_len,
                  params_digest(params), layers)


def file_source(path, hook):  # -> Source of the activations an .npy file holds, checked; hook: a trace name or None
    array = read_activations(path)
    window, n_windows = array_windows(array)
    return Source(window, n_windows, len(array), array.shape[1], hook, None, str(path), file_digest(path), None)


def read_activations(path):  # -> float [n, d_in] memory-mapped, checked; UsageError for a file of another shape
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except OSError as error:
        raise UsageError(f"cannot read --activations {path}: {error.strerror or error}") from None
    except (ValueError, EOFError):  # not the .npy format (EOFError: empty), or an array of Python objects (which is
        # never loaded: pickles run code)
        raise UsageError(f"--activations {path} is not an .npy array of numbers: save one of shape [n, d_in] with "
                         "numpy.save") from None
    if not isinstance(array, np.ndarray) or array.ndim != 2 or array.dtype.kind != "f" or 0 in array.shape:
        what = f"an array of {array.dtype} {list(array.shape)}" if isinstance(array, np.ndarray) else "not an array"
        raise UsageError(f"--activations {path} is {what}: it must hold floats of shape [n, d_in], n and d_in >= 1")
    for start in range(0, len(array), 2**16):
        bad = ~np.isfinite(array[start:start + 2**16]).all(axis=1)
        if bad.any():
            raise UsageError(f"--activations {path} holds NaN or infinite values (first in row "
                             f"{start + int(np.argmax(bad)):,}): fix the file")
    return array


def file_digest(path):  # -> sha256 of a file's bytes, read in pieces
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for piece in iter(lambda: file.read(2**20), b""):
            digest.update(piece)
    return digest.hexdigest()
