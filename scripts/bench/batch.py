"""Batched generation (the "batched generate" part): whole generate calls, prefill included, in tokens per second over
all rows; ours (generate_batch) against HF's batched generate with left padding and an attention mask."""
from scripts.bench.harness import batch_prompts, in_turns, row, wall_seconds

RAGGED_LENGTHS = [1, 29, 57, 86, 114, 143, 171, 200]


def batch_rows(engines, repeats):
    cases = [(1, [16], 128, engines), (8, [16] * 8, 128, engines), (32, [16] * 32, 128, engines[:1]),
             ("8 ragged", RAGGED_LENGTHS, 64, engines)]
    rows = []
    for label, lengths, n_new, which in cases:
        prompts = batch_prompts(lengths)
        seconds = in_turns({e.name: wall_seconds(lambda e=e: e.batch_seconds(prompts, n_new)) for e in which}, repeats)
        speed = {name: len(prompts) * n_new / s for name, s in seconds.items()}
        what = f"{label} prompts of {lengths[0]} tokens" if label != "8 ragged" else "8 ragged prompts (1-200 tokens)"
        rows.append(row(f"generate, {what} + {n_new} new each, total (tok/s)", "higher", speed))
    return rows
