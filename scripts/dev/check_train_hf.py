"""Check that Hugging Face transformers reads a folder written by `python -m gpt2_numpy.train` as our loader does.

    ../refvenv/bin/python -m scripts.dev.check_train_hf MODEL_DIR ["TEXT"]

Loads MODEL_DIR with transformers.GPT2LMHeadModel.from_pretrained (which must find every weight and nothing extra) and
with gpt2_numpy, runs both on TEXT, and prints the largest logit difference; exits 1 if it is over 1e-4 of the largest
logit. Needs torch and transformers (the reference tools, never runtime dependencies), in a venv of their own:
    python3 -m venv ../refvenv && ../refvenv/bin/pip install torch==2.13.0 transformers safetensors
"""
import argparse
import os
import sys

try:  # without the tools, --help still works and a run says in one line what to install where
    import numpy as np
    import torch
    from transformers import GPT2LMHeadModel

    from gpt2_numpy.formats.checkpoint import load_params
    from gpt2_numpy.fast import gpt2
    from gpt2_numpy.tokenizer import load_tokenizer
except ModuleNotFoundError as error:
    MISSING = error.name.partition(".")[0]  # the package to install, not its submodule
else:
    MISSING = None

SETUP = ("run this script in a venv with torch and transformers, made from the repo root with: python3 -m venv "
         "../refvenv && ../refvenv/bin/pip install torch==2.13.0 transformers safetensors")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", help="a folder written by python -m gpt2_numpy.train")
    parser.add_argument("text", nargs="?", default="To be, or not to be, that is the question.")
    args = parser.parse_args()
    if MISSING:
        print(f"error: {MISSING} is missing from {sys.executable}: {SETUP}", file=sys.stderr)
        sys.exit(2)
    if not os.path.isdir(args.model_dir):
        parser.exit(2, f"error: {args.model_dir} is not a folder: pass one written by python -m gpt2_numpy.train\n")
    compare(args.model_dir, args.text)


def compare(model_dir, text):  # -> None; exits 1 when transformers and gpt2_numpy disagree
    model, info = GPT2LMHeadModel.from_pretrained(model_dir, output_loading_info=True)
    problems = {name: keys for name, keys in info.items() if keys}
    if problems:
        sys.exit(f"transformers did not read {model_dir} cleanly: {problems}")
    model.eval()
    ids = load_tokenizer(model_dir).encode(text)
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0].numpy()
    hparams, params = load_params(model_dir)
    ours = gpt2(ids, **params, n_head=hparams["n_head"])
    difference, scale = float(np.abs(theirs - ours).max()), float(np.abs(theirs).max())
    print(f"{model_dir}: {len(ids)} tokens, largest logit {scale:.3f}, largest difference {difference:.2e}")
    if difference > 1e-4 * scale:
        sys.exit(1)


if __name__ == "__main__":
    main()
