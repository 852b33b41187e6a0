"""The checks that every forward pass shares (fast.py, decode.py, likelihood.py, interpret/, training): token ids,
the head count and the logits, each refused with a message that names what is wrong instead of failing deep inside
NumPy or giving garbage."""
import numbers

import numpy as np

from gpt2_numpy.errors import NonFiniteError


def check_inputs(inputs, n_vocab, n_ctx, n_past=0):  # [(n_rows,) n_seq] -> int64 [(n_rows,) n_seq]
    # NumPy would wrap negative ids silently (and wpe would run short past n_ctx), so both are refused here, by name
    ids = np.asarray(inputs)
    if ids.ndim not in (1, 2) or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"token ids must be a non-empty 1-D sequence of integers (or a 2-D batch of equally long ones), got "
            f"{ids.dtype} shape {ids.shape}"
        )
    bad = ids[(ids < 0) | (ids >= n_vocab)]
    if len(bad):
        raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {n_vocab})")
    if n_past + ids.shape[-1] > n_ctx:
        raise ValueError(f"{n_past + ids.shape[-1]} positions exceed the model's context of n_ctx={n_ctx} tokens")
    return ids.astype(np.int64, copy=False)


def check_heads(n_head, n_embd):  # -> None; ValueError unless n_head is a whole number >= 1 that divides n_embd
    # else the heads' reshape fails deep inside with NumPy's words (hparams["n_head"] is the usual source)
    if isinstance(n_head, bool) or not isinstance(n_head, numbers.Integral) or n_head < 1 or n_embd % n_head:
        raise ValueError(f"n_head={n_head!r} must be a whole number >= 1 that divides n_embd={n_embd}: pass the "
                         "model's hparams['n_head']")


def check_finite(logits):  # [..., n_vocab] -> None, or NonFiniteError when any logit is NaN or infinite
    # NaN logits would make sampling fail with an IndexError and greedy pick id 0 every step. The check reads the
    # last row's logits once: a small part of a decode step, which reads every weight.
    if not np.isfinite(logits).all():
        raise NonFiniteError
