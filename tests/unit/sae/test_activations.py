"""What an SAE reads (gpt2_numpy/sae/activations.py): a per-head activation as SAELens reads hook_z, and the rows a
run trains on equal to trace's arrays."""
import numpy as np
import pytest

from gpt2_numpy.interpret.tracing import trace
from gpt2_numpy.params import random_params
from gpt2_numpy.sae.activations import Stream, hook_rows, model_rows, rows_back


def test_a_per_head_activation_is_read_as_sae_lens_reads_hook_z():
    # TransformerLens's hook_z is [pos, head, d_head], which SAELens flattens to (head d_head); ours is [head, pos, ...]
    z = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)  # [n_head, n_seq, d_head]
    rows = hook_rows(z, "blocks.0.attn.z")
    assert rows.shape == (3, 8)
    assert all(rows[s, h * 4 + j] == z[h, s, j] for h in range(2) for s in range(3) for j in range(4))
    assert np.array_equal(rows_back(rows, z, "blocks.0.attn.z"), z)
    assert np.array_equal(hook_rows(z[0], "blocks.0.out"), z[0])


@pytest.mark.parametrize("hook", ["embed", "blocks.0.attn.z", "blocks.1.mid", "blocks.1.out", "ln_f"])
def test_the_activations_read_for_training_are_traces(hook):
    hparams = {"n_vocab": 50, "n_ctx": 16, "n_embd": 8, "n_head": 2, "n_layer": 2}
    params, ids = random_params(hparams, 1), np.arange(10) % 50
    assert np.array_equal(model_rows(ids, params, 2, hook), hook_rows(trace(ids, params, 2)[hook], hook))


def test_the_shuffling_buffer_loses_no_row():
    # each row's value is its number: the rows served so far and those still waiting in the buffer are, together,
    # every row of the windows read, each once (a refill that dropped the rows not yet served would lose half)
    read = []

    def window(i):
        read.append(np.arange(10 * i, 10 * i + 10, dtype=np.float32)[:, None])
        return read[-1]

    stream = Stream(window, 7, batch_size=4, capacity=16, seed=0)
    served = [stream.next() for _ in range(30)]
    waiting = stream.rows[stream.served:]
    assert sorted(np.concatenate([*served, waiting])[:, 0]) == sorted(np.concatenate(read)[:, 0])
