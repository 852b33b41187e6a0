"""Where the time of a forward pass goes (the "breakdown" part): ours timed function by function, HF's module by
module with forward hooks, on a 1024-token prefill, one decode step and one batch step; under them the floors this
machine sets (its sgemm speed, memory bandwidth and exp speed)."""
import time

import numpy as np

from gpt2_numpy import fast as model
from gpt2_numpy.params import flatten
from scripts.bench import roofline
from scripts.bench.harness import HPARAMS_124M, OURS, batch_prompts, blas_threads, median_seconds, prompt_ids

TIMED = ["linear", "mha", "ffn", "gelu", "layer_norm", "lm_head"]


def stopwatch(seconds, name, function):  # -> function, adding the time of each call to seconds[name]
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[name] += time.perf_counter() - start
    return timed


def timed_run(run, seconds):  # -> seconds, with the wall time of one run() as seconds["total"]
    start = time.perf_counter()
    run()
    seconds["total"] = time.perf_counter() - start
    return seconds


def our_parts(run):  # -> {part: seconds} of one run(), timing fast.py's functions where they are called
    seconds = dict.fromkeys(TIMED, 0.0)
    originals = {name: getattr(model, name) for name in TIMED}
    run()  # the warm-up, before the functions are wrapped
    for name, function in originals.items():
        setattr(model, name, stopwatch(seconds, name, function))
    try:
        timed_run(run, seconds)
    finally:
        for name, function in originals.items():
            setattr(model, name, function)
    ffn_linear = seconds["ffn"] - seconds["gelu"]
    seconds["attention"] = seconds["mha"] - (seconds["linear"] - ffn_linear)  # mha less c_attn and c_proj
    return seconds


def hf_parts(gpt, run):  # -> {part: seconds} of one run() of HF's GPT2LMHeadModel, timed by forward hooks
    seconds, starts = dict.fromkeys(["linear", "attention", "gelu", "layer_norm", "lm_head"], 0.0), {}
    watched = [(gpt.lm_head, "lm_head"), (gpt.transformer.ln_f, "layer_norm")]
    for block in gpt.transformer.h:
        watched += [(block.ln_1, "layer_norm"), (block.ln_2, "layer_norm"), (block.mlp.act, "gelu"),
                    (block.attn, "attention")]
        watched += [(linear, "linear") for linear in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc,
                                                      block.mlp.c_proj)]
    attention_linears = {id(b.attn.c_attn) for b in gpt.transformer.h} | {id(b.attn.c_proj) for b in gpt.transformer.h}

    def stop(part):
        def hook(module, args, output):
            elapsed = time.perf_counter() - starts[id(module)]
            seconds[part] += elapsed
            if id(module) in attention_linears:
                seconds["attention"] -= elapsed  # the attention module less its c_attn and c_proj, as for ours
        return hook

    run()  # the warm-up, before the hooks
    handles = []
    for module, part in watched:
        handles.append(module.register_forward_pre_hook(lambda m, args: starts.__setitem__(id(m), time.perf_counter())))
        handles.append(module.register_forward_hook(stop(part)))
    try:
        timed_run(run, seconds)  # HuggingFace.run turns off autograd
    finally:
        for handle in handles:
            handle.remove()
    return seconds


BREAKDOWN_ROWS = {  # the breakdown's rows: part -> its seconds from our_parts or hf_parts
    "linear layers (c_attn, c_proj, c_fc, mlp c_proj; x W + b)": lambda s: s["linear"],
    "attention (split heads, KV cache write, q kᵀ, mask, softmax, weighted sum, merge heads)": lambda s: s["attention"],
    "gelu": lambda s: s["gelu"],
    "layer_norm": lambda s: s["layer_norm"],
    "lm head": lambda s: s["lm_head"],
    "everything else (embeddings, residual adds, Python)": lambda s: s["total"] - sum(
        s[name] for name in ("linear", "attention", "gelu", "layer_norm", "lm_head")),
    "total (as timed: with the wrappers, or the hooks, in the way)": lambda s: s["total"],
}


def breakdown_lines(engines):  # -> markdown lines: a column per engine and pass, a row per part, then the floors
    ids, prompt = prompt_ids(1024), prompt_ids(16)
    measures = {engine.name: our_parts if engine.name == OURS else lambda run, e=engine: hf_parts(e.model, run)
                for engine in engines}
    prefill = {f"{e.name}: prefill 1024 tokens, last logits (ms)":
               measures[e.name](lambda e=e: e.prefill(ids, last_only=True)) for e in engines}
    decode = {f"{e.name}: one decode step after a 16-token prompt (ms)": measures[e.name](e.decode_step(prompt))
              for e in engines}
    rows = batch_prompts([16] * 8)
    batch = {f"{e.name}: one decode step of 8 rows after 16-token prompts (ms)": measures[e.name](e.batch_step(rows))
             for e in engines}
    columns = {**prefill, **decode, **batch}
    lines = ["| part | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for name, part in BREAKDOWN_ROWS.items():
        cells = [f"{part(seconds) * 1e3:,.1f}" for seconds in columns.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for what, prefill_ms, decode_ms in floors(engines[0].params):
        cells = [prefill_ms] + [""] * (len(prefill) - 1) + [decode_ms] + [""] * (len(decode) - 1 + len(batch))
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    return lines


def floors(params):  # -> (what, prefill ms, decode ms): the limits this machine's hardware sets
    rates, exp = roofline.measured_rates(), exp_ns()
    sgemm, bandwidth = rates.gemm / 1e9, rates.read / 1e9
    n, n_embd, n_layer, n_head = 1024, HPARAMS_124M["n_embd"], HPARAMS_124M["n_layer"], HPARAMS_124M["n_head"]
    linear_flops = 2 * n * (n_layer - 1) * 12 * n_embd**2 + 2 * n * 3 * n_embd**2  # the last block: c_attn alone
    scores, gelu_inputs = (n_layer - 1) * n_head * n * (n + 1) / 2, (n_layer - 1) * n * 4 * n_embd  # one exp each
    n_cores = blas_threads()  # attention's queries are shared among them (cores.py)
    weight_bytes = sum(leaf.nbytes for _, leaf in flatten(params)) - params["wpe"].nbytes
    return [
        (f"floor: the linear layers' {linear_flops / 1e9:.0f} GFLOP at {sgemm:.0f} GFLOPS (the best large sgemm here)",
         f"{linear_flops / sgemm / 1e6:,.0f}", ""),
        (f"floor: {scores / 1e6:.0f}M exps of the causal triangle of scores and {gelu_inputs / 1e6:.0f}M of gelu, "
         f"on {n_cores} cores at {exp:.2f} ns each", f"{(scores + gelu_inputs) / n_cores * exp / 1e6:,.0f}", ""),
        (f"floor: reading {weight_bytes / 1e6:.0f} MB of weights at {bandwidth:.1f} GB/s (best streaming read)", "",
         f"{weight_bytes / bandwidth / 1e6:.1f}"),
    ]


def exp_ns():  # float32 np.exp, per element, on 1M softmax-like inputs in [-10, 0]
    x = -10 * np.random.default_rng(0).random(1 << 20, dtype=np.float32)
    out = np.empty_like(x)
    return median_seconds(lambda: np.exp(x, out=out), 9) / x.size * 1e9

