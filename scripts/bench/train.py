"""Training speed and memory: one step (loss and gradients, then clipping and AdamW) of gpt2_numpy against torch.

    python -m scripts.bench.train                  # our numbers only
    python -m scripts.bench.train --compare-torch  # also torch autograd on HF's GPT2LMHeadModel, in turns

Three configs: a small one (4 layers, 256 wide, 8 heads, 8 x 128 tokens) with GPT-2's 50,257-token vocabulary and with a
4,096-token one of its own (train --vocab-size), and the 124M shape (4 x 256 tokens); seeded random weights. torch runs
HF's GPT2LMHeadModel (its default sdpa attention, dropout off), `cross_entropy` on the logits, `clip_grad_norm_` and
`torch.optim.AdamW` with the same decay groups, on as many threads as NumPy's BLAS uses. The engines take turns, step by
step; each time is the median of `--repeats` steps after a warm-up. The peak memory of the 124M step is each engine's in
a fresh process (VmHWM). The small config's step once more in a fresh process that never calls keep_freed_memory(),
glibc's default allocator for both engines, as a program that imports them runs them. Where our time goes: one more step
with the backward's functions wrapped in stopwatches (exclusive times: a part's callees are not in it).
scripts/benchmark.py runs these rows as its "training" part, with torch under HF's name.
"""
import argparse
import json
import threading
import time

import numpy as np

from gpt2_numpy import fast, fast_backward, keep_freed_memory, optim, training
from gpt2_numpy.params import random_params
from scripts.bench.harness import (OURS, PEAK_RSS_BYTES, blas_threads, comparison_table, fresh_process, in_turns, row,
                                   wall_seconds)

TORCH = "torch"
CONFIGS = {  # name -> hparams, (batch, n_seq)
    "4 layers x 256 wide, 8 x 128 tokens": (
        {"n_vocab": 50257, "n_ctx": 1024, "n_embd": 256, "n_head": 8, "n_layer": 4}, (8, 128)),
    "the same with its own 4,096-token vocabulary": (  # train --vocab-size 4096: the Shakespeare demo's
        {"n_vocab": 4096, "n_ctx": 1024, "n_embd": 256, "n_head": 8, "n_layer": 4}, (8, 128)),
    "124M shape, 4 x 256 tokens": (
        {"n_vocab": 50257, "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12}, (4, 256)),
}
LR = 1e-4


def batch(hparams, shape):  # -> fixed pseudo-random inputs and targets
    rng = np.random.default_rng(0)
    return rng.integers(0, hparams["n_vocab"], shape), rng.integers(0, hparams["n_vocab"], shape)


def our_step(hparams, params, inputs, targets):  # -> step(): one training step of ours, updating params in place
    state = optim.adamw_state(params)

    def step():
        training.train_step(inputs, targets, params, hparams["n_head"], state, LR)
    return step


def torch_step(hparams, params, inputs, targets):  # -> step(): the same step in torch, on HF's GPT2LMHeadModel
    import torch
    from scripts.fixtures.make_reference import hf_model

    torch.set_num_threads(blas_threads())
    model = hf_model(hparams, params, attn_implementation="sdpa").train()  # HF's default attention; dropout is 0
    weights = list(model.parameters())  # the tied wte once
    optimizer = torch.optim.AdamW([{"params": [w for w in weights if w.ndim >= 2], "weight_decay": optim.WEIGHT_DECAY},
                                   {"params": [w for w in weights if w.ndim < 2], "weight_decay": 0.0}],
                                  lr=LR, betas=optim.BETAS, eps=optim.EPS)
    inputs, targets = torch.from_numpy(inputs), torch.from_numpy(targets)

    def step():
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs).logits
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(weights, optim.CLIP)
        optimizer.step()
    return step


# --- where our time goes ---

TIMED = {  # module -> the functions a step calls through its globals, each timed without its timed callees
    fast_backward: ["linear_forward", "linear_backward", "attention_forward", "attention_backward_kept",
                    "gelu_backward_kept", "layer_norm_forward", "layer_norm_backward_kept", "cross_entropy_in_place",
                    "lm_head_backward_scaled", "embedding_backward_into"],
    fast: ["gelu"],  # the forward's gelu, the tuned pass's
    training: ["global_norm", "adamw_step"],  # as train_step calls them
}


def our_parts(step):  # -> {function: exclusive seconds, "total": seconds} of one step()
    # A part that runs on several threads at once (each its own sequences: fast_backward.by_sequences) counts the mean
    # of its threads' times, about its share of the step's
    by_thread, calls = {}, threading.local()  # (thread, function) -> seconds; calls.stack: the time spent in callees
    # of each of the thread's running timed calls

    def stopwatch(name, function):
        def timed(*args, **kwargs):
            stack = calls.__dict__.setdefault("stack", [])
            start = time.perf_counter()
            stack.append(0.0)
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                key = threading.get_ident(), name
                by_thread[key] = by_thread.get(key, 0.0) + elapsed - stack.pop()
                if stack:
                    stack[-1] += elapsed
        return timed

    originals = [(module, name, getattr(module, name)) for module, names in TIMED.items() for name in names]
    for module, name, function in originals:
        setattr(module, name, stopwatch(name, function))
    try:
        start = time.perf_counter()
        step()
        total = time.perf_counter() - start
    finally:
        for module, name, function in originals:
            setattr(module, name, function)
    seconds = {name: float(np.mean([value for (_, part), value in by_thread.items() if part == name]))
               for name in {name for _, name in by_thread}}
    seconds["total"] = total
    seconds["rest (lm head forward matmul, residual adds, Python)"] = (
        seconds["total"] - sum(value for name, value in seconds.items() if name != "total"))
    return seconds


# --- peak memory, each engine in a fresh process ---

PEAK_RSS = PEAK_RSS_BYTES + """
import sys
from scripts.bench import train as b
b.keep_freed_memory()  # as the CLIs do
hparams, shape = b.CONFIGS[sys.argv[1]]
params = b.random_params(hparams, seed=0)
step = (b.our_step if sys.argv[2] == "ours" else b.torch_step)(hparams, params, *b.batch(hparams, shape))
del params  # the step holds them
step()
step()  # the second step: the optimizer's moments exist now
print(peak_rss_bytes())
"""


def peak_rss_mb(config, engine):
    return int(fresh_process(PEAK_RSS, config, engine).split()[-1]) / 1e6


# --- a program's step: glibc's default allocator, as a program that imports both engines runs them ---

LIBRARY_STEP = """
import json, sys
from scripts.bench import train as b
from gpt2_numpy import cores
from scripts.bench.harness import in_turns, wall_seconds
hparams, shape = b.CONFIGS[sys.argv[1]]
cores.set_threads(int(sys.argv[3]))  # the parent's count, for both engines (torch_step gives torch OpenBLAS's)
engines = {"ours": b.our_step, "torch": b.torch_step}
steps = {name: engines[name](hparams, b.random_params(hparams, seed=0), *b.batch(hparams, shape))
         for name in sys.argv[4:]}
print(json.dumps(in_turns({name: wall_seconds(step) for name, step in steps.items()}, int(sys.argv[2]))))
"""


def library_seconds(config, repeats, engines):  # -> {engine: median seconds} of steps in turns in a fresh process
    # that never calls keep_freed_memory(): train_step keeps its own largest arrays (allocator.kept_scratch), and this
    # row shows it does
    return json.loads(fresh_process(LIBRARY_STEP, config, repeats, blas_threads(), *engines).splitlines()[-1])


def train_rows(repeats, compare_torch, theirs=TORCH):  # -> the table rows (torch's values under theirs), breakdown
    rows, parts = [], {}
    for config, (hparams, shape) in CONFIGS.items():
        inputs, targets = batch(hparams, shape)
        steps = {OURS: our_step(hparams, random_params(hparams, seed=0), inputs, targets)}
        if compare_torch:
            steps[theirs] = torch_step(hparams, random_params(hparams, seed=0), inputs, targets)
        seconds = in_turns({name: wall_seconds(step) for name, step in steps.items()}, repeats)
        rows.append(row(f"train step, {config} (s)", "lower", seconds))
        rows.append(row(f"train tokens/s, {config}", "higher",
                        {name: inputs.size / value for name, value in seconds.items()}))
        parts[config] = our_parts(steps[OURS])
    config_124m = next(name for name in CONFIGS if name.startswith("124M"))
    memory = {OURS: peak_rss_mb(config_124m, "ours")}
    if compare_torch:
        memory[theirs] = peak_rss_mb(config_124m, "torch")
    rows.append(row(f"peak RSS of a train step, {config_124m} (MB, fresh process)", "lower", memory))
    config = next(iter(CONFIGS))
    library = library_seconds(config, repeats, ["ours", "torch"] if compare_torch else ["ours"])
    rows.append(row(f"train step, {config}, without keep_freed_memory() (s, fresh process)", "lower",
                    {OURS: library["ours"], **({theirs: library["torch"]} if compare_torch else {})}))
    return rows, breakdown_lines(parts)


def breakdown_lines(parts):
    names = sorted({name for seconds in parts.values() for name in seconds} - {"total"},
                   key=lambda name: -max(seconds.get(name, 0) for seconds in parts.values()))
    lines = ["| our step's part (ms, exclusive) | " + " | ".join(parts) + " |", "|---|" + "---|" * len(parts)]
    for name in [*names, "total"]:
        lines.append(f"| {name} | " + " | ".join(f"{s.get(name, 0) * 1e3:,.0f}" for s in parts.values()) + " |")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare-torch", action="store_true", help="also run torch on the same weights, in turns")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    keep_freed_memory()  # as the CLIs and scripts/benchmark.py do
    rows, breakdown = train_rows(args.repeats, args.compare_torch)
    print(f"BLAS threads {blas_threads()}, numpy {np.__version__}\n")
    print("\n".join(comparison_table(rows, [OURS, TORCH] if args.compare_torch else [OURS]) + [""] + breakdown))


if __name__ == "__main__":
    main()
