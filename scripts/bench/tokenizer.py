"""Encode speed of our tokenizer, and of tiktoken (if installed) on the same input.

    python scripts/benchmark_tokenizer.py [MODEL_DIR] [--runs N] [--baseline OLD_TOKENIZER_PY]

MODEL_DIR holds encoder.json + vocab.bpe (default: the package's copies of OpenAI's files, gpt2_numpy/data).

English: 1 MB (1,000,000 characters) of English documentation shipped with CPython: the language reference, then
stdlib docstrings, in tokens per second. "cold" encodes with a fresh tokenizer (empty word cache), as a program's first
prompt would; "warm" encodes the same text again, so every word is a cache hit.

Long pieces: 1 MB strings that GPT-2's regex keeps as one word each (random letters, digits, CJK ideographs,
punctuation; digit runs are not cut, as `\\p{N}+` has no length limit), so BPE runs on the whole string at once. Each
run encodes a new string with a fresh tokenizer. Columns: seconds, tiktoken's seconds, our seconds per byte over ours on
English, and growth, the time for 1 MB over the time for 100 KB (10 is linear).

--baseline FILE: also encode the English text and the long pieces with another version of gpt2_numpy/tokenizer.py
(for example `git show HEAD:gpt2_numpy/tokenizer.py > /tmp/old_tokenizer.py`), alternating runs with the current one so
both see the same load on a shared machine.

Each number is the median over the runs, in CPU seconds of this process; the CPU may be shared (its caches too), so
compare numbers taken by one command.
"""
import argparse
import importlib.util
import os
import statistics
import sys
import time
from collections import namedtuple
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # for gpt2_numpy and tests.text_samples when run from a checkout

from gpt2_numpy.tokenizer import EOT, PACKAGED_VOCABULARY, WORD_PATTERN, load_tokenizer  # noqa: E402
from tests.text_samples import english_text, long_word  # noqa: E402

LONG_PIECE_KINDS = ("letters", "digits", "CJK", "punctuation")  # keys of tests.text_samples.LONG_WORD_ALPHABETS
LongPieceRow = namedtuple("LongPieceRow", "name seconds tiktoken_seconds ratio_to_english growth tiktoken_growth "
                          "baseline_seconds baseline_growth", defaults=(None, None))


def seconds(function, *args):  # -> (CPU seconds of one call, its result)
    # CPU time, not wall-clock: encoding runs on one thread, and on a shared machine the wall clock also counts the
    # time other processes hold the CPU
    start = time.process_time()
    result = function(*args)
    return time.process_time() - start, result


def encode_throughput(model_dir, text, runs=5):  # -> {"cold": tok/s, "warm": tok/s, "tokens": n, "seconds": cold s}
    cold, warm = [], []
    for _ in range(runs):
        tokenizer = load_tokenizer(model_dir)
        elapsed, ids = seconds(tokenizer.encode, text)
        cold.append(elapsed)
        warm.append(seconds(tokenizer.encode, text)[0])
    return {"cold": len(ids) / statistics.median(cold), "warm": len(ids) / statistics.median(warm), "tokens": len(ids),
            "seconds": statistics.median(cold)}


def tiktoken_encoding(model_dir):  # -> tiktoken.Encoding built from the same files; ImportError without tiktoken
    import tiktoken.load

    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # read the files in place; keep no copies in the temp folder
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(str(model_dir / "vocab.bpe"), str(model_dir / "encoder.json"))
    return tiktoken.Encoding(
        "gpt2_files", pat_str=WORD_PATTERN.pattern, mergeable_ranks=ranks, special_tokens={EOT: 50256}
    )


def tiktoken_throughput(model_dir, text, runs=5):  # -> tokens/s of tiktoken's encode_ordinary on the same files
    encoding = tiktoken_encoding(model_dir)
    timings = [seconds(encoding.encode_ordinary, text) for _ in range(runs)]
    return len(timings[0][1]) / statistics.median(elapsed for elapsed, _ in timings)


def load_baseline(baseline_file):  # -> load_tokenizer of another version of gpt2_numpy/tokenizer.py
    spec = importlib.util.spec_from_file_location("baseline_tokenizer", baseline_file)
    baseline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(baseline)
    return baseline.load_tokenizer


def baseline_seconds(model_dir, text, baseline_load, runs=5):  # -> (median cold s now, median cold s of the baseline)
    timings = {load_tokenizer: [], baseline_load: []}
    for run in range(runs):
        order = list(timings) if run % 2 == 0 else list(timings)[::-1]  # who goes first alternates, against drift
        for load in order:
            timings[load].append(seconds(load(model_dir).encode, text)[0])
    return tuple(statistics.median(timing) for timing in timings.values())


def long_piece_seconds(make_encodes, kind, n_bytes, runs):  # -> ({name: median seconds}, bytes)
    """Encode new pieces of a kind with each of make_encodes ({name: () -> encode function}), in alternating order."""
    timings = {name: [] for name in make_encodes}
    for seed in range(runs):
        piece = long_word(kind, n_bytes, seed)
        assert WORD_PATTERN.findall(piece) == [piece], f"{kind}: GPT-2's regex cuts this piece"
        for name in list(make_encodes)[:: 1 if seed % 2 == 0 else -1]:  # who goes first alternates, against drift
            timings[name].append(seconds(make_encodes[name](), piece)[0])
    return {name: statistics.median(timing) for name, timing in timings.items()}, len(piece.encode("utf-8"))


def long_piece_rows(model_dir, n_bytes=1_000_000, runs=3, baseline_load=None):  # -> [LongPieceRow] per kind
    """Encode time of single-word strings of n_bytes; the tiktoken and baseline columns are None without tiktoken or
    baseline_load (the load_tokenizer of another tokenizer.py)."""
    english = english_text(n_bytes)
    english_per_byte = encode_throughput(model_dir, english, runs)["seconds"] / len(english.encode("utf-8"))
    # a fresh tokenizer per run: a cold start, and no 1 MB word left in the cache
    make_encodes = {"ours": lambda: load_tokenizer(model_dir).encode}
    try:
        encoding = tiktoken_encoding(model_dir)
        make_encodes["tiktoken"] = lambda: encoding.encode_ordinary
    except ImportError:
        pass
    if baseline_load is not None:
        make_encodes["baseline"] = lambda: baseline_load(model_dir).encode
    rows = []
    for kind in LONG_PIECE_KINDS:
        (small, _), (large, size) = (long_piece_seconds(make_encodes, kind, n, runs) for n in (n_bytes // 10, n_bytes))
        growth = {name: large[name] / small[name] for name in large}
        rows.append(LongPieceRow(f"{kind}, {size:,} bytes", large["ours"], large.get("tiktoken"),
                                 large["ours"] / size / english_per_byte, growth["ours"], growth.get("tiktoken"),
                                 large.get("baseline"), growth.get("baseline")))
    return rows


def print_long_piece_table(rows):
    baseline = rows[0].baseline_seconds is not None
    print(f"{'one-word string':<28}{'ours s':>8}{'tiktoken s':>12}{'ours/English per byte':>23}"
          f"{'growth at 10x bytes: ours':>27}{'tiktoken':>10}"
          + (f"{'baseline s':>12}{'growth':>8}" if baseline else ""))
    for row in rows:
        print(f"{row.name:<28}{row.seconds:>8.2f}{optional(row.tiktoken_seconds, '.3f'):>12}"
              f"{row.ratio_to_english:>22.1f}x{row.growth:>26.1f}x{optional(row.tiktoken_growth, '.1f'):>9}x"
              + (f"{row.baseline_seconds:>12.2f}{row.baseline_growth:>7.1f}x" if baseline else ""))


def optional(value, spec):  # -> value formatted, or "-" for None
    return "-" if value is None else format(value, spec)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", type=Path, default=PACKAGED_VOCABULARY)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another tokenizer.py to compare with")
    args = parser.parse_args()
    text = english_text(1_000_000)
    ours = encode_throughput(args.model_dir, text, args.runs)
    print(f"text: {len(text):,} characters, {len(text.encode()):,} UTF-8 bytes, {ours['tokens']:,} tokens")
    print(f"gpt2_numpy cold: {ours['cold'] / 1e6:.2f}M tokens/s   warm: {ours['warm'] / 1e6:.2f}M tokens/s")
    try:
        print(f"tiktoken:        {tiktoken_throughput(args.model_dir, text, args.runs) / 1e6:.2f}M tokens/s")
    except ImportError:
        print("tiktoken: not installed (pip install tiktoken)")
    baseline_load = load_baseline(args.baseline) if args.baseline else None
    if baseline_load:
        now, before = baseline_seconds(args.model_dir, text, baseline_load, args.runs)
        tokens = ours["tokens"]
        print(f"cold, alternating runs: this tokenizer.py {tokens / now / 1e6:.2f}M tokens/s ({now:.3f} s), "
              f"{args.baseline} {tokens / before / 1e6:.2f}M tokens/s ({before:.3f} s)")
    print()
    print_long_piece_table(long_piece_rows(args.model_dir, runs=args.runs, baseline_load=baseline_load))


if __name__ == "__main__":
    main()
