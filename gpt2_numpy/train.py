"""Training GPT-2 in NumPy: from scratch, or fine-tuning an official model, on a UTF-8 text file. And the command line.

    python -m gpt2_numpy.train --data plays.txt --out my-gpt --n-layer 4 --n-head 4 --n-embd 256 --n-ctx 128
    python -m gpt2_numpy.train --data notes.txt --out tuned --init 124M --schedule constant --lr 3e-5
    python -m gpt2_numpy.train --data plays.txt --out my-gpt --steps 4000 --resume

--out becomes a model folder in Hugging Face's layout (gpt2_numpy/save.py), which every command loads with
`--model DIR` and `transformers.GPT2LMHeadModel.from_pretrained(DIR)` reads, plus:
    train_state.npz   what --resume needs besides the weights: AdamW's moments, the step, the data order and position,
                      the RNG state and the run's settings
    log.csv           one row per step: step, train_loss, val_loss (at evaluations), lr, grad_norm (before
                      clipping), tokens, seconds
Every file is replaced atomically (a temporary name, then a rename). Ctrl-C finishes the step in progress, saves it and
exits with status 130; a second Ctrl-C stops at once, keeping the last save.
"""
import csv
import hashlib
import io
import json
import math
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gpt2_numpy.backward import loss_and_grads  # re-exported: gpt2_numpy.train.loss_and_grads is the documented name
from gpt2_numpy.checkpoint import load_params
from gpt2_numpy.cli import check_models_dir, whole_number
from gpt2_numpy.errors import ArgumentParser, Interrupted, UsageError, log, plural, run_cli
from gpt2_numpy.fast import lm_head, log_softmax_at, transformer
from gpt2_numpy.formats.safetensors import read_metadata
from gpt2_numpy.models import MODEL_SIZES, models_dir_path
from gpt2_numpy.optim import adamw_state, adamw_step, clip_grads, learning_rate
from gpt2_numpy.params import flatten, gpt2_init, map_leaves
from gpt2_numpy.save import atomic_write, save_model
from gpt2_numpy.tokenizer import PACKAGED_VOCABULARY, load_tokenizer
from gpt2_numpy.weights import ensure_model

__all__ = ["loss_and_grads", "main"]

STATE = "train_state.npz"
LOG = "log.csv"
LOG_FIELDS = ("step", "train_loss", "val_loss", "lr", "grad_norm", "tokens", "seconds")
GPT2_VOCAB = 50257  # a model trained from scratch uses GPT-2's tokenizer, so its vocabulary
SHAPE_DEFAULTS = {"n_layer": 4, "n_head": 4, "n_embd": 256, "n_ctx": 256}
# settings a resumed run keeps (changing one would make it a different run); --steps, --eval-every, --save-every may
# change
KEPT = ("batch_size", "seq_len", "val_fraction", "seed", "lr", "warmup", "schedule", "eval_batches")


# --- The model ---


def eval_loss(windows, params, n_head):  # int [n_windows, seq_len + 1] -> mean next-token cross-entropy (nats)
    # one window at a time: a batch's logits would take n_windows x seq_len x 50257 floats at once
    total = 0.0
    for window in windows:
        logits = lm_head(transformer(window[:-1], **params, n_head=n_head), params["wte"])
        total -= log_softmax_at(logits, window[1:]).sum()
    return total / windows[:, 1:].size


# --- The data ---


class Batches:
    """The training tokens as non-overlapping windows of seq_len + 1 tokens (inputs and their next-token targets),
    visited in a shuffled order, a new one each epoch. Its state (order, position, RNG) is saved and restored, so a
    resumed run sees the same batches as an uninterrupted one."""

    def __init__(self, tokens, seq_len, batch_size, seed):
        self.tokens, self.seq_len, self.batch_size = tokens, seq_len, batch_size
        self.n_windows = (len(tokens) - 1) // seq_len
        self.rng = np.random.default_rng([seed, 1])  # a stream of its own: the init's draws do not shift it
        self.order, self.position = self.rng.permutation(self.n_windows), 0

    def next(self):  # -> inputs, targets: int [batch_size, seq_len] each
        picked = []
        while len(picked) < self.batch_size:
            if self.position == self.n_windows:  # an epoch ends: a new order
                self.order, self.position = self.rng.permutation(self.n_windows), 0
            picked.append(self.order[self.position])
            self.position += 1
        starts = np.array(picked)[:, None] * self.seq_len
        windows = self.tokens[starts + np.arange(self.seq_len + 1)]
        return windows[:, :-1], windows[:, 1:]

    def state(self):  # -> {name: array} for train_state.npz
        return {"data_order": self.order, "data_position": np.array(self.position),
                "data_rng": np.array(json.dumps(self.rng.bit_generator.state))}

    def restore(self, state):
        self.order, self.position = state["data_order"], int(state["data_position"])
        self.rng.bit_generator.state = json.loads(str(state["data_rng"]))


def read_text(path):  # -> the file's text; UsageError for a missing, unreadable or non-UTF-8 file
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read the data file {path} ({error.strerror or error}): pass a readable UTF-8 text "
                         "file with --data") from None
    try:
        return data.decode("utf-8"), hashlib.sha256(data).hexdigest()
    except UnicodeDecodeError as error:
        raise UsageError(f"the data file {path} is not UTF-8 text (byte {error.start:,}): convert it to UTF-8") \
            from None


def split_tokens(ids, val_fraction, seq_len):  # -> train, val: int32 arrays; UsageError if too short
    """The held-out tail (val_fraction of the tokens) gives the validation loss; the rest is for training. Each part
    needs at least one window of seq_len + 1 tokens (inputs and their targets)."""
    ids = np.asarray(ids, dtype=np.int32)
    n_val = round(len(ids) * val_fraction)
    train, val = ids[: len(ids) - n_val], ids[len(ids) - n_val :]
    for name, part, share in (("training", train, 1 - val_fraction), ("validation", val, val_fraction)):
        if len(part) < seq_len + 1:
            needed = math.ceil((seq_len + 1) / share)
            raise UsageError(f"the data is too short: its {plural(len(ids), 'token')} leave {len(part):,} for "
                             f"{name}, fewer than one sequence of {seq_len + 1} (--seq-len + 1); give at least "
                             f"{needed:,} tokens of text, or a smaller --seq-len")
    return train, val


def val_windows(val, seq_len, n_windows):  # -> int [n, seq_len + 1]: the first n windows of the held-out tokens
    # always the same windows, so evaluations along a run (and across runs on one text) compare like with like
    n = min(n_windows, (len(val) - 1) // seq_len)
    return val[np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)]


# --- The training state on disk ---


def save_run(out, hparams, params, opt_state, batches, step, seconds, settings):  # -> None: out holds a resumable run
    # the weights first, then the state; each names its step, so a crash between the two renames is detected on resume
    save_model(out, hparams, params, out, metadata={"step": str(step)})
    arrays = {f"opt/{'/'.join(map(str, key))}": np.asarray(leaf) for key, leaf in flatten(opt_state)}
    arrays.update(batches.state(), step=np.array(step), seconds=np.array(seconds),
                  settings=np.array(json.dumps(settings)))
    atomic_write(out / STATE, lambda file: np.savez(file, **arrays))


def load_run(out):  # -> (hparams, params, state arrays) of the run saved in out; UsageError if there is none
    if not (out / STATE).is_file():
        raise UsageError(f"--resume: {out} holds no training state ({STATE}): start the run without --resume")
    try:
        with np.load(out / STATE, allow_pickle=False) as file:
            state = dict(file)
        hparams, params = load_params(out)
        model_step = read_metadata(out / "model.safetensors").get("step")
    except (OSError, ValueError, KeyError) as error:
        raise UsageError(f"--resume: {out / STATE} cannot be read ({error}): start a new run in another folder") \
            from None
    if model_step != str(int(state["step"])):
        raise UsageError(f"--resume: {out}'s weights are from step {model_step} but its {STATE} from step "
                         f"{int(state['step'])} (a save was cut off): start a new run in another folder")
    return hparams, params, state


def restore_moments(template, state):  # -> optimizer state shaped like template, its leaves from state's "opt/" arrays
    def fill(node, prefix):
        if isinstance(node, dict):
            return {key: fill(value, prefix + (key,)) for key, value in node.items()}
        if isinstance(node, list):
            return [fill(value, prefix + (index,)) for index, value in enumerate(node)]
        saved = state[f"opt/{'/'.join(map(str, prefix))}"]
        return saved if isinstance(node, np.ndarray) else type(node)(saved)

    return fill(template, ())


def open_log(out, step):  # -> csv writer appending to out/log.csv, which keeps only the rows up to step
    path = out / LOG
    rows = []
    if step and path.is_file():
        with path.open(newline="") as file:
            rows = [row for row in csv.DictReader(file) if int(row["step"]) <= step]
    text = io.StringIO()
    writer = csv.DictWriter(text, LOG_FIELDS)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, lambda file: file.write(text.getvalue().encode()))
    file = path.open("a", newline="")
    return file, csv.DictWriter(file, LOG_FIELDS)


# --- The command line ---


def parse_args(argv):  # -> argparse.Namespace
    parser = ArgumentParser(
        prog="python -m gpt2_numpy.train",
        description="Train GPT-2 (pure NumPy) on a UTF-8 text file, from scratch or from an official model, into a "
        "model folder that every command loads with --model DIR.")
    parser.add_argument("--data", required=True, metavar="FILE",
                        help="UTF-8 text to train on, tokenized with GPT-2's tokenizer; <|endoftext|> in it is the "
                        "end-of-text token")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="the model folder to write (Hugging Face layout), with the resume state and log.csv")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    parser.add_argument("--init", choices=MODEL_SIZES, metavar="SIZE",
                        help="fine-tune this official GPT-2 (124M, 355M, 774M or 1558M), downloaded on first use")
    parser.add_argument("--models-dir", metavar="DIR",
                        help="folder of <size>/ folders ($GPT2_NUMPY_WEIGHTS, weights): --init's model, and the "
                        "tokenizer of a model trained from scratch (124M/'s)")
    for name, default in SHAPE_DEFAULTS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=whole_number(1), metavar="N",
                            help=f"train from scratch with this {name} ({default})")
    parser.add_argument("--steps", type=whole_number(0), default=1000, metavar="N",
                        help="train up to this step (1000); with --resume, the step to continue to")
    parser.add_argument("--batch-size", type=whole_number(1), metavar="B", help="sequences per step (8)")
    parser.add_argument("--seq-len", type=whole_number(1), metavar="T", help="tokens per sequence (128)")
    parser.add_argument("--lr", type=positive_float, metavar="LR",
                        help="peak learning rate (6e-4 from scratch, 3e-5 with --init)")
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


def positive_float(text):  # -> an argparse type for a finite number > 0
    value = float(text)
    if not 0 < value < math.inf:
        raise ValueError(text)
    return value


positive_float.__name__ = "positive number"


def fraction(text):  # -> an argparse type for a number in (0, 1)
    value = float(text)
    if not 0 < value < 1:
        raise ValueError(text)
    return value


fraction.__name__ = "fraction between 0 and 1"


def settings_of(args, init, saved=None):  # -> the run's settings: the flags given, else the saved run's, else defaults
    defaults = {"batch_size": 8, "seq_len": 128, "lr": 3e-5 if init else 6e-4, "warmup": 100, "schedule": "cosine",
                "val_fraction": 0.1, "seed": 0, "eval_batches": 4}
    settings = dict(saved or defaults)
    for name in KEPT:
        given = getattr(args, name)
        if given is None:
            continue
        if saved is not None and given != saved[name]:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} {given} differs from the saved run's {saved[name]}: a resumed run keeps its "
                             "settings (only --steps, --eval-every and --save-every may change); start a new run in "
                             "another folder to change it")
        settings[name] = given
    if saved is not None and saved["schedule"] == "cosine" and args.steps != saved["steps"]:
        log(f"note: the cosine schedule changes: it now decays over {args.steps} steps instead of {saved['steps']}, "
            "so the learning rate from here on differs from the first run's plan")
    settings.update(steps=args.steps, eval_every=args.eval_every, save_every=args.save_every)
    return settings


def check_out(out, resume):  # -> None, or UsageError for an --out that cannot hold a run
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file: pass a folder (it is created if missing)")
    if not resume and (out / STATE).exists():
        raise UsageError(f"--out {out} already holds a training run: add --resume to continue it, or choose another "
                         "folder")


def start_model(args):  # -> hparams, params, the folder holding the tokenizer files
    if args.init:
        check_models_dir(models_dir_path(args.models_dir))
        folder = ensure_model(args.init, args.models_dir)
        hparams, params = load_params(folder)
        log(f"fine-tuning GPT-2 {args.init} from {folder}")
        return hparams, params, folder
    hparams = {name: getattr(args, name) or default for name, default in SHAPE_DEFAULTS.items()}
    if hparams["n_embd"] % hparams["n_head"]:
        raise UsageError(f"--n-embd {hparams['n_embd']} must be a multiple of --n-head {hparams['n_head']}")
    hparams["n_vocab"] = GPT2_VOCAB
    log(f"training from scratch: {hparams}")
    return hparams, None, PACKAGED_VOCABULARY  # GPT-2's tokenizer, shipped with the package: nothing to download


def run(argv=None):  # -> exit status
    args = parse_args(argv)
    shape_flags = [name for name in SHAPE_DEFAULTS if getattr(args, name) is not None]
    if args.init and shape_flags:
        raise UsageError(f"--init {args.init} fine-tunes a model of its own shape: drop --{shape_flags[0]}, or drop "
                         "--init to train from scratch")
    if args.resume and (args.init or shape_flags):
        raise UsageError("--resume continues the model saved in --out: drop --init and the shape flags")
    out = args.out
    check_out(out, args.resume)
    text, digest = read_text(args.data)
    if args.resume:
        hparams, params, state = load_run(out)
        saved = json.loads(str(state["settings"]))
        if saved["data_sha256"] != digest:
            raise UsageError(f"{args.data} is not the text the run in {out} trained on: pass the same --data to "
                             "--resume")
        settings, tokenizer_dir, step = settings_of(args, saved["init"], saved), out, int(state["step"])
    else:
        hparams, params, tokenizer_dir = start_model(args)
        settings, state, step = settings_of(args, args.init), None, 0
        settings.update(data_sha256=digest, init=args.init)
        params = params or gpt2_init(hparams, settings["seed"])
    if settings["seq_len"] > hparams["n_ctx"]:
        raise UsageError(f"--seq-len {settings['seq_len']} is over the model's context of {hparams['n_ctx']} tokens: "
                         "pass a smaller --seq-len")
    tokenizer = load_tokenizer(tokenizer_dir)
    log(f"tokenizing {args.data} ({len(text):,} characters)")
    ids = tokenizer.encode(text, allowed_special="all")
    outside = next((token_id for token_id in ids if token_id >= hparams["n_vocab"]), None)
    if outside is not None:
        raise UsageError(f"the data holds the token {outside} ({tokenizer.decode([outside])!r}), outside the model's "
                         f"vocabulary of {hparams['n_vocab']} tokens: train a model with GPT-2's full vocabulary")
    train_ids, val_ids = split_tokens(ids, settings["val_fraction"], settings["seq_len"])
    log(f"{len(train_ids):,} training tokens, {len(val_ids):,} held out")
    try:
        out.mkdir(parents=True, exist_ok=True)
        if tokenizer_dir != out:
            save_model(out, hparams, params, tokenizer_dir, metadata={"step": "0"})  # whole from the start
        # loaded arrays are read-only views of memory-mapped files: training updates copies of its own
        return train(out, hparams, map_leaves(np.array, params), state, step, settings, train_ids, val_ids)
    except OSError as error:  # every read is done by now: this is --out's disk (full, read-only, gone)
        raise UsageError(f"cannot write {error.filename or out} ({error.strerror or error}): free some disk space or "
                         "choose another --out; the last save stays as it was") from None


def train(out, hparams, params, state, step, settings, train_ids, val_ids):  # -> exit status
    batches = Batches(train_ids, settings["seq_len"], settings["batch_size"], settings["seed"])
    opt_state = adamw_state(params)
    if state is not None:
        batches.restore(state)
        opt_state = restore_moments(opt_state, state)
    validation = val_windows(val_ids, settings["seq_len"], settings["eval_batches"] * settings["batch_size"])
    steps, n_head = settings["steps"], hparams["n_head"]
    if step >= steps:
        log(f"{out} holds the model at step {step}; --steps {steps} asks for no more" if step else
            f"{out} holds the initial model (--steps 0)")
        return 0
    log_file, log_writer = open_log(out, step)
    tokens_per_step = settings["batch_size"] * settings["seq_len"]
    if step == 0:
        log_writer.writerow({"step": 0, "val_loss": f"{eval_loss(validation, params, n_head):.6f}", "tokens": 0,
                             "seconds": 0})

    # the seconds column counts this run's time on from the saved run's
    started = time.perf_counter() - (0.0 if state is None else float(state["seconds"]))
    train_seconds = 0.0
    with log_file, ctrl_c_stops() as stop, tqdm(total=steps, initial=step, unit="step", file=sys.stderr) as bar:
        while step < steps and not stop.requested:
            step_start = time.perf_counter()
            inputs, targets = batches.next()
            loss, grads = loss_and_grads(inputs, targets, params, n_head)
            lr = learning_rate(step, settings["lr"], settings["warmup"], steps, settings["schedule"])
            grad_norm = clip_grads(grads)
            opt_state = adamw_step(params, grads, opt_state, lr)
            step += 1
            train_seconds += time.perf_counter() - step_start
            row = {"step": step, "train_loss": f"{loss:.6f}", "lr": f"{lr:.6g}", "grad_norm": f"{grad_norm:.4f}",
                   "tokens": step * tokens_per_step,
                   "seconds": f"{time.perf_counter() - started:.1f}"}
            if step % settings["eval_every"] == 0 or step == steps:
                row["val_loss"] = f"{eval_loss(validation, params, n_head):.6f}"
            log_writer.writerow(row)
            log_file.flush()
            bar.set_postfix_str(f"loss {loss:.3f}" + (f", val {row['val_loss']}" if "val_loss" in row else "") +
                                f", {(step - bar.initial) * tokens_per_step / train_seconds:,.0f} tokens/s")
            bar.update()
            if step % settings["save_every"] == 0 or step == steps or stop.requested:
                save_run(out, hparams, params, opt_state, batches, step, time.perf_counter() - started, settings)
    if stop.requested:
        raise Interrupted(f"saved step {step} to {out}; continue with the same command and --resume")
    log(f"step {step}: saved the model to {out}; load it with --model {out}")
    return 0


class StopRequest:
    """A SIGINT handler: the first Ctrl-C asks the loop to stop after the step in progress (a half-applied update
    must never be saved); a second one stops at once, and the last save stays as it was."""

    requested = False

    def __call__(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log("\nCtrl-C: saving after the step in progress (press Ctrl-C again to stop without saving it)")


@contextmanager
def ctrl_c_stops():  # -> StopRequest, installed as the SIGINT handler inside the block
    stop = StopRequest()
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:  # e.g. a background job of a script: whoever ignored SIGINT meant it
        yield stop
        return
    signal.signal(signal.SIGINT, stop)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def main(argv=None):  # console entry point: errors become one line on stderr and an exit status
    run_cli(run, argv)


if __name__ == "__main__":
    main()
