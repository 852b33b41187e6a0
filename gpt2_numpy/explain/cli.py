"""The command line: python -m gpt2_numpy.explain PROMPT [--layer L] [--head H] [--plot FILE] [--lens] [--html FILE].

stdout gets the walkthrough (the prompt's tokens, the shape of every step, one head's attention step by step, the
next-token prediction) or, with --lens, the logit lens's table; --plot and --html write a picture and a page."""
import functools
from pathlib import Path

from gpt2_numpy.commands.common import add_model_args, load_model, prompt_ids, read_prompt, write_stdout
from gpt2_numpy.commands.common import ArgumentParser, open_stdout, run_cli
from gpt2_numpy.console import log, plural
from gpt2_numpy.errors import UsageError
from gpt2_numpy.explain.lens import lens_table
from gpt2_numpy.explain.page import check_page_file, page_html, write_page
from gpt2_numpy.explain.plot import PLOT_INSTALL, attention_figure, check_plot_file, save_figure
from gpt2_numpy.explain.stepwise import check_index, report, token_label, walkthrough


def head_number(text):  # -> int, or "all"; argparse reports a ValueError as "invalid head number or 'all' value"
    return text if text == "all" else int(text)


head_number.__name__ = "head number or 'all'"


def parse_args(argv):  # -> argparse.Namespace
    parser = ArgumentParser(
        prog="python -m gpt2_numpy.explain",
        description="Show GPT-2 attention at work on a prompt: its tokens, the shape of every step of the forward "
        "pass, one head's attention step by step, and the next-token prediction; or the logit lens (--lens), a "
        "heatmap (--plot), an interactive page of every head (--html).",
        dash_hint='a prompt that begins with \'-\' goes last, after \'--\': python -m gpt2_numpy.explain -- "-x"',
    )
    parser.add_argument("prompt", metavar="PROMPT",
                        help='the text to explain; "-" reads stdin; "" starts from <|endoftext|>; a prompt beginning '
                        "with '-' goes last, after --")
    parser.add_argument("--layer", type=int, default=0, metavar="L", help="the layer to show, from 0 (0)")
    parser.add_argument("--head", type=head_number, default=0, metavar="H",
                        help="the head to show, from 0 (0); 'all' plots every head of the layer (and prints head 0)")
    parser.add_argument("--plot", type=Path, metavar="FILE",
                        help=f"draw the attention weights as a heatmap into FILE (.png or .svg); needs matplotlib: "
                        f"{PLOT_INSTALL}")
    parser.add_argument("--lens", action="store_true",
                        help="print the logit lens instead of the walkthrough: the top next token after each layer, "
                        "at each position")
    parser.add_argument("--html", type=Path, metavar="FILE",
                        help="write one self-contained page (.html) to explore every head's attention and the logit "
                        "lens in a browser, offline")
    add_model_args(parser)
    return parser.parse_args(argv)


def run(argv=None):  # -> exit status
    args = parse_args(argv)
    open_stdout()  # a closed stdout is refused before the model loads
    text = read_prompt(args.prompt)
    # the output files first: a typo in a file name should not cost a model load
    if args.plot is not None:
        check_plot_file(args.plot)
    if args.html is not None:
        check_page_file(args.html)
    hparams, params, tokenizer = load_model(args)
    n_head = hparams["n_head"]
    check_index(args.layer, hparams["n_layer"], "--layer", "layer")
    heads = list(range(n_head)) if args.head == "all" else [args.head]
    check_index(heads[-1], n_head, "--head", "head", " per layer")
    ids = prompt_ids(tokenizer, text, hparams["n_vocab"])
    if len(ids) > hparams["n_ctx"]:
        raise UsageError(f"the prompt's {plural(len(ids), 'token')} exceed the model's context of {hparams['n_ctx']} "
                         "tokens: shorten it")
    if args.head == "all" and args.plot is None:
        log("note: --head all chooses what --plot draws; without --plot, head 0 is shown")
    label = functools.partial(token_label, tokenizer)
    if args.lens:
        write_stdout(lens_table(ids, params, n_head, label))
    steps = None
    if not args.lens or args.plot is not None:
        steps = walkthrough(ids, params, n_head, args.layer)
    if not args.lens:
        write_stdout(report(text, ids, label, steps, hparams, args.layer, heads[0]))
    if args.plot is not None:
        title = f"GPT-2 attention weights, layer {args.layer}" + (f", head {heads[0]}" if len(heads) == 1 else "")
        save_figure(attention_figure(steps["attn.weights"][heads], heads, list(map(label, ids)), title), args.plot)
        log(f"wrote {args.plot}")
    if args.html is not None:
        title = f"GPT-2 {args.model_size} on {plural(len(ids), 'token')}"
        write_page(args.html, page_html(ids, params, n_head, functools.partial(token_text, tokenizer), title))
        log(f"wrote {args.html} ({args.html.stat().st_size / 1e6:.1f} MB)")
    return 0


def token_text(tokenizer, token_id):  # -> a token's text; a piece of a character shows its bytes as \xe2
    return tokenizer.token_bytes(token_id).decode("utf-8", errors="backslashreplace")


def main(argv=None):  # entry point: errors become one line on stderr and an exit status
    run_cli(run, argv)
