"""`gpt2-numpy sae`: train a sparse autoencoder on one activation of a model (or on activations of your own), measure
it spliced into the model, and draw its latents (gpt2_numpy/sae/ computes all of it; this parses, calls and prints).

    gpt2-numpy sae train --model my-gpt --hook blocks.0.out --data plays.txt --out my-sae --d-sae 2048 --k 16
    gpt2-numpy sae train --activations acts.npy --out toy-sae --architecture standard --l1 3
    gpt2-numpy sae train --transcoder --model my-gpt --hook ln_2 --target mlp.out --data plays.txt --out my-tc --skip
        transcoders for every MLP (blocks.1.ln_2 with blocks.1.mlp.out: MLP 1's alone), as circuit-tracer's set
    gpt2-numpy sae eval --transcoders my-tc --model my-gpt --data held-out.txt
    gpt2-numpy sae eval --sae my-sae --model my-gpt --data held-out.txt
    gpt2-numpy sae features --sae my-sae --model my-gpt --data plays.txt --html features.html
        a page of the latents that fire most on the text (or --latents F ...): their strongest contexts, shaded, a
        histogram of their activations and the tokens each promotes and suppresses most
"""
from contextlib import ExitStack

from gpt2_numpy.commands.common import (
    HTML_SUFFIXES, ArgumentParser, add_model_args, check_output_file, model_from_args, path_argument, positive_float,
    print_json, read_data, subcommand_cli, whole_number, write_atomically, write_stdout,
)
from gpt2_numpy.console import log, plural
from gpt2_numpy.errors import UsageError
from gpt2_numpy.interpret.names import our_hook
from gpt2_numpy.runs import check_out, claimed, settled_if_cut
from gpt2_numpy.sae.activations import (
    Stream, check_hook, check_sae_hook, file_source, model_source, resolve_hook, sae_for_model,
)
from gpt2_numpy.sae.transcoder_files import load_transcoders
from gpt2_numpy.sae.evaluation import evaluate, evaluate_transcoders
from gpt2_numpy.sae.features import busiest_latents, checked_latents
from gpt2_numpy.sae.releases import load_sae
from gpt2_numpy.sae.page import features_data, features_html
from gpt2_numpy.sae.present import eval_report, transcoders_report
from gpt2_numpy.sae.processing import attach
from gpt2_numpy.sae.releases import listing
from gpt2_numpy.sae.training import (
    KEPT, SAE_ORDER, SaeSettings, init_params, init_transcoders, load_sae_run, train_sae,
)
from gpt2_numpy.sae.transcoders import TARGET, run_order, transcoder_layers
from gpt2_numpy.tokenizer import text_windows

SUBCOMMANDS = {"train": "train an SAE on one activation of a model, or on an .npy file of activations, or "
                        "transcoders for the MLPs (--transcoder)",
               "eval": "an SAE (or transcoders) on held-out text: MSE, explained variance, L0 and the loss recovered",
               "features": "a page of the SAE's latents: top contexts, histograms, promoted tokens",
               "releases": "SAELens's released SAEs of GPT-2 small, loaded by name (--sae RELEASE/ID)"}
DEFAULTS = {"architecture": "topk", "k": 32, "l1": 1.0, "lr": 4e-4, "batch_size": 4096, "seed": 0, "seq_len": 128,
            "buffer": 2**16}


def train_parser():  # -> the parser of `sae train`
    parser = ArgumentParser(prog="gpt2-numpy sae train", description="Train a sparse autoencoder (pure NumPy) on one "
                            "activation of a model over a text, or on an .npy file of activations, into a folder that "
                            "SAELens loads.")
    add_model_args(parser)
    parser.add_argument("--hook", metavar="NAME", help="the activation, as trace names it (blocks.0.out, "
                        "blocks.1.attn.z, ...) or TransformerLens does (blocks.1.hook_resid_pre, ...)")
    parser.add_argument("--data", type=path_argument, metavar="FILE", help="UTF-8 text whose activations to train on")
    parser.add_argument("--activations", type=path_argument, metavar="FILE",
                        help="train on these activations instead: an .npy file of floats, shape [n, d_in]")
    parser.add_argument("--out", required=True, type=path_argument, metavar="DIR",
                        help="the SAE folder to write (cfg.json + sae_weights.safetensors), with log.csv and the "
                        "resume state")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    parser.add_argument("--transcoder", action="store_true", help="train transcoders instead: --hook is an MLP's input "
                        "(blocks.L.ln_2, blocks.L.mid, blocks.L.ln_2.normalized; without blocks.L.: every layer's), "
                        "--target its output (blocks.L.mlp.out, or mlp.out); --out becomes circuit-tracer's "
                        "transcoder set (config.yaml + layer_<i>.safetensors)")
    parser.add_argument("--target", metavar="NAME", help="--transcoder: the activation reconstructed, the MLP's output")
    parser.add_argument("--skip", action="store_true", help="--transcoder: with a linear skip connection W_skip "
                        "[d_model, d_model], trained with the rest (Paulo et al. 2025)")
    parser.add_argument("--architecture", choices=("topk", "standard"),
                        help="topk (the k largest latents, with the AuxK loss; default) or standard (ReLU and L1)")
    parser.add_argument("--d-sae", type=whole_number(1), metavar="N", help="latents (8 x the activation's width)")
    parser.add_argument("--k", type=whole_number(1), metavar="K", help="topk: latents active per activation (32)")
    parser.add_argument("--l1", type=positive_float, metavar="C", help="standard: the L1 coefficient (1.0)")
    parser.add_argument("--steps", type=whole_number(0), default=1000, metavar="N", help="train up to this step (1000)")
    parser.add_argument("--batch-size", type=whole_number(1), metavar="B", help="activations per step (4096)")
    parser.add_argument("--lr", type=positive_float, metavar="LR", help="peak learning rate of AdamW (4e-4)")
    parser.add_argument("--seed", type=whole_number(0), metavar="S", help="seed of the init and the shuffling (0)")
    parser.add_argument("--seq-len", type=whole_number(1), metavar="T", help="tokens per window of the text (128)")
    parser.add_argument("--buffer", type=whole_number(1), metavar="N",
                        help="activations in the shuffling buffer (65536)")
    parser.add_argument("--save-every", type=whole_number(1), default=500, metavar="N",
                        help="save every N steps, and at the end (500)")
    return parser


def eval_parser():  # -> the parser of `sae eval`
    parser = ArgumentParser(prog="gpt2-numpy sae eval", description="Measure an SAE (or transcoders) on held-out "
                            "text: how well it reconstructs its activation, and how much of the model's loss survives "
                            "it spliced in.")
    parser.add_argument("--sae", type=path_argument, metavar="DIR", help="the SAE folder, or a release of SAELens's by "
                        "name, RELEASE/ID (gpt2-numpy sae releases)")
    parser.add_argument("--transcoders", type=path_argument, metavar="DIR", help="measure a transcoder set instead "
                        "(circuit-tracer's folder, or sae train --transcoder's), each MLP replaced by its transcoder")
    parser.add_argument("--layers", nargs="+", type=whole_number(0), metavar="L", help="--transcoders: the MLPs the "
                        "set's transcoders replace, in order (default: every layer; a one-layer run's set: its layer)")
    add_model_args(parser)
    parser.add_argument("--data", required=True, type=path_argument, metavar="FILE", help="UTF-8 held-out text")
    parser.add_argument("--hook", metavar="NAME", help="the activation the SAE reads, for a folder whose cfg.json "
                        "names none (a trace name, or TransformerLens's)")
    parser.add_argument("--seq-len", type=whole_number(2), default=128, metavar="T", help="tokens per window (128)")
    parser.add_argument("--windows", type=whole_number(1), default=32, metavar="N",
                        help="evaluate the text's first N windows at most (32)")
    parser.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    return parser


def features_parser():  # -> the parser of `sae features`
    parser = ArgumentParser(prog="gpt2-numpy sae features", description=SUBCOMMANDS["features"])
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
    return parser


# --- Where the activations come from ---


def hook_flag(name):  # -> the trace name --hook gives (ours, or TransformerLens's); None when not given
    hook = None if name is None else our_hook(name)
    if name is not None and hook is None:
        raise UsageError(f"--hook {name!r} names no activation of GPT-2: give a trace name (blocks.0.out, ...) or "
                         "TransformerLens's (blocks.1.hook_resid_pre, ...)")
    return hook


def check_transcoder_flags(args):  # -> None; UsageError for --target or --skip without --transcoder, or the reverse
    given = [flag for flag, value in (("--target", args.target), ("--skip", args.skip)) if value]
    if given and not args.transcoder:
        raise UsageError(f"{given[0]} applies to transcoders: add --transcoder, or drop {given[0]}")
    if args.transcoder and args.target is None:
        raise UsageError("--transcoder needs --target, the MLP output the transcoders write: blocks.L.mlp.out with "
                         "--hook blocks.L.ln_2, or mlp.out with --hook ln_2 for every layer")
    if args.transcoder and args.activations is not None:
        raise UsageError("--transcoder reads the MLPs' inputs and outputs from a model: give --model and --data, not "
                         "--activations")


def activation_source(args):  # -> Source of the flags given
    if args.activations is not None:
        extra = [flag for flag, value in (("--model", args.model), ("--data", args.data)) if value is not None]
        if extra:
            raise UsageError(f"--activations trains on the file's activations: drop {extra[0]}, or drop "
                             "--activations to read them from the model")
        hook = hook_flag(args.hook)
        if hook is not None:
            check_sae_hook(hook)
        return file_source(args.activations, hook)
    missing = [flag for flag, value in (("--model", args.model), ("--hook", args.hook), ("--data", args.data))
               if value is None]
    if missing:
        raise UsageError(f"{missing[0]} is missing: give --model DIR --hook NAME --data FILE, or --activations FILE")
    model = model_from_args(args)
    layers = None
    if args.transcoder:
        hook, layers = transcoder_layers(args.hook, args.target, model.hparams["n_layer"])
    else:
        hook = resolve_hook(args.hook, model.hparams["n_layer"])
    n_ctx = model.hparams["n_ctx"]
    if args.seq_len is not None and args.seq_len > n_ctx:  # as train refuses it; only the default is cut to fit
        raise UsageError(f"--seq-len {args.seq_len} is over the model's context of {n_ctx} tokens: give at most "
                         f"{n_ctx}")
    seq_len = min(args.seq_len or DEFAULTS["seq_len"], n_ctx)
    ids, windows = data_windows(model, read_data(args.data), args.data, seq_len)
    return model_source(model.params, model.hparams["n_head"], hook, ids, windows, str(args.model), layers)


def data_windows(model, text, path, seq_len, n_windows=None, targets=False):  # -> (ids, windows) of the text of
    # --data, tokenizer.text_windows's; UsageError when it holds no window
    ids, windows = text_windows(model.tokenizer, text, model.hparams["n_vocab"], seq_len, n_windows, targets)
    if not len(windows):
        raise UsageError(f"--data {path} has {plural(len(ids), 'token')}, fewer than one window of "
                         f"{seq_len + targets}: give a longer text, or a smaller --seq-len")
    return ids, windows


# --- sae train ---


def train(argv):  # -> exit status
    args = train_parser().parse_args(argv)
    check_transcoder_flags(args)
    with ExitStack() as lock:
        out = args.out
        ours = check_out(out, args.resume, kind="sae")
        if ours and not args.transcoder:  # a transcoder run's files (a layer file each) are known from the model
            lock.enter_context(claimed(out, args.resume, SAE_ORDER))
        source = activation_source(args)
        order = SAE_ORDER if source.layers is None else run_order(source.layers)
        if ours and args.transcoder:
            lock.enter_context(claimed(out, args.resume, order))
        threshold = None
        if args.resume:
            params, threshold, state, saved = load_sae_run(out, args.transcoder)
            settings = resumed_settings(args, saved, source)
        else:
            settings, params, state = new_settings(args, source), None, None
        stream = Stream(source.window, source.n_windows, settings.batch_size, settings.buffer, settings.seed)
        if params is None:
            first = stream.next()  # the first batch, for b_dec's init; the stream starts again for the run
            params = init_params(settings, first) if source.layers is None else init_transcoders(settings, first)
            stream = Stream(source.window, source.n_windows, settings.batch_size, settings.buffer, settings.seed)
        if not ours:
            lock.enter_context(claimed(out, False, order))  # only now, the input known to be good, is out made
        what = (f"{settings.architecture} SAE of {settings.d_sae:,} latents on {source.hook or 'activations'}"
                if source.layers is None else f"{settings.architecture} transcoders of {settings.d_sae:,} features "
                f"from {source.hook} to {TARGET}{' with a skip' * settings.skip} for "
                f"{plural(len(source.layers), 'layer')} ({', '.join(map(str, source.layers))})")
        log(f"training {what} ({settings.d_in} numbers each) from {source.name}")
        with settled_if_cut(out, order):
            return train_sae(out, settings, stream, params, state, source.model_name, threshold)


def new_settings(args, source):  # -> SaeSettings of a new run, checked
    values = {name: getattr(args, name) if getattr(args, name, None) is not None else DEFAULTS.get(name)
              for name in ("architecture", "k", "l1", "lr", "batch_size", "seed")}
    # the buffer holds each activation once at most, unless a batch needs more: a short text's activations all fit
    values["buffer"] = args.buffer or max(min(DEFAULTS["buffer"], source.n_rows), 2 * values["batch_size"])
    d_sae = args.d_sae or 8 * source.d_in
    if values["architecture"] == "topk" and values["k"] > d_sae:
        raise UsageError(f"--k {values['k']} is more than --d-sae {d_sae}: choose a k of at most the latents")
    wrong = [flag for flag, name, architecture in (("--k", "k", "standard"), ("--l1", "l1", "topk"))
             if getattr(args, name) is not None and values["architecture"] == architecture]
    if wrong:
        raise UsageError(f"{wrong[0]} does not apply to a {values['architecture']} SAE: drop it, or choose the other "
                         "--architecture")
    if values["architecture"] == "standard":
        values["k"] = None
    else:
        values["l1"] = 0.0
    return SaeSettings(**values, d_in=source.d_in, d_sae=d_sae, hook=source.hook, source=source.name,
                       data_sha256=source.digest, seq_len=source.seq_len, steps=args.steps,
                       save_every=args.save_every, model_sha256=source.model_digest,
                       target=None if source.layers is None else TARGET, layers=source.layers, skip=args.skip)


def resumed_settings(args, saved, source):  # -> the saved run's SaeSettings with this run's steps, save_every
    if saved["d_in"] != source.d_in:
        raise UsageError(f"the activations have {source.d_in} numbers each, but the run in {args.out} trained on "
                         f"{saved['d_in']}: pass its --model and --hook (or --activations) to --resume")
    # a model run records its model's weights (older runs only the --model given); the same text through another
    # model has the same tokens
    other = (saved.get("model_sha256") != source.model_digest if saved.get("model_sha256")
             else saved["source"] != source.name)
    if source.model_name is not None and saved["seq_len"] is not None and other:
        raise UsageError(f"--model {source.name} is not the model the run in {args.out} trained on "
                         f"({saved['source']}): pass its --model to --resume")
    if saved["data_sha256"] != source.digest:
        raise UsageError(f"the activations are not the ones the run in {args.out} trained on: pass the same --data "
                         "(or --activations) to --resume")
    given = {name: getattr(args, name, None) for name in KEPT}
    given.update(d_sae=args.d_sae, hook=source.hook, layers=source.layers, skip=args.skip or None)
    for name, value in given.items():
        if value is not None and value != saved.get(name):
            flag = "--hook's layers" if name == "layers" else f"--{name.replace('_', '-')}"
            raise UsageError(f"{flag} {value} differs from the saved run's {saved.get(name)}: a "
                             "resumed run keeps its settings (only --steps and --save-every may change); start a "
                             "new run in another folder to change them")
    return SaeSettings(**{**{name: saved[name] for name in SaeSettings._fields if name in saved},
                          "steps": args.steps, "save_every": args.save_every})


# --- sae eval ---


def eval_command(argv):  # -> exit status
    args = eval_parser().parse_args(argv)
    if (args.sae is None) == (args.transcoders is None):
        raise UsageError("give --sae DIR (an SAE) or --transcoders DIR (a transcoder set): one of the two")
    wrong = [flag for flag, value in (("--hook", args.hook), ("--layers", args.layers)) if value is not None and
             (flag == "--hook") == (args.sae is None)]
    if wrong:
        raise UsageError(f"{wrong[0]} applies to {'--sae' if wrong[0] == '--hook' else '--transcoders'}: drop it")
    if args.transcoders is not None:
        return eval_transcoders(args)
    sae = load_sae(args.sae, models_dir=args.models_dir)
    sae.hook = eval_hook(args, sae.hook)
    model = model_from_args(args)
    check_hook(sae.hook, model.hparams["n_layer"])
    sae = attach(sae, model.params)
    seq_len = min(args.seq_len, model.hparams["n_ctx"])
    _, windows = data_windows(model, read_data(args.data), args.data, seq_len, args.windows, targets=True)
    numbers = evaluate(sae, model.params, model.hparams["n_head"], windows)
    if args.json:
        print_json(numbers)
    else:
        write_stdout(eval_report(numbers))
    return 0


def eval_transcoders(args):  # -> exit status: sae eval --transcoders
    transcoders = load_transcoders(args.transcoders)  # a damaged set costs no model load
    model = model_from_args(args)
    n_layer = model.hparams["n_layer"]
    layers = args.layers or list(range(n_layer))
    check_layers(args, transcoders, layers, n_layer, model.hparams["n_embd"])
    seq_len = min(args.seq_len, model.hparams["n_ctx"])
    _, windows = data_windows(model, read_data(args.data), args.data, seq_len, args.windows, targets=True)
    numbers = evaluate_transcoders(transcoders, layers, model.params, model.hparams["n_head"], windows)
    if args.json:
        print_json(numbers)
    else:
        write_stdout(transcoders_report(numbers))
    return 0


def check_layers(args, transcoders, layers, n_layer, n_embd):  # -> None; UsageError when the set does not fit the
    # model's layers it is to replace
    if transcoders.d_model != n_embd:
        raise UsageError(f"--transcoders {args.transcoders} reads {transcoders.d_model} numbers per position, but the "
                         f"model is {n_embd} wide: use transcoders trained on this model")
    outside = [layer for layer in layers if layer >= n_layer]
    if outside or len(set(layers)) != len(layers):
        raise UsageError(f"--layers {' '.join(map(str, args.layers))}: give each layer once, from 0 to {n_layer - 1}")
    if len(layers) != len(transcoders.layers):
        given = f"--layers names {plural(len(layers), 'layer')}" if args.layers else \
            f"the model has {plural(n_layer, 'layer')}"
        raise UsageError(f"--transcoders {args.transcoders} holds {plural(len(transcoders.layers), 'transcoder')}, "
                         f"but {given}: give --layers, the layer each replaces (a one-layer run's: its layer)")


def eval_hook(args, saved):  # -> the trace name the SAE reads: its cfg.json's, or --hook's where it names none
    hook = hook_flag(args.hook)
    if saved is None and hook is None:
        raise UsageError(f"--sae {args.sae}'s cfg.json names no hook: give the activation it reads with --hook NAME "
                         "(or add metadata.hook_name to its cfg.json)")
    if saved is not None and hook not in (None, saved):
        raise UsageError(f"--hook {hook} differs from {saved}, the hook --sae {args.sae}'s cfg.json names: drop "
                         "--hook")
    return saved or hook


# --- sae features, and the dispatch ---


def features(argv):  # -> exit status
    args = features_parser().parse_args(argv)
    check_output_file(args.html, "--html", HTML_SUFFIXES)  # a typo in the file name costs no model load
    text = read_data(args.data)
    model = model_from_args(args)
    sae = sae_for_model(args.sae, model.params, model.hparams, args.models_dir)
    if args.latents:
        checked_latents(args.latents, sae, "--latents")
    _, windows = data_windows(model, text, args.data, min(args.seq_len, model.hparams["n_ctx"]), args.windows)
    params, n_head = model.params, model.hparams["n_head"]
    latents = args.latents or busiest_latents(windows, params, n_head, sae, args.count)
    if not latents:
        raise UsageError(f"no latent of --sae {args.sae} fires anywhere in --data {args.data}: nothing to show")
    title = f"{plural(len(latents), 'latent')} of the SAE {args.sae.name} on {args.data.name}"
    data = features_data(windows, params, n_head, sae, latents, model.tokenizer.token_text, title,
                         args.contexts)
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


def releases_command(argv):  # -> exit status: the table of releases, or one release's ids
    parser = ArgumentParser(prog="gpt2-numpy sae releases", description=SUBCOMMANDS["releases"] + "; each downloads "
                            "once into the models dir (GPT2_NUMPY_WEIGHTS), from HF_ENDPOINT (default the hub)")
    parser.add_argument("release", nargs="?", help="list this release's ids, with their published L0 and variance "
                        "explained")
    write_stdout(listing(parser.parse_args(argv).release))
    return 0


HANDLERS = {"train": train, "eval": eval_command, "features": features, "releases": releases_command}
run, main = subcommand_cli("sae", SUBCOMMANDS, HANDLERS)  # run(argv) -> exit status; main(argv) exits


if __name__ == "__main__":
    main()
