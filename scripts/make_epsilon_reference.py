"""Build tests/fixtures/reference_epsilon.npz: Hugging Face's logits for a folder written by gpt2_numpy's save_model,
read with transformers.GPT2LMHeadModel.from_pretrained under several layer_norm_epsilon values in its config.json.

It shows that transformers takes the epsilon from config.json (the same weights give other logits under another
value), and gives the logits for the value save_model writes, which tests/test_train_resume.py compares with ours
without importing transformers. Weights: random_params of the "tiny" config (tests/fixtures/configs.json), regenerated
by the test from the seed; nothing else is committed.

Rerun (reference tools live in a venv outside the repo; they are never runtime dependencies):
    ../refvenv/bin/python scripts/make_epsilon_reference.py
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's gpt2_numpy, not an installed one
FIXTURES = REPO / "tests" / "fixtures"
EPSILONS = (1e-5, 1e-2)  # GPT-2's own, and one that changes the logits visibly
N_IDS = 8

try:  # the reference tools live in a venv of their own: without them, --help still works and a run says what to install
    import numpy as np
    import torch
    import transformers

    from gpt2_numpy.params import random_params
    from gpt2_numpy.save import save_model
    from gpt2_numpy.tokenizer import PACKAGED_VOCABULARY
except ModuleNotFoundError as error:
    MISSING = error.name.partition(".")[0]  # the package to install, not its submodule
else:
    MISSING = None


def hf_logits(folder, epsilon, ids):  # -> float32 [n_ids, n_vocab]: transformers' logits with config.json's epsilon
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["layer_norm_epsilon"] = epsilon
    config_path.write_text(json.dumps(config))
    model, info = transformers.GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    assert not any(info.values()), info  # every weight read, nothing left over
    assert model.config.layer_norm_epsilon == epsilon
    with torch.no_grad():
        return model.eval()(torch.from_numpy(ids)[None]).logits[0].numpy()


def main():
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    if MISSING:
        sys.exit(f"error: {MISSING} is missing: run this script in the venv of the reference tools, made from the repo "
                 "root with: python3 -m venv ../refvenv && ../refvenv/bin/pip install torch transformers -e .")
    config = json.loads((FIXTURES / "configs.json").read_text())["tiny"]
    hparams, seed = config["hparams"], config["seed"]
    ids = np.random.default_rng(seed + 2000).integers(0, hparams["n_vocab"], N_IDS)
    with tempfile.TemporaryDirectory() as folder:
        save_model(folder, hparams, random_params(hparams, seed), PACKAGED_VOCABULARY)
        logits = np.stack([hf_logits(Path(folder), epsilon, ids) for epsilon in EPSILONS])
    np.savez_compressed(FIXTURES / "reference_epsilon.npz", hparams=np.array(json.dumps(hparams)), seed=np.array(seed),
                        ids=ids, epsilons=np.array(EPSILONS), logits=logits,
                        versions=np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}"]))
    for epsilon, each in zip(EPSILONS[1:], logits[1:]):
        print(f"layer_norm_epsilon {epsilon:g}: logits differ from {EPSILONS[0]:g}'s by up to "
              f"{np.abs(each - logits[0]).max():.3g}")


if __name__ == "__main__":
    main()
