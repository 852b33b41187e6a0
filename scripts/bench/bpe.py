"""Time BPE training: ours (gpt2_numpy.tokenizer_train.train_bpe) against Hugging Face's Rust trainer, if installed.

    python -m scripts.bench.bpe [--data FILE] [--vocab-size N] [--runs N] [--hf-python PYTHON]

and as the rows of `python -m scripts.benchmark --only 'BPE training'`.

The two train in turns (ours, Hugging Face's, ours, ...), each run in a fresh child process, so both see the same load
on a shared machine and each peak memory is that run's own. Hugging Face's trainer is BpeTrainer with the ByteLevel
pre-tokenizer, as tests/unit/test_tokenizer_train.py checks ours against; it runs under --hf-python (default: this one),
and is left out when that Python lacks `tokenizers`, e.g. `--hf-python ../refvenv/bin/python`.

Prints a markdown table row: the text, the vocabulary size, seconds for ours and for Hugging Face's (the median over the
runs, wall-clock of the training call alone: reading the file and starting Python excluded; Hugging Face's trainer may
use every core, ours uses one), their ratio, and each one's peak memory (the child's maximum resident set size since
it started, its Python included).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts.bench.harness import HF, OURS, row

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO.parent / "shared" / "corpus" / "shakespeare-plays.txt"
HEADER = "| text | vocab size | ours s | HF s | ours / HF | ours peak MB | HF peak MB |\n|---|---|---|---|---|---|---|"
HF_MISSING = 3  # a child's exit status when its Python has no `tokenizers`


def load_trainer(name):  # -> train(text, vocab_size); imported here, so the import is not timed
    if name == "ours":
        from gpt2_numpy.tokenizer_train import train_bpe
        return lambda text, vocab_size: train_bpe(text, vocab_size, quiet=True)
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    def train_hf(text, vocab_size):
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False, special_tokens=[
            "<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator([text], trainer)
    return train_hf


def child(name, data, vocab_size):  # in the child process: train once, print the seconds it took and the peak MB
    try:
        train = load_trainer(name)
    except ModuleNotFoundError:
        sys.exit(HF_MISSING)  # the parent says so, once
    text = Path(data).read_text(encoding="utf-8")
    start = time.perf_counter()
    train(text, vocab_size)
    print(json.dumps([time.perf_counter() - start, peak_rss_mb()]))


def peak_rss_mb():  # -> this process's peak resident set size, as the kernel counts it since exec
    # not the parent's wait4 ru_maxrss: a child forked from a large parent (the benchmark holds two models) keeps that
    # parent's size in its maximum, exec or not
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def run_child(python, trainer, args):  # -> (seconds, peak MB), or None when that Python lacks Hugging Face's trainer
    command = [python, "-m", "scripts.bench.bpe", "--child", trainer, "--data", str(Path(args.data).resolve()),
               "--vocab-size", str(args.vocab_size)]  # resolved here: the child runs in the repo's folder
    process = subprocess.run(command, stdout=subprocess.PIPE, text=True, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})  # this checkout's gpt2_numpy
    if process.returncode == HF_MISSING and trainer == "hf":
        return None
    if process.returncode:
        sys.exit(f"error: {' '.join(command)} failed with status {process.returncode}")
    return tuple(json.loads(process.stdout))  # [seconds, peak MB]


def bpe_rows(repeats, data=CORPUS, hf_python=sys.executable):  # -> the benchmark's rows: seconds, peak MB, both
    args = argparse.Namespace(data=data, vocab_size=4096)
    runs = [(run_child(sys.executable, "ours", args), run_child(hf_python, "hf", args)) for _ in range(repeats)]
    ours, hf = zip(*runs)  # in turns, so both see the same load
    metric = f"train a {args.vocab_size:,}-token BPE on {data.name}"
    theirs = {} if None in hf else {HF: statistics.median(s for s, _ in hf)}
    theirs_peak = {} if None in hf else {HF: max(peak for _, peak in hf)}
    return [row(f"{metric}, s", "lower", {OURS: statistics.median(s for s, _ in ours), **theirs}),
            row(f"{metric}, peak MB", "lower", {OURS: max(peak for _, peak in ours), **theirs_peak})]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=CORPUS, help="the text to train on (default: %(default)s)")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=3, help="runs of each trainer, in turns (default: 3)")
    parser.add_argument("--hf-python", default=sys.executable, help="the Python that runs Hugging Face's trainer")
    parser.add_argument("--child", choices=["ours", "hf"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.data, args.vocab_size)
    if not args.data.is_file():
        sys.exit(f"error: {args.data} is not a file: pass the text to train on with --data")
    ours, hf = [], []
    for _ in range(args.runs):
        ours.append(run_child(sys.executable, "ours", args))
        hf.append(run_child(args.hf_python, "hf", args))
    ours_seconds, ours_peak = statistics.median(s for s, _ in ours), max(peak for _, peak in ours)
    row = [args.data.name, f"{args.vocab_size:,}", f"{ours_seconds:.2f}"]
    if None in hf:
        print(f"Hugging Face's trainer left out: {args.hf_python} has no `tokenizers`", file=sys.stderr)
        row += ["-", "-", f"{ours_peak:.0f}", "-"]
    else:
        hf_seconds, hf_peak = statistics.median(s for s, _ in hf), max(peak for _, peak in hf)
        row += [f"{hf_seconds:.2f}", f"{ours_seconds / hf_seconds:.2f}x", f"{ours_peak:.0f}", f"{hf_peak:.0f}"]
    print(HEADER)
    print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
