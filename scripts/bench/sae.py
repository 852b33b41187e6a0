"""SAE training speed: activations per second of a topk SAE's training step here (gpt2_numpy/sae_training.py's
train_step, which runs sae_fast.py's step) against SAELens's own trainer, `SAETrainer.fit` on a `TopKTrainingSAE`,
at the same size, batch and architecture, torch on as many threads as NumPy's BLAS uses.

    python -m scripts.bench.sae          # ours, and SAELens's where sae-lens is installed (pip install sae-lens)

Both train on the same fixed pseudo-random batches (64 numbers each, 512 latents, k = 8, batches of 4,096, as the
issue's measure); the engines take turns, and each time is the median of --repeats runs of STEPS steps after a warm-up.
SAELens's time is fit()'s, its trainer built beforehand. scripts/benchmark.py runs this as its "sae" part; the goal is
at least 2x SAELens's activations per second.
"""
import argparse
import importlib.util
import time

import numpy as np

from gpt2_numpy import keep_freed_memory
from gpt2_numpy.sae_training import DEAD_AFTER, SaeSettings, init_params, train_step
from gpt2_numpy.optim import adamw_state
from scripts.bench.harness import OURS, blas_threads, comparison_table, in_turns, row

SAE_LENS = "SAELens"
D_IN, D_SAE, K, BATCH, STEPS, LR = 64, 512, 8, 4096, 10, 4e-4
GOAL = 2.0  # ours / SAELens's activations per second


def batches():  # -> STEPS fixed pseudo-random batches [BATCH, D_IN]
    rng = np.random.default_rng(0)
    return [rng.standard_normal((BATCH, D_IN), dtype=np.float32) for _ in range(STEPS)]


def our_measure(data):  # -> measure(): seconds of STEPS training steps here, as sae_training.train_sae runs them
    settings = SaeSettings(architecture="topk", d_in=D_IN, d_sae=D_SAE, k=K, l1=0.0, lr=LR, batch_size=BATCH, seed=0,
                           hook=None, source="bench", data_sha256="", seq_len=None, buffer=BATCH, steps=STEPS,
                           save_every=STEPS)
    params = init_params(settings, data[0])
    state, since_fired = adamw_state(params), np.zeros(D_SAE, np.int64)

    def measure():
        start = time.perf_counter()
        for x in data:
            _, stats = train_step(x, params, state, LR, settings, since_fired >= DEAD_AFTER)
            since_fired[:] += len(x)
            since_fired[stats["fired"]] = 0
        return time.perf_counter() - start
    return measure


def sae_lens_measure(data):  # -> measure(): seconds of SAELens's SAETrainer.fit over the same STEPS batches
    import torch
    from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.training.sae_trainer import SAETrainer, SAETrainerConfig

    torch.set_num_threads(blas_threads())
    batches_torch = [torch.from_numpy(x) for x in data]

    def measure():
        sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, k=K))
        trainer = SAETrainer(SAETrainerConfig(total_training_samples=STEPS * BATCH, train_batch_size_samples=BATCH,
                                              lr=LR, lr_end=LR), sae, iter(batches_torch))
        start = time.perf_counter()
        trainer.fit()
        return time.perf_counter() - start
    return measure


def sae_rows(repeats, theirs=SAE_LENS):  # -> the table's rows (SAELens's values under theirs, where installed;
    # scripts/benchmark.py's table has one column for the other engine, so there the row names SAELens)
    data = batches()
    measures, missing = {OURS: our_measure(data)}, None
    try:
        measures[theirs] = sae_lens_measure(data)
    except ImportError as error:  # ours alone; the row says how to compare
        missing = error
    seconds = in_turns(measures, repeats)
    metric = f"topk SAE training, {D_IN} -> {D_SAE} latents, k {K}, batch {BATCH:,}: activations/s"
    if theirs not in seconds and importlib.util.find_spec("sae_lens") is not None:  # installed, but broken
        metric += f" (sae-lens is installed but fails to import: {missing}; fix it to compare with SAELens's)"
    elif theirs not in seconds:
        metric += " (pip install sae-lens to compare with SAELens's SAETrainer)"
    elif theirs != SAE_LENS:
        metric += f" ({theirs}'s column: SAELens's SAETrainer)"
    return [row(metric, "higher", {name: STEPS * BATCH / value for name, value in seconds.items()})]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    keep_freed_memory()
    rows = sae_rows(args.repeats)
    print(f"BLAS threads {blas_threads()}, numpy {np.__version__}\n")
    names = [OURS, SAE_LENS] if SAE_LENS in rows[0] else [OURS]
    print("\n".join(comparison_table(rows, names)))
    if SAE_LENS in rows[0]:
        ratio = rows[0][OURS] / rows[0][SAE_LENS]
        verdict = "met" if ratio >= GOAL else "MISSED"
        print(f"\ngoal: at least {GOAL:g}x SAELens's activations/s: {ratio:.2f}x, {verdict}")


if __name__ == "__main__":
    main()
