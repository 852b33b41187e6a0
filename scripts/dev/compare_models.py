"""Two versions of the tuned pass (gpt2_numpy/fast.py, whose new_cache and gpt2_cached every command runs) side by
side, interleaved in one process on the same weights: prefill and decode times.

    git show 3a1eaa7:gpt2_numpy/fast.py > /tmp/fast_before.py
    python -m scripts.dev.compare_models /tmp/fast_before.py gpt2_numpy/fast.py --checkpoint /tmp/gpt2-tf-124M

The machine drifts between runs, so only ratios from one interleaved run mean anything: the two versions take turns,
--repeats times, and the medians are compared. The checkpoint is a 124M TF folder (the real one, or a 124M-shaped one
from `python -m scripts.fixtures.make_tf_fixture --config 124M --out DIR`).
"""
import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np

from gpt2_numpy import keep_freed_memory
from gpt2_numpy.formats.checkpoint import load_params
from gpt2_numpy.errors import Gpt2NumpyError

REPO = Path(__file__).resolve().parents[2]


def load_module(path, name):  # -> the module in the file at path
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prefill_seconds(model, params, n_head, ids, last_only):
    cache = model.new_cache(params["wpe"], params["blocks"], n_head)
    start = time.perf_counter()
    model.gpt2_cached(ids, cache, **params, n_head=n_head, last_only=last_only)
    return time.perf_counter() - start


def decode_speed(model, params, n_head, ids, n_new=32):  # -> tokens/s of n_new cached steps after 16 prompt tokens
    cache = model.new_cache(params["wpe"], params["blocks"], n_head)
    model.gpt2_cached(ids[:16], cache, **params, n_head=n_head, last_only=True)
    start = time.perf_counter()
    for token in ids[16 : 16 + n_new]:
        model.gpt2_cached([int(token)], cache, **params, n_head=n_head, last_only=True)
    return n_new / (time.perf_counter() - start)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="the fast.py to compare against")
    parser.add_argument("after", type=Path, help="the fast.py under test")
    parser.add_argument("--checkpoint", type=Path, default=REPO / "weights" / "124M",
                        help="a model folder of the 124M shape (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="turns of each version (3)")
    args = parser.parse_args(argv)

    def fail(message):  # -> never returns: one error line, the status of a bad argument
        parser.exit(2, f"error: {message}\n")

    if args.repeats < 1:
        fail(f"--repeats {args.repeats}: a median needs at least 1 turn")
    models = {}
    for name in ("before", "after"):
        path = getattr(args, name)
        if not path.is_file():
            fail(f"{name} {path} is not a file: pass a version of gpt2_numpy/fast.py")
        models[name] = load_module(path, f"fast_{name}")
        if not all(hasattr(models[name], function) for function in ("new_cache", "gpt2_cached")):
            fail(f"{name} {path} has no new_cache and gpt2_cached: pass a version of gpt2_numpy/fast.py")
    keep_freed_memory()  # as the CLIs do
    try:
        hparams, params = load_params(args.checkpoint)
    except Gpt2NumpyError as error:
        fail(f"--checkpoint: {error}")
    n_head, n_ctx = hparams["n_head"], hparams["n_ctx"]
    ids = np.random.default_rng(0).integers(0, hparams["n_vocab"], n_ctx)
    measures = {
        f"prefill {n_ctx} tokens, last logits (s)": lambda m: prefill_seconds(m, params, n_head, ids, True),
        f"prefill {n_ctx} tokens, all logits (s)": lambda m: prefill_seconds(m, params, n_head, ids, False),
        "decode after 16 tokens (tok/s)": lambda m: decode_speed(m, params, n_head, ids),
    }
    results = {(what, name): [] for what in measures for name in models}
    for _ in range(args.repeats):  # in turns, so a drifting machine slows both alike
        for name, model in models.items():
            for what, measure in measures.items():
                results[what, name].append(measure(model))
    print("| measure | before | after | after / before |\n|---|---|---|---|")
    for what in measures:
        before, after = (float(np.median(results[what, name])) for name in models)
        print(f"| {what} | {before:.3g} | {after:.3g} | {after / before:.3f} |")


if __name__ == "__main__":
    main()
