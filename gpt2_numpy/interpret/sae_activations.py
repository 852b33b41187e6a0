"""What an SAE reads and where it goes back: one trace name's activations as rows [n, d_in], streamed window by window
through a seeded shuffling buffer, so that a long text never has to fit in memory; and the edits that put an SAE's
reconstruction (or zeros) in their place, for run_with_edits.

    names = run_with_edits(ids, params, n_head, [splice(sae)])   # the model with the SAE in place of sae.hook

A per-head array of trace's (attn.q, .k, .v, .z: [n_head, n_seq, d_head]) is read as TransformerLens's hook_z is by
SAELens: each position's heads side by side, [n_seq, n_head * d_head].
"""
import json

import numpy as np

from gpt2_numpy.errors import UsageError
from gpt2_numpy.interpret.edits import Edit
from gpt2_numpy.interpret.tracing import BLOCK_STEPS, block_traces, embedding, run_names, trace

PER_HEAD_STEPS = ("attn.q", "attn.k", "attn.v", "attn.z", "attn.scores", "attn.weights")


def per_head(hook):  # -> True for a trace name of shape [n_head, n_seq, ...]
    return hook.split(".", 2)[-1] in PER_HEAD_STEPS


def hook_rows(array, hook):  # trace's array for hook -> [n_seq, d_in]: a row per position
    return np.swapaxes(array, 0, 1).reshape(array.shape[1], -1) if per_head(hook) else array


def rows_back(rows, like, hook):  # [n_seq, d_in] -> rows in the shape of trace's array `like` for hook
    if not per_head(hook):
        return rows.reshape(like.shape)
    n_head, n_seq = like.shape[:2]
    return np.swapaxes(rows.reshape(n_seq, n_head, -1), 0, 1)


def splice(sae):  # -> Edit putting sae's reconstruction in place of the activation sae.hook names
    return Edit(sae.hook, lambda array: rows_back(sae.reconstruct(hook_rows(array, sae.hook)), array, sae.hook))


def check_hook(hook, n_layer):  # -> None; UsageError naming the valid names when trace makes no activation `hook`,
    # or one an SAE cannot stand in for
    names = run_names(n_layer)
    if hook not in names:
        shown = ", ".join(names[:3] + ["...", names[-1]]) if len(names) > 12 else ", ".join(names)
        raise UsageError(f"--hook {hook!r} is not an activation of this {n_layer}-layer model: the names are embed, "
                         f"blocks.L.STEP for L from 0 to {n_layer - 1} and STEP one of {', '.join(BLOCK_STEPS)}; "
                         f"ln_f.normalized, ln_f and logits (in order: {shown})")
    check_sae_hook(hook)


def check_sae_hook(hook):  # -> None; UsageError for attn.scores and attn.weights, whose rows an SAE cannot stand in for
    if hook.split(".", 2)[-1] in ("attn.scores", "attn.weights"):
        raise UsageError(f"an SAE cannot read {hook}: each position's row holds a number for every key, the later "
                         "positions' too, so the SAE would read the future and its splice would leak it into the "
                         "loss; choose another hook (blocks.L.attn.z holds the heads' outputs)")


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
