"""What bounds the benchmark's parts on this machine, per thread count: how fast the cores read memory and multiply.

    python -m scripts.dev.bounds [--threads 1 2]
    python -m scripts.dev.bounds --line [--busy 1]
    python -m scripts.dev.bounds --few-rows [--threads 1 2]

- decode: one step reads every weight of the 124M model once (124 M floats, 495 MB); the best rate at which products
  stream weights from memory (scripts/bench/roofline.py: `wte @ x`, and one row times 28 [768, 3072] weights) gives
  the fewest seconds a step can take, and so the most tokens a second;
- products: the best rate of large products ([1024, 768] × [768, 3072], a prefill's MLP, and 2048³), in GFLOP/s:
  the benchmark's bounds on each row come from these two rates (roofline.py);
- the training step of `--only training` (4 layers × 256 wide, 8 × 128 tokens, GPT-2's 50,257 tokens): the time of its
  lm head's three products (the logits, their gradient into the hidden state and into wte) and of one elementwise pass
  over the logits (np.exp), which no step can do without; then a floor for a step of NumPy's kernels: those three
  products, its blocks' linear layers alone, forward and backward, each thread its share of the sequences at once as
  a step shares them (fast_backward's functions), and at the read rate the bytes of the two passes no such step can do
  without, the logits' exp (each logit read and written once: NumPy has no product that applies it as it writes) and
  AdamW's (every weight's param, gradient and both moments read, all but the gradient written);
- a batch of 8's decode step: its products alone, 8 rows through every layer's four weights (fast.linear) and the lm
  head (fast.lm_head), on seeded random weights of the 124M shape laid out as generate lays them out;
- once, for cores.py's design: the CPU time OpenBLAS's idle workers take in a 0.3 s sleep after a product on 2
  threads (their spin), what handing a piece to a thread of our pool costs (a split of no work, on 2 threads), and the
  share of GELU's time on [1024, 3072] that its chunks' calls hold the GIL for (the same calls on one element), at
  chunks of 2^15 and of fast.CHUNK.
Each time is the median of 5 runs (3 for the exp pass and the batch step's) after a warm-up, as the benchmark's are
(the two rates: the best of 7; the training step's products, which make its floor: the best of 5); the arrays are
seeded random float32.

--line measures where cores.NARROW stands instead: models of GPT-2's vocabulary and widths from 32 to 768 decode 20
tokens after a 1-token prompt and run a pass of 128 positions, on OpenBLAS's 2 threads (set_threads(2)) and on one, in
turns, 5 times each (medians); every pass of a model narrower than NARROW runs on one thread whatever the count, so
the line is lifted (NARROW = 1) while it measures. --busy N does it beside N CPU-bound processes.

--few-rows times, at each count of --threads, a batch of 8's products alone in each form they could take: x @ w with
every weight row-major, the same column-major, both in pieces (fast.few_rows_product, shared among the cores as a
batch's step shares them), and the lm head as x @ wteᵀ and in pieces (medians of 5, each form after OpenBLAS's
workers sleep), then one sequence's decode step: its products of one row, x @ w in either order and as dot products
(fast.dot_products, NumPy's vecdot over wᵀ's rows), and its lm head both ways. Which wins depends on OpenBLAS's kernels
(printed); OPENBLAS_CORETYPE=Haswell gives an AVX-512 machine the AVX2 kernels that AMD's Zen runs too.
"""
import argparse
import math
import time
from contextlib import nullcontext

import numpy as np

from gpt2_numpy import cores, fast, fast_backward
from gpt2_numpy.console import plural
from gpt2_numpy.params import random_params
from scripts.bench import busy, roofline
from scripts.bench.harness import HPARAMS_124M, fail, in_turns, median_seconds, wall_seconds
from scripts.bench.train import CONFIGS

TRAINING_HPARAMS, TRAINING_SHAPE = CONFIGS["4 layers x 256 wide, 8 x 128 tokens"]  # --only training's step
TRAINING_REPEATS = 5  # the floor's products are the best of this many runs, as the rates are the best of theirs
ADAMW_PASSES = 7  # floats AdamW moves a weight: its param, gradient and two moments read, all but the gradient written


def bounds_lines(count, rng, params):  # -> the printed lines for `count` threads
    cores.set_threads(count)
    read_rate, flop_rate = roofline.measured_rates()
    step_bytes = roofline.FLOAT * roofline.n_weights(HPARAMS_124M)
    n_positions, n_vocab = math.prod(TRAINING_SHAPE), TRAINING_HPARAMS["n_vocab"]
    hidden = rng.standard_normal((n_positions, TRAINING_HPARAMS["n_embd"]), dtype=np.float32)
    head = rng.standard_normal((n_vocab, TRAINING_HPARAMS["n_embd"]), dtype=np.float32)
    grad = rng.standard_normal((n_positions, n_vocab), dtype=np.float32)
    # each into an array made once, as a step's (allocator.scratch, train_step's d_wte): a new one a time would add
    # its page faults
    logits, d_hidden, d_head = np.empty_like(grad), np.empty_like(hidden), np.empty_like(head)
    products = [roofline.best_seconds(product, TRAINING_REPEATS) for product in (
        lambda: np.matmul(hidden, head.T, out=logits), lambda: np.matmul(grad, head, out=d_hidden),
        lambda: np.matmul(grad.T, hidden, out=d_head))]
    exp_pass = median_seconds(lambda: np.exp(grad), 3)
    blocks = roofline.best_seconds(training_blocks_products(rng, count), TRAINING_REPEATS)
    exp_bytes, adamw_bytes = 2 * grad.nbytes, ADAMW_PASSES * roofline.FLOAT * training_weights()
    floor = sum(products) + blocks + (exp_bytes + adamw_bytes) / read_rate
    n_embd = HPARAMS_124M["n_embd"]
    rows, wide = (rng.standard_normal((8, n), dtype=np.float32) for n in (n_embd, 4 * n_embd))
    batch_products = median_seconds(lambda: batch_step_products(rows, wide, params), 3)
    return [f"{plural(count, 'thread')}:",
            f"  memory read (the best of wte @ x and one row times 28 weights): {read_rate / 1e9:.1f} GB/s; a decode "
            f"step reads {step_bytes / 1e6:.0f} MB of weights: at least {step_bytes / read_rate * 1e3:.1f} ms, at most "
            f"{read_rate / step_bytes:.1f} tokens/s",
            f"  products (the best of [1024, 768] x [768, 3072] and 2048³): {flop_rate / 1e9:.0f} GFLOP/s",
            f"  training step's lm head: logits {products[0]:.3f} s, gradient into the hidden state "
            f"{products[1]:.3f} s, into wte {products[2]:.3f} s, together {sum(products):.3f} s; one pass over the "
            f"logits (np.exp) {exp_pass:.3f} s",
            f"  training step's floor: those products, its blocks' linear layers alone, forward and backward "
            f"{blocks:.3f} s, and at the read rate the logits' exp pass ({exp_bytes / 1e6:.0f} MB) "
            f"{exp_bytes / read_rate:.3f} s and AdamW's ({adamw_bytes / 1e6:.0f} MB) {adamw_bytes / read_rate:.3f} s: "
            f"together {floor:.3f} s",
            f"  a batch of 8's decode step, its products alone (every weight, 8 rows): {batch_products * 1e3:.1f} ms"]


def training_blocks_products(rng, count):  # -> run(): the training step's blocks' linear layers, forward and
    # backward, on count threads, each alone on its share of the sequences at once, as fast_backward.by_sequences
    # shares them (all on one thread where count does not divide the sequences)
    n_sequences, n_seq = TRAINING_SHAPE
    shares = count if n_sequences % count == 0 else 1
    n_rows = n_sequences * n_seq // shares
    layers = [(layer["w"], layer["b"]) for block in random_params(TRAINING_HPARAMS, seed=0)["blocks"]
              for layer in linear_layers(block)]
    inputs = [(rng.standard_normal((shares, n_rows, w.shape[0]), dtype=np.float32),
               rng.standard_normal((shares, n_rows, w.shape[1]), dtype=np.float32)) for w, _ in layers]

    def share(piece):  # this thread's rows through every layer's product forward, then both backward
        with cores.one_core():
            for rank in range(piece.start, piece.stop):
                for (w, b), (x, _) in zip(layers, inputs):
                    fast_backward.linear_forward(x[rank], w, b)
                for (w, _), (x, d_out) in zip(layers[::-1], inputs[::-1]):
                    fast_backward.linear_backward(d_out[rank], x[rank], w)

    def run():  # on the threads set_threads(count) gave
        with cores.all_cores():
            cores.split(share, shares, item_size=cores.MIN_WORK)
    return run


def training_weights():  # -> the floats AdamW updates: every weight of the model, wpe's too
    return roofline.n_weights(TRAINING_HPARAMS) + TRAINING_HPARAMS["n_ctx"] * TRAINING_HPARAMS["n_embd"]


def few_rows_lines(counts):  # -> the printed lines of --few-rows: a batch of 8's products, and one row's, in each form
    rng = np.random.default_rng(0)
    params = random_params(HPARAMS_124M, seed=0)
    weights = [layer["w"] for block in params["blocks"] for layer in linear_layers(block)]
    column_major = [np.asfortranarray(w) for w in weights]
    inputs = {n: rng.standard_normal((8, n), dtype=np.float32) for n in {len(w) for w in weights}}
    rows, wte = inputs[HPARAMS_124M["n_embd"]], params["wte"]
    forms = {  # every weight in turn, as a step reads them: 340 MB, streamed from memory
        "x @ w, w row-major": lambda: [inputs[len(w)] @ w for w in weights],
        "x @ w, w column-major": lambda: [inputs[len(w)] @ w for w in column_major],
        "x @ w in pieces (fast.few_rows_product), w row-major, shared among the cores":
            lambda: shared(lambda: [fast.few_rows_product(inputs[len(w)], w) for w in weights]),
        "(wᵀ xᵀ)ᵀ in pieces (fast.few_rows_product), w column-major, shared among the cores":
            lambda: shared(lambda: [fast.few_rows_product(inputs[len(w)], w) for w in column_major]),
        "the lm head, x @ wteᵀ": lambda: rows @ wte.T,
        "the lm head, (wte xᵀ)ᵀ in pieces (fast.few_rows_product), shared among the cores":
            lambda: shared(lambda: fast.few_rows_product(rows, wte.T)),
    }
    one = {n: x[:1] for n, x in inputs.items()}  # a decode step of one sequence: one row
    one_row_forms = {
        "x @ w, w row-major": lambda: [one[len(w)] @ w for w in weights],
        "x @ w, w column-major": lambda: [one[len(w)] @ w for w in column_major],
        "dot products (fast.dot_products), w column-major": lambda: [fast.dot_products(one[len(w)], w)
                                                                     for w in column_major],
        "the lm head, x @ wteᵀ": lambda: rows[:1] @ wte.T,
        "the lm head, dot products (fast.dot_products)": lambda: fast.dot_products(rows[:1], wte.T),
    }
    lines = []
    for title, n_rows, step_forms in [("a batch of 8's", 8, forms), ("one sequence's", 1, one_row_forms)]:
        lines.append(f"{title} decode step, its products alone (every weight of the 124M shape, "
                     f"{plural(n_rows, 'row')}), OpenBLAS's kernels {cores.openblas_core()}, ms:")
        for count in counts:
            cores.set_threads(count)
            lines += [f"{plural(count, 'thread')}:"] + [f"  {name}: {after_spin(form) * 1e3:.1f}"
                                                       for name, form in step_forms.items()]
    return lines


def after_spin(form):  # -> median_seconds(form, 5) once OpenBLAS's workers, spinning after a form before, sleep: they
    # would take the core of a thread of ours (cores.py), which a batch's step, every product in a pass, never meets
    time.sleep(0.3)
    return median_seconds(form, 5)


def shared(products):  # -> products(), run as a batch's decode step runs them: in a pass on every core
    with cores.all_cores():
        return products()


def linear_layers(block):  # -> a block's four linear layers, in the order a step runs them
    return block["attn"]["c_attn"], block["attn"]["c_proj"], block["mlp"]["c_fc"], block["mlp"]["c_proj"]


def batch_step_products(rows, wide, params):  # rows [8, n_embd], wide [8, 4 n_embd]: each weight's input in a step
    step, wide_step = rows[:, None], wide[:, None]  # [8, 1, ...]: the shape of a batch's decode step (fast.batch_step)
    with cores.all_cores(enabled=fast.shares_cores(step)):  # as fast.transformer runs a batch's step
        for block in params["blocks"]:
            for layer in linear_layers(block):
                fast.linear(wide_step if len(layer["w"]) > rows.shape[-1] else step, **layer)
    fast.lm_head(step, params["wte"])


def threading_lines(rng):  # -> the printed lines on OpenBLAS's spin, a hand-over and the GIL
    cores.set_threads(2)
    a = rng.standard_normal((1024, 1024), dtype=np.float32)
    a @ a  # OpenBLAS's workers, on 2 threads, then spin
    cpu = time.process_time()
    time.sleep(0.3)
    spin = time.process_time() - cpu
    with cores.all_cores():
        hand_over = median_seconds(lambda: cores.split(lambda piece: None, 2), 5)
    x, one, out = rng.standard_normal((1024, 3072), dtype=np.float32), np.ones(1, np.float32), np.empty(1, np.float32)
    shares, default = [], fast.CHUNK
    for chunk in (1 << 15, default):
        fast.CHUNK = chunk  # read by fast.in_chunks at each call
        try:
            with cores.one_core():
                gelu_seconds = median_seconds(lambda: fast.gelu(x), 5)
        finally:
            fast.CHUNK = default
        n_chunks = -(-x.size // chunk)
        with np.errstate(over="ignore"):
            calls = median_seconds(lambda n=n_chunks: [fast.gelu_chunk(one, out=out) for _ in range(n)], 5)
        shares.append(f"chunks of {chunk:,}: {calls / gelu_seconds:.0%} of {gelu_seconds * 1e3:.1f} ms")
    return ["cores.py:",
            f"  OpenBLAS's spin: {spin:.3f} s of CPU in a 0.3 s sleep after a product on 2 threads",
            f"  a hand-over to a thread of the pool (a split of no work on 2 threads): {hand_over * 1e6:.0f} us",
            f"  GELU's calls on [1024, 3072] hold the GIL for at most: {'; '.join(shares)}"]


LINE_WIDTHS = [32, 64, 96, 128, 192, 256, 384, 768]


def line_lines():  # -> the printed lines: a model's passes at 2 threads over 1, by width
    lines, narrow = ["width: decode 20 tokens, 2 threads / 1 thread; a pass of 128 positions, the same"], cores.NARROW
    cores.NARROW = 1  # every width shares its passes as a wide model does
    try:
        for width in LINE_WIDTHS:
            hparams = {"n_vocab": 50257, "n_ctx": 256, "n_embd": width, "n_head": max(1, width // 64), "n_layer": 2}
            params = fast.inference_layout(random_params(hparams, seed=0))
            ratios = [ratio_2_over_1(run) for run in (lambda: decode_20(params, hparams["n_head"]),
                                                       lambda: fast.gpt2(np.arange(128), **params,
                                                                         n_head=hparams["n_head"], last_only=True))]
            lines.append(f"  {width}: {ratios[0]:.2f}; {ratios[1]:.2f}")
    finally:
        cores.NARROW = narrow
    return lines


def decode_20(params, n_head):
    cache = fast.new_cache(params["wpe"], params["blocks"], n_head, n_slots=21)
    for token in range(21):
        fast.gpt2_cached([token], cache, **params, n_head=n_head, last_only=True)


def ratio_2_over_1(run):  # -> run's median time on 2 threads over on one, in turns
    def at(count):
        def run_at():
            cores.set_threads(count)
            run()
        return wall_seconds(run_at)
    seconds = in_turns({2: at(2), 1: at(1)}, 5)
    return seconds[2] / seconds[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], metavar="N",
                        help="thread counts to measure at (1 2)")
    parser.add_argument("--line", action="store_true", help="measure where cores.NARROW stands, and nothing else")
    parser.add_argument("--busy", type=int, default=0, metavar="N", help="with --line: beside N CPU-bound processes")
    parser.add_argument("--few-rows", action="store_true",
                        help="time a batch of 8's products and one row's in each form (fast.few_rows_product, "
                             "fast.dot_products), and nothing else")
    args = parser.parse_args()
    if args.line:
        busy.note_if_busy()
        with busy.processes(args.busy) if args.busy else nullcontext():
            print("\n".join(line_lines()), flush=True)
        return
    if any(count < 1 for count in args.threads):
        fail(f"--threads {' '.join(map(str, args.threads))}: each count must be a whole number >= 1")
    if args.few_rows:
        print("\n".join(few_rows_lines(args.threads)), flush=True)
        return
    rng = np.random.default_rng(0)
    params = fast.inference_layout(random_params(HPARAMS_124M, seed=0))
    for count in args.threads:
        print("\n".join(bounds_lines(count, rng, params)), flush=True)
    print("\n".join(threading_lines(rng)), flush=True)


if __name__ == "__main__":
    main()
