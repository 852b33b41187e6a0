"""Would two threads speed up prefill attention? fast.causal_attention against the same attention with its elementwise
passes (mask, shifted exp, row sums) split over two threads, half the heads each, the two taking turns.

    python scripts/attention_threads.py

It runs twice: in this process, and in a child with OPENBLAS_THREAD_TIMEOUT=4, which makes OpenBLAS's worker threads
sleep as soon as a product ends instead of spinning on the second core. That variable only works when set before
NumPy loads, so a library cannot set it for its user; fast.py stays single-threaded (README, Performance).
"""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from benchmark import in_turns, wall_seconds  # noqa: E402
from gpt2_numpy import fast, keep_freed_memory  # noqa: E402

POOL = ThreadPoolExecutor(2)


def shifted_exp_and_sums(scores, mask):  # one thread's heads: fast.attention's passes between its two einsums
    scores += mask
    fast.shifted_exp(scores, out=scores)
    return scores.sum(axis=-1, keepdims=True)


def attention_on_two_threads(q, k, v, mask):  # fast.attention, its elementwise passes split by heads
    scores = fast.attention_scores(q, k)
    half = scores.shape[-3] // 2
    halves = [scores[..., :half, :, :], scores[..., half:, :, :]]
    sums = list(POOL.map(shifted_exp_and_sums, halves, [mask, mask]))  # list(): wait for both threads
    out = fast.einsum("...kd,...qk->...qd", v, scores, n_macs=scores.size * v.shape[-1])
    out /= np.concatenate(sums, axis=-3)
    return out


def twelve_layers(attention, q, k, v, mask):  # -> run(): 12 layers' causal attention with this attention function
    def run():
        single = fast.attention
        fast.attention = attention  # causal_attention calls it block by block
        try:
            for _ in range(12):
                fast.causal_attention(q, k, v, mask)
        finally:
            fast.attention = single
    return run


def main():
    keep_freed_memory()
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((12, 1024, 64), dtype=np.float32) for _ in range(3))
    mask = fast.causal_mask(1024, 1024)
    np.testing.assert_array_equal(attention_on_two_threads(q, k, v, mask), fast.attention(q, k, v, mask))  # same ops
    seconds = in_turns({"one thread": wall_seconds(twelve_layers(fast.attention, q, k, v, mask)),
                        "two threads": wall_seconds(twelve_layers(attention_on_two_threads, q, k, v, mask))}, 9)
    timeout = os.environ.get("OPENBLAS_THREAD_TIMEOUT", "unset (OpenBLAS's default)")
    print(f"OPENBLAS_THREAD_TIMEOUT {timeout}: 12 layers of attention, 12 heads x 1024 positions: "
          + ", ".join(f"{name} {s * 1e3:.0f} ms" for name, s in seconds.items()))
    if "OPENBLAS_THREAD_TIMEOUT" not in os.environ:
        subprocess.run([sys.executable, __file__], env={**os.environ, "OPENBLAS_THREAD_TIMEOUT": "4"}, check=True)


if __name__ == "__main__":
    main()
