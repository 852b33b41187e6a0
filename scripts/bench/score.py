"""How long scoring a long text takes (the "score" part of scripts/benchmark.py): gpt2_numpy's token_log_probs against
the sliding-window loop of Hugging Face's guide "Perplexity of fixed-length models", on the same weights, the same ids
and the same windows.

    ../refvenv/bin/python -m scripts.bench.score --checkpoint /tmp/gpt2-tf-124M [--repeats 3]

The weights come from a TF checkpoint dir (the real 124M, or a 124M-shaped one from
`python -m scripts.fixtures.make_tf_fixture --config 124M --out DIR`); the text is English from
scripts/common/text_samples.py, encoded with GPT-2's tokenizer. HF runs with its default attention (sdpa) and as many
torch threads as NumPy's BLAS uses. The two take turns window by window, so load that comes and goes falls on both;
each time is the median of --repeats runs after a one-window warm-up. On a machine where another process holds a core,
two threads measure the machine, not the code: OpenBLAS stalls whenever one of its threads gets no core, far more than
torch does. Compare one thread each there (OPENBLAS_NUM_THREADS=1 sets torch's threads to 1 as well).
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

from gpt2_numpy import keep_freed_memory
from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.commands.common import whole_number
from gpt2_numpy.errors import Gpt2NumpyError
from gpt2_numpy.score import iter_log_probs
from gpt2_numpy.tokenizer import load_tokenizer
from scripts.bench.engines import HuggingFace, Ours
from scripts.bench.harness import HF, OURS, REPO, row, vocabulary
from scripts.common.text_samples import english_text


def score_rows(engines, vocab_dir, repeats):  # -> the row, or none without HF's engine to compare with
    if len(engines) < 2:
        return []
    ours, hf = score_seconds(*engines, vocab_dir, n_tokens=10_000, stride=512, repeats=repeats)
    return [row("score 10,000 tokens of English, stride 512 (s)", "lower", {OURS: ours, HF: hf})]


def score_seconds(ours, hf, vocab_dir, n_tokens, stride, repeats):  # -> (ours s, HF s): engines.Ours, HuggingFace
    """Median seconds to score the first n_tokens ids of English text with windows of n_ctx and `stride`: ours
    (token_log_probs, window by window) and HF's guide loop on the same weights."""
    ids = english_ids(load_tokenizer(vocab_dir), n_tokens)
    n_ctx = len(ours.params["wpe"])

    def runs(ids):  # -> the two engines' window-by-window iterators over ids
        return (iter_log_probs(ids, ours.params, ours.n_head, stride=stride),
                hf_guide_windows(hf.model, hf.torch, ids, n_ctx, stride))

    for run in runs(ids[:n_ctx]):  # warm-up, untimed: one window each
        list(run)
    seconds = []
    for _ in range(repeats):
        ours_steps, hf_steps = map(timed_steps, runs(ids))
        totals = np.zeros(2)  # seconds, ours and HF
        nll_sums = np.zeros(2)
        for (ours_seconds, log_probs), (hf_seconds, (loss, n_scored)) in zip(ours_steps, hf_steps):  # window by window
            assert len(log_probs) == n_scored, "the two score different windows"
            totals += ours_seconds, hf_seconds
            nll_sums += -log_probs.sum(), loss * n_scored
        assert next(ours_steps, None) is None and next(hf_steps, None) is None, "the two score different windows"
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
    parser.add_argument("--n-tokens", type=whole_number(2), default=10_000)
    parser.add_argument("--stride", type=whole_number(1), default=512)
    parser.add_argument("--repeats", type=whole_number(1), default=3)
    args = parser.parse_args()
    keep_freed_memory()  # as the CLIs do, for both engines in this process
    try:
        hparams, params = load_params(args.checkpoint)
    except Gpt2NumpyError as error:
        parser.exit(2, f"error: --checkpoint: {error}\n")
    engines = Ours(params, hparams["n_head"]), HuggingFace(params, hparams)
    ours, hf = score_seconds(*engines, vocabulary(args.checkpoint), args.n_tokens, args.stride, args.repeats)
    print(f"score {args.n_tokens:,} tokens with stride {args.stride}: gpt2_numpy {ours:.2f} s, HF transformers "
          f"{hf:.2f} s, ours / HF {ours / hf:.2f}x")


if __name__ == "__main__":
    main()
