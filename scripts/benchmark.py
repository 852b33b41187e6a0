"""Speed and memory of gpt2_numpy on the GPT-2 124M shape, optionally side by side with Hugging Face transformers.

    python scripts/benchmark.py                 # our numbers only (numpy, regex, requests, tqdm)
    python scripts/benchmark.py --compare-hf    # also HF transformers on the same weights, in the same invocation
    python scripts/benchmark.py --json          # the rows as JSON instead of tables

The weights are a TF checkpoint when `--checkpoint DIR` (default weights/124M) holds one (the real one, or a 124M-shaped
one from `scripts/make_tf_fixture.py --config 124M --out DIR`), else seeded random weights of the 124M shape.
`--compare-hf` needs `pip install torch==2.13.0 transformers safetensors` (CPU torch); HF runs with its default
attention (sdpa) and as many torch threads as NumPy's BLAS uses. Each time is the median of `--repeats` runs after a
warm-up; where both engines run, they take turns, repeat by repeat. The targets of the performance issue are ratios
measured in one run; the test suite asserts no timings.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from benchmark_tokenizer import encode_throughput, long_piece_rows, tiktoken_throughput  # noqa: E402
from gpt2_numpy import cores, keep_freed_memory  # noqa: E402
from gpt2_numpy import fast as model  # noqa: E402
from gpt2_numpy import model as textbook  # noqa: E402
from gpt2_numpy.checkpoint import load_params  # noqa: E402
from gpt2_numpy.formats.crc32c import crc32c  # noqa: E402
from gpt2_numpy.generate import generate_batch  # noqa: E402
from gpt2_numpy.params import random_params  # noqa: E402
from tests.text_samples import english_text  # noqa: E402

HPARAMS_124M = {"n_vocab": 50257, "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12}
OFFICIAL_124M = REPO.parent / "shared" / "gpt2-official" / "124M"
OURS, HF = "gpt2_numpy", "HF transformers"
TEXTBOOK = "textbook model.py"


def median_seconds(run, repeats):  # -> median wall time of run() after one warm-up call
    return in_turns({"run": wall_seconds(run)}, repeats)["run"]


def in_turns(measures, repeats):  # {name: measure() -> seconds} -> {name: median seconds}
    # the engines take turns, repeat by repeat, so a machine that speeds up or slows down mid-row (timings here drift
    # by 15% and more) moves both engines' medians alike, and their ratio holds
    for measure in measures.values():
        measure()  # warm-up
    times = {name: [] for name in measures}
    for _ in range(repeats):
        for name, measure in measures.items():
            times[name].append(measure())
    return {name: float(np.median(t)) for name, t in times.items()}


def wall_seconds(run):  # -> a measure for in_turns: the wall time of one run()
    def measure():
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    return measure


def prompt_ids(n):  # a fixed pseudo-random prompt of n ids
    return np.random.default_rng(0).integers(0, HPARAMS_124M["n_vocab"], n).tolist()


def row(metric, better, values):
    return {"metric": metric, "better": better, **values}


# --- the two engines: the same questions asked of each ---


class Ours:
    name = OURS

    def __init__(self, params, n_head):
        self.params, self.n_head = params, n_head

    def step(self, ids, cache):  # -> logits of the last position, and the cache
        return model.gpt2_cached(ids, cache, **self.params, n_head=self.n_head, last_only=True)

    def new_cache(self):
        return model.new_cache(self.params["wpe"], self.params["blocks"], self.n_head)

    def prefill(self, ids, last_only):  # no KV cache, as HF's prefill runs with use_cache=False
        return model.gpt2(ids, **self.params, n_head=self.n_head, last_only=last_only)

    def decode_step(self, ids):  # -> step(): one cached step after ids, the cache growing by a position each call
        cache = self.step(ids, self.new_cache())[1]
        return lambda: self.step([1], cache)

    def batch_step(self, rows):  # -> step(): one cached step of a batch, after its prompts ([n_rows, n] ids)
        cache = model.new_cache(self.params["wpe"], self.params["blocks"], self.n_head, pad=np.zeros(len(rows), int))
        cache = self.step(np.array(rows), cache)[1]
        return lambda: self.step(np.ones((len(rows), 1), np.int64), cache)

    def decode_seconds(self, ids, n_new):  # -> seconds for n_new greedy steps after an untimed prefill
        logits, cache = self.step(ids, self.new_cache())
        start = time.perf_counter()
        for _ in range(n_new):
            logits, cache = self.step([int(np.argmax(logits[-1]))], cache)
        return time.perf_counter() - start

    def decode_uncached_seconds(self, ids, n_new):
        ids, start = list(ids), time.perf_counter()
        for _ in range(n_new):
            ids.append(int(np.argmax(model.gpt2(ids, **self.params, n_head=self.n_head)[-1])))
        return time.perf_counter() - start

    def batch_seconds(self, prompts, n_new):  # -> seconds for greedy generation of n_new ids for every prompt
        start = time.perf_counter()
        generate_batch(prompts, self.params, self.n_head, n_new, stop_at_eos=False)
        return time.perf_counter() - start


class HuggingFace:
    name = HF

    def __init__(self, params, hparams):
        import torch
        from make_reference import hf_model

        torch.set_num_threads(blas_threads())
        self.torch, self.model = torch, hf_model(hparams, params, attn_implementation="sdpa")  # HF's default

    def run(self, ids, **kwargs):  # ids: one sequence
        return self.run_rows(self.torch.tensor([ids]), **kwargs)

    def run_rows(self, ids, **kwargs):  # ids: a [n_rows, n] tensor
        with self.torch.no_grad():
            return self.model(ids, **kwargs)

    def prefill(self, ids, last_only):
        return self.run(ids, use_cache=False, logits_to_keep=1 if last_only else 0).logits

    def decode_step(self, ids):  # -> step(): as Ours.decode_step (HF's DynamicCache grows in place)
        cache = self.run(ids, use_cache=True, logits_to_keep=1).past_key_values
        return lambda: self.run([1], past_key_values=cache, use_cache=True, logits_to_keep=1)

    def batch_step(self, rows):  # -> step(): as Ours.batch_step
        cache = self.run_rows(self.torch.tensor(rows), use_cache=True, logits_to_keep=1).past_key_values
        ones = self.torch.ones((len(rows), 1), dtype=self.torch.long)
        return lambda: self.run_rows(ones, past_key_values=cache, use_cache=True, logits_to_keep=1)

    def decode_seconds(self, ids, n_new):
        out = self.run(ids, use_cache=True, logits_to_keep=1)
        start = time.perf_counter()
        for _ in range(n_new):
            next_id = int(out.logits[0, -1].argmax())
            out = self.run([next_id], past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
        return time.perf_counter() - start

    def decode_uncached_seconds(self, ids, n_new):
        ids, start = list(ids), time.perf_counter()
        for _ in range(n_new):
            ids.append(int(self.run(ids, use_cache=False, logits_to_keep=1).logits[0, -1].argmax()))
        return time.perf_counter() - start

    def batch_seconds(self, prompts, n_new):  # HF's batched generate: left padding and an attention mask
        width = max(map(len, prompts))
        ids = self.torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts])
        mask = self.torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        start = time.perf_counter()
        with self.torch.no_grad():
            self.model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n_new, min_new_tokens=n_new,
                                pad_token_id=0)
        return time.perf_counter() - start


def blas_threads():  # the threads NumPy's BLAS uses: OpenBLAS's own count, else the variables it honours, or every core
    blas = cores.openblas()
    if blas:
        return blas[1]()
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(variable):
            return int(os.environ[variable])
    return os.cpu_count()


def blas_name():
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    return f"{blas.get('name')} {blas.get('version', '')}".strip()


# --- the comparison table ---


def prefill_rows(engines, repeats):
    rows = []
    for n in (128, 1024):
        for last_only, what in ((True, "last-position logits"), (False, "all positions")):
            seconds = in_turns({e.name: wall_seconds(lambda e=e: e.prefill(prompt_ids(n), last_only))
                                for e in engines}, repeats)
            rows.append(row(f"prefill {n} tokens, {what} (s)", "lower", seconds))
    ours = engines[0]  # what the tricks buy: the textbook model.gpt2 on the same prompt and weights
    seconds = median_seconds(lambda: textbook.gpt2(np.array(prompt_ids(1024)), **ours.params, n_head=ours.n_head), 1)
    rows.append(row("textbook model.gpt2: prefill 1024 tokens, all positions (s)", "lower", {OURS: seconds}))
    return rows


def decode_rows(engines, repeats):
    rows = []
    for n_prompt, n_new in ((16, 128), (900, 64)):
        decode = {e.name: lambda e=e: e.decode_seconds(prompt_ids(n_prompt), n_new) for e in engines}
        seconds = in_turns(decode, repeats)
        speed = {name: n_new / s for name, s in seconds.items()}
        rows.append(row(f"decode with KV cache, {n_prompt}-token prompt + {n_new} (tok/s)", "higher", speed))
    n_prompt, n_new = 16, 32
    speed = {e.name: n_new / e.decode_uncached_seconds(prompt_ids(n_prompt), n_new) for e in engines}
    rows.append(row(f"decode without cache, {n_prompt}-token prompt + {n_new} (tok/s)", "higher", speed))
    return rows


RAGGED_LENGTHS = [1, 29, 57, 86, 114, 143, 171, 200]


def batch_prompts(lengths):  # -> one fixed pseudo-random prompt per length, each different
    rng = np.random.default_rng(1)
    return [rng.integers(0, HPARAMS_124M["n_vocab"], n).tolist() for n in lengths]


def batch_rows(engines, repeats):  # whole generate calls, prefill included: tokens per second over all rows
    cases = [(1, [16], 128, engines), (8, [16] * 8, 128, engines), (32, [16] * 32, 128, engines[:1]),
             ("8 ragged", RAGGED_LENGTHS, 64, engines)]
    rows = []
    for label, lengths, n_new, which in cases:
        prompts = batch_prompts(lengths)
        seconds = in_turns({e.name: wall_seconds(lambda e=e: e.batch_seconds(prompts, n_new)) for e in which}, repeats)
        speed = {name: len(prompts) * n_new / s for name, s in seconds.items()}
        what = f"{label} prompts of {lengths[0]} tokens" if label != "8 ragged" else "8 ragged prompts (1-200 tokens)"
        rows.append(row(f"generate, {what} + {n_new} new each, total (tok/s)", "higher", speed))
    return rows


def score_rows(tf_dir, repeats):  # ours against the sliding-window loop of HF's perplexity guide, in turns
    from score_benchmark import score_seconds

    ours, hf = score_seconds(tf_dir, blas_threads(), n_tokens=10_000, stride=512, repeats=repeats)
    return [row("score 10,000 tokens of English, stride 512 (s)", "lower", {OURS: ours, HF: hf})]


def einsum_rows(repeats):  # q kᵀ of 12 heads of 64, three ways: why fast.einsum picks its form by size
    rng = np.random.default_rng(0)
    rows = []
    for n_q, n_k in ((1, 16), (1, 144), (1, 340), (1, 1024), (8, 144), (128, 128), (1024, 1024)):
        q, k = (rng.standard_normal((12, n, 64), dtype=np.float32) for n in (n_q, n_k))
        n_macs = q.size * n_k
        chosen = "plain einsum" if n_macs <= model.PLAIN_EINSUM_MACS else "einsum with the path given"
        path = model.EINSUM_PATH
        for how, run in (("plain einsum", lambda: np.einsum("hkd,hqd->hqk", k, q)),
                         ("einsum with the path given", lambda: np.einsum("hkd,hqd->hqk", k, q, optimize=path)),
                         ("batched matmul (no einsum)", lambda: q @ k.swapaxes(-1, -2))):
            seconds = median_seconds(run, repeats * max(1, 2**20 // n_macs))
            picked = " <- fast.einsum" if how == chosen else ""
            metric = f"q kᵀ [12,{n_q},64] x [12,{n_k},64], 2^{np.log2(n_macs):.1f} MACs, {how}{picked} (us)"
            rows.append(row(metric, "lower", {OURS: seconds * 1e6}))
    return rows


def trick_rows(params, repeats):  # each function of the tuned pass against the model.py line it replaces, 124M shapes
    rng = np.random.default_rng(0)
    block = params["blocks"][0]
    x = rng.standard_normal((1024, 768), dtype=np.float32)
    h = rng.standard_normal((1024, 3072), dtype=np.float32)
    q, k, v = (rng.standard_normal((12, 1024, 64), dtype=np.float32) for _ in range(3))
    step_x = rng.standard_normal((8, 1, 768), dtype=np.float32)  # a batch step: 8 rows of one position
    decode_q = q[:, -1:]
    cases = [  # (what, textbook call, tuned call)
        ("gelu of [1024, 3072]", lambda: textbook.gelu(h), lambda: model.gelu(h)),
        ("layer_norm of [1024, 768]", lambda: textbook.layer_norm(x, **block["ln_1"]),
         lambda: model.layer_norm(x, **block["ln_1"])),
        ("linear c_fc of [1024, 768]", lambda: textbook.linear(x, **block["mlp"]["c_fc"]),
         lambda: model.linear(x, **block["mlp"]["c_fc"])),
        ("linear c_fc of a batch step [8, 1, 768]", lambda: textbook.linear(step_x, **block["mlp"]["c_fc"]),
         lambda: model.linear(step_x, **block["mlp"]["c_fc"])),
        ("lm head of a batch step [8, 1, 768]", lambda: step_x @ params["wte"].T,
         lambda: model.lm_head(step_x, params["wte"])),
        ("attention, 12 heads x 1024 positions (fast.attention: no blocks)",
         lambda: textbook.attention(q, k, v, textbook.causal_mask(1024)),
         lambda: model.attention(q, k, v, model.causal_mask(1024, 1024))),
        ("attention, 12 heads x 1024 positions (fast.causal_attention: query blocks)",
         lambda: textbook.attention(q, k, v, textbook.causal_mask(1024)),
         lambda: model.causal_attention(q, k, v, model.causal_mask(1024, 1024))),
        ("attention, 12 heads, one query x 1024 keys (a decode step)",
         lambda: textbook.attention(decode_q, k, v, np.zeros((1, 1024), np.float32)),
         lambda: model.attention(decode_q, k, v, model.causal_mask(1, 1024))),
    ]
    rows = []
    for what, *calls in cases:
        seconds = in_turns({name: wall_seconds(call) for name, call in zip((TEXTBOOK, OURS), calls)}, repeats)
        rows.append(row(f"{what} (ms)", "lower", {name: s * 1e3 for name, s in seconds.items()}))
    return rows + cores_rows(params, repeats)


def cores_rows(params, repeats):  # the tuned pass with its pieces on one core, and on every core (cores.py), in turns
    ids = prompt_ids(1024)

    def prefill():
        model.gpt2(ids, **params, n_head=HPARAMS_124M["n_head"], last_only=True)

    def on_one_core():
        with cores.one_core():
            prefill()

    seconds = in_turns({"one": wall_seconds(on_one_core), "all": wall_seconds(prefill)}, repeats)
    return [row("prefill 1024 tokens, last logits, attention on one core (cores.one_core()) (s)", "lower",
                {OURS: seconds["one"]}),
            row(f"prefill 1024 tokens, last logits, attention's heads on {blas_threads()} cores (s)", "lower",
                {OURS: seconds["all"]})]


def load_rows(tf_dir, hf_dir, repeats):  # the page cache is warm after the first run, as for a second start
    rows = []
    if tf_dir:
        for verify, what in ((False, "without CRC"), (True, "with CRC32C of every tensor")):
            seconds = median_seconds(lambda: load_params(tf_dir, verify=verify), repeats)
            rows.append(row(f"load 124M, OpenAI TF checkpoint, {what} (s)", "lower", {OURS: seconds}))
    if hf_dir:
        from transformers import GPT2LMHeadModel

        seconds = {OURS: median_seconds(lambda: load_params(hf_dir), repeats),
                   HF: median_seconds(lambda: GPT2LMHeadModel.from_pretrained(hf_dir), repeats)}
        rows.append(row("load 124M, HF safetensors (s)", "lower", seconds))
    return rows


def crc_row(data_path, repeats):  # CRC32C speed on a checkpoint's data file, or on 256 MB of random bytes
    if data_path:
        data = np.fromfile(data_path, np.uint8)
    else:
        data = np.random.default_rng(0).integers(0, 256, 1 << 28, np.uint8)
    megabytes_per_second = data.nbytes / 1e6 / median_seconds(lambda: crc32c(data), repeats)
    return row("CRC32C (MB/s)", "higher", {OURS: megabytes_per_second})


def tokenizer_rows(vocab_dir, repeats):
    text = english_text(1_000_000)
    cold = encode_throughput(vocab_dir, text, repeats)["cold"]
    rows = [row("tokenizer encode, 1 MB of English, fresh cache (tok/s)", "higher", {OURS: cold})]
    try:
        tiktoken = tiktoken_throughput(vocab_dir, text, repeats)
        rows.append(row("tokenizer encode, tiktoken (Rust) for scale (tok/s)", "higher", {"tiktoken": tiktoken}))
        for piece in long_piece_rows(vocab_dir, runs=repeats):  # one pre-tokenizer piece of 1 MB: BPE's worst case
            rows.append(row(f"tokenizer encode, one-word string of {piece.name}: time per byte vs English (x)",
                            "lower", {OURS: piece.ratio_to_english}))
            rows.append(row(f"tokenizer encode, one-word string of {piece.name} (s; growth: time at 10x the length)",
                            "lower", {OURS: piece.seconds, "tiktoken": piece.tiktoken_seconds,
                                      "growth": piece.growth}))
    except ImportError:
        pass
    return rows


# Peak memory of a whole process, in a fresh subprocess per case: load, n_rows 16-token prompts, n_new new tokens each.
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent at fork, so a child would report our own peak.
PEAK_RSS = """
import sys, numpy as np
def peak_rss_bytes():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
n_rows, n_new = int(sys.argv[2]), int(sys.argv[3])
prompts = np.random.default_rng(0).integers(0, 50257, (n_rows, 16)).tolist()
"""
PEAK_RSS_OURS = PEAK_RSS + """
from gpt2_numpy import keep_freed_memory
from gpt2_numpy.checkpoint import load_params
from gpt2_numpy.generate import generate, generate_batch
keep_freed_memory()  # as the CLIs do
hparams, params = load_params(sys.argv[1])
if n_rows == 1:
    generate(prompts[0], params, hparams["n_head"], n_new, stop_at_eos=False)
else:
    generate_batch(prompts, params, hparams["n_head"], n_new, stop_at_eos=False)
print(peak_rss_bytes())
"""
PEAK_RSS_HF = PEAK_RSS + """
import torch
from transformers import GPT2LMHeadModel
torch.set_num_threads(int(sys.argv[4]))
model = GPT2LMHeadModel.from_pretrained(sys.argv[1]).eval()
with torch.no_grad():
    model.generate(torch.tensor(prompts), attention_mask=torch.ones(n_rows, 16, dtype=torch.long), do_sample=False,
                   max_new_tokens=n_new, min_new_tokens=n_new, pad_token_id=0)
print(peak_rss_bytes())
"""


# A 1024-token prefill in a fresh process, with glibc's default allocator or after keep_freed_memory (the setting is
# for the whole process, so each case gets its own): argv is the checkpoint ("" for random weights), "keep" or not,
# the repeats; prints the median seconds and the minor page faults of one prefill
ALLOCATOR = """
import resource, sys, time
import numpy as np
from gpt2_numpy import fast as model, keep_freed_memory
from gpt2_numpy.checkpoint import load_params
from gpt2_numpy.params import random_params
if sys.argv[2] == "keep":
    keep_freed_memory()
hparams = {"n_vocab": 50257, "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12}
hparams, params = load_params(sys.argv[1]) if sys.argv[1] else (hparams, random_params(hparams))
ids = np.random.default_rng(0).integers(0, 50257, 1024)
def prefill():
    model.transformer(ids, **params, n_head=hparams["n_head"], last_only=True)
prefill()
times, faults = [], []
for _ in range(int(sys.argv[3])):
    start, start_faults = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    prefill()
    times.append(time.perf_counter() - start)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start_faults)
print(float(np.median(times)), int(np.median(faults)))
"""


def allocator_rows(tf_dir, repeats):  # glibc's default allocator against keep_freed_memory, in turns
    results = {how: [] for how in ("default", "keep")}
    for _ in range(repeats):
        for how, runs in results.items():
            out = subprocess.run([sys.executable, "-c", ALLOCATOR, str(tf_dir or ""), how, "3"], capture_output=True,
                                 text=True, check=True, cwd=REPO)
            runs.append([float(value) for value in out.stdout.split()])
    (default_seconds, default_faults), (kept_seconds, kept_faults) = (np.median(runs, axis=0) for runs in
                                                                      results.values())
    return [
        row("prefill 1024 tokens, last logits, glibc's default allocator (s)", "lower", {OURS: default_seconds}),
        row("prefill 1024 tokens, last logits, after keep_freed_memory() (s)", "lower", {OURS: kept_seconds}),
        row("page faults of that prefill, glibc's default allocator", "lower", {OURS: default_faults}),
        row("page faults of that prefill, after keep_freed_memory()", "lower", {OURS: kept_faults}),
    ]


def peak_rss_rows(ours_dir, hf_dir):
    def megabytes(script, *args):
        out = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                             check=True, cwd=REPO)
        return int(out.stdout.split()[-1]) / 1e6

    rows = []
    for n_rows, n_new, what in ((1, 32, "generate, 16-token prompt + 32"), (1, 128, "generate, 16-token prompt + 128"),
                                (8, 128, "generate_batch, 8 x (16-token prompt + 128)")):
        values = {OURS: megabytes(PEAK_RSS_OURS, ours_dir, n_rows, n_new)}
        if hf_dir:
            values[HF] = megabytes(PEAK_RSS_HF, hf_dir, n_rows, n_new, blas_threads())
        rows.append(row(f"peak RSS, {what} (MB)", "lower", values))
    return rows


def comparison_table(rows, names):
    extra = sorted({key for r in rows for key in r} - {"metric", "better", *names})  # e.g. tiktoken
    columns = ["metric", *names, *extra] + (["ours / HF"] if len(names) == 2 else [])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [r["metric"]] + [f"{r[n]:,.3g}" if n in r else "" for n in (*names, *extra)]
        if len(names) == 2:
            cells.append(ratio(r, *names))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def ratio(r, ours, theirs):  # "0.62× (better)": ours / HF, and whether that is the good side of 1
    if ours not in r or theirs not in r:
        return ""
    value = r[ours] / r[theirs]
    better = value > 1 if r["better"] == "higher" else value < 1
    return f"{value:.2f}× ({'better' if better else 'worse'})"


# --- where our time goes, and the floor set by the hardware ---

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


def our_parts(run):  # -> {part: seconds} of one run(), timing model.py's functions where they are called
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


def breakdown_lines(engines, sgemm_gflops, bandwidth_gbs, exp_ns):
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
        cells = ["" if part(seconds) is None else f"{part(seconds) * 1e3:,.1f}" for seconds in columns.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for what, prefill_ms, decode_ms in floors(engines[0].params, sgemm_gflops, bandwidth_gbs, exp_ns):
        cells = [prefill_ms] + [""] * (len(prefill) - 1) + [decode_ms] + [""] * (len(decode) - 1 + len(batch))
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    return lines


def floors(params, sgemm_gflops, bandwidth_gbs, exp_ns):  # -> (what, prefill ms, decode ms): hardware limits
    n, n_embd, n_layer, n_head = 1024, HPARAMS_124M["n_embd"], HPARAMS_124M["n_layer"], HPARAMS_124M["n_head"]
    linear_flops = 2 * n * (n_layer - 1) * 12 * n_embd**2 + 2 * n * 3 * n_embd**2  # the last block: c_attn alone
    scores, gelu_inputs = (n_layer - 1) * n_head * n * (n + 1) / 2, (n_layer - 1) * n * 4 * n_embd  # one exp each
    n_cores = blas_threads()  # attention's heads are shared among them (cores.py), gelu runs on one
    weight_bytes = sum(leaf.nbytes for leaf in leaves(params)) - params["wpe"].nbytes
    return [
        (f"floor: the linear layers' {linear_flops / 1e9:.0f} GFLOP at {sgemm_gflops:.0f} GFLOPS (large sgemm here)",
         f"{linear_flops / sgemm_gflops / 1e6:,.0f}", ""),
        (f"floor: {scores / 1e6:.0f}M exps of the causal triangle of scores on {n_cores} cores, and "
         f"{gelu_inputs / 1e6:.0f}M of gelu on one, at {exp_ns:.2f} ns each",
         f"{(scores / n_cores + gelu_inputs) * exp_ns / 1e6:,.0f}", ""),
        (f"floor: reading {weight_bytes / 1e6:.0f} MB of weights at {bandwidth_gbs:.1f} GB/s (streaming x @ W)", "",
         f"{weight_bytes / bandwidth_gbs / 1e6:.1f}"),
    ]


def leaves(tree):  # nested dicts and lists -> arrays
    if isinstance(tree, dict):
        tree = tree.values()
    if isinstance(tree, (list, type({}.values()))):
        return [leaf for branch in tree for leaf in leaves(branch)]
    return [tree]


def sgemm_gflops():  # float32 matrix multiply speed on the ffn's shape
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1024, 768), dtype=np.float32), rng.standard_normal((768, 3072), dtype=np.float32)
    return 2 * 1024 * 768 * 3072 / median_seconds(lambda: x @ w, 5) / 1e9


def exp_ns():  # float32 np.exp, per element, on 1M softmax-like inputs in [-10, 0]
    x = -10 * np.random.default_rng(0).random(1 << 20, dtype=np.float32)
    out = np.empty_like(x)
    return median_seconds(lambda: np.exp(x, out=out), 9) / x.size * 1e9


def bandwidth_gbs():  # one row times 256 MB of weight matrices: memory-bound, as each decode step is
    matrices = [np.ones((768, 3072), np.float32) for _ in range(28)]
    x = np.ones((1, 768), np.float32)
    return sum(m.nbytes for m in matrices) / median_seconds(lambda: [x @ m for m in matrices], 5) / 1e9


# --- putting it together ---


PARTS = ("prefill", "decode", "batched generate", "score", "einsum", "tricks", "allocator", "load", "peak memory",
         "CRC32C", "tokenizer", "breakdown", "training")


def training_rows(repeats, compare):  # the training rows live in benchmark_train.py, which has their breakdown too
    from benchmark_train import train_rows  # here, not at the top: benchmark_train imports this module

    return train_rows(repeats, compare, theirs=HF)[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare-hf", action="store_true", help="also run HF transformers on the same weights")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--checkpoint", type=Path, default=REPO / "weights" / "124M", help="a 124M TF checkpoint dir")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=PARTS, metavar="PART",
                        help=f"run only these parts: {', '.join(PARTS)} (default: all)")
    args = parser.parse_args(argv)

    keep_freed_memory()  # as the CLIs do; both engines share this process and its allocator
    tf_dir = args.checkpoint if (args.checkpoint / "model.ckpt.index").exists() else None
    if tf_dir:
        hparams, params = load_params(tf_dir)
        weights = f"checkpoint {tf_dir}"
    else:
        hparams, params = HPARAMS_124M, random_params(HPARAMS_124M)
        weights = "seeded random weights of the 124M shape (no TF checkpoint: no TF load or CRC rows)"
    engines = [Ours(params, hparams["n_head"])]
    with tempfile.TemporaryDirectory() as scratch:
        hf_dir = None
        if args.compare_hf:
            try:
                engines.append(HuggingFace(params, hparams))
            except ImportError:
                sys.exit("--compare-hf needs HF transformers: pip install torch==2.13.0 transformers safetensors")
            hf_dir = Path(scratch) / "hf"
            engines[1].model.save_pretrained(hf_dir)  # the same weights as safetensors, for the load and memory rows
        vocab_dir = next((d for d in (args.checkpoint, OFFICIAL_124M) if (d / "encoder.json").exists()), None)
        jobs = {  # each makes some rows; a progress bar on stderr counts them, as a full run takes minutes
            "prefill": lambda: prefill_rows(engines, args.repeats),
            "decode": lambda: decode_rows(engines, args.repeats),
            "batched generate": lambda: batch_rows(engines, args.repeats),
            "score": lambda: score_rows(tf_dir, args.repeats) if tf_dir and hf_dir else [],
            "einsum": lambda: einsum_rows(args.repeats),
            "tricks": lambda: trick_rows(params, args.repeats),
            "load": lambda: load_rows(tf_dir, hf_dir, args.repeats),
            "allocator": lambda: allocator_rows(tf_dir, args.repeats),
            "peak memory": lambda: peak_rss_rows(tf_dir or hf_dir, hf_dir) if tf_dir or hf_dir else [],
            "CRC32C": lambda: [crc_row(tf_dir and tf_dir / "model.ckpt.data-00000-of-00001", args.repeats)],
            "tokenizer": lambda: tokenizer_rows(vocab_dir, args.repeats) if vocab_dir else [],
            "breakdown": lambda: breakdown_lines(engines, sgemm_gflops(), bandwidth_gbs(), exp_ns()),
            "training": lambda: training_rows(args.repeats, compare=bool(hf_dir)),
        }
        jobs = {name: job for name, job in jobs.items() if name in (args.only or PARTS)}
        results = {"breakdown": []}
        with tqdm(jobs.items(), desc="benchmark", unit="part", file=sys.stderr) as progress:
            for name, job in progress:
                progress.set_postfix_str(name)
                results[name] = job()
    where = results.pop("breakdown")
    rows = [r for part in results.values() for r in part]
    header = {
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, BLAS {blas_name()} with {blas_threads()} threads",
        "versions": f"Python {platform.python_version()}, numpy {np.__version__}"
        + (f", torch {engines[1].torch.__version__} ({engines[1].torch.get_num_threads()} threads)" if hf_dir else ""),
        "weights": weights,
    }
    goals = goal_lines(rows)
    if args.json:
        print(json.dumps({"header": header, "rows": rows, "goals": goals, "breakdown": where}, indent=2))
        return
    print("\n".join([f"{key}: {value}" for key, value in header.items()] + [""]
                    + comparison_table(rows, [e.name for e in engines]) + ["", "Goals:", ""] + goals
                    + ["", "Where our time goes:", ""] + where))


def goal_lines(rows):  # -> "| goal | measured | met |" lines for the ratios the performance issues set
    value = {r["metric"]: r for r in rows}

    def find(start):  # the row whose metric starts with this text
        return next((r for metric, r in value.items() if metric.startswith(start)), {})

    single, batch8, batch32 = (find(f"generate, {n} prompts of 16 tokens") for n in (1, 8, 32))
    goals = [  # (goal, measured ratio or None, test)
        ("decode 16 + 128 ≥ 1.7× HF's tok/s", ratio_of(find("decode with KV cache, 16"), OURS, HF), lambda r: r >= 1.7),
        ("prefill 1024, last logits ≤ 0.9× HF's time", ratio_of(find("prefill 1024 tokens, last"), OURS, HF),
         lambda r: r <= 0.9),
        ("prefill 1024, all logits ≤ 0.9× HF's time", ratio_of(find("prefill 1024 tokens, all"), OURS, HF),
         lambda r: r <= 0.9),
        ("score 10,000 tokens, stride 512 ≤ 0.9× HF's time", ratio_of(find("score 10,000"), OURS, HF),
         lambda r: r <= 0.9),
        ("batch of 8 ≥ 2.5× our single-sequence tok/s", ratio_of(batch8, OURS, OURS, single), lambda r: r >= 2.5),
        ("batch of 8 ≥ 2× HF's batched generate", ratio_of(batch8, OURS, HF), lambda r: r >= 2),
        ("batch of 32 ≥ 4× our single-sequence tok/s", ratio_of(batch32, OURS, OURS, single), lambda r: r >= 4),
        ("peak RSS, batch of 8 at 144 tokens ≤ 1.2× single",
         ratio_of(find("peak RSS, generate_batch"), OURS, OURS, find("peak RSS, generate, 16-token prompt + 128")),
         lambda r: r <= 1.2),
    ]
    lines = ["| goal | measured | met |", "|---|---|---|"]
    for goal, measured, met in goals:
        if measured is not None:
            lines.append(f"| {goal} | {measured:.2f}× | {'yes' if met(measured) else 'no'} |")
    return lines


def ratio_of(r, ours, theirs, other=None):  # -> r[ours] / (other or r)[theirs], or None when a value is missing
    other = r if other is None else other
    return r[ours] / other[theirs] if ours in r and theirs in other else None


if __name__ == "__main__":
    main()
