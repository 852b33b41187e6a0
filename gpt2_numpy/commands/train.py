"""`gpt2-numpy train`: train GPT-2 on a UTF-8 text file, from scratch, or fine-tuning an official model or a model
folder (gpt2_numpy/training.py holds the loop and the run folder).

    gpt2-numpy train --data plays.txt --out my-gpt --n-layer 4 --n-head 4 --n-embd 256 --n-ctx 128
    gpt2-numpy train --data notes.txt --out tuned --init 124M --schedule constant --lr 3e-5
    gpt2-numpy train --data notes.txt --out tuned-mine --init my-gpt    # fine-tune a model folder
    gpt2-numpy train --data plays.txt --out my-gpt --steps 4000 --resume
"""
import hashlib
import json
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import numpy as np

from gpt2_numpy.catalog import MODEL_SIZES
from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.formats.vocabulary import check_model_vocabulary
from gpt2_numpy.commands.common import (
    ArgumentParser, add_models_dir, fraction, model_choice, non_negative_float, path_argument, positive_float,
    read_data, run_cli, whole_number,
)
from gpt2_numpy.console import log, plural
from gpt2_numpy.cores import threads
from gpt2_numpy.errors import UsageError
from gpt2_numpy.loading import read_model, ready
from gpt2_numpy.optim import WEIGHT_DECAY
from gpt2_numpy.params import gpt2_init, map_leaves
from gpt2_numpy.runs import Run, Settings, check_out, claimed, load_run, settled_if_cut
from gpt2_numpy.save import copy_tokenizer
from gpt2_numpy.tokenizer import PACKAGED_VOCABULARY, load_tokenizer
from gpt2_numpy.tokenizer_train import save_tokenizer, train_vocabulary, trained_tokenizer
from gpt2_numpy.training import TrainingData, data_tokens, heads_probe, split_text, train

GPT2_VOCAB = 50257  # a model trained from scratch without --vocab-size uses GPT-2's tokenizer, so its vocabulary


SHAPE_DEFAULTS = {"n_layer": 4, "n_head": 4, "n_embd": 256, "n_ctx": 256}


# settings a resumed run keeps (changing one would make it a different run); --steps, --eval-every, --save-every may
# change
KEPT = ("batch_size", "seq_len", "val_fraction", "seed", "lr", "warmup", "schedule", "eval_batches", "weight_decay")


def parse_args(argv):  # -> argparse.Namespace
    parser = ArgumentParser(
        prog="gpt2-numpy train",
        description="Train GPT-2 (pure NumPy) on a UTF-8 text file, from scratch or from an official model, into a "
        "model folder that every command loads with --model DIR.")
    parser.add_argument("--data", required=True, type=path_argument, metavar="FILE",
                        help="UTF-8 text to train on, tokenized with GPT-2's tokenizer (or the one --vocab-size "
                        "trains, or --init DIR's own); <|endoftext|> in it is the end-of-text token; "
                        "sample: is a few KB of English that ships with the package, for a first run")
    parser.add_argument("--out", required=True, type=path_argument, metavar="DIR",
                        help="the model folder to write (Hugging Face layout), with the resume state and log.csv")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    parser.add_argument("--init", "--model", type=model_choice, metavar="SIZE|DIR",
                        help="fine-tune this official GPT-2 (124M, 355M, 774M or 1558M, downloaded on first use), or "
                        "the model in folder DIR (e.g. one trained here; a folder named like a size: ./124M); "
                        "--model DIR is the same flag")
    parser.add_argument("--vocab-size", type=whole_number(257), metavar="N",
                        help="train the model's own byte-level BPE tokenizer of N tokens (256 bytes, N - 257 merges, "
                        "<|endoftext|>) on the training part of the text first, instead of using GPT-2's 50,257: a "
                        "small vocabulary spends a CPU's time on the transformer rather than the output layer")
    parser.add_argument("--min-frequency", type=whole_number(1), metavar="N",
                        help="with --vocab-size: merge only pairs seen at least N times (2)")
    add_models_dir(parser, use=", where --init SIZE finds its model")
    for name, default in SHAPE_DEFAULTS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=whole_number(1), metavar="N",
                            help=f"train from scratch with this {name} ({default})")
    parser.add_argument("--steps", type=whole_number(0), default=1000, metavar="N",
                        help="train up to this step (1000); with --resume, the step to continue to")
    parser.add_argument("--batch-size", type=whole_number(1), metavar="B",
                        help="sequences computed together, one step's batch (8)")
    parser.add_argument("--seq-len", type=whole_number(1), metavar="T", help="tokens per sequence (128)")
    parser.add_argument("--lr", type=positive_float, metavar="LR",
                        help="peak learning rate (6e-4 from scratch, 3e-5 with --init)")
    parser.add_argument("--weight-decay", type=non_negative_float, metavar="D",
                        help="AdamW's decoupled weight decay of the matrices and embeddings (0.1, as GPT-2's); 0 keeps "
                        "a circuit that one head learned in that head, where decay would spread it over several")
    parser.add_argument("--warmup", type=whole_number(0), metavar="N",
                        help="steps of linear warmup to the peak rate (100)")
    parser.add_argument("--schedule", choices=("cosine", "constant"),
                        help="after warmup: cosine decay to 10%% of the peak at --steps (default), or constant")
    parser.add_argument("--val-fraction", type=fraction, metavar="F",
                        help="the tail of the data held out for the validation loss (0.1)")
    parser.add_argument("--seed", type=whole_number(0), metavar="S", help="seed of the init and the data order (0)")
    parser.add_argument("--eval-every", type=whole_number(1), default=100, metavar="N",
                        help="compute the validation loss every N steps, and at the end (100)")
    parser.add_argument("--eval-batches", type=whole_number(1), metavar="N",
                        help="the validation loss covers the first N x batch-size sequences of the held-out tail (4)")
    parser.add_argument("--save-every", type=whole_number(1), default=500, metavar="N",
                        help="save the model and the resume state every N steps, and at the end (500)")
    return parser.parse_args(argv)


def new_settings(args, digest):  # -> the Settings of a new run: the flags given, else defaults; digest: the text's
    defaults = {"batch_size": 8, "seq_len": 128, "lr": 3e-5 if args.init else 6e-4, "warmup": 100,
                "schedule": "cosine", "val_fraction": 0.1, "seed": 0, "eval_batches": 4,
                "weight_decay": WEIGHT_DECAY}
    given = {name: getattr(args, name) for name in KEPT if getattr(args, name) is not None}
    return Settings(**{**defaults, **given}, steps=args.steps, eval_every=args.eval_every, save_every=args.save_every,
                    data_sha256=digest, init=None if args.init is None else init_name(args.init),
                    vocab_size=args.vocab_size, min_frequency=(args.min_frequency or 2) if args.vocab_size else None)


def resumed_settings(args, saved, shape, step):  # -> the Settings of a resumed run: the saved ones, with the --steps,
    # --eval-every and --save-every given now. saved: its settings (JSON), shape: its hparams (which flags given again
    # must repeat), step: its step
    refuse_changes(args, {**saved, **shape})
    if saved["schedule"] == "cosine" and args.steps != saved["steps"] and args.steps > step:
        log(f"note: the cosine schedule changes: it now decays over {args.steps} steps instead of {saved['steps']}, "
            "so the learning rate from here on differs from the first run's plan")
    return Settings.saved(saved, steps=args.steps, eval_every=args.eval_every, save_every=args.save_every)


def refuse_changes(args, saved):  # -> None, or UsageError for a flag given with another value than the saved run's
    # the command that started the run may be given again with --resume (Ctrl-C's advice), so equal values are fine
    given = {name: getattr(args, name) for name in (*KEPT, *SHAPE_DEFAULTS)}
    given["init"] = None if args.init is None else init_name(args.init)
    given.update(vocab_size=args.vocab_size, min_frequency=args.min_frequency)
    for name, value in given.items():
        if value is not None and value != saved.get(name):
            flag = "--init" if name == "init" else "--" + name.replace("_", "-")
            was = f"the saved run's {saved.get(name)}"
            if name == "init" and not saved[name]:
                was = "the saved run's none (it trained from scratch)"
            elif name in ("vocab_size", "min_frequency") and not saved.get("vocab_size"):
                was = "the saved run, which used GPT-2's vocabulary (no --vocab-size, so no --min-frequency)"
            raise UsageError(f"{flag} {getattr(args, name)} differs from {was}: a resumed run keeps its model and "
                             "settings (only --steps, --eval-every and --save-every may change); start a new run in "
                             "another folder to change them")


def init_name(init):  # -> --init as the run records it: an official size, or the model folder's absolute path
    return init if init in MODEL_SIZES else str(Path(init).resolve())


def start_model(args):  # -> hparams, params, the folder holding the tokenizer files
    if args.init in MODEL_SIZES:
        folder, _ = ready(args.init, args.models_dir)
        hparams, params = load_params(folder)
        log(f"fine-tuning GPT-2 {args.init} from {folder}")
        return hparams, params, folder
    if args.init is not None:  # a model folder: its shape, weights and tokenizer, as --model DIR loads them elsewhere
        folder = Path(args.init)
        if not folder.is_dir():
            raise UsageError(f"--init {args.init} is neither an official size ({', '.join(MODEL_SIZES)}) nor a model "
                             "folder: pass a size, or the folder of the model to fine-tune")
        hparams, params, _ = read_model(folder)
        return hparams, params, folder
    hparams = {name: getattr(args, name) or default for name, default in SHAPE_DEFAULTS.items()}
    if hparams["n_embd"] % hparams["n_head"]:
        raise UsageError(f"--n-embd {hparams['n_embd']} must be a multiple of --n-head {hparams['n_head']}")
    hparams["n_vocab"] = args.vocab_size or GPT2_VOCAB
    log(f"training from scratch: {hparams}")
    return hparams, None, PACKAGED_VOCABULARY  # GPT-2's tokenizer, shipped with the package: nothing to download


def run(argv=None):  # -> exit status
    with ExitStack() as lock:
        return run_holding(argv, lock)


def run_holding(argv, lock):  # -> exit status; lock: the ExitStack that holds out's lock, once claimed, to the end
    args = parse_args(argv)
    check_flags(args)
    out = args.out
    ours = check_out(out, args.resume, kind="model")
    if ours:  # locked before anything is read, so that a run still going there is named as such
        lock.enter_context(claimed(out, args.resume))
    text = read_data(args.data)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()  # the file's bytes: UTF-8 decodes and encodes exactly
    hparams, params, state, settings, folder = resume(args, digest) if args.resume else start(args, digest)
    if settings.seq_len > hparams["n_ctx"]:
        raise UsageError(f"--seq-len {settings.seq_len} is over the model's context of {hparams['n_ctx']} tokens: "
                         "pass a smaller --seq-len")
    tokenizer, write_tokenizer = run_tokenizer(args.data, text, settings, state is None, folder)
    # a resumed run's own vocabulary files must still be the ones it trained (its model has exactly their ids)
    check_model_vocabulary(tokenizer.n_vocab, hparams["n_vocab"], folder, exact=bool(settings.vocab_size))
    log(f"tokenizing {args.data} ({len(text):,} characters)" + (
        f" with the run's {tokenizer.n_vocab:,}-token vocabulary" if settings.vocab_size else ""))
    train_ids, val_ids = data_tokens(text, tokenizer, hparams["n_vocab"], settings.val_fraction, settings.seq_len,
                                     own_vocabulary=bool(settings.vocab_size))
    log(f"{len(train_ids):,} training tokens, {len(val_ids):,} held out")
    if not ours:
        lock.enter_context(claimed(out, resume=False))  # only now, the input known to be good, is out made
    token_lengths = np.array([len(tokenizer.token_bytes(token_id)) for token_id in range(tokenizer.n_vocab)])
    # loaded arrays are read-only views of memory-mapped files: training updates copies of its own, and dropping the
    # views closes the mapping of a resumed run's model.safetensors, which every save replaces (Windows refuses to
    # replace a mapped file)
    params = map_leaves(np.array, params)
    data = TrainingData(train_ids, val_ids, token_lengths, heads_probe(hparams, tokenizer.eot_id))
    with settled_if_cut(out):
        return train(Run(out, hparams, settings, write_tokenizer), params, state, data)


def check_flags(args):  # -> None, or UsageError for flags that contradict each other
    shape_flags = ["--" + name.replace("_", "-") for name in SHAPE_DEFAULTS if getattr(args, name) is not None]
    if args.init is not None and shape_flags:
        raise UsageError(f"--init {args.init} fine-tunes a model of its own shape: drop {shape_flags[0]}, or drop "
                         "--init to train from scratch")
    if args.init is not None and args.vocab_size:
        raise UsageError(f"--vocab-size trains a new tokenizer for a model trained from scratch, but --init "
                         f"{args.init} keeps its model's own vocabulary: drop --vocab-size, or drop --init")
    if args.min_frequency and not args.vocab_size and not args.resume:
        raise UsageError("--min-frequency sets how --vocab-size trains the tokenizer: add --vocab-size N, or drop it")


def start(args, digest):  # -> hparams, params, state (None), Settings and the folder of its tokenizer files, of a new
    # run
    hparams, params, folder = start_model(args)
    settings = new_settings(args, digest)
    return hparams, params or gpt2_init(hparams, settings.seed), None, settings, folder


def resume(args, digest):  # -> hparams, params, state, Settings and the folder of the tokenizer files (its own) of the
    # run saved in --out
    hparams, params, state = load_run(args.out)
    threads_note(state)
    saved = json.loads(str(state["settings"]))
    if saved["data_sha256"] != digest:
        raise UsageError(f"{args.data} is not the text the run in {args.out} trained on: pass the same --data to "
                         "--resume")
    return hparams, params, state, resumed_settings(args, saved, hparams, int(state["step"])), args.out


def threads_note(state):  # -> None; one note when the run was saved at another thread count than this one's
    # Resuming is exact at the same count only: a product split among other threads sums in another order (its inner
    # dimension in other parts, or other blocks of BLAS), so the weights part in the last digits and grow apart
    saved, now = int(state.get("threads", threads())), threads()
    if saved != now:
        log(f"note: the run was saved at {plural(saved, 'thread')} and goes on at {now}: products split among another "
            f"number of threads round otherwise, so from here its numbers differ in the last digits from those of a "
            f"run kept at {saved} (--threads {saved} keeps them)")


def run_tokenizer(data, text, settings, new, folder):  # -> the run's tokenizer, and write_tokenizer(folder), which
    # puts its files in a save. A new run with --vocab-size trains its own on the training part of text (never the
    # held-out tail); other runs load the files in folder: their model's, or a resumed run's own
    merges = None
    if settings.vocab_size and new:
        log(f"training a {settings.vocab_size:,}-token tokenizer on the training part of {data}")
        merges = train_vocabulary(split_text(text, settings.val_fraction)[0], settings.vocab_size,
                                  settings.min_frequency, f"the training part of {data}")
    own = merges is not None  # a vocabulary trained just now; no merge at all for --vocab-size 257
    if own:
        return trained_tokenizer(merges), partial(save_tokenizer, merges=merges)
    return load_tokenizer(folder), partial(copy_tokenizer, folder)


def main(argv=None):  # -> never returns; errors become one line on stderr and an exit status
    run_cli(run, argv)


if __name__ == "__main__":
    main()
