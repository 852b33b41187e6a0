"""How long scoring a long text takes: gpt2_numpy's token_log_probs against the sliding-window loop of Hugging Face's
guide "Perplexity of fixed-length models", on the same weights, the same ids and the same windows.

    ../refvenv/bin/python scripts/score_benchmark.py --checkpoint /tmp/gpt2-tf-124M [--repeats 3]

`score_seconds` is the function scripts/benchmark.py calls for its row. The weights come from a TF checkpoint dir (the
real 124M, or a 124M-shaped one from `scripts/make_tf_fixture.py --config 124M --out DIR`); the text is English from
tests/text_samples.py, encoded with the official tokenizer. HF runs with its default attention (sdpa) and as many torch
threads as NumPy's BLAS uses. The two take turns window by window, so load that comes and goes falls on both; each
time is the median of --repeats runs after a one-window warm-up. On a machine where another process holds a core, two
threads measure the machine, not the code: OpenBLAS stalls whenever one of its threads gets no core, far more than
torch does. Compare one thread each there (OPENBLAS_NUM_THREADS=1 sets torch's threads to 1 as well).
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from gpt2_numpy import keep_freed_memory  # noqa: E402
from gpt2_numpy.checkpoint import load_params  # noqa: E402
from gpt2_numpy.score import iter_log_probs  # noqa: E402
from gpt2_numpy.tokenizer import load_tokenizer  # noqa: E402
from tests.text_samples import english_text  # noqa: E402

OFFICIAL_124M = REPO.parent / "shared" / "gpt2-official" / "124M"


def score_seconds(checkpoint_dir, threads, n_tokens=10_000, stride=512, repeats=1):  # -> (ours s, HF s)
    """Median seconds to score the first n_tokens ids of English text with windows of n_ctx and `stride`: ours
    (token_log_probs, window by window) and HF's guide loop on the same weights, with `threads` torch threads (pass
    the number NumPy's BLAS uses). The two take turns window by window, so load that comes and goes falls on both."""
    import torch

    from make_reference import hf_model

    torch.set_num_threads(threads)
    hparams, params = load_params(checkpoint_dir)
    vocab_dir = next(d for d in (Path(checkpoint_dir), OFFICIAL_124M) if (d / "encoder.json").exists())
    ids = english_ids(load_tokenizer(vocab_dir), n_tokens)
    model = hf_model(hparams, params, attn_implementation="sdpa")  # HF's default

    def runs(ids):  # -> the two engines' window-by-window iterators over ids
        return (iter_log_probs(ids, params, hparams["n_head"], stride=stride),
                hf_guide_windows(model, torch, ids, hparams["n_ctx"], stride))

    for run in runs(ids[: hparams["n_ctx"]]):  # warm-up, untimed: one window each
        list(run)
    seconds = []
    for _ in range(repeats):
        ours, hf = map(timed_steps, runs(ids))
        totals = np.zeros(2)  # seconds, ours and HF
        nll_sums = np.zeros(2)
        for (ours_seconds, log_probs), (hf_seconds, (loss, n_scored)) in zip(ours, hf):  # in turn, window by window
            assert len(log_probs) == n_scored, "the two score different windows"
            totals += ours_seconds, hf_seconds
            nll_sums += -log_probs.sum(), loss * n_scored
        assert next(ours, None) is None and next(hf, None) is None, "the two score different windows"
        seconds.append(totals)
        nll = nll_sums / (len(ids) - 1)
        print(f"ours {totals[0]:.2f} s, HF {totals[1]:.2f} s; mean NLL {nll[0]:.6f} and {nll[1]:.6f}", file=sys.stderr)
    ours_seconds, hf_seconds = np.median(seconds, axis=0)
    return float(ours_seconds), float(hf_seconds)


def timed_steps(iterator):  # -> iterator of (seconds, item): each item with the time its next() took
    while True:
        start = time.perf_counter()
        try:
            item = next(iterator)
        except StopIteration:
            return
        yield time.perf_counter() - start, item


def english_ids(tokenizer, n_tokens):  # -> the first n_tokens ids of the English sample text
    n_chars = 6 * n_tokens  # English runs about 4 to 5 characters per token: this is enough
    ids = tokenizer.encode(english_text(n_chars))
    assert len(ids) >= n_tokens, f"{n_chars} characters gave only {len(ids)} tokens"
    return ids[:n_tokens]


def hf_guide_windows(model, torch, ids, max_length, stride):  # -> iterator of (loss, tokens scored), one per window
    encodings = torch.tensor([ids])
    seq_len = encodings.size(1)
    prev_end_loc = 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = encodings[:, begin_loc:end_loc]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            loss = model(input_ids, labels=target_ids).loss
        # the guide weights the loss by num_valid_tokens - 1, one token too few after the first window
        yield loss.item(), trg_len - 1 if begin_loc == 0 else trg_len
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=REPO / "weights" / "124M", help="a TF checkpoint dir")
    parser.add_argument("--n-tokens", type=int, default=10_000)
    parser.add_argument("--stride", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from benchmark import blas_threads  # here, not at the top: benchmark.py imports this module for its row

    keep_freed_memory()  # as the CLIs do, for both engines in this process
    ours, hf = score_seconds(args.checkpoint, blas_threads(), args.n_tokens, args.stride, args.repeats)
    print(f"score {args.n_tokens:,} tokens with stride {args.stride}: gpt2_numpy {ours:.2f} s, HF transformers "
          f"{hf:.2f} s, ours / HF {ours / hf:.2f}x")


if __name__ == "__main__":
    main()
