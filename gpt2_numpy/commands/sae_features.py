"""Look at an SAE's latents from the command line (interpret/features.py holds the math, features_page.py the page):

    gpt2-numpy sae features --sae my-sae --model my-gpt --data plays.txt --html features.html
        a page of the latents that fire most on the text (or --latents F ...): their strongest contexts, shaded, a
        histogram of their activations and the tokens each promotes and suppresses most
    gpt2-numpy explain PROMPT --sae my-sae [--json]                  each position's strongest latents
    gpt2-numpy explain PROMPT --sae my-sae --sae-ablate F [F ...]    the loss and next tokens with latents taken out
    gpt2-numpy explain PROMPT --sae my-sae --steer F:SCALE [...]     ... with SCALE * W_dec[F] added at every position

`sae features` is add_arguments + run (commands/sae.py dispatches to them); explain's flags are add_explain_arguments
+ explain_run, which read the model explain has loaded.
"""
import argparse
import json
import math

import numpy as np

from gpt2_numpy.commands.common import add_model_args, model_from_args, path_argument, read_data, repeated
from gpt2_numpy.commands.common import whole_number
from gpt2_numpy.console import log, plural
from gpt2_numpy.errors import UsageError
from gpt2_numpy.interpret.features import busiest_latents, check_latents, latent_activations, latent_edit_effect
from gpt2_numpy.interpret.features import strongest_latents
from gpt2_numpy.interpret.features_page import features_data, features_html
from gpt2_numpy.interpret.sae import decoder_norms
from gpt2_numpy.interpret.sae_activations import check_hook, model_rows
from gpt2_numpy.interpret.sae_files import check_fits, load_sae
from gpt2_numpy.sae_processing import attach
from gpt2_numpy.interpret.present import before_after_json, before_after_table
from gpt2_numpy.interpret.files import check_output_file, write_atomically
from gpt2_numpy.interpret.stepwise import fit
from gpt2_numpy.tokenizer import check_in_vocabulary

STRONGEST = 5  # latents shown per position by explain --sae
HTML_SUFFIXES = (".html", ".htm")
FLOAT32_MAX = float(np.finfo(np.float32).max)  # a steered row beyond it is infinite in the model's float32


# --- sae features ---


def add_arguments(parser):  # -> None; the flags of `sae features`
    parser.add_argument("--sae", required=True, type=path_argument, metavar="DIR", help="the SAE's folder (SAELens's), "
                        "or a release of SAELens's by name, RELEASE/ID (gpt2-numpy sae releases)")
    add_model_args(parser)
    parser.add_argument("--data", required=True, type=path_argument, metavar="FILE",
                        help="UTF-8 text to find each latent's strongest contexts in")
    parser.add_argument("--html", required=True, type=path_argument, metavar="FILE", help="the page to write")
    parser.add_argument("--latents", nargs="+", type=whole_number(0), metavar="F",
                        help="these latents (default: the --count that fire at the most positions of the text)")
    parser.add_argument("--count", type=whole_number(1), default=32, metavar="N",
                        help="latents on the page without --latents (default 32)")
    parser.add_argument("--contexts", type=whole_number(1), default=10, metavar="N",
                        help="strongest contexts per latent (default 10)")
    parser.add_argument("--seq-len", type=whole_number(1), default=128, metavar="N",
                        help="tokens per window of the text, at most the model's context (default 128)")
    parser.add_argument("--windows", type=whole_number(1), default=256, metavar="N",
                        help="windows of the text read, at most (default 256, from its start)")


def run(args):  # -> exit status
    check_output_file(args.html, "--html", HTML_SUFFIXES)  # a typo in the file name costs no model load
    text = read_data(args.data)
    model = model_from_args(args)
    sae = loaded_sae(args.sae, model.params, model.hparams, args.models_dir)
    if args.latents:
        checked(args.latents, sae, "--latents")
    windows = text_windows(model, text, args)
    params, n_head = model.params, model.hparams["n_head"]
    latents = args.latents or busiest_latents(windows, params, n_head, sae, args.count)
    if not latents:
        raise UsageError(f"no latent of --sae {args.sae} fires anywhere in --data {args.data}: nothing to show")
    title = f"{plural(len(latents), 'latent')} of the SAE {args.sae.name} on {args.data.name}"
    data = features_data(windows, params, n_head, sae, latents, lambda t: token_text(model, t), title, args.contexts)
    silent = [latent["id"] for latent in data["latents"] if latent["fired"] == 0]
    if silent:  # asked for by --latents: drawn, with no context, so that the page answers what was asked
        log(f"{'latent' if len(silent) == 1 else 'latents'} {', '.join(map(str, silent))} of --latents never "
            f"fire{'s' * (len(silent) == 1)} in --data {args.data}: drawn without contexts")
    if data["no_logits"]:
        log(f"no logit table on the page: {data['no_logits']}")
    page = features_html(data)
    write_atomically(args.html, lambda file: file.write(page.encode("utf-8")), "the page")
    log(f"wrote {args.html}: {plural(len(latents), 'latent')} over {plural(windows.size, 'token')}")
    return 0


def text_windows(model, text, args):  # -> int [n_windows, seq_len]: the text's first windows of tokens
    ids = model.tokenizer.encode(text, allowed_special="all")
    ids = check_in_vocabulary(model.tokenizer, ids, model.hparams["n_vocab"], "the data",
                              "use a text of the model's vocabulary")
    seq_len = min(args.seq_len, model.hparams["n_ctx"])
    n_windows = min(args.windows, len(ids) // seq_len)
    if n_windows < 1:
        raise UsageError(f"--data {args.data} has {plural(len(ids), 'token')}, fewer than one window of {seq_len}: "
                         "give a longer text, or a smaller --seq-len")
    return np.asarray(ids[:n_windows * seq_len], dtype=np.int64).reshape(n_windows, seq_len)


def token_text(model, token_id):  # -> a token's text; a piece of a character shows its bytes as \xe2
    return model.tokenizer.token_bytes(token_id).decode("utf-8", errors="backslashreplace")


# --- The SAE, checked against the model ---


def loaded_sae(folder, params, hparams, models_dir=None):  # -> the SAE in folder (or a release's, downloaded into
    # models_dir), fit for the model; UsageError (one line) otherwise
    sae = attach(load_sae(folder, models_dir=models_dir), params)  # a hook_z release reads the value bias
    if sae.hook is None:
        raise UsageError(f"--sae {folder}'s cfg.json names no hook: add metadata.hook_name (a trace name, or "
                         "TransformerLens's), so that it is known where the SAE reads")
    check_hook(sae.hook, hparams["n_layer"])
    width = model_rows([0], params, hparams["n_head"], sae.hook).shape[-1]  # one token's activation: its width
    check_fits(sae, width, f"the model's {sae.hook}")
    return sae


def checked(latents, sae, flag):  # -> latents; UsageError for one that is not a latent of the SAE, or is given twice
    twice = repeated(latents)
    if twice is not None:  # more likely a typo for another latent: taking one out twice would subtract it twice
        raise UsageError(f"{flag} names latent {twice} more than once: give each latent once")
    try:
        check_latents(latents, sae.d_sae, flag)
    except ValueError as error:
        raise UsageError(f"{error}: give latent ids below {sae.d_sae}") from None
    return latents


# --- explain --sae, --sae-ablate, --steer ---


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


def check_steers(steers, sae):  # -> None; UsageError for a scale that overflows float32 on its decoder row
    for latent, scale in steers:
        norm = float(decoder_norms(sae.params["W_dec"][latent]))
        if not abs(scale) * norm < FLOAT32_MAX:
            raise UsageError(f"--steer {latent}:{scale:g} overflows: the scale times the row's norm {norm:.4g} is "
                             f"beyond float32's largest number ({FLOAT32_MAX:.3g}): give a smaller scale")


def add_explain_arguments(parser):  # -> None; explain's SAE flags
    parser.add_argument("--sae", type=path_argument, metavar="DIR",
                        help="an SAE's folder (SAELens's), or a release of SAELens's by name, RELEASE/ID: print "
                        "each position's strongest latents at its hook")
    parser.add_argument("--sae-ablate", nargs="+", type=whole_number(0), metavar="F",
                        help="with --sae: take these latents out of the activation (x - f_F(x) W_dec[F], the SAE's "
                        "error kept) and print the loss and the next tokens before and after")
    parser.add_argument("--steer", nargs="+", type=steer_pair, metavar="F:SCALE",
                        help="with --sae: add SCALE * W_dec[F] to the activation at every position, and print the "
                        "loss and the next tokens before and after")


def explain_run(args, model):  # -> the text explain prints for --sae (a table, or with args.json one JSON line)
    """model: what explain has loaded, with .params, .hparams, .ids (the prompt's token ids), .label(token_id) (a
    table's quoted label) and .text_of(token_id) (a token's text, for JSON), as explain's Request has them. Its three
    steps, for explain's table of modes: explain_compute (the work and every check), explain_table, explain_json."""
    result = explain_compute(args, model)
    return json.dumps(explain_json(model, result)) + "\n" if args.json else explain_table(model, result)


def explain_compute(args, model):  # -> {"sae", "top"} or {"sae", "ablate", "steers", "effect"}; UsageError first
    if args.sae is None:
        flag = "--sae-ablate" if args.sae_ablate else "--steer"
        raise UsageError(f"{flag} edits an SAE's latents: add --sae DIR")
    sae = loaded_sae(args.sae, model.params, model.hparams, args.models_dir)
    ablate, steers = args.sae_ablate or [], args.steer or []
    checked(ablate, sae, "--sae-ablate")
    checked([latent for latent, _ in steers], sae, "--steer")
    check_steers(steers, sae)
    n_head = model.hparams["n_head"]
    if not (ablate or steers):
        return {"sae": sae, "top": strongest_latents(latent_activations(model.ids, model.params, n_head, sae),
                                                     STRONGEST)}
    return {"sae": sae, "ablate": ablate, "steers": steers,
            "effect": latent_edit_effect(model.ids, model.params, n_head, sae, ablate, steers)}


def explain_table(model, result):  # -> the text explain --sae prints for explain_compute's result
    if "top" in result:
        return strongest_table(model.ids, result["sae"], result["top"], model.label)
    return edit_table(result["sae"], result["ablate"], result["steers"], result["effect"], model.label)


def explain_json(model, result):  # -> the JSON-ready object explain --sae --json prints
    if "top" in result:
        return strongest_json(model.ids, result["sae"], result["top"], model.text_of)
    return edit_json(model.ids, result["sae"], result["ablate"], result["steers"], result["effect"], model.text_of)


def strongest_json(ids, sae, top, text):  # -> the object explain --sae --json prints
    return {"prompt_ids": [int(t) for t in ids], "hook": sae.hook, "d_sae": sae.d_sae,
            "latents": [{"token": text(token_id), "top": [{"id": int(latent), "activation": float(value)}
                                                          for latent, value in zip(row_ids, row_values) if value > 0]}
                        for token_id, row_ids, row_values in zip(ids, *top)]}


def strongest_table(ids, sae, top, label):  # -> the text explain --sae prints: a row per position
    lines = [f"Strongest latents of the SAE at {sae.hook} ({sae.d_sae:,} latents), as latent:activation", ""]
    for position, (token_id, row_ids, row_values) in enumerate(zip(ids, *top)):
        fired = "  ".join(f"{latent}:{value:.3f}" for latent, value in zip(row_ids, row_values) if value > 0)
        lines.append(f"{position:4} {fit(label(token_id), 19):>20}  {fired or '(none fires)'}")
    return "\n".join(lines) + "\n"


def edit_names(ablate, steers):  # -> "latents 3, 7 taken out; latent 12 steered by +4" for a table's header
    parts = [f"latent{'s' * (len(ablate) > 1)} {', '.join(map(str, ablate))} taken out"] * bool(ablate)
    parts += [f"latent {latent} steered by {scale:+g}" for latent, scale in steers]
    return "; ".join(parts)


def edit_json(ids, sae, ablate, steers, result, text):  # -> the object --sae-ablate / --steer --json prints
    return {"prompt_ids": [int(t) for t in ids], "hook": sae.hook, "ablated": [int(f) for f in ablate],
            "steered": [[int(f), float(scale)] for f, scale in steers], **before_after_json(result, text)}


def edit_table(sae, ablate, steers, result, label):  # -> the text --sae-ablate / --steer prints, as --ablate's
    return before_after_table(f"SAE at {sae.hook}: {edit_names(ablate, steers)}", result, label)
