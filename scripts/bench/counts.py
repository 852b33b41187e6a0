"""The default thread count against one thread (the "default count" part): the README's first-run model (2 layers, 32
wide, GPT-2's vocabulary) generating, scoring and training, and the 124M shape decoding, prefilling and taking a
training step, each timed at the default count (the cores other processes leave free, cores.free_cores) and at
set_threads(1), in turns. Run it with --busy 1 to see the two on a busy machine."""
import copy

import numpy as np

from gpt2_numpy import cores, optim, training
from gpt2_numpy.decode import generate
from gpt2_numpy.fast import gpt2, inference_layout
from gpt2_numpy.likelihood import token_log_probs
from gpt2_numpy.params import random_params
from scripts.bench.harness import in_turns, prompt_ids, row, wall_seconds

DEFAULT, ONE = "default count", "one thread"
FIRST_RUN = {"n_vocab": 50257, "n_ctx": 64, "n_embd": 32, "n_head": 2, "n_layer": 2}  # README's `train` flags
SCORED_TOKENS = 1500  # about 6 KB of English text in GPT-2's tokens
TRAIN_STEPS, TRAIN_SHAPE = 30, (4, 32)  # README's --batch-size 4 --seq-len 32


def at_count(count, run):  # -> a run of `run` at set_threads(count), or at the default count (None)
    def run_at():
        if count is None:
            cores.settings.update(threads=None, read=True)  # as if no count were given: the free cores
        else:
            cores.set_threads(count)
        run()
    return run_at


def default_rows(params_124m, n_head, repeats):  # -> rows of DEFAULT against ONE, each the median of repeats turns
    given = dict(cores.settings)
    try:
        return [speed_row(metric, per, run, repeats) for metric, per, run in cases(params_124m, n_head)]
    finally:
        cores.settings.update(given)
        cores.threads()  # OpenBLAS back at the count in force


def speed_row(metric, per, run, repeats):  # -> row of units per second (per: units of one run) at both counts
    seconds = in_turns({DEFAULT: wall_seconds(at_count(None, run)), ONE: wall_seconds(at_count(1, run))}, repeats)
    return row(metric, "higher", {name: per / s for name, s in seconds.items()}, pair=[DEFAULT, ONE])


def cases(params_124m, n_head):  # -> [(metric, units per run, run)]; params_124m: the 124M shape's, of n_head heads
    tiny = inference_layout(random_params(FIRST_RUN, seed=0))
    trained = random_params(FIRST_RUN, seed=0)
    state = optim.adamw_state(trained)
    rng = np.random.default_rng(0)
    text = rng.integers(0, FIRST_RUN["n_vocab"], SCORED_TOKENS)
    inputs, targets = (rng.integers(0, FIRST_RUN["n_vocab"], TRAIN_SHAPE) for _ in range(2))
    big = inference_layout(params_124m)
    big_params = copy.deepcopy(params_124m)  # writable (a checkpoint's are mapped read-only), and trained apart
    big_state = optim.adamw_state(big_params)
    n_vocab, n_ctx = params_124m["wte"].shape[0], params_124m["wpe"].shape[0]  # a checkpoint's (--checkpoint)
    n_new, n_train = min(128, n_ctx - 16), min(256, n_ctx)
    big_inputs, big_targets = (rng.integers(0, n_vocab, (1, n_train)) for _ in range(2))

    def train_tiny():
        for _ in range(TRAIN_STEPS):
            training.train_step(inputs, targets, trained, FIRST_RUN["n_head"], state, 1e-3)

    return [
        ("first-run model: generate 60 tokens (tok/s)", 60,
         lambda: generate(prompt_ids(4), tiny, FIRST_RUN["n_head"], 60, stop_at_eos=False)),
        (f"first-run model: score {SCORED_TOKENS} tokens (runs/s)", 1,
         lambda: token_log_probs(text, tiny, FIRST_RUN["n_head"])),
        (f"first-run model: train {TRAIN_STEPS} steps of {TRAIN_SHAPE[0]} x {TRAIN_SHAPE[1]} (steps/s)", TRAIN_STEPS,
         train_tiny),
        (f"124M shape: decode 16 -> {16 + n_new} (tok/s)", n_new,
         lambda: generate(np.array(prompt_ids(16)) % n_vocab, big, n_head, n_new, stop_at_eos=False)),
        (f"124M shape: prefill {n_ctx} tokens, last logits (runs/s)", 1,
         lambda: gpt2(np.array(prompt_ids(n_ctx)) % n_vocab, **big, n_head=n_head, last_only=True)),
        (f"124M shape: training step of 1 x {n_train} tokens (steps/s)", 1,
         lambda: training.train_step(big_inputs, big_targets, big_params, n_head, big_state, 1e-5)),
    ]
