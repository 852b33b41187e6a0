"""Scoring text: the log-probability GPT-2 gives each token after the ones before it, and the loss, perplexity and
bits per byte they add up to; texts longer than the context go through overlapping windows. And the command line.

    python -m gpt2_numpy.score "The quick brown fox jumps over the lazy dog."
    python -m gpt2_numpy.score --file essay.txt --per-token --stride 256

stdout carries only the scores (one JSON object with --json); progress and diagnostics go to stderr.
"""
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from gpt2_numpy.cli import add_model_args, load_model, read_prompt, whole_number, write_stdout
from gpt2_numpy.errors import ArgumentParser, NonFiniteError, UsageError, open_stdout, plural, run_cli
from gpt2_numpy.fast import check_inputs, lm_head, log_softmax_at, transformer
from gpt2_numpy.tokenizer import EOT

# --- Log-probabilities ---


def token_log_probs(inputs, params, n_head, *, stride=None):  # int [n] -> float64 [n - 1]
    """ln p(inputs[t] | the tokens before t in its window) for t = 1 .. n-1, in nats.

    Up to n_ctx tokens are scored in one forward pass. A longer sequence goes through windows of n_ctx tokens that
    start every `stride` tokens (default n_ctx // 2), each scoring only the tokens no earlier window scored (see
    score_windows): every token is scored once, with at least n_ctx - stride tokens of context once the sequence is
    that long. This is the method of Hugging Face's guide "Perplexity of fixed-length models". ValueError for token
    ids outside the vocabulary; UsageError for fewer than 2 ids or a stride outside 1 .. n_ctx - 1."""
    return np.concatenate(list(iter_log_probs(inputs, params, n_head, stride=stride)))


def iter_log_probs(inputs, params, n_head, *, stride=None):  # -> iterator of float64 [n_scored], one per window
    """token_log_probs window by window (for progress reports), in order. Every argument and every token id is checked
    here, before the first window runs."""
    ids = np.asarray(inputs)
    if ids.ndim != 1:
        raise ValueError(f"inputs must be a 1-D sequence of token ids, got shape {ids.shape}")
    if len(ids) < 2:
        raise UsageError(f"scoring needs at least 2 tokens, got {len(ids)}: the first token is only context")
    n_vocab, n_ctx = params["wte"].shape[0], params["wpe"].shape[0]
    windows = score_windows(len(ids), n_ctx, stride)
    windows = [(check_inputs(ids[begin:end], n_vocab, n_ctx), first - begin) for begin, first, end in windows]
    return (window_log_probs(window, n_context, params, n_head) for window, n_context in windows)


def score_windows(n, n_ctx, stride=None):  # -> [(begin, first, end)]: window [begin, end) scores tokens first .. end-1
    """The windows that score n >= 2 tokens with a context of n_ctx: starting at 0, stride, 2 * stride, ..., each n_ctx
    tokens long (or up to n), each scoring from where the previous one ended (token 1 for the first), up to its own
    end; the last is the first one that reaches n. A token scored at t then has t - begin tokens of context."""
    stride = check_stride(n_ctx // 2 if stride is None else stride, n_ctx)
    windows, begin, scored_up_to = [], 0, 1  # token 0 has no context and is never scored
    while scored_up_to < n:
        end = min(begin + n_ctx, n)
        windows.append((begin, scored_up_to, end))
        begin, scored_up_to = begin + stride, end
    return windows


def check_stride(stride, n_ctx):  # -> stride, or UsageError unless it is a whole number in 1 .. n_ctx - 1
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or not 1 <= stride < n_ctx:
        why = ("the first token a window scores needs the token before it in the same window; with a stride of "
               "n_ctx that token would have no context, and Hugging Face's guide silently skips it"
               if stride == n_ctx else "each window must overlap the one before by at least one token")
        raise UsageError(f"the stride must be a whole number from 1 to {n_ctx - 1} (n_ctx - 1), got {stride!r}: {why}")
    return int(stride)


def window_log_probs(window, n_context, params, n_head):  # int [n_window] -> float64 [n_window - n_context]
    # the hidden state at position t predicts token t + 1: so the window's last token, only a target, never goes in,
    # and the lm head (nearly a third of the work at 124M) runs only on the positions that predict a scored token
    x = transformer(window[:-1], **params, n_head=n_head)  # [n_window - 1, n_embd]
    log_probs = log_softmax_at(lm_head(x[n_context - 1 :], params["wte"]), window[n_context:])
    if not np.isfinite(log_probs).all():  # NaN or inf anywhere in a row of logits makes its log-probability NaN
        raise NonFiniteError
    return log_probs


def summary(log_probs, n_bytes):  # float [n] -> {n_tokens, nll, perplexity, bits_per_byte, n_bytes}
    """The scores of a text from its tokens' log-probabilities (nats) and the UTF-8 bytes those tokens spell: the mean
    negative log-likelihood per token (nats), the perplexity e^nll, and bits per byte (total NLL / ln 2 / bytes)."""
    total = -math.fsum(log_probs)
    nll = total / len(log_probs)
    return {"n_tokens": len(log_probs), "nll": nll, "perplexity": perplexity(nll),
            "bits_per_byte": total / math.log(2) / n_bytes, "n_bytes": n_bytes}


def scored_bytes(tokenizer, ids):  # -> the UTF-8 bytes the scored tokens spell: every id's but the first, only context
    return sum(len(tokenizer.token_bytes(token_id)) for token_id in ids[1:])


def perplexity(nll):  # -> e^nll; inf where that exceeds the largest double (nll above 709.78 nats)
    try:
        return math.exp(nll)
    except OverflowError:  # math.exp raises where np.exp would return inf
        return math.inf


# --- The command line ---

# surprisal (bits) -> ANSI colour of a token's text: green up to 2 bits, yellow up to 6, red up to 12, then bold red
COLOURS = [(2, "32"), (6, "33"), (12, "31"), (math.inf, "1;31")]


def parse_args(argv):  # -> argparse.Namespace
    parser = ArgumentParser(
        prog="python -m gpt2_numpy.score",
        description="Score text with GPT-2 (pure NumPy): the mean negative log-likelihood per token, perplexity and "
        "bits per byte, optionally per token. stdout gets only the scores; progress goes to stderr.",
        dash_hint='a text that begins with \'-\' goes last, after \'--\': python -m gpt2_numpy.score -- "-x"',
    )
    parser.add_argument("text", nargs="?", metavar="TEXT",
                        help="the text to score; \"-\" reads stdin; a text beginning with '-' goes last, after --")
    parser.add_argument("--file", metavar="PATH", help="score this UTF-8 file instead of TEXT")
    parser.add_argument("--stride", type=whole_number(1), metavar="S",
                        help="for texts longer than the context (n_ctx tokens): windows of n_ctx tokens start every "
                        "S tokens, and each token is scored with at least n_ctx - S tokens of context (n_ctx // 2)")
    parser.add_argument("--no-bos", action="store_true",
                        help=f"do not put {EOT} before the text, so its first token is context and is not scored")
    parser.add_argument("--per-token", action="store_true", help="also list every token's log-probability")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_model_args(parser)
    args = parser.parse_args(argv)
    if args.text is not None and args.file is not None:
        raise UsageError("give the text either as TEXT or with --file, not both")
    if args.text is None and args.file is None:
        raise UsageError("nothing to score: give the text as TEXT, \"-\" to read it from stdin, or --file PATH")
    return args


def main(argv=None):  # console entry point: errors become one line on stderr and an exit status
    with np.errstate(invalid="ignore", over="ignore"):  # NaN or inf from the weights: NonFiniteError says it once
        run_cli(run, argv)


def run(argv=None):  # -> exit status
    args = parse_args(argv)
    open_stdout()  # a closed stdout is refused before the model loads
    text = read_prompt(args.text) if args.file is None else read_text_file(args.file)
    hparams, params, tokenizer = load_model(args)
    ids = text_ids(tokenizer, text, hparams["n_vocab"], bos=not args.no_bos)
    log_probs = scored_with_progress(ids, params, hparams["n_head"], args.stride)
    scores = summary(log_probs, scored_bytes(tokenizer, ids))
    rows = [(position, ids[position], log_prob) for position, log_prob in enumerate(log_probs, start=1)]
    if args.json:
        if args.per_token:
            scores["tokens"] = [{"position": position, "id": token_id, "text": tokenizer.decode([token_id]),
                                 "logprob": float(log_prob)} for position, token_id, log_prob in rows]
        write_stdout(json_text(scores) + "\n")
        return 0
    table = table_lines(rows, tokenizer, colour=use_colour()) if args.per_token else []
    write_stdout("\n".join(table + summary_lines(scores, bos=not args.no_bos)) + "\n")
    return 0


def json_text(scores):  # -> one line of standard JSON: an infinite perplexity is null (JSON has no Infinity)
    return json.dumps({key: None if value == math.inf else value for key, value in scores.items()})


def read_text_file(path):  # -> the file's text; UsageError when it cannot be read or is not UTF-8
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read --file {path}: {error.strerror or error}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"--file {path} is not UTF-8 text (byte {error.start} cannot be decoded): convert it to "
                         "UTF-8 first") from None


def text_ids(tokenizer, text, n_vocab, bos):  # -> ids to score, all < n_vocab: [<|endoftext|>, *text's ids] with bos
    # "<|endoftext|>" written in the text is the document separator, as in generate and in GPT-2's training data
    ids = ([tokenizer.eot_id] if bos else []) + tokenizer.encode(text, allowed_special="all")
    if len(ids) < 2:
        what = "the text is empty" if not text else f"the text is a single token ({text!r}) and --no-bos leaves " \
            "nothing before it"
        raise UsageError(f"{what}: scoring needs a token to predict after some context; give a longer text"
                         + ("" if bos else f", or drop --no-bos to predict the first token after {EOT}"))
    if bos and tokenizer.eot_id >= n_vocab:
        raise UsageError(f"this model's vocabulary of {n_vocab} tokens has no {EOT} (id {tokenizer.eot_id}) to put "
                         "before the text: pass --no-bos to score the text from its second token")
    outside = [(position, token_id) for position, token_id in enumerate(ids) if token_id >= n_vocab]
    if outside:
        position, token_id = outside[0]
        raise UsageError(f"the text's token {token_id} ({tokenizer.decode([token_id])!r}, position {position}) is "
                         f"outside this model's vocabulary of {n_vocab} tokens: use a model with GPT-2's full "
                         "vocabulary, or a text of other words")
    return ids


def scored_with_progress(ids, params, n_head, stride):  # -> float64 [len(ids) - 1], with a progress bar on stderr
    windows = iter_log_probs(ids, params, n_head, stride=stride)
    n_windows = len(score_windows(len(ids), params["wpe"].shape[0], stride))
    if n_windows == 1:
        return next(windows)
    from tqdm import tqdm  # only for texts longer than the context: importing it costs a short text's run time

    log_probs = []
    with tqdm(total=len(ids) - 1, unit="token", desc=f"{n_windows} windows", file=sys.stderr, leave=False) as bar:
        for window in windows:
            log_probs.append(window)
            bar.update(len(window))
    return np.concatenate(log_probs)


def use_colour():  # -> True when stdout is a terminal and the user has not asked for plain text (no-color.org)
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def table_lines(rows, tokenizer, colour):  # -> [str]: a header, then one line per scored token, the text last
    lines = [f"{'position':>8} {'id':>6} {'logprob':>10} {'bits':>8}  token"]
    for position, token_id, log_prob in rows:
        bits = -log_prob / math.log(2)
        token = visible(tokenizer.token_bytes(token_id))
        if colour:
            code = next(code for limit, code in COLOURS if bits < limit)
            token = f"\x1b[{code}m{token}\x1b[0m"
        lines.append(f"{position:>8} {token_id:>6} {log_prob:>10.4f} {bits:>8.3f}  {token}")
    return lines


def visible(token_bytes):  # b" a\n" -> "␣a\\n": a token's text with spaces, controls and partial characters shown
    # a token may hold part of a multi-byte character: those bytes decode to lone surrogates and show as \xNN
    return "".join(map(visible_char, token_bytes.decode("utf-8", errors="surrogateescape")))


def visible_char(char):  # -> char, or an escape for a space, a backslash, an undecodable byte or an unprintable char
    # \xNN is only ever a byte of a partial character; a whole character is \uNNNN (or \UNNNNNNNN), even below U+0100
    if char == " ":
        return "␣"
    if char in "\\␣":
        return "\\\\" if char == "\\" else "\\u2423"  # escaped, so that "␣" and "\x.." always mean what they show
    if "\udc80" <= char <= "\udcff":
        return f"\\x{ord(char) - 0xDC00:02x}"
    if char.isprintable():
        return char
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char) or (
        f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}")


def summary_lines(scores, bos):  # -> [str]: the scores as aligned lines
    first = f", the first after {EOT}" if bos else ""
    return [f"tokens scored  {scores['n_tokens']}{first}",
            f"nll            {scores['nll']:.6f} nats per token",
            f"perplexity     {scores['perplexity']:.4f}",
            f"bits per byte  {scores['bits_per_byte']:.6f} ({plural(scores['n_bytes'], 'UTF-8 byte')})"]


if __name__ == "__main__":
    main()
