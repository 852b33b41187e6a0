"""`gpt2-numpy generate`: continue prompts, printing the continuations (a single one streamed token by token).

    gpt2-numpy generate "Alan Turing theorized that computers would one day become" --n-tokens 40
    gpt2-numpy generate "The cat" "The dog" --temperature 0.8 --num-samples 4 --seed 1
    gpt2-numpy generate "The cat" "The dog" --temperature 0.8 --num-samples 4 --json > samples.jsonl

stdout carries only the generated continuations, or with --json one JSON object per line for each sample (see
JSON_HELP); everything else goes to stderr. The decode loop itself is gpt2_numpy/decode.py.
"""
import json
import secrets
import sys
import time


from gpt2_numpy.catalog import OFFICIAL_HPARAMS
from gpt2_numpy.commands.common import (
    ArgumentParser, add_model_args, model_from_args, model_size, open_stdout, read_prompt, run_model_cli,
    whole_number, write_stdout,
)
from gpt2_numpy.console import log, plural
from gpt2_numpy.decode import BATCH_SIZE, check_room, iter_batch, iter_generate
from gpt2_numpy.errors import Interrupted, UsageError
from gpt2_numpy.loading import prompt_ids
from gpt2_numpy.sampling import check_sampling_args

JSON_HELP = (
    "print each sample, once it ends, as one JSON object on its own line (JSON Lines; nothing is streamed), with: "
    "prompt_index and sample_index (counted from 0: which PROMPT, and which of its --num-samples); seed (the one this "
    "sample drew with: that PROMPT alone with --seed SEED gives it again; null when greedy); prompt (the PROMPT's "
    "text); text (the continuation, without the prompt); token_ids (the continuation's ids, without the "
    "<|endoftext|> that ends it; with --ignore-eos, its id may be among them); finish_reason (\"stop\": the model "
    "chose <|endoftext|>; \"length\": --n-tokens reached)"
)


def parse_args(argv):  # -> argparse.Namespace, checked
    parser = ArgumentParser(
        prog="gpt2-numpy generate",
        description="Continue prompts with GPT-2 (pure NumPy). stdout gets only the continuations; "
        "progress and statistics go to stderr.",
        dash_hint='a prompt that begins with \'-\' goes last, after \'--\': gpt2-numpy generate --n-tokens 5 -- "-x"',
    )
    prompts = parser.add_argument("prompts", nargs="+", metavar="PROMPT",
                        help='text to continue (several: one continuation each); "-" reads stdin; "" starts from '
                        "scratch; a prompt beginning with '-' goes last, after --")
    parser.add_argument("--n-tokens", type=whole_number(1), default=40, metavar="N", help="tokens to generate (40)")
    add_model_args(parser)
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0: greedy (default); > 0 samples")
    parser.add_argument("--top-k", type=whole_number(1), metavar="K", help="sample from the K most likely tokens only")
    parser.add_argument("--top-p", type=float, metavar="P", help="sample from the fewest tokens holding probability P")
    parser.add_argument("--seed", type=whole_number(0), metavar="S",
                        help="seed of the first continuation; the k-th printed uses S + k - 1 (default: a random S, "
                        "which --json records)")
    parser.add_argument("--num-samples", type=whole_number(1), default=1, metavar="N",
                        help="continuations per prompt (1)")
    parser.add_argument("--batch-size", type=whole_number(1), default=BATCH_SIZE, metavar="B",
                        help=f"sequences computed together, one continuation each ({BATCH_SIZE}); each holds a KV "
                        "cache of 72 KiB per token of context for 124M (n_layer x 2 x n_embd float32)")
    parser.add_argument("--ignore-eos", action="store_true", help="keep going past <|endoftext|>")
    parser.add_argument("--no-stream", action="store_true", help="print a single continuation only when complete")
    parser.add_argument("--json", action="store_true", help=JSON_HELP)
    # prompts stand before and after the flags, and all that follows "--" is prompts (argparse alone takes no prompt
    # after the flags once one stood before them, and its intermixed parsing mistakes "-x" after "--" for a flag)
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    parser.usage = parser.format_usage().removeprefix("usage: ").strip()  # with PROMPT as required, as it is
    prompts.nargs = "*"  # the words after "--" may be the only prompts: checked below, once they are counted
    args = parser.parse_intermixed_args(argv[:cut])
    args.prompts += argv[cut + 1 :]
    if not args.prompts:
        parser.error("the following arguments are required: PROMPT")
    if args.prompts.count("-") > 1:
        raise UsageError('"-" (read the prompt from stdin) may be given only once')
    check_sampling_args(args.temperature, args.top_k, args.top_p)
    if model_size(args):  # before any download: every official GPT-2 has 1024 positions, and a prompt takes one
        check_room(1, args.n_tokens, OFFICIAL_HPARAMS[model_size(args)]["n_ctx"])
    return args


def main(argv=None):  # -> never returns; errors become one line on stderr and an exit status
    run_model_cli(run, argv)


def run(argv=None):  # -> exit status
    args = parse_args(argv)
    open_stdout()  # a closed stdout is refused before the model loads
    texts = [read_prompt(prompt) for prompt in args.prompts]
    greedy = args.temperature == 0
    note_ignored_options(args, greedy)
    if not greedy and args.seed is None:  # drawn here, not inside numpy, so that --json can record every sample's seed
        args.seed = secrets.randbits(32)
    hparams, params, tokenizer = model_from_args(args)
    names = ["the prompt"] if len(texts) == 1 else [f"prompt {index + 1}" for index in range(len(texts))]
    prompts = [prompt_ids(tokenizer, text, hparams["n_vocab"], name) for text, name in zip(texts, names)]
    for prompt, name in zip(prompts, names):  # every prompt is checked before any text is printed
        check_room(len(prompt), args.n_tokens, hparams["n_ctx"], name)
    options = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, stop_at_eos=not args.ignore_eos,
                   eos_id=tokenizer.eot_id)
    # the k-th continuation printed is row k - 1, seeded args.seed + k - 1; greedy rows of one prompt are all equal,
    # so each prompt runs once and its continuation is printed num_samples times
    rows = [prompt for prompt in prompts for _ in range(1 if greedy else args.num_samples)]
    copies = args.num_samples if greedy else 1
    if len(rows) == 1 and not args.json:
        ids = iter_generate(rows[0], params, hparams["n_head"], args.n_tokens, seed=args.seed, **options)
        print_timed(ids, tokenizer, stream=not args.no_stream, n_tokens=args.n_tokens, n_prompt=len(rows[0]),
                    copies=copies)
    else:
        sample_text = json_sample(texts, tokenizer, args, copies) if args.json else plain_sample(tokenizer)
        print_batches(rows, params, hparams["n_head"], args, options, copies, sample_text)
    return 0


def plain_sample(tokenizer):  # -> sample_text(row, copy, ids) for print_batches: a blank line before all but the first
    return lambda row, copy, ids: ("\n" if row or copy else "") + tokenizer.decode(ids) + "\n"


def json_sample(texts, tokenizer, args, copies):  # -> sample_text(row, copy, ids): one line holding JSON_HELP's object
    def sample_text(row, copy, ids):
        prompt, sample = divmod(row, args.num_samples // copies)  # greedy: one row per prompt, copies are its samples
        return json.dumps({  # ASCII with \u escapes: the line reads back exactly whatever stdout's encoding
            "prompt_index": prompt,
            "sample_index": sample * copies + copy,
            "seed": None if args.temperature == 0 else args.seed + row,
            "prompt": texts[prompt],
            "text": tokenizer.decode(ids),
            "token_ids": ids,
            "finish_reason": "length" if len(ids) == args.n_tokens else "stop",
        }) + "\n"

    return sample_text


def print_batches(rows, params, n_head, args, options, copies, sample_text):  # -> None; prints every row in order
    start, n_new, n_printed = time.perf_counter(), 0, 0
    try:
        for first in range(0, len(rows), args.batch_size):
            batch = rows[first : first + args.batch_size]
            seed = None if args.seed is None else args.seed + first
            done = {}  # rows of this batch finished but waiting for an earlier one, so the output stays in order
            for row, ids in iter_batch(batch, params, n_head, args.n_tokens, seed=seed, **options):
                done[row] = ids
                while n_printed - first in done:
                    ids = done.pop(n_printed - first)
                    n_new += len(ids)
                    for copy in range(copies):
                        write_stdout(sample_text(n_printed, copy, ids))
                    log_sample(n_printed, len(rows), copies, len(ids), args)
                    n_printed += 1
    except KeyboardInterrupt:
        raise Interrupted(f"stopped after {plural(n_printed * copies, 'complete continuation')} of "
                          f"{len(rows) * copies}, printed above") from None
    seconds = time.perf_counter() - start
    log(f"generated {plural(n_new, 'token')} in {plural(len(rows), 'row')} in {seconds:.2f} s "
        f"({n_new / seconds:.1f} tokens/s, batches of up to {args.batch_size})")


def log_sample(row, n_rows, copies, n_ids, args):  # -> None; stderr names a printed continuation and how it ended
    n_samples = 1 if copies > 1 else args.num_samples
    prompt, sample = divmod(row, n_samples)
    parts = [f"prompt {prompt + 1}"] if n_rows > n_samples else []
    if n_samples > 1:
        parts.append(f"sample {sample + 1} of {n_samples}")
    what = ", ".join(parts) or "the continuation"  # one prompt, one sample: only --json prints it this way
    if args.seed is not None and args.temperature > 0:  # greedy ignores the seed
        what += f" (seed {args.seed + row})"
    ending = "stopped at <|endoftext|>" if n_ids < args.n_tokens else "reached --n-tokens"
    log(f"{what}: {plural(n_ids, 'token')}, {ending}" + (f"; printed {copies} times" if copies > 1 else ""))


def note_ignored_options(args, greedy):  # -> None; says on stderr when options cannot change greedy output
    if not greedy:
        return
    options = {"--top-k": args.top_k, "--top-p": args.top_p, "--seed": args.seed}
    given = [flag for flag, value in options.items() if value is not None]
    effects = [f"ignores {', '.join(given)}"] if given else []
    if args.num_samples > 1:
        effects.append(f"gives {args.num_samples} identical samples (each is computed once)")
    if effects:
        log(f"note: greedy decoding (--temperature 0, the default) {' and '.join(effects)}; add e.g. "
            "--temperature 0.8 to sample")


def print_sample(ids, tokenizer, stream):  # -> list of the ids printed; stdout gets their text and a newline
    decoder = tokenizer.stream_decoder()
    held, printed, ended = [], [], False  # held: text not yet written, all of it with --no-stream
    try:
        for piece in decoder.pieces(recorded(ids, printed)):
            if stream:
                write_stdout(piece)
            else:
                held.append(piece)
        ended = True
    finally:  # even on Ctrl-C or an error: what was generated is printed, and a cut character shows as U+FFFD
        if printed or ended:  # but a failure before the first id leaves stdout empty
            write_stdout("".join(held) + decoder.finish() + "\n")
    return printed


def recorded(ids, into):  # -> iterator of ids, each appended to the list into as it passes
    for token_id in ids:
        into.append(token_id)
        yield token_id


def print_timed(ids, tokenizer, stream, n_tokens, n_prompt, copies=1):  # -> None; a sample, then its speed on stderr
    start = time.perf_counter()
    try:
        printed = print_sample(ids, tokenizer, stream)
    except KeyboardInterrupt:
        raise Interrupted("stopped by Ctrl-C; the text generated so far is printed above") from None
    seconds = time.perf_counter() - start
    ending = " (stopped at <|endoftext|>)" if len(printed) < n_tokens else ""
    log(f"generated {plural(len(printed), 'token')}{ending} in {seconds:.2f} s ({len(printed) / seconds:.1f} tokens/s) "
        f"after a {n_prompt}-token prompt")
    for _ in range(copies - 1):  # greedy: every further sample is the same text
        write_stdout("\n" + tokenizer.decode(printed) + "\n")


if __name__ == "__main__":
    main()
