"""Each row's bound on the machine at hand (issue 58): the work a row's run must do, at the best rates measured here.

A run multiplies its FLOPs and reads its bytes from memory at least once. At the best sgemm rate measured here (large
products) and the best memory read rate (products that stream a weight larger than the cache), no engine can take less
than max(FLOPs / sgemm rate, bytes / read rate): the roofline. A decode step is bound by its bytes (every weight once,
and the KV cache), prefill and training by their FLOPs. The benchmark prints each row of ours (and HF's) as a share of
that bound, 100% being the machine's limit, and decode's goal is the lower of 1.5× HF and 90% of it (goals.py).
"""
import re
import time
from collections import namedtuple

import numpy as np

from scripts.bench.harness import HPARAMS_124M
from scripts.bench.train import CONFIGS

Rates = namedtuple("Rates", "read gemm")  # bytes/s, FLOP/s
Work = namedtuple("Work", "flops bytes")
FLOAT = 4  # bytes of a float32
# the products the rates are the best of: two that stream weights from memory as a decode step does, two large sgemms
N_STREAMED = 28  # [768, 3072] weights for the second read: 264 MB, eight times the L3 cache of the machines here
GEMM_SHAPES = [(1024, 768, 3072), (2048, 2048, 2048)]  # a prefill's MLP, and a square one OpenBLAS runs at its best


def best_seconds(run, repeats):  # -> the least wall time of run() in repeats runs after a warm-up: the machine's best
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def measured_rates(repeats=7):  # -> Rates: the best memory read and sgemm rates here, at the thread count in force
    rng = np.random.default_rng(0)
    return Rates(read_rate(rng, repeats), gemm_rate(rng, repeats))


def read_rate(rng, repeats):  # -> bytes/s: the best of two products that stream their weights, as a decode step does
    wte, x = rng.standard_normal((50257, 768), dtype=np.float32), rng.standard_normal(768, dtype=np.float32)
    weights = [rng.standard_normal((768, 3072), dtype=np.float32) for _ in range(N_STREAMED)]
    row = rng.standard_normal((1, 768), dtype=np.float32)
    return max(wte.nbytes / best_seconds(lambda: wte @ x, repeats),
               sum(w.nbytes for w in weights) / best_seconds(lambda: [row @ w for w in weights], repeats))


def gemm_rate(rng, repeats):  # -> FLOP/s: the best of large sgemms
    rates = []
    for m, k, n in GEMM_SHAPES:
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        rates.append(2 * m * k * n / best_seconds(lambda: a @ b, repeats))
    return max(rates)


def seconds_bound(work, rates):  # -> the fewest seconds a run of this work can take at these rates
    return max(work.flops / rates.gemm, work.bytes / rates.read)


# --- the work of each kind of run, from the model's shape ---


def n_weights(hparams):  # -> the floats a pass reads from its weights: every block, wte (the lm head) and ln_f
    n_embd, n_layer = hparams["n_embd"], hparams["n_layer"]
    per_block = 12 * n_embd**2 + 13 * n_embd  # four weights (3 + 1 + 4 + 4 n_embd²), their biases and two layer norms
    return n_layer * per_block + hparams["n_vocab"] * n_embd + 2 * n_embd  # wpe: a row per position, left out


def causal_pairs(n_past, n_seq):  # -> the (query, key) pairs of n_seq queries after n_past cached keys
    return n_seq * n_past + n_seq * (n_seq + 1) // 2


def forward_work(hparams, n_rows, n_seq, n_past=0, last_only=False):  # -> Work of one forward pass of n_rows rows
    # Linear layers: 2 FLOPs a weight a token. Attention: q kᵀ and the weighted sum, 2 x 2 n_embd FLOPs a pair. With
    # last_only, the last block's attention output, MLP and the lm head run the last position alone
    n_embd, n_layer = hparams["n_embd"], hparams["n_layer"]
    full_layers = n_layer - 1 if last_only else n_layer
    linear = 2 * 12 * n_embd**2 * n_seq * full_layers
    attention = 4 * n_embd * causal_pairs(n_past, n_seq) * full_layers
    if last_only:  # the last block: c_attn for every position, the rest for one
        linear += 2 * 3 * n_embd**2 * n_seq + 2 * 9 * n_embd**2
        attention += 4 * n_embd * (n_past + n_seq)
    logits = 2 * n_embd * hparams["n_vocab"] * (1 if last_only else n_seq)
    cache = 2 * n_layer * n_embd * (n_past + n_seq) * FLOAT  # every cached key and value, read once
    return Work(n_rows * (linear + attention + logits), FLOAT * n_weights(hparams) + n_rows * cache)


def steps_seconds(hparams, rates, n_rows, n_past, n_steps):  # -> the fewest seconds for n_steps decode steps
    return sum(seconds_bound(forward_work(hparams, n_rows, 1, past), rates) for past in range(n_past, n_past + n_steps))


def train_work(hparams, n_rows, n_seq):  # -> Work of one training step: forward, backward, AdamW
    # The backward multiplies twice what the forward does (into the inputs and into the weights); AdamW reads the
    # weights, their gradient and its two moments, and writes three of them back (wte counted once: GPT-2 ties it)
    forward = forward_work(hparams, n_rows, n_seq)
    return Work(3 * forward.flops, 7 * FLOAT * n_weights(hparams))


def bound_seconds(metric, rates, hparams):  # -> (the fewest seconds for the row's run, the tokens it makes), or None
    if found := re.match(r"prefill (\d+) tokens, (last)?", metric):
        return seconds_bound(forward_work(hparams, 1, int(found[1]), last_only=bool(found[2])), rates), None
    if found := re.match(r"decode with KV cache, (\d+)-token prompt \+ (\d+)", metric):
        n_prompt, n_new = map(int, found.groups())  # timed: n_new steps after an untimed prefill (engines.py)
        return steps_seconds(hparams, rates, 1, n_prompt, n_new), n_new
    if found := re.match(r"generate, (\d+) prompts of (\d+) tokens \+ (\d+) new", metric):
        n_rows, n_prompt, n_new = map(int, found.groups())  # the prefill's logits give the first new token
        prefill = seconds_bound(forward_work(hparams, n_rows, n_prompt, last_only=True), rates)
        return prefill + steps_seconds(hparams, rates, n_rows, n_prompt, n_new - 1), n_rows * n_new
    if (found := re.match(r"train (?:step|tokens/s), (.+?)(?: \(s\))?$", metric)) and found[1] in CONFIGS:
        config_hparams, (n_rows, n_seq) = CONFIGS[found[1]]
        return seconds_bound(train_work(config_hparams, n_rows, n_seq), rates), n_rows * n_seq
    return None


def bound(metric, rates, hparams=HPARAMS_124M):  # -> the row's bound in its own units (its best value), or None
    found = bound_seconds(metric, rates, hparams)
    if found is None:
        return None
    seconds, n_tokens = found
    return seconds if metric.endswith("(s)") else n_tokens / seconds


def share(r, name):  # -> the fraction of its bound the row's value under name reaches (1: the machine's limit)
    value = r.get(name)
    if value is None or r.get("bound") is None:
        return None
    return r["bound"] / value if r["better"] == "lower" else value / r["bound"]


def bounded(r):  # -> whether the row has a bound (its run's work is known)
    return bound_seconds(r["metric"], Rates(1.0, 1.0), HPARAMS_124M) is not None


def with_bounds(rows, rates):  # -> rows, each that has a bound at these rates (None: none) carrying it under "bound"
    if rates is None:
        return rows
    return [{**r, "bound": value} if (value := bound(r["metric"], rates)) is not None else r for r in rows]


def bound_lines(rows, rates, names):  # -> markdown: the rates, then a row per bounded row, its value and shares
    bounded = [r for r in rows if r.get("bound") is not None]
    if not bounded:
        return []
    lines = [f"Best rates measured here: memory read {rates.read / 1e9:.1f} GB/s, sgemm {rates.gemm / 1e9:.0f} GFLOP/s "
             "(max(FLOPs / sgemm, bytes / read) is each row's bound: no engine does better)", "",
             "| metric | bound | " + " | ".join(f"{name}, share of bound" for name in names) + " |",
             "|---|---|" + "---|" * len(names)]
    for r in bounded:
        cells = [f"{r[name]:,.3g} ({share(r, name):.0%})" if r.get(name) is not None else "" for name in names]
        lines.append(f"| {r['metric']} | {r['bound']:,.3g} | " + " | ".join(cells) + " |")
    return lines
