"""Files and memory: loading 124M (the "load" part), CRC32C's speed ("CRC32C"), glibc's allocator against
keep_freed_memory ("allocator") and the peak memory of whole generate runs ("peak memory"), each process fresh."""
import numpy as np

from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.formats.crc32c import crc32c
from scripts.bench.harness import HF, OURS, PEAK_RSS_BYTES, blas_threads, fresh_process, median_seconds, row


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


def crc_row(tf_dir, repeats):  # CRC32C speed on a TF checkpoint's data file, or on 256 MB of random bytes
    if tf_dir:
        data = np.fromfile(tf_dir / "model.ckpt.data-00000-of-00001", np.uint8)
    else:
        data = np.random.default_rng(0).integers(0, 256, 1 << 28, np.uint8)
    megabytes_per_second = data.nbytes / 1e6 / median_seconds(lambda: crc32c(data), repeats)
    return row("CRC32C (MB/s)", "higher", {OURS: megabytes_per_second})


# A 1024-token prefill in a fresh process, with glibc's default allocator or after keep_freed_memory (the setting is
# for the whole process, so each case gets its own): argv is the checkpoint ("" for random weights), "keep" or not,
# the repeats; prints the median seconds and the minor page faults of one prefill
ALLOCATOR = """
import resource, sys, time
import numpy as np
from gpt2_numpy import fast as model, keep_freed_memory
from gpt2_numpy.formats.checkpoint import load_params
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
            runs.append([float(value) for value in fresh_process(ALLOCATOR, tf_dir or "", how, 3).split()])
    (default_seconds, default_faults), (kept_seconds, kept_faults) = (np.median(runs, axis=0) for runs in
                                                                      results.values())
    return [
        row("prefill 1024 tokens, last logits, glibc's default allocator (s)", "lower", {OURS: default_seconds}),
        row("prefill 1024 tokens, last logits, after keep_freed_memory() (s)", "lower", {OURS: kept_seconds}),
        row("page faults of that prefill, glibc's default allocator", "lower", {OURS: default_faults}),
        row("page faults of that prefill, after keep_freed_memory()", "lower", {OURS: kept_faults}),
    ]


# Peak memory of generating: load, n_rows 16-token prompts, n_new new tokens each; argv is the model folder, n_rows,
# n_new (and HF's torch threads)
PEAK_RSS = PEAK_RSS_BYTES + """
import sys, numpy as np
n_rows, n_new = int(sys.argv[2]), int(sys.argv[3])
prompts = np.random.default_rng(0).integers(0, 50257, (n_rows, 16)).tolist()
"""
PEAK_RSS_OURS = PEAK_RSS + """
from gpt2_numpy import keep_freed_memory
from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.generate import generate, generate_batch
from gpt2_numpy.loading import decoding_layout
keep_freed_memory()  # as the CLIs do
hparams, params = load_params(sys.argv[1])
params = decoding_layout(params)  # as load_model lays them out
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


def peak_rss_rows(tf_dir, hf_dir):  # ours from the TF checkpoint, else from HF's folder; none with neither on disk
    def megabytes(script, *args):
        return int(fresh_process(script, *args).split()[-1]) / 1e6

    ours_dir, rows = tf_dir or hf_dir, []
    if not ours_dir:
        return rows
    for n_rows, n_new, what in ((1, 32, "generate, 16-token prompt + 32"), (1, 128, "generate, 16-token prompt + 128"),
                                (8, 128, "generate_batch, 8 x (16-token prompt + 128)")):
        values = {OURS: megabytes(PEAK_RSS_OURS, ours_dir, n_rows, n_new)}
        if hf_dir:
            values[HF] = megabytes(PEAK_RSS_HF, hf_dir, n_rows, n_new, blas_threads())
        rows.append(row(f"peak RSS, {what} (MB)", "lower", values))
    return rows
