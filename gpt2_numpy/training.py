"""Training GPT-2 in NumPy: the data as batches of windows, the loop (the hand-written backward, AdamW, evaluations),
and the run folder it keeps resumable. The command line is gpt2_numpy/commands/train.py (`gpt2-numpy train`).

A run's folder is a model folder in Hugging Face's layout (gpt2_numpy/save.py), which every command loads with
`--model DIR` and `transformers.GPT2LMHeadModel.from_pretrained(DIR)` reads, plus:
    train_state.npz   what --resume needs besides the weights: AdamW's moments, the step, the data order and position,
                      the RNG state and the run's settings
    log.csv           one row per step: step, train_loss, val_loss and val_bits_per_byte (at evaluations), lr,
                      grad_norm (before clipping), tokens, seconds
Every file is replaced atomically (a temporary name, then a rename). Ctrl-C finishes the step in progress, saves it and
exits with status 130; a second Ctrl-C stops at once, keeping the last save.
"""
import csv
import io
import json
import math
import signal
import time
import zipfile
from contextlib import contextmanager

import numpy as np

from gpt2_numpy.backward import loss_and_grads
from gpt2_numpy.checkpoint import load_params
from gpt2_numpy.console import log, plural, progress_bar
from gpt2_numpy.errors import Interrupted, UsageError
from gpt2_numpy.fast import lm_head, log_softmax_at, transformer
from gpt2_numpy.formats import parse_json
from gpt2_numpy.formats.safetensors import read_metadata
from gpt2_numpy.optim import adamw_state, adamw_step, clip_grads, learning_rate
from gpt2_numpy.params import flatten
from gpt2_numpy.save import atomic_write, save_model
from gpt2_numpy.tokenizer import check_in_vocabulary

STATE = "train_state.npz"
LOG = "log.csv"
LOG_FIELDS = ("step", "train_loss", "val_loss", "val_bits_per_byte", "lr", "grad_norm", "tokens", "seconds")


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


def data_tokens(text, tokenizer, n_vocab, val_fraction, seq_len, own_vocabulary):  # -> train, val: int32 arrays
    """The training and held-out tokens of text. A run's own tokenizer (own_vocabulary) never saw the held-out tail, so
    the text is split before it is tokenized; GPT-2's tokenizer splits the tokens. UsageError if a part is too short or
    a token is outside the model's vocabulary."""
    if own_vocabulary:
        train, val = (np.array(tokenizer.encode(part, allowed_special="all"), dtype=np.int32)
                      for part in split_text(text, val_fraction))
        check_parts(train, val, seq_len)
        return train, val
    ids = check_in_vocabulary(tokenizer, tokenizer.encode(text, allowed_special="all"), n_vocab, "the data",
                              "train a model with GPT-2's full vocabulary")
    return split_tokens(ids, val_fraction, seq_len)


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


def save_run(out, hparams, params, opt_state, batches, step, seconds, settings):  # -> None: out holds a resumable run
    # the weights first, then the state; each names its step, so a crash between the two renames is detected on resume
    save_model(out, hparams, params, out, metadata={"step": str(step)})
    arrays = {f"opt/{'/'.join(map(str, key))}": np.asarray(leaf) for key, leaf in flatten(opt_state)}
    arrays.update(batches.state(), step=np.array(step), seconds=np.array(seconds),
                  settings=np.array(json.dumps(settings)))
    atomic_write(out / STATE, lambda file: np.savez(file, **arrays))


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


# --- The loop ---


def train(out, hparams, params, state, step, settings, train_ids, val_ids, token_lengths):  # -> exit status
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
        log_writer.writerow({"step": 0, **validation_row(validation, params, n_head, token_lengths), "tokens": 0,
                             "seconds": 0})

    # the seconds column counts this run's time on from the saved run's
    started = time.perf_counter() - (0.0 if state is None else float(state["seconds"]))
    train_seconds = 0.0
    with log_file, ctrl_c_stops() as stop, progress_bar(total=steps, initial=step, unit="step") as bar:
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
                row.update(validation_row(validation, params, n_head, token_lengths))
            log_writer.writerow(row)
            log_file.flush()
            bar.set_postfix_str(f"loss {loss:.3f}" + (f", val {float(row['val_loss']):.3f} "
                                                      f"({float(row['val_bits_per_byte']):.3f} bits/byte)"
                                                      if "val_loss" in row else "") +
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
