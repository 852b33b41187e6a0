"""Training GPT-2 in NumPy: the data as batches of windows, and the loop (the hand-written backward, AdamW,
evaluations) that keeps a run's folder resumable (gpt2_numpy/runs.py). The command line is
gpt2_numpy/commands/train.py (`gpt2-numpy train`).

Ctrl-C finishes the step in progress, saves it and exits with status 130; a second Ctrl-C stops at once, keeping the
last whole save. A run that cannot go on (its folder's disk refuses a write, or the loss or the gradient norm is no
longer finite) stops with one error line naming the save it keeps, and exit status 1; bad input exits with 2.
"""
import json
import math
import signal
import time
from contextlib import contextmanager
from typing import NamedTuple, Optional

import numpy as np

from gpt2_numpy.allocator import kept_scratch, scratch
from gpt2_numpy.fast_backward import loss_and_grads, step_cores
from gpt2_numpy.console import log, plural, progress_bar
from gpt2_numpy.errors import Interrupted, UsageError
from gpt2_numpy.fast import lm_head, log_softmax_at, transformer
from gpt2_numpy.interpret.heads import PATTERNS, head_scores, repeat_length, repeated_tokens, repetition_problem
from gpt2_numpy.optim import WEIGHT_DECAY, adamw_state, adamw_step, clip_scale, global_norm, learning_rate
from gpt2_numpy.params import flatten
from gpt2_numpy.runs import HEADS, diverged, open_log, restore_moments, save_run
from gpt2_numpy.tokenizer import checked_ids, token_windows



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


PROBE_SEED = 0  # explain --heads's default seed: a run's last rows in heads.csv are the table it prints


def heads_probe(hparams, eot_id):  # -> int [2 L + 1]: <|endoftext|> R R, the probe heads.csv scores; None for a model
    # that cannot take it (<|endoftext|> outside its vocabulary, or a context under 3 tokens)
    if repetition_problem(hparams["n_vocab"], hparams["n_ctx"], eot_id):
        return None
    return repeated_tokens(hparams["n_vocab"], eot_id, repeat_length(hparams["n_ctx"]), PROBE_SEED)


def head_rows(step, probe, params, n_head):  # -> heads.csv's rows at step: every head's scores on the probe
    # the probe is both explain's prompt and its repetition: a random text said twice has a previous token to score
    scores = head_scores(probe, probe, params, n_head)
    n_layer, n_heads = scores["induction"].shape
    return [{"step": step, "layer": layer, "head": head,
             **{pattern: f"{scores[pattern][layer, head]:.6f}" for pattern in PATTERNS}}
            for layer in range(n_layer) for head in range(n_heads)]


# --- The data ---


class Batches:
    """The training tokens as non-overlapping windows of seq_len + 1 tokens (inputs and their next-token targets),
    visited in a shuffled order, a new one each epoch. Its state (order, position, RNG) is saved and restored, so a
    resumed run sees the same batches as an uninterrupted one."""

    def __init__(self, tokens, seq_len, batch_size, seed):
        self.windows, self.batch_size = token_windows(tokens, seq_len, targets=True), batch_size
        self.n_windows = len(self.windows)
        self.rng = np.random.default_rng([seed, 1])  # a stream of its own: the init's draws do not shift it
        self.order, self.position = self.rng.permutation(self.n_windows), 0

    def next(self):  # -> inputs, targets: int [batch_size, seq_len] each
        picked = []
        while len(picked) < self.batch_size:
            if self.position == self.n_windows:  # an epoch ends: a new order
                self.order, self.position = self.rng.permutation(self.n_windows), 0
            picked.append(self.order[self.position])
            self.position += 1
        windows = self.windows[np.array(picked)]
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
    n_train, _ = split_sizes(len(text), val_fraction)
    return text[:n_train], text[n_train:]


def check_parts(train, val, seq_len, says, fix):  # -> None, or UsageError when a part holds no window of seq_len + 1
    # tokens; says(name, part): what the part holds, fix: what to give instead
    for name, part in (("training", train), ("validation", val)):
        if len(part) < seq_len + 1:
            raise UsageError(f"the data is too short: {says(name, part)}, fewer than one sequence of {seq_len + 1} "
                             f"(--seq-len + 1); give {fix}, or a smaller --seq-len")


def data_tokens(text, tokenizer, n_vocab, val_fraction, seq_len, own_vocabulary):  # -> train, val: int32 arrays
    """The training and held-out tokens of text. A run's own tokenizer (own_vocabulary) never saw the held-out tail, so
    the text is split before it is tokenized; GPT-2's tokenizer splits the tokens. UsageError if a part is too short or
    a token is outside the model's vocabulary."""
    fix = "train a model with GPT-2's full vocabulary"
    if own_vocabulary:
        train, val = (np.array(checked_ids(tokenizer, part, n_vocab, "the data", fix), dtype=np.int32)
                      for part in split_text(text, val_fraction))
        check_parts(train, val, seq_len, lambda name, part: f"its {name} part has {plural(len(part), 'token')} in "
                    "the run's own vocabulary", "a longer text")
        return train, val
    return split_tokens(checked_ids(tokenizer, text, n_vocab, "the data", fix), val_fraction, seq_len)


def split_tokens(ids, val_fraction, seq_len):  # -> train, val: int32 arrays; UsageError if too short
    """The held-out tail (val_fraction of the tokens) gives the validation loss; the rest is for training. Each part
    needs at least one window of seq_len + 1 tokens (inputs and their targets)."""
    ids = np.asarray(ids, dtype=np.int32)
    n_train, _ = split_sizes(len(ids), val_fraction)
    train, val = ids[:n_train], ids[n_train:]
    check_parts(train, val, seq_len, lambda name, part: f"its {plural(len(ids), 'token')} leave {len(part):,} for "
                f"{name}", f"at least {fewest_tokens(val_fraction, seq_len):,} tokens of text")
    return train, val


def split_sizes(n_tokens, val_fraction):  # -> (training tokens, held-out tokens), or characters
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
    return token_windows(val, seq_len, n_windows, targets=True)


# --- The loop ---


class TrainingData(NamedTuple):
    """What a run reads: its tokens, the bytes each token id spells (for bits per byte), and the probe heads.csv
    scores the heads on (heads_probe; None for none)."""
    train_ids: np.ndarray  # int32 [n]
    val_ids: np.ndarray  # int32 [n_val]
    token_lengths: np.ndarray  # int [n_vocab]
    probe: Optional[np.ndarray]  # int [2 L + 1]


# a diverging run overflows float32: the checks after each step say so in one line, instead of NumPy's warnings
@np.errstate(over="ignore", invalid="ignore", divide="ignore")
def train(run, params, state, data):  # -> exit status: run (runs.Run) trained from params, or from the saved state of
    # a resumed run (None for a new one), on data (TrainingData)
    out, settings, n_head = run.out, run.settings, run.hparams["n_head"]
    batches = Batches(data.train_ids, settings.seq_len, settings.batch_size, settings.seed)
    opt_state = adamw_state(params)
    step = 0 if state is None else int(state["step"])
    if state is not None:
        batches.restore(state)
        opt_state = restore_moments(opt_state, state)
    else:  # the first save, at step 0: from here on out holds a run that --resume continues
        save_run(run, params, opt_state, batches, step, 0.0)
    validation = val_windows(data.val_ids, settings.seq_len, settings.eval_batches * settings.batch_size)
    steps = settings.steps
    if step >= steps:
        log(f"{out} holds the model at step {step}; --steps {steps} asks for no more" if step else
            f"{out} holds the initial model (--steps 0)")
        return 0
    log_file, log_writer = open_log(out, step)
    heads_file, heads_writer = open_log(out, step, HEADS)
    tokens_per_step = settings.batch_size * settings.seq_len

    def evaluate(row):  # -> the heads' best induction score (None without a probe); row gains the validation
        # loss, heads.csv the heads' rows
        row.update(validation_row(validation, params, n_head, data.token_lengths))
        if not math.isfinite(float(row["val_loss"])):
            raise diverged(out, row["step"], f"the validation loss is {row['val_loss']}")
        if data.probe is None:
            return None
        rows = head_rows(row["step"], data.probe, params, n_head)
        heads_writer.writerows(rows)
        heads_file.flush()
        return max(float(head["induction"]) for head in rows)

    if step == 0:
        first = {"step": 0, "tokens": 0, "seconds": 0}
        evaluate(first)
        log_writer.writerow(first)

    # the seconds column: the time spent in training steps, summed over the run and the runs it resumes, so that no
    # row counts an evaluation or a save, which --eval-every, --save-every and where a run was resumed would add
    seconds = 0.0 if state is None else float(state["seconds"])
    train_seconds = 0.0  # this run's share, for the bar's tokens/s
    with log_file, heads_file, ctrl_c_stops() as stop, progress_bar(total=steps, initial=step, unit="step") as bar:
        while step < steps and not stop.requested:
            step_start = time.perf_counter()
            inputs, targets = batches.next()
            lr = learning_rate(step, settings.lr, settings.warmup, steps, settings.schedule)
            loss, grad_norm = train_step(inputs, targets, params, n_head, opt_state, lr, settings.weight_decay)
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):  # no update was made: the weights stay finite
                raise diverged(out, step + 1, f"the loss is {loss:.4g} and the gradient norm {grad_norm:.4g}")
            step += 1
            step_seconds = time.perf_counter() - step_start
            seconds, train_seconds = seconds + step_seconds, train_seconds + step_seconds
            row = {"step": step, "train_loss": f"{loss:.6f}", "lr": f"{lr:.6g}", "grad_norm": f"{grad_norm:.4f}",
                   "tokens": step * tokens_per_step, "seconds": f"{seconds:.1f}"}
            evaluated = step % settings.eval_every == 0 or step == steps
            induction = evaluate(row) if evaluated else None
            log_writer.writerow(row)
            log_file.flush()
            # drawn with the count by update(): set_postfix_str's own redraw would show step s's numbers beside s - 1
            bar.set_postfix_str(f"loss {loss:.3f}" + (f", val {float(row['val_loss']):.3f} "
                                                      f"({float(row['val_bits_per_byte']):.3f} bits/byte)"
                                                      if "val_loss" in row else "") +
                                (f", induction {induction:.2f}" if induction is not None else "") +
                                f", {(step - bar.initial) * tokens_per_step / train_seconds:,.0f} tokens/s",
                                refresh=False)
            bar.update()
            if step % settings.save_every == 0 or step == steps or stop.requested:
                if not all(np.isfinite(leaf).all() for _, leaf in flatten(params)):  # an update that overflowed
                    raise diverged(out, step, "the weights hold NaN or infinite values")
                save_run(run, params, opt_state, batches, step, seconds)
    if stop.requested and step < steps:  # a Ctrl-C during the last step or save: the run is complete
        raise Interrupted(f"saved step {step} to {out}; continue with the same command and --resume")
    log(f"step {step}: saved the model to {out}; load it with --model {out}")
    return 0


def train_step(inputs, targets, params, n_head, opt_state, lr, weight_decay=WEIGHT_DECAY):  # -> (loss, gradient norm);
    # params, opt_state updated
    """One training step: the loss and gradients, clipping and AdamW, updating params and opt_state in place; no
    update where the loss or the gradient norm is not finite. The step's two largest arrays (its logits and wte's
    gradient) stay allocated for the next step, on this thread; allocator.release_scratch() frees them."""
    # one cores.all_cores() for the whole step, not one per part: every product and pass of it runs on our team, with
    # OpenBLAS on one thread whose workers never spin beside ours. The two arrays too large for glibc's heap kept, with
    # or without keep_freed_memory(): else their pages are faulted in anew at every step
    wte = params["wte"]
    with step_cores(inputs, wte.shape[1]), kept_scratch():
        loss, grads = loss_and_grads(inputs, targets, params, n_head, scratch("d_wte", wte.shape, wte.dtype))
        grad_norm = global_norm(grads)
        if math.isfinite(loss) and math.isfinite(grad_norm):  # clipped within AdamW's passes, not by one of its own
            adamw_step(params, grads, opt_state, lr, weight_decay=weight_decay, grad_scale=clip_scale(grad_norm))
    return loss, grad_norm


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
