"""`gpt2-numpy sae`: train a sparse autoencoder on one activation of a model (or on activations of your own), and
measure it spliced into the model (gpt2_numpy/interpret/sae*.py hold the math, the files and the loop).

    gpt2-numpy sae train --model my-gpt --hook blocks.0.out --data plays.txt --out my-sae --d-sae 2048 --k 16
    gpt2-numpy sae train --activations acts.npy --out toy-sae --architecture standard --l1 3
    gpt2-numpy sae eval --sae my-sae --model my-gpt --data held-out.txt
    gpt2-numpy sae features --sae my-sae --model my-gpt --data plays.txt --html features.html
"""
import difflib
import hashlib
import importlib
import importlib.util
import sys
from contextlib import ExitStack
from typing import Callable, NamedTuple, Optional

import numpy as np

from gpt2_numpy.commands.common import (
    ArgumentParser, add_model_args, model_from_args, path_argument, positive_float, print_json, read_data,
    run_model_cli, whole_number, write_stdout,
)
from gpt2_numpy.console import log, plural
from gpt2_numpy.errors import UsageError
from gpt2_numpy.interpret.edits import run_with_edits
from gpt2_numpy.interpret.sae_activations import (
    Stream, array_windows, check_hook, check_sae_hook, hook_rows, model_rows, splice,
)
from gpt2_numpy.interpret.sae_files import check_fits, load_sae, our_hook
from gpt2_numpy.sae_training import (
    KEPT, SAE_ORDER, SaeSettings, init_params, load_sae_run, sae_of, train_sae,
)
from gpt2_numpy.interpret.tracing import log_softmax
from gpt2_numpy.runs import check_out, claimed, settled_if_cut
from gpt2_numpy.sae_metrics import feature_density, kl_per_position, reconstruction_metrics, score
from gpt2_numpy.sae_processing import attach, forward, model_activation, zeroed_activation
from gpt2_numpy.sae_releases import listing, releases
from gpt2_numpy.tokenizer import check_in_vocabulary

SUBCOMMANDS = {"train": "train an SAE on one activation of a model, or on an .npy file of activations",
               "eval": "an SAE on held-out text: MSE, explained variance, L0, dead latents and the loss recovered",
               "features": "a page of the SAE's latents: top contexts, histograms, promoted tokens",
               "releases": "SAELens's released SAEs of GPT-2 small, loaded by name (--sae RELEASE/ID)"}
FEATURES = "gpt2_numpy.commands.sae_features"  # the features page's command, a module of its own
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
    parser = ArgumentParser(prog="gpt2-numpy sae eval", description="Measure an SAE on held-out text: how well it "
                            "reconstructs its activation, and how much of the model's loss survives it spliced in.")
    parser.add_argument("--sae", required=True, type=path_argument, metavar="DIR", help="the SAE folder, or a release "
                        "of SAELens's by name, RELEASE/ID (gpt2-numpy sae releases)")
    add_model_args(parser)
    parser.add_argument("--data", required=True, type=path_argument, metavar="FILE", help="UTF-8 held-out text")
    parser.add_argument("--hook", metavar="NAME", help="the activation the SAE reads, for a folder whose cfg.json "
                        "names none (a trace name, or TransformerLens's)")
    parser.add_argument("--seq-len", type=whole_number(2), default=128, metavar="T", help="tokens per window (128)")
    parser.add_argument("--windows", type=whole_number(1), default=32, metavar="N",
                        help="evaluate the text's first N windows at most (32)")
    parser.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    return parser


# --- Where the activations come from ---


def model_tokens(model, path):  # -> int32 [n]: the text's tokens, each in the model's vocabulary
    ids = model.tokenizer.encode(read_data(path), allowed_special="all")
    return np.array(check_in_vocabulary(model.tokenizer, ids, model.hparams["n_vocab"], "the data",
                                        "use a text of the model's vocabulary"), dtype=np.int64)


def hook_flag(name):  # -> the trace name --hook gives (ours, or TransformerLens's); None when not given
    hook = None if name is None else our_hook(name)
    if name is not None and hook is None:
        raise UsageError(f"--hook {name!r} names no activation of GPT-2: give a trace name (blocks.0.out, ...) or "
                         "TransformerLens's (blocks.1.hook_resid_pre, ...)")
    return hook


def resolve_hook(hook, n_layer):  # -> the trace name of --hook (ours, or TransformerLens's), checked
    name = our_hook(hook) or hook
    check_hook(name, n_layer)
    return name


def read_activations(path):  # -> float [n, d_in] memory-mapped, checked; UsageError for a file of another shape
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except OSError as error:
        raise UsageError(f"cannot read --activations {path}: {error.strerror or error}") from None
    except (ValueError, EOFError):  # not the .npy format (EOFError: empty), or an array of Python objects (which is
        # never loaded: pickles run code)
        raise UsageError(f"--activations {path} is not an .npy array of numbers: save one of shape [n, d_in] with "
                         "numpy.save") from None
    if not isinstance(array, np.ndarray) or array.ndim != 2 or array.dtype.kind != "f" or 0 in array.shape:
        what = f"an array of {array.dtype} {list(array.shape)}" if isinstance(array, np.ndarray) else "not an array"
        raise UsageError(f"--activations {path} is {what}: it must hold floats of shape [n, d_in], n and d_in >= 1")
    for start in range(0, len(array), 2**16):
        bad = ~np.isfinite(array[start:start + 2**16]).all(axis=1)
        if bad.any():
            raise UsageError(f"--activations {path} holds NaN or infinite values (first in row "
                             f"{start + int(np.argmax(bad)):,}): fix the file")
    return array


def file_digest(path):  # -> sha256 of a file's bytes, read in pieces
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for piece in iter(lambda: file.read(2**20), b""):
            digest.update(piece)
    return digest.hexdigest()


class Source(NamedTuple):
    """Where a run's activations come from."""
    window: Callable  # window(i) -> [m, d_in]: the activations of window i
    n_windows: int
    n_rows: int  # activations in all the windows
    d_in: int
    hook: Optional[str]  # the trace name; None for an .npy file given without --hook
    model_name: Optional[str]
    name: str  # the .npy file or the model, as the run records it
    digest: str  # sha256 of the file, or of the text's tokens
    seq_len: Optional[int]


def activation_source(args):  # -> Source of the flags given
    if args.activations is not None:
        extra = [flag for flag, value in (("--model", args.model), ("--data", args.data)) if value is not None]
        if extra:
            raise UsageError(f"--activations trains on the file's activations: drop {extra[0]}, or drop "
                             "--activations to read them from the model")
        array = read_activations(args.activations)
        window, n_windows = array_windows(array)
        hook = hook_flag(args.hook)
        if hook is not None:
            check_sae_hook(hook)
        return Source(window, n_windows, len(array), array.shape[1], hook, None, str(args.activations),
                      file_digest(args.activations), None)
    missing = [flag for flag, value in (("--model", args.model), ("--hook", args.hook), ("--data", args.data))
               if value is None]
    if missing:
        raise UsageError(f"{missing[0]} is missing: give --model DIR --hook NAME --data FILE, or --activations FILE")
    model = model_from_args(args)
    hook = resolve_hook(args.hook, model.hparams["n_layer"])
    n_ctx = model.hparams["n_ctx"]
    if args.seq_len is not None and args.seq_len > n_ctx:  # as train refuses it; only the default is cut to fit
        raise UsageError(f"--seq-len {args.seq_len} is over the model's context of {n_ctx} tokens: give at most "
                         f"{n_ctx}")
    seq_len = min(args.seq_len or DEFAULTS["seq_len"], n_ctx)
    tokens = model_tokens(model, args.data)
    n_windows = len(tokens) // seq_len
    if n_windows < 1:
        raise UsageError(f"--data {args.data} has {plural(len(tokens), 'token')}, fewer than one window of "
                         f"{seq_len}: give a longer text, or a smaller --seq-len")
    n_head = model.hparams["n_head"]

    def window(i):
        return model_rows(tokens[i * seq_len:(i + 1) * seq_len], model.params, n_head, hook)

    digest = hashlib.sha256(tokens.tobytes()).hexdigest()
    return Source(window, n_windows, n_windows * seq_len, window(0).shape[1], hook, str(args.model), str(args.model),
                  digest, seq_len)


# --- sae train ---


def train(argv):  # -> exit status
    args = train_parser().parse_args(argv)
    with ExitStack() as lock:
        out = args.out
        ours = check_out(out, args.resume, kind="sae")
        if ours:
            lock.enter_context(claimed(out, args.resume, SAE_ORDER))
        source = activation_source(args)
        if args.resume:
            sae, state, saved = load_sae_run(out)
            settings = resumed_settings(args, saved, source)
        else:
            settings, sae, state = new_settings(args, source), None, None
        stream = Stream(source.window, source.n_windows, settings.batch_size, settings.buffer, settings.seed)
        if sae is None:
            first = stream.next()  # the first batch, for b_dec's init; the stream starts again for the run
            params = init_params(settings, first)
            stream = Stream(source.window, source.n_windows, settings.batch_size, settings.buffer, settings.seed)
            sae = sae_of(params, settings, source.model_name)
        if not ours:
            lock.enter_context(claimed(out, False, SAE_ORDER))  # only now, the input known to be good, is out made
        log(f"training a {settings.architecture} SAE of {settings.d_sae:,} latents on {source.hook or 'activations'} "
            f"({settings.d_in} numbers each) from {source.name}")
        with settled_if_cut(out, SAE_ORDER):
            return train_sae(out, settings, stream, sae, state, source.model_name)


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
                       save_every=args.save_every)


def resumed_settings(args, saved, source):  # -> the saved run's SaeSettings with this run's steps, save_every
    if saved["d_in"] != source.d_in:
        raise UsageError(f"the activations have {source.d_in} numbers each, but the run in {args.out} trained on "
                         f"{saved['d_in']}: pass its --model and --hook (or --activations) to --resume")
    # a model run records its model as its source; the same text through another model has the same tokens
    if source.model_name is not None and saved["seq_len"] is not None and saved["source"] != source.name:
        raise UsageError(f"--model {source.name} is not the model the run in {args.out} trained on "
                         f"({saved['source']}): pass its --model to --resume")
    if saved["data_sha256"] != source.digest:
        raise UsageError(f"the activations are not the ones the run in {args.out} trained on: pass the same --data "
                         "(or --activations) to --resume")
    given = {name: getattr(args, name, None) for name in KEPT}
    given.update(d_sae=args.d_sae, hook=source.hook)
    for name, value in given.items():
        if value is not None and value != saved.get(name):
            raise UsageError(f"--{name.replace('_', '-')} {value} differs from the saved run's {saved.get(name)}: a "
                             "resumed run keeps its settings (only --steps and --save-every may change); start a "
                             "new run in another folder to change them")
    return SaeSettings(**{**{name: saved[name] for name in SaeSettings._fields},
                          "steps": args.steps, "save_every": args.save_every})


# --- sae eval ---


def evaluate(sae, model, tokens, seq_len, n_windows):  # -> {name: number}: the eval's numbers over the windows, and
    # SAELens's metrics (sae_metrics.py) on the activation the SAE reads
    params, n_head = model.params, model.hparams["n_head"]
    totals, kl = {"clean": 0.0, "sae": 0.0, "zero": 0.0}, {"sae": [], "zero": []}
    rows, n_targets = [], 0
    for i in range(n_windows):
        window = tokens[i * seq_len:(i + 1) * seq_len + 1]
        inputs, targets = window[:-1], window[1:]
        logits = {}
        for name, edits in (("clean", []), ("sae", [splice(sae)]), ("zero", [zeroed_activation(sae)])):
            names = run_with_edits(inputs, params, n_head, edits)
            logits[name] = names["logits"]
            totals[name] -= float(np.take_along_axis(log_softmax(names["logits"]), targets[:, None], -1).sum())
            if name == "clean":
                x = hook_rows(names[sae.hook], sae.hook)
                check_fits(sae, x.shape[-1], f"the model's {sae.hook}")
                a = model_activation(sae, x)  # what SAELens's evals read: TransformerLens's activation
                rows.append((a, forward(sae, a), sae.encode(x)))
        for name in kl:
            kl[name].append(kl_per_position(logits["clean"], logits[name]))
        n_targets += len(targets)
    a, a_hat, f = (np.concatenate(part) for part in zip(*rows))
    losses = {name: total / n_targets for name, total in totals.items()}
    kl_sae, kl_zero = (float(np.concatenate(kl[name]).mean()) for name in ("sae", "zero"))
    density = feature_density(f)
    return {"L_clean": losses["clean"], "L_sae": losses["sae"], "L_zero": losses["zero"],
            "loss_recovered": score(losses["sae"], losses["zero"], losses["clean"]),  # SAELens's ce_loss_score
            "kl_div_with_sae": kl_sae, "kl_div_with_ablation": kl_zero, "kl_div_score": score(kl_sae, kl_zero),
            **reconstruction_metrics(a, a_hat, f), "dead_latents": int((density == 0).sum()),
            "feature_density": density.tolist(), "d_sae": sae.d_sae, "tokens": n_targets, "hook": sae.hook,
            "published": published(sae)}


def eval_command(argv):  # -> exit status
    args = eval_parser().parse_args(argv)
    sae = load_sae(args.sae, models_dir=args.models_dir)
    sae.hook = eval_hook(args, sae.hook)
    model = model_from_args(args)
    check_hook(sae.hook, model.hparams["n_layer"])
    sae = attach(sae, model.params)
    seq_len = min(args.seq_len, model.hparams["n_ctx"])
    tokens = model_tokens(model, args.data)
    n_windows = min(args.windows, (len(tokens) - 1) // seq_len)
    if n_windows < 1:
        raise UsageError(f"--data {args.data} has {plural(len(tokens), 'token')}, fewer than one window of "
                         f"{seq_len + 1}: give a longer text, or a smaller --seq-len")
    numbers = evaluate(sae, model, tokens, seq_len, n_windows)
    if args.json:
        print_json(numbers)
    else:
        write_stdout(report(numbers))
    return 0


def eval_hook(args, saved):  # -> the trace name the SAE reads: its cfg.json's, or --hook's where it names none
    hook = hook_flag(args.hook)
    if saved is None and hook is None:
        raise UsageError(f"--sae {args.sae}'s cfg.json names no hook: give the activation it reads with --hook NAME "
                         "(or add metadata.hook_name to its cfg.json)")
    if saved is not None and hook not in (None, saved):
        raise UsageError(f"--hook {hook} differs from {saved}, the hook --sae {args.sae}'s cfg.json names: drop "
                         "--hook")
    return saved or hook


def report(numbers):  # -> the text sae eval prints
    recovered = numbers["loss_recovered"]
    return "\n".join([
        f"{numbers['tokens']:,} tokens, the SAE spliced in at {numbers['hook']}:",
        f"  L_clean {numbers['L_clean']:.4f}  L_sae {numbers['L_sae']:.4f}  L_zero {numbers['L_zero']:.4f} "
        "(nats per token)",
        f"  loss recovered {recovered:.4f} ((L_zero - L_sae) / (L_zero - L_clean))" if recovered is not None
        else "  loss recovered: undefined (zeroing the activation does not change the loss)",
        f"  mse {numbers['mse']:.6g}  explained variance {numbers['explained_variance']:.4f}  L0 {numbers['l0']:.2f}",
        f"  dead latents {numbers['dead_latents']:,} of {numbers['d_sae']:,} "
        f"({numbers['dead_latents'] / numbers['d_sae']:.1%}, none fired on this text)",
        "SAELens's metrics (its evals.py, on the activation the SAE reads):",
        f"  CE loss score {shown_number(numbers['loss_recovered'])}  KL div score "
        f"{shown_number(numbers['kl_div_score'])} (KL {numbers['kl_div_with_sae']:.4g} with the SAE, "
        f"{numbers['kl_div_with_ablation']:.4g} zeroed)",
        f"  cossim {numbers['cossim']:.4f}  l2 ratio {numbers['l2_ratio']:.4f}  relative reconstruction bias "
        f"{numbers['relative_reconstruction_bias']:.4f}  L1 {numbers['l1']:.4g}",
        *(["  published in SAELens's list: " + "  ".join(f"{name.replace('_', ' ')} {value:g}" for name, value in
                                                          numbers["published"].items())] if numbers["published"]
          else []), ""])


def shown_number(value):  # -> a score to 4 places, or "undefined" (zeroing the activation changed nothing)
    return "undefined" if value is None else f"{value:.4f}"


def published(sae):  # -> {"l0", "variance_explained"}: what SAELens's list publishes for a release's SAE, {} for others
    metadata = sae.cfg.get("metadata") if isinstance(sae.cfg.get("metadata"), dict) else {}
    if "release" not in metadata:
        return {}
    entry = releases()[metadata["release"]]["saes"][metadata["sae_id"]]
    return {name: entry[name] for name in ("l0", "variance_explained") if name in entry}


# --- sae features, and the dispatch ---


def features(argv):  # -> exit status: the features page's command, where it is installed
    if importlib.util.find_spec(FEATURES) is None:
        raise UsageError("sae features is not part of this version: train and eval are")
    command = importlib.import_module(FEATURES)
    parser = ArgumentParser(prog="gpt2-numpy sae features", description=SUBCOMMANDS["features"])
    command.add_arguments(parser)
    return command.run(parser.parse_args(argv))


def releases_command(argv):  # -> exit status: the table of releases, or one release's ids
    parser = ArgumentParser(prog="gpt2-numpy sae releases", description=SUBCOMMANDS["releases"] + "; each downloads "
                            "once into the models dir (GPT2_NUMPY_WEIGHTS), from HF_ENDPOINT (default the hub)")
    parser.add_argument("release", nargs="?", help="list this release's ids, with their published L0 and variance "
                        "explained")
    write_stdout(listing(parser.parse_args(argv).release))
    return 0


HANDLERS = {"train": train, "eval": eval_command, "features": features, "releases": releases_command}


def run(argv=None):  # -> exit status
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in HANDLERS:
        if argv and argv[0] in ("-h", "--help"):
            width = max(map(len, SUBCOMMANDS))
            write_stdout("usage: gpt2-numpy sae {train,eval,features,releases} [flags]\n\n" + "\n".join(
                f"  {name:<{width}}  {what}" for name, what in SUBCOMMANDS.items()) + "\n")
            return 0
        guesses = difflib.get_close_matches(argv[0], SUBCOMMANDS, n=1) if argv else []
        given = f"unknown subcommand {argv[0]!r}" if argv else "no subcommand given"
        given += "".join(f" (did you mean {guess}?)" for guess in guesses)
        raise UsageError(f"{given}: choose one of {', '.join(SUBCOMMANDS)} (gpt2-numpy sae train --help, ...)")
    return HANDLERS[argv[0]](argv[1:])


def main(argv=None):  # -> never returns; errors become one line on stderr and an exit status
    run_model_cli(run, argv)


if __name__ == "__main__":
    main()
