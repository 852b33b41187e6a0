"""Write GPT-2 checkpoints in OpenAI's TensorFlow layout with TensorFlow itself, so our reader is tested on real files.

The weights are `random_params(hparams, seed)` for a config of tests/fixtures/configs.json, saved with
`tf.raw_ops.SaveV2` under OpenAI's exact variable names and shapes ("model/h0/attn/c_attn/w" is [1, n_embd, 3*n_embd],
..., "model/wte"), beside OpenAI's `checkpoint` and `hparams.json` files. With no arguments it rewrites the committed
fixtures:
- tests/fixtures/tf_tiny/: the "tiny" config;
- tests/fixtures/tf_half/: one small DT_HALF tensor, for the "only DT_FLOAT" error.

Rerun (TensorFlow lives in a venv outside the repo; it is never a dependency of gpt2_numpy), from the repo root:
    python3 -m venv ../tfvenv && ../tfvenv/bin/pip install tensorflow-cpu -e .
    ../tfvenv/bin/python scripts/make_tf_fixture.py
A 124M-shaped checkpoint for benchmarks (about 500 MB: write it outside the repo, never commit it):
    ../tfvenv/bin/python scripts/make_tf_fixture.py --config 124M --out /tmp/gpt2-tf-124M
"""
import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

try:  # the tools live in a venv of their own: without them, --help still works and a run says what to install
    import numpy as np
    import tensorflow as tf

    from gpt2_numpy.params import random_params
except ModuleNotFoundError as error:
    MISSING = error.name.partition(".")[0]  # the package to install, not its submodule
else:
    MISSING = None

SETUP = (
    "run this script in a venv with TensorFlow and gpt2_numpy, made from the repo root with: python3 -m venv ../tfvenv "
    "&& ../tfvenv/bin/pip install tensorflow-cpu -e . && ../tfvenv/bin/python scripts/make_tf_fixture.py"
)
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
# TF's CheckpointState, naming the prefix; all_model_checkpoint_paths (which OpenAI's file also lists) is optional
CHECKPOINT_FILE = 'model_checkpoint_path: "model.ckpt"\n'


def openai_tensors(params, scope="model"):  # our nested params -> {"model/h0/attn/c_attn/w": array, ...}
    tensors = {}
    for key, value in params.items():
        if key == "blocks":
            for layer, block in enumerate(value):
                tensors.update(openai_tensors(block, f"{scope}/h{layer}"))
        elif isinstance(value, dict):
            tensors.update(openai_tensors(value, f"{scope}/{key}"))
        else:
            tensors[f"{scope}/{key}"] = value[None] if key == "w" else value  # OpenAI's Conv1D kernels are [1, in, out]
    return tensors


def save_bundle(prefix, tensors):  # writes <prefix>.index and <prefix>.data-00000-of-00001
    names = list(tensors)
    tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(tensors[name]) for name in names])


def write_dir(out, write):  # runs write(tmp_dir), then swaps tmp_dir in for out: never a half-written folder
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    tmp.chmod(0o755)  # mkdtemp makes it private
    write(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"wrote {out}: " + ", ".join(f"{p.name} ({p.stat().st_size:,} bytes)" for p in sorted(out.iterdir())))


def write_model(folder, config):  # OpenAI's four files for a config of configs.json
    hparams = config["hparams"]
    save_bundle(folder / "model.ckpt", openai_tensors(random_params(hparams, config["seed"])))
    (folder / "checkpoint").write_text(CHECKPOINT_FILE)
    (folder / "hparams.json").write_text(json.dumps(hparams, indent=2) + "\n")


def write_half(folder):  # a float16 tensor: our reader must refuse it by name
    save_bundle(folder / "model.ckpt", {"model/wte": np.arange(6, dtype=np.float16).reshape(2, 3)})
    (folder / "checkpoint").write_text(CHECKPOINT_FILE)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny", help="a config name from tests/fixtures/configs.json")
    parser.add_argument("--out", type=Path, help="folder to write (default: the committed fixtures)")
    args = parser.parse_args()
    if MISSING:
        sys.exit(f"error: {MISSING} is missing from {sys.executable}: {SETUP}")
    config = json.loads((FIXTURES / "configs.json").read_text())[args.config]
    write_dir(args.out or FIXTURES / f"tf_{args.config}", lambda folder: write_model(folder, config))
    if args.out is None:
        write_dir(FIXTURES / "tf_half", write_half)


if __name__ == "__main__":
    main()
