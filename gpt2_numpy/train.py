"""Training GPT-2 in NumPy: from scratch, or fine-tuning an official model or a model folder, on a UTF-8 text file. And
the command line.

    python -m gpt2_numpy.train --data plays.txt --out my-gpt --n-layer 4 --n-head 4 --n-embd 256 --n-ctx 128
    python -m gpt2_numpy.train --data notes.txt --out tuned --init 124M --schedule constant --lr 3e-5
    python -m gpt2_numpy.train --data notes.txt --out tuned-mine --model my-gpt    # fine-tune a model folder
    python -m gpt2_numpy.train --data plays.txt --out my-gpt --steps 4000 --resume

--out becomes a model folder in Hugging Face's layout (gpt2_numpy/save.py), which every command loads with
`--model DIR` and `transformers.GPT2LMHeadModel.from_pretrained(DIR)` reads, plus:
    train_state.npz   what --resume needs besides the weights: AdamW's moments, the step, the data order and position,
                      the RNG state and the run's settings
    log.csv           one row per step: step, train_loss, val_loss (at evaluations), lr, grad_norm (before
                      clipping), tokens, seconds; written as the run goes, so --resume drops the rows after its save
    .train.lock       locked for the whole run, as downloads lock their folder: a second run into it stops at once

A save is one unit, so that whatever cuts it off (a full disk, a second Ctrl-C, a kill) --out holds one whole save,
and the weights `--model OUT` loads are always those --resume continues from. It is written whole into
OUT/.train.save/ (model.safetensors, whose header names the step, config.json, the tokenizer files, and
train_state.npz last), every file and the folder flushed to the disk. Then its files take their places in OUT, the
weights first: that one rename is the moment the save happens. A save cut off midway is settled by the next run, under
the lock, or on the spot: if the weights in OUT name its step, the rest of it moves in; otherwise .train.save/ goes
and the save before it stays, whole. So --out needs room for two saves at once: the one in place and the next.

Ctrl-C finishes the step in progress, saves it and exits with status 130; a second Ctrl-C stops at once, keeping the
last whole save. A run that cannot go on (--out's disk refuses a write, or the loss or the gradient norm is no longer
finite) stops with one error line naming the save it keeps, and exit status 1; bad input exits with 2.
"""
import csv
import errno
import hashlib
import io
import json
import math
import os
import shutil
import signal
import sys
import time
import zipfile
from contextlib import ExitStack, contextmanager, suppress
from functools import partial
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gpt2_numpy.backward import loss_and_grads  # re-exported: gpt2_numpy.train.loss_and_grads is the documented name
from gpt2_numpy.checkpoint import load_params
from gpt2_numpy.cli import check_models_dir, load_folder, whole_number
from gpt2_numpy.errors import (ArgumentParser, Gpt2NumpyError, Interrupted, TrainingFailed, UsageError, log, plural,
                               run_cli)
from gpt2_numpy.fast import lm_head, log_softmax_at, transformer
from gpt2_numpy.formats import parse_json
from gpt2_numpy.formats.safetensors import read_metadata
from gpt2_numpy.models import MODEL_SIZES, models_dir_path
from gpt2_numpy.optim import adamw_state, adamw_step, clip_grads, learning_rate
from gpt2_numpy.params import flatten, gpt2_init, map_leaves
from gpt2_numpy.save import atomic_write, copy_tokenizer, fsync_folder, save_model
from gpt2_numpy.tokenizer import FILE_NAMES, PACKAGED_VOCABULARY, load_tokenizer
from gpt2_numpy.tokenizer_train import merges_to_make, save_tokenizer, train_bpe, trained_tokenizer
from gpt2_numpy.weights import ensure_model, release_lock, take_lock

__all__ = ["loss_and_grads", "main"]

STATE = "train_state.npz"
LOG = "log.csv"
MODEL = "model.safetensors"
STAGING = ".train.save"  # the next save, written whole here before its files take their places in --out
LOCK = ".train.lock"
# the order in which a save's files take their places: the weights first (their header names the step, so that rename
# is the save), the state last (while .train.save/ holds it, the save has not all moved in)
SAVE_ORDER = (MODEL, "config.json", *FILE_NAMES["Hugging Face"], STATE)
DISK_FIXES = {errno.ENOSPC: "free some disk space", errno.EDQUOT: "free some disk space",
              errno.EACCES: "fix its permissions", errno.EPERM: "fix its permissions",
              errno.EROFS: "its file system is read-only: remount it writable"}
LOG_FIELDS = ("step", "train_loss", "val_loss", "val_bits_per_byte", "lr", "grad_norm", "tokens", "seconds")
GPT2_VOCAB = 50257  # a model trained from scratch without --vocab-size uses GPT-2's tokenizer, so its vocabulary
SHAPE_DEFAULTS = {"n_layer": 4, "n_head": 4, "n_embd": 256, "n_ctx": 256}
# settings a resumed run keeps (changing one would make it a different run); --steps, --eval-every, --save-every may
# change
KEPT = ("batch_size", "seq_len", "val_fraction", "seed", "lr", "warmup", "schedule", "eval_batches")


# --- The model ---


def eval_loss(windows, params, n_head, token_lengths):  # int [n_windows, seq_len + 1], int [n_vocab] -> (nats, bits)
    """The mean next-token cross-entropy over the windows' targets (nats per token), and the same total loss per byte
    of the text those targets spell, in bits: a tokenizer with longer tokens has fewer, harder tokens to predict, so
    only bits per byte compares runs with different vocabularies."""
    # one window at a time: a batch's logits would take n_windows x seq_len x n_vocab floats at once
    total = 0.0
    for window in windows:
        logits = lm_head(transformer(window[:-1], **params, n_head=n_head), params["wte"])
        total -= log_softmax_at(logits, window[1:]).sum()
    return total / windows[:, 1:].size, total / math.log(2) / token_lengths[windows[:, 1:]].sum()


def validation_row(windows, params, n_head, token_lengths):  # -> log.csv's validation columns
    nats, bits_per_byte = eval_loss(windows, params, n_head, token_lengths)
    return {"val_loss": f"{nats:.6f}", "val_bits_per_byte": f"{bits_per_byte:.6f}"}


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

    def restore(self, state):  # state: arrays load_run checked
        if len(state["data_order"]) != self.n_windows:  # the same text and --seq-len: only a hand-edited order differs
            raise UsageError(f"--resume: the saved data order covers {len(state['data_order']):,} windows, but the "
                             f"data has {self.n_windows:,}: start a new run in another folder")
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


def split_text(text, val_fraction):  # -> (training text, held-out text): the tail of the characters held out
    # a tokenizer trained for the run learns from the training part alone, so the parts are split before tokenizing
    n_val = round(len(text) * val_fraction)
    return text[: len(text) - n_val], text[len(text) - n_val :]


def check_parts(train, val, seq_len):  # -> None, or UsageError when a part holds no window of seq_len + 1 tokens
    for name, part in (("training", train), ("validation", val)):
        if len(part) < seq_len + 1:
            raise UsageError(f"the data is too short: its {name} part has {plural(len(part), 'token')} in the run's "
                             f"own vocabulary, fewer than one sequence of {seq_len + 1} (--seq-len + 1); give a longer "
                             "text, or a smaller --seq-len")


def split_tokens(ids, val_fraction, seq_len):  # -> train, val: int32 arrays; UsageError if too short
    """The held-out tail (val_fraction of the tokens) gives the validation loss; the rest is for training. Each part
    needs at least one window of seq_len + 1 tokens (inputs and their targets)."""
    ids = np.asarray(ids, dtype=np.int32)
    n_train, _ = split_sizes(len(ids), val_fraction)
    train, val = ids[:n_train], ids[n_train:]
    for name, part in (("training", train), ("validation", val)):
        if len(part) < seq_len + 1:
            raise UsageError(f"the data is too short: its {plural(len(ids), 'token')} leave {len(part):,} for "
                             f"{name}, fewer than one sequence of {seq_len + 1} (--seq-len + 1); give at least "
                             f"{fewest_tokens(val_fraction, seq_len):,} tokens of text, or a smaller --seq-len")
    return train, val


def split_sizes(n_tokens, val_fraction):  # -> (training tokens, held-out tokens)
    n_val = round(n_tokens * val_fraction)
    return n_tokens - n_val, n_val


def fewest_tokens(val_fraction, seq_len):  # -> the fewest tokens whose two parts each hold a window of seq_len + 1
    window, smaller_share = seq_len + 1, min(val_fraction, 1 - val_fraction)
    # a part is its share of the tokens to within rounding (half a token), so no count below this one fits; and each
    # part grows by 0 or 1 token per token added, so the first count up from here that fits is the fewest
    n_tokens = max(2 * window, math.floor((window - 1) / smaller_share))
    while min(split_sizes(n_tokens, val_fraction)) < window:
        n_tokens += 1
    return n_tokens


def val_windows(val, seq_len, n_windows):  # -> int [n, seq_len + 1]: the first n windows of the held-out tokens
    # always the same windows, so evaluations along a run (and across runs on one text) compare like with like
    n = min(n_windows, (len(val) - 1) // seq_len)
    return val[np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)]


# --- The training state on disk ---


def save_run(out, write_tokenizer, hparams, params, opt_state, batches, step, seconds, settings):  # -> None: out
    # holds the run at step, resumable (see the module docstring); cut off, it is settled by settle().
    # write_tokenizer(folder) puts the run's tokenizer files in folder
    staging = out / STAGING
    staging.mkdir()  # none is left: settle() ran when the run took the lock, and a failed save ends the run
    write_tokenizer(staging)
    save_model(staging, hparams, params, None, metadata={"step": str(step)})
    arrays = {f"opt/{'/'.join(map(str, key))}": np.asarray(leaf) for key, leaf in flatten(opt_state)}
    arrays.update(batches.state(), step=np.array(step), seconds=np.array(seconds),
                  settings=np.array(json.dumps(settings)))
    atomic_write(staging / STATE, lambda file: np.savez(file, **arrays))  # last: with it, the save is whole
    fsync_folder(staging)
    move_in(out)


def move_in(out):  # -> None: .train.save/'s files in out, in SAVE_ORDER, and .train.save/ gone
    for name in SAVE_ORDER:
        with suppress(FileNotFoundError):  # a save settled after a cut: its first files may have moved already
            os.replace(out / STAGING / name, out / name)
        fsync_folder(out)  # each rename on the disk before the next: the weights' one is the save itself
    (out / STAGING).rmdir()


def settle(out):  # -> None: a save cut off midway (a full disk, a second Ctrl-C, a kill) made whole, or dropped
    staging = out / STAGING
    if not staging.exists():
        return
    if (staging / STATE).is_file():
        with np.load(staging / STATE) as state:
            staged = str(int(state["step"]))
        if saved_step(out) == staged:  # its weights are in place: the save happened, the rest of it moves in
            move_in(out)
            return
    shutil.rmtree(staging)  # never began to move in (or was never whole): the save in place stays


def saved_step(out):  # -> the step of the save in out (str), as its weights' header names it; None before the first
    return read_metadata(out / MODEL).get("step") if (out / MODEL).is_file() else None


def kept(out):  # -> (the step of out's last save, None if there is none; the words that say which save out keeps)
    try:
        saved = saved_step(out)
    except (OSError, Gpt2NumpyError):  # out cannot be read either
        return None, f"{out} stays as it was"
    return saved, "nothing was saved" if saved is None else f"the last save (step {saved}) is kept"


def cannot_write(out, error):  # -> TrainingFailed for an OSError writing out: what to do, and which save stays
    saved, keeps = kept(out)
    then = "then continue with the same command and --resume" if saved else "or choose another --out"
    fix = DISK_FIXES.get(error.errno, "fix that")
    return TrainingFailed(f"cannot write to {out} ({error.strerror or error}): {fix}, {then}; {keeps}")


def diverged(out, step, what):  # -> TrainingFailed for a run whose numbers are no longer finite at step
    return TrainingFailed(f"step {step}: {what}: training diverged; {kept(out)[1]}; start again in another --out with "
                          "a lower --lr or a longer --warmup")


def load_run(out):  # -> (hparams, params, state arrays) of the run saved in out, all checked; UsageError if none
    # every check of a resumed run is here, before anything is written: what comes later trusts the state
    if not (out / STATE).is_file():
        raise UsageError(f"--resume: {out} holds no training state ({STATE}): start the run without --resume")
    hparams, params = load_params(out)  # CheckpointError names what is wrong with the weights
    try:
        with np.load(out / STATE, allow_pickle=False) as file:
            state = dict(file)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as error:
        raise damaged_state(out, f"it cannot be read: {error}") from None
    problem = state_problem(state, params)
    if problem:
        raise damaged_state(out, problem)
    model_step = read_metadata(out / "model.safetensors").get("step")
    if model_step != str(int(state["step"])):
        raise UsageError(f"--resume: {out}'s weights are from step {model_step} but its {STATE} from step "
                         f"{int(state['step'])} (a save was cut off): start a new run in another folder")
    read_log(out / LOG)  # its rows' steps, checked now; open_log keeps the rows up to the saved step
    return hparams, params, state


def damaged_state(out, problem):  # -> UsageError for a train_state.npz that cannot be resumed
    return UsageError(f"--resume: {out / STATE} is damaged ({problem}): start a new run in another folder (--init "
                      f"{out} starts it from the saved weights)")


SCALARS = {"step": "iu", "opt/step": "iu", "data_position": "iu", "seconds": "fiu", "settings": "U", "data_rng": "U"}
SETTING_CHECKS = {  # a saved setting -> is its value one that the flags could have given
    **dict.fromkeys(("batch_size", "seq_len", "eval_batches"), lambda value: type(value) is int and value >= 1),
    **dict.fromkeys(("seed", "warmup", "steps"), lambda value: type(value) is int and value >= 0),
    "lr": lambda value: type(value) in (int, float) and 0 < value < math.inf,
    "val_fraction": lambda value: type(value) in (int, float) and 0 < value < 1,
    "schedule": lambda value: value in ("cosine", "constant"),
    "data_sha256": lambda value: isinstance(value, str),
    "init": lambda value: value is None or isinstance(value, str),
}


def state_problem(state, params):  # -> what makes train_state.npz's arrays unfit to resume these params, or None
    missing = next((name for name in (*SCALARS, "data_order") if name not in state), None)
    if missing:
        return f"no {missing}"
    for name, kinds in SCALARS.items():
        if state[name].shape != () or state[name].dtype.kind not in kinds:
            return f"{name} is not a single {'text' if kinds == 'U' else 'number'}"
    step, order, position = int(state["step"]), state["data_order"], int(state["data_position"])
    if step < 0 or int(state["opt/step"]) != step:
        return f"step {step}, AdamW's step {int(state['opt/step'])}"
    try:
        settings = parse_json(str(state["settings"]))
        np.random.PCG64().state = parse_json(str(state["data_rng"]))  # what Batches.restore sets: PCG64's state
    except (ValueError, TypeError, KeyError, OverflowError) as error:
        return f"its settings or data_rng are not what was saved: {error}"
    if not isinstance(settings, dict):
        return "its settings are not a JSON object"
    wrong = next((name for name, check in SETTING_CHECKS.items() if name not in settings or not check(settings[name])),
                 None)
    if wrong:
        return f"the setting {wrong} is {settings.get(wrong, 'missing')!r}"
    if order.ndim != 1 or order.dtype.kind not in "iu" or not np.array_equal(np.sort(order), np.arange(len(order))):
        return "data_order is not an order of the data's windows"
    if not 0 <= position <= len(order):
        return f"data_position {position} is outside the order of {len(order):,} windows"
    for key, param in flatten(params):
        for moment in ("m", "v"):
            name = f"opt/{moment}/{'/'.join(map(str, key))}"
            if name not in state or state[name].shape != param.shape or state[name].dtype.kind != "f":
                found = state[name].shape if name in state else "missing"
                return f"the moment {name} should be {param.shape} floats, found {found}"
    return None


def restore_moments(template, state):  # -> optimizer state shaped like template, its leaves from state's "opt/" arrays
    def fill(node, prefix):
        if isinstance(node, dict):
            return {key: fill(value, prefix + (key,)) for key, value in node.items()}
        if isinstance(node, list):
            return [fill(value, prefix + (index,)) for index, value in enumerate(node)]
        saved = state[f"opt/{'/'.join(map(str, prefix))}"]
        return saved if isinstance(node, np.ndarray) else type(node)(saved)

    return fill(template, ())


def read_log(path):  # -> log.csv's rows, none if it is missing; UsageError when a row's step is not a whole number
    if not path.is_file():
        return []
    try:
        with path.open(newline="", encoding="utf-8") as file:
            reader, rows = csv.DictReader(file), []
            for row in reader:
                if not str(row.get("step")).isdecimal():
                    raise UsageError(f"--resume: line {reader.line_num} of {path} has the step {row.get('step')!r}, "
                                     "not a whole number: correct that line (or delete it)")
                rows.append(row)
    except (UnicodeDecodeError, csv.Error) as error:
        raise UsageError(f"--resume: {path} is not a CSV log ({error}): delete it (the run resumes, its earlier "
                         "rows are lost)") from None
    return rows


def open_log(out, step):  # -> csv writer appending to out/log.csv, which keeps only the rows up to step
    path = out / LOG
    rows = [row for row in read_log(path) if int(row["step"]) <= step] if step else []
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
    parser.add_argument("--init", "--model", metavar="SIZE|DIR",
                        help="fine-tune this official GPT-2 (124M, 355M, 774M or 1558M, downloaded on first use), or "
                        "the model in folder DIR (e.g. one trained here; a folder named like a size: ./124M); "
                        "--model DIR is the same flag")
    parser.add_argument("--vocab-size", type=whole_number(257), metavar="N",
                        help="train the model's own byte-level BPE tokenizer of N tokens (256 bytes, N - 257 merges, "
                        "<|endoftext|>) on the training part of the text first, instead of using GPT-2's 50,257: a "
                        "small vocabulary spends a CPU's time on the transformer rather than the output layer")
    parser.add_argument("--min-frequency", type=whole_number(1), metavar="N",
                        help="with --vocab-size: merge only pairs seen at least N times (2)")
    parser.add_argument("--models-dir", metavar="DIR",
                        help="folder of <size>/ folders ($GPT2_NUMPY_WEIGHTS, weights) where --init SIZE finds its "
                        "model")
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


def settings_of(args, init, saved=None, shape=None):  # -> the run's settings: the flags given, else the saved run's,
    # else defaults. saved, shape: a resumed run's settings and hparams, which flags given again must repeat
    defaults = {"batch_size": 8, "seq_len": 128, "lr": 3e-5 if init else 6e-4, "warmup": 100, "schedule": "cosine",
                "val_fraction": 0.1, "seed": 0, "eval_batches": 4}
    settings = dict(saved or defaults)
    if saved is not None:
        refuse_changes(args, {**saved, **shape})
    settings.update({name: getattr(args, name) for name in KEPT if getattr(args, name) is not None})
    if saved is not None and saved["schedule"] == "cosine" and args.steps != saved["steps"]:
        log(f"note: the cosine schedule changes: it now decays over {args.steps} steps instead of {saved['steps']}, "
            "so the learning rate from here on differs from the first run's plan")
    settings.update(steps=args.steps, eval_every=args.eval_every, save_every=args.save_every)
    return settings


def refuse_changes(args, saved):  # -> None, or UsageError for a flag given with another value than the saved run's
    # the command that started the run may be given again with --resume (Ctrl-C's advice), so equal values are fine
    given = {name: getattr(args, name) for name in (*KEPT, *SHAPE_DEFAULTS)}
    given["init"] = None if args.init is None else init_name(args.init)
    given.update(vocab_size=args.vocab_size, min_frequency=args.min_frequency)
    for name, value in given.items():
        if value is not None and value != saved.get(name):
            flag = "--init" if name == "init" else "--" + name.replace("_", "-")
            was = saved.get(name) if name != "init" or saved[name] else "none (it trained from scratch)"
            raise UsageError(f"{flag} {getattr(args, name)} differs from the saved run's {was}: a resumed run keeps "
                             "its model and settings (only --steps, --eval-every and --save-every may change); start "
                             "a new run in another folder to change them")


def init_name(init):  # -> --init as the run records it: an official size, or the model folder's absolute path
    return init if init in MODEL_SIZES else str(Path(init).resolve())


def check_out(out, resume):  # -> True when out holds a run of ours, to be claimed (and judged there) before anything
    # else; False when it is empty or missing; UsageError when this run cannot write there
    # A run of ours is a folder holding train_state.npz: only a save writes it, beside the weights of its step. Any
    # other folder with files in it is someone else's (a model, an OpenAI checkpoint, notes), never written over. Our
    # lock file does not count, and a save cut off midway (.train.save/) makes the folder ours.
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file: pass a folder (it is created if missing)")
    try:
        names = sorted(path.name for path in out.iterdir() if path.name != LOCK) if out.is_dir() else []
    except OSError as error:
        raise UsageError(f"cannot read --out {out} ({error.strerror or error}): fix its permissions or choose another "
                         "folder") from None
    if STATE in names or STAGING in names:
        return True
    if resume:
        raise UsageError(f"--resume: {out} holds no training state ({STATE}): start the run without --resume")
    if names:
        listed = ", ".join(names[:3]) + (f" and {len(names) - 3:,} more" if len(names) > 3 else "")
        raise UsageError(f"--out {out} holds files that are not a training run ({listed}): choose an empty or new "
                         "folder, so that nothing in it is written over; to continue a run, give its folder and "
                         "--resume")
    return False


@contextmanager
def claimed(out, resume):  # -> None while this process holds out's lock, out settled (see settle) and checked again
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = (out / LOCK).open("a")  # the file stays after the run, as the download lock does (see weights.locked)
    except OSError as error:
        raise cannot_write(out, error) from None
    with lock:
        if not take_lock(lock, out, "training", wait=False):
            raise UsageError(f"another training run holds {out} (it has locked {LOCK}): wait for it to end, or choose "
                             "another --out")
        try:
            with settled_if_cut(out):
                settle(out)
            if check_out(out, resume) and not resume:  # looked at again, settled: another run may have saved here
                raise UsageError(f"--out {out} already holds a training run: add --resume to continue it, or choose "
                                 "another folder")
            yield
        finally:
            release_lock(lock)


@contextmanager
def settled_if_cut(out):  # -> context in which a save may be cut off: a disk error or a second Ctrl-C stops the run
    # with one line, out settled as the next run would find it; out's lock must be held
    try:
        yield
    except OSError as error:  # --out's disk: stderr cannot be the cause, as the progress bar and log() fail quietly
        with suppress(OSError):
            settle(out)  # drops a save cut off while written (freeing its space), or moves in one cut off moving in
        raise cannot_write(out, error) from None
    except KeyboardInterrupt:  # a second Ctrl-C
        settle(out)
        saved, keeps = kept(out)
        raise Interrupted(f"stopped at once; {keeps}" + ("; continue with the same command and --resume" if saved
                                                         else "")) from None


def start_model(args):  # -> hparams, params, the folder holding the tokenizer files
    if args.init in MODEL_SIZES:
        check_models_dir(models_dir_path(args.models_dir))
        folder = ensure_model(args.init, args.models_dir)
        hparams, params = load_params(folder)
        log(f"fine-tuning GPT-2 {args.init} from {folder}")
        return hparams, params, folder
    if args.init is not None:  # a model folder: its shape, weights and tokenizer, as --model DIR loads them elsewhere
        folder = Path(args.init)
        if not folder.is_dir():
            raise UsageError(f"--init {args.init} is neither an official size ({', '.join(MODEL_SIZES)}) nor a model "
                             "folder: pass a size, or the folder of the model to fine-tune")
        hparams, params, _ = load_folder(folder)
        return hparams, params, folder
    hparams = {name: getattr(args, name) or default for name, default in SHAPE_DEFAULTS.items()}
    if hparams["n_embd"] % hparams["n_head"]:
        raise UsageError(f"--n-embd {hparams['n_embd']} must be a multiple of --n-head {hparams['n_head']}")
    hparams["n_vocab"] = args.vocab_size or GPT2_VOCAB
    log(f"training from scratch: {hparams}")
    return hparams, None, PACKAGED_VOCABULARY  # GPT-2's tokenizer, shipped with the package: nothing to download


def own_vocabulary(text, vocab_size, min_frequency, data):  # -> merges of a vocab_size-token BPE trained on text
    log(f"training a {vocab_size:,}-token tokenizer on the training part of {data}")
    merges = train_bpe(text, vocab_size, min_frequency)
    if len(merges) < merges_to_make(vocab_size):
        raise UsageError(f"--vocab-size {vocab_size}: the training part of {data} has only "
                         f"{plural(len(merges), 'pair')} to merge seen at least {min_frequency} times, which make a "
                         f"vocabulary of {257 + len(merges):,} tokens: ask for --vocab-size {257 + len(merges)} or "
                         "less, lower --min-frequency, or give more text")
    return merges


def run(argv=None):  # -> exit status
    with ExitStack() as lock:
        return run_holding(argv, lock)


def run_holding(argv, lock):  # -> exit status; lock: the ExitStack that holds out's lock, once claimed, to the end
    args = parse_args(argv)
    shape_flags = ["--" + name.replace("_", "-") for name in SHAPE_DEFAULTS if getattr(args, name) is not None]
    if args.init is not None and shape_flags:
        raise UsageError(f"--init {args.init} fine-tunes a model of its own shape: drop {shape_flags[0]}, or drop "
                         "--init to train from scratch")
    if args.init is not None and args.vocab_size:
        raise UsageError(f"--vocab-size trains a new tokenizer for a model trained from scratch, but --init "
                         f"{args.init} keeps its model's own vocabulary: drop --vocab-size, or drop --init")
    if args.min_frequency and not args.vocab_size and not args.resume:
        raise UsageError("--min-frequency sets how --vocab-size trains the tokenizer: add --vocab-size N, or drop it")
    out = args.out
    ours = check_out(out, args.resume)
    if ours:  # locked before anything is read, so that a run still going there is named as such
        lock.enter_context(claimed(out, args.resume))
    text, digest = read_text(args.data)
    if args.resume:
        hparams, params, state = load_run(out)
        saved = json.loads(str(state["settings"]))
        if saved["data_sha256"] != digest:
            raise UsageError(f"{args.data} is not the text the run in {out} trained on: pass the same --data to "
                             "--resume")
        settings, tokenizer_dir, step = settings_of(args, saved["init"], saved, hparams), out, int(state["step"])
    else:
        hparams, params, tokenizer_dir = start_model(args)
        settings, state, step = settings_of(args, args.init), None, 0
        settings.update(data_sha256=digest, init=None if args.init is None else init_name(args.init),
                        vocab_size=args.vocab_size,
                        min_frequency=(args.min_frequency or 2) if args.vocab_size else None)
        params = params or gpt2_init(hparams, settings["seed"])
    if settings["seq_len"] > hparams["n_ctx"]:
        raise UsageError(f"--seq-len {settings['seq_len']} is over the model's context of {hparams['n_ctx']} tokens: "
                         "pass a smaller --seq-len")
    merges = None
    if settings.get("vocab_size"):  # the run's own tokenizer, which never sees the held-out tail
        train_text, val_text = split_text(text, settings["val_fraction"])
        if state is None:
            merges = own_vocabulary(train_text, settings["vocab_size"], settings["min_frequency"], args.data)
        tokenizer = trained_tokenizer(merges) if merges else load_tokenizer(out)
        log(f"tokenizing {args.data} ({len(text):,} characters) with the run's {tokenizer.n_vocab:,}-token vocabulary")
        train_ids, val_ids = (np.array(tokenizer.encode(part, allowed_special="all"), dtype=np.int32)
                              for part in (train_text, val_text))
        check_parts(train_ids, val_ids, settings["seq_len"])
    else:
        tokenizer = load_tokenizer(tokenizer_dir)
        log(f"tokenizing {args.data} ({len(text):,} characters)")
        ids = tokenizer.encode(text, allowed_special="all")
        outside = next((token_id for token_id in ids if token_id >= hparams["n_vocab"]), None)
        if outside is not None:
            raise UsageError(f"the data holds the token {outside} ({tokenizer.decode([outside])!r}), outside the "
                             f"model's vocabulary of {hparams['n_vocab']} tokens: train a model with GPT-2's full "
                             "vocabulary")
        train_ids, val_ids = split_tokens(ids, settings["val_fraction"], settings["seq_len"])
    log(f"{len(train_ids):,} training tokens, {len(val_ids):,} held out")
    if not ours:
        lock.enter_context(claimed(out, resume=False))  # only now, the input known to be good, is out made
    # the tokenizer files every save holds: those of the run's own vocabulary, else of its model's folder
    write_tokenizer = partial(save_tokenizer, merges=merges) if merges else partial(copy_tokenizer, tokenizer_dir)
    token_lengths = np.array([len(tokenizer.token_bytes(token_id)) for token_id in range(tokenizer.n_vocab)])
    with settled_if_cut(out):
        # loaded arrays are read-only views of memory-mapped files: training updates copies of its own
        return train(out, write_tokenizer, hparams, map_leaves(np.array, params), state, step, settings, train_ids,
                     val_ids, token_lengths)


# a diverging run overflows float32: the checks after each step say so in one line, instead of NumPy's warnings
@np.errstate(over="ignore", invalid="ignore", divide="ignore")
def train(out, write_tokenizer, hparams, params, state, step, settings, train_ids, val_ids,
          token_lengths):  # -> exit status
    batches = Batches(train_ids, settings["seq_len"], settings["batch_size"], settings["seed"])
    opt_state = adamw_state(params)
    if state is not None:
        batches.restore(state)
        opt_state = restore_moments(opt_state, state)
    else:  # the first save, at step 0: from here on out holds a run that --resume continues
        save_run(out, write_tokenizer, hparams, params, opt_state, batches, step, 0.0, settings)
    validation = val_windows(val_ids, settings["seq_len"], settings["eval_batches"] * settings["batch_size"])
    steps, n_head = settings["steps"], hparams["n_head"]
    if step >= steps:
        log(f"{out} holds the model at step {step}; --steps {steps} asks for no more" if step else
            f"{out} holds the initial model (--steps 0)")
        return 0
    log_file, log_writer = open_log(out, step)
    tokens_per_step = settings["batch_size"] * settings["seq_len"]
    if step == 0:
        log_writer.writerow({"step": 0, **validation_row(validation, params, n_head, token_lengths), "tokens": 0,
                             "seconds": 0})

    # the seconds column counts this run's time on from the saved run's
    started = time.perf_counter() - (0.0 if state is None else float(state["seconds"]))
    train_seconds = 0.0
    with log_file, ctrl_c_stops() as stop, tqdm(total=steps, initial=step, unit="step", file=QuietStderr()) as bar:
        while step < steps and not stop.requested:
            step_start = time.perf_counter()
            inputs, targets = batches.next()
            loss, grads = loss_and_grads(inputs, targets, params, n_head)
            lr = learning_rate(step, settings["lr"], settings["warmup"], steps, settings["schedule"])
            grad_norm = clip_grads(grads)
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):  # before the update: the weights stay finite
                raise diverged(out, step + 1, f"the loss is {loss:.4g} and the gradient norm {grad_norm:.4g}")
            opt_state = adamw_step(params, grads, opt_state, lr)
            step += 1
            train_seconds += time.perf_counter() - step_start
            row = {"step": step, "train_loss": f"{loss:.6f}", "lr": f"{lr:.6g}", "grad_norm": f"{grad_norm:.4f}",
                   "tokens": step * tokens_per_step,
                   "seconds": f"{time.perf_counter() - started:.1f}"}
            if step % settings["eval_every"] == 0 or step == steps:
                row.update(validation_row(validation, params, n_head, token_lengths))
                if not math.isfinite(float(row["val_loss"])):
                    raise diverged(out, step, f"the validation loss is {row['val_loss']}")
            log_writer.writerow(row)
            log_file.flush()
            bar.set_postfix_str(f"loss {loss:.3f}" + (f", val {float(row['val_loss']):.3f} "
                                                      f"({float(row['val_bits_per_byte']):.3f} bits/byte)"
                                                      if "val_loss" in row else "") +
                                f", {(step - bar.initial) * tokens_per_step / train_seconds:,.0f} tokens/s")
            bar.update()
            if step % settings["save_every"] == 0 or step == steps or stop.requested:
                if not all(np.isfinite(leaf).all() for _, leaf in flatten(params)):  # an update that overflowed
                    raise diverged(out, step, "the weights hold NaN or infinite values")
                save_run(out, write_tokenizer, hparams, params, opt_state, batches, step,
                         time.perf_counter() - started, settings)
    if stop.requested:
        raise Interrupted(f"saved step {step} to {out}; continue with the same command and --resume")
    log(f"step {step}: saved the model to {out}; load it with --model {out}")
    return 0


class QuietStderr:
    """stderr for the progress bar, failing as quietly as log() does: losing stderr's reader (`2>&1 | head`) or room
    for it must not stop a training run."""

    def write(self, text):
        with suppress(OSError):
            sys.stderr.write(text)

    def flush(self):
        with suppress(OSError):
            sys.stderr.flush()

    def __getattr__(self, name):  # encoding, isatty, fileno: stderr's, so the bar looks as it would there
        return getattr(sys.stderr, name)


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
