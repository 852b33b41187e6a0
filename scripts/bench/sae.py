"""SAE training speed: activations per second of a topk SAE's training step here (gpt2_numpy/sae/training.py's
train_step, which runs sae/fast.py's step) against SAELens's own trainer, `SAETrainer.fit` on a `TopKTrainingSAE`,
at the same size, batch and architecture, torch on as many threads as NumPy's BLAS uses.

    python -m scripts.bench.sae          # ours, and SAELens's where sae-lens is installed (pip install sae-lens)
    python -m scripts.bench.sae --sizes gpt2   # GPT-2 small's residual alone

Two sizes (SIZES): "small", 64 numbers an activation, 512 latents, k 8; and "gpt2", GPT-2 small's residual, 768
numbers, 24,576 latents, k 32; batches of 4,096 both. Both engines train on the same fixed pseudo-random batches of the
size; they take turns, and each time is the median of --repeats runs of the size's steps after a warm-up. SAELens's time
is fit()'s, its trainer built beforehand. scripts/benchmark.py runs this as its "sae" part; the goal is at least 2x
SAELens's activations per second at each size.
"""
import argparse
import importlib.util
import time
from typing import NamedTuple

import numpy as np

from gpt2_numpy import keep_freed_memory
from gpt2_numpy.sae.training import DEAD_AFTER, SaeSettings, init_params, train_step
from gpt2_numpy.optim import adamw_state
from scripts.bench.harness import OURS, blas_threads, comparison_table, in_turns, row

SAE_LENS = "SAELens"
LR = 4e-4
GOAL = 2.0  # ours / SAELens's activations per second


class Size(NamedTuple):
    d_in: int
    d_sae: int
    k: int
    batch: int
    steps: int  # per timed run: few at the large size, whose step takes seconds


SIZES = {"small": Size(64, 512, 8, 4096, 10), "gpt2": Size(768, 24576, 32, 4096, 2)}


def batches(size):  # -> size.steps fixed pseudo-random batches [batch, d_in]
    rng = np.random.default_rng(0)
    return [rng.standard_normal((size.batch, size.d_in), dtype=np.float32) for _ in range(size.steps)]


def our_measure(data, size):  # -> measure(): seconds of the size's training steps here, as sae/training.py's
    # train_sae runs them
    settings = SaeSettings(architecture="topk", d_in=size.d_in, d_sae=size.d_sae, k=size.k, l1=0.0, lr=LR,
                           batch_size=size.batch, seed=0, hook=None, source="bench", data_sha256="", seq_len=None,
                           buffer=size.batch, steps=size.steps, save_every=size.steps)
    params = init_params(settings, data[0])
    state, since_fired = adamw_state(params), np.zeros(size.d_sae, np.int64)

    def measure():
        start = time.perf_counter()
        for x in data:
            _, stats = train_step(x, params, state, LR, settings, since_fired >= DEAD_AFTER)
            since_fired[:] += len(x)
            since_fired[stats["fired"]] = 0
        return time.perf_counter() - start
    return measure


def sae_lens_measure(data, size):  # -> measure(): seconds of SAELens's SAETrainer.fit over the same batches
    import torch
    from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.training.sae_trainer import SAETrainer, SAETrainerConfig

    torch.set_num_threads(blas_threads())
    batches_torch = [torch.from_numpy(x) for x in data]

    def measure():
        sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=size.d_in, d_sae=size.d_sae, k=size.k))
        trainer = SAETrainer(SAETrainerConfig(total_training_samples=size.steps * size.batch,
                                              train_batch_size_samples=size.batch, lr=LR, lr_end=LR),
                             sae, iter(batches_torch))
        start = time.perf_counter()
        trainer.fit()
        return time.perf_counter() - start
    return measure


def sae_rows(repeats, theirs=SAE_LENS, sizes=tuple(SIZES)):  # -> the table's rows, one per size (SAELens's values
    # under theirs, where installed; scripts/benchmark.py's table has one column for the other engine, so there the
    # row names SAELens)
    return [size_row(SIZES[name], repeats, theirs) for name in sizes]


def size_row(size, repeats, theirs):  # -> the row of one size
    data = batches(size)
    measures, missing = {OURS: our_measure(data, size)}, None
    try:
        measures[theirs] = sae_lens_measure(data, size)
    except ImportError as error:  # ours alone; the row says how to compare
        missing = error
    seconds = in_turns(measures, repeats)
    metric = (f"topk SAE training, {size.d_in} -> {size.d_sae:,} latents, k {size.k}, batch {size.batch:,}: "
              "activations/s")
    if theirs not in seconds and importlib.util.find_spec("sae_lens") is not None:  # installed, but broken
        metric += f" (sae-lens is installed but fails to import: {missing}; fix it to compare with SAELens's)"
    elif theirs not in seconds:
        metric += " (pip install sae-lens to compare with SAELens's SAETrainer)"
    elif theirs != SAE_LENS:
        metric += f" ({theirs}'s column: SAELens's SAETrainer)"
    return row(metric, "higher", {name: size.steps * size.batch / value for name, value in seconds.items()})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", nargs="+", choices=SIZES, default=list(SIZES), help="(default: all)")
    args = parser.parse_args(argv)
    keep_freed_memory()
    rows = sae_rows(args.repeats, sizes=args.sizes)
    print(f"BLAS threads {blas_threads()}, numpy {np.__version__}\n")
    names = [OURS, SAE_LENS] if SAE_LENS in rows[0] else [OURS]
    print("\n".join(comparison_table(rows, names)))
    for name, measured in zip(args.sizes, rows):
        if SAE_LENS in measured:
            ratio = measured[OURS] / measured[SAE_LENS]
            verdict = "met" if ratio >= GOAL else "MISSED"
            print(f"\ngoal, {name}: at least {GOAL:g}x SAELens's activations/s: {ratio:.2f}x, {verdict}")


if __name__ == "__main__":
    main()
