"""Encode throughput of our tokenizer, and of tiktoken (if installed) on the same text, in tokens per second.

    python scripts/benchmark_tokenizer.py [MODEL_DIR] [--runs N]

MODEL_DIR holds encoder.json + vocab.bpe (default: ../shared/gpt2-official/124M beside the repo). The text is 1 MB
(1,000,000 characters) of English documentation shipped with CPython: the language reference, then stdlib docstrings.
"cold" encodes with a fresh tokenizer (empty word cache), as a program's first prompt would; "warm" encodes the same
text again, so every word is a cache hit. Each number is the median over the runs; the CPU may be shared, so compare
numbers taken by one command.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # for gpt2_numpy and tests.text_samples when run from a checkout

from gpt2_numpy.tokenizer import EOT, WORD_PATTERN, load_tokenizer  # noqa: E402
from tests.text_samples import english_text  # noqa: E402


def seconds(function, *args):  # -> (wall-clock seconds of one call, its result)
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def encode_throughput(model_dir, text, runs=5):  # -> {"cold": tokens/s, "warm": tokens/s, "tokens": n}
    cold, warm = [], []
    for _ in range(runs):
        tokenizer = load_tokenizer(model_dir)
        elapsed, ids = seconds(tokenizer.encode, text)
        cold.append(elapsed)
        warm.append(seconds(tokenizer.encode, text)[0])
    return {"cold": len(ids) / statistics.median(cold), "warm": len(ids) / statistics.median(warm), "tokens": len(ids)}


def tiktoken_throughput(model_dir, text, runs=5):  # -> tokens/s of tiktoken's encode_ordinary on the same files
    import tiktoken.load

    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # read the files in place; keep no copies in the temp folder
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(str(model_dir / "vocab.bpe"), str(model_dir / "encoder.json"))
    encoding = tiktoken.Encoding(
        "gpt2_files", pat_str=WORD_PATTERN.pattern, mergeable_ranks=ranks, special_tokens={EOT: 50256}
    )
    timings = [seconds(encoding.encode_ordinary, text) for _ in range(runs)]
    return len(timings[0][1]) / statistics.median(elapsed for elapsed, _ in timings)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", type=Path, default=REPO.parent / "shared" / "gpt2-official" / "124M")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    text = english_text(1_000_000)
    ours = encode_throughput(args.model_dir, text, args.runs)
    print(f"text: {len(text):,} characters, {len(text.encode()):,} UTF-8 bytes, {ours['tokens']:,} tokens")
    print(f"gpt2_numpy cold: {ours['cold'] / 1e6:.2f}M tokens/s   warm: {ours['warm'] / 1e6:.2f}M tokens/s")
    try:
        print(f"tiktoken:        {tiktoken_throughput(args.model_dir, text, args.runs) / 1e6:.2f}M tokens/s")
    except ImportError:
        print("tiktoken: not installed (pip install tiktoken)")


if __name__ == "__main__":
    main()
