"""`gpt2-numpy explain PROMPT [--layer L] [--head H] [--lens] [--heads] [--ablate L.H ... [--ablation zero|mean
--mean-over FILE]] [--attribute A B] [--patch CORRUPT --answer A B] [--attribution-patching CORRUPT --answer A B
[--edges] [--ig-steps N]] [--json] [--plot FILE] [--html FILE] [--walkthrough]`: look inside GPT-2 on a prompt
(gpt2_numpy/interpret/ computes what it shows).

stdout gets what is asked for: the logit lens's table (--lens), the head scores (--heads), an ablation (--ablate), a
direct logit attribution (--attribute), activation patching (--patch), attribution patching
(--attribution-patching), an SAE's latents (--sae: each position's strongest, the effect of --sae-ablate or --steer, or
with --attribute each latent's share of the logit difference), each one JSON object with --json, and the
walkthrough (the prompt's tokens, the shape of every step, one head's attention step by step, the
next-token prediction). The walkthrough prints when nothing else is asked for, or with --walkthrough; a command that
writes a file (--plot, --html) otherwise prints only, on stderr, where the file went. Long stages show a progress bar
on stderr.

The outputs of stdout are MODES, a table: a mode named NAME is asked for by args.NAME (its flag, --NAME, added in
parse_args), computes a result from the Request (the arguments, the model, the prompt's ids), and prints it as a table,
or with --json as one JSON object (interpret/present.py formats both). A new output is one add_argument and one
entry of MODES."""
import argparse
import functools
import json
import math
import os
import sys
from typing import Callable, NamedTuple, Optional

from gpt2_numpy.catalog import OFFICIAL_HPARAMS
from gpt2_numpy.commands.common import (
    HTML_SUFFIXES, ArgumentParser, add_model_args, check_output_file, model_from_args, model_size, open_stdout,
    path_argument, read_data, read_prompt, repeated, run_model_cli, save_figure, whole_number, write_atomically,
    write_stdout,
)
from gpt2_numpy.console import log, plural, progress_bar
from gpt2_numpy.errors import NothingToRecover, UsageError
from gpt2_numpy.loading import is_ready, prompt_ids
from gpt2_numpy.sae.attribution import latent_gradients
from gpt2_numpy.interpret.ablation import ABLATIONS, REFERENCE_TOKENS, ablation, reference_windows
from gpt2_numpy.interpret.attribution import attribution
from gpt2_numpy.interpret.attribution_patching import (
    attribution_patching, attribution_patching_json, attribution_patching_table, faithfulness_of_strongest,
    patching_effects,
)
from gpt2_numpy.interpret.gradients import logit_difference
from gpt2_numpy.interpret.heads import head_scores, repeat_length, repeated_tokens, repetition_problem
from gpt2_numpy.interpret.lens import LENS_COLUMNS, first_shown, top_tokens
from gpt2_numpy.interpret.page import page_html
from gpt2_numpy.interpret.patching import patching
from gpt2_numpy.interpret.plot import PLOT_SUFFIXES, attention_figure, patching_figure, plot_install
from gpt2_numpy.interpret.present import (
    ablation_json, ablation_table, attribution_json, attribution_table, heads_json, heads_table, lens_json, lens_table,
    patching_json, patching_table, small_gap_caution,
)
from gpt2_numpy.interpret.stepwise import check_index, report, token_label, walkthrough
from gpt2_numpy.sae.activations import sae_for_model
from gpt2_numpy.sae.features import check_steers, checked_latents, explain_latents
from gpt2_numpy.sae.present import latents_json, latents_table

HEADS_SEED = 0  # --heads's random tokens: the same table for the same model, unless --seed asks for others
PROGRESS_DELAY = 2  # seconds a stage runs before its progress bar appears: a quick run prints none


def head_number(text):  # -> int, or "all"; argparse reports a ValueError as "invalid head number or 'all' value"
    return text if text == "all" else int(text)


head_number.__name__ = "head number or 'all'"


def layer_head(text):  # -> (layer, head) from "L.H"; argparse turns the error into one line
    layer, dot, head = text.partition(".")
    if not (dot and layer.isdigit() and head.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not L.H, a layer and a head numbered from 0, such as 0.3")
    return int(layer), int(head)


def steer_pair(text):  # -> (latent, scale) from "F:SCALE"; argparse turns the error into one line
    latent, colon, scale = text.partition(":")
    try:
        pair = int(latent), float(scale)
    except ValueError:
        pair = None
    # int() and float() read "1_0" as 10: a latent id and a scale are written without underscores
    if not colon or pair is None or "_" in text or pair[0] < 0 or not math.isfinite(pair[1]):
        raise argparse.ArgumentTypeError(f"{text!r} is not F:SCALE (a latent id and a finite number, e.g. 12:4.0)")
    return pair


# the options whose words are texts (answers, a prompt), with their names: as getopt does, those words are taken as
# given even when they begin with '-' ("--attribute -- -"), which argparse alone would read as options
TEXT_OPTIONS = {"--attribute": ("A", "B"), "--answer": ("A", "B"), "--patch": ("CORRUPT",),
                "--attribution-patching": ("CORRUPT",)}
TEXT_MARK = "\0"  # put before each such word so that argparse takes it as a value; no command-line word holds NUL


def mark_texts(argv, options):  # -> argv with the words of TEXT_OPTIONS marked; UsageError when one has too few
    """options: the parser's own option strings, which end a text option's words, alone or with "=" ("--attribute
    ' the' --json" is one answer short, not an answer "--json"). "--attribute=A B" is "--attribute A B"."""
    words, start = list(argv), 0
    while start < len(words) and words[start] != "--":  # after "--", every word is the prompt
        flag, equals, attached = words[start].partition("=")
        names = TEXT_OPTIONS.get(flag)
        if names is None:
            start += 1
            continue
        texts, end = [attached] * bool(equals), start + 1
        while len(texts) < len(names) and end < len(words) and words[end].partition("=")[0] not in options:
            texts, end = texts + [words[end]], end + 1
        if len(texts) < len(names):
            found = f"{len(texts)}" + (f" before {words[end]}" if end < len(words) else "")
            raise UsageError(f"{flag} {' '.join(names)} needs {plural(len(names), 'word')} after it, got {found}; a "
                             f"word that begins with '-' counts: {' '.join([flag, '-x', '+x'][:1 + len(names)])}")
        words[start:end] = [flag, *(TEXT_MARK + text for text in texts)]
        start += 1 + len(names)
    return words


def text_word(word):  # -> a word of TEXT_OPTIONS as the user typed it
    return word.removeprefix(TEXT_MARK)


def parse_args(argv):  # -> argparse.Namespace, checked
    parser = ArgumentParser(
        prog="gpt2-numpy explain",
        description="Show GPT-2 attention at work on a prompt: its tokens, the shape of every step of the forward "
        "pass, one head's attention step by step, and the next-token prediction (the walkthrough); or the logit lens "
        "(--lens), a score per head for five attention patterns (--heads), a heatmap (--plot), an interactive page "
        "of every head (--html).",
        dash_hint='a prompt that begins with \'-\' goes last, after \'--\': gpt2-numpy explain -- "-x"',
    )
    parser.add_argument("prompt", metavar="PROMPT",
                        help='the text to explain; "-" reads stdin; "" starts from <|endoftext|>; a prompt beginning '
                        "with '-' goes last, after --")
    parser.add_argument("--layer", type=int, metavar="L",
                        help="the layer to show, from 0 (0); with --heads, the only layer whose heads are listed (all)")
    parser.add_argument("--head", type=head_number, metavar="H",
                        help="the head to show, from 0 (0); 'all' plots every head of the layer (and prints head 0)")
    parser.add_argument("--walkthrough", action="store_true",
                        help="print the walkthrough also when another output is asked for (--lens, --heads, --plot, "
                        "--html); it prints by itself only when none is")
    parser.add_argument("--plot", type=path_argument, metavar="FILE",
                        help=f"draw the attention weights as a heatmap into FILE (.png or .svg); with --patch, the "
                        f"recoveries as two heatmaps instead; needs matplotlib: {plot_install()}")
    parser.add_argument("--lens", action="store_true",
                        help="print the logit lens: the top next token after each layer, at each of the last "
                        f"{LENS_COLUMNS} positions (at every position with --json)")
    parser.add_argument("--heads", action="store_true",
                        help="print a score per layer and head for five attention patterns: previous token, first "
                        "token and self on the prompt; duplicate token and induction on <|endoftext|> and random "
                        "tokens fed twice")
    parser.add_argument("--ablate", nargs="+", type=layer_head, metavar="L.H",
                        help="switch off head H of layer L (each one given) at every position, and print the mean "
                        "next-token loss over the prompt and the top 5 next tokens before and after")
    parser.add_argument("--ablation", choices=ABLATIONS,
                        help="with --ablate: set the heads' outputs (attn.z) to zero (the default), or to their mean "
                        "at each position over the text of --mean-over")
    parser.add_argument("--mean-over", type=path_argument, metavar="FILE",
                        help=f"with --ablation mean: the text whose windows, each as long as the model's context "
                        f"(or the whole text), give each position's mean (its first {REFERENCE_TOKENS} tokens at "
                        "most); never the prompt itself, whose later tokens a mean over its positions would let in")
    parser.add_argument("--attribute", nargs=2, type=text_word, metavar=("A", "B"),
                        help="split logit(A) - logit(B) at the last position into what each head, each MLP, the "
                        "embeddings and the biases wrote into the residual stream; with --sae, what each of its "
                        "latents at each position contributes instead (its activation times the difference's "
                        "gradient with respect to it, the SAE spliced in); A and B are texts of one token each, "
                        "taken as given even when they begin with '-'")
    parser.add_argument("--patch", type=text_word, metavar="CORRUPT",
                        help="activation patching: run the CORRUPT prompt (as many tokens as PROMPT) with each head's "
                        "output, and the residual stream at each layer and position, copied in from PROMPT's run; "
                        "print how much of logit(A) - logit(B) (--answer) each recovers; CORRUPT may begin with '-'")
    parser.add_argument("--attribution-patching", type=text_word, metavar="CORRUPT",
                        help="attribution patching (TransformerLens's): score every head, MLP and embedding at each "
                        "position by (PROMPT's activation - CORRUPT's) · the gradient of logit(A) - logit(B) "
                        "(--answer) on CORRUPT's run, from one backward pass; CORRUPT as with --patch")
    parser.add_argument("--edges", action="store_true",
                        help="with --attribution-patching: score every edge too, from a writer (embedding, head, MLP) "
                        "to a later reader (a head's q, k or v input, an MLP's input, the logits) at each position")
    parser.add_argument("--ig-steps", type=whole_number(1), metavar="N",
                        help="with --attribution-patching: EAP-IG, the gradients averaged over N runs whose "
                        "embedding goes from CORRUPT's toward PROMPT's (1: plain attribution patching, the default)")
    parser.add_argument("--answer", nargs=2, type=text_word, metavar=("A", "B"),
                        help="with --patch or --attribution-patching: the two answers, texts of one token each as "
                        "with --attribute, whose logit difference is measured")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of a table: with --heads, the scores and the token ids "
                        "they come from; with --lens, the top next token's id, text and probability after each layer "
                        "at every position; with --ablate, --attribute or --patch, their numbers")
    parser.add_argument("--seed", type=whole_number(0), metavar="S",
                        help=f"with --heads: the seed of the random tokens ({HEADS_SEED})")
    parser.add_argument("--html", type=path_argument, metavar="FILE",
                        help="write one self-contained page (.html) to explore every head's attention, the head "
                        "scores and the logit lens in a browser, offline")
    parser.add_argument("--sae", type=path_argument, metavar="DIR",
                        help="an SAE's folder (SAELens's), or a release of SAELens's by name, RELEASE/ID: print "
                        "each position's strongest latents at its hook")
    parser.add_argument("--sae-ablate", nargs="+", type=whole_number(0), metavar="F",
                        help="with --sae: take these latents out of the activation (x - f_F(x) W_dec[F], the SAE's "
                        "error kept) and print the loss and the next tokens before and after")
    parser.add_argument("--steer", nargs="+", type=steer_pair, metavar="F:SCALE",
                        help="with --sae: add SCALE * W_dec[F] to the activation at every position, and print the "
                        "loss and the next tokens before and after")
    add_model_args(parser)
    args = parser.parse_args(mark_texts(sys.argv[1:] if argv is None else argv, parser._option_string_actions))
    if args.seed is not None and not args.heads:
        raise UsageError("--seed belongs to --heads: add --heads, or drop --seed")
    twice = repeated(args.ablate or [])
    if twice is not None:  # more likely a typo for another head than meant: ablating a head twice is ablating it once
        raise UsageError(f"--ablate names head {'.'.join(map(str, twice))} more than once: give each head once")
    if args.ablation is not None and args.ablate is None:
        raise UsageError("--ablation belongs to --ablate: add --ablate L.H, or drop --ablation")
    if args.ablation == "mean" and args.mean_over is None:
        raise UsageError("--ablation mean needs --mean-over FILE, a text whose mean at each position replaces the "
                         "heads' outputs (a mean over the prompt would let each position see later tokens): add "
                         "--mean-over sample: (a short text that ships with the package), or a long text of your own")
    if args.mean_over is not None and args.ablation != "mean":
        raise UsageError("--mean-over belongs to --ablation mean: add --ablate L.H --ablation mean, or drop "
                         "--mean-over")
    if (args.sae_ablate or args.steer) and args.sae is None:
        raise UsageError(f"{'--sae-ablate' if args.sae_ablate else '--steer'} edits an SAE's latents: add --sae DIR")
    if (args.sae_ablate or args.steer) and args.attribute is not None:
        edit = "--sae-ablate" if args.sae_ablate else "--steer"
        raise UsageError(f"--attribute with --sae scores the SAE's latents, and {edit} edits them: give one of them "
                         "(run explain twice for both)")
    check_attribution_patching(args)
    if args.patch is not None and args.answer is None:
        raise UsageError("--patch needs --answer A B: the two one-token answers whose logit difference it measures")
    if args.answer is not None and args.patch is None and args.attribution_patching is None:
        raise UsageError("--answer belongs to --patch and --attribution-patching: add one, or drop --answer")
    flag, corrupt = corrupt_prompt(args)
    if corrupt == "-" and args.prompt == "-":
        raise UsageError(f'"-" reads stdin once: give the prompt or the {flag} prompt as an argument')
    asked = [flag_of(name) for name in OUTPUTS if asks(args, name)]
    if args.json and not asked:
        raise UsageError(f"--json belongs to {', '.join(map(flag_of, OUTPUTS))}: add one of them, or drop "
                         "--json")
    if args.json and (len(asked) > 1 or args.walkthrough):
        fixes = [f"keep one of {' '.join(asked)}"] * (len(asked) > 1) + ["drop --walkthrough"] * args.walkthrough
        raise UsageError(f"--json prints one JSON object, of one output, and nothing else: {' and '.join(fixes)}, "
                         "or drop --json")
    args.walkthrough = args.walkthrough or not (asked or args.plot or args.html)  # from here on: it prints
    check_layer_and_head(args)
    args.head = 0 if args.head is None else args.head
    args.ablation = args.ablation or "zero"
    args.seed = HEADS_SEED if args.seed is None else args.seed
    return args


def check_attribution_patching(args):  # -> None; UsageError for its flags without it, or with --patch
    if args.attribution_patching is None:
        for flag, given in (("--edges", args.edges), ("--ig-steps", args.ig_steps is not None)):
            if given:
                raise UsageError(f"{flag} belongs to --attribution-patching: add --attribution-patching CORRUPT "
                                 f"--answer A B, or drop {flag}")
        return
    if args.patch is not None:
        raise UsageError("--patch and --attribution-patching take one corrupt prompt each, and explain reads one "
                         "corrupt prompt: give one of them (run explain twice for both)")
    if args.answer is None:
        raise UsageError("--attribution-patching needs --answer A B: the two one-token answers whose logit "
                         "difference it scores")


def corrupt_prompt(args):  # -> (flag, CORRUPT): --patch's or --attribution-patching's; (None, None) for neither
    if args.patch is not None:
        return "--patch", args.patch
    if args.attribution_patching is not None:
        return "--attribution-patching", args.attribution_patching
    return None, None


def check_layer_and_head(args):  # -> None; UsageError for a --layer or --head that no output shows
    attention_plot = args.plot is not None and args.patch is None  # --patch's plot draws the recoveries instead
    notes = ["--ablate takes its heads as L.H"] * bool(args.ablate) + ["--patch's --plot draws no head"] * (
        args.plot is not None and args.patch is not None)
    fix = "drop {}, or add --walkthrough" + (f" ({'; '.join(notes)})" if notes else "")
    if args.layer is not None and not (args.walkthrough or attention_plot or args.heads):
        raise UsageError("--layer picks the layer that the walkthrough, --heads and --plot's attention weights show, "
                         "and none of them is asked for: " + fix.format("--layer"))
    if args.head is not None and not (args.walkthrough or attention_plot):
        raise UsageError("--head picks the head that the walkthrough and --plot's attention weights show, and neither "
                         "is asked for: " + fix.format("--head"))


class Request(NamedTuple):  # what every mode reads: the arguments, the model, and the prompt's ids
    args: argparse.Namespace
    hparams: dict
    params: dict
    text: str  # the prompt
    ids: list  # its token ids
    layer: int  # the layer --layer shows
    heads: list  # the heads --head shows
    label: Callable  # token id -> a quoted label for tables (token_label)
    text_of: Callable  # token id -> its text, for JSON (Tokenizer.token_text)
    corrupt_ids: Optional[list]  # --patch's or --attribution-patching's prompt's ids
    attribute: Optional[tuple]  # --attribute's answer ids (A, B)
    answers: Optional[tuple]  # --answer's answer ids (A, B)
    repeated: Optional[list]  # <|endoftext|> R R, for the head scores (--heads, and the page's)
    reference: Optional[list]  # --mean-over's windows [n_windows, n_seq], for a mean ablation
    steps: Optional[dict]  # walkthrough()'s arrays, for the walkthrough and --plot's attention


class Mode(NamedTuple):  # one output of stdout, asked for by its flag (args.NAME, for the name MODES gives it)
    compute: Callable  # Request -> result: every mode computes before any prints
    table: Callable  # Request, result -> the text it prints
    json: Optional[Callable]  # Request, result -> the JSON-ready object --json prints; None: no --json


def run(argv=None):  # -> exit status
    args = parse_args(argv)
    open_stdout()  # a closed stdout is refused before the model loads
    text = read_prompt(args.prompt)
    flag, corrupt = corrupt_prompt(args)
    corrupt = None if flag is None else read_prompt(corrupt, f"the {flag} prompt")
    reference = None if args.mean_over is None else read_data(args.mean_over, "--mean-over")
    # the output files first: a typo in a file name should not cost a model load
    if args.plot is not None:
        check_plot_file(args.plot)
    if args.html is not None:
        check_output_file(args.html, "--html", HTML_SUFFIXES)
    size = model_size(args)
    if size is not None and not is_ready(size, args.models_dir, args.source):
        layer_and_heads(args, OFFICIAL_HPARAMS[size])  # known before the download: a typo in --layer costs none
    hparams, params, tokenizer = model_from_args(args)
    request = make_request(args, hparams, params, tokenizer, text, corrupt, reference)
    # every output is computed before any is written: a model that fails one (NaN weights) leaves nothing behind
    results = {name: mode.compute(request) for name, mode in MODES.items() if asks(args, name)}
    page = None if args.html is None else page_html(request.ids, params, hparams["n_head"], request.text_of,
                                                    page_title(args, hparams, len(request.ids)), request.repeated,
                                                    stage_bar("page"))
    if args.plot is not None:
        save_figure(plot_figure(request, results.get("patch")), args.plot)
        log(f"wrote {args.plot} ({file_size(args.plot)})")
    if page is not None:
        write_atomically(args.html, lambda file: file.write(page.encode("utf-8")), "the page")
        log(f"wrote {args.html} ({file_size(args.html)})")
    write_stdout("\n".join(printed(MODES[name], request, result, args.json) for name, result in results.items()))
    return 0


def flag_of(name):  # -> a mode's flag: "--attribution-patching" for "attribution_patching"
    return "--" + name.replace("_", "-")


def asks(args, name):  # -> whether the arguments ask for mode `name`: its flag, args.NAME, is given
    if name == "attribute" and args.sae is not None:  # --sae's mode attributes to the SAE's latents instead
        return False
    return getattr(args, name) not in (None, False)


def printed(mode, request, result, as_json):  # -> what a mode prints: its table, or its JSON object on one line
    return json.dumps(mode.json(request, result)) + "\n" if as_json else mode.table(request, result)


def make_request(args, hparams, params, tokenizer, text, corrupt, reference):  # -> Request; UsageError for bad input
    ids, layer, heads = check_request(args, hparams, tokenizer, text)
    n_vocab = hparams["n_vocab"]
    # every check before the first computation: bad input costs no forward pass
    corrupt_ids = None if corrupt is None else check_corrupt(ids, tokenizer, corrupt, n_vocab, corrupt_prompt(args)[0])
    attribute, answers = (None if given is None else answer_ids(tokenizer, given, flag, n_vocab)
                          for given, flag in ((args.attribute, "--attribute"), (args.answer, "--answer")))
    windows = None if reference is None else mean_windows(args, tokenizer, reference, hparams, len(ids))
    eot_id, problem = tokenizer.eot_id, repetition_problem(n_vocab, hparams["n_ctx"], tokenizer.eot_id)
    # the page shows the head scores whenever they can be computed
    repeated = (repeated_tokens(n_vocab, eot_id, repeat_length(hparams["n_ctx"]), args.seed)
                if args.heads or (args.html is not None and not problem) else None)
    attention_plot = args.plot is not None and args.patch is None
    steps = (walkthrough(ids, params, hparams["n_head"], layer, progress=stage_bar("walkthrough"))
             if args.walkthrough or attention_plot else None)
    return Request(args, hparams, params, text, ids, layer, heads, functools.partial(token_label, tokenizer),
                   tokenizer.token_text, corrupt_ids, attribute, answers, repeated, windows, steps)


def mean_windows(args, tokenizer, reference, hparams, n_seq):  # -> --mean-over's windows [n_windows, n_ref]
    # n_ref: the model's context, or the whole text when shorter; never the prompt's length, which a prefix's means
    # would then depend on
    token_ids = prompt_ids(tokenizer, reference, hparams["n_vocab"], f"--mean-over {args.mean_over}")
    if len(token_ids) < n_seq:
        raise UsageError(f"--mean-over {args.mean_over} is {plural(len(token_ids), 'token')}, fewer than the "
                         f"prompt's {n_seq}: each position's mean comes from that position of the text, so give a "
                         "longer text")
    return reference_windows(token_ids, hparams["n_ctx"])


# --- The modes: what each computes and prints ---


def walkthrough_steps(request):  # -> walkthrough()'s arrays, made with the request (--plot's attention uses them too)
    return request.steps


def walkthrough_table(request, steps):  # -> the walkthrough's text (report)
    return report(request.text, request.ids, request.label, steps, request.hparams, request.layer, request.heads[0])


def lens_top(request):  # -> the lens's top tokens per layer: at every position for --json, else the table's
    first = 0 if request.args.json else first_shown(len(request.ids))
    return top_tokens(request.ids, request.params, request.hparams["n_head"], first, stage_bar("logit lens"))


def scored(request):  # -> head_scores's {pattern: [n_layer, n_head]}
    return head_scores(request.ids, request.repeated, request.params, request.hparams["n_head"],
                       progress=stage_bar("head scores"))


def scored_layers(request):  # -> the layers --heads lists: --layer's, or all
    return range(request.hparams["n_layer"]) if request.args.layer is None else [request.args.layer]


def ablated(request):  # -> ablation's {"before", "after"}
    args = request.args
    return ablation(request.ids, request.params, request.hparams["n_head"], args.ablate, args.ablation,
                    request.reference)


def mean_count(request):  # -> the reference's windows, for a mean ablation's table and JSON
    return None if request.reference is None else len(request.reference)


def attributed(request):  # -> attribution's (logit difference, terms)
    return attribution(request.ids, request.params, request.hparams["n_head"], request.attribute)


def patched(request):  # -> patching's result; UsageError when the prompts leave nothing to recover
    try:
        result = patching(request.ids, request.corrupt_ids, request.params, request.hparams["n_head"],
                          request.answers, progress=stage_bar("patching"))
    except NothingToRecover as error:  # the library's words name no flag
        raise UsageError(f"the two prompts give the same logit difference ({error.logit_diff:.4g}), so there is "
                         "nothing to recover: give a --patch prompt that changes the answer") from None
    if result["small_gap"] and request.args.json:  # the table prints it; JSON's reader gets it here
        log(small_gap_caution(result))
    return result


def attribution_patched(request):  # -> attribution_patching's scores, and for the table each node's patched effect
    args, n_head, metric = request.args, request.hparams["n_head"], logit_difference(*request.answers)
    scores = attribution_patching(request.ids, request.corrupt_ids, request.params, n_head, metric, args.edges,
                                  args.ig_steps or 1)
    effects = None if args.json else patching_effects(request.ids, request.corrupt_ids, request.params, n_head, metric)
    try:
        faithful = faithfulness_of_strongest(request.ids, request.corrupt_ids, request.params, n_head, metric,
                                             scores) if args.edges else []
    except NothingToRecover as error:  # no gap to recover: the scores stand, the fractions do not
        log(f"note: no faithfulness: {error}")
        faithful = []
    return scores, effects, faithful


def sae_latents(request):  # -> --sae's result: each position's strongest latents, the edits' effect, or with
    # --attribute each latent's attribution: {"sae", "answers", "attribution": latent_gradients's (value, f, d_f)}
    args = request.args
    sae = sae_for_model(args.sae, request.params, request.hparams, args.models_dir)
    if request.attribute is not None:
        return {"sae": sae, "answers": request.attribute, "attribution": latent_gradients(
            request.ids, request.params, request.hparams["n_head"], sae, logit_difference(*request.attribute))}
    ablate = checked_latents(args.sae_ablate or [], sae, "--sae-ablate")
    steers = args.steer or []
    checked_latents([latent for latent, _ in steers], sae, "--steer")
    check_steers(steers, sae)
    return explain_latents(sae, request.ids, request.params, request.hparams["n_head"], ablate, steers)


def sae_text(request, result):
    return latents_table(request.ids, result, request.label)


def sae_data(request, result):
    return latents_json(request.ids, result, request.text_of)


def lens_text(request, layers):
    return lens_table(request.ids, layers, request.label)


def lens_data(request, layers):
    return lens_json(request.ids, layers, request.text_of)


def heads_text(request, result):
    return heads_table(request.ids, request.repeated, result, scored_layers(request), request.args.seed)


def heads_data(request, result):
    return heads_json(request.ids, request.repeated, result, scored_layers(request))


def ablation_text(request, result):
    args = request.args
    return ablation_table(request.ids, args.ablate, args.ablation, result, request.label, mean_count(request))


def ablation_data(request, result):
    args = request.args
    return ablation_json(request.ids, args.ablate, args.ablation, result, request.text_of, mean_count(request))


def attribution_text(request, result):
    return attribution_table(request.attribute, *result, request.label)


def attribution_data(request, result):
    return attribution_json(request.ids, request.attribute, *result)


def patching_text(request, result):
    return patching_table(request.ids, request.corrupt_ids, request.answers, result, request.label)


def patching_data(request, result):
    return patching_json(request.ids, request.corrupt_ids, request.answers, result)


def attribution_patching_text(request, result):
    return attribution_patching_table(*result, request.answers, request.label, request.args.ig_steps or 1,
                                      request.ids)


def attribution_patching_data(request, result):
    scores, _, faithful = result
    return attribution_patching_json(scores, faithful)


MODES = {  # name (its flag, --NAME) -> Mode, in the order they print; each but the walkthrough has --json
    "walkthrough": Mode(walkthrough_steps, walkthrough_table, None),
    "lens": Mode(lens_top, lens_text, lens_data),
    "heads": Mode(scored, heads_text, heads_data),
    "ablate": Mode(ablated, ablation_text, ablation_data),
    "attribute": Mode(attributed, attribution_text, attribution_data),
    "patch": Mode(patched, patching_text, patching_data),
    "attribution_patching": Mode(attribution_patched, attribution_patching_text, attribution_patching_data),
    "sae": Mode(sae_latents, sae_text, sae_data),
}
OUTPUTS = tuple(name for name, mode in MODES.items() if mode.json)  # each prints a table, or with --json one object


def plot_figure(request, patched):  # -> --plot's figure: the recoveries with --patch, else the attention weights
    labels = list(map(request.label, request.ids))
    if patched is not None:
        return patching_figure(patched, labels, list(map(request.label, request.corrupt_ids)))
    heads = request.heads
    title = f"GPT-2 attention weights, layer {request.layer}" + (f", head {heads[0]}" if len(heads) == 1 else "")
    return attention_figure(request.steps["attn.weights"][heads], heads, labels, title)


def check_request(args, hparams, tokenizer, text):  # -> prompt ids, layer, heads; UsageError for what cannot be done
    layer, heads = layer_and_heads(args, hparams)
    ids = prompt_ids(tokenizer, text, hparams["n_vocab"])
    if len(ids) > hparams["n_ctx"]:
        raise UsageError(f"the prompt's {plural(len(ids), 'token')} exceed the model's context of {hparams['n_ctx']} "
                         "tokens: shorten it")
    problem = repetition_problem(hparams["n_vocab"], hparams["n_ctx"], tokenizer.eot_id)
    if args.heads and problem:
        raise UsageError(f"--heads: {problem}")
    if args.head == "all" and (args.plot is None or args.patch is not None):  # --patch's plot draws no head
        log("note: --head all chooses the heads that --plot draws of the attention (not with --patch); "
            "elsewhere head 0 is shown")
    return ids, layer, heads


def check_corrupt(ids, tokenizer, corrupt, n_vocab, flag):  # -> the corrupt prompt's ids, as many as the prompt's
    corrupt_ids = prompt_ids(tokenizer, corrupt, n_vocab, f"the {flag} prompt")
    if len(corrupt_ids) != len(ids):
        raise UsageError(f"the prompt is {plural(len(ids), 'token')} but the {flag} prompt "
                         f"{plural(len(corrupt_ids), 'token')}: patching compares position by position, so give "
                         "prompts of the same number of tokens")
    return corrupt_ids


def answer_ids(tokenizer, texts, flag, n_vocab):  # -> (A, B) token ids; UsageError unless each text is one token
    answers = []
    for text in texts:
        encoded = tokenizer.encode(text, allowed_special="all")
        if len(encoded) != 1:
            pieces = f": {' '.join(repr(tokenizer.token_text(token_id)) for token_id in encoded)}" if encoded else ""
            raise UsageError(f"{flag}: {text!r} encodes to {plural(len(encoded), 'token')}{pieces}; each answer must "
                             "be exactly one token (a word usually takes its leading space: ' Paris')")
        answers += prompt_ids(tokenizer, text, n_vocab, f"{flag} {text!r}")
    if answers[0] == answers[1]:
        raise UsageError(f"{flag}: A and B are the same token, whose logit difference is always 0: give two answers")
    return tuple(answers)


def layer_and_heads(args, hparams):  # -> the layer and the heads that --layer and --head choose; UsageError if none
    for ablated_layer, ablated_head in args.ablate or ():
        check_index(ablated_layer, hparams["n_layer"], f"--ablate {ablated_layer}.{ablated_head}: layer", "layer")
        check_index(ablated_head, hparams["n_head"], f"--ablate {ablated_layer}.{ablated_head}: head", "head",
                    " per layer")
    layer = 0 if args.layer is None else args.layer
    check_index(layer, hparams["n_layer"], "--layer", "layer")
    heads = list(range(hparams["n_head"])) if args.head == "all" else [args.head]
    check_index(heads[-1], hparams["n_head"], "--head", "head", " per layer")
    return layer, heads


def page_title(args, hparams, n_tokens):  # -> "GPT-2 124M on 6 tokens", or what was loaded when it is another model
    shape = f"{plural(hparams['n_layer'], 'layer')} of {plural(hparams['n_head'], 'head')}, {hparams['n_embd']} wide"
    size = model_size(args)
    if size is None:
        # a name that is not UTF-8 holds lone surrogates, which the page cannot carry: they show as U+FFFD
        name = f"{os.fsencode(args.model.resolve().name).decode('utf-8', 'replace')} ({shape})"
    elif hparams == OFFICIAL_HPARAMS[size]:
        name = f"GPT-2 {size}"
    else:  # a folder of --models-dir holding another shape than its name says
        name = f"the {size} folder's GPT-2 ({shape})"
    return f"{name} on {plural(n_tokens, 'token')}"


def check_plot_file(path):  # -> None; UsageError for a bad file name or folder, or no matplotlib
    check_output_file(path, "--plot", PLOT_SUFFIXES)
    try:
        import matplotlib  # noqa: F401 (only its presence is checked here)
    except ImportError:
        raise UsageError(f"--plot needs matplotlib, an optional extra: {plot_install()}") from None


def file_size(path):  # -> "42 KB" or "3.4 MB": a small page must not read "0.0 MB"
    n_bytes = path.stat().st_size
    return f"{n_bytes / 1e6:.1f} MB" if n_bytes >= 1e6 else f"{max(1, round(n_bytes / 1e3))} KB"


def stage_bar(stage):  # -> progress(items, total): items wrapped in a bar on stderr, counting layers
    def progress(items, total):
        return progress_bar(iterable=items, total=total, desc=stage, unit="layer", leave=False, delay=PROGRESS_DELAY)

    return progress


def main(argv=None):  # -> never returns; errors become one line on stderr and an exit status
    run_model_cli(run, argv)


if __name__ == "__main__":
    main()
