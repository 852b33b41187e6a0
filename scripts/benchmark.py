"""Speed and memory of gpt2_numpy on the GPT-2 124M shape, optionally side by side with Hugging Face transformers.

    python scripts/benchmark.py                 # our numbers only (numpy, regex, requests, tqdm)
    python scripts/benchmark.py --compare-hf    # also HF transformers on the same weights, in the same invocation
    python scripts/benchmark.py --json          # the rows as JSON instead of a table

The weights are the real checkpoint when `--checkpoint DIR` (default weights/124M) holds one, else seeded random
weights of the 124M shape. `--compare-hf` needs `pip install torch==2.13.0 transformers safetensors` (CPU torch). Each
number is the median of `--repeats` runs after a warm-up. Targets from the performance issue are checked only as
ratios measured in the same run, never in the test suite.
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

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from benchmark_tokenizer import encode_throughput, tiktoken_throughput  # noqa: E402
from gpt2_numpy.checkpoint import load_params  # noqa: E402
from gpt2_numpy.formats.crc32c import crc32c  # noqa: E402
from gpt2_numpy.model import SCORES_PATH, gpt2, gpt2_cached, new_cache  # noqa: E402
from gpt2_numpy.random_params import random_params  # noqa: E402
from tests.text_samples import english_text  # noqa: E402

HPARAMS_124M = {"n_vocab": 50257, "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12}
OFFICIAL_124M = REPO.parent / "shared" / "gpt2-official" / "124M"


def median_seconds(run, repeats):  # -> median wall time of run() after one warm-up call
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def prompt_ids(n):  # a fixed pseudo-random prompt of n ids
    return np.random.default_rng(0).integers(0, HPARAMS_124M["n_vocab"], n).tolist()


# --- gpt2_numpy ---


class Ours:
    name = "gpt2_numpy"

    def __init__(self, params, n_head):
        self.params, self.n_head = params, n_head

    def prefill(self, ids, last_only):
        if last_only:
            cache = new_cache(self.params["wpe"], self.params["blocks"], self.n_head)
            return gpt2_cached(ids, cache, **self.params, n_head=self.n_head, last_only=True)[0]
        return gpt2(ids, **self.params, n_head=self.n_head)

    def decode_seconds(self, ids, n_new):  # -> seconds for n_new greedy steps after an untimed prefill
        cache = new_cache(self.params["wpe"], self.params["blocks"], self.n_head)
        logits, cache = gpt2_cached(ids, cache, **self.params, n_head=self.n_head, last_only=True)
        start = time.perf_counter()
        for _ in range(n_new):
            logits, cache = gpt2_cached([int(np.argmax(logits[-1]))], cache, **self.params, n_head=self.n_head, last_only=True)
        return time.perf_counter() - start

    def decode_uncached_seconds(self, ids, n_new):
        ids, start = list(ids), time.perf_counter()
        for _ in range(n_new):
            ids.append(int(np.argmax(gpt2(ids, **self.params, n_head=self.n_head)[-1])))
        return time.perf_counter() - start


# --- Hugging Face transformers, same weights ---


class HuggingFace:
    name = "HF transformers"

    def __init__(self, params, hparams):
        import torch
        from make_reference import hf_model

        torch.set_num_threads(blas_threads())
        self.torch, self.model = torch, hf_model(hparams, params, attn_implementation="sdpa")  # HF's default, fastest

    def run(self, ids, **kwargs):
        with self.torch.no_grad():
            return self.model(self.torch.tensor([ids]), **kwargs)

    def prefill(self, ids, last_only):
        return self.run(ids, use_cache=False, logits_to_keep=1 if last_only else 0).logits

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


def blas_threads():  # the threads NumPy's BLAS uses: OpenBLAS honours these variables, else it takes every core
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(variable):
            return int(os.environ[variable])
    return os.cpu_count()


def blas_name():
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    return f"{blas.get('name')} {blas.get('version', '')}".strip()


# --- the rows ---


def model_rows(engines, repeats):
    rows = []
    for n in (128, 1024):
        for last_only in (True, False):
            what = "last-position logits" if last_only else "all positions"
            rows.append(
                row(f"prefill {n} tokens, {what} (s)", "lower", {e.name: median_seconds(lambda e=e: e.prefill(prompt_ids(n), last_only), repeats) for e in engines})
            )
    for n_prompt, n_new in ((16, 128), (900, 64)):
        rows.append(
            row(
                f"decode with KV cache, {n_prompt}-token prompt + {n_new} (tok/s)",
                "higher",
                {e.name: n_new / np.median([e.decode_seconds(prompt_ids(n_prompt), n_new) for _ in range(repeats)]) for e in engines},
            )
        )
    n_prompt, n_new = 16, 32
    rows.append(
        row(
            f"decode without cache, {n_prompt}-token prompt + {n_new} (tok/s)",
            "higher",
            {e.name: n_new / e.decode_uncached_seconds(prompt_ids(n_prompt), n_new) for e in engines},
        )
    )
    return rows


def einsum_rows(repeats):
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((12, 1024, 64), dtype=np.float32) for _ in range(2))
    plain = median_seconds(lambda: np.einsum("hqd,hkd->hqk", q, k), repeats)
    optimized = median_seconds(lambda: np.einsum("hqd,hkd->hqk", q, k, optimize=SCORES_PATH), repeats)
    return [
        row("attention scores einsum [12,1024,64], plain (ms)", "lower", {"gpt2_numpy": plain * 1e3}),
        row("attention scores einsum [12,1024,64], optimized path (ms)", "lower", {"gpt2_numpy": optimized * 1e3}),
    ]


def load_rows(checkpoint_dirs, repeats):  # checkpoint_dirs: {label: folder}; pages stay cached between runs
    rows = []
    for label, folder in checkpoint_dirs.items():
        for verify in (False, True) if label == "OpenAI TF checkpoint" else (False,):  # only TF stores CRCs
            seconds = median_seconds(lambda: load_params(folder, verify=verify), repeats)
            what = "with CRC32C of every tensor" if verify else "without CRC"
            rows.append(row(f"load 124M ({label}), {what} (s)", "lower", {"gpt2_numpy": seconds}))
    return rows


def hf_load_row(hf_dir, repeats):
    from transformers import GPT2LMHeadModel

    seconds = median_seconds(lambda: GPT2LMHeadModel.from_pretrained(hf_dir), repeats)
    return row("load 124M (HF safetensors) with from_pretrained (s)", "lower", {"HF transformers": seconds})


def crc_row(data_path, repeats):  # CRC32C speed on a checkpoint's data file, or on 256 MB of random bytes
    data = np.fromfile(data_path, np.uint8) if data_path else np.random.default_rng(0).integers(0, 256, 1 << 28, np.uint8)
    return row("CRC32C (MB/s)", "higher", {"gpt2_numpy": data.nbytes / 1e6 / median_seconds(lambda: crc32c(data), repeats)})


def tokenizer_rows(vocab_dir, repeats):
    text = english_text(1_000_000)
    rows = [row("tokenizer encode, 1 MB of English, fresh cache (tok/s)", "higher",
                {"gpt2_numpy": encode_throughput(vocab_dir, text, repeats)["cold"]})]
    try:
        rows.append(row("tokenizer encode, tiktoken (Rust) for scale (tok/s)", "higher",
                        {"tiktoken": tiktoken_throughput(vocab_dir, text, repeats)}))
    except ImportError:
        pass
    return rows


# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent at fork, so a child would report our own peak
PEAK_RSS = """
def peak_rss_bytes():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
"""

PEAK_RSS_OURS = PEAK_RSS + """
import sys, numpy as np
from gpt2_numpy.checkpoint import load_params
from gpt2_numpy.generate import generate
from gpt2_numpy.random_params import random_params
folder = sys.argv[1]
hparams, params = load_params(folder) if folder else ({hparams}, random_params({hparams}))
prompt = np.random.default_rng(0).integers(0, hparams["n_vocab"], 16).tolist()
generate(prompt, params, hparams["n_head"], 32, stop_at_eos=False)
print(peak_rss_bytes())
"""

PEAK_RSS_HF = PEAK_RSS + """
import sys, numpy as np, torch
from transformers import GPT2LMHeadModel
torch.set_num_threads({threads})
model = GPT2LMHeadModel.from_pretrained(sys.argv[1]).eval()
prompt = torch.tensor([np.random.default_rng(0).integers(0, model.config.vocab_size, 16).tolist()])
with torch.no_grad():
    model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=32,
                   min_new_tokens=32, pad_token_id=0)
print(peak_rss_bytes())
"""


def peak_rss_row(tf_dir, hf_dir):  # peak resident memory of a whole process: load, 16-token prompt, 32 new tokens
    def measure(script, folder):
        command = [sys.executable, "-c", script, str(folder or "")]
        out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=REPO)
        return int(out.stdout.split()[-1]) / 1e6

    values = {"gpt2_numpy": measure(PEAK_RSS_OURS.format(hparams=HPARAMS_124M), tf_dir)}
    if hf_dir:
        values["HF transformers"] = measure(PEAK_RSS_HF.format(threads=blas_threads()), hf_dir)
    return row("peak RSS of a generate process (MB)", "lower", values)


def row(metric, better, values):
    return {"metric": metric, "better": better, **values}


def checkpoint_or_none(folder):  # -> folder if it holds a TF checkpoint
    return folder if (folder / "model.ckpt.index").exists() else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare-hf", action="store_true", help="also run Hugging Face transformers on the same weights")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--checkpoint", type=Path, default=REPO / "weights" / "124M",
                        help="a 124M TF checkpoint dir (default weights/124M); "
                        "make one with scripts/make_tf_fixture.py --config 124M --out DIR")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    tf_dir = checkpoint_or_none(args.checkpoint)
    if tf_dir:
        hparams, params = load_params(tf_dir)
        weights = f"checkpoint {tf_dir}"
    else:
        hparams, params = HPARAMS_124M, random_params(HPARAMS_124M)
        weights = "seeded random weights of the 124M shape (no checkpoint: load and CRC rows use what exists)"
    engines = [Ours(params, hparams["n_head"])]
    with tempfile.TemporaryDirectory() as scratch:
        hf_dir = None
        if args.compare_hf:
            try:
                engines.append(HuggingFace(params, hparams))
            except ImportError:
                sys.exit("--compare-hf needs Hugging Face transformers: pip install torch==2.13.0 transformers safetensors")
            hf_dir = Path(scratch) / "hf"
            engines[1].model.save_pretrained(hf_dir)  # the same weights as safetensors, for the load and memory rows
        rows = model_rows(engines, args.repeats) + einsum_rows(args.repeats)
        rows += load_rows({k: v for k, v in {"OpenAI TF checkpoint": tf_dir, "HF safetensors": hf_dir}.items() if v}, args.repeats)
        if hf_dir:
            rows.append(hf_load_row(hf_dir, args.repeats))
        rows.append(peak_rss_row(tf_dir, hf_dir))
        rows.append(crc_row(tf_dir / "model.ckpt.data-00000-of-00001" if tf_dir else None, args.repeats))
    vocab_dir = next((d for d in (args.checkpoint, OFFICIAL_124M) if (d / "encoder.json").exists()), None)
    if vocab_dir:
        rows += tokenizer_rows(vocab_dir, args.repeats)
    header = {
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, BLAS {blas_name()} with {blas_threads()} threads",
        "versions": f"Python {platform.python_version()}, numpy {np.__version__}"
        + (f", torch {engines[1].torch.__version__} ({engines[1].torch.get_num_threads()} threads)" if args.compare_hf else ""),
        "weights": weights,
    }
    print(json.dumps({"header": header, "rows": rows}, indent=2) if args.json else table(header, rows, engines))


def table(header, rows, engines):
    names = [e.name for e in engines]
    extra = sorted({key for r in rows for key in r} - {"metric", "better", *names})  # e.g. tiktoken
    columns = ["metric", *names, *extra] + (["ours vs HF"] if len(names) == 2 else [])
    lines = [f"{key}: {value}" for key, value in header.items()] + [""]
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [r["metric"]] + [f"{r[n]:,.3g}" if n in r else "" for n in (*names, *extra)]
        if len(names) == 2:
            cells.append(comparison(r, *names))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def comparison(r, ours, theirs):  # "0.62× (better)": ours / HF, and whether that is the good side of 1
    if ours not in r or theirs not in r:
        return ""
    ratio = r[ours] / r[theirs]
    better = ratio > 1 if r["better"] == "higher" else ratio < 1
    return f"{ratio:.2f}× ({'better' if better else 'worse'})"


if __name__ == "__main__":
    main()
