"""`gpt2-numpy score`: how likely GPT-2 finds a text, as the mean negative log-likelihood per token, perplexity and
bits per byte, and optionally every token's log-probability (gpt2_numpy/likelihood.py computes them).

    gpt2-numpy score "The quick brown fox jumps over the lazy dog."
    gpt2-numpy score --data essay.txt --per-token --stride 256

stdout carries only the scores (one JSON object with --json); progress and diagnostics go to stderr.
"""
import json
import math
import os
import sys

import numpy as np

from gpt2_numpy.commands.common import (
    ArgumentParser, add_model_args, model_from_args, open_stdout, path_argument, read_data, read_prompt, run_model_cli,
    whole_number, write_stdout,
)
from gpt2_numpy.console import plural, progress_bar
from gpt2_numpy.errors import UsageError
from gpt2_numpy.likelihood import iter_log_probs, score_windows, scored_bytes, summary, text_ids
from gpt2_numpy.tokenizer import EOT


# surprisal (bits) -> ANSI colour of a token's text: green up to 2 bits, yellow up to 6, red up to 12, then bold red
COLOURS = [(2, "32"), (6, "33"), (12, "31"), (math.inf, "1;31")]


def parse_args(argv):  # -> argparse.Namespace
    parser = ArgumentParser(
        prog="gpt2-numpy score",
        description="Score text with GPT-2 (pure NumPy): the mean negative log-likelihood per token, perplexity and "
        "bits per byte, optionally per token. stdout gets only the scores; progress goes to stderr.",
        dash_hint='a text that begins with \'-\' goes last, after \'--\': gpt2-numpy score -- "-x"',
    )
    parser.add_argument("text", nargs="?", metavar="TEXT",
                        help="the text to score; \"-\" reads stdin; a text beginning with '-' goes last, after --")
    parser.add_argument("--data", type=path_argument, metavar="FILE", help="score this UTF-8 file instead of TEXT")
    parser.add_argument("--file", type=path_argument, metavar="FILE", help="old name of --data")
    parser.add_argument("--stride", type=whole_number(1), metavar="S",
                        help="for texts longer than the context (n_ctx tokens): windows of n_ctx tokens start every "
                        "S tokens, and each token is scored with at least n_ctx - S tokens of context (n_ctx // 2)")
    parser.add_argument("--no-bos", action="store_true",
                        help=f"do not put {EOT} before the text, so its first token is context and is not scored")
    parser.add_argument("--per-token", action="store_true", help="also list every token's log-probability")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_model_args(parser)
    args = parser.parse_args(argv)
    # messages name the flag as the user spelled it
    args.data_flag, args.data = ("--file", args.file) if args.data is None else ("--data", args.data)
    if args.file is not None and args.data_flag == "--data":
        raise UsageError("--file is the old name of --data: give one of them")
    if args.text is not None and args.data is not None:
        raise UsageError(f"give the text either as TEXT or with {args.data_flag}, not both")
    if args.text is None and args.data is None:
        raise UsageError("nothing to score: give the text as TEXT, \"-\" to read it from stdin, or --data FILE")
    return args


def main(argv=None):  # -> never returns; errors become one line on stderr and an exit status
    run_model_cli(run, argv)


def run(argv=None):  # -> exit status
    args = parse_args(argv)
    open_stdout()  # a closed stdout is refused before the model loads
    if args.data is None:
        text = read_prompt(args.text, "the text")
    else:
        text = read_data(args.data, args.data_flag)
    hparams, params, tokenizer = model_from_args(args)
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


def scored_with_progress(ids, params, n_head, stride):  # -> float64 [len(ids) - 1], with a progress bar on stderr
    windows = iter_log_probs(ids, params, n_head, stride=stride)
    n_windows = len(score_windows(len(ids), params["wpe"].shape[0], stride))
    if n_windows == 1:
        return next(windows)
    log_probs = []
    with progress_bar(total=len(ids) - 1, unit="token", desc=f"{n_windows} windows", leave=False) as bar:
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
