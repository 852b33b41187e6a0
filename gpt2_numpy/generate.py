"""Text generation: the decode loop (prompt once, then one token per step with the KV cache) and the command line.

    python -m gpt2_numpy.generate "Alan Turing theorized that computers would one day become" --n-tokens 40

stdout carries only the generated continuation, streamed token by token; everything else goes to stderr.
"""
import argparse
import functools
import numbers
import sys
import time

import numpy as np

from gpt2_numpy.cli import add_model_args, load_model
from gpt2_numpy.errors import ArgumentParser, UsageError, log, run_cli
from gpt2_numpy.model import check_inputs, gpt2_cached, new_cache
from gpt2_numpy.sampling import check_sampling_args, next_token
from gpt2_numpy.tokenizer import EOT_ID

# --- The decode loop ---


def generate(inputs, params, n_head, n_tokens_to_generate, **options):  # -> list of new ids
    """All of iter_generate's ids as one list: the continuation only, without the prompt or <|endoftext|>."""
    return list(iter_generate(inputs, params, n_head, n_tokens_to_generate, **options))


def iter_generate(
    inputs, params, n_head, n_tokens_to_generate, *, temperature=0.0, top_k=None, top_p=None, seed=None,
    stop_at_eos=True,
):  # -> iterator of new ids, for streaming
    """Yields up to n_tokens_to_generate new ids, one per step. Greedy when temperature is 0 (the default);
    otherwise sampled (see sampling.py) with numpy.random.default_rng(seed). With stop_at_eos, generation ends at
    <|endoftext|> (id 50256), which is not yielded. The arguments are checked here, before the first id is asked for:
    ValueError for bad token ids, UsageError for everything else."""
    n_ctx, n_vocab = params["wpe"].shape[0], params["wte"].shape[0]
    inputs = check_inputs(inputs, n_vocab, n_ctx)
    check_room(len(inputs), n_tokens_to_generate, n_ctx)
    check_sampling_args(temperature, top_k, top_p)
    choose = functools.partial(
        next_token, rng=np.random.default_rng(seed), temperature=temperature, top_k=top_k, top_p=top_p
    )
    return decode_loop(inputs, params, n_head, n_tokens_to_generate, choose, EOT_ID if stop_at_eos else None)


def decode_loop(inputs, params, n_head, n_tokens, choose, stop_id):  # -> iterator of new ids
    cache = new_cache(params["wpe"], params["blocks"], n_head)
    new_ids = inputs  # the whole prompt on the first step, then only the token just chosen
    for _ in range(n_tokens):
        logits, cache = gpt2_cached(new_ids, cache, **params, n_head=n_head, last_only=True)  # [1, n_vocab]
        next_id = choose(logits[0])
        if next_id == stop_id:
            return
        yield next_id
        new_ids = [next_id]


def check_room(n_prompt, n_tokens, n_ctx):  # -> None, or UsageError when the prompt plus new tokens overflow n_ctx
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, numbers.Integral) or n_tokens < 1:
        raise UsageError(f"the number of tokens to generate must be a whole number >= 1, got {n_tokens!r}")
    if n_prompt + n_tokens > n_ctx:
        fix = f"generate at most {n_ctx - n_prompt} tokens" if n_prompt < n_ctx else f"cut it to under {n_ctx} tokens"
        raise UsageError(
            f"the prompt's {n_prompt} tokens plus {n_tokens} new tokens make {n_prompt + n_tokens}, more than the "
            f"model's context of {n_ctx} tokens: shorten the prompt or {fix}"
        )


# --- The command line ---


def whole_number(minimum):  # -> an argparse type accepting integers >= minimum
    def parse(text):
        value = int(text)  # argparse turns the ValueError into "invalid whole number value: 'x'"
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = "whole number"
    return parse


def parse_args(argv):  # -> argparse.Namespace, checked
    parser = ArgumentParser(
        prog="gpt2-numpy",
        description="Continue a prompt with GPT-2 (pure NumPy). stdout gets only the continuation; "
        "progress and statistics go to stderr.",
    )
    parser.add_argument("prompt", metavar="PROMPT", help='text to continue; "-" reads stdin; "" starts from scratch')
    parser.add_argument("--n-tokens", type=whole_number(1), default=40, metavar="N", help="tokens to generate (40)")
    add_model_args(parser)
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0: greedy (default); > 0 samples")
    parser.add_argument("--top-k", type=whole_number(1), metavar="K", help="sample from the K most likely tokens only")
    parser.add_argument("--top-p", type=float, metavar="P", help="sample from the fewest tokens holding probability P")
    parser.add_argument("--seed", type=whole_number(0), metavar="S", help="seed of sample 1; sample i uses S + i - 1")
    parser.add_argument("--num-samples", type=whole_number(1), default=1, metavar="N", help="samples to print (1)")
    parser.add_argument("--ignore-eos", action="store_true", help="keep going past <|endoftext|>")
    parser.add_argument("--no-stream", action="store_true", help="print each sample when it is complete")
    args = parser.parse_args(argv)
    check_sampling_args(args.temperature, args.top_k, args.top_p)
    return args


def main(argv=None):  # console script entry point: errors become one line on stderr and an exit status
    sys.stdout.reconfigure(errors="replace")  # a terminal that cannot show a character gets "?", not a traceback
    run_cli(run, argv)


def run(argv=None):  # -> exit status
    args = parse_args(argv)
    prompt = read_prompt(args.prompt)
    note_ignored_options(args)
    hparams, params, tokenizer = load_model(args)
    inputs = prompt_ids(tokenizer, prompt, hparams["n_vocab"])
    options = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, stop_at_eos=not args.ignore_eos)
    for index in range(args.num_samples):
        seed = None if args.seed is None else args.seed + index  # distinct samples, each reproducible on its own
        ids = iter_generate(inputs, params, hparams["n_head"], args.n_tokens, seed=seed, **options)
        if index:
            write_stdout("\n")  # a blank line between samples (each one ends with a newline)
        if args.num_samples > 1:
            log(f"sample {index + 1} of {args.num_samples}" + ("" if seed is None else f" (seed {seed})"))
        print_timed(ids, tokenizer, stream=not args.no_stream, n_prompt=len(inputs))
    return 0


def read_prompt(argument):  # -> prompt text; "-" reads stdin
    if argument != "-":
        text = argument
    else:
        try:
            text = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError as error:
            raise UsageError(f"stdin is not UTF-8 text (byte {error.start}): convert the prompt to UTF-8") from None
    try:
        text.encode("utf-8")  # undecodable command-line bytes arrive as lone surrogates
    except UnicodeEncodeError:
        raise UsageError("the prompt is not valid UTF-8 text: pass it in UTF-8, or through stdin with '-'") from None
    return text


def note_ignored_options(args):  # -> None; says on stderr when sampling options cannot change greedy output
    if args.temperature > 0:
        return
    options = {"--top-k": args.top_k, "--top-p": args.top_p, "--seed": args.seed}
    given = [flag for flag, value in options.items() if value is not None]
    if given or args.num_samples > 1:
        effect = f"ignores {', '.join(given)}" if given else "makes every sample the same"
        log(f"note: greedy decoding (--temperature 0, the default) {effect}; add e.g. --temperature 0.8 to sample")


def prompt_ids(tokenizer, prompt, n_vocab):  # -> ids to feed the model, all < n_vocab
    # "<|endoftext|>" typed in a prompt is the document separator; an empty prompt starts from it, as GPT-2 was trained
    ids = tokenizer.encode(prompt, allowed_special="all") or [EOT_ID]
    outside = [token_id for token_id in ids if token_id >= n_vocab]
    if outside:
        raise UsageError(
            f"the prompt's token {outside[0]} ({tokenizer.decode(outside[:1])!r}) is outside this model's vocabulary "
            f"of {n_vocab} tokens: use a model with GPT-2's full vocabulary, or a prompt of other words"
        )
    return ids


def print_sample(ids, tokenizer, stream):  # -> number of ids; stdout gets their text and a newline, even on Ctrl-C
    decoder = tokenizer.stream_decoder()
    held = []  # text not yet written: all of it with --no-stream
    n_ids = 0
    try:
        for n_ids, token_id in enumerate(ids, start=1):
            piece = decoder.add(token_id)
            if stream:
                write_stdout(piece)
            else:
                held.append(piece)
    finally:
        write_stdout("".join(held) + decoder.finish() + "\n")
    return n_ids


def print_timed(ids, tokenizer, stream, n_prompt):  # -> None; prints a sample, then its speed on stderr
    start = time.perf_counter()
    n_ids = print_sample(ids, tokenizer, stream)
    seconds = time.perf_counter() - start
    speed = f"{n_ids / seconds:.1f} tokens/s"
    log(f"generated {n_ids} tokens in {seconds:.2f} s ({speed}) after a {n_prompt}-token prompt")


def write_stdout(text):
    sys.stdout.write(text)
    sys.stdout.flush()  # each token appears as soon as it is chosen, even through a pipe


if __name__ == "__main__":
    main()
