"""Text generation: the decode loop (prompt once, then one token per step with the KV cache), for one sequence or a
batch of them, and the command line.

    python -m gpt2_numpy.generate "Alan Turing theorized that computers would one day become" --n-tokens 40
    python -m gpt2_numpy.generate "The cat" "The dog" --temperature 0.8 --num-samples 4 --seed 1
    python -m gpt2_numpy.generate "The cat" "The dog" --temperature 0.8 --num-samples 4 --json > samples.jsonl

stdout carries only the generated continuations (a single one streamed token by token), or with --json one JSON object
per line for each sample (see JSON_HELP); everything else goes to stderr.
"""
import functools
import json
import numbers
import secrets
import time

import numpy as np

from gpt2_numpy.cli import add_model_args, load_model, prompt_ids, read_prompt, whole_number, write_stdout
from gpt2_numpy.errors import (
    ArgumentParser, Interrupted, NonFiniteError, OutOfMemory, UsageError, log, open_stdout, plural, run_cli,
)
from gpt2_numpy.fast import check_inputs, gpt2_cached, new_cache
from gpt2_numpy.models import OFFICIAL_HPARAMS
from gpt2_numpy.sampling import check_sampling_args, next_token
from gpt2_numpy.tokenizer import EOT_ID

BATCH_SIZE = 8  # rows per pass by default: with 2 to 8 rows a step costs about 3x one row's, so 8 rows pay best
JSON_HELP = (
    "print each sample, once it ends, as one JSON object on its own line (JSON Lines; nothing is streamed), with: "
    "prompt_index and sample_index (counted from 0: which PROMPT, and which of its --num-samples); seed (the one this "
    "sample drew with: that PROMPT alone with --seed SEED gives it again; null when greedy); prompt (the PROMPT's "
    "text); text (the continuation, without the prompt); token_ids (the continuation's ids, without "
    "<|endoftext|>); finish_reason (\"stop\": the model chose <|endoftext|>; \"length\": --n-tokens reached)"
)

# --- The decode loop ---


def generate(inputs, params, n_head, n_tokens_to_generate, **options):  # -> list of new ids
    """All of iter_generate's ids as one list: the continuation only, without the prompt or <|endoftext|>."""
    return list(iter_generate(inputs, params, n_head, n_tokens_to_generate, **options))


def iter_generate(
    inputs, params, n_head, n_tokens_to_generate, *, temperature=0.0, top_k=None, top_p=None, seed=None,
    stop_at_eos=True, eos_id=EOT_ID,
):  # -> iterator of new ids, for streaming
    """Yields up to n_tokens_to_generate new ids, one per step. Greedy when temperature is 0 (the default);
    otherwise sampled (see sampling.py) with numpy.random.default_rng(seed). With stop_at_eos, generation ends at
    <|endoftext|> (eos_id: GPT-2's 50256, or a trained tokenizer's eot_id),
    which is not yielded. The arguments are checked here, before the first id is asked for:
    ValueError for bad token ids, UsageError for everything else."""
    inputs = check_prompt(inputs, n_tokens_to_generate, params)
    check_sampling_args(temperature, top_k, top_p, seed)
    choose = sampler(temperature, top_k, top_p, seed)
    return decode_loop(inputs, params, n_head, n_tokens_to_generate, choose, eos_id if stop_at_eos else None)


def decode_loop(inputs, params, n_head, n_tokens, choose, stop_id):  # -> iterator of new ids
    cache = cache_for(params, n_head, n_slots=len(inputs) + n_tokens - 1)  # the last id chosen is never fed back
    new_ids = inputs  # the whole prompt on the first step, then only the token just chosen
    for _ in range(n_tokens):
        logits, cache = gpt2_cached(new_ids, cache, **params, n_head=n_head, last_only=True)  # [1, n_vocab]
        check_finite(logits)
        next_id = choose(logits[0])
        if next_id == stop_id:
            return
        yield next_id
        new_ids = [next_id]


def generate_batch(
    prompts, params, n_head, n_tokens_to_generate, *, temperature=0.0, top_k=None, top_p=None, seed=None,
    stop_at_eos=True, eos_id=EOT_ID,
):  # -> list of new-id lists, one per prompt
    """Continue every prompt (token-id lists of any lengths) in one batch; each row gets exactly the ids `generate`
    would give it alone, with seed + i for row i (each row has its own numpy.random.default_rng). A row that reaches
    <|endoftext|> stops there (with stop_at_eos) while the others go on."""
    continuations = [None] * len(prompts)
    for row, ids in iter_batch(prompts, params, n_head, n_tokens_to_generate, temperature=temperature, top_k=top_k,
                               top_p=top_p, seed=seed, stop_at_eos=stop_at_eos, eos_id=eos_id):
        continuations[row] = ids
    return continuations


def iter_batch(
    prompts, params, n_head, n_tokens_to_generate, *, temperature=0.0, top_k=None, top_p=None, seed=None,
    stop_at_eos=True, eos_id=EOT_ID,
):  # -> iterator of (row, new ids), as each row finishes
    """generate_batch, yielding each row's continuation as soon as it is complete. Arguments are checked up front:
    ValueError for bad token ids, UsageError (naming the prompt by index) for everything else."""
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__") or len(prompts) == 0:
        raise UsageError(f"prompts must be a non-empty list of token-id lists, got {type(prompts).__name__}")
    prompts = [check_prompt(ids, n_tokens_to_generate, params, f"prompt {row}") for row, ids in enumerate(prompts)]
    check_sampling_args(temperature, top_k, top_p, seed)
    choosers = [sampler(temperature, top_k, top_p, None if seed is None else seed + row) for row in range(len(prompts))]
    return batch_decode_loop(prompts, params, n_head, n_tokens_to_generate, choosers, eos_id if stop_at_eos else None)


def batch_decode_loop(prompts, params, n_head, n_tokens, choosers, stop_id):  # -> iterator of (row, new ids)
    width = max(len(prompt) for prompt in prompts)
    pad = np.array([width - len(prompt) for prompt in prompts])
    step_ids = np.array([[0] * n_pad + list(prompt) for n_pad, prompt in zip(pad, prompts)])  # [n_rows, width]
    # slots for the prompt and every chosen token but the last, which is never fed back
    cache = cache_for(params, n_head, n_slots=width + n_tokens - 1, pad=pad)
    rows = np.arange(len(prompts))  # the original index of each row still running
    new_ids = [[] for _ in prompts]
    for step in range(n_tokens):
        logits, cache = gpt2_cached(step_ids, cache, **params, n_head=n_head, last_only=True)  # [n_running, 1, n_vocab]
        check_finite(logits)
        # each row draws from its own generator, as it would alone (the model step above is one call for all rows)
        chosen = [choosers[row](row_logits[0]) for row, row_logits in zip(rows, logits)]
        running = []
        for i, (row, next_id) in enumerate(zip(rows, chosen)):
            if next_id != stop_id:
                new_ids[row].append(next_id)
            if next_id == stop_id or step == n_tokens - 1:
                yield int(row), new_ids[row]
            else:
                running.append(i)
        if len(running) < len(rows) and running:  # finished rows leave the batch and stop costing compute
            cache, rows = cache.keep(running), rows[running]
        step_ids = np.array(chosen)[running, None]  # [n_running, 1]
        if not running:
            return


def cache_for(params, n_head, n_slots, pad=None):  # -> new_cache's KVCache; OutOfMemory naming what to lower
    try:
        return new_cache(params["wpe"], params["blocks"], n_head, pad=pad, n_slots=n_slots)
    except MemoryError:
        n_layer, n_embd = len(params["blocks"]), params["wpe"].shape[1]
        n_rows = 1 if pad is None else len(pad)
        n_bytes = 2 * n_layer * n_rows * n_slots * n_embd * 4  # keys and values, float32
        fixes = ["compute fewer rows at once (--batch-size)"] if n_rows > 1 else []
        raise OutOfMemory(
            f"the KV cache of {plural(n_rows, 'row')} x {n_slots} positions needs {n_bytes / 2**30:.1f} GiB, more than "
            f"this machine could allocate: {' or '.join([*fixes, 'generate fewer tokens (--n-tokens)'])}") from None


def check_finite(logits):  # [..., n_vocab] -> None, or NonFiniteError when any logit is NaN or infinite
    # NaN logits would make sampling fail with an IndexError and greedy pick id 0 every step. The check costs 10 to
    # 50 us a step for 124M's last row (50257 logits), under 0.1% of a decode step.
    if not np.isfinite(logits).all():
        raise NonFiniteError


def sampler(temperature, top_k, top_p, seed):  # -> function choosing an id from logits [n_vocab], with its own rng
    return functools.partial(
        next_token, rng=np.random.default_rng(seed), temperature=temperature, top_k=top_k, top_p=top_p
    )


def check_prompt(inputs, n_tokens, params, name="the prompt"):  # -> int64 [n_prompt]; ValueError or UsageError
    n_ctx, n_vocab = params["wpe"].shape[0], params["wte"].shape[0]
    ids = np.asarray(inputs)
    if ids.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of token ids, got shape {ids.shape}")
    check_room(len(ids), n_tokens, n_ctx, name)  # first: an overlong prompt gets the message that says how to fix it
    try:
        return check_inputs(ids, n_vocab, n_ctx)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def check_room(n_prompt, n_tokens, n_ctx, name="the prompt"):  # -> None, or UsageError when it overflows n_ctx
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, numbers.Integral) or n_tokens < 1:
        raise UsageError(f"the number of tokens to generate must be a whole number >= 1, got {n_tokens!r}")
    if n_prompt + n_tokens > n_ctx:
        fixes = [f"shorten {name} to at most {plural(n_ctx - n_tokens, 'token')}"] if n_tokens < n_ctx else []
        if n_prompt < n_ctx:
            fixes.append(f"generate at most {plural(n_ctx - n_prompt, 'token')}")
        raise UsageError(
            f"{name}'s {plural(n_prompt, 'token')} plus {plural(n_tokens, 'new token')} make {n_prompt + n_tokens}, "
            f"more than the model's context of {n_ctx} tokens: {' or '.join(fixes)}"
        )


# --- The command line ---


def parse_args(argv):  # -> argparse.Namespace, checked
    parser = ArgumentParser(
        prog="gpt2-numpy",
        description="Continue prompts with GPT-2 (pure NumPy). stdout gets only the continuations; "
        "progress and statistics go to stderr.",
        dash_hint='a prompt that begins with \'-\' goes last, after \'--\': gpt2-numpy --n-tokens 5 -- "-x"',
    )
    parser.add_argument("prompts", nargs="+", metavar="PROMPT",
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
                        help=f"continuations computed together ({BATCH_SIZE}); each row of the batch holds a KV cache "
                        "of 72 KiB per token of context for 124M (n_layer x 2 x n_embd float32)")
    parser.add_argument("--ignore-eos", action="store_true", help="keep going past <|endoftext|>")
    parser.add_argument("--no-stream", action="store_true", help="print a single continuation only when complete")
    parser.add_argument("--json", action="store_true", help=JSON_HELP)
    args = parser.parse_args(argv)
    if args.prompts.count("-") > 1:
        raise UsageError('"-" (read the prompt from stdin) may be given only once')
    check_sampling_args(args.temperature, args.top_k, args.top_p)
    # before any download: every official GPT-2 has 1024 positions, and a prompt takes at least one
    check_room(1, args.n_tokens, OFFICIAL_HPARAMS[args.model_size]["n_ctx"])
    return args


def main(argv=None):  # console script entry point: errors become one line on stderr and an exit status
    with np.errstate(invalid="ignore", over="ignore"):  # NaN or inf from the weights: NonFiniteError says it once
        run_cli(run, argv)


def run(argv=None):  # -> exit status
    args = parse_args(argv)
    open_stdout()  # a closed stdout is refused before the model loads
    texts = [read_prompt(prompt) for prompt in args.prompts]
    greedy = args.temperature == 0
    note_ignored_options(args, greedy)
    if not greedy and args.seed is None:  # drawn here, not inside numpy, so that --json can record every sample's seed
        args.seed = secrets.randbits(32)
    hparams, params, tokenizer = load_model(args)
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
        for token_id in ids:
            printed.append(token_id)
            piece = decoder.add(token_id)
            if stream:
                write_stdout(piece)
            else:
                held.append(piece)
        ended = True
    finally:  # even on Ctrl-C or an error: what was generated is printed, and a cut character shows as U+FFFD
        if printed or ended:  # but a failure before the first id leaves stdout empty
            write_stdout("".join(held) + decoder.finish() + "\n")
    return printed


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
