"""Encode speed of our tokenizer, beside tiktoken's (if installed) on the same files: the "tokenizer" part of
scripts/benchmark.py, and a command of its own that can also time another version of gpt2_numpy/tokenizer.py.

    python -m scripts.bench.tokenizer [MODEL_DIR] [--runs N] [--baseline OLD_TOKENIZER_PY]

MODEL_DIR holds encoder.json + vocab.bpe (default: the package's copies of OpenAI's files, gpt2_numpy/data).

English: 1 MB (1,000,000 characters) of English documentation shipped with CPython: the language reference, then
stdlib docstrings, in tokens per second. "fresh cache" encodes with a fresh tokenizer (empty word cache), as a program's
first prompt would; "cached" encodes the same text again, so every word is a cache hit.

One-word strings: 1 MB strings that GPT-2's regex keeps as one word each (random letters, digits, CJK ideographs,
punctuation; digit runs are not cut, as `\\p{N}+` has no length limit), so BPE runs on the whole string at once: its
worst case. Each run encodes a new string with a fresh tokenizer. Rows: the seconds, the time per byte over the same
engine's on English, and the growth: the time for 1 MB over the time for 100 KB (10 is linear).

--baseline FILE: also encode everything with another version of gpt2_numpy/tokenizer.py (for example
`git show HEAD:gpt2_numpy/tokenizer.py > /tmp/old_tokenizer.py`), as a column of its own.

The engines take turns, run by run, who goes first alternating, so they see the same load on a shared machine. Each
number is the median over the runs, in CPU seconds of this process; the CPU may be shared (its caches too), so compare
numbers taken by one command.
"""
import argparse
import importlib.util
import os
import statistics
import time
from pathlib import Path

from gpt2_numpy.commands.common import whole_number
from gpt2_numpy.tokenizer import EOT, PACKAGED_VOCABULARY, WORD_PATTERN, load_tokenizer
from scripts.bench.harness import OURS, comparison_table, row
from scripts.common.text_samples import english_text, long_word

N_BYTES = 1_000_000
LONG_PIECE_KINDS = ("letters", "digits", "CJK", "punctuation")  # keys of text_samples.LONG_WORD_ALPHABETS


def seconds(function, *args):  # -> (CPU seconds of one call, its result)
    # CPU time, not wall-clock: encoding runs on one thread, and on a shared machine the wall clock also counts the
    # time other processes hold the CPU
    start = time.process_time()
    result = function(*args)
    return time.process_time() - start, result


# --- encoding ---


def tokenizer_rows(model_dir, runs, baseline_load=None):  # -> rows: English, then one-word strings of each kind
    encoders = fresh_encoders(model_dir, baseline_load)
    english = english_text(N_BYTES)
    cold = alternating_seconds(encoders, lambda seed: english, runs)
    n_tokens = len(load_tokenizer(model_dir).encode(english))
    english_per_byte = {name: s / len(english.encode("utf-8")) for name, s in cold.items()}
    rows = [row("tokenizer encode, 1 MB of English, fresh cache (tok/s)", "higher",
                {name: n_tokens / s for name, s in cold.items()}),
            row("tokenizer encode, 1 MB of English again, every word cached (tok/s)", "higher",
                {OURS: n_tokens / cached_seconds(model_dir, english, runs)})]
    for kind in LONG_PIECE_KINDS:
        small, large = (alternating_seconds(encoders, lambda seed: one_word(kind, n, seed), runs)
                        for n in (N_BYTES // 10, N_BYTES))
        what = f"tokenizer encode, one-word string of {kind}, {N_BYTES:,} bytes"
        rows += [row(f"{what} (s)", "lower", large),
                 row(f"{what}: time per byte vs English (x)", "lower",
                     {name: s / N_BYTES / english_per_byte[name] for name, s in large.items()}),
                 row(f"{what}: growth, time at 10x the length (x)", "lower",
                     {name: s / small[name] for name, s in large.items()})]
    return rows


def fresh_encoders(model_dir, baseline_load):  # -> {name: () -> encode function}: ours, tiktoken, the baseline
    # a fresh tokenizer per run: a cold start, and no word of an earlier run left in the cache
    encoders = {OURS: lambda: load_tokenizer(model_dir).encode}
    try:
        encode_ordinary = tiktoken_encoding(model_dir).encode_ordinary
        encoders["tiktoken"] = lambda: encode_ordinary  # tiktoken keeps no cache to start afresh
    except ImportError:
        pass
    if baseline_load is not None:
        encoders["baseline"] = lambda: baseline_load(model_dir).encode
    return encoders


def alternating_seconds(encoders, make_text, runs):  # -> {name: median CPU seconds to encode make_text(run)}
    timings = {name: [] for name in encoders}
    for run in range(runs):
        text = make_text(run)
        for name in list(encoders)[:: 1 if run % 2 == 0 else -1]:  # who goes first alternates, against drift
            timings[name].append(seconds(encoders[name](), text)[0])
    return {name: statistics.median(timing) for name, timing in timings.items()}


def cached_seconds(model_dir, text, runs):  # -> median CPU seconds of our encode of text a second time
    tokenizer = load_tokenizer(model_dir)
    tokenizer.encode(text)
    return statistics.median(seconds(tokenizer.encode, text)[0] for _ in range(runs))


def one_word(kind, n_bytes, seed):  # -> a new random string that GPT-2's regex keeps whole
    piece = long_word(kind, n_bytes, seed)
    assert WORD_PATTERN.findall(piece) == [piece], f"{kind}: GPT-2's regex cuts this piece"
    return piece


def tiktoken_encoding(model_dir):  # -> tiktoken.Encoding built from the same files; ImportError without tiktoken
    import tiktoken.load

    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # read the files in place; keep no copies in the temp folder
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(str(model_dir / "vocab.bpe"), str(model_dir / "encoder.json"))
    return tiktoken.Encoding(
        "gpt2_files", pat_str=WORD_PATTERN.pattern, mergeable_ranks=ranks, special_tokens={EOT: 50256}
    )


def load_baseline(baseline_file):  # -> load_tokenizer of another version of gpt2_numpy/tokenizer.py
    spec = importlib.util.spec_from_file_location("baseline_tokenizer", baseline_file)
    baseline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(baseline)
    return baseline.load_tokenizer


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", nargs="?", type=Path, default=PACKAGED_VOCABULARY)
    parser.add_argument("--runs", type=whole_number(1), default=5)
    parser.add_argument("--baseline", type=Path, help="another tokenizer.py to compare with")
    args = parser.parse_args()
    if not args.model_dir.is_dir():
        parser.exit(2, f"error: {args.model_dir} is not a folder: pass a model folder with vocabulary files\n")
    if args.baseline and not args.baseline.is_file():
        parser.exit(2, f"error: --baseline {args.baseline} is not a file: pass a version of gpt2_numpy/tokenizer.py\n")
    rows = tokenizer_rows(args.model_dir, args.runs, load_baseline(args.baseline) if args.baseline else None)
    print("\n".join(comparison_table(rows, [OURS])))


if __name__ == "__main__":
    main()
